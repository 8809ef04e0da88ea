/* Data parallel over MPI (remat_mpi.h, dp.h): the graph's communicator,
 * the allreduce buckets and agreement task that the DAG stage adds, the
 * first step's broadcast of rank 0's parameters, and the status every rank
 * agrees on after a step. The communication itself runs on the thread of
 * mpi_comm.c. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "remat_mpi.h"
#include "runtime/dp/dp.h"
#include "runtime/dp/dp_failure.h"
#include "runtime/dp/mpi_comm.h"
#include "runtime/exec/node_copies.h"
#include "runtime/exec/precision.h"

#define DEFAULT_BUCKET_BYTES (INT64_C(4) << 20)
#define DEFAULT_TIMEOUT_S 60.0
#define MAX_COUNT (INT64_C(1) << 30) /* floats in one bucket (an int count) */

typedef struct dp_graph {
  MPI_Comm comm;
  int rank, size;
  int64_t bucket_bytes; /* remat_graph_dp_bucket_bytes, the environment's
                           or the default */
  double timeout_s;     /* REMAT_DP_TIMEOUT or the default */
} dp_graph;

/* REMAT_DP_BUCKET_BYTES and REMAT_DP_TIMEOUT, checked: a bad value is an
 * error naming the variable and what it accepts. Neither is read under
 * REMAT_SET_NO_ENV. */
static remat_status read_env(dp_graph *d, const remat_runtime *rt) {
  d->bucket_bytes = DEFAULT_BUCKET_BYTES;
  d->timeout_s = DEFAULT_TIMEOUT_S;
  if (rt->config.set & REMAT_SET_NO_ENV)
    return REMAT_OK;
  const char *v = getenv("REMAT_DP_BUCKET_BYTES");
  int64_t bytes = 0;
  if (v != NULL && (remat_parse_bytes(v, &bytes) != REMAT_OK || bytes < 4 ||
                    bytes > MAX_COUNT * 4))
    return remat__fail(REMAT_ERR_CONFIG,
                       "remat_graph_data_parallel: REMAT_DP_BUCKET_BYTES='%s' "
                       "is not a byte size from 4 to 4GiB (e.g. 1MiB)",
                       v);
  if (v != NULL)
    d->bucket_bytes = bytes;
  v = getenv("REMAT_DP_TIMEOUT");
  if (v != NULL) {
    char *end;
    double t = strtod(v, &end);
    if (end == v || *end != '\0' || !(t > 0.0 && t <= 1e6))
      return remat__fail(REMAT_ERR_CONFIG,
                         "remat_graph_data_parallel: REMAT_DP_TIMEOUT='%s' "
                         "is not a number of seconds above 0 (at most 1e6)",
                         v);
    d->timeout_s = t;
  }
  return REMAT_OK;
}

/* The agreement: loss summed, flags maxed over ranks. */
/* Reduced with MPI_MAX: any rank's NaN/Inf, and the failure to report
 * (dp_failure.h: a status paired with the rank that had it). */
enum { FLAG_NONFINITE, FLAG_FAILURE, NFLAGS };

typedef struct dp_bucket {
  struct dp_plan *dp;
  int index;        /* its item */
  int32_t *grads;   /* grad buffers */
  int ngrads;
  int64_t numel;
  float *data;
  int32_t task;
} dp_bucket;

typedef struct dp_plan {
  const compiled_step *c; /* the step whose gradients it averages */
  step_state *s;          /* the state it reads and writes them in */
  dp_graph *cfg;
  dp_bucket *buckets;
  int nbuckets;
  int32_t agree_task;
  double loss;           /* agreement item buffers */
  int flags[NFLAGS];
  comm_thread comm;
  bool synced;           /* parameters broadcast */
  int64_t steps, bytes;
  double comm_s, exposed_s;
} dp_plan;

/* ---- the public calls ---- */

