/* The optimizer as tasks: the seed task that starts backward with
 * d(loss) = 1, finite checks of each gradient as soon as it is final, and
 * SGD and AdamW updates tiled over a parameter's elements, which run after
 * every check (a gate between): a NaN or Inf in the loss or any gradient
 * skips every update, and the step reports it. */
#include <math.h>

#include "runtime/plan.h"

#define OPTIM_TILE 65536

int64_t optim_tiles(int64_t numel) {
  return (numel + OPTIM_TILE - 1) / OPTIM_TILE;
}

int optim_seed_tile(remat_step_plan *p, plan_knode *kn) {
  float loss = kn->bufs.in[0][0];
  if (!isfinite(loss))
    atomic_store(&p->nonfinite, 1);
  kn->bufs.out[0] = 1.0f;
  return REMAT_OK;
}

static bool all_finite(const float *x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; i++)
    acc += x[i] * 0.0f;
  return acc == 0.0f;
}

static void tile_range(const remat_step_plan *p, const plan_knode *kn,
                       int64_t tile, int64_t *lo, int64_t *hi) {
  int64_t n = op_numel(&p->g->tensors[kn->param]->shape);
  *lo = tile * OPTIM_TILE;
  *hi = *lo + OPTIM_TILE < n ? *lo + OPTIM_TILE : n;
}

int optim_check_tile(remat_step_plan *p, plan_knode *kn, int64_t tile) {
  int64_t lo, hi;
  tile_range(p, kn, tile, &lo, &hi);
  if (!all_finite(kn->bufs.dout + lo, hi - lo))
    atomic_store(&p->nonfinite, 1);
  return REMAT_OK;
}

/* p is the parameter, g its gradient, m and v AdamW's moments. */
int optim_update_tile(remat_step_plan *p, plan_knode *kn, int64_t tile) {
  const remat_tensor *t = p->g->tensors[kn->param];
  int64_t lo, hi;
  tile_range(p, kn, tile, &lo, &hi);
  float *w = kn->bufs.in[0] + lo;
  const float *g = kn->bufs.dout + lo;
  if (atomic_load(&p->nonfinite))
    return REMAT_OK;
  const remat_optimizer *o = &p->opt;
  float lr = o->lr;
  if (o->kind == REMAT_OPT_SGD) {
    for (int64_t i = 0; i < hi - lo; i++)
      w[i] -= lr * g[i];
    return REMAT_OK;
  }
  float *m = kn->bufs.aux[0] + lo, *v = kn->bufs.aux[1] + lo;
  float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
  float c1 = 1.0f / (1.0f - powf(b1, (float)p->opt_step));
  float c2 = 1.0f / (1.0f - powf(b2, (float)p->opt_step));
  float decay = t->shape.ndim >= 2 ? o->weight_decay : 0.0f;
  for (int64_t i = 0; i < hi - lo; i++) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    float mhat = m[i] * c1, vhat = v[i] * c2;
    w[i] -= lr * (mhat / (sqrtf(vhat) + eps) + decay * w[i]);
  }
  return REMAT_OK;
}
