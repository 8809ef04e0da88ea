/* Tests of fused causal attention against the materialized path: the op's
 * output and gradient against scores -> softmax -> values in float (within
 * 1e-5 relative), and a GPT built with each: equal losses and gradients
 * within 1e-5, bitwise identical results at 1 and 2 threads, under every
 * policy and on synthetic NUMA machines, an activation peak without the
 * T x T matrices, and the errors for policies that name tensors only the
 * materialized path has. Also the materialized values op's causal blocks
 * against its whole products. (Finite differences of the op are in
 * test_ops.) */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpt_fixture.h"
#include "op_fixture.h"
#include "ops/op.h"

static float *zeros(int64_t n) {
  float *p = calloc((size_t)(n ? n : 1), sizeof *p);
  assert_non_null(p);
  return p;
}

/* A planned op with its own aux, workspace and scratch buffers. */
typedef struct planned {
  op_instance inst;
  op_worker w;
  op_bufs b;
} planned;

static void plan_attrs(planned *p, op_type type, int nin, const op_shape *in,
                       op_attrs attrs) {
  memset(p, 0, sizeof *p);
  op_desc d = {.type = type, .nin = nin, .attrs = attrs};
  for (int i = 0; i < nin; i++) d.in[i] = in[i];
  char err[OP_ERRMSG_MAX];
  if (op_plan(&d, engine, &p->inst, err) != REMAT_OK) fail_msg("%s", err);
  for (int k = 0; k < p->inst.naux; k++)
    p->b.aux[k] = zeros((int64_t)p->inst.aux_bytes[k] / 4);
  for (int k = 0; k < p->inst.nws; k++)
    p->b.ws[k] = zeros((int64_t)p->inst.ws_bytes[k] / 4);
  p->w.stream = stream;
  p->w.scratch_bytes = p->inst.scratch_bytes;
  p->w.scratch = malloc(p->inst.scratch_bytes ? p->inst.scratch_bytes : 1);
  assert_non_null(p->w.scratch);
}

static void plan(planned *p, op_type type, int nin, const op_shape *in,
                 int heads) {
  plan_attrs(p, type, nin, in, (op_attrs){.heads = heads});
}

static void run(planned *p, bool backward) {
  const op_kernel *k = backward ? p->inst.bwd : p->inst.fwd;
  int n = backward ? p->inst.nbwd : p->inst.nfwd;
  for (int i = 0; i < n; i++)
    for (int64_t t = 0; t < k[i].tiles; t++)
      assert_int_equal(k[i].fn(&p->inst, &p->b, t, &p->w), REMAT_OK);
}

static void unplan(planned *p) {
  for (int k = 0; k < OP_MAX_AUX; k++) free(p->b.aux[k]);
  for (int k = 0; k < OP_MAX_WS; k++) free(p->b.ws[k]);
  free(p->w.scratch);
  op_instance_release(&p->inst);
}

/* max |got - want| <= 1e-5 max |want| */
static void expect_close(const char *what, const float *got,
                         const float *want, int64_t n) {
  double scale = 0, worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++) {
    scale = fmax(scale, fabs(want[i]));
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  assert_true(scale > 0);
  if (!(worst <= 1e-5 * scale))
    fail_msg("%s: [%lld] = %.9g, materialized %.9g (max error %.3g of "
             "scale %.3g)",
             what, (long long)at, got[at], want[at], worst, scale);
}

