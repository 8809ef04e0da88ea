/* A pre-trained model's directory as Hugging Face writes it, for
 * remat-train --init and the tests: config.json (model_type llama or gpt2
 * and their fields) and the weights beside it (model.safetensors, or a
 * sharded checkpoint's model.safetensors.index.json). */
#ifndef REMAT_TOOLS_HF_INIT_H
#define REMAT_TOOLS_HF_INIT_H

#include <stddef.h>

#include "remat.h"
#include "remat_gpt.h"
#include "remat_llama.h"

/* The most bytes of a config.json. */
#define HF_CONFIG_MAX (1 << 20)

typedef struct hf_model {
  int gpt2;                 /* 1: GPT-2 (gpt), 0: Llama (llama) */
  remat_gpt_config gpt;     /* GPT-2: all but seq, batch and attention */
  remat_llama_config llama; /* Llama: the same */
  int vocab;                /* vocab_size */
  int positions;            /* n_positions or max_position_embeddings;
                               0: not given (Llama) */
  char weights[4160];       /* DIR/model.safetensors or the index */
} hf_model;

/* Reads DIR/config.json and finds the weights. Returns 0, or -1 after a
 * one-line message in `err` naming the file and the field: the file
 * missing, larger than HF_CONFIG_MAX or not a JSON object, model_type
 * missing or not "llama" or "gpt2", a field the model needs missing, of
 * the wrong JSON type, not a whole number, below 1 or above its limit,
 * heads that do not divide the width, or a field that asks for what remat
 * does not build (rope_scaling, attention or MLP biases in a Llama, an
 * activation other than silu or gelu_new, an untied GPT-2 head). Fields
 * that do not shape the model (architectures, torch_dtype, token ids ...)
 * are not read. */
int hf_read(const char *dir, hf_model *m, char *err, size_t err_len);

/* Builds the model on g for `seq` and `batch` with the attention form and
 * LoRA settings (rank 0: none). */
remat_status hf_build(remat_graph *g, const hf_model *m, int seq, int batch,
                      remat_attention_kind attention,
                      const remat_lora_config *lora, remat_gpt *out);

/* Loads the weights into the compiled graph g that hf_build built: a Llama
 * with remat_load_safetensors (its names are Hugging Face's), a GPT-2 with
 * remat_gpt_load_hf. */
remat_status hf_load(remat_graph *g, const hf_model *m);

#endif
