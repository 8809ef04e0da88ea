/* Best-fit carving of blocks from free byte ranges of system regions, with
 * merging on give-back (extents.h). The ranges sit in one array sorted by
 * address: a step holds a few hundred at most, so a linear best-fit scan
 * and a binary-searched insert cost less than the allocations they
 * replace. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/core/extents.h"

/* Room for `n` free ranges. */
static bool reserve_free(extent_set *s, int n) {
  if (n <= s->cap)
    return true;
  int cap = s->cap ? s->cap : 32;
  while (cap < n)
    cap *= 2;
  extent *f = remat__realloc(s->free, (size_t)cap * sizeof *f);
  if (f == NULL)
    return false;
  s->free = f;
  s->cap = cap;
  return true;
}

/* The free ranges never outnumber the gaps between live blocks and region
 * ends: one per live block plus one per region. Keeping room for that many
 * (and one more block) makes extents_give allocation-free. */
static int free_bound(const extent_set *s, int64_t more_live) {
  return (int)(s->live + more_live) + s->nregions + 1;
}

/* Marks the pages of [at, at + bytes) of region r touched. */
static void touch(extent_set *s, int r, const char *at, size_t bytes) {
  if (s->page == 0)
    return;
  const extent_region *g = &s->regions[r];
  size_t first = (size_t)(at - g->base) / s->page;
  size_t last = ((size_t)(at - g->base) + bytes - 1) / s->page;
  for (size_t i = first; i <= last; i++)
    if (!g->touched[i]) {
      g->touched[i] = 1;
      s->resident++;
    }
}

void *extents_take(extent_set *s, size_t bytes) {
  if (!reserve_free(s, free_bound(s, 1)))
    return NULL;
  int best = -1;
  for (int i = 0; i < s->nfree; i++)
    if (s->free[i].bytes >= bytes &&
        (best < 0 || s->free[i].bytes < s->free[best].bytes))
      best = i;
  if (best < 0)
    return NULL;
  extent *e = &s->free[best];
  char *p = e->at;
  e->at += bytes;
  e->bytes -= bytes;
  size_t end = (size_t)(e->at - s->regions[e->region].base);
  if (end > s->high_end)
    s->high_end = end;
  touch(s, e->region, p, bytes);
  if (e->bytes == 0) {
    memmove(e, e + 1, (size_t)(s->nfree - best - 1) * sizeof *e);
    s->nfree--;
  }
  s->live++;
  s->live_bytes += bytes;
  if (s->live_bytes > s->peak_live_bytes)
    s->peak_live_bytes = s->live_bytes;
  return p;
}

/* The index of the first free range at or after `p`. */
static int first_at_or_after(const extent_set *s, const char *p) {
  int lo = 0, hi = s->nfree;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (s->free[mid].at < p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* The region that holds `p`. */
static int region_of(const extent_set *s, const char *p) {
  for (int r = 0; r < s->nregions; r++)
    if (p >= s->regions[r].base && p < s->regions[r].base + s->regions[r].bytes)
      return r;
  return -1;
}

void extents_give(extent_set *s, void *p, size_t bytes) {
  char *at = p;
  int region = region_of(s, at);
  int i = first_at_or_after(s, at);
  bool left = i > 0 && s->free[i - 1].region == region &&
              s->free[i - 1].at + s->free[i - 1].bytes == at;
  bool right = i < s->nfree && s->free[i].region == region &&
               at + bytes == s->free[i].at;
  s->live--;
  s->live_bytes -= bytes;
  if (left && right) {
    s->free[i - 1].bytes += bytes + s->free[i].bytes;
    memmove(&s->free[i], &s->free[i + 1],
            (size_t)(s->nfree - i - 1) * sizeof *s->free);
    s->nfree--;
  } else if (left) {
    s->free[i - 1].bytes += bytes;
  } else if (right) {
    s->free[i].at = at;
    s->free[i].bytes += bytes;
  } else { /* room kept by extents_take (free_bound) */
    memmove(&s->free[i + 1], &s->free[i],
            (size_t)(s->nfree - i) * sizeof *s->free);
    s->free[i] = (extent){.at = at, .bytes = bytes, .region = region};
    s->nfree++;
  }
}

bool extents_add_region(extent_set *s, void *base, size_t bytes) {
  if (s->nregions == s->region_cap) {
    int cap = s->region_cap ? 2 * s->region_cap : 8;
    extent_region *r = remat__realloc(s->regions, (size_t)cap * sizeof *r);
    if (r == NULL)
      return false;
    s->regions = r;
    s->region_cap = cap;
  }
  unsigned char *touched = NULL;
  if (s->page != 0 &&
      (touched = remat__calloc(bytes / s->page + 1, 1)) == NULL)
    return false;
  s->nregions++;
  if (!reserve_free(s, free_bound(s, 0))) {
    s->nregions--;
    free(touched);
    return false;
  }
  int r = s->nregions - 1;
  s->regions[r] =
      (extent_region){.base = base, .bytes = bytes, .touched = touched};
  int i = first_at_or_after(s, base);
  memmove(&s->free[i + 1], &s->free[i],
          (size_t)(s->nfree - i) * sizeof *s->free);
  s->free[i] = (extent){.at = base, .bytes = bytes, .region = r};
  s->nfree++;
  s->capacity += bytes;
  return true;
}

bool extents_reserve(extent_set *s, int64_t blocks) {
  return reserve_free(s, (int)blocks + s->nregions + 1);
}

size_t extents_release(extent_set *s, size_t keep,
                       void (*drop)(void *at, size_t bytes, void *ctx),
                       void *ctx) {
  size_t released = 0;
  for (int i = s->nfree - 1; i >= 0 && s->resident > keep; i--) {
    const extent *e = &s->free[i];
    const extent_region *g = &s->regions[e->region];
    size_t lo = (size_t)(e->at - g->base), hi = lo + e->bytes;
    size_t first = (lo + s->page - 1) / s->page, end = hi / s->page;
    for (size_t p = end; p > first && s->resident > keep;) {
      /* the run of touched pages that ends at page p - 1 */
      size_t q = p;
      while (q > first && g->touched[q - 1] && s->resident - (p - q) > keep)
        q--;
      if (q < p) {
        memset(g->touched + q, 0, p - q);
        s->resident -= p - q;
        released += p - q;
        drop(g->base + q * s->page, (p - q) * s->page, ctx);
      }
      p = q;
      while (p > first && !g->touched[p - 1])
        p--;
    }
  }
  return released;
}

void extents_free(extent_set *s) {
  for (int r = 0; r < s->nregions; r++)
    free(s->regions[r].touched);
  free(s->free);
  free(s->regions);
  memset(s, 0, sizeof *s);
}
