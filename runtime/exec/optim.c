/* The optimizer's arithmetic (optim.h): the seed task that starts backward
 * with d(loss) = 1, sums of squares of a gradient tile (finite check and
 * global norm), gradient accumulation, the clip factor, and SGD and AdamW
 * updates of a parameter tile. Plans and gates live in the tasks that call
 * these. */
#include <math.h>

#include "runtime/exec/optim.h"

double optim_sum_squares(const float *x, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; i++)
    acc += (double)x[i] * (double)x[i];
  return acc;
}

void optim_accumulate(float *acc, const float *g, int64_t n, bool first) {
  for (int64_t i = 0; i < n; i++)
    acc[i] = first ? g[i] : acc[i] + g[i];
}

void optim_fold(float *g, const float *acc, int64_t n, float scale) {
  for (int64_t i = 0; i < n; i++)
    g[i] = (acc[i] + g[i]) * scale;
}

float optim_clip_scale(double norm, float clip) {
  if (clip <= 0.0f || !(norm > (double)clip))
    return 1.0f;
  return (float)((double)clip / (norm + 1e-6));
}

/* w is the parameter, g its gradient (times the clip factor s), m and v
 * AdamW's moments:
 *   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
 *   w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + decay w). */
void optim_update(const remat_optimizer *opt, const optim_tile_args *a) {
  float *w = a->param, *m = a->adam_m, *v = a->adam_v;
  const float *g = a->grad;
  float lr = opt->lr, s = a->grad_scale;
  if (opt->kind == REMAT_OPT_SGD) {
    for (int64_t i = 0; i < a->n; i++)
      w[i] -= lr * (g[i] * s);
    return;
  }
  float b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
  float c1 = 1.0f / (1.0f - powf(b1, (float)a->step));
  float c2 = 1.0f / (1.0f - powf(b2, (float)a->step));
  for (int64_t i = 0; i < a->n; i++) {
    float gi = g[i] * s;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    float mhat = m[i] * c1, vhat = v[i] * c2;
    w[i] -= lr * (mhat / (sqrtf(vhat) + eps) + a->decay * w[i]);
  }
}
