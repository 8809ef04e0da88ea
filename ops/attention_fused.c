/* Fused attention: from q, k and v (a packed qkv or separate tensors,
 * grouped-query heads: ops/attn_geom.h) straight to o [B,T,H hd], saving
 * only o and the per-row log-sum-exp [B,H,T]; no T x S matrix is ever
 * stored. Tiles are (batch, head, block of blk rows); the scores of one
 * query block against the keys it may see (up to its diagonal when
 * causal) live in the worker's scratch, masked by the causal mask and the
 * key lengths. The backward recomputes the probabilities from q, k and the
 * log-sum-exp: dq tiles over (batch, query head, query block), dk and dv
 * over (batch, kv head, key block), each against all the queries that may
 * see it, summing its group's query heads in order; each tile writes only
 * its own rows, so the sums run in a fixed order whatever the thread
 * count. A key block no query sees gets a zero gradient without a product.
 * With dropout the probabilities are multiplied by keep / (1 - p), keep
 * drawn per (batch, head, query, key) from the counter-based generator
 * (base/counter_rng.h), so the backward draws the forward's mask again.
 * Each product of a tile is one oneDNN call, with a primitive per block
 * made at plan time (the shapes grow along the diagonal).
 * In bf16 (q, k, v, o and their gradients stored in bf16) the products
 * read q, k, v and do in bf16 and write the scores and dP in f32 to
 * scratch; the softmax, P and dS are computed in f32 and rounded to bf16
 * copies in scratch for the products with v, k, q and do, as flash
 * attention does in bf16; lse and delta stay f32. */
/* op_expf's clamps and NaN test are selects that gcc vectorizes only when
 * comparisons may not trap; no result changes (nothing here reads the
 * floating-point exception flags). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <math.h>
#include <string.h>

#include "base/bf16.h"
#include "base/counter_rng.h"
#include "ops/attn_geom.h"

typedef struct fused_state {
  op_base base;
  attn_geom a;
  int64_t blk, nbq, nbk; /* rows per block; query blocks; key blocks */
  int64_t ld;  /* row stride of a query block's scores: S padded */
  int64_t bld; /* row stride of one (query, key) block's: blk padded */
  op_dtype qt, kt, vt, ot; /* of q, k, v; of o and do */
  op_dtype gq, gk, gv;     /* of dq, dk, dv */
  int ki, vi, li;          /* inputs of k, v and the key lengths (-1) */
  bool lowp;               /* P and dS go to the products as bf16 copies */
  float dropout, keep_scale; /* p and 1 / (1 - p) */
  uint32_t drop_below;     /* bits below it drop (counter_rng_threshold) */
  size_t half;             /* f32 elements of each of S and dP in scratch */
  /* per block i, one oneDNN call each: row[8 i + k]; k = 0 to 3, query
   * block i against all its keys: 0 qk, 1 dov, 2 pv, 3 dsk; k = 4 to 7,
   * key block i against all the queries that may see it: 4 qk, 5 dov
   * (into a column of blocks, stride bld), 6 ptdo, 7 dstq */
  op_gemm row[];
} fused_state;

/* Rows per block, a function of the longer of T and S and the head dim
 * only: 128, measured (one thread, loaded machine) against 64 and 256 at
 * T 256..2048 and head dims 32, 64 and 128: 64 makes too many small
 * oneDNN calls (1.6-2x slower), 256 wastes more of the diagonal block
 * (about 10% slower). */
static int64_t fused_block(int64_t T, int64_t hd) {
  (void)hd; /* the same best block at every head dim measured */
  return op_min64(128, T);
}

