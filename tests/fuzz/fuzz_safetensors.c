/* Fuzz target: safetensors loading. The input is written to a memfd and
 * loaded with remat_load_safetensors into a small compiled graph (params
 * "w" [3,4], "b" [3], "scale" [2,2,2]). A load that fails must fail with
 * REMAT_ERR_IO or REMAT_ERR_SHAPE, a one-line message that names the
 * function, and every parameter as it was; a load that succeeds is undone
 * for the next input. The seeds include offsets of 2^62 and 1e300,
 * negative and fractional offsets, header lengths of 100 MiB + 1 and
 * 2^64 - 1 in a file of 335 bytes, a header of NUL bytes and a tensor
 * named twice, and BF16 and F16 tensors (mixed with F32, F16 subnormals
 * and the largest finite value, an F16 Inf, a BF16 NaN, an I8 dtype, a
 * BF16 tensor of F32 byte count); a load that succeeds must bring only
 * finite values (the
 * regressions hold a NaN, an Inf and a -Inf in a valid file). Every
 * input is also loaded as a training checkpoint: one that loads must
 * step (or reach REMAT_MAX_STEPS) and save a checkpoint that loads again
 * (the regressions hold remat.step 2^63-1, 2^53 and 2^53+1). A load that
 * succeeds must have had nothing but whitespace after the header's JSON
 * object (junk there is refused). And every header remat writes is JSON:
 * the input's bytes from offset 8 (up to a NUL, at most 63) are a
 * parameter name; a graph takes it if and only if it is UTF-8 (checked
 * here by a decoder of its own), and then the saved file's header is
 * UTF-8, parses as exactly one JSON object and holds the name as given. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "remat.h"

enum { NPARAMS = 3, MAX_NUMEL = 16 };

typedef struct target_graph {
  remat_runtime *rt;
  remat_graph *g;
  remat_tensor *params[NPARAMS];
  float initial[NPARAMS][MAX_NUMEL];
} target_graph;

static target_graph *shared_graph(void) {
  static target_graph tg;
  if (tg.g != NULL)
    return &tg;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_BIND,
                     .num_threads = 1,
                     .bind = REMAT_BIND_NONE};
  FUZZ_CHECK(remat_runtime_create(&rc, &tg.rt) == REMAT_OK);
  FUZZ_CHECK(remat_graph_create(tg.rt, &tg.g) == REMAT_OK);
  int64_t dx[2] = {2, 4}, dw[2] = {3, 4}, db[1] = {3}, ds[3] = {2, 2, 2};
  remat_tensor *x = remat_input(tg.g, "x", REMAT_F32, 2, dx);
  tg.params[0] = remat_param(tg.g, "w", 2, dw, REMAT_INIT_NORMAL, 1.0f);
  tg.params[1] = remat_param(tg.g, "b", 1, db, REMAT_INIT_ONES, 0.0f);
  tg.params[2] = remat_param(tg.g, "scale", 3, ds, REMAT_INIT_NORMAL, 1.0f);
  remat_tensor *y = remat_linear(tg.g, x, tg.params[0], tg.params[1]);
  remat_tensor *loss = remat_add(tg.g, remat_sum(tg.g, y),
                                 remat_sum(tg.g, tg.params[2]));
  FUZZ_CHECK(remat_compile(tg.g, loss, NULL) == REMAT_OK);
  for (int i = 0; i < NPARAMS; i++)
    FUZZ_CHECK(remat_read(tg.g, tg.params[i], tg.initial[i],
                          (size_t)remat_tensor_numel(tg.params[i]) * 4) ==
               REMAT_OK);
  return &tg;
}

static bool params_equal_initial(target_graph *tg) {
  for (int i = 0; i < NPARAMS; i++) {
    float now[MAX_NUMEL];
    size_t bytes = (size_t)remat_tensor_numel(tg->params[i]) * 4;
    FUZZ_CHECK(remat_read(tg->g, tg->params[i], now, bytes) == REMAT_OK);
    if (memcmp(now, tg->initial[i], bytes) != 0)
      return false;
  }
  return true;
}

/* The same input as a checkpoint: a load that succeeds brings a step
 * count that the next step can add to (REMAT_OK, or REMAT_ERR_LIMIT at
 * REMAT_MAX_STEPS) and a checkpoint saved after it loads again; a load
 * that fails changes nothing. */
static void checkpoint_round_trip(target_graph *tg, const char *path) {
  static char saved[64];
  if (saved[0] == '\0')
    snprintf(saved, sizeof saved, "/tmp/fuzz-ckpt-%d.safetensors",
             (int)getpid());
  remat_status s = remat_load_checkpoint(tg->g, path, NULL, NULL, 0);
  if (s != REMAT_OK) {
    FUZZ_CHECK(s == REMAT_ERR_IO || s == REMAT_ERR_SHAPE);
    FUZZ_CHECK(params_equal_initial(tg));
    return;
  }
  s = remat_step(tg->g, NULL);
  FUZZ_CHECK(s == REMAT_OK || s == REMAT_ERR_LIMIT || s == REMAT_ERR_NUMERIC);
  FUZZ_CHECK(remat_save_checkpoint(tg->g, saved, NULL, NULL, 0) == REMAT_OK);
  FUZZ_CHECK(remat_load_checkpoint(tg->g, saved, NULL, NULL, 0) == REMAT_OK);
  unlink(saved);
  for (int i = 0; i < NPARAMS; i++)
    FUZZ_CHECK(remat_write(tg->g, tg->params[i], tg->initial[i],
                           (size_t)remat_tensor_numel(tg->params[i]) * 4) ==
               REMAT_OK);
}

