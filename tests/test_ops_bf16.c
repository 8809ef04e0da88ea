/* Tests of ops/ in bf16 precision: every op's forward and backward kernels
 * with bf16 activations (and bf16 copies of dot weights) against the same
 * op's f32 kernels on the same inputs (drawn as bf16 values, so both runs
 * see identical numbers), in overwrite, accumulate and skipped (NULL din)
 * modes; plus that the bf16 kernels give bitwise the same results with
 * their tiles run in reverse order.
 *
 * bf16 tolerance: an output or gradient matches when its error relative
 * to the f32 result is at most 1e-2 in L2 norm and no element is off by
 * more than 3e-2 of the f32 result's largest magnitude. A bf16 rounding is
 * at most 2^-9 (0.2%) relative; the bounds allow a few roundings per
 * element (inputs of a kernel's second stage, gradients through two
 * stored tensors) and catch any indexing, scaling or dtype error, which
 * give errors of order 1. Scalar results (losses) stay f32 and get 1e-4.
 *
 * REMAT_TEST_FILTER (a cmocka pattern such as "test_linear*") runs only
 * the matching tests. */
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
#include "op_fixture.h"
#include "ops/bf16_dot.h"
#include "ops/op.h"

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  assert_non_null(p);
  return p;
}

/* One op case: the f32 desc (shapes, int32 inputs, attrs), the range of
 * each input, which inputs are parameters (f32 gradients; read through a
 * bf16 copy unless op_input_keeps_f32), and a causal -inf mask on input 0
 * (attention probabilities' layout). */
typedef struct bcase {
  op_desc desc;
  double lo[OP_MAX_IN], hi[OP_MAX_IN];
  bool param[OP_MAX_IN];
  bool causal_mask;
} bcase;

static bcase make_case(op_type type, int nin, ...) {
  bcase c = {.desc = {.type = type, .nin = nin}};
  va_list ap;
  va_start(ap, nin);
  for (int i = 0; i < nin; i++) {
    c.desc.in[i] = va_arg(ap, op_shape);
    c.lo[i] = -1;
    c.hi[i] = 1;
  }
  va_end(ap);
  return c;
}

static bool is_scalar(const op_shape *s) {
  return s->ndim == 1 && s->dim[0] == 1;
}

/* The bf16-precision desc of a case, as the runtime builds it. */
static op_desc bf16_desc(const bcase *c) {
  op_desc d = c->desc;
  for (int i = 0; i < d.nin; i++) {
    if (d.in_dtype[i] == OP_I32) continue;
    if (c->param[i]) {
      d.in_dtype[i] = op_input_keeps_f32(d.type, i) ? OP_F32 : OP_BF16;
      d.din_dtype[i] = OP_F32;
    } else {
      d.in_dtype[i] = is_scalar(&d.in[i]) ? OP_F32 : OP_BF16;
      d.din_dtype[i] = d.in_dtype[i];
    }
  }
  return d;
}

/* A planned op with its buffers, each of its desc's dtype. */
typedef struct side {
  op_instance inst;
  op_worker worker;
  op_bufs b;
  int64_t n[OP_MAX_IN], nout;
} side;

