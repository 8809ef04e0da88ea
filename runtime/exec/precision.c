/* bf16 precision in the runtime (precision.h): parameter copies refreshed
 * from their masters, and conversions of fed and read tensors. */
#include <math.h>
#include <string.h>

#include "base/bf16.h"
#include "runtime/exec/node_copies.h"
#include "runtime/exec/precision.h"

void precision_refresh_copies(const compiled_step *c, step_state *s) {
  if (!s->params_written)
    return;
  const remat_graph *g = c->g;
  for (int32_t t = 0; t < g->ntensors; t++) {
    if (g->tensors[t]->kind != TENSOR_PARAM)
      continue;
    int32_t v = c->low.value_buf[t], cp = c->low.copy_buf[t];
    int64_t n = op_numel(&g->tensors[t]->shape);
    node_copies_refresh(c, s, v, 0, 0, n);
    if (cp < 0)
      continue;
    bf16_from_f32_row((uint16_t *)node_copy(c, s, cp, 0),
                      node_copy(c, s, v, 0), n);
    node_copies_refresh(c, s, cp, 0, 0, n);
  }
  s->params_written = false;
}

void precision_store(const plan_buffer *b, void *data, const float *src,
                     int64_t n) {
  if (b->dtype == OP_BF16)
    bf16_from_f32_row(data, src, n);
  else
    memcpy(data, src, (size_t)n * sizeof *src);
}

void precision_load(const plan_buffer *b, const void *data, float *dst,
                    int64_t n) {
  if (b->dtype == OP_BF16)
    bf16_to_f32_row(dst, data, n);
  else
    memcpy(dst, data, (size_t)n * sizeof *dst);
}

float precision_get1(const plan_buffer *b, const void *data) {
  if (data == NULL)
    return NAN;
  return b->dtype == OP_BF16 ? bf16_to_f32(*(const uint16_t *)data)
                             : *(const float *)data;
}

void precision_set1(const plan_buffer *b, void *data, float v) {
  if (data == NULL)
    return;
  if (b->dtype == OP_BF16)
    *(uint16_t *)data = bf16_from_f32(v);
  else
    *(float *)data = v;
}
