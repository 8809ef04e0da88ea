/* The two products of causal self-attention on oneDNN matmul with strided
 * views into qkv (q = cols [0,D), k = [D,2D), v = [2D,3D) of each row; head
 * h uses cols h*hd..(h+1)*hd of each part). One tile per (batch, head).
 * Every buffer is read and written in its desc dtype (bf16 operands
 * accumulate in f32 inside oneDNN); the mask and the masked copy of the
 * score gradient are written in the scores' dtype. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/bf16.h"
#include "ops/op_impl.h"

typedef struct attn_state {
  op_base base;
  int64_t B, T, D, H, hd;
  float scale;
  op_gemm fwd, dx, dy; /* scores: fwd, dq, dk; values: fwd, dp, dv */
} attn_state;

remat_status op_check_qkv(const op_desc *d, const op_shape *qkv,
                          const char *prefix, char err[OP_ERRMSG_MAX]) {
  char bq[OP_SHAPE_STR_MAX];
  op_shape_str(qkv, bq);
  if (qkv->ndim != 3 || qkv->dim[2] % 3 != 0)
    return op_shape_err(err, d, "%sqkv %s: qkv must be [B,T,3D]", prefix, bq);
  int64_t D = qkv->dim[2] / 3;
  if (d->attrs.heads < 1 || D % d->attrs.heads != 0)
    return op_shape_err(err, d,
                        "%sqkv %s with %d heads: D (%lld) must be divisible "
                        "by the number of heads",
                        prefix, bq, d->attrs.heads, (long long)D);
  return REMAT_OK;
}

static attn_state *attn_state_new(op_instance *inst, dnnl_engine_t engine,
                                  const op_shape *qkv) {
  attn_state *s = op_state_new(sizeof *s, engine, op_name(inst->desc.type));
  if (!s) return NULL;
  inst->state = s;
  s->B = qkv->dim[0];
  s->T = qkv->dim[1];
  s->D = qkv->dim[2] / 3;
  s->H = inst->desc.attrs.heads;
  s->hd = s->D / s->H;
  s->scale = (float)(1.0 / sqrt((double)s->hd));
  return s;
}

/* Tile (b, h) works on rows (b, h, 0..T) of the (B, H, T) rows, which lie
 * in batch b of every buffer it touches. */
static void attn_spans(op_instance *inst, const attn_state *s) {
  for (int k = 0; k < inst->nfwd; k++)
    inst->fwd[k].span = op_span_rows(s->B * s->H * s->T, s->T,
                                     inst->fwd[k].reads | inst->fwd[k].writes);
  for (int k = 0; k < inst->nbwd; k++)
    inst->bwd[k].span = op_span_rows(s->B * s->H * s->T, s->T,
                                     inst->bwd[k].reads | inst->bwd[k].writes);
}

/* Offset of column block (part, head) of row 0 of batch b in qkv. */
static int64_t qkv_off(const attn_state *s, int64_t b, int part, int64_t h) {
  return b * s->T * 3 * s->D + part * s->D + h * s->hd;
}

/* ---- scores ---- */

remat_status op_attn_scores_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"qkv"};
  static const op_dtype types[] = {OP_F32};
  remat_status rs = op_check_inputs(d, 1, 1, names, types, err);
  if (rs == REMAT_OK) rs = op_check_qkv(d, &d->in[0], "", err);
  if (rs != REMAT_OK) return rs;
  const op_shape *q = &d->in[0];
  op_shape out = {4, {q->dim[0], d->attrs.heads, q->dim[1], q->dim[1]}};
  d->out = out;
  return REMAT_OK;
}

// qkv is (B,T,3D), s is (B,H,T,T): s[b,h,i,j] = q_i . k_j / sqrt(hd) for
// j <= i, -inf for j > i
static int scores_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const attn_state *s = op->state;
  const op_gemm *g = &s->fwd;
  int64_t bi = tile / s->H, h = tile % s->H, T = s->T;
  void *sc = op_at(b->out, tile * T * T, g->c_dt);
  int rs = op_gemm_run(g, 0, op_at(b->in[0], qkv_off(s, bi, 0, h), g->a_dt),
                       op_at(b->in[0], qkv_off(s, bi, 1, h), g->b_dt), NULL,
                       sc, false, w);
  if (g->c_dt == OP_BF16) {
    uint16_t *sh = sc, ninf = bf16_from_f32(-INFINITY);
    for (int64_t i = 0; i < T; i++)
      for (int64_t j = i + 1; j < T; j++) sh[i * T + j] = ninf;
    return rs;
  }
  float *sf = sc;
  for (int64_t i = 0; i < T; i++)
    for (int64_t j = i + 1; j < T; j++) sf[i * T + j] = -INFINITY;
  return rs;
}

