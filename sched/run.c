/* One run of a finalized DAG on a pool: the caller wakes the workers, which
 * find, run and release tasks until all have finished, and waits for them.
 *
 * Where a worker looks for its next task, in order:
 *  1. the continuation: of the successors a finished task made ready, the
 *     highest-priority one that may run on this worker's node runs next on
 *     the same worker, with no queue traffic (a chain, whose tasks have
 *     one predecessor each, costs no atomic operation at all), unless a
 *     task of strictly higher priority waits in its heap or the roots;
 *  2. its own ready heap, highest priority first (the other newly ready
 *     successors go there), when its top outranks the next root;
 *  3. its node's affinity inbox: a task with numa_node >= 0 is only ever
 *     queued there (FIFO), and only workers of that node take from it (the
 *     successors that an async task's completion releases go there too,
 *     node 0's for those without affinity);
 *  4. the roots: sorted by priority at finalize and handed out from that
 *     static array through an atomic cursor, in batches of about a
 *     (2 * workers)-th of the roots left, at most SCHED_ROOT_BATCH_MAX
 *     (guided scheduling): a million independent tasks cost one atomic add per 128,
 *     and when roots are few (real steps) batches are of one or two, so a
 *     claimed batch (which only its worker runs) never holds back much;
 *  5. stealing the top task of other workers' heaps, own node first, in
 *     the order of sched_steal_order.
 * The choices are sched_pick.h's pure functions, which the scaling
 * simulator calls too. So one worker always runs the highest-priority
 * ready task: with priorities that follow a topological order, a
 * one-thread run follows that order exactly (the runtime predicts memory
 * from it). Heaps hold only tasks without affinity, so stealing never
 * moves a task off its node. An idle worker spins, yields, then sleeps
 * (pool.c). A task picked from any source that must wait for memory
 * admission is set aside (admit.c) and the worker looks again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "sched/sched_internal.h"

#define SPIN_PAUSES 64 /* find_task attempts with a pause between */
#define SPIN_YIELDS 16 /* then attempts with a sched_yield between */

/* The run's first failure; tasks waiting for admission are let in (their
 * bodies will be skipped). */
static void record_error(sched_worker *w, int32_t task, int status) {
  int none = 0;
  if (!atomic_compare_exchange_strong(&w->pool->error_status, &none, status))
    return;
  w->pool->error_task = task;
  sched_admit_open(w);
}

/* Runs the body of `task` unless an earlier task failed in this run (an
 * async task's body always runs). Returns whether the task has finished:
 * an async task whose body returned 0 finishes later, in sched_complete. */
static bool run_task(sched_worker *w, int32_t task) {
  sched_pool *pool = w->pool;
  const sched_task *t = &w->dag->tasks[task];
  sched_trace_record *trace = pool->trace;
  if (trace) {
    trace[task].worker = w->index;
    trace[task].start_ns = sched_now_ns();
  }
  int status = 0;
  if (t->async ||
      atomic_load_explicit(&pool->error_status, memory_order_relaxed) == 0) {
    status = t->fn(pool->context, t->arg, w->index);
    if (status != 0)
      record_error(w, task, status);
  }
  if (t->async && status == 0)
    return false;
  if (trace)
    trace[task].end_ns = sched_now_ns();
  w->finished++;
  if (pool->progress != NULL)
    atomic_fetch_add_explicit(
        &pool->progress[w->index * SCHED_PROGRESS_STRIDE], 1,
        memory_order_relaxed);
  return true;
}

/* Counts down a successor's pending predecessors; true if this was the
 * last. A task with one predecessor needs no counter. The last one puts
 * the counter back for the next run (no one else touches it in this run),
 * so runs need no reset pass. */
static bool last_predecessor(const sched_task *succ, atomic_int *pending) {
  if (succ->npred == 1)
    return true;
  if (atomic_fetch_sub_explicit(pending, 1, memory_order_acq_rel) != 1)
    return false;
  atomic_store_explicit(pending, succ->npred, memory_order_relaxed);
  return true;
}

/* Releases the successors of a finished task and returns the one to run
 * next on this worker (-1 if none). Successor lists are sorted highest
 * priority first; walking them backwards pushes the ready ones lowest
 * priority first and holds back the highest one this node may run. */
static int32_t release_successors(sched_worker *w, int32_t task) {
  const sched_dag *dag = w->dag;
  atomic_int *pending = w->pool->pending;
  int32_t next = -1;
  const sched_task *t = &dag->tasks[task];
  for (int32_t e = t->succ_end - 1; e >= t->succ_begin; e--) {
    int32_t s = dag->succ[e];
    if (!last_predecessor(&dag->tasks[s], &pending[s]))
      continue;
    int node = dag->tasks[s].numa_node;
    if (!sched_may_continue(node, w->node)) {
      sched_push_ready(w, s);
      continue;
    }
    if (next >= 0)
      sched_push_ready(w, next);
    next = s;
  }
  return next;
}

