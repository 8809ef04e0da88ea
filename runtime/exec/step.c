/* Running a compiled step: feeds and reads, remat_step, remat_accumulate
 * and remat_forward (resetting the per-step counters, reserving the step's blocks, running
 * the task DAG, and reporting its statistics). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/files.h"
#include "runtime/compile/report.h"

#include "runtime/dp/dp.h"
#include "runtime/exec/precision.h"
#include "runtime/exec/step_stats.h"
#include "runtime/compile/step_plan.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- feeds and reads ---- */

/* Every call below runs inside the graph (graph_enter): a second thread's
 * call on the same graph gets REMAT_ERR_STATE, and destroy waits. */
static remat_status enter(remat_graph *g, const char *what) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "%s: graph is NULL", what);
  remat_status s = runtime_check_fork(g->rt, what);
  if (s != REMAT_OK)
    return s;
  if (!g->compiled)
    return remat__fail(REMAT_ERR_STATE,
                       "%s: the graph is not compiled: call remat_compile "
                       "first",
                       what);
  return graph_enter(g, what);
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

/* The vocabulary an int32 input indexes: the rows of the embedding table
 * it feeds, or the classes of the cross-entropy it is the targets of (the
 * smallest when several); 0 when it feeds neither. */
static int64_t input_vocab(const remat_graph *g, const remat_tensor *input) {
  int64_t vocab = 0;
  for (int32_t o = 0; o < g->nops; o++) {
    const op_desc *d = &g->ops[o].desc;
    int64_t v = 0;
    if (d->type == OP_EMBED && g->ops[o].in[0] == input->id)
      v = d->in[1].dim[0];
    else if (d->type == OP_CROSS_ENTROPY && g->ops[o].in[1] == input->id)
      v = d->in[0].dim[d->in[0].ndim - 1];
    if (v > 0 && (vocab == 0 || v < vocab))
      vocab = v;
  }
  return vocab;
}

/* Every id in [0, vocab), else the first bad one with its position. */
static remat_status check_ids(const remat_graph *g, const remat_tensor *input,
                              const int32_t *ids, size_t n) {
  int64_t vocab = input_vocab(g, input);
  for (size_t i = 0; vocab > 0 && i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab)
      return remat__fail(REMAT_ERR_INVALID_ARG,
                         "remat_feed: '%s' holds id %d at position %zu, "
                         "outside the vocabulary of %lld (ids 0 to %lld)",
                         input->name, (int)ids[i], i, (long long)vocab,
                         (long long)vocab - 1);
  return REMAT_OK;
}

