/* bench_serve: the latency of a small GPT's forward pass on a runtime that
 * another thread trains a bigger GPT on, in one process: the forwards
 * alone, then while the training loop runs with the serving graph at
 * REMAT_PRIORITY_NORMAL, then at REMAT_PRIORITY_INTERACTIVE (the rounds
 * of the two alternate, so that both see the same machine). Prints one
 * JSON object: per phase the forwards' p50, p99 and maximum in
 * milliseconds, and the training steps' median time.
 *
 *   bench_serve [FORWARDS] [TRAIN_LAYERS] [TRAIN_D_MODEL]
 *
 * FORWARDS per phase (default 200); the trained model has TRAIN_LAYERS
 * (default 2) blocks of width TRAIN_D_MODEL (default 128), sequences of
 * 64 and batches of 4. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "remat.h"
#include "remat_gpt.h"

enum { ROUNDS = 4, MAX_FORWARDS = 10000, MAX_STEPS = 100000 };

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void check(remat_status s, const char *call) {
  if (s == REMAT_OK)
    return;
  fprintf(stderr, "bench_serve: %s: %s\n", call, remat_last_error());
  exit(1);
}

typedef struct model {
  remat_graph *g;
  remat_gpt m;
  remat_gpt_config cfg;
} model;

static model open_model(remat_runtime *rt, remat_gpt_config cfg, bool train) {
  model md = {.cfg = cfg};
  remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-3f};
  check(remat_graph_create(rt, &md.g), "remat_graph_create");
  check(remat_gpt_build(md.g, &cfg, &md.m), "remat_gpt_build");
  if (!train)
    check(remat_keep(md.g, md.m.logits), "remat_keep");
  check(remat_compile(md.g, train ? md.m.loss : NULL, train ? &adamw : NULL),
        "remat_compile");
  size_t n = (size_t)cfg.batch * (size_t)cfg.seq;
  int32_t *ids = malloc(n * sizeof *ids);
  for (size_t i = 0; i < n; i++)
    ids[i] = (int32_t)((i * 7 + 3) % (size_t)cfg.vocab);
  check(remat_feed(md.g, md.m.tokens, ids, n * sizeof *ids), "remat_feed");
  check(remat_feed(md.g, md.m.targets, ids, n * sizeof *ids), "remat_feed");
  free(ids);
  return md;
}

/* ---- the training thread ---- */

typedef struct trainer {
  model md;
  _Atomic int run; /* 1: keep stepping */
  _Atomic int stop;
  int nsteps;
  double step_ms[MAX_STEPS];
} trainer;

static void *train_main(void *arg) {
  trainer *t = arg;
  while (!atomic_load(&t->stop)) {
    if (!atomic_load(&t->run)) {
      struct timespec pause = {0, 1000000};
      nanosleep(&pause, NULL);
      continue;
    }
    double t0 = now_ms();
    check(remat_step(t->md.g, NULL), "remat_step");
    if (t->nsteps < MAX_STEPS)
      t->step_ms[t->nsteps++] = now_ms() - t0;
  }
  return NULL;
}

/* ---- latencies ---- */

typedef struct phase {
  const char *name;
  int n;
  double ms[MAX_FORWARDS];
  int steps_from, steps_to; /* the training steps of the phase, per round */
} phase;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q) {
  if (n == 0)
    return 0.0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int i = (int)(q * (double)(n - 1) + 0.5);
  return v[i];
}

/* `count` forwards with a pause of 2 ms between them (requests that come
 * one at a time). */
static void serve(model *md, phase *p, int count) {
  for (int i = 0; i < count && p->n < MAX_FORWARDS; i++) {
    double t0 = now_ms();
    check(remat_forward(md->g, NULL), "remat_forward");
    p->ms[p->n++] = now_ms() - t0;
    struct timespec pause = {0, 2000000};
    nanosleep(&pause, NULL);
  }
}

