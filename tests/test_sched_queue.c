/* Tests of the queue of runs on a pool (sched_run's priority_class): while
 * a run holds the workers, runs that arrive wait, and when it ends they go
 * most urgent class first and, within a class, in the order they came;
 * a class out of range is refused. Runs under ThreadSanitizer too. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "sched/sched_internal.h"

static sched_pool *pool;

/* ---- the run that holds the pool ---- */

static _Atomic int blocker_started, blocker_release;

static int block(void *context, void *arg, int worker) {
  (void)context;
  (void)arg;
  (void)worker;
  atomic_store(&blocker_started, 1);
  while (!atomic_load(&blocker_release))
    sched_yield();
  return 0;
}

static void *run_blocker(void *arg) {
  sched_dag *dag = arg;
  char err[SCHED_ERRMSG_MAX];
  sched_run_opts opts = {.priority_class = 1};
  if (sched_run(pool, dag, &opts, err) != REMAT_OK)
    atomic_store(&blocker_started, -1);
  return NULL;
}

/* ---- the runs that wait ---- */

enum { NWAITERS = 6 };

static _Atomic int order_next;
static int order[NWAITERS]; /* waiter ids in the order their runs ran */

typedef struct waiter {
  int id, cls;
  sched_dag *dag;
  pthread_t thread;
  remat_status status;
} waiter;

static int note_run(void *context, void *arg, int worker) {
  (void)worker;
  (void)arg;
  const waiter *w = context;
  order[atomic_fetch_add(&order_next, 1)] = w->id;
  return 0;
}

static void *run_waiter(void *arg) {
  waiter *w = arg;
  char err[SCHED_ERRMSG_MAX];
  sched_run_opts opts = {.context = w, .priority_class = w->cls};
  w->status = sched_run(pool, w->dag, &opts, err);
  return NULL;
}

static sched_dag *one_task_dag(sched_task_fn fn) {
  char err[SCHED_ERRMSG_MAX];
  sched_dag *dag;
  assert_int_equal(sched_dag_create(&dag, err), REMAT_OK);
  assert_true(sched_dag_add(dag, fn, NULL, 0, -1, "t", NULL) >= 0);
  assert_int_equal(sched_dag_finalize(dag, err), REMAT_OK);
  return dag;
}

static int waiting_runs(void) {
  pthread_mutex_lock(&pool->run_mutex);
  int n = 0;
  for (int c = 0; c < SCHED_NUM_CLASSES; c++)
    n += pool->run_waiting[c];
  pthread_mutex_unlock(&pool->run_mutex);
  return n;
}

/* Waiters arrive one by one (each waits before the next comes) in the
 * order batch, normal, interactive, normal, interactive, batch; they run
 * interactive ones first, then normal, then batch, each class in the
 * order of arrival. */
static void test_classes_then_arrival(void **state) {
  (void)state;
  static const int classes[NWAITERS] = {2, 1, 0, 1, 0, 2};
  static const int want[NWAITERS] = {2, 4, 1, 3, 0, 5};
  atomic_store(&blocker_started, 0);
  atomic_store(&blocker_release, 0);
  atomic_store(&order_next, 0);
  sched_dag *blocker = one_task_dag(block);
  pthread_t blocker_thread;
  assert_int_equal(
      pthread_create(&blocker_thread, NULL, run_blocker, blocker), 0);
  while (atomic_load(&blocker_started) == 0)
    sched_yield();
  assert_int_equal(atomic_load(&blocker_started), 1);
  waiter w[NWAITERS];
  for (int i = 0; i < NWAITERS; i++) {
    w[i] = (waiter){.id = i, .cls = classes[i], .dag = one_task_dag(note_run)};
    assert_int_equal(pthread_create(&w[i].thread, NULL, run_waiter, &w[i]),
                     0);
    while (waiting_runs() != i + 1)
      sched_yield();
  }
  assert_int_equal(atomic_load(&order_next), 0); /* none ran yet */
  atomic_store(&blocker_release, 1);
  pthread_join(blocker_thread, NULL);
  for (int i = 0; i < NWAITERS; i++) {
    pthread_join(w[i].thread, NULL);
    assert_int_equal(w[i].status, REMAT_OK);
    sched_dag_destroy(w[i].dag);
  }
  assert_int_equal(atomic_load(&order_next), NWAITERS);
  assert_memory_equal(order, want, sizeof want);
  assert_int_equal(waiting_runs(), 0);
  sched_dag_destroy(blocker);
}

static void test_class_out_of_range(void **state) {
  (void)state;
  sched_dag *dag = one_task_dag(note_run);
  char err[SCHED_ERRMSG_MAX];
  sched_run_opts opts = {.priority_class = SCHED_NUM_CLASSES};
  assert_int_equal(sched_run(pool, dag, &opts, err), REMAT_ERR_INVALID_ARG);
  assert_string_equal(err, "sched_run: priority class 3 is not 0 to 2");
  opts.priority_class = -1;
  assert_int_equal(sched_run(pool, dag, &opts, err), REMAT_ERR_INVALID_ARG);
  sched_dag_destroy(dag);
}

static int group_setup(void **state) {
  (void)state;
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0 ||
      hwloc_topology_set_synthetic(topo, "core:2 pu:1") != 0 ||
      hwloc_topology_load(topo) != 0)
    return -1;
  char err[SCHED_ERRMSG_MAX];
  remat_status s = sched_pool_create(topo, 2, SCHED_BIND_NONE, &pool, err);
  hwloc_topology_destroy(topo);
  return s == REMAT_OK ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  sched_pool_destroy(pool);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_classes_then_arrival),
      cmocka_unit_test(test_class_out_of_range),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
