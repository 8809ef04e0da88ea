/* The step state: everything a run of the compiled step changes (the
 * memory of its buffers, per-worker scratch, users left per buffer,
 * optimizer counters, accumulation sums, clipping, the trace, data
 * parallel buffers), beside the const compiled step it runs; and the run
 * in progress, which every task body receives. */
#ifndef REMAT_RUNTIME_STEP_STATE_H
#define REMAT_RUNTIME_STEP_STATE_H

#include "runtime/compile/compiled.h"
#include "runtime/exec/step_trace.h"

/* What a run does. */
typedef enum run_mode {
  RUN_STEP,       /* forward, backward, update (remat_step) */
  RUN_ACCUMULATE, /* forward, backward, gradients added to the sums
                     (remat_accumulate) */
  RUN_FORWARD     /* a graph compiled without a loss (remat_forward) */
} run_mode;

typedef struct step_state {
  mem_arena arena;
  float **data;                /* [nbufs]: each buffer's memory, NULL while
                                  a transient buffer is not alive; of its
                                  dtype's elements (cast before indexing) */
  _Atomic int32_t *users_left; /* [nbufs]: users still to finish this run */
  op_bufs *bufs;               /* [nknodes]: op kernels' buffers, bound by
                                  their start task */
  float **copies;              /* [nbufs * nnodes] of replicated buffers: the
                                  copy on each node (copies[b * nnodes] is
                                  data[b]); NULL on one node */
  void *scratch;               /* per-worker scratchpads, one block */
  op_worker *workers;          /* per worker: runtime stream + scratch */
  double *worker_recompute_flops; /* [nworkers * 8]: one cache line each */
  float lr;                    /* remat_set_lr, else the compiled one */
  float clip;                  /* max global gradient norm; 0: no clipping */
  int64_t opt_step;            /* updates applied */
  uint64_t rng_step;           /* the run's dropout step (op_bufs.rng_step):
                                  its update's number and micro-step */
  bool training;               /* the run is a step or an accumulation */
  _Atomic int nonfinite;
  remat_step_stats last;
  /* Clipping: a check tile writes its gradient's sum of squares in
   * check_sumsq, the gate adds them in a fixed order into grad_norm and
   * sets grad_scale, the clip factor every update applies. */
  double *check_sumsq;         /* [low.ncheck_tiles] */
  double grad_norm;
  float grad_scale;
  /* The update's bound (optim.h): per check tile, OPTIM_NMAX floats, the
   * largest |w|, |m|, v the last update wrote and the largest |sum| of the
   * last micro-step; rescanned before a run when params_written. The gate
   * sets overflow_tensor (else -1) to the parameter whose update would
   * make a value NaN or Inf, and nonfinite, so that no update runs. */
  float *tile_max;
  int32_t overflow_tensor;
  float **accum;               /* [ntensors]: per parameter the sum of its
                                  gradients over the micro-steps, allocated
                                  at the first remat_accumulate */
  int64_t accum_bytes;
  int64_t accum_count;         /* micro-steps summed in accum */
  bool reported_run;           /* REMAT_VERBOSE told the first run's peak */
  bool params_written;         /* parameters were written by something else
                                  than an update (creation, remat_write, a
                                  load, the data-parallel broadcast): their
                                  per-node and bf16 copies are rewritten
                                  from the masters before the next run
                                  (precision.h) */
  step_trace trace;            /* step_trace.h */
  int cost_runs;               /* runs whose task times went into the
                                  runtime's cost table (step_costs.h) */
  sched_trace_record *cost_records; /* [ntasks]: their times, while
                                       cost_runs < COST_STEPS */
  bool replanned;              /* planned again with the measured times,
                                  or found nothing to gain (replan.h) */
  struct dp_plan *dp;          /* data parallel (dp.h), NULL when not */
} step_state;

/* A graph's compiled step and its state (remat_graph.step). */
typedef struct graph_step {
  compiled_step compiled;
  step_state state;
  remat_decision retired; /* the decision a re-plan replaced (replan.h),
                             kept so that the policy names that
                             remat_tensor_plan_of gave stay valid */
} graph_step;

/* The run in progress: the scheduler's context for every task body. */
typedef struct step_run {
  const compiled_step *c;
  step_state *s;
  run_mode mode;
  int64_t opt_step; /* the update's number: s->opt_step + 1 */
} step_run;

/* The state for compiled step c: the arena with c's homes and expected
 * blocks, the persistent buffers (parameters initialized from the graph's
 * seed), the per-node copies, scratchpads and counters. On failure `out`
 * holds nothing and the message is the thread's last error. */
remat_status step_state_create(const compiled_step *c, step_state *out);
void step_state_free(const compiled_step *c, step_state *s);

/* After a load replaced the parameters: the gradient sums of
 * remat_accumulate are discarded (they are gradients of the weights that
 * were), and the per-node and bf16 copies are remade before the next
 * run. */
void step_state_params_loaded(step_state *s);

/* Frees g's compiled step and its state, if any (prepare.c). */
void graph_step_destroy(remat_graph *g);

#endif
