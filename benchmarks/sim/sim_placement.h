/* The NUMA placement model of the scaling simulator: on a machine of
 * `nodes` nodes with equal workers each, where each buffer's bytes live,
 * which node each task must run on, and the task DAG as simulated.
 *
 * Placed (the rule of issue 11; the runtime's own placement lands
 * separately and is not read here):
 *  - the tiles of each kernel are dealt to the nodes in contiguous blocks in
 *    proportion to each node's workers (here: equal blocks), and each tile
 *    task has its node as affinity;
 *  - the rows that a kernel's tiles write live on those tiles' nodes: each
 *    row-tiled buffer is split at the row boundaries of its first writer's
 *    deal (inputs fed by the program: equal slices);
 *  - parameters, gradients and moments are sharded the same way (an
 *    update tile's slice lives on its node) and every node keeps a copy of
 *    each weight, which update tiles refresh: their slice is written to
 *    every other node;
 *  - a tile that reads every row (weight and bias gradients, reductions) is
 *    computed as one partial sum per node, over the rows that node holds,
 *    by a task with that node's affinity; adding the partials (a few KiB
 *    per tile) is not charged;
 *  - start and done tasks have no affinity; a start task's zero-fill
 *    writes each slice where it lives.
 * Unplaced (today's runtime): every buffer lives on node 0 and no task has
 * an affinity.
 * In both, a SHARED read (a weight or scalar read whole by every tile) is
 * charged once per node per kernel, spread over the tiles. */
#ifndef REMAT_SIM_PLACEMENT_H
#define REMAT_SIM_PLACEMENT_H

#include <stdbool.h>

#include "benchmarks/sim/sim_step.h"

#define SIM_MAX_NODES 8

/* A what-if for finer tiles: each tile of kernel `name` simulated as
 * `parts` tasks of equal share (the runtime's tiles are not changed). */
typedef struct sim_split {
  const char *name;
  int parts;
} sim_split;

typedef struct sim_layout {
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
} sim_layout;

/* Builds the layout of s on `nodes` nodes (1 to SIM_MAX_NODES), with the
 * tiles of splits[0..nsplits) cut finer; 0 when memory runs out. */
int sim_layout_build(const sim_step *s, int nodes, bool placed,
                     const sim_split *splits, int nsplits, sim_layout *out);
void sim_layout_free(sim_layout *l);

#endif
