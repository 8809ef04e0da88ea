/* bench_train: training-step benchmark of the GPT-style model (or, with
 * --model, of the Llama-family model or the bidirectional encoder at the
 * same sizes). Reports the
 * median step time after a warm-up, the runtime's memory peaks, the process's
 * peak RSS, and model FLOP utilization against oneDNN's own matmul
 * throughput (f32, and bf16 for a bf16 run) measured in the same process on
 * the same thread count. */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "base/bf16.h"
#include "benchmarks/bench_util.h"
#include "remat.h"
#include "examples/encoder_model.h"
#include "remat_gpt.h"
#include "remat_llama.h"
#include "tools/dp_tool.h"
#include "tools/json_out.h"

/* The model a run trains. */
typedef enum model_kind { MODEL_GPT, MODEL_LLAMA, MODEL_ENCODER } model_kind;

static const char *const model_names[] = {"gpt", "llama", "encoder"};

typedef struct options {
  remat_gpt_config cfg;
  model_kind model;
  int model_both; /* --model gpt+llama: both side by side */
  int kv_heads;   /* llama: 0 means heads / 4 where it divides, else heads */
  int ffn;        /* llama: 0 means 8d/3 rounded up to a multiple of 64 */
  int steps, threads;
  const char *policy;
  int64_t budget;
  int json, compare_threads;
  int accum; /* micro-batches of --batch rows per update */
  int both;  /* --attention both */
  remat_precision precision;
  int precision_both; /* --precision both */
  int compare_admission; /* --compare-admission */
  int compare_fusion;    /* --compare-fusion */
  int compare_update;    /* --compare-update */
  int compare_dw;        /* --compare-dw */
  int lora_rank;          /* --lora-rank: LoRA beside full fine-tuning */
  const char *lora_targets; /* --lora-targets (NULL: the model's default) */
  int lora_only;          /* --lora-only: no full fine-tuning beside */
  int tied;               /* --tied: llama's head reads the embedding */
} options;

/* oneDNN's matmul, 2048x512 by 512x2048, f32 (or bf16 operands and result
 * with f32 accumulation), run by oneDNN's own OpenMP parallelization on the
 * benchmark's thread count: the roofline of model FLOP/s. It is measured
 * between the timed steps, so that both see the same machine (this one is
 * shared and noisy). */
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

