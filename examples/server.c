/* server.c: remat embedded in a multi-threaded C server. Four host threads
 * each build and train their own tiny GPT on ONE shared runtime while a
 * fifth thread serves forward passes (inference) of another graph; the
 * program checks that every trainer's loss goes down, that a request gives
 * bitwise the same logits every time it is repeated, and that the host's
 * OpenMP setting (omp_get_max_threads) is the same before and after every
 * call into the library. Exits 0 on success; errors go to stderr.
 *
 * How concurrent steps share the workers: a remat_runtime owns one pool of
 * pinned worker threads. Any host thread may call remat_step or
 * remat_forward on any graph of that runtime at any time; the scheduler
 * runs one step's task DAG at a time on all the workers, and other callers
 * wait their turn in a queue of steps, the most urgent class first
 * (remat_graph_priority: this server's forwards are INTERACTIVE, so they
 * wait only for the end of the step in progress). Each graph
 * has its own compiled plan, its own memory (arenas, parameters, optimizer
 * state, kept tensors) and its own feeds, so steps of different graphs never
 * touch each other's data, and a step's results do not depend on what ran
 * before it. Building, compiling, feeding and reading need no workers and
 * run on the calling thread, concurrently with other graphs' steps. One
 * graph must not be used from two host threads at the same time (like a
 * sqlite3 connection); that is the host's job to serialize.
 *
 * The library sets the OpenMP thread count to 1 on its own workers and
 * restores the caller's value around oneDNN primitive creation, so a host
 * thread's omp_set_num_threads survives every call. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remat.h"
#include "remat_gpt.h"

enum { TRAINERS = 4, TRAIN_STEPS = 25, MIN_REQUESTS = 12 };

static const remat_gpt_config train_model = {
    .layers = 1, .d_model = 16, .heads = 2, .seq = 8, .batch = 4, .vocab = 7};
static const remat_gpt_config serve_model = {
    .layers = 2, .d_model = 16, .heads = 4, .seq = 8, .batch = 2, .vocab = 11};

/* One host thread's view: its name for messages and the OpenMP thread
 * count it set for itself, which every library call must leave alone. */
typedef struct host_thread {
  const char *name;
  int omp_threads;
} host_thread;

/* Checks a library call's status and the thread's OpenMP setting after it
 * (the setting before it is the one the previous check saw). */
static bool lib_ok(const host_thread *h, const char *call, remat_status s) {
  int omp_now = omp_get_max_threads();
  if (omp_now != h->omp_threads) {
    fprintf(stderr,
            "%s: %s changed omp_get_max_threads() from %d to %d\n", h->name,
            call, h->omp_threads, omp_now);
    return false;
  }
  if (s != REMAT_OK) {
    fprintf(stderr, "%s: %s failed: %s: %s\n", h->name, call,
            remat_status_string(s), remat_last_error());
    return false;
  }
  return true;
}

#define LIB(h, call) lib_ok((h), #call, (call))

/* A batch whose targets are a function of the token and the previous token,
 * so that a tiny model can learn it; `seed` varies the tokens. */
static void make_batch(const remat_gpt_config *c, uint32_t seed,
                       int32_t *tokens, int32_t *targets) {
  uint32_t x = seed * 2654435761u + 12345u;
  for (int b = 0; b < c->batch; b++)
    for (int t = 0; t < c->seq; t++) {
      x = x * 1664525u + 1013904223u;
      int i = b * c->seq + t;
      tokens[i] = (int32_t)((x >> 16) % (uint32_t)c->vocab);
      targets[i] = (int32_t)((tokens[i] * 3 + (t > 0 ? tokens[i - 1] : 0)) %
                             c->vocab);
    }
}

/* A graph of the runtime with a GPT built and compiled: for training
 * (with AdamW) or, with `forward_only`, for serving with the logits kept. */
typedef struct model {
  remat_graph *g;
  remat_gpt m;
  remat_gpt_config cfg;
  int32_t tokens[64], targets[64];
} model;

static bool model_open(const host_thread *h, remat_runtime *rt, model *md,
                       const remat_gpt_config *cfg, uint64_t seed,
                       bool forward_only) {
  memset(md, 0, sizeof *md);
  md->cfg = *cfg;
  remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  if (!LIB(h, remat_graph_create(rt, &md->g)) ||
      !LIB(h, remat_graph_seed(md->g, seed)) ||
      !LIB(h, remat_gpt_build(md->g, cfg, &md->m)))
    return false;
  if (forward_only)
    return LIB(h, remat_keep(md->g, md->m.logits)) &&
           LIB(h, remat_compile(md->g, NULL, NULL));
  return LIB(h, remat_compile(md->g, md->m.loss, &adamw));
}

static bool model_feed(const host_thread *h, model *md, uint32_t batch_seed) {
  size_t bytes = (size_t)md->cfg.batch * (size_t)md->cfg.seq * sizeof(int32_t);
  make_batch(&md->cfg, batch_seed, md->tokens, md->targets);
  return LIB(h, remat_feed(md->g, md->m.tokens, md->tokens, bytes)) &&
         LIB(h, remat_feed(md->g, md->m.targets, md->targets, bytes));
}

static void model_close(const host_thread *h, model *md, bool *ok) {
  remat_graph_destroy(md->g);
  md->g = NULL;
  *ok = lib_ok(h, "remat_graph_destroy", REMAT_OK) && *ok;
}

typedef struct trainer {
  host_thread host;
  remat_runtime *rt;
  int index;
  float first_loss, last_loss;
  bool ok;
} trainer;

static atomic_int trainers_running = TRAINERS;