static remat_status do_feed(remat_graph *g, const remat_tensor *input, const void *data,
                        size_t bytes) {
  remat_status s = check_tensor(g, input, bytes, "remat_feed");
  if (s != REMAT_OK)
    return s;
  if (input->kind != TENSOR_INPUT)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_feed: '%s' is not an input", input->name);
  if (data == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_feed: data is NULL");
  if (input->dtype == OP_I32 &&
      (s = check_ids(g, input, data, bytes / sizeof(int32_t))) != REMAT_OK)
    return s;
  precision_store(&g->plan->low.bufs[g->plan->low.value_buf[input->id]], data,
                  (int64_t)(bytes / sizeof(float)));
  return REMAT_OK;
}

static remat_status do_read(remat_graph *g, const remat_tensor *t, void *dst,
                        size_t bytes) {
  remat_status s = check_tensor(g, t, bytes, "remat_read");
  if (s != REMAT_OK)
    return s;
  plan_buffer *b = &g->plan->low.bufs[g->plan->low.value_buf[t->id]];
  if (!b->persistent)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_read: '%s' is an intermediate activation: call "
                       "remat_keep on it before compile",
                       t->name);
  if (dst == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_read: dst is NULL");
  precision_load(b, dst, (int64_t)(bytes / sizeof(float)));
  return REMAT_OK;
}

static remat_status do_read_grad(remat_graph *g, const remat_tensor *param, float *dst,
                             size_t bytes) {
  remat_status s = check_tensor(g, param, bytes, "remat_read_grad");
  if (s != REMAT_OK)
    return s;
  int32_t b = param->kind == TENSOR_PARAM ? g->plan->low.grad_buf[param->id] : -1;
  if (b < 0)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_read_grad: '%s' is not a parameter with a "
                       "gradient",
                       param->name);
  if (dst == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_read_grad: dst is NULL");
  memcpy(dst, g->plan->low.bufs[b].data, bytes);
  return REMAT_OK;
}

static remat_status do_write(remat_graph *g, const remat_tensor *param, const float *src,
                         size_t bytes) {
  remat_status s = check_tensor(g, param, bytes, "remat_write");
  if (s != REMAT_OK)
    return s;
  if (param->kind != TENSOR_PARAM)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_write: '%s' is not a parameter", param->name);
  if (src == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_write: src is NULL");
  int32_t b = g->plan->low.value_buf[param->id];
  memcpy(g->plan->low.bufs[b].data, src, bytes);
  numa_refresh(g->plan, b, 0, 0, (int64_t)(bytes / sizeof *src));
  g->plan->params_written = true; /* bf16 copies: before the next step */
  return REMAT_OK;
}

static remat_status do_set_clip(remat_graph *g, float max_norm) {
  if (!g->plan->has_opt || !isfinite(max_norm) || max_norm < 0.0f)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_set_clip: needs a graph compiled with an "
                       "optimizer and a finite max_norm >= 0 (0: no "
                       "clipping), got %g",
                       (double)max_norm);
  g->plan->clip = max_norm;
  return REMAT_OK;
}

/* The trace replaces PATH after each traced run (a new file renamed over
 * it), so PATH must be a regular file (through a symbolic link too) or a
 * new name in a directory where a file can be created: checked now, with
 * a temporary file made and removed, so that nothing is left at PATH. */
static remat_status do_trace_steps(remat_graph *g, const char *path,
                                   int steps) {
  step_trace *t = &g->plan->trace;
  if (steps < 0)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_trace_steps: steps is %d: expected steps >= 1 "
                       "with a file, or 0 to stop tracing",
                       steps);
  if (steps > 0 && (path == NULL || path[0] == '\0'))
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_trace_steps: the path is %s: expected a file "
                       "with steps >= 1, or steps 0 to stop tracing",
                       path == NULL ? "NULL" : "empty");
  if (steps > 0 && strlen(path) >= sizeof t->path)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_trace_steps: the path is longer than %zu bytes",
                       sizeof t->path - 1);
  struct stat st;
  if (steps > 0 && stat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return remat__fail(REMAT_ERR_IO,
                       "remat_trace_steps: '%s' is %s: the trace must be a "
                       "regular file or a new name",
                       remat__quote(&(remat__quoted){0}, path),
                       remat__file_kind(st.st_mode));
  if (steps > 0) {
    remat__replacing r;
    FILE *f = remat__replace_begin(path, &r);
    if (f == NULL)
      return remat__fail(REMAT_ERR_IO,
                         "remat_trace_steps: cannot write '%s': %s",
                         remat__quote(&(remat__quoted){0}, path),
                         strerror(errno));
    fclose(f);
    unlink(r.tmp);
  }
  snprintf(t->path, sizeof t->path, "%s", steps > 0 ? path : "");
  t->steps_left = steps;
  t->nsteps = 0;
  return REMAT_OK;
}

static remat_status do_set_lr(remat_graph *g, float lr) {
  if (!g->plan->has_opt || !isfinite(lr) || lr <= 0.0f)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_set_lr: needs a graph compiled with an "
                       "optimizer and a finite lr > 0");
  g->plan->opt.lr = lr;
  return REMAT_OK;
}

/* ---- steps ---- */

