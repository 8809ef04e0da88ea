/* encoder.c: a bidirectional transformer encoder built from remat's public
 * ops, as JAX's canonical remat example writes it (pre-LN blocks
 * x = x + attention(ln1(x)); x = x + ff2(gelu(ff1(ln2(x)))), each block a
 * checkpoint region whose policy saves only the named matmul results),
 * trained on a task that needs attention in both directions: at every
 * position, predict the token at the mirrored position (t -> T-1-t).
 *
 * The program checks that
 *  - the token accuracy on fresh batches reaches 95% (it exits 1 if it
 *    has not after MAX_STEPS steps);
 *  - with padded rows (the attention's key_lengths), the logits of the real
 *    positions of a row do not change, bitwise, when its padding tokens do.
 * Usage: encoder [--fused] [--steps N]. Exits 0 on success; errors go to
 * stderr, progress to stdout. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "encoder_model.h"
#include "remat.h"

enum {
  VOCAB = 8, /* data tokens 1..7; the padding check pads with data tokens */
  SEQ = 12,
  BATCH = 32,
  D = 64,
  HEADS = 4,
  LAYERS = 2,
  MAX_STEPS = 400,
  EVAL_EVERY = 10
};

/* A small generator of its own, so that runs are reproducible. */
static uint32_t next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(*s >> 33);
}

/* Rows of data tokens at full length, targets the mirrored tokens. */
static void batch(uint64_t *rng, int32_t *tokens, int32_t *targets,
                  int32_t *lengths) {
  for (int r = 0; r < BATCH; r++) {
    lengths[r] = SEQ;
    for (int t = 0; t < SEQ; t++)
      tokens[r * SEQ + t] = 1 + (int32_t)(next(rng) % (VOCAB - 1));
    for (int t = 0; t < SEQ; t++)
      targets[r * SEQ + t] = tokens[r * SEQ + SEQ - 1 - t];
  }
}

static double accuracy(const float *logits, const int32_t *targets) {
  int right = 0;
  for (int i = 0; i < BATCH * SEQ; i++) {
    int best = 0;
    for (int v = 1; v < VOCAB; v++)
      if (logits[i * VOCAB + v] > logits[i * VOCAB + best])
        best = v;
    right += best == targets[i];
  }
  return (double)right / (BATCH * SEQ);
}

static int fail(const char *what, remat_status s, const remat_graph *g) {
  fprintf(stderr, "encoder: %s: %s: %s\n", what, remat_status_string(s),
          g != NULL && remat_graph_error(g)[0] ? remat_graph_error(g)
                                               : remat_last_error());
  return 1;
}

static remat_status feed(remat_graph *g, const encoder *m,
                         const int32_t *tokens, const int32_t *targets,
                         const int32_t *lengths) {
  size_t n = sizeof(int32_t) * BATCH * SEQ;
  remat_status s = remat_feed(g, m->tokens, tokens, n);
  if (s == REMAT_OK)
    s = remat_feed(g, m->targets, targets, n);
  if (s == REMAT_OK)
    s = remat_feed(g, m->lengths, lengths, sizeof(int32_t) * BATCH);
  return s;
}

/* Pads each row past lengths[row] with `pad_token` (a data token, so that
 * the padding is not told apart by its value), runs a forward of the
 * inference graph g and returns its logits. */
static remat_status padded_logits(remat_graph *g, const encoder *m,
                                  const int32_t *tokens, int32_t pad_token,
                                  const int32_t *lengths, float *logits) {
  static int32_t padded[BATCH * SEQ];
  for (int r = 0; r < BATCH; r++)
    for (int t = 0; t < SEQ; t++)
      padded[r * SEQ + t] = t < lengths[r] ? tokens[r * SEQ + t] : pad_token;
  size_t n = sizeof(int32_t) * BATCH * SEQ;
  remat_status s = remat_feed(g, m->tokens, padded, n);
  if (s == REMAT_OK)
    s = remat_feed(g, m->lengths, lengths, sizeof(int32_t) * BATCH);
  if (s == REMAT_OK)
    s = remat_forward(g, NULL);
  if (s == REMAT_OK)
    s = remat_read(g, m->logits, logits, sizeof(float) * BATCH * SEQ * VOCAB);
  return s;
}

