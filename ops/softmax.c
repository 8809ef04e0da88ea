/* Softmax over the last dim on oneDNN, tiled by row blocks; the backward
 * uses the saved output: dx = y * (dy - sum(dy * y)). With bf16 x and y
 * the primitives take bf16 data; a bf16 dx that accumulates, or a dx whose
 * dtype is not dy's, comes from the f32 backward run on f32 copies of the
 * tile's y and dy, then is rounded once. */
#include "base/bf16.h"
#include "ops/op_impl.h"

typedef struct softmax_state {
  op_base base;
  int64_t rows, C, row_block;
  dnnl_primitive_t fwd[2], bwd[2]; /* [full, remainder] row block */
  bool bf16;                       /* x and y are bf16 */
  dnnl_primitive_t bwd32[2];       /* bf16: f32 backward on copies */
} softmax_state;

static int64_t tile_rows(const softmax_state *s, int64_t tile) {
  return op_min64(s->row_block, s->rows - tile * s->row_block);
}

// x and y are (N,C): y[r,:] = exp(x[r,:] - max) / sum exp(x[r,:] - max)
static int softmax_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                       op_worker *w) {
  const softmax_state *s = op->state;
  const op_desc *d = &op->desc;
  int64_t off = tile * s->row_block * s->C;
  op_arg args[2] = {{DNNL_ARG_SRC, op_at(b->in[0], off, d->in_dtype[0])},
                    {DNNL_ARG_DST, op_at(b->out, off, d->out_dtype)}};
  return op_exec(s->fwd[tile_rows(s, tile) != s->row_block], w, 2, args);
}

// in the forward pass y = softmax(x), so dx = y * (dy - sum(dy * y))
static int softmax_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                       op_worker *w) {
  const softmax_state *s = op->state;
  const op_desc *d = &op->desc;
  if (!b->din[0]) return REMAT_OK;
  int64_t off = tile * s->row_block * s->C, n = tile_rows(s, tile) * s->C;
  bool acc = b->din_accumulate[0];
  bool direct = !acc && d->din_dtype[0] == d->out_dtype;
  bool full = tile_rows(s, tile) == s->row_block;
  const void *y = op_at(b->out, off, d->out_dtype);
  const void *dy = op_at(b->dout, off, d->out_dtype);
  void *dx = direct ? op_at(b->din[0], off, d->din_dtype[0])
                    : (void *)op_temp(&s->base, w);
  dnnl_primitive_t prim = s->bwd[!full];
  /* a bf16 dx accumulated, or dx of another dtype than a bf16 dy: the f32
   * primitive on f32 copies of y and dy */
  if (s->bf16 && !direct) {
    float *t = op_temp(&s->base, w);
    bf16_to_f32_row(t + n, y, n);
    bf16_to_f32_row(t + 2 * n, dy, n);
    y = t + n;
    dy = t + 2 * n;
    prim = s->bwd32[!full];
  }
  op_arg args[3] = {
      {DNNL_ARG_DST, y}, {DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_DIFF_SRC, dx}};
  int rs = op_exec(prim, w, 3, args);
  if (rs == REMAT_OK && !direct)
    op_store_dt(b->din[0], d->din_dtype[0], off, dx, n, acc);
  return rs;
}

/* The primitives over `rows` rows with x, y, dy and dx of dtype t; the
 * backward goes to bwd[which] (f32 copies: bwd32[which]). */
static remat_status softmax_prims(softmax_state *s, int which, int64_t rows,
                                  op_dtype t, dnnl_primitive_t *bwd,
                                  char err[OP_ERRMSG_MAX]) {
  dnnl_memory_desc_t data = op_md2_dt(rows, s->C, s->C, 1, t);
  dnnl_softmax_desc_t fd, bd;
  dnnl_status_t st =
      dnnl_softmax_forward_desc_init(&fd, dnnl_forward_training, &data, 1);
  if (st == dnnl_success)
    st = dnnl_softmax_backward_desc_init(&bd, &data, &data, 1);
  if (st != dnnl_success)
    return op_dnnl_fail(st, s->base.name, "softmax descriptor", err);
  dnnl_primitive_desc_t hint;
  dnnl_primitive_t fwd;
  remat_status rs =
      op_prim_create(&s->base, &fd, NULL, NULL, &fwd, &hint, err);
  if (rs != REMAT_OK) return rs;
  if (bwd == s->bwd) s->fwd[which] = fwd;
  rs = op_prim_create(&s->base, &bd, NULL, hint, &bwd[which], NULL, err);
  dnnl_primitive_desc_destroy(hint);
  return rs;
}

remat_status op_softmax_plan(op_instance *inst, dnnl_engine_t engine,
                             char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  if (d->in_dtype[0] != d->out_dtype)
    return op_same_dtype_err(d, err);
  softmax_state *s = op_state_new(sizeof *s, engine, "softmax");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->rows = op_rows(&d->in[0]);
  s->C = d->in[0].dim[d->in[0].ndim - 1];
  s->row_block = op_min64(op_row_block(s->C), s->rows);
  op_dtype t = d->out_dtype;
  s->bf16 = t == OP_BF16;
  int64_t rem = s->rows % s->row_block;
  remat_status rs = softmax_prims(s, 0, s->row_block, t, s->bwd, err);
  if (rs == REMAT_OK && rem) rs = softmax_prims(s, 1, rem, t, s->bwd, err);
  if (s->bf16 && rs == REMAT_OK)
    rs = softmax_prims(s, 0, s->row_block, OP_F32, s->bwd32, err);
  if (s->bf16 && rs == REMAT_OK && rem)
    rs = softmax_prims(s, 1, rem, OP_F32, s->bwd32, err);
  if (rs != REMAT_OK) return rs;
  s->base.temp_bytes =
      (size_t)(s->row_block * s->C) * sizeof(float) * (s->bf16 ? 3 : 1);
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
