/* remat-serve's fine-tuning jobs: each runs on its own thread and its own
 * graph of the server's runtime, from the weights of --load (or --init's,
 * with fresh AdamW moments), on a file's
 * data by remat-train's schedule, data and checkpoints (train_*.c). The job
 * directory holds each job's request, its state and its checkpoint, so a
 * job that a kill -9 or a SIGTERM stopped resumes from its last whole
 * checkpoint when the server starts again. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tools/serve.h"

typedef enum job_state {
  JOB_QUEUED, JOB_RUNNING, JOB_DONE, JOB_CANCELLED, JOB_FAILED,
  JOB_INTERRUPTED, JOB_NSTATES
} job_state;

static const char *const state_names[JOB_NSTATES] = {
    "queued", "running", "done", "cancelled", "failed", "interrupted"};
static const char *const category_names[REMAT_MEM_NUM_CATEGORIES] = {
    "params", "grads", "optimizer", "activations", "recomputed",
    "act_grads", "workspace"};

typedef struct job {
  char id[32];
  job_params p;
  server *s;
  train_options o;
  dataset *d;
  char ckpt[4200]; /* DIR/ID.safetensors */
  pthread_t thread;
  int started;
  atomic_int cancel; /* DELETE: stop at the next task boundary */
  atomic_int stop;   /* SIGTERM: stop at the next step boundary, and stay
                        resumable */
  remat_graph *graph; /* while its thread steps it, under the table's lock */
  /* under the table's lock */
  job_state state;
  int step, first_step, checkpoint_step, finished;
  float *losses;     /* [steps]: those of this process's steps */
  double tokens_per_s, step_s, started_at;
  int64_t peak_bytes, peak[REMAT_MEM_NUM_CATEGORIES];
  char error[512];
} job;

