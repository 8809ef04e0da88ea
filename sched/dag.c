/* The task DAG: tasks and edges are appended into arrays that grow by
 * doubling, then frozen by sched_dag_finalize into the arrays a run reads
 * (CSR successor lists sorted by priority, predecessor counts, roots sorted
 * by priority). Kahn's algorithm refuses a cycle there, naming a task on it. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "sched/sched_internal.h"

#define INITIAL_TASKS 64
#define INITIAL_EDGES 256

static atomic_uint_least64_t last_serial;

remat_status sched_dag_create(sched_dag **out, char err[SCHED_ERRMSG_MAX]) {
  if (!out) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_dag_create: out is NULL");
    return REMAT_ERR_INVALID_ARG;
  }
  *out = NULL;
  sched_dag *dag = remat__calloc(1, sizeof *dag);
  if (!dag) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_dag_create: out of memory");
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  dag->max_tasks = SCHED_MAX_TASKS;
  dag->max_edges = SCHED_MAX_EDGES;
  dag->max_node = -1;
  dag->max_node_task = -1;
  *out = dag;
  return REMAT_OK;
}

static void free_edges(sched_dag *dag) {
  free(dag->edge_from);
  free(dag->edge_to);
  dag->edge_from = dag->edge_to = NULL;
  dag->edge_cap = 0;
}

void sched_dag_destroy(sched_dag *dag) {
  if (!dag)
    return;
  free_edges(dag);
  free(dag->tasks);
  free(dag->info);
  free(dag->succ);
  free(dag->roots);
  free(dag->admit_task);
  free(dag->admit_bytes);
  free(dag);
}

void sched_dag_set_limits(sched_dag *dag, int32_t max_tasks,
                          int64_t max_edges) {
  dag->max_tasks = max_tasks < SCHED_MAX_TASKS ? max_tasks : SCHED_MAX_TASKS;
  dag->max_edges = max_edges < SCHED_MAX_EDGES ? max_edges : SCHED_MAX_EDGES;
}

int32_t sched_dag_num_tasks(const sched_dag *dag) {
  return dag ? dag->ntasks : 0;
}

static bool grow_tasks(sched_dag *dag) {
  int32_t cap = dag->task_cap ? dag->task_cap * 2 : INITIAL_TASKS;
  sched_task *tasks = remat__realloc(dag->tasks, (size_t)cap * sizeof *tasks);
  if (!tasks)
    return false;
  dag->tasks = tasks;
  sched_task_info *info = remat__realloc(dag->info, (size_t)cap * sizeof *info);
  if (!info)
    return false;
  dag->info = info;
  dag->task_cap = cap;
  return true;
}

int32_t sched_dag_add(sched_dag *dag, sched_task_fn fn, void *arg,
                      int32_t priority, int numa_node, const char *name,
                      const char *category) {
  if (!dag || !fn || numa_node < -1 || numa_node >= SCHED_MAX_THREADS)
    return -(int32_t)REMAT_ERR_INVALID_ARG;
  if (dag->finalized)
    return -(int32_t)REMAT_ERR_STATE;
  if (dag->ntasks >= dag->max_tasks)
    return -(int32_t)REMAT_ERR_LIMIT;
  if (dag->ntasks == dag->task_cap && !grow_tasks(dag))
    return -(int32_t)REMAT_ERR_OUT_OF_MEMORY;
  int32_t id = dag->ntasks++;
  dag->tasks[id] = (sched_task){.fn = fn, .arg = arg,
                                .numa_node = (int16_t)numa_node};
  dag->info[id] = (sched_task_info){name, category, priority, -1};
  if (numa_node > dag->max_node) {
    dag->max_node = numa_node;
    dag->max_node_task = id;
  }
  return id;
}

remat_status sched_dag_set_async(sched_dag *dag, int32_t task) {
  if (!dag || task < 0 || task >= dag->ntasks)
    return REMAT_ERR_INVALID_ARG;
  if (dag->finalized)
    return REMAT_ERR_STATE;
  if (dag->tasks[task].admit)
    return REMAT_ERR_INVALID_ARG;
  dag->tasks[task].async = 1;
  return REMAT_OK;
}

static bool grow_admit(sched_dag *dag) {
  int32_t cap = dag->admit_cap ? dag->admit_cap * 2 : INITIAL_TASKS;
  int32_t *task = remat__realloc(dag->admit_task, (size_t)cap * sizeof *task);
  if (!task)
    return false;
  dag->admit_task = task;
  int64_t *bytes =
      remat__realloc(dag->admit_bytes, (size_t)cap * sizeof *bytes);
  if (!bytes)
    return false;
  dag->admit_bytes = bytes;
  dag->admit_cap = cap;
  return true;
}

remat_status sched_dag_set_admit(sched_dag *dag, int32_t task, int64_t bytes) {
  if (!dag || task < 0 || task >= dag->ntasks || bytes < 0 ||
      dag->tasks[task].async || dag->info[task].admit_rank >= 0)
    return REMAT_ERR_INVALID_ARG;
  if (dag->finalized)
    return REMAT_ERR_STATE;
  if (dag->nadmit == dag->admit_cap && !grow_admit(dag))
    return REMAT_ERR_OUT_OF_MEMORY;
  dag->admit_task[dag->nadmit] = task;
  dag->admit_bytes[dag->nadmit] = bytes;
  dag->info[task].admit_rank = dag->nadmit++;
  dag->tasks[task].admit = 1;
  return REMAT_OK;
}

static bool grow_edges(sched_dag *dag) {
  int64_t cap = dag->edge_cap ? dag->edge_cap * 2 : INITIAL_EDGES;
  int32_t *from = remat__realloc(dag->edge_from, (size_t)cap * sizeof *from);
  if (!from)
    return false;
  dag->edge_from = from;
  int32_t *to = remat__realloc(dag->edge_to, (size_t)cap * sizeof *to);
  if (!to)
    return false;
  dag->edge_to = to;
  dag->edge_cap = cap;
  return true;
}

remat_status sched_dag_edge(sched_dag *dag, int32_t from, int32_t to) {
  if (!dag || from < 0 || to < 0 || from >= dag->ntasks || to >= dag->ntasks)
    return REMAT_ERR_INVALID_ARG;
  if (dag->finalized)
    return REMAT_ERR_STATE;
  if (dag->nedges >= dag->max_edges)
    return REMAT_ERR_LIMIT;
  if (dag->nedges == dag->edge_cap && !grow_edges(dag))
    return REMAT_ERR_OUT_OF_MEMORY;
  dag->edge_from[dag->nedges] = from;
  dag->edge_to[dag->nedges] = to;
  dag->nedges++;
  return REMAT_OK;
}

/* ---- finalize ---- */

