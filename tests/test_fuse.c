/* Tests of fused epilogues (the bias, GELU and residual add that consume a
 * linear's output run inside its matmul): which kernel nodes each policy
 * gets, that fused and unfused (REMAT_FUSE=0) steps agree, bitwise in f32,
 * that fused steps are bitwise identical across thread counts and NUMA
 * layouts, and the refusals of op_fuse and of a bad REMAT_FUSE. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/bf16.h"
#include "gpt_fixture.h"
#include "op_fixture.h"
#include "runtime/exec/step_state.h"

static const remat_gpt_config two = {
    .layers = 2, .d_model = 32, .heads = 2, .seq = 16, .batch = 2, .vocab = 11};

/* Whether this run fuses (the test is run again with REMAT_FUSE=0). */
static bool fusing(void) {
  const char *v = getenv("REMAT_FUSE");
  return v == NULL || strcmp(v, "0") != 0;
}

/* Kernel nodes of one kind running one kernel. */
static int count(const remat_graph *g, knode_kind kind, const char *kernel) {
  const plan_lowering *l = &g->step->compiled.low;
  int n = 0;
  for (int32_t i = 0; i < l->nknodes; i++)
    n += l->knodes[i].kind == kind && l->knodes[i].kernel != NULL &&
         strcmp(l->knodes[i].kernel->name, kernel) == 0;
  return n;
}

static remat_config config(int threads, const char *policy,
                           remat_precision precision) {
  return (remat_config){.set = REMAT_SET_NUM_THREADS | REMAT_SET_POLICY |
                               REMAT_SET_PRECISION | REMAT_SET_TRACE |
                               REMAT_SET_TOPOLOGY,
                        .num_threads = threads,
                        .policy = policy,
                        .precision = precision};
}

static const remat_tensor *named(remat_graph *g, const char *name) {
  for (int i = 0; i < remat_num_tensors(g); i++)
    if (strcmp(remat_tensor_name(remat_tensor_at(g, i)), name) == 0)
      return remat_tensor_at(g, i);
  fail_msg("no tensor %s", name);
  return NULL;
}

/* Per policy, for the 2-layer GPT (L = 2): both residual adds fuse into
 * the projections before them in the forward pass (2L nodes); the GELU
 * fuses into ffn_in's linear only where ffn_in is recomputed anyway
 * (nothing_saveable), and recompute runs that pair apart (backward reads
 * both ffn_in and ffn_act); resid_mid's recompute runs fused wherever
 * resid_mid is recomputed. */
typedef struct node_case {
  const char *policy;
  int fwd_add, fwd_gelu, fwd_linear, rec_add, rec_linear, rec_gelu;
  int unfused_rec_linear; /* REMAT_FUSE=0: attn_out's too, where needed */
} node_case;

static const node_case node_cases[] = {
    {"everything_saveable", 4, 0, 5, 0, 0, 0, 0},
    {"nothing_saveable", 4, 2, 3, 2, 4, 2, 6},
    {"dots_saveable", 4, 0, 5, 2, 0, 2, 0},
};

