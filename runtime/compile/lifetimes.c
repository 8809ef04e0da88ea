/* Stage "lifetimes" (lifetimes.h): from the kernel nodes in program order,
 * which node allocates each buffer (its first writer) and how many nodes
 * use it (the last one frees it). A gradient written by several nodes is
 * zero-filled by the first and accumulated into by all of them. */
#include <stdlib.h>

#include "base/alloc.h"
#include "runtime/compile/lifetimes.h"

/* Distinct buffers of each node, and user counts. */
static remat_status collect_touch(plan_lowering *l) {
  for (int32_t i = 0; i < l->nknodes; i++) {
    plan_knode *kn = &l->knodes[i];
    knode_use uses[PLAN_MAX_USES];
    kn->ntouch = knode_uses(kn, uses);
    kn->touch = remat__malloc(PLAN_MAX_USES * sizeof *kn->touch);
    kn->init = remat__malloc(PLAN_MAX_USES * sizeof *kn->init);
    if (kn->touch == NULL || kn->init == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
    for (int j = 0; j < kn->ntouch; j++) {
      kn->touch[j] = uses[j].buf;
      l->bufs[uses[j].buf].users++;
    }
  }
  return REMAT_OK;
}

/* Extra writers of an op kernel that writes the gradient of one tensor
 * through two of its din slots (mul(y, y), add(x, x)): each slot counts,
 * so that the buffer is zero-filled and both slots add into it. */
static void count_shared_dins(const plan_knode *kn, int32_t *writers) {
  if (kn->kernel == NULL)
    return;
  for (int k = 1; k < OP_MAX_IN; k++) {
    int32_t b = kn->slot_buf[plan_slot(OP_SLOT_DIN(k))];
    if (b < 0 || !(kn->kernel->writes & OP_SLOT_DIN(k)))
      continue;
    for (int j = 0; j < k; j++)
      if (kn->slot_buf[plan_slot(OP_SLOT_DIN(j))] == b &&
          (kn->kernel->writes & OP_SLOT_DIN(j))) {
        writers[b]++;
        break;
      }
  }
}

static void count_writers(const plan_lowering *l, int32_t *writers,
                          int32_t *first) {
  for (int32_t b = 0; b < l->nbufs; b++)
    first[b] = -1;
  for (int32_t i = 0; i < l->nknodes; i++) {
    knode_use uses[PLAN_MAX_USES];
    int n = knode_uses(&l->knodes[i], uses);
    for (int j = 0; j < n; j++) {
      if (!uses[j].writes)
        continue;
      writers[uses[j].buf]++;
      if (first[uses[j].buf] < 0)
        first[uses[j].buf] = i;
    }
    count_shared_dins(&l->knodes[i], writers);
  }
}

static remat_status assign_init(plan_lowering *l) {
  int32_t *writers = remat__calloc((size_t)l->nbufs + 1, sizeof *writers);
  int32_t *first = remat__malloc(((size_t)l->nbufs + 1) * sizeof *first);
  if (writers == NULL || first == NULL) {
    free(writers);
    free(first);
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  count_writers(l, writers, first);
  for (int32_t b = 0; b < l->nbufs; b++) {
    plan_buffer *buf = &l->bufs[b];
    buf->first_writer = first[b];
    buf->zero_fill = writers[b] > 1 && (buf->cat == REMAT_MEM_GRADS ||
                                        buf->cat == REMAT_MEM_ACT_GRADS);
    if (first[b] >= 0 && (!buf->persistent || buf->zero_fill)) {
      plan_knode *kn = &l->knodes[first[b]];
      kn->init[kn->ninit++] = b;
    }
  }
  for (int32_t i = 0; i < l->nknodes; i++) {
    plan_knode *kn = &l->knodes[i];
    if (kn->kernel == NULL)
      continue;
    for (int k = 0; k < OP_MAX_IN; k++) {
      int32_t b = kn->slot_buf[plan_slot(OP_SLOT_DIN(k))];
      kn->din_accumulate[k] = b >= 0 && l->bufs[b].zero_fill;
    }
  }
  free(writers);
  free(first);
  return REMAT_OK;
}

remat_status lifetimes_assign(plan_lowering *l) {
  remat_status s = collect_touch(l);
  if (s == REMAT_OK)
    s = assign_init(l);
  for (int32_t i = 0; s == REMAT_OK && i < l->nknodes; i++) {
    const plan_knode *kn = &l->knodes[i];
    if (kn->kind == KNODE_RECOMPUTE)
      l->recompute_flops += kn->flops;
    else if (kn->kind == KNODE_FORWARD || kn->kind == KNODE_BACKWARD)
      l->flops += kn->flops;
  }
  return s;
}
