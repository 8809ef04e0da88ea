/* Replaying a task DAG on simulated workers by the scheduler's own rule:
 * each of `nworkers` workers, split evenly over `nnodes` nodes, picks its
 * next task as sched/run.c does (continuation, own heap by priority, its
 * node's inbox for tasks with an affinity, roots in batches, stealing near
 * before far) by calling that rule's code, sched_pick.h and
 * sched_steal_order. The engine models a per-task overhead, queue locks
 * held for a fixed time and idle workers that spin, then sleep and are
 * woken; how long a task runs is a runner's answer. The planner replays a
 * plan with fixed task durations (sched_replay_fixed); the scaling
 * simulator (benchmarks/sim) with its own runner, which shares memory
 * bandwidth among running tasks. */
#ifndef REMAT_SCHED_REPLAY_H
#define REMAT_SCHED_REPLAY_H

#include <stdint.h>

/* The DAG replayed. */
typedef struct sched_replay_dag {
  int32_t ntasks;
  const int32_t *prio;       /* [ntasks] higher runs first */
  const int32_t *npred;      /* [ntasks] predecessors */
  const int64_t *succ_first; /* [ntasks + 1] into succ */
  const int32_t *succ;       /* each task's list highest priority first */
  const int32_t *roots;      /* tasks without predecessors, highest
                                priority first */
  int32_t nroots;
  const int8_t *node;        /* [ntasks] affinity node, -1 none; NULL: no
                                task has one */
} sched_replay_dag;

/* The scheduler's own costs, in seconds. */
typedef struct sched_replay_timing {
  double overhead_s;  /* per task, between being picked and starting */
  double lock_s;      /* one operation on a queue of the worker's node */
  double lock_remote; /* factor for a queue of another node */
  double signal_s;    /* waking a sleeping worker, paid by the waker */
  double wake_s;      /* a woken worker's delay before it looks */
  double spin_s;      /* an idle worker looks this long, then sleeps */
} sched_replay_timing;

/* How tasks run. The engine tells the runner when a task starts (at the
 * time last passed to advance) and ends one when the runner says it ends;
 * it moves time forward only through advance. */
typedef struct sched_replay_runner {
  void *ctx;
  /* `task` starts on `worker` of `node`; 0 when memory runs out. */
  int (*start)(void *ctx, int32_t task, int worker, int node);
  /* The earliest end of a running task, its worker in *worker; INFINITY
   * when none runs. */
  double (*next_end)(void *ctx, int *worker);
  /* Time moves to t. */
  void (*advance)(void *ctx, double t);
  /* The task of `worker` ends now. */
  void (*end)(void *ctx, int32_t task, int worker);
} sched_replay_runner;

/* The replay view of a finalized sched_dag (sched.h): its priorities,
 * successor lists, roots (all of them, in the DAG's order; a root with an
 * affinity is replayed as one without) and affinities, in arrays that
 * `owned` holds. Returns 1, or 0 when memory runs out (nothing held). */
typedef struct sched_replay_owned {
  int32_t *prio, *npred, *succ, *roots;
  int64_t *succ_first;
  int8_t *node;
} sched_replay_owned;
struct sched_dag;
int sched_replay_dag_of(const struct sched_dag *dag, sched_replay_dag *out,
                        sched_replay_owned *owned);
void sched_replay_owned_free(sched_replay_owned *owned);

/* Replays d; *makespan gets the last task's end (the first starts at 0).
 * Returns 1, or 0 when memory runs out, a task is left that can never run
 * (a cycle), or nnodes is not in 1..nworkers. */
int sched_replay(const sched_replay_dag *d, int nworkers, int nnodes,
                 const sched_replay_timing *tm, const sched_replay_runner *r,
                 double *makespan);

/* sched_replay with a fixed duration per task (seconds[task]): the
 * makespan, or -1 where sched_replay returns 0. */
double sched_replay_fixed(const sched_replay_dag *d, int nworkers, int nnodes,
                          const sched_replay_timing *tm,
                          const double *seconds);

#endif