static int roofline_open(roofline *r, int threads, bool bf16) {
  const dnnl_dim_t m = 2048, k = 512, n = 2048;
  memset(r, 0, sizeof *r);
  r->threads = threads;
  r->flops = 2.0 * (double)m * (double)k * (double)n;
  int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  dnnl_memory_desc_t md[3];
  dnnl_dims_t dims[3] = {{m, k}, {k, n}, {m, n}};
  for (int i = 0; i < 3; i++)
    dnnl_memory_desc_init_by_tag(&md[i], 2, dims[i],
                                 bf16 ? dnnl_bf16 : dnnl_f32, dnnl_ab);
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
    for (size_t j = 0; ok && j < count; j++) {
      float v = (float)(j % 7) * 0.1f;
      if (bf16)
        ((uint16_t *)r->buf[i])[j] = bf16_from_f32(v);
      else
        r->buf[i][j] = v;
    }
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
    double t0 = bench_wall_s();
    dnnl_primitive_execute(r->prim, r->stream, 3, args);
    dnnl_stream_wait(r->stream);
    if (i >= 0)
      times[i] = bench_wall_s() - t0;
  }
  omp_set_num_threads(saved);
  return r->flops / bench_median(times, runs) * 1e-9;
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
          "                   [--policy P] [--budget BYTES] [--accum K] [--json]\n"
          "                   [--compare-threads] [--attention fused|materialized|both]\n"
          "                   [--precision f32|bf16|both] [--compare-admission]\n"
          "                   [--compare-fusion] [--compare-update] [--compare-dw]\n"
          "                   [--model gpt|llama|encoder|gpt+llama]\n"
          "                   [--kv-heads KVH] [--ffn I] [--tied]\n"
          "                   [--lora-rank R [--lora-targets L] [--lora-only]]\n"
          "defaults: L=8 D=512 H=8 T=256 B=8 V=256 S=6 N=2 P=everything_saveable\n"
          "--attention: the builder's default (materialized) unless given; both\n"
          "runs the materialized and the fused model in one process, steps\n"
          "interleaved, and prints one JSON line for each\n"
          "--precision: f32 (default) or bf16; both runs the f32 and the bf16\n"
          "model in one process, steps interleaved, one JSON line each, the\n"
          "bf16 line with its ratios to the f32 run\n"
          "--accum K: a step is K micro-batches of B rows (remat_accumulate)\n"
          "and one update; step time and tokens count all K (default 1)\n"
          "--compare-threads: also run the model on 1 thread, in interleaved\n"
          "rounds, and report the speedup of N threads over 1\n"
          "--compare-admission: also run the model without memory admission\n"
          "(the runtime created with REMAT_BENCH_NO_ADMISSION set), in\n"
          "interleaved rounds, and report the step-time ratio; admission\n"
          "bounds at the budget (--budget), else at the predicted peak\n"
          "and 1/REMAT_UNBUDGETED_SLACK of the activation peak\n"
          "--compare-fusion: also run the model without fused epilogues\n"
          "(the runtime created with REMAT_FUSE=0; the main run with\n"
          "REMAT_FUSE=1, or bf16 if so set), in interleaved rounds, and\n"
          "report the step-time\n"
          "ratio\n"
          "--compare-update: also run the model with the optimizer's update,\n"
          "bf16 weight refresh and node copies as separate passes (the\n"
          "runtime created with REMAT_BENCH_SPLIT_UPDATE set), in interleaved\n"
          "rounds, and report the step-time ratio of the one-pass update\n"
          "--compare-dw: also run the model with the weight-gradient products\n"
          "in their form before the shape rule (REMAT_BENCH_DW_KERNEL=strided\n"
          "at compile), in interleaved rounds, and report both MFUs\n"
          "--model: the GPT (default); llama: remat_llama_build at the same\n"
          "d_model, layers, heads, seq, batch and vocab, with KVH key/value\n"
          "heads (default H/4) and a SwiGLU of width I (default 8D/3 rounded\n"
          "up to 64), no biases, untied head; encoder: the bidirectional\n"
          "encoder of examples/encoder_model.h; gpt+llama runs the GPT and\n"
          "the Llama model in one process, steps interleaved, one line each\n"
          "--tied: the Llama's LM head reads the embedding table\n"
          "--lora-rank R: LoRA adapters of rank R (alpha 2R) on L (default\n"
          "q_proj,v_proj; c_attn for the GPT), every other parameter frozen,\n"
          "beside the same model fully fine-tuned, steps interleaved, with\n"
          "the step-time and gradient + optimizer memory ratios;\n"
          "--lora-only: the LoRA model alone\n");
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
      {"accum", 1, 0, 'K'},
      {"compare-threads", 0, 0, 'C'},
      {"attention", 1, 0, 'A'},
      {"precision", 1, 0, 'R'},
      {"compare-admission", 0, 0, 'X'},
      {"compare-fusion", 0, 0, 'F'},
      {"compare-update", 0, 0, 'U'},
      {"compare-dw", 0, 0, 'W'},
      {"model", 1, 0, 'm'},
      {"kv-heads", 1, 0, 'k'},
      {"ffn", 1, 0, 'f'},
      {"lora-rank", 1, 0, 'r'},
      {"lora-targets", 1, 0, 't'},
      {"lora-only", 0, 0, 'o'},
      {"tied", 0, 0, 'e'},
      {0, 0, 0, 0}};
  *o = (options){.cfg = {.layers = 8, .d_model = 512, .heads = 8, .seq = 256,
                         .batch = 8, .vocab = 256},
                 .steps = 6, .threads = 2, .policy = "everything_saveable",
                 .accum = 1};
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
    case 'K': ok = parse_int("--accum", optarg, &o->accum); break;
    case 'N': ok = parse_int("--threads", optarg, &o->threads); break;
    case 'P': o->policy = optarg; break;
    case 'M':
      if (remat_parse_bytes(optarg, &o->budget) != REMAT_OK) {
        fprintf(stderr, "bench_train: --budget: %s\n", remat_last_error());
        ok = 0;
      }
      break;
    case 'j': o->json = 1; break;
    case 'C': o->compare_threads = 1; break;
    case 'X': o->compare_admission = 1; break;
    case 'F': o->compare_fusion = 1; break;
    case 'U': o->compare_update = 1; break;
    case 'W': o->compare_dw = 1; break;
    case 'A':
      if (strcmp(optarg, "fused") == 0)
        o->cfg.attention = REMAT_ATTENTION_FUSED;
      else if (strcmp(optarg, "materialized") == 0)
        o->cfg.attention = REMAT_ATTENTION_MATERIALIZED;
      else if (strcmp(optarg, "both") == 0)
        o->both = 1;
      else {
        fprintf(stderr, "bench_train: --attention '%s': expected fused, "
                        "materialized or both\n", optarg);
        ok = 0;
      }
      break;
    case 'R':
      if (strcmp(optarg, "f32") == 0)
        o->precision = REMAT_PRECISION_F32;
      else if (strcmp(optarg, "bf16") == 0)
        o->precision = REMAT_PRECISION_BF16;
      else if (strcmp(optarg, "both") == 0)
        o->precision_both = 1;
      else {
        fprintf(stderr, "bench_train: --precision '%s': expected f32, bf16 "
                        "or both\n", optarg);
        ok = 0;
      }
      break;
    case 'm':
      if (strcmp(optarg, "gpt+llama") == 0)
        o->model_both = 1;
      else {
        ok = 0;
        for (int m = 0; m < 3; m++)
          if (strcmp(optarg, model_names[m]) == 0) {
            o->model = (model_kind)m;
            ok = 1;
          }
        if (!ok)
          fprintf(stderr, "bench_train: --model '%s': expected gpt, llama, "
                          "encoder or gpt+llama\n", optarg);
      }
      break;
    case 'k': ok = parse_int("--kv-heads", optarg, &o->kv_heads); break;
    case 'f': ok = parse_int("--ffn", optarg, &o->ffn); break;
    case 'r': ok = parse_int("--lora-rank", optarg, &o->lora_rank); break;
    case 't': o->lora_targets = optarg; break;
    case 'o': o->lora_only = 1; break;
    case 'e': o->tied = 1; break;
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
  if (o->both + o->compare_threads + o->precision_both + o->model_both +
          o->compare_admission + o->compare_fusion + o->compare_update +
              o->compare_dw + (o->lora_rank > 0) > 1) {
    fprintf(stderr, "bench_train: --attention both, --precision both, "
                    "--model gpt+llama, --compare-threads, "
                    "--compare-admission, --compare-fusion, --compare-update, "
                    "--compare-dw and --lora-rank exclude each other\n");
    return 0;
  }
  if ((o->lora_targets != NULL || o->lora_only) && o->lora_rank == 0) {
    fprintf(stderr, "bench_train: --lora-targets and --lora-only need "
                    "--lora-rank R\n");
    return 0;
  }
  if (o->kv_heads == 0)
    o->kv_heads = o->cfg.heads % 4 == 0 ? o->cfg.heads / 4 : o->cfg.heads;
  if (o->ffn == 0)
    o->ffn = (8 * o->cfg.d_model / 3 + 63) / 64 * 64;
  return 1;
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

