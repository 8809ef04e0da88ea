/* Stage "lower with autodiff" (lowering.h): decides which tensors carry a
 * gradient, applies the remat decision and lists the step's buffers and
 * kernel nodes in program order: forward, seed, backward with just-in-time
 * recompute per region, finite checks, the gate, then parameter updates.
 * It reads the graph and the decision and writes only its output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/lowering.h"
#include "runtime/compile/optim_tiles.h"

/* The request being lowered and the lowering being built. */
typedef struct lower_ctx {
  const lower_request *req;
  const remat_graph *g;
  plan_lowering *l;
  /* [ntensors] the decision, less the linear outputs that fused kernels
   * never store (plan_fused) */
  bool *saved;
  /* [nops] per consumer op: the linear whose fused kernel computes its
   * output in the forward pass (fuse_fwd) and in recompute (fuse_rec), -1
   * none; per linear: whether that fused kernel replaces its own forward
   * kernels (skip_fwd, skip_rec) */
  int32_t *fuse_fwd, *fuse_rec;
  bool *skip_fwd, *skip_rec;
} lower_ctx;

static int32_t add_buffer_dt(lower_ctx *p, int64_t bytes, op_dtype dtype,
                             remat_mem_category cat, bool persistent,
                             int32_t tensor) {
  if (p->l->nbufs == p->l->cap_bufs) {
    int32_t cap = p->l->cap_bufs ? 2 * p->l->cap_bufs : 256;
    plan_buffer *b = remat__realloc(p->l->bufs, (size_t)cap * sizeof *b);
    if (b == NULL)
      return -1;
    p->l->bufs = b;
    p->l->cap_bufs = cap;
  }
  plan_buffer *b = &p->l->bufs[p->l->nbufs];
  memset(b, 0, sizeof *b);
  b->bytes = bytes;
  b->dtype = dtype;
  b->cat = cat;
  b->persistent = persistent;
  b->tensor = tensor;
  return p->l->nbufs++;
}

/* An f32 buffer (aux, workspace, moments) or one of a tensor's. */
static int32_t add_buffer(lower_ctx *p, int64_t bytes,
                          remat_mem_category cat, bool persistent,
                          int32_t tensor) {
  return add_buffer_dt(p, bytes, OP_F32, cat, persistent, tensor);
}

static plan_knode *add_knode(lower_ctx *p, knode_kind kind, int32_t op,
                             const op_kernel *k) {
  if (p->l->nknodes == p->l->cap_knodes) {
    int32_t cap = p->l->cap_knodes ? 2 * p->l->cap_knodes : 256;
    plan_knode *n = remat__realloc(p->l->knodes, (size_t)cap * sizeof *n);
    if (n == NULL)
      return NULL;
    p->l->knodes = n;
    p->l->cap_knodes = cap;
  }
  plan_knode *kn = &p->l->knodes[p->l->nknodes++];
  memset(kn, 0, sizeof *kn);
  kn->kind = kind;
  kn->op = op;
  kn->region = -1;
  kn->seed = (knode_seed_bufs){-1, -1};
  kn->optim = (knode_optim_bufs){-1, -1, -1, -1, -1, -1, 0};
  kn->kernel = k;
  kn->tiles = k != NULL ? k->tiles : 1;
  kn->flops = k != NULL ? k->flops : 0.0;
  for (int i = 0; i < PLAN_SLOTS; i++)
    kn->slot_buf[i] = -1;
  if (op >= 0) {
    const graph_op *gop = &p->g->ops[op];
    kn->inst = &gop->inst;
    kn->region = gop->region < 0 ? -1 : p->g->regions[gop->region].top;
  }
  return kn;
}

/* ---- autodiff: which tensors carry a gradient ---- */

/* A tensor gets a gradient buffer when it depends on a trainable (not
 * frozen) parameter and the loss depends on it: a frozen parameter gets
 * none, and so no kernel that only computes its gradient is lowered (a
 * linear whose weight is frozen keeps only its dX kernel). */
