/* Dot ops on oneDNN matmul: linear (x . w^T + b) and matmul, plain or
 * batched. Forward and input-gradient kernels tile row blocks of the
 * flattened rows. Linear's weight and bias gradients are partial sums over
 * fixed chunks of rows (op_dw_chunk_rows), one tile per chunk and block of
 * the weight, then the partials added in chunk order; matmul's weight
 * gradient tiles blocks of it, each reducing over all rows in one oneDNN
 * call. Either way the sum order is fixed by the shapes.
 * In bf16 precision every product takes its operands in their stored
 * dtypes (bf16 activations, bf16 weight copies; oneDNN accumulates in f32)
 * and writes its result's dtype; linear's partial sums stay f32, and db
 * sums bf16 rows of dy in f32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "ops/op_impl.h"

/* Weight-gradient blocks: rows of the gradient, and columns when wide.
 * oneDNN's gemm:jit packs the tile's chunk of x again for every block of
 * rows, so 256 rows pack it a quarter as often as 64 did: the default
 * GPT's bf16 dw kernels went from 0.84-0.99 of the one-thread roofline
 * to 0.95-1.0 warm, and 0.61-0.76 to 0.82-0.94 cold (bench_dw,
 * docs/performance.md "Weight gradients"). */
#define OP_DW_ROWS 256
/* The batched matmul's dB blocks: 64 rows, not measured since. */
#define OP_MATMUL_DB_ROWS 64
#define OP_DW_COLS 256

static int64_t dw_cols(int64_t n) { return n <= 2 * OP_DW_COLS ? n : OP_DW_COLS; }

/* ---- linear ---- */

typedef struct linear_state {
  op_base base;
  int64_t rows, K, M;
  int64_t chunk_rows, chunks; /* weight-gradient chunks of rows */
  op_dtype dy_dt;               /* of dout */
  op_dtype dw_dt, db_dt;        /* of din[1], din[2] */
  /* A bf16 product with an f32 x or dy: in bf16 precision only a [1]
   * tensor is f32 (an f32 input, or an output that is a loss), so the
   * operand has one element, rounded to bf16 into the op's temporary. */
  bool cvt_x, cvt_dy;
  /* The dw products read a tile-local transposed copy of their block of
   * dy (plain, which oneDNN's brgemm takes) rather than dy^T in place
   * (strided, on gemm:jit): see dw_form. */
  bool dw_t;
  bool dw_wide; /* dw blocks span all of K (dw_form) */
  op_gemm fwd, dx, dw, dw_last; /* dw over a full chunk, the last one */
  op_gemm fused;                /* fwd with its consumer's epilogue */
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

/* x (k 0) or dy (k 1) as the products read it: itself, or its one f32
 * element rounded to bf16 in the temporary (cvt_x, cvt_dy). */
static const void *operand(const linear_state *s, const float *p, int k,
                           op_worker *w) {
  if (!(k ? s->cvt_dy : s->cvt_x)) return p;
  uint16_t *t = (uint16_t *)op_temp(&s->base, w) + k;
  *t = bf16_from_f32(p[0]);
  return t;
}

// x is (N,K), w is (M,K), b is (M), y is (N,M): y = x . w^T + b
static int linear_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const linear_state *s = op->state;
  return op_gemm_run(&s->fwd, tile, operand(s, b->in[0], 0, w), b->in[1],
                     op->desc.nin == 3 ? b->in[2] : NULL, b->out, false, w);
}

// the same with the consumer of y fused in: z = gelu(x . w^T + b), or
// z = x . w^T + b + r with r (N,M) in slot 3; z is the consumer's output
static int linear_fwd_fused(const op_instance *op, const op_bufs *b,
                            int64_t tile, op_worker *w) {
  const linear_state *s = op->state;
  const void *x = operand(s, b->in[0], 0, w);
  const void *bias = op->desc.nin == 3 ? b->in[2] : NULL;
  if (s->fused.post_add)
    return op_gemm_run_add(&s->fused, tile, x, b->in[1], bias, b->in[3],
                           b->out, w);
  return op_gemm_run(&s->fused, tile, x, b->in[1], bias, b->out, false, w);
}

