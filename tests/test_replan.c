/* Tests of re-planning a graph between its own steps (exec/replan.h):
 * after its first steps measured its kernels, a graph under a budget runs
 * the plan a fresh compile would make with those times (a trace going on
 * across it), with bitwise the losses, parameters and gradients of a
 * graph that never re-planned; room held for gradient sums stays free,
 * REMAT_BENCH_NO_REPLAN turns it off, and a block of table entries made
 * after the measurements starts with them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>
#include <cmocka.h>

#include "gpt_fixture.h"
#include "trace_read.h"
#include "runtime/exec/step_costs.h"
#include "runtime/exec/step_state.h"
#include "runtime/exec/tasks.h"

static const remat_gpt_config four = {
    .layers = 4, .d_model = 32, .heads = 4, .seq = 16, .batch = 2, .vocab = 13};
static const remat_optimizer adamw = {
    .kind = REMAT_OPT_ADAMW, .lr = 1e-2f, .weight_decay = 0.01f};

/* A runtime of one thread that reads no environment but what the test
 * sets (REMAT_PRECISION or REMAT_FUSE would change the plans). */
static void open_plain(fixture *f, const char *policy, int64_t budget) {
  remat_config rc = {.set = REMAT_SET_NO_ENV | REMAT_SET_NUM_THREADS |
                            REMAT_SET_POLICY | REMAT_SET_MEMORY_BUDGET,
                     .num_threads = 1,
                     .policy = policy,
                     .memory_budget = budget};
  if (fixture_open_config(f, &four, &rc, &adamw) != REMAT_OK)
    fail_msg("open %s: %s", policy, remat_last_error());
}

/* A budget a fifth of the way from saving nothing to saving everything. */
static int64_t fifth_budget(void) {
  fixture none, all;
  open_plain(&none, "nothing_saveable", 0);
  open_plain(&all, "everything_saveable", 0);
  int64_t lo = none.g->step->compiled.predicted.peak;
  int64_t hi = all.g->step->compiled.predicted.peak;
  fixture_close(&none);
  fixture_close(&all);
  assert_true(hi > lo && lo > 0);
  return lo + (hi - lo) / 5;
}

/* Every kernel that g's steps measure, in rt's table: layer norms at 10
 * ns a tile and the rest at 0.1 ps, below any time a tile takes, so that
 * the graph's own measurements (the least time is kept) change nothing
 * and the plan made with the table is the same on every machine: it
 * saves the norms' outputs and recomputes the linears' that the
 * roofline's plan saves (test_costs.c pins both). */
static void pin_table(remat_runtime *rt, const remat_graph *g) {
  const plan_lowering *l = &g->step->compiled.low;
  for (int32_t i = 0; i < l->nknodes; i++) {
    const plan_knode *kn = &l->knodes[i];
    if (kn->tiles <= 0)
      continue;
    op_desc d;
    op_kernel k;
    cost_key_of(l, kn, &d, &k);
    bool norm = kn->inst != NULL && kn->inst->desc.type == OP_LAYERNORM;
    assert_true(cost_table_note(&rt->costs, &d, &k, norm ? 1e-8 : 1e-13));
  }
}

/* Per tensor of g, in order: S saved, R recomputed, - neither. */
static void plan_of(const remat_graph *g, char *out, size_t len) {
  int n = remat_num_tensors(g);
  assert_true((size_t)n < len);
  for (int i = 0; i < n; i++) {
    remat_tensor_plan tp;
    assert_int_equal(remat_tensor_plan_of(g, remat_tensor_at(g, i), &tp),
                     REMAT_OK);
    out[i] = tp.saved ? 'S' : tp.recomputed ? 'R' : '-';
  }
  out[n] = '\0';
}

/* The names of the steps in a trace file, "|"-joined. */
static void trace_steps(const char *path, char *out, size_t len) {
  cJSON *doc = read_trace(path);
  const cJSON *e;
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
  out[0] = '\0';
  cJSON_ArrayForEach(e, events) {
    const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    if (cJSON_IsString(cat) && strcmp(cat->valuestring, "step") == 0 &&
        cJSON_IsString(name)) {
      size_t at = strlen(out);
      snprintf(out + at, len - at, "%s%s", at ? "|" : "", name->valuestring);
    }
  }
  cJSON_Delete(doc);
}

