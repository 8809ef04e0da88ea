/* Tests of frozen parameters (remat_param_freeze) and of parameters read by
 * several ops, in f32 and bf16 precision: an embedding without learned
 * positions against its table, a tied LM head's gradient against finite
 * differences and against an untied copy's two gradients summed, a frozen
 * weight whose dW kernel is not lowered, a GPT with everything but its head
 * frozen (frozen values bitwise unchanged, the head's gradient bitwise an
 * unfrozen run's, gradient and optimizer bytes of the head alone), the
 * loads and saves of frozen parameters, and the misuse messages. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "remat.h"
#include "remat_gpt.h"
#include "tmpdir.h"

enum { B = 2, T = 4, V = 5, D = 8 };

static remat_runtime *runtime(remat_precision precision, int threads) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_PRECISION |
                            REMAT_SET_TRACE | REMAT_SET_MEMORY_BUDGET,
                     .num_threads = threads,
                     .precision = precision};
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  return rt;
}

static float bf16_round(float f) { /* round to nearest even, as remat does */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void fill_ids(int32_t *ids, int n, int mul) {
  for (int i = 0; i < n; i++)
    ids[i] = (i * mul + 1) % V;
}

static void feed_ids(remat_graph *g, remat_tensor *tokens,
                     remat_tensor *targets) {
  int32_t tok[B * T], tgt[B * T];
  fill_ids(tok, B * T, 3);
  fill_ids(tgt, B * T, 2);
  assert_int_equal(remat_feed(g, tokens, tok, sizeof tok), REMAT_OK);
  if (targets != NULL)
    assert_int_equal(remat_feed(g, targets, tgt, sizeof tgt), REMAT_OK);
}

/* ---- remat_embed without wpe ---- */

/* x = wte[tokens] exactly (rounded to bf16 in bf16), and dwte against
 * finite differences of the loss of a head over x (f32). */
