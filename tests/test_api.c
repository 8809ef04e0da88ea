/* Tests of the public API's contract with a host program: every misuse
 * (NULL handles, a tensor of another graph, calls at the wrong time, feeds
 * of the wrong size, reads of what was not kept, bad policy arguments)
 * returns a clear status and message; NaN or Inf in the loss is reported
 * and leaves the parameters alone; several runtimes and graphs live at
 * once; destroying NULL is a no-op. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpt_fixture.h"
#include "runtime/exec/step_stats.h"

/* Asserts a call's status and the calling thread's last error. */
#define assert_fails(call, status, message)                                    \
  do {                                                                         \
    assert_int_equal((call), (status));                                        \
    assert_string_equal(remat_last_error(), (message));                        \
  } while (0)

static remat_runtime *new_runtime(int threads) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = threads};
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_non_null(rt);
  return rt;
}

static remat_graph *new_graph(remat_runtime *rt) {
  remat_graph *g = NULL;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_non_null(g);
  return g;
}

static remat_tensor *input2(remat_graph *g, const char *name, remat_dtype dt,
                            int64_t a, int64_t b) {
  int64_t d[2] = {a, b};
  return remat_input(g, name, dt, 2, d);
}

static remat_tensor *param2(remat_graph *g, const char *name, int64_t a,
                            int64_t b) {
  int64_t d[2] = {a, b};
  return remat_param(g, name, b ? 2 : 1, d, REMAT_INIT_NORMAL, 0.5f);
}

/* A small model: loss = sum(relu(linear(x[2,4], w[3,4]))), with the
 * linear's output "y" kept. */
typedef struct small {
  remat_graph *g;
  remat_tensor *x, *w, *y, *h, *loss;
} small;

static small small_build(remat_runtime *rt) {
  small m;
  m.g = new_graph(rt);
  m.x = input2(m.g, "x", REMAT_F32, 2, 4);
  m.w = param2(m.g, "w", 3, 4);
  m.y = remat_linear(m.g, m.x, m.w, NULL);
  m.h = remat_relu(m.g, m.y);
  m.loss = remat_sum(m.g, m.h);
  assert_non_null(m.loss);
  return m;
}

static const float small_x[8] = {1, -2, 3, -4, 5, -6, 7, -8};

/* The small model by hand from its weights: y = x . w^T, the loss
 * sum(relu(y)) and the gradient of w. */
typedef struct small_ref {
  float y[6], loss, grad[12];
} small_ref;

static small_ref small_reference(const float w[12]) {
  small_ref r = {.loss = 0.0f};
  for (int i = 0; i < 2; i++)
    for (int c = 0; c < 3; c++) {
      float y = 0.0f;
      for (int k = 0; k < 4; k++)
        y += small_x[i * 4 + k] * w[c * 4 + k];
      r.y[i * 3 + c] = y;
      r.loss += y > 0.0f ? y : 0.0f;
      for (int k = 0; k < 4; k++)
        r.grad[c * 4 + k] += y > 0.0f ? small_x[i * 4 + k] : 0.0f;
    }
  return r;
}

/* Every element of `got` within 1e-4 of `want`. */
static void assert_close(const float *got, const float *want, int n) {
  for (int i = 0; i < n; i++)
    if (!(fabsf(got[i] - want[i]) <= 1e-4f))
      fail_msg("element %d: %.9g, expected %.9g", i, got[i], want[i]);
}

/* ---- NULL handles ---- */

static void test_null_runtime_and_graph(void **state) {
  (void)state;
  remat_config rc = {0};
  remat_runtime *rt = NULL;
  remat_graph *g = NULL;
  assert_fails(remat_runtime_create(NULL, NULL), REMAT_ERR_INVALID_ARG,
               "remat_runtime_create: out must not be NULL");
  assert_fails(remat_runtime_config(NULL, &rc), REMAT_ERR_INVALID_ARG,
               "remat_runtime_config: rt and out must not be NULL");
  assert_int_equal(remat_runtime_num_threads(NULL), 0);
  assert_fails(remat_graph_create(NULL, &g), REMAT_ERR_INVALID_ARG,
               "remat_graph_create: rt and out must not be NULL");
  assert_null(g);
  rt = new_runtime(1);
  assert_fails(remat_runtime_config(rt, NULL), REMAT_ERR_INVALID_ARG,
               "remat_runtime_config: rt and out must not be NULL");
  assert_fails(remat_graph_create(rt, NULL), REMAT_ERR_INVALID_ARG,
               "remat_graph_create: rt and out must not be NULL");
  assert_int_equal(remat_graph_status(NULL), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_graph_error(NULL), "graph is NULL");
  assert_fails(remat_graph_seed(NULL, 1), REMAT_ERR_INVALID_ARG,
               "remat_graph_seed: g is NULL");
  remat_runtime_destroy(rt);
}

/* meson.build's project version (passed by tests/meson.build), the
 * header's macros and the library's remat_version() are one version. */
static void test_versions_agree(void **state) {
  (void)state;
  const char *project = getenv("REMAT_TEST_PROJECT_VERSION");
  assert_non_null(project);
  char macros[64];
  snprintf(macros, sizeof macros, "%d.%d.%d", REMAT_VERSION_MAJOR,
           REMAT_VERSION_MINOR, REMAT_VERSION_PATCH);
  assert_string_equal(macros, project);
  assert_string_equal(remat_version(), project);
}

static void test_null_graph_builders(void **state) {
  (void)state;
  int64_t dims[2] = {2, 3};
  assert_null(remat_input(NULL, "x", REMAT_F32, 2, dims));
  assert_string_equal(remat_last_error(), "remat_input: graph is NULL");
  assert_null(remat_param(NULL, "w", 2, dims, REMAT_INIT_ZEROS, 0.0f));
  assert_string_equal(remat_last_error(), "remat_param: graph is NULL");
  assert_null(remat_linear(NULL, NULL, NULL, NULL));
  assert_string_equal(remat_last_error(), "linear: graph is NULL");
  assert_null(remat_matmul(NULL, NULL, NULL));
  assert_string_equal(remat_last_error(), "matmul: graph is NULL");
  assert_null(remat_add(NULL, NULL, NULL));
  assert_string_equal(remat_last_error(), "add: graph is NULL");
  assert_null(remat_bias_add(NULL, NULL, NULL));
  assert_string_equal(remat_last_error(), "bias_add: graph is NULL");
  assert_null(remat_relu(NULL, NULL));
  assert_string_equal(remat_last_error(), "relu: graph is NULL");
  assert_null(remat_gelu(NULL, NULL, REMAT_GELU_TANH));
  assert_string_equal(remat_last_error(), "gelu: graph is NULL");
  assert_null(remat_layernorm(NULL, NULL, NULL, NULL, 0.0f));
  assert_string_equal(remat_last_error(), "layernorm: graph is NULL");
  assert_null(remat_softmax(NULL, NULL));
  assert_string_equal(remat_last_error(), "softmax: graph is NULL");
  assert_null(remat_attention_scores(NULL, NULL, 2));
  assert_string_equal(remat_last_error(), "attn_scores: graph is NULL");
  assert_null(remat_attention_values(NULL, NULL, NULL, 2));
  assert_string_equal(remat_last_error(), "attn_values: graph is NULL");
  assert_null(remat_causal_self_attention(NULL, NULL, 2));
  assert_string_equal(remat_last_error(), "attn_values: graph is NULL");
  remat_attention_config fused = {.heads = 2, .fused = 1};
  assert_null(remat_attention(NULL, NULL, NULL, NULL, &fused));
  assert_string_equal(remat_last_error(), "attention: graph is NULL");
  assert_null(remat_dropout(NULL, NULL, 0.5f));
  assert_string_equal(remat_last_error(), "dropout: graph is NULL");
  assert_null(remat_embed(NULL, NULL, NULL, NULL));
  assert_string_equal(remat_last_error(), "embed: graph is NULL");
  assert_null(remat_cross_entropy(NULL, NULL, NULL));
  assert_string_equal(remat_last_error(), "cross_entropy: graph is NULL");
  assert_null(remat_sum(NULL, NULL));
  assert_string_equal(remat_last_error(), "sum: graph is NULL");
  assert_null(remat_mean(NULL, NULL));
  assert_string_equal(remat_last_error(), "mean: graph is NULL");
  assert_fails(remat_keep(NULL, NULL), REMAT_ERR_INVALID_ARG,
               "remat_keep: graph is NULL");
  assert_fails(remat_region_begin(NULL, NULL), REMAT_ERR_INVALID_ARG,
               "remat_region_begin: graph is NULL");
  assert_fails(remat_region_end(NULL), REMAT_ERR_INVALID_ARG,
               "remat_region_end: graph is NULL");
  assert_fails(remat_checkpoint_name(NULL, NULL, "a"), REMAT_ERR_INVALID_ARG,
               "remat_checkpoint_name: graph is NULL");
  remat_gpt_config cfg = {.layers = 1, .d_model = 8, .heads = 2, .seq = 4,
                          .batch = 1, .vocab = 5};
  remat_gpt m;
  assert_fails(remat_gpt_build(NULL, &cfg, &m), REMAT_ERR_INVALID_ARG,
               "remat_gpt_build: g, cfg and out must not be NULL");
  assert_true(remat_gpt_flops(NULL) == 0.0);
}

