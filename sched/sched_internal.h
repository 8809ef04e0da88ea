/* Internals shared by the scheduler's files: the DAG's frozen arrays, the
 * per-worker and per-node structures of a pool, and the spinlock-guarded
 * task queues they run on. Nothing here is part of the contract in sched.h;
 * tests may use sched_dag_set_limits to reach the limits cheaply. */
#ifndef REMAT_SCHED_INTERNAL_H
#define REMAT_SCHED_INTERNAL_H

#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "sched/sched.h"
#include "sched/sched_pick.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SCHED_CPU_RELAX() _mm_pause()
#else
#define SCHED_CPU_RELAX() ((void)0)
#endif

#define SCHED_CACHE_LINE 64

/* ---- DAG (dag.c) ---- */

/* What a run reads of a task: 32 bytes, two to a cache line. */
typedef struct sched_task {
  sched_task_fn fn;
  void *arg;
  int32_t succ_begin; /* successors are succ[succ_begin..succ_end) */
  int32_t succ_end;
  int32_t npred;     /* predecessors */
  int16_t numa_node; /* -1: anywhere */
  uint8_t async;     /* finished by sched_complete, not by its body */
  uint8_t admit;     /* waits for memory admission (admit.c) */
} sched_task;

/* What only finalize and traces read. */
typedef struct sched_task_info {
  const char *name;     /* may be NULL */
  const char *category; /* may be NULL */
  int32_t priority;
  int32_t admit_rank;   /* -1, or its place in the admission order */
} sched_task_info;

struct sched_dag {
  sched_task *tasks;     /* [ntasks] */
  sched_task_info *info; /* [ntasks] */
  int32_t ntasks, task_cap, max_tasks;
  int32_t *edge_from, *edge_to; /* freed at finalize */
  int64_t nedges, edge_cap, max_edges;
  bool finalized;
  /* Frozen at finalize. */
  uint64_t serial;       /* unique per finalized DAG (pools cache counters) */
  int32_t *succ;         /* [nedges] each list highest priority first */
  int32_t *roots;        /* [nroots + naffine_roots] highest priority first */
  int32_t nroots;        /* roots with no affinity: roots[0..nroots) */
  int32_t naffine_roots; /* roots with a NUMA node follow them */
  int32_t max_node;      /* highest numa_node of any task, -1 if none */
  int32_t max_node_task; /* a task that has max_node */
  /* Memory admission: per rank, the task and the bytes it takes. */
  int32_t *admit_task;
  int64_t *admit_bytes;
  int32_t nadmit, admit_cap;
};

/* Lowers the limits of one DAG (tests reach them without 2^26 tasks). */
void sched_dag_set_limits(sched_dag *dag, int32_t max_tasks, int64_t max_edges);

/* ---- queues ---- */

/* A queue of task ids threaded through per-task link arrays (each task sits
 * in at most one queue at a time, and in at most one per run), guarded by a
 * test-and-test-and-set spinlock. The owner pushes and pops at the tail
 * (LIFO); thieves and inbox readers take from the head (FIFO). `size` can be
 * read without the lock to skip empty queues; it is stored seq_cst so that a
 * pusher's later check of a sleeper count pairs Dekker-style with a
 * sleeper's check of the sizes (see pool.c). */
typedef struct sched_queue {
  atomic_int lock;
  int32_t head; /* oldest task, -1 if empty */
  int32_t tail; /* newest task, -1 if empty */
  atomic_int size;
} sched_queue;

typedef struct sched_links {
  int32_t *next; /* toward the tail */
  int32_t *prev; /* toward the head */
} sched_links;

static inline void sched_spin_lock(atomic_int *lock) {
  for (unsigned spins = 0;; spins++) {
    if (!atomic_exchange_explicit(lock, 1, memory_order_acquire))
      return;
    while (atomic_load_explicit(lock, memory_order_relaxed)) {
      SCHED_CPU_RELAX();
      /* A preempted holder (more workers than cores) must get to run. */
      if (++spins % 256 == 0)
        sched_yield();
    }
  }
}

