/* Replicated buffers (parameters on a machine of several NUMA nodes) have a
 * copy on every node: which copy a worker reads, and how a write to one
 * copy reaches the others. */
#ifndef REMAT_RUNTIME_NODE_COPIES_H
#define REMAT_RUNTIME_NODE_COPIES_H

#include "runtime/exec/step_state.h"

/* Buffer b's data as a worker on `node` reads it: the node's copy of a
 * replicated buffer, else the buffer itself. */
float *node_copy(const compiled_step *c, const step_state *s, int32_t b,
                 int node);
/* Copies elements [lo, hi) of replicated buffer b from node `from`'s copy
 * to the others (after an update tile or remat_write); nothing for other
 * buffers. */
void node_copies_refresh(const compiled_step *c, step_state *s, int32_t b,
                         int from, int64_t lo, int64_t hi);

#endif
