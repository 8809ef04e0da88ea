/* The remat planner: resolves each region's policy (its own, or the
 * runtime's default) and decides which activations are saved. With a memory
 * budget, the regions that name no policy (or name "auto") get, per
 * top-level region, the candidate policy that fits the budget with the
 * least recompute: each candidate is lowered once for every region to
 * measure its saved bytes, working bytes and recompute FLOPs, a dynamic
 * program over the chain of regions picks the assignment, and the
 * assignment's predicted peak is checked by simulating it (tightening the
 * model budget by any excess and planning again). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/plan.h"
#include "runtime/planner.h"
#include "runtime/policy.h"

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

static int by_saved_then_cost(const void *a, const void *b) {
  const frontier_entry *x = a, *y = b;
  if (x->saved != y->saved)
    return x->saved < y->saved ? -1 : 1;
  if (x->cost != y->cost)
    return x->cost < y->cost ? -1 : 1;
  return (x->peak > y->peak) - (x->peak < y->peak);
}

/* Keeps entries not dominated in (saved, cost, peak). */
static int prune(frontier_entry *f, int n) {
  qsort(f, (size_t)n, sizeof *f, by_saved_then_cost);
  int kept = 0;
  for (int i = 0; i < n; i++) {
    bool dominated = false;
    for (int j = 0; j < kept && !dominated; j++)
      dominated = f[j].cost <= f[i].cost && f[j].peak <= f[i].peak;
    if (!dominated)
      f[kept++] = f[i];
  }
  return kept;
}

int chain_plan(const chain_region *r, int n, int64_t tail, int64_t budget,
               int *choice) {
  frontier_entry **levels = remat__calloc((size_t)n + 1, sizeof *levels);
  int *sizes = remat__calloc((size_t)n + 1, sizeof *sizes);
  int result = -2;
  if (levels == NULL || sizes == NULL)
    goto out;
  levels[0] = remat__calloc(1, sizeof **levels);
  if (levels[0] == NULL)
    goto out;
  levels[0][0] = (frontier_entry){0, 0, 0.0, -1, 0};
  sizes[0] = 1;
  for (int i = 0; i < n; i++) {
    int cap = sizes[i] * r[i].nchoices;
    levels[i + 1] = remat__malloc((size_t)(cap > 0 ? cap : 1) * sizeof **levels);
    if (levels[i + 1] == NULL)
      goto out;
    int m = 0;
    for (int e = 0; e < sizes[i]; e++)
      for (int c = 0; c < r[i].nchoices; c++) {
        const frontier_entry *prev = &levels[i][e];
        int64_t at = prev->saved + r[i].working[c];
        if (at > budget)
          continue;
        levels[i + 1][m++] = (frontier_entry){
            prev->saved + r[i].saved[c], at > prev->peak ? at : prev->peak,
            prev->cost + r[i].recompute[c], e, (int8_t)c};
      }
    sizes[i + 1] = prune(levels[i + 1], m);
  }
  int best = -1;
  for (int e = 0; e < sizes[n]; e++) {
    frontier_entry *f = &levels[n][e];
    int64_t peak = f->saved + tail > f->peak ? f->saved + tail : f->peak;
    if (peak > budget)
      continue;
    f->peak = peak;
    if (best < 0 || f->cost < levels[n][best].cost ||
        (f->cost == levels[n][best].cost && peak < levels[n][best].peak))
      best = e;
  }
  result = -1;
  for (int i = n, e = best; best >= 0 && i > 0; i--) {
    choice[i - 1] = levels[i][e].choice;
    e = levels[i][e].parent;
  }
  if (best >= 0)
    result = 0;
out:
  for (int i = 0; levels != NULL && i <= n; i++)
    free(levels[i]);
  free(levels);
  free(sizes);
  return result;
}

/* ---- planning the graph ---- */

static const char *const candidate_names[PLANNER_MAX_CHOICES] = {
    "everything_saveable", "dots_saveable",
    "dots_with_no_batch_dims_saveable", "nothing_saveable"};

typedef struct planner {
  remat_step_plan *p;
  remat_policy *fallback;
  remat_policy *candidates[PLANNER_MAX_CHOICES];
  const remat_policy **region_policy; /* [nregions] */
  bool *free_region;                  /* [nregions]: top-level, planned */
  int32_t *tops;                      /* top-level regions in order */
  int ntops;
  chain_region *chain;                /* [ntops] */
  int64_t tail;
} planner;

static bool is_auto(const remat_policy *pol) {
  return pol != NULL && pol->kind == POLICY_AUTO;
}

/* Gives every region under a free top-level region the candidate choice. */
static void assign(planner *pl, const int *choice) {
  remat_graph *g = pl->p->g;
  for (int32_t r = 0; r < g->nregions; r++) {
    graph_region *reg = &g->regions[r];
    const remat_policy *own = reg->policy ? reg->policy : pl->fallback;
    pl->region_policy[r] = own;
    for (int t = 0; t < pl->ntops; t++)
      if (pl->tops[t] == reg->top && pl->free_region[reg->top] &&
          (reg->policy == NULL || is_auto(reg->policy)))
        pl->region_policy[r] = pl->candidates[choice[t]];
  }
}