static void side_plan(side *s, op_desc d, bool bf16) {
  memset(s, 0, sizeof *s);
  char err[OP_ERRMSG_MAX];
  remat_status rs = op_infer(&d, err);
  if (rs != REMAT_OK) fail_msg("%s", err);
  d.out_dtype = bf16 && !is_scalar(&d.out) ? OP_BF16 : OP_F32;
  rs = op_plan(&d, engine, &s->inst, err);
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
  s->worker.scratch =
      s->inst.scratch_bytes ? malloc(s->inst.scratch_bytes) : NULL;
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

/* Element j of a buffer of dtype t, as a double. */
static double get(const void *p, op_dtype t, int64_t j) {
  if (t == OP_BF16) return bf16_to_f32(((const uint16_t *)p)[j]);
  if (t == OP_I32) return ((const int32_t *)p)[j];
  return ((const float *)p)[j];
}

static void set(void *p, op_dtype t, int64_t j, double v) {
  if (t == OP_BF16)
    ((uint16_t *)p)[j] = bf16_from_f32((float)v);
  else if (t == OP_I32)
    ((int32_t *)p)[j] = (int32_t)v;
  else
    ((float *)p)[j] = (float)v;
}

static void run_kernels(side *s, const op_kernel *k, int nk, bool reverse) {
  for (int i = 0; i < nk; i++)
    for (int64_t t = 0; t < k[i].tiles; t++) {
      int64_t tile = reverse ? k[i].tiles - 1 - t : t;
      int rs = k[i].fn(&s->inst, &s->b, tile, &s->worker);
      if (rs != REMAT_OK)
        fail_msg("%s tile %lld: status %d", k[i].name, (long long)tile, rs);
    }
}

/* Compares n values of `got` (dtype gt) with the f32 `want`. */
static void compare(const char *what, const void *got, op_dtype gt,
                    const float *want, int64_t n, bool scalar) {
  double err2 = 0, ref2 = 0, maxref = 0;
  for (int64_t j = 0; j < n; j++) {
    double g = get(got, gt, j), w = want[j];
    if (!isfinite(w) || !isfinite(g)) {
      if (!(g == w))
        fail_msg("%s[%lld] = %g, f32 gives %g", what, (long long)j, g, w);
      continue;
    }
    err2 += (g - w) * (g - w);
    ref2 += w * w;
    maxref = fmax(maxref, fabs(w));
  }
  double tol = scalar ? 1e-4 : 1e-2;
  if (sqrt(err2) > tol * sqrt(ref2) + 1e-30)
    fail_msg("%s: relative L2 error %.3g (bound %g)", what,
             sqrt(err2) / fmax(sqrt(ref2), 1e-30), tol);
  for (int64_t j = 0; j < n; j++) {
    double g = get(got, gt, j), w = want[j];
    if (isfinite(w) && fabs(g - w) > 3 * tol * maxref)
      fail_msg("%s[%lld] = %.6g, f32 gives %.6g (largest %.3g)", what,
               (long long)j, g, w, maxref);
  }
}

enum { MODE_OVERWRITE, MODE_ACCUMULATE, MODE_SKIP, MODE_COUNT };

/* Sets up the din buffers of a side for a mode; init[i] are the values an
 * accumulating din starts from (the same numbers on both sides). */
static void set_dins(side *s, int mode, float *const init[]) {
  const op_desc *d = &s->inst.desc;
  int ngrad = 0;
  for (int i = 0; i < d->nin; i++) {
    free(s->b.din[i]);
    s->b.din[i] = NULL;
    if (d->in_dtype[i] == OP_I32) continue;
    if (mode == MODE_SKIP && ngrad++ % 2 == 0) continue;
    op_dtype t = d->din_dtype[i];
    s->b.din[i] = xcalloc(s->n[i], op_dtype_size(t));
    s->b.din_accumulate[i] = mode == MODE_ACCUMULATE;
    for (int64_t j = 0; j < s->n[i]; j++)
      set(s->b.din[i], t, j, mode == MODE_ACCUMULATE ? init[i][j] : 0.0);
  }
}

static void check_case(const bcase *c) {
  side f, h;
  side_plan(&f, c->desc, false);
  side_plan(&h, bf16_desc(c), true);
  const op_desc *df = &f.inst.desc, *dh = &h.inst.desc;
  const char *name = op_name(df->type);
  char what[96];
  /* inputs: bf16 values (or ids), the same on both sides */
  for (int i = 0; i < df->nin; i++) {
    int64_t C = df->in[i].dim[df->in[i].ndim - 1];
    for (int64_t j = 0; j < f.n[i]; j++) {
      double v = uniform(c->lo[i], c->hi[i]);
      if (df->in_dtype[i] == OP_I32)
        v = floor(v);
      else
        v = bf16_to_f32(bf16_from_f32((float)v));
      if (i == 0 && c->causal_mask && j % C > (j / C) % C) v = -INFINITY;
      set(f.b.in[i], df->in_dtype[i], j, v);
      set(h.b.in[i], dh->in_dtype[i], j, v);
    }
  }
  run_kernels(&f, f.inst.fwd, f.inst.nfwd, false);
  run_kernels(&h, h.inst.fwd, h.inst.nfwd, false);
  snprintf(what, sizeof what, "%s out", name);
  bool scalar = dh->out_dtype == OP_F32;
  compare(what, h.b.out, dh->out_dtype, f.b.out, f.nout, scalar);

  for (int64_t j = 0; j < f.nout; j++) {
    double v = bf16_to_f32(bf16_from_f32((float)uniform(-1, 1)));
    set(f.b.dout, OP_F32, j, v);
    set(h.b.dout, dh->out_dtype, j, v);
  }
  float *init[OP_MAX_IN] = {0};
  for (int i = 0; i < df->nin; i++) {
    init[i] = xcalloc(f.n[i], sizeof(float));
    for (int64_t j = 0; j < f.n[i]; j++)
      init[i][j] = bf16_to_f32(bf16_from_f32((float)uniform(-1, 1)));
  }
  for (int mode = 0; mode < MODE_COUNT; mode++) {
    set_dins(&f, mode, init);
    set_dins(&h, mode, init);
    run_kernels(&f, f.inst.bwd, f.inst.nbwd, false);
    run_kernels(&h, h.inst.bwd, h.inst.nbwd, false);
    for (int i = 0; i < df->nin; i++) {
      if (!h.b.din[i]) continue;
      snprintf(what, sizeof what, "%s mode %d din[%d] (%s)", name, mode, i,
               op_dtype_name(dh->din_dtype[i]));
      compare(what, h.b.din[i], dh->din_dtype[i], f.b.din[i], f.n[i], false);
    }
    if (mode != MODE_OVERWRITE) continue;
    /* the same bits with the tiles in reverse order */
    void *first[OP_MAX_IN] = {0};
    for (int i = 0; i < dh->nin; i++)
      if (h.b.din[i]) {
        size_t bytes = (size_t)h.n[i] * op_dtype_size(dh->din_dtype[i]);
        first[i] = xcalloc(bytes, 1);
        memcpy(first[i], h.b.din[i], bytes);
      }
    set_dins(&h, mode, init);
    run_kernels(&h, h.inst.fwd, h.inst.nfwd, true);
    run_kernels(&h, h.inst.bwd, h.inst.nbwd, true);
    for (int i = 0; i < dh->nin; i++) {
      if (!first[i]) continue;
      size_t bytes = (size_t)h.n[i] * op_dtype_size(dh->din_dtype[i]);
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

/* Linear's weight and bias gradients with dy^T read in place (the form
 * before the shape rule, REMAT_BENCH_DW_KERNEL=strided) and from
 * tile-local transposed copies of dy's blocks (=transposed), from the same
 * inputs in the dtypes of precision `bf16`, accumulating into the same
 * values: equal to 2e-6 of the largest magnitude (both sum the same
 * products in f32, in different orders). */
static void dw_forms_agree(const bcase *c, bool bf16) {
  op_desc d = bf16 ? bf16_desc(c) : c->desc;
  side a, t;
  setenv("REMAT_BENCH_DW_KERNEL", "strided", 1);
  side_plan(&a, d, bf16);
  setenv("REMAT_BENCH_DW_KERNEL", "transposed", 1);
  side_plan(&t, d, bf16);
  unsetenv("REMAT_BENCH_DW_KERNEL");
  const op_desc *da = &a.inst.desc;
  for (int i = 0; i < da->nin; i++)
    for (int64_t j = 0; j < a.n[i]; j++) {
      double v = bf16_to_f32(bf16_from_f32((float)uniform(-1, 1)));
      set(a.b.in[i], da->in_dtype[i], j, v);
      set(t.b.in[i], da->in_dtype[i], j, v);
    }
  for (int64_t j = 0; j < a.nout; j++) {
    double v = bf16_to_f32(bf16_from_f32((float)uniform(-1, 1)));
    set(a.b.dout, da->out_dtype, j, v);
    set(t.b.dout, da->out_dtype, j, v);
  }
  float *init[OP_MAX_IN] = {0};
  for (int i = 0; i < da->nin; i++) {
    init[i] = xcalloc(a.n[i], sizeof(float));
    for (int64_t j = 0; j < a.n[i]; j++) init[i][j] = (float)uniform(-1, 1);
  }
  set_dins(&a, MODE_ACCUMULATE, init);
  set_dins(&t, MODE_ACCUMULATE, init);
  run_kernels(&a, a.inst.bwd, a.inst.nbwd, false);
  run_kernels(&t, t.inst.bwd, t.inst.nbwd, true);
  for (int i = 1; i < da->nin; i++) {
    double big = 0, diff = 0;
    int64_t at = 0;
    for (int64_t j = 0; j < a.n[i]; j++) {
      double x = get(a.b.din[i], da->din_dtype[i], j);
      double y = get(t.b.din[i], da->din_dtype[i], j);
      big = fmax(big, fabs(x));
      if (fabs(x - y) > diff) diff = fabs(x - y), at = j;
    }
    if (diff > 2e-6 * big)
      fail_msg("linear x %s, w %s, %s: din[%d][%lld] differs by %.3g "
               "between the forms (largest %.3g)",
               op_shape_str(&da->in[0], (char[OP_SHAPE_STR_MAX]){0}),
               op_shape_str(&da->in[1], (char[OP_SHAPE_STR_MAX]){0}),
               bf16 ? "bf16" : "f32", i, (long long)at, diff, big);
  }
  for (int i = 0; i < OP_MAX_IN; i++) free(init[i]);
  side_free(&a);
  side_free(&t);
}

static void test_linear_dw_transposed(void **state) {
  (void)state;
  /* three chunks of 384 rows (the last 332), blocks of 256 rows of dw and
   * a remainder of 2, blocks spanning all of K */
  bcase c = make_case(OP_LINEAR, 3, S2(1100, 600), S2(258, 600), S1(258));
  c.param[1] = c.param[2] = true;
  dw_forms_agree(&c, false);
  dw_forms_agree(&c, true);
  /* one chunk (straight into dw), K past the widest blocks: 256 columns
   * and a remainder of 52 */
  c = make_case(OP_LINEAR, 2, S3(2, 65, 2100), S2(70, 2100));
  c.param[1] = true;
  dw_forms_agree(&c, false);
  dw_forms_agree(&c, true);
}

/* Planning `d` with out_dtype `out` fails with exactly `msg`. */
static void expect_plan_error(op_desc d, op_dtype out, const char *msg) {
  char err[OP_ERRMSG_MAX];
  op_instance inst;
  assert_int_equal(op_infer(&d, err), REMAT_OK);
  d.out_dtype = out;
  assert_int_equal(op_plan(&d, engine, &inst, err), REMAT_ERR_SHAPE);
  assert_string_equal(err, msg);
}

/* ---- one test per op ---- */

static void test_linear(void **state) {
  (void)state;
  /* dw blocks of 256 rows and a remainder of 4 */
  bcase c = make_case(OP_LINEAR, 3, S3(2, 65, 40), S2(260, 40), S1(260));
  c.param[1] = c.param[2] = true;
  check_case(&c);
  c = make_case(OP_LINEAR, 2, S2(257, 520), S2(20, 520));
  c.param[1] = true;
  check_case(&c);
  /* 1100 rows: weight gradients in three chunks, dw blocks 256 + 4 */
  c = make_case(OP_LINEAR, 3, S3(4, 275, 24), S2(260, 24), S1(260));
  c.param[1] = c.param[2] = true;
  check_case(&c);
  /* w and b activations (bf16, bf16 gradients): one chunk, and three
   * chunks whose f32 partials are rounded once into dw and db; dw blocks
   * 256 + 4 */
  c = make_case(OP_LINEAR, 3, S3(2, 65, 40), S2(260, 40), S1(260));
  check_case(&c);
  c = make_case(OP_LINEAR, 3, S3(4, 275, 24), S2(260, 24), S1(260));
  check_case(&c);
}

static void test_matmul(void **state) {
  (void)state;
  bcase c = make_case(OP_MATMUL, 2, S2(130, 64), S2(64, 70));
  check_case(&c);
  c = make_case(OP_MATMUL, 2, S3(2, 300, 24), S3(2, 24, 40));
  check_case(&c);
}

static void test_add(void **state) {
  (void)state;
  bcase c = make_case(OP_ADD, 2, S3(3, 70, 500), S3(3, 70, 500));
  check_case(&c);
  /* scalars (losses) stay f32 */
  c = make_case(OP_ADD, 2, S1(1), S1(1));
  check_case(&c);
  /* a parameter operand: read through its bf16 copy, f32 gradient */
  c = make_case(OP_ADD, 2, S2(3, 2100), S2(3, 2100));
  c.param[1] = true;
  check_case(&c);
}

static void test_bias_add(void **state) {
  (void)state;
  bcase c = make_case(OP_BIAS_ADD, 2, S3(3, 70, 50), S1(50));
  c.param[1] = true;
  check_case(&c);
  /* rows longer than one converted block, several column tiles for db */
  c = make_case(OP_BIAS_ADD, 2, S2(40, 2100), S1(2100));
  c.param[1] = true;
  check_case(&c);
  /* b an activation: bf16 b and db, the converting blocks */
  c = make_case(OP_BIAS_ADD, 2, S2(40, 2100), S1(2100));
  check_case(&c);
}

static void test_relu_gelu(void **state) {
  (void)state;
  bcase c = make_case(OP_RELU, 1, S3(3, 70, 500));
  check_case(&c);
  for (int erf_form = 0; erf_form < 2; erf_form++) {
    c = make_case(OP_GELU, 1, S3(3, 70, 500));
    c.desc.attrs.gelu_erf = erf_form;
    c.lo[0] = -4;
    c.hi[0] = 4;
    check_case(&c);
  }
  /* parameters as inputs: bf16 copies in, f32 gradients out */
  c = make_case(OP_RELU, 1, S2(7, 1000));
  c.param[0] = true;
  check_case(&c);
  c = make_case(OP_GELU, 1, S2(7, 1000));
  c.param[0] = true;
  check_case(&c);
  /* oneDNN's eltwise reads and writes one dtype */
  op_desc d = {.type = OP_GELU, .nin = 1, .in = {S2(7, 1000)}};
  expect_plan_error(d, OP_BF16,
                    "gelu: x is f32 and y bf16: x and y must have the same "
                    "dtype");
}

static void test_layernorm(void **state) {
  (void)state;
  bcase c = make_case(OP_LAYERNORM, 3, S3(3, 70, 96), S1(96), S1(96));
  c.param[1] = c.param[2] = true;
  c.lo[1] = 0.5;
  c.hi[1] = 1.5;
  check_case(&c);
  /* more rows than one tile's partial sums */
  c = make_case(OP_LAYERNORM, 3, S2(1100, 40), S1(40), S1(40));
  c.param[1] = c.param[2] = true;
  check_case(&c);
  /* x a parameter too: its bf16 copy in, an f32 dx */
  c = make_case(OP_LAYERNORM, 3, S2(500, 40), S1(40), S1(40));
  c.param[0] = c.param[1] = c.param[2] = true;
  check_case(&c);
  op_desc d = {.type = OP_LAYERNORM, .nin = 3,
               .in = {S2(5, 40), S1(40), S1(40)},
               .in_dtype = {OP_BF16, OP_F32, OP_BF16}};
  expect_plan_error(d, OP_BF16,
                    "layernorm: beta is bf16: gamma and beta must be f32");
  expect_plan_error(d, OP_F32,
                    "layernorm: x is bf16 and y f32: x and y must have the "
                    "same dtype");
}

static void test_softmax(void **state) {
  (void)state;
  bcase c = make_case(OP_SOFTMAX, 1, S4(2, 3, 40, 40));
  c.causal_mask = true;
  c.lo[0] = -3;
  c.hi[0] = 3;
  check_case(&c);
  /* several row tiles, the last one shorter */
  c = make_case(OP_SOFTMAX, 1, S2(1000, 40));
  c.lo[0] = -3;
  c.hi[0] = 3;
  check_case(&c);
  /* a parameter input: an f32 dx */
  c = make_case(OP_SOFTMAX, 1, S2(300, 70));
  c.param[0] = true;
  check_case(&c);
  op_desc d = {.type = OP_SOFTMAX, .nin = 1, .in = {S2(3, 7)},
               .in_dtype = {OP_BF16}};
  expect_plan_error(d, OP_F32,
                    "softmax: x is bf16 and y f32: x and y must have the "
                    "same dtype");
}

static void test_attn_scores(void **state) {
  (void)state;
  bcase c = make_case(OP_ATTN_SCORES, 1, S3(2, 13, 72));
  c.desc.attrs.heads = 3;
  check_case(&c);
  /* even T and head dims: the products on ops/bf16_dot.h (where the CPU
   * has AVX512-BF16), in causal blocks of 80 rows (150 = 80 + 70), with
   * grouped-query heads (dk sums two query heads) and key lengths */
  c = make_case(OP_ATTN_SCORES, 1, S3(2, 150, (4 + 2 * 2) * 16));
  c.desc.attrs.heads = 4;
  c.desc.attrs.kv_heads = 2;
  check_case(&c);
  c = make_case(OP_ATTN_SCORES, 2, S3(3, 14, 3 * 2 * 10), S1(3));
  c.desc.attrs.heads = 2;
  c.desc.attrs.attn_lens = true;
  c.desc.in_dtype[1] = OP_I32;
  c.lo[1] = 1;
  c.hi[1] = 15;
  check_case(&c);
  /* separate q and k, every query sees every key, S != T (unblocked:
   * dk's A^T packed in chunks of 96 keys, 100 = 96 + 4), head dim 80
   * (two panels of the packs of K) */
  c = make_case(OP_ATTN_SCORES, 2, S3(2, 12, 2 * 80), S3(2, 100, 80));
  c.desc.attrs.heads = 2;
  c.desc.attrs.kv_heads = 1;
  c.desc.attrs.attn_separate = true;
  c.desc.attrs.attn_full = true;
  check_case(&c);
}

static void test_attn_values(void **state) {
  (void)state;
  bcase c = make_case(OP_ATTN_VALUES, 2, S4(2, 3, 13, 13), S3(2, 13, 72));
  c.desc.attrs.heads = 3;
  c.lo[0] = 0;
  check_case(&c);
  /* the bf16_dot.h products (as test_attn_scores): causal blocks of 80
   * rows, grouped-query heads (dv sums two), and one unblocked product */
  c = make_case(OP_ATTN_VALUES, 2, S4(2, 4, 150, 150),
                S3(2, 150, (4 + 2 * 2) * 16));
  c.desc.attrs.heads = 4;
  c.desc.attrs.kv_heads = 2;
  c.desc.attrs.probs_causal = true;
  c.lo[0] = 0;
  check_case(&c);
  c = make_case(OP_ATTN_VALUES, 2, S4(2, 3, 14, 14), S3(2, 14, 3 * 3 * 6));
  c.desc.attrs.heads = 3;
  c.lo[0] = 0;
  check_case(&c);
  /* separate v, S != T (dv's A^T in chunks of 96 keys), head dim 80 */
  c = make_case(OP_ATTN_VALUES, 2, S4(2, 2, 12, 100), S3(2, 100, 80));
  c.desc.attrs.heads = 2;
  c.desc.attrs.kv_heads = 1;
  c.desc.attrs.attn_separate = true;
  c.desc.attrs.attn_full = true;
  c.lo[0] = 0;
  check_case(&c);
}

static void test_attention(void **state) {
  (void)state;
  static const struct {
    int64_t B, T, H, hd;
  } cases[] = {{2, 150, 2, 64}, {1, 256, 2, 32}, {2, 13, 3, 24},
               {1, 1, 2, 16}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    bcase c = make_case(OP_ATTENTION, 1,
                        S3(cases[k].B, cases[k].T,
                           3 * cases[k].H * cases[k].hd));
    c.desc.attrs.heads = (int)cases[k].H;
    c.lo[0] = -2;
    c.hi[0] = 2;
    check_case(&c);
  }
}

/* ops/bf16_dot.h alone against a double-precision sum of the same bf16
 * operands: every form its callers use (plain A with a transposed or a
 * plain B; a packed A^T), a B pack read from pair p0 on, an odd k (packed
 * A), rows past a register tile (6) and columns past a vector (16) and a
 * panel (64), overwrite and accumulate, f32 and bf16 C. An f32 C is off
 * by f32 roundings only (4e-5 of the sum of |terms|); a bf16 C by one
 * bf16 rounding more (2^-8 of the result). */
static void test_bf16_dot(void **state) {
  (void)state;
  if (!op_bdot_available()) {
    print_message("no AVX512-BF16 on this CPU (or oneDNN capped below "
                  "it): the kernels never run, attention stays on "
                  "oneDNN\n");
    skip();
  }
  static const struct {
    int64_t m, n, k, p0;
    bool packed_a, transposed_b, acc;
    op_dtype ct;
  } cases[] = {
      {13, 70, 24, 0, false, true, false, OP_BF16},
      {7, 16, 40, 0, false, false, true, OP_F32},
      {64, 130, 64, 3, false, false, true, OP_BF16},
      {6, 17, 33, 0, true, false, false, OP_F32},
      {20, 64, 151, 5, true, false, true, OP_BF16},
      {9, 70, 25, 1, true, true, true, OP_F32},
  };
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    int64_t m = cases[t].m, n = cases[t].n, k = cases[t].k, p0 = cases[t].p0;
    int64_t kb = k + 2 * p0, lda = k + 4, ldb = cases[t].transposed_b
                                                   ? kb + 1 : n + 5;
    int64_t ldc = n + 2;
    /* A(i, j) = a[i * lda + j]; B(j, l) over kb rows, the product reads
     * rows 2 p0 on */
    uint16_t *a = xcalloc((size_t)(m * lda + k * m + 2), sizeof *a);
    uint16_t *b = xcalloc((size_t)(kb * (n + 5) + n * (kb + 1)), sizeof *b);
    for (int64_t i = 0; i < m * lda + k * m + 2; i++)
      a[i] = bf16_from_f32((float)uniform(-1, 1));
    for (int64_t i = 0; i < kb * (n + 5) + n * (kb + 1); i++)
      b[i] = bf16_from_f32((float)uniform(-1, 1));
#define A_AT(i, j) bf16_to_f32(a[(i) * lda + (j)])
#define B_AT(j, l)                                                   \
  bf16_to_f32(cases[t].transposed_b ? b[(l) * ldb + (j)] : b[(j) * ldb + (l)])
    uint32_t *bp = xcalloc((size_t)op_bdot_pack_words(kb, n, OP_BDOT_PANEL),
                           sizeof *bp);
    op_bdot_pack(bp, b, kb, n, ldb, cases[t].transposed_b, OP_BDOT_PANEL);
    op_bdot_a av = {a, lda, false};
    uint32_t *ap = NULL;
    if (cases[t].packed_a) {
      /* A^T as stored by the callers: at(j, i) = A(i, j), rows of m */
      uint16_t *at = xcalloc((size_t)(k * m), sizeof *at);
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < k; j++) at[j * m + i] = a[i * lda + j];
      ap = xcalloc((size_t)op_bdot_pack_words(k, m, m), sizeof *ap);
      op_bdot_pack(ap, at, k, m, m, false, m);
      free(at);
      av = (op_bdot_a){ap, m, true};
    }
    size_t es = cases[t].ct == OP_F32 ? 4 : 2;
    char *c = xcalloc((size_t)(m * ldc), es);
    double *c0 = xcalloc((size_t)(m * ldc), sizeof *c0);
    for (int64_t i = 0; i < m * ldc; i++) {
      float v = (float)uniform(-1, 1);
      if (cases[t].ct == OP_F32) ((float *)c)[i] = v;
      else ((uint16_t *)c)[i] = bf16_from_f32(v);
      c0[i] = cases[t].ct == OP_F32 ? ((float *)c)[i]
                                    : bf16_to_f32(((uint16_t *)c)[i]);
    }
    const float alpha = 0.375f;
    op_bdot_run(m, n, k, alpha, av, bp, (kb + 1) / 2, p0, c, ldc,
                cases[t].ct, cases[t].acc);
    for (int64_t i = 0; i < m; i++)
      for (int64_t l = 0; l < ldc; l++) {
        double got = cases[t].ct == OP_F32
                         ? ((float *)c)[i * ldc + l]
                         : bf16_to_f32(((uint16_t *)c)[i * ldc + l]);
        if (l >= n) { /* past the n columns: untouched */
          assert_true(got == c0[i * ldc + l]);
          continue;
        }
        double want = 0, mag = 0;
        for (int64_t j = 0; j < k; j++) {
          double term = (double)A_AT(i, j) * B_AT(2 * p0 + j, l);
          want += term;
          mag += fabs(term);
        }
        want *= alpha;
        mag *= alpha;
        if (cases[t].acc) {
          want += c0[i * ldc + l];
          mag += fabs(c0[i * ldc + l]);
        }
        double tol = 4e-5 * mag + (cases[t].ct == OP_BF16 ? fabs(want) / 256
                                                          : 0);
        if (fabs(got - want) > tol)
          fail_msg("bf16_dot case %zu C(%lld, %lld) = %g, want %g (tol %g)",
                   t, (long long)i, (long long)l, got, want, tol);
      }
#undef A_AT
#undef B_AT
    free(a);
    free(b);
    free(bp);
    free(ap);
    free(c);
    free(c0);
  }
}

static void test_embed(void **state) {
  (void)state;
  bcase c = make_case(OP_EMBED, 3, S2(3, 40), S2(50, 300), S2(45, 300));
  c.desc.in_dtype[0] = OP_I32;
  c.lo[0] = 0;
  c.hi[0] = 50;
  c.param[1] = c.param[2] = true;
  check_case(&c);
  /* the tables are f32 master weights with f32 gradients */
  op_desc d = {.type = OP_EMBED, .nin = 3,
               .in = {S2(3, 4), S2(50, 30), S2(45, 30)},
               .in_dtype = {OP_I32, OP_F32, OP_BF16},
               .din_dtype = {OP_I32, OP_F32, OP_F32}};
  expect_plan_error(d, OP_BF16,
                    "embed: wpe is bf16 and its gradient f32: the tables "
                    "and their gradients must be f32");
  d.in_dtype[2] = OP_F32;
  d.din_dtype[1] = OP_BF16;
  expect_plan_error(d, OP_BF16,
                    "embed: wte is f32 and its gradient bf16: the tables "
                    "and their gradients must be f32");
}

static void test_cross_entropy(void **state) {
  (void)state;
  bcase c = make_case(OP_CROSS_ENTROPY, 2, S3(3, 50, 200), S2(3, 50));
  c.desc.in_dtype[1] = OP_I32;
  c.lo[0] = -4;
  c.hi[0] = 4;
  c.lo[1] = 0;
  c.hi[1] = 200;
  check_case(&c);
  /* logits a parameter: read through a bf16 copy, an f32 gradient */
  c = make_case(OP_CROSS_ENTROPY, 2, S2(70, 300), S1(70));
  c.desc.in_dtype[1] = OP_I32;
  c.lo[1] = 0;
  c.hi[1] = 300;
  c.param[0] = true;
  check_case(&c);
  /* losses stay f32 */
  op_desc d = {.type = OP_CROSS_ENTROPY, .nin = 2, .in = {S2(7, 30), S1(7)},
               .in_dtype = {OP_BF16, OP_I32}};
  expect_plan_error(d, OP_BF16,
                    "cross_entropy: the [1] output is bf16: it must be f32");
}

static void test_sum_mean(void **state) {
  (void)state;
  for (int t = 0; t < 2; t++) {
    bcase c = make_case(t ? OP_MEAN : OP_SUM, 1, S1(70001));
    c.lo[0] = 0;
    check_case(&c);
    /* a parameter input: an f32 dx */
    c = make_case(t ? OP_MEAN : OP_SUM, 1, S2(30, 70));
    c.param[0] = true;
    check_case(&c);
  }
  op_desc d = {.type = OP_MEAN, .nin = 1, .in = {S2(30, 70)},
               .in_dtype = {OP_BF16}};
  expect_plan_error(d, OP_BF16, "mean: the [1] output is bf16: it must be f32");
}

int main(void) {
  rng_state = 0x2545f4914f6cdd1dull;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear),      cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_linear_dw_transposed),
      cmocka_unit_test(test_add),         cmocka_unit_test(test_bias_add),
      cmocka_unit_test(test_relu_gelu),   cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_softmax),     cmocka_unit_test(test_attn_scores),
      cmocka_unit_test(test_attn_values), cmocka_unit_test(test_attention),
      cmocka_unit_test(test_bf16_dot),
      cmocka_unit_test(test_embed),       cmocka_unit_test(test_cross_entropy),
      cmocka_unit_test(test_sum_mean),
  };
  const char *filter = getenv("REMAT_TEST_FILTER");
  if (filter != NULL && filter[0] != '\0') cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
