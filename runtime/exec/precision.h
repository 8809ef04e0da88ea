/* bf16 precision in the runtime: the bf16 copies of parameters that
 * matmuls read (refreshed from the f32 masters after anything but an
 * update wrote them), and f32 <-> storage conversions for feeds and
 * reads. */
#ifndef REMAT_RUNTIME_PRECISION_H
#define REMAT_RUNTIME_PRECISION_H

#include "runtime/compile/step_plan.h"

/* If p->params_written: rewrites every parameter's per-node copies and
 * bf16 copy (and its per-node copies) from the f32 master on node 0;
 * clears it. */
void precision_refresh_copies(remat_step_plan *p);
/* Stores n f32 values into buffer b (converting to its dtype). */
void precision_store(const plan_buffer *b, const float *src, int64_t n);
/* Loads n values of buffer b as f32. */
void precision_load(const plan_buffer *b, float *dst, int64_t n);
/* Element 0 of buffer b (the loss, its gradient), read as f32 (NaN when
 * the buffer is not allocated) or written from f32, in the buffer's dtype:
 * a one-element loss of a shape other than [1] is stored in bf16. */
float precision_get1(const plan_buffer *b);
void precision_set1(plan_buffer *b, float v);

#endif
