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

bool sched_admit_prepare(sched_run_state *run, const sched_dag *dag,
                         int64_t bound) {
  run->admit_bound = dag->nadmit > 0 && bound > 0 ? bound : 0;
  if (run->admit_bound == 0)
    return true;
  if (dag->nadmit > run->admit_capacity) {
    free(run->admit_state);
    run->admit_state = remat__malloc((size_t)dag->nadmit);
    run->admit_capacity = run->admit_state ? dag->nadmit : 0;
    if (!run->admit_state) {
      run->admit_bound = 0;
      return false;
    }
  }
  memset(run->admit_state, ADMIT_NOT_READY, (size_t)dag->nadmit);
  run->admit_used = 0;
  run->admit_next = 0;
  return true;
}

/* Under the lock. Whether the next rank may start now: it fits beside
 * what is held, or nothing is held (a task bigger than the bound alone
 * could never fit), or the run failed (skipped bodies allocate nothing). */
static bool next_fits(const sched_run_state *run, const sched_dag *dag) {
  int64_t bytes = dag->admit_bytes[run->admit_next];
  return run->admit_used + bytes <= run->admit_bound ||
         run->admit_used == 0 ||
         atomic_load_explicit(&run->error_status, memory_order_relaxed) != 0;
}

/* Under the lock: admits waiting ranks from the next one on while they
 * fit, at most `max`, into out; returns how many. */
static int take(sched_run_state *run, const sched_dag *dag, int32_t *out,
                int max) {
  int n = 0;
  while (n < max && run->admit_next < dag->nadmit &&
         run->admit_state[run->admit_next] == ADMIT_WAITING &&
         next_fits(run, dag)) {
    run->admit_used += dag->admit_bytes[run->admit_next];
    run->admit_state[run->admit_next] = ADMIT_ADMITTED;
    out[n++] = dag->admit_task[run->admit_next++];
  }
  return n;
}

/* Queues on w the tasks of batch[0..n) but `keep` (which the caller
 * runs), then admits and queues what else fits. */
static void queue_admitted(sched_worker *w, const int32_t *batch, int n,
                           int32_t keep) {
  sched_run_state *run = w->run;
  int32_t more[ADMIT_BATCH];
  for (;;) {
    for (int i = 0; i < n; i++)
      if (batch[i] != keep)
        sched_push_ready(w, batch[i]);
    if (n < ADMIT_BATCH)
      return;
    sched_spin_lock(&run->admit_lock);
    n = take(run, w->dag, more, ADMIT_BATCH);
    sched_spin_unlock(&run->admit_lock);
    batch = more;
  }
}

/* A rank moves from waiting to admitted only in take, under the lock, and
 * whoever took it queues it (or runs it, when it is the task in hand):
 * so each admitted task is run once. */
bool sched_admit(sched_worker *w, int32_t task) {
  sched_run_state *run = w->run;
  if (run->admit_bound == 0)
    return true;
  int32_t rank = w->dag->info[task].admit_rank, batch[ADMIT_BATCH];
  int n = 0;
  sched_spin_lock(&run->admit_lock);
  bool admitted = run->admit_state[rank] == ADMIT_ADMITTED;
  if (!admitted) {
    run->admit_state[rank] = ADMIT_WAITING;
    n = take(run, w->dag, batch, ADMIT_BATCH);
    admitted = run->admit_state[rank] == ADMIT_ADMITTED;
  }
  sched_spin_unlock(&run->admit_lock);
  queue_admitted(w, batch, n, task);
  return admitted;
}

/* Called in a task body: the worker's current run is the task's. */
void sched_release(sched_pool *p, int worker, int64_t bytes) {
  sched_worker *w = &p->workers[worker];
  sched_run_state *run = w->run;
  if (run == NULL || run->admit_bound == 0)
    return;
  int32_t batch[ADMIT_BATCH];
  sched_spin_lock(&run->admit_lock);
  run->admit_used -= bytes;
  int n = take(run, w->dag, batch, ADMIT_BATCH);
  sched_spin_unlock(&run->admit_lock);
  queue_admitted(w, batch, n, -1);
}

void sched_admit_open(sched_worker *w) {
  sched_run_state *run = w->run;
  if (run->admit_bound == 0)
    return;
  int32_t batch[ADMIT_BATCH];
  sched_spin_lock(&run->admit_lock);
  int n = take(run, w->dag, batch, ADMIT_BATCH);
  sched_spin_unlock(&run->admit_lock);
  queue_admitted(w, batch, n, -1);
}
