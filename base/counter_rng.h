/* A counter-based random generator: the bits of element i of a stream are
 * a hash of (seed, stream, step, i), with no state, so any element can be
 * drawn on its own, by any thread, in any order, as often as needed (a
 * recompute draws the bits its forward drew). The hash is splitmix64's
 * finalizer over a key made from seed, stream and step. */
#ifndef REMAT_BASE_COUNTER_RNG_H
#define REMAT_BASE_COUNTER_RNG_H

#include <stdint.h>

static inline uint64_t counter_rng_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* The key of one stream at one step: each part mixed in turn. */
static inline uint64_t counter_rng_key(uint64_t seed, uint64_t stream,
                                       uint64_t step) {
  uint64_t k = counter_rng_mix(seed + UINT64_C(0x9e3779b97f4a7c15));
  k = counter_rng_mix(k ^ (stream + UINT64_C(0x632be59bd9b4e019)));
  return counter_rng_mix(k ^ (step + UINT64_C(0x8cb92ba72f3d8dd7)));
}

/* 32 uniform bits of element i under key. */
static inline uint32_t counter_rng_bits(uint64_t key, uint64_t i) {
  uint64_t z = key + (i + 1) * UINT64_C(0x9e3779b97f4a7c15);
  return (uint32_t)(counter_rng_mix(z) >> 32);
}

/* The threshold below which bits drop an element with probability p in
 * [0,1): round(p 2^32), at most 2^32 - 1. */
static inline uint32_t counter_rng_threshold(float p) {
  double t = (double)p * 4294967296.0 + 0.5;
  return t >= 4294967295.0 ? UINT32_MAX : (uint32_t)t;
}

#endif
