/* Elementwise ops: add (residual), bias_add, relu (plain C loops), and gelu
 * (oneDNN eltwise, tanh or erf form). Flat ops tile the elements in chunks
 * of OP_FLAT_ELEMS; bias gradients tile column blocks and sum every row in
 * order. With bf16 buffers the C loops convert blocks of ELT_BLOCK elements
 * to f32 in the op's temporary, compute as in f32 and round once on the
 * store; gelu runs bf16 oneDNN primitives, and f32 ones on converted blocks
 * where it accumulates into bf16 or mixes dtypes. */
/* The relu loops vectorize only when gcc may if-convert float compares. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <string.h>

#include "base/bf16.h"
#include "ops/op_impl.h"

/* Elements a bf16 kernel converts to f32 at a time (three blocks of the
 * op's temporary: two operands and the result). */
#define ELT_BLOCK 2048
/* Elements of gelu's f32 blocks (three in the op's temporary of
 * OP_FLAT_ELEMS floats; a divisor of OP_FLAT_ELEMS): larger, as each block
 * is a oneDNN call. */
#define GELU_BLOCK 16384
_Static_assert(3 * GELU_BLOCK <= OP_FLAT_ELEMS &&
                   OP_FLAT_ELEMS % GELU_BLOCK == 0,
               "gelu's blocks fit its temporary and tile its chunks");

typedef struct eltwise_state {
  op_base base;
  int64_t n;          /* elements */
  int64_t rows, cols; /* bias_add: x as (rows, cols) */
  int64_t row_block;
  bool bf16;          /* some buffer is bf16: the converting kernels */
  /* gelu: [0] full chunk, [1] remainder chunk (of the input's dtype);
   * f32 on converted blocks: [2] GELU_BLOCK elements, [3] the last n %
   * GELU_BLOCK */
  dnnl_primitive_t fwd[4], bwd[4];
} eltwise_state;


