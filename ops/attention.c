/* The two products of materialized attention on oneDNN matmul with strided
 * views into q, k and v (ops/attn_geom.h: a packed qkv or separate
 * tensors, grouped-query heads): scores s = scale q.k^T, masked -inf where
 * a query may not see a key (causal mask, key lengths), and values
 * o = p . v. Tiles are (batch, query head), except the key and value
 * gradients, tiled by (batch, kv head): each sums its group's query heads
 * in order, so no two tiles write the same rows. Every buffer is read and
 * written in its desc dtype (bf16 operands accumulate in f32 inside
 * oneDNN); the mask and the masked copy of the score gradient are written
 * in the scores' dtype. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/bf16.h"
#include "ops/attn_geom.h"

typedef struct attn_state {
  op_base base;
  attn_geom a;
  op_gemm fwd, dx, dy; /* scores: fwd, dq, dk; values: fwd, dp, dv */
} attn_state;

static attn_state *attn_state_new(op_instance *inst, dnnl_engine_t engine,
                                  const attn_geom *a) {
  attn_state *s = op_state_new(sizeof *s, engine, op_name(inst->desc.type));
  if (!s) return NULL;
  inst->state = s;
  s->a = *a;
  return s;
}

/* Tiles of `tiles` (batch, head) pairs each work on rows (b, h, 0..rows)
 * of the (B, heads, rows) rows, which lie in batch b of every buffer. */
static op_span attn_span(const op_kernel *k, int64_t tiles, int64_t rows) {
  return op_span_rows(tiles * rows, rows, k->reads | k->writes);
}

/* The key lengths (int32 [B]) when the op has them, else NULL. */
static const float *key_lens(const op_instance *op, const op_bufs *b) {
  return op->desc.attrs.attn_lens ? b->in[op->desc.nin - 1] : NULL;
}

/* ---- scores ---- */

/* Inputs: qkv [, lens] (packed) or q, k [, lens] (separate). */
remat_status op_attn_scores_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const packed[] = {"qkv", "key lengths"};
  static const char *const separate[] = {"q", "k", "key lengths"};
  bool sep = d->attrs.attn_separate;
  int n = (sep ? 2 : 1) + d->attrs.attn_lens;
  op_dtype t[3] = {OP_F32, OP_F32, OP_F32};
  t[n - 1] = d->attrs.attn_lens ? OP_I32 : OP_F32;
  remat_status rs = op_check_inputs(d, n, n, sep ? separate : packed, t, err);
  attn_geom a;
  if (rs == REMAT_OK)
    rs = attn_geom_infer(d, "", &d->in[0], sep ? &d->in[1] : NULL,
                         sep ? &d->in[1] : NULL, &a, err);
  if (rs == REMAT_OK && d->attrs.attn_lens)
    rs = attn_check_lens(d, n - 1, a.B, err);
  if (rs != REMAT_OK) return rs;
  op_shape out = {4, {a.B, a.H, a.T, a.S}};
  d->out = out;
  return REMAT_OK;
}

/* Writes -inf (in dtype st) over the keys each query row of tile (b, h)
 * may not see: s is (T,S). */
static void mask_scores(const attn_geom *a, void *sc, op_dtype st,
                        int64_t len) {
  int64_t T = a->T, S = a->S;
  if (st == OP_BF16) {
    uint16_t *sh = sc, ninf = bf16_from_f32(-INFINITY);
    for (int64_t i = 0; i < T; i++)
      for (int64_t j = attn_keys(a, i, len); j < S; j++) sh[i * S + j] = ninf;
    return;
  }
  float *sf = sc, ninf = -INFINITY;
  for (int64_t i = 0; i < T; i++)
    for (int64_t j = attn_keys(a, i, len); j < S; j++) sf[i * S + j] = ninf;
}

// q is (B,T,H,hd), k is (B,S,KVH,hd), s is (B,H,T,S):
// s[b,h,i,j] = scale q[b,i,h] . k[b,j,h/group] where query i sees key j,
// -inf elsewhere
static int scores_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  const op_gemm *g = &s->fwd;
  int64_t bi = tile / a->H, h = tile % a->H;
  const float *kin = op->desc.attrs.attn_separate ? b->in[1] : b->in[0];
  void *sc = op_at(b->out, tile * a->T * a->S, g->c_dt);
  int rs = op_gemm_run(g, 0, op_at(b->in[0], attn_q_at(a, bi, h, 0), g->a_dt),
                       op_at(kin, attn_k_at(a, bi, h / a->group, 0), g->b_dt),
                       NULL, sc, false, w);
  mask_scores(a, sc, g->c_dt, attn_len(a, key_lens(op, b), bi));
  return rs;
}

