/* Re-planning a graph between its own steps (replan.h): the compile
 * pipeline from "plan remat" on with the runtime's cost table as its
 * first steps left it, a new step state for the new plan, and what the
 * old state held that outlives a step copied over, buffer by buffer,
 * matched by what each buffer holds (a tensor's value or gradient, a
 * parameter's moment), since buffer numbers differ between plans. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/report.h"
#include "runtime/dp/dp.h"
#include "runtime/exec/replan.h"
#include "runtime/exec/tasks.h"

/* AdamW's moment buffers of each parameter tensor: [2 * ntensors], -1
 * where none. */
static int32_t *moment_bufs(const compiled_step *c) {
  int32_t n = c->g->ntensors;
  int32_t *m = remat__malloc(2 * ((size_t)n + 1) * sizeof *m);
  for (int32_t t = 0; m != NULL && t < 2 * n; t++)
    m[t] = -1;
  for (int32_t i = 0; m != NULL && i < c->low.nknodes; i++) {
    const plan_knode *kn = &c->low.knodes[i];
    if (kn->kind != KNODE_UPDATE)
      continue;
    m[2 * kn->optim.param_tensor] = kn->optim.adam_m;
    m[2 * kn->optim.param_tensor + 1] = kn->optim.adam_v;
  }
  return m;
}

/* The buffer of `to` that holds what buffer b of `from` holds: -1 when
 * none does or b lives only within a step. */
static int32_t same_buffer(const compiled_step *from, const int32_t *from_m,
                           const compiled_step *to, const int32_t *to_m,
                           int32_t b) {
  const plan_buffer *buf = &from->low.bufs[b];
  if (!buf->persistent)
    return -1;
  for (int32_t t = 0; t < from->g->ntensors; t++) {
    if (from->low.value_buf[t] == b)
      return to->low.value_buf[t];
    if (from->low.grad_buf[t] == b)
      return to->low.grad_buf[t];
    if (from->low.copy_buf[t] == b)
      return to->low.copy_buf[t];
    if (from_m[2 * t] == b)
      return to_m[2 * t];
    if (from_m[2 * t + 1] == b)
      return to_m[2 * t + 1];
  }
  return -1;
}

/* Every buffer that outlives a step, from the state of `from` into that
 * of `to`: false (nothing usable in `to`) when one has no match of its
 * size, which the lowering's plan-independent buffers rule out. */
static bool copy_buffers(const compiled_step *from, const step_state *fs,
                         const compiled_step *to, step_state *ts) {
  int32_t *from_m = moment_bufs(from), *to_m = moment_bufs(to);
  bool ok = from_m != NULL && to_m != NULL;
  for (int32_t b = 0; ok && b < from->low.nbufs; b++) {
    if (!from->low.bufs[b].persistent)
      continue;
    int32_t nb = same_buffer(from, from_m, to, to_m, b);
    ok = nb >= 0 && to->low.bufs[nb].persistent &&
         to->low.bufs[nb].bytes == from->low.bufs[b].bytes;
    if (ok)
      memcpy(ts->data[nb], fs->data[b], (size_t)from->low.bufs[b].bytes);
  }
  free(from_m);
  free(to_m);
  return ok;
}

/* The counters and settings of a state, and its trace's file. */
static void carry_state(step_state *from, step_state *to) {
  to->lr = from->lr;
  to->clip = from->clip;
  to->opt_step = from->opt_step;
  to->rng_step = from->rng_step;
  to->grad_norm = from->grad_norm;
  to->grad_scale = from->grad_scale;
  to->last = from->last;
  to->reported_run = from->reported_run;
  to->params_written = true; /* per-node and bf16 copies remade */
  to->cost_runs = from->cost_runs;
  free(to->cost_records); /* measuring is over */
  to->cost_records = NULL;
  to->replanned = true;
  step_trace_move(&to->trace, &from->trace);
}

/* Only a budget's plan follows the cost table (fixed policies decide by
 * kind and name). A call that recorded a failure already (a trace not
 * written) keeps its words: the re-plan waits for a later step. */
static bool due(const remat_graph *g) {
  const step_state *st = &g->step->state;
  return graph_memory_budget(g) > 0 &&
         remat__fail_count() == g->enter_fails && !st->replanned &&
         !g->rt->no_replan && !g->rt->roofline_costs &&
         st->cost_runs >= COST_STEPS &&
         st->dp == NULL && !g->step->compiled.forward_only;
}

/* The new step and its state, or NULL with *why: REMAT_ERR_STATE when
 * the plan did not change, another status when the re-plan failed (the
 * thread's last error has the words). */
static graph_step *build(remat_graph *g, remat_status *why) {
  const compiled_step *old = &g->step->compiled;
  graph_step *gs = remat__calloc(1, sizeof *gs);
  *why = REMAT_ERR_OUT_OF_MEMORY;
  if (gs == NULL)
    return NULL;
  compile_request req = {g, old->loss, old->has_opt ? &old->opt : NULL,
                         &remat__task_bodies, 0};
  /* a graph that accumulated keeps room for its sums under the budget */
  remat_status s = compile_replan(&req, old, g->step->state.accum_bytes,
                                  &gs->compiled);
  if (s == REMAT_OK) {
    s = step_state_create(&gs->compiled, &gs->state);
    if (s != REMAT_OK)
      compiled_step_free(&gs->compiled);
  }
  if (s == REMAT_OK &&
      !copy_buffers(old, &g->step->state, &gs->compiled, &gs->state)) {
    step_state_free(&gs->compiled, &gs->state);
    compiled_step_free(&gs->compiled);
    s = remat__fail(REMAT_ERR_OUT_OF_MEMORY, "a buffer of the step has no "
                    "match in the new plan, or no memory to match them");
  }
  *why = s;
  if (s == REMAT_OK)
    return gs;
  free(gs);
  return NULL;
}

bool step_replan(remat_graph *g) {
  if (!due(g))
    return false;
  remat_status why;
  graph_step *old = g->step, *gs = build(g, &why);
  old->state.replanned = true;
  report_replan(&(gs != NULL ? gs : old)->compiled, why,
                remat_last_error());
  if (gs == NULL) { /* the step that ran succeeded: nothing to report */
    remat__clear_error();
    g->enter_fails = remat__fail_count();
    return false;
  }
  carry_state(&old->state, &gs->state);
  gs->retired = old->compiled.decision; /* its names stay valid */
  memset(&old->compiled.decision, 0, sizeof old->compiled.decision);
  decision_free(&old->retired);
  step_state_free(&old->compiled, &old->state);
  compiled_step_free(&old->compiled);
  free(old);
  g->step = gs;
  return true;
}
