/* remat-train, the command-line trainer: builds the GPT-style model for the
 * chosen data, trains it (AdamW or SGD, warm-up then a schedule) while
 * drawing a progress bar, writes a checkpoint if asked (at the end, every
 * N steps, and when a signal stops the run), then reports held-out results
 * and sample completions; with --prompt it samples from --load's weights
 * instead (train_sample.c). */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "tools/dp_tool.h"
#include "tools/json_out.h"
#include "tools/train.h"

typedef struct trainer {
  train_options o;
  dataset *data;
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  eval_model *eval;
  int32_t *tokens, *targets;
  int64_t peak_bytes;
  int first_step; /* steps done before this run (--resume) */
  int tty;        /* the progress line is redrawn in place */
  /* held-out evaluations: the latest, the best (lowest loss), their time */
  eval_result last;
  int evaluated, best_step;
  double best_loss, eval_s;
} trainer;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what) {
  fprintf(stderr, "remat-train: %s%s\n", what, train_last_error());
  return EXIT_RUNTIME;
}

/* Runtime, graph, compile, optional --load, then the evaluation graph:
 * every graph is compiled (and checked against --budget) before the first
 * step. */
static int open_model(trainer *t) {
  const train_options *o = &t->o;
  remat_config rc = {.set = REMAT_SET_MEMORY_BUDGET, .memory_budget = o->budget};
  if (o->threads > 0) {
    rc.set |= REMAT_SET_NUM_THREADS;
    rc.num_threads = o->threads;
  }
  if (o->policy != NULL) {
    rc.set |= REMAT_SET_POLICY;
    rc.policy = o->policy;
  }
  if (o->precision_set) {
    rc.set |= REMAT_SET_PRECISION;
    rc.precision = o->precision;
  }
  remat_optimizer opt = {.kind = o->optimizer, .lr = o->lr,
                         .weight_decay = o->wd};
  /* under mpirun, rank N > 0 traces to --trace's path + ".rankN", as
   * REMAT_TRACE does (dp_tool.h), so that ranks do not share one file */
  char trace[4200] = "";
  if (o->trace_path != NULL && dp_tool_rank() > 0)
    snprintf(trace, sizeof trace, "%s.rank%d", o->trace_path, dp_tool_rank());
  else if (o->trace_path != NULL)
    snprintf(trace, sizeof trace, "%s", o->trace_path);
  if (remat_runtime_create(&rc, &t->rt) != REMAT_OK ||
      remat_graph_create(t->rt, &t->g) != REMAT_OK ||
      remat_graph_seed(t->g, o->seed) != REMAT_OK ||
      train_build(t->g, o, o->cfg.batch, &t->m) != REMAT_OK ||
      dp_tool_attach(t->g) != REMAT_OK || /* under mpirun: dp_tool.h */
      remat_compile(t->g, t->m.loss, &opt) != REMAT_OK ||
      remat_set_clip(t->g, o->clip) != REMAT_OK ||
      (o->trace_path != NULL &&
       remat_trace_steps(t->g, trace, o->trace_steps) != REMAT_OK))
    return fail("");
  if (train_load(t->g, o) != REMAT_OK ||
      lora_load_adapter(t->g, o) != REMAT_OK)
    return fail("");
  if (o->resume_path != NULL &&
      checkpoint_resume(t->g, o, t->data, &t->first_step) != 0)
    return EXIT_RUNTIME;
  if (evaluator_open(t->rt, o, t->data, &t->eval) != REMAT_OK)
    return fail("evaluation: ");
  size_t n = (size_t)o->cfg.batch * (size_t)o->cfg.seq;
  t->tokens = malloc(n * sizeof *t->tokens);
  t->targets = malloc(n * sizeof *t->targets);
  if (t->tokens == NULL || t->targets == NULL) {
    fprintf(stderr, "remat-train: out of memory\n");
    return EXIT_RUNTIME;
  }
  return 0;
}

static void format_bytes(char *buf, size_t len, int64_t bytes) {
  if (bytes >= (int64_t)1 << 30)
    snprintf(buf, len, "%.2f GiB", (double)bytes / (double)(1 << 30));
  else
    snprintf(buf, len, "%.1f MiB", (double)bytes / (double)(1 << 20));
}

/* The progress line on stderr: redrawn in place on a terminal, one line
 * per tenth of the run otherwise. */
