/* Tests of remat_attention and remat_dropout. At the op level, both forms
 * (the fused op; scores -> softmax -> (dropout ->) values) against a
 * double-precision reference written here, for bidirectional, causal,
 * cross (S != T), grouped-query (H 4 with 2 and 1 kv heads), key lengths,
 * a given scale, packed and separate inputs, with and without dropout;
 * gradients against central finite differences; bf16 kernels against f32
 * ones; grouped-query attention against multi-head attention on repeated
 * key/value heads; padded keys that change nothing. At the graph level,
 * dropout's mask replayed bitwise by recomputes under every policy, at 1,
 * 2 and 4 threads and on a synthetic 2-node machine; a new mask each step;
 * none in remat_forward; key lengths refused by remat_feed; and the
 * builders' messages. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/bf16.h"
#include "base/counter_rng.h"
#include "op_fixture.h"
#include "ops/op.h"
#include "remat.h"

/* ---- the reference ---- */

typedef struct acase {
  int64_t B, T, S, H, KVH, hd;
  bool causal, packed, lens;
  float scale; /* 0: 1/sqrt(hd) */
  float p;     /* dropout */
} acase;

/* Logical tensors: q, o [B,T,H,hd]; k, v [B,S,KVH,hd]; lens [B]. */
typedef struct atensors {
  float *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  int32_t len[8];
} atensors;

static int64_t nq(const acase *c) { return c->B * c->T * c->H * c->hd; }
static int64_t nk(const acase *c) { return c->B * c->S * c->KVH * c->hd; }

static float *fzeros(int64_t n) {
  float *p = calloc((size_t)(n ? n : 1), sizeof *p);
  assert_non_null(p);
  return p;
}

static void tensors_new(const acase *c, atensors *t) {
  memset(t, 0, sizeof *t);
  t->q = fzeros(nq(c)), t->o = fzeros(nq(c)), t->dout = fzeros(nq(c));
  t->dq = fzeros(nq(c));
  t->k = fzeros(nk(c)), t->v = fzeros(nk(c));
  t->dk = fzeros(nk(c)), t->dv = fzeros(nk(c));
  for (int64_t i = 0; i < nq(c); i++) t->q[i] = (float)uniform(-1.5, 1.5);
  for (int64_t i = 0; i < nq(c); i++) t->dout[i] = (float)uniform(-1, 1);
  for (int64_t i = 0; i < nk(c); i++) t->k[i] = (float)uniform(-1.5, 1.5);
  for (int64_t i = 0; i < nk(c); i++) t->v[i] = (float)uniform(-1, 1);
  for (int64_t b = 0; b < c->B; b++)
    t->len[b] = c->lens ? (int32_t)(1 + (b * 7 + 3) % c->S) : (int32_t)c->S;
}

static void tensors_free(atensors *t) {
  free(t->q), free(t->k), free(t->v), free(t->o), free(t->dout);
  free(t->dq), free(t->dk), free(t->dv);
}

static double ref_scale(const acase *c) {
  return c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)c->hd);
}

/* The dropout multiplier of (b, h, t, j): the mask the ops draw. */
static double ref_keep(const acase *c, uint64_t key, int64_t b, int64_t h,
                       int64_t t, int64_t j) {
  if (c->p <= 0.0f) return 1.0;
  uint64_t at = (uint64_t)(((b * c->H + h) * c->T + t) * c->S + j);
  return counter_rng_bits(key, at) >= counter_rng_threshold(c->p)
             ? (double)(1.0f / (1.0f - c->p))
             : 0.0;
}

/* out and, from dout, dq, dk, dv in double (into ref). */
static void reference(const acase *c, const atensors *t, uint64_t key,
                      double *o, double *dq, double *dk, double *dv) {
  int64_t hd = c->hd, S = c->S, grp = c->H / c->KVH;
  double sc = ref_scale(c);
  memset(o, 0, (size_t)nq(c) * sizeof *o);
  memset(dq, 0, (size_t)nq(c) * sizeof *dq);
  memset(dk, 0, (size_t)nk(c) * sizeof *dk);
  memset(dv, 0, (size_t)nk(c) * sizeof *dv);
  double *p = calloc((size_t)S, sizeof *p), *dp = calloc((size_t)S, sizeof *dp);
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->H; h++)
      for (int64_t i = 0; i < c->T; i++) {
        int64_t g = h / grp, n = c->causal && i + 1 < S ? i + 1 : S;
        if (n > t->len[b]) n = t->len[b];
        const float *qi = t->q + ((b * c->T + i) * c->H + h) * hd;
        const float *doi = t->dout + ((b * c->T + i) * c->H + h) * hd;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; j++) {
          const float *kj = t->k + ((b * S + j) * c->KVH + g) * hd;
          double s = 0;
          for (int64_t d = 0; d < hd; d++) s += (double)qi[d] * kj[d];
          p[j] = s * sc;
          mx = fmax(mx, p[j]);
        }
        for (int64_t j = 0; j < n; j++) sum += p[j] = exp(p[j] - mx);
        double *oi = o + ((b * c->T + i) * c->H + h) * hd;
        double delta = 0;
        for (int64_t j = 0; j < n; j++) {
          p[j] /= sum;
          double m = ref_keep(c, key, b, h, i, j);
          const float *vj = t->v + ((b * S + j) * c->KVH + g) * hd;
          double dpd = 0;
          for (int64_t d = 0; d < hd; d++) {
            oi[d] += p[j] * m * vj[d];
            dpd += (double)doi[d] * vj[d];
            dv[((b * S + j) * c->KVH + g) * hd + d] += p[j] * m * doi[d];
          }
          dp[j] = dpd * m;
          delta += p[j] * dp[j];
        }
        double *dqi = dq + ((b * c->T + i) * c->H + h) * hd;
        for (int64_t j = 0; j < n; j++) {
          double ds = p[j] * (dp[j] - delta) * sc;
          const float *kj = t->k + ((b * S + j) * c->KVH + g) * hd;
          double *dkj = dk + ((b * S + j) * c->KVH + g) * hd;
          for (int64_t d = 0; d < hd; d++) {
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
        }
      }
  free(p), free(dp);
}