static void test_null_graph_run(void **state) {
  (void)state;
  float buf[8] = {0};
  remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  assert_fails(remat_compile(NULL, NULL, &sgd), REMAT_ERR_INVALID_ARG,
               "remat_compile: graph is NULL");
  assert_fails(remat_set_lr(NULL, 0.1f), REMAT_ERR_INVALID_ARG,
               "remat_set_lr: graph is NULL");
  assert_fails(remat_feed(NULL, NULL, buf, sizeof buf), REMAT_ERR_INVALID_ARG,
               "remat_feed: graph is NULL");
  assert_fails(remat_step(NULL, NULL), REMAT_ERR_INVALID_ARG,
               "remat_step: graph is NULL");
  assert_fails(remat_forward(NULL, NULL), REMAT_ERR_INVALID_ARG,
               "remat_forward: graph is NULL");
  assert_fails(remat_read(NULL, NULL, buf, sizeof buf), REMAT_ERR_INVALID_ARG,
               "remat_read: graph is NULL");
  assert_fails(remat_read_grad(NULL, NULL, buf, sizeof buf),
               REMAT_ERR_INVALID_ARG, "remat_read_grad: graph is NULL");
  assert_fails(remat_write(NULL, NULL, buf, sizeof buf), REMAT_ERR_INVALID_ARG,
               "remat_write: graph is NULL");
  assert_int_equal(remat_num_params(NULL), 0);
  assert_null(remat_param_at(NULL, 0));
  assert_fails(remat_save_safetensors(NULL, "x.safetensors"),
               REMAT_ERR_INVALID_ARG,
               "remat_save_safetensors: graph and path must not be NULL");
  assert_fails(remat_load_safetensors(NULL, "x.safetensors"),
               REMAT_ERR_INVALID_ARG,
               "remat_load_safetensors: graph and path must not be NULL");
  assert_fails(remat_save_grads_safetensors(NULL, "x.safetensors"),
               REMAT_ERR_INVALID_ARG,
               "remat_save_grads_safetensors: graph and path must not be NULL");
}

