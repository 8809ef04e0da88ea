/* Tests of the Llama-family ops (slice, mul, silu, scale, swiglu, rmsnorm,
 * rope): each op's forward against a double precision reference and its
 * input gradients against central differences of L = sum(out * seed), in
 * overwrite, accumulate and skipped (NULL din) modes, with shapes that cut
 * into several tiles and blocks; the bf16 kernels against the f32 ones
 * (test_ops_bf16's tolerances) and their bits with the tiles reversed; a
 * small gated feed-forward with rope through the graph, whose gradients
 * match finite differences of the step's loss and are bitwise the same
 * under every policy at 1 and 2 threads; and the exact message of every
 * bad input. */
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
#define OP_FD_FWD_TOL 1e-5
#include "op_fd.h"
#include "op_fixture.h"
#include "ops/op.h"
#include "remat.h"

/* ---- double precision references ---- */

// x is (N,C), y is (N,len): y[r, j] = x[r, start + j]
static void ref_slice(const op_desc *d, double *const in[], double *out) {
  int64_t N = rows_of(&d->in[0]), C = last(&d->in[0]), L = d->attrs.len;
  for (int64_t r = 0; r < N; r++)
    for (int64_t j = 0; j < L; j++)
      out[r * L + j] = in[0][r * C + d->attrs.start + j];
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static void ref_mul(const op_desc *d, double *const in[], double *out) {
  for (int64_t i = 0; i < op_numel(&d->in[0]); i++)
    out[i] = in[0][i] * in[1][i];
}

static void ref_silu(const op_desc *d, double *const in[], double *out) {
  for (int64_t i = 0; i < op_numel(&d->in[0]); i++)
    out[i] = in[0][i] * sigmoid(in[0][i]);
}

static void ref_scale(const op_desc *d, double *const in[], double *out) {
  for (int64_t i = 0; i < op_numel(&d->in[0]); i++)
    out[i] = in[0][i] * d->attrs.scale;
}

static void ref_swiglu(const op_desc *d, double *const in[], double *out) {
  for (int64_t i = 0; i < op_numel(&d->in[0]); i++)
    out[i] = in[0][i] * sigmoid(in[0][i]) * in[1][i];
}

// x is (N,C), gamma is (C)
static void ref_rmsnorm(const op_desc *d, double *const in[], double *out) {
  int64_t N = rows_of(&d->in[0]), C = last(&d->in[0]);
  double eps = d->attrs.eps > 0.0f ? d->attrs.eps : 1e-6;
  for (int64_t r = 0; r < N; r++) {
    double ms = 0;
    for (int64_t c = 0; c < C; c++) ms += in[0][r * C + c] * in[0][r * C + c];
    double rstd = 1.0 / sqrt(ms / C + eps);
    for (int64_t c = 0; c < C; c++)
      out[r * C + c] = in[0][r * C + c] * rstd * in[1][c];
  }
}

// Llama 3's rope_scaling of an inverse frequency f, from Hugging Face's
// definition: wavelength L = 2 pi / f; L > orig / low: f / factor;
// L < orig / high: f; between: (1 - s) f / factor + s f with
// s = (orig / L - low) / (high - low). factor 0: f.
static double llama3_freq(const op_attrs *a, double f) {
  if (a->rope_factor == 0.0f) return f;
  double L = 2.0 * M_PI / f, orig = a->rope_orig;
  if (L > orig / a->rope_low) return f / a->rope_factor;
  if (L < orig / a->rope_high) return f;
  double s = (orig / L - a->rope_low) / (a->rope_high - a->rope_low);
  return (1.0 - s) * f / a->rope_factor + s * f;
}

// x is (B,T,H*hd), in Hugging Face's form: with cos and sin of length hd
// (the hd/2 frequencies twice), y = x * cos + rotate_half(x) * sin where
// rotate_half(x) = (-x2, x1)
static void ref_rope(const op_desc *d, double *const in[], double *out) {
  int64_t B = d->in[0].dim[0], T = d->in[0].dim[1], W = d->in[0].dim[2];
  int64_t hd = W / d->attrs.heads, half = hd / 2;
  double theta = d->attrs.theta > 0.0f ? d->attrs.theta : 10000.0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t h0 = 0; h0 < W; h0 += hd) {
        const double *x = in[0] + (b * T + t) * W + h0;
        double *y = out + (b * T + t) * W + h0;
        for (int64_t k = 0; k < hd; k++) {
          double freq = llama3_freq(
              &d->attrs, 1.0 / pow(theta, (double)(2 * (k % half)) / hd));
          double rot = k < half ? -x[k + half] : x[k - half];
          y[k] = x[k] * cos(t * freq) + rot * sin(t * freq);
        }
      }
}

/* ---- gradient tests ---- */

static void test_slice(void **state) {
  (void)state;
  /* 2100 rows of 96: 13 row tiles of 170, the last one short */
  op_case c = make_case(OP_SLICE, ref_slice, 1, S3(3, 700, 96));
  c.desc.attrs.start = 32;
  c.desc.attrs.len = 40;
  check_case(&c);
  /* the first and the last columns, and all of them */
  c = make_case(OP_SLICE, ref_slice, 1, S2(50, 7));
  c.desc.attrs.start = 0;
  c.desc.attrs.len = 3;
  check_case(&c);
  c.desc.attrs.start = 3;
  c.desc.attrs.len = 4;
  check_case(&c);
  c.desc.attrs.start = 0;
  c.desc.attrs.len = 7;
  check_case(&c);
}

