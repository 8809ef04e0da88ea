/* Tests of the task scheduler (sched/): random DAGs run many times at
 * several thread counts, placement and NUMA affinity on synthetic
 * topologies, priorities, the pick rule of sched_pick.h against a 1-worker
 * run, cycles, limits, task errors and traces. Set
 * REMAT_TEST_QUICK to run fewer iterations (sanitizer builds). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "sched/sched.h"
#include "sched/sched_internal.h"

/* ---- a recording DAG ---- */

/* What every test task records: a global order stamp and a run count. */
typedef struct recorder {
  atomic_long seq;
  atomic_long *stamp;
  atomic_int *count;
  atomic_int *worker;
  int nworkers;
  int fail_task; /* the task that returns fail_status, -1 for none */
  int fail_status;
  atomic_int bad_worker; /* a worker index out of range was seen */
} recorder;

typedef struct task_ctx {
  recorder *rec;
  int id;
} task_ctx;

typedef struct test_dag {
  sched_dag *dag;
  int ntasks;
  int nedges;
  int *from, *to; /* the edges, for checking */
  int *node;      /* numa_node of each task */
  task_ctx *ctx;
  recorder rec;
} test_dag;

static int record_task(void *context, void *arg, int worker) {
  (void)context;
  task_ctx *c = arg;
  recorder *r = c->rec;
  atomic_store(&r->stamp[c->id], atomic_fetch_add(&r->seq, 1));
  atomic_fetch_add(&r->count[c->id], 1);
  atomic_store(&r->worker[c->id], worker);
  if (worker < 0 || worker >= r->nworkers)
    atomic_store(&r->bad_worker, 1);
  return c->id == r->fail_task ? r->fail_status : 0;
}

static unsigned next_rand(unsigned *state) {
  *state = *state * 1664525u + 1013904223u;
  return *state >> 8;
}

static bool quick(void) { return getenv("REMAT_TEST_QUICK") != NULL; }

static void test_dag_init(test_dag *t, int ntasks, int max_edges) {
  memset(t, 0, sizeof *t);
  char err[SCHED_ERRMSG_MAX];
  assert_int_equal(sched_dag_create(&t->dag, err), REMAT_OK);
  t->ntasks = ntasks;
  t->from = calloc((size_t)max_edges + 1, sizeof(int));
  t->to = calloc((size_t)max_edges + 1, sizeof(int));
  t->node = calloc((size_t)ntasks + 1, sizeof(int));
  t->ctx = calloc((size_t)ntasks + 1, sizeof(task_ctx));
  t->rec.stamp = calloc((size_t)ntasks + 1, sizeof(atomic_long));
  t->rec.count = calloc((size_t)ntasks + 1, sizeof(atomic_int));
  t->rec.worker = calloc((size_t)ntasks + 1, sizeof(atomic_int));
  t->rec.fail_task = -1;
  assert_non_null(t->rec.worker);
}

static void test_dag_free(test_dag *t) {
  sched_dag_destroy(t->dag);
  free(t->from);
  free(t->to);
  free(t->node);
  free(t->ctx);
  free(t->rec.stamp);
  free(t->rec.count);
  free(t->rec.worker);
}

static void add_task(test_dag *t, int priority, int node, const char *name) {
  int id = sched_dag_num_tasks(t->dag);
  t->ctx[id] = (task_ctx){&t->rec, id};
  t->node[id] = node;
  assert_int_equal(sched_dag_add(t->dag, record_task, &t->ctx[id], priority,
                                 node, name, "test"),
                   id);
}

static void add_edge(test_dag *t, int from, int to) {
  assert_int_equal(sched_dag_edge(t->dag, from, to), REMAT_OK);
  t->from[t->nedges] = from;
  t->to[t->nedges] = to;
  t->nedges++;
}

/* A random DAG: each task gets 0 to 4 predecessors among the 200 before it
 * (edges go from lower to higher ids), a random priority and, with
 * `nnodes` > 0, a random NUMA node or none. */
static void build_random(test_dag *t, int ntasks, unsigned seed, int nnodes) {
  test_dag_init(t, ntasks, ntasks * 4);
  for (int i = 0; i < ntasks; i++) {
    int node = nnodes > 0 ? (int)(next_rand(&seed) % (nnodes + 1)) - 1 : -1;
    add_task(t, (int)(next_rand(&seed) % 7), node, "random");
    int fan_in = i == 0 ? 0 : (int)(next_rand(&seed) % 5);
    int window = i < 200 ? i : 200;
    for (int k = 0; k < fan_in; k++)
      add_edge(t, i - 1 - (int)(next_rand(&seed) % window), i);
  }
  char err[SCHED_ERRMSG_MAX];
  assert_int_equal(sched_dag_finalize(t->dag, err), REMAT_OK);
}

enum { WHY_MAX = 256 };

/* Every task ran exactly once, after all its predecessors, on a worker in
 * range; resets the counts. False with the first problem in `why`. It
 * asserts nothing, so that host threads other than cmocka's may call it. */
