/* Token and position embedding: x[b,t] = wte[tokens[b,t]] + wpe[t], or
 * x[b,t] = wte[tokens[b,t]] without wpe (no learned positions: the op has
 * two inputs). The forward tiles row blocks of the B*T rows; the backward
 * sums rows into dwte and dwpe deterministically: each tile owns a block
 * of columns (dwte) or of positions (dwpe) and walks all rows in order.
 * In bf16 precision the tables and their gradients stay f32; x and dx are
 * bf16: a row is summed in f32 in the op's temporary and rounded once, and
 * dx is read as f32. */
#include <string.h>

#include "base/bf16.h"
#include "ops/op_impl.h"

/* Columns of dwte a scatter tile owns. */
#define OP_EMBED_COLS 32

typedef struct embed_state {
  op_base base;
  int64_t B, T, V, D, Tmax;
  int64_t row_block, pos_block;
} embed_state;

remat_status op_embed_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const names[] = {"tokens", "wte", "wpe"};
  static const op_dtype types[] = {OP_I32, OP_F32, OP_F32};
  remat_status rs = op_check_inputs(d, 2, 3, names, types, err);
  if (rs != REMAT_OK) return rs;
  const op_shape *tok = &d->in[0], *wte = &d->in[1], *wpe = &d->in[2];
  char bt[OP_SHAPE_STR_MAX], be[OP_SHAPE_STR_MAX], bp[OP_SHAPE_STR_MAX];
  op_shape_str(tok, bt);
  op_shape_str(wte, be);
  if (tok->ndim != 2)
    return op_shape_err(err, d, "tokens %s must be [B,T]", bt);
  if (d->nin == 2) {
    if (wte->ndim != 2)
      return op_shape_err(err, d, "wte %s must be [V,D]", be);
    d->out = (op_shape){3, {tok->dim[0], tok->dim[1], wte->dim[1]}};
    return REMAT_OK;
  }
  op_shape_str(wpe, bp);
  if (wte->ndim != 2 || wpe->ndim != 2 || wte->dim[1] != wpe->dim[1])
    return op_shape_err(err, d,
                        "wte %s and wpe %s: must be [V,D] and [Tmax,D] with "
                        "the same D",
                        be, bp);
  if (tok->dim[1] > wpe->dim[0])
    return op_shape_err(err, d,
                        "tokens %s and wpe %s: T (%lld) must be at most Tmax "
                        "(%lld)",
                        bt, bp, (long long)tok->dim[1],
                        (long long)wpe->dim[0]);
  op_shape out = {3, {tok->dim[0], tok->dim[1], wte->dim[1]}};
  d->out = out;
  return REMAT_OK;
}

// tokens is (B,T), wte is (V,D), wpe is (Tmax,D) or none, x is (B,T,D):
// x[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] (+ 0 without wpe)
static int embed_fwd(const op_instance *op, const op_bufs *b, int64_t tile,
                     op_worker *w) {
  const embed_state *s = op->state;
  const int32_t *tokens = (const int32_t *)b->in[0];
  int64_t r0 = tile * s->row_block;
  int64_t r1 = op_min64(r0 + s->row_block, s->B * s->T), D = s->D;
  for (int64_t r = r0; r < r1; r++)
    if (tokens[r] < 0 || tokens[r] >= s->V) return REMAT_ERR_INVALID_ARG;
  bool half = op->desc.out_dtype == OP_BF16;
  for (int64_t r = r0; r < r1; r++) {
    const float *restrict e = b->in[1] + (int64_t)tokens[r] * D;
    /* bf16: the row in f32 in the temporary, then rounded */
    float *restrict x = half ? op_temp(&s->base, w) : b->out + r * D;
    if (s->Tmax == 0) {
      memcpy(x, e, (size_t)D * sizeof *x);
    } else {
      const float *restrict p = b->in[2] + (r % s->T) * D;
      for (int64_t c = 0; c < D; c++) x[c] = e[c] + p[c];
    }
    if (half) bf16_from_f32_row((uint16_t *)b->out + r * D, x, D);
  }
  return REMAT_OK;
}

