/* remat-serve, an HTTP server that embeds one remat runtime: it generates
 * from the model of --load (or of --init's Hugging Face directory) and
 * runs fine-tuning jobs on the same runtime
 * (serve_*.c); this file reads the command line (remat-train's model
 * options, through train_options.c, and the server's own), starts the
 * parts and stops them on SIGTERM or SIGINT: no new connections, queued
 * requests answered 503, running ones finished, jobs checkpointed (and
 * resumed by the next start with the same --job-dir), exit 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/serve.h"

static void usage(FILE *f) {
  fprintf(f,
"usage: remat-serve --load FILE [remat-train's model options] [options]\n"
"       remat-serve --init DIR [--seq N] [--batch N] [options]\n"
"Serves the model of FILE (a remat-train checkpoint or safetensors file)\n"
"or of DIR over HTTP: POST /v1/generate, POST /v1/jobs, GET and DELETE\n"
"/v1/jobs/ID, POST /v1/models/load, GET /metrics, GET /healthz (README.md,\n"
"\"remat-serve\").\n"
"\n"
"  --init DIR       serve a pre-trained model as Hugging Face writes it\n"
"                   (config.json with model_type llama or gpt2, and\n"
"                   model.safetensors or its index), as remat-train --init\n"
"                   reads it; prompts are token ids, and a job's data is a\n"
"                   token file (u16, or u32 for a vocabulary over 65536\n"
"                   ids). A job starts from DIR's weights with fresh AdamW\n"
"                   moments; its checkpoints are full ones (weights and\n"
"                   moments), which a restart with the same --init and\n"
"                   --job-dir resumes. --load and --init exclude each other\n"
"  --port P         TCP port (default 8080; 0: any free one, printed)\n"
"  --listen ADDR    IPv4 address to listen on (default 127.0.0.1)\n"
"  --threads N      the runtime's worker threads (default: the cores)\n"
"  --max-queue Q    generate requests waiting or running at once; more get\n"
"                   503 with Retry-After (default 64)\n"
"  --max-body B     the largest request body in bytes; larger ones get 413\n"
"                   (default 1048576)\n"
"  --max-tokens N   the most tokens a request may generate (default 256)\n"
"  --timeout S      seconds a connection may stay idle, a slow body\n"
"                   included (default 30)\n"
"  --job-dir DIR    where jobs keep their requests, states and checkpoints;\n"
"                   unfinished jobs found there are resumed (default\n"
"                   remat-serve-jobs)\n"
"  --policy P, --budget B, --precision P  the runtime's, as remat-train's;\n"
"                   a job's \"policy\" and \"budget\" override the first two\n"
"                   for its graph\n");
}

/* A server option's value as an integer in [lo, hi]; -1 after a message. */
static int int_value(const char *name, const char *text, long long lo,
                     long long hi, long long *out) {
  char *end;
  long long v = strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "remat-serve: %s '%s': expected an integer from %lld to "
            "%lld\n", name, text, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

/* Takes the server's own options out of argv (the rest are remat-train's);
 * returns 0, -1 after --help, EXIT_USAGE after a message. */
static int server_options(server *s, int *argc, char **argv) {
  static const char *const names[] = {"--port", "--listen", "--max-queue",
                                      "--max-body", "--max-tokens",
                                      "--timeout", "--job-dir", "--init",
                                      NULL};
  int kept = 1;
  for (int i = 1; i < *argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return -1;
    }
    int k = 0;
    while (names[k] != NULL && strcmp(argv[i], names[k]) != 0)
      k++;
    if (names[k] == NULL) {
      argv[kept++] = argv[i];
      continue;
    }
    if (i + 1 == *argc) {
      fprintf(stderr, "remat-serve: %s needs a value\n", names[k]);
      return EXIT_USAGE;
    }
    const char *v = argv[++i];
    long long x = 0;
    int rc = 0;
    switch (k) {
    case 0: rc = int_value("--port", v, 0, 65535, &x); s->port = (int)x; break;
    case 1: s->listen = v; break;
    case 2:
      rc = int_value("--max-queue", v, 1, 100000, &x);
      s->max_queue = (int)x;
      break;
    case 3:
      rc = int_value("--max-body", v, 16, 1LL << 30, &x);
      s->max_body = x;
      break;
    case 4:
      rc = int_value("--max-tokens", v, 1, 1000000, &x);
      s->limits.max_tokens = (int)x;
      break;
    case 5:
      rc = int_value("--timeout", v, 1, 86400, &x);
      s->timeout_s = (int)x;
      break;
    case 6: s->job_dir = v; break;
    default: s->init_dir = v; break;
    }
    if (rc != 0)
      return EXIT_USAGE;
  }
  *argc = kept;
  argv[kept] = NULL;
  return 0;
}

/* --init DIR: the model of its config.json (tools/hf_init.c, as
 * remat-train --init reads it); its weights are loaded by gen_start and
 * the jobs. 0, or an exit status after a message. */
