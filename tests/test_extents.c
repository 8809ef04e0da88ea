/* The tensor arena's free ranges (runtime/core/extents.h): best fit, the
 * lowest address among equals, merging with both neighbours on give-back
 * but never across regions, a give-back that allocates nothing, and the
 * property the arena is for: blocks of different sizes live at different
 * times reuse the same bytes, so a region as large as the peak of live
 * bytes serves a pattern whose sizes' own peaks sum to far more; and the
 * arena (runtime/core/memory.c) built on them: a node home's blocks share
 * one region, a block that needs a new region fails cleanly when the
 * system refuses it, and a reserved step asks the system for nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/alloc.h"
#include "runtime/core/extents.h"
#include "runtime/internal.h"

#define KB ((size_t)1024)

static char region_a[64 * 1024] __attribute__((aligned(64)));
static char region_b[64 * 1024] __attribute__((aligned(64)));

static void test_best_fit_and_merge(void **state) {
  (void)state;
  extent_set s = {0};
  assert_true(extents_add_region(&s, region_a, 64 * KB));
  char *p[6];
  for (int i = 0; i < 6; i++) /* 8, 4, 8, 2, 8, rest of 64 */
    p[i] = extents_take(&s, (size_t[]){8, 4, 8, 2, 8, 34}[i] * KB);
  for (int i = 0; i < 6; i++)
    assert_non_null(p[i]);
  assert_ptr_equal(p[0], region_a); /* carved from the low end in order */
  assert_ptr_equal(p[5], region_a + 30 * KB);
  assert_null(extents_take(&s, 64)); /* full */
  extents_give(&s, p[1], 4 * KB); /* holes of 4 and 2 KB */
  extents_give(&s, p[3], 2 * KB);
  assert_int_equal(s.nfree, 2);
  /* best fit: 2 KB goes to the 2 KB hole, not the first (4 KB) one */
  assert_ptr_equal(extents_take(&s, 2 * KB), p[3]);
  extents_give(&s, p[3], 2 * KB);
  /* merging: freeing the 8 KB between the 4 KB and 2 KB holes joins all
   * three into one range of 14 KB */
  extents_give(&s, p[2], 8 * KB);
  assert_int_equal(s.nfree, 1);
  assert_ptr_equal(s.free[0].at, p[1]);
  assert_int_equal(s.free[0].bytes, 14 * KB);
  /* left-only and right-only merges */
  extents_give(&s, p[0], 8 * KB); /* joins the range on its right */
  assert_int_equal(s.nfree, 1);
  assert_ptr_equal(s.free[0].at, region_a);
  extents_give(&s, p[4], 8 * KB); /* joins the range on its left */
  assert_int_equal(s.nfree, 1);
  assert_int_equal(s.free[0].bytes, 30 * KB);
  extents_give(&s, p[5], 34 * KB);
  assert_int_equal(s.nfree, 1);
  assert_int_equal(s.free[0].bytes, 64 * KB);
  assert_int_equal(s.live, 0);
  extents_free(&s);
}

/* Two regions never merge, even when one ends where the other starts. */
static void test_regions_do_not_merge(void **state) {
  (void)state;
  extent_set s = {0};
  assert_true(extents_add_region(&s, region_a, 32 * KB));
  assert_true(extents_add_region(&s, region_a + 32 * KB, 32 * KB));
  assert_int_equal(s.nfree, 2);
  assert_null(extents_take(&s, 48 * KB)); /* no range spans both */
  char *x = extents_take(&s, 32 * KB), *y = extents_take(&s, 32 * KB);
  assert_non_null(x);
  assert_non_null(y);
  extents_give(&s, x, 32 * KB);
  extents_give(&s, y, 32 * KB);
  assert_int_equal(s.nfree, 2);
  assert_int_equal(s.capacity, 64 * KB);
  extents_free(&s);
}

