/* remat_gpt.h: the built-in GPT-style model of remat, built on a graph of
 * remat.h with the public op builders (token and position embedding,
 * pre-LN transformer blocks, each a checkpoint region, the LM head and the
 * cross-entropy loss). */
#ifndef REMAT_GPT_H
#define REMAT_GPT_H

#include "remat.h"
#include "remat_lora.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the GPT builder computes attention. */
typedef enum remat_attention_kind {
  REMAT_ATTENTION_DEFAULT = 0,      /* the builder's default (materialized) */
  REMAT_ATTENTION_FUSED = 1,        /* remat_fused_attention */
  REMAT_ATTENTION_MATERIALIZED = 2, /* remat_causal_self_attention */
} remat_attention_kind;

typedef struct remat_gpt_config {
  int layers, d_model, heads, seq, batch, vocab;
  int gelu_erf; /* 0: tanh GELU (default), 1: erf GELU */
  remat_attention_kind attention;
  /* LoRA adapters (remat_lora.h; all zero: none) on the modules
   * transformer.h.N.attn.c_attn, .attn.c_proj, .mlp.c_fc, .mlp.c_proj:
   * Hugging Face GPT-2's names, which the adapter files use. */
  remat_lora_config lora;
} remat_gpt_config;

typedef struct remat_gpt {
  remat_tensor *tokens;  /* input [batch, seq] int32 */
  remat_tensor *targets; /* input [batch, seq] int32 */
  remat_tensor *logits;  /* [batch, seq, vocab] */
  remat_tensor *loss;    /* [1] */
} remat_gpt;

/* The most layers remat_gpt_build builds: past it, it fails at once with
 * REMAT_ERR_LIMIT, before adding anything to the graph (a graph holds at
 * most 2^20 tensors; a block adds about 30). */
#define REMAT_GPT_MAX_LAYERS 10000

/* Builds token + position embedding, `layers` blocks of (pre-LN causal
 * multi-head attention + residual, pre-LN GELU feed-forward d->4d->d +
 * residual), a final layer norm, the LM head and the cross-entropy loss.
 * More than REMAT_GPT_MAX_LAYERS layers: REMAT_ERR_LIMIT. With
 * cfg->lora.rank > 0 the targeted linears get adapters
 * (remat_lora_linear, inside their block's region) and every other
 * parameter not in lora.trainable is frozen; bad LoRA settings fail with
 * a message before anything is added to the graph. */
REMAT_API remat_status remat_gpt_build(remat_graph *g,
                                       const remat_gpt_config *cfg,
                                       remat_gpt *out);
/* Model FLOPs of one training step (forward + backward, matmuls only). */
REMAT_API double remat_gpt_flops(const remat_gpt_config *cfg);

#ifdef __cplusplus
}
#endif

#endif
