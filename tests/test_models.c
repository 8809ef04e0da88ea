/* Tests of the models beside the GPT, built from the public ops: the
 * Llama-style model (remat_llama_build: RMSNorm, RoPE, grouped-query
 * attention with 4 query heads per key/value head, SwiGLU, no biases, tied
 * embeddings) and the bidirectional encoder of examples/encoder_model.h
 * (padded rows through key lengths). Each trains in both attention forms, its gradients are
 * bitwise the same under every policy, thread count and NUMA layout, a
 * name policy saves exactly the tensors it names, a memory budget holds,
 * and every allocation of its compile can fail cleanly. Run in f32 and,
 * as test_llama_bf16, in bf16 (REMAT_PRECISION). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/alloc.h"
#include "examples/encoder_model.h"
#include "fuse_env.h"
#include "remat_llama.h"

/* 4 query heads per key/value head; gate/up of 96 columns. */
static const remat_llama_config small = {.hidden_size = 64,
                                         .intermediate_size = 96,
                                         .num_hidden_layers = 2,
                                         .num_attention_heads = 8,
                                         .num_key_value_heads = 2,
                                         .vocab_size = 29,
                                         .tie_word_embeddings = 1,
                                         .seq = 24,
                                         .batch = 4};

/* Tokens and targets of a fixed task: each target is a function of the
 * token and the one three positions back (attention must look back). */
static void llama_batch(const remat_llama_config *c, int32_t *tokens,
                        int32_t *targets, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 777u;
  for (int b = 0; b < c->batch; b++)
    for (int t = 0; t < c->seq; t++) {
      x = x * 1664525u + 1013904223u;
      int i = b * c->seq + t;
      tokens[i] = (int32_t)((x >> 16) % (uint32_t)c->vocab_size);
      targets[i] = (int32_t)((tokens[i] + 2 * (t >= 3 ? tokens[i - 3] : 0)) %
                             c->vocab_size);
    }
}

/* The encoder at the same sizes, rows padded to lengths 24, 17, 9, 24. */
static const encoder_config small_encoder = {.layers = 2,
                                             .d_model = 64,
                                             .heads = 8,
                                             .seq = 24,
                                             .batch = 4,
                                             .vocab = 29};
static const int32_t encoder_lengths[4] = {24, 17, 9, 24};

/* One model of the tests: the Llama-style one, or the encoder. */
typedef struct model_case {
  int encoder; /* 0: llama, 1: encoder */
  remat_llama_config llama;
  encoder_config enc;
} model_case;

static model_case llama_case(int fused, int tied) {
  model_case mc = {.llama = small};
  mc.llama.attention = fused ? REMAT_ATTENTION_FUSED : REMAT_ATTENTION_DEFAULT;
  mc.llama.tie_word_embeddings = tied;
  return mc;
}

static model_case encoder_case(int fused) {
  model_case mc = {.encoder = 1, .enc = small_encoder};
  mc.enc.fused = fused;
  /* the batch function reads the shared sizes from here */
  mc.llama.seq = small_encoder.seq;
  mc.llama.batch = small_encoder.batch;
  mc.llama.vocab_size = small_encoder.vocab;
  return mc;
}

static const char *case_name(const model_case *mc) {
  if (mc->encoder)
    return mc->enc.fused ? "encoder, fused" : "encoder, materialized";
  return mc->llama.attention == REMAT_ATTENTION_FUSED ? "llama, fused"
                                                      : "llama, materialized";
}

static const remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};

typedef struct run {
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  int32_t tokens[4 * 24], targets[4 * 24];
} run;

/* Builds, compiles (opt NULL: gradients only) and feeds batch `seed`. */
static remat_status build_case(remat_graph *g, const model_case *mc,
                               remat_gpt *m, remat_tensor **lengths) {
  *lengths = NULL;
  if (!mc->encoder)
    return remat_llama_build(g, &mc->llama, m);
  encoder e;
  remat_status s = encoder_build(g, &mc->enc, NULL, &e);
  *m = (remat_gpt){.tokens = e.tokens, .targets = e.targets,
                   .logits = e.logits, .loss = e.loss};
  *lengths = e.lengths;
  return s;
}

