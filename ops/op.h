/* The op table: for each op, shape inference, planning (oneDNN primitives
 * created once) and the tile kernels of its forward and backward passes.
 * ops/ knows nothing of the scheduler or the graph: the runtime turns the
 * kernels listed here into tile tasks and hands each tile its buffers. */
#ifndef REMAT_OP_H
#define REMAT_OP_H

#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "remat.h"

#define OP_MAX_DIMS 4
#define OP_MAX_IN 4
#define OP_MAX_AUX 2
#define OP_MAX_WS 2
#define OP_MAX_KERNELS 4
#define OP_ERRMSG_MAX 256

typedef enum op_type {
  OP_LINEAR,        /* y[..,M] = x[..,K] . w[M,K]^T + b[M] (b optional) */
  OP_MATMUL,        /* y[..,N,M] = a[..,N,K] . b[..,K,M]; batch dims equal */
  OP_ADD,           /* y = a + b, same shapes (residual) */
  OP_BIAS_ADD,      /* y[..,C] = x[..,C] + b[C] */
  OP_RELU,          /* y = max(x, 0) */
  OP_GELU,          /* attrs.gelu_erf ? erf form : tanh form */
  OP_LAYERNORM,     /* y[..,C] = (x - mean) * rstd * gamma[C] + beta[C] */
  OP_SOFTMAX,       /* softmax over the last dim */
  OP_ATTN_SCORES,   /* qkv (or q, k) [, lens] -> s[B,H,T,S] = scale q.k^T,
                       masked -inf (causal, key lengths); ops/attn_geom.h */
  OP_ATTN_VALUES,   /* p[B,H,T,S], qkv (or v) -> o[B,T,H*hd] = p . v */
  OP_EMBED,         /* tokens[B,T] int32, wte[V,D], wpe[Tmax,D] -> x[B,T,D] */
  OP_CROSS_ENTROPY, /* logits[..,V], targets[..] int32 -> [1] mean over rows */
  OP_SUM,           /* x -> [1], sum of all elements */
  OP_MEAN,          /* x -> [1], mean of all elements */
  OP_ATTENTION,     /* qkv (or q, k, v) [, lens] -> o[B,T,H*hd]: fused
                       attention, aux lse[B,H,T] */
  OP_DROPOUT,       /* y = x * keep / (1 - p), keep drawn per element */
  OP_SLICE,         /* y[..,len] = x[..,start:start+len] */
  OP_MUL,           /* y = a * b, same shapes */
  OP_SILU,          /* y = x * sigmoid(x) */
  OP_SCALE,         /* y = x * attrs.scale */
  OP_RMSNORM,       /* y[..,C] = x * rstd * gamma[C], aux rstd[..] */
  OP_ROPE,          /* x[B,T,H*hd]: pairs (i, i+hd/2) of each head rotated */
  OP_SWIGLU,        /* y = silu(gate) * up, same shapes */
  OP_NUM_TYPES
} op_type;

/* Tags that remat policies read. */
#define OP_TAG_DOT 1u     /* a dot_general: matmul, linear, attention products */
#define OP_TAG_BATCHED 2u /* a dot with batch dimensions */

/* Element types of buffers. OP_BF16 is storage only: kernels compute in
 * f32 (oneDNN inside its bf16 primitives, the hand-written kernels after
 * converting with base/bf16.h). */
typedef enum op_dtype { OP_F32 = 0, OP_I32 = 1, OP_BF16 = 2 } op_dtype;

/* Bytes of one element. */
static inline int64_t op_dtype_size(op_dtype t) { return t == OP_BF16 ? 2 : 4; }

typedef struct op_shape {
  int ndim;
  int64_t dim[OP_MAX_DIMS];
} op_shape;

typedef struct op_attrs {
  int heads;    /* OP_ATTN_*, OP_ATTENTION: query heads H; OP_ROPE: heads */
  int gelu_erf; /* OP_GELU: 1 erf form, 0 tanh form */
  float eps;    /* OP_LAYERNORM: added to the variance (0 means 1e-5);
                 * OP_RMSNORM: to the mean square (0 means 1e-6) */
  /* attention (ops/attn_geom.h); a zero-initialized desc is causal
   * self-attention on a packed qkv with H key/value heads */
  int kv_heads;       /* key/value heads KVH, 0 means H */
  bool attn_full;     /* every query sees every key (no causal mask) */
  bool attn_separate; /* inputs q, k, v (scores: q, k; values: p, v)
                         instead of a packed qkv */
  bool attn_lens;     /* the last input is an int32 [B] of key lengths */
  bool probs_causal;  /* OP_ATTN_VALUES: p is zero wherever the causal mask
                         hides key j from query i (j > i): the
                         probabilities of causal scores (the materialized
                         attention builders set it), so the products may
                         skip those keys (dp is written 0 there) */
  float attn_scale;   /* multiplies q.k; 0 means 1/sqrt(head dim) */
  /* dropout (OP_DROPOUT, OP_ATTENTION on its probabilities) */
  float dropout;      /* probability of dropping an element, [0,1) */
  int rng_stream;     /* the graph's dropout site: keys the mask bits */
  float scale;   /* OP_SCALE: the constant factor */
  float theta;   /* OP_ROPE: the base of the angles (0 means 10000) */
  /* OP_ROPE: Llama 3's frequency scaling (remat_rope_scaling; factor 0:
   * none) */
  float rope_factor, rope_low, rope_high;
  int rope_orig;
  int64_t start; /* OP_SLICE: first column of the last dim */
  int64_t len;   /* OP_SLICE: columns kept */
} op_attrs;

