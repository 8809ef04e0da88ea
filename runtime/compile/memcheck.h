/* Stage "memory check": with no memory budget, a step whose predicted peak
 * exceeds the memory the process can get fails at compile time with
 * REMAT_ERR_OUT_OF_MEMORY, instead of the kernel killing the process when
 * the step touches the memory. */
#ifndef REMAT_RUNTIME_MEMCHECK_H
#define REMAT_RUNTIME_MEMCHECK_H

#include <stdint.h>

#include "runtime/internal.h"

/* What the process can still get, from three sources; -1: unknown (no
 * limit, or not readable). */
typedef struct mem_room {
  int64_t cgroup;    /* the cgroup's memory.max (v2) or limit_in_bytes (v1)
                        less its current use */
  int64_t rlimit_as; /* RLIMIT_AS less the address space in use */
  int64_t available; /* MemAvailable of /proc/meminfo */
} mem_room;

/* Reads the three figures of this process. */
mem_room memcheck_room(void);
/* REMAT_OK when `peak` bytes fit in the least known figure of `room`, else
 * REMAT_ERR_OUT_OF_MEMORY recorded on g with both figures, the source of
 * the least, and the advice to set a budget. */
remat_status memcheck_fit(remat_graph *g, int64_t peak, const mem_room *room);

#endif
