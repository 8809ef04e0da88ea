/* Tests of training checkpoints (remat_save_checkpoint and
 * remat_load_checkpoint): N steps straight and k steps, a checkpoint, a
 * load into a disturbed graph and N - k more steps give byte-identical
 * checkpoints (AdamW and SGD, 1 and 2 threads); the file's layout; a
 * weights-only load of a checkpoint; and every failed load, with its exact
 * message, leaving the parameters, the moments, the step count and the
 * caller's values as they were; the values read without a graph
 * (remat_checkpoint_values). Also the token ids that remat_feed checks
 * before a step could read outside a table (which resuming data relies
 * on). */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpt_fixture.h"
#include "remat.h"
#include "tmpdir.h"

static const remat_gpt_config tiny = {
    .layers = 1, .d_model = 8, .heads = 2, .seq = 4, .batch = 2, .vocab = 7};

static char *path_in_dir(const char *name) {
  static char buf[8][160];
  static int next;
  char *p = buf[next++ % 8];
  snprintf(p, 160, "%s/%s", dir, name);
  return p;
}

static unsigned char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc(*len);
  assert_int_equal(fread(buf, 1, *len, f), *len);
  fclose(f);
  return buf;
}

static void write_all(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  fclose(f);
}

static bool contains(const unsigned char *buf, size_t len, const char *s) {
  return memmem(buf, len, s, strlen(s)) != NULL;
}

static void assert_same_file(const char *a, const char *b) {
  size_t na, nb;
  unsigned char *x = read_all(a, &na), *y = read_all(b, &nb);
  assert_int_equal(na, nb);
  assert_memory_equal(x, y, na);
  free(x);
  free(y);
}

/* Replaces the first `from` in the file by `to` (of the same length). */
static void patch_file(const char *src, const char *dst, const char *from,
                       const char *to) {
  size_t n;
  unsigned char *buf = read_all(src, &n);
  assert_int_equal(strlen(from), strlen(to));
  unsigned char *at = memmem(buf, n, from, strlen(from));
  assert_non_null(at);
  memcpy(at, to, strlen(to));
  write_all(dst, buf, n);
  free(buf);
}

static void open_fixture(fixture *f, remat_optimizer_kind kind, int threads) {
  remat_optimizer opt = {.kind = kind, .lr = 0.01f, .weight_decay = 0.1f};
  assert_int_equal(fixture_open(f, &tiny, threads, "nothing_saveable", 0, &opt), REMAT_OK);
}

/* Steps [from, to) of the run, on batch `step` each. */
static void train(fixture *f, int from, int to) {
  size_t n = (size_t)tiny.batch * tiny.seq;
  for (int step = from; step < to; step++) {
    fixture_batch(&tiny, f->tokens, f->targets, (uint32_t)step + 1);
    assert_int_equal(remat_feed(f->g, f->m.tokens, f->tokens,
                                n * sizeof *f->tokens), REMAT_OK);
    assert_int_equal(remat_feed(f->g, f->m.targets, f->targets,
                                n * sizeof *f->targets), REMAT_OK);
    assert_int_equal(remat_step(f->g, NULL), REMAT_OK);
  }
}

static const char *const keys[] = {"pos", "rng"};

static void save(fixture *f, const char *path, uint64_t pos) {
  uint64_t values[] = {pos, 0xfedcba9876543210ull};
  assert_int_equal(remat_save_checkpoint(f->g, path, keys, values, 2),
                   REMAT_OK);
}

static void resume_exact(remat_optimizer_kind kind, int threads) {
  fixture a, b, c;
  const char *straight = path_in_dir("straight.ckpt");
  const char *half = path_in_dir("half.ckpt");
  const char *resumed = path_in_dir("resumed.ckpt");
  open_fixture(&a, kind, threads);
  train(&a, 0, 5);
  save(&a, straight, 5);
  open_fixture(&b, kind, threads);
  train(&b, 0, 2);
  save(&b, half, 2);
  /* A graph with other weights, moments and step count than b's. */
  open_fixture(&c, kind, threads);
  train(&c, 7, 10);
  uint64_t values[2] = {0, 0};
  assert_int_equal(remat_load_checkpoint(c.g, half, keys, values, 2),
                   REMAT_OK);
  assert_int_equal(values[0], 2);
  assert_true(values[1] == 0xfedcba9876543210ull);
  train(&c, (int)values[0], 5);
  save(&c, resumed, 5);
  assert_same_file(straight, resumed);
  fixture_close(&a);
  fixture_close(&b);
  fixture_close(&c);
}

static void test_resume_adamw_1(void **state) {
  (void)state;
  resume_exact(REMAT_OPT_ADAMW, 1);
}

