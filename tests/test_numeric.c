/* Tests of the values a step writes and the values and counters a file
 * brings (issue 29, classes 1 and 5): an SGD or AdamW update, or a
 * micro-step's gradient sum, that would overflow fails with
 * REMAT_ERR_NUMERIC and changes nothing, while one that only the exact dry
 * run can clear succeeds; loads refuse NaN, Inf and negative second
 * moments by tensor name; builders and compile refuse non-finite
 * attributes; and a checkpoint's step count is checked against the steps
 * that follow it (REMAT_MAX_STEPS). The model is w[1,4] . x[1,4] summed,
 * so the gradient of w is exactly the fed x. */
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "remat.h"
#include "tmpdir.h"

typedef struct model {
  remat_runtime *rt;
  remat_graph *g;
  remat_tensor *x, *w, *loss;
} model;

static void build(model *m) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  assert_int_equal(remat_runtime_create(&rc, &m->rt), REMAT_OK);
  assert_int_equal(remat_graph_create(m->rt, &m->g), REMAT_OK);
  int64_t d[2] = {1, 4};
  m->x = remat_input(m->g, "x", REMAT_F32, 2, d);
  m->w = remat_param(m->g, "w", 2, d, REMAT_INIT_ZEROS, 0.0f);
  m->loss = remat_sum(m->g, remat_linear(m->g, m->x, m->w, NULL));
  assert_non_null(m->loss);
}

static void open_model(model *m, remat_optimizer opt, const float w[4]) {
  build(m);
  assert_int_equal(remat_compile(m->g, m->loss, &opt), REMAT_OK);
  assert_int_equal(remat_write(m->g, m->w, w, 4 * sizeof *w), REMAT_OK);
}

static void close_model(model *m) {
  remat_graph_destroy(m->g);
  remat_runtime_destroy(m->rt);
}

static void feed(model *m, float x0) {
  float x[4] = {x0, 0.0f, 0.0f, 0.0f};
  assert_int_equal(remat_feed(m->g, m->x, x, sizeof x), REMAT_OK);
}

static void expect_w(model *m, const float want[4]) {
  float w[4];
  assert_int_equal(remat_read(m->g, m->w, w, sizeof w), REMAT_OK);
  assert_memory_equal(w, want, sizeof w);
}

static void expect_error(remat_status got, remat_status want,
                         const char *message) {
  assert_int_equal(got, want);
  assert_string_equal(remat_last_error(), message);
}

/* ---- updates that would overflow ---- */

static void test_sgd_overflow(void **state) {
  (void)state;
  model m;
  const float w0[4] = {1, 2, 3, 4};
  open_model(&m, (remat_optimizer){.kind = REMAT_OPT_SGD, .lr = 1e30f}, w0);
  feed(&m, 1e10f); /* lr * g = 1e40: w[0] would be -Inf */
  remat_step_stats st = {.size = sizeof st};
  expect_error(remat_step(m.g, &st), REMAT_ERR_NUMERIC,
               "remat_step: the update would make parameter 'w' NaN or Inf "
               "(learning rate 1e+30, gradient norm 1e+10); no parameter or "
               "moment was changed");
  assert_int_equal(st.nonfinite, 1);
  assert_true(isfinite(st.loss));
  expect_w(&m, w0);
  feed(&m, 1e-31f); /* lr * g = 0.1 */
  assert_int_equal(remat_step(m.g, &st), REMAT_OK);
  const float w1[4] = {1.0f - 1e30f * (1e-31f * 1.0f), 2, 3, 4};
  expect_w(&m, w1);
  close_model(&m);
}

/* Near the largest float a small step overflows: the bound must know the
 * weights, whether remat_write put them there (the scan before the step)
 * or an update did (the maxima the update records). */
