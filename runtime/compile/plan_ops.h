/* Stage "plan ops": every op of the graph gets its oneDNN primitives,
 * kernels, tile counts and buffer sizes (ops/'s op_plan). */
#ifndef REMAT_RUNTIME_PLAN_OPS_H
#define REMAT_RUNTIME_PLAN_OPS_H

#include "runtime/internal.h"

/* Plans each op of g in place (g->ops[o].inst); records the first failure
 * on g. */
remat_status plan_ops(remat_graph *g);

/* Stage "fuse" (fuse.c), after plan_ops: marks each gelu or add whose
 * input is the output of a linear that no other op reads (same top-level
 * region, not kept, not the loss) and plans that linear's fused kernel
 * (op_fuse); lowering decides per remat decision where the fused kernel
 * runs. Nothing is marked when the runtime was created with REMAT_FUSE=0,
 * or where oneDNN has no such kernel. */
remat_status plan_fusions(remat_graph *g, int32_t loss);

#endif
