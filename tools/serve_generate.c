/* remat-serve's generation: one thread runs the forward-only graph of the
 * model (train_eval.c's, with the model's --batch rows) for every request
 * at once. Requests queue up; at each token, every free row takes the
 * next waiting request, one forward pass gives every row its next token's
 * logits, and each row draws its token (train_sample.c's sample_pick, with
 * its own seed), so a request's tokens do not depend on what runs beside
 * it. A finished request leaves its row to the next one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/serve.h"

/* After SIGTERM, the seconds that running requests have to finish (the
 * server exits within 10 s); then they are answered 503. */
#define GEN_STOP_S 5.0

typedef struct gen_req {
  const gen_params *p;
  int32_t *ctx;   /* prompt, then the tokens drawn */
  int n, total;
  uint64_t rng;
  /* finished: written by the generation thread alone, outside q->lock;
   * done: written under q->lock once the request has left its row, and
   * the only field gen_run reads while it waits. After done, the
   * generation thread never touches the request again (it lives on
   * gen_run's stack). */
  int finished, done, status;
  char err[256];
  struct gen_req *next;
} gen_req;

struct gen_queue {
  eval_model *e;
  int rows, vocab;
  pthread_mutex_t lock;
  pthread_cond_t wake, done_cv;
  gen_req *head, *tail; /* waiting for a row */
  int queued, nactive;
  gen_req **active;     /* [rows] */
  int stop;             /* 1: no new requests; 2: the thread ends */
  double deadline;      /* after stop 1: running requests end by then */
  pthread_t thread;
  int started;
  pthread_mutex_t model; /* held around a forward pass and a load */
  void *scratch;         /* sample_pick's */
  const int32_t **ctx;   /* [rows]: a forward pass's rows */
  int *n;
  const float **logits;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One forward pass for the active rows and a token for each. */
static void gen_tokens(gen_queue *q) {
  const int32_t **ctx = q->ctx;
  int *n = q->n;
  const float **logits = q->logits;
  for (int r = 0; r < q->nactive; r++) {
    ctx[r] = q->active[r]->ctx;
    n[r] = q->active[r]->n;
  }
  pthread_mutex_lock(&q->model);
  remat_status s = evaluator_next_rows(q->e, ctx, n, q->nactive, logits);
  for (int r = 0; r < q->nactive; r++) {
    gen_req *g = q->active[r];
    if (s != REMAT_OK) {
      g->status = 500;
      snprintf(g->err, sizeof g->err, "the forward pass failed: %s",
               remat_last_error());
      g->finished = 1;
      continue;
    }
    const gen_params *p = g->p;
    g->ctx[g->n++] = sample_pick(logits[r], q->vocab, p->temperature,
                                 p->top_k, &g->rng, q->scratch);
    if (g->n == g->total) {
      g->status = 200;
      g->finished = 1;
    }
  }
  pthread_mutex_unlock(&q->model);
}

static void *gen_thread(void *arg) {
  gen_queue *q = arg;
  pthread_mutex_lock(&q->lock);
  for (;;) {
    while (q->nactive == 0 && q->head == NULL && q->stop < 2)
      pthread_cond_wait(&q->wake, &q->lock);
    if (q->nactive == 0 && q->head == NULL)
      break; /* stop 2 with nothing left */
    while (q->nactive < q->rows && q->head != NULL) {
      gen_req *g = q->head;
      q->head = g->next;
      if (q->head == NULL)
        q->tail = NULL;
      q->queued--;
      q->active[q->nactive++] = g;
    }
    pthread_mutex_unlock(&q->lock);
    gen_tokens(q);
    pthread_mutex_lock(&q->lock);
    if (q->stop > 0 && now() > q->deadline)
      for (int r = 0; r < q->nactive; r++) {
        gen_req *g = q->active[r];
        if (g->finished)
          continue;
        g->status = 503;
        snprintf(g->err, sizeof g->err, "the server is shutting down: the "
                 "request was stopped after %d of its %d tokens",
                 g->n - g->p->n, g->p->max_tokens);
        g->finished = 1;
      }
    int kept = 0;
    for (int r = 0; r < q->nactive; r++) {
      gen_req *g = q->active[r];
      if (g->finished)
        g->done = 1; /* last touch: gen_run may return once q->lock drops */
      else
        q->active[kept++] = g;
    }
    if (kept < q->nactive)
      pthread_cond_broadcast(&q->done_cv);
    q->nactive = kept;
  }
  pthread_mutex_unlock(&q->lock);
  return NULL;
}

int gen_start(server *s, char *err, size_t err_len) {
  gen_queue *q = calloc(1, sizeof *q);
  if (q == NULL) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  s->gen = q;
  q->rows = s->o.cfg.batch;
  q->vocab = s->o.cfg.vocab;
  pthread_mutex_init(&q->lock, NULL);
  pthread_mutex_init(&q->model, NULL);
  pthread_cond_init(&q->wake, NULL);
  pthread_cond_init(&q->done_cv, NULL);
  q->active = calloc((size_t)q->rows, sizeof *q->active);
  q->scratch = malloc(sample_scratch_size(q->vocab));
  q->ctx = calloc((size_t)q->rows, sizeof *q->ctx);
  q->n = calloc((size_t)q->rows, sizeof *q->n);
  q->logits = calloc((size_t)q->rows, sizeof *q->logits);
  if (q->active == NULL || q->scratch == NULL || q->ctx == NULL ||
      q->n == NULL || q->logits == NULL) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  remat_status st = evaluator_open_rows(s->rt, &s->o, q->rows, &q->e);
  if (st == REMAT_OK)
    st = s->o.init != NULL ? evaluator_load_init(q->e, s->o.init)
                           : evaluator_load(q->e, s->load_path);
  if (st != REMAT_OK) {
    snprintf(err, err_len, "the generation graph: %s", train_last_error());
    return -1;
  }
  if (pthread_create(&q->thread, NULL, gen_thread, q) != 0) {
    snprintf(err, err_len, "cannot start the generation thread");
    return -1;
  }
  q->started = 1;
  return 0;
}

int gen_run(server *s, const gen_params *p, int32_t **tokens, int *n,
            double *seconds, char *err, size_t err_len) {
  gen_queue *q = s->gen;
  double start = now();
  gen_req g = {.p = p, .n = p->n, .total = p->n + p->max_tokens,
               .rng = p->seed};
  g.ctx = malloc((size_t)g.total * sizeof *g.ctx);
  if (g.ctx == NULL) {
    snprintf(err, err_len, "out of memory for %d tokens", g.total);
    return 500;
  }
  memcpy(g.ctx, p->prompt, (size_t)p->n * sizeof *g.ctx);
  pthread_mutex_lock(&q->lock);
  int status = 0;
  if (q->stop > 0 || atomic_load(&s->stopping)) {
    status = 503;
    snprintf(err, err_len, "the server is shutting down: send no more "
             "requests");
  } else if (q->queued + q->nactive >= s->max_queue) {
    status = 503;
    snprintf(err, err_len, "the queue is full: %d requests are waiting or "
             "running (--max-queue %d); retry later", q->queued + q->nactive,
             s->max_queue);
  }
  if (status != 0) {
    pthread_mutex_unlock(&q->lock);
    free(g.ctx);
    return status;
  }
  if (q->tail != NULL)
    q->tail->next = &g;
  else
    q->head = &g;
  q->tail = &g;
  q->queued++;
  pthread_cond_signal(&q->wake);
  while (!g.done)
    pthread_cond_wait(&q->done_cv, &q->lock);
  pthread_mutex_unlock(&q->lock);
  if (g.status != 200) {
    snprintf(err, err_len, "%s", g.err);
    free(g.ctx);
    return g.status;
  }
  *tokens = g.ctx;
  *n = g.total;
  *seconds = now() - start;
  return 200;
}

int gen_load(server *s, const char *path, char *err, size_t err_len) {
  gen_queue *q = s->gen;
  pthread_mutex_lock(&q->model);
  remat_status st = evaluator_load(q->e, path);
  if (st != REMAT_OK)
    snprintf(err, err_len, "%s", remat_last_error());
  pthread_mutex_unlock(&q->model);
  return st == REMAT_OK ? 0 : -1;
}

int gen_depth(server *s) {
  gen_queue *q = s->gen;
  pthread_mutex_lock(&q->lock);
  int n = q->queued + q->nactive;
  pthread_mutex_unlock(&q->lock);
  return n;
}

int64_t gen_peak(server *s) {
  gen_queue *q = s->gen;
  pthread_mutex_lock(&q->model);
  int64_t peak = evaluator_peak(q->e);
  pthread_mutex_unlock(&q->model);
  return peak;
}

void gen_stop(server *s, int stage) {
  gen_queue *q = s->gen;
  if (q == NULL)
    return;
  pthread_mutex_lock(&q->lock);
  q->stop = stage;
  q->deadline = now() + GEN_STOP_S;
  if (stage == 1)
    for (gen_req *g = q->head; g != NULL; g = g->next) {
      g->status = 503;
      snprintf(g->err, sizeof g->err, "the server is shutting down: the "
               "request was not started");
      g->done = 1;
    }
  if (stage == 1) {
    q->head = q->tail = NULL;
    q->queued = 0;
  }
  pthread_cond_broadcast(&q->done_cv);
  pthread_cond_broadcast(&q->wake);
  pthread_mutex_unlock(&q->lock);
  if (stage < 2)
    return;
  if (q->started)
    pthread_join(q->thread, NULL);
  evaluator_close(q->e);
  free(q->active);
  free(q->scratch);
  free(q->ctx);
  free(q->n);
  free(q->logits);
  pthread_mutex_destroy(&q->lock);
  pthread_mutex_destroy(&q->model);
  pthread_cond_destroy(&q->wake);
  pthread_cond_destroy(&q->done_cv);
  free(q);
  s->gen = NULL;
}
