/* Tests of configuration: every bad REMAT_* value gets its exact error,
 * good values and code overrides take effect, byte sizes parse, policy
 * strings parse or fail with a message that lists the valid choices, and a
 * trace path that cannot be written fails runtime creation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "remat.h"
#include "tmpdir.h"

static const char *const vars[] = {"REMAT_NUM_THREADS", "REMAT_BIND",
                                   "REMAT_POLICY", "REMAT_MEMORY_BUDGET",
                                   "REMAT_LOOKAHEAD", "REMAT_TRACE",
                                   "REMAT_VERBOSE", "REMAT_TOPOLOGY",
                                   "REMAT_PRECISION"};

static int clear_env(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
    unsetenv(vars[i]);
  return 0;
}

static void expect_env_error(const char *var, const char *value,
                             const char *message) {
  clear_env(NULL);
  setenv(var, value, 1);
  remat_runtime *rt = (remat_runtime *)0x1;
  assert_int_equal(remat_runtime_create(NULL, &rt), REMAT_ERR_CONFIG);
  assert_null(rt);
  assert_string_equal(remat_last_error(), message);
  unsetenv(var);
}

#define THREADS_MSG(v)                                                         \
  "REMAT_NUM_THREADS='" v "' is not valid: expected a whole number of worker " \
  "threads from 1 to 1024"

static void test_bad_threads(void **state) {
  (void)state;
  expect_env_error("REMAT_NUM_THREADS", "0", THREADS_MSG("0"));
  expect_env_error("REMAT_NUM_THREADS", "-3", THREADS_MSG("-3"));
  expect_env_error("REMAT_NUM_THREADS", "abc", THREADS_MSG("abc"));
  expect_env_error("REMAT_NUM_THREADS", "100000", THREADS_MSG("100000"));
  expect_env_error("REMAT_NUM_THREADS", "4x", THREADS_MSG("4x"));
  expect_env_error("REMAT_NUM_THREADS", "", THREADS_MSG(""));
}

static void test_bad_bind(void **state) {
  (void)state;
  expect_env_error("REMAT_BIND", "foo",
                   "REMAT_BIND='foo' is not valid: expected one of core, "
                   "numa, none");
}

/* A long value, or one with control bytes, is quoted in part (100 bytes,
 * then "...") and escaped, so the message keeps what is accepted (the
 * whole value once pushed it past the message's 512 bytes). */
static void test_long_values_quoted(void **state) {
  (void)state;
  char value[700], want[512];
  memset(value, 'x', sizeof value - 1);
  value[sizeof value - 1] = '\0';
  value[1] = '\n';
  snprintf(want, sizeof want,
           "REMAT_PRECISION='x\\x0A%.95s...' is not valid: expected f32 or "
           "bf16", value + 2);
  expect_env_error("REMAT_PRECISION", value, want);
  snprintf(want, sizeof want,
           "REMAT_MEMORY_BUDGET='x\\x0A%.95s...' is not valid: expected a "
           "positive byte size with an optional unit and no space, such as "
           "1.5GiB, 800MB or 4096 (units B, KB, MB, GB, TB, KiB, MiB, GiB, "
           "TiB)", value + 2);
  expect_env_error("REMAT_MEMORY_BUDGET", value, want);
  int64_t bytes;
  assert_int_equal(remat_parse_bytes(value, &bytes), REMAT_ERR_CONFIG);
  assert_non_null(strstr(remat_last_error(), "...' is not a byte size: "
                                             "expected a positive number"));
}

#define BUDGET_MSG(v)                                                          \
  "REMAT_MEMORY_BUDGET='" v "' is not valid: expected a positive byte size "   \
  "with an optional unit and no space, such as 1.5GiB, 800MB or 4096 (units " \
  "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"

static void test_bad_budget_lookahead_verbose(void **state) {
  (void)state;
  expect_env_error("REMAT_MEMORY_BUDGET", "1.5 GB", BUDGET_MSG("1.5 GB"));
  expect_env_error("REMAT_MEMORY_BUDGET", "-3MB", BUDGET_MSG("-3MB"));
  expect_env_error("REMAT_MEMORY_BUDGET", "lots", BUDGET_MSG("lots"));
  expect_env_error("REMAT_LOOKAHEAD", "0",
                   "REMAT_LOOKAHEAD='0' is not valid: expected a whole number "
                   "of regions from 1 to 64");
  expect_env_error("REMAT_VERBOSE", "3",
                   "REMAT_VERBOSE='3' is not valid: expected 0 (quiet), 1 "
                   "(plan summary) or 2 (per task)");
}

