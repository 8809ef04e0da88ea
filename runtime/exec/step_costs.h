/* The task times of a graph's first runs into the runtime's cost table
 * (compile/costs.h): each op kernel's time per tile, so that later
 * compiles cost recompute by measured time. Everything it needs is
 * allocated at step state creation (the records, and a block of table
 * entries for the graph's kernels: costs.h), so that a run allocates
 * nothing for it. */
#ifndef REMAT_RUNTIME_EXEC_STEP_COSTS_H
#define REMAT_RUNTIME_EXEC_STEP_COSTS_H

#include "runtime/exec/step_state.h"

/* At step state creation: the records array and the table's block. */
remat_status step_costs_create(const compiled_step *c, step_state *st);
/* Before a run: the array the scheduler should fill for the table, or
 * NULL when the run is not measured (COST_STEPS runs were, or the runtime
 * costs by the roofline alone). */
sched_trace_record *step_costs_records(const compiled_step *c,
                                       step_state *st);
/* After a run that succeeded with `records` (step_costs_records', or the
 * trace's when the run was traced; NULL: nothing): every op kernel's mean
 * time per tile into the table. */
void step_costs_note(const compiled_step *c, step_state *st,
                     const sched_trace_record *records);

#endif
