/* Data parallel over MPI, run under mpirun -np 2 (tests/mpi_test.sh): two
 * ranks with micro-batch b against one process with batch 2b, parameters
 * bitwise equal across ranks and across repeated runs, and a NaN or an
 * allocation failure on one rank stopping every rank's update. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <mpi.h>

#include "base/alloc.h"
#include "gpt_fixture.h"
#include "remat_mpi.h"

static const remat_gpt_config micro = {
    .layers = 2, .d_model = 32, .heads = 2, .seq = 8, .batch = 2, .vocab = 48};
static const remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-2f};
/* SGD for the comparison with one process: an update proportional to the
 * gradient keeps the parameters as close as the gradients (AdamW's first
 * step divides each gradient by its own magnitude, so gradients that
 * differ by 1e-7 in the last bits near zero move parameters apart). */
static const remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.1f};

static int rank, world;

static remat_config one_thread(void) {
  return (remat_config){.set = REMAT_SET_NUM_THREADS | REMAT_SET_BIND |
                               REMAT_SET_POLICY | REMAT_SET_TRACE,
                        .num_threads = 1,
                        .bind = REMAT_BIND_NONE,
                        .policy = "nothing_saveable"};
}

/* A GPT of config c, data parallel over MPI_COMM_WORLD when dp. */
typedef struct model {
  remat_runtime *rt;
  remat_graph *g;
  remat_gpt m;
  remat_gpt_config cfg;
} model;

static void model_open_opt(model *md, const remat_gpt_config *c, bool dp,
                           const remat_optimizer *opt) {
  memset(md, 0, sizeof *md);
  md->cfg = *c;
  remat_config rc = one_thread();
  assert_int_equal(remat_runtime_create(&rc, &md->rt), REMAT_OK);
  assert_int_equal(remat_graph_create(md->rt, &md->g), REMAT_OK);
  assert_int_equal(remat_graph_seed(md->g, 7), REMAT_OK);
  assert_int_equal(remat_gpt_build(md->g, c, &md->m), REMAT_OK);
  if (dp)
    assert_int_equal(remat_graph_data_parallel(md->g, MPI_COMM_WORLD),
                     REMAT_OK);
  assert_int_equal(remat_compile(md->g, md->m.loss, opt), REMAT_OK);
}

static void model_open(model *md, const remat_gpt_config *c, bool dp) {
  model_open_opt(md, c, dp, &adamw);
}

static void model_close(model *md) {
  remat_graph_destroy(md->g);
  remat_runtime_destroy(md->rt);
}

/* Feeds rows [row, row + cfg.batch) of a batch of `rows` rows made by
 * fixture_batch with `seed`. */
static void model_feed(model *md, int rows, int row, uint32_t seed) {
  remat_gpt_config all = md->cfg;
  all.batch = rows;
  size_t n = (size_t)rows * (size_t)all.seq;
  int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
  assert_non_null(tok);
  assert_non_null(tgt);
  fixture_batch(&all, tok, tgt, seed);
  size_t off = (size_t)row * (size_t)all.seq;
  size_t mine = (size_t)md->cfg.batch * (size_t)all.seq * sizeof *tok;
  assert_int_equal(remat_feed(md->g, md->m.tokens, tok + off, mine), REMAT_OK);
  assert_int_equal(remat_feed(md->g, md->m.targets, tgt + off, mine),
                   REMAT_OK);
  free(tok);
  free(tgt);
}

static uint64_t param_hash(remat_graph *g) {
  size_t count;
  float *all = fixture_snapshot(g, &count);
  assert_non_null(all);
  uint64_t h = 1469598103934665603ull;
  const unsigned char *b = (const unsigned char *)all;
  for (size_t k = 0; k < count * sizeof *all; k++)
    h = (h ^ b[k]) * 1099511628211ull;
  free(all);
  return h;
}

/* Largest |a - b| over largest |b|, per tensor, as one figure. */
static double rel_diff(const float *a, const float *b, size_t n) {
  double d = 0.0, m = 0.0;
  for (size_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - (double)b[i]));
    m = fmax(m, fabs((double)b[i]));
  }
  return m > 0.0 ? d / m : d;
}