// in the forward pass x[b,t] += wte[tokens[b,t]], so dwte[tokens[b,t]] +=
// dx[b,t]: each tile zeroes its block of columns (when overwriting), then
// adds every row, in order, into it
static int embed_dwte(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  (void)w;
  const embed_state *s = op->state;
  if (!b->din[1]) return REMAT_OK;
  const int32_t *tokens = (const int32_t *)b->in[0];
  int64_t c0 = tile * OP_EMBED_COLS, nc = op_min64(OP_EMBED_COLS, s->D - c0);
  if (!b->din_accumulate[1])
    for (int64_t v = 0; v < s->V; v++)
      memset(b->din[1] + v * s->D + c0, 0, (size_t)nc * sizeof(float));
  bool half = op->desc.out_dtype == OP_BF16;
  for (int64_t r = 0; r < s->B * s->T; r++) {
    float *restrict g = b->din[1] + (int64_t)tokens[r] * s->D + c0;
    if (half) {
      const uint16_t *restrict dx = (const uint16_t *)b->dout + r * s->D + c0;
      for (int64_t c = 0; c < nc; c++) g[c] += bf16_to_f32(dx[c]);
    } else {
      const float *restrict dx = b->dout + r * s->D + c0;
      for (int64_t c = 0; c < nc; c++) g[c] += dx[c];
    }
  }
  return REMAT_OK;
}

// and x[b,t] += wpe[t], so dwpe[t] = sum over b of dx[b,t] (0 for t >= T)
static int embed_dwpe(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  (void)w;
  const embed_state *s = op->state;
  if (!b->din[2]) return REMAT_OK;
  int64_t t0 = tile * s->pos_block;
  int64_t t1 = op_min64(t0 + s->pos_block, s->Tmax), D = s->D;
  for (int64_t t = t0; t < t1; t++) {
    float *restrict g = b->din[2] + t * D;
    if (!b->din_accumulate[2]) memset(g, 0, (size_t)D * sizeof(float));
    for (int64_t bi = 0; bi < s->B && t < s->T; bi++) {
      if (op->desc.out_dtype == OP_BF16) {
        const uint16_t *restrict dx =
            (const uint16_t *)b->dout + (bi * s->T + t) * D;
        for (int64_t c = 0; c < D; c++) g[c] += bf16_to_f32(dx[c]);
      } else {
        const float *restrict dx = b->dout + (bi * s->T + t) * D;
        for (int64_t c = 0; c < D; c++) g[c] += dx[c];
      }
    }
  }
  return REMAT_OK;
}

remat_status op_embed_plan(op_instance *inst, dnnl_engine_t engine,
                           char err[OP_ERRMSG_MAX]) {
  const op_desc *d = &inst->desc;
  for (int i = 1; i < d->nin; i++)
    if (d->in_dtype[i] != OP_F32 || d->din_dtype[i] != OP_F32)
      return op_shape_err(err, d,
                          "%s is %s and its gradient %s: the tables and "
                          "their gradients must be f32",
                          i == 1 ? "wte" : "wpe",
                          op_dtype_name(d->in_dtype[i]),
                          op_dtype_name(d->din_dtype[i]));
  embed_state *s = op_state_new(sizeof *s, engine, "embed");
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->B = d->in[0].dim[0];
  s->T = d->in[0].dim[1];
  s->V = d->in[1].dim[0];
  s->D = d->in[1].dim[1];
  s->Tmax = d->nin == 3 ? d->in[2].dim[0] : 0; /* 0: no wpe */
  s->row_block = op_row_block(s->D);
  s->pos_block = op_max64(1, op_row_block(s->D) / s->B);
  if (d->out_dtype == OP_BF16)
    s->base.temp_bytes = (size_t)s->D * sizeof(float);
  double n = (double)s->B * s->T * s->D;
  inst->fwd[inst->nfwd++] = op_make_kernel(
      "embed.fwd", embed_fwd, op_div_up(s->B * s->T, s->row_block), n,
      OP_SLOT_IN(0) | OP_SLOT_IN(1) | (s->Tmax > 0 ? OP_SLOT_IN(2) : 0),
      OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] =
      op_make_kernel("embed.dwte", embed_dwte, op_div_up(s->D, OP_EMBED_COLS),
                     n, OP_SLOT_IN(0) | OP_SLOT_DOUT, OP_SLOT_DIN(1));
  inst->fwd[0].span = op_span_rows(s->B * s->T, s->row_block,
                                   OP_SLOT_IN(0) | OP_SLOT_OUT);
  inst->fwd[0].span.spread_slots = inst->fwd[0].reads & ~OP_SLOT_IN(0);
  inst->bwd[0].span = op_span_cols(0, OP_SLOT_DOUT | OP_SLOT_DIN(1));
  if (s->Tmax > 0) {
    inst->bwd[inst->nbwd++] = op_make_kernel(
        "embed.dwpe", embed_dwpe, op_div_up(s->Tmax, s->pos_block), n,
        OP_SLOT_DOUT, OP_SLOT_DIN(2));
    inst->bwd[1].span = op_span_cols(OP_SLOT_DIN(2), OP_SLOT_DOUT);
  }
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}
