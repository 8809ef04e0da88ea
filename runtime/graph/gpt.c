/* The GPT-style model builder: token and position embedding, pre-LN blocks
 * of causal attention and GELU feed-forward, each block a checkpoint region
 * with the runtime's default policy and named tensors, then the final layer
 * norm, the LM head and the cross-entropy loss. */
#include <math.h>
#include <stdio.h>

#include "base/alloc.h"
#include "remat_gpt.h"
#include "runtime/graph/model_parts.h"
#include "runtime/internal.h"

enum { C_ATTN = 1, ATTN_C_PROJ = 2, C_FC = 4, MLP_C_PROJ = 8 };

/* The adapted linear `mod` (attn.c_attn, ...) of block l, under Hugging
 * Face GPT-2's module name. */
static remat_tensor *proj(remat_graph *g, const remat_gpt_config *c,
                          unsigned mask, unsigned bit, int l, const char *mod,
                          const remat_tensor *x, remat_tensor *w,
                          remat_tensor *b) {
  char module[REMAT__NAME_MAX];
  snprintf(module, sizeof module, "transformer.h.%d.%s", l, mod);
  return model_linear(g, &c->lora, mask, bit, module, x, w, b, true);
}

static remat_tensor *block(remat_graph *g, const remat_gpt_config *c, int l,
                           unsigned mask, remat_tensor *x) {
  char b[24];
  snprintf(b, sizeof b, "h%d.", l);
  int64_t d = c->d_model;
  float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)c->layers);
  remat_tensor *ln1_g =
      model_param(g, b, "ln1.gamma", 1, d, 0, REMAT_INIT_ONES, 0);
  remat_tensor *ln1_b =
      model_param(g, b, "ln1.beta", 1, d, 0, REMAT_INIT_ZEROS, 0);
  remat_tensor *w_qkv =
      model_param(g, b, "attn.w_qkv", 2, 3 * d, d, REMAT_INIT_NORMAL, std);
  remat_tensor *b_qkv =
      model_param(g, b, "attn.b_qkv", 1, 3 * d, 0, REMAT_INIT_ZEROS, 0);
  remat_tensor *w_o =
      model_param(g, b, "attn.w_out", 2, d, d, REMAT_INIT_NORMAL, proj_std);
  remat_tensor *b_o =
      model_param(g, b, "attn.b_out", 1, d, 0, REMAT_INIT_ZEROS, 0);
  remat_tensor *ln2_g =
      model_param(g, b, "ln2.gamma", 1, d, 0, REMAT_INIT_ONES, 0);
  remat_tensor *ln2_b =
      model_param(g, b, "ln2.beta", 1, d, 0, REMAT_INIT_ZEROS, 0);
  remat_tensor *w_fc =
      model_param(g, b, "ffn.w_in", 2, 4 * d, d, REMAT_INIT_NORMAL, std);
  remat_tensor *b_fc =
      model_param(g, b, "ffn.b_in", 1, 4 * d, 0, REMAT_INIT_ZEROS, 0);
  remat_tensor *w_pr =
      model_param(g, b, "ffn.w_out", 2, d, 4 * d, REMAT_INIT_NORMAL, proj_std);
  remat_tensor *b_pr =
      model_param(g, b, "ffn.b_out", 1, d, 0, REMAT_INIT_ZEROS, 0);

  float eps = c->ln_eps > 0 ? c->ln_eps : 1e-5f;
  remat_region_begin(g, NULL);
  char region[16];
  snprintf(region, sizeof region, "h%d", l);
  remat_region_name(g, region);
  remat_tensor *h =
      model_named(g, remat_layernorm(g, x, ln1_g, ln1_b, eps), "ln1_out");
  remat_tensor *qkv = model_named(
      g, proj(g, c, mask, C_ATTN, l, "attn.c_attn", h, w_qkv, b_qkv), "qkv");
  remat_tensor *att = c->attention == REMAT_ATTENTION_FUSED
                          ? remat_fused_attention(g, qkv, c->heads)
                          : remat_causal_self_attention(g, qkv, c->heads);
  att = model_named(g, att, "attn_values");
  remat_tensor *o = model_named(
      g, proj(g, c, mask, ATTN_C_PROJ, l, "attn.c_proj", att, w_o, b_o),
      "attn_out");
  remat_tensor *x1 = model_named(g, remat_add(g, x, o), "resid_mid");
  h = model_named(g, remat_layernorm(g, x1, ln2_g, ln2_b, eps), "ln2_out");
  remat_tensor *f = model_named(
      g, proj(g, c, mask, C_FC, l, "mlp.c_fc", h, w_fc, b_fc), "ffn_in");
  f = model_named(
      g, remat_gelu(g, f, c->gelu_erf ? REMAT_GELU_ERF : REMAT_GELU_TANH),
      "ffn_act");
  f = model_named(g,
                  proj(g, c, mask, MLP_C_PROJ, l, "mlp.c_proj", f, w_pr, b_pr),
                  "ffn_out");
  remat_tensor *out = remat_add(g, x1, f);
  remat_region_end(g);
  return out;
}

