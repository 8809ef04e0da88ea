/* Compile, part one: plans every op, runs autodiff (which tensors get
 * gradients), applies the remat decision and lists the step's buffers and
 * kernel nodes in program order: forward, seed, backward with just-in-time
 * recompute per region, then parameter updates. deps.c turns the list into
 * the task DAG. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/plan.h"

static int32_t add_buffer(remat_step_plan *p, int64_t bytes,
                          remat_mem_category cat, bool persistent,
                          int32_t tensor) {
  if (p->nbufs == p->cap_bufs) {
    int32_t cap = p->cap_bufs ? 2 * p->cap_bufs : 256;
    plan_buffer *b = remat__realloc(p->bufs, (size_t)cap * sizeof *b);
    if (b == NULL)
      return -1;
    p->bufs = b;
    p->cap_bufs = cap;
  }
  plan_buffer *b = &p->bufs[p->nbufs];
  memset(b, 0, sizeof *b);
  b->bytes = bytes;
  b->cat = cat;
  b->persistent = persistent;
  b->tensor = tensor;
  return p->nbufs++;
}

static plan_knode *add_knode(remat_step_plan *p, knode_kind kind, int32_t op,
                             const op_kernel *k) {
  if (p->nknodes == p->cap_knodes) {
    int32_t cap = p->cap_knodes ? 2 * p->cap_knodes : 256;
    plan_knode *n = remat__realloc(p->knodes, (size_t)cap * sizeof *n);
    if (n == NULL)
      return NULL;
    p->knodes = n;
    p->cap_knodes = cap;
  }
  plan_knode *kn = &p->knodes[p->nknodes++];
  memset(kn, 0, sizeof *kn);
  kn->kind = kind;
  kn->op = op;
  kn->param = -1;
  kn->region = -1;
  kn->kernel = k;
  kn->tiles = k != NULL ? k->tiles : 1;
  kn->flops = k != NULL ? k->flops : 0.0;
  for (int i = 0; i < PLAN_SLOTS; i++)
    kn->slot_buf[i] = -1;
  if (op >= 0) {
    graph_op *gop = &p->g->ops[op];
    kn->inst = &gop->inst;
    kn->region = gop->region < 0 ? -1 : p->g->regions[gop->region].top;
  }
  return kn;
}

/* ---- autodiff: which tensors carry a gradient ---- */

/* A tensor gets a gradient buffer when it depends on a parameter and the
 * loss depends on it. */
static remat_status mark_gradients(remat_step_plan *p, bool *has_grad) {
  remat_graph *g = p->g;
  bool *depends = remat__calloc((size_t)g->ntensors, sizeof *depends);
  if (depends == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t t = 0; t < g->ntensors; t++)
    depends[t] = g->tensors[t]->kind == TENSOR_PARAM;
  for (int32_t o = 0; o < g->nops; o++)
    for (int i = 0; i < g->ops[o].desc.nin; i++)
      depends[g->ops[o].out] |= depends[g->ops[o].in[i]];
  memset(has_grad, 0, (size_t)g->ntensors * sizeof *has_grad);
  if (p->loss >= 0)
    has_grad[p->loss] = depends[p->loss];
  for (int32_t o = g->nops - 1; o >= 0; o--) {
    graph_op *op = &g->ops[o];
    if (!has_grad[op->out])
      continue;
    for (int i = 0; i < op->desc.nin; i++)
      if (depends[op->in[i]])
        has_grad[op->in[i]] = true;
  }
  free(depends);
  return REMAT_OK;
}

/* ---- buffers ---- */

static remat_mem_category value_category(const remat_tensor *t) {
  switch (t->kind) {
  case TENSOR_PARAM: return REMAT_MEM_PARAMS;
  case TENSOR_INPUT: return REMAT_MEM_WORKSPACE;
  default: return REMAT_MEM_ACTIVATIONS;
  }
}

static remat_status make_tensor_buffers(remat_step_plan *p,
                                        const bool *has_grad) {
  remat_graph *g = p->g;
  for (int32_t t = 0; t < g->ntensors; t++) {
    remat_tensor *x = g->tensors[t];
    bool persistent = x->kind != TENSOR_ACT || x->keep || t == p->loss;
    p->value_buf[t] =
        add_buffer(p, tensor_bytes(x), value_category(x), persistent, t);
    p->grad_buf[t] = -1;
    p->recomp_buf[t] = -1;
    if (p->value_buf[t] < 0)
      return REMAT_ERR_OUT_OF_MEMORY;
    if (!p->forward_only && has_grad[t]) {
      bool param = x->kind == TENSOR_PARAM;
      p->grad_buf[t] = add_buffer(
          p, tensor_bytes(x), param ? REMAT_MEM_GRADS : REMAT_MEM_ACT_GRADS,
          param, t);
      if (p->grad_buf[t] < 0)
        return REMAT_ERR_OUT_OF_MEMORY;
    }
  }
  return REMAT_OK;
}

