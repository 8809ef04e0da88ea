/* The Llama-family model builder: token embedding, pre-norm blocks of
 * RMSNorm, q/k/v projections, RoPE, causal grouped-query attention and a
 * SwiGLU feed-forward, each block a checkpoint region with named tensors,
 * then the final RMSNorm, the LM head (tied or not) and the loss; built
 * with the public op builders only, under Hugging Face's parameter names. */
#include <math.h>
#include <stdio.h>

#include "remat_llama.h"
#include "runtime/graph/model_parts.h"
#include "runtime/internal.h"

static int kv_heads_of(const remat_llama_config *c) {
  return c->num_key_value_heads > 0 ? c->num_key_value_heads
                                    : c->num_attention_heads;
}

enum { Q = 1, K = 2, V = 4, O = 8, GATE = 16, UP = 32, DOWN = 64 };

/* The adapted linear `mod` (self_attn.q_proj, ...) of block prefix b. */
static remat_tensor *proj(remat_graph *g, const remat_llama_config *c,
                          unsigned mask, unsigned bit, const char *b,
                          const char *mod, const remat_tensor *x,
                          remat_tensor *w) {
  char module[REMAT__NAME_MAX];
  snprintf(module, sizeof module, "%s%s", b, mod);
  return model_linear(g, &c->lora, mask, bit, module, x, w, NULL, false);
}

static remat_tensor *block(remat_graph *g, const remat_llama_config *c, int l,
                           unsigned mask, remat_tensor *x) {
  int64_t d = c->hidden_size, ffn = c->intermediate_size;
  int heads = c->num_attention_heads, kvh = kv_heads_of(c);
  int64_t kvd = d / heads * kvh;
  float eps = c->rms_norm_eps > 0 ? c->rms_norm_eps : 1e-6f;
  float theta = c->rope_theta > 0 ? c->rope_theta : 10000.0f;
  char b[32];
  snprintf(b, sizeof b, "model.layers.%d.", l);
  float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * c->num_hidden_layers);
  remat_tensor *n1 =
      model_param(g, b, "input_layernorm.weight", 1, d, 0, REMAT_INIT_ONES, 0);
  remat_tensor *wq = model_param(g, b, "self_attn.q_proj.weight", 2, d, d,
                                 REMAT_INIT_NORMAL, std);
  remat_tensor *wk = model_param(g, b, "self_attn.k_proj.weight", 2, kvd, d,
                                 REMAT_INIT_NORMAL, std);
  remat_tensor *wv = model_param(g, b, "self_attn.v_proj.weight", 2, kvd, d,
                                 REMAT_INIT_NORMAL, std);
  remat_tensor *wo = model_param(g, b, "self_attn.o_proj.weight", 2, d, d,
                                 REMAT_INIT_NORMAL, proj_std);
  remat_tensor *n2 = model_param(g, b, "post_attention_layernorm.weight", 1, d,
                                 0, REMAT_INIT_ONES, 0);
  remat_tensor *wg = model_param(g, b, "mlp.gate_proj.weight", 2, ffn, d,
                                 REMAT_INIT_NORMAL, std);
  remat_tensor *wu = model_param(g, b, "mlp.up_proj.weight", 2, ffn, d,
                                 REMAT_INIT_NORMAL, std);
  remat_tensor *wd = model_param(g, b, "mlp.down_proj.weight", 2, d, ffn,
                                 REMAT_INIT_NORMAL, proj_std);

  remat_region_begin(g, NULL);
  char region[32];
  snprintf(region, sizeof region, "layers.%d", l);
  remat_region_name(g, region);
  remat_tensor *h = remat_rmsnorm(g, x, n1, eps);
  remat_tensor *q =
      model_named(g, proj(g, c, mask, Q, b, "self_attn.q_proj", h, wq), "q");
  remat_tensor *k =
      model_named(g, proj(g, c, mask, K, b, "self_attn.k_proj", h, wk), "k");
  remat_tensor *v =
      model_named(g, proj(g, c, mask, V, b, "self_attn.v_proj", h, wv), "v");
  q = remat_rope_scaled(g, q, heads, theta, &c->rope_scaling);
  k = remat_rope_scaled(g, k, kvh, theta, &c->rope_scaling);
  remat_attention_config ac = {.heads = heads,
                               .kv_heads = kvh,
                               .causal = 1,
                               .fused = c->attention == REMAT_ATTENTION_FUSED};
  remat_tensor *a =
      model_named(g, remat_attention(g, q, k, v, &ac), "attn_values");
  remat_tensor *o = model_named(
      g, proj(g, c, mask, O, b, "self_attn.o_proj", a, wo), "attn_out");
  remat_tensor *x1 = model_named(g, remat_add(g, x, o), "resid_mid");
  h = model_named(g, remat_rmsnorm(g, x1, n2, eps), "ln2_out");
  remat_tensor *gate =
      model_named(g, proj(g, c, mask, GATE, b, "mlp.gate_proj", h, wg), "gate");
  remat_tensor *up =
      model_named(g, proj(g, c, mask, UP, b, "mlp.up_proj", h, wu), "up");
  remat_tensor *f =
      model_named(g, remat_mul(g, remat_silu(g, gate), up), "ffn_act");
  f = model_named(g, proj(g, c, mask, DOWN, b, "mlp.down_proj", f, wd),
                  "ffn_out");
  remat_tensor *out = remat_add(g, x1, f);
  remat_region_end(g);
  return out;
}

