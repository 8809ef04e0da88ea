/* Tests of bf16 precision at the level of a whole model: the setting
 * (REMAT_PRECISION, remat_config.precision, the CPU check), gradients of a
 * GPT in bf16 against f32 on the same weights and batch, bitwise results
 * across thread counts and policies, bf16 bytes in the planner and the
 * measured peaks, parameter copies refreshed after writes and loads,
 * safetensors across precisions, all-or-nothing updates, inference and
 * reads of kept tensors.
 *
 * Under ONEDNN_MAX_CPU_ISA=AVX2 (the test_precision_avx2 entry) only
 * test_cpu_check runs, and expects bf16 to be refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpt_fixture.h"
#include "remat.h"
#include "tmpdir.h"

static const remat_gpt_config small = {.layers = 2, .d_model = 64,
                                       .heads = 4, .seq = 32, .batch = 4,
                                       .vocab = 64};

static remat_status open_prec(fixture *f, const remat_gpt_config *c,
                              remat_precision prec, int threads,
                              const char *policy, int64_t budget,
                              const remat_optimizer *opt) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_MEMORY_BUDGET | REMAT_SET_PRECISION,
                     .num_threads = threads,
                     .policy = policy,
                     .memory_budget = budget,
                     .precision = prec};
  return fixture_open_config(f, c, &rc, opt);
}

static void open_ok(fixture *f, const remat_gpt_config *c,
                    remat_precision prec, int threads, const char *policy,
                    const remat_optimizer *opt) {
  remat_status s = open_prec(f, c, prec, threads, policy, 0, opt);
  if (s != REMAT_OK)
    fail_msg("open: %s", remat_last_error());
}

static float *read_grad(fixture *f, int i, size_t *n) {
  remat_tensor *p = remat_param_at(f->g, i);
  *n = (size_t)remat_tensor_numel(p);
  float *g = malloc(*n * sizeof *g);
  assert_non_null(g);
  assert_int_equal(remat_read_grad(f->g, p, g, *n * sizeof *g), REMAT_OK);
  return g;
}

/* Whether the CPU has bf16 instructions that oneDNN uses. */
static int cpu_has_bf16(void) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL)
    return 0;
  char line[8192];
  int yes = 0;
  while (!yes && fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, "flags", 5) == 0)
      yes = strstr(line, " avx512_bf16") != NULL ||
            strstr(line, " amx_bf16") != NULL;
  fclose(f);
  return yes;
}

/* ---- the setting ---- */

static void test_config(void **state) {
  (void)state;
  remat_runtime *rt = NULL;
  setenv("REMAT_PRECISION", "fp16", 1);
  assert_int_equal(remat_runtime_create(NULL, &rt), REMAT_ERR_CONFIG);
  assert_string_equal(remat_last_error(),
                      "REMAT_PRECISION='fp16' is not valid: expected f32 or "
                      "bf16");
  setenv("REMAT_PRECISION", "BF16", 1); /* names are lower case */
  assert_int_equal(remat_runtime_create(NULL, &rt), REMAT_ERR_CONFIG);
  unsetenv("REMAT_PRECISION");
  remat_config rc = {.set = REMAT_SET_PRECISION | REMAT_SET_NUM_THREADS,
                     .num_threads = 1, .precision = (remat_precision)2};
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_ERR_CONFIG);
  assert_string_equal(remat_last_error(),
                      "remat_config.precision=2 is not valid: expected "
                      "REMAT_PRECISION_F32 or REMAT_PRECISION_BF16");
  /* the environment sets it, the program's setting wins */
  setenv("REMAT_PRECISION", "bf16", 1);
  rc.set = REMAT_SET_NUM_THREADS;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  remat_config got;
  assert_int_equal(remat_runtime_config(rt, &got), REMAT_OK);
  assert_int_equal(got.precision, REMAT_PRECISION_BF16);
  remat_runtime_destroy(rt);
  rc.set = REMAT_SET_NUM_THREADS | REMAT_SET_PRECISION;
  rc.precision = REMAT_PRECISION_F32;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_runtime_config(rt, &got), REMAT_OK);
  assert_int_equal(got.precision, REMAT_PRECISION_F32);
  remat_runtime_destroy(rt);
  unsetenv("REMAT_PRECISION");
}

