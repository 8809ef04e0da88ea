/* Linear's weight-gradient kernel (linear.dw) in its three forms, in one
 * process: dy^T read in place in blocks of at most 256 columns of dw (as
 * before the shape rule; oneDNN's gemm:jit), the shape rule's form (in
 * place, blocks spanning all of K up to 2048), and a tile-local
 * transposed copy of dy's block (plain; oneDNN's brgemm). For each shape
 * of the default GPT and of the 6-layer d384 model, in f32 and in bf16
 * precision, the three are planned (REMAT_BENCH_DW_KERNEL at planning),
 * all tiles of the kernel run on one worker in turns, and the median
 * time of each (the thread's CPU time, which other processes on a shared
 * machine do not inflate) printed as a JSON line with the ratios to the
 * first and how far the gradients differ (largest difference over the
 * largest magnitude). With `cold`, every tile starts with its operands out
 * of the caches (a 64 MiB buffer written before each tile, not timed): the
 * kernel as it runs in a step, where a dw tile follows other tasks' work,
 * against the warm figures of a plain run, where the same operands stay in
 * the caches from one round to the next.
 *
 * With `order`, the input-gradient kernel (linear.dx) runs beside the
 * weight gradient's, both in the rule's form, in two orders after the
 * caches are emptied once: every dx tile and then every dw tile (program
 * order, as one worker runs them in a step), and chunk by chunk, each dw
 * chunk right after the dx tiles that read the same rows of dy. Each
 * line gives both kernels' times in both orders.
 *
 *   bench_dw [rounds] [cold | order]   (default 9, warm; 1 thread) */
#include <math.h>
#include <stdbool.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/bf16.h"
#include "benchmarks/bench_util.h"
#include "ops/op.h"

/* A planned linear (x [rows, K], w [M, K]) with its dw buffers. */
typedef struct variant {
  op_instance inst;
  op_worker worker;
  op_bufs b;
  const op_kernel *dw, *dx;
  int64_t ndw;
} variant;

/* Plans the linear with the dw form `form` ("strided", "transposed", or
 * NULL: the shape rule); x and dy are shared (dtype dt). */
static int plan(variant *v, dnnl_engine_t eng, dnnl_stream_t stream,
                int64_t rows, int64_t K, int64_t M, op_dtype dt, void *x,
                void *dy, const char *form) {
  memset(v, 0, sizeof *v);
  op_desc d = {.type = OP_LINEAR, .nin = 2};
  d.in[0] = (op_shape){.ndim = 2, .dim = {rows, K}};
  d.in[1] = (op_shape){.ndim = 2, .dim = {M, K}};
  d.in_dtype[0] = d.in_dtype[1] = d.din_dtype[0] = d.out_dtype = dt;
  d.din_dtype[1] = OP_F32; /* a parameter's gradient */
  char err[OP_ERRMSG_MAX];
  if (form) setenv("REMAT_BENCH_DW_KERNEL", form, 1);
  remat_status rs = op_plan(&d, eng, &v->inst, err);
  unsetenv("REMAT_BENCH_DW_KERNEL");
  if (rs != REMAT_OK) {
    fprintf(stderr, "bench_dw: %s\n", err);
    return 1;
  }
  for (int i = 0; i < v->inst.nbwd; i++) {
    if (strcmp(v->inst.bwd[i].name, "linear.dw") == 0) v->dw = &v->inst.bwd[i];
    if (strcmp(v->inst.bwd[i].name, "linear.dx") == 0) v->dx = &v->inst.bwd[i];
  }
  v->b.in[0] = x;
  v->b.dout = dy;
  v->b.din[1] = calloc((size_t)(M * K), sizeof(float));
  for (int k = 0; k < v->inst.nws; k++)
    v->b.ws[k] = calloc(v->inst.ws_bytes[k], 1);
  v->worker.stream = stream;
  v->worker.scratch_bytes = v->inst.scratch_bytes;
  v->worker.scratch = malloc(v->inst.scratch_bytes ? v->inst.scratch_bytes : 1);
  return v->dw && v->b.din[1] && v->worker.scratch ? 0 : 1;
}

