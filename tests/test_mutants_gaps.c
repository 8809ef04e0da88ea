/* Tests that close the gaps mutation testing (tools/mutants.sh) found in
 * ops/ and sched/: cross-entropy when the last logit is far the largest, the
 * mean of a few elements (exact values), a ready task that only a thief can
 * run, and the times in a trace. Each names the mutant it kills. */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ops/op.h"
#include "sched/sched.h"

/* ---- ops: one op planned and run on one worker ---- */

typedef struct op_run {
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  op_instance inst;
  op_worker worker;
  op_bufs bufs;
} op_run;

/* Plans `d`, allocates out, aux, dout and scratch; inputs are the caller's. */
static void op_open(op_run *r, const op_desc *d, float *in0, float *in1) {
  memset(r, 0, sizeof *r);
  assert_int_equal(dnnl_engine_create(&r->engine, dnnl_cpu, 0), dnnl_success);
  assert_int_equal(dnnl_stream_create(&r->stream, r->engine,
                                      dnnl_stream_default_flags),
                   dnnl_success);
  char err[OP_ERRMSG_MAX];
  if (op_plan(d, r->engine, &r->inst, err) != REMAT_OK)
    fail_msg("%s", err);
  r->bufs.in[0] = in0;
  r->bufs.in[1] = in1;
  r->bufs.out = calloc((size_t)op_numel(&r->inst.desc.out), sizeof(float));
  r->bufs.dout = calloc((size_t)op_numel(&r->inst.desc.out), sizeof(float));
  for (int k = 0; k < r->inst.naux; k++)
    r->bufs.aux[k] = calloc(r->inst.aux_bytes[k], 1);
  r->worker.stream = r->stream;
  r->worker.scratch_bytes = r->inst.scratch_bytes;
  r->worker.scratch = r->inst.scratch_bytes ? malloc(r->inst.scratch_bytes)
                                            : NULL;
}

static void op_close(op_run *r) {
  free(r->bufs.out);
  free(r->bufs.dout);
  for (int k = 0; k < OP_MAX_AUX; k++) free(r->bufs.aux[k]);
  free(r->worker.scratch);
  op_instance_release(&r->inst);
  dnnl_stream_destroy(r->stream);
  dnnl_engine_destroy(r->engine);
}

static void run_kernels(op_run *r, const op_kernel *k, int nk) {
  for (int i = 0; i < nk; i++)
    for (int64_t t = 0; t < k[i].tiles; t++)
      assert_int_equal(k[i].fn(&r->inst, &r->bufs, t, &r->worker), REMAT_OK);
}

/* Rows whose largest logit (by 100) is the last one, or the first: the
 * loss is 0 and so is every gradient, to float precision. Kills
 * ops-ce-max-skips-last (a max that skips the last logit overflows exp). */
static void test_cross_entropy_dominant_logit(void **state) {
  (void)state;
  enum { N = 2, V = 20 }; /* 20: a 16-lane block and a tail of 4 */
  float logits[N * V] = {0};
  int32_t targets[N] = {V - 1, 0};
  logits[V - 1] = 100.0f;
  logits[V] = 100.0f;
  op_desc d = {.type = OP_CROSS_ENTROPY, .nin = 2,
               .in = {{2, {N, V}}, {1, {N}}}, .in_dtype = {OP_F32, OP_I32}};
  op_run r;
  op_open(&r, &d, logits, (float *)targets);
  run_kernels(&r, r.inst.fwd, r.inst.nfwd);
  assert_float_equal(r.bufs.out[0], 0.0f, 1e-6f);
  float dlogits[N * V];
  r.bufs.din[0] = dlogits;
  r.bufs.dout[0] = 1.0f;
  run_kernels(&r, r.inst.bwd, r.inst.nbwd);
  for (int i = 0; i < N * V; i++)
    if (!(dlogits[i] > -1e-6f && dlogits[i] < 1e-6f))
      fail_msg("dlogits[%d] = %g, want 0", i, dlogits[i]);
  op_close(&r);
}

/* sum and mean of {1, 2, 3, 4}: exactly 10 and 2.5, and d/dx of the mean
 * is dy / 4, added onto din in accumulate mode. Kills ops-mean-n-minus-1
 * (with 70001 elements, as in test_ops, n - 1 is within tolerance). */
static void test_mean_of_four(void **state) {
  (void)state;
  float x[4] = {1, 2, 3, 4};
  for (int mean = 0; mean < 2; mean++) {
    op_desc d = {.type = mean ? OP_MEAN : OP_SUM, .nin = 1, .in = {{1, {4}}}};
    op_run r;
    op_open(&r, &d, x, NULL);
    run_kernels(&r, r.inst.fwd, r.inst.nfwd);
    assert_true(r.bufs.out[0] == (mean ? 2.5f : 10.0f));
    float dx[4] = {1, 1, 1, 1};
    r.bufs.din[0] = dx;
    r.bufs.din_accumulate[0] = true;
    r.bufs.dout[0] = 2.0f;
    run_kernels(&r, r.inst.bwd, r.inst.nbwd);
    for (int i = 0; i < 4; i++) assert_true(dx[i] == (mean ? 1.5f : 3.0f));
    op_close(&r);
  }
}

/* ---- sched ---- */

