/* Tests of REMAT_TOPOLOGY: runtimes on synthetic and XML topologies put
 * their workers on the described NUMA nodes in proportion to their cores,
 * train bitwise as on this machine and name each worker's node in the
 * trace; bad descriptions fail with their exact message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>
#include <hwloc.h>

#include "gpt_fixture.h"
#include "tmpdir.h"

static const char *const vars[] = {"REMAT_NUM_THREADS", "REMAT_BIND",
                                   "REMAT_POLICY", "REMAT_MEMORY_BUDGET",
                                   "REMAT_LOOKAHEAD", "REMAT_TRACE",
                                   "REMAT_VERBOSE", "REMAT_TOPOLOGY"};

static int clear_env(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
    unsetenv(vars[i]);
  return 0;
}

/* Creates a runtime with `threads` workers (0: the default) on
 * `topology`, given in code when `in_code`, else through REMAT_TOPOLOGY. */
static remat_runtime *runtime_on(const char *topology, bool in_code,
                                 int threads) {
  remat_config rc = {.num_threads = threads};
  if (threads > 0)
    rc.set |= REMAT_SET_NUM_THREADS;
  if (in_code) {
    rc.set |= REMAT_SET_TOPOLOGY;
    rc.topology = topology;
  } else {
    setenv("REMAT_TOPOLOGY", topology, 1);
  }
  remat_runtime *rt = NULL;
  remat_status s = remat_runtime_create(&rc, &rt);
  if (s != REMAT_OK)
    fail_msg("remat_runtime_create on '%s': %s", topology, remat_last_error());
  unsetenv("REMAT_TOPOLOGY");
  remat_config c;
  assert_int_equal(remat_runtime_config(rt, &c), REMAT_OK);
  assert_string_equal(c.topology, topology);
  return rt;
}

/* The node of each worker, in worker order, is `nodes`. */
static void expect_nodes(const char *topology, bool in_code, int threads,
                         int nworkers, const int *nodes) {
  remat_runtime *rt = runtime_on(topology, in_code, threads);
  assert_int_equal(remat_runtime_num_threads(rt), nworkers);
  for (int w = 0; w < nworkers; w++)
    if (remat_runtime_worker_node(rt, w) != nodes[w])
      fail_msg("%s, %d workers: worker %d is on node %d, expected %d",
               topology, nworkers, w, remat_runtime_worker_node(rt, w),
               nodes[w]);
  assert_int_equal(remat_runtime_worker_node(rt, -1), -1);
  assert_int_equal(remat_runtime_worker_node(rt, nworkers), -1);
  remat_runtime_destroy(rt);
}

static void test_two_nodes(void **state) {
  (void)state;
  const char *two = "package:2 numa:1 core:4 pu:1";
  /* By default one worker per core of the described machine. */
  expect_nodes(two, false, 0, 8, (int[]){0, 0, 0, 0, 1, 1, 1, 1});
  expect_nodes(two, true, 5, 5, (int[]){0, 0, 0, 1, 1});
  /* More threads than the machine has cores, and than this one has. */
  expect_nodes(two, false, 12, 12,
               (int[]){0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1});
  assert_int_equal(remat_runtime_worker_node(NULL, 0), -1);
}

static void test_four_nodes(void **state) {
  (void)state;
  const char *four = "package:1 numa:4 core:2 pu:1";
  expect_nodes(four, true, 0, 8, (int[]){0, 0, 1, 1, 2, 2, 3, 3});
  expect_nodes(four, false, 6, 6, (int[]){0, 0, 1, 1, 2, 3});
  expect_nodes(four, true, 2, 2, (int[]){0, 1}); /* node 2, 3: no worker */
  /* The program's topology wins over the environment's. */
  setenv("REMAT_TOPOLOGY", "bogus", 1);
  expect_nodes(four, true, 4, 4, (int[]){0, 1, 2, 3});
}

/* An XML file written here: two nodes of four cores with three cores of the
 * first removed, so that the nodes have one and four cores. */
