/* Saving and loading parameters (and writing gradients) in the safetensors
 * format: an 8-byte little-endian header length, a JSON header (through
 * cJSON) naming each tensor's dtype, shape and data offsets, then the raw
 * little-endian data. Loading checks the whole file before it writes any
 * parameter. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runtime/internal.h"

#define HEADER_MAX ((uint64_t)100 << 20) /* the safetensors package's limit */

typedef remat_status (*read_fn)(remat_graph *g, remat_tensor *t, float *dst,
                                size_t bytes);

static remat_status read_value(remat_graph *g, remat_tensor *t, float *dst,
                               size_t bytes) {
  return remat_read(g, t, dst, bytes);
}

static remat_status check_graph(remat_graph *g, const char *path,
                                const char *what) {
  if (g == NULL || path == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG, "%s: graph and path must not be "
                                              "NULL", what);
  if (!g->compiled)
    return remat__fail(REMAT_ERR_STATE,
                       "%s: the graph is not compiled: call remat_compile "
                       "first", what);
  return REMAT_OK;
}

/* "[3,4]" */
static void format_shape(char *buf, size_t len, int ndim, const int64_t *dims) {
  size_t n = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < ndim && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? "," : "",
                          (long long)dims[i]);
  if (n < len)
    snprintf(buf + n, len - n, "]");
}

/* ---- saving ---- */

/* The JSON header of all parameters, laid out back to back in creation
 * order; *data_bytes gets the size of the data section. */
static cJSON *build_header(remat_graph *g, uint64_t *data_bytes) {
  cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject();
  if (root == NULL || meta == NULL ||
      !cJSON_AddItemToObject(root, "__metadata__", meta)) {
    cJSON_Delete(root);
    cJSON_Delete(meta);
    return NULL;
  }
  cJSON_AddStringToObject(meta, "format", "pt");
  cJSON_AddStringToObject(meta, "producer", "remat");
  uint64_t offset = 0;
  for (int i = 0; i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    cJSON *entry = cJSON_AddObjectToObject(root, remat_tensor_name(p));
    cJSON *shape = cJSON_AddArrayToObject(entry, "shape");
    cJSON *offsets = cJSON_AddArrayToObject(entry, "data_offsets");
    if (cJSON_AddStringToObject(entry, "dtype", "F32") == NULL ||
        shape == NULL || offsets == NULL) {
      cJSON_Delete(root);
      return NULL;
    }
    for (int d = 0; d < remat_tensor_ndim(p); d++)
      cJSON_AddItemToArray(shape,
                           cJSON_CreateNumber((double)remat_tensor_dim(p, d)));
    uint64_t bytes = (uint64_t)remat_tensor_numel(p) * sizeof(float);
    cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
    cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)(offset + bytes)));
    offset += bytes;
  }
  *data_bytes = offset;
  return root;
}

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Header length (little-endian u64), the JSON padded with spaces to a
 * multiple of 8, then each parameter's data. */