/* After extents_reserve(n), n takes and every give-back allocate nothing:
 * with every allocation failing they still succeed. */
static void test_reserved_bookkeeping_allocates_nothing(void **state) {
  (void)state;
  extent_set s = {0};
  assert_true(extents_add_region(&s, region_b, 64 * KB));
  assert_true(extents_reserve(&s, 64));
  remat__alloc_fail_after(1);
  char *p[64];
  for (int i = 0; i < 64; i++)
    assert_non_null(p[i] = extents_take(&s, KB));
  for (int i = 0; i < 64; i += 2) /* 32 separate holes */
    extents_give(&s, p[i], KB);
  assert_int_equal(s.nfree, 32);
  for (int i = 1; i < 64; i += 2)
    extents_give(&s, p[i], KB);
  remat__alloc_fail_after(0);
  assert_int_equal(s.nfree, 1);
  extents_free(&s);
}

/* Sizes live at different times share bytes: 16 rounds, each with a new
 * size, each holding four blocks of it at once, fit in a region of four
 * blocks of the largest size, where keeping each size's blocks apart
 * would need the sum of the rounds (16 times more). */
static void test_sizes_share_bytes(void **state) {
  (void)state;
  extent_set s = {0};
  assert_true(extents_add_region(&s, region_b, 64 * KB));
  for (int round = 0; round < 16; round++) {
    size_t size = (size_t)(16 - round) * KB; /* 16 KB down to 1 KB */
    char *p[4];
    for (int i = 0; i < 4; i++)
      assert_non_null(p[i] = extents_take(&s, size));
    for (int i = 3; i >= 0; i--)
      extents_give(&s, p[i], size);
    assert_int_equal(s.nfree, 1);
  }
  assert_int_equal(s.high_end, 64 * KB);
  extents_free(&s);
}

/* Pages are tracked once the set has a page size: a block marks every page
 * it overlaps, and a release gives back only whole pages of free ranges,
 * highest first, as runs, stopping at the pages asked to be kept. */
typedef struct drops {
  char *at[8];
  size_t bytes[8];
  int n;
} drops;

static void record_drop(void *at, size_t bytes, void *ctx) {
  drops *d = ctx;
  assert_true(d->n < 8);
  d->at[d->n] = at;
  d->bytes[d->n++] = bytes;
}

static void test_release_whole_free_pages(void **state) {
  (void)state;
  extent_set s = {.page = 4 * KB};
  assert_true(extents_add_region(&s, region_a, 64 * KB)); /* 16 pages */
  /* blocks of 6, 10, 16 and 32 KB: pages 0-1, 1-3, 4-7, 8-15 */
  char *p[4];
  for (int i = 0; i < 4; i++)
    p[i] = extents_take(&s, (size_t[]){6, 10, 16, 32}[i] * KB);
  assert_int_equal(s.resident, 16);
  assert_int_equal(s.live_bytes, 64 * KB);
  for (int i = 1; i < 4; i++) /* free [6, 64): whole pages 2-15 */
    extents_give(&s, p[i], (size_t[]){6, 10, 16, 32}[i] * KB);
  assert_int_equal(s.nfree, 1);
  assert_int_equal(s.peak_live_bytes, 64 * KB);
  assert_int_equal(s.live_bytes, 6 * KB);
  drops d = {0};
  /* keep 10 pages: 6 go, the highest ones, as one run */
  assert_int_equal(extents_release(&s, 10, record_drop, &d), 6);
  assert_int_equal(d.n, 1);
  assert_ptr_equal(d.at[0], region_a + 40 * KB);
  assert_int_equal(d.bytes[0], 24 * KB);
  assert_int_equal(s.resident, 10);
  /* keep none: pages 2-9 go; never page 1, which the live block [0, 6)
   * shares with the free range, nor page 0 */
  assert_int_equal(extents_release(&s, 0, record_drop, &d), 8);
  assert_int_equal(d.n, 2);
  assert_ptr_equal(d.at[1], region_a + 8 * KB);
  assert_int_equal(d.bytes[1], 32 * KB);
  assert_int_equal(s.resident, 2);
  /* a block taken again over released pages marks them again: [6, 14)
   * overlaps pages 1-3, of which 2 and 3 were released */
  assert_ptr_equal(extents_take(&s, 8 * KB), region_a + 6 * KB);
  assert_int_equal(s.resident, 4);
  extents_free(&s);
}

