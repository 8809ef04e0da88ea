/* Tests of LoRA (remat_lora.h): a tiny Llama fine-tuned with adapters on
 * q_proj and v_proj keeps its frozen weights bitwise, has gradients and
 * AdamW moments for the adapters alone and learns; it starts as the base
 * model whose file it loads; the merged weights and
 * a reloaded adapter file give its logits; the LoRA linear's gradients
 * against central finite differences; a frozen weight whose gradient
 * would be summed from row-chunk partials costs no partials; every policy gives
 * the same bits at 1 and 2 threads; checkpoints hold adapters and moments and
 * resume bitwise; the GPT's adapters under GPT-2's module names; bad settings
 * fail with their exact messages. */
#include <cjson/cJSON.h>
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

#include "remat_llama.h"
#include "tmpdir.h"

static const remat_llama_config tiny = {.hidden_size = 32,
                                        .intermediate_size = 48,
                                        .num_hidden_layers = 2,
                                        .num_attention_heads = 4,
                                        .num_key_value_heads = 2,
                                        .vocab_size = 23,
                                        .tie_word_embeddings = 1,
                                        .seq = 12,
                                        .batch = 2,
                                        .lora = {.rank = 4, .alpha = 8}};
enum { N = 2 * 12 };

static const remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-1f};

static void must(remat_status s, const char *what) {
  if (s != REMAT_OK)
    fail_msg("%s: %s: %s", what, remat_status_string(s), remat_last_error());
}

/* A fine-tuning task: each target is the token plus the one two back. */
static void batch(int32_t *tokens, int32_t *targets, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 99u;
  for (int b = 0; b < 2; b++)
    for (int t = 0; t < 12; t++) {
      x = x * 1664525u + 1013904223u;
      int i = b * 12 + t;
      tokens[i] = (int32_t)((x >> 16) % 23u);
      targets[i] = (tokens[i] + (t >= 2 ? tokens[i - 2] : 0)) % 23;
    }
}

typedef struct run {
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
} run;

static void open_run(run *r, const remat_llama_config *c, int threads,
                     const char *policy, const remat_optimizer *opt,
                     uint64_t seed) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_TRACE | REMAT_SET_MEMORY_BUDGET |
                            REMAT_SET_PRECISION,
                     .num_threads = threads,
                     .policy = policy};
  must(remat_runtime_create(&rc, &r->rt), "runtime");
  must(remat_graph_create(r->rt, &r->g), "graph");
  must(remat_graph_seed(r->g, seed), "seed");
  must(remat_llama_build(r->g, c, &r->m), "remat_llama_build");
  must(remat_keep(r->g, r->m.logits), "keep");
  must(remat_compile(r->g, r->m.loss, opt), "compile");
}

static void close_run(run *r) {
  remat_graph_destroy(r->g);
  remat_runtime_destroy(r->rt);
}

static float step(run *r, uint32_t seed, remat_step_stats *st) {
  int32_t tok[N], tgt[N];
  batch(tok, tgt, seed);
  must(remat_feed(r->g, r->m.tokens, tok, sizeof tok), "feed");
  must(remat_feed(r->g, r->m.targets, tgt, sizeof tgt), "feed");
  must(remat_step(r->g, st), "remat_step");
  float loss;
  must(remat_read(r->g, r->m.loss, &loss, sizeof loss), "loss");
  return loss;
}

static float *read_param(remat_graph *g, const remat_tensor *p) {
  size_t n = (size_t)remat_tensor_numel(p);
  float *v = malloc(n * sizeof *v);
  assert_non_null(v);
  must(remat_read(g, p, v, n * sizeof *v), remat_tensor_name(p));
  return v;
}

static bool is_adapter(const remat_tensor *p) {
  return strstr(remat_tensor_name(p), ".lora_") != NULL;
}

/* The logits of batch `seed` from a step of a graph compiled without an
 * optimizer (no update). */
static float *logits(run *r, uint32_t seed) {
  step(r, seed, NULL);
  float *v = malloc(N * 23 * sizeof *v);
  assert_non_null(v);
  must(remat_read(r->g, r->m.logits, v, N * 23 * sizeof *v), "logits");
  return v;
}

/* ---- training: frozen weights, gradients, moments, loss ---- */

