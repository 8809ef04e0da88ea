/* Row conversions between f32 and bf16 (base/bf16.h): plain loops over the
 * inline conversions, which gcc -O3 turns into SIMD code, cloned for the
 * machine's widest vectors. */
#include "base/bf16.h"

/* The clones are static: gcc gives the ifunc of an extern cloned function
 * default visibility, which would export it from the library; the extern
 * names below call them. */
REMAT_SIMD_CLONES static void from_f32(uint16_t *restrict dst,
                                       const float *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = bf16_from_f32(src[i]);
}

REMAT_SIMD_CLONES static void to_f32(float *restrict dst,
                                     const uint16_t *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

REMAT_SIMD_CLONES static void add_f32(uint16_t *restrict dst,
                                      const float *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    dst[i] = bf16_from_f32(bf16_to_f32(dst[i]) + src[i]);
}

void bf16_from_f32_row(uint16_t *restrict dst, const float *restrict src,
                       int64_t n) {
  from_f32(dst, src, n);
}

void bf16_to_f32_row(float *restrict dst, const uint16_t *restrict src,
                     int64_t n) {
  to_f32(dst, src, n);
}

void bf16_add_f32_row(uint16_t *restrict dst, const float *restrict src,
                      int64_t n) {
  add_f32(dst, src, n);
}