/* Two slices of one tensor that together cover it, their backwards
 * accumulating into one zero-filled dx (as the runtime runs them): dx is
 * each slice's dy in its own columns. */
static void test_slice_pair_accumulates(void **state) {
  (void)state;
  int64_t N = 400, C = 12, F = 5;
  op_desc d = {.type = OP_SLICE, .nin = 1, .in = {S2(N, C)}};
  op_instance inst[2];
  char err[OP_ERRMSG_MAX];
  float *dy[2], *dx = xcalloc(N * C, sizeof(float));
  op_bufs b = {.din = {dx}, .din_accumulate = {true}};
  for (int k = 0; k < 2; k++) {
    d.attrs.start = k * F;
    d.attrs.len = k ? C - F : F;
    assert_int_equal(op_plan(&d, engine, &inst[k], err), REMAT_OK);
    dy[k] = xcalloc(N * d.attrs.len, sizeof(float));
    for (int64_t j = 0; j < N * d.attrs.len; j++)
      dy[k][j] = (float)uniform(-1, 1);
    op_worker w = {.stream = stream,
                   .scratch = xcalloc(inst[k].scratch_bytes, 1),
                   .scratch_bytes = inst[k].scratch_bytes};
    b.dout = dy[k];
    run_kernels(&inst[k], &b, &w, inst[k].bwd, inst[k].nbwd, k == 1);
    free(w.scratch);
  }
  for (int64_t r = 0; r < N; r++)
    for (int64_t c = 0; c < C; c++) {
      float want = c < F ? dy[0][r * F + c] : dy[1][r * (C - F) + c - F];
      if (dx[r * C + c] != want)
        fail_msg("dx[%lld, %lld] = %g, want %g", (long long)r, (long long)c,
                 dx[r * C + c], want);
    }
  for (int k = 0; k < 2; k++) {
    free(dy[k]);
    op_instance_release(&inst[k]);
  }
  free(dx);
}

static void test_mul(void **state) {
  (void)state;
  /* 140000 elements: two full chunks of 65536 and a short one, each in
   * blocks of 2048 with a short last block */
  op_case c = make_case(OP_MUL, ref_mul, 2, S2(2, 70000), S2(2, 70000));
  check_case(&c);
  c = make_case(OP_MUL, ref_mul, 2, S3(3, 5, 7), S3(3, 5, 7));
  check_case(&c);
}

static void test_silu(void **state) {
  (void)state;
  op_case c = make_case(OP_SILU, ref_silu, 1, S2(2, 70000));
  c.lo[0] = -8;
  c.hi[0] = 8;
  check_case(&c);
}

static void test_scale(void **state) {
  (void)state;
  op_case c = make_case(OP_SCALE, ref_scale, 1, S2(2, 70000));
  c.desc.attrs.scale = -0.75f;
  check_case(&c);
  c = make_case(OP_SCALE, ref_scale, 1, S1(9));
  c.desc.attrs.scale = 16.0f;
  check_case(&c);
}

static void test_swiglu(void **state) {
  (void)state;
  op_case c = make_case(OP_SWIGLU, ref_swiglu, 2, S2(2, 70000), S2(2, 70000));
  c.lo[0] = -6;
  c.hi[0] = 6;
  check_case(&c);
}

static void test_rmsnorm(void **state) {
  (void)state;
  /* 600 rows of 48: tiles of 341 rows, the second one short; dgamma from
   * two partials */
  op_case c = make_case(OP_RMSNORM, ref_rmsnorm, 2, S2(600, 48), S1(48));
  c.desc.attrs.eps = 1e-5f;
  check_case(&c);
  /* 300 columns: dgamma in two column blocks; eps 0 means 1e-6, and rows
   * of small values make eps matter */
  c = make_case(OP_RMSNORM, ref_rmsnorm, 2, S3(3, 5, 300), S1(300));
  c.lo[0] = -2e-3;
  c.hi[0] = 2e-3;
  check_case(&c);
  c.desc.attrs.eps = 1e-2f;
  check_case(&c);
}

static void test_rope(void **state) {
  (void)state;
  /* 600 rows of 96 (3 heads of 32): 4 row tiles, positions 0..199 */
  op_case c = make_case(OP_ROPE, ref_rope, 1, S3(3, 200, 96));
  c.desc.attrs.heads = 3;
  check_case(&c);
  /* Llama 3's theta, head dim 8; theta 0 means 10000 */
  c = make_case(OP_ROPE, ref_rope, 1, S3(2, 9, 16));
  c.desc.attrs.heads = 2;
  c.desc.attrs.theta = 500000.0f;
  check_case(&c);
  c.desc.attrs.theta = 0.0f;
  c.desc.attrs.heads = 4;
  check_case(&c);
  /* Llama 3's scaling: at theta 500000 and head dim 16 the wavelengths
   * 6.3, 32.5 and 167 are kept, blended and slowed for orig 64 */
  c = make_case(OP_ROPE, ref_rope, 1, S3(2, 40, 32));
  c.desc.attrs.heads = 2;
  c.desc.attrs.theta = 500000.0f;
  c.desc.attrs.rope_factor = 8.0f;
  c.desc.attrs.rope_low = 1.0f;
  c.desc.attrs.rope_high = 4.0f;
  c.desc.attrs.rope_orig = 64;
  check_case(&c);
}

/* ---- bf16 against f32 (test_ops_bf16's tolerances) ---- */