static remat_status check_config(remat_graph *g, const remat_llama_config *c) {
  if (c->num_hidden_layers < 1 || c->hidden_size < 1 ||
      c->intermediate_size < 1 || c->num_attention_heads < 1 ||
      c->num_key_value_heads < 0 || c->vocab_size < 2 || c->seq < 1 ||
      c->batch < 1)
    return graph_fail(
        g, REMAT_ERR_INVALID_ARG,
        "remat_llama_build: num_hidden_layers %d, hidden_size %d, "
        "intermediate_size %d, num_attention_heads %d, num_key_value_heads "
        "%d, vocab_size %d, seq %d, batch %d: expected all >= 1 (key/value "
        "heads 0 for as many as the heads) and vocab_size >= 2",
        c->num_hidden_layers, c->hidden_size, c->intermediate_size,
        c->num_attention_heads, c->num_key_value_heads, c->vocab_size, c->seq,
        c->batch);
  if (!isfinite(c->rms_norm_eps) || !isfinite(c->rope_theta))
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_llama_build: rms_norm_eps %g, rope_theta %g: "
                      "expected finite values (0 for the defaults)",
                      (double)c->rms_norm_eps, (double)c->rope_theta);
  const char *flaw = remat__rope_scaling_flaw(&c->rope_scaling);
  if (flaw != NULL)
    return graph_fail(g, REMAT_ERR_INVALID_ARG,
                      "remat_llama_build: rope_scaling: %s is not valid",
                      flaw);
  remat_status s = model_check_form(g, "remat_llama_build", "num_hidden_layers",
                                    c->num_hidden_layers, c->attention);
  if (s != REMAT_OK)
    return s;
  int heads = c->num_attention_heads, kvh = kv_heads_of(c);
  if (c->hidden_size % heads != 0 || (c->hidden_size / heads) % 2 != 0)
    return graph_fail(g, REMAT_ERR_SHAPE,
                      "remat_llama_build: hidden_size %d with %d heads: the "
                      "heads must divide it into an even head size (RoPE)",
                      c->hidden_size, heads);
  if (heads % kvh != 0)
    return graph_fail(g, REMAT_ERR_SHAPE,
                      "remat_llama_build: num_attention_heads %d is not a "
                      "multiple of num_key_value_heads %d",
                      heads, kvh);
  return REMAT_OK;
}

/* The LoRA targets (bits of the projections) of c. */
static remat_status lora_mask(remat_graph *g, const remat_llama_config *c,
                              unsigned *mask) {
  int64_t d = c->hidden_size, ffn = c->intermediate_size;
  int64_t kvd = d / c->num_attention_heads * kv_heads_of(c);
  int64_t dffn = d < ffn ? d : ffn;
  model_lora_module mods[] = {{"q_proj", Q, d},          {"k_proj", K, kvd},
                              {"v_proj", V, kvd},        {"o_proj", O, d},
                              {"gate_proj", GATE, dffn}, {"up_proj", UP, dffn},
                              {"down_proj", DOWN, dffn}};
  return model_lora_targets(g, "remat_llama_build", &c->lora, mods,
                            (int)(sizeof mods / sizeof mods[0]),
                            "q_proj,v_proj", mask);
}

remat_status remat_llama_build(remat_graph *g, const remat_llama_config *c,
                               remat_gpt *out) {
  if (g == NULL || c == NULL || out == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_llama_build: g, cfg and out must not be NULL");
  if (g->compiled)
    return graph_fail(g, REMAT_ERR_STATE,
                      "remat_llama_build: the graph is already compiled: "
                      "build the model before remat_compile");
  unsigned mask = 0;
  remat_status s = check_config(g, c);
  if (s == REMAT_OK)
    s = lora_mask(g, c, &mask);
  if (s != REMAT_OK)
    return s;
  int first = remat_num_params(g);
  int64_t bt[2] = {c->batch, c->seq};
  int64_t d = c->hidden_size;
  out->tokens = remat_input(g, "tokens", REMAT_I32, 2, bt);
  out->targets = remat_input(g, "targets", REMAT_I32, 2, bt);
  remat_tensor *wte = model_param(g, "", "model.embed_tokens.weight", 2,
                                  c->vocab_size, d, REMAT_INIT_NORMAL, 0.02f);
  remat_tensor *x = remat_embed(g, out->tokens, wte, NULL);
  for (int l = 0; l < c->num_hidden_layers; l++)
    x = block(g, c, l, mask, x);
  remat_tensor *nf =
      model_param(g, "", "model.norm.weight", 1, d, 0, REMAT_INIT_ONES, 0);
  x = remat_rmsnorm(g, x, nf, c->rms_norm_eps > 0 ? c->rms_norm_eps : 1e-6f);
  remat_tensor *head =
      c->tie_word_embeddings
          ? wte
          : model_param(g, "", "lm_head.weight", 2, c->vocab_size, d,
                        REMAT_INIT_NORMAL, 0.02f);
  out->logits = remat_linear(g, x, head, NULL);
  out->loss = remat_cross_entropy(g, out->logits, out->targets);
  return model_lora_freeze(g, "remat_llama_build", &c->lora, first);
}

double remat_llama_flops(const remat_llama_config *c) {
  if (c == NULL || c->num_attention_heads < 1)
    return 0.0;
  double n = (double)c->batch * c->seq, d = c->hidden_size;
  double kvd = d / c->num_attention_heads *
               (c->num_key_value_heads > 0 ? c->num_key_value_heads
                                           : c->num_attention_heads);
  /* q, o: d x d; k, v: d x kvd; gate, up, down: d x I; attention: two
   * T x T products per batch row over d */
  double per_layer =
      2.0 * n * (2 * d * d + 2 * d * kvd + 3 * d * c->intermediate_size) +
      4.0 * c->batch * (double)c->seq * c->seq * d;
  double forward =
      c->num_hidden_layers * per_layer + 2.0 * n * d * c->vocab_size;
  return 3.0 * forward;
}
