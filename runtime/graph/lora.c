/* LoRA adapters on a linear: the base linear plus (alpha / rank) * B(A x)
 * from the public op builders, with A and B new parameters recorded on the
 * graph so that the adapter files (io/lora_io.c) find them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "remat_lora.h"
#include "runtime/graph/lora.h"
#include "runtime/internal.h"

#define LORA_A_SUFFIX ".lora_A.weight"
/* The longest module name: its PEFT tensor names fit the files' names. */
#define LORA_MODULE_MAX 40

static bool adapted(const remat_graph *g, const char *module) {
  for (int32_t i = 0; i < g->nlora; i++)
    if (strcmp(g->lora[i].module, module) == 0)
      return true;
  return false;
}

/* The checks of remat_lora_linear, on the graph's sticky error. */
static bool lora_args_ok(remat_graph *g, const remat_tensor *w,
                         const char *module, int rank, float alpha) {
  const char *what = "remat_lora_linear";
  if (module == NULL || module[0] == '\0') {
    graph_fail(g, REMAT_ERR_INVALID_ARG, "%s: module name is NULL or empty",
               what);
    return false;
  }
  if (strlen(module) > LORA_MODULE_MAX) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: module name '%.64s...' is too long: at most %d "
               "characters",
               what, module, LORA_MODULE_MAX);
    return false;
  }
  if (!graph_tensor_ok(g, w, what))
    return false;
  if (w->kind != TENSOR_PARAM || w->shape.ndim != 2) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: '%s': the weight '%s' must be a parameter of shape "
               "[out,in]",
               what, module, w->name);
    return false;
  }
  int64_t out = w->shape.dim[0], in = w->shape.dim[1];
  int64_t most = out < in ? out : in;
  if (rank < 1 || rank > most) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: rank %d for '%s' [%lld,%lld]: expected 1 to %lld (the "
               "smaller of its out and in widths)",
               what, rank, module, (long long)out, (long long)in,
               (long long)most);
    return false;
  }
  if (!isfinite(alpha) || alpha < 0.0f) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: alpha %g for '%s': expected a finite value >= 0 (0 for "
               "the rank)",
               what, (double)alpha, module);
    return false;
  }
  if (adapted(g, module)) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: module '%s' already has an adapter", what, module);
    return false;
  }
  return true;
}

static bool record(remat_graph *g, const graph_lora *a) {
  if (g->nlora == g->cap_lora) {
    int32_t cap = g->cap_lora ? 2 * g->cap_lora : 16;
    graph_lora *p = remat__realloc(g->lora, (size_t)cap * sizeof *p);
    if (p == NULL) {
      graph_fail(g, REMAT_ERR_OUT_OF_MEMORY,
                 "remat_lora_linear: out of memory");
      return false;
    }
    g->lora = p;
    g->cap_lora = cap;
  }
  g->lora[g->nlora++] = *a;
  return true;
}

/* The name of x . A^T: the module's last component + "_lora". */
static void down_name(char *buf, size_t len, const char *module) {
  const char *dot = strrchr(module, '.');
  snprintf(buf, len, "%s_lora", dot != NULL ? dot + 1 : module);
}

remat_tensor *graph_lora_linear(remat_graph *g, const remat_tensor *x,
                                remat_tensor *w, remat_tensor *b,
                                const char *module, int rank, float alpha,
                                bool conv1d) {
  if (g == NULL || g->status != REMAT_OK ||
      !lora_args_ok(g, w, module, rank, alpha))
    return NULL;
  float a = alpha > 0.0f ? alpha : (float)rank;
  char name[REMAT__NAME_MAX];
  int64_t da[2] = {rank, w->shape.dim[1]}, db[2] = {w->shape.dim[0], rank};
  snprintf(name, sizeof name, "%s" LORA_A_SUFFIX, module);
  remat_tensor *pa =
      remat_param(g, name, 2, da, REMAT_INIT_NORMAL, 1.0f / (float)rank);
  snprintf(name, sizeof name, "%s.lora_B.weight", module);
  remat_tensor *pb = remat_param(g, name, 2, db, REMAT_INIT_ZEROS, 0.0f);
  remat_tensor *base = remat_linear(g, x, w, b);
  remat_tensor *down = remat_linear(g, x, pa, NULL);
  down_name(name, sizeof name, module);
  if (down != NULL)
    remat_checkpoint_name(g, down, name);
  remat_tensor *up = remat_linear(g, down, pb, NULL);
  remat_tensor *y = remat_add(g, base, remat_scale(g, up, a / (float)rank));
  if (y == NULL)
    return NULL;
  graph_lora rec = {.w = w->id,
                    .a = pa->id,
                    .b = pb->id,
                    .rank = rank,
                    .alpha = a,
                    .conv1d = conv1d};
  snprintf(rec.module, sizeof rec.module, "%s", module);
  return record(g, &rec) ? y : NULL;
}

remat_tensor *remat_lora_linear(remat_graph *g, const remat_tensor *x,
                                remat_tensor *w, remat_tensor *b,
                                const char *module, int rank, float alpha) {
  remat_tensor *y = graph_lora_linear(g, x, w, b, module, rank, alpha, false);
  if (y != NULL && remat_param_freeze(g, w) == REMAT_OK && b != NULL)
    remat_param_freeze(g, b);
  return g != NULL && g->status == REMAT_OK ? y : NULL;
}
