/* The checks the built-in model builders share (model_check.c). */
#ifndef REMAT_GRAPH_MODEL_CHECK_H
#define REMAT_GRAPH_MODEL_CHECK_H

#include "remat_gpt.h"
#include "runtime/internal.h"

/* Fails g (sticky error, message starting "WHO: ") unless the attention
 * form is one of remat_attention_kind and layers (named LAYERS_FIELD in
 * the message) is at most REMAT_GPT_MAX_LAYERS. */
remat_status model_check_form(remat_graph *g, const char *who,
                              const char *layers_field, int layers,
                              remat_attention_kind attention);

#endif
