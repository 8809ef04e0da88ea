/* Evaluation for remat-train: a forward-only copy of the model (compiled
 * with loss NULL and the logits kept, before training so that a budget too
 * small for it fails first) gets the trained weights; it scores held-out
 * data and completes prompts by greedy decoding, feeding padded sequences
 * of the fixed [batch, seq] shape one new token at a time. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "tools/train.h"

static char own_error[256]; /* the last failure of remat-train's own */

remat_status train_out_of_memory(const char *what, size_t bytes) {
  snprintf(own_error, sizeof own_error, "out of memory: %s needs %zu bytes",
           what, bytes);
  return REMAT_ERR_OUT_OF_MEMORY;
}

const char *train_last_error(void) {
  return own_error[0] != '\0' ? own_error : train_message(remat_last_error());
}

struct eval_model {
  remat_graph *g;
  remat_gpt m;
  int batch, seq, vocab;
  int32_t *tokens;    /* [batch, seq] */
  int32_t *zeros;     /* [batch, seq]: unused targets */
  float *logits;      /* [batch, seq, vocab] */
  int64_t peak_bytes; /* the highest peak of its forward passes */
};

void evaluator_close(eval_model *e) {
  if (e == NULL)
    return;
  remat_graph_destroy(e->g);
  free(e->tokens);
  free(e->zeros);
  free(e->logits);
  free(e);
}

static remat_status copy_weights(remat_graph *from, remat_graph *to) {
  remat_status s = REMAT_OK;
  for (int i = 0; i < remat_num_params(from) && s == REMAT_OK; i++) {
    remat_tensor *src = remat_param_at(from, i), *dst = remat_param_at(to, i);
    size_t bytes = (size_t)remat_tensor_numel(src) * sizeof(float);
    float *buf = malloc(bytes);
    if (buf == NULL)
      return train_out_of_memory("copying the weights", bytes);
    s = remat_read(from, src, buf, bytes);
    if (s == REMAT_OK)
      s = remat_write(to, dst, buf, bytes);
    free(buf);
  }
  return s;
}

/* Builds and compiles the forward-only graph with `batch` rows; the unused
 * targets are fed once. */
static remat_status eval_open(eval_model *e, remat_runtime *rt,
                              const train_options *o, int batch) {
  memset(e, 0, sizeof *e);
  remat_gpt_config c = o->cfg;
  c.batch = batch;
  e->batch = batch;
  e->seq = c.seq;
  e->vocab = c.vocab;
  size_t n = (size_t)batch * (size_t)c.seq, logits;
  if (!remat__mul_size(n, (size_t)c.vocab * sizeof *e->logits, &logits))
    logits = SIZE_MAX;
  e->tokens = calloc(n, sizeof *e->tokens);
  e->zeros = calloc(n, sizeof *e->zeros);
  e->logits = logits < SIZE_MAX ? malloc(logits) : NULL;
  if (e->tokens == NULL || e->zeros == NULL)
    return train_out_of_memory("the evaluation's tokens", 2 * n * 4);
  if (e->logits == NULL)
    return train_out_of_memory("the evaluation's logits (rows x --seq x "
                               "vocabulary x 4)", logits);
  remat_status s = remat_graph_create(rt, &e->g);
  if (s == REMAT_OK)
    s = train_build(e->g, o, batch, &e->m);
  if (s == REMAT_OK)
    s = remat_keep(e->g, e->m.logits);
  if (s == REMAT_OK)
    s = remat_compile(e->g, NULL, NULL);
  if (s == REMAT_OK)
    s = remat_feed(e->g, e->m.targets, e->zeros, n * sizeof *e->zeros);
  return s;
}

/* Runs the model on e->tokens and reads the logits. */
static remat_status eval_forward(eval_model *e) {
  size_t n = (size_t)e->batch * (size_t)e->seq;
  remat_status s = remat_feed(e->g, e->m.tokens, e->tokens, n * sizeof(int32_t));
  remat_step_stats st = {.size = sizeof st};
  if (s == REMAT_OK)
    s = remat_forward(e->g, &st);
  if (s == REMAT_OK && st.peak_bytes > e->peak_bytes)
    e->peak_bytes = st.peak_bytes;
  if (s == REMAT_OK)
    s = remat_read(e->g, e->m.logits, e->logits,
                   n * (size_t)e->vocab * sizeof(float));
  return s;
}

static const float *logits_at(const eval_model *e, int row, int t) {
  return e->logits + ((size_t)row * e->seq + t) * (size_t)e->vocab;
}

static int32_t argmax(const float *v, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[best])
      best = i;
  return best;
}