#define MB ((size_t)1 << 20)

static void arena_open(mem_arena *a) {
  sched_placement pl = {.nnodes = 1};
  assert_int_equal(mem_arena_init(a, NULL, &pl), REMAT_OK);
}

static size_t arena_capacity(mem_arena *a) {
  size_t bytes, resident;
  mem_home_regions(a, 0, &bytes, &resident);
  return bytes;
}

static size_t arena_resident(mem_arena *a) {
  size_t bytes, resident;
  mem_home_regions(a, 0, &bytes, &resident);
  return resident;
}

static int arena_regions(mem_arena *a) {
  size_t bytes, resident;
  return mem_home_regions(a, 0, &bytes, &resident);
}

/* Twelve rounds of blocks of a new size each (1 to 12 times 64 KB, four
 * live at once) reuse the bytes the rounds before freed: one region holds
 * them all, where keeping each size apart would take 5 MB. */
static void test_arena_sizes_share_one_region(void **state) {
  (void)state;
  mem_arena a;
  arena_open(&a);
  for (int round = 1; round <= 12; round++) {
    size_t size = (size_t)round * 64 * KB;
    void *p[4];
    for (int i = 0; i < 4; i++)
      assert_non_null(p[i] = mem_alloc(&a, size, REMAT_MEM_ACTIVATIONS, 0,
                                       true));
    for (int i = 0; i < 4; i++)
      mem_free(&a, p[i], size, REMAT_MEM_ACTIVATIONS, 0, true);
  }
  assert_int_equal(arena_regions(&a), 1);
  assert_int_equal(arena_capacity(&a), 4 * MB);
  assert_int_equal(a.total_current, 0);
  assert_int_equal(a.total_peak, 4 * 12 * 64 * KB);
  mem_arena_destroy(&a);
}

/* Blocks freed in an order that leaves holes too small for what comes
 * next: the pages of free ranges go back to the system, so the resident
 * bytes stay within 1/128 of the peak of live bytes plus two huge pages,
 * and live blocks keep their contents. */
static void test_arena_resident_follows_peak(void **state) {
  (void)state;
  mem_arena a;
  arena_open(&a);
  char *big[16], *wide[4];
  for (int i = 0; i < 16; i++) {
    big[i] = mem_alloc(&a, 4 * MB, REMAT_MEM_ACTIVATIONS, 0, true);
    assert_non_null(big[i]);
    memset(big[i], i + 1, 4 * MB);
  }
  for (int i = 0; i < 16; i += 2) /* eight holes of 4 MB */
    mem_free(&a, big[i], 4 * MB, REMAT_MEM_ACTIVATIONS, 0, true);
  for (int i = 0; i < 4; i++) { /* 6 MB: no hole holds one */
    wide[i] = mem_alloc(&a, 6 * MB, REMAT_MEM_ACTIVATIONS, 0, true);
    assert_non_null(wide[i]);
    memset(wide[i], 0x70 + i, 6 * MB);
    size_t peak = (size_t)a.total_peak;
    size_t bound = peak + peak / 128 + 2 * REMAT_HUGE_PAGE;
    if (arena_resident(&a) > bound)
      fail_msg("after block %d: %zu bytes resident, over the bound %zu", i,
               arena_resident(&a), bound);
    assert_true(arena_resident(&a) >= (size_t)a.total_current);
  }
  assert_int_equal(a.total_peak, 64 * MB);
  for (int i = 1; i < 16; i += 2)
    for (size_t k = 0; k < 4 * MB; k += 4093)
      assert_int_equal(big[i][k], i + 1);
  for (int i = 0; i < 4; i++) {
    for (size_t k = 0; k < 6 * MB; k += 4093)
      assert_int_equal(wide[i][k], 0x70 + i);
    mem_free(&a, wide[i], 6 * MB, REMAT_MEM_ACTIVATIONS, 0, true);
  }
  for (int i = 1; i < 16; i += 2)
    mem_free(&a, big[i], 4 * MB, REMAT_MEM_ACTIVATIONS, 0, true);
  mem_arena_destroy(&a);
}

