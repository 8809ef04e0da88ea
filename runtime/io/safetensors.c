/* Saving and loading parameters (and writing gradients) in the safetensors
 * format: an 8-byte little-endian header length, a JSON header (through
 * cJSON) naming each tensor's dtype, shape and data offsets, then the raw
 * little-endian data. A save writes a new temporary file beside the target
 * and renames it over the target. A load checks the header against the
 * file's size and the graph before it reads any tensor data, and reads all
 * of the data before it writes any tensor. The engine (safetensors.h) takes
 * any list of named tensors, which the checkpoints of checkpoint.c use. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/bf16.h"
#include "base/files.h"
#include "base/checked.h"
#include "runtime/io/safetensors.h"
#include "runtime/exec/step_state.h"

#define HEADER_MAX ((uint64_t)100 << 20) /* the safetensors package's limit */
#define HEADER_CHUNK ((size_t)1 << 16)   /* header bytes read at a time */


/* A parameter's size in bytes as F32 (false if it does not fit a size_t). */
static bool param_bytes(const remat_tensor *p, size_t *out) {
  return remat__mul_size((size_t)remat_tensor_numel(p), sizeof(float), out);
}

/* An item's size in bytes in the file: F32, or BF16 when saved so. */
static bool item_file_bytes(const safet_item *it, size_t *out) {
  return remat__mul_size((size_t)remat_tensor_numel(it->param),
                         it->save_bf16 ? 2 : sizeof(float), out);
}

/* ---- holding the graph, and the list of parameters ---- */

remat_status safet_hold(remat_graph *g, const char *path, const char *what) {
  if (g == NULL || path == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "%s: graph and path must not be "
                                              "NULL", what);
  remat_status s = runtime_check_fork(g->rt, what);
  if (s == REMAT_OK && !g->compiled)
    s = remat__fail(REMAT_ERR_STATE,
                    "%s: the graph is not compiled: call remat_compile "
                    "first", what);
  return s == REMAT_OK ? graph_enter(g, what) : s;
}

void safet_release(remat_graph *g) { graph_leave(g); }

remat_status safet_params(remat_graph *g, bool grads, int extra,
                          safet_item **items, int *n, const char *what) {
  const plan_lowering *l = &g->step->compiled.low;
  int nparams = remat_num_params(g);
  *n = 0;
  *items = remat__calloc((size_t)(nparams + extra > 0 ? nparams + extra : 1),
                         sizeof **items);
  if (*items == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  for (int i = 0; i < nparams; i++) {
    const remat_tensor *p = remat_param_at(g, i);
    if (grads && p->frozen)
      continue; /* no gradient to write */
    safet_item *it = &(*items)[(*n)++];
    it->param = p;
    snprintf(it->name, sizeof it->name, "%s", p->name);
    int32_t b = grads ? l->grad_buf[p->id] : l->value_buf[p->id];
    if (b < 0)
      return remat__fail(REMAT_ERR_INVALID_ARG,
                         "%s: parameter '%s' has no gradient (it does not "
                         "reach the loss)", what, it->name);
    it->data = g->step->state.data[b];
    it->store = l->bufs[b].dtype;
  }
  return REMAT_OK;
}

/* ---- saving ---- */

static int cmp_items(const void *a, const void *b) {
  return strcmp(((const safet_item *)a)->name, ((const safet_item *)b)->name);
}

/* The message for two tensors of a save under one name: two parameters,
 * or a parameter named like another's optimizer state. */
static remat_status duplicate(const safet_item *a, const safet_item *b,
                              const char *what) {
  const safet_item *state = strcmp(a->name, a->param->name) != 0 ? a : b;
  if (strcmp(state->name, state->param->name) != 0)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "%s: parameter name '%s' is also the name of the "
                       "optimizer state of parameter '%s', so the file could "
                       "not be loaded: rename the parameter", what,
                       state->name, state->param->name);
  return remat__fail(REMAT_ERR_INVALID_ARG,
                     "%s: parameter name '%s' is used by more than one "
                     "parameter, so the file could not be loaded: give each "
                     "parameter its own name (remat_checkpoint_name renames "
                     "a parameter)", what, a->name);
}

/* A file holding a name twice (or a tensor named like the metadata) could
 * never be loaded, so such a list is refused before anything is written. */