/* ---- the ops ---- */

typedef struct planned {
  op_instance inst;
  op_worker w;
  op_bufs b;
} planned;

static void plan(planned *p, op_desc d) {
  memset(p, 0, sizeof *p);
  char err[OP_ERRMSG_MAX];
  if (op_plan(&d, engine, &p->inst, err) != REMAT_OK) fail_msg("%s", err);
  for (int k = 0; k < p->inst.naux; k++)
    p->b.aux[k] = fzeros((int64_t)p->inst.aux_bytes[k] / 4);
  for (int k = 0; k < p->inst.nws; k++)
    p->b.ws[k] = fzeros((int64_t)p->inst.ws_bytes[k] / 4);
  p->w.stream = stream;
  p->w.scratch_bytes = p->inst.scratch_bytes;
  p->w.scratch = malloc(p->inst.scratch_bytes ? p->inst.scratch_bytes : 1);
  assert_non_null(p->w.scratch);
}

/* Runs every tile of the forward or backward kernels; `reverse` runs the
 * tiles of each kernel last to first. */
static void run(planned *p, bool backward, bool reverse) {
  const op_kernel *k = backward ? p->inst.bwd : p->inst.fwd;
  int n = backward ? p->inst.nbwd : p->inst.nfwd;
  for (int i = 0; i < n; i++)
    for (int64_t t = 0; t < k[i].tiles; t++)
      assert_int_equal(
          k[i].fn(&p->inst, &p->b, reverse ? k[i].tiles - 1 - t : t, &p->w),
          REMAT_OK);
}

static void unplan(planned *p) {
  for (int k = 0; k < OP_MAX_AUX; k++) free(p->b.aux[k]);
  for (int k = 0; k < OP_MAX_WS; k++) free(p->b.ws[k]);
  free(p->w.scratch);
  op_instance_release(&p->inst);
}

/* How a run of a form is made. */
typedef struct arun {
  bool fused, bf16, training, reverse;
  uint64_t seed, step;
} arun;

/* A buffer in the run's dtype holding n floats of src (NULL: zeros). */
static float *to_dt(const float *src, int64_t n, bool bf16) {
  if (!bf16) {
    float *d = fzeros(n);
    if (src) memcpy(d, src, (size_t)n * sizeof *d);
    return d;
  }
  uint16_t *d = calloc((size_t)(n ? n : 1), sizeof *d);
  assert_non_null(d);
  for (int64_t i = 0; src && i < n; i++) d[i] = bf16_from_f32(src[i]);
  return (float *)d;
}

static void from_dt(float *dst, const float *src, int64_t n, bool bf16) {
  for (int64_t i = 0; i < n; i++)
    dst[i] = bf16 ? bf16_to_f32(((const uint16_t *)src)[i]) : src[i];
}

/* Packs q, k, v [B,T,*] into qkv [B,T,(H+2 KVH) hd], or back (unpack). */
static void pack(const acase *c, float *qkv, float *q, float *k, float *v,
                 bool unpack) {
  int64_t qw = c->H * c->hd, kw = c->KVH * c->hd, W = qw + 2 * kw;
  for (int64_t r = 0; r < c->B * c->T; r++) {
    float *row = qkv + r * W;
    float *part[3] = {q + r * qw, k + r * kw, v + r * kw};
    int64_t at[3] = {0, qw, qw + kw}, w[3] = {qw, kw, kw};
    for (int x = 0; x < 3; x++)
      if (unpack)
        memcpy(part[x], row + at[x], (size_t)w[x] * sizeof(float));
      else
        memcpy(row + at[x], part[x], (size_t)w[x] * sizeof(float));
  }
}

static op_attrs case_attrs(const acase *c) {
  return (op_attrs){.heads = (int)c->H, .kv_heads = (int)c->KVH,
                    .attn_full = !c->causal, .attn_separate = !c->packed,
                    .attn_lens = c->lens, .attn_scale = c->scale,
                    .dropout = c->p};
}

static void set_run(planned *p, const arun *r) {
  p->b.training = r->training;
  p->b.rng_seed = r->seed;
  p->b.rng_step = r->step;
}

/* The op's inputs: logical buffers (in the run's dtype) x[0..2] = q, k, v
 * (or x[0] = qkv), the lengths last; their shapes into d. Returns nin. */
static int bind_inputs(const acase *c, op_desc *d, float *const x[3],
                       const int32_t *len, bool bf16, const float **in,
                       int first) {
  op_dtype dt = bf16 ? OP_BF16 : OP_F32;
  int n = first;
  if (c->packed) {
    d->in[n] = S3(c->B, c->T, (c->H + 2 * c->KVH) * c->hd);
    in[n++] = x[0];
  } else {
    d->in[n] = S3(c->B, c->T, c->H * c->hd);
    in[n++] = x[0];
    d->in[n] = S3(c->B, c->S, c->KVH * c->hd);
    in[n++] = x[1];
    d->in[n] = S3(c->B, c->S, c->KVH * c->hd);
    in[n++] = x[2];
  }
  for (int i = first; i < n; i++) d->in_dtype[i] = d->din_dtype[i] = dt;
  if (c->lens) {
    d->in[n] = S1(c->B);
    d->in_dtype[n] = OP_I32;
    in[n++] = (const float *)len;
  }
  d->out_dtype = dt;
  return n;
}

