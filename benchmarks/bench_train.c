/* bench_train: training-step benchmark of the GPT-style model. Reports the
 * median step time after a warm-up, the runtime's memory peaks, the process's
 * peak RSS, and model FLOP utilization against oneDNN's own f32 matmul
 * throughput measured in the same process on the same thread count. */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "remat.h"
#include "tools/dp_tool.h"

typedef struct options {
  remat_gpt_config cfg;
  int steps, threads;
  const char *policy;
  int64_t budget;
  int json;
} options;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* oneDNN's f32 matmul, 2048x512 by 512x2048, run by oneDNN's own OpenMP
 * parallelization on the benchmark's thread count: the roofline of model
 * FLOP/s. It is measured between the timed steps, so that both see the same
 * machine (this one is shared and noisy). */
typedef struct roofline {
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;
  dnnl_memory_t mem[3];
  float *buf[3];
  int threads;
  double flops;
} roofline;

static int roofline_open(roofline *r, int threads) {
  const dnnl_dim_t m = 2048, k = 512, n = 2048;
  memset(r, 0, sizeof *r);
  r->threads = threads;
  r->flops = 2.0 * (double)m * (double)k * (double)n;
  int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  dnnl_memory_desc_t md[3];
  dnnl_dims_t dims[3] = {{m, k}, {k, n}, {m, n}};
  for (int i = 0; i < 3; i++)
    dnnl_memory_desc_init_by_tag(&md[i], 2, dims[i], dnnl_f32, dnnl_ab);
  dnnl_matmul_desc_t desc;
  int ok = dnnl_engine_create(&r->eng, dnnl_cpu, 0) == dnnl_success &&
           dnnl_stream_create(&r->stream, r->eng, dnnl_stream_default_flags) ==
               dnnl_success &&
           dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]) ==
               dnnl_success &&
           dnnl_primitive_desc_create(&r->pd, &desc, NULL, r->eng, NULL) ==
               dnnl_success &&
           dnnl_primitive_create(&r->prim, r->pd) == dnnl_success;
  for (int i = 0; ok && i < 3; i++) {
    size_t count = (size_t)(dims[i][0] * dims[i][1]);
    r->buf[i] = malloc(count * sizeof(float));
    ok = r->buf[i] != NULL &&
         dnnl_memory_create(&r->mem[i], &md[i], r->eng, r->buf[i]) == dnnl_success;
    for (size_t j = 0; ok && j < count; j++)
      r->buf[i][j] = (float)(j % 7) * 0.1f;
  }
  omp_set_num_threads(saved);
  return ok;
}

/* GFLOP/s: the median of a few runs. */
static double roofline_measure(roofline *r, int runs) {
  int saved = omp_get_max_threads();
  omp_set_num_threads(r->threads);
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, r->mem[0]},
                             {DNNL_ARG_WEIGHTS, r->mem[1]},
                             {DNNL_ARG_DST, r->mem[2]}};
  double times[16];
  runs = runs > 16 ? 16 : runs;
  for (int i = -1; i < runs; i++) {
    double t0 = now();
    dnnl_primitive_execute(r->prim, r->stream, 3, args);
    dnnl_stream_wait(r->stream);
    if (i >= 0)
      times[i] = now() - t0;
  }
  omp_set_num_threads(saved);
  return r->flops / median(times, runs) * 1e-9;
}

static void roofline_close(roofline *r) {
  for (int i = 0; i < 3; i++) {
    if (r->mem[i])
      dnnl_memory_destroy(r->mem[i]);
    free(r->buf[i]);
  }
  if (r->prim)
    dnnl_primitive_destroy(r->prim);
  if (r->pd)
    dnnl_primitive_desc_destroy(r->pd);
  if (r->stream)
    dnnl_stream_destroy(r->stream);
  if (r->eng)
    dnnl_engine_destroy(r->eng);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_train [--layers L] [--d-model D] [--heads H] [--seq T]\n"
          "                   [--batch B] [--vocab V] [--steps S] [--threads N]\n"
          "                   [--policy P] [--budget BYTES] [--json]\n"
          "defaults: L=8 D=512 H=8 T=256 B=8 V=256 S=6 N=2 P=everything_saveable\n");
}

