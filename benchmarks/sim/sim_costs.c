/* Task durations on one core (sim_costs.h): medians per cost key from a
 * step's trace, or sample tiles run in isolation. */
#include <cjson/cJSON.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "benchmarks/sim/sim_costs.h"
#include "runtime/exec/tasks.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Time this thread has run: what a tile costs even while other processes
 * take turns on the core. */
static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define TIMED_RUNS 9 /* per cost key, in isolation */

/* One measured duration of a task, sorted by key then duration. */
typedef struct sample {
  uint64_t key;
  double s;
  int32_t task;
} sample;

static int cmp_sample(const void *a, const void *b) {
  const sample *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return (x->s > y->s) - (x->s < y->s);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int cmp_task(const void *a, const void *b) {
  const sample *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return (x->task > y->task) - (x->task < y->task);
}

/* Gives every task the median of its key's samples (n of them, all
 * tasks); returns the number of keys. */
static int assign_medians(sample *v, int32_t n, double *out) {
  qsort(v, (size_t)n, sizeof *v, cmp_sample);
  int groups = 0;
  for (int32_t i = 0; i < n;) {
    int32_t j = i;
    while (j < n && v[j].key == v[i].key)
      j++;
    int32_t m = j - i;
    double med = m % 2 ? v[i + m / 2].s : 0.5 * (v[i + m / 2 - 1].s + v[i + m / 2].s);
    for (int32_t k = i; k < j; k++)
      out[v[k].task] = med;
    groups++;
    i = j;
  }
  return groups;
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = size >= 0 ? malloc((size_t)size + 1) : NULL;
  if (text != NULL && fread(text, 1, (size_t)size, f) != (size_t)size) {
    free(text);
    text = NULL;
  }
  if (text != NULL)
    text[size] = '\0';
  fclose(f);
  return text;
}

/* Fills dur[task] (seconds) from the trace's complete events; returns the
 * number of tasks found. */
static int32_t trace_durations(const cJSON *root, int32_t ntasks, double *dur) {
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
  int32_t found = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(e, "dur");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(args, "id");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") != 0 ||
        !cJSON_IsNumber(d) || !cJSON_IsNumber(id))
      continue;
    int32_t t = (int32_t)id->valuedouble;
    if (t < 0 || t >= ntasks || dur[t] >= 0)
      continue;
    dur[t] = d->valuedouble * 1e-6;
    found++;
  }
  return found;
}

/* Reads one trace into v[0..ntasks) (keys and durations); returns the
 * sum of the durations, or -1 when a task is missing. */
static double read_trace(const sim_step *s, const char *path, sample *v,
                         double *dur, char err[256]) {
  char *text = read_file(path);
  cJSON *root = text != NULL ? cJSON_Parse(text) : NULL;
  free(text);
  for (int32_t t = 0; t < s->ntasks; t++)
    dur[t] = -1.0;
  int32_t found = root != NULL ? trace_durations(root, s->ntasks, dur) : -1;
  cJSON_Delete(root);
  if (found != s->ntasks) {
    snprintf(err, 256, "trace '%s': %d of %d tasks found", path, (int)found,
             (int)s->ntasks);
    return -1.0;
  }
  double busy = 0.0;
  for (int32_t t = 0; t < s->ntasks; t++) {
    v[t] = (sample){s->key[t], dur[t], t};
    busy += dur[t];
  }
  return busy;
}

