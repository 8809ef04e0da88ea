/* Stage "NUMA placement": from the lowering (after lifetimes) and the
 * pool's workers per node, the node each tile is dealt to, which tiles are
 * pinned there (their task's affinity), the per-node slices of the buffers
 * that row-tiled kernels write, the buffers copied to every node, and the
 * bytes that the step's tiles touch on nodes other than their own. */
#ifndef REMAT_RUNTIME_NUMA_PLACE_H
#define REMAT_RUNTIME_NUMA_PLACE_H

#include "runtime/compile/lowering.h"

/* Tiles are numbered as the DAG adds them: kernel node by kernel node in
 * program order, tile by tile. */
typedef struct numa_plan {
  int nnodes;
  int64_t ntiles;
  int64_t *first_tile; /* [nknodes]: number of each node's tile 0 */
  int *tile_node;      /* [ntiles]: the node the tile is dealt to */
  int *affinity;       /* [ntiles]: tile_node when pinned, else -1 */
  /* [nbufs * nnodes]: slice k of buffer b is bytes [slice_end[b * nnodes +
   * k - 1] (0 for k = 0), slice_end[b * nnodes + k]); a buffer that is not
   * sliced has all its bytes in one slice. */
  int64_t *slice_end;
  bool *replicated;    /* [nbufs]: a copy on every node (parameters) */
  float **copies;      /* [nbufs * nnodes] of replicated buffers: the copy
                          on each node; copies[b * nnodes] is b's data */
  int64_t copy_bytes;  /* bytes of the copies besides the buffers' own */
  int64_t remote_bytes, remote_bytes_unplaced;
} numa_plan;

struct remat_step_plan;

/* Fills p->numa from p->low (after lifetimes, before the DAG) and sets each
 * buffer's arena home (plan_buffer.node): the node of its only slice, or
 * a slice layout registered with p->arena. On one node every tile is
 * dealt to node 0, none is pinned and nothing is copied. */
remat_status numa_place(struct remat_step_plan *p);
/* After persistent allocation: the copies of replicated buffers on the
 * other nodes, filled from their data. */
remat_status numa_place_copies(struct remat_step_plan *p);
/* Buffer b's data as a worker on `node` reads it: the node's copy of a
 * replicated buffer. */
float *numa_data(const struct remat_step_plan *p, int32_t b, int node);
/* Copies elements [lo, hi) of replicated buffer b from node `from`'s copy to
 * the others (after an update tile or remat_write). */
void numa_refresh(struct remat_step_plan *p, int32_t b, int from, int64_t lo,
                  int64_t hi);
/* Frees the copies (into p->arena) and the plan's arrays. */
void numa_plan_free(struct remat_step_plan *p);

#endif