// in the forward pass this was y = x . w^T, so dx (N,K) = dy (N,M) . w (M,K)
static int linear_dx(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const linear_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  return op_gemm_run(&s->dx, tile, operand(s, b->dout, 1, w), b->in[1], NULL,
                     b->din[0], b->din_accumulate[0], w);
}

/* db's rows m0..m0+nm summed over nr rows of dy, into dst. */
static void db_rows(const linear_state *s, const float *dy, int64_t nr,
                    int64_t m0, int64_t nm, float *dst, bool accumulate) {
  float acc[OP_DW_ROWS] = {0}; /* nm <= OP_DW_ROWS */
  for (int64_t r = 0; r < nr; r++) {
    const float *restrict row = dy + r * s->M + m0;
    for (int64_t m = 0; m < nm; m++) acc[m] += row[m];
  }
  op_store(dst, acc, nm, accumulate);
}

/* db_rows over bf16 rows of dy, summed in f32 (dst of dtype dt). */
static void db_rows_bf16(const linear_state *s, const uint16_t *dy,
                         int64_t nr, int64_t m0, int64_t nm, void *dst,
                         op_dtype dt, bool accumulate) {
  float acc[OP_DW_ROWS] = {0};
  for (int64_t r = 0; r < nr; r++) {
    const uint16_t *restrict row = dy + r * s->M + m0;
    for (int64_t m = 0; m < nm; m++) acc[m] += bf16_to_f32(row[m]);
  }
  op_store_dt(dst, dt, 0, acc, nm, accumulate);
}

/* dy's rows [0, nr) and columns [m0, m0 + nm) (row length M, elements
 * of dtype T) transposed into t: nm rows of nr. In 8 x 8 blocks, each
 * read as 8 contiguous runs and written as 8, held in registers between
 * (fixed trip counts the compiler unrolls); the edges element by element. */
#define DY_BLOCK_T(T)                                                        \
  static void dy_block_t_##T(const T *src, int64_t M, int64_t nr,          \
                             int64_t nm, T *dst) {                         \
    int64_t r8 = nr / 8 * 8, i8 = nm / 8 * 8;                              \
    for (int64_t r0 = 0; r0 < r8; r0 += 8)                                 \
      for (int64_t i0 = 0; i0 < i8; i0 += 8) {                             \
        T blk[8][8];                                                       \
        for (int r = 0; r < 8; r++)                                        \
          for (int i = 0; i < 8; i++) blk[i][r] = src[(r0 + r) * M + i0 + i]; \
        for (int i = 0; i < 8; i++)                                        \
          for (int r = 0; r < 8; r++) dst[(i0 + i) * nr + r0 + r] = blk[i][r]; \
      }                                                                    \
    for (int64_t i = 0; i < nm; i++)                                       \
      for (int64_t r = i < i8 ? r8 : 0; r < nr; r++)                       \
        dst[i * nr + r] = src[r * M + i];                                  \
  }
DY_BLOCK_T(float)
DY_BLOCK_T(uint16_t)

static void dy_block_t(const void *dy, int64_t M, int64_t nr, int64_t m0,
                       int64_t nm, op_dtype dt, void *t) {
  if (dt == OP_BF16)
    dy_block_t_uint16_t((const uint16_t *)dy + m0, M, nr, nm, t);
  else
    dy_block_t_float((const float *)dy + m0, M, nr, nm, t);
}