/* The forward instance (recompute false) or the recomputed instance of op
 * o's output and aux buffers, created on first use. */
typedef struct op_buffers {
  int32_t aux[OP_MAX_AUX];
  int32_t raux[OP_MAX_AUX];
} op_buffers;

static remat_status make_aux(remat_step_plan *p, op_buffers *ob, int32_t o,
                             bool recompute) {
  const op_instance *inst = &p->g->ops[o].inst;
  int32_t *aux = recompute ? ob[o].raux : ob[o].aux;
  remat_mem_category cat =
      recompute ? REMAT_MEM_RECOMPUTED : REMAT_MEM_ACTIVATIONS;
  for (int k = 0; k < inst->naux; k++) {
    aux[k] = add_buffer(p, (int64_t)inst->aux_bytes[k], cat, false, -1);
    if (aux[k] < 0)
      return REMAT_ERR_OUT_OF_MEMORY;
  }
  return REMAT_OK;
}

/* ---- forward ---- */

static remat_status emit_forward_kernels(remat_step_plan *p, op_buffers *ob,
                                         int32_t o, bool recompute) {
  remat_graph *g = p->g;
  graph_op *op = &g->ops[o];
  for (int k = 0; k < op->inst.nfwd; k++) {
    const op_kernel *kern = &op->inst.fwd[k];
    plan_knode *kn = add_knode(p, recompute ? KNODE_RECOMPUTE : KNODE_FORWARD,
                               o, kern);
    if (kn == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < op->desc.nin; i++) {
      int32_t t = op->in[i];
      bool use_recomputed = recompute && !p->saved[t];
      kn->slot_buf[plan_slot(OP_SLOT_IN(i))] =
          use_recomputed ? p->recomp_buf[t] : p->value_buf[t];
    }
    kn->slot_buf[plan_slot(OP_SLOT_OUT)] =
        recompute ? p->recomp_buf[op->out] : p->value_buf[op->out];
    for (int a = 0; a < op->inst.naux; a++)
      kn->slot_buf[plan_slot(OP_SLOT_AUX(a))] =
          recompute ? ob[o].raux[a] : ob[o].aux[a];
  }
  return REMAT_OK;
}

/* ---- recompute: which forward tensors backward needs again ---- */

static bool is_recomputed(const remat_step_plan *p, int32_t t) {
  return !p->saved[t];
}

/* Marks op outputs that backward kernels read and that are not saved, then
 * closes over the forward inputs their recomputation reads. */
static void mark_needed(remat_step_plan *p, const bool *has_grad,
                        bool *needed) {
  remat_graph *g = p->g;
  for (int32_t o = g->nops - 1; o >= 0; o--) {
    graph_op *op = &g->ops[o];
    if (!has_grad[op->out])
      continue;
    for (int k = 0; k < op->inst.nbwd; k++) {
      uint32_t r = op->inst.bwd[k].reads;
      for (int i = 0; i < op->desc.nin; i++)
        if ((r & OP_SLOT_IN(i)) && is_recomputed(p, op->in[i]))
          needed[op->in[i]] = true;
      if ((r & (OP_SLOT_OUT | OP_SLOT_AUX(0) | OP_SLOT_AUX(1))) &&
          is_recomputed(p, op->out))
        needed[op->out] = true;
    }
  }
  for (int32_t o = g->nops - 1; o >= 0; o--) {
    graph_op *op = &g->ops[o];
    if (!needed[op->out])
      continue;
    for (int k = 0; k < op->inst.nfwd; k++)
      for (int i = 0; i < op->desc.nin; i++)
        if ((op->inst.fwd[k].reads & OP_SLOT_IN(i)) &&
            is_recomputed(p, op->in[i]))
          needed[op->in[i]] = true;
  }
}

