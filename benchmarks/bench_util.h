/* What the benchmarks share: their clocks, the median of a sample, and the
 * token batch they feed a GPT. Header-only (static inline): each benchmark
 * is a program of its own. */
#ifndef REMAT_BENCH_UTIL_H
#define REMAT_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "remat_gpt.h"

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

/* Feeds a GPT's tokens and targets: batch x seq tokens below vocab from a
 * fixed linear congruential sequence, and targets that are a function of
 * each token (a batch the model can learn). REMAT_ERR_OUT_OF_MEMORY when
 * the batch cannot be allocated, else remat_feed's status. */
static inline remat_status bench_feed_batch(remat_graph *g,
                                            const remat_gpt *m,
                                            const remat_gpt_config *cfg) {
  size_t n = (size_t)cfg->batch * (size_t)cfg->seq;
  int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
  remat_status s = REMAT_ERR_OUT_OF_MEMORY;
  if (tok != NULL && tgt != NULL) {
    uint32_t x = 12345u;
    for (size_t i = 0; i < n; i++) {
      x = x * 1664525u + 1013904223u;
      tok[i] = (int32_t)((x >> 16) % (uint32_t)cfg->vocab);
      tgt[i] = (tok[i] * 7 + 3) % cfg->vocab;
    }
    s = remat_feed(g, m->tokens, tok, n * sizeof *tok);
    if (s == REMAT_OK)
      s = remat_feed(g, m->targets, tgt, n * sizeof *tgt);
  }
  free(tok);
  free(tgt);
  return s;
}

#endif