static void test_sgd_overflow_near_max(void **state) {
  (void)state;
  model m;
  const float big[4] = {-3.4e38f, 0, 0, 0};
  open_model(&m, (remat_optimizer){.kind = REMAT_OPT_SGD, .lr = 1e37f}, big);
  feed(&m, 1.0f); /* -3.4e38 - 1e37 */
  expect_error(remat_step(m.g, NULL), REMAT_ERR_NUMERIC,
               "remat_step: the update would make parameter 'w' NaN or Inf "
               "(learning rate 1e+37, gradient norm 1); no parameter or "
               "moment was changed");
  expect_w(&m, big);
  close_model(&m);
  const float zero[4] = {0};
  open_model(&m, (remat_optimizer){.kind = REMAT_OPT_SGD, .lr = 1e37f}, zero);
  feed(&m, -34.0f); /* w = 3.4e38, finite */
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  const float w1[4] = {0.0f - 1e37f * (-34.0f * 1.0f), 0, 0, 0};
  assert_true(isfinite(w1[0]) && w1[0] > 3.3e38f);
  expect_w(&m, w1);
  feed(&m, -1.0f); /* 3.4e38 + 1e37 */
  expect_error(remat_step(m.g, NULL), REMAT_ERR_NUMERIC,
               "remat_step: the update would make parameter 'w' NaN or Inf "
               "(learning rate 1e+37, gradient norm 1); no parameter or "
               "moment was changed");
  expect_w(&m, w1);
  close_model(&m);
}

/* AdamW's step from zero moments at step t = 1 on gradient g: m = (1-b1) g,
 * v = (1-b2) g^2, w -= lr mhat / (sqrt(vhat) + eps), no decay. */
static float adamw_first(float w, float g, float lr, float eps) {
  float b1 = 0.9f, b2 = 0.999f;
  float m = b1 * 0.0f + (1.0f - b1) * g, v = b2 * 0.0f + (1.0f - b2) * g * g;
  float c1 = 1.0f / (1.0f - powf(b1, 1.0f)), c2 = 1.0f / (1.0f - powf(b2, 1.0f));
  float mhat = m * c1, vhat = v * c2;
  return w - lr * (mhat / (sqrtf(vhat) + eps) + 0.0f * w);
}

static void test_adamw_overflow(void **state) {
  (void)state;
  model m;
  const float zero[4] = {0};
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1.0f};
  open_model(&m, opt, zero);
  feed(&m, 1e30f); /* v = 1e-3 g^2 = Inf */
  expect_error(remat_step(m.g, NULL), REMAT_ERR_NUMERIC,
               "remat_step: the update would make parameter 'w' or its AdamW "
               "moments NaN or Inf (learning rate 1, gradient norm 1e+30); no "
               "parameter or moment was changed");
  expect_w(&m, zero);
  /* The moments and the step count are as they were: this is step 1. */
  feed(&m, 1.0f);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  const float w1[4] = {adamw_first(0.0f, 1.0f, 1.0f, 1e-8f), 0, 0, 0};
  expect_w(&m, w1);
  close_model(&m);

  /* The weight itself: -3e38 - 3e38 (mhat / sqrt(vhat) = 1). */
  const float big[4] = {-3e38f, 0, 0, 0};
  opt = (remat_optimizer){.kind = REMAT_OPT_ADAMW, .lr = 3e38f, .eps = 1e-30f};
  open_model(&m, opt, big);
  feed(&m, 1e-20f);
  expect_error(remat_step(m.g, NULL), REMAT_ERR_NUMERIC,
               "remat_step: the update would make parameter 'w' or its AdamW "
               "moments NaN or Inf (learning rate 3e+38, gradient norm "
               "1e-20); no parameter or moment was changed");
  expect_w(&m, big);
  close_model(&m);
}

/* The first moment that an update recorded is what bounds the next one:
 * with b2 = 0 the second moment forgets a gradient at once and the first
 * (b1 = 0.99) does not, so a zero gradient after a unit one moves w by
 * lr mhat / eps = 1e31 * 0.4975 / 1e-8, past FLT_MAX. */
static void test_adamw_overflow_from_moments(void **state) {
  (void)state;
  model m;
  const float zero[4] = {0};
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e31f, .beta1 = 0.99f,
                         .beta2 = 0.0f};
  open_model(&m, opt, zero);
  feed(&m, 1.0f);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  float w1[4];
  assert_int_equal(remat_read(m.g, m.w, w1, sizeof w1), REMAT_OK);
  assert_true(w1[0] < -9e30f && isfinite(w1[0]));
  feed(&m, 0.0f);
  expect_error(remat_step(m.g, NULL), REMAT_ERR_NUMERIC,
               "remat_step: the update would make parameter 'w' or its AdamW "
               "moments NaN or Inf (learning rate 1e+31, gradient norm 0); no "
               "parameter or moment was changed");
  expect_w(&m, w1);
  close_model(&m);
}

