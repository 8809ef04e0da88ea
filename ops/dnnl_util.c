/* Helpers shared by the ops: op state bookkeeping, oneDNN primitive creation
 * (user-mode scratchpad, size recorded), per-tile execution on a worker's
 * stream, and op_gemm, the strided block matmul behind every dot op. */
#include "base/alloc.h"
#include "base/bf16.h"
#include "ops/dnnl_util.h"

#include <oneapi/dnnl/dnnl_debug.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OP_EXEC_MAX_ARGS 12

void *op_state_new(size_t bytes, dnnl_engine_t engine, const char *name) {
  op_base *base = remat__calloc(1, bytes);
  if (base) {
    base->engine = engine;
    base->name = name;
  }
  return base;
}

void op_state_free(void *state) {
  op_base *base = state;
  if (!base) return;
  for (int i = 0; i < base->nprims; i++) dnnl_primitive_destroy(base->prims[i]);
  free(base->prims);
  free(base);
}

void op_base_finish(const op_base *base, op_instance *inst) {
  size_t dnnl_part = (size_t)remat__round64((int64_t)base->dnnl_scratch);
  inst->scratch_bytes = base->temp_bytes ? dnnl_part + base->temp_bytes
                                         : base->dnnl_scratch;
}

remat_status op_dnnl_fail(dnnl_status_t st, const char *name,
                          const char *what, char err[OP_ERRMSG_MAX]) {
  if (st == dnnl_success) return REMAT_OK;
  if (err)
    snprintf(err, OP_ERRMSG_MAX, "%s: oneDNN %s failed: %s", name, what,
             dnnl_status2str(st));
  return st == dnnl_out_of_memory ? REMAT_ERR_OUT_OF_MEMORY
                                  : REMAT_ERR_BACKEND;
}

static remat_status keep_prim(op_base *base, dnnl_primitive_t prim,
                              char err[OP_ERRMSG_MAX]) {
  if (base->nprims == base->cap) {
    int cap = base->cap ? 2 * base->cap : 8;
    dnnl_primitive_t *grown = remat__realloc(base->prims, cap * sizeof *grown);
    if (!grown) {
      dnnl_primitive_destroy(prim);
      snprintf(err, OP_ERRMSG_MAX, "%s: out of memory", base->name);
      return REMAT_ERR_OUT_OF_MEMORY;
    }
    base->prims = grown;
    base->cap = cap;
  }
  base->prims[base->nprims++] = prim;
  return REMAT_OK;
}

remat_status op_prim_create(op_base *base, const_dnnl_op_desc_t op_desc,
                            dnnl_primitive_attr_t attr,
                            const_dnnl_primitive_desc_t hint,
                            dnnl_primitive_t *prim,
                            dnnl_primitive_desc_t *pd_out,
                            char err[OP_ERRMSG_MAX]) {
  dnnl_primitive_attr_t own = NULL;
  dnnl_status_t st = dnnl_success;
  if (!attr) {
    st = dnnl_primitive_attr_create(&own);
    if (st != dnnl_success)
      return op_dnnl_fail(st, base->name, "attribute creation", err);
    attr = own;
  }
  st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  dnnl_primitive_desc_t pd = NULL;
  if (st == dnnl_success)
    st = dnnl_primitive_desc_create(&pd, op_desc, attr, base->engine, hint);
  if (own) dnnl_primitive_attr_destroy(own);
  if (st != dnnl_success)
    return op_dnnl_fail(st, base->name, "primitive descriptor creation", err);
  const dnnl_memory_desc_t *smd =
      dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  size_t scratch = smd ? dnnl_memory_desc_get_size(smd) : 0;
  if (scratch > base->dnnl_scratch) base->dnnl_scratch = scratch;
  st = dnnl_primitive_create(prim, pd);
  if (st != dnnl_success) {
    dnnl_primitive_desc_destroy(pd);
    return op_dnnl_fail(st, base->name, "primitive creation", err);
  }
  remat_status rs = keep_prim(base, *prim, err); /* destroys it on failure */
  if (rs != REMAT_OK)
    *prim = NULL;
  if (pd_out && rs == REMAT_OK)
    *pd_out = pd;
  else
    dnnl_primitive_desc_destroy(pd);
  return rs;
}

