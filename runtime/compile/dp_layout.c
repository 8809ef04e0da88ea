/* The data-parallel part of stage "DAG" (dp_layout.h): buckets of
 * gradients and where their allreduce and the agreement sit in the DAG. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/dp_layout.h"

typedef struct grad_info {
  int32_t buf, last_writer;
} grad_info;

static int by_last_writer(const void *a, const void *b) {
  const grad_info *x = a, *y = b;
  if (x->last_writer != y->last_writer)
    return x->last_writer < y->last_writer ? -1 : 1;
  return x->buf < y->buf ? -1 : x->buf > y->buf;
}

static bool node_uses(const plan_knode *kn, int32_t buf, bool *writes) {
  knode_use uses[PLAN_MAX_USES];
  int n = knode_uses(kn, uses);
  for (int j = 0; j < n; j++)
    if (uses[j].buf == buf) {
      *writes = uses[j].writes;
      return true;
    }
  return false;
}

/* The parameters' gradient buffers with their last writers, in the order
 * backward finishes them. */
static grad_info *gradients(const dp_layout_request *r, int *count) {
  const remat_graph *g = r->g;
  grad_info *gi = remat__malloc(((size_t)g->ntensors + 1) * sizeof *gi);
  if (gi == NULL)
    return NULL;
  int n = 0;
  for (int32_t t = 0; t < g->ntensors; t++) {
    int32_t b = r->low->grad_buf[t];
    if (g->tensors[t]->kind != TENSOR_PARAM || b < 0)
      continue;
    int32_t last = -1;
    for (int32_t k = 0; k < r->low->nknodes; k++) {
      bool w = false;
      if (node_uses(&r->low->knodes[k], b, &w) && w)
        last = k;
    }
    if (last >= 0)
      gi[n++] = (grad_info){b, last};
  }
  qsort(gi, (size_t)n, sizeof *gi, by_last_writer);
  *count = n;
  return gi;
}

/* Groups the gradients into buckets of about the limit, in order. */
static remat_status make_buckets(const dp_layout_request *r, plan_dp *d,
                                 const grad_info *gi, int n) {
  int64_t limit = r->bucket_bytes / (int64_t)sizeof(float);
  d->buckets = remat__calloc((size_t)n + 1, sizeof *d->buckets);
  if (d->buckets == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int i = 0; i < n;) {
    dp_bucket_layout *b = &d->buckets[d->nbuckets];
    b->index = d->nbuckets++;
    int first = i;
    while (i < n) {
      int64_t numel = r->low->bufs[gi[i].buf].bytes / 4;
      if ((i > first && b->numel + numel > limit) ||
          b->numel + numel > DP_MAX_COUNT)
        break;
      b->numel += numel;
      i++;
    }
    if (i == first) /* one gradient that no allreduce can carry */
      return remat__fail(REMAT_ERR_LIMIT,
                         "remat_compile: a gradient of %lld floats is more "
                         "than one data-parallel allreduce carries (2^30)",
                         (long long)(r->low->bufs[gi[i].buf].bytes / 4));
    b->ngrads = i - first;
    b->grads = remat__malloc((size_t)b->ngrads * sizeof *b->grads);
    if (b->grads == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < b->ngrads; k++)
      b->grads[k] = gi[first + k].buf;
  }
  return REMAT_OK;
}

/* Bucket b's task: after every writer of its gradients, before every later
 * user of them. */
