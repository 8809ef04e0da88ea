/* Fused causal self-attention: from qkv [B,T,3D] straight to o [B,T,D],
 * saving only o and the per-row log-sum-exp [B,H,T]; no T x T matrix is
 * ever stored. Tiles are (batch, head, block of b rows); the scores of one
 * query block against the keys up to its diagonal live in the worker's
 * scratch. The backward recomputes the probabilities from q, k and the
 * log-sum-exp: dq tiles over query blocks, dk and dv tiles over key blocks
 * (each against all the queries at or after it), each tile writing only its
 * own rows, so the sums run in a fixed order whatever the thread count.
 * Each product of a tile is one oneDNN call, with a primitive per block
 * made at plan time (the shapes grow along the diagonal).
 * In bf16 (qkv, o and their gradients stored in bf16) the products read
 * q, k, v and do in bf16 and write the scores and dP in f32 to scratch;
 * the softmax, P and dS are computed in f32 and rounded to bf16 copies in
 * scratch for the products with v, k, q and do, as flash attention does
 * in bf16; lse and delta stay f32. */
/* op_expf's clamps and NaN test are selects that gcc vectorizes only when
 * comparisons may not trap; no result changes (nothing here reads the
 * floating-point exception flags). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <math.h>
#include <string.h>

#include "base/bf16.h"
#include "ops/op_impl.h"

typedef struct fused_state {
  op_base base;
  int64_t B, T, D, H, hd, blk, nb;
  int64_t ld;  /* row stride of a query block's scores: T padded */
  int64_t bld; /* row stride of one (query, key) block's: blk padded */
  float scale;
  op_dtype qt, ot, gt; /* of qkv, of o and do, of dqkv */
  bool lowp;           /* P and dS go to the products as bf16 copies */
  size_t half;         /* f32 elements of each of S and dP in scratch */
  /* per block i, one oneDNN call each: row[8 i + k]; k = 0 to 3, query
   * block i against all its keys 0..i*blk+nq: 0 qk, 1 dov, 2 pv, 3 dsk;
   * k = 4 to 7, key block i against all queries from i*blk on: 4 qk, 5 dov
   * (into a column of blocks, stride bld), 6 ptdo, 7 dstq */
  op_gemm row[];
} fused_state;

/* Rows per block, a function of T and the head dim only: 128, measured
 * (one thread, loaded machine) against 64 and 256 at T 256..2048 and head
 * dims 32, 64 and 128: 64 makes too many small oneDNN calls (1.6-2x
 * slower), 256 wastes more of the diagonal block (about 10% slower). */
static int64_t fused_block(int64_t T, int64_t hd) {
  (void)hd; /* the same best block at every head dim measured */
  return op_min64(128, T);
}

remat_status op_attention_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"qkv"};
  static const op_dtype types[] = {OP_F32};
  remat_status rs = op_check_inputs(d, 1, 1, names, types, err);
  if (rs == REMAT_OK) rs = op_check_qkv(d, &d->in[0], "", err);
  if (rs != REMAT_OK) return rs;
  const op_shape *q = &d->in[0];
  op_shape out = {3, {q->dim[0], q->dim[1], q->dim[2] / 3}};
  d->out = out;
  return REMAT_OK;
}