static void test_fused_nodes(void **state) {
  (void)state;
  bool on = fusing();
  for (size_t k = 0; k < sizeof node_cases / sizeof *node_cases; k++) {
    const node_case *c = &node_cases[k];
    remat_config rc = config(2, c->policy, REMAT_PRECISION_F32);
    fixture f;
    assert_int_equal(fixture_open_config(&f, &two, &rc, NULL), REMAT_OK);
    int want[6] = {c->fwd_add, c->fwd_gelu,   c->fwd_linear,
                   c->rec_add, c->rec_linear, c->rec_gelu};
    if (!on) { /* 3 linears a layer and the head; recompute unfused */
      want[0] = want[1] = want[3] = 0;
      want[2] = 9;
      want[4] = c->unfused_rec_linear;
    }
    int got[6] = {count(f.g, KNODE_FORWARD, "linear.fwd_add"),
                  count(f.g, KNODE_FORWARD, "linear.fwd_gelu"),
                  count(f.g, KNODE_FORWARD, "linear.fwd"),
                  count(f.g, KNODE_RECOMPUTE, "linear.fwd_add"),
                  count(f.g, KNODE_RECOMPUTE, "linear.fwd"),
                  count(f.g, KNODE_RECOMPUTE, "gelu.fwd")};
    for (int i = 0; i < 6; i++)
      if (got[i] != want[i])
        fail_msg("%s, REMAT_FUSE %d: count %d is %d, expected %d", c->policy,
                 on, i, got[i], want[i]);
    assert_int_equal(count(f.g, KNODE_FORWARD, "add.fwd"), on ? 0 : 4);
    /* a fused node computes its consumer's tensor on the linear */
    const plan_lowering *l = &f.g->step->compiled.low;
    for (int32_t i = 0; i < l->nknodes; i++) {
      const plan_knode *kn = &l->knodes[i];
      if (kn->kernel == NULL || strncmp(kn->kernel->name, "linear.fwd_", 11))
        continue;
      const char *name = remat_tensor_name(f.g->tensors[f.g->ops[kn->op].out]);
      bool gelu = strcmp(kn->kernel->name, "linear.fwd_gelu") == 0;
      assert_int_equal(kn->inst->desc.type, OP_LINEAR);
      assert_int_equal(f.g->ops[kn->op].desc.type, gelu ? OP_GELU : OP_ADD);
      if (gelu)
        assert_string_equal(name, "ffn_act");
    }
    /* attn_out is never stored when fused: neither saved nor recomputed */
    remat_tensor_plan tp;
    assert_int_equal(remat_tensor_plan_of(f.g, named(f.g, "attn_out"), &tp),
                     REMAT_OK);
    bool saves = strcmp(c->policy, "nothing_saveable") != 0;
    assert_int_equal(tp.saved, on ? 0 : saves);
    assert_int_equal(tp.recomputed, on ? 0 : !saves);
    assert_int_equal(remat_step(f.g, NULL), REMAT_OK);
    fixture_close(&f);
  }
}

/* One step without optimizer: the loss and every gradient. */
typedef struct result {
  float loss;
  float *grads;
  size_t n;
  uint64_t hash;
  int64_t predicted; /* peak bytes */
} result;

