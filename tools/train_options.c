/* Command-line options of remat-train: defaults, --help, and a one-line
 * message for every bad value. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/train.h"

static void usage(FILE *f) {
  fprintf(f,
"usage: remat-train [options]\n"
"Trains a GPT-style model with remat. With no --data it learns three-digit\n"
"addition (\"123+456=0579\") generated on the fly and reports exact-match\n"
"accuracy on held-out problems; with --data FILE it is a byte-level\n"
"language model of FILE.\n"
"\n"
"  --data FILE      train on the bytes of a text file: a regular file of\n"
"                   at most 1 GiB, or - for standard input (same limit)\n"
"  --layers N       transformer blocks (default 2)\n"
"  --d-model N      model width (default 128)\n"
"  --heads N        attention heads; must divide --d-model (default 4)\n"
"  --attention A    fused (no T x T matrix stored; the scores recomputed in\n"
"                   backward) or materialized (attn_scores and attn_probs,\n"
"                   which name-based policies may name) (default\n"
"                   materialized)\n"
"  --seq N          sequence length (default 16; 128 with --data)\n"
"  --batch N        sequences per step (default 64; 16 with --data)\n"
"  --steps N        training steps; 0 only evaluates (default 2000)\n"
"  --lr X           peak learning rate (default 0.003)\n"
"  --schedule S     cosine, linear or constant: the learning rate after the\n"
"                   warm-up, from --lr down to --lr-min (default cosine)\n"
"  --warmup N       steps of linear warm-up (default a tenth of --steps, at\n"
"                   most 100; 0 with --schedule constant)\n"
"  --lr-min X       learning rate at the end of the decay (default --lr/10)\n"
"  --optimizer O    adamw or sgd (default adamw)\n"
"  --wd X           AdamW's weight decay of matrices (default 0.01)\n"
"  --policy P       remat policy of every block, e.g. nothing_saveable,\n"
"                   dots_saveable, everything_saveable, auto\n"
"  --budget BYTES   budget for the step's peak memory, e.g. 64MiB; the\n"
"                   evaluation graph must fit it too (checked before the\n"
"                   first step)\n"
"  --threads N      worker threads (default: REMAT_NUM_THREADS or cores)\n"
"  --seed N         seed of the weights and of the data (default 1)\n"
"  --save FILE      write a checkpoint (safetensors: the weights, the\n"
"                   optimizer state, the step and the data position) after\n"
"                   training, before evaluation, and on SIGINT or SIGTERM;\n"
"                   FILE is replaced whole or not at all\n"
"  --save-every N   also write the --save checkpoint every N steps\n"
"  --load FILE      start from the weights in FILE (safetensors or a\n"
"                   checkpoint), with a fresh optimizer\n"
"  --resume FILE    continue the training saved in checkpoint FILE up to\n"
"                   --steps (the total), with the same options\n"
"  --trace FILE     write a Chrome trace (REMAT_TRACE) to FILE\n"
"  --json           one JSON object per step, and one at the end, on stdout\n"
"  --help           this text\n"
"\n"
"Exit status: 0 done, 1 failure while running (data, files, memory\n"
"budget, weights), 2 bad command line, 130 stopped by SIGINT or SIGTERM\n"
"(after writing the --save checkpoint; a second signal stops at once).\n");
}

static int bad(const char *fmt, const char *opt, const char *value) {
  fprintf(stderr, "remat-train: ");
  fprintf(stderr, fmt, opt, value);
  fputc('\n', stderr);
  return EXIT_USAGE;
}

static int parse_int(const char *opt, const char *v, int min, int *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || errno != 0 || x < min || x > 1000000) {
    char fmt[96];
    snprintf(fmt, sizeof fmt,
             "%%s '%%s': expected a whole number from %d to 1000000", min);
    return bad(fmt, opt, v);
  }
  *out = (int)x;
  return 0;
}

static int parse_float(const char *opt, const char *v, float *out) {
  char *end;
  float x = strtof(v, &end);
  if (*v == '\0' || *end != '\0' || !isfinite(x) || x <= 0.0f)
    return bad("%s '%s': expected a number > 0", opt, v);
  *out = x;
  return 0;
}

static int parse_nonneg(const char *opt, const char *v, float *out) {
  char *end;
  float x = strtof(v, &end);
  if (*v == '\0' || *end != '\0' || !isfinite(x) || x < 0.0f)
    return bad("%s '%s': expected a number >= 0", opt, v);
  *out = x;
  return 0;
}

/* The index of `v` in the NULL-terminated `names`. */
static int parse_name(const char *opt, const char *v, const char *const *names,
                      const char *accepted, int *out) {
  for (int i = 0; names[i] != NULL; i++)
    if (strcmp(v, names[i]) == 0) {
      *out = i;
      return 0;
    }
  char fmt[128];
  snprintf(fmt, sizeof fmt, "%%s '%%s': expected %s", accepted);
  return bad(fmt, opt, v);
}