int sim_costs_from_traces(const sim_step *s, const char *const *paths,
                          const double *walls, int n, sim_costs *c,
                          char err[256]) {
  memset(c, 0, sizeof *c);
  size_t all = (size_t)s->ntasks * (size_t)n;
  c->task_s = malloc((size_t)s->ntasks * sizeof *c->task_s);
  sample *v = malloc(all * sizeof *v);
  double *gap = malloc((size_t)n * sizeof *gap);
  int ok = c->task_s != NULL && v != NULL && gap != NULL && n > 0;
  if (!ok)
    snprintf(err, 256, "out of memory reading traces");
  for (int i = 0; ok && i < n; i++) {
    double busy = read_trace(s, paths[i], v + (size_t)i * s->ntasks, c->task_s, err);
    ok = busy >= 0.0;
    gap[i] = walls[i] > busy ? (walls[i] - busy) / s->ntasks : 0.0;
  }
  if (ok) {
    c->groups = assign_medians(v, (int32_t)all, c->task_s);
    qsort(gap, (size_t)n, sizeof *gap, cmp_double);
    c->overhead_s = n % 2 ? gap[n / 2] : 0.5 * (gap[n / 2 - 1] + gap[n / 2]);
  }
  free(v);
  free(gap);
  if (!ok)
    sim_costs_free(c);
  return ok;
}

/* ---- isolation ---- */

double sim_memset_bw(int threads) {
  size_t each = (size_t)64 << 20, bytes = each * (size_t)threads;
  char *p = malloc(bytes);
  if (p == NULL)
    return 1e10;
  double best = 1e30;
  for (int rep = 0; rep < 4; rep++) {
    double t0 = now();
#pragma omp parallel for num_threads(threads)
    for (int i = 0; i < threads; i++)
      memset(p + (size_t)i * each, rep, each);
    double t = now() - t0;
    if (rep > 0 && t < best)
      best = t;
  }
  volatile char sink = p[bytes / 2];
  (void)sink;
  free(p);
  return (double)bytes / (best > 0 ? best : 1e-9);
}

/* Memory lent to the buffers of the node being measured: grown when a
 * node needs more, reused otherwise (so that its pages are faulted in
 * once, not for every kernel). */
typedef struct lender {
  char *base;
  size_t cap;
} lender;

/* Whether kn's tiles read buffer b (or add into it). */
static bool read_by(const compiled_step *c, const plan_knode *kn, int32_t b) {
  if (kn->kernel == NULL)
    return true;
  for (int i = 0; i < PLAN_SLOTS; i++)
    if (kn->slot_buf[i] == b &&
        (((kn->kernel->reads >> i) & 1u) || c->low.bufs[b].zero_fill))
      return true;
  return false;
}

/* Gives every buffer kn touches that has no memory now a place in the
 * lender's memory, zeroed where the tiles read it; marks them in mine[]. */
static int lend_buffers(const sim_step *s, int32_t k, lender *len,
                        bool *mine) {
  const compiled_step *c = s->c;
  const plan_knode *kn = &c->low.knodes[k];
  float **data = s->state->data;
  size_t need = 0;
  memset(mine, 0, PLAN_MAX_USES * sizeof *mine);
  for (int i = 0; i < kn->ntouch; i++)
    if (data[kn->touch[i]] == NULL)
      need += (size_t)remat__round64(c->low.bufs[kn->touch[i]].bytes);
  if (need > len->cap) {
    free(len->base);
    len->base = aligned_alloc(64, need);
    len->cap = len->base != NULL ? need : 0;
    if (len->base == NULL)
      return 0;
    memset(len->base, 0, need); /* no page faults inside timed tiles */
  }
  size_t at = 0;
  for (int i = 0; i < kn->ntouch; i++) {
    int32_t b = kn->touch[i];
    mine[i] = data[b] == NULL;
    if (!mine[i])
      continue;
    data[b] = (float *)(len->base + at);
    at += (size_t)remat__round64(c->low.bufs[b].bytes);
    if (read_by(c, kn, b))
      memset(data[b], 0, (size_t)remat__round64(c->low.bufs[b].bytes));
  }
  if (kn->kernel != NULL)
    tasks_bind(c, s->state, k);
  return 1;
}

static void release_buffers(const sim_step *s, int32_t k, const bool *mine) {
  const plan_knode *kn = &s->c->low.knodes[k];
  for (int i = 0; i < kn->ntouch; i++)
    if (mine[i])
      s->state->data[kn->touch[i]] = NULL;
}

