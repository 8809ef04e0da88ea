/* Data parallel over MPI (remat_mpi.h, dp.h): the graph's communicator,
 * the bodies of the allreduce bucket and agreement tasks that compile
 * placed (compile/dp_layout.h) and their buffers, the first step's
 * broadcast of rank 0's parameters, and the status every rank agrees on
 * after a step. The communication itself runs on the thread of
 * mpi_comm.c. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "remat_mpi.h"
#include "runtime/dp/dp.h"
#include "runtime/dp/dp_check.h"
#include "runtime/dp/dp_failure.h"
#include "runtime/dp/mpi_comm.h"
#include "runtime/exec/node_copies.h"
#include "runtime/exec/precision.h"

#define DEFAULT_BUCKET_BYTES (INT64_C(4) << 20)
#define DEFAULT_TIMEOUT_S 60.0
#define MAX_COUNT DP_MAX_COUNT /* floats in one bucket (an int count) */

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

/* The agreement: loss summed, flags maxed over ranks. Reduced with
 * MPI_MAX: any rank's NaN/Inf, the failure to report (dp_failure.h: a
 * status paired with the rank that had it), and the values the update
 * uses, each with its negation (dp_check.h: their smallest and largest). */
enum { FLAG_NONFINITE, FLAG_FAILURE, FLAG_SHARED,
       NFLAGS = FLAG_SHARED + DP_SHARED_SLOTS };

