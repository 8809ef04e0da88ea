/* Tests of remat_set_progress: the callback comes on a thread that is
 * neither a worker nor the caller's, at most every min_interval_ms, with
 * fractions in [0, 1] that grow during a run, and never after the run's
 * call returned; training with it is bitwise training without it; a
 * callback that blocks holds up its own graph's run but not another
 * graph's on the same runtime; it may cancel its graph; bad arguments are
 * refused. This group runs under ThreadSanitizer too. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "runtime/exec/tasks.h"
#include "runtime/internal.h"

enum { ROWS = 32, IN = 64, HIDDEN = 128, CLASSES = 10, CAP = 16384 };

typedef struct mlp {
  remat_graph *g;
  remat_tensor *x, *t;
} mlp;

static remat_runtime *rt;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* x -> linear -> relu -> linear -> relu -> linear -> cross entropy, SGD. */
static mlp build(void) {
  mlp m;
  assert_int_equal(remat_graph_create(rt, &m.g), REMAT_OK);
  assert_int_equal(remat_graph_seed(m.g, 9), REMAT_OK);
  const int64_t xd[] = {ROWS, IN}, td[] = {ROWS}, w1d[] = {HIDDEN, IN},
                w2d[] = {HIDDEN, HIDDEN}, w3d[] = {CLASSES, HIDDEN};
  m.x = remat_input(m.g, "x", REMAT_F32, 2, xd);
  m.t = remat_input(m.g, "t", REMAT_I32, 1, td);
  remat_tensor *w1 = remat_param(m.g, "w1", 2, w1d, REMAT_INIT_NORMAL, 0.1f);
  remat_tensor *w2 = remat_param(m.g, "w2", 2, w2d, REMAT_INIT_NORMAL, 0.1f);
  remat_tensor *w3 = remat_param(m.g, "w3", 2, w3d, REMAT_INIT_NORMAL, 0.1f);
  remat_tensor *h = remat_relu(m.g, remat_linear(m.g, m.x, w1, NULL));
  h = remat_relu(m.g, remat_linear(m.g, h, w2, NULL));
  remat_tensor *loss =
      remat_cross_entropy(m.g, remat_linear(m.g, h, w3, NULL), m.t);
  remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  assert_int_equal(remat_compile(m.g, loss, &opt), REMAT_OK);
  float x[ROWS * IN];
  int32_t t[ROWS];
  for (int i = 0; i < ROWS * IN; i++)
    x[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
  for (int i = 0; i < ROWS; i++)
    t[i] = i % CLASSES;
  assert_int_equal(remat_feed(m.g, m.x, x, sizeof x), REMAT_OK);
  assert_int_equal(remat_feed(m.g, m.t, t, sizeof t), REMAT_OK);
  return m;
}

static void assert_same_params(remat_graph *a, remat_graph *b) {
  static float pa[CAP], pb[CAP];
  for (int i = 0; i < remat_num_params(a); i++) {
    int64_t n = remat_tensor_numel(remat_param_at(a, i));
    assert_true(n <= CAP);
    assert_int_equal(remat_read(a, remat_param_at(a, i), pa, (size_t)n * 4),
                     REMAT_OK);
    assert_int_equal(remat_read(b, remat_param_at(b, i), pb, (size_t)n * 4),
                     REMAT_OK);
    assert_memory_equal(pa, pb, (size_t)n * 4);
  }
}

/* Workers mark themselves: the task hook runs on every task. It also
 * makes each task last 0.2 ms more, so that every step lasts several
 * min_interval_ms however fast the machine. */
static _Thread_local bool ran_task;

static void mark_worker(const remat_graph *g, int kind) {
  (void)g;
  (void)kind;
  ran_task = true;
  struct timespec pause = {0, 200000};
  nanosleep(&pause, NULL);
}

/* ---- what the calls look like ---- */

enum { MAX_CALLS = 64, INTERVAL_MS = 2 };

typedef struct call_log {
  pthread_t caller;          /* the thread that runs the steps */
  _Atomic int step;          /* the step in progress (set by the caller) */
  _Atomic int64_t step_start_ns;
  _Atomic int ncalls;
  _Atomic int inside;        /* a call is in progress */
  _Atomic int bad_thread;    /* a call came on a worker or the caller */
  int step_of[MAX_CALLS];
  int64_t at_ns[MAX_CALLS];
  double fraction[MAX_CALLS];
} call_log;

static void log_call(void *user, double fraction) {
  call_log *log = user;
  atomic_store(&log->inside, 1);
  if (ran_task || pthread_equal(pthread_self(), log->caller))
    atomic_store(&log->bad_thread, 1);
  int i = atomic_load(&log->ncalls);
  if (i < MAX_CALLS) {
    log->step_of[i] = atomic_load(&log->step);
    log->at_ns[i] = now_ns();
    log->fraction[i] = fraction;
    atomic_store(&log->ncalls, i + 1);
  }
  atomic_store(&log->inside, 0);
}

static void check_calls(const call_log *log, int n) {
  for (int i = 0; i < n; i++) {
    assert_true(log->fraction[i] >= 0.0 && log->fraction[i] <= 1.0);
    if (i > 0 && log->step_of[i] == log->step_of[i - 1]) {
      assert_true(log->fraction[i] >= log->fraction[i - 1]);
      assert_true(log->at_ns[i] - log->at_ns[i - 1] >=
                  INTERVAL_MS * 1000000 - 50000);
    }
  }
}

static void test_progress_calls(void **state) {
  (void)state;
  mlp m = build(), ref = build();
  static call_log log;
  memset(&log, 0, sizeof log);
  log.caller = pthread_self();
  assert_int_equal(remat_set_progress(m.g, log_call, &log, INTERVAL_MS),
                   REMAT_OK);
  int steps = 0;
  bool some_done = false; /* a call saw tasks finished */
  while (atomic_load(&log.ncalls) < 8 && steps < 2000) {
    atomic_store(&log.step, steps);
    int before = atomic_load(&log.ncalls);
    int64_t start = now_ns();
    assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
    assert_int_equal(atomic_load(&log.inside), 0);
    int after = atomic_load(&log.ncalls);
    for (int i = before; i < after && i < MAX_CALLS; i++) {
      assert_int_equal(log.step_of[i], steps);
      assert_true(log.at_ns[i] - start >= INTERVAL_MS * 1000000);
      some_done = some_done || log.fraction[i] > 0.0;
    }
    steps++;
  }
  int n = atomic_load(&log.ncalls);
  assert_true(n >= 8);
  assert_true(some_done);
  assert_int_equal(atomic_load(&log.bad_thread), 0);
  check_calls(&log, n < MAX_CALLS ? n : MAX_CALLS);
  /* Idle: no call comes between runs. */
  struct timespec pause = {0, 20 * 1000000};
  nanosleep(&pause, NULL);
  assert_int_equal(atomic_load(&log.ncalls), n);
  /* Removed: the next runs call nothing. */
  assert_int_equal(remat_set_progress(m.g, NULL, NULL, 0), REMAT_OK);
  for (int i = 0; i < 5; i++)
    assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  assert_int_equal(atomic_load(&log.ncalls), n);
  for (int i = 0; i < steps + 5; i++)
    assert_int_equal(remat_step(ref.g, NULL), REMAT_OK);
  assert_same_params(m.g, ref.g);
  remat_graph_destroy(m.g);
  remat_graph_destroy(ref.g);
}

/* ---- a callback that blocks ---- */

typedef struct blocker {
  remat_graph *g;
  _Atomic int entered;  /* the callback is blocking */
  _Atomic int release;  /* set by the test: the callback returns */
  _Atomic int returned; /* the step that got the blocking call returned */
  remat_status status;
} blocker;

static void block_once(void *user, double fraction) {
  (void)fraction;
  blocker *b = user;
  if (atomic_exchange(&b->entered, 1) != 0)
    return;
  while (!atomic_load(&b->release))
    sched_yield();
}

static void *step_until_blocked(void *arg) {
  blocker *b = arg;
  remat_status s = REMAT_OK;
  for (int i = 0; i < 100000 && s == REMAT_OK && !atomic_load(&b->entered);
       i++)
    s = remat_step(b->g, NULL);
  b->status = s;
  atomic_store(&b->returned, 1);
  return NULL;
}

/* While graph a's callback blocks (and so a's step has not returned),
 * graph b on the same runtime runs steps to the end. */
static void test_progress_blocking(void **state) {
  (void)state;
  mlp a = build(), b = build();
  blocker blk = {.g = a.g};
  assert_int_equal(remat_set_progress(a.g, block_once, &blk, 1), REMAT_OK);
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, step_until_blocked, &blk),
                   0);
  while (!atomic_load(&blk.entered) && !atomic_load(&blk.returned))
    sched_yield();
  assert_int_equal(atomic_load(&blk.entered), 1);
  for (int i = 0; i < 3; i++)
    assert_int_equal(remat_step(b.g, NULL), REMAT_OK);
  assert_int_equal(atomic_load(&blk.returned), 0);
  atomic_store(&blk.release, 1);
  pthread_join(thread, NULL);
  assert_int_equal(blk.status, REMAT_OK);
  remat_graph_destroy(a.g);
  remat_graph_destroy(b.g);
}

