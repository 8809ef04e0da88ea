/* Tests of the NUMA placement stage on synthetic topologies of 2, 3 and 4
 * nodes: tiles are dealt to nodes in proportion to their workers, a tile
 * is pinned exactly when the rows it writes lie on its node, buffers are
 * sliced as their first writer's tiles are dealt, results are bitwise
 * those of one node, pinned tiles run on their node, and the plan's
 * remote bytes are a small part of the unplaced ones on the default
 * model. The expectations are computed here from the kernels' op_span,
 * not taken from the stage. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "gpt_fixture.h"
#include "runtime/exec/optim.h"
#include "runtime/exec/step_state.h"
#include "tmpdir.h"

static const char *const two_nodes = "package:2 numa:1 core:2 pu:1";
static const char *const three_nodes = "package:3 numa:1 core:1 pu:1";
static const char *const four_nodes = "package:1 numa:4 core:1 pu:1";
static const char *const one_node = "package:1 numa:1 core:2 pu:1";

/* 768 rows: linear row tiles of 128, layer norm tiles of 256, weight
 * gradients in two chunks of 384 rows, 48 attention tiles. */
static const remat_gpt_config mid = {.layers = 2, .d_model = 64, .heads = 4,
                                     .seq = 64, .batch = 12, .vocab = 40};

static const remat_optimizer adamw = {.kind = REMAT_OPT_ADAMW, .lr = 1e-3f,
                                      .weight_decay = 0.01f};

static void open_on(fixture *f, const remat_gpt_config *c, const char *topo,
                    int threads, const char *policy, const char *trace) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TOPOLOGY |
                            REMAT_SET_POLICY | REMAT_SET_TRACE,
                     .num_threads = threads,
                     .topology = topo,
                     .policy = policy,
                     .trace_path = trace};
  remat_status s = fixture_open_config(f, c, &rc, &adamw);
  if (s != REMAT_OK)
    fail_msg("%s, %d threads: %s", topo, threads, remat_last_error());
}

/* ---- what the kernels' spans say ---- */

/* A node's tiles as op_span describes them (the optimizer's: flat tiles
 * of OPTIM_TILE elements); rows 0: not row-tiled. */
static op_span span_of(const compiled_step *p, const plan_knode *kn) {
  if (kn->kernel != NULL)
    return kn->kernel->span;
  op_span s = {0};
  if (kn->kind == KNODE_CHECK || kn->kind == KNODE_UPDATE) {
    s.rows = op_numel(&p->g->tensors[kn->optim.param_tensor]->shape);
    s.row_block = OPTIM_TILE;
    s.row_tiles = 1;
  }
  return s;
}

/* Bytes [lo, hi) of buffer b that tile t of kn writes by rows or by its
 * share; false when it writes b whole or spread. */
static bool written_range(const compiled_step *p, const plan_knode *kn,
                          int64_t t, int32_t b, int64_t *lo, int64_t *hi) {
  op_span s = span_of(p, kn);
  int64_t bytes = p->low.bufs[b].bytes;
  uint32_t bit = 0;
  for (int k = 0; kn->kernel != NULL && k < PLAN_SLOTS; k++)
    if (kn->slot_buf[k] == b && ((kn->kernel->writes >> k) & 1u))
      bit |= 1u << k;
  bool rows = kn->kernel == NULL ? s.rows > 0 : (s.row_slots & bit) != 0;
  if (s.rows > 0 && rows) {
    int64_t r0 = t / s.row_tiles * s.row_block;
    int64_t r1 = r0 + s.row_block < s.rows ? r0 + s.row_block : s.rows;
    *lo = bytes * r0 / s.rows;
    *hi = bytes * r1 / s.rows;
    return true;
  }
  if (kn->kernel != NULL && (s.tile_slots & bit)) {
    *lo = bytes * t / kn->tiles;
    *hi = bytes * (t + 1) / kn->tiles;
    return true;
  }
  return false;
}

