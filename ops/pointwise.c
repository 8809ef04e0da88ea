/* Pointwise ops of the Llama feed-forward block and of LoRA: mul (a * b),
 * silu (x * sigmoid(x)), scale (x times a constant) and swiglu
 * (silu(gate) * up, the two in one memory pass). All share one driver:
 * flat tiles of OP_FLAT_ELEMS elements, cut into blocks of PW_BLOCK that
 * are converted to f32 when bf16 (op_load_f32), computed in f32 and stored
 * with one rounding (op_store_dt); an f32 result is written in place. */
#include "base/bf16.h"
#include "ops/op_impl.h"

/* Elements of a block: four of them (two operands, dy, the result) make
 * the op's temporary. */
#define PW_BLOCK 2048
_Static_assert(OP_FLAT_ELEMS % PW_BLOCK == 0, "blocks tile the chunks");

/* y[0..m) from a (and b) */
typedef void (*pw_fwd_fn)(float *restrict y, const float *restrict a,
                          const float *restrict b, float s, int64_t m);
/* the gradient of one input from a (and b) and dy */
typedef void (*pw_bwd_fn)(float *restrict dx, const float *restrict a,
                          const float *restrict b,
                          const float *restrict dy, float s, int64_t m);

/* One pointwise op: its kernels' names, its math per input, the inputs
 * its backward reads (beside dy) and its flops per element. */
typedef struct pw_kind {
  const char *fwd_name, *bwd_name;
  pw_fwd_fn fwd;
  pw_bwd_fn bwd[2];
  uint32_t bwd_reads;
  double fwd_flops, bwd_flops;
} pw_kind;

typedef struct pw_state {
  op_base base;
  const pw_kind *kind;
  int64_t n;
  float scale;
} pw_state;

static inline float sigmoid(float x) { return 1.0f / (1.0f + op_expf(-x)); }

/* ---- mul: a, b and y are (n) ---- */

// y = a * b
REMAT_SIMD_CLONES static void mul_fwd(float *restrict y,
                                      const float *restrict a,
                                      const float *restrict b, float s,
                                      int64_t m) {
  (void)s;
  for (int64_t i = 0; i < m; i++) y[i] = a[i] * b[i];
}

// in the forward pass y = a * b, so da = dy * b
REMAT_SIMD_CLONES static void mul_da(float *restrict dx,
                                     const float *restrict a,
                                     const float *restrict b,
                                     const float *restrict dy, float s,
                                     int64_t m) {
  (void)a, (void)s;
  for (int64_t i = 0; i < m; i++) dx[i] = dy[i] * b[i];
}

// and db = dy * a
REMAT_SIMD_CLONES static void mul_db(float *restrict dx,
                                     const float *restrict a,
                                     const float *restrict b,
                                     const float *restrict dy, float s,
                                     int64_t m) {
  (void)b, (void)s;
  for (int64_t i = 0; i < m; i++) dx[i] = dy[i] * a[i];
}

/* ---- silu: x and y are (n) ---- */

// y = x * sigmoid(x)
REMAT_SIMD_CLONES static void silu_fwd(float *restrict y,
                                       const float *restrict x,
                                       const float *restrict b, float s,
                                       int64_t m) {
  (void)b, (void)s;
  for (int64_t i = 0; i < m; i++) y[i] = x[i] * sigmoid(x[i]);
}

// in the forward pass y = x * sig(x), so
// dx = dy * (sig(x) + x * sig(x) * (1 - sig(x))) = dy * sig * (1 + x (1 - sig))
REMAT_SIMD_CLONES static void silu_dx(float *restrict dx,
                                      const float *restrict x,
                                      const float *restrict b,
                                      const float *restrict dy, float s,
                                      int64_t m) {
  (void)b, (void)s;
  for (int64_t i = 0; i < m; i++) {
    float sg = sigmoid(x[i]);
    dx[i] = dy[i] * sg * (1.0f + x[i] * (1.0f - sg));
  }
}

/* ---- scale: x and y are (n), s a constant ---- */

// y = x * s
REMAT_SIMD_CLONES static void scale_fwd(float *restrict y,
                                        const float *restrict x,
                                        const float *restrict b, float s,
                                        int64_t m) {
  (void)b;
  for (int64_t i = 0; i < m; i++) y[i] = x[i] * s;
}

