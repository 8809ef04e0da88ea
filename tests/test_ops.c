/* Tests of ops/: for every op, the forward kernels against a double
 * precision reference and every input gradient against central differences
 * of L = sum(out * seed) on that reference, in overwrite, accumulate and
 * skipped (NULL din) modes, with shapes whose rows do not divide the tiles;
 * plus op_infer messages, bad token and target ids, and order independence
 * of tiles. Kernels run single-threaded on one op_worker. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "op_fd.h"
#include "op_fixture.h"
#include "ops/op.h"

/* ---- double precision reference forwards ---- */

// x is (N,K), w is (M,K), b is (M), y is (N,M)
static void ref_linear(const op_desc *d, double *const in[], double *out) {
  int64_t N = rows_of(&d->in[0]), K = d->in[1].dim[1], M = d->in[1].dim[0];
  for (int64_t r = 0; r < N; r++)
    for (int64_t m = 0; m < M; m++) {
      double acc = d->nin == 3 ? in[2][m] : 0.0;
      for (int64_t k = 0; k < K; k++) acc += in[0][r * K + k] * in[1][m * K + k];
      out[r * M + m] = acc;
    }
}

// a is (Bt,N,K), b is (Bt,K,M), y is (Bt,N,M)
static void ref_matmul(const op_desc *d, double *const in[], double *out) {
  int nd = d->in[0].ndim;
  int64_t N = d->in[0].dim[nd - 2], K = d->in[0].dim[nd - 1];
  int64_t M = d->in[1].dim[nd - 1], Bt = op_numel(&d->in[0]) / (N * K);
  for (int64_t i = 0; i < Bt; i++)
    for (int64_t r = 0; r < N; r++)
      for (int64_t m = 0; m < M; m++) {
        double acc = 0.0;
        for (int64_t k = 0; k < K; k++)
          acc += in[0][(i * N + r) * K + k] * in[1][(i * K + k) * M + m];
        out[(i * N + r) * M + m] = acc;
      }
}

static void ref_add(const op_desc *d, double *const in[], double *out) {
  for (int64_t i = 0; i < op_numel(&d->in[0]); i++) out[i] = in[0][i] + in[1][i];
}

static void ref_bias_add(const op_desc *d, double *const in[], double *out) {
  int64_t C = last(&d->in[0]);
  for (int64_t i = 0; i < op_numel(&d->in[0]); i++)
    out[i] = in[0][i] + in[1][i % C];
}

static void ref_relu(const op_desc *d, double *const in[], double *out) {
  for (int64_t i = 0; i < op_numel(&d->in[0]); i++)
    out[i] = in[0][i] > 0 ? in[0][i] : 0;
}

static void ref_gelu(const op_desc *d, double *const in[], double *out) {
  for (int64_t i = 0; i < op_numel(&d->in[0]); i++) {
    double x = in[0][i];
    if (d->attrs.gelu_erf)
      out[i] = 0.5 * x * (1 + erf(x / sqrt(2.0)));
    else
      out[i] = 0.5 * x *
               (1 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  }
}

// x is (N,C), gamma and beta are (C)
static void ref_layernorm(const op_desc *d, double *const in[], double *out) {
  int64_t N = rows_of(&d->in[0]), C = last(&d->in[0]);
  double eps = d->attrs.eps != 0.0f ? d->attrs.eps : 1e-5;
  for (int64_t r = 0; r < N; r++) {
    const double *x = in[0] + r * C;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; c++) mean += x[c] / C;
    for (int64_t c = 0; c < C; c++) var += (x[c] - mean) * (x[c] - mean) / C;
    for (int64_t c = 0; c < C; c++)
      out[r * C + c] = (x[c] - mean) / sqrt(var + eps) * in[1][c] + in[2][c];
  }
}

static void ref_softmax(const op_desc *d, double *const in[], double *out) {
  int64_t N = rows_of(&d->in[0]), C = last(&d->in[0]);
  for (int64_t r = 0; r < N; r++) {
    const double *x = in[0] + r * C;
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < C; c++) mx = fmax(mx, x[c]);
    for (int64_t c = 0; c < C; c++) sum += exp(x[c] - mx);
    for (int64_t c = 0; c < C; c++) out[r * C + c] = exp(x[c] - mx) / sum;
  }
}