// in the forward pass s = q . k^T * scale (masked), so with ds the masked
// dout: dq = scale * ds . k and dk = scale * ds^T . q
static int scores_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const attn_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  int64_t bi = tile / s->H, h = tile % s->H, T = s->T;
  op_dtype dt = s->dx.a_dt, qt = s->dx.b_dt, gt = s->dx.c_dt;
  size_t es = (size_t)op_dtype_size(dt);
  const char *dout = op_at(b->dout, tile * T * T, dt);
  char *ds = (char *)op_temp(&s->base, w);
  for (int64_t i = 0; i < T; i++) {
    memcpy(ds + i * T * es, dout + i * T * es, (size_t)(i + 1) * es);
    memset(ds + (i * T + i + 1) * es, 0, (size_t)(T - i - 1) * es);
  }
  const float *qkv = b->in[0];
  float *dqkv = b->din[0];
  bool acc = b->din_accumulate[0];
  int rs = op_gemm_run(&s->dx, 0, ds, op_at(qkv, qkv_off(s, bi, 1, h), qt),
                       NULL, op_at(dqkv, qkv_off(s, bi, 0, h), gt), acc, w);
  if (rs == REMAT_OK)
    rs = op_gemm_run(&s->dy, 0, ds, op_at(qkv, qkv_off(s, bi, 0, h), qt),
                     NULL, op_at(dqkv, qkv_off(s, bi, 1, h), gt), acc, w);
  return rs;
}

remat_status op_attn_scores_plan(op_instance *inst, dnnl_engine_t engine,
                                 char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  attn_state *s = attn_state_new(inst, engine, &d->in[0]);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  int64_t T = s->T, hd = s->hd, ld = 3 * s->D;
  op_dtype qt = d->in_dtype[0], st = d->out_dtype, gt = d->din_dtype[0];
  op_gemm_init(&s->fwd, T, T, hd, T, T);
  op_gemm_layout(&s->fwd, op_plain(ld), op_transposed(ld), T); /* S = Q K^T */
  op_gemm_dtypes(&s->fwd, qt, qt, st);
  s->fwd.alpha = s->scale;
  s->fwd.accumulate_too = false;
  op_gemm_init(&s->dx, T, hd, T, T, hd);
  op_gemm_layout(&s->dx, op_plain(T), op_plain(ld), ld); /* dQ = dS K */
  op_gemm_dtypes(&s->dx, st, qt, gt);
  s->dx.alpha = s->scale;
  op_gemm_init(&s->dy, T, hd, T, T, hd);
  op_gemm_layout(&s->dy, op_transposed(T), op_plain(ld), ld); /* dK = dS^T Q */
  op_gemm_dtypes(&s->dy, st, qt, gt);
  s->dy.alpha = s->scale;
  remat_status rs = op_gemm_plan(&s->fwd, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dx, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dy, &s->base, err);
  if (rs != REMAT_OK) return rs;
  s->base.temp_bytes = (size_t)(T * T * op_dtype_size(st));
  int64_t tiles = s->B * s->H;
  double flops = 2.0 * tiles * T * T * hd;
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "attn_scores.fwd", scores_fwd, tiles, flops, OP_SLOT_IN(0), OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attn_scores.bwd", scores_bwd, tiles, 2.0 * flops,
                     OP_SLOT_IN(0) | OP_SLOT_DOUT, OP_SLOT_DIN(0));
  attn_spans(inst, s);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}

/* ---- values ---- */

remat_status op_attn_values_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"p", "qkv"};
  static const op_dtype types[] = {OP_F32, OP_F32};
  remat_status rs = op_check_inputs(d, 2, 2, names, types, err);
  char bp[OP_SHAPE_STR_MAX], prefix[OP_SHAPE_STR_MAX + 8];
  snprintf(prefix, sizeof prefix, "p %s and ", op_shape_str(&d->in[0], bp));
  if (rs == REMAT_OK) rs = op_check_qkv(d, &d->in[1], prefix, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *p = &d->in[0], *q = &d->in[1];
  int64_t B = q->dim[0], T = q->dim[1], H = d->attrs.heads;
  op_shape want = {4, {B, H, T, T}};
  char bq[OP_SHAPE_STR_MAX], bw[OP_SHAPE_STR_MAX];
  if (!op_shape_eq(p, &want))
    return op_shape_err(err, d,
                        "p %s and qkv %s with %lld heads: p must be "
                        "[B,H,T,T] = %s",
                        bp, op_shape_str(q, bq), (long long)H,
                        op_shape_str(&want, bw));
  op_shape out = {3, {B, T, q->dim[2] / 3}};
  d->out = out;
  return REMAT_OK;
}