static void test_bad_policy_env(void **state) {
  (void)state;
  expect_env_error(
      "REMAT_POLICY", "dots_savable",
      "REMAT_POLICY: unknown remat policy 'dots_savable': expected one of "
      "everything_saveable, nothing_saveable, dots_saveable, checkpoint_dots, "
      "dots_with_no_batch_dims_saveable, checkpoint_dots_with_no_batch_dims, "
      "save_only_these_names:NAME[,NAME...], "
      "save_any_names_but_these:NAME[,NAME...], "
      "save_anything_except_these_names:NAME[,NAME...], "
      "save_from_both_policies:P+Q, auto");
}

static void test_good_env_and_override(void **state) {
  (void)state;
  clear_env(NULL);
  setenv("REMAT_NUM_THREADS", "3", 1);
  setenv("REMAT_BIND", "none", 1);
  setenv("REMAT_MEMORY_BUDGET", "1.5GiB", 1);
  setenv("REMAT_POLICY", "dots_saveable", 1);
  setenv("REMAT_LOOKAHEAD", "5", 1);
  setenv("REMAT_TRACE", "/tmp/remat-test-config-trace.json", 1);
  setenv("REMAT_VERBOSE", "1", 1);
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(NULL, &rt), REMAT_OK);
  remat_config c;
  assert_int_equal(remat_runtime_config(rt, &c), REMAT_OK);
  assert_int_equal(c.num_threads, 3);
  assert_int_equal(remat_runtime_num_threads(rt), 3);
  assert_int_equal(c.bind, REMAT_BIND_NONE);
  assert_int_equal(c.memory_budget, (int64_t)(1.5 * 1073741824.0));
  assert_string_equal(c.policy, "dots_saveable");
  assert_int_equal(c.lookahead, 5);
  assert_string_equal(c.trace_path, "/tmp/remat-test-config-trace.json");
  assert_int_equal(c.verbose, 1);
  remat_runtime_destroy(rt);

  /* Code wins only for the fields it sets. */
  remat_config code = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                              REMAT_SET_LOOKAHEAD | REMAT_SET_TRACE,
                       .num_threads = 2,
                       .policy = "nothing_saveable",
                       .lookahead = 2};
  assert_int_equal(remat_runtime_create(&code, &rt), REMAT_OK);
  assert_int_equal(remat_runtime_config(rt, &c), REMAT_OK);
  assert_int_equal(c.num_threads, 2);
  assert_string_equal(c.policy, "nothing_saveable");
  assert_int_equal(c.lookahead, 2);
  assert_null(c.trace_path);
  assert_int_equal(c.bind, REMAT_BIND_NONE);
  assert_int_equal(c.memory_budget, (int64_t)(1.5 * 1073741824.0));
  assert_int_equal(c.verbose, 1);
  remat_runtime_destroy(rt);

  code.num_threads = 0;
  assert_int_equal(remat_runtime_create(&code, &rt), REMAT_ERR_CONFIG);
  assert_string_equal(remat_last_error(),
                      "remat_config.num_threads=0 is not valid: expected 1 to "
                      "1024");
  clear_env(NULL);
}

/* REMAT_SET_NO_ENV: a runtime reads none of the REMAT_* variables, bad as
 * they are here, and takes the code's fields and the defaults; without
 * the bit the first bad variable fails creation as before. */
