/* Tests of time as the recompute cost: the runtime's table of measured
 * kernel times (compile/costs.h) turns the planner's choice under a
 * budget (a layer norm that costs much against matmuls that cost little
 * saves the opposite tensors from the reverse table), a graph's first
 * steps fill the table from their task times, and the planner scoring its
 * candidates by replayed step time (compile/predict.h) recomputes more on
 * many workers, where recompute runs on otherwise idle ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpt_fixture.h"
#include "runtime/compile/lifetimes.h"
#include "runtime/compile/measure.h"
#include "runtime/compile/planner.h"
#include "runtime/compile/predict.h"
#include "runtime/exec/step_costs.h"
#include "runtime/exec/step_state.h"
#include "runtime/exec/tasks.h"
#include "sched/sched_internal.h"

static const remat_gpt_config four = {
    .layers = 4, .d_model = 32, .heads = 4, .seq = 16, .batch = 2, .vocab = 13};

/* Seconds per tile of a kernel of op type `type` in a table. */
typedef struct cost_rule {
  double layernorm, linear, other;
} cost_rule;

/* Every kernel (forward, backward, fused) of every op of compiled graph g
 * into rt's table at the seconds `rule` gives its op type. */
static void fill_table(remat_runtime *rt, const remat_graph *g,
                       const cost_rule *rule) {
  cost_table_clear(&rt->costs);
  for (int32_t o = 0; o < g->nops; o++) {
    const op_instance *inst = &g->ops[o].inst;
    double s = inst->desc.type == OP_LAYERNORM ? rule->layernorm
               : inst->desc.type == OP_LINEAR  ? rule->linear
                                               : rule->other;
    for (int k = 0; k < inst->nfwd; k++)
      assert_true(cost_table_note(&rt->costs, &inst->desc, &inst->fwd[k], s));
    for (int k = 0; k < inst->nbwd; k++)
      assert_true(cost_table_note(&rt->costs, &inst->desc, &inst->bwd[k], s));
    if (inst->nfused)
      assert_true(cost_table_note(&rt->costs, &inst->desc, &inst->fused, s));
  }
}

/* The names of the tensors that the budget's plan saves in the layers'
 * regions (region inputs and outputs left out), in tensor order, with the
 * layer: "0:ln1_out,0:qkv,...". */
static void saved_set(const remat_graph *g, char *out, size_t len) {
  out[0] = '\0';
  for (int i = 0; i < remat_num_tensors(g); i++) {
    remat_tensor *t = remat_tensor_at(g, i);
    remat_tensor_plan tp;
    assert_int_equal(remat_tensor_plan_of(g, t, &tp), REMAT_OK);
    if (tp.source != REMAT_POLICY_BUDGET || !tp.saved ||
        !(tp.recomputed == 0 && tp.saved == 1) || !t->named)
      continue;
    size_t at = strlen(out);
    snprintf(out + at, len - at, "%s%d:%s", at ? "," : "", tp.region,
             remat_tensor_name(t));
  }
}

/* Builds the model on rt, compiles it with `budget` and writes its saved
 * set. */
static void plan_with(remat_runtime *rt, int64_t budget, char *out,
                      size_t len) {
  remat_graph *g;
  remat_gpt m;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_graph_set_memory_budget(g, budget), REMAT_OK);
  assert_int_equal(remat_gpt_build(g, &four, &m), REMAT_OK);
  if (remat_compile(g, m.loss, NULL) != REMAT_OK)
    fail_msg("compile: %s", remat_graph_error(g));
  saved_set(g, out, len);
  remat_graph_destroy(g);
}

/* A runtime of one thread that reads no environment (the plans below are
 * pinned: REMAT_FUSE or REMAT_PRECISION would change the tensors). */
static void open_plain(fixture *f, const char *policy) {
  remat_config rc = {.set = REMAT_SET_NO_ENV | REMAT_SET_NUM_THREADS |
                            REMAT_SET_POLICY,
                     .num_threads = 1,
                     .policy = policy};
  if (fixture_open_config(f, &four, &rc, NULL) != REMAT_OK)
    fail_msg("open %s: %s", policy, remat_last_error());
}

/* The plan that the roofline alone makes at the budget of the test below,
 * and the two that the tables make. Under every table the last layer saves
 * all it has (its backward follows its forward at once); in the others, a
 * costly layer norm and cheap matmuls save the norms' outputs (and the
 * attention's values, next in cost per byte) and recompute every linear's
 * output, the reverse table saves the first linear's output (qkv) and
 * recomputes the norms. */
