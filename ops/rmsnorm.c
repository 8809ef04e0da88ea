/* RMS normalization (Llama's norm) in plain C loops, tiled by row blocks.
 * The forward saves each row's rstd = 1 / sqrt(mean(x^2) + eps) as aux;
 * the backward writes per-tile partial dgamma into a workspace that a
 * column-block kernel sums in tile order, as layer norm does. A row's
 * sums run in interleaved lanes (ops/lanes.h). bf16 rows are converted to
 * f32 in the op's temporary and results rounded once; gamma, rstd and
 * dgamma stay f32. */
#include <math.h>
#include <string.h>

#include "base/bf16.h"
#include "ops/lanes.h"
#include "ops/op_impl.h"

typedef struct rmsnorm_state {
  op_base base;
  int64_t rows, C, row_block, tiles;
  float eps;
} rmsnorm_state;

remat_status op_rmsnorm_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"x", "gamma"};
  static const op_dtype types[] = {OP_F32, OP_F32};
  remat_status rs = op_check_inputs(d, 2, 2, names, types, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *x = &d->in[0], *gamma = &d->in[1];
  int64_t c = x->dim[x->ndim - 1];
  char bx[OP_SHAPE_STR_MAX], bg[OP_SHAPE_STR_MAX];
  if (gamma->ndim != 1 || gamma->dim[0] != c)
    return op_shape_err(err, d,
                        "x %s and gamma %s: gamma must be [%lld] (last dim "
                        "of x)",
                        op_shape_str(x, bx), op_shape_str(gamma, bg),
                        (long long)c);
  d->out = *x;
  return REMAT_OK;
}

static int64_t tile_end(const rmsnorm_state *s, int64_t tile) {
  return op_min64(s->rows, (tile + 1) * s->row_block);
}

/* One row of C: rstd, and y = x * rstd * gamma. */
REMAT_SIMD_CLONES static float rms_fwd_row(const float *restrict x,
                                          float *restrict y,
                                          const float *restrict gamma,
                                          int64_t C, float eps) {
  float rstd = 1.0f / sqrtf(op_lanes_dot(x, x, C) / (float)C + eps);
  for (int64_t c = 0; c < C; c++) y[c] = x[c] * rstd * gamma[c];
  return rstd;
}

/* One row of the backward: xhat = x * rstd into the scratch row, dy * xhat
 * added to the partial pg, and dx (NULL: none). */
REMAT_SIMD_CLONES static void rms_bwd_row(
    const float *restrict x, const float *restrict dy,
    const float *restrict gamma, float rstd, int64_t C,
    float *restrict xhat, float *restrict dx, float *restrict pg) {
  for (int64_t c = 0; c < C; c++) {
    xhat[c] = x[c] * rstd;
    pg[c] += dy[c] * xhat[c];
  }
  if (dx == NULL) return;
  for (int64_t c = 0; c < C; c++) dx[c] = dy[c] * gamma[c];
  float dot = op_lanes_dot(dx, xhat, C) / (float)C;
  for (int64_t c = 0; c < C; c++) dx[c] = rstd * (dx[c] - xhat[c] * dot);
}

// x is (N,C), gamma is (C), y is (N,C), rstd is (N):
// rstd = 1 / sqrt(sum_c x^2 / C + eps), y = x * rstd * gamma
static int rmsnorm_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                       op_worker *w) {
  const rmsnorm_state *s = op->state;
  const op_desc *d = &op->desc;
  int64_t C = s->C;
  float *t = op_temp(&s->base, w);
  bool direct = d->out_dtype == OP_F32;
  for (int64_t r = tile * s->row_block; r < tile_end(s, tile); r++) {
    const float *x = op_load_f32(b->in[0], d->in_dtype[0], r * C, C, t);
    float *y = direct ? b->out + r * C : t + C;
    b->aux[0][r] = rms_fwd_row(x, y, b->in[1], C, s->eps);
    if (!direct) op_store_dt(b->out, d->out_dtype, r * C, y, C, false);
  }
  return REMAT_OK;
}

