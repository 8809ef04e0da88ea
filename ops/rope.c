/* Rotary position embeddings (RoPE) in Hugging Face's half-split layout:
 * in each head of hd columns, column i and column i + hd/2 form a pair
 * rotated by the angle t * theta^(-2i/hd) at position t. The cos and sin
 * tables, [T, hd/2] each, are computed once when the op is planned (in
 * double, rounded to f32) and live in its state. Tiled by row blocks of
 * the B*T rows; bf16 rows are converted to f32 and rounded once. */
#include <math.h>

#include "ops/op_impl.h"

typedef struct rope_state {
  op_base base;
  int64_t rows, T, W, hd, half, row_block;
  float *cos, *sin; /* [T, half] each, in table[] */
  float table[];
} rope_state;

remat_status op_rope_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"x"};
  static const op_dtype types[] = {OP_F32};
  remat_status rs = op_check_inputs(d, 1, 1, names, types, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *x = &d->in[0];
  char bx[OP_SHAPE_STR_MAX];
  op_shape_str(x, bx);
  if (x->ndim != 3)
    return op_shape_err(err, d, "x %s must be [B,T,heads*hd] (3 dims)", bx);
  int64_t W = x->dim[2], heads = d->attrs.heads;
  if (heads < 1 || W % heads != 0)
    return op_shape_err(err, d,
                        "x %s with %lld heads: heads must be at least 1 and "
                        "divide the last dim (%lld)",
                        bx, (long long)heads, (long long)W);
  if ((W / heads) % 2 != 0)
    return op_shape_err(err, d,
                        "x %s with %lld heads: the head dim (%lld) must be "
                        "even",
                        bx, (long long)heads, (long long)(W / heads));
  d->out = *x;
  return REMAT_OK;
}

// x and y are (B*T, W), W = H * hd; in each head, with x1 = x[i] and
// x2 = x[i + hd/2] (0 <= i < hd/2) and the angle a of (t, i):
// y[i] = x1 cos a - x2 sin a, y[i + hd/2] = x2 cos a + x1 sin a
static void rotate_row(const rope_state *s, int64_t t, float *restrict y,
                       const float *restrict x) {
  const float *restrict cs = s->cos + t * s->half;
  const float *restrict sn = s->sin + t * s->half;
  for (int64_t h0 = 0; h0 < s->W; h0 += s->hd) {
    const float *restrict x1 = x + h0, *restrict x2 = x + h0 + s->half;
    float *restrict y1 = y + h0, *restrict y2 = y + h0 + s->half;
    for (int64_t i = 0; i < s->half; i++) {
      y1[i] = x1[i] * cs[i] - x2[i] * sn[i];
      y2[i] = x2[i] * cs[i] + x1[i] * sn[i];
    }
  }
}

// in the forward pass y = R(a) x, a rotation, so dx = R(a)^T dy = R(-a) dy:
// dx1 = dy1 cos a + dy2 sin a, dx2 = dy2 cos a - dy1 sin a
static void unrotate_row(const rope_state *s, int64_t t, float *restrict dx,
                         const float *restrict dy) {
  const float *restrict cs = s->cos + t * s->half;
  const float *restrict sn = s->sin + t * s->half;
  for (int64_t h0 = 0; h0 < s->W; h0 += s->hd) {
    const float *restrict d1 = dy + h0, *restrict d2 = dy + h0 + s->half;
    float *restrict g1 = dx + h0, *restrict g2 = dx + h0 + s->half;
    for (int64_t i = 0; i < s->half; i++) {
      g1[i] = d1[i] * cs[i] + d2[i] * sn[i];
      g2[i] = d2[i] * cs[i] - d1[i] * sn[i];
    }
  }
}

/* The rows of a tile through rotate_row (forward) or unrotate_row: src of
 * dtype st into dst of dtype dt, overwritten or accumulated. */
