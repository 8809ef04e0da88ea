/* Tests of the benchmark switch REMAT_BENCH_PER_REGION (runtime/internal.h):
 * a runtime created with it set plans a budget with the four built-in
 * policies alone, one per region, each region saving exactly what that
 * policy saves on its own; without it the same budgets get per-tensor
 * save sets in some regions. bench_budget --compare-per-region times the
 * two against each other. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpt_fixture.h"

static const remat_gpt_config four = {
    .layers = 4, .d_model = 32, .heads = 4, .seq = 16, .batch = 2, .vocab = 13};
static const remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-3f};

static const char *const builtins[4] = {
    "everything_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
    "nothing_saveable"};

#define MAX_TENSORS 1024
#define BUDGETS 12

/* A runtime of one thread (no replay: the plan is the dynamic program's)
 * that reads no configuration from the environment; the REMAT_BENCH_
 * switches are read all the same. */
static void open_plain(fixture *f, const char *policy, int64_t budget,
                       bool per_region) {
  remat_config rc = {.set = REMAT_SET_NO_ENV | REMAT_SET_NUM_THREADS |
                            REMAT_SET_POLICY | REMAT_SET_MEMORY_BUDGET,
                     .num_threads = 1,
                     .policy = policy,
                     .memory_budget = budget};
  if (per_region)
    setenv("REMAT_BENCH_PER_REGION", "1", 1);
  remat_status s = fixture_open_config(f, &four, &rc, &adamw);
  unsetenv("REMAT_BENCH_PER_REGION");
  if (s != REMAT_OK)
    fail_msg("open %s at %lld: %s", policy, (long long)budget,
             remat_last_error());
}

static int64_t predicted_peak(fixture *f) {
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(f->g, &st), REMAT_OK);
  return st.predicted_peak_bytes;
}

static int builtin_index(const char *policy) {
  for (int c = 0; c < 4; c++)
    if (strcmp(policy, builtins[c]) == 0)
      return c;
  return -1;
}

/* Over twelve budgets from the peak of saving nothing to that of saving
 * everything: with the switch, every tensor a region decides is saved
 * exactly when that region's built-in policy, the model's only policy,
 * saves it, the predicted peak stays within the budget, and some budget
 * mixes two policies (the per-region program, not one policy for all);
 * without it, some budgets put a region on a per-tensor set. */
static void test_per_region_switch(void **state) {
  (void)state;
  static int saved_by[4][MAX_TENSORS];
  int64_t lo = 0, hi = 0;
  for (int c = 0; c < 4; c++) {
    fixture f;
    open_plain(&f, builtins[c], 0, false);
    int n = remat_num_tensors(f.g);
    assert_true(n <= MAX_TENSORS);
    for (int i = 0; i < n; i++) {
      remat_tensor_plan tp;
      assert_int_equal(
          remat_tensor_plan_of(f.g, remat_tensor_at(f.g, i), &tp), REMAT_OK);
      saved_by[c][i] = tp.saved;
    }
    if (c == 0)
      hi = predicted_peak(&f);
    if (c == 3)
      lo = predicted_peak(&f);
    fixture_close(&f);
  }
  assert_true(hi > lo && lo > 0);

  int on_sets = 0, mixed = 0;
  for (int k = 0; k < BUDGETS; k++) {
    int64_t budget = lo + (hi - lo) * k / (BUDGETS - 1);
    fixture per, full;
    open_plain(&per, "auto", budget, true);
    open_plain(&full, "auto", budget, false);
    int used[4] = {0}, kinds = 0, sets = 0;
    for (int i = 0; i < remat_num_tensors(per.g); i++) {
      remat_tensor_plan tp, tf;
      assert_int_equal(
          remat_tensor_plan_of(per.g, remat_tensor_at(per.g, i), &tp),
          REMAT_OK);
      assert_int_equal(
          remat_tensor_plan_of(full.g, remat_tensor_at(full.g, i), &tf),
          REMAT_OK);
      sets += strncmp(tf.policy, "auto_tensors:", 13) == 0;
      if (tp.region < 0)
        continue;
      assert_int_equal(tp.source, REMAT_POLICY_BUDGET);
      int c = builtin_index(tp.policy);
      if (c < 0)
        fail_msg("budget %lld: region %d of the per-region plan has policy "
                 "'%s', not a built-in one",
                 (long long)budget, tp.region, tp.policy);
      if (tp.saved != saved_by[c][i])
        fail_msg("budget %lld: tensor '%s' of region %d (%s) saved %d, "
                 "%s alone saves it %d",
                 (long long)budget, remat_tensor_name(remat_tensor_at(per.g, i)),
                 tp.region, tp.policy, tp.saved, builtins[c], saved_by[c][i]);
      kinds += !used[c]++;
    }
    int64_t peak = predicted_peak(&per);
    if (peak > budget)
      fail_msg("budget %lld: the per-region plan's predicted peak is %lld",
               (long long)budget, (long long)peak);
    mixed += kinds > 1;
    on_sets += sets > 0;
    fixture_close(&per);
    fixture_close(&full);
  }
  assert_true(mixed >= 1);
  assert_true(on_sets >= 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_per_region_switch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
