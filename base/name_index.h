/* A hash index from names to ids (open addressing, doubled at half full),
 * so that looking a name up costs the same in a graph of ten parameters
 * as in one of a million: the graph's parameter names, a safetensors
 * file's tensors. The index points at names it does not own: they must
 * outlive it and not change while indexed. */
#ifndef REMAT_BASE_NAME_INDEX_H
#define REMAT_BASE_NAME_INDEX_H

#include <stdbool.h>
#include <stdint.h>

typedef struct name_slot {
  const char *name; /* NULL: empty */
  int32_t id;
} name_slot;

typedef struct name_index {
  name_slot *slots; /* [cap], cap a power of two or 0 */
  uint32_t cap, count;
} name_index;

/* The id of `name`, or -1 when it is not indexed. */
int32_t name_index_find(const name_index *x, const char *name);
/* Indexes `name` as `id` (a name already indexed keeps its first id).
 * false: out of memory, the index as it was. */
bool name_index_add(name_index *x, const char *name, int32_t id);
void name_index_free(name_index *x);

#endif
