/* Softmax over the last dim on oneDNN, tiled by row blocks; the backward
 * uses the saved output: dx = y * (dy - sum(dy * y)). */
#include "ops/op_impl.h"

typedef struct softmax_state {
  op_base base;
  int64_t rows, C, row_block;
  dnnl_primitive_t fwd[2], bwd[2]; /* [full, remainder] row block */
} softmax_state;

static int64_t tile_rows(const softmax_state *s, int64_t tile) {
  return op_min64(s->row_block, s->rows - tile * s->row_block);
}

// x and y are (N,C): y[r,:] = exp(x[r,:] - max) / sum exp(x[r,:] - max)
static int softmax_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                       op_worker *w) {
  const softmax_state *s = op->state;
  int64_t off = tile * s->row_block * s->C;
  op_arg args[2] = {{DNNL_ARG_SRC, b->in[0] + off},
                    {DNNL_ARG_DST, b->out + off}};
  return op_exec(s->fwd[tile_rows(s, tile) != s->row_block], w, 2, args);
}

// in the forward pass y = softmax(x), so dx = y * (dy - sum(dy * y))
static int softmax_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                       op_worker *w) {
  const softmax_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  int64_t off = tile * s->row_block * s->C, n = tile_rows(s, tile) * s->C;
  bool acc = b->din_accumulate[0];
  float *dx = acc ? op_temp(&s->base, w) : b->din[0] + off;
  op_arg args[3] = {{DNNL_ARG_DST, b->out + off},
                    {DNNL_ARG_DIFF_DST, b->dout + off},
                    {DNNL_ARG_DIFF_SRC, dx}};
  int rs = op_exec(s->bwd[tile_rows(s, tile) != s->row_block], w, 3, args);
  if (rs == REMAT_OK && acc) op_store(b->din[0] + off, dx, n, true);
  return rs;
}

static remat_status softmax_prims(softmax_state *s, int which, int64_t rows,
                                  char err[OP_ERRMSG_MAX]) {
  dnnl_memory_desc_t data = op_md2(rows, s->C, s->C, 1);
  dnnl_softmax_desc_t fd, bd;
  dnnl_status_t st =
      dnnl_softmax_forward_desc_init(&fd, dnnl_forward_training, &data, 1);
  if (st == dnnl_success)
    st = dnnl_softmax_backward_desc_init(&bd, &data, &data, 1);
  if (st != dnnl_success)
    return op_dnnl_fail(st, s->base.name, "softmax descriptor", err);
  dnnl_primitive_desc_t hint;
  remat_status rs =
      op_prim_create(&s->base, &fd, NULL, NULL, &s->fwd[which], &hint, err);
  if (rs != REMAT_OK) return rs;
  rs = op_prim_create(&s->base, &bd, NULL, hint, &s->bwd[which], NULL, err);
  dnnl_primitive_desc_destroy(hint);
  return rs;
}

remat_status op_softmax_plan(op_instance *inst, dnnl_engine_t engine,
                             char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  softmax_state *s = op_state_new(sizeof *s, engine, "softmax");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->rows = op_rows(&d->in[0]);
  s->C = d->in[0].dim[d->in[0].ndim - 1];
  s->row_block = op_min64(op_row_block(s->C), s->rows);
  remat_status rs = softmax_prims(s, 0, s->row_block, err);
  if (rs == REMAT_OK && s->rows % s->row_block)
    rs = softmax_prims(s, 1, s->rows % s->row_block, err);
  if (rs != REMAT_OK) return rs;
  s->base.temp_bytes = (size_t)(s->row_block * s->C) * sizeof(float);
  int64_t tiles = op_div_up(s->rows, s->row_block);
  double n = (double)s->rows * s->C;
  inst->fwd[inst->nfwd++] =
      op_make_kernel("softmax.fwd", softmax_fwd, tiles, 5.0 * n,
                     OP_SLOT_IN(0), OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("softmax.bwd", softmax_bwd, tiles, 4.0 * n,
                     OP_SLOT_OUT | OP_SLOT_DOUT, OP_SLOT_DIN(0));
  inst->fwd[0].span =
      op_span_rows(s->rows, s->row_block, OP_SLOT_IN(0) | OP_SLOT_OUT);
  inst->bwd[0].span = op_span_rows(
      s->rows, s->row_block, OP_SLOT_OUT | OP_SLOT_DOUT | OP_SLOT_DIN(0));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
