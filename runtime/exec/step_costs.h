/* The task times of a graph's first runs into the runtime's cost table
 * (compile/costs.h): each op kernel's time per tile, so that later
 * compiles cost recompute by measured time. */
#ifndef REMAT_RUNTIME_EXEC_STEP_COSTS_H
#define REMAT_RUNTIME_EXEC_STEP_COSTS_H

#include "runtime/exec/step_state.h"

/* Before a run: the records array the scheduler should fill for the cost
 * table (the trace's `traced` when the run is traced), or NULL when this
 * run is not measured (COST_STEPS runs were, or the runtime costs by the
 * roofline alone, or the array could not be allocated: measuring is an
 * optimization and never fails a run). */
sched_trace_record *step_costs_records(const compiled_step *c, step_state *st,
                                       sched_trace_record *traced);
/* After a run that succeeded with `records` (step_costs_records' answer,
 * NULL: nothing): every op kernel's mean time per tile into the table. */
void step_costs_note(const compiled_step *c, step_state *st,
                     const sched_trace_record *records);

#endif
