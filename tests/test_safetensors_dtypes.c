/* Tests of loading the safetensors files Hugging Face publishes: BF16 and
 * F16 tensors converted exactly into the parameters' storage (against an
 * independent decoding of the bits and against an F32 file of the same
 * values), refused dtypes, byte counts and non-finite values with their
 * exact messages, and sharded checkpoints read through a
 * model.safetensors.index.json, every failure leaving the parameters as
 * they were. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpt_fixture.h"
#include "remat.h"
#include "tmpdir.h"

static const remat_gpt_config tiny = {
    .layers = 1, .d_model = 8, .heads = 2, .seq = 4, .batch = 1, .vocab = 7};

typedef struct model {
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
} model;

/* The tiny GPT; in bf16 precision with every parameter but lm_head frozen
 * when `frozen`. */
static void open_model(model *md, uint64_t seed, remat_precision precision,
                       bool frozen) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_PRECISION,
                     .num_threads = 1,
                     .precision = precision};
  assert_int_equal(remat_runtime_create(&rc, &md->rt), REMAT_OK);
  assert_int_equal(remat_graph_create(md->rt, &md->g), REMAT_OK);
  assert_int_equal(remat_graph_seed(md->g, seed), REMAT_OK);
  assert_int_equal(remat_gpt_build(md->g, &tiny, &md->m), REMAT_OK);
  for (int i = 0; frozen && i < remat_num_params(md->g); i++) {
    remat_tensor *p = remat_param_at(md->g, i);
    if (strcmp(remat_tensor_name(p), "lm_head") != 0)
      assert_int_equal(remat_param_freeze(md->g, p), REMAT_OK);
  }
  assert_int_equal(remat_compile(md->g, md->m.loss, NULL), REMAT_OK);
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

/* ---- a small safetensors writer ---- */

/* One tensor to write: its header entry's fields and its raw data. */
typedef struct st_tensor {
  const char *name, *dtype;
  int ndim;
  int64_t dims[4];
  const void *data;
  size_t bytes;
  long long begin, end; /* data_offsets; both -1: laid out back to back */
} st_tensor;

/* Writes an 8-byte little-endian header length, the JSON header (with
 * "__metadata__" first) and the data of the n tensors. */
static void write_st(const char *path, const st_tensor *t, int n) {
  char *json = malloc(65536);
  size_t len = (size_t)snprintf(json, 65536,
                                "{\"__metadata__\":{\"format\":\"pt\"}");
  long long at = 0;
  for (int i = 0; i < n; i++) {
    long long b = t[i].begin < 0 ? at : t[i].begin;
    long long e = t[i].end < 0 ? at + (long long)t[i].bytes : t[i].end;
    at += (long long)t[i].bytes;
    len += (size_t)snprintf(json + len, 65536 - len,
                            ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                            t[i].name, t[i].dtype);
    for (int d = 0; d < t[i].ndim; d++)
      len += (size_t)snprintf(json + len, 65536 - len, "%s%lld", d ? "," : "",
                              (long long)t[i].dims[d]);
    len += (size_t)snprintf(json + len, 65536 - len,
                            "],\"data_offsets\":[%lld,%lld]}", b, e);
  }
  len += (size_t)snprintf(json + len, 65536 - len, "}");
  assert_true(len < 65536);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  unsigned char hl[8];
  for (int i = 0; i < 8; i++)
    hl[i] = (unsigned char)((uint64_t)len >> (8 * i));
  assert_int_equal(fwrite(hl, 1, 8, f), 8);
  assert_int_equal(fwrite(json, 1, len, f), len);
  for (int i = 0; i < n; i++)
    if (t[i].bytes > 0)
      assert_int_equal(fwrite(t[i].data, 1, t[i].bytes, f), t[i].bytes);
  fclose(f);
  free(json);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
  fclose(f);
}

/* Every parameter of md as a tensor of dtype `dtype`, whose data is
 * data[i] (bytes: the element count times `size`). */
static int param_tensors(const model *md, const char *dtype, size_t size,
                         void *const *data, st_tensor *out) {
  int n = remat_num_params(md->g);
  for (int i = 0; i < n; i++) {
    const remat_tensor *p = remat_param_at(md->g, i);
    out[i] = (st_tensor){.name = remat_tensor_name(p),
                         .dtype = dtype,
                         .ndim = remat_tensor_ndim(p),
                         .data = data[i],
                         .bytes = (size_t)remat_tensor_numel(p) * size,
                         .begin = -1,
                         .end = -1};
    for (int d = 0; d < out[i].ndim; d++)
      out[i].dims[d] = remat_tensor_dim(p, d);
  }
  return n;
}

/* ---- independent decodings of the bits ---- */

/* binary16: sign, 5 exponent bits (bias 15), 10 mantissa bits. */
static float f16_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v = exp == 0 ? ldexp(mant, -24) : ldexp(1024 + mant, exp - 25);
  return (float)(sign ? -v : v);
}