/* ds (T,S) = dout of tile (b, h) where query i sees key j, else 0, into
 * the worker's temporary. */
static const void *masked_dscores(const op_instance *op, const op_bufs *b,
                                  int64_t bi, int64_t h, op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  int64_t T = a->T, S = a->S, len = attn_len(a, key_lens(op, b), bi);
  op_dtype dt = s->dx.a_dt;
  size_t es = (size_t)op_dtype_size(dt);
  const char *dout = op_at(b->dout, (bi * a->H + h) * T * S, dt);
  char *ds = (char *)op_temp(&s->base, w);
  for (int64_t i = 0; i < T; i++) {
    int64_t n = attn_keys(a, i, len);
    memcpy(ds + i * S * es, dout + i * S * es, (size_t)n * es);
    memset(ds + (i * S + n) * es, 0, (size_t)(S - n) * es);
  }
  return ds;
}

// in the forward pass s = scale q . k^T (masked), so with ds the masked
// dout: dq = scale ds . k
static int scores_dq(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  if (!b->din[0]) return REMAT_OK;
  int64_t bi = tile / a->H, h = tile % a->H;
  const float *kin = op->desc.attrs.attn_separate ? b->in[1] : b->in[0];
  const void *ds = masked_dscores(op, b, bi, h, w);
  return op_gemm_run(&s->dx, 0, ds,
                     op_at(kin, attn_k_at(a, bi, h / a->group, 0), s->dx.b_dt),
                     NULL, op_at(b->din[0], attn_q_at(a, bi, h, 0), s->dx.c_dt),
                     b->din_accumulate[0], w);
}

// and dk of kv head g = scale sum over its group's query heads h, in
// order, of ds_h^T . q_h
static int scores_dk(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  int ki = op->desc.attrs.attn_separate ? 1 : 0;
  if (!b->din[ki]) return REMAT_OK;
  int64_t bi = tile / a->KVH, g = tile % a->KVH;
  void *dk = op_at(b->din[ki], attn_k_at(a, bi, g, 0), s->dy.c_dt);
  int rs = REMAT_OK;
  for (int64_t r = 0; r < a->group && rs == REMAT_OK; r++) {
    int64_t h = g * a->group + r;
    const void *ds = masked_dscores(op, b, bi, h, w);
    rs = op_gemm_run(&s->dy, 0, ds,
                     op_at(b->in[0], attn_q_at(a, bi, h, 0), s->dy.b_dt),
                     NULL, dk, r > 0 || b->din_accumulate[ki], w);
  }
  return rs;
}