/* Every rank's value equals rank 0's. */
static void assert_same_on_all_ranks(uint64_t h) {
  uint64_t all[64];
  assert_true(world <= 64);
  MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (int r = 1; r < world; r++)
    if (all[r] != all[0])
      fail_msg("rank %d's parameters hash %016llx, rank 0's %016llx", r,
               (unsigned long long)all[r], (unsigned long long)all[0]);
}

/* world ranks of micro-batch b against one process with batch world * b:
 * loss, every gradient and every updated parameter within 1e-6 (relative
 * to the tensor's largest magnitude), three steps. */
static void test_matches_one_process(void **state) {
  (void)state;
  remat_gpt_config big = micro;
  big.batch = micro.batch * world;
  model dp, ref;
  model_open_opt(&dp, &micro, true, &sgd);
  model_open_opt(&ref, &big, false, &sgd);
  for (int step = 0; step < 3; step++) {
    model_feed(&dp, big.batch, rank * micro.batch, 11 + (uint32_t)step);
    model_feed(&ref, big.batch, 0, 11 + (uint32_t)step);
    remat_step_stats a = {.size = sizeof a}, b = {.size = sizeof b};
    assert_int_equal(remat_step(dp.g, &a), REMAT_OK);
    assert_int_equal(remat_step(ref.g, &b), REMAT_OK);
    double dl = fabs((double)a.loss - (double)b.loss) / fabs((double)b.loss);
    if (!(dl <= 1e-6))
      fail_msg("step %d: loss %.9g over %d ranks, %.9g in one process", step,
               (double)a.loss, world, (double)b.loss);
    for (int i = 0; i < remat_num_params(dp.g); i++) {
      remat_tensor *p = remat_param_at(dp.g, i), *q = remat_param_at(ref.g, i);
      size_t n = (size_t)remat_tensor_numel(p);
      float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
      assert_non_null(x);
      assert_non_null(y);
      assert_int_equal(remat_read_grad(dp.g, p, x, n * sizeof *x), REMAT_OK);
      assert_int_equal(remat_read_grad(ref.g, q, y, n * sizeof *y), REMAT_OK);
      double dg = rel_diff(x, y, n);
      assert_int_equal(remat_read(dp.g, p, x, n * sizeof *x), REMAT_OK);
      assert_int_equal(remat_read(ref.g, q, y, n * sizeof *y), REMAT_OK);
      double dw = rel_diff(x, y, n);
      if (!(dg <= 1e-6) || !(dw <= 1e-6))
        fail_msg("step %d, '%s': gradient differs by %.3g, parameter by %.3g "
                 "(relative)",
                 step, remat_tensor_name(p), dg, dw);
      free(x);
      free(y);
    }
  }
  remat_dp_stats st;
  assert_int_equal(remat_graph_dp_stats(dp.g, &st), REMAT_OK);
  assert_int_equal(st.world_size, world);
  assert_int_equal(st.rank, rank);
  assert_int_equal(st.steps, 3);
  assert_true(st.buckets >= 1);
  /* Every gradient float once per step, and the agreement (a double and
   * twelve int64s: NaN/Inf, the failure as one status-and-rank key, and
   * five values the update uses, each with its negation). */
  int64_t floats = 0;
  for (int i = 0; i < remat_num_params(dp.g); i++)
    floats += remat_tensor_numel(remat_param_at(dp.g, i));
  assert_int_equal(st.comm_bytes, 3 * (floats * 4 + 8 + 12 * 8));
  assert_true(st.comm_s > 0.0 && st.exposed_comm_s >= 0.0);
  /* The bucket (one, at the default size) is in the arena: the step's
   * peak_bytes and its prediction exceed those of the same model without
   * data parallelism by its buffer, the gradients and one float in whole
   * 64-byte lines. */
  assert_int_equal(st.buckets, 1);
  int64_t bucket = (floats * 4 + 4 + 63) / 64 * 64;
  model solo;
  model_open_opt(&solo, &micro, false, &sgd);
  model_feed(&dp, big.batch, rank * micro.batch, 20);
  model_feed(&solo, big.batch, rank * micro.batch, 20);
  remat_step_stats a = {.size = sizeof a}, b = {.size = sizeof b};
  assert_int_equal(remat_step(dp.g, &a), REMAT_OK);
  assert_int_equal(remat_step(solo.g, &b), REMAT_OK);
  if (a.peak_bytes - b.peak_bytes != bucket ||
      a.predicted_peak_bytes - b.predicted_peak_bytes != bucket)
    fail_msg("peak_bytes %lld (predicted %lld) over %d ranks, %lld (%lld) "
             "alone: expected the bucket's %lld bytes more",
             (long long)a.peak_bytes, (long long)a.predicted_peak_bytes, world,
             (long long)b.peak_bytes, (long long)b.predicted_peak_bytes,
             (long long)bucket);
  model_close(&solo);
  model_close(&dp);
  model_close(&ref);
}