int op_exec(dnnl_primitive_t prim, op_worker *w, int nargs,
            const op_arg *args) {
  const_dnnl_primitive_desc_t pd;
  dnnl_engine_t engine;
  if (dnnl_primitive_get_primitive_desc(prim, &pd) != dnnl_success ||
      dnnl_stream_get_engine(w->stream, &engine) != dnnl_success)
    return REMAT_ERR_BACKEND;
  if (nargs > OP_EXEC_MAX_ARGS) return REMAT_ERR_INVALID_ARG;
  dnnl_exec_arg_t exec[OP_EXEC_MAX_ARGS + 1];
  int n = 0;
  dnnl_status_t st = dnnl_success;
  for (int i = 0; i < nargs && st == dnnl_success; i++) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(
        pd, dnnl_query_exec_arg_md, args[i].arg);
    exec[n].arg = args[i].arg;
    st = dnnl_memory_create(&exec[n].memory, md, engine, (void *)args[i].ptr);
    if (st == dnnl_success) n++;
  }
  const dnnl_memory_desc_t *smd =
      dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (st == dnnl_success && smd && dnnl_memory_desc_get_size(smd) > 0) {
    if (w->scratch_bytes < dnnl_memory_desc_get_size(smd)) {
      st = dnnl_invalid_arguments;
    } else {
      exec[n].arg = DNNL_ARG_SCRATCHPAD;
      st = dnnl_memory_create(&exec[n].memory, smd, engine, w->scratch);
      if (st == dnnl_success) n++;
    }
  }
  if (st == dnnl_success) st = dnnl_primitive_execute(prim, w->stream, n, exec);
  for (int i = 0; i < n; i++) dnnl_memory_destroy(exec[i].memory);
  return st == dnnl_success ? REMAT_OK : REMAT_ERR_BACKEND;
}

dnnl_data_type_t op_dnnl_dt(op_dtype t) {
  return t == OP_BF16 ? dnnl_bf16 : t == OP_I32 ? dnnl_s32 : dnnl_f32;
}

dnnl_memory_desc_t op_md(int ndims, const int64_t *dims,
                         const int64_t *strides) {
  return op_md_dt(ndims, dims, strides, OP_F32);
}

dnnl_memory_desc_t op_md_dt(int ndims, const int64_t *dims,
                            const int64_t *strides, op_dtype t) {
  dnnl_memory_desc_t md;
  dnnl_dims_t d, s;
  for (int i = 0; i < ndims; i++) {
    d[i] = dims[i];
    s[i] = strides[i];
  }
  if (dnnl_memory_desc_init_by_strides(&md, ndims, d, op_dnnl_dt(t), s) !=
      dnnl_success)
    memset(&md, 0, sizeof md);
  return md;
}

dnnl_memory_desc_t op_md2(int64_t rows, int64_t cols, int64_t row_stride,
                          int64_t col_stride) {
  return op_md2_dt(rows, cols, row_stride, col_stride, OP_F32);
}

dnnl_memory_desc_t op_md2_dt(int64_t rows, int64_t cols, int64_t row_stride,
                             int64_t col_stride, op_dtype t) {
  const int64_t dims[2] = {rows, cols}, strides[2] = {row_stride, col_stride};
  return op_md_dt(2, dims, strides, t);
}

int64_t op_row_block(int64_t cols) {
  return op_max64(1, OP_TILE_ELEMS / op_max64(cols, 1));
}

int64_t op_rows(const op_shape *s) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < s->ndim; i++) rows *= s->dim[i];
  return rows;
}

int64_t op_gemm_rows(int64_t n, int64_t k) {
  int64_t rows = OP_GEMM_ROWS;
  while (2.0 * (double)rows * (double)n * (double)k < 5e5 && rows < 4096)
    rows *= 2;
  return rows;
}

void op_gemm_init(op_gemm *g, int64_t m, int64_t n, int64_t k, int64_t bm,
                  int64_t bn) {
  memset(g, 0, sizeof *g);
  g->m = m;
  g->n = n;
  g->k = k;
  g->bm = op_min64(bm, m);
  g->bn = op_min64(bn, n);
  g->alpha = 1.0f;
  g->accumulate_too = true;
  g->a_dt = g->b_dt = g->c_dt = g->bias_dt = OP_F32;
  op_gemm_layout(g, op_plain(k), op_plain(n), n);
}

/* Row and column strides of an operand from its layout. */
static void layout_strides(op_layout l, int64_t *rs, int64_t *cs) {
  *rs = l.transposed ? 1 : l.ld;
  *cs = l.transposed ? l.ld : 1;
}

void op_gemm_layout(op_gemm *g, op_layout a, op_layout b, int64_t c_ld) {
  layout_strides(a, &g->a_rs, &g->a_cs);
  layout_strides(b, &g->b_rs, &g->b_cs);
  g->c_rs = c_ld;
  g->c_cs = 1;
}

void op_gemm_dtypes(op_gemm *g, op_dtype a, op_dtype b, op_dtype c) {
  g->a_dt = a;
  g->b_dt = b;
  g->c_dt = c;
}