static remat_status check_names(const safet_item *items, int n,
                                const char *what) {
  safet_item *sorted = remat__malloc((size_t)(n > 0 ? n : 1) * sizeof *sorted);
  if (sorted == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  memcpy(sorted, items, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_items);
  remat_status s = REMAT_OK;
  for (int i = 0; i < n && s == REMAT_OK; i++) {
    if (strcmp(sorted[i].name, "__metadata__") == 0)
      s = remat__fail(REMAT_ERR_INVALID_ARG,
                      "%s: parameter name '__metadata__' is reserved by the "
                      "safetensors format: rename the parameter", what);
    else if (i > 0 && strcmp(sorted[i - 1].name, sorted[i].name) == 0)
      s = duplicate(&sorted[i - 1], &sorted[i], what);
  }
  free(sorted);
  return s;
}

/* The target must be a regular file or not exist yet: a directory, a
 * device, a FIFO or a symbolic link is refused (base/files.h). */
static remat_status check_target(const char *path, const char *what) {
  mode_t mode;
  if (remat__replace_check(path, &mode) == 0)
    return REMAT_OK;
  if (mode == 0)
    return remat__fail(REMAT_ERR_IO, "%s: cannot save to '%s': %s", what,
                       remat__quote(&(remat__quoted){0}, path),
                       strerror(errno));
  return remat__fail(REMAT_ERR_IO,
                     "%s: '%s' is %s: the target must be a regular file "
                     "or a new name", what,
                     remat__quote(&(remat__quoted){0}, path),
                     remat__file_kind(mode));
}

/* __metadata__: the format, the producer, then the caller's entries. */
static cJSON *build_meta(const safet_meta *meta, int nmeta) {
  cJSON *m = cJSON_CreateObject();
  bool ok = m != NULL && cJSON_AddStringToObject(m, "format", "pt") &&
            cJSON_AddStringToObject(m, "producer", "remat");
  for (int i = 0; ok && i < nmeta; i++)
    ok = cJSON_AddStringToObject(m, meta[i].key, meta[i].value) != NULL;
  if (!ok) {
    cJSON_Delete(m);
    return NULL;
  }
  return m;
}

/* The JSON header of the items, laid out back to back in list order. */
static cJSON *build_header(const safet_item *items, int n,
                           const safet_meta *meta, int nmeta) {
  cJSON *root = cJSON_CreateObject(), *m = build_meta(meta, nmeta);
  if (root == NULL || m == NULL || !cJSON_AddItemToObject(root, "__metadata__", m)) {
    cJSON_Delete(root);
    cJSON_Delete(m);
    return NULL;
  }
  size_t offset = 0, bytes = 0;
  for (int i = 0; i < n; i++) {
    const remat_tensor *p = items[i].param;
    cJSON *entry = cJSON_AddObjectToObject(root, items[i].name);
    cJSON *shape = cJSON_AddArrayToObject(entry, "shape");
    cJSON *offsets = cJSON_AddArrayToObject(entry, "data_offsets");
    if (cJSON_AddStringToObject(entry, "dtype",
                                items[i].save_bf16 ? "BF16" : "F32") == NULL ||
        shape == NULL || offsets == NULL ||
        !item_file_bytes(&items[i], &bytes)) {
      cJSON_Delete(root);
      return NULL;
    }
    for (int d = 0; d < remat_tensor_ndim(p); d++)
      cJSON_AddItemToArray(shape,
                           cJSON_CreateNumber((double)remat_tensor_dim(p, d)));
    cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
    if (!remat__add_size(offset, bytes, &offset)) {
      cJSON_Delete(root);
      return NULL;
    }
    cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
  }
  return root;
}

/* 0, or -1 with errno set. */
static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n == 0)
      errno = EIO;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* n bf16 values written as F32, a chunk at a time; 0, or -1 with errno
 * set. */
static int write_widened(int fd, const uint16_t *src, size_t n) {
  enum { CHUNK = 1024 };
  float chunk[CHUNK];
  for (size_t lo = 0; lo < n; lo += CHUNK) {
    size_t len = n - lo < CHUNK ? n - lo : CHUNK;
    bf16_to_f32_row(chunk, src + lo, (int64_t)len);
    if (write_all(fd, chunk, len * sizeof *chunk) != 0)
      return -1;
  }
  return 0;
}

/* n f32 values written as BF16 (rounded to nearest even), a chunk at a
 * time; 0, or -1 with errno set. */
static int write_narrowed(int fd, const float *src, size_t n) {
  enum { CHUNK = 1024 };
  uint16_t chunk[CHUNK];
  for (size_t lo = 0; lo < n; lo += CHUNK) {
    size_t len = n - lo < CHUNK ? n - lo : CHUNK;
    bf16_from_f32_row(chunk, src + lo, (int64_t)len);
    if (write_all(fd, chunk, len * sizeof *chunk) != 0)
      return -1;
  }
  return 0;
}

/* One item's data as the file holds it: F32 (widened from bf16 storage)
 * or BF16 (narrowed from f32 storage, bf16 storage as it is). */
static int write_item(int fd, const safet_item *it, size_t n) {
  if (it->save_bf16)
    return it->store == OP_BF16 ? write_all(fd, it->data, n * 2)
                                : write_narrowed(fd, it->data, n);
  return it->store == OP_BF16 ? write_widened(fd, it->data, n)
                              : write_all(fd, it->data, n * sizeof(float));
}

/* What a save writes: the header text and the items. */
typedef struct save_body {
  const char *json;
  const safet_item *items;
  int nitems;
} save_body;

/* Header length (little-endian u64), the JSON padded with spaces to a
 * multiple of 8, then each item's data. */
