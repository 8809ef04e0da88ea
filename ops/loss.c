/* Reductions to a scalar: cross entropy (mean over rows of -log softmax at
 * the target), sum and mean. Forward tiles write per-row or per-tile
 * partials into aux; a one-tile kernel then sums them in order into out[0],
 * so the result does not depend on the thread count. In bf16 precision the
 * input x (logits) and its gradient are bf16 and the [1] output stays f32:
 * cross entropy converts a row to f32 in the op's temporary and rounds its
 * gradient row once; sum and mean convert as they read. */
/* The exp loops vectorize only when gcc may if-convert float compares. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <math.h>

#include "base/bf16.h"
#include "ops/op_impl.h"

/* Lanes of the vectorizable partial sums. */
#define OP_LANES 16

typedef struct loss_state {
  op_base base;
  int64_t rows, V; /* cross entropy: logits as (rows, V) */
  int64_t n;       /* sum, mean: elements */
  int64_t row_block, tiles;
} loss_state;

/* The sum of x[0..n) in a fixed order: OP_LANES interleaved partial sums
 * (so gcc vectorizes it), then the lanes in order. */
static double sum_lanes(const float *restrict x, int64_t n) {
  float lane[OP_LANES] = {0};
  int64_t i = 0;
  for (; i + OP_LANES <= n; i += OP_LANES)
    for (int k = 0; k < OP_LANES; k++) lane[k] += x[i + k];
  double total = 0.0;
  for (int k = 0; k < OP_LANES; k++) total += lane[k];
  for (; i < n; i++) total += x[i];
  return total;
}

/* sum_lanes of bf16 values, in the same order. */
REMAT_SIMD_CLONES static double sum_lanes_bf16(const uint16_t *restrict x,
                                         int64_t n) {
  float lane[OP_LANES] = {0};
  int64_t i = 0;
  for (; i + OP_LANES <= n; i += OP_LANES)
    for (int k = 0; k < OP_LANES; k++) lane[k] += bf16_to_f32(x[i + k]);
  double total = 0.0;
  for (int k = 0; k < OP_LANES; k++) total += lane[k];
  for (; i < n; i++) total += bf16_to_f32(x[i]);
  return total;
}

/* dx[0..n) = (or +=) g, rounded once to bf16. */
REMAT_SIMD_CLONES static void fill_bf16(uint16_t *restrict dx, float g, int64_t n,
                                  bool accumulate) {
  if (accumulate)
    for (int64_t i = 0; i < n; i++)
      dx[i] = bf16_from_f32(bf16_to_f32(dx[i]) + g);
  else
    for (int64_t i = 0; i < n; i++) dx[i] = bf16_from_f32(g);
}

/* A [1] output (and its gradient) must be f32. */
static remat_status check_scalar_out(const op_desc *d,
                                     char err[OP_ERRMSG_MAX]) {
  if (d->out_dtype == OP_F32) return REMAT_OK;
  return op_shape_err(err, d, "the [1] output is %s: it must be f32",
                      op_dtype_name(d->out_dtype));
}

/* ---- cross entropy ---- */

remat_status op_cross_entropy_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"logits", "targets"};
  static const op_dtype types[] = {OP_F32, OP_I32};
  remat_status rs = op_check_inputs(d, 2, 2, names, types, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *lg = &d->in[0], *tg = &d->in[1];
  char bl[OP_SHAPE_STR_MAX], bt[OP_SHAPE_STR_MAX], bw[OP_SHAPE_STR_MAX];
  op_shape want = *lg;
  want.ndim = lg->ndim - 1;
  if (lg->ndim < 2 || !op_shape_eq(tg, &want))
    return op_shape_err(err, d,
                        "logits %s and targets %s: targets must be %s (the "
                        "leading dims of logits)",
                        op_shape_str(lg, bl), op_shape_str(tg, bt),
                        lg->ndim < 2 ? "[N] with logits [N,V]"
                                     : op_shape_str(&want, bw));
  d->out = op_scalar_shape();
  return REMAT_OK;
}