/* Fused and materialized attention on the same qkv and output gradient. */
static void compare_paths(int64_t B, int64_t T, int64_t H, int64_t hd) {
  int64_t D = H * hd, nqkv = B * T * 3 * D, no = B * T * D;
  int64_t np = B * H * T * T;
  op_shape qkv = {3, {B, T, 3 * D}}, p4 = {4, {B, H, T, T}};
  float *x = zeros(nqkv), *dout = zeros(no);
  for (int64_t i = 0; i < nqkv; i++) x[i] = (float)uniform(-2, 2);
  for (int64_t i = 0; i < no; i++) dout[i] = (float)uniform(-1, 1);

  planned fused;
  plan(&fused, OP_ATTENTION, 1, &qkv, (int)H);
  float *fo = zeros(no), *fdx = zeros(nqkv);
  fused.b.in[0] = x;
  fused.b.out = fo;
  fused.b.dout = dout;
  fused.b.din[0] = fdx;
  run(&fused, false);
  run(&fused, true);

  planned sc, sm, va;
  plan(&sc, OP_ATTN_SCORES, 1, &qkv, (int)H);
  plan(&sm, OP_SOFTMAX, 1, &p4, 0);
  op_shape vin[2] = {p4, qkv};
  plan(&va, OP_ATTN_VALUES, 2, vin, (int)H);
  float *s = zeros(np), *p = zeros(np), *ds = zeros(np), *dp = zeros(np);
  float *mo = zeros(no), *mdx = zeros(nqkv);
  sc.b.in[0] = x;
  sc.b.out = s;
  sm.b.in[0] = s;
  sm.b.out = p;
  va.b.in[0] = p;
  va.b.in[1] = x;
  va.b.out = mo;
  run(&sc, false);
  run(&sm, false);
  run(&va, false);
  va.b.dout = dout;
  va.b.din[0] = dp;
  va.b.din[1] = mdx;
  va.b.din_accumulate[1] = true;
  run(&va, true);
  sm.b.dout = dp;
  sm.b.din[0] = ds;
  run(&sm, true);
  sc.b.dout = ds;
  sc.b.din[0] = mdx;
  sc.b.din_accumulate[0] = true;
  run(&sc, true);

  char what[64];
  snprintf(what, sizeof what, "out T=%lld hd=%lld", (long long)T,
           (long long)hd);
  expect_close(what, fo, mo, no);
  snprintf(what, sizeof what, "dqkv T=%lld hd=%lld", (long long)T,
           (long long)hd);
  expect_close(what, fdx, mdx, nqkv);
  /* the saved log-sum-exp is that of the materialized scores */
  for (int64_t r = 0; r < B * H * T; r++) {
    int64_t t = r % T;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j <= t; j++) mx = fmax(mx, s[r * T + j]);
    for (int64_t j = 0; j <= t; j++) sum += exp(s[r * T + j] - mx);
    double want = mx + log(sum);
    if (fabs(fused.b.aux[0][r] - want) > 1e-5 * fmax(1.0, fabs(want)))
      fail_msg("lse[%lld] = %.9g, want %.9g", (long long)r,
               fused.b.aux[0][r], want);
  }
  free(x), free(dout), free(fo), free(fdx), free(s), free(p), free(ds);
  free(dp), free(mo), free(mdx);
  unplan(&fused), unplan(&sc), unplan(&sm), unplan(&va);
}

static void test_op_matches_materialized(void **state) {
  (void)state;
  compare_paths(2, 256, 4, 64);  /* the default model's attention */
  compare_paths(1, 300, 2, 16);  /* blocks of 128, remainder 44 */
  compare_paths(1, 1100, 1, 64); /* remainder 76 */
  compare_paths(1, 200, 2, 128); /* remainder 72 */
  compare_paths(1, 97, 2, 128);  /* one short block */
  compare_paths(2, 1, 2, 32);
}

/* The values op told that its probabilities are causal (probs_causal:
 * its products skip the keys a query cannot see, in blocks of rows)
 * against the same op without that promise (one product over every key),
 * on the same causal p: the output and dv within 1e-5; dp the same where
 * query i sees key j and exactly 0 elsewhere, written over a buffer of
 * NaN; and when dp accumulates, twice that where the query sees the key
 * and finite elsewhere. */
