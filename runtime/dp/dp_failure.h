/* How the ranks of a data-parallel step agree on one failure to report:
 * each rank's status and rank as one int key, so that a single MPI_MAX
 * over the keys picks a status and the rank that had it (two separate
 * maxima, of statuses and of ranks, could pair one rank's status with
 * another rank's number). Pure, so that tests check it without MPI. */
#ifndef REMAT_RUNTIME_DP_FAILURE_H
#define REMAT_RUNTIME_DP_FAILURE_H

#include "remat.h"

/* Out of memory is reported over any other failure (a rank that ran out
 * can say nothing else useful); among the others the larger code wins,
 * and among equal statuses the larger rank. */
#define DP_FAILURE_OOM_RANK 255

/* The key of `status` on `rank` of `size` ranks: -1 for REMAT_OK, else
 * severity * size + rank (severity: the status code, DP_FAILURE_OOM_RANK
 * for out of memory). size must be at most INT_MAX / 256. */
static inline int dp_failure_key(int status, int rank, int size) {
  if (status == REMAT_OK)
    return -1;
  int severity = status == REMAT_ERR_OUT_OF_MEMORY ? DP_FAILURE_OOM_RANK
                                                   : status;
  return severity * size + rank;
}

/* The status and rank of the largest key (the MPI_MAX of every rank's);
 * false (and REMAT_OK, rank -1) when no rank failed. */
static inline bool dp_failure_of(int key, int size, int *status, int *rank) {
  if (key < 0) {
    *status = REMAT_OK;
    *rank = -1;
    return false;
  }
  int severity = key / size;
  *status = severity == DP_FAILURE_OOM_RANK ? REMAT_ERR_OUT_OF_MEMORY
                                            : severity;
  *rank = key % size;
  return true;
}

#endif
