/* Tensor memory: per-NUMA-node arenas that keep freed blocks by size for
 * reuse, byte counters per category with their peaks, and reservation:
 * before a step the arena takes from the system every block the step is
 * expected to need (the most blocks of each size ever live at once, or the
 * plan's prediction before the first step), so that a step in steady state
 * asks the system for nothing and an allocation failure surfaces before any
 * task has run. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/internal.h"

#define MEM_ALIGN 64

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
  size_list *lists;
  int nlists, cap;
};

static size_t round_up(size_t bytes) {
  return (bytes + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN;
}

static int node_index(const mem_arena *a, int node) {
  return node < 0 || node >= a->nnodes ? 0 : node;
}

remat_status mem_arena_init(mem_arena *a, hwloc_topology_t topo, int nnodes) {
  memset(a, 0, sizeof *a);
  a->topo = topo;
  a->nnodes = nnodes < 1 ? 1 : nnodes;
  a->caches = remat__calloc((size_t)a->nnodes, sizeof(node_cache));
  if (a->caches == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "out of memory creating memory arenas");
  pthread_mutex_init(&a->lock, NULL);
  return REMAT_OK;
}

static void *system_alloc(mem_arena *a, size_t bytes, int node) {
  if (a->nnodes > 1) {
    hwloc_obj_t obj =
        hwloc_get_obj_by_type(a->topo, HWLOC_OBJ_NUMANODE, (unsigned)node);
    if (obj != NULL)
      return hwloc_alloc_membind(a->topo, bytes, obj->nodeset,
                                 HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
  }
  return remat__aligned_alloc(MEM_ALIGN, bytes);
}

static void system_free(mem_arena *a, void *p, size_t bytes) {
  if (a->nnodes > 1)
    hwloc_free(a->topo, p, bytes);
  else
    free(p);
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

void *mem_alloc(mem_arena *a, size_t bytes, remat_mem_category cat, int node,
                bool transient) {
  size_t size = round_up(bytes == 0 ? 1 : bytes);
  int n = node_index(a, node);
  void *p = NULL;
  pthread_mutex_lock(&a->lock);
  size_list *l = find_list(&a->caches[n], size, true);
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
              int node, bool transient) {
  if (p == NULL)
    return;
  size_t size = round_up(bytes == 0 ? 1 : bytes);
  count(a, -(int64_t)size, cat, transient);
  pthread_mutex_lock(&a->lock);
  size_list *l = find_list(&a->caches[node_index(a, node)], size, false);
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

remat_status mem_expect(mem_arena *a, size_t bytes, int64_t blocks, int node) {
  pthread_mutex_lock(&a->lock);
  size_list *l = find_list(&a->caches[node_index(a, node)],
                           round_up(bytes == 0 ? 1 : bytes), true);
  if (l != NULL && l->live + blocks > l->high)
    l->high = l->live + blocks;
  pthread_mutex_unlock(&a->lock);
  return l != NULL ? REMAT_OK : REMAT_ERR_OUT_OF_MEMORY;
}

remat_status mem_reserve(mem_arena *a) {
  for (int n = 0; n < a->nnodes; n++) {
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
  for (int n = 0; n < a->nnodes; n++) {
    node_cache *c = &a->caches[n];
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
  free(a->caches);
  a->caches = NULL;
  pthread_mutex_destroy(&a->lock);
}
