/* Tests of the whole training step on a tiny GPT: gradients against finite
 * differences, bitwise identical results at 1, 2 and 4 threads, the loss
 * going down on a fixed task, and the errors of graph building and misuse. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gpt_fixture.h"

static const remat_gpt_config tiny = {
    .layers = 2, .d_model = 16, .heads = 2, .seq = 8, .batch = 2, .vocab = 7};

static float step_loss(fixture *f) {
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(f->g, &st), REMAT_OK);
  return st.loss;
}

/* Central differences of the loss for a few elements of every parameter. */
static void test_model_gradcheck(void **state) {
  (void)state;
  fixture f;
  assert_int_equal(fixture_open(&f, &tiny, 2, "everything_saveable", 0, NULL),
                   REMAT_OK);
  step_loss(&f);
  const float eps = 4e-3f;
  double err_sum = 0.0, grad_sum = 0.0;
  int checked = 0;
  for (int i = 0; i < remat_num_params(f.g); i++) {
    remat_tensor *p = remat_param_at(f.g, i);
    size_t n = (size_t)remat_tensor_numel(p), bytes = n * sizeof(float);
    float *w = malloc(bytes), *grad = malloc(bytes);
    assert_non_null(w);
    assert_non_null(grad);
    assert_int_equal(remat_read(f.g, p, w, bytes), REMAT_OK);
    assert_int_equal(remat_read_grad(f.g, p, grad, bytes), REMAT_OK);
    for (size_t k = 0; k < 3 && k < n; k++) {
      size_t e = (k * 7919 + (size_t)i * 31) % n;
      float orig = w[e];
      w[e] = orig + eps;
      assert_int_equal(remat_write(f.g, p, w, bytes), REMAT_OK);
      double up = step_loss(&f);
      w[e] = orig - eps;
      assert_int_equal(remat_write(f.g, p, w, bytes), REMAT_OK);
      double down = step_loss(&f);
      w[e] = orig;
      assert_int_equal(remat_write(f.g, p, w, bytes), REMAT_OK);
      double fd = (up - down) / (2.0 * eps);
      double diff = fabs(fd - grad[e]);
      if (diff > 2e-3 + 0.05 * fabs(grad[e]))
        fail_msg("param %s[%zu]: finite difference %.6g, gradient %.6g",
                 remat_tensor_name(p), e, fd, grad[e]);
      err_sum += diff;
      grad_sum += fabs(grad[e]);
      checked++;
    }
    free(w);
    free(grad);
  }
  assert_true(checked > 60);
  assert_true(err_sum / grad_sum < 0.02);
  fixture_close(&f);
}

typedef struct run_result {
  uint32_t loss_bits[2];
  uint64_t grad_hash;
} run_result;

static run_result two_steps(int threads, const char *policy) {
  fixture f;
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-3f,
                         .weight_decay = 0.01f};
  assert_int_equal(fixture_open(&f, &tiny, threads, policy, 0, &opt), REMAT_OK);
  run_result r;
  for (int s = 0; s < 2; s++) {
    float loss = step_loss(&f);
    memcpy(&r.loss_bits[s], &loss, sizeof loss);
    if (s == 0)
      r.grad_hash = fixture_grad_hash(&f);
  }
  fixture_close(&f);
  return r;
}

static void test_threads_bitwise(void **state) {
  (void)state;
  run_result one = two_steps(1, "everything_saveable");
  assert_true(one.grad_hash != 0);
  for (int threads = 2; threads <= 4; threads += 2) {
    run_result r = two_steps(threads, "everything_saveable");
    assert_int_equal(r.loss_bits[0], one.loss_bits[0]);
    assert_int_equal(r.loss_bits[1], one.loss_bits[1]);
    assert_true(r.grad_hash == one.grad_hash);
  }
}

