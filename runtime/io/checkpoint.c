/* Training checkpoints: the parameters, AdamW's moments, the count of
 * optimizer steps and the caller's own whole numbers (schedule and data
 * positions, RNG states) in one safetensors file, through the engine of
 * safetensors.c, so that training resumes exactly where it stopped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/io/safetensors.h"
#include "runtime/exec/step_state.h"

#define KEY_STEP "remat.step"
#define KEY_OPTIMIZER "remat.optimizer"

static const char *optimizer_name(const compiled_step *c) {
  if (!c->has_opt)
    return "none";
  return c->opt.kind == REMAT_OPT_ADAMW ? "adamw" : "sgd";
}

/* A caller's key: 1 to 63 letters, digits, '_', '.' or '-', none of the
 * names remat writes. */
static bool key_ok(const char *key) {
  size_t n = key == NULL ? 0 : strlen(key);
  if (n == 0 || n >= REMAT__NAME_MAX || strcmp(key, "format") == 0 ||
      strcmp(key, "producer") == 0 || strncmp(key, "remat.", 6) == 0)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = key[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
      return false;
  }
  return true;
}

static remat_status check_keys(const char *const *keys, const void *values,
                               int count, const char *what) {
  if (count < 0 || count > REMAT_CHECKPOINT_MAX_VALUES)
    return remat__fail(REMAT_ERR_INVALID_ARG, "%s: count is %d: expected 0 to "
                       "%d", what, count, REMAT_CHECKPOINT_MAX_VALUES);
  if (count > 0 && (keys == NULL || values == NULL))
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "%s: keys and values must not be NULL when count > 0",
                       what);
  for (int i = 0; i < count; i++) {
    if (!key_ok(keys[i]))
      return remat__fail(REMAT_ERR_INVALID_ARG,
                         "%s: key %d ('%s') must be 1 to 63 letters, "
                         "digits, '_', '.' or '-', and not 'format', "
                         "'producer' or 'remat.*'", what, i,
                         keys[i] == NULL
                             ? "(null)"
                             : remat__quote(&(remat__quoted){0}, keys[i]));
    for (int j = 0; j < i; j++)
      if (strcmp(keys[i], keys[j]) == 0)
        return remat__fail(REMAT_ERR_INVALID_ARG,
                           "%s: key '%s' is given twice", what,
                           remat__quote(&(remat__quoted){0}, keys[i]));
  }
  return REMAT_OK;
}

/* The buffer of AdamW's first (or second) moment of parameter `tensor`,
 * -1 when it has none. */
static int32_t moment_buf(const compiled_step *c, int32_t tensor,
                          bool second) {
  for (int32_t k = 0; k < c->low.nknodes; k++) {
    const plan_knode *kn = &c->low.knodes[k];
    if (kn->kind == KNODE_UPDATE && kn->optim.param_tensor == tensor)
      return second ? kn->optim.adam_v : kn->optim.adam_m;
  }
  return -1;
}

/* The parameters (of a graph with LoRA adapters, the trainable ones: its
 * frozen base weights never change), then the first moments, then the
 * second moments. */
static remat_status checkpoint_items(remat_graph *g, safet_item **items,
                                     int *n, const char *what) {
  int nparams = 0;
  remat_status s = safet_params(g, false, 2 * remat_num_params(g), items,
                                &nparams, what);
  const compiled_step *c = &g->step->compiled;
  if (g->nlora > 0) /* LoRA: the frozen base weights stay out */
    for (int i = nparams - 1; s == REMAT_OK && i >= 0; i--)
      if ((*items)[i].param->frozen)
        memmove(&(*items)[i], &(*items)[i + 1],
                (size_t)(--nparams - i) * sizeof **items);
  *n = nparams;
  for (int pass = 0; pass < 2 && s == REMAT_OK; pass++)
    for (int i = 0; i < nparams; i++) {
      const remat_tensor *t = (*items)[i].param;
      int32_t b = c->has_opt && c->opt.kind == REMAT_OPT_ADAMW
                      ? moment_buf(c, t->id, pass == 1)
                      : -1;
      if (b < 0)
        continue;
      safet_item *it = &(*items)[(*n)++];
      snprintf(it->name, sizeof it->name, "%s%s",
               pass == 0 ? SAFET_ADAM_M : SAFET_ADAM_V, t->name);
      it->param = t;
      it->data = g->step->state.data[b];
    }
  return s;
}