struct job_table {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  job **jobs;
  int n, cap, next_id;
  unsigned long long steps_total;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the job directory ---- */

/* Writes `text` to DIR/ID.SUFFIX whole (a new file renamed over it). */
static int write_file(const job *j, const char *suffix, const char *text) {
  char path[4200], tmp[4300];
  snprintf(path, sizeof path, "%s/%s.%s", j->s->job_dir, j->id, suffix);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (f == NULL)
    return -1;
  int ok = fputs(text, f) >= 0;
  ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok &= fclose(f) == 0;
  if (!ok || rename(tmp, path) != 0) {
    remove(tmp);
    return -1;
  }
  return 0;
}

/* The request as JSON, which parse_job reads back on a restart. */
static char *request_json(const job_params *p) {
  cJSON *o = cJSON_CreateObject();
  if (o == NULL)
    return NULL;
  cJSON_AddStringToObject(o, "data", p->data);
  cJSON_AddNumberToObject(o, "steps", p->steps);
  cJSON_AddNumberToObject(o, "lr", p->lr);
  if (p->policy != NULL)
    cJSON_AddStringToObject(o, "policy", p->policy);
  if (p->budget != REMAT_RUNTIME_BUDGET)
    cJSON_AddNumberToObject(o, "budget", (double)p->budget);
  if (p->save != NULL)
    cJSON_AddStringToObject(o, "save", p->save);
  cJSON_AddNumberToObject(o, "save_every", p->save_every);
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return text;
}

static void set_state(job *j, job_state st) {
  job_table *t = j->s->jobs;
  pthread_mutex_lock(&t->lock);
  j->state = st;
  pthread_cond_broadcast(&t->changed);
  pthread_mutex_unlock(&t->lock);
  char line[32];
  snprintf(line, sizeof line, "%s\n", state_names[st]);
  write_file(j, "state", line);
}

static void job_fail(job *j, const char *fmt, const char *detail) {
  job_table *t = j->s->jobs;
  pthread_mutex_lock(&t->lock);
  snprintf(j->error, sizeof j->error, fmt, detail);
  pthread_mutex_unlock(&t->lock);
  set_state(j, JOB_FAILED);
}

/* ---- running ---- */

/* Stops job `j` (the caller holds the table's lock), which then writes its
 * checkpoint. A DELETE cancels the running step too (remat_cancel: it
 * stops at its next task boundary, changing nothing, so the checkpoint
 * holds the last whole step); a resumable stop (SIGTERM) lets the step
 * finish, so that the data position in the checkpoint is the step's and a
 * restart continues bitwise. */
static void job_cancel(job *j, int resumable) {
  atomic_store(resumable ? &j->stop : &j->cancel, 1);
  if (!resumable && j->graph != NULL)
    remat_cancel(j->graph);
}

static int stopped(job *j) {
  return atomic_load(&j->cancel) || atomic_load(&j->stop);
}

/* The job's own policy and budget on its graph (the server's when it
 * gives none): they are the graph's, so jobs of any policy and budget
 * share the server's runtime. */
static remat_status job_settings(const job *j, remat_graph *g) {
  remat_policy *p = NULL;
  remat_status s = REMAT_OK;
  if (j->p.policy != NULL && (s = remat_policy_parse(j->p.policy, &p)) ==
                                 REMAT_OK)
    s = remat_graph_set_policy(g, p);
  remat_policy_destroy(p);
  return s == REMAT_OK ? remat_graph_set_memory_budget(g, j->p.budget) : s;
}

/* Builds the job's graph, from its checkpoint when there is one (a
 * restart) or else from the weights of --load or --init. */
static int job_open(job *j, remat_graph **g, remat_gpt *m) {
  const train_options *o = &j->o;
  remat_optimizer opt = {.kind = o->optimizer, .lr = o->lr,
                         .weight_decay = o->wd};
  if (remat_graph_create(j->s->rt, g) != REMAT_OK ||
      job_settings(j, *g) != REMAT_OK ||
      remat_graph_seed(*g, o->seed) != REMAT_OK ||
      (o->init != NULL ? train_build(*g, o, o->cfg.batch, m)
                       : remat_gpt_build(*g, &o->cfg, m)) != REMAT_OK ||
      remat_compile(*g, m->loss, &opt) != REMAT_OK ||
      remat_set_clip(*g, o->clip) != REMAT_OK) {
    job_fail(j, "building the job's graph: %s", remat_last_error());
    return -1;
  }
  if (access(j->ckpt, F_OK) == 0) {
    static const char *const keys[] = {"train.step", "data.rng"};
    uint64_t v[2];
    if (remat_load_checkpoint(*g, j->ckpt, keys, v, 2) != REMAT_OK) {
      job_fail(j, "resuming from its checkpoint: %s", remat_last_error());
      return -1;
    }
    j->first_step = j->step = j->checkpoint_step = (int)v[0];
    j->d->rng = v[1];
  } else if (o->init != NULL && hf_load(*g, o->init) != REMAT_OK) {
    job_fail(j, "loading the weights of --init: %s", remat_last_error());
    return -1;
  } else if (o->init == NULL &&
             remat_load_safetensors(*g, j->s->load_path) != REMAT_OK) {
    job_fail(j, "loading the weights of --load: %s", remat_last_error());
    return -1;
  }
  return 0;
}

/* One step at the schedule's rate: --accum micro-batches (as remat-train). */
static remat_status job_step(job *j, remat_graph *g, const remat_gpt *m,
                             int32_t *tokens, int32_t *targets,
                             remat_step_stats *st) {
  const train_options *o = &j->o;
  size_t n = (size_t)o->cfg.batch * (size_t)o->cfg.seq;
  double loss = 0.0;
  remat_status s = REMAT_OK;
  for (int k = 0; k < o->accum && s == REMAT_OK; k++) {
    dataset_batch(j->d, o->cfg.batch, o->cfg.seq, tokens, targets);
    int last = k == o->accum - 1;
    s = remat_feed(g, m->tokens, tokens, n * sizeof *tokens);
    if (s == REMAT_OK)
      s = remat_feed(g, m->targets, targets, n * sizeof *targets);
    if (s == REMAT_OK)
      s = remat_set_lr(g, train_lr_at(o, j->step));
    if (s == REMAT_OK)
      s = last ? remat_step(g, st) : remat_accumulate(g, st);
    loss += st->loss;
  }
  st->loss = (float)(loss / o->accum);
  return s;
}

/* A full checkpoint (weights, moments, the step and the data's position).
 * An --init model's holds no remat-train model metadata (train.meta and
 * model.*, which describe remat's GPT): the restart's --init DIR gives the
 * model, as remat-train --init DIR --load FILE takes it. */
static int save(job *j, remat_graph *g, const char *path, int step) {
  static const char *const keys[] = {"train.step", "data.rng"};
  uint64_t v[2] = {(uint64_t)step, j->d->rng};
  remat_status st = j->o.init != NULL
                        ? remat_save_checkpoint(g, path, keys, v, 2)
                        : checkpoint_save(j->s->rt, g, &j->o, path, step,
                                          j->d);
  if (st != REMAT_OK) {
    job_fail(j, "writing its checkpoint: %s", remat_last_error());
    return -1;
  }
  return 0;
}

static void *job_thread(void *arg) {
  job *j = arg;
  job_table *t = j->s->jobs;
  remat_graph *g = NULL;
  remat_gpt m;
  size_t n = (size_t)j->o.cfg.batch * (size_t)j->o.cfg.seq;
  int32_t *tokens = malloc(n * sizeof *tokens);
  int32_t *targets = malloc(n * sizeof *targets);
  if (tokens == NULL || targets == NULL)
    job_fail(j, "out of memory%s", "");
  else if (job_open(j, &g, &m) == 0) {
    pthread_mutex_lock(&t->lock);
    j->graph = g;
    if (atomic_load(&j->cancel)) /* a DELETE while it was opening */
      remat_cancel(g);
    pthread_mutex_unlock(&t->lock);
    set_state(j, JOB_RUNNING);
    double start = now();
    int rc = 0;
    while (rc == 0 && j->step < j->p.steps && !stopped(j)) {
      remat_step_stats st = {.size = sizeof st};
      remat_status s = job_step(j, g, &m, tokens, targets, &st);
      if (s == REMAT_ERR_CANCELLED) /* a DELETE: nothing changed */
        break;
      if (s != REMAT_OK) {
        job_fail(j, "step failed: %s", remat_last_error());
        rc = -1;
        break;
      }
      pthread_mutex_lock(&t->lock);
      j->losses[j->step] = st.loss;
      j->step++;
      t->steps_total++;
      double here = now() - start;
      j->step_s = here / (j->step - j->first_step);
      j->tokens_per_s = (double)n * j->o.accum / j->step_s;
      if (st.peak_bytes > j->peak_bytes)
        j->peak_bytes = st.peak_bytes;
      for (int c = 0; c < REMAT_MEM_NUM_CATEGORIES; c++)
        if (st.peak[c] > j->peak[c])
          j->peak[c] = st.peak[c];
      int every = j->p.save_every;
      pthread_mutex_unlock(&t->lock);
      if (every > 0 && j->step % every == 0 && j->step < j->p.steps &&
          (rc = save(j, g, j->ckpt, j->step)) == 0) {
        pthread_mutex_lock(&t->lock);
        j->checkpoint_step = j->step;
        pthread_mutex_unlock(&t->lock);
      }
    }
    if (rc == 0 && (rc = save(j, g, j->ckpt, j->step)) == 0) {
      pthread_mutex_lock(&t->lock);
      j->checkpoint_step = j->step;
      pthread_mutex_unlock(&t->lock);
    }
    if (rc == 0 && j->step == j->p.steps && j->p.save != NULL)
      rc = save(j, g, j->p.save, j->step);
    if (rc == 0)
      set_state(j, j->step == j->p.steps
                       ? JOB_DONE
                       : atomic_load(&j->cancel) ? JOB_CANCELLED
                                                 : JOB_INTERRUPTED);
  }
  pthread_mutex_lock(&t->lock);
  j->graph = NULL;
  pthread_mutex_unlock(&t->lock);
  remat_graph_destroy(g);
  free(tokens);
  free(targets);
  /* its data (up to 1 GiB of a file) is not kept for the server's life:
   * a finished job's state and losses are all that GET reads */
  dataset_destroy(j->d);
  j->d = NULL;
  pthread_mutex_lock(&t->lock);
  j->finished = 1;
  pthread_cond_broadcast(&t->changed);
  pthread_mutex_unlock(&t->lock);
  return NULL;
}

/* ---- the table ---- */

static void job_free(job *j) {
  job_params_free(&j->p);
  dataset_destroy(j->d);
  free(j->losses);
  free(j);
}

/* The job's options: the server's model and training defaults with the
 * request's data, steps and rate; its data opened. 0, or the HTTP status
 * with err. */
static int job_prepare(server *s, job *j, char *err, size_t err_len) {
  const job_params *p = &j->p;
  if (strcmp(p->data, "-") == 0) {
    snprintf(err, err_len, "'data' is '-': give the path of a file on the "
             "server (the server's standard input is not a job's data)");
    return 400;
  }
  if (p->policy != NULL) { /* the job's graph takes it (job_open) */
    remat_policy *want = NULL;
    remat_status st = remat_policy_parse(p->policy, &want);
    remat_policy_destroy(want);
    if (st != REMAT_OK) {
      snprintf(err, err_len, "'policy': %s", remat_last_error());
      return 400;
    }
  }
  j->o = s->o;
  j->o.data_path = p->data;
  j->o.tokens_only = 0;
  j->o.steps = p->steps;
  j->o.lr = p->lr;
  j->o.save_every = p->save_every;
  j->o.schedule_steps = 0;
  j->o.segment.decay_from = -1;
  char why[512];
  j->d = dataset_open(&j->o, why, sizeof why);
  if (j->d == NULL) {
    snprintf(err, err_len, "'data': %s", why);
    return 400;
  }
  if (dataset_vocab(j->d) != s->o.cfg.vocab) {
    snprintf(err, err_len, "'data' '%.200s' has a vocabulary of %d tokens: "
             "the model has %d", p->data, dataset_vocab(j->d),
             s->o.cfg.vocab);
    return 400;
  }
  j->losses = calloc((size_t)p->steps, sizeof *j->losses);
  if (j->losses == NULL) {
    snprintf(err, err_len, "out of memory for %d steps", p->steps);
    return 500;
  }
  return 0;
}

/* Adds job `j` (its id set) to the table and starts it. */
static int job_launch(server *s, job *j, char *err, size_t err_len) {
  job_table *t = s->jobs;
  j->s = s;
  j->started_at = now();
  snprintf(j->ckpt, sizeof j->ckpt, "%s/%s.safetensors", s->job_dir, j->id);
  pthread_mutex_lock(&t->lock);
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 8;
    job **grown = realloc(t->jobs, (size_t)cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&t->lock);
      snprintf(err, err_len, "out of memory");
      return 500;
    }
    t->jobs = grown;
    t->cap = cap;
  }
  t->jobs[t->n++] = j;
  pthread_mutex_unlock(&t->lock);
  if (pthread_create(&j->thread, NULL, job_thread, j) != 0) {
    job_fail(j, "cannot start its thread%s", "");
    pthread_mutex_lock(&t->lock);
    j->finished = 1;
    pthread_mutex_unlock(&t->lock);
    return 0;
  }
  j->started = 1;
  return 0;
}