/* Runs one form forward and backward: t->o, t->dq, t->dk, t->dv. */
static void run_form(const acase *c, atensors *t, const arun *r) {
  bool bf = r->bf16;
  op_dtype dt = bf ? OP_BF16 : OP_F32;
  int64_t B = c->B, T = c->T, S = c->S, H = c->H;
  int64_t W = (c->H + 2 * c->KVH) * c->hd, nqkv = B * T * W;
  float *x[3], *dx[3];
  if (c->packed) {
    float *qkv = fzeros(nqkv);
    pack(c, qkv, t->q, t->k, t->v, false);
    x[0] = to_dt(qkv, nqkv, bf), dx[0] = to_dt(NULL, nqkv, bf);
    x[1] = x[2] = dx[1] = dx[2] = NULL;
    free(qkv);
  } else {
    x[0] = to_dt(t->q, nq(c), bf), x[1] = to_dt(t->k, nk(c), bf);
    x[2] = to_dt(t->v, nk(c), bf);
    for (int i = 0; i < 3; i++)
      dx[i] = to_dt(NULL, i ? nk(c) : nq(c), bf);
  }
  float *o = to_dt(NULL, nq(c), bf), *dout = to_dt(t->dout, nq(c), bf);
  /* packed: three kernels write parts of dqkv, zeroed: accumulate */
  bool acc = c->packed;
  if (r->fused) {
    planned f;
    op_desc d = {.type = OP_ATTENTION, .attrs = case_attrs(c)};
    const float *in[4];
    d.nin = bind_inputs(c, &d, x, t->len, bf, in, 0);
    plan(&f, d);
    set_run(&f, r);
    for (int i = 0; i < d.nin; i++) f.b.in[i] = (float *)in[i];
    f.b.out = o, f.b.dout = dout;
    for (int i = 0; i < (c->packed ? 1 : 3); i++) {
      f.b.din[i] = dx[i];
      f.b.din_accumulate[i] = acc;
    }
    run(&f, false, r->reverse);
    run(&f, true, r->reverse);
    unplan(&f);
  } else {
    int64_t np = B * H * T * S;
    op_shape p4 = S4(B, H, T, S);
    planned sc, sm, dr, va;
    op_desc d = {.type = OP_ATTN_SCORES, .attrs = case_attrs(c)};
    float *kx[3] = {x[0], x[1], NULL};
    const float *in[4];
    op_desc dd;
    d.nin = bind_inputs(c, &d, kx, t->len, bf, in, 0);
    if (!c->packed) { /* scores take q, k [, lens] */
      d.in[2] = d.in[3], d.in_dtype[2] = d.in_dtype[3], in[2] = in[3];
      d.nin--;
    }
    d.out_dtype = dt;
    plan(&sc, d);
    dd = (op_desc){.type = OP_SOFTMAX, .nin = 1, .in = {p4},
                   .in_dtype = {dt}, .din_dtype = {dt}, .out_dtype = dt};
    plan(&sm, dd);
    dd.type = OP_DROPOUT;
    dd.attrs.dropout = c->p;
    plan(&dr, dd);
    op_desc dv = {.type = OP_ATTN_VALUES, .nin = 2, .attrs = case_attrs(c)};
    dv.attrs.attn_lens = false;
    dv.in[0] = p4, dv.in_dtype[0] = dv.din_dtype[0] = dt;
    dv.in[1] = c->packed ? S3(B, T, W) : S3(B, S, c->KVH * c->hd);
    dv.in_dtype[1] = dv.din_dtype[1] = dt;
    dv.out_dtype = dt;
    plan(&va, dv);
    set_run(&sc, r), set_run(&sm, r), set_run(&dr, r), set_run(&va, r);
    float *s = to_dt(NULL, np, bf), *p = to_dt(NULL, np, bf);
    float *pd = to_dt(NULL, np, bf), *dpd = to_dt(NULL, np, bf);
    float *dp = to_dt(NULL, np, bf), *ds = to_dt(NULL, np, bf);
    for (int i = 0; i < d.nin; i++) sc.b.in[i] = (float *)in[i];
    sc.b.out = s;
    sm.b.in[0] = s, sm.b.out = p;
    dr.b.in[0] = p, dr.b.out = pd;
    va.b.in[0] = pd, va.b.in[1] = c->packed ? x[0] : x[2], va.b.out = o;
    run(&sc, false, r->reverse), run(&sm, false, r->reverse);
    run(&dr, false, r->reverse), run(&va, false, r->reverse);
    va.b.dout = dout, va.b.din[0] = dpd;
    va.b.din[1] = c->packed ? dx[0] : dx[2];
    va.b.din_accumulate[1] = acc;
    run(&va, true, r->reverse);
    dr.b.dout = dpd, dr.b.din[0] = dp;
    run(&dr, true, r->reverse);
    sm.b.dout = dp, sm.b.din[0] = ds;
    run(&sm, true, r->reverse);
    sc.b.dout = ds, sc.b.din[0] = dx[0], sc.b.din_accumulate[0] = acc;
    if (!c->packed) sc.b.din[1] = dx[1];
    sc.b.din_accumulate[1] = acc;
    run(&sc, true, r->reverse);
    free(s), free(p), free(pd), free(dpd), free(dp), free(ds);
    unplan(&sc), unplan(&sm), unplan(&dr), unplan(&va);
  }
  from_dt(t->o, o, nq(c), bf);
  if (c->packed) {
    float *g = fzeros(nqkv);
    from_dt(g, dx[0], nqkv, bf);
    pack(c, g, t->dq, t->dk, t->dv, true);
    free(g);
  } else {
    from_dt(t->dq, dx[0], nq(c), bf);
    from_dt(t->dk, dx[1], nk(c), bf);
    from_dt(t->dv, dx[2], nk(c), bf);
  }
  for (int i = 0; i < 3; i++) free(x[i]), free(dx[i]);
  free(o), free(dout);
}

/* max |got - want| <= tol max |want| */
static void expect_near(const char *what, const acase *c, const float *got,
                        const double *want, int64_t n, double tol) {
  double scale = 0, worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++) {
    scale = fmax(scale, fabs(want[i]));
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= worst)) worst = e, at = i;
  }
  if (!(worst <= tol * scale + 1e-30))
    fail_msg("%s (B%lld T%lld S%lld H%lld KVH%lld hd%lld causal %d packed "
             "%d lens %d p %g): [%lld] = %.9g, want %.9g (error %.3g of "
             "scale %.3g)",
             what, (long long)c->B, (long long)c->T, (long long)c->S,
             (long long)c->H, (long long)c->KVH, (long long)c->hd, c->causal,
             c->packed, c->lens, (double)c->p, (long long)at, got[at],
             want[at], worst, scale);
}