/* bf16 runs where oneDNN has bf16 kernels and is refused, with the
 * reason, where it has not (ONEDNN_MAX_CPU_ISA=AVX2, or an old CPU). */
static void test_cpu_check(void **state) {
  (void)state;
  const char *isa = getenv("ONEDNN_MAX_CPU_ISA");
  int refused = (isa != NULL && strcmp(isa, "AVX2") == 0) || !cpu_has_bf16();
  remat_config rc = {.set = REMAT_SET_PRECISION | REMAT_SET_NUM_THREADS,
                     .num_threads = 1, .precision = REMAT_PRECISION_BF16};
  remat_runtime *rt = NULL;
  remat_status s = remat_runtime_create(&rc, &rt);
  if (!refused) {
    assert_int_equal(s, REMAT_OK);
    remat_runtime_destroy(rt);
    return;
  }
  assert_int_equal(s, REMAT_ERR_CONFIG);
  assert_null(rt);
  const char *want =
      "REMAT_PRECISION=bf16: oneDNN has no bf16 matmul kernel for this CPU";
  assert_memory_equal(remat_last_error(), want, strlen(want));
  assert_non_null(strstr(remat_last_error(),
                         "bf16 needs AVX512-BF16 (AMD Zen 4 and later, Intel "
                         "Cooper Lake) or AMX"));
  if (isa != NULL)
    assert_non_null(strstr(remat_last_error(),
                           "ONEDNN_MAX_CPU_ISA (here 'AVX2') must allow "
                           "them; use REMAT_PRECISION=f32"));
  /* f32 still runs */
  rc.precision = REMAT_PRECISION_F32;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  remat_runtime_destroy(rt);
}

/* ---- numbers ---- */

/* Gradients of every parameter tensor in bf16 against f32 on the same
 * weights and batch: cosine similarity at least 0.999; the loss within
 * 1%. */
static void check_grads_vs_f32(remat_attention_kind attention) {
  remat_gpt_config c = small;
  c.attention = attention;
  fixture a, b;
  open_ok(&a, &c, REMAT_PRECISION_F32, 2, "nothing_saveable", NULL);
  open_ok(&b, &c, REMAT_PRECISION_BF16, 2, "nothing_saveable", NULL);
  remat_step_stats sa = {.size = sizeof sa}, sb = {.size = sizeof sb};
  assert_int_equal(remat_step(a.g, &sa), REMAT_OK);
  assert_int_equal(remat_step(b.g, &sb), REMAT_OK);
  assert_true(fabs(sa.loss - sb.loss) <= 0.01 * fabs(sa.loss));
  double worst = 1.0;
  for (int i = 0; i < remat_num_params(a.g); i++) {
    size_t n, m;
    float *ga = read_grad(&a, i, &n), *gb = read_grad(&b, i, &m);
    assert_int_equal(n, m);
    double dot = 0, na = 0, nb = 0;
    for (size_t k = 0; k < n; k++) {
      dot += (double)ga[k] * gb[k];
      na += (double)ga[k] * ga[k];
      nb += (double)gb[k] * gb[k];
    }
    double cosine = dot / sqrt(na * nb);
    if (!(cosine >= 0.999))
      fail_msg("%s: cosine %.6f between the bf16 and f32 gradients",
               remat_tensor_name(remat_param_at(a.g, i)), cosine);
    worst = fmin(worst, cosine);
    free(ga);
    free(gb);
  }
  print_message("loss f32 %.6f bf16 %.6f, worst gradient cosine %.6f\n",
                sa.loss, sb.loss, worst);
  fixture_close(&a);
  fixture_close(&b);
}

static void test_grads_vs_f32(void **state) {
  (void)state;
  check_grads_vs_f32(REMAT_ATTENTION_MATERIALIZED);
  check_grads_vs_f32(REMAT_ATTENTION_FUSED);
}

/* Gradients and updated weights bitwise the same at 1, 2 and 4 threads
 * and under every policy (the f32 master weights after two AdamW steps,
 * so the refreshed bf16 copies fed the second step). */
