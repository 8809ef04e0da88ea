/* The optimizer's arithmetic (optim.h): the seed task that starts backward
 * with d(loss) = 1, sums of squares of a gradient tile (finite check and
 * global norm), gradient accumulation, the clip factor, SGD and AdamW
 * updates of a parameter tile, and the bound and exact dry run that tell
 * whether an update would write a NaN or Inf. Plans and gates live in the
 * tasks that call these. */
#include <math.h>
#include <string.h>

#include "base/bf16.h"

#include "runtime/exec/optim.h"

/* Sums of squares in SUMSQ_LANES partial sums: element i of a tile adds
 * into lane i % SUMSQ_LANES, and the lanes add up in one fixed order at
 * the end. The order depends on the tile alone (the same bits at every
 * thread count), and the lanes are independent, so the loop vectorizes
 * instead of waiting on one sum's additions. sumsq_add adds x[0..n) with
 * x[0] into lane 0: a tile fed in pieces starts each piece at a multiple
 * of SUMSQ_LANES. */
enum { SUMSQ_LANES = 8 };

static void sumsq_add(double lane[SUMSQ_LANES], const float *x, int64_t n) {
  int64_t i = 0;
  for (; i + SUMSQ_LANES <= n; i += SUMSQ_LANES)
    for (int k = 0; k < SUMSQ_LANES; k++)
      lane[k] += (double)x[i + k] * (double)x[i + k];
  for (int k = 0; i + k < n; k++)
    lane[k] += (double)x[i + k] * (double)x[i + k];
}

static double sumsq_total(const double lane[SUMSQ_LANES]) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
         ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

double optim_sum_squares(const float *x, int64_t n) {
  double lane[SUMSQ_LANES] = {0};
  sumsq_add(lane, x, n);
  return sumsq_total(lane);
}

/* On the bits: |x| of a float without its sign bit orders as an unsigned
 * integer (Inf and NaN above every finite value), and an integer maximum
 * vectorizes where a float one does not. Static: a clone's resolver is a
 * global symbol otherwise, outside the remat_ namespace. */
REMAT_SIMD_CLONES static float max_abs(const float *x, int64_t n) {
  int32_t mx = 0;
  for (int64_t i = 0; i < n; i++) {
    int32_t u;
    memcpy(&u, &x[i], sizeof u);
    u &= 0x7fffffff;
    mx = u > mx ? u : mx;
  }
  if (mx >= 0x7f800000)
    return INFINITY;
  float f;
  memcpy(&f, &mx, sizeof f);
  return f;
}

float optim_max_abs(const float *x, int64_t n) { return max_abs(x, n); }

float optim_accumulate(float *acc, const float *g, int64_t n, bool first) {
  for (int64_t i = 0; i < n; i++)
    acc[i] = first ? g[i] : acc[i] + g[i];
  return max_abs(acc, n);
}

bool optim_accumulate_bounded(double acc_max, double g_max) {
  return acc_max + g_max <= OPTIM_SAFE;
}

bool optim_accumulate_finite(const float *acc, const float *g, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(acc[i] + g[i]))
      return false;
  return true;
}

void optim_fold(float *g, const float *acc, int64_t n, float scale) {
  for (int64_t i = 0; i < n; i++)
    g[i] = (acc[i] + g[i]) * scale;
}

enum { OPTIM_CHUNK = 1024 };
_Static_assert(OPTIM_CHUNK % SUMSQ_LANES == 0,
               "a chunk must be whole lanes of the sum of squares");
double optim_fold_sum_squares(float *g, const float *acc, int64_t n,
                              float scale) {
  /* chunks are whole multiples of the lanes: the lanes and their order
   * are optim_sum_squares's */
  double lane[SUMSQ_LANES] = {0};
  for (int64_t lo = 0; lo < n; lo += OPTIM_CHUNK) {
    int64_t hi = lo + OPTIM_CHUNK < n ? lo + OPTIM_CHUNK : n;
    optim_fold(g + lo, acc + lo, hi - lo, scale);
    sumsq_add(lane, g + lo, hi - lo);
  }
  return sumsq_total(lane);
}

float optim_clip_scale(double norm, float clip) {
  if (clip <= 0.0f || !(norm > (double)clip))
    return 1.0f;
  return (float)((double)clip / (norm + 1e-6));
}

/* The constants of one tile's update: AdamW's bias corrections
 * c1 = 1 / (1 - b1^t) and c2 = 1 / (1 - b2^t), computed once so that the
 * update, its bound and its dry run use the same floats. */
typedef struct coefs {
  float lr, s, b1, b2, eps, decay, c1, c2;
} coefs;

static coefs coefs_of(const remat_optimizer *opt, const optim_tile_args *a) {
  coefs k = {.lr = opt->lr, .s = a->grad_scale, .b1 = opt->beta1,
             .b2 = opt->beta2, .eps = opt->eps, .decay = a->decay};
  if (opt->kind == REMAT_OPT_ADAMW) {
    float b1 = k.b1, b2 = k.b2;
    k.c1 = 1.0f / (1.0f - powf(b1, (float)a->step));
    k.c2 = 1.0f / (1.0f - powf(b2, (float)a->step));
  }
  return k;
}

/* One element of AdamW, in the order of rounding of the update:
 *   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
 *   w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + decay w). */