static result run(const char *fuse, int threads, const char *topology,
                  const char *policy, remat_precision precision) {
  setenv("REMAT_FUSE", fuse, 1);
  remat_config rc = config(threads, policy, precision);
  rc.topology = topology;
  fixture f;
  result r = {0};
  assert_int_equal(fixture_open_config(&f, &two, &rc, NULL), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  r.loss = st.loss;
  r.predicted = st.predicted_peak_bytes;
  r.hash = fixture_grad_hash(&f);
  for (int i = 0; i < remat_num_params(f.g); i++)
    r.n += (size_t)remat_tensor_numel(remat_param_at(f.g, i));
  r.grads = malloc(r.n * sizeof *r.grads);
  assert_non_null(r.grads);
  float *at = r.grads;
  for (int i = 0; i < remat_num_params(f.g); i++) {
    remat_tensor *p = remat_param_at(f.g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    assert_int_equal(remat_read_grad(f.g, p, at, n * sizeof *at), REMAT_OK);
    at += n;
  }
  fixture_close(&f);
  return r;
}

static void restore_env(const char *saved) {
  if (saved != NULL)
    setenv("REMAT_FUSE", saved, 1);
  else
    unsetenv("REMAT_FUSE");
}

static const char *const policies[] = {"everything_saveable",
                                       "nothing_saveable", "dots_saveable"};

/* f32: oneDNN applies the bias, GELU and add in f32 on the f32 matmul
 * result, as the separate kernels do: identical bits. bf16: the fused
 * kernel rounds to bf16 once where the unfused ones round the linear's
 * output first; the gradients agree within 3% of the largest. */
static void test_fused_matches_unfused(void **state) {
  (void)state;
  char *saved = getenv("REMAT_FUSE") ? strdup(getenv("REMAT_FUSE")) : NULL;
  for (size_t k = 0; k < sizeof policies / sizeof *policies; k++)
    for (int bf16 = 0; bf16 < 2; bf16++) {
      remat_precision p = bf16 ? REMAT_PRECISION_BF16 : REMAT_PRECISION_F32;
      result a = run(bf16 ? "bf16" : "1", 2, NULL, policies[k], p);
      result b = run("0", 2, NULL, policies[k], p);
      assert_int_equal(a.n, b.n);
      if (!bf16) {
        if (a.hash != b.hash || a.loss != b.loss)
          fail_msg("%s f32: fused loss %.9g grads %016llx, unfused %.9g "
                   "%016llx",
                   policies[k], a.loss, (unsigned long long)a.hash, b.loss,
                   (unsigned long long)b.hash);
      } else {
        double top = 0, diff = 0;
        for (size_t i = 0; i < a.n; i++) {
          top = fmax(top, fabs(b.grads[i]));
          diff = fmax(diff, fabs(a.grads[i] - b.grads[i]));
        }
        if (diff > 0.03 * top || fabs(a.loss - b.loss) > 1e-3 * b.loss)
          fail_msg("%s bf16: fused loss %.6g, unfused %.6g; gradients "
                   "differ by up to %.3g of max %.3g",
                   policies[k], a.loss, b.loss, diff, top);
      }
      /* fusion never needs more memory */
      assert_true(a.predicted <= b.predicted);
      free(a.grads);
      free(b.grads);
    }
  restore_env(saved);
  free(saved);
}

/* Relative L2 distance of a's gradients from ref's. */
static double grad_error(const result *a, const result *ref) {
  double e = 0, n = 0;
  for (size_t i = 0; i < a->n; i++) {
    e += ((double)a->grads[i] - ref->grads[i]) *
         ((double)a->grads[i] - ref->grads[i]);
    n += (double)ref->grads[i] * ref->grads[i];
  }
  return sqrt(e / fmax(n, 1e-300));
}

/* bf16 fused (REMAT_FUSE=bf16) against bf16 unfused, both against the f32
 * step on the same weights and batch: per policy, fusion must not make the
 * bf16 step less accurate (its gradients no farther from f32 than 1.25
 * times the unfused bf16 step's distance, which is a few bf16 roundings,
 * and its loss no farther than that plus 1e-5 of the loss), and the fused
 * bf16 step gives the same bits under every policy. REMAT_FUSE=1 leaves a
 * bf16 graph unfused: the same bits as 0. */
static void test_fused_bf16_accuracy(void **state) {
  (void)state;
  char *saved = getenv("REMAT_FUSE") ? strdup(getenv("REMAT_FUSE")) : NULL;
  uint64_t first = 0;
  for (size_t k = 0; k < sizeof policies / sizeof *policies; k++) {
    result ref = run("0", 2, NULL, policies[k], REMAT_PRECISION_F32);
    result a = run("bf16", 2, NULL, policies[k], REMAT_PRECISION_BF16);
    result b = run("0", 2, NULL, policies[k], REMAT_PRECISION_BF16);
    result c = run("1", 2, NULL, policies[k], REMAT_PRECISION_BF16);
    if (c.hash != b.hash || c.loss != b.loss)
      fail_msg("%s bf16: REMAT_FUSE=1 gives loss %.9g grads %016llx, 0 gives "
               "%.9g %016llx",
               policies[k], c.loss, (unsigned long long)c.hash, b.loss,
               (unsigned long long)b.hash);
    free(c.grads);
    double ga = grad_error(&a, &ref), gb = grad_error(&b, &ref);
    double la = fabs(a.loss - ref.loss), lb = fabs(b.loss - ref.loss);
    print_message("%s bf16 from f32: fused loss %.3g gradients %.3g, unfused "
                  "%.3g and %.3g\n",
                  policies[k], la / ref.loss, ga, lb / ref.loss, gb);
    /* The gradients' distance sums many elements' roundings and is steady
     * (0.0050 fused, 0.0049 unfused here); the loss's is one draw of a few
     * roundings (3.4e-6 and 4.9e-6 of the loss here), which another CPU's
     * kernels draw afresh: 1e-5 of the loss is the floor of its check. */
    if (ga > 1.25 * gb || la > 1.25 * lb + 1e-5 * ref.loss)
      fail_msg("%s bf16: fused loss %.7g and gradients %.3g (relative L2) "
               "from f32's, unfused %.7g and %.3g; f32 loss %.7g",
               policies[k], a.loss, ga, b.loss, gb, ref.loss);
    if (k == 0)
      first = a.hash;
    else if (a.hash != first)
      fail_msg("bf16 fused: gradient hash %016llx under %s, %016llx under %s",
               (unsigned long long)a.hash, policies[k],
               (unsigned long long)first, policies[0]);
    free(ref.grads);
    free(a.grads);
    free(b.grads);
  }
  restore_env(saved);
  free(saved);
}

/* Fused steps: the same bits on 1 and 2 threads and on two NUMA nodes. */
static void test_fused_bitwise_threads(void **state) {
  (void)state;
  char *saved = getenv("REMAT_FUSE") ? strdup(getenv("REMAT_FUSE")) : NULL;
  for (size_t k = 0; k < 2; k++)
    for (int bf16 = 0; bf16 < 2; bf16++) {
      remat_precision p = bf16 ? REMAT_PRECISION_BF16 : REMAT_PRECISION_F32;
      const char *fuse = !fusing() ? "0" : bf16 ? "bf16" : "1";
      result one = run(fuse, 1, NULL, policies[k], p);
      result two_t = run(fuse, 2, NULL, policies[k], p);
      result nodes =
          run(fuse, 2, "package:2 numa:1 core:1 pu:1", policies[k], p);
      if (one.hash != two_t.hash || one.hash != nodes.hash)
        fail_msg("%s %s: gradient hashes %016llx (1 thread), %016llx (2), "
                 "%016llx (2 nodes)",
                 policies[k], bf16 ? "bf16" : "f32",
                 (unsigned long long)one.hash, (unsigned long long)two_t.hash,
                 (unsigned long long)nodes.hash);
      free(one.grads);
      free(two_t.grads);
      free(nodes.grads);
    }
  restore_env(saved);
  free(saved);
}

static void test_fuse_env_refused(void **state) {
  (void)state;
  char *saved = getenv("REMAT_FUSE") ? strdup(getenv("REMAT_FUSE")) : NULL;
  setenv("REMAT_FUSE", "yes", 1);
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(NULL, &rt), REMAT_ERR_CONFIG);
  assert_null(rt);
  assert_string_equal(remat_last_error(),
                      "REMAT_FUSE='yes' is not valid: expected 0 (no fused "
                      "epilogues), 1 (fused, the default) or bf16 (bf16 "
                      "residual adds fused too)");
  /* a runtime that reads no environment ignores it */
  remat_config rc = {.set = REMAT_SET_NO_ENV | REMAT_SET_NUM_THREADS,
                     .num_threads = 1};
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  remat_runtime_destroy(rt);
  restore_env(saved);
  free(saved);
}

/* op_fuse refuses what it cannot fuse and plans nothing. */
static void test_op_fuse_refused(void **state) {
  (void)state;
  op_desc lin = {
      .type = OP_LINEAR, .nin = 3, .in = {S2(4, 8), S2(6, 8), S1(6)}};
  op_instance inst;
  char err[OP_ERRMSG_MAX];
  assert_int_equal(op_plan(&lin, engine, &inst, err), REMAT_OK);
  op_desc relu = {.type = OP_RELU, .nin = 1, .in = {S2(4, 6)}, .out = S2(4, 6)};
  assert_int_equal(op_fuse(&inst, &relu, 0, err), REMAT_ERR_INVALID_ARG);
  assert_string_equal(err, "linear: y [4,6] (f32) does not fuse into relu of "
                           "[4,6] input 0 (f32): only into a gelu of y or an "
                           "add of y and a tensor of its shape");
  op_desc wide = {.type = OP_GELU, .nin = 1, .in = {S2(4, 7)}, .out = S2(4, 7)};
  assert_int_equal(op_fuse(&inst, &wide, 0, err), REMAT_ERR_INVALID_ARG);
  assert_int_equal(inst.nfused, 0);
  op_desc add = {
      .type = OP_ADD, .nin = 2, .in = {S2(4, 6), S2(4, 6)}, .out = S2(4, 6)};
  assert_int_equal(op_fuse(&inst, &add, 1, err), REMAT_OK);
  assert_int_equal(inst.nfused, 1);
  assert_string_equal(inst.fused.name, "linear.fwd_add");
  assert_int_equal(inst.fused.tiles, inst.fwd[0].tiles);
  assert_true(inst.fused.flops == inst.fwd[0].flops + 24.0);
  /* a second epilogue is refused */
  assert_int_equal(op_fuse(&inst, &add, 0, err), REMAT_ERR_INVALID_ARG);
  op_instance_release(&inst);
  op_desc mm = {.type = OP_MATMUL, .nin = 2, .in = {S2(4, 8), S2(8, 6)}};
  assert_int_equal(op_plan(&mm, engine, &inst, err), REMAT_OK);
  assert_int_equal(op_fuse(&inst, &add, 0, err), REMAT_ERR_INVALID_ARG);
  assert_string_equal(err, "matmul: no fused epilogue (only linear has)");
  op_instance_release(&inst);
}

/* bf16: the fused linear + add kernel against the separate linear and add
 * kernels on the same bf16 inputs, both against the exact sum in double.
 * The fused kernel rounds x . w^T + b + r to bf16 once, the separate ones
 * round y = x . w^T + b and then y + r: per element, fused may be off by
 * at most one rounding of the result (2^-8 relative, with room for the
 * f32 accumulation), and no worse overall than the separate kernels. */
static void fused_add_bf16_case(int64_t N, int64_t K, int64_t M) {
  op_desc lin = {.type = OP_LINEAR,
                 .nin = 3,
                 .in = {S2(N, K), S2(M, K), S1(M)},
                 .in_dtype = {OP_BF16, OP_BF16, OP_F32},
                 .out_dtype = OP_BF16};
  op_desc add = {.type = OP_ADD,
                 .nin = 2,
                 .in = {S2(N, M), S2(N, M)},
                 .in_dtype = {OP_BF16, OP_BF16},
                 .out_dtype = OP_BF16};
  char err[OP_ERRMSG_MAX];
  assert_int_equal(op_infer(&lin, err), REMAT_OK);
  assert_int_equal(op_infer(&add, err), REMAT_OK);
  lin.out_dtype = add.out_dtype = OP_BF16;
  op_instance li, ai, fi;
  assert_int_equal(op_plan(&lin, engine, &li, err), REMAT_OK);
  assert_int_equal(op_plan(&add, engine, &ai, err), REMAT_OK);
  assert_int_equal(op_plan(&lin, engine, &fi, err), REMAT_OK);
  assert_int_equal(op_fuse(&fi, &ai.desc, 0, err), REMAT_OK);
  uint16_t *x = calloc(N * K, 2), *w = calloc(M * K, 2), *r = calloc(N * M, 2),
           *y = calloc(N * M, 2), *z = calloc(N * M, 2),
           *zf = calloc(N * M, 2);
  float *b = calloc(M, 4);
  assert_true(x && w && r && y && z && zf && b);
  for (int64_t i = 0; i < N * K; i++) x[i] = bf16_from_f32(uniform(-1, 1));
  for (int64_t i = 0; i < M * K; i++) w[i] = bf16_from_f32(uniform(-1, 1));
  for (int64_t i = 0; i < N * M; i++) r[i] = bf16_from_f32(uniform(-4, 4));
  for (int64_t i = 0; i < M; i++) b[i] = (float)uniform(-1, 1);
  size_t scratch = li.scratch_bytes;
  if (fi.scratch_bytes > scratch) scratch = fi.scratch_bytes;
  if (ai.scratch_bytes > scratch) scratch = ai.scratch_bytes;
  op_worker wk = {.stream = stream, .scratch_bytes = scratch,
                  .scratch = scratch ? malloc(scratch) : NULL};
  op_bufs lb = {.in = {(float *)x, (float *)w, b}, .out = (float *)y};
  op_bufs ab = {.in = {(float *)y, (float *)r}, .out = (float *)z};
  op_bufs fb = {.in = {(float *)x, (float *)w, b, (float *)r},
                .out = (float *)zf};
  for (int64_t t = 0; t < li.fwd[0].tiles; t++)
    assert_int_equal(li.fwd[0].fn(&li, &lb, t, &wk), REMAT_OK);
  for (int64_t t = 0; t < ai.fwd[0].tiles; t++)
    assert_int_equal(ai.fwd[0].fn(&ai, &ab, t, &wk), REMAT_OK);
  for (int64_t t = 0; t < fi.fused.tiles; t++)
    assert_int_equal(fi.fused.fn(&fi, &fb, t, &wk), REMAT_OK);
  double ef = 0, eu = 0, worst = 0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t m = 0; m < M; m++) {
      double want = b[m] + bf16_to_f32(r[n * M + m]), mag = fabs(b[m]);
      for (int64_t k = 0; k < K; k++) {
        double p = (double)bf16_to_f32(x[n * K + k]) *
                   bf16_to_f32(w[m * K + k]);
        want += p;
        mag += fabs(p);
      }
      double f = bf16_to_f32(zf[n * M + m]), u = bf16_to_f32(z[n * M + m]);
      ef += (f - want) * (f - want);
      eu += (u - want) * (u - want);
      double bound = 0x1p-8 * fabs(want) + 1e-5 * mag + 1e-30;
      worst = fmax(worst, fabs(f - want) / bound);
      if (fabs(f - want) > bound)
        fail_msg("bf16 fused z[%lld,%lld] = %.6g, exact %.6g, separate "
                 "kernels %.6g",
                 (long long)n, (long long)m, f, want, u);
    }
  if (ef > eu)
    fail_msg("bf16 fused squared error %.3g above the separate kernels' %.3g",
             ef, eu);
  free(x); free(w); free(r); free(y); free(z); free(zf); free(b);
  free(wk.scratch);
  op_instance_release(&li);
  op_instance_release(&ai);
  op_instance_release(&fi);
}

