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

void (*remat__task_hook)(const remat_graph *g, int knode_kind);

/* remat_cancel, seen at a task's start: every task before the update gate
 * stops the run (so no update runs); those of the updates, which only the
 * gate's passing starts, finish it, so an update is applied whole. */
static bool cancelled(const step_run *r, const plan_knode *kn) {
  if (remat__task_hook != NULL)
    remat__task_hook(r->c->g, (int)kn->kind);
  return kn->kind != KNODE_UPDATE &&
         atomic_load_explicit(&r->c->g->cancel, memory_order_relaxed);
}

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
  o->rng_seed = c->g->seed;
  o->rng_step = s->rng_step;
  o->training = s->training;
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
  if (cancelled(r, kn))
    return REMAT_ERR_CANCELLED;
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
 * earlier ones into its gradient (the mean of all), in the pass that sums
 * its squares; the tile's sum of squares goes to its own slot, for the
 * finite check and the gate's norm. */
static int check_tile(const step_run *r, const plan_knode *kn, int64_t tile) {
  step_state *s = r->s;
  int64_t lo, hi;
  optim_tile_range(param_numel(r->c, kn), tile, &lo, &hi);
  float *grad = buf_data(s, kn->optim.grad) + lo;
  bool fold = s->accum_count > 0 && r->mode == RUN_STEP;
  const float *acc = fold ? s->accum[kn->optim.param_tensor] + lo : NULL;
  float scale = fold ? 1.0f / (float)(s->accum_count + 1) : 1.0f;
  double sumsq;
  if (fold && !r->c->g->rt->split_update) {
    sumsq = optim_fold_sum_squares(grad, acc, hi - lo, scale);
  } else { /* REMAT_BENCH_SPLIT_UPDATE: two passes, the same values */
    if (fold)
      optim_fold(grad, acc, hi - lo, scale);
    sumsq = optim_sum_squares(grad, hi - lo);
  }
  s->check_sumsq[kn->optim.check_tile0 + tile] = sumsq;
  if (!isfinite(sumsq))
    atomic_store(&s->nonfinite, 1);
  return REMAT_OK;
}

/* Tile `tile` of update node kn as the update sees it, with the copy of
 * the parameter on `node` and the tile's recorded maxima. */
static optim_tile_args tile_args(const step_run *r, const plan_knode *kn,
                                 int64_t tile, int node) {
  const compiled_step *c = r->c;
  step_state *s = r->s;
  const remat_tensor *t = c->g->tensors[kn->optim.param_tensor];
  int64_t lo, hi;
  optim_tile_range(param_numel(c, kn), tile, &lo, &hi);
  float *m = buf_data(s, kn->optim.adam_m), *v = buf_data(s, kn->optim.adam_v);
  return (optim_tile_args){
      .param = node_copy(c, s, kn->optim.param, node) + lo,
      .grad = buf_data(s, kn->optim.grad) + lo,
      .adam_m = m != NULL ? m + lo : NULL,
      .adam_v = v != NULL ? v + lo : NULL,
      .n = hi - lo,
      .step = r->opt_step,
      .decay = t->shape.ndim >= 2 ? c->opt.weight_decay : 0.0f,
      .grad_scale = s->grad_scale,
      .max = s->tile_max + (kn->optim.check_tile0 + tile) * OPTIM_NMAX};
}

/* Whether tile `tile` of update node kn can be applied without making a
 * value NaN or Inf: the bound from the maxima its last update recorded and
 * the gradient's sum of squares that its check computed (optim.h), and
 * only when that fails, a dry run. The sums of a first micro-step are its
 * gradients, finite once checked. */
static bool tile_safe(const step_run *r, const plan_knode *kn, int64_t tile) {
  step_state *s = r->s;
  double g_max = sqrt(s->check_sumsq[kn->optim.check_tile0 + tile]);
  optim_tile_args a = tile_args(r, kn, tile, 0);
  int64_t lo, hi;
  optim_tile_range(param_numel(r->c, kn), tile, &lo, &hi);
  if (r->mode == RUN_ACCUMULATE)
    return s->accum_count == 0 ||
           optim_accumulate_bounded(a.max[OPTIM_MAX_ACC], g_max) ||
           optim_accumulate_finite(s->accum[kn->optim.param_tensor] + lo,
                                   a.grad, a.n);
  remat_optimizer opt = r->c->opt;
  opt.lr = s->lr;
  return optim_update_bounded(&opt, &a, g_max) ||
         optim_update_finite(&opt, &a, kn->optim.param_copy >= 0);
}

/* The all-or-nothing promise for what the updates write: when any tile's
 * update would make a parameter, a moment or a gradient sum NaN or Inf,
 * no update runs and the step names the parameter. */
static void check_updates(const step_run *r) {
  const compiled_step *c = r->c;
  step_state *s = r->s;
  for (int32_t i = 0; i < c->low.nknodes; i++) {
    const plan_knode *kn = &c->low.knodes[i];
    for (int64_t t = 0; kn->kind == KNODE_UPDATE && t < kn->tiles; t++)
      if (!tile_safe(r, kn, t)) {
        s->overflow_tensor = kn->optim.param_tensor;
        atomic_store(&s->nonfinite, 1);
        return;
      }
  }
}

