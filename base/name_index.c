/* The hash index from names to ids (name_index.h): FNV-1a hashes, linear
 * probing, doubled when half full so that a probe stays short. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/name_index.h"

static uint32_t hash_name(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s != '\0'; s++)
    h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

/* The slot holding `name`, or the empty slot where it would go. */
static name_slot *probe(name_slot *slots, uint32_t cap, const char *name) {
  uint32_t i = hash_name(name) & (cap - 1);
  while (slots[i].name != NULL && strcmp(slots[i].name, name) != 0)
    i = (i + 1) & (cap - 1);
  return &slots[i];
}

int32_t name_index_find(const name_index *x, const char *name) {
  if (x->cap == 0)
    return -1;
  const name_slot *s = probe(x->slots, x->cap, name);
  return s->name != NULL ? s->id : -1;
}

static bool grow(name_index *x) {
  uint32_t cap = x->cap ? 2 * x->cap : 64;
  if (cap < x->cap)
    return false;
  name_slot *slots = remat__calloc(cap, sizeof *slots);
  if (slots == NULL)
    return false;
  for (uint32_t i = 0; i < x->cap; i++)
    if (x->slots[i].name != NULL)
      *probe(slots, cap, x->slots[i].name) = x->slots[i];
  free(x->slots);
  x->slots = slots;
  x->cap = cap;
  return true;
}

bool name_index_add(name_index *x, const char *name, int32_t id) {
  if (2 * (x->count + 1) > x->cap && !grow(x))
    return false;
  name_slot *s = probe(x->slots, x->cap, name);
  if (s->name == NULL) {
    *s = (name_slot){name, id};
    x->count++;
  }
  return true;
}

void name_index_free(name_index *x) {
  free(x->slots);
  memset(x, 0, sizeof *x);
}
