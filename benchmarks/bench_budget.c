/* bench_budget: the memory budget's plan report. A GPT is compiled under
 * policy auto at budgets spread from the smallest feasible one (the peak of
 * saving nothing) to the peak of saving everything, each on its own
 * runtime; their steps run in interleaved rounds after a warm-up (the 3
 * steps that measure kernel times, after which the graph re-plans, and
 * one more), and one JSON line per budget reports the predicted and
 * measured peaks, the median step time, the recompute FLOPs the plan
 * scheduled and the plan (what each region saves). A last line sums up:
 * whether every measured peak stayed within its budget, and how often a
 * larger budget's step was slower than the smaller one's by more than the
 * noise allowance. With
 * --compare-replan each budget also runs on a runtime created with
 * REMAT_BENCH_NO_REPLAN (the plan of its compile kept), interleaved, so
 * that every timed step of the main run is of the plan its first steps'
 * times chose; each line then says whether that plan differs and the
 * ratio of the medians. With
 * --compare-per-region each budget also runs on a runtime created with
 * REMAT_BENCH_PER_REGION (the planner choosing among the four built-in
 * policies per region, no per-tensor save sets), interleaved, after the
 * same warm-up (both re-plan after their measured steps), a budget's two
 * runs stepping one after the other (in turns first); each line then
 * gives both runs' step times, medians and peaks, the ratio of the
 * medians, the median of the rounds' ratios and both plans.
 * --lo-policy/--hi-policy set the policies whose peaks bound the budgets
 * (nothing_saveable and everything_saveable by default), --interior
 * leaves the two ends out (K budgets evenly inside the span). */
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/bench_util.h"
#include "remat.h"
#include "remat_gpt.h"

typedef struct options {
  remat_gpt_config cfg;
  int threads, budgets, steps;
  int compare_replan; /* --compare-replan */
  int compare_per_region; /* --compare-per-region */
  int interior;       /* --interior: the budgets inside (lo, hi) */
  const char *lo_policy, *hi_policy; /* whose peaks bound the budgets */
  double noise; /* a slower step within this fraction is noise */
} options;

typedef struct run {
  int64_t budget;
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  remat_step_stats st;
  double *times;
  int64_t peak;
} run;


static int fail(const char *what, int64_t budget) {
  fprintf(stderr, "bench_budget: %s (budget %lld): %s\n", what,
          (long long)budget, remat_last_error());
  return 1;
}

/* Opens a run of the model under `policy` (and `budget`, 0 none). */
static int run_open(run *r, const options *o, const char *policy,
                    int64_t budget) {
  memset(r, 0, sizeof *r);
  r->budget = budget;
  r->st.size = sizeof r->st;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_MEMORY_BUDGET,
                     .num_threads = o->threads, .policy = policy,
                     .memory_budget = budget};
  if (remat_runtime_create(&rc, &r->rt) != REMAT_OK ||
      remat_graph_create(r->rt, &r->g) != REMAT_OK ||
      remat_gpt_build(r->g, &o->cfg, &r->m) != REMAT_OK)
    return fail("build", budget);
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-4f};
  if (remat_compile(r->g, r->m.loss, &opt) != REMAT_OK)
    return fail("compile", budget);
  r->times = calloc((size_t)o->steps + 1, sizeof *r->times);
  if (r->times == NULL) {
    fprintf(stderr, "bench_budget: out of memory\n");
    return 1;
  }
  return bench_feed_batch(r->g, &r->m, &o->cfg) == REMAT_OK
             ? 0
             : fail("feed", budget);
}

static void run_close(run *r) {
  remat_graph_destroy(r->g);
  remat_runtime_destroy(r->rt);
  free(r->times);
}

/* Step k of a run (k < warm: the warm-up, untimed). */
static int run_step(run *r, int k, int warm) {
  if (remat_step(r->g, &r->st) != REMAT_OK)
    return fail("step", r->budget);
  if (k >= warm)
    r->times[k - warm] = r->st.seconds;
  if (r->st.peak_bytes > r->peak)
    r->peak = r->st.peak_bytes;
  return 0;
}