static void release(variant *v) {
  free(v->b.din[1]);
  for (int k = 0; k < OP_MAX_WS; k++) free(v->b.ws[k]);
  free(v->worker.scratch);
  op_instance_release(&v->inst);
}

/* Written before each tile in the cold mode: larger than the last-level
 * cache, so that the tile's operands come from memory. */
#define FLUSH_BYTES ((size_t)64 << 20)
static unsigned char *flush_buf; /* NULL: warm */

static void flush_caches(void) {
  static unsigned char pass;
  pass++;
  for (size_t i = 0; i < FLUSH_BYTES; i += 64) flush_buf[i] = pass;
}

/* Runs tiles [from, to) of kernel k, adding their time to *sec. */
static int run_tiles(variant *v, const op_kernel *k, int64_t from, int64_t to,
                     double *sec) {
  double t0 = bench_cpu_s();
  for (int64_t t = from; t < to; t++)
    if (k->fn(&v->inst, &v->b, t, &v->worker) != REMAT_OK) return 1;
  *sec += bench_cpu_s() - t0;
  return 0;
}

/* Seconds for every tile of linear.dw (the tiles' time alone in the cold
 * mode), or -1 on a failure. */
static double run_dw(variant *v) {
  double total = 0;
  for (int64_t t = 0; t < v->dw->tiles; t++) {
    if (flush_buf) flush_caches();
    if (run_tiles(v, v->dw, t, t + 1, &total)) return -1;
  }
  return total;
}

/* What linear.dw wrote: the partials, or dw itself for one chunk. */
static const float *grad_of(const variant *v) {
  return v->inst.nws ? v->b.ws[0] : v->b.din[1];
}

/* The largest |a - b| over the largest |a| of what linear.dw wrote. */
static double rel_diff(const variant *a, const variant *b, int64_t n) {
  const float *p = grad_of(a), *q = grad_of(b);
  double big = 0, diff = 0;
  for (int64_t i = 0; i < n; i++) {
    big = fmax(big, fabs(p[i]));
    diff = fmax(diff, fabs((double)p[i] - q[i]));
  }
  return big > 0 ? diff / big : diff;
}

/* med[k] = the median of sec[k * rounds .. (k + 1) * rounds), for k < n
 * (each row sorted in place). */
static void medians(double *sec, int n, int rounds, double *med) {
  for (int k = 0; k < n; k++) {
    qsort(sec + k * rounds, (size_t)rounds, sizeof *sec, bench_cmp_double);
    med[k] = sec[k * rounds + rounds / 2];
  }
}

/* One round of the order mode: the dx and dw kernels' seconds (sec[0],
 * sec[1]) with the caches emptied first, in program order (chunked ==
 * false) or each dw chunk after the dx tiles of its rows. */
static int run_order(variant *v, bool chunked, double sec[2]) {
  const op_kernel *dx = v->dx, *dw = v->dw;
  int64_t dx_rows = dx->span.row_block, chunk = dw->span.row_block;
  int64_t per = dw->span.row_tiles > 0 ? dw->span.row_tiles : 1;
  sec[0] = sec[1] = 0;
  flush_caches();
  if (!chunked)
    return run_tiles(v, dx, 0, dx->tiles, &sec[0]) ||
           run_tiles(v, dw, 0, dw->tiles, &sec[1]);
  int64_t done = 0; /* dx tiles run so far */
  for (int64_t c = 0; c * per < dw->tiles; c++) {
    int64_t end = (c + 1) * chunk; /* the chunk's rows end here */
    int64_t upto = (end + dx_rows - 1) / dx_rows;
    if (upto > dx->tiles) upto = dx->tiles;
    if (upto > done && run_tiles(v, dx, done, upto, &sec[0])) return 1;
    if (upto > done) done = upto;
    if (run_tiles(v, dw, c * per, (c + 1) * per, &sec[1])) return 1;
  }
  return run_tiles(v, dx, done, dx->tiles, &sec[0]);
}