static void check_case(const acase *c, bool fused) {
  atensors t;
  tensors_new(c, &t);
  arun r = {.fused = fused, .training = true, .seed = 11, .step = 3};
  run_form(c, &t, &r);
  double *o = calloc((size_t)nq(c), sizeof *o);
  double *dq = calloc((size_t)nq(c), sizeof *dq);
  double *dk = calloc((size_t)nk(c), sizeof *dk);
  double *dv = calloc((size_t)nk(c), sizeof *dv);
  reference(c, &t, counter_rng_key(11, 0, 3), o, dq, dk, dv);
  const char *f = fused ? "fused" : "materialized";
  char w[64];
  snprintf(w, sizeof w, "%s out", f), expect_near(w, c, t.o, o, nq(c), 1e-5);
  snprintf(w, sizeof w, "%s dq", f), expect_near(w, c, t.dq, dq, nq(c), 1e-5);
  snprintf(w, sizeof w, "%s dk", f), expect_near(w, c, t.dk, dk, nk(c), 1e-5);
  snprintf(w, sizeof w, "%s dv", f), expect_near(w, c, t.dv, dv, nk(c), 1e-5);
  free(o), free(dq), free(dk), free(dv);
  tensors_free(&t);
}

static const acase cases[] = {
    /* B T S H KVH hd causal packed lens scale p */
    {2, 13, 13, 2, 2, 8, false, false, false, 0, 0},  /* bidirectional */
    {2, 13, 13, 2, 2, 8, true, false, false, 0, 0},   /* causal */
    {2, 13, 21, 2, 2, 8, false, false, false, 0, 0},  /* cross, S > T */
    {2, 21, 9, 2, 2, 8, true, false, false, 0, 0},    /* cross, S < T */
    {2, 13, 21, 2, 2, 8, true, false, false, 0, 0},   /* causal, S > T */
    {2, 11, 11, 4, 2, 8, true, false, false, 0, 0},   /* GQA */
    {2, 11, 15, 4, 1, 8, false, false, false, 0, 0},  /* multi-query */
    {3, 11, 15, 4, 2, 8, false, false, true, 0, 0},   /* key lengths */
    {3, 11, 11, 4, 2, 8, true, false, true, 0, 0},    /* and causal */
    {2, 11, 11, 2, 2, 8, true, false, false, 0.7f, 0}, /* scale */
    {2, 11, 11, 2, 2, 8, true, true, false, 0, 0},    /* packed */
    {2, 11, 11, 4, 2, 8, false, true, true, 0, 0},    /* packed GQA lens */
    {2, 11, 15, 4, 2, 8, true, false, true, 0, 0.3f}, /* dropout */
    {2, 11, 11, 4, 1, 8, true, true, false, 0, 0.5f}, /* packed dropout */
    {1, 300, 200, 4, 2, 16, false, false, true, 0, 0}, /* blocks of 128 */
    {1, 200, 300, 2, 1, 16, true, false, false, 0, 0.2f},
    {1, 260, 260, 2, 1, 16, true, true, true, 0, 0},
};
#define NCASES (sizeof cases / sizeof cases[0])

static void test_forms_match_reference(void **state) {
  (void)state;
  for (size_t i = 0; i < NCASES; i++) {
    check_case(&cases[i], true);
    check_case(&cases[i], false);
  }
}

/* L = sum o * dout in double from an f32 run. */
static double loss_of(const acase *c, atensors *t, const arun *r) {
  run_form(c, t, r);
  double L = 0;
  for (int64_t i = 0; i < nq(c); i++) L += (double)t->o[i] * t->dout[i];
  return L;
}

/* Central differences of L against the op's gradients at a few entries of
 * each of q, k and v. */
static void fd_case(const acase *c, bool fused) {
  atensors t;
  tensors_new(c, &t);
  arun r = {.fused = fused, .training = true, .seed = 5, .step = 1};
  run_form(c, &t, &r);
  float *grad[3] = {fzeros(nq(c)), fzeros(nk(c)), fzeros(nk(c))};
  memcpy(grad[0], t.dq, (size_t)nq(c) * sizeof(float));
  memcpy(grad[1], t.dk, (size_t)nk(c) * sizeof(float));
  memcpy(grad[2], t.dv, (size_t)nk(c) * sizeof(float));
  float *x[3] = {t.q, t.k, t.v};
  int64_t n[3] = {nq(c), nk(c), nk(c)};
  const double eps = 1e-2;
  for (int which = 0; which < 3; which++)
    for (int s = 0; s < 12; s++) {
      int64_t i = (int64_t)uniform(0, (double)n[which]);
      float keep = x[which][i];
      x[which][i] = keep + (float)eps;
      double up = loss_of(c, &t, &r);
      x[which][i] = keep - (float)eps;
      double down = loss_of(c, &t, &r);
      x[which][i] = keep;
      double fd = (up - down) / (2 * eps), g = grad[which][i];
      if (fabs(fd - g) > 2e-3 + 1e-2 * fabs(fd))
        fail_msg("%s d%c[%lld] = %.6g, finite differences %.6g",
                 fused ? "fused" : "materialized", "qkv"[which],
                 (long long)i, g, fd);
    }
  for (int i = 0; i < 3; i++) free(grad[i]);
  tensors_free(&t);
}

static void test_finite_differences(void **state) {
  (void)state;
  const acase fd[] = {
      {1, 5, 7, 2, 1, 4, true, false, true, 0, 0},
      {2, 6, 6, 4, 2, 4, false, true, false, 0.9f, 0},
      {1, 6, 9, 2, 2, 4, false, false, true, 0, 0.4f},
  };
  for (size_t i = 0; i < sizeof fd / sizeof fd[0]; i++) {
    fd_case(&fd[i], true);
    fd_case(&fd[i], false);
  }
}

/* test_ops_bf16's tolerance: 1e-2 relative in L2, no element off by more
 * than 3e-2 of the largest. */