// qkv is (B,T,3D), s is (B,H,T,T)
static void ref_attn_scores(const op_desc *d, double *const in[],
                            double *out) {
  int64_t B = d->in[0].dim[0], T = d->in[0].dim[1], D = d->in[0].dim[2] / 3;
  int64_t H = d->attrs.heads, hd = D / H;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++) {
          double acc = 0;
          for (int64_t c = 0; c < hd; c++)
            acc += in[0][(b * T + i) * 3 * D + h * hd + c] *
                   in[0][(b * T + j) * 3 * D + D + h * hd + c];
          out[((b * H + h) * T + i) * T + j] =
              j <= i ? acc / sqrt((double)hd) : -INFINITY;
        }
}

// p is (B,H,T,T), qkv is (B,T,3D), o is (B,T,D)
static void ref_attn_values(const op_desc *d, double *const in[],
                            double *out) {
  int64_t B = d->in[1].dim[0], T = d->in[1].dim[1], D = d->in[1].dim[2] / 3;
  int64_t H = d->attrs.heads, hd = D / H;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t c = 0; c < hd; c++) {
          double acc = 0;
          for (int64_t j = 0; j < T; j++)
            acc += in[0][((b * H + h) * T + t) * T + j] *
                   in[1][(b * T + j) * 3 * D + 2 * D + h * hd + c];
          out[(b * T + t) * D + h * hd + c] = acc;
        }
}

// qkv is (B,T,3D), o is (B,T,D): o[b,i,h] = sum_{j<=i} softmax_j(q_i . k_j
// / sqrt(hd)) v_j, the fused op's whole forward
static void ref_attention(const op_desc *d, double *const in[], double *out) {
  int64_t B = d->in[0].dim[0], T = d->in[0].dim[1], D = d->in[0].dim[2] / 3;
  int64_t H = d->attrs.heads, hd = D / H;
  double *p = calloc((size_t)T, sizeof *p);
  assert_non_null(p);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < T; i++) {
        const double *q = in[0] + (b * T + i) * 3 * D + h * hd;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
          const double *k = in[0] + (b * T + j) * 3 * D + D + h * hd;
          double acc = 0;
          for (int64_t c = 0; c < hd; c++) acc += q[c] * k[c];
          p[j] = acc / sqrt((double)hd);
          mx = fmax(mx, p[j]);
        }
        for (int64_t j = 0; j <= i; j++) sum += p[j] = exp(p[j] - mx);
        for (int64_t c = 0; c < hd; c++) {
          double acc = 0;
          for (int64_t j = 0; j <= i; j++)
            acc += p[j] * in[0][(b * T + j) * 3 * D + 2 * D + h * hd + c];
          out[(b * T + i) * D + h * hd + c] = acc / sum;
        }
      }
  free(p);
}

// tokens is (B,T), wte is (V,D), wpe is (Tmax,D), x is (B,T,D)
static void ref_embed(const op_desc *d, double *const in[], double *out) {
  int64_t B = d->in[0].dim[0], T = d->in[0].dim[1], D = d->in[1].dim[1];
  for (int64_t r = 0; r < B * T; r++)
    for (int64_t c = 0; c < D; c++)
      out[r * D + c] = in[1][(int64_t)in[0][r] * D + c] + in[2][(r % T) * D + c];
}

// logits is (N,V), targets is (N), out is (1)
static void ref_cross_entropy(const op_desc *d, double *const in[],
                              double *out) {
  int64_t N = rows_of(&d->in[0]), V = last(&d->in[0]);
  double total = 0;
  for (int64_t r = 0; r < N; r++) {
    const double *x = in[0] + r * V;
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; v++) mx = fmax(mx, x[v]);
    for (int64_t v = 0; v < V; v++) sum += exp(x[v] - mx);
    total += mx + log(sum) - x[(int64_t)in[1][r]];
  }
  out[0] = total / N;
}

static void ref_reduce(const op_desc *d, double *const in[], double *out) {
  int64_t n = op_numel(&d->in[0]);
  double total = 0;
  for (int64_t i = 0; i < n; i++) total += in[0][i];
  out[0] = d->type == OP_MEAN ? total / n : total;
}

/* ---- gradient tests, one per op ---- */