int main(int argc, char **argv) {
  int fused = 0, max_steps = MAX_STEPS;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--fused") == 0)
      fused = 1;
    else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
      max_steps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: encoder [--fused] [--steps N]\n");
      return 2;
    }
  }
  remat_runtime *rt = NULL;
  remat_graph *g = NULL;
  remat_status s = remat_runtime_create(NULL, &rt);
  if (s != REMAT_OK)
    return fail("remat_runtime_create", s, NULL);
  if ((s = remat_graph_create(rt, &g)) != REMAT_OK)
    return fail("remat_graph_create", s, NULL);
  encoder m;
  const encoder_config cfg = {.layers = LAYERS, .d_model = D,
                              .heads = HEADS, .seq = SEQ, .batch = BATCH,
                              .vocab = VOCAB, .fused = fused};
  /* each block saves only its named matmul results */
  const char *const saved[] = {"qkv", "attn_out", "ffn_in", "ffn_out"};
  remat_policy *policy = remat_policy_save_only_these_names(saved, 4);
  if (policy == NULL)
    return fail("remat_policy_save_only_these_names", REMAT_ERR_INVALID_ARG,
                NULL);
  s = encoder_build(g, &cfg, policy, &m);
  remat_policy_destroy(policy);
  if (s == REMAT_OK)
    s = remat_keep(g, m.logits);
  if (s != REMAT_OK)
    return fail("building the encoder", s, g);
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 3e-3f};
  if ((s = remat_compile(g, m.loss, &opt)) != REMAT_OK)
    return fail("remat_compile", s, g);

  static int32_t tokens[BATCH * SEQ], targets[BATCH * SEQ];
  static float logits[BATCH * SEQ * VOCAB], again[BATCH * SEQ * VOCAB];
  int32_t lengths[BATCH];
  uint64_t rng = 42;
  double acc = 0;
  int step = 0, good = 0;
  for (step = 1; step <= max_steps && good < 3; step++) {
    batch(&rng, tokens, targets, lengths);
    if ((s = feed(g, &m, tokens, targets, lengths)) != REMAT_OK ||
        (s = remat_step(g, NULL)) != REMAT_OK ||
        (s = remat_read(g, m.logits, logits, sizeof logits)) != REMAT_OK)
      return fail("training step", s, g);
    /* the logits of this step's forward, before its update: the
     * accuracy on a batch the model had not seen */
    acc = accuracy(logits, targets);
    good = acc >= 0.95 ? good + 1 : 0;
    if (step % EVAL_EVERY == 0 || good == 3) {
      float loss;
      remat_read(g, m.loss, &loss, sizeof loss);
      printf("step %d: loss %.4f, token accuracy %.3f\n", step, loss, acc);
    }
  }
  if (good < 3) {
    fprintf(stderr,
            "encoder: token accuracy %.3f after %d steps: expected at least "
            "0.95 on three batches in a row\n",
            acc, max_steps);
    return 1;
  }

  /* padding, on an inference graph of the same model holding the trained
   * weights: the same rows with other padding tokens give bitwise the same
   * logits at their real positions */
  remat_graph *infer = NULL;
  encoder im;
  if ((s = remat_graph_create(rt, &infer)) != REMAT_OK)
    return fail("remat_graph_create", s, NULL);
  if ((s = encoder_build(infer, &cfg, NULL, &im)) != REMAT_OK ||
      (s = remat_keep(infer, im.logits)) != REMAT_OK ||
      (s = remat_compile(infer, NULL, NULL)) != REMAT_OK ||
      (s = remat_copy_params(infer, g)) != REMAT_OK)
    return fail("the inference graph", s, infer);
  batch(&rng, tokens, targets, lengths);
  for (int r = 0; r < BATCH; r++)
    lengths[r] = SEQ / 2 + (int32_t)(next(&rng) % (SEQ / 2 + 1));
  if ((s = padded_logits(infer, &im, tokens, 1, lengths, logits)) !=
          REMAT_OK ||
      (s = padded_logits(infer, &im, tokens, VOCAB - 1, lengths, again)) !=
          REMAT_OK)
    return fail("forward of padded rows", s, infer);
  int changed = 0, padded_changed = 0, padded_rows = 0;
  for (int r = 0; r < BATCH; r++) {
    padded_rows += lengths[r] < SEQ;
    for (int t = 0; t < SEQ; t++) {
      size_t at = ((size_t)r * SEQ + t) * VOCAB;
      int differs = memcmp(logits + at, again + at, VOCAB * sizeof(float));
      if (t < lengths[r])
        changed += differs != 0;
      else
        padded_changed += differs != 0;
    }
  }
  if (changed != 0) {
    fprintf(stderr,
            "encoder: %d real positions changed their logits when only the "
            "padding tokens changed\n",
            changed);
    return 1;
  }
  if (padded_changed == 0) {
    fprintf(stderr, "encoder: the padded positions' logits did not change "
                    "with their tokens: the check compared nothing\n");
    return 1;
  }
  printf("padding: %d padded rows, real positions' logits unchanged, %d "
         "padded positions' changed\n",
         padded_rows, padded_changed);
  remat_graph_destroy(infer);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  printf("encoder: OK (%s attention, token accuracy %.3f at step %d)\n",
         fused ? "fused" : "materialized", acc, step - 1);
  return 0;
}
