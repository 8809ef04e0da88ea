/* Running a compiled step: the start, tile and done task bodies (allocation
 * at a buffer's first writer, freeing after its last user), persistent
 * buffers, feeds and reads, and remat_step / remat_forward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "runtime/plan.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *buffer_data(remat_step_plan *p, const plan_knode *kn,
                          uint32_t slot) {
  int32_t b = kn->slot_buf[plan_slot(slot)];
  return b < 0 ? NULL : p->bufs[b].data;
}

/* Fills the node's op_bufs from its slots (pointers change per step). */
static void bind_buffers(remat_step_plan *p, plan_knode *kn) {
  op_bufs *o = &kn->bufs;
  for (int i = 0; i < OP_MAX_IN; i++) {
    o->in[i] = buffer_data(p, kn, OP_SLOT_IN(i));
    o->din[i] = buffer_data(p, kn, OP_SLOT_DIN(i));
  }
  o->out = buffer_data(p, kn, OP_SLOT_OUT);
  for (int k = 0; k < OP_MAX_AUX; k++)
    o->aux[k] = buffer_data(p, kn, OP_SLOT_AUX(k));
  o->dout = buffer_data(p, kn, OP_SLOT_DOUT);
  for (int k = 0; k < OP_MAX_WS; k++)
    o->ws[k] = buffer_data(p, kn, OP_SLOT_WS(k));
}

int plan_start_task(void *arg, int worker) {
  plan_knode *kn = arg;
  remat_step_plan *p = kn->plan;
  const sched_placement *pl = sched_pool_placement(p->g->rt->pool);
  for (int i = 0; i < kn->ninit; i++) {
    plan_buffer *b = &p->bufs[kn->init[i]];
    if (!b->persistent) {
      b->node = pl->worker_node[worker];
      b->data = mem_alloc(&p->arena, (size_t)b->bytes, b->cat, b->node, true);
      if (b->data == NULL)
        return REMAT_ERR_OUT_OF_MEMORY;
    }
    if (b->zero_fill)
      memset(b->data, 0, (size_t)b->bytes);
  }
  bind_buffers(p, kn);
  return REMAT_OK;
}

int plan_tile_task(void *arg, int worker) {
  plan_tile *t = arg;
  plan_knode *kn = t->kn;
  remat_step_plan *p = kn->plan;
  switch (kn->kind) {
  case KNODE_SEED: return optim_seed_tile(p, kn);
  case KNODE_UPDATE: return optim_update_tile(p, kn, t->tile);
  case KNODE_CHECK: return optim_check_tile(p, kn, t->tile);
  case KNODE_GATE: return REMAT_OK;
  case KNODE_RECOMPUTE:
    p->worker_recompute_flops[worker * 8] += kn->flops / (double)kn->tiles;
    return kn->kernel->fn(kn->inst, &kn->bufs, t->tile, &p->workers[worker]);
  default:
    return kn->kernel->fn(kn->inst, &kn->bufs, t->tile, &p->workers[worker]);
  }
}

int plan_done_task(void *arg, int worker) {
  (void)worker;
  plan_knode *kn = arg;
  remat_step_plan *p = kn->plan;
  for (int i = 0; i < kn->ntouch; i++) {
    plan_buffer *b = &p->bufs[kn->touch[i]];
    if (!b->persistent && atomic_fetch_sub(&b->users_left, 1) == 1) {
      mem_free(&p->arena, b->data, (size_t)b->bytes, b->cat, b->node, true);
      b->data = NULL;
    }
  }
  return REMAT_OK;
}