int jobs_create(server *s, const job_params *p, char *id, size_t id_len,
                char *err, size_t err_len) {
  job_table *t = s->jobs;
  if (atomic_load(&s->stopping)) {
    snprintf(err, err_len, "the server is shutting down: send no more "
             "requests");
    return 503;
  }
  job *j = calloc(1, sizeof *j);
  if (j == NULL) {
    snprintf(err, err_len, "out of memory");
    return 500;
  }
  j->p = *p;
  j->p.data = strdup(p->data);
  j->p.policy = p->policy != NULL ? strdup(p->policy) : NULL;
  j->p.save = p->save != NULL ? strdup(p->save) : NULL;
  int status = job_prepare(s, j, err, err_len);
  if (status != 0) {
    job_free(j);
    return status;
  }
  pthread_mutex_lock(&t->lock);
  snprintf(j->id, sizeof j->id, "job-%d", t->next_id++);
  pthread_mutex_unlock(&t->lock);
  j->s = s;
  char *req = request_json(&j->p);
  if (req == NULL || write_file(j, "request", req) != 0) {
    snprintf(err, err_len, "cannot write the job's request into --job-dir "
             "'%s': %s", s->job_dir, strerror(errno));
    free(req);
    job_free(j);
    return 500;
  }
  free(req);
  set_state(j, JOB_QUEUED);
  snprintf(id, id_len, "%s", j->id);
  return job_launch(s, j, err, err_len);
}

