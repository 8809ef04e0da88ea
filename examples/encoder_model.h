/* encoder_model.h: a bidirectional transformer encoder built from remat's
 * public ops (pre-LN blocks x = x + attention(ln1(x)); x = x +
 * ff2(gelu(ff1(ln2(x)))), non-causal attention over each row's key
 * lengths, each block a checkpoint region), for examples/encoder.c and
 * bench_train --model encoder. */
#ifndef REMAT_EXAMPLES_ENCODER_MODEL_H
#define REMAT_EXAMPLES_ENCODER_MODEL_H

#include <stdio.h>

#include "remat.h"

typedef struct encoder_config {
  int layers, d_model, heads, seq, batch, vocab;
  int fused; /* the attention form */
} encoder_config;

/* Inputs tokens, targets [batch, seq] and lengths [batch] (int32: each
 * row's key length), the logits [batch, seq, vocab] and the loss. */
typedef struct encoder {
  remat_tensor *tokens, *targets, *lengths, *logits, *loss;
} encoder;

static inline remat_tensor *encoder_param(remat_graph *g, const char *block,
                                          const char *name, int ndim,
                                          int64_t d0, int64_t d1,
                                          remat_init init, float scale) {
  char full[64];
  snprintf(full, sizeof full, "%s%s", block, name);
  int64_t dims[2] = {d0, d1};
  return remat_param(g, full, ndim, dims, init, scale);
}

static inline remat_tensor *encoder_named(remat_graph *g, remat_tensor *t,
                                          const char *name) {
  if (t != NULL)
    remat_checkpoint_name(g, t, name);
  return t;
}

/* Block l in region "e<l>" under `policy` (NULL: the runtime's default). */
static inline remat_tensor *encoder_block(remat_graph *g,
                                          const encoder_config *c,
                                          const remat_policy *policy, int l,
                                          remat_tensor *x,
                                          const remat_tensor *lengths) {
  char b[16];
  int64_t D = c->d_model;
  snprintf(b, sizeof b, "e%d.", l);
  remat_tensor *ln1_g =
      encoder_param(g, b, "ln1.gamma", 1, D, 0, REMAT_INIT_ONES, 0);
  remat_tensor *ln1_b =
      encoder_param(g, b, "ln1.beta", 1, D, 0, REMAT_INIT_ZEROS, 0);
  remat_tensor *w_qkv =
      encoder_param(g, b, "attn.w_qkv", 2, 3 * D, D, REMAT_INIT_NORMAL, 0.05f);
  remat_tensor *w_o =
      encoder_param(g, b, "attn.w_out", 2, D, D, REMAT_INIT_NORMAL, 0.02f);
  remat_tensor *ln2_g =
      encoder_param(g, b, "ln2.gamma", 1, D, 0, REMAT_INIT_ONES, 0);
  remat_tensor *ln2_b =
      encoder_param(g, b, "ln2.beta", 1, D, 0, REMAT_INIT_ZEROS, 0);
  remat_tensor *w_1 =
      encoder_param(g, b, "ffn.w_in", 2, 4 * D, D, REMAT_INIT_NORMAL, 0.05f);
  remat_tensor *b_1 =
      encoder_param(g, b, "ffn.b_in", 1, 4 * D, 0, REMAT_INIT_ZEROS, 0);
  remat_tensor *w_2 =
      encoder_param(g, b, "ffn.w_out", 2, D, 4 * D, REMAT_INIT_NORMAL, 0.02f);
  remat_tensor *b_2 =
      encoder_param(g, b, "ffn.b_out", 1, D, 0, REMAT_INIT_ZEROS, 0);

  remat_region_begin(g, policy);
  char region[16];
  snprintf(region, sizeof region, "e%d", l);
  remat_region_name(g, region);
  remat_tensor *h = remat_layernorm(g, x, ln1_g, ln1_b, 1e-5f);
  remat_tensor *qkv = encoder_named(g, remat_linear(g, h, w_qkv, NULL), "qkv");
  remat_attention_config cfg = {.heads = c->heads,
                                .causal = 0,
                                .key_lengths = lengths,
                                .fused = c->fused};
  remat_tensor *a =
      encoder_named(g, remat_attention(g, qkv, NULL, NULL, &cfg), "attn_values");
  remat_tensor *o = encoder_named(g, remat_linear(g, a, w_o, NULL), "attn_out");
  remat_tensor *x1 = remat_add(g, x, o);
  h = remat_layernorm(g, x1, ln2_g, ln2_b, 1e-5f);
  remat_tensor *f = encoder_named(g, remat_linear(g, h, w_1, b_1), "ffn_in");
  f = remat_gelu(g, f, REMAT_GELU_ERF);
  f = encoder_named(g, remat_linear(g, f, w_2, b_2), "ffn_out");
  remat_tensor *out = remat_add(g, x1, f);
  remat_region_end(g);
  return out;
}

/* The whole model, its blocks under `policy`; returns the graph's status. */
static inline remat_status encoder_build(remat_graph *g,
                                         const encoder_config *c,
                                         const remat_policy *policy,
                                         encoder *m) {
  int64_t bt[2] = {c->batch, c->seq}, b[1] = {c->batch};
  int64_t D = c->d_model;
  m->tokens = remat_input(g, "tokens", REMAT_I32, 2, bt);
  m->targets = remat_input(g, "targets", REMAT_I32, 2, bt);
  m->lengths = remat_input(g, "lengths", REMAT_I32, 1, b);
  remat_tensor *wte =
      encoder_param(g, "", "wte", 2, c->vocab, D, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *wpe =
      encoder_param(g, "", "wpe", 2, c->seq, D, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *x = remat_embed(g, m->tokens, wte, wpe);
  for (int l = 0; l < c->layers; l++)
    x = encoder_block(g, c, policy, l, x, m->lengths);
  remat_tensor *lnf_g =
      encoder_param(g, "", "lnf.gamma", 1, D, 0, REMAT_INIT_ONES, 0);
  remat_tensor *lnf_b =
      encoder_param(g, "", "lnf.beta", 1, D, 0, REMAT_INIT_ZEROS, 0);
  remat_tensor *head =
      encoder_param(g, "", "head", 2, c->vocab, D, REMAT_INIT_NORMAL, 0.02f);
  x = remat_layernorm(g, x, lnf_g, lnf_b, 1e-5f);
  m->logits = remat_linear(g, x, head, NULL);
  m->loss = remat_cross_entropy(g, m->logits, m->targets);
  return remat_graph_status(g);
}

/* Model FLOPs of one training step, counted as remat_gpt_flops does. */
static inline double encoder_flops(const encoder_config *c) {
  double n = (double)c->batch * c->seq, d = c->d_model;
  double per_layer =
      24.0 * n * d * d + 4.0 * c->batch * (double)c->seq * c->seq * d;
  return 3.0 * (c->layers * per_layer + 2.0 * n * d * c->vocab);
}

#endif