/* ---- persistent buffers and parameter initialization ---- */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uniform01(uint64_t *state) {
  return ((double)(splitmix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static void init_param(const remat_graph *g, const remat_tensor *t, float *x) {
  int64_t n = op_numel(&t->shape);
  uint64_t state = g->seed * 0x100000001B3ull + (uint64_t)t->id * 0x9E37ull + 1;
  for (int64_t i = 0; i < n; i++) {
    switch (t->init) {
    case REMAT_INIT_ZEROS: x[i] = 0.0f; break;
    case REMAT_INIT_ONES: x[i] = 1.0f; break;
    default: {
      double u1 = uniform01(&state), u2 = uniform01(&state);
      x[i] = (float)(t->init_scale * sqrt(-2.0 * log(u1)) *
                     cos(6.283185307179586 * u2));
    }
    }
  }
}

remat_status plan_allocate_persistent(remat_step_plan *p) {
  for (int32_t b = 0; b < p->nbufs; b++) {
    plan_buffer *buf = &p->bufs[b];
    if (!buf->persistent)
      continue;
    buf->data = mem_alloc(&p->arena, (size_t)buf->bytes, buf->cat, 0, false);
    if (buf->data == NULL)
      return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                         "remat_compile: out of memory allocating %lld bytes",
                         (long long)buf->bytes);
    memset(buf->data, 0, (size_t)buf->bytes);
    if (buf->tensor >= 0 && buf->cat == REMAT_MEM_PARAMS)
      init_param(p->g, p->g->tensors[buf->tensor], buf->data);
  }
  size_t max_scratch = 0;
  for (int32_t o = 0; o < p->g->nops; o++)
    if (p->g->ops[o].inst.scratch_bytes > max_scratch)
      max_scratch = p->g->ops[o].inst.scratch_bytes;
  int nw = p->g->rt->nworkers;
  p->scratch_bytes = (max_scratch + 63) / 64 * 64;
  p->workers = remat__calloc((size_t)nw, sizeof *p->workers);
  p->worker_recompute_flops =
      remat__calloc((size_t)nw * 8, sizeof *p->worker_recompute_flops);
  if (p->workers == NULL || p->worker_recompute_flops == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  if (p->scratch_bytes > 0) {
    p->scratch = mem_alloc(&p->arena, p->scratch_bytes * (size_t)nw,
                           REMAT_MEM_WORKSPACE, 0, false);
    if (p->scratch == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
  }
  for (int w = 0; w < nw; w++) {
    p->workers[w].stream = p->g->rt->workers[w].stream;
    p->workers[w].scratch =
        p->scratch == NULL ? NULL : (char *)p->scratch + (size_t)w * p->scratch_bytes;
    p->workers[w].scratch_bytes = p->scratch_bytes;
  }
  return REMAT_OK;
}

void plan_destroy(remat_graph *g) {
  remat_step_plan *p = g->plan;
  if (p == NULL)
    return;
  if (p->dag != NULL)
    sched_dag_destroy(p->dag);
  for (int32_t b = 0; b < p->nbufs; b++)
    if (p->bufs[b].data != NULL)
      mem_free(&p->arena, p->bufs[b].data, (size_t)p->bufs[b].bytes,
               p->bufs[b].cat, p->bufs[b].node, !p->bufs[b].persistent);
  if (p->scratch != NULL)
    mem_free(&p->arena, p->scratch, p->scratch_bytes * (size_t)g->rt->nworkers,
             REMAT_MEM_WORKSPACE, 0, false);
  plan_unlower(p);
  mem_arena_destroy(&p->arena);
  free(p->knodes);
  free(p->bufs);
  free(p->tiles);
  free(p->workers);
  free(p->worker_recompute_flops);
  free(p->value_buf);
  free(p->grad_buf);
  free(p->recomp_buf);
  free(p->saved);
  free(p->region_stats);
  free(p);
  g->plan = NULL;
}

/* ---- feeds and reads ---- */

static remat_status check_ready(remat_graph *g, const char *what) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "%s: graph is NULL", what);
  if (!g->compiled)
    return remat__fail(REMAT_ERR_STATE,
                       "%s: the graph is not compiled: call remat_compile "
                       "first",
                       what);
  return REMAT_OK;
}

static remat_status check_tensor(remat_graph *g, const remat_tensor *t,
                                 size_t bytes, const char *what) {
  if (t == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "%s: tensor is NULL", what);
  if (t->graph != g)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "%s: tensor '%s' belongs to another graph", what,
                       t->name);
  if ((int64_t)bytes != tensor_bytes(t))
    return remat__fail(REMAT_ERR_SHAPE,
                       "%s: tensor '%s' holds %lld bytes, %zu given", what,
                       t->name, (long long)tensor_bytes(t), bytes);
  return REMAT_OK;
}

remat_status remat_feed(remat_graph *g, remat_tensor *input, const void *data,
                        size_t bytes) {
  remat_status s = check_ready(g, "remat_feed");
  if (s == REMAT_OK)
    s = check_tensor(g, input, bytes, "remat_feed");
  if (s != REMAT_OK)
    return s;
  if (input->kind != TENSOR_INPUT)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_feed: '%s' is not an input", input->name);
  if (data == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_feed: data is NULL");
  memcpy(g->plan->bufs[g->plan->value_buf[input->id]].data, data, bytes);
  return REMAT_OK;
}

remat_status remat_read(remat_graph *g, remat_tensor *t, void *dst,
                        size_t bytes) {
  remat_status s = check_ready(g, "remat_read");
  if (s == REMAT_OK)
    s = check_tensor(g, t, bytes, "remat_read");
  if (s != REMAT_OK)
    return s;
  plan_buffer *b = &g->plan->bufs[g->plan->value_buf[t->id]];
  if (!b->persistent)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_read: '%s' is an intermediate activation: call "
                       "remat_keep on it before compile",
                       t->name);
  if (dst == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_read: dst is NULL");
  memcpy(dst, b->data, bytes);
  return REMAT_OK;
}

remat_status remat_read_grad(remat_graph *g, remat_tensor *param, float *dst,
                             size_t bytes) {
  remat_status s = check_ready(g, "remat_read_grad");
  if (s == REMAT_OK)
    s = check_tensor(g, param, bytes, "remat_read_grad");
  if (s != REMAT_OK)
    return s;
  int32_t b = param->kind == TENSOR_PARAM ? g->plan->grad_buf[param->id] : -1;
  if (b < 0)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_read_grad: '%s' is not a parameter with a "
                       "gradient",
                       param->name);
  if (dst == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_read_grad: dst is NULL");
  memcpy(dst, g->plan->bufs[b].data, bytes);
  return REMAT_OK;
}

remat_status remat_write(remat_graph *g, remat_tensor *param, const float *src,
                         size_t bytes) {
  remat_status s = check_ready(g, "remat_write");
  if (s == REMAT_OK)
    s = check_tensor(g, param, bytes, "remat_write");
  if (s != REMAT_OK)
    return s;
  if (param->kind != TENSOR_PARAM)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_write: '%s' is not a parameter", param->name);
  if (src == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_write: src is NULL");
  memcpy(g->plan->bufs[g->plan->value_buf[param->id]].data, src, bytes);
  return REMAT_OK;
}

remat_status remat_set_lr(remat_graph *g, float lr) {
  remat_status s = check_ready(g, "remat_set_lr");
  if (s != REMAT_OK)
    return s;
  if (!g->plan->has_opt || !isfinite(lr) || lr <= 0.0f)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_set_lr: needs a graph compiled with an "
                       "optimizer and a finite lr > 0");
  g->plan->opt.lr = lr;
  return REMAT_OK;
}

/* ---- steps ---- */

static void release_transients(remat_step_plan *p) {
  for (int32_t b = 0; b < p->nbufs; b++) {
    plan_buffer *buf = &p->bufs[b];
    if (!buf->persistent && buf->data != NULL) {
      mem_free(&p->arena, buf->data, (size_t)buf->bytes, buf->cat, buf->node,
               true);
      buf->data = NULL;
    }
  }
}

static void fill_stats(remat_step_plan *p, remat_step_stats *st, double secs) {
  memset(st, 0, sizeof *st);
  st->loss = NAN;
  if (p->loss >= 0)
    st->loss = p->bufs[p->value_buf[p->loss]].data[0];
  st->nonfinite = atomic_load(&p->nonfinite) || (p->loss >= 0 && !isfinite(st->loss));
  st->seconds = secs;
  st->flops = p->forward_only ? 0.0 : p->flops;
  st->recompute_flops = p->recompute_flops;
  for (int w = 0; w < p->g->rt->nworkers; w++)
    st->executed_recompute_flops += p->worker_recompute_flops[w * 8];
  st->peak_bytes = atomic_load(&p->arena.total_peak);
  st->activation_peak_bytes = atomic_load(&p->arena.transient_peak);
  st->predicted_peak_bytes = p->predicted_peak;
  for (int c = 0; c < REMAT_MEM_NUM_CATEGORIES; c++) {
    st->peak[c] = atomic_load(&p->arena.peak[c]);
    st->current[c] = atomic_load(&p->arena.current[c]);
  }
  st->tasks = sched_dag_num_tasks(p->dag);
}

static remat_status run_plan(remat_graph *g, remat_step_stats *stats,
                             const char *what) {
  remat_status s = check_ready(g, what);
  if (s != REMAT_OK)
    return s;
  remat_step_plan *p = g->plan;
  for (int32_t b = 0; b < p->nbufs; b++)
    atomic_store(&p->bufs[b].users_left, p->bufs[b].users);
  atomic_store(&p->nonfinite, 0);
  memset(p->worker_recompute_flops, 0,
         (size_t)g->rt->nworkers * 8 * sizeof *p->worker_recompute_flops);
  mem_reset_peaks(&p->arena);
  p->opt_step++;
  sched_run_opts opts = {.trace_path = g->rt->config.trace_path};
  char err[SCHED_ERRMSG_MAX];
  double t0 = now_seconds();
  if (mem_reserve(&p->arena) != REMAT_OK) {
    p->opt_step--;
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "%s: out of memory reserving the step's tensors", what);
  }
  s = sched_run(g->rt->pool, p->dag, &opts, err);
  double secs = now_seconds() - t0;
  if (s != REMAT_OK) {
    release_transients(p);
    p->opt_step--;
    return remat__fail(s, "%s: %s", what,
                       s == REMAT_ERR_OUT_OF_MEMORY ? "out of memory" : err);
  }
  fill_stats(p, &p->last, secs);
  if (stats != NULL)
    *stats = p->last;
  if (p->last.nonfinite) {
    p->opt_step--; /* no update was applied */
    return remat__fail(REMAT_ERR_NUMERIC,
                       "%s: the loss or a gradient is NaN or Inf; the updates "
                       "were skipped",
                       what);
  }
  return REMAT_OK;
}

remat_status remat_step(remat_graph *g, remat_step_stats *stats) {
  if (g != NULL && g->compiled && g->plan->forward_only)
    return remat__fail(REMAT_ERR_STATE,
                       "remat_step: the graph was compiled without a loss: "
                       "use remat_forward");
  return run_plan(g, stats, "remat_step");
}

remat_status remat_forward(remat_graph *g, remat_step_stats *stats) {
  if (g != NULL && g->compiled && !g->plan->forward_only)
    return remat__fail(REMAT_ERR_STATE,
                       "remat_forward: the graph was compiled for training: "
                       "compile a graph with loss NULL for inference");
  return run_plan(g, stats, "remat_forward");
}
