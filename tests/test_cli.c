/* Tests of the remat-train command line: every kind of bad input gets its
 * one-line message and exit code (2 usage, 1 run-time), a short run saves
 * weights that a second run loads and evaluates identically, a resumed run
 * ends bitwise where a straight one does, and SIGINT or SIGTERM stop a run
 * with a checkpoint (exit 130). The binary's path comes from REMAT_TRAIN
 * (set by tests/meson.build). */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <time.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "remat.h"
#include "remat_gpt.h"
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

/* Runs the tool `exe` with standard input from `in` (NULL: /dev/null) and
 * the NULL-terminated arguments in `ap`. */
static void run_exe(result *r, const char *exe, const char *in, va_list ap) {
  assert_non_null(exe);
  char *argv[40];
  int argc = 0;
  argv[argc++] = (char *)exe;
  for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 39;)
    argv[argc++] = a;
  argv[argc] = NULL;
  const char *out = tmp_path("stdout"), *err = tmp_path("stderr");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, in ? in : "/dev/null", O_RDONLY, 0);
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

static void run_from(result *r, const char *in, va_list ap) {
  run_exe(r, getenv("REMAT_TRAIN"), in, ap);
}

/* Runs remat-grads with the NULL-terminated arguments. */
static void run_grads(result *r, ...) {
  va_list ap;
  va_start(ap, r);
  run_exe(r, getenv("REMAT_GRADS"), NULL, ap);
  va_end(ap);
}

/* Runs remat-train with the NULL-terminated arguments. */
static void run(result *r, ...) {
  va_list ap;
  va_start(ap, r);
  run_from(r, NULL, ap);
  va_end(ap);
}

/* The same with standard input read from the file `in`. */
static void run_stdin(result *r, const char *in, ...) {
  va_list ap;
  va_start(ap, in);
  run_from(r, in, ap);
  va_end(ap);
}

static void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  fclose(f);
}

/* A 4 KiB text file in the test folder, "the cat sat on the mat. " over
 * and over, for runs with --data; returns its path. */
static const char *cat_text(const char *name) {
  const char *path = tmp_path(name);
  static char buf[4096];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = "the cat sat on the mat. "[i % 24];
  write_file(path, buf, sizeof buf);
  return path;
}

static double json_number(const char *text, const char *key) {
  const char *p = strstr(text, key);
  assert_non_null(p);
  return strtod(p + strlen(key), NULL);
}

static void expect(const result *r, int code, const char *line) {
  char want[1024];
  snprintf(want, sizeof want, "remat-train: %s\n", line);
  assert_string_equal(r->err, want);
  assert_int_equal(r->code, code);
}

/* remat-train's exit status for a stop without its checkpoint. */
#define EXIT_UNSAVED 3

#define TINY "--layers", "1", "--d-model", "16", "--heads", "2", "--batch", \
             "8", "--threads", "2"

/* The default run (3-digit addition, 2000 steps) in bf16 reaches at least
 * 97% exact-match accuracy on the held-out problems, as f32 does. */
static void test_bf16_learns(void **state) {
  (void)state;
  result r;
  run(&r, "--precision", "bf16", "--threads", "2", NULL);
  assert_int_equal(r.code, 0);
  double acc = json_number(r.out, "exact-match accuracy ");
  print_message("bf16 default run: exact-match accuracy %.1f%%\n", acc);
  assert_true(acc >= 97.0);
}

/* Messages name remat-train's options, not the library's fields that
 * they set: the trainer checks what it can before calling the library
 * (--threads, --vocab, --policy with --budget), and a message only the
 * library can give has its field names replaced by the options (a
 * REMAT_POLICY=auto with no --budget names --budget). Values are quoted
 * (control bytes escaped), and a --policy longer than 511 bytes is taken
 * (the library takes 64 KiB). */
static void test_tool_messages(void **state) {
  (void)state;
  result r;
  run(&r, TINY, "--threads", "2000", NULL);
  expect(&r, 2, "--threads '2000': expected a whole number from 1 to 1024");
  run(&r, TINY, "--steps", "1", "--policy", "dots_saveable", "--budget",
      "100MiB", NULL);
  expect(&r, 2, "--budget picks each block's policy to fit it (as --policy "
                "auto does), so it does not go with another --policy: drop "
                "--budget to train with that policy, or give --policy auto");
  run(&r, TINY, "--steps", "1", "--policy", "auto", NULL);
  expect(&r, 2, "--policy auto needs --budget BYTES: it picks each block's "
                "policy to fit that budget");
  run(&r, "--data", "x", "--data-format", "u16", "--vocab", "1", NULL);
  expect(&r, 2, "--vocab '1': expected a whole number from 2 to 16777216");
  run(&r, "--layers", "x\033[2J", NULL);
  expect(&r, 2, "--layers 'x\\x1B[2J': expected a whole number from 1 to "
                "1000000");
  setenv("REMAT_POLICY", "auto", 1);
  run(&r, TINY, "--steps", "1", NULL);
  unsetenv("REMAT_POLICY");
  expect(&r, 1, "policy 'auto' needs a memory budget: set --budget");
  char *zeros = tmp_path("zeros.u16");
  static const unsigned char none[4096];
  write_file(zeros, none, sizeof none);
  run(&r, "--data", zeros, "--data-format", "u16", "--seq", "8", "--steps",
      "1", NULL);
  char want[400];
  snprintf(want, sizeof want, "--data '%s': every token id is 0, so the "
           "vocabulary (the largest id + 1) would be 1: a model needs at "
           "least 2 tokens (--vocab N sets it)", zeros);
  expect(&r, 1, want);
  static char policy[700] = "save_only_these_names:ffn_act";
  while (strlen(policy) + 9 < sizeof policy)
    strcat(policy, ",ffn_act");
  run(&r, TINY, "--steps", "1", "--policy", policy, NULL);
  assert_int_equal(r.code, 0);
}

static void test_usage_errors(void **state) {
  (void)state;
  result r;
  run(&r, "--bogus", NULL);
  expect(&r, 2, "unknown option '--bogus' (see --help)");
  run(&r, "--precision", "fp16", NULL);
  expect(&r, 2, "--precision 'fp16': expected f32 or bf16");
  run(&r, "--d-model", "30", "--heads", "4", NULL);
  expect(&r, 2, "--d-model 30 is not divisible by --heads 4");
  run(&r, "--layers", "two", NULL);
  expect(&r, 2, "--layers 'two': expected a whole number from 1 to 1000000");
  run(&r, "--layers", "1000001", NULL);
  expect(&r, 2, "--layers '1000001': expected a whole number from 1 to 1000000");
  run(&r, "--lr", "0", NULL);
  expect(&r, 2, "--lr '0': expected a number > 0");
  /* strtoull skips spaces and wraps " -1" to 2^64 - 1: not a seed */
  run(&r, "--seed", " -1", NULL);
  expect(&r, 2, "--seed ' -1': expected a whole number from 0 to 2^64 - 1");
  run(&r, "--seed", "-1", NULL);
  expect(&r, 2, "--seed '-1': expected a whole number from 0 to 2^64 - 1");
  run(&r, "--steps", " 5", NULL);
  expect(&r, 2, "--steps ' 5': expected a whole number from 0 to 1000000");
  run(&r, "--lr", " 0.1", NULL);
  expect(&r, 2, "--lr ' 0.1': expected a number > 0");
  run(&r, "--tokens", "2147483648", NULL);
  expect(&r, 2, "--tokens '2147483648': expected a whole number from 1 to "
                "1000000");
  run(&r, "--steps", NULL);
  expect(&r, 2, "--steps needs a value");
  run(&r, "--seq", "8", NULL);
  expect(&r, 2, "--seq 8 is shorter than an addition problem (13 tokens)");
  run(&r, "--budget", "lots", NULL);
  expect(&r, 2, "--budget 'lots': expected a size such as 64MiB or 1.5GB");
  run(&r, "--steps", "1000000", "--help", NULL);
  assert_int_equal(r.code, 0);
  run(&r, "--help", NULL);
  assert_int_equal(r.code, 0);
  assert_memory_equal(r.out, "usage: remat-train", 18);
}

/* Every tool takes --help and --version; the version is the project's
 * (meson.build), the library's remat_version(). */
static void test_help_and_version(void **state) {
  (void)state;
  const char *project = getenv("REMAT_TEST_PROJECT_VERSION");
  assert_non_null(project);
  char want[64];
  result r;
  run(&r, "--version", NULL);
  snprintf(want, sizeof want, "remat-train %s\n", project);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.out, want);
  assert_string_equal(r.err, "");
  run_grads(&r, "--version", NULL);
  snprintf(want, sizeof want, "remat-grads %s\n", project);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.out, want);
  run_grads(&r, "--help", NULL);
  assert_int_equal(r.code, 0);
  assert_memory_equal(r.out, "usage: remat-grads", 18);
  assert_string_equal(r.err, "");
  run_grads(&r, "--bogus", NULL);
  assert_int_equal(r.code, 2);
  assert_string_equal(r.err, "remat-grads: bad option '--bogus'\n");
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
           "text file, or token ids with --data-format u16", binary);
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
  /* 100 bytes hold a training window of 17 but not a held-out one */
  run(&r, "--data", small, "--seq", "16", NULL);
  snprintf(want, sizeof want,
           "--data '%s' has 100 bytes, too few for a held-out split: its "
           "last tenth must hold --seq + 1 = 17, so at least 170 are needed",
           small);
  expect(&r, 1, want);
}

/* Writes `n` uint16 ids, little-endian, from ids[i % period] + shift. */
static void write_ids(const char *path, const uint16_t *ids, int period,
                      size_t n, int shift) {
  static unsigned char buf[1 << 16];
  assert_true(2 * n <= sizeof buf);
  for (size_t i = 0; i < n; i++) {
    unsigned id = ids[i % period] + (unsigned)shift;
    buf[2 * i] = (unsigned char)(id & 0xff);
    buf[2 * i + 1] = (unsigned char)(id >> 8);
  }
  write_file(path, buf, 2 * n);
}