static void write_uneven_xml(const char *path) {
  hwloc_topology_t topo;
  assert_int_equal(hwloc_topology_init(&topo), 0);
  assert_int_equal(hwloc_topology_set_synthetic(topo, "numa:2 core:4 pu:1"), 0);
  assert_int_equal(hwloc_topology_load(topo), 0);
  hwloc_bitmap_t keep = hwloc_bitmap_alloc();
  hwloc_bitmap_set(keep, 0);
  hwloc_bitmap_set_range(keep, 4, 7);
  assert_int_equal(hwloc_topology_restrict(topo, keep, 0), 0);
  hwloc_bitmap_free(keep);
  assert_int_equal(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE), 5);
  assert_int_equal(hwloc_topology_export_xml(topo, path, 0), 0);
  hwloc_topology_destroy(topo);
}

static void test_xml_file(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/uneven.xml", dir);
  write_uneven_xml(path);
  expect_nodes(path, false, 0, 5, (int[]){0, 1, 1, 1, 1});
  expect_nodes(path, true, 10, 10, (int[]){0, 0, 1, 1, 1, 1, 1, 1, 1, 1});
  expect_nodes(path, false, 3, 3, (int[]){0, 1, 1});
}

#define ACCEPTED                                                               \
  "expected an hwloc synthetic description such as 'package:2 numa:1 "        \
  "core:4 pu:1' or the path of an hwloc XML file (lstopo FILE.xml writes one)"

static void expect_topology_error(const char *value, bool in_code,
                                  const char *message) {
  clear_env(NULL);
  remat_config rc = {.set = in_code ? REMAT_SET_TOPOLOGY : 0,
                     .topology = value};
  if (!in_code)
    setenv("REMAT_TOPOLOGY", value, 1);
  remat_runtime *rt = (remat_runtime *)0x1;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_ERR_CONFIG);
  assert_null(rt);
  assert_string_equal(remat_last_error(), message);
  clear_env(NULL);
}

static void test_bad_topologies(void **state) {
  (void)state;
  expect_topology_error("bogus", false,
                        "REMAT_TOPOLOGY='bogus' is not valid: " ACCEPTED);
  expect_topology_error("numa:0 core:2", false,
                        "REMAT_TOPOLOGY='numa:0 core:2' is not valid: "
                        ACCEPTED);
  expect_topology_error("core:abc", true,
                        "remat_config.topology='core:abc' is not valid: "
                        ACCEPTED);
  expect_topology_error("/nonexistent/topo.xml", false,
                        "REMAT_TOPOLOGY='/nonexistent/topo.xml' is not valid: "
                        "no regular file has that path; " ACCEPTED);
  char path[128], message[512];
  snprintf(message, sizeof message,
           "REMAT_TOPOLOGY='%s' is not valid: no regular file has that path; "
           ACCEPTED, dir);
  expect_topology_error(dir, false, message);
  snprintf(path, sizeof path, "%s/junk.xml", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("not a topology\n", f);
  fclose(f);
  snprintf(message, sizeof message,
           "remat_config.topology='%s' is not valid: the file is not an "
           "hwloc XML topology; " ACCEPTED, path);
  expect_topology_error(path, true, message);
  /* Empty means this machine. */
  setenv("REMAT_TOPOLOGY", "", 1);
  remat_runtime *rt = NULL;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  remat_config c;
  assert_int_equal(remat_runtime_config(rt, &c), REMAT_OK);
  assert_null(c.topology);
  remat_runtime_destroy(rt);
}

/* A step of a tiny GPT on two threads: its loss and gradients bit for bit.
 * `node1` is the node worker 1 must be on. One node or two, the same bits. */
static void step_bits(int node1, float *loss, uint64_t *grad_hash) {
  const remat_gpt_config cfg = {.layers = 1, .d_model = 16, .heads = 2,
                                .seq = 8, .batch = 2, .vocab = 11};
  fixture f;
  assert_int_equal(fixture_open(&f, &cfg, 2, "nothing_saveable", 0, NULL),
                   REMAT_OK);
  assert_int_equal(remat_runtime_worker_node(f.rt, 1), node1);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(f.g, &st), REMAT_OK);
  *loss = st.loss;
  *grad_hash = fixture_grad_hash(&f);
  fixture_close(&f);
}

static void test_step_on_two_nodes(void **state) {
  (void)state;
  float one, two;
  uint64_t one_hash, two_hash;
  setenv("REMAT_TOPOLOGY", "package:1 numa:1 core:2 pu:1", 1);
  step_bits(0, &one, &one_hash);
  setenv("REMAT_TOPOLOGY", "package:2 numa:1 core:1 pu:1", 1);
  step_bits(1, &two, &two_hash);
  unsetenv("REMAT_TOPOLOGY");
  assert_memory_equal(&one, &two, sizeof one);
  assert_int_equal(one_hash, two_hash);
  assert_int_not_equal(one_hash, 0);
}

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

