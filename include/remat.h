/* remat.h: the public API of remat, a runtime that trains neural networks
 * on many-core CPUs with rematerialization in its task scheduler: the
 * runtime, graphs and ops, remat policies, compile and steps, and saving
 * and loading. The built-in GPT model's builder is in remat_gpt.h, data
 * parallel over MPI in remat_mpi.h.
 *
 * Handles are opaque. Every function that can fail returns a remat_status;
 * remat_last_error() gives the words of the last failure on the calling
 * thread, and remat_graph_error() those of the last failed call on a
 * graph. Graph building uses a sticky error: the first failing builder call
 * records its message on the graph, later calls return NULL and do nothing,
 * and remat_compile() returns the recorded status. The library never exits,
 * aborts or writes to stdout. */
#ifndef REMAT_H
#define REMAT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define REMAT_API __attribute__((visibility("default")))
#else
#define REMAT_API
#endif

/* The version of this header: MAJOR.MINOR.PATCH, the same as the library's
 * (meson.build's project version). See "Versions and ABI" in README.md. */
#define REMAT_VERSION_MAJOR 0
#define REMAT_VERSION_MINOR 4
#define REMAT_VERSION_PATCH 0

/* The version of the library the program runs with, "MAJOR.MINOR.PATCH"
 * (it may differ from the header's macros in PATCH or MINOR). */
REMAT_API const char *remat_version(void);

typedef enum remat_status {
  REMAT_OK = 0,
  REMAT_ERR_INVALID_ARG = 1, /* a bad argument: NULL, out of range, wrong graph */
  REMAT_ERR_OUT_OF_MEMORY = 2,
  REMAT_ERR_SHAPE = 3,      /* shapes or dtypes that do not fit an op */
  REMAT_ERR_CONFIG = 4,     /* a bad environment value or remat_config field */
  REMAT_ERR_LIMIT = 5,      /* a size limit exceeded */
  REMAT_ERR_CYCLE = 6,      /* a dependency cycle */
  REMAT_ERR_STATE = 7,      /* a call at the wrong time (step before compile) */
  REMAT_ERR_BACKEND = 8,    /* oneDNN or hwloc failed */
  REMAT_ERR_IO = 9,         /* a file could not be read or written */
  REMAT_ERR_NUMERIC = 10,   /* NaN or Inf in the loss or gradients, or in
                               what an update would write */
  REMAT_ERR_BUDGET = 11,    /* no remat plan fits the memory budget */
  REMAT_ERR_POLICY = 12,    /* a bad remat policy */
  REMAT_ERR_CANCELLED = 13  /* remat_cancel stopped the run, or the graph
                               is cancelled (see remat_cancel) */
} remat_status;

/* "REMAT_OK", "REMAT_ERR_SHAPE", ... */
REMAT_API const char *remat_status_string(remat_status status);
/* The message of the last failure on the calling thread ("" if none). */
REMAT_API const char *remat_last_error(void);


/* ---- runtime: worker threads, topology, configuration ---- */

typedef struct remat_runtime remat_runtime;

typedef enum remat_bind {
  REMAT_BIND_CORE = 0, /* one core per worker */
  REMAT_BIND_NUMA = 1, /* a worker may run on any core of its NUMA node */
  REMAT_BIND_NONE = 2
} remat_bind;

/* Bits of remat_config.set: the fields the program sets. Fields whose bit
 * is clear come from the environment (REMAT_*), or from the defaults. */
#define REMAT_SET_NUM_THREADS (1u << 0)
#define REMAT_SET_BIND (1u << 1)
#define REMAT_SET_POLICY (1u << 2)
#define REMAT_SET_MEMORY_BUDGET (1u << 3)
#define REMAT_SET_LOOKAHEAD (1u << 4)
#define REMAT_SET_TRACE (1u << 5)
#define REMAT_SET_VERBOSE (1u << 6)
#define REMAT_SET_TOPOLOGY (1u << 7)
#define REMAT_SET_PRECISION (1u << 8)
/* Not a field: the runtime reads no REMAT_* environment variable at all
 * (REMAT_DP_* included), so that fields whose bit is clear take the
 * defaults whatever the process's environment holds. remat_runtime_config
 * reports it in `set`. */
#define REMAT_SET_NO_ENV (1u << 9)

/* Precision of a step. In bf16, activations (saved, recomputed and their
 * gradients) and f32 inputs are stored in bf16, matmuls take bf16 operands
 * and accumulate in f32, the other ops compute in f32 on bf16 storage;
 * parameters (master weights), their gradients, optimizer moments and
 * [1]-shaped results (losses) stay f32, and each update refreshes a bf16
 * copy of the weights that matmuls read. Reads and writes through the API
 * are f32 in both: a bf16 tensor (an input included) reads back as its
 * values rounded to bf16. In bf16, layer norm's gain and bias, rms norm's
 * gain and the embedding tables must be parameters (they are read as
 * f32). */
typedef enum remat_precision {
  REMAT_PRECISION_F32 = 0,
  REMAT_PRECISION_BF16 = 1
} remat_precision;

/* The most worker threads a runtime takes (remat_config.num_threads,
 * REMAT_NUM_THREADS). */
#define REMAT_MAX_THREADS 1024

typedef struct remat_config {
  unsigned set;          /* REMAT_SET_* bits */
  int num_threads;       /* REMAT_NUM_THREADS: 1..1024; default physical cores */
  remat_bind bind;       /* REMAT_BIND: core, numa, none; default core */
  const char *policy;    /* REMAT_POLICY: default policy of regions; default
                            "nothing_saveable" */
  int64_t memory_budget; /* REMAT_MEMORY_BUDGET in bytes; 0 means none */
  int lookahead;         /* REMAT_LOOKAHEAD: 1..64; default 1 */
  const char *trace_path; /* REMAT_TRACE: Chrome trace of each step; NULL off.
                             Checked at creation: it must name a regular
                             file that can be written (created if missing),
                             beside which a new file can be created (each
                             trace is written whole and renamed over it) */
  int verbose;           /* REMAT_VERBOSE: 0, 1 (plan to stderr), 2 (tasks) */
  const char *topology;  /* REMAT_TOPOLOGY: an hwloc synthetic description
                            such as "package:2 numa:1 core:4 pu:1", or the
                            path of an hwloc XML file (lstopo FILE.xml):
                            workers are placed on NUMA nodes as on that
                            machine (default threads: its cores) and bound
                            to nothing; NULL: this machine */
  remat_precision precision; /* REMAT_PRECISION: f32 or bf16; default f32.
                                bf16 fails at runtime creation on a CPU
                                for which oneDNN has no bf16 matmul kernel
                                (it needs AVX512-BF16 or AMX) */
} remat_config;