typedef struct dp_plan {
  const compiled_step *c; /* the step whose gradients it averages */
  step_state *s;          /* the state it reads and writes them in */
  const plan_dp *layout;  /* c->dp: buckets and tasks */
  dp_graph *cfg;
  float **data;           /* [layout->nbuckets]: each bucket's floats */
  double loss;            /* agreement item buffers */
  int64_t flags[NFLAGS];
  bool shared_differ;     /* the agreement found the values apart: */
  char shared_msg[COMM_ERRMSG_MAX]; /* which, with the two values */
  comm_thread comm;
  dp_text desc;           /* the step's description (dp_check.h) */
  uint64_t desc_hash;
  bool synced;           /* checked alike and parameters broadcast */
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
  /* Collective like every later call: within the timeout. */
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Comm_idup(comm, &d->comm, &req);
  if (rc == MPI_SUCCESS)
    rc = comm_wait(&req, 1, d->timeout_s);
  if (rc == COMM_TIMED_OUT) /* d is left allocated: nothing cancels the
                              duplication, which may still write d->comm */
    return remat__fail(REMAT_ERR_BACKEND,
                       "remat_graph_data_parallel: duplicating the "
                       "communicator did not complete within %g s: a rank "
                       "died or has not called remat_graph_data_parallel",
                       d->timeout_s);
  if (rc != MPI_SUCCESS) {
    free(d);
    return remat__fail(REMAT_ERR_BACKEND,
                       "remat_graph_data_parallel: MPI_Comm_idup failed");
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
                          .buckets = d->layout->nbuckets,
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

int64_t dp_bucket_bytes(const remat_graph *g) {
  return g->dp != NULL ? g->dp->bucket_bytes : 0;
}

static const plan_buffer *buffer(const compiled_step *c, int32_t b) {
  return &c->low.bufs[b];
}

/* Runs on a worker when every gradient of the bucket is final. */
int dp_bucket_task(void *run, void *arg, int worker) {
  (void)worker;
  const step_run *r = run;
  const dp_bucket_layout *b = arg;
  dp_plan *d = r->s->dp;
  float *out = d->data[b->index];
  int64_t off = 0;
  for (int i = 0; i < b->ngrads; i++) {
    const plan_buffer *g = buffer(d->c, b->grads[i]);
    const float *data = d->s->data[b->grads[i]];
    int64_t n = g->bytes / (int64_t)sizeof(float);
    if (data != NULL)
      memcpy(out + off, data, (size_t)g->bytes);
    else
      memset(out + off, 0, (size_t)g->bytes);
    off += n;
  }
  comm_ready(&d->comm, b->index, true);
  return 0;
}

static float local_loss(const dp_plan *d) {
  if (d->c->loss < 0)
    return 0.0f;
  int32_t b = d->c->low.value_buf[d->c->loss];
  return precision_get1(&d->c->low.bufs[b], d->s->data[b]);
}

/* The agreement's local values: this rank's loss, NaN/Inf, failure, and
 * the values its update would use. */
static void agree_fill(dp_plan *d, int status, bool accumulate) {
  float loss = local_loss(d);
  const step_state *s = d->s;
  d->loss = (double)loss;
  d->flags[FLAG_NONFINITE] = atomic_load(&s->nonfinite) || !isfinite(loss);
  d->flags[FLAG_FAILURE] = dp_failure_key(status, d->cfg->rank, d->cfg->size);
  dp_shared_pack(d->flags + FLAG_SHARED, s->lr, s->clip, accumulate,
                 s->accum_count, s->opt_step);
}

/* Runs on a worker after every other node but the gate and the updates. */
int dp_agree_task(void *run, void *arg, int worker) {
  (void)arg;
  (void)worker;
  const step_run *r = run;
  dp_plan *d = r->s->dp;
  agree_fill(d, sched_run_failure(d->c->g->rt->pool, d->c->tasks.dag),
             r->mode == RUN_ACCUMULATE);
  comm_ready(&d->comm, d->layout->nbuckets, true);
  return 0;
}

/* On the communication thread: the averaged gradients go back to their
 * buffers; the agreed loss and flags decide the update. */
static void item_done(void *ctx, int i) {
  dp_plan *d = ctx;
  const compiled_step *c = d->c;
  const plan_dp *layout = d->layout;
  comm_item *it = &d->comm.items[i];
  float scale = 1.0f / (float)d->cfg->size;
  if (i < layout->nbuckets) {
    const dp_bucket_layout *b = &layout->buckets[i];
    int64_t off = 0;
    for (int k = 0; k < b->ngrads; k++) {
      float *data = d->s->data[b->grads[k]];
      int64_t n = buffer(c, b->grads[k])->bytes / (int64_t)sizeof(float);
      for (int64_t j = 0; data != NULL && j < n; j++)
        data[j] = d->data[i][off + j] * scale;
      off += n;
    }
  } else {
    if (c->loss >= 0) {
      int32_t lb = c->low.value_buf[c->loss];
      precision_set1(&c->low.bufs[lb], d->s->data[lb],
                     (float)(d->loss / (double)d->cfg->size));
    }
    d->shared_differ = dp_shared_differ(d->flags + FLAG_SHARED,
                                        d->shared_msg, sizeof d->shared_msg);
    if (d->flags[FLAG_NONFINITE] || d->flags[FLAG_FAILURE] >= 0 ||
        d->shared_differ || d->comm.broken)
      atomic_store(&d->s->nonfinite, 1); /* no rank updates */
  }
  if (it->by_task)
    sched_complete(c->g->rt->pool, c->tasks.dag,
                   i < layout->nbuckets ? layout->buckets[i].task
                                        : layout->agree_task);
}

/* ---- the state: buckets' buffers and the communication thread ---- */

static remat_status make_items(dp_plan *d) {
  comm_thread *c = &d->comm;
  int nb = d->layout->nbuckets;
  c->items = remat__calloc((size_t)nb + 1, sizeof *c->items);
  if (c->items == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  c->nitems = nb + 1;
  for (int i = 0; i < nb; i++)
    c->items[i] = (comm_item){.buf = d->data[i],
                              .count = (int)d->layout->buckets[i].numel,
                              .type = MPI_FLOAT,
                              .op = MPI_SUM,
                              .bytes = d->layout->buckets[i].numel * 4};
  c->items[nb] =
      (comm_item){.buf = &d->loss, .count = 1, .type = MPI_DOUBLE,
                  .op = MPI_SUM, .buf2 = d->flags, .count2 = NFLAGS,
                  .type2 = MPI_INT64_T, .op2 = MPI_MAX,
                  .bytes = sizeof d->loss + sizeof d->flags};
  c->comm = d->cfg->comm;
  c->done = item_done;
  c->ctx = d;
  c->timeout_s = d->cfg->timeout_s;
  return REMAT_OK;
}

/* Bucket i's buffer: its gradients and one float more. */
static size_t bucket_bytes(const dp_plan *d, int i) {
  return ((size_t)d->layout->buckets[i].numel + 1) * sizeof(float);
}

static remat_status make_state(dp_plan *d) {
  int nb = d->layout->nbuckets;
  d->data = remat__calloc((size_t)nb + 1, sizeof *d->data);
  if (d->data == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int i = 0; i < nb; i++) { /* from the arena: in peak_bytes */
    d->data[i] = mem_alloc(&d->s->arena, bucket_bytes(d, i),
                           REMAT_MEM_GRADS, 0, false);
    if (d->data[i] == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
  }
  return make_items(d);
}

remat_status dp_state_create(const compiled_step *c, step_state *state,
                             struct dp_plan **out) {
  *out = NULL;
  if (c->g->dp == NULL || c->dp.agree_task < 0)
    return REMAT_OK;
  dp_plan *d = remat__calloc(1, sizeof *d);
  if (d == NULL)
    return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                       "remat_compile: out of memory for data parallel");
  d->c = c;
  d->s = state;
  d->layout = &c->dp;
  d->cfg = c->g->dp;
  remat_status s = make_state(d);
  if (s != REMAT_OK) {
    dp_plan_free(d);
    return remat__fail(s, "remat_compile: out of memory for the "
                          "data-parallel buckets");
  }
  s = dp_describe_step(c, &d->desc);
  if (s != REMAT_OK) {
    dp_plan_free(d);
    return remat__fail(s, "remat_compile: %s the description of the step "
                          "that the ranks compare",
                       s == REMAT_ERR_LIMIT ? "more than 1 GiB in"
                                            : "out of memory for");
  }
  d->desc_hash = dp_text_hash(d->desc.text, d->desc.len);
  if (!comm_start(&d->comm)) {
    remat_status e = remat__fail(REMAT_ERR_BACKEND, "remat_compile: %s",
                                 d->comm.errmsg);
    dp_plan_free(d);
    return e;
  }
  *out = d;
  return REMAT_OK;
}

void dp_plan_free(struct dp_plan *d) {
  if (d == NULL)
    return;
  comm_stop(&d->comm);
  for (int i = 0; d->data != NULL && i < d->layout->nbuckets; i++)
    if (d->data[i] != NULL)
      mem_free(&d->s->arena, d->data[i], bucket_bytes(d, i),
               REMAT_MEM_GRADS, 0, false);
  free(d->data);
  free(d->comm.items);
  dp_text_free(&d->desc);
  free(d);
}

/* ---- steps ---- */

/* A collective of the first step that failed or timed out: from now on
 * every step fails at once (the others may still wait on it). */
static remat_status first_step_failed(dp_plan *d, const char *what, int rc) {
  char msg[COMM_ERRMSG_MAX];
  if (rc == COMM_TIMED_OUT)
    snprintf(msg, sizeof msg,
             "%s did not complete within %g s: a rank died, stopped "
             "stepping or has not started its first step",
             what, d->cfg->timeout_s);
  else
    snprintf(msg, sizeof msg, "%s failed", what);
  comm_break(&d->comm, msg, rc);
  return remat__fail(REMAT_ERR_BACKEND, "remat_step: %s", d->comm.errmsg);
}

/* Waits for the n collectives just started (rc: how their start went). */
static int finish(dp_plan *d, MPI_Request *req, int n, int rc) {
  return rc == MPI_SUCCESS ? comm_wait(req, n, d->cfg->timeout_s) : rc;
}

#define CHECK_WHAT "the first step's check that every rank built the same step"

/* The ranks built different steps: rank 0's description and that of the
 * first rank whose description differs go to every rank, so that every
 * rank names the same first difference. */
static remat_status name_difference(dp_plan *d) {
  MPI_Comm comm = d->cfg->comm;
  uint64_t first[2] = {d->desc_hash, d->desc.len};
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int rc = finish(d, req, 1,
                  MPI_Ibcast(first, 2, MPI_UINT64_T, 0, comm, &req[0]));
  int differs = first[0] != d->desc_hash || first[1] != d->desc.len
                    ? d->cfg->rank
                    : INT_MAX;
  if (rc == MPI_SUCCESS)
    rc = finish(d, req, 1, MPI_Iallreduce(MPI_IN_PLACE, &differs, 1, MPI_INT,
                                          MPI_MIN, comm, &req[0]));
  uint64_t other_len = d->desc.len; /* the differing rank's, learned next */
  if (rc == MPI_SUCCESS && differs != INT_MAX)
    rc = finish(d, req, 1, MPI_Ibcast(&other_len, 1, MPI_UINT64_T, differs,
                                      comm, &req[0]));
  if (rc != MPI_SUCCESS)
    return first_step_failed(d, CHECK_WHAT, rc);
  if (differs == INT_MAX) /* equal hashes and lengths after all */
    return REMAT_OK;
  /* Every length is at most DP_MAX_DESCRIPTION (dp_describe_step). */
  bool mine0 = d->cfg->rank == 0, mine1 = d->cfg->rank == differs;
  char *text0 = mine0 ? d->desc.text : remat__malloc((size_t)first[1] + 1);
  char *text1 = mine1 ? d->desc.text : remat__malloc((size_t)other_len + 1);
  int ok = text0 != NULL && text1 != NULL;
  rc = finish(d, req, 1, MPI_Iallreduce(MPI_IN_PLACE, &ok, 1, MPI_INT,
                                        MPI_MIN, comm, &req[0]));
  if (rc == MPI_SUCCESS && ok) {
    rc = MPI_Ibcast(text0, (int)first[1], MPI_CHAR, 0, comm, &req[0]);
    if (rc == MPI_SUCCESS)
      rc = finish(d, req, 2, MPI_Ibcast(text1, (int)other_len, MPI_CHAR,
                                        differs, comm, &req[1]));
  }
  char diff[REMAT__ERRMSG_MAX] = "";
  if (rc == MPI_SUCCESS && ok)
    dp_first_difference(text1, (size_t)other_len, differs, text0,
                        (size_t)first[1], 0, diff, sizeof diff);
  if (!mine0)
    free(text0);
  if (!mine1)
    free(text1);
  if (rc != MPI_SUCCESS)
    return first_step_failed(d, CHECK_WHAT, rc);
  if (!ok)
    return remat__fail(REMAT_ERR_INVALID_ARG,
                       "remat_step: the ranks built different steps (rank "
                       "%d's differs from rank 0's; out of memory for "
                       "naming the difference); no rank stepped",
                       differs);
  return remat__fail(REMAT_ERR_INVALID_ARG,
                     "remat_step: the ranks built different steps: %s; no "
                     "rank stepped",
                     diff);
}

/* Before the first broadcast: the largest and smallest of every rank's
 * description hash and length, fixed-size, so that ranks that built
 * different steps learn it without sending anything sized by their
 * step. */
static remat_status check_same_step(dp_plan *d) {
  uint64_t mine[2] = {d->desc_hash, d->desc.len}, hi[2], lo[2];
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int rc = MPI_Iallreduce(mine, hi, 2, MPI_UINT64_T, MPI_MAX, d->cfg->comm,
                          &req[0]);
  if (rc == MPI_SUCCESS)
    rc = MPI_Iallreduce(mine, lo, 2, MPI_UINT64_T, MPI_MIN, d->cfg->comm,
                        &req[1]);
  rc = finish(d, req, 2, rc);
  if (rc != MPI_SUCCESS)
    return first_step_failed(d, CHECK_WHAT, rc);
  if (hi[0] == lo[0] && hi[1] == lo[1])
    return REMAT_OK;
  return name_difference(d);
}

/* Rank 0's parameters and optimizer moments to every rank, each
 * broadcast within the timeout. */
static remat_status broadcast_params(dp_plan *d) {
  const compiled_step *c = d->c;
  for (int32_t b = 0; b < c->low.nbufs; b++) {
    const plan_buffer *buf = &c->low.bufs[b];
    char *data = (char *)d->s->data[b];
    if (!dp_broadcast_buffer(c, b) || data == NULL)
      continue;
    /* a frozen parameter may be stored in bf16 */
    int64_t size = op_dtype_size(buf->dtype), n = buf->bytes / size;
    MPI_Datatype type = buf->dtype == OP_BF16 ? MPI_UINT16_T : MPI_FLOAT;
    for (int64_t off = 0; off < n; off += MAX_COUNT) {
      int count = (int)(n - off < MAX_COUNT ? n - off : MAX_COUNT);
      MPI_Request req = MPI_REQUEST_NULL;
      int rc = finish(d, &req, 1, MPI_Ibcast(data + off * size, count, type, 0,
                                             d->cfg->comm, &req));
      if (rc != MPI_SUCCESS)
        return first_step_failed(d, "broadcasting rank 0's parameters", rc);
    }
    if (buf->cat != REMAT_MEM_OPTIMIZER)
      node_copies_refresh(c, d->s, b, 0, 0, n);
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
    remat_status s = check_same_step(d);
    if (s == REMAT_OK)
      s = broadcast_params(d);
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
    if (i < d->layout->nbuckets) {
      last_ready = it->t_ready > last_ready ? it->t_ready : last_ready;
      last_done = it->t_done > last_done ? it->t_done : last_done;
    }
  }
  comm_item *agree = &c->items[d->layout->nbuckets];
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
  agree_pending = !d->comm.items[d->layout->nbuckets].ready;
  pthread_mutex_unlock(&d->comm.mu);
  if (agree_pending) /* the DAG did not run: join with this failure (which
                       every rank reports before comparing the values) */
    agree_fill(d, s != REMAT_OK ? (int)s : REMAT_ERR_STATE, false);
  bool ok = comm_finish_step(&d->comm);
  add_step_stats(d);
  if (s != REMAT_OK)
    return s;
  if (!ok) {
    snprintf(err, err_size, "data parallel: %s", d->comm.errmsg);
    return REMAT_ERR_BACKEND;
  }
  int other, failed;
  if (dp_failure_of((int)d->flags[FLAG_FAILURE], d->cfg->size, &other,
                    &failed)) {
    snprintf(err, err_size,
             "rank %d of %d failed (%s); no rank applied the update", failed,
             d->cfg->size, remat_status_string((remat_status)other));
    return (remat_status)other;
  }
  if (d->shared_differ) {
    snprintf(err, err_size, "%s; no rank applied the update",
             d->shared_msg);
    return REMAT_ERR_INVALID_ARG;
  }
  return REMAT_OK;
}
