/* Per-node copies of replicated buffers (node_copies.h). */
#include <string.h>

#include "runtime/exec/node_copies.h"

float *node_copy(const compiled_step *c, const step_state *s, int32_t b,
                 int node) {
  if (s->copies != NULL && c->numa.replicated[b])
    return s->copies[(int64_t)b * c->numa.nnodes + node];
  return s->data[b];
}

void node_copies_refresh(const compiled_step *c, step_state *s, int32_t b,
                         int from, int64_t lo, int64_t hi) {
  const numa_plan *n = &c->numa;
  if (s->copies == NULL || !n->replicated[b])
    return;
  float **copy = s->copies + (int64_t)b * n->nnodes;
  size_t size = (size_t)op_dtype_size(c->low.bufs[b].dtype);
  for (int k = 0; k < n->nnodes; k++)
    if (k != from)
      memcpy((char *)copy[k] + (size_t)lo * size,
             (char *)copy[from] + (size_t)lo * size, (size_t)(hi - lo) * size);
}
