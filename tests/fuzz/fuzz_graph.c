/* Fuzz target: random sequences of graph-building calls. The input's bytes
 * pick which builder to call, on which existing tensors (or NULL), with
 * which shapes and arguments; then the graph is compiled (for training,
 * with or without an optimizer, or forward-only) and, when that succeeds,
 * fed zeros and run once. Nothing may crash; every failure must leave a
 * status and a message, and a graph that failed to build must fail to
 * compile with the same status. Huge and wrapping dims must fail when
 * built (REMAT_ERR_LIMIT or REMAT_ERR_SHAPE), never reach compile. NaN,
 * Inf and huge scales, norm epsilons, rope bases, dropout probabilities
 * and learning rates are drawn:
 * builders and compile refuse the non-finite ones, and a step that
 * succeeds leaves every parameter finite, one that fails on numbers
 * changes none. Two
 * runtimes (one worker each) serve every input: f32, and bf16 when the
 * input's last byte is odd. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "remat.h"

enum { MAX_TENSORS = 24, MAX_DIM = 6 };

typedef struct builder {
  remat_graph *g;
  remat_tensor *t[MAX_TENSORS];
  int n;
  int regions_open;
  int64_t attention_work; /* fused attention's B x T x T, never a tensor */
  fuzz_reader in;
} builder;

static remat_runtime *shared_runtime(bool bf16) {
  static remat_runtime *rt[2];
  if (rt[bf16] == NULL) {
    remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_BIND |
                              REMAT_SET_PRECISION,
                       .num_threads = 1,
                       .bind = REMAT_BIND_NONE,
                       .precision = bf16 ? REMAT_PRECISION_BF16
                                         : REMAT_PRECISION_F32};
    FUZZ_CHECK(remat_runtime_create(&rc, &rt[bf16]) == REMAT_OK);
  }
  return rt[bf16];
}

/* Scales, epsilons and learning rates that builders and compile must
 * refuse (NaN, +-Inf, past REMAT_MAX_INIT_SCALE) or that updates must not
 * let overflow (1e30, 3e38). */
static const float hostile_floats[8] = {NAN, INFINITY, -INFINITY, 1e31f,
                                        1e30f, 3e38f, -0.5f, 1e-30f};

/* An existing tensor, or NULL one time in (n + 1). */
static remat_tensor *pick(builder *b) {
  unsigned i = fuzz_byte(&b->in) % (unsigned)(b->n + 1);
  return i < (unsigned)b->n ? b->t[i] : NULL;
}

static void push(builder *b, remat_tensor *t) {
  if (t != NULL && b->n < MAX_TENSORS)
    b->t[b->n++] = t;
}

/* Dims whose products wrap int64 or pass the 2^34-element limit of one
 * tensor, alone or through an op's output (attention's [B,H,T,T]). */
static const int64_t huge_dims[] = {INT64_C(1) << 31, (INT64_C(1) << 31) - 1,
                                    INT64_C(1) << 30, 3 * (INT64_C(1) << 29),
                                    (INT64_C(1) << 17) + 1};

/* 1 to 4 dims of 1 to MAX_DIM each; sometimes a bad ndim or dim, or a
 * huge one (bytes 250 to 254). */
static int read_dims(builder *b, int64_t *dims) {
  unsigned code = fuzz_byte(&b->in);
  int ndim = (int)(code % 4) + 1;
  if (code == 255)
    ndim = 5;
  for (int i = 0; i < 4; i++) {
    unsigned d = fuzz_byte(&b->in);
    dims[i] = d == 255   ? 0
              : d >= 250 ? huge_dims[d - 250]
                         : (int64_t)(d % MAX_DIM) + 1;
  }
  return ndim;
}

/* Every tensor that exists has 1 to 2^34 elements (huge shapes fail when
 * built); returns whether the graph is small enough to compile and run. */
static bool sizes_checked(const builder *b) {
  int64_t total = 0;
  for (int i = 0; i < remat_num_tensors(b->g); i++) {
    int64_t n = remat_tensor_numel(remat_tensor_at(b->g, i));
    FUZZ_CHECK(n >= 1 && n <= (INT64_C(1) << 34));
    total += n;
  }
  return total <= (INT64_C(1) << 22) &&
         b->attention_work <= (INT64_C(1) << 22);
}

static remat_policy *read_policy(builder *b) {
  static const char *const forms[] = {
      "everything_saveable", "nothing_saveable", "dots_saveable",
      "dots_with_no_batch_dims_saveable", "save_only_these_names:t0",
      "save_any_names_but_these:t1",
      "save_from_both_policies:dots_saveable+save_only_these_names:t2"};
  unsigned i = fuzz_byte(&b->in) % 8;
  remat_policy *p = NULL;
  if (i < 7)
    FUZZ_CHECK(remat_policy_parse(forms[i], &p) == REMAT_OK);
  return p;
}

