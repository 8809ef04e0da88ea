/* Internal types shared by the files of runtime/: the runtime, the graph IR,
 * the compiled step (buffers, kernel nodes, task arguments) and memory. */
#ifndef REMAT_RUNTIME_INTERNAL_H
#define REMAT_RUNTIME_INTERNAL_H

#include <hwloc.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <sys/types.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/name_index.h"
#include "ops/op.h"
#include "remat.h"
#include "runtime/compile/costs.h"
#include "sched/sched.h"

#define REMAT__MAX_TENSORS (1 << 20)
#define REMAT__NAME_MAX 64
#define REMAT__MAX_NUMEL (INT64_C(1) << 34) /* elements of one tensor */

/* ---- config.c ---- */
/* Copies of the strings a configuration points to. */
typedef struct config_strings {
  char policy[REMAT_MAX_POLICY_LENGTH + 1];
  char trace[4096];
  char topology[4096];
} config_strings;

/* Reads the REMAT_* environment and overlays the set fields of `code`; the
 * strings of `out` point into `strings`. default_threads 0 leaves
 * num_threads 0 when neither sets it (the caller then uses the physical
 * cores). */
remat_status remat__config_load(const remat_config *code, int default_threads,
                                remat_config *out, config_strings *strings);

/* ---- memory.c: per-NUMA-node arenas with byte accounting ---- */
/* A block's home: a NUMA node (0..nnodes-1, the pool's node indices) or a
 * slice layout (nnodes and up, see mem_arena_layout): a block whose bytes
 * lie on several nodes, each in its own slice. A node home's freed bytes
 * serve blocks of any size of that home; a layout home's freed blocks are
 * reused for the same size only. */
typedef struct mem_block mem_block;
typedef struct node_cache node_cache;
typedef struct mem_arena {
  pthread_mutex_t lock;
  hwloc_topology_t topo;
  int nnodes;
  bool bind;               /* a machine of several real nodes: blocks are
                              bound to their home's nodes */
  hwloc_bitmap_t *nodeset; /* [nnodes] when binding: each node's memory */
  int nhomes, cap_homes;
  node_cache *caches;      /* [nhomes]: freed blocks kept for reuse, by size */
  size_t *layout_bytes;    /* [nhomes]: bytes of a layout home (0: a node) */
  int64_t *layout_ends;    /* [nhomes * nnodes]: end of each node's slice */
  _Atomic int64_t current[REMAT_MEM_NUM_CATEGORIES];
  _Atomic int64_t peak[REMAT_MEM_NUM_CATEGORIES];
  _Atomic int64_t total_current, total_peak;
  _Atomic int64_t transient_current, transient_peak;
} mem_arena;

/* An arena with a home per node of the pool's placement; it binds only on
 * a topology of several nodes that is this machine's (not synthetic, not
 * XML). */
remat_status mem_arena_init(mem_arena *a, hwloc_topology_t topo,
                            const sched_placement *pl);
void mem_arena_destroy(mem_arena *a);
/* The home of blocks of `bytes` bytes whose slice on node k ends at byte
 * ends[k] (slice k starts where slice k - 1 ends, slice 0 at 0): an
 * existing home when one matches, -1 when out of memory. When binding,
 * each slice is bound to its node in whole pages (a page across a slice
 * boundary goes to the later node). */
int mem_arena_layout(mem_arena *a, size_t bytes, const int64_t *ends);
/* The bytes the arena takes and counts for a block of `bytes` bytes:
 * rounded up to 64, and 64 for 0 bytes, since a free block holds the link
 * of its size's list. The plan's predicted peak counts with it too, so that
 * it agrees with the measured one. */
static inline int64_t mem_block_bytes(int64_t bytes) {
  return remat__round64(bytes > 0 ? bytes : 1);
}
/* 64-byte aligned, from `home` (out-of-range homes mean node 0). Returns
 * NULL when out of memory. `transient` memory (allocated and freed within
 * a step) is also counted in the activation peak. */
void *mem_alloc(mem_arena *a, size_t bytes, remat_mem_category cat, int home,
                bool transient);
void mem_free(mem_arena *a, void *p, size_t bytes, remat_mem_category cat,
              int home, bool transient);
/* Expects `blocks` more blocks of `bytes` bytes to be live at once in
 * `home`, on top of the blocks of that size live there now (the persistent
 * ones: run it after persistent allocation). */
remat_status mem_expect(mem_arena *a, size_t bytes, int64_t blocks, int home);
/* Takes from the system what the expected or highest use needs; run before
 * a step, outside the step's tasks (so mem_reserve is not thread-safe
 * against mem_alloc on the same arena). */
remat_status mem_reserve(mem_arena *a);
/* Starts a new peak window: peaks become the current values. */
void mem_reset_peaks(mem_arena *a);
/* The regions node home `home` carves its blocks from: how many, in
 * *bytes their size in all (address space), and in *resident the bytes of
 * their pages touched and not released since (those the process holds). */