/* Inputs: qkv [, lens] (packed) or q, k, v [, lens] (separate). */
remat_status op_attention_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const packed[] = {"qkv", "key lengths"};
  static const char *const separate[] = {"q", "k", "v", "key lengths"};
  bool sep = d->attrs.attn_separate;
  int n = (sep ? 3 : 1) + d->attrs.attn_lens;
  op_dtype t[4] = {OP_F32, OP_F32, OP_F32, OP_F32};
  if (d->attrs.attn_lens) t[n - 1] = OP_I32;
  remat_status rs = op_check_inputs(d, n, n, sep ? separate : packed, t, err);
  attn_geom a;
  if (rs == REMAT_OK)
    rs = attn_geom_infer(d, "", &d->in[0], sep ? &d->in[1] : NULL,
                         sep ? &d->in[2] : NULL, &a, err);
  if (rs == REMAT_OK && d->attrs.attn_lens)
    rs = attn_check_lens(d, n - 1, a.B, err);
  if (rs != REMAT_OK) return rs;
  float p = d->attrs.dropout;
  if (!(p >= 0.0f && p < 1.0f))
    return op_shape_err(err, d,
                        "dropout %g is not valid: expected a probability in "
                        "[0,1)",
                        (double)p);
  op_shape out = {3, {a.B, a.T, a.H * a.hd}};
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

/* Rows of query block i (the last one may be short). */
static int64_t q_rows(const fused_state *s, int64_t i) {
  return op_min64(s->blk, s->a.T - i * s->blk);
}
/* Keys of key block j. */
static int64_t k_rows(const fused_state *s, int64_t j) {
  return op_min64(s->blk, s->a.S - j * s->blk);
}
/* Keys the products of query block i span: up to its last row's diagonal
 * when causal, else all. */
static int64_t q_keys(const fused_state *s, int64_t i) {
  int64_t end = i * s->blk + q_rows(s, i);
  return s->a.causal ? op_min64(s->a.S, end) : s->a.S;
}
/* First query that may see key block j (causal: its first key), and how
 * many queries from there; 0 when none may. */
static int64_t kv_first(const fused_state *s, int64_t j) {
  return s->a.causal ? j * s->blk : 0;
}
static int64_t kv_queries(const fused_state *s, int64_t j) {
  return op_max64(0, s->a.T - kv_first(s, j));
}

/* The buffers of one run of a kernel, by role. */
typedef struct fused_io {
  const float *q, *k, *v, *lens;
  float *dq, *dk, *dv;
  bool acc_q, acc_k, acc_v;
  bool drop;    /* dropout is on (training with p > 0) */
  uint64_t key; /* of the mask bits */
} fused_io;

static fused_io fused_bind(const op_instance *op, const op_bufs *b) {
  const fused_state *s = op->state;
  fused_io io = {b->in[0], b->in[s->ki], b->in[s->vi],
                 s->li >= 0 ? b->in[s->li] : NULL,
                 b->din[0], b->din[s->ki], b->din[s->vi],
                 b->din_accumulate[0], b->din_accumulate[s->ki],
                 b->din_accumulate[s->vi], false, 0};
  io.drop = s->dropout > 0.0f && b->training;
  if (io.drop)
    io.key = counter_rng_key(b->rng_seed, (uint64_t)op->desc.attrs.rng_stream,
                             b->rng_step);
  return io;
}