static int parse_seed(const char *v, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (*v == '\0' || *v == '-' || *end != '\0' || errno != 0)
    return bad("%s '%s': expected a whole number >= 0", "--seed", v);
  *out = x;
  return 0;
}

static int parse_policy(const char *v) {
  remat_policy *p = NULL;
  if (remat_policy_parse(v, &p) != REMAT_OK)
    return bad("--policy: %s%s", remat_last_error(), "");
  remat_policy_destroy(p);
  return 0;
}

static int parse_budget(const char *v, int64_t *out) {
  if (remat_parse_bytes(v, out) != REMAT_OK || *out <= 0)
    return bad("%s '%s': expected a size such as 64MiB or 1.5GB", "--budget",
               v);
  return 0;
}

enum { OPT_DATA = 256, OPT_LAYERS, OPT_DMODEL, OPT_HEADS, OPT_SEQ, OPT_BATCH,
       OPT_STEPS, OPT_LR, OPT_POLICY, OPT_BUDGET, OPT_THREADS, OPT_SEED,
       OPT_SAVE, OPT_LOAD, OPT_TRACE, OPT_JSON, OPT_HELP,
       OPT_SCHEDULE, OPT_WARMUP, OPT_LR_MIN, OPT_OPTIMIZER, OPT_WD,
       OPT_RESUME, OPT_SAVE_EVERY, OPT_ATTENTION };

static const struct option longopts[] = {
    {"data", 1, 0, OPT_DATA},       {"layers", 1, 0, OPT_LAYERS},
    {"d-model", 1, 0, OPT_DMODEL},  {"heads", 1, 0, OPT_HEADS},
    {"seq", 1, 0, OPT_SEQ},         {"batch", 1, 0, OPT_BATCH},
    {"steps", 1, 0, OPT_STEPS},     {"lr", 1, 0, OPT_LR},
    {"policy", 1, 0, OPT_POLICY},   {"budget", 1, 0, OPT_BUDGET},
    {"threads", 1, 0, OPT_THREADS}, {"seed", 1, 0, OPT_SEED},
    {"save", 1, 0, OPT_SAVE},       {"load", 1, 0, OPT_LOAD},
    {"trace", 1, 0, OPT_TRACE},     {"json", 0, 0, OPT_JSON},
    {"help", 0, 0, OPT_HELP},
    {"schedule", 1, 0, OPT_SCHEDULE},   {"warmup", 1, 0, OPT_WARMUP},
    {"lr-min", 1, 0, OPT_LR_MIN},       {"optimizer", 1, 0, OPT_OPTIMIZER},
    {"wd", 1, 0, OPT_WD},               {"resume", 1, 0, OPT_RESUME},
    {"save-every", 1, 0, OPT_SAVE_EVERY},
    {"attention", 1, 0, OPT_ATTENTION},
    {0, 0, 0, 0}};

static int apply_training(int c, const char *arg, const char *raw,
                          train_options *o);

/* One option; returns 0, -1 for --help, or EXIT_USAGE. */
static int apply(int c, const char *arg, const char *raw, train_options *o,
                 int *seq_set, int *batch_set) {
  switch (c) {
  case OPT_DATA: o->data_path = arg; return 0;
  case OPT_LAYERS: return parse_int("--layers", arg, 1, &o->cfg.layers);
  case OPT_DMODEL: return parse_int("--d-model", arg, 1, &o->cfg.d_model);
  case OPT_HEADS: return parse_int("--heads", arg, 1, &o->cfg.heads);
  case OPT_SEQ: *seq_set = 1; return parse_int("--seq", arg, 1, &o->cfg.seq);
  case OPT_BATCH:
    *batch_set = 1;
    return parse_int("--batch", arg, 1, &o->cfg.batch);
  case OPT_STEPS: return parse_int("--steps", arg, 0, &o->steps);
  case OPT_LR: return parse_float("--lr", arg, &o->lr);
  case OPT_POLICY: o->policy = arg; return parse_policy(arg);
  case OPT_BUDGET: return parse_budget(arg, &o->budget);
  case OPT_THREADS: return parse_int("--threads", arg, 1, &o->threads);
  case OPT_SEED: return parse_seed(arg, &o->seed);
  case OPT_SAVE: o->save_path = arg; return 0;
  case OPT_LOAD: o->load_path = arg; return 0;
  case OPT_TRACE: o->trace_path = arg; return 0;
  case OPT_JSON: o->json = 1; return 0;
  case OPT_HELP: usage(stdout); return -1;
  default: return apply_training(c, arg, raw, o);
  }
}

