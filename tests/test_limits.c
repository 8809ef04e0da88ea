/* Bounds on memory, waits and costs (issue 29, classes 3 and 4): compile
 * refuses a step bigger than the memory the process can get, a trace costs
 * the same per step however many came before, trace steps and GPT layers
 * have documented limits, and building, compile, the budget planner,
 * saving and loading grow near-linearly: CPU time on 4x the graph within
 * a bound per phase (6x to 10x, set from what this shared 2-core machine
 * measures for linear code; each quadratic search measured went past it). */
#include <limits.h>
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/perf_event.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>
#include <cmocka.h>

#include "gpt_fixture.h"
#include "remat_gpt.h"
#include "runtime/compile/memcheck.h"
#include "tmpdir.h"

/* Under AddressSanitizer an allocation past RLIMIT_AS returns NULL, as
 * malloc does, instead of ending the process: test_compile_refuses_too_big
 * checks compile's own way out of that failure. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
  return "allocator_may_return_null=1";
}

static const remat_gpt_config tiny = {
    .layers = 2, .d_model = 16, .heads = 2, .seq = 5, .batch = 3, .vocab = 7};

static remat_runtime *one_thread_runtime(int64_t budget) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_MEMORY_BUDGET |
                            REMAT_SET_POLICY | REMAT_SET_TRACE,
                     .num_threads = 1,
                     .memory_budget = budget,
                     .policy = "nothing_saveable"};
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  return rt;
}

/* ---- memory ---- */

/* The least known figure decides, and the message names both numbers, the
 * source and the advice; unknown figures (-1) are left out. */
static void test_memcheck_message(void **state) {
  (void)state;
  remat_runtime *rt = one_thread_runtime(0);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  mem_room none = {-1, -1, -1};
  assert_int_equal(memcheck_fit(g, INT64_MAX, &none), REMAT_OK);
  mem_room room = {-1, 3 << 20, 5 << 20};
  assert_int_equal(memcheck_fit(g, 3 << 20, &room), REMAT_OK);
  assert_int_equal(remat_graph_status(g), REMAT_OK);
  assert_int_equal(memcheck_fit(g, 4 << 20, &room), REMAT_ERR_OUT_OF_MEMORY);
  assert_string_equal(
      remat_graph_error(g),
      "remat_compile: the step needs 4194304 bytes (4.00 MiB) at its peak, "
      "but the process can get 3145728 bytes (3.00 MiB, RLIMIT_AS less the "
      "address space in use): set a memory budget (REMAT_MEMORY_BUDGET or "
      "remat_config.memory_budget) of at most 3145728 bytes so that the "
      "planner recomputes activations, or build a smaller model");
  remat_graph_destroy(g);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  mem_room cgroup = {1 << 20, 3 << 20, 5 << 20};
  assert_int_equal(memcheck_fit(g, 2 << 20, &cgroup),
                   REMAT_ERR_OUT_OF_MEMORY);
  assert_non_null(strstr(remat_graph_error(g),
                         "1048576 bytes (1.00 MiB, the cgroup's memory limit "
                         "less its use)"));
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

static int64_t address_space_in_use(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  assert_non_null(f);
  long long pages = 0;
  assert_int_equal(fscanf(f, "%lld", &pages), 1);
  fclose(f);
  return pages * (int64_t)sysconf(_SC_PAGESIZE);
}

/* A model whose step needs ~1 GiB, compiled under an address-space limit
 * of 64 MiB more than in use: compile fails at once with the figures,
 * instead of the step being killed. With a budget the check is off (the
 * plan fits the budget; the allocation then fails as before). */
static void test_compile_refuses_too_big(void **state) {
  (void)state;
  const remat_gpt_config big = {.layers = 2, .d_model = 64, .heads = 2,
                                .seq = 128, .batch = 8, .vocab = 65536};
  for (int budgeted = 0; budgeted < 2; budgeted++) {
    remat_runtime *rt = one_thread_runtime(budgeted ? INT64_C(1) << 40 : 0);
    remat_graph *g;
    assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
    remat_gpt m;
    assert_int_equal(remat_gpt_build(g, &big, &m), REMAT_OK);
    struct rlimit old, small;
    assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
    small = old;
    small.rlim_cur = (rlim_t)(address_space_in_use() + (INT64_C(64) << 20));
    assert_int_equal(setrlimit(RLIMIT_AS, &small), 0);
    remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
    remat_status s = remat_compile(g, m.loss, &opt);
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
    assert_int_equal(s, REMAT_ERR_OUT_OF_MEMORY);
    const char *why = strstr(remat_graph_error(g), "the process can get");
    if (budgeted) {
      assert_null(why);
    } else {
      assert_non_null(why);
      assert_non_null(strstr(remat_graph_error(g),
                             "RLIMIT_AS less the address space in use"));
      assert_true(strncmp(remat_graph_error(g),
                          "remat_compile: the step needs ", 30) == 0);
    }
    remat_graph_destroy(g);
    remat_runtime_destroy(rt);
  }
}

/* ---- traces ---- */

static int trace_steps_in(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char text[1 << 24];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  cJSON *doc = cJSON_Parse(text);
  if (doc == NULL)
    return -1;
  int steps = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "traceEvents")) {
    const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
    steps += cJSON_IsString(cat) && strcmp(cat->valuestring, "step") == 0;
  }
  cJSON_Delete(doc);
  return steps;
}

