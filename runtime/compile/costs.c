/* The runtime's table of measured kernel times (costs.h): entries keyed
 * by a kernel's name, tile count, FLOPs, output type and its op's shapes,
 * found by a hash of the key, under the table's lock (a graph's steps fill
 * it while another graph of the runtime may compile). Entries live in
 * blocks that graphs' step states make at their creation (one allocation
 * each, so that a step allocates nothing) and hand to the table, and in
 * the table's own array for keys noted without a block (tests). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/costs.h"
#include "runtime/compile/lowering.h"
#include "runtime/compile/task_names.h"

/* What a time is kept for: a kernel of an op of given shapes. Zeroed
 * whole before it is filled, so that keys compare and hash as bytes. */
typedef struct cost_key {
  char name[48];
  int64_t tiles;
  double flops;
  int32_t dtype, nin;
  op_shape out, in[OP_MAX_IN];
} cost_key;

struct cost_entry {
  uint64_t hash;
  cost_key key;
  double tile_seconds; /* the least seen, -1 before any */
};

struct cost_block {
  cost_block *next;
  int32_t n, cap;
  cost_entry entries[];
};

void cost_table_init(cost_table *t) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->lock, NULL);
}

void cost_table_free(cost_table *t) {
  while (t->blocks != NULL) {
    cost_block *next = t->blocks->next;
    free(t->blocks);
    t->blocks = next;
  }
  free(t->loose);
  pthread_mutex_destroy(&t->lock);
  memset(t, 0, sizeof *t);
}

/* Field by field: a struct copy may carry the source's padding bytes. */
static void copy_shape(op_shape *to, const op_shape *from) {
  to->ndim = from->ndim;
  for (int i = 0; i < from->ndim && i < OP_MAX_DIMS; i++)
    to->dim[i] = from->dim[i];
}

