/* Tests of remat_graph_priority: while one graph's training step is in
 * progress (a task of it held), forwards of INTERACTIVE and BATCH graphs
 * run beside it on the other worker and finish first, with the results
 * they have alone, and the step's results are those it has alone; graphs
 * of the step's own class wait and keep the order they came in; bad
 * arguments are refused. Runs under ThreadSanitizer too. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/exec/tasks.h"
#include "runtime/internal.h"
#include "sched/sched_internal.h"

enum { ROWS = 4, IN = 8, CLASSES = 3, NSERVE = 4 };

static remat_runtime *rt;
static remat_tensor *last_w; /* the parameter of the graph built last */

/* x -> linear -> logits kept (inference), or -> cross entropy (train). */
static remat_graph *build(bool train, remat_tensor **logits) {
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  const int64_t xd[] = {ROWS, IN}, td[] = {ROWS}, wd[] = {CLASSES, IN};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, xd);
  remat_tensor *t = remat_input(g, "t", REMAT_I32, 1, td);
  remat_tensor *w = remat_param(g, "w", 2, wd, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *y = remat_linear(g, x, w, NULL);
  last_w = w;
  remat_tensor *loss = remat_cross_entropy(g, y, t);
  remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  if (!train)
    assert_int_equal(remat_keep(g, y), REMAT_OK);
  assert_int_equal(remat_compile(g, train ? loss : NULL, train ? &opt : NULL),
                   REMAT_OK);
  float xs[ROWS * IN];
  for (int i = 0; i < ROWS * IN; i++)
    xs[i] = (float)(i % 5) - 2.0f;
  assert_int_equal(remat_feed(g, x, xs, sizeof xs), REMAT_OK);
  if (logits != NULL)
    *logits = y;
  return g;
}

/* ---- holding the workers, and the order the graphs' runs started ---- */

static const remat_graph *_Atomic holder; /* its tasks wait for release */
static _Atomic int holding, release;
static const remat_graph *_Atomic started[NSERVE];
static _Atomic int nstarted;

/* The holder's first task waits for release (its other ready tasks may
 * run, its successors cannot: the step stays in progress). */
static void on_task(const remat_graph *g, int kind) {
  (void)kind;
  if (g == atomic_load(&holder)) {
    int none = 0;
    if (atomic_compare_exchange_strong(&holding, &none, 1))
      while (!atomic_load(&release))
        sched_yield();
    return;
  }
  for (int i = 0; i < atomic_load(&nstarted); i++)
    if (atomic_load(&started[i]) == g)
      return;
  /* Only one run is in progress: no other task adds concurrently. */
  int i = atomic_load(&nstarted);
  if (i < NSERVE && atomic_load(&holder) != NULL) {
    atomic_store(&started[i], g);
    atomic_store(&nstarted, i + 1);
  }
}

static _Atomic int step_done;

static remat_step_stats step_stats;

static void *run_step(void *arg) {
  step_stats.size = sizeof step_stats;
  if (remat_step(arg, &step_stats) != REMAT_OK)
    atomic_store(&holding, -1);
  atomic_store(&step_done, 1);
  return NULL;
}

static _Atomic int forward_failures;

static void *run_forward(void *arg) {
  if (remat_forward(arg, NULL) != REMAT_OK)
    atomic_fetch_add(&forward_failures, 1);
  return NULL;
}

static int waiting_runs(void) {
  sched_pool *pool = rt->pool;
  pthread_mutex_lock(&pool->run_mutex);
  int n = 0;
  for (int c = 0; c < SCHED_NUM_CLASSES; c++)
    n += pool->run_waiting[c];
  pthread_mutex_unlock(&pool->run_mutex);
  return n;
}

/* Forwards of graphs of `prio[i]` arrive in the order 0, 1, ... while a
 * training step holds the workers; returns the order they ran in. */
static void run_order(const remat_priority prio[NSERVE], int got[NSERVE]) {
  remat_graph *train = build(true, NULL), *serve[NSERVE];
  for (int i = 0; i < NSERVE; i++) {
    serve[i] = build(false, NULL);
    assert_int_equal(remat_graph_priority(serve[i], prio[i]), REMAT_OK);
  }
  atomic_store(&holding, 0);
  atomic_store(&release, 0);
  atomic_store(&nstarted, 0);
  atomic_store(&holder, train);
  pthread_t trainer, server[NSERVE];
  assert_int_equal(pthread_create(&trainer, NULL, run_step, train), 0);
  while (atomic_load(&holding) == 0)
    sched_yield();
  for (int i = 0; i < NSERVE; i++) {
    assert_int_equal(
        pthread_create(&server[i], NULL, run_forward, serve[i]), 0);
    while (waiting_runs() != i + 1)
      sched_yield();
  }
  atomic_store(&release, 1);
  pthread_join(trainer, NULL);
  assert_int_equal(atomic_load(&holding), 1);
  for (int i = 0; i < NSERVE; i++)
    pthread_join(server[i], NULL);
  atomic_store(&holder, NULL);
  assert_int_equal(atomic_load(&forward_failures), 0);
  assert_int_equal(atomic_load(&nstarted), NSERVE);
  for (int i = 0; i < NSERVE; i++) {
    got[i] = -1;
    for (int k = 0; k < NSERVE; k++)
      if (atomic_load(&started[i]) == serve[k])
        got[i] = k;
  }
  for (int i = 0; i < NSERVE; i++)
    remat_graph_destroy(serve[i]);
  remat_graph_destroy(train);
}

static _Atomic int forward_done;

static void *run_forward_noted(void *arg) {
  run_forward(arg);
  atomic_store(&forward_done, 1);
  return NULL;
}