static remat_status open_run(run *r, const model_case *mc,
                             const remat_config *rc,
                             const remat_optimizer *opt, uint32_t seed) {
  memset(r, 0, sizeof *r);
  remat_status s = remat_runtime_create(rc, &r->rt);
  if (s == REMAT_OK)
    s = remat_graph_create(r->rt, &r->g);
  if (s == REMAT_OK)
    s = remat_graph_seed(r->g, 3);
  remat_tensor *lengths = NULL;
  if (s == REMAT_OK)
    s = build_case(r->g, mc, &r->m, &lengths);
  if (s == REMAT_OK)
    s = remat_compile(r->g, r->m.loss, opt);
  if (s != REMAT_OK)
    return s;
  const remat_llama_config *c = &mc->llama;
  if (lengths != NULL &&
      (s = remat_feed(r->g, lengths, encoder_lengths,
                      sizeof encoder_lengths)) != REMAT_OK)
    return s;
  llama_batch(c, r->tokens, r->targets, seed);
  size_t n = (size_t)c->batch * c->seq * sizeof(int32_t);
  s = remat_feed(r->g, r->m.tokens, r->tokens, n);
  if (s == REMAT_OK)
    s = remat_feed(r->g, r->m.targets, r->targets, n);
  return s;
}

static void close_run(run *r) {
  remat_graph_destroy(r->g);
  remat_runtime_destroy(r->rt);
  memset(r, 0, sizeof *r);
}

static remat_config threads_policy(int threads, const char *policy) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_TRACE | REMAT_SET_MEMORY_BUDGET |
                            REMAT_SET_TOPOLOGY,
                     .num_threads = threads,
                     .policy = policy};
  return rc;
}

static void must(remat_status s, const char *what) {
  if (s != REMAT_OK)
    fail_msg("%s: %s: %s", what, remat_status_string(s), remat_last_error());
}

/* FNV-1a over every gradient's bytes in parameter order, and the loss. */
static uint64_t grad_hash(run *r) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < remat_num_params(r->g); i++) {
    remat_tensor *p = remat_param_at(r->g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    float *grad = malloc(n * sizeof *grad);
    assert_non_null(grad);
    must(remat_read_grad(r->g, p, grad, n * sizeof *grad), "remat_read_grad");
    const unsigned char *b = (const unsigned char *)grad;
    for (size_t k = 0; k < n * sizeof *grad; k++)
      h = (h ^ b[k]) * 1099511628211ull;
    free(grad);
  }
  float loss;
  must(remat_read(r->g, r->m.loss, &loss, sizeof loss), "remat_read loss");
  const unsigned char *b = (const unsigned char *)&loss;
  for (size_t k = 0; k < sizeof loss; k++)
    h = (h ^ b[k]) * 1099511628211ull;
  return h;
}

/* ---- training ---- */

static void trains(const model_case *mc) {
  run r;
  const remat_llama_config *c = &mc->llama;
  remat_config rc = threads_policy(2, "nothing_saveable");
  must(open_run(&r, mc, &rc, &adamw, 1), "open");
  float first = 0, last = 0;
  for (int step = 0; step < 40; step++) {
    /* two batches in turn: the task, not one batch, is learned */
    llama_batch(c, r.tokens, r.targets, 1 + step % 2);
    size_t n = (size_t)c->batch * c->seq * sizeof(int32_t);
    must(remat_feed(r.g, r.m.tokens, r.tokens, n), "feed");
    must(remat_feed(r.g, r.m.targets, r.targets, n), "feed");
    must(remat_step(r.g, NULL), "remat_step");
    float loss;
    must(remat_read(r.g, r.m.loss, &loss, sizeof loss), "read loss");
    if (step < 2)
      first += loss / 2;
    if (step >= 38)
      last += loss / 2;
  }
  if (!(last < 0.6f * first))
    fail_msg("%s: loss %.4f over the first two steps, %.4f over the last "
             "two: expected below 0.6x",
             case_name(mc), first, last);
  close_run(&r);
}