static void progress(const trainer *t, int step, float loss, double elapsed,
                     int tty) {
  int steps = t->o.steps, every = steps / 10 > 0 ? steps / 10 : 1;
  if ((!tty && step % every != 0 && step != steps) || dp_tool_rank() != 0)
    return;
  char peak[32], line[128];
  format_bytes(peak, sizeof peak, t->peak_bytes);
  int here = step - t->first_step; /* steps of this run */
  double training_s = elapsed - t->eval_s;
  progress_fields f = {
      .step = step, .steps = steps, .loss = loss, .peak = peak,
      .tokens_per_s = (double)here * t->o.accum * t->o.cfg.batch *
                      t->o.cfg.seq / (training_s > 0.0 ? training_s : elapsed),
      .eta_s = (int)(elapsed / here * (steps - step) + 0.5),
      .evaluated = t->evaluated, .heldout_loss = t->last.heldout_loss,
      .accuracy = t->last.accuracy};
  progress_format(line, sizeof line, progress_width(STDERR_FILENO), &f);
  /* \033[K clears what a longer line left */
  fprintf(stderr, "%s%s%s", tty ? "\r" : "", line,
          tty ? (step < steps ? "\033[K" : "\033[K\n") : "\n");
  fflush(stderr);
}

/* "0.984000", or "null" where accuracy does not apply (a file's data). */
static const char *json_accuracy(char buf[32], double accuracy) {
  if (accuracy < 0.0)
    return "null";
  snprintf(buf, 32, "%.6f", accuracy);
  return buf;
}

/* Records the evaluation after step `step` (the latest, the best) and,
 * with --json and `print`, writes its line with the `seconds` it took. */
static void note_eval(trainer *t, int step, const eval_result *r,
                      double seconds, int print) {
  t->last = *r;
  t->evaluated = 1;
  if (t->best_step < 0 || r->heldout_loss < t->best_loss) {
    t->best_step = step;
    t->best_loss = r->heldout_loss;
  }
  char acc[32];
  if (t->o.json && print) {
    json_nulls nulls = {0};
    json_text loss;
    json_num(&nulls, &loss, "heldout_loss", "%.6f", r->heldout_loss);
    printf("{\"eval_step\": %d, \"heldout_loss\": %s, \"accuracy\": %s, "
           "\"eval_s\": %.3f", step, loss.text,
           json_accuracy(acc, r->accuracy), seconds);
    printf("%s}\n", json_nonfinite(&nulls));
    fflush(stdout);
  }
}

/* --eval-every: held-out loss (and accuracy) after step `done`, but for
 * the last step, whose evaluation is the final report's. */
static int evaluate_during(trainer *t, int done) {
  const train_options *o = &t->o;
  if (o->eval_every == 0 || done % o->eval_every != 0 || done == o->steps)
    return 0;
  double start = now();
  eval_result r;
  if (evaluate(t->eval, t->g, t->data, NULL, &r) != REMAT_OK) {
    if (t->tty)
      fputc('\n', stderr); /* end the progress line first */
    return fail("evaluation: ");
  }
  double seconds = now() - start;
  t->eval_s += seconds;
  note_eval(t, done, &r, seconds, 1);
  return 0;
}

/* One step at the schedule's learning rate: --accum micro-batches, the
 * last of which updates; st gets the last one's stats with the mean loss,
 * the summed time and the highest peak. */
static int train_step(trainer *t, int step, remat_step_stats *st) {
  const train_options *o = &t->o;
  size_t n = (size_t)o->cfg.batch * (size_t)o->cfg.seq;
  double loss = 0.0, seconds = 0.0;
  int64_t peak = 0;
  for (int k = 0; k < o->accum; k++) {
    dataset_batch(t->data, o->cfg.batch, o->cfg.seq, t->tokens, t->targets);
    int last = k == o->accum - 1;
    if (remat_feed(t->g, t->m.tokens, t->tokens, n * sizeof *t->tokens) ||
        remat_feed(t->g, t->m.targets, t->targets, n * sizeof *t->targets) ||
        remat_set_lr(t->g, train_lr_at(o, step)) ||
        (last ? remat_step(t->g, st) : remat_accumulate(t->g, st)))
      return 1;
    loss += st->loss;
    seconds += st->seconds;
    peak = st->peak_bytes > peak ? st->peak_bytes : peak;
  }
  st->loss = (float)(loss / o->accum);
  st->seconds = seconds;
  st->peak_bytes = peak;
  return 0;
}

/* Writes the --save checkpoint after `done` steps (on rank 0), with a
 * second signal held off until the file is whole (train_signals.c). */
static remat_status save_now(trainer *t, int done) {
  const train_options *o = &t->o;
  if (o->save_path == NULL || dp_tool_rank() != 0)
    return REMAT_OK;
  signals_writing(1);
  /* --init writes the weights alone (LoRA mode: the adapters alone) */
  remat_status s = o->init == NULL ? checkpoint_save(t->rt, t->g, o,
                                                     o->save_path, done,
                                                     t->data)
                   : o->lora_dir == NULL ? init_save(t->g, o)
                                         : REMAT_OK;
  if (s == REMAT_OK)
    s = lora_save_adapter(t->g, o); /* LoRA mode: PEFT's files too */
  signals_writing(0);
  return s;
}