static void release_transients(remat_step_plan *p) {
  for (int32_t b = 0; b < p->low.nbufs; b++) {
    plan_buffer *buf = &p->low.bufs[b];
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
    st->loss = precision_get1(&p->low.bufs[p->low.value_buf[p->loss]]);
  st->nonfinite = atomic_load(&p->nonfinite) || (p->loss >= 0 && !isfinite(st->loss));
  st->seconds = secs;
  st->flops = p->forward_only ? 0.0 : p->low.flops;
  st->recompute_flops = p->low.recompute_flops;
  for (int w = 0; w < p->g->rt->nworkers; w++)
    st->executed_recompute_flops += p->worker_recompute_flops[w * 8];
  st->peak_bytes = atomic_load(&p->arena.total_peak);
  st->activation_peak_bytes = atomic_load(&p->arena.transient_peak);
  st->predicted_peak_bytes = p->predicted.peak + p->accum_bytes;
  st->grad_norm = p->forward_only ? 0.0 : p->grad_norm;
  st->accumulated = p->forward_only ? 0 : p->accum_count + 1;
  for (int c = 0; c < REMAT_MEM_NUM_CATEGORIES; c++) {
    st->peak[c] = atomic_load(&p->arena.peak[c]);
    st->current[c] = atomic_load(&p->arena.current[c]);
  }
  st->tasks = sched_dag_num_tasks(p->dag);
  st->remote_bytes = p->numa.remote_bytes;
  st->remote_bytes_unplaced = p->numa.remote_bytes_unplaced;
}

/* A trace that could not be written after a step that succeeded: the
 * step's updates are applied, so the step still succeeds; stats say so and
 * remat_last_error() has the words. */
static void note_trace(remat_step_plan *p, remat_step_stats *st,
                       const char *what) {
  char err[SCHED_ERRMSG_MAX];
  st->trace_status = step_trace_end(p, err, sizeof err);
  if (st->trace_status != REMAT_OK)
    remat__fail(st->trace_status, "%s: the step succeeded but its trace was "
                "not written: %s", what, err);
}

static remat_status run_plan(remat_graph *g, remat_step_stats *stats,
                             const char *what) {
  remat_step_plan *p = g->plan;
  if (step_stats_check(stats, what) != REMAT_OK)
    return REMAT_ERR_INVALID_ARG;
  for (int32_t b = 0; b < p->low.nbufs; b++)
    atomic_store(&p->low.bufs[b].users_left, p->low.bufs[b].users);
  atomic_store(&p->nonfinite, 0);
  memset(p->worker_recompute_flops, 0,
         (size_t)g->rt->nworkers * 8 * sizeof *p->worker_recompute_flops);
  mem_reset_peaks(&p->arena);
  int64_t updates = p->accumulating ? 0 : 1;
  p->opt_step += updates;
  p->grad_norm = 0.0;
  sched_run_opts opts = {0};
  char err[SCHED_ERRMSG_MAX];
  double t0 = now_seconds();
  remat_status s = dp_step_begin(p); /* data parallel: dp.h */
  if (s != REMAT_OK) {
    p->opt_step -= updates;
    return s;
  }
  precision_refresh_copies(p); /* after writes, loads and the broadcast */
  if (step_trace_begin(p, g->rt->config.trace_path, &opts.records) !=
      REMAT_OK) {
    p->opt_step -= updates;
    dp_step_end(p, REMAT_ERR_OUT_OF_MEMORY, err, sizeof err);
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "%s: out of memory for the trace", what);
  }
  if (mem_reserve(&p->arena) != REMAT_OK) {
    step_trace_cancel(p);
    p->opt_step -= updates;
    dp_step_end(p, REMAT_ERR_OUT_OF_MEMORY, err, sizeof err);
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "%s: out of memory reserving the step's tensors", what);
  }
  err[0] = '\0';
  s = sched_run(g->rt->pool, p->dag, &opts, err);
  remat_status local = s;
  s = dp_step_end(p, s, err, sizeof err);
  double secs = now_seconds() - t0;
  if (s != REMAT_OK) {
    step_trace_cancel(p);
    release_transients(p);
    p->opt_step -= updates;
    return remat__fail(s, "%s: %s", what,
                       s == REMAT_ERR_OUT_OF_MEMORY && local == s
                           ? "out of memory" : err);
  }
  fill_stats(p, &p->last, secs);
  if (!p->last.nonfinite && !p->forward_only)
    p->accum_count = p->accumulating ? p->accum_count + 1 : 0;
  if (p->last.nonfinite) {
    step_trace_cancel(p);
    p->opt_step -= updates; /* no update was applied */
    s = remat__fail(REMAT_ERR_NUMERIC,
                    "%s: the loss or a gradient is NaN or Inf; the updates "
                    "were skipped",
                    what);
  }
  if (s == REMAT_OK) {
    note_trace(p, &p->last, what);
    report_first_run(p, &p->last, what);
  }
  if (stats != NULL)
    step_stats_write(stats, &p->last);
  return s;
}

/* ---- the public calls: enter, run, leave ---- */

remat_status remat_step(remat_graph *g, remat_step_stats *stats) {
  remat_status s = enter(g, "remat_step");
  if (s != REMAT_OK)
    return s;
  if (g->plan->forward_only)
    s = remat__fail(REMAT_ERR_STATE,
                    "remat_step: the graph was compiled without a loss: use "
                    "remat_forward");
  else
    s = run_plan(g, stats, "remat_step");
  graph_leave(g);
  return s;
}

/* The bytes the arena counts for a block (memory.c rounds to 64). */
static int64_t block_bytes(int64_t bytes) { return (bytes + 63) / 64 * 64; }

/* The sums of gradients of the micro-steps, one per parameter, beside its
 * gradient (same size and NUMA home), counted as gradients. */