static void test_trains_llama(void **state) {
  (void)state;
  model_case a = llama_case(0, 1), b = llama_case(1, 0);
  trains(&a);
  trains(&b);
}

static void test_trains_encoder(void **state) {
  (void)state;
  model_case a = encoder_case(0), b = encoder_case(1);
  trains(&a);
  trains(&b);
}

/* ---- bitwise under policies, threads and NUMA layouts ---- */

static uint64_t hash_of(const model_case *mc, int threads, const char *topo,
                        const char *policy_text) {
  run r;
  remat_config rc = threads_policy(threads, policy_text);
  rc.topology = topo;
  must(open_run(&r, mc, &rc, NULL, 5), policy_text);
  must(remat_step(r.g, NULL), "remat_step");
  uint64_t h = grad_hash(&r);
  close_run(&r);
  return h;
}

static void bitwise(const model_case *mc) {
  const char *const policies[] = {
      "everything_saveable", "nothing_saveable", "dots_saveable",
      "dots_with_no_batch_dims_saveable",
      mc->encoder ? "save_only_these_names:qkv,ffn_in"
                  : "save_only_these_names:gate,up"};
  uint64_t want = hash_of(mc, 1, NULL, policies[0]);
  for (size_t p = 0; p < sizeof policies / sizeof *policies; p++)
    for (int threads = 1; threads <= 2; threads++) {
      uint64_t h = hash_of(mc, threads, NULL, policies[p]);
      if (h != want)
        fail_msg("%s: gradients under %s at %d threads differ from "
                 "everything_saveable at 1 thread",
                 case_name(mc), policies[p], threads);
    }
  uint64_t h = hash_of(mc, 2, "package:2 numa:1 core:1 pu:1",
                       "nothing_saveable");
  if (h != want)
    fail_msg("%s: gradients on two NUMA nodes differ", case_name(mc));
}

static void test_bitwise_llama(void **state) {
  (void)state;
  model_case a = llama_case(0, 1), b = llama_case(1, 0);
  bitwise(&a);
  bitwise(&b);
}

static void test_bitwise_encoder(void **state) {
  (void)state;
  model_case a = encoder_case(0), b = encoder_case(1);
  bitwise(&a);
  bitwise(&b);
}

/* ---- what a name policy saves ---- */

/* The tensor named `name` (remat_checkpoint_name) in block `layer`: the
 * layer-th of that name, as blocks are built in order. */
static const remat_tensor *named_tensor(remat_graph *g, const char *name,
                                        int layer) {
  for (int i = 0, seen = 0; i < remat_num_tensors(g); i++) {
    remat_tensor *t = remat_tensor_at(g, i);
    if (strcmp(remat_tensor_name(t), name) == 0 && seen++ == layer)
      return t;
  }
  fail_msg("no tensor %s in block %d", name, layer);
  return NULL;
}

static void test_name_policy_saves_named(void **state) {
  (void)state;
  run r;
  remat_config rc = threads_policy(1, "save_only_these_names:gate,up");
  model_case mc = llama_case(0, 1);
  must(open_run(&r, &mc, &rc, &adamw, 1), "open");
  static const char *const saved[] = {"gate", "up"};
  static const char *const recomputed[] = {
      "q", "k", "v", "attn_values", "attn_out", "resid_mid", "ln2_out",
      "ffn_act"};
  /* with fused epilogues (unless REMAT_FUSE=0) attn_out, a linear's output
   * that only the residual add reads, is never stored: the add runs in
   * the linear's matmul, recomputing resid_mid from attn_values */
  bool fused = fusion_on();
  for (int l = 0; l < small.num_hidden_layers; l++) {
    remat_tensor_plan tp;
    for (size_t i = 0; i < 2; i++) {
      must(remat_tensor_plan_of(r.g, named_tensor(r.g, saved[i], l), &tp),
           saved[i]);
      if (!tp.saved || tp.recomputed || tp.region != l)
        fail_msg("layers.%d.%s: saved %d recomputed %d region %d, expected "
                 "saved by region %d",
                 l, saved[i], tp.saved, tp.recomputed, tp.region, l);
    }
    for (size_t i = 0; i < sizeof recomputed / sizeof *recomputed; i++) {
      must(remat_tensor_plan_of(r.g, named_tensor(r.g, recomputed[i], l), &tp),
           recomputed[i]);
      bool neither = fused && strcmp(recomputed[i], "attn_out") == 0;
      if (tp.saved || tp.recomputed != !neither)
        fail_msg("layers.%d.%s: saved %d recomputed %d, expected %s", l,
                 recomputed[i], tp.saved, tp.recomputed,
                 neither ? "neither (fused)" : "recomputed");
    }
    /* ffn_out feeds only the residual add, whose backward reads no value:
     * neither saved nor recomputed */
    must(remat_tensor_plan_of(r.g, named_tensor(r.g, "ffn_out", l), &tp),
         "ffn_out");
    if (tp.saved || tp.recomputed)
      fail_msg("layers.%d.ffn_out: saved %d recomputed %d, expected neither",
               l, tp.saved, tp.recomputed);
  }
  must(remat_step(r.g, NULL), "remat_step");
  close_run(&r);
}