static void test_resume_adamw_2(void **state) {
  (void)state;
  resume_exact(REMAT_OPT_ADAMW, 2);
}

static void test_resume_sgd_1(void **state) {
  (void)state;
  resume_exact(REMAT_OPT_SGD, 1);
}

static void test_resume_sgd_2(void **state) {
  (void)state;
  resume_exact(REMAT_OPT_SGD, 2);
}

/* The header: remat's metadata, the caller's values as decimal strings,
 * AdamW's moments after the parameters (none with SGD). */
static void test_layout(void **state) {
  (void)state;
  fixture f, s;
  open_fixture(&f, REMAT_OPT_ADAMW, 1);
  train(&f, 0, 3);
  const char *path = path_in_dir("layout.ckpt");
  save(&f, path, 3);
  size_t len;
  unsigned char *file = read_all(path, &len);
  const char *want =
      "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"remat\","
      "\"remat.checkpoint\":\"1\",\"remat.optimizer\":\"adamw\","
      "\"remat.step\":\"3\",\"pos\":\"3\",\"rng\":\"18364758544493064720\"},"
      "\"wte\":{\"shape\":[7,8],\"data_offsets\":[0,224],\"dtype\":\"F32\"}";
  assert_memory_equal(file + 8, want, strlen(want));
  /* 1032 floats of parameters, then the first moments, then the second. */
  assert_true(contains(file, len, "\"adam_m:wte\":{\"shape\":[7,8],"
                       "\"data_offsets\":[4128,4352]"));
  assert_true(contains(file, len, "\"adam_v:wte\":{\"shape\":[7,8],"
                       "\"data_offsets\":[8256,8480]"));
  assert_int_equal(len, 8 + (size_t)(file[0] | file[1] << 8) + 3 * 4128);
  free(file);
  open_fixture(&s, REMAT_OPT_SGD, 1);
  save(&s, path, 0);
  file = read_all(path, &len);
  assert_true(contains(file, len, "\"remat.optimizer\":\"sgd\","
                       "\"remat.step\":\"0\""));
  assert_false(contains(file, len, "adam_"));
  free(file);
  fixture_close(&f);
  fixture_close(&s);
}

/* remat_load_safetensors takes the weights alone from a checkpoint, into
 * a graph with another optimizer. */
static void test_weights_only(void **state) {
  (void)state;
  fixture a, s;
  open_fixture(&a, REMAT_OPT_ADAMW, 1);
  train(&a, 0, 3);
  const char *ckpt = path_in_dir("w.ckpt");
  const char *wa = path_in_dir("wa.safetensors");
  const char *ws = path_in_dir("ws.safetensors");
  save(&a, ckpt, 3);
  open_fixture(&s, REMAT_OPT_SGD, 1);
  assert_int_equal(remat_load_safetensors(s.g, ckpt), REMAT_OK);
  assert_int_equal(remat_save_safetensors(a.g, wa), REMAT_OK);
  assert_int_equal(remat_save_safetensors(s.g, ws), REMAT_OK);
  assert_same_file(wa, ws);
  fixture_close(&a);
  fixture_close(&s);
}

/* Loads `path` into f, expecting `status` and `message`, and checks that
 * nothing changed: the same checkpoint before and after, and the values. */
static void expect_refused(fixture *f, const char *path, int count,
                           remat_status status, const char *message) {
  char before[160], after[160];
  snprintf(before, sizeof before, "%s/before.ckpt", dir);
  snprintf(after, sizeof after, "%s/after.ckpt", dir);
  static const char *const want_keys[] = {"pos", "rng", "other"};
  save(f, before, 9);
  uint64_t values[3] = {11, 12, 13};
  assert_int_equal(remat_load_checkpoint(f->g, path, want_keys, values, count),
                   status);
  assert_string_equal(remat_last_error(), message);
  assert_true(values[0] == 11 && values[1] == 12 && values[2] == 13);
  save(f, after, 9);
  assert_same_file(before, after);
}