/* Parses a byte size such as "1.5GiB", "800MB", "4096" (B, KB, MB, GB, TB
 * are powers of 1000; KiB, MiB, GiB, TiB powers of 1024). */
REMAT_API remat_status remat_parse_bytes(const char *text, int64_t *bytes);

/* Creates a runtime: reads the REMAT_* environment once (unless config sets
 * REMAT_SET_NO_ENV), overlays the fields `config` sets (config may be
 * NULL), starts and pins the workers. A bad value (a topology hwloc cannot
 * load, a trace path that cannot be written included) fails with
 * REMAT_ERR_CONFIG and a message naming the variable, the value and what
 * is accepted. */
REMAT_API remat_status remat_runtime_create(const remat_config *config,
                                            remat_runtime **out);
/* Stops the workers and frees the runtime once its last graph is destroyed
 * too (graphs keep their runtime alive). */
REMAT_API void remat_runtime_destroy(remat_runtime *rt);
/* The configuration in force (environment and code merged). */
REMAT_API remat_status remat_runtime_config(const remat_runtime *rt,
                                            remat_config *out);
REMAT_API int remat_runtime_num_threads(const remat_runtime *rt);
/* The NUMA node of worker `worker` (0 to num_threads-1): nodes are numbered
 * from 0 among those that hold workers, and workers of a node have
 * consecutive indices. -1 when rt is NULL or worker is out of range. */
REMAT_API int remat_runtime_worker_node(const remat_runtime *rt, int worker);

/* ---- graph building (sticky error) ---- */

typedef struct remat_graph remat_graph;
typedef struct remat_tensor remat_tensor;

typedef enum remat_dtype { REMAT_F32 = 0, REMAT_I32 = 1 } remat_dtype;

typedef enum remat_init {
  REMAT_INIT_ZEROS = 0,
  REMAT_INIT_ONES = 1,
  REMAT_INIT_NORMAL = 2 /* normal with standard deviation `scale` */
} remat_init;

#define REMAT_MAX_DIMS 4

REMAT_API remat_status remat_graph_create(remat_runtime *rt,
                                          remat_graph **out);
REMAT_API void remat_graph_destroy(remat_graph *g);
/* The sticky status of graph building (or of compile). */
REMAT_API remat_status remat_graph_status(const remat_graph *g);
/* The words of the last call on g that failed, kept on the graph, so that
 * threads that use different graphs never see each other's messages: a
 * step, accumulate, forward, feed, read, write, read_grad, set_lr,
 * set_clip, trace_steps, save or load on g that fails sets it (to what
 * remat_last_error() says on the calling thread), and the next one of
 * these that succeeds clears it (a step whose trace could not be written
 * sets it with the trace's words, see trace_status). A call refused before
 * it starts (g NULL, not compiled, another thread inside g, after fork())
 * leaves it alone. With no such message: the sticky building or compile
 * error of remat_graph_status ("" if none). Valid until the next call on
 * g. */
REMAT_API const char *remat_graph_error(const remat_graph *g);
/* Seed of parameter initialization (default 0). */
REMAT_API remat_status remat_graph_seed(remat_graph *g, uint64_t seed);

/* A tensor fed before each step with remat_feed. */
REMAT_API remat_tensor *remat_input(remat_graph *g, const char *name,
                                    remat_dtype dtype, int ndim,
                                    const int64_t *dims);
/* A trained parameter, initialized at compile from the graph's seed:
 * zeros, ones, or normal with standard deviation `scale`, which must be
 * finite and at most REMAT_MAX_INIT_SCALE in magnitude (every initial value
 * is then finite). */
#define REMAT_MAX_INIT_SCALE 1e30f
REMAT_API remat_tensor *remat_param(remat_graph *g, const char *name, int ndim,
                                    const int64_t *dims, remat_init init,
                                    float scale);
/* Freezes parameter t (before remat_compile): it keeps its value, which
 * remat_write and the loads still set, but is never trained. It has no
 * gradient (remat_read_grad fails with REMAT_ERR_INVALID_ARG, gradient
 * files leave it out), no optimizer state, no update and no data-parallel
 * allreduce; a linear whose weight is frozen computes only the gradient of
 * its input. Its bytes count as REMAT_MEM_PARAMS. In bf16 precision a
 * frozen parameter that every op reads in bf16 (linear and matmul
 * operands, not embedding tables, norm scales or biases) is stored
 * once, in bf16: remat_read returns its bf16 values widened and remat_write
 * and the loads round into it. A graph whose every parameter is frozen
 * cannot be compiled with an optimizer (nothing to update): compile it with
 * loss NULL for remat_forward, or with a loss and no optimizer to evaluate
 * the loss with remat_step. Freezing twice is allowed. A tensor that is not
 * a parameter, or a compiled graph, fail with a message on the graph's
 * sticky error. */
REMAT_API remat_status remat_param_freeze(remat_graph *g, remat_tensor *t);

/* Ops. They take const handles of their inputs (an op never changes them)
 * and return a new tensor. Shapes: leading dims (..) are flattened into
 * rows. */
/* y[..,M] = x[..,K] . w[M,K]^T + b[M]; b may be NULL. Tag: dot. */
REMAT_API remat_tensor *remat_linear(remat_graph *g, const remat_tensor *x,
                                     const remat_tensor *w,
                                     const remat_tensor *b);
/* y[..,N,M] = a[..,N,K] . b[..,K,M]. Tags: dot (+ batched with batch dims). */
REMAT_API remat_tensor *remat_matmul(remat_graph *g, const remat_tensor *a,
                                     const remat_tensor *b);
REMAT_API remat_tensor *remat_add(remat_graph *g, const remat_tensor *a,
                                  const remat_tensor *b);
REMAT_API remat_tensor *remat_bias_add(remat_graph *g, const remat_tensor *x,
                                       const remat_tensor *b);
REMAT_API remat_tensor *remat_relu(remat_graph *g, const remat_tensor *x);
typedef enum remat_gelu_form {
  REMAT_GELU_TANH = 0,
  REMAT_GELU_ERF = 1
} remat_gelu_form;
REMAT_API remat_tensor *remat_gelu(remat_graph *g, const remat_tensor *x,
                                   remat_gelu_form form);