/* The all-bf16 cases in one pass, without the temporary. */
// y = a + b
REMAT_SIMD_CLONES static void add_bf16(uint16_t *restrict y,
                                 const uint16_t *restrict a,
                                 const uint16_t *restrict b, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = bf16_from_f32(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

// d += s, rounded once
REMAT_SIMD_CLONES static void acc_bf16(uint16_t *restrict d,
                                 const uint16_t *restrict s, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    d[i] = bf16_from_f32(bf16_to_f32(d[i]) + bf16_to_f32(s[i]));
}

// y = x + bias (bias f32)
REMAT_SIMD_CLONES static void bias_bf16(uint16_t *restrict y,
                                  const uint16_t *restrict x,
                                  const float *restrict bias, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = bf16_from_f32(bf16_to_f32(x[i]) + bias[i]);
}

// y = max(x, 0)
REMAT_SIMD_CLONES static void relu_bf16(uint16_t *restrict y,
                                  const uint16_t *restrict x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float v = bf16_to_f32(x[i]);
    y[i] = bf16_from_f32(v > 0.0f ? v : 0.0f);
  }
}

// dx = (or +=) x > 0 ? dy : 0
REMAT_SIMD_CLONES static void relu_bwd_bf16(uint16_t *restrict dx,
                                      const uint16_t *restrict x,
                                      const uint16_t *restrict dy, int64_t n,
                                      bool accumulate) {
  /* both loads unconditional, so that gcc if-converts the select */
  if (accumulate)
    for (int64_t i = 0; i < n; i++) {
      float v = bf16_to_f32(x[i]), g = bf16_to_f32(dy[i]);
      dx[i] = bf16_from_f32(bf16_to_f32(dx[i]) + (v > 0.0f ? g : 0.0f));
    }
  else
    for (int64_t i = 0; i < n; i++) {
      float v = bf16_to_f32(x[i]), g = bf16_to_f32(dy[i]);
      dx[i] = bf16_from_f32(v > 0.0f ? g : 0.0f);
    }
}

static bool desc_has_bf16(const op_desc *d) {
  bool any = d->out_dtype == OP_BF16;
  for (int i = 0; i < d->nin; i++)
    any = any || d->in_dtype[i] == OP_BF16 || d->din_dtype[i] == OP_BF16;
  return any;
}

/* din[i][i0..i0+len) = (or +=) dout[i0..i0+len), any dtypes; tmp holds
 * ELT_BLOCK floats. */
static void copy_grad(const op_desc *d, const op_bufs *b, int i, int64_t i0,
                      int64_t len, float *tmp) {
  op_dtype gt = d->din_dtype[i], dt = d->out_dtype;
  bool acc = b->din_accumulate[i];
  if (gt == dt && !acc) {
    memcpy(op_at(b->din[i], i0, gt), op_at(b->dout, i0, dt),
           (size_t)(len * op_dtype_size(gt)));
    return;
  }
  if (gt == OP_BF16 && dt == OP_BF16) {
    acc_bf16((uint16_t *)b->din[i] + i0, (const uint16_t *)b->dout + i0,
             len);
    return;
  }
  for (int64_t j = 0; j < len; j += ELT_BLOCK) {
    int64_t m = op_min64(ELT_BLOCK, len - j);
    op_store_dt(b->din[i], gt, i0 + j, op_load_f32(b->dout, dt, i0 + j, m, tmp), m,
              acc);
  }
}

static void flat_range(int64_t n, int64_t tile, int64_t *i0, int64_t *len) {
  *i0 = tile * OP_FLAT_ELEMS;
  *len = op_min64(OP_FLAT_ELEMS, n - *i0);
}

static int64_t flat_tiles(int64_t n) { return op_div_up(n, OP_FLAT_ELEMS); }

/* Flat chunks of a unary op's n elements, every slot by chunk. */
static void unary_spans(op_instance *inst, int64_t n) {
  inst->fwd[0].span =
      op_span_rows(n, OP_FLAT_ELEMS, OP_SLOT_IN(0) | OP_SLOT_OUT);
  inst->bwd[0].span = op_span_rows(
      n, OP_FLAT_ELEMS, OP_SLOT_DOUT | OP_SLOT_IN(0) | OP_SLOT_DIN(0));
}

static eltwise_state *eltwise_state_new(op_instance *inst,
                                        dnnl_engine_t engine) {
  eltwise_state *s =
      op_state_new(sizeof *s, engine, op_name(inst->desc.type));
  if (!s) return NULL;
  inst->state = s;
  s->n = op_numel(&inst->desc.in[0]);
  s->bf16 = desc_has_bf16(&inst->desc);
  if (s->bf16) s->base.temp_bytes = 3 * ELT_BLOCK * sizeof(float);
  return s;
}

remat_status op_unary_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"x"};
  static const op_dtype types[] = {OP_F32};
  remat_status rs = op_check_inputs(d, 1, 1, names, types, err);
  if (rs == REMAT_OK) d->out = d->in[0];
  return rs;
}

/* ---- add ---- */

remat_status op_add_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"a", "b"};
  static const op_dtype types[] = {OP_F32, OP_F32};
  remat_status rs = op_check_inputs(d, 2, 2, names, types, err);
  if (rs != REMAT_OK) return rs;
  char ba[OP_SHAPE_STR_MAX], bb[OP_SHAPE_STR_MAX];
  if (!op_shape_eq(&d->in[0], &d->in[1]))
    return op_shape_err(err, d, "a %s and b %s: shapes must be equal",
                        op_shape_str(&d->in[0], ba),
                        op_shape_str(&d->in[1], bb));
  d->out = d->in[0];
  return REMAT_OK;
}