static void test_failed_loads(void **state) {
  (void)state;
  fixture a, s;
  open_fixture(&a, REMAT_OPT_ADAMW, 1);
  open_fixture(&s, REMAT_OPT_SGD, 1);
  train(&a, 0, 2);
  train(&s, 0, 2);
  const char *good = path_in_dir("good.ckpt");
  const char *bad = path_in_dir("bad.ckpt");
  const char *weights = path_in_dir("weights.safetensors");
  const char *sgd = path_in_dir("sgd.ckpt");
  save(&a, good, 2);
  save(&s, sgd, 2);
  assert_int_equal(remat_save_safetensors(a.g, weights), REMAT_OK);
  train(&a, 2, 4);
  char want[512];
  snprintf(want, sizeof want, "remat_load_checkpoint: '%s' is not a training "
           "checkpoint (its __metadata__ has no 'remat.checkpoint'): "
           "remat_load_safetensors loads weights alone", weights);
  expect_refused(&a, weights, 2, REMAT_ERR_IO, want);
  snprintf(want, sizeof want, "remat_load_checkpoint: '%s': the checkpoint "
           "holds the state of optimizer 'sgd' but the graph was compiled "
           "with 'adamw': compile with the same optimizer, or load the "
           "weights alone with remat_load_safetensors", sgd);
  expect_refused(&a, sgd, 2, REMAT_ERR_SHAPE, want);
  snprintf(want, sizeof want, "remat_load_checkpoint: '%s': __metadata__ "
           "has no 'other'", good);
  expect_refused(&a, good, 3, REMAT_ERR_IO, want);
  patch_file(good, bad, "\"pos\":\"2\"", "\"pos\":\"x\"");
  snprintf(want, sizeof want, "remat_load_checkpoint: '%s': __metadata__ "
           "'pos' is not a whole number from 0 to 2^64-1 written as a "
           "string", bad);
  expect_refused(&a, bad, 2, REMAT_ERR_IO, want);
  patch_file(good, bad, "\"remat.step\":\"2\"", "\"remat.stop\":\"2\"");
  snprintf(want, sizeof want, "remat_load_checkpoint: '%s': __metadata__ "
           "has no 'remat.step'", bad);
  expect_refused(&a, bad, 2, REMAT_ERR_IO, want);
  patch_file(good, bad, "\"adam_v:wte\"", "\"adam_v:wtX\"");
  snprintf(want, sizeof want, "remat_load_checkpoint: '%s': tensor "
           "'adam_v:wtX' is not a parameter of the model or the optimizer "
           "state of one", bad);
  expect_refused(&a, bad, 2, REMAT_ERR_SHAPE, want);
  size_t n;
  unsigned char *buf = read_all(good, &n);
  write_all(bad, buf, n - 4);
  free(buf);
  snprintf(want, sizeof want, "remat_load_checkpoint: '%s': tensor "
           "'adam_v:lm_head' has data_offsets [", bad);
  assert_int_equal(remat_load_checkpoint(a.g, bad, keys, (uint64_t[2]){0}, 2),
                   REMAT_ERR_IO);
  assert_memory_equal(remat_last_error(), want, strlen(want));
  fixture_close(&a);
  fixture_close(&s);
}

/* remat_checkpoint_values reads a checkpoint's values without a graph:
 * found[i] says which keys are there; a bad value or a file that is not
 * safetensors fails and changes neither values nor found. */
static void test_values_without_graph(void **state) {
  (void)state;
  fixture a;
  open_fixture(&a, REMAT_OPT_ADAMW, 1);
  train(&a, 0, 1);
  const char *good = path_in_dir("values.ckpt");
  const char *bad = path_in_dir("values-bad.ckpt");
  const char *weights = path_in_dir("values.safetensors");
  save(&a, good, 7);
  assert_int_equal(remat_save_safetensors(a.g, weights), REMAT_OK);
  fixture_close(&a);
  const char *const asked[] = {"rng", "absent", "pos"};
  uint64_t v[3] = {1, 2, 3};
  int found[3] = {-1, -1, -1};
  assert_int_equal(remat_checkpoint_values(good, asked, v, found, 3),
                   REMAT_OK);
  assert_true(v[0] == 0xfedcba9876543210ull);
  assert_int_equal(v[1], 2); /* left alone */
  assert_int_equal(v[2], 7);
  assert_int_equal(found[0] * 100 + found[1] * 10 + found[2], 101);
  /* a weights file has none of them */
  assert_int_equal(remat_checkpoint_values(weights, asked, v, found, 3),
                   REMAT_OK);
  assert_int_equal(found[0] + found[1] + found[2], 0);
  found[0] = found[1] = found[2] = -1;
  patch_file(good, bad, "\"pos\":\"7\"", "\"pos\":\"-\"");
  char want[512];
  snprintf(want, sizeof want, "remat_checkpoint_values: '%s': __metadata__ "
           "'pos' is not a whole number from 0 to 2^64-1 written as a "
           "string", bad);
  assert_int_equal(remat_checkpoint_values(bad, asked, v, found, 3),
                   REMAT_ERR_IO);
  assert_string_equal(remat_last_error(), want);
  assert_int_equal(found[0] + found[1] + found[2], -3);
  assert_int_equal(v[2], 7);
  write_all(bad, "not a safetensors file", 22);
  assert_int_equal(remat_checkpoint_values(bad, asked, v, found, 3),
                   REMAT_ERR_IO);
  assert_int_equal(found[0] + found[1] + found[2], -3);
  assert_int_equal(remat_checkpoint_values(good, asked, v, NULL, 3),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(), "remat_checkpoint_values: found "
                      "must not be NULL when count > 0");
}