/* Arrays finalize needs only while it runs. */
typedef struct scratch {
  int32_t *pred_first; /* [n+1] CSR of predecessors */
  int32_t *pred;       /* [m] */
  int32_t *order;      /* [n] ids by priority, highest first, then by id */
  int32_t *indegree;   /* [n] Kahn's remaining predecessors */
  int32_t *queue;      /* [n] Kahn's ready tasks */
} scratch;

static void scratch_free(scratch *s) {
  free(s->pred_first);
  free(s->pred);
  free(s->order);
  free(s->indegree);
  free(s->queue);
}

static remat_status alloc_arrays(sched_dag *dag, scratch *s,
                                 char err[SCHED_ERRMSG_MAX]) {
  size_t n = (size_t)dag->ntasks, m = (size_t)dag->nedges;
  dag->succ = remat__malloc((m ? m : 1) * sizeof(int32_t));
  dag->roots = remat__malloc((n ? n : 1) * sizeof(int32_t));
  s->pred_first = remat__calloc(n + 1, sizeof(int32_t));
  s->pred = remat__malloc((m ? m : 1) * sizeof(int32_t));
  s->order = remat__malloc((n ? n : 1) * sizeof(int32_t));
  s->indegree = remat__malloc((n ? n : 1) * sizeof(int32_t));
  s->queue = remat__malloc((n ? n : 1) * sizeof(int32_t));
  if (dag->succ && dag->roots && s->pred_first && s->pred && s->order &&
      s->indegree && s->queue)
    return REMAT_OK;
  snprintf(err, SCHED_ERRMSG_MAX,
           "sched_dag_finalize: out of memory for %d tasks and %lld edges",
           (int)n, (long long)m);
  return REMAT_ERR_OUT_OF_MEMORY;
}