static bool check_run(test_dag *t, char why[WHY_MAX]) {
  bool ok = true;
  for (int i = 0; i < t->ntasks; i++) {
    int count = atomic_exchange(&t->rec.count[i], 0);
    if (count != 1 && ok)
      snprintf(why, WHY_MAX, "task %d ran %d times", i, count);
    ok = ok && count == 1;
  }
  for (int e = 0; ok && e < t->nedges; e++)
    if (atomic_load(&t->rec.stamp[t->from[e]]) >=
        atomic_load(&t->rec.stamp[t->to[e]])) {
      snprintf(why, WHY_MAX, "task %d ran before its predecessor %d", t->to[e],
               t->from[e]);
      ok = false;
    }
  if (ok && atomic_load(&t->rec.bad_worker) != 0) {
    snprintf(why, WHY_MAX, "a task ran on a worker index out of range");
    ok = false;
  }
  return ok;
}

static hwloc_topology_t load_topology(const char *synthetic) {
  hwloc_topology_t topo;
  assert_int_equal(hwloc_topology_init(&topo), 0);
  if (synthetic)
    assert_int_equal(hwloc_topology_set_synthetic(topo, synthetic), 0);
  assert_int_equal(hwloc_topology_load(topo), 0);
  return topo;
}

static sched_pool *make_pool(hwloc_topology_t topo, int nthreads,
                             sched_bind bind) {
  sched_pool *pool = NULL;
  char err[SCHED_ERRMSG_MAX];
  assert_int_equal(sched_pool_create(topo, nthreads, bind, &pool, err),
                   REMAT_OK);
  assert_int_equal(sched_pool_num_workers(pool), nthreads);
  return pool;
}

/* Runs the DAG and checks the run (see check_run); asserts nothing. */
static bool run_checked(sched_pool *pool, test_dag *t, char why[WHY_MAX]) {
  char err[SCHED_ERRMSG_MAX] = "";
  t->rec.nworkers = sched_pool_num_workers(pool);
  remat_status status = sched_run(pool, t->dag, NULL, err);
  bool ran = check_run(t, why);
  if (status != REMAT_OK)
    snprintf(why, WHY_MAX, "sched_run: %d %s", status, err);
  return status == REMAT_OK && ran;
}

/* check_run on the main thread: fails the test with the reason. */
static void assert_run(test_dag *t) {
  char why[WHY_MAX];
  if (!check_run(t, why))
    fail_msg("%s", why);
}

static void run_ok(sched_pool *pool, test_dag *t) {
  char why[WHY_MAX];
  if (!run_checked(pool, t, why))
    fail_msg("%s", why);
}

/* ---- tests ---- */

static void test_random_dags(void **state) {
  (void)state;
  const int threads[] = {1, 2, 8};
  const unsigned seeds[] = {1, 7, 12345};
  int ntasks = quick() ? 1000 : 3000, runs = quick() ? 10 : 100;
  hwloc_topology_t topo = load_topology(NULL);
  for (int s = 0; s < 3; s++) {
    test_dag t;
    build_random(&t, ntasks, seeds[s], 0);
    for (int k = 0; k < 3; k++) {
      sched_pool *pool = make_pool(topo, threads[k], SCHED_BIND_NONE);
      for (int r = 0; r < runs; r++)
        run_ok(pool, &t);
      sched_pool_destroy(pool);
    }
    test_dag_free(&t);
  }
  hwloc_topology_destroy(topo);
}

static void check_groups(const sched_placement *p, int nnodes,
                         const int *per_node) {
  assert_int_equal(p->nnodes, nnodes);
  assert_int_equal(p->node_first[0], 0);
  for (int n = 0; n < nnodes; n++) {
    assert_int_equal(p->node_first[n + 1] - p->node_first[n], per_node[n]);
    for (int w = p->node_first[n]; w < p->node_first[n + 1]; w++)
      assert_int_equal(p->worker_node[w], n);
  }
  assert_int_equal(p->node_first[nnodes], p->nworkers);
}

/* Core binding: each worker on one core of its node, round-robin. */
static void check_core_cpusets(hwloc_topology_t topo,
                               const sched_placement *p) {
  for (int w = 0; w < p->nworkers; w++) {
    int node = p->worker_node[w], rank = w - p->node_first[node];
    hwloc_obj_t numa = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, node);
    int ncores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, numa->cpuset,
                                                        HWLOC_OBJ_CORE);
    hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(
        topo, numa->cpuset, HWLOC_OBJ_CORE, (unsigned)(rank % ncores));
    assert_true(hwloc_bitmap_isequal(p->cpuset[w], core->cpuset));
  }
}

static void place(hwloc_topology_t topo, int nthreads, sched_bind bind,
                  sched_placement *p) {
  char err[SCHED_ERRMSG_MAX];
  assert_int_equal(sched_place_workers(topo, nthreads, bind, p, err), REMAT_OK);
  assert_int_equal(p->nworkers, nthreads);
}

