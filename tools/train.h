/* Declarations shared by the files of remat-train: the command-line
 * options, the two data sources (the built-in addition task and a text
 * file), and evaluation by greedy decoding on a forward-only graph. */
#ifndef REMAT_TOOLS_TRAIN_H
#define REMAT_TOOLS_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "remat.h"
#include "remat_gpt.h"
#include "tools/hf_init.h"

/* Exit codes: 2 for a bad command line, 1 for a failure while running. */
#define EXIT_USAGE 2
#define EXIT_RUNTIME 1
/* Stopped by SIGINT or SIGTERM after a whole step, with the --save
 * checkpoint of that step written (128 + SIGINT, as a shell reports it). */
#define EXIT_SIGNAL 130
/* Stopped by a signal without the checkpoint that stop was to write: a
 * second signal during a step, or the stop's save failed. */
#define EXIT_SIGNAL_UNSAVED 3

typedef enum train_schedule {
  SCHEDULE_COSINE = 0,
  SCHEDULE_LINEAR = 1,
  SCHEDULE_CONSTANT = 2
} train_schedule;

/* The schedule that --resume starts when the options' schedule is not the
 * checkpoint's (train_ckpt.c): from step decay_from on, the rate goes from
 * lr_start down to the options' --lr-min at their schedule's end, by their
 * --schedule (constant: it stays at lr_start); before decay_from, it is the
 * options' own. decay_from < 0: none, the options' schedule throughout. */
typedef struct train_segment {
  int decay_from;
  float lr_start;
} train_segment;

typedef struct train_options {
  remat_gpt_config cfg; /* vocab comes from the data source */
  const char *data_path; /* NULL: the built-in addition task */
  int data_u16;          /* --data-format u16: little-endian uint16 ids */
  int vocab;             /* --vocab; 0: the largest id in the file + 1 */
  int steps, threads;
  float lr;
  uint64_t seed;
  const char *policy;   /* NULL: the runtime's default */
  int64_t budget;       /* bytes; 0: none */
  const char *save_path, *load_path, *trace_path;
  int json;
  /* optimizer and learning-rate schedule */
  remat_optimizer_kind optimizer;
  train_schedule schedule;
  int warmup;           /* steps; -1: the schedule's default */
  float lr_min;         /* -1: a tenth of --lr */
  float wd;             /* AdamW's weight decay */
  int accum;            /* micro-batches of --batch rows per update */
  remat_precision precision; /* --precision, when precision_set */
  int precision_set;
  float clip;           /* max global gradient norm; 0: none */
  int trace_steps;      /* training steps (runs) --trace records */
  int schedule_steps;   /* --schedule-steps: the schedule's end; 0: --steps */
  train_segment segment; /* a schedule that --resume changed */
  /* checkpoints */
  const char *resume_path;
  int strict_resume;    /* --strict-resume: refuse a schedule change */
  int resume_step;      /* the step of --resume, as checkpoint_options read */
  int64_t resume_data_len; /* the tokens it trained on; -1: not recorded */
  int tokens_only;      /* --prompt from a file's model without --data: the
                           data format and vocabulary alone */
  uint64_t given;       /* bit i: the i-th long option was given */
  int save_every;       /* steps; 0: only at the end */
  int eval_every;       /* steps between held-out evaluations; 0: at the end */
  /* sampling instead of training (--prompt), from the weights of --load */
  const char *prompt;
  int sample_tokens;    /* --tokens; 0: 100 */
  float temperature;    /* 0: greedy */
  int top_k;            /* 0: every token */
  const char *sample_opt; /* the last of --tokens, --temperature, --top-k */
  /* a pre-trained model (--init DIR): its config and weights, read by
   * init_read (train_init.c) before anything is built */
  const char *init_dir;
  hf_model *init;
  int data_u32;         /* --data-format u32: little-endian uint32 ids */
  int save_bf16;        /* --save-dtype bf16 (with --init) */
  /* the Llama model and LoRA (train_lora.c); cfg.lora holds --lora-rank,
   * --lora-alpha, --lora-targets and --train */
  int llama;            /* --model llama */
  int kv_heads, ffn;    /* --kv-heads, --ffn; 0: the heads, 4 x --d-model */
  const char *load_adapter, *merge_path; /* --load-adapter, --merge-lora */
  const char *lora_dir; /* --save's directory in LoRA mode */
} train_options;

/* The learning rate of step `step` (from 0): linear warm-up, then the
 * schedule; it depends on the step and the options only, so a resumed run
 * follows the same curve. */
float train_lr_at(const train_options *o, int step);

/* The step at which the options' schedule ends: --schedule-steps, else
 * --steps. */