static void build_one(builder *b, unsigned op) {
  static const char *const names[] = {"t0", "t1", "t2", "x", "w"};
  remat_graph *g = b->g;
  int64_t dims[4];
  char name[8] = {'i', (char)('a' + b->n % 26), 0};
  switch (op % 32) {
  case 0: {
    int nd = read_dims(b, dims);
    push(b, remat_input(g, name, REMAT_F32, nd, dims));
    break;
  }
  case 1: {
    int nd = read_dims(b, dims);
    push(b, remat_input(g, name, REMAT_I32, nd, dims));
    break;
  }
  case 2: { /* the init byte's values 224 to 255 pick a hostile scale */
    int nd = read_dims(b, dims);
    name[0] = 'p';
    unsigned ib = fuzz_byte(&b->in);
    float scale = ib >= 224 ? hostile_floats[(ib >> 2) & 7] : 0.1f;
    remat_tensor *t = remat_param(g, name, nd, dims, (remat_init)(ib % 4),
                                  scale);
    /* A hostile scale never makes a parameter; the call fails for it, or
     * for an earlier bad argument (dims, name), or the graph had failed. */
    if (!isfinite(scale) || fabsf(scale) > REMAT_MAX_INIT_SCALE)
      FUZZ_CHECK(t == NULL && remat_graph_status(g) != REMAT_OK);
    push(b, t);
    break;
  }
  case 3: {
    remat_tensor *x = pick(b), *w = pick(b);
    remat_tensor *bias = fuzz_byte(&b->in) & 1 ? pick(b) : NULL;
    push(b, remat_linear(g, x, w, bias));
    break;
  }
  case 4: push(b, remat_matmul(g, pick(b), pick(b))); break;
  case 5: push(b, remat_add(g, pick(b), pick(b))); break;
  case 6: push(b, remat_bias_add(g, pick(b), pick(b))); break;
  case 7: push(b, remat_relu(g, pick(b))); break;
  case 8:
    push(b, remat_gelu(g, pick(b), (remat_gelu_form)(fuzz_byte(&b->in) % 3)));
    break;
  case 9: {
    remat_tensor *x = pick(b), *gamma = pick(b), *beta = pick(b);
    unsigned eb = fuzz_byte(&b->in); /* 224 to 255: a hostile eps */
    float eps = eb >= 224 ? hostile_floats[(eb >> 2) & 7]
                          : (float)(eb % 3) * 1e-3f;
    remat_tensor *y = remat_layernorm(g, x, gamma, beta, eps);
    if (!isfinite(eps))
      FUZZ_CHECK(y == NULL);
    push(b, y);
    break;
  }
  case 10: push(b, remat_softmax(g, pick(b))); break;
  case 11: {
    remat_tensor *qkv = pick(b);
    push(b, remat_attention_scores(g, qkv, (int)fuzz_byte(&b->in) % 5));
    break;
  }
  case 12: {
    remat_tensor *probs = pick(b), *qkv = pick(b);
    push(b, remat_attention_values(g, probs, qkv, (int)fuzz_byte(&b->in) % 5));
    break;
  }
  case 13: { /* the heads byte's top bit picks the fused op */
    remat_tensor *qkv = pick(b);
    int hb = (int)fuzz_byte(&b->in);
    /* the fused op's T x T scores live only in scratch, so its work is
     * bounded here as the materialized op's [B,H,T,T] tensor is below */
    if ((hb & 0x80) && qkv != NULL && remat_tensor_ndim(qkv) == 3) {
      int64_t bt = remat_tensor_dim(qkv, 0), t = remat_tensor_dim(qkv, 1);
      int64_t lim = INT64_C(1) << 22;
      b->attention_work = t > lim || bt > lim || bt * t > lim / (t ? t : 1)
                              ? lim + 1
                              : b->attention_work + bt * t * t;
    }
    push(b, hb & 0x80 ? remat_fused_attention(g, qkv, hb % 5)
                      : remat_causal_self_attention(g, qkv, hb % 5));
    break;
  }
  case 14: {
    remat_tensor *tokens = pick(b), *wte = pick(b), *wpe = pick(b);
    push(b, remat_embed(g, tokens, wte, wpe));
    break;
  }
  case 15: {
    remat_tensor *logits = pick(b), *targets = pick(b);
    push(b, remat_cross_entropy(g, logits, targets));
    break;
  }
  case 16: push(b, remat_sum(g, pick(b))); break;
  case 17: push(b, remat_mean(g, pick(b))); break;
  case 18: remat_keep(g, pick(b)); break;
  case 19: {
    remat_tensor *t = pick(b);
    remat_checkpoint_name(g, t, names[fuzz_byte(&b->in) % 5]);
    break;
  }
  case 20: {
    remat_policy *p = read_policy(b);
    if (remat_region_begin(g, p) == REMAT_OK)
      b->regions_open++;
    remat_policy_destroy(p);
    break;
  }
  case 21:
    if (remat_region_end(g) == REMAT_OK)
      b->regions_open--;
    break;
  case 22: {
    remat_tensor *x = pick(b);
    unsigned sb = fuzz_byte(&b->in), lb = fuzz_byte(&b->in);
    /* 250 to 254: a huge start or length (wrapping start + len) */
    int64_t start = sb >= 250 && sb < 255 ? huge_dims[sb - 250]
                                           : (int64_t)(sb % 8) - 1;
    int64_t len = lb >= 250 ? INT64_MAX - (int64_t)(lb - 250)
                            : (int64_t)(lb % 8);
    push(b, remat_slice(g, x, start, len));
    break;
  }
  case 23: push(b, remat_mul(g, pick(b), pick(b))); break;
  case 24: push(b, remat_silu(g, pick(b))); break;
  case 25: push(b, remat_swiglu(g, pick(b), pick(b))); break;
  case 26: { /* scale, dropout probability: 224 to 255 hostile */
    remat_tensor *x = pick(b);
    unsigned fb = fuzz_byte(&b->in);
    float f = fb >= 224 ? hostile_floats[(fb >> 2) & 7]
                        : (float)(fb % 5) * 0.25f - 0.25f;
    remat_tensor *y = fb & 1 ? remat_dropout(g, x, f) : remat_scale(g, x, f);
    if (!isfinite(f) || ((fb & 1) && !(f >= 0.0f && f < 1.0f)))
      FUZZ_CHECK(y == NULL);
    push(b, y);
    break;
  }
  case 27: {
    remat_tensor *x = pick(b), *gamma = pick(b);
    unsigned eb = fuzz_byte(&b->in);
    float eps = eb >= 224 ? hostile_floats[(eb >> 2) & 7]
                          : (float)(eb % 3) * 1e-3f;
    remat_tensor *y = remat_rmsnorm(g, x, gamma, eps);
    if (!isfinite(eps))
      FUZZ_CHECK(y == NULL);
    push(b, y);
    break;
  }
  case 28: {
    remat_tensor *x = pick(b);
    unsigned hb = fuzz_byte(&b->in), tb = fuzz_byte(&b->in);
    float theta = tb >= 224 ? hostile_floats[(tb >> 2) & 7]
                            : (float)(tb % 3) * 5000.0f;
    remat_tensor *y = remat_rope(g, x, (int)(hb % 6) - 1, theta);
    if (!isfinite(theta))
      FUZZ_CHECK(y == NULL);
    push(b, y);
    break;
  }
  case 29: { /* general attention: config bits from two bytes */
    remat_tensor *q = pick(b), *k = pick(b), *v = pick(b), *lens = pick(b);
    unsigned cb = fuzz_byte(&b->in), hb = fuzz_byte(&b->in);
    remat_attention_config cfg = {.heads = (int)(hb % 5),
                                  .kv_heads = (int)((hb >> 3) % 4),
                                  .causal = (int)(cb & 1),
                                  .key_lengths = cb & 2 ? lens : NULL,
                                  .dropout = cb & 4 ? 0.25f : 0.0f,
                                  .scale = cb & 8 ? 0.5f : 0.0f,
                                  .fused = (int)((cb >> 4) & 1)};
    if (cb & 0x20) /* packed */
      k = v = NULL;
    if (cb & 0x40)
      cfg.dropout = hostile_floats[(hb >> 5) & 7];
    /* the T x S work of either form, bounded as case 13 bounds it */
    if (q != NULL && remat_tensor_ndim(q) == 3) {
      int64_t bt = remat_tensor_dim(q, 0), t = remat_tensor_dim(q, 1);
      int64_t s = k != NULL && remat_tensor_ndim(k) == 3
                      ? remat_tensor_dim(k, 1)
                      : t;
      int64_t lim = INT64_C(1) << 22;
      b->attention_work = t > lim || s > lim || bt > lim ||
                                  bt * t > lim / (s ? s : 1)
                              ? lim + 1
                              : b->attention_work + bt * t * s;
    }
    remat_tensor *y = remat_attention(g, q, k, v, &cfg);
    if (!isfinite(cfg.dropout) || cfg.dropout < 0.0f || cfg.dropout >= 1.0f)
      FUZZ_CHECK(y == NULL);
    push(b, y);
    break;
  }
  default: /* 30, 31 */
    remat_param_freeze(g, pick(b));
    break;
  }
}

