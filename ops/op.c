/* The op table: names, tags, and the dispatch of shape inference and
 * planning to the op families; plus the input checks and shape messages
 * that every family's inference uses. */
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops/op_impl.h"

typedef struct op_entry {
  const char *name;
  unsigned tags;
  op_infer_fn infer;
  op_plan_fn plan;
} op_entry;

static const op_entry op_table[OP_NUM_TYPES] = {
    [OP_LINEAR] = {"linear", OP_TAG_DOT, op_linear_infer, op_linear_plan},
    [OP_MATMUL] = {"matmul", OP_TAG_DOT, op_matmul_infer, op_matmul_plan},
    [OP_ADD] = {"add", 0, op_add_infer, op_add_plan},
    [OP_BIAS_ADD] = {"bias_add", 0, op_bias_add_infer, op_bias_add_plan},
    [OP_RELU] = {"relu", 0, op_unary_infer, op_relu_plan},
    [OP_GELU] = {"gelu", 0, op_unary_infer, op_gelu_plan},
    [OP_LAYERNORM] = {"layernorm", 0, op_layernorm_infer, op_layernorm_plan},
    [OP_SOFTMAX] = {"softmax", 0, op_unary_infer, op_softmax_plan},
    [OP_ATTN_SCORES] = {"attn_scores", OP_TAG_DOT | OP_TAG_BATCHED,
                        op_attn_scores_infer, op_attn_scores_plan},
    [OP_ATTN_VALUES] = {"attn_values", OP_TAG_DOT | OP_TAG_BATCHED,
                        op_attn_values_infer, op_attn_values_plan},
    [OP_EMBED] = {"embed", 0, op_embed_infer, op_embed_plan},
    [OP_CROSS_ENTROPY] = {"cross_entropy", 0, op_cross_entropy_infer,
                          op_cross_entropy_plan},
    [OP_SUM] = {"sum", 0, op_reduce_infer, op_reduce_plan},
    [OP_MEAN] = {"mean", 0, op_reduce_infer, op_reduce_plan},
};

static bool valid_type(op_type type) {
  return (int)type >= 0 && type < OP_NUM_TYPES;
}

const char *op_name(op_type type) {
  return valid_type(type) ? op_table[type].name : "unknown";
}

unsigned op_tags(const op_desc *desc) {
  if (!desc || !valid_type(desc->type)) return 0;
  unsigned tags = op_table[desc->type].tags;
  if (desc->type == OP_MATMUL && desc->nin >= 1 && desc->in[0].ndim > 2)
    tags |= OP_TAG_BATCHED;
  return tags;
}

int64_t op_numel(const op_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->dim[i];
  return n;
}

const char *op_shape_str(const op_shape *s, char buf[OP_SHAPE_STR_MAX]) {
  int len = snprintf(buf, OP_SHAPE_STR_MAX, "[");
  for (int i = 0; i < s->ndim && i < OP_MAX_DIMS && len < OP_SHAPE_STR_MAX;
       i++)
    len += snprintf(buf + len, OP_SHAPE_STR_MAX - len, "%s%lld", i ? "," : "",
                    (long long)s->dim[i]);
  if (len < OP_SHAPE_STR_MAX) snprintf(buf + len, OP_SHAPE_STR_MAX - len, "]");
  return buf;
}

remat_status op_shape_err(char err[OP_ERRMSG_MAX], const op_desc *d,
                          const char *fmt, ...) {
  int len = snprintf(err, OP_ERRMSG_MAX, "%s: ", op_name(d->type));
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err + len, OP_ERRMSG_MAX - len, fmt, ap);
  va_end(ap);
  return REMAT_ERR_SHAPE;
}

static const char *dtype_name(op_dtype t) {
  return t == OP_I32 ? "int32" : "f32";
}

remat_status op_check_inputs(const op_desc *d, int nmin, int nmax,
                             const char *const names[],
                             const op_dtype dtypes[],
                             char err[OP_ERRMSG_MAX]) {
  if (d->nin < nmin || d->nin > nmax) {
    if (nmin == nmax)
      return op_shape_err(err, d, "takes %d input%s, got %d", nmin,
                          nmin == 1 ? "" : "s", d->nin);
    return op_shape_err(err, d, "takes %d or %d inputs, got %d", nmin, nmax,
                        d->nin);
  }
  char buf[OP_SHAPE_STR_MAX];
  for (int i = 0; i < d->nin; i++) {
    const op_shape *s = &d->in[i];
    if (s->ndim < 1 || s->ndim > OP_MAX_DIMS)
      return op_shape_err(err, d, "%s has %d dims (1 to %d allowed)",
                          names[i], s->ndim, OP_MAX_DIMS);
    for (int k = 0; k < s->ndim; k++)
      if (s->dim[k] < 1)
        return op_shape_err(err, d, "%s %s: every dim must be at least 1",
                            names[i], op_shape_str(s, buf));
    if (d->in_dtype[i] != dtypes[i])
      return op_shape_err(err, d, "%s %s must be %s, not %s", names[i],
                          op_shape_str(s, buf), dtype_name(dtypes[i]),
                          dtype_name(d->in_dtype[i]));
  }
  return REMAT_OK;
}

bool op_shape_eq(const op_shape *a, const op_shape *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->dim[i] != b->dim[i]) return false;
  return true;
}

op_shape op_scalar_shape(void) {
  op_shape s = {.ndim = 1, .dim = {1}};
  return s;
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

void op_instance_release(op_instance *inst) {
  if (!inst) return;
  op_state_free(inst->state);
  inst->state = NULL;
}