static void test_null_tensor_and_out(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  /* Tensor accessors answer neutral values for NULL. */
  assert_int_equal(remat_tensor_ndim(NULL), 0);
  assert_int_equal(remat_tensor_dim(NULL, 0), 0);
  assert_int_equal(remat_tensor_numel(NULL), 0);
  assert_string_equal(remat_tensor_name(NULL), "");

  /* A NULL tensor to a builder is a sticky graph error. */
  remat_graph *g = new_graph(rt);
  assert_null(remat_relu(g, NULL));
  assert_int_equal(remat_graph_status(g), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_graph_error(g), "relu: tensor argument is NULL");
  assert_string_equal(remat_last_error(), "relu: tensor argument is NULL");
  assert_fails(remat_compile(g, NULL, NULL), REMAT_ERR_INVALID_ARG,
               "relu: tensor argument is NULL");
  remat_graph_destroy(g);

  g = new_graph(rt);
  assert_fails(remat_keep(g, NULL), REMAT_ERR_INVALID_ARG,
               "remat_keep: tensor argument is NULL");
  remat_graph_destroy(g);
  g = new_graph(rt);
  assert_fails(remat_checkpoint_name(g, NULL, "a"), REMAT_ERR_INVALID_ARG,
               "remat_checkpoint_name: tensor argument is NULL");
  remat_graph_destroy(g);
  g = new_graph(rt);
  remat_gpt_config cfg = {.layers = 1, .d_model = 8, .heads = 2, .seq = 4,
                          .batch = 1, .vocab = 5};
  assert_fails(remat_gpt_build(g, NULL, NULL), REMAT_ERR_INVALID_ARG,
               "remat_gpt_build: g, cfg and out must not be NULL");
  assert_fails(remat_gpt_build(g, &cfg, NULL), REMAT_ERR_INVALID_ARG,
               "remat_gpt_build: g, cfg and out must not be NULL");
  remat_graph_destroy(g);

  /* NULL tensors and buffers after compile. */
  small m = small_build(rt);
  remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  assert_int_equal(remat_compile(m.g, m.loss, &sgd), REMAT_OK);
  float buf[12];
  assert_fails(remat_feed(m.g, NULL, buf, 32), REMAT_ERR_INVALID_ARG,
               "remat_feed: tensor is NULL");
  assert_fails(remat_feed(m.g, m.x, NULL, 32), REMAT_ERR_INVALID_ARG,
               "remat_feed: data is NULL");
  assert_fails(remat_read(m.g, NULL, buf, 48), REMAT_ERR_INVALID_ARG,
               "remat_read: tensor is NULL");
  assert_fails(remat_read(m.g, m.w, NULL, 48), REMAT_ERR_INVALID_ARG,
               "remat_read: dst is NULL");
  assert_fails(remat_read_grad(m.g, NULL, buf, 48), REMAT_ERR_INVALID_ARG,
               "remat_read_grad: tensor is NULL");
  assert_fails(remat_read_grad(m.g, m.w, NULL, 48), REMAT_ERR_INVALID_ARG,
               "remat_read_grad: dst is NULL");
  assert_fails(remat_write(m.g, NULL, buf, 48), REMAT_ERR_INVALID_ARG,
               "remat_write: tensor is NULL");
  assert_fails(remat_write(m.g, m.w, NULL, 48), REMAT_ERR_INVALID_ARG,
               "remat_write: src is NULL");
  assert_fails(remat_save_safetensors(m.g, NULL), REMAT_ERR_INVALID_ARG,
               "remat_save_safetensors: graph and path must not be NULL");
  assert_fails(remat_load_safetensors(m.g, NULL), REMAT_ERR_INVALID_ARG,
               "remat_load_safetensors: graph and path must not be NULL");
  assert_null(remat_param_at(m.g, -1));
  assert_null(remat_param_at(m.g, 1));
  assert_ptr_equal(remat_param_at(m.g, 0), m.w);
  assert_int_equal(remat_tensor_dim(m.w, -1), 0);
  assert_int_equal(remat_tensor_dim(m.w, 2), 0);
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

static void test_null_parse_and_policy(void **state) {
  (void)state;
  int64_t bytes = 0;
  remat_policy *p = NULL;
  char buf[64];
  assert_fails(remat_parse_bytes(NULL, &bytes), REMAT_ERR_INVALID_ARG,
               "remat_parse_bytes: text and bytes must not be NULL");
  assert_fails(remat_parse_bytes("1KiB", NULL), REMAT_ERR_INVALID_ARG,
               "remat_parse_bytes: text and bytes must not be NULL");
  assert_fails(remat_policy_parse(NULL, &p), REMAT_ERR_INVALID_ARG,
               "remat_policy_parse: text and out must not be NULL");
  assert_fails(remat_policy_parse("dots_saveable", NULL),
               REMAT_ERR_INVALID_ARG,
               "remat_policy_parse: text and out must not be NULL");
  assert_fails(remat_policy_format(NULL, buf, sizeof buf),
               REMAT_ERR_INVALID_ARG,
               "remat_policy_format: policy and buf must not be NULL");
  p = remat_policy_dots_saveable();
  assert_fails(remat_policy_format(p, NULL, 10), REMAT_ERR_INVALID_ARG,
               "remat_policy_format: policy and buf must not be NULL");
  assert_fails(remat_policy_format(p, buf, 0), REMAT_ERR_LIMIT,
               "remat_policy_format: the string form needs 14 bytes with its "
               "NUL, the buffer has 0");
  remat_policy_destroy(p);
}

/* Destroying NULL neither fails (the last error stays as it was) nor
 * touches live handles: a runtime and a graph made before still train. */
static void test_destroy_null_is_noop(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(2);
  small m = small_build(rt);
  assert_int_equal(remat_graph_seed(NULL, 1), REMAT_ERR_INVALID_ARG);
  remat_runtime_destroy(NULL);
  remat_graph_destroy(NULL);
  remat_policy_destroy(NULL);
  assert_string_equal(remat_last_error(), "remat_graph_seed: g is NULL");
  assert_int_equal(remat_graph_status(m.g), REMAT_OK);
  assert_string_equal(remat_graph_error(m.g), "");
  assert_int_equal(remat_runtime_num_threads(rt), 2);
  remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  assert_int_equal(remat_compile(m.g, m.loss, &sgd), REMAT_OK);
  float before[12], after[12];
  assert_int_equal(remat_read(m.g, m.w, before, sizeof before), REMAT_OK);
  assert_int_equal(remat_feed(m.g, m.x, small_x, sizeof small_x), REMAT_OK);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  assert_int_equal(remat_read(m.g, m.w, after, sizeof after), REMAT_OK);
  assert_memory_not_equal(before, after, sizeof before);
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

static void test_status_strings(void **state) {
  (void)state;
  static const char *const names[] = {
      "REMAT_OK",          "REMAT_ERR_INVALID_ARG", "REMAT_ERR_OUT_OF_MEMORY",
      "REMAT_ERR_SHAPE",   "REMAT_ERR_CONFIG",      "REMAT_ERR_LIMIT",
      "REMAT_ERR_CYCLE",   "REMAT_ERR_STATE",       "REMAT_ERR_BACKEND",
      "REMAT_ERR_IO",      "REMAT_ERR_NUMERIC",     "REMAT_ERR_BUDGET",
      "REMAT_ERR_POLICY",  "REMAT_ERR_CANCELLED"};
  for (int s = REMAT_OK; s <= REMAT_ERR_CANCELLED; s++)
    assert_string_equal(remat_status_string((remat_status)s), names[s]);
  assert_string_equal(remat_status_string((remat_status)99),
                      "REMAT_ERR_UNKNOWN");
}

/* The last error belongs to the thread that failed. */
static void *last_error_of_new_thread(void *arg) {
  (void)arg;
  return (void *)remat_last_error();
}

static void test_last_error_is_per_thread(void **state) {
  (void)state;
  assert_int_equal(remat_graph_seed(NULL, 1), REMAT_ERR_INVALID_ARG);
  pthread_t th;
  void *other = NULL;
  assert_int_equal(pthread_create(&th, NULL, last_error_of_new_thread, NULL),
                   0);
  assert_int_equal(pthread_join(th, &other), 0);
  assert_string_equal((const char *)other, "");
  assert_string_equal(remat_last_error(), "remat_graph_seed: g is NULL");
}

/* ---- runtime configuration in code ---- */

static void test_bad_config_fields(void **state) {
  (void)state;
  remat_runtime *rt = NULL;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 0};
  assert_fails(remat_runtime_create(&rc, &rt), REMAT_ERR_CONFIG,
               "remat_config.num_threads=0 is not valid: expected 1 to 1024");
  assert_null(rt);
  rc = (remat_config){.set = REMAT_SET_BIND, .bind = (remat_bind)7};
  assert_fails(remat_runtime_create(&rc, &rt), REMAT_ERR_CONFIG,
               "remat_config.bind=7 is not valid: expected REMAT_BIND_CORE, "
               "REMAT_BIND_NUMA or REMAT_BIND_NONE");
  rc = (remat_config){.set = REMAT_SET_LOOKAHEAD, .lookahead = 0};
  assert_fails(remat_runtime_create(&rc, &rt), REMAT_ERR_CONFIG,
               "remat_config.lookahead=0 is not valid: expected 1 to 64");
  rc = (remat_config){.set = REMAT_SET_MEMORY_BUDGET, .memory_budget = -1};
  assert_fails(remat_runtime_create(&rc, &rt), REMAT_ERR_CONFIG,
               "remat_config.memory_budget=-1 is negative: expected bytes, "
               "or 0 for none");
  rc = (remat_config){.set = REMAT_SET_POLICY, .policy = NULL};
  assert_fails(remat_runtime_create(&rc, &rt), REMAT_ERR_CONFIG,
               "remat_config.policy is empty: expected a policy such as "
               "nothing_saveable or dots_saveable");
  rc = (remat_config){.set = REMAT_SET_POLICY, .policy = "dots"};
  assert_fails(remat_runtime_create(&rc, &rt), REMAT_ERR_CONFIG,
               "remat_config.policy: unknown remat policy 'dots': expected "
               "one of everything_saveable, nothing_saveable, dots_saveable, "
               "checkpoint_dots, dots_with_no_batch_dims_saveable, "
               "checkpoint_dots_with_no_batch_dims, "
               "save_only_these_names:NAME[,NAME...], "
               "save_any_names_but_these:NAME[,NAME...], "
               "save_anything_except_these_names:NAME[,NAME...], "
               "save_from_both_policies:P+Q, auto");
  rc = (remat_config){.set = REMAT_SET_VERBOSE, .verbose = 3};
  assert_fails(remat_runtime_create(&rc, &rt), REMAT_ERR_CONFIG,
               "remat_config.verbose=3 is not valid: expected 0, 1 or 2");
  assert_null(rt);
}

/* ---- a tensor of another graph ---- */

typedef remat_tensor *(*foreign_builder)(remat_graph *g, remat_tensor *mine,
                                         remat_tensor *foreign);

static remat_tensor *use_linear(remat_graph *g, remat_tensor *x,
                                remat_tensor *f) {
  return remat_linear(g, x, f, NULL);
}
static remat_tensor *use_matmul(remat_graph *g, remat_tensor *x,
                                remat_tensor *f) {
  return remat_matmul(g, f, x);
}
static remat_tensor *use_add(remat_graph *g, remat_tensor *x,
                             remat_tensor *f) {
  return remat_add(g, x, f);
}
static remat_tensor *use_bias_add(remat_graph *g, remat_tensor *x,
                                  remat_tensor *f) {
  return remat_bias_add(g, x, f);
}
static remat_tensor *use_relu(remat_graph *g, remat_tensor *x,
                              remat_tensor *f) {
  (void)x;
  return remat_relu(g, f);
}
static remat_tensor *use_layernorm(remat_graph *g, remat_tensor *x,
                                   remat_tensor *f) {
  return remat_layernorm(g, x, f, f, 0.0f);
}
static remat_tensor *use_attention_values(remat_graph *g, remat_tensor *x,
                                          remat_tensor *f) {
  return remat_attention_values(g, x, f, 1);
}
static remat_tensor *use_embed(remat_graph *g, remat_tensor *x,
                               remat_tensor *f) {
  return remat_embed(g, f, x, x);
}
static remat_tensor *use_cross_entropy(remat_graph *g, remat_tensor *x,
                                       remat_tensor *f) {
  return remat_cross_entropy(g, x, f);
}
static remat_tensor *use_mean(remat_graph *g, remat_tensor *x,
                              remat_tensor *f) {
  (void)x;
  return remat_mean(g, f);
}

static void test_tensor_of_another_graph(void **state) {
  (void)state;
  static const struct {
    foreign_builder build;
    const char *message;
  } cases[] = {
      {use_linear, "linear: tensor 'f' belongs to another graph"},
      {use_matmul, "matmul: tensor 'f' belongs to another graph"},
      {use_add, "add: tensor 'f' belongs to another graph"},
      {use_bias_add, "bias_add: tensor 'f' belongs to another graph"},
      {use_relu, "relu: tensor 'f' belongs to another graph"},
      {use_layernorm, "layernorm: tensor 'f' belongs to another graph"},
      {use_attention_values,
       "attn_values: tensor 'f' belongs to another graph"},
      {use_embed, "embed: tensor 'f' belongs to another graph"},
      {use_cross_entropy, "cross_entropy: tensor 'f' belongs to another graph"},
      {use_mean, "mean: tensor 'f' belongs to another graph"},
  };
  remat_runtime *rt = new_runtime(1);
  remat_graph *other = new_graph(rt);
  remat_tensor *f = input2(other, "f", REMAT_F32, 2, 4);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    remat_graph *g = new_graph(rt);
    remat_tensor *x = input2(g, "x", REMAT_F32, 2, 4);
    assert_null(cases[i].build(g, x, f));
    assert_int_equal(remat_graph_status(g), REMAT_ERR_INVALID_ARG);
    assert_string_equal(remat_graph_error(g), cases[i].message);
    assert_string_equal(remat_last_error(), cases[i].message);
    remat_graph_destroy(g);
  }
  /* keep, checkpoint_name and compile's loss */
  remat_graph *g = new_graph(rt);
  assert_fails(remat_keep(g, f), REMAT_ERR_INVALID_ARG,
               "remat_keep: tensor 'f' belongs to another graph");
  remat_graph_destroy(g);
  g = new_graph(rt);
  assert_fails(remat_checkpoint_name(g, f, "a"), REMAT_ERR_INVALID_ARG,
               "remat_checkpoint_name: tensor 'f' belongs to another graph");
  remat_graph_destroy(g);
  small m = small_build(rt);
  remat_tensor *other_loss = remat_sum(other, f);
  assert_fails(remat_compile(m.g, other_loss, NULL), REMAT_ERR_INVALID_ARG,
               "remat_compile: tensor 'sum_0' belongs to another graph");
  remat_graph_destroy(m.g);

  /* feed, read, read_grad and write after compile */
  m = small_build(rt);
  assert_int_equal(remat_compile(m.g, m.loss, NULL), REMAT_OK);
  float buf[8] = {0};
  assert_fails(remat_feed(m.g, f, buf, sizeof buf), REMAT_ERR_INVALID_ARG,
               "remat_feed: tensor 'f' belongs to another graph");
  assert_fails(remat_read(m.g, f, buf, sizeof buf), REMAT_ERR_INVALID_ARG,
               "remat_read: tensor 'f' belongs to another graph");
  assert_fails(remat_read_grad(m.g, f, buf, sizeof buf), REMAT_ERR_INVALID_ARG,
               "remat_read_grad: tensor 'f' belongs to another graph");
  assert_fails(remat_write(m.g, f, buf, sizeof buf), REMAT_ERR_INVALID_ARG,
               "remat_write: tensor 'f' belongs to another graph");
  remat_graph_destroy(m.g);
  remat_graph_destroy(other);
  remat_runtime_destroy(rt);
}

