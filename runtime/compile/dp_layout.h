/* Stage "DAG", its data-parallel part: the parameters' gradients grouped
 * into allreduce buckets in the order backward finishes them, one
 * asynchronous task per bucket between its gradients' last writer and
 * their later users, and the agreement task (loss, NaN/Inf and failures of
 * every rank) after every node but the gate and the updates. What the tasks
 * do is runtime/dp/'s; this stage only places them. */
#ifndef REMAT_RUNTIME_DP_LAYOUT_H
#define REMAT_RUNTIME_DP_LAYOUT_H

#include "runtime/compile/taskgraph.h"

/* Floats in one bucket at most (an MPI int count). */
#define DP_MAX_COUNT (INT64_C(1) << 30)

typedef struct dp_bucket_layout {
  int index;      /* the bucket's number (its communication item) */
  int32_t *grads; /* gradient buffers, in the order they are packed */
  int ngrads;
  int64_t numel;  /* floats of all of them */
  int32_t task;   /* its task in the DAG */
} dp_bucket_layout;

/* The output of this part of the stage; nbuckets 0 and agree_task -1 for
 * a graph that is not data parallel. */
typedef struct plan_dp {
  dp_bucket_layout *buckets; /* [nbuckets] */
  int nbuckets;
  int32_t agree_task;
} plan_dp;

typedef struct dp_layout_request {
  const remat_graph *g;
  const plan_lowering *low;
  const plan_tasks *tasks; /* the kernel nodes' start and done tasks */
  int64_t bucket_bytes;    /* about this many bytes of gradients a bucket */
  sched_task_fn bucket_body; /* argument: the const dp_bucket_layout */
  sched_task_fn agree_body;  /* argument: the const plan_dp */
} dp_layout_request;

/* Adds the tasks to `dag` (not yet finalized) and fills `out`. On failure
 * `out` holds nothing. */
/* The bytes of the buckets' buffers in the arena (each its gradients and
 * one float more, rounded as the arena rounds). */
int64_t dp_layout_bytes(const plan_dp *d);
/* At most the bytes dp_layout_bytes will give for the lowering's
 * gradients, whatever the buckets' sizes (for the planner, before the
 * layout exists): each gradient in a bucket of its own. */
int64_t dp_layout_bound(const plan_lowering *l);
remat_status dp_layout_build(const dp_layout_request *req, sched_dag *dag,
                             plan_dp *out);
void plan_dp_free(plan_dp *d);

#endif
