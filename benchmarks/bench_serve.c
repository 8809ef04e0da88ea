/* bench_serve: the latency of a small GPT's forward pass on a runtime that
 * other threads train bigger GPTs on (each its own graph), in one process:
 * the forwards alone, the training alone (no forwards), then the forwards
 * while the training loops run with the serving graph at
 * REMAT_PRIORITY_NORMAL, then at REMAT_PRIORITY_INTERACTIVE (the rounds
 * of the four alternate, so that all see the same machine). Prints one
 * JSON object: per phase the forwards' p50, p99 and maximum in
 * milliseconds, and the training steps' median time; the longest task of
 * the training DAG (each task's median time over a Chrome trace of five
 * steps alone, remat_trace_steps); and, per phase with both, whether
 * issue 28's targets hold: the forwards' p99 at most 2x their p99 alone
 * plus the longest training task, and the training step's median at most
 * 1.1x its median alone plus the forwards' own work per step (the
 * forwards that ran per training step times their mean time alone).
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
#include <unistd.h>

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

static void print_phase(phase *p, double step_median) {
  double p50 = quantile(p->ms, p->n, 0.5), p99 = quantile(p->ms, p->n, 0.99);
  printf("  \"%s\": {\"forwards\": %d, \"p50_ms\": %.3f, \"p99_ms\": %.3f, "
         "\"max_ms\": %.3f, \"train_step_median_ms\": %.3f},\n",
         p->name, p->n, p50, p99, p->ms[p->n - 1] /* sorted */, step_median);
}

static double mean(const double *v, int n) {
  double sum = 0.0;
  for (int i = 0; i < n; i++)
    sum += v[i];
  return n > 0 ? sum / n : 0.0;
}

typedef struct task_time {
  int id;
  double us;
} task_time;

static int cmp_task_time(const void *a, const void *b) {
  const task_time *x = a, *y = b;
  if (x->id != y->id)
    return x->id < y->id ? -1 : 1;
  return x->us < y->us ? -1 : x->us > y->us;
}

/* The longest task (a tile, or a node's start or end) of the training DAG
 * of g: each task's median time over `steps` traced steps (a worker that
 * the OS preempted in one step does not count), then the largest, with
 * its name in `name`: the most a ready task of another graph waits for a
 * worker to reach a task boundary. In milliseconds. */
static double longest_task_ms(remat_graph *g, int steps, char *name,
                              size_t name_len) {
  char path[] = "/tmp/bench_serve_trace_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    fprintf(stderr, "bench_serve: cannot create a trace file in /tmp\n");
    exit(1);
  }
  close(fd);
  check(remat_trace_steps(g, path, steps), "remat_trace_steps");
  for (int i = 0; i < steps; i++)
    check(remat_step(g, NULL), "remat_step");
  FILE *f = fopen(path, "rb");
  char *text = NULL;
  long len = 0;
  if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 &&
      fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)len + 1)) != NULL)
    text[fread(text, 1, (size_t)len, f)] = '\0';
  if (f != NULL)
    fclose(f);
  remove(path);
  if (text == NULL) {
    fprintf(stderr, "bench_serve: cannot read the trace\n");
    exit(1);
  }
  /* task events: {"name":N,"cat":"<kind>","ph":"X","ts":T,"dur":D
   * (microseconds),...,"args":{"step":S,"id":I,...}}; the "steps"
   * thread's events have "cat":"step" */
  size_t n = 0, cap = 1024;
  task_time *tt = malloc(cap * sizeof *tt);
  for (const char *at = text; tt != NULL &&
                              (at = strstr(at, "\"cat\":\"")) != NULL;) {
    at += 7;
    if (strncmp(at, "step\"", 5) == 0)
      continue;
    const char *dur = strstr(at, "\"dur\":"), *id = strstr(at, "\"id\":");
    if (dur == NULL || id == NULL)
      break;
    if (n == cap) {
      task_time *grown = realloc(tt, 2 * cap * sizeof *tt);
      if (grown == NULL)
        break;
      tt = grown;
      cap *= 2;
    }
    tt[n++] = (task_time){.id = atoi(id + 5), .us = strtod(dur + 6, NULL)};
  }
  if (tt == NULL || n == 0) {
    fprintf(stderr, "bench_serve: the trace holds no task\n");
    exit(1);
  }
  qsort(tt, n, sizeof *tt, cmp_task_time);
  double longest = 0.0;
  int longest_id = -1;
  for (size_t i = 0; i < n;) {
    size_t k = i;
    while (k < n && tt[k].id == tt[i].id)
      k++;
    double median = tt[i + (k - i) / 2].us;
    if (median > longest) {
      longest = median;
      longest_id = tt[i].id;
    }
    i = k;
  }
  free(tt);
  /* the name of its event: the "name" before "id":longest_id */
  char key[64];
  snprintf(key, sizeof key, "\"id\":%d,", longest_id);
  snprintf(name, name_len, "?");
  const char *ev = strstr(text, key);
  if (ev != NULL) {
    const char *start = ev;
    while (start > text && strncmp(start, "{\"name\":\"", 9) != 0)
      start--;
    const char *end = strchr(start + 9, '"');
    if (end != NULL && end > start + 9)
      snprintf(name, name_len, "%.*s", (int)(end - start - 9), start + 9);
  }
  free(text);
  return longest / 1e3;
}

