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
  /* [nbufs]: each buffer's arena home: the node of its only non-empty
   * slice, or nnodes + j for slice layout j (a buffer sliced over several
   * nodes; buffers of one size and slices share a layout). */
  int *home;
  int nlayouts;
  int64_t *layout_bytes; /* [nlayouts] */
  int64_t *layout_ends;  /* [nlayouts * nnodes]: as slice_end */
  int64_t copy_bytes;  /* bytes of the copies besides the buffers' own */
  int64_t remote_bytes, remote_bytes_unplaced;
} numa_plan;

/* Fills `out` from the lowering (after lifetimes) and the pool's workers
 * per node. On one node every tile is dealt to node 0, none is pinned and
 * nothing is copied. On failure `out` holds nothing. */
remat_status numa_place(const remat_graph *g, const plan_lowering *low,
                        const sched_placement *pl, numa_plan *out);
void numa_plan_free(numa_plan *n);

#endif