/* One update from `accum` micro-batches (the same fed batch each time):
 * st gets the last one's stats with the summed time and the highest
 * peaks. */
static remat_status accum_step(remat_graph *g, int accum, remat_step_stats *st) {
  double seconds = 0.0;
  int64_t peak = 0, act_peak = 0;
  for (int k = 0; k < accum; k++) {
    remat_status s = k + 1 < accum ? remat_accumulate(g, st) : remat_step(g, st);
    if (s != REMAT_OK)
      return s;
    seconds += st->seconds;
    peak = st->peak_bytes > peak ? st->peak_bytes : peak;
    if (st->activation_peak_bytes > act_peak)
      act_peak = st->activation_peak_bytes;
  }
  st->seconds = seconds;
  st->peak_bytes = peak;
  st->activation_peak_bytes = act_peak;
  return REMAT_OK;
}

static int fail(const char *what) {
  fprintf(stderr, "bench_train: %s: %s\n", what, remat_last_error());
  return 1;
}

/* One model, runtime and roofline at one thread count, with the per-step
 * times and the peaks seen so far. --compare-threads runs two side by side. */
typedef struct bench {
  int threads, accum;
  model_kind model;
  remat_gpt_config cfg; /* the options' model with this run's attention */
  remat_llama_config llama; /* the same sizes, for --model llama */
  encoder_config enc;       /* and for --model encoder */
  remat_tensor *lengths;    /* the encoder's key lengths (every row full) */
  remat_precision precision;
  int lora;             /* this run has the options' LoRA adapters */
  int64_t grads_opt_peak; /* peak[GRADS] + peak[OPTIMIZER], highest */
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  roofline roof, roof16; /* f32; bf16 in a bf16 run */
  int32_t *tok, *tgt;
  double *times, *roofs, *roofs16;
  remat_step_stats st, first;
  uint64_t checksum;
  int64_t peak, act_peak;
} bench;

