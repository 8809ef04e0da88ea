/* Tests of the failure the ranks of a data-parallel step agree on
 * (runtime/dp/dp_failure.h), without MPI: the MPI_MAX of the ranks' keys
 * must name a rank together with that rank's own status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "runtime/dp/dp_failure.h"

/* What MPI_MAX over the ranks' keys gives, decoded. */
static bool agreed(const int *status, int size, int *out_status, int *rank) {
  int key = -1;
  for (int r = 0; r < size; r++) {
    int k = dp_failure_key(status[r], r, size);
    key = k > key ? k : key;
  }
  return dp_failure_of(key, size, out_status, rank);
}

static void test_rank_paired_with_its_status(void **state) {
  (void)state;
  int s, r;
  /* rank 0 has the larger code: before, the larger rank (1) was named */
  const int a[] = {REMAT_ERR_IO, REMAT_ERR_SHAPE};
  assert_true(agreed(a, 2, &s, &r));
  assert_int_equal(s, REMAT_ERR_IO);
  assert_int_equal(r, 0);
  const int b[] = {REMAT_ERR_SHAPE, REMAT_ERR_IO};
  assert_true(agreed(b, 2, &s, &r));
  assert_int_equal(s, REMAT_ERR_IO);
  assert_int_equal(r, 1);
  /* out of memory is reported over a larger code, with its rank */
  const int c[] = {REMAT_ERR_OUT_OF_MEMORY, REMAT_ERR_POLICY, REMAT_OK};
  assert_true(agreed(c, 3, &s, &r));
  assert_int_equal(s, REMAT_ERR_OUT_OF_MEMORY);
  assert_int_equal(r, 0);
  /* equal statuses: the larger rank */
  const int d[] = {REMAT_OK, REMAT_ERR_STATE, REMAT_OK, REMAT_ERR_STATE};
  assert_true(agreed(d, 4, &s, &r));
  assert_int_equal(s, REMAT_ERR_STATE);
  assert_int_equal(r, 3);
  /* one failure among many ranks, at the last rank */
  int e[300] = {0};
  e[299] = REMAT_ERR_POLICY;
  assert_true(agreed(e, 300, &s, &r));
  assert_int_equal(s, REMAT_ERR_POLICY);
  assert_int_equal(r, 299);
}

static void test_no_failure(void **state) {
  (void)state;
  const int ok[] = {REMAT_OK, REMAT_OK};
  int s = -5, r = -5;
  assert_false(agreed(ok, 2, &s, &r));
  assert_int_equal(s, REMAT_OK);
  assert_int_equal(r, -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank_paired_with_its_status),
      cmocka_unit_test(test_no_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
