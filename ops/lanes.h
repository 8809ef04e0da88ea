/* Row reductions (rmsnorm.c) in OP_LANES interleaved partial sums, folded
 * in a fixed order: gcc vectorizes them (a single running sum would have
 * to add in element order), and a row's sum has the same bits at every
 * call, on every machine, whatever the vector width of the clone that
 * runs it. */
#ifndef REMAT_OPS_LANES_H
#define REMAT_OPS_LANES_H

#include <stdint.h>

#define OP_LANES 32

/* acc[0] + ... + acc[OP_LANES - 1], as a tree: lane l adds lane l + w for
 * w = 16, 8, 4, 2, 1. */
static inline float op_lanes_fold(float acc[OP_LANES]) {
  for (int w = OP_LANES / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; l++) acc[l] += acc[l + w];
  return acc[0];
}

/* sum_i a[i] * b[i] over n elements; element i goes to lane
 * i % OP_LANES. */
static inline float op_lanes_dot(const float *restrict a,
                                 const float *restrict b, int64_t n) {
  float acc[OP_LANES] = {0};
  int64_t i = 0;
  for (; i + OP_LANES <= n; i += OP_LANES)
    for (int l = 0; l < OP_LANES; l++) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < n; l++) acc[l] += a[i + l] * b[i + l];
  return op_lanes_fold(acc);
}

#endif
