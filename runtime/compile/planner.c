/* Stage "plan remat" (planner.h): resolves each region's policy (its own,
 * or the runtime's default) and decides which activations are saved. With
 * a memory budget, the regions that name no policy (or name "auto") get,
 * per top-level region, the candidate that fits the budget with the least
 * recompute cost: one of four built-in policies or a per-tensor save set
 * (the region's tensors ranked by recompute cost per byte, a prefix of the
 * ranking saved). Each candidate is measured once for every region (saved
 * bytes, working bytes, recompute cost), a dynamic program over the chain
 * of regions picks the assignment, and the assignment's peak is measured
 * (tightening the model budget by any excess and planning again). Every
 * measurement goes through measure_decision, which leaves nothing behind. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/measure.h"
#include "runtime/compile/planner.h"
#include "runtime/compile/predict.h"
#include "runtime/compile/lifetimes.h"
#include "runtime/policy/policy.h"

/* ---- the chain optimizer ---- */

int64_t chain_peak(const chain_region *r, int n, int64_t tail,
                   const int *choice) {
  int64_t saved = 0, peak = 0;
  for (int i = 0; i < n; i++) {
    int64_t at = saved + r[i].working[choice[i]];
    if (at > peak)
      peak = at;
    saved += r[i].saved[choice[i]];
  }
  return saved + tail > peak ? saved + tail : peak;
}

typedef struct frontier_entry {
  int64_t saved, peak;
  double cost;
  int32_t parent; /* index in the previous frontier */
  int8_t choice;
} frontier_entry;

/* Orders by saved bytes, then cost, then peak. */
static int cmp_entry(const frontier_entry *x, const frontier_entry *y) {
  if (x->saved != y->saved)
    return x->saved < y->saved ? -1 : 1;
  if (x->cost != y->cost)
    return x->cost < y->cost ? -1 : 1;
  return (x->peak > y->peak) - (x->peak < y->peak);
}

/* The next level's entries in order of saved bytes: the previous frontier
 * (ordered, saved strictly increasing) extended by each choice gives one
 * ordered list per choice, and these are merged, so that a level costs
 * O(frontier x choices), no sort. Extensions over the budget are left out.
 * Returns how many were written to `out`. */
static int extend(const frontier_entry *prev, int nprev, const chain_region *r,
                  int64_t budget, frontier_entry *out) {
  int at[PLANNER_MAX_CHOICES] = {0}, m = 0;
  for (;;) {
    frontier_entry best;
    int from = -1;
    for (int c = 0; c < r->nchoices; c++) {
      while (at[c] < nprev && prev[at[c]].saved + r->working[c] > budget)
        at[c]++;
      if (at[c] == nprev)
        continue;
      const frontier_entry *p = &prev[at[c]];
      int64_t live = p->saved + r->working[c];
      frontier_entry e = {p->saved + r->saved[c],
                          live > p->peak ? live : p->peak,
                          p->cost + r->recompute[c], at[c], (int8_t)c};
      if (from < 0 || cmp_entry(&e, &best) < 0) {
        best = e;
        from = c;
      }
    }
    if (from < 0)
      return m;
    out[m++] = best;
    at[from]++;
  }
}

/* Keeps, of entries ordered by saved bytes, those that no entry with fewer
 * saved bytes matches in cost: whatever follows, an entry that saves no
 * more and costs no more does at least as well (every constraint is
 * "saved so far + working <= budget"). Past CHAIN_FRONTIER_MAX entries,
 * only the first (fewest saved bytes) of each of CHAIN_FRONTIER_MAX equal
 * ranges of saved bytes is kept, and the cheapest: every entry kept is
 * still a real assignment, measured exactly, so the plan fits; only its
 * recompute may exceed the least by what the thinning dropped. Keeps the
 * planner's time and memory linear in the regions. */
static int prune(frontier_entry *f, int n) {
  int kept = 0;
  for (int i = 0; i < n; i++)
    if (kept == 0 || f[i].cost < f[kept - 1].cost)
      f[kept++] = f[i];
  if (kept <= CHAIN_FRONTIER_MAX)
    return kept;
  int64_t lo = f[0].saved, width = (f[kept - 1].saved - lo) /
                                   CHAIN_FRONTIER_MAX + 1;
  int thin = 0;
  for (int i = 0; i < kept; i++)
    if (thin == 0 || i == kept - 1 ||
        (f[i].saved - lo) / width != (f[thin - 1].saved - lo) / width)
      f[thin++] = f[i];
  return thin;
}

