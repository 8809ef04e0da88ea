/* remat_llama.h: a Llama-family model built on a graph of remat.h with the
 * public op builders (token embedding without positions, pre-norm blocks
 * of RMSNorm, q/k/v projections, RoPE, causal grouped-query attention and a
 * SwiGLU feed-forward, each block a checkpoint region; the final RMSNorm,
 * the LM head and the cross-entropy loss), with Hugging Face's parameter
 * names. */
#ifndef REMAT_LLAMA_H
#define REMAT_LLAMA_H

#include "remat.h"
#include "remat_gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The fields of Hugging Face's LlamaConfig that shape the model, plus the
 * step's sequence length and batch and the attention form. */
typedef struct remat_llama_config {
  int hidden_size;         /* d */
  int intermediate_size;   /* the feed-forward's width */
  int num_hidden_layers;   /* blocks */
  int num_attention_heads; /* H; divides hidden_size */
  int num_key_value_heads; /* KVH; 0 means H; divides H */
  int vocab_size;
  float rms_norm_eps;      /* 0 means 1e-6 */
  float rope_theta;        /* 0 means 10000 */
  int tie_word_embeddings; /* 1: the LM head reads the embedding table */
  int seq, batch;
  remat_attention_kind attention; /* DEFAULT: materialized */
  /* LoRA adapters (remat_lora.h; all zero: none) on the modules
   * model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.{gate,up,
   * down}_proj. */
  remat_lora_config lora;
  /* Llama 3's rope_scaling (remat_rope_scaled; factor 0: none) */
  remat_rope_scaling rope_scaling;
} remat_llama_config;

/* Builds the model on g. Parameters (Hugging Face's names):
 * model.embed_tokens.weight [V,d]; per block N
 * model.layers.N.input_layernorm.weight [d],
 * model.layers.N.self_attn.{q,o}_proj.weight [d,d],
 * model.layers.N.self_attn.{k,v}_proj.weight [KVH*hd,d],
 * model.layers.N.post_attention_layernorm.weight [d],
 * model.layers.N.mlp.{gate,up}_proj.weight [I,d],
 * model.layers.N.mlp.down_proj.weight [d,I]; model.norm.weight [d];
 * lm_head.weight [V,d] unless tied. Block N is the checkpoint region
 * "layers.N" (the runtime's default policy) with the named tensors q, k, v
 * (projections, before RoPE), attn_values, attn_out, resid_mid, ln2_out,
 * gate, up, ffn_act (silu(gate) * up) and ffn_out. The outputs are those of
 * remat_gpt (tokens, targets, logits, loss). A size below 1, heads that do
 * not divide the width or key/value heads that do not divide the heads,
 * an odd head size, a NaN or infinite eps or theta, or more than
 * REMAT_GPT_MAX_LAYERS layers fail with a message, before anything is
 * added to the graph. With cfg->lora.rank > 0 the targeted projections
 * get adapters (remat_lora_linear, inside their block's region; the
 * tensor x . A^T is named q_proj_lora, v_proj_lora, ...) and every other
 * parameter not in lora.trainable is frozen; bad LoRA settings fail with
 * a message before anything is added to the graph. */
REMAT_API remat_status remat_llama_build(remat_graph *g,
                                         const remat_llama_config *cfg,
                                         remat_gpt *out);
/* Model FLOPs of one training step (forward + backward, matmuls and the
 * attention products only), as remat_gpt_flops counts them. */
REMAT_API double remat_llama_flops(const remat_llama_config *cfg);

#ifdef __cplusplus
}
#endif

#endif
