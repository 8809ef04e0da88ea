/* Running a compiled step: feeds and reads, remat_step, remat_accumulate
 * and remat_forward (resetting the per-step counters, reserving the step's
 * blocks, running the task DAG on the step state, and reporting its
 * statistics). */
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
#include "runtime/exec/node_copies.h"
#include "runtime/exec/precision.h"
#include "runtime/exec/progress.h"
#include "runtime/exec/replan.h"
#include "runtime/exec/step_costs.h"
#include "runtime/exec/step_stats.h"
#include "runtime/exec/tasks.h"

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

/* Keys of the attention op that reads key lengths: S, the second dim of
 * its k (separate) or of its packed qkv. */
static int64_t attn_key_count(const op_desc *d) {
  return d->attrs.attn_separate ? d->in[1].dim[1] : d->in[0].dim[1];
}

/* Lengths an attention op reads as key lengths must be 1 to its keys. */
static remat_status check_key_lengths(const remat_graph *g,
                                      const remat_tensor *input,
                                      const int32_t *len, size_t n) {
  for (int32_t o = 0; o < g->nops; o++) {
    const graph_op *op = &g->ops[o];
    if (!op->desc.attrs.attn_lens || op->in[op->desc.nin - 1] != input->id)
      continue;
    int64_t S = attn_key_count(&op->desc);
    for (size_t i = 0; i < n; i++)
      if (len[i] < 1 || len[i] > S)
        return remat__fail(REMAT_ERR_INVALID_ARG,
                           "remat_feed: '%s' holds key length %d for batch "
                           "row %zu: each row's key length must be 1 to %lld "
                           "(the attention's keys)",
                           input->name, (int)len[i], i, (long long)S);
  }
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
  if (input->dtype == OP_I32 &&
      (s = check_key_lengths(g, input, data, bytes / sizeof(int32_t))) !=
          REMAT_OK)
    return s;
  const compiled_step *c = &g->step->compiled;
  int32_t b = c->low.value_buf[input->id];
  precision_store(&c->low.bufs[b], g->step->state.data[b], data,
                  (int64_t)(bytes / sizeof(float)));
  return REMAT_OK;
}

static remat_status do_read(remat_graph *g, const remat_tensor *t, void *dst,
                        size_t bytes) {
  remat_status s = check_tensor(g, t, bytes, "remat_read");
  if (s != REMAT_OK)
    return s;
  const compiled_step *c = &g->step->compiled;
  int32_t b = c->low.value_buf[t->id];
  if (!c->low.bufs[b].persistent)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_read: '%s' is an intermediate activation: call "
                       "remat_keep on it before compile",
                       t->name);
  if (dst == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_read: dst is NULL");
  precision_load(&c->low.bufs[b], g->step->state.data[b], dst,
                 (int64_t)(bytes / sizeof(float)));
  return REMAT_OK;
}

static remat_status do_read_grad(remat_graph *g, const remat_tensor *param, float *dst,
                             size_t bytes) {
  remat_status s = check_tensor(g, param, bytes, "remat_read_grad");
  if (s != REMAT_OK)
    return s;
  int32_t b = param->kind == TENSOR_PARAM
                  ? g->step->compiled.low.grad_buf[param->id]
                  : -1;
  if (b < 0 && param->frozen)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_read_grad: parameter '%s' is frozen "
                       "(remat_param_freeze), so it has no gradient: read "
                       "the gradient of a trainable parameter",
                       param->name);
  if (b < 0)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_read_grad: '%s' is not a parameter with a "
                       "gradient",
                       param->name);
  if (dst == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_read_grad: dst is NULL");
  memcpy(dst, g->step->state.data[b], bytes);
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
  const compiled_step *c = &g->step->compiled;
  step_state *st = &g->step->state;
  int32_t b = c->low.value_buf[param->id];
  precision_store(&c->low.bufs[b], st->data[b], src,
                  (int64_t)(bytes / sizeof *src)); /* bf16: a frozen one */
  node_copies_refresh(c, st, b, 0, 0, (int64_t)(bytes / sizeof *src));
  st->params_written = true; /* bf16 copies: before the next step */
  return REMAT_OK;
}

