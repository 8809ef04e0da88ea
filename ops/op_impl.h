/* Internal interface between the op table (op.c) and the op families: each
 * family exports its shape inference and planning, and shape.c's helpers for
 * input checks and messages that name the op and its shapes. */
#ifndef REMAT_OPS_OP_IMPL_H
#define REMAT_OPS_OP_IMPL_H

#include "ops/dnnl_util.h"

typedef remat_status (*op_infer_fn)(op_desc *d, char err[OP_ERRMSG_MAX]);
/* Plans an op whose desc already passed inference; inst->desc is set. */
typedef remat_status (*op_plan_fn)(op_instance *inst, dnnl_engine_t engine,
                                   char err[OP_ERRMSG_MAX]);

/* Formats "<op>: <message>" into err and returns REMAT_ERR_SHAPE. */
remat_status op_shape_err(char err[OP_ERRMSG_MAX], const op_desc *d,
                          const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Checks the input count (nmin..nmax), ranks 1..4, dims >= 1, and dtypes;
 * names[i] names input i in messages. */
remat_status op_check_inputs(const op_desc *d, int nmin, int nmax,
                             const char *const names[],
                             const op_dtype dtypes[],
                             char err[OP_ERRMSG_MAX]);
/* A kernel whose tiles touch all of every slot (op_span rows 0, no
 * slots named); the op sets `span` when its tiles do less. */
static inline op_kernel op_make_kernel(const char *name, op_tile_fn fn,
                                       int64_t tiles, double flops,
                                       uint32_t reads, uint32_t writes) {
  op_kernel k = {name, fn, tiles, flops, reads, writes, {0}};
  return k;
}
/* Row blocks of `block` rows out of `rows`, one tile per block, touching
 * only their rows of `row_slots`. */
static inline op_span op_span_rows(int64_t rows, int64_t block,
                                   uint32_t row_slots) {
  op_span s = {.rows = rows, .row_block = block, .row_tiles = 1,
               .row_slots = row_slots};
  return s;
}
/* Tiles that are not row blocks: each touches its own share of
 * `tile_slots` and a spread share of `spread_slots`. */
static inline op_span op_span_cols(uint32_t tile_slots,
                                   uint32_t spread_slots) {
  op_span s = {.tile_slots = tile_slots, .spread_slots = spread_slots};
  return s;
}
/* The error of an op whose x (input 0) and y differ in dtype: "<op>: x is
 * f32 and y bf16: x and y must have the same dtype". */
remat_status op_same_dtype_err(const op_desc *d, char err[OP_ERRMSG_MAX]);
/* True when shapes a and b are equal. */
bool op_shape_eq(const op_shape *a, const op_shape *b);
/* A [1] shape (losses and reductions). */
op_shape op_scalar_shape(void);

remat_status op_linear_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
/* op_fuse of a linear (inst->desc.type OP_LINEAR). */
remat_status op_linear_fuse(op_instance *inst, const op_desc *next, int in,
                            char err[OP_ERRMSG_MAX]);
remat_status op_linear_plan(op_instance *inst, dnnl_engine_t engine,
                            char err[OP_ERRMSG_MAX]);
remat_status op_matmul_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_matmul_plan(op_instance *inst, dnnl_engine_t engine,
                            char err[OP_ERRMSG_MAX]);
remat_status op_add_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_add_plan(op_instance *inst, dnnl_engine_t engine,
                         char err[OP_ERRMSG_MAX]);
remat_status op_bias_add_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_bias_add_plan(op_instance *inst, dnnl_engine_t engine,
                              char err[OP_ERRMSG_MAX]);
remat_status op_unary_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_relu_plan(op_instance *inst, dnnl_engine_t engine,
                          char err[OP_ERRMSG_MAX]);
remat_status op_gelu_plan(op_instance *inst, dnnl_engine_t engine,
                          char err[OP_ERRMSG_MAX]);
remat_status op_layernorm_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_layernorm_plan(op_instance *inst, dnnl_engine_t engine,
                               char err[OP_ERRMSG_MAX]);
remat_status op_softmax_plan(op_instance *inst, dnnl_engine_t engine,
                             char err[OP_ERRMSG_MAX]);
remat_status op_attn_scores_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_attn_scores_plan(op_instance *inst, dnnl_engine_t engine,
                                 char err[OP_ERRMSG_MAX]);
remat_status op_attn_values_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_attn_values_plan(op_instance *inst, dnnl_engine_t engine,
                                 char err[OP_ERRMSG_MAX]);
remat_status op_attention_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_attention_plan(op_instance *inst, dnnl_engine_t engine,
                               char err[OP_ERRMSG_MAX]);
remat_status op_dropout_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_dropout_plan(op_instance *inst, dnnl_engine_t engine,
                             char err[OP_ERRMSG_MAX]);
remat_status op_embed_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_embed_plan(op_instance *inst, dnnl_engine_t engine,
                           char err[OP_ERRMSG_MAX]);
remat_status op_cross_entropy_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_cross_entropy_plan(op_instance *inst, dnnl_engine_t engine,
                                   char err[OP_ERRMSG_MAX]);
remat_status op_reduce_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_reduce_plan(op_instance *inst, dnnl_engine_t engine,
                            char err[OP_ERRMSG_MAX]);
remat_status op_slice_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_slice_plan(op_instance *inst, dnnl_engine_t engine,
                           char err[OP_ERRMSG_MAX]);
remat_status op_mul_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_mul_plan(op_instance *inst, dnnl_engine_t engine,
                         char err[OP_ERRMSG_MAX]);
remat_status op_silu_plan(op_instance *inst, dnnl_engine_t engine,
                          char err[OP_ERRMSG_MAX]);
remat_status op_scale_plan(op_instance *inst, dnnl_engine_t engine,
                           char err[OP_ERRMSG_MAX]);
remat_status op_swiglu_plan(op_instance *inst, dnnl_engine_t engine,
                            char err[OP_ERRMSG_MAX]);
remat_status op_rmsnorm_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_rmsnorm_plan(op_instance *inst, dnnl_engine_t engine,
                             char err[OP_ERRMSG_MAX]);
remat_status op_rope_infer(op_desc *d, char err[OP_ERRMSG_MAX]);
remat_status op_rope_plan(op_instance *inst, dnnl_engine_t engine,
                          char err[OP_ERRMSG_MAX]);

#endif