static void test_no_env(void **state) {
  (void)state;
  clear_env(NULL);
  setenv("REMAT_NUM_THREADS", "lots", 1);
  setenv("REMAT_BIND", "everywhere", 1);
  setenv("REMAT_POLICY", "save_nothing_please", 1);
  setenv("REMAT_MEMORY_BUDGET", "-3", 1);
  setenv("REMAT_LOOKAHEAD", "0", 1);
  setenv("REMAT_TRACE", "/nonexistent-dir/trace.json", 1);
  setenv("REMAT_VERBOSE", "9", 1);
  setenv("REMAT_TOPOLOGY", "not a topology", 1);
  setenv("REMAT_PRECISION", "f64", 1);
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(NULL, &rt), REMAT_ERR_CONFIG);
  assert_null(rt);
  assert_string_equal(remat_last_error(), THREADS_MSG("lots"));
  /* Setting a field does not silence its variable: all are read first. */
  remat_config only = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  assert_int_equal(remat_runtime_create(&only, &rt), REMAT_ERR_CONFIG);
  assert_string_equal(remat_last_error(), THREADS_MSG("lots"));

  remat_config code = {.set = REMAT_SET_NO_ENV | REMAT_SET_NUM_THREADS |
                              REMAT_SET_LOOKAHEAD,
                       .num_threads = 2, .lookahead = 3};
  assert_int_equal(remat_runtime_create(&code, &rt), REMAT_OK);
  remat_config c;
  assert_int_equal(remat_runtime_config(rt, &c), REMAT_OK);
  assert_int_equal(c.set, REMAT_SET_NO_ENV);
  assert_int_equal(c.num_threads, 2);
  assert_int_equal(remat_runtime_num_threads(rt), 2);
  assert_int_equal(c.lookahead, 3);
  assert_int_equal(c.bind, REMAT_BIND_CORE);
  assert_string_equal(c.policy, "nothing_saveable");
  assert_int_equal(c.memory_budget, 0);
  assert_null(c.trace_path);
  assert_int_equal(c.verbose, 0);
  assert_null(c.topology);
  assert_int_equal(c.precision, REMAT_PRECISION_F32);
  remat_runtime_destroy(rt);

  /* The code's own fields are still checked. */
  code.lookahead = 0;
  assert_int_equal(remat_runtime_create(&code, &rt), REMAT_ERR_CONFIG);
  assert_string_equal(remat_last_error(),
                      "remat_config.lookahead=0 is not valid: expected 1 to "
                      "64");
  clear_env(NULL);
}

static void test_parse_bytes(void **state) {
  (void)state;
  int64_t b = 0;
  assert_int_equal(remat_parse_bytes("800MB", &b), REMAT_OK);
  assert_int_equal(b, 800000000);
  assert_int_equal(remat_parse_bytes("2KiB", &b), REMAT_OK);
  assert_int_equal(b, 2048);
  assert_int_equal(remat_parse_bytes("4096", &b), REMAT_OK);
  assert_int_equal(b, 4096);
  assert_int_equal(remat_parse_bytes("0.5KB", &b), REMAT_OK);
  assert_int_equal(b, 500);
  assert_int_equal(remat_parse_bytes("1.5GiB", &b), REMAT_OK);
  assert_int_equal(b, 1610612736);
  assert_int_equal(remat_parse_bytes("1TB", &b), REMAT_OK);
  assert_int_equal(b, 1000000000000);
  const char *bad[] = {"", "0", "1.5 GB", "-3MB", "lots", "1GBB", "1..5MB",
                       "MB"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char message[256];
    snprintf(message, sizeof message,
             "'%s' is not a byte size: expected a positive number with an "
             "optional unit and no space, such as 1.5GiB, 800MB or 4096 "
             "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
             bad[i]);
    assert_int_equal(remat_parse_bytes(bad[i], &b), REMAT_ERR_CONFIG);
    assert_string_equal(remat_last_error(), message);
  }
}

static void expect_policy_error(const char *text, const char *message) {
  remat_policy *p = (remat_policy *)0x1;
  assert_int_equal(remat_policy_parse(text, &p), REMAT_ERR_POLICY);
  assert_null(p);
  assert_string_equal(remat_last_error(), message);
}

