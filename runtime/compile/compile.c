/* The compile pipeline (compiled.h): each stage in its own file, in
 * order, each with its inputs and outputs in its signature, filling one
 * compiled step that no one changes once this returns (the public
 * remat_compile, in exec/prepare.c, checks the arguments first and makes
 * the step state after). On failure everything built so far is freed and
 * the error stays on the graph. */
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/compiled.h"
#include "runtime/compile/lifetimes.h"
#include "runtime/compile/memcheck.h"
#include "runtime/compile/plan_ops.h"
#include "runtime/compile/report.h"

/* The step's fixed facts: loss, optimizer with its defaults filled in. */
static void set_target(compiled_step *c, const compile_request *req) {
  c->g = req->g;
  c->loss = req->loss;
  c->forward_only = req->loss < 0;
  c->has_opt = req->opt != NULL && req->loss >= 0;
  c->nworkers = req->g->rt->nworkers;
  if (!c->has_opt)
    return;
  c->opt = *req->opt;
  if (c->opt.beta1 == 0.0f && c->opt.beta2 == 0.0f) {
    c->opt.beta1 = 0.9f;
    c->opt.beta2 = 0.999f;
  }
  if (c->opt.eps == 0.0f)
    c->opt.eps = 1e-8f;
}

/* Stage "plan remat" for the step c is compiled for, under the graph's
 * budget less `held` bytes (when it has one). */
static remat_status plan_stage(const compile_request *req,
                               const compiled_step *c, int64_t held,
                               remat_decision *out) {
  remat_graph *g = req->g;
  const sched_placement *pl = sched_pool_placement(g->rt->pool);
  plan_target target = {g, c->loss, c->has_opt, c->opt.kind,
                        graph_default_policy(g),
                        graph_memory_budget(g) > 0
                            ? graph_memory_budget(g) - held : 0,
                        c->nworkers, pl->nnodes < 1 ? 1 : pl->nnodes,
                        g->rt->roofline_costs ? NULL : &g->rt->costs,
                        g->rt->config.lookahead,
                        !g->rt->roofline_costs && c->nworkers > 1, 0, 0};
  return plan_remat(&target, out);
}

/* The stages after "plan remat", from c->decision on. */
static remat_status build_stages(const compile_request *req,
                                 compiled_step *c) {
  remat_graph *g = req->g;
  const sched_placement *pl = sched_pool_placement(g->rt->pool);
  lower_request lr = {g, c->decision.saved, c->loss, c->has_opt,
                      c->opt.kind};
  remat_status s = lower_graph(&lr, &c->low);
  if (s == REMAT_OK)
    s = lifetimes_assign(&c->low);
  if (s == REMAT_OK)
    s = numa_place(g, &c->low, pl, &c->numa);
  if (s == REMAT_OK) {
    taskgraph_request tr = {g, &c->low, &c->numa, g->rt->config.lookahead,
                            req->bodies};
    s = taskgraph_build(&tr, &c->tasks);
  }
  if (s == REMAT_OK && req->dp_bucket_bytes > 0 && !c->forward_only) {
    dp_layout_request dr = {g, &c->low, &c->tasks, req->dp_bucket_bytes,
                            req->bodies->dp_bucket, req->bodies->dp_agree};
    s = dp_layout_build(&dr, c->tasks.dag, &c->dp);
  }
  if (s == REMAT_OK)
    s = taskgraph_finalize(&c->tasks);
  if (s == REMAT_OK)
    s = memplan_predict(g, &c->low, &c->numa, c->nworkers, &c->predicted);
  if (s == REMAT_OK) /* the data-parallel buckets live in the arena too */
    c->predicted.peak += dp_layout_bytes(&c->dp);
  if (s == REMAT_OK && graph_memory_budget(g) <= 0) {
    mem_room room = memcheck_room(); /* a budget makes the plan fit it */
    s = memcheck_fit(g, c->predicted.peak, &room);
  }
  if (s == REMAT_OK)
    s = report_plan(c);
  return s;
}

static remat_status run_stages(const compile_request *req, compiled_step *c) {
  remat_status s = plan_ops(req->g);
  if (s == REMAT_OK)
    s = plan_fusions(req->g, c->loss);
  if (s == REMAT_OK)
    s = plan_stage(req, c, 0, &c->decision);
  return s == REMAT_OK ? build_stages(req, c) : s;
}

remat_status compile_step(const compile_request *req, compiled_step *out) {
  remat_graph *g = req->g;
  memset(out, 0, sizeof *out);
  out->dp.agree_task = -1;
  set_target(out, req);
  remat_status s = run_stages(req, out);
  if (s == REMAT_OK)
    return REMAT_OK;
  if (g->status == REMAT_OK)
    graph_fail(g, s, "remat_compile: %s",
               s == REMAT_ERR_OUT_OF_MEMORY ? "out of memory"
                                            : remat_last_error());
  compiled_step_free(out);
  return g->status;
}

void compiled_step_free(compiled_step *c) {
  plan_dp_free(&c->dp);
  plan_tasks_free(&c->tasks);
  numa_plan_free(&c->numa);
  memplan_prediction_free(&c->predicted);
  lowering_free(&c->low);
  decision_free(&c->decision);
  memset(c, 0, sizeof *c);
}

static bool same_saved(const remat_graph *g, const remat_decision *a,
                       const remat_decision *b) {
  for (int32_t t = 0; t < g->ntensors; t++)
    if (a->saved[t] != b->saved[t])
      return false;
  return true;
}

remat_status compile_replan(const compile_request *req,
                            const compiled_step *current, int64_t held,
                            compiled_step *out) {
  memset(out, 0, sizeof *out);
  out->dp.agree_task = -1;
  set_target(out, req);
  out->opt = current->opt; /* its defaults are filled in already */
  remat_status s = graph_memory_budget(req->g) > 0 &&
                           graph_memory_budget(req->g) <= held
                       ? remat__fail(REMAT_ERR_BUDGET, "no budget is left")
                       : plan_stage(req, out, held, &out->decision);
  if (s == REMAT_OK && same_saved(req->g, &out->decision, &current->decision))
    s = REMAT_ERR_STATE; /* nothing changes: not an error to report */
  else if (s == REMAT_OK)
    s = build_stages(req, out);
  if (s != REMAT_OK)
    compiled_step_free(out);
  return s;
}
