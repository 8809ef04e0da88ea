/* Tests of what the remat plan decides: for every policy, exactly which of
 * the GPT's named tensors are saved and which are recomputed, the region
 * and policy that decided, nested regions (the innermost region holding
 * every consumer decides), the memory budget's choices, and the
 * memory-order edges of REMAT_LOOKAHEAD read from the task DAG itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fuse_env.h"
#include "gpt_fixture.h"
#include "runtime/exec/step_state.h"
#include "sched/sched_internal.h"

static const remat_gpt_config two = {
    .layers = 2, .d_model = 16, .heads = 2, .seq = 8, .batch = 2, .vocab = 11};

static const char *const block_names[] = {
    "ln1_out", "qkv",       "attn_scores", "attn_probs", "attn_values",
    "attn_out", "resid_mid", "ln2_out",    "ffn_in",     "ffn_act",
    "ffn_out"};
#define NNAMES (sizeof block_names / sizeof block_names[0])

/* One policy and the names it must save in every block, by docs/policies.md's
 * table of policies (written from the policy's meaning, not from the
 * implementation). */
typedef struct policy_case {
  const char *policy, *formatted;
  const char *saved[NNAMES + 1]; /* NULL-terminated */
} policy_case;

static const policy_case cases[] = {
    {"everything_saveable", "everything_saveable",
     {"ln1_out", "qkv", "attn_scores", "attn_probs", "attn_values", "attn_out",
      "resid_mid", "ln2_out", "ffn_in", "ffn_act", "ffn_out", NULL}},
    {"nothing_saveable", "nothing_saveable", {NULL}},
    {"dots_saveable", "dots_saveable",
     {"qkv", "attn_scores", "attn_values", "attn_out", "ffn_in", "ffn_out",
      NULL}},
    {"checkpoint_dots", "dots_saveable",
     {"qkv", "attn_scores", "attn_values", "attn_out", "ffn_in", "ffn_out",
      NULL}},
    {"dots_with_no_batch_dims_saveable", "dots_with_no_batch_dims_saveable",
     {"qkv", "attn_out", "ffn_in", "ffn_out", NULL}},
    {"save_only_these_names:attn_probs,ffn_in",
     "save_only_these_names:attn_probs,ffn_in", {"attn_probs", "ffn_in", NULL}},
    {"save_any_names_but_these:attn_scores,attn_probs",
     "save_any_names_but_these:attn_scores,attn_probs",
     {"ln1_out", "qkv", "attn_values", "attn_out", "resid_mid", "ln2_out",
      "ffn_in", "ffn_act", "ffn_out", NULL}},
    {"save_from_both_policies:dots_with_no_batch_dims_saveable+"
     "save_only_these_names:ln1_out",
     "save_from_both_policies:dots_with_no_batch_dims_saveable+"
     "save_only_these_names:ln1_out",
     {"qkv", "attn_out", "ffn_in", "ffn_out", "ln1_out", NULL}},
};

/* The block's dataflow, from the ops' math: whether backward reads a
 * tensor itself (a linear's input for dW, layer norm's and GELU's input,
 * softmax's output, attention's q, k, v and probabilities; a residual
 * add's backward reads nothing), and which named tensors its producer
 * reads (what recomputing it needs). */
typedef struct dataflow {
  const char *name;
  bool backward_reads;
  const char *inputs[3];
} dataflow;

static const dataflow block_flow[NNAMES] = {
    {"ln1_out", true, {NULL}},
    {"qkv", true, {"ln1_out", NULL}},
    {"attn_scores", false, {"qkv", NULL}},
    {"attn_probs", true, {"attn_scores", NULL}},
    {"attn_values", true, {"attn_probs", "qkv", NULL}},
    {"attn_out", false, {"attn_values", NULL}},
    {"resid_mid", true, {"attn_out", NULL}},
    {"ln2_out", true, {"resid_mid", NULL}},
    {"ffn_in", true, {"ln2_out", NULL}},
    {"ffn_act", true, {"ffn_in", NULL}},
    {"ffn_out", false, {"ffn_act", NULL}},
};

/* With fused epilogues (unless REMAT_FUSE=0) attn_out and ffn_out, the
 * linear outputs that only a residual add reads, are never stored: the
 * add runs inside the linear's matmul, so they are neither saved nor
 * recomputed, and recomputing resid_mid reads attn_values. */
