/* Allocation-failure injection: the N-th allocation fails, for every N from
 * 1 to the number a clean run of the phase makes, in runtime creation, graph
 * building, compile, a cold step, a traced warm step and a two-thread step.
 * Each injected call returns REMAT_ERR_OUT_OF_MEMORY with a message, nothing
 * crashes or leaks (run it under AddressSanitizer), a failed step leaves
 * parameters and optimizer state as they were, and the next step succeeds.
 * An untraced warm step allocates nothing, so it cannot fail for memory. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gpt_fixture.h"
#include "tmpdir.h"
#include "base/alloc.h"

static const remat_gpt_config tiny = {
    .layers = 2, .d_model = 16, .heads = 2, .seq = 8, .batch = 2, .vocab = 7};
static const remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};

/* One phase run with the n-th allocation failing (n = 0: a clean run); it
 * checks what the phase promises on failure, stores in *made the
 * allocations the injected call made and returns the call's status. */
typedef remat_status (*phase_fn)(void *ctx, int64_t n, int64_t *made);

static remat_runtime *runtime(void) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY,
                     .num_threads = 1, .policy = "nothing_saveable"};
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  return rt;
}

/* Resets the countdown; returns the allocations made since it was set. */
static int64_t disarm(void) {
  int64_t count = remat__alloc_count();
  remat__alloc_fail_after(0);
  return count;
}

/* A failed injected call: out of memory, with a message that starts with
 * `prefix` (and is not empty). */
static void expect_oom(int64_t n, remat_status s, const char *prefix) {
  const char *msg = remat_last_error();
  if (s != REMAT_ERR_OUT_OF_MEMORY)
    fail_msg("allocation %lld failed but the call returned %s (%s)",
             (long long)n, remat_status_string(s), msg);
  if (msg[0] == '\0' || strncmp(msg, prefix, strlen(prefix)) != 0)
    fail_msg("allocation %lld failed: message '%s', expected one starting '%s'",
             (long long)n, msg, prefix);
}

/* Runs the phase clean (it makes at least `at_least` allocations), then
 * with each allocation N of the clean run failing in turn: every one is
 * reached and fails the call; with N one past them the call succeeds.
 * Returns the clean run's count. */
static int64_t every_allocation(phase_fn phase, void *ctx, int64_t at_least) {
  int64_t clean, made;
  assert_int_equal(phase(ctx, 0, &clean), REMAT_OK);
  if (clean < at_least)
    fail_msg("a clean run made %lld allocations, expected at least %lld",
             (long long)clean, (long long)at_least);
  for (int64_t n = 1; n <= clean; n++) {
    remat_status s = phase(ctx, n, &made);
    if (made < n)
      fail_msg("allocation %lld of %lld was not reached: the call made %lld",
               (long long)n, (long long)clean, (long long)made);
    if (s != REMAT_ERR_OUT_OF_MEMORY)
      fail_msg("allocation %lld failed but the call returned %s",
               (long long)n, remat_status_string(s));
  }
  assert_int_equal(phase(ctx, clean + 1, &made), REMAT_OK);
  assert_int_equal(made, clean);
  return clean;
}

static remat_status creation_phase(void *ctx, int64_t n, int64_t *made) {
  (void)ctx;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 2};
  remat_runtime *rt = NULL;
  remat__alloc_fail_after(n);
  remat_status s = remat_runtime_create(&rc, &rt);
  *made = disarm();
  if (s != REMAT_OK) {
    expect_oom(n, s, "");
    assert_null(rt);
  }
  remat_runtime_destroy(rt);
  return s;
}

static remat_status building_phase(void *ctx, int64_t n, int64_t *made) {
  remat_graph *g = NULL;
  remat_gpt m;
  remat__alloc_fail_after(n);
  remat_status s = remat_graph_create(ctx, &g);
  if (s == REMAT_OK)
    s = remat_gpt_build(g, &tiny, &m);
  *made = disarm();
  if (s != REMAT_OK) {
    expect_oom(n, s, "");
    if (g != NULL)
      assert_int_equal(remat_graph_status(g), REMAT_ERR_OUT_OF_MEMORY);
  }
  remat_graph_destroy(g);
  return s;
}

static remat_status compile_phase(void *ctx, int64_t n, int64_t *made) {
  remat_graph *g = NULL;
  remat_gpt m;
  assert_int_equal(remat_graph_create(ctx, &g), REMAT_OK);
  assert_int_equal(remat_gpt_build(g, &tiny, &m), REMAT_OK);
  remat__alloc_fail_after(n);
  remat_status s = remat_compile(g, m.loss, &adamw);
  *made = disarm();
  if (s != REMAT_OK)
    expect_oom(n, s, "");
  remat_graph_destroy(g);
  return s;
}