static const char *signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : "SIGTERM";
}

/* The stop that signal `sig` asked for after `done` steps, once its
 * checkpoint is written (saved 1) or failed (saved 0): the line on stderr
 * and the exit status, EXIT_SIGNAL or EXIT_SIGNAL_UNSAVED. */
static int stopped(trainer *t, int sig, int done, int saved) {
  const train_options *o = &t->o;
  remat__quoted q;
  const char *path = o->save_path != NULL ? remat__quote(&q, o->save_path)
                                          : NULL;
  char second[96] = "";
  if (signals_second() != 0)
    snprintf(second, sizeof second, " (a second %s came during the save, "
             "which was finished first)", signal_name(signals_second()));
  if (t->tty)
    fputc('\n', stderr); /* end the progress line first */
  if (!saved) {
    fprintf(stderr, "remat-train: stopped by %s after step %d: no checkpoint "
            "written: %s\n", signal_name(sig), done, train_last_error());
    return EXIT_SIGNAL_UNSAVED;
  }
  fprintf(stderr, "remat-train: stopped by %s after step %d%s%s%s%s\n",
          signal_name(sig), done,
          path != NULL ? "; checkpoint written to '" : "",
          path != NULL ? path : "", path != NULL ? "'" : "", second);
  return EXIT_SIGNAL;
}

/* After a step: a checkpoint every --save-every steps, and the stop that
 * a signal asked for (with a last checkpoint). Returns 0 to go on. */
static int after_step(trainer *t, int done) {
  const train_options *o = &t->o;
  int sig = signals_stop();
  if (sig == 0 && (o->save_every == 0 || done % o->save_every != 0 ||
                   done == o->steps))
    return 0;
  remat_status s = save_now(t, done);
  if (sig != 0)
    return stopped(t, sig, done, s == REMAT_OK);
  return s == REMAT_OK ? 0 : fail("");
}

static int train(trainer *t) {
  const train_options *o = &t->o;
  size_t n = (size_t)o->accum * (size_t)o->cfg.batch * (size_t)o->cfg.seq;
  int tty = t->tty = isatty(STDERR_FILENO) && !o->json, rc = 0;
  double start = now(), last_draw = 0.0;
  for (int step = t->first_step; step < o->steps && rc == 0; step++) {
    remat_step_stats st = {.size = sizeof st};
    /* a traced step writes the trace file: a second signal waits for it */
    signals_writing(o->trace_path != NULL &&
                    step - t->first_step < o->trace_steps);
    int failed = train_step(t, step, &st);
    signals_writing(0);
    if (failed) {
      if (tty && step > t->first_step)
        fputc('\n', stderr); /* end the progress line first */
      rc = fail("");
      break;
    }
    if (st.peak_bytes > t->peak_bytes)
      t->peak_bytes = st.peak_bytes;
    double elapsed = now() - start;
    if (o->json) {
      json_nulls nulls = {0};
      json_text loss, norm;
      json_num(&nulls, &loss, "loss", "%.6f", st.loss);
      json_num(&nulls, &norm, "grad_norm", "%.6g", st.grad_norm);
      printf("{\"step\": %d, \"loss\": %s, \"lr\": %.6g, \"step_s\": %.6f, "
             "\"tokens_per_s\": %.1f, \"peak_bytes\": %lld, "
             "\"grad_norm\": %s, \"elapsed_s\": %.3f",
             step + 1, loss.text, train_lr_at(o, step), st.seconds,
             st.seconds > 0.0 ? (double)n / st.seconds : 0.0,
             (long long)st.peak_bytes, norm.text, elapsed);
      printf("%s}\n", json_nonfinite(&nulls));
      fflush(stdout); /* a line as soon as its step is done */
    }
    if ((rc = evaluate_during(t, step + 1)) != 0)
      break;
    elapsed = now() - start;
    if (!o->json &&
        (!tty || elapsed - last_draw > 0.1 || step + 1 == o->steps)) {
      progress(t, step + 1, st.loss, elapsed, tty);
      last_draw = elapsed;
    }
    rc = after_step(t, step + 1);
  }
  return rc;
}

/* The results on stdout: completions, then held-out loss and accuracy
 * and the best step of the evaluations (a JSON object with --json,
 * accuracy null for a file's data). */