/* The predicted peak of the model under a fixed policy. */
static int64_t policy_peak(const options *o, const char *policy) {
  run r;
  int64_t peak = -1;
  if (run_open(&r, o, policy, 0) == 0 && run_step(&r, 0, 1) == 0)
    peak = r.st.predicted_peak_bytes;
  run_close(&r);
  return peak;
}

/* Whether two graphs of the same model save the same tensors. */
static bool same_plan(remat_graph *a, remat_graph *b) {
  for (int i = 0; i < remat_num_tensors(a); i++) {
    remat_tensor_plan pa, pb;
    if (remat_tensor_plan_of(a, remat_tensor_at(a, i), &pa) != REMAT_OK ||
        remat_tensor_plan_of(b, remat_tensor_at(b, i), &pb) != REMAT_OK ||
        pa.saved != pb.saved || pa.recomputed != pb.recomputed)
      return false;
  }
  return true;
}

/* The median of n times (n > 0), left in their order; -1 if out of
 * memory. */
static double median(const double *times, int n) {
  double *v = malloc((size_t)n * sizeof *v), m = -1;
  if (v != NULL) {
    memcpy(v, times, (size_t)n * sizeof *v);
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    m = v[n / 2];
  }
  free(v);
  return m;
}

/* n times as a JSON array, in the order they were taken. */
static void print_times(const double *times, int n) {
  printf("[");
  for (int k = 0; k < n; k++)
    printf("%s%.4f", k ? "," : "", times[k]);
  printf("]");
}

/* The plan as a JSON member named `key`: region by region, the policy it
 * got. */
static void print_plan(const char *key, remat_graph *g) {
  int last_region = -1;
  printf("\"%s\":[", key);
  for (int i = 0; i < remat_num_tensors(g); i++) {
    remat_tensor_plan tp;
    if (remat_tensor_plan_of(g, remat_tensor_at(g, i), &tp) != REMAT_OK ||
        tp.region <= last_region)
      continue;
    printf("%s\"", last_region >= 0 ? "," : "");
    for (const char *c = tp.policy; *c; c++)
      printf(*c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
    printf("\"");
    last_region = tp.region;
  }
  printf("]");
}

static int parse(int argc, char **argv, options *o) {
  static const struct option longopts[] = {
      {"layers", 1, 0, 'L'},  {"d-model", 1, 0, 'D'}, {"heads", 1, 0, 'H'},
      {"seq", 1, 0, 'T'},     {"batch", 1, 0, 'B'},   {"vocab", 1, 0, 'V'},
      {"threads", 1, 0, 'N'}, {"budgets", 1, 0, 'K'}, {"steps", 1, 0, 'S'},
      {"compare-replan", 0, 0, 'R'}, {"compare-per-region", 0, 0, 'P'},
      {"lo-policy", 1, 0, 'l'}, {"hi-policy", 1, 0, 'u'},
      {"interior", 0, 0, 'I'}, {"help", 0, 0, 'h'},
      {0, 0, 0, 0}};
  *o = (options){.cfg = {.layers = 4, .d_model = 256, .heads = 4,
                         .seq = 128, .batch = 4, .vocab = 256},
                 .threads = 2, .budgets = 20, .steps = 3, .noise = 0.05,
                 .lo_policy = "nothing_saveable",
                 .hi_policy = "everything_saveable"};
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    if (c == 'h' || c == '?') {
      fprintf(c == 'h' ? stdout : stderr,
              "usage: bench_budget [--layers L] [--d-model D] [--heads H] "
              "[--seq T]\n"
              "                    [--batch B] [--vocab V] [--threads N] "
              "[--budgets K] [--steps S]\n"
              "                    [--compare-replan | --compare-per-region]\n"
              "                    [--lo-policy P] [--hi-policy P] "
              "[--interior]\n"
              "defaults: L=4 D=256 H=4 T=128 B=4 V=256 N=2 K=20 S=3: K "
              "budgets from\nthe peak of nothing_saveable to that of "
              "everything_saveable, S timed\nsteps each after a warm-up "
              "of 4 (the 3 that measure kernel times, then\none of the "
              "re-planned graph), in interleaved rounds\n"
              "--compare-replan: each budget also on a runtime that keeps "
              "its compiled\nplan (REMAT_BENCH_NO_REPLAN), interleaved\n"
              "--compare-per-region: each budget also on a runtime whose "
              "planner chooses\namong the four built-in policies per region "
              "(REMAT_BENCH_PER_REGION),\nthe two of a budget stepping in "
              "turn, after the same warm-up\n"
              "--lo-policy, --hi-policy: the budgets span the peaks of these "
              "policies\n(default nothing_saveable, everything_saveable); "
              "--interior: K budgets\nevenly inside the span, its ends "
              "left out\n");
      return c == 'h' ? -1 : 1;
    }
    if (c == 'R' || c == 'P' || c == 'I') {
      *(c == 'R' ? &o->compare_replan
                 : c == 'P' ? &o->compare_per_region : &o->interior) = 1;
      continue;
    }
    if (c == 'l' || c == 'u') {
      *(c == 'l' ? &o->lo_policy : &o->hi_policy) = optarg;
      continue;
    }
    const char *name = "";
    for (int k = 0; longopts[k].name != NULL; k++)
      if (longopts[k].val == c)
        name = longopts[k].name;
    char *end;
    long v = strtol(optarg, &end, 10);
    if (*optarg == '\0' || *end != '\0' || v < 1 || v > 100000 ||
        (c == 'K' && v < 2)) {
      fprintf(stderr, "bench_budget: --%s '%s': expected a whole number "
                      ">= %d\n",
              name, optarg, c == 'K' ? 2 : 1);
      return 1;
    }
    switch (c) {
    case 'L': o->cfg.layers = (int)v; break;
    case 'D': o->cfg.d_model = (int)v; break;
    case 'H': o->cfg.heads = (int)v; break;
    case 'T': o->cfg.seq = (int)v; break;
    case 'B': o->cfg.batch = (int)v; break;
    case 'V': o->cfg.vocab = (int)v; break;
    case 'N': o->threads = (int)v; break;
    case 'K': o->budgets = (int)v; break;
    case 'S': o->steps = (int)v; break;
    }
  }
  if (o->compare_replan && o->compare_per_region) {
    fprintf(stderr, "bench_budget: --compare-replan and "
                    "--compare-per-region: choose one\n");
    return 1;
  }
  return 0;
}