/* Runs gemm g (planned as one block), overwriting or adding into c. */
static int gemm_run(const op_gemm *g, bool acc, const void *a,
                    const void *b, void *c, op_worker *w) {
  dnnl_primitive_t prim = g->prim[0][0][acc];
  if (!prim) return REMAT_ERR_STATE;
  op_arg args[3] = {
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  return op_exec(prim, w, 3, args);
}

/* Where one tile's pieces lie. */
typedef struct fused_at {
  int64_t bi, h, bh;
} fused_at;

static fused_at fused_where(const fused_state *s, int64_t bh) {
  return (fused_at){bh / s->H, bh % s->H, bh};
}
/* Rows of block i (the last one may be short). */
static int64_t blk_rows(const fused_state *s, int64_t i) {
  return op_min64(s->blk, s->T - i * s->blk);
}
/* Row i*blk of part `part` (0 q, 1 k, 2 v) of head h in qkv. */
static int64_t qkv_at(const fused_state *s, fused_at a, int64_t i, int part) {
  return (a.bi * s->T + i * s->blk) * 3 * s->D + part * s->D + a.h * s->hd;
}
/* Row i*blk of head h in o, do. */
static int64_t o_at(const fused_state *s, fused_at a, int64_t i) {
  return (a.bi * s->T + i * s->blk) * s->D + a.h * s->hd;
}

/* Valid keys of query row q in a key block starting at k0 with nk keys. */
static int64_t valid_keys(int64_t q, int64_t k0, int64_t nk) {
  return op_max64(0, op_min64(nk, q - k0 + 1));
}

/* The elementwise loops (exp, softmax, dS) are cloned for the machine's
 * widest vectors (REMAT_SIMD_CLONES, base/bf16.h): each element goes
 * through the same operations in the same order in every clone (fixed
 * lanes in the sums), so results are bitwise the same on every machine. */

#define LANES 8
/* Max and sum in LANES fixed lanes, then the lanes in order: vectorizes,
 * and the order depends on n only. */
static inline float row_max(const float *restrict x, int64_t n) {
  float lane[LANES];
  for (int l = 0; l < LANES; l++) lane[l] = -INFINITY;
  int64_t c = 0;
  for (; c + LANES <= n; c += LANES)
    for (int l = 0; l < LANES; l++)
      lane[l] = x[c + l] > lane[l] ? x[c + l] : lane[l];
  for (; c < n; c++) lane[0] = x[c] > lane[0] ? x[c] : lane[0];
  float m = lane[0];
  for (int l = 1; l < LANES; l++) m = lane[l] > m ? lane[l] : m;
  return m;
}

static inline float row_sum(const float *restrict x, int64_t n) {
  float lane[LANES] = {0};
  int64_t c = 0;
  for (; c + LANES <= n; c += LANES)
    for (int l = 0; l < LANES; l++) lane[l] += x[c + l];
  for (; c < n; c++) lane[c % LANES] += x[c];
  float sum = 0.0f;
  for (int l = 0; l < LANES; l++) sum += lane[l];
  return sum;
}

/* p[0..n) = exp(x - shift) in place, then zeros up to `upto`. */
static inline void row_exp(float *restrict x, int64_t n, float shift, int64_t upto) {
  for (int64_t c = 0; c < n; c++) x[c] = op_expf(x[c] - shift);
  for (int64_t c = n; c < upto; c++) x[c] = 0.0f;
}

/* dst[0..n) = bf16(src[0..n)). */
static inline void row_to_bf16(uint16_t *restrict dst,
                               const float *restrict src, int64_t n) {
  for (int64_t c = 0; c < n; c++) dst[c] = bf16_from_f32(src[c]);
}

/* The scratch of a tile: f32 S and dP (dP `dp_at` elements after S, at
 * most half), then (lowp) bf16 copies of P and dS, half elements each. */
typedef struct fused_scratch {
  float *S, *dP;
  uint16_t *Pb, *dSb;
} fused_scratch;

static fused_scratch fused_temp(const fused_state *s, op_worker *w,
                                int64_t dp_at) {
  float *S = op_temp(&s->base, w);
  uint16_t *lo = (uint16_t *)(S + 2 * s->half);
  return (fused_scratch){S, S + dp_at, lo, lo + s->half};
}

/* Rows r < nq of S (stride ld) hold the scores of queries q0 + r against
 * keys 0..q0+nq: each row becomes its causal softmax (zeros past key q),
 * and lse[r] its log-sum-exp. With Pb (bf16, stride ld) the probabilities
 * go there rounded to bf16 instead (S then holds them unnormalized). */
REMAT_SIMD_CLONES static void softmax_rows(float *S, int64_t ld, int64_t nq,
                                     int64_t q0, float *lse, uint16_t *Pb) {
  for (int64_t r = 0; r < nq; r++) {
    float *restrict row = S + r * ld;
    int64_t n = q0 + r + 1; /* keys 0..q */
    float mx = row_max(row, n);
    row_exp(row, n, mx, q0 + nq);
    float sum = row_sum(row, n), inv = 1.0f / sum;
    if (Pb) {
      uint16_t *restrict pb = Pb + r * ld;
      for (int64_t c = 0; c < n; c++) pb[c] = bf16_from_f32(row[c] * inv);
      for (int64_t c = n; c < q0 + nq; c++) pb[c] = 0;
    } else {
      for (int64_t c = 0; c < n; c++) row[c] *= inv;
    }
    lse[r] = mx + logf(sum);
  }
}

// forward. qkv is (B,T,3D), o is (B,T,D), lse is (B,H,T); tile (b,h,i):
// S [bq, keys 0..i*blk+bq) = scale q_i k^T (in scratch, row stride ld),
// masked above the diagonal; lse_q = log sum_k exp(S_qk); P = exp(S - lse);
// o_i = P v over those keys.
static int fused_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const fused_state *s = op->state;
  fused_at a = fused_where(s, tile / s->nb);
  int64_t i = tile % s->nb, nq = blk_rows(s, i), T = s->T, q0 = i * s->blk;
  const op_gemm *g = s->row + 8 * i;
  fused_scratch t = fused_temp(s, w, 0);
  const float *qkv = b->in[0];
  int rs = gemm_run(&g[0], false, op_at(qkv, qkv_at(s, a, i, 0), s->qt),
                    op_at(qkv, qkv_at(s, a, 0, 1), s->qt), t.S, w);
  if (rs != REMAT_OK) return rs;
  softmax_rows(t.S, s->ld, nq, q0, b->aux[0] + a.bh * T + q0,
               s->lowp ? t.Pb : NULL);
  const void *P = s->lowp ? (const void *)t.Pb : t.S;
  return gemm_run(&g[2], false, P, op_at(qkv, qkv_at(s, a, 0, 2), s->qt),
                  op_at(b->out, o_at(s, a, i), s->ot), w);
}