static void test_bad_arguments(void **state) {
  (void)state;
  fixture f;
  open_fixture(&f, REMAT_OPT_ADAMW, 1);
  const char *path = path_in_dir("args.ckpt");
  uint64_t v[2] = {1, 2};
  const char *bad_keys[][2] = {{"a b", "x"}, {"remat.step", "x"},
                               {"format", "x"}, {"", "x"}};
  for (int i = 0; i < 4; i++) {
    char want[256];
    snprintf(want, sizeof want, "remat_save_checkpoint: key 0 ('%s') must be "
             "1 to 63 letters, digits, '_', '.' or '-', and not 'format', "
             "'producer' or 'remat.*'", bad_keys[i][0]);
    assert_int_equal(remat_save_checkpoint(f.g, path, bad_keys[i], v, 2),
                     REMAT_ERR_INVALID_ARG);
    assert_string_equal(remat_last_error(), want);
  }
  /* a caller's key reaches the message quoted, on one line */
  const char *control[] = {"a\nb\x7f"};
  assert_int_equal(remat_save_checkpoint(f.g, path, control, v, 1),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_save_checkpoint: key 0 ('a\\x0Ab\\x7F') must be "
                      "1 to 63 letters, digits, '_', '.' or '-', and not "
                      "'format', 'producer' or 'remat.*'");
  const char *twice[] = {"a", "a"};
  assert_int_equal(remat_load_checkpoint(f.g, path, twice, v, 2),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_load_checkpoint: key 'a' is given twice");
  assert_int_equal(remat_save_checkpoint(f.g, path, keys, v, 65),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_save_checkpoint: count is 65: expected 0 to 64");
  assert_int_equal(remat_save_checkpoint(f.g, path, NULL, v, 1),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_save_checkpoint: keys and values must not be "
                      "NULL when count > 0");
  assert_int_equal(remat_save_checkpoint(NULL, path, NULL, NULL, 0),
                   REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_save_checkpoint: graph and path must not be "
                      "NULL");
  assert_int_equal(remat_load_checkpoint(f.g, path, keys, v, 2),
                   REMAT_ERR_IO);
  fixture_close(&f);
}

/* A token or target id outside the vocabulary is refused by remat_feed,
 * naming the id, its position and the vocabulary; the input keeps its
 * previous value, so the next step runs on it. */
static void test_feed_ids(void **state) {
  (void)state;
  fixture f;
  open_fixture(&f, REMAT_OPT_SGD, 1);
  size_t n = (size_t)tiny.batch * tiny.seq, bytes = n * sizeof(int32_t);
  int32_t ids[8];
  for (int bad = 0; bad < 3; bad++) {
    memcpy(ids, f.tokens, bytes);
    ids[5] = bad == 0 ? 7 : bad == 1 ? -1 : 1 << 30;
    char want[256];
    snprintf(want, sizeof want, "remat_feed: '%s' holds id %d at position "
             "5, outside the vocabulary of 7 (ids 0 to 6)",
             bad == 2 ? "targets" : "tokens", ids[5]);
    remat_tensor *input = bad == 2 ? f.m.targets : f.m.tokens;
    assert_int_equal(remat_feed(f.g, input, ids, bytes),
                     REMAT_ERR_INVALID_ARG);
    assert_string_equal(remat_last_error(), want);
  }
  int32_t now[8];
  assert_int_equal(remat_read(f.g, f.m.tokens, now, bytes), REMAT_OK);
  assert_memory_equal(now, f.tokens, bytes);
  ids[5] = 6; /* the last id of the vocabulary */
  assert_int_equal(remat_feed(f.g, f.m.tokens, ids, bytes), REMAT_OK);
  assert_int_equal(remat_step(f.g, NULL), REMAT_OK);
  fixture_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resume_adamw_1),
      cmocka_unit_test(test_resume_adamw_2),
      cmocka_unit_test(test_resume_sgd_1),
      cmocka_unit_test(test_resume_sgd_2),
      cmocka_unit_test(test_layout),
      cmocka_unit_test(test_weights_only),
      cmocka_unit_test(test_failed_loads),
      cmocka_unit_test(test_values_without_graph),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_feed_ids),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