// logits is (N,V), targets is (N); per row: lse = log sum_v exp(logits),
// loss = lse - logits[target]; aux[0] holds the losses, aux[1] the lse
static int ce_rows(const op_instance *op, const op_bufs *b, int64_t tile,
                   op_worker *w) {
  const loss_state *s = op->state;
  bool half = op->desc.in_dtype[0] == OP_BF16;
  const int32_t *targets = (const int32_t *)b->in[1];
  int64_t r0 = tile * s->row_block, V = s->V;
  int64_t r1 = op_min64(r0 + s->row_block, s->rows);
  for (int64_t r = r0; r < r1; r++)
    if (targets[r] < 0 || targets[r] >= V) return REMAT_ERR_INVALID_ARG;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict x = b->in[0] + r * V;
    if (half) {
      float *t = op_temp(&s->base, w);
      bf16_to_f32_row(t, (const uint16_t *)b->in[0] + r * V, V);
      x = t;
    }
    float mx = x[0];
    for (int64_t v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
    float lane[OP_LANES] = {0};
    int64_t v = 0;
    for (; v + OP_LANES <= V; v += OP_LANES)
      for (int k = 0; k < OP_LANES; k++) lane[k] += op_expf(x[v + k] - mx);
    double total = 0.0;
    for (int k = 0; k < OP_LANES; k++) total += lane[k];
    for (; v < V; v++) total += op_expf(x[v] - mx);
    float lse = mx + (float)log(total);
    b->aux[1][r] = lse;
    b->aux[0][r] = lse - x[targets[r]];
  }
  return REMAT_OK;
}

// out[0] = the row losses summed in order, over N
static int ce_mean(const op_instance *op, const op_bufs *b, int64_t tile,
                   op_worker *w) {
  (void)w;
  (void)tile;
  const loss_state *s = op->state;
  b->out[0] = (float)(sum_lanes(b->aux[0], s->rows) / (double)s->rows);
  return REMAT_OK;
}

// in the forward pass loss = mean_r (lse_r - logits[r,target_r]), so
// dlogits[r,v] = (softmax[r,v] - (v == target_r)) * dloss / N
static int ce_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                  op_worker *w) {
  const loss_state *s = op->state;
  const op_desc *d = &op->desc;
  if (!b->din[0]) return REMAT_OK;
  const int32_t *targets = (const int32_t *)b->in[1];
  int64_t r0 = tile * s->row_block, V = s->V;
  int64_t r1 = op_min64(r0 + s->row_block, s->rows);
  float g = b->dout[0] / (float)s->rows;
  bool acc = b->din_accumulate[0];
  if (d->in_dtype[0] == OP_BF16 || d->din_dtype[0] == OP_BF16) {
    /* the row and its gradient in f32 in the temporary */
    float *t = op_temp(&s->base, w);
    for (int64_t r = r0; r < r1; r++) {
      const float *restrict x = b->in[0] + r * V;
      if (d->in_dtype[0] == OP_BF16) {
        bf16_to_f32_row(t, (const uint16_t *)b->in[0] + r * V, V);
        x = t;
      }
      float *restrict dx = t + V;
      float lse = b->aux[1][r];
      for (int64_t v = 0; v < V; v++) dx[v] = op_expf(x[v] - lse) * g;
      dx[targets[r]] -= g;
      op_store_dt(b->din[0], d->din_dtype[0], r * V, dx, V, acc);
    }
    return REMAT_OK;
  }
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict x = b->in[0] + r * V;
    float *restrict dx = b->din[0] + r * V;
    float lse = b->aux[1][r];
    if (acc)
      for (int64_t v = 0; v < V; v++) dx[v] += op_expf(x[v] - lse) * g;
    else
      for (int64_t v = 0; v < V; v++) dx[v] = op_expf(x[v] - lse) * g;
    dx[targets[r]] -= g;
  }
  return REMAT_OK;
}

remat_status op_cross_entropy_plan(op_instance *inst, dnnl_engine_t engine,
                                   char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  remat_status rs = check_scalar_out(d, err);
  if (rs != REMAT_OK) return rs;
  loss_state *s = op_state_new(sizeof *s, engine, "cross_entropy");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->rows = op_rows(&d->in[0]);
  s->V = d->in[0].dim[d->in[0].ndim - 1];
  if (d->in_dtype[0] == OP_BF16 || d->din_dtype[0] == OP_BF16)
    s->base.temp_bytes = (size_t)(2 * s->V) * sizeof(float);
  s->row_block = op_row_block(s->V);
  s->tiles = op_div_up(s->rows, s->row_block);
  inst->naux = 2;
  inst->aux_bytes[0] = inst->aux_bytes[1] = (size_t)s->rows * sizeof(float);
  double n = (double)s->rows * s->V;
  uint32_t ins = OP_SLOT_IN(0) | OP_SLOT_IN(1);
  inst->fwd[inst->nfwd++] =
      op_make_kernel("cross_entropy.rows", ce_rows, s->tiles, 4.0 * n, ins,
                     OP_SLOT_AUX(0) | OP_SLOT_AUX(1));
  inst->fwd[inst->nfwd++] =
      op_make_kernel("cross_entropy.mean", ce_mean, 1, (double)s->rows,
                     OP_SLOT_AUX(0), OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] = op_make_kernel(
      "cross_entropy.bwd", ce_bwd, s->tiles, 4.0 * n,
      ins | OP_SLOT_AUX(1) | OP_SLOT_DOUT, OP_SLOT_DIN(0));
  inst->fwd[0].span = op_span_rows(s->rows, s->row_block,
                                   ins | OP_SLOT_AUX(0) | OP_SLOT_AUX(1));
  inst->bwd[0].span = op_span_rows(s->rows, s->row_block,
                                   ins | OP_SLOT_AUX(1) | OP_SLOT_DIN(0));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}