static void expect_bf16(const char *what, const float *got, const float *want,
                        int64_t n) {
  double err2 = 0, ref2 = 0, maxref = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = (double)got[i] - want[i];
    err2 += e * e, ref2 += (double)want[i] * want[i];
    maxref = fmax(maxref, fabs(want[i]));
  }
  if (sqrt(err2) > 1e-2 * sqrt(ref2) + 1e-30)
    fail_msg("%s: bf16 error %.3g relative (L2)", what,
             sqrt(err2) / fmax(sqrt(ref2), 1e-30));
  for (int64_t i = 0; i < n; i++)
    if (fabs(got[i] - want[i]) > 3e-2 * maxref)
      fail_msg("%s[%lld]: bf16 %.6g, f32 %.6g", what, (long long)i, got[i],
               want[i]);
}

static void test_bf16_against_f32(void **state) {
  (void)state;
  for (size_t i = 0; i < NCASES; i++)
    for (int fused = 0; fused < 2; fused++) {
      const acase *c = &cases[i];
      atensors a, b;
      tensors_new(c, &a);
      tensors_new(c, &b);
      /* the same values, rounded to bf16 for both */
      float *src[4] = {a.q, a.k, a.v, a.dout};
      float *dst[4] = {b.q, b.k, b.v, b.dout};
      int64_t n[4] = {nq(c), nk(c), nk(c), nq(c)};
      for (int x = 0; x < 4; x++)
        for (int64_t e = 0; e < n[x]; e++)
          src[x][e] = dst[x][e] = bf16_to_f32(bf16_from_f32(src[x][e]));
      arun r32 = {.fused = fused, .training = true, .seed = 2, .step = 9};
      arun r16 = r32;
      r16.bf16 = true;
      run_form(c, &a, &r32);
      run_form(c, &b, &r16);
      expect_bf16("out", b.o, a.o, nq(c));
      expect_bf16("dq", b.dq, a.dq, nq(c));
      expect_bf16("dk", b.dk, a.dk, nk(c));
      expect_bf16("dv", b.dv, a.dv, nk(c));
      tensors_free(&a);
      tensors_free(&b);
    }
}

/* Grouped-query attention is multi-head attention on key/value heads
 * repeated over each group: the same output and dq bitwise, and dk, dv the
 * sums of the repeated heads' (in order). */
static void test_gqa_is_repeated_mha(void **state) {
  (void)state;
  const acase gqa[] = {{2, 150, 140, 4, 2, 16, true, false, true, 0, 0},
                       {1, 40, 40, 4, 1, 8, false, false, false, 0, 0.3f}};
  for (size_t x = 0; x < 2; x++)
    for (int fused = 0; fused < 2; fused++) {
      const acase *c = &gqa[x];
      acase m = *c;
      m.KVH = c->H;
      atensors g, h;
      tensors_new(c, &g);
      tensors_new(&m, &h);
      memcpy(h.q, g.q, (size_t)nq(c) * sizeof(float));
      memcpy(h.dout, g.dout, (size_t)nq(c) * sizeof(float));
      int64_t grp = c->H / c->KVH, hd = c->hd;
      for (int64_t r = 0; r < c->B * c->S; r++)
        for (int64_t hh = 0; hh < c->H; hh++)
          for (int64_t d = 0; d < hd; d++) {
            int64_t src = (r * c->KVH + hh / grp) * hd + d;
            h.k[(r * c->H + hh) * hd + d] = g.k[src];
            h.v[(r * c->H + hh) * hd + d] = g.v[src];
          }
      arun r = {.fused = fused, .training = true, .seed = 4, .step = 2};
      run_form(c, &g, &r);
      run_form(&m, &h, &r);
      assert_memory_equal(g.o, h.o, (size_t)nq(c) * sizeof(float));
      assert_memory_equal(g.dq, h.dq, (size_t)nq(c) * sizeof(float));
      for (int64_t r2 = 0; r2 < c->B * c->S; r2++)
        for (int64_t kv = 0; kv < c->KVH; kv++)
          for (int64_t d = 0; d < hd; d++) {
            double sk = 0, sv = 0, mk = 0;
            for (int64_t i = 0; i < grp; i++) {
              int64_t at = (r2 * c->H + kv * grp + i) * hd + d;
              sk += h.dk[at], sv += h.dv[at];
              mk = fmax(mk, fabs(h.dk[at]) + fabs(h.dv[at]));
            }
            int64_t at = (r2 * c->KVH + kv) * hd + d;
            if (fabs(g.dk[at] - sk) > 1e-5 * (mk + 1e-3) ||
                fabs(g.dv[at] - sv) > 1e-5 * (mk + 1e-3))
              fail_msg("%s: dk/dv of kv head %lld row %lld: %g %g, summed "
                       "heads %g %g",
                       fused ? "fused" : "materialized", (long long)kv,
                       (long long)r2, g.dk[at], g.dv[at], sk, sv);
          }
      tensors_free(&g);
      tensors_free(&h);
    }
}

/* The fused op and the materialized path draw the same dropout mask (the
 * probabilities' (b, h, t, key) under the first dropout site). */
static void test_fused_matches_materialized_with_dropout(void **state) {
  (void)state;
  const acase c = {2, 140, 150, 4, 2, 16, true, false, true, 0, 0.25f};
  atensors f, m;
  tensors_new(&c, &f);
  tensors_new(&c, &m);
  memcpy(m.q, f.q, (size_t)nq(&c) * sizeof(float));
  memcpy(m.k, f.k, (size_t)nk(&c) * sizeof(float));
  memcpy(m.v, f.v, (size_t)nk(&c) * sizeof(float));
  memcpy(m.dout, f.dout, (size_t)nq(&c) * sizeof(float));
  arun rf = {.fused = true, .training = true, .seed = 77, .step = 5};
  arun rm = rf;
  rm.fused = false;
  run_form(&c, &f, &rf);
  run_form(&c, &m, &rm);
  double *ref = calloc((size_t)nk(&c), sizeof *ref);
  float *pairs[4][2] = {{f.o, m.o}, {f.dq, m.dq}, {f.dk, m.dk}, {f.dv, m.dv}};
  int64_t n[4] = {nq(&c), nq(&c), nk(&c), nk(&c)};
  for (int x = 0; x < 4; x++) {
    double *w = realloc(ref, (size_t)n[x] * sizeof *w);
    assert_non_null(w);
    ref = w;
    for (int64_t i = 0; i < n[x]; i++) ref[i] = pairs[x][1][i];
    expect_near("fused vs materialized", &c, pairs[x][0], ref, n[x], 1e-5);
  }
  free(ref);
  tensors_free(&f);
  tensors_free(&m);
}

