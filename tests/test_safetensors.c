/* Tests of saving and loading parameters as safetensors: a round trip, the
 * file layout, and every corrupt-file case with its exact message, each
 * leaving the parameters untouched. */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpt_fixture.h"
#include "remat.h"
#include "tmpdir.h"

/* 1 layer, D 8, 2 heads, T 4, V 7: 1032 floats, lm_head last at bytes
 * [3904, 4128) of the data. */
static const remat_gpt_config tiny = {
    .layers = 1, .d_model = 8, .heads = 2, .seq = 4, .batch = 1, .vocab = 7};

typedef struct model {
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
} model;


static void open_model(model *md, uint64_t seed) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  assert_int_equal(remat_runtime_create(&rc, &md->rt), REMAT_OK);
  assert_int_equal(remat_graph_create(md->rt, &md->g), REMAT_OK);
  assert_int_equal(remat_graph_seed(md->g, seed), REMAT_OK);
  assert_int_equal(remat_gpt_build(md->g, &tiny, &md->m), REMAT_OK);
  assert_int_equal(remat_compile(md->g, md->m.loss, NULL), REMAT_OK);
}

static void close_model(model *md) {
  remat_graph_destroy(md->g);
  remat_runtime_destroy(md->rt);
}


static char *path_in_dir(const char *name) {
  static char buf[4][128];
  static int next;
  char *p = buf[next++ % 4];
  snprintf(p, 128, "%s/%s", dir, name);
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

static void write_all(const char *path, const void *a, size_t alen,
                      const void *b, size_t blen) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(a, 1, alen, f), alen);
  if (blen > 0)
    assert_int_equal(fwrite(b, 1, blen, f), blen);
  fclose(f);
}

static void test_round_trip(void **state) {
  (void)state;
  model a, b;
  open_model(&a, 11);
  open_model(&b, 22);
  size_t na, nb;
  float *wa = fixture_snapshot(a.g, &na), *wb = fixture_snapshot(b.g, &nb);
  assert_int_equal(na, 1032);
  assert_true(memcmp(wa, wb, na * sizeof *wa) != 0);
  const char *path = path_in_dir("model.safetensors");
  assert_int_equal(remat_save_safetensors(a.g, path), REMAT_OK);
  assert_int_equal(access(path_in_dir("model.safetensors.tmp"), F_OK), -1);
  assert_int_equal(remat_load_safetensors(b.g, path), REMAT_OK);
  free(wb);
  wb = fixture_snapshot(b.g, &nb);
  assert_memory_equal(wa, wb, na * sizeof *wa);
  /* Layout: header length, JSON padded to 8 bytes, then the data. */
  size_t len;
  unsigned char *file = read_all(path, &len);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++)
    hlen |= (uint64_t)file[i] << (8 * i);
  assert_int_equal(hlen % 8, 0);
  assert_int_equal(len, 8 + hlen + 4128);
  assert_memory_equal(file + 8 + hlen, wa, na * sizeof *wa);
  cJSON *root = cJSON_ParseWithLength((const char *)file + 8, hlen);
  assert_non_null(root);
  cJSON *head = cJSON_GetObjectItemCaseSensitive(root, "lm_head");
  assert_string_equal(
      cJSON_GetObjectItemCaseSensitive(head, "dtype")->valuestring, "F32");
  cJSON *offs = cJSON_GetObjectItemCaseSensitive(head, "data_offsets");
  assert_int_equal(cJSON_GetArrayItem(offs, 0)->valueint, 3904);
  assert_int_equal(cJSON_GetArrayItem(offs, 1)->valueint, 4128);
  cJSON_Delete(root);
  free(file);
  free(wa);
  free(wb);
  close_model(&a);
  close_model(&b);
}

/* ---- corrupt files ---- */

typedef void (*mutate_fn)(cJSON *root);

/* Rewrites the valid file `good` with its header changed by `mutate` and
 * its data cut by `cut` bytes. */
static void corrupt(const char *good, const char *bad, mutate_fn mutate,
                    size_t cut) {
  size_t len;
  unsigned char *file = read_all(good, &len);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++)
    hlen |= (uint64_t)file[i] << (8 * i);
  cJSON *root = cJSON_ParseWithLength((const char *)file + 8, hlen);
  if (mutate != NULL)
    mutate(root);
  char *json = cJSON_PrintUnformatted(root);
  size_t jlen = strlen(json);
  unsigned char *out = malloc(8 + jlen);
  for (int i = 0; i < 8; i++)
    out[i] = (unsigned char)((uint64_t)jlen >> (8 * i));
  memcpy(out + 8, json, jlen);
  write_all(bad, out, 8 + jlen, file + 8 + hlen, len - 8 - hlen - cut);
  free(out);
  cJSON_free(json);
  cJSON_Delete(root);
  free(file);
}