/* The frontiers of every level of the chain's dynamic program. */
typedef struct chain_levels {
  frontier_entry **levels; /* [n + 1] */
  int *sizes;              /* [n + 1] */
  int n;
} chain_levels;

static void levels_free(chain_levels *lv) {
  for (int i = 0; lv->levels != NULL && i <= lv->n; i++)
    free(lv->levels[i]);
  free(lv->levels);
  free(lv->sizes);
}

/* Builds every level; returns 0, or -2 when out of memory. */
static int levels_build(const chain_region *r, int n, int64_t budget,
                        chain_levels *lv) {
  lv->n = n;
  lv->levels = remat__calloc((size_t)n + 1, sizeof *lv->levels);
  lv->sizes = remat__calloc((size_t)n + 1, sizeof *lv->sizes);
  if (lv->levels == NULL || lv->sizes == NULL)
    return -2;
  frontier_entry **levels = lv->levels;
  int *sizes = lv->sizes;
  levels[0] = remat__calloc(1, sizeof **levels);
  if (levels[0] == NULL)
    return -2;
  levels[0][0] = (frontier_entry){0, 0, 0.0, -1, 0};
  sizes[0] = 1;
  for (int i = 0; i < n; i++) {
    int cap = sizes[i] * r[i].nchoices;
    levels[i + 1] =
        remat__malloc((size_t)(cap > 0 ? cap : 1) * sizeof **levels);
    if (levels[i + 1] == NULL)
      return -2;
    int m = extend(levels[i], sizes[i], &r[i], budget, levels[i + 1]);
    sizes[i + 1] = prune(levels[i + 1], m);
    frontier_entry *fit = remat__realloc(
        levels[i + 1], (size_t)(sizes[i + 1] > 0 ? sizes[i + 1] : 1) *
                           sizeof **levels);
    if (fit != NULL) /* kept to the frontier's size: memory O(regions) */
      levels[i + 1] = fit;
  }
  return 0;
}

/* The final entries whose peak (with the tail) fits, into `fits` in order
 * of cost, then peak; returns how many, or -2 when out of memory. */
static int final_fits(chain_levels *lv, int64_t tail, int64_t budget,
                      int **fits) {
  int n = lv->n, m = 0;
  *fits = remat__malloc(((size_t)lv->sizes[n] + 1) * sizeof **fits);
  if (*fits == NULL)
    return -2;
  for (int e = 0; e < lv->sizes[n]; e++) {
    frontier_entry *f = &lv->levels[n][e];
    int64_t peak = f->saved + tail > f->peak ? f->saved + tail : f->peak;
    if (peak > budget)
      continue;
    f->peak = peak;
    int at = m++;
    for (; at > 0; at--) { /* insertion: frontiers are short */
      const frontier_entry *g = &lv->levels[n][(*fits)[at - 1]];
      if (g->cost < f->cost || (g->cost == f->cost && g->peak <= f->peak))
        break;
      (*fits)[at] = (*fits)[at - 1];
    }
    (*fits)[at] = e;
  }
  return m;
}

static void backtrack(const chain_levels *lv, int e, int *choice) {
  for (int i = lv->n; i > 0; i--) {
    choice[i - 1] = lv->levels[i][e].choice;
    e = lv->levels[i][e].parent;
  }
}

int chain_plans(const chain_region *r, int n, int64_t tail, int64_t budget,
                int max, int *choices) {
  chain_levels lv = {0};
  int *fits = NULL;
  int m = levels_build(r, n, budget, &lv);
  if (m == 0)
    m = final_fits(&lv, tail, budget, &fits);
  int taken = m < 0 ? m : m < max ? m : max;
  for (int k = 0; k < taken; k++) {
    /* the cheapest, then evenly along the rest up to the last */
    int e = taken == 1 ? 0 : (int)((int64_t)k * (m - 1) / (taken - 1));
    backtrack(&lv, fits[e], choices + (size_t)k * (size_t)n);
  }
  free(fits);
  levels_free(&lv);
  return m == 0 ? -1 : taken;
}

int chain_plan(const chain_region *r, int n, int64_t tail, int64_t budget,
               int *choice) {
  int got = chain_plans(r, n, tail, budget, 1, choice);
  return got < 0 ? got : 0;
}

