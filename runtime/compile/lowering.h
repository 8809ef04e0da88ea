/* Stage "lower with autodiff": from a graph and a remat decision (which
 * activations are saved) to the step's buffers and kernel nodes in program
 * order (forward, seed, backward with each region's recompute just before
 * it, finite checks, gate, updates). The types here are what every later
 * stage reads. */
#ifndef REMAT_RUNTIME_LOWERING_H
#define REMAT_RUNTIME_LOWERING_H

#include "runtime/internal.h"

/* One buffer of the step: a tensor's value, its gradient, a recomputed
 * copy, an op's aux tensor, a workspace or an optimizer moment. Its memory
 * is the step state's (exec/step_state.h), not the lowering's. */
typedef struct plan_buffer {
  int64_t bytes;
  op_dtype dtype;       /* element type (bf16 activations in bf16 precision;
                           aux and workspace buffers: f32, their op's own) */
  remat_mem_category cat;
  bool persistent;      /* allocated at compile, lives with the graph */
  bool zero_fill;       /* several kernels accumulate into it */
  int32_t tensor;       /* tensor id, -1 for aux/workspace/moment buffers */
  int32_t users;        /* kernel nodes that touch it (per step) */
  int32_t first_writer; /* kernel node that allocates or zero-fills it */
} plan_buffer;

/* Whether a buffer has a copy on every one of `nnodes` nodes (parameters,
 * read whole by every tile of a linear; numa_place.c makes the copies, and
 * the memory prediction counts them). */
static inline bool plan_buffer_replicated(const plan_buffer *b, int nnodes) {
  return nnodes > 1 && b->cat == REMAT_MEM_PARAMS && b->tensor >= 0;
}

typedef enum knode_kind {
  KNODE_FORWARD,
  KNODE_SEED,      /* d(loss) = 1 */
  KNODE_BACKWARD,
  KNODE_RECOMPUTE,
  KNODE_CHECK,     /* is a parameter's gradient finite? */
  KNODE_GATE,      /* after every check, before any update */
  KNODE_UPDATE
} knode_kind;

#define PLAN_SLOTS OP_NUM_SLOTS /* bits of OP_SLOT_* */
#define PLAN_DIN_SLOTS                                                  \
  (OP_SLOT_DIN(0) | OP_SLOT_DIN(1) | OP_SLOT_DIN(2) | OP_SLOT_DIN(3))
#define PLAN_MAX_USES PLAN_SLOTS

/* Index in plan_knode.slot_buf of an OP_SLOT_* bit. */
static inline int plan_slot(uint32_t bit) { return __builtin_ctz(bit); }

/* Buffers of the nodes that are not op kernels, by name (-1: none). */
typedef struct knode_seed_bufs {
  int32_t loss, loss_grad; /* reads the loss, writes d(loss) = 1 */
} knode_seed_bufs;

typedef struct knode_optim_bufs {
  int32_t param_tensor;      /* tensor id of the parameter */
  int32_t param, grad;       /* check reads grad; update writes param */
  int32_t param_copy;        /* update: the bf16 copy it refreshes, -1 none */
  int32_t adam_m, adam_v;    /* AdamW's moments, written by the update */
  int64_t check_tile0;       /* its first tile's index among the step's
                                check tiles (their sums of squares), the
                                same for a parameter's check and update */
} knode_optim_bufs;

/* One kernel of one op (or a seed, check, gate or update), lowered to a
 * start task, one task per tile and a done task. */
typedef struct plan_knode {
  knode_kind kind;
  const op_instance *inst;
  const op_kernel *kernel;      /* op kernels only */
  int32_t op;                   /* graph op index, -1 for the others */
  int32_t region;               /* top-level region, -1 none */
  int32_t slot_buf[PLAN_SLOTS]; /* op kernels: buffer per OP_SLOT bit */
  knode_seed_bufs seed;         /* KNODE_SEED */
  knode_optim_bufs optim;       /* KNODE_CHECK and KNODE_UPDATE */
  int32_t *touch;               /* lifetimes: distinct buffers it uses */
  int ntouch;
  int32_t *init;                /* lifetimes: buffers it allocates/zeroes */
  int ninit;
  bool din_accumulate[OP_MAX_IN]; /* lifetimes: op kernels add into din[k]
                                     (several kernels write it) */
  int64_t tiles;
  double flops;
} plan_knode;

/* What lowering needs to know besides the graph. */
typedef struct lower_request {
  const remat_graph *g;
  const bool *saved;   /* [ntensors]: the remat decision */
  int32_t loss;        /* tensor id, -1 for a forward-only graph */
  bool has_opt;        /* emit checks, gate and updates */
  remat_optimizer_kind opt_kind;
} lower_request;

/* The output of lowering (and, once lifetimes_assign ran, of lifetimes). */
typedef struct plan_lowering {
  plan_buffer *bufs;
  int32_t nbufs, cap_bufs;
  plan_knode *knodes;
  int32_t nknodes, cap_knodes;
  int32_t *value_buf;  /* [ntensors] forward buffer of each tensor */
  int32_t *grad_buf;   /* [ntensors] gradient buffer, -1 none */
  int32_t *recomp_buf; /* [ntensors] recomputed buffer, -1 none */
  int32_t *copy_buf;   /* [ntensors] bf16 copy of a parameter that ops read
                          in bf16 (op_desc.in_dtype), -1 none */
  double flops, recompute_flops;
  int64_t ncheck_tiles; /* tiles of all check nodes together */
} plan_lowering;

/* Lowers the graph with the request's decision into `out` (zeroed first).
 * On failure `out` holds nothing (it is freed). */
remat_status lower_graph(const lower_request *req, plan_lowering *out);
void lowering_free(plan_lowering *l);

/* A buffer a node uses, and whether the node writes it. */
typedef struct knode_use {
  int32_t buf;
  bool writes;
} knode_use;

/* The distinct buffers node `kn` uses (at most PLAN_MAX_USES), in slot
 * order; returns their number. */
int knode_uses(const plan_knode *kn, knode_use *out);

#endif
