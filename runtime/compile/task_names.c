/* Task names for traces (task_names.h): a node's tensor (an op's result,
 * or the parameter a check or update works on) prefixed by the name of the
 * nearest named region around it, then what the node does: nothing for a
 * forward kernel, "recompute", the gradient a backward kernel computes
 * ("dX", "dW", "backward"), "check" or "update". */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/task_names.h"

/* Each kind's word, category, name when it has no kernel, and what a
 * trace's task name adds after the tensor (NULL: the backward kernel's
 * gradient; "": nothing), or the whole task name when it names no tensor. */
static const struct kind_names {
  const char *kind, *category, *kernel, *what, *whole;
} kinds[] = {
    [KNODE_FORWARD] = {"forward", "forward", NULL, "", NULL},
    [KNODE_SEED] = {"seed", "seed", "loss.seed", NULL, "loss seed"},
    [KNODE_BACKWARD] = {"backward", "backward", NULL, NULL, NULL},
    [KNODE_RECOMPUTE] = {"recompute", "recompute", NULL, " recompute", NULL},
    [KNODE_CHECK] = {"check", "optimizer", "optimizer.check", " check", NULL},
    [KNODE_GATE] = {"gate", "optimizer", "optimizer.gate", NULL,
                    "optimizer gate"},
    [KNODE_UPDATE] = {"update", "optimizer", "optimizer.update", " update",
                      NULL},
};

const char *task_names_kind(knode_kind kind) { return kinds[kind].kind; }

const char *task_names_category(knode_kind kind) {
  return kinds[kind].category;
}

const char *task_names_kernel(const plan_knode *kn) {
  return kn->kernel != NULL ? kn->kernel->name : kinds[kn->kind].kernel;
}

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
  const char *what = kinds[kn->kind].what;
  if (kinds[kn->kind].whole != NULL) {
    snprintf(out, TASK_NAME_MAX, "%s", kinds[kn->kind].whole);
    return;
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