/* Keys query t sees in a block of nk keys from k0: 0..n. */
static int64_t block_keys(const attn_geom *a, int64_t t, int64_t len,
                          int64_t k0, int64_t nk) {
  return op_max64(0, op_min64(nk, attn_keys(a, t, len) - k0));
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
 * keys 0..nkeys: each row becomes its softmax over the keys it sees (zeros
 * past them), and lse[r] its log-sum-exp. With Pb (bf16, stride ld) the
 * probabilities go there rounded to bf16 instead (S then holds them
 * unnormalized). */
REMAT_SIMD_CLONES static void softmax_rows(const attn_geom *a, float *S,
                                           int64_t ld, int64_t nq, int64_t q0,
                                           int64_t nkeys, int64_t len,
                                           float *lse, uint16_t *Pb) {
  for (int64_t r = 0; r < nq; r++) {
    float *restrict row = S + r * ld;
    int64_t n = attn_keys(a, q0 + r, len);
    float mx = row_max(row, n);
    row_exp(row, n, mx, nkeys);
    float sum = row_sum(row, n), inv = 1.0f / sum;
    if (Pb) {
      uint16_t *restrict pb = Pb + r * ld;
      for (int64_t c = 0; c < n; c++) pb[c] = bf16_from_f32(row[c] * inv);
      for (int64_t c = n; c < nkeys; c++) pb[c] = 0;
    } else {
      for (int64_t c = 0; c < n; c++) row[c] *= inv;
    }
    lse[r] = mx + logf(sum);
  }
}

/* The dropout multiplier of (batch, head) bh, query t, key k: 0 or
 * 1 / (1 - p). */
static inline float keep_mult(const fused_state *s, const fused_io *io,
                              int64_t bh, int64_t t, int64_t k) {
  uint64_t at = ((uint64_t)bh * (uint64_t)s->a.T + (uint64_t)t) *
                    (uint64_t)s->a.S + (uint64_t)k;
  return counter_rng_bits(io->key, at) >= s->drop_below ? s->keep_scale
                                                        : 0.0f;
}

/* Dropout on the probabilities of rows q0..q0+nq, keys k0..k0+nk (f32 P
 * or its bf16 copy Pb, stride ld). */
static void drop_probs(const fused_state *s, const fused_io *io, int64_t bh,
                       float *P, uint16_t *Pb, int64_t ld, int64_t q0,
                       int64_t nq, int64_t k0, int64_t nk) {
  for (int64_t r = 0; r < nq; r++)
    for (int64_t c = 0; c < nk; c++) {
      float m = keep_mult(s, io, bh, q0 + r, k0 + c);
      if (Pb)
        Pb[r * ld + c] = bf16_from_f32(bf16_to_f32(Pb[r * ld + c]) * m);
      else
        P[r * ld + c] *= m;
    }
}

// forward. q is (B,T,H,hd), k and v (B,S,KVH,hd), o is (B,T,H,hd), lse is
// (B,H,T); tile (b,h,i): S [bq, keys] = scale q_i k^T (in scratch, row
// stride ld), masked where a query may not see a key; lse_q = log sum_k
// exp(S_qk); P = exp(S - lse) (times the dropout mask / (1 - p));
// o_i = P v over those keys.
static int fused_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const fused_state *s = op->state;
  const attn_geom *a = &s->a;
  fused_io io = fused_bind(op, b);
  int64_t bh = tile / s->nbq, i = tile % s->nbq;
  int64_t bi = bh / a->H, h = bh % a->H, g = h / a->group;
  int64_t nq = q_rows(s, i), q0 = i * s->blk, nk = q_keys(s, i);
  const op_gemm *gm = s->row + 8 * i;
  fused_scratch t = fused_temp(s, w, 0);
  int rs = gemm_run(&gm[0], false, op_at(io.q, attn_q_at(a, bi, h, q0), s->qt),
                    op_at(io.k, attn_k_at(a, bi, g, 0), s->kt), t.S, w);
  if (rs != REMAT_OK) return rs;
  softmax_rows(a, t.S, s->ld, nq, q0, nk, attn_len(a, io.lens, bi),
               b->aux[0] + bh * a->T + q0, s->lowp ? t.Pb : NULL);
  if (io.drop)
    drop_probs(s, &io, bh, t.S, s->lowp ? t.Pb : NULL, s->ld, q0, nq, 0, nk);
  const void *P = s->lowp ? (const void *)t.Pb : t.S;
  return gemm_run(&gm[2], false, P, op_at(io.v, attn_v_at(a, bi, g, 0), s->vt),
                  op_at(b->out, attn_o_at(a, bi, h, q0), s->ot), w);
}

/* The probabilities and score gradients of query block i, key block j from
 * its scores S and dP (row stride ld): P = exp(S - lse_q) where the query
 * sees the key, else 0, in S; dS = P (dP - delta_q) in dP; when Pb or dSb
 * are given (bf16, stride ld) also P or dS rounded to bf16 there. */
