/* The placement model (sim_placement.h): affinities, where each task's
 * bytes live, and the DAG with reducing tiles split per node. */
#include <stdlib.h>
#include <string.h>

#include "benchmarks/sim/sim_footprint.h"
#include "benchmarks/sim/sim_placement.h"

/* Row fractions where each node's slice of buffer b starts: node n holds
 * [bound[n], bound[n + 1]), as the runtime's placement slices it. */
static void slice_bounds(const sim_layout *l, int32_t b, double *bound) {
  const numa_plan *p = &l->numa;
  int64_t bytes = l->step->c->low.bufs[b].bytes;
  for (int n = 0; n <= l->nodes; n++) {
    int64_t lo = n == 0 ? 0
                 : n == l->nodes ? bytes
                                 : p->slice_end[(int64_t)b * p->nnodes + n - 1];
    bound[n] = bytes > 0 ? (double)lo / (double)bytes : (double)n / l->nodes;
  }
}

/* Adds `bytes` spread over rows [lo, hi) of buffer b to the nodes that
 * hold those rows. */
static void spread(const sim_layout *l, int32_t b, double bytes, double lo,
                   double hi, float *out) {
  int nodes = l->nodes;
  double bound[SIM_MAX_NODES + 1];
  slice_bounds(l, b, bound);
  for (int n = 0; n < nodes; n++) {
    double a = lo > bound[n] ? lo : bound[n];
    double z = hi < bound[n + 1] ? hi : bound[n + 1];
    if (hi > lo && z > a)
      out[n] += (float)(bytes * (z - a) / (hi - lo));
    else if (hi <= lo && lo >= bound[n] && lo < bound[n + 1])
      out[n] += (float)bytes;
  }
}

/* Where a placed task's bytes live. `node` is its affinity (-1 none);
 * part >= 0: the part of a split reducing tile that reads rows
 * [lo, hi). */
static void placed_bytes(const sim_layout *l, int32_t t, int node, int part,
                         double lo, double hi, float *out) {
  const sim_step *s = l->step;
  int nodes = l->nodes;
  sim_access acc[SIM_MAX_ACCESS];
  int n = sim_footprint(s, t, acc);
  const plan_knode *kn = sim_knode(s, t);
  for (int i = 0; i < n; i++) {
    const sim_access *a = &acc[i];
    double bytes = a->rows == SIM_ROWS_SHARED ? a->bytes * nodes : a->bytes;
    if ((a->param || a->rows == SIM_ROWS_SHARED) && node >= 0)
      out[node] += (float)bytes;
    else if (a->param || a->rows == SIM_ROWS_SHARED)
      for (int m = 0; m < nodes; m++)
        out[m] += (float)(bytes / nodes);
    else if (part >= 0)
      spread(l, a->buf, bytes * (hi - lo), lo, hi, out);
    else
      spread(l, a->buf, bytes, a->lo, a->hi, out);
    if (kn->kind == KNODE_UPDATE && a->buf == kn->optim.param && node >= 0)
      for (int m = 0; m < nodes; m++)
        if (m != node)
          out[m] += (float)(a->bytes / 2.0); /* the copy's refresh */
  }
}

static void unplaced_bytes(const sim_step *s, int32_t t, int nodes,
                           float *out) {
  sim_access acc[SIM_MAX_ACCESS];
  int n = sim_footprint(s, t, acc);
  for (int i = 0; i < n; i++)
    out[0] += (float)(acc[i].rows == SIM_ROWS_SHARED ? acc[i].bytes * nodes
                                                     : acc[i].bytes);
}

/* The buffer whose rows a split tile's parts divide: its first ALL read. */
static int32_t split_buffer(const sim_step *s, int32_t t) {
  sim_access acc[SIM_MAX_ACCESS];
  int n = sim_footprint(s, t, acc);
  for (int i = 0; i < n; i++)
    if (acc[i].rows == SIM_ROWS_ALL && !acc[i].param)
      return acc[i].buf;
  return -1;
}

/* Whether a placed reducing tile is computed as one part per node. */
static bool per_node(const sim_step *s, const sim_layout *l, int32_t t) {
  return l->placed && l->nodes > 1 && s->tile[t] >= 0 &&
         sim_reduces_rows(s, t) && split_buffer(s, t) >= 0;
}

/* Pieces each tile of t's kernel is cut into (--split), 1 for others. */
static int finer(const sim_step *s, const sim_layout *l, int32_t t) {
  for (int i = 0; s->tile[t] >= 0 && i < l->nsplits; i++)
    if (strcmp(sim_task_name(s, t), l->splits[i].name) == 0)
      return l->splits[i].parts;
  return 1;
}

/* Parts each step task becomes; fills first[] (prefix sums, ntasks + 1). */
static int32_t count_parts(const sim_step *s, const sim_layout *l,
                           int32_t *first) {
  int32_t total = 0;
  for (int32_t t = 0; t < s->ntasks; t++) {
    first[t] = total;
    total += (per_node(s, l, t) ? l->nodes : 1) * finer(s, l, t);
  }
  first[s->ntasks] = total;
  return total;
}

/* Part `id` of step task t: its node's part (np, -1 when not split per
 * node) cut in `pieces`. */