/* One step of `train` and the parameter it leaves, alone. */
static void step_alone(float w_out[CLASSES * IN], float *loss) {
  remat_graph *g = build(true, NULL);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(g, &st), REMAT_OK);
  assert_int_equal(remat_read(g, last_w, w_out, CLASSES * IN * sizeof(float)),
                   REMAT_OK);
  *loss = st.loss;
  remat_graph_destroy(g);
}

/* While a task of a NORMAL training step is held, a forward of class
 * `prio` runs to its end on the other worker (waiting up to 20 s); then
 * the step is let go. Both results are bitwise those of running alone. */
static void forward_beside_step(remat_priority prio) {
  float w_alone[CLASSES * IN], loss_alone, y_alone[ROWS * CLASSES];
  step_alone(w_alone, &loss_alone);
  remat_tensor *y;
  remat_graph *serve = build(false, &y);
  assert_int_equal(remat_forward(serve, NULL), REMAT_OK);
  assert_int_equal(remat_read(serve, y, y_alone, sizeof y_alone), REMAT_OK);
  remat_graph_destroy(serve);

  remat_graph *train = build(true, NULL);
  remat_tensor *w = last_w;
  serve = build(false, &y);
  assert_int_equal(remat_graph_priority(serve, prio), REMAT_OK);
  atomic_store(&holding, 0);
  atomic_store(&release, 0);
  atomic_store(&step_done, 0);
  atomic_store(&forward_done, 0);
  atomic_store(&holder, train);
  pthread_t trainer, server;
  assert_int_equal(pthread_create(&trainer, NULL, run_step, train), 0);
  while (atomic_load(&holding) == 0)
    sched_yield();
  assert_int_equal(pthread_create(&server, NULL, run_forward_noted, serve),
                   0);
  for (int i = 0; i < 20000 && !atomic_load(&forward_done); i++)
    usleep(1000);
  int beside = atomic_load(&forward_done) && !atomic_load(&step_done);
  atomic_store(&release, 1);
  pthread_join(trainer, NULL);
  pthread_join(server, NULL);
  atomic_store(&holder, NULL);
  assert_int_equal(atomic_load(&holding), 1);
  assert_int_equal(atomic_load(&forward_failures), 0);
  assert_true(beside);
  float w_got[CLASSES * IN], loss_got, y_got[ROWS * CLASSES];
  assert_int_equal(remat_read(serve, y, y_got, sizeof y_got), REMAT_OK);
  assert_memory_equal(y_got, y_alone, sizeof y_got);
  assert_int_equal(remat_read(train, w, w_got, sizeof w_got), REMAT_OK);
  loss_got = step_stats.loss;
  assert_memory_equal(w_got, w_alone, sizeof w_got);
  assert_memory_equal(&loss_got, &loss_alone, sizeof loss_got);
  remat_graph_destroy(serve);
  remat_graph_destroy(train);
}

static void test_interactive_beside_step(void **state) {
  (void)state;
  forward_beside_step(REMAT_PRIORITY_INTERACTIVE);
}

static void test_batch_beside_step(void **state) {
  (void)state;
  forward_beside_step(REMAT_PRIORITY_BATCH);
}

static void test_one_class_in_arrival_order(void **state) {
  (void)state;
  const remat_priority prio[NSERVE] = {
      REMAT_PRIORITY_NORMAL, REMAT_PRIORITY_NORMAL, REMAT_PRIORITY_NORMAL,
      REMAT_PRIORITY_NORMAL};
  int got[NSERVE];
  run_order(prio, got);
  const int want[NSERVE] = {0, 1, 2, 3};
  assert_memory_equal(got, want, sizeof want);
}

/* The class changes nothing in what a forward computes. */
static void test_same_results(void **state) {
  (void)state;
  remat_tensor *ya, *yb;
  remat_graph *a = build(false, &ya), *b = build(false, &yb);
  assert_int_equal(remat_graph_priority(b, REMAT_PRIORITY_INTERACTIVE),
                   REMAT_OK);
  float out_a[ROWS * CLASSES], out_b[ROWS * CLASSES];
  assert_int_equal(remat_forward(a, NULL), REMAT_OK);
  assert_int_equal(remat_forward(b, NULL), REMAT_OK);
  assert_int_equal(remat_read(a, ya, out_a, sizeof out_a), REMAT_OK);
  assert_int_equal(remat_read(b, yb, out_b, sizeof out_b), REMAT_OK);
  assert_memory_equal(out_a, out_b, sizeof out_a);
  remat_graph_destroy(a);
  remat_graph_destroy(b);
}

static void test_refuses(void **state) {
  (void)state;
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_graph_priority(g, (remat_priority)3),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_graph_priority: priority 3 is not "
                      "REMAT_PRIORITY_NORMAL (0), REMAT_PRIORITY_INTERACTIVE "
                      "(1) or REMAT_PRIORITY_BATCH (2)");
  assert_int_equal(remat_graph_priority(NULL, REMAT_PRIORITY_BATCH),
                   REMAT_ERR_INVALID_ARG);
  remat_graph_destroy(g);
}

static int group_setup(void **state) {
  (void)state;
  remat_config cfg = {.num_threads = 2, .set = REMAT_SET_NUM_THREADS};
  if (remat_runtime_create(&cfg, &rt) != REMAT_OK)
    return -1;
  remat__task_hook = on_task;
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
      cmocka_unit_test(test_interactive_beside_step),
      cmocka_unit_test(test_batch_beside_step),
      cmocka_unit_test(test_one_class_in_arrival_order),
      cmocka_unit_test(test_same_results),
      cmocka_unit_test(test_refuses),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