/* ---- planning the graph ---- */

static const char *const candidate_names[PLANNER_POLICY_CHOICES] = {
    "everything_saveable", "dots_saveable",
    "dots_with_no_batch_dims_saveable", "nothing_saveable"};

typedef struct planner {
  const plan_target *t;
  remat_graph *g;
  remat_decision *out;                /* the decision, committed once */
  remat_decision scratch;             /* the candidate being measured */
  int *chosen;                        /* [ntops]: the candidate per
                                         top-level region to commit */
  remat_policy *fallback;
  remat_policy *candidates[PLANNER_POLICY_CHOICES];
  const remat_policy **region_policy; /* [nregions] */
  bool *free_region;                  /* [nregions]: top-level, planned */
  int32_t *tops;                      /* top-level regions in order */
  int ntops;
  chain_region *chain;                /* [ntops] */
  chain_region *roofline_chain;       /* [ntops]: recompute by the
                                         roofline alone */
  int64_t tail;
  int64_t persistent;
  int nsets;                          /* per-tensor candidates */
  int ncand;                          /* PLANNER_POLICY_CHOICES + nsets */
  int32_t *rank;                      /* [ntensors]: place in its top-level
                                         region's ranking, -1 unranked */
  int32_t *ranked;                    /* [ntops]: tensors each ranks */
  int32_t *top_of_tensor;             /* [ntensors]: index in tops */
} planner;

/* The candidate index of nothing_saveable, under the per-tensor sets. */
#define NOTHING_CHOICE 3

/* How many of a region's `m` ranked tensors per-tensor candidate c saves:
 * the k-th set of n saves round(k m / (n + 1)). */
static int32_t set_size(const planner *pl, int c, int32_t m) {
  int64_t k = c - PLANNER_POLICY_CHOICES + 1, n = pl->nsets + 1;
  return (int32_t)((k * m + n / 2) / n);
}

static bool is_auto(const remat_policy *pol) {
  return pol != NULL && pol->kind == POLICY_AUTO;
}

static bool planned_region(const planner *pl, int32_t r) {
  const graph_region *reg = &pl->g->regions[r];
  return pl->free_region[reg->top] &&
         (reg->policy == NULL || is_auto(reg->policy));
}

/* Gives every region its policy, the candidate `choice` under a planned
 * top-level region, and decides every tensor into `into` (the planner's
 * scratch while measuring, its output when committing). */
static remat_status decide(planner *pl, const int *choice,
                           remat_decision *into) {
  remat_graph *g = pl->g;
  for (int32_t r = 0; r < g->nregions; r++) {
    const graph_region *reg = &g->regions[r];
    pl->region_policy[r] = reg->policy ? reg->policy : pl->fallback;
    into->source[r] = reg->policy ? REGION_OWN : REGION_DEFAULT;
    for (int t = 0; t < pl->ntops; t++)
      if (pl->tops[t] == reg->top && planned_region(pl, r)) {
        int c = choice[t] < PLANNER_POLICY_CHOICES ? choice[t]
                                                   : NOTHING_CHOICE;
        pl->region_policy[r] = pl->candidates[c];
        into->source[r] = REGION_BUDGET;
      }
  }
  remat_status s = policy_decide_with(g, into->saved, into->deciding_region,
                                      pl->region_policy);
  for (int32_t x = 0; pl->rank != NULL && x < g->ntensors; x++) {
    if (pl->rank[x] < 0)
      continue;
    int t = pl->top_of_tensor[x];
    if (choice[t] >= PLANNER_POLICY_CHOICES &&
        pl->rank[x] < set_size(pl, choice[t], pl->ranked[t]))
      into->saved[x] = true;
  }
  return s;
}

/* Chooses `choice` as the decision to commit. */
static void choose(planner *pl, const int *choice) {
  for (int t = 0; t < pl->ntops; t++)
    pl->chosen[t] = choice[t];
}

static remat_status measure(planner *pl, const int *choice, plan_measures *m) {
  remat_status s = decide(pl, choice, &pl->scratch);
  if (s != REMAT_OK)
    return s;
  lower_request req = {pl->g, pl->scratch.saved, pl->t->loss, pl->t->has_opt,
                       pl->t->opt_kind};
  return measure_decision(&req, pl->t->nworkers, pl->t->nnodes, pl->t->costs,
                          m);
}