static job *find(job_table *t, const char *id) {
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->jobs[i]->id, id) == 0)
      return t->jobs[i];
  return NULL;
}

static int not_found(const char *id, char *err, size_t err_len) {
  snprintf(err, err_len, "no job '%.64s': ids are those POST /v1/jobs "
           "returned", id);
  return 404;
}

/* The job's JSON, under the table's lock. */
static char *describe(const job *j) {
  cJSON *o = cJSON_CreateObject();
  if (o == NULL)
    return NULL;
  cJSON_AddStringToObject(o, "id", j->id);
  cJSON_AddStringToObject(o, "state", state_names[j->state]);
  cJSON_AddNumberToObject(o, "step", j->step);
  cJSON_AddNumberToObject(o, "steps", j->p.steps);
  cJSON_AddNumberToObject(o, "first_step", j->first_step);
  if (j->step > j->first_step)
    cJSON_AddNumberToObject(o, "loss", j->losses[j->step - 1]);
  else
    cJSON_AddNullToObject(o, "loss");
  cJSON *l = cJSON_AddArrayToObject(o, "losses");
  for (int i = j->first_step; i < j->step && l != NULL; i++)
    cJSON_AddItemToArray(l, cJSON_CreateNumber(j->losses[i]));
  cJSON_AddNumberToObject(o, "tokens_per_s", j->tokens_per_s);
  cJSON_AddNumberToObject(o, "peak_bytes", (double)j->peak_bytes);
  cJSON *pk = cJSON_AddObjectToObject(o, "peak");
  for (int c = 0; c < REMAT_MEM_NUM_CATEGORIES && pk != NULL; c++)
    cJSON_AddNumberToObject(pk, category_names[c], (double)j->peak[c]);
  int running = j->state == JOB_RUNNING || j->state == JOB_QUEUED;
  if (running && j->step > j->first_step)
    cJSON_AddNumberToObject(o, "eta_s", j->step_s * (j->p.steps - j->step));
  else
    cJSON_AddNullToObject(o, "eta_s");
  cJSON_AddNumberToObject(o, "checkpoint_step", j->checkpoint_step);
  cJSON_AddStringToObject(o, "checkpoint", j->ckpt);
  if (j->error[0] != '\0')
    cJSON_AddStringToObject(o, "error", j->error);
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return text;
}

