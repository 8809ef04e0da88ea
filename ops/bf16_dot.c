/* The bf16 block products of ops/bf16_dot.h: pairs packing and a register
 * tile of up to 6 rows by 64 columns (24 accumulators) on vdpbf16ps. Only
 * the functions marked BDOT_TARGET use AVX-512; callers check
 * op_bdot_available() first. */
#include "ops/bf16_dot.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BDOT_X86 1
#define BDOT_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define BDOT_X86 0
#endif

#define BDOT_MR 6 /* rows of a register tile */
#define BDOT_NV 4 /* vectors of 16 columns: one panel */

/* Also where oneDNN may use AVX512-BF16 (ONEDNN_MAX_CPU_ISA below it
 * keeps these products on oneDNN too). */
bool op_bdot_available(void) {
#if BDOT_X86
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core_bf16) ==
             dnnl_cpu_isa_avx512_core_bf16 &&
         __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

int64_t op_bdot_pack_words(int64_t k, int64_t n, int64_t w) {
  return (k + 1) / 2 * ((n + w - 1) / w) * w;
}

static inline uint32_t pair(uint16_t lo, uint16_t hi) {
  return (uint32_t)lo | (uint32_t)hi << 16;
}

/* A transposed pack with an even k: row by row of x (contiguous
 * reads, each pair a 32-bit word), into the panel's columns. */
static void pack_transposed_even(uint32_t *dst, const uint16_t *x, int64_t k,
                                 int64_t n, int64_t ld, int64_t w) {
  int64_t kp = k / 2, panels = (n + w - 1) / w;
  for (int64_t pn = 0; pn < panels; pn++) {
    int64_t n0 = pn * w, nw = n - n0 < w ? n - n0 : w;
    uint32_t *d = dst + pn * kp * w;
    for (int64_t j = 0; j < nw; j++) {
      const uint16_t *r = x + (n0 + j) * ld;
      /* rows lie ld apart: ask for a row 8 ahead, a line at a time */
      if (j + 8 < nw)
        for (int64_t p = 0; p < kp; p += 16)
          __builtin_prefetch(r + 8 * ld + 2 * p);
      for (int64_t p = 0; p < kp; p++) {
        uint32_t v;
        memcpy(&v, r + 2 * p, sizeof v);
        d[p * w + j] = v;
      }
    }
    if (nw < w)
      for (int64_t p = 0; p < kp; p++)
        memset(d + p * w + nw, 0, (size_t)(w - nw) * sizeof *d);
  }
}

void op_bdot_pack(uint32_t *dst, const uint16_t *x, int64_t k, int64_t n,
                  int64_t ld, bool transposed, int64_t w) {
  if (transposed && k % 2 == 0) {
    pack_transposed_even(dst, x, k, n, ld, w);
    return;
  }
  int64_t kp = (k + 1) / 2, panels = (n + w - 1) / w;
  for (int64_t pn = 0; pn < panels; pn++) {
    int64_t n0 = pn * w, nw = n - n0 < w ? n - n0 : w;
    uint32_t *d = dst + pn * kp * w;
    for (int64_t p = 0; p < kp; p++) {
      uint32_t *row = d + p * w;
      bool odd = 2 * p + 1 >= k;
      if (!transposed) {
        const uint16_t *r0 = x + 2 * p * ld + n0, *r1 = r0 + ld;
        /* rows lie ld apart: ask for the pair 4 ahead, a line at a time */
        if (2 * p + 9 < k)
          for (int64_t j = 0; j < nw; j += 32) {
            __builtin_prefetch(r0 + 8 * ld + j);
            __builtin_prefetch(r1 + 8 * ld + j);
          }
        if (odd)
          for (int64_t j = 0; j < nw; j++) row[j] = pair(r0[j], 0);
        else
          for (int64_t j = 0; j < nw; j++) row[j] = pair(r0[j], r1[j]);
      } else {
        const uint16_t *c = x + n0 * ld + 2 * p;
        for (int64_t j = 0; j < nw; j++)
          row[j] = pair(c[j * ld], odd ? 0 : c[j * ld + 1]);
      }
      for (int64_t j = nw; j < w; j++) row[j] = 0;
    }
  }
}

#if BDOT_X86
/* f32 -> bf16 as bf16_from_f32 does (nearest even; NaN stays quiet NaN),
 * 16 lanes. */
BDOT_TARGET static inline __m256i round_bf16(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16),
                                 _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(
                                      _mm512_set1_epi32(0x7fff), lsb));
  r = _mm512_srli_epi32(r, 16);
  __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16),
                              _mm512_set1_epi32(0x40));
  r = _mm512_mask_mov_epi32(r, nan, q);
  return _mm512_cvtepi32_epi16(r);
}

/* Stores alpha acc (+ C) into 16 columns of a row of C, the first `cols`
 * of them. */
BDOT_TARGET static inline void store_row(void *c, op_dtype t, __m512 acc,
                                         float alpha, int cols,
                                         bool accumulate) {
  __mmask16 mk = cols >= 16 ? (__mmask16)0xffff
                            : (__mmask16)((1u << cols) - 1u);
  __m512 v = _mm512_mul_ps(acc, _mm512_set1_ps(alpha));
  if (t == OP_F32) {
    float *cf = c;
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, cf));
    _mm512_mask_storeu_ps(cf, mk, v);
  } else {
    uint16_t *ch = c;
    if (accumulate) {
      __m256i old = _mm256_maskz_loadu_epi16(mk, ch);
      __m512 of = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(old), 16));
      v = _mm512_add_ps(v, of);
    }
    _mm256_mask_storeu_epi16(ch, mk, round_bf16(v));
  }
}