static remat_status lower_with(planner *pl, const int *choice) {
  assign(pl, choice);
  remat_status s = policy_decide_with(pl->p->g, pl->p->saved, pl->region_policy);
  return s == REMAT_OK ? plan_lower(pl->p) : s;
}

/* Bytes of each top-level region's buffers alive when backward starts. */
static remat_status saved_at_seed(const remat_step_plan *p, int32_t seed,
                                  int64_t *saved_by_region) {
  int32_t *last = remat__malloc(((size_t)p->nbufs + 1) * sizeof *last);
  if (last == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t b = 0; b < p->nbufs; b++)
    last[b] = -1;
  for (int32_t i = 0; i < p->nknodes; i++)
    for (int k = 0; k < p->knodes[i].ntouch; k++)
      last[p->knodes[i].touch[k]] = i;
  for (int32_t b = 0; b < p->nbufs; b++) {
    const plan_buffer *buf = &p->bufs[b];
    if (buf->persistent || buf->first_writer < 0 || buf->first_writer >= seed ||
        last[b] < seed)
      continue;
    int32_t r = p->knodes[buf->first_writer].region;
    if (r >= 0)
      saved_by_region[r] += (buf->bytes + 63) / 64 * 64;
  }
  free(last);
  return REMAT_OK;
}

/* Lowers with every free region on candidate c and records its figures. */
static remat_status measure_candidate(planner *pl, int c) {
  remat_step_plan *p = pl->p;
  int *choice = remat__malloc(((size_t)pl->ntops + 1) * sizeof *choice);
  int64_t *live = NULL, *saved = remat__calloc((size_t)p->g->nregions + 1, sizeof *saved);
  remat_status s = choice && saved ? REMAT_OK : REMAT_ERR_OUT_OF_MEMORY;
  for (int t = 0; s == REMAT_OK && t < pl->ntops; t++)
    choice[t] = c;
  if (s == REMAT_OK)
    s = lower_with(pl, choice);
  if (s == REMAT_OK && (live = remat__malloc((size_t)p->nknodes * sizeof *live)) == NULL)
    s = REMAT_ERR_OUT_OF_MEMORY;
  int32_t seed = p->nknodes;
  for (int32_t i = 0; s == REMAT_OK && i < p->nknodes && seed == p->nknodes; i++)
    if (p->knodes[i].kind == KNODE_SEED || p->knodes[i].kind == KNODE_BACKWARD)
      seed = i;
  if (s == REMAT_OK && memplan_simulate(p, live) < 0)
    s = REMAT_ERR_OUT_OF_MEMORY;
  if (s == REMAT_OK)
    s = saved_at_seed(p, seed, saved);
  if (s == REMAT_OK) {
    int64_t before = 0, total = 0;
    for (int t = 0; t < pl->ntops; t++)
      total += saved[pl->tops[t]];
    for (int t = 0; t < pl->ntops; t++) {
      chain_region *cr = &pl->chain[t];
      int32_t r = pl->tops[t];
      int k = pl->free_region[r] ? c : 0;
      int64_t peak = 0;
      double flops = 0.0;
      for (int32_t i = 0; i < p->nknodes; i++) {
        if (p->knodes[i].region != r)
          continue;
        if (live[i] > peak)
          peak = live[i];
        if (p->knodes[i].kind == KNODE_RECOMPUTE)
          flops += p->knodes[i].flops;
      }
      cr->saved[k] = saved[r];
      cr->working[k] = peak - before;
      cr->recompute[k] = flops;
      before += saved[r];
    }
    for (int32_t i = 0; i < p->nknodes; i++)
      if (p->knodes[i].region < 0 && live[i] - total > pl->tail)
        pl->tail = live[i] - total;
  }
  plan_unlower(p);
  free(choice);
  free(live);
  free(saved);
  return s;
}

static remat_status infeasible(planner *pl, int64_t budget) {
  remat_step_plan *p = pl->p;
  int64_t smallest = INT64_MAX;
  int *choice = remat__calloc((size_t)pl->ntops + 1, sizeof *choice);
  if (choice == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int c = 0; c < PLANNER_MAX_CHOICES; c++) {
    for (int t = 0; t < pl->ntops; t++)
      choice[t] = c;
    remat_status s = lower_with(pl, choice);
    int64_t peak = s == REMAT_OK ? memplan_simulate(p, NULL) : -1;
    plan_unlower(p);
    if (peak < 0) {
      free(choice);
      return REMAT_ERR_OUT_OF_MEMORY;
    }
    if (peak < smallest)
      smallest = peak;
  }
  free(choice);
  return graph_fail(p->g, REMAT_ERR_BUDGET,
                    "memory budget of %lld bytes (%.2f MiB) is infeasible: "
                    "the smallest feasible budget for this graph is %lld "
                    "bytes (%.2f MiB)",
                    (long long)budget, (double)budget / 1048576.0,
                    (long long)smallest, (double)smallest / 1048576.0);
}