int mem_home_regions(mem_arena *a, int home, size_t *bytes,
                     size_t *resident);

/* ---- the runtime ---- */
struct remat_runtime {
  _Atomic int refs; /* the program's, plus one per graph */
  remat_config config;
  config_strings strings; /* what config's strings point to */
  hwloc_topology_t topo;
  sched_pool *pool;
  dnnl_engine_t engine;
  op_worker *workers; /* [nworkers]: stream per worker */
  int nworkers;
  pid_t pid;          /* the process that created it: threads do not
                         survive fork() */
  bool no_admission;  /* REMAT_BENCH_NO_ADMISSION was set at creation: runs
                         under a budget without memory admission (for
                         benchmarks that measure its cost; not public) */
  bool no_fuse;       /* REMAT_FUSE=0 at creation: no fused epilogues */
  bool fuse_bf16;     /* REMAT_FUSE=bf16: bf16 residual adds fuse too */
  cost_table costs;   /* measured kernel times: the first steps of each
                         graph fill it, compiles read it (costs.h) */
  bool roofline_costs; /* REMAT_BENCH_ROOFLINE_COSTS was set at creation:
                          the planner costs recompute by the roofline alone
                          and steps measure nothing (for benchmarks that
                          compare the FLOP-minimizing plan; not public) */
  bool no_replan;     /* REMAT_BENCH_NO_REPLAN was set at creation: a graph
                         keeps the plan of its compile after its first
                         steps measured its kernels (replan.h; for
                         benchmarks that compare; not public) */
  bool per_region;    /* REMAT_BENCH_PER_REGION was set at creation: under
                         a budget the planner chooses per region among the
                         four built-in policies only, no per-tensor save
                         sets (for benchmarks that compare; not public) */
  bool split_update;  /* REMAT_BENCH_SPLIT_UPDATE was set at creation: the
                         update, the bf16 weight refresh and the node
                         copies as separate passes over each tile (the
                         same results; for benchmarks and tests of the
                         one-pass update; not public) */
};

/* runtime.c: graphs keep their runtime alive. */
void runtime_retain(remat_runtime *rt);
void runtime_release(remat_runtime *rt);
/* REMAT_ERR_STATE (message names `what`) in a child forked after the
 * runtime was created, whose worker threads do not exist. */
remat_status runtime_check_fork(const remat_runtime *rt, const char *what);

/* ---- graph IR ---- */
typedef enum tensor_kind { TENSOR_INPUT, TENSOR_PARAM, TENSOR_ACT } tensor_kind;

struct remat_tensor {
  remat_graph *graph;
  int32_t id;
  tensor_kind kind;
  op_shape shape;
  op_dtype dtype;   /* as the API sees it: f32 or int32 */
  op_dtype store;   /* its buffers' element type (tensor_store_bytes): bf16
                       for float inputs and activations in bf16 precision
                       (graph_store_dtype), and for a frozen parameter that
                       every op reads in bf16 (graph_param_store), else
                       dtype */
  int32_t producer; /* op index, -1 for inputs and params */
  int32_t region;   /* innermost region at creation, -1 none */
  char name[REMAT__NAME_MAX];
  remat_init init;
  float init_scale;
  bool keep;  /* readable after a step */
  bool named; /* carries a checkpoint name */
  bool frozen; /* a parameter that is never trained (remat_param_freeze) */
};

typedef struct graph_op {
  op_desc desc;
  int32_t in[OP_MAX_IN];
  int32_t out;
  int32_t region;
  op_instance inst;
  bool planned;
  /* plan_fusions: the linear whose fused kernel (inst.fused of that op)
   * can compute this op's output, -1 none; fused_in: which input of this
   * op is that linear's output */
  int32_t fused_from;
  int fused_in;
} graph_op;

/* A LoRA adapter on a linear (lora.c): tensor ids of the base weight w
 * and of the adapters A [rank,in] and B [out,rank]. */
typedef struct graph_lora {
  int32_t w, a, b;
  int rank;
  float alpha;
  bool conv1d; /* Hugging Face stores the module as a Conv1D (GPT-2) */
  char module[REMAT__NAME_MAX];
} graph_lora;

struct graph_step;      /* exec/step_state.h */
struct remat_policy;    /* policy.c */

#define REMAT__MAX_REGION_DEPTH 32

typedef struct graph_region {
  int32_t parent;               /* enclosing region, -1 for a top-level one */
  int32_t top;                  /* the top-level region it lies in */
  struct remat_policy *policy;  /* owned copy; NULL: the runtime's default */
  char name[REMAT__NAME_MAX];   /* remat_region_name, "" none */
} graph_region;