/* bfloat16: sign, 8 exponent bits (bias 127), 7 mantissa bits. */
static float bf16_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 7) & 255, mant = h & 127;
  double v = exp == 0 ? ldexp(mant, -133) : ldexp(128 + mant, exp - 134);
  return (float)(sign ? -v : v);
}

/* Round to nearest even into bf16 and back, as remat stores bf16. */
static float bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t rng_state = 12345;
static uint32_t rng(void) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return rng_state >> 8;
}

/* Bit patterns for n values of a 16-bit float whose exponent field is
 * `expmask` (so that all-ones, Inf and NaN, is left out): the special
 * values first (the smallest and largest subnormal, the smallest normal,
 * the largest finite, zeros, one), then random finite values. */
static void half_bits(uint16_t *h, size_t n, bool f16) {
  static const uint16_t f16_special[] = {0x0001, 0x03ff, 0x8001, 0x0400,
                                         0x7bff, 0xfbff, 0x0000, 0x8000,
                                         0x3c00, 0x0155};
  static const uint16_t bf16_special[] = {0x0001, 0x007f, 0x8001, 0x0080,
                                          0x7f7f, 0xff7f, 0x0000, 0x8000,
                                          0x3f80, 0x3f81};
  const uint16_t *sp = f16 ? f16_special : bf16_special;
  uint16_t top = f16 ? 0x7c00 : 0x7f80;
  for (size_t i = 0; i < n; i++) {
    uint16_t v;
    do
      v = i < 10 ? sp[i] : (uint16_t)rng();
    while ((v & top) == top);
    h[i] = v;
  }
}

static float *snapshot(const model *md, size_t *n) {
  float *s = fixture_snapshot(md->g, n);
  assert_non_null(s);
  return s;
}

/* Writes every parameter of md as `dtype` (F16 or BF16) from random bits
 * (the special values at the start of each tensor), loads the file, and
 * checks each value against the independent decoding; then loads an F32
 * file of those values into a second model and compares bitwise. */
static void half_file(const char *dtype, bool f16) {
  model md, other;
  open_model(&md, 1, REMAT_PRECISION_F32, false);
  open_model(&other, 2, REMAT_PRECISION_F32, false);
  int np = remat_num_params(md.g);
  void *halves[64], *floats[64];
  size_t total = 0;
  for (int i = 0; i < np; i++) {
    size_t n = (size_t)remat_tensor_numel(remat_param_at(md.g, i));
    uint16_t *h = malloc(n * sizeof *h);
    float *f = malloc(n * sizeof *f);
    half_bits(h, n, f16);
    for (size_t k = 0; k < n; k++)
      f[k] = f16 ? f16_value(h[k]) : bf16_value(h[k]);
    halves[i] = h;
    floats[i] = f;
    total += n;
  }
  st_tensor t[64] = {0};
  param_tensors(&md, dtype, 2, halves, t);
  const char *half_path = path_in_dir("half.safetensors");
  write_st(half_path, t, np);
  assert_int_equal(remat_load_safetensors(md.g, half_path), REMAT_OK);
  size_t n;
  float *got = snapshot(&md, &n);
  assert_int_equal(n, total);
  size_t at = 0;
  for (int i = 0; i < np; i++) {
    size_t cnt = (size_t)remat_tensor_numel(remat_param_at(md.g, i));
    const float *want = floats[i];
    for (size_t k = 0; k < cnt; k++)
      if (memcmp(&got[at + k], &want[k], sizeof(float)) != 0)
        fail_msg("%s %s[%zu]: bits 0x%04x loaded as %a, want %a", dtype,
                 remat_tensor_name(remat_param_at(md.g, i)), k,
                 ((const uint16_t *)halves[i])[k], (double)got[at + k],
                 (double)want[k]);
    at += cnt;
  }
  if (f16) { /* the extremes, spelled out */
    assert_true(got[0] == 0x1p-24f && got[1] == 0x3ffp-24f);
    assert_true(got[2] == -0x1p-24f && got[3] == 0x1p-14f);
    assert_true(got[4] == 65504.0f && got[5] == -65504.0f);
  } else {
    assert_true(got[0] == 0x1p-133f && got[3] == 0x1p-126f);
    assert_true(got[4] == 0x1.fep127f && got[8] == 1.0f);
  }
  param_tensors(&other, "F32", 4, floats, t);
  const char *f32_path = path_in_dir("full.safetensors");
  write_st(f32_path, t, np);
  assert_int_equal(remat_load_safetensors(other.g, f32_path), REMAT_OK);
  float *ref = snapshot(&other, &n);
  assert_memory_equal(got, ref, total * sizeof *got);
  free(got);
  free(ref);
  for (int i = 0; i < np; i++) {
    free(halves[i]);
    free(floats[i]);
  }
  close_model(&md);
  close_model(&other);
}

static void test_f16_values(void **state) {
  (void)state;
  half_file("F16", true);
}