/* Token files: every kind of bad file or option gets its message. */
static void test_token_file_errors(void **state) {
  (void)state;
  result r;
  char want[512];
  char odd[160], ids[160]; /* tmp_path's buffers are reused by run */
  snprintf(odd, sizeof odd, "%s/odd.bin", dir);
  snprintf(ids, sizeof ids, "%s/ids.bin", dir);
  write_file(odd, "abc", 3);
  run(&r, "--data", odd, "--data-format", "u16", NULL);
  snprintf(want, sizeof want, "--data '%s' has 3 bytes, an odd number: "
           "--data-format u16 takes 2-byte tokens", odd);
  expect(&r, 1, want);
  write_file(odd, "", 0);
  run(&r, "--data", odd, "--data-format", "u16", NULL);
  snprintf(want, sizeof want, "--data '%s' is empty", odd);
  expect(&r, 1, want);
  /* ids 0, 1, ..., 299, 0, 1, ...: the first id at or above --vocab is
   * named, with its position */
  uint16_t seq300[300];
  for (int i = 0; i < 300; i++)
    seq300[i] = (uint16_t)i;
  write_ids(ids, seq300, 300, 2000, 0);
  run(&r, "--data", ids, "--data-format", "u16", "--vocab", "299", NULL);
  snprintf(want, sizeof want, "--data '%s': token id 299 at position 299 is "
           "outside --vocab 299 (ids 0 to 298)", ids);
  expect(&r, 1, want);
  write_ids(ids, seq300, 300, 169, 0);
  run(&r, "--data", ids, "--data-format", "u16", "--seq", "16", NULL);
  snprintf(want, sizeof want, "--data '%s' has 169 tokens, too few for a "
           "held-out split: its last tenth must hold --seq + 1 = 17, so at "
           "least 170 are needed", ids);
  expect(&r, 1, want);
  run(&r, "--data", ids, "--data-format", "u16", "--seq", "169", NULL);
  snprintf(want, sizeof want, "--seq 169 is longer than the data: '%s' has "
           "169 tokens, at least 170 are needed", ids);
  expect(&r, 1, want);
  run(&r, "--data-format", "u8", NULL);
  expect(&r, 2, "--data-format 'u8': expected bytes, u16 or u32");
  run(&r, "--data-format", "u16", NULL);
  expect(&r, 2, "--data-format u16 needs --data FILE");
  run(&r, "--data", ids, "--vocab", "300", NULL);
  expect(&r, 2, "--vocab needs --data-format u16 or u32 (the vocabulary of "
                "bytes is 256, that of the addition task 14)");
  run(&r, "--data", ids, "--data-format", "u16", "--vocab", "65537", NULL);
  expect(&r, 2, "--vocab 65537 is more than a u16 file's 65536 ids: "
                "--data-format u32 takes up to 16777216");
  run(&r, "--data", ids, "--data-format", "u32", "--vocab", "16777217", NULL);
  expect(&r, 2, "--vocab '16777217': expected a whole number from 2 to "
                "16777216");
  /* --init's options against the others (tests/hf_check.py runs --init) */
  run(&r, "--init", "dir", "--layers", "3", "--prompt", "1", NULL);
  expect(&r, 2, "--layers does not apply to --init: the model's config.json "
                "gives the model");
  run(&r, "--init", "dir", "--data", ids, "--data-format", "u16",
      "--save", "x", "--save-every", "5", NULL);
  expect(&r, 2, "--save-every does not apply to --init: an --init run saves "
                "the weights alone, without the optimizer's state to resume "
                "from");
  run(&r, "--save-dtype", "bf16", NULL);
  expect(&r, 2, "--save-dtype bf16 needs --init: a training checkpoint holds "
                "F32 weights and moments, for an exact --resume");
  run(&r, "--init", "dir", NULL);
  expect(&r, 2, "--init needs --data FILE (a token file) to fine-tune on, or "
                "--prompt IDS to sample from");
  run(&r, "--init", "dir", "--data", ids, NULL);
  expect(&r, 2, "--init trains on token ids: give --data-format u16 or u32 "
                "with --data");
  run(&r, "--save-dtype", "f16", NULL);
  expect(&r, 2, "--save-dtype 'f16': expected f32 or bf16");
  /* llm.c's magic in a file shorter than its header is not read as ids */
  unsigned char magic[512] = {0x88, 0xd8, 0x34, 0x01, 1, 0, 0, 0, 100};
  write_file(odd, magic, sizeof magic);
  run(&r, "--data", odd, "--data-format", "u16", NULL);
  snprintf(want, sizeof want, "--data '%s' starts with llm.c's magic number "
           "20240520 but has 512 bytes, fewer than its header of 1024", odd);
  expect(&r, 1, want);
  write_file(odd, magic, 4);
  run(&r, "--data", odd, "--data-format", "u16", NULL);
  snprintf(want, sizeof want, "--data '%s' starts with llm.c's magic number "
           "20240520 but has 4 bytes, fewer than its header of 1024", odd);
  expect(&r, 1, want);
  run(&r, "--data", ids, "--data-format", "u16", "--vocab", "0", NULL);
  expect(&r, 2, "--vocab '0': expected a whole number from 2 to 16777216");
}

/* A token file whose ids are a text's bytes, with --vocab 256, trains
 * exactly like the text (the same losses at every step and held out); the
 * default vocabulary is the largest id + 1. */
static void test_token_file_trains(void **state) {
  (void)state;
  char text[160], ids[160], shifted[160], w[160];
  snprintf(text, sizeof text, "%s/fox.txt", dir);
  snprintf(ids, sizeof ids, "%s/fox.bin", dir);
  snprintf(shifted, sizeof shifted, "%s/shifted.bin", dir);
  snprintf(w, sizeof w, "%s/shifted.ckpt", dir);
  static const char fox[] = "the quick brown fox jumps over the lazy dog\n";
  uint16_t fox_ids[44];
  char buf[2000];
  for (int i = 0; i < 44; i++)
    fox_ids[i] = (uint16_t)fox[i];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = fox[i % 44];
  write_file(text, buf, sizeof buf);
  write_ids(ids, fox_ids, 44, sizeof buf, 0);
  result a, b;
  run(&a, TINY, "--seq", "32", "--steps", "3", "--json", "--data", text,
      NULL);
  run(&b, TINY, "--seq", "32", "--steps", "3", "--json", "--data", ids,
      "--data-format", "u16", "--vocab", "256", NULL);
  assert_int_equal(a.code, 0);
  assert_int_equal(b.code, 0);
  assert_string_equal(b.err, "");
  for (const char *pa = a.out, *pb = b.out;
       (pa = strstr(pa, "\"loss\": ")) != NULL; pa++, pb++) {
    pb = strstr(pb, "\"loss\": ");
    assert_non_null(pb);
    assert_float_equal(json_number(pa, "\"loss\": "),
                       json_number(pb, "\"loss\": "), 0.0);
  }
  assert_float_equal(json_number(strstr(b.out, "{\"done\""),
                                 "\"heldout_loss\": "),
                     json_number(strstr(a.out, "{\"done\""),
                                 "\"heldout_loss\": "),
                     0.0);
  /* The same ids after llm.c's header: the same training. */
  char llmc[160];
  snprintf(llmc, sizeof llmc, "%s/fox-llmc.bin", dir);
  static unsigned char file[1024 + 2 * sizeof buf];
  int32_t header[256] = {20240520, 1, (int32_t)sizeof buf};
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++)
      file[4 * i + k] = (unsigned char)((uint32_t)header[i] >> 8 * k);
  for (size_t i = 0; i < sizeof buf; i++)
    file[1024 + 2 * i] = (unsigned char)buf[i]; /* high bytes 0 */
  write_file(llmc, file, sizeof file);
  run(&b, TINY, "--seq", "32", "--steps", "3", "--json", "--data", llmc,
      "--data-format", "u16", "--vocab", "256", NULL);
  assert_int_equal(b.code, 0);
  assert_float_equal(json_number(strstr(b.out, "{\"done\""),
                                 "\"heldout_loss\": "),
                     json_number(strstr(a.out, "{\"done\""),
                                 "\"heldout_loss\": "),
                     0.0);
  char want[512];
  write_file(llmc, file, sizeof file - 2); /* a token short */
  run(&b, "--data", llmc, "--data-format", "u16", NULL);
  snprintf(want, sizeof want, "--data '%s' has llm.c's header for 2000 "
           "tokens, but 3998 bytes follow it", llmc);
  expect(&b, 1, want);
  file[4] = 2;
  write_file(llmc, file, sizeof file);
  run(&b, "--data", llmc, "--data-format", "u16", NULL);
  snprintf(want, sizeof want, "--data '%s' has llm.c's header of version 2: "
           "--data-format u16 reads version 1 (uint16 tokens)", llmc);
  expect(&b, 1, want);
  /* Shifted to ids 1000 + byte, read from standard input: the default
   * vocabulary is 1000 + 'z' + 1, as the saved embedding's shape shows. */
  write_ids(shifted, fox_ids, 44, sizeof buf, 1000);
  run_stdin(&b, shifted, TINY, "--seq", "32", "--steps", "2", "--data", "-",
            "--data-format", "u16", "--save", w, NULL);
  assert_int_equal(b.code, 0);
  assert_non_null(strstr(b.out, "sample (prompt, then greedy completion):\n"
                                "  1100 1111 1103 1010 "));
  /* sampling prints ids separated by spaces, all in the vocabulary */
  run(&b, TINY, "--seq", "32", "--data", shifted, "--data-format", "u16",
      "--load", w, "--prompt", "1116,1104 1101", "--tokens", "5", NULL);
  assert_int_equal(b.code, 0);
  assert_memory_equal(b.out, "1116 1104 1101 ", 15);
  char *p = b.out;
  for (int i = 0; i < 8; i++) {
    long id = strtol(p, &p, 10);
    assert_true(id >= 0 && id < 1123);
    assert_int_equal(*p++, i < 7 ? ' ' : '\n');
  }
  assert_int_equal(*p, '\0');
  run(&b, TINY, "--seq", "32", "--steps", "0", "--data", shifted,
      "--data-format", "u16", "--vocab", "1124", "--load", w, NULL);
  snprintf(want, sizeof want, "--vocab 1124 disagrees with --load '%s', "
           "whose model has --vocab 1123 (leave --vocab out to take the "
           "file's)", w);
  expect(&b, 2, want);
}

