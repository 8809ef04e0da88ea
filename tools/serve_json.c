/* remat-serve's request bodies: JSON (cJSON) checked field by field into
 * generate, job and load options, with a message for every refusal that
 * names the field, what it was and what is accepted. Untrusted input: the
 * fuzz target tests/fuzz/fuzz_serve.c runs these on arbitrary bytes. */
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tools/serve.h"

/* The most steps and checkpoint interval of a job. */
#define JOB_STEPS_MAX 1000000
/* Seeds are integers a double holds exactly. */
#define SEED_MAX 9007199254740992.0

static int refuse(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return -1;
}

/* "a string", "an array", ... for messages. */
static const char *kind_of(const cJSON *v) {
  if (cJSON_IsString(v))
    return "a string";
  if (cJSON_IsNumber(v))
    return "a number";
  if (cJSON_IsBool(v))
    return "a boolean";
  if (cJSON_IsNull(v))
    return "null";
  if (cJSON_IsArray(v))
    return "an array";
  return "an object";
}

/* Parses the body as one JSON object whose fields are all in `accepted`
 * (a NULL-ended list), each once. */
static cJSON *parse_object(const char *body, size_t len, const char *endpoint,
                           const char *const *accepted, const char *list,
                           char *err, size_t err_len) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
  if (root == NULL) {
    size_t at = end != NULL && end >= body ? (size_t)(end - body) : 0;
    refuse(err, err_len, "the body is not valid JSON (at byte %zu of %zu): "
           "%s takes one JSON object with the fields %s", at, len, endpoint,
           list);
    return NULL;
  }
  size_t at = end != NULL ? (size_t)(end - body) : len;
  while (at < len && strchr(" \t\r\n", body[at]) != NULL && body[at])
    at++;
  if (at < len) {
    refuse(err, err_len, "the body has more after its JSON value (at byte "
           "%zu): %s takes one JSON object", at, endpoint);
    cJSON_Delete(root);
    return NULL;
  }
  if (!cJSON_IsObject(root)) {
    refuse(err, err_len, "the body is %s: %s takes one JSON object with the "
           "fields %s", kind_of(root), endpoint, list);
    cJSON_Delete(root);
    return NULL;
  }
  for (cJSON *f = root->child; f != NULL; f = f->next) {
    int known = 0;
    for (int i = 0; accepted[i] != NULL; i++)
      known |= strcmp(f->string, accepted[i]) == 0;
    for (cJSON *g = root->child; g != f; g = g->next)
      if (strcmp(g->string, f->string) == 0) {
        refuse(err, err_len, "field '%s' is given twice: give each field "
               "once", remat__quote(&(remat__quoted){0}, f->string));
        cJSON_Delete(root);
        return NULL;
      }
    if (!known) {
      refuse(err, err_len, "unknown field '%s': %s accepts %s",
             remat__quote(&(remat__quoted){0}, f->string), endpoint, list);
      cJSON_Delete(root);
      return NULL;
    }
  }
  return root;
}

/* An integer field in [lo, hi]; absent leaves *out. */
static int get_int(const cJSON *root, const char *name, double lo, double hi,
                   int64_t *out, char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  if (v == NULL)
    return 0;
  double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
  if (!cJSON_IsNumber(v) || x != floor(x) || x < lo || x > hi) {
    char shown[64];
    if (cJSON_IsNumber(v))
      snprintf(shown, sizeof shown, "%.17g", x);
    else
      snprintf(shown, sizeof shown, "%s", kind_of(v));
    return refuse(err, len, "'%s' is %s: expected an integer from %.0f to "
                  "%.0f", name, shown, lo, hi);
  }
  *out = (int64_t)x;
  return 0;
}

/* A number field in [lo, hi] (above lo when `open`), checked as the f32
 * every caller stores it in: 1e-60 passes "above 0" as a double and is 0
 * as an f32. */
static int get_num(const cJSON *root, const char *name, double lo, double hi,
                   int open, double *out, char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  if (v == NULL)
    return 0;
  double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
  double f = x == x && fabs(x) <= FLT_MAX ? (double)(float)x : x;
  if (!cJSON_IsNumber(v) || !(f >= lo) || f > hi || (open && f == lo)) {
    char shown[96];
    if (cJSON_IsNumber(v) && f != x)
      snprintf(shown, sizeof shown, "%.17g, %.9g as an f32", x, f);
    else if (cJSON_IsNumber(v))
      snprintf(shown, sizeof shown, "%.17g", x);
    else
      snprintf(shown, sizeof shown, "%s", kind_of(v));
    return refuse(err, len, "'%s' is %s: expected a number %s %g and at "
                  "most %g", name, shown, open ? "above" : "from", lo, hi);
  }
  *out = x;
  return 0;
}