// dw (M,K) = dy^T (M,N) . x (N,K) and db (M) = the sum of dy's N rows:
// tile (c, j) sums the rows of chunk c into block j of the chunk's
// partials ws[0] (of dw itself when there is one chunk); the tiles of the
// first column block also sum them into the block's rows of db (ws[1]).
// Partials are always computed: the kernel does not see whether the sums
// need them (linear.dw_sum and linear.db_sum are skipped when not)
static int linear_dw(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const linear_state *s = op->state;
  int64_t per = op_gemm_tiles(&s->dw), c = tile / per, j = tile % per;
  int64_t r0 = c * s->chunk_rows, nr = op_min64(s->chunk_rows, s->rows - r0);
  bool direct = s->chunks == 1, bias = op->desc.nin == 3;
  int rs = REMAT_OK;
  if (!direct || b->din[1]) {
    const op_gemm *g = nr == s->chunk_rows ? &s->dw : &s->dw_last;
    void *dst = direct ? b->din[1] : b->ws[0] + c * s->M * s->K;
    bool acc = direct && b->din_accumulate[1];
    /* a converted (one-element) operand has one row: r0 is 0 */
    const void *dy = op_at(operand(s, b->dout, 1, w), r0 * s->M, g->a_dt);
    const void *x = op_at(operand(s, b->in[0], 0, w), r0 * s->K, g->b_dt);
    if (s->dw_t) { /* dy's block of rows of dw, transposed */
      int64_t m0 = j / op_div_up(s->K, g->bn) * g->bm;
      void *t = op_temp(&s->base, w);
      dy_block_t(dy, s->M, nr, m0, op_min64(g->bm, s->M - m0), g->a_dt, t);
      rs = op_gemm_run_block_a(g, j, t, x, dst, acc, w);
    } else {
      rs = op_gemm_run(g, j, dy, x, NULL, dst, acc, w);
    }
  }
  int64_t tiles_n = op_div_up(s->K, s->dw.bn);
  if (rs == REMAT_OK && (direct ? b->din[2] != NULL : bias) &&
      j % tiles_n == 0) {
    int64_t m0 = j / tiles_n * s->dw.bm, nm = op_min64(s->dw.bm, s->M - m0);
    op_dtype dt = direct ? s->db_dt : OP_F32;
    void *dst = direct ? op_at(b->din[2], m0, dt) : b->ws[1] + c * s->M + m0;
    bool acc = direct && b->din_accumulate[2];
    if (s->dy_dt == OP_BF16)
      db_rows_bf16(s, (const uint16_t *)b->dout + r0 * s->M, nr, m0, nm, dst,
                   dt, acc);
    else
      db_rows(s, b->dout + r0 * s->M, nr, m0, nm, dst, acc);
  }
  return rs;
}

// dw = the chunks' partials added in chunk order, a flat block per tile
static int linear_dw_sum(const op_instance *op, const op_bufs *b,
                         int64_t tile, op_worker *w) {
  const linear_state *s = op->state;
  if (!b->din[1]) return REMAT_OK;
  int64_t n = s->M * s->K, i0 = tile * OP_FLAT_ELEMS;
  int64_t len = op_min64(OP_FLAT_ELEMS, n - i0);
  if (s->dw_dt != OP_BF16) {
    op_sum_partials(b->ws[0] + i0, n, s->chunks, len, b->din[1] + i0,
                    b->din_accumulate[1]);
    return REMAT_OK;
  }
  float *sum = op_temp(&s->base, w);
  op_sum_partials(b->ws[0] + i0, n, s->chunks, len, sum, false);
  op_store_dt(b->din[1], OP_BF16, i0, sum, len, b->din_accumulate[1]);
  return REMAT_OK;
}

// db = the chunks' partials of db added in chunk order
static int linear_db_sum(const op_instance *op, const op_bufs *b,
                         int64_t tile, op_worker *w) {
  const linear_state *s = op->state;
  if (!b->din[2]) return REMAT_OK;
  int64_t i0 = tile * OP_FLAT_ELEMS, len = op_min64(OP_FLAT_ELEMS, s->M - i0);
  if (s->db_dt != OP_BF16) {
    op_sum_partials(b->ws[1] + i0, s->M, s->chunks, len, b->din[2] + i0,
                    b->din_accumulate[2]);
    return REMAT_OK;
  }
  float *sum = op_temp(&s->base, w);
  op_sum_partials(b->ws[1] + i0, s->M, s->chunks, len, sum, false);
  op_store_dt(b->din[2], OP_BF16, i0, sum, len, b->din_accumulate[2]);
  return REMAT_OK;
}

/* The dw gemm of chunks of `rows` rows, into a gradient of dtype c (the
 * partials are f32). */
static void dw_gemm_init(const linear_state *s, op_gemm *g, int64_t rows,
                         op_dtype x_dt, op_dtype c) {
  op_gemm_init(g, s->M, s->K, rows, OP_DW_ROWS,
               s->dw_wide ? s->K : dw_cols(s->K));
  /* dW = dY^T X, dY^T in place or its block's copy (dw_t) */
  op_gemm_layout(g, s->dw_t ? op_plain(rows) : op_transposed(s->M),
                 op_plain(s->K), s->K);
  op_gemm_dtypes(g, s->cvt_dy ? OP_BF16 : s->dy_dt, x_dt, c);
}