static remat_status bucket_edges(const dp_layout_request *r, sched_dag *dag,
                                 dp_bucket_layout *b) {
  const plan_lowering *low = r->low;
  int32_t last = -1;
  for (int32_t k = 0; k < low->nknodes; k++)
    for (int i = 0; i < b->ngrads; i++) {
      bool w = false;
      if (node_uses(&low->knodes[k], b->grads[i], &w) && w)
        last = k;
    }
  b->task = sched_dag_add(dag, r->bucket_body, b, -last, -1, "dp.allreduce",
                          "comm");
  if (b->task < 0)
    return (remat_status)-b->task;
  remat_status s = sched_dag_set_async(dag, b->task);
  for (int32_t k = 0; s == REMAT_OK && k < low->nknodes; k++) {
    bool uses = false, writes = false;
    for (int i = 0; i < b->ngrads && !writes; i++) {
      bool w = false;
      if (node_uses(&low->knodes[k], b->grads[i], &w)) {
        uses = true;
        writes = writes || w;
      }
    }
    if (uses && k <= last)
      s = sched_dag_edge(dag, r->tasks->done_task[k], b->task);
    else if (uses)
      s = sched_dag_edge(dag, b->task, r->tasks->start_task[k]);
  }
  return s;
}

/* The agreement: after every node but the gate and the updates (so after
 * every allocation, check and bucket), before the gate. */
static remat_status agree_edges(const dp_layout_request *r, sched_dag *dag,
                                plan_dp *d) {
  const plan_lowering *low = r->low;
  int32_t gate = -1, last = 0;
  for (int32_t k = 0; k < low->nknodes; k++) {
    knode_kind kind = low->knodes[k].kind;
    if (kind == KNODE_GATE)
      gate = k;
    else if (kind != KNODE_UPDATE)
      last = k;
  }
  d->agree_task = sched_dag_add(dag, r->agree_body, d, -last, -1, "dp.agree",
                                "comm");
  if (d->agree_task < 0)
    return (remat_status)-d->agree_task;
  remat_status s = sched_dag_set_async(dag, d->agree_task);
  for (int32_t k = 0; s == REMAT_OK && k < low->nknodes; k++) {
    knode_kind kind = low->knodes[k].kind;
    if (kind != KNODE_GATE && kind != KNODE_UPDATE)
      s = sched_dag_edge(dag, r->tasks->done_task[k], d->agree_task);
  }
  for (int i = 0; s == REMAT_OK && i < d->nbuckets; i++)
    s = sched_dag_edge(dag, d->buckets[i].task, d->agree_task);
  if (s == REMAT_OK && gate >= 0)
    s = sched_dag_edge(dag, d->agree_task, r->tasks->start_task[gate]);
  return s;
}

int64_t dp_layout_bytes(const plan_dp *d) {
  int64_t bytes = 0;
  for (int i = 0; i < d->nbuckets; i++)
    bytes += mem_block_bytes((d->buckets[i].numel + 1) * 4);
  return bytes;
}

int64_t dp_layout_bound(const plan_lowering *l) {
  int64_t bytes = 0;
  for (int32_t b = 0; b < l->nbufs; b++)
    if (l->bufs[b].cat == REMAT_MEM_GRADS && l->bufs[b].persistent)
      bytes += mem_block_bytes(l->bufs[b].bytes + 4);
  return bytes;
}

remat_status dp_layout_build(const dp_layout_request *req, sched_dag *dag,
                             plan_dp *out) {
  memset(out, 0, sizeof *out);
  out->agree_task = -1;
  int n = 0;
  grad_info *gi = gradients(req, &n);
  remat_status s =
      gi != NULL ? make_buckets(req, out, gi, n) : REMAT_ERR_OUT_OF_MEMORY;
  free(gi);
  for (int i = 0; s == REMAT_OK && i < out->nbuckets; i++)
    s = bucket_edges(req, dag, &out->buckets[i]);
  if (s == REMAT_OK)
    s = agree_edges(req, dag, out);
  if (s != REMAT_OK) {
    plan_dp_free(out);
    if (s != REMAT_ERR_LIMIT)
      remat__fail(s, "remat_compile: cannot add the data-parallel tasks (%s)",
                  remat_status_string(s));
    return s;
  }
  return REMAT_OK;
}

void plan_dp_free(plan_dp *d) {
  for (int i = 0; d->buckets != NULL && i < d->nbuckets; i++)
    free(d->buckets[i].grads);
  free(d->buckets);
  memset(d, 0, sizeof *d);
  d->agree_task = -1;
}
