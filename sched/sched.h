/* The task scheduler: a pool of pinned worker threads that runs a prebuilt
 * dependency DAG of tasks many times, with work stealing, priorities and
 * NUMA affinity. It knows nothing of ops: a task is a function and an arg. */
#ifndef REMAT_SCHED_H
#define REMAT_SCHED_H

#include <hwloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "remat.h"

/* Limits: exceeding one is an error (REMAT_ERR_LIMIT), never a crash. */
#define SCHED_MAX_THREADS 1024
#define SCHED_MAX_TASKS (1 << 26)
#define SCHED_MAX_EDGES (1 << 28)
#define SCHED_ERRMSG_MAX 256

typedef enum sched_bind {
  SCHED_BIND_CORE = 0, /* each worker on one core */
  SCHED_BIND_NUMA = 1, /* each worker on all cores of its NUMA node */
  SCHED_BIND_NONE = 2  /* no binding; workers still grouped by node */
} sched_bind;

/* A task body. `context` is the run's (sched_run_opts.context: the same for
 * every task of a run, so that a DAG built once can run on state that it
 * does not point to), `arg` the task's own (sched_dag_add), `worker` the
 * index of the worker running it. A non-zero return is a remat_status: the
 * run records the first one, skips the bodies of the tasks that remain
 * (their successors are still released) and returns it. */
typedef int (*sched_task_fn)(void *context, void *arg, int worker);

/* Where workers go: computed from a topology, with no binding done, so that
 * synthetic topologies can test it on any machine. */
typedef struct sched_placement {
  int nworkers;
  int nnodes;          /* NUMA nodes that hold at least one worker */
  int *worker_node;    /* [nworkers] node index in 0..nnodes-1 */
  hwloc_bitmap_t *cpuset; /* [nworkers] cpuset to bind to (owned) */
  int *node_first;     /* [nnodes+1] workers of node n are node_first[n].. */
} sched_placement;

/* Fills `out`: workers spread over NUMA nodes in proportion to their cores,
 * grouped so that workers of a node have consecutive indices. */
remat_status sched_place_workers(hwloc_topology_t topo, int nthreads,
                                 sched_bind bind, sched_placement *out,
                                 char err[SCHED_ERRMSG_MAX]);
void sched_placement_free(sched_placement *p);

/* Victims a worker tries to steal from, nearest first: the other workers of
 * its own node, then those of the other nodes. `victims` holds nworkers-1. */
void sched_steal_order(const sched_placement *p, int worker, int *victims);

/* Physical cores that the topology reports (at least 1). */
int sched_physical_cores(hwloc_topology_t topo);

/* ---- DAG ---- */
typedef struct sched_dag sched_dag;

remat_status sched_dag_create(sched_dag **out, char err[SCHED_ERRMSG_MAX]);
void sched_dag_destroy(sched_dag *dag);

/* Adds a task; returns its id (>= 0) or a negative remat_status. `name` and
 * `category` are kept as pointers (they must outlive the DAG) and appear in
 * traces. Higher `priority` runs first among ready tasks. `numa_node` is -1
 * (anywhere) or a node index of the pool's placement. */
int32_t sched_dag_add(sched_dag *dag, sched_task_fn fn, void *arg,
                      int32_t priority, int numa_node, const char *name,
                      const char *category);
/* Makes `task` complete asynchronously: its body starts an operation and
 * returns 0, and the task finishes (its successors are released) only when
 * some thread calls sched_complete on it; a non-zero return is an error and
 * finishes it at once. Its body runs even after another task of the run
 * failed (so that it can tell the peers of a collective operation). */
remat_status sched_dag_set_async(sched_dag *dag, int32_t task);
/* Makes `task` an admitted one (memory admission): in a run with a bound
 * (sched_run_opts.admit_bound > 0), once ready it starts only when the
 * bytes admitted and not yet released (sched_release) plus `bytes` stay
 * within the bound, and only after every admitted task set before it
 * (the order of these calls is its rank) was admitted. Until then it
 * waits aside, taking no worker. In a run without a bound it is an
 * ordinary task. Progress is the caller's promise: the rank order must be
 * a topological order of the admitted tasks, and once every task of rank
 * below r was admitted and every task that needs no more admission has
 * run, the bytes still held plus rank r's must fit the bound (the runtime
 * keeps it by program order: see docs/architecture.md). A task that failed
 * opens admission for the rest of the run (skipped bodies allocate
 * nothing). */
remat_status sched_dag_set_admit(sched_dag *dag, int32_t task, int64_t bytes);
/* `to` runs only after `from` has finished. */
remat_status sched_dag_edge(sched_dag *dag, int32_t from, int32_t to);
/* Freezes the DAG: builds successor arrays and refuses a cycle with a
 * message naming a task on it. Required before sched_run; no tasks or edges
 * may be added afterwards. */