static void test_runtime_creation(void **state) {
  (void)state;
  every_allocation(creation_phase, NULL, 4);
}

static void test_graph_building(void **state) {
  (void)state;
  remat_runtime *rt = runtime();
  every_allocation(building_phase, rt, 21);
  remat_runtime_destroy(rt);
}

static void test_compile(void **state) {
  (void)state;
  remat_runtime *rt = runtime();
  every_allocation(compile_phase, rt, 51);
  remat_runtime_destroy(rt);
}

/* A step on a fresh fixture after `warm` clean steps. */
typedef struct step_case {
  int threads, warm;
  const char *trace_path; /* NULL: no trace */
} step_case;

static remat_status step_phase(void *ctx, int64_t n, int64_t *made) {
  const step_case *c = ctx;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_TRACE,
                     .num_threads = c->threads,
                     .policy = "nothing_saveable",
                     .trace_path = c->trace_path};
  fixture f;
  assert_int_equal(fixture_open_config(&f, &tiny, &rc, &adamw), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  for (int i = 0; i < c->warm; i++)
    assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  size_t count, again;
  float *before = fixture_snapshot(f.g, &count);
  assert_non_null(before);
  remat__alloc_fail_after(n);
  remat_status s = remat_step(f.g, &st);
  *made = disarm();
  if (s != REMAT_OK) {
    expect_oom(n, s, "remat_step: out of memory");
    float *after = fixture_snapshot(f.g, &again);
    assert_non_null(after);
    assert_memory_equal(before, after, count * sizeof *before);
    free(after);
    /* The next step succeeds and does update. */
    assert_int_equal(remat_step(f.g, &st), REMAT_OK);
    float *updated = fixture_snapshot(f.g, &again);
    assert_non_null(updated);
    assert_true(memcmp(before, updated, count * sizeof *before) != 0);
    free(updated);
  }
  free(before);
  fixture_close(&f);
  return s;
}

/* One thread: the run follows the plan's order, so every run makes the
 * same allocations (the sched pool's arrays too, on the first run; the
 * arena's reserved region and its bookkeeping: at least 3 in all). */
static void test_cold_step(void **state) {
  (void)state;
  step_case c = {.threads = 1, .warm = 0};
  every_allocation(step_phase, &c, 3);
}

/* Reservation: before a cold step's tasks run, the arena takes from the
 * system every block the plan predicts on top of the persistent ones, so
 * at one thread every tensor allocation of the step fails before any task
 * runs ("reserving"); only the scheduler's own first-run arrays (3, and
 * memory admission's state: sched/admit.c) are allocated inside the run. */
static void test_cold_step_reserves_first(void **state) {
  (void)state;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY,
                     .num_threads = 1,
                     .policy = "nothing_saveable"};
  int64_t made = 0, reserving = 0;
  for (int64_t n = 1;; n++) {
    fixture f;
    assert_int_equal(fixture_open_config(&f, &tiny, &rc, &adamw), REMAT_OK);
    remat__alloc_fail_after(n);
    remat_status s = remat_step(f.g, NULL);
    made = disarm();
    if (s == REMAT_OK) {
      fixture_close(&f);
      break;
    }
    if (strcmp(remat_last_error(), "remat_step: out of memory reserving the "
                                   "step's tensors") == 0) {
      assert_int_equal(reserving, n - 1); /* the reserving ones come first */
      reserving++;
    }
    fixture_close(&f);
  }
  if (reserving < made - 4)
    fail_msg("%lld of the cold step's %lld allocations were reserved before "
             "its tasks ran",
             (long long)reserving, (long long)made);
}

/* In steady state a step asks the system for nothing: with every
 * allocation failing it still succeeds and updates. */
static void test_warm_step_allocates_nothing(void **state) {
  (void)state;
  step_case c = {.threads = 1, .warm = 1};
  int64_t made;
  assert_int_equal(step_phase(&c, 1, &made), REMAT_OK);
  assert_int_equal(made, 0);
}

/* A warm step traced by REMAT_TRACE reuses its trace records: it
 * allocates nothing either. */
static void test_warm_traced_step(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/trace.json", dir);
  step_case c = {.threads = 1, .warm = 1, .trace_path = path};
  int64_t made;
  assert_int_equal(step_phase(&c, 1, &made), REMAT_OK);
  assert_int_equal(made, 0);
}

/* The first step that remat_trace_steps traces allocates its records and
 * the writer's scratch before any task runs: each allocation fails the
 * step cleanly (step_phase checks that no parameter changed). */