static remat_status emit_region_recompute(remat_step_plan *p, op_buffers *ob,
                                          const bool *needed, int32_t top) {
  remat_graph *g = p->g;
  for (int32_t o = 0; o < g->nops; o++) {
    graph_op *op = &g->ops[o];
    if (op->region < 0 || g->regions[op->region].top != top ||
        !needed[op->out])
      continue;
    p->recomp_buf[op->out] = add_buffer(p, tensor_bytes(g->tensors[op->out]),
                                        REMAT_MEM_RECOMPUTED, false, op->out);
    if (p->recomp_buf[op->out] < 0)
      return REMAT_ERR_OUT_OF_MEMORY;
    remat_status s = make_aux(p, ob, o, true);
    if (s == REMAT_OK)
      s = emit_forward_kernels(p, ob, o, true);
    if (s != REMAT_OK)
      return s;
  }
  return REMAT_OK;
}

/* ---- backward ---- */

/* Skip a kernel whose only results are gradients nobody needs. */
static bool kernel_needed(const op_kernel *k, const int32_t *din_buf) {
  if ((k->writes & PLAN_DIN_SLOTS) == 0 || (k->writes & ~PLAN_DIN_SLOTS) != 0)
    return true;
  for (int i = 0; i < OP_MAX_IN; i++)
    if ((k->writes & OP_SLOT_DIN(i)) && din_buf[i] >= 0)
      return true;
  return false;
}

static remat_status emit_backward_op(remat_step_plan *p, op_buffers *ob,
                                     int32_t o) {
  remat_graph *g = p->g;
  graph_op *op = &g->ops[o];
  int32_t din_buf[OP_MAX_IN] = {-1, -1, -1};
  bool any = false;
  for (int i = 0; i < op->desc.nin; i++) {
    din_buf[i] = p->grad_buf[op->in[i]];
    any |= din_buf[i] >= 0;
  }
  if (!any)
    return REMAT_OK;
  int32_t ws[OP_MAX_WS];
  for (int w = 0; w < op->inst.nws; w++) {
    ws[w] = add_buffer(p, (int64_t)op->inst.ws_bytes[w], REMAT_MEM_WORKSPACE,
                       false, -1);
    if (ws[w] < 0)
      return REMAT_ERR_OUT_OF_MEMORY;
  }
  bool out_recomputed = is_recomputed(p, op->out);
  for (int k = 0; k < op->inst.nbwd; k++) {
    const op_kernel *kern = &op->inst.bwd[k];
    if (!kernel_needed(kern, din_buf))
      continue;
    plan_knode *kn = add_knode(p, KNODE_BACKWARD, o, kern);
    if (kn == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < op->desc.nin; i++) {
      int32_t t = op->in[i];
      if (kern->reads & OP_SLOT_IN(i))
        kn->slot_buf[plan_slot(OP_SLOT_IN(i))] =
            is_recomputed(p, t) ? p->recomp_buf[t] : p->value_buf[t];
      if (kern->writes & OP_SLOT_DIN(i))
        kn->slot_buf[plan_slot(OP_SLOT_DIN(i))] = din_buf[i];
    }
    if (kern->reads & OP_SLOT_OUT)
      kn->slot_buf[plan_slot(OP_SLOT_OUT)] =
          out_recomputed ? p->recomp_buf[op->out] : p->value_buf[op->out];
    for (int a = 0; a < op->inst.naux; a++)
      if (kern->reads & OP_SLOT_AUX(a))
        kn->slot_buf[plan_slot(OP_SLOT_AUX(a))] =
            out_recomputed ? ob[o].raux[a] : ob[o].aux[a];
    if (kern->reads & OP_SLOT_DOUT)
      kn->slot_buf[plan_slot(OP_SLOT_DOUT)] = p->grad_buf[op->out];
    for (int w = 0; w < op->inst.nws; w++)
      if ((kern->reads | kern->writes) & OP_SLOT_WS(w))
        kn->slot_buf[plan_slot(OP_SLOT_WS(w))] = ws[w];
  }
  return REMAT_OK;
}