static remat_status do_set_clip(remat_graph *g, float max_norm) {
  if (!g->step->compiled.has_opt || !isfinite(max_norm) || max_norm < 0.0f)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_set_clip: needs a graph compiled with an "
                       "optimizer and a finite max_norm >= 0 (0: no "
                       "clipping), got %g",
                       (double)max_norm);
  g->step->state.clip = max_norm;
  return REMAT_OK;
}

/* The trace's first run replaces PATH (a new file renamed over it,
 * base/files.h) and later runs append to it, so PATH must be a regular file (not a symbolic link)
 * or a new name in a directory where a file can be created: checked now,
 * with a temporary file made and removed, so that nothing is left at PATH. */
static remat_status do_trace_steps(remat_graph *g, const char *path,
                                   int steps) {
  step_trace *t = &g->step->state.trace;
  if (steps < 0)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_trace_steps: steps is %d: expected steps >= 1 "
                       "with a file, or 0 to stop tracing",
                       steps);
  if (steps > REMAT_MAX_TRACE_STEPS)
    return remat__fail(REMAT_ERR_LIMIT,
                       "remat_trace_steps: steps is %d: at most %d steps "
                       "(REMAT_MAX_TRACE_STEPS) are traced into one file",
                       steps, REMAT_MAX_TRACE_STEPS);
  if (steps > 0 && (path == NULL || path[0] == '\0'))
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_trace_steps: the path is %s: expected a file "
                       "with steps >= 1, or steps 0 to stop tracing",
                       path == NULL ? "NULL" : "empty");
  if (steps > 0 && strlen(path) >= sizeof t->path)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_trace_steps: the path is longer than %zu bytes",
                       sizeof t->path - 1);
  mode_t mode;
  if (steps > 0 && remat__replace_check(path, &mode) != 0 && mode != 0)
    return remat__fail(REMAT_ERR_IO,
                       "remat_trace_steps: '%s' is %s: the trace must be a "
                       "regular file or a new name",
                       remat__quote(&(remat__quoted){0}, path),
                       remat__file_kind(mode));
  if (steps > 0) {
    remat__replacing r;
    FILE *f = remat__replace_begin(path, &r);
    if (f == NULL)
      return remat__fail(REMAT_ERR_IO,
                         "remat_trace_steps: cannot write '%s': %s",
                         remat__quote(&(remat__quoted){0}, path),
                         strerror(errno));
    remat__replace_abort(f, &r);
  }
  snprintf(t->path, sizeof t->path, "%s", steps > 0 ? path : "");
  t->steps_left = steps;
  t->nsteps = 0;
  return REMAT_OK;
}

static remat_status do_set_lr(remat_graph *g, float lr) {
  if (!g->step->compiled.has_opt || !isfinite(lr) || lr <= 0.0f)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_set_lr: needs a graph compiled with an "
                       "optimizer and a finite lr > 0");
  g->step->state.lr = lr;
  return REMAT_OK;
}

/* ---- steps ---- */

static void release_transients(const compiled_step *c, step_state *st) {
  for (int32_t b = 0; b < c->low.nbufs; b++) {
    const plan_buffer *buf = &c->low.bufs[b];
    if (!buf->persistent && st->data[b] != NULL) {
      mem_free(&st->arena, st->data[b], (size_t)buf->bytes, buf->cat,
               c->numa.home[b], true);
      st->data[b] = NULL;
    }
  }
}

