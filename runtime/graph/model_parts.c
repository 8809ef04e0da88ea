/* What the built-in model builders (GPT, Llama) share: named parameters
 * and tensors, and the checks of the attention form and the layer limit,
 * with messages in each builder's field names. */
#include <stdio.h>

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
