/* How the optimizer's check and update nodes tile a parameter: flat tiles
 * of OPTIM_TILE elements. A shape rule, shared by lowering (tile counts),
 * NUMA placement (the deal) and the task bodies (element ranges). */
#ifndef REMAT_RUNTIME_OPTIM_TILES_H
#define REMAT_RUNTIME_OPTIM_TILES_H

#include <stdint.h>

#define OPTIM_TILE 65536

/* The tiles of a parameter with numel elements. */
static inline int64_t optim_tiles(int64_t numel) {
  return (numel + OPTIM_TILE - 1) / OPTIM_TILE;
}

/* [lo, hi) of tile `tile` of a parameter with numel elements. */
static inline void optim_tile_range(int64_t numel, int64_t tile, int64_t *lo,
                                    int64_t *hi) {
  *lo = tile * OPTIM_TILE;
  *hi = *lo + OPTIM_TILE < numel ? *lo + OPTIM_TILE : numel;
}

#endif