static remat_status save_checkpoint(remat_graph *g, const char *path,
                                    const char *const *keys,
                                    const uint64_t *values, int count) {
  const char *what = "remat_save_checkpoint";
  if (g->step->state.accum_count > 0)
    return remat__fail(REMAT_ERR_STATE,
                       "%s: %lld micro-batch(es) summed by remat_accumulate "
                       "wait for their update: a checkpoint does not hold "
                       "gradient sums, so it could not resume exactly; save "
                       "after remat_step",
                       what, (long long)g->step->state.accum_count);
  safet_meta meta[REMAT_CHECKPOINT_MAX_VALUES + 3] = {
      {.key = SAFET_CHECKPOINT_KEY, .value = "1"},
      {.key = KEY_OPTIMIZER},
      {.key = KEY_STEP}};
  snprintf(meta[1].value, sizeof meta[1].value, "%s",
           optimizer_name(&g->step->compiled));
  snprintf(meta[2].value, sizeof meta[2].value, "%lld",
           (long long)g->step->state.opt_step);
  for (int i = 0; i < count; i++) {
    meta[3 + i].key = keys[i];
    snprintf(meta[3 + i].value, sizeof meta[3 + i].value, "%llu",
             (unsigned long long)values[i]);
  }
  safet_item *items = NULL;
  int n = 0;
  remat_status s = checkpoint_items(g, &items, &n, what);
  if (s == REMAT_OK)
    s = safet_save(g, path, items, n, meta, 3 + count, what);
  free(items);
  return s;
}

remat_status remat_save_checkpoint(remat_graph *g, const char *path,
                                   const char *const *keys,
                                   const uint64_t *values, int count) {
  const char *what = "remat_save_checkpoint";
  remat_status s = check_keys(keys, values, count, what);
  if (s == REMAT_OK)
    s = safet_hold(g, path, what);
  if (s != REMAT_OK)
    return s;
  s = save_checkpoint(g, path, keys, values, count);
  safet_release(g);
  return s;
}

/* ---- loading ---- */

/* What a load checks in the metadata, and applies once the tensors are
 * written. */
typedef struct restore {
  remat_graph *g;
  const char *const *keys;
  uint64_t *values; /* the caller's */
  uint64_t parsed[REMAT_CHECKPOINT_MAX_VALUES];
  int count;
  int64_t step;
} restore;

/* A metadata value that is a whole number from 0 to UINT64_MAX. */
static bool parse_whole(const cJSON *item, uint64_t *out) {
  const char *v = cJSON_IsString(item) ? item->valuestring : NULL;
  if (v == NULL || *v == '\0' || strlen(v) > 20)
    return false;
  uint64_t x = 0;
  for (const char *c = v; *c != '\0'; c++) {
    if (*c < '0' || *c > '9' || x > (UINT64_MAX - (uint64_t)(*c - '0')) / 10)
      return false;
    x = x * 10 + (uint64_t)(*c - '0');
  }
  *out = x;
  return true;
}

/* The value under `key` of `meta` into *out; with `found` NULL a missing
 * key is an error, else *found says whether the key is there. */
static remat_status meta_value(const cJSON *meta, const char *key,
                               const char *path, const char *what,
                               uint64_t *out, int *found) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(meta, key);
  if (found != NULL)
    *found = item != NULL;
  if (item == NULL && found == NULL)
    return remat__fail(REMAT_ERR_IO, "%s: '%s': __metadata__ has no '%s'",
                       what, path, key);
  if (item != NULL && !parse_whole(item, out))
    return remat__fail(REMAT_ERR_IO, "%s: '%s': __metadata__ '%s' is not a "
                       "whole number from 0 to 2^64-1 written as a string",
                       what, path, key);
  return REMAT_OK;
}

static remat_status check_optimizer(const restore *r, const cJSON *meta,
                                    const char *path) {
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(meta, KEY_OPTIMIZER);
  const char *want = optimizer_name(&r->g->step->compiled);
  if (!cJSON_IsString(opt))
    return remat__fail(REMAT_ERR_IO, "remat_load_checkpoint: '%s': "
                       "__metadata__ has no '%s'", path, KEY_OPTIMIZER);
  if (strcmp(opt->valuestring, want) != 0)
    return remat__fail(REMAT_ERR_SHAPE, "remat_load_checkpoint: '%s': the "
                       "checkpoint holds the state of optimizer '%s' but "
                       "the graph was compiled with '%s': compile with the "
                       "same optimizer, or load the weights alone with "
                       "remat_load_safetensors", path,
                       remat__quote(&(remat__quoted){0}, opt->valuestring),
                       want);
  return REMAT_OK;
}

