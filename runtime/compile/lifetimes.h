/* Stage "lifetimes": for every buffer of a lowering, the nodes that use it
 * (so the last one frees it), the node that allocates or zero-fills it, and
 * whether gradients accumulate into it; plus the step's FLOP totals. */
#ifndef REMAT_RUNTIME_LIFETIMES_H
#define REMAT_RUNTIME_LIFETIMES_H

#include "runtime/compile/lowering.h"

/* Fills touch/init of each node, users/first_writer/zero_fill of each
 * buffer, din_accumulate of each op kernel and the lowering's flops and
 * recompute_flops. Run once per lowering. */
remat_status lifetimes_assign(plan_lowering *l);

#endif