/* Measures every planned region on candidate c (the others on their own
 * policy) and records its chain figures; see chain_region for the terms. */
static remat_status measure_candidate(planner *pl, int c) {
  int *choice = remat__malloc(((size_t)pl->ntops + 1) * sizeof *choice);
  if (choice == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int t = 0; t < pl->ntops; t++)
    choice[t] = c;
  plan_measures m;
  remat_status s = measure(pl, choice, &m);
  free(choice);
  if (s != REMAT_OK)
    return s;
  int64_t before = 0, total = 0;
  for (int t = 0; t < pl->ntops; t++)
    total += m.region_saved[pl->tops[t]];
  for (int t = 0; t < pl->ntops; t++) {
    chain_region *cr = &pl->chain[t];
    int32_t r = pl->tops[t];
    int k = pl->free_region[r] ? c : 0;
    cr->saved[k] = m.region_saved[r];
    cr->working[k] = m.region_live_peak[r] - before;
    cr->recompute[k] = m.region_recompute[r];
    pl->roofline_chain[t] = *cr;
    pl->roofline_chain[t].recompute[k] = m.region_roofline[r];
    before += m.region_saved[r];
  }
  if (m.outside_live_peak - total > pl->tail)
    pl->tail = m.outside_live_peak - total;
  pl->persistent = m.persistent;
  measures_free(&m);
  return REMAT_OK;
}

/* The measured peak of an assignment, or -1 on failure (status in *s). */
static int64_t peak_of(planner *pl, const int *choice, remat_status *s) {
  plan_measures m;
  *s = measure(pl, choice, &m);
  int64_t peak = *s == REMAT_OK ? m.peak : -1;
  measures_free(&m);
  return peak;
}

/* Every planned region on one candidate, least recompute first: the first
 * that fits is taken. *smallest gets the least peak among them, so every
 * budget at or above the reported smallest feasible budget fits (the
 * budget's feasibility is monotonic). Returns REMAT_ERR_BUDGET when none
 * fits. */
