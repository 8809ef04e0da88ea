/* What the built-in model builders share (model_parts.c). */
#ifndef REMAT_GRAPH_MODEL_PARTS_H
#define REMAT_GRAPH_MODEL_PARTS_H

#include "remat_gpt.h"
#include "remat_lora.h"
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

/* ---- LoRA (lora.c and model_parts.c) ---- */

/* A module name that a model's LoRA targets may hold: the bits of the
 * linears it names, and the smallest in or out width among them. */
typedef struct model_lora_module {
  const char *name;
  unsigned bits;
  int64_t width;
} model_lora_module;

/* Checks lora (rank, alpha, targets among the n modules, DEF when NULL or
 * empty) and sets *mask to the targeted linears' bits (0 when rank is 0);
 * fails g with a message starting "WHO: " before anything is built. */
remat_status model_lora_targets(remat_graph *g, const char *who,
                                const remat_lora_config *lora,
                                const model_lora_module *mods, int n,
                                const char *def, unsigned *mask);
/* x . w^T + b, with an adapter on MODULE when `bit` is in mask. */
remat_tensor *model_linear(remat_graph *g, const remat_lora_config *lora,
                           unsigned mask, unsigned bit, const char *module,
                           const remat_tensor *x, remat_tensor *w,
                           remat_tensor *b, bool conv1d);
/* With lora->rank > 0: freezes each parameter from number `first` on that
 * is not an adapter and not named in lora->trainable, each name of which
 * must be a parameter. */
remat_status model_lora_freeze(remat_graph *g, const char *who,
                               const remat_lora_config *lora, int first);

#endif