static remat_status alloc_accum(remat_step_plan *p) {
  if (p->accum != NULL)
    return REMAT_OK;
  int64_t sums = 0, budget = p->g->rt->config.memory_budget;
  for (int32_t i = 0; i < p->low.nknodes; i++)
    if (p->low.knodes[i].kind == KNODE_UPDATE)
      sums += block_bytes(p->low.bufs[p->low.knodes[i].optim.grad].bytes);
  if (budget > 0 && p->predicted.peak + sums > budget)
    return remat__fail(REMAT_ERR_BUDGET,
                       "remat_accumulate: the gradient sums (%lld bytes) "
                       "would raise the predicted peak from %lld to %lld "
                       "bytes, over the memory budget of %lld bytes: compile "
                       "under a budget smaller by the sums, or raise it",
                       (long long)sums, (long long)p->predicted.peak,
                       (long long)(p->predicted.peak + sums),
                       (long long)budget);
  p->accum = remat__calloc((size_t)p->g->ntensors, sizeof *p->accum);
  bool ok = p->accum != NULL;
  for (int32_t i = 0; ok && i < p->low.nknodes; i++) {
    const plan_knode *kn = &p->low.knodes[i];
    if (kn->kind != KNODE_UPDATE)
      continue;
    const plan_buffer *grad = &p->low.bufs[kn->optim.grad];
    p->accum[kn->optim.param_tensor] = mem_alloc(
        &p->arena, (size_t)grad->bytes, REMAT_MEM_GRADS, grad->node, false);
    ok = p->accum[kn->optim.param_tensor] != NULL;
    p->accum_bytes += ok ? block_bytes(grad->bytes) : 0;
  }
  if (ok)
    return REMAT_OK;
  if (p->accum != NULL)
    for (int32_t t = 0; t < p->g->ntensors; t++)
      if (p->accum[t] != NULL) {
        const plan_buffer *grad = &p->low.bufs[p->low.grad_buf[t]];
        mem_free(&p->arena, p->accum[t], (size_t)grad->bytes,
                 REMAT_MEM_GRADS, grad->node, false);
      }
  free(p->accum);
  p->accum = NULL;
  p->accum_bytes = 0;
  return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                     "remat_accumulate: out of memory for the gradient sums");
}

static remat_status do_accumulate(remat_graph *g, remat_step_stats *stats) {
  remat_step_plan *p = g->plan;
  if (p->forward_only || !p->has_opt)
    return remat__fail(REMAT_ERR_STATE,
                       "remat_accumulate: the graph was compiled without %s: "
                       "accumulation sums gradients for an optimizer update",
                       p->forward_only ? "a loss" : "an optimizer");
  remat_status s = alloc_accum(p);
  if (s != REMAT_OK)
    return s;
  p->accumulating = true;
  s = run_plan(g, stats, "remat_accumulate");
  p->accumulating = false;
  return s;
}

remat_status remat_accumulate(remat_graph *g, remat_step_stats *stats) {
  remat_status s = enter(g, "remat_accumulate");
  if (s != REMAT_OK)
    return s;
  s = do_accumulate(g, stats);
  graph_leave(g);
  return s;
}

remat_status remat_forward(remat_graph *g, remat_step_stats *stats) {
  remat_status s = enter(g, "remat_forward");
  if (s != REMAT_OK)
    return s;
  if (!g->plan->forward_only)
    s = remat__fail(REMAT_ERR_STATE,
                    "remat_forward: the graph was compiled for training: "
                    "compile a graph with loss NULL for inference");
  else
    s = run_plan(g, stats, "remat_forward");
  graph_leave(g);
  return s;
}

remat_status remat_feed(remat_graph *g, const remat_tensor *input, const void *data,
                        size_t bytes) {
  remat_status s = enter(g, "remat_feed");
  if (s != REMAT_OK)
    return s;
  s = do_feed(g, input, data, bytes);
  graph_leave(g);
  return s;
}

remat_status remat_read(remat_graph *g, const remat_tensor *t, void *dst,
                        size_t bytes) {
  remat_status s = enter(g, "remat_read");
  if (s != REMAT_OK)
    return s;
  s = do_read(g, t, dst, bytes);
  graph_leave(g);
  return s;
}

remat_status remat_read_grad(remat_graph *g, const remat_tensor *param, float *dst,
                             size_t bytes) {
  remat_status s = enter(g, "remat_read_grad");
  if (s != REMAT_OK)
    return s;
  s = do_read_grad(g, param, dst, bytes);
  graph_leave(g);
  return s;
}

remat_status remat_write(remat_graph *g, const remat_tensor *param, const float *src,
                         size_t bytes) {
  remat_status s = enter(g, "remat_write");
  if (s != REMAT_OK)
    return s;
  s = do_write(g, param, src, bytes);
  graph_leave(g);
  return s;
}

remat_status remat_set_clip(remat_graph *g, float max_norm) {
  remat_status s = enter(g, "remat_set_clip");
  if (s != REMAT_OK)
    return s;
  s = do_set_clip(g, max_norm);
  graph_leave(g);
  return s;
}

remat_status remat_trace_steps(remat_graph *g, const char *path, int steps) {
  remat_status s = enter(g, "remat_trace_steps");
  if (s != REMAT_OK)
    return s;
  s = do_trace_steps(g, path, steps);
  graph_leave(g);
  return s;
}

remat_status remat_set_lr(remat_graph *g, float lr) {
  remat_status s = enter(g, "remat_set_lr");
  if (s != REMAT_OK)
    return s;
  s = do_set_lr(g, lr);
  graph_leave(g);
  return s;
}
