/* The worker pool: starting, binding and stopping the worker threads
 * (park.c holds how idle workers sleep and wake). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "sched/sched_internal.h"

static void worker_start(sched_worker *w) {
  sched_pool *pool = w->pool;
  /* Tasks call oneDNN primitives, which run on OpenMP: with one OpenMP
   * thread per worker each primitive runs single-threaded on this worker's
   * core. Parallelism is the scheduler's, and nothing is oversubscribed. */
  omp_set_num_threads(1);
  /* Binding errors are ignored: placement still groups workers by node,
   * and synthetic topologies bind nothing. */
  if (pool->bind != SCHED_BIND_NONE)
    (void)hwloc_set_cpubind(pool->topo, pool->place.cpuset[w->index],
                            HWLOC_CPUBIND_THREAD);
  pthread_mutex_lock(&pool->done_mutex);
  pool->started++;
  pthread_cond_broadcast(&pool->done_cond);
  pthread_mutex_unlock(&pool->done_mutex);
}

static void *worker_main(void *arg) {
  sched_worker *w = arg;
  worker_start(w);
  sched_worker_loop(w);
  return NULL;
}

static void *aligned_calloc(size_t count, size_t size) {
  size_t bytes = count * size;
  bytes = (bytes + SCHED_CACHE_LINE - 1) / SCHED_CACHE_LINE * SCHED_CACHE_LINE;
  void *p = remat__aligned_alloc(SCHED_CACHE_LINE, bytes ? bytes : SCHED_CACHE_LINE);
  if (p)
    memset(p, 0, bytes);
  return p;
}

static void init_shared(sched_pool *pool) {
  atomic_init(&pool->live_mask, 0);
  atomic_init(&pool->shutdown, false);
  pthread_mutex_init(&pool->done_mutex, NULL);
  pthread_cond_init(&pool->done_cond, NULL);
  pthread_mutex_init(&pool->run_mutex, NULL);
  pthread_cond_init(&pool->run_cond, NULL);
}

static void init_nodes(sched_pool *pool) {
  for (int n = 0; n < pool->place.nnodes; n++) {
    pthread_mutex_init(&pool->nodes[n].mutex, NULL);
    pthread_cond_init(&pool->nodes[n].cond, NULL);
    atomic_init(&pool->nodes[n].sleepers, 0);
  }
}

/* The runs' per-worker and per-node parts (one run per class). */
static remat_status init_runs(sched_pool *pool) {
  for (int c = 0; c < SCHED_NUM_CLASSES; c++) {
    sched_run_state *run = &pool->runs[c];
    run->cls = c;
    atomic_init(&run->nroots, 0);
    atomic_init(&run->live, false);
    atomic_init(&run->error_status, 0);
    atomic_init(&run->admit_lock, 0);
    atomic_init(&run->root_cursor, 0);
    atomic_init(&run->finished, 0);
    run->workers = aligned_calloc((size_t)pool->nworkers, sizeof *run->workers);
    run->inbox =
        aligned_calloc((size_t)pool->place.nnodes, sizeof *run->inbox);
    if (!run->workers || !run->inbox)
      return REMAT_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < pool->nworkers; i++) {
      sched_heap_init(&run->workers[i].ready);
      atomic_init(&run->workers[i].inside, 0);
    }
    for (int n = 0; n < pool->place.nnodes; n++)
      sched_queue_init(&run->inbox[n].queue);
  }
  return REMAT_OK;
}

static remat_status init_workers(sched_pool *pool) {
  for (int i = 0; i < pool->nworkers; i++) {
    sched_worker *w = &pool->workers[i];
    w->pool = pool;
    w->index = i;
    w->node = pool->place.worker_node[i];
    w->victims = remat__malloc((size_t)(pool->nworkers > 1 ? pool->nworkers - 1 : 1) *
                        sizeof(int));
    if (!w->victims)
      return REMAT_ERR_OUT_OF_MEMORY;
    sched_steal_order(&pool->place, i, w->victims);
  }
  return REMAT_OK;
}

