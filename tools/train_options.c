/* Command-line options of remat-train: defaults, --help, and a one-line
 * message for every bad value. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tools/train.h"

/* The options of --init, a pre-trained model. */
static void usage_init(FILE *f) {
  fprintf(f,
"\n"
"Fine-tuning a pre-trained model (no tokenizer: token files are the\n"
"interface):\n"
"  --init DIR       start from the model of DIR, as Hugging Face writes it:\n"
"                   config.json (model_type llama or gpt2) and\n"
"                   model.safetensors or model.safetensors.index.json with\n"
"                   its shards (F32, BF16 or F16); --data is then a token\n"
"                   file (--data-format u16 or u32, every id below the\n"
"                   config's vocab_size) and --prompt token ids separated\n"
"                   by spaces or commas; the model's options (--layers,\n"
"                   --d-model, --heads, --vocab) come from config.json\n"
"  --save-dtype D   f32 or bf16: with --init, --save writes the weights\n"
"                   alone (under the model's names: a Llama's are Hugging\n"
"                   Face's) in F32 or BF16 (default f32)\n");
}

static void usage(FILE *f) {
  fprintf(f,
"usage: remat-train [options]\n"
"Trains a GPT-style model with remat. With no --data it learns three-digit\n"
"addition (\"123+456=0579\") generated on the fly and reports exact-match\n"
"accuracy on held-out problems; with --data FILE it is a byte-level\n"
"language model of FILE.\n"
"\n"
"  --data FILE      train on the bytes of a text file: a regular file of\n"
"                   at most 1 GiB, or - for standard input (same limit);\n"
"                   its last tenth is held out for evaluation\n"
"  --data-format F  bytes (a text file, default), u16: a token file of\n"
"                   little-endian uint16 ids, flat (nanoGPT) or after\n"
"                   llm.c's 1 KiB header, or u32: little-endian uint32 ids\n"
"                   (for vocabularies over 65536)\n"
"  --vocab N        vocabulary of a token file, at most 65536 for u16 and\n"
"                   16777216 for u32 (default: its largest id + 1); every\n"
"                   id must be below it\n"
"  --layers N       transformer blocks (default 2)\n"
"  --d-model N      model width (default 128)\n"
"  --heads N        attention heads; must divide --d-model (default 4)\n"
"  --attention A    fused (no T x T matrix stored; the scores recomputed in\n"
"                   backward) or materialized (attn_scores and attn_probs,\n"
"                   which name-based policies may name) (default\n"
"                   materialized)\n"
"  --precision P    f32 or bf16: bf16 stores activations in bf16 and runs\n"
"                   matmuls on bf16 operands (weights, their gradients and\n"
"                   the optimizer stay f32; checkpoints are f32 either way)\n"
"                   (default: REMAT_PRECISION or f32)\n"
"  --seq N          sequence length (default 16; 128 with --data)\n"
"  --batch N        sequences per step (default 64; 16 with --data)\n"
"  --steps N        training steps; 0 only evaluates (default 2000; with\n"
"                   --resume, the checkpoint's schedule's end)\n"
"  --schedule-steps N  the step at which the schedule ends, if not --steps:\n"
"                   a run of --steps 150 --schedule-steps 300 --save FILE\n"
"                   then --resume FILE --steps 300 is the 300-step run\n"
"  --lr X           peak learning rate (default 0.001 for the addition\n"
"                   task, 0.003 with --data or --init)\n"
"  --schedule S     cosine, linear or constant: the learning rate after the\n"
"                   warm-up, from --lr down to --lr-min (default cosine)\n"
"  --warmup N       steps of linear warm-up (default a tenth of --steps, at\n"
"                   most 100; 0 with --schedule constant)\n"
"  --lr-min X       learning rate at the end of the decay (default --lr/10)\n"
"  --optimizer O    adamw or sgd (default adamw)\n"
"  --wd X           AdamW's weight decay of matrices (default 0.01)\n"
"  --accum K        gradient accumulation: each step sums the gradients of K\n"
"                   micro-batches of --batch sequences, then updates once\n"
"                   (as a batch of K x --batch, with one micro-batch's\n"
"                   activation memory; default 1)\n"
"  --clip X         clip the gradient to global L2 norm X (default: off)\n"
"  --policy P       remat policy of every block, e.g. nothing_saveable,\n"
"                   dots_saveable, everything_saveable, auto (which needs\n"
"                   --budget)\n"
"  --budget BYTES   budget for the step's peak memory, e.g. 64MiB: each\n"
"                   block gets the policy that fits it with the least\n"
"                   recompute (--policy auto; another --policy is refused\n"
"                   with --budget); the evaluation graph must fit it too\n"
"                   (checked before the first step)\n"
"  --threads N      worker threads, 1 to 1024 (default: REMAT_NUM_THREADS\n"
"                   or cores)\n"
"  --seed N         seed of the weights, the data and the draws of\n"
"                   --prompt (default 1)\n"
"  --save FILE      write a checkpoint (safetensors: the weights, the\n"
"                   optimizer state, the step and the data position) after\n"
"                   training, before evaluation, and on SIGINT or SIGTERM;\n"
"                   FILE is replaced whole or not at all; checked before\n"
"                   the first step (a regular file or a new name in a\n"
"                   writable folder)\n"
"  --save-every N   also write the --save checkpoint every N steps\n"
"  --load FILE      start from the weights in FILE (safetensors or a\n"
"                   checkpoint), with a fresh optimizer; a checkpoint\n"
"                   gives the model's options (--layers, --d-model,\n"
"                   --heads, --seq, --attention, --precision, the data\n"
"                   format and vocabulary)\n"
"  --resume FILE    continue the training saved in checkpoint FILE up to\n"
"                   --steps (the total); the model, --batch, --accum and\n"
"                   the schedule come from FILE (an option that disagrees\n"
"                   about the model is an error); a schedule changed by\n"
"                   --steps, --schedule, --warmup, --lr or --lr-min goes on\n"
"                   from the current rate, as stderr says\n"
"  --strict-resume  refuse, instead, a --resume that changes the schedule\n"
"  --trace FILE     write a Chrome trace of the first training steps to\n"
"                   FILE (Perfetto): tasks by layer and tensor, live bytes\n"
"                   by category\n"
"  --trace-steps N  steps --trace records, each micro-batch of --accum\n"
"                   counting as one (default 1)\n"
"  --eval-every N   held-out loss (and accuracy) every N steps, in the\n"
"                   progress line and the JSON; the summary names the best\n"
"  --json           one JSON object per step, one per evaluation\n"
"                   ({\"eval_step\": ...}) and one at the end, on stdout\n"
"  --prompt TEXT    sample instead of training: continue TEXT with the\n"
"                   weights of --load (a checkpoint knows its model; a\n"
"                   weights file needs the options it was trained with)\n"
"                   on stdout; TEXT is bytes, token ids separated by\n"
"                   spaces or commas (u16), or digits, + and = (addition)\n"
"  --tokens N       tokens to generate (default 100)\n"
"  --temperature T  0: the most likely token; else drawn from\n"
"                   softmax(logits / T) (default 1)\n"
"  --top-k K        draw among the K most likely tokens (default all)\n"
"  --model M        gpt (default) or llama: RMSNorm, RoPE, grouped-query\n"
"                   attention, SwiGLU, tied head, Hugging Face's names\n"
"  --kv-heads N     llama: key/value heads, dividing --heads (default\n"
"                   --heads)\n"
"  --ffn N          llama: the feed-forward's width (default 4 x --d-model)\n"
"  --lora-rank R    fine-tune with LoRA adapters of rank R: every other\n"
"                   parameter is frozen; --save DIR then writes PEFT's\n"
"                   adapter (DIR/adapter_model.safetensors and\n"
"                   DIR/adapter_config.json) and the training state\n"
"                   (DIR/training_state.safetensors: adapters and AdamW\n"
"                   moments, which --resume DIR takes); --load gives the\n"
"                   base weights, also with --resume\n"
"  --lora-alpha A   the adapters' scale is A / R (default R)\n"
"  --lora-targets L comma-separated modules: llama q_proj, k_proj, v_proj,\n"
"                   o_proj, gate_proj, up_proj, down_proj (default\n"
"                   q_proj,v_proj); gpt c_attn, attn.c_proj, c_fc,\n"
"                   mlp.c_proj, c_proj (default c_attn)\n"
"  --train NAMES    comma-separated parameters that stay trainable\n"
"  --load-adapter F PEFT adapter file (or its directory) to start from\n"
"  --merge-lora OUT after training, write the base weights with the\n"
"                   adapters folded in to OUT (safetensors, F32)\n"
"  --help           this text\n"
"  --version        remat-train's version (the library's)\n"
"\n"
"Exit status: 0 done, 1 failure while running (data, files, memory\n"
"budget, weights), 2 bad command line, 130 stopped by SIGINT or SIGTERM\n"
"after a whole step with its --save checkpoint written, 3 stopped without\n"
"it (a second signal during a step stops at once; one during a save waits\n"
"for the file to be whole).\n");
}