/* Builds the run's model on b->g. */
static remat_status build_model(bench *b, const options *o) {
  remat_gpt_config *c = &b->cfg;
  if (b->lora)
    c->lora = (remat_lora_config){.rank = o->lora_rank,
                                  .alpha = 2.0f * (float)o->lora_rank,
                                  .targets = o->lora_targets};
  if (b->model == MODEL_LLAMA) {
    b->llama = (remat_llama_config){.hidden_size = c->d_model,
                                    .intermediate_size = o->ffn,
                                    .num_hidden_layers = c->layers,
                                    .num_attention_heads = c->heads,
                                    .num_key_value_heads = o->kv_heads,
                                    .vocab_size = c->vocab,
                                    .seq = c->seq,
                                    .batch = c->batch,
                                    .tie_word_embeddings = o->tied,
                                    .attention = c->attention,
                                    .lora = c->lora};
    return remat_llama_build(b->g, &b->llama, &b->m);
  }
  if (b->model == MODEL_ENCODER) {
    b->enc = (encoder_config){.layers = c->layers, .d_model = c->d_model,
                              .heads = c->heads, .seq = c->seq,
                              .batch = c->batch, .vocab = c->vocab,
                              .fused = c->attention == REMAT_ATTENTION_FUSED};
    encoder e;
    remat_status s = encoder_build(b->g, &b->enc, NULL, &e);
    b->m = (remat_gpt){.tokens = e.tokens, .targets = e.targets,
                       .logits = e.logits, .loss = e.loss};
    b->lengths = e.lengths;
    return s;
  }
  return remat_gpt_build(b->g, c, &b->m);
}

/* Model FLOPs of one step of run b (one micro-batch). */
static double model_flops(const bench *b) {
  if (b->model == MODEL_LLAMA)
    return remat_llama_flops(&b->llama);
  if (b->model == MODEL_ENCODER)
    return encoder_flops(&b->enc);
  return remat_gpt_flops(&b->cfg);
}

