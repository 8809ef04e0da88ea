/* The geometry of attention, shared by its materialized ops (attention.c)
 * and its fused op (attention_fused.c): how q, k and v lie in their
 * buffers (a packed qkv [B,T,(H+2 KVH) hd], q heads then k heads then v
 * heads, or separate q [B,T,H hd], k and v [B,S,KVH hd]), which key/value
 * head a query head reads (grouped-query attention: head h reads kv head
 * h / (H / KVH)), and which keys a query sees (the causal mask, the key
 * lengths). Shape inference and its messages live in attn_geom.c. */
#ifndef REMAT_OPS_ATTN_GEOM_H
#define REMAT_OPS_ATTN_GEOM_H

#include "ops/op_impl.h"

typedef struct attn_geom {
  int64_t B, T, S;    /* batch, queries, keys */
  int64_t H, KVH, hd; /* query heads, key/value heads, head dim */
  int64_t group;      /* H / KVH: query heads per key/value head */
  int64_t q_ld, k_ld, v_ld; /* row strides of q, k, v */
  int64_t q_col, k_col, v_col; /* column of head 0 in its row */
  int64_t o_ld;       /* H hd: row stride of the output */
  bool causal;        /* query i sees keys 0..i */
  float scale;
} attn_geom;

/* Element offsets of row t (or s) of head h (or kv head g) of batch b. */
static inline int64_t attn_q_at(const attn_geom *a, int64_t b, int64_t h,
                                int64_t t) {
  return (b * a->T + t) * a->q_ld + a->q_col + h * a->hd;
}
static inline int64_t attn_k_at(const attn_geom *a, int64_t b, int64_t g,
                                int64_t s) {
  return (b * a->S + s) * a->k_ld + a->k_col + g * a->hd;
}
static inline int64_t attn_v_at(const attn_geom *a, int64_t b, int64_t g,
                                int64_t s) {
  return (b * a->S + s) * a->v_ld + a->v_col + g * a->hd;
}
static inline int64_t attn_o_at(const attn_geom *a, int64_t b, int64_t h,
                                int64_t t) {
  return (b * a->T + t) * a->o_ld + h * a->hd;
}

/* Keys query t of batch row b sees: 0..attn_keys(t, len) - 1, where len is
 * the row's key length (S without key lengths), at least 1 for t >= 0. */
static inline int64_t attn_keys(const attn_geom *a, int64_t t, int64_t len) {
  int64_t n = a->causal && t + 1 < a->S ? t + 1 : a->S;
  return n < len ? n : len;
}

/* The key length of batch row b: lens[b] clamped to 1..S (the step
 * refused lengths outside it before running: remat_feed), S without. */
static inline int64_t attn_len(const attn_geom *a, const float *lens,
                               int64_t b) {
  if (!lens) return a->S;
  int64_t n = ((const int32_t *)lens)[b];
  return n < 1 ? 1 : n > a->S ? a->S : n;
}

/* The geometry of op d whose queries are q, keys k and values v: k == NULL
 * means q is a packed qkv (v is then ignored). Checks the shapes against
 * d->attrs (heads, kv_heads) and fills g; on error the message names the
 * op and the shapes. */
remat_status attn_geom_infer(const op_desc *d, const char *prefix,
                             const op_shape *q,
                             const op_shape *k, const op_shape *v,
                             attn_geom *g, char err[OP_ERRMSG_MAX]);
/* Checks that d's input `i` (key lengths) is an int32 [B]. */
remat_status attn_check_lens(const op_desc *d, int i, int64_t B,
                             char err[OP_ERRMSG_MAX]);

#endif
