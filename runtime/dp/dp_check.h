/* What the ranks of a data-parallel step must agree on, apart from MPI so
 * that tests check it alone. Once, before the first step's broadcast: the
 * step's description, one "key: value" line for each thing that must be
 * the same on every rank (parameters with their shapes and dtypes,
 * precision, optimizer, allreduce buckets, the buffers the broadcast
 * sends), compared by its hash and length and, only when those differ,
 * line by line to name the first difference. In every step: the values
 * the update uses that can change between steps (learning rate, clipping,
 * step or accumulation, micro-steps summed, updates counted), packed so
 * that one MPI_MAX over the ranks gives each one's smallest and largest. */
#ifndef REMAT_RUNTIME_DP_CHECK_H
#define REMAT_RUNTIME_DP_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/compile/compiled.h"

/* ---- the description, compared once ---- */

/* The longest description (bytes): an MPI int count, and far more than a
 * model's parameters take (about 60 bytes each). */
#define DP_MAX_DESCRIPTION (INT64_C(1) << 30)

typedef struct dp_text {
  char *text; /* NUL-terminated lines, each ending in '\n' */
  size_t len; /* without the NUL */
  size_t cap;
} dp_text;

/* Whether buffer b is one the first step broadcasts from rank 0: a
 * parameter's value or optimizer state, persistent. */
bool dp_broadcast_buffer(const compiled_step *c, int32_t b);

/* The description of compiled step c into *out (empty first);
 * REMAT_ERR_OUT_OF_MEMORY (out empty) or REMAT_ERR_LIMIT (longer than
 * DP_MAX_DESCRIPTION). */
remat_status dp_describe_step(const compiled_step *c, dp_text *out);
void dp_text_free(dp_text *t);
/* FNV-1a of the bytes. */
uint64_t dp_text_hash(const char *s, size_t len);

/* The first line where a (rank_a's description) and b (rank_b's) differ,
 * as "KEY is VALUE_A on rank A and VALUE_B on rank B" into out (cut to
 * size); a line one lacks reads "nothing". Returns false when the two are
 * the same. */
bool dp_first_difference(const char *a, size_t alen, int rank_a, const char *b,
                         size_t blen, int rank_b, char *out, size_t size);

/* ---- the values each step shares ---- */

typedef enum dp_shared_kind {
  DP_SHARED_LR,          /* float bits of the learning rate */
  DP_SHARED_CLIP,        /* float bits of the clipping norm (0: none) */
  DP_SHARED_ACCUMULATE,  /* 1 in remat_accumulate, 0 in remat_step */
  DP_SHARED_MICRO_STEPS, /* micro-steps summed before this one */
  DP_SHARED_UPDATES,     /* updates applied before this step */
  DP_NSHARED
} dp_shared_kind;

/* Room for the values in an MPI_MAX buffer: value k at 2k, its negation
 * at 2k + 1, so that the maximum of the second is minus the minimum. */
#define DP_SHARED_SLOTS (2 * DP_NSHARED)

/* Fills slots[DP_SHARED_SLOTS] with a rank's values (lr > 0 and clip >= 0
 * finite: their bits order as the floats do). */
void dp_shared_pack(int64_t *slots, float lr, float clip, bool accumulate,
                    int64_t micro_steps, int64_t updates);

/* After the MPI_MAX of every rank's slots: false when every value is the
 * same on every rank, else true with the first that differs named, with
 * its smallest and largest, in out. */
bool dp_shared_differ(const int64_t *slots, char *out, size_t size);

#endif
