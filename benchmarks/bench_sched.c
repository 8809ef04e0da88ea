/* Scheduler overhead: empty tasks in three DAG shapes (independent, 64
 * chains, random with fan-in up to 4), run by remat's scheduler and, in the
 * same process, by libgomp tasks with depend clauses. Prints per-task
 * nanoseconds (median of several runs after a warm-up) and the ratio.
 * Usage: bench_sched [--json] [--threads N] */
#include <hwloc.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched/sched.h"
#include "tools/json_out.h"

#define OURS_RUNS 7
#define OMP_RUNS 5
#define MAX_FAN_IN 4

/* A DAG in topological id order, kept as predecessor lists for OpenMP. */
typedef struct shape {
  const char *name;
  int32_t ntasks;
  int64_t nedges;
  int32_t *pred_first; /* [ntasks+1] */
  int32_t *pred;       /* [nedges] */
} shape;

static int empty_task(void *context, void *arg, int worker) {
  (void)context;
  (void)arg;
  (void)worker;
  return 0;
}

/* OpenMP tasks call the body through this pointer, as the scheduler does. */
static sched_task_fn volatile omp_body = empty_task;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static unsigned next_rand(unsigned *state) {
  *state = *state * 1664525u + 1013904223u;
  return *state >> 8;
}

static void shape_alloc(shape *s, const char *name, int32_t ntasks,
                        int64_t max_edges) {
  s->name = name;
  s->ntasks = ntasks;
  s->nedges = 0;
  s->pred_first = calloc((size_t)ntasks + 1, sizeof(int32_t));
  s->pred = malloc((size_t)(max_edges > 0 ? max_edges : 1) * sizeof(int32_t));
  if (!s->pred_first || !s->pred) {
    fprintf(stderr, "bench_sched: out of memory\n");
    exit(1);
  }
}

static void independent_shape(shape *s, int32_t ntasks) {
  shape_alloc(s, "independent", ntasks, 0);
}

/* `nchains` chains, interleaved: task i follows task i - nchains. */
static void chains_shape(shape *s, int32_t ntasks, int32_t nchains) {
  shape_alloc(s, "chains", ntasks, ntasks);
  for (int32_t i = 0; i < ntasks; i++) {
    if (i >= nchains)
      s->pred[s->nedges++] = i - nchains;
    s->pred_first[i + 1] = (int32_t)s->nedges;
  }
}

static bool has_pred(const shape *s, int32_t task, int32_t p) {
  for (int64_t e = s->pred_first[task]; e < s->nedges; e++)
    if (s->pred[e] == p)
      return true;
  return false;
}

/* 2 to 4 distinct predecessors (3 on average) among the 256 tasks before. */
static void random_shape(shape *s, int32_t ntasks, unsigned seed) {
  shape_alloc(s, "random", ntasks, (int64_t)ntasks * MAX_FAN_IN);
  for (int32_t i = 0; i < ntasks; i++) {
    int window = i < 256 ? i : 256;
    int fan_in = window < MAX_FAN_IN ? 0 : 2 + (int)(next_rand(&seed) % 3);
    for (int k = 0; k < fan_in;) {
      int32_t p = i - 1 - (int32_t)(next_rand(&seed) % (unsigned)window);
      if (!has_pred(s, i, p)) {
        s->pred[s->nedges++] = p;
        k++;
      }
    }
    s->pred_first[i + 1] = (int32_t)s->nedges;
  }
}

static sched_dag *build_dag(const shape *s) {
  char err[SCHED_ERRMSG_MAX];
  sched_dag *dag;
  if (sched_dag_create(&dag, err) != REMAT_OK)
    goto fail;
  for (int32_t i = 0; i < s->ntasks; i++) {
    if (sched_dag_add(dag, empty_task, NULL, 0, -1, "empty", "bench") < 0)
      goto fail;
    for (int64_t e = s->pred_first[i]; e < s->pred_first[i + 1]; e++)
      if (sched_dag_edge(dag, s->pred[e], i) != REMAT_OK)
        goto fail;
  }
  if (sched_dag_finalize(dag, err) == REMAT_OK)
    return dag;
fail:
  fprintf(stderr, "bench_sched: cannot build the %s DAG\n", s->name);
  exit(1);
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_double);
  return v[n / 2];
}

static double time_ours(sched_pool *pool, const shape *s) {
  sched_dag *dag = build_dag(s);
  char err[SCHED_ERRMSG_MAX];
  double t[OURS_RUNS];
  for (int r = -1; r < OURS_RUNS; r++) { /* r == -1: warm-up */
    double start = now_s();
    if (sched_run(pool, dag, NULL, err) != REMAT_OK) {
      fprintf(stderr, "bench_sched: %s\n", err);
      exit(1);
    }
    if (r >= 0)
      t[r] = now_s() - start;
  }
  sched_dag_destroy(dag);
  return median(t, OURS_RUNS) * 1e9 / s->ntasks;
}

/* One task per id in topological order, with depend(in) on each predecessor
 * (a switch on the fan-in count) and depend(out) on itself. */
