/* Stage "persistent allocation" (persist.h): the buffers that live with the
 * graph (parameters, their gradients, optimizer moments, inputs, kept
 * tensors), parameter initialization from the graph's seed, the
 * per-worker scratchpads and the per-tile gradient sums of squares. */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/persist.h"

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uniform01(uint64_t *state) {
  return ((double)(splitmix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static void init_param(const remat_graph *g, const remat_tensor *t, float *x) {
  int64_t n = op_numel(&t->shape);
  uint64_t state = g->seed * 0x100000001B3ull + (uint64_t)t->id * 0x9E37ull + 1;
  for (int64_t i = 0; i < n; i++) {
    switch (t->init) {
    case REMAT_INIT_ZEROS: x[i] = 0.0f; break;
    case REMAT_INIT_ONES: x[i] = 1.0f; break;
    default: {
      double u1 = uniform01(&state), u2 = uniform01(&state);
      x[i] = (float)(t->init_scale * sqrt(-2.0 * log(u1)) *
                     cos(6.283185307179586 * u2));
    }
    }
  }
}

remat_status persist_allocate(remat_step_plan *p) {
  for (int32_t b = 0; b < p->low.nbufs; b++) {
    plan_buffer *buf = &p->low.bufs[b];
    if (!buf->persistent)
      continue;
    buf->data =
        mem_alloc(&p->arena, (size_t)buf->bytes, buf->cat, buf->node, false);
    if (buf->data == NULL)
      return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                         "remat_compile: out of memory allocating %lld bytes",
                         (long long)buf->bytes);
    memset(buf->data, 0, (size_t)buf->bytes);
    if (buf->tensor >= 0 && buf->cat == REMAT_MEM_PARAMS &&
        p->low.value_buf[buf->tensor] == b) /* not a bf16 copy */
      init_param(p->g, p->g->tensors[buf->tensor], buf->data);
  }
  size_t max_scratch = 0;
  for (int32_t o = 0; o < p->g->nops; o++)
    if (p->g->ops[o].inst.scratch_bytes > max_scratch)
      max_scratch = p->g->ops[o].inst.scratch_bytes;
  int nw = p->g->rt->nworkers;
  p->scratch_bytes = (size_t)remat__round64((int64_t)max_scratch);
  p->workers = remat__calloc((size_t)nw, sizeof *p->workers);
  p->worker_recompute_flops =
      remat__calloc((size_t)nw * 8, sizeof *p->worker_recompute_flops);
  p->check_sumsq =
      remat__calloc((size_t)p->low.ncheck_tiles + 1, sizeof *p->check_sumsq);
  p->grad_scale = 1.0f;
  if (p->workers == NULL || p->worker_recompute_flops == NULL ||
      p->check_sumsq == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  if (p->scratch_bytes > 0) {
    p->scratch = mem_alloc(&p->arena, p->scratch_bytes * (size_t)nw,
                           REMAT_MEM_WORKSPACE, 0, false);
    if (p->scratch == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
  }
  for (int w = 0; w < nw; w++) {
    p->workers[w].stream = p->g->rt->workers[w].stream;
    p->workers[w].scratch =
        p->scratch == NULL ? NULL : (char *)p->scratch + (size_t)w * p->scratch_bytes;
    p->workers[w].scratch_bytes = p->scratch_bytes;
  }
  return REMAT_OK;
}

