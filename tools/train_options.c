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
"  --seq N          sequence length (default 16; 128 with --data)\n"
"  --batch N        sequences per step (default 64; 16 with --data)\n"
"  --steps N        training steps; 0 only evaluates (default 2000)\n"
"  --lr X           peak AdamW learning rate, warm-up then cosine decay\n"
"                   (default 0.003)\n"
"  --policy P       remat policy of every block, e.g. nothing_saveable,\n"
"                   dots_saveable, everything_saveable, auto\n"
"  --budget BYTES   budget for the step's peak memory, e.g. 64MiB; the\n"
"                   evaluation graph must fit it too (checked before the\n"
"                   first step)\n"
"  --threads N      worker threads (default: REMAT_NUM_THREADS or cores)\n"
"  --seed N         seed of the weights and of the data (default 1)\n"
"  --save FILE      write the trained weights (safetensors) after training,\n"
"                   before evaluation; FILE is replaced whole or not at all\n"
"  --load FILE      start from weights in FILE (safetensors)\n"
"  --trace FILE     write a Chrome trace (REMAT_TRACE) to FILE\n"
"  --json           one JSON object per step, and one at the end, on stdout\n"
"  --help           this text\n"
"\n"
"Exit status: 0 done, 1 failure while running (data, files, memory\n"
"budget, weights), 2 bad command line.\n");
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
       OPT_SAVE, OPT_LOAD, OPT_TRACE, OPT_JSON, OPT_HELP };

static const struct option longopts[] = {
    {"data", 1, 0, OPT_DATA},       {"layers", 1, 0, OPT_LAYERS},
    {"d-model", 1, 0, OPT_DMODEL},  {"heads", 1, 0, OPT_HEADS},
    {"seq", 1, 0, OPT_SEQ},         {"batch", 1, 0, OPT_BATCH},
    {"steps", 1, 0, OPT_STEPS},     {"lr", 1, 0, OPT_LR},
    {"policy", 1, 0, OPT_POLICY},   {"budget", 1, 0, OPT_BUDGET},
    {"threads", 1, 0, OPT_THREADS}, {"seed", 1, 0, OPT_SEED},
    {"save", 1, 0, OPT_SAVE},       {"load", 1, 0, OPT_LOAD},
    {"trace", 1, 0, OPT_TRACE},     {"json", 0, 0, OPT_JSON},
    {"help", 0, 0, OPT_HELP},       {0, 0, 0, 0}};

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
  case ':': return bad("%s needs a value%s", raw, "");
  default: return bad("unknown option '%s' (see --help)%s", raw, "");
  }
}

int options_parse(int argc, char **argv, train_options *o) {
  *o = (train_options){.cfg = {.layers = 2, .d_model = 128, .heads = 4,
                               .seq = 16, .batch = 64},
                       .steps = 2000, .lr = 3e-3f, .seed = 1};
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
  if (o->data_path == NULL && o->cfg.seq < ADD_LEN) {
    fprintf(stderr, "remat-train: --seq %d is shorter than an addition "
                    "problem (%d tokens)\n", o->cfg.seq, ADD_LEN);
    return EXIT_USAGE;
  }
  return 0;
}
