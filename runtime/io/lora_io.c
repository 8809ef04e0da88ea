/* The LoRA adapter files: the adapters alone under PEFT's names with
 * PEFT's adapter_config.json, their load, and the base weights with the
 * adapters folded in; all through the safetensors engine (safetensors.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/bf16.h"
#include "base/files.h"
#include "remat_lora.h"
#include "runtime/exec/step_state.h"
#include "runtime/io/safetensors.h"

/* An item for tensor t with t's value buffer (the caller names it). */
static void value_item(remat_graph *g, const remat_tensor *t, safet_item *it) {
  const plan_lowering *l = &g->step->compiled.low;
  int32_t b = l->value_buf[t->id];
  it->param = t;
  it->data = g->step->state.data[b];
  it->store = l->bufs[b].dtype;
}

/* The adapters, A then B of each, under PEFT's names. */
static remat_status adapter_items(remat_graph *g, safet_item **items, int *n,
                                  const char *what) {
  *n = 0;
  if (g->nlora == 0)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "%s: the graph has no LoRA adapters (remat_lora_linear "
                       "or a model built with lora.rank > 0)",
                       what);
  *items = remat__calloc((size_t)g->nlora * 2, sizeof **items);
  if (*items == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  for (int32_t i = 0; i < g->nlora; i++) {
    const graph_lora *a = &g->lora[i];
    for (int k = 0; k < 2; k++) {
      safet_item *it = &(*items)[(*n)++];
      value_item(g, g->tensors[k == 0 ? a->a : a->b], it);
      snprintf(it->name, sizeof it->name,
               REMAT_LORA_PEFT_PREFIX "%.40s.lora_%c.weight", a->module,
               k == 0 ? 'A' : 'B');
    }
  }
  return REMAT_OK;
}

