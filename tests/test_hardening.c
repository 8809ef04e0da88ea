/* Tests of the runtime against bad input and misuse by an embedding
 * program: sizes that would overflow, duplicate parameter names, two
 * threads on one graph, destroy during a step, a step after fork(), a
 * trace that cannot be written after the step succeeded, NaN through the
 * vectorized exp, memory budgets whose feasibility is monotonic, and
 * output that is what it claims to be: builder calls after compile, names
 * that are not UTF-8, junk after a header, quoted paths, long policies. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "gpt_fixture.h"
#include "ops/dnnl_util.h"
#include "runtime/internal.h"
#include "tmpdir.h"

static const remat_gpt_config tiny = {
    .layers = 2, .d_model = 16, .heads = 2, .seq = 8, .batch = 2, .vocab = 11};

static remat_runtime *runtime(int threads) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = threads};
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  return rt;
}

/* ---- sizes ---- */

static void expect_limit(remat_graph *g, const char *message) {
  assert_int_equal(remat_graph_status(g), REMAT_ERR_LIMIT);
  assert_string_equal(remat_graph_error(g), message);
}

static void test_huge_inputs(void **state) {
  (void)state;
  remat_runtime *rt = runtime(1);
  remat_graph *g;
  /* 2^31 * 2^31 * 4 wraps to 0 in int64 */
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t wrap[3] = {INT64_C(1) << 31, INT64_C(1) << 31, 4};
  assert_null(remat_input(g, "x", REMAT_F32, 3, wrap));
  expect_limit(g, "input 'x' [2147483648,2147483648,4]: more than 2^34 "
                  "elements, the limit for one tensor");
  remat_graph_destroy(g);
  /* 16 * 2^31 * 3 * 2^29 wraps to 0 as well */
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t qkv[3] = {16, INT64_C(1) << 31, 3 * (INT64_C(1) << 29)};
  assert_null(remat_input(g, "qkv", REMAT_F32, 3, qkv));
  expect_limit(g, "input 'qkv' [16,2147483648,1610612736]: more than 2^34 "
                  "elements, the limit for one tensor");
  remat_graph_destroy(g);
  /* a parameter just over the limit, and one at it */
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t at[2] = {INT64_C(1) << 17, INT64_C(1) << 17};
  int64_t over[2] = {(INT64_C(1) << 17) + 1, INT64_C(1) << 17};
  int64_t one[1] = {1};
  assert_non_null(remat_input(g, "fits", REMAT_F32, 1, one));
  assert_int_equal(remat_graph_status(g), REMAT_OK);
  assert_null(remat_param(g, "w", 2, over, REMAT_INIT_ZEROS, 0.0f));
  expect_limit(g, "param 'w' [131073,131072]: more than 2^34 elements, the "
                  "limit for one tensor");
  remat_graph_destroy(g);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  (void)at; /* 2^34 elements are allowed but would need 64 GiB to compile */
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* Outputs whose element count overflows or passes the limit, from inputs
 * that are each within it. */
static void test_huge_outputs(void **state) {
  (void)state;
  remat_runtime *rt = runtime(1);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t qkv[3] = {1, INT64_C(1) << 18, 24};
  remat_tensor *x = remat_input(g, "qkv", REMAT_F32, 3, qkv);
  assert_non_null(x);
  assert_null(remat_attention_scores(g, x, 1));
  expect_limit(g, "output 'attn_scores_0' [1,1,262144,262144]: more than "
                  "2^34 elements, the limit for one tensor");
  remat_graph_destroy(g);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t ad[3] = {INT64_C(1) << 20, INT64_C(1) << 10, 1};
  int64_t bd[3] = {INT64_C(1) << 20, 1, INT64_C(1) << 10};
  remat_tensor *a = remat_input(g, "a", REMAT_F32, 3, ad);
  remat_tensor *b = remat_input(g, "b", REMAT_F32, 3, bd);
  assert_null(remat_matmul(g, a, b));
  expect_limit(g, "output 'matmul_0' [1048576,1024,1024]: more than 2^34 "
                  "elements, the limit for one tensor");
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

static void test_duplicate_param_names(void **state) {
  (void)state;
  remat_runtime *rt = runtime(1);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t d[1] = {4};
  assert_non_null(remat_param(g, "w", 1, d, REMAT_INIT_ZEROS, 0.0f));
  assert_null(remat_param(g, "w", 1, d, REMAT_INIT_ZEROS, 0.0f));
  assert_int_equal(remat_graph_status(g), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_graph_error(g),
                      "param 'w': a parameter of this graph already has this "
                      "name: parameter names must be unique (checkpoints "
                      "store parameters by name)");
  remat_graph_destroy(g);
  /* renaming a parameter would make the same clash at save time */
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  remat_tensor *w = remat_param(g, "w", 1, d, REMAT_INIT_ZEROS, 0.0f);
  remat_tensor *v = remat_param(g, "v", 1, d, REMAT_INIT_ZEROS, 0.0f);
  assert_non_null(v);
  assert_int_equal(remat_checkpoint_name(g, w, "v"), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_graph_error(g),
                      "remat_checkpoint_name: 'w' is a parameter: parameters "
                      "keep the name given to remat_param (checkpoints store "
                      "them by it); name op results");
  assert_string_equal(remat_tensor_name(w), "w");
  remat_graph_destroy(g);
  /* and renaming after compile */
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  remat_tensor *x = remat_param(g, "x", 1, d, REMAT_INIT_ONES, 0.0f);
  remat_tensor *y = remat_sum(g, x);
  assert_int_equal(remat_compile(g, y, NULL), REMAT_OK);
  assert_int_equal(remat_checkpoint_name(g, y, "loss"), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_checkpoint_name: the graph is already compiled");
  assert_int_equal(remat_graph_status(g), REMAT_OK);
  assert_string_equal(remat_tensor_name(y), "sum_0");
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* ---- two host threads on one graph ---- */

static void test_graph_busy(void **state) {
  (void)state;
  fixture f;
  assert_int_equal(fixture_open(&f, &tiny, 1, "nothing_saveable", 0, NULL),
                   REMAT_OK);
  char path[160];
  snprintf(path, sizeof path, "%s/busy.safetensors", dir);
  atomic_store(&f.g->busy, 1); /* as if another thread were inside */
  const char *what[] = {"remat_step", "remat_feed", "remat_load_safetensors",
                        "remat_save_safetensors", "remat_read"};
  float loss;
  size_t n = (size_t)tiny.batch * tiny.seq * sizeof(int32_t);
  remat_status got[5] = {remat_step(f.g, NULL),
                         remat_feed(f.g, f.m.tokens, f.tokens, n),
                         remat_load_safetensors(f.g, path),
                         remat_save_safetensors(f.g, path),
                         remat_read(f.g, f.m.loss, &loss, sizeof loss)};
  for (int i = 0; i < 5; i++) {
    char want[256];
    snprintf(want, sizeof want,
             "%s: another thread is using this graph: a graph takes one call "
             "at a time (use one graph per thread, or serialize the calls)",
             what[i]);
    assert_int_equal(got[i], REMAT_ERR_STATE);
    if (i == 4)
      assert_string_equal(remat_last_error(), want);
  }
  assert_int_equal(access(path, F_OK), -1); /* the save wrote nothing */
  atomic_store(&f.g->busy, 0);
  assert_int_equal(remat_step(f.g, NULL), REMAT_OK);
  assert_int_equal(remat_save_safetensors(f.g, path), REMAT_OK); /* nested */
  assert_int_equal(remat_load_safetensors(f.g, path), REMAT_OK);
  fixture_close(&f);
}

typedef struct stepper {
  remat_graph *g;
  int steps, ok, busy, other;
} stepper;

static void *step_loop(void *arg) {
  stepper *s = arg;
  for (int i = 0; i < s->steps; i++) {
    remat_status st = remat_step(s->g, NULL);
    if (st == REMAT_OK)
      s->ok++;
    else if (st == REMAT_ERR_STATE)
      s->busy++;
    else
      s->other++;
  }
  return NULL;
}

/* Two threads stepping one graph: every call either runs or gets
 * REMAT_ERR_STATE; nothing crashes (ASan and TSan builds run this too). */
static void test_two_threads_one_graph(void **state) {
  (void)state;
  fixture f;
  assert_int_equal(fixture_open(&f, &tiny, 2, "nothing_saveable", 0, NULL),
                   REMAT_OK);
  stepper s[2] = {{f.g, 40, 0, 0, 0}, {f.g, 40, 0, 0, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, step_loop, &s[i]), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(s[i].other, 0);
    assert_int_equal(s[i].ok + s[i].busy, 40);
  }
  /* A call is refused only while the other thread's call runs, so some
   * call ran; how many depends on the interleaving (a thread may spend
   * all its calls inside one of the other's). The graph is free after. */
  assert_true(s[0].ok + s[1].ok >= 1);
  assert_int_equal(remat_step(f.g, NULL), REMAT_OK);
  fixture_close(&f);
}

typedef struct long_step {
  remat_graph *g;
  remat_status status;
} long_step;

static void *one_step(void *arg) {
  long_step *l = arg;
  l->status = remat_step(l->g, NULL);
  return NULL;
}

/* Destroying a graph while another thread steps it waits for the step. */
static void test_destroy_during_step(void **state) {
  (void)state;
  remat_gpt_config c = tiny;
  c.layers = 6;
  c.d_model = 64;
  c.seq = 64;
  fixture f;
  assert_int_equal(fixture_open(&f, &c, 1, "nothing_saveable", 0, NULL),
                   REMAT_OK);
  long_step l = {f.g, REMAT_ERR_STATE};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, one_step, &l), 0);
  while (atomic_load(&f.g->busy) == 0) /* the step has entered the graph */
    sched_yield();
  remat_graph_destroy(f.g);
  f.g = NULL;
  pthread_join(th, NULL);
  assert_int_equal(l.status, REMAT_OK);
  fixture_close(&f);
}

/* ---- fork ---- */

static void test_step_after_fork(void **state) {
  (void)state;
  fixture f;
  assert_int_equal(fixture_open(&f, &tiny, 2, "nothing_saveable", 0, NULL),
                   REMAT_OK);
  assert_int_equal(remat_step(f.g, NULL), REMAT_OK);
  fflush(NULL);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    alarm(20); /* a hang fails the test instead of blocking it */
    remat_status s = remat_step(f.g, NULL);
    const char *want =
        "remat_step: this process was forked after the runtime was created, "
        "and a runtime's worker threads do not survive fork(): create "
        "runtimes in the child, after the fork";
    int ok = s == REMAT_ERR_STATE && strcmp(remat_last_error(), want) == 0;
    fixture_close(&f); /* must not hang joining threads that are gone */
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(remat_step(f.g, NULL), REMAT_OK); /* the parent goes on */
  fixture_close(&f);
}

/* ---- a trace that fails after the step ---- */

/* fixture_open with REMAT_TRACE set to `path` (the fixture turns it off). */
static remat_status open_traced(fixture *f, const char *path,
                                const remat_optimizer *opt) {
  memset(f, 0, sizeof *f);
  f->cfg = tiny;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TRACE,
                     .num_threads = 1, .trace_path = path};
  size_t n = (size_t)tiny.batch * (size_t)tiny.seq;
  f->tokens = malloc(n * sizeof *f->tokens);
  f->targets = malloc(n * sizeof *f->targets);
  assert_non_null(f->tokens);
  assert_non_null(f->targets);
  fixture_batch(&tiny, f->tokens, f->targets, 1);
  remat_status s = remat_runtime_create(&rc, &f->rt);
  if (s == REMAT_OK)
    s = remat_graph_create(f->rt, &f->g);
  if (s == REMAT_OK)
    s = remat_graph_seed(f->g, 7);
  if (s == REMAT_OK)
    s = remat_gpt_build(f->g, &tiny, &f->m);
  if (s == REMAT_OK)
    s = remat_compile(f->g, f->m.loss, opt);
  if (s == REMAT_OK)
    s = remat_feed(f->g, f->m.tokens, f->tokens, n * sizeof *f->tokens);
  if (s == REMAT_OK)
    s = remat_feed(f->g, f->m.targets, f->targets, n * sizeof *f->targets);
  return s;
}

static void test_trace_failure_after_step(void **state) {
  (void)state;
  char sub[128], path[160];
  snprintf(sub, sizeof sub, "%s/trace-dir", dir);
  snprintf(path, sizeof path, "%s/step.json", sub);
  assert_int_equal(mkdir(sub, 0700), 0);
  remat_optimizer adam = {.kind = REMAT_OPT_ADAMW, .lr = 0.01f};
  fixture traced, plain;
  assert_int_equal(open_traced(&traced, path, &adam), REMAT_OK);
  assert_int_equal(fixture_open(&plain, &tiny, 1, "nothing_saveable", 0, &adam),
                   REMAT_OK);
  assert_int_equal(rmdir(sub), 0); /* now the trace cannot be written */
  for (int i = 0; i < 2; i++) {
    remat_step_stats st = {.size = sizeof st};
    assert_int_equal(remat_step(traced.g, &st), REMAT_OK);
    assert_int_equal(st.trace_status, REMAT_ERR_IO);
    assert_non_null(strstr(remat_last_error(),
                           "remat_step: the step succeeded but its trace was "
                           "not written: "));
    assert_int_equal(remat_step(plain.g, &st), REMAT_OK);
    assert_int_equal(st.trace_status, REMAT_OK);
  }
  size_t na, nb;
  float *a = fixture_snapshot(traced.g, &na), *b = fixture_snapshot(plain.g, &nb);
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(na, nb);
  assert_memory_equal(a, b, na * sizeof *a); /* same updates, same step count */
  free(a);
  free(b);
  fixture_close(&traced);
  fixture_close(&plain);
}

/* ---- NaN and Inf through the vectorized exp ---- */

static void test_expf_nonfinite(void **state) {
  (void)state;
  volatile float nan_in = NAN, inf_in = INFINITY;
  assert_true(isnan(op_expf(nan_in)));
  assert_true(isnan(op_expf(-nan_in)));
  assert_true(isfinite(op_expf(inf_in)) && op_expf(inf_in) > 1e38f);
  assert_true(op_expf(-inf_in) >= 0.0f && op_expf(-inf_in) < 1e-37f);
  assert_true(fabsf(op_expf(1.0f) - 2.7182818f) < 1e-6f);
}

/* ---- memory budgets ---- */

/* The model on which budgets 1,059,648 and 1,080,000 compiled while
 * 1,100,000 failed, before the planner counted persistent bytes in its
 * model budget and fell back to uniform plans. */
static const remat_gpt_config budget_model = {
    .layers = 4, .d_model = 32, .heads = 4, .seq = 16, .batch = 2, .vocab = 13};

static int64_t smallest_feasible(void) {
  fixture f;
  remat_gpt_config c = budget_model;
  assert_int_equal(fixture_open(&f, &c, 1, "nothing_saveable", 1, NULL),
                   REMAT_ERR_BUDGET);
  const char *at = strstr(remat_last_error(), "smallest feasible budget for "
                                              "this graph is ");
  assert_non_null(at);
  long long v = atoll(at + strlen("smallest feasible budget for this graph "
                                  "is "));
  fixture_close(&f);
  return v;
}

/* Every budget from the reported smallest feasible one up to the peak of
 * saving everything compiles, and its predicted peak fits it; one byte
 * less than the smallest fails with the same figure. */
static void test_budget_monotonic(void **state) {
  (void)state;
  remat_gpt_config c = budget_model;
  int64_t smallest = smallest_feasible();
  fixture all;
  assert_int_equal(fixture_open(&all, &c, 1, "everything_saveable", 0, NULL),
                   REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(all.g, &st), REMAT_OK);
  int64_t top = st.predicted_peak_bytes + 4096;
  fixture_close(&all);
  assert_true(smallest > 0 && smallest < top);
  for (int i = 0; i <= 100; i++) {
    int64_t budget = smallest + (top - smallest) * i / 100;
    fixture f;
    remat_status s = fixture_open(&f, &c, 1, "nothing_saveable", budget, NULL);
    if (s != REMAT_OK)
      fail_msg("budget %lld (smallest %lld): %s", (long long)budget,
               (long long)smallest, remat_last_error());
    assert_int_equal(remat_step(f.g, &st), REMAT_OK);
    assert_true(st.predicted_peak_bytes <= budget);
    fixture_close(&f);
  }
  fixture f;
  assert_int_equal(fixture_open(&f, &c, 1, "nothing_saveable", smallest - 1,
                                NULL),
                   REMAT_ERR_BUDGET);
  char want[64];
  snprintf(want, sizeof want, "is %lld bytes", (long long)smallest);
  assert_non_null(strstr(remat_last_error(), want));
  fixture_close(&f);
}

/* ---- output that is what it claims to be (issue 29, class 7) ---- */

/* A builder call after compile fails alone: NULL (or REMAT_ERR_STATE) and
 * remat_last_error, while the compiled graph keeps REMAT_OK and steps. */
static void test_build_after_compile(void **state) {
  (void)state;
  remat_runtime *rt = runtime(1);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t d[1] = {4};
  remat_tensor *x = remat_param(g, "x", 1, d, REMAT_INIT_ONES, 0.0f);
  remat_tensor *y = remat_sum(g, x);
  remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.5f};
  assert_int_equal(remat_compile(g, y, &sgd), REMAT_OK);
  assert_null(remat_param(g, "late", 1, d, REMAT_INIT_ONES, 0.0f));
  assert_string_equal(remat_last_error(),
                      "remat_param: the graph is already compiled: build "
                      "every tensor before remat_compile");
  assert_null(remat_relu(g, x));
  assert_null(remat_gelu(g, x, (remat_gelu_form)7));
  assert_int_equal(remat_region_begin(g, NULL), REMAT_ERR_STATE);
  assert_int_equal(remat_region_end(g), REMAT_ERR_STATE);
  assert_int_equal(remat_checkpoint_name(g, NULL, "n"), REMAT_ERR_STATE);
  assert_int_equal(remat_keep(g, x), REMAT_ERR_STATE);
  remat_gpt m;
  assert_int_equal(remat_gpt_build(g, &tiny, &m), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_gpt_build: the graph is already compiled: build "
                      "the model before remat_compile");
  assert_int_equal(remat_graph_status(g), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(g, &st), REMAT_OK);
  float v[4];
  assert_int_equal(remat_read(g, x, v, sizeof v), REMAT_OK);
  assert_true(v[0] == 0.5f); /* 1 - 0.5 * d(sum)/dx */
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* The header length and JSON text of a safetensors file (malloc'd). */
static char *header_of(const char *path, uint64_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  unsigned char b[8];
  assert_int_equal(fread(b, 1, 8, f), 8);
  *len = 0;
  for (int i = 7; i >= 0; i--)
    *len = *len << 8 | b[i];
  char *text = calloc(1, *len + 1);
  assert_non_null(text);
  assert_int_equal(fread(text, 1, *len, f), *len);
  fclose(f);
  return text;
}

/* Names are UTF-8 (refused at build otherwise), so the header of every
 * save is JSON whose names read back as given. */
static void test_names_utf8(void **state) {
  (void)state;
  remat_runtime *rt = runtime(1);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t d[1] = {2};
  assert_null(remat_param(g, "w\xff", 1, d, REMAT_INIT_ONES, 0.0f));
  assert_int_equal(remat_graph_status(g), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_graph_error(g),
                      "remat_param: name 'w\\xFF' is not valid UTF-8 (byte "
                      "\\xFF at offset 1): names must be UTF-8, as the JSON "
                      "of a safetensors header is");
  remat_graph_destroy(g);
  /* overlong '/', a surrogate, a cut sequence, past U+10FFFF */
  const char *bad[] = {"\xc0\xaf", "a\xed\xa0\x80", "\xe2\x82",
                       "\xf4\x90\x80\x80"};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
    assert_null(remat_input(g, bad[i], REMAT_F32, 1, d));
    assert_non_null(strstr(remat_graph_error(g), "is not valid UTF-8"));
    remat_graph_destroy(g);
  }
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  const char *name = "w\xc3\xa9\"\\\t\xf0\x9f\x99\x82"; /* w é " \ tab 🙂 */
  remat_tensor *w = remat_param(g, name, 1, d, REMAT_INIT_ONES, 0.0f);
  assert_non_null(w);
  assert_int_equal(remat_compile(g, remat_sum(g, w), NULL), REMAT_OK);
  char path[160];
  snprintf(path, sizeof path, "%s/utf8.safetensors", dir);
  assert_int_equal(remat_save_safetensors(g, path), REMAT_OK);
  uint64_t len;
  char *text = header_of(path, &len);
  cJSON *root = cJSON_Parse(text);
  assert_non_null(root);
  assert_non_null(cJSON_GetObjectItemCaseSensitive(root, name));
  cJSON_Delete(root);
  free(text);
  assert_int_equal(remat_load_safetensors(g, path), REMAT_OK);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* Bytes after the header's JSON object other than its padding are refused
 * on load, and the parameters keep their values. */
static void test_header_junk(void **state) {
  (void)state;
  remat_runtime *rt = runtime(1);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t d[1] = {2};
  remat_tensor *w = remat_param(g, "w", 1, d, REMAT_INIT_ONES, 0.0f);
  assert_int_equal(remat_compile(g, remat_sum(g, w), NULL), REMAT_OK);
  char path[160];
  snprintf(path, sizeof path, "%s/junk.safetensors", dir);
  const char json[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],"
                      "\"data_offsets\":[0,8]}}  x     ";
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  unsigned char len[8] = {sizeof json - 1};
  float data[2] = {3.0f, 4.0f};
  fwrite(len, 1, 8, f);
  fwrite(json, 1, sizeof json - 1, f);
  fwrite(data, sizeof data, 1, f);
  fclose(f);
  assert_int_equal(remat_load_safetensors(g, path), REMAT_ERR_IO);
  char want[480];
  snprintf(want, sizeof want, "remat_load_safetensors: '%s': the header's "
           "JSON object ends at byte %zu of %zu, and byte %zu after it is "
           "not whitespace: the header must be the object padded with "
           "spaces", path, sizeof json - 9, sizeof json - 1,
           sizeof json - 7);
  assert_string_equal(remat_last_error(), want);
  float v[2];
  assert_int_equal(remat_read(g, w, v, sizeof v), REMAT_OK);
  assert_true(v[0] == 1.0f && v[1] == 1.0f);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* A path and a tensor name of control bytes are quoted in at most 100
 * bytes each, so the words after them are whole (quoted as 4 bytes per
 * byte, 100 bytes of each took 800 of the message's 511). */
static void test_quoted_path_keeps_cause(void **state) {
  (void)state;
  remat_runtime *rt = runtime(1);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t d[1] = {2};
  remat_tensor *w = remat_param(g, "w", 1, d, REMAT_INIT_ONES, 0.0f);
  assert_int_equal(remat_compile(g, remat_sum(g, w), NULL), REMAT_OK);
  char path[256], json[1024] = "{\"";
  int n = snprintf(path, sizeof path, "%s/", dir);
  memset(path + n, '\x01', 100);
  path[n + 100] = '\0';
  for (int i = 0; i < 100; i++)
    strcat(json, "\\u0001");
  strcat(json, "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}");
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  unsigned char len[8] = {(unsigned char)strlen(json),
                          (unsigned char)(strlen(json) >> 8)};
  float data[2] = {3.0f, 4.0f};
  fwrite(len, 1, 8, f);
  fwrite(json, 1, strlen(json), f);
  fwrite(data, sizeof data, 1, f);
  fclose(f);
  assert_int_equal(remat_load_safetensors(g, path), REMAT_ERR_SHAPE);
  const char *msg = remat_last_error(), *tail = "...' is not a parameter of "
                                                "the model";
  assert_true(strlen(msg) > strlen(tail));
  assert_string_equal(msg + strlen(msg) - strlen(tail), tail);
  assert_true(strlen(msg) <= strlen("remat_load_safetensors: '") + 103 +
                                    strlen("': tensor '") + 103 +
                                    strlen(tail) - 3);
  unlink(path);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* The library takes policies of up to REMAT_MAX_POLICY_LENGTH bytes from
 * remat_config (it copied at most 511), and a topology file that hwloc
 * cannot load is named with its variable. */
static void test_config_strings(void **state) {
  (void)state;
  char *policy = malloc(REMAT_MAX_POLICY_LENGTH + 2);
  assert_non_null(policy);
  strcpy(policy, "save_only_these_names:a");
  size_t n = strlen(policy);
  while (n + 2 <= REMAT_MAX_POLICY_LENGTH) {
    memcpy(policy + n, ",a", 3);
    n += 2;
  }
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY,
                     .num_threads = 1, .policy = policy};
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  remat_runtime_destroy(rt);
  free(policy);
  char xml[160];
  snprintf(xml, sizeof xml, "%s/empty.xml", dir);
  FILE *f = fopen(xml, "w");
  assert_non_null(f);
  fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology "
        "SYSTEM \"hwloc2.dtd\">\n<topology version=\"2.0\">\n</topology>\n",
        f);
  fclose(f);
  setenv("REMAT_TOPOLOGY", xml, 1);
  rc = (remat_config){.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  remat_status s = remat_runtime_create(&rc, &rt);
  unsetenv("REMAT_TOPOLOGY");
  assert_int_equal(s, REMAT_ERR_CONFIG);
  char want[256];
  snprintf(want, sizeof want, "REMAT_TOPOLOGY='%s' is not valid: hwloc "
           "cannot load the topology it describes", xml);
  assert_memory_equal(remat_last_error(), want, strlen(want));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_huge_inputs),
      cmocka_unit_test(test_huge_outputs),
      cmocka_unit_test(test_duplicate_param_names),
      cmocka_unit_test(test_graph_busy),
      cmocka_unit_test(test_two_threads_one_graph),
      cmocka_unit_test(test_destroy_during_step),
      cmocka_unit_test(test_step_after_fork),
      cmocka_unit_test(test_trace_failure_after_step),
      cmocka_unit_test(test_expf_nonfinite),
      cmocka_unit_test(test_budget_monotonic),
      cmocka_unit_test(test_build_after_compile),
      cmocka_unit_test(test_names_utf8),
      cmocka_unit_test(test_header_junk),
      cmocka_unit_test(test_quoted_path_keeps_cause),
      cmocka_unit_test(test_config_strings),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