static void step_both(fixture *a, fixture *ref, remat_step_stats *st) {
  remat_step_stats rs = {.size = sizeof rs};
  if (remat_step(a->g, st) != REMAT_OK)
    fail_msg("step: %s", remat_graph_error(a->g));
  assert_int_equal(remat_step(ref->g, &rs), REMAT_OK);
  assert_memory_equal(&st->loss, &rs.loss, sizeof rs.loss);
}

static void assert_same_params(fixture *a, fixture *ref) {
  size_t na, nr;
  float *pa = fixture_snapshot(a->g, &na), *pr = fixture_snapshot(ref->g, &nr);
  assert_non_null(pa);
  assert_non_null(pr);
  assert_int_equal(na, nr);
  assert_memory_equal(pa, pr, na * sizeof *pa);
  assert_int_equal(fixture_grad_hash(a), fixture_grad_hash(ref));
  free(pa);
  free(pr);
}

/* After COST_STEPS steps the graph runs what a fresh compile plans with
 * the measured table, from the next step on: losses, parameters,
 * gradients and moments (the later losses) bitwise as a graph that never
 * re-planned, the budget held, and a policy name read before it still
 * readable. */
static void test_replan_takes_the_measured_plan(void **state) {
  (void)state;
  int64_t budget = fifth_budget();
  fixture a, ref;
  open_plain(&a, "auto", budget);
  open_plain(&ref, "everything_saveable", 0);
  char before[512], after[512], fresh[512];
  plan_of(a.g, before, sizeof before);
  remat_tensor_plan tp = {0};
  for (int i = 0; tp.region < 1 && i < remat_num_tensors(a.g); i++)
    assert_int_equal(remat_tensor_plan_of(a.g, remat_tensor_at(a.g, i), &tp),
                     REMAT_OK);
  assert_int_equal(tp.region, 1); /* a policy the budget named */
  const char *policy = tp.policy;
  char policy_copy[256];
  snprintf(policy_copy, sizeof policy_copy, "%s", policy);
  assert_int_equal(remat_set_lr(a.g, 5e-3f), REMAT_OK);
  assert_int_equal(remat_set_lr(ref.g, 5e-3f), REMAT_OK);
  pin_table(a.rt, a.g);
  const graph_step *first = a.g->step;
  remat_step_stats st = {.size = sizeof st};
  char dir[] = "/tmp/test_replan_XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/steps.json", dir);
  for (int k = 0; k < COST_STEPS - 1; k++) {
    if (k == COST_STEPS - 2) /* a trace of 4 steps across the re-plan */
      assert_int_equal(remat_trace_steps(a.g, path, 4), REMAT_OK);
    step_both(&a, &ref, &st);
    assert_ptr_equal(a.g->step, first);
  }
  assert_int_equal(a.g->step->state.cost_runs, COST_STEPS - 1);
  step_both(&a, &ref, &st);
  assert_ptr_not_equal(a.g->step, first); /* replaced after this step */
  plan_of(a.g, after, sizeof after);
  assert_string_not_equal(before, after);
  assert_string_equal(policy, policy_copy);
  assert_same_params(&a, &ref);
  /* a graph compiled now, with the same table, plans the same */
  remat_graph *b;
  remat_gpt mb;
  assert_int_equal(remat_graph_create(a.rt, &b), REMAT_OK);
  assert_int_equal(remat_gpt_build(b, &four, &mb), REMAT_OK);
  assert_int_equal(remat_compile(b, mb.loss, &adamw), REMAT_OK);
  plan_of(b, fresh, sizeof fresh);
  assert_string_equal(after, fresh);
  remat_graph_destroy(b);
  for (int k = 0; k < 3; k++) {
    step_both(&a, &ref, &st);
    assert_int_equal(st.trace_status, REMAT_OK);
    assert_true(st.peak_bytes <= budget);
    assert_int_equal(st.predicted_peak_bytes,
                     a.g->step->compiled.predicted.peak);
  }
  assert_same_params(&a, &ref);
  char steps[256];
  trace_steps(path, steps, sizeof steps);
  assert_string_equal(steps, "step 1 (remat_step)|step 2 (remat_step)|"
                             "step 3 (remat_step)|step 4 (remat_step)");
  remove(path);
  rmdir(dir);
  fixture_close(&a);
  fixture_close(&ref);
}

