/* The checks the built-in model builders (GPT, Llama) share: the attention
 * form and the layer limit, with messages in each builder's field names. */
#include "runtime/graph/model_check.h"

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
