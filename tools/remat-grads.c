/* remat-grads: writes the weights of a freshly initialized GPT, the
 * gradients of one batch and the batch itself, so that another framework
 * (benchmarks/compare_torch.py --check) can recompute the loss and the
 * gradients from the same weights and data and compare them. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "remat.h"
#include "remat_gpt.h"

typedef struct grad_options {
  remat_gpt_config cfg;
  int threads;
  unsigned long long seed;
  const char *policy, *prefix;
  remat_precision precision;
} grad_options;

static void usage(FILE *f) {
  fprintf(f, "usage: remat-grads [--layers L --d-model D --heads H "
             "--seq T --batch B --vocab V --threads N --seed S "
             "--policy P --attention fused|materialized "
             "--precision f32|bf16] OUT_PREFIX\n"
             "Writes OUT_PREFIX.weights.safetensors, .grads.safetensors and "
             ".batch.i32: a fresh GPT's weights, the gradients of one batch, "
             "and the batch.\n"
             "  --help     this text\n"
             "  --version  remat-grads' version (the library's)\n");
}

/* 1: run; 0: bad command line; -1: --help or --version, done. */
static int parse(int argc, char **argv, grad_options *o) {
  static const struct option longopts[] = {
      {"layers", 1, 0, 'L'}, {"d-model", 1, 0, 'D'}, {"heads", 1, 0, 'H'},
      {"seq", 1, 0, 'T'},    {"batch", 1, 0, 'B'},   {"vocab", 1, 0, 'V'},
      {"threads", 1, 0, 'N'}, {"seed", 1, 0, 'S'},   {"policy", 1, 0, 'P'},
      {"attention", 1, 0, 'A'}, {"precision", 1, 0, 'R'},
      {"help", 0, 0, 'h'},   {"version", 0, 0, 'v'}, {0, 0, 0, 0}};
  *o = (grad_options){.cfg = {.layers = 2, .d_model = 32, .heads = 4,
                              .seq = 16, .batch = 4, .vocab = 29},
                      .threads = 2, .seed = 3, .policy = "nothing_saveable"};
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    int *field = c == 'L' ? &o->cfg.layers : c == 'D' ? &o->cfg.d_model
               : c == 'H' ? &o->cfg.heads : c == 'T' ? &o->cfg.seq
               : c == 'B' ? &o->cfg.batch : c == 'V' ? &o->cfg.vocab
               : c == 'N' ? &o->threads : NULL;
    if (field != NULL && (*field = atoi(optarg)) > 0)
      continue;
    if (c == 'h' || c == 'v') {
      if (c == 'h')
        usage(stdout);
      else
        printf("remat-grads %s\n", remat_version());
      return -1;
    }
    if (c == 'S') {
      o->seed = strtoull(optarg, NULL, 10);
      continue;
    }
    if (c == 'P') {
      o->policy = optarg;
      continue;
    }
    if (c == 'A' && (strcmp(optarg, "fused") == 0 ||
                     strcmp(optarg, "materialized") == 0)) {
      o->cfg.attention = optarg[0] == 'f' ? REMAT_ATTENTION_FUSED
                                          : REMAT_ATTENTION_MATERIALIZED;
      continue;
    }
    if (c == 'R' && (strcmp(optarg, "f32") == 0 ||
                     strcmp(optarg, "bf16") == 0)) {
      o->precision = optarg[0] == 'b' ? REMAT_PRECISION_BF16
                                      : REMAT_PRECISION_F32;
      continue;
    }
    fprintf(stderr, "remat-grads: bad option '%s'\n",
            remat__quote(&(remat__quoted){0}, argv[optind - 1]));
    return 0;
  }
  if (optind + 1 != argc) {
    usage(stderr);
    return 0;
  }
  o->prefix = argv[optind];
  return 1;
}

/* Tokens and targets from a fixed generator; targets depend on the tokens
 * so that the gradients are not noise. */
static void fill_batch(const grad_options *o, int32_t *tok, int32_t *tgt) {
  uint32_t x = (uint32_t)o->seed * 2654435761u + 17u;
  int n = o->cfg.batch * o->cfg.seq;
  for (int i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    tok[i] = (int32_t)((x >> 16) % (uint32_t)o->cfg.vocab);
  }
  for (int i = 0; i < n; i++)
    tgt[i] = (tok[i] * 5 + (i % o->cfg.seq)) % o->cfg.vocab;
}

static int write_batch(const char *path, const int32_t *tok,
                       const int32_t *tgt, size_t n) {
  FILE *f = fopen(path, "wb");
  int ok = f != NULL && fwrite(tok, 4, n, f) == n && fwrite(tgt, 4, n, f) == n;
  if (f != NULL && fclose(f) != 0)
    ok = 0;
  if (!ok)
    fprintf(stderr, "remat-grads: cannot write '%s': %s\n",
            remat__quote(&(remat__quoted){0}, path),
            strerror(errno));
  return ok;
}

int main(int argc, char **argv) {
  grad_options o;
  int parsed = parse(argc, argv, &o);
  if (parsed <= 0)
    return parsed < 0 ? 0 : 2;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_PRECISION,
                     .num_threads = o.threads, .policy = o.policy,
                     .precision = o.precision};
  remat_runtime *rt = NULL;
  remat_graph *g = NULL;
  remat_gpt m;
  remat_step_stats st = {.size = sizeof st};
  size_t n = (size_t)o.cfg.batch * (size_t)o.cfg.seq;
  int32_t *tok = malloc(n * 4), *tgt = malloc(n * 4);
  char path[4096];
  int status = 1;
  if (tok == NULL || tgt == NULL)
    goto done;
  fill_batch(&o, tok, tgt);
  if (remat_runtime_create(&rc, &rt) || remat_graph_create(rt, &g) ||
      remat_graph_seed(g, o.seed) || remat_gpt_build(g, &o.cfg, &m) ||
      remat_compile(g, m.loss, NULL) || remat_feed(g, m.tokens, tok, n * 4) ||
      remat_feed(g, m.targets, tgt, n * 4) || remat_step(g, &st)) {
    fprintf(stderr, "remat-grads: %s\n", remat_last_error());
    goto done;
  }
  snprintf(path, sizeof path, "%s.weights.safetensors", o.prefix);
  if (remat_save_safetensors(g, path) != REMAT_OK) {
    fprintf(stderr, "remat-grads: %s\n", remat_last_error());
    goto done;
  }
  snprintf(path, sizeof path, "%s.grads.safetensors", o.prefix);
  if (remat_save_grads_safetensors(g, path) != REMAT_OK) {
    fprintf(stderr, "remat-grads: %s\n", remat_last_error());
    goto done;
  }
  snprintf(path, sizeof path, "%s.batch.i32", o.prefix);
  if (!write_batch(path, tok, tgt, n))
    goto done;
  printf("{\"loss\": %.9g}\n", st.loss);
  status = 0;
done:
  free(tok);
  free(tgt);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  return status;
}
