/* The fused swiglu against silu then mul, in one process: two graphs whose
 * loss is mean(swiglu(gate, up)) and mean(mul(silu(gate), up)) on the same
 * [rows, cols] parameters, steps (forward and backward, no update) taken in
 * turns, and the median step time and activation peak of each printed as
 * JSON with their ratio.
 *
 *   bench_swiglu [rows cols steps threads]   (default 4096 2816 15 1) */
#include <stdio.h>
#include <stdlib.h>

#include "remat.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static remat_graph *build(remat_runtime *rt, int64_t rows, int64_t cols,
                          int fused) {
  remat_graph *g;
  if (remat_graph_create(rt, &g) != REMAT_OK) return NULL;
  int64_t dims[2] = {rows, cols};
  remat_tensor *gate = remat_param(g, "gate", 2, dims, REMAT_INIT_NORMAL, 2);
  remat_tensor *up = remat_param(g, "up", 2, dims, REMAT_INIT_NORMAL, 1);
  remat_tensor *y = fused ? remat_swiglu(g, gate, up)
                          : remat_mul(g, remat_silu(g, gate), up);
  if (remat_compile(g, remat_mean(g, y), NULL) != REMAT_OK) {
    fprintf(stderr, "bench_swiglu: %s\n", remat_graph_error(g));
    remat_graph_destroy(g);
    return NULL;
  }
  return g;
}

int main(int argc, char **argv) {
  int64_t rows = argc > 1 ? atoll(argv[1]) : 4096;
  int64_t cols = argc > 2 ? atoll(argv[2]) : 2816;
  int steps = argc > 3 ? atoi(argv[3]) : 15;
  int threads = argc > 4 ? atoi(argv[4]) : 1;
  if (rows < 1 || cols < 1 || steps < 1 || threads < 1) {
    fprintf(stderr, "usage: bench_swiglu [rows cols steps threads]\n");
    return 2;
  }
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = threads};
  remat_runtime *rt;
  if (remat_runtime_create(&rc, &rt) != REMAT_OK) {
    fprintf(stderr, "bench_swiglu: %s\n", remat_last_error());
    return 1;
  }
  remat_graph *g[2] = {build(rt, rows, cols, 0), build(rt, rows, cols, 1)};
  double *sec = calloc(2 * (size_t)steps, sizeof *sec);
  int64_t peak[2] = {0, 0};
  int rc_main = g[0] && g[1] && sec ? 0 : 1;
  for (int s = -1; rc_main == 0 && s < steps; s++) /* s = -1: warm-up */
    for (int k = 0; k < 2; k++) {
      remat_step_stats st = {.size = sizeof st};
      if (remat_step(g[k], &st) != REMAT_OK) {
        fprintf(stderr, "bench_swiglu: %s\n", remat_graph_error(g[k]));
        rc_main = 1;
        break;
      }
      if (s >= 0) sec[k * steps + s] = st.seconds;
      peak[k] = st.activation_peak_bytes;
    }
  if (rc_main == 0) {
    double med[2];
    for (int k = 0; k < 2; k++) {
      qsort(sec + k * steps, (size_t)steps, sizeof *sec, cmp_double);
      med[k] = sec[k * steps + steps / 2];
    }
    printf("{\"rows\": %lld, \"cols\": %lld, \"steps\": %d, \"threads\": %d, "
           "\"silu_mul_ms\": %.3f, \"swiglu_ms\": %.3f, \"speedup\": %.3f, "
           "\"silu_mul_act_peak_bytes\": %lld, "
           "\"swiglu_act_peak_bytes\": %lld}\n",
           (long long)rows, (long long)cols, steps, threads, 1e3 * med[0],
           1e3 * med[1], med[0] / med[1], (long long)peak[0],
           (long long)peak[1]);
  }
  free(sec);
  for (int k = 0; k < 2; k++) remat_graph_destroy(g[k]);
  remat_runtime_destroy(rt);
  return rc_main;
}