/* Priority of the next root this worker would take (INT32_MIN if none). */
static int32_t next_root_prio(const sched_worker *w) {
  const sched_dag *dag = w->dag;
  if (w->root_next < w->root_end)
    return sched_prio(dag, dag->roots[w->root_next]);
  int32_t first = atomic_load_explicit(&w->pool->root_cursor,
                                       memory_order_relaxed);
  return first < dag->nroots ? sched_prio(dag, dag->roots[first])
                             : INT32_MIN;
}

static int32_t find_task(sched_worker *w);

/* The continuation, or a waiting task that strictly outranks it. */
static int32_t continue_with(sched_worker *w, int32_t next) {
  int32_t p = sched_prio(w->dag, next);
  int32_t top = sched_heap_top_prio(&w->ready, w->dag);
  /* the root's priority only when the heap does not already decide */
  if (top <= p && sched_keeps_continuation(p, top, next_root_prio(w)))
    return next;
  sched_push_ready(w, next);
  return find_task(w);
}

/* Runs `task` and its continuations; a task waiting for memory admission
 * (admit.c) ends the chain, and a release queues it later. */
static void run_chain(sched_worker *w, int32_t task) {
  while (task >= 0) {
    if (w->dag->tasks[task].admit && !sched_admit(w, task))
      return;
    if (!run_task(w, task))
      return;
    task = release_successors(w, task);
    if (task >= 0)
      task = continue_with(w, task);
  }
}

/* The next root for this worker: from its claimed batch, else a new one. */
static int32_t next_root(sched_worker *w) {
  const sched_dag *dag = w->dag;
  if (w->root_next < w->root_end)
    return dag->roots[w->root_next++];
  atomic_int *cursor = &w->pool->root_cursor;
  int32_t n = dag->nroots;
  int32_t first = atomic_load_explicit(cursor, memory_order_relaxed);
  if (first >= n)
    return -1;
  int32_t batch = sched_root_batch(n, first, w->pool->nworkers);
  first = atomic_fetch_add_explicit(cursor, batch, memory_order_relaxed);
  if (first >= n)
    return -1;
  w->root_next = first + 1;
  w->root_end = first + batch < n ? first + batch : n;
  return dag->roots[first];
}

static int32_t steal(sched_worker *w) {
  sched_pool *pool = w->pool;
  for (int i = 0; i < pool->nworkers - 1; i++) {
    sched_heap *victim = &pool->workers[w->victims[i]].ready;
    if (sched_heap_size(victim) == 0)
      continue;
    int32_t task = sched_heap_pop(victim, w->dag, pool->links);
    if (task >= 0)
      return task;
  }
  return -1;
}

/* sched_pick_source's order, each source's state read only when the rule
 * gets to it (a root's priority is a load from a large cold array): own
 * heap when it outranks the roots, inbox, roots, own heap, steal. Each
 * source may turn out emptied meanwhile by other workers; then the next
 * is tried. test_sched replays a 1-worker run by sched_pick_source. */
static int32_t find_task(sched_worker *w) {
  sched_pool *pool = w->pool;
  int32_t task = -1;
  int32_t top = sched_heap_top_prio(&w->ready, w->dag);
  if (top != INT32_MIN && sched_heap_first(top, next_root_prio(w)))
    task = sched_heap_pop(&w->ready, w->dag, pool->links);
  sched_queue *inbox = &pool->nodes[w->node].inbox;
  if (task < 0 && sched_queue_size(inbox) > 0)
    task = sched_queue_pop_head(inbox, pool->links);
  if (task < 0)
    task = next_root(w);
  if (task < 0 && sched_heap_size(&w->ready) > 0)
    task = sched_heap_pop(&w->ready, w->dag, pool->links);
  if (task < 0)
    task = steal(w);
  return task;
}

/* Adds this worker's finished count to the pool's; the worker that brings
 * it to the number of tasks wakes everyone to end the run. Returns whether
 * the run is over. */
static bool flush_finished(sched_worker *w) {
  if (w->finished > 0) {
    int64_t total = atomic_fetch_add(&w->pool->finished, w->finished);
    total += w->finished;
    w->finished = 0;
    if (total == w->dag->ntasks) {
      sched_wake_all(w->pool);
      return true;
    }
  }
  return sched_run_over(w);
}

/* Waits for a task when find_task found none; -1 when the run is over. */
static int32_t wait_for_task(sched_worker *w) {
  for (;;) {
    if (flush_finished(w))
      return -1;
    for (int i = 0; i < SPIN_PAUSES + SPIN_YIELDS; i++) {
      int32_t task = find_task(w);
      if (task >= 0)
        return task;
      if (sched_run_over(w))
        return -1;
      if (i < SPIN_PAUSES)
        SCHED_CPU_RELAX();
      else
        sched_yield();
    }
    sched_sleep_until_work(w);
  }
}

