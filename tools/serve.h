/* Declarations shared by the files of remat-serve, the HTTP server that
 * embeds one runtime: it generates from the model of --load (batching
 * concurrent requests into one forward pass) and runs fine-tuning jobs on
 * their own graphs of the same runtime. */
#ifndef REMAT_TOOLS_SERVE_H
#define REMAT_TOOLS_SERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "tools/train.h"

/* ---- request bodies (serve_json.c) ---- */

/* What the model's tokens are, for prompts given as text. */
typedef enum serve_format {
  FORMAT_ADDITION = 0, /* digits, + and = */
  FORMAT_BYTES = 1,    /* a text's bytes */
  FORMAT_U16 = 2       /* ids only */
} serve_format;

typedef struct serve_limits {
  int vocab;
  serve_format format;
  int max_tokens; /* the most tokens a request may ask for */
} serve_limits;

typedef struct gen_params {
  int32_t *prompt; /* malloc'd */
  int n;
  int max_tokens;  /* default 16, or --max-tokens when lower */
  float temperature; /* default 0: greedy */
  int top_k;       /* 0: every token */
  uint64_t seed;   /* default 1 */
} gen_params;

/* A fine-tuning job's request (POST /v1/jobs); strings are malloc'd. */
typedef struct job_params {
  char *data;      /* a file on the server, required */
  int steps;       /* required, 1 to 1000000 */
  float lr;        /* default 0.0003 */
  char *policy;    /* the job graph's default policy; NULL: the server's */
  int64_t budget;  /* the job graph's budget in bytes, 0: none;
                      REMAT_RUNTIME_BUDGET (-1, no "budget"): the server's */
  char *save;      /* NULL: none; else the final checkpoint's path */
  int save_every;  /* steps between checkpoints; default 10 */
} job_params;

/* Parses a POST /v1/generate body. Returns 0, or -1 with the message of
 * the 400 response in `err` (what was wrong and what is accepted). */
int parse_generate(const char *body, size_t len, const serve_limits *lim,
                   gen_params *out, char *err, size_t err_len);
void gen_params_free(gen_params *p);
/* The same for POST /v1/jobs. */
int parse_job(const char *body, size_t len, job_params *out, char *err,
              size_t err_len);
void job_params_free(job_params *p);
/* POST /v1/models/load: {"path": FILE} or {"job": ID}; one of them is
 * set (malloc'd) on success. */
int parse_load(const char *body, size_t len, char **path, char **job,
               char *err, size_t err_len);
/* {"error": message} as a malloc'd string. */
char *json_error(const char *message);

/* ---- metrics (serve_metrics.c) ---- */

typedef enum serve_endpoint {
  EP_GENERATE, EP_JOBS_POST, EP_JOBS_GET, EP_JOBS_DELETE, EP_MODELS_LOAD,
  EP_METRICS, EP_HEALTHZ, EP_OTHER, EP_COUNT
} serve_endpoint;

void metrics_request(serve_endpoint ep, int status, double seconds);
/* Appends to the malloc'd *buf (length *len) the counters and histograms
 * in Prometheus' text format; returns -1 when out of memory. */
int metrics_format(char **buf, size_t *len);
/* printf onto a growing buffer, for the gauges of the other files. */
int metrics_printf(char **buf, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- the server ---- */

typedef struct gen_queue gen_queue;
typedef struct job_table job_table;

typedef struct server {
  train_options o;       /* the model of --load, the runtime's options */
  const char *load_path; /* the weights generate starts from (--load) */
  const char *init_dir;  /* or --init's directory (s->o.init its model) */
  int port, max_queue, timeout_s;
  int64_t max_body;
  const char *listen, *job_dir;
  serve_limits limits;
  remat_runtime *rt;
  gen_queue *gen;
  job_table *jobs;
  atomic_int stopping; /* SIGTERM: refuse new work */
} server;

/* ---- generation (serve_generate.c) ---- */

/* Opens the generation graph (rows = the model's --batch) with the weights
 * of s->load_path and starts its thread. Returns 0, or -1 with a message. */
int gen_start(server *s, char *err, size_t err_len);
/* Runs one request: queued, batched with the others, answered when its
 * tokens are done. Returns the HTTP status: 200 with *tokens (malloc'd,
 * prompt and continuation, *n of them) and *seconds, else 503 when the
 * queue is full or the server stops, 500 on a failure, with `err`. */
int gen_run(server *s, const gen_params *p, int32_t **tokens, int *n,
            double *seconds, char *err, size_t err_len);
/* Loads new weights between two forward passes; 0, or -1 with `err`. */
int gen_load(server *s, const char *path, char *err, size_t err_len);
/* Requests waiting or running. */
int gen_depth(server *s);
int64_t gen_peak(server *s);
/* Answers the queued requests with 503 and lets those running finish for
 * at most 5 s more (stop 1), or joins the thread and frees it (stop 2). */
void gen_stop(server *s, int stage);

/* ---- jobs (serve_jobs.c) ---- */

/* Creates the job directory and resumes the jobs it holds that were not
 * finished (a kill -9 or a SIGTERM stopped them). 0, or -1 with err. */
int jobs_start(server *s, char *err, size_t err_len);
/* POST /v1/jobs: 200 with the job's id in `id`, else 4xx/5xx with err. */
int jobs_create(server *s, const job_params *p, char *id, size_t id_len,
                char *err, size_t err_len);
/* GET /v1/jobs/ID: 200 with a malloc'd JSON object, 404 with err. */
int jobs_get(server *s, const char *id, char **json, char *err,
             size_t err_len);
/* DELETE /v1/jobs/ID: cancels it (job_cancel) and waits for its
 * checkpoint; 200 with the job's JSON, 404 or 409 with err. */
int jobs_delete(server *s, const char *id, char **json, char *err,
                size_t err_len);
/* The checkpoint that POST /v1/models/load {"job": ID} serves: 0 with a
 * malloc'd path, else the HTTP status with err. */
int jobs_weights(server *s, const char *id, char **path, char *err,
                 size_t err_len);
/* SIGTERM: every running job stops after its step with a checkpoint and
 * stays resumable (stage 1); joins them all and frees the table (2). */
void jobs_stop(server *s, int stage);
/* Appends the jobs' gauges to a /metrics scrape. */
int jobs_metrics(server *s, char **buf, size_t *len);

/* ---- HTTP (serve_http.c) ---- */

/* Starts the daemon on s->listen:s->port; 0, or -1 with err. */
int http_start(server *s, char *err, size_t err_len);
/* Stops accepting connections (the listening socket is closed). */
void http_quiesce(void);
/* Waits until every request begun is answered, for at most `seconds`. */
void http_drain(double seconds);
/* Closes the connections, waits for their threads, stops the daemon. */
void http_stop(void);

#endif