/* What shape inference and planning see of one op node.
 *
 * Dtypes: in_dtype[i] is the element type of the buffer the kernels read
 * for input i (OP_I32 token ids, else OP_F32 or OP_BF16); out_dtype that of
 * the output and of its gradient (dout); din_dtype[i] that of input i's
 * gradient. In f32 precision every float is OP_F32. In bf16 precision
 * (remat_config.precision) the runtime stores activations in bf16: an op's
 * output is OP_BF16 unless it is a [1] scalar (losses stay f32), activation
 * inputs arrive as OP_BF16, parameters are f32 master weights whose kernels
 * read them either as f32 (op_input_keeps_f32) or through a bf16 copy
 * (in_dtype OP_BF16) that each update refreshes, and parameter gradients
 * are always OP_F32. A zero-initialized desc is all f32. */
typedef struct op_desc {
  op_type type;
  int nin;
  op_shape in[OP_MAX_IN];
  op_dtype in_dtype[OP_MAX_IN];
  op_dtype din_dtype[OP_MAX_IN];
  op_dtype out_dtype;
  op_attrs attrs;
  op_shape out; /* filled by op_infer */
} op_desc;

/* Buffer slots of an op, as bits of op_kernel.reads / op_kernel.writes. */
#define OP_SLOT_IN(i) (1u << (i))        /* forward input i */
#define OP_SLOT_OUT (1u << 4)            /* forward output */
#define OP_SLOT_AUX(k) (1u << (5 + (k))) /* op-owned forward tensor k */
#define OP_SLOT_DIN(i) (1u << (7 + (i))) /* gradient of input i */
#define OP_SLOT_DOUT (1u << 11)          /* gradient of the output */
#define OP_SLOT_WS(k) (1u << (12 + (k))) /* backward workspace k */
#define OP_NUM_SLOTS 14                  /* bits of the slots above */
/* Index (0..OP_NUM_SLOTS-1) of a slot bit. */
static inline int op_slot_index(uint32_t bit) { return __builtin_ctz(bit); }

/* The buffers one tile sees. Pointers are to the start of whole tensors;
 * the tile picks its part. int32 and bf16 buffers are passed as float* and
 * cast (to int32_t * or uint16_t *) before any indexing: their element
 * types are those of the op's desc. */
typedef struct op_bufs {
  float *in[OP_MAX_IN];
  float *out;
  float *aux[OP_MAX_AUX];
  float *din[OP_MAX_IN];        /* NULL: this input needs no gradient */
  float *dout;
  float *ws[OP_MAX_WS];
  bool din_accumulate[OP_MAX_IN]; /* add into din instead of overwriting */
  /* The run: dropout draws its mask bits from counter_rng_key(rng_seed,
   * attrs.rng_stream, rng_step) (base/counter_rng.h); it drops nothing
   * unless training. Zero-initialized: not training. */
  uint64_t rng_seed; /* the graph's seed */
  uint64_t rng_step; /* the run's number: a recompute shares its forward's */
  bool training;     /* a step or accumulation, not remat_forward */
} op_bufs;

/* Per-worker execution context: a oneDNN stream and a user-mode
 * scratchpad of at least the largest op_instance.scratch_bytes. */
typedef struct op_worker {
  dnnl_stream_t stream;
  void *scratch;
  size_t scratch_bytes;
} op_worker;

struct op_instance;
/* Computes tile `tile` of a kernel; returns a remat_status. Tiles of one
 * kernel are independent and may run concurrently on different workers. */
typedef int (*op_tile_fn)(const struct op_instance *op, const op_bufs *b,
                          int64_t tile, op_worker *w);