REMAT_SIMD_CLONES static void probs_and_dscores(
    const fused_state *s, float *S, float *dP, int64_t ld, int64_t i,
    int64_t j, int64_t len, const float *lse, const float *delta,
    uint16_t *Pb, uint16_t *dSb) {
  int64_t nq = q_rows(s, i), nk = k_rows(s, j);
  int64_t q0 = i * s->blk, k0 = j * s->blk;
  for (int64_t r = 0; r < nq; r++) {
    float *restrict p = S + r * ld, *restrict dp = dP + r * ld;
    int64_t n = block_keys(&s->a, q0 + r, len, k0, nk);
    row_exp(p, n, lse[r], nk);
    float dl = delta[r];
    for (int64_t c = 0; c < nk; c++) dp[c] = p[c] * (dp[c] - dl);
    if (Pb) row_to_bf16(Pb + r * ld, p, nk);
    if (dSb) row_to_bf16(dSb + r * ld, dp, nk);
  }
}

/* The same with dropout: the forward used Pd = P m (m the mask over
 * 1 - p), so dS = P (m dP - delta) and S holds Pd (for dv). */
static void probs_and_dscores_dropout(const fused_state *s,
                                      const fused_io *io, int64_t bh,
                                      float *S, float *dP, int64_t ld,
                                      int64_t i, int64_t j, int64_t len,
                                      const float *lse, const float *delta,
                                      uint16_t *Pb, uint16_t *dSb) {
  int64_t nq = q_rows(s, i), nk = k_rows(s, j);
  int64_t q0 = i * s->blk, k0 = j * s->blk;
  for (int64_t r = 0; r < nq; r++) {
    float *p = S + r * ld, *dp = dP + r * ld;
    int64_t n = block_keys(&s->a, q0 + r, len, k0, nk);
    row_exp(p, n, lse[r], nk);
    float dl = delta[r];
    for (int64_t c = 0; c < nk; c++) {
      float m = keep_mult(s, io, bh, q0 + r, k0 + c);
      dp[c] = p[c] * (dp[c] * m - dl);
      p[c] *= m;
    }
    if (Pb) row_to_bf16(Pb + r * ld, p, nk);
    if (dSb) row_to_bf16(dSb + r * ld, dp, nk);
  }
}

static void block_grads(const fused_state *s, const fused_io *io, int64_t bh,
                        float *S, float *dP, int64_t ld, int64_t i, int64_t j,
                        int64_t len, const float *lse, const float *delta,
                        uint16_t *Pb, uint16_t *dSb) {
  if (io->drop)
    probs_and_dscores_dropout(s, io, bh, S, dP, ld, i, j, len, lse, delta,
                              Pb, dSb);
  else
    probs_and_dscores(s, S, dP, ld, i, j, len, lse, delta, Pb, dSb);
}

/* delta[r] = sum_c do[r,c] o[r,c] over the nq rows of o and do at `at`. */
static void row_deltas(const fused_state *s, const op_bufs *b, int64_t at,
                       int64_t nq, float *delta) {
  int64_t ld = s->a.o_ld, hd = s->a.hd;
  if (s->ot == OP_BF16) {
    const uint16_t *dob = op_at(b->dout, at, s->ot);
    const uint16_t *ob = op_at(b->out, at, s->ot);
    for (int64_t r = 0; r < nq; r++) {
      float acc = 0.0f;
      for (int64_t c = 0; c < hd; c++)
        acc += bf16_to_f32(dob[r * ld + c]) * bf16_to_f32(ob[r * ld + c]);
      delta[r] = acc;
    }
  } else {
    const float *dof = b->dout + at, *out = b->out + at;
    for (int64_t r = 0; r < nq; r++) {
      float acc = 0.0f;
      for (int64_t c = 0; c < hd; c++)
        acc += dof[r * ld + c] * out[r * ld + c];
      delta[r] = acc;
    }
  }
}