static void test_linear(void **state) {
  (void)state;
  /* 130 rows: a 128-row tile and a 2-row remainder; dw blocks 256 + 4 */
  op_case c = make_case(OP_LINEAR, ref_linear, 3, S3(2, 65, 40), S2(260, 40),
                        S1(260));
  c.samples = 12;
  check_case(&c);
  /* no bias; 257 rows; dw blocks span all 520 columns */
  c = make_case(OP_LINEAR, ref_linear, 2, S2(257, 520), S2(20, 520));
  c.samples = 12;
  check_case(&c);
  /* 1100 rows: dw and db in three chunks of 384, 384 and 332 rows, their
   * partials summed by linear.dw_sum and linear.db_sum; dw blocks 256 + 4 */
  c = make_case(OP_LINEAR, ref_linear, 3, S3(4, 275, 24), S2(260, 24),
                S1(260));
  c.samples = 12;
  check_case(&c);
}

/* The weight-gradient tiles are the rule's: chunks of rows (ceil(rows /
 * 512) of them, at most 8, each a multiple of 64 rows) times blocks of 256
 * rows of dw; blocks span all of K up to 2048 columns, 256 columns beyond.
 * The default GPT's ffn and qkv shapes, and two edges. */
static void test_linear_dw_tiles(void **state) {
  (void)state;
  const struct {
    int64_t rows, K, M, tiles;
  } want[] = {
      {2048, 512, 2048, 4 * 8},  /* ffn_in: 4 chunks x 8 blocks */
      {2048, 2048, 512, 4 * 2},  /* ffn_out */
      {2048, 512, 1536, 4 * 6},  /* qkv */
      {300, 512, 300, 1 * 2},    /* one chunk; 256 + 44 rows of dw */
      {2048, 2100, 256, 4 * 9},  /* K past 2048: 8 x 256 + 52 columns */
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    op_desc d = {.type = OP_LINEAR,
                 .nin = 2,
                 .in = {S2(want[i].rows, want[i].K), S2(want[i].M, want[i].K)}};
    char err[OP_ERRMSG_MAX];
    assert_int_equal(op_infer(&d, err), REMAT_OK);
    op_instance inst;
    assert_int_equal(op_plan(&d, engine, &inst, err), REMAT_OK);
    const op_kernel *dw = NULL;
    for (int k = 0; k < inst.nbwd; k++)
      if (strcmp(inst.bwd[k].name, "linear.dw") == 0) dw = &inst.bwd[k];
    assert_non_null(dw);
    if (dw->tiles != want[i].tiles)
      fail_msg("linear of %lld rows, K %lld, M %lld: %lld dw tiles, want "
               "%lld", (long long)want[i].rows, (long long)want[i].K,
               (long long)want[i].M, (long long)dw->tiles,
               (long long)want[i].tiles);
    op_instance_release(&inst);
  }
}

static void test_matmul(void **state) {
  (void)state;
  op_case c = make_case(OP_MATMUL, ref_matmul, 2, S2(130, 64), S2(64, 70));
  check_case(&c);
  c = make_case(OP_MATMUL, ref_matmul, 2, S3(2, 300, 24), S3(2, 24, 40));
  check_case(&c);
  c = make_case(OP_MATMUL, ref_matmul, 2, S4(2, 2, 9, 5), S4(2, 2, 5, 7));
  check_case(&c);
}

static void test_add(void **state) {
  (void)state;
  op_case c = make_case(OP_ADD, ref_add, 2, S2(2, 35000), S2(2, 35000));
  check_case(&c);
}

static void test_bias_add(void **state) {
  (void)state;
  op_case c = make_case(OP_BIAS_ADD, ref_bias_add, 2, S2(700, 100), S1(100));
  check_case(&c);
}

static void test_relu(void **state) {
  (void)state;
  op_case c = make_case(OP_RELU, ref_relu, 1, S2(7, 10000));
  check_case(&c);
}

static void test_gelu(void **state) {
  (void)state;
  for (int erf_form = 0; erf_form < 2; erf_form++) {
    op_case c = make_case(OP_GELU, ref_gelu, 1, S2(7, 10000));
    c.desc.attrs.gelu_erf = erf_form;
    c.lo[0] = -4;
    c.hi[0] = 4;
    check_case(&c);
  }
}

static void test_layernorm(void **state) {
  (void)state;
  op_case c = make_case(OP_LAYERNORM, ref_layernorm, 3, S2(600, 48), S1(48),
                        S1(48));
  c.lo[1] = 0.5;
  c.hi[1] = 1.5;
  check_case(&c);
  c = make_case(OP_LAYERNORM, ref_layernorm, 3, S3(3, 5, 300), S1(300),
                S1(300));
  c.desc.attrs.eps = 1e-3f;
  check_case(&c);
}

