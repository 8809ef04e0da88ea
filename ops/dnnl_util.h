/* Internal helpers of ops/: the common head of every op's private state,
 * oneDNN primitive creation on one thread with a user-mode scratchpad,
 * tile execution with the worker's stream and scratchpad, strided matmul
 * tiles (op_gemm), tiling rules and small shared utilities. */
#ifndef REMAT_OPS_DNNL_UTIL_H
#define REMAT_OPS_DNNL_UTIL_H

#include "ops/op.h"

/* Elements a row-blocked tile of a memory-bound op aims at. */
#define OP_TILE_ELEMS 16384
/* Elements of a tile of a flat elementwise op (add, relu, gelu, sum). */
#define OP_FLAT_ELEMS 65536
/* Rows of a matmul row tile (grown for small products, see op_gemm_rows). */
#define OP_GEMM_ROWS 128
/* Columns of a column-block reduction tile (bias and embedding grads). */
#define OP_COL_BLOCK 256

/* The head of every op's state: the primitives it owns (released together)
 * and where the op's own temporary lies in the worker's scratch buffer:
 * oneDNN's scratchpad comes first, the op's temporary at temp_offset. */
typedef struct op_base {
  dnnl_engine_t engine;
  const char *name;
  dnnl_primitive_t *prims;
  int nprims, cap;
  size_t dnnl_scratch; /* largest oneDNN scratchpad of the op */
  size_t temp_bytes;   /* the op's own per-tile temporary */
} op_base;

typedef struct op_arg {
  int arg; /* DNNL_ARG_* */
  const void *ptr;
} op_arg;

/* Allocates a zeroed state of `bytes` whose first member is an op_base. */
void *op_state_new(size_t bytes, dnnl_engine_t engine, const char *name);
void op_state_free(void *state);

/* Creates the primitive of `op_desc` (NULL attr: default) with a user-mode
 * scratchpad, records it in `base` and returns it in *prim (and its primitive
 * descriptor in *pd_out if not NULL; the caller destroys it). */
remat_status op_prim_create(op_base *base, const_dnnl_op_desc_t op_desc,
                            dnnl_primitive_attr_t attr,
                            const_dnnl_primitive_desc_t hint,
                            dnnl_primitive_t *prim,
                            dnnl_primitive_desc_t *pd_out,
                            char err[OP_ERRMSG_MAX]);
/* A oneDNN status as a remat status, with the message when it failed. */
remat_status op_dnnl_fail(dnnl_status_t st, const char *name,
                          const char *what, char err[OP_ERRMSG_MAX]);

/* Runs `prim` on the worker's stream with memory objects made around the
 * given pointers and the worker's scratchpad. Returns a remat status. */
int op_exec(dnnl_primitive_t prim, op_worker *w, int nargs,
            const op_arg *args);

/* The op's temporary in the worker's scratch buffer: after oneDNN's
 * scratchpad rounded up to 64 bytes, as op_base_finish sizes it, so the
 * temporary starts on a 64-byte line (the buffer itself does). */
static inline float *op_temp(const op_base *base, op_worker *w) {
  return (float *)((char *)w->scratch +
                   (base->dnnl_scratch + 63) / 64 * 64);
}
/* Fills inst->scratch_bytes from the base (call at the end of planning). */
void op_base_finish(const op_base *base, op_instance *inst);

/* oneDNN's data type of an op dtype. */
dnnl_data_type_t op_dnnl_dt(op_dtype t);
/* A plain memory descriptor with explicit strides (in elements), of f32
 * (op_md, op_md2) or of dtype t (op_md_dt, op_md2_dt). */
dnnl_memory_desc_t op_md(int ndims, const int64_t *dims,
                         const int64_t *strides);
dnnl_memory_desc_t op_md_dt(int ndims, const int64_t *dims,
                            const int64_t *strides, op_dtype t);
dnnl_memory_desc_t op_md2(int64_t rows, int64_t cols, int64_t row_stride,
                          int64_t col_stride);
dnnl_memory_desc_t op_md2_dt(int64_t rows, int64_t cols, int64_t row_stride,
                             int64_t col_stride, op_dtype t);
/* p advanced by `elems` elements of dtype t. */
static inline void *op_at(const void *p, int64_t elems, op_dtype t) {
  return (char *)p + elems * op_dtype_size(t);
}

