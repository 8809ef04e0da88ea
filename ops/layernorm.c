/* Layer normalization on oneDNN, tiled by row blocks. The forward saves the
 * per-row mean and variance (oneDNN's statistics: variance, not rstd) as
 * aux; the backward writes per-tile partial dgamma/dbeta into workspaces
 * that a column-block kernel sums in tile order. With bf16 x and y the
 * primitives take bf16 data (mean, variance, gamma, beta and their
 * gradients stay f32); a bf16 dx that accumulates, or a dx whose dtype is
 * not dy's, comes from the f32 primitives run on f32 copies of the tile's
 * x and dy, then is rounded once. */
#include <string.h>

#include "base/bf16.h"
#include "ops/op_impl.h"

typedef struct layernorm_state {
  op_base base;
  int64_t rows, C, row_block, tiles;
  dnnl_primitive_t fwd[2], bwd[2]; /* [full, remainder] row block */
  bool bf16;                       /* x and y are bf16 */
  dnnl_primitive_t bwd32[2];       /* bf16: f32 backward on copies */
} layernorm_state;

remat_status op_layernorm_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"x", "gamma", "beta"};
  static const op_dtype types[] = {OP_F32, OP_F32, OP_F32};
  remat_status rs = op_check_inputs(d, 3, 3, names, types, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *x = &d->in[0];
  int64_t c = x->dim[x->ndim - 1];
  char bx[OP_SHAPE_STR_MAX], bp[OP_SHAPE_STR_MAX];
  for (int i = 1; i < 3; i++)
    if (d->in[i].ndim != 1 || d->in[i].dim[0] != c)
      return op_shape_err(err, d,
                          "x %s and %s %s: %s must be [%lld] (last dim of x)",
                          op_shape_str(x, bx), names[i],
                          op_shape_str(&d->in[i], bp), names[i],
                          (long long)c);
  d->out = *x;
  return REMAT_OK;
}

static int64_t tile_rows(const layernorm_state *s, int64_t tile) {
  return op_min64(s->row_block, s->rows - tile * s->row_block);
}

// x is (N,C), gamma and beta are (C), y is (N,C); mean and var are (N):
// y = (x - mean) / sqrt(var + eps) * gamma + beta
static int layernorm_fwd(const op_instance *op, const op_bufs *b,
                         int64_t tile, op_worker *w) {
  const layernorm_state *s = op->state;
  const op_desc *d = &op->desc;
  int64_t r0 = tile * s->row_block;
  op_arg args[6] = {
      {DNNL_ARG_SRC, op_at(b->in[0], r0 * s->C, d->in_dtype[0])},
      {DNNL_ARG_DST, op_at(b->out, r0 * s->C, d->out_dtype)},
      {DNNL_ARG_MEAN, b->aux[0] + r0},      {DNNL_ARG_VARIANCE, b->aux[1] + r0},
      {DNNL_ARG_SCALE, b->in[1]},           {DNNL_ARG_SHIFT, b->in[2]}};
  return op_exec(s->fwd[tile_rows(s, tile) != s->row_block], w, 6, args);
}