static remat_status write_body(int fd, const save_body *body, const char *what,
                               const char *path) {
  size_t json_len = strlen(body->json), padded = 0;
  if (!remat__add_size(json_len, 7, &padded))
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  padded = padded / 8 * 8;
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; i++)
    len_bytes[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  char *header = remat__malloc(padded);
  if (header == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  memset(header, ' ', padded);
  memcpy(header, body->json, json_len);
  int bad = write_all(fd, len_bytes, 8) || write_all(fd, header, padded);
  free(header);
  for (int i = 0; !bad && i < body->nitems; i++) {
    size_t bytes = 0;
    if (!param_bytes(body->items[i].param, &bytes))
      return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    bad = write_item(fd, &body->items[i], bytes / sizeof(float));
  }
  if (bad)
    return remat__fail(REMAT_ERR_IO, "%s: cannot write '%s': %s", what,
                       remat__quote(&(remat__quoted){0}, path),
                       strerror(errno));
  return REMAT_OK;
}

/* Writes a new file beside the target, then renames it over the target
 * (base/files.h): the target is either as it was or the whole new file. */
static remat_status write_replace(const char *path, const save_body *body,
                                  const char *what) {
  remat__replacing r;
  FILE *f = remat__replace_begin(path, &r);
  if (f == NULL)
    return remat__fail(REMAT_ERR_IO,
                       "%s: cannot create a temporary file beside '%s': %s",
                       what, remat__quote(&(remat__quoted){0}, path),
                       strerror(errno));
  remat_status s = write_body(fileno(f), body, what, path);
  if (s != REMAT_OK) {
    remat__replace_abort(f, &r);
    return s;
  }
  int e = remat__replace_end(f, &r);
  if (e == 0)
    return REMAT_OK;
  remat__quoted q;
  const char *shown = remat__quote(&q, path);
  if (r.failed == REMAT__REPLACE_WRITE)
    return remat__fail(REMAT_ERR_IO, "%s: cannot write '%s': %s", what, shown,
                       strerror(e));
  if (r.failed == REMAT__REPLACE_RENAME)
    return remat__fail(REMAT_ERR_IO, "%s: cannot rename a new file over '%s': "
                       "%s", what, shown, strerror(e));
  return remat__fail(REMAT_ERR_IO, "%s: '%s' was written but its directory "
                     "cannot be synced: %s", what, shown, strerror(e));
}

remat_status safet_save(remat_graph *g, const char *path,
                        const safet_item *items, int nitems,
                        const safet_meta *meta, int nmeta, const char *what) {
  (void)g;
  remat_status s = check_names(items, nitems, what);
  if (s == REMAT_OK)
    s = check_target(path, what);
  if (s != REMAT_OK)
    return s;
  cJSON *root = build_header(items, nitems, meta, nmeta);
  char *json = root ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (json == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  save_body body = {.json = json, .items = items, .nitems = nitems};
  s = write_replace(path, &body, what);
  cJSON_free(json);
  return s;
}

/* The weights-only saves: every parameter's value (in F32 or BF16) or
 * gradient. */
static remat_status save_params(remat_graph *g, const char *path, bool grads,
                                bool bf16, const char *what) {
  remat_status s = safet_hold(g, path, what);
  if (s != REMAT_OK)
    return s;
  safet_item *items = NULL;
  int n = 0;
  s = safet_params(g, grads, 0, &items, &n, what);
  for (int i = 0; s == REMAT_OK && i < n; i++)
    items[i].save_bf16 = bf16;
  if (s == REMAT_OK)
    s = safet_save(g, path, items, n, NULL, 0, what);
  free(items);
  safet_release(g);
  return s;
}

remat_status remat_save_safetensors(remat_graph *g, const char *path) {
  return save_params(g, path, false, false, "remat_save_safetensors");
}

remat_status remat_save_safetensors_bf16(remat_graph *g, const char *path) {
  return save_params(g, path, false, true, "remat_save_safetensors_bf16");
}

remat_status remat_save_grads_safetensors(remat_graph *g, const char *path) {
  return save_params(g, path, true, false, "remat_save_grads_safetensors");
}

/* ---- loading ---- */

/* A failure about the file: "<call>: '<path>': <words>", where the caller
 * passes src->what and src->path right after the words' format. */
#define LOAD_FAIL(status, ...) remat__fail(status, "%s: '%s': " __VA_ARGS__)

/* The open file being loaded. */
typedef struct source {
  const char *what; /* the public call, for messages */
  const char *path; /* quoted for messages (remat__quote) */
  remat__quoted shown;
  int fd;
  uint64_t size;       /* of the whole file */
  uint64_t data_start; /* 8 + the header length */
} source;

/* Opens a regular file (O_NONBLOCK, so that a FIFO cannot block the open). */
static remat_status open_source(const char *path, const char *what,
                                source *src) {
  *src = (source){.what = what, .fd = -1};
  src->path = remat__quote(&src->shown, path);
  src->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (src->fd < 0)
    return remat__fail(REMAT_ERR_IO,
                       "%s: cannot open '%s': %s", what, src->path,
                       strerror(errno));
  struct stat st;
  if (fstat(src->fd, &st) != 0)
    return remat__fail(REMAT_ERR_IO,
                       "%s: cannot open '%s': %s", what, src->path,
                       strerror(errno));
  if (!S_ISREG(st.st_mode))
    return remat__fail(REMAT_ERR_IO,
                       "%s: '%s' is %s, not a regular file", what, src->path,
                       remat__file_kind(st.st_mode));
  src->size = (uint64_t)st.st_size;
  return REMAT_OK;
}

/* Reads exactly `len` bytes at `offset` (which the caller has checked lies
 * within the file). */
static remat_status read_at(const source *src, void *buf, size_t len,
                            uint64_t offset) {
  unsigned char *p = buf;
  while (len > 0) {
    ssize_t n = pread(src->fd, p, len, (off_t)offset);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return remat__fail(REMAT_ERR_IO,
                         "%s: cannot read '%s': %s", src->what, src->path,
                         n < 0 ? strerror(errno)
                               : "the file is shorter than when it was "
                                 "opened");
    p += n;
    len -= (size_t)n;
    offset += (uint64_t)n;
  }
  return REMAT_OK;
}

/* The header's length, checked against the file and the cap. */
static remat_status header_length(source *src, uint64_t *hlen) {
  if (src->size < 8)
    return LOAD_FAIL(REMAT_ERR_IO, "truncated: %llu bytes, shorter than the "
                     "8-byte header length", src->what, src->path,
                     (unsigned long long)src->size);
  unsigned char b[8];
  remat_status s = read_at(src, b, 8, 0);
  if (s != REMAT_OK)
    return s;
  *hlen = 0;
  for (int i = 0; i < 8; i++)
    *hlen |= (uint64_t)b[i] << (8 * i);
  if (*hlen > src->size - 8)
    return LOAD_FAIL(REMAT_ERR_IO, "header length %llu exceeds the %llu bytes "
                     "after it (truncated or not a safetensors file)",
                     src->what, src->path, (unsigned long long)*hlen,
                     (unsigned long long)(src->size - 8));
  if (*hlen > HEADER_MAX)
    return LOAD_FAIL(REMAT_ERR_IO, "header length %llu exceeds the %llu-byte "
                     "(100 MiB) limit on safetensors headers", src->what, src->path,
                     (unsigned long long)*hlen,
                     (unsigned long long)HEADER_MAX);
  src->data_start = 8 + *hlen;
  return REMAT_OK;
}

/* Reads the `hlen` bytes of header text a chunk at a time into a buffer
 * that grows as they arrive; stops (setting *junk) at a first byte that is
 * not '{' or at a NUL byte, so a junk header costs a chunk of memory, not
 * its declared length. */
static remat_status read_header_text(const source *src, uint64_t hlen,
                                     char **text, bool *junk) {
  size_t cap = 0, done = 0;
  *text = NULL;
  *junk = hlen == 0;
  remat_status s = REMAT_OK;
  while (done < hlen && s == REMAT_OK && !*junk) {
    size_t n = hlen - done < HEADER_CHUNK ? (size_t)(hlen - done)
                                          : HEADER_CHUNK;
    if (done + n > cap) {
      cap = cap * 2 < done + n ? done + n : cap * 2;
      cap = cap > hlen ? (size_t)hlen : cap;
      char *grown = remat__realloc(*text, cap);
      if (grown == NULL)
        return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory",
                           src->what);
      *text = grown;
    }
    s = read_at(src, *text + done, n, 8 + done);
    *junk = s == REMAT_OK && ((*text)[0] != '{' || memchr(*text + done, 0, n));
    done += n;
  }
  return s;
}

/* The offset of the first byte of text[at..len) that is not JSON
 * whitespace (the format pads the header with spaces), or len. */
static size_t after_padding(const char *text, size_t at, size_t len) {
  while (at < len && (text[at] == ' ' || text[at] == '\t' ||
                      text[at] == '\n' || text[at] == '\r'))
    at++;
  return at;
}

/* Reads and parses the header: a JSON object, then nothing but
 * whitespace up to the data (other readers refuse anything else there). */
static remat_status read_header(source *src, cJSON **root) {
  uint64_t hlen = 0;
  char *text = NULL;
  bool junk = false;
  remat_status s = header_length(src, &hlen);
  if (s == REMAT_OK)
    s = read_header_text(src, hlen, &text, &junk);
  const char *end = NULL;
  *root = s == REMAT_OK && !junk
              ? cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, false)
              : NULL;
  size_t tail = *root != NULL ? (size_t)(end - text) : 0;
  size_t extra = *root != NULL ? after_padding(text, tail, (size_t)hlen) : 0;
  free(text);
  if (s == REMAT_OK && !cJSON_IsObject(*root)) {
    cJSON_Delete(*root);
    *root = NULL;
    s = LOAD_FAIL(REMAT_ERR_IO, "the header is not a JSON object", src->what, src->path);
  } else if (s == REMAT_OK && extra < hlen) {
    cJSON_Delete(*root);
    *root = NULL;
    s = LOAD_FAIL(REMAT_ERR_IO, "the header's JSON object ends at byte %zu "
                  "of %llu, and byte %zu after it is not whitespace: the "
                  "header must be the object padded with spaces",
                  src->what, src->path, tail, (unsigned long long)hlen, extra);
  }
  return s;
}