// backward, dq. With delta_q = sum_c do_qc o_qc and, over the keys of
// query block i, P_i recomputed, dP_i = do_i v^T and dS_i = P_i (dP_i -
// delta): dq_i = scale dS_i k. Also stores delta for the dk/dv tiles
// (ws[0], (B,H,T)).
static int fused_dq(const op_instance *op, const op_bufs *b, int64_t tile,
                    op_worker *w) {
  const fused_state *s = op->state;
  const attn_geom *a = &s->a;
  fused_io io = fused_bind(op, b);
  if (!io.dq && !io.dk && !io.dv) return REMAT_OK;
  int64_t bh = tile / s->nbq, i = tile % s->nbq;
  int64_t bi = bh / a->H, h = bh % a->H, g = h / a->group;
  int64_t nq = q_rows(s, i), q0 = i * s->blk, T = a->T;
  const op_gemm *gm = s->row + 8 * i;
  int64_t o_at = attn_o_at(a, bi, h, q0);
  float *delta = b->ws[0] + bh * T + q0;
  row_deltas(s, b, o_at, nq, delta);
  if (!io.dq) return REMAT_OK;
  const void *dout = op_at(b->dout, o_at, s->ot);
  const float *lse = b->aux[0] + bh * T + q0;
  fused_scratch t = fused_temp(s, w, s->blk * s->ld);
  float *S = t.S, *dP = t.dP;
  const void *k = op_at(io.k, attn_k_at(a, bi, g, 0), s->kt);
  int rs = gemm_run(&gm[0], false, op_at(io.q, attn_q_at(a, bi, h, q0), s->qt),
                    k, S, w);
  if (rs == REMAT_OK)
    rs = gemm_run(&gm[1], false, dout,
                  op_at(io.v, attn_v_at(a, bi, g, 0), s->vt), dP, w);
  if (rs != REMAT_OK) return rs;
  int64_t len = attn_len(a, io.lens, bi);
  for (int64_t j = 0; j * s->blk < q_keys(s, i); j++)
    block_grads(s, &io, bh, S + j * s->blk, dP + j * s->blk, s->ld, i, j, len,
                lse, delta, NULL, s->lowp ? t.dSb + j * s->blk : NULL);
  const void *dS = s->lowp ? (const void *)t.dSb : dP;
  return gemm_run(&gm[3], io.acc_q, dS, k,
                  op_at(io.dq, attn_q_at(a, bi, h, q0), s->gq), w);
}

/* Zeros rows x cols of a buffer of dtype t at row stride ld. */
static void zero_rows(void *p, op_dtype t, int64_t rows, int64_t cols,
                      int64_t ld) {
  size_t es = (size_t)op_dtype_size(t);
  for (int64_t r = 0; r < rows; r++)
    memset((char *)p + (size_t)(r * ld) * es, 0, (size_t)cols * es);
}

// backward, dk and dv of key block j of kv head g: for each query head h
// of g's group in order, with P and dS of the queries that may see block j
// against it as above (a column of blocks, stride bld), dv_j (+)= P^T do
// and dk_j (+)= scale dS^T q over those queries.
static int fused_dkv_head(const fused_state *s, const fused_io *io,
                          const op_bufs *b, int64_t bi, int64_t h, int64_t j,
                          bool acc, op_worker *w) {
  const attn_geom *a = &s->a;
  int64_t g = h / a->group, bh = bi * a->H + h, T = a->T;
  int64_t k0 = j * s->blk, qs = kv_first(s, j);
  const op_gemm *gm = s->row + 8 * j;
  const void *dout = op_at(b->dout, attn_o_at(a, bi, h, qs), s->ot);
  const void *q = op_at(io->q, attn_q_at(a, bi, h, qs), s->qt);
  fused_scratch t = fused_temp(s, w, T * s->bld);
  float *S = t.S, *dP = t.dP;
  int rs = gemm_run(&gm[4], false, q,
                    op_at(io->k, attn_k_at(a, bi, g, k0), s->kt), S, w);
  if (rs == REMAT_OK)
    rs = gemm_run(&gm[5], false, dout,
                  op_at(io->v, attn_v_at(a, bi, g, k0), s->vt), dP, w);
  if (rs != REMAT_OK) return rs;
  int64_t len = attn_len(a, io->lens, bi);
  for (int64_t i = qs / s->blk; i < s->nbq; i++) {
    int64_t at = (i * s->blk - qs) * s->bld, r = bh * T + i * s->blk;
    block_grads(s, io, bh, S + at, dP + at, s->bld, i, j, len, b->aux[0] + r,
                b->ws[0] + r, s->lowp ? t.Pb + at : NULL,
                s->lowp ? t.dSb + at : NULL);
  }
  const void *P = s->lowp ? (const void *)t.Pb : S;
  const void *dS = s->lowp ? (const void *)t.dSb : dP;
  if (io->dv)
    rs = gemm_run(&gm[6], acc || io->acc_v, P, dout,
                  op_at(io->dv, attn_v_at(a, bi, g, k0), s->gv), w);
  if (rs == REMAT_OK && io->dk)
    rs = gemm_run(&gm[7], acc || io->acc_k, dS, q,
                  op_at(io->dk, attn_k_at(a, bi, g, k0), s->gk), w);
  return rs;
}

