/* Tests of the queue of runs on a pool (sched_run's priority_class): while
 * a run of class 1 is in progress, runs of class 1 that arrive wait and
 * then go in the order they came, while runs of classes 0 and 2 go on at
 * once beside it; a class out of range is refused; the worker that
 * finishes a run is out of it before the run's caller can see the run
 * finished. Runs under ThreadSanitizer too. */
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

#include "sched/sched_internal.h"

static sched_pool *pool;
static sched_pool *one_worker; /* a pool of one worker */

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

/* Waiters of the blocker's class arrive one by one (each waits before the
 * next comes); they run in the order of arrival once it ends. */
static void test_one_class_in_arrival_order(void **state) {
  (void)state;
  static const int classes[NWAITERS] = {1, 1, 1, 1, 1, 1};
  static const int want[NWAITERS] = {0, 1, 2, 3, 4, 5};
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

/* While the blocker (class 1) holds one worker, runs of class 0 and of
 * class 2 run to their end on the other (waited for up to 20 s). */
static void test_other_classes_beside(void **state) {
  (void)state;
  atomic_store(&blocker_started, 0);
  atomic_store(&blocker_release, 0);
  atomic_store(&order_next, 0);
  sched_dag *blocker = one_task_dag(block);
  pthread_t blocker_thread;
  assert_int_equal(
      pthread_create(&blocker_thread, NULL, run_blocker, blocker), 0);
  while (atomic_load(&blocker_started) == 0)
    sched_yield();
  waiter w[2];
  for (int i = 0; i < 2; i++) {
    w[i] = (waiter){.id = i, .cls = 2 * i, .dag = one_task_dag(note_run)};
    assert_int_equal(pthread_create(&w[i].thread, NULL, run_waiter, &w[i]),
                     0);
  }
  for (int i = 0; i < 20000 && atomic_load(&order_next) < 2; i++)
    usleep(1000);
  int ran_beside = atomic_load(&order_next);
  atomic_store(&blocker_release, 1);
  pthread_join(blocker_thread, NULL);
  for (int i = 0; i < 2; i++) {
    pthread_join(w[i].thread, NULL);
    assert_int_equal(w[i].status, REMAT_OK);
    sched_dag_destroy(w[i].dag);
  }
  assert_int_equal(ran_beside, 2);
  sched_dag_destroy(blocker);
}

/* ---- a more urgent run takes the worker at the next task boundary ---- */

enum { CHAIN = 4 };

static int chain_ids[CHAIN];
static _Atomic int chain_started; /* the first task of the chain began */

/* A task of the class-2 chain: the first one waits until the urgent run
 * is live (up to 20 s), then each notes its id. */
static int chain_task(void *context, void *arg, int worker) {
  (void)context;
  (void)worker;
  int id = *(const int *)arg;
  if (id == 100)
    atomic_store(&chain_started, 1);
  for (int i = 0; id == 100 && i < 20000; i++) {
    if (atomic_load(&one_worker->live_mask) & 1u)
      break;
    usleep(1000);
  }
  order[atomic_fetch_add(&order_next, 1)] = id;
  return 0;
}

static void *run_chain_dag(void *arg) {
  char err[SCHED_ERRMSG_MAX];
  sched_run_opts opts = {.priority_class = 2};
  if (sched_run(one_worker, arg, &opts, err) != REMAT_OK)
    atomic_store(&blocker_started, -1);
  return NULL;
}

/* On a pool of one worker, a class-2 run of a chain of tasks (each the
 * continuation of the one before) is in its first task when a class-0
 * run arrives: that run's task goes next, then the rest of the chain. */
static void test_urgent_run_at_task_boundary(void **state) {
  (void)state;
  atomic_store(&blocker_started, 0);
  atomic_store(&order_next, 0);
  atomic_store(&chain_started, 0);
  char err[SCHED_ERRMSG_MAX];
  sched_dag *chain;
  assert_int_equal(sched_dag_create(&chain, err), REMAT_OK);
  for (int i = 0; i < CHAIN; i++) {
    chain_ids[i] = 100 + i;
    assert_int_equal(sched_dag_add(chain, chain_task, &chain_ids[i],
                                   CHAIN - i, -1, "c", NULL),
                     i);
    if (i > 0)
      assert_int_equal(sched_dag_edge(chain, i - 1, i), REMAT_OK);
  }
  assert_int_equal(sched_dag_finalize(chain, err), REMAT_OK);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_chain_dag, chain), 0);
  while (!atomic_load(&chain_started))
    sched_yield();
  waiter urgent = {.id = 7, .cls = 0, .dag = one_task_dag(note_run)};
  sched_run_opts opts = {.context = &urgent, .priority_class = 0};
  assert_int_equal(sched_run(one_worker, urgent.dag, &opts, err), REMAT_OK);
  pthread_join(t, NULL);
  assert_int_equal(atomic_load(&blocker_started), 0);
  assert_int_equal(atomic_load(&order_next), CHAIN + 1);
  const int want[CHAIN + 1] = {100, 7, 101, 102, 103};
  assert_memory_equal(order, want, sizeof want);
  sched_dag_destroy(urgent.dag);
  sched_dag_destroy(chain);
}