static void test_bitwise(void **state) {
  (void)state;
  static const char *const policies[] = {
      "nothing_saveable", "everything_saveable", "dots_saveable",
      "dots_with_no_batch_dims_saveable", "save_only_these_names:attn_probs"};
  static const int threads[] = {1, 2, 4};
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-3f,
                         .weight_decay = 0.01f};
  uint64_t want_grad = 0;
  float *want = NULL;
  size_t nwant = 0;
  for (size_t p = 0; p < sizeof policies / sizeof *policies; p++)
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
      if (p > 0 && threads[t] != 2)
        continue; /* every policy at 2 threads, 2 at every count */
      fixture f;
      open_ok(&f, &small, REMAT_PRECISION_BF16, threads[t], policies[p],
              &opt);
      remat_step_stats st = {.size = sizeof st};
      assert_int_equal(remat_step(f.g, &st), REMAT_OK);
      uint64_t h = fixture_grad_hash(&f);
      assert_int_equal(remat_step(f.g, &st), REMAT_OK);
      size_t n;
      float *w = fixture_snapshot(f.g, &n);
      assert_non_null(w);
      if (want == NULL) {
        want = w;
        nwant = n;
        want_grad = h;
      } else {
        if (h != want_grad)
          fail_msg("%s at %d threads: gradients differ", policies[p],
                   threads[t]);
        assert_int_equal(n, nwant);
        if (memcmp(w, want, n * sizeof *w) != 0)
          fail_msg("%s at %d threads: weights differ", policies[p],
                   threads[t]);
        free(w);
      }
      fixture_close(&f);
    }
  free(want);
}

/* ---- memory ---- */

static void test_memory(void **state) {
  (void)state;
  remat_gpt_config c = {.layers = 2, .d_model = 128, .heads = 4, .seq = 64,
                        .batch = 4, .vocab = 64};
  fixture a, b;
  open_ok(&a, &c, REMAT_PRECISION_F32, 1, "everything_saveable", NULL);
  open_ok(&b, &c, REMAT_PRECISION_BF16, 1, "everything_saveable", NULL);
  remat_step_stats sa = {.size = sizeof sa}, sb = {.size = sizeof sb};
  assert_int_equal(remat_step(a.g, &sa), REMAT_OK);
  assert_int_equal(remat_step(b.g, &sb), REMAT_OK);
  print_message("activation peak f32 %lld bf16 %lld (%.3f)\n",
                (long long)sa.activation_peak_bytes,
                (long long)sb.activation_peak_bytes,
                (double)sb.activation_peak_bytes /
                    (double)sa.activation_peak_bytes);
  assert_true(sb.activation_peak_bytes <= 0.55 * sa.activation_peak_bytes);
  assert_true(sb.activation_peak_bytes >= 0.40 * sa.activation_peak_bytes);
  /* parameters: f32 masters plus bf16 copies of the matmul weights */
  assert_true(sb.peak[REMAT_MEM_PARAMS] > sa.peak[REMAT_MEM_PARAMS]);
  assert_true(sb.peak[REMAT_MEM_PARAMS] <= 1.5 * sa.peak[REMAT_MEM_PARAMS]);
  assert_int_equal(sb.peak[REMAT_MEM_GRADS], sa.peak[REMAT_MEM_GRADS]);
  assert_int_equal(sb.peak[REMAT_MEM_OPTIMIZER], sa.peak[REMAT_MEM_OPTIMIZER]);
  /* the prediction holds the measured peak at 1 thread */
  assert_true(sb.peak_bytes <= sb.predicted_peak_bytes);
  /* a budget between the two peaks: bf16 fits it saving everything,
   * f32 must recompute */
  int64_t budget = (sa.predicted_peak_bytes + sb.predicted_peak_bytes) / 2;
  fixture_close(&a);
  fixture_close(&b);
  assert_int_equal(open_prec(&b, &c, REMAT_PRECISION_BF16, 1, "auto",
                             budget, NULL), REMAT_OK);
  assert_int_equal(remat_step(b.g, &sb), REMAT_OK);
  assert_true(sb.recompute_flops == 0.0);
  assert_true(sb.peak_bytes <= budget);
  fixture_close(&b);
  assert_int_equal(open_prec(&a, &c, REMAT_PRECISION_F32, 1, "auto", budget,
                             NULL), REMAT_OK);
  assert_int_equal(remat_step(a.g, &sa), REMAT_OK);
  assert_true(sa.recompute_flops > 0.0);
  fixture_close(&a);
}

