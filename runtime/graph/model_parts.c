/* What the built-in model builders (GPT, Llama) share: named parameters
 * and tensors, and the checks of the attention form and the layer limit,
 * with messages in each builder's field names. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "runtime/graph/lora.h"
#include "runtime/graph/model_parts.h"

remat_tensor *model_param(remat_graph *g, const char *prefix, const char *name,
                          int ndim, int64_t d0, int64_t d1, remat_init init,
                          float scale) {
  char full[REMAT__NAME_MAX];
  snprintf(full, sizeof full, "%s%s", prefix, name);
  int64_t dims[2] = {d0, d1};
  return remat_param(g, full, ndim, dims, init, scale);
}

remat_tensor *model_named(remat_graph *g, remat_tensor *t, const char *name) {
  if (t != NULL)
    remat_checkpoint_name(g, t, name);
  return t;
}

remat_status model_check_form(remat_graph *g, const char *who,
                              const char *layers_field, int layers,
                              remat_attention_kind attention) {
  if (attention < REMAT_ATTENTION_DEFAULT ||
      attention > REMAT_ATTENTION_MATERIALIZED)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "%s: attention %d: expected "
                      "REMAT_ATTENTION_DEFAULT (0), REMAT_ATTENTION_FUSED (1) "
                      "or REMAT_ATTENTION_MATERIALIZED (2)",
                      who, (int)attention);
  if (layers > REMAT_GPT_MAX_LAYERS)
    return graph_fail(g, REMAT_ERR_LIMIT,
                      "%s: %s %d: at most %d (REMAT_GPT_MAX_LAYERS) are built",
                      who, layers_field, layers, REMAT_GPT_MAX_LAYERS);
  return REMAT_OK;
}

/* ---- LoRA ---- */

/* The next comma-separated entry of *list into buf (false at the end). */
static bool next_entry(const char **list, char *buf, size_t len) {
  const char *p = *list;
  if (*p == '\0')
    return false;
  const char *end = strchr(p, ',');
  size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
  snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), p);
  *list = end != NULL ? end + 1 : p + n;
  return true;
}

static remat_status unknown_target(remat_graph *g, const char *who,
                                   const char *name,
                                   const model_lora_module *mods, int n) {
  char known[256] = "";
  for (int i = 0; i < n; i++)
    snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
             i > 0 ? ", " : "", mods[i].name);
  return graph_fail(g, REMAT_ERR_INVALID_ARG,
                    "%s: lora target '%s': expected a comma-separated list "
                    "of %s",
                    who, name, known);
}

remat_status model_lora_targets(remat_graph *g, const char *who,
                                const remat_lora_config *lora,
                                const model_lora_module *mods, int n,
                                const char *def, unsigned *mask) {
  *mask = 0;
  if (lora->rank < 0)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "%s: lora rank %d: expected >= 0 (0 for no adapters)",
                      who, lora->rank);
  if (!isfinite(lora->alpha) || lora->alpha < 0.0f)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "%s: lora alpha %g: expected a finite value >= 0 (0 "
                      "for the rank)",
                      who, (double)lora->alpha);
  if (lora->rank == 0)
    return REMAT_OK;
  const char *list = lora->targets && lora->targets[0] ? lora->targets : def;
  char name[64];
  int64_t width = INT64_MAX;
  while (next_entry(&list, name, sizeof name)) {
    int i = 0;
    while (i < n && strcmp(mods[i].name, name) != 0)
      i++;
    if (i == n)
      return unknown_target(g, who, name, mods, n);
    *mask |= mods[i].bits;
    width = mods[i].width < width ? mods[i].width : width;
  }
  if (*mask == 0)
    return unknown_target(g, who, "", mods, n);
  if (lora->rank > width)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "%s: lora rank %d: expected at most %lld, the smallest "
                      "width of the targeted linears",
                      who, lora->rank, (long long)width);
  return REMAT_OK;
}

remat_tensor *model_linear(remat_graph *g, const remat_lora_config *lora,
                           unsigned mask, unsigned bit, const char *module,
                           const remat_tensor *x, remat_tensor *w,
                           remat_tensor *b, bool conv1d) {
  if ((mask & bit) == 0)
    return remat_linear(g, x, w, b);
  return graph_lora_linear(g, x, w, b, module, lora->rank, lora->alpha, conv1d);
}

static bool is_adapter(const remat_graph *g, int32_t id) {
  for (int32_t i = 0; i < g->nlora; i++)
    if (g->lora[i].a == id || g->lora[i].b == id)
      return true;
  return false;
}

/* Whether NAME is one of the comma-separated names of list. */
static bool listed(const char *list, const char *name) {
  char entry[REMAT__NAME_MAX];
  while (list != NULL && next_entry(&list, entry, sizeof entry))
    if (strcmp(entry, name) == 0)
      return true;
  return false;
}

remat_status model_lora_freeze(remat_graph *g, const char *who,
                               const remat_lora_config *lora, int first) {
  if (lora->rank == 0 || g->status != REMAT_OK)
    return g->status;
  const char *list = lora->trainable;
  char entry[REMAT__NAME_MAX];
  while (list != NULL && next_entry(&list, entry, sizeof entry))
    if (name_index_find(&g->param_names, entry) < 0)
      return graph_fail(g, REMAT_ERR_INVALID_ARG,
                        "%s: lora trainable '%s' is not a parameter of the "
                        "model",
                        who, entry);
  for (int i = first; i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    if (!is_adapter(g, p->id) && !listed(lora->trainable, p->name))
      remat_param_freeze(g, p);
  }
  return g->status;
}
