/* Tests of what the ranks of a data-parallel step agree on, without MPI:
 * the failure (runtime/dp/dp_failure.h: the MPI_MAX of the ranks' keys
 * must name a rank together with that rank's own status), the first
 * difference of two ranks' step descriptions and the values each step
 * shares (runtime/dp/dp_check.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/dp/dp_check.h"
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

static bool first_difference(const char *a, const char *b, char *out,
                             size_t size) {
  return dp_first_difference(a, strlen(a), 1, b, strlen(b), 0, out, size);
}

/* The first line that differs, by key when the keys match; a line that one
 * description lacks reads "nothing"; equal descriptions have none. */
static void test_first_difference(void **state) {
  (void)state;
  const char *mine = "precision: f32\nparameter count: 2\n"
                     "parameter 0: 'wte' f32 [48,32]\n"
                     "parameter 1: 'wpe' f32 [8,32]\n";
  char out[200];
  assert_false(first_difference(mine, mine, out, sizeof out));
  assert_true(first_difference("precision: f32\nparameter count: 2\n"
                               "parameter 0: 'wte' f32 [48,32]\n"
                               "parameter 1: 'wpe' f32 [8,64]\n",
                               mine, out, sizeof out));
  assert_string_equal(out, "parameter 1 is 'wpe' f32 [8,64] on rank 1 and "
                           "'wpe' f32 [8,32] on rank 0");
  assert_true(first_difference("precision: f32\nweight decay: 0\n", mine,
                               out, sizeof out));
  assert_string_equal(out, "weight decay: 0 on rank 1 and parameter count: "
                           "2 on rank 0");
  assert_true(first_difference("precision: f32\n", mine, out, sizeof out));
  assert_string_equal(out, "nothing on rank 1 and parameter count: 2 on "
                           "rank 0");
  /* cut to the buffer, still terminated */
  assert_true(first_difference("precision: bf16\n", mine, out, 12));
  assert_string_equal(out, "precision i");
}

/* The MPI_MAX over ranks of their packed values. */
static void reduce_max(int64_t *into, const int64_t *slots) {
  for (int k = 0; k < DP_SHARED_SLOTS; k++)
    into[k] = slots[k] > into[k] ? slots[k] : into[k];
}

/* Three ranks' values reduced: the same everywhere is no difference; one
 * rank apart names the value with the smallest and largest, the first
 * kind that differs winning. */
static void test_shared_values(void **state) {
  (void)state;
  int64_t all[DP_SHARED_SLOTS], one[DP_SHARED_SLOTS];
  char out[200];
  dp_shared_pack(all, 0.01f, 0.0f, false, 0, 7);
  for (int r = 1; r < 3; r++) {
    dp_shared_pack(one, 0.01f, 0.0f, false, 0, 7);
    reduce_max(all, one);
  }
  assert_false(dp_shared_differ(all, out, sizeof out));
  dp_shared_pack(one, 0.02f, 1.5f, false, 0, 7); /* lr and clip apart */
  reduce_max(all, one);
  assert_true(dp_shared_differ(all, out, sizeof out));
  assert_string_equal(out, "the learning rate is not the same on every rank "
                           "(smallest 0.01, largest 0.02)");
  dp_shared_pack(all, 0.01f, 0.0f, false, 0, 7);
  dp_shared_pack(one, 0.01f, 0.0f, false, 0, 7);
  one[2 * DP_SHARED_LR] += 1; /* the next float up: shown in 9 digits */
  one[2 * DP_SHARED_LR + 1] -= 1;
  reduce_max(all, one);
  assert_true(dp_shared_differ(all, out, sizeof out));
  assert_string_equal(out, "the learning rate is not the same on every rank "
                           "(smallest 0.00999999978, largest 0.0100000007)");
  dp_shared_pack(all, 0.01f, 0.0f, false, 2, 7);
  dp_shared_pack(one, 0.01f, 0.0f, false, 1, 9);
  reduce_max(all, one);
  assert_true(dp_shared_differ(all, out, sizeof out));
  assert_string_equal(out, "the count of micro-steps accumulated since the "
                           "last update is not the same on every rank "
                           "(smallest 1, largest 2)");
  dp_shared_pack(all, 0.01f, 0.0f, false, 0, 7);
  dp_shared_pack(one, 0.01f, 0.0f, true, 0, 9);
  reduce_max(all, one);
  assert_true(dp_shared_differ(all, out, sizeof out));
  assert_string_equal(out, "some ranks called remat_step and others "
                           "remat_accumulate");
  dp_shared_pack(all, 0.01f, 0.0f, false, 0, 7);
  dp_shared_pack(one, 0.01f, 0.0f, false, 0, 9);
  reduce_max(all, one);
  assert_true(dp_shared_differ(all, out, sizeof out));
  assert_string_equal(out, "the count of updates applied is not the same on "
                           "every rank (smallest 7, largest 9)");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank_paired_with_its_status),
      cmocka_unit_test(test_no_failure),
      cmocka_unit_test(test_first_difference),
      cmocka_unit_test(test_shared_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
