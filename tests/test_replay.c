/* Tests of the scheduler's replay (sched/replay.h): a small hand-built
 * DAG replayed at 1, 2 and 3 workers with fixed durations gives the
 * makespans worked out by hand from the pick rule, with and without a
 * per-task overhead, with NUMA affinities, and with queue locks that only
 * a continuation avoids; a cycle and a bad node count are refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "sched/replay.h"

/*   A(1) -> B(2), C(3), D(1);  B, C -> E(1);  D -> F(4);  E, F -> G(1);
 *   H(2) alone. Priorities A 10, B 9, C 8, D 7, E 6, F 5, G 4, H 3. */
enum { A, B, C, D, E, F, G, H, NTASKS };
static const int32_t prio[NTASKS] = {10, 9, 8, 7, 6, 5, 4, 3};
static const int32_t npred[NTASKS] = {0, 1, 1, 1, 2, 1, 2, 0};
static const int64_t succ_first[NTASKS + 1] = {0, 3, 4, 5, 6, 7, 8, 8, 8};
static const int32_t succ[8] = {B, C, D, E, E, F, G, G};
static const int32_t roots[2] = {A, H};
static const double seconds[NTASKS] = {1, 2, 3, 1, 1, 4, 1, 2};

static const sched_replay_dag dag = {NTASKS, prio, npred, succ_first,
                                     succ,   roots, 2,     NULL};

/* By hand, with no overhead and free locks:
 * 1 worker: every task in turn, 15.
 * 2 workers: A on w0 (0-1), H on w1 (0-2); A's end makes B, C, D ready:
 *   w0 keeps B (1-3) and heaps C, D; w1 steals C (2-5); w0 runs D (3-4),
 *   then F (4-8); w1 runs E (5-6); G waits for F: 8-9. Makespan 9.
 * 3 workers: w2 finds nothing at 0 and sleeps; A's end wakes it and it
 *   steals C (1-4); w0 keeps B (1-3); w1 ends H at 2 and steals D (2-3),
 *   then F (3-7); E runs 4-5 after C; G 7-8. Makespan 8 (the critical
 *   path A, D, F, G is 7: D waited behind C, which outranks it). */
static void test_hand_built_dag(void **state) {
  (void)state;
  sched_replay_timing free_sched = {0};
  assert_true(sched_replay_fixed(&dag, 1, 1, &free_sched, seconds) == 15.0);
  assert_true(sched_replay_fixed(&dag, 2, 1, &free_sched, seconds) == 9.0);
  assert_true(sched_replay_fixed(&dag, 3, 1, &free_sched, seconds) == 8.0);
  /* an overhead of 0.5 s before each task: on one worker 15 + 8 x 0.5 */
  sched_replay_timing overhead = {.overhead_s = 0.5};
  assert_true(sched_replay_fixed(&dag, 1, 1, &overhead, seconds) == 19.0);
  /* 4 workers: w2 and w3 sleep at 0; A's end pushes D, waking w3, and C,
   * waking w2; they steal C (1-4) and D (1-2), F runs 2-6, G 6-7: the
   * critical path, 7, as at 16 */
  assert_true(sched_replay_fixed(&dag, 4, 1, &free_sched, seconds) == 7.0);
  assert_true(sched_replay_fixed(&dag, 16, 1, &free_sched, seconds) == 7.0);
}

/* Two nodes of one worker each, C and D with node 1's affinity: A's end
 * (on w0, node 0) puts D, then C, in node 1's inbox (first in, first out)
 * and w0 keeps B (1-3). w1 ends H at 2 and takes D (2-3), keeps its
 * successor F (3-7) as its continuation, and only then C (7-10); E runs
 * 10-11 and G 11-12 on w1, while w0 has nothing it may run after 3. */
static void test_affinity(void **state) {
  (void)state;
  const int8_t node[NTASKS] = {-1, -1, 1, 1, -1, -1, -1, -1};
  sched_replay_dag d = dag;
  d.node = node;
  sched_replay_timing free_sched = {0};
  assert_true(sched_replay_fixed(&d, 2, 2, &free_sched, seconds) == 12.0);
}

/* A chain X -> Y -> Z of 1 s each on one worker with queue operations of
 * 0.25 s: only claiming the root takes a lock, Y and Z run as
 * continuations, so 3.25 (through the heap, 4.25). */
static void test_locks_and_continuations(void **state) {
  (void)state;
  const int32_t p[3] = {2, 1, 0}, n[3] = {0, 1, 1};
  const int64_t f[4] = {0, 1, 2, 2};
  const int32_t s[2] = {1, 2}, r[1] = {0};
  const double t[3] = {1, 1, 1};
  sched_replay_dag chain = {3, p, n, f, s, r, 1, NULL};
  sched_replay_timing locks = {.lock_s = 0.25};
  assert_true(sched_replay_fixed(&chain, 1, 1, &locks, t) == 3.25);
}

static void test_refused(void **state) {
  (void)state;
  sched_replay_timing free_sched = {0};
  assert_true(sched_replay_fixed(&dag, 1, 2, &free_sched, seconds) == -1.0);
  assert_true(sched_replay_fixed(&dag, 0, 1, &free_sched, seconds) == -1.0);
  /* X -> Y -> X and a root R: only R can run */
  const int32_t p[3] = {2, 1, 0}, n[3] = {1, 1, 0};
  const int64_t f[4] = {0, 1, 2, 2};
  const int32_t s[2] = {1, 0}, r[1] = {2};
  const double t[3] = {1, 1, 1};
  sched_replay_dag cyc = {3, p, n, f, s, r, 1, NULL};
  assert_true(sched_replay_fixed(&cyc, 2, 1, &free_sched, t) == -1.0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_built_dag),
      cmocka_unit_test(test_affinity),
      cmocka_unit_test(test_locks_and_continuations),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