/* The largest transposed block of dy a dw tile copies (its temporary):
 * 256 rows of dw by a chunk of up to 4096 f32 rows. */
#define OP_DW_T_BYTES (4 << 20)
/* The widest K whose dw blocks span all of it (measured up to here). */
#define OP_DW_WIDE_MAX 2048

/* The form of the dw products, a rule of the shapes measured per shape
 * with bench_dw (docs/performance.md), never of thread counts or
 * timings, so that the results stay the same bits on every machine:
 * dy^T read in place (oneDNN's gemm:jit), in blocks spanning all of K up
 * to OP_DW_WIDE_MAX (8-13% quicker than blocks of OP_DW_COLS columns at
 * K 1536 and 2048), of OP_DW_ROWS rows. A tile-local transposed copy of
 * dy's block (plain, which oneDNN's brgemm takes) lost 2-25% on every
 * shape measured (the copy costs more than brgemm gains), so the rule does
 * not pick it (both measured with blocks of 64 rows).
 * REMAT_BENCH_DW_KERNEL (read at planning; not public) forces "strided"
 * (blocks of OP_DW_COLS columns, the column blocks before the rule) or
 * "transposed" (the copy, with the rule's blocks), for the benchmarks'
 * A/B. Converted one-element operands keep dy in place (they use the
 * temporary). */
static void dw_form(linear_state *s, op_dtype dy_dt) {
  const char *v = getenv("REMAT_BENCH_DW_KERNEL");
  bool strided = v != NULL && strcmp(v, "strided") == 0;
  bool transposed = v != NULL && strcmp(v, "transposed") == 0;
  s->dw_wide = !strided && s->K <= OP_DW_WIDE_MAX;
  int64_t bytes = op_min64(OP_DW_ROWS, s->M) * s->chunk_rows *
                  op_dtype_size(dy_dt);
  s->dw_t = transposed && !s->cvt_x && !s->cvt_dy && bytes <= OP_DW_T_BYTES;
}

static remat_status linear_gemms(linear_state *s, const op_desc *d,
                                 char err[OP_ERRMSG_MAX]) {
  int64_t N = s->rows, K = s->K, M = s->M;
  bool bias = d->nin == 3;
  op_dtype x_dt = s->cvt_x ? OP_BF16 : d->in_dtype[0];
  op_dtype dy_dt = s->cvt_dy ? OP_BF16 : s->dy_dt;
  op_gemm_init(&s->fwd, N, M, K, op_gemm_rows(M, K), M);
  op_gemm_layout(&s->fwd, op_plain(K), op_transposed(K), M); /* Y = X W^T */
  op_gemm_dtypes(&s->fwd, x_dt, d->in_dtype[1], d->out_dtype);
  s->fwd.bias = bias;
  if (bias) s->fwd.bias_dt = d->in_dtype[2];
  s->fwd.accumulate_too = false;
  op_gemm_init(&s->dx, N, K, M, op_gemm_rows(K, M), K);
  op_gemm_layout(&s->dx, op_plain(M), op_plain(K), K); /* dX = dY W */
  op_gemm_dtypes(&s->dx, dy_dt, d->in_dtype[1], d->din_dtype[0]);
  s->chunk_rows = op_dw_chunk_rows(N, M * K);
  s->chunks = op_div_up(N, s->chunk_rows);
  dw_form(s, dy_dt);
  dw_gemm_init(s, &s->dw, s->chunk_rows, x_dt,
               s->chunks == 1 ? s->dw_dt : OP_F32);
  s->dw.accumulate_too = s->chunks == 1;
  remat_status rs = op_gemm_plan(&s->fwd, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dx, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->dw, &s->base, err);
  int64_t last = N - (s->chunks - 1) * s->chunk_rows;
  if (rs == REMAT_OK && last != s->chunk_rows) {
    dw_gemm_init(s, &s->dw_last, last, x_dt, OP_F32);
    s->dw_last.accumulate_too = false;
    rs = op_gemm_plan(&s->dw_last, &s->base, err);
  }
  return rs;
}

/* The weight-gradient kernels: one (dw and db straight into their
 * gradients) for one chunk, else partials and their two sums. */
