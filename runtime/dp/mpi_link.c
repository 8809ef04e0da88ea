/* libremat_mpi's side of the link with libremat (dp_link.h): the table of
 * mpi_dp.c's hooks that libremat calls, and the internal functions that
 * mpi_dp.c calls, forwarded to the remat__mpi_* names libremat exports
 * (their own definitions are hidden inside libremat). */
#include <stdarg.h>
#include <stdio.h>

#include "base/alloc.h"
#include "base/error.h"
#include "runtime/dp/dp_link.h"
#include "runtime/exec/node_copies.h"
#include "runtime/exec/precision.h"

const remat__dp_hooks remat__mpi_dp = {
    dp_bucket_bytes, dp_state_create, dp_bucket_task, dp_agree_task,
    dp_step_begin,   dp_step_end,     dp_plan_free,   dp_graph_free};

remat_status remat__fail(remat_status status, const char *fmt, ...) {
  char msg[REMAT__ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return remat__mpi_fail_msg(status, msg);
}

void *remat__malloc(size_t bytes) { return remat__mpi_malloc(bytes); }

void *remat__realloc(void *p, size_t bytes) {
  return remat__mpi_realloc(p, bytes);
}

void *mem_alloc(mem_arena *a, size_t bytes, remat_mem_category cat, int home,
                bool transient) {
  return remat__mpi_mem_alloc(a, bytes, cat, home, transient);
}

void mem_free(mem_arena *a, void *p, size_t bytes, remat_mem_category cat,
              int home, bool transient) {
  remat__mpi_mem_free(a, p, bytes, cat, home, transient);
}

const char *op_dtype_name(op_dtype t) { return remat__mpi_dtype_name(t); }

void *remat__calloc(size_t count, size_t bytes) {
  return remat__mpi_calloc(count, bytes);
}

void node_copies_refresh(const compiled_step *c, step_state *s, int32_t b,
                         int from, int64_t lo, int64_t hi) {
  remat__mpi_node_copies_refresh(c, s, b, from, lo, hi);
}

float precision_get1(const plan_buffer *b, const void *data) {
  return remat__mpi_precision_get1(b, data);
}

void precision_set1(const plan_buffer *b, void *data, float v) {
  remat__mpi_precision_set1(b, data, v);
}

void sched_complete(sched_pool *pool, const sched_dag *dag, int32_t task) {
  remat__mpi_sched_complete(pool, dag, task);
}

int sched_run_failure(sched_pool *pool, const sched_dag *dag) {
  return remat__mpi_sched_run_failure(pool, dag);
}
