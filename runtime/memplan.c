/* The memory plan: the step's predicted peak bytes, from walking the kernel
 * nodes in program order with each buffer allocated at its first writer and
 * freed after its last user, and the plan summary that REMAT_VERBOSE=1
 * prints (per region saved and recomputed bytes and recompute FLOPs). */
#include <stdio.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "runtime/plan.h"

static int64_t rounded(int64_t bytes) { return (bytes + 63) / 64 * 64; }

int64_t memplan_persistent_bytes(const remat_step_plan *p) {
  int64_t bytes = 0;
  for (int32_t b = 0; b < p->nbufs; b++)
    if (p->bufs[b].persistent)
      bytes += rounded(p->bufs[b].bytes);
  size_t scratch = 0;
  for (int32_t o = 0; o < p->g->nops; o++)
    if (p->g->ops[o].inst.scratch_bytes > scratch)
      scratch = p->g->ops[o].inst.scratch_bytes;
  if (scratch > 0)
    bytes += rounded(rounded((int64_t)scratch) * p->g->rt->nworkers);
  return bytes;
}

/* Walks program order: a node's buffers are allocated when it starts, and a
 * buffer is freed when its last user is done. Returns the peak transient
 * bytes; live[i] gets the transient bytes while node i runs. */
static int64_t simulate_transient(const remat_step_plan *p, int64_t *live) {
  int32_t *left = remat__malloc(((size_t)p->nbufs + 1) * sizeof *left);
  if (left == NULL)
    return -1;
  for (int32_t b = 0; b < p->nbufs; b++)
    left[b] = p->bufs[b].users;
  int64_t cur = 0, peak = 0;
  for (int32_t i = 0; i < p->nknodes; i++) {
    const plan_knode *kn = &p->knodes[i];
    for (int k = 0; k < kn->ninit; k++)
      if (!p->bufs[kn->init[k]].persistent)
        cur += rounded(p->bufs[kn->init[k]].bytes);
    if (live != NULL)
      live[i] = cur;
    if (cur > peak)
      peak = cur;
    for (int k = 0; k < kn->ntouch; k++) {
      const plan_buffer *b = &p->bufs[kn->touch[k]];
      if (!b->persistent && --left[kn->touch[k]] == 0)
        cur -= rounded(b->bytes);
    }
  }
  free(left);
  return peak;
}

int64_t memplan_simulate(const remat_step_plan *p, int64_t *live) {
  int64_t transient = simulate_transient(p, live);
  return transient < 0 ? -1 : memplan_persistent_bytes(p) + transient;
}

typedef struct size_count {
  int64_t bytes, live, high;
} size_count;

static size_count *count_for(size_count *c, int *n, int64_t bytes) {
  for (int i = 0; i < *n; i++)
    if (c[i].bytes == bytes)
      return &c[i];
  c[*n] = (size_count){bytes, 0, 0};
  return &c[(*n)++];
}

/* Tells the arena how many blocks of each size program order holds at once,
 * so that the first step's blocks are reserved before it runs. */
static remat_status expect_blocks(remat_step_plan *p) {
  size_count *c = remat__calloc((size_t)p->nbufs + 1, sizeof *c);
  int32_t *left = remat__malloc(((size_t)p->nbufs + 1) * sizeof *left);
  remat_status s = c && left ? REMAT_OK : REMAT_ERR_OUT_OF_MEMORY;
  int n = 0;
  for (int32_t b = 0; s == REMAT_OK && b < p->nbufs; b++)
    left[b] = p->bufs[b].users;
  for (int32_t i = 0; s == REMAT_OK && i < p->nknodes; i++) {
    const plan_knode *kn = &p->knodes[i];
    for (int k = 0; k < kn->ninit; k++) {
      const plan_buffer *b = &p->bufs[kn->init[k]];
      if (b->persistent)
        continue;
      size_count *sc = count_for(c, &n, rounded(b->bytes));
      if (++sc->live > sc->high)
        sc->high = sc->live;
    }
    for (int k = 0; k < kn->ntouch; k++) {
      const plan_buffer *b = &p->bufs[kn->touch[k]];
      if (!b->persistent && --left[kn->touch[k]] == 0)
        count_for(c, &n, rounded(b->bytes))->live--;
    }
  }
  for (int i = 0; s == REMAT_OK && i < n; i++)
    s = mem_expect(&p->arena, (size_t)c[i].bytes, c[i].high, 0);
  free(c);
  free(left);
  return s;
}

remat_status memplan_predict(remat_step_plan *p) {
  remat_status s = expect_blocks(p);
  if (s != REMAT_OK)
    return s;
  p->predicted_transient_peak = simulate_transient(p, NULL);
  if (p->predicted_transient_peak < 0)
    return REMAT_ERR_OUT_OF_MEMORY;
  p->predicted_peak = memplan_persistent_bytes(p) + p->predicted_transient_peak;
  return REMAT_OK;
}

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
    if (p->recomp_buf[t] >= 0)
      rs->recomputed_bytes += tensor_bytes(x);
    else if (p->saved[t] && !p->forward_only)
      rs->saved_bytes += tensor_bytes(x);
  }
  for (int32_t i = 0; i < p->nknodes; i++)
    if (p->knodes[i].kind == KNODE_RECOMPUTE && p->knodes[i].region >= 0)
      p->region_stats[p->knodes[i].region].recompute_flops += p->knodes[i].flops;
  return REMAT_OK;
}

remat_status plan_report(remat_step_plan *p) {
  if (region_stats(p) != REMAT_OK)
    return REMAT_ERR_OUT_OF_MEMORY;
  remat_graph *g = p->g;
  if (g->rt->config.verbose < 1)
    return REMAT_OK;
  fprintf(stderr, "remat plan: %d ops, %d kernel nodes, %d tasks, %d regions\n",
          g->nops, p->nknodes, sched_dag_num_tasks(p->dag), g->nregions);
  for (int32_t r = 0; r < g->nregions; r++) {
    if (g->regions[r].parent != -1)
      continue;
    plan_region_stats *rs = &p->region_stats[r];
    fprintf(stderr,
            "  region %d: saved %.2f MiB, recomputed %.2f MiB, recompute "
            "%.3f GFLOP\n",
            r, (double)rs->saved_bytes / 1048576.0,
            (double)rs->recomputed_bytes / 1048576.0,
            rs->recompute_flops * 1e-9);
  }
  fprintf(stderr,
          "  model %.3f GFLOP, recompute %.3f GFLOP, predicted peak %.2f MiB "
          "(activations %.2f MiB)\n",
          p->flops * 1e-9, p->recompute_flops * 1e-9,
          (double)p->predicted_peak / 1048576.0,
          (double)p->predicted_transient_peak / 1048576.0);
  if (g->rt->config.verbose < 2)
    return REMAT_OK;
  for (int32_t i = 0; i < p->nknodes; i++) {
    plan_knode *kn = &p->knodes[i];
    fprintf(stderr, "  node %d: %s kind %d region %d tiles %lld\n", i,
            kn->kernel ? kn->kernel->name : "(runtime)", (int)kn->kind,
            kn->region, (long long)kn->tiles);
  }
  return REMAT_OK;
}