/* The node that holds `row` when `count` rows are shared in proportion to
 * each node's workers. */
static int node_of(remat_runtime *rt, int64_t count, int64_t row) {
  int nw = remat_runtime_num_threads(rt), node = 0;
  for (int w = 1; w < nw; w++) /* a node's workers are consecutive */
    if (remat_runtime_worker_node(rt, w) !=
            remat_runtime_worker_node(rt, w - 1) &&
        count * w / nw <= row)
      node = remat_runtime_worker_node(rt, w);
  return node;
}

static int64_t slice_lo(const numa_plan *n, int32_t b, int k) {
  return k == 0 ? 0 : n->slice_end[b * n->nnodes + k - 1];
}

static int64_t slice_hi(const numa_plan *n, int32_t b, int k) {
  return n->slice_end[b * n->nnodes + k];
}

/* Whether every byte tile t of kn writes outside parameters (which have a
 * copy per node) lies in node k's slice. */
static bool writes_on(const compiled_step *p, const plan_knode *kn, int64_t t,
                      int k) {
  knode_use uses[PLAN_MAX_USES];
  int nuses = knode_uses(kn, uses);
  for (int u = 0; u < nuses; u++) {
    int32_t b = uses[u].buf;
    if (!uses[u].writes || p->numa.replicated[b])
      continue;
    int64_t lo = 0, hi = p->low.bufs[b].bytes;
    written_range(p, kn, t, b, &lo, &hi);
    if (lo < slice_lo(&p->numa, b, k) || hi > slice_hi(&p->numa, b, k))
      return false;
  }
  return true;
}

/* ---- the deal and the pins ---- */

/* Every tile is dealt by its first row (row-tiled) or its number; a tile
 * is pinned exactly when it is row-tiled and writes only on its node. */
static void check_deal(const char *topo, int threads, int nnodes) {
  fixture f;
  open_on(&f, &mid, topo, threads, "everything_saveable", NULL);
  const compiled_step *p = &f.g->step->compiled;
  const numa_plan *n = &p->numa;
  assert_int_equal(n->nnodes, nnodes);
  int64_t pinned[4] = {0}, row_tiles = 0, unpinned_rows = 0, t0 = 0;
  for (int32_t i = 0; i < p->low.nknodes; i++) {
    const plan_knode *kn = &p->low.knodes[i];
    op_span s = span_of(p, kn);
    assert_int_equal(n->first_tile[i], t0);
    for (int64_t t = 0; t < kn->tiles; t++, t0++) {
      int64_t first = s.rows > 0 ? t / s.row_tiles * s.row_block : t;
      int k = node_of(f.rt, s.rows > 0 ? s.rows : kn->tiles, first);
      assert_int_equal(n->tile_node[t0], k);
      bool pin = s.rows > 0 && writes_on(p, kn, t, k);
      if (n->affinity[t0] != (pin ? k : -1))
        fail_msg("%s: tile %lld of %s: affinity %d, expected %d", topo,
                 (long long)t, kn->kernel ? kn->kernel->name : "optimizer",
                 n->affinity[t0], pin ? k : -1);
      pinned[k] += pin;
      row_tiles += s.rows > 0;
      unpinned_rows += s.rows > 0 && !pin;
    }
  }
  assert_int_equal(t0, n->ntiles);
  /* most row tiles are pinned, and every node gets about its share */
  assert_true(unpinned_rows * 10 < row_tiles);
  for (int k = 0; k < nnodes; k++)
    assert_true(pinned[k] * nnodes * 2 > row_tiles);
  if (nnodes == 3) /* 768 rows in thirds: some tiles straddle two nodes */
    assert_true(unpinned_rows > 0);
  fixture_close(&f);
}

static void test_deal_and_pins(void **state) {
  (void)state;
  check_deal(two_nodes, 4, 2);
  check_deal(three_nodes, 3, 3);
  check_deal(four_nodes, 4, 4);
}

