/* remat_compile: the compile pipeline (compile/compiled.h) builds the
 * compiled step, then the step state that runs change is made for it
 * (step_state.h), and the data-parallel state when the graph has one
 * (dp.h). They live together on the graph until it is destroyed. */
#include <math.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "runtime/dp/dp.h"
#include "runtime/exec/tasks.h"

static bool optimizer_ok(const remat_optimizer *opt) {
  return (opt->kind == REMAT_OPT_SGD || opt->kind == REMAT_OPT_ADAMW) &&
         isfinite(opt->lr) && opt->lr > 0.0f && opt->beta1 >= 0.0f &&
         opt->beta1 < 1.0f && opt->beta2 >= 0.0f && opt->beta2 < 1.0f &&
         opt->eps >= 0.0f && isfinite(opt->eps) &&
         opt->weight_decay >= 0.0f && isfinite(opt->weight_decay);
}

/* A graph whose every parameter is frozen has nothing to train: an
 * optimizer is refused, a loss alone (evaluation) and no loss (forward)
 * are not. */
static remat_status check_trainable(remat_graph *g, const remat_tensor *loss,
                                    const remat_optimizer *opt) {
  int nparams = 0, nfrozen = 0;
  for (int32_t t = 0; t < g->ntensors; t++) {
    nparams += g->tensors[t]->kind == TENSOR_PARAM;
    nfrozen += g->tensors[t]->frozen;
  }
  if (opt != NULL && loss != NULL && nparams > 0 && nfrozen == nparams)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_compile: all %d parameters are frozen "
                      "(remat_param_freeze), so the optimizer has nothing to "
                      "update: compile with loss NULL for remat_forward, or "
                      "with a loss and no optimizer to evaluate the loss "
                      "with remat_step",
                      nparams);
  return REMAT_OK;
}

static remat_status check_compile_args(remat_graph *g,
                                       const remat_tensor *loss,
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
                      "REMAT_OPT_SGD or REMAT_OPT_ADAMW, a finite lr > 0, "
                      "betas in [0,1), a finite eps >= 0 and a finite "
                      "weight_decay >= 0");
  return check_trainable(g, loss, opt);
}
remat_status remat_compile(remat_graph *g, const remat_tensor *loss,
                           const remat_optimizer *opt) {
  remat_status s = check_compile_args(g, loss, opt);
  if (s != REMAT_OK)
    return s;
  graph_step *gs = remat__calloc(1, sizeof *gs);
  if (gs == NULL)
    return graph_fail(g, REMAT_ERR_OUT_OF_MEMORY,
                      "remat_compile: out of memory");
  compile_request req = {g, loss != NULL ? loss->id : -1, opt,
                         &remat__task_bodies, dp_bucket_bytes(g)};
  s = compile_step(&req, &gs->compiled);
  if (s == REMAT_OK)
    s = step_state_create(&gs->compiled, &gs->state);
  if (s == REMAT_OK) {
    s = dp_state_create(&gs->compiled, &gs->state, &gs->state.dp);
    if (s != REMAT_OK)
      step_state_free(&gs->compiled, &gs->state);
  }
  if (s != REMAT_OK) {
    if (g->status == REMAT_OK)
      graph_fail(g, s, "remat_compile: %s",
                 s == REMAT_ERR_OUT_OF_MEMORY ? "out of memory"
                                              : remat_last_error());
    compiled_step_free(&gs->compiled); /* (zeroed when compile failed) */
    free(gs);
    return g->status;
  }
  g->step = gs;
  g->compiled = true;
  return REMAT_OK;
}

void graph_step_destroy(remat_graph *g) {
  graph_step *gs = g->step;
  if (gs == NULL)
    return;
  dp_plan_free(gs->state.dp);
  step_state_free(&gs->compiled, &gs->state);
  compiled_step_free(&gs->compiled);
  decision_free(&gs->retired);
  free(gs);
  g->step = NULL;
}
