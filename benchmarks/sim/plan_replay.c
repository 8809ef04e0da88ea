/* plan_replay: the time-aware planner against the FLOP-minimizing one on
 * simulated many-core machines, and its prediction against steps measured
 * here. On the default model (or --small), with kernel times measured by
 * the first steps of a 1-thread run: for a budget of the persistent bytes
 * plus half of everything_saveable's activation (transient) peak, at 32,
 * 64 and 128 cores on 1 and 2 nodes, the predicted step (sched/replay.c)
 * of the plan the planner makes scoring by replayed time, and of the plan
 * of least roofline recompute, each over everything_saveable's predicted
 * step; then, at 1 and 2 threads here, a budget's plan's predicted step
 * against the median of measured steps. Prints JSON lines. With each
 * simulated figure goes a lower bound of the same plan's replayed step:
 * no task of the backward, recompute, checks or updates can start before
 * the seed (each follows it in the DAG), so the step is at least the
 * seed's start in the replay plus their work spread evenly over every
 * worker. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "remat_gpt.h"
#include "runtime/compile/lifetimes.h"
#include "runtime/compile/measure.h"
#include "runtime/compile/predict.h"
#include "runtime/compile/taskgraph.h"
#include "sched/replay.h"
#include "runtime/exec/step_state.h"

typedef struct model {
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
} model;

static remat_gpt_config cfg = {.layers = 8, .d_model = 512, .heads = 8,
                               .seq = 256, .batch = 8, .vocab = 256};

static int open_model(model *md, remat_runtime *rt, int threads,
                      const char *policy, int64_t budget) {
  memset(md, 0, sizeof *md);
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY,
                     .num_threads = threads, .policy = policy};
  if (rt == NULL && remat_runtime_create(&rc, &rt) != REMAT_OK)
    return 0;
  md->rt = rt;
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-4f};
  if (remat_graph_create(rt, &md->g) != REMAT_OK ||
      (budget > 0 && remat_graph_set_memory_budget(md->g, budget)) ||
      remat_gpt_build(md->g, &cfg, &md->m) != REMAT_OK ||
      remat_compile(md->g, md->m.loss, &opt) != REMAT_OK) {
    fprintf(stderr, "plan_replay: %s\n", remat_last_error());
    return 0;
  }
  size_t n = (size_t)cfg.batch * cfg.seq;
  int32_t *tok = malloc(n * 4);
  for (size_t i = 0; i < n; i++)
    tok[i] = (int32_t)((i * 7 + 3) % (size_t)cfg.vocab);
  int ok = remat_feed(md->g, md->m.tokens, tok, n * 4) == REMAT_OK &&
           remat_feed(md->g, md->m.targets, tok, n * 4) == REMAT_OK;
  free(tok);
  return ok;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
         (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* The median of `steps` steps after COST_STEPS (which fill the table);
 * *share (if not NULL) gets the CPU time of those steps over their wall
 * time x threads: below 1 when other processes took the cores. */
static double median_step(model *md, int steps, int threads, double *share) {
  double t[32], cpu = 0, wall = 0;
  remat_step_stats st = {.size = sizeof st};
  for (int i = 0; i < COST_STEPS + steps; i++) {
    double cpu0 = cpu_seconds();
    if (remat_step(md->g, &st) != REMAT_OK)
      return -1;
    if (i < COST_STEPS)
      continue;
    t[i - COST_STEPS] = st.seconds;
    cpu += cpu_seconds() - cpu0;
    wall += st.seconds;
  }
  if (share != NULL)
    *share = cpu / (wall * threads);
  qsort(t, (size_t)steps, sizeof *t, cmp_double);
  return t[steps / 2];
}

/* The predicted step of decision `saved` on a machine of `workers`. */
static double predict(model *md, const bool *saved, int workers, int nodes) {
  lower_request lr = {md->g, saved, md->m.loss->id, true, REMAT_OPT_ADAMW};
  plan_lowering l;
  double s = -1;
  if (lower_graph(&lr, &l) == REMAT_OK && lifetimes_assign(&l) == REMAT_OK) {
    predict_request pr = {md->g, &l, workers, nodes, 1, &md->rt->costs};
    if (predict_step_seconds(&pr, &s) != REMAT_OK)
      s = -1;
  }
  lowering_free(&l);
  return s;
}

/* A replay that records when each task starts (durations fixed). */
typedef struct timed_runner {
  const double *seconds;
  double now, *ends, *started;
  int nworkers;
} timed_runner;

static int timed_start(void *ctx, int32_t task, int worker, int node) {
  (void)node;
  timed_runner *f = ctx;
  f->ends[worker] = f->now + f->seconds[task];
  f->started[task] = f->now;
  return 1;
}

