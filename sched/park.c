/* Sleeping and waking of idle workers, per NUMA node, with a sleeper count
 * checked Dekker-style so that no wakeup is lost; queueing a ready task
 * with the wakeup it needs; and the clock. The pool (between runs), the
 * run loop and memory admission (inside a run) use these. */
#include <time.h>

#include "sched/sched_internal.h"

int64_t sched_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Whether some live run may have a task for w (or the pool stops). The
 * loads are seq_cst: with the seq_cst increment of the sleeper count
 * before them and the seq_cst size store and sleeper-count load of a
 * pusher, either the pusher sees the sleeper or the sleeper sees the task.
 * Only atomics of a run are read (a run may end meanwhile: a stale answer
 * costs a spurious wakeup at most). */
bool sched_any_work(const sched_worker *w) {
  sched_pool *pool = w->pool;
  if (atomic_load(&pool->shutdown))
    return true;
  unsigned live = atomic_load(&pool->live_mask);
  for (int c = 0; c < SCHED_NUM_CLASSES; c++) {
    if (!(live & (1u << c)))
      continue;
    sched_run_state *run = &pool->runs[c];
    if (atomic_load(&run->inbox[w->node].queue.size) > 0 ||
        atomic_load(&run->root_cursor) < atomic_load(&run->nroots))
      return true;
    for (int v = 0; v < pool->nworkers; v++)
      if (atomic_load(&run->workers[v].ready.size) > 0)
        return true;
  }
  return false;
}

void sched_sleep_until_work(sched_worker *w) {
  sched_node *node = &w->pool->nodes[w->node];
  pthread_mutex_lock(&node->mutex);
  atomic_fetch_add(&node->sleepers, 1);
  while (!sched_any_work(w))
    pthread_cond_wait(&node->cond, &node->mutex);
  atomic_fetch_sub(&node->sleepers, 1);
  pthread_mutex_unlock(&node->mutex);
}

/* Wakes one sleeper of `node`, if it has any. Callers have just stored a
 * queue size seq_cst; this load is seq_cst too (see sched_any_work). */
void sched_wake_node(sched_pool *pool, int node) {
  sched_node *n = &pool->nodes[node];
  if (atomic_load(&n->sleepers) == 0)
    return;
  pthread_mutex_lock(&n->mutex);
  pthread_cond_signal(&n->cond);
  pthread_mutex_unlock(&n->mutex);
}

/* Wakes every worker: a run starts, or the pool stops. */
void sched_wake_all(sched_pool *pool) {
  for (int n = 0; n < pool->place.nnodes; n++) {
    pthread_mutex_lock(&pool->nodes[n].mutex);
    pthread_cond_broadcast(&pool->nodes[n].cond);
    pthread_mutex_unlock(&pool->nodes[n].mutex);
  }
}

/* Wakes a sleeper for a task just pushed on a heap: one of this worker's
 * node if any sleeps, else of the nearest node that has one (in the order
 * of sched_steal_order). */
static void wake_for_push(sched_worker *w) {
  sched_pool *pool = w->pool;
  int nnodes = pool->place.nnodes;
  for (int x = 0; x < 2 * nnodes; x++) {
    int node = w->node ^ x;
    if (node < nnodes && atomic_load(&pool->nodes[node].sleepers) > 0) {
      sched_wake_node(pool, node);
      return;
    }
  }
}

void sched_push_ready(sched_worker *w, int32_t task) {
  sched_run_state *run = w->run;
  int node = w->dag->tasks[task].numa_node;
  if (node < 0) {
    sched_heap_push(sched_own_heap(w), w->dag, run->links, task);
    wake_for_push(w);
  } else {
    sched_queue_push(&run->inbox[node].queue, run->links, task);
    sched_wake_node(w->pool, node);
  }
}