/* The order mode for one shape: both orders in turns, medians. */
static int bench_order(dnnl_engine_t eng, dnnl_stream_t stream,
                       const char *model, int64_t rows, int64_t K, int64_t M,
                       op_dtype dt, int rounds) {
  size_t es = (size_t)op_dtype_size(dt);
  void *x = calloc((size_t)(rows * K), es);
  void *dy = calloc((size_t)(rows * M), es);
  void *w = calloc((size_t)(M * K), es), *dxb = calloc((size_t)(rows * K), es);
  double *sec = calloc(4 * (size_t)rounds, sizeof *sec);
  variant v;
  memset(&v, 0, sizeof v);
  int rc = !x || !dy || !w || !dxb || !sec;
  bool planned = false;
  if (rc == 0) {
    rc = plan(&v, eng, stream, rows, K, M, dt, x, dy, NULL);
    planned = true;
  }
  if (rc == 0 && (v.dx == NULL || v.dx->span.row_block <= 0 ||
                  v.dx->tiles != (rows + v.dx->span.row_block - 1) /
                                     v.dx->span.row_block ||
                  v.dw->span.row_block <= 0)) {
    fprintf(stderr, "bench_dw: linear.dx or linear.dw is not in row "
                    "blocks for %lldx%lldx%lld\n",
            (long long)rows, (long long)K, (long long)M);
    rc = 1;
  }
  if (rc == 0) {
    v.b.in[1] = w;
    v.b.din[0] = dxb;
  }
  for (int r = -1; rc == 0 && r < rounds; r++) /* -1: warm-up */
    for (int k = 0; k < 2 && rc == 0; k++) {
      bool chunked = (k + (r < 0 ? 0 : r)) % 2 == 1;
      double t[2];
      rc = run_order(&v, chunked, t);
      if (r >= 0)
        for (int j = 0; j < 2; j++) sec[(2 * chunked + j) * rounds + r] = t[j];
    }
  if (rc == 0) {
    double med[4];
    medians(sec, 4, rounds, med);
    printf("{\"model\": \"%s\", \"dtype\": \"%s\", \"rows\": %lld, "
           "\"K\": %lld, \"M\": %lld, \"dx_tiles\": %lld, "
           "\"dw_tiles\": %lld, \"dw_chunk_rows\": %lld, "
           "\"program_dx_ms\": %.3f, \"program_dw_ms\": %.3f, "
           "\"chunked_dx_ms\": %.3f, \"chunked_dw_ms\": %.3f, "
           "\"chunked_over_program\": %.4f, "
           "\"chunked_over_program_dw\": %.4f}\n",
           model, dt == OP_BF16 ? "bf16" : "f32", (long long)rows,
           (long long)K, (long long)M, (long long)v.dx->tiles,
           (long long)v.dw->tiles, (long long)v.dw->span.row_block,
           med[0] * 1e3, med[1] * 1e3, med[2] * 1e3, med[3] * 1e3,
           (med[2] + med[3]) / (med[0] + med[1]), med[3] / med[1]);
  }
  if (planned) release(&v);
  free(x), free(dy), free(w), free(dxb), free(sec);
  return rc;
}