/* -log softmax(v)[target] */
static double nll(const float *v, int n, int32_t target) {
  double mx = v[0], sum = 0.0;
  for (int i = 1; i < n; i++)
    mx = v[i] > mx ? v[i] : mx;
  for (int i = 0; i < n; i++)
    sum += exp(v[i] - mx);
  return log(sum) + mx - v[target];
}

/* ---- the addition task ---- */

enum { PROMPT_LEN = 2 * ADD_DIGITS + 2, SAMPLES = 6 };

/* "  123+456=0579  right" or "  123+456=0578  wrong (expected 0579)" */
static void print_problem(const dataset *d, FILE *out, const int32_t *row,
                          const int32_t *want) {
  char buf[8], expected[16] = "";
  fputs("  ", out);
  for (int t = 0; t < ADD_LEN - 1; t++)
    fputs(dataset_token_text(d, row[t], buf), out);
  for (int t = PROMPT_LEN; t < ADD_LEN - 1; t++)
    strcat(expected, dataset_token_text(d, want[t], buf));
  if (memcmp(row + PROMPT_LEN, want + PROMPT_LEN,
             (ADD_LEN - PROMPT_LEN) * sizeof *row) == 0)
    fputs("  right\n", out);
  else
    fprintf(out, "  wrong (expected %s)\n", expected);
}

/* Scores one chunk of held-out problems: teacher-forced loss on the answer
 * tokens, then greedy decoding of the answer. */
static remat_status addition_chunk(eval_model *e, const dataset *d, int first,
                                   int count, double *loss, int *right,
                                   FILE *out) {
  int32_t want[64][ADD_LEN];
  for (int r = 0; r < e->batch; r++) {
    int i = first + (r < count ? r : 0);
    addition_tokens(d->heldout_a[i], d->heldout_b[i], want[r]);
    for (int t = 0; t < e->seq; t++)
      e->tokens[(size_t)r * e->seq + t] = t < ADD_LEN ? want[r][t] : TOK_PAD;
  }
  remat_status s = eval_forward(e);
  for (int r = 0; r < count && s == REMAT_OK; r++)
    for (int t = PROMPT_LEN - 1; t < ADD_LEN - 1; t++)
      *loss += nll(logits_at(e, r, t), e->vocab, want[r][t + 1]);
  for (int r = 0; r < e->batch; r++)
    for (int t = PROMPT_LEN; t < e->seq; t++)
      e->tokens[(size_t)r * e->seq + t] = TOK_PAD;
  for (int t = PROMPT_LEN - 1; t < ADD_LEN - 1 && s == REMAT_OK; t++) {
    s = eval_forward(e);
    for (int r = 0; r < e->batch && s == REMAT_OK; r++)
      e->tokens[(size_t)r * e->seq + t + 1] = argmax(logits_at(e, r, t), e->vocab);
  }
  for (int r = 0; r < count && s == REMAT_OK; r++) {
    const int32_t *row = e->tokens + (size_t)r * e->seq;
    *right += memcmp(row + PROMPT_LEN, want[r] + PROMPT_LEN,
                     (ADD_LEN - PROMPT_LEN) * sizeof *row) == 0;
    if (out != NULL && first + r < SAMPLES)
      print_problem(d, out, row, want[r]);
  }
  return s;
}

static remat_status eval_addition(eval_model *e, const dataset *d, FILE *out,
                                  eval_result *r) {
  double loss = 0.0;
  int right = 0;
  remat_status s = REMAT_OK;
  if (out != NULL)
    fprintf(out, "held-out completions (greedy):\n");
  for (int first = 0; first < ADD_HELDOUT && s == REMAT_OK; first += e->batch) {
    int count = ADD_HELDOUT - first < e->batch ? ADD_HELDOUT - first : e->batch;
    s = addition_chunk(e, d, first, count, &loss, &right, out);
  }
  r->problems = ADD_HELDOUT;
  r->heldout_loss = loss / (ADD_HELDOUT * (ADD_LEN - PROMPT_LEN));
  r->accuracy = (double)right / ADD_HELDOUT;
  return s;
}

/* ---- a text file ---- */

enum { TEXT_WINDOWS = 32, GENERATE = 160 };

static remat_status text_loss(eval_model *e, const dataset *d, double *loss) {
  int64_t span = d->len - d->heldout_start - e->seq;
  double sum = 0.0;
  int64_t tokens = 0;
  remat_status s = REMAT_OK;
  for (int w = 0; w < TEXT_WINDOWS && s == REMAT_OK; w += e->batch) {
    for (int r = 0; r < e->batch; r++) {
      int64_t start = d->heldout_start + span * (w + r) / TEXT_WINDOWS;
      for (int t = 0; t < e->seq; t++)
        e->tokens[(size_t)r * e->seq + t] = dataset_at(d, start + t);
    }
    s = eval_forward(e);
    for (int r = 0; r < e->batch && s == REMAT_OK; r++) {
      int64_t start = d->heldout_start + span * (w + r) / TEXT_WINDOWS;
      for (int t = 0; t < e->seq; t++, tokens++)
        sum += nll(logits_at(e, r, t), e->vocab,
                   dataset_at(d, start + t + 1));
    }
  }
  *loss = sum / (double)(tokens ? tokens : 1);
  return s;
}

