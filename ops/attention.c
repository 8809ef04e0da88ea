/* The two products of materialized attention on oneDNN matmul with strided
 * views into q, k and v (ops/attn_geom.h: a packed qkv or separate
 * tensors, grouped-query heads): scores s = scale q.k^T, masked -inf where
 * a query may not see a key (causal mask, key lengths), and values
 * o = p . v. Tiles are (batch, query head), except the key and value
 * gradients, tiled by (batch, kv head): each sums its group's query heads
 * in order, so no two tiles write the same rows. Every buffer is read and
 * written in its desc dtype (bf16 operands accumulate in f32 inside
 * oneDNN); the mask and the masked copy of the score gradient are written
 * in the scores' dtype.
 *
 * Causal self-attention (T == S, T >= 2 ATTN_BLOCK_MIN) runs each product
 * of a tile in blocks of rows, each against only the part of the other
 * operand its rows can see: query block i (rows r0..r1) against keys
 * 0..r1, key block j (keys c0..c1) against queries c0..T. What is skipped
 * is masked: scores there are -inf, probabilities and score gradients 0,
 * so every value is the same sum less terms that are exactly zero. The
 * blocks are a function of T only, so results stay the same at every
 * thread count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "ops/attn_geom.h"
#include "ops/bf16_dot.h"

/* Rows of a block are at least this many; at most ATTN_MAX_BLOCKS blocks. */
#define ATTN_BLOCK_MIN 64
#define ATTN_MAX_BLOCKS 8

/* One product of a tile in blocks: g[i] is block i's gemm (one tile of its
 * block's shape); blk rows per block, n blocks (1: the whole product). */
typedef struct attn_blocks {
  op_gemm g[ATTN_MAX_BLOCKS];
  int64_t blk;
  int n;
} attn_blocks;

typedef struct attn_state {
  op_base base;
  attn_geom a;
  /* scores: fwd, dq, dk; values: fwd, dp, dv */
  attn_blocks fwd, dx, dy;
  /* bf16 products on ops/bf16_dot.h instead of oneDNN (attn_dot_use);
   * their packs lie at byte dot_off of the op's temporary, the packed
   * A^T chunk of dk and dv at word dot_a of it */
  bool dot;
  size_t dot_off;
  int64_t dot_a;
} attn_state;

static attn_state *attn_state_new(op_instance *inst, dnnl_engine_t engine,
                                  const attn_geom *a) {
  attn_state *s = op_state_new(sizeof *s, engine, op_name(inst->desc.type));
  if (!s) return NULL;
  inst->state = s;
  s->a = *a;
  return s;
}

/* Rows per block of a geometry (T: one block, nothing skipped). */
static int64_t attn_block_rows(const attn_geom *a) {
  if (!a->causal || a->T != a->S || a->T < 2 * ATTN_BLOCK_MIN) return a->T;
  int64_t n = op_min64(ATTN_MAX_BLOCKS, a->T / ATTN_BLOCK_MIN);
  return op_div_up(op_div_up(a->T, n), 16) * 16;
}

/* Block i of a product: rows r0..r1 of its output, queries for a query
 * block (scores, dq, values, dp), keys for a key block (dk, dv), and what
 * those rows reach: keys 0..kend of a query block, queries q0..T of a key
 * block. One block (blk >= T) is the whole product. */
typedef struct attn_block {
  int64_t r0, r1, kend, q0;
} attn_block;

static attn_block attn_block_at(const attn_geom *a, int64_t blk, int i,
                                bool keys) {
  if (blk >= a->T)
    return (attn_block){0, keys ? a->S : a->T, a->S, 0};
  /* blocked: causal with T == S, so query r sees keys 0..r */
  attn_block b = {.r0 = i * blk, .r1 = op_min64(a->T, (i + 1) * blk)};
  b.kend = b.r1;
  b.q0 = b.r0;
  return b;
}

/* Sets up the blocks of a product: init(g, block) sizes, lays out and
 * types gemm g for block b; then plans each. */
typedef void (*attn_block_init)(op_gemm *g, const attn_geom *a,
                                const op_desc *d, attn_block b);

static remat_status attn_blocks_plan(attn_blocks *p, attn_state *s,
                                     const op_desc *d, attn_block_init init,
                                     bool keys, char err[OP_ERRMSG_MAX]) {
  p->blk = attn_block_rows(&s->a);
  p->n = (int)op_div_up(s->a.T, p->blk);
  for (int i = 0; i < p->n; i++) {
    init(&p->g[i], &s->a, d, attn_block_at(&s->a, p->blk, i, keys));
    /* on ops/bf16_dot.h no oneDNN primitive is needed */
    remat_status rs = s->dot ? REMAT_OK : op_gemm_plan(&p->g[i], &s->base, err);
    if (rs != REMAT_OK) return rs;
  }
  return REMAT_OK;
}