/* The options of the optimizer, the schedule and the checkpoints. */
static int apply_training(int c, const char *arg, const char *raw,
                          train_options *o) {
  static const char *const schedules[] = {"cosine", "linear", "constant",
                                          NULL};
  static const char *const optimizers[] = {"sgd", "adamw", NULL};
  /* in the order of remat_attention_kind */
  static const char *const attentions[] = {"default", "fused",
                                           "materialized", NULL};
  int kind = 0, r;
  switch (c) {
  case OPT_SCHEDULE:
    r = parse_name("--schedule", arg, schedules, "cosine, linear or constant",
                   &kind);
    o->schedule = (train_schedule)kind;
    return r;
  case OPT_WARMUP: return parse_int("--warmup", arg, 0, &o->warmup);
  case OPT_LR_MIN: return parse_nonneg("--lr-min", arg, &o->lr_min);
  case OPT_OPTIMIZER:
    r = parse_name("--optimizer", arg, optimizers, "adamw or sgd", &kind);
    o->optimizer = (remat_optimizer_kind)kind;
    return r;
  case OPT_WD: return parse_nonneg("--wd", arg, &o->wd);
  case OPT_RESUME: o->resume_path = arg; return 0;
  case OPT_SAVE_EVERY: return parse_int("--save-every", arg, 1, &o->save_every);
  case OPT_ATTENTION:
    r = parse_name("--attention", arg, attentions + 1, "fused or materialized",
                   &kind);
    o->cfg.attention = (remat_attention_kind)(kind + 1);
    return r;
  case ':': return bad("%s needs a value%s", raw, "");
  default: return bad("unknown option '%s' (see --help)%s", raw, "");
  }
}

/* Options that only make sense together. */
static int check_training(const train_options *o) {
  const char *why = NULL;
  if (o->load_path != NULL && o->resume_path != NULL)
    why = "--load and --resume exclude each other: --resume restores the "
          "weights too";
  else if (o->save_every > 0 && o->save_path == NULL)
    why = "--save-every needs --save FILE";
  else if (o->lr_min > o->lr)
    why = "--lr-min is above --lr";
  if (why != NULL)
    fprintf(stderr, "remat-train: %s\n", why);
  return why != NULL;
}

int options_parse(int argc, char **argv, train_options *o) {
  *o = (train_options){.cfg = {.layers = 2, .d_model = 128, .heads = 4,
                               .seq = 16, .batch = 64},
                       .steps = 2000, .lr = 3e-3f, .seed = 1,
                       .optimizer = REMAT_OPT_ADAMW, .warmup = -1,
                       .lr_min = -1.0f, .wd = 0.01f};
  int seq_set = 0, batch_set = 0, c;
  opterr = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
    const char *raw = argv[optind - 1];
    int r = apply(c, optarg, raw, o, &seq_set, &batch_set);
    if (r != 0)
      return r;
  }
  if (optind < argc)
    return bad("unexpected argument '%s' (see --help)%s", argv[optind], "");
  if (o->data_path != NULL && !seq_set)
    o->cfg.seq = 128;
  if (o->data_path != NULL && !batch_set)
    o->cfg.batch = 16;
  if (o->cfg.d_model % o->cfg.heads != 0) {
    fprintf(stderr, "remat-train: --d-model %d is not divisible by --heads %d\n",
            o->cfg.d_model, o->cfg.heads);
    return EXIT_USAGE;
  }
  if (check_training(o) != 0)
    return EXIT_USAGE;
  if (o->data_path == NULL && o->cfg.seq < ADD_LEN) {
    fprintf(stderr, "remat-train: --seq %d is shorter than an addition "
                    "problem (%d tokens)\n", o->cfg.seq, ADD_LEN);
    return EXIT_USAGE;
  }
  return 0;
}
