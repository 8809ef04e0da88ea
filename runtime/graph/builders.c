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
  if (g != NULL && g->status == REMAT_OK && !isfinite(theta)) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "rope: theta %g is not valid: expected a finite theta (> 0, "
               "or <= 0 for 10000)",
               (double)theta);
    return NULL;
  }
  op_attrs attrs = {.heads = heads, .theta = theta > 0.0f ? theta : 1e4f};
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
  remat_tensor *scores = remat_attention_scores(g, qkv, heads);
  if (scores != NULL)
    remat_checkpoint_name(g, scores, "attn_scores");
  remat_tensor *probs = remat_softmax(g, scores);
  if (probs != NULL)
    remat_checkpoint_name(g, probs, "attn_probs");
  return remat_attention_values(g, probs, qkv, heads);
}

remat_tensor *remat_fused_attention(remat_graph *g, const remat_tensor *qkv,
                                    int heads) {
  op_attrs attrs = {.heads = heads};
  return graph_add_op(g, OP_ATTENTION, &qkv, 1, &attrs);
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