static void test_bf16_values(void **state) {
  (void)state;
  half_file("BF16", false);
}

/* One file mixing the three dtypes loads each tensor from its own. */
static void test_mixed_dtypes(void **state) {
  (void)state;
  model md;
  open_model(&md, 3, REMAT_PRECISION_F32, false);
  int np = remat_num_params(md.g);
  void *data[64] = {0};
  float *want[64];
  static const char *const names[] = {"F32", "BF16", "F16"};
  static const size_t sizes[] = {4, 2, 2};
  st_tensor t[64] = {0};
  for (int i = 0; i < np; i++) {
    const remat_tensor *p = remat_param_at(md.g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    int dt = i % 3;
    data[i] = malloc(n * sizeof(float));
    want[i] = malloc(n * sizeof(float));
    for (size_t k = 0; k < n; k++) {
      float v = (float)((int)(rng() % 511) - 255) / 64.0f;
      want[i][k] = v;
      if (dt == 0)
        memcpy((float *)data[i] + k, &v, sizeof v);
      else {
        uint32_t u;
        memcpy(&u, &v, sizeof u); /* k/64, |k| < 256: exact in both */
        uint16_t h = dt == 1 ? (uint16_t)(u >> 16) : 0;
        if (dt == 2) { /* k/64 in binary16, built from the value */
          int e = 0;
          double m = frexp(fabs((double)v), &e); /* v = m * 2^e, m in [.5,1) */
          h = v == 0.0f ? 0
                        : (uint16_t)((v < 0 ? 0x8000 : 0) |
                                     (unsigned)(e - 1 + 15) << 10 |
                                     ((unsigned)ldexp(m, 11) & 1023));
        }
        ((uint16_t *)data[i])[k] = h;
      }
    }
    t[i] = (st_tensor){.name = remat_tensor_name(p), .dtype = names[dt],
                       .ndim = remat_tensor_ndim(p), .data = data[i],
                       .bytes = n * sizes[dt], .begin = -1, .end = -1};
    for (int d = 0; d < t[i].ndim; d++)
      t[i].dims[d] = remat_tensor_dim(p, d);
  }
  const char *path = path_in_dir("mixed.safetensors");
  write_st(path, t, np);
  assert_int_equal(remat_load_safetensors(md.g, path), REMAT_OK);
  size_t n;
  float *got = snapshot(&md, &n), *at = got;
  for (int i = 0; i < np; i++) {
    size_t cnt = (size_t)remat_tensor_numel(remat_param_at(md.g, i));
    assert_memory_equal(at, want[i], cnt * sizeof *at);
    at += cnt;
    free(data[i]);
    free(want[i]);
  }
  free(got);
  close_model(&md);
}

/* In bf16 precision a frozen linear weight is stored in bf16: a BF16
 * tensor lands bit for bit, an F16 one rounded to bf16 (the values are
 * read back widened). */
static void test_bf16_storage(void **state) {
  (void)state;
  model md;
  open_model(&md, 4, REMAT_PRECISION_BF16, true);
  int np = remat_num_params(md.g);
  void *bf[64], *hf[64];
  for (int i = 0; i < np; i++) {
    size_t n = (size_t)remat_tensor_numel(remat_param_at(md.g, i));
    bf[i] = malloc(n * 2);
    hf[i] = malloc(n * 2);
    half_bits(bf[i], n, false);
    half_bits(hf[i], n, true);
  }
  st_tensor t[64] = {0};
  const char *bpath = path_in_dir("b.safetensors");
  const char *hpath = path_in_dir("h.safetensors");
  param_tensors(&md, "BF16", 2, bf, t);
  write_st(bpath, t, np);
  param_tensors(&md, "F16", 2, hf, t);
  write_st(hpath, t, np);
  int stored_bf16 = 0;
  for (int pass = 0; pass < 2; pass++) {
    assert_int_equal(remat_load_safetensors(md.g, pass ? hpath : bpath),
                     REMAT_OK);
    for (int i = 0; i < np; i++) {
      remat_tensor *p = remat_param_at(md.g, i);
      size_t n = (size_t)remat_tensor_numel(p);
      float *got = malloc(n * sizeof *got);
      assert_int_equal(remat_read(md.g, p, got, n * sizeof *got), REMAT_OK);
      /* the frozen linear weights (stored in bf16) round F16 values */
      bool half = strstr(remat_tensor_name(p), ".w") != NULL &&
                  strcmp(remat_tensor_name(p), "lm_head") != 0;
      int rounded = 0;
      for (size_t k = 0; k < n; k++) {
        uint16_t b = ((uint16_t *)bf[i])[k], h = ((uint16_t *)hf[i])[k];
        float want = pass ? f16_value(h) : bf16_value(b);
        if (pass && half)
          want = bf16_round(want);
        rounded += want != f16_value(h);
        if (memcmp(&got[k], &want, sizeof want) != 0)
          fail_msg("pass %d %s[%zu]: %a, want %a", pass, remat_tensor_name(p),
                   k, (double)got[k], (double)want);
      }
      stored_bf16 += pass && half && rounded > 0;
      free(got);
    }
  }
  assert_true(stored_bf16 > 0); /* the test saw bf16 storage */
  for (int i = 0; i < np; i++) {
    free(bf[i]);
    free(hf[i]);
  }
  close_model(&md);
}

/* ---- refused files ---- */

/* A load that fails with `status` and "remat_load_safetensors: 'PATH':
 * MESSAGE" (PATH: `shown`, or the loaded path) and changes nothing. */
static void expect_refused(model *md, const char *path, const char *shown,
                           remat_status status, const char *message) {
  size_t n, m;
  float *before = snapshot(md, &n);
  assert_int_equal(remat_load_safetensors(md->g, path), status);
  char want[1024];
  snprintf(want, sizeof want, "remat_load_safetensors: '%s': %s",
           shown ? shown : path, message);
  assert_string_equal(remat_last_error(), want);
  float *after = snapshot(md, &m);
  assert_int_equal(m, n);
  assert_memory_equal(after, before, n * sizeof *after);
  free(before);
  free(after);
}

/* Every parameter as F32 (its current values), with tensor `which`
 * replaced by `repl`. */
static void write_with(const model *md, const char *path, int which,
                       const st_tensor *repl) {
  int np = remat_num_params(md->g);
  void *data[64] = {0};
  st_tensor t[64] = {0};
  size_t n;
  float *all = snapshot(md, &n), *at = all;
  for (int i = 0; i < np; i++) {
    data[i] = at;
    at += remat_tensor_numel(remat_param_at(md->g, i));
  }
  param_tensors(md, "F32", 4, data, t);
  if (which >= 0)
    t[which] = *repl;
  write_st(path, t, np);
  free(all);
}

static void test_refused(void **state) {
  (void)state;
  model md;
  open_model(&md, 5, REMAT_PRECISION_F32, false);
  int wpe = -1;
  for (int i = 0; i < remat_num_params(md.g); i++)
    if (strcmp(remat_tensor_name(remat_param_at(md.g, i)), "wpe") == 0)
      wpe = i;
  assert_true(wpe >= 0); /* wpe: [4,8], 32 values */
  uint16_t h[64] = {0};
  float f[32] = {0};
  st_tensor t;
  const char *p = path_in_dir("bad.safetensors");
  /* an F32 tensor with a half byte count (first: without the check, a
   * short read, not an overflow) */
  t = (st_tensor){.name = "wpe", .dtype = "F32", .ndim = 2, .dims = {4, 8},
                  .data = h, .bytes = 64, .begin = -1, .end = -1};
  write_with(&md, p, wpe, &t);
  expect_refused(&md, p, NULL, REMAT_ERR_IO,
                 "tensor 'wpe' has data_offsets [224,288] (64 bytes) but its "
                 "F32 shape needs 128 bytes");
  /* a BF16 tensor with an F32 byte count */
  t = (st_tensor){.name = "wpe", .dtype = "BF16", .ndim = 2, .dims = {4, 8},
                  .data = f, .bytes = 128, .begin = -1, .end = -1};
  write_with(&md, p, wpe, &t);
  expect_refused(&md, p, NULL, REMAT_ERR_IO,
                 "tensor 'wpe' has data_offsets [224,352] (128 bytes) but "
                 "its BF16 shape needs 64 bytes");
  t.dtype = "F16";
  write_with(&md, p, wpe, &t);
  expect_refused(&md, p, NULL, REMAT_ERR_IO,
                 "tensor 'wpe' has data_offsets [224,352] (128 bytes) but "
                 "its F16 shape needs 64 bytes");
  /* dtypes a load does not take */
  static const char *const other[] = {"I8", "F64", "U8", "bf16", "F8_E4M3"};
  for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
    t = (st_tensor){.name = "wpe", .dtype = other[i], .ndim = 2,
                    .dims = {4, 8}, .data = f, .bytes = 128, .begin = -1,
                    .end = -1};
    write_with(&md, p, wpe, &t);
    char msg[160];
    snprintf(msg, sizeof msg,
             "tensor 'wpe' has dtype %s: a load takes F32, BF16 and F16",
             other[i]);
    expect_refused(&md, p, NULL, REMAT_ERR_SHAPE, msg);
  }
  /* F16 and BF16 Inf and NaN, named with the tensor and the element */
  static const struct {
    const char *dtype;
    uint16_t bits;
    const char *shown;
  } special[] = {{"F16", 0x7c00, "inf"}, {"F16", 0xfc00, "-inf"},
                 {"F16", 0x7e00, "nan"}, {"F16", 0x7c01, "nan"},
                 {"BF16", 0x7f80, "inf"}, {"BF16", 0x7fc0, "nan"}};
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
    for (int k = 0; k < 32; k++)
      h[k] = 0x3c00; /* 1 in F16, 1.875 in BF16 */
    h[13] = special[i].bits;
    t = (st_tensor){.name = "wpe", .dtype = special[i].dtype, .ndim = 2,
                    .dims = {4, 8}, .data = h, .bytes = 64, .begin = -1,
                    .end = -1};
    write_with(&md, p, wpe, &t);
    char msg[160];
    snprintf(msg, sizeof msg,
             "tensor 'wpe' holds %s at element 13: every value must be "
             "finite", special[i].shown);
    expect_refused(&md, p, NULL, REMAT_ERR_IO, msg);
  }
  close_model(&md);
}

