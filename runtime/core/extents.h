/* Free byte ranges inside regions taken from the system, for the tensor
 * arena (memory.c): a block is carved from the smallest free range that
 * holds it (lowest address on ties) and merged back with its free
 * neighbours when it is given back, so the bytes a size frees serve every
 * other size, and the pages a step touches follow its peak of live bytes
 * rather than the sum of each size's own peak. */
#ifndef REMAT_RUNTIME_CORE_EXTENTS_H
#define REMAT_RUNTIME_CORE_EXTENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct extent {
  char *at;
  size_t bytes;
  int region; /* ranges merge only within one region */
} extent;

typedef struct extent_region {
  char *base;
  size_t bytes;
  unsigned char *touched; /* [pages] when the set tracks pages: 1 for a
                             page handed out since it was last released */
} extent_region;

typedef struct extent_set {
  extent *free; /* [nfree] sorted by address */
  int nfree, cap;
  extent_region *regions; /* [nregions] */
  int nregions, region_cap;
  int64_t live;     /* blocks taken and not given back */
  size_t capacity;  /* bytes of all regions */
  size_t high_end;  /* most bytes from a region's base ever handed out
                       (the largest such over regions), for tests */
  size_t page;      /* page size when the set tracks resident pages; 0
                       when it does not (set before the first region) */
  size_t resident;  /* pages touched and not released since */
  size_t live_bytes, peak_live_bytes; /* bytes of blocks taken */
} extent_set;

/* A block of `bytes` (a multiple of 64) from the smallest free range that
 * holds it; NULL when none does, or when the bookkeeping is out of memory
 * (then nothing changed). */
void *extents_take(extent_set *s, size_t bytes);
/* Gives back a block that extents_take returned, with the same size; never
 * allocates (extents_take and extents_add_region keep room for it). */
void extents_give(extent_set *s, void *p, size_t bytes);
/* Adds a region of `bytes` at `base` (owned by the caller, who frees it
 * after extents_free), all of it free. False when out of memory for the
 * bookkeeping (then nothing changed). */
bool extents_add_region(extent_set *s, void *base, size_t bytes);
/* Room in the bookkeeping for `blocks` live blocks at once, so that
 * taking that many allocates nothing. False when out of memory. */
bool extents_reserve(extent_set *s, int64_t blocks);
/* Releases touched pages that lie wholly in free ranges, from the highest
 * addresses down, until at most `keep` pages are resident: `drop` is
 * called on each run of such pages (it gives them back to the system,
 * which hands them out again as fresh zero pages when next touched).
 * Returns the pages released. Only for a set that tracks pages. */
size_t extents_release(extent_set *s, size_t keep,
                       void (*drop)(void *at, size_t bytes, void *ctx),
                       void *ctx);
/* Frees the bookkeeping (not the regions). */
void extents_free(extent_set *s);

#endif