/* The probabilities and score gradients of block (i, j) from its scores S
 * and dP (row stride ld): P = exp(S - lse_q) where key <= q, else 0, in S;
 * dS = P (dP - delta_q) in dP; when Pb or dSb are given (bf16, stride ld)
 * also P or dS rounded to bf16 there. */
REMAT_SIMD_CLONES static void probs_and_dscores(const fused_state *s, float *S,
                                          float *dP, int64_t ld, int64_t i,
                                          int64_t j, const float *lse,
                                          const float *delta, uint16_t *Pb,
                                          uint16_t *dSb) {
  int64_t nq = blk_rows(s, i), nk = blk_rows(s, j);
  int64_t q0 = i * s->blk, k0 = j * s->blk;
  for (int64_t r = 0; r < nq; r++) {
    float *restrict p = S + r * ld, *restrict dp = dP + r * ld;
    int64_t n = valid_keys(q0 + r, k0, nk);
    row_exp(p, n, lse[r], nk);
    float dl = delta[r];
    for (int64_t c = 0; c < nk; c++) dp[c] = p[c] * (dp[c] - dl);
    if (Pb) row_to_bf16(Pb + r * ld, p, nk);
    if (dSb) row_to_bf16(dSb + r * ld, dp, nk);
  }
}

// backward, dq. With delta_q = sum_c do_qc o_qc and, over the keys up to
// the diagonal, P_i recomputed, dP_i = do_i v^T and dS_i = P_i (dP_i -
// delta): dq_i = scale dS_i k. Also stores delta for the dk/dv tiles
// (ws[0], (B,H,T)).
static int fused_dq(const op_instance *op, const op_bufs *b, int64_t tile,
                    op_worker *w) {
  const fused_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  fused_at a = fused_where(s, tile / s->nb);
  int64_t i = tile % s->nb, nq = blk_rows(s, i), T = s->T, q0 = i * s->blk;
  const op_gemm *g = s->row + 8 * i;
  const void *dout = op_at(b->dout, o_at(s, a, i), s->ot);
  float *delta = b->ws[0] + a.bh * T + q0;
  if (s->ot == OP_BF16) {
    const uint16_t *dob = dout, *ob = op_at(b->out, o_at(s, a, i), s->ot);
    for (int64_t r = 0; r < nq; r++) {
      float acc = 0.0f;
      for (int64_t c = 0; c < s->hd; c++)
        acc += bf16_to_f32(dob[r * s->D + c]) * bf16_to_f32(ob[r * s->D + c]);
      delta[r] = acc;
    }
  } else {
    const float *dof = dout, *out = b->out + o_at(s, a, i);
    for (int64_t r = 0; r < nq; r++) {
      float acc = 0.0f;
      for (int64_t c = 0; c < s->hd; c++)
        acc += dof[r * s->D + c] * out[r * s->D + c];
      delta[r] = acc;
    }
  }
  const float *lse = b->aux[0] + a.bh * T + q0, *qkv = b->in[0];
  fused_scratch t = fused_temp(s, w, s->blk * s->ld);
  float *S = t.S, *dP = t.dP;
  int rs = gemm_run(&g[0], false, op_at(qkv, qkv_at(s, a, i, 0), s->qt),
                    op_at(qkv, qkv_at(s, a, 0, 1), s->qt), S, w);
  if (rs == REMAT_OK)
    rs = gemm_run(&g[1], false, dout, op_at(qkv, qkv_at(s, a, 0, 2), s->qt),
                  dP, w);
  if (rs != REMAT_OK) return rs;
  for (int64_t j = 0; j <= i; j++)
    probs_and_dscores(s, S + j * s->blk, dP + j * s->blk, s->ld, i, j, lse,
                      delta, NULL, s->lowp ? t.dSb + j * s->blk : NULL);
  const void *dS = s->lowp ? (const void *)t.dSb : dP;
  return gemm_run(&g[3], b->din_accumulate[0], dS,
                  op_at(qkv, qkv_at(s, a, 0, 1), s->qt),
                  op_at(b->din[0], qkv_at(s, a, i, 0), s->gt), w);
}