static int parse_int(const char *opt, const char *v, int *out) {
  char *end;
  long x = strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || x < 1 || x > 1000000) {
    fprintf(stderr, "bench_train: %s '%s': expected a whole number >= 1\n", opt, v);
    return 0;
  }
  *out = (int)x;
  return 1;
}

static int parse_args(int argc, char **argv, options *o) {
  static const struct option longopts[] = {
      {"layers", 1, 0, 'L'}, {"d-model", 1, 0, 'D'}, {"heads", 1, 0, 'H'},
      {"seq", 1, 0, 'T'},    {"batch", 1, 0, 'B'},   {"vocab", 1, 0, 'V'},
      {"steps", 1, 0, 'S'},  {"threads", 1, 0, 'N'}, {"policy", 1, 0, 'P'},
      {"budget", 1, 0, 'M'}, {"json", 0, 0, 'j'},    {"help", 0, 0, 'h'},
      {0, 0, 0, 0}};
  *o = (options){.cfg = {.layers = 8, .d_model = 512, .heads = 8, .seq = 256,
                         .batch = 8, .vocab = 256},
                 .steps = 6, .threads = 2, .policy = "everything_saveable"};
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
    case 'L': ok = parse_int("--layers", optarg, &o->cfg.layers); break;
    case 'D': ok = parse_int("--d-model", optarg, &o->cfg.d_model); break;
    case 'H': ok = parse_int("--heads", optarg, &o->cfg.heads); break;
    case 'T': ok = parse_int("--seq", optarg, &o->cfg.seq); break;
    case 'B': ok = parse_int("--batch", optarg, &o->cfg.batch); break;
    case 'V': ok = parse_int("--vocab", optarg, &o->cfg.vocab); break;
    case 'S': ok = parse_int("--steps", optarg, &o->steps); break;
    case 'N': ok = parse_int("--threads", optarg, &o->threads); break;
    case 'P': o->policy = optarg; break;
    case 'M':
      if (remat_parse_bytes(optarg, &o->budget) != REMAT_OK) {
        fprintf(stderr, "bench_train: --budget: %s\n", remat_last_error());
        ok = 0;
      }
      break;
    case 'j': o->json = 1; break;
    case 'h': usage(stdout); exit(0);
    default: ok = 0;
    }
    if (!ok) {
      usage(stderr);
      return 0;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "bench_train: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 0;
  }
  return 1;
}

static uint64_t grad_checksum(remat_graph *g) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    float *buf = malloc(n * sizeof *buf);
    if (buf == NULL || remat_read_grad(g, p, buf, n * sizeof *buf) != REMAT_OK) {
      free(buf);
      continue;
    }
    const unsigned char *b = (const unsigned char *)buf;
    for (size_t k = 0; k < n * sizeof *buf; k++)
      h = (h ^ b[k]) * 1099511628211ull;
    free(buf);
  }
  return h;
}

static void fill_batch(const remat_gpt_config *c, int32_t *tok, int32_t *tgt) {
  uint32_t x = 12345u + 7919u * (uint32_t)dp_tool_rank(); /* rank's shard */
  for (int i = 0; i < c->batch * c->seq; i++) {
    x = x * 1664525u + 1013904223u;
    tok[i] = (int32_t)((x >> 16) % (uint32_t)c->vocab);
  }
  for (int i = 0; i < c->batch * c->seq; i++)
    tgt[i] = (tok[i] * 7 + 3) % c->vocab;
}

static int fail(const char *what) {
  fprintf(stderr, "bench_train: %s: %s\n", what, remat_last_error());
  return 1;
}

