/* The public op builders: each checks its arguments and adds one op node
 * (or a few, for composite ops) through graph_add_op. */
#include <math.h>

#include "runtime/internal.h"

remat_tensor *remat_linear(remat_graph *g, const remat_tensor *x,
                           const remat_tensor *w, const remat_tensor *b) {
  const remat_tensor *in[3] = {x, w, b};
  return graph_add_op(g, OP_LINEAR, in, b == NULL ? 2 : 3, NULL);
}

remat_tensor *remat_matmul(remat_graph *g, const remat_tensor *a,
                           const remat_tensor *b) {
  const remat_tensor *in[2] = {a, b};
  return graph_add_op(g, OP_MATMUL, in, 2, NULL);
}

remat_tensor *remat_add(remat_graph *g, const remat_tensor *a,
                        const remat_tensor *b) {
  const remat_tensor *in[2] = {a, b};
  return graph_add_op(g, OP_ADD, in, 2, NULL);
}

remat_tensor *remat_bias_add(remat_graph *g, const remat_tensor *x,
                             const remat_tensor *b) {
  const remat_tensor *in[2] = {x, b};
  return graph_add_op(g, OP_BIAS_ADD, in, 2, NULL);
}

remat_tensor *remat_relu(remat_graph *g, const remat_tensor *x) {
  return graph_add_op(g, OP_RELU, &x, 1, NULL);
}

remat_tensor *remat_gelu(remat_graph *g, const remat_tensor *x,
                         remat_gelu_form form) {
  if (g != NULL && g->status == REMAT_OK && form != REMAT_GELU_TANH &&
      form != REMAT_GELU_ERF) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "gelu: form %d is not valid: expected REMAT_GELU_TANH or "
               "REMAT_GELU_ERF",
               (int)form);
    return NULL;
  }
  op_attrs attrs = {.gelu_erf = form == REMAT_GELU_ERF};
  return graph_add_op(g, OP_GELU, &x, 1, &attrs);
}

remat_tensor *remat_layernorm(remat_graph *g, const remat_tensor *x,
                              const remat_tensor *gamma,
                              const remat_tensor *beta, float eps) {
  const remat_tensor *in[3] = {x, gamma, beta};
  if (g != NULL && g->status == REMAT_OK && !isfinite(eps)) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "layernorm: eps %g is not valid: expected a finite eps (> 0, "
               "or <= 0 for 1e-5)",
               (double)eps);
    return NULL;
  }
  op_attrs attrs = {.eps = eps > 0.0f ? eps : 1e-5f};
  return graph_add_op(g, OP_LAYERNORM, in, 3, &attrs);
}

remat_tensor *remat_rmsnorm(remat_graph *g, const remat_tensor *x,
                            const remat_tensor *gamma, float eps) {
  const remat_tensor *in[2] = {x, gamma};
  if (g != NULL && g->status == REMAT_OK && !isfinite(eps)) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "rmsnorm: eps %g is not valid: expected a finite eps (> 0, "
               "or <= 0 for 1e-6)",
               (double)eps);
    return NULL;
  }
  op_attrs attrs = {.eps = eps > 0.0f ? eps : 1e-6f};
  return graph_add_op(g, OP_RMSNORM, in, 2, &attrs);
}

remat_tensor *remat_slice(remat_graph *g, const remat_tensor *x,
                          int64_t start, int64_t len) {
  op_attrs attrs = {.start = start, .len = len};
  return graph_add_op(g, OP_SLICE, &x, 1, &attrs);
}

remat_tensor *remat_mul(remat_graph *g, const remat_tensor *a,
                        const remat_tensor *b) {
  const remat_tensor *in[2] = {a, b};
  return graph_add_op(g, OP_MUL, in, 2, NULL);
}

remat_tensor *remat_silu(remat_graph *g, const remat_tensor *x) {
  return graph_add_op(g, OP_SILU, &x, 1, NULL);
}

remat_tensor *remat_swiglu(remat_graph *g, const remat_tensor *gate,
                           const remat_tensor *up) {
  const remat_tensor *in[2] = {gate, up};
  return graph_add_op(g, OP_SWIGLU, in, 2, NULL);
}

remat_tensor *remat_scale(remat_graph *g, const remat_tensor *x, float s) {
  if (g != NULL && g->status == REMAT_OK && !isfinite(s)) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "scale: factor %g is not valid: expected a finite factor",
               (double)s);
    return NULL;
  }
  op_attrs attrs = {.scale = s};
  return graph_add_op(g, OP_SCALE, &x, 1, &attrs);
}

remat_tensor *remat_rope(remat_graph *g, const remat_tensor *x, int heads,
                         float theta) {
  return remat_rope_scaled(g, x, heads, theta, NULL);
}