static int bench_open(bench *b, const options *o, int threads,
                      remat_attention_kind attention,
                      remat_precision precision, model_kind model,
                      int lora) {
  memset(b, 0, sizeof *b);
  b->lora = lora;
  b->st.size = sizeof b->st;
  b->threads = threads;
  b->accum = o->accum;
  b->model = model;
  b->cfg = o->cfg;
  b->cfg.attention = attention;
  b->precision = precision;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_MEMORY_BUDGET | REMAT_SET_PRECISION,
                     .num_threads = threads, .policy = o->policy,
                     .memory_budget = o->budget, .precision = precision};
  if (remat_runtime_create(&rc, &b->rt) != REMAT_OK)
    return fail("runtime");
  if (remat_graph_create(b->rt, &b->g) != REMAT_OK)
    return fail("graph");
  if (build_model(b, o) != REMAT_OK)
    return fail("model");
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-4f, .weight_decay = 0.01f};
  /* Under mpirun the main run is data parallel (dp_tool.h). */
  if ((threads == o->threads && dp_tool_attach(b->g) != REMAT_OK) ||
      remat_compile(b->g, b->m.loss, &opt) != REMAT_OK)
    return fail("compile");
  size_t n = (size_t)o->cfg.batch * (size_t)o->cfg.seq;
  b->tok = malloc(n * 4);
  b->tgt = malloc(n * 4);
  b->times = calloc((size_t)o->steps, sizeof *b->times);
  b->roofs = calloc((size_t)o->steps, sizeof *b->roofs);
  b->roofs16 = calloc((size_t)o->steps, sizeof *b->roofs16);
  if (!b->tok || !b->tgt || !b->times || !b->roofs || !b->roofs16) {
    fprintf(stderr, "bench_train: out of memory\n");
    return 1;
  }
  fill_batch(&o->cfg, b->tok, b->tgt);
  if (remat_feed(b->g, b->m.tokens, b->tok, n * 4) != REMAT_OK ||
      remat_feed(b->g, b->m.targets, b->tgt, n * 4) != REMAT_OK)
    return fail("feed");
  if (b->lengths != NULL) {
    int32_t *len = malloc((size_t)o->cfg.batch * sizeof *len);
    if (len == NULL) {
      fprintf(stderr, "bench_train: out of memory\n");
      return 1;
    }
    for (int r = 0; r < o->cfg.batch; r++)
      len[r] = o->cfg.seq;
    remat_status s = remat_feed(b->g, b->lengths, len,
                                (size_t)o->cfg.batch * sizeof *len);
    free(len);
    if (s != REMAT_OK)
      return fail("feed");
  }
  if (!roofline_open(&b->roof, threads, false) ||
      (precision == REMAT_PRECISION_BF16 &&
       !roofline_open(&b->roof16, threads, true))) {
    fprintf(stderr, "bench_train: cannot create the roofline matmul\n");
    return 1;
  }
  return 0;
}

/* Step s of 0..steps: step 0 is the warm-up; every step but the last is
 * followed by a roofline measurement on the same thread count. */
static int bench_step(bench *b, int s, int steps) {
  if (accum_step(b->g, b->accum, &b->st) != REMAT_OK)
    return fail("step");
  if (s == 0) {
    b->checksum = dp_tool_checksum(b->g, true);
    b->first = b->st;
    dp_tool_mark(b->g);
  } else {
    b->times[s - 1] = b->st.seconds;
  }
  if (s < steps)
    b->roofs[s] = roofline_measure(&b->roof, 5);
  if (s < steps && b->precision == REMAT_PRECISION_BF16)
    b->roofs16[s] = roofline_measure(&b->roof16, 5);
  if (b->st.peak_bytes > b->peak)
    b->peak = b->st.peak_bytes;
  if (b->st.activation_peak_bytes > b->act_peak)
    b->act_peak = b->st.activation_peak_bytes;
  int64_t gopt = b->st.peak[REMAT_MEM_GRADS] + b->st.peak[REMAT_MEM_OPTIMIZER];
  if (gopt > b->grads_opt_peak)
    b->grads_opt_peak = gopt;
  return 0;
}

static void bench_close(bench *b) {
  free(b->times);
  free(b->roofs);
  free(b->roofs16);
  roofline_close(&b->roof);
  roofline_close(&b->roof16);
  free(b->tok);
  free(b->tgt);
  if (b->g)
    remat_graph_destroy(b->g);
  if (b->rt)
    remat_runtime_destroy(b->rt);
}

static const char *attention_name(remat_attention_kind k) {
  return k == REMAT_ATTENTION_FUSED ? "fused" : "materialized";
}

/* LoRA's figures of run b, against full, the same model fully
 * fine-tuned in the same rounds (NULL with --lora-only). */