static void test_softmax(void **state) {
  (void)state;
  op_case c = make_case(OP_SOFTMAX, ref_softmax, 1, S3(2, 300, 40));
  c.lo[0] = -3;
  c.hi[0] = 3;
  check_case(&c);
  c = make_case(OP_SOFTMAX, ref_softmax, 1, S4(2, 3, 13, 13));
  c.causal_mask = true;
  check_case(&c);
}

static void test_attn_scores(void **state) {
  (void)state;
  op_case c = make_case(OP_ATTN_SCORES, ref_attn_scores, 1, S3(2, 13, 72));
  c.desc.attrs.heads = 3;
  c.partial_din = true;
  c.samples = 40;
  check_case(&c);
}

static void test_attn_values(void **state) {
  (void)state;
  op_case c = make_case(OP_ATTN_VALUES, ref_attn_values, 2, S4(2, 3, 13, 13),
                        S3(2, 13, 72));
  c.desc.attrs.heads = 3;
  c.partial_din = true;
  c.samples = 40;
  check_case(&c);
}

/* The fused op (blocks of 128 rows): T not a multiple of the block (150 =
 * 128 + 22, 200 = 128 + 72, 140 = 128 + 12), a multiple (256), shorter
 * than a block (13), T = 1, one head, head dims 16, 24, 64 and 128. Inputs
 * in [-2, 2] give peaked rows. */
static void test_attention(void **state) {
  (void)state;
  static const struct {
    int64_t B, T, H, hd;
  } cases[] = {{2, 150, 2, 64}, {1, 200, 2, 16}, {1, 140, 1, 128},
               {1, 256, 2, 64}, {2, 13, 3, 24},  {2, 1, 1, 16},
               {1, 1, 2, 64}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    op_case c = make_case(OP_ATTENTION, ref_attention, 1,
                          S3(cases[k].B, cases[k].T,
                             3 * cases[k].H * cases[k].hd));
    c.desc.attrs.heads = (int)cases[k].H;
    c.lo[0] = -2;
    c.hi[0] = 2;
    c.samples = 40;
    check_case(&c);
  }
}

static void test_embed(void **state) {
  (void)state;
  op_case c = make_case(OP_EMBED, ref_embed, 3, S2(3, 40), S2(50, 300),
                        S2(45, 300));
  c.desc.in_dtype[0] = OP_I32;
  c.lo[0] = 0;
  c.hi[0] = 50;
  c.samples = 40;
  check_case(&c);
}

static void test_cross_entropy(void **state) {
  (void)state;
  op_case c = make_case(OP_CROSS_ENTROPY, ref_cross_entropy, 2,
                        S3(3, 50, 200), S2(3, 50));
  c.desc.in_dtype[1] = OP_I32;
  c.lo[0] = -4;
  c.hi[0] = 4;
  c.lo[1] = 0;
  c.hi[1] = 200;
  check_case(&c);
}

static void test_sum_mean(void **state) {
  (void)state;
  for (int t = 0; t < 2; t++) {
    op_case c = make_case(t ? OP_MEAN : OP_SUM, ref_reduce, 1, S1(70001));
    c.lo[0] = 0;
    check_case(&c);
  }
}

/* ---- everything else ---- */

static void expect_infer_error(op_desc d, const char *want) {
  char err[OP_ERRMSG_MAX];
  assert_int_equal(op_infer(&d, err), REMAT_ERR_SHAPE);
  assert_string_equal(err, want);
}

