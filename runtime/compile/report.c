/* The plan's summary: per top-level region the bytes saved and recomputed
 * and the recompute FLOPs (kept for remat_step_stats and tests), and what
 * REMAT_VERBOSE prints to stderr: 1, the plan per region with the policy
 * each region got and why, and the named tensors saved and recomputed,
 * then after the first run the measured peak beside the predicted one;
 * 2, a table of every kernel node too, under a line naming its columns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/report.h"
#include "runtime/compile/task_names.h"

/* Per top-level region: bytes of activations kept for backward, bytes
 * recomputed, and recompute FLOPs. */
static remat_status region_stats(remat_step_plan *p) {
  remat_graph *g = p->g;
  p->region_stats = remat__calloc((size_t)g->nregions + 1, sizeof *p->region_stats);
  if (p->region_stats == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t t = 0; t < g->ntensors; t++) {
    remat_tensor *x = g->tensors[t];
    if (x->kind != TENSOR_ACT || x->region < 0)
      continue;
    plan_region_stats *rs = &p->region_stats[g->regions[x->region].top];
    if (p->low.recomp_buf[t] >= 0)
      rs->recomputed_bytes += tensor_store_bytes(x);
    else if (p->decision.saved[t] && !p->forward_only)
      rs->saved_bytes += tensor_store_bytes(x);
  }
  for (int32_t i = 0; i < p->low.nknodes; i++)
    if (p->low.knodes[i].kind == KNODE_RECOMPUTE && p->low.knodes[i].region >= 0)
      p->region_stats[p->low.knodes[i].region].recompute_flops += p->low.knodes[i].flops;
  return REMAT_OK;
}

static double mib(int64_t bytes) { return (double)bytes / 1048576.0; }

/* A name as messages show it (base/error.h's quoting). */
static void print_text(const char *s) {
  fputs(remat__quote(&(remat__quoted){0}, s), stderr);
}

/* A tensor's name as traces show it: prefixed by its layer, the nearest
 * named region around it ("h3.attn_probs"). */
static void print_tensor(const remat_graph *g, const remat_tensor *x) {
  const char *layer = task_names_layer(g, x->region);
  size_t n = strlen(layer);
  if (n > 0 && !(strncmp(x->name, layer, n) == 0 && x->name[n] == '.')) {
    print_text(layer);
    fputc('.', stderr);
  }
  print_text(x->name);
}

/* Why region r has its policy. */
static void print_source(const remat_step_plan *p, int32_t r) {
  int64_t budget = p->g->rt->config.memory_budget;
  switch (p->decision.source[r]) {
  case REGION_OWN:
    fprintf(stderr, "its own");
    break;
  case REGION_DEFAULT:
    fprintf(stderr, "the default, REMAT_POLICY");
    break;
  default:
    if (budget > 0)
      fprintf(stderr,
              "auto: of the policies whose plan fits the memory budget of "
              "%.2f MiB, the one with the least recompute; predicted peak "
              "%.2f MiB",
              mib(budget), mib(p->predicted.peak));
    else
      fprintf(stderr, "auto without a memory budget: the least recompute");
    break;
  }
}

/* The named tensors region r decided, saved (want_saved) or recomputed. */
static void print_names(const remat_step_plan *p, int32_t r, bool want_saved) {
  const remat_graph *g = p->g;
  int printed = 0;
  for (int32_t t = 0; t < g->ntensors; t++) {
    const remat_tensor *x = g->tensors[t];
    if (!x->named || p->decision.deciding_region[t] != r)
      continue;
    bool saved = p->decision.saved[t];
    bool recomputed = p->low.recomp_buf[t] >= 0;
    if ((want_saved && !saved) || (!want_saved && !recomputed))
      continue;
    fprintf(stderr, "%s", printed++ ? ", " : " ");
    print_tensor(g, x);
  }
  fprintf(stderr, "%s\n", printed ? "" : " (none)");
}

/* One region: its name, its policy and why, its bytes and FLOPs
 * (top-level regions), and the named tensors it saves and recomputes. */
static void print_region(const remat_step_plan *p, int32_t r) {
  const remat_graph *g = p->g;
  const graph_region *reg = &g->regions[r];
  fprintf(stderr, "  region %d", r);
  if (reg->name[0] != '\0') {
    fprintf(stderr, " '");
    print_text(reg->name);
    fputc('\'', stderr);
  }
  fprintf(stderr, "%s: policy %s (", reg->parent == -1 ? "" : " (nested)",
          p->decision.region_policy[r]);
  print_source(p, r);
  fprintf(stderr, ")\n");
  if (reg->parent == -1) {
    const plan_region_stats *rs = &p->region_stats[r];
    fprintf(stderr,
            "    saved %.2f MiB, recomputed %.2f MiB, recompute %.3f GFLOP\n",
            mib(rs->saved_bytes), mib(rs->recomputed_bytes),
            rs->recompute_flops * 1e-9);
  }
  fprintf(stderr, "    saved:");
  print_names(p, r, true);
  fprintf(stderr, "    recomputed:");
  print_names(p, r, false);
}

/* Level 2: a table of the kernel nodes under a line naming its columns. */
static void print_nodes(const remat_step_plan *p) {
  fprintf(stderr, "  %5s  %-9s  %6s  %6s  %-22s  %s\n", "node", "kind",
          "region", "tiles", "kernel", "task");
  for (int32_t i = 0; i < p->low.nknodes; i++) {
    const plan_knode *kn = &p->low.knodes[i];
    fprintf(stderr, "  %5d  %-9s  %6d  %6lld  %-22s  ", i, task_names_kind(kn->kind),
            kn->region, (long long)kn->tiles,
            kn->kernel ? kn->kernel->name : "(runtime)");
    print_text(p->task_names + (size_t)i * TASK_NAME_MAX);
    fputc('\n', stderr);
  }
}

remat_status report_plan(remat_step_plan *p) {
  if (region_stats(p) != REMAT_OK)
    return REMAT_ERR_OUT_OF_MEMORY;
  remat_graph *g = p->g;
  if (g->rt->config.verbose < 1)
    return REMAT_OK;
  fprintf(stderr,
          "remat plan: %d ops, %d kernel nodes, %d tasks, %d regions, %s\n",
          g->nops, p->low.nknodes, sched_dag_num_tasks(p->dag), g->nregions,
          g->rt->config.precision == REMAT_PRECISION_BF16
              ? "bf16 (activations in bf16, f32 master weights)"
              : "f32");
  for (int32_t r = 0; r < g->nregions; r++)
    print_region(p, r);
  fprintf(stderr,
          "  model %.3f GFLOP, recompute %.3f GFLOP, predicted peak %.2f MiB "
          "(activations %.2f MiB)\n",
          p->low.flops * 1e-9, p->low.recompute_flops * 1e-9,
          mib(p->predicted.peak), mib(p->predicted.transient_peak));
  if (g->rt->config.verbose >= 2)
    print_nodes(p);
  return REMAT_OK;
}

void report_first_run(remat_step_plan *p, const remat_step_stats *st,
                      const char *what) {
  if (p->reported_run || p->g->rt->config.verbose < 1)
    return;
  p->reported_run = true;
  fprintf(stderr,
          "remat: first %s: measured peak %.2f MiB (activations %.2f MiB), "
          "predicted %.2f MiB (activations %.2f MiB)\n",
          what, mib(st->peak_bytes), mib(st->activation_peak_bytes),
          mib(st->predicted_peak_bytes), mib(p->predicted.transient_peak));
}