// backward of the above: dx for the tile's rows, and the tile's own partial
// dgamma = sum_rows dy * xhat and dbeta = sum_rows dy into ws[0], ws[1]
static int layernorm_bwd(const op_instance *op, const op_bufs *b,
                         int64_t tile, op_worker *w) {
  const layernorm_state *s = op->state;
  const op_desc *d = &op->desc;
  int64_t r0 = tile * s->row_block, n = tile_rows(s, tile) * s->C;
  bool full = tile_rows(s, tile) == s->row_block;
  bool acc = b->din[0] && b->din_accumulate[0];
  bool direct = b->din[0] && !acc && d->din_dtype[0] == d->out_dtype;
  const void *x = op_at(b->in[0], r0 * s->C, d->in_dtype[0]);
  const void *dy = op_at(b->dout, r0 * s->C, d->out_dtype);
  void *dx = direct ? op_at(b->din[0], r0 * s->C, d->din_dtype[0])
                    : (void *)op_temp(&s->base, w);
  dnnl_primitive_t prim = s->bwd[!full];
  /* a bf16 dx accumulated, or dx of another dtype than a bf16 dy: the f32
   * primitive on f32 copies of x and dy */
  if (s->bf16 && b->din[0] && !direct) {
    float *t = op_temp(&s->base, w);
    bf16_to_f32_row(t + n, x, n);
    bf16_to_f32_row(t + 2 * n, dy, n);
    x = t + n;
    dy = t + 2 * n;
    prim = s->bwd32[!full];
  }
  /* oneDNN 2.6 rejects the call without the shift, though it reads none */
  op_arg args[9] = {{DNNL_ARG_SRC, x},
                    {DNNL_ARG_DIFF_DST, dy},
                    {DNNL_ARG_MEAN, b->aux[0] + r0},
                    {DNNL_ARG_VARIANCE, b->aux[1] + r0},
                    {DNNL_ARG_SCALE, b->in[1]},
                    {DNNL_ARG_SHIFT, b->in[2]},
                    {DNNL_ARG_DIFF_SRC, dx},
                    {DNNL_ARG_DIFF_SCALE, b->ws[0] + tile * s->C},
                    {DNNL_ARG_DIFF_SHIFT, b->ws[1] + tile * s->C}};
  int rs = op_exec(prim, w, 9, args);
  if (rs == REMAT_OK && b->din[0] && !direct)
    op_store_dt(b->din[0], d->din_dtype[0], r0 * s->C, dx, n, acc);
  return rs;
}

// dgamma (C) and dbeta (C): the tiles' partials summed in tile order
static int layernorm_dparams(const op_instance *op, const op_bufs *b,
                             int64_t tile, op_worker *w) {
  (void)w;
  const layernorm_state *s = op->state;
  int64_t c0 = tile * OP_COL_BLOCK, nc = op_min64(OP_COL_BLOCK, s->C - c0);
  for (int p = 0; p < 2; p++) {
    if (!b->din[1 + p]) continue;
    float acc[OP_COL_BLOCK] = {0};
    for (int64_t t = 0; t < s->tiles; t++) {
      const float *part = b->ws[p] + t * s->C + c0;
      for (int64_t c = 0; c < nc; c++) acc[c] += part[c];
    }
    op_store_dt(b->din[1 + p], op->desc.din_dtype[1 + p], c0, acc, nc,
              b->din_accumulate[1 + p]);
  }
  return REMAT_OK;
}

/* The primitives over `rows` rows with x, y, dy and dx of dtype t; the
 * backward goes to bwd[which] (f32 copies: bwd32[which]). */
