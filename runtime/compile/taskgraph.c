/* Stage "DAG" (taskgraph.h): from the kernel nodes in program order, the
 * dependency edges (read-after-write, write-after-read, write-after-write
 * on buffers), the memory-order edges that hold recompute back until
 * backward nears its region, the gate edges before the updates, and the
 * task DAG: a start task, one task per tile and a done task per node. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/task_names.h"
#include "runtime/compile/taskgraph.h"

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
static bool data_edges(const taskgraph_request *r, edge_list *e) {
  buf_state *st = remat__calloc((size_t)r->low->nbufs, sizeof *st);
  int32_t *mark = remat__malloc((size_t)r->low->nknodes * sizeof *mark);
  bool ok = st != NULL && mark != NULL;
  for (int32_t b = 0; ok && b < r->low->nbufs; b++)
    st[b].last_writer = -1;
  for (int32_t i = 0; ok && i < r->low->nknodes; i++)
    mark[i] = -1;
  for (int32_t i = 0; ok && i < r->low->nknodes; i++) {
    knode_use uses[PLAN_MAX_USES];
    int nuses = knode_uses(&r->low->knodes[i], uses);
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
  for (int32_t b = 0; st != NULL && b < r->low->nbufs; b++)
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
static bool memory_order_edges(const taskgraph_request *r, int lookahead,
                               edge_list *e) {
  int32_t nreg = r->g->nregions;
  int32_t *last_bwd = remat__malloc(((size_t)nreg + 1) * sizeof *last_bwd);
  if (last_bwd == NULL)
    return false;
  int32_t seed = -1;
  for (int32_t r = 0; r < nreg; r++)
    last_bwd[r] = -1;
  for (int32_t i = 0; i < r->low->nknodes; i++) {
    const plan_knode *kn = &r->low->knodes[i];
    if (kn->kind == KNODE_SEED)
      seed = i;
    if (kn->kind == KNODE_BACKWARD && kn->region >= 0)
      last_bwd[kn->region] = i;
  }
  bool ok = true;
  for (int32_t i = 0; ok && i < r->low->nknodes; i++) {
    const plan_knode *kn = &r->low->knodes[i];
    if (kn->kind != KNODE_RECOMPUTE)
      continue;
    int32_t gate = seed;
    int ahead = 0;
    for (int32_t k = kn->region + 1; k < nreg; k++) {
      if (r->g->regions[k].parent != -1 || last_bwd[k] < 0)
        continue;
      if (++ahead == lookahead) {
        gate = last_bwd[k];
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
static bool gate_edges(const taskgraph_request *r, edge_list *e) {
  int32_t gate = -1;
  for (int32_t i = 0; i < r->low->nknodes && gate < 0; i++)
    if (r->low->knodes[i].kind == KNODE_GATE)
      gate = i;
  bool ok = true;
  for (int32_t i = 0; gate >= 0 && ok && i < r->low->nknodes; i++) {
    if (r->low->knodes[i].kind == KNODE_UPDATE)
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
static remat_status add_tasks(const taskgraph_request *r, plan_tasks *t) {
  const plan_lowering *low = r->low;
  t->names = task_names_build(r->g, low);
  int32_t nk = low->nknodes;
  t->start_task = remat__malloc(((size_t)nk + 1) * sizeof *t->start_task);
  t->done_task = remat__malloc(((size_t)nk + 1) * sizeof *t->done_task);
  t->ntiles = r->numa->ntiles;
  t->tiles = remat__malloc(((size_t)t->ntiles + 1) * sizeof *t->tiles);
  if (t->names == NULL || t->start_task == NULL || t->done_task == NULL ||
      t->tiles == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  int64_t next = 0;
  for (int32_t i = 0; i < nk; i++) {
    const plan_knode *kn = &low->knodes[i];
    /* kernel names ("linear.fwd"): the scheduler's messages and the
     * simulator's cost groups; traces use t->names */
    const char *name = task_names_kernel(kn);
    const char *cat = task_names_category(kn->kind);
    void *arg = (void *)kn; /* the bodies take it back as const */
    t->start_task[i] =
        sched_dag_add(t->dag, r->bodies->start, arg, -i, -1, name, cat);
    t->done_task[i] =
        sched_dag_add(t->dag, r->bodies->done, arg, -i, -1, name, cat);
    if (t->start_task[i] < 0 || t->done_task[i] < 0)
      return (remat_status)(t->start_task[i] < 0 ? -t->start_task[i]
                                                 : -t->done_task[i]);
    for (int64_t k = 0; k < kn->tiles; k++) {
      plan_tile *tile = &t->tiles[next];
      *tile = (plan_tile){kn, i, k};
      int node = r->numa->affinity[next++];
      int32_t id =
          sched_dag_add(t->dag, r->bodies->tile, tile, -i, node, name, cat);
      if (id < 0)
        return (remat_status)-id;
      remat_status s = sched_dag_edge(t->dag, t->start_task[i], id);
      if (s == REMAT_OK)
        s = sched_dag_edge(t->dag, id, t->done_task[i]);
      if (s != REMAT_OK)
        return s;
    }
  }
  return REMAT_OK;
}