/* --data reads only a regular file of at most 1 GiB, or standard input up
 * to the same limit: a device, a FIFO or a directory is refused at once. */
static void test_data_not_a_file(void **state) {
  (void)state;
  result r;
  char want[512];
  run(&r, "--data", "/dev/zero", NULL);
  expect(&r, 1, "--data '/dev/zero' is a character device: --data takes a "
                "regular file (or - for standard input)");
  run(&r, "--data", "/dev/urandom", NULL);
  expect(&r, 1, "--data '/dev/urandom' is a character device: --data takes "
                "a regular file (or - for standard input)");
  const char *fifo = tmp_path("data.fifo");
  assert_int_equal(mkfifo(fifo, 0644), 0);
  run(&r, "--data", fifo, NULL);
  snprintf(want, sizeof want, "--data '%s' is a FIFO: --data takes a regular "
           "file (or - for standard input)", fifo);
  expect(&r, 1, want);
  run(&r, "--data", dir, NULL);
  snprintf(want, sizeof want, "--data '%s' is a directory: --data takes a "
           "regular file (or - for standard input)", dir);
  expect(&r, 1, want);
  const char *big = tmp_path("big.txt");
  write_file(big, "x", 1);
  assert_int_equal(truncate(big, ((off_t)1 << 30) + 1), 0);
  run(&r, "--data", big, NULL);
  snprintf(want, sizeof want, "--data '%s' has 1073741825 bytes, more than "
           "the limit of 1 GiB", big);
  expect(&r, 1, want);
  assert_int_equal(unlink(big), 0);
  /* Standard input that never ends stops at its first 64 KiB. */
  run_stdin(&r, "/dev/zero", "--data", "-", NULL);
  expect(&r, 1, "--data '-' looks binary (NUL or control bytes): --data "
                "takes a text file, or token ids with --data-format u16");
}

/* Text on standard input trains like the same file. */
static void test_data_stdin(void **state) {
  (void)state;
  const char *text = tmp_path("text.txt");
  char buf[4096];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = "the quick brown fox jumps over the lazy dog\n"[i % 44];
  write_file(text, buf, sizeof buf);
  result a, b;
  run(&a, TINY, "--seq", "32", "--steps", "3", "--json", "--data", text,
      NULL);
  run_stdin(&b, text, TINY, "--seq", "32", "--steps", "3", "--json",
            "--data", "-", NULL);
  assert_int_equal(a.code, 0);
  assert_int_equal(b.code, 0);
  assert_string_equal(b.err, "");
  /* the same losses; only the timings differ */
  assert_float_equal(json_number(strstr(b.out, "{\"done\""),
                                 "\"heldout_loss\": "),
                     json_number(strstr(a.out, "{\"done\""),
                                 "\"heldout_loss\": "),
                     0.0);
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

/* A budget that fits training but not the evaluation graph fails before
 * the first step (not after all of them), and writes no --save file. */
static void test_budget_evaluation(void **state) {
  (void)state;
  result r;
  run(&r, TINY, "--budget", "1KiB", "--steps", "1", NULL);
  const char *at = strstr(r.err, "for this graph is ");
  assert_non_null(at);
  long long smallest = strtoll(at + strlen("for this graph is "), NULL, 10);
  assert_true(smallest > 1024);
  char budget[32], head[256];
  snprintf(budget, sizeof budget, "%lld", smallest);
  const char *weights = tmp_path("never.safetensors");
  run(&r, TINY, "--budget", budget, "--steps", "2000", "--json", "--save",
      weights, NULL);
  assert_int_equal(r.code, 1);
  assert_string_equal(r.out, "");
  snprintf(head, sizeof head, "remat-train: evaluation: memory budget of "
           "%lld bytes (%.2f MiB) is infeasible: the smallest feasible budget "
           "for this graph is ", smallest, (double)smallest / 1048576.0);
  assert_memory_equal(r.err, head, strlen(head));
  assert_true(strchr(r.err, '\n') == r.err + strlen(r.err) - 1);
  assert_int_equal(access(weights, F_OK), -1);
}

static void test_save_load(void **state) {
  (void)state;
  result r;
  const char *weights = tmp_path("tiny.safetensors");
  run(&r, TINY, "--steps", "40", "--lr", "0.003", "--json", "--save",
      weights, NULL);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.err, "");
  /* It learned: the last step's loss is under 0.8 of the first's (2.63,
   * about ln 14), the held-out loss under 0.9 of it (at the addition
   * task's default rate, 0.001, 40 steps take it to 0.89). */
  double first = json_number(strstr(r.out, "{\"step\": 1, "), "\"loss\": ");
  double last = json_number(strstr(r.out, "{\"step\": 40, "), "\"loss\": ");
  char *done = strstr(r.out, "{\"done\": true");
  assert_non_null(done);
  double loss = json_number(done, "\"heldout_loss\": ");
  print_message("loss %.4f at step 1, %.4f at step 40, held-out %.4f\n",
                first, last, loss);
  assert_true(first > 2.0 && last < 0.8 * first && loss < 0.9 * first);

  run(&r, TINY, "--steps", "0", "--json", "--load", weights, NULL);
  assert_int_equal(r.code, 0);
  done = strstr(r.out, "{\"done\": true");
  assert_non_null(done);
  assert_float_equal(json_number(done, "\"heldout_loss\": "), loss, 0.0);

  char want[512];
  run(&r, "--layers", "1", "--d-model", "32", "--heads", "2", "--batch", "8",
      "--threads", "2", "--steps", "0", "--load", weights, NULL);
  snprintf(want, sizeof want, "--d-model 32 disagrees with --load '%s', "
           "whose model has --d-model 16 (leave --d-model out to take the "
           "file's)", weights);
  expect(&r, 2, want);

  /* The same file cut short by 4 bytes: the checkpoint's last tensor, the
   * optimizer state that a weights-only load skips, is still checked. */
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
           "tensor 'adam_v:lm_head' has data_offsets [", cut);
  assert_memory_equal(r.err, want, strlen(want));
  assert_non_null(strstr(r.err, "] out of range: the "));
  const char *junk = tmp_path("junk.safetensors");
  write_file(junk, "not a safetensors file", 22);
  run(&r, TINY, "--steps", "0", "--load", junk, NULL);
  snprintf(want, sizeof want,
           "remat_load_safetensors: '%s': header length 7021991845529153390 "
           "exceeds the 14 bytes after it (truncated or not a safetensors "
           "file)", junk);
  expect(&r, 1, want);
}

static void assert_same_file(const char *a, const char *b) {
  static char x[1 << 20], y[1 << 20];
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  assert_non_null(fa);
  assert_non_null(fb);
  size_t na = fread(x, 1, sizeof x, fa), nb = fread(y, 1, sizeof y, fb);
  fclose(fa);
  fclose(fb);
  assert_true(na > 0 && na < sizeof x);
  assert_int_equal(na, nb);
  assert_memory_equal(x, y, na);
}

/* 12 steps straight, and 4 steps, a checkpoint and --resume to 12, end in
 * the same checkpoint byte for byte (weights, moments, step, data). */
static void resume_exact(const char *optimizer, const char *threads) {
  result r;
  char straight[160], half[160], resumed[160];
  snprintf(straight, sizeof straight, "%s/straight.ckpt", dir);
  snprintf(half, sizeof half, "%s/half.ckpt", dir);
  snprintf(resumed, sizeof resumed, "%s/resumed.ckpt", dir);
#define RUN_ARGS "--layers", "1", "--d-model", "16", "--heads", "2", \
    "--batch", "8", "--threads", threads, "--optimizer", optimizer,   \
    "--schedule", "constant", "--json"
  run(&r, RUN_ARGS, "--steps", "12", "--save", straight, NULL);
  assert_int_equal(r.code, 0);
  run(&r, RUN_ARGS, "--steps", "4", "--save", half, NULL);
  assert_int_equal(r.code, 0);
  run(&r, RUN_ARGS, "--steps", "12", "--resume", half, "--save", resumed,
      NULL);
#undef RUN_ARGS
  assert_int_equal(r.code, 0);
  assert_memory_equal(r.out, "{\"step\": 5, ", 12);
  assert_null(strstr(r.out, "{\"step\": 4, "));
  assert_same_file(straight, resumed);
}

static void test_resume_adamw(void **state) {
  (void)state;
  resume_exact("adamw", "1");
  resume_exact("adamw", "2");
}

static void test_resume_sgd(void **state) {
  (void)state;
  resume_exact("sgd", "1");
  resume_exact("sgd", "2");
}

static void test_checkpoint_errors(void **state) {
  (void)state;
  result r;
  char want[512];
  char ckpt[160], sub[160];
  snprintf(ckpt, sizeof ckpt, "%s/four.ckpt", dir);
  snprintf(sub, sizeof sub, "%s/a-directory", dir);
  run(&r, TINY, "--steps", "4", "--save", ckpt, NULL);
  assert_int_equal(r.code, 0);
  run(&r, TINY, "--steps", "3", "--resume", ckpt, NULL);
  snprintf(want, sizeof want, "--resume '%s' is at step 4, past --steps 3 "
           "(the total, not steps to add)", ckpt);
  expect(&r, 1, want);
  run(&r, TINY, "--steps", "4", "--resume", ckpt, "--optimizer", "sgd", NULL);
  snprintf(want, sizeof want, "--resume: remat_load_checkpoint: '%s': the "
           "checkpoint holds the state of optimizer 'adamw' but the graph "
           "was compiled with 'sgd': compile with the same optimizer, or "
           "load the weights alone with remat_load_safetensors", ckpt);
  expect(&r, 1, want);
  run(&r, TINY, "--load", ckpt, "--resume", ckpt, NULL);
  expect(&r, 2, "--load and --resume exclude each other: --resume restores "
         "the weights too");
  run(&r, TINY, "--save-every", "2", NULL);
  expect(&r, 2, "--save-every needs --save FILE");
  run(&r, TINY, "--schedule", "step", NULL);
  expect(&r, 2, "--schedule 'step': expected cosine, linear or constant");
  run(&r, TINY, "--optimizer", "adam", NULL);
  expect(&r, 2, "--optimizer 'adam': expected adamw or sgd");
  run(&r, TINY, "--lr-min", "-1", NULL);
  expect(&r, 2, "--lr-min '-1': expected a number >= 0");
  /* A --save target that cannot be written (a directory, a missing
   * folder) fails before the first step, not after the run. */
  assert_int_equal(mkdir(sub, 0755), 0);
  run(&r, TINY, "--steps", "5", "--save-every", "2", "--save", sub, "--json",
      NULL);
  snprintf(want, sizeof want, "--save '%s' is a directory: --save takes a "
           "regular file or a new name", sub);
  expect(&r, 1, want);
  assert_string_equal(r.out, "");
  char missing[200];
  snprintf(missing, sizeof missing, "%s/no-such-folder/x.ckpt", dir);
  run(&r, TINY, "--steps", "5", "--save", missing, "--json", NULL);
  snprintf(want, sizeof want, "--save '%s': cannot create a new file beside "
           "it (No such file or directory): its folder must exist and be "
           "writable", missing);
  expect(&r, 1, want);
  assert_string_equal(r.out, "");
}