static void frozen_stay_adapters_learn(void **state) {
  (void)state;
  run r;
  open_run(&r, &tiny, 2, "nothing_saveable", &adamw, 1);
  int np = remat_num_params(r.g), adapters = 0;
  int64_t adapter_bytes = 0;
  float **before = calloc((size_t)np, sizeof *before);
  for (int i = 0; i < np; i++) {
    remat_tensor *p = remat_param_at(r.g, i);
    before[i] = read_param(r.g, p);
    if (is_adapter(p)) {
      adapters++;
      adapter_bytes += remat_tensor_numel(p) * 4;
    }
  }
  assert_int_equal(adapters, 2 * 2 * 2); /* A, B of q and v, 2 layers */
  remat_step_stats st = {.size = sizeof st};
  /* the two batches in turn; the mean of the first two losses against the
   * last two (3.14 and 2.89 here) */
  float loss[20];
  for (int s = 0; s < 20; s++)
    loss[s] = step(&r, 1 + s % 2, &st);
  assert_true((loss[18] + loss[19]) / 2 < (loss[0] + loss[1]) / 2 - 0.15f);
  assert_int_equal(st.peak[REMAT_MEM_OPTIMIZER], 2 * adapter_bytes);
  for (int i = 0; i < np; i++) {
    remat_tensor *p = remat_param_at(r.g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    float *now = read_param(r.g, p), *grad = malloc(n * sizeof *grad);
    remat_status s = remat_read_grad(r.g, p, grad, n * sizeof *grad);
    if (is_adapter(p)) {
      assert_int_equal(s, REMAT_OK);
      assert_true(memcmp(now, before[i], n * sizeof *now) != 0);
    } else {
      assert_int_equal(s, REMAT_ERR_INVALID_ARG);
      assert_memory_equal(now, before[i], n * sizeof *now);
    }
    free(now);
    free(grad);
    free(before[i]);
  }
  free(before);
  close_run(&r);
}

/* Every projection adapted, and a parameter named trainable: it and the
 * adapters have gradients, no other parameter has. */
static void trainable_names_stay_trainable(void **state) {
  (void)state;
  remat_llama_config c = tiny;
  c.lora.targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  c.lora.trainable = "model.norm.weight";
  run r;
  open_run(&r, &c, 1, "nothing_saveable", &adamw, 1);
  int adapters = 0;
  step(&r, 1, NULL);
  for (int i = 0; i < remat_num_params(r.g); i++) {
    remat_tensor *p = remat_param_at(r.g, i);
    float g[32 * 48];
    size_t bytes = (size_t)remat_tensor_numel(p) * sizeof(float);
    remat_status s = bytes <= sizeof g ? remat_read_grad(r.g, p, g, bytes)
                                       : REMAT_ERR_INVALID_ARG;
    bool trainable =
        is_adapter(p) || strcmp(remat_tensor_name(p), "model.norm.weight") == 0;
    adapters += is_adapter(p);
    assert_int_equal(s, trainable ? REMAT_OK : REMAT_ERR_INVALID_ARG);
  }
  assert_int_equal(adapters, 2 * 7 * 2);
  close_run(&r);
}

/* A base model's file (no adapters) loads into the LoRA graph, whose
 * zero B makes its logits bitwise the base model's. */
static void starts_as_base(void **state) {
  (void)state;
  run plain, lora;
  remat_llama_config c = tiny;
  c.lora.rank = 0;
  open_run(&plain, &c, 2, "nothing_saveable", NULL, 4);
  char path[128];
  snprintf(path, sizeof path, "%s/base.safetensors", dir);
  must(remat_save_safetensors(plain.g, path), "save base");
  open_run(&lora, &tiny, 2, "nothing_saveable", NULL, 8);
  must(remat_load_safetensors(lora.g, path), "load base into LoRA");
  float *want = logits(&plain, 2), *got = logits(&lora, 2);
  assert_memory_equal(got, want, N * 23 * sizeof *got);
  free(want);
  free(got);
  close_run(&lora);
  close_run(&plain);
}

/* ---- merging and adapter files ---- */

/* A graph without an optimizer holding the state of a LoRA graph trained
 * for `steps` steps (through a save of every parameter under remat's
 * names). */
static void trained(run *r, int steps) {
  run t;
  open_run(&t, &tiny, 2, "nothing_saveable", &adamw, 1);
  for (int s = 0; s < steps; s++)
    step(&t, 1 + s % 2, NULL);
  char path[128];
  snprintf(path, sizeof path, "%s/trained.safetensors", dir);
  must(remat_save_safetensors(t.g, path), "save trained");
  close_run(&t);
  open_run(r, &tiny, 2, "nothing_saveable", NULL, 9);
  must(remat_load_safetensors(r->g, path), "load trained");
}

static void merged_matches(void **state) {
  (void)state;
  run r, base;
  trained(&r, 10);
  float *want = logits(&r, 7);
  char path[128];
  snprintf(path, sizeof path, "%s/merged.safetensors", dir);
  must(remat_lora_save_merged(r.g, path), "remat_lora_save_merged");
  remat_llama_config plain = tiny;
  plain.lora.rank = 0;
  open_run(&base, &plain, 2, "nothing_saveable", NULL, 5);
  must(remat_load_safetensors(base.g, path), "load merged");
  float *got = logits(&base, 7);
  double worst = 0, moved = 0;
  for (int i = 0; i < N * 23; i++) {
    double e = fabs((double)got[i] - want[i]) / fmax(1.0, fabs(want[i]));
    worst = fmax(worst, e);
  }
  /* the adapters moved the logits: the merge had something to fold */
  run fresh;
  open_run(&fresh, &tiny, 2, "nothing_saveable", NULL, 1);
  float *untrained = logits(&fresh, 7);
  for (int i = 0; i < N * 23; i++)
    moved = fmax(moved, fabs((double)untrained[i] - want[i]));
  assert_true(moved > 1e-2);
  assert_true(worst <= 1e-5);
  free(untrained);
  close_run(&fresh);
  free(want);
  free(got);
  close_run(&base);
  close_run(&r);
}

static cJSON *read_json(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char buf[4096];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  cJSON *root = cJSON_Parse(buf);
  assert_non_null(root);
  return root;
}

/* The safetensors header of PATH. */
static cJSON *read_header(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  uint64_t len = 0;
  assert_int_equal(fread(&len, 8, 1, f), 1);
  assert_true(len < 100000);
  char *text = calloc(len + 1, 1);
  assert_int_equal(fread(text, 1, len, f), len);
  fclose(f);
  cJSON *root = cJSON_Parse(text);
  free(text);
  assert_non_null(root);
  return root;
}

static void adapter_file_reloads(void **state) {
  (void)state;
  run r, other;
  trained(&r, 10);
  float *want = logits(&r, 3);
  char path[128], config[128];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  snprintf(config, sizeof config, "%s/adapter_config.json", dir);
  must(remat_lora_save(r.g, path, config), "remat_lora_save");
  cJSON *h = read_header(path);
  assert_int_equal(cJSON_GetArraySize(h), 8 + 1); /* and __metadata__ */
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(
      h, "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight");
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(
      h, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  assert_non_null(a);
  assert_non_null(b);
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(a, "shape");
  assert_int_equal(cJSON_GetArrayItem(shape, 0)->valueint, 4);
  assert_int_equal(cJSON_GetArrayItem(shape, 1)->valueint, 32);
  shape = cJSON_GetObjectItemCaseSensitive(b, "shape");
  assert_int_equal(cJSON_GetArrayItem(shape, 0)->valueint, 32);
  assert_int_equal(cJSON_GetArrayItem(shape, 1)->valueint, 4);
  cJSON_Delete(h);
  cJSON *cfg = read_json(config);
  assert_int_equal(cJSON_GetObjectItem(cfg, "r")->valueint, 4);
  assert_true(cJSON_GetObjectItem(cfg, "lora_alpha")->valuedouble == 8.0);
  assert_string_equal(cJSON_GetObjectItem(cfg, "peft_type")->valuestring,
                      "LORA");
  char *targets =
      cJSON_PrintUnformatted(cJSON_GetObjectItem(cfg, "target_modules"));
  assert_string_equal(targets, "[\"q_proj\",\"v_proj\"]");
  cJSON_free(targets);
  cJSON_Delete(cfg);
  /* another seed: other A's; the same base (the seed of the base) */
  open_run(&other, &tiny, 1, "dots_saveable", NULL, 1);
  float *before = logits(&other, 3);
  must(remat_lora_load(other.g, path), "remat_lora_load");
  float *got = logits(&other, 3);
  assert_memory_equal(got, want, N * 23 * sizeof *got);
  assert_true(memcmp(before, want, N * 23 * sizeof *got) != 0);
  free(before);
  free(got);
  free(want);
  close_run(&other);
  close_run(&r);
}

/* ---- checkpoints: adapters and moments, resumed bitwise ---- */

static void checkpoint_resumes(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/lora.ckpt", dir);
  run r, back;
  open_run(&r, &tiny, 2, "nothing_saveable", &adamw, 1);
  for (int s = 0; s < 3; s++)
    step(&r, 1 + s, NULL);
  must(remat_save_checkpoint(r.g, path, NULL, NULL, 0), "save checkpoint");
  cJSON *h = read_header(path);
  /* 8 adapters, their m and v, and the metadata: no base weight */
  assert_int_equal(cJSON_GetArraySize(h), 3 * 8 + 1);
  assert_null(cJSON_GetObjectItemCaseSensitive(
      h, "model.layers.0.self_attn.q_proj.weight"));
  assert_non_null(cJSON_GetObjectItemCaseSensitive(
      h, "adam_v:model.layers.0.self_attn.q_proj.lora_B.weight"));
  cJSON_Delete(h);
  float want[3];
  for (int s = 0; s < 3; s++)
    want[s] = step(&r, 10 + s, NULL);
  open_run(&back, &tiny, 2, "nothing_saveable", &adamw, 1);
  must(remat_load_checkpoint(back.g, path, NULL, NULL, 0), "load checkpoint");
  for (int s = 0; s < 3; s++) {
    float got = step(&back, 10 + s, NULL);
    assert_memory_equal(&got, &want[s], sizeof got);
  }
  for (int i = 0; i < remat_num_params(r.g); i++) {
    remat_tensor *p = remat_param_at(r.g, i);
    float *want_v = read_param(r.g, p),
          *got_v = read_param(back.g, remat_param_at(back.g, i));
    assert_memory_equal(got_v, want_v, remat_tensor_numel(p) * sizeof(float));
    free(want_v);
    free(got_v);
  }
  close_run(&back);
  close_run(&r);
}

/* ---- the LoRA linear against finite differences ---- */

enum { ROWS = 6, IN = 5, OUT = 7, RANK = 3 };

static double loss_at(remat_graph *g, const remat_tensor *loss) {
  must(remat_step(g, NULL), "step");
  float v;
  must(remat_read(g, loss, &v, sizeof v), "loss");
  return v;
}

static void fd_check(remat_graph *g, const remat_tensor *p,
                     const remat_tensor *loss) {
  size_t n = (size_t)remat_tensor_numel(p);
  float *v = read_param(g, p), grad[64];
  loss_at(g, loss);
  must(remat_read_grad(g, p, grad, n * sizeof *grad), "grad");
  for (size_t i = 0; i < n; i++) {
    const float h = 1e-2f;
    float keep = v[i];
    v[i] = keep + h;
    must(remat_write(g, p, v, n * sizeof *v), "write");
    double up = loss_at(g, loss);
    v[i] = keep - h;
    must(remat_write(g, p, v, n * sizeof *v), "write");
    double down = loss_at(g, loss);
    v[i] = keep;
    must(remat_write(g, p, v, n * sizeof *v), "write");
    double fd = (up - down) / (2.0 * h);
    if (fabs(fd - grad[i]) > 2e-3 * fmax(1.0, fabs(fd)))
      fail_msg("%s[%zu]: gradient %g, finite differences %g",
               remat_tensor_name(p), i, (double)grad[i], fd);
  }
  free(v);
}

static void lora_linear_gradients(void **state) {
  (void)state;
  remat_runtime *rt;
  remat_graph *g;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_PRECISION,
                     .num_threads = 2};
  must(remat_runtime_create(&rc, &rt), "runtime");
  must(remat_graph_create(rt, &g), "graph");
  int64_t xd[2] = {ROWS, IN}, wd[2] = {OUT, IN}, bd[1] = {OUT}, td[1] = {ROWS};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, xd);
  remat_tensor *t = remat_input(g, "t", REMAT_I32, 1, td);
  remat_tensor *w = remat_param(g, "w", 2, wd, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *b = remat_param(g, "b", 1, bd, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *y = remat_lora_linear(g, x, w, b, "proj", RANK, 6.0f);
  remat_tensor *loss = remat_cross_entropy(g, y, t);
  must(remat_compile(g, loss, NULL), "compile");
  float xv[ROWS * IN], bv[OUT * RANK];
  for (int i = 0; i < ROWS * IN; i++)
    xv[i] = sinf(0.7f * (float)i + 0.3f);
  for (int i = 0; i < OUT * RANK; i++)
    bv[i] = 0.4f * cosf(1.3f * (float)i);
  int32_t tv[ROWS] = {0, 3, 6, 2, 5, 1};
  must(remat_feed(g, x, xv, sizeof xv), "feed");
  must(remat_feed(g, t, tv, sizeof tv), "feed");
  remat_tensor *pa = remat_param_at(g, 2), *pb = remat_param_at(g, 3);
  assert_string_equal(remat_tensor_name(pa), "proj.lora_A.weight");
  assert_string_equal(remat_tensor_name(pb), "proj.lora_B.weight");
  must(remat_write(g, pb, bv, sizeof bv), "write B");
  float wgrad[OUT * IN];
  loss_at(g, loss);
  assert_int_equal(remat_read_grad(g, w, wgrad, sizeof wgrad),
                   REMAT_ERR_INVALID_ARG);
  fd_check(g, pa, loss);
  fd_check(g, pb, loss);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* x[ROWS2,16] -> linear(w1) -> linear(w2) -> cross-entropy, with so many
 * rows that w2's gradient is summed from partials over row chunks: frozen,
 * w2 costs no weight-gradient FLOPs (the partials are not computed
 * either), and w1's gradient is bitwise the unfrozen run's. */
enum { ROWS2 = 2048, K2 = 16, V2 = 8 };

static double chunked(bool freeze, float *grad_w1) {
  remat_runtime *rt;
  remat_graph *g;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_PRECISION,
                     .num_threads = 2};
  must(remat_runtime_create(&rc, &rt), "runtime");
  must(remat_graph_create(rt, &g), "graph");
  int64_t xd[2] = {ROWS2, K2}, td[1] = {ROWS2}, d1[2] = {K2, K2},
          d2[2] = {V2, K2};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, xd);
  remat_tensor *t = remat_input(g, "t", REMAT_I32, 1, td);
  remat_tensor *w1 = remat_param(g, "w1", 2, d1, REMAT_INIT_NORMAL, 0.3f);
  remat_tensor *w2 = remat_param(g, "w2", 2, d2, REMAT_INIT_NORMAL, 0.3f);
  remat_tensor *loss = remat_cross_entropy(
      g, remat_linear(g, remat_linear(g, x, w1, NULL), w2, NULL), t);
  if (freeze)
    must(remat_param_freeze(g, w2), "freeze");
  must(remat_compile(g, loss, NULL), "compile");
  float *xv = malloc(ROWS2 * K2 * sizeof *xv);
  int32_t *tv = malloc(ROWS2 * sizeof *tv);
  for (int i = 0; i < ROWS2 * K2; i++)
    xv[i] = sinf(0.37f * (float)i);
  for (int i = 0; i < ROWS2; i++)
    tv[i] = (i * 5) % V2;
  must(remat_feed(g, x, xv, ROWS2 * K2 * sizeof *xv), "feed");
  must(remat_feed(g, t, tv, ROWS2 * sizeof *tv), "feed");
  remat_step_stats st = {.size = sizeof st};
  must(remat_step(g, &st), "step");
  must(remat_read_grad(g, w1, grad_w1, K2 * K2 * sizeof *grad_w1), "grad");
  free(xv);
  free(tv);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  return st.flops;
}

static void frozen_chunked_dw_skipped(void **state) {
  (void)state;
  float free_grad[K2 * K2], frozen_grad[K2 * K2];
  double all = chunked(false, free_grad), frozen = chunked(true, frozen_grad);
  /* the partial products, and their sum over the chunks */
  assert_true(all - frozen >= 2.0 * ROWS2 * K2 * V2);
  assert_memory_equal(free_grad, frozen_grad, sizeof free_grad);
}

/* ---- every policy, 1 and 2 threads: the same bits ---- */

static uint64_t run_hash(int threads, const char *policy) {
  run r;
  open_run(&r, &tiny, threads, policy, &adamw, 1);
  uint64_t h = 1469598103934665603ull;
  for (int s = 0; s < 3; s++) {
    float loss = step(&r, 1 + s, NULL);
    const unsigned char *b = (const unsigned char *)&loss;
    for (size_t k = 0; k < sizeof loss; k++)
      h = (h ^ b[k]) * 1099511628211ull;
  }
  for (int i = 0; i < remat_num_params(r.g); i++) {
    remat_tensor *p = remat_param_at(r.g, i);
    if (!is_adapter(p))
      continue;
    size_t n = (size_t)remat_tensor_numel(p);
    float *v = read_param(r.g, p), *grad = malloc(n * sizeof *grad);
    must(remat_read_grad(r.g, p, grad, n * sizeof *grad), "grad");
    for (size_t k = 0; k < n * sizeof *v; k++)
      h = (h ^ ((const unsigned char *)v)[k] ^
           ((const unsigned char *)grad)[k]) *
          1099511628211ull;
    free(v);
    free(grad);
  }
  close_run(&r);
  return h;
}

static void policies_same_bits(void **state) {
  (void)state;
  static const char *const policies[] = {
      "everything_saveable",
      "nothing_saveable",
      "dots_saveable",
      "dots_with_no_batch_dims_saveable",
      "save_only_these_names:q_proj_lora,v_proj_lora,q,v",
      "save_any_names_but_these:q_proj_lora"};
  uint64_t want = run_hash(1, "everything_saveable");
  for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++)
    for (int threads = 1; threads <= 2; threads++)
      if (run_hash(threads, policies[i]) != want)
        fail_msg("%s at %d threads: other bits than everything_saveable at "
                 "1 thread",
                 policies[i], threads);
}