// backward, dk and dv of key block j: with P and dS of the queries from
// j*blk on against key block j as above (a column of blocks, stride bld),
// dv_j = P^T do and dk_j = scale dS^T q over those queries.
static int fused_dkv(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const fused_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  fused_at a = fused_where(s, tile / s->nb);
  int64_t j = tile % s->nb, T = s->T;
  const op_gemm *g = s->row + 8 * j;
  const float *qkv = b->in[0];
  const void *dout = op_at(b->dout, o_at(s, a, j), s->ot);
  fused_scratch t = fused_temp(s, w, T * s->bld);
  float *S = t.S, *dP = t.dP;
  int rs = gemm_run(&g[4], false, op_at(qkv, qkv_at(s, a, j, 0), s->qt),
                    op_at(qkv, qkv_at(s, a, j, 1), s->qt), S, w);
  if (rs == REMAT_OK)
    rs = gemm_run(&g[5], false, dout, op_at(qkv, qkv_at(s, a, j, 2), s->qt),
                  dP, w);
  if (rs != REMAT_OK) return rs;
  for (int64_t i = j; i < s->nb; i++) {
    int64_t at = (i - j) * s->blk * s->bld, q = a.bh * T + i * s->blk;
    probs_and_dscores(s, S + at, dP + at, s->bld, i, j, b->aux[0] + q,
                      b->ws[0] + q, s->lowp ? t.Pb + at : NULL,
                      s->lowp ? t.dSb + at : NULL);
  }
  const void *P = s->lowp ? (const void *)t.Pb : S;
  const void *dS = s->lowp ? (const void *)t.dSb : dP;
  bool acc = b->din_accumulate[0];
  rs = gemm_run(&g[6], acc, P, dout,
                op_at(b->din[0], qkv_at(s, a, j, 2), s->gt), w);
  if (rs == REMAT_OK)
    rs = gemm_run(&g[7], acc, dS, op_at(qkv, qkv_at(s, a, j, 0), s->qt),
                  op_at(b->din[0], qkv_at(s, a, j, 1), s->gt), w);
  return rs;
}