static void values_blocks(int64_t B, int64_t T, int64_t H, int64_t hd) {
  int64_t D = H * hd, nqkv = B * T * 3 * D, no = B * T * D;
  int64_t np = B * H * T * T;
  op_shape qkv = {3, {B, T, 3 * D}}, p4 = {4, {B, H, T, T}};
  op_shape vin[2] = {p4, qkv};
  float *x = zeros(nqkv), *dout = zeros(no), *p = zeros(np);
  for (int64_t i = 0; i < nqkv; i++) x[i] = (float)uniform(-2, 2);
  for (int64_t i = 0; i < no; i++) dout[i] = (float)uniform(-1, 1);
  for (int64_t r = 0; r < B * H * T; r++) {
    int64_t t = r % T;
    double sum = 0;
    for (int64_t j = 0; j <= t; j++) sum += p[r * T + j] = (float)uniform(0, 1);
    for (int64_t j = 0; j <= t; j++) p[r * T + j] = (float)(p[r * T + j] / sum);
  }
  planned blk, whole;
  plan_attrs(&blk, OP_ATTN_VALUES, 2, vin,
             (op_attrs){.heads = (int)H, .probs_causal = true});
  plan(&whole, OP_ATTN_VALUES, 2, vin, (int)H);
  assert_true(blk.inst.fwd[0].flops < whole.inst.fwd[0].flops);
  planned *v[2] = {&blk, &whole};
  float *out[2], *dp[2], *dv[2];
  for (int k = 0; k < 2; k++) {
    out[k] = zeros(no), dp[k] = zeros(np), dv[k] = zeros(nqkv);
    v[k]->b.in[0] = p;
    v[k]->b.in[1] = x;
    v[k]->b.out = out[k];
    v[k]->b.dout = dout;
    v[k]->b.din[0] = dp[k];
    v[k]->b.din[1] = dv[k];
  }
  for (int64_t i = 0; i < np; i++) dp[0][i] = NAN;
  for (int k = 0; k < 2; k++) run(v[k], false), run(v[k], true);
  char what[64];
  snprintf(what, sizeof what, "values out T=%lld", (long long)T);
  expect_close(what, out[0], out[1], no);
  snprintf(what, sizeof what, "values dv T=%lld", (long long)T);
  expect_close(what, dv[0], dv[1], nqkv);
  for (int pass = 0; pass < 2; pass++) {
    for (int64_t r = 0; r < B * H * T; r++)
      for (int64_t j = 0, t = r % T; j < T; j++) {
        float got = dp[0][r * T + j], want = dp[1][r * T + j];
        if (j > t && (pass == 0 ? got != 0.0f : !isfinite(got)))
          fail_msg("dp[%lld][%lld] = %g where the query cannot see the key",
                   (long long)r, (long long)j, got);
        if (j <= t && !(fabs(got - (pass + 1) * want) <= 1e-5))
          fail_msg("dp[%lld][%lld] = %.9g, want %.9g", (long long)r,
                   (long long)j, got, (pass + 1) * want);
      }
    /* again, adding into dp */
    blk.b.din_accumulate[0] = true;
    blk.b.din[1] = NULL;
    run(&blk, true);
  }
  for (int k = 0; k < 2; k++) {
    free(out[k]), free(dp[k]), free(dv[k]);
    unplan(v[k]);
  }
  free(x), free(dout), free(p);
}

static void test_values_causal_blocks(void **state) {
  (void)state;
  values_blocks(2, 256, 4, 64); /* 4 blocks of 64 */
  values_blocks(1, 300, 2, 16); /* 4 blocks of 80, the last 60 */
  values_blocks(1, 1100, 1, 64); /* 8 blocks of 144, the last 92 */
}

static const remat_gpt_config small = {.layers = 2, .d_model = 64,
                                       .heads = 2, .seq = 150, .batch = 2,
                                       .vocab = 29,
                                       .attention = REMAT_ATTENTION_FUSED};

typedef struct outcome {
  float loss;
  uint64_t grad_hash;
  remat_step_stats st;
  float *grads, *params;
  size_t n;
} outcome;

/* One step; with keep_grads, copies of the gradients and parameters. The
 * parameters are first overwritten with `params` when not NULL (the two
 * paths create different numbers of tensors, so their seeded inits
 * differ). */