/* The one-line message of a bad option: `fmt` with the option and its
 * value, both quoted as the library quotes (base/error.h: control bytes
 * escaped, at most 100 bytes), so the words after them stay whole. */
static int bad(const char *fmt, const char *opt, const char *value) {
  fprintf(stderr, "remat-train: ");
  fprintf(stderr, fmt, remat__quote(&(remat__quoted){0}, opt),
          remat__quote(&(remat__quoted){0}, value));
  fputc('\n', stderr);
  return EXIT_USAGE;
}

/* A number starts with a digit, or '-' then a digit: strtol and strtoull
 * would skip leading spaces, and strtoull would wrap " -1" to 2^64 - 1. */
static int starts_number(const char *v) {
  return (*v >= '0' && *v <= '9') ||
         ((*v == '-' || *v == '.') && v[1] >= '0' && v[1] <= '9') ||
         (*v == '-' && v[1] == '.' && v[2] >= '0' && v[2] <= '9');
}

/* A whole number from `min` to `max`. */
static int parse_int_max(const char *opt, const char *v, int min, int max,
                         int *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (!starts_number(v) || *end != '\0' || errno != 0 || x < min ||
      x > max) {
    char fmt[96];
    snprintf(fmt, sizeof fmt,
             "%%s '%%s': expected a whole number from %d to %d", min, max);
    return bad(fmt, opt, v);
  }
  *out = (int)x;
  return 0;
}