/* Stops and joins the first `nstarted` workers, then frees everything. */
static void teardown(sched_pool *pool, int nstarted) {
  atomic_store(&pool->shutdown, true);
  if (pool->nodes)
    sched_wake_all(pool);
  for (int i = 0; i < nstarted; i++)
    pthread_join(pool->workers[i].thread, NULL);
  for (int i = 0; pool->workers && i < pool->nworkers; i++)
    free(pool->workers[i].victims);
  if (pool->nodes)
    for (int n = 0; n < pool->place.nnodes; n++) {
      pthread_mutex_destroy(&pool->nodes[n].mutex);
      pthread_cond_destroy(&pool->nodes[n].cond);
    }
  pthread_mutex_destroy(&pool->done_mutex);
  pthread_cond_destroy(&pool->done_cond);
  pthread_mutex_destroy(&pool->run_mutex);
  pthread_cond_destroy(&pool->run_cond);
  free(pool->workers);
  free(pool->nodes);
  for (int c = 0; c < SCHED_NUM_CLASSES; c++) {
    sched_run_state *run = &pool->runs[c];
    free(run->workers);
    free(run->inbox);
    free(run->pending);
    free(run->links.next);
    free(run->links.prev);
    free(run->admit_state);
  }
  sched_placement_free(&pool->place);
  free(pool);
}

static remat_status start_threads(sched_pool *pool,
                                  char err[SCHED_ERRMSG_MAX]) {
  for (int i = 0; i < pool->nworkers; i++) {
    int rc = pthread_create(&pool->workers[i].thread, NULL, worker_main,
                            &pool->workers[i]);
    if (rc != 0) {
      snprintf(err, SCHED_ERRMSG_MAX, "cannot start worker %d of %d: %s", i,
               pool->nworkers, strerror(rc));
      teardown(pool, i);
      return REMAT_ERR_BACKEND;
    }
  }
  /* Workers bind with the caller's topology: wait until all have. */
  pthread_mutex_lock(&pool->done_mutex);
  while (pool->started < pool->nworkers)
    pthread_cond_wait(&pool->done_cond, &pool->done_mutex);
  pthread_mutex_unlock(&pool->done_mutex);
  pool->topo = NULL;
  return REMAT_OK;
}

remat_status sched_pool_create(hwloc_topology_t topo, int nthreads,
                               sched_bind bind, sched_pool **out,
                               char err[SCHED_ERRMSG_MAX]) {
  if (!out) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_pool_create: out is NULL");
    return REMAT_ERR_INVALID_ARG;
  }
  *out = NULL;
  sched_pool *pool = aligned_calloc(1, sizeof *pool);
  if (!pool) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_pool_create: out of memory");
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  remat_status status =
      sched_place_workers(topo, nthreads, bind, &pool->place, err);
  if (status != REMAT_OK) {
    free(pool);
    return status;
  }
  init_shared(pool);
  pool->nworkers = nthreads;
  pool->bind = bind;
  pool->topo = topo;
  pool->workers = aligned_calloc((size_t)nthreads, sizeof *pool->workers);
  pool->nodes = aligned_calloc((size_t)pool->place.nnodes, sizeof *pool->nodes);
  if (pool->nodes)
    init_nodes(pool);
  if (!pool->workers || !pool->nodes || init_workers(pool) != REMAT_OK ||
      init_runs(pool) != REMAT_OK) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_pool_create: out of memory");
    teardown(pool, 0);
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  status = start_threads(pool, err);
  if (status == REMAT_OK)
    *out = pool;
  return status;
}

void sched_pool_destroy(sched_pool *pool) {
  if (!pool)
    return;
  /* Runs in progress finish first. */
  pthread_mutex_lock(&pool->run_mutex);
  for (int c = 0; c < SCHED_NUM_CLASSES; c++)
    while (pool->run_busy[c])
      pthread_cond_wait(&pool->run_cond, &pool->run_mutex);
  pthread_mutex_unlock(&pool->run_mutex);
  teardown(pool, pool->nworkers);
}

int sched_pool_num_workers(const sched_pool *pool) {
  return pool ? pool->nworkers : 0;
}

const sched_placement *sched_pool_placement(const sched_pool *pool) {
  return pool ? &pool->place : NULL;
}
