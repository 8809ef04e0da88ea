/* bfloat16 storage: conversions between f32 and bf16 (the top 16 bits of an
 * f32, rounded to nearest even), one value at a time and over rows, for the
 * kernels and runtime paths that store activations in bf16 and compute in
 * f32. */
#ifndef REMAT_BASE_BF16_H
#define REMAT_BASE_BF16_H

#include <stdint.h>
#include <string.h>

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