static double timed_next_end(void *ctx, int *worker) {
  const timed_runner *f = ctx;
  double first = INFINITY;
  for (int v = 0; v < f->nworkers; v++)
    if (f->ends[v] < first) {
      first = f->ends[v];
      *worker = v;
    }
  return first;
}

static void timed_advance(void *ctx, double t) { ((timed_runner *)ctx)->now = t; }

static void timed_end(void *ctx, int32_t task, int worker) {
  (void)task;
  ((timed_runner *)ctx)->ends[worker] = INFINITY;
}

static int no_body(void *run, void *arg, int worker) {
  (void)run;
  (void)arg;
  (void)worker;
  return 0;
}

/* What the replay of a decision spends after the seed. */
typedef struct after_seed {
  double makespan;  /* as predict_step_seconds */
  double seed;      /* when the seed's start task starts */
  double work;      /* seconds of every task of the seed and after */
  double recompute; /* of them, recompute tasks */
  double bound;     /* seed + work / workers */
} after_seed;

/* The replay of decision `saved` as predict_step_seconds makes it (the
 * same placement, DAG and timing), with each task's start recorded.
 * Returns 0 on failure. */
static int replay_after_seed(model *md, const bool *saved, int workers,
                             int nodes, after_seed *out) {
  lower_request lr = {md->g, saved, md->m.loss->id, true, REMAT_OPT_ADAMW};
  plan_lowering l;
  numa_plan numa;
  plan_tasks tasks;
  memset(&numa, 0, sizeof numa);
  memset(&tasks, 0, sizeof tasks);
  int ok = 0, *worker_node = malloc((size_t)workers * sizeof(int));
  int node_first[3];
  for (int k = 0; k <= nodes; k++)
    node_first[k] = k * workers / nodes;
  for (int k = 0; k < nodes; k++)
    for (int v = node_first[k]; v < node_first[k + 1]; v++)
      worker_node[v] = k;
  sched_placement place = {.nworkers = workers, .nnodes = nodes,
                           .worker_node = worker_node,
                           .node_first = node_first};
  task_bodies bodies = {no_body, no_body, no_body, NULL, NULL};
  if (lower_graph(&lr, &l) != REMAT_OK)
    return 0;
  taskgraph_request tr = {md->g, &l, &numa, 1, &bodies};
  if (lifetimes_assign(&l) == REMAT_OK &&
      numa_place(md->g, &l, &place, &numa) == REMAT_OK &&
      taskgraph_build(&tr, &tasks) == REMAT_OK &&
      taskgraph_finalize(&tasks) == REMAT_OK) {
    int32_t n = sched_dag_num_tasks(tasks.dag);
    double *seconds = calloc((size_t)n, sizeof *seconds);
    double *started = calloc((size_t)n, sizeof *started);
    double *ends = malloc((size_t)workers * sizeof *ends);
    int8_t *kind = calloc((size_t)n, 1);
    int32_t seed = -1;
    for (int32_t i = 0; i < l.nknodes; i++) {
      const plan_knode *kn = &l.knodes[i];
      double tile = predict_tile_seconds(&l, kn, &md->rt->costs);
      if (kn->kind == KNODE_SEED)
        seed = tasks.start_task[i];
      for (int64_t k = 1; k <= kn->tiles; k++) {
        seconds[tasks.done_task[i] + k] = tile;
        kind[tasks.done_task[i] + k] = (int8_t)kn->kind;
      }
    }
    for (int v = 0; v < workers; v++)
      ends[v] = INFINITY;
    timed_runner f = {seconds, 0.0, ends, started, workers};
    sched_replay_runner r = {&f, timed_start, timed_next_end, timed_advance,
                             timed_end};
    sched_replay_timing tm = {.overhead_s = PREDICT_TASK_OVERHEAD_S,
                              .lock_s = PREDICT_LOCK_S,
                              .lock_remote = 1.0,
                              .wake_s = PREDICT_WAKE_S};
    sched_replay_dag d;
    sched_replay_owned owned;
    if (seed >= 0 && sched_replay_dag_of(tasks.dag, &d, &owned)) {
      ok = sched_replay(&d, workers, nodes, &tm, &r, &out->makespan);
      sched_replay_owned_free(&owned);
    }
    out->seed = seed >= 0 ? started[seed] : 0;
    out->work = out->recompute = 0;
    for (int32_t t = 0; ok && t < n; t++)
      if (kind[t] != KNODE_FORWARD && seconds[t] > 0) {
        out->work += seconds[t];
        if (kind[t] == KNODE_RECOMPUTE)
          out->recompute += seconds[t];
      }
    out->bound = out->seed + out->work / workers;
    free(seconds);
    free(started);
    free(ends);
    free(kind);
  }
  plan_tasks_free(&tasks);
  numa_plan_free(&numa);
  lowering_free(&l);
  free(worker_node);
  return ok;
}