/* The FLOPs of a product's blocks over `heads` (batch, query head) pairs. */
static double attn_blocks_flops(const attn_blocks *p, int64_t heads) {
  double f = 0;
  for (int i = 0; i < p->n; i++)
    f += 2.0 * (double)p->g[i].m * (double)p->g[i].n * (double)p->g[i].k;
  return f * (double)heads;
}

/* Keys per packed A^T chunk of dk and dv (a multiple of the kernel's 6
 * rows): the pack stays small whatever S. */
#define ATTN_DOT_KEYS 96

/* Whether the op's products run on ops/bf16_dot.h: every operand in
 * bf16 (gradients may be f32), an even head dim, T and S (the plain A
 * operands pair their k elements, and every leading dimension is then
 * even), on a CPU with AVX512-BF16. oneDNN 2.6 runs these strided blocks
 * on gemm:jit, which packs both operands on every call; here a head's
 * shared operand is packed once: the six products took 0.82x oneDNN's
 * time alone at one thread, 0.78x in the step at two
 * (docs/performance.md). REMAT_BENCH_ATTN_DOT=onednn (read at planning;
 * not public) keeps oneDNN for the benchmarks' A/B. */
static bool attn_dot_use(const attn_geom *a, const op_desc *d) {
  const char *v = getenv("REMAT_BENCH_ATTN_DOT");
  bool bf16 = d->out_dtype == OP_BF16;
  for (int i = 0; i < d->nin; i++)
    if (d->in_dtype[i] != OP_BF16 && d->in_dtype[i] != OP_I32) bf16 = false;
  return bf16 && a->hd % 2 == 0 && a->T % 2 == 0 && a->S % 2 == 0 &&
         (v == NULL || strcmp(v, "onednn") != 0) && op_bdot_available();
}

/* The op's temporary: `temp` bytes of its own, then (s->dot) the packs: a
 * shared operand of `b_words`, then a packed A^T chunk. */
static void attn_dot_scratch(attn_state *s, size_t temp, int64_t b_words) {
  s->base.temp_bytes = temp;
  if (!s->dot) return;
  s->dot_off = (temp + 63) / 64 * 64;
  s->dot_a = (b_words + 15) / 16 * 16;
  int64_t a_words =
      op_bdot_pack_words(s->a.T, ATTN_DOT_KEYS, ATTN_DOT_KEYS);
  s->base.temp_bytes = s->dot_off + (size_t)(s->dot_a + a_words) * 4;
}

/* The packs' words in the worker's temporary. */
static uint32_t *dot_packs(const attn_state *s, op_worker *w) {
  return (uint32_t *)((char *)op_temp(&s->base, w) + s->dot_off);
}

/* Block gemm g on the bf16 kernels: C = alpha A . B (+ C), with A plain
 * (ld) or the packed A^T block, B a pack of kp pairs per panel from pair
 * p0. */
static void dot_run(const op_gemm *g, op_bdot_a a, const uint32_t *b,
                    int64_t kp, int64_t p0, void *c, int64_t ldc, bool acc) {
  op_bdot_run(g->m, g->n, g->k, g->alpha, a, b, kp, p0, c, ldc, g->c_dt, acc);
}

/* Block gemm g of dk or dv on the bf16 kernels: A(m, k) = x[k * ld + m]
 * (dS^T or P^T), packed ATTN_DOT_KEYS keys (rows of C) at a time, each
 * chunk in one panel of its keys; B and C as dot_run's. */