static hwloc_topology_t two_cores(void) {
  hwloc_topology_t topo;
  assert_int_equal(hwloc_topology_init(&topo), 0);
  assert_int_equal(hwloc_topology_set_synthetic(topo, "core:2 pu:1"), 0);
  assert_int_equal(hwloc_topology_load(topo), 0);
  return topo;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

typedef struct rendezvous {
  atomic_int b_started;
} rendezvous;

static int nop_task(void *context, void *arg, int worker) {
  (void)context;
  (void)arg;
  (void)worker;
  return 0;
}

/* Task A: waits (up to 5 s) until B has started on the other worker. */
static int wait_for_b(void *context, void *arg, int worker) {
  (void)context;
  (void)worker;
  rendezvous *rv = arg;
  for (int64_t end = now_ns() + 5000000000; now_ns() < end;) {
    if (atomic_load(&rv->b_started)) return 0;
    usleep(100);
  }
  return REMAT_ERR_STATE;
}

static int start_b(void *context, void *arg, int worker) {
  (void)context;
  (void)worker;
  atomic_store(&((rendezvous *)arg)->b_started, 1);
  return 0;
}

/* R releases A and B (equal priorities): A continues on R's worker and
 * waits for B, which sits in that worker's heap, so only the other worker,
 * stealing, can run it. Kills sched-steal-skips-last (no steal with two
 * workers: A times out). */
static void test_idle_worker_steals(void **state) {
  (void)state;
  hwloc_topology_t topo = two_cores();
  sched_pool *pool = NULL;
  char err[SCHED_ERRMSG_MAX] = "";
  assert_int_equal(sched_pool_create(topo, 2, SCHED_BIND_NONE, &pool, err),
                   REMAT_OK);
  rendezvous rv = {0};
  sched_dag *dag;
  assert_int_equal(sched_dag_create(&dag, err), REMAT_OK);
  assert_int_equal(sched_dag_add(dag, nop_task, NULL, 0, -1, "R", "t"), 0);
  assert_int_equal(sched_dag_add(dag, wait_for_b, &rv, 0, -1, "A", "t"), 1);
  assert_int_equal(sched_dag_add(dag, start_b, &rv, 0, -1, "B", "t"), 2);
  assert_int_equal(sched_dag_edge(dag, 0, 1), REMAT_OK);
  assert_int_equal(sched_dag_edge(dag, 0, 2), REMAT_OK);
  assert_int_equal(sched_dag_finalize(dag, err), REMAT_OK);
  for (int run = 0; run < 10; run++) {
    atomic_store(&rv.b_started, 0);
    if (sched_run(pool, dag, NULL, err) != REMAT_OK)
      fail_msg("run %d: %s", run, err);
  }
  sched_dag_destroy(dag);
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

static int sleep_2ms(void *context, void *arg, int worker) {
  (void)context;
  (void)arg;
  (void)worker;
  usleep(2000);
  return 0;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = calloc((size_t)size + 1, 1);
  assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  return text;
}

static double number(const cJSON *obj, const char *key) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
  assert_true(cJSON_IsNumber(item));
  return item->valuedouble;
}

/* A chain of three 2 ms tasks: in the trace each task starts at or after
 * the run's start and ends before sched_run returned, lasts at least 2 ms,
 * starts after its predecessor ended, and names a worker of the pool.
 * Kills sched-trace-absolute (times not relative to the run's start). */
static void test_trace_times(void **state) {
  (void)state;
  hwloc_topology_t topo = two_cores();
  sched_pool *pool = NULL;
  char err[SCHED_ERRMSG_MAX] = "";
  assert_int_equal(sched_pool_create(topo, 2, SCHED_BIND_NONE, &pool, err),
                   REMAT_OK);
  sched_dag *dag;
  assert_int_equal(sched_dag_create(&dag, err), REMAT_OK);
  for (int i = 0; i < 3; i++)
    assert_int_equal(sched_dag_add(dag, sleep_2ms, NULL, 0, -1, "s", "t"), i);
  assert_int_equal(sched_dag_edge(dag, 0, 1), REMAT_OK);
  assert_int_equal(sched_dag_edge(dag, 1, 2), REMAT_OK);
  assert_int_equal(sched_dag_finalize(dag, err), REMAT_OK);
  char path[] = "/tmp/test_mutants_gaps_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  sched_run_opts opts = {.trace_path = path};
  int64_t t0 = now_ns();
  assert_int_equal(sched_run(pool, dag, &opts, err), REMAT_OK);
  double wall_us = (double)(now_ns() - t0) / 1e3;
  char *text = slurp(path);
  unlink(path);
  cJSON *root = cJSON_Parse(text);
  assert_non_null(root);
  double end_of[3] = {0}, start_of[3] = {0};
  int seen = 0;
  const cJSON *ev;
  cJSON_ArrayForEach(ev, cJSON_GetObjectItemCaseSensitive(root, "traceEvents")) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") != 0) continue;
    int id = (int)number(cJSON_GetObjectItemCaseSensitive(ev, "args"), "id");
    double ts = number(ev, "ts"), dur = number(ev, "dur");
    double tid = number(ev, "tid");
    assert_true(id >= 0 && id < 3);
    assert_true(tid == 0 || tid == 1);
    if (!(ts >= 0 && dur >= 2000 && ts + dur <= wall_us + 0.002))
      fail_msg("task %d: ts %.3f dur %.3f, run took %.3f us", id, ts, dur,
               wall_us);
    start_of[id] = ts;
    end_of[id] = ts + dur;
    seen++;
  }
  assert_int_equal(seen, 3);
  for (int i = 1; i < 3; i++)
    assert_true(start_of[i] >= end_of[i - 1] - 0.002); /* %.3f rounding */
  cJSON_Delete(root);
  free(text);
  sched_dag_destroy(dag);
  sched_pool_destroy(pool);
  hwloc_topology_destroy(topo);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cross_entropy_dominant_logit),
      cmocka_unit_test(test_mean_of_four),
      cmocka_unit_test(test_idle_worker_steals),
      cmocka_unit_test(test_trace_times),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
