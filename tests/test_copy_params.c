/* Tests of remat_copy_params: a training graph's weights reach an
 * inference graph built alike (bitwise, and its forward then computes what
 * the same weights written one by one give); a graph whose parameters
 * differ in name, shape or number is refused naming the first that differs
 * and gets nothing; graphs not compiled, the same graph twice, and a graph
 * that another thread is inside are refused and left as they were. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/internal.h"

enum { ROWS = 4, IN = 6, HIDDEN = 8, CLASSES = 3 };

typedef struct mlp {
  remat_graph *g;
  remat_tensor *x, *t, *logits, *loss;
} mlp;

static remat_runtime *rt;

/* x[ROWS,IN] -> linear(w1, b1) -> relu -> linear(w2) -> cross entropy;
 * `hidden` and `extra` make graphs that differ from the usual one. A
 * training graph has SGD; the other is compiled for inference (no loss,
 * the logits kept). */
static mlp build(uint64_t seed, int64_t hidden, bool extra, bool compile,
                 bool train) {
  mlp m;
  assert_int_equal(remat_graph_create(rt, &m.g), REMAT_OK);
  assert_int_equal(remat_graph_seed(m.g, seed), REMAT_OK);
  const int64_t xd[] = {ROWS, IN}, td[] = {ROWS}, w1d[] = {hidden, IN},
                b1d[] = {hidden}, w2d[] = {CLASSES, hidden}, ed[] = {2};
  m.x = remat_input(m.g, "x", REMAT_F32, 2, xd);
  m.t = remat_input(m.g, "t", REMAT_I32, 1, td);
  remat_tensor *w1 = remat_param(m.g, "w1", 2, w1d, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *b1 = remat_param(m.g, "b1", 1, b1d, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *w2 = remat_param(m.g, "w2", 2, w2d, REMAT_INIT_NORMAL, 0.5f);
  if (extra)
    assert_non_null(remat_param(m.g, "extra", 1, ed, REMAT_INIT_ONES, 0.f));
  remat_tensor *h = remat_relu(m.g, remat_linear(m.g, m.x, w1, b1));
  m.logits = remat_linear(m.g, h, w2, NULL);
  m.loss = remat_cross_entropy(m.g, m.logits, m.t);
  assert_non_null(m.loss);
  remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.5f};
  if (!train)
    assert_int_equal(remat_keep(m.g, m.logits), REMAT_OK);
  if (compile)
    assert_int_equal(remat_compile(m.g, train ? m.loss : NULL,
                                   train ? &opt : NULL),
                     REMAT_OK);
  return m;
}

static void feed(const mlp *m, int batch) {
  float x[ROWS * IN];
  int32_t t[ROWS];
  for (int i = 0; i < ROWS * IN; i++)
    x[i] = (float)((i * 5 + batch * 3) % 11) / 11.0f - 0.5f;
  for (int i = 0; i < ROWS; i++)
    t[i] = (i + batch) % CLASSES;
  assert_int_equal(remat_feed(m->g, m->x, x, sizeof x), REMAT_OK);
  assert_int_equal(remat_feed(m->g, m->t, t, sizeof t), REMAT_OK);
}

/* Every parameter of g, concatenated, into out (at most cap floats). */
static int64_t params_of(remat_graph *g, float *out, int64_t cap) {
  int64_t at = 0;
  for (int i = 0; i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    int64_t n = remat_tensor_numel(p);
    assert_true(at + n <= cap);
    assert_int_equal(remat_read(g, p, out + at, (size_t)n * 4), REMAT_OK);
    at += n;
  }
  return at;
}

static void forward_logits(const mlp *m, float out[ROWS * CLASSES]) {
  feed(m, 7);
  assert_int_equal(remat_forward(m->g, NULL), REMAT_OK);
  assert_int_equal(remat_read(m->g, m->logits, out, ROWS * CLASSES * 4),
                   REMAT_OK);
}

enum { CAP = 256 };

static void test_copies_trained_weights(void **state) {
  (void)state;
  mlp train = build(1, HIDDEN, false, true, true);
  for (int step = 0; step < 3; step++) {
    feed(&train, step);
    assert_int_equal(remat_step(train.g, NULL), REMAT_OK);
  }
  /* A server that has been serving other weights (its initial ones). */
  mlp serve = build(2, HIDDEN, false, true, false);
  float old[ROWS * CLASSES];
  forward_logits(&serve, old);
  float want[CAP], got[CAP];
  int64_t n = params_of(train.g, want, CAP);
  params_of(serve.g, got, CAP);
  assert_true(memcmp(want, got, (size_t)n * 4) != 0);
  assert_int_equal(remat_copy_params(serve.g, train.g), REMAT_OK);
  assert_int_equal(params_of(serve.g, got, CAP), n);
  assert_memory_equal(want, got, (size_t)n * 4);
  /* Its forward: that of a graph given the same weights by remat_write. */
  mlp by_write = build(3, HIDDEN, false, true, false);
  int64_t at = 0;
  for (int i = 0; i < remat_num_params(by_write.g); i++) {
    remat_tensor *p = remat_param_at(by_write.g, i);
    int64_t k = remat_tensor_numel(p);
    assert_int_equal(remat_write(by_write.g, p, want + at, (size_t)k * 4),
                     REMAT_OK);
    at += k;
  }
  float copied[ROWS * CLASSES], written[ROWS * CLASSES];
  forward_logits(&serve, copied);
  forward_logits(&by_write, written);
  assert_memory_equal(copied, written, sizeof copied);
  assert_memory_not_equal(copied, old, sizeof copied);
  /* The source is unchanged and still trains. */
  params_of(train.g, got, CAP);
  assert_memory_equal(want, got, (size_t)n * 4);
  feed(&train, 4);
  assert_int_equal(remat_step(train.g, NULL), REMAT_OK);
  remat_graph_destroy(by_write.g);
  remat_graph_destroy(serve.g);
  remat_graph_destroy(train.g);
}

/* dst's call fails with `status` and `message`, and its parameters are
 * what they were. */
static void expect_refused(remat_graph *dst, remat_graph *src,
                           remat_status status, const char *message) {
  float before[CAP], after[CAP];
  bool readable = dst != NULL && dst->compiled && atomic_load(&dst->busy) == 0;
  int64_t n = readable ? params_of(dst, before, CAP) : 0;
  assert_int_equal(remat_copy_params(dst, src), status);
  assert_string_equal(remat_last_error(), message);
  if (n > 0) {
    assert_int_equal(params_of(dst, after, CAP), n);
    assert_memory_equal(before, after, (size_t)n * 4);
  }
}

static void test_refuses_other_parameters(void **state) {
  (void)state;
  mlp src = build(1, HIDDEN, false, true, true);
  mlp wider = build(2, HIDDEN + 1, false, true, false);
  expect_refused(wider.g, src.g, REMAT_ERR_SHAPE,
                 "remat_copy_params: dst has parameter 0 'w1' f32 [9, 6], "
                 "src has parameter 0 'w1' f32 [8, 6] (dst 3 parameters, src "
                 "3): the graphs must have the same parameters (names, "
                 "dtypes and shapes) in the same order; nothing was copied");
  mlp more = build(2, HIDDEN, true, true, false);
  expect_refused(more.g, src.g, REMAT_ERR_SHAPE,
                 "remat_copy_params: dst has parameter 3 'extra' f32 [2], "
                 "src has no parameter 3 (dst 4 parameters, src 3): the "
                 "graphs must have the same parameters (names, dtypes and "
                 "shapes) in the same order; nothing was copied");
  expect_refused(src.g, more.g, REMAT_ERR_SHAPE,
                 "remat_copy_params: dst has no parameter 3, src has "
                 "parameter 3 'extra' f32 [2] (dst 3 parameters, src 4): the "
                 "graphs must have the same parameters (names, dtypes and "
                 "shapes) in the same order; nothing was copied");
  remat_graph_destroy(more.g);
  remat_graph_destroy(wider.g);
  remat_graph_destroy(src.g);
}

static void test_refuses_misuse(void **state) {
  (void)state;
  mlp src = build(1, HIDDEN, false, true, true);
  mlp dst = build(2, HIDDEN, false, true, false);
  mlp raw = build(3, HIDDEN, false, false, false);
  expect_refused(NULL, src.g, REMAT_ERR_INVALID_ARG,
                 "remat_copy_params: dst is NULL");
  expect_refused(dst.g, NULL, REMAT_ERR_INVALID_ARG,
                 "remat_copy_params: src is NULL");
  expect_refused(dst.g, dst.g, REMAT_ERR_INVALID_ARG,
                 "remat_copy_params: dst and src are the same graph");
  expect_refused(dst.g, raw.g, REMAT_ERR_STATE,
                 "remat_copy_params: src is not compiled: call "
                 "remat_compile on both graphs first");
  /* Another thread inside src (a step): refused, dst unchanged and free. */
  atomic_store(&src.g->busy, 1);
  assert_int_equal(remat_copy_params(dst.g, src.g), REMAT_ERR_STATE);
  assert_string_equal(remat_graph_error(dst.g), remat_last_error());
  expect_refused(dst.g, src.g, REMAT_ERR_STATE,
                 "remat_copy_params: another thread is using this graph: a "
                 "graph takes one call at a time (use one graph per thread, "
                 "or serialize the calls)");
  atomic_store(&src.g->busy, 0);
  float before[CAP], after[CAP];
  int64_t n = params_of(dst.g, before, CAP);
  atomic_store(&dst.g->busy, 1);
  expect_refused(dst.g, src.g, REMAT_ERR_STATE,
                 "remat_copy_params: another thread is using this graph: a "
                 "graph takes one call at a time (use one graph per thread, "
                 "or serialize the calls)");
  atomic_store(&dst.g->busy, 0);
  params_of(dst.g, after, CAP);
  assert_memory_equal(before, after, (size_t)n * 4);
  assert_int_equal(remat_copy_params(dst.g, src.g), REMAT_OK);
  assert_string_equal(remat_graph_error(dst.g), "");
  feed(&src, 0);
  assert_int_equal(remat_step(src.g, NULL), REMAT_OK); /* src left free */
  remat_graph_destroy(raw.g);
  remat_graph_destroy(dst.g);
  remat_graph_destroy(src.g);
}

int main(void) {
  remat_config cfg = {.set = REMAT_SET_NUM_THREADS, .num_threads = 2};
  if (remat_runtime_create(&cfg, &rt) != REMAT_OK) {
    fprintf(stderr, "%s\n", remat_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_copies_trained_weights),
      cmocka_unit_test(test_refuses_other_parameters),
      cmocka_unit_test(test_refuses_misuse),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  remat_runtime_destroy(rt);
  return failed;
}
