/* Shapes and their messages, shared by every op family: op names, element
 * counts, shape strings, input checks. It calls no op family, so the
 * families and the op table (op.c) both build on it. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops/op_impl.h"

static const char *const op_names[OP_NUM_TYPES] = {
    [OP_LINEAR] = "linear",         [OP_MATMUL] = "matmul",
    [OP_ADD] = "add",               [OP_BIAS_ADD] = "bias_add",
    [OP_RELU] = "relu",             [OP_GELU] = "gelu",
    [OP_LAYERNORM] = "layernorm",   [OP_SOFTMAX] = "softmax",
    [OP_ATTN_SCORES] = "attn_scores", [OP_ATTN_VALUES] = "attn_values",
    [OP_EMBED] = "embed",           [OP_CROSS_ENTROPY] = "cross_entropy",
    [OP_SUM] = "sum",               [OP_MEAN] = "mean",
    [OP_ATTENTION] = "attention",   [OP_DROPOUT] = "dropout",
    [OP_SLICE] = "slice",
    [OP_MUL] = "mul",               [OP_SILU] = "silu",
    [OP_SCALE] = "scale",           [OP_RMSNORM] = "rmsnorm",
    [OP_ROPE] = "rope",             [OP_SWIGLU] = "swiglu",
};

const char *op_name(op_type type) {
  return (int)type >= 0 && type < OP_NUM_TYPES ? op_names[type] : "unknown";
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

const char *op_dtype_name(op_dtype t) {
  return t == OP_I32 ? "int32" : t == OP_BF16 ? "bf16" : "f32";
}

bool op_input_keeps_f32(op_type type, int i) {
  switch (type) {
  case OP_LAYERNORM: return i >= 1;          /* gamma, beta */
  case OP_RMSNORM: return i == 1;            /* gamma */
  case OP_EMBED: return i >= 1;              /* wte, wpe */
  case OP_LINEAR: return i == 2;             /* b */
  case OP_BIAS_ADD: return i == 1;           /* b */
  default: return false;
  }
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
    /* OP_F32 in dtypes[] means a float: f32 or bf16 storage. */
    bool is_float = d->in_dtype[i] == OP_F32 || d->in_dtype[i] == OP_BF16;
    if (dtypes[i] == OP_F32 ? !is_float : d->in_dtype[i] != dtypes[i])
      return op_shape_err(err, d, "%s %s must be %s, not %s", names[i],
                          op_shape_str(s, buf), op_dtype_name(dtypes[i]),
                          op_dtype_name(d->in_dtype[i]));
  }
  return REMAT_OK;
}

remat_status op_same_dtype_err(const op_desc *d, char err[OP_ERRMSG_MAX]) {
  return op_shape_err(err, d,
                      "x is %s and y %s: x and y must have the same dtype",
                      op_dtype_name(d->in_dtype[0]),
                      op_dtype_name(d->out_dtype));
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