/* Layer norm over the last dim with scale gamma[C] and shift beta[C];
 * eps <= 0 means 1e-5; a NaN or infinite eps is refused. */
REMAT_API remat_tensor *remat_layernorm(remat_graph *g, const remat_tensor *x,
                                        const remat_tensor *gamma,
                                        const remat_tensor *beta, float eps);
REMAT_API remat_tensor *remat_softmax(remat_graph *g, const remat_tensor *x);
/* Causal attention in three named steps: scores[B,H,T,T] (q.k^T/sqrt(hd),
 * masked), probs = softmax(scores), out[B,T,D] = probs . v, where
 * qkv[B,T,3D] holds q, k, v side by side. Tags: dot, batched. */
REMAT_API remat_tensor *
remat_attention_scores(remat_graph *g, const remat_tensor *qkv, int heads);
REMAT_API remat_tensor *remat_attention_values(remat_graph *g,
                                               const remat_tensor *probs,
                                               const remat_tensor *qkv,
                                               int heads);
/* The three steps above; the scores and probs tensors are named
 * "attn_scores" and "attn_probs". remat_attention with a packed qkv and
 * causal = 1. */
REMAT_API remat_tensor *
remat_causal_self_attention(remat_graph *g, const remat_tensor *qkv, int heads);
/* The same causal attention fused into one op that never stores a T x T
 * matrix: it saves out[B,T,D] and the per-row log-sum-exp [B,H,T], and its
 * backward recomputes the probabilities block by block. It has no
 * "attn_scores" or "attn_probs" tensors. remat_attention with a packed
 * qkv, causal = 1 and fused = 1. Tags: dot, batched. */
REMAT_API remat_tensor *
remat_fused_attention(remat_graph *g, const remat_tensor *qkv, int heads);
/* How remat_attention attends. A config with only heads set is
 * bidirectional, materialized, without dropout. */
typedef struct remat_attention_config {
  int heads;    /* H query heads */
  int kv_heads; /* KVH key/value heads; 0 means H; H must be a multiple of
                   KVH (grouped-query attention: query head h reads
                   key/value head h / (H / KVH)) */
  int causal;   /* 0 or 1: query t sees keys 0..t only */
  const remat_tensor *key_lengths; /* NULL, or an int32 input [B]: keys at
                   positions >= its row's length are masked; remat_feed
                   refuses a length of 0 or above S */
  float dropout; /* probability in [0,1) of dropping an attention
                   probability (training only; the rest scaled by
                   1 / (1 - p)) */
  float scale;  /* multiplies q.k; 0 means 1/sqrt(head dim) */
  int fused;    /* 1: one op that never stores a T x S matrix; 0: scores,
                   softmax (and dropout) and values, the scores and
                   probabilities named "attn_scores" and "attn_probs" */
} remat_attention_config;
/* out[B,T,H*hd] = softmax(scale q.k^T + mask) . v per head, with
 * q[B,T,H*hd], k and v [B,S,KVH*hd] (S may differ from T: cross
 * attention), or, when k and v are both NULL, q a packed qkv
 * [B,T,(H+2 KVH)*hd] (the q heads, then the k heads, then the v heads).
 * The mask is -inf where a query may not see a key (causal, key lengths).
 * Tags: dot, batched. */
REMAT_API remat_tensor *remat_attention(remat_graph *g, const remat_tensor *q,
                                        const remat_tensor *k,
                                        const remat_tensor *v,
                                        const remat_attention_config *cfg);
/* Zeroes each element of x with probability p in [0,1) and scales the
 * others by 1 / (1 - p) in training; remat_forward passes x unchanged.
 * The mask is drawn from the graph's seed, the op and the step's number
 * (remat_step and remat_accumulate draw a new one each run), so a
 * recompute draws the forward's mask again, whatever the threads. */
REMAT_API remat_tensor *remat_dropout(remat_graph *g, const remat_tensor *x,
                                      float p);
/* x[B,T,D] = wte[tokens] + wpe[0..T); tokens[B,T] int32. wpe may be NULL
 * (no learned positions): x[B,T,D] = wte[tokens]. A table may also be read
 * by other ops (an LM head tied to wte): its gradient is the sum of theirs,
 * in a fixed order. */
REMAT_API remat_tensor *remat_embed(remat_graph *g, const remat_tensor *tokens,
                                    const remat_tensor *wte,
                                    const remat_tensor *wpe);
/* Mean over rows of -log softmax(logits[..,V])[targets[..]]: a [1] tensor. */
REMAT_API remat_tensor *remat_cross_entropy(remat_graph *g,
                                            const remat_tensor *logits,
                                            const remat_tensor *targets);
REMAT_API remat_tensor *remat_sum(remat_graph *g, const remat_tensor *x);
REMAT_API remat_tensor *remat_mean(remat_graph *g, const remat_tensor *x);
/* RMS norm (Llama's) over the last dim with scale gamma[C]:
 * y = x / sqrt(mean(x^2) + eps) * gamma. eps <= 0 means 1e-6; a NaN or
 * infinite eps is refused. */
REMAT_API remat_tensor *remat_rmsnorm(remat_graph *g, const remat_tensor *x,
                                      const remat_tensor *gamma, float eps);
/* Columns [start, start + len) of x's last dim: y has x's shape with len
 * as its last dim (to split a packed qkv, or a feed-forward's gate and up
 * halves). Several slices of one tensor may be taken: its gradient is the
 * sum of theirs. start < 0, len < 1 or start + len past the last dim is
 * refused. */
REMAT_API remat_tensor *remat_slice(remat_graph *g, const remat_tensor *x,
                                    int64_t start, int64_t len);
/* y = a * b, elementwise; a and b of the same shape. */
REMAT_API remat_tensor *remat_mul(remat_graph *g, const remat_tensor *a,
                                  const remat_tensor *b);
/* y = x * sigmoid(x) (SiLU, or swish). */
REMAT_API remat_tensor *remat_silu(remat_graph *g, const remat_tensor *x);
/* y = silu(gate) * up in one pass over memory (the gated feed-forward of
 * Llama): remat_mul(g, remat_silu(g, gate), up) without storing
 * silu(gate) between them. gate and up of the same shape. */
REMAT_API remat_tensor *remat_swiglu(remat_graph *g, const remat_tensor *gate,
                                     const remat_tensor *up);