static void linear_dw_kernels(op_instance *inst, linear_state *s, bool bias) {
  int64_t N = s->rows, K = s->K, M = s->M, per = op_gemm_tiles(&s->dw);
  uint32_t din = OP_SLOT_DIN(1) | (bias ? OP_SLOT_DIN(2) : 0);
  uint32_t ws = OP_SLOT_WS(0) | (bias ? OP_SLOT_WS(1) : 0);
  bool direct = s->chunks == 1;
  op_kernel *k = &inst->bwd[inst->nbwd++];
  *k = op_make_kernel("linear.dw", linear_dw, s->chunks * per,
                      2.0 * N * K * M + (bias ? (double)N * M : 0.0),
                      OP_SLOT_DOUT | OP_SLOT_IN(0), direct ? din : ws);
  if (direct) {
    k->span = op_span_cols(din, OP_SLOT_DOUT);
    return;
  }
  /* tile (c, j) reads chunk c's rows: dy's columns of its block's rows of
   * dw, x's columns of its block's columns */
  k->span = op_span_rows(N, s->chunk_rows, OP_SLOT_DOUT | OP_SLOT_IN(0));
  k->span.row_tiles = per;
  k->span.tile_slots = ws;
  k->span.row_parts[op_slot_index(OP_SLOT_DOUT)] =
      (int32_t)op_div_up(M, s->dw.bm);
  k->span.row_parts[op_slot_index(OP_SLOT_IN(0))] =
      (int32_t)op_div_up(K, s->dw.bn);
  inst->nws = bias ? 2 : 1;
  inst->ws_bytes[0] = (size_t)(s->chunks * M * K) * sizeof(float);
  inst->ws_bytes[1] = bias ? (size_t)(s->chunks * M) * sizeof(float) : 0;
  k = &inst->bwd[inst->nbwd++];
  *k = op_make_kernel("linear.dw_sum", linear_dw_sum,
                      op_div_up(M * K, OP_FLAT_ELEMS),
                      (double)s->chunks * M * K, OP_SLOT_WS(0),
                      OP_SLOT_DIN(1));
  k->span = op_span_rows(M * K, OP_FLAT_ELEMS, OP_SLOT_DIN(1));
  k->span.spread_slots = OP_SLOT_WS(0);
  if (!bias) return;
  k = &inst->bwd[inst->nbwd++];
  *k = op_make_kernel("linear.db_sum", linear_db_sum,
                      op_div_up(M, OP_FLAT_ELEMS), (double)s->chunks * M,
                      OP_SLOT_WS(1), OP_SLOT_DIN(2));
  k->span = op_span_rows(M, OP_FLAT_ELEMS, OP_SLOT_DIN(2));
  k->span.spread_slots = OP_SLOT_WS(1);
}