remat_status op_attn_scores_plan(op_instance *inst, dnnl_engine_t engine,
                                 char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  bool sep = d->attrs.attn_separate;
  attn_geom a;
  remat_status rs = attn_geom_infer(d, "", &d->in[0], sep ? &d->in[1] : NULL,
                                    sep ? &d->in[1] : NULL, &a, err);
  if (rs != REMAT_OK) return rs;
  attn_state *s = attn_state_new(inst, engine, &a);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  int64_t T = a.T, S = a.S, hd = a.hd;
  int ki = sep ? 1 : 0;
  op_dtype qt = d->in_dtype[0], kt = d->in_dtype[ki], st = d->out_dtype;
  op_gemm_init(&s->fwd, T, S, hd, T, S);
  op_gemm_layout(&s->fwd, op_plain(a.q_ld), op_transposed(a.k_ld), S);
  op_gemm_dtypes(&s->fwd, qt, kt, st); /* S = scale Q K^T */
  s->fwd.alpha = a.scale;
  s->fwd.accumulate_too = false;
  op_gemm_init(&s->dx, T, hd, S, T, hd);
  op_gemm_layout(&s->dx, op_plain(S), op_plain(a.k_ld), a.q_ld);
  op_gemm_dtypes(&s->dx, st, kt, d->din_dtype[0]); /* dQ = scale dS K */
  s->dx.alpha = a.scale;
  op_gemm_init(&s->dy, S, hd, T, S, hd);
  op_gemm_layout(&s->dy, op_transposed(S), op_plain(a.q_ld), a.k_ld);
  op_gemm_dtypes(&s->dy, st, qt, d->din_dtype[ki]); /* dK = scale dS^T Q */
  s->dy.alpha = a.scale;
  rs = op_gemm_plan(&s->fwd, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dx, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dy, &s->base, err);
  if (rs != REMAT_OK) return rs;
  s->base.temp_bytes = (size_t)(T * S * op_dtype_size(st));
  int64_t tiles = a.B * a.H;
  double flops = 2.0 * tiles * T * S * hd;
  uint32_t qk = OP_SLOT_IN(0) | (sep ? OP_SLOT_IN(1) : 0u);
  uint32_t lens = d->attrs.attn_lens ? OP_SLOT_IN(d->nin - 1) : 0u;
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "attn_scores.fwd", scores_fwd, tiles, flops, qk | lens, OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attn_scores.dq", scores_dq, tiles, flops,
                     qk | lens | OP_SLOT_DOUT, OP_SLOT_DIN(0));
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attn_scores.dk", scores_dk, a.B * a.KVH, flops,
                     qk | lens | OP_SLOT_DOUT, OP_SLOT_DIN(ki));
  inst->fwd[0].span = attn_span(&inst->fwd[0], tiles, T);
  inst->bwd[0].span = attn_span(&inst->bwd[0], tiles, T);
  inst->bwd[1].span = attn_span(&inst->bwd[1], a.B * a.KVH, a.group * T);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}

/* ---- values ---- */

/* The geometry of a values op: p [B,H,T,S] and a packed qkv or v. */
static remat_status values_geom(const op_desc *d, attn_geom *a,
                                char err[OP_ERRMSG_MAX]) {
  char bp[OP_SHAPE_STR_MAX], prefix[OP_SHAPE_STR_MAX + 8];
  const op_shape *p = &d->in[0], *v = &d->in[1];
  snprintf(prefix, sizeof prefix, "p %s and ", op_shape_str(p, bp));
  if (!d->attrs.attn_separate)
    return attn_geom_infer(d, prefix, v, NULL, NULL, a, err);
  int64_t KVH = d->attrs.kv_heads ? d->attrs.kv_heads : d->attrs.heads;
  int64_t hd = KVH > 0 && v->ndim == 3 ? v->dim[2] / KVH : 0;
  op_shape q = {3, {p->dim[0], p->ndim == 4 ? p->dim[2] : 1,
                    d->attrs.heads * op_max64(hd, 1)}};
  return attn_geom_infer(d, prefix, &q, v, v, a, err);
}

/* Inputs: p, qkv (packed) or p, v (separate). */
remat_status op_attn_values_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const packed[] = {"p", "qkv"};
  static const char *const separate[] = {"p", "v"};
  static const op_dtype types[] = {OP_F32, OP_F32};
  bool sep = d->attrs.attn_separate;
  remat_status rs =
      op_check_inputs(d, 2, 2, sep ? separate : packed, types, err);
  attn_geom a;
  if (rs == REMAT_OK) rs = values_geom(d, &a, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *p = &d->in[0];
  op_shape want = {4, {a.B, a.H, a.T, a.S}};
  char bp[OP_SHAPE_STR_MAX], bv[OP_SHAPE_STR_MAX], bw[OP_SHAPE_STR_MAX];
  if (!op_shape_eq(p, &want))
    return op_shape_err(err, d,
                        "p %s and %s %s with %lld heads: p must be "
                        "[B,H,T,%s] = %s",
                        op_shape_str(p, bp), sep ? "v" : "qkv",
                        op_shape_str(&d->in[1], bv), (long long)a.H,
                        sep ? "S" : "T", op_shape_str(&want, bw));
  op_shape out = {3, {a.B, a.T, a.H * a.hd}};
  d->out = out;
  return REMAT_OK;
}

// p is (B,H,T,S), v is (B,S,KVH,hd), o is (B,T,H,hd):
// o[b,:,h] = p[b,h] . v[b,:,h/group]
static int values_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  const op_gemm *g = &s->fwd;
  int64_t bi = tile / a->H, h = tile % a->H;
  return op_gemm_run(
      g, 0, op_at(b->in[0], tile * a->T * a->S, g->a_dt),
      op_at(b->in[1], attn_v_at(a, bi, h / a->group, 0), g->b_dt), NULL,
      op_at(b->out, attn_o_at(a, bi, h, 0), g->c_dt), false, w);
}