typedef struct side {
  op_instance inst;
  op_worker worker;
  op_bufs b;
  int64_t n[OP_MAX_IN], nout;
} side;

static void side_plan(side *s, op_desc d) {
  memset(s, 0, sizeof *s);
  char err[OP_ERRMSG_MAX];
  remat_status rs = op_plan(&d, engine, &s->inst, err);
  if (rs != REMAT_OK) fail_msg("%s", err);
  s->nout = op_numel(&s->inst.desc.out);
  for (int i = 0; i < d.nin; i++) {
    s->n[i] = op_numel(&d.in[i]);
    s->b.in[i] = xcalloc(s->n[i], op_dtype_size(d.in_dtype[i]));
  }
  s->b.out = xcalloc(s->nout, op_dtype_size(d.out_dtype));
  s->b.dout = xcalloc(s->nout, op_dtype_size(d.out_dtype));
  for (int k = 0; k < s->inst.naux; k++)
    s->b.aux[k] = xcalloc(s->inst.aux_bytes[k], 1);
  for (int k = 0; k < s->inst.nws; k++)
    s->b.ws[k] = xcalloc(s->inst.ws_bytes[k], 1);
  s->worker.stream = stream;
  s->worker.scratch_bytes = s->inst.scratch_bytes;
  s->worker.scratch = xcalloc(s->inst.scratch_bytes, 1);
}

static void side_free(side *s) {
  for (int i = 0; i < OP_MAX_IN; i++) {
    free(s->b.in[i]);
    free(s->b.din[i]);
  }
  free(s->b.out);
  free(s->b.dout);
  for (int k = 0; k < OP_MAX_AUX; k++) free(s->b.aux[k]);
  for (int k = 0; k < OP_MAX_WS; k++) free(s->b.ws[k]);
  free(s->worker.scratch);
  op_instance_release(&s->inst);
}

static double get(const void *p, op_dtype t, int64_t j) {
  if (t == OP_BF16) return bf16_to_f32(((const uint16_t *)p)[j]);
  return ((const float *)p)[j];
}

static void set(void *p, op_dtype t, int64_t j, double v) {
  if (t == OP_BF16)
    ((uint16_t *)p)[j] = bf16_from_f32((float)v);
  else
    ((float *)p)[j] = (float)v;
}

/* got (dtype gt) against the f32 want: relative L2 error at most 1e-2 and
 * no element off by more than 3e-2 of want's largest magnitude. */
static void compare(const char *what, const void *got, op_dtype gt,
                    const float *want, int64_t n) {
  double err2 = 0, ref2 = 0, maxref = 0;
  for (int64_t j = 0; j < n; j++) {
    double g = get(got, gt, j), w = want[j];
    err2 += (g - w) * (g - w);
    ref2 += w * w;
    maxref = fmax(maxref, fabs(w));
  }
  if (!(sqrt(err2) <= 1e-2 * sqrt(ref2) + 1e-30))
    fail_msg("%s: relative L2 error %.3g (bound 0.01)", what,
             sqrt(err2) / fmax(sqrt(ref2), 1e-30));
  for (int64_t j = 0; j < n; j++) {
    double g = get(got, gt, j), w = want[j];
    if (!(fabs(g - w) <= 3e-2 * maxref))
      fail_msg("%s[%lld] = %.6g, f32 gives %.6g (largest %.3g)", what,
               (long long)j, g, w, maxref);
  }
}

static void set_dins(side *s, int mode, float *const init[]) {
  const op_desc *d = &s->inst.desc;
  for (int i = 0; i < d->nin; i++) {
    free(s->b.din[i]);
    s->b.din[i] = NULL;
    if (mode == MODE_SKIP && i % 2 == 0) continue;
    op_dtype t = d->din_dtype[i];
    s->b.din[i] = xcalloc(s->n[i], op_dtype_size(t));
    s->b.din_accumulate[i] = mode == MODE_ACCUMULATE;
    for (int64_t j = 0; j < s->n[i]; j++)
      set(s->b.din[i], t, j, mode == MODE_ACCUMULATE ? init[i][j] : 0.0);
  }
}

/* The case in f32 and in bf16 precision, as the runtime builds it:
 * activations bf16; an input named in `param` is a parameter (f32
 * gradient, read in bf16 unless op_input_keeps_f32). */
