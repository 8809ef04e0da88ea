/* Stage "memory prediction" (memplan.h): the step's predicted peak bytes,
 * from walking the kernel nodes in program order with each buffer allocated
 * at its first writer and freed after its last user. The same walk tells
 * the arena which blocks to reserve before the first step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/memplan.h"

int64_t memplan_persistent_bytes(const remat_graph *g, const plan_lowering *l,
                                 int nworkers, int nnodes) {
  int64_t bytes = 0;
  for (int32_t b = 0; b < l->nbufs; b++)
    if (l->bufs[b].persistent)
      bytes += mem_block_bytes(l->bufs[b].bytes) *
               (plan_buffer_replicated(&l->bufs[b], nnodes) ? nnodes : 1);
  size_t scratch = 0;
  for (int32_t o = 0; o < g->nops; o++)
    if (g->ops[o].inst.scratch_bytes > scratch)
      scratch = g->ops[o].inst.scratch_bytes;
  if (scratch > 0) /* persist.c's one block of scratch for all workers */
    bytes += mem_block_bytes(remat__round64((int64_t)scratch) * nworkers);
  return bytes;
}

/* Walks program order: a node's buffers are allocated when it starts, and a
 * buffer is freed when its last user is done. */
int64_t memplan_transient_peak(const plan_lowering *p, int64_t *live) {
  int32_t *left = remat__malloc(((size_t)p->nbufs + 1) * sizeof *left);
  if (left == NULL)
    return -1;
  for (int32_t b = 0; b < p->nbufs; b++)
    left[b] = p->bufs[b].users;
  int64_t cur = 0, peak = 0;
  for (int32_t i = 0; i < p->nknodes; i++) {
    const plan_knode *kn = &p->knodes[i];
    for (int k = 0; k < kn->ninit; k++)
      if (!p->bufs[kn->init[k]].persistent)
        cur += mem_block_bytes(p->bufs[kn->init[k]].bytes);
    if (live != NULL)
      live[i] = cur;
    if (cur > peak)
      peak = cur;
    for (int k = 0; k < kn->ntouch; k++) {
      const plan_buffer *b = &p->bufs[kn->touch[k]];
      if (!b->persistent && --left[kn->touch[k]] == 0)
        cur -= mem_block_bytes(b->bytes);
    }
  }
  free(left);
  return peak;
}

static memplan_blocks *count_for(memplan_blocks *c, int *n, int64_t bytes,
                                 int home) {
  bytes = mem_block_bytes(bytes);
  for (int i = 0; i < *n; i++)
    if (c[i].bytes == bytes && c[i].home == home)
      return &c[i];
  c[*n] = (memplan_blocks){bytes, 0, home};
  return &c[(*n)++];
}

/* How many blocks of each size and home program order holds at once: the
 * highest count of each, walked as memplan_transient_peak walks. */
static remat_status expect_blocks(const plan_lowering *p, const int *home,
                                  memplan_prediction *out) {
  memplan_blocks *c = remat__calloc((size_t)p->nbufs + 1, sizeof *c);
  int64_t *live = remat__calloc((size_t)p->nbufs + 1, sizeof *live);
  int32_t *left = remat__malloc(((size_t)p->nbufs + 1) * sizeof *left);
  remat_status s = c && live && left ? REMAT_OK : REMAT_ERR_OUT_OF_MEMORY;
  int n = 0;
  for (int32_t b = 0; s == REMAT_OK && b < p->nbufs; b++)
    left[b] = p->bufs[b].users;
  for (int32_t i = 0; s == REMAT_OK && i < p->nknodes; i++) {
    const plan_knode *kn = &p->knodes[i];
    for (int k = 0; k < kn->ninit; k++) {
      int32_t b = kn->init[k];
      if (p->bufs[b].persistent)
        continue;
      memplan_blocks *sc = count_for(c, &n, p->bufs[b].bytes, home[b]);
      if (++live[sc - c] > sc->count)
        sc->count = live[sc - c];
    }
    for (int k = 0; k < kn->ntouch; k++) {
      int32_t b = kn->touch[k];
      if (!p->bufs[b].persistent && --left[b] == 0)
        live[count_for(c, &n, p->bufs[b].bytes, home[b]) - c]--;
    }
  }
  free(live);
  free(left);
  if (s != REMAT_OK) {
    free(c);
    return s;
  }
  out->expect = c;
  out->nexpect = n;
  return REMAT_OK;
}

remat_status memplan_predict(const remat_graph *g, const plan_lowering *l,
                             const numa_plan *numa, int nworkers,
                             memplan_prediction *out) {
  memset(out, 0, sizeof *out);
  remat_status s = expect_blocks(l, numa->home, out);
  if (s != REMAT_OK)
    return s;
  out->transient_peak = memplan_transient_peak(l, NULL);
  if (out->transient_peak < 0) {
    memplan_prediction_free(out);
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  out->peak = memplan_persistent_bytes(g, l, nworkers, numa->nnodes) +
              out->transient_peak;
  return REMAT_OK;
}

void memplan_prediction_free(memplan_prediction *p) {
  free(p->expect);
  memset(p, 0, sizeof *p);
}
