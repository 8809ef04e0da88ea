/* How tensors are stored: the bytes the API reads and writes of a tensor,
 * the bytes of its buffers, and the element type a new tensor's buffers
 * get (the bf16 storage rule of mixed precision). */
#include "runtime/internal.h"

int64_t tensor_bytes(const remat_tensor *t) { return op_numel(&t->shape) * 4; }

int64_t tensor_store_bytes(const remat_tensor *t) {
  return op_numel(&t->shape) * op_dtype_size(t->store);
}

op_dtype graph_store_dtype(const remat_graph *g, bool param, op_dtype dtype,
                           const op_shape *shape) {
  bool scalar = shape->ndim == 1 && shape->dim[0] == 1;
  if (g->rt->config.precision != REMAT_PRECISION_BF16 || param ||
      dtype != OP_F32 || scalar)
    return dtype;
  return OP_BF16;
}