static void print_phase(phase *p, double step_median, bool last) {
  double p50 = quantile(p->ms, p->n, 0.5), p99 = quantile(p->ms, p->n, 0.99);
  printf("  \"%s\": {\"forwards\": %d, \"p50_ms\": %.3f, \"p99_ms\": %.3f, "
         "\"max_ms\": %.3f, \"train_step_median_ms\": %.3f}%s\n",
         p->name, p->n, p50, p99, p->ms[p->n - 1] /* sorted */, step_median,
         last ? "" : ",");
}

int main(int argc, char **argv) {
  int forwards = argc > 1 ? atoi(argv[1]) : 200;
  int layers = argc > 2 ? atoi(argv[2]) : 2;
  int width = argc > 3 ? atoi(argv[3]) : 128;
  if (forwards < ROUNDS || forwards > MAX_FORWARDS || layers < 1 ||
      width < 16 || width % 4 != 0) {
    fprintf(stderr, "usage: bench_serve [FORWARDS 4..%d] [TRAIN_LAYERS >= "
            "1] [TRAIN_D_MODEL >= 16, a multiple of 4]\n", MAX_FORWARDS);
    return 2;
  }
  remat_runtime *rt;
  check(remat_runtime_create(NULL, &rt), "remat_runtime_create");
  remat_gpt_config serve_cfg = {.layers = 2, .d_model = 64, .heads = 4,
                                .seq = 32, .batch = 1, .vocab = 256};
  remat_gpt_config train_cfg = {.layers = layers, .d_model = width,
                                .heads = 4, .seq = 64, .batch = 4,
                                .vocab = 256};
  model served = open_model(rt, serve_cfg, false);
  static trainer t;
  t.md = open_model(rt, train_cfg, true);
  for (int i = 0; i < 10; i++) /* warm-up */
    check(remat_forward(served.g, NULL), "remat_forward");
  check(remat_step(t.md.g, NULL), "remat_step");
  pthread_t thread;
  if (pthread_create(&thread, NULL, train_main, &t) != 0)
    return 1;
  static phase alone = {.name = "alone"}, normal = {.name = "normal"},
               interactive = {.name = "interactive"};
  static double normal_steps[MAX_STEPS], interactive_steps[MAX_STEPS];
  int nnormal = 0, ninteractive = 0, per_round = forwards / ROUNDS;
  for (int r = 0; r < ROUNDS; r++) {
    serve(&served, &alone, per_round);
    for (int k = 0; k < 2; k++) {
      bool urgent = (r + k) % 2 == 1;
      check(remat_graph_priority(served.g, urgent
                                               ? REMAT_PRIORITY_INTERACTIVE
                                               : REMAT_PRIORITY_NORMAL),
            "remat_graph_priority");
      int from = t.nsteps;
      atomic_store(&t.run, 1);
      serve(&served, urgent ? &interactive : &normal, per_round);
      atomic_store(&t.run, 0);
      struct timespec pause = {0, 50000000}; /* the step in flight ends */
      nanosleep(&pause, NULL);
      for (int s = from; s < t.nsteps; s++) {
        if (urgent)
          interactive_steps[ninteractive++] = t.step_ms[s];
        else
          normal_steps[nnormal++] = t.step_ms[s];
      }
    }
  }
  atomic_store(&t.stop, 1);
  pthread_join(thread, NULL);
  printf("{\n  \"serve_model\": \"gpt 2x64 seq 32 batch 1\",\n"
         "  \"train_model\": \"gpt %dx%d seq 64 batch 4\",\n", layers, width);
  print_phase(&alone, 0.0, false);
  print_phase(&normal, quantile(normal_steps, nnormal, 0.5), false);
  print_phase(&interactive,
              quantile(interactive_steps, ninteractive, 0.5), true);
  printf("}\n");
  remat_graph_destroy(served.g);
  remat_graph_destroy(t.md.g);
  remat_runtime_destroy(rt);
  return 0;
}