/* ---- the caller never waits for the worker that finished its run ---- */

static _Atomic int last_task_in, done_held;

/* The run's only task: returns once the test holds the pool's done_mutex,
 * so the worker stops in flush_finished, on that mutex, right after it
 * counted the task. */
static int last_task(void *context, void *arg, int worker) {
  (void)context;
  (void)arg;
  (void)worker;
  atomic_store(&last_task_in, 1);
  while (!atomic_load(&done_held))
    sched_yield();
  return 0;
}

static void *run_last(void *arg) {
  char err[SCHED_ERRMSG_MAX];
  sched_run_opts opts = {.priority_class = 0};
  if (sched_run(one_worker, arg, &opts, err) != REMAT_OK)
    atomic_store(&last_task_in, -1);
  return NULL;
}

/* On a pool of one worker, when the run's count of finished tasks is
 * complete (what its caller waits for), the worker that completed it is
 * already out of the run (what the caller waits for next): had the worker
 * left after counting, a caller woken by it could take its CPU and yield
 * until the OS runs it again (on a busy machine, milliseconds: issue 28's
 * INTERACTIVE forwards beside training). */
static void test_finishing_worker_out_first(void **state) {
  (void)state;
  atomic_store(&last_task_in, 0);
  atomic_store(&done_held, 0);
  sched_dag *dag = one_task_dag(last_task);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_last, dag), 0);
  while (atomic_load(&last_task_in) == 0)
    sched_yield();
  pthread_mutex_lock(&one_worker->done_mutex);
  atomic_store(&done_held, 1);
  sched_run_state *run = &one_worker->runs[0];
  for (int i = 0; i < 20000 && atomic_load(&run->finished) != 1; i++)
    usleep(1000);
  int64_t finished = atomic_load(&run->finished);
  int inside = atomic_load(&run->workers[0].inside);
  pthread_mutex_unlock(&one_worker->done_mutex);
  pthread_join(t, NULL);
  assert_int_equal(atomic_load(&last_task_in), 1);
  assert_int_equal(finished, 1);
  assert_int_equal(inside, 0);
  sched_dag_destroy(dag);
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
  if (s == REMAT_OK)
    s = sched_pool_create(topo, 1, SCHED_BIND_NONE, &one_worker, err);
  hwloc_topology_destroy(topo);
  return s == REMAT_OK ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  sched_pool_destroy(pool);
  sched_pool_destroy(one_worker);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_class_in_arrival_order),
      cmocka_unit_test(test_other_classes_beside),
      cmocka_unit_test(test_urgent_run_at_task_boundary),
      cmocka_unit_test(test_finishing_worker_out_first),
      cmocka_unit_test(test_class_out_of_range),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