static void test_training_lowers_loss(void **state) {
  (void)state;
  remat_gpt_config c = {.layers = 2, .d_model = 32, .heads = 4, .seq = 16,
                        .batch = 8, .vocab = 11};
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  fixture f;
  assert_int_equal(fixture_open(&f, &c, 2, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  float first = step_loss(&f), last = first;
  for (int s = 1; s < 80; s++)
    last = step_loss(&f);
  /* ln(11) = 2.40 at the start; the task is learnable from the inputs. */
  assert_true(first > 2.2f && first < 2.6f);
  if (!(last < 0.5f * first))
    fail_msg("loss went from %.4f to %.4f in 80 steps", first, last);
  fixture_close(&f);
}

/* w <- w - lr * grad for every element of a parameter (ln1.gamma of the
 * first block), whose gradient is non-zero: a gradient that never arrives
 * and an update that never happens would agree with each other. */
static void test_sgd_step_matches_gradient(void **state) {
  (void)state;
  remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.5f};
  fixture f;
  assert_int_equal(fixture_open(&f, &tiny, 2, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  remat_tensor *p = remat_param_at(f.g, 2);
  size_t n = (size_t)remat_tensor_numel(p), bytes = n * sizeof(float);
  float *before = malloc(bytes), *grad = malloc(bytes), *after = malloc(bytes);
  assert_int_equal(remat_read(f.g, p, before, bytes), REMAT_OK);
  step_loss(&f);
  assert_int_equal(remat_read_grad(f.g, p, grad, bytes), REMAT_OK);
  assert_int_equal(remat_read(f.g, p, after, bytes), REMAT_OK);
  assert_string_equal(remat_tensor_name(p), "h0.ln1.gamma");
  size_t moved = 0;
  for (size_t i = 0; i < n; i++) {
    assert_float_equal(after[i], before[i] - 0.5f * grad[i], 1e-6);
    moved += grad[i] != 0.0f && after[i] != before[i];
  }
  if (moved != n)
    fail_msg("%zu of %zu elements have a gradient and moved", moved, n);
  free(before);
  free(grad);
  free(after);
  fixture_close(&f);
}

/* ---- errors ---- */

static remat_graph *new_graph(remat_runtime **rt) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  assert_int_equal(remat_runtime_create(&rc, rt), REMAT_OK);
  remat_graph *g = NULL;
  assert_int_equal(remat_graph_create(*rt, &g), REMAT_OK);
  return g;
}

static remat_tensor *param2(remat_graph *g, const char *name, int64_t a,
                            int64_t b) {
  int64_t d[2] = {a, b};
  return remat_param(g, name, b ? 2 : 1, d, REMAT_INIT_ONES, 0.0f);
}

static remat_tensor *input3(remat_graph *g, const char *name, remat_dtype dt,
                            int64_t a, int64_t b, int64_t c) {
  int64_t d[3] = {a, b, c};
  return remat_input(g, name, dt, c ? 3 : 2, d);
}

typedef remat_tensor *(*build_fn)(remat_graph *g);

static void expect_build_error(build_fn build, const char *message) {
  remat_runtime *rt;
  remat_graph *g = new_graph(&rt);
  assert_null(build(g));
  assert_int_equal(remat_graph_status(g), REMAT_ERR_SHAPE);
  assert_string_equal(remat_graph_error(g), message);
  assert_string_equal(remat_last_error(), message);
  /* Sticky: later calls do nothing, compile returns the first error. */
  assert_null(remat_relu(g, input3(g, "later", REMAT_F32, 2, 3, 0)));
  assert_string_equal(remat_graph_error(g), message);
  assert_int_equal(remat_compile(g, NULL, NULL), REMAT_ERR_SHAPE);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

static remat_tensor *bad_linear(remat_graph *g) {
  return remat_linear(g, input3(g, "x", REMAT_F32, 2, 3, 64),
                      param2(g, "w", 32, 48), NULL);
}
static remat_tensor *bad_matmul(remat_graph *g) {
  return remat_matmul(g, input3(g, "a", REMAT_F32, 4, 5, 0),
                      input3(g, "b", REMAT_F32, 6, 7, 0));
}
static remat_tensor *bad_add(remat_graph *g) {
  return remat_add(g, input3(g, "a", REMAT_F32, 2, 3, 4),
                   input3(g, "b", REMAT_F32, 2, 4, 3));
}
static remat_tensor *bad_bias(remat_graph *g) {
  return remat_bias_add(g, input3(g, "x", REMAT_F32, 2, 3, 0),
                        param2(g, "b", 4, 0));
}
static remat_tensor *bad_layernorm(remat_graph *g) {
  return remat_layernorm(g, input3(g, "x", REMAT_F32, 2, 3, 8),
                         param2(g, "gamma", 6, 0), param2(g, "beta", 8, 0),
                         0.0f);
}
static remat_tensor *bad_heads(remat_graph *g) {
  return remat_attention_scores(g, input3(g, "qkv", REMAT_F32, 2, 4, 30), 4);
}
static remat_tensor *bad_embed(remat_graph *g) {
  return remat_embed(g, input3(g, "tokens", REMAT_I32, 2, 9, 0),
                     param2(g, "wte", 10, 8), param2(g, "wpe", 8, 8));
}
static remat_tensor *bad_targets(remat_graph *g) {
  return remat_cross_entropy(g, input3(g, "logits", REMAT_F32, 2, 4, 10),
                             input3(g, "targets", REMAT_I32, 2, 5, 0));
}
static remat_tensor *bad_dtype(remat_graph *g) {
  return remat_relu(g, input3(g, "tokens", REMAT_I32, 2, 4, 0));
}

static void test_builder_errors(void **state) {
  (void)state;
  expect_build_error(bad_linear,
                     "linear: x [2,3,64] and w [32,48]: last dim of x (64) "
                     "must equal dim 1 of w (48)");
  expect_build_error(bad_matmul, "matmul: a [4,5] and b [6,7]: last dim of a "
                                 "(5) must equal dim 0 of b (6)");
  expect_build_error(bad_add, "add: a [2,3,4] and b [2,4,3]: shapes must be "
                              "equal");
  expect_build_error(bad_bias, "bias_add: x [2,3] and b [4]: b must be [3] "
                               "(last dim of x)");
  expect_build_error(bad_layernorm,
                     "layernorm: x [2,3,8] and gamma [6]: gamma must be [8] "
                     "(last dim of x)");
  expect_build_error(bad_heads,
                     "attn_scores: qkv [2,4,30] with 4 heads: D (10) must be "
                     "divisible by the number of heads");
  expect_build_error(bad_embed, "embed: tokens [2,9] and wpe [8,8]: T (9) "
                                "must be at most Tmax (8)");
  expect_build_error(bad_targets,
                     "cross_entropy: logits [2,4,10] and targets [2,5]: "
                     "targets must be [2,4] (the leading dims of logits)");
  expect_build_error(bad_dtype, "relu: x [2,4] must be f32, not int32");
}

static void test_misuse(void **state) {
  (void)state;
  remat_runtime *rt;
  remat_graph *g = new_graph(&rt), *other = NULL;
  assert_int_equal(remat_graph_create(rt, &other), REMAT_OK);
  remat_tensor *x = input3(g, "x", REMAT_F32, 2, 4, 0);
  remat_tensor *y = input3(other, "y", REMAT_F32, 2, 4, 0);
  remat_tensor *loss = remat_sum(g, remat_relu(g, x));
  assert_int_equal(remat_step(g, NULL), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_step: the graph is not compiled: call "
                      "remat_compile first");
  assert_null(remat_add(other, y, x));
  assert_string_equal(remat_graph_error(other),
                      "add: tensor 'x' belongs to another graph");
  assert_int_equal(remat_compile(g, loss, NULL), REMAT_OK);
  assert_int_equal(remat_compile(g, loss, NULL), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_compile: the graph is already compiled");
  float data[8] = {1, -2, 3, -4, 5, -6, 7, -8};
  assert_int_equal(remat_feed(g, x, data, 4 * sizeof(float)), REMAT_ERR_SHAPE);
  assert_string_equal(remat_last_error(),
                      "remat_feed: tensor 'x' holds 32 bytes, 16 given");
  assert_int_equal(remat_feed(g, x, data, sizeof data), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(g, &st), REMAT_OK);
  assert_float_equal(st.loss, 16.0f, 0.0f);
  assert_int_equal(remat_forward(g, NULL), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_forward: the graph was compiled for training: "
                      "compile a graph with loss NULL for inference");
  data[0] = INFINITY;
  assert_int_equal(remat_feed(g, x, data, sizeof data), REMAT_OK);
  assert_int_equal(remat_step(g, &st), REMAT_ERR_NUMERIC);
  assert_string_equal(remat_last_error(),
                      "remat_step: the loss or a gradient is NaN or Inf; the "
                      "updates were skipped");
  assert_int_equal(st.nonfinite, 1);
  remat_graph_destroy(other);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_model_gradcheck),
      cmocka_unit_test(test_threads_bitwise),
      cmocka_unit_test(test_training_lowers_loss),
      cmocka_unit_test(test_sgd_step_matches_gradient),
      cmocka_unit_test(test_builder_errors),
      cmocka_unit_test(test_misuse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
