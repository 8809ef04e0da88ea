/* Tests of remat_cancel and remat_uncancel: a cancel during the forward,
 * during the backward (a recompute too) and at the update gate of a step
 * (or of a micro-step, or of a forward run) returns REMAT_ERR_CANCELLED
 * and changes no parameter, AdamW moment, gradient sum or counter, and after
 * remat_uncancel the runs go on bitwise as a graph never cancelled; a
 * cancel after the gate lets the update finish whole; a cancelled idle
 * graph refuses its next runs at once until remat_uncancel; and a cancel
 * from another thread stops a training loop (this group runs under
 * ThreadSanitizer too). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "runtime/compile/lowering.h"
#include "runtime/exec/tasks.h"
#include "remat_gpt.h"
#include "runtime/internal.h"
#include "tmpdir.h"

enum { ROWS = 8, IN = 16, HIDDEN = 32, CLASSES = 5, CAP = 16384 };

typedef struct mlp {
  remat_graph *g;
  remat_tensor *x, *t, *logits, *loss;
} mlp;

static remat_runtime *rt;

/* x[ROWS,IN] -> linear -> gelu -> linear -> cross entropy, AdamW; or, for
 * inference, the logits kept and no loss. */
static mlp build(bool train) {
  mlp m;
  assert_int_equal(remat_graph_create(rt, &m.g), REMAT_OK);
  assert_int_equal(remat_graph_seed(m.g, 5), REMAT_OK);
  const int64_t xd[] = {ROWS, IN}, td[] = {ROWS}, w1d[] = {HIDDEN, IN},
                b1d[] = {HIDDEN}, w2d[] = {CLASSES, HIDDEN};
  m.x = remat_input(m.g, "x", REMAT_F32, 2, xd);
  m.t = remat_input(m.g, "t", REMAT_I32, 1, td);
  remat_tensor *w1 = remat_param(m.g, "w1", 2, w1d, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *b1 = remat_param(m.g, "b1", 1, b1d, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *w2 = remat_param(m.g, "w2", 2, w2d, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *h =
      remat_gelu(m.g, remat_linear(m.g, m.x, w1, b1), REMAT_GELU_TANH);
  m.logits = remat_linear(m.g, h, w2, NULL);
  m.loss = remat_cross_entropy(m.g, m.logits, m.t);
  assert_non_null(m.loss);
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 0.01f,
                         .weight_decay = 0.1f};
  if (!train)
    assert_int_equal(remat_keep(m.g, m.logits), REMAT_OK);
  assert_int_equal(
      remat_compile(m.g, train ? m.loss : NULL, train ? &opt : NULL),
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

/* Every parameter of g, concatenated, into out; returns the count. */
static int64_t params_of(remat_graph *g, float *out) {
  int64_t at = 0;
  for (int i = 0; i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    int64_t n = remat_tensor_numel(p);
    assert_true(at + n <= CAP);
    assert_int_equal(remat_read(g, p, out + at, (size_t)n * 4), REMAT_OK);
    at += n;
  }
  return at;
}

static void assert_same_params(remat_graph *a, remat_graph *b) {
  static float pa[CAP], pb[CAP];
  int64_t n = params_of(a, pa);
  assert_int_equal(params_of(b, pb), n);
  assert_memory_equal(pa, pb, (size_t)n * 4);
}

/* The bytes of a checkpoint of g (parameters, AdamW moments, the update
 * counter), in a malloc'ed buffer. */
static char *checkpoint_of(remat_graph *g, const char *name, long *size) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  assert_int_equal(remat_save_checkpoint(g, path, NULL, NULL, 0), REMAT_OK);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *bytes = malloc((size_t)*size);
  assert_non_null(bytes);
  assert_int_equal(fread(bytes, 1, (size_t)*size, f), (size_t)*size);
  fclose(f);
  return bytes;
}

/* ---- cancelling at a chosen point: the task hook ---- */

static const remat_graph *_Atomic hook_graph;
static _Atomic int hook_kind = -1;
static _Atomic int hook_calls; /* tasks of hook_kind that saw the hook */

static void cancel_at_kind(const remat_graph *g, int kind) {
  if (g != atomic_load(&hook_graph) || kind != atomic_load(&hook_kind))
    return;
  atomic_fetch_add(&hook_calls, 1);
  remat_cancel((remat_graph *)g);
}

static void cancel_at(const mlp *m, knode_kind kind) {
  atomic_store(&hook_calls, 0);
  atomic_store(&hook_kind, (int)kind);
  atomic_store(&hook_graph, m->g);
}

static void no_hook(void) {
  atomic_store(&hook_graph, NULL);
  atomic_store(&hook_kind, -1);
}

static const char *const run_cancelled_msg =
    "remat_step: cancelled by remat_cancel at a task boundary before any "
    "update: no parameter, moment, gradient sum or counter was changed "
    "(remat_uncancel clears the flag)";

/* A step cancelled at a task of `kind` fails, changes no byte of the
 * checkpoint, and after remat_uncancel the training goes on as `ref`'s,
 * which was never cancelled. */
static void check_step_cancelled_at(knode_kind kind) {
  mlp m = build(true), ref = build(true);
  feed(&m, 0);
  feed(&ref, 0);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  assert_int_equal(remat_step(ref.g, NULL), REMAT_OK);
  long before_size, after_size;
  char *before = checkpoint_of(m.g, "before", &before_size);
  feed(&m, 1);
  cancel_at(&m, kind);
  assert_int_equal(remat_step(m.g, NULL), REMAT_ERR_CANCELLED);
  no_hook();
  assert_string_equal(remat_last_error(), run_cancelled_msg);
  assert_true(atomic_load(&hook_calls) >= 1);
  assert_int_equal(remat_cancelled(m.g), 1);
  char *after = checkpoint_of(m.g, "after", &after_size);
  assert_int_equal(after_size, before_size);
  assert_memory_equal(before, after, (size_t)before_size);
  free(before);
  free(after);
  /* The flag stays: the next run returns at once. */
  assert_int_equal(remat_step(m.g, NULL), REMAT_ERR_CANCELLED);
  assert_string_equal(remat_last_error(),
                      "remat_step: the graph is cancelled (remat_cancel): "
                      "nothing was run; call remat_uncancel to run it "
                      "again");
  assert_int_equal(remat_uncancel(m.g), REMAT_OK);
  assert_int_equal(remat_cancelled(m.g), 0);
  for (int batch = 1; batch < 4; batch++) {
    feed(&m, batch);
    feed(&ref, batch);
    remat_step_stats a = {.size = sizeof a}, b = {.size = sizeof b};
    assert_int_equal(remat_step(m.g, &a), REMAT_OK);
    assert_int_equal(remat_step(ref.g, &b), REMAT_OK);
    assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
    assert_same_params(m.g, ref.g);
  }
  remat_graph_destroy(m.g);
  remat_graph_destroy(ref.g);
}

static void test_cancel_in_forward(void **state) {
  (void)state;
  check_step_cancelled_at(KNODE_FORWARD);
}

static void test_cancel_in_backward(void **state) {
  (void)state;
  check_step_cancelled_at(KNODE_BACKWARD);
}

static void test_cancel_at_gate(void **state) {
  (void)state;
  check_step_cancelled_at(KNODE_GATE);
}

/* A cancel that comes after the gate (from an update task) lets the
 * update finish whole: the step succeeds as the reference's does, and
 * the flag refuses the next one. */
static void test_cancel_after_gate(void **state) {
  (void)state;
  mlp m = build(true), ref = build(true);
  feed(&m, 0);
  feed(&ref, 0);
  cancel_at(&m, KNODE_UPDATE);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  no_hook();
  assert_true(atomic_load(&hook_calls) >= 1);
  assert_int_equal(remat_step(ref.g, NULL), REMAT_OK);
  assert_same_params(m.g, ref.g);
  assert_int_equal(remat_step(m.g, NULL), REMAT_ERR_CANCELLED);
  assert_same_params(m.g, ref.g);
  remat_graph_destroy(m.g);
  remat_graph_destroy(ref.g);
}

/* A micro-step cancelled in its backward adds nothing to the sums: the
 * update after it averages the same micro-steps as the reference's. */
static void test_cancel_accumulate(void **state) {
  (void)state;
  mlp m = build(true), ref = build(true);
  feed(&m, 0);
  feed(&ref, 0);
  assert_int_equal(remat_accumulate(m.g, NULL), REMAT_OK);
  assert_int_equal(remat_accumulate(ref.g, NULL), REMAT_OK);
  feed(&m, 1);
  cancel_at(&m, KNODE_BACKWARD);
  assert_int_equal(remat_accumulate(m.g, NULL), REMAT_ERR_CANCELLED);
  no_hook();
  assert_string_equal(remat_last_error(),
                      "remat_accumulate: cancelled by remat_cancel at a "
                      "task boundary before any update: no parameter, "
                      "moment, gradient sum or counter was changed "
                      "(remat_uncancel clears the flag)");
  cancel_at(&m, KNODE_GATE); /* the micro-step's own gate */
  assert_int_equal(remat_uncancel(m.g), REMAT_OK);
  assert_int_equal(remat_accumulate(m.g, NULL), REMAT_ERR_CANCELLED);
  no_hook();
  assert_int_equal(remat_uncancel(m.g), REMAT_OK);
  feed(&ref, 1);
  remat_step_stats a = {.size = sizeof a}, b = {.size = sizeof b};
  assert_int_equal(remat_step(m.g, &a), REMAT_OK);
  assert_int_equal(remat_step(ref.g, &b), REMAT_OK);
  assert_int_equal(a.accumulated, 2);
  assert_int_equal(b.accumulated, 2);
  assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
  assert_same_params(m.g, ref.g);
  remat_graph_destroy(m.g);
  remat_graph_destroy(ref.g);
}

/* A forward run cancelled midway; the next one after remat_uncancel
 * computes what an uncancelled graph's does. */
static void test_cancel_forward_run(void **state) {
  (void)state;
  mlp m = build(false), ref = build(false);
  feed(&m, 2);
  feed(&ref, 2);
  cancel_at(&m, KNODE_FORWARD);
  assert_int_equal(remat_forward(m.g, NULL), REMAT_ERR_CANCELLED);
  no_hook();
  assert_int_equal(remat_uncancel(m.g), REMAT_OK);
  float a[ROWS * CLASSES], b[ROWS * CLASSES];
  assert_int_equal(remat_forward(m.g, NULL), REMAT_OK);
  assert_int_equal(remat_forward(ref.g, NULL), REMAT_OK);
  assert_int_equal(remat_read(m.g, m.logits, a, sizeof a), REMAT_OK);
  assert_int_equal(remat_read(ref.g, ref.logits, b, sizeof b), REMAT_OK);
  assert_memory_equal(a, b, sizeof a);
  remat_graph_destroy(m.g);
  remat_graph_destroy(ref.g);
}

/* An idle graph cancelled: each kind of run refuses at once, feeds and
 * reads still work; remat_uncancel lets them run. NULL is refused. */
static void test_cancel_idle(void **state) {
  (void)state;
  mlp m = build(true), f = build(false);
  assert_int_equal(remat_cancel(m.g), REMAT_OK);
  assert_int_equal(remat_cancel(f.g), REMAT_OK);
  feed(&m, 0);
  assert_int_equal(remat_step(m.g, NULL), REMAT_ERR_CANCELLED);
  assert_int_equal(remat_accumulate(m.g, NULL), REMAT_ERR_CANCELLED);
  assert_string_equal(remat_last_error(),
                      "remat_accumulate: the graph is cancelled "
                      "(remat_cancel): nothing was run; call "
                      "remat_uncancel to run it again");
  assert_string_equal(remat_graph_error(m.g), remat_last_error());
  assert_int_equal(remat_forward(f.g, NULL), REMAT_ERR_CANCELLED);
  assert_int_equal(remat_uncancel(f.g), REMAT_OK);
  assert_int_equal(remat_uncancel(f.g), REMAT_OK);
  feed(&f, 0);
  assert_int_equal(remat_forward(f.g, NULL), REMAT_OK);
  assert_int_equal(remat_uncancel(m.g), REMAT_OK);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  assert_int_equal(remat_cancel(NULL), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(), "remat_cancel: graph is NULL");
  assert_int_equal(remat_uncancel(NULL), REMAT_ERR_INVALID_ARG);
  assert_int_equal(remat_cancelled(NULL), 0);
  remat_graph_destroy(m.g);
  remat_graph_destroy(f.g);
}

/* ---- from another thread ---- */

typedef struct canceller {
  remat_graph *g;
  _Atomic int steps_done;
} canceller;

static void *cancel_later(void *arg) {
  canceller *c = arg;
  while (atomic_load(&c->steps_done) < 3)
    sched_yield();
  remat_cancel(c->g);
  return NULL;
}

/* A training loop stops with REMAT_ERR_CANCELLED once another thread
 * cancels; its parameters are those of the same number of steps done by
 * a graph never cancelled. */
static void test_cancel_from_thread(void **state) {
  (void)state;
  mlp m = build(true), ref = build(true);
  canceller c = {.g = m.g};
  atomic_init(&c.steps_done, 0);
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, cancel_later, &c), 0);
  int steps = 0;
  remat_status s = REMAT_OK;
  while (s == REMAT_OK && steps < 100000) {
    feed(&m, steps);
    s = remat_step(m.g, NULL);
    if (s == REMAT_OK)
      atomic_store(&c.steps_done, ++steps);
  }
  pthread_join(thread, NULL);
  assert_int_equal(s, REMAT_ERR_CANCELLED);
  assert_true(steps >= 3);
  for (int i = 0; i < steps; i++) {
    feed(&ref, i);
    assert_int_equal(remat_step(ref.g, NULL), REMAT_OK);
  }
  assert_same_params(m.g, ref.g);
  remat_graph_destroy(m.g);
  remat_graph_destroy(ref.g);
}

/* Under nothing_saveable, a tiny GPT's backward recomputes its blocks: a
 * cancel in a recompute task changes nothing either. */
static void test_cancel_in_recompute(void **state) {
  (void)state;
  remat_config cfg = {.num_threads = 2, .policy = "nothing_saveable",
                      .set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY};
  remat_runtime *own;
  assert_int_equal(remat_runtime_create(&cfg, &own), REMAT_OK);
  const remat_gpt_config gc = {.layers = 2, .d_model = 16, .heads = 2,
                               .seq = 8, .batch = 2, .vocab = 11};
  remat_graph *g[2];
  remat_gpt m[2];
  int32_t ids[16];
  for (int i = 0; i < 16; i++)
    ids[i] = (i * 3) % 11;
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 0.01f};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(remat_graph_create(own, &g[k]), REMAT_OK);
    assert_int_equal(remat_gpt_build(g[k], &gc, &m[k]), REMAT_OK);
    assert_int_equal(remat_compile(g[k], m[k].loss, &opt), REMAT_OK);
    assert_int_equal(remat_feed(g[k], m[k].tokens, ids, sizeof ids),
                     REMAT_OK);
    assert_int_equal(remat_feed(g[k], m[k].targets, ids, sizeof ids),
                     REMAT_OK);
  }
  mlp cancelled = {.g = g[0]};
  cancel_at(&cancelled, KNODE_RECOMPUTE);
  assert_int_equal(remat_step(g[0], NULL), REMAT_ERR_CANCELLED);
  no_hook();
  assert_true(atomic_load(&hook_calls) >= 1);
  assert_int_equal(remat_uncancel(g[0]), REMAT_OK);
  for (int step = 0; step < 2; step++) {
    remat_step_stats a = {.size = sizeof a}, b = {.size = sizeof b};
    assert_int_equal(remat_step(g[0], &a), REMAT_OK);
    assert_int_equal(remat_step(g[1], &b), REMAT_OK);
    assert_true(a.recompute_flops > 0.0);
    assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
    assert_same_params(g[0], g[1]);
  }
  remat_graph_destroy(g[0]);
  remat_graph_destroy(g[1]);
  remat_runtime_destroy(own);
}

static int group_setup(void **state) {
  remat_config cfg = {.num_threads = 2, .set = REMAT_SET_NUM_THREADS};
  if (remat_runtime_create(&cfg, &rt) != REMAT_OK)
    return -1;
  remat__task_hook = cancel_at_kind;
  return make_dir(state);
}

static int group_teardown(void **state) {
  remat__task_hook = NULL;
  remat_runtime_destroy(rt);
  return remove_dir(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cancel_in_forward),
      cmocka_unit_test(test_cancel_in_backward),
      cmocka_unit_test(test_cancel_at_gate),
      cmocka_unit_test(test_cancel_after_gate),
      cmocka_unit_test(test_cancel_accumulate),
      cmocka_unit_test(test_cancel_forward_run),
      cmocka_unit_test(test_cancel_idle),
      cmocka_unit_test(test_cancel_from_thread),
      cmocka_unit_test(test_cancel_in_recompute),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
