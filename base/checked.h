/* Checked size arithmetic: every element count, byte count, stride and tile
 * count derived from a user's shape goes through these, so a wrapping
 * product is an error instead of a small number. Each returns false (and
 * leaves *out unchanged) when the exact result does not fit. */
#ifndef REMAT_BASE_CHECKED_H
#define REMAT_BASE_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline bool remat__mul_i64(int64_t a, int64_t b, int64_t *out) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return false;
  *out = r;
  return true;
}

static inline bool remat__add_i64(int64_t a, int64_t b, int64_t *out) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    return false;
  *out = r;
  return true;
}

static inline bool remat__mul_size(size_t a, size_t b, size_t *out) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return false;
  *out = r;
  return true;
}

static inline bool remat__add_size(size_t a, size_t b, size_t *out) {
  size_t r;
  if (__builtin_add_overflow(a, b, &r))
    return false;
  *out = r;
  return true;
}

/* Product of n non-negative dims, false on overflow or a negative dim. */
static inline bool remat__numel(const int64_t *dims, int n, int64_t *out) {
  int64_t r = 1;
  for (int i = 0; i < n; i++)
    if (dims[i] < 0 || !remat__mul_i64(r, dims[i], &r))
      return false;
  *out = r;
  return true;
}

#endif
