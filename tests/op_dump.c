/* op_dump: runs one op of remat.h (or a small Llama) for
 * tests/torch_ops_check.py, which checks what it writes against a float64
 * PyTorch reference. Only the public API is used.
 *
 *   op_dump PREFIX OP [KEY=VALUE ...]
 *
 * OP is attention, slice, mul, silu, swiglu, scale, rmsnorm, rope, dropout
 * or llama. For an op, its inputs are parameters drawn from the seed
 * (normal, standard deviation 1), the loss is sum(op(inputs) * w) with w
 * one more such parameter, and one step (no optimizer) writes
 * PREFIX.params.safetensors (the inputs and w), PREFIX.grads.safetensors
 * (every gradient) and PREFIX.out.f32 (the op's output, raw little-endian
 * f32). For llama, the weights are loaded from weights=FILE (a safetensors
 * file with Hugging Face's names), tokens then targets (int32 [B,T] each)
 * from tokens=FILE; it writes PREFIX.grads.safetensors and prints
 * "loss VALUE" on stdout.
 *
 * Keys (defaults in parentheses): B (2), T (16), S (T), H (4), KVH (H),
 * hd (16), C (64), causal (0), lens (none: a comma-separated int32 per
 * batch row), scale (0), fused (0), packed (0), theta (0), eps (0),
 * start (0), len (C), p (0), s (1), precision (f32|bf16), seed (1),
 * threads (2), policy (nothing_saveable); llama: layers (2), hidden (64),
 * inter (176), vocab (97), tied (0), weights, tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remat.h"
#include "remat_llama.h"

#define MAX_LENS 64

typedef struct dump_options {
  const char *prefix, *op, *policy, *weights, *tokens;
  int64_t B, T, S, H, KVH, hd, C, start, len;
  int causal, fused, packed, threads, layers, hidden, inter, vocab, tied;
  int nlens;
  int32_t lens[MAX_LENS];
  float scale, theta, eps, p, s;
  unsigned long long seed;
  remat_precision precision;
} dump_options;

/* Parses "n1,n2,..." into o->lens; 0 if it is not that. */
static int parse_lens(dump_options *o, const char *v) {
  char *end = NULL;
  for (o->nlens = 0; o->nlens < MAX_LENS; v = end + 1) {
    o->lens[o->nlens++] = (int32_t)strtol(v, &end, 10);
    if (end == v || *end != ',')
      break;
  }
  return end != v && *end == '\0';
}