/* ---- slices ---- */

/* Slice k of every buffer a row-tiled first writer writes by rows (or by
 * its share) is exactly what the tiles dealt to k write; any other buffer
 * lies whole in one slice; the arena home says the same. */
static void check_slices(const char *topo, int threads, int nnodes) {
  fixture f;
  open_on(&f, &mid, topo, threads, "nothing_saveable", NULL);
  const compiled_step *p = &f.g->step->compiled;
  const numa_plan *n = &p->numa;
  int64_t sliced = 0;
  for (int32_t b = 0; b < p->low.nbufs; b++) {
    const plan_buffer *buf = &p->low.bufs[b];
    int64_t lo[4], hi[4], nonempty = 0;
    for (int k = 0; k < nnodes; k++) {
      lo[k] = INT64_MAX;
      hi[k] = -1;
      nonempty += slice_hi(n, b, k) > slice_lo(n, b, k);
    }
    assert_int_equal(slice_hi(n, b, nnodes - 1), buf->bytes);
    const plan_knode *kn = buf->first_writer >= 0 && !n->replicated[b]
                               ? &p->low.knodes[buf->first_writer]
                               : NULL;
    bool by_rows = false;
    for (int64_t t = 0; kn != NULL && t < kn->tiles; t++) {
      int64_t a, z;
      if (!written_range(p, kn, t, b, &a, &z))
        break;
      by_rows = true;
      int k = n->tile_node[n->first_tile[buf->first_writer] + t];
      lo[k] = a < lo[k] ? a : lo[k];
      hi[k] = z > hi[k] ? z : hi[k];
    }
    for (int k = 0; by_rows && k < nnodes; k++)
      if (hi[k] >= 0) {
        assert_int_equal(slice_lo(n, b, k), lo[k]);
        assert_int_equal(slice_hi(n, b, k), hi[k]);
      } else {
        assert_int_equal(slice_lo(n, b, k), slice_hi(n, b, k));
      }
    if (!by_rows)
      assert_int_equal(nonempty, 1);
    sliced += nonempty > 1;
    if (nonempty > 1) {
      const mem_arena *arena = &f.g->step->state.arena;
      int home = n->home[b];
      assert_true(home >= nnodes && home < arena->nhomes);
      assert_memory_equal(arena->layout_ends + home * nnodes,
                          n->slice_end + b * nnodes,
                          (size_t)nnodes * sizeof(int64_t));
    } else {
      int home = n->home[b];
      assert_true(home >= 0 && home < nnodes);
      assert_true(slice_hi(n, b, home) > slice_lo(n, b, home) ||
                  buf->bytes == 0);
    }
  }
  assert_true(sliced > 20);
  fixture_close(&f);
}

static void test_slices_follow_the_deal(void **state) {
  (void)state;
  check_slices(two_nodes, 4, 2);
  check_slices(three_nodes, 3, 3);
  check_slices(four_nodes, 4, 4);
}

/* ---- the same bits on every machine ---- */

typedef struct step_bits {
  float loss[2];
  uint64_t grad_hash, param_hash;
  int64_t remote_bytes, remote_bytes_unplaced;
} step_bits;

static uint64_t hash_floats(const float *x, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char *bytes = (const unsigned char *)x;
  for (size_t k = 0; k < n * sizeof *x; k++)
    h = (h ^ bytes[k]) * 1099511628211ull;
  return h;
}

/* Every parameter's gradient has a non-zero element (a gradient that
 * nothing wrote stays zero, and would compare equal everywhere). */
