/* Worker placement: which NUMA node each worker belongs to and which cpuset
 * it binds to, and the order in which a worker steals. Pure functions of a
 * topology (no binding here), so synthetic topologies can test them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "sched/sched_internal.h"

/* A NUMA node that has cores, as placement sees it. */
typedef struct domain {
  hwloc_const_cpuset_t cpuset;
  hwloc_obj_type_t unit; /* what `core` binding takes: cores, else PUs */
  int nunits;
  int nworkers;
} domain;

int sched_physical_cores(hwloc_topology_t topo) {
  if (!topo)
    return 1;
  int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  return n > 0 ? n : 1;
}

static int count_units(hwloc_topology_t topo, hwloc_const_cpuset_t set,
                       hwloc_obj_type_t *unit) {
  *unit = HWLOC_OBJ_CORE;
  int n = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE);
  if (n > 0)
    return n;
  *unit = HWLOC_OBJ_PU;
  n = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_PU);
  return n > 0 ? n : 0;
}

static bool same_cpuset_as_earlier(const domain *d, int nd,
                                   hwloc_const_cpuset_t set) {
  for (int i = 0; i < nd; i++)
    if (hwloc_bitmap_isequal(d[i].cpuset, set))
      return true;
  return false;
}

/* NUMA nodes with cores, in topology order. Memory-only nodes are skipped,
 * and so is a node whose cpuset repeats an earlier one (HBM next to DDR):
 * a worker cannot tell them apart. No usable node: the whole machine. */
static int find_domains(hwloc_topology_t topo, domain *d) {
  int nd = 0, nnuma = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nnuma; i++) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, i);
    if (!node->cpuset || hwloc_bitmap_iszero(node->cpuset) ||
        same_cpuset_as_earlier(d, nd, node->cpuset))
      continue;
    d[nd] = (domain){.cpuset = node->cpuset};
    d[nd].nunits = count_units(topo, node->cpuset, &d[nd].unit);
    if (d[nd].nunits > 0)
      nd++;
  }
  if (nd == 0) {
    d[0] = (domain){.cpuset = hwloc_topology_get_topology_cpuset(topo)};
    d[0].nunits = count_units(topo, d[0].cpuset, &d[0].unit);
    nd = 1;
  }
  return nd;
}

/* Workers per domain in proportion to its cores (largest remainder, ties to
 * the lower node), so more threads than cores wrap around evenly. */
static void share_workers(domain *d, int nd, int nthreads) {
  int64_t total = 0;
  int given = 0;
  for (int i = 0; i < nd; i++)
    total += d[i].nunits > 0 ? d[i].nunits : 1;
  for (int i = 0; i < nd; i++) {
    int64_t units = d[i].nunits > 0 ? d[i].nunits : 1;
    d[i].nworkers = (int)(nthreads * units / total);
    given += d[i].nworkers;
  }
  for (; given < nthreads; given++) {
    int best = 0;
    int64_t best_rem = -1;
    for (int i = 0; i < nd; i++) {
      int64_t units = d[i].nunits > 0 ? d[i].nunits : 1;
      int64_t rem = nthreads * units - d[i].nworkers * total;
      if (rem > best_rem) {
        best = i;
        best_rem = rem;
      }
    }
    d[best].nworkers++;
  }
}

static hwloc_bitmap_t worker_cpuset(hwloc_topology_t topo, const domain *d,
                                    int rank, sched_bind bind) {
  if (bind != SCHED_BIND_CORE || d->nunits == 0)
    return hwloc_bitmap_dup(d->cpuset);
  hwloc_obj_t unit = hwloc_get_obj_inside_cpuset_by_type(
      topo, d->cpuset, d->unit, (unsigned)(rank % d->nunits));
  return hwloc_bitmap_dup(unit ? unit->cpuset : d->cpuset);
}