/* PEFT's file has one rank and one alpha. */
static remat_status check_uniform(const remat_graph *g, const char *what) {
  const graph_lora *first = &g->lora[0];
  for (int32_t i = 1; i < g->nlora; i++) {
    const graph_lora *a = &g->lora[i];
    if (a->rank != first->rank || a->alpha != first->alpha)
      return remat__fail(REMAT_ERR_INVALID_ARG,
                         "%s: adapters '%s' (rank %d, alpha %g) and '%s' "
                         "(rank %d, alpha %g) differ: adapter_config.json "
                         "holds one rank and one alpha",
                         what, first->module, first->rank, (double)first->alpha,
                         a->module, a->rank, (double)a->alpha);
  }
  return REMAT_OK;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The sorted, distinct last components of the adapted modules. */
static cJSON *target_modules(const remat_graph *g) {
  const char **names = remat__calloc((size_t)g->nlora, sizeof *names);
  cJSON *arr = names != NULL ? cJSON_CreateArray() : NULL;
  for (int32_t i = 0; arr != NULL && i < g->nlora; i++) {
    const char *dot = strrchr(g->lora[i].module, '.');
    names[i] = dot != NULL ? dot + 1 : g->lora[i].module;
  }
  if (arr != NULL)
    qsort(names, (size_t)g->nlora, sizeof *names, cmp_str);
  for (int32_t i = 0; arr != NULL && i < g->nlora; i++)
    if ((i == 0 || strcmp(names[i], names[i - 1]) != 0) &&
        !cJSON_AddItemToArray(arr, cJSON_CreateString(names[i]))) {
      cJSON_Delete(arr);
      arr = NULL;
    }
  free(names);
  return arr;
}

static cJSON *adapter_config(const remat_graph *g) {
  const graph_lora *a = &g->lora[0];
  cJSON *root = cJSON_CreateObject();
  cJSON *targets = target_modules(g);
  if (root == NULL || targets == NULL ||
      !cJSON_AddItemToObject(root, "target_modules", targets)) {
    cJSON_Delete(root);
    cJSON_Delete(targets);
    return NULL;
  }
  bool ok = cJSON_AddStringToObject(root, "peft_type", "LORA") &&
            cJSON_AddStringToObject(root, "task_type", "CAUSAL_LM") &&
            cJSON_AddNumberToObject(root, "r", a->rank) &&
            cJSON_AddNumberToObject(root, "lora_alpha", a->alpha) &&
            cJSON_AddNumberToObject(root, "lora_dropout", 0) &&
            cJSON_AddStringToObject(root, "bias", "none") &&
            cJSON_AddBoolToObject(root, "fan_in_fan_out", a->conv1d) &&
            cJSON_AddStringToObject(root, "init_lora_weights", "gaussian") &&
            cJSON_AddBoolToObject(root, "inference_mode", true) &&
            cJSON_AddNullToObject(root, "base_model_name_or_path") &&
            cJSON_AddNullToObject(root, "modules_to_save");
  if (!ok) {
    cJSON_Delete(root);
    return NULL;
  }
  return root;
}

/* Writes adapter_config.json to PATH, replacing it whole (base/files.h). */
static remat_status write_config(const remat_graph *g, const char *path,
                                 const char *what) {
  cJSON *root = adapter_config(g);
  char *text = root != NULL ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (text == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  remat__quoted q;
  mode_t mode;
  remat__replacing r;
  FILE *f = remat__replace_check(path, &mode) == 0
                ? remat__replace_begin(path, &r)
                : NULL;
  remat_status s = REMAT_OK;
  if (f == NULL)
    s = remat__fail(REMAT_ERR_IO, "%s: cannot write '%s': %s", what,
                    remat__quote(&q, path), strerror(errno));
  else if (fputs(text, f) < 0 || fputc('\n', f) < 0) {
    s = remat__fail(REMAT_ERR_IO, "%s: cannot write '%s': %s", what,
                    remat__quote(&q, path), strerror(errno));
    remat__replace_abort(f, &r);
  } else if (remat__replace_end(f, &r) != 0)
    s = remat__fail(REMAT_ERR_IO, "%s: cannot write '%s'", what,
                    remat__quote(&q, path));
  cJSON_free(text);
  return s;
}

remat_status remat_lora_save(remat_graph *g, const char *path,
                             const char *config_path) {
  const char *what = "remat_lora_save";
  remat_status s = safet_hold(g, path, what);
  if (s != REMAT_OK)
    return s;
  safet_item *items = NULL;
  int n = 0;
  s = adapter_items(g, &items, &n, what);
  if (s == REMAT_OK && config_path != NULL)
    s = check_uniform(g, what);
  if (s == REMAT_OK)
    s = safet_save(g, path, items, n, NULL, 0, what);
  if (s == REMAT_OK && config_path != NULL)
    s = write_config(g, config_path, what);
  free(items);
  safet_release(g);
  return s;
}

remat_status remat_lora_load(remat_graph *g, const char *path) {
  const char *what = "remat_lora_load";
  remat_status s = safet_hold(g, path, what);
  if (s != REMAT_OK)
    return s;
  safet_load_req req = {.what = what, .weights_only = true};
  safet_loading *ld = NULL;
  const cJSON *meta;
  s = adapter_items(g, &req.items, &req.nitems, what);
  if (s == REMAT_OK)
    s = safet_load_open(path, &req, &ld, &meta);
  if (s == REMAT_OK)
    s = safet_load_read(ld);
  if (s == REMAT_OK)
    step_state_params_loaded(&g->step->state);
  safet_load_close(ld);
  free(req.items);
  safet_release(g);
  return s;
}

/* ---- merging ---- */

static float value_at(const safet_item *it, size_t i) {
  return it->store == OP_BF16 ? bf16_to_f32(((const uint16_t *)it->data)[i])
                              : ((const float *)it->data)[i];
}

/* w[out,in] + s * B[out,R] . A[R,in] into a new f32 buffer: for each
 * element, the rank summed in order, then scaled and added. */
static float *fold(remat_graph *g, const graph_lora *a) {
  safet_item w, pa, pb;
  value_item(g, g->tensors[a->w], &w);
  value_item(g, g->tensors[a->a], &pa);
  value_item(g, g->tensors[a->b], &pb);
  int64_t out = g->tensors[a->w]->shape.dim[0];
  int64_t in = g->tensors[a->w]->shape.dim[1];
  float s = a->alpha / (float)a->rank;
  float *merged = remat__malloc((size_t)(out * in) * sizeof *merged);
  if (merged == NULL)
    return NULL;
  for (int64_t o = 0; o < out; o++)
    for (int64_t i = 0; i < in; i++) {
      float sum = 0.0f;
      for (int r = 0; r < a->rank; r++)
        sum += value_at(&pb, (size_t)(o * a->rank + r)) *
               value_at(&pa, (size_t)(r * in + i));
      merged[o * in + i] = value_at(&w, (size_t)(o * in + i)) + s * sum;
    }
  return merged;
}

/* The adapter whose base weight is tensor id, -1 none; *adapter whether
 * id is an adapter's A or B. */
static int32_t lora_of(const remat_graph *g, int32_t id, bool *adapter) {
  *adapter = false;
  for (int32_t i = 0; i < g->nlora; i++) {
    if (g->lora[i].a == id || g->lora[i].b == id)
      *adapter = true;
    if (g->lora[i].w == id)
      return i;
  }
  return -1;
}

/* Every parameter but the adapters, the adapted ones folded into new
 * buffers (*merged, [n], NULL for the others). */
static remat_status merged_items(remat_graph *g, safet_item *items,
                                 float **merged, int *n, const char *what) {
  *n = 0;
  for (int i = 0; i < remat_num_params(g); i++) {
    const remat_tensor *p = remat_param_at(g, i);
    bool adapter;
    int32_t k = lora_of(g, p->id, &adapter);
    if (adapter)
      continue;
    safet_item *it = &items[*n];
    value_item(g, p, it);
    snprintf(it->name, sizeof it->name, "%s", p->name);
    merged[*n] = NULL;
    if (k >= 0) {
      merged[*n] = fold(g, &g->lora[k]);
      if (merged[*n] == NULL)
        return remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
      it->data = merged[*n];
      it->store = OP_F32;
    }
    (*n)++;
  }
  return REMAT_OK;
}

remat_status remat_lora_save_merged(remat_graph *g, const char *path) {
  const char *what = "remat_lora_save_merged";
  remat_status s = safet_hold(g, path, what);
  if (s != REMAT_OK)
    return s;
  int np = remat_num_params(g);
  safet_item *items = remat__calloc((size_t)(np > 0 ? np : 1), sizeof *items);
  float **merged = remat__calloc((size_t)(np > 0 ? np : 1), sizeof *merged);
  int n = 0;
  if (items == NULL || merged == NULL)
    s = remat__fail(REMAT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  else if (g->nlora == 0)
    s = remat__fail(REMAT_ERR_INVALID_ARG,
                    "%s: the graph has no LoRA adapters to merge", what);
  if (s == REMAT_OK)
    s = merged_items(g, items, merged, &n, what);
  if (s == REMAT_OK)
    s = safet_save(g, path, items, n, NULL, 0, what);
  for (int i = 0; merged != NULL && i < np; i++)
    free(merged[i]);
  free(merged);
  free(items);
  safet_release(g);
  return s;
}
