/* The runtime's table of measured kernel times (costs.h): entries keyed
 * by a kernel's name, tile count, FLOPs, output type and its op's shapes,
 * found by a hash of the key, under the table's lock (a graph's steps fill
 * it while another graph of the runtime may compile). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/costs.h"

#define COST_KEY_MAX 320

struct cost_entry {
  uint64_t hash;
  char key[COST_KEY_MAX];
  double tile_seconds; /* the least seen */
};

void cost_table_init(cost_table *t) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->lock, NULL);
}

void cost_table_free(cost_table *t) {
  free(t->entries);
  pthread_mutex_destroy(&t->lock);
  memset(t, 0, sizeof *t);
}

void cost_table_clear(cost_table *t) {
  pthread_mutex_lock(&t->lock);
  t->n = 0;
  pthread_mutex_unlock(&t->lock);
}

static void append_shape(char *key, size_t *len, const op_shape *s) {
  for (int i = 0; i < s->ndim && *len < COST_KEY_MAX; i++)
    *len += (size_t)snprintf(key + *len, COST_KEY_MAX - *len, "%s%lld",
                             i ? "x" : "", (long long)s->dim[i]);
  if (*len < COST_KEY_MAX)
    *len += (size_t)snprintf(key + *len, COST_KEY_MAX - *len, ";");
}

/* The key of kernel k of an op of description d, and its FNV-1a hash. */
static uint64_t make_key(const op_desc *d, const op_kernel *k,
                         char key[COST_KEY_MAX]) {
  size_t len = (size_t)snprintf(key, COST_KEY_MAX, "%s/%lld/%.17g/%s/",
                                k->name, (long long)k->tiles, k->flops,
                                op_dtype_name(d->out_dtype));
  append_shape(key, &len, &d->out);
  for (int i = 0; i < d->nin; i++)
    append_shape(key, &len, &d->in[i]);
  uint64_t h = 1469598103934665603ull;
  for (const char *c = key; *c; c++)
    h = (h ^ (uint8_t)*c) * 1099511628211ull;
  return h;
}

static cost_entry *find(cost_table *t, uint64_t hash, const char *key) {
  for (int32_t i = 0; i < t->n; i++)
    if (t->entries[i].hash == hash && strcmp(t->entries[i].key, key) == 0)
      return &t->entries[i];
  return NULL;
}

double cost_table_tile_seconds(cost_table *t, const op_desc *d,
                               const op_kernel *k) {
  char key[COST_KEY_MAX];
  uint64_t hash = make_key(d, k, key);
  pthread_mutex_lock(&t->lock);
  const cost_entry *e = find(t, hash, key);
  double seconds = e != NULL ? e->tile_seconds : -1.0;
  pthread_mutex_unlock(&t->lock);
  return seconds;
}

bool cost_table_note(cost_table *t, const op_desc *d, const op_kernel *k,
                     double tile_seconds) {
  char key[COST_KEY_MAX];
  uint64_t hash = make_key(d, k, key);
  bool ok = true;
  pthread_mutex_lock(&t->lock);
  cost_entry *e = find(t, hash, key);
  if (e == NULL && t->n == t->cap) {
    int32_t cap = t->cap ? 2 * t->cap : 64;
    cost_entry *grown = remat__realloc(t->entries, (size_t)cap * sizeof *grown);
    ok = grown != NULL;
    if (ok) {
      t->entries = grown;
      t->cap = cap;
    }
  }
  if (ok && e == NULL) {
    e = &t->entries[t->n++];
    e->hash = hash;
    memcpy(e->key, key, sizeof e->key);
    e->tile_seconds = tile_seconds;
  }
  if (ok && tile_seconds < e->tile_seconds)
    e->tile_seconds = tile_seconds;
  pthread_mutex_unlock(&t->lock);
  return ok;
}

double cost_of_kernel(cost_table *t, const op_desc *d, const op_kernel *k,
                      int64_t tiles, double roofline) {
  double seconds = t != NULL ? cost_table_tile_seconds(t, d, k) : -1.0;
  if (seconds < 0)
    return roofline;
  return seconds * (double)tiles * COST_FLOPS_PER_SECOND;
}
