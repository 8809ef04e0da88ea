/* sim_scaling: replays the compiled task DAG of the GPT-style model (the
 * options of bench_train) on simulated many-core NUMA machines, with task
 * durations measured on this machine, and checks itself against steps
 * measured here: the prediction for 1 and N threads next to the measured
 * median step (interleaved rounds after a warm-up). Prints the validation,
 * then the predicted step time, parallel efficiency, critical path,
 * remote bytes and memory peak for each number of cores and nodes, placed
 * and unplaced (sim_placement.h). --costs isolated measures tiles alone
 * and runs no step: for a model too large to run here. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "benchmarks/sim/sim_report.h"

typedef struct model {
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt gpt;
} model;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what) {
  fprintf(stderr, "sim_scaling: %s: %s\n", what, remat_last_error());
  return 0;
}

static void fill_batch(const remat_gpt_config *c, int32_t *tok, int32_t *tgt) {
  uint32_t x = 12345u;
  for (int i = 0; i < c->batch * c->seq; i++) {
    x = x * 1664525u + 1013904223u;
    tok[i] = (int32_t)((x >> 16) % (uint32_t)c->vocab);
  }
  for (int i = 0; i < c->batch * c->seq; i++)
    tgt[i] = (tok[i] * 7 + 3) % c->vocab;
}

static int model_open(model *m, const sim_options *o, int threads) {
  memset(m, 0, sizeof *m);
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_MEMORY_BUDGET,
                     .num_threads = threads, .policy = o->policy,
                     .memory_budget = o->budget};
  if (remat_runtime_create(&rc, &m->rt) != REMAT_OK)
    return fail("runtime");
  if (remat_graph_create(m->rt, &m->g) != REMAT_OK)
    return fail("graph");
  if (remat_gpt_build(m->g, &o->cfg, &m->gpt) != REMAT_OK)
    return fail("model");
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-4f, .weight_decay = 0.01f};
  if (remat_compile(m->g, m->gpt.loss, &opt) != REMAT_OK)
    return fail("compile");
  size_t n = (size_t)o->cfg.batch * (size_t)o->cfg.seq;
  int32_t *tok = malloc(n * 4), *tgt = malloc(n * 4);
  int ok = tok != NULL && tgt != NULL;
  if (ok) {
    fill_batch(&o->cfg, tok, tgt);
    ok = remat_feed(m->g, m->gpt.tokens, tok, n * 4) == REMAT_OK &&
         remat_feed(m->g, m->gpt.targets, tgt, n * 4) == REMAT_OK;
  }
  free(tok);
  free(tgt);
  return ok ? 1 : fail("feed");
}

static void model_close(model *m) {
  remat_graph_destroy(m->g);
  remat_runtime_destroy(m->rt);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
         (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* One step: its wall time, and the share of `threads` cores the process
 * had meanwhile (CPU time / (wall x threads); below 1 when the machine is
 * shared or workers idle). */
static int step(model *m, int threads, double *seconds, double *share) {
  remat_step_stats st = {.size = sizeof st};
  double cpu0 = cpu_seconds();
  if (remat_step(m->g, &st) != REMAT_OK)
    return fail("step");
  *seconds = st.seconds;
  if (share != NULL)
    *share = (cpu_seconds() - cpu0) / (st.seconds * threads);
  return 1;
}

/* One step of the 1-thread model with the runtime's trace written to
 * `path`. */
static int traced_step(model *m, const char *path, double *wall) {
  m->rt->config.trace_path = path;
  int ok = step(m, 1, wall, NULL);
  m->rt->config.trace_path = NULL;
  return ok;
}

typedef struct rounds {
  int n;
  char (*path)[40];
  double *trace_wall, *t1, *share1, *tn, *sharen;
} rounds;