static int parse_int(const char *opt, const char *v, int min, int *out) {
  return parse_int_max(opt, v, min, 1000000, out);
}

static int parse_float(const char *opt, const char *v, float *out) {
  char *end;
  float x = strtof(v, &end);
  if (!starts_number(v) || *end != '\0' || !isfinite(x) || x <= 0.0f)
    return bad("%s '%s': expected a number > 0", opt, v);
  *out = x;
  return 0;
}

static int parse_nonneg(const char *opt, const char *v, float *out) {
  char *end;
  float x = strtof(v, &end);
  if (!starts_number(v) || *end != '\0' || !isfinite(x) || x < 0.0f)
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
  if (!starts_number(v) || *v == '-' || *v == '.' || *end != '\0' ||
      errno != 0)
    return bad("%s '%s': expected a whole number from 0 to 2^64 - 1",
               "--seed", v);
  *out = x;
  return 0;
}

static int parse_policy(const char *v) {
  remat_policy *p = NULL;
  if (remat_policy_parse(v, &p) != REMAT_OK) {
    fprintf(stderr, "remat-train: --policy: %s\n",
            train_message(remat_last_error()));
    return EXIT_USAGE;
  }
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
       OPT_SAVE, OPT_LOAD, OPT_TRACE, OPT_JSON, OPT_HELP, OPT_VERSION,
       OPT_SCHEDULE, OPT_WARMUP, OPT_LR_MIN, OPT_OPTIMIZER, OPT_WD,
       OPT_RESUME, OPT_SAVE_EVERY, OPT_ACCUM, OPT_CLIP, OPT_TRACE_STEPS,
       OPT_ATTENTION, OPT_PRECISION, OPT_SCHEDULE_STEPS,
       OPT_STRICT_RESUME };
/* data, evaluation and sampling (apply_run) */
enum { OPT_DATA_FORMAT = 512, OPT_VOCAB, OPT_EVAL_EVERY, OPT_PROMPT,
       OPT_TOKENS, OPT_TEMPERATURE, OPT_TOP_K, OPT_INIT, OPT_SAVE_DTYPE };

