/* Layer normalization on oneDNN, tiled by row blocks. The forward saves the
 * per-row mean and variance (oneDNN's statistics: variance, not rstd) as
 * aux; the backward writes per-tile partial dgamma/dbeta into workspaces
 * that a column-block kernel sums in tile order. */
#include <string.h>

#include "ops/op_impl.h"

typedef struct layernorm_state {
  op_base base;
  int64_t rows, C, row_block, tiles;
  dnnl_primitive_t fwd[2], bwd[2]; /* [full, remainder] row block */
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
  int64_t r0 = tile * s->row_block;
  op_arg args[6] = {
      {DNNL_ARG_SRC, b->in[0] + r0 * s->C}, {DNNL_ARG_DST, b->out + r0 * s->C},
      {DNNL_ARG_MEAN, b->aux[0] + r0},      {DNNL_ARG_VARIANCE, b->aux[1] + r0},
      {DNNL_ARG_SCALE, b->in[1]},           {DNNL_ARG_SHIFT, b->in[2]}};
  return op_exec(s->fwd[tile_rows(s, tile) != s->row_block], w, 6, args);
}

// backward of the above: dx for the tile's rows, and the tile's own partial
// dgamma = sum_rows dy * xhat and dbeta = sum_rows dy into ws[0], ws[1]
static int layernorm_bwd(const op_instance *op, const op_bufs *b,
                         int64_t tile, op_worker *w) {
  const layernorm_state *s = op->state;
  int64_t r0 = tile * s->row_block, n = tile_rows(s, tile) * s->C;
  bool direct = b->din[0] && !b->din_accumulate[0];
  float *dx = direct ? b->din[0] + r0 * s->C : op_temp(&s->base, w);
  /* oneDNN 2.6 rejects the call without the shift, though it reads none */
  op_arg args[9] = {{DNNL_ARG_SRC, b->in[0] + r0 * s->C},
                    {DNNL_ARG_DIFF_DST, b->dout + r0 * s->C},
                    {DNNL_ARG_MEAN, b->aux[0] + r0},
                    {DNNL_ARG_VARIANCE, b->aux[1] + r0},
                    {DNNL_ARG_SCALE, b->in[1]},
                    {DNNL_ARG_SHIFT, b->in[2]},
                    {DNNL_ARG_DIFF_SRC, dx},
                    {DNNL_ARG_DIFF_SCALE, b->ws[0] + tile * s->C},
                    {DNNL_ARG_DIFF_SHIFT, b->ws[1] + tile * s->C}};
  int rs = op_exec(s->bwd[tile_rows(s, tile) != s->row_block], w, 9, args);
  if (rs == REMAT_OK && b->din[0] && b->din_accumulate[0])
    op_store(b->din[0] + r0 * s->C, dx, n, true);
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
    op_store(b->din[1 + p] + c0, acc, nc, b->din_accumulate[1 + p]);
  }
  return REMAT_OK;
}

static remat_status layernorm_prims(layernorm_state *s, int which,
                                    int64_t rows, float eps,
                                    char err[OP_ERRMSG_MAX]) {
  dnnl_memory_desc_t data = op_md2(rows, s->C, s->C, 1);
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
  remat_status rs =
      op_prim_create(&s->base, &fd, NULL, NULL, &s->fwd[which], &hint, err);
  if (rs != REMAT_OK) return rs;
  rs = op_prim_create(&s->base, &bd, NULL, hint, &s->bwd[which], NULL, err);
  dnnl_primitive_desc_destroy(hint);
  return rs;
}

remat_status op_layernorm_plan(op_instance *inst, dnnl_engine_t engine,
                               char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  layernorm_state *s = op_state_new(sizeof *s, engine, "layernorm");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->rows = op_rows(&d->in[0]);
  s->C = d->in[0].dim[d->in[0].ndim - 1];
  s->row_block = op_min64(op_row_block(s->C), s->rows);
  s->tiles = op_div_up(s->rows, s->row_block);
  float eps = d->attrs.eps != 0.0f ? d->attrs.eps : 1e-5f;
  remat_status rs = layernorm_prims(s, 0, s->row_block, eps, err);
  if (rs == REMAT_OK && s->rows % s->row_block)
    rs = layernorm_prims(s, 1, s->rows % s->row_block, eps, err);
  if (rs != REMAT_OK) return rs;
  s->base.temp_bytes = (size_t)(s->row_block * s->C) * sizeof(float);
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