static void report_lora(const bench *b, const bench *full, const options *o,
                        json_nulls *nulls) {
  printf(", \"lora_rank\": %d, \"lora_targets\": \"%s\", "
         "\"grads_optimizer_peak_bytes\": %lld",
         o->lora_rank,
         o->lora_targets != NULL ? o->lora_targets
         : b->model == MODEL_GPT ? "c_attn"
                                 : "q_proj,v_proj",
         (long long)b->grads_opt_peak);
  if (full == NULL)
    return;
  double step_s = bench_median(b->times, o->steps);
  double step_full = bench_median(full->times, o->steps);
  json_put(nulls, "full_step_s_median", "%.6f", step_full);
  json_put(nulls, "lora_step_ratio", "%.4f", step_s / step_full);
  printf(", \"full_peak_bytes\": %lld, "
         "\"full_grads_optimizer_peak_bytes\": %lld",
         (long long)full->peak, (long long)full->grads_opt_peak);
  json_put(nulls, "lora_grads_optimizer_ratio", "%.6f",
           (double)b->grads_opt_peak / (double)full->grads_opt_peak);
  json_put(nulls, "full_loss", "%.6f", full->st.loss);
}

/* The JSON line of run b; one: its 1-thread peer (--compare-threads);
 * f32: the f32 run beside this bf16 one (--precision both); plain: the
 * same run without memory admission (--compare-admission); unfused: the
 * same run without fused epilogues (--compare-fusion); split: the same
 * run with the update in separate passes (--compare-update); dw_before:
 * the weight gradients in their form before the shape rule
 * (--compare-dw); full: the model fully fine-tuned beside this LoRA run
 * (--lora-rank). */