int train_horizon(const train_options *o);
/* The warm-up steps in force: --warmup, else the schedule's default. */
int train_warmup(const train_options *o);
/* 1 when the long option `name` ("layers") was on the command line. */
int option_given(const train_options *o, const char *name);

/* Fills `o` from argv. Returns 0 on success, -1 after --help (printed to
 * stdout), EXIT_USAGE after printing a one-line error to stderr. */
int options_parse(int argc, char **argv, train_options *o);

/* ---- data (train_data.c) ---- */

/* The addition task's tokens: digits are 0..9, then these. */
enum { TOK_PLUS = 10, TOK_EQUALS = 11, TOK_END = 12, TOK_PAD = 13,
       ADD_VOCAB = 14, ADD_DIGITS = 3, ADD_LEN = 3 * ADD_DIGITS + 4,
       ADD_HELDOUT = 512 };

typedef struct dataset {
  int addition;          /* 1: the addition task, 0: a file */
  int u16;               /* a token file's ids (else bytes) */
  uint64_t rng;
  /* a file: bytes (text) or uint16 token ids (ids), one of them set; train
   * on tokens [train_lo, train_len), hold out [heldout_start, len);
   * train_lo > 0 only on data-parallel ranks */
  unsigned char *text;
  uint16_t *ids;
  uint32_t *ids32;       /* --data-format u32 (u16 is set too: token ids) */
  int vocab;
  int64_t len, train_len, heldout_start, train_lo;
  /* addition: held-out problems (a, b) */
  int heldout_a[ADD_HELDOUT], heldout_b[ADD_HELDOUT];
} dataset;

/* The built-in task: "123+456=0579\n" with zero-padded operands; pairs with
 * a hash in the held-out class are never trained on. */
dataset *dataset_addition(uint64_t seed);
/* Byte-level language modelling on a text file. Returns NULL after putting
 * a one-line message in `err` (missing, empty or binary file, or shorter
 * than seq + 1 bytes). */
dataset *dataset_text(const char *path, int seq, char *err, size_t err_len);
/* A token file as nanoGPT and llm.c write them: little-endian uint16 ids
 * (after llm.c's 1 KiB header when the file starts with it), all below
 * `vocab` (0: the vocabulary is the largest id + 1). Returns NULL after
 * putting a one-line message in `err` (an odd size, a header that does not
 * match, an id outside the vocabulary, too few tokens for a training and a
 * held-out window). */
dataset *dataset_u16(const char *path, int seq, int vocab, char *err,
                     size_t err_len);
/* The same from the `bytes` bytes at `raw` (malloc'd, taken over: kept as
 * the ids or freed); `path` only names the data in messages. */
dataset *dataset_u16_bytes(unsigned char *raw, int64_t bytes,
                           const char *path, int seq, int vocab, char *err,
                           size_t err_len);
/* A token file of little-endian uint32 ids (--data-format u32, for
 * vocabularies over 65536), all below `vocab` (0: the largest id + 1).
 * NULL after a message in `err`, as dataset_u16. */
dataset *dataset_u32(const char *path, int seq, int vocab, char *err,
                     size_t err_len);
/* The tokens of a file's data without the data, for --prompt: bytes, or
 * u16 ids below `vocab`. NULL when out of memory. */
dataset *dataset_tokens_only(int u16, int vocab);
/* The data that the options name (--data, --data-format, --vocab), or
 * dataset_tokens_only with o->tokens_only. */
dataset *dataset_open(const train_options *o, char *err, size_t err_len);
void dataset_destroy(dataset *d);
/* Token `i` of a file's data. */
static inline int32_t dataset_at(const dataset *d, int64_t i) {
  if (d->ids32 != NULL)
    return (int32_t)d->ids32[i];
  return d->ids != NULL ? d->ids[i] : d->text[i];
}
int dataset_vocab(const dataset *d);
uint64_t dataset_next(uint64_t *state);
/* The 13 tokens of "aaa+bbb=ssss\n". */
void addition_tokens(int a, int b, int32_t out[ADD_LEN]);
/* A training batch: tokens[b][t] and next-token targets[b][t]. */
void dataset_batch(dataset *d, int batch, int seq, int32_t *tokens,
                   int32_t *targets);
/* Rank `rank` of `ranks`' shard (data parallel): its own random stream
 * (the addition task's problems differ) and, for a text file, its own
 * window of the training bytes. Returns 0, or -1 with a message in `err`
 * when the text is too short for that many windows of seq + 1 bytes. */
int dataset_shard(dataset *d, int seq, int rank, int ranks, char *err,
                  size_t err_len);
/* The text of token `tok` for printing ("\\n" for a newline, the id of a
 * token file's token). */
