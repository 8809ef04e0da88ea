/* Every op kernel of one training step of the GPT, run alone on one
 * thread, beside the step itself and oneDNN's matmul roofline in the same
 * process: what each kernel reaches alone, what the step's kernels add up
 * to, and the MFU that those rates allow at most.
 *
 * The model is compiled at one thread under `everything_saveable` (no
 * recompute). Each round runs one step (remat_step), then every op kernel
 * of the compiled step in program order on fresh buffers of the step's
 * sizes (all of a kernel's tiles on the calling thread, as one worker runs
 * them), then oneDNN's 2048x512 by 512x2048 matmul (bench_train's
 * roofline). Each kernel runs three times in a row: the first time is its
 * time in program order (`seq`: operands left by the kernels before it, as
 * in the step), the least of the other two its time with its own operands
 * warm (`warm`). Kernel and roofline times are the thread's CPU time; the
 * step's is remat_step's wall-clock seconds. Medians over the rounds.
 *
 * One JSON line per kernel name (summed over the step's ops) and a summary
 * line: the step's MFU; the MFU if the step were its kernels alone (update,
 * checks, scheduling and allocation take no time); and the dot-product
 * ceiling, the MFU if every other kernel took no time either and each dot
 * product ran at its warm rate alone.
 *
 *   bench_kernels [rounds] [f32 | bf16] [d512 | d384]
 *
 * d512 is bench_train's default model (8 layers, d_model 512, 8 heads, seq
 * 256, batch 8); d384 is 6 layers, d_model 384, 6 heads, seq 192, batch 6. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/bf16.h"
#include "benchmarks/bench_util.h"
#include "remat_gpt.h"
#include "runtime/exec/step_state.h"
#include "runtime/internal.h"

#define MAX_KINDS 64
#define MAX_ROUNDS 64

/* Per kernel name: its knodes' FLOPs and, per round, their summed times. */
typedef struct kind {
  const char *name;
  bool dot; /* a dot product's kernel that does FLOPs */
  int nodes;
  double flops;
  double seq[MAX_ROUNDS], warm[MAX_ROUNDS];
} kind;

typedef struct bench {
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  remat_gpt_config cfg;
  const plan_lowering *low;
  void **data; /* [nbufs]: this benchmark's buffers, NULL if unused */
  op_worker worker;
  kind kinds[MAX_KINDS];
  int nkinds;
  int *kind_of; /* [nknodes]: index into kinds, -1 not an op kernel */
  /* the roofline matmul */
  dnnl_primitive_t mm;
  dnnl_memory_t mm_mem[3];
  void *mm_buf[3];
} bench;

static int fail(const char *what) {
  fprintf(stderr, "bench_kernels: %s: %s\n", what, remat_last_error());
  return 1;
}

static bool is_op_kernel(const plan_knode *kn) {
  return kn->kernel != NULL &&
         (kn->kind == KNODE_FORWARD || kn->kind == KNODE_BACKWARD ||
          kn->kind == KNODE_RECOMPUTE);
}

/* Small values in a buffer of element type dt (int32 buffers stay 0: a
 * valid token, target and index). */
static void fill(void *p, int64_t bytes, op_dtype dt) {
  uint32_t x = 2463534242u;
  int64_t n = bytes / op_dtype_size(dt);
  for (int64_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    float v = ((float)(x >> 8) / 16777216.0f - 0.5f) * 0.1f;
    if (dt == OP_BF16)
      ((uint16_t *)p)[i] = bf16_from_f32(v);
    else if (dt == OP_F32)
      ((float *)p)[i] = v;
  }
}