static void check_bf16(op_desc d, unsigned param, double lo0, double hi0) {
  side f, h;
  op_desc dh = d;
  dh.out_dtype = OP_BF16;
  for (int i = 0; i < d.nin; i++) {
    bool p = param & (1u << i);
    dh.in_dtype[i] = p && op_input_keeps_f32(d.type, i) ? OP_F32 : OP_BF16;
    dh.din_dtype[i] = p ? OP_F32 : OP_BF16;
  }
  side_plan(&f, d);
  side_plan(&h, dh);
  const char *name = op_name(d.type);
  char what[96];
  for (int i = 0; i < d.nin; i++)
    for (int64_t j = 0; j < f.n[i]; j++) {
      double v = bf16_to_f32(bf16_from_f32(
          (float)(i == 0 ? uniform(lo0, hi0) : uniform(-1, 1))));
      set(f.b.in[i], OP_F32, j, v);
      set(h.b.in[i], dh.in_dtype[i], j, v);
    }
  run_kernels(&f.inst, &f.b, &f.worker, f.inst.fwd, f.inst.nfwd, false);
  run_kernels(&h.inst, &h.b, &h.worker, h.inst.fwd, h.inst.nfwd, false);
  snprintf(what, sizeof what, "%s out", name);
  compare(what, h.b.out, OP_BF16, f.b.out, f.nout);
  for (int64_t j = 0; j < f.nout; j++) {
    double v = bf16_to_f32(bf16_from_f32((float)uniform(-1, 1)));
    set(f.b.dout, OP_F32, j, v);
    set(h.b.dout, OP_BF16, j, v);
  }
  float *init[OP_MAX_IN] = {0};
  for (int i = 0; i < d.nin; i++) {
    init[i] = xcalloc(f.n[i], sizeof(float));
    for (int64_t j = 0; j < f.n[i]; j++)
      init[i][j] = bf16_to_f32(bf16_from_f32((float)uniform(-1, 1)));
  }
  for (int mode = 0; mode < MODE_COUNT; mode++) {
    set_dins(&f, mode, init);
    set_dins(&h, mode, init);
    run_kernels(&f.inst, &f.b, &f.worker, f.inst.bwd, f.inst.nbwd, false);
    run_kernels(&h.inst, &h.b, &h.worker, h.inst.bwd, h.inst.nbwd, false);
    for (int i = 0; i < d.nin; i++) {
      if (!h.b.din[i]) continue;
      snprintf(what, sizeof what, "%s mode %d din[%d] (%s)", name, mode, i,
               op_dtype_name(dh.din_dtype[i]));
      compare(what, h.b.din[i], dh.din_dtype[i], f.b.din[i], f.n[i]);
    }
    if (mode != MODE_OVERWRITE) continue;
    /* the same bits with the tiles in reverse order */
    void *first[OP_MAX_IN] = {0};
    for (int i = 0; i < d.nin; i++) {
      size_t bytes = (size_t)h.n[i] * op_dtype_size(dh.din_dtype[i]);
      first[i] = xcalloc(bytes, 1);
      memcpy(first[i], h.b.din[i], bytes);
    }
    set_dins(&h, mode, init);
    run_kernels(&h.inst, &h.b, &h.worker, h.inst.fwd, h.inst.nfwd, true);
    run_kernels(&h.inst, &h.b, &h.worker, h.inst.bwd, h.inst.nbwd, true);
    for (int i = 0; i < d.nin; i++) {
      size_t bytes = (size_t)h.n[i] * op_dtype_size(dh.din_dtype[i]);
      if (memcmp(first[i], h.b.din[i], bytes) != 0)
        fail_msg("%s din[%d]: tiles in reverse order change the bits", name,
                 i);
      free(first[i]);
    }
  }
  for (int i = 0; i < OP_MAX_IN; i++) free(init[i]);
  side_free(&f);
  side_free(&h);
}

static op_desc desc1(op_type type, op_shape x) {
  op_desc d = {.type = type, .nin = 1, .in = {x}};
  return d;
}

static op_desc desc2(op_type type, op_shape a, op_shape b) {
  op_desc d = {.type = type, .nin = 2, .in = {a, b}};
  return d;
}

static void test_bf16(void **state) {
  (void)state;
  op_desc d = desc1(OP_SLICE, S3(3, 700, 96));
  d.attrs.start = 32;
  d.attrs.len = 40;
  check_bf16(d, 0, -1, 1);
  /* a slice of a parameter: read through its bf16 copy, f32 gradient */
  check_bf16(d, 1, -1, 1);
  check_bf16(desc2(OP_MUL, S2(2, 70000), S2(2, 70000)), 0, -1, 1);
  check_bf16(desc2(OP_MUL, S2(3, 2100), S2(3, 2100)), 2, -1, 1);
  check_bf16(desc1(OP_SILU, S2(2, 70000)), 0, -6, 6);
  d = desc1(OP_SCALE, S2(2, 70000));
  d.attrs.scale = 0.375f;
  check_bf16(d, 0, -1, 1);
  check_bf16(desc2(OP_SWIGLU, S2(2, 70000), S2(2, 70000)), 0, -6, 6);
  /* gamma a parameter (f32, f32 gradient): the only way in bf16 */
  d = desc2(OP_RMSNORM, S2(600, 48), S1(48));
  check_bf16(d, 2, -1, 1);
  d = desc2(OP_RMSNORM, S3(3, 5, 300), S1(300));
  check_bf16(d, 2, -1, 1);
  d = desc1(OP_ROPE, S3(3, 200, 96));
  d.attrs.heads = 3;
  check_bf16(d, 0, -1, 1);
}

/* ---- through the graph ---- */

#define GB 2
#define GT 24
#define GD 32
#define GF 48
#define GH 4

typedef struct ffn_model {
  remat_graph *g;
  remat_tensor *x, *loss, *params[6];
} ffn_model;

/* loss = mean(y * y), y = down(swiglu or silu*mul of the gate and up
 * halves of a packed projection of rmsnorm(x)) + scale(rope(q)), inside
 * one checkpoint region of `policy`. */
