/* Allocation-failure injection: the N-th allocation fails, for every N, in
 * runtime creation, graph building, compile and a step. Each call returns
 * REMAT_ERR_OUT_OF_MEMORY with a message, nothing crashes or leaks (run it
 * under AddressSanitizer), a failed step leaves parameters and optimizer
 * state as they were, and the next step succeeds. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gpt_fixture.h"
#include "base/alloc.h"

static const remat_gpt_config tiny = {
    .layers = 2, .d_model = 16, .heads = 2, .seq = 8, .batch = 2, .vocab = 7};
static const remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};

static remat_runtime *runtime(void) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY,
                     .num_threads = 1, .policy = "nothing_saveable"};
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  return rt;
}

/* Ends an injected call: true when the call finished without reaching the
 * failing allocation. */
static bool finished(int64_t n, remat_status s) {
  int64_t count = remat__alloc_count();
  remat__alloc_fail_after(0);
  if (count < n) {
    assert_int_equal(s, REMAT_OK);
    return true;
  }
  if (s != REMAT_ERR_OUT_OF_MEMORY)
    fail_msg("allocation %lld failed but the call returned %s (%s)",
             (long long)n, remat_status_string(s), remat_last_error());
  if (strlen(remat_last_error()) == 0)
    fail_msg("allocation %lld failed: no message", (long long)n);
  return false;
}

static void test_runtime_creation(void **state) {
  (void)state;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 2};
  int64_t n = 1;
  for (;; n++) {
    remat_runtime *rt = NULL;
    remat__alloc_fail_after(n);
    remat_status s = remat_runtime_create(&rc, &rt);
    bool done = finished(n, s);
    if (!done)
      assert_null(rt);
    remat_runtime_destroy(rt);
    if (done)
      break;
  }
  assert_true(n > 3);
}

static void test_graph_building(void **state) {
  (void)state;
  remat_runtime *rt = runtime();
  int64_t n = 1;
  for (;; n++) {
    remat_graph *g = NULL;
    remat_gpt m;
    remat__alloc_fail_after(n);
    remat_status s = remat_graph_create(rt, &g);
    if (s == REMAT_OK)
      s = remat_gpt_build(g, &tiny, &m);
    bool done = finished(n, s);
    if (!done && g != NULL)
      assert_int_equal(remat_graph_status(g), REMAT_ERR_OUT_OF_MEMORY);
    remat_graph_destroy(g);
    if (done)
      break;
  }
  assert_true(n > 20);
  remat_runtime_destroy(rt);
}

static void test_compile(void **state) {
  (void)state;
  remat_runtime *rt = runtime();
  int64_t n = 1;
  for (;; n++) {
    remat_graph *g = NULL;
    remat_gpt m;
    assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
    assert_int_equal(remat_gpt_build(g, &tiny, &m), REMAT_OK);
    remat__alloc_fail_after(n);
    remat_status s = remat_compile(g, m.loss, &adamw);
    bool done = finished(n, s);
    remat_graph_destroy(g);
    if (done)
      break;
  }
  assert_true(n > 50);
  remat_runtime_destroy(rt);
}


/* One thread: the run follows the plan's order, so every block it needs is
 * reserved before any task runs; a cold step and a warm one. */
static void test_step(void **state) {
  (void)state;
  int64_t n = 1;
  for (int warm = 0; warm < 2; warm++)
    for (n = 1;; n++) {
      fixture f;
      assert_int_equal(fixture_open(&f, &tiny, 1, "nothing_saveable", 0, &adamw),
                       REMAT_OK);
      remat_step_stats st;
      for (int i = 0; i < warm; i++)
        assert_int_equal(remat_step(f.g, &st), REMAT_OK);
      size_t count;
      float *before = fixture_snapshot(f.g, &count);
      remat__alloc_fail_after(n);
      remat_status s = remat_step(f.g, &st);
      bool done = finished(n, s);
      if (!done) {
        size_t again;
        float *after = fixture_snapshot(f.g, &again);
        assert_memory_equal(before, after, count * sizeof *before);
        free(after);
        /* The next step succeeds and does update. */
        assert_int_equal(remat_step(f.g, &st), REMAT_OK);
        float *updated = fixture_snapshot(f.g, &again);
        assert_true(memcmp(before, updated, count * sizeof *before) != 0);
        free(updated);
      }
      free(before);
      fixture_close(&f);
      if (done)
        break;
    }
}

/* Two threads: a failing allocation may fall inside the run (if the run
 * needs more blocks at once than reserved); updates wait behind a gate that
 * follows every other task, so parameters are still untouched. */
static void test_step_two_threads(void **state) {
  (void)state;
  for (int64_t n = 1;; n++) {
    fixture f;
    assert_int_equal(fixture_open(&f, &tiny, 2, "nothing_saveable", 0, &adamw),
                     REMAT_OK);
    remat_step_stats st;
    size_t count, again;
    float *before = fixture_snapshot(f.g, &count);
    remat__alloc_fail_after(n);
    remat_status s = remat_step(f.g, &st);
    bool done = finished(n, s);
    if (!done) {
      float *after = fixture_snapshot(f.g, &again);
      assert_memory_equal(before, after, count * sizeof *before);
      free(after);
      assert_int_equal(remat_step(f.g, &st), REMAT_OK);
    }
    free(before);
    fixture_close(&f);
    if (done)
      break;
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runtime_creation),
      cmocka_unit_test(test_graph_building),
      cmocka_unit_test(test_compile),
      cmocka_unit_test(test_step),
      cmocka_unit_test(test_step_two_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
