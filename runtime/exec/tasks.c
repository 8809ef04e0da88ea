/* Task bodies (tasks.h): allocation at a buffer's first writer (in the
 * home the NUMA placement gave it), one tile of an op kernel or of the
 * optimizer (parameters read from the copy on the worker's node), and
 * freeing after a buffer's last user. */
#include <math.h>
#include <string.h>

#include "base/bf16.h"
#include "runtime/exec/optim.h"
#include "runtime/exec/precision.h"
#include "runtime/compile/step_plan.h"
#include "runtime/exec/tasks.h"

static float *slot_data(remat_step_plan *p, const plan_knode *kn,
                        uint32_t slot) {
  int32_t b = kn->slot_buf[plan_slot(slot)];
  return b < 0 ? NULL : p->low.bufs[b].data;
}

static float *buf_data(remat_step_plan *p, int32_t b) {
  return b < 0 ? NULL : p->low.bufs[b].data;
}

/* Fills an op kernel's op_bufs from its slots (pointers change per step). */
static void bind_buffers(remat_step_plan *p, plan_knode *kn) {
  op_bufs *o = &kn->bufs;
  for (int i = 0; i < OP_MAX_IN; i++) {
    o->in[i] = slot_data(p, kn, OP_SLOT_IN(i));
    o->din[i] = slot_data(p, kn, OP_SLOT_DIN(i));
  }
  o->out = slot_data(p, kn, OP_SLOT_OUT);
  for (int k = 0; k < OP_MAX_AUX; k++)
    o->aux[k] = slot_data(p, kn, OP_SLOT_AUX(k));
  o->dout = slot_data(p, kn, OP_SLOT_DOUT);
  for (int k = 0; k < OP_MAX_WS; k++)
    o->ws[k] = slot_data(p, kn, OP_SLOT_WS(k));
}

static int worker_node(const remat_step_plan *p, int worker) {
  return sched_pool_placement(p->g->rt->pool)->worker_node[worker];
}

int tasks_start(void *arg, int worker) {
  (void)worker;
  plan_knode *kn = arg;
  remat_step_plan *p = kn->plan;
  for (int i = 0; i < kn->ninit; i++) {
    plan_buffer *b = &p->low.bufs[kn->init[i]];
    if (!b->persistent) {
      b->data = mem_alloc(&p->arena, (size_t)b->bytes, b->cat, b->node, true);
      if (b->data == NULL)
        return REMAT_ERR_OUT_OF_MEMORY;
    }
    if (b->zero_fill)
      memset(b->data, 0, (size_t)b->bytes);
  }
  if (kn->kernel != NULL)
    bind_buffers(p, kn);
  return REMAT_OK;
}

static int64_t param_numel(const remat_step_plan *p, const plan_knode *kn) {
  return op_numel(&p->g->tensors[kn->optim.param_tensor]->shape);
}

/* The last micro-step of an accumulation first folds the sum of the
 * earlier ones into its gradient (the mean of all); then the tile's sum of
 * squares goes to its own slot, for the finite check and the gate's norm. */
static int check_tile(remat_step_plan *p, const plan_knode *kn, int64_t tile) {
  int64_t lo, hi;
  optim_tile_range(param_numel(p, kn), tile, &lo, &hi);
  float *grad = buf_data(p, kn->optim.grad) + lo;
  if (p->accum_count > 0 && !p->accumulating)
    optim_fold(grad, p->accum[kn->optim.param_tensor] + lo,
               hi - lo, 1.0f / (float)(p->accum_count + 1));
  double sumsq = optim_sum_squares(grad, hi - lo);
  p->check_sumsq[kn->optim.check_tile0 + tile] = sumsq;
  if (!isfinite(sumsq))
    atomic_store(&p->nonfinite, 1);
  return REMAT_OK;
}

/* After every check: the global gradient norm, summed over the check tiles
 * in their fixed order, and the clip factor of the updates. */
static int gate_tile(remat_step_plan *p) {
  double total = 0.0;
  for (int64_t i = 0; i < p->low.ncheck_tiles; i++)
    total += p->check_sumsq[i];
  p->grad_norm = sqrt(total);
  p->grad_scale = p->accumulating ? 1.0f : optim_clip_scale(p->grad_norm, p->clip);
  return REMAT_OK;
}