static remat_status emit_backward(remat_step_plan *p, op_buffers *ob,
                                  const bool *has_grad, const bool *needed) {
  remat_graph *g = p->g;
  if (p->grad_buf[p->loss] < 0)
    return REMAT_OK; /* the loss depends on no parameter */
  plan_knode *seed = add_knode(p, KNODE_SEED, -1, NULL);
  if (seed == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  seed->slot_buf[plan_slot(OP_SLOT_OUT)] = p->grad_buf[p->loss];
  seed->slot_buf[plan_slot(OP_SLOT_IN(0))] = p->value_buf[p->loss];
  int32_t current_top = -2;
  for (int32_t o = g->nops - 1; o >= 0; o--) {
    graph_op *op = &g->ops[o];
    if (!has_grad[op->out])
      continue;
    int32_t top = op->region < 0 ? -1 : g->regions[op->region].top;
    remat_status s;
    if (top != current_top && top >= 0 &&
        (s = emit_region_recompute(p, ob, needed, top)) != REMAT_OK)
      return s;
    current_top = top;
    if ((s = emit_backward_op(p, ob, o)) != REMAT_OK)
      return s;
  }
  return REMAT_OK;
}

/* ---- updates ---- */

/* Per parameter a finite check of its gradient (as soon as it is final),
 * one gate after all checks, then the updates: a NaN or Inf anywhere in the
 * gradients or the loss skips every update, so none is half-applied. */
static remat_status emit_updates(remat_step_plan *p) {
  remat_graph *g = p->g;
  for (int kind = KNODE_CHECK; kind <= KNODE_UPDATE; kind++) {
    if (kind == KNODE_GATE) {
      if (add_knode(p, KNODE_GATE, -1, NULL) == NULL)
        return REMAT_ERR_OUT_OF_MEMORY;
      continue;
    }
    for (int32_t t = 0; t < g->ntensors; t++) {
      remat_tensor *x = g->tensors[t];
      if (x->kind != TENSOR_PARAM || p->grad_buf[t] < 0)
        continue;
      plan_knode *kn = add_knode(p, (knode_kind)kind, -1, NULL);
      if (kn == NULL)
        return REMAT_ERR_OUT_OF_MEMORY;
      kn->param = t;
      kn->tiles = optim_tiles(op_numel(&x->shape));
      kn->slot_buf[plan_slot(OP_SLOT_DOUT)] = p->grad_buf[t];
      if (kind == KNODE_CHECK)
        continue;
      kn->slot_buf[plan_slot(OP_SLOT_IN(0))] = p->value_buf[t];
      for (int k = 0; k < 2 && p->opt.kind == REMAT_OPT_ADAMW; k++) {
        int32_t b = add_buffer(p, tensor_bytes(x), REMAT_MEM_OPTIMIZER, true, -1);
        if (b < 0)
          return REMAT_ERR_OUT_OF_MEMORY;
        kn->slot_buf[plan_slot(OP_SLOT_AUX(k))] = b;
      }
    }
  }
  return REMAT_OK;
}

/* ---- the pipeline ---- */

static remat_status plan_ops(remat_graph *g) {
  char err[OP_ERRMSG_MAX];
  for (int32_t o = 0; o < g->nops; o++) {
    remat_status s = op_plan(&g->ops[o].desc, g->rt->engine, &g->ops[o].inst,
                             err);
    if (s != REMAT_OK)
      return graph_fail(g, s, "%s", err);
    g->ops[o].planned = true;
  }
  return REMAT_OK;
}

remat_status plan_lower(remat_step_plan *p) {
  remat_graph *g = p->g;
  size_t n = (size_t)g->ntensors;
  bool *has_grad = remat__calloc(n, sizeof *has_grad);
  bool *needed = remat__calloc(n, sizeof *needed);
  op_buffers *ob = remat__calloc((size_t)g->nops + 1, sizeof *ob);
  remat_status s = REMAT_ERR_OUT_OF_MEMORY;
  if (has_grad == NULL || needed == NULL || ob == NULL)
    goto out;
  if ((s = mark_gradients(p, has_grad)) != REMAT_OK ||
      (s = make_tensor_buffers(p, has_grad)) != REMAT_OK)
    goto out;
  for (int32_t o = 0; o < g->nops && s == REMAT_OK; o++)
    s = make_aux(p, ob, o, false);
  for (int32_t o = 0; o < g->nops && s == REMAT_OK; o++)
    s = emit_forward_kernels(p, ob, o, false);
  if (s != REMAT_OK || p->forward_only)
    goto out;
  mark_needed(p, has_grad, needed);
  if ((s = emit_backward(p, ob, has_grad, needed)) == REMAT_OK && p->has_opt)
    s = emit_updates(p);
out:
  free(has_grad);
  free(needed);
  free(ob);
  return s == REMAT_OK ? plan_lifetimes(p) : s;
}

void plan_unlower(remat_step_plan *p) {
  for (int32_t i = 0; i < p->nknodes; i++) {
    free(p->knodes[i].touch);
    free(p->knodes[i].init);
  }
  p->nknodes = 0;
  p->nbufs = 0;
  p->flops = 0.0;
  p->recompute_flops = 0.0;
}

static remat_status check_compile_args(remat_graph *g, remat_tensor *loss,
                                       const remat_optimizer *opt) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_compile: graph is NULL");
  if (g->status != REMAT_OK)
    return remat__fail_msg(g->status, g->error);
  if (g->compiled)
    return remat__fail(REMAT_ERR_STATE,
                       "remat_compile: the graph is already compiled");
  if (g->region_depth != 0)
    return graph_fail(g, REMAT_ERR_STATE,
                      "remat_compile: %d checkpoint region(s) still open: "
                      "call remat_region_end for each remat_region_begin",
                      g->region_depth);
  if (loss != NULL) {
    if (!graph_tensor_ok(g, loss, "remat_compile"))
      return g->status;
    if (loss->kind != TENSOR_ACT || op_numel(&loss->shape) != 1)
      return graph_fail(g, REMAT_ERR_SHAPE,
                        "remat_compile: the loss '%s' must be an op result "
                        "with one element",
                        loss->name);
  }
  if (opt != NULL) {
    bool ok = (opt->kind == REMAT_OPT_SGD || opt->kind == REMAT_OPT_ADAMW) &&
              isfinite(opt->lr) && opt->lr > 0.0f && opt->beta1 >= 0.0f &&
              opt->beta1 < 1.0f && opt->beta2 >= 0.0f && opt->beta2 < 1.0f &&
              opt->eps >= 0.0f && opt->weight_decay >= 0.0f &&
              isfinite(opt->weight_decay);
    if (!ok)
      return graph_fail(g, REMAT_ERR_INVALID_ARG,
                        "remat_compile: optimizer is not valid: expected kind "
                        "REMAT_OPT_SGD or REMAT_OPT_ADAMW, lr > 0, betas in "
                        "[0,1), eps >= 0, weight_decay >= 0");
  }
  return REMAT_OK;
}

