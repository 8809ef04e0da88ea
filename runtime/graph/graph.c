/* Graph building: inputs, parameters and op nodes, with shape inference
 * through the op table and a sticky error (the first failure is kept, later
 * calls return NULL and do nothing). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/checked.h"
#include "base/files.h"
#include "runtime/internal.h"
#include "runtime/policy/policy.h"
#include "runtime/dp/dp.h"
#include "runtime/exec/progress.h"
#include "runtime/exec/step_state.h"


remat_status remat_graph_create(remat_runtime *rt, remat_graph **out) {
  if (rt == NULL || out == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_graph_create: rt and out must not be NULL");
  remat_graph *g = remat__calloc(1, sizeof *g);
  if (g == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "out of memory creating a graph");
  g->rt = rt;
  runtime_retain(rt);
  *out = g;
  return REMAT_OK;
}

void remat_graph_destroy(remat_graph *g) {
  if (g == NULL)
    return;
  graph_enter_wait(g); /* a step running on another thread finishes first */
  progress_free(g->progress);
  graph_step_destroy(g);
  dp_graph_free(g);
  for (int32_t i = 0; i < g->nops; i++)
    if (g->ops[i].planned)
      op_instance_release(&g->ops[i].inst);
  for (int32_t i = 0; i < g->ntensors; i++)
    free(g->tensors[i]);
  free(g->tensors);
  free(g->params);
  free(g->lora);
  name_index_free(&g->param_names);
  free(g->ops);
  policy_free_all(g);
  free(g->policy);
  remat_runtime *rt = g->rt;
  free(g);
  runtime_release(rt);
}

remat_status remat_graph_status(const remat_graph *g) {
  return g == NULL ? REMAT_ERR_INVALID_ARG : g->status;
}

const char *remat_graph_error(const remat_graph *g) {
  if (g == NULL)
    return "graph is NULL";
  return g->call_error[0] != '\0' ? g->call_error : g->error;
}

remat_status remat_graph_seed(remat_graph *g, uint64_t seed) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_graph_seed: g is NULL");
  g->seed = seed;
  return REMAT_OK;
}

/* Checks that building may go on; false after an error or compile (which
 * fails the call alone: graph_fail leaves a compiled graph's status). */
static bool building(remat_graph *g, const char *what) {
  if (g == NULL) {
    remat__fail(REMAT_ERR_INVALID_ARG, "%s: graph is NULL", what);
    return false;
  }
  if (g->status != REMAT_OK)
    return false;
  if (g->compiled) {
    graph_fail(g, REMAT_ERR_STATE, "%s: the graph is already compiled: "
               "build every tensor before remat_compile", what);
    return false;
  }
  return true;
}

static remat_tensor *new_tensor(remat_graph *g, tensor_kind kind,
                                const op_shape *shape, op_dtype dtype,
                                const char *name) {
  if (g->ntensors >= REMAT__MAX_TENSORS) {
    graph_fail(g, REMAT_ERR_LIMIT, "graph has too many tensors (limit %d)",
               REMAT__MAX_TENSORS);
    return NULL;
  }
  if (g->ntensors == g->cap_tensors) {
    int32_t cap = g->cap_tensors ? 2 * g->cap_tensors : 64;
    remat_tensor **t = remat__realloc(g->tensors, (size_t)cap * sizeof *t);
    if (t == NULL) {
      graph_fail(g, REMAT_ERR_OUT_OF_MEMORY, "out of memory adding a tensor");
      return NULL;
    }
    g->tensors = t;
    g->cap_tensors = cap;
  }
  remat_tensor *t = remat__calloc(1, sizeof *t);
  if (t == NULL) {
    graph_fail(g, REMAT_ERR_OUT_OF_MEMORY, "out of memory adding a tensor");
    return NULL;
  }
  t->graph = g;
  t->id = g->ntensors;
  t->kind = kind;
  t->shape = *shape;
  t->dtype = dtype;
  t->store = graph_store_dtype(g, kind == TENSOR_PARAM, dtype, shape);
  t->producer = -1;
  t->region = g->region_depth > 0 ? g->region_stack[g->region_depth - 1] : -1;
  snprintf(t->name, sizeof t->name, "%s", name);
  g->tensors[g->ntensors++] = t;
  return t;
}

/* Checks a tensor's element count, computed without overflow, against
 * the limit of one tensor; the message names the tensor and its shape. */
static bool shape_fits(remat_graph *g, const char *what, const char *name,
                       const op_shape *shape) {
  int64_t n;
  if (remat__numel(shape->dim, shape->ndim, &n) && n <= REMAT__MAX_NUMEL)
    return true;
  char buf[OP_SHAPE_STR_MAX];
  graph_fail(g, REMAT_ERR_LIMIT,
             "%s '%s' %s: more than 2^34 elements, the limit for one tensor",
             what, name, op_shape_str(shape, buf));
  return false;
}