static int bench(dnnl_engine_t eng, dnnl_stream_t stream, const char *model,
                 int64_t rows, int64_t K, int64_t M, op_dtype dt, int rounds) {
  size_t es = (size_t)op_dtype_size(dt);
  void *x = malloc((size_t)(rows * K) * es);
  void *dy = malloc((size_t)(rows * M) * es);
  if (!x || !dy) return 1;
  uint32_t s = 12345;
  for (int64_t i = 0; i < rows * (K > M ? K : M); i++) {
    s = s * 1664525u + 1013904223u;
    float f = (float)(s >> 8) / 16777216.0f - 0.5f;
    if (i < rows * K) {
      if (dt == OP_BF16) ((uint16_t *)x)[i] = bf16_from_f32(f);
      else ((float *)x)[i] = f;
    }
    if (i < rows * M) {
      if (dt == OP_BF16) ((uint16_t *)dy)[i] = bf16_from_f32(0.5f * f);
      else ((float *)dy)[i] = 0.5f * f;
    }
  }
  /* before (strided, narrow blocks), the shape rule, the transposed copy */
  enum { NV = 3 };
  variant v[NV];
  const char *forms[NV] = {"strided", NULL, "transposed"};
  const char *names[NV] = {"strided", "rule", "transposed"};
  int rc = 0;
  for (int k = 0; k < NV && rc == 0; k++)
    rc = plan(&v[k], eng, stream, rows, K, M, dt, x, dy, forms[k]);
  double *sec = calloc(NV * (size_t)rounds, sizeof *sec);
  for (int r = -1; rc == 0 && sec && r < rounds; r++) /* -1: warm-up */
    for (int k = 0; k < NV; k++) {
      int kk = (k + (r < 0 ? 0 : r)) % NV; /* rotate which goes first */
      double t = run_dw(&v[kk]);
      if (t < 0) rc = 1;
      if (r >= 0) sec[kk * rounds + r] = t;
    }
  if (rc == 0 && sec) {
    double med[NV];
    medians(sec, NV, rounds, med);
    int64_t n = v[0].inst.nws ? (int64_t)(v[0].inst.ws_bytes[0] / 4) : M * K;
    double flops = 2.0 * (double)rows * (double)K * (double)M;
    printf("{\"model\": \"%s\", \"dtype\": \"%s\", \"caches\": \"%s\", "
           "\"rows\": %lld, "
           "\"K\": %lld, \"M\": %lld, \"tiles\": [%lld, %lld, %lld]",
           model, dt == OP_BF16 ? "bf16" : "f32",
           flush_buf ? "cold" : "warm", (long long)rows,
           (long long)K, (long long)M, (long long)v[0].dw->tiles,
           (long long)v[1].dw->tiles, (long long)v[2].dw->tiles);
    for (int k = 0; k < NV; k++)
      printf(", \"%s_ms\": %.3f, \"%s_gflops\": %.2f", names[k],
             med[k] * 1e3, names[k], flops / med[k] * 1e-9);
    printf(", \"rule_over_strided\": %.4f, "
           "\"transposed_over_strided\": %.4f, "
           "\"rule_max_rel_diff\": %.3g, "
           "\"transposed_max_rel_diff\": %.3g}\n",
           med[1] / med[0], med[2] / med[0], rel_diff(&v[0], &v[1], n),
           rel_diff(&v[0], &v[2], n));
  }
  for (int k = 0; k < NV; k++) release(&v[k]);
  free(sec);
  free(x);
  free(dy);
  return rc || !sec;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 9;
  bool cold = argc > 2 && strcmp(argv[2], "cold") == 0;
  bool order = argc > 2 && strcmp(argv[2], "order") == 0;
  if (rounds < 1 || argc > 3 || (argc > 2 && !cold && !order)) {
    fprintf(stderr, "usage: bench_dw [rounds] [cold | order]\n");
    return 2;
  }
  if ((cold || order) && (flush_buf = calloc(FLUSH_BYTES, 1)) == NULL) {
    fprintf(stderr, "bench_dw: out of memory\n");
    return 1;
  }
  omp_set_num_threads(1); /* one worker, as the runtime runs a tile */
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
      dnnl_stream_create(&stream, eng, dnnl_stream_default_flags) !=
          dnnl_success) {
    fprintf(stderr, "bench_dw: cannot create a oneDNN engine\n");
    return 1;
  }
  /* (rows, K, M) of the linears: qkv, proj, fc1, fc2, head */
  static const struct {
    const char *model;
    int64_t rows, K, M;
  } shapes[] = {{"gpt-d512", 2048, 512, 1536}, {"gpt-d512", 2048, 512, 512},
                {"gpt-d512", 2048, 512, 2048}, {"gpt-d512", 2048, 2048, 512},
                {"gpt-d512", 2048, 512, 256},  {"gpt-d384", 1152, 384, 1152},
                {"gpt-d384", 1152, 384, 384},  {"gpt-d384", 1152, 384, 1536},
                {"gpt-d384", 1152, 1536, 384}};
  int rc = 0;
  for (int p = 0; p < 2 && rc == 0; p++)
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes && rc == 0; i++)
      rc = (order ? bench_order : bench)(eng, stream, shapes[i].model,
                                         shapes[i].rows, shapes[i].K,
                                         shapes[i].M, p ? OP_BF16 : OP_F32,
                                         rounds);
  dnnl_stream_destroy(stream);
  dnnl_engine_destroy(eng);
  free(flush_buf);
  return rc;
}
