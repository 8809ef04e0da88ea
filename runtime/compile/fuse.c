/* Stage "fuse" (plan_ops.h): finds the gelu and add ops that can run as
 * the epilogue of the linear that produces their input, and plans that
 * linear's fused kernel. */
#include <stdlib.h>

#include "base/alloc.h"
#include "runtime/compile/plan_ops.h"

/* The top-level region of op o, -1 none. */
static int32_t top_of(const remat_graph *g, int32_t o) {
  int32_t r = g->ops[o].region;
  return r < 0 ? -1 : g->regions[r].top;
}

/* Whether op c's input k is a linear's output that c alone reads. */
static bool fusable(const remat_graph *g, const int32_t *readers, int32_t loss,
                    int32_t c, int k) {
  int32_t t = g->ops[c].in[k];
  const remat_tensor *x = g->tensors[t];
  if (x->kind != TENSOR_ACT || x->keep || t == loss || readers[t] != 1 ||
      x->producer < 0)
    return false;
  const graph_op *o = &g->ops[x->producer];
  return o->desc.type == OP_LINEAR && o->inst.nfused == 0 &&
         o->inst.naux == 0 && g->ops[c].inst.naux == 0 &&
         top_of(g, x->producer) == top_of(g, c);
}

remat_status plan_fusions(remat_graph *g, int32_t loss) {
  for (int32_t o = 0; o < g->nops; o++)
    g->ops[o].fused_from = -1;
  if (g->rt->no_fuse)
    return REMAT_OK;
  int32_t *readers = remat__calloc((size_t)g->ntensors + 1, sizeof *readers);
  if (readers == NULL)
    return graph_fail(g, REMAT_ERR_OUT_OF_MEMORY,
                      "remat_compile: out of memory");
  for (int32_t o = 0; o < g->nops; o++)
    for (int i = 0; i < g->ops[o].desc.nin; i++)
      readers[g->ops[o].in[i]]++;
  for (int32_t c = 0; c < g->nops; c++) {
    graph_op *op = &g->ops[c];
    /* In f32 the fused and separate forms give the same bits
     * (test_fuse). A bf16 add fuses only with REMAT_FUSE=bf16: it rounds
     * x . w^T + b + r to bf16 once where the separate kernels round the
     * linear's output first, closer to the exact sum and as close to f32
     * on a step (test_fuse: test_fused_add_bf16_rounding,
     * test_fused_bf16_accuracy), but remat-train's default bf16 run (one
     * trajectory) reaches 93% exact-match with it against 100% without,
     * so it is not the default. A bf16 gelu never fuses: it would skip
     * its input's rounding to bf16, which oneDNN's post-ops cannot do,
     * and since it fuses only where that input is recomputed (lower.c),
     * the bits would depend on the policy. */
    bool f32 = op->desc.in_dtype[0] == OP_F32;
    if (!(op->desc.type == OP_ADD && (f32 || g->rt->fuse_bf16)) &&
        !(op->desc.type == OP_GELU && f32))
      continue;
    for (int k = 0; k < op->desc.nin; k++) {
      if (!fusable(g, readers, loss, c, k))
        continue;
      int32_t lin = g->tensors[op->in[k]]->producer;
      char err[OP_ERRMSG_MAX];
      /* a pair oneDNN cannot fuse stays two ops */
      if (op_fuse(&g->ops[lin].inst, &op->inst.desc, k, err) != REMAT_OK)
        continue;
      op->fused_from = lin;
      op->fused_in = k;
      break;
    }
  }
  free(readers);
  return REMAT_OK;
}
