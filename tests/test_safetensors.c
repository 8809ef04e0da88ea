/* Tests of saving and loading parameters as safetensors: a round trip, the
 * file layout, saves that never follow a planted link, never write a
 * special file, never leave a mixed or half-written file (even with two
 * processes saving at once), and every corrupt-file case with its exact
 * message, each leaving the parameters untouched and costing no more
 * memory than the header. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
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


static remat_status open_config(model *md, uint64_t seed,
                                const remat_gpt_config *cfg) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  remat_status s = remat_runtime_create(&rc, &md->rt);
  if (s == REMAT_OK)
    s = remat_graph_create(md->rt, &md->g);
  if (s == REMAT_OK)
    s = remat_graph_seed(md->g, seed);
  if (s == REMAT_OK)
    s = remat_gpt_build(md->g, cfg, &md->m);
  if (s == REMAT_OK)
    s = remat_compile(md->g, md->m.loss, NULL);
  return s;
}

static void open_model(model *md, uint64_t seed) {
  assert_int_equal(open_config(md, seed, &tiny), REMAT_OK);
}

static void close_model(model *md) {
  remat_graph_destroy(md->g);
  remat_runtime_destroy(md->rt);
}


static char *path_in_dir(const char *name) {
  static char buf[8][160];
  static int next;
  char *p = buf[next++ % 8];
  snprintf(p, 160, "%s/%s", dir, name);
  return p;
}

/* A new empty directory under the scratch directory. */
static char *subdir(const char *name) {
  char *p = path_in_dir(name);
  assert_int_equal(mkdir(p, 0755), 0);
  return p;
}

/* The names in a directory other than . and .., sorted, joined by ' '. */
static void list_dir(const char *path, char *out, size_t len) {
  DIR *d = opendir(path);
  assert_non_null(d);
  char names[16][80];
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
      assert_true(n < 16);
      assert_true(snprintf(names[n++], sizeof names[0], "%s", e->d_name) <
                  (int)sizeof names[0]);
    }
  closedir(d);
  qsort(names, (size_t)n, sizeof names[0],
        (int (*)(const void *, const void *))strcmp);
  out[0] = '\0';
  for (int i = 0, used = 0; i < n; i++) {
    used += snprintf(out + used, len - (size_t)used, "%s%s", i ? " " : "",
                     names[i]);
    assert_true((size_t)used < len);
  }
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
  char path[192], names[256];
  snprintf(path, sizeof path, "%s/model.safetensors", subdir("round_trip"));
  /* A new file's mode is 0644 less the umask; no temporary file is left. */
  mode_t old_mask = umask(077);
  assert_int_equal(remat_save_safetensors(a.g, path), REMAT_OK);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  umask(022);
  assert_int_equal(remat_save_safetensors(a.g, path), REMAT_OK);
  umask(old_mask);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0644);
  list_dir(path_in_dir("round_trip"), names, sizeof names);
  assert_string_equal(names, "model.safetensors");
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
static void set_wte_offsets(cJSON *root, double begin, double end) {
  cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "wte");
  cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  cJSON_ReplaceItemInArray(offs, 0, cJSON_CreateNumber(begin));
  cJSON_ReplaceItemInArray(offs, 1, cJSON_CreateNumber(end));
}
static void huge_offset(cJSON *root) {
  set_wte_offsets(root, 0, 4611686018427387904.0); /* 2^62 */
}
static void negative_offset(cJSON *root) { set_wte_offsets(root, -8, 216); }
static void fractional_offset(cJSON *root) { set_wte_offsets(root, 0.5, 224); }
static void duplicate_name(cJSON *root) {
  cJSON *e = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(root, "wpe"), 1);
  cJSON_AddItemToObject(root, "wpe", e); /* a second key "wpe" */
}
/* Names and dtypes from the file reach messages on one line. */
static void control_bytes(cJSON *root) {
  cJSON *e = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(root, "wpe"), 1);
  cJSON_AddItemToObject(root, "a\nb\x7f", e);
}
static void long_name(cJSON *root) {
  char name[131];
  memset(name, 'x', 130);
  name[130] = '\0';
  cJSON *e = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(root, "wpe"), 1);
  cJSON_AddItemToObject(root, name, e);
}
static void control_dtype(cJSON *root) {
  cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "wte");
  cJSON_ReplaceItemInObjectCaseSensitive(e, "dtype",
                                         cJSON_CreateString("F1\n6"));
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

