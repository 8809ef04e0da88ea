/* Dropout: y = x * keep / (1 - p), keep = 0 with probability p, drawn per
 * element from the counter-based generator (base/counter_rng.h) keyed by
 * the graph's seed, the op's dropout site and the run's step, so the
 * backward and any recompute draw the forward's mask again, whatever the
 * tiles or threads. Outside training (remat_forward) y = x. Flat tiles of
 * OP_FLAT_ELEMS elements; bf16 buffers go through f32 blocks of the op's
 * temporary, rounded once on the store. */
#include <string.h>

#include "base/counter_rng.h"
#include "ops/op_impl.h"

/* Elements converted to f32 at a time (two blocks of the temporary). */
#define DROP_BLOCK 2048

typedef struct dropout_state {
  op_base base;
  int64_t n;
  float keep_scale;    /* 1 / (1 - p) */
  uint32_t drop_below; /* bits below it drop */
} dropout_state;

remat_status op_dropout_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"x"};
  static const op_dtype types[] = {OP_F32};
  remat_status rs = op_check_inputs(d, 1, 1, names, types, err);
  if (rs != REMAT_OK) return rs;
  float p = d->attrs.dropout;
  if (!(p >= 0.0f && p < 1.0f))
    return op_shape_err(err, d,
                        "p %g is not valid: expected a probability in [0,1)",
                        (double)p);
  d->out = d->in[0];
  return REMAT_OK;
}

/* y[0..n) = (or +=) x[0..n) times the mask of elements i0..i0+n, or x
 * itself when `masked` is false. */
static void drop_block(const dropout_state *s, uint64_t key, bool masked,
                       int64_t i0, const float *restrict x, float *restrict y,
                       int64_t n) {
  if (!masked) {
    memcpy(y, x, (size_t)n * sizeof *y);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    y[i] = counter_rng_bits(key, (uint64_t)(i0 + i)) >= s->drop_below
               ? x[i] * s->keep_scale
               : 0.0f;
}

/* dst (dtype dt, elements i0..i0+len) = (or +=) src (dtype st), masked
 * or not. */
static void drop_range(const op_instance *op, const op_bufs *b, bool masked,
                       const float *src, op_dtype st, float *dst, op_dtype dt,
                       bool acc, int64_t i0, int64_t len, op_worker *w) {
  const dropout_state *s = op->state;
  uint64_t key = masked ? counter_rng_key(b->rng_seed,
                                          (uint64_t)op->desc.attrs.rng_stream,
                                          b->rng_step)
                        : 0;
  if (st == OP_F32 && dt == OP_F32 && !acc) {
    drop_block(s, key, masked, i0, src + i0, dst + i0, len);
    return;
  }
  float *t = op_temp(&s->base, w);
  for (int64_t j = 0; j < len; j += DROP_BLOCK) {
    int64_t m = op_min64(DROP_BLOCK, len - j);
    const float *x = op_load_f32(src, st, i0 + j, m, t);
    drop_block(s, key, masked, i0 + j, x, t + DROP_BLOCK, m);
    op_store_dt(dst, dt, i0 + j, t + DROP_BLOCK, m, acc);
  }
}

// x and y are (n): y = x * keep / (1 - p) in training, else x
static int dropout_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                       op_worker *w) {
  const dropout_state *s = op->state;
  int64_t i0 = tile * OP_FLAT_ELEMS, len = op_min64(OP_FLAT_ELEMS, s->n - i0);
  bool masked = b->training && op->desc.attrs.dropout > 0.0f;
  drop_range(op, b, masked, b->in[0], op->desc.in_dtype[0], b->out,
             op->desc.out_dtype, false, i0, len, w);
  return REMAT_OK;
}

// in the forward pass y = x * keep / (1 - p), so dx = dy * keep / (1 - p)
// with the same keep
static int dropout_bwd(const op_instance *op, const op_bufs *b, int64_t tile,
                       op_worker *w) {
  const dropout_state *s = op->state;
  if (!b->din[0]) return REMAT_OK;
  int64_t i0 = tile * OP_FLAT_ELEMS, len = op_min64(OP_FLAT_ELEMS, s->n - i0);
  bool with_mask = op->desc.attrs.dropout > 0.0f; /* training only */
  drop_range(op, b, with_mask, b->dout, op->desc.out_dtype, b->din[0],
             op->desc.din_dtype[0], b->din_accumulate[0], i0, len, w);
  return REMAT_OK;
}

remat_status op_dropout_plan(op_instance *inst, dnnl_engine_t engine,
                             char err[OP_ERRMSG_MAX]) {
  (void)err;
  dropout_state *s = op_state_new(sizeof *s, engine, "dropout");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->n = op_numel(&inst->desc.in[0]);
  s->keep_scale = 1.0f / (1.0f - inst->desc.attrs.dropout);
  s->drop_below = counter_rng_threshold(inst->desc.attrs.dropout);
  s->base.temp_bytes = 2 * DROP_BLOCK * sizeof(float);
  int64_t tiles = op_div_up(s->n, OP_FLAT_ELEMS);
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "dropout.fwd", dropout_fwd, tiles, (double)s->n, OP_SLOT_IN(0),
      OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] = op_make_kernel(
      "dropout.bwd", dropout_bwd, tiles, (double)s->n, OP_SLOT_DOUT,
      OP_SLOT_DIN(0));
  inst->fwd[0].span =
      op_span_rows(s->n, OP_FLAT_ELEMS, OP_SLOT_IN(0) | OP_SLOT_OUT);
  inst->bwd[0].span =
      op_span_rows(s->n, OP_FLAT_ELEMS, OP_SLOT_DOUT | OP_SLOT_DIN(0));
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
