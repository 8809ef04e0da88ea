/* Test fixture shared by the op-level tests (test_ops, test_ops_bf16,
 * test_attention): a oneDNN engine and stream made in the group setup,
 * a seeded xorshift generator, and shapes written inline (S2(3, 4)). */
#ifndef REMAT_TESTS_OP_FIXTURE_H
#define REMAT_TESTS_OP_FIXTURE_H

#include <stdarg.h>
#include <stdint.h>

#include "ops/op.h"

static dnnl_engine_t engine;
static dnnl_stream_t stream;
/* Each test program seeds it at the start of main. */
static uint64_t rng_state;

/* Uniform in [lo, hi) from a xorshift64 generator. */
static inline double uniform(double lo, double hi) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}

static inline op_shape shape(int ndim, ...) {
  op_shape s = {.ndim = ndim};
  va_list ap;
  va_start(ap, ndim);
  for (int i = 0; i < ndim; i++) s.dim[i] = va_arg(ap, int64_t);
  va_end(ap);
  return s;
}
#define S1(a) shape(1, (int64_t)(a))
#define S2(a, b) shape(2, (int64_t)(a), (int64_t)(b))
#define S3(a, b, c) shape(3, (int64_t)(a), (int64_t)(b), (int64_t)(c))
#define S4(a, b, c, d) \
  shape(4, (int64_t)(a), (int64_t)(b), (int64_t)(c), (int64_t)(d))

static int group_setup(void **state) {
  (void)state;
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) return -1;
  if (dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) !=
      dnnl_success)
    return -1;
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  dnnl_stream_destroy(stream);
  dnnl_engine_destroy(engine);
  return 0;
}

#endif