static bool fused(void) { return fusion_on(); }

static bool fused_away(const char *name) {
  return fused() &&
         (strcmp(name, "attn_out") == 0 || strcmp(name, "ffn_out") == 0);
}

static int flow_index(const char *name) {
  for (size_t i = 0; i < NNAMES; i++)
    if (strcmp(block_flow[i].name, name) == 0)
      return (int)i;
  return -1;
}

/* recomputed = not saved, and read by backward or by the recompute of a
 * recomputed tensor (a fixpoint over the block, last tensor first). */
static void expected_recompute(const char *const *saved_list, bool *out) {
  for (size_t i = 0; i < NNAMES; i++)
    out[i] = false;
  for (int i = (int)NNAMES - 1; i >= 0; i--) {
    dataflow f_fused = block_flow[i];
    if (fused() && strcmp(f_fused.name, "resid_mid") == 0)
      f_fused.inputs[0] = "attn_values";
    const dataflow *f = &f_fused;
    if (fused_away(f->name))
      continue;
    bool saved = false;
    for (int k = 0; saved_list[k] != NULL; k++)
      saved |= strcmp(saved_list[k], f->name) == 0;
    if (!saved && f->backward_reads)
      out[i] = true;
    if (!out[i])
      continue;
    for (int k = 0; f->inputs[k] != NULL; k++) {
      int j = flow_index(f->inputs[k]);
      bool input_saved = false;
      for (int m = 0; saved_list[m] != NULL; m++)
        input_saved |= strcmp(saved_list[m], f->inputs[k]) == 0;
      if (!input_saved)
        out[j] = true;
    }
  }
}

static bool in_list(const char *const *list, const char *name) {
  for (int i = 0; list[i] != NULL; i++)
    if (strcmp(list[i], name) == 0)
      return true;
  return false;
}

static bool is_block_name(const char *name) {
  for (size_t i = 0; i < NNAMES; i++)
    if (strcmp(block_names[i], name) == 0)
      return true;
  return false;
}

/* Checks every tensor of a compiled 2-layer GPT against case c. */
static void check_case(remat_graph *g, const policy_case *c) {
  int named_seen = 0;
  bool recompute[NNAMES];
  expected_recompute(c->saved, recompute);
  for (int i = 0; i < remat_num_tensors(g); i++) {
    remat_tensor *t = remat_tensor_at(g, i);
    const char *name = remat_tensor_name(t);
    remat_tensor_plan tp;
    assert_int_equal(remat_tensor_plan_of(g, t, &tp), REMAT_OK);
    if (!is_block_name(name)) {
      /* inputs, parameters, block outputs, the head: always saved */
      if (!tp.saved || tp.recomputed || tp.region != -1)
        fail_msg("%s: '%s' (tensor %d) saved %d recomputed %d region %d",
                 c->policy, name, i, tp.saved, tp.recomputed, tp.region);
      assert_int_equal(tp.source, REMAT_POLICY_NONE);
      assert_string_equal(tp.policy, "");
      continue;
    }
    named_seen++;
    bool want = in_list(c->saved, name) && !fused_away(name);
    bool want_recompute = recompute[flow_index(name)];
    if (tp.saved != (int)want || tp.recomputed != (int)want_recompute)
      fail_msg("%s: '%s' saved %d (want %d) recomputed %d (want %d)",
               c->policy, name, tp.saved, want, tp.recomputed,
               want_recompute);
    assert_true(tp.region == 0 || tp.region == 1);
    assert_int_equal(tp.source, REMAT_POLICY_DEFAULT);
    assert_string_equal(tp.policy, c->formatted);
  }
  assert_int_equal(named_seen, 2 * (int)NNAMES);
}

static void test_policy_saves_exactly(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fixture f;
    assert_int_equal(fixture_open(&f, &two, 1, cases[k].policy, 0, NULL),
                     REMAT_OK);
    check_case(f.g, &cases[k]);
    fixture_close(&f);
  }
}

/* A 2-layer GPT on rt, built and compiled without an optimizer after
 * `policy` became its own default policy (remat_graph_set_policy; no
 * call when set is false, NULL: the runtime's). */