const char *remat__rope_scaling_flaw(const remat_rope_scaling *s) {
  if (s->factor == 0.0f)
    return NULL;
  if (!isfinite(s->factor) || s->factor < 1.0f)
    return "factor (expected a finite value >= 1, or 0 for none)";
  if (!isfinite(s->low_freq_factor) || s->low_freq_factor <= 0.0f)
    return "low_freq_factor (expected a finite value > 0)";
  if (!isfinite(s->high_freq_factor) ||
      s->high_freq_factor <= s->low_freq_factor)
    return "high_freq_factor (expected a finite value > low_freq_factor)";
  if (s->original_max_position_embeddings < 1)
    return "original_max_position_embeddings (expected >= 1)";
  return NULL;
}

remat_tensor *remat_rope_scaled(remat_graph *g, const remat_tensor *x,
                                int heads, float theta,
                                const remat_rope_scaling *scaling) {
  if (g != NULL && g->status == REMAT_OK && !isfinite(theta)) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "rope: theta %g is not valid: expected a finite theta (> 0, "
               "or <= 0 for 10000)",
               (double)theta);
    return NULL;
  }
  op_attrs attrs = {.heads = heads, .theta = theta > 0.0f ? theta : 1e4f};
  if (scaling != NULL && scaling->factor != 0.0f) {
    const char *bad = remat__rope_scaling_flaw(scaling);
    if (g != NULL && g->status == REMAT_OK && bad != NULL) {
      graph_fail(g, REMAT_ERR_INVALID_ARG,
                 "rope: scaling factor %g, low_freq_factor %g, "
                 "high_freq_factor %g, original_max_position_embeddings %d: "
                 "%s is not valid",
                 (double)scaling->factor, (double)scaling->low_freq_factor,
                 (double)scaling->high_freq_factor,
                 scaling->original_max_position_embeddings, bad);
      return NULL;
    }
    attrs.rope_factor = scaling->factor;
    attrs.rope_low = scaling->low_freq_factor;
    attrs.rope_high = scaling->high_freq_factor;
    attrs.rope_orig = scaling->original_max_position_embeddings;
  }
  return graph_add_op(g, OP_ROPE, &x, 1, &attrs);
}

remat_tensor *remat_softmax(remat_graph *g, const remat_tensor *x) {
  return graph_add_op(g, OP_SOFTMAX, &x, 1, NULL);
}

remat_tensor *remat_attention_scores(remat_graph *g, const remat_tensor *qkv,
                                     int heads) {
  op_attrs attrs = {.heads = heads};
  return graph_add_op(g, OP_ATTN_SCORES, &qkv, 1, &attrs);
}

remat_tensor *remat_attention_values(remat_graph *g, const remat_tensor *probs,
                                     const remat_tensor *qkv, int heads) {
  const remat_tensor *in[2] = {probs, qkv};
  op_attrs attrs = {.heads = heads};
  return graph_add_op(g, OP_ATTN_VALUES, in, 2, &attrs);
}

remat_tensor *remat_causal_self_attention(remat_graph *g,
                                          const remat_tensor *qkv, int heads) {
  remat_attention_config c = {.heads = heads, .causal = 1};
  return remat_attention(g, qkv, NULL, NULL, &c);
}

remat_tensor *remat_fused_attention(remat_graph *g, const remat_tensor *qkv,
                                    int heads) {
  remat_attention_config c = {.heads = heads, .causal = 1, .fused = 1};
  return remat_attention(g, qkv, NULL, NULL, &c);
}

static bool dropout_ok(remat_graph *g, const char *what, float p) {
  if (p >= 0.0f && p < 1.0f)
    return true;
  graph_fail(g, REMAT_ERR_INVALID_ARG,
             "%s: dropout probability %g is not valid: expected a "
             "probability in [0,1)",
             what, (double)p);
  return false;
}

remat_tensor *remat_dropout(remat_graph *g, const remat_tensor *x, float p) {
  if (g != NULL && g->status == REMAT_OK && !dropout_ok(g, "dropout", p))
    return NULL;
  op_attrs attrs = {.dropout = p, .rng_stream = g ? g->ndropout : 0};
  remat_tensor *y = graph_add_op(g, OP_DROPOUT, &x, 1, &attrs);
  if (y != NULL)
    g->ndropout++;
  return y;
}

static bool same_shape(const op_shape *a, const op_shape *b) {
  if (a->ndim != b->ndim)
    return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->dim[i] != b->dim[i])
      return false;
  return true;
}

