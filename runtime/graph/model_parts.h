/* What the built-in model builders share (model_parts.c). */
#ifndef REMAT_GRAPH_MODEL_PARTS_H
#define REMAT_GRAPH_MODEL_PARTS_H

#include "remat_gpt.h"
#include "runtime/internal.h"

/* The parameter PREFIX NAME of shape [d0] (ndim 1) or [d0,d1] (ndim 2). */
remat_tensor *model_param(remat_graph *g, const char *prefix, const char *name,
                          int ndim, int64_t d0, int64_t d1, remat_init init,
                          float scale);
/* t, named `name` for the name-based policies (NULL stays NULL). */
remat_tensor *model_named(remat_graph *g, remat_tensor *t, const char *name);

/* Fails g (sticky error, message starting "WHO: ") unless the attention
 * form is one of remat_attention_kind and layers (named LAYERS_FIELD in
 * the message) is at most REMAT_GPT_MAX_LAYERS. */
remat_status model_check_form(remat_graph *g, const char *who,
                              const char *layers_field, int layers,
                              remat_attention_kind attention);

#endif