/* ---- a callback that cancels ---- */

static void cancel_graph(void *user, double fraction) {
  (void)fraction;
  remat_cancel(user);
}

static void test_progress_cancels(void **state) {
  (void)state;
  mlp m = build(), ref = build();
  assert_int_equal(remat_set_progress(m.g, cancel_graph, m.g, 1), REMAT_OK);
  int steps = 0;
  remat_status s = REMAT_OK;
  while (s == REMAT_OK && steps < 100000) {
    s = remat_step(m.g, NULL);
    steps += s == REMAT_OK;
  }
  assert_true(s == REMAT_ERR_CANCELLED);
  assert_int_equal(remat_set_progress(m.g, NULL, NULL, 0), REMAT_OK);
  assert_int_equal(remat_uncancel(m.g), REMAT_OK);
  assert_int_equal(remat_step(m.g, NULL), REMAT_OK);
  for (int i = 0; i <= steps; i++)
    assert_int_equal(remat_step(ref.g, NULL), REMAT_OK);
  assert_same_params(m.g, ref.g);
  remat_graph_destroy(m.g);
  remat_graph_destroy(ref.g);
}

static void test_progress_refuses(void **state) {
  (void)state;
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_set_progress(NULL, log_call, NULL, 5),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_set_progress: graph is NULL");
  assert_int_equal(remat_set_progress(g, log_call, NULL, 0),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_set_progress: min_interval_ms is 0: expected 1 "
                      "to 3600000 milliseconds");
  assert_int_equal(remat_set_progress(g, log_call, NULL, 3600001),
                   REMAT_ERR_INVALID_ARG);
  /* Before compile, set and left set: destroy stops its thread. */
  assert_int_equal(remat_set_progress(g, log_call, NULL, 3600000), REMAT_OK);
  remat_graph_destroy(g);
}

static int group_setup(void **state) {
  (void)state;
  remat_config cfg = {.num_threads = 2, .set = REMAT_SET_NUM_THREADS};
  if (remat_runtime_create(&cfg, &rt) != REMAT_OK)
    return -1;
  remat__task_hook = mark_worker;
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  remat__task_hook = NULL;
  remat_runtime_destroy(rt);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_progress_calls),
      cmocka_unit_test(test_progress_blocking),
      cmocka_unit_test(test_progress_cancels),
      cmocka_unit_test(test_progress_refuses),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
