/* The link between libremat and libremat_mpi, the two shared (or static)
 * libraries that data parallelism is split across so that libremat never
 * needs MPI. libremat_mpi (mpi_dp.c, mpi_comm.c, mpi_link.c) defines the
 * table of data-parallel hooks, remat__mpi_dp; libremat (dp_dispatch.c)
 * refers to it weakly and calls it for a graph that remat_graph_data_parallel
 * made data parallel (a graph that is not does nothing, as dp_none.c). The
 * library-internal calls that mpi_dp.c makes into libremat cross through
 * the remat__mpi_* functions, which libremat exports for libremat_mpi alone:
 * they are no API, and both libraries come from one build. */
#ifndef REMAT_RUNTIME_DP_LINK_H
#define REMAT_RUNTIME_DP_LINK_H

#include "runtime/dp/dp.h"
#include "sched/sched.h"

typedef struct remat__dp_hooks {
  int64_t (*bucket_bytes)(const remat_graph *g);
  remat_status (*state_create)(const compiled_step *c, step_state *state,
                               struct dp_plan **out);
  int (*bucket_task)(void *run, void *arg, int worker);
  int (*agree_task)(void *run, void *arg, int worker);
  remat_status (*step_begin)(const compiled_step *c, step_state *state);
  remat_status (*step_end)(const compiled_step *c, step_state *state,
                           remat_status s, char *err, size_t err_size);
  void (*plan_free)(struct dp_plan *d);
  void (*graph_free)(remat_graph *g);
} remat__dp_hooks;

/* Defined by libremat_mpi; absent (NULL) when the program does not link it. */
REMAT_API extern const remat__dp_hooks remat__mpi_dp;

/* libremat's internal functions, exported under these names for
 * libremat_mpi (mpi_link.c forwards the internal names to them). */
REMAT_API remat_status remat__mpi_fail_msg(remat_status status,
                                           const char *msg);
REMAT_API void *remat__mpi_malloc(size_t bytes);
REMAT_API void *remat__mpi_mem_alloc(mem_arena *a, size_t bytes,
                                     remat_mem_category cat, int home,
                                     bool transient);
REMAT_API void remat__mpi_mem_free(mem_arena *a, void *p, size_t bytes,
                                   remat_mem_category cat, int home,
                                   bool transient);
REMAT_API void *remat__mpi_calloc(size_t count, size_t bytes);
REMAT_API void *remat__mpi_realloc(void *p, size_t bytes);
REMAT_API const char *remat__mpi_dtype_name(op_dtype t);
REMAT_API void remat__mpi_node_copies_refresh(const compiled_step *c,
                                              step_state *s, int32_t b,
                                              int from, int64_t lo,
                                              int64_t hi);
REMAT_API float remat__mpi_precision_get1(const plan_buffer *b,
                                          const void *data);
REMAT_API void remat__mpi_precision_set1(const plan_buffer *b, void *data,
                                         float v);
REMAT_API void remat__mpi_sched_complete(sched_pool *pool,
                                         const sched_dag *dag, int32_t task);
REMAT_API int remat__mpi_sched_run_failure(sched_pool *pool,
                                           const sched_dag *dag);

#endif
