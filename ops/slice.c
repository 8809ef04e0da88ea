/* Slice: columns [start, start + len) of the last dim, to split a packed
 * projection (q, k, v, or the gate and up halves of a feed-forward). Tiled
 * by row blocks. Its backward owns the whole of dx when it is the only op
 * that reads x (it writes dy into its columns and zeros elsewhere); when
 * several ops read x the runtime zero-fills dx and every one adds into its
 * own part, so an accumulating slice touches only its columns. */
#include <string.h>

#include "ops/op_impl.h"

typedef struct slice_state {
  op_base base;
  int64_t rows, C, start, len, row_block;
} slice_state;

remat_status op_slice_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"x"};
  static const op_dtype types[] = {OP_F32};
  remat_status rs = op_check_inputs(d, 1, 1, names, types, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *x = &d->in[0];
  int64_t c = x->dim[x->ndim - 1], start = d->attrs.start, len = d->attrs.len;
  char bx[OP_SHAPE_STR_MAX];
  if (start < 0 || len < 1 || start > c || len > c - start)
    return op_shape_err(err, d,
                        "x %s, start %lld, len %lld: expected start >= 0, "
                        "len >= 1 and start + len <= %lld (last dim of x)",
                        op_shape_str(x, bx), (long long)start, (long long)len,
                        (long long)c);
  d->out = *x;
  d->out.dim[x->ndim - 1] = len;
  return REMAT_OK;
}

/* dst[0..n) (dtype dt) = (or +=) src[0..n) (dtype st); tmp holds n
 * floats. */
static void copy_row(void *dst, op_dtype dt, const void *src, op_dtype st,
                     int64_t n, bool acc, float *tmp) {
  if (dt == st && !acc) {
    memcpy(dst, src, (size_t)(n * op_dtype_size(dt)));
    return;
  }
  op_store_dt(dst, dt, 0, op_load_f32(src, st, 0, n, tmp), n, acc);
}

// x is (N,C), y is (N,len): y[r, j] = x[r, start + j]
static int slice_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const slice_state *s = op->state;
  const op_desc *d = &op->desc;
  int64_t r0 = tile * s->row_block;
  int64_t r1 = op_min64(s->rows, r0 + s->row_block);
  float *t = op_temp(&s->base, w);
  for (int64_t r = r0; r < r1; r++)
    copy_row(op_at(b->out, r * s->len, d->out_dtype), d->out_dtype,
             op_at(b->in[0], r * s->C + s->start, d->in_dtype[0]),
             d->in_dtype[0], s->len, false, t);
  return REMAT_OK;
}

// in the forward pass y[r, j] = x[r, start + j], so
// dx[r, start + j] = (or +=) dy[r, j], and dx = 0 in the other columns
// when dx is overwritten (accumulating, they are another op's)
static int slice_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const slice_state *s = op->state;
  const op_desc *d = &op->desc;
  if (!b->din[0]) return REMAT_OK;
  int64_t r0 = tile * s->row_block;
  int64_t r1 = op_min64(s->rows, r0 + s->row_block);
  op_dtype gt = d->din_dtype[0];
  bool acc = b->din_accumulate[0];
  float *t = op_temp(&s->base, w);
  for (int64_t r = r0; r < r1; r++) {
    char *row = op_at(b->din[0], r * s->C, gt);
    if (!acc) {
      memset(row, 0, (size_t)(s->start * op_dtype_size(gt)));
      int64_t end = s->start + s->len;
      memset(op_at(row, end, gt), 0,
             (size_t)((s->C - end) * op_dtype_size(gt)));
    }
    copy_row(op_at(row, s->start, gt), gt,
             op_at(b->dout, r * s->len, d->out_dtype), d->out_dtype, s->len,
             acc, t);
  }
  return REMAT_OK;
}

remat_status op_slice_plan(op_instance *inst, dnnl_engine_t engine,
                           char err[OP_ERRMSG_MAX]) {
  (void)err;
  const op_desc *d = &inst->desc;
  slice_state *s = op_state_new(sizeof *s, engine, "slice");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->rows = op_rows(&d->in[0]);
  s->C = d->in[0].dim[d->in[0].ndim - 1];
  s->start = d->attrs.start;
  s->len = d->attrs.len;
  s->row_block = op_min64(op_row_block(s->C), s->rows);
  s->base.temp_bytes = (size_t)s->len * sizeof(float);
  int64_t tiles = op_div_up(s->rows, s->row_block);
  double n = (double)s->rows * s->len;
  inst->fwd[inst->nfwd++] = op_make_kernel("slice.fwd", slice_fwd, tiles, n,
                                           OP_SLOT_IN(0), OP_SLOT_OUT);
  inst->fwd[0].span =
      op_span_rows(s->rows, s->row_block, OP_SLOT_IN(0) | OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] = op_make_kernel("slice.bwd", slice_bwd, tiles, n,
                                           OP_SLOT_DOUT, OP_SLOT_DIN(0));
  inst->bwd[0].span =
      op_span_rows(s->rows, s->row_block, OP_SLOT_DOUT | OP_SLOT_DIN(0));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
