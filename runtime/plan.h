/* The compiled step: buffers with their lifetimes, kernel nodes in program
 * order, and the task DAG built from them; plus the remat policies and
 * regions that decide which activations are saved. */
#ifndef REMAT_RUNTIME_PLAN_H
#define REMAT_RUNTIME_PLAN_H

#include "runtime/internal.h"

/* ---- buffers ---- */
typedef struct plan_buffer {
  int64_t bytes;
  remat_mem_category cat;
  bool persistent;      /* allocated at compile, lives with the graph */
  bool zero_fill;       /* several kernels accumulate into it */
  int32_t tensor;       /* tensor id, -1 for aux/workspace buffers */
  int32_t users;        /* kernel nodes that touch it (per step) */
  int32_t first_writer; /* kernel node that allocates or zero-fills it */
  _Atomic int32_t users_left;
  int node;             /* NUMA node it was allocated on */
  float *data;
} plan_buffer;

typedef enum knode_kind {
  KNODE_FORWARD,
  KNODE_SEED,      /* d(loss) = 1 */
  KNODE_BACKWARD,
  KNODE_RECOMPUTE,
  KNODE_CHECK,  /* is a parameter's gradient finite? */
  KNODE_GATE,   /* after every check, before any update */
  KNODE_UPDATE
} knode_kind;

#define PLAN_SLOTS 12 /* bits of OP_SLOT_* */
#define PLAN_DIN_SLOTS (OP_SLOT_DIN(0) | OP_SLOT_DIN(1) | OP_SLOT_DIN(2))

/* Index in plan_knode.slot_buf of an OP_SLOT_* bit. */
static inline int plan_slot(uint32_t bit) { return __builtin_ctz(bit); }

/* One kernel of one op (or an update), lowered to a start task, one task per
 * tile and a done task. */
typedef struct plan_knode {
  knode_kind kind;
  const op_instance *inst;
  const op_kernel *kernel;   /* NULL for seed and update */
  int32_t op;                /* graph op index, -1 for seed/update */
  int32_t region;            /* top-level region, -1 none */
  int32_t slot_buf[PLAN_SLOTS]; /* buffer per OP_SLOT bit, -1 none */
  int32_t param;             /* KNODE_UPDATE: param tensor id */
  int32_t *touch;            /* distinct buffers read or written */
  int ntouch;
  int32_t *init;             /* buffers this node allocates/zero-fills */
  int ninit;
  int64_t tiles;
  double flops;
  op_bufs bufs;              /* filled by the start task */
  int32_t start_task, done_task;
  struct remat_step_plan *plan;
} plan_knode;

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
  mem_arena arena;
  plan_buffer *bufs;
  int32_t nbufs, cap_bufs;
  plan_knode *knodes;
  int32_t nknodes, cap_knodes;
  plan_tile *tiles;
  int64_t ntiles;
  sched_dag *dag;
  int32_t *value_buf;   /* [ntensors] forward buffer of each tensor */
  int32_t *grad_buf;    /* [ntensors] gradient buffer, -1 none */
  int32_t *recomp_buf;  /* [ntensors] recomputed buffer, -1 none */
  bool *saved;          /* [ntensors] the remat decision */
  int32_t loss;         /* tensor id or -1 */
  bool forward_only;
  remat_optimizer opt;
  bool has_opt;
  int64_t opt_step;
  void *scratch;        /* per-worker scratchpads, one block */
  size_t scratch_bytes;
  op_worker *workers;   /* per worker: runtime stream + this graph's scratch */
  double *worker_recompute_flops; /* [nworkers * 8]: one cache line each */
  _Atomic int nonfinite;
  double flops, recompute_flops;
  int64_t predicted_peak, predicted_transient_peak;
  plan_region_stats *region_stats; /* [nregions] */
  remat_step_stats last;
} remat_step_plan;

/* graph.c */
remat_tensor *graph_add_op(remat_graph *g, op_type type, remat_tensor **in,
                           int nin, const op_attrs *attrs);

/* lower.c: kernel nodes and buffers from the decisions in p->saved */
remat_status plan_lower(remat_step_plan *p);
void plan_unlower(remat_step_plan *p);
void plan_destroy(remat_graph *g);

/* deps.c */
remat_status plan_lifetimes(remat_step_plan *p); /* users, allocation points */
remat_status plan_build_dag(remat_step_plan *p);

/* exec.c: the task bodies */
int plan_start_task(void *arg, int worker);
int plan_tile_task(void *arg, int worker);
int plan_done_task(void *arg, int worker);

/* optim.c */
int64_t optim_tiles(int64_t numel);
int optim_update_tile(remat_step_plan *p, plan_knode *kn, int64_t tile);
int optim_check_tile(remat_step_plan *p, plan_knode *kn, int64_t tile);
int optim_seed_tile(remat_step_plan *p, plan_knode *kn);

/* policy.c: regions and remat policies */
void policy_free_all(remat_graph *g);

/* planner.c: decides, for every activation, saved or recomputed (fixed
 * policies, or the least recompute that fits the memory budget) and leaves
 * the plan lowered with that decision. */
remat_status planner_run(remat_step_plan *p);

/* memplan.c: the peak of program order; `live` (may be NULL) receives the
 * live bytes after each node's allocations. */
int64_t memplan_simulate(const remat_step_plan *p, int64_t *live);
int64_t memplan_persistent_bytes(const remat_step_plan *p);
remat_status memplan_predict(remat_step_plan *p);
remat_status plan_report(remat_step_plan *p);

#endif