static int report(trainer *t, double wall) {
  const train_options *o = &t->o;
  eval_result r;
  double start = now();
  if (evaluate(t->eval, t->g, t->data, o->json ? NULL : stdout, &r))
    return fail("evaluation: ");
  note_eval(t, o->steps, &r, now() - start, o->eval_every > 0 &&
            o->steps % o->eval_every == 0 && o->steps > t->first_step);
  char peak[32], acc[32];
  /* with no step in this run (--steps 0, or --resume at --steps), the
   * peak is the evaluation's */
  int64_t peak_bytes = t->peak_bytes > 0 ? t->peak_bytes : r.peak_bytes;
  format_bytes(peak, sizeof peak, peak_bytes);
  if (o->json) {
    char dp_json[1024];
    dp_tool_json(t->g, dp_json, sizeof dp_json); /* collective under MPI */
    json_nulls nulls = {0};
    json_text loss, best;
    json_num(&nulls, &loss, "heldout_loss", "%.6f", r.heldout_loss);
    json_num(&nulls, &best, "best_heldout_loss", "%.6f", t->best_loss);
    printf("{\"done\": true, \"steps\": %d, \"heldout_loss\": %s, "
           "\"accuracy\": %s, \"best_step\": %d, \"best_heldout_loss\": "
           "%s, \"peak_bytes\": %lld, \"wall_s\": %.3f%s",
           o->steps, loss.text, json_accuracy(acc, r.accuracy),
           t->best_step, best.text, (long long)peak_bytes, wall, dp_json);
    printf("%s}\n", json_nonfinite(&nulls));
    return 0;
  }
  /* The addition task's held-out loss covers the answer tokens alone; the
   * training loss of the progress line covers every token, the random
   * operands too, so the two are not comparable. */
  printf("held-out loss %.4f", r.heldout_loss);
  if (r.accuracy >= 0.0)
    printf(" (answer tokens; the training loss counts every token), "
           "exact-match accuracy %.1f%% (%d problems)",
           100.0 * r.accuracy, r.problems);
  printf("; %d steps in %.1f s, peak memory %s%s\n", o->steps, wall, peak,
         t->peak_bytes > 0 ? "" : " (evaluation)");
  if (o->eval_every > 0)
    printf("best held-out loss %.4f at step %d (evaluated every %d steps)\n",
           t->best_loss, t->best_step, o->eval_every);
  return 0;
}

static void close_trainer(trainer *t) {
  evaluator_close(t->eval);
  remat_graph_destroy(t->g);
  remat_runtime_destroy(t->rt);
  dataset_destroy(t->data);
  free(t->tokens);
  free(t->targets);
}

static int run(trainer *t) {
  train_options *o = &t->o;
  char err[512];
  int rc = lora_prepare(o); /* LoRA mode: --save's directory */
  if (rc == 0)
    rc = checkpoint_options(o); /* the model of --load or --resume */
  if (rc == 0)
    rc = init_read(o); /* the model of --init */
  if (rc != 0)
    return rc;
  t->data = dataset_open(o, err, sizeof err);
  if (t->data == NULL) {
    fprintf(stderr, "remat-train: %s\n", err);
    return EXIT_RUNTIME;
  }
  o->cfg.vocab = dataset_vocab(t->data);
  if (o->prompt != NULL)
    return sample_run(o, t->data);
  double start = now();
  if (outputs_check(o, dp_tool_rank(), err, sizeof err) != 0) {
    fprintf(stderr, "remat-train: %s\n", err);
    return EXIT_RUNTIME;
  }
  signals_prepare(o->save_path, isatty(STDERR_FILENO) && !o->json);
  signals_catch(1); /* from here to the last save: train_signals.c */
  rc = open_model(t);
  if (rc == 0 && dataset_shard(t->data, o->cfg.seq, dp_tool_rank(),
                               dp_tool_size(), err, sizeof err) != 0) {
    fprintf(stderr, "remat-train: %s\n", err);
    rc = EXIT_RUNTIME;
  }
  if (rc == 0)
    rc = train(t);
  /* Saved before evaluating, so that no later error loses the training. */
  if (rc == 0 && save_now(t, o->steps) != REMAT_OK)
    rc = signals_stop() != 0 ? stopped(t, signals_stop(), o->steps, 0)
                             : fail("");
  else if (rc == 0 && signals_stop() != 0) /* it came during the save */
    rc = stopped(t, signals_stop(), o->steps, 1);
  signals_catch(0);
  if (rc == 0 && dp_tool_rank() == 0 && lora_merge(t->g, o) != REMAT_OK)
    rc = fail("--merge-lora: ");
  if (rc == 0)
    rc = report(t, now() - start);
  return rc;
}

int main(int argc, char **argv) {
  trainer t;
  memset(&t, 0, sizeof t);
  t.best_step = -1;
  if (dp_tool_init(&argc, &argv, "remat-train") != 0)
    return EXIT_RUNTIME;
  int rc = options_parse(argc, argv, &t.o);
  if (rc != 0) {
    dp_tool_finalize();
    return rc < 0 ? 0 : rc;
  }
  rc = run(&t);
  dp_tool_abort_on_failure(rc); /* under mpirun: dp_tool.h */
  close_trainer(&t);
  dp_tool_finalize();
  return rc;
}