/* A string field, copied; absent leaves *out NULL. */
static int get_str(const cJSON *root, const char *name, char **out,
                   char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  *out = NULL;
  if (v == NULL)
    return 0;
  if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
    return refuse(err, len, "'%s' is %s: expected a non-empty string", name,
                  cJSON_IsString(v) ? "empty" : kind_of(v));
  *out = strdup(v->valuestring);
  return *out == NULL ? refuse(err, len, "out of memory") : 0;
}

/* The prompt's text as tokens: its UTF-8 bytes, or the addition task's
 * digits, + and =. */
static int text_prompt(const char *text, const serve_limits *lim,
                       gen_params *out, char *err, size_t len) {
  if (lim->format == FORMAT_U16)
    return refuse(err, len, "'prompt' is a string, but this model's tokens "
                  "are u16 ids: give an array of ids from 0 to %d",
                  lim->vocab - 1);
  size_t n = strlen(text);
  out->prompt = malloc((n > 0 ? n : 1) * sizeof *out->prompt);
  if (out->prompt == NULL)
    return refuse(err, len, "out of memory");
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)text[i];
    const char *at = ch != 0 ? strchr("0123456789+=", ch) : NULL;
    if (lim->format == FORMAT_ADDITION && at == NULL)
      return refuse(err, len, "'prompt' has '%s%c' at byte %zu: the "
                    "addition task's text is digits, + and =",
                    ch >= 32 && ch < 127 ? "" : "\\x", ch >= 32 && ch < 127
                    ? (char)ch : '?', i);
    out->prompt[i] = lim->format == FORMAT_ADDITION
                         ? (int32_t)(at - "0123456789+=")
                         : (int32_t)ch;
    if (out->prompt[i] >= lim->vocab)
      return refuse(err, len, "'prompt' has byte %d at %zu: the model's "
                    "vocabulary is 0 to %d", (int)ch, i, lim->vocab - 1);
  }
  out->n = (int)n;
  return 0;
}

static int ids_prompt(const cJSON *v, const serve_limits *lim,
                      gen_params *out, char *err, size_t len) {
  int n = cJSON_GetArraySize(v);
  out->prompt = malloc((size_t)(n > 0 ? n : 1) * sizeof *out->prompt);
  if (out->prompt == NULL)
    return refuse(err, len, "out of memory");
  int i = 0;
  for (const cJSON *x = v->child; x != NULL; x = x->next, i++) {
    double d = cJSON_IsNumber(x) ? x->valuedouble : NAN;
    if (!cJSON_IsNumber(x) || d != floor(d) || d < 0 || d >= lim->vocab) {
      char shown[64];
      if (cJSON_IsNumber(x))
        snprintf(shown, sizeof shown, "%.17g", d);
      else
        snprintf(shown, sizeof shown, "%s", kind_of(x));
      return refuse(err, len, "'prompt'[%d] is %s: token ids are integers "
                    "from 0 to %d (the model's vocabulary)", i, shown,
                    lim->vocab - 1);
    }
    out->prompt[i] = (int32_t)d;
  }
  out->n = n;
  return 0;
}

static const char *const gen_fields[] = {"prompt", "max_tokens",
                                         "temperature", "top_k", "seed",
                                         NULL};

int parse_generate(const char *body, size_t len, const serve_limits *lim,
                   gen_params *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  out->seed = 1;
  cJSON *root = parse_object(body, len, "POST /v1/generate", gen_fields,
                             "prompt, max_tokens, temperature, top_k, seed",
                             err, err_len);
  if (root == NULL)
    return -1;
  int rc = 0;
  const cJSON *pr = cJSON_GetObjectItemCaseSensitive(root, "prompt");
  /* the default, 16, within --max-tokens */
  int64_t max_tokens = lim->max_tokens < 16 ? lim->max_tokens : 16;
  int64_t top_k = 0, seed = 1;
  double temperature = 0.0;
  if (pr == NULL)
    rc = refuse(err, err_len, "'prompt' is missing: give an array of token "
                "ids or a string");
  else if (cJSON_IsString(pr))
    rc = text_prompt(pr->valuestring, lim, out, err, err_len);
  else if (cJSON_IsArray(pr))
    rc = ids_prompt(pr, lim, out, err, err_len);
  else
    rc = refuse(err, err_len, "'prompt' is %s: expected an array of token "
                "ids or a string", kind_of(pr));
  if (rc == 0 && out->n == 0)
    rc = refuse(err, err_len, "'prompt' is empty: give at least one token");
  if (rc == 0) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
    if (m != NULL && cJSON_IsNumber(m) && m->valuedouble > lim->max_tokens &&
        m->valuedouble == floor(m->valuedouble))
      rc = refuse(err, err_len, "'max_tokens' is %.17g: this server "
                  "generates at most %d tokens a request (--max-tokens)",
                  m->valuedouble, lim->max_tokens);
  }
  if (rc == 0)
    rc = get_int(root, "max_tokens", 1, lim->max_tokens, &max_tokens, err,
                 err_len);
  if (rc == 0)
    rc = get_num(root, "temperature", 0.0, 100.0, 0, &temperature, err,
                 err_len);
  if (rc == 0)
    rc = get_int(root, "top_k", 0, lim->vocab, &top_k, err, err_len);
  if (rc == 0)
    rc = get_int(root, "seed", 0, SEED_MAX, &seed, err, err_len);
  cJSON_Delete(root);
  out->max_tokens = (int)max_tokens;
  out->temperature = (float)temperature;
  out->top_k = (int)top_k;
  out->seed = (uint64_t)seed;
  if (rc != 0)
    gen_params_free(out);
  return rc;
}