/* The dtypes a load takes, converted to the parameters' storage. */
typedef enum src_dtype { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 } src_dtype;
static const struct {
  const char *name;
  size_t size;
} dtypes[] = {{"F32", 4}, {"BF16", 2}, {"F16", 2}};
#define ACCEPTED_DTYPES "F32, BF16 and F16"

/* The dtype named `name`, -1 when a load does not take it. */
static int find_dtype(const char *name) {
  for (int i = 0; i < (int)(sizeof dtypes / sizeof dtypes[0]); i++)
    if (strcmp(name, dtypes[i].name) == 0)
      return i;
  return -1;
}

/* IEEE binary16 -> f32, exact: subnormals become normal f32 values, +-Inf
 * stays +-Inf and a NaN stays a NaN (which the value check refuses). */
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
  if (exp == 0x1fu)
    u = sign | 0x7f800000u | (mant << 13);
  else if (exp != 0)
    u = sign | ((exp + 127u - 15u) << 23) | (mant << 13);
  else {
    float f = (float)mant * 0x1p-24f; /* 0 or a subnormal: exact */
    memcpy(&u, &f, sizeof u);
    u |= sign;
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Element i of `data`, of dtype `dt`, as f32. */
static float src_value(int dt, const unsigned char *data, size_t i) {
  if (dt == DT_F32) {
    float v;
    memcpy(&v, data + i * sizeof v, sizeof v);
    return v;
  }
  uint16_t h = (uint16_t)(data[2 * i] | (unsigned)data[2 * i + 1] << 8);
  return dt == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* One tensor of a file (src: that file, one of a sharded checkpoint's)
 * matched to an item, with its dtype. */
typedef struct entry {
  const safet_item *item;
  const struct source *src;
  uint64_t begin, end;
  int dt;
} entry;

/* A JSON number with no fractional part, of any sign or size. */
static bool json_whole(const cJSON *item, double *out) {
  if (!cJSON_IsNumber(item) || item->valuedouble != floor(item->valuedouble))
    return false;
  *out = item->valuedouble;
  return true;
}

/* A whole number as written ("4611686018427387904", "-8", "1e+300"). */
static void format_number(char *buf, size_t len, double v) {
  snprintf(buf, len, fabs(v) < 1e19 ? "%.0f" : "%g", v);
}

/* "[3,4]" */
static void format_shape(char *buf, size_t len, int ndim, const double *dims) {
  size_t n = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < ndim && n < len; i++) {
    char num[32];
    format_number(num, sizeof num, dims[i]);
    n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? "," : "", num);
  }
  if (n < len)
    snprintf(buf + n, len - n, "]");
}

/* The index of the item named `name`, -1 none: a hash look-up, so that
 * checking a header costs O(tensors), not O(tensors^2). */
static int find_item(const name_index *items, const char *name) {
  return name_index_find(items, name);
}

/* An offset into the data section: from 0 to its size. */
static bool offset_ok(double v, uint64_t data_size, uint64_t *out) {
  if (!(v >= 0.0 && v < 18446744073709551616.0))
    return false;
  *out = (uint64_t)v;
  return *out <= data_size;
}

/* Reads the two data_offsets: whole numbers within the data. */
static remat_status check_offsets(const source *src, const char *name,
                                  const cJSON *offs, entry *e) {
  double b, en;
  if (!json_whole(cJSON_GetArrayItem(offs, 0), &b) ||
      !json_whole(cJSON_GetArrayItem(offs, 1), &en))
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' has data_offsets that are not "
                     "whole numbers", src->what, src->path, name);
  uint64_t data_size = src->size - src->data_start;
  if (offset_ok(b, data_size, &e->begin) && offset_ok(en, data_size, &e->end))
    return REMAT_OK;
  char bs[32], es[32];
  format_number(bs, sizeof bs, b);
  format_number(es, sizeof es, en);
  return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' has data_offsets [%s,%s] out of "
                   "range: the %llu-byte file has %llu bytes of data after "
                   "its header", src->what, src->path, name, bs, es,
                   (unsigned long long)src->size,
                   (unsigned long long)data_size);
}

