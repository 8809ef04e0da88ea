/* The compiled step that remat_compile leaves on a graph: the remat
 * decision, the lowering with its lifetimes, the NUMA placement, the task
 * DAG, the memory arena and the per-worker state that the task bodies
 * use. */
#ifndef REMAT_RUNTIME_STEP_PLAN_H
#define REMAT_RUNTIME_STEP_PLAN_H

#include "runtime/compile/lowering.h"
#include "runtime/compile/memplan.h"
#include "runtime/compile/numa_place.h"
#include "runtime/compile/planner.h"
#include "runtime/exec/step_trace.h"

/* The argument of one tile task. */
typedef struct plan_tile {
  plan_knode *kn;
  int64_t tile;
} plan_tile;

typedef struct plan_region_stats {
  int64_t saved_bytes, recomputed_bytes;
  double recompute_flops;
} plan_region_stats;

typedef struct remat_step_plan {
  remat_graph *g;
  remat_decision decision;   /* stage "plan remat" */
  plan_lowering low;         /* stages "lower" and "lifetimes" */
  numa_plan numa;            /* stage "NUMA placement" */
  sched_dag *dag;            /* stage "DAG" */
  plan_tile *tiles;
  int64_t ntiles;
  mem_arena arena;
  void *scratch;             /* stage "persistent allocation": per-worker
                                scratchpads, one block */
  size_t scratch_bytes;
  op_worker *workers;        /* per worker: runtime stream + scratch */
  double *worker_recompute_flops; /* [nworkers * 8]: one cache line each */
  memplan_prediction predicted;   /* stage "memory prediction" */
  plan_region_stats *region_stats; /* [nregions] */
  int32_t loss;              /* tensor id or -1 */
  bool forward_only;
  remat_optimizer opt;
  bool has_opt;
  int64_t opt_step;
  _Atomic int nonfinite;
  remat_step_stats last;
  /* Gradient accumulation and clipping (step.c runs them, tasks.c does the
   * arithmetic). A check tile writes its gradient's sum of squares in
   * check_sumsq, the gate adds them in a fixed order into grad_norm and
   * sets grad_scale, the clip factor every update applies. */
  double *check_sumsq;       /* [low.ncheck_tiles] */
  double grad_norm;
  float grad_scale;
  float clip;                /* max global gradient norm; 0: no clipping */
  bool accumulating;         /* this run adds its gradients to accum and
                                updates nothing (remat_accumulate) */
  float **accum;             /* [ntensors]: per parameter the sum of its
                                gradients over the micro-steps, allocated
                                at the first remat_accumulate */
  int64_t accum_bytes;
  int64_t accum_count;       /* micro-steps summed in accum */
  char *task_names;          /* [nknodes * TASK_NAME_MAX] (task_names.h) */
  bool reported_run;         /* REMAT_VERBOSE told the first run's peak */
  bool params_written;       /* parameters were written by something else
                                than an update (compile, remat_write, a
                                load, the data-parallel broadcast): their
                                per-node and bf16 copies are rewritten from
                                the masters before the next run
                                (precision.h) */
  step_trace trace;          /* step_trace.h */
  struct dp_plan *dp;        /* data parallel (dp.h), NULL when not */
} remat_step_plan;

/* Frees g's compiled step, if any, and everything it holds. */
void step_plan_destroy(remat_graph *g);

#endif
