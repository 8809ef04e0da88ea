/* The plan's summary: per top-level region the bytes saved and recomputed
 * and the recompute FLOPs (kept for remat_step_stats and tests), and what
 * REMAT_VERBOSE prints to stderr: 1, the plan per region with the policy
 * each region got and why, and the named tensors saved and recomputed;
 * 2, every kernel node too. */
#include <stdio.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "runtime/report.h"

/* Per top-level region: bytes of activations kept for backward, bytes
 * recomputed, and recompute FLOPs. */
static remat_status region_stats(remat_step_plan *p) {
  remat_graph *g = p->g;
  p->region_stats = remat__calloc((size_t)g->nregions + 1, sizeof *p->region_stats);
  if (p->region_stats == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t t = 0; t < g->ntensors; t++) {
    remat_tensor *x = g->tensors[t];
    if (x->kind != TENSOR_ACT || x->region < 0)
      continue;
    plan_region_stats *rs = &p->region_stats[g->regions[x->region].top];
    if (p->low.recomp_buf[t] >= 0)
      rs->recomputed_bytes += tensor_bytes(x);
    else if (p->decision.saved[t] && !p->forward_only)
      rs->saved_bytes += tensor_bytes(x);
  }
  for (int32_t i = 0; i < p->low.nknodes; i++)
    if (p->low.knodes[i].kind == KNODE_RECOMPUTE && p->low.knodes[i].region >= 0)
      p->region_stats[p->low.knodes[i].region].recompute_flops += p->low.knodes[i].flops;
  return REMAT_OK;
}

static const char *const kind_names[] = {
    [KNODE_FORWARD] = "forward", [KNODE_SEED] = "seed",
    [KNODE_BACKWARD] = "backward", [KNODE_RECOMPUTE] = "recompute",
    [KNODE_CHECK] = "check", [KNODE_GATE] = "gate", [KNODE_UPDATE] = "update"};

static const char *const source_words[] = {
    [REGION_OWN] = "its own", [REGION_DEFAULT] = "the default, REMAT_POLICY",
    [REGION_BUDGET] = "chosen under the memory budget"};

/* The named tensors region r decided, saved (want_saved) or recomputed. */
static void print_names(const remat_step_plan *p, int32_t r, bool want_saved) {
  const remat_graph *g = p->g;
  int printed = 0;
  for (int32_t t = 0; t < g->ntensors; t++) {
    const remat_tensor *x = g->tensors[t];
    if (!x->named || p->decision.deciding_region[t] != r)
      continue;
    bool saved = p->decision.saved[t];
    bool recomputed = p->low.recomp_buf[t] >= 0;
    if ((want_saved && !saved) || (!want_saved && !recomputed))
      continue;
    fprintf(stderr, "%s%s", printed++ ? ", " : " ", x->name);
  }
  fprintf(stderr, "%s\n", printed ? "" : " (none)");
}

/* One region: its policy and why, its bytes and FLOPs (top-level regions),
 * and the named tensors it saves and recomputes. */
static void print_region(const remat_step_plan *p, int32_t r) {
  const remat_graph *g = p->g;
  const graph_region *reg = &g->regions[r];
  fprintf(stderr, "  region %d%s: policy %s (%s)\n", r,
          reg->parent == -1 ? "" : " (nested)", p->decision.region_policy[r],
          source_words[p->decision.source[r]]);
  if (reg->parent == -1) {
    const plan_region_stats *rs = &p->region_stats[r];
    fprintf(stderr,
            "    saved %.2f MiB, recomputed %.2f MiB, recompute %.3f GFLOP\n",
            (double)rs->saved_bytes / 1048576.0,
            (double)rs->recomputed_bytes / 1048576.0,
            rs->recompute_flops * 1e-9);
  }
  fprintf(stderr, "    saved:");
  print_names(p, r, true);
  fprintf(stderr, "    recomputed:");
  print_names(p, r, false);
}

remat_status report_plan(remat_step_plan *p) {
  if (region_stats(p) != REMAT_OK)
    return REMAT_ERR_OUT_OF_MEMORY;
  remat_graph *g = p->g;
  if (g->rt->config.verbose < 1)
    return REMAT_OK;
  fprintf(stderr, "remat plan: %d ops, %d kernel nodes, %d tasks, %d regions\n",
          g->nops, p->low.nknodes, sched_dag_num_tasks(p->dag), g->nregions);
  for (int32_t r = 0; r < g->nregions; r++)
    print_region(p, r);
  fprintf(stderr,
          "  model %.3f GFLOP, recompute %.3f GFLOP, predicted peak %.2f MiB "
          "(activations %.2f MiB)\n",
          p->low.flops * 1e-9, p->low.recompute_flops * 1e-9,
          (double)p->predicted.peak / 1048576.0,
          (double)p->predicted.transient_peak / 1048576.0);
  if (g->rt->config.verbose < 2)
    return REMAT_OK;
  for (int32_t i = 0; i < p->low.nknodes; i++) {
    plan_knode *kn = &p->low.knodes[i];
    fprintf(stderr, "  node %d: kernel %s, kind %s, region %d, tiles %lld\n",
            i, kn->kernel ? kn->kernel->name : "(runtime)",
            kind_names[kn->kind], kn->region, (long long)kn->tiles);
  }
  return REMAT_OK;
}