// in the forward pass y = xhat * gamma with xhat = x * rstd, so with
// g = dy * gamma: dx = rstd * (g - xhat * sum_c(g * xhat) / C), and the
// tile's partial dgamma = sum over its rows of dy * xhat goes to ws[0]
// (always: this kernel does not see whether gamma has a gradient)
static int rmsnorm_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                       op_worker *w) {
  const rmsnorm_state *s = op->state;
  const op_desc *d = &op->desc;
  int64_t C = s->C;
  float *t = op_temp(&s->base, w);
  float *part = b->ws[0] + tile * C;
  memset(part, 0, (size_t)C * sizeof *part);
  bool acc = b->din_accumulate[0];
  bool direct = d->din_dtype[0] == OP_F32 && !acc;
  for (int64_t r = tile * s->row_block; r < tile_end(s, tile); r++) {
    const float *x = op_load_f32(b->in[0], d->in_dtype[0], r * C, C, t);
    const float *dy = op_load_f32(b->dout, d->out_dtype, r * C, C, t + C);
    float *dx = !b->din[0] ? NULL : direct ? b->din[0] + r * C : t + 3 * C;
    rms_bwd_row(x, dy, b->in[1], b->aux[0][r], C, t + 2 * C, dx, part);
    if (dx && !direct)
      op_store_dt(b->din[0], d->din_dtype[0], r * C, dx, C, acc);
  }
  return REMAT_OK;
}

// dgamma (C): the tiles' partials summed in tile order
static int rmsnorm_dgamma(const op_instance *op, const op_bufs *b,
                          int64_t tile, op_worker *w) {
  (void)w;
  const rmsnorm_state *s = op->state;
  if (!b->din[1]) return REMAT_OK;
  int64_t c0 = tile * OP_COL_BLOCK, nc = op_min64(OP_COL_BLOCK, s->C - c0);
  op_sum_partials(b->ws[0] + c0, s->C, s->tiles, nc, b->din[1] + c0,
                  b->din_accumulate[1]);
  return REMAT_OK;
}

remat_status op_rmsnorm_plan(op_instance *inst, dnnl_engine_t engine,
                             char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  if (d->in_dtype[0] != d->out_dtype) return op_same_dtype_err(d, err);
  if (d->in_dtype[1] != OP_F32 || d->din_dtype[1] != OP_F32)
    return op_shape_err(err, d, "gamma is %s: gamma must be f32",
                        op_dtype_name(d->in_dtype[1]));
  rmsnorm_state *s = op_state_new(sizeof *s, engine, "rmsnorm");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->rows = op_rows(&d->in[0]);
  s->C = d->in[0].dim[d->in[0].ndim - 1];
  s->row_block = op_min64(op_row_block(s->C), s->rows);
  s->tiles = op_div_up(s->rows, s->row_block);
  s->eps = d->attrs.eps > 0.0f ? d->attrs.eps : 1e-6f;
  s->base.temp_bytes = (size_t)(4 * s->C) * sizeof(float);
  inst->naux = 1;
  inst->aux_bytes[0] = (size_t)s->rows * sizeof(float);
  inst->nws = 1;
  inst->ws_bytes[0] = (size_t)(s->tiles * s->C) * sizeof(float);
  double n = (double)s->rows * s->C;
  uint32_t rows = OP_SLOT_IN(0) | OP_SLOT_AUX(0);
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "rmsnorm.fwd", rmsnorm_fwd, s->tiles, 4.0 * n,
      OP_SLOT_IN(0) | OP_SLOT_IN(1), OP_SLOT_OUT | OP_SLOT_AUX(0));
  inst->fwd[0].span = op_span_rows(s->rows, s->row_block, rows | OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] = op_make_kernel(
      "rmsnorm.bwd", rmsnorm_bwd, s->tiles, 10.0 * n,
      OP_SLOT_IN(0) | OP_SLOT_IN(1) | OP_SLOT_DOUT | OP_SLOT_AUX(0),
      OP_SLOT_DIN(0) | OP_SLOT_WS(0));
  inst->bwd[0].span = op_span_rows(s->rows, s->row_block,
                                   rows | OP_SLOT_DOUT | OP_SLOT_DIN(0));
  inst->bwd[0].span.tile_slots = OP_SLOT_WS(0);
  inst->bwd[inst->nbwd++] = op_make_kernel(
      "rmsnorm.dgamma", rmsnorm_dgamma, op_div_up(s->C, OP_COL_BLOCK),
      (double)s->tiles * s->C, OP_SLOT_WS(0), OP_SLOT_DIN(1));
  inst->bwd[1].span = op_span_cols(OP_SLOT_DIN(1), OP_SLOT_WS(0));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