static unsigned long long file_size(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return (unsigned long long)st.st_size;
}

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

/* data_offsets out of range name the values and the file's size. */
static void expect_out_of_range(model *md, const float *before, size_t n,
                                const char *file, const char *tensor,
                                const char *offsets,
                                unsigned long long data) {
  char msg[256];
  snprintf(msg, sizeof msg,
           "tensor '%s' has data_offsets %s out of range: the %llu-byte file "
           "has %llu bytes of data after its header",
           tensor, offsets, file_size(path_in_dir(file)), data);
  bad_case c = {file, REMAT_ERR_IO, msg};
  expect_load_error(md, before, n, &c);
}

/* The corrupt files of test_corrupt_files, from the valid file `good`. */
static void make_corrupt_files(const char *good) {
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
  corrupt(good, path_in_dir("twice"), duplicate_name, 0);
  corrupt(good, path_in_dir("fraction"), fractional_offset, 0);
  corrupt(good, path_in_dir("control"), control_bytes, 0);
  corrupt(good, path_in_dir("long"), long_name, 0);
  corrupt(good, path_in_dir("control_dtype"), control_dtype, 0);
  corrupt(good, path_in_dir("huge"), huge_offset, 0);
  corrupt(good, path_in_dir("negative"), negative_offset, 0);
}