// p is (B,H,T,T), qkv is (B,T,3D), o is (B,T,D): o[b,:,h] = p[b,h] . v[b,:,h]
static int values_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const attn_state *s = op->state;
  const op_gemm *g = &s->fwd;
  int64_t bi = tile / s->H, h = tile % s->H;
  return op_gemm_run(g, 0, op_at(b->in[0], tile * s->T * s->T, g->a_dt),
                     op_at(b->in[1], qkv_off(s, bi, 2, h), g->b_dt), NULL,
                     op_at(b->out, bi * s->T * s->D + h * s->hd, g->c_dt),
                     false, w);
}

// in the forward pass o = p . v, so dp (T,T) = do (T,hd) . v^T (hd,T)
static int values_dp(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const attn_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  const op_gemm *g = &s->dx;
  int64_t bi = tile / s->H, h = tile % s->H;
  int64_t o = bi * s->T * s->D + h * s->hd;
  return op_gemm_run(g, 0, op_at(b->dout, o, g->a_dt),
                     op_at(b->in[1], qkv_off(s, bi, 2, h), g->b_dt), NULL,
                     op_at(b->din[0], tile * s->T * s->T, g->c_dt),
                     b->din_accumulate[0], w);
}

// and dv (T,hd) = p^T (T,T) . do (T,hd), into the v columns of dqkv
static int values_dv(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const attn_state *s = op->state;
  if (!b->din[1]) return REMAT_OK;
  const op_gemm *g = &s->dy;
  int64_t bi = tile / s->H, h = tile % s->H;
  return op_gemm_run(g, 0, op_at(b->in[0], tile * s->T * s->T, g->a_dt),
                     op_at(b->dout, bi * s->T * s->D + h * s->hd, g->b_dt),
                     NULL, op_at(b->din[1], qkv_off(s, bi, 2, h), g->c_dt),
                     b->din_accumulate[1], w);
}

remat_status op_attn_values_plan(op_instance *inst, dnnl_engine_t engine,
                                 char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  attn_state *s = attn_state_new(inst, engine, &d->in[1]);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  int64_t T = s->T, hd = s->hd, ld = 3 * s->D, D = s->D;
  op_dtype pt = d->in_dtype[0], vt = d->in_dtype[1], ot = d->out_dtype;
  op_gemm_init(&s->fwd, T, hd, T, T, hd);
  op_gemm_layout(&s->fwd, op_plain(T), op_plain(ld), D); /* O = P V */
  op_gemm_dtypes(&s->fwd, pt, vt, ot);
  s->fwd.accumulate_too = false;
  op_gemm_init(&s->dx, T, T, hd, T, T);
  op_gemm_layout(&s->dx, op_plain(D), op_transposed(ld), T); /* dP = dO V^T */
  op_gemm_dtypes(&s->dx, ot, vt, d->din_dtype[0]);
  op_gemm_init(&s->dy, T, hd, T, T, hd);
  op_gemm_layout(&s->dy, op_transposed(T), op_plain(D), ld); /* dV = P^T dO */
  op_gemm_dtypes(&s->dy, pt, ot, d->din_dtype[1]);
  remat_status rs = op_gemm_plan(&s->fwd, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dx, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dy, &s->base, err);
  if (rs != REMAT_OK) return rs;
  int64_t tiles = s->B * s->H;
  double flops = 2.0 * tiles * T * T * hd;
  inst->fwd[inst->nfwd++] =
      op_make_kernel("attn_values.fwd", values_fwd, tiles, flops,
                     OP_SLOT_IN(0) | OP_SLOT_IN(1), OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attn_values.dp", values_dp, tiles, flops,
                     OP_SLOT_IN(1) | OP_SLOT_DOUT, OP_SLOT_DIN(0));
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attn_values.dv", values_dv, tiles, flops,
                     OP_SLOT_IN(0) | OP_SLOT_DOUT, OP_SLOT_DIN(1));
  attn_spans(inst, s);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