remat_status op_linear_plan(op_instance *inst, dnnl_engine_t engine,
                            char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  linear_state *s = op_state_new(sizeof *s, engine, "linear");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  bool bias = d->nin == 3;
  s->rows = op_rows(&d->in[0]);
  s->K = d->in[1].dim[1];
  s->M = d->in[1].dim[0];
  s->dy_dt = d->out_dtype;
  s->dw_dt = d->din_dtype[1];
  s->db_dt = bias ? d->din_dtype[2] : OP_F32;
  bool lowp = d->in_dtype[0] == OP_BF16 || d->in_dtype[1] == OP_BF16 ||
              d->out_dtype == OP_BF16;
  s->cvt_x = lowp && d->in_dtype[0] == OP_F32;
  s->cvt_dy = lowp && d->out_dtype == OP_F32;
  char bx[OP_SHAPE_STR_MAX], bw[OP_SHAPE_STR_MAX];
  if ((lowp && d->in_dtype[1] == OP_F32) ||
      (s->cvt_x && s->rows * s->K != 1) || (s->cvt_dy && s->rows * s->M != 1))
    return op_shape_err(err, d,
                        "x %s (%s), w %s (%s), y (%s): a product with a bf16 "
                        "operand takes f32 only for one-element x or y",
                        op_shape_str(&d->in[0], bx),
                        op_dtype_name(d->in_dtype[0]),
                        op_shape_str(&d->in[1], bw),
                        op_dtype_name(d->in_dtype[1]),
                        op_dtype_name(d->out_dtype));
  remat_status rs = linear_gemms(s, d, err);
  if (rs != REMAT_OK) return rs;
  /* bf16 gradients of w or b summed from f32 partials: a block of sums */
  if (s->chunks > 1 && (s->dw_dt == OP_BF16 || s->db_dt == OP_BF16))
    s->base.temp_bytes = OP_FLAT_ELEMS * sizeof(float);
  size_t dw_t_bytes = (size_t)(op_min64(OP_DW_ROWS, s->M) * s->chunk_rows) *
                      (size_t)op_dtype_size(s->dw.a_dt);
  if (s->dw_t && s->base.temp_bytes < dw_t_bytes)
    s->base.temp_bytes = dw_t_bytes; /* the transposed block of dy */
  if ((s->cvt_x || s->cvt_dy) && s->base.temp_bytes < 64)
    s->base.temp_bytes = 64; /* the converted operands */
  int64_t N = s->rows;
  double flops = 2.0 * N * s->K * s->M;
  op_kernel *k = &inst->fwd[inst->nfwd++];
  uint32_t weights = OP_SLOT_IN(1) | (bias ? OP_SLOT_IN(2) : 0);
  *k = op_make_kernel("linear.fwd", linear_fwd, op_gemm_tiles(&s->fwd), flops,
                      OP_SLOT_IN(0) | weights, OP_SLOT_OUT);
  k->span = op_span_rows(N, s->fwd.bm, OP_SLOT_IN(0) | OP_SLOT_OUT);
  k = &inst->bwd[inst->nbwd++];
  *k = op_make_kernel("linear.dx", linear_dx, op_gemm_tiles(&s->dx), flops,
                      OP_SLOT_DOUT | OP_SLOT_IN(1), OP_SLOT_DIN(0));
  k->span = op_span_rows(N, s->dx.bm, OP_SLOT_DOUT | OP_SLOT_DIN(0));
  linear_dw_kernels(inst, s, bias);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}

remat_status op_linear_fuse(op_instance *inst, const op_desc *next, int in,
                            char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  linear_state *s = inst->state;
  bool gelu = next->type == OP_GELU && next->nin == 1 && in == 0;
  bool add = next->type == OP_ADD && next->nin == 2 && (in == 0 || in == 1);
  char by[OP_SHAPE_STR_MAX], bn[OP_SHAPE_STR_MAX];
  if (!s || inst->nfused || (!gelu && !add) ||
      !op_shape_eq(&next->in[in], &d->out) ||
      !op_shape_eq(&next->out, &d->out) ||
      next->in_dtype[in] != d->out_dtype) {
    snprintf(err, OP_ERRMSG_MAX,
             "linear: y %s (%s) does not fuse into %s of %s input %d (%s): "
             "only into a gelu of y or an add of y and a tensor of its shape",
             op_shape_str(&d->out, by), op_dtype_name(d->out_dtype),
             op_name(next->type), op_shape_str(&next->in[in], bn), in,
             op_dtype_name(next->in_dtype[in]));
    return REMAT_ERR_INVALID_ARG;
  }
  s->fused = s->fwd;
  memset(s->fused.prim, 0, sizeof s->fused.prim);
  s->fused.c_dt = next->out_dtype;
  if (gelu)
    s->fused.post_eltwise = next->attrs.gelu_erf ? dnnl_eltwise_gelu_erf
                                                 : dnnl_eltwise_gelu_tanh;
  s->fused.post_add = add;
  s->fused.add_dt = add ? next->in_dtype[1 - in] : OP_F32;
  remat_status rs = op_gemm_plan(&s->fused, &s->base, err);
  if (rs != REMAT_OK) return rs;
  int64_t N = s->rows, n = N * s->M;
  double flops = 2.0 * N * s->K * s->M + (gelu ? 20.0 * n : (double)n);
  uint32_t reads = OP_SLOT_IN(0) | OP_SLOT_IN(1) |
                   (d->nin == 3 ? OP_SLOT_IN(2) : 0) |
                   (add ? OP_SLOT_IN(3) : 0);
  inst->fused = op_make_kernel(gelu ? "linear.fwd_gelu" : "linear.fwd_add",
                               linear_fwd_fused, op_gemm_tiles(&s->fused),
                               flops, reads, OP_SLOT_OUT);
  inst->fused.span =
      op_span_rows(N, s->fused.bm,
                   OP_SLOT_IN(0) | OP_SLOT_OUT | (add ? OP_SLOT_IN(3) : 0));
  inst->nfused = 1;
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
  const op_gemm *g = &s->fwd;
  int64_t per = op_gemm_tiles(g), i = tile / per;
  return op_gemm_run(g, tile % per, op_at(b->in[0], i * s->N * s->K, g->a_dt),
                     op_at(b->in[1], i * s->K * s->M, g->b_dt), NULL,
                     op_at(b->out, i * s->N * s->M, g->c_dt), false, w);
}

