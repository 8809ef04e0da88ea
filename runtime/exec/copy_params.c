/* remat_copy_params: every parameter value of one compiled graph copied
 * into another built with the same parameters (a server's inference graph
 * taking the weights that a training graph has learned). All or nothing:
 * the parameter lists are compared whole before a byte is copied. */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "runtime/exec/node_copies.h"
#include "runtime/exec/step_state.h"
#include "runtime/internal.h"

#define WHAT "remat_copy_params"

/* "[2, 3]": a shape for a message. */
static const char *shape_text(const remat_tensor *t, char *buf, size_t n) {
  size_t at = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->shape.ndim && at < n; i++)
    at += (size_t)snprintf(buf + at, n - at, "%s%lld", i ? ", " : "",
                           (long long)t->shape.dim[i]);
  if (at < n)
    snprintf(buf + at, n - at, "]");
  return buf;
}

static const char *dtype_text(const remat_tensor *t) {
  return t->dtype == OP_F32 ? "f32" : t->dtype == OP_I32 ? "i32" : "bf16";
}

static bool same_param(const remat_tensor *a, const remat_tensor *b) {
  return strcmp(a->name, b->name) == 0 && a->dtype == b->dtype &&
         a->shape.ndim == b->shape.ndim &&
         memcmp(a->shape.dim, b->shape.dim,
                (size_t)a->shape.ndim * sizeof a->shape.dim[0]) == 0;
}

/* "parameter 3 'w' f32 [4, 2]", or "no parameter 3" past the end. */
static void describe(const remat_graph *g, int i, char *buf, size_t n) {
  const remat_tensor *t = remat_param_at(g, i);
  char shape[96];
  if (t == NULL)
    snprintf(buf, n, "no parameter %d", i);
  else
    snprintf(buf, n, "parameter %d '%s' %s %s", i,
             remat__quote(&(remat__quoted){0}, t->name), dtype_text(t),
             shape_text(t, shape, sizeof shape));
}

/* REMAT_OK when dst and src have the same parameters in the same order;
 * else a message naming the first that differs. */
static remat_status check_params(const remat_graph *dst,
                                 const remat_graph *src) {
  int nd = remat_num_params(dst), ns = remat_num_params(src);
  for (int i = 0; i < nd || i < ns; i++) {
    const remat_tensor *d = remat_param_at(dst, i), *s = remat_param_at(src, i);
    if (d != NULL && s != NULL && same_param(d, s))
      continue;
    char in_dst[200], in_src[200];
    describe(dst, i, in_dst, sizeof in_dst);
    describe(src, i, in_src, sizeof in_src);
    return remat__fail(REMAT_ERR_SHAPE,
                       WHAT ": dst has %s, src has %s (dst %d parameters, src "
                       "%d): the graphs must have the same parameters (names, "
                       "dtypes and shapes) in the same order; nothing was "
                       "copied",
                       in_dst, in_src, nd, ns);
  }
  return REMAT_OK;
}

/* Enters g as a step does: compiled, not after fork(), no call inside. */
static remat_status enter(remat_graph *g, const char *which) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, WHAT ": %s is NULL", which);
  remat_status s = runtime_check_fork(g->rt, WHAT);
  if (s != REMAT_OK)
    return s;
  if (!g->compiled)
    return remat__fail(REMAT_ERR_STATE,
                       WHAT ": %s is not compiled: call remat_compile on both "
                       "graphs first",
                       which);
  return graph_enter(g, WHAT);
}

static void copy_all(remat_graph *dst, const remat_graph *src) {
  const compiled_step *dc = &dst->step->compiled, *sc = &src->step->compiled;
  step_state *ds = &dst->step->state;
  const step_state *ss = &src->step->state;
  for (int i = 0; i < remat_num_params(dst); i++) {
    const remat_tensor *d = remat_param_at(dst, i), *s = remat_param_at(src, i);
    int32_t db = dc->low.value_buf[d->id], sb = sc->low.value_buf[s->id];
    int64_t n = remat_tensor_numel(d);
    memcpy(ds->data[db], ss->data[sb], (size_t)n * sizeof(float));
    node_copies_refresh(dc, ds, db, 0, 0, n);
  }
  ds->params_written = true; /* bf16 copies: before dst's next step */
}

remat_status remat_copy_params(remat_graph *dst, remat_graph *src) {
  if (dst != NULL && dst == src)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       WHAT ": dst and src are the same graph");
  remat_status s = enter(dst, "dst");
  if (s != REMAT_OK)
    return s;
  s = enter(src, "src");
  if (s == REMAT_OK) {
    s = check_params(dst, src);
    if (s == REMAT_OK)
      copy_all(dst, src);
    graph_leave(src);
  }
  graph_leave(dst);
  return s;
}