/* The products of query block i over its nq rows and all its n keys, and
 * of key block i over its nq keys and all the nr queries at or after it. */
static remat_status plan_row_gemms(fused_state *s, int64_t i,
                                   char err[OP_ERRMSG_MAX]) {
  int64_t nq = blk_rows(s, i), n = i * s->blk + nq, hd = s->hd;
  int64_t ld = 3 * s->D, D = s->D;
  op_gemm *g = s->row + 8 * i;
  op_gemm_init(&g[0], nq, n, hd, nq, n); /* S = scale Q K^T */
  op_gemm_layout(&g[0], op_plain(ld), op_transposed(ld), s->ld);
  g[0].alpha = s->scale;
  g[0].accumulate_too = false;
  op_gemm_init(&g[1], nq, n, hd, nq, n); /* dP = dO V^T */
  op_gemm_layout(&g[1], op_plain(D), op_transposed(ld), s->ld);
  g[1].accumulate_too = false;
  op_gemm_init(&g[2], nq, hd, n, nq, hd); /* O = P V */
  op_gemm_layout(&g[2], op_plain(s->ld), op_plain(ld), D);
  g[2].accumulate_too = false;
  op_gemm_init(&g[3], nq, hd, n, nq, hd); /* dQ (+)= scale dS K */
  op_gemm_layout(&g[3], op_plain(s->ld), op_plain(ld), ld);
  g[3].alpha = s->scale;
  int64_t nk = nq, nr = s->T - i * s->blk; /* key block i, its queries */
  op_gemm_init(&g[4], nr, nk, hd, nr, nk); /* S = scale Q K_i^T */
  op_gemm_layout(&g[4], op_plain(ld), op_transposed(ld), s->bld);
  g[4].alpha = s->scale;
  g[4].accumulate_too = false;
  op_gemm_init(&g[5], nr, nk, hd, nr, nk); /* dP = dO V_i^T */
  op_gemm_layout(&g[5], op_plain(D), op_transposed(ld), s->bld);
  g[5].accumulate_too = false;
  op_gemm_init(&g[6], nk, hd, nr, nk, hd); /* dV_i (+)= P^T dO */
  op_gemm_layout(&g[6], op_transposed(s->bld), op_plain(D), ld);
  op_gemm_init(&g[7], nk, hd, nr, nk, hd); /* dK_i (+)= scale dS^T Q */
  op_gemm_layout(&g[7], op_transposed(s->bld), op_plain(ld), ld);
  g[7].alpha = s->scale;
  op_dtype qt = s->qt, ot = s->ot, gt = s->gt, pt = s->lowp ? OP_BF16 : OP_F32;
  op_gemm_dtypes(&g[0], qt, qt, OP_F32);
  op_gemm_dtypes(&g[1], ot, qt, OP_F32);
  op_gemm_dtypes(&g[2], pt, qt, ot);
  op_gemm_dtypes(&g[3], pt, qt, gt);
  op_gemm_dtypes(&g[4], qt, qt, OP_F32);
  op_gemm_dtypes(&g[5], ot, qt, OP_F32);
  op_gemm_dtypes(&g[6], pt, ot, gt);
  op_gemm_dtypes(&g[7], pt, qt, gt);
  remat_status rs = REMAT_OK;
  for (int k = 0; k < 8 && rs == REMAT_OK; k++)
    rs = op_gemm_plan(&g[k], &s->base, err);
  return rs;
}