// a, b and y are (n): y = a + b
static int add_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                   op_worker *w) {
  const eltwise_state *s = op->state;
  int64_t i0, len;
  flat_range(s->n, tile, &i0, &len);
  const op_desc *d = &op->desc;
  if (s->bf16 && d->in_dtype[0] == OP_BF16 && d->in_dtype[1] == OP_BF16 &&
      d->out_dtype == OP_BF16) {
    add_bf16((uint16_t *)b->out + i0, (const uint16_t *)b->in[0] + i0,
             (const uint16_t *)b->in[1] + i0, len);
    return REMAT_OK;
  }
  if (s->bf16) {
    float *t = op_temp(&s->base, w);
    for (int64_t j = 0; j < len; j += ELT_BLOCK) {
      int64_t m = op_min64(ELT_BLOCK, len - j);
      const float *restrict x =
          op_load_f32(b->in[0], d->in_dtype[0], i0 + j, m, t);
      const float *restrict y =
          op_load_f32(b->in[1], d->in_dtype[1], i0 + j, m, t + ELT_BLOCK);
      float *restrict o = t + 2 * ELT_BLOCK;
      for (int64_t i = 0; i < m; i++) o[i] = x[i] + y[i];
      op_store_dt(b->out, d->out_dtype, i0 + j, o, m, false);
    }
    return REMAT_OK;
  }
  const float *restrict x = b->in[0] + i0, *restrict y = b->in[1] + i0;
  float *restrict out = b->out + i0;
  for (int64_t i = 0; i < len; i++) out[i] = x[i] + y[i];
  return REMAT_OK;
}

// in the forward pass y = a + b, so da = dy and db = dy
static int add_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                   op_worker *w) {
  const eltwise_state *s = op->state;
  int64_t i0, len;
  flat_range(s->n, tile, &i0, &len);
  for (int i = 0; i < 2; i++) {
    if (!b->din[i]) continue;
    if (s->bf16)
      copy_grad(&op->desc, b, i, i0, len, op_temp(&s->base, w));
    else
      op_store(b->din[i] + i0, b->dout + i0, len, b->din_accumulate[i]);
  }
  return REMAT_OK;
}

remat_status op_add_plan(op_instance *inst, dnnl_engine_t engine,
                         char err[OP_ERRMSG_MAX]) {
  (void)err;
  eltwise_state *s = eltwise_state_new(inst, engine);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  uint32_t fwd = OP_SLOT_IN(0) | OP_SLOT_IN(1) | OP_SLOT_OUT;
  uint32_t bwd = OP_SLOT_DOUT | OP_SLOT_DIN(0) | OP_SLOT_DIN(1);
  inst->fwd[inst->nfwd++] =
      op_make_kernel("add.fwd", add_fwd, flat_tiles(s->n), (double)s->n,
                     OP_SLOT_IN(0) | OP_SLOT_IN(1), OP_SLOT_OUT);
  inst->fwd[0].span = op_span_rows(s->n, OP_FLAT_ELEMS, fwd);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("add.bwd", add_bwd, flat_tiles(s->n), (double)s->n,
                     OP_SLOT_DOUT, OP_SLOT_DIN(0) | OP_SLOT_DIN(1));
  inst->bwd[0].span = op_span_rows(s->n, OP_FLAT_ELEMS, bwd);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}

/* ---- bias_add ---- */

remat_status op_bias_add_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"x", "b"};
  static const op_dtype types[] = {OP_F32, OP_F32};
  remat_status rs = op_check_inputs(d, 2, 2, names, types, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *x = &d->in[0], *bias = &d->in[1];
  int64_t c = x->dim[x->ndim - 1];
  char bx[OP_SHAPE_STR_MAX], bb[OP_SHAPE_STR_MAX];
  if (bias->ndim != 1 || bias->dim[0] != c)
    return op_shape_err(err, d,
                        "x %s and b %s: b must be [%lld] (last dim of x)",
                        op_shape_str(x, bx), op_shape_str(bias, bb),
                        (long long)c);
  d->out = *x;
  return REMAT_OK;
}