/* Greedy continuation of the first bytes of the held-out text; the window
 * slides once the sequence is full. */
static remat_status text_sample(eval_model *e, const dataset *d, FILE *out) {
  int prompt = e->seq / 2 < 40 ? e->seq / 2 : 40;
  if (prompt < 1)
    prompt = 1;
  int32_t *seqbuf = malloc((size_t)(prompt + GENERATE) * sizeof *seqbuf);
  if (seqbuf == NULL)
    return train_out_of_memory("the sample",
                               (size_t)(prompt + GENERATE) * sizeof *seqbuf);
  for (int t = 0; t < prompt; t++)
    seqbuf[t] = dataset_at(d, d->heldout_start + t);
  remat_status s = REMAT_OK;
  int len = prompt;
  for (; len < prompt + GENERATE && s == REMAT_OK; len++) {
    int start = len > e->seq ? len - e->seq : 0, n = len - start;
    for (int t = 0; t < e->seq; t++)
      e->tokens[t] = t < n ? seqbuf[start + t] : 0; /* causal: unread */
    s = eval_forward(e);
    if (s == REMAT_OK)
      seqbuf[len] = argmax(logits_at(e, 0, n - 1), e->vocab);
  }
  char buf[8];
  fprintf(out, "sample (prompt, then greedy completion):\n  ");
  for (int t = 0; t < len; t++) {
    if (t == prompt)
      fputs(" >>> ", out);
    else if (t > 0 && d->u16)
      fputc(' ', out); /* token ids */
    fputs(dataset_token_text(d, seqbuf[t], buf), out);
  }
  fputc('\n', out);
  free(seqbuf);
  return s;
}

remat_status evaluator_open_rows(remat_runtime *rt, const train_options *o,
                                 int rows, eval_model **out) {
  *out = malloc(sizeof **out);
  if (*out == NULL)
    return train_out_of_memory("the evaluation", sizeof **out);
  return eval_open(*out, rt, o, rows);
}

remat_status evaluator_open(remat_runtime *rt, const train_options *o,
                            const dataset *d, eval_model **out) {
  return evaluator_open_rows(rt, o, d->addition ? 64 : 8, out);
}

remat_status evaluator_load(eval_model *e, const char *path) {
  return remat_load_safetensors(e->g, path);
}

remat_status evaluator_load_init(eval_model *e, const hf_model *m) {
  return hf_load(e->g, m);
}

remat_status evaluator_next_rows(eval_model *e,
                                 const int32_t *const *contexts,
                                 const int *n, int rows,
                                 const float **logits) {
  for (int r = 0; r < e->batch; r++) {
    int32_t *row = e->tokens + (size_t)r * e->seq;
    if (r >= rows) {
      memset(row, 0, (size_t)e->seq * sizeof *row);
      continue;
    }
    int start = n[r] > e->seq ? n[r] - e->seq : 0, len = n[r] - start;
    for (int t = 0; t < e->seq; t++)
      row[t] = t < len ? contexts[r][start + t] : 0; /* causal: unread */
  }
  remat_status s = eval_forward(e);
  for (int r = 0; r < rows; r++) /* the last token seen, as above */
    logits[r] = logits_at(e, r, (n[r] > e->seq ? e->seq : n[r]) - 1);
  return s;
}

remat_status evaluator_next(eval_model *e, const int32_t *context, int n,
                            const float **logits) {
  return evaluator_next_rows(e, &context, &n, 1, logits);
}

int evaluator_rows(const eval_model *e) { return e->batch; }

int64_t evaluator_peak(const eval_model *e) { return e->peak_bytes; }

remat_status evaluate(eval_model *e, remat_graph *train, dataset *d,
                      FILE *out, eval_result *r) {
  memset(r, 0, sizeof *r);
  r->accuracy = -1.0;
  remat_status s = copy_weights(train, e->g);
  if (s == REMAT_OK && d->addition)
    s = eval_addition(e, d, out, r);
  else if (s == REMAT_OK) {
    s = text_loss(e, d, &r->heldout_loss);
    if (s == REMAT_OK && out != NULL)
      s = text_sample(e, d, out);
  }
  r->peak_bytes = e->peak_bytes;
  return s;
}