/* Plans under the budget; leaves the plan lowered on success. */
static remat_status plan_budget(planner *pl, int64_t budget) {
  remat_step_plan *p = pl->p;
  for (int t = 0; t < pl->ntops; t++)
    pl->chain[t].nchoices = pl->free_region[pl->tops[t]] ? PLANNER_MAX_CHOICES : 1;
  for (int c = 0; c < PLANNER_MAX_CHOICES; c++) {
    remat_status s = measure_candidate(pl, c);
    if (s != REMAT_OK)
      return s;
  }
  int64_t base = memplan_persistent_bytes(p);
  int *choice = remat__calloc((size_t)pl->ntops + 1, sizeof *choice);
  if (choice == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  int64_t model_budget = budget - base;
  for (int attempt = 0; attempt < 16; attempt++) {
    int rc = chain_plan(pl->chain, pl->ntops, pl->tail, model_budget, choice);
    if (rc == -2) {
      free(choice);
      return REMAT_ERR_OUT_OF_MEMORY;
    }
    if (rc < 0)
      break;
    remat_status s = lower_with(pl, choice);
    if (s != REMAT_OK) {
      free(choice);
      return s;
    }
    int64_t peak = memplan_simulate(p, NULL);
    if (peak < 0) {
      free(choice);
      return REMAT_ERR_OUT_OF_MEMORY;
    }
    if (peak <= budget) {
      free(choice);
      return REMAT_OK;
    }
    plan_unlower(p);
    model_budget -= peak - budget;
  }
  free(choice);
  return infeasible(pl, budget);
}

static remat_status setup(planner *pl, remat_step_plan *p) {
  remat_graph *g = p->g;
  memset(pl, 0, sizeof *pl);
  pl->p = p;
  remat_status s = policy_resolve_default(g, &pl->fallback);
  for (int c = 0; s == REMAT_OK && c < PLANNER_MAX_CHOICES; c++)
    if ((s = remat_policy_parse(candidate_names[c], &pl->candidates[c])))
      return s;
  if (s != REMAT_OK)
    return s;
  size_t n = (size_t)g->nregions + 1;
  pl->region_policy = remat__calloc(n, sizeof *pl->region_policy);
  pl->free_region = remat__calloc(n, sizeof *pl->free_region);
  pl->tops = remat__calloc(n, sizeof *pl->tops);
  pl->chain = remat__calloc(n, sizeof *pl->chain);
  if (!pl->region_policy || !pl->free_region || !pl->tops || !pl->chain)
    return REMAT_ERR_OUT_OF_MEMORY;
  bool budget = g->rt->config.memory_budget > 0;
  for (int32_t r = 0; r < g->nregions; r++) {
    const remat_policy *own = g->regions[r].policy ? g->regions[r].policy : pl->fallback;
    if ((s = policy_check_names(g, own)) != REMAT_OK)
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
  for (int c = 0; c < PLANNER_MAX_CHOICES; c++)
    remat_policy_destroy(pl->candidates[c]);
  free(pl->region_policy);
  free(pl->free_region);
  free(pl->tops);
  free(pl->chain);
}

remat_status planner_run(remat_step_plan *p) {
  remat_graph *g = p->g;
  int64_t budget = g->rt->config.memory_budget;
  planner pl;
  remat_status s = setup(&pl, p);
  bool any_free = false;
  for (int t = 0; t < pl.ntops; t++)
    any_free |= pl.free_region[pl.tops[t]];
  if (s == REMAT_OK && any_free && budget <= 0)
    s = graph_fail(g, REMAT_ERR_POLICY,
                   "policy 'auto' needs a memory budget: set "
                   "REMAT_MEMORY_BUDGET or remat_config.memory_budget");
  if (s == REMAT_OK && any_free && !p->forward_only) {
    s = plan_budget(&pl, budget);
  } else if (s == REMAT_OK) {
    int zero[1] = {0};
    for (int t = 0; t < pl.ntops; t++)
      pl.free_region[pl.tops[t]] = false;
    s = lower_with(&pl, zero);
    int64_t peak = s == REMAT_OK && budget > 0 ? memplan_simulate(p, NULL) : 0;
    if (peak < 0)
      s = REMAT_ERR_OUT_OF_MEMORY;
    if (s == REMAT_OK && peak > budget && budget > 0) {
      plan_unlower(p);
      s = infeasible(&pl, budget);
    }
  }
  teardown(&pl);
  if (s != REMAT_OK && g->status == REMAT_OK)
    graph_fail(g, s, "remat_compile: %s",
               s == REMAT_ERR_OUT_OF_MEMORY ? "out of memory" : remat_last_error());
  return s;
}
