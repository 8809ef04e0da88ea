/* What REMAT_VERBOSE prints to stderr about a compiled step: 1, a line
 * naming the graph (training, gradients or inference, its loss, optimizer
 * and parameters), the decision per region (the policy each region got and
 * where it came from, per top-level region the bytes saved and recomputed
 * and the recompute FLOPs, and every tensor saved and recomputed: by name,
 * or by producer for one never named), then after the first run the
 * measured peak beside the predicted one; 2, a table of every kernel node
 * too, under a line naming its columns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/report.h"
#include "runtime/compile/task_names.h"

typedef struct plan_region_stats {
  int64_t saved_bytes, recomputed_bytes;
  double recompute_flops;
} plan_region_stats;

/* What the plan does with activation t between forward and backward. */
typedef enum tensor_fate {
  FATE_NONE,
  FATE_SAVED,
  FATE_RECOMPUTED,
  FATE_FUSED /* a linear's output that a fused kernel never stores */
} tensor_fate;

static tensor_fate fate_of(const compiled_step *c, int32_t t) {
  if (c->g->tensors[t]->kind != TENSOR_ACT)
    return FATE_NONE;
  if (c->low.recomp_buf[t] >= 0)
    return FATE_RECOMPUTED;
  if (c->low.bufs[c->low.value_buf[t]].users == 0)
    return FATE_FUSED;
  return c->decision.saved[t] && !c->forward_only ? FATE_SAVED : FATE_NONE;
}

/* Whether region r lists activation t: a top-level region every one
 * inside it (so that its list and its bytes count the same tensors), a
 * nested one those its policy decided. */
static bool region_lists(const compiled_step *c, int32_t r, int32_t t) {
  const remat_graph *g = c->g;
  const remat_tensor *x = g->tensors[t];
  if (g->regions[r].parent == -1)
    return x->region >= 0 && g->regions[x->region].top == r;
  return c->decision.deciding_region[t] == r;
}

/* Per top-level region: bytes of activations kept for backward, bytes
 * recomputed, and recompute FLOPs. */
static remat_status region_stats(const compiled_step *c,
                                 plan_region_stats **out) {
  const remat_graph *g = c->g;
  plan_region_stats *stats =
      remat__calloc((size_t)g->nregions + 1, sizeof *stats);
  if (stats == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t t = 0; t < g->ntensors; t++) {
    const remat_tensor *x = g->tensors[t];
    if (x->region < 0)
      continue;
    plan_region_stats *rs = &stats[g->regions[x->region].top];
    tensor_fate fate = fate_of(c, t);
    if (fate == FATE_RECOMPUTED)
      rs->recomputed_bytes += tensor_store_bytes(x);
    else if (fate == FATE_SAVED)
      rs->saved_bytes += tensor_store_bytes(x);
  }
  for (int32_t i = 0; i < c->low.nknodes; i++)
    if (c->low.knodes[i].kind == KNODE_RECOMPUTE && c->low.knodes[i].region >= 0)
      stats[c->low.knodes[i].region].recompute_flops += c->low.knodes[i].flops;
  *out = stats;
  return REMAT_OK;
}

static double mib(int64_t bytes) { return (double)bytes / 1048576.0; }

/* A name as messages show it (base/error.h's quoting). */
static void print_text(const char *s) {
  fputs(remat__quote(&(remat__quoted){0}, s), stderr);
}

/* A tensor's name as traces show it: prefixed by its layer, the nearest
 * named region around it ("h3.attn_probs"); one never named
 * (remat_checkpoint_name) by its producer, the op's kind and index
 * ("h0.linear#3"). */
static void print_tensor(const remat_graph *g, const remat_tensor *x) {
  const char *layer = task_names_layer(g, x->region);
  size_t n = strlen(layer);
  if (n > 0 && !(strncmp(x->name, layer, n) == 0 && x->name[n] == '.')) {
    print_text(layer);
    fputc('.', stderr);
  }
  if (x->named || x->producer < 0)
    print_text(x->name);
  else
    fprintf(stderr, "%s#%d", op_name(g->ops[x->producer].desc.type),
            (int)x->producer);
}

