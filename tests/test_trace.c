/* Tests of the Chrome trace of training steps (remat_trace_steps), read
 * back with cJSON: the steps asked for and no others, tasks named by layer
 * and tensor, and "live bytes" counters whose peaks are the step's
 * measured peaks (on one worker, where the trace's order is the run's),
 * rising in forward, with recompute only in backward, and back to the
 * start at the end of a step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>
#include <cmocka.h>

#include "gpt_fixture.h"
#include "tmpdir.h"

static const remat_gpt_config tiny = {
    .layers = 2, .d_model = 16, .heads = 2, .seq = 5, .batch = 3, .vocab = 7};

static cJSON *read_trace(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char text[1 << 22];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  assert_true(n > 0 && n < sizeof text - 1);
  text[n] = '\0';
  cJSON *doc = cJSON_Parse(text);
  assert_non_null(doc);
  return doc;
}

static const char *str(const cJSON *e, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
  return cJSON_IsString(v) ? v->valuestring : "";
}

static double num(const cJSON *e, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
  assert_true(cJSON_IsNumber(v));
  return v->valuedouble;
}

static int64_t arg(const cJSON *e, const char *key) {
  return (int64_t)num(cJSON_GetObjectItemCaseSensitive(e, "args"), key);
}

/* What the test reads from one step of a trace. */
typedef struct step_view {
  double start, end; /* of the step's event */
  int64_t tasks;     /* task events */
  int64_t peak_total, peak_recomputed, peak_act_grads, peak_activations;
  int64_t first_total, last_total;
  double last_forward_end;    /* end of the last forward task */
  double first_recompute;     /* ts of the first counter with recompute */
  int64_t act_at_forward_end; /* activations then */
  int found_probs_recompute, found_ffn_dw, found_qkv_forward;
} step_view;

static int64_t total(const cJSON *c) {
  int64_t sum = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(c, "args")) sum +=
      (int64_t)v->valuedouble;
  return sum;
}

static int64_t activations(const cJSON *c) {
  return arg(c, "activations saved") + arg(c, "activations not saved");
}

static void view_tasks(const cJSON *events, int step, step_view *v) {
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    if (strcmp(str(e, "ph"), "X") != 0 || strcmp(str(e, "cat"), "step") == 0)
      continue;
    if (arg(e, "step") != step)
      continue;
    v->tasks++;
    const char *name = str(e, "name"), *cat = str(e, "cat");
    double end = num(e, "ts") + num(e, "dur");
    if (strcmp(cat, "forward") == 0 && end > v->last_forward_end)
      v->last_forward_end = end;
    v->found_probs_recompute += strcmp(name, "h1.attn_probs recompute") == 0 &&
                                strcmp(cat, "recompute") == 0;
    v->found_ffn_dw +=
        strcmp(name, "h0.ffn_in dW") == 0 && strcmp(cat, "backward") == 0 &&
        strcmp(str(cJSON_GetObjectItemCaseSensitive(e, "args"), "kernel"),
               "linear.dw") == 0;
    v->found_qkv_forward +=
        strcmp(name, "h1.qkv") == 0 && strcmp(cat, "forward") == 0;
  }
}

static void view_counters(const cJSON *events, step_view *v) {
  const cJSON *e;
  int seen = 0;
  v->first_recompute = -1.0;
  cJSON_ArrayForEach(e, events) {
    if (strcmp(str(e, "ph"), "C") != 0)
      continue;
    double ts = num(e, "ts");
    if (ts < v->start || ts > v->end)
      continue;
    int64_t t = total(e);
    if (!seen++)
      v->first_total = t;
    v->last_total = t;
    v->peak_total = t > v->peak_total ? t : v->peak_total;
    int64_t r = arg(e, "recomputed"), g = arg(e, "activation gradients");
    int64_t a = activations(e);
    v->peak_recomputed = r > v->peak_recomputed ? r : v->peak_recomputed;
    v->peak_act_grads = g > v->peak_act_grads ? g : v->peak_act_grads;
    v->peak_activations = a > v->peak_activations ? a : v->peak_activations;
    if (r > 0 && v->first_recompute < 0.0)
      v->first_recompute = ts;
    if (ts <= v->last_forward_end)
      v->act_at_forward_end = a;
  }
}

/* The step events, then each step's tasks and counters. */
static int view_steps(const cJSON *doc, step_view *views, int max,
                      char kinds[][64]) {
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
  assert_true(cJSON_IsArray(events));
  int n = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    if (strcmp(str(e, "cat"), "step") != 0)
      continue;
    assert_true(n < max);
    memset(&views[n], 0, sizeof views[n]);
    views[n].start = num(e, "ts");
    views[n].end = views[n].start + num(e, "dur");
    snprintf(kinds[n], 64, "%s", str(e, "name"));
    n++;
  }
  for (int s = 0; s < n; s++) {
    view_tasks(events, s + 1, &views[s]);
    view_counters(events, &views[s]);
  }
  return n;
}

