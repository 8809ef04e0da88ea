/* How tensors are stored: the bytes the API reads and writes of a tensor,
 * the bytes of its buffers, and the element type a new tensor's buffers
 * get (the bf16 storage rule of mixed precision, frozen parameters
 * included). */
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

op_dtype graph_param_read_dtype(const remat_graph *g, op_type type, int i,
                                const op_shape *shape) {
  if (op_input_keeps_f32(type, i))
    return OP_F32;
  return graph_store_dtype(g, false, OP_F32, shape);
}

op_dtype graph_param_store(const remat_graph *g, const remat_tensor *t) {
  if (!t->frozen ||
      graph_store_dtype(g, false, OP_F32, &t->shape) != OP_BF16)
    return OP_F32;
  for (int32_t o = 0; o < g->nops; o++)
    for (int i = 0; i < g->ops[o].desc.nin; i++)
      if (g->ops[o].in[i] == t->id && g->ops[o].desc.in_dtype[i] != OP_BF16)
        return OP_F32;
  return OP_BF16;
}