static void dot_run_at(const attn_state *s, uint32_t *packs, const op_gemm *g,
                       const void *x, int64_t ld, const uint32_t *b,
                       int64_t kp, int64_t p0, void *c, int64_t ldc,
                       bool acc) {
  uint32_t *pa = packs + s->dot_a;
  size_t es = (size_t)op_dtype_size(g->c_dt);
  for (int64_t m0 = 0; m0 < g->m; m0 += ATTN_DOT_KEYS) {
    int64_t mc = op_min64(ATTN_DOT_KEYS, g->m - m0);
    op_bdot_pack(pa, (const uint16_t *)x + m0, g->k, mc, ld, false, mc);
    op_bdot_run(mc, g->n, g->k, g->alpha, (op_bdot_a){pa, mc, true}, b, kp,
                p0, (char *)c + (size_t)(m0 * ldc) * es, ldc, g->c_dt, acc);
  }
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
// -inf elsewhere; query block i of rows r0..r1 against keys 0..kend
static int scores_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  int64_t bi = tile / a->H, h = tile % a->H;
  const float *kin = op->desc.attrs.attn_separate ? b->in[1] : b->in[0];
  op_dtype st = s->fwd.g[0].c_dt;
  void *sc = op_at(b->out, tile * a->T * a->S, st);
  const void *kh =
      op_at(kin, attn_k_at(a, bi, h / a->group, 0), s->fwd.g[0].b_dt);
  uint32_t *pk = s->dot ? dot_packs(s, w) : NULL;
  if (pk) op_bdot_pack(pk, kh, a->hd, a->S, a->k_ld, true, OP_BDOT_PANEL);
  int rs = REMAT_OK;
  for (int i = 0; i < s->fwd.n && rs == REMAT_OK; i++) {
    const op_gemm *g = &s->fwd.g[i];
    attn_block k = attn_block_at(a, s->fwd.blk, i, false);
    const void *q = op_at(b->in[0], attn_q_at(a, bi, h, k.r0), g->a_dt);
    void *c = op_at(sc, k.r0 * a->S, st);
    if (pk)
      dot_run(g, (op_bdot_a){q, a->q_ld, false}, pk, a->hd / 2, 0, c, a->S,
              false);
    else
      rs = op_gemm_run(g, 0, q, kh, NULL, c, false, w);
  }
  /* -inf over every key a row may not see, computed or not */
  mask_scores(a, sc, st, attn_len(a, key_lens(op, b), bi));
  return rs;
}

/* ds (T,S) = dout of tile (b, h) where query i sees key j, else 0, into
 * the worker's temporary. */