void sched_worker_run(sched_worker *w) {
  w->root_next = w->root_end = 0;
  w->finished = 0;
  for (;;) {
    int32_t task = find_task(w);
    if (task < 0)
      task = wait_for_task(w);
    if (task < 0)
      return;
    run_chain(w, task);
  }
}

/* ---- asynchronous completion ---- */

void sched_complete(sched_pool *pool, int32_t task) {
  const sched_dag *dag = pool->dag;
  const sched_task *t = &dag->tasks[task];
  if (pool->trace)
    pool->trace[task].end_ns = sched_now_ns();
  if (pool->progress != NULL)
    atomic_fetch_add_explicit(&pool->progress[0], 1, memory_order_relaxed);
  for (int32_t e = t->succ_begin; e < t->succ_end; e++) {
    int32_t s = dag->succ[e];
    if (!last_predecessor(&dag->tasks[s], &pool->pending[s]))
      continue;
    int node = dag->tasks[s].numa_node < 0 ? 0 : dag->tasks[s].numa_node;
    sched_queue_push(&pool->nodes[node].inbox, pool->links, s);
    sched_wake_node(pool, node);
  }
  if (atomic_fetch_add(&pool->finished, 1) + 1 == dag->ntasks)
    sched_wake_all(pool);
}

int sched_run_failure(const sched_pool *pool) {
  return atomic_load(&pool->error_status);
}

/* ---- the caller's side ---- */

static remat_status check_run(const sched_pool *pool, const sched_dag *dag,
                              char err[SCHED_ERRMSG_MAX]) {
  if (!pool || !dag) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_run: pool or dag is NULL");
    return REMAT_ERR_INVALID_ARG;
  }
  if (!dag->finalized) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_run: the DAG is not finalized");
    return REMAT_ERR_STATE;
  }
  if (dag->max_node >= pool->place.nnodes) {
    const char *name = dag->info[dag->max_node_task].name;
    snprintf(err, SCHED_ERRMSG_MAX,
             "task %d '%s' wants NUMA node %d but the pool has %d node(s)",
             (int)dag->max_node_task, name ? name : "", (int)dag->max_node,
             pool->place.nnodes);
    return REMAT_ERR_INVALID_ARG;
  }
  return REMAT_OK;
}

/* Per-task arrays for a DAG bigger than any run before. */
static remat_status ensure_capacity(sched_pool *pool, int32_t ntasks,
                                    char err[SCHED_ERRMSG_MAX]) {
  if (ntasks <= pool->capacity)
    return REMAT_OK;
  free(pool->pending);
  free(pool->links.next);
  free(pool->links.prev);
  pool->pending = remat__malloc((size_t)ntasks * sizeof *pool->pending);
  pool->pending_serial = 0;
  pool->links.next = remat__malloc((size_t)ntasks * sizeof(int32_t));
  pool->links.prev = remat__malloc((size_t)ntasks * sizeof(int32_t));
  pool->capacity = ntasks;
  if (pool->pending && pool->links.next && pool->links.prev)
    return REMAT_OK;
  pool->capacity = 0;
  snprintf(err, SCHED_ERRMSG_MAX, "sched_run: out of memory for %d tasks",
           (int)ntasks);
  return REMAT_ERR_OUT_OF_MEMORY;
}

/* Dependency counters: each run leaves them as it found them (see
 * last_predecessor), so they are set only when this DAG was not the last
 * one run on this pool. */
static void reset_counters(sched_pool *pool, const sched_dag *dag) {
  if (pool->pending_serial == dag->serial)
    return;
  for (int32_t t = 0; t < dag->ntasks; t++)
    atomic_store_explicit(&pool->pending[t], dag->tasks[t].npred,
                          memory_order_relaxed);
  pool->pending_serial = dag->serial;
}

static void prepare_run(sched_pool *pool, const sched_dag *dag) {
  reset_counters(pool, dag);
  atomic_store(&pool->root_cursor, 0);
  atomic_store(&pool->finished, 0);
  pool->error_task = -1;
  pool->dag = dag;
  for (int32_t i = 0; i < dag->naffine_roots; i++) {
    int32_t t = dag->roots[dag->nroots + i];
    sched_queue_push(&pool->nodes[dag->tasks[t].numa_node].inbox, pool->links,
                     t);
  }
}