/* A bound of lr mhat / eps = 1e40 cannot clear the update, the dry run
 * does: w moves by lr mhat / (sqrt(vhat) + eps) = 1e10. */
static void test_adamw_bound_too_coarse(void **state) {
  (void)state;
  model m;
  const float zero[4] = {0};
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e10f, .eps = 1e-30f};
  open_model(&m, opt, zero);
  feed(&m, 1.0f);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  const float w1[4] = {adamw_first(0.0f, 1.0f, 1e10f, 1e-30f), 0, 0, 0};
  assert_true(w1[0] < -9e9f);
  expect_w(&m, w1);
  close_model(&m);
}

static void test_accumulate_overflow(void **state) {
  (void)state;
  model m;
  const float zero[4] = {0};
  open_model(&m, (remat_optimizer){.kind = REMAT_OPT_SGD, .lr = 1.0f}, zero);
  feed(&m, 3e38f);
  assert_int_equal(remat_accumulate(m.g, NULL), REMAT_OK);
  expect_error(remat_accumulate(m.g, NULL), REMAT_ERR_NUMERIC,
               "remat_accumulate: adding this micro-step's gradient of 'w' "
               "to the sum of the earlier ones would overflow to Inf; no sum "
               "was changed");
  /* One micro-step summed, holding 3e38: the mean with 0 is 1.5e38. */
  feed(&m, 0.0f);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  float grad[4];
  assert_int_equal(remat_read_grad(m.g, m.w, grad, sizeof grad), REMAT_OK);
  assert_true(grad[0] == (3e38f + 0.0f) * (1.0f / 2.0f));
  const float w1[4] = {0.0f - 1.0f * grad[0], 0, 0, 0};
  expect_w(&m, w1);
  close_model(&m);
}

/* ---- values that files bring ---- */

static char *path_in_dir(const char *name) {
  static char buf[8][160];
  static int next;
  char *p = buf[next++ % 8];
  snprintf(p, 160, "%s/%s", dir, name);
  return p;
}

static unsigned char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc(*len + 1);
  assert_int_equal(fread(buf, 1, *len, f), *len);
  fclose(f);
  return buf;
}

static void write_all(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  fclose(f);
}

static uint64_t header_len(const unsigned char *buf) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--)
    n = n << 8 | buf[i];
  return n;
}

/* A copy of safetensors file src with element `elem` of tensor `name` set
 * to v. */
static void patch_value(const char *src, const char *dst, const char *name,
                        int elem, float v) {
  size_t n;
  unsigned char *buf = read_all(src, &n);
  uint64_t hlen = header_len(buf);
  char *header = malloc(hlen + 1), key[80];
  memcpy(header, buf + 8, hlen);
  header[hlen] = '\0';
  snprintf(key, sizeof key, "\"%s\":", name);
  char *at = strstr(header, key);
  assert_non_null(at);
  at = strstr(at, "\"data_offsets\":[");
  assert_non_null(at);
  unsigned long long begin = 0;
  assert_int_equal(sscanf(at, "\"data_offsets\":[%llu", &begin), 1);
  memcpy(buf + 8 + hlen + begin + (size_t)elem * sizeof v, &v, sizeof v);
  write_all(dst, buf, n);
  free(header);
  free(buf);
}

static const char *const keys[] = {"pos"};

/* Loading `path` fails with `status` and a message that ends in `tail`;
 * the weights and the caller's value are as they were. */
static void expect_load_refused(model *m, const char *path, bool checkpoint,
                                remat_status status, const char *tail) {
  float before[4], after[4];
  assert_int_equal(remat_read(m->g, m->w, before, sizeof before), REMAT_OK);
  uint64_t value = 77;
  remat_status s = checkpoint
                       ? remat_load_checkpoint(m->g, path, keys, &value, 1)
                       : remat_load_safetensors(m->g, path);
  assert_int_equal(s, status);
  const char *msg = remat_last_error();
  assert_true(strlen(msg) >= strlen(tail));
  assert_string_equal(msg + strlen(msg) - strlen(tail), tail);
  assert_int_equal(value, 77);
  assert_int_equal(remat_read(m->g, m->w, after, sizeof after), REMAT_OK);
  assert_memory_equal(before, after, sizeof before);
}