static inline void adamw_elem(const coefs *k, float g, float *w, float *m,
                              float *v) {
  float gi = g * k->s;
  *m = k->b1 * *m + (1.0f - k->b1) * gi;
  *v = k->b2 * *v + (1.0f - k->b2) * gi * gi;
  float mhat = *m * k->c1, vhat = *v * k->c2;
  *w -= k->lr * (mhat / (sqrtf(vhat) + k->eps) + k->decay * *w);
}

static inline float sgd_elem(const coefs *k, float g, float w) {
  return w - k->lr * (g * k->s);
}

static float max2(float a, float b) { return a > b ? a : b; }

/* w is the parameter, g its gradient (times the clip factor s), m and v
 * AdamW's moments. Records the largest |w|, |m| and v it wrote, and hands
 * the chunk to chunk_done: after each chunk of OPTIM_CHUNK elements,
 * while the chunk is in L1 (the loops vectorize: meson.build builds
 * without math errno, so sqrtf is one instruction). */
void optim_update(const remat_optimizer *opt, const optim_tile_args *a) {
  float *w = a->param, *m = a->adam_m, *v = a->adam_v;
  const float *g = a->grad;
  coefs k = coefs_of(opt, a);
  float wmax = 0.0f, mmax = 0.0f, vmax = 0.0f;
  for (int64_t lo = 0; lo < a->n; lo += OPTIM_CHUNK) {
    int64_t hi = lo + OPTIM_CHUNK < a->n ? lo + OPTIM_CHUNK : a->n;
    if (opt->kind == REMAT_OPT_SGD) {
      for (int64_t i = lo; i < hi; i++)
        w[i] = sgd_elem(&k, g[i], w[i]);
    } else {
      for (int64_t i = lo; i < hi; i++)
        adamw_elem(&k, g[i], &w[i], &m[i], &v[i]);
      mmax = max2(mmax, max_abs(m + lo, hi - lo));
      vmax = max2(vmax, max_abs(v + lo, hi - lo));
    }
    wmax = max2(wmax, max_abs(w + lo, hi - lo));
    if (a->chunk_done != NULL)
      a->chunk_done(a->ctx, lo, hi);
  }
  a->max[OPTIM_MAX_W] = wmax;
  a->max[OPTIM_MAX_M] = mmax;
  a->max[OPTIM_MAX_V] = vmax;
}

/* Every output is at most the bound B of its exact value, computed in
 * double from the tile's maxima before the update (W, M, V: |w|, |m|, v,
 * with v >= 0) and G >= |g s| (the gradient's sqrt(sum of squares) times
 * the clip factor):
 *   SGD:   |w'| <= W + lr G
 *   AdamW: |m'| <= b1 M + (1 - b1) G = M',  v' <= b2 V + (1 - b2) G^2 = V',
 *          |mhat| <= M' c1, vhat <= V' c2,
 *          |mhat / (sqrt(vhat) + eps)| <= M' c1 / eps (eps > 0),
 *          |w'| <= W + lr (M' c1 / eps + decay W).
 * Each float operation rounds its exact result by a factor of at most
 * 1 + 2^-24, and each output and intermediate takes fewer than 16 of them,
 * so every one stays below B (1 + 2^-24)^16 < 2 B: with all the bounds
 * <= OPTIM_SAFE = FLT_MAX / 16 (below the largest bf16 too) nothing
 * overflows. */
bool optim_update_bounded(const remat_optimizer *opt,
                          const optim_tile_args *a, double g_max) {
  coefs k = coefs_of(opt, a);
  double W = a->max[OPTIM_MAX_W], G = g_max * (double)k.s;
  double lr = k.lr;
  if (opt->kind == REMAT_OPT_SGD)
    return W + lr * G <= OPTIM_SAFE;
  double M = a->max[OPTIM_MAX_M], V = a->max[OPTIM_MAX_V];
  double M1 = k.b1 * M + (1.0 - k.b1) * G;
  double V1 = k.b2 * V + (1.0 - k.b2) * G * G;
  double mhat = M1 * (double)k.c1, vhat = V1 * (double)k.c2;
  double step = k.eps > 0.0f ? mhat / (double)k.eps : INFINITY;
  double w1 = W + lr * (step + (double)k.decay * W);
  return G <= OPTIM_SAFE && M1 <= OPTIM_SAFE && V1 <= OPTIM_SAFE &&
         mhat <= OPTIM_SAFE && vhat <= OPTIM_SAFE && w1 <= OPTIM_SAFE;
}

/* The update computed without writing: false at the first element whose
 * new weight (or its bf16 copy when `bf16`), m or v would not be finite. */
bool optim_update_finite(const remat_optimizer *opt,
                         const optim_tile_args *a, bool bf16) {
  coefs k = coefs_of(opt, a);
  for (int64_t i = 0; i < a->n; i++) {
    float w = a->param[i], m = 0.0f, v = 0.0f;
    if (opt->kind == REMAT_OPT_SGD) {
      w = sgd_elem(&k, a->grad[i], w);
    } else {
      m = a->adam_m[i];
      v = a->adam_v[i];
      adamw_elem(&k, a->grad[i], &w, &m, &v);
    }
    if (!isfinite(w) || !isfinite(m) || !isfinite(v) ||
        (bf16 && !isfinite(bf16_to_f32(bf16_from_f32(w)))))
      return false;
  }
  return true;
}
