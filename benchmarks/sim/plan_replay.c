/* plan_replay: the time-aware planner against the FLOP-minimizing one on
 * simulated many-core machines, and its prediction against steps measured
 * here. On the default model (or --small), with kernel times measured by
 * the first steps of a 1-thread run: for a budget of the persistent bytes
 * plus half of everything_saveable's activation (transient) peak, at 32,
 * 64 and 128 cores on 1 and 2 nodes, the predicted step (sched/replay.c)
 * of the plan the planner makes scoring by replayed time, and of the plan
 * of least roofline recompute, each over everything_saveable's predicted
 * step; then, at 1 and 2 threads here, a budget's plan's predicted step
 * against the median of measured steps. Prints JSON lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "remat_gpt.h"
#include "runtime/compile/lifetimes.h"
#include "runtime/compile/measure.h"
#include "runtime/compile/predict.h"
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

/* The planner's decision for md's graph on a machine of `workers`:
 * by replayed time (time) or by least roofline recompute. */
static double plan_and_predict(model *md, int64_t budget, int workers,
                               int nodes, bool time) {
  plan_target t = {md->g, md->m.loss->id, true, REMAT_OPT_ADAMW,
                   "nothing_saveable", budget, workers, nodes,
                   time ? &md->rt->costs : NULL, 1, time, workers, nodes};
  remat_decision d;
  if (plan_remat(&t, &d) != REMAT_OK) {
    fprintf(stderr, "plan_replay: %s\n", remat_graph_error(md->g));
    return -1;
  }
  double s = predict(md, d.saved, workers, nodes);
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
      double timed = plan_and_predict(&all, budget, cores[c], nodes[n], 1);
      double flops = plan_and_predict(&all, budget, cores[c], nodes[n], 0);
      printf("{\"cores\": %d, \"nodes\": %d, \"budget\": %lld, "
             "\"everything_s\": %.5f, \"time_aware\": %.4f, "
             "\"flop_min\": %.4f}\n",
             cores[c], nodes[n], (long long)budget, base, timed / base,
             flops / base);
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
