/* The step time a candidate plan is predicted to take at a thread count:
 * its lowering's task DAG (taskgraph.h, as compile builds it) replayed on
 * simulated workers by the scheduler's own rule (sched/replay.h), each
 * tile lasting its kernel's measured time (costs.h) or, not measured, its
 * roofline cost at COST_FLOPS_PER_SECOND. The planner scores its
 * candidates with it. */
#ifndef REMAT_RUNTIME_PREDICT_H
#define REMAT_RUNTIME_PREDICT_H

#include "runtime/compile/costs.h"
#include "runtime/compile/lowering.h"

/* The scheduler's costs the prediction charges (seconds): per task, and
 * per queue operation; a sleeping worker's wake-up. */
#define PREDICT_TASK_OVERHEAD_S 1.0e-6
#define PREDICT_LOCK_S 8.0e-8
#define PREDICT_WAKE_S 5.0e-6

typedef struct predict_request {
  const remat_graph *g;
  const plan_lowering *low; /* after lifetimes */
  int nworkers, nnodes;     /* simulated: workers dealt evenly to nodes */
  int lookahead;            /* as the runtime's (taskgraph.h) */
  cost_table *costs;        /* NULL: rooflines alone */
} predict_request;

/* One tile of kernel node kn, in seconds. */
double predict_tile_seconds(const plan_lowering *l, const plan_knode *kn,
                            cost_table *costs);

/* The predicted step time of the request's lowering in *seconds. */
remat_status predict_step_seconds(const predict_request *r, double *seconds);

#endif