// x is (N,C), b is (C), y is (N,C): y[r,c] = x[r,c] + b[c]
static int bias_add_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                        op_worker *w) {
  const eltwise_state *s = op->state;
  int64_t r0 = tile * s->row_block;
  int64_t r1 = op_min64(s->rows, r0 + s->row_block), C = s->cols;
  const op_desc *d = &op->desc;
  if (s->bf16 && d->in_dtype[0] == OP_BF16 && d->in_dtype[1] == OP_F32 &&
      d->out_dtype == OP_BF16) {
    for (int64_t r = r0; r < r1; r++)
      bias_bf16((uint16_t *)b->out + r * C,
                (const uint16_t *)b->in[0] + r * C, b->in[1], C);
    return REMAT_OK;
  }
  if (s->bf16) {
    float *t = op_temp(&s->base, w);
    for (int64_t r = r0; r < r1; r++)
      for (int64_t c0 = 0; c0 < C; c0 += ELT_BLOCK) {
        int64_t m = op_min64(ELT_BLOCK, C - c0);
        const float *restrict x =
            op_load_f32(b->in[0], d->in_dtype[0], r * C + c0, m, t);
        const float *restrict bias =
            op_load_f32(b->in[1], d->in_dtype[1], c0, m, t + ELT_BLOCK);
        float *restrict o = t + 2 * ELT_BLOCK;
        for (int64_t c = 0; c < m; c++) o[c] = x[c] + bias[c];
        op_store_dt(b->out, d->out_dtype, r * C + c0, o, m, false);
      }
    return REMAT_OK;
  }
  const float *restrict bias = b->in[1];
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict x = b->in[0] + r * C;
    float *restrict y = b->out + r * C;
    for (int64_t c = 0; c < C; c++) y[c] = x[c] + bias[c];
  }
  return REMAT_OK;
}

// in the forward pass y = x + b, so dx = dy
static int bias_add_dx(const op_instance *op, const op_bufs *b, int64_t tile,
                       op_worker *w) {
  const eltwise_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  int64_t i0, len;
  flat_range(s->n, tile, &i0, &len);
  if (s->bf16)
    copy_grad(&op->desc, b, 0, i0, len, op_temp(&s->base, w));
  else
    op_store(b->din[0] + i0, b->dout + i0, len, b->din_accumulate[0]);
  return REMAT_OK;
}

// and db (C) = sum over the N rows of dy, one block of columns per tile
static int bias_add_db(const op_instance *op, const op_bufs *b, int64_t tile,
                       op_worker *w) {
  (void)w;
  const eltwise_state *s = op->state;
  if (!b->din[1]) return REMAT_OK;
  int64_t c0 = tile * OP_COL_BLOCK, nc = op_min64(OP_COL_BLOCK, s->cols - c0);
  float acc[OP_COL_BLOCK] = {0};
  if (s->bf16) {
    const op_desc *d = &op->desc;
    for (int64_t r = 0; r < s->rows; r++) {
      if (d->out_dtype == OP_BF16) {
        const uint16_t *dy = (const uint16_t *)b->dout + r * s->cols + c0;
        for (int64_t c = 0; c < nc; c++) acc[c] += bf16_to_f32(dy[c]);
      } else {
        const float *dy = b->dout + r * s->cols + c0;
        for (int64_t c = 0; c < nc; c++) acc[c] += dy[c];
      }
    }
    op_store_dt(b->din[1], d->din_dtype[1], c0, acc, nc, b->din_accumulate[1]);
    return REMAT_OK;
  }
  for (int64_t r = 0; r < s->rows; r++) {
    const float *dy = b->dout + r * s->cols + c0;
    for (int64_t c = 0; c < nc; c++) acc[c] += dy[c];
  }
  op_store(b->din[1] + c0, acc, nc, b->din_accumulate[1]);
  return REMAT_OK;
}

