/* What remat-train and bench_train need to run under mpirun: MPI set up
 * when launched by it (each rank one shard of the data, rank 0 alone
 * printing to stdout), the graph made data parallel, and the JSON fields
 * (world_size, param_checksum, and under MPI the ranks' checksums and the
 * communication figures). Without MPI (or outside mpirun): one rank. */
#ifndef REMAT_TOOLS_DP_TOOL_H
#define REMAT_TOOLS_DP_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "remat.h"

/* Initializes MPI (MPI_THREAD_MULTIPLE) when launched by mpirun; on ranks
 * other than 0 stdout goes to /dev/null. With several ranks, REMAT_BIND
 * defaults to none (mpirun binds each rank) and REMAT_NUM_THREADS to the
 * rank's CPUs (all of them shared among the node's ranks when mpirun bound
 * nothing); a REMAT_TRACE path gets ".rankN" on rank N > 0. Returns 0, or
 * 1 after printing why. */
int dp_tool_init(int *argc, char ***argv, const char *prog);
/* Ends MPI if dp_tool_init started it (after every graph is destroyed). */
void dp_tool_finalize(void);
/* With several ranks and rc != 0: aborts the whole job (MPI_Abort), since
 * a failed or dead peer may never join a collective again. The tool's
 * message is printed before. */
void dp_tool_abort_on_failure(int rc);
int dp_tool_rank(void);
int dp_tool_size(void);
/* Makes g data parallel over all ranks when there are several. */
remat_status dp_tool_attach(remat_graph *g);
/* FNV-1a 64 over every parameter's bytes (grads: their gradients'), in
 * parameter order; 0 when one cannot be read. */
uint64_t dp_tool_checksum(remat_graph *g, bool grads);
/* Remembers g's communication figures so far (after a warm-up step). */
void dp_tool_mark(remat_graph *g);
/* Collective: writes into buf the JSON members (each preceded by ", ")
 * world_size, param_checksum and, with several ranks, param_checksums
 * (gathered on rank 0), buckets, and per step since dp_tool_mark (or the
 * start): comm_bytes, comm_s, exposed_comm_s. */
void dp_tool_json(remat_graph *g, char *buf, size_t size);

#endif
