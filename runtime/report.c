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

remat_status report_plan(remat_step_plan *p) {
  if (region_stats(p) != REMAT_OK)
    return REMAT_ERR_OUT_OF_MEMORY;
  remat_graph *g = p->g;
  if (g->rt->config.verbose < 1)
    return REMAT_OK;
  fprintf(stderr, "remat plan: %d ops, %d kernel nodes, %d tasks, %d regions\n",
          g->nops, p->low.nknodes, sched_dag_num_tasks(p->dag), g->nregions);
  for (int32_t r = 0; r < g->nregions; r++) {
    if (g->regions[r].parent != -1)
      continue;
    plan_region_stats *rs = &p->region_stats[r];
    fprintf(stderr,
            "  region %d: saved %.2f MiB, recomputed %.2f MiB, recompute "
            "%.3f GFLOP\n",
            r, (double)rs->saved_bytes / 1048576.0,
            (double)rs->recomputed_bytes / 1048576.0,
            rs->recompute_flops * 1e-9);
  }
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
    fprintf(stderr, "  node %d: %s kind %d region %d tiles %lld\n", i,
            kn->kernel ? kn->kernel->name : "(runtime)", (int)kn->kind,
            kn->region, (long long)kn->tiles);
  }
  return REMAT_OK;
}