/* Issue 28's targets for a phase of forwards beside training. */
static void print_targets(const char *name, double p99, double p99_alone,
                          double longest, double step, double step_alone,
                          double forwards_per_step, double forward_mean,
                          bool last) {
  double p99_limit = 2.0 * p99_alone + longest;
  double work = forwards_per_step * forward_mean;
  double step_limit = 1.1 * step_alone + work;
  printf("    \"%s\": {\"p99_ms\": %.3f, \"p99_limit_ms\": %.3f, "
         "\"p99_ok\": %s, \"step_median_ms\": %.3f, \"forwards_per_step\": "
         "%.3f, \"forward_work_ms\": %.3f, \"step_limit_ms\": %.3f, "
         "\"step_ok\": %s}%s\n",
         name, p99, p99_limit, p99 <= p99_limit ? "true" : "false", step,
         forwards_per_step, work, step_limit,
         step <= step_limit ? "true" : "false", last ? "" : ",");
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
  char longest_name[128];
  double longest = longest_task_ms(t[0].md.g, 5, longest_name,
                                   sizeof longest_name);
  for (int i = 0; i < 10; i++)
    check(remat_forward(served.g, NULL), "remat_forward");
  pthread_t thread[MAX_TRAINERS];
  for (int i = 0; i < ntrainers; i++)
    if (pthread_create(&thread[i], NULL, train_main, &t[i]) != 0)
      return 1;
  static phase alone = {.name = "alone"}, normal = {.name = "normal"},
               interactive = {.name = "interactive"};
  static double normal_steps[MAX_STEPS], interactive_steps[MAX_STEPS],
      alone_steps[MAX_STEPS];
  int nnormal = 0, ninteractive = 0, nalone = 0, per_round = forwards / ROUNDS;
  /* the training steps (of all trainers) during each phase */
  int steps_normal = 0, steps_interactive = 0;
  for (int r = 0; r < ROUNDS; r++) {
    double t0 = now_ms();
    serve(&served, &alone, per_round);
    double span = now_ms() - t0;
    /* the training alone for as long, and a step of each trainer at least */
    for (int k = 0; k < 3; k++) {
      bool train_alone = k == 0, urgent = (r + k) % 2 == 1;
      int from[MAX_TRAINERS];
      for (int i = 0; i < ntrainers; i++) {
        from[i] = t[i].nsteps;
        atomic_store(&t[i].run, 1);
      }
      if (train_alone) {
        double end = now_ms() + span;
        for (;;) {
          bool each = true;
          for (int i = 0; i < ntrainers; i++)
            each &= t[i].nsteps > from[i];
          if (each && now_ms() >= end)
            break;
          struct timespec pause = {0, 1000000};
          nanosleep(&pause, NULL);
        }
      } else {
        check(remat_graph_priority(served.g,
                                   urgent ? REMAT_PRIORITY_INTERACTIVE
                                          : REMAT_PRIORITY_NORMAL),
              "remat_graph_priority");
        serve(&served, urgent ? &interactive : &normal, per_round);
      }
      for (int i = 0; i < ntrainers; i++)
        atomic_store(&t[i].run, 0);
      struct timespec pause = {0, 200000000}; /* the steps in flight end */
      nanosleep(&pause, NULL);
      for (int i = 0; i < ntrainers; i++)
        for (int s = from[i]; s < t[i].nsteps; s++) {
          if (train_alone) {
            if (nalone < MAX_STEPS)
              alone_steps[nalone++] = t[i].step_ms[s];
          } else if (urgent) {
            steps_interactive++;
            if (ninteractive < MAX_STEPS)
              interactive_steps[ninteractive++] = t[i].step_ms[s];
          } else {
            steps_normal++;
            if (nnormal < MAX_STEPS)
              normal_steps[nnormal++] = t[i].step_ms[s];
          }
        }
    }
  }
  for (int i = 0; i < ntrainers; i++) {
    atomic_store(&t[i].stop, 1);
    pthread_join(thread[i], NULL);
  }
  double forward_mean = mean(alone.ms, alone.n);
  double step_alone = quantile(alone_steps, nalone, 0.5);
  double step_normal = quantile(normal_steps, nnormal, 0.5);
  double step_interactive = quantile(interactive_steps, ninteractive, 0.5);
  printf("{\n  \"serve_model\": \"gpt 2x64 seq 32 batch 1\",\n"
         "  \"train_model\": \"gpt %dx%d seq 64 batch 4\",\n"
         "  \"trainers\": %d,\n",
         layers, width, ntrainers);
  print_phase(&alone, 0.0);
  printf("  \"train_alone\": {\"steps\": %d, \"train_step_median_ms\": "
         "%.3f},\n  \"longest_task_ms\": %.3f,\n  \"longest_task\": "
         "\"%s\",\n",
         nalone, step_alone, longest, longest_name);
  print_phase(&normal, step_normal);
  print_phase(&interactive, step_interactive);
  double p99_alone = quantile(alone.ms, alone.n, 0.99);
  /* the forwards that ran per step of one trainer */
  printf("  \"targets\": {\n");
  print_targets("normal", quantile(normal.ms, normal.n, 0.99), p99_alone,
                longest, step_normal, step_alone,
                (double)normal.n * ntrainers /
                    (steps_normal > 0 ? steps_normal : 1),
                forward_mean, false);
  print_targets("interactive",
                quantile(interactive.ms, interactive.n, 0.99), p99_alone,
                longest, step_interactive, step_alone,
                (double)interactive.n * ntrainers /
                    (steps_interactive > 0 ? steps_interactive : 1),
                forward_mean, true);
  printf("  }\n}\n");
  remat_graph_destroy(served.g);
  for (int i = 0; i < ntrainers; i++)
    remat_graph_destroy(t[i].md.g);
  remat_runtime_destroy(rt);
  return 0;
}
