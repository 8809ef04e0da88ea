/* remat_lora.h: low-rank adapters (LoRA) on the linears of a graph of
 * remat.h, the LoRA settings of the built-in models, and the adapter files
 * that Hugging Face's PEFT reads and writes. */
#ifndef REMAT_LORA_H
#define REMAT_LORA_H

#include "remat.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The LoRA settings of a built-in model (remat_gpt_config.lora,
 * remat_llama_config.lora). All zero: no adapters. */
typedef struct remat_lora_config {
  int rank;    /* r, 0 for no adapters; at most the smaller of the in and
                  out widths of each targeted linear */
  float alpha; /* lora_alpha: the update is scaled by alpha / r; 0 means r
                  (a scale of 1); finite and >= 0 */
  /* Comma-separated module names (PEFT's target_modules), NULL or "" for
   * the model's default. Llama: q_proj, k_proj, v_proj, o_proj,
   * gate_proj, up_proj, down_proj (default q_proj,v_proj). GPT (Hugging
   * Face GPT-2's names): c_attn (the fused q,k,v projection), attn.c_proj
   * (the attention's output), c_fc (the feed-forward's first linear),
   * mlp.c_proj (its second), c_proj (both c_proj); default c_attn. */
  const char *targets;
  /* Comma-separated parameter names that stay trainable (NULL or "" for
   * none): with rank > 0 every other parameter that is not an adapter is
   * frozen (remat_param_freeze). */
  const char *trainable;
} remat_lora_config;

/* y[..,out] = x[..,in] . w[out,in]^T + b + (alpha / rank) * (x . A^T) . B^T,
 * built from remat_linear, remat_scale and remat_add, where A [rank,in]
 * is the new parameter "MODULE.lora_A.weight", initialized normal with
 * standard deviation 1 / rank (PEFT's "gaussian" init), and B [out,rank]
 * the new parameter "MODULE.lora_B.weight", initialized to zeros, so that
 * y starts as the base linear's. w (and b, which may be NULL) are frozen.
 * x . A^T is named "MODULE's last component" + "_lora" (e.g. "q_proj_lora"
 * for "model.layers.0.self_attn.q_proj") for the name-based policies; the
 * ops belong to the region open at the call. The adapter is recorded on
 * the graph for remat_lora_save, remat_lora_load and
 * remat_lora_save_merged. A rank below 1 or above the smaller of in and
 * out, a NaN, infinite or negative alpha (0 means rank), a MODULE that is
 * NULL, empty, over 40 characters or already adapted, or w not a [out,in]
 * parameter fail with
 * a message on the graph's sticky error and return NULL. */
REMAT_API remat_tensor *remat_lora_linear(remat_graph *g, const remat_tensor *x,
                                          remat_tensor *w, remat_tensor *b,
                                          const char *module, int rank,
                                          float alpha);

/* The prefix of PEFT's tensor names: the adapter of module M is saved as
 * "base_model.model.M.lora_A.weight" and "...lora_B.weight". */
#define REMAT_LORA_PEFT_PREFIX "base_model.model."

/* Writes the graph's adapters alone, F32, under PEFT's names, to the
 * safetensors file PATH (as remat_save_safetensors writes: all or
 * nothing), and, unless CONFIG_PATH is NULL, PEFT's adapter_config.json to
 * CONFIG_PATH ("peft_type" "LORA", "task_type" "CAUSAL_LM", "r",
 * "lora_alpha", "target_modules" (the last components of the adapted
 * modules, sorted), "lora_dropout" 0, "bias" "none", "fan_in_fan_out"
 * (true for the GPT's modules, which Hugging Face stores as Conv1D),
 * "init_lora_weights" "gaussian"), so that a directory holding PATH as
 * adapter_model.safetensors and CONFIG_PATH as adapter_config.json is
 * one PEFT loads. The graph must be compiled and hold an adapter, all of
 * one rank and one alpha (PEFT's file has one of each). */
REMAT_API remat_status remat_lora_save(remat_graph *g, const char *path,
                                       const char *config_path);
/* Reads adapters written by remat_lora_save (or PEFT) into the graph's
 * adapters: every adapter under its PEFT name, with the shapes of the
 * graph's, F32, BF16 or F16, with the checks of remat_load_safetensors (a
 * missing, unknown or repeated tensor, a wrong shape or a bad value fail
 * and leave every parameter as it was). The base weights are untouched. */
REMAT_API remat_status remat_lora_load(remat_graph *g, const char *path);
/* Writes every parameter that is not an adapter, as
 * remat_save_safetensors writes (F32, under the graph's names: Hugging
 * Face's for the Llama), with each adapted weight w replaced by
 * w + (alpha / rank) * B . A (summed in f32, over the rank in order), so
 * that a graph without adapters that loads the file computes the same
 * function. The graph's own parameters do not change. */
REMAT_API remat_status remat_lora_save_merged(remat_graph *g, const char *path);

#ifdef __cplusplus
}
#endif

#endif
