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
#include <sys/stat.h>

#include <cmocka.h>

#include "gpt_fixture.h"
#include "tmpdir.h"

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
    remat_step_stats st = {.size = sizeof st};
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
    remat_step_stats st = {.size = sizeof st};
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
static void accumulation_peak(int d_model) {
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  remat_gpt_config cfg = config(MICRO);
  cfg.d_model = d_model;
  fixture f;
  assert_int_equal(fixture_open(&f, &cfg, 1, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  remat_step_stats one = {.size = sizeof one}, acc = {.size = sizeof acc},
                   last = {.size = sizeof last};
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
  assert_int_equal(acc.predicted_peak_bytes, acc.peak_bytes);
  fixture_close(&f);
}

/* d_model 8: vectors of 32 bytes, which the arena rounds to 64, as the
 * predicted peak of an accumulation must. */
static void test_accumulation_peak(void **state) {
  (void)state;
  accumulation_peak(16);
  accumulation_peak(8);
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
  remat_step_stats st = {.size = sizeof st};
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
  /* Compiling again mid-accumulation is refused and loses nothing. */
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_accumulate(f.g, &st), REMAT_OK);
  assert_int_equal(remat_compile(f.g, f.m.loss, &opt), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_compile: the graph is already compiled");
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_int_equal(st.accumulated, 2);
  assert_int_equal(remat_set_clip(NULL, 1.0f), REMAT_ERR_INVALID_ARG);
  assert_int_equal(remat_accumulate(NULL, NULL), REMAT_ERR_INVALID_ARG);
  /* A forward-only graph (no loss) has no gradients to sum or clip. */
  remat_graph *fwd;
  remat_gpt m;
  assert_int_equal(remat_graph_create(f.rt, &fwd), REMAT_OK);
  assert_int_equal(remat_gpt_build(fwd, &cfg, &m), REMAT_OK);
  assert_int_equal(remat_compile(fwd, NULL, &opt), REMAT_OK);
  assert_int_equal(remat_accumulate(fwd, NULL), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_accumulate: the graph was compiled without a "
                      "loss: accumulation sums gradients for an optimizer "
                      "update");
  assert_int_equal(remat_set_clip(fwd, 1.0f), REMAT_ERR_INVALID_ARG);
  remat_graph_destroy(fwd);
  fixture_close(&f);
}

/* Checkpoints and accumulation: a checkpoint cannot be saved while
 * micro-batches wait for their update (it could not resume exactly), and
 * a load discards the sums, so that the next update uses gradients of the
 * loaded weights only: a run that accumulated before each load ends
 * bitwise where one that did not ends. */
static void test_accumulate_and_checkpoints(void **state) {
  (void)state;
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  remat_gpt_config cfg = config(MICRO), big_cfg = config(K * MICRO);
  rows r;
  fixture_batch(&big_cfg, r.tokens, r.targets, 11);
  char ck[160], ck2[160], weights[160], want[400];
  snprintf(ck, sizeof ck, "%s/start.ckpt", dir);
  snprintf(ck2, sizeof ck2, "%s/mid.ckpt", dir);
  snprintf(weights, sizeof weights, "%s/start.safetensors", dir);
  fixture f, ref;
  assert_int_equal(fixture_open(&f, &cfg, 2, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  assert_int_equal(fixture_open(&ref, &cfg, 2, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  assert_int_equal(remat_save_checkpoint(f.g, ck, NULL, NULL, 0), REMAT_OK);
  assert_int_equal(remat_save_safetensors(f.g, weights), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  feed_rows(&f, &r, 0, MICRO);
  assert_int_equal(remat_accumulate(f.g, &st), REMAT_OK);
  feed_rows(&f, &r, MICRO, MICRO);
  assert_int_equal(remat_accumulate(f.g, &st), REMAT_OK);
  assert_int_equal(remat_save_checkpoint(f.g, ck2, NULL, NULL, 0),
                   REMAT_ERR_STATE);
  snprintf(want, sizeof want,
           "remat_save_checkpoint: 2 micro-batch(es) summed by "
           "remat_accumulate wait for their update: a checkpoint does not "
           "hold gradient sums, so it could not resume exactly; save after "
           "remat_step");
  assert_string_equal(remat_last_error(), want);
  struct stat sb;
  assert_int_equal(stat(ck2, &sb), -1);
  /* Loading the checkpoint drops the two sums. */
  assert_int_equal(remat_load_checkpoint(f.g, ck, NULL, NULL, 0), REMAT_OK);
  feed_rows(&f, &r, 2 * MICRO, MICRO);
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_int_equal(st.accumulated, 1);
  feed_rows(&ref, &r, 2 * MICRO, MICRO);
  assert_int_equal(remat_step(ref.g, &st), REMAT_OK);
  /* So does loading weights alone (the moments stay). */
  feed_rows(&f, &r, 0, MICRO);
  assert_int_equal(remat_accumulate(f.g, &st), REMAT_OK);
  assert_int_equal(remat_load_safetensors(f.g, weights), REMAT_OK);
  assert_int_equal(remat_load_safetensors(ref.g, weights), REMAT_OK);
  feed_rows(&f, &r, MICRO, MICRO);
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_int_equal(st.accumulated, 1);
  feed_rows(&ref, &r, MICRO, MICRO);
  assert_int_equal(remat_step(ref.g, &st), REMAT_OK);
  size_t n, n2;
  float *got = fixture_snapshot(f.g, &n),
        *expect = fixture_snapshot(ref.g, &n2);
  assert_int_equal(n, n2);
  assert_memory_equal(got, expect, n * sizeof *got);
  /* After the update the checkpoint can be saved again. */
  assert_int_equal(remat_save_checkpoint(f.g, ck2, NULL, NULL, 0), REMAT_OK);
  free(got);
  free(expect);
  fixture_close(&f);
  fixture_close(&ref);
}

/* Under a memory budget the gradient sums count: an accumulation whose
 * sums would take the predicted peak over the budget fails before
 * allocating anything (it went 25.9 KB over a 400 KB budget unasked), and
 * the graph steps on as before; a plan that leaves room for the sums
 * accumulates within the budget. */
static void test_accumulate_budget(void **state) {
  (void)state;
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  remat_gpt_config cfg = config(MICRO);
  const int64_t budget = 400000;
  fixture f;
  assert_int_equal(fixture_open(&f, &cfg, 1, "auto", budget, &opt), REMAT_OK);
  remat_step_stats one = {.size = sizeof one}, st = {.size = sizeof st};
  assert_int_equal(remat_step(f.g, &one), REMAT_OK);
  int64_t peak = one.predicted_peak_bytes, sums = one.peak[REMAT_MEM_GRADS];
  assert_true(one.peak_bytes <= budget && peak <= budget);
  assert_true(peak + sums > budget); /* so the sums do not fit */
  size_t n;
  float *before = fixture_snapshot(f.g, &n);
  assert_int_equal(remat_accumulate(f.g, &st), REMAT_ERR_BUDGET);
  char want[400];
  snprintf(want, sizeof want,
           "remat_accumulate: the gradient sums (%lld bytes) would raise the "
           "predicted peak from %lld to %lld bytes, over the memory budget "
           "of %lld bytes: compile under a budget smaller by the sums, or "
           "raise it",
           (long long)sums, (long long)peak, (long long)(peak + sums),
           (long long)budget);
  assert_string_equal(remat_last_error(), want);
  float *after = fixture_snapshot(f.g, &n);
  assert_memory_equal(before, after, n * sizeof *before);
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_int_equal(st.accumulated, 1);
  assert_int_equal(st.current[REMAT_MEM_GRADS], one.current[REMAT_MEM_GRADS]);
  assert_true(st.peak_bytes <= budget);
  fixture_close(&f);
  /* A plan that leaves room for the sums accumulates within the budget. */
  const int64_t roomy = 2 * budget;
  assert_int_equal(fixture_open(&f, &cfg, 1, "nothing_saveable", roomy, &opt),
                   REMAT_OK);
  assert_int_equal(remat_accumulate(f.g, &st), REMAT_OK);
  assert_true(st.predicted_peak_bytes <= roomy && st.peak_bytes <= roomy);
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_int_equal(st.accumulated, 2);
  free(before);
  free(after);
  fixture_close(&f);
}

/* ---- clipping ---- */

/* A NaN gradient in the step that ends an accumulation, with clipping on:
 * nothing is updated (the parameters, AdamW's moments and step count), the
 * sums are kept, and the same micro-batch once the NaN is gone ends
 * bitwise where a run that never met it ends. */
static void test_clip_nan_final_step(void **state) {
  (void)state;
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  remat_gpt_config cfg = config(MICRO), big_cfg = config(K * MICRO);
  rows r;
  fixture_batch(&big_cfg, r.tokens, r.targets, 13);
  fixture clean, hit;
  assert_int_equal(fixture_open(&clean, &cfg, 2, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  assert_int_equal(fixture_open(&hit, &cfg, 2, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  fixture *both[2] = {&clean, &hit};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(remat_set_clip(both[i]->g, 0.25f), REMAT_OK);
    feed_rows(both[i], &r, 0, MICRO);
    assert_int_equal(remat_accumulate(both[i]->g, &st), REMAT_OK);
    feed_rows(both[i], &r, MICRO, MICRO);
  }
  assert_int_equal(remat_step(clean.g, &st), REMAT_OK);
  assert_true(st.grad_norm > 0.25); /* the clip acted */
  size_t n;
  float *before = fixture_snapshot(hit.g, &n);
  remat_tensor *w = remat_param_at(hit.g, 3);
  size_t wn = (size_t)remat_tensor_numel(w);
  float *saved = malloc(wn * sizeof *saved), *bad = malloc(wn * sizeof *bad);
  assert_int_equal(remat_read(hit.g, w, saved, wn * sizeof *saved), REMAT_OK);
  memcpy(bad, saved, wn * sizeof *bad);
  bad[wn - 1] = NAN;
  assert_int_equal(remat_write(hit.g, w, bad, wn * sizeof *bad), REMAT_OK);
  assert_int_equal(remat_step(hit.g, &st), REMAT_ERR_NUMERIC);
  assert_string_equal(remat_last_error(),
                      "remat_step: the loss or a gradient is NaN or Inf; the "
                      "updates were skipped");
  assert_int_equal(remat_write(hit.g, w, saved, wn * sizeof *saved), REMAT_OK);
  float *after = fixture_snapshot(hit.g, &n);
  assert_memory_equal(before, after, n * sizeof *before);
  assert_int_equal(remat_step(hit.g, &st), REMAT_OK);
  assert_int_equal(st.accumulated, 2);
  float *want = fixture_snapshot(clean.g, &n),
        *got = fixture_snapshot(hit.g, &n);
  assert_memory_equal(want, got, n * sizeof *want);
  /* The clip's own arguments. */
  assert_int_equal(remat_set_clip(hit.g, INFINITY), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_set_clip: needs a graph compiled with an "
                      "optimizer and a finite max_norm >= 0 (0: no "
                      "clipping), got inf");
  free(before);
  free(after);
  free(want);
  free(got);
  free(saved);
  free(bad);
  fixture_close(&clean);
  fixture_close(&hit);
}

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
  remat_step_stats st = {.size = sizeof st};
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
  remat_step_stats st = {.size = sizeof st};
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
      cmocka_unit_test(test_accumulate_and_checkpoints),
      cmocka_unit_test(test_clip_nan_final_step),
      cmocka_unit_test(test_accumulate_budget),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