remat_status op_bias_add_plan(op_instance *inst, dnnl_engine_t engine,
                              char err[OP_ERRMSG_MAX]) {
  (void)err;
  eltwise_state *s = eltwise_state_new(inst, engine);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  s->rows = op_rows(&inst->desc.in[0]);
  s->cols = s->n / s->rows;
  s->row_block = op_max64(1, OP_FLAT_ELEMS / s->cols);
  double n = (double)s->n;
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "bias_add.fwd", bias_add_fwd, op_div_up(s->rows, s->row_block), n,
      OP_SLOT_IN(0) | OP_SLOT_IN(1), OP_SLOT_OUT);
  inst->fwd[0].span =
      op_span_rows(s->rows, s->row_block, OP_SLOT_IN(0) | OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("bias_add.dx", bias_add_dx, flat_tiles(s->n), n,
                     OP_SLOT_DOUT, OP_SLOT_DIN(0));
  inst->bwd[0].span =
      op_span_rows(s->n, OP_FLAT_ELEMS, OP_SLOT_DOUT | OP_SLOT_DIN(0));
  inst->bwd[inst->nbwd++] =
      op_make_kernel("bias_add.db", bias_add_db,
                     op_div_up(s->cols, OP_COL_BLOCK), n, OP_SLOT_DOUT,
                     OP_SLOT_DIN(1));
  inst->bwd[1].span = op_span_cols(OP_SLOT_DIN(1), OP_SLOT_DOUT);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}

/* ---- relu ---- */

// x and y are (n): y = max(x, 0)
static int relu_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                    op_worker *w) {
  const eltwise_state *s = op->state;
  int64_t i0, len;
  flat_range(s->n, tile, &i0, &len);
  const op_desc *d = &op->desc;
  if (s->bf16 && d->in_dtype[0] == OP_BF16 && d->out_dtype == OP_BF16) {
    relu_bf16((uint16_t *)b->out + i0, (const uint16_t *)b->in[0] + i0, len);
    return REMAT_OK;
  }
  if (s->bf16) {
    float *t = op_temp(&s->base, w);
    for (int64_t j = 0; j < len; j += ELT_BLOCK) {
      int64_t m = op_min64(ELT_BLOCK, len - j);
      const float *restrict x =
          op_load_f32(b->in[0], d->in_dtype[0], i0 + j, m, t);
      float *restrict o = t + 2 * ELT_BLOCK;
      for (int64_t i = 0; i < m; i++) o[i] = x[i] > 0.0f ? x[i] : 0.0f;
      op_store_dt(b->out, d->out_dtype, i0 + j, o, m, false);
    }
    return REMAT_OK;
  }
  const float *restrict x = b->in[0] + i0;
  float *restrict y = b->out + i0;
  for (int64_t i = 0; i < len; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  return REMAT_OK;
}

// in the forward pass y = max(x, 0), so dx = x > 0 ? dy : 0
static int relu_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                    op_worker *w) {
  const eltwise_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  int64_t i0, len;
  flat_range(s->n, tile, &i0, &len);
  const op_desc *d = &op->desc;
  if (s->bf16 && d->in_dtype[0] == OP_BF16 && d->out_dtype == OP_BF16 &&
      d->din_dtype[0] == OP_BF16) {
    relu_bwd_bf16((uint16_t *)b->din[0] + i0, (const uint16_t *)b->in[0] + i0,
                  (const uint16_t *)b->dout + i0, len, b->din_accumulate[0]);
    return REMAT_OK;
  }
  if (s->bf16) {
    float *t = op_temp(&s->base, w);
    for (int64_t j = 0; j < len; j += ELT_BLOCK) {
      int64_t m = op_min64(ELT_BLOCK, len - j);
      const float *restrict x =
          op_load_f32(b->in[0], d->in_dtype[0], i0 + j, m, t);
      const float *restrict dy =
          op_load_f32(b->dout, d->out_dtype, i0 + j, m, t + ELT_BLOCK);
      float *restrict o = t + 2 * ELT_BLOCK;
      for (int64_t i = 0; i < m; i++) o[i] = x[i] > 0.0f ? dy[i] : 0.0f;
      op_store_dt(b->din[0], d->din_dtype[0], i0 + j, o, m,
                b->din_accumulate[0]);
    }
    return REMAT_OK;
  }
  const float *restrict x = b->in[0] + i0, *restrict dy = b->dout + i0;
  float *restrict dx = b->din[0] + i0;
  if (b->din_accumulate[0])
    for (int64_t i = 0; i < len; i++) dx[i] += x[i] > 0.0f ? dy[i] : 0.0f;
  else
    for (int64_t i = 0; i < len; i++) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
  return REMAT_OK;
}

