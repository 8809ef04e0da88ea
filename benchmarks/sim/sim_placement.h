/* The NUMA placement model of the scaling simulator: on a machine of
 * `nodes` nodes with equal workers each, where each buffer's bytes live,
 * which node each task must run on, and the task DAG as simulated.
 *
 * Placed: the runtime's own placement, numa_place() of
 * runtime/compile/numa_place.c, fed `nodes` nodes of equal workers:
 *  - each tile is dealt and pinned as the runtime deals and pins it (a
 *    row-tiled kernel's tile whose writes lie in its node's slice has that
 *    node as affinity; other tiles run anywhere);
 *  - each buffer's rows lie in the runtime's slices (what each node's
 *    tiles of its first writer write; a buffer nothing writes, such as an
 *    input, whole on node 0);
 * and the simulator's own model of what touches them:
 *  - parameters, gradients and moments are sharded the same way (an
 *    update tile's slice lives on its node) and every node keeps a copy of
 *    each weight, which update tiles refresh: their slice is written to
 *    every other node;
 *  - a tile that reads every row (weight and bias gradients, reductions) is
 *    computed as one partial sum per node, over the rows that node holds,
 *    by a task with that node's affinity; adding the partials (a few KiB
 *    per tile) is not charged (a what-if: the runtime runs such a tile
 *    whole, anywhere);
 *  - start and done tasks have no affinity; a start task's zero-fill
 *    writes each slice where it lives.
 * Unplaced (for comparison): every buffer lives on node 0 and no task has
 * an affinity.
 * In both, a SHARED read (a weight or scalar read whole by every tile) is
 * charged once per node per kernel, spread over the tiles. */
#ifndef REMAT_SIM_PLACEMENT_H
#define REMAT_SIM_PLACEMENT_H

#include <stdbool.h>

#include "benchmarks/sim/sim_step.h"
#include "runtime/compile/numa_place.h"

#define SIM_MAX_NODES 8

/* A what-if for finer tiles: each tile of kernel `name` simulated as
 * `parts` tasks of equal share (the runtime's tiles are not changed). */
typedef struct sim_split {
  const char *name;
  int parts;
} sim_split;

typedef struct sim_layout {
  const sim_step *step;
  int nodes;
  bool placed;
  const sim_split *splits;
  int nsplits;
  int32_t ntasks;                /* simulated tasks: a split tile counts once
                                    per part */
  int32_t *orig;                 /* [ntasks] the step's task it stands for */
  float *share;                  /* [ntasks] its share of that task's time */
  int8_t *node;                  /* [ntasks] affinity, -1 none */
  float (*bytes)[SIM_MAX_NODES]; /* [ntasks] bytes moved, by holding node */
  int32_t *prio;                 /* [ntasks] higher runs first */
  int32_t *npred;                /* [ntasks] */
  int64_t *succ_first;           /* [ntasks + 1] into succ */
  int32_t *succ;                 /* each list highest priority first */
  int32_t *roots;                /* tasks without predecessors, highest
                                    priority first */
  int32_t nroots;
  numa_plan numa; /* placed: the runtime's placement on `nodes` nodes */
} sim_layout;

/* Builds the layout of s on `nodes` nodes (1 to SIM_MAX_NODES), with the
 * tiles of splits[0..nsplits) cut finer; 0 when memory runs out. */
int sim_layout_build(const sim_step *s, int nodes, bool placed,
                     const sim_split *splits, int nsplits, sim_layout *out);
void sim_layout_free(sim_layout *l);

#endif