static void *train_main(void *arg) {
  trainer *t = arg;
  omp_set_num_threads(t->host.omp_threads);
  model md;
  bool ok = model_open(&t->host, t->rt, &md, &train_model,
                       100 + (uint64_t)t->index, false) &&
            model_feed(&t->host, &md, 1 + (uint32_t)t->index);
  for (int s = 0; ok && s < TRAIN_STEPS; s++) {
    remat_step_stats st = {.size = sizeof st};
    ok = LIB(&t->host, remat_step(md.g, &st));
    if (ok && s == 0)
      t->first_loss = st.loss;
    t->last_loss = st.loss;
  }
  if (ok && !(t->last_loss < 0.8f * t->first_loss)) {
    fprintf(stderr, "%s: loss went from %.4f to %.4f in %d steps\n",
            t->host.name, t->first_loss, t->last_loss, TRAIN_STEPS);
    ok = false;
  }
  model_close(&t->host, &md, &ok);
  t->ok = ok;
  atomic_fetch_sub(&trainers_running, 1);
  return NULL;
}

typedef struct server {
  host_thread host;
  remat_runtime *rt;
  int requests;
  bool ok;
} server;

/* Serves request kinds 0 and 1 (two token batches) in turn until the
 * trainers are done; each answer must equal the first answer of its kind
 * bit for bit, and the two kinds must differ. */
static bool serve(server *sv, model *md, float *answer, float *first[2]) {
  size_t bytes = (size_t)remat_tensor_numel(md->m.logits) * sizeof(float);
  for (int r = 0; r < MIN_REQUESTS || atomic_load(&trainers_running) > 0;
       r++) {
    int kind = r % 2;
    float *dst = r < 2 ? first[kind] : answer;
    if (!model_feed(&sv->host, md, 1000 + (uint32_t)kind) ||
        !LIB(&sv->host, remat_forward(md->g, NULL)) ||
        !LIB(&sv->host, remat_read(md->g, md->m.logits, dst, bytes)))
      return false;
    for (size_t i = 0; i < bytes / sizeof(float); i++)
      if (!isfinite(dst[i])) {
        fprintf(stderr, "%s: request %d: logit %zu is %g\n", sv->host.name, r,
                i, dst[i]);
        return false;
      }
    if (r >= 2 && memcmp(answer, first[kind], bytes) != 0) {
      fprintf(stderr, "%s: request %d (kind %d) differs from the first\n",
              sv->host.name, r, kind);
      return false;
    }
    if (r == 1 && memcmp(first[0], first[1], bytes) == 0) {
      fprintf(stderr, "%s: two different batches gave the same logits\n",
              sv->host.name);
      return false;
    }
    sv->requests = r + 1;
  }
  return true;
}

static void *serve_main(void *arg) {
  server *sv = arg;
  omp_set_num_threads(sv->host.omp_threads);
  model md;
  bool ok = model_open(&sv->host, sv->rt, &md, &serve_model, 7, true);
  /* Its forwards go ahead of the trainers' queued steps. */
  ok = ok && LIB(&sv->host,
                 remat_graph_priority(md.g, REMAT_PRIORITY_INTERACTIVE));
  size_t n = (size_t)serve_model.batch * serve_model.seq * serve_model.vocab;
  float *answer = malloc(n * sizeof *answer);
  float *first[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
  if (answer == NULL || first[0] == NULL || first[1] == NULL) {
    fprintf(stderr, "%s: out of memory\n", sv->host.name);
    ok = false;
  }
  ok = ok && serve(sv, &md, answer, first);
  model_close(&sv->host, &md, &ok);
  free(answer);
  free(first[0]);
  free(first[1]);
  sv->ok = ok;
  return NULL;
}

int main(void) {
  /* The host's own OpenMP setting, which the library must not change. */
  host_thread main_host = {.name = "main", .omp_threads = 3};
  omp_set_num_threads(main_host.omp_threads);
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 2};
  remat_runtime *rt = NULL;
  if (!LIB(&main_host, remat_runtime_create(&rc, &rt)))
    return 1;

  static const char *const names[TRAINERS] = {"trainer0", "trainer1",
                                              "trainer2", "trainer3"};
  trainer trainers[TRAINERS];
  server sv = {.host = {.name = "server", .omp_threads = 2}, .rt = rt};
  pthread_t threads[TRAINERS + 1];
  int started = 0;
  bool ok = true;
  for (int i = 0; i < TRAINERS; i++) {
    trainers[i] = (trainer){.host = {.name = names[i], .omp_threads = 4 + i},
                            .rt = rt,
                            .index = i};
    if (pthread_create(&threads[started], NULL, train_main, &trainers[i]) != 0)
      ok = false;
    else
      started++;
  }
  if (ok && pthread_create(&threads[started], NULL, serve_main, &sv) == 0)
    started++;
  else
    ok = false;
  for (int i = 0; i < started; i++)
    pthread_join(threads[i], NULL);
  if (!ok) {
    fprintf(stderr, "main: cannot start the host threads\n");
    remat_runtime_destroy(rt);
    return 1;
  }

  for (int i = 0; i < TRAINERS; i++) {
    ok = ok && trainers[i].ok;
    printf("%s: loss %.4f -> %.4f in %d steps\n", names[i],
           trainers[i].first_loss, trainers[i].last_loss, TRAIN_STEPS);
  }
  ok = ok && sv.ok;
  printf("server: %d forward requests, each identical to the first of its "
         "kind\n",
         sv.requests);
  remat_runtime_destroy(rt);
  ok = lib_ok(&main_host, "remat_runtime_destroy", REMAT_OK) && ok;
  if (!ok) {
    fprintf(stderr, "server example: FAILED\n");
    return 1;
  }
  printf("server example: ok\n");
  return 0;
}