remat_status remat_graph_data_parallel(remat_graph *g, MPI_Comm comm) {
  if (g == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_graph_data_parallel: graph is NULL");
  if (g->compiled || g->dp != NULL)
    return remat__fail(REMAT_ERR_STATE,
                       "remat_graph_data_parallel: call it once, before "
                       "remat_compile");
  int init = 0, fin = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init)
    MPI_Query_thread(&level);
  if (!init || fin || level < MPI_THREAD_MULTIPLE)
    return remat__fail(REMAT_ERR_STATE,
                       "remat_graph_data_parallel: MPI must be initialized "
                       "with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) "
                       "and not finalized (initialized %d, thread level %d, "
                       "MPI_THREAD_MULTIPLE is %d)",
                       init, level, MPI_THREAD_MULTIPLE);
  dp_graph *d = remat__calloc(1, sizeof *d);
  if (d == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "remat_graph_data_parallel: out of memory");
  remat_status s = read_env(d, g->rt);
  if (s != REMAT_OK) {
    free(d);
    return s;
  }
  int rc = MPI_Comm_dup(comm, &d->comm);
  if (rc != MPI_SUCCESS) {
    free(d);
    return remat__fail(REMAT_ERR_BACKEND,
                       "remat_graph_data_parallel: MPI_Comm_dup failed");
  }
  MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(d->comm, &d->rank);
  MPI_Comm_size(d->comm, &d->size);
  if (d->size > INT_MAX / (DP_FAILURE_OOM_RANK + 1)) { /* dp_failure_key */
    int size = d->size;
    MPI_Comm_free(&d->comm);
    free(d);
    return remat__fail(REMAT_ERR_LIMIT,
                       "remat_graph_data_parallel: %d ranks, more than the "
                       "%d supported", size,
                       INT_MAX / (DP_FAILURE_OOM_RANK + 1));
  }
  g->dp = d;
  return REMAT_OK;
}

remat_status remat_graph_dp_bucket_bytes(remat_graph *g, int64_t bytes) {
  if (g == NULL || g->dp == NULL || g->compiled || bytes < 4 ||
      bytes > MAX_COUNT * 4)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_graph_dp_bucket_bytes: needs a data-parallel "
                       "graph not yet compiled and 4 <= bytes <= 4 GiB");
  g->dp->bucket_bytes = bytes;
  return REMAT_OK;
}

remat_status remat_graph_dp_stats(const remat_graph *g, remat_dp_stats *out) {
  if (g == NULL || out == NULL)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_graph_dp_stats: graph or out is NULL");
  if (g->dp == NULL || g->step == NULL || g->step->state.dp == NULL)
    return remat__fail(REMAT_ERR_STATE,
                       "remat_graph_dp_stats: the graph is not a compiled "
                       "data-parallel training graph");
  const dp_plan *d = g->step->state.dp;
  *out = (remat_dp_stats){.world_size = g->dp->size,
                          .rank = g->dp->rank,
                          .buckets = d->nbuckets,
                          .steps = d->steps,
                          .comm_bytes = d->bytes,
                          .comm_s = d->comm_s,
                          .exposed_comm_s = d->exposed_s};
  return REMAT_OK;
}

void dp_graph_free(remat_graph *g) {
  if (g->dp == NULL)
    return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin)
    MPI_Comm_free(&g->dp->comm);
  free(g->dp);
  g->dp = NULL;
}

/* ---- task bodies and completions ---- */

static const plan_buffer *buffer(const compiled_step *c, int32_t b) {
  return &c->low.bufs[b];
}

/* Runs on a worker when every gradient of the bucket is final. */
static int bucket_task(void *context, void *arg, int worker) {
  (void)context;
  (void)worker;
  dp_bucket *b = arg;
  const dp_plan *d = b->dp;
  int64_t off = 0;
  for (int i = 0; i < b->ngrads; i++) {
    const plan_buffer *g = buffer(d->c, b->grads[i]);
    const float *data = d->s->data[b->grads[i]];
    int64_t n = g->bytes / (int64_t)sizeof(float);
    if (data != NULL)
      memcpy(b->data + off, data, (size_t)g->bytes);
    else
      memset(b->data + off, 0, (size_t)g->bytes);
    off += n;
  }
  comm_ready(&b->dp->comm, b->index, true);
  return 0;
}

static float local_loss(const dp_plan *d) {
  if (d->c->loss < 0)
    return 0.0f;
  int32_t b = d->c->low.value_buf[d->c->loss];
  return precision_get1(&d->c->low.bufs[b], d->s->data[b]);
}

/* The agreement's local values: this rank's loss, NaN/Inf, failure. */
static void agree_fill(dp_plan *d, int status) {
  float loss = local_loss(d);
  d->loss = (double)loss;
  d->flags[FLAG_NONFINITE] = atomic_load(&d->s->nonfinite) || !isfinite(loss);
  d->flags[FLAG_FAILURE] = dp_failure_key(status, d->cfg->rank, d->cfg->size);
}