static remat_status write_body(remat_graph *g, int fd, const char *json,
                               read_fn read, const char *what,
                               const char *tmp) {
  size_t json_len = strlen(json), padded = (json_len + 7) / 8 * 8;
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; i++)
    len_bytes[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  char *header = remat__malloc(padded);
  if (header == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  memset(header, ' ', padded);
  memcpy(header, json, json_len);
  int bad = write_all(fd, len_bytes, 8) || write_all(fd, header, padded);
  free(header);
  for (int i = 0; !bad && i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    size_t bytes = (size_t)remat_tensor_numel(p) * sizeof(float);
    float *buf = remat__malloc(bytes);
    if (buf == NULL)
      return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    remat_status s = read(g, p, buf, bytes);
    if (s == REMAT_OK)
      bad = write_all(fd, buf, bytes);
    free(buf);
    if (s != REMAT_OK)
      return s;
  }
  if (bad || fsync(fd) != 0)
    return remat__fail(REMAT_ERR_IO, "%s: cannot write '%s': %s", what, tmp,
                       strerror(errno));
  return REMAT_OK;
}

static remat_status save(remat_graph *g, const char *path, read_fn read,
                         const char *what) {
  remat_status s = check_graph(g, path, what);
  if (s != REMAT_OK)
    return s;
  uint64_t data_bytes = 0;
  cJSON *root = build_header(g, &data_bytes);
  char *json = root ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (json == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  size_t tmp_len = strlen(path) + 5;
  char *tmp = remat__malloc(tmp_len);
  if (tmp == NULL) {
    cJSON_free(json);
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  }
  snprintf(tmp, tmp_len, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    s = remat__fail(REMAT_ERR_IO, "%s: cannot create '%s': %s", what, tmp,
                    strerror(errno));
  else
    s = write_body(g, fd, json, read, what, tmp);
  if (fd >= 0 && close(fd) != 0 && s == REMAT_OK)
    s = remat__fail(REMAT_ERR_IO, "%s: cannot write '%s': %s", what, tmp,
                    strerror(errno));
  if (s == REMAT_OK && rename(tmp, path) != 0)
    s = remat__fail(REMAT_ERR_IO, "%s: cannot rename '%s' to '%s': %s", what,
                    tmp, path, strerror(errno));
  if (s != REMAT_OK && fd >= 0)
    unlink(tmp);
  free(tmp);
  cJSON_free(json);
  return s;
}

remat_status remat_save_safetensors(remat_graph *g, const char *path) {
  return save(g, path, read_value, "remat_save_safetensors");
}

remat_status remat_save_grads_safetensors(remat_graph *g, const char *path) {
  return save(g, path, remat_read_grad, "remat_save_grads_safetensors");
}

/* ---- loading ---- */

typedef struct file_bytes {
  unsigned char *data;
  uint64_t size;
} file_bytes;

static remat_status read_file(const char *path, file_bytes *out) {
  const char *what = "remat_load_safetensors";
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return remat__fail(REMAT_ERR_IO, "%s: cannot open '%s': %s", what, path,
                       strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return remat__fail(REMAT_ERR_IO, "%s: '%s' is not a regular file", what,
                       path);
  }
  out->size = (uint64_t)st.st_size;
  out->data = remat__malloc(out->size ? out->size : 1);
  if (out->data == NULL) {
    fclose(f);
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  }
  size_t got = fread(out->data, 1, out->size, f);
  fclose(f);
  if (got != out->size) {
    free(out->data);
    return remat__fail(REMAT_ERR_IO, "%s: cannot read '%s'", what, path);
  }
  return REMAT_OK;
}

/* One tensor of the file matched to a parameter. */
typedef struct entry {
  remat_tensor *param;
  uint64_t begin, end;
} entry;

static int json_uint(const cJSON *item, uint64_t *out) {
  if (!cJSON_IsNumber(item))
    return 0;
  double v = item->valuedouble;
  if (!(v >= 0.0 && v <= 9007199254740992.0) || v != floor(v))
    return 0;
  *out = (uint64_t)v;
  return 1;
}

static int find_param(remat_graph *g, const char *name) {
  for (int i = 0; i < remat_num_params(g); i++)
    if (strcmp(remat_tensor_name(remat_param_at(g, i)), name) == 0)
      return i;
  return -1;
}

#define LOAD_FAIL(status, ...)                                                 \
  remat__fail(status, "remat_load_safetensors: '%s': " __VA_ARGS__)

/* Checks one header entry against the model: dtype, shape, offsets. */
static remat_status check_entry(remat_graph *g, const char *path,
                                const cJSON *item, uint64_t data_size,
                                entry *entries, int *seen) {
  const char *name = item->string;
  if (!cJSON_IsObject(item))
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' is not a JSON object", path,
                     name);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) ||
      !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
      cJSON_GetArraySize(shape) > REMAT_MAX_DIMS)
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' needs a dtype string, a shape "
                     "array of at most %d dims and two data_offsets",
                     path, name, REMAT_MAX_DIMS);
  int64_t dims[REMAT_MAX_DIMS];
  int ndim = 0;
  const cJSON *d;
  cJSON_ArrayForEach(d, shape) {
    uint64_t v;
    if (!json_uint(d, &v) || v > ((uint64_t)1 << 40))
      return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' has a shape that is not a "
                       "list of whole numbers", path, name);
    dims[ndim++] = (int64_t)v;
  }
  uint64_t begin, end;
  if (!json_uint(cJSON_GetArrayItem(offs, 0), &begin) ||
      !json_uint(cJSON_GetArrayItem(offs, 1), &end))
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' has data_offsets that are not "
                     "whole numbers", path, name);
  int i = find_param(g, name);
  if (i < 0)
    return LOAD_FAIL(REMAT_ERR_SHAPE, "tensor '%s' is not a parameter of the "
                     "model", path, name);
  if (seen[i])
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' appears twice", path, name);
  if (strcmp(dtype->valuestring, "F32") != 0)
    return LOAD_FAIL(REMAT_ERR_SHAPE, "tensor '%s' has dtype %s, expected F32",
                     path, name, dtype->valuestring);
  remat_tensor *p = remat_param_at(g, i);
  int64_t model_dims[REMAT_MAX_DIMS];
  int same = ndim == remat_tensor_ndim(p);
  for (int k = 0; k < remat_tensor_ndim(p); k++) {
    model_dims[k] = remat_tensor_dim(p, k);
    same = same && (k >= ndim || dims[k] == model_dims[k]);
  }
  if (!same) {
    char fs[96], ms[96];
    format_shape(fs, sizeof fs, ndim, dims);
    format_shape(ms, sizeof ms, remat_tensor_ndim(p), model_dims);
    return LOAD_FAIL(REMAT_ERR_SHAPE, "tensor '%s' has shape %s in the file "
                     "but %s in the model", path, name, fs, ms);
  }
  uint64_t need = (uint64_t)remat_tensor_numel(p) * sizeof(float);
  if (end < begin || end - begin != need)
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' has data_offsets [%llu,%llu] "
                     "(%llu bytes) but its F32 shape needs %llu bytes",
                     path, name, (unsigned long long)begin,
                     (unsigned long long)end,
                     (unsigned long long)(end >= begin ? end - begin : 0),
                     (unsigned long long)need);
  if (end > data_size)
    return LOAD_FAIL(REMAT_ERR_IO, "tensor '%s' has data_offsets [%llu,%llu] "
                     "beyond the %llu bytes of data (truncated file?)",
                     path, name, (unsigned long long)begin,
                     (unsigned long long)end, (unsigned long long)data_size);
  seen[i] = 1;
  entries[i] = (entry){.param = p, .begin = begin, .end = end};
  return REMAT_OK;
}