static inline void sched_spin_unlock(atomic_int *lock) {
  atomic_store_explicit(lock, 0, memory_order_release);
}

static inline void sched_queue_init(sched_queue *q) {
  atomic_init(&q->lock, 0);
  q->head = q->tail = -1;
  atomic_init(&q->size, 0);
}

static inline int sched_queue_size(sched_queue *q) {
  return atomic_load_explicit(&q->size, memory_order_relaxed);
}

static inline void sched_queue_set_size(sched_queue *q, int delta,
                                        memory_order order) {
  int size = atomic_load_explicit(&q->size, memory_order_relaxed);
  atomic_store_explicit(&q->size, size + delta, order);
}

static inline void sched_queue_push(sched_queue *q, sched_links links,
                                    int32_t task) {
  sched_spin_lock(&q->lock);
  links.next[task] = -1;
  links.prev[task] = q->tail;
  if (q->tail >= 0)
    links.next[q->tail] = task;
  else
    q->head = task;
  q->tail = task;
  sched_queue_set_size(q, 1, memory_order_seq_cst);
  sched_spin_unlock(&q->lock);
}

static inline int32_t sched_queue_pop_tail(sched_queue *q, sched_links links) {
  sched_spin_lock(&q->lock);
  int32_t task = q->tail;
  if (task >= 0) {
    q->tail = links.prev[task];
    if (q->tail >= 0)
      links.next[q->tail] = -1;
    else
      q->head = -1;
    sched_queue_set_size(q, -1, memory_order_relaxed);
  }
  sched_spin_unlock(&q->lock);
  return task;
}

static inline int32_t sched_queue_pop_head(sched_queue *q, sched_links links) {
  sched_spin_lock(&q->lock);
  int32_t task = q->head;
  if (task >= 0) {
    q->head = links.next[task];
    if (q->head >= 0)
      links.prev[q->head] = -1;
    else
      q->tail = -1;
    sched_queue_set_size(q, -1, memory_order_relaxed);
  }
  sched_spin_unlock(&q->lock);
  return task;
}

/* A worker's ready tasks as a pairing heap threaded through the same link
 * arrays (next: sibling, prev: first child), highest priority on top, under
 * the same kind of spinlock. The owner pops the top; so do thieves. */
typedef struct sched_heap {
  atomic_int lock;
  int32_t root; /* -1 if empty */
  atomic_int size;
} sched_heap;

static inline void sched_heap_init(sched_heap *h) {
  atomic_init(&h->lock, 0);
  h->root = -1;
  atomic_init(&h->size, 0);
}

static inline int sched_heap_size(sched_heap *h) {
  return atomic_load_explicit(&h->size, memory_order_relaxed);
}

static inline int32_t sched_prio(const sched_dag *dag, int32_t task) {
  return dag->info[task].priority;
}

/* Melds two heaps; ties keep `a` on top (the older task). */
static inline int32_t sched_heap_meld(const sched_dag *dag, sched_links l,
                                      int32_t a, int32_t b) {
  if (a < 0)
    return b;
  if (b < 0)
    return a;
  if (sched_prio(dag, b) > sched_prio(dag, a)) {
    int32_t t = a;
    a = b;
    b = t;
  }
  l.next[b] = l.prev[a];
  l.prev[a] = b;
  return a;
}

static inline void sched_heap_push(sched_heap *h, const sched_dag *dag,
                                   sched_links l, int32_t task) {
  sched_spin_lock(&h->lock);
  l.next[task] = -1;
  l.prev[task] = -1;
  h->root = sched_heap_meld(dag, l, h->root, task);
  int size = atomic_load_explicit(&h->size, memory_order_relaxed);
  atomic_store_explicit(&h->size, size + 1, memory_order_seq_cst);
  sched_spin_unlock(&h->lock);
}

/* Priority of the top task, or INT32_MIN when empty (read under no lock:
 * a hint that may be stale). */
