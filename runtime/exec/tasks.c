/* Task bodies (tasks.h): allocation at a buffer's first writer (in the
 * home the NUMA placement gave it), one tile of an op kernel or of the
 * optimizer (parameters read from the copy on the worker's node), and
 * freeing after a buffer's last user. The compiled step is read only; what
 * they change is the run's step state. */
#include <math.h>
#include <string.h>

#include "base/bf16.h"
#include "runtime/dp/dp.h"
#include "runtime/exec/node_copies.h"
#include "runtime/exec/optim.h"
#include "runtime/exec/precision.h"
#include "runtime/exec/tasks.h"

const task_bodies remat__task_bodies = {tasks_start, tasks_tile, tasks_done,
                                        dp_bucket_task, dp_agree_task};

static float *buf_data(const step_state *s, int32_t b) {
  return b < 0 ? NULL : s->data[b];
}

/* An op kernel's op_bufs from its slots (pointers change per step). */
void tasks_bind(const compiled_step *c, step_state *s, int32_t i) {
  const plan_knode *kn = &c->low.knodes[i];
  op_bufs *o = &s->bufs[i];
  for (int k = 0; k < OP_MAX_IN; k++) {
    o->in[k] = buf_data(s, kn->slot_buf[plan_slot(OP_SLOT_IN(k))]);
    o->din[k] = buf_data(s, kn->slot_buf[plan_slot(OP_SLOT_DIN(k))]);
    o->din_accumulate[k] = kn->din_accumulate[k];
  }
  o->out = buf_data(s, kn->slot_buf[plan_slot(OP_SLOT_OUT)]);
  for (int k = 0; k < OP_MAX_AUX; k++)
    o->aux[k] = buf_data(s, kn->slot_buf[plan_slot(OP_SLOT_AUX(k))]);
  o->dout = buf_data(s, kn->slot_buf[plan_slot(OP_SLOT_DOUT)]);
  for (int k = 0; k < OP_MAX_WS; k++)
    o->ws[k] = buf_data(s, kn->slot_buf[plan_slot(OP_SLOT_WS(k))]);
}

static int worker_node(const compiled_step *c, int worker) {
  return sched_pool_placement(c->g->rt->pool)->worker_node[worker];
}

static int32_t knode_index(const compiled_step *c, const plan_knode *kn) {
  return (int32_t)(kn - c->low.knodes);
}

int tasks_start(void *run, void *arg, int worker) {
  (void)worker;
  const step_run *r = run;
  const compiled_step *c = r->c;
  step_state *s = r->s;
  const plan_knode *kn = arg;
  for (int i = 0; i < kn->ninit; i++) {
    int32_t b = kn->init[i];
    const plan_buffer *buf = &c->low.bufs[b];
    if (!buf->persistent) {
      s->data[b] = mem_alloc(&s->arena, (size_t)buf->bytes, buf->cat,
                             c->numa.home[b], true);
      if (s->data[b] == NULL)
        return REMAT_ERR_OUT_OF_MEMORY;
    }
    if (buf->zero_fill)
      memset(s->data[b], 0, (size_t)buf->bytes);
  }
  if (kn->kernel != NULL)
    tasks_bind(c, s, knode_index(c, kn));
  return REMAT_OK;
}

static int64_t param_numel(const compiled_step *c, const plan_knode *kn) {
  return op_numel(&c->g->tensors[kn->optim.param_tensor]->shape);
}

/* The last micro-step of an accumulation first folds the sum of the
 * earlier ones into its gradient (the mean of all); then the tile's sum of
 * squares goes to its own slot, for the finite check and the gate's norm. */
static int check_tile(const step_run *r, const plan_knode *kn, int64_t tile) {
  step_state *s = r->s;
  int64_t lo, hi;
  optim_tile_range(param_numel(r->c, kn), tile, &lo, &hi);
  float *grad = buf_data(s, kn->optim.grad) + lo;
  if (s->accum_count > 0 && r->mode == RUN_STEP)
    optim_fold(grad, s->accum[kn->optim.param_tensor] + lo,
               hi - lo, 1.0f / (float)(s->accum_count + 1));
  double sumsq = optim_sum_squares(grad, hi - lo);
  s->check_sumsq[kn->optim.check_tile0 + tile] = sumsq;
  if (!isfinite(sumsq))
    atomic_store(&s->nonfinite, 1);
  return REMAT_OK;
}

/* After every check: the global gradient norm, summed over the check tiles
 * in their fixed order, and the clip factor of the updates. */
static int gate_tile(const step_run *r) {
  step_state *s = r->s;
  double total = 0.0;
  for (int64_t i = 0; i < r->c->low.ncheck_tiles; i++)
    total += s->check_sumsq[i];
  s->grad_norm = sqrt(total);
  s->grad_scale = r->mode == RUN_ACCUMULATE
                      ? 1.0f
                      : optim_clip_scale(s->grad_norm, s->clip);
  return REMAT_OK;
}