#define LAST_LAYER                                                      \
  "3:ln1_out,3:qkv,3:attn_scores,3:attn_probs,3:attn_values,3:resid_mid," \
  "3:ln2_out,3:ffn_in,3:ffn_act"
static const char *const norm_costly_plan =
    "0:ln1_out,0:attn_values,0:ln2_out,1:ln1_out,1:attn_values,1:ln2_out,"
    "2:ln1_out,2:attn_values,2:ln2_out," LAST_LAYER;
static const char *const dots_costly_plan = "0:qkv,1:qkv,2:qkv," LAST_LAYER;

/* The same budget, two tables: the planner makes opposite choices, each
 * exactly as pinned above; with the table cleared, the roofline's plan,
 * which is neither. */
static void test_table_turns_the_plan(void **state) {
  (void)state;
  fixture none, all;
  open_plain(&none, "nothing_saveable");
  open_plain(&all, "everything_saveable");
  int64_t lo = none.g->step->compiled.predicted.peak;
  int64_t hi = all.g->step->compiled.predicted.peak;
  fixture_close(&all);
  assert_true(hi > lo && lo > 0);
  int64_t budget = lo + (hi - lo) / 5;
  char plan[4096], roofline[4096];
  cost_rule norm_costly = {1e-3, 1e-9, 1e-10};
  cost_rule dots_costly = {1e-9, 1e-3, 1e-10};
  plan_with(none.rt, budget, roofline, sizeof roofline);
  fill_table(none.rt, none.g, &norm_costly);
  plan_with(none.rt, budget, plan, sizeof plan);
  assert_string_equal(plan, norm_costly_plan);
  fill_table(none.rt, none.g, &dots_costly);
  plan_with(none.rt, budget, plan, sizeof plan);
  assert_string_equal(plan, dots_costly_plan);
  cost_table_clear(&none.rt->costs);
  plan_with(none.rt, budget, plan, sizeof plan);
  assert_string_equal(plan, roofline);
  assert_string_not_equal(roofline, norm_costly_plan);
  assert_string_not_equal(roofline, dots_costly_plan);
  fixture_close(&none);
}

/* The time the table gives all kernel nodes of g's compiled step, in
 * seconds, or -1 when one is missing. */
static double table_seconds(remat_runtime *rt, const remat_graph *g) {
  const plan_lowering *l = &g->step->compiled.low;
  double total = 0;
  for (int32_t i = 0; i < l->nknodes; i++) {
    const plan_knode *kn = &l->knodes[i];
    if (kn->inst == NULL || kn->kernel == NULL)
      continue;
    double s = cost_table_tile_seconds(&rt->costs, &kn->inst->desc,
                                       kn->kernel);
    if (s <= 0)
      return -1;
    total += s * (double)kn->tiles;
  }
  return total;
}

/* A graph's first COST_STEPS steps measure every op kernel it runs (the
 * least time per tile of the steps: on one worker, their sum is at most
 * the quickest step's wall time), later steps measure nothing, the
 * planner reads the measured time in place of the roofline, and a graph
 * planned from the measured table trains bitwise as before. */
