/* bfloat16 storage: conversions between f32 and bf16 (the top 16 bits of an
 * f32, rounded to nearest even), one value at a time and over rows, for the
 * kernels and runtime paths that store activations in bf16 and compute in
 * f32. */
#ifndef REMAT_BASE_BF16_H
#define REMAT_BASE_BF16_H

#include <stdint.h>
#include <string.h>

/* Loops built for the widest vectors the machine has, picked at load time
 * (an ifunc): the baseline x86-64 build has no fast f32 -> bf16 packing
 * and runs them 2-5x slower. The AVX-512 clone is x86-64-v4 (F with BW,
 * DQ, VL and CD, as every AVX-512 server CPU has): with 16-bit lanes (BW)
 * its bf16 packing takes fewer instructions than with AVX-512F alone (the
 * bf16 residual adds took 0.78x their time, bench_kernels). Every clone
 * rounds the same way and adds in the same order (no FMA contraction in
 * ISO C mode; objdump finds no fused multiply-add in the clones), so the
 * bits are the same on every machine. Not under ThreadSanitizer: the
 * clones' resolver runs during relocation, before the sanitizer's runtime
 * is set up, and would crash every program linked with the library. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define REMAT_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define REMAT_SIMD_CLONES
#endif

/* f32 -> bf16, round to nearest even; a NaN stays a (quiet) NaN, +-Inf
 * stays +-Inf, values that round past the largest bf16 become +-Inf. */
static inline uint16_t bf16_from_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* dst[0..n) = bf16(src[0..n)). */
void bf16_from_f32_row(uint16_t *restrict dst, const float *restrict src,
                       int64_t n);
/* dst[0..n) = f32(src[0..n)). */
void bf16_to_f32_row(float *restrict dst, const uint16_t *restrict src,
                     int64_t n);
/* dst[0..n) = bf16(f32(dst[0..n)) + src[0..n)): accumulation into a bf16
 * buffer, the sum formed in f32 and rounded once. */
void bf16_add_f32_row(uint16_t *restrict dst, const float *restrict src,
                      int64_t n);

#endif