/* ---- parameters ---- */

/* remat_write reaches the bf16 copies: a zero LM head (a weight matmuls
 * read through its copy) makes every logit 0, so the loss is ln(vocab). */
static void test_write_refreshes_copies(void **state) {
  (void)state;
  fixture f;
  open_ok(&f, &small, REMAT_PRECISION_BF16, 2, "nothing_saveable", NULL);
  /* no optimizer: steps update nothing */
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_true(fabs(st.loss - log(small.vocab)) > 1e-3);
  for (int i = 0; i < remat_num_params(f.g); i++) {
    remat_tensor *p = remat_param_at(f.g, i);
    if (strcmp(remat_tensor_name(p), "lm_head") != 0)
      continue;
    size_t n = (size_t)remat_tensor_numel(p);
    float *zero = calloc(n, sizeof *zero);
    assert_int_equal(remat_write(f.g, p, zero, n * sizeof *zero), REMAT_OK);
    free(zero);
  }
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_true(fabs(st.loss - log(small.vocab)) < 1e-5);
  fixture_close(&f);
}

/* Weights saved from a bf16 model are f32 and load into either
 * precision; a bf16 model loading f32 weights computes from them. */
static void test_safetensors_across(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/w.safetensors", dir);
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  fixture b, a, b2;
  open_ok(&b, &small, REMAT_PRECISION_BF16, 2, "nothing_saveable", &opt);
  remat_step_stats st = {.size = sizeof st};
  for (int i = 0; i < 3; i++)
    assert_int_equal(remat_step(b.g, &st), REMAT_OK);
  assert_int_equal(remat_save_safetensors(b.g, path), REMAT_OK);
  size_t nb, na;
  float *wb = fixture_snapshot(b.g, &nb);
  open_ok(&a, &small, REMAT_PRECISION_F32, 2, "nothing_saveable", NULL);
  assert_int_equal(remat_load_safetensors(a.g, path), REMAT_OK);
  float *wa = fixture_snapshot(a.g, &na);
  assert_int_equal(na, nb);
  assert_memory_equal(wa, wb, na * sizeof *wa);
  /* the same weights in a fresh bf16 model: the loss the trained one
   * computes from them (before its next update), bitwise (its copies were
   * rewritten from the loaded masters) */
  remat_step_stats s1 = {.size = sizeof s1}, s2 = {.size = sizeof s2},
                   s3 = {.size = sizeof s3};
  assert_int_equal(remat_step(b.g, &s1), REMAT_OK);
  open_ok(&b2, &small, REMAT_PRECISION_BF16, 2, "nothing_saveable", NULL);
  assert_int_equal(remat_step(b2.g, &s2), REMAT_OK); /* copies in use */
  assert_int_equal(remat_load_safetensors(b2.g, path), REMAT_OK);
  assert_int_equal(remat_step(b2.g, &s2), REMAT_OK);
  assert_true(s1.loss == s2.loss);
  assert_int_equal(remat_step(a.g, &s3), REMAT_OK);
  assert_true(fabs(s3.loss - s2.loss) <= 0.01 * fabs(s3.loss));
  free(wa);
  free(wb);
  fixture_close(&a);
  fixture_close(&b);
  fixture_close(&b2);
}

/* A NaN in one weight: the step fails, no weight (master or copy)
 * changes; after the weight is restored the next step is the step of a
 * model that never saw the NaN. */
