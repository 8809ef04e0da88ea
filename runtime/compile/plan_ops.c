/* Stage "plan ops" (plan_ops.h): op_plan for every op, on the runtime's
 * oneDNN engine. */
#include "runtime/compile/plan_ops.h"

remat_status plan_ops(remat_graph *g) {
  char err[OP_ERRMSG_MAX];
  for (int32_t o = 0; o < g->nops; o++) {
    remat_status s =
        op_plan(&g->ops[o].desc, g->rt->engine, &g->ops[o].inst, err);
    if (s != REMAT_OK)
      return graph_fail(g, s, "%s", err);
    g->ops[o].planned = true;
  }
  return REMAT_OK;
}