int jobs_get(server *s, const char *id, char **json, char *err,
             size_t err_len) {
  job_table *t = s->jobs;
  pthread_mutex_lock(&t->lock);
  job *j = find(t, id);
  *json = j != NULL ? describe(j) : NULL;
  pthread_mutex_unlock(&t->lock);
  if (j == NULL)
    return not_found(id, err, err_len);
  if (*json == NULL) {
    snprintf(err, err_len, "out of memory");
    return 500;
  }
  return 200;
}

int jobs_delete(server *s, const char *id, char **json, char *err,
                size_t err_len) {
  job_table *t = s->jobs;
  pthread_mutex_lock(&t->lock);
  job *j = find(t, id);
  if (j == NULL) {
    pthread_mutex_unlock(&t->lock);
    return not_found(id, err, err_len);
  }
  if (j->finished) {
    snprintf(err, err_len, "job '%s' is %s: only a queued or running job "
             "can be cancelled", j->id, state_names[j->state]);
    pthread_mutex_unlock(&t->lock);
    return 409;
  }
  job_cancel(j, 0);
  while (!j->finished)
    pthread_cond_wait(&t->changed, &t->lock);
  *json = describe(j);
  pthread_mutex_unlock(&t->lock);
  return *json != NULL ? 200 : 500;
}