static void expect_gradients(fixture *f) {
  for (int i = 0; i < remat_num_params(f->g); i++) {
    remat_tensor *p = remat_param_at(f->g, i);
    size_t n = (size_t)remat_tensor_numel(p), nonzero = 0;
    float *grad = malloc(n * sizeof *grad);
    assert_non_null(grad);
    assert_int_equal(remat_read_grad(f->g, p, grad, n * sizeof *grad),
                     REMAT_OK);
    for (size_t k = 0; k < n; k++)
      nonzero += grad[k] != 0.0f;
    free(grad);
    if (nonzero == 0)
      fail_msg("the gradient of '%s' is all zeros", remat_tensor_name(p));
  }
}

/* Two AdamW steps: both losses, the last gradients and the parameters. */
static step_bits two_steps(const char *topo, int threads, const char *policy) {
  fixture f;
  open_on(&f, &mid, topo, threads, policy, NULL);
  step_bits r;
  for (int s = 0; s < 2; s++) {
    remat_step_stats st = {.size = sizeof st};
    assert_int_equal(remat_step(f.g, &st), REMAT_OK);
    r.loss[s] = st.loss;
    r.remote_bytes = st.remote_bytes;
    r.remote_bytes_unplaced = st.remote_bytes_unplaced;
  }
  expect_gradients(&f);
  r.grad_hash = fixture_grad_hash(&f);
  size_t count;
  float *params = fixture_snapshot(f.g, &count);
  assert_non_null(params);
  r.param_hash = hash_floats(params, count);
  free(params);
  fixture_close(&f);
  return r;
}

static void test_same_bits_on_every_machine(void **state) {
  (void)state;
  step_bits one = two_steps(one_node, 1, "everything_saveable");
  assert_int_equal(one.remote_bytes, 0);
  assert_int_equal(one.remote_bytes_unplaced, 0);
  const struct {
    const char *topo;
    int threads;
    const char *policy;
  } runs[] = {{one_node, 2, "everything_saveable"},
              {two_nodes, 4, "everything_saveable"},
              {two_nodes, 3, "nothing_saveable"},
              {three_nodes, 3, "dots_saveable"},
              {four_nodes, 4, "everything_saveable"},
              {four_nodes, 2, "nothing_saveable"}};
  for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
    step_bits r = two_steps(runs[i].topo, runs[i].threads, runs[i].policy);
    if (memcmp(r.loss, one.loss, sizeof r.loss) != 0 ||
        r.grad_hash != one.grad_hash || r.param_hash != one.param_hash)
      fail_msg("%s, %d threads, %s: losses %.9g %.9g, hashes %016llx "
               "%016llx; on one node %.9g %.9g, %016llx %016llx",
               runs[i].topo, runs[i].threads, runs[i].policy, r.loss[0],
               r.loss[1], (unsigned long long)r.grad_hash,
               (unsigned long long)r.param_hash, one.loss[0], one.loss[1],
               (unsigned long long)one.grad_hash,
               (unsigned long long)one.param_hash);
    bool multi = runs[i].topo != one_node && runs[i].threads > 1;
    assert_true(multi ? r.remote_bytes > 0 : r.remote_bytes == 0);
    assert_true(multi ? r.remote_bytes * 2 <= r.remote_bytes_unplaced
                      : r.remote_bytes_unplaced == 0);
  }
}

/* ---- pinned tiles run on their node ---- */

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = calloc((size_t)size + 1, 1);
  assert_non_null(text);
  assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  return text;
}

/* In the trace of a step on 4 workers and 2 nodes, at least 90% of the
 * tasks with an affinity ran on a worker of that node, and they are most
 * of the step's tasks. */