static void free_frozen(sched_dag *dag) {
  free(dag->succ);
  free(dag->roots);
  dag->succ = dag->roots = NULL;
}

/* Counting sort of the edges by target: predecessor lists and counts. */
static void build_preds(sched_dag *dag, scratch *s) {
  int32_t n = dag->ntasks;
  for (int32_t t = 0; t < n; t++)
    dag->tasks[t].npred = 0;
  for (int64_t e = 0; e < dag->nedges; e++)
    dag->tasks[dag->edge_to[e]].npred++;
  s->pred_first[0] = 0;
  for (int32_t t = 0; t < n; t++)
    s->pred_first[t + 1] = s->pred_first[t] + dag->tasks[t].npred;
  memcpy(s->indegree, s->pred_first, (size_t)n * sizeof(int32_t));
  for (int64_t e = 0; e < dag->nedges; e++)
    s->pred[s->indegree[dag->edge_to[e]]++] = dag->edge_from[e];
}

typedef struct ranked {
  int32_t priority;
  int32_t id;
} ranked;

static int compare_ranked(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->priority != y->priority)
    return x->priority > y->priority ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

/* Task ids by priority, highest first, ties by id; no sort when the
 * priorities already come in that order (all equal, say). */
static bool sort_by_priority(const sched_dag *dag, int32_t *order) {
  int32_t n = dag->ntasks;
  bool sorted = true;
  for (int32_t t = 1; t < n && sorted; t++)
    sorted = dag->info[t - 1].priority >= dag->info[t].priority;
  if (!sorted) {
    ranked *r = remat__malloc((size_t)n * sizeof *r);
    if (!r)
      return false;
    for (int32_t t = 0; t < n; t++)
      r[t] = (ranked){dag->info[t].priority, t};
    qsort(r, (size_t)n, sizeof *r, compare_ranked);
    for (int32_t t = 0; t < n; t++)
      order[t] = r[t].id;
    free(r);
    return true;
  }
  for (int32_t t = 0; t < n; t++)
    order[t] = t;
  return true;
}

/* Successor lists in CSR form, each highest priority first: visiting the
 * targets in priority order appends them to their predecessors' lists in
 * that order. */
static void build_succs(sched_dag *dag, scratch *s) {
  int32_t n = dag->ntasks;
  sched_task *tasks = dag->tasks;
  int32_t *outdegree = s->indegree; /* reused */
  memset(outdegree, 0, (size_t)n * sizeof(int32_t));
  for (int64_t e = 0; e < dag->nedges; e++)
    outdegree[dag->edge_from[e]]++;
  for (int32_t t = 0, offset = 0; t < n; t++) {
    tasks[t].succ_begin = tasks[t].succ_end = offset;
    offset += outdegree[t];
  }
  for (int32_t i = 0; i < n; i++) {
    int32_t t = s->order[i];
    for (int32_t p = s->pred_first[t]; p < s->pred_first[t + 1]; p++)
      dag->succ[tasks[s->pred[p]].succ_end++] = t;
  }
}

/* Roots without affinity first, then roots with one; each group in
 * priority order. */