/* The "lr" of each JSON step line, joined by ' '. */
static void lr_list(const char *out, char *buf, size_t len) {
  buf[0] = '\0';
  for (const char *p = out; (p = strstr(p, "\"lr\": ")) != NULL; p++) {
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%.*s", used ? " " : "",
             (int)strcspn(p + 6, ","), p + 6);
  }
}

/* PATH_IN(var, "name"): a path in the test folder that outlives the
 * runs (tmp_path's buffers are reused by each run). */
#define PATH_IN(var, name) \
  char var[160];           \
  snprintf(var, sizeof var, "%s/%s", dir, name)

/* The cosine schedule: 4 steps of a 12-step schedule (--schedule-steps),
 * a checkpoint and a bare --resume (the model, the batch and --steps from
 * the file) end in the checkpoint of 12 steps straight, byte for byte. */
static void test_resume_cosine(void **state) {
  (void)state;
  result r;
  PATH_IN(straight, "cos-straight.ckpt");
  PATH_IN(half, "cos-half.ckpt");
  PATH_IN(resumed, "cos-resumed.ckpt");
  run(&r, TINY, "--steps", "12", "--save", straight, NULL);
  assert_int_equal(r.code, 0);
  run(&r, TINY, "--steps", "4", "--schedule-steps", "12", "--save", half,
      NULL);
  assert_int_equal(r.code, 0);
  run(&r, "--threads", "2", "--resume", half, "--save", resumed, "--json",
      NULL);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.err, "");
  assert_memory_equal(r.out, "{\"step\": 5, ", 12);
  assert_same_file(straight, resumed);
  run(&r, TINY, "--steps", "12", "--schedule-steps", "11", NULL);
  expect(&r, 2, "--schedule-steps 11 is less than --steps 12: the schedule "
         "would end before the run");
}

#define CHANGE_ARGS TINY, "--lr", "0.01", "--lr-min", "0.002", "--warmup", \
    "2", "--json"

/* A --resume that changes the schedule says what it does and does it:
 * from the checkpoint's rate at step 4 of a 10-step cosine (0.00882843)
 * down to --lr-min at the new end, step 8; the checkpoint it writes
 * holds that schedule, so that resuming it goes on bitwise. */
static void test_resume_changed_schedule(void **state) {
  (void)state;
  result r;
  char want[900], got[256];
  PATH_IN(four, "four-of-ten.ckpt");
  PATH_IN(eight, "eight.ckpt");
  PATH_IN(six, "six.ckpt");
  PATH_IN(again, "eight-again.ckpt");
  run(&r, CHANGE_ARGS, "--steps", "4", "--schedule-steps", "10", "--save",
      four, NULL);
  assert_int_equal(r.code, 0);
  run(&r, "--threads", "2", "--steps", "8", "--resume", four, "--json",
      "--strict-resume", "--save", eight, NULL);
  snprintf(want, sizeof want, "--resume '%s': the checkpoint's schedule "
           "ends at step 10 (cosine, warm-up 2, --lr 0.01, --lr-min 0.002); "
           "this run's ends at step 8 (cosine, warm-up 2, --lr 0.01, --lr-min "
           "0.002): --strict-resume refuses the change (leave out --steps "
           "and the schedule's options to take the file's)", four);
  expect(&r, 2, want);
  assert_int_equal(access(eight, F_OK), -1);
  run(&r, "--threads", "2", "--steps", "8", "--resume", four, "--json",
      "--save", eight, NULL);
  assert_int_equal(r.code, 0);
  snprintf(want, sizeof want, "remat-train: --resume '%s': the checkpoint's "
           "schedule ends at step 10 (cosine, warm-up 2, --lr 0.01, --lr-min "
           "0.002); this run's ends at step 8 (cosine, warm-up 2, --lr 0.01, "
           "--lr-min 0.002): from step 4 the learning rate goes from "
           "0.00882843 (the checkpoint's current rate) to 0.002 at step 8 by "
           "cosine, unlike a run started with this schedule (--strict-resume "
           "refuses instead)\n", four);
  assert_string_equal(r.err, want);
  lr_list(r.out, got, sizeof got);
  /* 0.002 + 0.00682843 x (1 + cos(pi p)) / 2, p = 0, 1/4, 2/4, 3/4 */
  assert_string_equal(got, "0.00882843 0.00782843 0.00541421 0.003");
  /* the same in two runs: the second takes the changed schedule from the
   * checkpoint of the first, silently */
  run(&r, "--threads", "2", "--steps", "6", "--schedule-steps", "8",
      "--resume", four, "--save", six, NULL);
  assert_int_equal(r.code, 0);
  run(&r, "--threads", "2", "--resume", six, "--save", again, "--json",
      NULL);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.err, "");
  assert_same_file(eight, again);
  /* a new --lr restarts the decay from it */
  run(&r, "--threads", "2", "--steps", "8", "--lr", "0.02", "--resume", four,
      "--json", NULL);
  assert_int_equal(r.code, 0);
  assert_non_null(strstr(r.err, ": from step 4 the learning rate goes from "
                         "0.02 (the new --lr) to 0.002 at step 8 by cosine,"));
  lr_list(r.out, got, sizeof got);
  assert_string_equal(got, "0.02 0.017364 0.011 0.00463604");
  /* --lr-min is checked against the file's --lr (0.01), not the default */
  run(&r, "--threads", "2", "--lr-min", "0.005", "--resume", four, "--json",
      NULL);
  assert_int_equal(r.code, 0);
  assert_non_null(strstr(r.err, ": from step 4 the learning rate goes from "
                         "0.00882843 (the checkpoint's current rate) to "
                         "0.005 at step 10 by cosine,"));
  run(&r, "--threads", "2", "--lr-min", "0.02", "--resume", four, NULL);
  snprintf(want, sizeof want, "--lr-min 0.02 is above --lr 0.01 (one of "
           "them from --resume '%s')", four);
  expect(&r, 2, want);
}
#undef CHANGE_ARGS

/* Writes the checkpoint of a TINY model that remat-train wrote before
 * its checkpoints held the model: the step and the data's state alone. */
static void write_old_checkpoint(const char *path, uint64_t step) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  remat_gpt_config cfg = {.layers = 1, .d_model = 16, .heads = 2, .seq = 16,
                          .batch = 8, .vocab = 14};
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-3f};
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_gpt_build(g, &cfg, &m), REMAT_OK);
  assert_int_equal(remat_compile(g, m.loss, &opt), REMAT_OK);
  const char *keys[] = {"train.step", "data.rng"};
  uint64_t values[] = {step, 12345};
  assert_int_equal(remat_save_checkpoint(g, path, keys, values, 2),
                   REMAT_OK);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* Copies `src` to `dst` with the first `from` replaced by `to` (of the
 * same length). */
static void patch_copy(const char *src, const char *dst, const char *from,
                       const char *to) {
  static char buf[1 << 20];
  FILE *f = fopen(src, "rb");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  assert_int_equal(strlen(from), strlen(to));
  char *at = memmem(buf, n, from, strlen(from));
  assert_non_null(at);
  memcpy(at, to, strlen(to));
  write_file(dst, buf, n);
}

/* A checkpoint knows its model: --prompt, --load and --resume take it
 * from the file, an option that disagrees is an error naming both, and
 * the file's values are checked; a checkpoint from before (no model in
 * it) still takes the options given. */
