/* Dot ops on oneDNN matmul: linear (x . w^T + b) and matmul, plain or
 * batched. Forward and input-gradient kernels tile row blocks of the
 * flattened rows; weight gradients tile blocks of the weight, each block
 * reducing over all rows in one oneDNN call so the sum order is fixed. */
#include <string.h>

#include "ops/op_impl.h"

/* Weight-gradient blocks: rows of the gradient, and columns when wide. */
#define OP_DW_ROWS 64
#define OP_DW_COLS 256

static int64_t dw_cols(int64_t n) { return n <= 2 * OP_DW_COLS ? n : OP_DW_COLS; }

/* ---- linear ---- */

typedef struct linear_state {
  op_base base;
  int64_t rows, K, M;
  op_gemm fwd, dx, dw;
} linear_state;

remat_status op_linear_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"x", "w", "b"};
  static const op_dtype types[] = {OP_F32, OP_F32, OP_F32};
  remat_status rs = op_check_inputs(d, 2, 3, names, types, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *x = &d->in[0], *w = &d->in[1];
  char bx[OP_SHAPE_STR_MAX], bw[OP_SHAPE_STR_MAX], bb[OP_SHAPE_STR_MAX];
  if (w->ndim != 2)
    return op_shape_err(err, d, "x %s and w %s: w must have 2 dims",
                        op_shape_str(x, bx), op_shape_str(w, bw));
  int64_t k = x->dim[x->ndim - 1];
  if (k != w->dim[1])
    return op_shape_err(err, d,
                        "x %s and w %s: last dim of x (%lld) must equal dim "
                        "1 of w (%lld)",
                        op_shape_str(x, bx), op_shape_str(w, bw),
                        (long long)k, (long long)w->dim[1]);
  if (d->nin == 3 && (d->in[2].ndim != 1 || d->in[2].dim[0] != w->dim[0]))
    return op_shape_err(err, d, "w %s and b %s: b must be [%lld] (dim 0 of w)",
                        op_shape_str(w, bw), op_shape_str(&d->in[2], bb),
                        (long long)w->dim[0]);
  d->out = *x;
  d->out.dim[x->ndim - 1] = w->dim[0];
  return REMAT_OK;
}

// x is (N,K), w is (M,K), b is (M), y is (N,M): y = x . w^T + b
static int linear_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const linear_state *s = op->state;
  return op_gemm_run(&s->fwd, tile, b->in[0], b->in[1],
                     op->desc.nin == 3 ? b->in[2] : NULL, b->out, false, w);
}

// in the forward pass this was y = x . w^T, so dx (N,K) = dy (N,M) . w (M,K)
static int linear_dx(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const linear_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  return op_gemm_run(&s->dx, tile, b->dout, b->in[1], NULL, b->din[0],
                     b->din_accumulate[0], w);
}

// dw (M,K) = dy^T (M,N) . x (N,K), one block of dw per tile, all N rows
static int linear_dw(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const linear_state *s = op->state;
  if (!b->din[1]) return REMAT_OK;
  return op_gemm_run(&s->dw, tile, b->dout, b->in[0], NULL, b->din[1],
                     b->din_accumulate[1], w);
}

// db (M) = sum over the N rows of dy (N,M), one block of columns per tile
static int linear_db(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  (void)w;
  const linear_state *s = op->state;
  if (!b->din[2]) return REMAT_OK;
  int64_t c0 = tile * OP_COL_BLOCK, nc = op_min64(OP_COL_BLOCK, s->M - c0);
  float acc[OP_COL_BLOCK] = {0};
  for (int64_t r = 0; r < s->rows; r++) {
    const float *dy = b->dout + r * s->M + c0;
    for (int64_t c = 0; c < nc; c++) acc[c] += dy[c];
  }
  op_store(b->din[2] + c0, acc, nc, b->din_accumulate[2]);
  return REMAT_OK;
}