/* Runs on a worker after every other node but the gate and the updates. */
static int agree_task(void *context, void *arg, int worker) {
  (void)context;
  (void)worker;
  dp_plan *d = arg;
  agree_fill(d, sched_run_failure(d->c->g->rt->pool));
  comm_ready(&d->comm, d->nbuckets, true);
  return 0;
}

/* On the communication thread: the averaged gradients go back to their
 * buffers; the agreed loss and flags decide the update. */
static void item_done(void *ctx, int i) {
  dp_plan *d = ctx;
  const compiled_step *c = d->c;
  comm_item *it = &d->comm.items[i];
  float scale = 1.0f / (float)d->cfg->size;
  if (i < d->nbuckets) {
    dp_bucket *b = &d->buckets[i];
    int64_t off = 0;
    for (int k = 0; k < b->ngrads; k++) {
      float *data = d->s->data[b->grads[k]];
      int64_t n = buffer(c, b->grads[k])->bytes / (int64_t)sizeof(float);
      for (int64_t j = 0; data != NULL && j < n; j++)
        data[j] = b->data[off + j] * scale;
      off += n;
    }
  } else {
    if (c->loss >= 0) {
      int32_t lb = c->low.value_buf[c->loss];
      precision_set1(&c->low.bufs[lb], d->s->data[lb],
                     (float)(d->loss / (double)d->cfg->size));
    }
    if (d->flags[FLAG_NONFINITE] || d->flags[FLAG_FAILURE] >= 0 ||
        d->comm.broken)
      atomic_store(&d->s->nonfinite, 1); /* no rank updates */
  }
  if (it->by_task)
    sched_complete(c->g->rt->pool,
                   i < d->nbuckets ? d->buckets[i].task : d->agree_task);
}