/* ---- a memory budget ---- */

static int64_t peak_of(const model_case *mc, const char *policy,
                       int64_t budget, int64_t *predicted) {
  run r;
  remat_config rc = threads_policy(1, policy);
  rc.memory_budget = budget;
  must(open_run(&r, mc, &rc, &adamw, 1), policy);
  remat_step_stats st = {.size = sizeof st};
  must(remat_step(r.g, &st), "remat_step");
  *predicted = st.predicted_peak_bytes;
  close_run(&r);
  return st.peak_bytes;
}

/* Budgets halfway between the nothing_saveable and everything_saveable
 * peaks and at the everything_saveable peak hold at one thread; the second
 * is used (the plan saves more than nothing_saveable does: the planner
 * picks per region among four policies, so a budget between two plans'
 * peaks may get the smaller one). */
static void budget_holds(const model_case *mc) {
  int64_t pred;
  int64_t lo = peak_of(mc, "nothing_saveable", 0, &pred);
  int64_t hi = peak_of(mc, "everything_saveable", 0, &pred);
  if (!(lo < hi))
    fail_msg("%s: nothing_saveable peak %lld not below everything_saveable's "
             "%lld",
             case_name(mc), (long long)lo, (long long)hi);
  int64_t budgets[2] = {lo + (hi - lo) / 2, hi};
  for (int i = 0; i < 2; i++) {
    int64_t peak = peak_of(mc, "auto", budgets[i], &pred);
    if (peak > budgets[i])
      fail_msg("%s: budget %lld: measured peak %lld (predicted %lld)",
               case_name(mc), (long long)budgets[i], (long long)peak,
               (long long)pred);
    if (i == 1 && !(peak > lo))
      fail_msg("%s: budget %lld: peak %lld, no more than nothing_saveable's "
               "%lld: the budget was not used",
               case_name(mc), (long long)budgets[i], (long long)peak,
               (long long)lo);
  }
}

static void test_budget_holds(void **state) {
  (void)state;
  model_case cases[] = {llama_case(0, 1), llama_case(1, 0), encoder_case(0),
                        encoder_case(1)};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    budget_holds(&cases[i]);
}

/* ---- allocation failures in compile ---- */

/* Compile of a one-block model with each of its allocations failing in
 * turn: every one fails the call with REMAT_ERR_OUT_OF_MEMORY, and one
 * past the last succeeds. */
static void compile_allocation_failures(model_case mc) {
  remat_config rc = threads_policy(1, "nothing_saveable");
  remat_runtime *rt = NULL;
  must(remat_runtime_create(&rc, &rt), "runtime");
  mc.llama.num_hidden_layers = 1;
  mc.enc.layers = 1;
  int64_t clean = -1;
  for (int64_t n = 0;; n++) {
    remat_graph *g = NULL;
    remat_gpt m;
    remat_tensor *lengths;
    must(remat_graph_create(rt, &g), "graph");
    must(build_case(g, &mc, &m, &lengths), "build");
    remat__alloc_fail_after(n);
    remat_status s = remat_compile(g, m.loss, &adamw);
    int64_t made = remat__alloc_count();
    remat__alloc_fail_after(0);
    if (n == 0) {
      must(s, "clean compile");
      clean = made;
    } else if (n <= clean) {
      if (s != REMAT_ERR_OUT_OF_MEMORY)
        fail_msg("%s: allocation %lld of %lld failed but compile returned "
                 "%s",
                 case_name(&mc), (long long)n, (long long)clean,
                 remat_status_string(s));
    } else {
      must(s, "compile past the last allocation");
      remat_graph_destroy(g);
      break;
    }
    remat_graph_destroy(g);
  }
  assert_true(clean > 10);
  remat_runtime_destroy(rt);
}

