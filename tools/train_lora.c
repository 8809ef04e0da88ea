/* remat-train's LoRA fine-tuning and its Llama model: the options
 * (--lora-rank, --lora-alpha, --lora-targets, --train, --load-adapter,
 * --merge-lora, --model, --kv-heads, --ffn), the model that the options
 * build, and the adapter directory that --save writes in LoRA mode. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "remat_llama.h"
#include "tools/train.h"

static int lora_bad(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "remat-train: ");
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
  return EXIT_USAGE;
}

/* A whole number in [lo, hi] for `option`. */
static int whole(const char *option, const char *arg, long lo, long hi,
                 int *out) {
  char *end;
  errno = 0;
  long v = strtol(arg, &end, 10);
  if (errno != 0 || end == arg || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr,
            "remat-train: %s '%s': expected a whole number from %ld to "
            "%ld\n",
            option, arg, lo, hi);
    return EXIT_USAGE;
  }
  *out = (int)v;
  return 0;
}

int lora_option(int c, const char *arg, train_options *o) {
  char *end;
  switch (c) {
  case OPT_LORA_RANK:
    return whole("--lora-rank", arg, 1, 65536, &o->cfg.lora.rank);
  case OPT_LORA_ALPHA:
    errno = 0;
    o->cfg.lora.alpha = strtof(arg, &end);
    if (errno != 0 || end == arg || *end != '\0' ||
        !isfinite(o->cfg.lora.alpha) || o->cfg.lora.alpha <= 0.0f)
      return lora_bad("--lora-alpha '%s': expected a finite number > 0%s", arg,
                      "");
    return 0;
  case OPT_LORA_TARGETS:
    o->cfg.lora.targets = arg;
    return 0;
  case OPT_TRAIN:
    o->cfg.lora.trainable = arg;
    return 0;
  case OPT_LOAD_ADAPTER:
    o->load_adapter = arg;
    return 0;
  case OPT_MERGE_LORA:
    o->merge_path = arg;
    return 0;
  case OPT_MODEL:
    if (strcmp(arg, "gpt") != 0 && strcmp(arg, "llama") != 0)
      return lora_bad("--model '%s': expected gpt or llama%s", arg, "");
    o->llama = strcmp(arg, "llama") == 0;
    return 0;
  case OPT_KV_HEADS:
    return whole("--kv-heads", arg, 1, 1000000, &o->kv_heads);
  case OPT_FFN:
    return whole("--ffn", arg, 1, 1000000, &o->ffn);
  default:
    return -2;
  }
}

int lora_check(const train_options *o) {
  const char *why = NULL, *lora_only[] = {"lora-alpha", "lora-targets", "train",
                                          "load-adapter", "merge-lora"};
  for (size_t i = 0; i < sizeof lora_only / sizeof *lora_only && !why; i++)
    if (option_given(o, lora_only[i]) && o->cfg.lora.rank == 0) {
      fprintf(stderr, "remat-train: --%s needs --lora-rank R\n", lora_only[i]);
      return EXIT_USAGE;
    }
  if (!o->llama && (o->kv_heads > 0 || o->ffn > 0))
    why = "--kv-heads and --ffn need --model llama";
  else if (o->llama && o->kv_heads > 0 && o->cfg.heads % o->kv_heads != 0)
    why = "--kv-heads must divide --heads";
  else if (o->llama && (o->cfg.d_model / o->cfg.heads) % 2 != 0)
    why = "--model llama needs an even head size (--d-model / --heads) for "
          "RoPE";
  else if (o->cfg.lora.rank > 0 && o->prompt != NULL)
    why = "--lora-rank does not apply to --prompt: merge the adapters with "
          "--merge-lora and sample from the merged weights";
  if (why != NULL)
    fprintf(stderr, "remat-train: %s\n", why);
  return why != NULL ? EXIT_USAGE : 0;
}

remat_status lora_model_build(remat_graph *g, const train_options *o,
                              int batch, remat_gpt *m) {
  remat_gpt_config c = o->cfg;
  c.batch = batch;
  if (!o->llama)
    return remat_gpt_build(g, &c, m);
  remat_llama_config l = {.hidden_size = c.d_model,
                          .intermediate_size =
                              o->ffn > 0 ? o->ffn : 4 * c.d_model,
                          .num_hidden_layers = c.layers,
                          .num_attention_heads = c.heads,
                          .num_key_value_heads = o->kv_heads,
                          .vocab_size = c.vocab,
                          .tie_word_embeddings = 1,
                          .seq = c.seq,
                          .batch = batch,
                          .attention = c.attention,
                          .lora = c.lora};
  return remat_llama_build(g, &l, m);
}

/* ---- the adapter directory ---- */

static char state_path[4200], resume_state[4200], adapter_path[4200];

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int lora_prepare(train_options *o) {
  if (o->cfg.lora.rank == 0)
    return 0;
  if (o->save_path != NULL) {
    o->lora_dir = o->save_path;
    if (mkdir(o->lora_dir, 0777) != 0 && errno != EEXIST) {
      fprintf(stderr,
              "remat-train: --save '%s': cannot create the adapter "
              "directory: %s\n",
              o->lora_dir, strerror(errno));
      return EXIT_RUNTIME;
    }
    snprintf(state_path, sizeof state_path, "%s/" LORA_STATE_FILE, o->lora_dir);
    o->save_path = state_path;
  }
  if (o->resume_path != NULL && is_dir(o->resume_path)) {
    snprintf(resume_state, sizeof resume_state, "%s/" LORA_STATE_FILE,
             o->resume_path);
    o->resume_path = resume_state;
  }
  if (o->load_adapter != NULL && is_dir(o->load_adapter)) {
    snprintf(adapter_path, sizeof adapter_path, "%s/adapter_model.safetensors",
             o->load_adapter);
    o->load_adapter = adapter_path;
  }
  return 0;
}

remat_status lora_save_adapter(remat_graph *g, const train_options *o) {
  if (o->lora_dir == NULL)
    return REMAT_OK;
  char path[4200], config[4200];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", o->lora_dir);
  snprintf(config, sizeof config, "%s/adapter_config.json", o->lora_dir);
  return remat_lora_save(g, path, config);
}

remat_status lora_load_adapter(remat_graph *g, const train_options *o) {
  return o->load_adapter != NULL ? remat_lora_load(g, o->load_adapter)
                                 : REMAT_OK;
}

remat_status lora_merge(remat_graph *g, const train_options *o) {
  return o->merge_path != NULL ? remat_lora_save_merged(g, o->merge_path)
                               : REMAT_OK;
}