static void fill_stats(const compiled_step *c, step_state *st,
                       remat_step_stats *out, double secs) {
  memset(out, 0, sizeof *out);
  out->loss = NAN;
  if (c->loss >= 0) {
    int32_t b = c->low.value_buf[c->loss];
    out->loss = precision_get1(&c->low.bufs[b], st->data[b]);
  }
  out->nonfinite = atomic_load(&st->nonfinite) ||
                   (c->loss >= 0 && !isfinite(out->loss));
  out->seconds = secs;
  out->flops = c->forward_only ? 0.0 : c->low.flops;
  out->recompute_flops = c->low.recompute_flops;
  for (int w = 0; w < c->nworkers; w++)
    out->executed_recompute_flops += st->worker_recompute_flops[w * 8];
  out->peak_bytes = atomic_load(&st->arena.total_peak);
  out->activation_peak_bytes = atomic_load(&st->arena.transient_peak);
  out->predicted_peak_bytes = c->predicted.peak + st->accum_bytes;
  out->grad_norm = c->forward_only ? 0.0 : st->grad_norm;
  out->accumulated = c->forward_only ? 0 : st->accum_count + 1;
  for (int k = 0; k < REMAT_MEM_NUM_CATEGORIES; k++) {
    out->peak[k] = atomic_load(&st->arena.peak[k]);
    out->current[k] = atomic_load(&st->arena.current[k]);
  }
  out->tasks = sched_dag_num_tasks(c->tasks.dag);
  out->remote_bytes = c->numa.remote_bytes;
  out->remote_bytes_unplaced = c->numa.remote_bytes_unplaced;
}

/* A trace that could not be written after a step that succeeded: the
 * step's updates are applied, so the step still succeeds; stats say so and
 * remat_last_error() has the words. */
static void note_trace(const compiled_step *c, step_state *st,
                       remat_step_stats *out, const char *what) {
  char err[SCHED_ERRMSG_MAX];
  out->trace_status = step_trace_end(c, &st->trace, err, sizeof err);
  if (out->trace_status != REMAT_OK)
    remat__fail(out->trace_status, "%s: the step succeeded but its trace "
                "was not written: %s", what, err);
}

/* Per-run counters back to their start. */
static void reset_counters(const compiled_step *c, step_state *st) {
  for (int32_t b = 0; b < c->low.nbufs; b++)
    atomic_store(&st->users_left[b], c->low.bufs[b].users);
  atomic_store(&st->nonfinite, 0);
  st->overflow_tensor = -1;
  memset(st->worker_recompute_flops, 0,
         (size_t)c->nworkers * 8 * sizeof *st->worker_recompute_flops);
  mem_reset_peaks(&st->arena);
  st->grad_norm = 0.0;
}

/* Before the DAG: the data-parallel broadcast, the copies, the trace's
 * arrays and the step's blocks. A failure here leaves the state as it
 * was. */
static remat_status prepare_run(const compiled_step *c, step_state *st,
                                sched_run_opts *opts, const char *what) {
  char err[SCHED_ERRMSG_MAX];
  remat_status s = dp_step_begin(c, st); /* data parallel: dp.h */
  if (s != REMAT_OK)
    return s;
  if (st->params_written) /* the update's bound: its maxima (tasks.h) */
    tasks_scan_maxima(c, st);
  precision_refresh_copies(c, st); /* after writes, loads and the broadcast */
  if (step_trace_begin(c, &st->trace, &st->arena, what,
                       c->g->rt->config.trace_path, &opts->records) != REMAT_OK) {
    dp_step_end(c, st, REMAT_ERR_OUT_OF_MEMORY, err, sizeof err);
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "%s: out of memory for the trace", what);
  }
  if (mem_reserve(&st->arena) != REMAT_OK) {
    step_trace_cancel(&st->trace);
    dp_step_end(c, st, REMAT_ERR_OUT_OF_MEMORY, err, sizeof err);
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "%s: out of memory reserving the step's tensors", what);
  }
  return REMAT_OK;
}

/* Why no update was applied: a NaN or Inf in the loss or a gradient, or
 * an update that would have made one (tasks.c's gate). */
