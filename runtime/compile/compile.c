/* remat_compile: the compile pipeline, one stage after another. Each stage
 * is a function in its own file with its inputs and outputs in its
 * signature:
 *
 *   plan ops      graph ops            -> oneDNN primitives, kernels (plan_ops.c)
 *   plan remat    graph, policies,     -> saved or recomputed per tensor
 *                 budget                  (planner.c, measuring candidates
 *                                          through measure.c)
 *   lower         graph, decision      -> buffers, kernel nodes in program
 *                                          order, with autodiff (lower.c)
 *   lifetimes     lowering             -> first writer, users (lifetimes.c)
 *   NUMA          lowering, workers    -> each tile's node and affinity,
 *   placement     per node                per-node slices of buffers,
 *                                          remote bytes (numa_place.c)
 *   DAG           lowering, placement, -> task DAG (taskgraph.c)
 *                 lookahead
 *   persistent    lowering             -> parameters, moments, scratch
 *   allocation                            (persist.c), then the per-node
 *                                          copies of parameters
 *                                          (numa_place.c)
 *   memory        lowering             -> predicted peak, blocks to reserve
 *   prediction                            (memplan.c)
 *
 * then the report (report.c). On failure everything built so far is freed
 * and the error stays on the graph. */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/lifetimes.h"
#include "runtime/compile/persist.h"
#include "runtime/compile/plan_ops.h"
#include "runtime/compile/report.h"
#include "runtime/compile/taskgraph.h"

static bool optimizer_ok(const remat_optimizer *opt) {
  return (opt->kind == REMAT_OPT_SGD || opt->kind == REMAT_OPT_ADAMW) &&
         isfinite(opt->lr) && opt->lr > 0.0f && opt->beta1 >= 0.0f &&
         opt->beta1 < 1.0f && opt->beta2 >= 0.0f && opt->beta2 < 1.0f &&
         opt->eps >= 0.0f && opt->weight_decay >= 0.0f &&
         isfinite(opt->weight_decay);
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
  if (opt != NULL && !optimizer_ok(opt))
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_compile: optimizer is not valid: expected kind "
                      "REMAT_OPT_SGD or REMAT_OPT_ADAMW, lr > 0, betas in "
                      "[0,1), eps >= 0, weight_decay >= 0");
  return REMAT_OK;
}

/* The plan's fixed facts: loss, optimizer with its defaults filled in. */
static void set_target(remat_step_plan *p, remat_graph *g, remat_tensor *loss,
                       const remat_optimizer *opt) {
  p->g = g;
  p->loss = loss != NULL ? loss->id : -1;
  p->forward_only = loss == NULL;
  p->has_opt = opt != NULL && loss != NULL;
  if (!p->has_opt)
    return;
  p->opt = *opt;
  if (p->opt.beta1 == 0.0f && p->opt.beta2 == 0.0f) {
    p->opt.beta1 = 0.9f;
    p->opt.beta2 = 0.999f;
  }
  if (p->opt.eps == 0.0f)
    p->opt.eps = 1e-8f;
}

static remat_status run_stages(remat_step_plan *p) {
  remat_graph *g = p->g;
  int nworkers = g->rt->nworkers;
  const sched_placement *pl = sched_pool_placement(g->rt->pool);
  remat_status s = mem_arena_init(&p->arena, g->rt->topo, pl);
  if (s == REMAT_OK)
    s = plan_ops(g);
  if (s == REMAT_OK) {
    plan_target target = {g, p->loss, p->has_opt, p->opt.kind,
                          g->rt->config.memory_budget, nworkers,
                          pl->nnodes < 1 ? 1 : pl->nnodes};
    s = plan_remat(&target, &p->decision);
  }
  if (s == REMAT_OK) {
    lower_request req = {g, p->decision.saved, p->loss, p->has_opt,
                         p->opt.kind};
    s = lower_graph(&req, &p->low);
  }
  if (s == REMAT_OK)
    s = lifetimes_assign(&p->low);
  if (s == REMAT_OK)
    s = numa_place(p);
  if (s == REMAT_OK)
    s = taskgraph_build(p, g->rt->config.lookahead);
  if (s == REMAT_OK)
    s = persist_allocate(p);
  if (s == REMAT_OK)
    s = numa_place_copies(p);
  p->params_written = true; /* bf16 copies: made before the first run */
  if (s == REMAT_OK) {
    s = memplan_predict(g, &p->low, nworkers, p->numa.nnodes, &p->arena,
                        &p->predicted);
  }
  if (s == REMAT_OK)
    s = report_plan(p);
  return s;
}

remat_status remat_compile(remat_graph *g, remat_tensor *loss,
                           const remat_optimizer *opt) {
  remat_status s = check_compile_args(g, loss, opt);
  if (s != REMAT_OK)
    return s;
  remat_step_plan *p = remat__calloc(1, sizeof *p);
  if (p == NULL)
    return graph_fail(g, REMAT_ERR_OUT_OF_MEMORY,
                      "remat_compile: out of memory");
  g->plan = p;
  set_target(p, g, loss, opt);
  s = run_stages(p);
  if (s != REMAT_OK) {
    if (g->status == REMAT_OK)
      graph_fail(g, s, "remat_compile: %s",
                 s == REMAT_ERR_OUT_OF_MEMORY ? "out of memory"
                                              : remat_last_error());
    step_plan_destroy(g);
    return g->status;
  }
  g->compiled = true;
  return REMAT_OK;
}
