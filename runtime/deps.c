/* Compile, part two: from the kernel nodes in program order, derives which
 * node allocates and which frees each buffer, the dependency edges
 * (read-after-write, write-after-read, write-after-write), the memory-order
 * edges that hold recompute back until backward nears its region, and the
 * task DAG: a start task, one task per tile and a done task per node. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/plan.h"

/* Slots a node writes: from its kernel, or fixed for seed and update. */
static uint32_t node_writes(const plan_knode *kn) {
  switch (kn->kind) {
  case KNODE_SEED: return OP_SLOT_OUT;
  case KNODE_UPDATE: return OP_SLOT_IN(0) | OP_SLOT_AUX(0) | OP_SLOT_AUX(1);
  case KNODE_CHECK:
  case KNODE_GATE: return 0;
  default: return kn->kernel->writes;
  }
}

static bool node_writes_buf(const plan_knode *kn, int32_t b) {
  uint32_t w = node_writes(kn);
  for (int s = 0; s < PLAN_SLOTS; s++)
    if ((w & (1u << s)) && kn->slot_buf[s] == b)
      return true;
  return false;
}

/* Distinct buffers of a node, and user counts. */
static remat_status collect_touch(remat_step_plan *p) {
  for (int32_t i = 0; i < p->nknodes; i++) {
    plan_knode *kn = &p->knodes[i];
    kn->touch = remat__malloc(PLAN_SLOTS * sizeof *kn->touch);
    kn->init = remat__malloc(PLAN_SLOTS * sizeof *kn->init);
    if (kn->touch == NULL || kn->init == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
    for (int s = 0; s < PLAN_SLOTS; s++) {
      int32_t b = kn->slot_buf[s];
      bool seen = b < 0;
      for (int j = 0; j < kn->ntouch && !seen; j++)
        seen = kn->touch[j] == b;
      if (!seen) {
        kn->touch[kn->ntouch++] = b;
        p->bufs[b].users++;
      }
    }
  }
  return REMAT_OK;
}

/* Gradient buffers written by several nodes are zero-filled by the first
 * and accumulated into by all; the first writer of a transient buffer
 * allocates it. */
static remat_status assign_init(remat_step_plan *p) {
  int32_t *writers = remat__calloc((size_t)p->nbufs, sizeof *writers);
  int32_t *first = remat__malloc((size_t)p->nbufs * sizeof *first);
  if (writers == NULL || first == NULL) {
    free(writers);
    free(first);
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  for (int32_t b = 0; b < p->nbufs; b++)
    first[b] = -1;
  for (int32_t i = 0; i < p->nknodes; i++)
    for (int j = 0; j < p->knodes[i].ntouch; j++) {
      int32_t b = p->knodes[i].touch[j];
      if (node_writes_buf(&p->knodes[i], b)) {
        writers[b]++;
        if (first[b] < 0)
          first[b] = i;
      }
    }
  for (int32_t b = 0; b < p->nbufs; b++) {
    plan_buffer *buf = &p->bufs[b];
    buf->first_writer = first[b];
    buf->zero_fill = writers[b] > 1 && (buf->cat == REMAT_MEM_GRADS ||
                                        buf->cat == REMAT_MEM_ACT_GRADS);
    if (first[b] >= 0 && (!buf->persistent || buf->zero_fill)) {
      plan_knode *kn = &p->knodes[first[b]];
      kn->init[kn->ninit++] = b;
    }
  }
  for (int32_t i = 0; i < p->nknodes; i++) {
    plan_knode *kn = &p->knodes[i];
    for (int k = 0; k < OP_MAX_IN; k++) {
      int32_t b = kn->slot_buf[plan_slot(OP_SLOT_DIN(k))];
      kn->bufs.din_accumulate[k] = b >= 0 && p->bufs[b].zero_fill;
    }
  }
  free(writers);
  free(first);
  return REMAT_OK;
}

/* ---- edges between nodes ---- */

typedef struct edge_list {
  int32_t *from, *to;
  int64_t n, cap;
} edge_list;

static bool push_edge(edge_list *e, int32_t from, int32_t to) {
  if (e->n == e->cap) {
    int64_t cap = e->cap ? 2 * e->cap : 1024;
    int32_t *f = remat__realloc(e->from, (size_t)cap * sizeof *f);
    if (f == NULL)
      return false;
    e->from = f;
    int32_t *t = remat__realloc(e->to, (size_t)cap * sizeof *t);
    if (t == NULL)
      return false;
    e->to = t;
    e->cap = cap;
  }
  e->from[e->n] = from;
  e->to[e->n++] = to;
  return true;
}

typedef struct buf_state {
  int32_t last_writer;
  int32_t *readers;
  int nreaders, cap;
} buf_state;

/* Data edges from program order. `mark` dedupes sources per target. */
static bool data_edges(remat_step_plan *p, edge_list *e) {
  buf_state *st = remat__calloc((size_t)p->nbufs, sizeof *st);
  int32_t *mark = remat__malloc((size_t)p->nknodes * sizeof *mark);
  bool ok = st != NULL && mark != NULL;
  for (int32_t b = 0; ok && b < p->nbufs; b++)
    st[b].last_writer = -1;
  for (int32_t i = 0; ok && i < p->nknodes; i++)
    mark[i] = -1;
  for (int32_t i = 0; ok && i < p->nknodes; i++) {
    plan_knode *kn = &p->knodes[i];
    for (int j = 0; ok && j < kn->ntouch; j++) {
      buf_state *s = &st[kn->touch[j]];
      bool writes = node_writes_buf(kn, kn->touch[j]);
      int32_t w = s->last_writer;
      if (w >= 0 && mark[w] != i) {
        mark[w] = i;
        ok = push_edge(e, w, i);
      }
      for (int r = 0; writes && ok && r < s->nreaders; r++)
        if (mark[s->readers[r]] != i) {
          mark[s->readers[r]] = i;
          ok = push_edge(e, s->readers[r], i);
        }
    }
    for (int j = 0; ok && j < kn->ntouch; j++) {
      buf_state *s = &st[kn->touch[j]];
      if (node_writes_buf(kn, kn->touch[j])) {
        s->last_writer = i;
        s->nreaders = 0;
      } else {
        if (s->nreaders == s->cap) {
          int cap = s->cap ? 2 * s->cap : 4;
          int32_t *r = remat__realloc(s->readers, (size_t)cap * sizeof *r);
          if (r == NULL) {
            ok = false;
            break;
          }
          s->readers = r;
          s->cap = cap;
        }
        s->readers[s->nreaders++] = i;
      }
    }
  }
  for (int32_t b = 0; st != NULL && b < p->nbufs; b++)
    free(st[b].readers);
  free(st);
  free(mark);
  return ok;
}

/* Recompute nodes of top-level region k wait for the last backward node of
 * region k + lookahead (or for the seed when there is none): by then that
 * region's recomputed tensors are being freed, so at most `lookahead`
 * regions of recomputed tensors are alive at once. (Waiting only for the
 * first backward node of region k + 1 let idle workers recompute region k
 * while region k + 1's tensors were all still alive: measured on the
 * default GPT at 2 threads, the same step time and 1.5x the activation
 * peak.) */
static bool memory_order_edges(remat_step_plan *p, edge_list *e) {
  int lookahead = p->g->rt->config.lookahead;
  int32_t nreg = p->g->nregions;
  int32_t *last_bwd = remat__malloc(((size_t)nreg + 1) * sizeof *last_bwd);
  if (last_bwd == NULL)
    return false;
  int32_t seed = -1;
  for (int32_t r = 0; r < nreg; r++)
    last_bwd[r] = -1;
  for (int32_t i = 0; i < p->nknodes; i++) {
    plan_knode *kn = &p->knodes[i];
    if (kn->kind == KNODE_SEED)
      seed = i;
    if (kn->kind == KNODE_BACKWARD && kn->region >= 0)
      last_bwd[kn->region] = i;
  }
  bool ok = true;
  for (int32_t i = 0; ok && i < p->nknodes; i++) {
    plan_knode *kn = &p->knodes[i];
    if (kn->kind != KNODE_RECOMPUTE)
      continue;
    int32_t gate = seed;
    int ahead = 0;
    for (int32_t r = kn->region + 1; r < nreg; r++) {
      if (p->g->regions[r].parent != -1 || last_bwd[r] < 0)
        continue;
      if (++ahead == lookahead) {
        gate = last_bwd[r];
        break;
      }
    }
    if (gate >= 0 && gate < i)
      ok = push_edge(e, gate, i);
  }
  free(last_bwd);
  return ok;
}

/* Every other node before the gate (so every allocation of the step has
 * succeeded and every gradient is checked), the gate before every update:
 * a step that fails or finds a NaN changes no parameter. */
static bool gate_edges(remat_step_plan *p, edge_list *e) {
  int32_t gate = -1;
  for (int32_t i = 0; i < p->nknodes && gate < 0; i++)
    if (p->knodes[i].kind == KNODE_GATE)
      gate = i;
  bool ok = true;
  for (int32_t i = 0; gate >= 0 && ok && i < p->nknodes; i++) {
    if (p->knodes[i].kind == KNODE_UPDATE)
      ok = push_edge(e, gate, i);
    else if (i != gate)
      ok = push_edge(e, i, gate);
  }
  return ok;
}

/* ---- tasks ---- */

static const char *node_category(const plan_knode *kn) {
  switch (kn->kind) {
  case KNODE_FORWARD: return "forward";
  case KNODE_SEED: return "seed";
  case KNODE_BACKWARD: return "backward";
  case KNODE_RECOMPUTE: return "recompute";
  default: return "update";
  }
}

static const char *node_name(const plan_knode *kn) {
  if (kn->kernel != NULL)
    return kn->kernel->name;
  switch (kn->kind) {
  case KNODE_SEED: return "loss.seed";
  case KNODE_CHECK: return "optimizer.check";
  case KNODE_GATE: return "optimizer.gate";
  default: return "optimizer.update";
  }
}

/* Priority is program order, earliest first: one worker then runs the
 * nodes exactly in program order, the order memplan.c predicts, and more
 * workers never let a later node starve an earlier one. */
static remat_status add_tasks(remat_step_plan *p) {
  int64_t ntiles = 0;
  for (int32_t i = 0; i < p->nknodes; i++)
    ntiles += p->knodes[i].tiles;
  p->tiles = remat__malloc((size_t)ntiles * sizeof *p->tiles);
  if (p->tiles == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  p->ntiles = ntiles;
  int64_t next = 0;
  for (int32_t i = 0; i < p->nknodes; i++) {
    plan_knode *kn = &p->knodes[i];
    kn->plan = p;
    const char *name = node_name(kn), *cat = node_category(kn);
    kn->start_task = sched_dag_add(p->dag, plan_start_task, kn, -i, -1, name, cat);
    kn->done_task = sched_dag_add(p->dag, plan_done_task, kn, -i, -1, name, cat);
    if (kn->start_task < 0 || kn->done_task < 0)
      return (remat_status)(kn->start_task < 0 ? -kn->start_task : -kn->done_task);
    for (int64_t t = 0; t < kn->tiles; t++) {
      plan_tile *tile = &p->tiles[next++];
      tile->kn = kn;
      tile->tile = t;
      int32_t id = sched_dag_add(p->dag, plan_tile_task, tile, -i, -1, name, cat);
      if (id < 0)
        return (remat_status)-id;
      remat_status s = sched_dag_edge(p->dag, kn->start_task, id);
      if (s == REMAT_OK)
        s = sched_dag_edge(p->dag, id, kn->done_task);
      if (s != REMAT_OK)
        return s;
    }
  }
  return REMAT_OK;
}

remat_status plan_lifetimes(remat_step_plan *p) {
  remat_status s = collect_touch(p);
  if (s == REMAT_OK)
    s = assign_init(p);
  for (int32_t i = 0; s == REMAT_OK && i < p->nknodes; i++) {
    plan_knode *kn = &p->knodes[i];
    if (kn->kind == KNODE_RECOMPUTE)
      p->recompute_flops += kn->flops;
    else if (kn->kind == KNODE_FORWARD || kn->kind == KNODE_BACKWARD)
      p->flops += kn->flops;
  }
  return s;
}

remat_status plan_build_dag(remat_step_plan *p) {
  char err[SCHED_ERRMSG_MAX];
  remat_status s = sched_dag_create(&p->dag, err);
  if (s != REMAT_OK)
    return remat__fail_msg(s, err);
  if ((s = add_tasks(p)) != REMAT_OK)
    return remat__fail(s, "remat_compile: cannot build the task graph");
  edge_list e = {0};
  bool ok = data_edges(p, &e) && memory_order_edges(p, &e) && gate_edges(p, &e);
  for (int64_t i = 0; ok && i < e.n; i++)
    ok = sched_dag_edge(p->dag, p->knodes[e.from[i]].done_task,
                        p->knodes[e.to[i]].start_task) == REMAT_OK;
  free(e.from);
  free(e.to);
  if (!ok)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "remat_compile: out of memory adding task edges");
  if ((s = sched_dag_finalize(p->dag, err)) != REMAT_OK)
    return remat__fail_msg(s, err);
  return REMAT_OK;
}