static bool shape_from_dims(remat_graph *g, const char *what, const char *name,
                            int ndim, const int64_t *dims, op_shape *shape) {
  if (ndim < 1 || ndim > REMAT_MAX_DIMS || dims == NULL) {
    graph_fail(g, REMAT_ERR_SHAPE,
               "%s '%s': ndim %d is not valid: expected 1 to %d dims", what,
               name, ndim, REMAT_MAX_DIMS);
    return false;
  }
  shape->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    if (dims[i] < 1 || dims[i] > (INT64_C(1) << 31)) {
      graph_fail(g, REMAT_ERR_SHAPE,
                 "%s '%s': dim %d is %lld: expected 1 to 2^31", what, name, i,
                 (long long)dims[i]);
      return false;
    }
    shape->dim[i] = dims[i];
  }
  return shape_fits(g, what, name, shape);
}

/* A name is 1 to 63 bytes of UTF-8: safetensors headers (JSON) hold the
 * names of parameters, and other readers refuse a header that is not
 * UTF-8. */
static bool name_ok(remat_graph *g, const char *what, const char *name) {
  if (name == NULL || *name == '\0' || strlen(name) >= REMAT__NAME_MAX) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: name must be 1 to %d characters", what,
               REMAT__NAME_MAX - 1);
    return false;
  }
  size_t len = strlen(name), bad = remat__utf8_invalid_at(name, len);
  if (bad < len) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: name '%s' is not valid UTF-8 (byte \\x%02X at offset "
               "%zu): names must be UTF-8, as the JSON of a safetensors "
               "header is",
               what, remat__quote(&(remat__quoted){0}, name),
               (unsigned char)name[bad], bad);
    return false;
  }
  return true;
}

remat_tensor *remat_input(remat_graph *g, const char *name, remat_dtype dtype,
                          int ndim, const int64_t *dims) {
  op_shape shape;
  if (!building(g, "remat_input") || !name_ok(g, "remat_input", name) ||
      !shape_from_dims(g, "input", name, ndim, dims, &shape))
    return NULL;
  if (dtype != REMAT_F32 && dtype != REMAT_I32) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "input '%s': dtype %d is not valid: expected REMAT_F32 or "
               "REMAT_I32",
               name, (int)dtype);
    return NULL;
  }
  return new_tensor(g, TENSOR_INPUT, &shape, (op_dtype)dtype, name);
}

/* Room for one more parameter in g->params (doubled when full). */
static bool reserve_param(remat_graph *g) {
  if (g->nparams < g->cap_params)
    return true;
  int32_t cap = g->cap_params ? 2 * g->cap_params : 64;
  int32_t *p = remat__realloc(g->params, (size_t)cap * sizeof *p);
  if (p == NULL) {
    graph_fail(g, REMAT_ERR_OUT_OF_MEMORY, "out of memory adding a param");
    return false;
  }
  g->params = p;
  g->cap_params = cap;
  return true;
}

remat_tensor *remat_param(remat_graph *g, const char *name, int ndim,
                          const int64_t *dims, remat_init init, float scale) {
  op_shape shape;
  if (!building(g, "remat_param") || !name_ok(g, "remat_param", name) ||
      !shape_from_dims(g, "param", name, ndim, dims, &shape))
    return NULL;
  if ((unsigned)init > REMAT_INIT_NORMAL) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "param '%s': init %d is not valid: expected REMAT_INIT_ZEROS, "
               "REMAT_INIT_ONES or REMAT_INIT_NORMAL",
               name, (int)init);
    return NULL;
  }
  if (!isfinite(scale) || fabsf(scale) > REMAT_MAX_INIT_SCALE) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "param '%s': scale %g is not valid: expected a finite scale "
               "of at most %g in magnitude (a normal init draws values of "
               "up to 9 scales)",
               name, (double)scale, (double)REMAT_MAX_INIT_SCALE);
    return NULL;
  }
  if (name_index_find(&g->param_names, name) >= 0) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "param '%s': a parameter of this graph already has this "
               "name: parameter names must be unique (checkpoints store "
               "parameters by name)",
               name);
    return NULL;
  }
  if (!reserve_param(g))
    return NULL;
  remat_tensor *t = new_tensor(g, TENSOR_PARAM, &shape, OP_F32, name);
  if (t == NULL)
    return NULL;
  if (!name_index_add(&g->param_names, t->name, t->id)) {
    graph_fail(g, REMAT_ERR_OUT_OF_MEMORY, "param '%s': out of memory", name);
    return NULL;
  }
  t->init = init;
  t->init_scale = scale;
  g->params[g->nparams++] = t->id;
  return t;
}

