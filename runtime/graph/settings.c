/* A graph's own settings that override the runtime's defaults for it
 * alone: its default remat policy and its memory budget, set before
 * remat_compile and read by the compile, the step's memory admission and
 * remat_accumulate's gradient sums. */
#include <stdlib.h>

#include "runtime/internal.h"

/* Checks that g may still take a setting; the status to return when not
 * (after compile only the call fails: graph_fail keeps a compiled graph's
 * status). */
static remat_status settable(remat_graph *g, const char *what,
                             const char *why) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "%s: graph is NULL", what);
  if (g->status != REMAT_OK)
    return g->status;
  if (g->compiled)
    return graph_fail(g, REMAT_ERR_STATE,
                      "%s: the graph is already compiled, and its remat "
                      "plan was made %s: set it before remat_compile",
                      what, why);
  return REMAT_OK;
}

remat_status remat_graph_set_policy(remat_graph *g,
                                    const remat_policy *policy) {
  const char *what = "remat_graph_set_policy";
  remat_status s = settable(g, what, "with the default policy it had");
  if (s != REMAT_OK)
    return s;
  char *text = NULL;
  if (policy != NULL) {
    size_t len = REMAT_MAX_POLICY_LENGTH + 1;
    char *buf = remat__malloc(len);
    if (buf == NULL)
      return graph_fail(g, REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    s = remat_policy_format(policy, buf, len);
    text = s == REMAT_OK ? remat__strdup(buf) : NULL;
    free(buf);
    if (s != REMAT_OK) /* constructors keep every policy within the limit */
      return graph_fail(g, s, "%s: %s", what, remat_last_error());
    if (text == NULL)
      return graph_fail(g, REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  }
  free(g->policy);
  g->policy = text;
  return REMAT_OK;
}

remat_status remat_graph_set_memory_budget(remat_graph *g, int64_t bytes) {
  const char *what = "remat_graph_set_memory_budget";
  remat_status s = settable(g, what, "under the budget it had");
  if (s != REMAT_OK)
    return s;
  if (bytes < REMAT_RUNTIME_BUDGET)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "%s: bytes is %lld: expected a budget in bytes, 0 for "
                      "none, or REMAT_RUNTIME_BUDGET (-1) for the runtime's",
                      what, (long long)bytes);
  g->own_budget = bytes != REMAT_RUNTIME_BUDGET;
  g->budget = g->own_budget ? bytes : 0;
  return REMAT_OK;
}

const char *graph_default_policy(const remat_graph *g) {
  return g->policy != NULL ? g->policy : g->rt->config.policy;
}

int64_t graph_memory_budget(const remat_graph *g) {
  return g->own_budget ? g->budget : g->rt->config.memory_budget;
}

const char *graph_budget_origin(const remat_graph *g) {
  return g->own_budget ? "remat_graph_set_memory_budget"
                       : "REMAT_MEMORY_BUDGET or remat_config.memory_budget";
}
