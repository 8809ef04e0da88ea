/* The optimizer's arithmetic on one tile of a parameter: the seed of
 * backward, the finite check of a gradient and the SGD and AdamW updates.
 * It knows nothing of plans or tasks: callers pass the element range. */
#ifndef REMAT_RUNTIME_OPTIM_H
#define REMAT_RUNTIME_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "remat.h"
#include "runtime/compile/optim_tiles.h"

/* The sum of the squares of n values, in order, in double: finite exactly
 * when every value is (a float squared cannot overflow a double). */
double optim_sum_squares(const float *x, int64_t n);
/* Gradient accumulation: acc = g (first micro-step) or acc += g; and the
 * last micro-step's g = (acc + g) * scale, the mean over the micro-steps. */
void optim_accumulate(float *acc, const float *g, int64_t n, bool first);
void optim_fold(float *g, const float *acc, int64_t n, float scale);
/* The clip factor of a global gradient norm: 1 when clip is 0 (off) or the
 * norm is at most clip, else clip / (norm + 1e-6). */
float optim_clip_scale(double norm, float clip);

/* One tile of an update, elements [0, n) of the pointers. `step` counts
 * from 1 (AdamW's bias correction); `decay` is the weight decay that
 * applies to this parameter (0 for vectors); the update uses the gradient
 * times grad_scale (the clip factor, 1 without clipping). m and v are NULL
 * for SGD. */
typedef struct optim_tile_args {
  float *param;
  const float *grad;
  float *adam_m, *adam_v;
  int64_t n;
  int64_t step;
  float decay;
  float grad_scale;
} optim_tile_args;
void optim_update(const remat_optimizer *opt, const optim_tile_args *a);

#endif
