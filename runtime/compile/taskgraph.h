/* Stage "DAG": turns the compiled step's kernel nodes into the scheduler's
 * task DAG with data, memory-order and gate edges. */
#ifndef REMAT_RUNTIME_TASKGRAPH_H
#define REMAT_RUNTIME_TASKGRAPH_H

#include "runtime/compile/step_plan.h"

/* Builds p->dag and p->tiles from p->low (after lifetimes). `lookahead`
 * is the number of regions whose recompute may run ahead of backward. */
remat_status taskgraph_build(remat_step_plan *p, int lookahead);

#endif