static remat_status mark_gradients(lower_ctx *p, bool *has_grad) {
  const remat_graph *g = p->g;
  bool *depends = remat__calloc((size_t)g->ntensors, sizeof *depends);
  if (depends == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t t = 0; t < g->ntensors; t++) {
    const remat_tensor *x = g->tensors[t];
    depends[t] = x->kind == TENSOR_PARAM && !x->frozen;
  }
  for (int32_t o = 0; o < g->nops; o++)
    for (int i = 0; i < g->ops[o].desc.nin; i++)
      depends[g->ops[o].out] |= depends[g->ops[o].in[i]];
  memset(has_grad, 0, (size_t)g->ntensors * sizeof *has_grad);
  if (p->req->loss >= 0)
    has_grad[p->req->loss] = depends[p->req->loss];
  for (int32_t o = g->nops - 1; o >= 0; o--) {
    const graph_op *op = &g->ops[o];
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

/* Value buffers (of the tensor's storage type), gradients (f32 for
 * parameters, the storage type for activations), and the bf16 copies of
 * parameters stored in f32 (persistent, counted as parameters, replicated
 * per node as parameters are; a frozen parameter stored in bf16 is read
 * as it is). */
static remat_status make_tensor_buffers(lower_ctx *p,
                                        const bool *has_grad) {
  const remat_graph *g = p->g;
  /* copy_buf[t] is first 1 for an f32 parameter some op reads in bf16 */
  for (int32_t t = 0; t < g->ntensors; t++)
    p->l->copy_buf[t] = 0;
  for (int32_t o = 0; o < g->nops; o++)
    for (int i = 0; i < g->ops[o].desc.nin; i++)
      if (g->ops[o].desc.in_dtype[i] == OP_BF16 &&
          g->tensors[g->ops[o].in[i]]->kind == TENSOR_PARAM &&
          g->tensors[g->ops[o].in[i]]->store == OP_F32)
        p->l->copy_buf[g->ops[o].in[i]] = 1;
  for (int32_t t = 0; t < g->ntensors; t++) {
    const remat_tensor *x = g->tensors[t];
    bool persistent = x->kind != TENSOR_ACT || x->keep || t == p->req->loss;
    bool param = x->kind == TENSOR_PARAM;
    bool copied = p->l->copy_buf[t] == 1;
    p->l->value_buf[t] = add_buffer_dt(p, tensor_store_bytes(x), x->store,
                                       value_category(x), persistent, t);
    p->l->grad_buf[t] = -1;
    p->l->recomp_buf[t] = -1;
    p->l->copy_buf[t] = -1;
    if (p->l->value_buf[t] < 0)
      return REMAT_ERR_OUT_OF_MEMORY;
    if (!(p->req->loss < 0) && has_grad[t]) {
      p->l->grad_buf[t] = add_buffer_dt(
          p, tensor_store_bytes(x), x->store,
          param ? REMAT_MEM_GRADS : REMAT_MEM_ACT_GRADS, param, t);
      if (p->l->grad_buf[t] < 0)
        return REMAT_ERR_OUT_OF_MEMORY;
    }
    if (copied) {
      p->l->copy_buf[t] = add_buffer_dt(p, op_numel(&x->shape) * 2, OP_BF16,
                                        REMAT_MEM_PARAMS, true, t);
      if (p->l->copy_buf[t] < 0)
        return REMAT_ERR_OUT_OF_MEMORY;
    }
  }
  return REMAT_OK;
}

/* The buffer input i of op `op` reads: a parameter's bf16 copy when the
 * op reads it in bf16, else the recomputed buffer (use_recomputed) or the
 * value. */
static int32_t input_buf(const lower_ctx *p, const graph_op *op, int i,
                         bool use_recomputed) {
  int32_t t = op->in[i];
  if (p->l->copy_buf[t] >= 0 && op->desc.in_dtype[i] == OP_BF16)
    return p->l->copy_buf[t];
  return use_recomputed ? p->l->recomp_buf[t] : p->l->value_buf[t];
}

/* The forward instance (recompute false) or the recomputed instance of op
 * o's output and aux buffers, created on first use. */
typedef struct op_buffers {
  int32_t aux[OP_MAX_AUX];
  int32_t raux[OP_MAX_AUX];
} op_buffers;

static remat_status make_aux(lower_ctx *p, op_buffers *ob, int32_t o,
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

/* The fused kernel of linear `lin` that computes op o's output: the
 * linear's inputs, o's other input (an add's addend) in slot 3, o's
 * output. Named after o's output (task names), run on the linear. */
static remat_status emit_fused_kernel(lower_ctx *p, int32_t o, int32_t lin,
                                      bool recompute) {
  const graph_op *op = &p->g->ops[o], *lop = &p->g->ops[lin];
  plan_knode *kn = add_knode(p, recompute ? KNODE_RECOMPUTE : KNODE_FORWARD,
                             o, &lop->inst.fused);
  if (kn == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  kn->inst = &lop->inst;
  for (int i = 0; i < lop->desc.nin; i++)
    kn->slot_buf[plan_slot(OP_SLOT_IN(i))] =
        input_buf(p, lop, i, recompute && !p->saved[lop->in[i]]);
  if (lop->inst.fused.reads & OP_SLOT_IN(3)) {
    int k = 1 - op->fused_in;
    kn->slot_buf[plan_slot(OP_SLOT_IN(3))] =
        input_buf(p, op, k, recompute && !p->saved[op->in[k]]);
  }
  kn->slot_buf[plan_slot(OP_SLOT_OUT)] =
      recompute ? p->l->recomp_buf[op->out] : p->l->value_buf[op->out];
  return REMAT_OK;
}

static remat_status emit_forward_kernels(lower_ctx *p, op_buffers *ob,
                                         int32_t o, bool recompute) {
  const remat_graph *g = p->g;
  const graph_op *op = &g->ops[o];
  if (recompute ? p->skip_rec[o] : p->skip_fwd[o])
    return REMAT_OK; /* its consumer's fused kernel runs it */
  int32_t lin = recompute ? p->fuse_rec[o] : p->fuse_fwd[o];
  if (lin >= 0)
    return emit_fused_kernel(p, o, lin, recompute);
  for (int k = 0; k < op->inst.nfwd; k++) {
    const op_kernel *kern = &op->inst.fwd[k];
    plan_knode *kn = add_knode(p, recompute ? KNODE_RECOMPUTE : KNODE_FORWARD,
                               o, kern);
    if (kn == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < op->desc.nin; i++) {
      int32_t t = op->in[i];
      kn->slot_buf[plan_slot(OP_SLOT_IN(i))] =
          input_buf(p, op, i, recompute && !p->saved[t]);
    }
    kn->slot_buf[plan_slot(OP_SLOT_OUT)] =
        recompute ? p->l->recomp_buf[op->out] : p->l->value_buf[op->out];
    for (int a = 0; a < op->inst.naux; a++)
      kn->slot_buf[plan_slot(OP_SLOT_AUX(a))] =
          recompute ? ob[o].raux[a] : ob[o].aux[a];
  }
  return REMAT_OK;
}

/* ---- fused epilogues ---- */

/* Where the fused kernels of plan_fusions run under this decision. A
 * linear output that no backward kernel reads (an add's addend) is never
 * stored: the fused kernel runs in the forward pass and in recompute, and
 * the output counts as not saved. One that backward reads (gelu's input)
 * fuses in the forward pass only when it is recomputed anyway; recompute
 * then runs the linear and the gelu apart, since backward needs both. */
static void plan_fused(lower_ctx *p, const bool *has_grad) {
  const remat_graph *g = p->g;
  for (int32_t o = 0; o < g->nops; o++) {
    p->fuse_fwd[o] = p->fuse_rec[o] = -1;
    p->skip_fwd[o] = p->skip_rec[o] = false;
  }
  for (int32_t c = 0; c < g->nops; c++) {
    const graph_op *op = &g->ops[c];
    int32_t lin = op->fused_from;
    if (lin < 0)
      continue;
    int32_t t = op->in[op->fused_in];
    bool reads = false; /* does a backward kernel read t? */
    if (p->req->loss >= 0 && has_grad[op->out]) {
      for (int k = 0; k < op->inst.nbwd; k++)
        reads |= (op->inst.bwd[k].reads & OP_SLOT_IN(op->fused_in)) != 0;
      for (int k = 0; k < g->ops[lin].inst.nbwd; k++)
        reads |= (g->ops[lin].inst.bwd[k].reads & OP_SLOT_OUT) != 0;
    }
    if (!reads) {
      p->fuse_fwd[c] = p->fuse_rec[c] = lin;
      p->skip_fwd[lin] = p->skip_rec[lin] = true;
      p->saved[t] = false;
    } else if (!p->saved[t]) {
      p->fuse_fwd[c] = lin;
      p->skip_fwd[lin] = true;
    }
  }
}

/* ---- recompute: which forward tensors backward needs again ---- */

static bool is_recomputed(const lower_ctx *p, int32_t t) {
  return !p->saved[t];
}

/* Marks op outputs that backward kernels read and that are not saved, then
 * closes over the forward inputs their recomputation reads. */
static void mark_needed(lower_ctx *p, const bool *has_grad,
                        bool *needed) {
  const remat_graph *g = p->g;
  for (int32_t o = g->nops - 1; o >= 0; o--) {
    const graph_op *op = &g->ops[o];
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
    const graph_op *op = &g->ops[o];
    if (!needed[op->out])
      continue;
    for (int k = 0; k < op->inst.nfwd; k++)
      for (int i = 0; i < op->desc.nin; i++)
        if ((op->inst.fwd[k].reads & OP_SLOT_IN(i)) &&
            is_recomputed(p, op->in[i]))
          needed[op->in[i]] = true;
  }
}

/* The ops of each top-level region, in program order: ops[start[r]] to
 * ops[start[r + 1] - 1] for region r (a counting sort, O(ops + regions)),
 * so that recompute visits a region's ops, not every op per region. */
typedef struct ops_by_top {
  int32_t *start; /* [nregions + 1] */
  int32_t *ops;   /* [nops] */
} ops_by_top;

static remat_status index_ops_by_top(const remat_graph *g, ops_by_top *x) {
  x->start = remat__calloc((size_t)g->nregions + 2, sizeof *x->start);
  x->ops = remat__malloc(((size_t)g->nops + 1) * sizeof *x->ops);
  if (x->start == NULL || x->ops == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t o = 0; o < g->nops; o++)
    if (g->ops[o].region >= 0)
      x->start[g->regions[g->ops[o].region].top + 1]++;
  for (int32_t r = 0; r < g->nregions; r++)
    x->start[r + 1] += x->start[r];
  for (int32_t o = 0; o < g->nops; o++) /* start[r] moves to start[r + 1] */
    if (g->ops[o].region >= 0)
      x->ops[x->start[g->regions[g->ops[o].region].top]++] = o;
  for (int32_t r = g->nregions; r > 0; r--) /* and back */
    x->start[r] = x->start[r - 1];
  x->start[0] = 0;
  return REMAT_OK;
}

static remat_status emit_region_recompute(lower_ctx *p, op_buffers *ob,
                                          const bool *needed,
                                          const ops_by_top *by_top,
                                          int32_t top) {
  const remat_graph *g = p->g;
  for (int32_t k = by_top->start[top]; k < by_top->start[top + 1]; k++) {
    int32_t o = by_top->ops[k];
    const graph_op *op = &g->ops[o];
    if (!needed[op->out] || p->skip_rec[o])
      continue;
    const remat_tensor *x = g->tensors[op->out];
    p->l->recomp_buf[op->out] = add_buffer_dt(
        p, tensor_store_bytes(x), x->store, REMAT_MEM_RECOMPUTED, false,
        op->out);
    if (p->l->recomp_buf[op->out] < 0)
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

/* The backward kernels of op `o` that are lowered: those kernel_needed
 * keeps, and a kernel that writes only workspace (partial sums, such as a
 * chunked linear's partial weight gradients) when a later kernel that is
 * lowered reads that workspace, so that a frozen weight's partials are not
 * computed for a sum that never runs. */
static void backward_needed(const graph_op *op, const int32_t *din_buf,
                            bool *need) {
  uint32_t ws_all = 0, ws_read = 0;
  for (int w = 0; w < OP_MAX_WS; w++)
    ws_all |= OP_SLOT_WS(w);
  for (int k = op->inst.nbwd - 1; k >= 0; k--) {
    const op_kernel *kern = &op->inst.bwd[k];
    bool partials = (kern->writes & ws_all) != 0 &&
                    (kern->writes & ~ws_all) == 0;
    need[k] = partials ? (kern->writes & ws_read) != 0
                       : kernel_needed(kern, din_buf);
    if (need[k])
      ws_read |= kern->reads & ws_all;
  }
}

static remat_status emit_backward_op(lower_ctx *p, op_buffers *ob,
                                     int32_t o) {
  const remat_graph *g = p->g;
  const graph_op *op = &g->ops[o];
  int32_t din_buf[OP_MAX_IN] = {-1, -1, -1, -1};
  bool any = false;
  for (int i = 0; i < op->desc.nin; i++) {
    din_buf[i] = p->l->grad_buf[op->in[i]];
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
  bool need[OP_MAX_KERNELS];
  backward_needed(op, din_buf, need);
  for (int k = 0; k < op->inst.nbwd; k++) {
    const op_kernel *kern = &op->inst.bwd[k];
    if (!need[k])
      continue;
    plan_knode *kn = add_knode(p, KNODE_BACKWARD, o, kern);
    if (kn == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < op->desc.nin; i++) {
      int32_t t = op->in[i];
      if (kern->reads & OP_SLOT_IN(i))
        kn->slot_buf[plan_slot(OP_SLOT_IN(i))] =
            input_buf(p, op, i, is_recomputed(p, t));
      if (kern->writes & OP_SLOT_DIN(i))
        kn->slot_buf[plan_slot(OP_SLOT_DIN(i))] = din_buf[i];
    }
    if (kern->reads & OP_SLOT_OUT)
      kn->slot_buf[plan_slot(OP_SLOT_OUT)] =
          out_recomputed ? p->l->recomp_buf[op->out] : p->l->value_buf[op->out];
    for (int a = 0; a < op->inst.naux; a++)
      if (kern->reads & OP_SLOT_AUX(a))
        kn->slot_buf[plan_slot(OP_SLOT_AUX(a))] =
            out_recomputed ? ob[o].raux[a] : ob[o].aux[a];
    if (kern->reads & OP_SLOT_DOUT)
      kn->slot_buf[plan_slot(OP_SLOT_DOUT)] = p->l->grad_buf[op->out];
    for (int w = 0; w < op->inst.nws; w++)
      if ((kern->reads | kern->writes) & OP_SLOT_WS(w))
        kn->slot_buf[plan_slot(OP_SLOT_WS(w))] = ws[w];
  }
  return REMAT_OK;
}

static remat_status emit_backward(lower_ctx *p, op_buffers *ob,
                                  const bool *has_grad, const bool *needed) {
  const remat_graph *g = p->g;
  if (p->l->grad_buf[p->req->loss] < 0)
    return REMAT_OK; /* the loss depends on no parameter */
  plan_knode *seed = add_knode(p, KNODE_SEED, -1, NULL);
  if (seed == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  seed->seed.loss = p->l->value_buf[p->req->loss];
  seed->seed.loss_grad = p->l->grad_buf[p->req->loss];
  ops_by_top by_top;
  remat_status s = index_ops_by_top(g, &by_top);
  int32_t current_top = -2;
  for (int32_t o = g->nops - 1; o >= 0 && s == REMAT_OK; o--) {
    const graph_op *op = &g->ops[o];
    if (!has_grad[op->out])
      continue;
    int32_t top = op->region < 0 ? -1 : g->regions[op->region].top;
    if (top != current_top && top >= 0)
      s = emit_region_recompute(p, ob, needed, &by_top, top);
    current_top = top;
    if (s == REMAT_OK)
      s = emit_backward_op(p, ob, o);
  }
  free(by_top.start);
  free(by_top.ops);
  return s;
}

/* ---- updates ---- */

/* Per parameter a finite check of its gradient (as soon as it is final),
 * one gate after all checks, then the updates: a NaN or Inf anywhere in the
 * gradients or the loss skips every update, so none is half-applied. */
static remat_status emit_updates(lower_ctx *p) {
  const remat_graph *g = p->g;
  for (int kind = KNODE_CHECK; kind <= KNODE_UPDATE; kind++) {
    if (kind == KNODE_GATE) {
      if (add_knode(p, KNODE_GATE, -1, NULL) == NULL)
        return REMAT_ERR_OUT_OF_MEMORY;
      continue;
    }
    int64_t tile0 = 0; /* the same numbering for checks and updates */
    for (int32_t t = 0; t < g->ntensors; t++) {
      const remat_tensor *x = g->tensors[t];
      if (x->kind != TENSOR_PARAM || p->l->grad_buf[t] < 0)
        continue;
      plan_knode *kn = add_knode(p, (knode_kind)kind, -1, NULL);
      if (kn == NULL)
        return REMAT_ERR_OUT_OF_MEMORY;
      kn->optim.param_tensor = t;
      kn->tiles = optim_tiles(op_numel(&x->shape));
      kn->optim.grad = p->l->grad_buf[t];
      kn->optim.check_tile0 = tile0;
      tile0 += kn->tiles;
      if (kind == KNODE_CHECK) {
        p->l->ncheck_tiles += kn->tiles;
        continue;
      }
      kn->optim.param = p->l->value_buf[t];
      kn->optim.param_copy = p->l->copy_buf[t];
      if (p->req->opt_kind != REMAT_OPT_ADAMW)
        continue;
      kn->optim.adam_m =
          add_buffer(p, tensor_bytes(x), REMAT_MEM_OPTIMIZER, true, -1);
      kn->optim.adam_v =
          add_buffer(p, tensor_bytes(x), REMAT_MEM_OPTIMIZER, true, -1);
      if (kn->optim.adam_m < 0 || kn->optim.adam_v < 0)
        return REMAT_ERR_OUT_OF_MEMORY;
    }
  }
  return REMAT_OK;
}


/* ---- the stage ---- */

static remat_status alloc_tensor_maps(lower_ctx *p) {
  size_t n = (size_t)p->g->ntensors + 1;
  p->l->value_buf = remat__malloc(n * sizeof *p->l->value_buf);
  p->l->grad_buf = remat__malloc(n * sizeof *p->l->grad_buf);
  p->l->recomp_buf = remat__malloc(n * sizeof *p->l->recomp_buf);
  p->l->copy_buf = remat__malloc(n * sizeof *p->l->copy_buf);
  if (!p->l->value_buf || !p->l->grad_buf || !p->l->recomp_buf ||
      !p->l->copy_buf)
    return REMAT_ERR_OUT_OF_MEMORY;
  return REMAT_OK;
}

static remat_status lower_into(lower_ctx *p, bool *has_grad, bool *needed,
                               op_buffers *ob) {
  const remat_graph *g = p->g;
  remat_status s = alloc_tensor_maps(p);
  if (s == REMAT_OK)
    s = mark_gradients(p, has_grad);
  if (s == REMAT_OK) {
    memcpy(p->saved, p->req->saved, (size_t)g->ntensors * sizeof *p->saved);
    plan_fused(p, has_grad);
    s = make_tensor_buffers(p, has_grad);
  }
  for (int32_t o = 0; o < g->nops && s == REMAT_OK; o++)
    s = make_aux(p, ob, o, false);
  for (int32_t o = 0; o < g->nops && s == REMAT_OK; o++)
    s = emit_forward_kernels(p, ob, o, false);
  if (s != REMAT_OK || p->req->loss < 0)
    return s;
  mark_needed(p, has_grad, needed);
  s = emit_backward(p, ob, has_grad, needed);
  if (s == REMAT_OK && p->req->has_opt)
    s = emit_updates(p);
  return s;
}

remat_status lower_graph(const lower_request *req, plan_lowering *out) {
  memset(out, 0, sizeof *out);
  lower_ctx ctx = {req, req->g, out, NULL, NULL, NULL, NULL, NULL};
  size_t n = (size_t)req->g->ntensors + 1;
  bool *has_grad = remat__calloc(n, sizeof *has_grad);
  bool *needed = remat__calloc(n, sizeof *needed);
  op_buffers *ob = remat__calloc((size_t)req->g->nops + 1, sizeof *ob);
  size_t nops = (size_t)req->g->nops + 1;
  ctx.saved = remat__calloc(n, sizeof *ctx.saved);
  ctx.fuse_fwd = remat__calloc(nops, sizeof *ctx.fuse_fwd);
  ctx.fuse_rec = remat__calloc(nops, sizeof *ctx.fuse_rec);
  ctx.skip_fwd = remat__calloc(nops, sizeof *ctx.skip_fwd);
  ctx.skip_rec = remat__calloc(nops, sizeof *ctx.skip_rec);
  remat_status s = REMAT_ERR_OUT_OF_MEMORY;
  if (has_grad != NULL && needed != NULL && ob != NULL && ctx.saved &&
      ctx.fuse_fwd && ctx.fuse_rec && ctx.skip_fwd && ctx.skip_rec)
    s = lower_into(&ctx, has_grad, needed, ob);
  free(has_grad);
  free(needed);
  free(ob);
  free(ctx.saved);
  free(ctx.fuse_fwd);
  free(ctx.fuse_rec);
  free(ctx.skip_fwd);
  free(ctx.skip_rec);
  if (s != REMAT_OK)
    lowering_free(out);
  return s;
}

void lowering_free(plan_lowering *l) {
  for (int32_t i = 0; i < l->nknodes; i++) {
    free(l->knodes[i].touch);
    free(l->knodes[i].init);
  }
  free(l->knodes);
  free(l->bufs);
  free(l->value_buf);
  free(l->grad_buf);
  free(l->recomp_buf);
  free(l->copy_buf);
  memset(l, 0, sizeof *l);
}

/* ---- what a node reads and writes ---- */

static int add_use(knode_use *out, int n, int32_t buf, bool writes) {
  if (buf < 0)
    return n;
  for (int i = 0; i < n; i++)
    if (out[i].buf == buf) {
      out[i].writes |= writes;
      return n;
    }
  out[n] = (knode_use){buf, writes};
  return n + 1;
}

int knode_uses(const plan_knode *kn, knode_use *out) {
  int n = 0;
  switch (kn->kind) {
  case KNODE_SEED:
    n = add_use(out, n, kn->seed.loss, false);
    return add_use(out, n, kn->seed.loss_grad, true);
  case KNODE_CHECK:
    return add_use(out, n, kn->optim.grad, false);
  case KNODE_GATE:
    return 0;
  case KNODE_UPDATE:
    n = add_use(out, n, kn->optim.param, true);
    n = add_use(out, n, kn->optim.param_copy, true);
    n = add_use(out, n, kn->optim.grad, false);
    n = add_use(out, n, kn->optim.adam_m, true);
    return add_use(out, n, kn->optim.adam_v, true);
  default:
    for (int s = 0; s < PLAN_SLOTS; s++)
      n = add_use(out, n, kn->slot_buf[s], (kn->kernel->writes >> s) & 1u);
    return n;
  }
}