static void collect_roots(sched_dag *dag, const scratch *s) {
  int32_t k = 0;
  for (int32_t i = 0; i < dag->ntasks; i++) {
    int32_t t = s->order[i];
    if (dag->tasks[t].npred == 0 && dag->tasks[t].numa_node < 0)
      dag->roots[k++] = t;
  }
  dag->nroots = k;
  for (int32_t i = 0; i < dag->ntasks; i++) {
    int32_t t = s->order[i];
    if (dag->tasks[t].npred == 0 && dag->tasks[t].numa_node >= 0)
      dag->roots[k++] = t;
  }
  dag->naffine_roots = k - dag->nroots;
}

/* Kahn's algorithm; returns how many tasks it could order. Afterwards
 * indegree[t] > 0 exactly for the tasks it could not (on or after a cycle). */
static int32_t kahn(const sched_dag *dag, scratch *s) {
  int32_t n = dag->ntasks, head = 0, tail = 0;
  for (int32_t t = 0; t < n; t++) {
    s->indegree[t] = dag->tasks[t].npred;
    if (s->indegree[t] == 0)
      s->queue[tail++] = t;
  }
  while (head < tail) {
    int32_t t = s->queue[head++];
    for (int32_t e = dag->tasks[t].succ_begin; e < dag->tasks[t].succ_end; e++)
      if (--s->indegree[dag->succ[e]] == 0)
        s->queue[tail++] = dag->succ[e];
  }
  return tail;
}

/* The first predecessor of `t` that Kahn's algorithm left unordered: every
 * unordered task has one. */
static int32_t unordered_pred(const scratch *s, int32_t t) {
  for (int32_t p = s->pred_first[t];; p++)
    if (s->indegree[s->pred[p]] > 0)
      return s->pred[p];
}

/* A task on a cycle, chosen deterministically: follow unordered_pred from
 * the lowest unordered id for n steps (which ends on a cycle), then take
 * the lowest id around that cycle. */
static int32_t task_on_cycle(const sched_dag *dag, const scratch *s) {
  int32_t t = 0;
  while (s->indegree[t] == 0)
    t++;
  for (int32_t i = 0; i < dag->ntasks; i++)
    t = unordered_pred(s, t);
  int32_t lowest = t;
  for (int32_t u = unordered_pred(s, t); u != t; u = unordered_pred(s, u))
    lowest = u < lowest ? u : lowest;
  return lowest;
}

static remat_status freeze(sched_dag *dag, scratch *s,
                           char err[SCHED_ERRMSG_MAX]) {
  remat_status status = alloc_arrays(dag, s, err);
  if (status != REMAT_OK)
    return status;
  build_preds(dag, s);
  if (!sort_by_priority(dag, s->order)) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_dag_finalize: out of memory");
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  build_succs(dag, s);
  if (kahn(dag, s) < dag->ntasks) {
    int32_t t = task_on_cycle(dag, s);
    const char *name = dag->info[t].name ? dag->info[t].name : "";
    snprintf(err, SCHED_ERRMSG_MAX,
             "task graph has a cycle through task %d '%s'", (int)t, name);
    return REMAT_ERR_CYCLE;
  }
  collect_roots(dag, s);
  return REMAT_OK;
}

remat_status sched_dag_finalize(sched_dag *dag, char err[SCHED_ERRMSG_MAX]) {
  if (!dag) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_dag_finalize: dag is NULL");
    return REMAT_ERR_INVALID_ARG;
  }
  if (dag->finalized) {
    snprintf(err, SCHED_ERRMSG_MAX,
             "sched_dag_finalize: the DAG is already finalized");
    return REMAT_ERR_STATE;
  }
  scratch s = {0};
  remat_status status = freeze(dag, &s, err);
  scratch_free(&s);
  if (status != REMAT_OK) {
    free_frozen(dag);
    return status;
  }
  free_edges(dag);
  dag->serial = atomic_fetch_add(&last_serial, 1) + 1;
  dag->finalized = true;
  return REMAT_OK;
}
