/* Task names for traces (task_names.h): a node's tensor (an op's result,
 * or the parameter a check or update works on) prefixed by the name of the
 * nearest named region around it, then what the node does: nothing for a
 * forward kernel, "recompute", the gradient a backward kernel computes
 * ("dX", "dW", "backward"), "check" or "update". */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/task_names.h"

const char *task_names_layer(const remat_graph *g, int32_t r) {
  for (; r >= 0; r = g->regions[r].parent)
    if (g->regions[r].name[0] != '\0')
      return g->regions[r].name;
  return "";
}

/* What a backward kernel computes, from its name ("linear.dw"). */
static const char *backward_what(const char *kernel) {
  const char *dot = strrchr(kernel, '.');
  const char *what = dot != NULL ? dot + 1 : kernel;
  if (strcmp(what, "dw") == 0)
    return "dW";
  if (strcmp(what, "dx") == 0)
    return "dX";
  if (strcmp(what, "bwd") == 0)
    return "backward";
  return what;
}

static void node_name(const remat_graph *g, const plan_knode *kn, char *out) {
  const remat_tensor *t = NULL;
  const char *what = "";
  switch (kn->kind) {
  case KNODE_SEED:
    snprintf(out, TASK_NAME_MAX, "loss seed");
    return;
  case KNODE_GATE:
    snprintf(out, TASK_NAME_MAX, "optimizer gate");
    return;
  case KNODE_CHECK:
    what = " check";
    break;
  case KNODE_UPDATE:
    what = " update";
    break;
  case KNODE_RECOMPUTE:
    what = " recompute";
    break;
  case KNODE_BACKWARD:
    what = NULL;
    break;
  default:
    break;
  }
  if (kn->kind == KNODE_CHECK || kn->kind == KNODE_UPDATE)
    t = g->tensors[kn->optim.param_tensor];
  else
    t = g->tensors[g->ops[kn->op].out];
  const char *layer =
      t->kind == TENSOR_ACT ? task_names_layer(g, t->region) : "";
  size_t n = strlen(layer);
  bool prefixed =
      n == 0 || (strncmp(t->name, layer, n) == 0 && t->name[n] == '.');
  snprintf(out, TASK_NAME_MAX, "%s%s%s%s%s", prefixed ? "" : layer,
           prefixed ? "" : ".", t->name, what != NULL ? what : " ",
           what != NULL ? "" : backward_what(kn->kernel->name));
}

char *task_names_build(const remat_graph *g, const plan_lowering *l) {
  char *names = remat__malloc((size_t)(l->nknodes + 1) * TASK_NAME_MAX);
  for (int32_t i = 0; names != NULL && i < l->nknodes; i++)
    node_name(g, &l->knodes[i], names + (size_t)i * TASK_NAME_MAX);
  return names;
}