void gen_params_free(gen_params *p) {
  free(p->prompt);
  p->prompt = NULL;
  p->n = 0;
}

static const char *const job_fields[] = {"data", "steps", "lr", "policy",
                                         "budget", "save", "save_every",
                                         NULL};

int parse_job(const char *body, size_t len, job_params *out, char *err,
              size_t err_len) {
  memset(out, 0, sizeof *out);
  out->lr = 3e-4f;
  out->save_every = 10;
  cJSON *root = parse_object(body, len, "POST /v1/jobs", job_fields,
                             "data, steps, lr, policy, budget, save, "
                             "save_every", err, err_len);
  if (root == NULL)
    return -1;
  int64_t steps = 0, every = out->save_every, budget = REMAT_RUNTIME_BUDGET;
  double lr = out->lr;
  int rc = get_str(root, "data", &out->data, err, err_len);
  if (rc == 0 && out->data == NULL)
    rc = refuse(err, err_len, "'data' is missing: give the path of a "
                "training file on the server, in the format of the model's "
                "data");
  if (rc == 0 && cJSON_GetObjectItemCaseSensitive(root, "steps") == NULL)
    rc = refuse(err, err_len, "'steps' is missing: give the number of "
                "training steps, 1 to %d", JOB_STEPS_MAX);
  if (rc == 0)
    rc = get_int(root, "steps", 1, JOB_STEPS_MAX, &steps, err, err_len);
  if (rc == 0)
    rc = get_num(root, "lr", 0.0, 1.0, 1, &lr, err, err_len);
  if (rc == 0)
    rc = get_str(root, "policy", &out->policy, err, err_len);
  if (rc == 0) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "budget");
    if (b != NULL && cJSON_IsString(b)) {
      if (remat_parse_bytes(b->valuestring, &budget) != REMAT_OK)
        rc = refuse(err, err_len, "'budget' is '%s': expected bytes as "
                    "an integer or a string such as \"800MB\" or \"1.5GiB\"",
                    remat__quote(&(remat__quoted){0}, b->valuestring));
    } else {
      rc = get_int(root, "budget", 0, 9007199254740992.0, &budget, err,
                   err_len);
    }
  }
  if (rc == 0)
    rc = get_str(root, "save", &out->save, err, err_len);
  if (rc == 0)
    rc = get_int(root, "save_every", 0, JOB_STEPS_MAX, &every, err, err_len);
  cJSON_Delete(root);
  out->steps = (int)steps;
  out->lr = (float)lr;
  out->budget = budget;
  out->save_every = (int)every;
  if (rc != 0)
    job_params_free(out);
  return rc;
}

void job_params_free(job_params *p) {
  free(p->data);
  free(p->policy);
  free(p->save);
  p->data = p->policy = p->save = NULL;
}

static const char *const load_fields[] = {"path", "job", NULL};

int parse_load(const char *body, size_t len, char **path, char **job,
               char *err, size_t err_len) {
  *path = *job = NULL;
  cJSON *root = parse_object(body, len, "POST /v1/models/load", load_fields,
                             "path or job", err, err_len);
  if (root == NULL)
    return -1;
  int rc = get_str(root, "path", path, err, err_len);
  if (rc == 0)
    rc = get_str(root, "job", job, err, err_len);
  if (rc == 0 && (*path == NULL) == (*job == NULL))
    rc = refuse(err, err_len, "give one of 'path' (a safetensors file or "
                "checkpoint on the server) and 'job' (a job's id)");
  cJSON_Delete(root);
  if (rc != 0) {
    free(*path);
    free(*job);
    *path = *job = NULL;
  }
  return rc;
}

char *json_error(const char *message) {
  cJSON *o = cJSON_CreateObject();
  if (o == NULL || cJSON_AddStringToObject(o, "error", message) == NULL) {
    cJSON_Delete(o);
    return NULL;
  }
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return text;
}