/* Outputs do not read the keys and values past a row's key length. */
static void test_padded_keys_change_nothing(void **state) {
  (void)state;
  const acase c = {3, 140, 150, 4, 2, 16, false, false, true, 0, 0.2f};
  for (int fused = 0; fused < 2; fused++) {
    atensors a, b;
    tensors_new(&c, &a);
    tensors_new(&c, &b);
    memcpy(b.q, a.q, (size_t)nq(&c) * sizeof(float));
    memcpy(b.dout, a.dout, (size_t)nq(&c) * sizeof(float));
    int64_t w = c.KVH * c.hd;
    for (int64_t bb = 0; bb < c.B; bb++)
      for (int64_t s = 0; s < c.S; s++)
        for (int64_t e = 0; e < w; e++) {
          int64_t at = (bb * c.S + s) * w + e;
          bool real = s < a.len[bb];
          b.k[at] = real ? a.k[at] : 100.0f;
          b.v[at] = real ? a.v[at] : -50.0f;
        }
    arun r = {.fused = fused, .training = true, .seed = 1, .step = 1};
    run_form(&c, &a, &r);
    run_form(&c, &b, &r);
    assert_memory_equal(a.o, b.o, (size_t)nq(&c) * sizeof(float));
    assert_memory_equal(a.dq, b.dq, (size_t)nq(&c) * sizeof(float));
    for (int64_t bb = 0; bb < c.B; bb++) /* padded keys: no gradient */
      for (int64_t s = a.len[bb]; s < c.S; s++)
        for (int64_t e = 0; e < w; e++) {
          assert_true(b.dk[(bb * c.S + s) * w + e] == 0.0f);
          assert_true(b.dv[(bb * c.S + s) * w + e] == 0.0f);
        }
    tensors_free(&a);
    tensors_free(&b);
  }
}

/* ---- dropout, the op ---- */

/* y = dropout(x) for n elements at (step, training), tiles reversed or not. */
static void run_dropout(float p, const float *x, float *y, float *dx,
                        int64_t n, uint64_t step, bool training,
                        bool reverse) {
  planned d;
  plan(&d, (op_desc){.type = OP_DROPOUT, .nin = 1, .in = {S1(n)},
                     .attrs = {.dropout = p, .rng_stream = 3}});
  arun r = {.training = training, .seed = 99, .step = step};
  set_run(&d, &r);
  d.b.in[0] = (float *)x, d.b.out = y;
  run(&d, false, reverse);
  d.b.dout = (float *)x, d.b.din[0] = dx; /* dy = x */
  run(&d, true, reverse);
  unplan(&d);
}

static void test_dropout_op(void **state) {
  (void)state;
  const int64_t n = 1 << 20;
  const float p = 0.3f;
  float *x = fzeros(n), *y = fzeros(n), *dx = fzeros(n), *y2 = fzeros(n);
  float *dx2 = fzeros(n);
  for (int64_t i = 0; i < n; i++) x[i] = 1.0f + (float)(i % 7);
  run_dropout(p, x, y, dx, n, 1, true, false);
  int64_t zeros = 0;
  for (int64_t i = 0; i < n; i++) {
    if (y[i] == 0.0f) {
      zeros++;
      assert_true(dx[i] == 0.0f);
    } else {
      assert_true(y[i] == x[i] * (1.0f / (1.0f - p)));
      assert_true(dx[i] == y[i]); /* the backward uses the forward's mask */
    }
  }
  double frac = (double)zeros / (double)n;
  if (fabs(frac - p) > 0.01 * p)
    fail_msg("dropped %.5f of the elements, p %.2f", frac, (double)p);
  /* tiles in another order: bitwise the same */
  run_dropout(p, x, y2, dx2, n, 1, true, true);
  assert_memory_equal(y, y2, (size_t)n * sizeof *y);
  assert_memory_equal(dx, dx2, (size_t)n * sizeof *dx);
  /* another step: another mask */
  run_dropout(p, x, y2, dx2, n, 2, true, false);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += (y[i] == 0.0f) != (y2[i] == 0.0f);
  assert_true(differ > n / 4);
  /* outside training: the identity */
  run_dropout(p, x, y2, dx2, n, 1, false, false);
  assert_memory_equal(x, y2, (size_t)n * sizeof *y);
  free(x), free(y), free(dx), free(y2), free(dx2);
}

/* ---- the graph ---- */

enum { GB = 2, GT = 24, GS = 20, GH = 4, GKVH = 2, GHD = 8, GV = 11 };

typedef struct agraph {
  remat_runtime *rt;
  remat_graph *g;
  remat_tensor *q, *k, *v, *len, *targets, *out, *loss;
} agraph;

/* q, k, v parameters -> attention (dropout 0.2) -> dropout 0.1 -> linear ->
 * cross entropy. */