static void test_infer_errors(void **state) {
  (void)state;
  op_desc d = {.type = OP_LINEAR, .nin = 2, .in = {S3(2, 3, 64), S2(32, 48)}};
  expect_infer_error(d, "linear: x [2,3,64] and w [32,48]: last dim of x "
                        "(64) must equal dim 1 of w (48)");
  d.nin = 1;
  expect_infer_error(d, "linear: takes 2 or 3 inputs, got 1");
  d = (op_desc){.type = OP_LINEAR, .nin = 3,
                .in = {S2(4, 48), S2(32, 48), S1(31)}};
  expect_infer_error(d, "linear: w [32,48] and b [31]: b must be [32] (dim 0 "
                        "of w)");
  d = (op_desc){.type = OP_ADD, .nin = 2, .in = {S2(2, 3), S2(2, 4)}};
  expect_infer_error(d, "add: a [2,3] and b [2,4]: shapes must be equal");
  d = (op_desc){.type = OP_LAYERNORM, .nin = 3,
                .in = {S2(4, 8), S1(8), S1(7)}};
  expect_infer_error(d, "layernorm: x [4,8] and beta [7]: beta must be [8] "
                        "(last dim of x)");
  d = (op_desc){.type = OP_ATTN_SCORES, .nin = 1, .in = {S3(2, 8, 96)},
                .attrs = {.heads = 5}};
  expect_infer_error(d, "attn_scores: qkv [2,8,96] with 5 heads: D (32) must "
                        "be divisible by the number of heads");
  d = (op_desc){.type = OP_ATTN_VALUES, .nin = 2,
                .in = {S4(2, 4, 8, 7), S3(2, 8, 96)}, .attrs = {.heads = 4}};
  expect_infer_error(d, "attn_values: p [2,4,8,7] and qkv [2,8,96] with 4 "
                        "heads: p must be [B,H,T,T] = [2,4,8,8]");
  d = (op_desc){.type = OP_CROSS_ENTROPY, .nin = 2,
                .in = {S3(4, 8, 100), S2(4, 9)},
                .in_dtype = {OP_F32, OP_I32}};
  expect_infer_error(d, "cross_entropy: logits [4,8,100] and targets [4,9]: "
                        "targets must be [4,8] (the leading dims of logits)");
  d.in[1] = S2(4, 8);
  d.in_dtype[1] = OP_F32;
  expect_infer_error(d, "cross_entropy: targets [4,8] must be int32, not f32");
  d = (op_desc){.type = OP_EMBED, .nin = 3,
                .in = {S2(2, 9), S2(100, 32), S2(8, 32)},
                .in_dtype = {OP_I32, OP_F32, OP_F32}};
  expect_infer_error(d, "embed: tokens [2,9] and wpe [8,32]: T (9) must be "
                        "at most Tmax (8)");
  d.in_dtype[0] = OP_F32;
  expect_infer_error(d, "embed: tokens [2,9] must be int32, not f32");
  d = (op_desc){.type = OP_MATMUL, .nin = 2, .in = {S3(2, 3, 4), S3(3, 4, 5)}};
  expect_infer_error(d, "matmul: a [2,3,4] and b [3,4,5]: batch dim 0 "
                        "differs (2 vs 3)");
  d = (op_desc){.type = OP_RELU, .nin = 1, .in = {S2(2, 0)}};
  expect_infer_error(d, "relu: x [2,0]: every dim must be at least 1");
}

static void test_infer_shapes_and_tags(void **state) {
  (void)state;
  char err[OP_ERRMSG_MAX];
  op_desc d = {.type = OP_ATTN_SCORES, .nin = 1, .in = {S3(2, 8, 96)},
               .attrs = {.heads = 4}};
  assert_int_equal(op_infer(&d, err), REMAT_OK);
  assert_int_equal(d.out.ndim, 4);
  assert_int_equal(d.out.dim[0], 2);
  assert_int_equal(d.out.dim[1], 4);
  assert_int_equal(d.out.dim[2], 8);
  assert_int_equal(d.out.dim[3], 8);
  assert_int_equal(op_tags(&d), OP_TAG_DOT | OP_TAG_BATCHED);
  d = (op_desc){.type = OP_MATMUL, .nin = 2, .in = {S2(3, 4), S2(4, 5)}};
  assert_int_equal(op_tags(&d), OP_TAG_DOT);
  d.in[0] = S3(2, 3, 4);
  d.in[1] = S3(2, 4, 5);
  assert_int_equal(op_tags(&d), OP_TAG_DOT | OP_TAG_BATCHED);
  d = (op_desc){.type = OP_CROSS_ENTROPY, .nin = 2,
                .in = {S2(4, 10), S1(4)}, .in_dtype = {OP_F32, OP_I32}};
  assert_int_equal(op_infer(&d, err), REMAT_OK);
  assert_int_equal(d.out.ndim, 1);
  assert_int_equal(d.out.dim[0], 1);
  assert_int_equal(op_tags(&d), 0);
  assert_string_equal(op_name(OP_LAYERNORM), "layernorm");
}

/* Sets element `at` of int input `in` to `id` and runs forward tile 0. */
static remat_status fwd_with_id(op_run *r, int in, int at, int32_t id) {
  ((int32_t *)r->bufs.in[in])[at] = id;
  return r->inst.fwd[0].fn(&r->inst, &r->bufs, 0, &r->worker);
}

