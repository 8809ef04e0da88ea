/* Fused attention's step (forward and backward, no update) at B 8, T 256,
 * 8 heads of 64, causal, on one worker: grouped-query attention (2 kv
 * heads) against multi-head attention (8 kv heads), and the materialized
 * form at 8 kv heads, in interleaved rounds after a warm-up in one
 * process; prints the median milliseconds of each and the ratios as JSON.
 * Usage: bench_attention [--rounds N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "remat.h"

enum { B = 8, T = 256, H = 8, HD = 64, WARMUP = 2 };

typedef struct bench_graph {
  const char *name;
  remat_runtime *rt;
  remat_graph *g;
  double *ms;
} bench_graph;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void die(const char *what) {
  fprintf(stderr, "bench_attention: %s: %s\n", what, remat_last_error());
  exit(1);
}

/* q, k, v parameters -> attention -> sum, compiled without an optimizer. */
static void open_graph(bench_graph *b, const char *name, int kv_heads,
                       int fused, int rounds) {
  b->name = name;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY,
                     .num_threads = 1,
                     .policy = "everything_saveable"};
  if (remat_runtime_create(&rc, &b->rt) != REMAT_OK ||
      remat_graph_create(b->rt, &b->g) != REMAT_OK)
    die("runtime");
  int64_t qd[3] = {B, T, H * HD}, kd[3] = {B, T, (int64_t)kv_heads * HD};
  remat_tensor *q = remat_param(b->g, "q", 3, qd, REMAT_INIT_NORMAL, 1.0f);
  remat_tensor *k = remat_param(b->g, "k", 3, kd, REMAT_INIT_NORMAL, 1.0f);
  remat_tensor *v = remat_param(b->g, "v", 3, kd, REMAT_INIT_NORMAL, 1.0f);
  remat_attention_config c = {
      .heads = H, .kv_heads = kv_heads, .causal = 1, .fused = fused};
  remat_tensor *loss = remat_sum(b->g, remat_attention(b->g, q, k, v, &c));
  if (remat_compile(b->g, loss, NULL) != REMAT_OK)
    die(name);
  b->ms = calloc((size_t)rounds, sizeof *b->ms);
  if (!b->ms)
    die("out of memory");
}

static double step_ms(bench_graph *b) {
  double t0 = now_ms();
  if (remat_step(b->g, NULL) != REMAT_OK)
    die(b->name);
  return now_ms() - t0;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
  int rounds = 15;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_attention [--rounds N]\n");
      return 2;
    }
  }
  if (rounds < 1)
    rounds = 1;
  bench_graph g[3];
  open_graph(&g[0], "fused_kv8", 8, 1, rounds);
  open_graph(&g[1], "fused_kv2", 2, 1, rounds);
  open_graph(&g[2], "materialized_kv8", 8, 0, rounds);
  for (int r = 0; r < WARMUP; r++)
    for (int i = 0; i < 3; i++)
      step_ms(&g[i]);
  for (int r = 0; r < rounds; r++) /* interleaved, order rotating */
    for (int i = 0; i < 3; i++) {
      bench_graph *b = &g[(r + i) % 3];
      b->ms[r] = step_ms(b);
    }
  double med[3];
  for (int i = 0; i < 3; i++)
    med[i] = median(g[i].ms, rounds);
  printf("{\"B\": %d, \"T\": %d, \"heads\": %d, \"head_dim\": %d, "
         "\"threads\": 1, \"rounds\": %d,\n",
         B, T, H, HD, rounds);
  for (int i = 0; i < 3; i++)
    printf(" \"%s_ms\": %.3f,\n", g[i].name, med[i]);
  printf(" \"gqa_over_mha\": %.3f, \"materialized_over_fused\": %.3f}\n",
         med[1] / med[0], med[2] / med[0]);
  for (int i = 0; i < 3; i++) {
    remat_graph_destroy(g[i].g);
    remat_runtime_destroy(g[i].rt);
    free(g[i].ms);
  }
  return 0;
}