static const struct option longopts[] = {
    {"data", 1, 0, OPT_DATA},       {"layers", 1, 0, OPT_LAYERS},
    {"d-model", 1, 0, OPT_DMODEL},  {"heads", 1, 0, OPT_HEADS},
    {"seq", 1, 0, OPT_SEQ},         {"batch", 1, 0, OPT_BATCH},
    {"steps", 1, 0, OPT_STEPS},     {"lr", 1, 0, OPT_LR},
    {"policy", 1, 0, OPT_POLICY},   {"budget", 1, 0, OPT_BUDGET},
    {"threads", 1, 0, OPT_THREADS}, {"seed", 1, 0, OPT_SEED},
    {"save", 1, 0, OPT_SAVE},       {"load", 1, 0, OPT_LOAD},
    {"trace", 1, 0, OPT_TRACE},     {"json", 0, 0, OPT_JSON},
    {"help", 0, 0, OPT_HELP},       {"version", 0, 0, OPT_VERSION},
    {"schedule", 1, 0, OPT_SCHEDULE},   {"warmup", 1, 0, OPT_WARMUP},
    {"lr-min", 1, 0, OPT_LR_MIN},       {"optimizer", 1, 0, OPT_OPTIMIZER},
    {"wd", 1, 0, OPT_WD},               {"resume", 1, 0, OPT_RESUME},
    {"save-every", 1, 0, OPT_SAVE_EVERY},
    {"accum", 1, 0, OPT_ACCUM},         {"clip", 1, 0, OPT_CLIP},
    {"trace-steps", 1, 0, OPT_TRACE_STEPS},
    {"data-format", 1, 0, OPT_DATA_FORMAT}, {"vocab", 1, 0, OPT_VOCAB},
    {"eval-every", 1, 0, OPT_EVAL_EVERY}, {"prompt", 1, 0, OPT_PROMPT},
    {"tokens", 1, 0, OPT_TOKENS}, {"temperature", 1, 0, OPT_TEMPERATURE},
    {"top-k", 1, 0, OPT_TOP_K},
    {"attention", 1, 0, OPT_ATTENTION},
    {"precision", 1, 0, OPT_PRECISION},
    {"schedule-steps", 1, 0, OPT_SCHEDULE_STEPS},
    {"strict-resume", 0, 0, OPT_STRICT_RESUME},
    {"init", 1, 0, OPT_INIT},
    {"save-dtype", 1, 0, OPT_SAVE_DTYPE},
    {"lora-rank", 1, 0, OPT_LORA_RANK}, {"lora-alpha", 1, 0, OPT_LORA_ALPHA},
    {"lora-targets", 1, 0, OPT_LORA_TARGETS}, {"train", 1, 0, OPT_TRAIN},
    {"load-adapter", 1, 0, OPT_LOAD_ADAPTER},
    {"merge-lora", 1, 0, OPT_MERGE_LORA}, {"model", 1, 0, OPT_MODEL},
    {"kv-heads", 1, 0, OPT_KV_HEADS}, {"ffn", 1, 0, OPT_FFN},
    {0, 0, 0, 0}};

/* train_options.given has a bit for each */
_Static_assert(sizeof longopts / sizeof *longopts <= 65,
               "more long options than bits in train_options.given");

static int apply_training(int c, const char *arg, const char *raw,
                          train_options *o);

/* The options of the data, evaluation and sampling; the rest go on to
 * apply_training. */
static int apply_run(int c, const char *arg, const char *raw,
                     train_options *o) {
  static const char *const formats[] = {"bytes", "u16", "u32", NULL};
  static const char *const dtypes[] = {"f32", "bf16", NULL};
  int kind = 0, r;
  switch (c) {
  case OPT_DATA_FORMAT:
    r = parse_name("--data-format", arg, formats, "bytes, u16 or u32",
                   &kind);
    o->data_u16 = kind > 0;
    o->data_u32 = kind == 2;
    return r;
  case OPT_VOCAB:
    return parse_int_max("--vocab", arg, 2, 1 << 24, &o->vocab);
  case OPT_INIT: o->init_dir = arg; return 0;
  case OPT_SAVE_DTYPE:
    r = parse_name("--save-dtype", arg, dtypes, "f32 or bf16", &kind);
    o->save_bf16 = kind == 1;
    return r;
  case OPT_EVAL_EVERY:
    return parse_int("--eval-every", arg, 1, &o->eval_every);
  case OPT_PROMPT: o->prompt = arg; return 0;
  case OPT_TOKENS:
    o->sample_opt = "--tokens";
    return parse_int("--tokens", arg, 1, &o->sample_tokens);
  case OPT_TEMPERATURE:
    o->sample_opt = "--temperature";
    return parse_nonneg("--temperature", arg, &o->temperature);
  case OPT_TOP_K:
    o->sample_opt = "--top-k";
    return parse_int("--top-k", arg, 1, &o->top_k);
  default: return apply_training(c, arg, raw, o);
  }
}

/* --data-format, --vocab and sampling; `trains` names the last option
 * given that only training takes. */