static remat_graph *graph_on(remat_runtime *rt, bool set, const char *policy) {
  remat_graph *g;
  remat_gpt m;
  remat_policy *p = NULL;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  if (policy != NULL)
    assert_int_equal(remat_policy_parse(policy, &p), REMAT_OK);
  if (set)
    assert_int_equal(remat_graph_set_policy(g, p), REMAT_OK);
  remat_policy_destroy(p);
  assert_int_equal(remat_gpt_build(g, &two, &m), REMAT_OK);
  if (remat_compile(g, m.loss, NULL) != REMAT_OK)
    fail_msg("%s: %s", policy ? policy : "(none)", remat_last_error());
  return g;
}

/* Graphs on one runtime (default nothing_saveable) with their own default
 * policies: each saves exactly what its own policy says, beside a graph
 * that keeps the runtime's and one whose policy was set back to NULL; a
 * setting after compile fails alone (the graph stays usable) and changes
 * nothing. */
static void test_graph_policy(void **state) {
  (void)state;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY,
                     .num_threads = 1,
                     .policy = "nothing_saveable"};
  remat_runtime *rt;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  const policy_case *runtimes = &cases[1]; /* nothing_saveable */
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    remat_graph *own = graph_on(rt, true, cases[k].policy);
    remat_graph *plain = graph_on(rt, false, NULL);
    /* set, then back to the runtime's: a graph opened before `own` */
    remat_graph *reset;
    remat_gpt m;
    remat_policy *p = NULL;
    assert_int_equal(remat_graph_create(rt, &reset), REMAT_OK);
    assert_int_equal(remat_policy_parse(cases[k].policy, &p), REMAT_OK);
    assert_int_equal(remat_graph_set_policy(reset, p), REMAT_OK);
    assert_int_equal(remat_graph_set_policy(reset, NULL), REMAT_OK);
    assert_int_equal(remat_gpt_build(reset, &two, &m), REMAT_OK);
    assert_int_equal(remat_compile(reset, m.loss, NULL), REMAT_OK);
    check_case(own, &cases[k]);
    check_case(plain, runtimes);
    check_case(reset, runtimes);
    /* after compile: refused, not sticky, the plan unchanged */
    assert_int_equal(remat_graph_set_policy(plain, p), REMAT_ERR_STATE);
    assert_string_equal(remat_last_error(),
                        "remat_graph_set_policy: the graph is already "
                        "compiled, and its remat plan was made with the "
                        "default policy it had: set it before "
                        "remat_compile");
    assert_int_equal(remat_graph_set_memory_budget(plain, 1),
                     REMAT_ERR_STATE);
    assert_string_equal(remat_last_error(),
                        "remat_graph_set_memory_budget: the graph is "
                        "already compiled, and its remat plan was made "
                        "under the budget it had: set it before "
                        "remat_compile");
    assert_int_equal(remat_graph_status(plain), REMAT_OK);
    check_case(plain, runtimes);
    remat_policy_destroy(p);
    remat_graph_destroy(own);
    remat_graph_destroy(plain);
    remat_graph_destroy(reset);
  }
  remat_runtime_destroy(rt);
}

/* outer: save_only_these_names:a { a = linear(x); inner: everything
 * { b = gelu(a); c = linear(b) }; d = gelu(c); e = linear(d) }; loss =
 * mean(e). b is used only inside inner, so inner decides it; c is used by
 * d in outer, so outer decides it; e leaves both regions. */
