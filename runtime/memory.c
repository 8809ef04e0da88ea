/* Tensor memory: per-NUMA-node arenas that keep freed blocks by size for
 * reuse (steady-state steps ask the system for nothing), and byte counters
 * per category with their peaks. */
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

#define MEM_ALIGN 64

/* A freed block, kept on its size's list; the link lives in the block. */
struct mem_block {
  mem_block *next;
};

typedef struct size_list {
  size_t bytes;
  mem_block *head;
} size_list;

struct node_cache {
  size_list *lists;
  int nlists, cap;
};

static size_t round_up(size_t bytes) {
  return (bytes + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN;
}

remat_status mem_arena_init(mem_arena *a, hwloc_topology_t topo, int nnodes) {
  memset(a, 0, sizeof *a);
  a->topo = topo;
  a->nnodes = nnodes < 1 ? 1 : nnodes;
  a->caches = calloc((size_t)a->nnodes, sizeof(node_cache));
  if (a->caches == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "out of memory creating memory arenas");
  pthread_mutex_init(&a->lock, NULL);
  return REMAT_OK;
}

static void *system_alloc(mem_arena *a, size_t bytes, int node) {
  if (a->nnodes > 1 && node >= 0) {
    hwloc_obj_t obj =
        hwloc_get_obj_by_type(a->topo, HWLOC_OBJ_NUMANODE, (unsigned)node);
    if (obj != NULL)
      return hwloc_alloc_membind(a->topo, bytes, obj->nodeset,
                                 HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
  }
  return aligned_alloc(MEM_ALIGN, bytes);
}

static void system_free(mem_arena *a, void *p, size_t bytes) {
  if (a->nnodes > 1)
    hwloc_free(a->topo, p, bytes);
  else
    free(p);
}

static size_list *find_list(node_cache *c, size_t bytes, bool create) {
  for (int i = 0; i < c->nlists; i++)
    if (c->lists[i].bytes == bytes)
      return &c->lists[i];
  if (!create)
    return NULL;
  if (c->nlists == c->cap) {
    int cap = c->cap ? 2 * c->cap : 16;
    size_list *l = realloc(c->lists, (size_t)cap * sizeof *l);
    if (l == NULL)
      return NULL;
    c->lists = l;
    c->cap = cap;
  }
  c->lists[c->nlists] = (size_list){bytes, NULL};
  return &c->lists[c->nlists++];
}

static void count(mem_arena *a, int64_t delta, remat_mem_category cat,
                  bool transient) {
  int64_t cur = atomic_fetch_add(&a->current[cat], delta) + delta;
  int64_t peak = atomic_load(&a->peak[cat]);
  while (cur > peak && !atomic_compare_exchange_weak(&a->peak[cat], &peak, cur))
    ;
  int64_t tot = atomic_fetch_add(&a->total_current, delta) + delta;
  peak = atomic_load(&a->total_peak);
  while (tot > peak && !atomic_compare_exchange_weak(&a->total_peak, &peak, tot))
    ;
  if (transient) {
    int64_t tr = atomic_fetch_add(&a->transient_current, delta) + delta;
    peak = atomic_load(&a->transient_peak);
    while (tr > peak &&
           !atomic_compare_exchange_weak(&a->transient_peak, &peak, tr))
      ;
  }
}

void *mem_alloc(mem_arena *a, size_t bytes, remat_mem_category cat, int node,
                bool transient) {
  size_t size = round_up(bytes == 0 ? 1 : bytes);
  int n = node < 0 || node >= a->nnodes ? 0 : node;
  node_cache *c = &a->caches[n];
  void *p = NULL;
  pthread_mutex_lock(&a->lock);
  size_list *l = find_list(c, size, false);
  if (l != NULL && l->head != NULL) {
    p = l->head;
    l->head = l->head->next;
  }
  pthread_mutex_unlock(&a->lock);
  if (p == NULL) {
    p = system_alloc(a, size, n);
    if (p == NULL)
      return NULL;
    pthread_mutex_lock(&a->lock);
    a->reserved_bytes += (int64_t)size;
    pthread_mutex_unlock(&a->lock);
  }
  count(a, (int64_t)size, cat, transient);
  return p;
}

void mem_free(mem_arena *a, void *p, size_t bytes, remat_mem_category cat,
              int node, bool transient) {
  if (p == NULL)
    return;
  size_t size = round_up(bytes == 0 ? 1 : bytes);
  count(a, -(int64_t)size, cat, transient);
  int n = node < 0 || node >= a->nnodes ? 0 : node;
  node_cache *c = &a->caches[n];
  pthread_mutex_lock(&a->lock);
  size_list *l = find_list(c, size, true);
  if (l != NULL) {
    mem_block *b = p;
    b->next = l->head;
    l->head = b;
  } else {
    a->reserved_bytes -= (int64_t)size;
  }
  pthread_mutex_unlock(&a->lock);
  if (l == NULL)
    system_free(a, p, size);
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
  node_cache *caches = a->caches;
  for (int n = 0; n < a->nnodes; n++) {
    for (int i = 0; i < caches[n].nlists; i++) {
      mem_block *b = caches[n].lists[i].head;
      while (b != NULL) {
        mem_block *next = b->next;
        system_free(a, b, caches[n].lists[i].bytes);
        b = next;
      }
    }
    free(caches[n].lists);
  }
  free(a->caches);
  a->caches = NULL;
  pthread_mutex_destroy(&a->lock);
}
