/* The rule by which a worker chooses its next task, as pure functions of
 * what it sees (priorities, sizes, nodes): no threads, no atomics, no
 * queues. sched/run.c applies it to the live queues and the replay
 * (sched/replay.c: the planner's predicted step time and the scaling
 * simulator, benchmarks/sim) to its simulated ones, so they cannot drift
 * apart. The victims' order is sched_steal_order (sched.h). */
#ifndef REMAT_SCHED_PICK_H
#define REMAT_SCHED_PICK_H

#include <stdbool.h>
#include <stdint.h>

/* Roots are handed out in batches of about a (2 * workers)-th of those
 * left, at most this many (guided scheduling). */
#define SCHED_ROOT_BATCH_MAX 128

/* Where a worker takes its next task from (see sched_pick_source). */
typedef enum sched_source {
  SCHED_FROM_HEAP,  /* the top of its own ready heap */
  SCHED_FROM_INBOX, /* the head (oldest) of its node's affinity inbox */
  SCHED_FROM_ROOT,  /* the next root (its claimed batch, else a new one) */
  SCHED_FROM_STEAL  /* the top of another worker's heap, nearest first */
} sched_source;

/* What a worker sees when it looks for a task. A priority is INT32_MIN
 * where there is no task (as is a task's of that priority: hence the
 * flags). */
typedef struct sched_view {
  int32_t heap_top;  /* priority of its own heap's top */
  int32_t root_prio; /* priority of the next root it would take (read
                        only when heap_top is not INT32_MIN) */
  bool heap_ready;   /* its heap holds tasks */
  bool root_ready;   /* a root is left (in its batch or to claim) */
  bool inbox_ready;  /* its node's inbox holds tasks */
} sched_view;

/* Whether the continuation (priority `prio`, a successor that the task
 * just finished made ready) runs next on the same worker: unless a task of
 * strictly higher priority waits on top of the worker's heap or as its
 * next root. */
static inline bool sched_keeps_continuation(int32_t prio, int32_t heap_top,
                                            int32_t root_prio) {
  return heap_top <= prio && root_prio <= prio;
}

/* Whether a successor with affinity `task_node` (-1: none) may be the
 * continuation of a worker of node `worker_node`; if not it goes to its
 * node's inbox. */
static inline bool sched_may_continue(int task_node, int worker_node) {
  return task_node < 0 || task_node == worker_node;
}

/* Whether a worker takes its own heap's top first: when it outranks (or
 * ties) the next root. */
static inline bool sched_heap_first(int32_t heap_top, int32_t root_prio) {
  return heap_top != INT32_MIN && heap_top >= root_prio;
}

/* Where a worker that has no continuation looks: its heap when that
 * outranks the roots, else its node's inbox, else the roots, else its heap
 * (tasks of priority INT32_MIN), else it steals. Callers whose view may be
 * stale (run.c's) go on down the same order, inbox, roots, heap, steal,
 * when the source picked turns out empty. */
static inline sched_source sched_pick_source(sched_view v) {
  if (v.heap_ready && sched_heap_first(v.heap_top, v.root_prio))
    return SCHED_FROM_HEAP;
  if (v.inbox_ready)
    return SCHED_FROM_INBOX;
  if (v.root_ready)
    return SCHED_FROM_ROOT;
  return v.heap_ready ? SCHED_FROM_HEAP : SCHED_FROM_STEAL;
}

/* How many roots a worker claims at once when `first` of `nroots` are
 * taken, with `nworkers` workers (at least 1 when any is left). */
static inline int32_t sched_root_batch(int32_t nroots, int32_t first,
                                       int nworkers) {
  int32_t batch = (nroots - first) / (2 * nworkers);
  return batch < 1 ? 1 : batch > SCHED_ROOT_BATCH_MAX ? SCHED_ROOT_BATCH_MAX
                                                      : batch;
}

#endif