static void test_placement_two_nodes(void **state) {
  (void)state;
  hwloc_topology_t topo = load_topology("pack:1 numa:2 core:4 pu:1");
  assert_int_equal(sched_physical_cores(topo), 8);
  sched_placement p;
  place(topo, 8, SCHED_BIND_CORE, &p);
  check_groups(&p, 2, (int[]){4, 4});
  check_core_cpusets(topo, &p);
  sched_placement_free(&p);
  place(topo, 3, SCHED_BIND_CORE, &p); /* 1.5 each: the tie goes to node 0 */
  check_groups(&p, 2, (int[]){2, 1});
  sched_placement_free(&p);
  place(topo, 12, SCHED_BIND_CORE, &p); /* more threads than cores: wrap */
  check_groups(&p, 2, (int[]){6, 6});
  check_core_cpusets(topo, &p);
  assert_true(hwloc_bitmap_isequal(p.cpuset[4], p.cpuset[0]));
  sched_placement_free(&p);
  place(topo, 1, SCHED_BIND_NUMA, &p);
  check_groups(&p, 1, (int[]){1});
  hwloc_obj_t node0 = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, 0);
  assert_true(hwloc_bitmap_isequal(p.cpuset[0], node0->cpuset));
  sched_placement_free(&p);
  hwloc_topology_destroy(topo);
}

/* Victims: every other worker once, own node's workers first. */
static void check_steal_order(const sched_placement *p) {
  int n = p->nworkers;
  int *victims = malloc((size_t)n * sizeof(int));
  int *seen = calloc((size_t)n, sizeof(int));
  for (int w = 0; w < n; w++) {
    memset(seen, 0, (size_t)n * sizeof(int));
    sched_steal_order(p, w, victims);
    int node = p->worker_node[w];
    int local = p->node_first[node + 1] - p->node_first[node] - 1;
    for (int i = 0; i < n - 1; i++) {
      assert_int_not_equal(victims[i], w);
      assert_int_equal(seen[victims[i]]++, 0);
      assert_int_equal(p->worker_node[victims[i]] == node, i < local);
    }
  }
  free(victims);
  free(seen);
}

static void test_placement_four_nodes(void **state) {
  (void)state;
  hwloc_topology_t topo = load_topology("numa:4 core:2 pu:1");
  sched_placement p;
  place(topo, 8, SCHED_BIND_CORE, &p);
  check_groups(&p, 4, (int[]){2, 2, 2, 2});
  check_core_cpusets(topo, &p);
  check_steal_order(&p);
  int victims[7];
  sched_steal_order(&p, 2, victims); /* node 1: its partner, then node 0 */
  const int expected[7] = {3, 0, 1, 6, 7, 4, 5}; /* then nodes 3 and 2 */
  assert_memory_equal(victims, expected, sizeof expected);
  sched_placement_free(&p);
  place(topo, 6, SCHED_BIND_NONE, &p); /* 1.5 per node */
  check_groups(&p, 4, (int[]){2, 2, 1, 1});
  check_steal_order(&p);
  sched_placement_free(&p);
  place(topo, 2, SCHED_BIND_CORE, &p); /* nodes without workers drop out */
  check_groups(&p, 2, (int[]){1, 1});
  check_steal_order(&p);
  sched_placement_free(&p);
  hwloc_topology_destroy(topo);
}

