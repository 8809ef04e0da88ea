/* remat_mpi.h: data-parallel training over MPI, apart from remat.h so that
 * remat.h never needs mpi.h. Built when remat was configured with MPI
 * (meson -Dmpi=enabled, or auto and MPI found).
 *
 * Every rank of a communicator builds the same graph, calls
 * remat_graph_data_parallel before remat_compile, feeds its own micro-batch
 * and calls remat_step. At the first step rank 0's parameters (and
 * optimizer moments) are broadcast to the others; in every step the
 * gradients and the loss are averaged over the ranks before the update, in
 * buckets whose allreduce starts as soon as their gradients are final (on
 * a communication thread, while backward goes on). A failure on one rank
 * (NaN/Inf, out of memory) makes every rank skip the update and return the
 * same status. Ranks that built different steps (parameters, shapes,
 * precision, optimizer, buckets) fail the first step on every rank with
 * REMAT_ERR_INVALID_ARG naming the first difference, and a step whose
 * learning rate, clipping or kind (remat_step or remat_accumulate)
 * differs between ranks fails alike before any update; every collective
 * fails after REMAT_DP_TIMEOUT seconds (default 60) with
 * REMAT_ERR_BACKEND. remat never calls MPI_Init or MPI_Finalize: the caller
 * initializes MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) and
 * finalizes it after destroying the graphs. */
#ifndef REMAT_MPI_H
#define REMAT_MPI_H

#include <mpi.h>

#include "remat.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes g data parallel over `comm` (duplicated: remat's messages never
 * mix with the caller's). Collective: every rank of comm calls it, before
 * remat_compile. Fails with REMAT_ERR_STATE when MPI is not initialized
 * with MPI_THREAD_MULTIPLE or g is compiled. */
REMAT_API remat_status remat_graph_data_parallel(remat_graph *g, MPI_Comm comm);

/* Bytes of gradients per allreduce bucket (default 4 MiB, or the
 * environment's REMAT_DP_BUCKET_BYTES, e.g. "1M"); before remat_compile,
 * the same on every rank. */
REMAT_API remat_status remat_graph_dp_bucket_bytes(remat_graph *g,
                                                   int64_t bytes);

typedef struct remat_dp_stats {
  int world_size;          /* ranks */
  int rank;                /* this process's rank */
  int buckets;             /* allreduce buckets per step */
  int64_t steps;           /* steps run since compile (failed ones too) */
  int64_t comm_bytes;      /* bytes allreduced by this rank, all steps */
  double comm_s;           /* seconds the allreduces were in flight, summed
                              over buckets, all steps */
  double exposed_comm_s;   /* seconds steps waited on communication after
                              their last gradient was final, all steps */
} remat_dp_stats;

/* The data-parallel figures of a compiled graph (REMAT_ERR_STATE when g
 * is not data parallel or not compiled). */
REMAT_API remat_status remat_graph_dp_stats(const remat_graph *g,
                                            remat_dp_stats *out);

#ifdef __cplusplus
}
#endif

#endif