/* The planner's decision for md's graph on a machine of `workers`:
 * by replayed time (time) or by least roofline recompute. */
static double plan_and_predict(model *md, int64_t budget, int workers,
                               int nodes, bool time, after_seed *as) {
  plan_target t = {md->g, md->m.loss->id, true, REMAT_OPT_ADAMW,
                   "nothing_saveable", budget, workers, nodes,
                   time ? &md->rt->costs : NULL, 1, time, workers, nodes};
  remat_decision d;
  if (plan_remat(&t, &d) != REMAT_OK) {
    fprintf(stderr, "plan_replay: %s\n", remat_graph_error(md->g));
    return -1;
  }
  double s = predict(md, d.saved, workers, nodes);
  if (!replay_after_seed(md, d.saved, workers, nodes, as))
    s = -1;
  decision_free(&d);
  return s;
}

/* persistent + half of everything_saveable's transient peak, with the
 * persistent bytes of a machine of `workers` (scratch per worker) */
static int64_t half_budget(model *all, int workers, int nodes) {
  lower_request lr = {all->g, all->g->step->compiled.decision.saved,
                      all->m.loss->id, true, REMAT_OPT_ADAMW};
  plan_measures m;
  if (measure_decision(&lr, workers, nodes, NULL, &m) != REMAT_OK)
    return -1;
  int64_t b = m.persistent + (m.peak - m.persistent) / 2;
  measures_free(&m);
  return b;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--small") == 0)
    cfg = (remat_gpt_config){.layers = 4, .d_model = 128, .heads = 4,
                             .seq = 64, .batch = 4, .vocab = 64};
  model all;
  if (!open_model(&all, NULL, 1, "everything_saveable", 0))
    return 1;
  double t1_all = median_step(&all, 3, 1, NULL);
  printf("{\"measured_1thread_everything_s\": %.4f}\n", t1_all);
  const int cores[] = {32, 64, 128}, nodes[] = {1, 2};
  for (int c = 0; c < 3; c++)
    for (int n = 0; n < 2; n++) {
      int64_t budget = half_budget(&all, cores[c], nodes[n]);
      double base = predict(&all, all.g->step->compiled.decision.saved,
                            cores[c], nodes[n]);
      after_seed ae, at, af;
      double timed =
          plan_and_predict(&all, budget, cores[c], nodes[n], 1, &at);
      double flops =
          plan_and_predict(&all, budget, cores[c], nodes[n], 0, &af);
      if (base < 0 || timed < 0 || flops < 0 ||
          !replay_after_seed(&all, all.g->step->compiled.decision.saved,
                             cores[c], nodes[n], &ae))
        return 1;
      /* busy: the share of the workers' time after the seed that
         everything_saveable's replay fills; recompute at 1.05: the most
         recompute work a plan can add for its bound to stay at 1.05x
         everything_saveable's step */
      printf("{\"cores\": %d, \"nodes\": %d, \"budget\": %lld, "
             "\"everything_s\": %.5f, \"seed_s\": %.5f, "
             "\"busy_after_seed\": %.3f, \"recompute_s_at_1.05\": %.4f, "
             "\"time_aware\": %.4f, "
             "\"time_aware_recompute_s\": %.4f, \"time_aware_bound\": "
             "%.4f, \"flop_min\": %.4f, \"flop_min_recompute_s\": %.4f, "
             "\"flop_min_bound\": %.4f}\n",
             cores[c], nodes[n], (long long)budget, base, ae.seed,
             ae.work / (cores[c] * (ae.makespan - ae.seed)),
             cores[c] * (1.05 * base - ae.seed) - ae.work, timed / base,
             at.recompute, at.bound / base, flops / base, af.recompute,
             af.bound / base);
    }
  for (int threads = 1; threads <= 2; threads++) {
    model warm, md;
    if (!open_model(&warm, NULL, threads, "nothing_saveable", 0) ||
        median_step(&warm, 1, threads, NULL) < 0)
      return 1;
    int64_t budget = half_budget(&all, threads, 1);
    if (!open_model(&md, warm.rt, threads, "nothing_saveable", budget))
      return 1;
    double share;
    double measured = median_step(&md, 5, threads, &share);
    double predicted =
        predict(&md, md.g->step->compiled.decision.saved, threads, 1);
    printf("{\"threads\": %d, \"budget\": %lld, \"predicted_s\": %.4f, "
           "\"measured_s\": %.4f, \"ratio\": %.3f, \"cpu_share\": %.3f}\n",
           threads, (long long)budget, predicted, measured,
           predicted / measured, share);
    remat_graph_destroy(md.g);
    remat_graph_destroy(warm.g);
    remat_runtime_destroy(warm.rt);
  }
  remat_graph_destroy(all.g);
  remat_runtime_destroy(all.rt);
  return 0;
}