static void test_policy_strings(void **state) {
  (void)state;
  const char *good[] = {
      "everything_saveable", "nothing_saveable", "dots_saveable",
      "dots_with_no_batch_dims_saveable", "save_only_these_names:attn_out,ffn_in",
      "save_any_names_but_these:attn_probs", "auto",
      "save_from_both_policies:dots_saveable+save_only_these_names:attn_probs"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    remat_policy *p = NULL;
    assert_int_equal(remat_policy_parse(good[i], &p), REMAT_OK);
    char buf[256];
    assert_int_equal(remat_policy_format(p, buf, sizeof buf), REMAT_OK);
    assert_string_equal(buf, good[i]);
    remat_policy_destroy(p);
  }
  remat_policy *alias = NULL;
  assert_int_equal(remat_policy_parse("checkpoint_dots", &alias), REMAT_OK);
  char buf[64];
  assert_int_equal(remat_policy_format(alias, buf, sizeof buf), REMAT_OK);
  assert_string_equal(buf, "dots_saveable");
  remat_policy_destroy(alias);

  expect_policy_error(
      "dots_savable",
      "unknown remat policy 'dots_savable': expected one of "
      "everything_saveable, nothing_saveable, dots_saveable, checkpoint_dots, "
      "dots_with_no_batch_dims_saveable, checkpoint_dots_with_no_batch_dims, "
      "save_only_these_names:NAME[,NAME...], "
      "save_any_names_but_these:NAME[,NAME...], "
      "save_anything_except_these_names:NAME[,NAME...], "
      "save_from_both_policies:P+Q, auto");
  expect_policy_error("save_only_these_names:",
                      "save_only_these_names: empty name at offset 22 (nothing "
                      "after ':'): expected save_only_these_names:NAME[,NAME...], "
                      "e.g. "
                      "save_only_these_names:attn_out,ffn_in");
  expect_policy_error("save_any_names_but_these:a,,b",
                      "save_any_names_but_these: empty name at offset 27 (two "
                      "',' in a row): expected "
                      "save_any_names_but_these:NAME[,NAME...], e.g. "
                      "save_any_names_but_these:attn_out,ffn_in");
  expect_policy_error("save_from_both_policies:dots_saveable",
                      "save_from_both_policies: expected '+' and a second "
                      "policy at offset 37, found the end of the string; e.g. "
                      "save_from_both_policies:dots_saveable+"
                      "save_only_these_names:attn_probs");
}

#define TRACE_ACCEPTED                                                         \
  "expected the path of a regular file that can be written (created if "      \
  "missing)"

/* REMAT_TRACE=path fails creation with `why` after "is not valid: ". */
static void expect_trace_error(const char *path, const char *why) {
  char message[512];
  snprintf(message, sizeof message,
           "REMAT_TRACE='%s' is not valid: %s; " TRACE_ACCEPTED, path, why);
  expect_env_error("REMAT_TRACE", path, message);
}

static remat_status create_with_trace(const char *path) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TRACE,
                     .num_threads = 1,
                     .trace_path = path};
  remat_runtime *rt = NULL;
  remat_status s = remat_runtime_create(&rc, &rt);
  remat_runtime_destroy(rt);
  return s;
}

static void test_trace_path_checked(void **state) {
  (void)state;
  char path[128], fifo[128], message[512];
  expect_trace_error(dir, "it is a directory");
  snprintf(path, sizeof path, "%s/missing/trace.json", dir);
  expect_trace_error(path, "it cannot be opened for writing (No such file or "
                           "directory)");
  expect_trace_error("/dev/full", "it is a character device");
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  expect_trace_error(fifo, "it is a FIFO");
  assert_int_equal(create_with_trace(dir), REMAT_ERR_CONFIG);
  snprintf(message, sizeof message,
           "remat_config.trace_path='%s' is not valid: it is a directory; "
           TRACE_ACCEPTED, dir);
  assert_string_equal(remat_last_error(), message);
  /* A missing file is created for the check, then removed. */
  snprintf(path, sizeof path, "%s/trace.json", dir);
  assert_int_equal(create_with_trace(path), REMAT_OK);
  assert_int_equal(access(path, F_OK), -1);
  /* An existing file is left as it was. */
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("earlier trace", f);
  fclose(f);
  assert_int_equal(create_with_trace(path), REMAT_OK);
  char text[32] = "";
  f = fopen(path, "r");
  assert_non_null(f);
  assert_non_null(fgets(text, sizeof text, f));
  fclose(f);
  assert_string_equal(text, "earlier trace");
  unlink(path);
  unlink(fifo);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_bad_threads, clear_env),
      cmocka_unit_test_setup(test_bad_bind, clear_env),
      cmocka_unit_test_setup(test_long_values_quoted, clear_env),
      cmocka_unit_test_setup(test_bad_budget_lookahead_verbose, clear_env),
      cmocka_unit_test_setup(test_bad_policy_env, clear_env),
      cmocka_unit_test_setup(test_good_env_and_override, clear_env),
      cmocka_unit_test_setup(test_no_env, clear_env),
      cmocka_unit_test(test_parse_bytes),
      cmocka_unit_test(test_policy_strings),
      cmocka_unit_test_setup(test_trace_path_checked, clear_env),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
