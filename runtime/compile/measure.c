/* The planner's one question (measure.h): lower a candidate decision on a
 * private lowering, measure it, and leave nothing behind. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/dp_layout.h"
#include "runtime/compile/lifetimes.h"
#include "runtime/compile/measure.h"
#include "runtime/compile/memplan.h"
#include "runtime/compile/planner.h"
#include "runtime/dp/dp.h"

/* The first backward-side node (seed or backward): where forward ends. */
static int32_t backward_start(const plan_lowering *l) {
  for (int32_t i = 0; i < l->nknodes; i++)
    if (l->knodes[i].kind == KNODE_SEED || l->knodes[i].kind == KNODE_BACKWARD)
      return i;
  return l->nknodes;
}

/* Bytes of each top-level region's buffers alive when backward starts. */
static remat_status saved_at_seed(const plan_lowering *l, int64_t *saved) {
  int32_t seed = backward_start(l);
  int32_t *last = remat__malloc(((size_t)l->nbufs + 1) * sizeof *last);
  if (last == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t b = 0; b < l->nbufs; b++)
    last[b] = -1;
  for (int32_t i = 0; i < l->nknodes; i++)
    for (int k = 0; k < l->knodes[i].ntouch; k++)
      last[l->knodes[i].touch[k]] = i;
  for (int32_t b = 0; b < l->nbufs; b++) {
    const plan_buffer *buf = &l->bufs[b];
    if (buf->persistent || buf->first_writer < 0 ||
        buf->first_writer >= seed || last[b] < seed)
      continue;
    int32_t r = l->knodes[buf->first_writer].region;
    if (r >= 0)
      saved[r] += mem_block_bytes(buf->bytes);
  }
  free(last);
  return REMAT_OK;
}

double plan_node_cost(const plan_lowering *l, const plan_knode *kn,
                      cost_table *costs) {
  double bytes = 0;
  for (int k = 0; k < kn->ntouch; k++)
    bytes += (double)l->bufs[kn->touch[k]].bytes;
  double moved = PLANNER_FLOPS_PER_BYTE * bytes;
  double roofline = kn->flops > moved ? kn->flops : moved;
  if (costs == NULL)
    return roofline;
  op_desc d;
  op_kernel k;
  cost_key_of(l, kn, &d, &k);
  return cost_of_kernel(costs, &d, &k, kn->tiles, roofline);
}

static void region_figures(const plan_lowering *l, const int64_t *live,
                           cost_table *costs, plan_measures *m) {
  for (int32_t i = 0; i < l->nknodes; i++) {
    const plan_knode *kn = &l->knodes[i];
    if (kn->region < 0) {
      if (live[i] > m->outside_live_peak)
        m->outside_live_peak = live[i];
      continue;
    }
    if (live[i] > m->region_live_peak[kn->region])
      m->region_live_peak[kn->region] = live[i];
    if (kn->kind != KNODE_RECOMPUTE)
      continue;
    m->region_recompute[kn->region] += plan_node_cost(l, kn, costs);
    m->region_roofline[kn->region] += plan_node_cost(l, kn, NULL);
  }
}

static remat_status measure_lowering(const remat_graph *g,
                                     const plan_lowering *l, int nworkers,
                                     int nnodes, cost_table *costs,
                                     plan_measures *m) {
  int64_t *live = remat__malloc(((size_t)l->nknodes + 1) * sizeof *live);
  if (live == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  int64_t transient = memplan_transient_peak(l, live);
  remat_status s = transient < 0 ? REMAT_ERR_OUT_OF_MEMORY : REMAT_OK;
  if (s == REMAT_OK) {
    m->persistent = memplan_persistent_bytes(g, l, nworkers, nnodes);
    if (dp_bucket_bytes(g) > 0) /* data parallel: the buckets, at most */
      m->persistent += dp_layout_bound(l);
    m->peak = m->persistent + transient;
    region_figures(l, live, costs, m);
    s = saved_at_seed(l, m->region_saved);
  }
  free(live);
  return s;
}

remat_status measure_decision(const lower_request *req, int nworkers,
                              int nnodes, cost_table *costs,
                              plan_measures *out) {
  memset(out, 0, sizeof *out);
  size_t n = (size_t)req->g->nregions + 1;
  out->region_saved = remat__calloc(n, sizeof *out->region_saved);
  out->region_live_peak = remat__calloc(n, sizeof *out->region_live_peak);
  out->region_recompute = remat__calloc(n, sizeof *out->region_recompute);
  out->region_roofline = remat__calloc(n, sizeof *out->region_roofline);
  out->recomputed = remat__calloc((size_t)req->g->ntensors + 1,
                                  sizeof *out->recomputed);
  remat_status s = REMAT_ERR_OUT_OF_MEMORY;
  if (out->region_saved && out->region_live_peak && out->region_recompute &&
      out->region_roofline &&
      out->recomputed) {
    plan_lowering l;
    s = lower_graph(req, &l); /* on failure l is empty */
    if (s == REMAT_OK)
      s = lifetimes_assign(&l);
    if (s == REMAT_OK)
      s = measure_lowering(req->g, &l, nworkers, nnodes, costs, out);
    for (int32_t t = 0; s == REMAT_OK && t < req->g->ntensors; t++)
      out->recomputed[t] = l.recomp_buf[t] >= 0;
    lowering_free(&l);
  }
  if (s != REMAT_OK)
    measures_free(out);
  return s;
}

void measures_free(plan_measures *m) {
  free(m->region_saved);
  free(m->region_live_peak);
  free(m->region_recompute);
  free(m->region_roofline);
  free(m->recomputed);
  memset(m, 0, sizeof *m);
}