static void report(const bench *b, const bench *one, const bench *f32,
                   const bench *plain, const bench *unfused,
                   const bench *split, const bench *dw_before,
                   const bench *full, const options *o) {
  const remat_step_stats st = b->st;
  size_t n = (size_t)o->cfg.batch * (size_t)o->cfg.seq;
  double step_s = bench_median(b->times, o->steps);
  double roofline = bench_median(b->roofs, o->steps);
  bool bf16 = b->precision == REMAT_PRECISION_BF16;
  double roof16 = bf16 ? bench_median(b->roofs16, o->steps) : 0.0;
  double flops = model_flops(b) * o->accum;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  /* MFU against the roofline of the run's own precision */
  double mfu = flops / step_s * 1e-9 / (bf16 ? roof16 : roofline);
  char dp_json[1024];
  dp_tool_json(b->g, dp_json, sizeof dp_json); /* collective under MPI */
  json_nulls nulls = {0};
  printf("{\"model\": \"%s\", ", model_names[b->model]);
  if (b->model == MODEL_LLAMA)
    printf("\"kv_heads\": %d, \"ffn\": %d, ", o->kv_heads, o->ffn);
  printf("\"policy\": \"%s\", \"attention\": \"%s\", \"precision\": \"%s\", "
         "\"layers\": %d, "
         "\"d_model\": %d, \"heads\": %d, "
         "\"seq\": %d, \"batch\": %d, \"vocab\": %d, \"threads\": %d, "
         "\"accum\": %d, \"steps\": %d",
         o->policy, attention_name(b->cfg.attention), bf16 ? "bf16" : "f32",
         o->cfg.layers,
         o->cfg.d_model, o->cfg.heads, o->cfg.seq,
         o->cfg.batch, o->cfg.vocab, o->threads, o->accum, o->steps);
  json_put(&nulls, "step_s_median", "%.6f", step_s);
  json_put(&nulls, "tokens_per_s", "%.1f", (double)n * o->accum / step_s);
  json_put(&nulls, "loss", "%.6f", st.loss);
  json_put(&nulls, "first_loss", "%.6f", b->first.loss);
  printf(", \"grad_checksum\": \"%016llx\", "
         "\"peak_bytes\": %lld, \"activation_peak_bytes\": %lld, "
         "\"predicted_peak_bytes\": %lld, \"peak_rss_bytes\": %lld",
         (unsigned long long)b->checksum, (long long)b->peak,
         (long long)b->act_peak, (long long)st.predicted_peak_bytes,
         (long long)ru.ru_maxrss * 1024);
  json_put(&nulls, "flops_per_step", "%.6g", flops);
  json_put(&nulls, "recompute_flops", "%.6g", st.recompute_flops);
  json_put(&nulls, "matmul_roofline_gflops", "%.2f", roofline);
  json_put(&nulls, "mfu", "%.4f", mfu);
  printf(", \"remote_bytes\": %lld, \"remote_bytes_unplaced\": %lld",
         (long long)st.remote_bytes, (long long)st.remote_bytes_unplaced);
  if (one != NULL) {
    /* speedup: the 1-thread step's median over this one's, measured in the
     * same rounds; roofline_speedup: the same ratio for oneDNN's own matmul,
     * the most the machine gave at this moment. */
    double step_1 = bench_median(one->times, o->steps);
    double roof_1 = bench_median(one->roofs, o->steps);
    json_put(&nulls, "step_s_median_1_thread", "%.6f", step_1);
    json_put(&nulls, "matmul_roofline_gflops_1_thread", "%.2f", roof_1);
    json_put(&nulls, "speedup", "%.4f", step_1 / step_s);
    json_put(&nulls, "roofline_speedup", "%.4f", roofline / roof_1);
    printf(", \"checksum_matches_1_thread\": %s",
           one->checksum == b->checksum ? "true" : "false");
  }
  if (bf16) {
    json_put(&nulls, "bf16_roofline_gflops", "%.2f", roof16);
    json_put(&nulls, "bf16_roofline_ratio", "%.4f", roof16 / roofline);
  }
  if (f32 != NULL) {
    /* this bf16 run against the f32 run of the same rounds */
    double step_32 = bench_median(f32->times, o->steps);
    json_put(&nulls, "f32_step_s_median", "%.6f", step_32);
    json_put(&nulls, "step_ratio_vs_f32", "%.4f", step_s / step_32);
    printf(", \"f32_activation_peak_bytes\": %lld",
           (long long)f32->act_peak);
    json_put(&nulls, "activation_peak_ratio_vs_f32", "%.4f",
             (double)b->act_peak / (double)f32->act_peak);
    json_put(&nulls, "f32_loss", "%.6f", f32->st.loss);
  }
  if (plain != NULL) {
    /* admission's cost: this step's median over the one without, from the
     * same rounds */
    double step_plain = bench_median(plain->times, o->steps);
    json_put(&nulls, "no_admission_step_s_median", "%.6f", step_plain);
    json_put(&nulls, "admission_step_ratio", "%.4f", step_s / step_plain);
    printf(", \"no_admission_peak_bytes\": %lld, "
           "\"checksum_matches_no_admission\": %s",
           (long long)plain->peak,
           plain->checksum == b->checksum ? "true" : "false");
  }
  if (unfused != NULL) {
    /* fusion's gain: this step's median over the unfused one's, from the
     * same rounds; its MFU against the same roofline */
    double step_un = bench_median(unfused->times, o->steps);
    json_put(&nulls, "no_fusion_step_s_median", "%.6f", step_un);
    json_put(&nulls, "fusion_step_ratio", "%.4f", step_s / step_un);
    json_put(&nulls, "no_fusion_mfu", "%.4f", mfu * step_s / step_un);
    printf(", \"no_fusion_activation_peak_bytes\": %lld, "
           "\"checksum_matches_no_fusion\": %s",
           (long long)unfused->act_peak,
           unfused->checksum == b->checksum ? "true" : "false");
  }
  if (split != NULL) {
    /* the one-pass update's step over the split passes', same rounds */
    double step_split = bench_median(split->times, o->steps);
    json_put(&nulls, "split_update_step_s_median", "%.6f", step_split);
    json_put(&nulls, "one_pass_update_step_ratio", "%.4f",
             step_s / step_split);
    printf(", \"checksum_matches_split_update\": %s",
           split->checksum == b->checksum ? "true" : "false");
  }
  if (dw_before != NULL) {
    /* the weight gradients' form before the shape rule, same rounds */
    double step_b = bench_median(dw_before->times, o->steps);
    double mfu_b = flops / step_b * 1e-9 /
                   (bf16 ? bench_median(dw_before->roofs16, o->steps)
                         : bench_median(dw_before->roofs, o->steps));
    json_put(&nulls, "strided_dw_step_s_median", "%.6f", step_b);
    json_put(&nulls, "strided_dw_mfu", "%.4f", mfu_b);
    json_put(&nulls, "dw_rule_step_ratio", "%.4f", step_s / step_b);
  }
  if (b->lora)
    report_lora(b, full, o, &nulls);
  printf("%s%s}\n", dp_json, json_nonfinite(&nulls));
}

