/* What a compiled plan decided, for programs and tests to read: every
 * tensor of the graph, and per tensor saved or recomputed, the deciding
 * region and the policy that region got. */
#include "runtime/exec/step_state.h"

int remat_num_tensors(const remat_graph *g) {
  return g == NULL ? 0 : (int)g->ntensors;
}

remat_tensor *remat_tensor_at(const remat_graph *g, int i) {
  if (g == NULL || i < 0 || i >= g->ntensors)
    return NULL;
  return g->tensors[i];
}

static const remat_policy_source sources[] = {
    [REGION_OWN] = REMAT_POLICY_OWN,
    [REGION_DEFAULT] = REMAT_POLICY_DEFAULT,
    [REGION_BUDGET] = REMAT_POLICY_BUDGET};

remat_status remat_tensor_plan_of(const remat_graph *g, const remat_tensor *t,
                                  remat_tensor_plan *out) {
  if (g == NULL || t == NULL || out == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_tensor_plan_of: g, t and out must not be NULL");
  if (t->graph != g)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_tensor_plan_of: tensor '%s' belongs to another "
                       "graph",
                       t->name);
  if (!g->compiled)
    return remat__fail(REMAT_ERR_STATE,
                       "remat_tensor_plan_of: the graph is not compiled: "
                       "call remat_compile first");
  /* one call at a time: a step's re-plan (replan.h) replaces the plan */
  remat_graph *busy = (remat_graph *)g;
  remat_status s = graph_enter(busy, "remat_tensor_plan_of");
  if (s != REMAT_OK)
    return s;
  const compiled_step *c = &g->step->compiled;
  int32_t r = c->decision.deciding_region[t->id];
  /* an activation that no node touches is a linear's output that a fused
   * kernel never stores: neither saved nor recomputed */
  bool stored = t->kind != TENSOR_ACT ||
                c->low.bufs[c->low.value_buf[t->id]].users > 0;
  out->saved = c->decision.saved[t->id] && stored;
  out->recomputed = c->low.recomp_buf[t->id] >= 0;
  out->region = r;
  out->policy = r >= 0 ? c->decision.region_policy[r] : "";
  out->source = r >= 0 ? sources[c->decision.source[r]] : REMAT_POLICY_NONE;
  graph_leave(busy);
  return REMAT_OK;
}