static void test_pinned_tiles_run_on_their_node(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/numa.json", dir);
  fixture f;
  open_on(&f, &mid, two_nodes, 4, "everything_saveable", path);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  char *text = read_text(path);
  cJSON *root = cJSON_Parse(text);
  free(text);
  assert_non_null(root);
  int64_t slices = 0, pinned = 0, at_home = 0, per_node[2] = {0};
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
    if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph")), "X") != 0 ||
        strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "cat")), "step") == 0)
      continue; /* tasks only, not the step's own event */
    int node = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "node")
                   ->valueint;
    int tid = cJSON_GetObjectItem(e, "tid")->valueint;
    slices++;
    if (node < 0)
      continue;
    pinned++;
    per_node[node]++;
    at_home += remat_runtime_worker_node(f.rt, tid) == node;
  }
  cJSON_Delete(root);
  assert_int_equal(slices, st.tasks);
  assert_true(pinned * 2 > slices);
  assert_true(per_node[0] * 4 > pinned && per_node[1] * 4 > pinned);
  if (at_home * 10 < pinned * 9)
    fail_msg("%lld of %lld pinned tasks ran on their node",
             (long long)at_home, (long long)pinned);
  fixture_close(&f);
}

/* ---- remote bytes of the default model ---- */

static void expect_remote_quarter(const char *topo, int threads) {
  const remat_gpt_config big = {.layers = 8, .d_model = 512, .heads = 8,
                                .seq = 256, .batch = 8, .vocab = 256};
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TOPOLOGY,
                     .num_threads = threads,
                     .topology = topo};
  remat_runtime *rt = NULL;
  remat_graph *g = NULL;
  remat_gpt m;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_gpt_build(g, &big, &m), REMAT_OK);
  assert_int_equal(remat_compile(g, m.loss, &adamw), REMAT_OK);
  const numa_plan *n = &g->step->compiled.numa;
  if (n->remote_bytes * 4 > n->remote_bytes_unplaced || n->remote_bytes <= 0)
    fail_msg("%s: remote_bytes %lld, unplaced %lld", topo,
             (long long)n->remote_bytes, (long long)n->remote_bytes_unplaced);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

static void test_remote_bytes_of_the_default_model(void **state) {
  (void)state;
  expect_remote_quarter(two_nodes, 4);
  expect_remote_quarter(four_nodes, 4);
}

/* The predicted peak of the mid model on `topo` under `policy` and
 * `budget` (0: none), or -1 when compile refuses the budget. */
static int64_t predicted_peak(const char *topo, const char *policy,
                              int64_t budget, int64_t *copy_bytes) {
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TOPOLOGY |
                            REMAT_SET_POLICY | REMAT_SET_MEMORY_BUDGET,
                     .num_threads = 2, .topology = topo, .policy = policy,
                     .memory_budget = budget};
  remat_runtime *rt = NULL;
  remat_graph *g = NULL;
  remat_gpt m;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  assert_int_equal(remat_gpt_build(g, &mid, &m), REMAT_OK);
  remat_status s = remat_compile(g, m.loss, &adamw);
  int64_t peak = -1;
  if (s == REMAT_OK) {
    peak = g->step->compiled.predicted.peak;
    if (copy_bytes != NULL)
      *copy_bytes = g->step->compiled.numa.copy_bytes;
  } else {
    assert_int_equal(s, REMAT_ERR_BUDGET);
  }
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  return peak;
}

/* The parameters' per-node copies are memory like any other: the budget
 * planner counts them, so every budget it accepts on two nodes bounds the
 * predicted peak, copies included, and the predicted peak on two nodes is
 * that of one node plus exactly the copies. */
static void test_budget_counts_the_copies(void **state) {
  (void)state;
  int64_t copies = 0;
  int64_t full = predicted_peak(two_nodes, "everything_saveable", 0, &copies);
  int64_t least = predicted_peak(two_nodes, "nothing_saveable", 0, NULL);
  int64_t one = predicted_peak(one_node, "everything_saveable", 0, NULL);
  assert_true(copies > 0);
  assert_int_equal(full, one + copies);
  assert_true(least < full);
  int accepted = 0;
  for (int i = 0; i <= 8; i++) {
    int64_t budget = least - copies + (full + copies - least) * i / 8;
    int64_t peak = predicted_peak(two_nodes, "auto", budget, NULL);
    if (peak < 0)
      continue;
    accepted++;
    if (peak > budget)
      fail_msg("budget %lld accepted with a predicted peak of %lld",
               (long long)budget, (long long)peak);
  }
  assert_true(accepted >= 4);
  assert_int_equal(predicted_peak(two_nodes, "auto", least - copies / 2, NULL),
                   -1);
}