static void test_nonfinite(void **state) {
  (void)state;
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
  fixture f, ref;
  open_ok(&f, &small, REMAT_PRECISION_BF16, 2, "nothing_saveable", &opt);
  open_ok(&ref, &small, REMAT_PRECISION_BF16, 2, "nothing_saveable", &opt);
  remat_tensor *p = remat_param_at(f.g, 2);
  size_t n = (size_t)remat_tensor_numel(p), count;
  float *saved = malloc(n * sizeof *saved);
  assert_int_equal(remat_read(f.g, p, saved, n * sizeof *saved), REMAT_OK);
  float *bad = malloc(n * sizeof *bad);
  memcpy(bad, saved, n * sizeof *bad);
  bad[n / 2] = NAN;
  assert_int_equal(remat_write(f.g, p, bad, n * sizeof *bad), REMAT_OK);
  float *before = fixture_snapshot(f.g, &count);
  remat_step_stats st = {.size = sizeof st}, rs = {.size = sizeof rs};
  assert_int_equal(remat_step(f.g, &st), REMAT_ERR_NUMERIC);
  float *after = fixture_snapshot(f.g, &count);
  assert_memory_equal(before, after, count * sizeof *after);
  assert_int_equal(remat_write(f.g, p, saved, n * sizeof *saved), REMAT_OK);
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  assert_int_equal(remat_step(ref.g, &rs), REMAT_OK);
  assert_true(st.loss == rs.loss);
  assert_int_equal(fixture_grad_hash(&f), fixture_grad_hash(&ref));
  free(saved);
  free(bad);
  free(before);
  free(after);
  fixture_close(&f);
  fixture_close(&ref);
}

/* Inference (a forward-only graph) and a kept bf16 activation read as
 * f32: the logits of bf16 within bf16 rounding of f32's. */
static void test_inference_and_reads(void **state) {
  (void)state;
  remat_tensor *logits[2];
  remat_runtime *rt[2];
  remat_graph *g[2];
  remat_gpt m[2];
  size_t n = (size_t)small.batch * small.seq;
  int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
  fixture_batch(&small, tok, tgt, 3);
  size_t nl = n * (size_t)small.vocab;
  float *out[2];
  remat_step_stats st[2] = {{.size = sizeof st[0]}, {.size = sizeof st[0]}};
  for (int k = 0; k < 2; k++) {
    remat_config rc = {.set = REMAT_SET_PRECISION | REMAT_SET_NUM_THREADS,
                       .num_threads = 2,
                       .precision = k ? REMAT_PRECISION_BF16
                                      : REMAT_PRECISION_F32};
    assert_int_equal(remat_runtime_create(&rc, &rt[k]), REMAT_OK);
    assert_int_equal(remat_graph_create(rt[k], &g[k]), REMAT_OK);
    assert_int_equal(remat_graph_seed(g[k], 5), REMAT_OK);
    assert_int_equal(remat_gpt_build(g[k], &small, &m[k]), REMAT_OK);
    logits[k] = m[k].logits;
    assert_int_equal(remat_keep(g[k], logits[k]), REMAT_OK);
    assert_int_equal(remat_compile(g[k], NULL, NULL), REMAT_OK);
    assert_int_equal(remat_feed(g[k], m[k].tokens, tok, n * 4), REMAT_OK);
    assert_int_equal(remat_feed(g[k], m[k].targets, tgt, n * 4), REMAT_OK);
    assert_int_equal(remat_forward(g[k], &st[k]), REMAT_OK);
    out[k] = malloc(nl * sizeof *out[k]);
    assert_int_equal(remat_read(g[k], logits[k], out[k], nl * 4), REMAT_OK);
    /* the API reads f32: a bf16 tensor is read whole, converted */
    assert_int_equal(remat_read(g[k], logits[k], out[k], nl * 2),
                     REMAT_ERR_SHAPE);
  }
  double err = 0, ref = 0;
  for (size_t i = 0; i < nl; i++) {
    /* a bf16 value: its low 16 bits are zero */
    uint32_t bits;
    memcpy(&bits, &out[1][i], 4);
    assert_int_equal(bits & 0xffffu, 0);
    err += (out[1][i] - out[0][i]) * (double)(out[1][i] - out[0][i]);
    ref += (double)out[0][i] * out[0][i];
  }
  assert_true(sqrt(err) <= 0.02 * sqrt(ref));
  for (int k = 0; k < 2; k++) {
    free(out[k]);
    remat_graph_destroy(g[k]);
    remat_runtime_destroy(rt[k]);
  }
  free(tok);
  free(tgt);
}

