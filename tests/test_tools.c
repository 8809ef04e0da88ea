/* Tests of remat-train's pieces that its output does not show: option
 * defaults (batch and seq with and without --data), the split of a text
 * or token file (training windows never read held-out tokens; held-out
 * evaluation starts where training ends), the fields the progress
 * line keeps as the width shrinks, and the numbers of --json (NaN and
 * infinities as null, named in "nonfinite"). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tmpdir.h"
#include "tools/json_out.h"
#include "tools/train.h"

static int parse(train_options *o, int argc, const char **argv) {
  return options_parse(argc, (char **)argv, o);
}

static void test_batch_and_seq_defaults(void **state) {
  (void)state;
  train_options o;
  const char *none[] = {"remat-train"};
  assert_int_equal(parse(&o, 1, none), 0);
  assert_int_equal(o.cfg.batch, 64);
  assert_int_equal(o.cfg.seq, 16);
  const char *text[] = {"remat-train", "--data", "f"};
  assert_int_equal(parse(&o, 3, text), 0);
  assert_int_equal(o.cfg.batch, 16);
  assert_int_equal(o.cfg.seq, 128);
  const char *given[] = {"remat-train", "--data", "f", "--batch", "4"};
  assert_int_equal(parse(&o, 5, given), 0);
  assert_int_equal(o.cfg.batch, 4);
  assert_int_equal(o.cfg.seq, 128);
}

/* --attention: the builder's default when absent, fused or materialized,
 * anything else a usage error. */
static void test_attention_option(void **state) {
  (void)state;
  train_options o;
  const char *none[] = {"remat-train"};
  assert_int_equal(parse(&o, 1, none), 0);
  assert_int_equal(o.cfg.attention, REMAT_ATTENTION_DEFAULT);
  const char *fused[] = {"remat-train", "--attention", "fused"};
  assert_int_equal(parse(&o, 3, fused), 0);
  assert_int_equal(o.cfg.attention, REMAT_ATTENTION_FUSED);
  const char *mat[] = {"remat-train", "--attention", "materialized"};
  assert_int_equal(parse(&o, 3, mat), 0);
  assert_int_equal(o.cfg.attention, REMAT_ATTENTION_MATERIALIZED);
  const char *bad[] = {"remat-train", "--attention", "default"};
  assert_int_equal(parse(&o, 3, bad), EXIT_USAGE);
}

/* Writes `n` bytes: `a` copies of 'a', then 'b's. */
static void write_text(const char *path, int n, int a) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  for (int i = 0; i < n; i++)
    fputc(i < a ? 'a' : 'b', f);
  fclose(f);
}

static void test_text_split(void **state) {
  (void)state;
  char path[128], err[256];
  snprintf(path, sizeof path, "%s/text.txt", dir);
  write_text(path, 1000, 900);
  dataset *d = dataset_text(path, 16, err, sizeof err);
  assert_non_null(d);
  assert_int_equal(d->train_len, 900);
  assert_int_equal(d->heldout_start, 900);
  /* Windows of 99 tokens over 900 training bytes: no token or target may
   * be a held-out 'b'. */
  int32_t tokens[8 * 99], targets[8 * 99];
  for (int round = 0; round < 1000; round++) {
    dataset_batch(d, 8, 99, tokens, targets);
    for (int i = 0; i < 8 * 99; i++)
      if (tokens[i] == 'b' || targets[i] == 'b')
        fail_msg("round %d: position %d reads a held-out byte", round, i);
  }
  dataset_destroy(d);
}

/* A token file: 900 ids of 300 (little-endian: 0x2c 0x01), then 100 of
 * 301, held out. */
static void test_u16_split(void **state) {
  (void)state;
  char path[128], err[256];
  snprintf(path, sizeof path, "%s/ids.bin", dir);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  for (int i = 0; i < 1000; i++) {
    fputc(i < 900 ? 0x2c : 0x2d, f);
    fputc(0x01, f);
  }
  fclose(f);
  dataset *d = dataset_u16(path, 16, 0, err, sizeof err);
  assert_non_null(d);
  assert_int_equal(dataset_vocab(d), 302);
  assert_int_equal(d->train_len, 900);
  assert_int_equal(d->heldout_start, 900);
  assert_int_equal(dataset_at(d, 899), 300);
  assert_int_equal(dataset_at(d, 900), 301);
  int32_t tokens[8 * 99], targets[8 * 99];
  for (int round = 0; round < 1000; round++) {
    dataset_batch(d, 8, 99, tokens, targets);
    for (int i = 0; i < 8 * 99; i++)
      if (tokens[i] != 300 || targets[i] != 300)
        fail_msg("round %d: position %d reads %d, %d", round, i, tokens[i],
                 targets[i]);
  }
  dataset_destroy(d);
}

/* With a held-out evaluation, the fields drop in the order peak, speed,
 * ETA, then the evaluation, as the width shrinks; the bar fills the rest. */
static void test_progress_eval(void **state) {
  (void)state;
  progress_fields f = {.step = 6, .steps = 20, .loss = 2.5f,
                       .tokens_per_s = 52100.0, .peak = "12.3 MiB",
                       .eta_s = 65, .evaluated = 1, .heldout_loss = 1.25,
                       .accuracy = 0.984};
  char line[160];
  progress_format(line, sizeof line, 120, &f);
  assert_string_equal(line, "step  6/20 [=========>                    ] "
                            "loss 2.5000 | val 1.2500 98.4% | 52.1k tok/s | "
                            "peak 12.3 MiB | ETA 1m05s");
  progress_format(line, sizeof line, 80, &f);
  assert_string_equal(line, "step  6/20 [==>      ] loss 2.5000 | val 1.2500 "
                            "98.4% | 52.1k tok/s | ETA 1m05s");
  progress_format(line, sizeof line, 60, &f);
  assert_string_equal(line, "step  6/20 [====>          ] loss 2.5000 | val "
                            "1.2500 98.4%");
  progress_format(line, sizeof line, 40, &f);
  assert_string_equal(line, "step  6/20 [====>         ] loss 2.5000");
  f.accuracy = -1.0; /* a file's data: no accuracy */
  progress_format(line, sizeof line, 60, &f);
  assert_string_equal(line, "step  6/20 [==>      ] loss 2.5000 | val 1.2500 "
                            "| ETA 1m05s");
}

static void test_json_numbers(void **state) {
  (void)state;
  json_nulls nulls = {0};
  json_text a, b, c, d;
  assert_string_equal(json_num(&nulls, &a, "loss", "%.6f", 0.5), "0.500000");
  assert_string_equal(json_nonfinite(&nulls), "");
  assert_string_equal(json_num(&nulls, &b, "loss", "%.6f", NAN), "null");
  assert_string_equal(json_num(&nulls, &c, "norm", "%.6g", -NAN), "null");
  assert_string_equal(json_num(&nulls, &d, "peak", "%.1f", -INFINITY),
                      "null");
  assert_string_equal(a.text, "0.500000"); /* each number keeps its text */
  assert_string_equal(json_nonfinite(&nulls),
                      ", \"nonfinite\": [\"loss\", \"norm\", \"peak\"]");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_and_seq_defaults),
      cmocka_unit_test(test_attention_option),
      cmocka_unit_test(test_text_split),
      cmocka_unit_test(test_u16_split),
      cmocka_unit_test(test_progress_eval),
      cmocka_unit_test(test_json_numbers),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
