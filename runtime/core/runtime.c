/* The runtime: hardware topology, configuration, the worker pool and the
 * oneDNN engine with one stream per worker. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/files.h"
#include "runtime/internal.h"
#include "runtime/policy/policy.h"

static void destroy_streams(remat_runtime *rt) {
  for (int i = 0; rt->workers != NULL && i < rt->nworkers; i++)
    if (rt->workers[i].stream != NULL)
      dnnl_stream_destroy(rt->workers[i].stream);
  free(rt->workers);
  rt->workers = NULL;
}

/* bf16 precision needs oneDNN's bf16 matmul kernels on this CPU. */
static remat_status check_bf16(remat_runtime *rt) {
  if (rt->config.precision != REMAT_PRECISION_BF16)
    return REMAT_OK;
  char impl[128];
  if (op_bf16_kernel(rt->engine, impl, sizeof impl) == REMAT_OK)
    return REMAT_OK;
  const char *isa = getenv("ONEDNN_MAX_CPU_ISA");
  bool none = strcmp(impl, "none") == 0;
  return remat__fail(REMAT_ERR_CONFIG,
                     "REMAT_PRECISION=bf16: oneDNN has no bf16 matmul kernel "
                     "for this CPU%s%s%s: bf16 needs AVX512-BF16 (AMD Zen 4 "
                     "and later, Intel Cooper Lake) or AMX (Intel Sapphire "
                     "Rapids and later)%s%s%s; use REMAT_PRECISION=f32",
                     none ? "" : " (only '", none ? "" : impl,
                     none ? "" : "')",
                     isa ? ", and ONEDNN_MAX_CPU_ISA (here '" : "",
                     isa ? isa : "", isa ? "') must allow them" : "");
}

static remat_status create_backend(remat_runtime *rt) {
  if (dnnl_engine_create(&rt->engine, dnnl_cpu, 0) != dnnl_success)
    return remat__fail(REMAT_ERR_BACKEND, "oneDNN: cannot create a CPU engine");
  remat_status s = check_bf16(rt);
  if (s != REMAT_OK)
    return s;
  rt->workers = remat__calloc((size_t)rt->nworkers, sizeof *rt->workers);
  if (rt->workers == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "out of memory creating %d worker contexts",
                       rt->nworkers);
  for (int i = 0; i < rt->nworkers; i++)
    if (dnnl_stream_create(&rt->workers[i].stream, rt->engine,
                           dnnl_stream_default_flags) != dnnl_success)
      return remat__fail(REMAT_ERR_BACKEND,
                         "oneDNN: cannot create the stream of worker %d", i);
  return REMAT_OK;
}

#define TOPOLOGY_ACCEPTED                                                     \
  "expected an hwloc synthetic description such as 'package:2 numa:1 "        \
  "core:4 pu:1' or the path of an hwloc XML file (lstopo FILE.xml writes one)"

/* Points `topo` at the machine that `desc` describes: the XML file it names
 * when it names a regular file, else a synthetic description. */
static remat_status describe_topology(hwloc_topology_t topo, const char *desc,
                                      const char *what) {
  struct stat st;
  if (stat(desc, &st) == 0 && S_ISREG(st.st_mode)) {
    if (hwloc_topology_set_xml(topo, desc) == 0)
      return REMAT_OK;
    return remat__fail(REMAT_ERR_CONFIG,
                       "%s='%s' is not valid: the file is not an hwloc XML "
                       "topology; " TOPOLOGY_ACCEPTED,
                       what, remat__quote(&(remat__quoted){0}, desc));
  }
  if (strchr(desc, '/') != NULL)
    return remat__fail(REMAT_ERR_CONFIG,
                       "%s='%s' is not valid: no regular file has that "
                       "path; " TOPOLOGY_ACCEPTED,
                       what, remat__quote(&(remat__quoted){0}, desc));
  if (hwloc_topology_set_synthetic(topo, desc) == 0)
    return REMAT_OK;
  return remat__fail(REMAT_ERR_CONFIG,
                     "%s='%s' is not valid: " TOPOLOGY_ACCEPTED, what,
                     remat__quote(&(remat__quoted){0}, desc));
}