/* Tasks with a NUMA node run only on workers of that node. */
static void check_affinity(const char *synthetic, int nthreads, int nnodes) {
  hwloc_topology_t topo = load_topology(synthetic);
  sched_pool *pool = make_pool(topo, nthreads, SCHED_BIND_CORE);
  const sched_placement *p = sched_pool_placement(pool);
  assert_int_equal(p->nnodes, nnodes);
  test_dag t;
  build_random(&t, quick() ? 500 : 2000, 99, nnodes);
  for (int r = 0; r < (quick() ? 5 : 30); r++) {
    for (int i = 0; i < t.ntasks; i++)
      atomic_store(&t.rec.worker[i], -1);
    run_ok(pool, &t);
    for (int i = 0; i < t.ntasks; i++) {
      int w = atomic_load(&t.rec.worker[i]);
      if (t.node[i] >= 0 && p->worker_node[w] != t.node[i])
        fail_msg("task %d of node %d ran on worker %d of node %d", i, t.node[i],
                 w, p->worker_node[w]);
    }
  }
  test_dag_free(&t);
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

static void test_affinity(void **state) {
  (void)state;
  check_affinity("pack:1 numa:2 core:4 pu:1", 4, 2);
  check_affinity("numa:4 core:2 pu:1", 8, 4);
}

static void test_priorities(void **state) {
  (void)state;
  hwloc_topology_t topo = load_topology(NULL);
  sched_pool *pool = make_pool(topo, 1, SCHED_BIND_NONE);
  test_dag t;
  test_dag_init(&t, 8, 8);
  const int priority[] = {0, 1, 5, 3, 2, 9, 4, 7};
  for (int i = 0; i < 8; i++)
    add_task(&t, priority[i], -1, "p");
  add_edge(&t, 0, 1); /* task 0 releases 1, 2, 3 (priorities 1, 5, 3) */
  add_edge(&t, 0, 2);
  add_edge(&t, 0, 3);
  char err[SCHED_ERRMSG_MAX];
  assert_int_equal(sched_dag_finalize(t.dag, err), REMAT_OK);
  run_ok(pool, &t);
  /* One worker: roots by priority (5: 9, 7: 7, 6: 4, 4: 2, 0: 0), then
   * the continuation 2, then 3 and 1 from the deque. */
  const int order[] = {5, 7, 6, 4, 0, 2, 3, 1};
  for (int i = 0; i < 8; i++)
    assert_int_equal(atomic_load(&t.rec.stamp[order[i]]), i);
  test_dag_free(&t);
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

/* sched_pick.h's rule on chosen views: each source where it should win. */
static void test_pick_source(void **state) {
  (void)state;
  const int32_t none = INT32_MIN;
  sched_view v = {.heap_top = 5, .root_prio = 5, .heap_ready = true,
                  .root_ready = true, .inbox_ready = true};
  assert_int_equal(sched_pick_source(v), SCHED_FROM_HEAP); /* ties: heap */
  v.root_prio = 6;
  assert_int_equal(sched_pick_source(v), SCHED_FROM_INBOX);
  v.inbox_ready = false;
  assert_int_equal(sched_pick_source(v), SCHED_FROM_ROOT);
  v = (sched_view){.heap_top = 3, .root_prio = none, .heap_ready = true};
  assert_int_equal(sched_pick_source(v), SCHED_FROM_HEAP);
  v = (sched_view){.heap_top = none, .root_prio = none, .heap_ready = true};
  assert_int_equal(sched_pick_source(v), SCHED_FROM_HEAP); /* priority MIN */
  v = (sched_view){.heap_top = none, .root_prio = none, .root_ready = true};
  assert_int_equal(sched_pick_source(v), SCHED_FROM_ROOT);
  v = (sched_view){.heap_top = none, .root_prio = none};
  assert_int_equal(sched_pick_source(v), SCHED_FROM_STEAL);
  assert_true(sched_keeps_continuation(4, 4, 4));
  assert_false(sched_keeps_continuation(4, 5, none));
  assert_false(sched_keeps_continuation(4, none, 5));
  assert_true(sched_keeps_continuation(4, none, none));
  assert_true(sched_may_continue(-1, 1));
  assert_true(sched_may_continue(1, 1));
  assert_false(sched_may_continue(0, 1));
  assert_int_equal(sched_root_batch(1000, 0, 2), 128);
  assert_int_equal(sched_root_batch(1000, 900, 2), 25);
  assert_int_equal(sched_root_batch(10, 9, 4), 1);
}

/* A replay of one worker by sched_pick.h alone, on plain arrays: what the
 * scaling simulator does. Fills order[] with the tasks as it takes them. */
typedef struct replay {
  const sched_dag *dag;
  int32_t *pending, *heap, *inbox;
  int32_t nheap, inbox_head, inbox_tail, cursor;
} replay;

static int32_t replay_prio(const replay *r, int32_t t) {
  return r->dag->info[t].priority;
}

/* The heap's top: priorities are distinct, so a linear scan will do. */
static int replay_top(const replay *r) {
  int best = -1;
  for (int i = 0; i < r->nheap; i++)
    if (best < 0 || replay_prio(r, r->heap[i]) > replay_prio(r, r->heap[best]))
      best = i;
  return best;
}

static void replay_push(replay *r, int32_t t) {
  if (r->dag->tasks[t].numa_node < 0)
    r->heap[r->nheap++] = t;
  else
    r->inbox[r->inbox_tail++] = t;
}

static int32_t replay_find(replay *r) {
  int top = replay_top(r);
  const sched_dag *dag = r->dag;
  sched_view v = {
      .heap_top = top >= 0 ? replay_prio(r, r->heap[top]) : INT32_MIN,
      .root_prio = r->cursor < dag->nroots
                       ? replay_prio(r, dag->roots[r->cursor]) : INT32_MIN,
      .heap_ready = top >= 0,
      .root_ready = r->cursor < dag->nroots,
      .inbox_ready = r->inbox_head < r->inbox_tail};
  switch (sched_pick_source(v)) {
  case SCHED_FROM_HEAP: {
    int32_t t = r->heap[top];
    r->heap[top] = r->heap[--r->nheap];
    return t;
  }
  case SCHED_FROM_INBOX:
    return r->inbox[r->inbox_head++];
  case SCHED_FROM_ROOT:
    return dag->roots[r->cursor++];
  case SCHED_FROM_STEAL:
    break;
  }
  return -1;
}

static void replay_one_worker(const sched_dag *dag, int32_t *order) {
  int32_t n = dag->ntasks, k = 0;
  replay r = {.dag = dag};
  r.pending = calloc((size_t)n, sizeof *r.pending);
  r.heap = calloc((size_t)n, sizeof *r.heap);
  r.inbox = calloc((size_t)n, sizeof *r.inbox);
  assert_non_null(r.inbox);
  for (int32_t t = 0; t < n; t++)
    r.pending[t] = dag->tasks[t].npred;
  for (int32_t i = 0; i < dag->naffine_roots; i++)
    replay_push(&r, dag->roots[dag->nroots + i]);
  for (int32_t task = replay_find(&r); task >= 0;) {
    order[k++] = task;
    int32_t next = -1;
    const sched_task *t = &dag->tasks[task];
    for (int32_t e = t->succ_end - 1; e >= t->succ_begin; e--) {
      int32_t s = dag->succ[e];
      if (--r.pending[s] > 0)
        continue;
      if (!sched_may_continue(dag->tasks[s].numa_node, 0)) {
        replay_push(&r, s);
        continue;
      }
      if (next >= 0)
        replay_push(&r, next);
      next = s;
    }
    if (next >= 0) {
      int top = replay_top(&r);
      int32_t heap_top = top >= 0 ? replay_prio(&r, r.heap[top]) : INT32_MIN;
      int32_t root = r.cursor < dag->nroots
                         ? replay_prio(&r, dag->roots[r.cursor]) : INT32_MIN;
      if (!sched_keeps_continuation(replay_prio(&r, next), heap_top, root)) {
        replay_push(&r, next);
        next = replay_find(&r);
      }
    } else {
      next = replay_find(&r);
    }
    task = next;
  }
  assert_int_equal(k, n);
  free(r.pending);
  free(r.heap);
  free(r.inbox);
}

/* The simulator's premise: a replay by sched_pick.h takes tasks in the
 * order a 1-worker sched_run runs them, on random DAGs with distinct
 * priorities and tasks bound to the worker's node (the inbox). */
static void test_pick_replays_one_worker(void **state) {
  (void)state;
  hwloc_topology_t topo = load_topology("numa:1 core:1 pu:1");
  sched_pool *pool = make_pool(topo, 1, SCHED_BIND_NONE);
  for (unsigned seed = 1; seed <= 4; seed++) {
    enum { N = 600 };
    test_dag t;
    test_dag_init(&t, N, N * 4);
    unsigned rs = seed;
    int prio[N];
    for (int i = 0; i < N; i++)
      prio[i] = i;
    for (int i = N - 1; i > 0; i--) { /* distinct, shuffled */
      int j = (int)(next_rand(&rs) % (unsigned)(i + 1)), x = prio[i];
      prio[i] = prio[j];
      prio[j] = x;
    }
    for (int i = 0; i < N; i++) {
      add_task(&t, prio[i], next_rand(&rs) % 4 == 0 ? 0 : -1, "pick");
      int fan_in = i == 0 ? 0 : (int)(next_rand(&rs) % 4);
      int window = i < 50 ? i : 50;
      for (int k = 0; k < fan_in; k++)
        add_edge(&t, i - 1 - (int)(next_rand(&rs) % window), i);
    }
    char err[SCHED_ERRMSG_MAX];
    assert_int_equal(sched_dag_finalize(t.dag, err), REMAT_OK);
    run_ok(pool, &t);
    int32_t order[N];
    replay_one_worker(t.dag, order);
    for (int i = 0; i < N; i++)
      if (atomic_load(&t.rec.stamp[order[i]]) != i)
        fail_msg("seed %u: the replay's task %d is %d, which ran %ld-th", seed,
                 i, (int)order[i], atomic_load(&t.rec.stamp[order[i]]));
    test_dag_free(&t);
  }
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

static void test_cycle(void **state) {
  (void)state;
  static const char *names[20] = {"a", "a", "a", "a", "a", "a", "a",
                                  "a", "a", "a", "a", "a", "a", "a",
                                  "a", "a", "a", "b", "c", "d"};
  test_dag t;
  test_dag_init(&t, 20, 40);
  for (int i = 0; i < 20; i++)
    add_task(&t, 0, -1, names[i]);
  for (int i = 0; i + 1 < 20; i++)
    add_edge(&t, i, i + 1);
  add_edge(&t, 18, 17);
  char err[SCHED_ERRMSG_MAX] = "";
  assert_int_equal(sched_dag_finalize(t.dag, err), REMAT_ERR_CYCLE);
  assert_string_equal(err, "task graph has a cycle through task 17 'b'");
  assert_int_equal(sched_run(NULL, t.dag, NULL, err), REMAT_ERR_INVALID_ARG);
  test_dag_free(&t);

  test_dag_init(&t, 3, 3); /* a self-loop */
  for (int i = 0; i < 3; i++)
    add_task(&t, 0, -1, i == 2 ? "self" : "x");
  add_edge(&t, 0, 2);
  add_edge(&t, 2, 2);
  assert_int_equal(sched_dag_finalize(t.dag, err), REMAT_ERR_CYCLE);
  assert_string_equal(err, "task graph has a cycle through task 2 'self'");
  test_dag_free(&t);
}

static int nop_task(void *context, void *arg, int worker) {
  (void)context;
  (void)arg;
  (void)worker;
  return 0;
}

static void test_dag_limits(void **state) {
  (void)state;
  char err[SCHED_ERRMSG_MAX];
  sched_dag *dag;
  assert_int_equal(sched_dag_create(&dag, err), REMAT_OK);
  sched_dag_set_limits(dag, 4, 3);
  for (int i = 0; i < 4; i++)
    assert_int_equal(sched_dag_add(dag, nop_task, NULL, 0, -1, "t", "c"), i);
  assert_int_equal(sched_dag_add(dag, nop_task, NULL, 0, -1, "t", "c"),
                   -REMAT_ERR_LIMIT);
  for (int i = 0; i < 3; i++)
    assert_int_equal(sched_dag_edge(dag, i, i + 1), REMAT_OK);
  assert_int_equal(sched_dag_edge(dag, 0, 3), REMAT_ERR_LIMIT);
  assert_int_equal(sched_dag_edge(dag, -1, 3), REMAT_ERR_INVALID_ARG);
  assert_int_equal(sched_dag_edge(dag, 0, 4), REMAT_ERR_INVALID_ARG);
  assert_int_equal(sched_dag_edge(NULL, 0, 1), REMAT_ERR_INVALID_ARG);
  assert_int_equal(sched_dag_add(NULL, nop_task, NULL, 0, -1, "t", "c"),
                   -REMAT_ERR_INVALID_ARG);
  assert_int_equal(sched_dag_add(dag, NULL, NULL, 0, -1, "t", "c"),
                   -REMAT_ERR_INVALID_ARG);
  assert_int_equal(sched_dag_add(dag, nop_task, NULL, 0, -2, "t", "c"),
                   -REMAT_ERR_INVALID_ARG);
  assert_int_equal(sched_dag_num_tasks(dag), 4);
  assert_int_equal(sched_dag_finalize(dag, err), REMAT_OK);
  assert_int_equal(sched_dag_finalize(dag, err), REMAT_ERR_STATE);
  assert_int_equal(sched_dag_add(dag, nop_task, NULL, 0, -1, "t", "c"),
                   -REMAT_ERR_STATE);
  assert_int_equal(sched_dag_edge(dag, 0, 1), REMAT_ERR_STATE);
  assert_int_equal(sched_dag_finalize(NULL, err), REMAT_ERR_INVALID_ARG);
  assert_int_equal(sched_dag_num_tasks(NULL), 0);
  sched_dag_destroy(dag);
  sched_dag_destroy(NULL);
}

static void test_pool_args(void **state) {
  (void)state;
  char err[SCHED_ERRMSG_MAX];
  hwloc_topology_t topo = load_topology("numa:2 core:2 pu:1");
  sched_pool *pool;
  assert_int_equal(sched_pool_create(topo, 0, SCHED_BIND_CORE, &pool, err),
                   REMAT_ERR_INVALID_ARG);
  assert_null(pool);
  assert_int_equal(sched_pool_create(topo, SCHED_MAX_THREADS + 1,
                                     SCHED_BIND_CORE, &pool, err),
                   REMAT_ERR_LIMIT);
  assert_int_equal(sched_pool_create(NULL, 2, SCHED_BIND_CORE, &pool, err),
                   REMAT_ERR_INVALID_ARG);
  assert_int_equal(sched_pool_create(topo, 2, (sched_bind)7, &pool, err),
                   REMAT_ERR_INVALID_ARG);
  assert_int_equal(sched_pool_create(topo, 2, SCHED_BIND_CORE, NULL, err),
                   REMAT_ERR_INVALID_ARG);
  pool = make_pool(topo, 2, SCHED_BIND_NUMA);
  sched_dag *dag;
  assert_int_equal(sched_dag_create(&dag, err), REMAT_OK);
  assert_int_equal(sched_dag_add(dag, nop_task, NULL, 0, 2, "far", "c"), 0);
  assert_int_equal(sched_run(pool, dag, NULL, err), REMAT_ERR_STATE);
  assert_int_equal(sched_dag_finalize(dag, err), REMAT_OK);
  assert_int_equal(sched_run(pool, dag, NULL, err), REMAT_ERR_INVALID_ARG);
  assert_string_equal(err, "task 0 'far' wants NUMA node 2 but the pool has 2 "
                           "node(s)");
  assert_int_equal(sched_run(pool, NULL, NULL, err), REMAT_ERR_INVALID_ARG);
  sched_dag_destroy(dag);
  sched_pool_destroy(pool);
  sched_pool_destroy(NULL);
  hwloc_topology_destroy(topo);
}

/* Marks every task reachable from `task` in `reach`. */
static void mark_descendants(const test_dag *t, int task, bool *reach) {
  reach[task] = true;
  for (int e = 0; e < t->nedges; e++) /* edges go up, so one pass in order */
    if (reach[t->from[e]])
      reach[t->to[e]] = true;
}

static void test_task_error(void **state) {
  (void)state;
  hwloc_topology_t topo = load_topology(NULL);
  sched_pool *pool = make_pool(topo, 2, SCHED_BIND_NONE);
  test_dag t;
  build_random(&t, 1000, 5, 0);
  t.rec.fail_task = 123;
  t.rec.fail_status = REMAT_ERR_NUMERIC;
  t.rec.nworkers = 2;
  char err[SCHED_ERRMSG_MAX];
  assert_int_equal(sched_run(pool, t.dag, NULL, err), REMAT_ERR_NUMERIC);
  assert_string_equal(err, "task 123 'random' failed with status 10");
  bool *reach = calloc((size_t)t.ntasks, sizeof(bool));
  mark_descendants(&t, 123, reach);
  for (int i = 0; i < t.ntasks; i++) {
    int count = atomic_load(&t.rec.count[i]);
    assert_true(count <= 1);
    if (i == 123)
      assert_int_equal(count, 1);
    else if (reach[i])
      assert_int_equal(count, 0); /* skipped: it ran after the failure */
    atomic_store(&t.rec.count[i], 0);
  }
  free(reach);
  t.rec.fail_task = -1; /* the pool and DAG are fine for the next run */
  run_ok(pool, &t);
  test_dag_free(&t);
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = calloc((size_t)size + 1, 1);
  assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  return text;
}

static void test_trace(void **state) {
  (void)state;
  hwloc_topology_t topo = load_topology(NULL);
  sched_pool *pool = make_pool(topo, 2, SCHED_BIND_NONE);
  test_dag t;
  test_dag_init(&t, 3, 2);
  add_task(&t, 0, -1, "matmul \"fwd\"");
  add_task(&t, 0, -1, "back\\slash");
  add_task(&t, 0, -1, "softmax");
  add_edge(&t, 0, 1);
  add_edge(&t, 1, 2);
  char err[SCHED_ERRMSG_MAX];
  assert_int_equal(sched_dag_finalize(t.dag, err), REMAT_OK);
  char path[] = "/tmp/test_sched_trace_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  sched_run_opts opts = {.trace_path = path};
  t.rec.nworkers = 2;
  assert_int_equal(sched_run(pool, t.dag, &opts, err), REMAT_OK);
  char *text = read_file(path);
  assert_memory_equal(text, "{\"traceEvents\":", 15);
  assert_non_null(strstr(text, "\"ph\":\"X\""));
  assert_non_null(strstr(text, "\"name\":\"matmul \\\"fwd\\\"\""));
  assert_non_null(strstr(text, "\"name\":\"back\\\\slash\""));
  assert_non_null(strstr(text, "\"name\":\"softmax\",\"cat\":\"test\""));
  assert_non_null(strstr(text, "\"name\":\"worker 1 (node 0)\""));
  assert_string_equal(text + strlen(text) - 3, "]}\n");
  free(text);
  unlink(path);
  opts.trace_path = "/nonexistent-dir/trace.json";
  assert_int_equal(sched_run(pool, t.dag, &opts, err), REMAT_ERR_IO);
  assert_string_equal(err, "cannot write trace '/nonexistent-dir/trace.json'"
                           ": No such file or directory");
  test_dag_free(&t);
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

static void test_empty_dag(void **state) {
  (void)state;
  hwloc_topology_t topo = load_topology(NULL);
  sched_pool *pool = make_pool(topo, 2, SCHED_BIND_CORE);
  char err[SCHED_ERRMSG_MAX];
  sched_dag *dag;
  assert_int_equal(sched_dag_create(&dag, err), REMAT_OK);
  assert_int_equal(sched_dag_finalize(dag, err), REMAT_OK);
  for (int i = 0; i < 3; i++)
    assert_int_equal(sched_run(pool, dag, NULL, err), REMAT_OK);
  sched_dag_destroy(dag);
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

/* A host thread's runs; cmocka is not thread-safe, so the thread records
 * how many runs failed and why the first did, and the test's thread
 * asserts on that after joining. */
typedef struct host_thread {
  sched_pool *pool;
  test_dag *t;
  int runs;
  int failed;
  char first[WHY_MAX];
} host_thread;

static void *host_main(void *arg) {
  host_thread *h = arg;
  char why[WHY_MAX];
  for (int r = 0; r < h->runs; r++)
    if (!run_checked(h->pool, h->t, why) && h->failed++ == 0)
      memcpy(h->first, why, sizeof why);
  return NULL;
}

static void join_host(pthread_t th, const host_thread *h, const char *name) {
  assert_int_equal(pthread_join(th, NULL), 0);
  if (h->failed != 0)
    fail_msg("host thread %s: %d of %d runs failed, the first: %s", name,
             h->failed, h->runs, h->first);
}

/* One pool runs small and large DAGs over and over, also from two host
 * threads at once (runs are serialized). */
static void test_repeated_runs(void **state) {
  (void)state;
  hwloc_topology_t topo = load_topology(NULL);
  sched_pool *pool = make_pool(topo, 2, SCHED_BIND_CORE);
  test_dag small, large;
  build_random(&small, 20, 3, 0);
  build_random(&large, 2000, 4, 0);
  int runs = quick() ? 100 : 1000;
  for (int r = 0; r < runs; r++)
    run_ok(pool, r % 10 == 9 ? &large : &small);
  host_thread a = {.pool = pool, .t = &small, .runs = runs};
  host_thread b = {.pool = pool, .t = &large, .runs = runs / 10};
  pthread_t ta, tb;
  assert_int_equal(pthread_create(&ta, NULL, host_main, &a), 0);
  assert_int_equal(pthread_create(&tb, NULL, host_main, &b), 0);
  join_host(ta, &a, "a");
  join_host(tb, &b, "b");
  test_dag_free(&small);
  test_dag_free(&large);
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

/* A chain of 12 tasks whose affinities cycle through none, node 0, node 1,
 * with a side task off every third one, so that ready tasks meet on
 * several workers. */
static void build_affine_dag(test_dag *t) {
  test_dag_init(t, 16, 16);
  for (int i = 0; i < 12; i++) {
    add_task(t, 0, i % 3 - 1, "affine");
    if (i > 0)
      add_edge(t, i - 1, i);
  }
  for (int k = 0; k < 4; k++) {
    add_task(t, 1, k % 2, "side");
    add_edge(t, 3 * k, 12 + k);
  }
  char err[SCHED_ERRMSG_MAX];
  assert_int_equal(sched_dag_finalize(t->dag, err), REMAT_OK);
}

/* The number and the string `key` of a JSON object, which must have it. */
static int json_int(const cJSON *object, const char *key) {
  const cJSON *item = cJSON_GetObjectItem(object, key);
  if (!cJSON_IsNumber(item))
    fail_msg("trace event without a number '%s'", key);
  return item->valueint;
}

static const char *json_string(const cJSON *object, const char *key) {
  const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(object, key));
  if (text == NULL)
    fail_msg("trace event without a string '%s'", key);
  return text;
}

/* One thread_name event per worker naming its node, then one slice per
 * task, on a worker of its node, with its affinity as args.node. */
static void check_trace_nodes(const char *path, const sched_placement *p,
                              const test_dag *t) {
  char *text = read_file(path);
  cJSON *root = cJSON_Parse(text);
  free(text);
  assert_non_null(root);
  int threads = 0, *slices = calloc((size_t)t->ntasks, sizeof(int));
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
    const char *ph = json_string(e, "ph");
    const cJSON *args = cJSON_GetObjectItem(e, "args");
    int tid = json_int(e, "tid");
    assert_true(tid >= 0 && tid < p->nworkers);
    if (strcmp(ph, "M") == 0) {
      char name[64];
      snprintf(name, sizeof name, "worker %d (node %d)", tid,
               p->worker_node[tid]);
      assert_string_equal(json_string(args, "name"), name);
      assert_int_equal(tid, threads++);
      continue;
    }
    int id = json_int(args, "id");
    int node = json_int(args, "node");
    assert_true(id >= 0 && id < t->ntasks);
    slices[id]++;
    assert_int_equal(node, t->node[id]);
    if (node >= 0)
      assert_int_equal(p->worker_node[tid], node);
  }
  assert_int_equal(threads, p->nworkers);
  for (int i = 0; i < t->ntasks; i++)
    assert_int_equal(slices[i], 1);
  free(slices);
  cJSON_Delete(root);
}

static void test_trace_nodes(void **state) {
  (void)state;
  hwloc_topology_t topo = load_topology("pack:2 numa:1 core:2 pu:1");
  sched_pool *pool = make_pool(topo, 4, SCHED_BIND_CORE);
  const sched_placement *p = sched_pool_placement(pool);
  assert_int_equal(p->nnodes, 2);
  test_dag t;
  build_affine_dag(&t);
  char path[] = "/tmp/test_sched_nodes_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  sched_trace_result traced = {.status = REMAT_ERR_IO, .err = "stale"};
  sched_run_opts opts = {.trace_path = path, .trace_result = &traced};
  t.rec.nworkers = 4;
  char err[SCHED_ERRMSG_MAX];
  for (int r = 0; r < 5; r++) {
    assert_int_equal(sched_run(pool, t.dag, &opts, err), REMAT_OK);
    assert_run(&t);
    assert_int_equal(traced.status, REMAT_OK);
    assert_string_equal(traced.err, "");
    check_trace_nodes(path, p, &t);
  }
  unlink(path);
  test_dag_free(&t);
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

/* A trace that cannot be written is reported apart: the run's status is the
 * tasks' own, every task ran, and the next run starts with a clean result. */
static void test_trace_failure_apart(void **state) {
  (void)state;
  hwloc_topology_t topo = load_topology(NULL);
  sched_pool *pool = make_pool(topo, 2, SCHED_BIND_NONE);
  test_dag t;
  build_random(&t, 50, 6, 0);
  t.rec.nworkers = 2;
  sched_trace_result traced;
  sched_run_opts opts = {.trace_path = "/nonexistent-dir/trace.json",
                         .trace_result = &traced};
  char err[SCHED_ERRMSG_MAX] = "";
  assert_int_equal(sched_run(pool, t.dag, &opts, err), REMAT_OK);
  assert_run(&t);
  assert_string_equal(err, "");
  assert_int_equal(traced.status, REMAT_ERR_IO);
  assert_string_equal(traced.err,
                      "cannot write trace '/nonexistent-dir/trace.json': No "
                      "such file or directory");
  t.rec.fail_task = 7;
  t.rec.fail_status = REMAT_ERR_NUMERIC;
  assert_int_equal(sched_run(pool, t.dag, &opts, err), REMAT_ERR_NUMERIC);
  assert_string_equal(err, "task 7 'random' failed with status 10");
  assert_int_equal(traced.status, REMAT_ERR_IO);
  for (int i = 0; i < t.ntasks; i++)
    atomic_store(&t.rec.count[i], 0);
  t.rec.fail_task = -1;
  opts.trace_path = NULL;
  assert_int_equal(sched_run(pool, t.dag, &opts, err), REMAT_OK);
  assert_run(&t);
  assert_int_equal(traced.status, REMAT_OK);
  assert_string_equal(traced.err, "");
  test_dag_free(&t);
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_dags),
      cmocka_unit_test(test_placement_two_nodes),
      cmocka_unit_test(test_placement_four_nodes),
      cmocka_unit_test(test_affinity),
      cmocka_unit_test(test_priorities),
      cmocka_unit_test(test_pick_source),
      cmocka_unit_test(test_pick_replays_one_worker),
      cmocka_unit_test(test_cycle),
      cmocka_unit_test(test_dag_limits),
      cmocka_unit_test(test_pool_args),
      cmocka_unit_test(test_task_error),
      cmocka_unit_test(test_trace),
      cmocka_unit_test(test_empty_dag),
      cmocka_unit_test(test_repeated_runs),
      cmocka_unit_test(test_trace_nodes),
      cmocka_unit_test(test_trace_failure_apart),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