static void test_checkpoint_model(void **state) {
  (void)state;
  result r, full;
  char want[900];
  PATH_IN(text, "model.txt");
  PATH_IN(w, "model.ckpt");
  static char buf[2000];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = "the cat sat on the mat\n"[i % 23];
  write_file(text, buf, sizeof buf);
  run(&r, TINY, "--seq", "16", "--data", text, "--attention", "fused",
      "--steps", "5", "--save", w, NULL);
  assert_int_equal(r.code, 0);
  run(&r, "--load", w, "--prompt", "the c", "--tokens", "20",
      "--temperature", "0", NULL);
  run(&full, TINY, "--seq", "16", "--data", text, "--attention", "fused",
      "--load", w, "--prompt", "the c", "--tokens", "20", "--temperature",
      "0", NULL);
  assert_int_equal(r.code + full.code, 0);
  assert_string_equal(r.err, "");
  assert_string_equal(r.out, full.out);
  run(&r, "--load", w, "--layers", "2", "--prompt", "the", NULL);
  snprintf(want, sizeof want, "--layers 2 disagrees with --load '%s', whose "
           "model has --layers 1 (leave --layers out to take the file's)", w);
  expect(&r, 2, want);
  run(&r, "--resume", w, "--data", text, "--attention", "materialized", NULL);
  snprintf(want, sizeof want, "--attention materialized disagrees with "
           "--resume '%s', whose model has --attention fused (leave "
           "--attention out to take the file's)", w);
  expect(&r, 2, want);
  run(&r, "--resume", w, "--steps", "6", NULL);
  snprintf(want, sizeof want, "--resume '%s' holds a model of a text file "
           "(--data-format bytes): give the --data FILE to train on", w);
  expect(&r, 2, want);
  run(&r, "--load", w, NULL);
  snprintf(want, sizeof want, "--load '%s' holds a model of a text file "
           "(--data-format bytes): give the --data FILE to train on", w);
  expect(&r, 2, want);
  run(&r, "--threads", "2", "--resume", w, "--data", text, "--steps", "6",
      "--json", NULL);
  assert_int_equal(r.code, 0);
  assert_memory_equal(r.out, "{\"step\": 6, ", 12);
  /* the file's values are untrusted */
  PATH_IN(bad, "bad-model.ckpt");
  patch_copy(w, bad, "\"model.layers\":\"1\"", "\"model.layers\":\"0\"");
  run(&r, "--load", bad, "--prompt", "the", NULL);
  snprintf(want, sizeof want, "--load '%s': __metadata__ 'model.layers' is "
           "0: expected 1 to 1000000", bad);
  expect(&r, 1, want);
  patch_copy(w, bad, "\"model.heads\":\"2\"", "\"model.heads\":\"3\"");
  run(&r, "--load", bad, "--prompt", "the", NULL);
  snprintf(want, sizeof want, "--load '%s': __metadata__ 'model.heads' is "
           "3: expected a number of heads that divides model.d_model 16",
           bad);
  expect(&r, 1, want);
  patch_copy(w, bad, "\"model.seq\":", "\"model.sex\":");
  run(&r, "--resume", bad, "--data", text, NULL);
  snprintf(want, sizeof want, "--resume '%s': __metadata__ has 'train.meta' "
           "but no 'model.seq'", bad);
  expect(&r, 1, want);
  patch_copy(w, bad, "\"model.d_model\":\"16\"", "\"model.d_model\":\"1x\"");
  run(&r, "--resume", bad, "--data", text, NULL);
  snprintf(want, sizeof want, "--resume: remat_checkpoint_values: '%s': "
           "__metadata__ 'model.d_model' is not a whole number from 0 to "
           "2^64-1 written as a string", bad);
  expect(&r, 1, want);
  /* a checkpoint from before: the options as given */
  PATH_IN(old, "old.ckpt");
  write_old_checkpoint(old, 4);
  run(&r, TINY, "--steps", "6", "--resume", old, "--json", NULL);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.err, "");
  assert_memory_equal(r.out, "{\"step\": 5, ", 12);
  run(&r, "--steps", "6", "--resume", old, NULL);
  snprintf(want, sizeof want, "--resume: remat_load_checkpoint: '%s': tensor "
           "'wte' has shape [14,16] in the file but [14,128] in the model",
           old);
  expect(&r, 1, want);
}

/* Starts remat-train with the NULL-terminated arguments, standard output
 * to `out`; returns its pid once a first step is on standard output. */
static pid_t start_training(const char *out, ...) {
  const char *exe = getenv("REMAT_TRAIN");
  char *argv[40];
  int argc = 0;
  argv[argc++] = (char *)exe;
  va_list ap;
  va_start(ap, out);
  for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 39;)
    argv[argc++] = a;
  va_end(ap);
  argv[argc] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, tmp_path("stderr"),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid;
  assert_int_equal(posix_spawn(&pid, exe, &fa, NULL, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  static char text[8192];
  for (int tries = 0; tries < 6000; tries++) {
    slurp(out, text, sizeof text);
    if (strstr(text, "{\"step\": 1, ") != NULL)
      return pid;
    nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
  }
  fail_msg("remat-train did not start training");
  return pid;
}

/* The number of temporary files of saves (NAME.<16 hex digits>.tmp) in
 * the test's directory. */
static int temp_files(void) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    size_t len = strlen(e->d_name);
    n += len > 21 && strcmp(e->d_name + len - 4, ".tmp") == 0 &&
         e->d_name[len - 21] == '.';
  }
  closedir(d);
  return n;
}

/* Waits (up to a minute) until a save's temporary file exists. */
static void wait_for_save(void) {
  for (int tries = 0; tries < 600000 && temp_files() == 0; tries++)
    nanosleep(&(struct timespec){.tv_nsec = 100000}, NULL);
  assert_int_equal(temp_files(), 1);
}

static int wait_code(pid_t pid) {
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

/* SIGINT stops the run after its step with a checkpoint of that step; a
 * second signal ends it at once, with no checkpoint. */
static void test_signals(void **state) {
  (void)state;
  char ckpt[160], out[160], never[160];
  snprintf(ckpt, sizeof ckpt, "%s/stopped.ckpt", dir);
  snprintf(out, sizeof out, "%s/out", dir);
  snprintf(never, sizeof never, "%s/never.ckpt", dir);
  pid_t pid = start_training(out, TINY, "--steps", "1000000", "--json",
                             "--save", ckpt, NULL);
  assert_int_equal(kill(pid, SIGINT), 0);
  assert_int_equal(wait_code(pid), 130);
  static char text[1 << 16], err[1024], want[512];
  slurp(out, text, sizeof text);
  slurp(tmp_path("stderr"), err, sizeof err);
  int last = 0;
  for (const char *p = text; (p = strstr(p, "{\"step\": ")) != NULL; p++)
    last = atoi(p + 9);
  snprintf(want, sizeof want, "remat-train: stopped by SIGINT after step %d; "
           "checkpoint written to '%s'\n", last, ckpt);
  assert_string_equal(err, want);
  result r;
  run(&r, TINY, "--steps", "1", "--resume", ckpt, NULL);
  snprintf(want, sizeof want, "--resume '%s' is at step %d, past --steps 1 "
           "(the total, not steps to add)", ckpt, last);
  if (last > 1) /* else the signal came before step 2: resuming works */
    expect(&r, 1, want);
  else
    assert_int_equal(r.code, 0);

  pid = start_training(out, "--d-model", "128", "--seq", "32", "--batch",
                       "32", "--threads", "2", "--steps", "1000000",
                       "--json", "--save", never, NULL);
  /* Both signals pending at once, however long this process waits between
   * the two kill calls: they are sent while the run is stopped (else a
   * pause of one step and its save between them ends the run after the
   * first, with a checkpoint). A second SIGTERM could merge with the
   * first, so the second is SIGINT. */
  int stopped;
  assert_int_equal(kill(pid, SIGSTOP), 0);
  assert_int_equal(waitpid(pid, &stopped, WUNTRACED), pid);
  assert_true(WIFSTOPPED(stopped));
  assert_int_equal(kill(pid, SIGTERM), 0);
  assert_int_equal(kill(pid, SIGINT), 0);
  assert_int_equal(kill(pid, SIGCONT), 0);
  assert_int_equal(wait_code(pid), EXIT_UNSAVED);
  slurp(tmp_path("stderr"), err, sizeof err);
  /* both pending at once, SIGINT (the lower number) may come first */
  const char *second = strstr(err, "SIGTERM") != NULL ? "SIGTERM" : "SIGINT";
  snprintf(want, sizeof want, "remat-train: stopped at once by a second "
           "%s: no checkpoint written to '%s' (it is as it was)\n", second,
           never);
  assert_string_equal(err, want);
  assert_int_equal(access(never, F_OK), -1);
  assert_int_equal(temp_files(), 0);
}

/* A model whose checkpoint (weights and AdamW's moments) is about 150 MB,
 * so that a signal can come while it is written. */
#define BIG "--layers", "4", "--d-model", "512", "--heads", "8", "--seq", \
            "16", "--batch", "2", "--threads", "2"

/* A second signal during the stop's save waits for the file to be whole:
 * the checkpoint is written, no temporary file is left, and stderr says
 * so; a SIGTERM during the final save (after the last step) stops the run
 * there, with the checkpoint written. */
static void test_signal_during_save(void **state) {
  (void)state;
  char ckpt[160], out[160], want[512];
  static char err[1024], text[1 << 16];
  snprintf(ckpt, sizeof ckpt, "%s/big.ckpt", dir);
  snprintf(out, sizeof out, "%s/out-big", dir);
  pid_t pid = start_training(out, BIG, "--steps", "1000000", "--json",
                             "--save", ckpt, NULL);
  assert_int_equal(kill(pid, SIGINT), 0);
  wait_for_save();
  assert_int_equal(kill(pid, SIGINT), 0);
  assert_int_equal(wait_code(pid), 130);
  assert_int_equal(temp_files(), 0);
  slurp(out, text, sizeof text);
  int last = 0;
  for (const char *p = text; (p = strstr(p, "{\"step\": ")) != NULL; p++)
    last = atoi(p + 9);
  slurp(tmp_path("stderr"), err, sizeof err);
  snprintf(want, sizeof want, "remat-train: stopped by SIGINT after step %d; "
           "checkpoint written to '%s' (a second SIGINT came during the "
           "save, which was finished first)\n", last, ckpt);
  assert_string_equal(err, want);
  assert_int_equal(unlink(ckpt), 0);

  pid = start_training(out, BIG, "--steps", "2", "--json", "--save", ckpt,
                       NULL);
  wait_for_save();
  assert_int_equal(kill(pid, SIGTERM), 0);
  assert_int_equal(wait_code(pid), 130);
  assert_int_equal(temp_files(), 0);
  slurp(tmp_path("stderr"), err, sizeof err);
  snprintf(want, sizeof want, "remat-train: stopped by SIGTERM after step 2; "
           "checkpoint written to '%s'\n", ckpt);
  assert_string_equal(err, want);
  slurp(out, text, sizeof text);
  assert_null(strstr(text, "\"done\"")); /* stopped before evaluating */
  struct stat st;
  assert_int_equal(stat(ckpt, &st), 0);
  assert_true(st.st_size > 100000000);
  assert_int_equal(unlink(ckpt), 0);
}

/* Each line of `text` starts with "step " and has at most `max` bytes;
 * returns the number of lines. */
static int progress_lines(const char *text, size_t max) {
  int n = 0;
  for (const char *p = text; *p != '\0'; n++) {
    const char *nl = strchr(p, '\n');
    assert_non_null(nl);
    assert_memory_equal(p, "step ", 5);
    assert_true((size_t)(nl - p) <= max);
    p = nl + 1;
  }
  return n;
}

/* Results on stdout, progress on stderr: one line per tenth of the run
 * when stderr is not a terminal, within 79 columns, or COLUMNS - 1. */
static void test_output_streams(void **state) {
  (void)state;
  result r;
  unsetenv("COLUMNS");
  run(&r, TINY, "--steps", "20", NULL);
  assert_int_equal(r.code, 0);
  assert_memory_equal(r.out, "held-out completions (greedy):\n  ", 33);
  assert_non_null(strstr(r.out, "\nheld-out loss "));
  assert_non_null(strstr(r.out, "exact-match accuracy "));
  assert_int_equal(progress_lines(r.err, 79), 10);
  assert_memory_equal(r.err, "step  2/20 [=>", 14);
  assert_non_null(strstr(r.err, " | ETA 0m"));
  setenv("COLUMNS", "40", 1);
  run(&r, TINY, "--steps", "20", NULL);
  unsetenv("COLUMNS");
  assert_int_equal(progress_lines(r.err, 39), 10);
  assert_non_null(strstr(r.err, "step 20/20 [==============] loss 2."));
  assert_null(strstr(r.err, "tok/s"));
  /* A text file: no accuracy, so null in the JSON. */
  const char *text = cat_text("small.txt");
  run(&r, TINY, "--data", text, "--seq", "16", "--steps", "2", "--json",
      NULL);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.err, "");
  assert_non_null(strstr(r.out, "\"accuracy\": null, "));
}