static remat_status check_config(remat_graph *g, const remat_gpt_config *c) {
  if (c->layers < 1 || c->d_model < 1 || c->heads < 1 || c->seq < 1 ||
      c->batch < 1 || c->vocab < 2)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_gpt_build: layers %d, d_model %d, heads %d, seq "
                      "%d, batch %d, vocab %d: expected all >= 1 and vocab "
                      ">= 2",
                      c->layers, c->d_model, c->heads, c->seq, c->batch,
                      c->vocab);
  remat_status s =
      model_check_form(g, "remat_gpt_build", "layers", c->layers, c->attention);
  if (s != REMAT_OK)
    return s;
  if (c->positions != 0 && c->positions < c->seq)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_gpt_build: positions %d, seq %d: expected 0 (as "
                      "many as seq) or at least seq",
                      c->positions, c->seq);
  if (!isfinite(c->ln_eps) || c->ln_eps < 0)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_gpt_build: ln_eps %g: expected a finite value "
                      ">= 0 (0 for 1e-5)",
                      (double)c->ln_eps);
  if (c->d_model % c->heads != 0)
    return graph_fail(g, REMAT_ERR_SHAPE,
                      "remat_gpt_build: d_model %d is not divisible by heads "
                      "%d",
                      c->d_model, c->heads);
  return REMAT_OK;
}

/* The LoRA targets (bits of the linears) of c. */
static remat_status lora_mask(remat_graph *g, const remat_gpt_config *c,
                              unsigned *mask) {
  int64_t d = c->d_model;
  model_lora_module mods[] = {{"c_attn", C_ATTN, d},
                              {"attn.c_proj", ATTN_C_PROJ, d},
                              {"c_fc", C_FC, d},
                              {"mlp.c_proj", MLP_C_PROJ, d},
                              {"c_proj", ATTN_C_PROJ | MLP_C_PROJ, d}};
  return model_lora_targets(g, "remat_gpt_build", &c->lora, mods,
                            (int)(sizeof mods / sizeof mods[0]), "c_attn",
                            mask);
}

remat_status remat_gpt_build(remat_graph *g, const remat_gpt_config *c,
                             remat_gpt *out) {
  if (g == NULL || c == NULL || out == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_gpt_build: g, cfg and out must not be NULL");
  if (g->compiled) /* not sticky (graph_fail): the compiled graph works */
    return graph_fail(g, REMAT_ERR_STATE,
                      "remat_gpt_build: the graph is "
                      "already compiled: build the model before remat_compile");
  unsigned mask = 0;
  remat_status s = check_config(g, c);
  if (s == REMAT_OK)
    s = lora_mask(g, c, &mask);
  if (s != REMAT_OK)
    return s;
  int first = remat_num_params(g);
  int64_t bt[2] = {c->batch, c->seq};
  int64_t d = c->d_model;
  out->tokens = remat_input(g, "tokens", REMAT_I32, 2, bt);
  out->targets = remat_input(g, "targets", REMAT_I32, 2, bt);
  remat_tensor *wte =
      model_param(g, "", "wte", 2, c->vocab, d, REMAT_INIT_NORMAL, 0.02f);
  remat_tensor *wpe =
      model_param(g, "", "wpe", 2, c->positions > 0 ? c->positions : c->seq, d,
                  REMAT_INIT_NORMAL, 0.01f);
  remat_tensor *x = remat_embed(g, out->tokens, wte, wpe);
  for (int l = 0; l < c->layers; l++)
    x = block(g, c, l, mask, x);
  remat_tensor *lnf_g =
      model_param(g, "", "lnf.gamma", 1, d, 0, REMAT_INIT_ONES, 0);
  remat_tensor *lnf_b =
      model_param(g, "", "lnf.beta", 1, d, 0, REMAT_INIT_ZEROS, 0);
  remat_tensor *w_head =
      c->tie_head ? wte
                  : model_param(g, "", "lm_head", 2, c->vocab, d,
                                REMAT_INIT_NORMAL, 0.02f);
  x = remat_layernorm(g, x, lnf_g, lnf_b, c->ln_eps > 0 ? c->ln_eps : 1e-5f);
  out->logits = remat_linear(g, x, w_head, NULL);
  out->loss = remat_cross_entropy(g, out->logits, out->targets);
  return model_lora_freeze(g, "remat_gpt_build", &c->lora, first);
}

double remat_gpt_flops(const remat_gpt_config *c) {
  if (c == NULL)
    return 0.0;
  double n = (double)c->batch * c->seq, d = c->d_model;
  double per_layer =
      24.0 * n * d * d + 4.0 * c->batch * (double)c->seq * c->seq * d;
  double forward = c->layers * per_layer + 2.0 * n * d * c->vocab;
  return 3.0 * forward;
}