/* The file's shape against the parameter's. */
static remat_status check_shape(const source *src, const char *name,
                                const cJSON *shape, const safet_item *it) {
  const remat_tensor *p = it->param;
  int pd = remat_tensor_ndim(p);
  double dims[REMAT_MAX_DIMS], model[REMAT_MAX_DIMS];
  int ndim = 0;
  const cJSON *d;
  cJSON_ArrayForEach(d, shape) {
    if (!json_whole(d, &dims[ndim++]))
      return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' has a shape that is not a "
                       "list of whole numbers", src->what, src->path, name);
  }
  int same = ndim == pd;
  for (int k = 0; k < pd; k++) {
    model[k] = (double)remat_tensor_dim(p, it->transpose ? pd - 1 - k : k);
    same = same && dims[k] == model[k];
  }
  if (same)
    return REMAT_OK;
  char fs[96], ms[96];
  format_shape(fs, sizeof fs, ndim, dims);
  format_shape(ms, sizeof ms, remat_tensor_ndim(p), model);
  return LOAD_FAIL(REMAT_ERR_SHAPE, "tensor '%s' has shape %s in the file "
                   "but %s in the model%s", src->what, src->path, name, fs, ms,
                   it->transpose ? " (transposed: [in,out])" : "");
}

/* A file tensor's name as the items know it: without the request's
 * prefix, when it has it. */
static const char *file_key(const safet_load_req *req, const char *name) {
  size_t n = req->prefix != NULL ? strlen(req->prefix) : 0;
  return n > 0 && strncmp(name, req->prefix, n) == 0 ? name + n : name;
}

/* Checks one header entry against the file and the model: its fields, its
 * offsets, then (unless the load skips it) dtype, shape and size. */
static remat_status check_entry(const safet_load_req *req,
                                const name_index *items, const source *src,
                                const cJSON *item, bool skip, entry *entries,
                                int *seen) {
  remat__quoted quoted_name, quoted_dt;
  const char *name = remat__quote(&quoted_name, item->string);
  if (!cJSON_IsObject(item))
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' is not a JSON object",
                     src->what, src->path, name);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) ||
      !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
      cJSON_GetArraySize(shape) > REMAT_MAX_DIMS)
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' needs a dtype string, a shape "
                     "array of at most %d dims and two data_offsets",
                     src->what, src->path, name, REMAT_MAX_DIMS);
  entry e = {0};
  remat_status s = check_offsets(src, name, offs, &e);
  if (s != REMAT_OK || skip)
    return s;
  int i = find_item(items, file_key(req, item->string));
  if (i < 0)
    return LOAD_FAIL(REMAT_ERR_SHAPE, "tensor '%s' is not a parameter of the "
                     "model%s", src->what, src->path, name,
                     req->weights_only ? "" : " or the optimizer state of one");
  if (seen[i])
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' appears twice", src->what,
                     src->path, name);
  const char *dt = remat__quote(&quoted_dt, dtype->valuestring);
  e.dt = find_dtype(dtype->valuestring);
  if (e.dt < 0)
    return LOAD_FAIL(REMAT_ERR_SHAPE, "tensor '%s' has dtype %s: a load "
                     "takes " ACCEPTED_DTYPES, src->what, src->path, name, dt);
  e.item = &req->items[i];
  e.src = src;
  if ((s = check_shape(src, name, shape, e.item)) != REMAT_OK)
    return s;
  size_t need = 0;
  if (!remat__mul_size((size_t)remat_tensor_numel(e.item->param),
                       dtypes[e.dt].size, &need) ||
      e.end < e.begin || e.end - e.begin != need)
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' has data_offsets [%llu,%llu] "
                     "(%llu bytes) but its %s shape needs %llu bytes",
                     src->what, src->path, name, (unsigned long long)e.begin,
                     (unsigned long long)e.end,
                     (unsigned long long)(e.end >= e.begin ? e.end - e.begin
                                                           : 0),
                     dtypes[e.dt].name, (unsigned long long)need);
  seen[i] = 1;
  entries[i] = e;
  return REMAT_OK;
}

/* By file, then by first byte. */
static int cmp_begin(const void *a, const void *b) {
  const entry *x = a, *y = b;
  if (x->src != y->src)
    return (x->src > y->src) - (x->src < y->src);
  if (x->begin != y->begin)
    return (x->begin > y->begin) - (x->begin < y->begin);
  return (x->end > y->end) - (x->end < y->end);
}

/* Every item present, no two tensors of a file sharing bytes; `path` (the
 * file, or a sharded checkpoint's index) and `from` ("file", "index") for
 * the message about a missing one. */
static remat_status check_cover(const safet_load_req *req, const char *path,
                                const char *from, const entry *entries,
                                const int *seen) {
  const char *what = req->what;
  int n = req->nitems;
  for (int i = 0; i < n; i++)
    if (!seen[i] && !req->items[i].optional)
      return remat__fail(REMAT_ERR_SHAPE, "%s: '%s': the model's tensor '%s' "
                         "is missing from the %s", what, path,
                         req->items[i].name, from);
  size_t count = n > 0 ? (size_t)n : 0;
  entry *sorted = remat__malloc((count ? count : 1) * sizeof *sorted);
  if (sorted == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  memcpy(sorted, entries, count * sizeof *sorted);
  qsort(sorted, count, sizeof *sorted, cmp_begin);
  remat_status s = REMAT_OK;
  for (int i = 1; i < n && s == REMAT_OK; i++)
    if (sorted[i].src == sorted[i - 1].src &&
        sorted[i].begin < sorted[i - 1].end)
      s = LOAD_FAIL(REMAT_ERR_IO, "tensors '%s' and '%s' overlap in the data",
                    what, sorted[i].src->path, sorted[i - 1].item->name,
                    sorted[i].item->name);
  free(sorted);
  return s;
}

/* A checkpoint's optimizer state, which a weights-only load skips. */
static bool skipped(const safet_load_req *req, const name_index *items,
                    const cJSON *meta, const char *name) {
  if (req->ignored != NULL && req->ignored(file_key(req, name)))
    return true;
  return req->weights_only &&
         cJSON_GetObjectItemCaseSensitive(meta, SAFET_CHECKPOINT_KEY) &&
         find_item(items, name) < 0 &&
         (strncmp(name, SAFET_ADAM_M, strlen(SAFET_ADAM_M)) == 0 ||
          strncmp(name, SAFET_ADAM_V, strlen(SAFET_ADAM_V)) == 0);
}

/* A sharded checkpoint's index: the weight_map's tensors, each with the
 * shard the index puts it in and whether that shard holds it. */
typedef struct shard_map {
  const char *path; /* the index, quoted */
  remat__quoted shown;
  cJSON *root;
  const cJSON **tensors; /* [count]: ->string the name, ->valuestring
                            the shard's file name */
  int *shard_of, *found; /* [count] */
  int count;
  name_index by_name;  /* tensor name -> position */
  name_index by_shard; /* shard file name -> shard number */
  const char **shards; /* [nshards] file names */
  int nshards;
} shard_map;

/* In a sharded load, `item` of shard number `k` must be where the index
 * puts it. */
static remat_status check_mapped(const shard_map *map, int k,
                                 const source *src, const cJSON *item) {
  remat__quoted qn, qs;
  int t = name_index_find(&map->by_name, item->string);
  if (t < 0)
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' is not in the index's "
                     "weight_map", src->what, src->path,
                     remat__quote(&qn, item->string));
  if (map->shard_of[t] != k)
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' is in this shard but the "
                     "index puts it in '%s'", src->what, src->path,
                     remat__quote(&qn, item->string),
                     remat__quote(&qs, map->tensors[t]->valuestring));
  map->found[t] = 1;
  return REMAT_OK;
}