/* y = x * s for a constant s (LoRA's alpha / r, say); a NaN or infinite s
 * is refused. */
REMAT_API remat_tensor *remat_scale(remat_graph *g, const remat_tensor *x,
                                    float s);
/* Rotary position embeddings on x[B,T,heads*hd] at positions 0..T-1, in
 * Hugging Face's half-split layout: in each head, with x1 its first hd/2
 * columns and x2 its last, y = x * cos + rotate_half(x) * sin where
 * rotate_half(x) = (-x2, x1), and the angle of position t and pair i
 * (0 <= i < hd/2) is t * theta^(-2i/hd). theta <= 0 means 10000; a NaN or
 * infinite theta is refused. heads must divide the last dim and hd must be
 * even. The cos and sin tables are computed once, at compile time. */
REMAT_API remat_tensor *remat_rope(remat_graph *g, const remat_tensor *x,
                                   int heads, float theta);
/* Llama 3's RoPE frequency scaling (Hugging Face's rope_scaling with
 * rope_type "llama3"): with orig = original_max_position_embeddings and a
 * pair's frequency f and wavelength L = 2 pi / f, f is kept where
 * L < orig / high_freq_factor, divided by factor where
 * L > orig / low_freq_factor, and in between blended as
 * (1 - s) f / factor + s f with s = (orig / L - low_freq_factor) /
 * (high_freq_factor - low_freq_factor). factor 0: no scaling. */
typedef struct remat_rope_scaling {
  float factor;           /* >= 1, or 0 for none */
  float low_freq_factor;  /* > 0 */
  float high_freq_factor; /* > low_freq_factor */
  int original_max_position_embeddings; /* >= 1 */
} remat_rope_scaling;
/* remat_rope with its frequencies scaled as `scaling` says (NULL or a
 * factor of 0: remat_rope). Values outside the ranges above, or not
 * finite, are refused with a message naming the field. */
REMAT_API remat_tensor *remat_rope_scaled(remat_graph *g,
                                          const remat_tensor *x, int heads,
                                          float theta,
                                          const remat_rope_scaling *scaling);

REMAT_API int remat_tensor_ndim(const remat_tensor *t);
REMAT_API int64_t remat_tensor_dim(const remat_tensor *t, int i);
REMAT_API int64_t remat_tensor_numel(const remat_tensor *t);
REMAT_API const char *remat_tensor_name(const remat_tensor *t);
/* Keeps an activation readable after each step or forward (e.g. logits). */
REMAT_API remat_status remat_keep(remat_graph *g, remat_tensor *t);


/* ---- rematerialization: checkpoint regions and policies (JAX's names) ---- */

typedef struct remat_policy remat_policy;

/* Policies decide, for each activation inside a checkpoint region, whether
 * it is saved for backward or recomputed there. Region outputs are always
 * saved; outside any region everything is saved. Constructors return NULL
 * with a message (remat_last_error) on a bad argument, a result beyond the
 * limits below, or no memory. The caller destroys what it creates.
 *
 * Names (of checkpointed tensors, and in the name-based policies) are 1 to
 * 63 bytes, none of them a space, ',', '+', ':' or a control byte
 * (0x01-0x1F, 0x7F); other bytes, UTF-8 included, are allowed. Messages
 * show bytes outside 0x20-0x7E as \xNN and give offsets in bytes from 0. */

/* save_from_both_policies nests at most this deep in a policy: a string
 * (or a constructor) that nests deeper fails with REMAT_ERR_POLICY. */
#define REMAT_MAX_POLICY_DEPTH 32
/* A policy string is at most this many bytes, without its NUL; longer ones
 * fail with REMAT_ERR_POLICY, and constructors refuse a policy whose string
 * form would be longer, so every policy formats to a string that parses. */
#define REMAT_MAX_POLICY_LENGTH 65536

REMAT_API remat_policy *remat_policy_everything_saveable(void);
REMAT_API remat_policy *remat_policy_nothing_saveable(void);
/* Saves the results of dots (matmul, linear, attention products). */
REMAT_API remat_policy *remat_policy_dots_saveable(void);
REMAT_API remat_policy *remat_policy_checkpoint_dots(void); /* alias */
/* Saves the results of dots that have no batch dimensions. */
REMAT_API remat_policy *remat_policy_dots_with_no_batch_dims_saveable(void);
REMAT_API remat_policy *
remat_policy_checkpoint_dots_with_no_batch_dims(void); /* alias */
/* Saves the tensors named (remat_checkpoint_name) with one of `names`. */
REMAT_API remat_policy *remat_policy_save_only_these_names(
    const char *const *names, int count);
/* Saves named tensors except those with one of `names`. */
REMAT_API remat_policy *remat_policy_save_any_names_but_these(
    const char *const *names, int count);
REMAT_API remat_policy *remat_policy_save_anything_except_these_names(
    const char *const *names, int count); /* alias */
/* Saves what either policy saves; neither may be "auto". */
REMAT_API remat_policy *remat_policy_save_from_both_policies(
    const remat_policy *a, const remat_policy *b);
/* Parses the string forms that REMAT_POLICY and the tools take:
 * "everything_saveable", "nothing_saveable", "dots_saveable" (alias
 * "checkpoint_dots"), "dots_with_no_batch_dims_saveable" (alias
 * "checkpoint_dots_with_no_batch_dims"), "save_only_these_names:a,b",
 * "save_any_names_but_these:a,b" (alias
 * "save_anything_except_these_names:a,b"), "save_from_both_policies:P+Q"
 * (P and Q policy strings; P ends at the first '+' that does not belong
 * to a save_from_both_policies inside it), and "auto" (per region, the
 * policy or per-tensor save set that fits the memory budget with the least
 * recompute cost; such a region's plan reports the policy
 * "auto_tensors:" and the names of the tensors it saves). JAX's
 * offload policies ("save_and_offload_only_these_names",
 * "offload_dot_with_no_batch_dims") fail with REMAT_ERR_POLICY: remat does
 * not offload to host memory. Parsing takes time linear in the length. */
REMAT_API remat_status remat_policy_parse(const char *text,
                                          remat_policy **out);
REMAT_API void remat_policy_destroy(remat_policy *policy);
/* Writes the policy's string form, which remat_policy_parse turns back
 * into the same policy; an alias is written as its canonical name (e.g.
 * checkpoint_dots as dots_saveable). A buffer shorter than the string and
 * its NUL gives REMAT_ERR_LIMIT and, when len > 0, an empty string. */
