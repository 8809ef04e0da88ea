/* The hooks by which the compile pipeline and the step reach data
 * parallelism over MPI (mpi_dp.c), or do nothing in a build without MPI
 * (dp_none.c) and for a graph that is not data parallel. */
#ifndef REMAT_RUNTIME_DP_H
#define REMAT_RUNTIME_DP_H

#include "runtime/compile/step_plan.h"

/* Stage "DAG", before the DAG is finalized: the allreduce bucket tasks
 * (async: done when their allreduce has completed) between each gradient's
 * last writer and its readers, and the agreement task (loss, NaN/Inf and
 * failures of all ranks) before the gate; starts the communication
 * thread. */
remat_status dp_add_tasks(remat_step_plan *p);
/* Before a step: the first one broadcasts rank 0's parameters. */
remat_status dp_step_begin(remat_step_plan *p);
/* After a step that ran (or could not run) its DAG with local status s:
 * the collectives this rank has not joined yet are joined with a failure
 * flag, and the status every rank agrees on is returned; `err` gets the
 * words when another rank's failure turned an OK step into a failure. */
remat_status dp_step_end(remat_step_plan *p, remat_status s, char *err,
                         size_t err_size);
/* Stops the communication thread and frees the plan's DP state. */
void dp_plan_free(remat_step_plan *p);
/* Frees what remat_graph_data_parallel set on g. */
void dp_graph_free(remat_graph *g);

#endif