/* The checkpoint's __metadata__ (NULL when it has none), checked before
 * any tensor is read. */
static remat_status check_meta(restore *r, const cJSON *meta,
                               const char *path) {
  if (cJSON_GetObjectItemCaseSensitive(meta, SAFET_CHECKPOINT_KEY) == NULL)
    return remat__fail(REMAT_ERR_IO, "remat_load_checkpoint: '%s' is not a "
                       "training checkpoint (its __metadata__ has no '%s'): "
                       "remat_load_safetensors loads weights alone", path,
                       SAFET_CHECKPOINT_KEY);
  remat_status s = check_optimizer(r, meta, path);
  uint64_t step = 0;
  if (s == REMAT_OK)
    s = meta_value(meta, KEY_STEP, path, "remat_load_checkpoint", &step,
                   NULL);
  if (s == REMAT_OK && step > (uint64_t)REMAT_MAX_STEPS)
    s = remat__fail(REMAT_ERR_IO, "remat_load_checkpoint: '%s': '%s' is "
                    "%llu, more than REMAT_MAX_STEPS (2^53), the most "
                    "updates a graph counts", path, KEY_STEP,
                    (unsigned long long)step);
  for (int i = 0; i < r->count && s == REMAT_OK; i++)
    s = meta_value(meta, r->keys[i], path, "remat_load_checkpoint",
                   &r->parsed[i], NULL);
  r->step = (int64_t)step;
  return s;
}

/* After the tensors were read: the step count and the caller's values. */
static void commit(const restore *r) {
  r->g->step->state.opt_step = r->step;
  for (int i = 0; i < r->count; i++)
    r->values[i] = r->parsed[i];
}

remat_status remat_load_checkpoint(remat_graph *g, const char *path,
                                   const char *const *keys, uint64_t *values,
                                   int count) {
  const char *what = "remat_load_checkpoint";
  remat_status s = check_keys(keys, values, count, what);
  if (s == REMAT_OK)
    s = safet_hold(g, path, what);
  if (s != REMAT_OK)
    return s;
  restore r = {.g = g, .keys = keys, .values = values, .count = count};
  safet_load_req req = {.what = what};
  safet_loading *ld = NULL;
  const cJSON *meta = NULL;
  s = checkpoint_items(g, &req.items, &req.nitems, what);
  if (s == REMAT_OK)
    s = safet_load_open(path, &req, &ld, &meta);
  if (s == REMAT_OK)
    s = check_meta(&r, meta, remat__quote(&(remat__quoted){0}, path));
  if (s == REMAT_OK)
    s = safet_load_read(ld);
  if (s == REMAT_OK) {
    commit(&r);
    step_state_params_loaded(&g->step->state);
  }
  safet_load_close(ld);
  free(req.items);
  safet_release(g);
  return s;
}

remat_status remat_checkpoint_values(const char *path,
                                     const char *const *keys,
                                     uint64_t *values, int *found,
                                     int count) {
  const char *what = "remat_checkpoint_values";
  remat_status s = check_keys(keys, values, count, what);
  if (s == REMAT_OK && path == NULL)
    s = remat__fail(REMAT_ERR_INVALID_ARG, "%s: path is NULL", what);
  if (s == REMAT_OK && count > 0 && found == NULL)
    s = remat__fail(REMAT_ERR_INVALID_ARG,
                    "%s: found must not be NULL when count > 0", what);
  if (s != REMAT_OK)
    return s;
  cJSON *root = NULL;
  const cJSON *meta = NULL;
  uint64_t parsed[REMAT_CHECKPOINT_MAX_VALUES];
  int there[REMAT_CHECKPOINT_MAX_VALUES];
  s = safet_read_header(path, what, &root, &meta);
  for (int i = 0; i < count && s == REMAT_OK; i++)
    s = meta_value(meta, keys[i], path, what, &parsed[i], &there[i]);
  for (int i = 0; i < count && s == REMAT_OK; i++) {
    found[i] = there[i];
    values[i] = there[i] ? parsed[i] : values[i];
  }
  cJSON_Delete(root);
  return s;
}