/* On a terminal the line is redrawn in place: carriage returns, one
 * newline at the end. */
static void test_progress_terminal(void **state) {
  (void)state;
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  assert_true(master >= 0);
  assert_int_equal(grantpt(master), 0);
  assert_int_equal(unlockpt(master), 0);
  const char *exe = getenv("REMAT_TRAIN");
  char *argv[] = {(char *)exe, TINY, "--steps", "20", NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, ptsname(master), O_RDWR, 0);
  setenv("COLUMNS", "60", 1);
  pid_t pid;
  assert_int_equal(posix_spawn(&pid, exe, &fa, NULL, argv, environ), 0);
  unsetenv("COLUMNS");
  posix_spawn_file_actions_destroy(&fa);
  static char text[1 << 16];
  size_t n = 0;
  for (ssize_t got; n + 1 < sizeof text &&
                    (got = read(master, text + n, sizeof text - 1 - n)) > 0;)
    n += (size_t)got; /* EIO once the child closed the terminal */
  text[n] = '\0';
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(master);
  int returns = 0;
  for (const char *p = text; (p = strchr(p, '\r')) != NULL; p++)
    returns += p[1] == 's'; /* the terminal turns "\n" into "\r\n" */
  assert_true(returns >= 1);
  assert_memory_equal(text, "\rstep ", 6);
  const char *nl = strchr(text, '\n');
  assert_non_null(nl);
  assert_null(strchr(nl + 1, '\n'));
  assert_non_null(strstr(text, "step 20/20 ["));
}

/* The line of `text` that starts with `head`, without its newline. */
static void copy_line(const char *text, const char *head, char *buf,
                      size_t len) {
  const char *p = strstr(text, head);
  assert_non_null(p);
  snprintf(buf, len, "%.*s", (int)strcspn(p, "\n"), p);
}

/* The evaluation lines of a --json run: their steps and held-out losses;
 * returns how many. Each comes right after its step's line. */
static int eval_lines(const char *out, int *steps, double *losses, int max) {
  int n = 0;
  for (const char *p = out; (p = strstr(p, "{\"eval_step\": ")) != NULL;
       p++) {
    assert_true(n < max);
    steps[n] = atoi(p + 14);
    losses[n] = json_number(p, "\"heldout_loss\": ");
    char before[64];
    snprintf(before, sizeof before, "{\"step\": %d, ", steps[n]);
    assert_true(p > out); /* not the first line */
    const char *line = p - 1; /* the newline that ends the line before */
    while (line > out && line[-1] != '\n')
      line--;
    assert_memory_equal(line, before, strlen(before));
    n++;
  }
  return n;
}

/* --eval-every: a JSON line after every N steps with the held-out loss of
 * the weights of that step (a 10-step run ends with the 20-step run's
 * evaluation at step 10), the training unchanged by it, the best step in
 * the summary, the figures in the progress line. */
static void test_eval_every(void **state) {
  (void)state;
  result a, b, c;
  int steps[8];
  double losses[8];
#define EVAL_ARGS TINY, "--schedule", "constant", "--json"
  run(&a, EVAL_ARGS, "--steps", "20", "--eval-every", "5", NULL);
  run(&b, EVAL_ARGS, "--steps", "20", NULL);
  run(&c, EVAL_ARGS, "--steps", "10", NULL);
#undef EVAL_ARGS
  assert_int_equal(a.code, 0);
  assert_string_equal(a.err, "");
  assert_int_equal(eval_lines(a.out, steps, losses, 8), 4);
  for (int i = 0; i < 4; i++)
    assert_int_equal(steps[i], 5 * (i + 1));
  assert_null(strstr(b.out, "eval_step"));
  assert_non_null(strstr(a.out, "{\"eval_step\": 5, \"heldout_loss\": "));
  assert_non_null(strstr(a.out, ", \"accuracy\": 0."));
  for (int step = 1; step <= 20; step++) {
    char key[32];
    snprintf(key, sizeof key, "{\"step\": %d, ", step);
    assert_float_equal(json_number(strstr(a.out, key), "\"loss\": "),
                       json_number(strstr(b.out, key), "\"loss\": "), 0.0);
  }
  const char *done = strstr(a.out, "{\"done\"");
  assert_float_equal(losses[1],
                     json_number(strstr(c.out, "{\"done\""),
                                 "\"heldout_loss\": "), 0.0);
  assert_float_equal(losses[3], json_number(done, "\"heldout_loss\": "), 0.0);
  int best = 0;
  for (int i = 1; i < 4; i++)
    best = losses[i] < losses[best] ? i : best;
  assert_int_equal((int)json_number(done, "\"best_step\": "), steps[best]);
  assert_float_equal(json_number(done, "\"best_heldout_loss\": "),
                     losses[best], 0.0);
  /* Trained on "abab...", held out on "cdcd...": the held-out loss rises
   * again as the model learns its training text, so the best step is not
   * the last; a text file has no accuracy. */
  char ab[160];
  static char text[2000];
  snprintf(ab, sizeof ab, "%s/ab.txt", dir);
  for (int i = 0; i < 2000; i++)
    text[i] = (char)((i < 1800 ? 'a' : 'c') + i % 2);
  write_file(ab, text, sizeof text);
  run(&a, TINY, "--data", ab, "--seq", "16", "--steps", "20", "--json",
      "--eval-every", "5", NULL);
  assert_int_equal(eval_lines(a.out, steps, losses, 8), 4);
  assert_non_null(strstr(a.out, "{\"eval_step\": 10, \"heldout_loss\": "));
  assert_null(strstr(a.out, "\"accuracy\": 0"));
  best = 0;
  for (int i = 1; i < 4; i++)
    best = losses[i] < losses[best] ? i : best;
  assert_true(best < 3);
  done = strstr(a.out, "{\"done\"");
  assert_int_equal((int)json_number(done, "\"best_step\": "), steps[best]);
  /* Without --json: the figures in the progress line, within 79 columns,
   * and the best step in the summary. */
  unsetenv("COLUMNS");
  run(&a, TINY, "--data", ab, "--seq", "16", "--steps", "20",
      "--eval-every", "5", NULL);
  assert_int_equal(progress_lines(a.err, 79), 10);
  char line[96], want[96];
  copy_line(a.err, "step  4/20 [", line, sizeof line); /* no evaluation yet */
  assert_null(strstr(line, "val"));
  copy_line(a.err, "step  6/20 [", line, sizeof line);
  snprintf(want, sizeof want, " | val %.4f |", losses[0]);
  assert_non_null(strstr(line, want));
  snprintf(want, sizeof want, "\nbest held-out loss %.4f at step %d "
           "(evaluated every 5 steps)\n", losses[best], steps[best]);
  assert_non_null(strstr(a.out, want));
  run(&a, TINY, "--eval-every", "0", NULL);
  expect(&a, 2, "--eval-every '0': expected a whole number from 1 to 1000000");
  run(&a, TINY, "--steps", "4", "--eval-every", "10", NULL);
  expect(&a, 2, "--eval-every 10 is more than --steps 4: it takes 1 to "
                "--steps (the end of training is always evaluated)");
  run(&a, TINY, "--steps", "0", "--eval-every", "1", NULL);
  expect(&a, 2, "--eval-every 1 is more than --steps 0: it takes 1 to "
                "--steps (the end of training is always evaluated)");
}

/* Weights so large (1e30, finite: a load accepts them) that every logit
 * overflows: the held-out loss is NaN, which --json writes as null with
 * the field named in "nonfinite" (JSON has no NaN); and with no training
 * step the summary's peak memory is the evaluation's, not 0. */
static void test_json_nonfinite(void **state) {
  (void)state;
  remat_gpt_config cfg = {.layers = 1, .d_model = 16, .heads = 2, .seq = 16,
                          .batch = 8, .vocab = 14};
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_gpt_build(g, &cfg, &m), REMAT_OK);
  assert_int_equal(remat_compile(g, m.loss, NULL), REMAT_OK);
  static float big[16 * 64];
  for (size_t i = 0; i < sizeof big / sizeof *big; i++)
    big[i] = 1e30f;
  for (int i = 0; i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    size_t bytes = (size_t)remat_tensor_numel(p) * sizeof(float);
    assert_true(bytes <= sizeof big);
    assert_int_equal(remat_write(g, p, big, bytes), REMAT_OK);
  }
  char *path = tmp_path("huge.safetensors");
  assert_int_equal(remat_save_safetensors(g, path), REMAT_OK);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  result r;
  run(&r, TINY, "--steps", "0", "--load", path, "--json", NULL);
  assert_int_equal(r.code, 0);
  assert_non_null(strstr(r.out, "{\"done\": true, \"steps\": 0, "
                                "\"heldout_loss\": null, "));
  assert_non_null(strstr(r.out, "\"best_heldout_loss\": null, "));
  assert_non_null(strstr(r.out, ", \"nonfinite\": [\"heldout_loss\", "
                                "\"best_heldout_loss\"]}\n"));
  assert_null(strstr(r.out, "nan"));
  assert_true(json_number(r.out, "\"peak_bytes\": ") > 0.0);
  run(&r, TINY, "--steps", "0", "--load", path, NULL);
  assert_int_equal(r.code, 0);
  assert_null(strstr(r.out, "peak memory 0.0 MiB"));
  assert_non_null(strstr(r.out, " MiB (evaluation)\n"));
}