static inline int32_t sched_heap_top_prio(sched_heap *h, const sched_dag *dag) {
  if (sched_heap_size(h) == 0)
    return INT32_MIN;
  sched_spin_lock(&h->lock);
  int32_t top = h->root >= 0 ? sched_prio(dag, h->root) : INT32_MIN;
  sched_spin_unlock(&h->lock);
  return top;
}

/* Removes the top: pairs its children left to right, then melds the pairs
 * right to left (the two passes of a pairing heap). */
static inline int32_t sched_heap_pop(sched_heap *h, const sched_dag *dag,
                                     sched_links l) {
  sched_spin_lock(&h->lock);
  int32_t top = h->root;
  if (top >= 0) {
    int32_t stack = -1;
    for (int32_t a = l.prev[top]; a >= 0;) {
      int32_t b = l.next[a], rest = b >= 0 ? l.next[b] : -1;
      l.next[a] = -1;
      if (b >= 0)
        l.next[b] = -1;
      int32_t m = sched_heap_meld(dag, l, a, b);
      l.next[m] = stack;
      stack = m;
      a = rest;
    }
    int32_t root = -1;
    while (stack >= 0) {
      int32_t s = stack;
      stack = l.next[s];
      l.next[s] = -1;
      root = sched_heap_meld(dag, l, root, s);
    }
    h->root = root;
    int size = atomic_load_explicit(&h->size, memory_order_relaxed);
    atomic_store_explicit(&h->size, size - 1, memory_order_relaxed);
  }
  sched_spin_unlock(&h->lock);
  return top;
}

/* ---- pool (pool.c, run.c, admit.c) ---- */

/* Where an admitted task's rank is in a run (sched_run_state.admit_state). */
typedef enum sched_admit_state {
  ADMIT_NOT_READY = 0, /* not picked yet */
  ADMIT_WAITING = 1,   /* ready, waiting for its turn or for bytes */
  ADMIT_ADMITTED = 2   /* its bytes are counted; it may run */
} sched_admit_state;

struct sched_pool;

/* A worker's part of one run: its ready heap (the first cache line, which
 * thieves touch), the roots it claimed, the tasks it finished and not yet
 * counted, and whether it is inside the run now (the caller waits for
 * every worker to be out before the run's state is reused). */
typedef struct sched_run_worker {
  alignas(SCHED_CACHE_LINE) sched_heap ready;
  alignas(SCHED_CACHE_LINE) int32_t root_next; /* roots claimed, not yet */
  int32_t root_end; /* started: dag->roots[root_next..root_end) */
  int64_t finished; /* tasks finished, not yet added to the run's */
  atomic_int inside;
} sched_run_worker;

/* A node's affinity inbox in one run. */
typedef struct sched_run_inbox {
  alignas(SCHED_CACHE_LINE) sched_queue queue;
} sched_run_inbox;

/* One run in progress: everything of a run that tasks, workers and the
 * caller share. A pool holds one per priority class (runs of different
 * classes go on at once; those of one class queue). */
typedef struct sched_run_state {
  /* Per-task state, sized for the largest DAG run in this slot so far. */
  int32_t capacity;
  atomic_int *pending; /* predecessors not yet finished (npred between runs) */
  uint64_t pending_serial;   /* the DAG whose npred `pending` now holds */
  sched_links links;         /* queue links */
  sched_trace_record *trace; /* only while a traced run is in progress */
  void *context;             /* the run's sched_run_opts.context */
  _Atomic int64_t *progress; /* the run's sched_run_opts.progress */
  int64_t trace_origin_ns;
  sched_run_worker *workers; /* [nworkers], cache-line aligned */
  sched_run_inbox *inbox;    /* [nnodes], cache-line aligned */
  int cls;                   /* its priority class: 0 is the most urgent */

  /* Read-mostly during a run. */
  alignas(SCHED_CACHE_LINE) const sched_dag *dag;
  atomic_int nroots;       /* dag->nroots, for sleepers outside the run */
  atomic_bool live;        /* workers may enter */
  atomic_int error_status; /* first non-zero task status */
  int32_t error_task;      /* written by the task that set error_status */

  /* Memory admission of the run (admit.c), under admit_lock but for
   * admit_bound, which is set before the run and 0 when it has none. */
  alignas(SCHED_CACHE_LINE) atomic_int admit_lock;
  int64_t admit_bound;
  int64_t admit_used;     /* bytes admitted and not released */
  int32_t admit_next;     /* the rank admitted next */
  uint8_t *admit_state;   /* [admit_capacity] per rank: sched_admit_state */
  int32_t admit_capacity;

  alignas(SCHED_CACHE_LINE) atomic_int root_cursor;
  alignas(SCHED_CACHE_LINE) atomic_llong finished;
} sched_run_state;

