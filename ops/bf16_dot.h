/* Small bf16 products of attention's blocks on AVX512-BF16 instructions
 * (vdpbf16ps), for the strided operands on which oneDNN 2.6 falls back to
 * gemm:jit and repacks both operands on every call: here the shared
 * operand of a tile is packed once and every block reuses it.
 *
 * Packed operand ("pairs"): for a matrix X(k, n), element pairs
 * (X(2p, n), X(2p + 1, n)) as one 32-bit word, a zero in the high half
 * past an odd k; in panels of `w` columns, word (p, n) of panel n / w at
 * panel * (kp * w) + p * w + n % w, kp = ceil(k / 2), columns past n in the
 * last panel zero. The product runs C(m, n) = alpha sum_k A(m, k) B(k, n)
 * (+ C) with B in pairs of panel width OP_BDOT_PANEL, and A either plain
 * row-major bf16 (pairs adjacent: k even) or in pairs of one panel (A^T
 * packed). Each C element is one f32 accumulator over k pairs in order,
 * scaled, added to C and rounded (to nearest even) once: a function of the
 * operands only, whatever the thread count. */
#ifndef REMAT_OPS_BF16_DOT_H
#define REMAT_OPS_BF16_DOT_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

#define OP_BDOT_PANEL 64

/* Whether this CPU runs the kernels (AVX-512 F, BW, VL and BF16) and
 * oneDNN's ISA cap allows avx512_core_bf16. */
bool op_bdot_available(void);

/* 32-bit words of a pairs pack of a k x n matrix in panels of w. */
int64_t op_bdot_pack_words(int64_t k, int64_t n, int64_t w);

/* Packs X(k, n) = x[i * ld + j] (plain, rows of n) or, when transposed,
 * X(k, n) = x[n * ld + k] (the transpose of a row-major matrix). */
void op_bdot_pack(uint32_t *dst, const uint16_t *x, int64_t k, int64_t n,
                  int64_t ld, bool transposed, int64_t w);

/* The A operand of a product: plain row-major with leading dimension ld
 * (k and ld even: a pair is one 32-bit word), or `packed`: the pack of
 * X(k, m) = A(m, k) in one panel of width ld >= m (any k). */
typedef struct op_bdot_a {
  const void *p;
  int64_t ld;
  bool packed;
} op_bdot_a;

/* C(m, n) = alpha A . B (+ C when accumulate), B the pack of a k x n
 * matrix (or a prefix of its pairs and columns: kp_stride pairs per
 * panel, starting at pair p0). C is f32 or bf16 with leading dimension
 * ldc. */
void op_bdot_run(int64_t m, int64_t n, int64_t k, float alpha, op_bdot_a a,
                 const uint32_t *b, int64_t kp_stride, int64_t p0, void *c,
                 int64_t ldc, op_dtype c_dt, bool accumulate);

#endif