remat_status op_attention_plan(op_instance *inst, dnnl_engine_t engine,
                               char err[OP_ERRMSG_MAX]) {
  const op_shape *qkv = &inst->desc.in[0];
  int64_t T0 = qkv->dim[1], hd0 = qkv->dim[2] / 3 / inst->desc.attrs.heads;
  int64_t nb0 = op_div_up(T0, fused_block(T0, hd0));
  fused_state *s = op_state_new(sizeof *s + (size_t)(8 * nb0) * sizeof(op_gemm),
                                engine, "attention");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->B = qkv->dim[0];
  s->T = qkv->dim[1];
  s->D = qkv->dim[2] / 3;
  s->H = inst->desc.attrs.heads;
  s->hd = s->D / s->H;
  s->scale = (float)(1.0 / sqrt((double)s->hd));
  s->blk = fused_block(s->T, s->hd);
  s->nb = op_div_up(s->T, s->blk);
  /* a power-of-two stride would map a block's rows to the same cache sets */
  s->ld = op_div_up(s->T, 16) * 16 + 16;
  s->bld = op_div_up(s->blk, 16) * 16 + 16;
  s->qt = inst->desc.in_dtype[0];
  s->ot = inst->desc.out_dtype;
  s->gt = inst->desc.din_dtype[0];
  s->lowp = s->qt == OP_BF16;
  int64_t T = s->T, hd = s->hd, b = s->blk;
  s->half = (size_t)op_max64(b * s->ld, T * s->bld);
  remat_status rs = REMAT_OK;
  for (int64_t i = 0; i < s->nb && rs == REMAT_OK; i++)
    rs = plan_row_gemms(s, i, err);
  if (rs != REMAT_OK) return rs;
  /* scratch: S and dP of one query block (row stride ld), or of one key
   * block's column of blocks (stride bld); in bf16 also their bf16 copies
   * (the same strides) */
  s->base.temp_bytes = 2 * s->half * sizeof(float) +
                       (s->lowp ? 2 * s->half * sizeof(uint16_t) : 0);
  inst->naux = 1;
  inst->aux_bytes[0] = (size_t)(s->B * s->H * T) * sizeof(float);
  inst->nws = 1;
  inst->ws_bytes[0] = inst->aux_bytes[0];
  int64_t tiles = s->B * s->H * s->nb;
  /* products of the key blocks at or below the diagonal */
  double pairs = (double)s->B * s->H * s->nb * (s->nb + 1) / 2.0;
  double prod = 2.0 * pairs * b * b * hd;
  uint32_t fwd_rows = OP_SLOT_IN(0) | OP_SLOT_OUT | OP_SLOT_AUX(0);
  uint32_t bwd_reads = fwd_rows | OP_SLOT_DOUT;
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "attention.fwd", fused_fwd, tiles, 2.0 * prod, OP_SLOT_IN(0),
      OP_SLOT_OUT | OP_SLOT_AUX(0));
  inst->bwd[inst->nbwd++] = op_make_kernel(
      "attention.dq", fused_dq, tiles, 3.0 * prod, bwd_reads,
      OP_SLOT_DIN(0) | OP_SLOT_WS(0));
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attention.dkv", fused_dkv, tiles, 4.0 * prod,
                     bwd_reads | OP_SLOT_WS(0), OP_SLOT_DIN(0));
  /* tile (b, h, i) works inside the T rows of (b, h) */
  inst->fwd[0].span = op_span_rows(s->B * s->H * T, T, fwd_rows);
  inst->fwd[0].span.row_tiles = s->nb;
  for (int k = 0; k < inst->nbwd; k++) {
    inst->bwd[k].span = op_span_rows(
        s->B * s->H * T, T,
        bwd_reads | OP_SLOT_DIN(0) | OP_SLOT_WS(0));
    inst->bwd[k].span.row_tiles = s->nb;
  }
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