/* Sets one KEY=VALUE; 0 when the key or value is not one of ours. */
static int set_option(dump_options *o, const char *kv) {
  const char *eq = strchr(kv, '=');
  if (eq == NULL)
    return 0;
  char key[16];
  snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
  const char *v = eq + 1;
  struct {
    const char *key;
    int64_t *field;
  } ints[] = {{"B", &o->B}, {"T", &o->T},         {"S", &o->S},
              {"H", &o->H}, {"KVH", &o->KVH},     {"hd", &o->hd},
              {"C", &o->C}, {"start", &o->start}, {"len", &o->len}};
  struct {
    const char *key;
    int *field;
  } flags[] = {
      {"causal", &o->causal},   {"fused", &o->fused},   {"packed", &o->packed},
      {"threads", &o->threads}, {"layers", &o->layers}, {"hidden", &o->hidden},
      {"inter", &o->inter},     {"vocab", &o->vocab},   {"tied", &o->tied}};
  struct {
    const char *key;
    float *field;
  } reals[] = {{"scale", &o->scale},
               {"theta", &o->theta},
               {"eps", &o->eps},
               {"p", &o->p},
               {"s", &o->s}};
  struct {
    const char *key;
    const char **field;
  } texts[] = {
      {"policy", &o->policy}, {"weights", &o->weights}, {"tokens", &o->tokens}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    if (strcmp(key, ints[i].key) == 0) {
      *ints[i].field = strtoll(v, NULL, 10);
      return 1;
    }
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    if (strcmp(key, flags[i].key) == 0) {
      *flags[i].field = atoi(v);
      return 1;
    }
  for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
    if (strcmp(key, reals[i].key) == 0) {
      *reals[i].field = strtof(v, NULL);
      return 1;
    }
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    if (strcmp(key, texts[i].key) == 0) {
      *texts[i].field = v;
      return 1;
    }
  if (strcmp(key, "lens") == 0)
    return parse_lens(o, v);
  if (strcmp(key, "seed") == 0) {
    o->seed = strtoull(v, NULL, 10);
    return 1;
  }
  if (strcmp(key, "precision") != 0 ||
      (strcmp(v, "f32") != 0 && strcmp(v, "bf16") != 0))
    return 0;
  o->precision = v[0] == 'b' ? REMAT_PRECISION_BF16 : REMAT_PRECISION_F32;
  return 1;
}

static remat_tensor *param(remat_graph *g, const char *name, int ndim,
                           int64_t d0, int64_t d1, int64_t d2) {
  int64_t dims[3] = {d0, d1, d2};
  return remat_param(g, name, ndim, dims, REMAT_INIT_NORMAL, 1.0f);
}

/* The attention case: q, k, v (or a packed qkv) [B,T or S, heads * hd];
 * *lens is set to the key lengths' input when o->lens holds some. */
static remat_tensor *build_attention(remat_graph *g, const dump_options *o,
                                     remat_tensor **lens) {
  remat_attention_config cfg = {.heads = (int)o->H,
                                .kv_heads = (int)o->KVH,
                                .causal = o->causal,
                                .scale = o->scale,
                                .fused = o->fused};
  if (o->nlens > 0) {
    int64_t b = o->B;
    cfg.key_lengths = *lens = remat_input(g, "lens", REMAT_I32, 1, &b);
  }
  if (o->packed)
    return remat_attention(
        g, param(g, "qkv", 3, o->B, o->T, (o->H + 2 * o->KVH) * o->hd), NULL,
        NULL, &cfg);
  remat_tensor *q = param(g, "q", 3, o->B, o->T, o->H * o->hd);
  remat_tensor *k = param(g, "k", 3, o->B, o->S, o->KVH * o->hd);
  remat_tensor *v = param(g, "v", 3, o->B, o->S, o->KVH * o->hd);
  return remat_attention(g, q, k, v, &cfg);
}

/* The op named by o->op on inputs [B,T,C] (rope: C = H * hd). */
static remat_tensor *build_op(remat_graph *g, const dump_options *o,
                              remat_tensor **lens) {
  const char *op = o->op;
  int64_t B = o->B, T = o->T, C = o->C;
  if (strcmp(op, "attention") == 0)
    return build_attention(g, o, lens);
  if (strcmp(op, "slice") == 0)
    return remat_slice(g, param(g, "x", 3, B, T, C), o->start, o->len);
  if (strcmp(op, "mul") == 0)
    return remat_mul(g, param(g, "a", 3, B, T, C), param(g, "b", 3, B, T, C));
  if (strcmp(op, "silu") == 0)
    return remat_silu(g, param(g, "x", 3, B, T, C));
  if (strcmp(op, "swiglu") == 0)
    return remat_swiglu(g, param(g, "gate", 3, B, T, C),
                        param(g, "up", 3, B, T, C));
  if (strcmp(op, "scale") == 0)
    return remat_scale(g, param(g, "x", 3, B, T, C), o->s);
  if (strcmp(op, "rmsnorm") == 0) {
    remat_tensor *x = param(g, "x", 3, B, T, C);
    return remat_rmsnorm(g, x, param(g, "gamma", 1, C, 0, 0), o->eps);
  }
  if (strcmp(op, "rope") == 0)
    return remat_rope(g, param(g, "x", 3, B, T, o->H * o->hd), (int)o->H,
                      o->theta);
  if (strcmp(op, "dropout") == 0)
    return remat_dropout(g, param(g, "x", 3, B, T, C), o->p);
  fprintf(stderr, "op_dump: unknown op '%s'\n", op);
  return NULL;
}

static int write_file(const char *path, const void *data, size_t bytes) {
  FILE *f = fopen(path, "wb");
  int ok = f != NULL && fwrite(data, 1, bytes, f) == bytes;
  if (f != NULL && fclose(f) != 0)
    ok = 0;
  if (!ok)
    fprintf(stderr, "op_dump: cannot write '%s'\n", path);
  return ok;
}

/* One step of the one-op graph; writes the files named above. */
static int run_op(remat_graph *g, const dump_options *o) {
  remat_tensor *lens = NULL;
  remat_tensor *y = build_op(g, o, &lens);
  if (y == NULL)
    return 0;
  int64_t dims[REMAT_MAX_DIMS];
  for (int i = 0; i < remat_tensor_ndim(y); i++)
    dims[i] = remat_tensor_dim(y, i);
  remat_tensor *w =
      remat_param(g, "w", remat_tensor_ndim(y), dims, REMAT_INIT_NORMAL, 1.0f);
  remat_tensor *loss = remat_sum(g, remat_mul(g, y, w));
  if (remat_keep(g, y) || remat_compile(g, loss, NULL))
    return 0;
  if (lens != NULL &&
      remat_feed(g, lens, o->lens, (size_t)o->nlens * sizeof(int32_t)))
    return 0;
  remat_step_stats st = {.size = sizeof st};
  if (remat_step(g, &st))
    return 0;
  size_t n = (size_t)remat_tensor_numel(y);
  float *out = malloc(n * sizeof(float));
  char path[4096];
  int ok = out != NULL && remat_read(g, y, out, n * sizeof(float)) == 0;
  snprintf(path, sizeof path, "%s.out.f32", o->prefix);
  ok = ok && write_file(path, out, n * sizeof(float));
  free(out);
  snprintf(path, sizeof path, "%s.params.safetensors", o->prefix);
  ok = ok && remat_save_safetensors(g, path) == REMAT_OK;
  snprintf(path, sizeof path, "%s.grads.safetensors", o->prefix);
  return ok && remat_save_grads_safetensors(g, path) == REMAT_OK;
}

/* Reads `bytes` bytes of PATH into dst; the file must hold exactly that. */
static int read_file(const char *path, void *dst, size_t bytes) {
  FILE *f = path != NULL ? fopen(path, "rb") : NULL;
  int ok = f != NULL && fread(dst, 1, bytes, f) == bytes && fgetc(f) == EOF;
  if (f != NULL)
    fclose(f);
  if (!ok)
    fprintf(stderr, "op_dump: cannot read %zu bytes from '%s'\n", bytes,
            path ? path : "(none)");
  return ok;
}

/* One step of a Llama from the given weights and batch. */
static int run_llama(remat_graph *g, const dump_options *o) {
  remat_llama_config cfg = {.hidden_size = o->hidden,
                            .intermediate_size = o->inter,
                            .num_hidden_layers = o->layers,
                            .num_attention_heads = (int)o->H,
                            .num_key_value_heads = (int)o->KVH,
                            .vocab_size = o->vocab,
                            .rms_norm_eps = o->eps,
                            .rope_theta = o->theta,
                            .tie_word_embeddings = o->tied,
                            .seq = (int)o->T,
                            .batch = (int)o->B,
                            .attention = o->fused
                                             ? REMAT_ATTENTION_FUSED
                                             : REMAT_ATTENTION_MATERIALIZED};
  remat_gpt m;
  size_t n = (size_t)(o->B * o->T);
  int32_t *batch = malloc(2 * n * sizeof(int32_t));
  char path[4096];
  remat_step_stats st = {.size = sizeof st};
  if (o->weights == NULL) {
    fprintf(stderr, "op_dump: llama needs weights=FILE\n");
    free(batch);
    return 0;
  }
  int ok =
      batch != NULL && read_file(o->tokens, batch, 2 * n * sizeof(int32_t)) &&
      remat_llama_build(g, &cfg, &m) == REMAT_OK &&
      remat_compile(g, m.loss, NULL) == REMAT_OK &&
      remat_load_safetensors(g, o->weights) == REMAT_OK &&
      remat_feed(g, m.tokens, batch, n * sizeof(int32_t)) == REMAT_OK &&
      remat_feed(g, m.targets, batch + n, n * sizeof(int32_t)) == REMAT_OK &&
      remat_step(g, &st) == REMAT_OK;
  free(batch);
  snprintf(path, sizeof path, "%s.grads.safetensors", o->prefix);
  ok = ok && remat_save_grads_safetensors(g, path) == REMAT_OK;
  if (ok)
    printf("loss %.9g\n", (double)st.loss);
  return ok;
}

int main(int argc, char **argv) {
  dump_options o = {.B = 2,
                    .T = 16,
                    .S = 0,
                    .H = 4,
                    .KVH = 0,
                    .hd = 16,
                    .C = 64,
                    .len = 0,
                    .threads = 2,
                    .layers = 2,
                    .hidden = 64,
                    .inter = 176,
                    .vocab = 97,
                    .s = 1.0f,
                    .seed = 1,
                    .policy = "nothing_saveable"};
  if (argc < 3) {
    fprintf(stderr, "usage: op_dump PREFIX OP [KEY=VALUE ...]\n");
    return 2;
  }
  o.prefix = argv[1];
  o.op = argv[2];
  for (int i = 3; i < argc; i++)
    if (!set_option(&o, argv[i])) {
      fprintf(stderr, "op_dump: bad argument '%s'\n", argv[i]);
      return 2;
    }
  if (o.S == 0)
    o.S = o.T;
  if (o.KVH == 0)
    o.KVH = o.H;
  if (o.len == 0)
    o.len = o.C;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_PRECISION | REMAT_SET_NO_ENV,
                     .num_threads = o.threads,
                     .policy = o.policy,
                     .precision = o.precision};
  remat_runtime *rt = NULL;
  remat_graph *g = NULL;
  int ok = remat_runtime_create(&rc, &rt) == REMAT_OK &&
           remat_graph_create(rt, &g) == REMAT_OK &&
           remat_graph_seed(g, o.seed) == REMAT_OK &&
           (strcmp(o.op, "llama") == 0 ? run_llama(g, &o) : run_op(g, &o));
  const char *why = g != NULL && remat_graph_error(g)[0] ? remat_graph_error(g)
                                                         : remat_last_error();
  if (!ok && why[0] != '\0')
    fprintf(stderr, "op_dump: %s: %s\n", o.op, why);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  return ok ? 0 : 1;
}
