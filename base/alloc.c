/* The allocation shim: plain libc allocation with a countdown that tests set
 * to make the N-th allocation, and every one after it, fail. The countdown
 * is the library's only mutable global, and only tests set it. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/alloc.h"

static _Atomic int64_t fail_at;   /* 0: never fail */
static _Atomic int64_t allocations;

static int allowed(void) {
  int64_t n = atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed) + 1;
  int64_t limit = atomic_load_explicit(&fail_at, memory_order_relaxed);
  return limit == 0 || n < limit;
}

void remat__alloc_fail_after(int64_t n) {
  atomic_store(&allocations, 0);
  atomic_store(&fail_at, n < 0 ? 0 : n);
}

int64_t remat__alloc_count(void) { return atomic_load(&allocations); }

void *remat__malloc(size_t bytes) { return allowed() ? malloc(bytes) : NULL; }

void *remat__calloc(size_t count, size_t bytes) {
  return allowed() ? calloc(count, bytes) : NULL;
}

void *remat__realloc(void *p, size_t bytes) {
  return allowed() ? realloc(p, bytes) : NULL;
}

void *remat__aligned_alloc(size_t align, size_t bytes) {
  return allowed() ? aligned_alloc(align, bytes) : NULL;
}

void *remat__map(size_t bytes) {
  if (!allowed())
    return NULL;
  const size_t huge = REMAT_HUGE_PAGE;
  char *p = mmap(NULL, bytes + huge, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  size_t lead = (huge - (uintptr_t)p % huge) % huge;
  if (lead > 0)
    munmap(p, lead);
  munmap(p + lead + bytes, huge - lead);
  /* a hint: where the kernel gives no huge pages, small ones serve */
  madvise(p + lead, bytes, MADV_HUGEPAGE);
  return p + lead;
}

void remat__unmap(void *p, size_t bytes) {
  if (p != NULL)
    munmap(p, bytes);
}

void remat__drop_pages(void *p, size_t bytes) {
  madvise(p, bytes, MADV_DONTNEED);
}

char *remat__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *copy = remat__malloc(n);
  if (copy != NULL)
    memcpy(copy, s, n);
  return copy;
}
