/* Memory admission (sched_dag_set_admit in sched.h): in a run with a bound,
 * admitted tasks start in rank order and only while the bytes they hold
 * fit the bound. A ready one that does not fit yet, or whose turn has not
 * come, waits aside, on no queue and taking no worker, until a release
 * (or a failure of the run) lets it in; it is then queued like any ready
 * task. One spinlock guards the counters: the runtime admits one task per
 * kernel node, not per tile, so it is taken rarely. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "sched/sched_internal.h"

/* Tasks admitted per lock hold: queued once the lock is dropped. */
#define ADMIT_BATCH 16

bool sched_admit_prepare(sched_pool *pool, const sched_dag *dag,
                         int64_t bound) {
  pool->admit_bound = dag->nadmit > 0 && bound > 0 ? bound : 0;
  if (pool->admit_bound == 0)
    return true;
  if (dag->nadmit > pool->admit_capacity) {
    free(pool->admit_state);
    pool->admit_state = remat__malloc((size_t)dag->nadmit);
    pool->admit_capacity = pool->admit_state ? dag->nadmit : 0;
    if (!pool->admit_state) {
      pool->admit_bound = 0;
      return false;
    }
  }
  memset(pool->admit_state, ADMIT_NOT_READY, (size_t)dag->nadmit);
  pool->admit_used = 0;
  pool->admit_next = 0;
  return true;
}

/* Under the lock. Whether the next rank may start now: it fits beside
 * what is held, or nothing is held (a task bigger than the bound alone
 * could never fit), or the run failed (skipped bodies allocate nothing). */
static bool next_fits(const sched_pool *pool, const sched_dag *dag) {
  int64_t bytes = dag->admit_bytes[pool->admit_next];
  return pool->admit_used + bytes <= pool->admit_bound ||
         pool->admit_used == 0 ||
         atomic_load_explicit(&pool->error_status, memory_order_relaxed) != 0;
}

/* Under the lock: admits waiting ranks from the next one on while they
 * fit, at most `max`, into out; returns how many. */
static int take(sched_pool *pool, const sched_dag *dag, int32_t *out, int max) {
  int n = 0;
  while (n < max && pool->admit_next < dag->nadmit &&
         pool->admit_state[pool->admit_next] == ADMIT_WAITING &&
         next_fits(pool, dag)) {
    pool->admit_used += dag->admit_bytes[pool->admit_next];
    pool->admit_state[pool->admit_next] = ADMIT_ADMITTED;
    out[n++] = dag->admit_task[pool->admit_next++];
  }
  return n;
}

/* Queues on w the tasks of batch[0..n) but `keep` (which the caller
 * runs), then admits and queues what else fits. */
static void queue_admitted(sched_worker *w, const int32_t *batch, int n,
                           int32_t keep) {
  sched_pool *pool = w->pool;
  int32_t more[ADMIT_BATCH];
  for (;;) {
    for (int i = 0; i < n; i++)
      if (batch[i] != keep)
        sched_push_ready(w, batch[i]);
    if (n < ADMIT_BATCH)
      return;
    sched_spin_lock(&pool->admit_lock);
    n = take(pool, w->dag, more, ADMIT_BATCH);
    sched_spin_unlock(&pool->admit_lock);
    batch = more;
  }
}

/* A rank moves from waiting to admitted only in take, under the lock, and
 * whoever took it queues it (or runs it, when it is the task in hand):
 * so each admitted task is run once. */
bool sched_admit(sched_worker *w, int32_t task) {
  sched_pool *pool = w->pool;
  if (pool->admit_bound == 0)
    return true;
  int32_t rank = w->dag->info[task].admit_rank, batch[ADMIT_BATCH];
  int n = 0;
  sched_spin_lock(&pool->admit_lock);
  bool admitted = pool->admit_state[rank] == ADMIT_ADMITTED;
  if (!admitted) {
    pool->admit_state[rank] = ADMIT_WAITING;
    n = take(pool, w->dag, batch, ADMIT_BATCH);
    admitted = pool->admit_state[rank] == ADMIT_ADMITTED;
  }
  sched_spin_unlock(&pool->admit_lock);
  queue_admitted(w, batch, n, task);
  return admitted;
}

void sched_release(sched_pool *pool, int worker, int64_t bytes) {
  if (pool->admit_bound == 0)
    return;
  int32_t batch[ADMIT_BATCH];
  sched_worker *w = &pool->workers[worker];
  sched_spin_lock(&pool->admit_lock);
  pool->admit_used -= bytes;
  int n = take(pool, w->dag, batch, ADMIT_BATCH);
  sched_spin_unlock(&pool->admit_lock);
  queue_admitted(w, batch, n, -1);
}

void sched_admit_open(sched_worker *w) {
  sched_pool *pool = w->pool;
  if (pool->admit_bound == 0)
    return;
  int32_t batch[ADMIT_BATCH];
  sched_spin_lock(&pool->admit_lock);
  int n = take(pool, w->dag, batch, ADMIT_BATCH);
  sched_spin_unlock(&pool->admit_lock);
  queue_admitted(w, batch, n, -1);
}