static void fill_part(const sim_step *s, sim_layout *l, int32_t t, int32_t id,
                      int np, const double *bound, int pieces) {
  l->orig[id] = t;
  l->prio[id] = s->dag->info[t].priority;
  l->node[id] = -1;
  l->share[id] = 1.0f / (float)pieces;
  float *bytes = l->bytes[id];
  memset(bytes, 0, sizeof l->bytes[id]);
  if (!l->placed) {
    unplaced_bytes(s, t, l->nodes, bytes);
  } else if (np >= 0) {
    l->node[id] = (int8_t)np;
    l->share[id] = (float)((bound[np + 1] - bound[np]) / pieces);
    placed_bytes(l, t, np, np, bound[np], bound[np + 1], bytes);
  } else {
    if (s->tile[t] >= 0)
      l->node[id] = (int8_t)l->numa.affinity[l->numa.first_tile[s->knode[t]] +
                                              s->tile[t]];
    placed_bytes(l, t, l->node[id], -1, 0.0, 0.0, bytes);
  }
  for (int h = 0; h < l->nodes; h++)
    bytes[h] /= (float)pieces;
}

static void fill_task(const sim_step *s, sim_layout *l, int32_t t,
                      const int32_t *first) {
  int pieces = finer(s, l, t);
  bool split = per_node(s, l, t);
  double bound[SIM_MAX_NODES + 1];
  if (split)
    slice_bounds(l, split_buffer(s, t), bound);
  for (int32_t p = 0; p < first[t + 1] - first[t]; p++)
    fill_part(s, l, t, first[t] + p, split ? p / pieces : -1, bound, pieces);
}

/* Successor lists of every part: all parts of each successor. */
static int build_edges(const sim_step *s, sim_layout *l, const int32_t *first) {
  const sched_dag *dag = s->dag;
  int64_t nedges = 0;
  for (int32_t t = 0; t < s->ntasks; t++)
    for (int32_t e = dag->tasks[t].succ_begin; e < dag->tasks[t].succ_end; e++) {
      int32_t v = dag->succ[e];
      nedges += (int64_t)(first[t + 1] - first[t]) * (first[v + 1] - first[v]);
    }
  l->succ = malloc((size_t)(nedges > 0 ? nedges : 1) * sizeof *l->succ);
  if (l->succ == NULL)
    return 0;
  int64_t k = 0;
  for (int32_t t = 0; t < s->ntasks; t++)
    for (int32_t p = first[t]; p < first[t + 1]; p++) {
      l->succ_first[p] = k;
      for (int32_t e = dag->tasks[t].succ_begin; e < dag->tasks[t].succ_end; e++) {
        int32_t v = dag->succ[e];
        for (int32_t q = first[v]; q < first[v + 1]; q++) {
          l->succ[k++] = q;
          l->npred[q]++;
        }
      }
    }
  l->succ_first[l->ntasks] = k;
  return 1;
}

static const sim_layout *sort_layout;

static int cmp_root(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  int32_t px = sort_layout->prio[x], py = sort_layout->prio[y];
  if (px != py)
    return px > py ? -1 : 1;
  return (x > y) - (x < y);
}

static int find_roots(sim_layout *l) {
  l->roots = malloc((size_t)(l->ntasks > 0 ? l->ntasks : 1) * sizeof *l->roots);
  if (l->roots == NULL)
    return 0;
  for (int32_t t = 0; t < l->ntasks; t++)
    if (l->npred[t] == 0)
      l->roots[l->nroots++] = t;
  sort_layout = l;
  qsort(l->roots, (size_t)l->nroots, sizeof *l->roots, cmp_root);
  return 1;
}

static int allocate(sim_layout *l) {
  size_t n = (size_t)l->ntasks;
  l->orig = malloc(n * sizeof *l->orig);
  l->share = malloc(n * sizeof *l->share);
  l->node = malloc(n * sizeof *l->node);
  l->bytes = malloc(n * sizeof *l->bytes);
  l->prio = malloc(n * sizeof *l->prio);
  l->npred = calloc(n, sizeof *l->npred);
  l->succ_first = malloc((n + 1) * sizeof *l->succ_first);
  return l->orig && l->share && l->node && l->bytes && l->prio && l->npred &&
         l->succ_first;
}

/* The runtime's placement of s (numa_place) on `nodes` nodes with equal
 * workers each: the deal, the pinning and the slices the layout reads. */
static int runtime_placement(const sim_step *s, int nodes, sim_layout *l) {
  int worker_node[SIM_MAX_NODES], node_first[SIM_MAX_NODES + 1];
  for (int k = 0; k <= nodes; k++) {
    node_first[k] = k;
    if (k < nodes)
      worker_node[k] = k;
  }
  sched_placement pl = {.nworkers = nodes, .nnodes = nodes,
                        .worker_node = worker_node, .node_first = node_first};
  return numa_place(s->c->g, &s->c->low, &pl, &l->numa) == REMAT_OK;
}

int sim_layout_build(const sim_step *s, int nodes, bool placed,
                     const sim_split *splits, int nsplits, sim_layout *out) {
  memset(out, 0, sizeof *out);
  out->step = s;
  out->nodes = nodes;
  out->placed = placed;
  out->splits = splits;
  out->nsplits = nsplits;
  int32_t *first = malloc(((size_t)s->ntasks + 1) * sizeof *first);
  int ok = first != NULL && (!placed || runtime_placement(s, nodes, out));
  if (ok) {
    out->ntasks = count_parts(s, out, first);
    ok = allocate(out);
  }
  for (int32_t t = 0; ok && t < s->ntasks; t++)
    fill_task(s, out, t, first);
  ok = ok && build_edges(s, out, first) && find_roots(out);
  free(first);
  if (!ok)
    sim_layout_free(out);
  return ok;
}

void sim_layout_free(sim_layout *l) {
  numa_plan_free(&l->numa);
  free(l->orig);
  free(l->share);
  free(l->node);
  free(l->bytes);
  free(l->prio);
  free(l->npred);
  free(l->succ_first);
  free(l->succ);
  free(l->roots);
  memset(l, 0, sizeof *l);
}