/* Runs after the gate: nothing is written when any check failed. The
 * worker's node's copy of the parameter is updated, then copied to the
 * others. */
static int update_tile(const step_run *r, const plan_knode *kn, int64_t tile,
                       int node) {
  const compiled_step *c = r->c;
  step_state *s = r->s;
  if (atomic_load(&s->nonfinite))
    return REMAT_OK;
  const remat_tensor *t = c->g->tensors[kn->optim.param_tensor];
  int64_t lo, hi;
  optim_tile_range(param_numel(c, kn), tile, &lo, &hi);
  if (r->mode == RUN_ACCUMULATE) {
    optim_accumulate(s->accum[kn->optim.param_tensor] + lo,
                     buf_data(s, kn->optim.grad) + lo, hi - lo,
                     s->accum_count == 0);
    return REMAT_OK;
  }
  float *m = buf_data(s, kn->optim.adam_m), *v = buf_data(s, kn->optim.adam_v);
  optim_tile_args a = {
      .param = node_copy(c, s, kn->optim.param, node) + lo,
      .grad = buf_data(s, kn->optim.grad) + lo,
      .adam_m = m != NULL ? m + lo : NULL,
      .adam_v = v != NULL ? v + lo : NULL,
      .n = hi - lo,
      .step = r->opt_step,
      .decay = t->shape.ndim >= 2 ? c->opt.weight_decay : 0.0f,
      .grad_scale = s->grad_scale};
  remat_optimizer opt = c->opt;
  opt.lr = s->lr;
  optim_update(&opt, &a);
  node_copies_refresh(c, s, kn->optim.param, node, lo, hi);
  if (kn->optim.param_copy >= 0) { /* the bf16 weights the next step reads */
    uint16_t *copy = (uint16_t *)node_copy(c, s, kn->optim.param_copy, node);
    bf16_from_f32_row(copy + lo, a.param, hi - lo);
    node_copies_refresh(c, s, kn->optim.param_copy, node, lo, hi);
  }
  return REMAT_OK;
}

/* d(loss) = 1, in the loss's dtype (f32, or bf16 for a one-element loss
 * of another shape than [1]). */
static int seed_tile(const step_run *r, const plan_knode *kn) {
  const plan_lowering *l = &r->c->low;
  step_state *s = r->s;
  precision_set1(&l->bufs[kn->seed.loss_grad], s->data[kn->seed.loss_grad],
                 1.0f);
  if (!isfinite(precision_get1(&l->bufs[kn->seed.loss],
                               s->data[kn->seed.loss])))
    atomic_store(&s->nonfinite, 1);
  return REMAT_OK;
}

/* The node's buffers as a worker on `node` reads them: parameters from
 * its node's copy, when there are copies. */
static const op_bufs *tile_bufs(const step_run *r, int32_t i,
                                const plan_knode *kn, int node,
                                op_bufs *local) {
  const step_state *s = r->s;
  if (s->copies == NULL)
    return &s->bufs[i];
  *local = s->bufs[i];
  for (int k = 0; k < OP_MAX_IN; k++) {
    int32_t b = kn->slot_buf[plan_slot(OP_SLOT_IN(k))];
    if (b >= 0)
      local->in[k] = node_copy(r->c, s, b, node);
  }
  return local;
}

int tasks_tile(void *run, void *arg, int worker) {
  const step_run *r = run;
  const plan_tile *t = arg;
  const plan_knode *kn = t->kn;
  op_bufs local;
  switch (kn->kind) {
  case KNODE_SEED: return seed_tile(r, kn);
  case KNODE_UPDATE:
    return update_tile(r, kn, t->tile, worker_node(r->c, worker));
  case KNODE_CHECK: return check_tile(r, kn, t->tile);
  case KNODE_GATE: return gate_tile(r);
  case KNODE_RECOMPUTE:
    r->s->worker_recompute_flops[worker * 8] += kn->flops / (double)kn->tiles;
    break;
  default:
    break;
  }
  return kn->kernel->fn(kn->inst,
                        tile_bufs(r, t->knode, kn, worker_node(r->c, worker),
                                  &local),
                        t->tile, &r->s->workers[worker]);
}

int tasks_done(void *run, void *arg, int worker) {
  (void)worker;
  const step_run *r = run;
  const compiled_step *c = r->c;
  step_state *s = r->s;
  const plan_knode *kn = arg;
  for (int i = 0; i < kn->ntouch; i++) {
    int32_t b = kn->touch[i];
    const plan_buffer *buf = &c->low.bufs[b];
    if (!buf->persistent && atomic_fetch_sub(&s->users_left[b], 1) == 1) {
      mem_free(&s->arena, s->data[b], (size_t)buf->bytes, buf->cat,
               c->numa.home[b], true);
      s->data[b] = NULL;
    }
  }
  return REMAT_OK;
}
