/* Tests of gradient accumulation (remat_accumulate) and clipping by global
 * norm (remat_set_clip) on a tiny GPT: K micro-batches against one batch of
 * K times the rows, the activation peak of one micro-batch, a failed
 * micro-step that changes nothing, and a clipped update against one
 * computed here from the gradients. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gpt_fixture.h"

#define MICRO 2 /* rows of a micro-batch */
#define K 3     /* micro-batches per update */

static remat_gpt_config config(int batch) {
  remat_gpt_config c = {.layers = 2,
                        .d_model = 16,
                        .heads = 2,
                        .seq = 8,
                        .batch = batch,
                        .vocab = 7};
  return c;
}

/* The K * MICRO rows of the big batch, micro-batch k being rows
 * [k * MICRO, (k + 1) * MICRO). */
typedef struct rows {
  int32_t tokens[K * MICRO * 8], targets[K * MICRO * 8];
} rows;

static void feed_rows(fixture *f, const rows *r, int first, int count) {
  size_t n = (size_t)count * (size_t)f->cfg.seq, off = (size_t)first * 8;
  assert_int_equal(
      remat_feed(f->g, f->m.tokens, r->tokens + off, n * sizeof(int32_t)),
      REMAT_OK);
  assert_int_equal(
      remat_feed(f->g, f->m.targets, r->targets + off, n * sizeof(int32_t)),
      REMAT_OK);
}

/* One update from micro-batches 0..K-1: K-1 accumulations, one step. The
 * mean of their losses goes to *loss, the activation peak to *peak. */
static void accumulated_update(fixture *f, const rows *r, int update,
                               float *loss, int64_t *peak) {
  double sum = 0.0;
  *peak = 0;
  for (int k = 0; k < K; k++) {
    remat_step_stats st;
    feed_rows(f, r, (k + update) % K * MICRO, MICRO);
    if (k < K - 1)
      assert_int_equal(remat_accumulate(f->g, &st), REMAT_OK);
    else
      assert_int_equal(remat_step(f->g, &st), REMAT_OK);
    assert_int_equal(st.accumulated, k + 1);
    sum += st.loss;
    if (st.activation_peak_bytes > *peak)
      *peak = st.activation_peak_bytes;
  }
  *loss = (float)(sum / K);
}

/* Every parameter gradient, in parameter order. */
static float *grads(remat_graph *g, size_t *count) {
  float *all = fixture_snapshot(g, count), *at = all;
  for (int i = 0; i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    size_t k = (size_t)remat_tensor_numel(p);
    assert_int_equal(remat_read_grad(g, p, at, k * sizeof *at), REMAT_OK);
    at += k;
  }
  return all;
}

/* max |a - b| / max |b| over the parameters. */
static double rel_diff(const float *a, const float *b, size_t n) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < n; i++) {
    diff = fmax(diff, fabs((double)a[i] - (double)b[i]));
    scale = fmax(scale, fabs((double)b[i]));
  }
  return diff / scale;
}