static remat_status alloc_plan_arrays(remat_step_plan *p) {
  size_t n = (size_t)p->g->ntensors;
  p->value_buf = remat__malloc(n * sizeof *p->value_buf);
  p->grad_buf = remat__malloc(n * sizeof *p->grad_buf);
  p->recomp_buf = remat__malloc(n * sizeof *p->recomp_buf);
  p->saved = remat__malloc(n * sizeof *p->saved);
  if (!p->value_buf || !p->grad_buf || !p->recomp_buf || !p->saved)
    return REMAT_ERR_OUT_OF_MEMORY;
  return REMAT_OK;
}

remat_status plan_allocate_persistent(remat_step_plan *p); /* exec.c */

remat_status remat_compile(remat_graph *g, remat_tensor *loss,
                           const remat_optimizer *opt) {
  remat_status s = check_compile_args(g, loss, opt);
  if (s != REMAT_OK)
    return s;
  remat_step_plan *p = remat__calloc(1, sizeof *p);
  if (p == NULL)
    return graph_fail(g, REMAT_ERR_OUT_OF_MEMORY, "remat_compile: out of memory");
  g->plan = p;
  p->g = g;
  p->loss = loss != NULL ? loss->id : -1;
  p->forward_only = loss == NULL;
  p->has_opt = opt != NULL && loss != NULL;
  if (p->has_opt) {
    p->opt = *opt;
    if (p->opt.beta1 == 0.0f && p->opt.beta2 == 0.0f) {
      p->opt.beta1 = 0.9f;
      p->opt.beta2 = 0.999f;
    }
    if (p->opt.eps == 0.0f)
      p->opt.eps = 1e-8f;
  }
  const sched_placement *pl = sched_pool_placement(g->rt->pool);
  s = mem_arena_init(&p->arena, g->rt->topo, pl->nnodes);
  if (s == REMAT_OK)
    s = plan_ops(g);
  if (s == REMAT_OK)
    s = alloc_plan_arrays(p);
  if (s == REMAT_OK)
    s = planner_run(p);
  if (s == REMAT_OK)
    s = plan_build_dag(p);
  if (s == REMAT_OK)
    s = plan_allocate_persistent(p);
  if (s == REMAT_OK)
    s = memplan_predict(p);
  if (s == REMAT_OK)
    s = plan_report(p);
  if (s != REMAT_OK) {
    if (g->status == REMAT_OK)
      graph_fail(g, s, "remat_compile: %s",
                 s == REMAT_ERR_OUT_OF_MEMORY ? "out of memory"
                                              : remat_last_error());
    plan_destroy(g);
    return g->status;
  }
  g->compiled = true;
  return REMAT_OK;
}