static size_t params_numel(remat_graph *g) {
  size_t n = 0;
  for (int i = 0; i < remat_num_params(g); i++)
    n += (size_t)remat_tensor_numel(remat_param_at(g, i));
  return n;
}

/* Every parameter's values, one after the other. */
static float *params_snapshot(remat_graph *g) {
  float *all = malloc(params_numel(g) * sizeof *all + 1), *at = all;
  FUZZ_CHECK(all != NULL);
  for (int i = 0; i < remat_num_params(g); i++) {
    const remat_tensor *p = remat_param_at(g, i);
    size_t bytes = (size_t)remat_tensor_numel(p) * sizeof *all;
    FUZZ_CHECK(remat_read(g, p, at, bytes) == REMAT_OK);
    at += bytes / sizeof *all;
  }
  return all;
}

/* Feeds zeros to every input (valid token ids) and runs the graph once. */
static void run_once(builder *b, bool forward_only) {
  for (int i = 0; i < b->n; i++) {
    size_t bytes = (size_t)remat_tensor_numel(b->t[i]) * 4;
    void *zeros = calloc(bytes, 1);
    FUZZ_CHECK(zeros != NULL);
    remat_status s = remat_feed(b->g, b->t[i], zeros, bytes);
    FUZZ_CHECK(s == REMAT_OK || s == REMAT_ERR_INVALID_ARG);
    free(zeros);
  }
  float *before = params_snapshot(b->g);
  remat_step_stats st = {.size = sizeof st};
  remat_status s = forward_only ? remat_forward(b->g, &st)
                                : remat_step(b->g, &st);
  FUZZ_CHECK(s == REMAT_OK || s == REMAT_ERR_NUMERIC ||
             s == REMAT_ERR_OUT_OF_MEMORY);
  FUZZ_CHECK(s != REMAT_ERR_NUMERIC || st.nonfinite == 1);
  /* A step that succeeds leaves every parameter finite (they start
   * finite); one that fails on numbers changes none. */
  float *after = params_snapshot(b->g);
  size_t n = params_numel(b->g);
  for (size_t i = 0; s == REMAT_OK && i < n; i++)
    FUZZ_CHECK(isfinite(after[i]));
  FUZZ_CHECK(s != REMAT_ERR_NUMERIC ||
             memcmp(before, after, n * sizeof *after) == 0);
  free(before);
  free(after);
}