static remat_status uniform_fallback(planner *pl, int64_t budget,
                                     int64_t *smallest) {
  int *choice = remat__calloc((size_t)pl->ntops + 1, sizeof *choice);
  if (choice == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  remat_status s = REMAT_OK;
  int fits = -1;
  *smallest = INT64_MAX;
  for (int c = 0; c < pl->ncand && s == REMAT_OK; c++) {
    for (int t = 0; t < pl->ntops; t++)
      choice[t] = c;
    int64_t peak = peak_of(pl, choice, &s);
    if (s == REMAT_OK && peak < *smallest)
      *smallest = peak;
    if (s == REMAT_OK && peak <= budget && fits < 0)
      fits = c;
  }
  for (int t = 0; fits >= 0 && t < pl->ntops; t++)
    choice[t] = fits;
  if (s == REMAT_OK && fits >= 0)
    choose(pl, choice);
  else if (s == REMAT_OK)
    s = REMAT_ERR_BUDGET;
  free(choice);
  return s;
}

static remat_status infeasible(planner *pl, int64_t budget, int64_t smallest) {
  return graph_fail(pl->g, REMAT_ERR_BUDGET,
                    "memory budget of %lld bytes (%.2f MiB) is infeasible: "
                    "the smallest feasible budget for this graph is %lld "
                    "bytes (%.2f MiB)",
                    (long long)budget, (double)budget / 1048576.0,
                    (long long)smallest, (double)smallest / 1048576.0);
}

/* The predicted step time of an assignment at the target's workers. */
static remat_status predicted_seconds(planner *pl, const int *choice,
                                      double *seconds) {
  remat_status s = decide(pl, choice, &pl->scratch);
  if (s != REMAT_OK)
    return s;
  lower_request req = {pl->g, pl->scratch.saved, pl->t->loss, pl->t->has_opt,
                       pl->t->opt_kind};
  plan_lowering l;
  s = lower_graph(&req, &l); /* on failure l is empty */
  if (s == REMAT_OK)
    s = lifetimes_assign(&l);
  if (s == REMAT_OK) {
    const plan_target *t = pl->t;
    predict_request pr = {
        pl->g, &l, t->replay_workers > 0 ? t->replay_workers : t->nworkers,
        t->replay_nodes > 0 ? t->replay_nodes : t->nnodes, t->lookahead,
        t->costs};
    s = predict_step_seconds(&pr, seconds);
  }
  lowering_free(&l);
  return s;
}

/* Of the chain's candidates that fit (their measured peak), the one of
 * least predicted step time, candidates of less recompute first: one of
 * more recompute is chosen only when it is quicker by more than the
 * margin (recompute that runs on otherwise idle workers). The plan of
 * least roofline recompute is a candidate too (last): measured costs
 * that rank a plan first do not make it the quickest. */
static remat_status choose_by_replay(planner *pl, int64_t model_budget,
                                     int64_t budget) {
  int n = pl->ntops;
  int *choices = remat__malloc((size_t)PLANNER_REPLAY_CANDIDATES *
                               ((size_t)n + 1) * sizeof *choices);
  if (choices == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  int m = chain_plans(pl->chain, n, pl->tail, model_budget,
                      PLANNER_REPLAY_CANDIDATES - 1, choices);
  if (m >= 0 && chain_plan(pl->roofline_chain, n, pl->tail, model_budget,
                           choices + (size_t)m * (size_t)n) == 0)
    m++; /* the least roofline recompute's plan, last */
  remat_status s = m == -2 ? REMAT_ERR_OUT_OF_MEMORY : REMAT_OK;
  double best = -1.0;
  for (int k = 0; s == REMAT_OK && k < m; k++) {
    const int *choice = choices + (size_t)k * (size_t)n;
    int64_t peak = k == 0 ? 0 : peak_of(pl, choice, &s);
    double seconds = 0;
    if (s == REMAT_OK && peak <= budget)
      s = predicted_seconds(pl, choice, &seconds);
    if (s == REMAT_OK && peak <= budget &&
        (best < 0 || seconds < best * (1.0 - PLANNER_REPLAY_MARGIN))) {
      best = seconds;
      choose(pl, choice);
    }
  }
  free(choices);
  return s;
}

/* The chain's dynamic program, checked by measurement: a plan whose
 * measured peak exceeds the budget tightens the model budget by the excess
 * and plans again (at most 16 times). With the replay, the plan that fits
 * and the chain's other candidates under the same model budget are scored
 * by predicted step time. Returns REMAT_ERR_BUDGET when no attempt
 * fits. */
static remat_status plan_chain(planner *pl, int64_t budget) {
  int *choice = remat__calloc((size_t)pl->ntops + 1, sizeof *choice);
  if (choice == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  remat_status s = REMAT_ERR_BUDGET;
  int64_t model_budget = budget - pl->persistent;
  for (int attempt = 0; attempt < 16; attempt++) {
    int rc = chain_plan(pl->chain, pl->ntops, pl->tail, model_budget, choice);
    if (rc == -2)
      s = REMAT_ERR_OUT_OF_MEMORY;
    if (rc < 0)
      break;
    remat_status ms;
    int64_t peak = peak_of(pl, choice, &ms);
    if (ms != REMAT_OK || peak <= budget) {
      s = ms;
      if (s == REMAT_OK)
        choose(pl, choice);
      if (s == REMAT_OK && pl->t->replay)
        s = choose_by_replay(pl, model_budget, budget);
      break;
    }
    model_budget -= peak - budget;
  }
  free(choice);
  return s;
}

/* ---- per-tensor candidates ---- */

double plan_op_cost(const remat_graph *g, int32_t o) {
  const graph_op *op = &g->ops[o];
  double flops = 0, bytes = (double)tensor_store_bytes(g->tensors[op->out]);
  for (int k = 0; k < op->inst.nfwd; k++)
    flops += op->inst.fwd[k].flops;
  for (int i = 0; i < op->desc.nin; i++)
    bytes += (double)tensor_store_bytes(g->tensors[op->in[i]]);
  double moved = PLANNER_FLOPS_PER_BYTE * bytes;
  return flops > moved ? flops : moved;
}

double plan_op_time(const remat_graph *g, int32_t o, cost_table *costs) {
  const op_instance *inst = &g->ops[o].inst;
  double measured = 0;
  for (int k = 0; k < inst->nfwd; k++) {
    double seconds = costs != NULL
                         ? cost_table_tile_seconds(costs, &inst->desc,
                                                   &inst->fwd[k])
                         : -1.0;
    if (seconds < 0)
      return plan_op_cost(g, o);
    measured += seconds * (double)inst->fwd[k].tiles * COST_FLOPS_PER_SECOND;
  }
  return inst->nfwd > 0 ? measured : plan_op_cost(g, o);
}

typedef struct ranked_tensor {
  int32_t top, id;
  double density; /* its producer's cost per byte it keeps */
} ranked_tensor;

/* By top-level region, then density (highest first), then id. */
static int cmp_ranked(const void *pa, const void *pb) {
  const ranked_tensor *a = pa, *b = pb;
  if (a->top != b->top)
    return a->top < b->top ? -1 : 1;
  if (a->density != b->density)
    return a->density > b->density ? -1 : 1;
  return (a->id > b->id) - (a->id < b->id);
}

/* Ranks, per planned top-level region, the tensors its policy decides and
 * nothing_saveable recomputes for backward (not those backward never
 * reads, nor a linear output that a fused kernel never stores: saving
 * them would cost bytes and spare nothing), by the cost of recomputing
 * each per byte of keeping it; sets nsets (at most one set per ranked
 * tensor but the last) and ncand. */
static remat_status rank_tensors(planner *pl) {
  remat_graph *g = pl->g;
  size_t nt = (size_t)g->ntensors + 1;
  pl->rank = remat__malloc(nt * sizeof *pl->rank);
  pl->top_of_tensor = remat__malloc(nt * sizeof *pl->top_of_tensor);
  pl->ranked = remat__calloc((size_t)pl->ntops + 1, sizeof *pl->ranked);
  int *choice = remat__malloc(((size_t)pl->ntops + 1) * sizeof *choice);
  ranked_tensor *list = remat__malloc(nt * sizeof *list);
  int32_t *top_index = remat__malloc(((size_t)g->nregions + 1) *
                                     sizeof *top_index);
  remat_status s = REMAT_ERR_OUT_OF_MEMORY;
  if (!pl->rank || !pl->top_of_tensor || !pl->ranked || !choice || !list ||
      !top_index)
    goto out;
  for (int t = 0; t < pl->ntops; t++) {
    choice[t] = NOTHING_CHOICE;
    top_index[pl->tops[t]] = t;
  }
  int32_t *rank = pl->rank;
  plan_measures m;
  pl->rank = NULL; /* decide as nothing_saveable alone */
  s = measure(pl, choice, &m);
  pl->rank = rank;
  if (s != REMAT_OK)
    goto out;
  int32_t n = 0;
  for (int32_t x = 0; x < g->ntensors; x++) {
    int32_t d = pl->scratch.deciding_region[x];
    pl->rank[x] = -1;
    pl->top_of_tensor[x] = -1;
    if (d < 0 || pl->scratch.saved[x] || !m.recomputed[x] ||
        !planned_region(pl, d))
      continue;
    const remat_tensor *t = g->tensors[x];
    double bytes = (double)tensor_store_bytes(t);
    list[n++] = (ranked_tensor){top_index[g->regions[d].top], x,
                                plan_op_time(g, t->producer, pl->t->costs) /
                                    (bytes > 0 ? bytes : 1.0)};
  }
  qsort(list, (size_t)n, sizeof *list, cmp_ranked);
  int32_t most = 0;
  for (int32_t i = 0; i < n; i++) {
    pl->top_of_tensor[list[i].id] = list[i].top;
    pl->rank[list[i].id] = pl->ranked[list[i].top]++;
    if (pl->ranked[list[i].top] > most)
      most = pl->ranked[list[i].top];
  }
  pl->nsets = most - 1 < PLANNER_MAX_SETS ? (most > 1 ? most - 1 : 0)
                                          : PLANNER_MAX_SETS;
  if (g->rt->per_region) /* REMAT_BENCH_PER_REGION: built-ins alone */
    pl->nsets = 0;
  pl->ncand = PLANNER_POLICY_CHOICES + pl->nsets;
  measures_free(&m);
  s = REMAT_OK;
out:
  free(choice);
  free(list);
  free(top_index);
  return s;
}

static remat_status plan_budget(planner *pl, int64_t budget) {
  remat_status rs = rank_tensors(pl);
  if (rs != REMAT_OK)
    return rs;
  for (int t = 0; t < pl->ntops; t++)
    pl->chain[t].nchoices = pl->free_region[pl->tops[t]] ? pl->ncand : 1;
  for (int c = 0; c < pl->ncand; c++) {
    remat_status s = measure_candidate(pl, c);
    if (s != REMAT_OK)
      return s;
  }
  remat_status s = plan_chain(pl, budget);
  int64_t smallest = 0;
  if (s == REMAT_ERR_BUDGET)
    s = uniform_fallback(pl, budget, &smallest);
  return s == REMAT_ERR_BUDGET ? infeasible(pl, budget, smallest) : s;
}

/* No planned region: every region's policy is fixed; a budget only
 * checks. */
static remat_status plan_fixed(planner *pl, int64_t budget) {
  for (int t = 0; t < pl->ntops; t++)
    pl->free_region[pl->tops[t]] = false;
  if (budget <= 0) /* pl->chosen: all 0, unused for fixed regions */
    return REMAT_OK;
  remat_status s;
  int64_t peak = peak_of(pl, pl->chosen, &s);
  if (s == REMAT_OK && peak > budget)
    return infeasible(pl, budget, peak);
  return s;
}

static remat_status setup(planner *pl) {
  remat_graph *g = pl->g;
  remat_status s = policy_resolve_default(g, pl->t->default_policy,
                                          &pl->fallback);
  pl->ncand = PLANNER_POLICY_CHOICES;
  for (int c = 0; s == REMAT_OK && c < PLANNER_POLICY_CHOICES; c++)
    s = remat_policy_parse(candidate_names[c], &pl->candidates[c]);
  if (s != REMAT_OK)
    return s;
  size_t n = (size_t)g->nregions + 1;
  pl->region_policy = remat__calloc(n, sizeof *pl->region_policy);
  pl->free_region = remat__calloc(n, sizeof *pl->free_region);
  pl->tops = remat__calloc(n, sizeof *pl->tops);
  pl->chain = remat__calloc(n, sizeof *pl->chain);
  pl->roofline_chain = remat__calloc(n, sizeof *pl->roofline_chain);
  pl->chosen = remat__calloc(n, sizeof *pl->chosen);
  if (!pl->region_policy || !pl->free_region || !pl->tops || !pl->chain ||
      !pl->roofline_chain || !pl->chosen)
    return REMAT_ERR_OUT_OF_MEMORY;
  bool budget = pl->t->budget > 0, fallback_checked = false;
  for (int32_t r = 0; r < g->nregions; r++) {
    const remat_policy *own =
        g->regions[r].policy ? g->regions[r].policy : pl->fallback;
    /* the default policy of every region is checked once, not per region */
    if (own != pl->fallback || !fallback_checked)
      s = policy_check_names(g, own);
    fallback_checked |= own == pl->fallback;
    if (s != REMAT_OK)
      return s;
    if (g->regions[r].parent == -1)
      pl->tops[pl->ntops++] = r;
    if (is_auto(own) || (budget && g->regions[r].policy == NULL))
      pl->free_region[g->regions[r].top] = true;
  }
  return REMAT_OK;
}

static void teardown(planner *pl) {
  remat_policy_destroy(pl->fallback);
  for (int c = 0; c < PLANNER_POLICY_CHOICES; c++)
    remat_policy_destroy(pl->candidates[c]);
  free(pl->rank);
  free(pl->ranked);
  free(pl->top_of_tensor);
  free(pl->region_policy);
  free(pl->free_region);
  free(pl->tops);
  free(pl->chain);
  free(pl->roofline_chain);
  free(pl->chosen);
  decision_free(&pl->scratch);
}

static remat_status alloc_decision(const remat_graph *g, remat_decision *d) {
  memset(d, 0, sizeof *d);
  d->nregions = g->nregions;
  size_t nt = (size_t)g->ntensors + 1, nr = (size_t)g->nregions + 1;
  d->saved = remat__calloc(nt, sizeof *d->saved);
  d->deciding_region = remat__calloc(nt, sizeof *d->deciding_region);
  d->region_policy = remat__calloc(nr, sizeof *d->region_policy);
  d->source = remat__calloc(nr, sizeof *d->source);
  if (!d->saved || !d->deciding_region || !d->region_policy || !d->source)
    return REMAT_ERR_OUT_OF_MEMORY;
  return REMAT_OK;
}

#define SET_TEXT_MAX 1024
#define SET_PREFIX "auto_tensors:"

/* Appends tensor x's name (or, unnamed, its op and id) to a per-tensor
 * set's text, which ends in "..." once it would pass SET_TEXT_MAX. */
static remat_status append_name(char **text, const remat_graph *g,
                                int32_t x) {
  const remat_tensor *t = g->tensors[x];
  char name[REMAT__NAME_MAX + 32];
  if (t->named)
    snprintf(name, sizeof name, "%s", t->name);
  else
    snprintf(name, sizeof name, "%s#%d",
             op_name(g->ops[t->producer].desc.type), (int)x);
  size_t len = strlen(*text);
  if (len >= 3 && strcmp(*text + len - 3, "...") == 0)
    return REMAT_OK;
  bool first = len == strlen(SET_PREFIX);
  const char *add = len + strlen(name) + 5 > SET_TEXT_MAX ? "..." : name;
  char *grown = remat__realloc(*text, len + strlen(add) + 2);
  if (grown == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  snprintf(grown + len, strlen(add) + 2, "%s%s", first ? "" : ",", add);
  *text = grown;
  return REMAT_OK;
}

/* The policy text of every region, as decided: a per-tensor set is
 * "auto_tensors:" and the names of the tensors it saves in the region. */
static remat_status name_policies(planner *pl) {
  remat_graph *g = pl->g;
  int32_t *top_index =
      remat__malloc(((size_t)g->nregions + 1) * sizeof *top_index);
  if (top_index == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int t = 0; t < pl->ntops; t++)
    top_index[pl->tops[t]] = t;
  remat_status s = REMAT_OK;
  for (int32_t r = 0; r < g->nregions && s == REMAT_OK; r++) {
    char text[SET_TEXT_MAX];
    if (pl->out->source[r] == REGION_BUDGET &&
        pl->chosen[top_index[g->regions[r].top]] >= PLANNER_POLICY_CHOICES)
      snprintf(text, sizeof text, SET_PREFIX);
    else if (remat_policy_format(pl->region_policy[r], text, sizeof text))
      snprintf(text, sizeof text, "(policy of %d bytes or more)",
               (int)sizeof text);
    if ((pl->out->region_policy[r] = remat__strdup(text)) == NULL)
      s = REMAT_ERR_OUT_OF_MEMORY;
  }
  for (int32_t x = 0; s == REMAT_OK && pl->rank && x < g->ntensors; x++) {
    int32_t r = pl->out->deciding_region[x];
    if (pl->rank[x] >= 0 && pl->out->saved[x] &&
        pl->chosen[pl->top_of_tensor[x]] >= PLANNER_POLICY_CHOICES)
      s = append_name(&pl->out->region_policy[r], g, x);
  }
  free(top_index);
  return s;
}

static remat_status run_planner(planner *pl) {
  int64_t budget = pl->t->budget;
  remat_status s = setup(pl);
  bool any_free = false;
  for (int t = 0; t < pl->ntops; t++)
    any_free |= pl->free_region[pl->tops[t]];
  if (s == REMAT_OK && any_free && budget <= 0)
    return graph_fail(pl->g, REMAT_ERR_POLICY,
                      "policy 'auto' needs a memory budget: set %s",
                      graph_budget_origin(pl->g));
  if (s == REMAT_OK && any_free && pl->t->loss >= 0)
    s = plan_budget(pl, budget);
  else if (s == REMAT_OK)
    s = plan_fixed(pl, budget);
  if (s == REMAT_OK) /* the commit: the chosen decision into the output */
    s = decide(pl, pl->chosen, pl->out);
  return s == REMAT_OK ? name_policies(pl) : s;
}

remat_status plan_remat(const plan_target *t, remat_decision *out) {
  planner pl;
  memset(&pl, 0, sizeof pl);
  pl.t = t;
  pl.g = t->g;
  pl.out = out;
  remat_status s = alloc_decision(t->g, out);
  if (s == REMAT_OK)
    s = alloc_decision(t->g, &pl.scratch);
  if (s == REMAT_OK)
    s = run_planner(&pl);
  teardown(&pl);
  if (s != REMAT_OK) {
    decision_free(out);
    if (t->g->status == REMAT_OK)
      graph_fail(t->g, s, "remat_compile: %s",
                 s == REMAT_ERR_OUT_OF_MEMORY ? "out of memory"
                                              : remat_last_error());
  }
  return s;
}

void decision_free(remat_decision *d) {
  for (int32_t r = 0; d->region_policy != NULL && r < d->nregions; r++)
    free(d->region_policy[r]);
  free(d->region_policy);
  free(d->saved);
  free(d->deciding_region);
  free(d->source);
  memset(d, 0, sizeof *d);
}