/* Runs after the gate: nothing is written when any check failed. The
 * worker's node's copy of the parameter is updated, then copied to the
 * others. */
static int update_tile(remat_step_plan *p, const plan_knode *kn,
                       int64_t tile, int node) {
  if (atomic_load(&p->nonfinite))
    return REMAT_OK;
  const remat_tensor *t = p->g->tensors[kn->optim.param_tensor];
  int64_t lo, hi;
  optim_tile_range(param_numel(p, kn), tile, &lo, &hi);
  if (p->accumulating) {
    optim_accumulate(p->accum[kn->optim.param_tensor] + lo,
                     buf_data(p, kn->optim.grad) + lo, hi - lo,
                     p->accum_count == 0);
    return REMAT_OK;
  }
  float *m = buf_data(p, kn->optim.adam_m), *v = buf_data(p, kn->optim.adam_v);
  optim_tile_args a = {
      .param = numa_data(p, kn->optim.param, node) + lo,
      .grad = buf_data(p, kn->optim.grad) + lo,
      .adam_m = m != NULL ? m + lo : NULL,
      .adam_v = v != NULL ? v + lo : NULL,
      .n = hi - lo,
      .step = p->opt_step,
      .decay = t->shape.ndim >= 2 ? p->opt.weight_decay : 0.0f,
      .grad_scale = p->grad_scale};
  optim_update(&p->opt, &a);
  numa_refresh(p, kn->optim.param, node, lo, hi);
  if (kn->optim.param_copy >= 0) { /* the bf16 weights the next step reads */
    uint16_t *copy = (uint16_t *)numa_data(p, kn->optim.param_copy, node);
    bf16_from_f32_row(copy + lo, a.param, hi - lo);
    numa_refresh(p, kn->optim.param_copy, node, lo, hi);
  }
  return REMAT_OK;
}

/* d(loss) = 1, in the loss's dtype (f32, or bf16 for a one-element loss
 * of another shape than [1]). */
static int seed_tile(remat_step_plan *p, const plan_knode *kn) {
  precision_set1(&p->low.bufs[kn->seed.loss_grad], 1.0f);
  if (!isfinite(precision_get1(&p->low.bufs[kn->seed.loss])))
    atomic_store(&p->nonfinite, 1);
  return REMAT_OK;
}

/* The node's buffers as a worker on `node` reads them: parameters from
 * its node's copy, when there are copies. */
static const op_bufs *tile_bufs(const remat_step_plan *p, const plan_knode *kn,
                                int node, op_bufs *local) {
  if (p->numa.copies == NULL)
    return &kn->bufs;
  *local = kn->bufs;
  for (int i = 0; i < OP_MAX_IN; i++) {
    int32_t b = kn->slot_buf[plan_slot(OP_SLOT_IN(i))];
    if (b >= 0)
      local->in[i] = numa_data(p, b, node);
  }
  return local;
}

int tasks_tile(void *arg, int worker) {
  plan_tile *t = arg;
  plan_knode *kn = t->kn;
  remat_step_plan *p = kn->plan;
  op_bufs local;
  switch (kn->kind) {
  case KNODE_SEED: return seed_tile(p, kn);
  case KNODE_UPDATE: return update_tile(p, kn, t->tile, worker_node(p, worker));
  case KNODE_CHECK: return check_tile(p, kn, t->tile);
  case KNODE_GATE: return gate_tile(p);
  case KNODE_RECOMPUTE:
    p->worker_recompute_flops[worker * 8] += kn->flops / (double)kn->tiles;
    break;
  default:
    break;
  }
  return kn->kernel->fn(kn->inst,
                        tile_bufs(p, kn, worker_node(p, worker), &local),
                        t->tile, &p->workers[worker]);
}

int tasks_done(void *arg, int worker) {
  (void)worker;
  plan_knode *kn = arg;
  remat_step_plan *p = kn->plan;
  for (int i = 0; i < kn->ntouch; i++) {
    plan_buffer *b = &p->low.bufs[kn->touch[i]];
    if (!b->persistent && atomic_fetch_sub(&b->users_left, 1) == 1) {
      mem_free(&p->arena, b->data, (size_t)b->bytes, b->cat, b->node, true);
      b->data = NULL;
    }
  }
  return REMAT_OK;
}