/* Which part of each buffer a tile works on, for NUMA placement and for
 * counting the bytes a tile reads from other nodes. A row-tiled kernel
 * (rows > 0) cuts a space of `rows` rows into blocks of `row_block` rows;
 * tile t works on block t / row_tiles (row_tiles tiles share a block: the
 * weight-gradient blocks of one chunk of rows). In a buffer of B bytes a
 * tile of a kernel with `tiles` tiles touches
 *   in row_slots:    its block's share, bytes [B r0 / rows, B r1 / rows)
 *                    for rows [r0, r1) (exact for row-major buffers of
 *                    `rows` rows; for attention, whose rows are (batch,
 *                    head, query) and whose qkv rows are (batch, query),
 *                    the share lies inside the tile's batch), or one of
 *                    row_parts[slot] equal parts of it (a block of its
 *                    columns) when the tiles of a block split it;
 *   in tile_slots:   its own share, bytes [B t / tiles, B (t + 1) / tiles);
 *   in spread_slots: B / tiles bytes spread over the whole buffer (a block
 *                    of columns of every row);
 *   in other slots:  the whole buffer (weights).
 * rows == 0: the tiles are not row blocks (column-block reductions,
 * batched matmul); the runtime does not pin them to a node. */
typedef struct op_span {
  int64_t rows, row_block, row_tiles;
  uint32_t row_slots, tile_slots, spread_slots;
  int32_t row_parts[OP_NUM_SLOTS]; /* by slot index; 0 means 1 (int32:
                                      graph ops stay small) */
} op_span;

typedef struct op_kernel {
  const char *name; /* "linear.fwd", "linear.dw", ...: static string */
  op_tile_fn fn;
  int64_t tiles;
  double flops;     /* all tiles together */
  uint32_t reads;   /* OP_SLOT_* bits */
  uint32_t writes;  /* OP_SLOT_* bits */
  op_span span;
} op_kernel;

/* A planned op: its kernels in execution order (a kernel may read what an
 * earlier one of the same list wrote), the sizes of its aux and workspace
 * buffers, and its private state (dims, oneDNN primitives). */
typedef struct op_instance {
  op_desc desc;
  op_kernel fwd[OP_MAX_KERNELS];
  int nfwd;
  op_kernel bwd[OP_MAX_KERNELS];
  int nbwd;
  size_t aux_bytes[OP_MAX_AUX];
  int naux;
  size_t ws_bytes[OP_MAX_WS];
  int nws;
  size_t scratch_bytes;
  /* op_fuse: the forward of this op and of its output's consumer in one
   * kernel; nfused 0 (none planned) or 1 */
  op_kernel fused;
  int nfused;
  void *state;
} op_instance;

const char *op_name(op_type type);
unsigned op_tags(const op_desc *desc);
/* Whether input i of an op of `type`, when it is a parameter, is read as
 * the f32 master weight in bf16 precision (layer norm's gain and bias,
 * the embedding tables, biases) rather than through a bf16 copy (the
 * weights of dot products). */
bool op_input_keeps_f32(op_type type, int i);
/* "f32", "int32", "bf16". */
const char *op_dtype_name(op_dtype t);

/* Checks dtypes and shapes and fills desc->out. On error the message names
 * the op and the shapes, e.g. "linear: x [2,3,64] and w [32,48]: the last
 * dim of x (64) must equal w's second dim (48)". */
remat_status op_infer(op_desc *desc, char err[OP_ERRMSG_MAX]);

/* Creates the op's primitives (with omp_get_max_threads() forced to 1 while
 * creating them, the caller's setting restored) and fills `inst`. */
remat_status op_plan(const op_desc *desc, dnnl_engine_t engine,
                     op_instance *inst, char err[OP_ERRMSG_MAX]);
void op_instance_release(op_instance *inst);

/* Plans inst->fused: the forward of a planned linear `inst` with the op
 * `next` that consumes its output run as the epilogue of its matmul
 * (oneDNN post-ops, in f32 before the one rounding to the output's
 * dtype); `in` is the input of next that is the linear's output. `next`
 * is a gelu of it (kernel "linear.fwd_gelu") or an add of it and another
 * tensor of the same shape ("linear.fwd_add", which reads that tensor in
 * slot OP_SLOT_IN(3)). The kernel reads the linear's inputs in their
 * slots and writes next's output in OP_SLOT_OUT; its tiles are those of
 * the linear's forward. REMAT_ERR_INVALID_ARG when the pair does not fuse
 * (nothing planned). */
remat_status op_fuse(op_instance *inst, const op_desc *next, int in,
                     char err[OP_ERRMSG_MAX]);

/* The implementation oneDNN picks for a bf16 matmul on this CPU, written
 * into impl ("brg:avx512_core_bf16", "brg:avx512_core_amx", ...):
 * REMAT_OK when it is a fast kernel, REMAT_ERR_BACKEND when there is none
 * or only a reference loop (no AVX512-BF16 or AMX, or ONEDNN_MAX_CPU_ISA
 * below them). */
remat_status op_bf16_kernel(dnnl_engine_t engine, char *impl, size_t cap);

/* Elements of a shape (1 for ndim 0). */
int64_t op_numel(const op_shape *s);
/* "[2,3,64]": room for OP_MAX_DIMS dims of 20 digits. */
#define OP_SHAPE_STR_MAX 192
const char *op_shape_str(const op_shape *s, char buf[OP_SHAPE_STR_MAX]);

#endif