/* ---- sharded checkpoints ---- */

/* Writes md's parameters (values `vals`, as F32 or, for odd positions,
 * BF16 of the same values rounded) into two shards a.safetensors (the
 * first `split` parameters) and b.safetensors (the rest) under dir `sub`,
 * and returns the weight_map entries as JSON text. */
static void write_shards(const model *md, const char *sub, int split,
                         char *map, size_t len) {
  int np = remat_num_params(md->g);
  void *data[64] = {0};
  st_tensor t[64] = {0};
  size_t n;
  float *all = snapshot(md, &n), *at = all;
  for (int i = 0; i < np; i++) {
    data[i] = at;
    at += remat_tensor_numel(remat_param_at(md->g, i));
  }
  param_tensors(md, "F32", 4, data, t);
  char path[200];
  snprintf(path, sizeof path, "%s/a.safetensors", sub);
  write_st(path, t, split);
  snprintf(path, sizeof path, "%s/b.safetensors", sub);
  write_st(path, t + split, np - split);
  size_t used = 0;
  for (int i = 0; i < np; i++)
    used += (size_t)snprintf(map + used, len - used, "%s\"%s\":\"%s\"",
                             i ? "," : "", t[i].name,
                             i < split ? "a.safetensors" : "b.safetensors");
  assert_true(used < len);
  free(all);
}