static remat_status gemm_prim(op_gemm *g, op_base *base, int64_t m, int64_t n,
                              bool accumulate, dnnl_primitive_t *prim,
                              char err[OP_ERRMSG_MAX]) {
  dnnl_memory_desc_t a = op_md2_dt(m, g->k, g->a_rs, g->a_cs, g->a_dt);
  dnnl_memory_desc_t b = op_md2_dt(g->k, n, g->b_rs, g->b_cs, g->b_dt);
  dnnl_memory_desc_t c = op_md2_dt(m, n, g->c_rs, g->c_cs, g->c_dt);
  dnnl_memory_desc_t bias = op_md2_dt(1, n, n, 1, g->bias_dt);
  dnnl_matmul_desc_t desc;
  dnnl_status_t st =
      dnnl_matmul_desc_init(&desc, &a, &b, g->bias ? &bias : NULL, &c);
  if (st != dnnl_success)
    return op_dnnl_fail(st, base->name, "matmul descriptor", err);
  dnnl_primitive_attr_t attr;
  st = dnnl_primitive_attr_create(&attr);
  if (st != dnnl_success)
    return op_dnnl_fail(st, base->name, "attribute creation", err);
  if (g->alpha != 1.0f)
    st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &g->alpha);
  dnnl_post_ops_t post = NULL;
  bool eltwise = g->post_eltwise != dnnl_alg_kind_undef;
  if (st == dnnl_success && (accumulate || eltwise || g->post_add)) {
    /* the sum first (accumulating), then the epilogue: GELU, then + R */
    dnnl_memory_desc_t r = op_md2_dt(m, n, g->c_rs, g->c_cs, g->add_dt);
    st = dnnl_post_ops_create(&post);
    if (st == dnnl_success && accumulate)
      st = dnnl_post_ops_append_sum(post, 1.0f);
    if (st == dnnl_success && eltwise)
      st = dnnl_post_ops_append_eltwise(post, 1.0f, g->post_eltwise, 0, 0);
    if (st == dnnl_success && g->post_add)
      st = dnnl_post_ops_append_binary(post, dnnl_binary_add, &r);
    if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, post);
    if (post) dnnl_post_ops_destroy(post);
  }
  remat_status rs = op_dnnl_fail(st, base->name, "matmul attributes", err);
  if (rs == REMAT_OK)
    rs = op_prim_create(base, &desc, attr, NULL, prim, NULL, err);
  dnnl_primitive_attr_destroy(attr);
  /* oneDNN 2.6 has bf16 matmuls only on AVX-512 (avx512_core) CPUs: say
   * so rather than "unimplemented" */
  bool bf16 = g->a_dt == OP_BF16 || g->b_dt == OP_BF16;
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  if (rs == REMAT_ERR_BACKEND && bf16 &&
      (isa & dnnl_cpu_isa_avx512_core) != dnnl_cpu_isa_avx512_core)
    snprintf(err, OP_ERRMSG_MAX,
             "%s: bf16 precision needs a CPU with AVX-512 (oneDNN 2.6 has "
             "no bf16 matmul below avx512_core); use f32 precision",
             base->name);
  return rs;
}

remat_status op_gemm_plan(op_gemm *g, op_base *base,
                          char err[OP_ERRMSG_MAX]) {
  int64_t rem_m = g->m % g->bm, rem_n = g->n % g->bn;
  for (int im = 0; im < 2; im++) {
    int64_t m = im ? rem_m : g->bm;
    for (int in = 0; in < 2; in++) {
      int64_t n = in ? rem_n : g->bn;
      if (m == 0 || n == 0) continue;
      for (int acc = 0; acc < (g->accumulate_too ? 2 : 1); acc++) {
        remat_status rs = gemm_prim(g, base, m, n, acc, &g->prim[im][in][acc],
                                    err);
        if (rs != REMAT_OK) return rs;
      }
    }
  }
  return REMAT_OK;
}

int64_t op_gemm_tiles(const op_gemm *g) {
  return op_div_up(g->m, g->bm) * op_div_up(g->n, g->bn);
}

/* Block `tile` of the gemm, with the fused add's operand R at add (NULL:
 * the gemm has no post_add). */
