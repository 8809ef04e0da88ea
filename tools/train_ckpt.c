/* remat-train's checkpoints: what --save writes into the file's
 * __metadata__ beside the library's training state (the step, the data's
 * position, the model, the batch and the schedule), and what --load,
 * --resume and --prompt take back from it: every value is checked as
 * untrusted input, then against the options given on the command line. A
 * --resume whose options change the schedule starts a new one from the
 * current learning rate and says so (or refuses, with --strict-resume). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tools/train.h"

/* The version of the metadata below. A file without "train.meta" (written
 * before it, with the step and the data's position alone) takes every
 * option from the command line, as it did. */
#define META_VERSION 1
/* The most steps, layers, widths... that the options take. */
#define OPTION_MAX 1000000
/* The most tokens of --data (1 GiB of bytes). */
#define DATA_MAX (UINT64_C(1) << 30)

enum { DATA_ADDITION = 0, DATA_BYTES = 1, DATA_U16 = 2 };

/* The values, in the order of `fields`. */
enum meta_index {
  M_STEP, M_RNG, /* what remat_load_checkpoint restores */
  M_VERSION,
  /* the model, which --load, --resume and --prompt take */
  M_LAYERS, M_D_MODEL, M_HEADS, M_SEQ, M_VOCAB, M_GELU_ERF, M_ATTENTION,
  M_PRECISION, M_FORMAT,
  /* the run, which --resume alone takes */
  M_BATCH, M_ACCUM, M_DATA_LEN, M_KIND, M_HORIZON, M_WARMUP, M_LR,
  M_LR_MIN,
  /* a schedule that a --resume changed (train_segment), when there is one */
  M_DECAY_FROM, M_LR_START,
  M_COUNT
};

/* A value of the metadata: its key, the option it stands for, the range
 * a file's value must lie in and the names of its values (NULL: a
 * number). Learning rates are the bits of their float32. */
typedef struct meta_field {
  const char *key, *option;
  uint64_t min, max;
  const char *const *names;
} meta_field;

static const char *const attentions[] = {"default", "fused", "materialized"};
static const char *const precisions[] = {"f32", "bf16"};
static const char *const formats[] = {"addition", "bytes", "u16"};
static const char *const schedules[] = {"cosine", "linear", "constant"};

static const meta_field fields[M_COUNT] = {
    [M_STEP] = {"train.step", NULL, 0, UINT64_MAX, NULL},
    [M_RNG] = {"data.rng", NULL, 0, UINT64_MAX, NULL},
    [M_VERSION] = {"train.meta", NULL, META_VERSION, META_VERSION, NULL},
    [M_LAYERS] = {"model.layers", "layers", 1, OPTION_MAX, NULL},
    [M_D_MODEL] = {"model.d_model", "d-model", 1, OPTION_MAX, NULL},
    [M_HEADS] = {"model.heads", "heads", 1, OPTION_MAX, NULL},
    [M_SEQ] = {"model.seq", "seq", 1, OPTION_MAX, NULL},
    [M_VOCAB] = {"model.vocab", "vocab", 1, 65536, NULL},
    [M_GELU_ERF] = {"model.gelu_erf", NULL, 0, 1, NULL},
    [M_ATTENTION] = {"model.attention", "attention", 1, 2, attentions},
    [M_PRECISION] = {"model.precision", "precision", 0, 1, precisions},
    [M_FORMAT] = {"data.format", "data-format", 0, 2, formats},
    [M_BATCH] = {"train.batch", "batch", 1, OPTION_MAX, NULL},
    [M_ACCUM] = {"train.accum", "accum", 1, OPTION_MAX, NULL},
    [M_DATA_LEN] = {"data.tokens", NULL, 0, DATA_MAX, NULL},
    [M_KIND] = {"schedule.kind", "schedule", 0, 2, schedules},
    [M_HORIZON] = {"schedule.steps", "schedule-steps", 0, OPTION_MAX, NULL},
    [M_WARMUP] = {"schedule.warmup", "warmup", 0, OPTION_MAX, NULL},
    [M_LR] = {"schedule.lr", "lr", 0, UINT32_MAX, NULL},
    [M_LR_MIN] = {"schedule.lr_min", "lr-min", 0, UINT32_MAX, NULL},
    [M_DECAY_FROM] = {"schedule.decay_from", NULL, 0, OPTION_MAX, NULL},
    [M_LR_START] = {"schedule.lr_start", NULL, 0, UINT32_MAX, NULL},
};