static remat_status numeric_failure(const compiled_step *c,
                                    const step_state *st, run_mode mode,
                                    const char *what) {
  if (st->overflow_tensor < 0)
    return remat__fail(REMAT_ERR_NUMERIC,
                       "%s: the loss or a gradient is NaN or Inf; the updates "
                       "were skipped",
                       what);
  const char *name = c->g->tensors[st->overflow_tensor]->name;
  if (mode == RUN_ACCUMULATE)
    return remat__fail(REMAT_ERR_NUMERIC,
                       "%s: adding this micro-step's gradient of '%s' to the "
                       "sum of the earlier ones would overflow to Inf; no sum "
                       "was changed",
                       what, name);
  return remat__fail(REMAT_ERR_NUMERIC,
                     "%s: the update would make parameter '%s'%s NaN or Inf "
                     "(learning rate %g, gradient norm %g%s); no parameter "
                     "or moment was changed",
                     what, name,
                     c->opt.kind == REMAT_OPT_ADAMW ? " or its AdamW moments"
                                                    : "",
                     (double)st->lr, st->grad_norm,
                     st->grad_scale < 1.0f ? ", clipped" : "");
}

/* The bytes that the run's start tasks may hold at once (memory
 * admission, taskgraph.c): what the memory budget leaves beside what is
 * held before the run (parameters, gradients, optimizer state, scratch,
 * gradient sums), never below the predicted transient peak, which program
 * order needs and the budget's plan fits. So a run under a budget never
 * holds more than it. Without a budget, the predicted transient peak and
 * 1/REMAT_UNBUDGETED_SLACK of it (remat.h): a step never holds more than
 * its prediction and that, and program order never waits. */
static int64_t admit_bound(const compiled_step *c, const step_state *st) {
  int64_t budget = graph_memory_budget(c->g);
  if (c->g->rt->no_admission)
    return 0;
  if (budget <= 0)
    return c->predicted.transient_peak +
           c->predicted.transient_peak / REMAT_UNBUDGETED_SLACK;
  int64_t held = atomic_load(&st->arena.total_current) -
                 atomic_load(&st->arena.transient_current);
  int64_t bound = budget - held;
  return bound > c->predicted.transient_peak ? bound
                                             : c->predicted.transient_peak;
}

/* The scheduler's class of a remat_priority: 0 is the most urgent. */
static int sched_class(int priority) {
  switch (priority) {
  case REMAT_PRIORITY_INTERACTIVE: return 0;
  case REMAT_PRIORITY_BATCH: return 2;
  default: return 1;
  }
}

/* Runs the DAG in `mode`. The counters move only after a run that
 * succeeded: the update counter after a step or a forward run, the
 * micro-steps after an accumulation. */
static remat_status run_step(graph_step *gs, run_mode mode,
                             remat_step_stats *stats, const char *what) {
  const compiled_step *c = &gs->compiled;
  step_state *st = &gs->state;
  if (step_stats_check(stats, what) != REMAT_OK)
    return REMAT_ERR_INVALID_ARG;
  if (mode != RUN_ACCUMULATE && st->opt_step >= REMAT_MAX_STEPS)
    return remat__fail(REMAT_ERR_LIMIT,
                       "%s: the graph has counted %lld updates, the most it "
                       "counts (REMAT_MAX_STEPS, 2^53)",
                       what, (long long)st->opt_step);
  step_run run = {c, st, mode, st->opt_step + 1};
  st->rng_step = ((uint64_t)run.opt_step << 32) + (uint64_t)st->accum_count;
  st->training = mode != RUN_FORWARD;
  reset_counters(c, st);
  sched_run_opts opts = {.context = &run};
  double t0 = now_seconds();
  sched_trace_record *timed = step_costs_records(c, st);
  remat_status s = prepare_run(c, st, &opts, what);
  if (s != REMAT_OK)
    return s;
  char err[SCHED_ERRMSG_MAX] = "";
  if (opts.records != NULL) /* traced: the trace's times serve */
    timed = timed != NULL ? opts.records : NULL;
  else
    opts.records = timed;
  opts.admit_bound = admit_bound(c, st);
  opts.priority_class = sched_class(atomic_load(&c->g->priority));
  opts.progress =
      progress_begin(c->g->progress, sched_dag_num_tasks(c->tasks.dag));
  s = sched_run(c->g->rt->pool, c->tasks.dag, &opts, err);
  progress_end(c->g->progress);
  remat_status local = s;
  s = dp_step_end(c, st, s, err, sizeof err);
  double secs = now_seconds() - t0;
  if (s == REMAT_ERR_CANCELLED && local == s) {
    step_trace_cancel(&st->trace);
    release_transients(c, st);
    return remat__fail(s, "%s: cancelled by remat_cancel at a task boundary "
                       "before any update: no parameter, moment, gradient "
                       "sum or counter was changed (remat_uncancel clears "
                       "the flag)",
                       what);
  }
  if (s != REMAT_OK) {
    step_trace_cancel(&st->trace);
    release_transients(c, st);
    return remat__fail(s, "%s: %s", what,
                       s == REMAT_ERR_OUT_OF_MEMORY && local == s
                           ? "out of memory" : err);
  }
  fill_stats(c, st, &st->last, secs);
  if (st->last.nonfinite) { /* no update was applied */
    step_trace_cancel(&st->trace);
    s = numeric_failure(c, st, mode, what);
  } else if (mode == RUN_ACCUMULATE) {
    st->accum_count++;
  } else {
    st->opt_step = run.opt_step; /* forward runs count too */
    if (mode == RUN_STEP)
      st->accum_count = 0;
  }
  if (s == REMAT_OK) {
    step_costs_note(c, st, timed);
    note_trace(c, st, &st->last, what);
    if (!st->reported_run) {
      report_first_run(c, &st->last, what);
      st->reported_run = true;
    }
  }
  if (stats != NULL)
    step_stats_write(stats, &st->last);
  return s;
}