REMAT_API remat_status remat_policy_format(const remat_policy *policy,
                                           char *buf, size_t len);

/* Opens a checkpoint region; ops built until the matching remat_region_end
 * belong to it. Regions nest; the innermost policy decides inside it. NULL
 * means the graph's default policy (remat_graph_set_policy, else the
 * runtime's REMAT_POLICY). The policy is copied. */
REMAT_API remat_status remat_region_begin(remat_graph *g,
                                          const remat_policy *policy);
REMAT_API remat_status remat_region_end(remat_graph *g);
/* Names the innermost open region (e.g. "h3" for a transformer block):
 * traces and plan reports name its tensors "h3.qkv", "h3.attn_probs".
 * Names follow the rules of checkpoint names above. */
REMAT_API remat_status remat_region_name(remat_graph *g, const char *name);
/* Names an activation for the name-based policies. */
REMAT_API remat_status remat_checkpoint_name(remat_graph *g, remat_tensor *t,
                                             const char *name);

/* Per-graph settings: they override the runtime's REMAT_POLICY and
 * REMAT_MEMORY_BUDGET for g alone (other graphs on the runtime keep the
 * runtime's), so graphs with different plans share one runtime's workers.
 * They are set while building, before remat_compile, which plans with
 * them; a compiled plan is never redone, so after remat_compile they fail
 * with REMAT_ERR_STATE, naming the function and saying that the graph is
 * already compiled, and change nothing (the graph stays usable). Like
 * the builders, a failure before compile is the graph's sticky error.
 *
 * Sets g's default policy, the one its regions opened with NULL (and
 * those of the model builders) get; NULL: the runtime's again. The policy
 * is copied and may be "auto", which needs g's memory budget. */
REMAT_API remat_status remat_graph_set_policy(remat_graph *g,
                                              const remat_policy *policy);
/* remat_graph_set_memory_budget's value for "the runtime's budget". */
#define REMAT_RUNTIME_BUDGET ((int64_t)-1)
/* Sets g's memory budget in bytes, as REMAT_MEMORY_BUDGET sets the
 * runtime's: the planner fits g's plan in it (or fails with
 * REMAT_ERR_BUDGET), a step admits tasks within it, and remat_accumulate's
 * gradient sums must fit in it; as under the runtime's budget, g's regions
 * that name no policy are then planned by the budget (docs/policies.md),
 * not given the default policy. 0: none, whatever the runtime's;
 * REMAT_RUNTIME_BUDGET (the default): the runtime's. Other negative
 * values fail with REMAT_ERR_INVALID_ARG. */
REMAT_API remat_status remat_graph_set_memory_budget(remat_graph *g,
                                                     int64_t bytes);

/* ---- compile and run ---- */

typedef enum remat_optimizer_kind {
  REMAT_OPT_SGD = 0,
  REMAT_OPT_ADAMW = 1
} remat_optimizer_kind;

typedef struct remat_optimizer {
  remat_optimizer_kind kind;
  float lr;
  float beta1, beta2, eps; /* AdamW; 0 means 0.9, 0.999, 1e-8 */
  float weight_decay;      /* AdamW decoupled decay of params with ndim >= 2 */
} remat_optimizer;

/* Builds the step: autodiff from `loss` (a [1] tensor), the remat plan, the
 * task DAG and its memory plan. loss NULL compiles a forward-only graph
 * (inference: nothing is saved for a backward pass). opt NULL: no update
 * (gradients are still computed). Returns the sticky building error if any. */
REMAT_API remat_status remat_compile(remat_graph *g, const remat_tensor *loss,
                                     const remat_optimizer *opt);
REMAT_API remat_status remat_set_lr(remat_graph *g, float lr);

/* Copies `bytes` bytes into an input (exactly its size). */
REMAT_API remat_status remat_feed(remat_graph *g, const remat_tensor *input,
                                  const void *data, size_t bytes);

typedef enum remat_mem_category {
  REMAT_MEM_PARAMS = 0,
  REMAT_MEM_GRADS = 1,       /* parameter gradients */
  REMAT_MEM_OPTIMIZER = 2,   /* optimizer state */
  REMAT_MEM_ACTIVATIONS = 3, /* forward activations (saved or not yet freed) */
  REMAT_MEM_RECOMPUTED = 4,  /* activations recomputed for backward */
  REMAT_MEM_ACT_GRADS = 5,   /* gradients of activations */
  REMAT_MEM_WORKSPACE = 6,   /* scratchpads, partial sums, inputs */
  REMAT_MEM_NUM_CATEGORIES = 7
} remat_mem_category;

/* Room for the per-category arrays of remat_step_stats: a category added
 * later takes a free slot, so that no field after the arrays moves. Slots
 * from REMAT_MEM_NUM_CATEGORIES on hold 0. */
#define REMAT_MEM_CATEGORY_SLOTS 16

/* Without a memory budget, a step's peak_bytes is at most its
 * predicted_peak_bytes plus 1/REMAT_UNBUDGETED_SLACK of the predicted
 * activation peak at every thread count: a node whose allocations would
 * pass that waits until frees make room (memory admission, which a budget
 * sets to the budget instead). */
#define REMAT_UNBUDGETED_SLACK 16

/* What a step did. The struct grows at its end only: set `size` to
 * sizeof(remat_step_stats) before the call (remat_step_stats st =
 * {.size = sizeof st}), and the library writes only the fields that lie
 * whole within `size` bytes (never `size` itself), so that a program built
 * against an older header keeps working with a newer library. A size
 * smaller than this struct as of version 0.2.0 fails with
 * REMAT_ERR_INVALID_ARG before the step runs. */