/* An index with the given weight_map text. */
static void write_index(const char *path, const char *map) {
  char *text = malloc(strlen(map) + 200);
  sprintf(text, "{\"metadata\":{\"total_size\":4128},\"weight_map\":{%s}}",
          map);
  write_text(path, text);
  free(text);
}

static void test_sharded(void **state) {
  (void)state;
  model src, md, one;
  open_model(&src, 6, REMAT_PRECISION_F32, false);
  open_model(&md, 7, REMAT_PRECISION_F32, false);
  open_model(&one, 8, REMAT_PRECISION_F32, false);
  int np = remat_num_params(src.g);
  char *sub = path_in_dir("shards");
  char subdir[160];
  snprintf(subdir, sizeof subdir, "%s", sub);
  assert_int_equal(mkdir(subdir, 0755), 0);
  char map[4096], idx[200];
  write_shards(&src, subdir, np / 2, map, sizeof map);
  snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", subdir);
  write_index(idx, map);
  /* the same as one file */
  const char *single = path_in_dir("single.safetensors");
  assert_int_equal(remat_save_safetensors(src.g, single), REMAT_OK);
  assert_int_equal(remat_load_safetensors(one.g, single), REMAT_OK);
  assert_int_equal(remat_load_safetensors(md.g, idx), REMAT_OK);
  size_t n, m;
  float *a = snapshot(&one, &n), *b = snapshot(&md, &m);
  assert_int_equal(n, m);
  assert_memory_equal(a, b, n * sizeof *a);
  free(a);
  free(b);
  close_model(&one);

  /* hostile indexes, each against a fresh model (md, other values) */
  model fresh;
  open_model(&fresh, 9, REMAT_PRECISION_F32, false);
  const char *first = remat_tensor_name(remat_param_at(src.g, 0));
  const char *last = remat_tensor_name(remat_param_at(src.g, np - 1));
  char bad[4096 + 200], msg[600], shown[300];
  /* a tensor twice in the weight_map */
  snprintf(bad, sizeof bad, "%s,\"%s\":\"b.safetensors\"", map, first);
  write_index(idx, bad);
  snprintf(msg, sizeof msg,
           "the index's weight_map names tensor '%s' twice", first);
  expect_refused(&fresh, idx, NULL, REMAT_ERR_IO, msg);
  /* shards outside the index's directory */
  static const char *const outside[] = {"../a.safetensors", "/etc/passwd",
                                        "sub/a.safetensors", "..", ""};
  for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
    char *at = strstr(map, "\"a.safetensors\"");
    snprintf(bad, sizeof bad, "%.*s\"%s\"%s", (int)(at - map), map,
             outside[i], at + strlen("\"a.safetensors\""));
    write_index(idx, bad);
    snprintf(msg, sizeof msg,
             "the index puts tensor '%s' in '%s', which is not a file name "
             "in the index's directory (no '/', not '.' or '..')",
             first, outside[i]);
    expect_refused(&fresh, idx, NULL, REMAT_ERR_IO, msg);
  }
  /* a missing shard: named with its path */
  {
    char *at = strstr(map, "\"b.safetensors\"");
    snprintf(bad, sizeof bad, "%.*s\"c.safetensors\"%s", (int)(at - map), map,
             at + strlen("\"b.safetensors\""));
    write_index(idx, bad);
    size_t before_n;
    float *before = snapshot(&fresh, &before_n);
    assert_int_equal(remat_load_safetensors(fresh.g, idx), REMAT_ERR_IO);
    snprintf(msg, sizeof msg,
             "remat_load_safetensors: cannot open '%s/c.safetensors': No "
             "such file or directory", subdir);
    assert_string_equal(remat_last_error(), msg);
    float *after = snapshot(&fresh, &before_n);
    assert_memory_equal(after, before, before_n * sizeof *after);
    free(before);
    free(after);
  }
  /* a tensor that its shard lacks: the last one put in a.safetensors */
  {
    char key[100];
    snprintf(key, sizeof key, "\"%s\":\"b.safetensors\"", last);
    char *at = strstr(map, key);
    assert_non_null(at);
    snprintf(bad, sizeof bad, "%.*s\"%s\":\"a.safetensors\"%s",
             (int)(at - map), map, last, at + strlen(key));
    write_index(idx, bad);
    snprintf(shown, sizeof shown, "%s/b.safetensors", subdir);
    snprintf(msg, sizeof msg,
             "tensor '%s' is in this shard but the index puts it in "
             "'a.safetensors'", last);
    expect_refused(&fresh, idx, shown, REMAT_ERR_IO, msg);
    /* and left out of the map: the shard holds a tensor it does not name */
    snprintf(bad, sizeof bad, "%.*s", (int)(at - map - 1), map);
    write_index(idx, bad);
    snprintf(msg, sizeof msg, "tensor '%s' is not in the index's weight_map",
             last);
    expect_refused(&fresh, idx, shown, REMAT_ERR_IO, msg);
  }
  /* a tensor the map puts in a shard that does not hold it (an extra name
   * that no shard holds) */
  snprintf(bad, sizeof bad, "%s,\"extra.w\":\"b.safetensors\"", map);
  write_index(idx, bad);
  expect_refused(&fresh, idx, NULL, REMAT_ERR_IO,
                 "the index puts tensor 'extra.w' in 'b.safetensors', which "
                 "does not hold it");
  /* a model tensor no shard holds: the map and the shards without it */
  {
    st_tensor t[64] = {0};
    void *data[64] = {0};
    size_t cnt;
    float *all = snapshot(&src, &cnt), *at = all;
    for (int i = 0; i < np; i++) {
      data[i] = at;
      at += remat_tensor_numel(remat_param_at(src.g, i));
    }
    param_tensors(&src, "F32", 4, data, t);
    char path[200];
    snprintf(path, sizeof path, "%s/b.safetensors", subdir);
    write_st(path, t + np / 2, np - np / 2 - 1);
    char key[100];
    snprintf(key, sizeof key, ",\"%s\":\"b.safetensors\"", last);
    char *k = strstr(map, key);
    snprintf(bad, sizeof bad, "%.*s", (int)(k - map), map);
    write_index(idx, bad);
    snprintf(msg, sizeof msg,
             "the model's tensor '%s' is missing from the index", last);
    expect_refused(&fresh, idx, NULL, REMAT_ERR_SHAPE, msg);
    free(all);
    write_shards(&src, subdir, np / 2, map, sizeof map);
  }
  /* not an index */
  write_text(idx, "{\"metadata\":{},\"weight\":{}}");
  expect_refused(&fresh, idx, NULL, REMAT_ERR_IO,
                 "the index is not a JSON object with a \"weight_map\" "
                 "object");
  write_text(idx, "{\"weight_map\":{\"wte\":7}}");
  expect_refused(&fresh, idx, NULL, REMAT_ERR_IO,
                 "the index's weight_map gives tensor 'wte' a shard that is "
                 "not a string");
  /* an index over the size limit (a sparse file) */
  {
    FILE *f = fopen(idx, "wb");
    assert_non_null(f);
    fputs("{\"weight_map\":{}}", f);
    fclose(f);
    assert_int_equal(truncate(idx, (16 << 20) + 1), 0);
    expect_refused(&fresh, idx, NULL, REMAT_ERR_IO,
                   "the index is 16777217 bytes, more than the 16777216-byte "
                   "(16 MiB) limit on an index");
  }
  /* the good index loads again after all that */
  write_index(idx, map);
  assert_int_equal(remat_load_safetensors(fresh.g, idx), REMAT_OK);
  a = snapshot(&fresh, &n);
  b = snapshot(&src, &m);
  assert_memory_equal(a, b, n * sizeof *a);
  free(a);
  free(b);
  close_model(&fresh);
  close_model(&src);
  close_model(&md);
}

