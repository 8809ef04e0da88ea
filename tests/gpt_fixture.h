/* Test fixture shared by the model-level tests: a tiny GPT on a runtime
 * with a chosen thread count and default policy, fed a fixed batch. */
#ifndef REMAT_TESTS_GPT_FIXTURE_H
#define REMAT_TESTS_GPT_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "remat.h"
#include "remat_gpt.h"

typedef struct fixture {
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  remat_gpt_config cfg;
  int32_t *tokens, *targets;
} fixture;

/* The fixed task: each target is a function of the token and its position,
 * so that a tiny model can learn it quickly. */
static inline void fixture_batch(const remat_gpt_config *c, int32_t *tokens,
                                 int32_t *targets, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 12345u;
  for (int b = 0; b < c->batch; b++)
    for (int t = 0; t < c->seq; t++) {
      x = x * 1664525u + 1013904223u;
      int i = b * c->seq + t;
      tokens[i] = (int32_t)((x >> 16) % (uint32_t)c->vocab);
      targets[i] = (int32_t)((tokens[i] * 3 + (t > 0 ? tokens[i - 1] : 0)) %
                             c->vocab);
    }
}

/* Builds and compiles on a runtime made from `rc`; returns the first
 * failing status. opt NULL computes gradients without updating. */
static inline remat_status fixture_open_config(fixture *f,
                                               const remat_gpt_config *c,
                                               const remat_config *rc,
                                               const remat_optimizer *opt) {
  memset(f, 0, sizeof *f);
  f->cfg = *c;
  remat_status s = remat_runtime_create(rc, &f->rt);
  if (s == REMAT_OK)
    s = remat_graph_create(f->rt, &f->g);
  if (s == REMAT_OK)
    s = remat_graph_seed(f->g, 7);
  if (s == REMAT_OK)
    s = remat_gpt_build(f->g, c, &f->m);
  if (s == REMAT_OK)
    s = remat_compile(f->g, f->m.loss, opt);
  if (s != REMAT_OK)
    return s;
  size_t n = (size_t)c->batch * (size_t)c->seq;
  f->tokens = malloc(n * sizeof *f->tokens);
  f->targets = malloc(n * sizeof *f->targets);
  if (f->tokens == NULL || f->targets == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  fixture_batch(c, f->tokens, f->targets, 1);
  s = remat_feed(f->g, f->m.tokens, f->tokens, n * sizeof *f->tokens);
  if (s == REMAT_OK)
    s = remat_feed(f->g, f->m.targets, f->targets, n * sizeof *f->targets);
  return s;
}

/* fixture_open_config with a thread count, a default policy and a budget
 * (0 means none), and no trace. */
static inline remat_status fixture_open(fixture *f, const remat_gpt_config *c,
                                        int threads, const char *policy,
                                        int64_t budget,
                                        const remat_optimizer *opt) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_MEMORY_BUDGET | REMAT_SET_TRACE,
                     .num_threads = threads,
                     .policy = policy,
                     .memory_budget = budget};
  return fixture_open_config(f, c, &rc, opt);
}

static inline void fixture_close(fixture *f) {
  remat_graph_destroy(f->g);
  remat_runtime_destroy(f->rt);
  free(f->tokens);
  free(f->targets);
  memset(f, 0, sizeof *f);
}

/* A copy of every parameter, in parameter order (NULL if a read fails);
 * *count gets the number of floats. */
static inline float *fixture_snapshot(remat_graph *g, size_t *count) {
  size_t total = 0;
  *count = 0;
  for (int i = 0; i < remat_num_params(g); i++)
    total += (size_t)remat_tensor_numel(remat_param_at(g, i));
  float *all = malloc((total ? total : 1) * sizeof *all), *at = all;
  for (int i = 0; all != NULL && i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    if (remat_read(g, p, at, n * sizeof *at) != REMAT_OK) {
      free(all);
      return NULL;
    }
    at += n;
  }
  *count = total;
  return all;
}

/* FNV-1a over every parameter gradient's bytes, in parameter order. */
static inline uint64_t fixture_grad_hash(fixture *f) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < remat_num_params(f->g); i++) {
    remat_tensor *p = remat_param_at(f->g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    float *grad = malloc(n * sizeof *grad);
    if (grad == NULL || remat_read_grad(f->g, p, grad, n * sizeof *grad)) {
      free(grad);
      return 0;
    }
    const unsigned char *bytes = (const unsigned char *)grad;
    for (size_t k = 0; k < n * sizeof *grad; k++)
      h = (h ^ bytes[k]) * 1099511628211ull;
    free(grad);
  }
  return h;
}

#endif