static remat_status graph_open(agraph *a, int threads, const char *topo,
                               const char *policy, bool fused, bool train,
                               const remat_optimizer *opt) {
  memset(a, 0, sizeof *a);
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            (topo ? REMAT_SET_TOPOLOGY : 0u),
                     .num_threads = threads,
                     .policy = policy,
                     .topology = topo};
  remat_status s = remat_runtime_create(&rc, &a->rt);
  if (s == REMAT_OK) s = remat_graph_create(a->rt, &a->g);
  if (s != REMAT_OK) return s;
  remat_graph *g = a->g;
  remat_graph_seed(g, 123);
  int64_t qd[3] = {GB, GT, GH * GHD}, kd[3] = {GB, GS, GKVH * GHD};
  int64_t ld[1] = {GB}, td[2] = {GB, GT}, wd[2] = {GV, GH * GHD};
  a->q = remat_param(g, "q", 3, qd, REMAT_INIT_NORMAL, 1.0f);
  a->k = remat_param(g, "k", 3, kd, REMAT_INIT_NORMAL, 1.0f);
  a->v = remat_param(g, "v", 3, kd, REMAT_INIT_NORMAL, 1.0f);
  remat_tensor *w = remat_param(g, "w", 2, wd, REMAT_INIT_NORMAL, 0.5f);
  a->len = remat_input(g, "len", REMAT_I32, 1, ld);
  remat_attention_config c = {.heads = GH, .kv_heads = GKVH, .causal = 1,
                              .key_lengths = a->len, .dropout = 0.2f,
                              .fused = fused};
  remat_tensor *o = remat_attention(g, a->q, a->k, a->v, &c);
  a->out = remat_dropout(g, o, 0.1f);
  if (!train) {
    remat_keep(g, a->out);
    return remat_compile(g, NULL, NULL);
  }
  a->targets = remat_input(g, "targets", REMAT_I32, 2, td);
  remat_tensor *logits = remat_linear(g, a->out, w, NULL);
  a->loss = remat_cross_entropy(g, logits, a->targets);
  s = remat_compile(g, a->loss, opt);
  int32_t t[GB * GT];
  for (int i = 0; i < GB * GT; i++) t[i] = (i * 5 + 3) % GV;
  if (s == REMAT_OK) s = remat_feed(g, a->targets, t, sizeof t);
  return s;
}

static void graph_close(agraph *a) {
  remat_graph_destroy(a->g);
  remat_runtime_destroy(a->rt);
}

static void feed_lens(agraph *a) {
  int32_t len[GB] = {GS, 7};
  assert_int_equal(remat_feed(a->g, a->len, len, sizeof len), REMAT_OK);
}

/* FNV-1a of every parameter's gradient. */
static uint64_t grad_hash(remat_graph *g) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    float *grad = malloc(n * sizeof *grad);
    assert_non_null(grad);
    assert_int_equal(remat_read_grad(g, p, grad, n * sizeof *grad), REMAT_OK);
    const unsigned char *bytes = (const unsigned char *)grad;
    for (size_t k = 0; k < n * sizeof *grad; k++)
      h = (h ^ bytes[k]) * 1099511628211ull;
    free(grad);
  }
  return h;
}

static const remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.05f};

/* Gradients of the first step and of the second (no optimizer: the same
 * parameters, so only the dropout masks change). */
static void graph_grads(int threads, const char *topo, const char *policy,
                        bool fused, uint64_t out[2]) {
  agraph a;
  if (graph_open(&a, threads, topo, policy, fused, true, NULL) != REMAT_OK)
    fail_msg("%s, %d threads, %s: %s", policy, threads, topo ? topo : "",
             remat_last_error());
  feed_lens(&a);
  for (int s = 0; s < 2; s++) {
    if (remat_step(a.g, NULL) != REMAT_OK) fail_msg("%s", remat_last_error());
    out[s] = grad_hash(a.g);
  }
  graph_close(&a);
}

static void test_dropout_replayed_by_recompute(void **state) {
  (void)state;
  const char *policies[] = {"everything_saveable", "nothing_saveable",
                            "dots_saveable",
                            "save_only_these_names:attn_probs"};
  for (int fused = 0; fused < 2; fused++) {
    uint64_t want[2];
    graph_grads(1, NULL, policies[0], fused, want);
    assert_true(want[0] != want[1]); /* the second step's mask differs */
    for (int p = 0; p < (fused ? 3 : 4); p++) /* fused: no attn_probs */
      for (int threads = 1; threads <= 4; threads *= 2) {
        uint64_t got[2];
        graph_grads(threads, NULL, policies[p], fused, got);
        if (got[0] != want[0] || got[1] != want[1])
          fail_msg("%s, %s, %d threads: gradients differ",
                   fused ? "fused" : "materialized", policies[p], threads);
      }
    uint64_t numa[2];
    graph_grads(2, "package:2 numa:1 core:1 pu:1", "nothing_saveable", fused,
                numa);
    assert_true(numa[0] == want[0] && numa[1] == want[1]);
  }
}

/* remat_forward drops nothing: the output is that of a graph without
 * dropout... which equals dropping with p 0: checked against the training
 * graph's forward run with everything kept. */
static void test_forward_drops_nothing(void **state) {
  (void)state;
  for (int fused = 0; fused < 2; fused++) {
    agraph a;
    assert_int_equal(graph_open(&a, 2, NULL, "everything_saveable", fused,
                                false, NULL),
                     REMAT_OK);
    feed_lens(&a);
    assert_int_equal(remat_forward(a.g, NULL), REMAT_OK);
    float *got = fzeros(GB * GT * GH * GHD);
    assert_int_equal(remat_read(a.g, a.out, got,
                                GB * GT * GH * GHD * sizeof(float)),
                     REMAT_OK);
    /* the reference without dropout, from the graph's own parameters */
    acase c = {GB, GT, GS, GH, GKVH, GHD, true, false, true, 0, 0};
    atensors t;
    tensors_new(&c, &t);
    assert_int_equal(remat_read(a.g, a.q, t.q, nq(&c) * sizeof(float)), 0);
    assert_int_equal(remat_read(a.g, a.k, t.k, nk(&c) * sizeof(float)), 0);
    assert_int_equal(remat_read(a.g, a.v, t.v, nk(&c) * sizeof(float)), 0);
    t.len[0] = GS, t.len[1] = 7;
    double *o = calloc((size_t)nq(&c), sizeof *o);
    double *d1 = calloc((size_t)nq(&c), sizeof *o);
    double *d2 = calloc((size_t)nk(&c), sizeof *o);
    double *d3 = calloc((size_t)nk(&c), sizeof *o);
    reference(&c, &t, 0, o, d1, d2, d3);
    expect_near("remat_forward", &c, got, o, nq(&c), 1e-5);
    free(o), free(d1), free(d2), free(d3), free(got);
    tensors_free(&t);
    graph_close(&a);
  }
}