static void accumulation_matches_big_batch(remat_optimizer_kind kind) {
  remat_optimizer opt = {.kind = kind,
                         .lr = kind == REMAT_OPT_SGD ? 0.5f : 1e-2f,
                         .weight_decay = 0.01f};
  remat_gpt_config big_cfg = config(K * MICRO), micro_cfg = config(MICRO);
  /* SGD's update is the gradient times lr; AdamW's, at its first steps,
   * near lr * sign(gradient) per element, which turns the rounding of
   * tiny gradients into a larger relative change. */
  double params_tol = kind == REMAT_OPT_SGD ? 1e-6 : 2e-5;
  double updates_tol = kind == REMAT_OPT_SGD ? 1e-6 : 2e-3;
  rows r;
  fixture_batch(&big_cfg, r.tokens, r.targets, 3);
  fixture big, micro;
  assert_int_equal(fixture_open(&big, &big_cfg, 2, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  assert_int_equal(
      fixture_open(&micro, &micro_cfg, 2, "nothing_saveable", 0, &opt),
      REMAT_OK);
  size_t n, n2;
  float *start = fixture_snapshot(big.g, &n);
  float *start2 = fixture_snapshot(micro.g, &n2);
  assert_int_equal(n, n2);
  assert_memory_equal(start, start2, n * sizeof *start);
  feed_rows(&big, &r, 0, K * MICRO);
  /* Two updates, the second from the micro-batches in another order. */
  for (int update = 0; update < 2; update++) {
    remat_step_stats st;
    assert_int_equal(remat_step(big.g, &st), REMAT_OK);
    assert_int_equal(st.accumulated, 1);
    float loss;
    int64_t peak;
    accumulated_update(&micro, &r, update, &loss, &peak);
    if (fabsf(loss - st.loss) > 1e-6f * fabsf(st.loss))
      fail_msg("update %d: loss %.9g accumulated, %.9g in one batch", update,
               (double)loss, (double)st.loss);
    float *want = fixture_snapshot(big.g, &n);
    float *got = fixture_snapshot(micro.g, &n2);
    double d = rel_diff(got, want, n);
    if (d > params_tol)
      fail_msg("update %d: parameters differ by %.3g relative", update, d);
    /* The updates themselves, not only the parameters, agree. */
    for (size_t i = 0; i < n; i++) {
      got[i] -= start[i];
      want[i] -= start[i];
    }
    d = rel_diff(got, want, n);
    if (!(d < updates_tol))
      fail_msg("update %d: updates differ by %.3g relative", update, d);
    free(want);
    free(got);
    free(start);
    start = fixture_snapshot(big.g, &n);
    /* The mean gradient the update used is the big batch's gradient. */
    want = grads(big.g, &n);
    got = grads(micro.g, &n2);
    d = rel_diff(got, want, n);
    if (!(d < 1e-6))
      fail_msg("update %d: gradients differ by %.3g relative", update, d);
    free(want);
    free(got);
    /* Activations peak below the big batch's. */
    assert_true(peak > 0 && peak < st.activation_peak_bytes);
  }
  free(start);
  free(start2);
  fixture_close(&big);
  fixture_close(&micro);
}

static void test_accumulation_sgd(void **state) {
  (void)state;
  accumulation_matches_big_batch(REMAT_OPT_SGD);
}

static void test_accumulation_adamw(void **state) {
  (void)state;
  accumulation_matches_big_batch(REMAT_OPT_ADAMW);
}

/* On one worker (one order of tasks) an accumulation's activation peak is
 * exactly one step's; the sums of gradients double the gradients' bytes,
 * and the predicted peak counts them. */
static void test_accumulation_peak(void **state) {
  (void)state;
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  remat_gpt_config cfg = config(MICRO);
  fixture f;
  assert_int_equal(fixture_open(&f, &cfg, 1, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  remat_step_stats one, acc, last;
  assert_int_equal(remat_step(f.g, &one), REMAT_OK);
  assert_int_equal(remat_accumulate(f.g, &acc), REMAT_OK);
  assert_int_equal(remat_step(f.g, &last), REMAT_OK);
  assert_int_equal(acc.activation_peak_bytes, one.activation_peak_bytes);
  assert_int_equal(last.activation_peak_bytes, one.activation_peak_bytes);
  assert_true(one.peak[REMAT_MEM_GRADS] > 0);
  assert_int_equal(acc.peak[REMAT_MEM_GRADS], 2 * one.peak[REMAT_MEM_GRADS]);
  assert_int_equal(acc.predicted_peak_bytes,
                   one.predicted_peak_bytes + one.peak[REMAT_MEM_GRADS]);
  assert_int_equal(last.peak_bytes, acc.peak_bytes);
  assert_int_equal(acc.peak_bytes, one.peak_bytes + one.peak[REMAT_MEM_GRADS]);
  fixture_close(&f);
}

/* A micro-step whose gradient is NaN adds nothing and changes no
 * parameter: the run that met it and recovered ends bitwise where a run
 * without it ends. */
static void test_failed_micro_step(void **state) {
  (void)state;
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  remat_gpt_config cfg = config(MICRO), big_cfg = config(K * MICRO);
  rows r;
  fixture_batch(&big_cfg, r.tokens, r.targets, 5);
  fixture clean, hit;
  assert_int_equal(fixture_open(&clean, &cfg, 2, "dots_saveable", 0, &opt),
                   REMAT_OK);
  assert_int_equal(fixture_open(&hit, &cfg, 2, "dots_saveable", 0, &opt),
                   REMAT_OK);
  float loss;
  int64_t peak;
  accumulated_update(&clean, &r, 0, &loss, &peak);
  size_t n;
  float *before = fixture_snapshot(hit.g, &n);
  feed_rows(&hit, &r, 0, MICRO);
  assert_int_equal(remat_accumulate(hit.g, NULL), REMAT_OK);
  remat_tensor *w = remat_param_at(hit.g, 2);
  size_t wn = (size_t)remat_tensor_numel(w);
  float *saved = malloc(wn * sizeof *saved), *bad = malloc(wn * sizeof *bad);
  assert_int_equal(remat_read(hit.g, w, saved, wn * sizeof *saved), REMAT_OK);
  memcpy(bad, saved, wn * sizeof *bad);
  bad[1] = NAN;
  assert_int_equal(remat_write(hit.g, w, bad, wn * sizeof *bad), REMAT_OK);
  remat_step_stats st;
  feed_rows(&hit, &r, MICRO, MICRO);
  assert_int_equal(remat_accumulate(hit.g, &st), REMAT_ERR_NUMERIC);
  assert_string_equal(remat_last_error(),
                      "remat_accumulate: the loss or a gradient is NaN or "
                      "Inf; the updates were skipped");
  assert_int_equal(remat_write(hit.g, w, saved, wn * sizeof *saved), REMAT_OK);
  float *after = fixture_snapshot(hit.g, &n);
  assert_memory_equal(before, after, n * sizeof *before);
  for (int k = 1; k < K; k++) {
    feed_rows(&hit, &r, k * MICRO, MICRO);
    if (k < K - 1)
      assert_int_equal(remat_accumulate(hit.g, &st), REMAT_OK);
    else
      assert_int_equal(remat_step(hit.g, &st), REMAT_OK);
    assert_int_equal(st.accumulated, k + 1);
  }
  float *want = fixture_snapshot(clean.g, &n),
        *got = fixture_snapshot(hit.g, &n);
  assert_memory_equal(want, got, n * sizeof *want);
  free(before);
  free(after);
  free(want);
  free(got);
  free(saved);
  free(bad);
  fixture_close(&clean);
  fixture_close(&hit);
}

static void test_accumulate_misuse(void **state) {
  (void)state;
  fixture f;
  remat_gpt_config cfg = config(MICRO);
  assert_int_equal(fixture_open(&f, &cfg, 1, "nothing_saveable", 0, NULL),
                   REMAT_OK);
  assert_int_equal(remat_accumulate(f.g, NULL), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_accumulate: the graph was compiled without an "
                      "optimizer: accumulation sums gradients for an "
                      "optimizer update");
  assert_int_equal(remat_set_clip(f.g, 1.0f), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_set_clip: needs a graph compiled with an "
                      "optimizer and a finite max_norm >= 0 (0: no "
                      "clipping), got 1");
  fixture_close(&f);
  remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  assert_int_equal(fixture_open(&f, &cfg, 1, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  assert_int_equal(remat_set_clip(f.g, -1.0f), REMAT_ERR_INVALID_ARG);
  assert_int_equal(remat_set_clip(f.g, NAN), REMAT_ERR_INVALID_ARG);
  assert_int_equal(remat_set_clip(NULL, 1.0f), REMAT_ERR_INVALID_ARG);
  assert_int_equal(remat_accumulate(NULL, NULL), REMAT_ERR_INVALID_ARG);
  fixture_close(&f);
}

/* ---- clipping ---- */

typedef struct clipped_run {
  float *params, *grads;
  size_t n;
  double norm;
} clipped_run;

/* One SGD step at lr 0.5 with clipping at `clip` on `threads` workers. */
static clipped_run clipped_step(float clip, int threads) {
  remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.5f};
  remat_gpt_config cfg = config(MICRO);
  fixture f;
  assert_int_equal(fixture_open(&f, &cfg, threads, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  assert_int_equal(remat_set_clip(f.g, clip), REMAT_OK);
  remat_step_stats st;
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  clipped_run r = {.norm = st.grad_norm};
  r.params = fixture_snapshot(f.g, &r.n);
  r.grads = malloc(r.n * sizeof *r.grads);
  float *at = r.grads;
  for (int i = 0; i < remat_num_params(f.g); i++) {
    remat_tensor *p = remat_param_at(f.g, i);
    size_t k = (size_t)remat_tensor_numel(p);
    assert_int_equal(remat_read_grad(f.g, p, at, k * sizeof *at), REMAT_OK);
    at += k;
  }
  fixture_close(&f);
  return r;
}

static void test_clip_global_norm(void **state) {
  (void)state;
  remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.5f};
  remat_gpt_config cfg = config(MICRO);
  fixture f;
  assert_int_equal(fixture_open(&f, &cfg, 1, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  size_t n;
  float *w0 = fixture_snapshot(f.g, &n);
  fixture_close(&f);
  clipped_run off = clipped_step(0.0f, 1);
  double sumsq = 0.0;
  for (size_t i = 0; i < n; i++)
    sumsq += (double)off.grads[i] * off.grads[i];
  double norm = sqrt(sumsq);
  assert_true(norm > 0.1);
  if (fabs(off.norm - norm) > 1e-9 * norm)
    fail_msg("grad_norm %.12g, computed here %.12g", off.norm, norm);
  /* A clip above the norm changes nothing, bitwise. */
  clipped_run high = clipped_step((float)(2.0 * norm), 1);
  assert_memory_equal(high.params, off.params, n * sizeof(float));
  /* A clip at a quarter of the norm scales every gradient by about 1/4. */
  float clip = (float)(0.25 * norm);
  clipped_run low = clipped_step(clip, 1);
  double scale = (double)clip / (norm + 1e-6);
  size_t moved = 0;
  for (size_t i = 0; i < n; i++) {
    double want = (double)w0[i] - 0.5 * scale * (double)low.grads[i];
    if (fabs(low.params[i] - want) > 1e-6 * fmax(1.0, fabs(want)))
      fail_msg("element %zu: %.9g clipped, %.9g computed here", i,
               (double)low.params[i], want);
    moved += low.params[i] != off.params[i];
  }
  assert_true(moved > n / 2);
  assert_true(low.norm == off.norm);
  /* The norm and the clipped step are the same at 2 threads, bitwise. */
  clipped_run two = clipped_step(clip, 2);
  assert_true(two.norm == low.norm);
  assert_memory_equal(two.params, low.params, n * sizeof(float));
  clipped_run *runs[] = {&off, &high, &low, &two};
  for (int i = 0; i < 4; i++) {
    free(runs[i]->params);
    free(runs[i]->grads);
  }
  free(w0);
}

/* Two accumulated, clipped updates: the same bits on 1 worker, on 3, and
 * on 4 workers of two NUMA nodes (with per-node parameter copies). */
static float *accumulated_bits(int threads, const char *topology, double *norm,
                               size_t *n) {
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  remat_gpt_config cfg = config(MICRO), big_cfg = config(K * MICRO);
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_TRACE | REMAT_SET_TOPOLOGY,
                     .num_threads = threads,
                     .policy = "dots_saveable",
                     .topology = topology};
  rows r;
  fixture_batch(&big_cfg, r.tokens, r.targets, 9);
  fixture f;
  assert_int_equal(fixture_open_config(&f, &cfg, &rc, &opt), REMAT_OK);
  assert_int_equal(remat_set_clip(f.g, 0.5f), REMAT_OK);
  float loss;
  int64_t peak;
  for (int update = 0; update < 2; update++)
    accumulated_update(&f, &r, update, &loss, &peak);
  remat_step_stats st;
  feed_rows(&f, &r, 0, MICRO);
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  *norm = st.grad_norm;
  assert_true(st.grad_norm > 0.5); /* so the clip acted */
  float *bits = fixture_snapshot(f.g, n);
  fixture_close(&f);
  return bits;
}

static void test_accumulation_bitwise(void **state) {
  (void)state;
  double n1, n3, n4;
  size_t n, n2, n3_;
  float *one = accumulated_bits(1, NULL, &n1, &n);
  float *three = accumulated_bits(3, NULL, &n3, &n2);
  float *numa = accumulated_bits(4, "package:2 numa:1 core:2 pu:1", &n4, &n3_);
  assert_true(n > 0 && n == n2 && n == n3_);
  assert_memory_equal(one, three, n * sizeof *one);
  assert_memory_equal(one, numa, n * sizeof *one);
  assert_memory_equal(&n1, &n3, sizeof n1);
  assert_memory_equal(&n1, &n4, sizeof n1);
  free(one);
  free(three);
  free(numa);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accumulation_sgd),
      cmocka_unit_test(test_accumulation_adamw),
      cmocka_unit_test(test_accumulation_peak),
      cmocka_unit_test(test_accumulation_bitwise),
      cmocka_unit_test(test_failed_micro_step),
      cmocka_unit_test(test_accumulate_misuse),
      cmocka_unit_test(test_clip_global_norm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