/* Starts the workers on the prepared run and waits until all have left. */
static void execute(sched_pool *pool) {
  pthread_mutex_lock(&pool->done_mutex);
  pool->active = pool->nworkers;
  pthread_mutex_unlock(&pool->done_mutex);
  atomic_fetch_add(&pool->generation, 1);
  sched_wake_all(pool);
  pthread_mutex_lock(&pool->done_mutex);
  while (pool->active > 0)
    pthread_cond_wait(&pool->done_cond, &pool->done_mutex);
  pthread_mutex_unlock(&pool->done_mutex);
  pool->dag = NULL;
}

static remat_status run_locked(sched_pool *pool, const sched_dag *dag,
                               const char *trace_path,
                               sched_trace_record *records,
                               sched_trace_result *traced,
                               int64_t admit_bound,
                               char err[SCHED_ERRMSG_MAX]) {
  remat_status status = ensure_capacity(pool, dag->ntasks, err);
  if (status != REMAT_OK)
    return status;
  if (!sched_admit_prepare(pool, dag, admit_bound)) {
    snprintf(err, SCHED_ERRMSG_MAX,
             "sched_run: out of memory for the admission of %d tasks",
             (int)dag->nadmit);
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  if (records != NULL && !trace_path) {
    pool->trace = records;
    pool->trace_origin_ns = sched_now_ns();
  } else if (trace_path) {
    pool->trace =
        remat__calloc(dag->ntasks ? (size_t)dag->ntasks : 1, sizeof *pool->trace);
    if (!pool->trace) {
      snprintf(err, SCHED_ERRMSG_MAX, "sched_run: out of memory for a trace");
      return REMAT_ERR_OUT_OF_MEMORY;
    }
    pool->trace_origin_ns = sched_now_ns();
  }
  if (dag->ntasks > 0) {
    prepare_run(pool, dag);
    execute(pool);
  }
  int failed = atomic_load(&pool->error_status);
  if (failed != 0) {
    const char *name = dag->info[pool->error_task].name;
    snprintf(err, SCHED_ERRMSG_MAX, "task %d '%s' failed with status %d",
             (int)pool->error_task, name ? name : "", failed);
    status = (remat_status)failed;
  }
  if (trace_path) {
    traced->status = sched_trace_write(pool, dag, trace_path, traced->err);
    if (records != NULL)
      memcpy(records, pool->trace, (size_t)dag->ntasks * sizeof *records);
    free(pool->trace);
  }
  pool->trace = NULL;
  return status;
}

/* Whether a class more urgent than `cls` has a run waiting. */
static bool urgent_waiting(const sched_pool *pool, int cls) {
  for (int c = 0; c < cls; c++)
    if (pool->run_waiting[c] > 0)
      return true;
  return false;
}

/* Waits for the pool's turn of a run of class `cls` (sched_run). */
static void take_pool(sched_pool *pool, int cls) {
  pthread_mutex_lock(&pool->run_mutex);
  uint64_t ticket = pool->run_ticket[cls]++;
  pool->run_waiting[cls]++;
  while (pool->run_busy || urgent_waiting(pool, cls) ||
         pool->run_serving[cls] != ticket)
    pthread_cond_wait(&pool->run_cond, &pool->run_mutex);
  pool->run_waiting[cls]--;
  pool->run_serving[cls]++;
  pool->run_busy = true;
  pthread_mutex_unlock(&pool->run_mutex);
}

static void give_pool(sched_pool *pool) {
  pthread_mutex_lock(&pool->run_mutex);
  pool->run_busy = false;
  pthread_cond_broadcast(&pool->run_cond);
  pthread_mutex_unlock(&pool->run_mutex);
}

remat_status sched_run(sched_pool *pool, sched_dag *dag,
                       const sched_run_opts *opts, char err[SCHED_ERRMSG_MAX]) {
  sched_trace_result local;
  sched_trace_result *traced = opts && opts->trace_result ? opts->trace_result
                                                          : &local;
  traced->status = REMAT_OK;
  traced->err[0] = '\0';
  remat_status status = check_run(pool, dag, err);
  if (status != REMAT_OK)
    return status;
  int cls = opts ? opts->priority_class : 0;
  if (cls < 0 || cls >= SCHED_NUM_CLASSES) {
    snprintf(err, SCHED_ERRMSG_MAX,
             "sched_run: priority class %d is not 0 to %d", cls,
             SCHED_NUM_CLASSES - 1);
    return REMAT_ERR_INVALID_ARG;
  }
  take_pool(pool, cls);
  atomic_store(&pool->error_status, 0);
  pool->context = opts ? opts->context : NULL;
  pool->progress = opts ? opts->progress : NULL;
  status = run_locked(pool, dag, opts ? opts->trace_path : NULL,
                      opts ? opts->records : NULL, traced,
                      opts ? opts->admit_bound : 0, err);
  give_pool(pool);
  if (traced == &local && local.status != REMAT_OK && status == REMAT_OK) {
    snprintf(err, SCHED_ERRMSG_MAX, "%s", local.err);
    status = local.status;
  }
  return status;
}