/* ---- GPT-2 as Hugging Face writes it (remat_gpt_load_hf) ---- */

/* remat_gpt_build's names for one layer, Hugging Face's, and whether the
 * file holds the weight transposed ([in,out], Conv1D). */
static const struct {
  const char *remat, *hf;
  bool transposed;
} gpt2_names[] = {
    {"wte", "wte.weight", false},
    {"wpe", "wpe.weight", false},
    {"h0.ln1.gamma", "h.0.ln_1.weight", false},
    {"h0.ln1.beta", "h.0.ln_1.bias", false},
    {"h0.attn.w_qkv", "h.0.attn.c_attn.weight", true},
    {"h0.attn.b_qkv", "h.0.attn.c_attn.bias", false},
    {"h0.attn.w_out", "h.0.attn.c_proj.weight", true},
    {"h0.attn.b_out", "h.0.attn.c_proj.bias", false},
    {"h0.ln2.gamma", "h.0.ln_2.weight", false},
    {"h0.ln2.beta", "h.0.ln_2.bias", false},
    {"h0.ffn.w_in", "h.0.mlp.c_fc.weight", true},
    {"h0.ffn.b_in", "h.0.mlp.c_fc.bias", false},
    {"h0.ffn.w_out", "h.0.mlp.c_proj.weight", true},
    {"h0.ffn.b_out", "h.0.mlp.c_proj.bias", false},
    {"lnf.gamma", "ln_f.weight", false},
    {"lnf.beta", "ln_f.bias", false},
};
#define GPT2_N (int)(sizeof gpt2_names / sizeof *gpt2_names)