static remat_status layernorm_prims(layernorm_state *s, int which,
                                    int64_t rows, float eps, op_dtype t,
                                    dnnl_primitive_t *bwd,
                                    char err[OP_ERRMSG_MAX]) {
  dnnl_memory_desc_t data = op_md2_dt(rows, s->C, s->C, 1, t);
  const int64_t one = 1;
  dnnl_memory_desc_t stat = op_md(1, &rows, &one);
  unsigned flags = dnnl_use_scale | dnnl_use_shift;
  dnnl_layer_normalization_desc_t fd, bd;
  dnnl_status_t st = dnnl_layer_normalization_forward_desc_init(
      &fd, dnnl_forward_training, &data, &stat, eps, flags);
  if (st == dnnl_success)
    st = dnnl_layer_normalization_backward_desc_init(
        &bd, dnnl_backward, &data, &data, &stat, eps, flags);
  if (st != dnnl_success)
    return op_dnnl_fail(st, s->base.name, "layer normalization descriptor",
                        err);
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

remat_status op_layernorm_plan(op_instance *inst, dnnl_engine_t engine,
                               char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  if (d->in_dtype[0] != d->out_dtype)
    return op_same_dtype_err(d, err);
  for (int i = 1; i < 3; i++)
    if (d->in_dtype[i] != OP_F32)
      return op_shape_err(err, d, "%s is %s: gamma and beta must be f32",
                          i == 1 ? "gamma" : "beta",
                          op_dtype_name(d->in_dtype[i]));
  layernorm_state *s = op_state_new(sizeof *s, engine, "layernorm");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->rows = op_rows(&d->in[0]);
  s->C = d->in[0].dim[d->in[0].ndim - 1];
  s->row_block = op_min64(op_row_block(s->C), s->rows);
  s->tiles = op_div_up(s->rows, s->row_block);
  float eps = d->attrs.eps != 0.0f ? d->attrs.eps : 1e-5f;
  op_dtype t = d->out_dtype;
  s->bf16 = t == OP_BF16;
  remat_status rs = layernorm_prims(s, 0, s->row_block, eps, t, s->bwd, err);
  if (rs == REMAT_OK && s->rows % s->row_block)
    rs = layernorm_prims(s, 1, s->rows % s->row_block, eps, t, s->bwd, err);
  if (s->bf16 && rs == REMAT_OK)
    rs = layernorm_prims(s, 0, s->row_block, eps, OP_F32, s->bwd32, err);
  if (s->bf16 && rs == REMAT_OK && s->rows % s->row_block)
    rs = layernorm_prims(s, 1, s->rows % s->row_block, eps, OP_F32,
                         s->bwd32, err);
  if (rs != REMAT_OK) return rs;
  s->base.temp_bytes =
      (size_t)(s->row_block * s->C) * sizeof(float) * (s->bf16 ? 3 : 1);
  inst->naux = 2;
  inst->aux_bytes[0] = inst->aux_bytes[1] = (size_t)s->rows * sizeof(float);
  inst->nws = 2;
  inst->ws_bytes[0] = inst->ws_bytes[1] =
      (size_t)(s->tiles * s->C) * sizeof(float);
  double n = (double)s->rows * s->C;
  uint32_t params = OP_SLOT_IN(1) | OP_SLOT_IN(2);
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "layernorm.fwd", layernorm_fwd, s->tiles, 8.0 * n,
      OP_SLOT_IN(0) | params, OP_SLOT_OUT | OP_SLOT_AUX(0) | OP_SLOT_AUX(1));
  inst->bwd[inst->nbwd++] = op_make_kernel(
      "layernorm.bwd", layernorm_bwd, s->tiles, 12.0 * n,
      OP_SLOT_IN(0) | params | OP_SLOT_DOUT | OP_SLOT_AUX(0) |
          OP_SLOT_AUX(1),
      OP_SLOT_DIN(0) | OP_SLOT_WS(0) | OP_SLOT_WS(1));
  inst->bwd[inst->nbwd++] = op_make_kernel(
      "layernorm.dparams", layernorm_dparams, op_div_up(s->C, OP_COL_BLOCK),
      2.0 * s->tiles * s->C, OP_SLOT_WS(0) | OP_SLOT_WS(1),
      OP_SLOT_DIN(1) | OP_SLOT_DIN(2));
  uint32_t rows = OP_SLOT_IN(0) | OP_SLOT_AUX(0) | OP_SLOT_AUX(1);
  inst->fwd[0].span = op_span_rows(s->rows, s->row_block, rows | OP_SLOT_OUT);
  inst->bwd[0].span = op_span_rows(
      s->rows, s->row_block, rows | OP_SLOT_DOUT | OP_SLOT_DIN(0));
  inst->bwd[0].span.tile_slots = OP_SLOT_WS(0) | OP_SLOT_WS(1);
  inst->bwd[1].span = op_span_cols(OP_SLOT_DIN(1) | OP_SLOT_DIN(2),
                                   OP_SLOT_WS(0) | OP_SLOT_WS(1));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