/* The number and the string `key` of a JSON object, which must have it. */
static int json_int(const cJSON *object, const char *key) {
  const cJSON *item = cJSON_GetObjectItem(object, key);
  if (!cJSON_IsNumber(item))
    fail_msg("trace event without a number '%s'", key);
  return item->valueint;
}

static const char *json_string(const cJSON *object, const char *key) {
  const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(object, key));
  if (text == NULL)
    fail_msg("trace event without a string '%s'", key);
  return text;
}

/* Worker tracks name their node; slices carry the task's affinity: -1, or
 * the node of the worker that ran it (the tiles the NUMA placement pins). */
static void check_step_trace(const char *path, remat_runtime *rt,
                             int64_t ntasks) {
  char *text = read_text(path);
  cJSON *root = cJSON_Parse(text);
  free(text);
  assert_non_null(root);
  int nthreads = 0;
  int64_t nslices = 0, npinned = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
    const char *ph = json_string(e, "ph");
    const cJSON *args = cJSON_GetObjectItem(e, "args");
    const char *name = json_string(e, "name");
    const char *thread = cJSON_GetStringValue(cJSON_GetObjectItem(args, "name"));
    /* the process's name, the steps' thread and events, and counters */
    if (strcmp(name, "process_name") == 0 || strcmp(ph, "C") == 0 ||
        (thread != NULL && strcmp(thread, "steps") == 0) ||
        strncmp(name, "step ", 5) == 0)
      continue;
    int tid = json_int(e, "tid");
    if (strcmp(ph, "M") == 0) {
      char name[64];
      snprintf(name, sizeof name, "worker %d (node %d)", tid,
               remat_runtime_worker_node(rt, tid));
      assert_string_equal(json_string(args, "name"), name);
      nthreads++;
    } else {
      int node = json_int(args, "node");
      if (node != -1)
        assert_int_equal(node, remat_runtime_worker_node(rt, tid));
      npinned += node != -1;
      nslices++;
    }
  }
  assert_true(npinned > 0);
  assert_int_equal(nthreads, 2);
  assert_int_equal(nslices, ntasks);
  cJSON_Delete(root);
}

static void test_trace_of_a_step(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/step.json", dir);
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_TOPOLOGY |
                            REMAT_SET_TRACE,
                     .num_threads = 2,
                     .topology = "numa:2 core:1 pu:1",
                     .trace_path = path};
  remat_runtime *rt = NULL;
  assert_int_equal(remat_runtime_create(&rc, &rt), REMAT_OK);
  assert_int_equal(remat_runtime_worker_node(rt, 1), 1);
  remat_graph *g = NULL;
  assert_int_equal(remat_graph_create(rt, &g), REMAT_OK);
  int64_t xd[2] = {2, 4}, wd[2] = {3, 4};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, xd);
  remat_tensor *w = remat_param(g, "w", 2, wd, REMAT_INIT_NORMAL, 0.5f);
  remat_tensor *loss = remat_sum(g, remat_relu(g, remat_linear(g, x, w, NULL)));
  assert_int_equal(remat_compile(g, loss, NULL), REMAT_OK);
  const float xs[8] = {1, -2, 3, -4, 5, -6, 7, -8};
  assert_int_equal(remat_feed(g, x, xs, sizeof xs), REMAT_OK);
  remat_step_stats st = {.size = sizeof st};
  assert_int_equal(remat_step(g, &st), REMAT_OK);
  check_step_trace(path, rt, st.tasks);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
}

static int setup(void **state) { return make_dir(state) || clear_env(state); }

static int teardown(void **state) {
  clear_env(state);
  return remove_dir(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_two_nodes, clear_env),
      cmocka_unit_test_setup(test_four_nodes, clear_env),
      cmocka_unit_test_setup(test_xml_file, clear_env),
      cmocka_unit_test_setup(test_bad_topologies, clear_env),
      cmocka_unit_test_setup(test_step_on_two_nodes, clear_env),
      cmocka_unit_test_setup(test_trace_of_a_step, clear_env),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