/* Checks every entry of a file's header against the file and the model
 * (and, in a sharded load, where the index puts it: shard number k). */
static remat_status check_entries(const safet_load_req *req,
                                  const name_index *items, const source *src,
                                  const cJSON *root, const shard_map *map,
                                  int k, entry *entries, int *seen) {
  const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
  remat_status s = REMAT_OK;
  const cJSON *item;
  cJSON_ArrayForEach(item, root) {
    if (s != REMAT_OK)
      break;
    if (item == meta)
      continue;
    if (map != NULL)
      s = check_mapped(map, k, src, item);
    if (s == REMAT_OK)
      s = check_entry(req, items, src, item,
                      skipped(req, items, meta, item->string), entries, seen);
  }
  return s;
}

/* The values a tensor brings: every one finite, and AdamW's second moments
 * (sums of squares) also >= 0, so that no step starts from a NaN, an Inf
 * or the square root of a negative number; for a parameter stored in bf16,
 * finite once rounded to bf16 too. */
static remat_status check_values(const entry *e, const unsigned char *data) {
  const source *src = e->src;
  const char *name = e->item->name;
  bool second = strncmp(name, SAFET_ADAM_V, strlen(SAFET_ADAM_V)) == 0;
  bool half = e->item->store == OP_BF16;
  size_t count = (size_t)(e->end - e->begin) / dtypes[e->dt].size;
  for (size_t i = 0; i < count; i++) {
    float v = src_value(e->dt, data, i);
    if (!isfinite(v) || (second && v < 0.0f))
      return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' holds %g at element %zu: "
                       "%s", src->what, src->path, name, (double)v, i,
                       second ? "a second moment must be finite and >= 0"
                              : "every value must be finite");
    if (half && !isfinite(bf16_to_f32(bf16_from_f32(v))))
      return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' holds %g at element %zu: "
                       "the frozen parameter is stored in bf16, where it "
                       "would be Inf: every value must be finite in bf16",
                       src->what, src->path, name, (double)v, i);
  }
  return REMAT_OK;
}

/* A [C,R] file tensor into its [R,C] parameter: file element c*R + r is
 * parameter element r*C + c. */
static void store_transposed(const entry *e, const unsigned char *data,
                             size_t count) {
  size_t rows = (size_t)remat_tensor_dim(e->item->param, 0);
  size_t cols = count / rows;
  bool half = e->item->store == OP_BF16;
  for (size_t i = 0; i < count; i++) {
    float v = src_value(e->dt, data, i);
    size_t to = (i % rows) * cols + i / rows;
    if (half)
      ((uint16_t *)e->item->data)[to] = bf16_from_f32(v);
    else
      ((float *)e->item->data)[to] = v;
  }
}

/* Writes a checked tensor into its item: the bits as they are where the
 * file's dtype is the storage's (F32 into f32, BF16 into a frozen
 * parameter stored in bf16), else each value converted to f32 (exact from
 * BF16 and F16) and, for bf16 storage, rounded. */
static void store_values(const entry *e, const unsigned char *data) {
  size_t count = (size_t)(e->end - e->begin) / dtypes[e->dt].size;
  bool half = e->item->store == OP_BF16;
  if (e->item->transpose) {
    store_transposed(e, data, count);
    return;
  }
  if ((e->dt == DT_F32 && !half) || (e->dt == DT_BF16 && half)) {
    memcpy(e->item->data, data, (size_t)(e->end - e->begin));
    return;
  }
  for (size_t i = 0; i < count; i++) {
    float v = src_value(e->dt, data, i);
    if (half)
      ((uint16_t *)e->item->data)[i] = bf16_from_f32(v);
    else
      ((float *)e->item->data)[i] = v;
  }
}

/* Reads every tensor's data (from its own file) into one buffer, checks
 * its values, then writes the items: a read that fails (a file changed
 * since it was checked) leaves every tensor as it was. The buffer is at
 * most the model's size as F32, whatever the files' sizes. */
static remat_status read_items(const safet_load_req *req,
                               const entry *entries) {
  int n = req->nitems;
  size_t total = 0;
  for (int i = 0; i < n; i++)
    if (!remat__add_size(total, (size_t)(entries[i].end - entries[i].begin),
                         &total))
      return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory",
                         req->what);
  unsigned char *buf = remat__malloc(total > 0 ? total : 1);
  if (buf == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory",
                       req->what);
  remat_status s = REMAT_OK;
  size_t at = 0;
  /* an optional item that the files lack has no entry (item NULL) */
  for (int i = 0; i < n && s == REMAT_OK; i++) {
    const entry *e = &entries[i];
    size_t bytes = (size_t)(e->end - e->begin);
    if (e->item != NULL)
      s = read_at(e->src, buf + at, bytes, e->src->data_start + e->begin);
    at += bytes;
  }
  at = 0;
  for (int i = 0; i < n && s == REMAT_OK; i++) {
    if (entries[i].item != NULL)
      s = check_values(&entries[i], buf + at);
    at += (size_t)(entries[i].end - entries[i].begin);
  }
  at = 0;
  for (int i = 0; i < n && s == REMAT_OK; i++) {
    if (entries[i].item != NULL)
      store_values(&entries[i], buf + at);
    at += (size_t)(entries[i].end - entries[i].begin);
  }
  free(buf);
  return s;
}

