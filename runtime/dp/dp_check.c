/* What the ranks of a data-parallel step must agree on (dp_check.h): the
 * step's description with its first difference, and the values each step
 * shares, packed for one MPI_MAX. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/dp/dp_check.h"

/* ---- the description ---- */

bool dp_broadcast_buffer(const compiled_step *c, int32_t b) {
  const plan_buffer *buf = &c->low.bufs[b];
  bool param = buf->tensor >= 0 && c->low.value_buf[buf->tensor] == b &&
               c->g->tensors[buf->tensor]->kind == TENSOR_PARAM;
  return (param || buf->cat == REMAT_MEM_OPTIMIZER) && buf->persistent;
}

/* Appends one formatted line; false when out of memory or past
 * DP_MAX_DESCRIPTION (t->len is then past it). */
static bool add_line(dp_text *t, const char *fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    return false;
  size_t len = strlen(line);
  line[len++] = '\n';
  if ((int64_t)(t->len + len) > DP_MAX_DESCRIPTION) {
    t->len += len;
    return false;
  }
  if (t->len + len + 1 > t->cap) {
    size_t cap = t->cap > 0 ? t->cap : 4096;
    while (cap < t->len + len + 1)
      cap *= 2;
    char *grown = remat__realloc(t->text, cap);
    if (grown == NULL)
      return false;
    t->text = grown;
    t->cap = cap;
  }
  memcpy(t->text + t->len, line, len);
  t->len += len;
  t->text[t->len] = '\0';
  return true;
}

/* "[32,96]" */
static const char *dims(const op_shape *s, char *out, size_t size) {
  size_t n = (size_t)snprintf(out, size, "[");
  for (int d = 0; d < s->ndim && n < size; d++)
    n += (size_t)snprintf(out + n, size - n, "%s%lld", d > 0 ? "," : "",
                          (long long)s->dim[d]);
  if (n < size)
    snprintf(out + n, size - n, "]");
  return out;
}

static bool describe_optimizer(const compiled_step *c, dp_text *t) {
  const remat_optimizer *o = &c->opt;
  if (!c->has_opt)
    return add_line(t, "optimizer: none");
  if (o->kind == REMAT_OPT_SGD)
    return add_line(t, "optimizer: sgd") &&
           add_line(t, "weight decay: %.9g", (double)o->weight_decay);
  return add_line(t, "optimizer: adamw") &&
         add_line(t, "adamw beta1: %.9g", (double)o->beta1) &&
         add_line(t, "adamw beta2: %.9g", (double)o->beta2) &&
         add_line(t, "adamw eps: %.9g", (double)o->eps) &&
         add_line(t, "weight decay: %.9g", (double)o->weight_decay);
}

static bool describe_params(const compiled_step *c, dp_text *t) {
  const remat_graph *g = c->g;
  int n = 0;
  for (int32_t i = 0; i < g->ntensors; i++)
    n += g->tensors[i]->kind == TENSOR_PARAM;
  bool ok = add_line(t, "parameter count: %d", n);
  for (int32_t i = 0, k = 0; ok && i < g->ntensors; i++) {
    const remat_tensor *p = g->tensors[i];
    char shape[8 + OP_MAX_DIMS * 21];
    if (p->kind == TENSOR_PARAM)
      ok = add_line(t, "parameter %d: '%s' %s %s%s", k++, p->name,
                    op_dtype_name(p->store),
                    dims(&p->shape, shape, sizeof shape),
                    p->frozen ? " frozen" : "");
  }
  return ok;
}

/* The collectives of a step: the buckets (the agreement is one fixed
 * item) and the first step's broadcast. */
static bool describe_collectives(const compiled_step *c, dp_text *t) {
  bool ok = add_line(t, "allreduce buckets: %d", c->dp.nbuckets);
  for (int i = 0; ok && i < c->dp.nbuckets; i++)
    ok = add_line(t, "allreduce bucket %d: %lld floats", i,
                  (long long)c->dp.buckets[i].numel);
  int nbufs = 0;
  int64_t bytes = 0;
  for (int32_t b = 0; b < c->low.nbufs; b++)
    if (dp_broadcast_buffer(c, b)) {
      nbufs++;
      bytes += c->low.bufs[b].bytes;
    }
  return ok && add_line(t, "first step's broadcast: %d buffers, %lld bytes",
                        nbufs, (long long)bytes);
}

remat_status dp_describe_step(const compiled_step *c, dp_text *out) {
  memset(out, 0, sizeof *out);
  bool ok =
      add_line(out, "precision: %s",
               c->g->rt->config.precision == REMAT_PRECISION_BF16 ? "bf16"
                                                                  : "f32") &&
      describe_optimizer(c, out) && describe_params(c, out) &&
      describe_collectives(c, out);
  if (ok)
    return REMAT_OK;
  remat_status s = (int64_t)out->len > DP_MAX_DESCRIPTION
                       ? REMAT_ERR_LIMIT
                       : REMAT_ERR_OUT_OF_MEMORY;
  dp_text_free(out);
  return s;
}