static ffn_model ffn_build(remat_runtime *rt, const char *policy,
                           bool fused) {
  ffn_model m;
  assert_int_equal(remat_graph_create(rt, &m.g), REMAT_OK);
  remat_graph *g = m.g;
  remat_graph_seed(g, 7);
  int64_t xd[3] = {GB, GT, GD}, gd[1] = {GD}, wi[2] = {2 * GF, GD},
          wo[2] = {GD, GF}, wq[2] = {GD, GD};
  m.x = remat_input(g, "x", REMAT_F32, 3, xd);
  m.params[0] = remat_param(g, "gamma", 1, gd, REMAT_INIT_NORMAL, 1.0f);
  m.params[1] = remat_param(g, "w_in", 2, wi, REMAT_INIT_NORMAL, 0.2f);
  m.params[2] = remat_param(g, "w_out", 2, wo, REMAT_INIT_NORMAL, 0.2f);
  m.params[3] = remat_param(g, "w_q", 2, wq, REMAT_INIT_NORMAL, 0.2f);
  m.params[4] = remat_param(g, "gamma2", 1, gd, REMAT_INIT_NORMAL, 1.0f);
  m.params[5] = remat_param(g, "w_lora", 2, wq, REMAT_INIT_NORMAL, 0.2f);
  remat_policy *p = NULL;
  assert_int_equal(remat_policy_parse(policy, &p), REMAT_OK);
  assert_int_equal(remat_region_begin(g, p), REMAT_OK);
  remat_tensor *h = remat_rmsnorm(g, m.x, m.params[0], 0.0f);
  remat_tensor *packed = remat_linear(g, h, m.params[1], NULL);
  remat_tensor *gate = remat_slice(g, packed, 0, GF);
  remat_tensor *up = remat_slice(g, packed, GF, GF);
  remat_tensor *act = fused ? remat_swiglu(g, gate, up)
                            : remat_mul(g, remat_silu(g, gate), up);
  remat_tensor *down = remat_linear(g, act, m.params[2], NULL);
  remat_tensor *q = remat_rope(g, remat_linear(g, h, m.params[3], NULL), GH,
                               0.0f);
  remat_tensor *lora = remat_scale(g, remat_linear(g, q, m.params[5], NULL),
                                   0.5f);
  remat_tensor *y = remat_rmsnorm(g, remat_add(g, down, remat_add(g, q, lora)),
                                  m.params[4], 1e-5f);
  assert_int_equal(remat_region_end(g), REMAT_OK);
  m.loss = remat_mean(g, remat_mul(g, y, y));
  remat_policy_destroy(p);
  if (m.loss == NULL) fail_msg("%s", remat_graph_error(g));
  assert_int_equal(remat_compile(g, m.loss, NULL), REMAT_OK);
  return m;
}

static float *ffn_input(void) {
  float *x = xcalloc(GB * GT * GD, sizeof(float));
  uint64_t saved = rng_state;
  rng_state = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < GB * GT * GD; i++) x[i] = (float)uniform(-1, 1);
  rng_state = saved;
  return x;
}

static int64_t param_numel(const ffn_model *m, int k) {
  return remat_tensor_numel(m->params[k]);
}

/* One step; the loss and every parameter's gradient, concatenated. */
static float *ffn_step(ffn_model *m, const float *x, float *loss,
                       remat_step_stats *st) {
  int64_t total = 0;
  for (int k = 0; k < 6; k++) total += param_numel(m, k);
  float *grads = xcalloc(total, sizeof(float)), *at = grads;
  assert_int_equal(remat_feed(m->g, m->x, x, GB * GT * GD * sizeof(float)),
                   REMAT_OK);
  assert_int_equal(remat_step(m->g, st), REMAT_OK);
  *loss = st->loss;
  for (int k = 0; k < 6; k++) {
    assert_int_equal(remat_read_grad(m->g, m->params[k], at,
                                     param_numel(m, k) * sizeof(float)),
                     REMAT_OK);
    at += param_numel(m, k);
  }
  return grads;
}

/* A runtime of `threads` unbound workers in `precision`; NULL where bf16
 * is refused (no bf16 kernels on this CPU). */
static remat_runtime *runtime_prec(int threads, remat_precision precision) {
  remat_config rc = {.set = REMAT_SET_NO_ENV | REMAT_SET_NUM_THREADS |
                            REMAT_SET_BIND | REMAT_SET_PRECISION,
                     .num_threads = threads, .bind = REMAT_BIND_NONE,
                     .precision = precision};
  remat_runtime *rt = NULL;
  remat_status s = remat_runtime_create(&rc, &rt);
  if (precision == REMAT_PRECISION_BF16 && s == REMAT_ERR_CONFIG)
    return NULL;
  assert_int_equal(s, REMAT_OK);
  return rt;
}

static remat_runtime *runtime_with(int threads) {
  return runtime_prec(threads, REMAT_PRECISION_F32);
}

/* The gradients match central differences of the step's loss (which
 * covers the two slices of one projection summing into its gradient), and
 * are bitwise the same under three policies at 1 and 2 threads. */