static void open_gpt2(model *md, int tie_head) {
  remat_gpt_config c = tiny;
  c.tie_head = tie_head;
  c.positions = 6;
  assert_int_equal(remat_runtime_create(NULL, &md->rt), REMAT_OK);
  assert_int_equal(remat_graph_create(md->rt, &md->g), REMAT_OK);
  assert_int_equal(remat_gpt_build(md->g, &c, &md->m), REMAT_OK);
  assert_int_equal(remat_compile(md->g, md->m.loss, NULL), REMAT_OK);
}

/* Writes the GPT-2 file of md's parameters (value of element e of file
 * tensor k: k + e / 1024, in the file's layout), with the prefix
 * "transformer.", the two attention buffers and a tied lm_head.weight;
 * `skip` names a tensor left out (NULL: none). data[k] gets the values. */
static void write_gpt2(const model *md, const char *path, const char *skip,
                       float *data[GPT2_N]) {
  static char names[GPT2_N + 3][64];
  st_tensor t[GPT2_N + 3];
  static float mask[36], masked_bias = -1e4f;
  int n = 0;
  for (int k = 0; k < GPT2_N; k++) {
    const remat_tensor *p = remat_param_at(md->g, k);
    assert_string_equal(remat_tensor_name(p), gpt2_names[k].remat);
    int64_t numel = remat_tensor_numel(p);
    data[k] = malloc((size_t)numel * sizeof(float));
    for (int64_t e = 0; e < numel; e++)
      data[k][e] = (float)k + (float)e / 1024.0f;
    if (skip != NULL && strcmp(gpt2_names[k].hf, skip) == 0)
      continue;
    snprintf(names[n], sizeof names[n], "transformer.%s", gpt2_names[k].hf);
    t[n] = (st_tensor){.name = names[n], .dtype = "F32",
                       .ndim = remat_tensor_ndim(p), .data = data[k],
                       .bytes = (size_t)numel * 4, .begin = -1, .end = -1};
    for (int d = 0; d < t[n].ndim; d++)
      t[n].dims[d] = remat_tensor_dim(
          p, gpt2_names[k].transposed ? t[n].ndim - 1 - d : d);
    n++;
  }
  for (int i = 0; i < 36; i++)
    mask[i] = i % 6 <= i / 6;
  t[n++] = (st_tensor){.name = "transformer.h.0.attn.bias", .dtype = "F32",
                       .ndim = 4, .dims = {1, 1, 6, 6}, .data = mask,
                       .bytes = sizeof mask, .begin = -1, .end = -1};
  t[n++] = (st_tensor){.name = "transformer.h.0.attn.masked_bias",
                       .dtype = "F32", .ndim = 0, .data = &masked_bias,
                       .bytes = 4, .begin = -1, .end = -1};
  t[n++] = (st_tensor){.name = "lm_head.weight", .dtype = "F32", .ndim = 2,
                       .dims = {tiny.vocab, tiny.d_model}, .data = data[0],
                       .bytes = (size_t)tiny.vocab * tiny.d_model * 4,
                       .begin = -1, .end = -1};
  write_st(path, t, n);
}

