/* The op table: tags, and the dispatch of shape inference and planning to
 * the op families (shape.c holds what the families share). */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "ops/op_impl.h"

typedef struct op_entry {
  unsigned tags;
  op_infer_fn infer;
  op_plan_fn plan;
} op_entry;

static const op_entry op_table[OP_NUM_TYPES] = {
    [OP_LINEAR] = {OP_TAG_DOT, op_linear_infer, op_linear_plan},
    [OP_MATMUL] = {OP_TAG_DOT, op_matmul_infer, op_matmul_plan},
    [OP_ADD] = {0, op_add_infer, op_add_plan},
    [OP_BIAS_ADD] = {0, op_bias_add_infer, op_bias_add_plan},
    [OP_RELU] = {0, op_unary_infer, op_relu_plan},
    [OP_GELU] = {0, op_unary_infer, op_gelu_plan},
    [OP_LAYERNORM] = {0, op_layernorm_infer, op_layernorm_plan},
    [OP_SOFTMAX] = {0, op_unary_infer, op_softmax_plan},
    [OP_ATTN_SCORES] = {OP_TAG_DOT | OP_TAG_BATCHED,
                        op_attn_scores_infer, op_attn_scores_plan},
    [OP_ATTN_VALUES] = {OP_TAG_DOT | OP_TAG_BATCHED,
                        op_attn_values_infer, op_attn_values_plan},
    [OP_EMBED] = {0, op_embed_infer, op_embed_plan},
    [OP_CROSS_ENTROPY] = {0, op_cross_entropy_infer,
                          op_cross_entropy_plan},
    [OP_SUM] = {0, op_reduce_infer, op_reduce_plan},
    [OP_MEAN] = {0, op_reduce_infer, op_reduce_plan},
    [OP_ATTENTION] = {OP_TAG_DOT | OP_TAG_BATCHED, op_attention_infer,
                      op_attention_plan},
    [OP_DROPOUT] = {0, op_dropout_infer, op_dropout_plan},
    [OP_SLICE] = {0, op_slice_infer, op_slice_plan},
    [OP_MUL] = {0, op_mul_infer, op_mul_plan},
    [OP_SILU] = {0, op_unary_infer, op_silu_plan},
    [OP_SCALE] = {0, op_unary_infer, op_scale_plan},
    [OP_RMSNORM] = {0, op_rmsnorm_infer, op_rmsnorm_plan},
    [OP_ROPE] = {0, op_rope_infer, op_rope_plan},
    [OP_SWIGLU] = {0, op_mul_infer, op_swiglu_plan},
};

static bool valid_type(op_type type) {
  return (int)type >= 0 && type < OP_NUM_TYPES;
}

unsigned op_tags(const op_desc *desc) {
  if (!desc || !valid_type(desc->type)) return 0;
  unsigned tags = op_table[desc->type].tags;
  if (desc->type == OP_MATMUL && desc->nin >= 1 && desc->in[0].ndim > 2)
    tags |= OP_TAG_BATCHED;
  return tags;
}

remat_status op_infer(op_desc *desc, char err[OP_ERRMSG_MAX]) {
  err[0] = '\0';
  if (!desc || !valid_type(desc->type)) {
    snprintf(err, OP_ERRMSG_MAX, "op: unknown op type %d",
             desc ? (int)desc->type : -1);
    return REMAT_ERR_INVALID_ARG;
  }
  memset(&desc->out, 0, sizeof desc->out);
  return op_table[desc->type].infer(desc, err);
}

remat_status op_plan(const op_desc *desc, dnnl_engine_t engine,
                     op_instance *inst, char err[OP_ERRMSG_MAX]) {
  memset(inst, 0, sizeof *inst);
  inst->desc = *desc;
  remat_status rs = op_infer(&inst->desc, err);
  if (rs != REMAT_OK) return rs;
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  err[0] = '\0';
  rs = op_table[desc->type].plan(inst, engine, err);
  omp_set_num_threads(threads);
  if (rs != REMAT_OK && err[0] == '\0')
    snprintf(err, OP_ERRMSG_MAX, "%s: %s while planning the op",
             op_name(desc->type),
             rs == REMAT_ERR_OUT_OF_MEMORY ? "out of memory" : "failure");
  if (rs != REMAT_OK) op_instance_release(inst);
  return rs;
}

remat_status op_fuse(op_instance *inst, const op_desc *next, int in,
                     char err[OP_ERRMSG_MAX]) {
  if (inst->desc.type != OP_LINEAR) {
    snprintf(err, OP_ERRMSG_MAX, "%s: no fused epilogue (only linear has)",
             op_name(inst->desc.type));
    return REMAT_ERR_INVALID_ARG;
  }
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  remat_status rs = op_linear_fuse(inst, next, in, err);
  omp_set_num_threads(threads);
  return rs;
}

void op_instance_release(op_instance *inst) {
  if (!inst) return;
  op_state_free(inst->state);
  inst->state = NULL;
}