/* Bytes this process has written (write, pwrite...) so far. */
static int64_t bytes_written(void) {
  FILE *f = fopen("/proc/self/io", "r");
  assert_non_null(f);
  char line[128];
  long long w = -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "wchar: %lld", &w) == 1)
      break;
  fclose(f);
  assert_true(w >= 0);
  return w;
}

/* After every step the file is a JSON document holding every step so far,
 * and a step writes as many bytes as the first: the 16th no more than
 * 1.25x the 2nd (a rewrite of the whole file would write 8x). */
static void test_trace_appends(void **state) {
  (void)state;
  char path[160];
  snprintf(path, sizeof path, "%s/append.json", dir);
  remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  fixture f;
  assert_int_equal(fixture_open(&f, &tiny, 1, "nothing_saveable", 0, &opt),
                   REMAT_OK);
  enum { STEPS = 16 };
  assert_int_equal(remat_trace_steps(f.g, path, STEPS), REMAT_OK);
  int64_t written[STEPS];
  for (int s = 0; s < STEPS; s++) {
    remat_step_stats st = {.size = sizeof st};
    int64_t before = bytes_written();
    assert_int_equal(remat_step(f.g, &st), REMAT_OK);
    written[s] = bytes_written() - before;
    assert_int_equal(st.trace_status, REMAT_OK);
    assert_int_equal(trace_steps_in(path), s + 1);
  }
  assert_true(written[1] > 0);
  assert_true(written[STEPS - 1] * 4 <= written[1] * 5);
  fixture_close(&f);
}

static void test_trace_steps_limit(void **state) {
  (void)state;
  char path[160], want[200];
  snprintf(path, sizeof path, "%s/limit.json", dir);
  fixture f;
  assert_int_equal(fixture_open(&f, &tiny, 1, "nothing_saveable", 0, NULL),
                   REMAT_OK);
  int too_many[2] = {REMAT_MAX_TRACE_STEPS + 1, INT_MAX};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(remat_trace_steps(f.g, path, too_many[i]),
                     REMAT_ERR_LIMIT);
    snprintf(want, sizeof want,
             "remat_trace_steps: steps is %d: at most 10000 steps "
             "(REMAT_MAX_TRACE_STEPS) are traced into one file",
             too_many[i]);
    assert_string_equal(remat_last_error(), want);
  }
  assert_int_equal(access(path, F_OK), -1); /* nothing written */
  assert_int_equal(remat_trace_steps(f.g, path, REMAT_MAX_TRACE_STEPS),
                   REMAT_OK);
  fixture_close(&f);
}

/* ---- sizes and costs ---- */