/* Where g's default policy came from: remat_graph_set_policy when set,
 * else the runtime's, which is the built-in default unless it lies in the
 * runtime's strings, where REMAT_POLICY and remat_config.policy are
 * copied; of those, the environment's when it holds that policy
 * (remat_config.policy overrides it, so a policy there that differs from
 * REMAT_POLICY is the program's; the same one given both ways reads as the
 * environment's). */
static const char *default_source(const remat_graph *g) {
  const remat_runtime *rt = g->rt;
  if (g->policy != NULL)
    return "the graph's default, from remat_graph_set_policy";
  if (rt->config.policy != rt->strings.policy)
    return "the runtime's default, as neither remat_config.policy nor "
           "REMAT_POLICY is set";
  const char *env = getenv("REMAT_POLICY");
  if (!(rt->config.set & REMAT_SET_NO_ENV) && env != NULL &&
      strcmp(env, rt->config.policy) == 0)
    return "the runtime's default, from REMAT_POLICY";
  return "the runtime's default, from remat_config.policy";
}

/* Why region r has its policy. */
static void print_source(const compiled_step *c, int32_t r) {
  int64_t budget = graph_memory_budget(c->g);
  switch (c->decision.source[r]) {
  case REGION_OWN:
    fprintf(stderr, "its own, given to remat_region_begin");
    break;
  case REGION_DEFAULT:
    fprintf(stderr, "%s", default_source(c->g));
    break;
  default:
    if (budget > 0)
      fprintf(stderr,
              "auto: of the plans (policies and per-tensor sets) that fit "
              "the memory budget of %.2f MiB, the one with the least "
              "recompute cost; predicted peak %.2f MiB",
              mib(budget), mib(c->predicted.peak));
    else
      fprintf(stderr, "auto without a memory budget: the least recompute");
    break;
  }
}

/* The tensors region r lists (region_lists) of one fate, after `label`;
 * "(none)" when there are none, or no line at all when `optional`. */
static void print_names(const compiled_step *c, int32_t r, tensor_fate want,
                        const char *label, bool optional) {
  const remat_graph *g = c->g;
  int printed = 0;
  for (int32_t t = 0; t < g->ntensors; t++) {
    if (!region_lists(c, r, t) || fate_of(c, t) != want)
      continue;
    if (printed++ == 0)
      fprintf(stderr, "%s ", label);
    else
      fputs(", ", stderr);
    print_tensor(g, g->tensors[t]);
  }
  if (printed)
    fprintf(stderr, "\n");
  else if (!optional)
    fprintf(stderr, "%s (none)\n", label);
}

/* One region: its name, its policy and why, its bytes and FLOPs
 * (top-level regions), and the named tensors it saves and recomputes. */
static void print_region(const compiled_step *c,
                         const plan_region_stats *stats, int32_t r) {
  const remat_graph *g = c->g;
  const graph_region *reg = &g->regions[r];
  fprintf(stderr, "  region %d", r);
  if (reg->name[0] != '\0') {
    fprintf(stderr, " '");
    print_text(reg->name);
    fputc('\'', stderr);
  }
  fprintf(stderr, "%s: policy %s (", reg->parent == -1 ? "" : " (nested)",
          c->decision.region_policy[r]);
  print_source(c, r);
  fprintf(stderr, ")\n");
  if (reg->parent == -1) {
    const plan_region_stats *rs = &stats[r];
    fprintf(stderr,
            "    saved %.2f MiB, recomputed %.2f MiB, recompute %.3f GFLOP\n",
            mib(rs->saved_bytes), mib(rs->recomputed_bytes),
            rs->recompute_flops * 1e-9);
  }
  print_names(c, r, FATE_SAVED, "    saved:", false);
  print_names(c, r, FATE_RECOMPUTED, "    recomputed:", false);
  print_names(c, r, FATE_FUSED, "    fused, never stored:", true);
}