/* Weights loaded from a file reach every node's copy (and, in bf16, the
 * copies that matmuls read): a model on two nodes that loads another's
 * weights computes that model's step bit for bit. */
static void test_load_reaches_every_node(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/numa.safetensors", dir);
  fixture a, b;
  open_on(&a, &mid, two_nodes, 4, "nothing_saveable", NULL);
  remat_step_stats sa = {.size = sizeof sa}, sb = {.size = sizeof sb};
  for (int i = 0; i < 2; i++)
    assert_int_equal(remat_step(a.g, &sa), REMAT_OK);
  assert_int_equal(remat_save_safetensors(a.g, path), REMAT_OK);
  open_on(&b, &mid, two_nodes, 4, "nothing_saveable", NULL);
  assert_int_equal(remat_step(b.g, &sb), REMAT_OK); /* copies in use */
  assert_int_equal(remat_load_safetensors(b.g, path), REMAT_OK);
  assert_int_equal(remat_step(a.g, &sa), REMAT_OK);
  assert_int_equal(remat_step(b.g, &sb), REMAT_OK);
  assert_true(sa.loss == sb.loss);
  assert_int_equal(fixture_grad_hash(&a), fixture_grad_hash(&b));
  fixture_close(&a);
  fixture_close(&b);
}

/* ---- the one-pass update ---- */

/* Three optimizer steps of two micro-batches (remat_accumulate, then
 * remat_step) with clipping on, on 2 nodes and 4 workers: the losses and
 * the parameters' hash. With REMAT_BENCH_SPLIT_UPDATE set the runtime
 * applies the update, the bf16 weight refresh and the node copies (and the
 * fold of the gradient sums and their squares) as separate passes. */
static step_bits accumulated_steps(remat_precision precision,
                                   const remat_optimizer *opt, bool split) {
  if (split)
    setenv("REMAT_BENCH_SPLIT_UPDATE", "1", 1);
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TOPOLOGY |
                            REMAT_SET_PRECISION | REMAT_SET_TRACE,
                     .num_threads = 4,
                     .topology = two_nodes,
                     .precision = precision};
  fixture f;
  remat_status rs = fixture_open_config(&f, &mid, &rc, opt);
  unsetenv("REMAT_BENCH_SPLIT_UPDATE");
  if (rs != REMAT_OK)
    fail_msg("%s", remat_last_error());
  assert_int_equal(remat_set_clip(f.g, 0.05f), REMAT_OK);
  step_bits r = {0};
  size_t n = (size_t)mid.batch * (size_t)mid.seq;
  for (int s = 0; s < 3; s++) {
    remat_step_stats st = {.size = sizeof st};
    for (int k = 0; k < 2; k++) { /* micro-batches of different gradients */
      fixture_batch(&mid, f.tokens, f.targets, (uint32_t)(2 * s + k + 1));
      assert_int_equal(remat_feed(f.g, f.m.tokens, f.tokens,
                                  n * sizeof *f.tokens), REMAT_OK);
      assert_int_equal(remat_feed(f.g, f.m.targets, f.targets,
                                  n * sizeof *f.targets), REMAT_OK);
      assert_int_equal(k ? remat_step(f.g, &st) : remat_accumulate(f.g, &st),
                       REMAT_OK);
    }
    r.loss[s % 2] = st.loss;
    assert_true(st.grad_norm > 0.05); /* clipped */
    assert_true(st.remote_bytes > 0); /* the node copies are used */
  }
  size_t count;
  float *params = fixture_snapshot(f.g, &count);
  assert_non_null(params);
  r.param_hash = hash_floats(params, count);
  r.grad_hash = fixture_grad_hash(&f);
  free(params);
  fixture_close(&f);
  return r;
}