static void embed_without_positions(remat_precision precision) {
  remat_runtime *rt = runtime(precision, 2);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t bt[2] = {B, T}, vd[2] = {V, D};
  remat_tensor *tokens = remat_input(g, "tokens", REMAT_I32, 2, bt);
  remat_tensor *targets = remat_input(g, "targets", REMAT_I32, 2, bt);
  remat_tensor *wte = remat_param(g, "wte", 2, vd, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *head = remat_param(g, "head", 2, vd, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *x = remat_embed(g, tokens, wte, NULL);
  assert_non_null(x);
  assert_int_equal(remat_tensor_dim(x, 2), D);
  remat_keep(g, x);
  remat_tensor *loss =
      remat_cross_entropy(g, remat_linear(g, x, head, NULL), targets);
  assert_int_equal(remat_compile(g, loss, NULL), REMAT_OK);
  feed_ids(g, tokens, targets);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(g, &st), REMAT_OK);
  float table[V * D], got[B * T * D], grad[V * D];
  assert_int_equal(remat_read(g, wte, table, sizeof table), REMAT_OK);
  assert_int_equal(remat_read(g, x, got, sizeof got), REMAT_OK);
  int32_t tok[B * T];
  fill_ids(tok, B * T, 3);
  for (int r = 0; r < B * T; r++)
    for (int c = 0; c < D; c++) {
      float want = table[tok[r] * D + c];
      if (precision == REMAT_PRECISION_BF16)
        want = bf16_round(want);
      assert_true(got[r * D + c] == want);
    }
  assert_int_equal(remat_read_grad(g, wte, grad, sizeof grad), REMAT_OK);
  if (precision == REMAT_PRECISION_F32) {
    const float h = 1e-2f;
    for (int i = 0; i < V * D; i += 3) {
      float saved = table[i];
      float lp, lm;
      table[i] = saved + h;
      remat_write(g, wte, table, sizeof table);
      remat_step(g, &st);
      lp = st.loss;
      table[i] = saved - h;
      remat_write(g, wte, table, sizeof table);
      remat_step(g, &st);
      lm = st.loss;
      table[i] = saved;
      double fd = ((double)lp - (double)lm) / (2.0 * h);
      assert_true(fabs(fd - grad[i]) < 2e-3 + 1e-2 * fabs(fd));
    }
  }
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

static void test_embed_without_positions(void **state) {
  (void)state;
  embed_without_positions(REMAT_PRECISION_F32);
  embed_without_positions(REMAT_PRECISION_BF16);
}

static void test_embed_without_positions_shapes(void **state) {
  (void)state;
  remat_runtime *rt = runtime(REMAT_PRECISION_F32, 1);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t bt[2] = {B, T}, v[1] = {V};
  remat_tensor *tokens = remat_input(g, "tokens", REMAT_I32, 2, bt);
  remat_tensor *wte = remat_param(g, "wte", 1, v, REMAT_INIT_ZEROS, 0.0f);
  assert_null(remat_embed(g, tokens, wte, NULL));
  assert_int_equal(remat_graph_status(g), REMAT_ERR_SHAPE);
  assert_non_null(strstr(remat_graph_error(g), "wte [5] must be [V,D]"));
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* ---- a tied LM head ---- */

typedef struct lm {
  remat_graph *g;
  remat_tensor *tokens, *targets, *wte, *head, *loss;
} lm;

/* tokens -> wte[tokens] + wpe -> logits = x . head^T -> cross-entropy,
 * with head the tensor wte itself when tied. */
static lm build_lm(remat_runtime *rt, bool tied) {
  lm m;
  assert_int_equal(remat_graph_create(rt, &m.g), REMAT_OK);
  int64_t bt[2] = {B, T}, vd[2] = {V, D}, td[2] = {T, D};
  m.tokens = remat_input(m.g, "tokens", REMAT_I32, 2, bt);
  m.targets = remat_input(m.g, "targets", REMAT_I32, 2, bt);
  m.wte = remat_param(m.g, "wte", 2, vd, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *wpe = remat_param(m.g, "wpe", 2, td, REMAT_INIT_NORMAL, 0.5f);
  m.head = tied ? m.wte
                : remat_param(m.g, "head", 2, vd, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *x = remat_embed(m.g, m.tokens, m.wte, wpe);
  m.loss = remat_cross_entropy(m.g, remat_linear(m.g, x, m.head, NULL),
                               m.targets);
  assert_int_equal(remat_compile(m.g, m.loss, NULL), REMAT_OK);
  feed_ids(m.g, m.tokens, m.targets);
  return m;
}

static float lm_loss(lm *m) {
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(m->g, &st), REMAT_OK);
  return st.loss;
}

/* The tied gradient of wte after one step on `threads` workers. */
static void tied_grad(remat_precision precision, int threads, float *grad,
                      float *table) {
  remat_runtime *rt = runtime(precision, threads);
  lm m = build_lm(rt, true);
  lm_loss(&m);
  assert_int_equal(remat_read_grad(m.g, m.wte, grad, V * D * sizeof *grad),
                   REMAT_OK);
  assert_int_equal(remat_read(m.g, m.wte, table, V * D * sizeof *table),
                   REMAT_OK);
  if (precision == REMAT_PRECISION_F32) { /* against finite differences */
    const float h = 1e-2f;
    for (int i = 0; i < V * D; i += 2) {
      float saved = table[i];
      table[i] = saved + h;
      remat_write(m.g, m.wte, table, V * D * sizeof *table);
      double lp = lm_loss(&m);
      table[i] = saved - h;
      remat_write(m.g, m.wte, table, V * D * sizeof *table);
      double lm_ = lm_loss(&m);
      table[i] = saved;
      double fd = (lp - lm_) / (2.0 * h);
      assert_true(fabs(fd - grad[i]) < 2e-3 + 1e-2 * fabs(fd));
    }
  }
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

/* The same model with an untied head holding wte's values: the tied
 * gradient is the sum of the untied wte's and head's, up to the order of
 * the additions. */
static void untied_sum(remat_precision precision, const float *table,
                       float *sum) {
  remat_runtime *rt = runtime(precision, 2);
  lm m = build_lm(rt, false);
  assert_int_equal(remat_write(m.g, m.wte, table, V * D * sizeof *table),
                   REMAT_OK);
  assert_int_equal(remat_write(m.g, m.head, table, V * D * sizeof *table),
                   REMAT_OK);
  lm_loss(&m);
  float ge[V * D], gh[V * D];
  assert_int_equal(remat_read_grad(m.g, m.wte, ge, sizeof ge), REMAT_OK);
  assert_int_equal(remat_read_grad(m.g, m.head, gh, sizeof gh), REMAT_OK);
  for (int i = 0; i < V * D; i++)
    sum[i] = ge[i] + gh[i];
  remat_graph_destroy(m.g);
  remat_runtime_destroy(rt);
}

static void tied_head(remat_precision precision) {
  float g1[V * D], g2[V * D], table[V * D], sum[V * D];
  tied_grad(precision, 1, g1, table);
  tied_grad(precision, 2, g2, table);
  assert_memory_equal(g1, g2, sizeof g1); /* a fixed order of the sum */
  untied_sum(precision, table, sum);
  double norm = 0.0;
  for (int i = 0; i < V * D; i++)
    norm += fabs(sum[i]);
  assert_true(norm > 1e-3); /* both uses contribute */
  for (int i = 0; i < V * D; i++)
    assert_true(fabs(g1[i] - sum[i]) <= 1e-5 * (1.0 + fabs(sum[i])));
}

static void test_tied_head(void **state) {
  (void)state;
  tied_head(REMAT_PRECISION_F32);
  tied_head(REMAT_PRECISION_BF16);
}

/* ---- frozen parameters ---- */

/* x -> linear(w1) -> linear(w2) -> cross-entropy, w2 frozen or not: the
 * frozen run lowers no dW kernel for w2 (2 N K M fewer FLOPs) but keeps
 * its dX kernel, so w1's gradient is the unfrozen run's, bitwise. */
static double two_linears(remat_precision precision, bool freeze,
                          float *grad_w1) {
  remat_runtime *rt = runtime(precision, 2);
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t xd[3] = {B, T, D}, bt[2] = {B, T}, dd[2] = {D, D}, vd[2] = {V, D};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 3, xd);
  remat_tensor *targets = remat_input(g, "targets", REMAT_I32, 2, bt);
  remat_tensor *w1 = remat_param(g, "w1", 2, dd, REMAT_INIT_NORMAL, 0.3f);
  remat_tensor *w2 = remat_param(g, "w2", 2, vd, REMAT_INIT_NORMAL, 0.3f);
  remat_tensor *h = remat_linear(g, remat_linear(g, x, w1, NULL), w2, NULL);
  remat_tensor *loss = remat_cross_entropy(g, h, targets);
  if (freeze)
    assert_int_equal(remat_param_freeze(g, w2), REMAT_OK);
  assert_int_equal(remat_compile(g, loss, NULL), REMAT_OK);
  float xs[B * T * D];
  for (int i = 0; i < B * T * D; i++)
    xs[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
  assert_int_equal(remat_feed(g, x, xs, sizeof xs), REMAT_OK);
  feed_ids(g, targets, NULL);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(g, &st), REMAT_OK);
  assert_int_equal(remat_read_grad(g, w1, grad_w1, D * D * sizeof *grad_w1),
                   REMAT_OK);
  float gw2[V * D];
  remat_status s = remat_read_grad(g, w2, gw2, sizeof gw2);
  assert_int_equal(s, freeze ? REMAT_ERR_INVALID_ARG : REMAT_OK);
  if (freeze)
    assert_string_equal(remat_graph_error(g),
                        "remat_read_grad: parameter 'w2' is frozen "
                        "(remat_param_freeze), so it has no gradient: read "
                        "the gradient of a trainable parameter");
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  return st.flops;
}

static void test_frozen_weight_lowers_no_dw(void **state) {
  (void)state;
  for (int p = 0; p < 2; p++) {
    float free_grad[D * D], frozen_grad[D * D];
    double all = two_linears((remat_precision)p, false, free_grad);
    double frozen = two_linears((remat_precision)p, true, frozen_grad);
    assert_true(all - frozen == 2.0 * B * T * D * V);
    assert_memory_equal(free_grad, frozen_grad, sizeof free_grad);
  }
}

static const remat_gpt_config gpt_config = {
    .layers = 2, .d_model = 16, .heads = 2, .seq = 8, .batch = 2, .vocab = 7};

typedef struct gpt_run {
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
} gpt_run;

/* The test GPT with every parameter but lm_head frozen when `freeze`. */
static void gpt_open(gpt_run *r, remat_precision precision, bool freeze,
                     const remat_optimizer *opt) {
  r->rt = runtime(precision, 2);
  assert_int_equal(remat_graph_create(r->rt, &r->g), REMAT_OK);
  assert_int_equal(remat_gpt_build(r->g, &gpt_config, &r->m), REMAT_OK);
  for (int i = 0; freeze && i < remat_num_params(r->g); i++) {
    remat_tensor *p = remat_param_at(r->g, i);
    if (strcmp(remat_tensor_name(p), "lm_head") != 0)
      assert_int_equal(remat_param_freeze(r->g, p), REMAT_OK);
  }
  assert_int_equal(remat_compile(r->g, r->m.loss, opt), REMAT_OK);
  int32_t tok[2 * 8], tgt[2 * 8];
  for (int i = 0; i < 16; i++) {
    tok[i] = (i * 3 + 1) % 7;
    tgt[i] = (i * 5 + 2) % 7;
  }
  assert_int_equal(remat_feed(r->g, r->m.tokens, tok, sizeof tok), REMAT_OK);
  assert_int_equal(remat_feed(r->g, r->m.targets, tgt, sizeof tgt), REMAT_OK);
}

static void gpt_close(gpt_run *r) {
  remat_graph_destroy(r->g);
  remat_runtime_destroy(r->rt);
}

static float *read_param(remat_graph *g, remat_tensor *p) {
  size_t n = (size_t)remat_tensor_numel(p);
  float *x = malloc(n * sizeof *x);
  assert_non_null(x);
  assert_int_equal(remat_read(g, p, x, n * sizeof *x), REMAT_OK);
  return x;
}

static remat_tensor *param_named(remat_graph *g, const char *name) {
  for (int i = 0; i < remat_num_params(g); i++)
    if (strcmp(remat_tensor_name(remat_param_at(g, i)), name) == 0)
      return remat_param_at(g, i);
  fail_msg("no parameter '%s'", name);
  return NULL;
}

/* Every parameter's numel * 4 bytes rounded to 64, the arena's block. */
static int64_t head_bytes(void) {
  int64_t b = (int64_t)gpt_config.vocab * gpt_config.d_model * 4;
  return (b + 63) / 64 * 64;
}

static void frozen_gpt(remat_precision precision) {
  remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  gpt_run fr, un;
  gpt_open(&fr, precision, true, &adamw);
  int np = remat_num_params(fr.g);
  float **before = calloc((size_t)np, sizeof *before);
  for (int i = 0; i < np; i++)
    before[i] = read_param(fr.g, remat_param_at(fr.g, i));
  remat_step_stats st = {.size = sizeof st}, first = st;
  assert_int_equal(remat_step(fr.g, &first), REMAT_OK);
  float head_grad[7 * 16], free_grad[7 * 16];
  remat_tensor *head = param_named(fr.g, "lm_head");
  assert_int_equal(remat_read_grad(fr.g, head, head_grad, sizeof head_grad),
                   REMAT_OK);
  for (int k = 0; k < 2; k++)
    assert_int_equal(remat_step(fr.g, &st), REMAT_OK);
  for (int i = 0; i < np; i++) { /* frozen: bitwise unchanged */
    remat_tensor *p = remat_param_at(fr.g, i);
    float *after = read_param(fr.g, p);
    size_t bytes = (size_t)remat_tensor_numel(p) * sizeof *after;
    if (p == head)
      assert_memory_not_equal(before[i], after, bytes);
    else
      assert_memory_equal(before[i], after, bytes);
    free(after);
  }
  /* gradients and AdamW's moments of lm_head alone */
  assert_int_equal(first.peak[REMAT_MEM_GRADS], head_bytes());
  assert_int_equal(first.peak[REMAT_MEM_OPTIMIZER], 2 * head_bytes());

  gpt_open(&un, precision, false, &adamw);
  remat_step_stats ust = {.size = sizeof ust};
  assert_int_equal(remat_step(un.g, &ust), REMAT_OK);
  assert_int_equal(remat_read_grad(un.g, param_named(un.g, "lm_head"),
                                   free_grad, sizeof free_grad),
                   REMAT_OK);
  assert_memory_equal(head_grad, free_grad, sizeof head_grad);
  assert_true(first.loss == ust.loss);
  assert_true(ust.peak[REMAT_MEM_GRADS] > 10 * head_bytes());
  /* bf16: the frozen linear weights are stored once, in bf16 */
  if (precision == REMAT_PRECISION_BF16)
    assert_true(first.peak[REMAT_MEM_PARAMS] < ust.peak[REMAT_MEM_PARAMS]);
  else
    assert_int_equal(first.peak[REMAT_MEM_PARAMS],
                     ust.peak[REMAT_MEM_PARAMS]);
  for (int i = 0; i < np; i++)
    free(before[i]);
  free(before);
  gpt_close(&un);
  gpt_close(&fr);
}

static void test_frozen_gpt(void **state) {
  (void)state;
  frozen_gpt(REMAT_PRECISION_F32);
  frozen_gpt(REMAT_PRECISION_BF16);
}

/* ---- loads and saves ---- */

/* A bf16-stored frozen weight reads back as its bf16 values widened, a
 * write rounds into it, a save writes it as F32, a load rounds into it
 * and refuses a value that is Inf in bf16, changing nothing; a gradient
 * file leaves it out; a checkpoint holds it without moments. */
static void frozen_files(remat_precision precision) {
  remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  gpt_run r;
  gpt_open(&r, precision, true, &adamw);
  remat_tensor *w = param_named(r.g, "h0.ffn.w_in");
  size_t n = (size_t)remat_tensor_numel(w);
  float *src = malloc(n * sizeof *src), *got = malloc(n * sizeof *got);
  for (size_t i = 0; i < n; i++)
    src[i] = 1.0f + (float)i * 1e-3f + 1.0f / 512.0f;
  assert_int_equal(remat_write(r.g, w, src, n * sizeof *src), REMAT_OK);
  assert_int_equal(remat_read(r.g, w, got, n * sizeof *got), REMAT_OK);
  for (size_t i = 0; i < n; i++)
    assert_true(got[i] == (precision == REMAT_PRECISION_BF16
                               ? bf16_round(src[i]) : src[i]));
  char path[128], grads[128], ckpt[128];
  snprintf(path, sizeof path, "%s/frozen.safetensors", dir);
  snprintf(grads, sizeof grads, "%s/grads.safetensors", dir);
  snprintf(ckpt, sizeof ckpt, "%s/frozen.ckpt", dir);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(r.g, &st), REMAT_OK);
  assert_int_equal(remat_save_safetensors(r.g, path), REMAT_OK);
  assert_int_equal(remat_save_grads_safetensors(r.g, grads), REMAT_OK);
  assert_int_equal(remat_save_checkpoint(r.g, ckpt, NULL, NULL, 0), REMAT_OK);
  float *zeros = calloc(n, sizeof *zeros);
  assert_int_equal(remat_write(r.g, w, zeros, n * sizeof *zeros), REMAT_OK);
  assert_int_equal(remat_load_safetensors(r.g, path), REMAT_OK);
  float *loaded = malloc(n * sizeof *loaded);
  assert_int_equal(remat_read(r.g, w, loaded, n * sizeof *loaded), REMAT_OK);
  assert_memory_equal(got, loaded, n * sizeof *got);
  assert_int_equal(remat_write(r.g, w, zeros, n * sizeof *zeros), REMAT_OK);
  assert_int_equal(remat_load_checkpoint(r.g, ckpt, NULL, NULL, 0), REMAT_OK);
  assert_int_equal(remat_read(r.g, w, loaded, n * sizeof *loaded), REMAT_OK);
  assert_memory_equal(got, loaded, n * sizeof *got);

  /* the gradient file: lm_head alone */
  FILE *f = fopen(grads, "rb");
  assert_non_null(f);
  char header[4096] = {0};
  assert_true(fread(header, 1, sizeof header - 1, f) > 8);
  fclose(f);
  assert_non_null(strstr(header + 8, "\"lm_head\""));
  assert_null(strstr(header + 8, "\"wte\""));

  /* a value finite in f32 but Inf in bf16 */
  gpt_run other;
  gpt_open(&other, REMAT_PRECISION_F32, false, NULL);
  remat_tensor *ow = param_named(other.g, "h0.ffn.w_in");
  float *big = malloc(n * sizeof *big);
  memcpy(big, src, n * sizeof *big);
  big[3] = 3.4e38f;
  assert_int_equal(remat_write(other.g, ow, big, n * sizeof *big), REMAT_OK);
  assert_int_equal(remat_save_safetensors(other.g, path), REMAT_OK);
  remat_status s = remat_load_safetensors(r.g, path);
  if (precision == REMAT_PRECISION_BF16) {
    assert_int_equal(s, REMAT_ERR_IO);
    assert_non_null(strstr(remat_graph_error(r.g),
                           "tensor 'h0.ffn.w_in' holds 3.4e+38 at element 3: "
                           "the frozen parameter is stored in bf16, where it "
                           "would be Inf"));
    assert_int_equal(remat_read(r.g, w, loaded, n * sizeof *loaded),
                     REMAT_OK);
    assert_memory_equal(got, loaded, n * sizeof *got);
  } else {
    assert_int_equal(s, REMAT_OK);
  }
  free(big);
  gpt_close(&other);
  free(zeros);
  free(loaded);
  free(src);
  free(got);
  gpt_close(&r);
}

static void test_frozen_files(void **state) {
  (void)state;
  frozen_files(REMAT_PRECISION_F32);
  frozen_files(REMAT_PRECISION_BF16);
}

/* ---- misuse ---- */

static void test_freeze_misuse(void **state) {
  (void)state;
  remat_runtime *rt = runtime(REMAT_PRECISION_F32, 1);
  int64_t bt[2] = {B, T}, vd[2] = {V, D};
  remat_graph *g;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  remat_tensor *tokens = remat_input(g, "tokens", REMAT_I32, 2, bt);
  assert_int_equal(remat_param_freeze(g, tokens), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_graph_error(g),
                      "remat_param_freeze: 'tokens' is an input: only a "
                      "parameter (made by remat_param) can be frozen");
  assert_int_equal(remat_graph_status(g), REMAT_ERR_INVALID_ARG);
  remat_graph_destroy(g);

  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  tokens = remat_input(g, "tokens", REMAT_I32, 2, bt);
  remat_tensor *wte = remat_param(g, "wte", 2, vd, REMAT_INIT_NORMAL, 0.1f);
  remat_tensor *x = remat_embed(g, tokens, wte, NULL);
  assert_int_equal(remat_param_freeze(g, x), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_graph_error(g),
                      "remat_param_freeze: 'embed_0' is an op result: only "
                      "a parameter (made by remat_param) can be frozen");
  remat_graph_destroy(g);

  /* every parameter frozen: forward, and a loss without optimizer */
  for (int mode = 0; mode < 3; mode++) {
    assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
    tokens = remat_input(g, "tokens", REMAT_I32, 2, bt);
    remat_tensor *targets = remat_input(g, "targets", REMAT_I32, 2, bt);
    wte = remat_param(g, "wte", 2, vd, REMAT_INIT_NORMAL, 0.1f);
    x = remat_embed(g, tokens, wte, NULL);
    remat_tensor *loss =
        remat_cross_entropy(g, remat_linear(g, x, wte, NULL), targets);
    assert_int_equal(remat_param_freeze(g, wte), REMAT_OK);
    assert_int_equal(remat_param_freeze(g, wte), REMAT_OK); /* twice */
    remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
    remat_status s = remat_compile(g, mode == 0 ? NULL : loss,
                                   mode == 2 ? &sgd : NULL);
    if (mode == 2) {
      assert_int_equal(s, REMAT_ERR_INVALID_ARG);
      assert_string_equal(
          remat_graph_error(g),
          "remat_compile: all 1 parameters are frozen (remat_param_freeze), "
          "so the optimizer has nothing to update: compile with loss NULL "
          "for remat_forward, or with a loss and no optimizer to evaluate "
          "the loss with remat_step");
    } else {
      assert_int_equal(s, REMAT_OK);
      feed_ids(g, tokens, targets);
      remat_step_stats st = {.size = sizeof st};
      s = mode == 0 ? remat_forward(g, &st) : remat_step(g, &st);
      assert_int_equal(s, REMAT_OK);
      assert_int_equal(st.peak[REMAT_MEM_GRADS], 0);
      if (mode == 1)
        assert_true(isfinite(st.loss) && st.loss > 0.0f);
      assert_int_equal(remat_param_freeze(g, wte), REMAT_ERR_STATE);
      /* only the call fails: the compiled graph keeps working */
      assert_string_equal(remat_last_error(),
                          "remat_param_freeze: the graph is already "
                          "compiled: freeze parameters before "
                          "remat_compile");
      assert_int_equal(remat_graph_status(g), REMAT_OK);
    }
    remat_graph_destroy(g);
  }
  remat_runtime_destroy(rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embed_without_positions),
      cmocka_unit_test(test_embed_without_positions_shapes),
      cmocka_unit_test(test_tied_head),
      cmocka_unit_test(test_frozen_weight_lowers_no_dw),
      cmocka_unit_test(test_frozen_gpt),
      cmocka_unit_test(test_frozen_files),
      cmocka_unit_test(test_freeze_misuse),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
