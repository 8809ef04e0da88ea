/* bench_serve: the latency of a small GPT's forward pass on a runtime that
 * other threads train bigger GPTs on (each its own graph), in one process:
 * the forwards alone, then while the training loops run with the serving
 * graph at
 * REMAT_PRIORITY_NORMAL, then at REMAT_PRIORITY_INTERACTIVE (the rounds
 * of the two alternate, so that both see the same machine). Prints one
 * JSON object: per phase the forwards' p50, p99 and maximum in
 * milliseconds, and the training steps' median time.
 *
 *   bench_serve [FORWARDS] [TRAIN_LAYERS] [TRAIN_D_MODEL] [TRAINERS]
 *
 * FORWARDS per phase (default 200); each trained model has TRAIN_LAYERS
 * (default 2) blocks of width TRAIN_D_MODEL (default 128), sequences of
 * 64 and batches of 4; TRAINERS threads train (default 1, at most 8):
 * with one, a forward waits for the rest of the step in progress in
 * either class; with more, a NORMAL forward also waits behind the steps
 * queued before it, and an INTERACTIVE one does not. */
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

enum { ROUNDS = 4, MAX_FORWARDS = 10000, MAX_STEPS = 100000,
       MAX_TRAINERS = 8 };

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
  int ntrainers = argc > 4 ? atoi(argv[4]) : 1;
  if (forwards < ROUNDS || forwards > MAX_FORWARDS || layers < 1 ||
      width < 16 || width % 4 != 0 || ntrainers < 1 ||
      ntrainers > MAX_TRAINERS) {
    fprintf(stderr, "usage: bench_serve [FORWARDS 4..%d] [TRAIN_LAYERS >= "
            "1] [TRAIN_D_MODEL >= 16, a multiple of 4] [TRAINERS 1..%d]\n",
            MAX_FORWARDS, MAX_TRAINERS);
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
  static trainer t[MAX_TRAINERS];
  for (int i = 0; i < ntrainers; i++) {
    t[i].md = open_model(rt, train_cfg, true);
    check(remat_step(t[i].md.g, NULL), "remat_step"); /* warm-up */
  }
  for (int i = 0; i < 10; i++)
    check(remat_forward(served.g, NULL), "remat_forward");
  pthread_t thread[MAX_TRAINERS];
  for (int i = 0; i < ntrainers; i++)
    if (pthread_create(&thread[i], NULL, train_main, &t[i]) != 0)
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
      int from[MAX_TRAINERS];
      for (int i = 0; i < ntrainers; i++) {
        from[i] = t[i].nsteps;
        atomic_store(&t[i].run, 1);
      }
      serve(&served, urgent ? &interactive : &normal, per_round);
      for (int i = 0; i < ntrainers; i++)
        atomic_store(&t[i].run, 0);
      struct timespec pause = {0, 200000000}; /* the steps in flight end */
      nanosleep(&pause, NULL);
      for (int i = 0; i < ntrainers; i++)
        for (int s = from[i]; s < t[i].nsteps; s++) {
          if (urgent && ninteractive < MAX_STEPS)
            interactive_steps[ninteractive++] = t[i].step_ms[s];
          else if (!urgent && nnormal < MAX_STEPS)
            normal_steps[nnormal++] = t[i].step_ms[s];
        }
    }
  }
  for (int i = 0; i < ntrainers; i++) {
    atomic_store(&t[i].stop, 1);
    pthread_join(thread[i], NULL);
  }
  printf("{\n  \"serve_model\": \"gpt 2x64 seq 32 batch 1\",\n"
         "  \"train_model\": \"gpt %dx%d seq 64 batch 4\",\n"
         "  \"trainers\": %d,\n",
         layers, width, ntrainers);
  print_phase(&alone, 0.0, false);
  print_phase(&normal, quantile(normal_steps, nnormal, 0.5), false);
  print_phase(&interactive,
              quantile(interactive_steps, ninteractive, 0.5), true);
  printf("}\n");
  remat_graph_destroy(served.g);
  for (int i = 0; i < ntrainers; i++)
    remat_graph_destroy(t[i].md.g);
  remat_runtime_destroy(rt);
  return 0;
}