/* The key of kernel k of an op of description d, and its FNV-1a hash. */
static uint64_t make_key(const op_desc *d, const op_kernel *k, cost_key *key) {
  memset(key, 0, sizeof *key);
  snprintf(key->name, sizeof key->name, "%s", k->name);
  key->tiles = k->tiles;
  key->flops = k->flops;
  key->dtype = (int32_t)d->out_dtype;
  key->nin = d->nin;
  copy_shape(&key->out, &d->out);
  for (int i = 0; i < d->nin && i < OP_MAX_IN; i++)
    copy_shape(&key->in[i], &d->in[i]);
  uint64_t h = 1469598103934665603ull;
  const unsigned char *p = (const unsigned char *)key;
  for (size_t i = 0; i < sizeof *key; i++)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static bool same(const cost_entry *e, uint64_t hash, const cost_key *key) {
  return e->hash == hash && memcmp(&e->key, key, sizeof *key) == 0;
}

static cost_entry *find_in(cost_entry *e, int32_t n, uint64_t hash,
                           const cost_key *key) {
  for (int32_t i = 0; i < n; i++)
    if (same(&e[i], hash, key))
      return &e[i];
  return NULL;
}

/* The first entry of the key: in the blocks, newest first, then loose. */
static cost_entry *find(cost_table *t, uint64_t hash, const cost_key *key) {
  for (cost_block *b = t->blocks; b != NULL; b = b->next) {
    cost_entry *e = find_in(b->entries, b->n, hash, key);
    if (e != NULL)
      return e;
  }
  return find_in(t->loose, t->nloose, hash, key);
}

double cost_table_tile_seconds(cost_table *t, const op_desc *d,
                               const op_kernel *k) {
  cost_key key;
  uint64_t hash = make_key(d, k, &key);
  pthread_mutex_lock(&t->lock);
  const cost_entry *e = find(t, hash, &key);
  double seconds = e != NULL ? e->tile_seconds : -1.0;
  pthread_mutex_unlock(&t->lock);
  return seconds;
}

/* Lowers every entry of the key to `seconds` where it is higher or
 * unmeasured; returns how many it found. */
static int lower_all(cost_entry *e, int32_t n, uint64_t hash,
                     const cost_key *key, double seconds) {
  int found = 0;
  for (int32_t i = 0; i < n; i++)
    if (same(&e[i], hash, key)) {
      if (e[i].tile_seconds < 0 || seconds < e[i].tile_seconds)
        e[i].tile_seconds = seconds;
      found++;
    }
  return found;
}

static bool add_loose(cost_table *t, uint64_t hash, const cost_key *key,
                      double seconds) {
  if (t->nloose == t->cap) {
    int32_t cap = t->cap ? 2 * t->cap : 16;
    cost_entry *grown = remat__realloc(t->loose, (size_t)cap * sizeof *grown);
    if (grown == NULL)
      return false;
    t->loose = grown;
    t->cap = cap;
  }
  cost_entry *e = &t->loose[t->nloose++];
  e->hash = hash;
  e->key = *key;
  e->tile_seconds = seconds;
  return true;
}

bool cost_table_note(cost_table *t, const op_desc *d, const op_kernel *k,
                     double tile_seconds) {
  cost_key key;
  uint64_t hash = make_key(d, k, &key);
  pthread_mutex_lock(&t->lock);
  int found = lower_all(t->loose, t->nloose, hash, &key, tile_seconds);
  for (cost_block *b = t->blocks; b != NULL; b = b->next)
    found += lower_all(b->entries, b->n, hash, &key, tile_seconds);
  bool ok = found > 0 || add_loose(t, hash, &key, tile_seconds);
  pthread_mutex_unlock(&t->lock);
  return ok;
}

int32_t cost_table_count(cost_table *t) {
  int32_t n = 0;
  pthread_mutex_lock(&t->lock);
  for (int32_t i = 0; i < t->nloose; i++)
    n += t->loose[i].tile_seconds >= 0;
  for (cost_block *b = t->blocks; b != NULL; b = b->next)
    for (int32_t i = 0; i < b->n; i++)
      n += b->entries[i].tile_seconds >= 0 &&
           find(t, b->entries[i].hash, &b->entries[i].key) == &b->entries[i];
  pthread_mutex_unlock(&t->lock);
  return n;
}

void cost_table_clear(cost_table *t) {
  pthread_mutex_lock(&t->lock);
  t->nloose = 0;
  for (cost_block *b = t->blocks; b != NULL; b = b->next)
    for (int32_t i = 0; i < b->n; i++)
      b->entries[i].tile_seconds = -1.0;
  pthread_mutex_unlock(&t->lock);
}

cost_block *cost_block_new(int32_t cap) {
  cost_block *b = remat__malloc(sizeof *b + (size_t)cap * sizeof(cost_entry));
  if (b != NULL)
    *b = (cost_block){NULL, 0, cap};
  return b;
}

void cost_block_add(cost_block *b, const op_desc *d, const op_kernel *k) {
  cost_key key;
  uint64_t hash = make_key(d, k, &key);
  if (b->n == b->cap || find_in(b->entries, b->n, hash, &key) != NULL)
    return;
  cost_entry *e = &b->entries[b->n++];
  e->hash = hash;
  e->key = key;
  e->tile_seconds = -1.0;
}

void cost_table_adopt(cost_table *t, cost_block *b) {
  pthread_mutex_lock(&t->lock);
  for (int32_t i = 0; i < b->n; i++) { /* what is known of its keys */
    cost_entry *e = &b->entries[i];
    const cost_entry *known = find(t, e->hash, &e->key);
    if (known != NULL)
      e->tile_seconds = known->tile_seconds;
  }
  b->next = t->blocks;
  t->blocks = b;
  pthread_mutex_unlock(&t->lock);
}

void cost_key_of(const plan_lowering *l, const plan_knode *kn, op_desc *d,
                 op_kernel *k) {
  if (kn->inst != NULL && kn->kernel != NULL) {
    *d = kn->inst->desc;
    *k = *kn->kernel;
    return;
  }
  int64_t bytes = 0;
  for (int i = 0; i < kn->ntouch; i++)
    bytes += l->bufs[kn->touch[i]].bytes;
  memset(d, 0, sizeof *d);
  d->out = (op_shape){1, {bytes}};
  *k = (op_kernel){.name = task_names_kernel(kn), .tiles = kn->tiles};
}

double cost_of_kernel(cost_table *t, const op_desc *d, const op_kernel *k,
                      int64_t tiles, double roofline) {
  double seconds = t != NULL ? cost_table_tile_seconds(t, d, k) : -1.0;
  if (seconds < 0)
    return roofline;
  return seconds * (double)tiles * COST_FLOPS_PER_SECOND;
}