static void test_graph_policies_threads(void **state) {
  (void)state;
  const char *policies[] = {"everything_saveable", "nothing_saveable",
                            "dots_saveable"};
  float *x = ffn_input(), *first[2] = {NULL, NULL}, first_loss[2] = {0, 0};
  int64_t total = 0;
  for (int fused = 0; fused < 2; fused++)
    for (int threads = 1; threads <= 2; threads++) {
      remat_runtime *rt = runtime_with(threads);
      for (int p = 0; p < 3; p++) {
        ffn_model m = ffn_build(rt, policies[p], fused);
        remat_step_stats st = {.size = sizeof st};
        float loss;
        float *grads = ffn_step(&m, x, &loss, &st);
        /* nothing_saveable recomputes the region's ops, dots_saveable all
         * but its linears (none of the new ops is a dot) */
        if (p == 0)
          assert_true(st.recompute_flops == 0.0);
        else
          assert_true(st.recompute_flops > 0.0);
        if (first[fused] == NULL) {
          first[fused] = grads;
          first_loss[fused] = loss;
          total = 0;
          for (int k = 0; k < 6; k++) total += param_numel(&m, k);
        } else {
          if (memcmp(&loss, &first_loss[fused], sizeof loss) != 0)
            fail_msg("%s, %d threads, fused %d: loss %.9g, first %.9g",
                     policies[p], threads, fused, loss, first_loss[fused]);
          for (int64_t j = 0; j < total; j++)
            if (memcmp(&grads[j], &first[fused][j], sizeof(float)) != 0)
              fail_msg("%s, %d threads, fused %d: grad[%lld] %.9g, first "
                       "%.9g",
                       policies[p], threads, fused, (long long)j, grads[j],
                       first[fused][j]);
          free(grads);
        }
        remat_graph_destroy(m.g);
      }
      remat_runtime_destroy(rt);
    }
  /* swiglu computes what silu then mul do (the same products, though a
   * compiler may contract them differently) */
  assert_true(fabsf(first_loss[1] - first_loss[0]) <=
              1e-6f * fabsf(first_loss[0]));
  for (int64_t j = 0; j < total; j++)
    if (fabsf(first[1][j] - first[0][j]) > 1e-5f * (1e-3f + fabsf(first[0][j])))
      fail_msg("grad[%lld]: swiglu %.9g, silu * mul %.9g", (long long)j,
               first[1][j], first[0][j]);
  free(first[0]);
  free(first[1]);
  free(x);
}

static void test_graph_finite_differences(void **state) {
  (void)state;
  remat_runtime *rt = runtime_with(1);
  ffn_model m = ffn_build(rt, "nothing_saveable", false);
  float *x = ffn_input(), loss;
  remat_step_stats st = {.size = sizeof st};
  float *grads = ffn_step(&m, x, &loss, &st);
  int64_t off = 0;
  for (int k = 0; k < 6; k++) {
    int64_t n = param_numel(&m, k);
    float *w = xcalloc(n, sizeof(float));
    assert_int_equal(remat_read(m.g, m.params[k], w, n * sizeof(float)),
                     REMAT_OK);
    /* w_in: a row of the gate half and one of the up half */
    int64_t picks[4] = {0, n - 1, n / 4 + 3, 3 * n / 4 + 1};
    for (int s = 0; s < 4; s++) {
      int64_t j = picks[s];
      float w0 = w[j], h = 1e-2f, lp, lm;
      w[j] = w0 + h;
      assert_int_equal(remat_write(m.g, m.params[k], w, n * sizeof(float)),
                       REMAT_OK);
      free(ffn_step(&m, x, &lp, &st));
      w[j] = w0 - h;
      assert_int_equal(remat_write(m.g, m.params[k], w, n * sizeof(float)),
                       REMAT_OK);
      free(ffn_step(&m, x, &lm, &st));
      w[j] = w0;
      double fd = ((double)lp - lm) / (2.0 * h), got = grads[off + j];
      if (fabs(got - fd) > 2e-2 * fabs(fd) + 2e-5)
        fail_msg("%s[%lld]: gradient %.7g, finite difference %.7g",
                 remat_tensor_name(m.params[k]), (long long)j, got, fd);
    }
    assert_int_equal(remat_write(m.g, m.params[k], w, n * sizeof(float)),
                     REMAT_OK);
    free(w);
    off += n;
  }
  free(grads);
  free(x);
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

/* In bf16 precision (activations bf16, gammas f32 parameters) the same
 * model's gradients, silu then mul or swiglu, are near the f32 ones
 * (relative L2 error per parameter at most 3e-2) and bitwise the same
 * under two policies at 1 and 2 threads. Skipped where this CPU has no
 * bf16 kernels. */
static void test_graph_bf16(void **state) {
  (void)state;
  remat_runtime *rt32 = runtime_with(1);
  ffn_model m = ffn_build(rt32, "everything_saveable", false);
  float *x = ffn_input(), loss32, loss;
  remat_step_stats st = {.size = sizeof st};
  float *g32 = ffn_step(&m, x, &loss32, &st), *first[2] = {NULL, NULL};
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt32);
  const char *policies[] = {"everything_saveable", "nothing_saveable"};
  for (int threads = 1; threads <= 2; threads++) {
    remat_runtime *rt = runtime_prec(threads, REMAT_PRECISION_BF16);
    if (rt == NULL) {
      free(g32);
      free(x);
      skip();
    }
    for (int run = 0; run < 4; run++) {
      int fused = run / 2;
      m = ffn_build(rt, policies[run % 2], fused);
      float *g = ffn_step(&m, x, &loss, &st);
      assert_true(fabsf(loss - loss32) <= 3e-2f * fabsf(loss32));
      int64_t off = 0;
      for (int k = 0; k < 6; k++) {
        int64_t n = param_numel(&m, k);
        double err2 = 0, ref2 = 0;
        for (int64_t j = off; j < off + n; j++) {
          err2 += ((double)g[j] - g32[j]) * ((double)g[j] - g32[j]);
          ref2 += (double)g32[j] * g32[j];
        }
        if (!(sqrt(err2) <= 3e-2 * sqrt(ref2)))
          fail_msg("bf16 %s: relative L2 error %.3g against f32",
                   remat_tensor_name(m.params[k]), sqrt(err2 / ref2));
        off += n;
      }
      if (first[fused] == NULL) {
        first[fused] = g;
      } else {
        if (memcmp(g, first[fused], off * sizeof(float)) != 0)
          fail_msg("bf16, %s, fused %d, %d threads: gradients differ",
                   policies[run % 2], fused, threads);
        free(g);
      }
      remat_graph_destroy(m.g);
    }
    remat_runtime_destroy(rt);
  }
  free(first[0]);
  free(first[1]);
  free(g32);
  free(x);
}