const char *dataset_token_text(const dataset *d, int32_t tok, char buf[8]);

/* ---- LoRA and the Llama model (train_lora.c) ---- */

/* The option codes of train_lora.c's options. */
enum { OPT_LORA_RANK = 768, OPT_LORA_ALPHA, OPT_LORA_TARGETS, OPT_TRAIN,
       OPT_LOAD_ADAPTER, OPT_MERGE_LORA, OPT_MODEL, OPT_KV_HEADS, OPT_FFN };
/* In LoRA mode, the training state's file in --save's directory. */
#define LORA_STATE_FILE "training_state.safetensors"
/* One of those options: 0, EXIT_USAGE after a message, -2 for another. */
int lora_option(int c, const char *arg, train_options *o);
/* The options that go together: 0, or EXIT_USAGE after a message. */
int lora_check(const train_options *o);
/* Builds the model of the options (GPT or Llama, with LoRA when asked)
 * with `batch` rows (train_build's, when there is no --init). */
remat_status lora_model_build(remat_graph *g, const train_options *o,
                              int batch, remat_gpt *m);
/* In LoRA mode, before anything is read: --save DIR becomes the adapter
 * directory (created) and its training state file, a --resume or
 * --load-adapter directory its file. 0, or an exit status after a
 * message. */
int lora_prepare(train_options *o);
/* Writes PEFT's adapter files into --save's directory (LoRA mode). */
remat_status lora_save_adapter(remat_graph *g, const train_options *o);
/* --load-adapter into g's adapters (nothing without it). */
remat_status lora_load_adapter(remat_graph *g, const train_options *o);
/* --merge-lora: the base weights with the adapters folded in. */
remat_status lora_merge(remat_graph *g, const train_options *o);

/* ---- checkpoints (train_ckpt.c) ---- */

/* Before anything is built: takes the model (and, for --resume, the batch,
 * the accumulation and the schedule) from the __metadata__ of --resume or
 * --load, checking the file's values and the options given against them;
 * settles the schedule of a resumed run (saying on stderr what changes).
 * Returns 0, or an exit status after printing the reason. */
int checkpoint_options(train_options *o);
/* Writes the checkpoint of `g` after `step` steps with the data's state
 * and what checkpoint_options reads back (the model of `o` at the
 * precision of `rt`, the batch, the schedule). */
remat_status checkpoint_save(remat_runtime *rt, remat_graph *g,
                             const train_options *o, const char *path,
                             int step, const dataset *d);
/* Restores --resume into `g` and `d` and sets *step to the steps done;
 * returns 0, or EXIT_RUNTIME after printing the reason. */
int checkpoint_resume(remat_graph *g, const train_options *o, dataset *d,
                      int *step);

/* ---- signals (train_signals.c) ---- */

/* Prepares the words a second signal prints: that no checkpoint was
 * written (to `save_path`, the --save target, when not NULL), after a
 * newline that ends the progress line when `tty`. */
void signals_prepare(const char *save_path, int tty);
/* Catches SIGINT and SIGTERM (on 1) or restores their default (on 0). */
void signals_catch(int on);
/* On 1, a file is being written: a second signal waits until signals_writing
 * (0), so that the file is whole or gone; signals_second then tells it. */
void signals_writing(int on);
/* The signal that asked the run to stop, 0 if none. */
int signals_stop(void);
/* A second signal that came while a file was written, 0 if none. */
int signals_second(void);

/* ---- output files (train_outputs.c) ---- */

/* Checks before the first step that rank `rank` can write the files the
 * options name (--save: a regular file or a new name, in a folder where a
 * new file can be made). Returns 0, or -1 with a one-line message in
 * `err` that names the option. */
int outputs_check(const train_options *o, int rank, char *err,
                  size_t err_len);

/* ---- the progress line (train_progress.c) ---- */

typedef struct progress_fields {
  int step, steps;
  float loss;
  double tokens_per_s;
  const char *peak; /* "12.3 MiB" */
  int eta_s;
  int evaluated;       /* 1: show the latest held-out evaluation */
  double heldout_loss; /* its loss, and accuracy (< 0: none) */
  double accuracy;
} progress_fields;

/* The columns a progress line may use on `fd`: COLUMNS when set, else the
 * terminal's width, else 80; never more than 80. */
int progress_width(int fd);
/* The line, at most width - 1 characters. */
void progress_format(char *out, size_t len, int width,
                     const progress_fields *f);

/* ---- evaluation (train_eval.c) ---- */

/* remat-train's own allocation of `bytes` bytes for `what` failed: records
 * the message that train_last_error gives and returns
 * REMAT_ERR_OUT_OF_MEMORY (the library's message would be stale). */