int jobs_weights(server *s, const char *id, char **path, char *err,
                 size_t err_len) {
  job_table *t = s->jobs;
  pthread_mutex_lock(&t->lock);
  job *j = find(t, id);
  int status = 0;
  *path = NULL;
  if (j == NULL)
    status = not_found(id, err, err_len);
  else if (!j->finished || j->state == JOB_FAILED) {
    snprintf(err, err_len, "job '%s' is %s: its weights can be loaded once "
             "it is done or cancelled", j->id, state_names[j->state]);
    status = 409;
  } else {
    *path = strdup(j->state == JOB_DONE && j->p.save != NULL ? j->p.save
                                                              : j->ckpt);
    if (*path == NULL) {
      snprintf(err, err_len, "out of memory");
      status = 500;
    }
  }
  pthread_mutex_unlock(&t->lock);
  return status;
}

/* ---- start and stop ---- */

/* Reads a small file whole (malloc'd, NUL-ended); NULL if it cannot. */
static char *read_small(const char *path, size_t *len) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return NULL;
  char *buf = malloc(65537);
  *len = buf != NULL ? fread(buf, 1, 65536, f) : 0;
  fclose(f);
  if (buf != NULL)
    buf[*len] = '\0';
  return buf;
}

/* Resumes job `id` of the directory when its state says it was stopped
 * before its end. */
static void resume_one(server *s, const char *id) {
  char path[4200], err[512];
  size_t len;
  snprintf(path, sizeof path, "%s/%s.state", s->job_dir, id);
  char *state = read_small(path, &len);
  int again = state != NULL && (strncmp(state, "queued", 6) == 0 ||
                                strncmp(state, "running", 7) == 0 ||
                                strncmp(state, "interrupted", 11) == 0);
  free(state);
  if (!again)
    return;
  snprintf(path, sizeof path, "%s/%s.request", s->job_dir, id);
  char *req = read_small(path, &len);
  job *j = calloc(1, sizeof *j);
  if (req == NULL || j == NULL || parse_job(req, len, &j->p, err,
                                            sizeof err) != 0) {
    fprintf(stderr, "remat-serve: job '%s' cannot be resumed: its request "
            "'%s' cannot be read\n", id, path);
    free(req);
    free(j);
    return;
  }
  free(req);
  snprintf(j->id, sizeof j->id, "%s", id);
  j->s = s;
  if (job_prepare(s, j, err, sizeof err) != 0) {
    fprintf(stderr, "remat-serve: job '%s' cannot be resumed: %s\n", id, err);
    job_free(j);
    return;
  }
  fprintf(stderr, "remat-serve: resuming job '%s'\n", id);
  job_launch(s, j, err, sizeof err);
}