int main(int argc, char **argv) {
  options o;
  if (dp_tool_init(&argc, &argv, "bench_train") != 0)
    return 1;
  if (!parse_args(argc, argv, &o))
    return 2;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_MEMORY_BUDGET,
                     .num_threads = o.threads, .policy = o.policy,
                     .memory_budget = o.budget};
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  if (remat_runtime_create(&rc, &rt) != REMAT_OK)
    return fail("runtime");
  if (remat_graph_create(rt, &g) != REMAT_OK)
    return fail("graph");
  if (remat_gpt_build(g, &o.cfg, &m) != REMAT_OK)
    return fail("model");
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-4f, .weight_decay = 0.01f};
  if (dp_tool_attach(g) != REMAT_OK || remat_compile(g, m.loss, &opt) != REMAT_OK)
    return fail("compile");
  size_t n = (size_t)o.cfg.batch * (size_t)o.cfg.seq;
  int32_t *tok = malloc(n * 4), *tgt = malloc(n * 4);
  fill_batch(&o.cfg, tok, tgt);
  remat_feed(g, m.tokens, tok, n * 4);
  remat_feed(g, m.targets, tgt, n * 4);
  roofline roof;
  if (!roofline_open(&roof, o.threads)) {
    fprintf(stderr, "bench_train: cannot create the roofline matmul\n");
    return 1;
  }
  double *times = calloc((size_t)o.steps, sizeof *times);
  double *roofs = calloc((size_t)o.steps, sizeof *roofs);
  remat_step_stats st = {0}, first = {0};
  uint64_t checksum = 0;
  int64_t peak = 0, act_peak = 0;
  for (int s = 0; s <= o.steps; s++) { /* step 0 is the warm-up */
    if (remat_step(g, &st) != REMAT_OK)
      return fail("step");
    if (s == 0) {
      checksum = grad_checksum(g);
      first = st;
      dp_tool_mark(g);
    } else {
      times[s - 1] = st.seconds;
    }
    if (s < o.steps)
      roofs[s] = roofline_measure(&roof, 5);
    if (st.peak_bytes > peak)
      peak = st.peak_bytes;
    if (st.activation_peak_bytes > act_peak)
      act_peak = st.activation_peak_bytes;
  }
  double step_s = median(times, o.steps);
  double roofline = median(roofs, o.steps);
  double flops = remat_gpt_flops(&o.cfg);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double mfu = flops / step_s * 1e-9 / roofline;
  char dp_json[1024];
  dp_tool_json(g, dp_json, sizeof dp_json); /* collective under MPI */
  printf("{\"policy\": \"%s\", \"layers\": %d, \"d_model\": %d, \"heads\": %d, "
         "\"seq\": %d, \"batch\": %d, \"vocab\": %d, \"threads\": %d, "
         "\"steps\": %d, \"step_s_median\": %.6f, \"tokens_per_s\": %.1f, "
         "\"loss\": %.6f, \"first_loss\": %.6f, \"grad_checksum\": \"%016llx\", "
         "\"peak_bytes\": %lld, \"activation_peak_bytes\": %lld, "
         "\"predicted_peak_bytes\": %lld, \"peak_rss_bytes\": %lld, "
         "\"flops_per_step\": %.6g, \"recompute_flops\": %.6g, "
         "\"matmul_roofline_gflops\": %.2f, \"mfu\": %.4f, "
         "\"remote_bytes\": %lld, \"remote_bytes_unplaced\": %lld%s}\n",
         o.policy, o.cfg.layers, o.cfg.d_model, o.cfg.heads, o.cfg.seq,
         o.cfg.batch, o.cfg.vocab, o.threads, o.steps, step_s,
         (double)n / step_s, st.loss, first.loss,
         (unsigned long long)checksum, (long long)peak, (long long)act_peak,
         (long long)st.predicted_peak_bytes, (long long)ru.ru_maxrss * 1024,
         flops, st.recompute_flops, roofline, mfu, (long long)st.remote_bytes,
         (long long)st.remote_bytes_unplaced, dp_json);
  free(times);
  free(roofs);
  roofline_close(&roof);
  free(tok);
  free(tgt);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  dp_tool_finalize();
  return 0;
}