remat_status remat_param_freeze(remat_graph *g, remat_tensor *t) {
  const char *what = "remat_param_freeze";
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "%s: graph is NULL", what);
  if (g->status != REMAT_OK)
    return g->status;
  if (g->compiled)
    return graph_fail(g, REMAT_ERR_STATE,
                      "%s: the graph is already compiled: freeze parameters "
                      "before remat_compile",
                      what);
  if (!graph_tensor_ok(g, t, what))
    return g->status;
  if (t->kind != TENSOR_PARAM)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "%s: '%s' is %s: only a parameter (made by remat_param) "
                      "can be frozen",
                      what, t->name,
                      t->kind == TENSOR_INPUT ? "an input" : "an op result");
  t->frozen = true;
  t->store = graph_param_store(g, t);
  return REMAT_OK;
}

/* Adds an op node after shape inference; returns its output tensor. */
remat_tensor *graph_add_op(remat_graph *g, op_type type,
                           const remat_tensor *const *in,
                           int nin, const op_attrs *attrs) {
  const char *what = op_name(type);
  if (!building(g, what))
    return NULL;
  op_desc desc = {.type = type, .nin = nin};
  if (attrs != NULL)
    desc.attrs = *attrs;
  for (int i = 0; i < nin; i++) {
    if (!graph_tensor_ok(g, in[i], what))
      return NULL;
    desc.in[i] = in[i]->shape;
    /* in bf16 precision a parameter is read in bf16 (its bf16 copy, or a
     * frozen one's bf16 storage) unless the op reads it as f32; parameter
     * gradients are f32 */
    bool param = in[i]->kind == TENSOR_PARAM;
    desc.in_dtype[i] = param ? graph_param_read_dtype(g, type, i,
                                                      &in[i]->shape)
                             : in[i]->store;
    desc.din_dtype[i] = param || in[i]->store == OP_I32 ? OP_F32 : in[i]->store;
  }
  char err[OP_ERRMSG_MAX];
  remat_status s = op_infer(&desc, err);
  if (s != REMAT_OK) {
    graph_fail(g, s, "%s", err);
    return NULL;
  }
  if (g->nops == g->cap_ops) {
    int32_t cap = g->cap_ops ? 2 * g->cap_ops : 64;
    graph_op *ops = remat__realloc(g->ops, (size_t)cap * sizeof *ops);
    if (ops == NULL) {
      graph_fail(g, REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
      return NULL;
    }
    g->ops = ops;
    g->cap_ops = cap;
  }
  char name[REMAT__NAME_MAX];
  snprintf(name, sizeof name, "%s_%d", what, g->nops);
  if (!shape_fits(g, "output", name, &desc.out))
    return NULL;
  remat_tensor *out = new_tensor(g, TENSOR_ACT, &desc.out, OP_F32, name);
  if (out == NULL)
    return NULL;
  desc.out_dtype = out->store;
  graph_op *op = &g->ops[g->nops];
  memset(op, 0, sizeof *op);
  op->desc = desc;
  for (int i = 0; i < nin; i++)
    op->in[i] = in[i]->id;
  op->out = out->id;
  op->region = out->region;
  op->fused_from = -1;
  out->producer = g->nops++;
  for (int i = 0; i < nin; i++) /* an op that reads a frozen one in f32 */
    if (in[i]->kind == TENSOR_PARAM)
      g->tensors[in[i]->id]->store = graph_param_store(g, in[i]);
  return out;
}

int remat_tensor_ndim(const remat_tensor *t) {
  return t == NULL ? 0 : t->shape.ndim;
}

int64_t remat_tensor_dim(const remat_tensor *t, int i) {
  return t == NULL || i < 0 || i >= t->shape.ndim ? 0 : t->shape.dim[i];
}

int64_t remat_tensor_numel(const remat_tensor *t) {
  return t == NULL ? 0 : op_numel(&t->shape);
}

const char *remat_tensor_name(const remat_tensor *t) {
  return t == NULL ? "" : t->name;
}

remat_status remat_keep(remat_graph *g, remat_tensor *t) {
  if (!building(g, "remat_keep"))
    return g == NULL        ? REMAT_ERR_INVALID_ARG
           : g->compiled    ? REMAT_ERR_STATE
                            : g->status;
  if (!graph_tensor_ok(g, t, "remat_keep"))
    return g->status;
  t->keep = true;
  return REMAT_OK;
}

int remat_num_params(const remat_graph *g) {
  return g == NULL ? 0 : g->nparams;
}

remat_tensor *remat_param_at(const remat_graph *g, int i) {
  if (g == NULL || i < 0 || i >= g->nparams)
    return NULL;
  return g->tensors[g->params[i]];
}