/* An op that reads one tensor twice writes its gradient through two din
 * slots: both add up (sum(w * w) has gradient 2w, sum(w + w) gradient 2),
 * under a policy that saves everything and one that recomputes. */
static void test_graph_same_input_twice(void **state) {
  (void)state;
  remat_runtime *rt = runtime_with(2);
  const int64_t n = 70000, dims[1] = {n};
  float *w = xcalloc(n, sizeof(float)), *grad = xcalloc(n, sizeof(float));
  for (int64_t j = 0; j < n; j++) w[j] = (float)uniform(-1, 1);
  for (int mul = 0; mul < 2; mul++)
    for (int p = 0; p < 2; p++) {
      remat_graph *g;
      assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
      remat_tensor *wt = remat_param(g, "w", 1, dims, REMAT_INIT_ZEROS, 0);
      remat_policy *pol = p ? remat_policy_nothing_saveable()
                            : remat_policy_everything_saveable();
      assert_int_equal(remat_region_begin(g, pol), REMAT_OK);
      remat_tensor *y = mul ? remat_mul(g, wt, wt) : remat_add(g, wt, wt);
      y = remat_scale(g, y, 1.0f);
      assert_int_equal(remat_region_end(g), REMAT_OK);
      remat_policy_destroy(pol);
      assert_int_equal(remat_compile(g, remat_sum(g, y), NULL), REMAT_OK);
      assert_int_equal(remat_write(g, wt, w, n * sizeof(float)), REMAT_OK);
      assert_int_equal(remat_step(g, NULL), REMAT_OK);
      assert_int_equal(remat_read_grad(g, wt, grad, n * sizeof(float)),
                       REMAT_OK);
      for (int64_t j = 0; j < n; j++) {
        float want = mul ? 2.0f * w[j] : 2.0f;
        if (grad[j] != want)
          fail_msg("%s, policy %d: grad[%lld] = %g, want %g",
                   mul ? "mul" : "add", p, (long long)j, grad[j], want);
      }
      remat_graph_destroy(g);
    }
  free(w);
  free(grad);
  remat_runtime_destroy(rt);
}

/* ---- bad input: the exact messages ---- */

typedef enum bad_op {
  BAD_SLICE,
  BAD_MUL,
  BAD_SWIGLU,
  BAD_SCALE,
  BAD_RMSNORM,
  BAD_RMSNORM_EPS,
  BAD_ROPE,
  BAD_ROPE_THETA,
  BAD_ROPE_SCALING
} bad_op;

/* Builds x of shape xd on a fresh graph, calls the builder, and checks
 * that it fails with `status` and exactly `msg`. */
static void expect_error(remat_runtime *rt, bad_op op, int xnd,
                         const int64_t *xd, int64_t a, int64_t b, float f,
                         remat_status status, const char *msg) {
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  remat_tensor *x = remat_input(g, "x", REMAT_F32, xnd, xd);
  int64_t od[1] = {a};
  remat_tensor *y = NULL;
  switch (op) {
  case BAD_SLICE: y = remat_slice(g, x, a, b); break;
  case BAD_MUL:
    y = remat_mul(g, x, remat_input(g, "o", REMAT_F32, 1, od));
    break;
  case BAD_SWIGLU:
    y = remat_swiglu(g, x, remat_input(g, "o", REMAT_F32, 1, od));
    break;
  case BAD_SCALE: y = remat_scale(g, x, f); break;
  case BAD_RMSNORM:
  case BAD_RMSNORM_EPS:
    y = remat_rmsnorm(g, x,
                      remat_param(g, "gamma", 1, od, REMAT_INIT_ONES, 0.0f),
                      f);
    break;
  case BAD_ROPE:
  case BAD_ROPE_THETA: y = remat_rope(g, x, (int)a, f); break;
  case BAD_ROPE_SCALING: {
    remat_rope_scaling sc = {f, 1.0f, 4.0f, (int)b};
    y = remat_rope_scaled(g, x, (int)a, 0.0f, &sc);
    break;
  }
  }
  assert_null(y);
  assert_int_equal(remat_graph_status(g), status);
  assert_string_equal(remat_graph_error(g), msg);
  remat_graph_destroy(g);
}