/* Level 2: a table of the kernel nodes under a line naming its columns. */
static void print_nodes(const compiled_step *c) {
  fprintf(stderr, "  %5s  %-9s  %6s  %6s  %-22s  %s\n", "node", "kind",
          "region", "tiles", "kernel", "task");
  for (int32_t i = 0; i < c->low.nknodes; i++) {
    const plan_knode *kn = &c->low.knodes[i];
    fprintf(stderr, "  %5d  %-9s  %6d  %6lld  %-22s  ", i, task_names_kind(kn->kind),
            kn->region, (long long)kn->tiles,
            kn->kernel ? kn->kernel->name : "(runtime)");
    print_text(c->tasks.names + (size_t)i * TASK_NAME_MAX);
    fputc('\n', stderr);
  }
}

/* The line that opens a plan: which graph it is ("remat plan of a
 * training graph (loss cross_entropy#40, adamw, 12
 * parameters):"), so that the plans
 * of a program's graphs (training, then evaluation) tell apart. */
static void print_graph(const compiled_step *c) {
  const remat_graph *g = c->g;
  static const char *const optimizers[] = {"sgd", "adamw"};
  if (c->forward_only) {
    fprintf(stderr, "remat plan of an inference graph (forward only, ");
  } else {
    fprintf(stderr, "remat plan of a %s graph (loss ",
            c->has_opt ? "training" : "gradient");
    print_tensor(g, g->tensors[c->loss]);
    fprintf(stderr, ", %s, ",
            c->has_opt ? optimizers[c->opt.kind] : "no optimizer");
  }
  int params = 0; /* (counted here: graph.c calls into compile) */
  for (int32_t t = 0; t < g->ntensors; t++)
    params += g->tensors[t]->kind == TENSOR_PARAM;
  fprintf(stderr, "%d parameters):\n", params);
}

remat_status report_plan(const compiled_step *c) {
  const remat_graph *g = c->g;
  plan_region_stats *stats = NULL;
  if (g->rt->config.verbose < 1)
    return REMAT_OK;
  if (region_stats(c, &stats) != REMAT_OK)
    return REMAT_ERR_OUT_OF_MEMORY;
  print_graph(c);
  fprintf(stderr,
          "  %d ops, %d kernel nodes, %d tasks, %d regions, %s\n",
          g->nops, c->low.nknodes, sched_dag_num_tasks(c->tasks.dag), g->nregions,
          g->rt->config.precision == REMAT_PRECISION_BF16
              ? "bf16 (activations in bf16, f32 master weights)"
              : "f32");
  for (int32_t r = 0; r < g->nregions; r++)
    print_region(c, stats, r);
  free(stats);
  fprintf(stderr,
          "  model %.3f GFLOP, recompute %.3f GFLOP, predicted peak %.2f MiB "
          "(activations %.2f MiB)\n",
          c->low.flops * 1e-9, c->low.recompute_flops * 1e-9,
          mib(c->predicted.peak), mib(c->predicted.transient_peak));
  if (g->rt->config.verbose >= 2)
    print_nodes(c);
  return REMAT_OK;
}

void report_first_run(const compiled_step *c, const remat_step_stats *st,
                      const char *what) {
  if (c->g->rt->config.verbose < 1)
    return;
  fprintf(stderr,
          "remat: first %s: measured peak %.2f MiB (activations %.2f MiB), "
          "predicted %.2f MiB (activations %.2f MiB)\n",
          what, mib(st->peak_bytes), mib(st->activation_peak_bytes),
          mib(st->predicted_peak_bytes), mib(c->predicted.transient_peak));
}

void report_replan(const compiled_step *c, remat_status status,
                   const char *error) {
  if (c->g->rt->config.verbose < 1)
    return;
  if (status == REMAT_OK)
    fprintf(stderr, "remat: planned again with the kernel times its first "
            "%d steps measured: the plan above runs from the next step on\n",
            COST_STEPS);
  else if (status == REMAT_ERR_STATE)
    fprintf(stderr, "remat: planned again with the kernel times its first "
            "%d steps measured: the same tensors are saved, the compiled "
            "plan stays\n", COST_STEPS);
  else
    fprintf(stderr, "remat: planning again with the kernel times its first "
            "%d steps measured failed (%s): the compiled plan stays\n",
            COST_STEPS, error);
}