/* ---- the GPT: Hugging Face GPT-2's module names ---- */

static void gpt_adapters(void **state) {
  (void)state;
  remat_runtime *rt;
  remat_graph *g;
  must(remat_runtime_create(NULL, &rt), "runtime");
  must(remat_graph_create(rt, &g), "graph");
  remat_gpt_config c = {.layers = 2,
                        .d_model = 16,
                        .heads = 2,
                        .seq = 8,
                        .batch = 2,
                        .vocab = 11,
                        .lora = {.rank = 2, .targets = "c_proj"}};
  remat_gpt m;
  must(remat_gpt_build(g, &c, &m), "remat_gpt_build");
  static const char *const want[] = {
      "transformer.h.0.attn.c_proj.lora_A.weight",
      "transformer.h.0.attn.c_proj.lora_B.weight",
      "transformer.h.0.mlp.c_proj.lora_A.weight",
      "transformer.h.0.mlp.c_proj.lora_B.weight"};
  int found = 0, adapters = 0;
  for (int i = 0; i < remat_num_params(g); i++) {
    const char *name = remat_tensor_name(remat_param_at(g, i));
    for (size_t k = 0; k < sizeof want / sizeof *want; k++)
      found += strcmp(name, want[k]) == 0;
    adapters += is_adapter(remat_param_at(g, i));
  }
  assert_int_equal(found, 4);
  assert_int_equal(adapters, 2 * 2 * 2);
  must(remat_compile(g, m.loss, &adamw), "compile");
  char path[128], config[128];
  snprintf(path, sizeof path, "%s/gpt_adapter.safetensors", dir);
  snprintf(config, sizeof config, "%s/gpt_adapter_config.json", dir);
  must(remat_lora_save(g, path, config), "remat_lora_save");
  cJSON *cfg = read_json(config);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cfg, "fan_in_fan_out")));
  char *targets =
      cJSON_PrintUnformatted(cJSON_GetObjectItem(cfg, "target_modules"));
  assert_string_equal(targets, "[\"c_proj\"]");
  cJSON_free(targets);
  cJSON_Delete(cfg);
  remat_graph_destroy(g);
  must(remat_graph_create(rt, &g), "graph");
  c.lora.targets = "c_attn,q_proj";
  assert_int_not_equal(remat_gpt_build(g, &c, &m), REMAT_OK);
  assert_string_equal(remat_graph_error(g),
                      "remat_gpt_build: lora target 'q_proj': expected a "
                      "comma-separated list of c_attn, attn.c_proj, c_fc, "
                      "mlp.c_proj, c_proj");
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* ---- refusals ---- */