typedef struct remat_step_stats {
  size_t size;                 /* set by the caller: sizeof(remat_step_stats) */
  float loss;                  /* NaN for a graph without a loss */
  int nonfinite;               /* 1 if loss or a gradient was NaN or Inf */
  double seconds;              /* wall time of the step */
  double flops;                /* model FLOPs of forward + backward */
  double recompute_flops;      /* the plan's FLOPs of recompute tasks */
  double executed_recompute_flops; /* counted by the recompute tiles run */
  int64_t peak_bytes;          /* peak of all categories together, this step */
  int64_t activation_peak_bytes; /* peak of activations, recomputed, act
                                    grads and workspace together */
  int64_t predicted_peak_bytes;  /* the planner's prediction of peak_bytes */
  int64_t peak[REMAT_MEM_CATEGORY_SLOTS]; /* per remat_mem_category */
  int64_t current[REMAT_MEM_CATEGORY_SLOTS]; /* after the step */
  int64_t tasks;               /* tasks executed */
  remat_status trace_status;   /* REMAT_OK, or why REMAT_TRACE could not be
                                  written after a step that succeeded (the
                                  step's updates are applied; the message
                                  is in remat_last_error()) */
  int64_t remote_bytes;        /* bytes the step's tiles read or write on a
                                  NUMA node other than the one they are
                                  dealt to, from the plan (0 on one node) */
  int64_t remote_bytes_unplaced; /* the same tiles with every buffer on
                                    node 0 and no parameter copies */
  double grad_norm;            /* global L2 norm of the parameter gradients
                                  (for remat_step after remat_accumulate,
                                  of their mean), before clipping; summed
                                  in a fixed order; 0 without an optimizer */
  int64_t accumulated;         /* micro-batches summed: remat_accumulate
                                  counts those since the last update, this
                                  one included; remat_step those its update
                                  averaged (1 without accumulation) */
} remat_step_stats;

/* Forward, backward and update. On REMAT_ERR_NUMERIC (NaN/Inf in the loss or
 * a gradient, or an update that would make a parameter or an AdamW moment
 * NaN or Inf, or a gradient sum of remat_accumulate overflow; the message
 * names the parameter) no parameter, moment or sum is updated. `stats` may
 * be NULL; else its `size` must be set (see remat_step_stats). */
REMAT_API remat_status remat_step(remat_graph *g, remat_step_stats *stats);
/* Gradient accumulation: forward and backward of the fed micro-batch, whose
 * parameter gradients are added to per-parameter sums (allocated at the
 * first call, counted as REMAT_MEM_GRADS), and no update. The next
 * remat_step runs one more micro-batch and updates with the mean gradient
 * of all of them, so K-1 calls of remat_accumulate and one remat_step on
 * micro-batches of b rows give, within float rounding, the update of one
 * step on the K*b rows (the loss being a mean over rows); the loss of that
 * batch is the mean of the K stats.loss. The activation peak is that of one
 * micro-batch. A micro-step that fails (REMAT_ERR_NUMERIC included) adds
 * nothing to the sums and changes no parameter; the sums are kept, so the
 * caller may go on with another micro-batch. Needs an optimizer. Under a
 * memory budget, a first call whose sums would take the predicted peak
 * over the budget fails with REMAT_ERR_BUDGET (and allocates nothing). The sums
 * are not part of a checkpoint: remat_save_checkpoint between
 * remat_accumulate and remat_step fails with REMAT_ERR_STATE (save after
 * remat_step), and a load that succeeds (remat_load_checkpoint or
 * remat_load_safetensors) discards them, so that the next update uses
 * gradients of the loaded weights only. */
REMAT_API remat_status remat_accumulate(remat_graph *g, remat_step_stats *stats);
/* Clips the gradient by its global L2 norm n (over every parameter, summed
 * in a fixed order, so the same at any thread count): when n > max_norm,
 * each update uses gradient * max_norm / (n + 1e-6). 0 turns it off (the
 * default). Needs an optimizer. */
REMAT_API remat_status remat_set_clip(remat_graph *g, float max_norm);
/* Writes a Chrome trace (Perfetto, chrome://tracing) of the next `steps`
 * runs of g (remat_step, remat_accumulate or remat_forward) to PATH, one
 * JSON document that holds the runs traced so far after each of them. For
 * this graph it takes the place of REMAT_TRACE while steps remain; 0
 * stops; more than REMAT_MAX_TRACE_STEPS fails with REMAT_ERR_LIMIT. The
 * trace has a thread per
 * worker and one "X" event per task, named by layer and tensor
 * ("h3.attn_probs recompute", "h3.ffn_in dW", with regions named by
 * remat_region_name), a "steps" thread with one event per run, and a
 * "live bytes" counter ("C") of parameters, optimizer state, gradients,
 * activations saved, activations not saved (freed in forward),
 * recomputed, activation gradients and scratch, wherever it changes.
 * The first run writes a new file beside PATH that is renamed over it
 * (over the file it points to, when PATH is a symbolic link); each later
 * run appends its events in place before the closing brackets, so a run
 * costs the same however many came before it. PATH holds a whole trace
 * whenever no run is being written, and a write that fails leaves the
 * previous one; a file changed by someone else between two runs is not
 * appended to (the step's trace_status says so). PATH must be a
 * regular file or a new name in a directory where a file can be created
 * (REMAT_ERR_IO); nothing is written there before the first traced run.
 * Names are written as JSON strings, bytes that are not UTF-8 as \xNN. A
 * trace that cannot be written after a step does not fail the step: see
 * remat_step_stats.trace_status. */
#define REMAT_MAX_TRACE_STEPS 10000
REMAT_API remat_status remat_trace_steps(remat_graph *g, const char *path,
                                         int steps);
/* Forward only (for serving): no backward, no update. */
REMAT_API remat_status remat_forward(remat_graph *g, remat_step_stats *stats);

/* Asks the runs of g to stop; thread-safe, from any thread (a progress
 * callback, a signal-handling thread, a server's connection thread), while
 * g is running or idle, but not after remat_graph_destroy(g) began. It
 * sets g's cancel flag, which stays set until remat_uncancel(g): a
 * remat_step, remat_accumulate or remat_forward that is running on g stops
 * at its next task boundary and returns REMAT_ERR_CANCELLED, and every
 * later one returns REMAT_ERR_CANCELLED at once, without running a task.
 * Like every failed run, a cancelled one changes no parameter, AdamW
 * moment, gradient sum or counter, so after remat_uncancel the same call
 * on the same feeds gives bitwise what it would have given without the
 * cancel. A step or micro-step that has passed its update gate (every
 * gradient computed and checked) applies its update whole and returns
 * REMAT_OK: the flag stays set for the next call. Feeds, reads, writes
 * and checkpoints ignore the flag. Returns REMAT_ERR_INVALID_ARG for a
 * NULL g, else REMAT_OK. */
REMAT_API remat_status remat_cancel(remat_graph *g);
/* Clears g's cancel flag (a no-op when it is not set): the next run of g
 * runs. Thread-safe like remat_cancel. A remat_cancel that races with it
 * may land on either side. */