/* Buffers for every slot of every op kernel, and the kinds. */
static int kernels_open(bench *b) {
  const plan_lowering *l = b->low;
  b->data = calloc((size_t)l->nbufs, sizeof *b->data);
  b->kind_of = malloc((size_t)l->nknodes * sizeof *b->kind_of);
  if (b->data == NULL || b->kind_of == NULL)
    return 1;
  size_t scratch = 1;
  for (int32_t i = 0; i < l->nknodes; i++) {
    const plan_knode *kn = &l->knodes[i];
    b->kind_of[i] = -1;
    if (!is_op_kernel(kn))
      continue;
    if (kn->inst->scratch_bytes > scratch)
      scratch = kn->inst->scratch_bytes;
    for (int s = 0; s < PLAN_SLOTS; s++) {
      int32_t bi = kn->slot_buf[s];
      if (bi < 0 || b->data[bi] != NULL)
        continue;
      const plan_buffer *buf = &l->bufs[bi];
      b->data[bi] = calloc((size_t)buf->bytes + 64, 1);
      if (b->data[bi] == NULL)
        return 1;
      fill(b->data[bi], buf->bytes, buf->dtype);
    }
    int k = 0;
    while (k < b->nkinds && strcmp(b->kinds[k].name, kn->kernel->name) != 0)
      k++;
    if (k == b->nkinds) {
      if (b->nkinds == MAX_KINDS)
        return 1;
      b->kinds[k].name = kn->kernel->name;
      b->nkinds++;
    }
    b->kind_of[i] = k;
    b->kinds[k].nodes++;
    b->kinds[k].flops += kn->flops;
    /* a dot op's product kernels, not its partial sums (which do about
     * one FLOP per element they read) */
    b->kinds[k].dot |= (op_tags(&kn->inst->desc) & OP_TAG_DOT) != 0 &&
                       kn->inst->nfwd > 0 &&
                       kn->flops * 100 >= kn->inst->fwd[0].flops;
  }
  b->worker.stream = NULL;
  b->worker.scratch = malloc(scratch);
  b->worker.scratch_bytes = scratch;
  return b->worker.scratch == NULL ||
         dnnl_stream_create(&b->worker.stream, b->rt->engine,
                            dnnl_stream_default_flags) != dnnl_success;
}

static void *slot(const bench *b, const plan_knode *kn, uint32_t bit) {
  int32_t bi = kn->slot_buf[plan_slot(bit)];
  return bi < 0 ? NULL : b->data[bi];
}

/* All tiles of knode i once; its CPU seconds, or -1 on a failure. */
static double run_kernel(bench *b, int32_t i) {
  const plan_knode *kn = &b->low->knodes[i];
  op_bufs o = {.training = true, .rng_seed = 1, .rng_step = 1};
  for (int k = 0; k < OP_MAX_IN; k++) {
    o.in[k] = slot(b, kn, OP_SLOT_IN(k));
    o.din[k] = slot(b, kn, OP_SLOT_DIN(k));
    o.din_accumulate[k] = kn->din_accumulate[k];
  }
  o.out = slot(b, kn, OP_SLOT_OUT);
  for (int k = 0; k < OP_MAX_AUX; k++)
    o.aux[k] = slot(b, kn, OP_SLOT_AUX(k));
  o.dout = slot(b, kn, OP_SLOT_DOUT);
  for (int k = 0; k < OP_MAX_WS; k++)
    o.ws[k] = slot(b, kn, OP_SLOT_WS(k));
  double t0 = bench_cpu_s();
  for (int64_t t = 0; t < kn->tiles; t++)
    if (kn->kernel->fn(kn->inst, &o, t, &b->worker) != REMAT_OK)
      return -1;
  return bench_cpu_s() - t0;
}

/* One round of the kernels: each kind's seq and warm sums for round r. */
static int kernels_round(bench *b, int r) {
  for (int k = 0; k < b->nkinds; k++)
    b->kinds[k].seq[r] = b->kinds[k].warm[r] = 0;
  for (int32_t i = 0; i < b->low->nknodes; i++) {
    int k = b->kind_of[i];
    if (k < 0)
      continue;
    double first = run_kernel(b, i), again = run_kernel(b, i),
           third = run_kernel(b, i);
    if (first < 0 || again < 0 || third < 0) {
      fprintf(stderr, "bench_kernels: kernel %s failed\n",
              b->low->knodes[i].kernel->name);
      return 1;
    }
    b->kinds[k].seq[r] += first;
    b->kinds[k].warm[r] += fmin(again, third);
  }
  return 0;
}

/* bench_train's roofline: oneDNN's 2048x512 by 512x2048 matmul in the
 * run's precision (f32 accumulation), on the calling thread. */
