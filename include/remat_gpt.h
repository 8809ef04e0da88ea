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
  int tie_head;  /* 1: the LM head reads wte (no lm_head parameter), as
                    GPT-2 ties it */
  int positions; /* rows of wpe (a checkpoint's n_positions); 0 means seq;
                    else at least seq */
  float ln_eps;  /* the layer norms' epsilon; 0 means 1e-5 */
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
 * Parameters: wte [vocab,d], wpe [positions,d]; per block N hN.ln1.gamma,
 * hN.ln1.beta [d], hN.attn.w_qkv [3d,d], hN.attn.b_qkv [3d],
 * hN.attn.w_out [d,d], hN.attn.b_out [d], hN.ln2.gamma, hN.ln2.beta [d],
 * hN.ffn.w_in [4d,d], hN.ffn.b_in [4d], hN.ffn.w_out [d,4d],
 * hN.ffn.b_out [d]; lnf.gamma, lnf.beta [d]; lm_head [vocab,d] unless
 * tie_head. positions below seq, or a NaN, infinite or negative ln_eps,
 * fail with a message. More than REMAT_GPT_MAX_LAYERS layers:
 * REMAT_ERR_LIMIT. With cfg->lora.rank > 0 the targeted linears get
 * adapters (remat_lora_linear, inside their block's region) and every
 * other parameter not in lora.trainable is frozen; bad LoRA settings fail
 * with a message before anything is added to the graph. */
REMAT_API remat_status remat_gpt_build(remat_graph *g,
                                       const remat_gpt_config *cfg,
                                       remat_gpt *out);
/* Model FLOPs of one training step (forward + backward, matmuls only). */
REMAT_API double remat_gpt_flops(const remat_gpt_config *cfg);

/* Loads a GPT-2 checkpoint as Hugging Face writes it (a model.safetensors,
 * or a sharded checkpoint's model.safetensors.index.json, read as
 * remat_load_safetensors reads them: F32, BF16 or F16, all or nothing)
 * onto a compiled graph that remat_gpt_build built with tie_head = 1,
 * positions = n_positions, vocab = vocab_size and gelu_erf = 0 (GPT-2's
 * gelu_new). The file's names map onto the builder's: wte.weight -> wte,
 * wpe.weight -> wpe, h.N.ln_1.{weight,bias} -> hN.ln1.{gamma,beta},
 * h.N.attn.c_attn.{weight,bias} -> hN.attn.{w_qkv,b_qkv},
 * h.N.attn.c_proj.* -> hN.attn.{w_out,b_out}, h.N.ln_2.* -> hN.ln2.*,
 * h.N.mlp.c_fc.* -> hN.ffn.{w_in,b_in}, h.N.mlp.c_proj.* ->
 * hN.ffn.{w_out,b_out}, ln_f.* -> lnf.{gamma,beta}; every name may carry
 * the prefix "transformer." (GPT2LMHeadModel's). The four weight matrices
 * are stored [in,out] (GPT-2's Conv1D) and are transposed into the
 * builder's [out,in]. The buffers h.N.attn.bias and h.N.attn.masked_bias
 * and a lm_head.weight (the tied head, wte again) are not parameters and
 * are skipped. A model with an untied lm_head, or with a parameter that
 * remat_gpt_build does not make, is refused with REMAT_ERR_INVALID_ARG
 * naming it; the file's problems fail as remat_load_safetensors's do,
 * naming the file's tensor. On any failure no parameter has changed. */
REMAT_API remat_status remat_gpt_load_hf(remat_graph *g, const char *path);

#ifdef __cplusplus
}
#endif

#endif
