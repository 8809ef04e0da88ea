/* Tests of the remat-train command line: every kind of bad input gets its
 * one-line message and exit code (2 usage, 1 run-time), and a short run
 * saves weights that a second run loads and evaluates identically. The
 * binary's path comes from REMAT_TRAIN (set by tests/meson.build). */
#include <fcntl.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tmpdir.h"

extern char **environ;

typedef struct result {
  int code;
  char out[8192], err[8192];
} result;

static char *tmp_path(const char *name) {
  static char buf[8][160];
  static int next;
  char *p = buf[next++ % 8];
  snprintf(p, 160, "%s/%s", dir, name);
  return p;
}

static void slurp(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(buf, 1, len - 1, f) : 0;
  buf[n] = '\0';
  if (f)
    fclose(f);
}

/* Runs remat-train with the NULL-terminated arguments. */
static void run(result *r, ...) {
  const char *exe = getenv("REMAT_TRAIN");
  assert_non_null(exe);
  char *argv[40];
  int argc = 0;
  argv[argc++] = (char *)exe;
  va_list ap;
  va_start(ap, r);
  for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 39;)
    argv[argc++] = a;
  va_end(ap);
  argv[argc] = NULL;
  const char *out = tmp_path("stdout"), *err = tmp_path("stderr");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid;
  assert_int_equal(posix_spawn(&pid, exe, &fa, NULL, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  r->code = WEXITSTATUS(status);
  slurp(out, r->out, sizeof r->out);
  slurp(err, r->err, sizeof r->err);
}

static void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  fclose(f);
}

static void expect(const result *r, int code, const char *line) {
  char want[1024];
  snprintf(want, sizeof want, "remat-train: %s\n", line);
  assert_string_equal(r->err, want);
  assert_int_equal(r->code, code);
}

#define TINY "--layers", "1", "--d-model", "16", "--heads", "2", "--batch", \
             "8", "--threads", "2"

static void test_usage_errors(void **state) {
  (void)state;
  result r;
  run(&r, "--bogus", NULL);
  expect(&r, 2, "unknown option '--bogus' (see --help)");
  run(&r, "--d-model", "30", "--heads", "4", NULL);
  expect(&r, 2, "--d-model 30 is not divisible by --heads 4");
  run(&r, "--layers", "two", NULL);
  expect(&r, 2, "--layers 'two': expected a whole number from 1 to 1000000");
  run(&r, "--steps", NULL);
  expect(&r, 2, "--steps needs a value");
  run(&r, "--seq", "8", NULL);
  expect(&r, 2, "--seq 8 is shorter than an addition problem (13 tokens)");
  run(&r, "--budget", "lots", NULL);
  expect(&r, 2, "--budget 'lots': expected a size such as 64MiB or 1.5GB");
  run(&r, "--help", NULL);
  assert_int_equal(r.code, 0);
  assert_memory_equal(r.out, "usage: remat-train", 18);
}

static void test_data_errors(void **state) {
  (void)state;
  result r;
  char want[512];
  const char *missing = tmp_path("missing.txt");
  run(&r, "--data", missing, NULL);
  snprintf(want, sizeof want, "--data '%s': No such file or directory", missing);
  expect(&r, 1, want);
  const char *empty = tmp_path("empty.txt");
  write_file(empty, "", 0);
  run(&r, "--data", empty, NULL);
  snprintf(want, sizeof want, "--data '%s' is empty", empty);
  expect(&r, 1, want);
  const char *binary = tmp_path("binary.bin");
  write_file(binary, "ELF\0\1\2\3\0\0\0", 10);
  run(&r, "--data", binary, NULL);
  snprintf(want, sizeof want,
           "--data '%s' looks binary (NUL or control bytes): --data takes a "
           "text file", binary);
  expect(&r, 1, want);
  const char *small = tmp_path("small.txt");
  char text[100];
  memset(text, 'a', sizeof text);
  write_file(small, text, sizeof text);
  run(&r, "--data", small, "--seq", "128", NULL);
  snprintf(want, sizeof want,
           "--seq 128 is longer than the data: '%s' has 100 bytes, at least "
           "129 are needed", small);
  expect(&r, 1, want);
}

static void test_budget_infeasible(void **state) {
  (void)state;
  result r;
  run(&r, TINY, "--budget", "1KiB", "--steps", "1", NULL);
  assert_int_equal(r.code, 1);
  static const char head[] = "remat-train: memory budget of 1024 bytes "
                             "(0.00 MiB) is infeasible: the smallest feasible "
                             "budget for this graph is ";
  assert_memory_equal(r.err, head, sizeof head - 1);
  /* One line, ending in the smallest budget in MiB. */
  assert_true(strchr(r.err, '\n') == r.err + strlen(r.err) - 1);
  assert_non_null(strstr(r.err, " MiB)\n"));
}

static double json_number(const char *text, const char *key) {
  const char *p = strstr(text, key);
  assert_non_null(p);
  return strtod(p + strlen(key), NULL);
}

static void test_save_load(void **state) {
  (void)state;
  result r;
  const char *weights = tmp_path("tiny.safetensors");
  run(&r, TINY, "--steps", "20", "--json", "--save", weights, NULL);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.err, "");
  assert_non_null(strstr(r.out, "{\"step\": 20, "));
  char *done = strstr(r.out, "{\"done\": true");
  assert_non_null(done);
  double loss = json_number(done, "\"heldout_loss\": ");
  assert_true(loss > 0.0 && loss < 2.7); /* ln(14) = 2.64 untrained */
  assert_int_equal(access(tmp_path("tiny.safetensors.tmp"), F_OK), -1);

  run(&r, TINY, "--steps", "0", "--json", "--load", weights, NULL);
  assert_int_equal(r.code, 0);
  done = strstr(r.out, "{\"done\": true");
  assert_non_null(done);
  assert_float_equal(json_number(done, "\"heldout_loss\": "), loss, 0.0);

  char want[512];
  run(&r, "--layers", "1", "--d-model", "32", "--heads", "2", "--batch", "8",
      "--threads", "2", "--steps", "0", "--load", weights, NULL);
  snprintf(want, sizeof want,
           "remat_load_safetensors: '%s': tensor 'wte' has shape [14,16] in "
           "the file but [14,32] in the model", weights);
  expect(&r, 1, want);

  /* The same file cut short by 4 bytes. */
  FILE *f = fopen(weights, "rb");
  assert_non_null(f);
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  const char *cut = tmp_path("cut.safetensors");
  write_file(cut, buf, n - 4);
  run(&r, TINY, "--steps", "0", "--load", cut, NULL);
  assert_int_equal(r.code, 1);
  snprintf(want, sizeof want, "remat-train: remat_load_safetensors: '%s': "
           "tensor 'lm_head' has data_offsets [", cut);
  assert_memory_equal(r.err, want, strlen(want));
  assert_non_null(strstr(r.err, "(truncated file?)\n"));
  const char *junk = tmp_path("junk.safetensors");
  write_file(junk, "not a safetensors file", 22);
  run(&r, TINY, "--steps", "0", "--load", junk, NULL);
  snprintf(want, sizeof want,
           "remat_load_safetensors: '%s': header length 7021991845529153390 "
           "exceeds the 14 bytes after it (truncated or not a safetensors "
           "file)", junk);
  expect(&r, 1, want);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_usage_errors),
      cmocka_unit_test(test_data_errors),
      cmocka_unit_test(test_budget_infeasible),
      cmocka_unit_test(test_save_load),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