static int roofline_open(bench *b, bool bf16) {
  const dnnl_dim_t m = 2048, k = 512, n = 2048;
  dnnl_dims_t dims[3] = {{m, k}, {k, n}, {m, n}};
  dnnl_memory_desc_t md[3];
  for (int i = 0; i < 3; i++)
    dnnl_memory_desc_init_by_tag(&md[i], 2, dims[i],
                                 bf16 ? dnnl_bf16 : dnnl_f32, dnnl_ab);
  dnnl_matmul_desc_t desc;
  dnnl_primitive_desc_t pd = NULL;
  if (dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]) !=
          dnnl_success ||
      dnnl_primitive_desc_create(&pd, &desc, NULL, b->rt->engine, NULL) !=
          dnnl_success)
    return 1;
  int rc = dnnl_primitive_create(&b->mm, pd) != dnnl_success;
  dnnl_primitive_desc_destroy(pd);
  for (int i = 0; i < 3 && rc == 0; i++) {
    int64_t bytes = dims[i][0] * dims[i][1] * (bf16 ? 2 : 4);
    b->mm_buf[i] = malloc((size_t)bytes);
    rc = b->mm_buf[i] == NULL ||
         dnnl_memory_create(&b->mm_mem[i], &md[i], b->rt->engine,
                            b->mm_buf[i]) != dnnl_success;
    if (rc == 0)
      fill(b->mm_buf[i], bytes, bf16 ? OP_BF16 : OP_F32);
  }
  return rc;
}

/* GFLOP/s of the roofline matmul: the best of 5 runs after one. */
static double roofline_measure(bench *b) {
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, b->mm_mem[0]},
                             {DNNL_ARG_WEIGHTS, b->mm_mem[1]},
                             {DNNL_ARG_DST, b->mm_mem[2]}};
  double best = INFINITY;
  for (int i = 0; i < 6; i++) {
    double t0 = bench_cpu_s();
    dnnl_primitive_execute(b->mm, b->worker.stream, 3, args);
    dnnl_stream_wait(b->worker.stream);
    double t = bench_cpu_s() - t0;
    if (i > 0 && t < best)
      best = t;
  }
  return 2.0 * 2048 * 512 * 2048 / best * 1e-9;
}

static int model_open(bench *b, bool bf16) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                            REMAT_SET_PRECISION,
                     .num_threads = 1, .policy = "everything_saveable",
                     .precision = bf16 ? REMAT_PRECISION_BF16
                                       : REMAT_PRECISION_F32};
  if (remat_runtime_create(&rc, &b->rt) != REMAT_OK ||
      remat_graph_create(b->rt, &b->g) != REMAT_OK ||
      remat_gpt_build(b->g, &b->cfg, &b->m) != REMAT_OK)
    return fail("build");
  remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-4f};
  if (remat_compile(b->g, b->m.loss, &opt) != REMAT_OK)
    return fail("compile");
  if (bench_feed_batch(b->g, &b->m, &b->cfg) != REMAT_OK)
    return fail("feed");
  b->low = &b->g->step->compiled.low;
  return 0;
}

static void bench_close(bench *b) {
  for (int i = 0; i < 3; i++) {
    if (b->mm_mem[i])
      dnnl_memory_destroy(b->mm_mem[i]);
    free(b->mm_buf[i]);
  }
  if (b->mm)
    dnnl_primitive_destroy(b->mm);
  if (b->worker.stream)
    dnnl_stream_destroy(b->worker.stream);
  free(b->worker.scratch);
  for (int32_t i = 0; b->data && i < b->low->nbufs; i++)
    free(b->data[i]);
  free(b->data);
  free(b->kind_of);
  remat_graph_destroy(b->g);
  remat_runtime_destroy(b->rt);
}