remat_status op_linear_plan(op_instance *inst, dnnl_engine_t engine,
                            char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  linear_state *s = op_state_new(sizeof *s, engine, "linear");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  int64_t N = op_rows(&d->in[0]), K = d->in[1].dim[1], M = d->in[1].dim[0];
  s->rows = N;
  s->K = K;
  s->M = M;
  op_gemm_init(&s->fwd, N, M, K, op_gemm_rows(M, K), M);
  op_gemm_layout(&s->fwd, op_plain(K), op_transposed(K), M); /* Y = X W^T */
  s->fwd.bias = d->nin == 3;
  s->fwd.accumulate_too = false;
  op_gemm_init(&s->dx, N, K, M, op_gemm_rows(K, M), K);
  op_gemm_layout(&s->dx, op_plain(M), op_plain(K), K); /* dX = dY W */
  op_gemm_init(&s->dw, M, K, N, OP_DW_ROWS, dw_cols(K));
  op_gemm_layout(&s->dw, op_transposed(M), op_plain(K), K); /* dW = dY^T X */
  remat_status rs = op_gemm_plan(&s->fwd, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dx, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dw, &s->base, err);
  if (rs != REMAT_OK) return rs;
  double flops = 2.0 * N * K * M;
  uint32_t wb = d->nin == 3 ? OP_SLOT_IN(2) : 0;
  inst->fwd[inst->nfwd++] =
      op_make_kernel("linear.fwd", linear_fwd, op_gemm_tiles(&s->fwd), flops,
             OP_SLOT_IN(0) | OP_SLOT_IN(1) | wb, OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("linear.dx", linear_dx, op_gemm_tiles(&s->dx), flops,
             OP_SLOT_DOUT | OP_SLOT_IN(1), OP_SLOT_DIN(0));
  inst->bwd[inst->nbwd++] =
      op_make_kernel("linear.dw", linear_dw, op_gemm_tiles(&s->dw), flops,
             OP_SLOT_DOUT | OP_SLOT_IN(0), OP_SLOT_DIN(1));
  if (d->nin == 3)
    inst->bwd[inst->nbwd++] =
        op_make_kernel("linear.db", linear_db, op_div_up(M, OP_COL_BLOCK),
               (double)N * M, OP_SLOT_DOUT, OP_SLOT_DIN(2));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}

/* ---- matmul ---- */

typedef struct matmul_state {
  op_base base;
  int64_t batch, N, K, M;
  op_gemm fwd, da, db;
} matmul_state;

remat_status op_matmul_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"a", "b"};
  static const op_dtype types[] = {OP_F32, OP_F32};
  remat_status rs = op_check_inputs(d, 2, 2, names, types, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *a = &d->in[0], *b = &d->in[1];
  char ba[OP_SHAPE_STR_MAX], bb[OP_SHAPE_STR_MAX];
  op_shape_str(a, ba);
  op_shape_str(b, bb);
  int nd = a->ndim;
  if (nd < 2 || b->ndim != nd)
    return op_shape_err(err, d,
                        "a %s and b %s: both must have the same number of "
                        "dims, at least 2",
                        ba, bb);
  for (int i = 0; i < nd - 2; i++)
    if (a->dim[i] != b->dim[i])
      return op_shape_err(err, d,
                          "a %s and b %s: batch dim %d differs (%lld vs %lld)",
                          ba, bb, i, (long long)a->dim[i],
                          (long long)b->dim[i]);
  if (a->dim[nd - 1] != b->dim[nd - 2])
    return op_shape_err(err, d,
                        "a %s and b %s: last dim of a (%lld) must equal dim "
                        "%d of b (%lld)",
                        ba, bb, (long long)a->dim[nd - 1], nd - 2,
                        (long long)b->dim[nd - 2]);
  d->out = *a;
  d->out.dim[nd - 1] = b->dim[nd - 1];
  return REMAT_OK;
}

// a is (Bt,N,K), b is (Bt,K,M), y is (Bt,N,M): y[i] = a[i] . b[i]
static int matmul_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const matmul_state *s = op->state;
  int64_t per = op_gemm_tiles(&s->fwd), i = tile / per;
  return op_gemm_run(&s->fwd, tile % per, b->in[0] + i * s->N * s->K,
                     b->in[1] + i * s->K * s->M, NULL,
                     b->out + i * s->N * s->M, false, w);
}

// in the forward pass y = a . b, so da (N,K) = dy (N,M) . b^T (M,K)
static int matmul_da(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const matmul_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  int64_t per = op_gemm_tiles(&s->da), i = tile / per;
  return op_gemm_run(&s->da, tile % per, b->dout + i * s->N * s->M,
                     b->in[1] + i * s->K * s->M, NULL,
                     b->din[0] + i * s->N * s->K, b->din_accumulate[0], w);
}

// and db (K,M) = a^T (K,N) . dy (N,M), reducing over all N rows per block
static int matmul_db(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const matmul_state *s = op->state;
  if (!b->din[1]) return REMAT_OK;
  int64_t per = op_gemm_tiles(&s->db), i = tile / per;
  return op_gemm_run(&s->db, tile % per, b->in[0] + i * s->N * s->K,
                     b->dout + i * s->N * s->M, NULL,
                     b->din[1] + i * s->K * s->M, b->din_accumulate[1], w);
}

remat_status op_matmul_plan(op_instance *inst, dnnl_engine_t engine,
                            char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  matmul_state *s = op_state_new(sizeof *s, engine, "matmul");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  int nd = d->in[0].ndim;
  int64_t N = d->in[0].dim[nd - 2], K = d->in[0].dim[nd - 1];
  int64_t M = d->in[1].dim[nd - 1];
  s->batch = op_numel(&d->in[0]) / (N * K);
  s->N = N;
  s->K = K;
  s->M = M;
  op_gemm_init(&s->fwd, N, M, K, op_gemm_rows(M, K), M);
  s->fwd.accumulate_too = false;
  op_gemm_init(&s->da, N, K, M, op_gemm_rows(K, M), K);
  op_gemm_layout(&s->da, op_plain(M), op_transposed(M), K); /* dA = dC B^T */
  op_gemm_init(&s->db, K, M, N, OP_DW_ROWS, dw_cols(M));
  op_gemm_layout(&s->db, op_transposed(K), op_plain(M), M); /* dB = A^T dC */
  remat_status rs = op_gemm_plan(&s->fwd, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->da, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->db, &s->base, err);
  if (rs != REMAT_OK) return rs;
  double flops = 2.0 * s->batch * N * K * M;
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "matmul.fwd", matmul_fwd, s->batch * op_gemm_tiles(&s->fwd), flops,
      OP_SLOT_IN(0) | OP_SLOT_IN(1), OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("matmul.da", matmul_da, s->batch * op_gemm_tiles(&s->da), flops,
             OP_SLOT_DOUT | OP_SLOT_IN(1), OP_SLOT_DIN(0));
  inst->bwd[inst->nbwd++] =
      op_make_kernel("matmul.db", matmul_db, s->batch * op_gemm_tiles(&s->db), flops,
             OP_SLOT_DOUT | OP_SLOT_IN(0), OP_SLOT_DIN(1));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