static void test_corrupt_files(void **state) {
  (void)state;
  model src, md;
  open_model(&src, 5);
  open_model(&md, 6);
  char good[128];
  snprintf(good, sizeof good, "%s", path_in_dir("good.safetensors"));
  assert_int_equal(remat_save_safetensors(src.g, good), REMAT_OK);
  make_corrupt_files(good);
  size_t n;
  float *before = fixture_snapshot(md.g, &n);
  static const bad_case cases[] = {
      {"short", REMAT_ERR_IO,
       "truncated: 5 bytes, shorter than the 8-byte header length"},
      {"hlen", REMAT_ERR_IO,
       "header length 1000 exceeds the 7 bytes after it (truncated or not a "
       "safetensors file)"},
      {"json", REMAT_ERR_IO, "the header is not a JSON object"},
      {"dtype", REMAT_ERR_IO,
       "tensor 'wte' has data_offsets [0,224] (224 bytes) but its F16 shape "
       "needs 112 bytes"},
      {"missing", REMAT_ERR_SHAPE,
       "the model's tensor 'lm_head' is missing from the file"},
      {"shape", REMAT_ERR_SHAPE,
       "tensor 'wte' has shape [8,8] in the file but [7,8] in the model"},
      {"overlap", REMAT_ERR_IO, "tensors 'lnf.gamma' and 'wte' overlap in the "
                                "data"},
      {"size", REMAT_ERR_IO,
       "tensor 'wpe' has data_offsets [224,300] (76 bytes) but its F32 shape "
       "needs 128 bytes"},
      {"extra", REMAT_ERR_SHAPE,
       "tensor 'h7.ln1.gamma' is not a parameter of the model"},
      {"twice", REMAT_ERR_IO, "tensor 'wpe' appears twice"},
      {"fraction", REMAT_ERR_IO,
       "tensor 'wte' has data_offsets that are not whole numbers"},
      {"control", REMAT_ERR_SHAPE,
       "tensor 'a\\x0Ab\\x7F' is not a parameter of the model"},
      {"long", REMAT_ERR_SHAPE,
       "tensor 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
       "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...' is not a "
       "parameter of the model"},
      {"control_dtype", REMAT_ERR_SHAPE,
       "tensor 'wte' has dtype F1\\x0A6: a load takes F32, BF16 and F16"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_load_error(&md, before, n, &cases[i]);
  expect_out_of_range(&md, before, n, "truncated", "lm_head", "[3904,4128]",
                      4124);
  expect_out_of_range(&md, before, n, "huge", "wte",
                      "[0,4611686018427387904]", 4128);
  expect_out_of_range(&md, before, n, "negative", "wte", "[-8,216]", 4128);
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

/* ---- files that are not what a load or save expects ---- */

static long max_rss_kib(void) {
  struct rusage ru;
  assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
  return ru.ru_maxrss;
}

/* A sparse file of `size` bytes that starts with `head`. */
static void sparse_file(const char *path, const void *head, size_t len,
                        off_t size) {
  write_all(path, head, len, NULL, 0);
  assert_int_equal(truncate(path, size), 0);
}

static void expect_message(remat_status got, remat_status status,
                           const char *message) {
  assert_int_equal(got, status);
  assert_string_equal(remat_last_error(), message);
}

/* A 3 GB file costs a load no more memory than its header: a junk header
 * fails after one chunk, a header over the cap before it is read, and a
 * valid header reads only the tensors' bytes. Runs first, while the
 * process's peak RSS is its current one. */
static void test_sparse_files(void **state) {
  (void)state;
  model src, md;
  open_model(&src, 5);
  open_model(&md, 6);
  const off_t three_gb = (off_t)3 << 30;
  size_t n;
  float *before = fixture_snapshot(md.g, &n);
  long rss = max_rss_kib();
  char path[192], want[512];
  snprintf(path, sizeof path, "%s", path_in_dir("junk3g"));
  sparse_file(path, "\x10\0\0\0\0\0\0\0junk junk junk! ", 24, three_gb);
  snprintf(want, sizeof want, "remat_load_safetensors: '%s': the header is "
           "not a JSON object", path);
  expect_message(remat_load_safetensors(md.g, path), REMAT_ERR_IO, want);
  /* 50 MiB of header that is '{' and then NUL bytes */
  sparse_file(path, "\0\0\x20\x03\0\0\0\0{", 9, three_gb);
  expect_message(remat_load_safetensors(md.g, path), REMAT_ERR_IO, want);
  sparse_file(path, "\0\0\0\x80\0\0\0\0", 8, three_gb);
  snprintf(want, sizeof want, "remat_load_safetensors: '%s': header length "
           "2147483648 exceeds the 104857600-byte (100 MiB) limit on "
           "safetensors headers", path);
  expect_message(remat_load_safetensors(md.g, path), REMAT_ERR_IO, want);
  size_t m;
  float *after = fixture_snapshot(md.g, &m);
  assert_memory_equal(after, before, n * sizeof *after);
  free(after);
  assert_int_equal(remat_save_safetensors(src.g, path), REMAT_OK);
  assert_int_equal(truncate(path, three_gb), 0);
  assert_int_equal(remat_load_safetensors(md.g, path), REMAT_OK);
  long grown = max_rss_kib() - rss;
  print_message("peak RSS grew by %ld KiB over four loads of 3 GB files\n",
                grown);
  assert_true(grown < 2048);
  free(before);
  before = fixture_snapshot(src.g, &n);
  after = fixture_snapshot(md.g, &m);
  assert_memory_equal(after, before, n * sizeof *after);
  free(before);
  free(after);
  assert_int_equal(unlink(path), 0);
  close_model(&src);
  close_model(&md);
}

static void test_header_cap(void **state) {
  (void)state;
  model md;
  open_model(&md, 6);
  /* 100 MiB + 8 of header, all of it present: over the cap, not the file */
  const char *path = path_in_dir("cap");
  sparse_file(path, "\x08\0\x40\x06\0\0\0\0", 8, 8 + (100 << 20) + 8);
  char want[512];
  snprintf(want, sizeof want, "remat_load_safetensors: '%s': header length "
           "104857608 exceeds the 104857600-byte (100 MiB) limit on "
           "safetensors headers", path);
  expect_message(remat_load_safetensors(md.g, path), REMAT_ERR_IO, want);
  assert_int_equal(unlink(path), 0);
  close_model(&md);
}

static void test_special_files(void **state) {
  (void)state;
  model md;
  open_model(&md, 6);
  const char *fifo = path_in_dir("fifo"), *sub = subdir("special");
  assert_int_equal(mkfifo(fifo, 0644), 0);
  char want[512];
  expect_message(remat_load_safetensors(md.g, "/dev/zero"), REMAT_ERR_IO,
                 "remat_load_safetensors: '/dev/zero' is a character device, "
                 "not a regular file");
  snprintf(want, sizeof want, "remat_load_safetensors: '%s' is a FIFO, not "
           "a regular file", fifo);
  expect_message(remat_load_safetensors(md.g, fifo), REMAT_ERR_IO, want);
  snprintf(want, sizeof want, "remat_load_safetensors: '%s' is a directory, "
           "not a regular file", sub);
  expect_message(remat_load_safetensors(md.g, sub), REMAT_ERR_IO, want);
  expect_message(remat_save_safetensors(md.g, "/dev/full"), REMAT_ERR_IO,
                 "remat_save_safetensors: '/dev/full' is a character device: "
                 "the target must be a regular file or a new name");
  snprintf(want, sizeof want, "remat_save_safetensors: '%s' is a FIFO: the "
           "target must be a regular file or a new name", fifo);
  expect_message(remat_save_safetensors(md.g, fifo), REMAT_ERR_IO, want);
  snprintf(want, sizeof want, "remat_save_grads_safetensors: '%s' is a "
           "directory: the target must be a regular file or a new name", sub);
  expect_message(remat_save_grads_safetensors(md.g, sub), REMAT_ERR_IO, want);
  char names[256];
  list_dir(sub, names, sizeof names);
  assert_string_equal(names, "");
  assert_int_equal(unlink(fifo), 0);
  close_model(&md);
}

/* ---- saves ---- */

static void expect_content(const char *path, const char *text) {
  size_t len;
  unsigned char *got = read_all(path, &len);
  assert_int_equal(len, strlen(text));
  assert_memory_equal(got, text, len);
  free(got);
}

/* Links planted where a save writes are never followed: not at the name
 * the old code used (PATH.tmp), not at the target itself. */
static void test_save_never_follows(void **state) {
  (void)state;
  model md;
  open_model(&md, 5);
  const char *sub = subdir("links");
  char victim[192], target[192], planted[200], dangling[200], made[192];
  snprintf(victim, sizeof victim, "%s/victim", sub);
  snprintf(target, sizeof target, "%s/model.safetensors", sub);
  snprintf(planted, sizeof planted, "%s.tmp", target);
  snprintf(made, sizeof made, "%s/made", sub);
  snprintf(dangling, sizeof dangling, "%s/other.safetensors.tmp", sub);
  write_all(victim, "precious", 8, NULL, 0);
  assert_int_equal(symlink(victim, planted), 0);
  assert_int_equal(symlink(made, dangling), 0);
  assert_int_equal(remat_save_safetensors(md.g, target), REMAT_OK);
  snprintf(made + strlen(sub), sizeof made - strlen(sub),
           "/other.safetensors");
  assert_int_equal(remat_save_safetensors(md.g, made), REMAT_OK);
  expect_content(victim, "precious");
  char link[192];
  ssize_t len = readlink(planted, link, sizeof link - 1);
  assert_int_equal(len, (ssize_t)strlen(victim));
  assert_memory_equal(link, victim, strlen(victim));
  assert_int_equal(remat_load_safetensors(md.g, target), REMAT_OK);
  /* A link as the target is refused, its file untouched. */
  char linked[192], want[512], names[256];
  snprintf(linked, sizeof linked, "%s/linked.safetensors", sub);
  assert_int_equal(symlink(victim, linked), 0);
  snprintf(want, sizeof want, "remat_save_safetensors: '%s' is a symbolic "
           "link: the target must be a regular file or a new name", linked);
  expect_message(remat_save_safetensors(md.g, linked), REMAT_ERR_IO, want);
  expect_content(victim, "precious");
  list_dir(sub, names, sizeof names);
  assert_string_equal(names, "linked.safetensors model.safetensors "
                             "model.safetensors.tmp other.safetensors "
                             "other.safetensors.tmp victim");
  close_model(&md);
}

/* A save that fails leaves the old file as it was and no temporary file. */
static void test_failed_save(void **state) {
  (void)state;
  model a, b;
  open_model(&a, 5);
  open_model(&b, 6);
  const char *sub = subdir("failed");
  char target[192], want[512], names[256];
  snprintf(target, sizeof target, "%s/model.safetensors", sub);
  assert_int_equal(remat_save_safetensors(a.g, target), REMAT_OK);
  size_t len, len2;
  unsigned char *old = read_all(target, &len);
  /* Files may not grow past 2000 bytes: the write fails part way. */
  struct rlimit saved, small;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
  small = saved;
  small.rlim_cur = 2000;
  void (*handler)(int) = signal(SIGXFSZ, SIG_IGN);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
  remat_status s = remat_save_safetensors(b.g, target);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, handler);
  snprintf(want, sizeof want, "remat_save_safetensors: cannot write '%s': "
           "File too large", target);
  expect_message(s, REMAT_ERR_IO, want);
  unsigned char *now = read_all(target, &len2);
  assert_int_equal(len2, len);
  assert_memory_equal(now, old, len);
  list_dir(sub, names, sizeof names);
  assert_string_equal(names, "model.safetensors");
  char missing[224];
  snprintf(missing, sizeof missing, "%s/none/model.safetensors", sub);
  snprintf(want, sizeof want, "remat_save_safetensors: cannot create a "
           "temporary file beside '%s': No such file or directory", missing);
  expect_message(remat_save_safetensors(b.g, missing), REMAT_ERR_IO, want);
  snprintf(missing, sizeof missing, "%s/x", target);
  snprintf(want, sizeof want, "remat_save_safetensors: cannot save to '%s': "
           "Not a directory", missing);
  expect_message(remat_save_safetensors(b.g, missing), REMAT_ERR_IO, want);
  free(old);
  free(now);
  close_model(&a);
  close_model(&b);
}

/* A graph whose parameter names repeat (here renamed after compile, past
 * any check at building time) would write a file that no load accepts:
 * the save refuses it before creating anything. */
static void test_save_duplicate_names(void **state) {
  (void)state;
  model md;
  open_model(&md, 5);
  char *name = (char *)remat_tensor_name(remat_param_at(md.g, 1));
  char kept[64];
  snprintf(kept, sizeof kept, "%s", name);
  snprintf(name, 64, "%s", remat_tensor_name(remat_param_at(md.g, 0)));
  const char *path = path_in_dir("duplicate.safetensors");
  expect_message(remat_save_safetensors(md.g, path), REMAT_ERR_INVALID_ARG,
                 "remat_save_safetensors: parameter name 'wte' is used by "
                 "more than one parameter, so the file could not be loaded: "
                 "give each parameter its own name (remat_checkpoint_name "
                 "renames a parameter)");
  assert_int_equal(access(path, F_OK), -1);
  snprintf(name, 64, "__metadata__");
  expect_message(remat_save_safetensors(md.g, path), REMAT_ERR_INVALID_ARG,
                 "remat_save_safetensors: parameter name '__metadata__' is "
                 "reserved by the safetensors format: rename the parameter");
  assert_int_equal(access(path, F_OK), -1);
  snprintf(name, 64, "%s", kept);
  assert_int_equal(remat_save_safetensors(md.g, path), REMAT_OK);
  close_model(&md);
}

/* ---- two processes saving to one path ---- */

enum { WRITER_SAVES = 50, SEED_A = 101, SEED_B = 102 };

/* 1.8 MB of parameters: long enough to write that two saves overlap. */
static const remat_gpt_config wide = {
    .layers = 2, .d_model = 128, .heads = 4, .seq = 16, .batch = 1,
    .vocab = 256};

/* The writer process (this program run with --writer SEED PATH). */
static int writer_main(const char *seed, const char *path) {
  model md;
  if (open_config(&md, strtoull(seed, NULL, 10), &wide) != REMAT_OK)
    return 1;
  for (int i = 0; i < WRITER_SAVES; i++)
    if (remat_save_safetensors(md.g, path) != REMAT_OK) {
      fprintf(stderr, "writer %s: %s\n", seed, remat_last_error());
      return 1;
    }
  close_model(&md);
  return 0;
}

static pid_t spawn_writer(const char *seed, const char *path) {
  char *argv[] = {"test_safetensors", "--writer", (char *)seed, (char *)path,
                  NULL};
  pid_t pid;
  assert_int_equal(
      posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, NULL), 0);
  return pid;
}

/* Two writers save different models to one path while this process loads
 * it: every load is all of one writer's model. */
static void test_concurrent_saves(void **state) {
  (void)state;
  model a, b, md;
  assert_int_equal(open_config(&a, SEED_A, &wide), REMAT_OK);
  assert_int_equal(open_config(&b, SEED_B, &wide), REMAT_OK);
  assert_int_equal(open_config(&md, 7, &wide), REMAT_OK);
  size_t n, m;
  float *wa = fixture_snapshot(a.g, &n), *wb = fixture_snapshot(b.g, &m);
  assert_true(memcmp(wa, wb, n * sizeof *wa) != 0);
  char path[192], want[512];
  snprintf(path, sizeof path, "%s/shared.safetensors", subdir("shared"));
  snprintf(want, sizeof want, "remat_load_safetensors: cannot open '%s': No "
           "such file or directory", path);
  pid_t pids[2] = {spawn_writer("101", path), spawn_writer("102", path)};
  int running = 2, loads = 0, from_a = 0;
  while (running > 0) {
    remat_status s = remat_load_safetensors(md.g, path);
    if (s != REMAT_OK) {
      assert_int_equal(loads, 0); /* only before the first save */
      expect_message(s, REMAT_ERR_IO, want);
    } else {
      float *got = fixture_snapshot(md.g, &m);
      int is_a = memcmp(got, wa, n * sizeof *got) == 0;
      assert_true(is_a || memcmp(got, wb, n * sizeof *got) == 0);
      free(got);
      loads++;
      from_a += is_a;
    }
    for (int i = 0; i < 2; i++) {
      int status;
      if (pids[i] > 0 && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        pids[i] = 0;
        running--;
      }
    }
  }
  print_message("%d loads during the saves, %d of them the first writer's\n",
                loads, from_a);
  assert_int_equal(remat_load_safetensors(md.g, path), REMAT_OK);
  char names[256];
  list_dir(path_in_dir("shared"), names, sizeof names);
  assert_string_equal(names, "shared.safetensors");
  free(wa);
  free(wb);
  close_model(&a);
  close_model(&b);
  close_model(&md);
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--writer") == 0)
    return writer_main(argv[2], argv[3]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sparse_files),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_corrupt_files),
      cmocka_unit_test(test_header_cap),
      cmocka_unit_test(test_special_files),
      cmocka_unit_test(test_save_never_follows),
      cmocka_unit_test(test_failed_save),
      cmocka_unit_test(test_save_duplicate_names),
      cmocka_unit_test(test_concurrent_saves),
      cmocka_unit_test(test_not_compiled),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