static void test_gpt_layer_limit(void **state) {
  (void)state;
  remat_runtime *rt = one_thread_runtime(0);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  remat_gpt_config c = tiny;
  c.layers = 1000000;
  remat_gpt m;
  assert_int_equal(remat_gpt_build(g, &c, &m), REMAT_ERR_LIMIT);
  assert_string_equal(remat_graph_error(g),
                      "remat_gpt_build: layers 1000000: at most 10000 "
                      "(REMAT_GPT_MAX_LAYERS) are built");
  assert_int_equal(remat_num_params(g), 0); /* refused before building */
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* The work measured: user-space instructions of this process's threads
 * (perf_event_open; deterministic, so the ratios measure the algorithms,
 * not the load of a shared machine), or its CPU seconds where counters
 * cannot be opened. */
static int counter_fd = -2;

static double work_now(void) {
  if (counter_fd == -2) {
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.type = PERF_TYPE_HARDWARE;
    attr.size = sizeof attr;
    attr.config = PERF_COUNT_HW_INSTRUCTIONS;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    attr.inherit = 1; /* the workers of runtimes created later too */
    counter_fd = (int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0);
  }
  uint64_t count;
  if (counter_fd >= 0 && read(counter_fd, &count, sizeof count) ==
                             (ssize_t)sizeof count)
    return (double)count;
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

enum { PHASE_BUILD, PHASE_COMPILE, PHASE_SAVE, PHASE_LOAD, NUM_PHASES };

/* The work (work_now) of each phase on a GPT of `layers` small
 * layers: build, compile (with `budget`, 0 none), and, when `files`, a
 * save and three loads of its parameters. */
static void time_phases(int layers, int64_t budget, bool compile, bool files,
                        double *sec) {
  remat_runtime *rt = one_thread_runtime(budget);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  remat_gpt_config c = {.layers = layers, .d_model = 8, .heads = 1,
                        .seq = 4, .batch = 1, .vocab = 16};
  remat_gpt m;
  double t0 = work_now();
  assert_int_equal(remat_gpt_build(g, &c, &m), REMAT_OK);
  double t1 = work_now();
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-3f};
  if (compile)
    assert_int_equal(remat_compile(g, m.loss, &opt), REMAT_OK);
  double t2 = work_now();
  char path[160];
  snprintf(path, sizeof path, "%s/scale.safetensors", dir);
  if (files)
    assert_int_equal(remat_save_safetensors(g, path), REMAT_OK);
  double t3 = work_now();
  for (int k = 0; files && k < 3; k++) /* 3 loads: long enough to time */
    assert_int_equal(remat_load_safetensors(g, path), REMAT_OK);
  double t4 = work_now();
  sec[PHASE_BUILD] = t1 - t0;
  sec[PHASE_COMPILE] = t2 - t1;
  sec[PHASE_SAVE] = t3 - t2;
  sec[PHASE_LOAD] = t4 - t3;
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* The work of each phase at `layers` and at FACTOR x `layers`
 * (small[NUM_PHASES], big[NUM_PHASES]: the least over RUNS runs) and
 * their ratio (ratio[NUM_PHASES], big / small), the sizes taking turns
 * after two runs of each that are not counted (the first runs pay for
 * growing the heap, and measured 10x to 50x apart for that alone). Where
 * the work is CPU seconds (no instruction counter), a busy sibling thread
 * or memory traffic of other processes only adds to a run, so the least
 * of each size is the estimate nearest the work itself (the median of
 * each run's ratio measured build at 6.06x in a CI run under the parallel
 * tests, against 4.9x alone; the least still measured 6.03x there, from
 * the caches: see test_build_scales). */
enum { RUNS = 7, FACTOR = 4 };

static double least_of(const double *v) {
  double m = v[0];
  for (int r = 1; r < RUNS; r++)
    m = v[r] < m ? v[r] : m;
  return m;
}

static void least_phases(int layers, int64_t budget, int64_t big_budget,
                         bool compile, bool files, double *small,
                         double *big, double *ratio) {
  double runs[2][NUM_PHASES][RUNS], one[2][NUM_PHASES];
  for (int r = 0; r < 2; r++)
    for (int size = 0; size < 2; size++)
      time_phases(size ? FACTOR * layers : layers,
                  size ? big_budget : budget, compile, files, one[size]);
  for (int r = 0; r < RUNS; r++) {
    for (int size = 0; size < 2; size++)
      time_phases(size ? FACTOR * layers : layers,
                  size ? big_budget : budget, compile, files, one[size]);
    for (int p = 0; p < NUM_PHASES; p++) {
      runs[0][p][r] = one[0][p];
      runs[1][p][r] = one[1][p];
    }
  }
  for (int p = 0; p < NUM_PHASES; p++) {
    small[p] = least_of(runs[0][p]);
    big[p] = least_of(runs[1][p]);
    ratio[p] = small[p] > 0.0 ? big[p] / small[p] : 0.0;
  }
}

/* The work on FACTOR x the layers at most `bound` times the work on
 * `layers`. */
static void assert_ratio(const char *what, int layers, double small,
                         double big, double ratio, double bound) {
  print_message("%s: %d layers %.4g, %d layers %.4g (%s): %.2fx\n", what,
                layers, small, FACTOR * layers, big,
                counter_fd >= 0 ? "instructions" : "CPU seconds", ratio);
  assert_true(small > 0.0);
  assert_true(ratio <= bound);
}

static void test_build_scales(void **state) {
  (void)state;
  double small[NUM_PHASES], big[NUM_PHASES], ratio[NUM_PHASES];
  /* Both sizes past the caches: from 250 to 1000 layers the work per
   * layer grew by a fifth alone and by half beside another test (4.6-6.0x
   * measured, CI's parallel tests included), as 1000 layers' graph no
   * longer stays in the caches that hold 250's. And no block from mmap:
   * at 2000 layers the graph's build grows one block past 32 MiB (62
   * MiB), which mmap would give afresh, with its page faults, on every
   * run. */
  mallopt(M_MMAP_MAX, 0);
  least_phases(1000, 0, 0, false, false, small, big, ratio);
  mallopt(M_MMAP_MAX, 65536); /* glibc's default */
  malloc_trim(0); /* the next tests start from a heap of their own size */
  /* 3.5-4.2x measured in CPU seconds on a shared 2-core machine, one test
   * alone, two at once and in CI; a linear search of parameter names makes
   * it 16.5x. The bound leaves room for a CPU whose last-level cache holds
   * 1000 layers' graph but not 4000's: that step measured up to 6x here,
   * from 250 to 1000 layers. */
  assert_ratio("build", 1000, small[PHASE_BUILD], big[PHASE_BUILD],
               ratio[PHASE_BUILD], 8.0);
}

static void test_compile_save_load_scale(void **state) {
  (void)state;
  double small[NUM_PHASES], big[NUM_PHASES], ratio[NUM_PHASES];
  least_phases(150, 0, 0, true, true, small, big, ratio);
  /* Compile 4.1-4.6x, save 3.9-5.1x and load 5.8-6.9x measured (no
   * search left in the loader: the rest is cJSON's and malloc's work on a
   * bigger heap; a linear name search made it 17x). A decision that scans
   * every op per tensor makes compile 6.7x. */
  assert_ratio("compile", 150, small[PHASE_COMPILE], big[PHASE_COMPILE],
               ratio[PHASE_COMPILE], 6.0);
  assert_ratio("save", 150, small[PHASE_SAVE], big[PHASE_SAVE],
               ratio[PHASE_SAVE], 6.5);
  assert_ratio("load", 150, small[PHASE_LOAD], big[PHASE_LOAD],
               ratio[PHASE_LOAD], 9.0);
}

/* The smallest feasible budget of the GPT at `layers`, from the error of a
 * 1-byte budget. */
static int64_t smallest_budget(int layers) {
  remat_runtime *rt = one_thread_runtime(1);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  remat_gpt_config c = {.layers = layers, .d_model = 8, .heads = 1,
                        .seq = 4, .batch = 1, .vocab = 16};
  remat_gpt m;
  assert_int_equal(remat_gpt_build(g, &c, &m), REMAT_OK);
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-3f};
  assert_int_equal(remat_compile(g, m.loss, &opt), REMAT_ERR_BUDGET);
  const char *at = strstr(remat_graph_error(g), "budget for this graph is ");
  assert_non_null(at);
  long long bytes = atoll(at + strlen("budget for this graph is "));
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  assert_true(bytes > 0);
  return bytes;
}

/* The budget planner, between the smallest feasible budget and the peak
 * of saving everything, where it weighs every region's candidates. */
static void test_planner_scales(void **state) {
  (void)state;
  double small[NUM_PHASES], big[NUM_PHASES], ratio[NUM_PHASES];
  least_phases(200, smallest_budget(200) * 11 / 10,
               smallest_budget(800) * 11 / 10, true, false, small, big,
               ratio);
  /* Measured 5.5-7.2x: the frontier is bounded and each measured plan
   * linear, but the number of plans measured (at most 4 + 16 + 4) may
   * grow with the size; with the old decision it is 14.7x, and with the
   * unbounded frontier it was 33x (100 -> 400 layers). */
  assert_ratio("planner", 200, small[PHASE_COMPILE], big[PHASE_COMPILE],
               ratio[PHASE_COMPILE], 10.0);
}

int main(void) {
  /* The heap keeps what a graph frees, and blocks below 32 MiB come from
   * it: each run then works in memory the runs before it touched, and
   * the kernel's page faults stay out of the ratios (a build of 2000
   * layers cost 22-31 microseconds a layer with them, 10.5-13 without). */
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  work_now(); /* opens the counter before any runtime's workers start */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memcheck_message),
      cmocka_unit_test(test_compile_refuses_too_big),
      cmocka_unit_test(test_trace_appends),
      cmocka_unit_test(test_trace_steps_limit),
      cmocka_unit_test(test_gpt_layer_limit),
      cmocka_unit_test(test_build_scales),
      cmocka_unit_test(test_compile_save_load_scale),
      cmocka_unit_test(test_planner_scales),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