/* This machine's topology, or the one config.topology describes. */
static remat_status create_topology(remat_runtime *rt,
                                    const remat_config *code) {
  if (hwloc_topology_init(&rt->topo) != 0) {
    rt->topo = NULL;
    return remat__fail(REMAT_ERR_BACKEND, "hwloc: cannot initialize a topology");
  }
  const char *desc = rt->config.topology;
  bool from_code = code != NULL && (code->set & REMAT_SET_TOPOLOGY);
  remat_status s = REMAT_OK;
  if (desc != NULL)
    s = describe_topology(
        rt->topo, desc, from_code ? "remat_config.topology" : "REMAT_TOPOLOGY");
  if (s == REMAT_OK && hwloc_topology_load(rt->topo) != 0)
    s = desc != NULL
            ? remat__fail(REMAT_ERR_CONFIG,
                          "%s='%s' is not valid: hwloc cannot load the "
                          "topology it describes (an XML file with no "
                          "machine in it, say); " TOPOLOGY_ACCEPTED,
                          from_code ? "remat_config.topology"
                                    : "REMAT_TOPOLOGY",
                          remat__quote(&(remat__quoted){0}, desc))
            : remat__fail(REMAT_ERR_BACKEND,
                          "hwloc: cannot load this machine's topology");
  if (s != REMAT_OK) {
    hwloc_topology_destroy(rt->topo);
    rt->topo = NULL;
  }
  return s;
}

#define TRACE_ACCEPTED                                                        \
  "expected the path of a regular file that can be written (created if "     \
  "missing)"

/* The trace path must name a regular file that can be written, and a new
 * file must be possible beside it (the writer renames one over it),
 * checked now so that a bad path fails creation instead of every step. A
 * symbolic link is refused, as the trace writer refuses it (base/files.h),
 * and not followed (lstat, O_NOFOLLOW). An existing file is opened
 * for appending, so neither truncated nor changed; a file created for the
 * check is removed. O_NONBLOCK keeps a FIFO from blocking the open. */
static remat_status check_trace(const char *path, const char *what) {
  struct stat st;
  bool exists = lstat(path, &st) == 0;
  if (!exists || S_ISREG(st.st_mode)) {
    int flags = O_WRONLY | O_APPEND | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC;
    int fd = open(path, exists ? flags : flags | O_CREAT | O_EXCL, 0666);
    if (fd < 0)
      return remat__fail(REMAT_ERR_CONFIG,
                         "%s='%s' is not valid: it cannot be opened for "
                         "writing (%s); " TRACE_ACCEPTED,
                         what, remat__quote(&(remat__quoted){0}, path), strerror(errno));
    if (fstat(fd, &st) != 0)
      st.st_mode = 0;
    close(fd);
    if (!exists)
      unlink(path);
  }
  if (!S_ISREG(st.st_mode))
    return remat__fail(REMAT_ERR_CONFIG,
                       "%s='%s' is not valid: it is %s; " TRACE_ACCEPTED,
                       what, remat__quote(&(remat__quoted){0}, path), remat__file_kind(st.st_mode));
  /* The writer makes a new file beside it and renames it over it. */
  remat__replacing r;
  FILE *f = remat__replace_begin(path, &r);
  if (f == NULL)
    return remat__fail(REMAT_ERR_CONFIG,
                       "%s='%s' is not valid: a trace is written to a new "
                       "file beside it, which cannot be created (%s); "
                       TRACE_ACCEPTED,
                       what, remat__quote(&(remat__quoted){0}, path), strerror(errno));
  remat__replace_abort(f, &r);
  return REMAT_OK;
}

/* The default policy must parse; "auto" needs no budget to parse. */
static remat_status check_policy(const remat_config *config,
                                 const remat_config *code) {
  remat_policy *p = NULL;
  remat_status s = remat_policy_parse(config->policy, &p);
  remat_policy_destroy(p);
  if (s == REMAT_OK || s == REMAT_ERR_OUT_OF_MEMORY)
    return s;
  char msg[REMAT__ERRMSG_MAX];
  snprintf(msg, sizeof msg, "%s", remat_last_error());
  bool from_code = code != NULL && (code->set & REMAT_SET_POLICY);
  return remat__fail(REMAT_ERR_CONFIG, "%s: %s",
                     from_code ? "remat_config.policy" : "REMAT_POLICY", msg);
}