static int rounds_open(rounds *r, int n) {
  r->n = n;
  r->path = calloc((size_t)n, sizeof *r->path);
  double *all = calloc((size_t)n * 5, sizeof *all);
  r->trace_wall = all;
  if (r->path == NULL || all == NULL)
    return 0;
  r->t1 = all + n;
  r->share1 = all + 2 * n;
  r->tn = all + 3 * n;
  r->sharen = all + 4 * n;
  for (int i = 0; i < n; i++) {
    snprintf(r->path[i], sizeof r->path[i], "/tmp/sim_scaling_XXXXXX");
    int fd = mkstemp(r->path[i]);
    if (fd < 0)
      return 0;
    close(fd);
  }
  return 1;
}

static void rounds_close(rounds *r) {
  for (int i = 0; r->path != NULL && i < r->n; i++)
    if (r->path[i][0] != '\0')
      unlink(r->path[i]);
  free(r->path);
  free(r->trace_wall);
}

/* Warm-up, then rounds of a traced step on 1 thread (for the costs), a
 * step on 1 thread and a step on N threads (measured); medians into
 * r->val[]. */
static int measure(model *one, model *many, const sim_step *s, sim_costs *c,
                   sim_report *r) {
  rounds k = {0};
  int N = r->o->threads;
  double warm;
  int ok = rounds_open(&k, r->o->steps) && step(one, 1, &warm, NULL) &&
           step(many, N, &warm, NULL);
  for (int i = 0; ok && i < k.n; i++)
    ok = traced_step(one, k.path[i], &k.trace_wall[i]) &&
         step(one, 1, &k.t1[i], &k.share1[i]) &&
         step(many, N, &k.tn[i], &k.sharen[i]);
  char err[256];
  const char *paths[SIM_MAX_ROUNDS];
  for (int i = 0; ok && i < k.n; i++)
    paths[i] = k.path[i];
  if (ok && !sim_costs_from_traces(s, paths, k.trace_wall, k.n, c, err)) {
    fprintf(stderr, "sim_scaling: %s\n", err);
    ok = 0;
  }
  if (ok) {
    r->val[0] = (sim_validation){1, median(k.t1, k.n), 0.0, median(k.share1, k.n)};
    r->val[1] = (sim_validation){N, median(k.tn, k.n), 0.0, median(k.sharen, k.n)};
    r->nval = 2;
  }
  rounds_close(&k);
  return ok;
}

/* Sum of isolated costs over sum of trace costs (tiles only). */
static double isolated_ratio(const sim_step *s, const sim_costs *trace,
                             double memset_bw) {
  sim_costs iso;
  char err[256];
  if (!sim_costs_isolated(s, memset_bw, 0.0, &iso, err))
    return 0.0;
  double a = 0.0, b = 0.0;
  for (int32_t t = 0; t < s->ntasks; t++)
    if (s->tile[t] >= 0) {
      a += iso.task_s[t];
      b += trace->task_s[t];
    }
  sim_costs_free(&iso);
  return b > 0 ? a / b : 0.0;
}

static sim_machine server(const sim_options *o, const sim_report *r,
                          int cores, int nodes) {
  return (sim_machine){.cores = cores, .nodes = nodes,
                       .mem_bw = o->mem_gbs * 1e9, .link_bw = o->link_gbs * 1e9,
                       .core_bw = r->core_bw,
                       .remote_latency = o->remote_latency,
                       .lock_s = o->lock_ns * 1e-9, .lock_remote = o->lock_remote,
                       .signal_s = o->signal_us * 1e-6,
                       .wake_s = o->wake_us * 1e-6, .spin_s = o->spin_us * 1e-6};
}

/* Predictions for this machine: one node whose memory serves what memset
 * reaches here with N threads. */
static int validate(const sim_step *s, const sim_costs *c, sim_report *r) {
  sim_layout l;
  if (!sim_layout_build(s, 1, false, NULL, 0, &l))
    return 0;
  int ok = 1;
  for (int i = 0; ok && i < r->nval; i++) {
    sim_machine m = server(r->o, r, r->val[i].threads, 1);
    m.mem_bw = r->here_bw;
    sim_result res;
    ok = sim_run(s, c, &l, &m, &res);
    r->val[i].predicted_s = res.step_s;
  }
  sim_layout_free(&l);
  return ok;
}