static int check_run(const train_options *o, const char *trains) {
  char why[160] = "";
  if (o->prompt == NULL && o->sample_opt != NULL)
    snprintf(why, sizeof why, "%s needs --prompt TEXT", o->sample_opt);
  else if (o->prompt != NULL && o->load_path == NULL && o->init_dir == NULL)
    snprintf(why, sizeof why, "--prompt needs --load FILE: the weights to "
             "sample from");
  else if (o->prompt != NULL && trains != NULL)
    snprintf(why, sizeof why, "--%s does not apply to --prompt, which "
             "samples from the weights of --load without training", trains);
  else if (o->data_u16 && o->data_path == NULL)
    snprintf(why, sizeof why, "--data-format u16 needs --data FILE");
  else if (o->vocab > 0 && !o->data_u16)
    snprintf(why, sizeof why, "--vocab needs --data-format u16 or u32 (the "
             "vocabulary of bytes is 256, that of the addition task 14)");
  else if (o->vocab > 65536 && !o->data_u32)
    snprintf(why, sizeof why, "--vocab %d is more than a u16 file's 65536 "
             "ids: --data-format u32 takes up to 16777216", o->vocab);
  else if (o->eval_every > o->steps && o->prompt == NULL)
    snprintf(why, sizeof why, "--eval-every %d is more than --steps %d: "
             "it takes 1 to --steps (the end of training is always "
             "evaluated)", o->eval_every, o->steps);
  if (why[0] != '\0')
    fprintf(stderr, "remat-train: %s\n", why);
  return why[0] != '\0';
}

/* One option; returns 0, -1 for --help and --version, or EXIT_USAGE. */
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
  case OPT_THREADS:
    return parse_int_max("--threads", arg, 1, REMAT_MAX_THREADS, &o->threads);
  case OPT_SEED: return parse_seed(arg, &o->seed);
  case OPT_SAVE: o->save_path = arg; return 0;
  case OPT_LOAD: o->load_path = arg; return 0;
  case OPT_TRACE: o->trace_path = arg; return 0;
  case OPT_JSON: o->json = 1; return 0;
  case OPT_HELP: usage(stdout); usage_init(stdout); return -1;
  case OPT_VERSION: printf("remat-train %s\n", remat_version()); return -1;
  default: return apply_run(c, arg, raw, o);
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
  /* in the order of remat_precision */
  static const char *const precisions[] = {"f32", "bf16", NULL};
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
  case OPT_STRICT_RESUME: o->strict_resume = 1; return 0;
  case OPT_SCHEDULE_STEPS:
    return parse_int("--schedule-steps", arg, 1, &o->schedule_steps);
  case OPT_SAVE_EVERY: return parse_int("--save-every", arg, 1, &o->save_every);
  case OPT_ACCUM: return parse_int("--accum", arg, 1, &o->accum);
  case OPT_CLIP: return parse_float("--clip", arg, &o->clip);
  case OPT_TRACE_STEPS:
    return parse_int("--trace-steps", arg, 1, &o->trace_steps);
  case OPT_ATTENTION:
    r = parse_name("--attention", arg, attentions + 1, "fused or materialized",
                   &kind);
    o->cfg.attention = (remat_attention_kind)(kind + 1);
    return r;
  case OPT_PRECISION:
    r = parse_name("--precision", arg, precisions, "f32 or bf16", &kind);
    o->precision = (remat_precision)kind;
    o->precision_set = 1;
    return r;
  case ':': return bad("%s needs a value%s", raw, "");
  default:
    r = lora_option(c, arg, o);
    return r != -2 ? r : bad("unknown option '%s' (see --help)%s", raw, "");
  }
}

/* Options that only make sense together. */
static int check_training(const train_options *o) {
  const char *why = NULL;
  if (o->load_path != NULL && o->resume_path != NULL &&
      o->cfg.lora.rank == 0)
    why = "--load and --resume exclude each other: --resume restores the "
          "weights too";
  else if (o->save_every > 0 && o->save_path == NULL)
    why = "--save-every needs --save FILE";
  else if (o->lr_min > o->lr && o->resume_path == NULL)
    why = "--lr-min is above --lr"; /* with --resume, once the file's known */
  else if (o->strict_resume && o->resume_path == NULL)
    why = "--strict-resume needs --resume FILE";
  else if (o->budget > 0 && o->policy != NULL && strcmp(o->policy, "auto"))
    why = "--budget picks each block's policy to fit it (as --policy auto "
          "does), so it does not go with another --policy: drop --budget to "
          "train with that policy, or give --policy auto";
  else if (o->budget == 0 && o->policy != NULL && !strcmp(o->policy, "auto"))
    why = "--policy auto needs --budget BYTES: it picks each block's policy "
          "to fit that budget";
  if (why != NULL)
    fprintf(stderr, "remat-train: %s\n", why);
  return why != NULL;
}