// in the forward pass y = a . b, so da (N,K) = dy (N,M) . b^T (M,K)
static int matmul_da(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const matmul_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  const op_gemm *g = &s->da;
  int64_t per = op_gemm_tiles(g), i = tile / per;
  return op_gemm_run(g, tile % per, op_at(b->dout, i * s->N * s->M, g->a_dt),
                     op_at(b->in[1], i * s->K * s->M, g->b_dt), NULL,
                     op_at(b->din[0], i * s->N * s->K, g->c_dt),
                     b->din_accumulate[0], w);
}

// and db (K,M) = a^T (K,N) . dy (N,M), reducing over all N rows per block
static int matmul_db(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const matmul_state *s = op->state;
  if (!b->din[1]) return REMAT_OK;
  const op_gemm *g = &s->db;
  int64_t per = op_gemm_tiles(g), i = tile / per;
  return op_gemm_run(g, tile % per, op_at(b->in[0], i * s->N * s->K, g->a_dt),
                     op_at(b->dout, i * s->N * s->M, g->b_dt), NULL,
                     op_at(b->din[1], i * s->K * s->M, g->c_dt),
                     b->din_accumulate[1], w);
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
  op_gemm_dtypes(&s->fwd, d->in_dtype[0], d->in_dtype[1], d->out_dtype);
  s->fwd.accumulate_too = false;
  op_gemm_init(&s->da, N, K, M, op_gemm_rows(K, M), K);
  op_gemm_layout(&s->da, op_plain(M), op_transposed(M), K); /* dA = dC B^T */
  op_gemm_dtypes(&s->da, d->out_dtype, d->in_dtype[1], d->din_dtype[0]);
  op_gemm_init(&s->db, K, M, N, OP_MATMUL_DB_ROWS, dw_cols(M));
  op_gemm_layout(&s->db, op_transposed(K), op_plain(M), M); /* dB = A^T dC */
  op_gemm_dtypes(&s->db, d->in_dtype[0], d->out_dtype, d->din_dtype[1]);
  remat_status rs = op_gemm_plan(&s->fwd, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->da, &s->base, err);
  if (rs == REMAT_OK) rs = op_gemm_plan(&s->db, &s->base, err);
  if (rs != REMAT_OK) return rs;
  double flops = 2.0 * s->batch * N * K * M;
  /* Not pinned (batched): a tile touches its share of its rows' slots and
   * about its share of the other operand. */
  op_kernel *k = &inst->fwd[inst->nfwd++];
  *k = op_make_kernel("matmul.fwd", matmul_fwd,
                      s->batch * op_gemm_tiles(&s->fwd), flops,
                      OP_SLOT_IN(0) | OP_SLOT_IN(1), OP_SLOT_OUT);
  k->span = op_span_cols(OP_SLOT_IN(0) | OP_SLOT_OUT, OP_SLOT_IN(1));
  k = &inst->bwd[inst->nbwd++];
  *k = op_make_kernel("matmul.da", matmul_da, s->batch * op_gemm_tiles(&s->da),
                      flops, OP_SLOT_DOUT | OP_SLOT_IN(1), OP_SLOT_DIN(0));
  k->span = op_span_cols(OP_SLOT_DOUT | OP_SLOT_DIN(0), OP_SLOT_IN(1));
  k = &inst->bwd[inst->nbwd++];
  *k = op_make_kernel("matmul.db", matmul_db, s->batch * op_gemm_tiles(&s->db),
                      flops, OP_SLOT_DOUT | OP_SLOT_IN(0), OP_SLOT_DIN(1));
  k->span = op_span_cols(OP_SLOT_DIN(1), OP_SLOT_DOUT | OP_SLOT_IN(0));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