REMAT_API remat_status remat_uncancel(remat_graph *g);
/* Whether g's cancel flag is set (0 or 1; 0 for a NULL g). */
REMAT_API int remat_cancelled(const remat_graph *g);

/* How urgent a graph's runs are when several share the runtime's
 * workers (remat_graph_priority). */
typedef enum remat_priority {
  REMAT_PRIORITY_NORMAL = 0,      /* the default */
  REMAT_PRIORITY_INTERACTIVE = 1, /* serving: before every other class */
  REMAT_PRIORITY_BATCH = 2        /* after every other class */
} remat_priority;
/* Sets the class of g's runs (remat_step, remat_accumulate,
 * remat_forward); thread-safe, from any thread, taking effect at g's next
 * run. Runs of different classes are in progress at once on the
 * runtime's workers: at every task boundary a worker takes a ready task
 * of the most urgent class that has one (INTERACTIVE, then NORMAL, then
 * BATCH), so a forward of an INTERACTIVE graph waits at most for the
 * tasks already running, not for a training step to end. Runs of one
 * class go one at a time, first come first served. A BATCH run only gets
 * the workers the others leave idle. Results do not depend on the class
 * or on what else runs. A value outside the enum: REMAT_ERR_INVALID_ARG. */
REMAT_API remat_status remat_graph_priority(remat_graph *g,
                                            remat_priority priority);

/* A progress callback: `fraction` is the part of the run's tasks finished
 * so far, 0 to 1. */
typedef void (*remat_progress_fn)(void *user, double fraction);
/* Calls fn(user, fraction) during each remat_step, remat_accumulate and
 * remat_forward of g, first min_interval_ms after the run starts and then
 * min_interval_ms after the previous call returned, at the earliest
 * (1 to 3600000 ms, else REMAT_ERR_INVALID_ARG),
 * on a thread of g's own that is neither a worker nor the caller's, and
 * holding no lock of the scheduler or of g: fn may call remat_cancel(g)
 * (a server cancels a request whose client went away) or block, which
 * delays the end of g's run but no other graph's. A run shorter than the
 * interval gets no call. When the run's call returns, no call for it is in
 * progress or will come, so `user` may then be freed. fn must not call a
 * function that enters g (a step, a feed, a read: REMAT_ERR_STATE) or
 * destroy g. fn NULL removes the callback and its thread; setting another
 * replaces it. Not while another thread is inside g (REMAT_ERR_STATE);
 * allowed before compile. remat_graph_destroy stops the thread. */
REMAT_API remat_status remat_set_progress(remat_graph *g, remat_progress_fn fn,
                                          void *user, int min_interval_ms);

/* Copies a parameter, input, the loss or a kept tensor out (exactly its
 * size in bytes). */
REMAT_API remat_status remat_read(remat_graph *g, const remat_tensor *t,
                                  void *dst, size_t bytes);
/* Copies a parameter's gradient from the last step. */
REMAT_API remat_status remat_read_grad(remat_graph *g,
                                       const remat_tensor *param, float *dst,
                                       size_t bytes);
/* Overwrites a parameter's values (after compile). */
REMAT_API remat_status remat_write(remat_graph *g, const remat_tensor *param,
                                   const float *src, size_t bytes);
/* Parameters in creation order, for saving and loading. */
REMAT_API int remat_num_params(const remat_graph *g);
REMAT_API remat_tensor *remat_param_at(const remat_graph *g, int i);

/* Copies the values of every parameter of src into the parameter of dst
 * with the same position (for a server whose inference graph serves the
 * weights that a training graph learns). Both graphs must be compiled and
 * have the same parameters in the same creation order: the same names,
 * dtypes and shapes (else REMAT_ERR_SHAPE, naming the first parameter that
 * differs). Only parameter values are copied: dst's optimizer moments,
 * step count and learning rate stay as they are. While another thread is
 * inside either graph (a step, a forward, a save), the call fails with
 * REMAT_ERR_STATE, as any call on a busy graph does; call it between the
 * steps. On any failure nothing in dst has changed. */
REMAT_API remat_status remat_copy_params(remat_graph *dst, remat_graph *src);

/* Every tensor of the graph (inputs, parameters, op results) in creation
 * order. */
REMAT_API int remat_num_tensors(const remat_graph *g);
REMAT_API remat_tensor *remat_tensor_at(const remat_graph *g, int i);

/* Why a region got the policy it has. */
typedef enum remat_policy_source {
  REMAT_POLICY_NONE = 0,    /* the tensor is outside every region */
  REMAT_POLICY_OWN = 1,     /* the policy given to remat_region_begin */
  REMAT_POLICY_DEFAULT = 2, /* the graph's default (remat_graph_set_policy,
                               else the runtime's REMAT_POLICY) */
  REMAT_POLICY_BUDGET = 3   /* chosen by the planner under the memory budget */
} remat_policy_source;

/* What the compiled plan decided for one tensor. */
typedef struct remat_tensor_plan {
  int saved;      /* 1: kept from forward to backward (inputs, parameters,
                     tensors outside regions, region inputs and outputs,
                     and what the deciding region's policy saves; 0 for
                     a linear's output that a fused kernel never stores,
                     see docs/performance.md) */
  int recomputed; /* 1: freed after forward and recomputed for backward */
  int region;     /* the region whose policy decided (regions are numbered
                     by remat_region_begin in call order from 0), -1 none */
  const char *policy; /* that region's policy in its string form ("" when
                         none); valid while the graph lives */
  remat_policy_source source;
} remat_tensor_plan;

/* The plan's decision for tensor t of a compiled graph. Under a memory
 * budget a graph is planned again after its first three steps, with the
 * kernel times they measured (docs/policies.md): from then on this is the
 * new plan's decision. Like other calls on g, not while another thread is
 * inside g (REMAT_ERR_STATE). */
REMAT_API remat_status remat_tensor_plan_of(const remat_graph *g,
                                            const remat_tensor *t,
                                            remat_tensor_plan *out);

/* ---- saving and loading parameters (safetensors) ---- */

/* Writes every parameter, by name in creation order, as an F32 tensor of a
 * safetensors file (the format PyTorch's `safetensors` package reads). The
 * graph must be compiled, and its parameter names unique and not
 * "__metadata__" (else REMAT_ERR_INVALID_ARG, before anything is written).
 * PATH must be a regular file or a new name: a directory, device, FIFO or
 * symbolic link is refused with REMAT_ERR_IO. The data goes to a new file
 * with a unique name beside PATH (created exclusively, mode 0644 less the
 * umask), is synced, and is renamed over PATH, whose directory is then
 * synced; on any failure that file is removed. So PATH holds either its
 * old contents or the whole new file, even after a crash or with other
 * processes saving to it at the same time, and no link planted nearby is
 * followed. */
