/* hf_dump: builds the model of a Hugging Face directory (config.json and
 * its weights, read as remat-train --init reads them) for
 * tests/hf_check.py, runs one step on a batch and writes what it gives.
 *
 *   hf_dump DIR PREFIX B T TOKENS [KEY=VALUE ...]
 *
 * TOKENS holds int32 tokens then targets, [B,T] each. It writes
 * PREFIX.logits.f32 (raw little-endian f32 [B,T,V]) and
 * PREFIX.grads.safetensors (every gradient under the model's names) and
 * prints "loss VALUE". Before loading it writes the model's fresh weights to
 * PREFIX.before.safetensors; when the load fails it writes them again to
 * PREFIX.after.safetensors (so a test can see that a failed load changed
 * nothing), prints "hf_dump: MESSAGE" on stderr and exits 1.
 * Keys: precision (f32|bf16), policy (nothing_saveable), threads (2),
 * fused (0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remat.h"
#include "tools/hf_init.h"

static int read_file(const char *path, void *buf, size_t bytes) {
  FILE *f = fopen(path, "rb");
  size_t n = f != NULL ? fread(buf, 1, bytes, f) : 0;
  if (f != NULL)
    fclose(f);
  return n == bytes;
}

static int write_file(const char *path, const void *buf, size_t bytes) {
  FILE *f = fopen(path, "wb");
  size_t n = f != NULL ? fwrite(buf, 1, bytes, f) : 0;
  return f != NULL && fclose(f) == 0 && n == bytes;
}

/* Writes the weights to PREFIX.SUFFIX. */
static int save(remat_graph *g, const char *prefix, const char *suffix) {
  char path[4096];
  snprintf(path, sizeof path, "%s.%s", prefix, suffix);
  return remat_save_safetensors(g, path) == REMAT_OK;
}

/* One step on the batch; the logits and gradients written. */
static int dump(remat_graph *g, const remat_gpt *m, const char *prefix,
                int32_t *batch, size_t n, int vocab) {
  remat_step_stats st = {.size = sizeof st};
  size_t lbytes = n * (size_t)vocab * sizeof(float);
  float *logits = malloc(lbytes);
  char path[4096];
  snprintf(path, sizeof path, "%s.logits.f32", prefix);
  int ok =
      logits != NULL &&
      remat_feed(g, m->tokens, batch, n * sizeof(int32_t)) == REMAT_OK &&
      remat_feed(g, m->targets, batch + n, n * sizeof(int32_t)) == REMAT_OK &&
      remat_step(g, &st) == REMAT_OK &&
      remat_read(g, m->logits, logits, lbytes) == REMAT_OK &&
      write_file(path, logits, lbytes);
  free(logits);
  snprintf(path, sizeof path, "%s.grads.safetensors", prefix);
  ok = ok && remat_save_grads_safetensors(g, path) == REMAT_OK;
  if (ok)
    printf("loss %.9g\n", (double)st.loss);
  return ok;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: hf_dump DIR PREFIX B T TOKENS [KEY=VALUE ...]\n");
    return 2;
  }
  const char *dir = argv[1], *prefix = argv[2], *policy = "nothing_saveable";
  int B = atoi(argv[3]), T = atoi(argv[4]), threads = 2, fused = 0;
  remat_precision precision = REMAT_PRECISION_F32;
  for (int i = 6; i < argc; i++) {
    if (strncmp(argv[i], "policy=", 7) == 0)
      policy = argv[i] + 7;
    else if (strcmp(argv[i], "precision=bf16") == 0)
      precision = REMAT_PRECISION_BF16;
    else if (strncmp(argv[i], "threads=", 8) == 0)
      threads = atoi(argv[i] + 8);
    else if (strcmp(argv[i], "fused=1") == 0)
      fused = 1;
    else {
      fprintf(stderr, "hf_dump: bad argument '%s'\n", argv[i]);
      return 2;
    }
  }
  char err[512];
  hf_model hf;
  if (hf_read(dir, &hf, err, sizeof err) != 0) {
    fprintf(stderr, "hf_dump: %s\n", err);
    return 1;
  }
  size_t n = (size_t)B * (size_t)T;
  int32_t *batch = malloc(2 * n * sizeof(int32_t));
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_PRECISION | REMAT_SET_NO_ENV,
                     .num_threads = threads,
                     .policy = policy,
                     .precision = precision};
  remat_runtime *rt = NULL;
  remat_graph *g = NULL;
  remat_gpt m;
  int ok =
      batch != NULL && read_file(argv[5], batch, 2 * n * sizeof *batch) &&
      remat_runtime_create(&rc, &rt) == REMAT_OK &&
      remat_graph_create(rt, &g) == REMAT_OK &&
      hf_build(g, &hf, T, B,
               fused ? REMAT_ATTENTION_FUSED : REMAT_ATTENTION_MATERIALIZED,
               &(remat_lora_config){0}, &m) == REMAT_OK &&
      remat_keep(g, m.logits) == REMAT_OK &&
      remat_compile(g, m.loss, NULL) == REMAT_OK &&
      save(g, prefix, "before.safetensors");
  int loaded = ok && hf_load(g, &hf) == REMAT_OK;
  char why[1024]; /* before the save below can change the last error */
  snprintf(why, sizeof why, "%s",
           g != NULL && remat_graph_error(g)[0] ? remat_graph_error(g)
                                                : remat_last_error());
  if (ok && !loaded)
    save(g, prefix, "after.safetensors");
  ok = loaded && dump(g, &m, prefix, batch, n, hf.vocab);
  if (!ok)
    fprintf(stderr, "hf_dump: %s\n", loaded ? remat_last_error() : why);
  free(batch);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  return ok ? 0 : 1;
}
