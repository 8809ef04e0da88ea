/* The memory the process holds follows what remat counts: over 4 training
 * steps of a GPT (seq 256, batch 8), the growth of the process's resident
 * anonymous memory (RssAnon) over its state before the graph is built stays
 * within the bound README.md states against the largest peak_bytes a step
 * reported, at the thread count REMAT_TEST_THREADS names (1 or 2: meson
 * runs both). REMAT_TEST_RSS_MODEL picks the model: "d768" (2 layers,
 * d_model 768, peak about 450 MB), where the bound is 1.05 x peak_bytes,
 * or "small" (4 layers, d_model 128, peak about 55 MB), where the memory
 * that is not remat's to count (oneDNN's generated code and the buffers
 * its f32 gemm mallocs on each worker thread, the graph's and compiled
 * step's own structures: docs/architecture.md) is a larger share, and the
 * bound is 1.05 x peak_bytes + 12 MiB + 4 MiB per worker thread after the
 * first. At 1 thread, where the schedule is the same every step, steps
 * after the second also make no allocation of remat's own (base/alloc.h
 * counts them): every byte of a step in steady state comes from the
 * arena. Built only without sanitizers, whose shadow memory is not
 * remat's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/alloc.h"
#include "remat.h"
#include "remat_gpt.h"

/* README.md's bound on RssAnon growth: RSS_PER_MILLE / 1000 x peak_bytes,
 * plus, for the small model, RSS_FIXED_MIB + RSS_PER_THREAD_MIB x (threads
 * - 1). */
#define RSS_PER_MILLE 1050
#define RSS_FIXED_MIB 12
#define RSS_PER_THREAD_MIB 4
#define STEPS 4

/* RssAnon of this process, in bytes. */
static int64_t rss_anon(void) {
  FILE *f = fopen("/proc/self/status", "r");
  assert_non_null(f);
  char line[256];
  int64_t kib = -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, "RssAnon:", 8) == 0)
      kib = atoll(line + 8);
  fclose(f);
  assert_true(kib >= 0);
  return kib * 1024;
}

static void test_rss_within_peak(void **state) {
  (void)state;
  const char *env = getenv("REMAT_TEST_THREADS");
  int threads = env != NULL ? atoi(env) : 1;
  assert_true(threads >= 1 && threads <= 64);
  const char *model = getenv("REMAT_TEST_RSS_MODEL");
  bool small = model != NULL && strcmp(model, "small") == 0;
  assert_true(small || model == NULL || strcmp(model, "d768") == 0);
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = threads};
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  int64_t before = rss_anon();
  const remat_gpt_config cfg =
      small ? (remat_gpt_config){.layers = 4, .d_model = 128, .heads = 4,
                                 .seq = 256, .batch = 8, .vocab = 256}
            : (remat_gpt_config){.layers = 2, .d_model = 768, .heads = 12,
                                 .seq = 256, .batch = 8, .vocab = 256};
  remat_graph *g = NULL;
  remat_gpt m;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_gpt_build(g, &cfg, &m), REMAT_OK);
  const remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-4f};
  assert_int_equal(remat_compile(g, m.loss, &opt), REMAT_OK);
  size_t n = (size_t)cfg.batch * (size_t)cfg.seq;
  int32_t *tokens = malloc(n * sizeof *tokens);
  assert_non_null(tokens);
  for (size_t i = 0; i < n; i++)
    tokens[i] = (int32_t)((i * 7 + 3) % 256);
  assert_int_equal(remat_feed(g, m.tokens, tokens, n * sizeof *tokens),
                   REMAT_OK);
  assert_int_equal(remat_feed(g, m.targets, tokens, n * sizeof *tokens),
                   REMAT_OK);
  free(tokens);
  int64_t peak = 0, allocations = 0;
  for (int step = 0; step < STEPS; step++) {
    if (step == 2)
      allocations = remat__alloc_count();
    remat_step_stats st = {.size = sizeof st};
    assert_int_equal(remat_step(g, &st), REMAT_OK);
    if (st.peak_bytes > peak)
      peak = st.peak_bytes;
  }
  allocations = remat__alloc_count() - allocations;
  int64_t growth = rss_anon() - before;
  int64_t bound = peak / 1000 * RSS_PER_MILLE;
  if (small)
    bound += ((int64_t)RSS_FIXED_MIB +
              (int64_t)RSS_PER_THREAD_MIB * (threads - 1)) << 20;
  printf("%s model, threads %d: RssAnon growth %.1f MiB, peak_bytes %.1f "
         "MiB, ratio %.3f, bound %.1f MiB; remat's allocations in steps 3-%d: "
         "%lld\n",
         small ? "small" : "d768", threads, (double)growth / 1048576,
         (double)peak / 1048576, (double)growth / (double)peak,
         (double)bound / 1048576, STEPS, (long long)allocations);
  if (growth > bound)
    fail_msg("threads %d: the process grew by %lld bytes, over the bound of "
             "%lld (peak_bytes %lld)",
             threads, (long long)growth, (long long)bound, (long long)peak);
  if (threads == 1 && allocations != 0)
    fail_msg("steps 3-%d made %lld allocations of remat's own; a step in "
             "steady state takes every byte from the arena",
             STEPS, (long long)allocations);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rss_within_peak),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