/* Accumulation with clipping: each rank accumulates two micro-batches of
 * b rows and steps; one process does the same with 2b rows per
 * micro-batch (rows of each micro-batch split between the ranks). The
 * parameters after the update (SGD), the gradient norm and the mean loss
 * agree within 1e-6. */
static void test_accumulate_matches_one_process(void **state) {
  (void)state;
  remat_gpt_config big = micro;
  big.batch = micro.batch * world;
  model dp, ref;
  model_open_opt(&dp, &micro, true, &sgd);
  model_open_opt(&ref, &big, false, &sgd);
  assert_int_equal(remat_set_clip(dp.g, 0.5f), REMAT_OK);
  assert_int_equal(remat_set_clip(ref.g, 0.5f), REMAT_OK);
  remat_step_stats a = {.size = sizeof a}, b = {.size = sizeof b};
  double la = 0.0, lb = 0.0;
  for (int k = 0; k < 2; k++) {
    model_feed(&dp, big.batch, rank * micro.batch, 60 + (uint32_t)k);
    model_feed(&ref, big.batch, 0, 60 + (uint32_t)k);
    if (k == 0) {
      assert_int_equal(remat_accumulate(dp.g, &a), REMAT_OK);
      assert_int_equal(remat_accumulate(ref.g, &b), REMAT_OK);
    } else {
      assert_int_equal(remat_step(dp.g, &a), REMAT_OK);
      assert_int_equal(remat_step(ref.g, &b), REMAT_OK);
    }
    la += a.loss;
    lb += b.loss;
  }
  if (!(fabs(la - lb) <= 1e-6 * fabs(lb)) ||
      !(fabs(a.grad_norm - b.grad_norm) <= 1e-6 * b.grad_norm))
    fail_msg("loss %.9g / %.9g, gradient norm %.9g / %.9g (ranks / one "
             "process)", la / 2, lb / 2, a.grad_norm, b.grad_norm);
  assert_true(b.grad_norm > 0.5); /* the clip acted */
  for (int i = 0; i < remat_num_params(dp.g); i++) {
    remat_tensor *p = remat_param_at(dp.g, i), *q = remat_param_at(ref.g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(remat_read(dp.g, p, x, n * sizeof *x), REMAT_OK);
    assert_int_equal(remat_read(ref.g, q, y, n * sizeof *y), REMAT_OK);
    double dw = rel_diff(x, y, n);
    if (!(dw <= 1e-6))
      fail_msg("'%s': parameter differs by %.3g (relative)",
               remat_tensor_name(p), dw);
    free(x);
    free(y);
  }
  assert_same_on_all_ranks(param_hash(dp.g));
  model_close(&dp);
  model_close(&ref);
}

/* Different data and different starting parameters on each rank, five
 * steps: parameters bitwise equal on every rank, and a second run from the same seed bitwise equal to the
 * first. */
static void test_bitwise_across_ranks_and_runs(void **state) {
  (void)state;
  uint64_t h[2];
  for (int run = 0; run < 2; run++) {
    model dp;
    model_open(&dp, &micro, true);
    if (rank != 0) { /* rank 0's parameters win at the first step */
      remat_tensor *p = remat_param_at(dp.g, 0);
      size_t n = (size_t)remat_tensor_numel(p);
      float *w = calloc(n, sizeof *w);
      assert_non_null(w);
      assert_int_equal(remat_write(dp.g, p, w, n * sizeof *w), REMAT_OK);
      free(w);
    }
    for (int step = 0; step < 5; step++) {
      model_feed(&dp, micro.batch * world, rank * micro.batch,
                 100 + (uint32_t)step);
      assert_int_equal(remat_step(dp.g, NULL), REMAT_OK);
    }
    h[run] = param_hash(dp.g);
    assert_same_on_all_ranks(h[run]);
    model_close(&dp);
  }
  assert_true(h[0] == h[1]);
}

/* NaNs in one parameter of the last rank only (after the first step's
 * broadcast): every rank returns REMAT_ERR_NUMERIC and updates nothing;
 * with the parameter restored the next step updates everywhere alike. */
static void test_nan_on_one_rank(void **state) {
  (void)state;
  model dp;
  model_open(&dp, &micro, true);
  model_feed(&dp, micro.batch * world, rank * micro.batch, 5);
  assert_int_equal(remat_step(dp.g, NULL), REMAT_OK);
  remat_tensor *p = remat_param_at(dp.g, 0);
  size_t n = (size_t)remat_tensor_numel(p);
  float *keep = malloc(n * sizeof *keep);
  assert_non_null(keep);
  assert_int_equal(remat_read(dp.g, p, keep, n * sizeof *keep), REMAT_OK);
  if (rank == world - 1) {
    float *bad = malloc(n * sizeof *bad);
    assert_non_null(bad);
    for (size_t i = 0; i < n; i++)
      bad[i] = NAN; /* every token's embedding */
    assert_int_equal(remat_write(dp.g, p, bad, n * sizeof *bad), REMAT_OK);
    free(bad);
  }
  size_t count, again;
  float *before = fixture_snapshot(dp.g, &count);
  assert_non_null(before);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(dp.g, &st), REMAT_ERR_NUMERIC);
  assert_int_equal(st.nonfinite, 1);
  float *after = fixture_snapshot(dp.g, &again);
  assert_non_null(after);
  assert_memory_equal(before, after, count * sizeof *before);
  free(after);
  assert_int_equal(remat_write(dp.g, p, keep, n * sizeof *keep), REMAT_OK);
  assert_int_equal(remat_step(dp.g, NULL), REMAT_OK);
  assert_same_on_all_ranks(param_hash(dp.g));
  free(before);
  free(keep);
  model_close(&dp);
}