// in the forward pass o = p . v, so dp (T,S) = do (T,hd) . v^T (hd,S)
static int values_dp(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  if (!b->din[0]) return REMAT_OK;
  const op_gemm *g = &s->dx;
  int64_t bi = tile / a->H, h = tile % a->H;
  return op_gemm_run(
      g, 0, op_at(b->dout, attn_o_at(a, bi, h, 0), g->a_dt),
      op_at(b->in[1], attn_v_at(a, bi, h / a->group, 0), g->b_dt), NULL,
      op_at(b->din[0], tile * a->T * a->S, g->c_dt), b->din_accumulate[0], w);
}

// and dv of kv head g (S,hd) = the sum over its group's query heads h, in
// order, of p_h^T (S,T) . do_h (T,hd), into the v columns
static int values_dv(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  if (!b->din[1]) return REMAT_OK;
  const op_gemm *g = &s->dy;
  int64_t bi = tile / a->KVH, kv = tile % a->KVH;
  void *dv = op_at(b->din[1], attn_v_at(a, bi, kv, 0), g->c_dt);
  int rs = REMAT_OK;
  for (int64_t r = 0; r < a->group && rs == REMAT_OK; r++) {
    int64_t h = kv * a->group + r;
    rs = op_gemm_run(g, 0,
                     op_at(b->in[0], (bi * a->H + h) * a->T * a->S, g->a_dt),
                     op_at(b->dout, attn_o_at(a, bi, h, 0), g->b_dt), NULL, dv,
                     r > 0 || b->din_accumulate[1], w);
  }
  return rs;
}

remat_status op_attn_values_plan(op_instance *inst, dnnl_engine_t engine,
                                 char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  attn_geom a;
  remat_status rs = values_geom(d, &a, err);
  if (rs != REMAT_OK) return rs;
  attn_state *s = attn_state_new(inst, engine, &a);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  int64_t T = a.T, S = a.S, hd = a.hd;
  op_dtype pt = d->in_dtype[0], vt = d->in_dtype[1], ot = d->out_dtype;
  op_gemm_init(&s->fwd, T, hd, S, T, hd);
  op_gemm_layout(&s->fwd, op_plain(S), op_plain(a.v_ld), a.o_ld); /* O = P V */
  op_gemm_dtypes(&s->fwd, pt, vt, ot);
  s->fwd.accumulate_too = false;
  op_gemm_init(&s->dx, T, S, hd, T, S);
  op_gemm_layout(&s->dx, op_plain(a.o_ld), op_transposed(a.v_ld), S);
  op_gemm_dtypes(&s->dx, ot, vt, d->din_dtype[0]); /* dP = dO V^T */
  op_gemm_init(&s->dy, S, hd, T, S, hd);
  op_gemm_layout(&s->dy, op_transposed(S), op_plain(a.o_ld), a.v_ld);
  op_gemm_dtypes(&s->dy, pt, ot, d->din_dtype[1]); /* dV = P^T dO */
  rs = op_gemm_plan(&s->fwd, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dx, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dy, &s->base, err);
  if (rs != REMAT_OK) return rs;
  int64_t tiles = a.B * a.H;
  double flops = 2.0 * tiles * T * S * hd;
  inst->fwd[inst->nfwd++] =
      op_make_kernel("attn_values.fwd", values_fwd, tiles, flops,
                     OP_SLOT_IN(0) | OP_SLOT_IN(1), OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attn_values.dp", values_dp, tiles, flops,
                     OP_SLOT_IN(1) | OP_SLOT_DOUT, OP_SLOT_DIN(0));
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attn_values.dv", values_dv, a.B * a.KVH, flops,
                     OP_SLOT_IN(0) | OP_SLOT_DOUT, OP_SLOT_DIN(1));
  inst->fwd[0].span = attn_span(&inst->fwd[0], tiles, T);
  inst->bwd[0].span = attn_span(&inst->bwd[0], tiles, T);
  inst->bwd[1].span = attn_span(&inst->bwd[1], a.B * a.KVH, a.group * T);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