static void test_load_nonfinite(void **state) {
  (void)state;
  model m;
  const float w0[4] = {1, 2, 3, 4};
  open_model(&m, (remat_optimizer){.kind = REMAT_OPT_ADAMW, .lr = 0.01f}, w0);
  feed(&m, 1.0f);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  const char *good = path_in_dir("good.ckpt"), *bad = path_in_dir("bad.ckpt");
  uint64_t pos = 5;
  assert_int_equal(remat_save_checkpoint(m.g, good, keys, &pos, 1), REMAT_OK);
  const float other[4] = {9, 9, 9, 9};
  assert_int_equal(remat_write(m.g, m.w, other, sizeof other), REMAT_OK);
  patch_value(good, bad, "adam_v:w", 1, -1.0f);
  expect_load_refused(&m, bad, true, REMAT_ERR_IO,
                      "tensor 'adam_v:w' holds -1 at element 1: a second "
                      "moment must be finite and >= 0");
  patch_value(good, bad, "adam_m:w", 2, NAN);
  expect_load_refused(&m, bad, true, REMAT_ERR_IO,
                      "tensor 'adam_m:w' holds nan at element 2: every value "
                      "must be finite");
  patch_value(good, bad, "w", 3, -INFINITY);
  expect_load_refused(&m, bad, true, REMAT_ERR_IO,
                      "tensor 'w' holds -inf at element 3: every value must "
                      "be finite");
  expect_load_refused(&m, bad, false, REMAT_ERR_IO,
                      "tensor 'w' holds -inf at element 3: every value must "
                      "be finite");
  /* The good file loads, and a negative first moment is fine. */
  patch_value(good, bad, "adam_m:w", 0, -2.0f);
  uint64_t value = 0;
  assert_int_equal(remat_load_checkpoint(m.g, bad, keys, &value, 1), REMAT_OK);
  assert_int_equal(value, 5);
  expect_w(&m, (const float[4]){1.0f - 0.01f * (1.0f / (1.0f + 1e-8f)), 2, 3, 4});
  close_model(&m);
}

/* ---- attributes that are not finite ---- */

static void test_builders_refuse_nonfinite(void **state) {
  (void)state;
  const float scales[] = {NAN, INFINITY, -INFINITY, 1e31f};
  const char *shown[] = {"nan", "inf", "-inf", "1e+31"};
  for (int i = 0; i < 4; i++) {
    model m;
    build(&m);
    int64_t d[1] = {4};
    assert_null(remat_param(m.g, "v", 1, d, REMAT_INIT_NORMAL, scales[i]));
    char want[256];
    snprintf(want, sizeof want, "param 'v': scale %s is not valid: expected "
             "a finite scale of at most 1e+30 in magnitude (a normal init "
             "draws values of up to 9 scales)", shown[i]);
    assert_int_equal(remat_graph_status(m.g), REMAT_ERR_INVALID_ARG);
    assert_string_equal(remat_graph_error(m.g), want);
    close_model(&m);
  }
  const float eps[] = {NAN, INFINITY};
  for (int i = 0; i < 2; i++) {
    model m;
    build(&m);
    int64_t d[1] = {4};
    remat_tensor *gamma = remat_param(m.g, "g", 1, d, REMAT_INIT_ONES, 0.0f);
    remat_tensor *beta = remat_param(m.g, "b", 1, d, REMAT_INIT_ZEROS, 0.0f);
    assert_null(remat_layernorm(m.g, m.x, gamma, beta, eps[i]));
    char want[256];
    snprintf(want, sizeof want, "layernorm: eps %s is not valid: expected a "
             "finite eps (> 0, or <= 0 for 1e-5)", shown[i]);
    assert_string_equal(remat_graph_error(m.g), want);
    close_model(&m);
  }
  model m;
  build(&m);
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 0.1f, .eps = INFINITY};
  assert_int_equal(remat_compile(m.g, m.loss, &opt), REMAT_ERR_INVALID_ARG);
  close_model(&m);
}

