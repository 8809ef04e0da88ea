/* Stage "plan ops": every op of the graph gets its oneDNN primitives,
 * kernels, tile counts and buffer sizes (ops/'s op_plan). */
#ifndef REMAT_RUNTIME_PLAN_OPS_H
#define REMAT_RUNTIME_PLAN_OPS_H

#include "runtime/internal.h"

/* Plans each op of g in place (g->ops[o].inst); records the first failure
 * on g. */
remat_status plan_ops(remat_graph *g);

#endif
