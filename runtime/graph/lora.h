/* LoRA adapters on a linear (lora.c). */
#ifndef REMAT_GRAPH_LORA_H
#define REMAT_GRAPH_LORA_H

#include "runtime/internal.h"

/* remat_lora_linear's body: the adapter on module MODULE (conv1d: Hugging
 * Face stores it as a Conv1D), without freezing w and b. */
remat_tensor *graph_lora_linear(remat_graph *g, const remat_tensor *x,
                                remat_tensor *w, remat_tensor *b,
                                const char *module, int rank, float alpha,
                                bool conv1d);

#endif