static int fused_dkv(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const fused_state *s = op->state;
  const attn_geom *a = &s->a;
  fused_io io = fused_bind(op, b);
  if (!io.dk && !io.dv) return REMAT_OK;
  int64_t bg = tile / s->nbk, j = tile % s->nbk;
  int64_t bi = bg / a->KVH, g = bg % a->KVH, k0 = j * s->blk;
  if (kv_queries(s, j) == 0 || k0 >= attn_len(a, io.lens, bi)) {
    /* no query sees these keys: a zero gradient */
    if (io.dv && !io.acc_v)
      zero_rows(op_at(io.dv, attn_v_at(a, bi, g, k0), s->gv), s->gv,
                k_rows(s, j), a->hd, a->v_ld);
    if (io.dk && !io.acc_k)
      zero_rows(op_at(io.dk, attn_k_at(a, bi, g, k0), s->gk), s->gk,
                k_rows(s, j), a->hd, a->k_ld);
    return REMAT_OK;
  }
  int rs = REMAT_OK;
  for (int64_t r = 0; r < a->group && rs == REMAT_OK; r++)
    rs = fused_dkv_head(s, &io, b, bi, g * a->group + r, j, r > 0, w);
  return rs;
}

/* The products of query block i over its nq rows and all its n keys. */
static remat_status plan_query_gemms(fused_state *s, int64_t i,
                                     char err[OP_ERRMSG_MAX]) {
  const attn_geom *a = &s->a;
  int64_t nq = q_rows(s, i), n = q_keys(s, i), hd = a->hd;
  op_gemm *g = s->row + 8 * i;
  op_gemm_init(&g[0], nq, n, hd, nq, n); /* S = scale Q K^T */
  op_gemm_layout(&g[0], op_plain(a->q_ld), op_transposed(a->k_ld), s->ld);
  g[0].alpha = a->scale;
  g[0].accumulate_too = false;
  op_gemm_init(&g[1], nq, n, hd, nq, n); /* dP = dO V^T */
  op_gemm_layout(&g[1], op_plain(a->o_ld), op_transposed(a->v_ld), s->ld);
  g[1].accumulate_too = false;
  op_gemm_init(&g[2], nq, hd, n, nq, hd); /* O = P V */
  op_gemm_layout(&g[2], op_plain(s->ld), op_plain(a->v_ld), a->o_ld);
  g[2].accumulate_too = false;
  op_gemm_init(&g[3], nq, hd, n, nq, hd); /* dQ (+)= scale dS K */
  op_gemm_layout(&g[3], op_plain(s->ld), op_plain(a->k_ld), a->q_ld);
  g[3].alpha = a->scale;
  op_dtype pt = s->lowp ? OP_BF16 : OP_F32;
  op_gemm_dtypes(&g[0], s->qt, s->kt, OP_F32);
  op_gemm_dtypes(&g[1], s->ot, s->vt, OP_F32);
  op_gemm_dtypes(&g[2], pt, s->vt, s->ot);
  op_gemm_dtypes(&g[3], pt, s->kt, s->gq);
  remat_status rs = REMAT_OK;
  for (int k = 0; k < 4 && rs == REMAT_OK; k++)
    rs = op_gemm_plan(&g[k], &s->base, err);
  return rs;
}

