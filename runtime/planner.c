/* The remat planner: resolves each region's policy (its own, or the
 * runtime's default) and decides which activations are saved. */
#include <stdlib.h>

#include "runtime/plan.h"
#include "runtime/policy.h"

remat_status policy_decide(remat_graph *g, bool *saved) {
  remat_policy *fallback = NULL;
  const remat_policy **pol = calloc((size_t)g->nregions + 1, sizeof *pol);
  if (pol == NULL)
    return graph_fail(g, REMAT_ERR_OUT_OF_MEMORY, "remat_compile: out of memory");
  remat_status s = policy_resolve_default(g, &fallback);
  for (int32_t r = 0; s == REMAT_OK && r < g->nregions; r++) {
    pol[r] = g->regions[r].policy ? g->regions[r].policy : fallback;
    s = policy_check_names(g, pol[r]);
  }
  if (s == REMAT_OK)
    s = policy_decide_with(g, saved, pol);
  remat_policy_destroy(fallback);
  free(pol);
  return s;
}