static void test_steps_fill_table(void **state) {
  (void)state;
  fixture f;
  open_plain(&f, "nothing_saveable");
  assert_int_equal(cost_table_count(&f.rt->costs), 0);
  assert_true(table_seconds(f.rt, f.g) < 0);
  double quickest = 1e30;
  uint32_t loss_bits;
  for (int step = 0; step < COST_STEPS; step++) {
    remat_step_stats st = {.size = sizeof st};
    assert_int_equal(remat_step(f.g, &st), REMAT_OK);
    if (st.seconds < quickest)
      quickest = st.seconds;
    if (step == 0)
      memcpy(&loss_bits, &st.loss, sizeof loss_bits);
    double measured = table_seconds(f.rt, f.g);
    assert_true(measured > 0 && measured <= quickest);
  }
  assert_null(f.g->step->state.cost_records);
  int32_t entries = cost_table_count(&f.rt->costs);
  double measured = table_seconds(f.rt, f.g);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_int_equal(cost_table_count(&f.rt->costs), entries);
  assert_true(table_seconds(f.rt, f.g) == measured);

  int checked = 0;
  for (int32_t o = 0; o < f.g->nops; o++) {
    const op_instance *inst = &f.g->ops[o].inst;
    if (inst->desc.type != OP_LAYERNORM)
      continue;
    double want = 0;
    for (int k = 0; k < inst->nfwd; k++)
      want += cost_table_tile_seconds(&f.rt->costs, &inst->desc,
                                      &inst->fwd[k]) *
              (double)inst->fwd[k].tiles * COST_FLOPS_PER_SECOND;
    assert_true(want > 0);
    assert_true(plan_op_time(f.g, o, &f.rt->costs) == want);
    assert_true(plan_op_time(f.g, o, NULL) == plan_op_cost(f.g, o));
    checked++;
  }
  assert_int_equal(checked, 2 * four.layers + 1);

  /* a graph planned under a budget from the measured table: the same
   * loss, bit for bit, as nothing_saveable's first step */
  fixture all;
  open_plain(&all, "everything_saveable");
  int64_t lo = f.g->step->compiled.predicted.peak;
  int64_t budget = lo + (all.g->step->compiled.predicted.peak - lo) / 2;
  fixture_close(&all);
  remat_graph *g;
  remat_gpt m;
  assert_int_equal(remat_graph_create(f.rt, &g), REMAT_OK);
  assert_int_equal(remat_graph_seed(g, 7), REMAT_OK);
  assert_int_equal(remat_graph_set_memory_budget(g, budget), REMAT_OK);
  assert_int_equal(remat_gpt_build(g, &four, &m), REMAT_OK);
  assert_int_equal(remat_compile(g, m.loss, NULL), REMAT_OK);
  size_t n = (size_t)four.batch * four.seq;
  assert_int_equal(remat_feed(g, m.tokens, f.tokens, n * sizeof(int32_t)),
                   REMAT_OK);
  assert_int_equal(remat_feed(g, m.targets, f.targets, n * sizeof(int32_t)),
                   REMAT_OK);
  assert_int_equal(remat_step(g, &st), REMAT_OK);
  uint32_t bits;
  memcpy(&bits, &st.loss, sizeof bits);
  assert_int_equal(bits, loss_bits);
  assert_true(st.peak_bytes <= budget);
  remat_graph_destroy(g);
  fixture_close(&f);
}

/* The table: an entry per kernel and shapes, keeping the least time; a
 * kernel of other shapes, or of another name, is not measured; cleared, it
 * holds nothing; cost_of_kernel scales the time by the tiles. */
static void test_table_entries(void **state) {
  (void)state;
  cost_table t;
  cost_table_init(&t);
  op_desc d = {.type = OP_LAYERNORM, .nin = 3};
  d.in[0] = d.out = (op_shape){2, {32, 64}};
  d.in[1] = d.in[2] = (op_shape){1, {64}};
  op_kernel k = {.name = "layernorm.fwd", .tiles = 4, .flops = 1e4};
  assert_true(cost_table_tile_seconds(&t, &d, &k) == -1.0);
  assert_true(cost_of_kernel(&t, &d, &k, 4, 123.0) == 123.0);
  assert_true(cost_table_note(&t, &d, &k, 2e-6));
  assert_true(cost_table_note(&t, &d, &k, 1e-6));
  assert_true(cost_table_note(&t, &d, &k, 3e-6));
  assert_true(cost_table_tile_seconds(&t, &d, &k) == 1e-6);
  assert_true(cost_of_kernel(&t, &d, &k, 4, 123.0) ==
              1e-6 * 4 * COST_FLOPS_PER_SECOND);
  assert_true(cost_of_kernel(NULL, &d, &k, 4, 123.0) == 123.0);
  op_desc wider = d;
  wider.in[0].dim[1] = wider.out.dim[1] = 128;
  op_kernel other = k;
  other.name = "layernorm.bwd";
  assert_true(cost_table_tile_seconds(&t, &wider, &k) == -1.0);
  assert_true(cost_table_tile_seconds(&t, &d, &other) == -1.0);
  assert_int_equal(cost_table_count(&t), 1);
  cost_table_clear(&t);
  assert_true(cost_table_tile_seconds(&t, &d, &k) == -1.0);
  cost_table_free(&t);
}

static bool same_shape(const op_shape *a, const op_shape *b) {
  if (a->ndim != b->ndim)
    return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->dim[i] != b->dim[i])
      return false;
  return true;
}

/* Whether two kernel nodes share a table entry: the same kernel name,
 * tiles, FLOPs, output type and shapes. */
