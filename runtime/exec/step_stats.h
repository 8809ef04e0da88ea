/* Writing remat_step_stats into a caller's struct that may be of an older
 * or newer header than the library's: only the fields that fit the
 * caller's `size`, after a check of that size. */
#ifndef REMAT_RUNTIME_EXEC_STEP_STATS_H
#define REMAT_RUNTIME_EXEC_STEP_STATS_H

#include <stddef.h>

#include "remat.h"

/* The size of remat_step_stats in version 0.2.0, the first with `size`:
 * the least a caller may give (its last field then was `accumulated`). */
#define STEP_STATS_MIN_SIZE                                                    \
  (offsetof(remat_step_stats, accumulated) + sizeof(int64_t))

/* REMAT_ERR_INVALID_ARG, with a message naming `what`, the size given and
 * the least accepted, when stats is not NULL and stats->size is smaller
 * than STEP_STATS_MIN_SIZE; else REMAT_OK. */
remat_status step_stats_check(const remat_step_stats *stats, const char *what);
/* Copies each field of src that lies whole within dst->size bytes of dst
 * (all but `size`); bytes of dst past dst->size are not touched. */
void step_stats_write(remat_step_stats *dst, const remat_step_stats *src);

#endif