static float *read_param(const model *md, int k) {
  const remat_tensor *p = remat_param_at(md->g, k);
  size_t bytes = (size_t)remat_tensor_numel(p) * sizeof(float);
  float *v = malloc(bytes);
  assert_int_equal(remat_read(md->g, p, v, bytes), REMAT_OK);
  return v;
}

/* Every parameter takes its file tensor, the Conv1D weights transposed:
 * parameter [R,C] element r*C + c is file [C,R] element c*R + r. */
static void test_gpt2_hf(void **state) {
  (void)state;
  model md;
  open_gpt2(&md, 1);
  assert_int_equal(remat_num_params(md.g), GPT2_N); /* no lm_head */
  float *data[GPT2_N];
  const char *path = path_in_dir("gpt2.safetensors");
  write_gpt2(&md, path, NULL, data);
  assert_int_equal(remat_gpt_load_hf(md.g, path), REMAT_OK);
  for (int k = 0; k < GPT2_N; k++) {
    const remat_tensor *p = remat_param_at(md.g, k);
    float *v = read_param(&md, k);
    int64_t rows = remat_tensor_dim(p, 0), numel = remat_tensor_numel(p);
    int64_t cols = numel / rows;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++) {
        int64_t from = gpt2_names[k].transposed ? c * rows + r : r * cols + c;
        assert_true(v[r * cols + c] == data[k][from]);
      }
    free(v);
    free(data[k]);
  }
  close_model(&md);
}

/* A file without one of the model's tensors, and a model with its own
 * head: refused with their messages, no parameter changed. */
static void test_gpt2_hf_refused(void **state) {
  (void)state;
  model md;
  open_gpt2(&md, 1);
  float *data[GPT2_N], *before[GPT2_N];
  const char *path = path_in_dir("gpt2-missing.safetensors");
  write_gpt2(&md, path, "h.0.ln_2.bias", data);
  for (int k = 0; k < GPT2_N; k++)
    before[k] = read_param(&md, k);
  assert_int_equal(remat_gpt_load_hf(md.g, path), REMAT_ERR_SHAPE);
  char want[512];
  snprintf(want, sizeof want, "remat_gpt_load_hf: '%s': the model's tensor "
           "'h.0.ln_2.bias' is missing from the file", path);
  assert_string_equal(remat_last_error(), want);
  for (int k = 0; k < GPT2_N; k++) {
    float *v = read_param(&md, k);
    size_t bytes = (size_t)remat_tensor_numel(remat_param_at(md.g, k)) * 4;
    assert_memory_equal(v, before[k], bytes);
    free(v);
    free(before[k]);
    free(data[k]);
  }
  close_model(&md);
  open_gpt2(&md, 0);
  assert_int_equal(remat_gpt_load_hf(md.g, path), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_gpt_load_hf: the model has its own LM head "
                      "'lm_head', but GPT-2 ties the head to wte: build it "
                      "with tie_head = 1");
  close_model(&md);
}

/* remat_save_safetensors_bf16 writes BF16 tensors holding each value
 * rounded to nearest even, which a load reads back exactly. */
static void test_save_bf16(void **state) {
  (void)state;
  model a, b;
  open_model(&a, 5, REMAT_PRECISION_F32, false);
  open_model(&b, 6, REMAT_PRECISION_F32, false);
  const char *path = path_in_dir("saved-bf16.safetensors");
  assert_int_equal(remat_save_safetensors_bf16(a.g, path), REMAT_OK);
  FILE *f = fopen(path, "rb");
  unsigned char hl[8];
  assert_int_equal(fread(hl, 1, 8, f), 8);
  char header[8192] = "";
  size_t hlen = hl[0] | (size_t)hl[1] << 8;
  assert_true(hlen < sizeof header);
  assert_int_equal(fread(header, 1, hlen, f), hlen);
  fclose(f);
  assert_null(strstr(header, "\"F32\""));
  assert_non_null(strstr(header, "\"dtype\":\"BF16\""));
  assert_int_equal(remat_load_safetensors(b.g, path), REMAT_OK);
  int rounded_up = 0;
  for (int k = 0; k < remat_num_params(a.g); k++) {
    float *x = read_param(&a, k), *y = read_param(&b, k);
    for (int64_t e = 0; e < remat_tensor_numel(remat_param_at(a.g, k)); e++) {
      uint32_t u, w;
      memcpy(&u, &x[e], 4);
      w = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
      rounded_up += (w >> 16) != (u >> 16);
      float want;
      memcpy(&want, &w, 4);
      assert_true(y[e] == want);
    }
    free(x);
    free(y);
  }
  assert_true(rounded_up > 0); /* rounding, not truncation, was seen */
  close_model(&a);
  close_model(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f16_values),
      cmocka_unit_test(test_bf16_values),
      cmocka_unit_test(test_mixed_dtypes),
      cmocka_unit_test(test_bf16_storage),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_sharded),
      cmocka_unit_test(test_gpt2_hf),
      cmocka_unit_test(test_gpt2_hf_refused),
      cmocka_unit_test(test_save_bf16),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
