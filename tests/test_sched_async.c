/* The scheduler's asynchronous tasks (sched_dag_set_async, sched_complete):
 * successors wait for the completion that another thread delivers, runs
 * repeat, and an async task's body runs even after a failure. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "sched/sched.h"

typedef struct async_case {
  sched_pool *pool;
  const sched_dag *dag; /* names the run to sched_complete */
  int32_t async_task;
  atomic_int completed; /* set by the completer just before sched_complete */
  atomic_int body_ran, after_ran, after_saw_completed;
  atomic_int seen_failure; /* sched_run_failure in the async body */
  int fail_first;       /* the first task returns this */
  pthread_t completer;
} async_case;

static int first_task(void *context, void *arg, int worker) {
  (void)context;
  (void)worker;
  return ((async_case *)arg)->fail_first;
}

static void *completer_main(void *arg) {
  async_case *c = arg;
  struct timespec ts = {0, 20 * 1000 * 1000}; /* successors must wait */
  nanosleep(&ts, NULL);
  atomic_store(&c->completed, 1);
  sched_complete(c->pool, c->dag, c->async_task);
  return NULL;
}

/* Starts an operation: a thread that completes the task 20 ms later. */
static int async_body(void *context, void *arg, int worker) {
  (void)context;
  (void)worker;
  async_case *c = arg;
  atomic_fetch_add(&c->body_ran, 1);
  atomic_store(&c->seen_failure, sched_run_failure(c->pool, c->dag));
  return pthread_create(&c->completer, NULL, completer_main, c) == 0
             ? 0
             : REMAT_ERR_BACKEND;
}

static int after_task(void *context, void *arg, int worker) {
  (void)context;
  (void)worker;
  async_case *c = arg;
  atomic_fetch_add(&c->after_ran, 1);
  if (atomic_load(&c->completed))
    atomic_fetch_add(&c->after_saw_completed, 1);
  return 0;
}

/* first -> async -> after (and several independent tasks to keep the
 * other worker busy or asleep), run three times on two workers. */
static void run_case(int fail_first) {
  hwloc_topology_t topo;
  assert_int_equal(hwloc_topology_init(&topo), 0);
  assert_int_equal(hwloc_topology_set_synthetic(topo, "core:2 pu:1"), 0);
  assert_int_equal(hwloc_topology_load(topo), 0);
  char err[SCHED_ERRMSG_MAX];
  async_case c = {.fail_first = fail_first};
  assert_int_equal(sched_pool_create(topo, 2, SCHED_BIND_NONE, &c.pool, err),
                   REMAT_OK);
  sched_dag *dag;
  assert_int_equal(sched_dag_create(&dag, err), REMAT_OK);
  c.dag = dag;
  int32_t a = sched_dag_add(dag, first_task, &c, 3, -1, "first", NULL);
  c.async_task = sched_dag_add(dag, async_body, &c, 2, -1, "async", NULL);
  int32_t z = sched_dag_add(dag, after_task, &c, 1, -1, "after", NULL);
  for (int i = 0; i < 8; i++)
    assert_true(sched_dag_add(dag, first_task, &c, 0, -1, "free", NULL) >= 0);
  assert_int_equal(sched_dag_set_async(dag, c.async_task), REMAT_OK);
  assert_int_equal(sched_dag_edge(dag, a, c.async_task), REMAT_OK);
  assert_int_equal(sched_dag_edge(dag, c.async_task, z), REMAT_OK);
  assert_int_equal(sched_dag_finalize(dag, err), REMAT_OK);
  assert_int_equal(sched_dag_set_async(dag, z), REMAT_ERR_STATE);
  for (int run = 1; run <= 3; run++) {
    atomic_store(&c.completed, 0);
    remat_status s = sched_run(c.pool, dag, NULL, err);
    pthread_join(c.completer, NULL);
    assert_int_equal(s, fail_first);
    assert_int_equal(atomic_load(&c.body_ran), run); /* even after a failure */
    assert_int_equal(atomic_load(&c.seen_failure), fail_first);
    /* The successor ran (its body only without a failure), and only after
     * the completion. */
    assert_int_equal(atomic_load(&c.after_ran), fail_first ? 0 : run);
    assert_int_equal(atomic_load(&c.after_saw_completed),
                     fail_first ? 0 : run);
  }
  sched_dag_destroy(dag);
  sched_pool_destroy(c.pool);
  hwloc_topology_destroy(topo);
}

static void test_async_completion(void **state) {
  (void)state;
  run_case(0);
}

static void test_async_body_runs_after_failure(void **state) {
  (void)state;
  run_case(REMAT_ERR_OUT_OF_MEMORY);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_async_completion),
      cmocka_unit_test(test_async_body_runs_after_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