/* Room kept under the budget for memory the step does not count
 * (remat_accumulate's sums): the re-plan's peak stays under the budget
 * less it, and when no plan fits, it fails with the planner's error and
 * leaves the graph as it was. */
static void test_replan_keeps_held_room(void **state) {
  (void)state;
  int64_t budget = fifth_budget();
  fixture a;
  open_plain(&a, "auto", budget);
  pin_table(a.rt, a.g);
  const compiled_step *c = &a.g->step->compiled;
  int64_t held = (budget - c->predicted.peak) + (budget / 50);
  compile_request req = {a.g, c->loss, &c->opt, &remat__task_bodies, 0};
  compiled_step out;
  assert_int_equal(compile_replan(&req, c, held, &out), REMAT_OK);
  assert_true(out.predicted.peak <= budget - held);
  assert_true(out.predicted.peak < c->predicted.peak);
  compiled_step_free(&out);
  assert_int_equal(compile_replan(&req, c, budget - 1, &out),
                   REMAT_ERR_BUDGET);
  assert_int_equal(remat_graph_status(a.g), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(a.g, &st), REMAT_OK);
  fixture_close(&a);
}

/* REMAT_BENCH_NO_REPLAN at runtime creation: the compiled plan stays. */
static void test_no_replan_switch(void **state) {
  (void)state;
  int64_t budget = fifth_budget();
  setenv("REMAT_BENCH_NO_REPLAN", "1", 1);
  fixture a;
  open_plain(&a, "auto", budget);
  unsetenv("REMAT_BENCH_NO_REPLAN");
  pin_table(a.rt, a.g);
  const graph_step *first = a.g->step;
  char before[512], after[512];
  plan_of(a.g, before, sizeof before);
  remat_step_stats st = {.size = sizeof st};
  for (int k = 0; k < COST_STEPS + 2; k++)
    assert_int_equal(remat_step(a.g, &st), REMAT_OK);
  assert_ptr_equal(a.g->step, first);
  plan_of(a.g, after, sizeof after);
  assert_string_equal(before, after);
  fixture_close(&a);
}

/* A graph whose step state is made after another graph measured (its
 * block of entries adopted last, read first) still plans with the
 * measured times: its entries start with them. */
static void test_late_block_keeps_times(void **state) {
  (void)state;
  fixture a;
  open_plain(&a, "everything_saveable", 0);
  remat_step_stats st = {.size = sizeof st};
  for (int k = 0; k < COST_STEPS; k++)
    assert_int_equal(remat_step(a.g, &st), REMAT_OK);
  const op_instance *inst = NULL;
  for (int32_t o = 0; inst == NULL && o < a.g->nops; o++)
    if (a.g->ops[o].inst.desc.type == OP_LINEAR)
      inst = &a.g->ops[o].inst;
  assert_non_null(inst);
  double measured =
      cost_table_tile_seconds(&a.rt->costs, &inst->desc, &inst->fwd[0]);
  assert_true(measured > 0);
  remat_graph *b;
  remat_gpt mb;
  assert_int_equal(remat_graph_create(a.rt, &b), REMAT_OK);
  assert_int_equal(remat_gpt_build(b, &four, &mb), REMAT_OK);
  assert_int_equal(remat_compile(b, mb.loss, &adamw), REMAT_OK);
  double later =
      cost_table_tile_seconds(&a.rt->costs, &inst->desc, &inst->fwd[0]);
  assert_memory_equal(&later, &measured, sizeof later);
  remat_graph_destroy(b);
  fixture_close(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_replan_takes_the_measured_plan),
      cmocka_unit_test(test_replan_keeps_held_room),
      cmocka_unit_test(test_no_replan_switch),
      cmocka_unit_test(test_late_block_keeps_times),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