/* ---- the public calls: enter, run, leave ---- */

/* A run of a cancelled graph (remat_cancel) returns before any task. */
static remat_status enter_run(remat_graph *g, const char *what) {
  remat_status s = enter(g, what);
  if (s != REMAT_OK || !atomic_load(&g->cancel))
    return s;
  s = remat__fail(REMAT_ERR_CANCELLED,
                  "%s: the graph is cancelled (remat_cancel): nothing was "
                  "run; call remat_uncancel to run it again",
                  what);
  graph_leave(g); /* after the failure: remat_graph_error has it */
  return s;
}

remat_status remat_cancel(remat_graph *g) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "remat_cancel: graph is NULL");
  atomic_store(&g->cancel, 1);
  return REMAT_OK;
}

remat_status remat_uncancel(remat_graph *g) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_uncancel: graph is NULL");
  atomic_store(&g->cancel, 0);
  return REMAT_OK;
}

remat_status remat_set_progress(remat_graph *g, remat_progress_fn fn,
                                void *user, int min_interval_ms) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_set_progress: graph is NULL");
  remat_status s = graph_enter(g, "remat_set_progress");
  if (s != REMAT_OK)
    return s;
  s = progress_set(g, fn, user, min_interval_ms);
  graph_leave(g);
  return s;
}

remat_status remat_graph_priority(remat_graph *g, remat_priority priority) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_graph_priority: graph is NULL");
  if (priority != REMAT_PRIORITY_NORMAL &&
      priority != REMAT_PRIORITY_INTERACTIVE &&
      priority != REMAT_PRIORITY_BATCH)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_graph_priority: priority %d is not "
                       "REMAT_PRIORITY_NORMAL (0), REMAT_PRIORITY_INTERACTIVE "
                       "(1) or REMAT_PRIORITY_BATCH (2)",
                       (int)priority);
  atomic_store(&g->priority, (int)priority);
  return REMAT_OK;
}

int remat_cancelled(const remat_graph *g) {
  return g != NULL && atomic_load(&g->cancel) != 0;
}

remat_status remat_step(remat_graph *g, remat_step_stats *stats) {
  remat_status s = enter_run(g, "remat_step");
  if (s != REMAT_OK)
    return s;
  if (g->step->compiled.forward_only)
    s = remat__fail(REMAT_ERR_STATE,
                    "remat_step: the graph was compiled without a loss: use "
                    "remat_forward");
  else
    s = run_step(g->step, RUN_STEP, stats, "remat_step");
  if (s == REMAT_OK) /* once its kernels are measured (replan.h) */
    step_replan(g);
  graph_leave(g);
  return s;
}

