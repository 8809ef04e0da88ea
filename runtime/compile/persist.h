/* Stage "persistent allocation": allocates and initializes the buffers
 * that live with the graph, and the per-worker scratchpads. */
#ifndef REMAT_RUNTIME_PERSIST_H
#define REMAT_RUNTIME_PERSIST_H

#include "runtime/compile/step_plan.h"

remat_status persist_allocate(remat_step_plan *p);

#endif