/* The products of key block j over its nk keys and the nr queries that
 * may see it (none planned when nr is 0). */
static remat_status plan_key_gemms(fused_state *s, int64_t j,
                                   char err[OP_ERRMSG_MAX]) {
  const attn_geom *a = &s->a;
  int64_t nk = k_rows(s, j), nr = kv_queries(s, j), hd = a->hd;
  if (nr == 0) return REMAT_OK;
  op_gemm *g = s->row + 8 * j;
  op_gemm_init(&g[4], nr, nk, hd, nr, nk); /* S = scale Q K_j^T */
  op_gemm_layout(&g[4], op_plain(a->q_ld), op_transposed(a->k_ld), s->bld);
  g[4].alpha = a->scale;
  g[4].accumulate_too = false;
  op_gemm_init(&g[5], nr, nk, hd, nr, nk); /* dP = dO V_j^T */
  op_gemm_layout(&g[5], op_plain(a->o_ld), op_transposed(a->v_ld), s->bld);
  g[5].accumulate_too = false;
  op_gemm_init(&g[6], nk, hd, nr, nk, hd); /* dV_j (+)= P^T dO */
  op_gemm_layout(&g[6], op_transposed(s->bld), op_plain(a->o_ld), a->v_ld);
  op_gemm_init(&g[7], nk, hd, nr, nk, hd); /* dK_j (+)= scale dS^T Q */
  op_gemm_layout(&g[7], op_transposed(s->bld), op_plain(a->q_ld), a->k_ld);
  g[7].alpha = a->scale;
  op_dtype pt = s->lowp ? OP_BF16 : OP_F32;
  op_gemm_dtypes(&g[4], s->qt, s->kt, OP_F32);
  op_gemm_dtypes(&g[5], s->ot, s->vt, OP_F32);
  op_gemm_dtypes(&g[6], pt, s->ot, s->gv);
  op_gemm_dtypes(&g[7], pt, s->qt, s->gk);
  remat_status rs = REMAT_OK;
  for (int k = 4; k < 8 && rs == REMAT_OK; k++)
    rs = op_gemm_plan(&g[k], &s->base, err);
  return rs;
}

/* The state: geometry, blocks, dtypes, dropout. */
static fused_state *fused_state_new(op_instance *inst, dnnl_engine_t engine,
                                    const attn_geom *a) {
  const op_desc *d = &inst->desc;
  int64_t blk = fused_block(op_max64(a->T, a->S), a->hd);
  int64_t nbq = op_div_up(a->T, blk), nbk = op_div_up(a->S, blk);
  fused_state *s = op_state_new(
      sizeof *s + (size_t)(8 * op_max64(nbq, nbk)) * sizeof(op_gemm), engine,
      "attention");
  if (!s) return NULL;
  inst->state = s;
  s->a = *a;
  s->blk = blk;
  s->nbq = nbq;
  s->nbk = nbk;
  /* a power-of-two stride would map a block's rows to the same cache sets */
  s->ld = op_div_up(a->S, 16) * 16 + 16;
  s->bld = op_div_up(blk, 16) * 16 + 16;
  bool sep = d->attrs.attn_separate;
  s->ki = sep ? 1 : 0;
  s->vi = sep ? 2 : 0;
  s->li = d->attrs.attn_lens ? d->nin - 1 : -1;
  s->qt = d->in_dtype[0];
  s->kt = d->in_dtype[s->ki];
  s->vt = d->in_dtype[s->vi];
  s->ot = d->out_dtype;
  s->gq = d->din_dtype[0];
  s->gk = d->din_dtype[s->ki];
  s->gv = d->din_dtype[s->vi];
  s->lowp = s->qt == OP_BF16;
  s->dropout = d->attrs.dropout;
  s->keep_scale = 1.0f / (1.0f - s->dropout);
  s->drop_below = counter_rng_threshold(s->dropout);
  s->half = (size_t)op_max64(blk * s->ld, a->T * s->bld);
  return s;
}