remat_status sched_dag_finalize(sched_dag *dag, char err[SCHED_ERRMSG_MAX]);
int32_t sched_dag_num_tasks(const sched_dag *dag);

/* ---- worker pool ---- */
typedef struct sched_pool sched_pool;

/* Starts the workers. Each worker calls omp_set_num_threads(1) once and is
 * bound according to `bind` (binding failures are ignored: placement still
 * groups workers by node). On a topology that is not this machine's
 * (synthetic or XML) hwloc binds nothing, whatever `bind` says. */
remat_status sched_pool_create(hwloc_topology_t topo, int nthreads,
                               sched_bind bind, sched_pool **out,
                               char err[SCHED_ERRMSG_MAX]);
void sched_pool_destroy(sched_pool *pool);
int sched_pool_num_workers(const sched_pool *pool);
const sched_placement *sched_pool_placement(const sched_pool *pool);

/* How writing a run's trace went: REMAT_OK (with an empty message) when it
 * was written or none was asked for. */
typedef struct sched_trace_result {
  remat_status status;
  char err[SCHED_ERRMSG_MAX];
} sched_trace_result;

/* Where and when one task ran (times from sched_now_ns, CLOCK_MONOTONIC). */
typedef struct sched_trace_record {
  int32_t worker;
  int64_t start_ns;
  int64_t end_ns;
} sched_trace_record;

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t sched_now_ns(void);

/* Per-run options. */
typedef struct sched_run_opts {
  const char *trace_path; /* NULL: no trace; else Chrome trace-event JSON */
  /* NULL, or the caller's array of one record per task, which the run
   * fills (for a caller that writes its own trace); with trace_path NULL
   * nothing is allocated or written for it. */
  sched_trace_record *records;
  /* Where the outcome of writing the trace goes, apart from the run's
   * status: the trace is written after the tasks, whose effects are done by
   * then, so a trace that cannot be written must not turn a run that
   * succeeded into a failure. NULL: a trace write failure becomes the run's
   * status when the tasks succeeded. */
  sched_trace_result *trace_result;
  /* Passed to every task body of the run (NULL when opts is NULL). */
  void *context;
  /* Memory admission (sched_dag_set_admit): the bytes that the admitted
   * tasks of the run may hold at once; 0: no admission. */
  int64_t admit_bound;
  /* NULL, or the caller's per-worker counters of the run's finished
   * tasks, at progress[worker * SCHED_PROGRESS_STRIDE] (a cache line
   * each), zeroed by the caller: each task's end adds 1 to its worker's
   * (relaxed; an async task finished by sched_complete counts at worker
   * 0), so that another thread may read how far the run is. */
  _Atomic int64_t *progress;
  /* Runs of different classes go on at once on the pool's workers, which
   * take a ready task of the most urgent class first at every task
   * boundary; runs of one class wait, first come first served (0 ..
   * SCHED_NUM_CLASSES - 1; 0 is the most urgent). */
  int priority_class;
} sched_run_opts;

#define SCHED_NUM_CLASSES 3

#define SCHED_PROGRESS_STRIDE 8

/* Runs every task of a finalized DAG once, respecting edges; returns when
 * all have finished. Runs of different classes (opts' priority_class) go
 * on at once on the pool's workers; a caller waits while a run of its own
 * class, or one of the same DAG, is in progress or one of its class came
 * first. Allocates nothing unless tracing. The trace, when asked for, is
 * written whatever the tasks returned. */
remat_status sched_run(sched_pool *pool, sched_dag *dag,
                       const sched_run_opts *opts, char err[SCHED_ERRMSG_MAX]);

/* Finishes an asynchronous task of the run of `dag` in progress on `pool`
 * (any thread may call it, once per run per async task, after its body
 * returned 0): its ready successors go to the affinity inbox of their node
 * (node 0 for those without one) and a sleeping worker there is woken. */
void sched_complete(sched_pool *pool, const sched_dag *dag, int32_t task);

/* Gives back `bytes` that an admitted task of the run that `worker` is
 * running on `pool` held (a task body calls it after freeing them, with its
 * `worker`): tasks waiting for admission that now fit are admitted, in
 * rank order, onto that worker's ready heap. A no-op in a run without a
 * bound. */
void sched_release(sched_pool *pool, int worker, int64_t bytes);

/* The first failure of the run of `dag` in progress on `pool` (0 when
 * none, or when `dag` is not running): an async task's body reads it. */
int sched_run_failure(sched_pool *pool, const sched_dag *dag);

#endif
