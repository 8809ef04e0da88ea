/* The runtime: hardware topology, configuration, the worker pool and the
 * oneDNN engine with one stream per worker. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/internal.h"
#include "runtime/policy.h"

static void destroy_streams(remat_runtime *rt) {
  for (int i = 0; rt->workers != NULL && i < rt->nworkers; i++)
    if (rt->workers[i].stream != NULL)
      dnnl_stream_destroy(rt->workers[i].stream);
  free(rt->workers);
  rt->workers = NULL;
}

static remat_status create_backend(remat_runtime *rt) {
  if (dnnl_engine_create(&rt->engine, dnnl_cpu, 0) != dnnl_success)
    return remat__fail(REMAT_ERR_BACKEND, "oneDNN: cannot create a CPU engine");
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

static remat_status create_topology(remat_runtime *rt) {
  if (hwloc_topology_init(&rt->topo) != 0)
    return remat__fail(REMAT_ERR_BACKEND, "hwloc: cannot initialize a topology");
  if (hwloc_topology_load(rt->topo) != 0) {
    hwloc_topology_destroy(rt->topo);
    rt->topo = NULL;
    return remat__fail(REMAT_ERR_BACKEND, "hwloc: cannot load the topology");
  }
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
  /* The environment first: a bad value fails before any thread starts. */
  remat_status s = remat__config_load(config, 0, &rt->config, rt->policy_buf,
                                      sizeof rt->policy_buf, rt->trace_buf,
                                      sizeof rt->trace_buf);
  if (s == REMAT_OK)
    s = check_policy(&rt->config, config);
  if (s == REMAT_OK)
    s = create_topology(rt);
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

static void free_runtime(remat_runtime *rt) {
  if (rt->pool != NULL)
    sched_pool_destroy(rt->pool);
  destroy_streams(rt);
  if (rt->engine != NULL)
    dnnl_engine_destroy(rt->engine);
  if (rt->topo != NULL)
    hwloc_topology_destroy(rt->topo);
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