/* ---- calls at the wrong time ---- */

static void test_calls_before_compile(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  small m = small_build(rt);
  float buf[12];
  assert_fails(remat_step(m.g, NULL), REMAT_ERR_STATE,
               "remat_step: the graph is not compiled: call remat_compile "
               "first");
  assert_fails(remat_forward(m.g, NULL), REMAT_ERR_STATE,
               "remat_forward: the graph is not compiled: call remat_compile "
               "first");
  assert_fails(remat_feed(m.g, m.x, small_x, sizeof small_x), REMAT_ERR_STATE,
               "remat_feed: the graph is not compiled: call remat_compile "
               "first");
  assert_fails(remat_read(m.g, m.w, buf, 48), REMAT_ERR_STATE,
               "remat_read: the graph is not compiled: call remat_compile "
               "first");
  assert_fails(remat_read_grad(m.g, m.w, buf, 48), REMAT_ERR_STATE,
               "remat_read_grad: the graph is not compiled: call "
               "remat_compile first");
  assert_fails(remat_write(m.g, m.w, buf, 48), REMAT_ERR_STATE,
               "remat_write: the graph is not compiled: call remat_compile "
               "first");
  assert_fails(remat_set_lr(m.g, 0.1f), REMAT_ERR_STATE,
               "remat_set_lr: the graph is not compiled: call remat_compile "
               "first");
  assert_fails(remat_save_safetensors(m.g, "never.safetensors"),
               REMAT_ERR_STATE,
               "remat_save_safetensors: the graph is not compiled: call "
               "remat_compile first");
  /* None of these is a building error: the graph still compiles. */
  assert_int_equal(remat_graph_status(m.g), REMAT_OK);
  assert_int_equal(remat_compile(m.g, m.loss, NULL), REMAT_OK);
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

static void test_calls_after_compile(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  small m = small_build(rt);
  remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  assert_int_equal(remat_compile(m.g, m.loss, &sgd), REMAT_OK);
  assert_fails(remat_compile(m.g, m.loss, &sgd), REMAT_ERR_STATE,
               "remat_compile: the graph is already compiled");
  assert_fails(remat_keep(m.g, m.h), REMAT_ERR_STATE,
               "remat_keep: the graph is already compiled: build every "
               "tensor before remat_compile");
  /* A compiled graph keeps running after a misplaced building call. */
  assert_int_equal(remat_feed(m.g, m.x, small_x, sizeof small_x), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(m.g, &st), REMAT_OK);
  assert_true(isfinite(st.loss));
  remat_graph_destroy(m.g);

  m = small_build(rt);
  assert_int_equal(remat_compile(m.g, m.loss, NULL), REMAT_OK);
  assert_null(remat_relu(m.g, m.x));
  assert_string_equal(remat_last_error(), "relu: the graph is already "
                                          "compiled: build every tensor "
                                          "before remat_compile");
  remat_graph_destroy(m.g);

  m = small_build(rt);
  assert_int_equal(remat_compile(m.g, m.loss, NULL), REMAT_OK);
  assert_fails(remat_region_begin(m.g, NULL), REMAT_ERR_STATE,
               "remat_region_begin: the graph is already compiled");
  assert_fails(remat_set_lr(m.g, 0.1f), REMAT_ERR_INVALID_ARG,
               "remat_set_lr: needs a graph compiled with an optimizer and a "
               "finite lr > 0");
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

static void test_regions_out_of_order(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  remat_graph *g = new_graph(rt);
  assert_fails(remat_region_end(g), REMAT_ERR_STATE,
               "remat_region_end: no checkpoint region is open: each "
               "remat_region_end must follow a remat_region_begin");
  remat_graph_destroy(g);
  small m = small_build(rt);
  assert_int_equal(remat_region_begin(m.g, NULL), REMAT_OK);
  assert_fails(remat_compile(m.g, m.loss, NULL), REMAT_ERR_STATE,
               "remat_compile: 1 checkpoint region(s) still open: call "
               "remat_region_end for each remat_region_begin");
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

static void test_bad_compile_arguments(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  small m = small_build(rt);
  assert_fails(remat_compile(m.g, m.y, NULL), REMAT_ERR_SHAPE,
               "remat_compile: the loss 'linear_0' must be an op result with "
               "one element");
  remat_graph_destroy(m.g);
  m = small_build(rt);
  remat_optimizer bad = {.kind = REMAT_OPT_SGD, .lr = -1.0f};
  assert_fails(remat_compile(m.g, m.loss, &bad), REMAT_ERR_INVALID_ARG,
               "remat_compile: optimizer is not valid: expected kind "
               "REMAT_OPT_SGD or REMAT_OPT_ADAMW, a finite lr > 0, betas "
               "in [0,1), a finite eps >= 0 and a finite weight_decay >= "
               "0");
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

/* ---- feeds and reads ---- */

static void test_feeds_and_reads(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  small m = small_build(rt);
  assert_int_equal(remat_compile(m.g, m.loss, NULL), REMAT_OK);
  float buf[12];
  assert_fails(remat_feed(m.g, m.x, small_x, 4 * sizeof(float)),
               REMAT_ERR_SHAPE,
               "remat_feed: tensor 'x' holds 32 bytes, 16 given");
  assert_fails(remat_feed(m.g, m.x, small_x, sizeof small_x + 4),
               REMAT_ERR_SHAPE,
               "remat_feed: tensor 'x' holds 32 bytes, 36 given");
  assert_fails(remat_feed(m.g, m.w, buf, 48), REMAT_ERR_INVALID_ARG,
               "remat_feed: 'w' is not an input");
  assert_fails(remat_feed(m.g, m.h, buf, 24), REMAT_ERR_INVALID_ARG,
               "remat_feed: 'relu_1' is not an input");
  assert_int_equal(remat_feed(m.g, m.x, small_x, sizeof small_x), REMAT_OK);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  assert_fails(remat_read(m.g, m.h, buf, 24), REMAT_ERR_INVALID_ARG,
               "remat_read: 'relu_1' is an intermediate activation: call "
               "remat_keep on it before compile");
  assert_fails(remat_read(m.g, m.w, buf, 44), REMAT_ERR_SHAPE,
               "remat_read: tensor 'w' holds 48 bytes, 44 given");
  assert_fails(remat_read_grad(m.g, m.x, buf, 32), REMAT_ERR_INVALID_ARG,
               "remat_read_grad: 'x' is not a parameter with a gradient");
  assert_fails(remat_write(m.g, m.x, buf, 32), REMAT_ERR_INVALID_ARG,
               "remat_write: 'x' is not a parameter");
  /* What may be read: inputs, parameters, the loss, kept tensors. */
  float x[8], loss;
  assert_int_equal(remat_read(m.g, m.x, x, sizeof x), REMAT_OK);
  assert_memory_equal(x, small_x, sizeof x);
  assert_int_equal(remat_read(m.g, m.loss, &loss, sizeof loss), REMAT_OK);
  assert_int_equal(remat_read(m.g, m.w, buf, 48), REMAT_OK);
  small_ref ref = small_reference(buf);
  assert_true(ref.loss > 0.0f);
  assert_close(&loss, &ref.loss, 1);
  remat_graph_destroy(m.g);

  /* The kept "y" is readable and equals x . w^T. */
  m = small_build(rt);
  assert_int_equal(remat_keep(m.g, m.y), REMAT_OK);
  assert_int_equal(remat_compile(m.g, m.loss, NULL), REMAT_OK);
  assert_int_equal(remat_feed(m.g, m.x, small_x, sizeof small_x), REMAT_OK);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  float y[6], w[12];
  assert_int_equal(remat_read(m.g, m.y, y, sizeof y), REMAT_OK);
  assert_int_equal(remat_read(m.g, m.w, w, sizeof w), REMAT_OK);
  assert_close(y, small_reference(w).y, 6);
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

/* ---- training graphs and forward-only graphs ---- */

static void test_forward_and_step_graph_kinds(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(2);
  small train = small_build(rt);
  assert_int_equal(remat_compile(train.g, train.loss, NULL), REMAT_OK);
  assert_int_equal(remat_feed(train.g, train.x, small_x, sizeof small_x),
                   REMAT_OK);
  assert_fails(remat_forward(train.g, NULL), REMAT_ERR_STATE,
               "remat_forward: the graph was compiled for training: compile "
               "a graph with loss NULL for inference");

  small serve = small_build(rt);
  assert_int_equal(remat_keep(serve.g, serve.y), REMAT_OK);
  assert_int_equal(remat_compile(serve.g, NULL, NULL), REMAT_OK);
  assert_int_equal(remat_feed(serve.g, serve.x, small_x, sizeof small_x),
                   REMAT_OK);
  assert_fails(remat_step(serve.g, NULL), REMAT_ERR_STATE,
               "remat_step: the graph was compiled without a loss: use "
               "remat_forward");
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_forward(serve.g, &st), REMAT_OK);
  assert_true(isnan(st.loss));
  assert_int_equal(st.nonfinite, 0);
  assert_int_equal(st.current[REMAT_MEM_GRADS], 0);
  assert_int_equal(st.peak[REMAT_MEM_ACT_GRADS], 0);
  float w[12];
  assert_fails(remat_read_grad(serve.g, serve.w, w, sizeof w),
               REMAT_ERR_INVALID_ARG,
               "remat_read_grad: 'w' is not a parameter with a gradient");
  /* Same seed, same weights: forward gives every element of x . w^T, and
   * the training graph's step the loss and gradient of those weights. */
  float y[6], w_train[12], grad[12];
  assert_int_equal(remat_read(serve.g, serve.y, y, sizeof y), REMAT_OK);
  assert_int_equal(remat_read(serve.g, serve.w, w, sizeof w), REMAT_OK);
  assert_int_equal(remat_read(train.g, train.w, w_train, sizeof w_train),
                   REMAT_OK);
  assert_memory_equal(w, w_train, sizeof w);
  small_ref ref = small_reference(w);
  assert_close(y, ref.y, 6);
  assert_int_equal(remat_step(train.g, &st), REMAT_OK);
  assert_int_equal(st.nonfinite, 0);
  assert_true(ref.loss > 0.0f);
  assert_close(&st.loss, &ref.loss, 1);
  assert_int_equal(remat_read_grad(train.g, train.w, grad, sizeof grad),
                   REMAT_OK);
  assert_close(grad, ref.grad, 12);
  remat_graph_destroy(serve.g);
  remat_graph_destroy(train.g);
  remat_runtime_destroy(rt);
}

/* ---- policies ---- */

static void expect_no_policy(remat_policy *p, const char *message) {
  assert_null(p);
  assert_string_equal(remat_last_error(), message);
}

static void test_policy_constructor_errors(void **state) {
  (void)state;
  const char *good[] = {"attn_out", "ffn_in"};
  const char *with_null[] = {"attn_out", NULL};
  const char *with_comma[] = {"a,b"};
  const char *with_space[] = {"a b"};
  const char *empty[] = {""};
  const char *long_name[] = {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                             "aaaaaaaaaaaaaaaaa"};
  expect_no_policy(remat_policy_save_only_these_names(NULL, 1),
                   "save_only_these_names needs at least one name, e.g. "
                   "save_only_these_names:attn_out,ffn_in");
  expect_no_policy(remat_policy_save_only_these_names(good, 0),
                   "save_only_these_names needs at least one name, e.g. "
                   "save_only_these_names:attn_out,ffn_in");
  expect_no_policy(remat_policy_save_any_names_but_these(good, -1),
                   "save_any_names_but_these needs at least one name, e.g. "
                   "save_any_names_but_these:attn_out,ffn_in");
  expect_no_policy(remat_policy_save_only_these_names(with_null, 2),
                   "save_only_these_names: name 1 is NULL; "
                   "a name is 1 to 63 bytes, none of them a space, ',', '+', ':' or a "
                   "control byte (0x01-0x1F, 0x7F)");
  expect_no_policy(remat_policy_save_any_names_but_these(with_comma, 1),
                   "save_any_names_but_these: name 0 ('a,b') is not valid: "
                   "',' at offset 1; "
                   "a name is 1 to 63 bytes, none of them a space, ',', '+', ':' or a "
                   "control byte (0x01-0x1F, 0x7F)");
  expect_no_policy(remat_policy_save_only_these_names(with_space, 1),
                   "save_only_these_names: name 0 ('a b') is not valid: "
                   "a space at offset 1; "
                   "a name is 1 to 63 bytes, none of them a space, ',', '+', ':' or a "
                   "control byte (0x01-0x1F, 0x7F)");
  expect_no_policy(remat_policy_save_only_these_names(empty, 1),
                   "save_only_these_names: name 0 ('') is not valid: "
                   "it is empty; "
                   "a name is 1 to 63 bytes, none of them a space, ',', '+', ':' or a "
                   "control byte (0x01-0x1F, 0x7F)");
  assert_null(remat_policy_save_only_these_names(long_name, 1));
  assert_non_null(strstr(remat_last_error(), "is not valid: it is 68 bytes long"));

  remat_policy *dots = remat_policy_dots_saveable(), *automatic = NULL;
  expect_no_policy(remat_policy_save_from_both_policies(NULL, dots),
                   "save_from_both_policies needs two policies, got NULL");
  expect_no_policy(remat_policy_save_from_both_policies(dots, NULL),
                   "save_from_both_policies needs two policies, got NULL");
  assert_int_equal(remat_policy_parse("auto", &automatic), REMAT_OK);
  expect_no_policy(remat_policy_save_from_both_policies(dots, automatic),
                   "save_from_both_policies cannot combine 'auto'");

  /* Good arguments, and the string forms. */
  remat_policy *names = remat_policy_save_only_these_names(good, 2);
  remat_policy *both = remat_policy_save_from_both_policies(dots, names);
  assert_non_null(names);
  assert_non_null(both);
  char buf[128];
  assert_int_equal(remat_policy_format(both, buf, sizeof buf), REMAT_OK);
  assert_string_equal(buf, "save_from_both_policies:dots_saveable+"
                           "save_only_these_names:attn_out,ffn_in");
  assert_fails(remat_policy_format(both, buf, 20), REMAT_ERR_LIMIT,
               "remat_policy_format: the string form needs 76 bytes with its "
               "NUL, the buffer has 20");
  remat_policy *alias = remat_policy_checkpoint_dots();
  assert_int_equal(remat_policy_format(alias, buf, sizeof buf), REMAT_OK);
  assert_string_equal(buf, "dots_saveable");
  char exact[sizeof "dots_saveable"]; /* 13 characters and the NUL */
  assert_int_equal(remat_policy_format(alias, exact, sizeof exact), REMAT_OK);
  assert_string_equal(exact, "dots_saveable");
  remat_policy_destroy(alias);
  remat_policy_destroy(both);
  remat_policy_destroy(names);
  remat_policy_destroy(automatic);
  remat_policy_destroy(dots);
}

static void test_policy_parse_errors(void **state) {
  (void)state;
  remat_policy *p = (remat_policy *)&p;
  assert_int_equal(remat_policy_parse("dots", &p), REMAT_ERR_POLICY);
  assert_null(p);
  assert_string_equal(remat_last_error(),
                      "unknown remat policy 'dots': expected one of "
                      "everything_saveable, nothing_saveable, dots_saveable, "
                      "checkpoint_dots, dots_with_no_batch_dims_saveable, "
                      "checkpoint_dots_with_no_batch_dims, "
                      "save_only_these_names:NAME[,NAME...], "
                      "save_any_names_but_these:NAME[,NAME...], "
                      "save_anything_except_these_names:NAME[,NAME...], "
                      "save_from_both_policies:P+Q, auto");
  assert_fails(remat_policy_parse("save_only_these_names:", &p),
               REMAT_ERR_POLICY,
               "save_only_these_names: empty name at offset 22 (nothing "
               "after ':'): expected save_only_these_names:NAME[,NAME...], e.g. "
               "save_only_these_names:attn_out,ffn_in");
  assert_fails(remat_policy_parse("save_any_names_but_these:a,,b", &p),
               REMAT_ERR_POLICY,
               "save_any_names_but_these: empty name at offset 27 (two ',' in "
               "a row): expected save_any_names_but_these:NAME[,NAME...], e.g. "
               "save_any_names_but_these:attn_out,ffn_in");
  /* A bad name inside a valid list form keeps its message (fuzz_policy
   * regression: the message used to come back empty). */
  assert_fails(remat_policy_parse("save_only_these_names:a:b,c", &p),
               REMAT_ERR_POLICY,
               "save_only_these_names: name 0 ('a:b') at offset 22 is not "
               "valid: ':' at offset 23; a name is 1 to 63 bytes, none of them "
               "a space, ',', '+', ':' or a control byte (0x01-0x1F, 0x7F)");
  assert_fails(remat_policy_parse("save_from_both_policies:dots_saveable", &p),
               REMAT_ERR_POLICY,
               "save_from_both_policies: expected '+' and a second policy at "
               "offset 37, found the end of the string; e.g. "
               "save_from_both_policies:dots_saveable+"
               "save_only_these_names:attn_probs");
  assert_null(p);
}

/* A policy may be destroyed once a region has taken it (it is copied), and
 * a name-based policy must name tensors that exist. */
static void test_policies_in_regions(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  remat_graph *g = new_graph(rt);
  remat_tensor *x = input2(g, "x", REMAT_F32, 2, 4);
  remat_tensor *w = param2(g, "w", 4, 4);
  const char *names[] = {"hidden"};
  remat_policy *p = remat_policy_save_only_these_names(names, 1);
  assert_int_equal(remat_region_begin(g, p), REMAT_OK);
  remat_policy_destroy(p);
  remat_tensor *h = remat_relu(g, remat_linear(g, x, w, NULL));
  assert_int_equal(remat_checkpoint_name(g, h, "hidden"), REMAT_OK);
  remat_tensor *y = remat_relu(g, remat_linear(g, h, w, NULL));
  assert_int_equal(remat_region_end(g), REMAT_OK);
  assert_int_equal(remat_compile(g, remat_sum(g, y), NULL), REMAT_OK);
  remat_graph_destroy(g);

  g = new_graph(rt);
  x = input2(g, "x", REMAT_F32, 2, 4);
  w = param2(g, "w", 4, 4);
  const char *missing[] = {"nowhere"};
  p = remat_policy_save_any_names_but_these(missing, 1);
  assert_int_equal(remat_region_begin(g, p), REMAT_OK);
  remat_policy_destroy(p);
  h = remat_relu(g, remat_linear(g, x, w, NULL));
  assert_int_equal(remat_checkpoint_name(g, h, "hidden"), REMAT_OK);
  y = remat_relu(g, remat_linear(g, h, w, NULL));
  assert_int_equal(remat_region_end(g), REMAT_OK);
  assert_fails(remat_compile(g, remat_sum(g, y), NULL), REMAT_ERR_POLICY,
               "policy save_any_names_but_these names 'nowhere', which no "
               "tensor carries: names in this graph are hidden");
  /* The error is sticky: later building calls return it. */
  assert_int_equal(remat_checkpoint_name(g, h, "other"), REMAT_ERR_POLICY);
  remat_graph_destroy(g);

  g = new_graph(rt);
  x = input2(g, "x", REMAT_F32, 2, 4);
  assert_fails(remat_checkpoint_name(g, x, "a,b"), REMAT_ERR_INVALID_ARG,
               "remat_checkpoint_name: name 'a,b' is not valid: ',' at offset "
               "1; a name is 1 to 63 bytes, none of them a space, ',', '+', "
               "':' or a control byte (0x01-0x1F, 0x7F)");
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* ---- NaN and Inf ---- */

static void read_w(small *m, float *w) {
  assert_int_equal(remat_read(m->g, m->w, w, 12 * sizeof(float)), REMAT_OK);
}

static void good_step(small *m) {
  assert_int_equal(remat_feed(m->g, m->x, small_x, sizeof small_x), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(m->g, &st), REMAT_OK);
  assert_int_equal(st.nonfinite, 0);
  assert_true(isfinite(st.loss));
}

/* ---- const handles ---- */

/* Builders, feeds and reads take const tensor handles (a signature that
 * lost its const fails this file's build under -Werror): the small model
 * built and run from const handles gives the values computed by hand. */
static void test_const_handles(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  remat_graph *g = new_graph(rt);
  const remat_tensor *x = input2(g, "x", REMAT_F32, 2, 4);
  const remat_tensor *w = param2(g, "w", 3, 4);
  const remat_tensor *y = remat_linear(g, x, w, NULL);
  const remat_tensor *h = remat_relu(g, y);
  remat_tensor *loss = remat_sum(g, h);
  assert_non_null(loss);
  assert_int_equal(remat_compile(g, loss, NULL), REMAT_OK);
  float wv[12];
  for (int i = 0; i < 12; i++)
    wv[i] = 0.1f * (float)(i - 5);
  assert_int_equal(remat_write(g, w, wv, sizeof wv), REMAT_OK);
  assert_int_equal(remat_feed(g, x, small_x, sizeof small_x), REMAT_OK);
  assert_int_equal(remat_step(g, NULL), REMAT_OK);
  small_ref ref = small_reference(wv);
  float got, grad[12];
  assert_int_equal(remat_read(g, loss, &got, sizeof got), REMAT_OK);
  assert_close(&got, &ref.loss, 1);
  assert_int_equal(remat_read_grad(g, w, grad, sizeof grad), REMAT_OK);
  assert_close(grad, ref.grad, 12);
  assert_int_equal(remat_tensor_ndim(y), 2);
  assert_int_equal(remat_tensor_dim(y, 1), 3);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* ---- the graph's message of its last failed call ---- */

typedef struct feeder {
  small m;
  size_t bytes;     /* a wrong size for x */
  const char *want; /* the message that wrong size gets */
  pthread_barrier_t *start;
  int wrong;        /* calls whose status or graph message was not right */
} feeder;

static void *feed_badly(void *arg) {
  feeder *f = arg;
  float x[8] = {0};
  pthread_barrier_wait(f->start);
  for (int i = 0; i < 300; i++)
    if (remat_feed(f->m.g, f->m.x, x, f->bytes) != REMAT_ERR_SHAPE ||
        strcmp(remat_graph_error(f->m.g), f->want) != 0)
      f->wrong++;
  return NULL;
}

/* Two threads fail on two graphs at once with different messages: each
 * graph keeps its own, which any thread reads later; a call that succeeds
 * clears it. */
static void test_graph_error_per_graph(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, 2);
  feeder f[2] = {
      {.m = small_build(rt), .bytes = 4, .start = &start,
       .want = "remat_feed: tensor 'x' holds 32 bytes, 4 given"},
      {.m = small_build(rt), .bytes = 12, .start = &start,
       .want = "remat_feed: tensor 'x' holds 32 bytes, 12 given"},
  };
  for (int k = 0; k < 2; k++) {
    assert_int_equal(remat_compile(f[k].m.g, f[k].m.loss, NULL), REMAT_OK);
    assert_string_equal(remat_graph_error(f[k].m.g), "");
  }
  pthread_t th[2];
  for (int k = 0; k < 2; k++)
    assert_int_equal(pthread_create(&th[k], NULL, feed_badly, &f[k]), 0);
  for (int k = 0; k < 2; k++)
    assert_int_equal(pthread_join(th[k], NULL), 0);
  pthread_barrier_destroy(&start);
  for (int k = 0; k < 2; k++) {
    assert_int_equal(f[k].wrong, 0);
    assert_string_equal(remat_graph_error(f[k].m.g), f[k].want);
  }
  /* This thread's own failure touches neither graph. */
  assert_fails(remat_feed(NULL, NULL, NULL, 0), REMAT_ERR_INVALID_ARG,
               "remat_feed: graph is NULL");
  assert_string_equal(remat_graph_error(f[0].m.g), f[0].want);

  /* A feed that succeeds clears graph 0's message, not graph 1's. */
  small *a = &f[0].m;
  assert_int_equal(remat_feed(a->g, a->x, small_x, sizeof small_x), REMAT_OK);
  assert_string_equal(remat_graph_error(a->g), "");
  assert_string_equal(remat_graph_error(f[1].m.g), f[1].want);
  /* A failed read, then a step that succeeds. */
  float h[6];
  assert_int_equal(remat_read(a->g, a->h, h, sizeof h), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_graph_error(a->g),
                      "remat_read: 'relu_1' is an intermediate activation: "
                      "call remat_keep on it before compile");
  assert_int_equal(remat_step(a->g, NULL), REMAT_OK);
  assert_string_equal(remat_graph_error(a->g), "");
  /* A failed load, then a save that succeeds. */
  assert_int_equal(remat_load_safetensors(a->g, "/nonexistent-dir/w.st"),
                   REMAT_ERR_IO);
  assert_true(strstr(remat_graph_error(a->g), "/nonexistent-dir/w.st") != NULL);
  assert_string_equal(remat_graph_error(a->g), remat_last_error());
  char path[] = "/tmp/remat-test-graph-error-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(remat_save_safetensors(a->g, path), REMAT_OK);
  assert_string_equal(remat_graph_error(a->g), "");
  unlink(path);
  for (int k = 0; k < 2; k++)
    remat_graph_destroy(f[k].m.g);
  remat_runtime_destroy(rt);
}

/* ---- remat_step_stats across header versions ---- */

/* A remat_step_stats with room past its end, as a newer header's bigger
 * struct would have, to see which bytes the library writes. */
typedef union stats_buf {
  remat_step_stats st;
  unsigned char bytes[sizeof(remat_step_stats) + 64];
} stats_buf;

static void assert_untouched_from(const stats_buf *b, size_t from) {
  for (size_t i = from; i < sizeof b->bytes; i++)
    if (b->bytes[i] != 0xA5)
      fail_msg("byte %zu of the stats was written (the size is %zu)", i,
               b->st.size);
}

/* A program built against a newer header gives a bigger size: the library
 * writes the fields it has, nothing past them, and never `size`. */
static void test_step_stats_bigger_size(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  small m = small_build(rt);
  remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  assert_int_equal(remat_compile(m.g, m.loss, &sgd), REMAT_OK);
  float w[12];
  read_w(&m, w);
  small_ref ref = small_reference(w);
  assert_int_equal(remat_feed(m.g, m.x, small_x, sizeof small_x), REMAT_OK);
  stats_buf b;
  memset(&b, 0xA5, sizeof b);
  b.st.size = sizeof b;
  assert_int_equal(remat_step(m.g, &b.st), REMAT_OK);
  assert_int_equal(b.st.size, sizeof b);
  assert_true(fabsf(b.st.loss - ref.loss) <= 1e-4f);
  assert_int_equal(b.st.nonfinite, 0);
  assert_int_equal(b.st.accumulated, 1);
  assert_int_equal(b.st.trace_status, REMAT_OK);
  assert_true(b.st.tasks > 0);
  assert_true(b.st.peak[REMAT_MEM_PARAMS] >= 12 * 4);
  for (int c = REMAT_MEM_NUM_CATEGORIES; c < REMAT_MEM_CATEGORY_SLOTS; c++) {
    assert_int_equal(b.st.peak[c], 0);
    assert_int_equal(b.st.current[c], 0);
  }
  assert_untouched_from(&b, sizeof b.st);
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

/* A size below version 0.2.0's struct (376 bytes on LP64: 0 for a caller
 * that forgot it) fails before the step runs: nothing is written and the
 * weights do not change. */
static void test_step_stats_too_small(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  small m = small_build(rt);
  remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  assert_int_equal(remat_compile(m.g, m.loss, &sgd), REMAT_OK);
  assert_int_equal(remat_feed(m.g, m.x, small_x, sizeof small_x), REMAT_OK);
  float before[12], after[12];
  read_w(&m, before);
  const size_t sizes[] = {0, sizeof(size_t), 375};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    stats_buf b;
    memset(&b, 0xA5, sizeof b);
    b.st.size = sizes[i];
    char msg[256];
    snprintf(msg, sizeof msg,
             "remat_step: stats->size is %zu, less than the 376 bytes of "
             "remat_step_stats in version 0.2.0 (the least accepted): set it "
             "to sizeof(remat_step_stats)",
             sizes[i]);
    assert_fails(remat_step(m.g, &b.st), REMAT_ERR_INVALID_ARG, msg);
    assert_int_equal(b.st.size, sizes[i]);
    assert_untouched_from(&b, sizeof b.st.size);
    read_w(&m, after);
    assert_memory_equal(after, before, sizeof after);
  }
  remat_step_stats small_st = {.size = 100};
  assert_fails(remat_accumulate(m.g, &small_st), REMAT_ERR_INVALID_ARG,
               "remat_accumulate: stats->size is 100, less than the 376 "
               "bytes of remat_step_stats in version 0.2.0 (the least "
               "accepted): set it to sizeof(remat_step_stats)");
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

/* The next version's library with a 0.2.0 program: the size reaches part
 * way into the struct, and only the fields wholly within it are written
 * (step_stats_write, here with a size that ends inside `tasks`). */
static void test_step_stats_write_fields_that_fit(void **state) {
  (void)state;
  remat_step_stats src;
  memset(&src, 0x11, sizeof src);
  src.size = sizeof src;
  src.loss = 2.5f;
  src.current[REMAT_MEM_CATEGORY_SLOTS - 1] = 42;
  src.tasks = 7;
  stats_buf b;
  memset(&b, 0xA5, sizeof b);
  size_t cut = offsetof(remat_step_stats, tasks) + 4;
  b.st.size = cut;
  step_stats_write(&b.st, &src);
  assert_int_equal(b.st.size, cut);
  assert_true(b.st.loss == 2.5f);
  assert_int_equal(b.st.current[REMAT_MEM_CATEGORY_SLOTS - 1], 42);
  assert_memory_equal(b.bytes + sizeof b.st.size,
                      (const unsigned char *)&src + sizeof src.size,
                      offsetof(remat_step_stats, tasks) - sizeof src.size);
  assert_untouched_from(&b, offsetof(remat_step_stats, tasks));
  assert_true(STEP_STATS_MIN_SIZE == 376 || sizeof(size_t) != 8);
}

/* A NaN or Inf in x makes the loss or a gradient non-finite (an Inf under
 * relu can leave the loss finite and make the gradient NaN). */
static void nonfinite_step(small *m, float bad) {
  float x[8], before[12], after[12];
  memcpy(x, small_x, sizeof x);
  x[5] = bad;
  read_w(m, before);
  assert_int_equal(remat_feed(m->g, m->x, x, sizeof x), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_fails(remat_step(m->g, &st), REMAT_ERR_NUMERIC,
               "remat_step: the loss or a gradient is NaN or Inf; the updates "
               "were skipped");
  assert_int_equal(st.nonfinite, 1);
  read_w(m, after);
  assert_memory_equal(after, before, sizeof after);
}

/* Graph a takes NaN and Inf steps between two good steps, graph b only the
 * good steps: the weights end bitwise equal, so neither the parameters nor
 * the optimizer state (moments, step count) saw the bad steps. */
static void test_nonfinite_loss_leaves_params(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(2);
  remat_optimizer opts[2] = {{.kind = REMAT_OPT_SGD, .lr = 0.01f},
                             {.kind = REMAT_OPT_ADAMW, .lr = 0.01f}};
  for (int o = 0; o < 2; o++) {
    small a = small_build(rt), b = small_build(rt);
    assert_int_equal(remat_compile(a.g, a.loss, &opts[o]), REMAT_OK);
    assert_int_equal(remat_compile(b.g, b.loss, &opts[o]), REMAT_OK);
    good_step(&a);
    good_step(&b);
    nonfinite_step(&a, NAN);
    nonfinite_step(&a, INFINITY);
    nonfinite_step(&a, -INFINITY);
    float before[12], wa[12], wb[12];
    read_w(&a, before);
    good_step(&a);
    good_step(&b);
    read_w(&a, wa);
    read_w(&b, wb);
    assert_memory_not_equal(wa, before, sizeof wa);
    if (memcmp(wa, wb, sizeof wa) != 0)
      fail_msg("%s: after skipped NaN/Inf steps, w[0] is %.9g; without "
               "them %.9g",
               o ? "AdamW" : "SGD", wa[0], wb[0]);
    remat_graph_destroy(a.g);
    remat_graph_destroy(b.g);
  }
  remat_runtime_destroy(rt);
}

/* A NaN gradient in one parameter with a finite loss: relu(-Inf) = 0
 * hides the Inf from the loss, and its backward gives 0 * -Inf = NaN in
 * w1's gradient. No parameter may change, w2 (finite gradient) included:
 * the update is all or nothing. */
static void nonfinite_gradient_step(remat_runtime *rt, bool w1_first) {
  remat_graph *g = new_graph(rt);
  remat_tensor *x = input2(g, "x", REMAT_F32, 2, 4);
  remat_tensor *x2 = input2(g, "x2", REMAT_F32, 2, 4);
  remat_tensor *w2 = param2(g, "w2", 64, 4);
  remat_tensor *w1 = param2(g, "w1", 3, 4);
  remat_tensor *s1 = NULL, *s2 = NULL;
  if (w1_first)
    s1 = remat_sum(g, remat_relu(g, remat_linear(g, x, w1, NULL)));
  s2 = remat_sum(g, remat_linear(g, x2, w2, NULL));
  if (!w1_first)
    s1 = remat_sum(g, remat_relu(g, remat_linear(g, x, w1, NULL)));
  remat_tensor *loss = remat_add(g, s1, s2);
  remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.01f};
  assert_int_equal(remat_compile(g, loss, &sgd), REMAT_OK);
  float ones[12], w2_before[256], w2_after[256], w1_after[12];
  for (int i = 0; i < 12; i++)
    ones[i] = 1.0f;
  assert_int_equal(remat_write(g, w1, ones, sizeof ones), REMAT_OK);
  float bad_x[8] = {1, 1, 1, 1, -INFINITY, 0, 0, 0};
  assert_int_equal(remat_feed(g, x, bad_x, sizeof bad_x), REMAT_OK);
  assert_int_equal(remat_feed(g, x2, small_x, sizeof small_x), REMAT_OK);
  assert_int_equal(remat_read(g, w2, w2_before, sizeof w2_before), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(g, &st), REMAT_ERR_NUMERIC);
  assert_int_equal(st.nonfinite, 1);
  assert_true(isfinite(st.loss));
  assert_int_equal(remat_read(g, w1, w1_after, sizeof w1_after), REMAT_OK);
  assert_memory_equal(w1_after, ones, sizeof ones);
  assert_int_equal(remat_read(g, w2, w2_after, sizeof w2_after), REMAT_OK);
  if (memcmp(w2_after, w2_before, sizeof w2_after) != 0)
    fail_msg("w2 (finite gradient) was updated by a step that reported "
             "REMAT_ERR_NUMERIC (w1 built %s): w2[0] %.9g -> %.9g",
             w1_first ? "first" : "last", w2_before[0], w2_after[0]);
  remat_graph_destroy(g);
}

/* AdamW's decoupled weight decay applies to matrices, not to vectors
 * (biases, norm scales): with zero gradients (relu of very negative
 * values), one step leaves the bias b bitwise unchanged and scales the
 * matrix w by exactly (1 - lr * wd). */
static void test_weight_decay_matrices_only(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  remat_graph *g = new_graph(rt);
  remat_tensor *x = input2(g, "x", REMAT_F32, 2, 4);
  remat_tensor *w = param2(g, "w", 4, 4);
  remat_tensor *b = param2(g, "b", 4, 0);
  remat_tensor *loss =
      remat_sum(g, remat_relu(g, remat_linear(g, x, w, b)));
  remat_optimizer adam = {.kind = REMAT_OPT_ADAMW, .lr = 0.5f,
                          .weight_decay = 0.25f};
  assert_int_equal(remat_compile(g, loss, &adam), REMAT_OK);
  float w0[16], b0[4] = {-100, -100, -100, -100}, w1[16], b1[4];
  for (int i = 0; i < 16; i++)
    w0[i] = 0.0625f * (float)(i % 4);
  assert_int_equal(remat_write(g, w, w0, sizeof w0), REMAT_OK);
  assert_int_equal(remat_write(g, b, b0, sizeof b0), REMAT_OK);
  float xs[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  assert_int_equal(remat_feed(g, x, xs, sizeof xs), REMAT_OK);
  assert_int_equal(remat_step(g, NULL), REMAT_OK);
  assert_int_equal(remat_read(g, w, w1, sizeof w1), REMAT_OK);
  assert_int_equal(remat_read(g, b, b1, sizeof b1), REMAT_OK);
  assert_memory_equal(b1, b0, sizeof b0);
  for (int i = 0; i < 16; i++)
    assert_true(w1[i] == w0[i] - 0.5f * (0.25f * w0[i]));
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* The NaN in the very last element of a gradient: w1 is [1,4], x's second
 * row ends in -Inf, relu(-Inf) = 0 keeps the loss finite, and dW1[0][3] =
 * 0 * -Inf is the only NaN. The check must read every element. */
static void test_nonfinite_last_gradient_element(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(1);
  remat_graph *g = new_graph(rt);
  remat_tensor *x = input2(g, "x", REMAT_F32, 2, 4);
  remat_tensor *w1 = param2(g, "w1", 1, 4);
  remat_tensor *loss =
      remat_sum(g, remat_relu(g, remat_linear(g, x, w1, NULL)));
  remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.01f};
  assert_int_equal(remat_compile(g, loss, &sgd), REMAT_OK);
  float ones[4] = {1, 1, 1, 1}, after[4], grad[4];
  assert_int_equal(remat_write(g, w1, ones, sizeof ones), REMAT_OK);
  float bad_x[8] = {1, 2, 3, 4, 0, 0, 0, -INFINITY};
  assert_int_equal(remat_feed(g, x, bad_x, sizeof bad_x), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(g, &st), REMAT_ERR_NUMERIC);
  assert_true(isfinite(st.loss));
  assert_int_equal(remat_read_grad(g, w1, grad, sizeof grad), REMAT_OK);
  for (int i = 0; i < 3; i++)
    assert_true(isfinite(grad[i]));
  assert_true(isnan(grad[3]));
  assert_int_equal(remat_read(g, w1, after, sizeof after), REMAT_OK);
  assert_memory_equal(after, ones, sizeof ones);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* A NaN gradient in one parameter with a finite loss: relu(-Inf) = 0
 * hides the Inf from the loss, and its backward gives 0 * -Inf = NaN in
 * w1's gradient. No parameter may change, w2 (finite gradient) included:
 * the update is all or nothing, whatever order the updates run in. */
static void test_nonfinite_gradient_updates_nothing(void **state) {
  (void)state;
  remat_runtime *rt = new_runtime(2);
  nonfinite_gradient_step(rt, true);
  nonfinite_gradient_step(rt, false);
  remat_runtime_destroy(rt);
}

/* ---- several runtimes and graphs at once ---- */

static void test_runtimes_and_graphs_coexist(void **state) {
  (void)state;
  enum { RUNTIMES = 3, GRAPHS = 3 };
  const remat_gpt_config cfg = {.layers = 1, .d_model = 8, .heads = 2,
                                .seq = 4, .batch = 2, .vocab = 5};
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  remat_runtime *rts[RUNTIMES];
  remat_graph *gs[RUNTIMES][GRAPHS];
  remat_gpt ms[RUNTIMES][GRAPHS];
  int32_t tokens[8], targets[8];
  fixture_batch(&cfg, tokens, targets, 3);
  for (int r = 0; r < RUNTIMES; r++) {
    rts[r] = new_runtime(1 + r % 2);
    for (int k = 0; k < GRAPHS; k++) {
      gs[r][k] = new_graph(rts[r]);
      assert_int_equal(remat_graph_seed(gs[r][k], (uint64_t)k), REMAT_OK);
      assert_int_equal(remat_gpt_build(gs[r][k], &cfg, &ms[r][k]), REMAT_OK);
      assert_int_equal(remat_compile(gs[r][k], ms[r][k].loss, &opt), REMAT_OK);
      assert_int_equal(remat_feed(gs[r][k], ms[r][k].tokens, tokens,
                                  sizeof tokens),
                       REMAT_OK);
      assert_int_equal(remat_feed(gs[r][k], ms[r][k].targets, targets,
                                  sizeof targets),
                       REMAT_OK);
    }
  }
  /* Interleaved steps: graph k gives the same losses on every runtime
   * (any thread count), and different seeds give different losses. */
  for (int step = 0; step < 3; step++) {
    float loss[RUNTIMES][GRAPHS];
    for (int k = 0; k < GRAPHS; k++)
      for (int r = 0; r < RUNTIMES; r++) {
        remat_step_stats st = {.size = sizeof st};
        assert_int_equal(remat_step(gs[r][k], &st), REMAT_OK);
        loss[r][k] = st.loss;
      }
    for (int k = 0; k < GRAPHS; k++)
      for (int r = 1; r < RUNTIMES; r++)
        assert_memory_equal(&loss[r][k], &loss[0][k], sizeof(float));
    assert_true(loss[0][0] != loss[0][1]);
  }
  /* Graphs may go in any order, each before its runtime. */
  for (int r = RUNTIMES - 1; r >= 0; r--) {
    for (int k = 0; k < GRAPHS; k++)
      remat_graph_destroy(gs[r][(k + r) % GRAPHS]);
    remat_runtime_destroy(rts[r]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_null_runtime_and_graph),
      cmocka_unit_test(test_versions_agree),
      cmocka_unit_test(test_null_graph_builders),
      cmocka_unit_test(test_null_graph_run),
      cmocka_unit_test(test_null_tensor_and_out),
      cmocka_unit_test(test_null_parse_and_policy),
      cmocka_unit_test(test_destroy_null_is_noop),
      cmocka_unit_test(test_status_strings),
      cmocka_unit_test(test_last_error_is_per_thread),
      cmocka_unit_test(test_bad_config_fields),
      cmocka_unit_test(test_tensor_of_another_graph),
      cmocka_unit_test(test_calls_before_compile),
      cmocka_unit_test(test_calls_after_compile),
      cmocka_unit_test(test_regions_out_of_order),
      cmocka_unit_test(test_bad_compile_arguments),
      cmocka_unit_test(test_feeds_and_reads),
      cmocka_unit_test(test_forward_and_step_graph_kinds),
      cmocka_unit_test(test_policy_constructor_errors),
      cmocka_unit_test(test_policy_parse_errors),
      cmocka_unit_test(test_policies_in_regions),
      cmocka_unit_test(test_nonfinite_loss_leaves_params),
      cmocka_unit_test(test_nonfinite_gradient_updates_nothing),
      cmocka_unit_test(test_nonfinite_last_gradient_element),
      cmocka_unit_test(test_weight_decay_matrices_only),
      cmocka_unit_test(test_runtimes_and_graphs_coexist),
      cmocka_unit_test(test_const_handles),
      cmocka_unit_test(test_graph_error_per_graph),
      cmocka_unit_test(test_step_stats_bigger_size),
      cmocka_unit_test(test_step_stats_too_small),
      cmocka_unit_test(test_step_stats_write_fields_that_fit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