/* ---- stage "DAG": buckets and the agreement ---- */

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
static grad_info *gradients(const compiled_step *p, int *count) {
  const remat_graph *g = p->g;
  grad_info *gi = remat__malloc(((size_t)g->ntensors + 1) * sizeof *gi);
  if (gi == NULL)
    return NULL;
  int n = 0;
  for (int32_t t = 0; t < g->ntensors; t++) {
    int32_t b = p->low.grad_buf[t];
    if (g->tensors[t]->kind != TENSOR_PARAM || b < 0)
      continue;
    int32_t last = -1;
    for (int32_t k = 0; k < p->low.nknodes; k++) {
      bool w = false;
      if (node_uses(&p->low.knodes[k], b, &w) && w)
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
static remat_status make_buckets(dp_plan *d, const grad_info *gi, int n) {
  const compiled_step *p = d->c;
  int64_t limit = d->cfg->bucket_bytes / (int64_t)sizeof(float);
  d->buckets = remat__calloc((size_t)n + 1, sizeof *d->buckets);
  if (d->buckets == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int i = 0; i < n;) {
    dp_bucket *b = &d->buckets[d->nbuckets];
    b->dp = d;
    b->index = d->nbuckets++;
    int first = i;
    while (i < n && (i == first || b->numel + buffer(p, gi[i].buf)->bytes / 4 <=
                                       limit) &&
           b->numel + buffer(p, gi[i].buf)->bytes / 4 <= MAX_COUNT) {
      b->numel += buffer(p, gi[i].buf)->bytes / 4;
      i++;
    }
    b->ngrads = i - first;
    b->grads = remat__malloc((size_t)b->ngrads * sizeof *b->grads);
    b->data = remat__malloc((size_t)b->numel * sizeof *b->data);
    if (b->grads == NULL || b->data == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < b->ngrads; k++)
      b->grads[k] = gi[first + k].buf;
  }
  return REMAT_OK;
}

/* Bucket b's task: after every writer of its gradients, before every later
 * user of them. */
static remat_status bucket_edges(dp_plan *d, sched_dag *dag, dp_bucket *b) {
  const compiled_step *p = d->c;
  int32_t last = -1;
  for (int32_t k = 0; k < p->low.nknodes; k++)
    for (int i = 0; i < b->ngrads; i++) {
      bool w = false;
      if (node_uses(&p->low.knodes[k], b->grads[i], &w) && w)
        last = k;
    }
  b->task = sched_dag_add(dag, bucket_task, b, -last, -1, "dp.allreduce",
                          "comm");
  if (b->task < 0)
    return (remat_status)-b->task;
  remat_status s = sched_dag_set_async(dag, b->task);
  for (int32_t k = 0; s == REMAT_OK && k < p->low.nknodes; k++) {
    bool uses = false, writes = false;
    for (int i = 0; i < b->ngrads && !writes; i++) {
      bool w = false;
      if (node_uses(&p->low.knodes[k], b->grads[i], &w)) {
        uses = true;
        writes = writes || w;
      }
    }
    if (uses && k <= last)
      s = sched_dag_edge(dag, p->tasks.done_task[k], b->task);
    else if (uses)
      s = sched_dag_edge(dag, b->task, p->tasks.start_task[k]);
  }
  return s;
}

/* The agreement: after every node but the gate and the updates (so after
 * every allocation, check and bucket), before the gate. */
static remat_status agree_edges(dp_plan *d, sched_dag *dag) {
  const compiled_step *p = d->c;
  int32_t gate = -1, last = 0;
  for (int32_t k = 0; k < p->low.nknodes; k++) {
    knode_kind kind = p->low.knodes[k].kind;
    if (kind == KNODE_GATE)
      gate = k;
    else if (kind != KNODE_UPDATE)
      last = k;
  }
  d->agree_task = sched_dag_add(dag, agree_task, d, -last, -1, "dp.agree",
                                "comm");
  if (d->agree_task < 0)
    return (remat_status)-d->agree_task;
  remat_status s = sched_dag_set_async(dag, d->agree_task);
  for (int32_t k = 0; s == REMAT_OK && k < p->low.nknodes; k++) {
    knode_kind kind = p->low.knodes[k].kind;
    if (kind != KNODE_GATE && kind != KNODE_UPDATE)
      s = sched_dag_edge(dag, p->tasks.done_task[k], d->agree_task);
  }
  for (int i = 0; s == REMAT_OK && i < d->nbuckets; i++)
    s = sched_dag_edge(dag, d->buckets[i].task, d->agree_task);
  if (s == REMAT_OK && gate >= 0)
    s = sched_dag_edge(dag, d->agree_task, p->tasks.start_task[gate]);
  return s;
}

static remat_status make_items(dp_plan *d) {
  comm_thread *c = &d->comm;
  c->items = remat__calloc((size_t)d->nbuckets + 1, sizeof *c->items);
  if (c->items == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  c->nitems = d->nbuckets + 1;
  for (int i = 0; i < d->nbuckets; i++)
    c->items[i] = (comm_item){.buf = d->buckets[i].data,
                              .count = (int)d->buckets[i].numel,
                              .type = MPI_FLOAT,
                              .op = MPI_SUM,
                              .bytes = d->buckets[i].numel * 4};
  c->items[d->nbuckets] =
      (comm_item){.buf = &d->loss, .count = 1, .type = MPI_DOUBLE,
                  .op = MPI_SUM, .buf2 = d->flags, .count2 = NFLAGS,
                  .type2 = MPI_INT, .op2 = MPI_MAX,
                  .bytes = sizeof d->loss + sizeof d->flags};
  c->comm = d->cfg->comm;
  c->done = item_done;
  c->ctx = d;
  c->timeout_s = d->cfg->timeout_s;
  return REMAT_OK;
}

remat_status dp_add_tasks(const compiled_step *c, step_state *state,
                          sched_dag *dag, struct dp_plan **out) {
  *out = NULL;
  if (c->g->dp == NULL || c->forward_only)
    return REMAT_OK;
  dp_plan *d = remat__calloc(1, sizeof *d);
  if (d == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "remat_compile: out of memory for data parallel");
  *out = d;
  d->c = c;
  d->s = state;
  d->cfg = c->g->dp;
  int n = 0;
  grad_info *gi = gradients(c, &n);
  remat_status s = gi != NULL ? make_buckets(d, gi, n) : REMAT_ERR_OUT_OF_MEMORY;
  free(gi);
  for (int i = 0; s == REMAT_OK && i < d->nbuckets; i++)
    s = bucket_edges(d, dag, &d->buckets[i]);
  if (s == REMAT_OK)
    s = agree_edges(d, dag);
  if (s == REMAT_OK)
    s = make_items(d);
  if (s != REMAT_OK)
    return remat__fail(s, "remat_compile: cannot add the data-parallel "
                          "tasks (%s)", remat_status_string(s));
  if (!comm_start(&d->comm))
    return remat__fail(REMAT_ERR_BACKEND, "remat_compile: %s",
                       d->comm.errmsg);
  return REMAT_OK;
}

void dp_plan_free(struct dp_plan *d) {
  if (d == NULL)
    return;
  comm_stop(&d->comm);
  for (int i = 0; d->buckets != NULL && i < d->nbuckets; i++) {
    free(d->buckets[i].grads);
    free(d->buckets[i].data);
  }
  free(d->buckets);
  free(d->comm.items);
  free(d);
}

/* ---- steps ---- */

/* Rank 0's parameters and optimizer moments to every rank. */
static remat_status broadcast_params(dp_plan *d) {
  const compiled_step *p = d->c;
  for (int32_t b = 0; b < p->low.nbufs; b++) {
    const plan_buffer *buf = &p->low.bufs[b];
    float *data = d->s->data[b];
    bool param = buf->tensor >= 0 && p->low.value_buf[buf->tensor] == b &&
                 p->g->tensors[buf->tensor]->kind == TENSOR_PARAM;
    if (!param && buf->cat != REMAT_MEM_OPTIMIZER)
      continue;
    if (!buf->persistent || data == NULL)
      continue;
    int64_t n = buf->bytes / (int64_t)sizeof(float);
    for (int64_t off = 0; off < n; off += MAX_COUNT) {
      int count = (int)(n - off < MAX_COUNT ? n - off : MAX_COUNT);
      int rc = MPI_Bcast(data + off, count, MPI_FLOAT, 0, d->cfg->comm);
      if (rc != MPI_SUCCESS)
        return remat__fail(REMAT_ERR_BACKEND,
                           "remat_step: broadcasting rank 0's parameters "
                           "failed (MPI error %d)",
                           rc);
    }
    if (param)
      node_copies_refresh(p, d->s, b, 0, 0, n);
  }
  return REMAT_OK;
}

remat_status dp_step_begin(const compiled_step *c, step_state *state) {
  (void)c;
  dp_plan *d = state->dp;
  if (d == NULL)
    return REMAT_OK;
  if (d->comm.broken)
    return remat__fail(REMAT_ERR_BACKEND,
                       "remat_step: data parallel stopped after an earlier "
                       "failure: %s",
                       d->comm.errmsg);
  if (!d->synced) {
    remat_status s = broadcast_params(d);
    if (s != REMAT_OK)
      return s;
    d->synced = true;
    state->params_written = true; /* rank 0's weights: new bf16 copies */
  }
  comm_begin_step(&d->comm);
  return REMAT_OK;
}

static void add_step_stats(dp_plan *d) {
  comm_thread *c = &d->comm;
  double last_ready = 0.0, last_done = 0.0;
  for (int i = 0; i < c->nitems; i++) {
    comm_item *it = &c->items[i];
    d->comm_s += it->t_done - it->t_start;
    d->bytes += it->bytes;
    if (i < d->nbuckets) {
      last_ready = it->t_ready > last_ready ? it->t_ready : last_ready;
      last_done = it->t_done > last_done ? it->t_done : last_done;
    }
  }
  comm_item *agree = &c->items[d->nbuckets];
  double exposed = last_done > last_ready ? last_done - last_ready : 0.0;
  d->exposed_s += exposed + (agree->t_done - agree->t_ready);
  d->steps++;
}

remat_status dp_step_end(const compiled_step *c, step_state *state,
                         remat_status s, char *err, size_t err_size) {
  (void)c;
  dp_plan *d = state->dp;
  if (d == NULL)
    return s;
  bool agree_pending;
  pthread_mutex_lock(&d->comm.mu);
  agree_pending = !d->comm.items[d->nbuckets].ready;
  pthread_mutex_unlock(&d->comm.mu);
  if (agree_pending) /* the DAG did not run: join with this failure */
    agree_fill(d, s != REMAT_OK ? (int)s : REMAT_ERR_STATE);
  bool ok = comm_finish_step(&d->comm);
  add_step_stats(d);
  if (s != REMAT_OK)
    return s;
  if (!ok) {
    snprintf(err, err_size, "data parallel: %s", d->comm.errmsg);
    return REMAT_ERR_BACKEND;
  }
  int other, failed;
  if (dp_failure_of(d->flags[FLAG_FAILURE], d->cfg->size, &other, &failed)) {
    snprintf(err, err_size,
             "rank %d of %d failed (%s); no rank applied the update", failed,
             d->cfg->size, remat_status_string((remat_status)other));
    return (remat_status)other;
  }
  return REMAT_OK;
}
