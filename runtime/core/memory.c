/* Tensor memory: per-home arenas (a home is a NUMA node or a layout of
 * per-node slices), byte counters per category with their peaks, and
 * reservation. A node home carves its blocks from regions of fresh pages
 * (extents.h: best fit, merged on free), so bytes one size frees serve any
 * other and the pages a step touches follow its peak of live bytes; a
 * layout home keeps freed blocks by size for reuse. Before a step the
 * arena takes from the system room for every block the step is expected
 * to need (the most blocks of each size ever live at once, or the plan's
 * prediction before the first step): a region's pages cost nothing until
 * touched, so that room is address space, not resident memory. A step in
 * steady state asks the system for nothing, and an allocation failure
 * surfaces before any task has run. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runtime/core/extents.h"
#include "runtime/internal.h"

#define MEM_ALIGN 64
/* A node home's regions are at least this large (persistent blocks come
 * one by one; a region's untouched pages cost no resident memory). */
#define MEM_REGION_MIN ((size_t)4 << 20)

/* A free block, kept on its size's list; the link lives in the block. */
struct mem_block {
  mem_block *next;
};

typedef struct size_list {
  size_t bytes;
  mem_block *head;
  int64_t cached; /* blocks on the list */
  int64_t live;   /* blocks handed out */
  int64_t high;   /* most blocks handed out at once (or expected) */
} size_list;

struct node_cache {
  size_list *lists; /* a node home's count live and high blocks only */
  int nlists, cap;
  extent_set pool;  /* a node home's regions */
};

static size_t block_size(size_t bytes) {
  return (size_t)mem_block_bytes((int64_t)bytes);
}

static int home_index(const mem_arena *a, int home) {
  return home < 0 || home >= a->nhomes ? 0 : home;
}

/* Binding needs nodes that are this machine's: on a synthetic or XML
 * topology hwloc cannot bind, and nothing is. */