/* ---- counters that files bring ---- */

/* A copy of src whose header has `from` replaced by `to` (of any length). */
static void patch_header(const char *src, const char *dst, const char *from,
                         const char *to) {
  size_t n;
  unsigned char *buf = read_all(src, &n);
  uint64_t hlen = header_len(buf);
  char *header = malloc(hlen + 1);
  memcpy(header, buf + 8, hlen);
  header[hlen] = '\0';
  char *at = strstr(header, from);
  assert_non_null(at);
  size_t nlen = hlen - strlen(from) + strlen(to);
  unsigned char *out = malloc(8 + nlen + (n - 8 - hlen));
  for (int i = 0; i < 8; i++)
    out[i] = (unsigned char)((uint64_t)nlen >> (8 * i));
  size_t pre = (size_t)(at - header);
  memcpy(out + 8, header, pre);
  memcpy(out + 8 + pre, to, strlen(to));
  memcpy(out + 8 + pre + strlen(to), at + strlen(from), hlen - pre - strlen(from));
  memcpy(out + 8 + nlen, buf + 8 + hlen, n - 8 - hlen);
  write_all(dst, out, 8 + nlen + (n - 8 - hlen));
  free(out);
  free(header);
  free(buf);
}

static void test_step_counter(void **state) {
  (void)state;
  model m;
  const float w0[4] = {1, 2, 3, 4};
  open_model(&m, (remat_optimizer){.kind = REMAT_OPT_SGD, .lr = 0.5f}, w0);
  feed(&m, 1.0f);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  const char *one = path_in_dir("one.ckpt"), *bad = path_in_dir("big.ckpt");
  const char *last = path_in_dir("last.ckpt"), *at = path_in_dir("at.ckpt");
  uint64_t pos = 1;
  assert_int_equal(remat_save_checkpoint(m.g, one, keys, &pos, 1), REMAT_OK);
  patch_header(one, bad, "\"remat.step\":\"1\"",
               "\"remat.step\":\"9223372036854775807\"");
  char want[512];
  snprintf(want, sizeof want, "remat_load_checkpoint: '%s': 'remat.step' is "
           "9223372036854775807, more than REMAT_MAX_STEPS (2^53), the most "
           "updates a graph counts", bad);
  expect_load_refused(&m, bad, true, REMAT_ERR_IO, want);
  patch_header(one, bad, "\"remat.step\":\"1\"",
               "\"remat.step\":\"9007199254740993\"");
  assert_int_equal(remat_load_checkpoint(m.g, bad, keys, &pos, 1),
                   REMAT_ERR_IO);
  /* 2^53 - 1: one more step, whose checkpoint loads; then no more. */
  patch_header(one, last, "\"remat.step\":\"1\"",
               "\"remat.step\":\"9007199254740991\"");
  assert_int_equal(remat_load_checkpoint(m.g, last, keys, &pos, 1), REMAT_OK);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  assert_int_equal(remat_save_checkpoint(m.g, at, keys, &pos, 1), REMAT_OK);
  size_t n;
  unsigned char *buf = read_all(at, &n);
  assert_non_null(memmem(buf, n, "\"remat.step\":\"9007199254740992\"", 31));
  free(buf);
  assert_int_equal(remat_load_checkpoint(m.g, at, keys, &pos, 1), REMAT_OK);
  float w[4];
  assert_int_equal(remat_read(m.g, m.w, w, sizeof w), REMAT_OK);
  expect_error(remat_step(m.g, NULL), REMAT_ERR_LIMIT,
               "remat_step: the graph has counted 9007199254740992 updates, "
               "the most it counts (REMAT_MAX_STEPS, 2^53)");
  expect_w(&m, w);
  close_model(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_overflow),
      cmocka_unit_test(test_sgd_overflow_near_max),
      cmocka_unit_test(test_adamw_overflow),
      cmocka_unit_test(test_adamw_overflow_from_moments),
      cmocka_unit_test(test_adamw_bound_too_coarse),
      cmocka_unit_test(test_accumulate_overflow),
      cmocka_unit_test(test_load_nonfinite),
      cmocka_unit_test(test_builders_refuse_nonfinite),
      cmocka_unit_test(test_step_counter),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