static void test_nested_regions(void **state) {
  (void)state;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  remat_runtime *rt;
  remat_graph *g;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t xd[2] = {4, 8}, wd[2] = {8, 8};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, xd);
  remat_tensor *w[3];
  for (int i = 0; i < 3; i++) {
    char name[8];
    snprintf(name, sizeof name, "w%d", i);
    w[i] = remat_param(g, name, 2, wd, REMAT_INIT_NORMAL, 0.1f);
  }
  const char *a_only[] = {"a"};
  remat_policy *outer = remat_policy_save_only_these_names(a_only, 1);
  remat_policy *inner = remat_policy_everything_saveable();
  assert_int_equal(remat_region_begin(g, outer), REMAT_OK);
  remat_tensor *a = remat_linear(g, x, w[0], NULL);
  remat_checkpoint_name(g, a, "a");
  assert_int_equal(remat_region_begin(g, inner), REMAT_OK);
  remat_tensor *b = remat_gelu(g, a, REMAT_GELU_TANH);
  remat_checkpoint_name(g, b, "b");
  remat_tensor *c = remat_linear(g, b, w[1], NULL);
  remat_checkpoint_name(g, c, "c");
  assert_int_equal(remat_region_end(g), REMAT_OK);
  remat_tensor *d = remat_gelu(g, c, REMAT_GELU_TANH);
  remat_checkpoint_name(g, d, "d");
  remat_tensor *e = remat_linear(g, d, w[2], NULL);
  remat_checkpoint_name(g, e, "e");
  assert_int_equal(remat_region_end(g), REMAT_OK);
  remat_tensor *loss = remat_mean(g, e);
  remat_policy_destroy(outer);
  remat_policy_destroy(inner);
  assert_int_equal(remat_compile(g, loss, NULL), REMAT_OK);
  struct {
    remat_tensor *t;
    int saved, region;
    const char *policy;
  } want[] = {{a, 1, 0, "save_only_these_names:a"},
              {b, 1, 1, "everything_saveable"},
              {c, 0, 0, "save_only_these_names:a"},
              {d, 0, 0, "save_only_these_names:a"},
              {e, 1, -1, ""}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    remat_tensor_plan tp;
    assert_int_equal(remat_tensor_plan_of(g, want[i].t, &tp), REMAT_OK);
    if (tp.saved != want[i].saved || tp.region != want[i].region)
      fail_msg("'%s': saved %d region %d, want %d %d",
               remat_tensor_name(want[i].t), tp.saved, tp.region,
               want[i].saved, want[i].region);
    assert_string_equal(tp.policy, want[i].policy);
    assert_int_equal(tp.source,
                     want[i].region < 0 ? REMAT_POLICY_NONE : REMAT_POLICY_OWN);
  }
  remat_tensor_plan tp;
  assert_int_equal(remat_tensor_plan_of(g, c, &tp), REMAT_OK);
  assert_int_equal(tp.recomputed, 1); /* gelu's backward reads c */
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* Under an ample budget every region gets everything_saveable (no
 * recompute); the source says the budget chose it. */
static void test_budget_source(void **state) {
  (void)state;
  fixture f;
  assert_int_equal(fixture_open(&f, &two, 1, "auto", INT64_C(1) << 40, NULL),
                   REMAT_OK);
  policy_case all = cases[0];
  for (int i = 0; i < remat_num_tensors(f.g); i++) {
    remat_tensor *t = remat_tensor_at(f.g, i);
    remat_tensor_plan tp;
    assert_int_equal(remat_tensor_plan_of(f.g, t, &tp), REMAT_OK);
    if (!is_block_name(remat_tensor_name(t)))
      continue;
    assert_int_equal(tp.saved, !fused_away(remat_tensor_name(t)));
    assert_int_equal(tp.source, REMAT_POLICY_BUDGET);
    assert_string_equal(tp.policy, all.formatted);
  }
  fixture_close(&f);
}

static void test_plan_of_errors(void **state) {
  (void)state;
  remat_runtime *rt;
  remat_graph *g, *other;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &other), REMAT_OK);
  int64_t d[1] = {4};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 1, d);
  remat_tensor *y = remat_input(other, "y", REMAT_F32, 1, d);
  remat_tensor_plan tp;
  assert_int_equal(remat_tensor_plan_of(g, x, &tp), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_tensor_plan_of: the graph is not compiled: call "
                      "remat_compile first");
  assert_int_equal(remat_tensor_plan_of(g, y, &tp), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_tensor_plan_of: tensor 'y' belongs to another "
                      "graph");
  assert_int_equal(remat_tensor_plan_of(NULL, x, &tp), REMAT_ERR_INVALID_ARG);
  assert_int_equal(remat_num_tensors(g), 1);
  assert_ptr_equal(remat_tensor_at(g, 0), x);
  assert_null(remat_tensor_at(g, 1));
  assert_null(remat_tensor_at(g, -1));
  remat_graph_destroy(g);
  remat_graph_destroy(other);
  remat_runtime_destroy(rt);
}

/* ---- REMAT_LOOKAHEAD, read from the DAG ---- */

static bool has_edge(const sched_dag *dag, int32_t from, int32_t to) {
  const sched_task *t = &dag->tasks[from];
  for (int32_t e = t->succ_begin; e < t->succ_end; e++)
    if (dag->succ[e] == to)
      return true;
  return false;
}