REMAT_API remat_status remat_save_safetensors(remat_graph *g, const char *path);
/* Reads parameters written by remat_save_safetensors, or by any program
 * that writes tensors with the same names and shapes in dtype F32, BF16 or
 * F16 (the safetensors files Hugging Face publishes; a file may mix them).
 * Each value is converted exactly to f32 for the parameter's f32 storage;
 * a frozen parameter stored in bf16 (see remat_param_freeze) takes a BF16
 * tensor's bits as they are and rounds the others. Any other dtype is
 * refused (REMAT_ERR_SHAPE, naming the tensor, its dtype and the accepted
 * ones), as is a byte count that is not the shape's element count times
 * the dtype's size. PATH must be a regular file. The header (at most 100
 * MiB) is checked against the file's size and the model before any tensor
 * data is read, and all the data is read before any parameter changes, so
 * a load costs the header plus at most the model's size as F32 in memory
 * whatever the file's size. A truncated file, a bad or oversized header, a
 * missing, unknown or repeated tensor, a shape mismatch, data offsets that
 * are not whole numbers, out of range or overlapping, or a value that is
 * NaN or Inf (F16 and BF16 Inf and NaN too; or, in a checkpoint, a
 * negative AdamW second moment), named with its tensor, fail with
 * REMAT_ERR_IO or REMAT_ERR_SHAPE and leave every parameter as it was.
 *
 * A PATH ending in ".json" is a sharded checkpoint's index
 * (model.safetensors.index.json: a JSON object of at most 16 MiB whose
 * "weight_map" maps each tensor name to the file name of its shard, in the
 * index's directory). Every shard it names is checked as above, and
 * against the map, before any is read, and the shards load as one: all or
 * nothing. A tensor named twice in the map, a shard name that is empty,
 * "." or "..", or holds a '/' (no path leaves the directory), a shard that
 * cannot be opened, a tensor that its shard does not hold, and a shard
 * tensor that the map does not name or puts in another shard each fail
 * with REMAT_ERR_IO naming it; a model tensor that the map lacks fails
 * with REMAT_ERR_SHAPE. Every shard stays open during the load.
 *
 * The LoRA adapters of a graph (remat_lora.h) may be absent from the file
 * or the index (a base model's weights): those keep their values. */
REMAT_API remat_status remat_load_safetensors(remat_graph *g, const char *path);
/* The same as remat_save_safetensors, with every tensor written as BF16
 * (each value rounded to the nearest bf16, ties to even; a frozen
 * parameter stored in bf16 as it is): half the bytes, as most published
 * checkpoints are. remat_load_safetensors reads it back (into f32
 * storage, the bf16 values exactly). */
REMAT_API remat_status remat_save_safetensors_bf16(remat_graph *g,
                                                   const char *path);
/* Writes the gradients of the last step, one F32 tensor per trainable
 * parameter (a frozen one has none) under the parameter's name, in the same format and the same way as
 * remat_save_safetensors (for checking gradients against another
 * framework). */
REMAT_API remat_status remat_save_grads_safetensors(remat_graph *g,
                                                    const char *path);

/* ---- training checkpoints: resuming exactly ---- */

/* The most updates a graph counts: 2^53 (exact in a double). A checkpoint
 * whose "remat.step" is larger is refused, and a step, or a forward run,
 * of a graph at the limit fails with REMAT_ERR_LIMIT, so every checkpoint
 * saved can be loaded and no counter overflows. */
#define REMAT_MAX_STEPS (INT64_C(1) << 53)

/* The most caller values a checkpoint holds. */
#define REMAT_CHECKPOINT_MAX_VALUES 64

/* Writes a training checkpoint, a safetensors file that
 * remat_load_checkpoint turns back into the same training state: every
 * parameter under its name (as remat_save_safetensors writes it), AdamW's
 * moments of parameter P as "adam_m:P" and "adam_v:P", and in
 * __metadata__ "remat.checkpoint", "remat.optimizer" ("adamw", "sgd" or
 * "none"), "remat.step" (the optimizer steps taken, AdamW's bias
 * correction) and the caller's `count` values (0 to
 * REMAT_CHECKPOINT_MAX_VALUES: a schedule position, a data position, an
 * RNG state) under keys[i]: 1 to 63 letters, digits, '_', '.' or '-',
 * unique, and not "format", "producer" or "remat.*". Values are written as
 * decimal strings. The file is written like remat_save_safetensors writes
 * (PATH holds its old contents or the whole new file, never a part), with
 * the same checks. */
REMAT_API remat_status remat_save_checkpoint(remat_graph *g, const char *path,
                                             const char *const *keys,
                                             const uint64_t *values,
                                             int count);
/* Restores a checkpoint into a graph built and compiled like the one that
 * saved it (the same parameters and optimizer kind) and sets values[i] to
 * the value saved under keys[i]. Every check is made before anything
 * changes (those of remat_load_safetensors, then: a checkpoint's metadata,
 * the optimizer kind, every moment present, every key present and a whole
 * number), so a failed load leaves the parameters, the moments, the step
 * count and `values` as they were. remat_load_safetensors takes the
 * weights alone from a checkpoint (for evaluation or fine-tuning). */
REMAT_API remat_status remat_load_checkpoint(remat_graph *g, const char *path,
                                             const char *const *keys,
                                             uint64_t *values, int count);
/* Reads the caller values of the checkpoint (or any safetensors file) at
 * PATH without a graph, for what a program must know before it builds
 * one (the model's shape, say): found[i] is set to 1 and values[i] to the
 * value saved under keys[i] (keys as remat_save_checkpoint takes them),
 * or found[i] to 0 and values[i] left alone when the file has no such
 * key (a file written before the key existed). The header is checked as
 * remat_load_safetensors checks it; a header that is not one, or a value
 * present but not a whole number (REMAT_ERR_IO, naming the key), fails
 * and leaves `values` and `found` as they were. Reads no tensor data. */
REMAT_API remat_status remat_checkpoint_values(const char *path,
                                               const char *const *keys,
                                               uint64_t *values, int *found,
                                               int count);

#ifdef __cplusplus
}
#endif

#endif