/* One layout, every core count. */
static int scale_layout(const sim_step *s, const sim_costs *c, int nodes,
                        bool placed, sim_report *r) {
  sim_layout l;
  if (!sim_layout_build(s, nodes, placed, r->splits, r->o->nsplits, &l))
    return 0;
  int ok = 1;
  for (int i = 0; ok && i < r->o->ncores; i++) {
    sim_row *row = &r->rows[r->nrows];
    sim_machine m = server(r->o, r, r->o->cores[i], nodes);
    ok = sim_run(s, c, &l, &m, &row->r);
    row->cores = m.cores;
    row->nodes = nodes;
    row->placed = placed;
    row->efficiency = r->one_core_s / (m.cores * row->r.step_s);
    r->nrows++;
    if (ok && nodes == 1) { /* placed and unplaced are the same machine */
      r->rows[r->nrows] = *row;
      r->rows[r->nrows++].placed = !placed;
    }
  }
  if (ok && nodes == 1 && r->npath == 0)
    ok = sim_report_set_path(r, &l);
  sim_layout_free(&l);
  return ok;
}

static int scale(const sim_step *s, const sim_costs *c, sim_report *r) {
  sim_layout l;
  sim_result one;
  sim_machine m = server(r->o, r, 1, 1);
  if (!sim_layout_build(s, 1, false, NULL, 0, &l))
    return 0;
  int ok = sim_run(s, c, &l, &m, &one);
  sim_layout_free(&l);
  r->one_core_s = one.step_s;
  r->rows = calloc((size_t)(2 * r->o->ncores * r->o->nnodes), sizeof *r->rows);
  ok = ok && r->rows != NULL;
  for (int j = 0; ok && j < r->o->nnodes; j++) {
    ok = scale_layout(s, c, r->o->nodes[j], false, r);
    if (ok && r->o->nodes[j] > 1)
      ok = scale_layout(s, c, r->o->nodes[j], true, r);
  }
  return ok;
}

static int costs_and_validation(const sim_options *o, model *one,
                                const sim_step *s, sim_costs *c,
                                sim_report *r) {
  char err[256];
  if (o->isolated) {
    if (sim_costs_isolated(s, r->core_bw, o->overhead_us * 1e-6, c, err))
      return 1;
    fprintf(stderr, "sim_scaling: %s\n", err);
    return 0;
  }
  model many;
  int ok = model_open(&many, o, o->threads) && measure(one, &many, s, c, r);
  model_close(&many);
  if (ok)
    r->isolated_over_trace = isolated_ratio(s, c, r->core_bw);
  return ok && validate(s, c, r);
}

int main(int argc, char **argv) {
  sim_options o;
  if (!sim_parse_args(argc, argv, &o))
    return 2;
  sim_report r = {.o = &o};
  for (int i = 0; i < o.nsplits; i++)
    r.splits[i] = (sim_split){o.split_name[i], o.split_parts[i]};
  r.core_bw = sim_memset_bw(1);
  r.here_bw = sim_memset_bw(o.threads);
  model one;
  sim_step s = {0};
  sim_costs c = {0};
  double t0 = now();
  int ok = model_open(&one, &o, 1) && sim_step_init(&s, one.g);
  r.s = &s;
  r.c = &c;
  double t1 = now();
  ok = ok && costs_and_validation(&o, &one, &s, &c, &r);
  double t2 = now();
  ok = ok && scale(&s, &c, &r);
  r.phase_s[0] = t1 - t0;
  r.phase_s[1] = t2 - t1;
  r.phase_s[2] = now() - t2;
  if (ok)
    sim_report_print(&r, stdout);
  else
    fprintf(stderr, "sim_scaling: the simulation failed (out of memory?)\n");
  free(r.rows);
  sim_costs_free(&c);
  sim_step_free(&s);
  model_close(&one);
  return ok ? 0 : 1;
}