static void test_bad_input(void **state) {
  (void)state;
  remat_runtime *rt = runtime_with(1);
  const int64_t x3[3] = {2, 4, 12}, x2[2] = {4, 12};
  const char *slice_msg =
      "slice: x [2,4,12], start %lld, len %lld: expected start >= 0, len >= "
      "1 and start + len <= 12 (last dim of x)";
  /* start + len would wrap in the last one */
  const int64_t bad_slices[5][2] = {
      {-1, 4}, {10, 3}, {12, 1}, {0, 0}, {1, INT64_MAX}};
  for (int i = 0; i < 5; i++) {
    char msg[256];
    snprintf(msg, sizeof msg, slice_msg, (long long)bad_slices[i][0],
             (long long)bad_slices[i][1]);
    expect_error(rt, BAD_SLICE, 3, x3, bad_slices[i][0], bad_slices[i][1], 0,
                 REMAT_ERR_SHAPE, msg);
  }
  expect_error(rt, BAD_MUL, 2, x2, 48, 0, 0, REMAT_ERR_SHAPE,
               "mul: a [4,12] and b [48]: shapes must be equal");
  expect_error(rt, BAD_SWIGLU, 2, x2, 12, 0, 0, REMAT_ERR_SHAPE,
               "swiglu: gate [4,12] and up [12]: shapes must be equal");
  expect_error(rt, BAD_SCALE, 2, x2, 0, 0, NAN, REMAT_ERR_INVALID_ARG,
               "scale: factor nan is not valid: expected a finite factor");
  expect_error(rt, BAD_SCALE, 2, x2, 0, 0, -INFINITY, REMAT_ERR_INVALID_ARG,
               "scale: factor -inf is not valid: expected a finite factor");
  expect_error(rt, BAD_RMSNORM, 3, x3, 13, 0, 0, REMAT_ERR_SHAPE,
               "rmsnorm: x [2,4,12] and gamma [13]: gamma must be [12] "
               "(last dim of x)");
  expect_error(rt, BAD_RMSNORM_EPS, 3, x3, 12, 0, INFINITY,
               REMAT_ERR_INVALID_ARG,
               "rmsnorm: eps inf is not valid: expected a finite eps (> 0, "
               "or <= 0 for 1e-6)");
  expect_error(rt, BAD_ROPE, 3, x3, 4, 0, 0, REMAT_ERR_SHAPE,
               "rope: x [2,4,12] with 4 heads: the head dim (3) must be "
               "even");
  expect_error(rt, BAD_ROPE, 3, x3, 5, 0, 0, REMAT_ERR_SHAPE,
               "rope: x [2,4,12] with 5 heads: heads must be at least 1 and "
               "divide the last dim (12)");
  expect_error(rt, BAD_ROPE, 3, x3, 0, 0, 0, REMAT_ERR_SHAPE,
               "rope: x [2,4,12] with 0 heads: heads must be at least 1 and "
               "divide the last dim (12)");
  expect_error(rt, BAD_ROPE, 2, x2, 2, 0, 0, REMAT_ERR_SHAPE,
               "rope: x [4,12] must be [B,T,heads*hd] (3 dims)");
  expect_error(rt, BAD_ROPE_THETA, 3, x3, 2, 0, NAN, REMAT_ERR_INVALID_ARG,
               "rope: theta nan is not valid: expected a finite theta (> 0, "
               "or <= 0 for 10000)");
  expect_error(rt, BAD_ROPE_SCALING, 3, x3, 2, 64, 0.5f,
               REMAT_ERR_INVALID_ARG,
               "rope: scaling factor 0.5, low_freq_factor 1, "
               "high_freq_factor 4, original_max_position_embeddings 64: "
               "factor (expected a finite value >= 1, or 0 for none) is not "
               "valid");
  expect_error(rt, BAD_ROPE_SCALING, 3, x3, 2, 0, 8.0f, REMAT_ERR_INVALID_ARG,
               "rope: scaling factor 8, low_freq_factor 1, high_freq_factor "
               "4, original_max_position_embeddings 0: "
               "original_max_position_embeddings (expected >= 1) is not "
               "valid");
  remat_runtime_destroy(rt);
}

/* In bf16 precision gamma must be read as f32: an activation gamma is
 * refused when the op is planned. */
static void test_rmsnorm_bf16_gamma(void **state) {
  (void)state;
  op_desc d = desc2(OP_RMSNORM, S2(4, 8), S1(8));
  d.in_dtype[0] = d.in_dtype[1] = d.din_dtype[0] = d.din_dtype[1] = OP_BF16;
  d.out_dtype = OP_BF16;
  char err[OP_ERRMSG_MAX];
  op_instance inst;
  assert_int_equal(op_plan(&d, engine, &inst, err), REMAT_ERR_SHAPE);
  assert_string_equal(err, "rmsnorm: gamma is bf16: gamma must be f32");
  assert_false(op_input_keeps_f32(OP_RMSNORM, 0));
  assert_true(op_input_keeps_f32(OP_RMSNORM, 1));
}

/* None of the new ops is a dot: dots_saveable recomputes them. */
static void test_tags_and_names(void **state) {
  (void)state;
  const op_type types[] = {OP_SLICE, OP_MUL,     OP_SILU,  OP_SCALE,
                           OP_RMSNORM, OP_ROPE, OP_SWIGLU};
  const char *names[] = {"slice", "mul", "silu", "scale",
                         "rmsnorm", "rope", "swiglu"};
  for (int i = 0; i < 7; i++) {
    op_desc d = {.type = types[i]};
    assert_int_equal(op_tags(&d), 0);
    assert_string_equal(op_name(types[i]), names[i]);
  }
}

int main(void) {
  rng_state = 0x2545f4914f6cdd1dull;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slice),
      cmocka_unit_test(test_slice_pair_accumulates),
      cmocka_unit_test(test_mul),
      cmocka_unit_test(test_silu),
      cmocka_unit_test(test_scale),
      cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_graph_policies_threads),
      cmocka_unit_test(test_graph_finite_differences),
      cmocka_unit_test(test_graph_same_input_twice),
      cmocka_unit_test(test_graph_bf16),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_rmsnorm_bf16_gamma),
      cmocka_unit_test(test_tags_and_names),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
