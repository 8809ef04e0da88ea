/* The compiled step: everything compile decides about a graph's step (the
 * remat decision, the lowering with its lifetimes, the NUMA placement, the
 * task DAG, the memory prediction), const once compile returns. What a run
 * changes lives in the step state (exec/step_state.h). The stages, in
 * order, and the function that runs them (compile.c) are declared here. */
#ifndef REMAT_RUNTIME_COMPILED_H
#define REMAT_RUNTIME_COMPILED_H

#include "runtime/compile/dp_layout.h"
#include "runtime/compile/lowering.h"
#include "runtime/compile/memplan.h"
#include "runtime/compile/numa_place.h"
#include "runtime/compile/planner.h"
#include "runtime/compile/taskgraph.h"

typedef struct compiled_step {
  const remat_graph *g;
  int32_t loss;              /* tensor id or -1 */
  bool forward_only;
  bool has_opt;
  remat_optimizer opt;       /* defaults filled in; lr is the initial one
                                (the state's lr is what runs use) */
  int nworkers;
  remat_decision decision;   /* stage "plan remat" */
  plan_lowering low;         /* stages "lower" and "lifetimes" */
  numa_plan numa;            /* stage "NUMA placement" */
  plan_tasks tasks;          /* stage "DAG" */
  plan_dp dp;                /* stage "DAG": the data-parallel tasks */
  memplan_prediction predicted; /* stage "memory prediction" */
} compiled_step;

/* What remat_compile asks of the pipeline. */
typedef struct compile_request {
  remat_graph *g;             /* plan ops and plan remat record on it */
  int32_t loss;               /* tensor id, -1 for a forward-only graph */
  const remat_optimizer *opt; /* NULL: none */
  const task_bodies *bodies;  /* what the DAG's tasks run (exec/tasks.h) */
  int64_t dp_bucket_bytes;    /* a data-parallel graph's allreduce bucket
                                 size; 0: not data parallel */
} compile_request;

/* The stages in order, each in its own file:
 *
 *   plan ops      graph ops            -> oneDNN primitives, kernels
 *                                         (plan_ops.c)
 *   plan remat    graph, policies,     -> saved or recomputed per tensor
 *                 budget                  (planner.c, measuring candidates
 *                                          through measure.c)
 *   lower         graph, decision      -> buffers, kernel nodes in program
 *                                         order, with autodiff (lower.c)
 *   lifetimes     lowering             -> first writer, users, what each
 *                                         node allocates (lifetimes.c)
 *   NUMA          lowering, placement  -> each tile's node and affinity,
 *   placement                             buffer homes and slice layouts,
 *                                         remote bytes (numa_place.c)
 *   DAG           lowering, placement, -> task DAG, task names
 *                 lookahead, bodies,      (taskgraph.c), the data-parallel
 *                 bucket size             tasks (dp_layout.c)
 *   memory        lowering, placement  -> predicted peak, blocks to
 *   prediction                            reserve (memplan.c)
 *   report        all of the above     -> REMAT_VERBOSE's summary on
 *                                         stderr (report.c)
 *
 * Fills `out` (zeroed first); on failure `out` holds nothing and the error
 * is on the graph and in the thread's last error. */
remat_status compile_step(const compile_request *req, compiled_step *out);
/* Plans the graph of `current` again (stage "plan remat" on, the ops and
 * fusions as they are), with the runtime's cost table as it is now, for
 * req (the request `current` was compiled for), leaving `held` bytes of
 * the graph's budget (if it has one) to memory the step does not count,
 * such as remat_accumulate's sums. When the decision saves
 * what `current`'s does, returns REMAT_ERR_STATE and `out` holds nothing;
 * otherwise fills `out` with the new step (REMAT_OK) or holds nothing
 * (another status; the thread's last error has the words). Nothing on
 * the graph changes either way. */
remat_status compile_replan(const compile_request *req,
                            const compiled_step *current, int64_t held,
                            compiled_step *out);
void compiled_step_free(compiled_step *c);

#endif
