/* Re-planning a graph between its own steps: once its first COST_STEPS
 * steps have measured its kernels (step_costs.h), the graph is planned
 * again with those times, and when the new plan saves other tensors, the
 * step runs the new plan from then on, with the parameters, gradients,
 * optimizer moments, inputs, kept tensors and counters carried over. */
#ifndef REMAT_RUNTIME_EXEC_REPLAN_H
#define REMAT_RUNTIME_EXEC_REPLAN_H

#include "runtime/exec/step_state.h"

/* After a remat_step of g that succeeded, inside the call (so no
 * gradient sums are pending): re-plans once, when the measurements are
 * complete, the graph has a memory budget (a plan without one does not
 * depend on the times), the graph is not data parallel (the ranks would have to agree
 * on one plan) and the runtime was not created with REMAT_BENCH_NO_REPLAN
 * or REMAT_BENCH_ROOFLINE_COSTS; a graph that accumulates
 * (remat_accumulate) is planned under its budget less its sums' bytes.
 * Replaces g->step when the plan changed. A re-plan that fails (out of
 * memory, or no plan fits) leaves the step as it was and records no
 * error: the step that ran succeeded. Returns whether g->step was
 * replaced. */
bool step_replan(remat_graph *g);

#endif
