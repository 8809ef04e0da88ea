/* Tests of remat-train's LoRA fine-tuning of its Llama model: a run split
 * by --resume of the adapter directory ends bitwise where a straight one
 * does (adapter file and training state, which holds no base weight), the
 * merged weights evaluate as base + adapters, and bad LoRA options get
 * their one-line messages. The binary's path comes from REMAT_TRAIN. */
#include <fcntl.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tmpdir.h"

extern char **environ;

typedef struct result {
  int code;
  char out[16384], err[4096];
} result;

/* DIR/NAME, in one of 64 buffers used in turn. */
static char *path_of(const char *name) {
  static char buf[64][160];
  static int next;
  char *p = buf[next++ % 64];
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

/* Runs remat-train with the model's options, then the NULL-terminated
 * arguments. */
static void run(result *r, ...) {
  static const char *const model[] = {
      "--model", "llama", "--layers",   "2", "--d-model", "32",
      "--heads", "4",     "--kv-heads", "2", "--seq",     "16",
      "--batch", "8",     "--threads",  "2", "--json"};
  const char *exe = getenv("REMAT_TRAIN");
  assert_non_null(exe);
  char *argv[64];
  int argc = 0;
  argv[argc++] = (char *)exe;
  for (size_t i = 0; i < sizeof model / sizeof *model; i++)
    argv[argc++] = (char *)model[i];
  va_list ap;
  va_start(ap, r);
  for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 63;)
    argv[argc++] = a;
  va_end(ap);
  argv[argc] = NULL;
  char out[160], err[160];
  snprintf(out, sizeof out, "%s/stdout", dir);
  snprintf(err, sizeof err, "%s/stderr", dir);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
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

static void ok(const result *r) {
  if (r->code != 0)
    fail_msg("exit %d: %s", r->code, r->err);
}

static unsigned char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc(*len ? *len : 1);
  assert_int_equal(fread(buf, 1, *len, f), *len);
  fclose(f);
  return buf;
}

static void same_file(const char *a, const char *b) {
  size_t na, nb;
  unsigned char *x = read_all(a, &na), *y = read_all(b, &nb);
  assert_int_equal(na, nb);
  assert_memory_equal(x, y, na);
  free(x);
  free(y);
}

static const char *heldout(const result *r) {
  const char *p = strstr(r->out, "\"done\": true");
  assert_non_null(p);
  p = strstr(p, "\"heldout_loss\": ");
  assert_non_null(p);
  return p;
}

static void resumes_and_merges(void **state) {
  (void)state;
  result r;
  char *base = path_of("base.safetensors");
  run(&r, "--steps", "10", "--save", base, NULL);
  ok(&r);
  const char *lora[] = {"--lora-rank",    "4",
                        "--lora-alpha",   "8",
                        "--lora-targets", "q_proj,v_proj,down_proj"};
#define LORA lora[0], lora[1], lora[2], lora[3], lora[4], lora[5]
  char *d1 = path_of("d1"), *d2 = path_of("d2");
  run(&r, LORA, "--load", base, "--steps", "12", "--save", d1, NULL);
  ok(&r);
  run(&r, LORA, "--load", base, "--steps", "6", "--schedule-steps", "12",
      "--save", d2, NULL);
  ok(&r);
  run(&r, LORA, "--load", base, "--steps", "12", "--resume", d2, "--save", d2,
      NULL);
  ok(&r);
  same_file(path_of("d1/adapter_model.safetensors"),
            path_of("d2/adapter_model.safetensors"));
  same_file(path_of("d1/training_state.safetensors"),
            path_of("d2/training_state.safetensors"));
  struct stat st, sb;
  assert_int_equal(stat(path_of("d1/training_state.safetensors"), &st), 0);
  assert_int_equal(stat(base, &sb), 0);
  assert_true(st.st_size < sb.st_size / 4); /* adapters and moments alone */
  assert_int_equal(stat(path_of("d1/adapter_config.json"), &st), 0);

  /* base + adapters against the merged weights, on the held-out set */
  char *merged = path_of("merged.safetensors");
  run(&r, LORA, "--load", base, "--load-adapter", d1, "--steps", "0",
      "--merge-lora", merged, NULL);
  ok(&r);
  char want[64];
  snprintf(want, sizeof want, "%.30s", heldout(&r));
  run(&r, "--load", merged, "--steps", "0", NULL);
  ok(&r);
  char got[64];
  snprintf(got, sizeof got, "%.30s", heldout(&r));
  assert_string_equal(got, want);
  /* and the base alone differs */
  run(&r, "--load", base, "--steps", "0", NULL);
  ok(&r);
  snprintf(got, sizeof got, "%.30s", heldout(&r));
  assert_string_not_equal(got, want);
#undef LORA
}

static void expect(const result *r, int code, const char *line) {
  char want[1024];
  snprintf(want, sizeof want, "remat-train: %s\n", line);
  assert_string_equal(r->err, want);
  assert_int_equal(r->code, code);
}

static void bad_options(void **state) {
  (void)state;
  result r;
  run(&r, "--lora-alpha", "4", NULL);
  expect(&r, 2, "--lora-alpha needs --lora-rank R");
  run(&r, "--lora-rank", "0", NULL);
  expect(&r, 2, "--lora-rank '0': expected a whole number from 1 to 65536");
  run(&r, "--lora-rank", "2", "--lora-alpha", "-1", NULL);
  expect(&r, 2, "--lora-alpha '-1': expected a finite number > 0");
  run(&r, "--kv-heads", "3", NULL);
  expect(&r, 2, "--kv-heads must divide --heads");
  run(&r, "--model", "gpt3", NULL);
  expect(&r, 2, "--model 'gpt3': expected gpt or llama");
  run(&r, "--lora-rank", "2", "--lora-targets", "q_proj,c_attn", "--steps", "1",
      NULL);
  assert_int_equal(r.code, 1);
  assert_non_null(strstr(r.err, "lora target 'c_attn': expected a "
                                "comma-separated list of q_proj, k_proj, "
                                "v_proj, o_proj, gate_proj, up_proj, "
                                "down_proj"));
  run(&r, "--lora-rank", "2", "--train", "model.nrom.weight", "--steps", "1",
      NULL);
  assert_int_equal(r.code, 1);
  assert_non_null(strstr(r.err, "lora trainable 'model.nrom.weight' is not a "
                                "parameter of the model"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(resumes_and_merges),
      cmocka_unit_test(bad_options),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