static const void *masked_dscores(const op_instance *op, const op_bufs *b,
                                  int64_t bi, int64_t h, op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  int64_t T = a->T, S = a->S, len = attn_len(a, key_lens(op, b), bi);
  op_dtype dt = s->dx.g[0].a_dt;
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
// dout: dq = scale ds . k; query block r0..r1 against keys 0..kend
static int scores_dq(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  if (!b->din[0]) return REMAT_OK;
  int64_t bi = tile / a->H, h = tile % a->H;
  const float *kin = op->desc.attrs.attn_separate ? b->in[1] : b->in[0];
  const void *ds = masked_dscores(op, b, bi, h, w);
  const void *kh =
      op_at(kin, attn_k_at(a, bi, h / a->group, 0), s->dx.g[0].b_dt);
  uint32_t *pk = s->dot ? dot_packs(s, w) : NULL;
  if (pk) op_bdot_pack(pk, kh, a->S, a->hd, a->k_ld, false, OP_BDOT_PANEL);
  int rs = REMAT_OK;
  for (int i = 0; i < s->dx.n && rs == REMAT_OK; i++) {
    const op_gemm *g = &s->dx.g[i];
    attn_block k = attn_block_at(a, s->dx.blk, i, false);
    const void *dsk = op_at(ds, k.r0 * a->S, g->a_dt);
    void *dq = op_at(b->din[0], attn_q_at(a, bi, h, k.r0), g->c_dt);
    if (pk)
      dot_run(g, (op_bdot_a){dsk, a->S, false}, pk, a->S / 2, 0, dq, a->q_ld,
              b->din_accumulate[0]);
    else
      rs = op_gemm_run(g, 0, dsk, kh, NULL, dq, b->din_accumulate[0], w);
  }
  return rs;
}

// and dk of kv head g = scale sum over its group's query heads h, in
// order, of ds_h^T . q_h; key block r0..r1 against queries q0..T
static int scores_dk(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  int ki = op->desc.attrs.attn_separate ? 1 : 0;
  if (!b->din[ki]) return REMAT_OK;
  int64_t bi = tile / a->KVH, kvh = tile % a->KVH;
  int rs = REMAT_OK;
  uint32_t *pq = s->dot ? dot_packs(s, w) : NULL;
  for (int64_t r = 0; r < a->group && rs == REMAT_OK; r++) {
    int64_t h = kvh * a->group + r;
    const void *ds = masked_dscores(op, b, bi, h, w);
    if (pq)
      op_bdot_pack(pq, op_at(b->in[0], attn_q_at(a, bi, h, 0), OP_BF16),
                   a->T, a->hd, a->q_ld, false, OP_BDOT_PANEL);
    for (int i = 0; i < s->dy.n && rs == REMAT_OK; i++) {
      const op_gemm *g = &s->dy.g[i];
      attn_block k = attn_block_at(a, s->dy.blk, i, true);
      const void *dst = op_at(ds, k.q0 * a->S + k.r0, g->a_dt);
      void *dk = op_at(b->din[ki], attn_k_at(a, bi, kvh, k.r0), g->c_dt);
      bool acc = r > 0 || b->din_accumulate[ki];
      if (pq)
        dot_run_at(s, pq, g, dst, a->S, pq, (a->T + 1) / 2, k.q0 / 2, dk,
                   a->k_ld, acc);
      else
        rs = op_gemm_run(g, 0, dst,
                         op_at(b->in[0], attn_q_at(a, bi, h, k.q0), g->b_dt),
                         NULL, dk, acc, w);
    }
  }
  return rs;
}

/* Block gemms of the scores: S = scale Q K^T, dQ = scale dS K,
 * dK = scale dS^T Q. */
static void scores_fwd_init(op_gemm *g, const attn_geom *a, const op_desc *d,
                            attn_block k) {
  int64_t m = k.r1 - k.r0;
  op_gemm_init(g, m, k.kend, a->hd, m, k.kend);
  op_gemm_layout(g, op_plain(a->q_ld), op_transposed(a->k_ld), a->S);
  op_gemm_dtypes(g, d->in_dtype[0], d->in_dtype[d->attrs.attn_separate],
                 d->out_dtype);
  g->alpha = a->scale;
  g->accumulate_too = false;
}

static void scores_dq_init(op_gemm *g, const attn_geom *a, const op_desc *d,
                           attn_block k) {
  int64_t m = k.r1 - k.r0;
  op_gemm_init(g, m, a->hd, k.kend, m, a->hd);
  op_gemm_layout(g, op_plain(a->S), op_plain(a->k_ld), a->q_ld);
  op_gemm_dtypes(g, d->out_dtype, d->in_dtype[d->attrs.attn_separate],
                 d->din_dtype[0]);
  g->alpha = a->scale;
}

static void scores_dk_init(op_gemm *g, const attn_geom *a, const op_desc *d,
                           attn_block k) {
  int64_t m = k.r1 - k.r0;
  int ki = d->attrs.attn_separate;
  op_gemm_init(g, m, a->hd, a->T - k.q0, m, a->hd);
  op_gemm_layout(g, op_transposed(a->S), op_plain(a->q_ld), a->k_ld);
  op_gemm_dtypes(g, d->out_dtype, d->in_dtype[0], d->din_dtype[ki]);
  g->alpha = a->scale; /* dK = scale dS^T Q */
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
  int64_t T = a.T, S = a.S;
  s->dot = attn_dot_use(&a, d);
  rs = attn_blocks_plan(&s->fwd, s, d, scores_fwd_init, false, err);
  if (rs == REMAT_OK)
    rs = attn_blocks_plan(&s->dx, s, d, scores_dq_init, false, err);
  if (rs == REMAT_OK)
    rs = attn_blocks_plan(&s->dy, s, d, scores_dk_init, true, err);
  if (rs != REMAT_OK) return rs;
  int64_t words = op_max64(op_bdot_pack_words(a.hd, S, OP_BDOT_PANEL),
                           op_bdot_pack_words(S, a.hd, OP_BDOT_PANEL));
  words = op_max64(words, op_bdot_pack_words(T, a.hd, OP_BDOT_PANEL));
  attn_dot_scratch(s, (size_t)(T * S * op_dtype_size(d->out_dtype)), words);
  int ki = sep ? 1 : 0;
  int64_t tiles = a.B * a.H;
  uint32_t qk = OP_SLOT_IN(0) | (sep ? OP_SLOT_IN(1) : 0u);
  uint32_t lens = d->attrs.attn_lens ? OP_SLOT_IN(d->nin - 1) : 0u;
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "attn_scores.fwd", scores_fwd, tiles, attn_blocks_flops(&s->fwd, tiles),
      qk | lens, OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attn_scores.dq", scores_dq, tiles,
                     attn_blocks_flops(&s->dx, tiles),
                     qk | lens | OP_SLOT_DOUT, OP_SLOT_DIN(0));
  inst->bwd[inst->nbwd++] =
      op_make_kernel("attn_scores.dk", scores_dk, a.B * a.KVH,
                     attn_blocks_flops(&s->dy, tiles),
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
// o[b,:,h] = p[b,h] . v[b,:,h/group]; with causal probabilities, query
// block r0..r1 against keys 0..kend (p is 0 past them)
static int values_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  int64_t bi = tile / a->H, h = tile % a->H;
  const void *vh =
      op_at(b->in[1], attn_v_at(a, bi, h / a->group, 0), s->fwd.g[0].b_dt);
  uint32_t *pv = s->dot ? dot_packs(s, w) : NULL;
  if (pv) op_bdot_pack(pv, vh, a->S, a->hd, a->v_ld, false, OP_BDOT_PANEL);
  int rs = REMAT_OK;
  for (int i = 0; i < s->fwd.n && rs == REMAT_OK; i++) {
    const op_gemm *g = &s->fwd.g[i];
    attn_block k = attn_block_at(a, s->fwd.blk, i, false);
    const void *p = op_at(b->in[0], (tile * a->T + k.r0) * a->S, g->a_dt);
    void *o = op_at(b->out, attn_o_at(a, bi, h, k.r0), g->c_dt);
    if (pv)
      dot_run(g, (op_bdot_a){p, a->S, false}, pv, a->S / 2, 0, o, a->o_ld,
              false);
    else
      rs = op_gemm_run(g, 0, p, vh, NULL, o, false, w);
  }
  return rs;
}

// in the forward pass o = p . v, so dp (T,S) = do (T,hd) . v^T (hd,S);
// with causal probabilities only keys 0..kend of query block r0..r1, and
// dp = 0 where the query cannot see the key (the softmax's backward
// multiplies it by p = 0 there)
static int values_dp(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  if (!b->din[0]) return REMAT_OK;
  int64_t bi = tile / a->H, h = tile % a->H;
  op_dtype pt = s->dx.g[0].c_dt;
  size_t es = (size_t)op_dtype_size(pt);
  char *dp = op_at(b->din[0], tile * a->T * a->S, pt);
  const void *vh =
      op_at(b->in[1], attn_v_at(a, bi, h / a->group, 0), s->dx.g[0].b_dt);
  uint32_t *pv = s->dot ? dot_packs(s, w) : NULL;
  if (pv) op_bdot_pack(pv, vh, a->hd, a->S, a->v_ld, true, OP_BDOT_PANEL);
  int rs = REMAT_OK;
  for (int i = 0; i < s->dx.n && rs == REMAT_OK; i++) {
    const op_gemm *g = &s->dx.g[i];
    attn_block k = attn_block_at(a, s->dx.blk, i, false);
    const void *dob = op_at(b->dout, attn_o_at(a, bi, h, k.r0), g->a_dt);
    char *c = dp + (size_t)(k.r0 * a->S) * es;
    if (pv)
      dot_run(g, (op_bdot_a){dob, a->o_ld, false}, pv, a->hd / 2, 0, c, a->S,
              b->din_accumulate[0]);
    else
      rs = op_gemm_run(g, 0, dob, vh, NULL, c, b->din_accumulate[0], w);
    /* blocked: 0 wherever the query cannot see the key (r < j) */
    for (int64_t r = k.r0; s->dx.n > 1 && r < k.r1 && !b->din_accumulate[0];
         r++)
      memset(dp + (size_t)(r * a->S + r + 1) * es, 0,
             (size_t)(a->S - r - 1) * es);
  }
  return rs;
}

// and dv of kv head g (S,hd) = the sum over its group's query heads h, in
// order, of p_h^T (S,T) . do_h (T,hd), into the v columns; with causal
// probabilities key block r0..r1 against queries q0..T
static int values_dv(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const attn_state *s = op->state;
  const attn_geom *a = &s->a;
  if (!b->din[1]) return REMAT_OK;
  int64_t bi = tile / a->KVH, kv = tile % a->KVH;
  uint32_t *pd = s->dot ? dot_packs(s, w) : NULL;
  int rs = REMAT_OK;
  for (int64_t r = 0; r < a->group && rs == REMAT_OK; r++) {
    int64_t h = kv * a->group + r;
    if (pd)
      op_bdot_pack(pd, op_at(b->dout, attn_o_at(a, bi, h, 0), OP_BF16), a->T,
                   a->hd, a->o_ld, false, OP_BDOT_PANEL);
    for (int i = 0; i < s->dy.n && rs == REMAT_OK; i++) {
      const op_gemm *g = &s->dy.g[i];
      attn_block k = attn_block_at(a, s->dy.blk, i, true);
      const void *pt =
          op_at(b->in[0], ((bi * a->H + h) * a->T + k.q0) * a->S + k.r0,
                g->a_dt);
      void *dv = op_at(b->din[1], attn_v_at(a, bi, kv, k.r0), g->c_dt);
      bool acc = r > 0 || b->din_accumulate[1];
      if (pd)
        dot_run_at(s, pd, g, pt, a->S, pd, (a->T + 1) / 2, k.q0 / 2, dv,
                   a->v_ld, acc);
      else
        rs = op_gemm_run(g, 0, pt,
                         op_at(b->dout, attn_o_at(a, bi, h, k.q0), g->b_dt),
                         NULL, dv, acc, w);
    }
  }
  return rs;
}

/* Block gemms of the values: O = P V, dP = dO V^T, dV = P^T dO. */
static void values_fwd_init(op_gemm *g, const attn_geom *a, const op_desc *d,
                            attn_block k) {
  int64_t m = k.r1 - k.r0;
  op_gemm_init(g, m, a->hd, k.kend, m, a->hd);
  op_gemm_layout(g, op_plain(a->S), op_plain(a->v_ld), a->o_ld);
  op_gemm_dtypes(g, d->in_dtype[0], d->in_dtype[1], d->out_dtype);
  g->accumulate_too = false;
}

static void values_dp_init(op_gemm *g, const attn_geom *a, const op_desc *d,
                           attn_block k) {
  int64_t m = k.r1 - k.r0;
  op_gemm_init(g, m, k.kend, a->hd, m, k.kend);
  op_gemm_layout(g, op_plain(a->o_ld), op_transposed(a->v_ld), a->S);
  op_gemm_dtypes(g, d->out_dtype, d->in_dtype[1], d->din_dtype[0]);
}

static void values_dv_init(op_gemm *g, const attn_geom *a, const op_desc *d,
                           attn_block k) {
  int64_t m = k.r1 - k.r0;
  op_gemm_init(g, m, a->hd, a->T - k.q0, m, a->hd);
  op_gemm_layout(g, op_transposed(a->S), op_plain(a->o_ld), a->v_ld);
  op_gemm_dtypes(g, d->in_dtype[0], d->out_dtype, d->din_dtype[1]);
}

remat_status op_attn_values_plan(op_instance *inst, dnnl_engine_t engine,
                                 char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  attn_geom a;
  remat_status rs = values_geom(d, &a, err);
  if (rs != REMAT_OK) return rs;
  /* blocks only where p is known to be causal: the values op has no mask
   * of its own */
  a.causal = d->attrs.probs_causal;
  attn_state *s = attn_state_new(inst, engine, &a);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  s->dot = attn_dot_use(&a, d);
  rs = attn_blocks_plan(&s->fwd, s, d, values_fwd_init, false, err);
  if (rs == REMAT_OK)
    rs = attn_blocks_plan(&s->dx, s, d, values_dp_init, false, err);
  if (rs == REMAT_OK)
    rs = attn_blocks_plan(&s->dy, s, d, values_dv_init, true, err);
  if (rs != REMAT_OK) return rs;
  int64_t tiles = a.B * a.H, T = a.T, S = a.S;
  int64_t words = op_max64(op_bdot_pack_words(S, a.hd, OP_BDOT_PANEL),
                           op_bdot_pack_words(a.hd, S, OP_BDOT_PANEL));
  words = op_max64(words, op_bdot_pack_words(T, a.hd, OP_BDOT_PANEL));
  attn_dot_scratch(s, 0, words);
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "attn_values.fwd", values_fwd, tiles, attn_blocks_flops(&s->fwd, tiles),
      OP_SLOT_IN(0) | OP_SLOT_IN(1), OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] = op_make_kernel(
      "attn_values.dp", values_dp, tiles, attn_blocks_flops(&s->dx, tiles),
      OP_SLOT_IN(1) | OP_SLOT_DOUT, OP_SLOT_DIN(0));
  inst->bwd[inst->nbwd++] = op_make_kernel(
      "attn_values.dv", values_dv, a.B * a.KVH,
      attn_blocks_flops(&s->dy, tiles), OP_SLOT_IN(0) | OP_SLOT_DOUT,
      OP_SLOT_DIN(1));
  inst->fwd[0].span = attn_span(&inst->fwd[0], tiles, T);
  inst->bwd[0].span = attn_span(&inst->bwd[0], tiles, T);
  inst->bwd[1].span = attn_span(&inst->bwd[1], a.B * a.KVH, a.group * T);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