static void spawn_omp_task(const shape *s, char *dep, int32_t i) {
  const int32_t *p = s->pred + s->pred_first[i];
  (void)dep; /* gcc 12 does not count depend clauses as uses */
  /* clang-format off */
  switch (s->pred_first[i + 1] - s->pred_first[i]) {
  case 0:
#pragma omp task depend(out : dep[i])
    omp_body(NULL, NULL, 0);
    break;
  case 1:
#pragma omp task depend(in : dep[p[0]]) depend(out : dep[i])
    omp_body(NULL, NULL, 0);
    break;
  case 2:
#pragma omp task depend(in : dep[p[0]], dep[p[1]]) depend(out : dep[i])
    omp_body(NULL, NULL, 0);
    break;
  case 3:
#pragma omp task depend(in : dep[p[0]], dep[p[1]], dep[p[2]]) \
                 depend(out : dep[i])
    omp_body(NULL, NULL, 0);
    break;
  default:
#pragma omp task depend(in : dep[p[0]], dep[p[1]], dep[p[2]], dep[p[3]]) \
                 depend(out : dep[i])
    omp_body(NULL, NULL, 0);
    break;
  }
  /* clang-format on */
}

static double time_omp(const shape *s, int nthreads) {
  char *dep = calloc((size_t)s->ntasks, 1);
  double t[OMP_RUNS];
  for (int r = -1; r < OMP_RUNS; r++) {
    double start = now_s();
#pragma omp parallel num_threads(nthreads)
#pragma omp single
    for (int32_t i = 0; i < s->ntasks; i++)
      spawn_omp_task(s, dep, i);
    if (r >= 0)
      t[r] = now_s() - start;
  }
  free(dep);
  return median(t, OMP_RUNS) * 1e9 / s->ntasks;
}

typedef struct result {
  const shape *s;
  double ours_ns, omp_ns;
} result;

static void print_json(int nthreads, const result *res, int n) {
  printf("{\"threads\": %d", nthreads);
  for (int i = 0; i < n; i++) {
    json_nulls nulls = {0};
    printf(", \"%s\": {\"tasks\": %d, \"edges\": %lld", res[i].s->name,
           (int)res[i].s->ntasks, (long long)res[i].s->nedges);
    json_put(&nulls, "per_task_ns", "%.1f", res[i].ours_ns);
    json_put(&nulls, "omp_per_task_ns", "%.1f", res[i].omp_ns);
    json_put(&nulls, "ratio_vs_omp", "%.4f", res[i].ours_ns / res[i].omp_ns);
    printf("%s}", json_nonfinite(&nulls));
  }
  printf("}\n");
}

static void print_table(int nthreads, const result *res, int n) {
  printf("scheduler overhead, %d threads (ns per empty task, median)\n",
         nthreads);
  printf("%-12s %9s %9s %10s %10s %8s\n", "dag", "tasks", "edges", "remat",
         "libgomp", "ratio");
  for (int i = 0; i < n; i++)
    printf("%-12s %9d %9lld %10.1f %10.1f %8.3f\n", res[i].s->name,
           (int)res[i].s->ntasks, (long long)res[i].s->nedges, res[i].ours_ns,
           res[i].omp_ns, res[i].ours_ns / res[i].omp_ns);
}

static bool parse_args(int argc, char **argv, bool *json, int *nthreads) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0)
      *json = true;
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      *nthreads = atoi(argv[++i]);
    else
      return false;
  }
  return *nthreads >= 1 && *nthreads <= SCHED_MAX_THREADS;
}

int main(int argc, char **argv) {
  bool json = false;
  int nthreads = 2;
  if (!parse_args(argc, argv, &json, &nthreads)) {
    fprintf(stderr, "usage: bench_sched [--json] [--threads N]\n");
    return 2;
  }
  hwloc_topology_t topo;
  char err[SCHED_ERRMSG_MAX];
  sched_pool *pool;
  hwloc_topology_init(&topo);
  hwloc_topology_load(topo);
  if (sched_pool_create(topo, nthreads, SCHED_BIND_CORE, &pool, err)) {
    fprintf(stderr, "bench_sched: %s\n", err);
    return 1;
  }
  shape shapes[3];
  independent_shape(&shapes[0], 1000000);
  chains_shape(&shapes[1], 1000000, 64);
  random_shape(&shapes[2], 200000, 42);
  result res[3];
  for (int i = 0; i < 3; i++) /* all of ours first: libgomp threads spin */
    res[i] = (result){&shapes[i], time_ours(pool, &shapes[i]), 0};
  sched_pool_destroy(pool);
  for (int i = 0; i < 3; i++)
    res[i].omp_ns = time_omp(&shapes[i], nthreads);
  if (json)
    print_json(nthreads, res, 3);
  else
    print_table(nthreads, res, 3);
  for (int i = 0; i < 3; i++) {
    free(shapes[i].pred_first);
    free(shapes[i].pred);
  }
  hwloc_topology_destroy(topo);
  return 0;
}
