/* Runs of finalized DAGs on a pool: a caller takes its class's run slot,
 * lets the workers in and waits until all tasks have finished. Runs of
 * different classes are in progress at once: a worker takes its tasks
 * from the most urgent live run that has one, and leaves a less urgent
 * run at the next task boundary when a more urgent one goes live. Within
 * one run, where a worker looks for its next task, in order:
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
  if (!atomic_compare_exchange_strong(&w->run->error_status, &none, status))
    return;
  w->run->error_task = task;
  sched_admit_open(w);
}

/* Runs the body of `task` unless an earlier task failed in this run (an
 * async task's body always runs). Returns whether the task has finished:
 * an async task whose body returned 0 finishes later, in sched_complete. */
static bool run_task(sched_worker *w, int32_t task) {
  sched_run_state *run = w->run;
  const sched_task *t = &w->dag->tasks[task];
  sched_trace_record *trace = run->trace;
  if (trace) {
    trace[task].worker = w->index;
    trace[task].start_ns = sched_now_ns();
  }
  int status = 0;
  if (t->async ||
      atomic_load_explicit(&run->error_status, memory_order_relaxed) == 0) {
    status = t->fn(run->context, t->arg, w->index);
    if (status != 0)
      record_error(w, task, status);
  }
  if (t->async && status == 0)
    return false;
  if (trace)
    trace[task].end_ns = sched_now_ns();
  w->mine->finished++;
  if (run->progress != NULL)
    atomic_fetch_add_explicit(
        &run->progress[w->index * SCHED_PROGRESS_STRIDE], 1,
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
  atomic_int *pending = w->run->pending;
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
  if (w->mine->root_next < w->mine->root_end)
    return sched_prio(dag, dag->roots[w->mine->root_next]);
  int32_t first = atomic_load_explicit(&w->run->root_cursor,
                                       memory_order_relaxed);
  return first < dag->nroots ? sched_prio(dag, dag->roots[first])
                             : INT32_MIN;
}

static int32_t find_task(sched_worker *w);

/* The continuation, or a waiting task that strictly outranks it. */
static int32_t continue_with(sched_worker *w, int32_t next) {
  int32_t p = sched_prio(w->dag, next);
  int32_t top = sched_heap_top_prio(sched_own_heap(w), w->dag);
  /* the root's priority only when the heap does not already decide */
  if (top <= p && sched_keeps_continuation(p, top, next_root_prio(w)))
    return next;
  sched_push_ready(w, next);
  return find_task(w);
}

/* The next root for this worker: from its claimed batch, else a new one. */
static int32_t next_root(sched_worker *w) {
  const sched_dag *dag = w->dag;
  sched_run_worker *mine = w->mine;
  if (mine->root_next < mine->root_end)
    return dag->roots[mine->root_next++];
  atomic_int *cursor = &w->run->root_cursor;
  int32_t n = dag->nroots;
  int32_t first = atomic_load_explicit(cursor, memory_order_relaxed);
  if (first >= n)
    return -1;
  int32_t batch = sched_root_batch(n, first, w->pool->nworkers);
  first = atomic_fetch_add_explicit(cursor, batch, memory_order_relaxed);
  if (first >= n)
    return -1;
  mine->root_next = first + 1;
  mine->root_end = first + batch < n ? first + batch : n;
  return dag->roots[first];
}

static int32_t steal(sched_worker *w) {
  sched_run_state *run = w->run;
  for (int i = 0; i < w->pool->nworkers - 1; i++) {
    sched_heap *victim = &run->workers[w->victims[i]].ready;
    if (sched_heap_size(victim) == 0)
      continue;
    int32_t task = sched_heap_pop(victim, w->dag, run->links);
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
  sched_run_state *run = w->run;
  sched_heap *own = sched_own_heap(w);
  int32_t task = -1;
  int32_t top = sched_heap_top_prio(own, w->dag);
  if (top != INT32_MIN && sched_heap_first(top, next_root_prio(w)))
    task = sched_heap_pop(own, w->dag, run->links);
  sched_queue *inbox = &run->inbox[w->node].queue;
  if (task < 0 && sched_queue_size(inbox) > 0)
    task = sched_queue_pop_head(inbox, run->links);
  if (task < 0)
    task = next_root(w);
  if (task < 0 && sched_heap_size(own) > 0)
    task = sched_heap_pop(own, w->dag, run->links);
  if (task < 0)
    task = steal(w);
  return task;
}

/* Adds `finished` tasks of this worker to the count of `run`, whose DAG
 * has `ntasks`; the worker that brings it to `ntasks` tells the run's
 * caller. Reads nothing of the run but its count (see leave_run). */
static void flush_finished(sched_pool *pool, sched_run_state *run,
                           int64_t finished, int32_t ntasks) {
  if (finished == 0)
    return;
  int64_t total = atomic_fetch_add(&run->finished, finished) + finished;
  if (total == ntasks) {
    pthread_mutex_lock(&pool->done_mutex);
    pthread_cond_broadcast(&pool->done_cond);
    pthread_mutex_unlock(&pool->done_mutex);
  }
}

/* Whether a run more urgent than w's current one is live. */
static bool urgent_live(const sched_worker *w) {
  unsigned live = atomic_load_explicit(&w->pool->live_mask,
                                       memory_order_relaxed);
  return (live & ((1u << w->run->cls) - 1)) != 0;
}

/* Runs `task` and its continuations; a task waiting for memory admission
 * (admit.c) ends the chain, and a release queues it later. So does a more
 * urgent run that went live: the continuation is queued and the worker
 * looks at the urgent run first. */
static void run_chain(sched_worker *w, int32_t task) {
  while (task >= 0) {
    if (w->dag->tasks[task].admit && !sched_admit(w, task))
      return;
    if (!run_task(w, task))
      return;
    task = release_successors(w, task);
    if (task >= 0 && urgent_live(w)) {
      sched_push_ready(w, task);
      return;
    }
    if (task >= 0)
      task = continue_with(w, task);
  }
}

/* Enters run c if it is live (the caller of a run that ends clears `live`,
 * then waits until no worker is inside: the seq_cst store of `inside`
 * before the load of `live` pairs with its store of `live` before its
 * loads of `inside`). */
static bool enter_run(sched_worker *w, sched_run_state *run) {
  sched_run_worker *mine = &run->workers[w->index];
  atomic_store(&mine->inside, 1);
  if (!atomic_load(&run->live)) {
    atomic_store(&mine->inside, 0);
    return false;
  }
  w->run = run;
  w->dag = run->dag;
  w->mine = mine;
  return true;
}

/* Leaves w's run: out first, then its finished tasks counted. The caller
 * of the run waits for the count before it waits for the workers to be
 * out, so this worker cannot be the one it waits for: were it the other
 * way round, the worker that finishes the run would wake the caller and
 * could lose its CPU to it before it is out, and the caller would yield
 * until the OS runs that worker again (milliseconds on a busy machine).
 * Once out, the worker reads only the run's count, which the caller does
 * not reset before the count is complete. */
static void leave_run(sched_worker *w) {
  sched_run_state *run = w->run;
  sched_run_worker *mine = w->mine;
  int64_t finished = mine->finished;
  int32_t ntasks = w->dag->ntasks;
  mine->finished = 0;
  w->run = NULL;
  w->dag = NULL;
  w->mine = NULL;
  atomic_store(&mine->inside, 0);
  flush_finished(w->pool, run, finished, ntasks);
}

/* Runs tasks of the most urgent live run that has one, staying in it
 * while no more urgent run is live. Returns whether it ran any. */
static bool work_once(sched_worker *w) {
  sched_pool *pool = w->pool;
  unsigned live = atomic_load(&pool->live_mask);
  for (int c = 0; c < SCHED_NUM_CLASSES; c++) {
    if (!(live & (1u << c)) || !enter_run(w, &pool->runs[c]))
      continue;
    bool ran = false;
    for (;;) {
      int32_t task = find_task(w);
      if (task < 0)
        break;
      ran = true;
      run_chain(w, task);
      if (urgent_live(w))
        break;
    }
    leave_run(w);
    if (ran)
      return true;
  }
  return false;
}

void sched_worker_loop(sched_worker *w) {
  sched_pool *pool = w->pool;
  while (!atomic_load(&pool->shutdown)) {
    bool ran = false;
    for (int i = 0; !ran && i < SPIN_PAUSES + SPIN_YIELDS; i++) {
      ran = work_once(w);
      if (ran || atomic_load(&pool->shutdown))
        break;
      if (i < SPIN_PAUSES)
        SCHED_CPU_RELAX();
      else
        sched_yield();
    }
    if (!ran && !atomic_load(&pool->shutdown))
      sched_sleep_until_work(w);
  }
}

/* ---- asynchronous completion ---- */

/* The live run of `dag` (under run_mutex: its slot is taken). */
static sched_run_state *run_of(sched_pool *pool, const sched_dag *dag) {
  sched_run_state *found = NULL;
  pthread_mutex_lock(&pool->run_mutex);
  for (int c = 0; c < SCHED_NUM_CLASSES; c++)
    if (pool->run_busy[c] && pool->runs[c].dag == dag)
      found = &pool->runs[c];
  pthread_mutex_unlock(&pool->run_mutex);
  return found;
}

void sched_complete(sched_pool *pool, const sched_dag *dag, int32_t task) {
  sched_run_state *run = run_of(pool, dag);
  if (run == NULL)
    return;
  const sched_task *t = &dag->tasks[task];
  if (run->trace)
    run->trace[task].end_ns = sched_now_ns();
  if (run->progress != NULL)
    atomic_fetch_add_explicit(&run->progress[0], 1, memory_order_relaxed);
  for (int32_t e = t->succ_begin; e < t->succ_end; e++) {
    int32_t s = dag->succ[e];
    if (!last_predecessor(&dag->tasks[s], &run->pending[s]))
      continue;
    int node = dag->tasks[s].numa_node < 0 ? 0 : dag->tasks[s].numa_node;
    sched_queue_push(&run->inbox[node].queue, run->links, s);
    sched_wake_node(pool, node);
  }
  if (atomic_fetch_add(&run->finished, 1) + 1 == dag->ntasks) {
    pthread_mutex_lock(&pool->done_mutex);
    pthread_cond_broadcast(&pool->done_cond);
    pthread_mutex_unlock(&pool->done_mutex);
  }
}

int sched_run_failure(sched_pool *pool, const sched_dag *dag) {
  sched_run_state *run = run_of(pool, dag);
  return run == NULL ? 0 : atomic_load(&run->error_status);
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

/* Per-task arrays for a DAG bigger than any run before in this slot. */
static remat_status ensure_capacity(sched_run_state *run, int32_t ntasks,
                                    char err[SCHED_ERRMSG_MAX]) {
  if (ntasks <= run->capacity)
    return REMAT_OK;
  free(run->pending);
  free(run->links.next);
  free(run->links.prev);
  run->pending = remat__malloc((size_t)ntasks * sizeof *run->pending);
  run->pending_serial = 0;
  run->links.next = remat__malloc((size_t)ntasks * sizeof(int32_t));
  run->links.prev = remat__malloc((size_t)ntasks * sizeof(int32_t));
  run->capacity = ntasks;
  if (run->pending && run->links.next && run->links.prev)
    return REMAT_OK;
  run->capacity = 0;
  snprintf(err, SCHED_ERRMSG_MAX, "sched_run: out of memory for %d tasks",
           (int)ntasks);
  return REMAT_ERR_OUT_OF_MEMORY;
}

/* Dependency counters: each run leaves them as it found them (see
 * last_predecessor), so they are set only when this DAG was not the last
 * one run in this slot. */
static void reset_counters(sched_run_state *run, const sched_dag *dag) {
  if (run->pending_serial == dag->serial)
    return;
  for (int32_t t = 0; t < dag->ntasks; t++)
    atomic_store_explicit(&run->pending[t], dag->tasks[t].npred,
                          memory_order_relaxed);
  run->pending_serial = dag->serial;
}

static void prepare_run(sched_pool *pool, sched_run_state *run,
                        const sched_dag *dag) {
  reset_counters(run, dag);
  atomic_store(&run->root_cursor, 0);
  atomic_store(&run->finished, 0);
  atomic_store(&run->nroots, dag->nroots);
  run->error_task = -1;
  for (int i = 0; i < pool->nworkers; i++) {
    run->workers[i].root_next = run->workers[i].root_end = 0;
    run->workers[i].finished = 0;
  }
  for (int32_t i = 0; i < dag->naffine_roots; i++) {
    int32_t t = dag->roots[dag->nroots + i];
    sched_queue_push(&run->inbox[dag->tasks[t].numa_node].queue, run->links,
                     t);
  }
}

/* Lets the workers into the prepared run, waits until all its tasks have
 * finished, then closes it and waits until no worker is inside. */
static void execute(sched_pool *pool, sched_run_state *run,
                    const sched_dag *dag) {
  atomic_store(&run->live, true);
  atomic_fetch_or(&pool->live_mask, 1u << run->cls);
  sched_wake_all(pool);
  pthread_mutex_lock(&pool->done_mutex);
  while (atomic_load(&run->finished) != dag->ntasks)
    pthread_cond_wait(&pool->done_cond, &pool->done_mutex);
  pthread_mutex_unlock(&pool->done_mutex);
  atomic_fetch_and(&pool->live_mask, ~(1u << run->cls));
  atomic_store(&run->live, false);
  for (int i = 0; i < pool->nworkers; i++)
    while (atomic_load(&run->workers[i].inside))
      sched_yield();
}

static remat_status run_locked(sched_pool *pool, sched_run_state *run,
                               const sched_dag *dag,
                               const char *trace_path,
                               sched_trace_record *records,
                               sched_trace_result *traced,
                               int64_t admit_bound,
                               char err[SCHED_ERRMSG_MAX]) {
  remat_status status = ensure_capacity(run, dag->ntasks, err);
  if (status != REMAT_OK)
    return status;
  if (!sched_admit_prepare(run, dag, admit_bound)) {
    snprintf(err, SCHED_ERRMSG_MAX,
             "sched_run: out of memory for the admission of %d tasks",
             (int)dag->nadmit);
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  if (records != NULL && !trace_path) {
    run->trace = records;
    run->trace_origin_ns = sched_now_ns();
  } else if (trace_path) {
    run->trace = remat__calloc(dag->ntasks ? (size_t)dag->ntasks : 1,
                               sizeof *run->trace);
    if (!run->trace) {
      snprintf(err, SCHED_ERRMSG_MAX, "sched_run: out of memory for a trace");
      return REMAT_ERR_OUT_OF_MEMORY;
    }
    run->trace_origin_ns = sched_now_ns();
  }
  if (dag->ntasks > 0) {
    prepare_run(pool, run, dag);
    execute(pool, run, dag);
  }
  int failed = atomic_load(&run->error_status);
  if (failed != 0) {
    const char *name = dag->info[run->error_task].name;
    snprintf(err, SCHED_ERRMSG_MAX, "task %d '%s' failed with status %d",
             (int)run->error_task, name ? name : "", failed);
    status = (remat_status)failed;
  }
  if (trace_path) {
    traced->status = sched_trace_write(pool, run, dag, trace_path, traced->err);
    if (records != NULL)
      memcpy(records, run->trace, (size_t)dag->ntasks * sizeof *records);
    free(run->trace);
  }
  run->trace = NULL;
  return status;
}

/* Whether `dag` is in a run now (under run_mutex). */
static bool dag_busy(const sched_pool *pool, const sched_dag *dag) {
  for (int c = 0; c < SCHED_NUM_CLASSES; c++)
    if (pool->run_busy[c] && pool->runs[c].dag == dag)
      return true;
  return false;
}

/* Waits for the slot of class `cls` (sched_run): the callers of a class
 * take it in the order they came, and a DAG runs once at a time. */
static sched_run_state *take_slot(sched_pool *pool, const sched_dag *dag,
                                  int cls) {
  pthread_mutex_lock(&pool->run_mutex);
  uint64_t ticket = pool->run_ticket[cls]++;
  pool->run_waiting[cls]++;
  while (pool->run_busy[cls] || pool->run_serving[cls] != ticket ||
         dag_busy(pool, dag))
    pthread_cond_wait(&pool->run_cond, &pool->run_mutex);
  pool->run_waiting[cls]--;
  pool->run_serving[cls]++;
  pool->run_busy[cls] = true;
  pool->runs[cls].dag = dag;
  pthread_mutex_unlock(&pool->run_mutex);
  return &pool->runs[cls];
}

static void give_slot(sched_pool *pool, int cls) {
  pthread_mutex_lock(&pool->run_mutex);
  pool->run_busy[cls] = false;
  pool->runs[cls].dag = NULL;
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
  sched_run_state *run = take_slot(pool, dag, cls);
  atomic_store(&run->error_status, 0);
  run->context = opts ? opts->context : NULL;
  run->progress = opts ? opts->progress : NULL;
  status = run_locked(pool, run, dag, opts ? opts->trace_path : NULL,
                      opts ? opts->records : NULL, traced,
                      opts ? opts->admit_bound : 0, err);
  give_slot(pool, cls);
  if (traced == &local && local.status != REMAT_OK && status == REMAT_OK) {
    snprintf(err, SCHED_ERRMSG_MAX, "%s", local.err);
    status = local.status;
  }
  return status;
}
