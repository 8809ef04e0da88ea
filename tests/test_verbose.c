/* Tests of the REMAT_VERBOSE=1 report (compile/report.c), line by line:
 * each plan opens with the graph it is for (training, gradients or
 * inference, with its loss, optimizer and parameters), a region's policy
 * says where it came from (its own, remat_config.policy, REMAT_POLICY, or
 * the built-in default when neither is set), and the saved and recomputed
 * lists hold every tensor that the region's bytes count, by name or, for
 * one never named, by producer ("b0.linear#0"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "remat.h"
#include "tmpdir.h"

enum { ROWS = 128, IN = 16, HIDDEN = 1024, CLASSES = 1024 };

typedef enum graph_kind { TRAINING, GRADIENTS, INFERENCE } graph_kind;

/* Builds and compiles x -> [region b0: linear (unnamed), relu named
 * "act", linear] -> cross entropy on `rt`, with region policy `own`
 * (NULL: the runtime's default). */
static void build(remat_runtime *rt, graph_kind kind, remat_policy *own) {
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  const int64_t xd[] = {ROWS, IN}, td[] = {ROWS}, w1d[] = {HIDDEN, IN},
                w2d[] = {CLASSES, HIDDEN};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, xd);
  remat_tensor *t = remat_input(g, "t", REMAT_I32, 1, td);
  remat_tensor *w1 = remat_param(g, "w1", 2, w1d, REMAT_INIT_NORMAL, 0.1f);
  remat_tensor *w2 = remat_param(g, "w2", 2, w2d, REMAT_INIT_NORMAL, 0.1f);
  assert_int_equal(remat_region_begin(g, own), REMAT_OK);
  assert_int_equal(remat_region_name(g, "b0"), REMAT_OK);
  remat_tensor *act = remat_relu(g, remat_linear(g, x, w1, NULL));
  assert_int_equal(remat_checkpoint_name(g, act, "act"), REMAT_OK);
  remat_tensor *logits = remat_linear(g, act, w2, NULL);
  assert_int_equal(remat_region_end(g), REMAT_OK);
  remat_tensor *loss = remat_cross_entropy(g, logits, t);
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-3f};
  if (kind == INFERENCE)
    assert_int_equal(remat_keep(g, logits), REMAT_OK);
  assert_int_equal(remat_compile(g, kind == INFERENCE ? NULL : loss,
                                 kind == TRAINING ? &opt : NULL),
                   REMAT_OK);
  remat_graph_destroy(g);
}

/* Creates a runtime with REMAT_VERBOSE 1 (and `config_policy` as
 * remat_config.policy unless NULL), compiles one graph of each kind on
 * it, and returns what went to stderr (static storage). */
static const char *report(const char *config_policy, remat_policy *own) {
  static char text[1 << 16];
  char path[160];
  snprintf(path, sizeof path, "%s/verbose.txt", dir);
  fflush(stderr);
  int saved = dup(2);
  FILE *f = fopen(path, "w+");
  assert_non_null(f);
  assert_true(saved >= 0 && dup2(fileno(f), 2) == 2);
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_VERBOSE |
                            (config_policy ? REMAT_SET_POLICY : 0u),
                     .num_threads = 1,
                     .verbose = 1,
                     .policy = config_policy};
  remat_runtime *rt;
  remat_status s = remat_runtime_create(&rc, &rt);
  if (s == REMAT_OK) {
    build(rt, TRAINING, own);
    build(rt, GRADIENTS, own);
    build(rt, INFERENCE, own);
    remat_runtime_destroy(rt);
  }
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  assert_int_equal(s, REMAT_OK);
  rewind(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  return text;
}

/* How many whole lines of text equal `line` (or, with `prefix`, start
 * with it). */
static int count_matching(const char *text, const char *line, bool prefix) {
  int n = 0;
  size_t len = strlen(line);
  for (const char *at = text; at != NULL && *at != '\0';) {
    n += strncmp(at, line, len) == 0 && (prefix || at[len] == '\n');
    at = strchr(at, '\n');
    at = at != NULL ? at + 1 : NULL;
  }
  return n;
}

static int count_lines(const char *text, const char *line) {
  return count_matching(text, line, false);
}

static void test_graphs_labelled(void **state) {
  (void)state;
  unsetenv("REMAT_POLICY");
  const char *text = report(NULL, NULL);
  assert_int_equal(count_lines(text, "remat plan of a training graph (loss "
                                     "cross_entropy#3, adamw, 2 "
                                     "parameters):"), 1);
  assert_int_equal(count_lines(text, "remat plan of a gradient graph (loss "
                                     "cross_entropy#3, no optimizer, 2 "
                                     "parameters):"), 1);
  assert_int_equal(count_lines(text, "remat plan of an inference graph "
                                     "(forward only, 2 parameters):"), 1);
  /* No other plan line: each plan opens with its graph. */
  int plans = 0;
  for (const char *at = text; (at = strstr(at, "remat plan")) != NULL; at++)
    plans++;
  assert_int_equal(plans, 3);
}

static void test_policy_sources(void **state) {
  (void)state;
  unsetenv("REMAT_POLICY");
  assert_int_equal(count_lines(report(NULL, NULL),
                               "  region 0 'b0': policy nothing_saveable "
                               "(the runtime's default, as neither "
                               "remat_config.policy nor REMAT_POLICY is "
                               "set)"), 3);
  assert_int_equal(count_lines(report("dots_saveable", NULL),
                               "  region 0 'b0': policy dots_saveable (the "
                               "runtime's default, from "
                               "remat_config.policy)"), 3);
  setenv("REMAT_POLICY", "everything_saveable", 1);
  assert_int_equal(count_lines(report(NULL, NULL),
                               "  region 0 'b0': policy everything_saveable "
                               "(the runtime's default, from REMAT_POLICY)"),
                   3);
  remat_policy *own = remat_policy_dots_saveable();
  assert_int_equal(count_lines(report(NULL, own),
                               "  region 0 'b0': policy dots_saveable (its "
                               "own, given to remat_region_begin)"), 3);
  remat_policy_destroy(own);
  unsetenv("REMAT_POLICY");
}

/* nothing_saveable: the region's output (an unnamed linear) is saved, the
 * rest recomputed; the bytes beside the lists count the same tensors
 * (ROWS x CLASSES floats saved, 0.50 MiB; ROWS x HIDDEN twice
 * recomputed, 1.00 MiB) in the two graphs with a backward pass. */
static void test_unnamed_tensors_listed(void **state) {
  (void)state;
  unsetenv("REMAT_POLICY");
  const char *text = report(NULL, NULL);
  assert_int_equal(count_matching(text, "    saved 0.50 MiB, recomputed 1.00 "
                                        "MiB, recompute ", true), 2);
  assert_int_equal(count_lines(text, "    saved: b0.linear#2"), 2);
  assert_int_equal(count_lines(text, "    recomputed: b0.linear#0, b0.act"),
                   2);
  /* The inference graph keeps nothing for a backward pass. */
  assert_int_equal(count_lines(text, "    saved: (none)"), 1);
  assert_int_equal(count_lines(text, "    recomputed: (none)"), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_graphs_labelled),
      cmocka_unit_test(test_policy_sources),
      cmocka_unit_test(test_unnamed_tensors_listed),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