/* --init and --save-dtype against the other options. */
static int check_init(const train_options *o) {
  static const char *const model_opts[] = {"layers", "d-model", "heads",
                                           "vocab", "resume", "save-every",
                                           NULL};
  char why[200] = "";
  for (int i = 0; o->init_dir != NULL && model_opts[i] != NULL; i++)
    if (option_given(o, model_opts[i]) && why[0] == '\0')
      snprintf(why, sizeof why, "--%s does not apply to --init: %s",
               model_opts[i],
               i < 4 ? "the model's config.json gives the model"
                     : "an --init run saves the weights alone, without "
                       "the optimizer's state to resume from");
  if (why[0] == '\0' && o->save_bf16 && o->init_dir == NULL)
    snprintf(why, sizeof why, "--save-dtype bf16 needs --init: a training "
             "checkpoint holds F32 weights and moments, for an exact "
             "--resume");
  else if (why[0] == '\0' && o->init_dir != NULL && o->data_path == NULL &&
           o->prompt == NULL)
    snprintf(why, sizeof why, "--init needs --data FILE (a token file) to "
             "fine-tune on, or --prompt IDS to sample from");
  else if (why[0] == '\0' && o->init_dir != NULL && o->data_path != NULL &&
           !o->data_u16)
    snprintf(why, sizeof why, "--init trains on token ids: give "
             "--data-format u16 or u32 with --data");
  if (why[0] != '\0')
    fprintf(stderr, "remat-train: %s\n", why);
  return why[0] != '\0';
}

int option_given(const train_options *o, const char *name) {
  for (int i = 0; longopts[i].name != NULL; i++)
    if (strcmp(longopts[i].name, name) == 0)
      return (o->given >> i) & 1;
  return 0;
}

int options_parse(int argc, char **argv, train_options *o) {
  *o = (train_options){.cfg = {.layers = 2, .d_model = 128, .heads = 4,
                               .seq = 16, .batch = 64},
                       .steps = 2000, .lr = 3e-3f, .seed = 1,
                       .optimizer = REMAT_OPT_ADAMW, .warmup = -1,
                       .lr_min = -1.0f, .wd = 0.01f, .temperature = 1.0f,
                       .accum = 1, .trace_steps = 1,
                       .segment = {.decay_from = -1},
                       .resume_data_len = -1};
  int seq_set = 0, batch_set = 0, c, at = 0;
  const char *trains = NULL; /* the last option that only training takes */
  opterr = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":", longopts, &at)) != -1) {
    const char *raw = argv[optind - 1];
    int r = apply(c, optarg, raw, o, &seq_set, &batch_set);
    if (r != 0)
      return r;
    o->given |= (uint64_t)1 << at;
    char name[32];
    snprintf(name, sizeof name, " %s ", longopts[at].name);
    if (strstr(" steps save save-every resume eval-every json trace "
               "trace-steps accum clip schedule-steps strict-resume ", name))
      trains = longopts[at].name;
  }
  if (o->sample_tokens == 0)
    o->sample_tokens = 100;
  if (optind < argc)
    return bad("unexpected argument '%s' (see --help)%s", argv[optind], "");
  if (o->data_path != NULL && !seq_set)
    o->cfg.seq = 128;
  if (o->data_path != NULL && !batch_set)
    o->cfg.batch = 16;
  /* addition at 0.003 stayed on its loss plateau for 1 of 4 bf16 seeds
   * (10.7% after 2000 steps); at 0.001 every seed tried learned it */
  if (o->data_path == NULL && o->init_dir == NULL && !option_given(o, "lr"))
    o->lr = 1e-3f;
  if (o->cfg.d_model % o->cfg.heads != 0) {
    fprintf(stderr, "remat-train: --d-model %d is not divisible by --heads %d\n",
            o->cfg.d_model, o->cfg.heads);
    return EXIT_USAGE;
  }
  if (check_training(o) != 0 || check_run(o, trains) != 0 ||
      check_init(o) != 0 || lora_check(o) != 0)
    return EXIT_USAGE;
  if (o->data_path == NULL && o->init_dir == NULL && o->cfg.seq < ADD_LEN) {
    fprintf(stderr, "remat-train: --seq %d is shorter than an addition "
                    "problem (%d tokens)\n", o->cfg.seq, ADD_LEN);
    return EXIT_USAGE;
  }
  return 0;
}