/* ---- memory admission ---- */

/* The transient bytes node kn allocates when it starts, as the arena and
 * memplan.c count them. */
static int64_t start_bytes(const plan_lowering *low, const plan_knode *kn) {
  int64_t bytes = 0;
  for (int k = 0; k < kn->ninit; k++)
    if (!low->bufs[kn->init[k]].persistent)
      bytes += mem_block_bytes(low->bufs[kn->init[k]].bytes);
  return bytes;
}

/* Every start task that allocates waits for memory admission, ranked in
 * program order (a run under a budget bounds the bytes they hold: step.c).
 * Why that always progresses: every edge goes from a node to a later one
 * in program order. When node k's start is next to admit, every start
 * before it was admitted, so every node before k can finish with no more
 * admission; once they have, the bytes held are those of buffers that
 * nodes before k allocated and a node from k on still uses, which is what
 * program order holds when k starts, less k's own: k fits in any bound at
 * or above the predicted transient peak. A start that allocates nothing
 * only ever frees, so it needs no admission. */
static remat_status admit_starts(const plan_lowering *low, plan_tasks *t) {
  remat_status s = REMAT_OK;
  for (int32_t i = 0; s == REMAT_OK && i < low->nknodes; i++) {
    int64_t bytes = start_bytes(low, &low->knodes[i]);
    if (bytes > 0)
      s = sched_dag_set_admit(t->dag, t->start_task[i], bytes);
  }
  return s;
}

static remat_status build(const taskgraph_request *r, plan_tasks *t) {
  char err[SCHED_ERRMSG_MAX];
  remat_status s = sched_dag_create(&t->dag, err);
  if (s != REMAT_OK)
    return remat__fail_msg(s, err);
  if ((s = add_tasks(r, t)) != REMAT_OK || (s = admit_starts(r->low, t)))
    return remat__fail(s, "remat_compile: cannot build the task graph");
  edge_list e = {0};
  bool ok = data_edges(r, &e) && memory_order_edges(r, r->lookahead, &e) &&
            gate_edges(r, &e);
  for (int64_t i = 0; ok && i < e.n; i++)
    ok = sched_dag_edge(t->dag, t->done_task[e.from[i]],
                        t->start_task[e.to[i]]) == REMAT_OK;
  free(e.from);
  free(e.to);
  if (!ok)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "remat_compile: out of memory adding task edges");
  return REMAT_OK;
}

remat_status taskgraph_build(const taskgraph_request *r, plan_tasks *out) {
  memset(out, 0, sizeof *out);
  remat_status s = build(r, out);
  if (s != REMAT_OK)
    plan_tasks_free(out);
  return s;
}

remat_status taskgraph_finalize(plan_tasks *t) {
  char err[SCHED_ERRMSG_MAX];
  remat_status s = sched_dag_finalize(t->dag, err);
  return s == REMAT_OK ? s : remat__fail_msg(s, err);
}

void plan_tasks_free(plan_tasks *t) {
  if (t->dag != NULL)
    sched_dag_destroy(t->dag);
  free(t->tiles);
  free(t->start_task);
  free(t->done_task);
  free(t->names);
  memset(t, 0, sizeof *t);
}