static void test_trace_training_steps(void **state) {
  (void)state;
  char path[160];
  snprintf(path, sizeof path, "%s/steps.json", dir);
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  fixture f;
  assert_int_equal(fixture_open(&f, &tiny, 1, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  assert_int_equal(remat_trace_steps(f.g, path, 2), REMAT_OK);
  remat_step_stats st[3];
  for (int i = 0; i < 3; i++) {
    assert_int_equal(remat_step(f.g, &st[i]), REMAT_OK);
    assert_int_equal(st[i].trace_status, REMAT_OK);
  }
  cJSON *doc = read_trace(path);
  step_view v[4];
  char kinds[4][64];
  assert_int_equal(view_steps(doc, v, 4, kinds), 2);
  assert_string_equal(kinds[0], "step 1 (remat_step)");
  assert_string_equal(kinds[1], "step 2 (remat_step)");
  for (int s = 0; s < 2; s++) {
    assert_int_equal(v[s].tasks, st[s].tasks);
    assert_true(v[s].found_probs_recompute >= 3); /* start, tiles, done */
    assert_true(v[s].found_ffn_dw >= 3);
    assert_true(v[s].found_qkv_forward >= 3);
    /* One worker: the trace's order is the run's, so its peaks are the
     * arena's. */
    assert_int_equal(v[s].peak_total, st[s].peak_bytes);
    assert_int_equal(v[s].peak_recomputed, st[s].peak[REMAT_MEM_RECOMPUTED]);
    assert_int_equal(v[s].peak_act_grads, st[s].peak[REMAT_MEM_ACT_GRADS]);
    assert_int_equal(v[s].peak_activations, st[s].peak[REMAT_MEM_ACTIVATIONS]);
    assert_int_equal(v[s].last_total, v[s].first_total);
    /* Memory rises in forward; recompute comes after it. */
    assert_true(v[s].act_at_forward_end > 0);
    assert_true(v[s].first_recompute > v[s].last_forward_end);
  }
  assert_true(v[1].start >= v[0].end);
  cJSON_Delete(doc);
  fixture_close(&f);
}

static void test_trace_accumulation_and_errors(void **state) {
  (void)state;
  char path[160];
  snprintf(path, sizeof path, "%s/accum.json", dir);
  remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  fixture f;
  assert_int_equal(fixture_open(&f, &tiny, 2, "dots_saveable", 0, &opt),
                   REMAT_OK);
  assert_int_equal(remat_trace_steps(f.g, dir, 1), REMAT_ERR_IO);
  char want[256];
  snprintf(want, sizeof want, "remat_trace_steps: '%s' is not a regular file",
           dir);
  assert_string_equal(remat_last_error(), want);
  assert_int_equal(remat_trace_steps(f.g, path, -1), REMAT_ERR_INVALID_ARG);
  assert_int_equal(remat_trace_steps(f.g, path, 5), REMAT_OK);
  assert_int_equal(remat_accumulate(f.g, NULL), REMAT_OK);
  assert_int_equal(remat_step(f.g, NULL), REMAT_OK);
  assert_int_equal(remat_trace_steps(f.g, NULL, 0), REMAT_OK); /* stop */
  assert_int_equal(remat_step(f.g, NULL), REMAT_OK);
  cJSON *doc = read_trace(path);
  step_view v[4];
  char kinds[4][64];
  assert_int_equal(view_steps(doc, v, 4, kinds), 2);
  assert_string_equal(kinds[0], "step 1 (remat_accumulate)");
  assert_string_equal(kinds[1], "step 2 (remat_step)");
  /* Two workers: both ran tasks, each on its thread. */
  int tids[2] = {0, 0};
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "traceEvents")) {
    if (strcmp(str(e, "ph"), "X") == 0 && strcmp(str(e, "cat"), "step") != 0) {
      int tid = (int)num(e, "tid");
      assert_true(tid == 0 || tid == 1);
      tids[tid]++;
    }
  }
  assert_true(tids[0] > 0 && tids[1] > 0);
  cJSON_Delete(doc);
  fixture_close(&f);
}

static void test_region_name_errors(void **state) {
  (void)state;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  remat_runtime *rt;
  remat_graph *g;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_region_name(g, "h0"), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_region_name: no checkpoint region is open");
  remat_graph_destroy(g);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_region_begin(g, NULL), REMAT_OK);
  assert_int_equal(remat_region_name(g, "block one"), REMAT_ERR_INVALID_ARG);
  assert_non_null(strstr(remat_last_error(),
                         "remat_region_name: name 'block one' is not valid: "));
  assert_int_equal(remat_graph_status(g), REMAT_ERR_INVALID_ARG); /* sticky */
  remat_graph_destroy(g);
  assert_int_equal(remat_region_name(NULL, "h0"), REMAT_ERR_INVALID_ARG);
  remat_runtime_destroy(rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_trace_training_steps),
      cmocka_unit_test(test_trace_accumulation_and_errors),
      cmocka_unit_test(test_region_name_errors),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
