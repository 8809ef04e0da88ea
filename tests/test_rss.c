/* The memory the process holds follows what remat counts: over 4 training
 * steps of a GPT (2 layers, d768, seq 256, batch 8), the growth of the
 * process's resident anonymous memory (RssAnon) over its state before the
 * graph is built stays within 5% of the largest peak_bytes a step
 * reported, at the thread count REMAT_TEST_THREADS names (1 or 2: meson
 * runs both). Built only without sanitizers, whose shadow memory is not
 * remat's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "remat.h"
#include "remat_gpt.h"

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
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = threads};
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  int64_t before = rss_anon();
  const remat_gpt_config cfg = {.layers = 2, .d_model = 768, .heads = 12,
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
  int64_t peak = 0;
  for (int step = 0; step < 4; step++) {
    remat_step_stats st = {.size = sizeof st};
    assert_int_equal(remat_step(g, &st), REMAT_OK);
    if (st.peak_bytes > peak)
      peak = st.peak_bytes;
  }
  int64_t growth = rss_anon() - before;
  printf("threads %d: RssAnon growth %.1f MiB, peak_bytes %.1f MiB, "
         "ratio %.3f\n",
         threads, (double)growth / 1048576, (double)peak / 1048576,
         (double)growth / (double)peak);
  if (growth > peak + peak / 20)
    fail_msg("threads %d: the process grew by %lld bytes, over 1.05 x "
             "peak_bytes (%lld)",
             threads, (long long)growth, (long long)peak);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rss_within_peak),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