/* One worker. */
typedef struct sched_worker {
  alignas(SCHED_CACHE_LINE) struct sched_pool *pool;
  sched_run_state *run; /* the run it is inside, NULL between runs */
  const sched_dag *dag; /* run->dag */
  sched_run_worker *mine; /* &run->workers[index] */
  int index;
  int node;
  int *victims; /* [nworkers-1] steal order, nearest first */
  pthread_t thread;
} sched_worker;

/* One NUMA node: the place its idle workers sleep. */
typedef struct sched_node {
  alignas(SCHED_CACHE_LINE) pthread_mutex_t mutex;
  pthread_cond_t cond;
  atomic_int sleepers; /* workers of this node asleep */
} sched_node;

struct sched_pool {
  sched_placement place;
  int nworkers;
  sched_bind bind;
  sched_worker *workers; /* [nworkers], cache-line aligned */
  sched_node *nodes;     /* [place.nnodes], cache-line aligned */
  hwloc_topology_t topo; /* only while the workers start */
  sched_run_state runs[SCHED_NUM_CLASSES]; /* one per class */

  alignas(SCHED_CACHE_LINE) atomic_uint live_mask; /* bit c: runs[c] live */
  atomic_bool shutdown;

  /* Ends of runs and starts of workers. */
  alignas(SCHED_CACHE_LINE) pthread_mutex_t done_mutex;
  pthread_cond_t done_cond;
  int started;
  /* The queue of runs (run.c): one run per class at a time; a finished
   * run hands its class's slot to the caller of that class that came
   * first (tickets), under run_mutex. A DAG runs once at a time. */
  pthread_mutex_t run_mutex;
  pthread_cond_t run_cond;
  bool run_busy[SCHED_NUM_CLASSES];
  int run_waiting[SCHED_NUM_CLASSES]; /* callers waiting, per class */
  uint64_t run_ticket[SCHED_NUM_CLASSES]; /* the next caller's ticket */
  uint64_t run_serving[SCHED_NUM_CLASSES]; /* the ticket that goes next */
};

/* The worker's ready heap and node inbox in its current run. */
static inline sched_heap *sched_own_heap(const sched_worker *w) {
  return &w->mine->ready;
}

/* run.c: the worker's loop: runs tasks of the most urgent live run that
 * has one, sleeps when none has, returns when the pool stops. */
void sched_worker_loop(sched_worker *w);

/* park.c: queues a ready task (its node's inbox, else w's heap) and wakes
 * a sleeper for it. */
void sched_push_ready(sched_worker *w, int32_t task);

/* admit.c: memory admission. Per-run arrays and state (false: out of
 * memory), whether `task` (an admitted one) may run now on w (if not, it
 * waits and a later release or failure queues it), and the opening of
 * admission when a task of the run failed. */
bool sched_admit_prepare(sched_run_state *run, const sched_dag *dag,
                         int64_t bound);
bool sched_admit(sched_worker *w, int32_t task);
void sched_admit_open(sched_worker *w);

/* park.c: sleeping and waking of workers. */
void sched_sleep_until_work(sched_worker *w);
void sched_wake_node(struct sched_pool *pool, int node);
void sched_wake_all(struct sched_pool *pool);
bool sched_any_work(const sched_worker *w);

/* trace.c: writes the records of the run that just ended. */
remat_status sched_trace_write(const struct sched_pool *pool,
                               const sched_run_state *run,
                               const sched_dag *dag, const char *path,
                               char err[SCHED_ERRMSG_MAX]);

#endif
