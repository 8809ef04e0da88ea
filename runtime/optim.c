/* The optimizer's arithmetic (optim.h): the seed task that starts backward
 * with d(loss) = 1, finite checks of a gradient tile, and SGD and AdamW
 * updates of a parameter tile. Plans and gates live in the tasks that call
 * these. */
#include <math.h>

#include "runtime/optim.h"

int64_t optim_tiles(int64_t numel) {
  return (numel + OPTIM_TILE - 1) / OPTIM_TILE;
}

void optim_tile_range(int64_t numel, int64_t tile, int64_t *lo, int64_t *hi) {
  *lo = tile * OPTIM_TILE;
  *hi = *lo + OPTIM_TILE < numel ? *lo + OPTIM_TILE : numel;
}

bool optim_seed(const float *loss, float *loss_grad) {
  *loss_grad = 1.0f;
  return isfinite(*loss);
}

/* x * 0 is 0 for finite x and NaN for NaN or Inf: one sum tells. */
bool optim_all_finite(const float *x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; i++)
    acc += x[i] * 0.0f;
  return acc == 0.0f;
}

/* w is the parameter, g its gradient, m and v AdamW's moments:
 *   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
 *   w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + decay w). */
void optim_update(const remat_optimizer *opt, const optim_tile_args *a) {
  float *w = a->param, *m = a->adam_m, *v = a->adam_v;
  const float *g = a->grad;
  float lr = opt->lr;
  if (opt->kind == REMAT_OPT_SGD) {
    for (int64_t i = 0; i < a->n; i++)
      w[i] -= lr * g[i];
    return;
  }
  float b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
  float c1 = 1.0f / (1.0f - powf(b1, (float)a->step));
  float c2 = 1.0f / (1.0f - powf(b2, (float)a->step));
  for (int64_t i = 0; i < a->n; i++) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    float mhat = m[i] * c1, vhat = v[i] * c2;
    w[i] -= lr * (mhat / (sqrtf(vhat) + eps) + a->decay * w[i]);
  }
}