/* One register tile: rows m0..m0+MR of C against the `nv` vectors of
 * panel b (kp pairs). A pair (m, p) is read at a32[m * sam + p * sap]. */
BDOT_TARGET static inline __attribute__((always_inline)) void
tile(int MR, int nv, const uint32_t *a32, int64_t sam, int64_t sap,
     const uint32_t *b, int64_t kp, float alpha, char *c, int64_t ldc_bytes,
     op_dtype t, int cols, bool accumulate, bool pf) {
  __m512 acc[BDOT_MR][BDOT_NV];
  for (int r = 0; r < MR; r++)
    for (int v = 0; v < nv; v++) acc[r][v] = _mm512_setzero_ps();
  /* the next tile's rows of a plain A (sap 1), a line at a time */
  if (sap == 1 && pf)
    for (int r = 0; r < MR; r++)
      for (int64_t p = 0; p < kp; p += 16)
        _mm_prefetch((const char *)(a32 + (MR + r) * sam + p), _MM_HINT_T0);
  for (int64_t p = 0; p < kp; p++) {
    __m512bh bv[BDOT_NV];
    for (int v = 0; v < nv; v++)
      bv[v] = (__m512bh)_mm512_loadu_si512(b + p * OP_BDOT_PANEL + 16 * v);
    for (int r = 0; r < MR; r++) {
      uint32_t w;
      memcpy(&w, a32 + r * sam + p * sap, sizeof w);
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)w);
      for (int v = 0; v < nv; v++)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  int es = t == OP_F32 ? 4 : 2;
  for (int r = 0; r < MR; r++)
    for (int v = 0; v < nv; v++)
      store_row(c + r * ldc_bytes + (int64_t)v * 16 * es, t, acc[r][v],
                alpha, cols - 16 * v, accumulate);
}

/* tile() with MR and nv as constants (one instance per pair). */
#define BDOT_CASE(MR, NV)                                               \
  case (MR) * 8 + (NV):                                                 \
    tile(MR, NV, a32, sam, sap, b, kp, alpha, c, ldc_bytes, t, cols,    \
         accumulate, pf);                                               \
    break;
#define BDOT_ROW(MR) \
  BDOT_CASE(MR, 1) BDOT_CASE(MR, 2) BDOT_CASE(MR, 3) BDOT_CASE(MR, 4)

BDOT_TARGET static void tile_any(int mr, int nv, const uint32_t *a32,
                                 int64_t sam, int64_t sap, const uint32_t *b,
                                 int64_t kp, float alpha, char *c,
                                 int64_t ldc_bytes, op_dtype t, int cols,
                                 bool accumulate, bool pf) {
  switch (mr * 8 + nv) {
    BDOT_ROW(1) BDOT_ROW(2) BDOT_ROW(3) BDOT_ROW(4) BDOT_ROW(5) BDOT_ROW(6)
    default:
      break;
  }
}

BDOT_TARGET static void run_x86(int64_t m, int64_t n, int64_t k, float alpha,
                                op_bdot_a a, const uint32_t *b,
                                int64_t kp_stride, int64_t p0, void *c,
                                int64_t ldc, op_dtype t, bool accumulate) {
  int64_t kp = (k + 1) / 2, es = t == OP_F32 ? 4 : 2;
  const uint32_t *a32 = a.p;
  /* plain A: pair (m, p) at word m * ld / 2 + p (ld even); packed: at
   * p * ld + m */
  int64_t sam = a.packed ? 1 : a.ld / 2, sap = a.packed ? a.ld : 1;
  for (int64_t n0 = 0; n0 < n; n0 += OP_BDOT_PANEL) {
    int64_t cols = n - n0 < OP_BDOT_PANEL ? n - n0 : OP_BDOT_PANEL;
    int nv = (int)((cols + 15) / 16);
    const uint32_t *bp =
        b + (n0 / OP_BDOT_PANEL) * kp_stride * OP_BDOT_PANEL +
        p0 * OP_BDOT_PANEL;
    for (int64_t m0 = 0; m0 < m; m0 += BDOT_MR) {
      int mr = (int)(m - m0 < BDOT_MR ? m - m0 : BDOT_MR);
      tile_any(mr, nv, a32 + m0 * sam, sam, sap, bp, kp, alpha,
               (char *)c + (m0 * ldc + n0) * es, ldc * es, t, (int)cols,
               accumulate, m0 + 2 * BDOT_MR <= m);
    }
  }
}
#endif

void op_bdot_run(int64_t m, int64_t n, int64_t k, float alpha, op_bdot_a a,
                 const uint32_t *b, int64_t kp_stride, int64_t p0, void *c,
                 int64_t ldc, op_dtype c_dt, bool accumulate) {
#if BDOT_X86
  run_x86(m, n, k, alpha, a, b, kp_stride, p0, c, ldc, c_dt, accumulate);
#else
  /* never called: op_bdot_available() is false off x86 */
  (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)b, (void)kp_stride;
  (void)p0, (void)c, (void)ldc, (void)c_dt, (void)accumulate;
#endif
}