static void free_accum(const compiled_step *c, step_state *st) {
  for (int32_t t = 0; st->accum != NULL && t < c->g->ntensors; t++)
    if (st->accum[t] != NULL) {
      int32_t grad = c->low.grad_buf[t];
      mem_free(&st->arena, st->accum[t], (size_t)c->low.bufs[grad].bytes,
               REMAT_MEM_GRADS, c->numa.home[grad], false);
    }
  free(st->accum);
  st->accum = NULL;
  st->accum_bytes = 0;
}

/* The sums of gradients of the micro-steps, one per parameter, beside its
 * gradient (same size and NUMA home), counted as gradients. */
static remat_status alloc_accum(const compiled_step *c, step_state *st) {
  if (st->accum != NULL)
    return REMAT_OK;
  int64_t sums = 0, budget = graph_memory_budget(c->g);
  for (int32_t i = 0; i < c->low.nknodes; i++)
    if (c->low.knodes[i].kind == KNODE_UPDATE)
      sums += mem_block_bytes(c->low.bufs[c->low.knodes[i].optim.grad].bytes);
  if (budget > 0 && c->predicted.peak + sums > budget)
    return remat__fail(REMAT_ERR_BUDGET,
                       "remat_accumulate: the gradient sums (%lld bytes) "
                       "would raise the predicted peak from %lld to %lld "
                       "bytes, over the memory budget of %lld bytes: compile "
                       "under a budget smaller by the sums, or raise it",
                       (long long)sums, (long long)c->predicted.peak,
                       (long long)(c->predicted.peak + sums),
                       (long long)budget);
  st->accum = remat__calloc((size_t)c->g->ntensors, sizeof *st->accum);
  bool ok = st->accum != NULL;
  for (int32_t i = 0; ok && i < c->low.nknodes; i++) {
    const plan_knode *kn = &c->low.knodes[i];
    if (kn->kind != KNODE_UPDATE)
      continue;
    int32_t grad = kn->optim.grad;
    int64_t bytes = c->low.bufs[grad].bytes;
    st->accum[kn->optim.param_tensor] =
        mem_alloc(&st->arena, (size_t)bytes, REMAT_MEM_GRADS,
                  c->numa.home[grad], false);
    ok = st->accum[kn->optim.param_tensor] != NULL;
    st->accum_bytes += ok ? mem_block_bytes(bytes) : 0;
  }
  if (ok)
    return REMAT_OK;
  free_accum(c, st);
  return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                     "remat_accumulate: out of memory for the gradient sums");
}

static remat_status do_accumulate(remat_graph *g, remat_step_stats *stats) {
  const compiled_step *c = &g->step->compiled;
  if (c->forward_only || !c->has_opt)
    return remat__fail(REMAT_ERR_STATE,
                       "remat_accumulate: the graph was compiled without %s: "
                       "accumulation sums gradients for an optimizer update",
                       c->forward_only ? "a loss" : "an optimizer");
  remat_status s = step_stats_check(stats, "remat_accumulate");
  if (s == REMAT_OK)
    s = alloc_accum(c, &g->step->state);
  if (s != REMAT_OK)
    return s;
  return run_step(g->step, RUN_ACCUMULATE, stats, "remat_accumulate");
}

remat_status remat_accumulate(remat_graph *g, remat_step_stats *stats) {
  remat_status s = enter_run(g, "remat_accumulate");
  if (s != REMAT_OK)
    return s;
  s = do_accumulate(g, stats);
  graph_leave(g);
  return s;
}

remat_status remat_forward(remat_graph *g, remat_step_stats *stats) {
  remat_status s = enter_run(g, "remat_forward");
  if (s != REMAT_OK)
    return s;
  if (!g->step->compiled.forward_only)
    s = remat__fail(REMAT_ERR_STATE,
                    "remat_forward: the graph was compiled for training: "
                    "compile a graph with loss NULL for inference");
  else
    s = run_step(g->step, RUN_FORWARD, stats, "remat_forward");
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