// in the forward pass y = x * s, so dx = dy * s (x is not read)
REMAT_SIMD_CLONES static void scale_dx(float *restrict dx,
                                       const float *restrict x,
                                       const float *restrict b,
                                       const float *restrict dy, float s,
                                       int64_t m) {
  (void)x, (void)b;
  for (int64_t i = 0; i < m; i++) dx[i] = dy[i] * s;
}

/* ---- swiglu: gate, up and y are (n) ---- */

// y = silu(gate) * up
REMAT_SIMD_CLONES static void swiglu_fwd(float *restrict y,
                                         const float *restrict g,
                                         const float *restrict u, float s,
                                         int64_t m) {
  (void)s;
  for (int64_t i = 0; i < m; i++) y[i] = g[i] * sigmoid(g[i]) * u[i];
}

// in the forward pass y = silu(g) * u, so dg = dy * u * silu'(g)
REMAT_SIMD_CLONES static void swiglu_dgate(float *restrict dx,
                                           const float *restrict g,
                                           const float *restrict u,
                                           const float *restrict dy, float s,
                                           int64_t m) {
  (void)s;
  for (int64_t i = 0; i < m; i++) {
    float sg = sigmoid(g[i]);
    dx[i] = dy[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
  }
}

// and du = dy * silu(g)
REMAT_SIMD_CLONES static void swiglu_dup(float *restrict dx,
                                         const float *restrict g,
                                         const float *restrict u,
                                         const float *restrict dy, float s,
                                         int64_t m) {
  (void)u, (void)s;
  for (int64_t i = 0; i < m; i++) dx[i] = dy[i] * (g[i] * sigmoid(g[i]));
}

static const pw_kind pw_mul = {"mul.fwd", "mul.bwd", mul_fwd,
                               {mul_da, mul_db},
                               OP_SLOT_IN(0) | OP_SLOT_IN(1), 1.0, 2.0};
static const pw_kind pw_silu = {"silu.fwd", "silu.bwd", silu_fwd,
                                {silu_dx, NULL}, OP_SLOT_IN(0), 6.0, 10.0};
static const pw_kind pw_scale = {"scale.fwd", "scale.bwd", scale_fwd,
                                 {scale_dx, NULL}, 0, 1.0, 1.0};
static const pw_kind pw_swiglu = {"swiglu.fwd", "swiglu.bwd", swiglu_fwd,
                                  {swiglu_dgate, swiglu_dup},
                                  OP_SLOT_IN(0) | OP_SLOT_IN(1), 7.0, 14.0};

remat_status op_mul_infer(op_desc *d, char err[OP_ERRMSG_MAX]) {
  static const char *const mul_names[] = {"a", "b"};
  static const char *const swiglu_names[] = {"gate", "up"};
  static const op_dtype types[] = {OP_F32, OP_F32};
  const char *const *names = d->type == OP_SWIGLU ? swiglu_names : mul_names;
  remat_status rs = op_check_inputs(d, 2, 2, names, types, err);
  if (rs != REMAT_OK) return rs;
  char ba[OP_SHAPE_STR_MAX], bb[OP_SHAPE_STR_MAX];
  if (!op_shape_eq(&d->in[0], &d->in[1]))
    return op_shape_err(err, d, "%s %s and %s %s: shapes must be equal",
                        names[0], op_shape_str(&d->in[0], ba), names[1],
                        op_shape_str(&d->in[1], bb));
  d->out = d->in[0];
  return REMAT_OK;
}

/* The chunk [*j0, *j1) of flat tile `tile`. */
static void pw_chunk(const pw_state *s, int64_t tile, int64_t *j0,
                     int64_t *j1) {
  *j0 = tile * OP_FLAT_ELEMS;
  *j1 = op_min64(s->n, *j0 + OP_FLAT_ELEMS);
}

// a (and b) and y are (n): y = f(a, b) over the tile's chunk
static int pw_forward(const op_instance *op, const op_bufs *b, int64_t tile,
                      op_worker *w) {
  const pw_state *s = op->state;
  const op_desc *d = &op->desc;
  float *t = op_temp(&s->base, w);
  bool direct = d->out_dtype == OP_F32;
  int64_t j0, j1;
  pw_chunk(s, tile, &j0, &j1);
  for (int64_t j = j0; j < j1; j += PW_BLOCK) {
    int64_t m = op_min64(PW_BLOCK, j1 - j);
    const float *x0 = op_load_f32(b->in[0], d->in_dtype[0], j, m, t);
    const float *x1 =
        d->nin > 1 ? op_load_f32(b->in[1], d->in_dtype[1], j, m,
                                 t + PW_BLOCK)
                   : NULL;
    float *y = direct ? b->out + j : t + 3 * PW_BLOCK;
    s->kind->fwd(y, x0, x1, s->scale, m);
    if (!direct) op_store_dt(b->out, d->out_dtype, j, y, m, false);
  }
  return REMAT_OK;
}

// the backward of the above: each needed din = (or +=) its derivative
// times dy, over the tile's chunk
static int pw_backward(const op_instance *op, const op_bufs *b,
                       int64_t tile, op_worker *w) {
  const pw_state *s = op->state;
  const op_desc *d = &op->desc;
  uint32_t reads = s->kind->bwd_reads;
  float *t = op_temp(&s->base, w);
  int64_t j0, j1;
  pw_chunk(s, tile, &j0, &j1);
  for (int64_t j = j0; j < j1; j += PW_BLOCK) {
    int64_t m = op_min64(PW_BLOCK, j1 - j);
    const float *x[2] = {NULL, NULL};
    for (int i = 0; i < d->nin; i++)
      if (reads & OP_SLOT_IN(i))
        x[i] = op_load_f32(b->in[i], d->in_dtype[i], j, m, t + i * PW_BLOCK);
    const float *dy =
        op_load_f32(b->dout, d->out_dtype, j, m, t + 2 * PW_BLOCK);
    for (int i = 0; i < d->nin; i++) {
      if (!b->din[i]) continue;
      bool acc = b->din_accumulate[i];
      bool direct = d->din_dtype[i] == OP_F32 && !acc;
      float *dx = direct ? b->din[i] + j : t + 3 * PW_BLOCK;
      s->kind->bwd[i](dx, x[0], x[1], dy, s->scale, m);
      if (!direct) op_store_dt(b->din[i], d->din_dtype[i], j, dx, m, acc);
    }
  }
  return REMAT_OK;
}

static remat_status pw_plan(op_instance *inst, dnnl_engine_t engine,
                            const pw_kind *kind) {
  const op_desc *d = &inst->desc;
  pw_state *s = op_state_new(sizeof *s, engine, op_name(d->type));
  if (!s) return REMAT_ERR_OUT_OF_MEMORY;
  inst->state = s;
  s->kind = kind;
  s->n = op_numel(&d->out);
  s->scale = d->attrs.scale;
  s->base.temp_bytes = 4 * PW_BLOCK * sizeof(float);
  int64_t tiles = op_div_up(s->n, OP_FLAT_ELEMS);
  uint32_t ins = d->nin > 1 ? OP_SLOT_IN(0) | OP_SLOT_IN(1) : OP_SLOT_IN(0);
  uint32_t dins =
      d->nin > 1 ? OP_SLOT_DIN(0) | OP_SLOT_DIN(1) : OP_SLOT_DIN(0);
  double n = (double)s->n;
  inst->fwd[inst->nfwd++] = op_make_kernel(
      kind->fwd_name, pw_forward, tiles, kind->fwd_flops * n, ins,
      OP_SLOT_OUT);
  inst->fwd[0].span = op_span_rows(s->n, OP_FLAT_ELEMS, ins | OP_SLOT_OUT);
  inst->bwd[inst->nbwd++] = op_make_kernel(
      kind->bwd_name, pw_backward, tiles, kind->bwd_flops * n,
      OP_SLOT_DOUT | kind->bwd_reads, dins);
  inst->bwd[0].span = op_span_rows(
      s->n, OP_FLAT_ELEMS, OP_SLOT_DOUT | kind->bwd_reads | dins);
  op_base_finish(&s->base, inst);
  return REMAT_OK;
}

remat_status op_mul_plan(op_instance *inst, dnnl_engine_t engine,
                         char err[OP_ERRMSG_MAX]) {
  (void)err;
  return pw_plan(inst, engine, &pw_mul);
}

remat_status op_silu_plan(op_instance *inst, dnnl_engine_t engine,
                          char err[OP_ERRMSG_MAX]) {
  (void)err;
  return pw_plan(inst, engine, &pw_silu);
}

remat_status op_scale_plan(op_instance *inst, dnnl_engine_t engine,
                           char err[OP_ERRMSG_MAX]) {
  (void)err;
  return pw_plan(inst, engine, &pw_scale);
}

remat_status op_swiglu_plan(op_instance *inst, dnnl_engine_t engine,
                            char err[OP_ERRMSG_MAX]) {
  (void)err;
  return pw_plan(inst, engine, &pw_swiglu);
}
