/* What one task of a compiled step moves to and from memory, for the
 * scaling simulator: for each buffer it touches, the bytes and which rows.
 * Tiles of most kernels own a block of rows (the same share of every
 * row-tiled buffer they touch); tiles of a few kernels (weight and bias
 * gradients, reductions) read a block of columns of every row; weights and
 * scalars are read whole by every tile. The byte counts come from the
 * shapes in the op's description and the tiling rules of ops/ (see
 * sim_footprint.c for each kernel); they are an estimate of DRAM traffic,
 * not a measurement. */
#ifndef REMAT_SIM_FOOTPRINT_H
#define REMAT_SIM_FOOTPRINT_H

#include <stdbool.h>

#include "benchmarks/sim/sim_step.h"

typedef enum sim_rows {
  SIM_ROWS_TILE,  /* rows [lo, hi) (fractions of the buffer's rows) */
  SIM_ROWS_ALL,   /* some columns of every row */
  SIM_ROWS_SHARED /* the whole buffer, read by every tile of the kernel */
} sim_rows;

typedef struct sim_access {
  int32_t buf;
  double bytes; /* moved by this task; SHARED: the buffer's bytes / tiles */
  sim_rows rows;
  double lo, hi;
  bool param; /* a parameter, its gradient or an optimizer moment */
} sim_access;

#define SIM_MAX_ACCESS PLAN_MAX_USES

/* The accesses of task `task`; returns their number (0 for done tasks, the
 * gate and the seed). Start tasks write the buffers they zero-fill. */
int sim_footprint(const sim_step *s, int32_t task, sim_access *out);

/* Whether the tiles of task's kernel read all rows (and so, placed on
 * several nodes, are computed as one partial sum per node). */
bool sim_reduces_rows(const sim_step *s, int32_t task);

#endif