static void set_dtype_f16(cJSON *root) {
  cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "wte");
  cJSON_ReplaceItemInObjectCaseSensitive(e, "dtype", cJSON_CreateString("F16"));
}
static void drop_head(cJSON *root) {
  cJSON_DeleteItemFromObjectCaseSensitive(root, "lm_head");
}
static void grow_wte(cJSON *root) {
  cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "wte");
  cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
  cJSON_ReplaceItemInArray(shape, 0, cJSON_CreateNumber(8));
}
static void overlap(cJSON *root) {
  /* lnf.gamma [8] moved onto the first 32 bytes of wte */
  cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "lnf.gamma");
  cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  cJSON_ReplaceItemInArray(offs, 0, cJSON_CreateNumber(0));
  cJSON_ReplaceItemInArray(offs, 1, cJSON_CreateNumber(32));
}
static void wrong_size(cJSON *root) {
  cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "wpe");
  cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  cJSON_ReplaceItemInArray(offs, 1, cJSON_CreateNumber(300));
}
static void extra_tensor(cJSON *root) {
  cJSON *e = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(root, "wpe"), 1);
  cJSON_AddItemToObject(root, "h7.ln1.gamma", e);
}

typedef struct bad_case {
  const char *file;
  remat_status status;
  const char *message; /* after "remat_load_safetensors: 'PATH': " */
} bad_case;

static void expect_load_error(model *md, const float *before, size_t n,
                              const bad_case *c) {
  const char *path = path_in_dir(c->file);
  assert_int_equal(remat_load_safetensors(md->g, path), c->status);
  char want[512];
  snprintf(want, sizeof want, "remat_load_safetensors: '%s': %s", path,
           c->message);
  assert_string_equal(remat_last_error(), want);
  size_t m;
  float *after = fixture_snapshot(md->g, &m);
  assert_int_equal(m, n);
  assert_memory_equal(after, before, n * sizeof *after);
  free(after);
}

static void test_corrupt_files(void **state) {
  (void)state;
  model src, md;
  open_model(&src, 5);
  open_model(&md, 6);
  char good[128];
  snprintf(good, sizeof good, "%s", path_in_dir("good.safetensors"));
  assert_int_equal(remat_save_safetensors(src.g, good), REMAT_OK);
  write_all(path_in_dir("short"), "\x10\0\0\0\0", 5, NULL, 0);
  write_all(path_in_dir("hlen"), "\xe8\x03\0\0\0\0\0\0{\"a\":1}", 15, NULL, 0);
  write_all(path_in_dir("json"), "\x08\0\0\0\0\0\0\0{\"wte\":[", 16, NULL, 0);
  corrupt(good, path_in_dir("dtype"), set_dtype_f16, 0);
  corrupt(good, path_in_dir("missing"), drop_head, 0);
  corrupt(good, path_in_dir("shape"), grow_wte, 0);
  corrupt(good, path_in_dir("truncated"), NULL, 4);
  corrupt(good, path_in_dir("overlap"), overlap, 0);
  corrupt(good, path_in_dir("size"), wrong_size, 0);
  corrupt(good, path_in_dir("extra"), extra_tensor, 0);
  size_t n;
  float *before = fixture_snapshot(md.g, &n);
  static const bad_case cases[] = {
      {"short", REMAT_ERR_IO,
       "truncated: 5 bytes, shorter than the 8-byte header length"},
      {"hlen", REMAT_ERR_IO,
       "header length 1000 exceeds the 7 bytes after it (truncated or not a "
       "safetensors file)"},
      {"json", REMAT_ERR_IO, "the header is not a JSON object"},
      {"dtype", REMAT_ERR_SHAPE, "tensor 'wte' has dtype F16, expected F32"},
      {"missing", REMAT_ERR_SHAPE,
       "the model's tensor 'lm_head' is missing from the file"},
      {"shape", REMAT_ERR_SHAPE,
       "tensor 'wte' has shape [8,8] in the file but [7,8] in the model"},
      {"truncated", REMAT_ERR_IO,
       "tensor 'lm_head' has data_offsets [3904,4128] beyond the 4124 bytes "
       "of data (truncated file?)"},
      {"overlap", REMAT_ERR_IO, "tensors 'lnf.gamma' and 'wte' overlap in the "
                                "data"},
      {"size", REMAT_ERR_IO,
       "tensor 'wpe' has data_offsets [224,300] (76 bytes) but its F32 shape "
       "needs 128 bytes"},
      {"extra", REMAT_ERR_SHAPE,
       "tensor 'h7.ln1.gamma' is not a parameter of the model"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_load_error(&md, before, n, &cases[i]);
  const char *none = path_in_dir("none");
  char want[256];
  snprintf(want, sizeof want,
           "remat_load_safetensors: cannot open '%s': No such file or "
           "directory", none);
  assert_int_equal(remat_load_safetensors(md.g, none), REMAT_ERR_IO);
  assert_string_equal(remat_last_error(), want);
  free(before);
  close_model(&src);
  close_model(&md);
}

static void test_not_compiled(void **state) {
  (void)state;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  remat_runtime *rt;
  remat_graph *g;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_save_safetensors(g, path_in_dir("x")), REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_save_safetensors: the graph is not compiled: "
                      "call remat_compile first");
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_corrupt_files),
      cmocka_unit_test(test_not_compiled),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
