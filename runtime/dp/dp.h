/* The hooks by which remat_compile and the step reach data parallelism
 * over MPI (mpi_dp.c), or do nothing in a build without MPI (dp_none.c)
 * and for a graph that is not data parallel. Where the tasks sit in the
 * DAG is compile's (compile/dp_layout.h); what they do, the buffers they
 * fill and the communication thread are here. */
#ifndef REMAT_RUNTIME_DP_H
#define REMAT_RUNTIME_DP_H

#include "runtime/exec/step_state.h"

struct dp_plan;

/* The allreduce bucket size of a data-parallel graph; 0 when g is not
 * data parallel. */
int64_t dp_bucket_bytes(const remat_graph *g);
/* The data-parallel state for compiled step c (its buckets' buffers, the
 * communication thread, started), which reads and writes gradients in
 * `state`: *out, NULL when c has no data-parallel tasks. On failure *out
 * is NULL and nothing is left running. */
remat_status dp_state_create(const compiled_step *c, step_state *state,
                             struct dp_plan **out);
/* The bodies of the tasks compile placed (task_bodies.dp_bucket and
 * dp_agree): copy a bucket's gradients out and hand it to the
 * communication thread; this rank's loss and flags to the agreement. */
int dp_bucket_task(void *run, void *arg, int worker);
int dp_agree_task(void *run, void *arg, int worker);
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