static void build_fails(const remat_llama_config *c, const char *message) {
  remat_runtime *rt;
  remat_graph *g;
  must(remat_runtime_create(NULL, &rt), "runtime");
  must(remat_graph_create(rt, &g), "graph");
  remat_gpt m;
  assert_int_not_equal(remat_llama_build(g, c, &m), REMAT_OK);
  assert_string_equal(remat_graph_error(g), message);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

static void bad_settings(void **state) {
  (void)state;
  remat_llama_config c = tiny;
  c.lora.rank = -1;
  build_fails(&c, "remat_llama_build: lora rank -1: expected >= 0 (0 for no "
                  "adapters)");
  c.lora.rank = 17; /* k_proj and v_proj: 2 heads of 8 = 16 wide */
  build_fails(&c, "remat_llama_build: lora rank 17: expected at most 16, the "
                  "smallest width of the targeted linears");
  c.lora.rank = 4;
  c.lora.alpha = NAN;
  build_fails(&c, "remat_llama_build: lora alpha nan: expected a finite "
                  "value >= 0 (0 for the rank)");
  c.lora.alpha = 8;
  c.lora.targets = "q_proj,qv_proj";
  build_fails(&c, "remat_llama_build: lora target 'qv_proj': expected a "
                  "comma-separated list of q_proj, k_proj, v_proj, o_proj, "
                  "gate_proj, up_proj, down_proj");
  c.lora.targets = "q_proj,,v_proj";
  build_fails(&c, "remat_llama_build: lora target '': expected a "
                  "comma-separated list of q_proj, k_proj, v_proj, o_proj, "
                  "gate_proj, up_proj, down_proj");
  c.lora.targets = NULL;
  c.lora.trainable = "model.norm.weight,lm_head.weight";
  build_fails(&c, "remat_llama_build: lora trainable 'lm_head.weight' is not "
                  "a parameter of the model");

  remat_runtime *rt;
  remat_graph *g;
  must(remat_runtime_create(NULL, &rt), "runtime");
  must(remat_graph_create(rt, &g), "graph");
  int64_t xd[2] = {2, 5}, wd[2] = {7, 5};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, xd);
  remat_tensor *w = remat_param(g, "w", 2, wd, REMAT_INIT_NORMAL, 0.5f);
  assert_null(remat_lora_linear(g, x, w, NULL, "proj", 6, 1.0f));
  assert_string_equal(remat_graph_error(g),
                      "remat_lora_linear: rank 6 for 'proj' [7,5]: expected "
                      "1 to 5 (the smaller of its out and in widths)");
  remat_graph_destroy(g);
  must(remat_graph_create(rt, &g), "graph");
  x = remat_input(g, "x", REMAT_F32, 2, xd);
  w = remat_param(g, "w", 2, wd, REMAT_INIT_NORMAL, 0.5f);
  assert_non_null(remat_lora_linear(g, x, w, NULL, "proj", 2, 0.0f));
  assert_null(remat_lora_linear(g, x, w, NULL, "proj", 2, 0.0f));
  assert_string_equal(remat_graph_error(g), "remat_lora_linear: module "
                                            "'proj' already has an adapter");
  remat_graph_destroy(g);
  must(remat_graph_create(rt, &g), "graph");
  x = remat_input(g, "x", REMAT_F32, 2, xd);
  assert_null(remat_lora_linear(g, x, (remat_tensor *)x, NULL, "p", 2, 1.0f));
  assert_string_equal(remat_graph_error(g),
                      "remat_lora_linear: 'p': the weight 'x' must be a "
                      "parameter of shape [out,in]");
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);

  run r;
  remat_llama_config plain = tiny;
  plain.lora.rank = 0;
  open_run(&r, &plain, 1, "nothing_saveable", &adamw, 1);
  char path[128];
  snprintf(path, sizeof path, "%s/none.safetensors", dir);
  assert_int_equal(remat_lora_save(r.g, path, NULL), REMAT_ERR_INVALID_ARG);
  assert_string_equal(remat_last_error(),
                      "remat_lora_save: the graph has no LoRA adapters "
                      "(remat_lora_linear or a model built with lora.rank > "
                      "0)");
  close_run(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(frozen_stay_adapters_learn),
      cmocka_unit_test(trainable_names_stay_trainable),
      cmocka_unit_test(starts_as_base),
      cmocka_unit_test(merged_matches),
      cmocka_unit_test(adapter_file_reloads),
      cmocka_unit_test(checkpoint_resumes),
      cmocka_unit_test(lora_linear_gradients),
      cmocka_unit_test(frozen_chunked_dw_skipped),
      cmocka_unit_test(policies_same_bits),
      cmocka_unit_test(gpt_adapters),
      cmocka_unit_test(bad_settings),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
