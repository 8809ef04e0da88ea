/* The progress thread of a graph (progress.h): it sleeps while no run is
 * in progress; during a run it wakes each min_interval_ms, sums the
 * per-worker counts of finished tasks that the scheduler keeps, and calls
 * the callback with its mutex released, so that a callback that blocks
 * holds up only the end of its own graph's run. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "runtime/exec/progress.h"
#include "sched/sched.h"

#define MAX_INTERVAL_MS 3600000 /* an hour */

struct graph_progress {
  pthread_t thread;
  pthread_mutex_t mutex;
  pthread_cond_t cond; /* any change of the fields below */
  remat_progress_fn fn;
  void *user;
  int64_t interval_ns;
  int64_t due_ns;      /* the next call, on CLOCK_MONOTONIC */
  int64_t ntasks;      /* of the run in progress */
  bool running;        /* a run is in progress */
  bool in_callback;    /* the thread is inside fn */
  bool stop;
  int nworkers;
  _Atomic int64_t *done; /* [nworkers * SCHED_PROGRESS_STRIDE] */
};

static double fraction_done(const struct graph_progress *p) {
  int64_t done = 0;
  for (int w = 0; w < p->nworkers; w++)
    done += atomic_load_explicit(&p->done[w * SCHED_PROGRESS_STRIDE],
                                 memory_order_relaxed);
  if (p->ntasks <= 0 || done >= p->ntasks)
    return 1.0;
  return (double)done / (double)p->ntasks;
}

static struct timespec to_timespec(int64_t ns) {
  return (struct timespec){.tv_sec = ns / 1000000000,
                           .tv_nsec = ns % 1000000000};
}

/* Calls fn once with the mutex released; returns with it held. The next
 * call is due an interval after this one returned, so that calls start
 * at least an interval apart whatever delays the thread. */
static void call_back(struct graph_progress *p) {
  double fraction = fraction_done(p);
  remat_progress_fn fn = p->fn;
  void *user = p->user;
  p->in_callback = true;
  pthread_mutex_unlock(&p->mutex);
  fn(user, fraction);
  pthread_mutex_lock(&p->mutex);
  p->due_ns = sched_now_ns() + p->interval_ns; /* after this call's end */
  p->in_callback = false;
  pthread_cond_broadcast(&p->cond);
}

static void *progress_main(void *arg) {
  struct graph_progress *p = arg;
  pthread_mutex_lock(&p->mutex);
  while (!p->stop) {
    if (!p->running) {
      pthread_cond_wait(&p->cond, &p->mutex);
    } else if (sched_now_ns() < p->due_ns) {
      struct timespec due = to_timespec(p->due_ns);
      pthread_cond_timedwait(&p->cond, &p->mutex, &due);
    } else {
      call_back(p);
    }
  }
  pthread_mutex_unlock(&p->mutex);
  return NULL;
}

void progress_free(struct graph_progress *p) {
  if (p == NULL)
    return;
  pthread_mutex_lock(&p->mutex);
  p->stop = true;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->mutex);
  pthread_join(p->thread, NULL);
  pthread_mutex_destroy(&p->mutex);
  pthread_cond_destroy(&p->cond);
  free(p->done);
  free(p);
}

/* The thread, its counters and its monotonic condition variable. */
static struct graph_progress *progress_create(int nworkers) {
  struct graph_progress *p = remat__calloc(1, sizeof *p);
  if (p == NULL)
    return NULL;
  p->nworkers = nworkers;
  p->done = remat__calloc((size_t)nworkers * SCHED_PROGRESS_STRIDE,
                          sizeof *p->done);
  pthread_condattr_t attr;
  bool ok = p->done != NULL && pthread_condattr_init(&attr) == 0;
  if (ok) {
    ok = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 &&
         pthread_cond_init(&p->cond, &attr) == 0;
    pthread_condattr_destroy(&attr);
  }
  if (ok && pthread_mutex_init(&p->mutex, NULL) != 0) {
    pthread_cond_destroy(&p->cond);
    ok = false;
  }
  if (ok && pthread_create(&p->thread, NULL, progress_main, p) != 0) {
    pthread_mutex_destroy(&p->mutex);
    pthread_cond_destroy(&p->cond);
    ok = false;
  }
  if (ok)
    return p;
  free(p->done);
  free(p);
  return NULL;
}

remat_status progress_set(remat_graph *g, remat_progress_fn fn, void *user,
                          int min_interval_ms) {
  if (fn == NULL) {
    progress_free(g->progress);
    g->progress = NULL;
    return REMAT_OK;
  }
  if (min_interval_ms < 1 || min_interval_ms > MAX_INTERVAL_MS)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_set_progress: min_interval_ms is %d: expected "
                       "1 to %d milliseconds",
                       min_interval_ms, MAX_INTERVAL_MS);
  if (g->progress == NULL)
    g->progress = progress_create(sched_pool_num_workers(g->rt->pool));
  if (g->progress == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "remat_set_progress: out of memory, or no thread, "
                       "for the progress callback");
  struct graph_progress *p = g->progress;
  pthread_mutex_lock(&p->mutex);
  p->fn = fn;
  p->user = user;
  p->interval_ns = (int64_t)min_interval_ms * 1000000;
  pthread_mutex_unlock(&p->mutex);
  return REMAT_OK;
}

_Atomic int64_t *progress_begin(struct graph_progress *p, int64_t ntasks) {
  if (p == NULL)
    return NULL;
  for (int w = 0; w < p->nworkers; w++)
    atomic_store_explicit(&p->done[w * SCHED_PROGRESS_STRIDE], 0,
                          memory_order_relaxed);
  pthread_mutex_lock(&p->mutex);
  p->ntasks = ntasks;
  p->due_ns = sched_now_ns() + p->interval_ns;
  p->running = true;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->mutex);
  return p->done;
}

void progress_end(struct graph_progress *p) {
  if (p == NULL)
    return;
  pthread_mutex_lock(&p->mutex);
  p->running = false;
  pthread_cond_broadcast(&p->cond);
  while (p->in_callback)
    pthread_cond_wait(&p->cond, &p->mutex);
  pthread_mutex_unlock(&p->mutex);
}