int jobs_start(server *s, char *err, size_t err_len) {
  job_table *t = calloc(1, sizeof *t);
  if (t == NULL) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  s->jobs = t;
  pthread_mutex_init(&t->lock, NULL);
  pthread_cond_init(&t->changed, NULL);
  t->next_id = 1;
  if (mkdir(s->job_dir, 0777) != 0 && errno != EEXIST) {
    snprintf(err, err_len, "--job-dir '%s': %s", s->job_dir,
             strerror(errno));
    return -1;
  }
  DIR *dir = opendir(s->job_dir);
  if (dir == NULL) {
    snprintf(err, err_len, "--job-dir '%s': %s", s->job_dir,
             strerror(errno));
    return -1;
  }
  /* ids in order, so that resumed jobs keep their numbers */
  int ids[4096], n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL && n < 4096) {
    int k, used = 0;
    if (sscanf(e->d_name, "job-%d.request%n", &k, &used) == 1 &&
        e->d_name[used] == '\0' && k > 0) {
      ids[n++] = k;
      if (k >= t->next_id)
        t->next_id = k + 1;
    }
  }
  closedir(dir);
  for (int i = 1; i < n; i++)
    for (int k = i; k > 0 && ids[k - 1] > ids[k]; k--) {
      int x = ids[k];
      ids[k] = ids[k - 1];
      ids[k - 1] = x;
    }
  for (int i = 0; i < n; i++) {
    char id[32];
    snprintf(id, sizeof id, "job-%d", ids[i]);
    resume_one(s, id);
  }
  return 0;
}

void jobs_stop(server *s, int stage) {
  job_table *t = s->jobs;
  if (t == NULL)
    return;
  pthread_mutex_lock(&t->lock);
  for (int i = 0; i < t->n; i++)
    job_cancel(t->jobs[i], 1);
  pthread_mutex_unlock(&t->lock);
  if (stage < 2)
    return;
  for (int i = 0; i < t->n; i++) {
    if (t->jobs[i]->started)
      pthread_join(t->jobs[i]->thread, NULL);
    job_free(t->jobs[i]);
  }
  free(t->jobs);
  pthread_mutex_destroy(&t->lock);
  pthread_cond_destroy(&t->changed);
  free(t);
  s->jobs = NULL;
}

int jobs_metrics(server *s, char **buf, size_t *len) {
  job_table *t = s->jobs;
  int count[JOB_NSTATES] = {0}, rc = 0;
  pthread_mutex_lock(&t->lock);
  for (int i = 0; i < t->n; i++)
    count[t->jobs[i]->state]++;
  rc |= metrics_printf(buf, len, "# HELP remat_jobs Jobs by state.\n"
                       "# TYPE remat_jobs gauge\n");
  for (int k = 0; k < JOB_NSTATES; k++)
    rc |= metrics_printf(buf, len, "remat_jobs{state=\"%s\"} %d\n",
                         state_names[k], count[k]);
  rc |= metrics_printf(buf, len, "# HELP remat_job_steps_total Training "
                       "steps done by this process's jobs.\n# TYPE "
                       "remat_job_steps_total counter\nremat_job_steps_total "
                       "%llu\n", t->steps_total);
  rc |= metrics_printf(buf, len, "# HELP remat_job_tokens_per_second A "
                       "job's training tokens per second.\n# TYPE "
                       "remat_job_tokens_per_second gauge\n");
  for (int i = 0; i < t->n; i++)
    rc |= metrics_printf(buf, len, "remat_job_tokens_per_second{job=\"%s\"} "
                         "%.1f\n", t->jobs[i]->id, t->jobs[i]->tokens_per_s);
  rc |= metrics_printf(buf, len, "# HELP remat_job_peak_bytes A job's peak "
                       "memory by category.\n# TYPE remat_job_peak_bytes "
                       "gauge\n");
  for (int i = 0; i < t->n; i++)
    for (int c = 0; c < REMAT_MEM_NUM_CATEGORIES; c++)
      rc |= metrics_printf(buf, len, "remat_job_peak_bytes{job=\"%s\","
                           "category=\"%s\"} %lld\n", t->jobs[i]->id,
                           category_names[c],
                           (long long)t->jobs[i]->peak[c]);
  pthread_mutex_unlock(&t->lock);
  return rc != 0 ? -1 : 0;
}