/* A bad token id or target makes the forward tile fail, not crash; the
 * ids at both ends of the range are accepted. */
static void test_bad_ids(void **state) {
  (void)state;
  op_case c = make_case(OP_EMBED, ref_embed, 3, S2(2, 4), S2(10, 8),
                        S2(4, 8));
  c.desc.in_dtype[0] = OP_I32;
  c.lo[0] = 0;
  c.hi[0] = 10;
  op_run r;
  run_setup(&r, &c);
  assert_int_equal(fwd_with_id(&r, 0, 5, 10), REMAT_ERR_INVALID_ARG);
  assert_int_equal(fwd_with_id(&r, 0, 5, -1), REMAT_ERR_INVALID_ARG);
  assert_int_equal(fwd_with_id(&r, 0, 5, 9), REMAT_OK);
  assert_int_equal(fwd_with_id(&r, 0, 5, 0), REMAT_OK);
  run_free(&r);
  c = make_case(OP_CROSS_ENTROPY, ref_cross_entropy, 2, S2(3, 6), S1(3));
  c.desc.in_dtype[1] = OP_I32;
  c.lo[1] = 0;
  c.hi[1] = 6;
  run_setup(&r, &c);
  assert_int_equal(fwd_with_id(&r, 1, 2, 6), REMAT_ERR_INVALID_ARG);
  assert_int_equal(fwd_with_id(&r, 1, 2, -1), REMAT_ERR_INVALID_ARG);
  assert_int_equal(fwd_with_id(&r, 1, 2, 5), REMAT_OK);
  assert_int_equal(fwd_with_id(&r, 1, 2, 0), REMAT_OK);
  run_free(&r);
}

/* Elements of x[0..n) that are not zero. */
static int64_t nonzero(const float *x, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; i++) count += x[i] != 0.0f;
  return count;
}

/* Running the tiles in reverse order gives bitwise the same results, and
 * results they are: out and every din have no zero element (buffers start
 * zeroed, so kernels that wrote nothing would also agree). */
static void test_tile_order(void **state) {
  (void)state;
  op_case c = make_case(OP_LAYERNORM, ref_layernorm, 3, S2(600, 48), S1(48),
                        S1(48));
  op_run r;
  run_setup(&r, &c);
  int64_t n[3] = {r.n[0], r.n[1], r.n[2]};
  float *first[3] = {0}, *first_out = xcalloc(r.nout, sizeof(float));
  for (int64_t j = 0; j < r.nout; j++) r.bufs.dout[j] = (float)uniform(-1, 1);
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < 3; i++) r.bufs.din[i] = xcalloc(n[i], sizeof(float));
    memset(r.bufs.out, 0, r.nout * sizeof(float));
    run_kernels(&r.inst, &r.bufs, &r.worker, r.inst.fwd, r.inst.nfwd,
                pass);
    run_kernels(&r.inst, &r.bufs, &r.worker, r.inst.bwd, r.inst.nbwd,
                pass);
    if (pass == 0) {
      assert_int_equal(nonzero(r.bufs.out, r.nout), r.nout);
      memcpy(first_out, r.bufs.out, r.nout * sizeof(float));
    } else {
      assert_memory_equal(first_out, r.bufs.out, r.nout * sizeof(float));
    }
    for (int i = 0; i < 3; i++) {
      if (pass == 0) {
        assert_int_equal(nonzero(r.bufs.din[i], n[i]), n[i]);
        first[i] = r.bufs.din[i];
      } else {
        assert_memory_equal(first[i], r.bufs.din[i], n[i] * sizeof(float));
        free(first[i]);
        free(r.bufs.din[i]);
      }
      r.bufs.din[i] = NULL;
    }
  }
  free(first_out);
  run_free(&r);
}

int main(void) {
  rng_state = 0x9e3779b97f4a7c15ull;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_infer_errors),
      cmocka_unit_test(test_infer_shapes_and_tags),
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_linear_dw_tiles),
      cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_add),
      cmocka_unit_test(test_bias_add),
      cmocka_unit_test(test_relu),
      cmocka_unit_test(test_gelu),
      cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_attn_scores),
      cmocka_unit_test(test_attn_values),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_embed),
      cmocka_unit_test(test_cross_entropy),
      cmocka_unit_test(test_sum_mean),
      cmocka_unit_test(test_bad_ids),
      cmocka_unit_test(test_tile_order),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