/* After every check: the global gradient norm, summed over the check tiles
 * in their fixed order, the clip factor of the updates, and whether the
 * updates can be applied. */
static int gate_tile(const step_run *r) {
  step_state *s = r->s;
  double total = 0.0;
  for (int64_t i = 0; i < r->c->low.ncheck_tiles; i++)
    total += s->check_sumsq[i];
  s->grad_norm = sqrt(total);
  s->grad_scale = r->mode == RUN_ACCUMULATE
                      ? 1.0f
                      : optim_clip_scale(s->grad_norm, s->clip);
  if (atomic_load(&s->nonfinite) == 0)
    check_updates(r);
  return REMAT_OK;
}

void tasks_scan_maxima(const compiled_step *c, step_state *s) {
  step_run r = {c, s, RUN_STEP, 0};
  for (int32_t i = 0; i < c->low.nknodes; i++) {
    const plan_knode *kn = &c->low.knodes[i];
    for (int64_t t = 0; kn->kind == KNODE_UPDATE && t < kn->tiles; t++) {
      optim_tile_args a = tile_args(&r, kn, t, 0);
      a.max[OPTIM_MAX_W] = optim_max_abs(a.param, a.n);
      a.max[OPTIM_MAX_M] = a.adam_m ? optim_max_abs(a.adam_m, a.n) : 0.0f;
      a.max[OPTIM_MAX_V] = a.adam_v ? optim_max_abs(a.adam_v, a.n) : 0.0f;
    }
  }
}

/* Where one tile's new weights go besides the node's copy it updates:
 * the bf16 weights and the other nodes' copies of both. */
typedef struct update_sinks {
  const compiled_step *c;
  step_state *s;
  const plan_knode *kn;
  int node;
  int64_t lo;           /* the tile's first element in the parameter */
  const float *param;   /* the updated copy, at the tile */
} update_sinks;

static void refresh_copies(const update_sinks *u, int64_t lo, int64_t hi) {
  const plan_knode *kn = u->kn;
  node_copies_refresh(u->c, u->s, kn->optim.param, u->node, u->lo + lo,
                      u->lo + hi);
  if (kn->optim.param_copy < 0)
    return;
  /* the bf16 weights the next step reads */
  uint16_t *copy = (uint16_t *)node_copy(u->c, u->s, kn->optim.param_copy,
                                         u->node);
  bf16_from_f32_row(copy + u->lo + lo, u->param + lo, hi - lo);
  node_copies_refresh(u->c, u->s, kn->optim.param_copy, u->node, u->lo + lo,
                      u->lo + hi);
}

static void chunk_done(void *ctx, int64_t lo, int64_t hi) {
  refresh_copies(ctx, lo, hi);
}

/* Runs after the gate: nothing is written when any check failed. The
 * worker's node's copy of the parameter is updated and, chunk by chunk in
 * the same pass, rounded into the bf16 weights and copied to the other
 * nodes (REMAT_BENCH_SPLIT_UPDATE: as passes over the whole tile after
 * the update; the same values). */
static int update_tile(const step_run *r, const plan_knode *kn, int64_t tile,
                       int node) {
  const compiled_step *c = r->c;
  step_state *s = r->s;
  if (atomic_load(&s->nonfinite))
    return REMAT_OK;
  optim_tile_args a = tile_args(r, kn, tile, node);
  int64_t lo, hi;
  optim_tile_range(param_numel(c, kn), tile, &lo, &hi);
  if (r->mode == RUN_ACCUMULATE) {
    a.max[OPTIM_MAX_ACC] =
        optim_accumulate(s->accum[kn->optim.param_tensor] + lo, a.grad, a.n,
                         s->accum_count == 0);
    return REMAT_OK;
  }
  remat_optimizer opt = c->opt;
  opt.lr = s->lr;
  update_sinks u = {c, s, kn, node, lo, a.param};
  bool split = c->g->rt->split_update;
  if (!split) {
    a.chunk_done = chunk_done;
    a.ctx = &u;
  }
  optim_update(&opt, &a);
  if (split)
    refresh_copies(&u, 0, hi - lo);
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
  if (cancelled(r, kn))
    return REMAT_ERR_CANCELLED;
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
  const step_run *r = run;
  const compiled_step *c = r->c;
  step_state *s = r->s;
  const plan_knode *kn = arg;
  if (cancelled(r, kn))
    return REMAT_ERR_CANCELLED;
  for (int i = 0; i < kn->ntouch; i++) {
    int32_t b = kn->touch[i];
    const plan_buffer *buf = &c->low.bufs[b];
    if (!buf->persistent && atomic_fetch_sub(&s->users_left[b], 1) == 1) {
      mem_free(&s->arena, s->data[b], (size_t)buf->bytes, buf->cat,
               c->numa.home[b], true);
      s->data[b] = NULL;
      /* after the free: admitted bytes never trail the arena's count */
      sched_release(c->g->rt->pool, worker, mem_block_bytes(buf->bytes));
    }
  }
  return REMAT_OK;
}
