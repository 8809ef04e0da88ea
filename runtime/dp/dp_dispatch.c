/* The data-parallel hooks (dp.h) as libremat has them: a graph that is not
 * data parallel does nothing (as in dp_none.c); one that
 * remat_graph_data_parallel made so, which only libremat_mpi can, goes to
 * libremat_mpi's hooks (dp_link.h). Also the internal calls libremat
 * exports for libremat_mpi. Part of the installed libraries only: the
 * internal archive that tools and tests link has mpi_dp.c (or dp_none.c)
 * in its place. */
#include "base/alloc.h"
#include "base/error.h"
#include "runtime/dp/dp_link.h"
#include "runtime/exec/node_copies.h"
#include "runtime/exec/precision.h"

__attribute__((weak)) extern const remat__dp_hooks remat__mpi_dp;

/* libremat_mpi's hooks, for a graph that is data parallel; else NULL. A
 * graph's dp is only ever set by libremat_mpi, so the table is there. */
static const remat__dp_hooks *hooks(const remat_graph *g) {
  return g->dp != NULL && &remat__mpi_dp != NULL ? &remat__mpi_dp : NULL;
}

int64_t dp_bucket_bytes(const remat_graph *g) {
  return hooks(g) != NULL ? hooks(g)->bucket_bytes(g) : 0;
}

remat_status dp_state_create(const compiled_step *c, step_state *state,
                             struct dp_plan **out) {
  *out = NULL;
  return hooks(c->g) != NULL ? hooks(c->g)->state_create(c, state, out)
                             : REMAT_OK;
}

int dp_bucket_task(void *run, void *arg, int worker) {
  if (&remat__mpi_dp == NULL)
    return REMAT_ERR_STATE; /* never placed without libremat_mpi */
  return remat__mpi_dp.bucket_task(run, arg, worker);
}

int dp_agree_task(void *run, void *arg, int worker) {
  if (&remat__mpi_dp == NULL)
    return REMAT_ERR_STATE; /* never placed without libremat_mpi */
  return remat__mpi_dp.agree_task(run, arg, worker);
}

remat_status dp_step_begin(const compiled_step *c, step_state *state) {
  return hooks(c->g) != NULL ? hooks(c->g)->step_begin(c, state) : REMAT_OK;
}

remat_status dp_step_end(const compiled_step *c, step_state *state,
                         remat_status s, char *err, size_t err_size) {
  if (hooks(c->g) == NULL)
    return s;
  return hooks(c->g)->step_end(c, state, s, err, err_size);
}

void dp_plan_free(struct dp_plan *d) {
  if (d != NULL && &remat__mpi_dp != NULL) /* only libremat_mpi makes one */
    remat__mpi_dp.plan_free(d);
}

void dp_graph_free(remat_graph *g) {
  if (hooks(g) != NULL)
    hooks(g)->graph_free(g);
}

/* ---- exported for libremat_mpi (dp_link.h) ---- */

remat_status remat__mpi_fail_msg(remat_status status, const char *msg) {
  return remat__fail_msg(status, msg);
}

void *remat__mpi_malloc(size_t bytes) { return remat__malloc(bytes); }

void *remat__mpi_mem_alloc(mem_arena *a, size_t bytes, remat_mem_category cat,
                           int home, bool transient) {
  return mem_alloc(a, bytes, cat, home, transient);
}

void remat__mpi_mem_free(mem_arena *a, void *p, size_t bytes,
                         remat_mem_category cat, int home, bool transient) {
  mem_free(a, p, bytes, cat, home, transient);
}

void *remat__mpi_realloc(void *p, size_t bytes) {
  return remat__realloc(p, bytes);
}

const char *remat__mpi_dtype_name(op_dtype t) { return op_dtype_name(t); }

void *remat__mpi_calloc(size_t count, size_t bytes) {
  return remat__calloc(count, bytes);
}

void remat__mpi_node_copies_refresh(const compiled_step *c, step_state *s,
                                    int32_t b, int from, int64_t lo,
                                    int64_t hi) {
  node_copies_refresh(c, s, b, from, lo, hi);
}

float remat__mpi_precision_get1(const plan_buffer *b, const void *data) {
  return precision_get1(b, data);
}

void remat__mpi_precision_set1(const plan_buffer *b, void *data, float v) {
  precision_set1(b, data, v);
}

void remat__mpi_sched_complete(sched_pool *pool, const sched_dag *dag,
                               int32_t task) {
  sched_complete(pool, dag, task);
}

int remat__mpi_sched_run_failure(sched_pool *pool, const sched_dag *dag) {
  return sched_run_failure(pool, dag);
}
