/* The tensor arena's free ranges (runtime/core/extents.h): best fit, the
 * lowest address among equals, merging with both neighbours on give-back
 * but never across regions, a give-back that allocates nothing, and the
 * property the arena is for: blocks of different sizes live at different
 * times reuse the same bytes, so a region as large as the peak of live
 * bytes serves a pattern whose sizes' own peaks sum to far more. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "base/alloc.h"
#include "runtime/core/extents.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_best_fit_and_merge),
      cmocka_unit_test(test_regions_do_not_merge),
      cmocka_unit_test(test_reserved_bookkeeping_allocates_nothing),
      cmocka_unit_test(test_sizes_share_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