/* The kernels, their flops and spans. */
static void fused_kernels(op_instance *inst, const fused_state *s) {
  const attn_geom *a = &s->a;
  int64_t T = a->T, BH = a->B * a->H;
  /* query-key pairs a query may see (without key lengths) */
  double pairs = 0.0;
  for (int64_t t = 0; t < T; t++) pairs += (double)attn_keys(a, t, a->S);
  double prod = 2.0 * (double)BH * pairs * (double)a->hd;
  uint32_t ins = 0;
  for (int i = 0; i < inst->desc.nin; i++) ins |= OP_SLOT_IN(i);
  uint32_t fwd_rows = ins | OP_SLOT_OUT | OP_SLOT_AUX(0);
  uint32_t bwd_reads = fwd_rows | OP_SLOT_DOUT;
  uint32_t dkv = OP_SLOT_DIN(s->ki) | OP_SLOT_DIN(s->vi);
  inst->fwd[inst->nfwd++] =
      op_make_kernel("attention.fwd", fused_fwd, BH * s->nbq, 2.0 * prod, ins,
                     OP_SLOT_OUT | OP_SLOT_AUX(0));
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attention.dq", fused_dq, BH * s->nbq, 3.0 * prod,
                     bwd_reads, OP_SLOT_DIN(0) | OP_SLOT_WS(0));
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attention.dkv", fused_dkv, a->B * a->KVH * s->nbk,
                     4.0 * prod, bwd_reads | OP_SLOT_WS(0), dkv);
  /* tile (b, h, i) works inside the T rows of (b, h); tile (b, g, j)
   * inside those of g's group */
  inst->fwd[0].span = op_span_rows(BH * T, T, fwd_rows);
  inst->fwd[0].span.row_tiles = s->nbq;
  uint32_t all = bwd_reads | OP_SLOT_DIN(0) | dkv | OP_SLOT_WS(0);
  inst->bwd[0].span = op_span_rows(BH * T, T, all);
  inst->bwd[0].span.row_tiles = s->nbq;
  inst->bwd[1].span = op_span_rows(BH * T, a->group * T, all);
  inst->bwd[1].span.row_tiles = s->nbk;
}

remat_status op_attention_plan(op_instance *inst, dnnl_engine_t engine,
                               char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  bool sep = d->attrs.attn_separate;
  attn_geom a;
  remat_status rs = attn_geom_infer(d, "", &d->in[0], sep ? &d->in[1] : NULL,
                                    sep ? &d->in[2] : NULL, &a, err);
  if (rs != REMAT_OK) return rs;
  fused_state *s = fused_state_new(inst, engine, &a);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  for (int64_t i = 0; i < s->nbq && rs == REMAT_OK; i++)
    rs = plan_query_gemms(s, i, err);
  for (int64_t j = 0; j < s->nbk && rs == REMAT_OK; j++)
    rs = plan_key_gemms(s, j, err);
  if (rs != REMAT_OK) return rs;
  /* scratch: S and dP of one query block (row stride ld), or of one key
   * block's column of blocks (stride bld); in bf16 also their bf16 copies
   * (the same strides) */
  s->base.temp_bytes = 2 * s->half * sizeof(float) +
                       (s->lowp ? 2 * s->half * sizeof(uint16_t) : 0);
  inst->naux = 1;
  inst->aux_bytes[0] = (size_t)(a.B * a.H * a.T) * sizeof(float);
  inst->nws = 1;
  inst->ws_bytes[0] = inst->aux_bytes[0];
  fused_kernels(inst, s);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
