/* The hooks by which compile and the step reach data parallelism over MPI
 * (mpi_dp.c), or do nothing in a build without MPI (dp_none.c) and for a
 * graph that is not data parallel. */
#ifndef REMAT_RUNTIME_DP_H
#define REMAT_RUNTIME_DP_H

#include "runtime/exec/step_state.h"

struct dp_plan;

/* Stage "DAG", before the DAG is frozen: the allreduce bucket tasks
 * (async: done when their allreduce has completed) between each gradient's
 * last writer and its readers, and the agreement task (loss, NaN/Inf and
 * failures of all ranks) before the gate; starts the communication
 * thread. *out gets the data-parallel state (NULL when the graph is not
 * data parallel), which reads and writes gradients in `state`; it is the
 * caller's to free with dp_plan_free, also on failure. */
remat_status dp_add_tasks(const compiled_step *c, step_state *state,
                          sched_dag *dag, struct dp_plan **out);
/* Before a step: the first one broadcasts rank 0's parameters. */
remat_status dp_step_begin(const compiled_step *c, step_state *state);
/* After a step that ran (or could not run) its DAG with local status s:
 * the collectives this rank has not joined yet are joined with a failure
 * flag, and the status every rank agrees on is returned; `err` gets the
 * words when another rank's failure turned an OK step into a failure. */
remat_status dp_step_end(const compiled_step *c, step_state *state,
                         remat_status s, char *err, size_t err_size);
/* Stops the communication thread and frees the data-parallel state. */
void dp_plan_free(struct dp_plan *d);
/* Frees what remat_graph_data_parallel set on g. */
void dp_graph_free(remat_graph *g);

#endif