static remat_status fill_placement(hwloc_topology_t topo, const domain *d,
                                   int nd, sched_bind bind,
                                   sched_placement *p) {
  int w = 0;
  p->node_first[0] = 0;
  for (int i = 0; i < nd; i++) {
    if (d[i].nworkers == 0)
      continue;
    for (int rank = 0; rank < d[i].nworkers; rank++, w++) {
      p->worker_node[w] = p->nnodes;
      p->cpuset[w] = worker_cpuset(topo, &d[i], rank, bind);
      if (!p->cpuset[w])
        return REMAT_ERR_OUT_OF_MEMORY;
    }
    p->node_first[++p->nnodes] = w;
  }
  return REMAT_OK;
}

static remat_status check_args(hwloc_topology_t topo, int nthreads,
                               sched_bind bind, sched_placement *out,
                               char err[SCHED_ERRMSG_MAX]) {
  if (!topo || !out) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_place_workers: topo or out is NULL");
    return REMAT_ERR_INVALID_ARG;
  }
  if (nthreads < 1 || nthreads > SCHED_MAX_THREADS) {
    snprintf(err, SCHED_ERRMSG_MAX, "thread count %d is out of range (1 to %d)",
             nthreads, SCHED_MAX_THREADS);
    return nthreads < 1 ? REMAT_ERR_INVALID_ARG : REMAT_ERR_LIMIT;
  }
  if (bind != SCHED_BIND_CORE && bind != SCHED_BIND_NUMA &&
      bind != SCHED_BIND_NONE) {
    snprintf(err, SCHED_ERRMSG_MAX, "binding %d is not core, numa or none",
             (int)bind);
    return REMAT_ERR_INVALID_ARG;
  }
  return REMAT_OK;
}

remat_status sched_place_workers(hwloc_topology_t topo, int nthreads,
                                 sched_bind bind, sched_placement *out,
                                 char err[SCHED_ERRMSG_MAX]) {
  remat_status status = check_args(topo, nthreads, bind, out, err);
  if (status != REMAT_OK)
    return status;
  memset(out, 0, sizeof *out);
  int nnuma = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  domain *d = remat__calloc((size_t)(nnuma > 0 ? nnuma : 1), sizeof *d);
  out->worker_node = remat__calloc((size_t)nthreads, sizeof(int));
  out->cpuset = remat__calloc((size_t)nthreads, sizeof(hwloc_bitmap_t));
  out->node_first = remat__calloc((size_t)(nnuma > 0 ? nnuma : 1) + 1, sizeof(int));
  status = REMAT_ERR_OUT_OF_MEMORY;
  if (d && out->worker_node && out->cpuset && out->node_first) {
    int nd = find_domains(topo, d);
    share_workers(d, nd, nthreads);
    out->nworkers = nthreads;
    status = fill_placement(topo, d, nd, bind, out);
  }
  free(d);
  if (status != REMAT_OK) {
    snprintf(err, SCHED_ERRMSG_MAX, "sched_place_workers: out of memory");
    sched_placement_free(out);
  }
  return status;
}

void sched_placement_free(sched_placement *p) {
  if (!p)
    return;
  for (int w = 0; p->cpuset && w < p->nworkers; w++)
    hwloc_bitmap_free(p->cpuset[w]);
  free(p->cpuset);
  free(p->worker_node);
  free(p->node_first);
  memset(p, 0, sizeof *p);
}

/* Own node first, then the other nodes by increasing (index XOR own index):
 * hwloc numbers nodes package by package, so this visits the node that
 * shares a package (index differing in the lowest bit) before the nodes of
 * other packages. The placement keeps no distance matrix; this ordering is
 * what the usual two-level machines need. Inside each node a worker starts
 * from its own rank, so the thieves of a node spread over their victims. */
void sched_steal_order(const sched_placement *p, int worker, int *victims) {
  if (!p || !victims || worker < 0 || worker >= p->nworkers)
    return;
  int node = p->worker_node[worker], k = 0;
  int rank = worker - p->node_first[node];
  for (int x = 0; x < 2 * p->nnodes; x++) {
    int m = node ^ x;
    if (m >= p->nnodes)
      continue;
    int first = p->node_first[m], count = p->node_first[m + 1] - first;
    for (int i = 0; i < count; i++) {
      int v = first + (rank + i) % count;
      if (v != worker)
        victims[k++] = v;
    }
  }
}