/* A load: one file, or the shards of an index (map != NULL), each open
 * with its header read. */
struct safet_loading {
  const safet_load_req *req;
  source *srcs;  /* [nsrc] */
  cJSON **roots; /* [nsrc] the headers */
  int nsrc;
  shard_map *map;
  entry *entries;
  int *seen;
  name_index items; /* req->items by name */
};

/* A new load of `nsrc` files (their fds -1 until opened). */
static remat_status loading_new(const safet_load_req *req, int nsrc,
                                safet_loading **out) {
  safet_loading *ld = remat__calloc(1, sizeof *ld);
  *out = ld;
  if (ld == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", req->what);
  ld->req = req;
  size_t n = req->nitems > 0 ? (size_t)req->nitems : 1;
  ld->srcs = remat__calloc((size_t)(nsrc > 0 ? nsrc : 1), sizeof *ld->srcs);
  ld->roots = remat__calloc((size_t)(nsrc > 0 ? nsrc : 1), sizeof *ld->roots);
  ld->entries = remat__calloc(n, sizeof *ld->entries);
  ld->seen = remat__calloc(n, sizeof *ld->seen);
  bool indexed = ld->srcs != NULL && ld->roots != NULL &&
                 ld->entries != NULL && ld->seen != NULL;
  for (int i = 0; indexed && i < nsrc; i++)
    ld->srcs[i].fd = -1;
  ld->nsrc = indexed ? nsrc : 0;
  for (int i = 0; indexed && i < req->nitems; i++)
    indexed = name_index_add(&ld->items, req->items[i].name, i);
  if (!indexed)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", req->what);
  return REMAT_OK;
}

remat_status safet_load_open(const char *path, const safet_load_req *req,
                             safet_loading **out, const cJSON **meta) {
  *meta = NULL;
  remat_status s = loading_new(req, 1, out);
  if (s == REMAT_OK)
    s = open_source(path, req->what, &(*out)->srcs[0]);
  if (s == REMAT_OK)
    s = read_header(&(*out)->srcs[0], &(*out)->roots[0]);
  if (s == REMAT_OK)
    *meta = cJSON_GetObjectItemCaseSensitive((*out)->roots[0],
                                             "__metadata__");
  return s;
}

remat_status safet_read_header(const char *path, const char *what,
                               cJSON **root, const cJSON **meta) {
  source src;
  *root = NULL;
  *meta = NULL;
  remat_status s = open_source(path, what, &src);
  if (s == REMAT_OK)
    s = read_header(&src, root);
  if (src.fd >= 0)
    close(src.fd);
  if (s == REMAT_OK)
    *meta = cJSON_GetObjectItemCaseSensitive(*root, "__metadata__");
  return s;
}

/* In a sharded load, every tensor of the weight_map held by its shard. */
static remat_status check_map_found(const safet_loading *ld) {
  const shard_map *map = ld->map;
  for (int t = 0; map != NULL && t < map->count; t++)
    if (!map->found[t]) {
      remat__quoted qn, qs;
      return LOAD_FAIL(REMAT_ERR_IO, "the index puts tensor '%s' in '%s', "
                       "which does not hold it", ld->req->what, map->path,
                       remat__quote(&qn, map->tensors[t]->string),
                       remat__quote(&qs, map->tensors[t]->valuestring));
    }
  return REMAT_OK;
}

remat_status safet_load_read(safet_loading *ld) {
  remat_status s = REMAT_OK;
  for (int k = 0; k < ld->nsrc && s == REMAT_OK; k++)
    s = check_entries(ld->req, &ld->items, &ld->srcs[k], ld->roots[k],
                      ld->map, k, ld->entries, ld->seen);
  if (s == REMAT_OK)
    s = check_map_found(ld);
  if (s == REMAT_OK)
    s = check_cover(ld->req, ld->map ? ld->map->path : ld->srcs[0].path,
                    ld->map ? "index" : "file", ld->entries, ld->seen);
  if (s == REMAT_OK)
    s = read_items(ld->req, ld->entries);
  return s;
}

static void shard_map_free(shard_map *map) {
  if (map == NULL)
    return;
  cJSON_Delete(map->root);
  free(map->tensors);
  free(map->shard_of);
  free(map->found);
  free(map->shards);
  name_index_free(&map->by_name);
  name_index_free(&map->by_shard);
  free(map);
}

void safet_load_close(safet_loading *ld) {
  if (ld == NULL)
    return;
  for (int i = 0; i < ld->nsrc; i++) {
    if (ld->srcs[i].fd >= 0)
      close(ld->srcs[i].fd);
    cJSON_Delete(ld->roots[i]);
  }
  free(ld->srcs);
  free(ld->roots);
  shard_map_free(ld->map);
  free(ld->entries);
  free(ld->seen);
  name_index_free(&ld->items);
  free(ld);
}

/* ---- sharded checkpoints: model.safetensors.index.json ---- */

#define INDEX_MAX ((uint64_t)16 << 20) /* bytes of an index */

/* A load takes PATH as a sharded checkpoint's index when it ends in
 * ".json". */
static bool is_index(const char *path) {
  size_t n = strlen(path);
  return n >= 5 && strcmp(path + n - 5, ".json") == 0;
}

/* A shard is named by a file name in the index's directory: not empty,
 * no '/', not "." or "..". */
static bool shard_name_ok(const char *name) {
  return name[0] != '\0' && strchr(name, '/') == NULL &&
         strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* Reads the index at `path` (a regular file of at most INDEX_MAX bytes)
 * and parses it. */
static remat_status read_index(const char *path, const char *what,
                               shard_map *map) {
  source src;
  remat_status s = open_source(path, what, &src);
  char *text = NULL;
  if (s == REMAT_OK && src.size > INDEX_MAX)
    s = LOAD_FAIL(REMAT_ERR_IO, "the index is %llu bytes, more than the "
                  "%llu-byte (16 MiB) limit on an index", what, map->path,
                  (unsigned long long)src.size,
                  (unsigned long long)INDEX_MAX);
  if (s == REMAT_OK && (text = remat__malloc(src.size + 1)) == NULL)
    s = remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  if (s == REMAT_OK)
    s = read_at(&src, text, (size_t)src.size, 0);
  if (src.fd >= 0)
    close(src.fd);
  if (s == REMAT_OK)
    map->root = cJSON_ParseWithLength(text, (size_t)src.size);
  free(text);
  return s;
}

/* Checks the weight_map: each tensor once, with a shard file name; numbers
 * the shards in order of first mention. */
static remat_status index_shards(const char *what, shard_map *map) {
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(map->root, "weight_map");
  if (!cJSON_IsObject(map->root) || !cJSON_IsObject(wm))
    return LOAD_FAIL(REMAT_ERR_IO, "the index is not a JSON object with a "
                     "\"weight_map\" object", what, map->path);
  int count = cJSON_GetArraySize(wm);
  size_t n = count > 0 ? (size_t)count : 1;
  map->tensors = remat__calloc(n, sizeof *map->tensors);
  map->shard_of = remat__calloc(n, sizeof *map->shard_of);
  map->found = remat__calloc(n, sizeof *map->found);
  map->shards = remat__calloc(n, sizeof *map->shards);
  if (!map->tensors || !map->shard_of || !map->found || !map->shards)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  const cJSON *t;
  cJSON_ArrayForEach(t, wm) {
    remat__quoted qn, qs;
    const char *name = remat__quote(&qn, t->string);
    if (!cJSON_IsString(t))
      return LOAD_FAIL(REMAT_ERR_IO, "the index's weight_map gives tensor "
                       "'%s' a shard that is not a string", what, map->path,
                       name);
    if (name_index_find(&map->by_name, t->string) >= 0)
      return LOAD_FAIL(REMAT_ERR_IO, "the index's weight_map names tensor "
                       "'%s' twice", what, map->path, name);
    if (!shard_name_ok(t->valuestring))
      return LOAD_FAIL(REMAT_ERR_IO, "the index puts tensor '%s' in '%s', "
                       "which is not a file name in the index's directory "
                       "(no '/', not '.' or '..')", what, map->path, name,
                       remat__quote(&qs, t->valuestring));
    int k = name_index_find(&map->by_shard, t->valuestring);
    if (k < 0) {
      k = map->nshards;
      map->shards[map->nshards++] = t->valuestring;
      if (!name_index_add(&map->by_shard, t->valuestring, k))
        return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory",
                           what);
    }
    if (!name_index_add(&map->by_name, t->string, map->count))
      return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    map->tensors[map->count] = t;
    map->shard_of[map->count++] = k;
  }
  return REMAT_OK;
}

/* Opens every shard of the index at `path` (beside it) and reads its
 * header. */
static remat_status index_open(const char *path, const safet_load_req *req,
                               safet_loading **out) {
  const char *what = req->what;
  shard_map *map = remat__calloc(1, sizeof *map);
  if (map == NULL) {
    *out = NULL;
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  }
  map->path = remat__quote(&map->shown, path);
  remat_status s = read_index(path, what, map);
  if (s == REMAT_OK)
    s = index_shards(what, map);
  remat_status t = loading_new(req, s == REMAT_OK ? map->nshards : 0, out);
  if (*out != NULL)
    (*out)->map = map;
  else
    shard_map_free(map);
  if (s != REMAT_OK || t != REMAT_OK)
    return s != REMAT_OK ? s : t;
  const char *slash = strrchr(path, '/');
  size_t dir = slash != NULL ? (size_t)(slash - path) + 1 : 0;
  for (int k = 0; k < map->nshards && s == REMAT_OK; k++) {
    size_t len = 0;
    char *shard = NULL;
    if (remat__add_size(dir, strlen(map->shards[k]) + 1, &len))
      shard = remat__malloc(len);
    if (shard == NULL)
      return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    memcpy(shard, path, dir);
    memcpy(shard + dir, map->shards[k], len - dir);
    s = open_source(shard, what, &(*out)->srcs[k]);
    if (s == REMAT_OK)
      s = read_header(&(*out)->srcs[k], &(*out)->roots[k]);
    free(shard);
  }
  return s;
}

remat_status safet_load_weights(remat_graph *g, const char *path,
                                const char *what,
                                remat_status (*rename)(safet_item *items,
                                                       int n, const char *what),
                                const char *prefix,
                                bool (*ignored)(const char *name)) {
  remat_status s = safet_hold(g, path, what);
  if (s != REMAT_OK)
    return s;
  safet_load_req req = {.what = what, .weights_only = true,
                        .prefix = prefix, .ignored = ignored};
  safet_loading *ld = NULL;
  const cJSON *meta;
  s = safet_params(g, false, 0, &req.items, &req.nitems, what);
  if (s == REMAT_OK && rename != NULL)
    s = rename(req.items, req.nitems, what);
  for (int i = 0; s == REMAT_OK && i < req.nitems; i++)
    for (int32_t k = 0; k < g->nlora; k++) /* a base model's file */
      if (req.items[i].param->id == g->lora[k].a ||
          req.items[i].param->id == g->lora[k].b)
        req.items[i].optional = true;
  if (s == REMAT_OK)
    s = is_index(path) ? index_open(path, &req, &ld)
                       : safet_load_open(path, &req, &ld, &meta);
  if (s == REMAT_OK)
    s = safet_load_read(ld);
  if (s == REMAT_OK)
    step_state_params_loaded(&g->step->state);
  safet_load_close(ld);
  free(req.items);
  safet_release(g);
  return s;
}

remat_status remat_load_safetensors(remat_graph *g, const char *path) {
  return safet_load_weights(g, path, "remat_load_safetensors", NULL, NULL,
                            NULL);
}