/* Every recompute node of block k waits for the done task of the last
 * backward node of block k + lookahead (the seed when there is none), and
 * for no later backward node of a block further ahead. */
static void check_lookahead(const compiled_step *p, int layers,
                            int lookahead) {
  const plan_lowering *l = &p->low;
  int32_t last_bwd[16], seed = -1;
  for (int r = 0; r < layers; r++)
    last_bwd[r] = -1;
  for (int32_t i = 0; i < l->nknodes; i++) {
    if (l->knodes[i].kind == KNODE_SEED)
      seed = i;
    if (l->knodes[i].kind == KNODE_BACKWARD && l->knodes[i].region >= 0)
      last_bwd[l->knodes[i].region] = i;
  }
  int checked = 0;
  for (int32_t i = 0; i < l->nknodes; i++) {
    const plan_knode *kn = &l->knodes[i];
    if (kn->kind != KNODE_RECOMPUTE)
      continue;
    int ahead = kn->region + lookahead;
    int32_t gate = ahead < layers ? last_bwd[ahead] : seed;
    if (!has_edge(p->tasks.dag, p->tasks.done_task[gate], p->tasks.start_task[i]))
      fail_msg("lookahead %d: recompute node %d of block %d does not wait "
               "for node %d",
               lookahead, i, kn->region, gate);
    for (int r = ahead + 1; r < layers; r++)
      assert_false(has_edge(p->tasks.dag, p->tasks.done_task[last_bwd[r]],
                            p->tasks.start_task[i]));
    checked++;
  }
  assert_true(checked > 0);
}

static void test_lookahead_edges(void **state) {
  (void)state;
  remat_gpt_config c = two;
  c.layers = 6;
  for (int lookahead = 1; lookahead <= 7; lookahead += 2) {
    char value[8];
    snprintf(value, sizeof value, "%d", lookahead);
    setenv("REMAT_LOOKAHEAD", value, 1);
    fixture f;
    assert_int_equal(fixture_open(&f, &c, 1, "nothing_saveable", 0, NULL),
                     REMAT_OK);
    check_lookahead(&f.g->step->compiled, c.layers, lookahead);
    fixture_close(&f);
  }
  unsetenv("REMAT_LOOKAHEAD");
}

/* The update gate, read from the DAG: every node but the updates finishes
 * before the gate starts, and every update starts after the gate, so a
 * NaN found by any check, or a failed allocation anywhere, comes before
 * any parameter changes (whatever the timing). */
static void test_gate_edges(void **state) {
  (void)state;
  remat_optimizer adam = {.kind = REMAT_OPT_ADAMW, .lr = 1e-3f};
  fixture f;
  assert_int_equal(fixture_open(&f, &two, 2, "nothing_saveable", 0, &adam),
                   REMAT_OK);
  const compiled_step *p = &f.g->step->compiled;
  const plan_lowering *l = &p->low;
  int32_t gate = -1;
  for (int32_t i = 0; i < l->nknodes; i++)
    if (l->knodes[i].kind == KNODE_GATE)
      gate = i;
  assert_true(gate >= 0);
  int updates = 0;
  for (int32_t i = 0; i < l->nknodes; i++) {
    const plan_knode *kn = &l->knodes[i];
    if (i == gate)
      continue;
    if (kn->kind == KNODE_UPDATE) {
      updates++;
      assert_true(has_edge(p->tasks.dag, p->tasks.done_task[gate], p->tasks.start_task[i]));
      assert_false(has_edge(p->tasks.dag, p->tasks.done_task[i], p->tasks.start_task[gate]));
    } else if (!has_edge(p->tasks.dag, p->tasks.done_task[i], p->tasks.start_task[gate])) {
      fail_msg("node %d (kind %d) does not finish before the gate", i,
               (int)kn->kind);
    }
  }
  assert_int_equal(updates, remat_num_params(f.g));
  fixture_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_policy_saves_exactly),
      cmocka_unit_test(test_nested_regions),
      cmocka_unit_test(test_graph_policy),
      cmocka_unit_test(test_budget_source),
      cmocka_unit_test(test_plan_of_errors),
      cmocka_unit_test(test_lookahead_edges),
      cmocka_unit_test(test_gate_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