/* A block that needs a new region when the system refuses it: NULL, no
 * byte counted, and the same call succeeds once the system gives. */
static void test_arena_growth_fails_cleanly(void **state) {
  (void)state;
  mem_arena a;
  arena_open(&a);
  void *more = mem_alloc(&a, 2 * MB, REMAT_MEM_ACTIVATIONS, 0, true);
  mem_free(&a, more, 2 * MB, REMAT_MEM_ACTIVATIONS, 0, true); /* its list */
  void *first = mem_alloc(&a, 3 * MB, REMAT_MEM_ACTIVATIONS, 0, true);
  assert_non_null(first);
  remat__alloc_fail_after(1);
  more = mem_alloc(&a, 2 * MB, REMAT_MEM_ACTIVATIONS, 0, true);
  assert_int_equal(remat__alloc_count(), 1);
  remat__alloc_fail_after(0);
  assert_null(more);
  assert_int_equal(a.total_current, 3 * MB);
  assert_int_equal(arena_regions(&a), 1);
  assert_non_null(more = mem_alloc(&a, 2 * MB, REMAT_MEM_ACTIVATIONS, 0,
                                   true));
  assert_int_equal(arena_regions(&a), 2);
  assert_int_equal(a.total_current, 5 * MB);
  mem_free(&a, more, 2 * MB, REMAT_MEM_ACTIVATIONS, 0, true);
  mem_free(&a, first, 3 * MB, REMAT_MEM_ACTIVATIONS, 0, true);
  mem_arena_destroy(&a);
}

/* After mem_expect and mem_reserve, the expected blocks (more than the
 * smallest region holds, of several sizes) are taken and given back with
 * every system allocation failing. */
static void test_arena_reserved_allocates_nothing(void **state) {
  (void)state;
  mem_arena a;
  arena_open(&a);
  size_t sizes[3] = {1 * MB + 64, 640 * KB, 4 * KB};
  int64_t counts[3] = {5, 6, 40};
  for (int k = 0; k < 3; k++)
    assert_int_equal(mem_expect(&a, sizes[k], counts[k], 0), REMAT_OK);
  assert_int_equal(mem_reserve(&a), REMAT_OK);
  remat__alloc_fail_after(1);
  void *p[3][40];
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < counts[k]; i++)
      assert_non_null(p[k][i] = mem_alloc(&a, sizes[k],
                                          REMAT_MEM_ACTIVATIONS, 0, true));
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < counts[k]; i++)
      mem_free(&a, p[k][i], sizes[k], REMAT_MEM_ACTIVATIONS, 0, true);
  assert_int_equal(remat__alloc_count(), 0);
  remat__alloc_fail_after(0);
  mem_arena_destroy(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_best_fit_and_merge),
      cmocka_unit_test(test_regions_do_not_merge),
      cmocka_unit_test(test_reserved_bookkeeping_allocates_nothing),
      cmocka_unit_test(test_sizes_share_bytes),
      cmocka_unit_test(test_release_whole_free_pages),
      cmocka_unit_test(test_arena_sizes_share_one_region),
      cmocka_unit_test(test_arena_resident_follows_peak),
      cmocka_unit_test(test_arena_growth_fails_cleanly),
      cmocka_unit_test(test_arena_reserved_allocates_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
