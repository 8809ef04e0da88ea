/* Loading GPT-2 as Hugging Face writes it onto remat's GPT: the names of
 * GPT2Model's tensors mapped onto remat_gpt_build's, Conv1D's [in,out]
 * weights transposed, the attention-mask buffers and the tied head
 * skipped; the load itself is safetensors.c's, all or nothing. */
#include <stdio.h>
#include <string.h>

#include "remat_gpt.h"
#include "runtime/io/safetensors.h"

/* A block parameter's name after "hN." and its name after "h.N." in the
 * file, and whether the file holds it transposed (Conv1D's [in,out]). */
static const struct {
  const char *remat, *hf;
  bool transpose;
} block_names[] = {
    {"ln1.gamma", "ln_1.weight", false},
    {"ln1.beta", "ln_1.bias", false},
    {"attn.w_qkv", "attn.c_attn.weight", true},
    {"attn.b_qkv", "attn.c_attn.bias", false},
    {"attn.w_out", "attn.c_proj.weight", true},
    {"attn.b_out", "attn.c_proj.bias", false},
    {"ln2.gamma", "ln_2.weight", false},
    {"ln2.beta", "ln_2.bias", false},
    {"ffn.w_in", "mlp.c_fc.weight", true},
    {"ffn.b_in", "mlp.c_fc.bias", false},
    {"ffn.w_out", "mlp.c_proj.weight", true},
    {"ffn.b_out", "mlp.c_proj.bias", false},
};

static const struct {
  const char *remat, *hf;
} top_names[] = {{"wte", "wte.weight"},
                 {"wpe", "wpe.weight"},
                 {"lnf.gamma", "ln_f.weight"},
                 {"lnf.beta", "ln_f.bias"}};

/* The file's name of block parameter `name` ("h3.attn.w_qkv"); false when
 * it is not one of the builder's. */
static bool block_name(safet_item *it, const char *name) {
  int layer = -1, used = 0;
  if (sscanf(name, "h%d.%n", &layer, &used) != 1 || used == 0 || layer < 0)
    return false;
  for (size_t k = 0; k < sizeof block_names / sizeof *block_names; k++)
    if (strcmp(name + used, block_names[k].remat) == 0) {
      snprintf(it->name, sizeof it->name, "h.%d.%s", layer, block_names[k].hf);
      it->transpose = block_names[k].transpose;
      return true;
    }
  return false;
}

/* Gives each parameter its name in a Hugging Face GPT-2 file. */
static remat_status hf_names(safet_item *items, int n, const char *what) {
  for (int i = 0; i < n; i++) {
    char name[sizeof items[i].name];
    snprintf(name, sizeof name, "%s", items[i].name);
    bool found = block_name(&items[i], name);
    for (size_t k = 0; !found && k < sizeof top_names / sizeof *top_names; k++)
      if (strcmp(name, top_names[k].remat) == 0) {
        snprintf(items[i].name, sizeof items[i].name, "%s", top_names[k].hf);
        found = true;
      }
    if (strcmp(name, "lm_head") == 0)
      return remat__fail(REMAT_ERR_INVALID_ARG,
                         "%s: the model has its own LM head 'lm_head', but "
                         "GPT-2 ties the head to wte: build it with "
                         "tie_head = 1",
                         what);
    if (!found)
      return remat__fail(REMAT_ERR_INVALID_ARG,
                         "%s: parameter '%s' is not one of remat_gpt_build's, "
                         "so it has no name in a GPT-2 checkpoint",
                         what, remat__quote(&(remat__quoted){0}, name));
  }
  return REMAT_OK;
}

/* GPT-2's attention-mask buffers (h.N.attn.bias, h.N.attn.masked_bias)
 * and the head tied to wte (lm_head.weight). */
static bool hf_ignored(const char *name) {
  if (strcmp(name, "lm_head.weight") == 0)
    return true;
  int used = 0;
  if (strncmp(name, "h.", 2) != 0 || sscanf(name + 2, "%*d.%n", &used) != 0 ||
      used == 0 || name[2] < '0' || name[2] > '9')
    return false;
  return strcmp(name + 2 + used, "attn.bias") == 0 ||
         strcmp(name + 2 + used, "attn.masked_bias") == 0;
}

remat_status remat_gpt_load_hf(remat_graph *g, const char *path) {
  return safet_load_weights(g, path, "remat_gpt_load_hf", hf_names,
                            "transformer.", hf_ignored);
}