/* The sum of squares of a gradient tile (its finite check, the clip's
 * norm), in eight interleaved partial sums: within 1e-12 of the sum in
 * long double at every length from 1 to 40 and at lengths that end
 * mid-chunk, NaN when the last value is, and the one-pass fold's sum the
 * same bits as optim_sum_squares of the folded values. */
static void test_sum_squares_lanes(void **state) {
  (void)state;
  static const int64_t extra[] = {1023, 1025, 2049, 3001};
  float *x = malloc(3001 * sizeof *x), *acc = malloc(3001 * sizeof *acc);
  float *g = malloc(3001 * sizeof *g);
  assert_true(x && acc && g);
  uint32_t r = 7;
  for (int64_t i = 0; i < 3001; i++) {
    r = r * 1664525u + 1013904223u;
    x[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
  }
  for (int64_t i = 0; i < 3001; i++)
    acc[i] = 0.25f * x[(i * 7) % 3001] + 0.125f;
  for (int t = 0; t < 44; t++) {
    int64_t n = t < 40 ? t + 1 : extra[t - 40];
    long double want = 0;
    for (int64_t i = 0; i < n; i++) want += (long double)x[i] * x[i];
    double got = optim_sum_squares(x, n);
    if (!(fabsl(got - want) <= 1e-12L * want))
      fail_msg("n = %lld: sum of squares %.17g, want %.17Lg", (long long)n,
               got, want);
    memcpy(g, x, (size_t)n * sizeof *g);
    double folded = optim_fold_sum_squares(g, acc, n, 0.5f);
    memcpy(g, x, (size_t)n * sizeof *g);
    optim_fold(g, acc, n, 0.5f);
    double apart = optim_sum_squares(g, n);
    assert_memory_equal(&folded, &apart, sizeof folded);
    float last = x[n - 1];
    x[n - 1] = NAN;
    assert_true(isnan(optim_sum_squares(x, n)));
    x[n - 1] = last;
  }
  free(x), free(acc), free(g);
}

static void test_one_pass_update_same_bits(void **state) {
  (void)state;
  const remat_optimizer sgd = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  const struct {
    remat_precision precision;
    const remat_optimizer *opt;
  } runs[] = {{REMAT_PRECISION_BF16, &adamw},
              {REMAT_PRECISION_F32, &adamw},
              {REMAT_PRECISION_BF16, &sgd}};
  for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
    step_bits split = accumulated_steps(runs[i].precision, runs[i].opt, true);
    step_bits one = accumulated_steps(runs[i].precision, runs[i].opt, false);
    if (memcmp(one.loss, split.loss, sizeof one.loss) != 0 ||
        one.param_hash != split.param_hash ||
        one.grad_hash != split.grad_hash)
      fail_msg("run %zu: one pass: losses %.9g %.9g, hash %016llx; split "
               "passes: %.9g %.9g, %016llx",
               i, one.loss[0], one.loss[1],
               (unsigned long long)one.param_hash, split.loss[0],
               split.loss[1], (unsigned long long)split.param_hash);
  }
}

static int setup(void **state) {
  unsetenv("REMAT_TOPOLOGY");
  unsetenv("REMAT_TRACE");
  return make_dir(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deal_and_pins),
      cmocka_unit_test(test_slices_follow_the_deal),
      cmocka_unit_test(test_same_bits_on_every_machine),
      cmocka_unit_test(test_pinned_tiles_run_on_their_node),
      cmocka_unit_test(test_remote_bytes_of_the_default_model),
      cmocka_unit_test(test_budget_counts_the_copies),
      cmocka_unit_test(test_load_reaches_every_node),
      cmocka_unit_test(test_one_pass_update_same_bits),
      cmocka_unit_test(test_sum_squares_lanes),
  };
  return cmocka_run_group_tests(tests, setup, remove_dir);
}