static bool same_entry(const plan_knode *a, const plan_knode *b) {
  const op_desc *x = &a->inst->desc, *y = &b->inst->desc;
  bool same = strcmp(a->kernel->name, b->kernel->name) == 0 &&
              a->kernel->tiles == b->kernel->tiles &&
              a->kernel->flops == b->kernel->flops &&
              x->out_dtype == y->out_dtype && x->nin == y->nin &&
              same_shape(&x->out, &y->out);
  for (int i = 0; same && i < x->nin; i++)
    same = same_shape(&x->in[i], &y->in[i]);
  return same;
}

/* A run's records into the table: every tile task of kernel node i lasts
 * 1000 + 10 i + its tile index nanoseconds, every other task no time, so
 * each entry gets the least over its nodes of their mean tile time. The
 * tile tasks are found by their argument (a plan_tile), not by position. */
static void test_records_into_table(void **state) {
  (void)state;
  fixture f;
  open_plain(&f, "nothing_saveable");
  const compiled_step *c = &f.g->step->compiled;
  const sched_dag *dag = c->tasks.dag;
  sched_trace_record *rec = calloc((size_t)dag->ntasks, sizeof *rec);
  assert_non_null(rec);
  double *want = calloc((size_t)c->low.nknodes, sizeof *want);
  for (int32_t t = 0; t < dag->ntasks; t++) {
    const plan_tile *tile = dag->tasks[t].arg;
    if (dag->tasks[t].fn != remat__task_bodies.tile)
      continue;
    rec[t].end_ns = 1000 + 10 * tile->knode + tile->tile;
    want[tile->knode] += 1e-9 * (double)rec[t].end_ns;
  }
  step_state *st = &f.g->step->state;
  assert_int_equal(st->cost_runs, 0);
  step_costs_note(c, st, rec);
  assert_int_equal(st->cost_runs, 1);
  int checked = 0;
  for (int32_t i = 0; i < c->low.nknodes; i++) {
    const plan_knode *kn = &c->low.knodes[i];
    if (kn->inst == NULL || kn->kernel == NULL || kn->tiles <= 0)
      continue;
    double least = 1e30;
    for (int32_t j = 0; j < c->low.nknodes; j++) {
      const plan_knode *o = &c->low.knodes[j];
      if (o->inst != NULL && o->kernel != NULL && o->tiles > 0 &&
          same_entry(o, kn) &&
          want[j] / (double)o->tiles < least)
        least = want[j] / (double)o->tiles;
    }
    double got = cost_table_tile_seconds(&f.rt->costs, &kn->inst->desc,
                                         kn->kernel);
    if (got > least * (1 + 1e-12) || got < least * (1 - 1e-12))
      fail_msg("node %d (%s): %g seconds per tile, expected %g", (int)i,
               kn->kernel->name, got, least);
    checked++;
  }
  assert_true(checked > 20);
  free(want);
  free(rec);
  fixture_close(&f);
}

/* On one worker the predicted step is the tiles' times (each kernel
 * node's tiles at its measured time per tile) plus, per task, the
 * overhead and at most three queue operations (a root's claim, a push
 * and a pop); the table's times count, not the rooflines. */
static void test_predict_one_worker(void **state) {
  (void)state;
  fixture f;
  open_plain(&f, "nothing_saveable");
  const compiled_step *c = &f.g->step->compiled;
  cost_rule flat = {3e-6, 2e-6, 1e-6};
  fill_table(f.rt, f.g, &flat);
  double work = 0;
  for (int32_t i = 0; i < c->low.nknodes; i++) {
    const plan_knode *kn = &c->low.knodes[i];
    double tile = predict_tile_seconds(&c->low, kn, &f.rt->costs);
    if (kn->inst != NULL && kn->kernel != NULL)
      assert_true(tile == (kn->inst->desc.type == OP_LAYERNORM ? 3e-6
                           : kn->inst->desc.type == OP_LINEAR  ? 2e-6
                                                               : 1e-6));
    work += tile * (double)kn->tiles;
  }
  double ntasks = sched_dag_num_tasks(c->tasks.dag), step;
  predict_request pr = {f.g, &c->low, 1, 1, 1, &f.rt->costs};
  assert_int_equal(predict_step_seconds(&pr, &step), REMAT_OK);
  assert_true(step >= work + ntasks * PREDICT_TASK_OVERHEAD_S);
  assert_true(step <= work + ntasks * (PREDICT_TASK_OVERHEAD_S +
                                       3 * PREDICT_LOCK_S));
  fixture_close(&f);
}

/* What a decision costs: its recompute (seconds, from the table), its
 * predicted step at `workers` and its predicted peak. */
typedef struct plan_figures {
  double recompute, step;
  int64_t peak;
} plan_figures;

