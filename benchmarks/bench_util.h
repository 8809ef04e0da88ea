/* What the benchmarks share: their clocks, the median of a sample, and the
 * token batch they feed a GPT. Header-only (static inline): each benchmark
 * is a program of its own. */
#ifndef REMAT_BENCH_UTIL_H
#define REMAT_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* Wall-clock seconds. */
static inline double bench_wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The calling thread's CPU seconds: on a shared machine, what other
 * processes take does not count. */
static inline double bench_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0..n) (n > 0), sorting v in place. */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* n tokens below vocab from a fixed linear congruential sequence, and
 * targets that are a function of each token (a batch the model can
 * learn). */
static inline void bench_tokens(int32_t *tok, int32_t *tgt, size_t n,
                                int vocab) {
  uint32_t x = 12345u;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    tok[i] = (int32_t)((x >> 16) % (uint32_t)vocab);
    tgt[i] = (tok[i] * 7 + 3) % vocab;
  }
}

#endif