/* The last rank's first step fails to allocate: every rank returns
 * REMAT_ERR_OUT_OF_MEMORY (the others naming the failed rank), nothing is
 * updated, and the next step works and updates everywhere alike. */
static void test_oom_on_one_rank(void **state) {
  (void)state;
  model dp;
  model_open(&dp, &micro, true);
  model_feed(&dp, micro.batch * world, rank * micro.batch, 9);
  size_t count, again;
  float *before = fixture_snapshot(dp.g, &count);
  assert_non_null(before);
  if (rank == world - 1)
    remat__alloc_fail_after(1);
  remat_status s = remat_step(dp.g, NULL);
  remat__alloc_fail_after(0);
  assert_int_equal(s, REMAT_ERR_OUT_OF_MEMORY);
  if (rank != world - 1) {
    char want[160];
    snprintf(want, sizeof want,
             "remat_step: rank %d of %d failed (REMAT_ERR_OUT_OF_MEMORY); no "
             "rank applied the update",
             world - 1, world);
    assert_string_equal(remat_last_error(), want);
  }
  float *after = fixture_snapshot(dp.g, &again);
  assert_non_null(after);
  assert_memory_equal(before, after, count * sizeof *before);
  assert_int_equal(remat_step(dp.g, NULL), REMAT_OK);
  float *updated = fixture_snapshot(dp.g, &again);
  assert_non_null(updated);
  assert_true(memcmp(before, updated, count * sizeof *before) != 0);
  assert_same_on_all_ranks(param_hash(dp.g));
  free(before);
  free(after);
  free(updated);
  model_close(&dp);
}