static outcome step_once(const remat_gpt_config *c, int threads,
                         const char *policy, bool keep_grads,
                         const float *params) {
  fixture f;
  remat_status s = fixture_open(&f, c, threads, policy, 0, NULL);
  if (s != REMAT_OK) fail_msg("open %s: %s", policy, remat_last_error());
  outcome o = {.st.size = sizeof o.st};
  for (int i = 0; params && i < remat_num_params(f.g); i++) {
    remat_tensor *p = remat_param_at(f.g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    assert_int_equal(remat_write(f.g, p, params, n * sizeof *params),
                     REMAT_OK);
    params += n;
  }
  if (keep_grads) {
    o.params = fixture_snapshot(f.g, &o.n);
    assert_non_null(o.params);
  }
  assert_int_equal(remat_step(f.g, &o.st), REMAT_OK);
  o.loss = o.st.loss;
  o.grad_hash = fixture_grad_hash(&f);
  assert_true(o.grad_hash != 0);
  if (keep_grads) {
    o.grads = malloc(o.n * sizeof *o.grads);
    assert_non_null(o.grads);
    float *at = o.grads;
    for (int i = 0; i < remat_num_params(f.g); i++) {
      remat_tensor *p = remat_param_at(f.g, i);
      size_t n = (size_t)remat_tensor_numel(p);
      assert_int_equal(remat_read_grad(f.g, p, at, n * sizeof *at), REMAT_OK);
      at += n;
    }
  }
  fixture_close(&f);
  return o;
}

/* Every thread count and policy gives the same bits; the losses and
 * gradients match the materialized model's within 1e-5. */
static void test_gpt_bitwise_and_close(void **state) {
  (void)state;
  remat_gpt_config m = small;
  m.attention = REMAT_ATTENTION_MATERIALIZED;
  outcome mat = step_once(&m, 2, "nothing_saveable", true, NULL);
  outcome ref = step_once(&small, 1, "everything_saveable", true, mat.params);
  static const char *const policies[] = {"everything_saveable",
                                         "nothing_saveable", "dots_saveable",
                                         "save_only_these_names:attn_values"};
  for (size_t i = 0; i < sizeof policies / sizeof *policies; i++)
    for (int threads = 1; threads <= 2; threads++) {
      outcome o = step_once(&small, threads, policies[i], false, mat.params);
      if (memcmp(&o.loss, &ref.loss, sizeof o.loss) != 0 ||
          o.grad_hash != ref.grad_hash)
        fail_msg("fused, %s at %d threads: loss %.9g, hash %llx; "
                 "everything_saveable at 1 thread: %.9g, %llx",
                 policies[i], threads, o.loss,
                 (unsigned long long)o.grad_hash, ref.loss,
                 (unsigned long long)ref.grad_hash);
    }
  if (!(fabsf(ref.loss - mat.loss) <= 1e-5f * fabsf(mat.loss)))
    fail_msg("loss: fused %.9g, materialized %.9g", ref.loss, mat.loss);
  assert_int_equal(ref.n, mat.n);
  expect_close("gpt gradients", ref.grads, mat.grads, (int64_t)ref.n);
  free(ref.grads), free(ref.params);
  free(mat.grads), free(mat.params);
}

/* On synthetic NUMA machines (tiles dealt to nodes by their (batch, head)
 * rows, buffers sliced) the fused model gives the bits of one thread. */
static void test_gpt_numa_bitwise(void **state) {
  (void)state;
  static const struct {
    const char *topo;
    int threads;
    const char *policy;
  } runs[] = {{"package:1 numa:1 core:1 pu:1", 1, "nothing_saveable"},
              {"package:2 numa:1 core:2 pu:1", 4, "nothing_saveable"},
              {"package:1 numa:4 core:1 pu:1", 4, "everything_saveable"}};
  float loss0 = 0;
  uint64_t hash0 = 0;
  for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
    remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TOPOLOGY |
                              REMAT_SET_POLICY | REMAT_SET_TRACE,
                       .num_threads = runs[i].threads,
                       .topology = runs[i].topo,
                       .policy = runs[i].policy};
    fixture f;
    if (fixture_open_config(&f, &small, &rc, NULL) != REMAT_OK)
      fail_msg("%s: %s", runs[i].topo, remat_last_error());
    remat_step_stats st = {.size = sizeof st};
    assert_int_equal(remat_step(f.g, &st), REMAT_OK);
    uint64_t hash = fixture_grad_hash(&f);
    assert_true(hash != 0);
    if (i == 0) {
      loss0 = st.loss;
      hash0 = hash;
    } else if (memcmp(&st.loss, &loss0, sizeof loss0) != 0 || hash != hash0) {
      fail_msg("%s, %d threads: loss %.9g hash %llx; one thread %.9g %llx",
               runs[i].topo, runs[i].threads, st.loss,
               (unsigned long long)hash, loss0, (unsigned long long)hash0);
    }
    fixture_close(&f);
  }
}