static int cmp_begin(const void *a, const void *b) {
  const entry *x = a, *y = b;
  if (x->begin != y->begin)
    return (x->begin > y->begin) - (x->begin < y->begin);
  return (x->end > y->end) - (x->end < y->end);
}

/* Every parameter present, no two tensors sharing bytes. */
static remat_status check_cover(remat_graph *g, const char *path,
                                entry *entries, const int *seen) {
  int n = remat_num_params(g);
  for (int i = 0; i < n; i++)
    if (!seen[i])
      return LOAD_FAIL(REMAT_ERR_SHAPE, "the model's tensor '%s' is missing "
                       "from the file", path,
                       remat_tensor_name(remat_param_at(g, i)));
  size_t count = n > 0 ? (size_t)n : 0;
  entry *sorted = remat__malloc((count ? count : 1) * sizeof *sorted);
  if (sorted == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "remat_load_safetensors: out of memory");
  memcpy(sorted, entries, count * sizeof *sorted);
  qsort(sorted, count, sizeof *sorted, cmp_begin);
  remat_status s = REMAT_OK;
  for (int i = 1; i < n && s == REMAT_OK; i++)
    if (sorted[i].begin < sorted[i - 1].end)
      s = LOAD_FAIL(REMAT_ERR_IO, "tensors '%s' and '%s' overlap in the data",
                    path, remat_tensor_name(sorted[i - 1].param),
                    remat_tensor_name(sorted[i].param));
  free(sorted);
  return s;
}

/* Parses the header and checks every entry against the model. */
static remat_status check_file(remat_graph *g, const char *path,
                               const file_bytes *f, entry *entries, int *seen,
                               uint64_t *data_start) {
  if (f->size < 8)
    return LOAD_FAIL(REMAT_ERR_IO, "truncated: %llu bytes, shorter than the "
                     "8-byte header length", path,
                     (unsigned long long)f->size);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++)
    hlen |= (uint64_t)f->data[i] << (8 * i);
  if (hlen > f->size - 8 || hlen > HEADER_MAX)
    return LOAD_FAIL(REMAT_ERR_IO, "header length %llu exceeds the %llu bytes "
                     "after it (truncated or not a safetensors file)",
                     path, (unsigned long long)hlen,
                     (unsigned long long)(f->size - 8));
  cJSON *root = cJSON_ParseWithLength((const char *)f->data + 8, (size_t)hlen);
  if (root == NULL || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return LOAD_FAIL(REMAT_ERR_IO, "the header is not a JSON object", path);
  }
  *data_start = 8 + hlen;
  remat_status s = REMAT_OK;
  const cJSON *item;
  cJSON_ArrayForEach(item, root) {
    if (s != REMAT_OK)
      break;
    if (item->string != NULL && strcmp(item->string, "__metadata__") == 0)
      continue;
    s = check_entry(g, path, item, f->size - *data_start, entries, seen);
  }
  cJSON_Delete(root);
  if (s == REMAT_OK)
    s = check_cover(g, path, entries, seen);
  return s;
}

remat_status remat_load_safetensors(remat_graph *g, const char *path) {
  remat_status s = check_graph(g, path, "remat_load_safetensors");
  if (s != REMAT_OK)
    return s;
  file_bytes f = {0};
  s = read_file(path, &f);
  if (s != REMAT_OK)
    return s;
  int n = remat_num_params(g);
  entry *entries = remat__calloc((size_t)(n ? n : 1), sizeof *entries);
  int *seen = remat__calloc((size_t)(n ? n : 1), sizeof *seen);
  uint64_t data_start = 0;
  if (entries == NULL || seen == NULL)
    s = remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                    "remat_load_safetensors: out of memory");
  else
    s = check_file(g, path, &f, entries, seen, &data_start);
  /* Every check passed: only now are parameters written, through one
   * aligned buffer allocated first (offsets in the file need not be). */
  size_t max_bytes = 1;
  for (int i = 0; i < n && s == REMAT_OK; i++)
    if (entries[i].end - entries[i].begin > max_bytes)
      max_bytes = (size_t)(entries[i].end - entries[i].begin);
  float *buf = s == REMAT_OK ? remat__malloc(max_bytes) : NULL;
  if (s == REMAT_OK && buf == NULL)
    s = remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                    "remat_load_safetensors: out of memory");
  for (int i = 0; i < n && s == REMAT_OK; i++) {
    size_t bytes = (size_t)(entries[i].end - entries[i].begin);
    memcpy(buf, f.data + data_start + entries[i].begin, bytes);
    s = remat_write(g, entries[i].param, buf, bytes);
  }
  free(buf);
  free(entries);
  free(seen);
  free(f.data);
  return s;
}