/* Buckets of at most 1 KiB (one per large gradient) against the default
 * (one bucket for this small model): every element is still the sum of
 * the same two values, so the parameters after three steps are bitwise
 * the same. */
static void test_bucket_size(void **state) {
  (void)state;
  uint64_t h[2];
  int buckets[2];
  for (int run = 0; run < 2; run++) {
    model md;
    memset(&md, 0, sizeof md);
    md.cfg = micro;
    remat_config rc = one_thread();
    assert_int_equal(remat_runtime_create(&rc, &md.rt), REMAT_OK);
    assert_int_equal(remat_graph_create(md.rt, &md.g), REMAT_OK);
    assert_int_equal(remat_graph_seed(md.g, 7), REMAT_OK);
    assert_int_equal(remat_gpt_build(md.g, &micro, &md.m), REMAT_OK);
    assert_int_equal(remat_graph_dp_bucket_bytes(md.g, 1024),
                     REMAT_ERR_INVALID_ARG); /* not data parallel yet */
    assert_int_equal(remat_graph_data_parallel(md.g, MPI_COMM_WORLD),
                     REMAT_OK);
    if (run == 1)
      assert_int_equal(remat_graph_dp_bucket_bytes(md.g, 1024), REMAT_OK);
    assert_int_equal(remat_compile(md.g, md.m.loss, &adamw), REMAT_OK);
    assert_int_equal(remat_graph_dp_bucket_bytes(md.g, 1024),
                     REMAT_ERR_INVALID_ARG); /* compiled */
    for (int step = 0; step < 3; step++) {
      model_feed(&md, micro.batch * world, rank * micro.batch,
                 40 + (uint32_t)step);
      assert_int_equal(remat_step(md.g, NULL), REMAT_OK);
    }
    remat_dp_stats st;
    assert_int_equal(remat_graph_dp_stats(md.g, &st), REMAT_OK);
    buckets[run] = st.buckets;
    h[run] = param_hash(md.g);
    model_close(&md);
  }
  int large = 0; /* gradients of more than 1 KiB: a bucket each */
  model md;
  model_open(&md, &micro, false);
  for (int i = 0; i < remat_num_params(md.g); i++)
    large += remat_tensor_numel(remat_param_at(md.g, i)) * 4 > 1024;
  model_close(&md);
  assert_int_equal(buckets[0], 1);
  assert_true(buckets[1] > large);
  assert_true(h[0] == h[1]);
}

/* What the last rank builds differently from the others in
 * test_different_steps. */
typedef enum variant {
  WIDER,           /* d_model 64 */
  DEEPER,          /* 3 layers */
  SGD_OPTIMIZER,   /* SGD instead of AdamW */
  WEIGHT_DECAY,    /* AdamW with weight decay 0.1 */
  SMALL_BUCKETS,   /* buckets of 1 KiB */
  NVARIANTS
} variant;

/* The model of test_different_steps: the last rank builds variant v. */
static void open_variant(model *md, variant v) {
  bool odd = rank == world - 1;
  remat_gpt_config c = micro;
  remat_optimizer opt = adamw;
  if (odd && v == WIDER)
    c.d_model = 64;
  if (odd && v == DEEPER)
    c.layers = 3;
  if (odd && v == SGD_OPTIMIZER)
    opt = sgd;
  if (odd && v == WEIGHT_DECAY)
    opt.weight_decay = 0.1f;
  memset(md, 0, sizeof *md);
  md->cfg = c;
  remat_config rc = one_thread();
  assert_int_equal(remat_runtime_create(&rc, &md->rt), REMAT_OK);
  assert_int_equal(remat_graph_create(md->rt, &md->g), REMAT_OK);
  assert_int_equal(remat_graph_seed(md->g, 7 + (uint64_t)rank), REMAT_OK);
  assert_int_equal(remat_gpt_build(md->g, &c, &md->m), REMAT_OK);
  assert_int_equal(remat_graph_data_parallel(md->g, MPI_COMM_WORLD),
                   REMAT_OK);
  if (odd && v == SMALL_BUCKETS)
    assert_int_equal(remat_graph_dp_bucket_bytes(md->g, 1024), REMAT_OK);
  assert_int_equal(remat_compile(md->g, md->m.loss, &opt), REMAT_OK);
}