static remat_status init_binding(mem_arena *a, const sched_placement *pl) {
  a->bind = a->nnodes > 1 && hwloc_topology_is_thissystem(a->topo);
  if (!a->bind)
    return REMAT_OK;
  a->nodeset = remat__calloc((size_t)a->nnodes, sizeof *a->nodeset);
  if (a->nodeset == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int n = 0; n < a->nnodes; n++) {
    a->nodeset[n] = hwloc_bitmap_alloc();
    if (a->nodeset[n] == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
    hwloc_cpuset_to_nodeset(a->topo, pl->cpuset[pl->node_first[n]],
                            a->nodeset[n]);
  }
  return REMAT_OK;
}

/* Room for one more home. */
static bool grow_homes(mem_arena *a) {
  if (a->nhomes < a->cap_homes)
    return true;
  int cap = a->cap_homes ? 2 * a->cap_homes : a->nnodes + 8;
  node_cache *c = remat__realloc(a->caches, (size_t)cap * sizeof *c);
  if (c != NULL)
    a->caches = c;
  size_t *b = remat__realloc(a->layout_bytes, (size_t)cap * sizeof *b);
  if (b != NULL)
    a->layout_bytes = b;
  int64_t *e = remat__realloc(a->layout_ends,
                              (size_t)cap * (size_t)a->nnodes * sizeof *e);
  if (e != NULL)
    a->layout_ends = e;
  if (c == NULL || b == NULL || e == NULL)
    return false;
  memset(c + a->cap_homes, 0, (size_t)(cap - a->cap_homes) * sizeof *c);
  a->cap_homes = cap;
  return true;
}

remat_status mem_arena_init(mem_arena *a, hwloc_topology_t topo,
                            const sched_placement *pl) {
  memset(a, 0, sizeof *a);
  a->topo = topo;
  a->nnodes = pl->nnodes < 1 ? 1 : pl->nnodes;
  pthread_mutex_init(&a->lock, NULL);
  remat_status s = grow_homes(a) ? init_binding(a, pl)
                                 : REMAT_ERR_OUT_OF_MEMORY;
  if (s != REMAT_OK)
    return remat__fail(s, "out of memory creating memory arenas");
  for (; a->nhomes < a->nnodes; a->nhomes++)
    a->layout_bytes[a->nhomes] = 0;
  return REMAT_OK;
}

int mem_arena_layout(mem_arena *a, size_t bytes, const int64_t *ends) {
  size_t size = block_size(bytes);
  size_t row = (size_t)a->nnodes * sizeof *ends;
  for (int h = a->nnodes; h < a->nhomes; h++)
    if (a->layout_bytes[h] == size &&
        memcmp(a->layout_ends + (size_t)h * (size_t)a->nnodes, ends, row) == 0)
      return h;
  if (!grow_homes(a))
    return -1;
  a->layout_bytes[a->nhomes] = size;
  memcpy(a->layout_ends + (size_t)a->nhomes * (size_t)a->nnodes, ends, row);
  return a->nhomes++;
}

/* Binds each slice of a fresh block of layout home `home` to its node, in
 * whole pages: the pages are not touched yet, so none moves. A binding
 * that fails leaves the pages where the kernel puts them. */
static void bind_slices(mem_arena *a, char *p, size_t bytes, int home) {
  const int64_t *ends = a->layout_ends + (size_t)home * (size_t)a->nnodes;
  int64_t page = sysconf(_SC_PAGESIZE), lo = 0;
  for (int n = 0; n < a->nnodes; n++) {
    int64_t hi = n + 1 == a->nnodes ? (int64_t)bytes : ends[n] / page * page;
    if (hi > lo)
      hwloc_set_area_membind(a->topo, p + lo, (size_t)(hi - lo),
                             a->nodeset[n], HWLOC_MEMBIND_BIND,
                             HWLOC_MEMBIND_BYNODESET);
    lo = hi > lo ? hi : lo;
  }
}

static void *system_alloc(mem_arena *a, size_t bytes, int home) {
  if (!a->bind)
    return remat__aligned_alloc(MEM_ALIGN, bytes);
  if (home < a->nnodes)
    return hwloc_alloc_membind(a->topo, bytes, a->nodeset[home],
                               HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
  void *p = hwloc_alloc(a->topo, bytes);
  if (p != NULL)
    bind_slices(a, p, bytes, home);
  return p;
}

static void system_free(mem_arena *a, void *p, size_t bytes) {
  if (a->bind)
    hwloc_free(a->topo, p, bytes);
  else
    free(p);
}

/* A region of fresh pages for node home `home`, bound to its node when
 * binding. */
static void *region_alloc(mem_arena *a, size_t bytes, int home) {
  if (a->bind)
    return hwloc_alloc_membind(a->topo, bytes, a->nodeset[home],
                               HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
  return remat__map(bytes);
}

static void region_free(mem_arena *a, void *p, size_t bytes) {
  if (a->bind)
    hwloc_free(a->topo, p, bytes);
  else
    remat__unmap(p, bytes);
}

/* Adds a region of at least `bytes` to node home `home`. Under a->lock. */
static bool grow_pool(mem_arena *a, int home, size_t bytes) {
  size_t page = REMAT_HUGE_PAGE; /* regions are whole huge pages */
  if (a->caches[home].pool.nregions == 0)
    a->caches[home].pool.page = page; /* tracks resident huge pages */
  /* at least half the capacity so far: blocks added one by one (the
   * persistent ones) pack into few regions instead of leaving a partly
   * used last page in each */
  size_t size = a->caches[home].pool.capacity / 2;
  size = size < MEM_REGION_MIN ? MEM_REGION_MIN : size;
  size = size < bytes ? bytes : size;
  size = (size + page - 1) / page * page;
  void *p = region_alloc(a, size, home);
  if (p == NULL)
    return false;
  if (!extents_add_region(&a->caches[home].pool, p, size)) {
    region_free(a, p, size);
    return false;
  }
  return true;
}

static void drop_pages(void *at, size_t bytes, void *ctx) {
  (void)ctx;
  remat__drop_pages(at, bytes);
}

/* Keeps a node home's resident pages near its peak of live bytes: blocks
 * taken and given back in a different order at every thread count leave
 * touched pages in free ranges, and when the resident pages pass the peak
 * by 1/MEM_RESIDENT_OVER of it plus two (huge) pages, those of free ranges
 * go back to the system, down to half that allowance. A release costs a
 * page fault per huge page when it is touched again: a few per step. */
#define MEM_RESIDENT_OVER 128

static void bound_resident(extent_set *pool) {
  size_t peak = pool->peak_live_bytes;
  size_t allow = peak / MEM_RESIDENT_OVER + 2 * pool->page;
  if (pool->resident * pool->page > peak + allow)
    extents_release(pool, (peak + allow / 2) / pool->page, drop_pages, NULL);
}

/* A block of node home `home` (under a->lock). */
static void *pool_take(mem_arena *a, size_t size, int home) {
  extent_set *pool = &a->caches[home].pool;
  void *p = extents_take(pool, size);
  if (p == NULL && grow_pool(a, home, size))
    p = extents_take(pool, size);
  if (p != NULL)
    bound_resident(pool);
  return p;
}

/* Under a->lock. */
static size_list *find_list(node_cache *c, size_t bytes, bool create) {
  for (int i = 0; i < c->nlists; i++)
    if (c->lists[i].bytes == bytes)
      return &c->lists[i];
  if (!create)
    return NULL;
  if (c->nlists == c->cap) {
    int cap = c->cap ? 2 * c->cap : 16;
    size_list *l = remat__realloc(c->lists, (size_t)cap * sizeof *l);
    if (l == NULL)
      return NULL;
    c->lists = l;
    c->cap = cap;
  }
  c->lists[c->nlists] = (size_list){.bytes = bytes};
  return &c->lists[c->nlists++];
}

static void raise_peak(_Atomic int64_t *peak, int64_t value) {
  int64_t seen = atomic_load(peak);
  while (value > seen && !atomic_compare_exchange_weak(peak, &seen, value))
    ;
}

static void count(mem_arena *a, int64_t delta, remat_mem_category cat,
                  bool transient) {
  raise_peak(&a->peak[cat], atomic_fetch_add(&a->current[cat], delta) + delta);
  raise_peak(&a->total_peak, atomic_fetch_add(&a->total_current, delta) + delta);
  if (transient)
    raise_peak(&a->transient_peak,
               atomic_fetch_add(&a->transient_current, delta) + delta);
}

void *mem_alloc(mem_arena *a, size_t bytes, remat_mem_category cat, int home,
                bool transient) {
  size_t size = block_size(bytes);
  int n = home_index(a, home);
  void *p = NULL;
  pthread_mutex_lock(&a->lock);
  size_list *l = find_list(&a->caches[n], size, true);
  if (n < a->nnodes) {
    p = l != NULL ? pool_take(a, size, n) : NULL;
    if (p != NULL && ++l->live > l->high)
      l->high = l->live;
    pthread_mutex_unlock(&a->lock);
    if (p != NULL)
      count(a, (int64_t)size, cat, transient);
    return p;
  }
  if (l != NULL && l->head != NULL) {
    p = l->head;
    l->head = l->head->next;
    l->cached--;
  }
  pthread_mutex_unlock(&a->lock);
  if (p == NULL && (p = system_alloc(a, size, n)) == NULL)
    return NULL;
  pthread_mutex_lock(&a->lock);
  if (l != NULL && ++l->live > l->high)
    l->high = l->live;
  pthread_mutex_unlock(&a->lock);
  count(a, (int64_t)size, cat, transient);
  return p;
}

void mem_free(mem_arena *a, void *p, size_t bytes, remat_mem_category cat,
              int home, bool transient) {
  if (p == NULL)
    return;
  size_t size = block_size(bytes);
  int n = home_index(a, home);
  count(a, -(int64_t)size, cat, transient);
  pthread_mutex_lock(&a->lock);
  size_list *l = find_list(&a->caches[n], size, false);
  if (n < a->nnodes) {
    extents_give(&a->caches[n].pool, p, size);
    if (l != NULL)
      l->live--;
    pthread_mutex_unlock(&a->lock);
    return;
  }
  if (l != NULL) {
    mem_block *b = p;
    b->next = l->head;
    l->head = b;
    l->cached++;
    l->live--;
  }
  pthread_mutex_unlock(&a->lock);
  if (l == NULL)
    system_free(a, p, size);
}

remat_status mem_expect(mem_arena *a, size_t bytes, int64_t blocks, int home) {
  pthread_mutex_lock(&a->lock);
  size_list *l = find_list(&a->caches[home_index(a, home)],
                           block_size(bytes), true);
  if (l != NULL && l->live + blocks > l->high)
    l->high = l->live + blocks;
  pthread_mutex_unlock(&a->lock);
  return l != NULL ? REMAT_OK : REMAT_ERR_OUT_OF_MEMORY;
}

remat_status mem_reserve(mem_arena *a) {
  for (int n = 0; n < a->nnodes && n < a->nhomes; n++) {
    node_cache *c = &a->caches[n];
    size_t want = 0, have = c->pool.capacity;
    int64_t blocks = 0;
    for (int i = 0; i < c->nlists; i++) {
      want += (size_t)c->lists[i].high * c->lists[i].bytes;
      blocks += c->lists[i].high;
    }
    if (want > have) { /* twice: room to place blocks without a second
                          region; untouched pages cost nothing */
      pthread_mutex_lock(&a->lock);
      bool ok = grow_pool(a, n, 2 * want - have);
      pthread_mutex_unlock(&a->lock);
      if (!ok)
        return REMAT_ERR_OUT_OF_MEMORY;
    }
    if (!extents_reserve(&c->pool, blocks + 1)) /* after any new region */
      return REMAT_ERR_OUT_OF_MEMORY;
  }
  for (int n = a->nnodes; n < a->nhomes; n++) {
    node_cache *c = &a->caches[n];
    for (int i = 0; i < c->nlists; i++) {
      size_list *l = &c->lists[i];
      while (l->cached + l->live < l->high) {
        mem_block *b = system_alloc(a, l->bytes, n);
        if (b == NULL)
          return REMAT_ERR_OUT_OF_MEMORY;
        pthread_mutex_lock(&a->lock);
        b->next = l->head;
        l->head = b;
        l->cached++;
        pthread_mutex_unlock(&a->lock);
      }
    }
  }
  return REMAT_OK;
}

void mem_reset_peaks(mem_arena *a) {
  for (int i = 0; i < REMAT_MEM_NUM_CATEGORIES; i++)
    atomic_store(&a->peak[i], atomic_load(&a->current[i]));
  atomic_store(&a->total_peak, atomic_load(&a->total_current));
  atomic_store(&a->transient_peak, atomic_load(&a->transient_current));
}

void mem_arena_destroy(mem_arena *a) {
  if (a->caches == NULL)
    return;
  for (int n = 0; n < a->nhomes; n++) {
    node_cache *c = &a->caches[n];
    for (int r = 0; r < c->pool.nregions; r++)
      region_free(a, c->pool.regions[r].base, c->pool.regions[r].bytes);
    extents_free(&c->pool);
    for (int i = 0; i < c->nlists; i++) {
      mem_block *b = c->lists[i].head;
      while (b != NULL) {
        mem_block *next = b->next;
        system_free(a, b, c->lists[i].bytes);
        b = next;
      }
    }
    free(c->lists);
  }
  for (int n = 0; a->nodeset != NULL && n < a->nnodes; n++)
    hwloc_bitmap_free(a->nodeset[n]);
  free(a->nodeset);
  free(a->caches);
  free(a->layout_bytes);
  free(a->layout_ends);
  a->caches = NULL;
  pthread_mutex_destroy(&a->lock);
}

int mem_home_regions(mem_arena *a, int home, size_t *bytes,
                     size_t *resident) {
  pthread_mutex_lock(&a->lock);
  int n = home_index(a, home);
  const extent_set *pool = &a->caches[n].pool;
  *bytes = pool->capacity;
  *resident = pool->resident * pool->page;
  int regions = pool->nregions;
  pthread_mutex_unlock(&a->lock);
  return regions;
}