/* Budget i of o->budgets: from lo to hi, both included, or (--interior)
 * evenly inside. */
static int64_t budget_at(const options *o, int64_t lo, int64_t hi, int i) {
  if (o->interior)
    return lo + (hi - lo) * (i + 1) / (o->budgets + 1);
  return lo + (hi - lo) * i / (o->budgets - 1);
}

int main(int argc, char **argv) {
  options o;
  int rc = parse(argc, argv, &o);
  if (rc != 0)
    return rc < 0 ? 0 : 2;
  int64_t lo = policy_peak(&o, o.lo_policy);
  int64_t hi = policy_peak(&o, o.hi_policy);
  if (lo < 0 || hi < 0)
    return 1;
  if (hi <= lo) {
    fprintf(stderr, "bench_budget: the peak of %s (%lld) is not above that "
                    "of %s (%lld)\n", o.hi_policy, (long long)hi,
            o.lo_policy, (long long)lo);
    return 1;
  }
  int compare = o.compare_replan || o.compare_per_region;
  int nruns = compare ? 2 * o.budgets : o.budgets;
  /* the steps that measure kernel times (after which a budget's graph
   * re-plans), then one, so that every timed step runs the final plan */
  int warm = 4;
  const char *second_env = o.compare_replan ? "REMAT_BENCH_NO_REPLAN"
                                            : "REMAT_BENCH_PER_REGION";
  run *runs = calloc((size_t)nruns, sizeof *runs);
  if (runs == NULL)
    return 1;
  int opened = 0;
  for (; opened < nruns && rc == 0; opened++) {
    int i = opened % o.budgets;
    if (opened >= o.budgets) /* read when the runtime is created */
      setenv(second_env, "1", 1);
    rc = run_open(&runs[opened], &o, "auto", budget_at(&o, lo, hi, i));
    unsetenv(second_env);
  }
  /* Interleaved rounds, every other one in reverse order, so that no run
   * always follows the same one. Comparing per-region plans, a budget's
   * two runs step one after the other, in turns first, so that both see
   * the same load and each round gives a ratio. */
  for (int k = 0; k < warm + o.steps && rc == 0; k++)
    for (int j = 0; j < nruns && rc == 0; j++) {
      int i = k % 2 ? nruns - 1 - j : j;
      if (o.compare_per_region)
        i = j / 2 + ((j + k) % 2 ? o.budgets : 0);
      rc = run_step(&runs[i], k, warm);
    }
  int within = 1, slower = 0, faster = 0, not_slower = 0;
  double prev = 0;
  for (int i = 0; i < o.budgets && rc == 0; i++) {
    run *r = &runs[i];
    double med = median(r->times, o.steps);
    within &= r->peak <= r->budget;
    slower += i > 0 && med > prev * (1.0 + o.noise);
    prev = med;
    printf("{\"budget\":%lld,\"predicted_peak_bytes\":%lld,"
           "\"peak_bytes\":%lld,\"step_s_median\":%.6f,"
           "\"recompute_flops\":%.6g,\"threads\":%d,",
           (long long)r->budget, (long long)r->st.predicted_peak_bytes,
           (long long)r->peak, med, r->st.recompute_flops, o.threads);
    if (o.compare_replan) {
      run *k = &runs[o.budgets + i];
      double kept = median(k->times, o.steps);
      within &= k->peak <= k->budget;
      printf("\"replanned\":%s,\"compiled_plan_step_s_median\":%.6f,"
             "\"step_ratio_to_compiled_plan\":%.4f,",
             same_plan(r->g, k->g) ? "false" : "true", kept, med / kept);
    }
    if (o.compare_per_region) {
      run *p = &runs[o.budgets + i];
      double *pair = malloc((size_t)o.steps * sizeof *pair);
      if (pair == NULL) {
        rc = 1;
        break;
      }
      printf("\"step_s\":");
      print_times(r->times, o.steps);
      printf(",\"per_region_step_s\":");
      print_times(p->times, o.steps);
      for (int k = 0; k < o.steps; k++) /* the same round's two steps */
        pair[k] = r->times[k] / p->times[k];
      printf(",\"round_ratio_median\":%.4f,", median(pair, o.steps));
      free(pair);
      double per = median(p->times, o.steps);
      within &= p->peak <= p->budget;
      not_slower += med <= per;
      faster += med < per;
      printf("\"per_region_recompute_flops\":%.6g,"
             "\"per_region_predicted_peak_bytes\":%lld,"
             "\"per_region_peak_bytes\":%lld,"
             "\"per_region_step_s_median\":%.6f,"
             "\"step_ratio_to_per_region\":%.4f,\"same_plan\":%s,",
             p->st.recompute_flops, (long long)p->st.predicted_peak_bytes,
             (long long)p->peak, per,
             med / per, same_plan(r->g, p->g) ? "true" : "false");
    }
    print_plan("plan", r->g);
    if (o.compare_per_region) {
      printf(",");
      print_plan("per_region_plan", runs[o.budgets + i].g);
    }
    printf("}\n");
  }
  if (rc == 0) {
    printf("{\"budgets\":%d,\"lo_policy\":\"%s\",\"lo_peak_bytes\":%lld,"
           "\"hi_policy\":\"%s\",\"hi_peak_bytes\":%lld,"
           "\"all_within_budget\":%s,"
           "\"slower_than_smaller_budget\":%d,\"noise\":%.2f",
           o.budgets, o.lo_policy, (long long)lo, o.hi_policy, (long long)hi,
           within ? "true" : "false", slower, o.noise);
    if (o.compare_per_region)
      printf(",\"not_slower_than_per_region\":%d,"
             "\"faster_than_per_region\":%d",
             not_slower, faster);
    printf("}\n");
  }
  for (int i = 0; i < opened; i++)
    run_close(&runs[i]);
  free(runs);
  return rc;
}