int main(int argc, char **argv) {
  options o;
  if (dp_tool_init(&argc, &argv, "bench_train") != 0) /* under mpirun */
    return 1;
  if (!parse_args(argc, argv, &o))
    return 2;
  /* a second run beside the main one: the same model on 1 thread
   * (--compare-threads), or the fused model beside the materialized one
   * (--attention both) */
  bench main_run, peer;
  int compare = o.compare_threads && o.threads > 1;
  int full = o.lora_rank > 0 && !o.lora_only; /* full beside LoRA */
  int second = compare || o.both || o.precision_both || o.model_both ||
               o.compare_admission || o.compare_fusion || o.compare_update ||
               o.compare_dw || full;
  char *fuse_env = getenv("REMAT_FUSE") ? strdup(getenv("REMAT_FUSE")) : NULL;
  /* read when each runtime is created; REMAT_FUSE=bf16 (bf16 adds fused
   * too) is kept for the main run */
  if (o.compare_fusion && (fuse_env == NULL || strcmp(fuse_env, "bf16")))
    setenv("REMAT_FUSE", "1", 1);
  remat_attention_kind main_kind =
      o.both ? REMAT_ATTENTION_MATERIALIZED : o.cfg.attention;
  remat_precision main_precision =
      o.precision_both ? REMAT_PRECISION_F32 : o.precision;
  model_kind main_model = o.model_both ? MODEL_GPT : o.model;
  if (bench_open(&main_run, &o, o.threads, main_kind, main_precision,
                 main_model, o.lora_rank > 0))
    return 1;
  if (o.compare_admission) /* read when the peer's runtime is created */
    setenv("REMAT_BENCH_NO_ADMISSION", "1", 1);
  if (o.compare_fusion)
    setenv("REMAT_FUSE", "0", 1);
  if (o.compare_update)
    setenv("REMAT_BENCH_SPLIT_UPDATE", "1", 1);
  if (o.compare_dw) /* read when the peer's ops are planned */
    setenv("REMAT_BENCH_DW_KERNEL", "strided", 1);
  if (second &&
      bench_open(&peer, &o, compare ? 1 : o.threads,
                 o.both ? REMAT_ATTENTION_FUSED : o.cfg.attention,
                 o.precision_both ? REMAT_PRECISION_BF16 : o.precision,
                 o.model_both ? MODEL_LLAMA : main_model, 0))
    return 1;
  unsetenv("REMAT_BENCH_NO_ADMISSION");
  if (fuse_env != NULL)
    setenv("REMAT_FUSE", fuse_env, 1);
  else
    unsetenv("REMAT_FUSE");
  free(fuse_env);
  unsetenv("REMAT_BENCH_SPLIT_UPDATE");
  unsetenv("REMAT_BENCH_DW_KERNEL");
  /* Interleaved rounds: the two runs alternate which goes first, so that
   * neither always follows the other's cache and frequency state. */
  for (int s = 0; s <= o.steps; s++) {
    bench *order[2] = {&main_run, &peer};
    if (second && s % 2) {
      order[0] = &peer;
      order[1] = &main_run;
    }
    for (int r = 0; r < (second ? 2 : 1); r++)
      if (bench_step(order[r], s, o.steps))
        return 1;
  }
  report(&main_run, compare ? &peer : NULL, NULL,
         o.compare_admission ? &peer : NULL,
         o.compare_fusion ? &peer : NULL, o.compare_update ? &peer : NULL,
         o.compare_dw ? &peer : NULL, full ? &peer : NULL, &o);
  if (o.both || o.precision_both || o.model_both)
    report(&peer, NULL, o.precision_both ? &main_run : NULL, NULL, NULL,
           NULL, NULL, NULL, &o);
  bench_close(&main_run);
  if (second)
    bench_close(&peer);
  dp_tool_finalize();
  return 0;
}