/* The last rank built a different step (wider, deeper, another optimizer
 * or weight decay, other buckets): every rank's first step fails with
 * REMAT_ERR_INVALID_ARG and the same message naming the first difference
 * with both values, before anything is sent that is sized by the step
 * (a wider rank wrote past a buffer in the broadcast before); no
 * parameter changes, and a second try fails alike. */
static void test_different_steps(void **state) {
  (void)state;
  char want[NVARIANTS][200];
  snprintf(want[WIDER], sizeof want[WIDER],
           "parameter 0 is 'wte' f32 [48,64] on rank %d and 'wte' f32 "
           "[48,32] on rank 0", world - 1);
  snprintf(want[DEEPER], sizeof want[DEEPER],
           "parameter count is 41 on rank %d and 29 on rank 0", world - 1);
  snprintf(want[SGD_OPTIMIZER], sizeof want[SGD_OPTIMIZER],
           "optimizer is sgd on rank %d and adamw on rank 0", world - 1);
  snprintf(want[WEIGHT_DECAY], sizeof want[WEIGHT_DECAY],
           "weight decay is 0.100000001 on rank %d and 0 on rank 0",
           world - 1);
  for (int v = 0; v < NVARIANTS; v++) {
    model md;
    open_variant(&md, (variant)v);
    if (v == SMALL_BUCKETS) { /* the last rank's count, as its stats say */
      remat_dp_stats st;
      assert_int_equal(remat_graph_dp_stats(md.g, &st), REMAT_OK);
      int most = 0;
      MPI_Allreduce(&st.buckets, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      assert_true(most > 1);
      snprintf(want[v], sizeof want[v],
               "allreduce buckets is %d on rank %d and 1 on rank 0", most,
               world - 1);
    }
    size_t count, again;
    float *before = fixture_snapshot(md.g, &count);
    assert_non_null(before);
    char msg[300];
    snprintf(msg, sizeof msg,
             "remat_step: the ranks built different steps: %.200s; no rank "
             "stepped",
             want[v]);
    for (int attempt = 0; attempt < 2; attempt++) {
      model_feed(&md, md.cfg.batch * world, rank * md.cfg.batch, 21);
      assert_int_equal(remat_step(md.g, NULL), REMAT_ERR_INVALID_ARG);
      assert_string_equal(remat_last_error(), msg);
    }
    float *after = fixture_snapshot(md.g, &again);
    assert_non_null(after);
    assert_int_equal(again, count);
    assert_memory_equal(before, after, count * sizeof *before);
    free(before);
    free(after);
    model_close(&md);
  }
}

/* After a first step that worked, the last rank sets another learning
 * rate, a clipping norm, or accumulates while the others step: every rank
 * fails with REMAT_ERR_INVALID_ARG naming the value and its smallest and
 * largest, no parameter changes (they went apart silently before), and
 * with the value the same again the next step works everywhere alike. */
static void test_different_step_values(void **state) {
  (void)state;
  model md;
  model_open(&md, &micro, true);
  model_feed(&md, micro.batch * world, rank * micro.batch, 31);
  assert_int_equal(remat_step(md.g, NULL), REMAT_OK);
  bool odd = rank == world - 1;
  const char *want[] = {
      "remat_step: the learning rate is not the same on every rank "
      "(smallest 0.01, largest 0.02); no rank applied the update",
      "remat_step: the clipping norm (remat_set_clip) is not the same on "
      "every rank (smallest 0, largest 0.5); no rank applied the update",
      "remat_step: some ranks called remat_step and others "
      "remat_accumulate; no rank applied the update",
  };
  for (int k = 0; k < 3; k++) {
    if (odd && k == 0)
      assert_int_equal(remat_set_lr(md.g, 0.02f), REMAT_OK);
    if (odd && k == 1)
      assert_int_equal(remat_set_clip(md.g, 0.5f), REMAT_OK);
    size_t count, again;
    float *before = fixture_snapshot(md.g, &count);
    assert_non_null(before);
    model_feed(&md, micro.batch * world, rank * micro.batch,
               32 + (uint32_t)k);
    remat_status s = k == 2 && odd ? remat_accumulate(md.g, NULL)
                                   : remat_step(md.g, NULL);
    assert_int_equal(s, REMAT_ERR_INVALID_ARG);
    if (k == 2 && odd) /* the same words, from remat_accumulate */
      assert_string_equal(remat_last_error(),
                          "remat_accumulate: some ranks called remat_step "
                          "and others remat_accumulate; no rank applied the "
                          "update");
    else
      assert_string_equal(remat_last_error(), want[k]);
    float *after = fixture_snapshot(md.g, &again);
    assert_non_null(after);
    assert_memory_equal(before, after, count * sizeof *before);
    if (odd && k == 0)
      assert_int_equal(remat_set_lr(md.g, adamw.lr), REMAT_OK);
    if (odd && k == 1)
      assert_int_equal(remat_set_clip(md.g, 0.0f), REMAT_OK);
    assert_int_equal(remat_step(md.g, NULL), REMAT_OK);
    float *updated = fixture_snapshot(md.g, &again);
    assert_non_null(updated);
    assert_true(memcmp(before, updated, count * sizeof *before) != 0);
    assert_same_on_all_ranks(param_hash(md.g));
    free(before);
    free(after);
    free(updated);
  }
  model_close(&md);
}

/* The API's refusals. */
static void test_api_errors(void **state) {
  (void)state;
  assert_int_equal(remat_graph_data_parallel(NULL, MPI_COMM_WORLD),
                   REMAT_ERR_INVALID_ARG);
  model md;
  model_open(&md, &micro, false);
  assert_int_equal(remat_graph_data_parallel(md.g, MPI_COMM_WORLD),
                   REMAT_ERR_STATE);
  assert_string_equal(remat_last_error(),
                      "remat_graph_data_parallel: call it once, before "
                      "remat_compile");
  remat_dp_stats st;
  assert_int_equal(remat_graph_dp_stats(md.g, &st), REMAT_ERR_STATE);
  model_close(&md);
  /* Bad environment values are refused before any collective. */
  remat_config rc = one_thread();
  remat_runtime *rt;
  remat_graph *g;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  setenv("REMAT_DP_BUCKET_BYTES", "lots", 1);
  assert_int_equal(remat_graph_data_parallel(g, MPI_COMM_WORLD),
                   REMAT_ERR_CONFIG);
  assert_string_equal(remat_last_error(),
                      "remat_graph_data_parallel: REMAT_DP_BUCKET_BYTES='lots' "
                      "is not a byte size from 4 to 4GiB (e.g. 1MiB)");
  unsetenv("REMAT_DP_BUCKET_BYTES");
  setenv("REMAT_DP_TIMEOUT", "0", 1);
  assert_int_equal(remat_graph_data_parallel(g, MPI_COMM_WORLD),
                   REMAT_ERR_CONFIG);
  assert_string_equal(remat_last_error(),
                      "remat_graph_data_parallel: REMAT_DP_TIMEOUT='0' is not "
                      "a number of seconds above 0 (at most 1e6)");
  unsetenv("REMAT_DP_TIMEOUT");
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

/* --late: the last rank sleeps past the timeout before its first step; rank
 * 0's first step must fail within the timeout (and 5 s to spare) with the
 * first step's check timing out, and its next step at once, then the job
 * is aborted (the late rank cannot finalize with us). */
static int run_late_mode(model *md) {
  model_feed(md, micro.batch * world, rank * micro.batch, 3);
  if (rank == world - 1) {
    sleep(15); /* past rank 0's 10 s, even if it started seconds later */
    remat_status s = remat_step(md->g, NULL); /* the broadcast times out */
    fprintf(stderr, "rank %d: %s\n", rank, remat_last_error());
    fflush(stderr);
    if (s != REMAT_OK) /* should rank 0's abort not have ended us yet */
      MPI_Abort(MPI_COMM_WORLD, 4);
    return 1;
  }
  double t0 = MPI_Wtime();
  remat_status s = remat_step(md->g, NULL);
  double waited = MPI_Wtime() - t0;
  fprintf(stderr, "rank %d: %s after %.1f s: %s\n", rank,
          remat_status_string(s), waited, remat_last_error());
  bool ok = s == REMAT_ERR_BACKEND && waited >= 5.0 && waited < 10.0 &&
            strcmp(remat_last_error(),
                   "remat_step: the first step's check that every rank "
                   "built the same step did not complete within 5 s: a rank "
                   "died, stopped stepping or has not started its first "
                   "step") == 0;
  t0 = MPI_Wtime();
  s = remat_step(md->g, NULL);
  waited = MPI_Wtime() - t0;
  fprintf(stderr, "rank %d: then %s after %.1f s: %s\n", rank,
          remat_status_string(s), waited, remat_last_error());
  ok = ok && s == REMAT_ERR_BACKEND && waited < 1.0 &&
       strstr(remat_last_error(), "remat_step: data parallel stopped after "
                                  "an earlier failure: the first step's "
                                  "check") == remat_last_error();
  if (ok)
    fprintf(stderr, "OK: late rank detected\n");
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  return 1;
}

/* --kill: the last rank dies (SIGKILL) after its first step; the others
 * step on until remat_step fails or mpirun ends them (tests/mpi_test.sh
 * checks that the job ends non-zero within 60 s). --stall: the last rank
 * stops stepping; rank 0's step must fail with the timeout's message
 * (REMAT_DP_TIMEOUT is set short), then the job is aborted. --late:
 * run_late_mode. */
static int run_failure_mode(const char *mode) {
  model md;
  model_open(&md, &micro, true);
  if (strcmp(mode, "--late") == 0)
    return run_late_mode(&md);
  model_feed(&md, micro.batch * world, rank * micro.batch, 3);
  if (remat_step(md.g, NULL) != REMAT_OK)
    return 2;
  if (rank == world - 1) {
    if (strcmp(mode, "--kill") == 0)
      raise(SIGKILL);
    sleep(60); /* --stall: never steps again */
    return 0;
  }
  for (int step = 0; step < 1000; step++) {
    remat_status s = remat_step(md.g, NULL);
    if (s != REMAT_OK) {
      fprintf(stderr, "rank %d: %s\n", rank, remat_last_error());
      if (strcmp(mode, "--stall") == 0 && s == REMAT_ERR_BACKEND &&
          strstr(remat_last_error(),
                 "an allreduce did not complete within 5 s: a rank died or "
                 "stopped stepping") != NULL)
        fprintf(stderr, "OK: stall detected\n");
      fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3); /* the dead or stalled peer cannot
                                       finalize with us */
    }
  }
  return 1; /* the failure went unnoticed */
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (provided < MPI_THREAD_MULTIPLE) {
    fprintf(stderr, "test_mpi: MPI gives thread level %d, not "
                    "MPI_THREAD_MULTIPLE\n", provided);
    MPI_Finalize();
    return 1;
  }
  if (argc > 1)
    return run_failure_mode(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_api_errors),
      cmocka_unit_test(test_matches_one_process),
      cmocka_unit_test(test_accumulate_matches_one_process),
      cmocka_unit_test(test_bitwise_across_ranks_and_runs),
      cmocka_unit_test(test_nan_on_one_rank),
      cmocka_unit_test(test_oom_on_one_rank),
      cmocka_unit_test(test_bucket_size),
      cmocka_unit_test(test_different_steps),
      cmocka_unit_test(test_different_step_values),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  MPI_Finalize();
  return failed;
}