/* The config's fields that no shape check covers, and k against v. */
static bool attention_config_ok(remat_graph *g, const remat_tensor *k,
                                const remat_tensor *v,
                                const remat_attention_config *c) {
  const char *what = "attention";
  if (c == NULL) {
    graph_fail(g, REMAT_ERR_INVALID_ARG, "%s: the config is NULL", what);
    return false;
  }
  if ((k == NULL) != (v == NULL)) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: k is %s and v %s: give both (separate q, k, v) or "
               "neither (q is then a packed qkv)",
               what, k ? "given" : "NULL", v ? "given" : "NULL");
    return false;
  }
  if (k != NULL && graph_tensor_ok(g, k, what) &&
      graph_tensor_ok(g, v, what) && !same_shape(&k->shape, &v->shape)) {
    char bk[OP_SHAPE_STR_MAX], bv[OP_SHAPE_STR_MAX];
    graph_fail(g, REMAT_ERR_SHAPE,
               "%s: k %s and v %s: k and v must have the same shape", what,
               op_shape_str(&k->shape, bk), op_shape_str(&v->shape, bv));
    return false;
  }
  if (c->causal != 0 && c->causal != 1) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: causal %d is not valid: expected 0 or 1", what,
               c->causal);
    return false;
  }
  if (!isfinite(c->scale)) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: scale %g is not valid: expected a finite scale (0 for "
               "1/sqrt(head dim))",
               what, (double)c->scale);
    return false;
  }
  if (c->kv_heads < 0) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: kv_heads %d is not valid: expected 0 (as many as the "
               "heads) or a divisor of the heads",
               what, c->kv_heads);
    return false;
  }
  if (c->key_lengths != NULL && graph_tensor_ok(g, c->key_lengths, what) &&
      c->key_lengths->kind != TENSOR_INPUT) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: key lengths '%s' must be an input (remat_input, int32 "
               "[B]): remat_feed checks its lengths",
               what, c->key_lengths->name);
    return false;
  }
  return g->status == REMAT_OK && dropout_ok(g, what, c->dropout);
}

/* Scores, softmax, (dropout,) values, the scores and probabilities named
 * "attn_scores" and "attn_probs". */
static remat_tensor *materialized_attention(remat_graph *g,
                                            const remat_tensor *q,
                                            const remat_tensor *k,
                                            const remat_tensor *v,
                                            const remat_tensor *lens,
                                            op_attrs attrs) {
  const remat_tensor *in[3] = {q, k, lens};
  int n = k ? 2 : 1;
  if (lens)
    in[n++] = lens;
  remat_tensor *scores = graph_add_op(g, OP_ATTN_SCORES, in, n, &attrs);
  if (scores != NULL)
    remat_checkpoint_name(g, scores, "attn_scores");
  remat_tensor *probs = remat_softmax(g, scores);
  if (probs != NULL)
    remat_checkpoint_name(g, probs, "attn_probs");
  if (attrs.dropout > 0.0f)
    probs = remat_dropout(g, probs, attrs.dropout);
  const remat_tensor *vin[2] = {probs, v ? v : q};
  attrs.attn_lens = false;
  /* softmax of -inf is exactly 0, and dropout keeps a 0 */
  attrs.probs_causal = !attrs.attn_full;
  return graph_add_op(g, OP_ATTN_VALUES, vin, 2, &attrs);
}

remat_tensor *remat_attention(remat_graph *g, const remat_tensor *q,
                              const remat_tensor *k, const remat_tensor *v,
                              const remat_attention_config *cfg) {
  if (g == NULL || g->status != REMAT_OK) /* names the last op it adds */
    return graph_add_op(g, cfg && !cfg->fused ? OP_ATTN_VALUES : OP_ATTENTION,
                        &q, 1, NULL);
  if (!attention_config_ok(g, k, v, cfg))
    return NULL;
  op_attrs attrs = {.heads = cfg->heads,
                    .kv_heads = cfg->kv_heads,
                    .attn_full = cfg->causal == 0,
                    .attn_separate = k != NULL,
                    .attn_lens = cfg->key_lengths != NULL,
                    .attn_scale = cfg->scale,
                    .dropout = cfg->dropout};
  if (!cfg->fused)
    return materialized_attention(g, q, k, v, cfg->key_lengths, attrs);
  const remat_tensor *in[4] = {q, k, v, NULL};
  int n = k ? 3 : 1;
  if (cfg->key_lengths)
    in[n++] = cfg->key_lengths;
  if (attrs.dropout > 0.0f)
    attrs.rng_stream = g->ndropout;
  remat_tensor *o = graph_add_op(g, OP_ATTENTION, in, n, &attrs);
  if (o != NULL && attrs.dropout > 0.0f)
    g->ndropout++;
  return o;
}

remat_tensor *remat_embed(remat_graph *g, const remat_tensor *tokens,
                          const remat_tensor *wte, const remat_tensor *wpe) {
  const remat_tensor *in[3] = {tokens, wte, wpe};
  return graph_add_op(g, OP_EMBED, in, wpe == NULL ? 2 : 3, NULL);
}

remat_tensor *remat_cross_entropy(remat_graph *g, const remat_tensor *logits,
                                  const remat_tensor *targets) {
  const remat_tensor *in[2] = {logits, targets};
  return graph_add_op(g, OP_CROSS_ENTROPY, in, 2, NULL);
}

remat_tensor *remat_sum(remat_graph *g, const remat_tensor *x) {
  return graph_add_op(g, OP_SUM, &x, 1, NULL);
}

remat_tensor *remat_mean(remat_graph *g, const remat_tensor *x) {
  return graph_add_op(g, OP_MEAN, &x, 1, NULL);
}
