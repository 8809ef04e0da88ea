/* The allocation shim every folder of the library allocates through, so
 * that tests can make the N-th allocation fail (SQLite-style failure
 * injection). It depends on nothing; ops/ and sched/ may include it. */
#ifndef REMAT_BASE_ALLOC_H
#define REMAT_BASE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *remat__malloc(size_t bytes);
void *remat__calloc(size_t count, size_t bytes);
void *remat__realloc(void *p, size_t bytes);
void *remat__aligned_alloc(size_t align, size_t bytes);
char *remat__strdup(const char *s);
/* Fresh zero pages from the kernel, aligned to REMAT_HUGE_PAGE and asked
 * to be backed by huge pages where the kernel allows (fewer page faults
 * and TLB misses); untouched until used, so they cost no resident memory
 * until then. `bytes` is a multiple of REMAT_HUGE_PAGE. remat__unmap gives
 * them back at once. NULL when out of memory. */
#define REMAT_HUGE_PAGE ((size_t)2 << 20)
void *remat__map(size_t bytes);
void remat__unmap(void *p, size_t bytes);
/* Gives whole pages of a mapping back to the system without unmapping
 * them: they read as zero pages when next touched. */
void remat__drop_pages(void *p, size_t bytes);

/* `bytes` rounded up to a whole number of 64-byte lines, 0 staying 0: the
 * one rounding of block sizes, scratch and buffer layouts (the tensor
 * arena's blocks are 64-byte aligned). bytes must be in 0..INT64_MAX - 63. */
static inline int64_t remat__round64(int64_t bytes) {
  return (bytes + 63) / 64 * 64;
}

/* Test hook: the n-th allocation from now on (n >= 1) fails, and every one
 * after it until the hook is reset with n = 0. */
void remat__alloc_fail_after(int64_t n);
/* Allocations made through the shim since the last remat__alloc_fail_after. */
int64_t remat__alloc_count(void);

#endif