static int gemm_exec(const op_gemm *g, int64_t tile, const void *a,
                     const void *b, const void *bias, const void *add,
                     void *c, bool accumulate, op_worker *w) {
  int64_t tiles_n = op_div_up(g->n, g->bn);
  int64_t m0 = (tile / tiles_n) * g->bm, n0 = (tile % tiles_n) * g->bn;
  int im = m0 + g->bm > g->m, in = n0 + g->bn > g->n;
  dnnl_primitive_t prim = g->prim[im][in][accumulate];
  if (!prim || (add != NULL) != g->post_add) return REMAT_ERR_STATE;
  int64_t at = m0 * g->c_rs + n0 * g->c_cs;
  /* the binary post-op's index: after the eltwise, when there is one */
  int idx = g->post_eltwise != dnnl_alg_kind_undef;
  op_arg args[5] = {
      {DNNL_ARG_SRC, op_at(a, m0 * g->a_rs, g->a_dt)},
      {DNNL_ARG_WEIGHTS, op_at(b, n0 * g->b_cs, g->b_dt)},
      {DNNL_ARG_DST, op_at(c, at, g->c_dt)},
      {DNNL_ARG_BIAS, bias ? op_at(bias, n0, g->bias_dt) : NULL},
      {DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) | DNNL_ARG_SRC_1,
       add ? op_at(add, at, g->add_dt) : NULL},
  };
  if (!g->bias) args[3] = args[4];
  return op_exec(prim, w, 3 + g->bias + g->post_add, args);
}

int op_gemm_run(const op_gemm *g, int64_t tile, const void *a,
                const void *b, const void *bias, void *c, bool accumulate,
                op_worker *w) {
  return gemm_exec(g, tile, a, b, bias, NULL, c, accumulate, w);
}

int op_gemm_run_add(const op_gemm *g, int64_t tile, const void *a,
                    const void *b, const void *bias, const void *add,
                    void *c, op_worker *w) {
  if (add == NULL) return REMAT_ERR_STATE;
  return gemm_exec(g, tile, a, b, bias, add, c, false, w);
}

int op_gemm_run_block_a(const op_gemm *g, int64_t tile, const void *a_block,
                        const void *b, void *c, bool accumulate,
                        op_worker *w) {
  int64_t tiles_n = op_div_up(g->n, g->bn);
  int64_t m0 = (tile / tiles_n) * g->bm, n0 = (tile % tiles_n) * g->bn;
  int im = m0 + g->bm > g->m, in = n0 + g->bn > g->n;
  dnnl_primitive_t prim = g->prim[im][in][accumulate];
  if (!prim || g->bias) return REMAT_ERR_STATE;
  op_arg args[3] = {
      {DNNL_ARG_SRC, a_block},
      {DNNL_ARG_WEIGHTS, op_at(b, g->b_cs * n0, g->b_dt)},
      {DNNL_ARG_DST, op_at(c, m0 * g->c_rs + n0 * g->c_cs, g->c_dt)},
  };
  return op_exec(prim, w, 3, args);
}

int64_t op_dw_chunk_rows(int64_t rows, int64_t grad_elems) {
  int64_t chunks = op_min64(op_div_up(rows, OP_DW_CHUNK_MIN), OP_DW_CHUNKS);
  int64_t grad_bytes = op_max64(1, grad_elems) * (int64_t)sizeof(float);
  chunks = op_max64(1, op_min64(chunks, OP_DW_PARTIAL_BYTES / grad_bytes));
  if (chunks == 1) return rows;
  return op_div_up(op_div_up(rows, chunks), 64) * 64;
}

void op_sum_partials(const float *part, int64_t stride, int64_t nparts,
                     int64_t len, float *dst, bool accumulate) {
  for (int64_t i0 = 0; i0 < len; i0 += OP_COL_BLOCK) {
    int64_t n = op_min64(OP_COL_BLOCK, len - i0);
    float acc[OP_COL_BLOCK];
    memcpy(acc, part + i0, (size_t)n * sizeof *acc);
    for (int64_t c = 1; c < nparts; c++) {
      const float *restrict p = part + c * stride + i0;
      for (int64_t i = 0; i < n; i++) acc[i] += p[i];
    }
    op_store(dst + i0, acc, n, accumulate);
  }
}

void op_store(float *restrict dst, const float *restrict src, int64_t n,
              bool accumulate) {
  if (accumulate)
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
  else
    memcpy(dst, src, (size_t)n * sizeof *dst);
}

void op_store_dt(float *dst, op_dtype t, int64_t at, const float *v,
                 int64_t n, bool accumulate) {
  if (t != OP_BF16)
    op_store(dst + at, v, n, accumulate);
  else if (accumulate)
    bf16_add_f32_row((uint16_t *)dst + at, v, n);
  else
    bf16_from_f32_row((uint16_t *)dst + at, v, n);
}

const float *op_load_f32(const float *src, op_dtype t, int64_t at, int64_t n,
                         float *tmp) {
  if (t != OP_BF16)
    return src + at;
  bf16_to_f32_row(tmp, (const uint16_t *)src + at, n);
  return tmp;
}