static plan_figures figures_of(remat_graph *g, int32_t loss,
                               const remat_decision *d, cost_table *costs,
                               int workers) {
  lower_request lr = {g, d->saved, loss, false, REMAT_OPT_SGD};
  plan_lowering l;
  assert_int_equal(lower_graph(&lr, &l), REMAT_OK);
  assert_int_equal(lifetimes_assign(&l), REMAT_OK);
  plan_figures f = {0};
  for (int32_t i = 0; i < l.nknodes; i++)
    if (l.knodes[i].kind == KNODE_RECOMPUTE)
      f.recompute += plan_node_cost(&l, &l.knodes[i], costs) /
                     COST_FLOPS_PER_SECOND;
  predict_request pr = {g, &l, workers, 1, 1, costs};
  assert_int_equal(predict_step_seconds(&pr, &f.step), REMAT_OK);
  lowering_free(&l);
  plan_measures m;
  assert_int_equal(measure_decision(&lr, 1, 1, costs, &m), REMAT_OK);
  f.peak = m.peak;
  measures_free(&m);
  return f;
}

static bool same_saved(const remat_graph *g, const remat_decision *a,
                       const remat_decision *b) {
  for (int32_t x = 0; x < g->ntensors; x++)
    if (a->saved[x] != b->saved[x])
      return false;
  return true;
}

/* A model of 4 layers, every tile 1 us, a budget at 3/10 of the way from
 * nothing_saveable's peak to everything_saveable's. The least recompute's
 * plan (no replay), the replay's at 1 worker (the same: on one worker
 * more recompute only takes longer) and at 64 (simulated): a plan that
 * recomputes more and is predicted quicker there by more than the margin,
 * within the same budget. */
static void test_replay_hides_recompute(void **state) {
  (void)state;
  const remat_gpt_config wide = {.layers = 4, .d_model = 64, .heads = 4,
                                 .seq = 64, .batch = 4, .vocab = 50};
  remat_config rc = {.set = REMAT_SET_NO_ENV | REMAT_SET_NUM_THREADS |
                            REMAT_SET_POLICY,
                     .num_threads = 1};
  fixture none, all;
  rc.policy = "nothing_saveable";
  assert_int_equal(fixture_open_config(&none, &wide, &rc, NULL), REMAT_OK);
  rc.policy = "everything_saveable";
  assert_int_equal(fixture_open_config(&all, &wide, &rc, NULL), REMAT_OK);
  int64_t lo = none.g->step->compiled.predicted.peak;
  int64_t budget = lo + (all.g->step->compiled.predicted.peak - lo) * 3 / 10;
  fixture_close(&all);
  cost_rule flat = {1e-6, 1e-6, 1e-6};
  fill_table(none.rt, none.g, &flat);
  remat_graph *g = none.g;
  int32_t loss = none.m.loss->id;
  remat_decision least, one, many;
  plan_target t = {g,      loss, false, REMAT_OPT_SGD, "nothing_saveable",
                   budget, 1,    1,     &none.rt->costs, 1, false, 0, 0};
  assert_int_equal(plan_remat(&t, &least), REMAT_OK);
  t.replay = true;
  t.replay_workers = 1;
  assert_int_equal(plan_remat(&t, &one), REMAT_OK);
  t.replay_workers = 64;
  assert_int_equal(plan_remat(&t, &many), REMAT_OK);
  assert_true(same_saved(g, &least, &one));
  assert_false(same_saved(g, &least, &many));
  plan_figures a = figures_of(g, loss, &least, &none.rt->costs, 64);
  plan_figures b = figures_of(g, loss, &many, &none.rt->costs, 64);
  printf("least recompute: %g s recompute, %g s at 64, peak %lld\n"
         "replayed at 64:  %g s recompute, %g s at 64, peak %lld\n",
         a.recompute, a.step, (long long)a.peak, b.recompute, b.step,
         (long long)b.peak);
  assert_true(b.recompute > a.recompute);
  assert_true(b.step < a.step * (1.0 - PLANNER_REPLAY_MARGIN));
  assert_true(a.peak <= budget && b.peak <= budget);
  decision_free(&least);
  decision_free(&one);
  decision_free(&many);
  fixture_close(&none);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_entries),
      cmocka_unit_test(test_records_into_table),
      cmocka_unit_test(test_table_turns_the_plan),
      cmocka_unit_test(test_steps_fill_table),
      cmocka_unit_test(test_predict_one_worker),
      cmocka_unit_test(test_replay_hides_recompute),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