/* Greedy decoding through the library alone: a forward-only GPT of one
 * row with the weights of `path`, fed the last cfg->seq tokens of the
 * context and padded with 'x' (remat-train pads with 0: a causal model
 * must not see it); returns prompt + `tokens` new bytes in `out`. */
static void library_greedy(const char *path, const remat_gpt_config *cfg,
                           const char *prompt, int tokens, char *out) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_gpt_build(g, cfg, &m), REMAT_OK);
  assert_int_equal(remat_keep(g, m.logits), REMAT_OK);
  assert_int_equal(remat_compile(g, NULL, NULL), REMAT_OK);
  assert_int_equal(remat_load_safetensors(g, path), REMAT_OK);
  int32_t window[64] = {0}, vocab = cfg->vocab, seq = cfg->seq;
  static float logits[64 * 256];
  assert_true(seq <= 64 && vocab <= 256);
  assert_int_equal(remat_feed(g, m.targets, window, seq * sizeof *window),
                   REMAT_OK);
  int n = (int)strlen(prompt);
  memcpy(out, prompt, (size_t)n);
  for (; n < (int)strlen(prompt) + tokens; n++) {
    int start = n > seq ? n - seq : 0;
    for (int t = 0; t < seq; t++)
      window[t] = t < n - start ? (unsigned char)out[start + t] : 'x';
    assert_int_equal(remat_feed(g, m.tokens, window, seq * sizeof *window),
                     REMAT_OK);
    assert_int_equal(remat_forward(g, NULL), REMAT_OK);
    assert_int_equal(remat_read(g, m.logits, logits,
                                (size_t)seq * vocab * sizeof *logits),
                     REMAT_OK);
    const float *at = logits + (size_t)(n - start - 1) * vocab;
    int best = 0;
    for (int i = 1; i < vocab; i++)
      best = at[i] > at[best] ? i : best;
    out[n] = (char)best;
  }
  out[n] = '\0';
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* --prompt: greedy text is the library's argmax decoding, through a
 * window that slides past --seq; a seed gives the same draws, another
 * seed others; --top-k 1 is greedy at any temperature. */
static void test_sample(void **state) {
  (void)state;
  char text[160], w[160];
  snprintf(text, sizeof text, "%s/fox.txt", dir);
  snprintf(w, sizeof w, "%s/fox.ckpt", dir);
  static const char fox[] = "the quick brown fox jumps over the lazy dog\n";
  static char buf[2000];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = fox[i % 44];
  write_file(text, buf, sizeof buf);
  result r, greedy, again;
#define FOX TINY, "--seq", "16", "--data", text
  run(&r, FOX, "--steps", "60", "--save", w, NULL);
  assert_int_equal(r.code, 0);
  run(&greedy, FOX, "--load", w, "--prompt", "the quick", "--tokens", "30",
      "--temperature", "0", NULL);
  assert_int_equal(greedy.code, 0);
  assert_string_equal(greedy.err, "");
  char want[64];
  remat_gpt_config cfg = {.layers = 1, .d_model = 16, .heads = 2, .seq = 16,
                          .batch = 1, .vocab = 256};
  library_greedy(w, &cfg, "the quick", 30, want);
  strcat(want, "\n");
  assert_string_equal(greedy.out, want);
  print_message("greedy: %s", greedy.out);
  /* temperature 1: a seed's draws, repeatable; another seed's differ */
  run(&r, FOX, "--load", w, "--prompt", "the quick", "--tokens", "30",
      "--seed", "7", NULL);
  run(&again, FOX, "--load", w, "--prompt", "the quick", "--tokens", "30",
      "--seed", "7", NULL);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.out, again.out);
  assert_memory_equal(r.out, "the quick", 9);
  assert_int_equal(strlen(r.out), 9 + 30 + 1);
  assert_string_not_equal(r.out, greedy.out);
  run(&again, FOX, "--load", w, "--prompt", "the quick", "--tokens", "30",
      "--seed", "8", NULL);
  assert_string_not_equal(r.out, again.out);
  run(&r, FOX, "--load", w, "--prompt", "the quick", "--tokens", "30",
      "--seed", "8", "--top-k", "1", "--temperature", "2", NULL);
  assert_string_equal(r.out, greedy.out);
  /* a temperature near 0 sharpens the draws onto the most likely token */
  run(&r, FOX, "--load", w, "--prompt", "the quick", "--tokens", "30",
      "--seed", "7", "--temperature", "0.0001", NULL);
  assert_string_equal(r.out, greedy.out);
  /* errors */
  run(&r, FOX, "--prompt", "the", NULL);
  expect(&r, 2, "--prompt needs --load FILE: the weights to sample from");
  run(&r, FOX, "--top-k", "3", NULL);
  expect(&r, 2, "--top-k needs --prompt TEXT");
  run(&r, FOX, "--load", w, "--prompt", "the", "--steps", "5", NULL);
  expect(&r, 2, "--steps does not apply to --prompt, which samples from the "
                "weights of --load without training");
  run(&r, FOX, "--load", w, "--prompt", "", NULL);
  expect(&r, 2, "--prompt is empty: give at least one token");
  run(&r, FOX, "--load", w, "--prompt", "a", "--temperature", "-1", NULL);
  expect(&r, 2, "--temperature '-1': expected a number >= 0");
  /* weights trained at --seq 16, sampled at --seq 32 */
  run(&r, TINY, "--seq", "32", "--data", text, "--load", w, "--prompt", "a",
      NULL);
  char shape[512];
  snprintf(shape, sizeof shape, "--seq 32 disagrees with --load '%s', whose "
           "model has --seq 16 (leave --seq out to take the file's)", w);
  expect(&r, 2, shape);
  run(&r, FOX, "--load", w, "--prompt", "a", "--top-k", "0", NULL);
  expect(&r, 2, "--top-k '0': expected a whole number from 1 to 1000000");
#undef FOX
  /* the checkpoint knows its data: no --data needed, and the addition
   * task's tokens only for its model */
  run(&r, "--load", w, "--prompt", "12a", "--tokens", "3", NULL);
  assert_int_equal(r.code, 0);
  assert_memory_equal(r.out, "12a", 3);
  PATH_IN(add, "add.ckpt");
  run(&r, TINY, "--steps", "1", "--save", add, NULL);
  run(&r, "--load", add, "--prompt", "12a", NULL);
  expect(&r, 2, "--prompt: 'a' is not a token of the addition task "
                "(digits, + and =)");
  run(&r, TINY, "--load", add, "--prompt", "1\xff", NULL);
  expect(&r, 2, "--prompt: '\\xff' is not a token of the addition task "
                "(digits, + and =)");
  char ids[160];
  uint16_t fox_ids[44];
  for (int i = 0; i < 44; i++)
    fox_ids[i] = (uint16_t)fox[i];
  snprintf(ids, sizeof ids, "%s/fox.bin", dir);
  write_ids(ids, fox_ids, 44, sizeof buf, 0);
  PATH_IN(u16, "fox-u16.ckpt");
  run(&r, TINY, "--seq", "16", "--data", ids, "--data-format", "u16",
      "--steps", "1", "--save", u16, NULL);
  assert_int_equal(r.code, 0);
  run(&r, "--load", u16, "--prompt", "116, 104 x", NULL);
  expect(&r, 2, "--prompt '116, 104 x': expected token ids 0 to 122 "
                "separated by spaces or commas");
}

#if defined(__SANITIZE_ADDRESS__)
#define CLI_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CLI_UNDER_ASAN 1
#endif
#endif
#ifndef CLI_UNDER_ASAN
#define CLI_UNDER_ASAN 0
#endif

/* A failed allocation of remat-train's own (here the sampling logits,
 * --seq 100000 x vocabulary 65536 x 4 bytes, under a 16 GiB address
 * space) names what it was for and its size, not a stale or empty library
 * message. */
static void test_sample_out_of_memory(void **state) {
  (void)state;
  char big[160], want[256];
  snprintf(big, sizeof big, "%s/big.bin", dir);
  enum { TOKENS = 1000010 };
  unsigned char *ids = malloc(2 * TOKENS);
  assert_non_null(ids);
  memset(ids, 0xff, 2 * TOKENS); /* id 65535: the vocabulary is 65536 */
  write_file(big, ids, 2 * TOKENS);
  free(ids);
  result r;
#if CLI_UNDER_ASAN
  /* AddressSanitizer reserves terabytes of address space, so an address
   * space limit breaks it (and this process): its allocator refuses the
   * logits instead, returning NULL as malloc would. */
  const char *prev = getenv("ASAN_OPTIONS");
  char *saved = prev != NULL ? strdup(prev) : NULL;
  char opts[512];
  snprintf(opts, sizeof opts, "%s%sallocator_may_return_null=1:"
           "max_allocation_size_mb=16384", prev != NULL ? prev : "",
           prev != NULL && *prev != '\0' ? ":" : "");
  setenv("ASAN_OPTIONS", opts, 1); /* inherited by the child */
  run(&r, TINY, "--seq", "100000", "--data", big, "--data-format", "u16",
      "--load", big, "--prompt", "1", "--tokens", "1", NULL);
  if (saved != NULL)
    setenv("ASAN_OPTIONS", saved, 1);
  else
    unsetenv("ASAN_OPTIONS");
  free(saved);
#else
  struct rlimit old, small;
  assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
  small = old;
  small.rlim_cur = (rlim_t)16 << 30;
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < small.rlim_cur)
    small.rlim_cur = old.rlim_max;
  assert_int_equal(setrlimit(RLIMIT_AS, &small), 0); /* inherited */
  run(&r, TINY, "--seq", "100000", "--data", big, "--data-format", "u16",
      "--load", big, "--prompt", "1", "--tokens", "1", NULL);
  assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
