/* Stage "DAG" (taskgraph.h): from the kernel nodes in program order, the
 * dependency edges (read-after-write, write-after-read, write-after-write
 * on buffers), the memory-order edges that hold recompute back until
 * backward nears its region, the gate edges before the updates, and the
 * task DAG: a start task, one task per tile and a done task per node. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/dp/dp.h"
#include "runtime/compile/step_plan.h"
#include "runtime/compile/task_names.h"
#include "runtime/compile/taskgraph.h"
#include "runtime/exec/tasks.h"

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
  buf_state *st = remat__calloc((size_t)p->low.nbufs, sizeof *st);
  int32_t *mark = remat__malloc((size_t)p->low.nknodes * sizeof *mark);
  bool ok = st != NULL && mark != NULL;
  for (int32_t b = 0; ok && b < p->low.nbufs; b++)
    st[b].last_writer = -1;
  for (int32_t i = 0; ok && i < p->low.nknodes; i++)
    mark[i] = -1;
  for (int32_t i = 0; ok && i < p->low.nknodes; i++) {
    knode_use uses[PLAN_MAX_USES];
    int nuses = knode_uses(&p->low.knodes[i], uses);
    for (int j = 0; ok && j < nuses; j++) {
      buf_state *s = &st[uses[j].buf];
      bool writes = uses[j].writes;
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
    for (int j = 0; ok && j < nuses; j++) {
      buf_state *s = &st[uses[j].buf];
      if (uses[j].writes) {
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
  for (int32_t b = 0; st != NULL && b < p->low.nbufs; b++)
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
static bool memory_order_edges(remat_step_plan *p, int lookahead,
                               edge_list *e) {
  int32_t nreg = p->g->nregions;
  int32_t *last_bwd = remat__malloc(((size_t)nreg + 1) * sizeof *last_bwd);
  if (last_bwd == NULL)
    return false;
  int32_t seed = -1;
  for (int32_t r = 0; r < nreg; r++)
    last_bwd[r] = -1;
  for (int32_t i = 0; i < p->low.nknodes; i++) {
    plan_knode *kn = &p->low.knodes[i];
    if (kn->kind == KNODE_SEED)
      seed = i;
    if (kn->kind == KNODE_BACKWARD && kn->region >= 0)
      last_bwd[kn->region] = i;
  }
  bool ok = true;
  for (int32_t i = 0; ok && i < p->low.nknodes; i++) {
    plan_knode *kn = &p->low.knodes[i];
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
  for (int32_t i = 0; i < p->low.nknodes && gate < 0; i++)
    if (p->low.knodes[i].kind == KNODE_GATE)
      gate = i;
  bool ok = true;
  for (int32_t i = 0; gate >= 0 && ok && i < p->low.nknodes; i++) {
    if (p->low.knodes[i].kind == KNODE_UPDATE)
      ok = push_edge(e, gate, i);
    else if (i != gate)
      ok = push_edge(e, i, gate);
  }
  return ok;
}

/* ---- tasks ---- */

/* Priority is program order, earliest first: one worker then runs the
 * nodes exactly in program order, the order memplan.c predicts, and more
 * workers never let a later node starve an earlier one. A tile's affinity
 * is the one the NUMA placement stage gave it (numa_place.c). */
static remat_status add_tasks(remat_step_plan *p) {
  p->task_names = task_names_build(p->g, &p->low);
  if (p->task_names == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  int64_t ntiles = 0;
  for (int32_t i = 0; i < p->low.nknodes; i++)
    ntiles += p->low.knodes[i].tiles;
  p->tiles = remat__malloc((size_t)ntiles * sizeof *p->tiles);
  if (p->tiles == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  p->ntiles = ntiles;
  int64_t next = 0;
  for (int32_t i = 0; i < p->low.nknodes; i++) {
    plan_knode *kn = &p->low.knodes[i];
    kn->plan = p;
    /* kernel names ("linear.fwd"): the scheduler's messages and the
     * simulator's cost groups; traces use p->task_names */
    const char *name = task_names_kernel(kn);
    const char *cat = task_names_category(kn->kind);
    kn->start_task = sched_dag_add(p->dag, tasks_start, kn, -i, -1, name, cat);
    kn->done_task = sched_dag_add(p->dag, tasks_done, kn, -i, -1, name, cat);
    if (kn->start_task < 0 || kn->done_task < 0)
      return (remat_status)(kn->start_task < 0 ? -kn->start_task : -kn->done_task);
    for (int64_t t = 0; t < kn->tiles; t++) {
      plan_tile *tile = &p->tiles[next++];
      tile->kn = kn;
      tile->tile = t;
      int node = p->numa.affinity[next - 1];
      int32_t id = sched_dag_add(p->dag, tasks_tile, tile, -i, node, name, cat);
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

remat_status taskgraph_build(remat_step_plan *p, int lookahead) {
  char err[SCHED_ERRMSG_MAX];
  remat_status s = sched_dag_create(&p->dag, err);
  if (s != REMAT_OK)
    return remat__fail_msg(s, err);
  if ((s = add_tasks(p)) != REMAT_OK)
    return remat__fail(s, "remat_compile: cannot build the task graph");
  edge_list e = {0};
  bool ok = data_edges(p, &e) && memory_order_edges(p, lookahead, &e) && gate_edges(p, &e);
  for (int64_t i = 0; ok && i < e.n; i++)
    ok = sched_dag_edge(p->dag, p->low.knodes[e.from[i]].done_task,
                        p->low.knodes[e.to[i]].start_task) == REMAT_OK;
  free(e.from);
  free(e.to);
  if (!ok)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "remat_compile: out of memory adding task edges");
  if ((s = dp_add_tasks(p)) != REMAT_OK)
    return s;
  if ((s = sched_dag_finalize(p->dag, err)) != REMAT_OK)
    return remat__fail_msg(s, err);
  return REMAT_OK;
}