remat_status train_out_of_memory(const char *what, size_t bytes);
/* The message of the last failure: remat-train's own, else the library's
 * in remat-train's words (train_message). */
const char *train_last_error(void);
/* A library message with the library's names of what an option sets
 * (remat_config.num_threads, REMAT_MEMORY_BUDGET, ...) replaced by the
 * option (--threads, --budget, ...), in a buffer valid until the next
 * call (train_messages.c). */
const char *train_message(const char *message);

typedef struct eval_result {
  double heldout_loss; /* mean cross-entropy on held-out answer/text tokens */
  double accuracy;     /* exact-match on held-out problems; -1 for text */
  int problems;
  int64_t peak_bytes;  /* the evaluation graph's peak (its forward passes) */
} eval_result;

/* The forward-only graph that evaluation runs on. */
typedef struct eval_model eval_model;

/* Builds and compiles the evaluation graph in `rt` (under its memory
 * budget); run before training, so that a budget too small for it fails
 * before any step. *out is set even on failure, for evaluator_close. */
remat_status evaluator_open(remat_runtime *rt, const train_options *o,
                            const dataset *d, eval_model **out);
/* Copies the weights of `train` into the evaluation graph and reports
 * held-out loss and accuracy; prints a few greedy completions to `out`.
 * Returns the first failing status. */
remat_status evaluate(eval_model *e, remat_graph *train, dataset *d,
                      FILE *out, eval_result *r);
void evaluator_close(eval_model *e);
/* The same graph with `rows` sequences, for sampling (one row). */
remat_status evaluator_open_rows(remat_runtime *rt, const train_options *o,
                                 int rows, eval_model **out);
/* Loads the weights of a safetensors file or checkpoint. */
remat_status evaluator_load(eval_model *e, const char *path);
/* Loads the --init model's weights into the evaluation graph. */
remat_status evaluator_load_init(eval_model *e, const hf_model *m);

/* ---- a pre-trained model: --init DIR (train_init.c) ---- */

/* Reads --init's config.json and takes the model's vocabulary and the
 * token-file form of the data from it (before the data is opened). Returns
 * 0, or an exit status after printing why. No --init: 0. */
int init_read(train_options *o);
/* The same for o->init_dir (not NULL), for remat-serve too: 0, or an exit
 * status with the one-line message in `err` (no program name). */
int init_prepare(train_options *o, char *err, size_t err_len);
/* Builds the model of the options with `batch` rows: --init's, or the GPT
 * or Llama of --layers, --d-model and --heads (lora_model_build), with
 * LoRA when asked. */
remat_status train_build(remat_graph *g, const train_options *o, int batch,
                         remat_gpt *m);
/* The weights a run starts from, once g is compiled: --load's file, else
 * --init's checkpoint, else none (the builder's random ones). */
remat_status train_load(remat_graph *g, const train_options *o);
/* Writes --save after an --init run: the weights alone (F32, or BF16 with
 * --save-dtype bf16), under the model's names. */
remat_status init_save(remat_graph *g, const train_options *o);
/* The logits [vocab] of the token after context[0..n), n >= 1, seen
 * through the last --seq tokens (in row 0); valid until the next call. */
remat_status evaluator_next(eval_model *e, const int32_t *context, int n,
                            const float **logits);
/* The same for `rows` (at most the graph's rows) contexts in one forward
 * pass: row r sees contexts[r][0..n[r]) (n[r] >= 1) and logits[r] gets its
 * next token's logits; rows from `rows` on run on zeros. */
remat_status evaluator_next_rows(eval_model *e,
                                 const int32_t *const *contexts,
                                 const int *n, int rows,
                                 const float **logits);
/* The rows of the graph (evaluator_open_rows) and its vocabulary. */
int evaluator_rows(const eval_model *e);
/* The highest peak of its forward passes, and the last one's stats. */
int64_t evaluator_peak(const eval_model *e);

/* ---- sampling (train_sample.c) ---- */

/* --prompt: continues the prompt by --tokens tokens with the weights of
 * --load and prints it on stdout; returns an exit status after printing
 * the reason of a failure. */
int sample_run(const train_options *o, const dataset *d);
/* The next token from logits[vocab]: the most likely (the first of
 * equals) at temperature 0, else a draw from softmax(logits / temperature)
 * over the top_k most likely (0: all) with the generator *rng; `scratch`
 * has sample_scratch_size(vocab) bytes. remat-serve shares it. */
int32_t sample_pick(const float *logits, int vocab, float temperature,
                    int top_k, uint64_t *rng, void *scratch);
size_t sample_scratch_size(int vocab);

#endif
