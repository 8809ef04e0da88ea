/* Shape inference of attention (attn_geom.h): the packed and separate
 * layouts of q, k and v, grouped-query heads, key lengths, and the
 * messages that name what was wrong. */
#include <math.h>
#include <stdio.h>

#include "ops/attn_geom.h"

static remat_status check_heads(const op_desc *d, int64_t *H, int64_t *KVH,
                                char err[OP_ERRMSG_MAX]) {
  *H = d->attrs.heads;
  *KVH = d->attrs.kv_heads ? d->attrs.kv_heads : d->attrs.heads;
  if (*H < 1 || *KVH < 1 || *H % *KVH != 0)
    return op_shape_err(err, d,
                        "%lld heads and %lld kv heads: the heads must be a "
                        "positive multiple of the kv heads (each kv head "
                        "serves heads / kv heads query heads)",
                        (long long)*H, (long long)*KVH);
  return REMAT_OK;
}

static remat_status packed_geom(const op_desc *d, const char *prefix,
                                const op_shape *qkv, attn_geom *g,
                                char err[OP_ERRMSG_MAX]) {
  char bq[OP_SHAPE_STR_MAX];
  op_shape_str(qkv, bq);
  int64_t H = g->H, KVH = g->KVH, W = qkv->dim[2];
  if (H == KVH) {
    if (qkv->ndim != 3 || W % 3 != 0)
      return op_shape_err(err, d, "%sqkv %s: qkv must be [B,T,3D]", prefix,
                          bq);
    if (W / 3 % H != 0)
      return op_shape_err(err, d,
                          "%sqkv %s with %lld heads: D (%lld) must be "
                          "divisible by the number of heads",
                          prefix, bq, (long long)H, (long long)(W / 3));
  } else if (qkv->ndim != 3 || W % (H + 2 * KVH) != 0) {
    return op_shape_err(err, d,
                        "%sqkv %s with %lld heads and %lld kv heads: qkv "
                        "must be [B,T,(heads + 2 kv heads) head dim], its "
                        "width a multiple of %lld",
                        prefix, bq, (long long)H, (long long)KVH,
                        (long long)(H + 2 * KVH));
  }
  g->B = qkv->dim[0];
  g->T = g->S = qkv->dim[1];
  g->hd = W / (H + 2 * KVH);
  g->q_ld = g->k_ld = g->v_ld = W;
  g->q_col = 0;
  g->k_col = H * g->hd;
  g->v_col = (H + KVH) * g->hd;
  return REMAT_OK;
}

static remat_status separate_geom(const op_desc *d, const char *prefix,
                                  const op_shape *q, const op_shape *k,
                                  const op_shape *v, attn_geom *g,
                                  char err[OP_ERRMSG_MAX]) {
  char bq[OP_SHAPE_STR_MAX], bk[OP_SHAPE_STR_MAX], bv[OP_SHAPE_STR_MAX];
  op_shape_str(q, bq);
  op_shape_str(k, bk);
  op_shape_str(v, bv);
  int64_t H = g->H, KVH = g->KVH;
  if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3)
    return op_shape_err(err, d,
                        "%sq %s, k %s and v %s: q must be [B,T,heads * head "
                        "dim], k and v [B,S,kv heads * head dim]",
                        prefix, bq, bk, bv);
  if (q->dim[2] % H != 0)
    return op_shape_err(err, d,
                        "%sq %s with %lld heads: the width of q (%lld) must "
                        "be divisible by the number of heads",
                        prefix, bq, (long long)H, (long long)q->dim[2]);
  if (!op_shape_eq(k, v))
    return op_shape_err(err, d, "%sk %s and v %s: k and v must have the "
                        "same shape", prefix, bk, bv);
  int64_t hd = q->dim[2] / H;
  if (k->dim[0] != q->dim[0] || k->dim[2] != KVH * hd)
    return op_shape_err(err, d,
                        "%sq %s and k %s with %lld heads and %lld kv heads: "
                        "k must be [B,S,kv heads * head dim] = [%lld,S,%lld]",
                        prefix, bq, bk, (long long)H, (long long)KVH,
                        (long long)q->dim[0], (long long)(KVH * hd));
  g->B = q->dim[0];
  g->T = q->dim[1];
  g->S = k->dim[1];
  g->hd = hd;
  g->q_ld = q->dim[2];
  g->k_ld = g->v_ld = k->dim[2];
  g->q_col = g->k_col = g->v_col = 0;
  return REMAT_OK;
}

remat_status attn_geom_infer(const op_desc *d, const char *prefix,
                             const op_shape *q, const op_shape *k,
                             const op_shape *v, attn_geom *g,
                             char err[OP_ERRMSG_MAX]) {
  *g = (attn_geom){0};
  remat_status rs = check_heads(d, &g->H, &g->KVH, err);
  if (rs == REMAT_OK)
    rs = k ? separate_geom(d, prefix, q, k, v, g, err)
           : packed_geom(d, prefix, q, g, err);
  if (rs != REMAT_OK) return rs;
  g->group = g->H / g->KVH;
  g->o_ld = g->H * g->hd;
  g->causal = !d->attrs.attn_full;
  g->scale = d->attrs.attn_scale != 0.0f
                 ? d->attrs.attn_scale
                 : (float)(1.0 / sqrt((double)g->hd));
  if (!isfinite(g->scale))
    return op_shape_err(err, d, "scale %g is not finite",
                        (double)d->attrs.attn_scale);
  return REMAT_OK;
}

remat_status attn_check_lens(const op_desc *d, int i, int64_t B,
                             char err[OP_ERRMSG_MAX]) {
  char bl[OP_SHAPE_STR_MAX];
  const op_shape *l = &d->in[i];
  if (l->ndim != 1 || l->dim[0] != B || d->in_dtype[i] != OP_I32)
    return op_shape_err(err, d,
                        "key lengths %s %s: the key lengths must be an int32 "
                        "[B] = [%lld]",
                        op_shape_str(l, bl), op_dtype_name(d->in_dtype[i]),
                        (long long)B);
  return REMAT_OK;
}