struct remat_graph {
  remat_runtime *rt;
  remat_status status;
  char error[REMAT__ERRMSG_MAX];      /* the sticky building error */
  char call_error[REMAT__ERRMSG_MAX]; /* the last call inside g that failed
                                         (graph_leave), "" after one that
                                         did not */
  unsigned long enter_fails;          /* remat__fail_count() at graph_enter */
  uint64_t seed;
  remat_tensor **tensors;
  int32_t ntensors, cap_tensors;
  int32_t *params;                    /* tensor ids of the parameters, in
                                         order of creation */
  int32_t nparams, cap_params;
  name_index param_names;             /* parameter name -> tensor id */
  graph_op *ops;
  int32_t nops, cap_ops;
  int32_t ndropout;                   /* dropout sites so far: each op that
                                         drops gets the next as its
                                         op_attrs.rng_stream */
  graph_region *regions;
  int32_t nregions, cap_regions;
  int32_t region_stack[REMAT__MAX_REGION_DEPTH];
  int region_depth;
  bool compiled;
  _Atomic int busy; /* a call that uses the compiled step is running */
  _Atomic uintptr_t owner; /* the thread inside (graph_check.c) */
  int depth;               /* its nested calls */
  struct graph_step *step; /* the compiled step and its state */
  struct dp_graph *dp;     /* data parallel (mpi_dp.c), NULL when not */
  _Atomic int cancel;      /* remat_cancel: set until remat_uncancel */
  _Atomic int priority;    /* remat_graph_priority: a remat_priority */
  struct graph_progress *progress; /* remat_set_progress, NULL when none */
  graph_lora *lora;        /* the LoRA adapters (lora.c), [nlora] */
  int32_t nlora, cap_lora;
  char *policy;            /* remat_graph_set_policy's, in its string form;
                              NULL: the runtime's (settings.c) */
  bool own_budget;         /* remat_graph_set_memory_budget set budget */
  int64_t budget;          /* bytes, 0: none; read only when own_budget */
};

/* settings.c: what g's compile plans with: its default policy (of regions
 * that name none) in string form, its memory budget (0: none), and words
 * that say where that budget is set, for messages. */
const char *graph_default_policy(const remat_graph *g);
int64_t graph_memory_budget(const remat_graph *g);
const char *graph_budget_origin(const remat_graph *g);

/* graph_check.c: records the first error on the graph (sticky) and in
 * the thread's last error; returns the status. */
remat_status graph_fail(remat_graph *g, remat_status status, const char *fmt,
                        ...) __attribute__((format(printf, 3, 4)));
/* Checks a tensor handle passed to a graph call. */
bool graph_tensor_ok(remat_graph *g, const remat_tensor *t, const char *what);
/* graph_check.c: a call that uses g's compiled step (a step, a feed, a
 * read, a save...) enters first and leaves after; a second caller on
 * another thread gets REMAT_ERR_STATE instead of a data race. The thread
 * inside may enter again (a save reads through remat_read). The outermost
 * leave keeps in g->call_error the words of a failure recorded on the
 * thread since its enter, or empties it when there was none. */
remat_status graph_enter(remat_graph *g, const char *what);
void graph_leave(remat_graph *g);
/* Waits until no call is inside g, then keeps others out (destroy). */
void graph_enter_wait(remat_graph *g);
/* graph.c: adds an op of `type` on `in` (builders.c's one entry point). */
/* The first field of a RoPE scaling out of its range, as a message part
 * ("factor (expected ...)"), or NULL when it is valid or factor is 0
 * (builders.c). */
const char *remat__rope_scaling_flaw(const remat_rope_scaling *s);
remat_tensor *graph_add_op(remat_graph *g, op_type type,
                           const remat_tensor *const *in,
                           int nin, const op_attrs *attrs);
/* storage.c: bytes of a tensor as the API reads, writes and feeds it (4
 * per element). */
int64_t tensor_bytes(const remat_tensor *t);
/* Bytes of its value buffer (and of a recomputed copy): 2 per element in
 * bf16 storage. */
int64_t tensor_store_bytes(const remat_tensor *t);
/* The element type of a new tensor's buffers: float inputs and op results
 * are bf16 in bf16 precision, except [1] scalars (losses); parameters are
 * f32 master weights. */
op_dtype graph_store_dtype(const remat_graph *g, bool param, op_dtype dtype,
                           const op_shape *shape);
/* The element type op `type` reads its input i in when that input is a
 * parameter of `shape`: f32 where the op keeps f32 (op_input_keeps_f32),
 * else the activations' type. */
op_dtype graph_param_read_dtype(const remat_graph *g, op_type type, int i,
                                const op_shape *shape);
/* The storage type of parameter t as the ops added so far read it: a
 * frozen parameter is never updated, so in bf16 precision it is stored
 * once, in bf16, when every op reads it in bf16 (and needs no f32 master);
 * every other parameter is an f32 master. */
op_dtype graph_param_store(const remat_graph *g, const remat_tensor *t);

#endif
