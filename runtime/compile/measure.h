/* What a candidate remat decision costs: the planner asks "lower with this
 * decision -> measurements" through measure_decision, which lowers, assigns
 * lifetimes and walks program order on a private lowering, then frees it.
 * Nothing of the caller's changes. */
#ifndef REMAT_RUNTIME_MEASURE_H
#define REMAT_RUNTIME_MEASURE_H

#include "runtime/compile/costs.h"
#include "runtime/compile/lowering.h"

typedef struct plan_measures {
  int64_t peak;             /* persistent + transient, in program order */
  int64_t persistent;       /* the persistent part of it */
  /* Per top-level region r (arrays of nregions; other regions stay 0): */
  int64_t *region_saved;    /* bytes of buffers first written by r's forward
                               nodes and still alive when backward starts */
  int64_t *region_live_peak; /* the most transient bytes alive while one of
                                r's nodes (forward, recompute or backward)
                                runs */
  double *region_recompute; /* cost of r's recompute nodes (plan_node_cost,
                               measured where the cost table has them) */
  double *region_roofline;  /* the same by the roofline alone */
  int64_t outside_live_peak; /* the most transient bytes alive while a node
                                outside every region runs */
  bool *recomputed;          /* [ntensors]: freed after forward and
                                recomputed for backward */
} plan_measures;

/* Lowers `req`, measures it into `out` (arrays allocated here, free with
 * measures_free) and frees the lowering. `costs` (NULL: none) gives
 * measured kernel times. */
remat_status measure_decision(const lower_request *req, int nworkers,
                              int nnodes, cost_table *costs,
                              plan_measures *out);
void measures_free(plan_measures *m);
/* The cost of one kernel node of an assigned lowering: its measured time
 * in FLOP units when `costs` has its kernel (costs.h), else the roofline,
 * max(its FLOPs, PLANNER_FLOPS_PER_BYTE x the bytes of the buffers it
 * touches). `costs` may be NULL. */
double plan_node_cost(const plan_lowering *l, const plan_knode *kn,
                      cost_table *costs);

#endif