static float *params(remat_graph *g, size_t *n) {
  *n = 0;
  for (int i = 0; i < remat_num_params(g); i++)
    *n += (size_t)remat_tensor_numel(remat_param_at(g, i));
  float *all = fzeros((int64_t)*n), *at = all;
  for (int i = 0; i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    size_t k = (size_t)remat_tensor_numel(p);
    assert_int_equal(remat_read(g, p, at, k * sizeof *at), REMAT_OK);
    at += k;
  }
  return all;
}

static void test_bad_key_length_refused(void **state) {
  (void)state;
  agraph a;
  assert_int_equal(
      graph_open(&a, 1, NULL, "nothing_saveable", true, true, &sgd),
      REMAT_OK);
  feed_lens(&a);
  assert_int_equal(remat_step(a.g, NULL), REMAT_OK);
  size_t n0, n1;
  float *before = params(a.g, &n0);
  int32_t zero[GB] = {5, 0}, over[GB] = {GS + 1, 3};
  assert_int_equal(remat_feed(a.g, a.len, zero, sizeof zero),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_feed: 'len' holds key length 0 for batch row 1: "
                      "each row's key length must be 1 to 20 (the "
                      "attention's keys)");
  assert_int_equal(remat_feed(a.g, a.len, over, sizeof over),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_feed: 'len' holds key length 21 for batch row "
                      "0: each row's key length must be 1 to 20 (the "
                      "attention's keys)");
  float *after = params(a.g, &n1);
  assert_int_equal(n0, n1);
  assert_memory_equal(before, after, n0 * sizeof *before);
  free(before), free(after);
  graph_close(&a);
}

/* ---- builder errors ---- */

static void expect_build_error(const char *want, int64_t qw, int64_t kw,
                               int64_t vs, int heads, int kv_heads,
                               int len_dtype, int64_t len_n, float p,
                               bool fused) {
  remat_runtime *rt;
  remat_graph *g;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t qd[3] = {2, 5, qw}, kd[3] = {2, 7, kw}, vd[3] = {2, vs, kw};
  int64_t ld[1] = {len_n};
  remat_tensor *q = remat_input(g, "q", REMAT_F32, 3, qd);
  remat_tensor *k = remat_input(g, "k", REMAT_F32, 3, kd);
  remat_tensor *v = remat_input(g, "v", REMAT_F32, 3, vd);
  remat_tensor *len =
      len_n ? remat_input(g, "len", (remat_dtype)len_dtype, 1, ld) : NULL;
  remat_attention_config c = {.heads = heads, .kv_heads = kv_heads,
                              .key_lengths = len, .dropout = p,
                              .fused = fused};
  assert_null(remat_attention(g, q, k, v, &c));
  assert_string_equal(remat_graph_error(g), want);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

static void test_builder_errors(void **state) {
  (void)state;
  for (int fused = 0; fused < 2; fused++) {
    const char *op = fused ? "attention" : "attn_scores";
    char want[256];
    snprintf(want, sizeof want,
             "%s: q [2,5,12] with 5 heads: the width of q (12) must be "
             "divisible by the number of heads",
             op);
    expect_build_error(want, 12, 12, 7, 5, 0, REMAT_I32, 0, 0, fused);
    snprintf(want, sizeof want,
             "%s: 4 heads and 3 kv heads: the heads must be a positive "
             "multiple of the kv heads (each kv head serves heads / kv heads "
             "query heads)",
             op);
    expect_build_error(want, 16, 12, 7, 4, 3, REMAT_I32, 0, 0, fused);
    snprintf(want, sizeof want,
             "%s: key lengths [3] int32: the key lengths must be an int32 "
             "[B] = [2]",
             op);
    expect_build_error(want, 16, 8, 7, 4, 2, REMAT_I32, 3, 0, fused);
    snprintf(want, sizeof want, "%s: key lengths [2] must be int32, not f32",
             op);
    expect_build_error(want, 16, 8, 7, 4, 2, REMAT_F32, 2, 0, fused);
    snprintf(want, sizeof want,
             "%s: q [2,5,16] and k [2,7,12] with 4 heads and 2 kv heads: k "
             "must be [B,S,kv heads * head dim] = [2,S,8]",
             op);
    expect_build_error(want, 16, 12, 7, 4, 2, REMAT_I32, 0, 0, fused);
    expect_build_error("attention: k [2,7,8] and v [2,6,8]: k and v must "
                       "have the same shape",
                       16, 8, 6, 4, 2, REMAT_I32, 0, 0, fused);
    expect_build_error("attention: dropout probability 1 is not valid: "
                       "expected a probability in [0,1)",
                       16, 8, 7, 4, 2, REMAT_I32, 0, 1.0f, fused);
    expect_build_error("attention: dropout probability nan is not valid: "
                       "expected a probability in [0,1)",
                       16, 8, 7, 4, 2, REMAT_I32, 0, NAN, fused);
  }
  remat_runtime *rt;
  remat_graph *g;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t d[1] = {4};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 1, d);
  assert_null(remat_dropout(g, x, -0.1f));
  assert_string_equal(remat_graph_error(g),
                      "dropout: dropout probability -0.1 is not valid: "
                      "expected a probability in [0,1)");
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

int main(void) {
  rng_state = 0x5eed1234abcdull;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forms_match_reference),
      cmocka_unit_test(test_finite_differences),
      cmocka_unit_test(test_bf16_against_f32),
      cmocka_unit_test(test_gqa_is_repeated_mha),
      cmocka_unit_test(test_fused_matches_materialized_with_dropout),
      cmocka_unit_test(test_padded_keys_change_nothing),
      cmocka_unit_test(test_dropout_op),
      cmocka_unit_test(test_dropout_replayed_by_recompute),
      cmocka_unit_test(test_forward_drops_nothing),
      cmocka_unit_test(test_bad_key_length_refused),
      cmocka_unit_test(test_builder_errors),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
