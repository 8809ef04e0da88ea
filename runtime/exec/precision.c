/* bf16 precision in the runtime (precision.h): parameter copies refreshed
 * from their masters, and conversions of fed and read tensors. */
#include <math.h>
#include <string.h>

#include "base/bf16.h"
#include "runtime/exec/precision.h"

void precision_refresh_copies(remat_step_plan *p) {
  if (!p->params_written)
    return;
  for (int32_t t = 0; t < p->g->ntensors; t++) {
    if (p->g->tensors[t]->kind != TENSOR_PARAM)
      continue;
    int32_t v = p->low.value_buf[t], c = p->low.copy_buf[t];
    int64_t n = op_numel(&p->g->tensors[t]->shape);
    numa_refresh(p, v, 0, 0, n);
    if (c < 0)
      continue;
    bf16_from_f32_row((uint16_t *)numa_data(p, c, 0), numa_data(p, v, 0), n);
    numa_refresh(p, c, 0, 0, n);
  }
  p->params_written = false;
}

void precision_store(const plan_buffer *b, const float *src, int64_t n) {
  if (b->dtype == OP_BF16)
    bf16_from_f32_row((uint16_t *)b->data, src, n);
  else
    memcpy(b->data, src, (size_t)n * sizeof *src);
}

void precision_load(const plan_buffer *b, float *dst, int64_t n) {
  if (b->dtype == OP_BF16)
    bf16_to_f32_row(dst, (const uint16_t *)b->data, n);
  else
    memcpy(dst, b->data, (size_t)n * sizeof *dst);
}

float precision_get1(const plan_buffer *b) {
  if (b->data == NULL)
    return NAN;
  return b->dtype == OP_BF16 ? bf16_to_f32(*(const uint16_t *)b->data)
                             : b->data[0];
}

void precision_set1(plan_buffer *b, float v) {
  if (b->data == NULL)
    return;
  if (b->dtype == OP_BF16)
    *(uint16_t *)b->data = bf16_from_f32(v);
  else
    b->data[0] = v;
}