/* Median of TIMED_RUNS runs, after one untimed, cycling through up to
 * three tiles among tasks[0..n) (tasks of one key, sorted by id; those of
 * the first one's node): the first, the middle and the last. */
static double time_tiles(const sim_step *s, const sample *tasks, int32_t n) {
  int32_t k0 = s->knode[tasks[0].task], m = 0;
  while (m < n && s->knode[tasks[m].task] == k0)
    m++;
  int32_t pick[3] = {0, m / 2, m - 1};
  int npick = m >= 3 ? 3 : (int)m;
  double t[TIMED_RUNS];
  step_run run = {s->c, s->state, RUN_STEP, s->state->opt_step + 1};
  tasks_tile(&run, s->dag->tasks[tasks[0].task].arg, 0);
  for (int i = 0; i < TIMED_RUNS; i++) {
    void *arg = s->dag->tasks[tasks[pick[i % npick]].task].arg;
    double t0 = thread_cpu();
    tasks_tile(&run, arg, 0);
    t[i] = thread_cpu() - t0;
  }
  qsort(t, TIMED_RUNS, sizeof *t, cmp_double);
  return t[TIMED_RUNS / 2];
}

static double zero_fill_bytes(const sim_step *s, const plan_knode *kn) {
  double bytes = 0;
  for (int i = 0; i < kn->ninit; i++)
    if (s->c->low.bufs[kn->init[i]].zero_fill)
      bytes += (double)s->c->low.bufs[kn->init[i]].bytes;
  return bytes;
}

/* The cost of the key whose tasks are g[0..n). */
static int measure_group(const sim_step *s, const sample *g, int32_t n,
                         double memset_bw, lender *len, double *cost) {
  int64_t tile = s->tile[g[0].task];
  int32_t k = s->knode[g[0].task];
  const plan_knode *kn = &s->c->low.knodes[k];
  if (tile == SIM_DONE) {
    *cost = 0.0;
    return 1;
  }
  if (tile == SIM_START) {
    *cost = zero_fill_bytes(s, kn) / memset_bw;
    return 1;
  }
  bool mine[PLAN_MAX_USES];
  int ok = lend_buffers(s, k, len, mine);
  if (ok)
    *cost = time_tiles(s, g, n);
  release_buffers(s, k, mine);
  return ok;
}

int sim_costs_isolated(const sim_step *s, double memset_bw, double overhead_s,
                       sim_costs *c, char err[256]) {
  memset(c, 0, sizeof *c);
  c->task_s = malloc((size_t)s->ntasks * sizeof *c->task_s);
  sample *v = malloc((size_t)s->ntasks * sizeof *v);
  int ok = c->task_s != NULL && v != NULL;
  lender len = {NULL, 0};
  int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (int32_t t = 0; ok && t < s->ntasks; t++)
    v[t] = (sample){s->key[t], 0.0, t};
  if (ok)
    qsort(v, (size_t)s->ntasks, sizeof *v, cmp_task);
  for (int32_t i = 0; ok && i < s->ntasks;) {
    int32_t j = i;
    while (j < s->ntasks && v[j].key == v[i].key)
      j++;
    double cost = 0.0;
    ok = measure_group(s, v + i, j - i, memset_bw, &len, &cost);
    for (int32_t k = i; ok && k < j; k++)
      c->task_s[v[k].task] = cost;
    c->groups++;
    i = j;
  }
  omp_set_num_threads(saved_threads);
  free(len.base);
  free(v);
  if (!ok) {
    snprintf(err, 256, "out of memory measuring tiles in isolation");
    sim_costs_free(c);
    return 0;
  }
  c->overhead_s = overhead_s;
  return 1;
}

void sim_costs_free(sim_costs *c) {
  free(c->task_s);
  memset(c, 0, sizeof *c);
}