/* True when s[0..len) is well-formed UTF-8 (no overlong forms, no
 * surrogates, nothing past U+10FFFF): a decoder of the harness's own. */
static bool utf8_ok(const unsigned char *s, size_t len) {
  static const uint32_t least[4] = {0, 0x80, 0x800, 0x10000};
  for (size_t i = 0; i < len;) {
    unsigned c = s[i];
    unsigned n = c < 0x80   ? 0
                 : c < 0xc0 ? 9 /* a continuation byte cannot lead */
                 : c < 0xe0 ? 1
                 : c < 0xf0 ? 2
                 : c < 0xf8 ? 3
                            : 9;
    if (n == 9 || len - i < n + 1)
      return false;
    uint32_t cp = n == 0 ? c : c & (0x3fu >> n);
    for (unsigned k = 1; k <= n; k++) {
      if ((s[i + k] & 0xc0) != 0x80)
        return false;
      cp = cp << 6 | (s[i + k] & 0x3fu);
    }
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n + 1;
  }
  return true;
}

/* The header of the file at `path` must be UTF-8 and one JSON object
 * (then spaces) holding `name`. */
static void check_written_header(const char *path, const char *name) {
  FILE *f = fopen(path, "rb");
  FUZZ_CHECK(f != NULL);
  unsigned char len_bytes[8];
  FUZZ_CHECK(fread(len_bytes, 1, 8, f) == 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--)
    len = len << 8 | len_bytes[i];
  FUZZ_CHECK(len > 0 && len < 4096);
  char text[4096];
  FUZZ_CHECK(fread(text, 1, len, f) == len);
  fclose(f);
  FUZZ_CHECK(utf8_ok((const unsigned char *)text, len));
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
  FUZZ_CHECK(cJSON_IsObject(root));
  for (size_t i = (size_t)(end - text); i < len; i++)
    FUZZ_CHECK(text[i] == ' ');
  FUZZ_CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, name)));
  cJSON_Delete(root);
}

/* The input's bytes from offset 8 as a parameter name, saved. */
static void name_round_trip(remat_runtime *rt, const uint8_t *data,
                            size_t size) {
  char name[64] = "";
  size_t n = 0;
  for (; 8 + n < size && n < sizeof name - 1 && data[8 + n] != 0; n++)
    name[n] = (char)data[8 + n];
  name[n] = '\0';
  if (n == 0)
    return;
  remat_graph *g;
  FUZZ_CHECK(remat_graph_create(rt, &g) == REMAT_OK);
  int64_t d[1] = {2};
  remat_tensor *p = remat_param(g, name, 1, d, REMAT_INIT_ONES, 0.0f);
  bool valid = utf8_ok((const unsigned char *)name, n) &&
               strcmp(name, "__metadata__") != 0;
  if (strcmp(name, "__metadata__") != 0)
    FUZZ_CHECK((p != NULL) == utf8_ok((const unsigned char *)name, n));
  if (p != NULL && valid &&
      remat_compile(g, remat_sum(g, p), NULL) == REMAT_OK) {
    static char saved[64];
    if (saved[0] == '\0') /* tmpfs when there is one: a save syncs */
      snprintf(saved, sizeof saved, "%s/fuzz-name-%d.safetensors",
               access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
               (int)getpid());
    FUZZ_CHECK(remat_save_safetensors(g, saved) == REMAT_OK);
    check_written_header(saved, name);
    FUZZ_CHECK(remat_load_safetensors(g, saved) == REMAT_OK);
    unlink(saved);
  }
  remat_graph_destroy(g);
}

/* A load that succeeded read a header with only whitespace after its JSON
 * object. */
static void check_no_junk(const uint8_t *data, size_t size) {
  FUZZ_CHECK(size >= 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--)
    len = len << 8 | data[i];
  FUZZ_CHECK(len <= size - 8);
  const char *text = (const char *)data + 8, *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)len, &end, false);
  FUZZ_CHECK(root != NULL);
  cJSON_Delete(root);
  for (const char *c = end; c < text + len; c++)
    FUZZ_CHECK(*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  target_graph *tg = shared_graph();
  int fd = memfd_create("fuzz.safetensors", 0);
  FUZZ_CHECK(fd >= 0);
  for (size_t done = 0; done < size;) {
    ssize_t n = write(fd, data + done, size - done);
    FUZZ_CHECK(n > 0);
    done += (size_t)n;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  remat_status s = remat_load_safetensors(tg->g, path);
  if (s == REMAT_OK) {
    check_no_junk(data, size);
    for (int i = 0; i < NPARAMS; i++) { /* a load brings finite values */
      float now[MAX_NUMEL];
      int64_t n = remat_tensor_numel(tg->params[i]);
      FUZZ_CHECK(remat_read(tg->g, tg->params[i], now, (size_t)n * 4) ==
                 REMAT_OK);
      for (int64_t k = 0; k < n; k++)
        FUZZ_CHECK(isfinite(now[k]));
    }
    for (int i = 0; i < NPARAMS; i++)
      FUZZ_CHECK(remat_write(tg->g, tg->params[i], tg->initial[i],
                             (size_t)remat_tensor_numel(tg->params[i]) * 4) ==
                 REMAT_OK);
  } else {
    const char *msg = remat_last_error();
    FUZZ_CHECK(s == REMAT_ERR_IO || s == REMAT_ERR_SHAPE);
    FUZZ_CHECK(strncmp(msg, "remat_load_safetensors: ", 24) == 0);
    FUZZ_CHECK(strchr(msg, '\n') == NULL);
    FUZZ_CHECK(params_equal_initial(tg));
  }
  checkpoint_round_trip(tg, path);
  close(fd);
  name_round_trip(tg->rt, data, size);
  return 0;
}