remat_status op_relu_plan(op_instance *inst, dnnl_engine_t engine,
                          char err[OP_ERRMSG_MAX]) {
  (void)err;
  eltwise_state *s = eltwise_state_new(inst, engine);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->fwd[inst->nfwd++] =
      op_make_kernel("relu.fwd", relu_fwd, flat_tiles(s->n), (double)s->n,
                     OP_SLOT_IN(0), OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("relu.bwd", relu_bwd, flat_tiles(s->n), (double)s->n,
                     OP_SLOT_DOUT | OP_SLOT_IN(0), OP_SLOT_DIN(0));
  unary_spans(inst, s->n);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}

/* ---- gelu ---- */

// x and y are (n): y = gelu(x), by oneDNN eltwise on a chunk (x and y of
// one dtype, f32 or bf16)
static int gelu_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                    op_worker *w) {
  const eltwise_state *s = op->state;
  const op_desc *d = &op->desc;
  int64_t i0, len;
  flat_range(s->n, tile, &i0, &len);
  op_arg args[2] = {{DNNL_ARG_SRC, op_at(b->in[0], i0, d->in_dtype[0])},
                    {DNNL_ARG_DST, op_at(b->out, i0, d->out_dtype)}};
  return op_exec(s->fwd[len != OP_FLAT_ELEMS], w, 2, args);
}

// the backward on f32 copies of blocks of x and dy (bf16 dx accumulated
// with one rounding, or a dx whose dtype is not dy's)
static int gelu_bwd_blocks(const eltwise_state *s, const op_desc *d,
                           const op_bufs *b, int64_t i0, int64_t len,
                           op_worker *w) {
  float *t = op_temp(&s->base, w);
  for (int64_t j = 0; j < len; j += GELU_BLOCK) {
    int64_t m = op_min64(GELU_BLOCK, len - j);
    op_arg args[3] = {
        {DNNL_ARG_SRC, op_load_f32(b->in[0], d->in_dtype[0], i0 + j, m, t)},
        {DNNL_ARG_DIFF_DST,
         op_load_f32(b->dout, d->out_dtype, i0 + j, m, t + GELU_BLOCK)},
        {DNNL_ARG_DIFF_SRC, t + 2 * GELU_BLOCK}};
    int rs = op_exec(s->bwd[m == GELU_BLOCK ? 2 : 3], w, 3, args);
    if (rs != REMAT_OK) return rs;
    op_store_dt(b->din[0], d->din_dtype[0], i0 + j, t + 2 * GELU_BLOCK, m,
              b->din_accumulate[0]);
  }
  return REMAT_OK;
}

// in the forward pass y = gelu(x), so dx = gelu'(x) * dy (oneDNN, from x)
static int gelu_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                    op_worker *w) {
  const eltwise_state *s = op->state;
  const op_desc *d = &op->desc;
  if (!b->din[0]) return REMAT_OK;
  int64_t i0, len;
  flat_range(s->n, tile, &i0, &len);
  bool acc = b->din_accumulate[0];
  if (s->bf16 && (d->din_dtype[0] != d->out_dtype ||
                  (acc && d->din_dtype[0] == OP_BF16)))
    return gelu_bwd_blocks(s, d, b, i0, len, w);
  float *dx = acc ? op_temp(&s->base, w) : op_at(b->din[0], i0, d->out_dtype);
  op_arg args[3] = {{DNNL_ARG_SRC, op_at(b->in[0], i0, d->in_dtype[0])},
                    {DNNL_ARG_DIFF_DST, op_at(b->dout, i0, d->out_dtype)},
                    {DNNL_ARG_DIFF_SRC, dx}};
  int rs = op_exec(s->bwd[len != OP_FLAT_ELEMS], w, 3, args);
  if (rs == REMAT_OK && acc) op_store(b->din[0] + i0, dx, len, true);
  return rs;
}