/* One-element tensors: [1] ones stay f32 (an f32 input feeding a bf16
 * product, a [1] linear output as the loss) and a [1,1] loss is bf16; each
 * case gives f32's loss and gradient (exact here: small integers). */
typedef enum { LOSS_11, LOSS_1, SCALAR_X } one_case;

static void run_one(one_case c, remat_precision prec, float *loss,
                    float *grad, int64_t *ngrad) {
  remat_config rc = {.set = REMAT_SET_PRECISION | REMAT_SET_NUM_THREADS,
                     .num_threads = 2, .precision = prec};
  remat_runtime *rt;
  remat_graph *g;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  const int64_t x11[2] = {1, 4}, x1[1] = {4}, w4[2] = {1, 4}, s1[1] = {1},
                w81[2] = {8, 1};
  remat_tensor *x, *w, *y;
  if (c == SCALAR_X) { /* x [1] (f32) . w[8,1]^T -> [8] (bf16), summed */
    x = remat_input(g, "x", REMAT_F32, 1, s1);
    w = remat_param(g, "w", 2, w81, REMAT_INIT_ONES, 0);
    y = remat_sum(g, remat_linear(g, x, w, NULL));
  } else { /* x [1,4] or [4] . w[1,4]^T -> [1,1] (bf16) or [1] (f32) */
    x = remat_input(g, "x", REMAT_F32, c == LOSS_11 ? 2 : 1,
                    c == LOSS_11 ? x11 : x1);
    w = remat_param(g, "w", 2, w4, REMAT_INIT_ONES, 0);
    y = remat_linear(g, x, w, NULL);
  }
  if (remat_compile(g, y, NULL) != REMAT_OK)
    fail_msg("case %d: %s", (int)c, remat_last_error());
  const float xs[4] = {1, 2, 3, 4}, two = 2;
  assert_int_equal(remat_feed(g, x, c == SCALAR_X ? &two : xs,
                              c == SCALAR_X ? 4 : 16),
                   REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(g, &st), REMAT_OK);
  *loss = st.loss;
  *ngrad = remat_tensor_numel(w);
  assert_int_equal(remat_read_grad(g, w, grad, (size_t)*ngrad * 4), REMAT_OK);
  float read;
  assert_int_equal(remat_read(g, y, &read, 4), REMAT_OK);
  assert_true(read == st.loss);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

static void test_one_element_tensors(void **state) {
  (void)state;
  for (one_case c = LOSS_11; c <= SCALAR_X; c++) {
    float l32, l16, g32[8], g16[8];
    int64_t n32, n16;
    run_one(c, REMAT_PRECISION_F32, &l32, g32, &n32);
    run_one(c, REMAT_PRECISION_BF16, &l16, g16, &n16);
    assert_true(l32 == (c == SCALAR_X ? 16.0f : 10.0f));
    if (l16 != l32)
      fail_msg("case %d: loss %g in bf16, %g in f32", (int)c, l16, l32);
    assert_int_equal(n16, n32);
    assert_memory_equal(g16, g32, (size_t)n32 * sizeof *g32);
    assert_true(g32[0] == (c == SCALAR_X ? 2.0f : 1.0f));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_cpu_check),
      cmocka_unit_test(test_grads_vs_f32),
      cmocka_unit_test(test_bitwise),
      cmocka_unit_test(test_memory),
      cmocka_unit_test(test_write_refreshes_copies),
      cmocka_unit_test(test_safetensors_across),
      cmocka_unit_test(test_nonfinite),
      cmocka_unit_test(test_inference_and_reads),
      cmocka_unit_test(test_one_element_tensors),
  };
  const char *isa = getenv("ONEDNN_MAX_CPU_ISA");
  if (isa != NULL && strcmp(isa, "AVX2") == 0)
    cmocka_set_test_filter("test_cpu_check");
  const char *filter = getenv("REMAT_TEST_FILTER");
  if (filter != NULL && filter[0] != '\0')
    cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
