/* bf16 precision in the runtime: the bf16 copies of parameters that
 * matmuls read (refreshed from the f32 masters after anything but an
 * update wrote them), and f32 <-> storage conversions for feeds and
 * reads. */
#ifndef REMAT_RUNTIME_PRECISION_H
#define REMAT_RUNTIME_PRECISION_H

#include "runtime/exec/step_state.h"

/* If s->params_written: rewrites every parameter's per-node copies and
 * bf16 copy (and its per-node copies) from the f32 master on node 0;
 * clears it. */
void precision_refresh_copies(const compiled_step *c, step_state *s);
/* Stores n f32 values into `data`, buffer b's memory (converting to b's
 * dtype). */
void precision_store(const plan_buffer *b, void *data, const float *src,
                     int64_t n);
/* Loads n values of buffer b (at `data`) as f32. */
void precision_load(const plan_buffer *b, const void *data, float *dst,
                    int64_t n);
/* Element 0 of buffer b at `data` (the loss, its gradient), read as f32
 * (NaN when data is NULL: not allocated) or written from f32, in the
 * buffer's dtype: a one-element loss of a shape other than [1] is stored
 * in bf16. */
float precision_get1(const plan_buffer *b, const void *data);
void precision_set1(const plan_buffer *b, void *data, float v);

#endif