/* ---- sum and mean ---- */

remat_status op_reduce_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"x"};
  static const op_dtype types[] = {OP_F32};
  remat_status rs = op_check_inputs(d, 1, 1, names, types, err);
  if (rs == REMAT_OK) d->out = op_scalar_shape();
  return rs;
}

// x is (n): aux[0][tile] = the sum of the tile's chunk
static int reduce_partial(const op_instance *op, const op_bufs *b,
                          int64_t tile, op_worker *w) {
  (void)w;
  const loss_state *s = op->state;
  int64_t i0 = tile * OP_FLAT_ELEMS, n = op_min64(OP_FLAT_ELEMS, s->n - i0);
  if (op->desc.in_dtype[0] == OP_BF16)
    b->aux[0][tile] =
        (float)sum_lanes_bf16((const uint16_t *)b->in[0] + i0, n);
  else
    b->aux[0][tile] = (float)sum_lanes(b->in[0] + i0, n);
  return REMAT_OK;
}

// out[0] = the partials summed in tile order (over n for mean)
static int reduce_total(const op_instance *op, const op_bufs *b, int64_t tile,
                        op_worker *w) {
  (void)w;
  (void)tile;
  const loss_state *s = op->state;
  double total = 0.0;
  for (int64_t t = 0; t < s->tiles; t++) total += b->aux[0][t];
  if (op->desc.type == OP_MEAN) total /= (double)s->n;
  b->out[0] = (float)total;
  return REMAT_OK;
}

// in the forward pass y = sum x (or mean), so dx = dy (or dy / n)
static int reduce_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  (void)w;
  const loss_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  int64_t i0 = tile * OP_FLAT_ELEMS, n = op_min64(OP_FLAT_ELEMS, s->n - i0);
  float g = b->dout[0];
  if (op->desc.type == OP_MEAN) g = (float)(g / (double)s->n);
  if (op->desc.din_dtype[0] == OP_BF16) {
    fill_bf16((uint16_t *)b->din[0] + i0, g, n, b->din_accumulate[0]);
    return REMAT_OK;
  }
  float *restrict dx = b->din[0] + i0;
  if (b->din_accumulate[0])
    for (int64_t i = 0; i < n; i++) dx[i] += g;
  else
    for (int64_t i = 0; i < n; i++) dx[i] = g;
  return REMAT_OK;
}

remat_status op_reduce_plan(op_instance *inst, dnnl_engine_t engine,
                            char err[OP_ERRMSG_MAX]) {
  remat_status rs = check_scalar_out(&inst->desc, err);
  if (rs != REMAT_OK) return rs;
  const char *name = op_name(inst->desc.type);
  loss_state *s = op_state_new(sizeof *s, engine, name);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->n = op_numel(&inst->desc.in[0]);
  s->tiles = op_div_up(s->n, OP_FLAT_ELEMS);
  inst->naux = 1;
  inst->aux_bytes[0] = (size_t)s->tiles * sizeof(float);
  bool mean = inst->desc.type == OP_MEAN;
  inst->fwd[inst->nfwd++] = op_make_kernel(
      mean ? "mean.partial" : "sum.partial", reduce_partial, s->tiles,
      (double)s->n, OP_SLOT_IN(0), OP_SLOT_AUX(0));
  inst->fwd[inst->nfwd++] =
      op_make_kernel(mean ? "mean.total" : "sum.total", reduce_total, 1,
                     (double)s->tiles, OP_SLOT_AUX(0), OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] = op_make_kernel(
      mean ? "mean.bwd" : "sum.bwd", reduce_bwd, s->tiles, (double)s->n,
      OP_SLOT_DOUT, OP_SLOT_DIN(0));
  inst->fwd[0].span = op_span_rows(s->n, OP_FLAT_ELEMS, OP_SLOT_IN(0));
  inst->fwd[0].span.tile_slots = OP_SLOT_AUX(0);
  inst->bwd[0].span = op_span_rows(s->n, OP_FLAT_ELEMS, OP_SLOT_DIN(0));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