static uint64_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float bits_float(uint64_t v) {
  uint32_t u = (uint32_t)v;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static int data_format(const train_options *o) {
  if (o->data_path == NULL && !o->tokens_only)
    return DATA_ADDITION;
  return o->data_u16 ? DATA_U16 : DATA_BYTES;
}

/* The builder treats its default attention as materialized. */
static int attention_of(const train_options *o) {
  return o->cfg.attention == REMAT_ATTENTION_DEFAULT
             ? REMAT_ATTENTION_MATERIALIZED
             : (int)o->cfg.attention;
}

/* ---- saving ---- */

/* The values that describe the run of `o` after `step` steps; returns
 * how many to write (the segment's only when there is one). */
static int describe(const train_options *o, int precision, int step,
                    const dataset *d, uint64_t v[M_COUNT]) {
  v[M_STEP] = (uint64_t)step;
  v[M_RNG] = d->rng;
  v[M_VERSION] = META_VERSION;
  v[M_LAYERS] = (uint64_t)o->cfg.layers;
  v[M_D_MODEL] = (uint64_t)o->cfg.d_model;
  v[M_HEADS] = (uint64_t)o->cfg.heads;
  v[M_SEQ] = (uint64_t)o->cfg.seq;
  v[M_VOCAB] = (uint64_t)dataset_vocab(d);
  v[M_GELU_ERF] = (uint64_t)o->cfg.gelu_erf;
  v[M_ATTENTION] = (uint64_t)attention_of(o);
  v[M_PRECISION] = (uint64_t)precision;
  v[M_FORMAT] = (uint64_t)data_format(o);
  v[M_BATCH] = (uint64_t)o->cfg.batch;
  v[M_ACCUM] = (uint64_t)o->accum;
  v[M_DATA_LEN] = d->addition ? 0 : (uint64_t)d->len;
  v[M_KIND] = (uint64_t)o->schedule;
  v[M_HORIZON] = (uint64_t)train_horizon(o);
  v[M_WARMUP] = (uint64_t)train_warmup(o);
  v[M_LR] = float_bits(o->lr);
  v[M_LR_MIN] = float_bits(o->lr_min);
  if (o->segment.decay_from < 0)
    return M_DECAY_FROM;
  v[M_DECAY_FROM] = (uint64_t)o->segment.decay_from;
  v[M_LR_START] = float_bits(o->segment.lr_start);
  return M_COUNT;
}

remat_status checkpoint_save(remat_runtime *rt, remat_graph *g,
                             const train_options *o, const char *path,
                             int step, const dataset *d) {
  const char *keys[M_COUNT];
  uint64_t v[M_COUNT];
  remat_config rc;
  remat_status s = remat_runtime_config(rt, &rc);
  if (s != REMAT_OK)
    return s;
  for (int i = 0; i < M_COUNT; i++)
    keys[i] = fields[i].key;
  int n = describe(o, (int)rc.precision, step, d, v);
  return remat_save_checkpoint(g, path, keys, v, n);
}

/* ---- reading: the file's values, checked ---- */

/* The file whose metadata the options read: "--resume 'PATH'". */
typedef struct source {
  const char *option, *path;
  uint64_t v[M_COUNT];
  int found[M_COUNT];
} source;

/* "--resume 'PATH': __metadata__ 'KEY' is VALUE: expected EXPECTED" */
static int file_error(const source *f, int key, const char *expected) {
  fprintf(stderr, "remat-train: %s '%s': __metadata__ '%s' is %llu: "
          "expected %s\n", f->option, f->path, fields[key].key,
          (unsigned long long)f->v[key], expected);
  return EXIT_RUNTIME;
}

/* A learning rate's bits: a finite float32, > 0 (or >= 0 with
 * `zero_ok`), or -1 (the default --lr-min) with `default_ok`. */
static int lr_ok(uint64_t bits, int zero_ok, int default_ok) {
  float x = bits_float(bits);
  return isfinite(x) && (x > 0.0f || (zero_ok && x == 0.0f) ||
                         (default_ok && x == -1.0f));
}

/* Every key of this version there, each in its range. */
static int check_ranges(const source *f) {
  for (int i = M_VERSION; i < M_COUNT; i++) {
    const meta_field *m = &fields[i];
    int optional = i == M_DECAY_FROM || i == M_LR_START;
    if (!f->found[i] && !optional) {
      fprintf(stderr, "remat-train: %s '%s': __metadata__ has '%s' but no "
              "'%s'\n", f->option, f->path, fields[M_VERSION].key, m->key);
      return EXIT_RUNTIME;
    }
    if (f->found[i] && (f->v[i] < m->min || f->v[i] > m->max)) {
      char range[64];
      snprintf(range, sizeof range, "%llu to %llu",
               (unsigned long long)m->min, (unsigned long long)m->max);
      return file_error(f, i, range);
    }
  }
  if (f->found[M_DECAY_FROM] != f->found[M_LR_START]) {
    fprintf(stderr, "remat-train: %s '%s': __metadata__ has one of '%s' and "
            "'%s' without the other\n", f->option, f->path,
            fields[M_DECAY_FROM].key, fields[M_LR_START].key);
    return EXIT_RUNTIME;
  }
  return 0;
}

/* The values that must agree with each other. */
static int check_consistent(const source *f) {
  const uint64_t *v = f->v;
  char why[96];
  if (v[M_D_MODEL] % v[M_HEADS] != 0) {
    snprintf(why, sizeof why, "a number of heads that divides %s %llu",
             fields[M_D_MODEL].key, (unsigned long long)v[M_D_MODEL]);
    return file_error(f, M_HEADS, why);
  }
  uint64_t vocab = v[M_FORMAT] == DATA_ADDITION ? ADD_VOCAB : 256;
  if (v[M_FORMAT] != DATA_U16 && v[M_VOCAB] != vocab) {
    snprintf(why, sizeof why, "%llu, the vocabulary of data.format %s",
             (unsigned long long)vocab, formats[v[M_FORMAT]]);
    return file_error(f, M_VOCAB, why);
  }
  if (v[M_FORMAT] == DATA_ADDITION && v[M_SEQ] < ADD_LEN)
    return file_error(f, M_SEQ,
                      "at least 13, the tokens of an addition problem");
  if (!lr_ok(v[M_LR], 0, 0))
    return file_error(f, M_LR, "the bits of a finite float32 > 0");
  if (!lr_ok(v[M_LR_MIN], 1, 1) ||
      bits_float(v[M_LR_MIN]) > bits_float(v[M_LR]))
    return file_error(f, M_LR_MIN, "the bits of -1 (the default) or of a "
                      "float32 from 0 to schedule.lr");
  if (f->found[M_LR_START] && !lr_ok(v[M_LR_START], 1, 0))
    return file_error(f, M_LR_START, "the bits of a finite float32 >= 0");
  return 0;
}

/* ---- reading: the options ---- */

/* The text of value `x` of field `i`: its name, or the number. */
static const char *value_text(int i, uint64_t x, char buf[32]) {
  if (fields[i].names != NULL && x <= fields[i].max)
    return fields[i].names[x];
  snprintf(buf, 32, "%llu", (unsigned long long)x);
  return buf;
}

/* The file's value of field `i` where the command line gave none; where it
 * gave one (`given`, as `cmd`), that must be the file's. */
static int take(const source *f, int i, int given, uint64_t cmd,
                int *out) {
  char a[32], b[32];
  if (given && cmd != f->v[i]) {
    fprintf(stderr, "remat-train: --%s %s disagrees with %s '%s', whose "
            "model has --%s %s (leave --%s out to take the file's)\n",
            fields[i].option, value_text(i, cmd, a), f->option, f->path,
            fields[i].option, value_text(i, f->v[i], b), fields[i].option);
    return EXIT_USAGE;
  }
  *out = (int)f->v[i];
  return 0;
}

static const char *format_words(int format) {
  static const char *const words[] = {
      "the addition task (no --data)", "a text file (--data-format bytes)",
      "a token file (--data-format u16)"};
  return words[format];
}

/* The data's format and vocabulary: --data must be given for a file's
 * model, but for --prompt, which needs the tokens alone. */
static int take_data(const source *f, train_options *o) {
  int format = (int)f->v[M_FORMAT];
  int given = o->data_path != NULL || option_given(o, "data-format");
  if (given && data_format(o) != format) {
    fprintf(stderr, "remat-train: --data %s%s%s is %s, but %s '%s' holds a "
            "model of %s\n", o->data_path != NULL ? "'" : "",
            o->data_path != NULL ? o->data_path : "(none)",
            o->data_path != NULL ? "'" : "", format_words(data_format(o)),
            f->option, f->path, format_words(format));
    return EXIT_USAGE;
  }
  if (format != DATA_ADDITION && o->data_path == NULL && o->prompt == NULL) {
    fprintf(stderr, "remat-train: %s '%s' holds a model of %s: give the "
            "--data FILE to train on\n", f->option, f->path,
            format_words(format));
    return EXIT_USAGE;
  }
  o->data_u16 = format == DATA_U16;
  o->tokens_only = format != DATA_ADDITION && o->data_path == NULL;
  if (format != DATA_U16)
    return 0;
  return take(f, M_VOCAB, option_given(o, "vocab"), (uint64_t)o->vocab,
              &o->vocab);
}

/* The model's shape, attention, precision and data. */
static int take_model(const source *f, train_options *o) {
  remat_gpt_config *c = &o->cfg;
  int attention = 0, precision = 0;
  int rc = take(f, M_LAYERS, option_given(o, "layers"),
                (uint64_t)c->layers, &c->layers);
  if (rc == 0)
    rc = take(f, M_D_MODEL, option_given(o, "d-model"),
              (uint64_t)c->d_model, &c->d_model);
  if (rc == 0)
    rc = take(f, M_HEADS, option_given(o, "heads"), (uint64_t)c->heads,
              &c->heads);
  if (rc == 0)
    rc = take(f, M_SEQ, option_given(o, "seq"), (uint64_t)c->seq, &c->seq);
  if (rc == 0)
    rc = take(f, M_ATTENTION, option_given(o, "attention"),
              (uint64_t)attention_of(o), &attention);
  if (rc == 0)
    rc = take(f, M_PRECISION, o->precision_set, (uint64_t)o->precision,
              &precision);
  if (rc == 0)
    rc = take_data(f, o);
  c->gelu_erf = (int)f->v[M_GELU_ERF];
  c->attention = (remat_attention_kind)attention;
  o->precision = (remat_precision)precision;
  o->precision_set = 1;
  return rc;
}

/* ---- reading: the schedule of --resume ---- */

/* The options of the file's schedule (with its segment, if any). */
static train_options file_schedule(const source *f) {
  train_options s = {.steps = (int)f->v[M_HORIZON],
                     .schedule = (train_schedule)f->v[M_KIND],
                     .warmup = (int)f->v[M_WARMUP],
                     .lr = bits_float(f->v[M_LR]),
                     .lr_min = bits_float(f->v[M_LR_MIN]),
                     .segment = {.decay_from = -1}};
  if (f->found[M_DECAY_FROM])
    s.segment = (train_segment){.decay_from = (int)f->v[M_DECAY_FROM],
                                .lr_start = bits_float(f->v[M_LR_START])};
  return s;
}

static int same_schedule(const train_options *a, const train_options *b) {
  return a->schedule == b->schedule && train_warmup(a) == train_warmup(b) &&
         float_bits(a->lr) == float_bits(b->lr) &&
         float_bits(a->lr_min) == float_bits(b->lr_min) &&
         (a->schedule == SCHEDULE_CONSTANT ||
          train_horizon(a) == train_horizon(b));
}

/* "ends at step 300 (cosine, warm-up 30, --lr 0.003, --lr-min 0.0003)" */
static void schedule_text(char *buf, size_t len, const train_options *s) {
  double lr_min = s->lr_min >= 0.0f ? (double)s->lr_min : 0.1 * s->lr;
  snprintf(buf, len, "ends at step %d (%s, warm-up %d, --lr %g, --lr-min %g)",
           train_horizon(s), schedules[s->schedule], train_warmup(s),
           (double)s->lr, lr_min);
}

/* The options' schedule from step k on, when it is not the file's: the
 * options' warm-up where it is not over, then from the current rate (or
 * the new --lr, given, or reached by the warm-up) down to --lr-min. Says
 * so on stderr, or refuses under --strict-resume. */
static int change_schedule(const source *f, train_options *o,
                           const train_options *was, int k, int lr_given) {
  char old_text[160], new_text[160], plan[320];
  schedule_text(old_text, sizeof old_text, was);
  schedule_text(new_text, sizeof new_text, o);
  fprintf(stderr, "remat-train: %s '%s': the checkpoint's schedule %s; this "
          "run's %s", f->option, f->path, old_text, new_text);
  if (o->strict_resume) {
    fprintf(stderr, ": --strict-resume refuses the change (leave out "
            "--steps and the schedule's options to take the file's)\n");
    return EXIT_USAGE;
  }
  int warmup = train_warmup(o), from = k > warmup ? k : warmup;
  int new_lr = lr_given && o->lr != was->lr, restart = k < warmup || new_lr;
  float start = restart ? o->lr : train_lr_at(was, k);
  const char *why = !restart ? "the checkpoint's current rate"
                    : new_lr ? "the new --lr"
                             : "--lr, where the warm-up ends";
  double lr_min = o->lr_min >= 0.0f ? (double)o->lr_min : 0.1 * o->lr;
  size_t n = 0;
  if (from > k)
    n = (size_t)snprintf(plan, sizeof plan, "the warm-up goes on to step "
                         "%d, then ", from);
  if (o->schedule == SCHEDULE_CONSTANT)
    snprintf(plan + n, sizeof plan - n, "from step %d the learning rate "
             "stays at %g (%s)", from, (double)start, why);
  else
    snprintf(plan + n, sizeof plan - n, "from step %d the learning rate "
             "goes from %g (%s) to %g at step %d by %s", from, (double)start,
             why, lr_min, train_horizon(o), schedules[o->schedule]);
  fprintf(stderr, ": %s, unlike a run started with this schedule "
          "(--strict-resume refuses instead)\n", plan);
  o->segment = (train_segment){.decay_from = from, .lr_start = start};
  return 0;
}

/* The step of --resume against --steps. */
static int check_step(const source *f, const train_options *o) {
  if (f->v[M_STEP] <= (uint64_t)o->steps)
    return 0;
  fprintf(stderr, "remat-train: --resume '%s' is at step %llu, past --steps "
          "%d (the total, not steps to add)\n", f->path,
          (unsigned long long)f->v[M_STEP], o->steps);
  return EXIT_RUNTIME;
}

/* --steps (the file's schedule's end unless given), the schedule (each
 * option the file's unless given), and the segment: the file's, when the
 * schedule is the file's, else a new one. */
static int take_schedule(const source *f, train_options *o) {
  train_options was = file_schedule(f);
  if (!option_given(o, "steps"))
    o->steps = train_horizon(&was);
  int rc = check_step(f, o);
  if (rc != 0)
    return rc;
  if (!option_given(o, "schedule"))
    o->schedule = was.schedule;
  if (!option_given(o, "warmup"))
    o->warmup = was.warmup;
  if (!option_given(o, "lr"))
    o->lr = was.lr;
  if (!option_given(o, "lr-min"))
    o->lr_min = was.lr_min;
  if (o->lr_min > o->lr) {
    fprintf(stderr, "remat-train: --lr-min %g is above --lr %g (one of them "
            "from %s '%s')\n", (double)o->lr_min, (double)o->lr, f->option,
            f->path);
    return EXIT_USAGE;
  }
  if (same_schedule(o, &was)) {
    o->segment = was.segment;
    return 0;
  }
  return change_schedule(f, o, &was, (int)f->v[M_STEP],
                         option_given(o, "lr"));
}

/* The batch, the accumulation, the data's size and the schedule. */
static int take_run(const source *f, train_options *o) {
  int rc = take(f, M_BATCH, option_given(o, "batch"),
                (uint64_t)o->cfg.batch, &o->cfg.batch);
  if (rc == 0)
    rc = take(f, M_ACCUM, option_given(o, "accum"), (uint64_t)o->accum,
              &o->accum);
  o->resume_data_len = f->v[M_FORMAT] == DATA_ADDITION
                           ? -1
                           : (int64_t)f->v[M_DATA_LEN];
  return rc == 0 ? take_schedule(f, o) : rc;
}

/* ---- the options from the file ---- */

/* A schedule that ends before the run would run past its end. */
static int check_horizon(const train_options *o) {
  if (o->schedule_steps == 0 || o->schedule_steps >= o->steps)
    return 0;
  fprintf(stderr, "remat-train: --schedule-steps %d is less than --steps "
          "%d: the schedule would end before the run\n", o->schedule_steps,
          o->steps);
  return EXIT_USAGE;
}

/* Reads the values of `f` (found[i] 0 where the file has none). A file
 * whose header cannot be read has none: the load that follows reports
 * why, as it would for a weights file. */
static int read_values(source *f) {
  const char *keys[M_COUNT];
  for (int i = 0; i < M_COUNT; i++)
    keys[i] = fields[i].key;
  if (remat_checkpoint_values(f->path, keys, f->v, f->found, 0) !=
          REMAT_OK ||
      remat_checkpoint_values(f->path, keys, f->v, f->found, M_COUNT) ==
          REMAT_OK)
    return 0;
  fprintf(stderr, "remat-train: %s: %s\n", f->option, remat_last_error());
  return EXIT_RUNTIME;
}

int checkpoint_options(train_options *o) {
  source f = {.option = o->resume_path != NULL ? "--resume" : "--load",
              .path = o->resume_path != NULL ? o->resume_path
                                             : o->load_path};
  if (f.path == NULL)
    return check_horizon(o);
  int rc = read_values(&f);
  if (rc == 0 && f.found[M_VERSION])
    rc = check_ranges(&f);
  if (rc == 0 && f.found[M_VERSION])
    rc = check_consistent(&f);
  if (rc == 0 && f.found[M_VERSION])
    rc = take_model(&f, o);
  if (rc == 0 && f.found[M_VERSION] && o->resume_path != NULL)
    rc = take_run(&f, o);
  if (rc == 0 && o->resume_path != NULL && f.found[M_STEP] &&
      !f.found[M_VERSION])
    rc = check_step(&f, o); /* take_schedule checks the others */
  if (rc == 0 && o->resume_path != NULL)
    o->resume_step = (int)f.v[M_STEP];
  return rc == 0 ? check_horizon(o) : rc;
}

/* ---- restoring ---- */

int checkpoint_resume(remat_graph *g, const train_options *o, dataset *d,
                      int *step) {
  static const char *const keys[] = {"train.step", "data.rng"};
  uint64_t values[2];
  if (remat_load_checkpoint(g, o->resume_path, keys, values, 2) !=
      REMAT_OK) {
    fprintf(stderr, "remat-train: --resume: %s\n", remat_last_error());
    return EXIT_RUNTIME;
  }
  if (values[0] != (uint64_t)o->resume_step) {
    fprintf(stderr, "remat-train: --resume '%s' changed while it was read: "
            "at step %llu, then %d\n", o->resume_path,
            (unsigned long long)values[0], o->resume_step);
    return EXIT_RUNTIME;
  }
  if (o->resume_data_len >= 0 && d->len != o->resume_data_len) {
    fprintf(stderr, "remat-train: --data '%s' has %lld %s, but --resume '%s' "
            "was trained on data of %lld: resume with the same --data\n",
            o->data_path, (long long)d->len, d->u16 ? "tokens" : "bytes",
            o->resume_path, (long long)o->resume_data_len);
    return EXIT_RUNTIME;
  }
  *step = (int)values[0];
  d->rng = values[1];
  return 0;
}