static int init_model(server *s) {
  /* the model comes from config.json: --init is taken out of argv above,
   * so options_parse did not check these against it */
  static const char *const model_opts[] = {"layers", "d-model", "heads",
                                           "vocab", "model", "kv-heads",
                                           "ffn", NULL};
  for (int i = 0; model_opts[i] != NULL; i++)
    if (option_given(&s->o, model_opts[i])) {
      fprintf(stderr, "remat-serve: --%s does not apply to --init: the "
              "model's config.json gives the model\n", model_opts[i]);
      return EXIT_USAGE;
    }
  char err[512];
  s->o.init_dir = s->init_dir;
  int rc = init_prepare(&s->o, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "remat-serve: %s\n", err);
    return rc;
  }
  /* a job's data: token ids as wide as the vocabulary needs */
  s->o.data_u32 = s->o.vocab > 65536;
  return 0;
}

/* The model's options from --load's file or --init's directory, and the
 * tokens of its data. */
static int model_options(server *s, int argc, char **argv) {
  int rc = options_parse(argc, argv, &s->o);
  if (rc != 0)
    return rc;
  if (s->o.load_path != NULL && s->init_dir != NULL) {
    fprintf(stderr, "remat-serve: --load and --init exclude each other: "
            "give --load FILE (a remat-train checkpoint) or --init DIR (a "
            "Hugging Face model directory)\n");
    return EXIT_USAGE;
  }
  if (s->o.load_path == NULL && s->init_dir == NULL) {
    fprintf(stderr, "remat-serve: --load FILE is required: the model to "
            "serve (a remat-train checkpoint), or --init DIR (a Hugging "
            "Face model directory)\n");
    return EXIT_USAGE;
  }
  if (s->init_dir != NULL)
    rc = init_model(s);
  else {
    /* the model is read as --prompt reads it: for sampling, without
     * --data (the tokens of its data alone) */
    s->o.prompt = "";
    rc = checkpoint_options(&s->o);
    s->o.prompt = NULL;
  }
  if (rc != 0)
    return rc;
  char err[512];
  dataset *d = dataset_open(&s->o, err, sizeof err);
  if (d == NULL) {
    fprintf(stderr, "remat-serve: %s\n", err);
    return EXIT_RUNTIME;
  }
  s->o.cfg.vocab = dataset_vocab(d);
  s->limits.vocab = s->o.cfg.vocab;
  s->limits.format = d->addition ? FORMAT_ADDITION
                     : d->u16    ? FORMAT_U16
                                 : FORMAT_BYTES;
  dataset_destroy(d);
  s->load_path = s->o.load_path;
  return 0;
}

static int open_runtime(server *s) {
  const train_options *o = &s->o;
  remat_config rc = {.set = REMAT_SET_MEMORY_BUDGET,
                     .memory_budget = o->budget};
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
  if (remat_runtime_create(&rc, &s->rt) != REMAT_OK) {
    fprintf(stderr, "remat-serve: %s\n", train_last_error());
    return EXIT_RUNTIME;
  }
  return 0;
}

int main(int argc, char **argv) {
  static server s;
  s.port = 8080;
  s.listen = "127.0.0.1";
  s.max_queue = 64;
  s.max_body = 1 << 20;
  s.timeout_s = 30;
  s.job_dir = "remat-serve-jobs";
  s.limits.max_tokens = 256;
  int rc = server_options(&s, &argc, argv);
  if (rc == 0)
    rc = model_options(&s, argc, argv);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  /* Every thread (the runtime's workers, the daemon's, the jobs') inherits
   * this mask: SIGTERM and SIGINT come to sigwait below alone. */
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);
  signal(SIGPIPE, SIG_IGN);
  if ((rc = open_runtime(&s)) != 0)
    return rc;
  char err[1024];
  if (gen_start(&s, err, sizeof err) != 0 ||
      jobs_start(&s, err, sizeof err) != 0 ||
      http_start(&s, err, sizeof err) != 0) {
    fprintf(stderr, "remat-serve: %s\n", err);
    _exit(EXIT_RUNTIME); /* threads may be running: no orderly teardown */
  }
  fprintf(stderr, "remat-serve: listening on %s:%d\n", s.listen, s.port);
  int sig = 0;
  sigwait(&stop, &sig);
  fprintf(stderr, "remat-serve: %s: stopping\n",
          sig == SIGTERM ? "SIGTERM" : "SIGINT");
  atomic_store(&s.stopping, 1);
  http_quiesce();  /* no new connections */
  gen_stop(&s, 1); /* queued requests get 503, running ones finish */
  jobs_stop(&s, 1); /* each job checkpoints after its step */
  http_drain(8.0);  /* every request answered (running ones end in 5 s) */
  http_stop();
  jobs_stop(&s, 2);
  gen_stop(&s, 2);
  remat_runtime_destroy(s.rt);
  fprintf(stderr, "remat-serve: stopped\n");
  return 0;
}