static void test_fused_add_bf16_rounding(void **state) {
  (void)state;
  rng_state = 0x2545f4914f6cdd1dull;
  fused_add_bf16_case(96, 64, 80);
  fused_add_bf16_case(1000, 128, 128);
  fused_add_bf16_case(700, 512, 128);
  fused_add_bf16_case(2100, 128, 512);
}

/* A small graph on one thread: x [8,16] -> y = linear(x, w, b) [8,24]
 * and what `shape` builds on y; compiled (forward only when no loss). */
typedef enum shape_kind {
  GELU_ERF_FORWARD, /* out = gelu_erf(y), kept; forward only */
  TWO_READERS,      /* loss = mean(add(add(y, r), relu(y))) */
  KEPT,             /* y kept; loss = mean(add(r, y)) */
  ADD_FIRST,        /* loss = mean(add(y, r)): y is the add's input 0 */
} shape_kind;

typedef struct small {
  remat_runtime *rt;
  remat_graph *g;
  remat_tensor *out;
} small;

static void small_open(small *s, shape_kind kind, const char *fuse) {
  setenv("REMAT_FUSE", fuse, 1);
  remat_config rc = config(1, "nothing_saveable", REMAT_PRECISION_F32);
  assert_int_equal(remat_runtime_create(&rc, &s->rt), REMAT_OK);
  assert_int_equal(remat_graph_create(s->rt, &s->g), REMAT_OK);
  remat_graph *g = s->g;
  int64_t xd[2] = {8, 16}, wd[2] = {24, 16}, bd[1] = {24}, yd[2] = {8, 24};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, xd);
  remat_tensor *r = remat_input(g, "r", REMAT_F32, 2, yd);
  remat_tensor *w = remat_param(g, "w", 2, wd, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *b = remat_param(g, "b", 1, bd, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *y = remat_linear(g, x, w, b), *loss = NULL;
  switch (kind) {
  case GELU_ERF_FORWARD:
    s->out = remat_gelu(g, y, REMAT_GELU_ERF);
    assert_int_equal(remat_keep(g, s->out), REMAT_OK);
    break;
  case TWO_READERS: {
    remat_tensor *a = remat_add(g, y, r);
    loss = remat_mean(g, remat_add(g, a, remat_relu(g, y)));
    break;
  }
  case KEPT:
    assert_int_equal(remat_keep(g, y), REMAT_OK);
    loss = remat_mean(g, remat_add(g, r, y));
    break;
  case ADD_FIRST:
    loss = remat_mean(g, remat_add(g, y, r));
    break;
  }
  assert_int_equal(remat_compile(g, loss, NULL), REMAT_OK);
  float xv[8 * 16], rv[8 * 24];
  for (int i = 0; i < 8 * 16; i++)
    xv[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
  for (int i = 0; i < 8 * 24; i++)
    rv[i] = (float)((i * 29) % 17) / 8.0f - 1.0f;
  assert_int_equal(remat_feed(g, x, xv, sizeof xv), REMAT_OK);
  assert_int_equal(remat_feed(g, r, rv, sizeof rv), REMAT_OK);
  if (loss != NULL)
    s->out = loss;
}

static void small_close(small *s) {
  remat_graph_destroy(s->g);
  remat_runtime_destroy(s->rt);
}

static int fused_nodes(const remat_graph *g) {
  return count(g, KNODE_FORWARD, "linear.fwd_add") +
         count(g, KNODE_FORWARD, "linear.fwd_gelu") +
         count(g, KNODE_RECOMPUTE, "linear.fwd_add") +
         count(g, KNODE_RECOMPUTE, "linear.fwd_gelu");
}

/* Fusion happens only where the linear's output has one reader and is not
 * kept; the erf form fuses (forward only) with the same bits; an add fuses
 * whichever of its inputs the linear's output is. */
static void test_fuse_only_where_allowed(void **state) {
  (void)state;
  char *saved = getenv("REMAT_FUSE") ? strdup(getenv("REMAT_FUSE")) : NULL;
  small s;
  float fused[8 * 24], plain[8 * 24];
  for (int on = 1; on >= 0; on--) {
    small_open(&s, GELU_ERF_FORWARD, on ? "1" : "0");
    assert_int_equal(count(s.g, KNODE_FORWARD, "linear.fwd_gelu"), on);
    assert_int_equal(remat_forward(s.g, NULL), REMAT_OK);
    assert_int_equal(remat_read(s.g, s.out, on ? fused : plain, sizeof fused),
                     REMAT_OK);
    small_close(&s);
  }
  assert_memory_equal(fused, plain, sizeof fused);
  small_open(&s, TWO_READERS, "1");
  assert_int_equal(fused_nodes(s.g), 0);
  assert_int_equal(remat_step(s.g, NULL), REMAT_OK);
  small_close(&s);
  small_open(&s, KEPT, "1");
  assert_int_equal(fused_nodes(s.g), 0);
  small_close(&s);
  small_open(&s, ADD_FIRST, "1");
  assert_int_equal(count(s.g, KNODE_FORWARD, "linear.fwd_add"), 1);
  float loss[2];
  assert_int_equal(remat_step(s.g, NULL), REMAT_OK);
  assert_int_equal(remat_read(s.g, s.out, &loss[0], sizeof *loss), REMAT_OK);
  small_close(&s);
  small_open(&s, ADD_FIRST, "0");
  assert_int_equal(remat_step(s.g, NULL), REMAT_OK);
  assert_int_equal(remat_read(s.g, s.out, &loss[1], sizeof *loss), REMAT_OK);
  small_close(&s);
  assert_memory_equal(&loss[0], &loss[1], sizeof *loss);
  restore_env(saved);
  free(saved);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fused_nodes),
      cmocka_unit_test(test_fused_matches_unfused),
      cmocka_unit_test(test_fused_bitwise_threads),
      cmocka_unit_test(test_fuse_only_where_allowed),
      cmocka_unit_test(test_fuse_env_refused),
      cmocka_unit_test(test_op_fuse_refused),
      cmocka_unit_test(test_fused_add_bf16_rounding),
      cmocka_unit_test(test_fused_bf16_accuracy),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
