/* The optimizer's arithmetic on one tile of a parameter: the seed of
 * backward, the finite check of a gradient, the SGD and AdamW updates,
 * and whether an update stays finite (a bound, then a dry run).
 * It knows nothing of plans or tasks: callers pass the element range. */
#ifndef REMAT_RUNTIME_OPTIM_H
#define REMAT_RUNTIME_OPTIM_H

#include <float.h>
#include <stdbool.h>
#include <stdint.h>

#include "remat.h"
#include "runtime/compile/optim_tiles.h"

/* The sum of the squares of n values in double, in an order fixed by n
 * alone (8 interleaved partial sums, optim.c): finite exactly when every
 * value is (a float squared cannot overflow a double). */
double optim_sum_squares(const float *x, int64_t n);
/* The largest magnitude an update's bound lets it write (optim.c says why
 * this margin below FLT_MAX is enough). */
#define OPTIM_SAFE ((double)FLT_MAX / 16.0)

/* The largest |x[i]| of n values (0 for none), Inf when one is NaN or Inf
 * (remat_write takes any value), so that no bound clears the tile. */
float optim_max_abs(const float *x, int64_t n);
/* Gradient accumulation: acc = g (first micro-step) or acc += g, returning
 * the largest |acc[i]| written; and the last micro-step's
 * g = (acc + g) * scale, the mean over the micro-steps. A later micro-step
 * is safe when optim_accumulate_bounded(largest |acc|, largest |g|), else
 * exactly when optim_accumulate_finite (a dry run). */
float optim_accumulate(float *acc, const float *g, int64_t n, bool first);
bool optim_accumulate_bounded(double acc_max, double g_max);
bool optim_accumulate_finite(const float *acc, const float *g, int64_t n);
void optim_fold(float *g, const float *acc, int64_t n, float scale);
/* optim_fold, then optim_sum_squares of the folded g, in one pass of
 * chunks (the same values, summed in the same order). */
double optim_fold_sum_squares(float *g, const float *acc, int64_t n,
                              float scale);
/* The clip factor of a global gradient norm: 1 when clip is 0 (off) or the
 * norm is at most clip, else clip / (norm + 1e-6). */
float optim_clip_scale(double norm, float clip);

/* The maxima an update records per tile, for the next update's bound. */
enum { OPTIM_MAX_W, OPTIM_MAX_M, OPTIM_MAX_V, OPTIM_MAX_ACC, OPTIM_NMAX };

/* One tile of an update, elements [0, n) of the pointers. `step` counts
 * from 1 (AdamW's bias correction); `decay` is the weight decay that
 * applies to this parameter (0 for vectors); the update uses the gradient
 * times grad_scale (the clip factor, 1 without clipping). m and v are NULL
 * for SGD. `max` (OPTIM_NMAX floats) holds the tile's largest |w|, |m|
 * and v: read by the bound, written by the update. */
typedef struct optim_tile_args {
  float *param;
  const float *grad;
  float *adam_m, *adam_v;
  int64_t n;
  int64_t step;
  float decay;
  float grad_scale;
  float *max;
  /* Called, when not NULL, after each chunk [lo, hi) of the elements is
   * written, while the chunk is in L1: the caller's copies of the new
   * weights (bf16 weights, other nodes' copies) in the same pass. */
  void (*chunk_done)(void *ctx, int64_t lo, int64_t hi);
  void *ctx;
} optim_tile_args;
/* The update, recording the maxima of what it wrote in a->max. */
void optim_update(const remat_optimizer *opt, const optim_tile_args *a);
/* True when the update cannot make a value NaN or Inf, proved from a->max
 * (the maxima before it) and g_max >= every |gradient| of the tile: the
 * cheap test of every step. False says nothing: optim_update_finite (a
 * dry run, without writing) then decides exactly, also for the bf16 copy
 * of the weights when `bf16`. */
bool optim_update_bounded(const remat_optimizer *opt,
                          const optim_tile_args *a, double g_max);
bool optim_update_finite(const remat_optimizer *opt,
                         const optim_tile_args *a, bool bf16);

#endif