static void test_compile_allocation_failures(void **state) {
  (void)state;
  compile_allocation_failures(llama_case(1, 0));
  compile_allocation_failures(encoder_case(0));
}

/* ---- the Llama builder's bad configurations ---- */

static void expect_refused(remat_llama_config c, remat_status want,
                           const char *msg) {
  remat_runtime *rt = NULL;
  remat_graph *g = NULL;
  remat_config rc = threads_policy(1, "nothing_saveable");
  must(remat_runtime_create(&rc, &rt), "runtime");
  must(remat_graph_create(rt, &g), "graph");
  remat_gpt m;
  assert_int_equal(remat_llama_build(g, &c, &m), want);
  assert_string_equal(remat_graph_error(g), msg);
  assert_int_equal(remat_num_tensors(g), 0); /* nothing was added */
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

static void test_llama_config_refused(void **state) {
  (void)state;
  remat_llama_config c = small;
  c.num_key_value_heads = 3;
  expect_refused(c, REMAT_ERR_SHAPE,
                 "remat_llama_build: num_attention_heads 8 is not a multiple "
                 "of num_key_value_heads 3");
  c = small;
  c.num_attention_heads = 5;
  expect_refused(c, REMAT_ERR_SHAPE,
                 "remat_llama_build: hidden_size 64 with 5 heads: the heads "
                 "must divide it into an even head size (RoPE)");
  c = small;
  c.num_attention_heads = 64; /* head size 1: odd */
  c.num_key_value_heads = 0;
  expect_refused(c, REMAT_ERR_SHAPE,
                 "remat_llama_build: hidden_size 64 with 64 heads: the heads "
                 "must divide it into an even head size (RoPE)");
  c = small;
  c.intermediate_size = 0;
  expect_refused(c, REMAT_ERR_INVALID_ARG,
                 "remat_llama_build: num_hidden_layers 2, hidden_size 64, "
                 "intermediate_size 0, num_attention_heads 8, "
                 "num_key_value_heads 2, vocab_size 29, seq 24, batch 4: "
                 "expected all >= 1 (key/value heads 0 for as many as the "
                 "heads) and vocab_size >= 2");
  c = small;
  c.rope_theta = INFINITY;
  expect_refused(c, REMAT_ERR_INVALID_ARG,
                 "remat_llama_build: rms_norm_eps 0, rope_theta inf: expected "
                 "finite values (0 for the defaults)");
  c = small;
  c.attention = (remat_attention_kind)7;
  expect_refused(c, REMAT_ERR_INVALID_ARG,
                 "remat_llama_build: attention 7: expected "
                 "REMAT_ATTENTION_DEFAULT (0), REMAT_ATTENTION_FUSED (1) or "
                 "REMAT_ATTENTION_MATERIALIZED (2)");
  c = small;
  c.num_hidden_layers = REMAT_GPT_MAX_LAYERS + 1;
  expect_refused(c, REMAT_ERR_LIMIT,
                 "remat_llama_build: num_hidden_layers 10001: at most 10000 "
                 "(REMAT_GPT_MAX_LAYERS) are built");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_trains_llama),
      cmocka_unit_test(test_trains_encoder),
      cmocka_unit_test(test_bitwise_llama),
      cmocka_unit_test(test_bitwise_encoder),
      cmocka_unit_test(test_name_policy_saves_named),
      cmocka_unit_test(test_budget_holds),
      cmocka_unit_test(test_compile_allocation_failures),
      cmocka_unit_test(test_llama_config_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