static void rope_rows(const rope_state *s, int64_t tile, bool forward,
                      float *dst, op_dtype dt, bool acc, const float *src,
                      op_dtype st, float *t) {
  int64_t r1 = op_min64(s->rows, (tile + 1) * s->row_block);
  bool direct = dt == OP_F32 && !acc;
  for (int64_t r = tile * s->row_block; r < r1; r++) {
    const float *in = op_load_f32(src, st, r * s->W, s->W, t);
    float *out = direct ? dst + r * s->W : t + s->W;
    if (forward)
      rotate_row(s, r % s->T, out, in);
    else
      unrotate_row(s, r % s->T, out, in);
    if (!direct) op_store_dt(dst, dt, r * s->W, out, s->W, acc);
  }
}

static int rope_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                    op_worker *w) {
  const rope_state *s = op->state;
  const op_desc *d = &op->desc;
  rope_rows(s, tile, true, b->out, d->out_dtype, false, b->in[0],
            d->in_dtype[0], op_temp(&s->base, w));
  return REMAT_OK;
}

static int rope_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                    op_worker *w) {
  const rope_state *s = op->state;
  const op_desc *d = &op->desc;
  if (!b->din[0]) return REMAT_OK;
  rope_rows(s, tile, false, b->din[0], d->din_dtype[0], b->din_accumulate[0],
            b->dout, d->out_dtype, op_temp(&s->base, w));
  return REMAT_OK;
}

/* Llama 3's scaling of frequency f (op_attrs.rope_*): wavelengths longer
 * than orig / low are slowed by `factor`, shorter than orig / high kept,
 * and those between blended linearly in orig / wavelength. */
static double scale_freq(const op_attrs *a, double f) {
  if (a->rope_factor <= 0.0f)
    return f;
  const double pi = 3.14159265358979323846;
  double wavelen = 2.0 * pi / f, orig = (double)a->rope_orig;
  double low = a->rope_low, high = a->rope_high, factor = a->rope_factor;
  if (wavelen < orig / high)
    return f;
  if (wavelen > orig / low)
    return f / factor;
  double smooth = (orig / wavelen - low) / (high - low);
  return (1.0 - smooth) * f / factor + smooth * f;
}

/* cos and sin of t * f_i for t < T, i < hd/2, in double, where f_i is
 * theta^(-2i/hd) scaled by scale_freq. */
static void rope_tables(rope_state *s, const op_attrs *a, double theta) {
  for (int64_t i = 0; i < s->half; i++) {
    double freq =
        scale_freq(a, pow(theta, -2.0 * (double)i / (double)s->hd));
    for (int64_t t = 0; t < s->T; t++) {
      double a = (double)t * freq;
      s->cos[t * s->half + i] = (float)cos(a);
      s->sin[t * s->half + i] = (float)sin(a);
    }
  }
}

remat_status op_rope_plan(op_instance *inst, dnnl_engine_t engine,
                          char err[OP_ERRMSG_MAX]) {
  (void)err;
  const op_desc *d = &inst->desc;
  int64_t T = d->in[0].dim[1], W = d->in[0].dim[2];
  int64_t hd = W / d->attrs.heads;
  size_t table = (size_t)(T * hd) * sizeof(float); /* cos and sin */
  rope_state *s = op_state_new(sizeof *s + table, engine, "rope");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->rows = op_rows(&d->in[0]);
  s->T = T;
  s->W = W;
  s->hd = hd;
  s->half = hd / 2;
  s->row_block = op_min64(op_row_block(W), s->rows);
  s->cos = s->table;
  s->sin = s->table + T * s->half;
  rope_tables(s, &d->attrs,
              d->attrs.theta > 0.0f ? (double)d->attrs.theta : 10000.0);
  s->base.temp_bytes = (size_t)(2 * W) * sizeof(float);
  int64_t tiles = op_div_up(s->rows, s->row_block);
  double n = (double)s->rows * W;
  inst->fwd[inst->nfwd++] = op_make_kernel("rope.fwd", rope_fwd, tiles,
                                           3.0 * n, OP_SLOT_IN(0),
                                           OP_SLOT_OUT);
  inst->fwd[0].span =
      op_span_rows(s->rows, s->row_block, OP_SLOT_IN(0) | OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] = op_make_kernel("rope.bwd", rope_bwd, tiles,
                                           3.0 * n, OP_SLOT_DOUT,
                                           OP_SLOT_DIN(0));
  inst->bwd[0].span =
      op_span_rows(s->rows, s->row_block, OP_SLOT_DOUT | OP_SLOT_DIN(0));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