/* The forward and backward primitives over len elements: x of dtype xt,
 * y, dy and dx of dtype yt (equal when there is a forward). */
static remat_status gelu_prims(eltwise_state *s, int which, int64_t len,
                               dnnl_alg_kind_t alg, op_dtype xt, op_dtype yt,
                               char err[OP_ERRMSG_MAX]) {
  const int64_t stride = 1;
  dnnl_memory_desc_t md = op_md_dt(1, &len, &stride, xt);
  dnnl_memory_desc_t dmd = op_md_dt(1, &len, &stride, yt);
  dnnl_eltwise_desc_t fd, bd;
  dnnl_status_t st = dnnl_eltwise_forward_desc_init(
      &fd, dnnl_forward_training, alg, &md, 0.0f, 0.0f);
  if (st == dnnl_success)
    st = dnnl_eltwise_backward_desc_init(&bd, alg, &dmd, &md, 0.0f, 0.0f);
  if (st != dnnl_success)
    return op_dnnl_fail(st, s->base.name, "eltwise descriptor", err);
  dnnl_primitive_desc_t hint;
  remat_status rs =
      op_prim_create(&s->base, &fd, NULL, NULL, &s->fwd[which], &hint, err);
  if (rs != REMAT_OK) return rs;
  rs = op_prim_create(&s->base, &bd, NULL, hint, &s->bwd[which], NULL, err);
  dnnl_primitive_desc_destroy(hint);
  return rs;
}

remat_status op_gelu_plan(op_instance *inst, dnnl_engine_t engine,
                          char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  if (d->in_dtype[0] != d->out_dtype)
    return op_same_dtype_err(d, err);
  eltwise_state *s = eltwise_state_new(inst, engine);
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  dnnl_alg_kind_t alg = inst->desc.attrs.gelu_erf ? dnnl_eltwise_gelu_erf
                                                  : dnnl_eltwise_gelu_tanh;
  op_dtype t = d->out_dtype;
  int64_t full = op_min64(s->n, OP_FLAT_ELEMS), rem = s->n % OP_FLAT_ELEMS;
  remat_status rs = REMAT_OK;
  if (full == OP_FLAT_ELEMS) rs = gelu_prims(s, 0, full, alg, t, t, err);
  if (rs == REMAT_OK && rem) rs = gelu_prims(s, 1, rem, alg, t, t, err);
  if (s->bf16) {
    if (rs == REMAT_OK && s->n >= GELU_BLOCK)
      rs = gelu_prims(s, 2, GELU_BLOCK, alg, OP_F32, OP_F32, err);
    if (rs == REMAT_OK && s->n % GELU_BLOCK)
      rs = gelu_prims(s, 3, s->n % GELU_BLOCK, alg, OP_F32, OP_F32, err);
  }
  if (rs != REMAT_OK) return rs;
  s->base.temp_bytes = OP_FLAT_ELEMS * sizeof(float);
  inst->fwd[inst->nfwd++] =
      op_make_kernel("gelu.fwd", gelu_fwd, flat_tiles(s->n), 20.0 * s->n,
                     OP_SLOT_IN(0), OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("gelu.bwd", gelu_bwd, flat_tiles(s->n), 30.0 * s->n,
                     OP_SLOT_DOUT | OP_SLOT_IN(0), OP_SLOT_DIN(0));
  unary_spans(inst, s->n);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
