/* Sampling for remat-train (--prompt): the model of --load continues the
 * prompt by --tokens tokens, printed on stdout. At temperature 0 each token
 * is the most likely one (the first of equals); otherwise it is drawn from
 * softmax(logits / T) over the --top-k most likely, with a generator
 * seeded by --seed, so a seed gives the same text at any thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tools/train.h"

typedef struct candidate {
  float logit;
  int32_t token;
  double weight; /* exp((logit - the largest) / T) */
} candidate;

/* Most likely first; equal logits by token. */
static int by_logit(const void *a, const void *b) {
  const candidate *x = a, *y = b;
  if (x->logit != y->logit)
    return x->logit < y->logit ? 1 : -1;
  return x->token < y->token ? -1 : x->token > y->token;
}

size_t sample_scratch_size(int vocab) {
  return (size_t)vocab * sizeof(candidate);
}

int32_t sample_pick(const float *logits, int vocab, float temperature,
                    int top_k, uint64_t *rng, void *scratch) {
  candidate *c = scratch;
  if (temperature == 0.0f) {
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
      best = logits[i] > logits[best] ? i : best;
    return best;
  }
  for (int i = 0; i < vocab; i++)
    c[i] = (candidate){.logit = logits[i], .token = i};
  qsort(c, (size_t)vocab, sizeof *c, by_logit);
  int k = top_k > 0 && top_k < vocab ? top_k : vocab;
  double sum = 0.0;
  for (int i = 0; i < k; i++) {
    c[i].weight = exp(((double)c[i].logit - c[0].logit) / temperature);
    sum += c[i].weight;
  }
  /* a uniform draw in [0, sum): 53 random bits */
  double u = (double)(dataset_next(rng) >> 11) * 0x1.0p-53 * sum;
  int i = 0;
  for (; i < k - 1 && u >= c[i].weight; i++)
    u -= c[i].weight;
  return c[i].token;
}

/* The prompt's tokens: its bytes for a text file, ids separated by spaces
 * or commas for a token file, digits, + and = for the addition task.
 * Returns the count, or -1 after printing why it is not a prompt. */
static int prompt_tokens(const train_options *o, const dataset *d,
                         int32_t *out) {
  const char *p = o->prompt;
  int n = 0;
  while (*p != '\0') {
    long id;
    if (d->u16) {
      char *end;
      p += strspn(p, " ,");
      if (*p == '\0')
        break;
      id = strtol(p, &end, 10);
      if (end == p || (*end != '\0' && strchr(" ,", *end) == NULL) ||
          id < 0 || id >= d->vocab) {
        fprintf(stderr, "remat-train: --prompt '%s': expected token ids 0 to "
                "%d separated by spaces or commas\n",
                remat__quote(&(remat__quoted){0}, o->prompt), d->vocab - 1);
        return -1;
      }
      p = end;
    } else if (d->addition) {
      const char *at = strchr("0123456789+=", *p);
      if (at == NULL) {
        unsigned char ch = (unsigned char)*p;
        char shown[8]; /* a byte that is not printable ASCII as \xNN */
        snprintf(shown, sizeof shown, ch >= 32 && ch < 127 ? "%c" : "\\x%02x",
                 ch);
        fprintf(stderr, "remat-train: --prompt: '%s' is not a token of "
                "the addition task (digits, + and =)\n", shown);
        return -1;
      }
      id = at - "0123456789+=";
      p++;
    } else {
      id = (unsigned char)*p++;
    }
    out[n++] = (int32_t)id;
  }
  if (n == 0)
    fprintf(stderr, "remat-train: --prompt is empty: give at least one "
            "token\n");
  return n > 0 ? n : -1;
}

/* The tokens as text: bytes as they are, the addition task's tokens as
 * "0579+=\n_", a token file's ids separated by spaces; then a newline. */
static void print_tokens(const dataset *d, const int32_t *tokens, int n) {
  for (int i = 0; i < n; i++) {
    if (d->u16)
      printf(i > 0 ? " %d" : "%d", (int)tokens[i]);
    else if (d->addition)
      putchar("0123456789+=\n_"[tokens[i]]);
    else
      putchar(tokens[i]);
  }
  putchar('\n');
}

/* Generates into context[n..total) with the evaluation graph `e`. */
static remat_status generate(eval_model *e, const train_options *o,
                             int vocab, int32_t *context, int n, int total) {
  candidate *c = malloc((size_t)vocab * sizeof *c);
  if (c == NULL)
    return train_out_of_memory("the candidates", (size_t)vocab * sizeof *c);
  uint64_t rng = o->seed;
  remat_status s = REMAT_OK;
  for (; n < total && s == REMAT_OK; n++) {
    const float *logits;
    s = evaluator_next(e, context, n, &logits);
    if (s == REMAT_OK)
      context[n] = sample_pick(logits, vocab, o->temperature, o->top_k, &rng,
                               c);
  }
  free(c);
  return s;
}

int sample_run(const train_options *o, const dataset *d) {
  int total = (int)strlen(o->prompt) + o->sample_tokens;
  int32_t *context = malloc((size_t)total * sizeof *context);
  if (context == NULL) {
    fprintf(stderr, "remat-train: out of memory\n");
    return EXIT_RUNTIME;
  }
  int n = prompt_tokens(o, d, context);
  if (n < 0) {
    free(context);
    return EXIT_USAGE;
  }
  remat_config rc = {.set = REMAT_SET_NUM_THREADS * (o->threads > 0) |
                            REMAT_SET_PRECISION * (o->precision_set != 0),
                     .num_threads = o->threads, .precision = o->precision};
  remat_runtime *rt = NULL;
  eval_model *e = NULL;
  remat_status s = remat_runtime_create(&rc, &rt);
  if (s == REMAT_OK)
    s = evaluator_open_rows(rt, o, 1, &e);
  const char *hint = "";
  if (s == REMAT_OK && o->load_path == NULL && o->init != NULL)
    s = evaluator_load_init(e, o->init);
  else if (s == REMAT_OK && (s = evaluator_load(e, o->load_path)) ==
                                REMAT_ERR_SHAPE && o->init == NULL)
    hint = "; --prompt takes the --layers, --d-model, --heads, --seq, --data "
           "and --vocab that trained the weights";
  if (s == REMAT_OK)
    s = generate(e, o, o->cfg.vocab, context, n, n + o->sample_tokens);
  if (s == REMAT_OK)
    print_tokens(d, context, n + o->sample_tokens);
  else
    fprintf(stderr, "remat-train: %s%s\n", train_last_error(), hint);
  evaluator_close(e);
  remat_runtime_destroy(rt);
  free(context);
  return s == REMAT_OK ? 0 : EXIT_RUNTIME;
}