static void compile_and_run(builder *b) {
  unsigned hb = fuzz_byte(&b->in), how = hb % 4;
  remat_tensor *loss = NULL;
  if (how != 3 && b->n > 0) {
    loss = b->t[b->n - 1];
    if (remat_tensor_numel(loss) != 1 || fuzz_byte(&b->in) & 1)
      loss = remat_sum(b->g, loss);
  }
  /* the how byte's values 224 to 255 pick a hostile learning rate */
  remat_optimizer opt = {.kind = how == 1 ? REMAT_OPT_SGD : REMAT_OPT_ADAMW,
                         .lr = hb >= 224 ? hostile_floats[(hb >> 2) & 7]
                                         : 1e-3f};
  remat_status before = remat_graph_status(b->g);
  remat_status s = remat_compile(b->g, loss, how == 0 ? NULL : &opt);
  if (before != REMAT_OK)
    FUZZ_CHECK(s == before);
  if (s != REMAT_OK) {
    FUZZ_CHECK(remat_last_error()[0] != '\0');
    FUZZ_CHECK(remat_graph_error(b->g)[0] != '\0' ||
               s == REMAT_ERR_STATE || s == REMAT_ERR_INVALID_ARG);
    return;
  }
  run_once(b, loss == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 512)
    return 0;
  builder b = {.in = {.data = data, .size = size}};
  bool bf16 = size > 0 && (data[size - 1] & 1);
  FUZZ_CHECK(remat_graph_create(shared_runtime(bf16), &b.g) == REMAT_OK);
  FUZZ_CHECK(remat_graph_seed(b.g, 1) == REMAT_OK);
  for (int calls = 0; calls < 40 && !fuzz_done(&b.in); calls++) {
    unsigned op = fuzz_byte(&b.in);
    if (op == 0xff)
      break;
    build_one(&b, op);
    if (remat_graph_status(b.g) != REMAT_OK)
      FUZZ_CHECK(remat_graph_error(b.g)[0] != '\0');
  }
  if (sizes_checked(&b))
    compile_and_run(&b);
  remat_graph_destroy(b.g);
  return 0;
}