static void report(bench *b, const char *prec, int rounds, double *steps,
                   double *roofs) {
  double roof = bench_median(roofs, rounds), step = bench_median(steps, rounds);
  double flops = remat_gpt_flops(&b->cfg);
  double all_seq = 0, all_warm = 0, dot_warm = 0, dot_flops = 0;
  for (int k = 0; k < b->nkinds; k++) {
    kind *kd = &b->kinds[k];
    double seq = bench_median(kd->seq, rounds), warm = bench_median(kd->warm, rounds);
    all_seq += seq;
    all_warm += warm;
    if (kd->dot) {
      dot_warm += warm;
      dot_flops += kd->flops;
    }
    printf("{\"precision\": \"%s\", \"kernel\": \"%s\", \"nodes\": %d, "
           "\"gflop\": %.3f, \"seq_s\": %.5f, \"warm_s\": %.5f",
           prec, kd->name, kd->nodes, kd->flops * 1e-9, seq, warm);
    if (kd->dot)
      printf(", \"warm_gflops\": %.1f, \"warm_of_roofline\": %.3f",
             kd->flops / warm * 1e-9, kd->flops / warm * 1e-9 / roof);
    printf("}\n");
  }
  printf("{\"precision\": \"%s\", \"model\": \"%d layers d%d seq %d batch "
         "%d\", \"rounds\": %d, \"roofline_gflops_1_thread\": %.1f, "
         "\"model_gflop\": %.3f, \"dot_kernel_gflop\": %.3f, "
         "\"step_s\": %.4f, \"kernels_seq_s\": %.4f, \"kernels_warm_s\": "
         "%.4f, \"dot_kernels_warm_s\": %.4f, \"mfu_step\": %.3f, "
         "\"mfu_kernels_seq\": %.3f, \"mfu_kernels_warm\": %.3f, "
         "\"mfu_ceiling_dots_warm\": %.3f}\n",
         prec, b->cfg.layers, b->cfg.d_model, b->cfg.seq, b->cfg.batch,
         rounds, roof, flops * 1e-9, dot_flops * 1e-9, step, all_seq,
         all_warm, dot_warm, flops / step * 1e-9 / roof,
         flops / all_seq * 1e-9 / roof, flops / all_warm * 1e-9 / roof,
         flops / dot_warm * 1e-9 / roof);
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 5;
  bool bf16 = argc > 2 && strcmp(argv[2], "bf16") == 0;
  bool d384 = argc > 3 && strcmp(argv[3], "d384") == 0;
  if (rounds < 1 || rounds > MAX_ROUNDS || argc > 4 ||
      (argc > 2 && !bf16 && strcmp(argv[2], "f32") != 0) ||
      (argc > 3 && !d384 && strcmp(argv[3], "d512") != 0)) {
    fprintf(stderr, "usage: bench_kernels [rounds 1-%d] [f32 | bf16] "
                    "[d512 | d384]\n", MAX_ROUNDS);
    return 2;
  }
  omp_set_num_threads(1); /* one worker, as the runtime runs a tile */
  static bench b;
  b.cfg = d384 ? (remat_gpt_config){.layers = 6, .d_model = 384, .heads = 6,
                                    .seq = 192, .batch = 6, .vocab = 256}
               : (remat_gpt_config){.layers = 8, .d_model = 512, .heads = 8,
                                    .seq = 256, .batch = 8, .vocab = 256};
  double steps[MAX_ROUNDS], roofs[MAX_ROUNDS];
  remat_step_stats st = {.size = sizeof st};
  int rc = model_open(&b, bf16);
  if (rc == 0 && (kernels_open(&b) || roofline_open(&b, bf16)))
    rc = fail("set-up");
  for (int w = 0; w < 3 && rc == 0; w++) /* warm-up */
    if (remat_step(b.g, &st) != REMAT_OK)
      rc = fail("step");
  if (rc == 0)
    rc = kernels_round(&b, 0); /* warm-up, overwritten */
  for (int r = 0; r < rounds && rc == 0; r++) {
    if (remat_step(b.g, &st) != REMAT_OK) {
      rc = fail("step");
      break;
    }
    steps[r] = st.seconds;
    rc = kernels_round(&b, r);
    roofs[r] = roofline_measure(&b);
  }
  if (rc == 0)
    report(&b, bf16 ? "bf16" : "f32", rounds, steps, roofs);
  if (b.rt)
    bench_close(&b);
  return rc;
}