remat_status remat_runtime_create(const remat_config *config,
                                  remat_runtime **out) {
  if (out == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_runtime_create: out must not be NULL");
  *out = NULL;
  remat_runtime *rt = remat__calloc(1, sizeof *rt);
  if (rt == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "out of memory creating a runtime");
  atomic_init(&rt->refs, 1);
  cost_table_init(&rt->costs);
  rt->pid = getpid();
  rt->no_admission = getenv("REMAT_BENCH_NO_ADMISSION") != NULL;
  bool env = config == NULL || !(config->set & REMAT_SET_NO_ENV);
  const char *fuse = env ? getenv("REMAT_FUSE") : NULL;
  if (fuse != NULL && strcmp(fuse, "0") != 0 && strcmp(fuse, "1") != 0 &&
      strcmp(fuse, "bf16") != 0) {
    cost_table_free(&rt->costs);
    free(rt);
    return remat__fail(REMAT_ERR_CONFIG,
                       "REMAT_FUSE='%s' is not valid: expected 0 (no fused "
                       "epilogues), 1 (fused, the default) or bf16 (bf16 "
                       "residual adds fused too)",
                       remat__quote(&(remat__quoted){0}, fuse));
  }
  rt->no_fuse = fuse != NULL && strcmp(fuse, "0") == 0;
  rt->fuse_bf16 = fuse != NULL && strcmp(fuse, "bf16") == 0;
  rt->split_update = getenv("REMAT_BENCH_SPLIT_UPDATE") != NULL;
  rt->roofline_costs = getenv("REMAT_BENCH_ROOFLINE_COSTS") != NULL;
  rt->no_replan = getenv("REMAT_BENCH_NO_REPLAN") != NULL;
  rt->per_region = getenv("REMAT_BENCH_PER_REGION") != NULL;
  /* The environment first: a bad value fails before any thread starts. */
  remat_status s = remat__config_load(config, 0, &rt->config, &rt->strings);
  if (s == REMAT_OK)
    s = check_policy(&rt->config, config);
  if (s == REMAT_OK && rt->config.trace_path != NULL)
    s = check_trace(rt->config.trace_path,
                    config != NULL && (config->set & REMAT_SET_TRACE)
                        ? "remat_config.trace_path"
                        : "REMAT_TRACE");
  if (s == REMAT_OK)
    s = create_topology(rt, config);
  if (s == REMAT_OK && rt->config.num_threads == 0)
    rt->config.num_threads = sched_physical_cores(rt->topo);
  if (s == REMAT_OK) {
    char err[SCHED_ERRMSG_MAX];
    rt->nworkers = rt->config.num_threads;
    s = sched_pool_create(rt->topo, rt->nworkers, (sched_bind)rt->config.bind,
                          &rt->pool, err);
    if (s != REMAT_OK)
      remat__fail_msg(s, err);
  }
  if (s == REMAT_OK)
    s = create_backend(rt);
  if (s != REMAT_OK) {
    remat_runtime_destroy(rt);
    return s;
  }
  *out = rt;
  return REMAT_OK;
}

remat_status runtime_check_fork(const remat_runtime *rt, const char *what) {
  if (getpid() == rt->pid)
    return REMAT_OK;
  return remat__fail(REMAT_ERR_STATE,
                     "%s: this process was forked after the runtime was "
                     "created, and a runtime's worker threads do not survive "
                     "fork(): create runtimes in the child, after the fork",
                     what);
}

/* In a forked child the pool's threads do not exist: joining them would
 * hang, so the child leaves the pool's memory to the process's end. */
static void free_runtime(remat_runtime *rt) {
  if (rt->pool != NULL && getpid() == rt->pid)
    sched_pool_destroy(rt->pool);
  destroy_streams(rt);
  if (rt->engine != NULL)
    dnnl_engine_destroy(rt->engine);
  if (rt->topo != NULL)
    hwloc_topology_destroy(rt->topo);
  cost_table_free(&rt->costs);
  free(rt);
}

void runtime_retain(remat_runtime *rt) { atomic_fetch_add(&rt->refs, 1); }

void runtime_release(remat_runtime *rt) {
  if (atomic_fetch_sub(&rt->refs, 1) == 1)
    free_runtime(rt);
}

/* Graphs hold a reference: a runtime destroyed before its graphs lives on
 * until the last of them is destroyed. */
void remat_runtime_destroy(remat_runtime *rt) {
  if (rt != NULL)
    runtime_release(rt);
}

remat_status remat_runtime_config(const remat_runtime *rt, remat_config *out) {
  if (rt == NULL || out == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_runtime_config: rt and out must not be NULL");
  *out = rt->config;
  return REMAT_OK;
}

int remat_runtime_num_threads(const remat_runtime *rt) {
  return rt == NULL ? 0 : rt->nworkers;
}

int remat_runtime_worker_node(const remat_runtime *rt, int worker) {
  if (rt == NULL || worker < 0 || worker >= rt->nworkers)
    return -1;
  return sched_pool_placement(rt->pool)->worker_node[worker];
}