#endif
  snprintf(want, sizeof want, "out of memory: the evaluation's logits (rows "
           "x --seq x vocabulary x 4) needs %zu bytes",
           (size_t)100000 * 65536 * 4);
#if CLI_UNDER_ASAN
  /* the sanitizer's allocator warns (lines of its own, "==pid==...")
   * before remat-train's message */
  const char *msg = strstr(r.err, "remat-train: ");
  assert_non_null(msg);
  for (const char *l = r.err; l < msg; l = strchr(l, '\n') + 1)
    assert_true(strncmp(l, "==", 2) == 0 || *l == '\n');
  result tail = r;
  memmove(tail.err, msg, strlen(msg) + 1);
  expect(&tail, 1, want);
#else
  expect(&r, 1, want);
#endif
  unlink(big);
}

/* Warm-up, then the schedule from --lr to --lr-min; a resumed run of the
 * same schedule gets the learning rates of a straight one. */
static void test_schedules(void **state) {
  (void)state;
  result r;
  char got[512];
#define SCHEDULE_ARGS TINY, "--steps", "10", "--json", "--warmup", "2", \
    "--lr", "0.01", "--lr-min", "0.002", "--schedule"
  run(&r, SCHEDULE_ARGS, "linear", NULL);
  lr_list(r.out, got, sizeof got);
  assert_string_equal(got, "0.00333333 0.00666667 0.01 0.009 0.008 0.007 "
                      "0.006 0.005 0.004 0.003");
  run(&r, SCHEDULE_ARGS, "constant", NULL);
  lr_list(r.out, got, sizeof got);
  assert_string_equal(got, "0.00333333 0.00666667 0.01 0.01 0.01 0.01 0.01 "
                      "0.01 0.01 0.01");
  run(&r, SCHEDULE_ARGS, "cosine", NULL);
  lr_list(r.out, got, sizeof got);
  assert_string_equal(got, "0.00333333 0.00666667 0.01 0.00969552 "
                      "0.00882843 0.00753073 0.006 0.00446927 0.00317157 "
                      "0.00230448");
  char ckpt[160];
  snprintf(ckpt, sizeof ckpt, "%s/four-of-ten.ckpt", dir);
  run(&r, SCHEDULE_ARGS, "cosine", "--steps", "4", "--schedule-steps", "10",
      "--save", ckpt, NULL);
  run(&r, SCHEDULE_ARGS, "cosine", "--resume", ckpt, NULL);
  assert_string_equal(r.err, "");
#undef SCHEDULE_ARGS
  lr_list(r.out, got, sizeof got);
  assert_string_equal(got, "0.00882843 0.00753073 0.006 0.00446927 "
                      "0.00317157 0.00230448");
  /* The default peak rate: 0.001 for the addition task, 0.003 with --data */
  run(&r, TINY, "--steps", "2", "--json", "--schedule", "constant", NULL);
  lr_list(r.out, got, sizeof got);
  assert_string_equal(got, "0.001 0.001");
  const char *text = cat_text("rates.txt");
  run(&r, TINY, "--data", text, "--seq", "16", "--steps", "2", "--json",
      "--schedule", "constant", NULL);
  lr_list(r.out, got, sizeof got);
  assert_string_equal(got, "0.003 0.003");
}

/* --accum 2 of --batch 4 trains as --batch 8 (the same rows, drawn in
 * order); --clip bounds the update, and grad_norm is in the JSON. */
static void test_accum_clip(void **state) {
  (void)state;
#define ACCUM_ARGS TINY, "--optimizer", "sgd", "--schedule", "constant", \
    "--warmup", "0", "--lr", "0.1", "--steps", "5", "--json"
  result one, acc;
  run(&one, ACCUM_ARGS, NULL);
  run(&acc, ACCUM_ARGS, "--batch", "4", "--accum", "2", NULL);
  assert_int_equal(one.code, 0);
  assert_int_equal(acc.code, 0);
  for (const char *key = "\"loss\": "; key != NULL;
       key = key[1] == 'l' ? "\"grad_norm\": " : NULL) {
    double a = json_number(strstr(one.out, "{\"step\": 5, "), key);
    double b = json_number(strstr(acc.out, "{\"step\": 5, "), key);
    if (fabs(a - b) > 1e-5 * fabs(a) || a == 0.0)
      fail_msg("%s %.9g with --batch 8, %.9g with --accum 2", key, a, b);
  }
  double h1 = json_number(strstr(one.out, "{\"done\""), "\"heldout_loss\": ");
  double h2 = json_number(strstr(acc.out, "{\"done\""), "\"heldout_loss\": ");
  assert_true(fabs(h1 - h2) < 1e-5 * h1);
  /* A clip far below the norm: the weights hardly move, so the held-out
   * loss stays at the untrained model's. */
  result clipped, untrained;
  run(&clipped, ACCUM_ARGS, "--clip", "1e-6", NULL);
  run(&untrained, TINY, "--steps", "0", "--json", NULL);
  double hc = json_number(strstr(clipped.out, "{\"done\""), "\"heldout_loss\": ");
  double h0 = json_number(strstr(untrained.out, "{\"done\""), "\"heldout_loss\": ");
  assert_true(fabs(hc - h0) < 1e-5 * h0 && fabs(h1 - h0) > 1e-3 * h0);
  run(&clipped, ACCUM_ARGS, "--clip", "0", NULL);
  expect(&clipped, 2, "--clip '0': expected a number > 0");
  run(&clipped, ACCUM_ARGS, "--accum", "0", NULL);
  expect(&clipped, 2,
         "--accum '0': expected a whole number from 1 to 1000000");
#undef ACCUM_ARGS
  /* Checkpoints fall between updates: a resumed run with --accum and
   * --clip ends bitwise where a straight one does. */
  char straight[160], half[160], resumed[160];
  snprintf(straight, sizeof straight, "%s/accum-straight.ckpt", dir);
  snprintf(half, sizeof half, "%s/accum-half.ckpt", dir);
  snprintf(resumed, sizeof resumed, "%s/accum-resumed.ckpt", dir);
#define RESUME_ARGS TINY, "--batch", "4", "--accum", "3", "--clip", "0.5", \
    "--schedule", "constant", "--json"
  run(&one, RESUME_ARGS, "--steps", "6", "--save", straight, NULL);
  run(&acc, RESUME_ARGS, "--steps", "2", "--save", half, NULL);
  assert_int_equal(one.code + acc.code, 0);
  run(&acc, RESUME_ARGS, "--steps", "6", "--resume", half, "--save", resumed,
      NULL);
#undef RESUME_ARGS
  assert_int_equal(acc.code, 0);
  assert_same_file(straight, resumed);
}

static int count(const char *text, const char *what) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what))
    n++;
  return n;
}

/* --trace records the training steps asked for, not the evaluation. */
static void test_trace_steps(void **state) {
  (void)state;
  char path[160];
  static char text[1 << 21];
  snprintf(path, sizeof path, "%s/train-trace.json", dir);
  result r;
  run(&r, TINY, "--steps", "3", "--accum", "2", "--trace", path,
      "--trace-steps", "3", "--json", NULL);
  assert_int_equal(r.code, 0);
  slurp(path, text, sizeof text);
  assert_int_equal(count(text, "\"cat\":\"step\""), 3);
  assert_int_equal(count(text, "(remat_accumulate)"), 2);
  assert_int_equal(count(text, "(remat_step)"), 1);
  assert_int_equal(count(text, "remat_forward"), 0);
  assert_true(count(text, "\"name\":\"h0.ffn_in dW\"") > 0);
  assert_true(count(text, "\"name\":\"live bytes\",\"ph\":\"C\"") > 10);
  run(&r, TINY, "--steps", "1", "--trace", dir, NULL);
  char want[256];
  snprintf(want, sizeof want,
           "remat_trace_steps: '%s' is a directory: the trace must be a "
           "regular file or a new name",
           dir);
  expect(&r, 1, want);
  run(&r, TINY, "--trace-steps", "0", NULL);
  expect(&r, 2, "--trace-steps '0': expected a whole number from 1 to 1000000");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_usage_errors),
      cmocka_unit_test(test_tool_messages),
      cmocka_unit_test(test_help_and_version),
      cmocka_unit_test(test_data_errors),
      cmocka_unit_test(test_data_not_a_file),
      cmocka_unit_test(test_data_stdin),
      cmocka_unit_test(test_token_file_errors),
      cmocka_unit_test(test_token_file_trains),
      cmocka_unit_test(test_budget_infeasible),
      cmocka_unit_test(test_budget_evaluation),
      cmocka_unit_test(test_save_load),
      cmocka_unit_test(test_resume_adamw),
      cmocka_unit_test(test_resume_sgd),
      cmocka_unit_test(test_checkpoint_errors),
      cmocka_unit_test(test_resume_cosine),
      cmocka_unit_test(test_resume_changed_schedule),
      cmocka_unit_test(test_checkpoint_model),
      cmocka_unit_test(test_signals),
      cmocka_unit_test(test_signal_during_save),
      cmocka_unit_test(test_json_nonfinite),
      cmocka_unit_test(test_output_streams),
      cmocka_unit_test(test_progress_terminal),
      cmocka_unit_test(test_schedules),
      cmocka_unit_test(test_eval_every),
      cmocka_unit_test(test_sample),
      cmocka_unit_test(test_accum_clip),
      cmocka_unit_test(test_trace_steps),
      cmocka_unit_test(test_sample_out_of_memory),
      cmocka_unit_test(test_bf16_learns),
  };
  const char *filter = getenv("REMAT_TEST_FILTER"); /* e.g. test_signal* */
  if (filter != NULL && filter[0] != '\0')
    cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
