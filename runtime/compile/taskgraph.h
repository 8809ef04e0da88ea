/* Stage "DAG": turns the kernel nodes into the scheduler's task DAG (a
 * start task, one task per tile and a done task per node) with data,
 * memory-order and gate edges, and names every node for traces. */
#ifndef REMAT_RUNTIME_TASKGRAPH_H
#define REMAT_RUNTIME_TASKGRAPH_H

#include "runtime/compile/numa_place.h"
#include "runtime/compile/task_names.h"

/* The argument of one tile task. */
typedef struct plan_tile {
  const plan_knode *kn;
  int32_t knode; /* kn's index */
  int64_t tile;
} plan_tile;

/* What the tasks run: the caller's bodies (exec/tasks.c, and for a
 * data-parallel graph runtime/dp/'s), so that compile names no body. Each
 * gets the run's context (sched_run_opts) and, as its argument, a const
 * plan_knode (start, done), plan_tile (tile), dp_bucket_layout (dp_bucket)
 * or plan_dp (dp_agree). */
typedef struct task_bodies {
  sched_task_fn start, tile, done;
  sched_task_fn dp_bucket, dp_agree;
} task_bodies;

/* The output of the stage. */
typedef struct plan_tasks {
  sched_dag *dag;         /* finalized */
  plan_tile *tiles;       /* [ntiles], in the order numa_plan numbers them */
  int64_t ntiles;
  int32_t *start_task;    /* [nknodes]: the node's start task in dag */
  int32_t *done_task;     /* [nknodes]: its done task */
  char *names;            /* [nknodes * TASK_NAME_MAX] (task_names.h) */
} plan_tasks;

typedef struct taskgraph_request {
  const remat_graph *g;
  const plan_lowering *low; /* after lifetimes */
  const numa_plan *numa;    /* each tile's affinity */
  int lookahead;            /* regions whose recompute may run ahead of
                               backward */
  const task_bodies *bodies;
} taskgraph_request;

/* Builds the DAG into `out` without finalizing it (the data-parallel
 * tasks may still be added); taskgraph_finalize freezes it. On failure
 * `out` holds nothing. */
remat_status taskgraph_build(const taskgraph_request *req, plan_tasks *out);
remat_status taskgraph_finalize(plan_tasks *t);
void plan_tasks_free(plan_tasks *t);

#endif