/* Row tiles: blocks of `block` rows, the last one possibly shorter. */
static inline int64_t op_div_up(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
static inline int64_t op_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t op_max64(int64_t a, int64_t b) { return a > b ? a : b; }
/* Rows per tile for a memory-bound op over rows of `cols` elements. */
int64_t op_row_block(int64_t cols);
/* Product of all dims but the last (1 for ndim 1). */
int64_t op_rows(const op_shape *s);

/* One strided matmul C[m,n] (+)= alpha * A[m,k] . B[k,n] (+ bias[n]),
 * cut into bm x bn blocks; each block is one oneDNN call that reduces over
 * all of k. Strides are in elements. Primitives for full and remainder
 * blocks, overwriting and accumulating, are made at plan time. */
typedef struct op_gemm {
  int64_t m, n, k, bm, bn;
  int64_t a_rs, a_cs, b_rs, b_cs, c_rs, c_cs;
  float alpha;
  bool bias;
  /* Element types of A, B, C and the bias (op_gemm_init: all f32). bf16
   * A and B accumulate in f32 inside oneDNN; C may be f32 or bf16. */
  op_dtype a_dt, b_dt, c_dt, bias_dt;
  bool accumulate_too; /* also make the accumulating primitives */
  /* Fused epilogue (oneDNN post-ops, applied in f32 before C is written):
   * post_eltwise, when not dnnl_alg_kind_undef, maps each element (GELU);
   * post_add adds a matrix R laid out as C (R of dtype add_dt). */
  dnnl_alg_kind_t post_eltwise;
  bool post_add;
  op_dtype add_dt;
  dnnl_primitive_t prim[2][2][2]; /* [m remainder][n remainder][accum] */
} op_gemm;

/* How an operand matrix lies in memory, in the names the math uses:
 * op_plain(ld) is the matrix itself, row-major with leading dimension ld
 * (element (i, j) at i * ld + j); op_transposed(ld) is the transpose of a
 * row-major matrix with leading dimension ld (element (i, j) at
 * j * ld + i), as in A^T. */
typedef struct op_layout {
  bool transposed;
  int64_t ld;
} op_layout;
static inline op_layout op_plain(int64_t ld) {
  return (op_layout){false, ld};
}
static inline op_layout op_transposed(int64_t ld) {
  return (op_layout){true, ld};
}

/* Sizes and blocks; the layouts default to plain A[m,k], B[k,n], C[m,n]. */
void op_gemm_init(op_gemm *g, int64_t m, int64_t n, int64_t k, int64_t bm,
                  int64_t bn);
/* C = A . B with A and B laid out as named; C is plain with leading
 * dimension c_ld. */
void op_gemm_layout(op_gemm *g, op_layout a, op_layout b, int64_t c_ld);
remat_status op_gemm_plan(op_gemm *g, op_base *base,
                          char err[OP_ERRMSG_MAX]);
int64_t op_gemm_tiles(const op_gemm *g);
/* Sets the element types (before op_gemm_plan). */
void op_gemm_dtypes(op_gemm *g, op_dtype a, op_dtype b, op_dtype c);
/* Runs block `tile` (row-major over the blocks) of the gemm whose matrices
 * start at a, b, c (bias may be NULL when the gemm has none), each of its
 * dtype. */
int op_gemm_run(const op_gemm *g, int64_t tile, const void *a,
                const void *b, const void *bias, void *c, bool accumulate,
                op_worker *w);
/* op_gemm_run of a gemm with post_add: C = A . B (+ bias) (then the
 * eltwise) + R, with R starting at add (laid out as C). */
int op_gemm_run_add(const op_gemm *g, int64_t tile, const void *a,
                    const void *b, const void *bias, const void *add,
                    void *c, op_worker *w);
/* op_gemm_run without a bias, with A given at the first row of block
 * `tile`'s rows (a copy of those rows made by the caller, laid out as the
 * gemm's A). */
int op_gemm_run_block_a(const op_gemm *g, int64_t tile, const void *a_block,
                        const void *b, void *c, bool accumulate,
                        op_worker *w);
/* Rows per tile of a matmul with n output columns and reduction k: 128,
 * doubled while a tile would be under ~0.5 MFLOP. */
int64_t op_gemm_rows(int64_t n, int64_t k);

/* Weight gradients reduce over every row in fixed chunks of rows: each
 * chunk's partial sum is computed where the chunk's rows are, then the
 * partials are added in chunk order. Chunks have about OP_DW_CHUNK_MIN
 * rows or more (a multiple of 64), there are at most OP_DW_CHUNKS of them,
 * and their partials take at most OP_DW_PARTIAL_BYTES (one chunk, no
 * partials, past that): a function of the shapes only, so the order of
 * the sum never depends on the thread count or the machine. */
#define OP_DW_CHUNK_MIN 512
#define OP_DW_CHUNKS 8
#define OP_DW_PARTIAL_BYTES (INT64_C(64) << 20)
/* Rows per chunk for a gradient of grad_elems elements summed over rows. */
int64_t op_dw_chunk_rows(int64_t rows, int64_t grad_elems);
/* dst[0..len) = (or +=) part[0..len) + part[stride..] + ... over nparts
 * partials, added in partial order. */
void op_sum_partials(const float *part, int64_t stride, int64_t nparts,
                     int64_t len, float *dst, bool accumulate);

/* dst = src, or dst += src, over n floats. */
void op_store(float *restrict dst, const float *restrict src, int64_t n,
              bool accumulate);
/* dst[at..at+n) (elements of dtype t) = (or +=) v[0..n): op_store for f32,
 * rounded once to bf16 (the sum formed in f32) for bf16. */
void op_store_dt(float *dst, op_dtype t, int64_t at, const float *v,
                 int64_t n, bool accumulate);
/* f32 values of src[at..at+n) (elements of dtype t): src + at itself for
 * f32, else the bf16 values converted into tmp (n floats). */
const float *op_load_f32(const float *src, op_dtype t, int64_t at, int64_t n,
                         float *tmp);

/* A vectorizable expf (Cephes-style range reduction, ~2 ulp) for loops
 * that gcc -O3 should turn into SIMD code; rounds with the 1.5*2^23 trick
 * so that no floorf call blocks vectorization. NaN gives NaN, +Inf
 * exp(88.3), -Inf exp(-87.3). */
static inline float op_expf(float in) {
  /* NaN would make the int conversion below undefined: compute on 0 and
   * return the NaN itself, so it flows on to the numeric check. */
  float x = in == in ? in : 0.0f;
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  float fx = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  union {
    int32_t i;
    float f;
  } u = {.i = ((int32_t)fx + 127) * (1 << 23)};
  return in == in ? p * u.f : in;
}

#endif