/* At T = 512 the materialized block's scores and probabilities [2,4,T,T]
 * (8 MiB each) dominate the activation peak; the fused path keeps none:
 * its whole peak is below one of them, and a third of the materialized
 * one (measured: 6.2 MB and 27.8 MB). One thread: the program order, so the
 * measured peak is the predicted one. */
static void test_gpt_peak_without_tt(void **state) {
  (void)state;
  remat_gpt_config c = {.layers = 2, .d_model = 64, .heads = 4, .seq = 512,
                        .batch = 2, .vocab = 29,
                        .attention = REMAT_ATTENTION_FUSED};
  outcome f = step_once(&c, 1, "nothing_saveable", false, NULL);
  c.attention = REMAT_ATTENTION_MATERIALIZED;
  outcome m = step_once(&c, 1, "nothing_saveable", false, NULL);
  int64_t tt = 2LL * 4 * 512 * 512 * 4;
  assert_true(m.st.activation_peak_bytes > 2 * tt);
  if (f.st.activation_peak_bytes * 3 > m.st.activation_peak_bytes)
    fail_msg("activation peak: fused %lld, materialized %lld",
             (long long)f.st.activation_peak_bytes,
             (long long)m.st.activation_peak_bytes);
  assert_true(f.st.activation_peak_bytes < tt);
}

static void expect_open_error(const remat_gpt_config *c, const char *policy,
                              remat_status want, const char *msg) {
  fixture f;
  remat_status s = fixture_open(&f, c, 1, policy, 0, NULL);
  assert_int_equal(s, want);
  assert_string_equal(remat_last_error(), msg);
  fixture_close(&f);
}

static void test_errors(void **state) {
  (void)state;
  expect_open_error(&small, "save_only_these_names:attn_probs",
                    REMAT_ERR_POLICY,
                    "policy save_only_these_names names 'attn_probs', which "
                    "fused attention does not have (it keeps no T x T "
                    "matrix): use the materialized attention "
                    "(remat_causal_self_attention, "
                    "REMAT_ATTENTION_MATERIALIZED in a builder's config) or "
                    "name other tensors");
  expect_open_error(&small, "save_any_names_but_these:attn_scores",
                    REMAT_ERR_POLICY,
                    "policy save_any_names_but_these names 'attn_scores', "
                    "which fused attention does not have (it keeps no T x T "
                    "matrix): use the materialized attention "
                    "(remat_causal_self_attention, "
                    "REMAT_ATTENTION_MATERIALIZED in a builder's config) or "
                    "name other tensors");
  remat_gpt_config c = small;
  c.attention = (remat_attention_kind)3;
  expect_open_error(&c, "nothing_saveable", REMAT_ERR_INVALID_ARG,
                    "remat_gpt_build: attention 3: expected "
                    "REMAT_ATTENTION_DEFAULT (0), REMAT_ATTENTION_FUSED (1) "
                    "or REMAT_ATTENTION_MATERIALIZED (2)");
  assert_null(remat_fused_attention(NULL, NULL, 2));
  assert_string_equal(remat_last_error(), "attention: graph is NULL");
}

int main(void) {
  rng_state = 0x2545f4914f6cdd1dull;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_op_matches_materialized),
      cmocka_unit_test(test_values_causal_blocks),
      cmocka_unit_test(test_gpt_bitwise_and_close),
      cmocka_unit_test(test_gpt_numa_bitwise),
      cmocka_unit_test(test_gpt_peak_without_tt),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