static remat_status trace_steps_phase(void *ctx, int64_t n, int64_t *made) {
  const char *path = ctx;
  fixture f;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TRACE,
                     .num_threads = 1};
  assert_int_equal(fixture_open_config(&f, &tiny, &rc, &adamw), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_int_equal(remat_trace_steps(f.g, path, 1), REMAT_OK);
  size_t count, again;
  float *before = fixture_snapshot(f.g, &count);
  remat__alloc_fail_after(n);
  remat_status s = remat_step(f.g, &st);
  *made = disarm();
  if (s != REMAT_OK) {
    expect_oom(n, s, "remat_step: out of memory for the trace");
    float *after = fixture_snapshot(f.g, &again);
    assert_memory_equal(before, after, count * sizeof *before);
    free(after);
    assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  }
  free(before);
  fixture_close(&f);
  return s;
}

static void test_trace_steps_first_step(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/steps.json", dir);
  every_allocation(trace_steps_phase, path, 3);
}

/* Traced steps hold one run's records: 16 steps of remat_trace_steps
 * allocate the records and the writer's scratch (five arrays) once, at the
 * first, and nothing after (each run is appended to the file), where
 * keeping every run's records made 29 allocations, and growing them by one
 * step 84. */
static void test_trace_steps_growth(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/growth.json", dir);
  fixture f;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TRACE,
                     .num_threads = 1};
  assert_int_equal(fixture_open_config(&f, &tiny, &rc, &adamw), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_int_equal(remat_trace_steps(f.g, path, 16), REMAT_OK);
  remat__alloc_fail_after(1000000);
  for (int i = 0; i < 16; i++) {
    assert_int_equal(remat_step(f.g, &st), REMAT_OK);
    assert_int_equal(st.trace_status, REMAT_OK);
  }
  assert_int_equal(disarm(), 5);
  /* The 17th step is not traced and allocates nothing. */
  remat__alloc_fail_after(1);
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_int_equal(disarm(), 0);
  fixture_close(&f);
}

/* The first remat_accumulate allocates the gradient sums (their bookkeeping
 * from the system; the sums themselves from the arena's reserved regions,
 * whose growth failing test_extents checks): each of its allocations fails
 * the call cleanly (no parameter changes, nothing is
 * counted as accumulated), and the next accumulation and step go on as if
 * the failed call had not been made. */
static remat_status accumulate_phase(void *ctx, int64_t n, int64_t *made) {
  (void)ctx;
  fixture f;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TRACE,
                     .num_threads = 1};
  assert_int_equal(fixture_open_config(&f, &tiny, &rc, &adamw), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  size_t count, again;
  float *before = fixture_snapshot(f.g, &count);
  remat__alloc_fail_after(n);
  remat_status s = remat_accumulate(f.g, &st);
  *made = disarm();
  if (s != REMAT_OK) {
    expect_oom(n, s, "remat_accumulate: out of memory");
    float *after = fixture_snapshot(f.g, &again);
    assert_memory_equal(before, after, count * sizeof *before);
    free(after);
    assert_int_equal(remat_accumulate(f.g, &st), REMAT_OK);
    assert_int_equal(st.accumulated, 1);
    assert_int_equal(remat_step(f.g, &st), REMAT_OK);
    assert_int_equal(st.accumulated, 2);
  }
  free(before);
  fixture_close(&f);
  return s;
}

static void test_first_accumulate(void **state) {
  (void)state;
  every_allocation(accumulate_phase, NULL, 1);
}

/* Two threads: most allocations of a cold step fall inside the run, while
 * tasks run in parallel, and how many a run makes varies from run to run.
 * Every N up to the fewest a clean run made (of three) is reached by some
 * run in at most 20 tries; each run that reaches it fails cleanly and each
 * that does not succeeds. Updates wait behind a gate that follows every
 * other task, so a failed step leaves parameters untouched. */
static void test_step_two_threads(void **state) {
  (void)state;
  step_case two = {.threads = 2};
  int64_t fewest = INT64_MAX, made;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(step_phase(&two, 0, &made), REMAT_OK);
    fewest = made < fewest ? made : fewest;
  }
  assert_true(fewest >= 3);
  for (int64_t n = 1; n <= fewest; n++) {
    int tries = 0;
    for (made = 0; made < n && tries < 20; tries++) {
      remat_status s = step_phase(&two, n, &made);
      assert_int_equal(s, made >= n ? REMAT_ERR_OUT_OF_MEMORY : REMAT_OK);
    }
    if (made < n)
      fail_msg("two threads: no run in %d reached allocation %lld", tries,
               (long long)n);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runtime_creation),
      cmocka_unit_test(test_graph_building),
      cmocka_unit_test(test_compile),
      cmocka_unit_test(test_cold_step),
      cmocka_unit_test(test_cold_step_reserves_first),
      cmocka_unit_test(test_warm_step_allocates_nothing),
      cmocka_unit_test(test_warm_traced_step),
      cmocka_unit_test(test_trace_steps_first_step),
      cmocka_unit_test(test_step_two_threads),
      cmocka_unit_test(test_first_accumulate),
      cmocka_unit_test(test_trace_steps_growth),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