void dp_text_free(dp_text *t) {
  free(t->text);
  memset(t, 0, sizeof *t);
}

uint64_t dp_text_hash(const char *s, size_t len) {
  uint64_t h = UINT64_C(1469598103934665603);
  for (size_t i = 0; i < len; i++)
    h = (h ^ (unsigned char)s[i]) * UINT64_C(1099511628211);
  return h;
}

/* The line of `s` (len bytes) at *pos, without its '\n', as [start, n);
 * *pos moves past it. n is 0 at the end. */
static const char *next_line(const char *s, size_t len, size_t *pos,
                             size_t *n) {
  const char *start = s + *pos;
  size_t end = *pos;
  while (end < len && s[end] != '\n')
    end++;
  *n = end - *pos;
  *pos = end < len ? end + 1 : end;
  return start;
}

/* The length of a line's key (before ": "); n when it has none. */
static size_t key_length(const char *line, size_t n) {
  for (size_t i = 0; i + 1 < n; i++)
    if (line[i] == ':' && line[i + 1] == ' ')
      return i;
  return n;
}

bool dp_first_difference(const char *a, size_t alen, int rank_a, const char *b,
                         size_t blen, int rank_b, char *out, size_t size) {
  size_t pa = 0, pb = 0;
  while (pa < alen || pb < blen) {
    size_t na, nb;
    const char *la = next_line(a, alen, &pa, &na);
    const char *lb = next_line(b, blen, &pb, &nb);
    if (na == nb && memcmp(la, lb, na) == 0)
      continue;
    size_t ka = key_length(la, na), kb = key_length(lb, nb);
    if (ka < na && kb < nb && ka == kb && memcmp(la, lb, ka) == 0)
      snprintf(out, size, "%.*s is %.*s on rank %d and %.*s on rank %d",
               (int)ka, la, (int)(na - ka - 2), la + ka + 2, rank_a,
               (int)(nb - kb - 2), lb + kb + 2, rank_b);
    else
      snprintf(out, size, "%.*s on rank %d and %.*s on rank %d",
               na > 0 ? (int)na : 7, na > 0 ? la : "nothing", rank_a,
               nb > 0 ? (int)nb : 7, nb > 0 ? lb : "nothing", rank_b);
    return true;
  }
  return false;
}

/* ---- the values each step shares ---- */

static int64_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (int64_t)u;
}

static float bits_float(int64_t bits) {
  uint32_t u = (uint32_t)bits;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

void dp_shared_pack(int64_t *slots, float lr, float clip, bool accumulate,
                    int64_t micro_steps, int64_t updates) {
  int64_t v[DP_NSHARED] = {[DP_SHARED_LR] = float_bits(lr),
                           [DP_SHARED_CLIP] = float_bits(clip),
                           [DP_SHARED_ACCUMULATE] = accumulate,
                           [DP_SHARED_MICRO_STEPS] = micro_steps,
                           [DP_SHARED_UPDATES] = updates};
  for (int k = 0; k < DP_NSHARED; k++) {
    slots[2 * k] = v[k];
    slots[2 * k + 1] = -v[k];
  }
}

/* Two floats that differ, in as few digits as show the difference. */
static void two_floats(float lo, float hi, char *a, char *b, size_t size) {
  snprintf(a, size, "%g", (double)lo);
  snprintf(b, size, "%g", (double)hi);
  if (strcmp(a, b) == 0) {
    snprintf(a, size, "%.9g", (double)lo);
    snprintf(b, size, "%.9g", (double)hi);
  }
}

bool dp_shared_differ(const int64_t *slots, char *out, size_t size) {
  static const char *const what[DP_NSHARED] = {
      [DP_SHARED_LR] = "the learning rate",
      [DP_SHARED_CLIP] = "the clipping norm (remat_set_clip)",
      [DP_SHARED_ACCUMULATE] = "",
      /* one literal in parentheses: clang's -Wstring-concatenation */
      [DP_SHARED_MICRO_STEPS] = ("the count of micro-steps accumulated "
                                 "since the last update"),
      [DP_SHARED_UPDATES] = "the count of updates applied"};
  for (int k = 0; k < DP_NSHARED; k++) {
    int64_t hi = slots[2 * k], lo = -slots[2 * k + 1];
    if (lo == hi)
      continue;
    char a[32], b[32];
    if (k == DP_SHARED_ACCUMULATE) {
      snprintf(out, size,
               "some ranks called remat_step and others "
               "remat_accumulate");
      return true;
    }
    if (k == DP_SHARED_LR || k == DP_SHARED_CLIP)
      two_floats(bits_float(lo), bits_float(hi), a, b, sizeof a);
    else {
      snprintf(a, sizeof a, "%lld", (long long)lo);
      snprintf(b, sizeof b, "%lld", (long long)hi);
    }
    snprintf(out, size,
             "%s is not the same on every rank (smallest %s, largest %s)",
             what[k], a, b);
    return true;
  }
  return false;
}
