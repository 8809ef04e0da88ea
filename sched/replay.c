/* The replay of a task DAG on simulated workers (replay.h). Events are
 * task ends (the runner's), task starts (after the per-task overhead and
 * any waiting for a queue lock) and idle workers looking for work (right
 * away while they spin, after a wake-up delay once asleep). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "sched/replay.h"
#include "sched/sched_internal.h"
#include "sched/sched_pick.h"

enum { IDLE, LOOKING, STARTING, RUNNING };

typedef struct entry {
  int32_t prio, task;
  int64_t seq;
} entry;

/* A worker's ready tasks: highest priority first, older first on ties. */
typedef struct heap {
  entry *v;
  int32_t n, cap;
  double lock_free;
} heap;

typedef struct worker {
  int node, state;
  int32_t task; /* starting or running */
  double idle_since;
  int32_t root_next, root_end;
  heap ready;
} worker;

typedef struct event {
  double t;
  int worker;
} event;

typedef struct replay {
  const sched_replay_dag *d;
  const sched_replay_timing *tm;
  const sched_replay_runner *r;
  int W, N;
  worker *w;
  int32_t *pending, *inbox_next;
  int32_t *inbox_head, *inbox_tail, *inbox_size; /* [N] */
  double *inbox_lock, root_lock;                 /* [N] */
  sched_placement place; /* the workers' nodes, as the pool's */
  int *victims;          /* [W] scratch for sched_steal_order */
  int *idle, *idle_n;    /* per node: a stack at node_first; [N] */
  event *ev;
  int nev;
  int32_t root_cursor;
  int64_t seq, finished;
  double last_end;
} replay;

static int task_node(const replay *x, int32_t task) {
  return x->d->node != NULL ? x->d->node[task] : -1;
}

/* ---- queues ---- */

static int entry_before(const entry *a, const entry *b) {
  return a->prio != b->prio ? a->prio > b->prio : a->seq < b->seq;
}

static int heap_push(heap *h, entry e) {
  if (h->n == h->cap) {
    int32_t cap = h->cap ? 2 * h->cap : 64;
    entry *v = remat__realloc(h->v, (size_t)cap * sizeof *v);
    if (v == NULL)
      return 0;
    h->v = v;
    h->cap = cap;
  }
  int32_t i = h->n++;
  while (i > 0 && entry_before(&e, &h->v[(i - 1) / 2])) {
    h->v[i] = h->v[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->v[i] = e;
  return 1;
}

static int32_t heap_pop(heap *h) {
  int32_t top = h->v[0].task;
  entry last = h->v[--h->n];
  int32_t i = 0;
  for (;;) {
    int32_t k = 2 * i + 1;
    if (k >= h->n)
      break;
    if (k + 1 < h->n && entry_before(&h->v[k + 1], &h->v[k]))
      k++;
    if (!entry_before(&h->v[k], &last))
      break;
    h->v[i] = h->v[k];
    i = k;
  }
  if (h->n > 0)
    h->v[i] = last;
  return top;
}

/* Takes a queue's lock at *clock for one operation. */
static void lock_op(double *lock_free, double *clock, double hold) {
  double start = *clock > *lock_free ? *clock : *lock_free;
  *lock_free = start + hold;
  *clock = start + hold;
}

static double lock_hold(const replay *x, int worker_node, int queue_node) {
  return x->tm->lock_s *
         (worker_node == queue_node ? 1.0 : x->tm->lock_remote);
}

static int32_t pop_heap_of(replay *x, int v, int thief, double *clock) {
  heap *h = &x->w[v].ready;
  lock_op(&h->lock_free, clock, lock_hold(x, x->w[thief].node, x->w[v].node));
  return heap_pop(h);
}

static int32_t inbox_pop(replay *x, int node, int worker, double *clock) {
  lock_op(&x->inbox_lock[node], clock, lock_hold(x, x->w[worker].node, node));
  int32_t t = x->inbox_head[node];
  x->inbox_head[node] = x->inbox_next[t];
  if (x->inbox_head[node] < 0)
    x->inbox_tail[node] = -1;
  x->inbox_size[node]--;
  return t;
}

/* ---- events and waking ---- */

static void event_push(replay *x, double t, int worker) {
  int i = x->nev++;
  event e = {t, worker};
  while (i > 0 && x->ev[(i - 1) / 2].t > t) {
    x->ev[i] = x->ev[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  x->ev[i] = e;
}

static event event_pop(replay *x) {
  event top = x->ev[0], last = x->ev[--x->nev];
  int i = 0;
  for (;;) {
    int k = 2 * i + 1;
    if (k >= x->nev)
      break;
    if (k + 1 < x->nev && x->ev[k + 1].t < x->ev[k].t)
      k++;
    if (x->ev[k].t >= last.t)
      break;
    x->ev[i] = x->ev[k];
    i = k;
  }
  if (x->nev > 0)
    x->ev[i] = last;
  return top;
}

static void go_idle(replay *x, int v, double t) {
  int n = x->w[v].node;
  x->w[v].state = IDLE;
  x->w[v].idle_since = t;
  x->idle[x->place.node_first[n] + x->idle_n[n]++] = v;
}

/* Gets the most recently idle worker of `node` looking: at once while it
 * still spins, else after the waker signals it and it wakes. */
static void wake_one(replay *x, int node, double *clock) {
  int v = x->idle[x->place.node_first[node] + --x->idle_n[node]];
  double t = *clock;
  if (t - x->w[v].idle_since >= x->tm->spin_s) {
    *clock += x->tm->signal_s;
    t = *clock + x->tm->wake_s;
  }
  x->w[v].state = LOOKING;
  event_push(x, t, v);
}

/* A task pushed on a heap: a worker of the pusher's node, else of the
 * nearest node with one idle. */
static void wake_for_push(replay *x, int pusher, double *clock) {
  int node = x->w[pusher].node;
  for (int k = 0; k < 2 * x->N; k++) {
    int n = node ^ k;
    if (n < x->N && x->idle_n[n] > 0) {
      wake_one(x, n, clock);
      return;
    }
  }
}

static int push_ready(replay *x, int v, int32_t task, double *clock) {
  int node = task_node(x, task);
  if (node < 0) {
    heap *h = &x->w[v].ready;
    lock_op(&h->lock_free, clock, x->tm->lock_s);
    if (!heap_push(h, (entry){x->d->prio[task], task, x->seq++}))
      return 0;
    wake_for_push(x, v, clock);
    return 1;
  }
  lock_op(&x->inbox_lock[node], clock, lock_hold(x, x->w[v].node, node));
  x->inbox_next[task] = -1;
  if (x->inbox_tail[node] >= 0)
    x->inbox_next[x->inbox_tail[node]] = task;
  else
    x->inbox_head[node] = task;
  x->inbox_tail[node] = task;
  x->inbox_size[node]++;
  if (x->idle_n[node] > 0)
    wake_one(x, node, clock);
  return 1;
}

/* ---- the rule of sched/run.c, by sched/sched_pick.h ---- */

static int32_t next_root_prio(const replay *x, int v) {
  const worker *w = &x->w[v];
  const sched_replay_dag *d = x->d;
  if (w->root_next < w->root_end)
    return d->prio[d->roots[w->root_next]];
  return x->root_cursor < d->nroots ? d->prio[d->roots[x->root_cursor]]
                                    : INT32_MIN;
}

static int32_t next_root(replay *x, int v, double *clock) {
  worker *w = &x->w[v];
  if (w->root_next < w->root_end)
    return x->d->roots[w->root_next++];
  int32_t n = x->d->nroots, first = x->root_cursor;
  if (first >= n)
    return -1;
  int32_t batch = sched_root_batch(n, first, x->W);
  lock_op(&x->root_lock, clock, x->tm->lock_s);
  x->root_cursor += batch;
  w->root_next = first + 1;
  w->root_end = first + batch < n ? first + batch : n;
  return x->d->roots[first];
}

static int32_t heap_top_prio(const replay *x, int v) {
  const heap *h = &x->w[v].ready;
  return h->n > 0 ? h->v[0].prio : INT32_MIN;
}

/* Other workers' heaps in the order of sched_steal_order. */
static int32_t steal(replay *x, int v, double *clock) {
  sched_steal_order(&x->place, v, x->victims);
  for (int i = 0; i < x->W - 1; i++)
    if (x->w[x->victims[i]].ready.n > 0)
      return pop_heap_of(x, x->victims[i], v, clock);
  return -1;
}

static int32_t find_task(replay *x, int v, double *clock) {
  const worker *w = &x->w[v];
  int node = w->node;
  sched_view view = {
      .heap_top = heap_top_prio(x, v),
      .root_prio = next_root_prio(x, v),
      .heap_ready = w->ready.n > 0,
      .root_ready =
          w->root_next < w->root_end || x->root_cursor < x->d->nroots,
      .inbox_ready = x->inbox_size[node] > 0};
  switch (sched_pick_source(view)) {
  case SCHED_FROM_HEAP:
    return pop_heap_of(x, v, v, clock);
  case SCHED_FROM_INBOX:
    return inbox_pop(x, node, v, clock);
  case SCHED_FROM_ROOT:
    return next_root(x, v, clock);
  case SCHED_FROM_STEAL:
    break;
  }
  return steal(x, v, clock);
}

/* Successors made ready by `task`: the highest-priority one this node may
 * run is returned, the others pushed (-2 when memory runs out). */
static int32_t release(replay *x, int v, int32_t task, double *clock) {
  const sched_replay_dag *d = x->d;
  int32_t next = -1;
  for (int64_t e = d->succ_first[task + 1] - 1; e >= d->succ_first[task];
       e--) {
    int32_t s = d->succ[e];
    if (--x->pending[s] > 0)
      continue;
    if (!sched_may_continue(task_node(x, s), x->w[v].node)) {
      if (!push_ready(x, v, s, clock))
        return -2;
      continue;
    }
    if (next >= 0 && !push_ready(x, v, next, clock))
      return -2;
    next = s;
  }
  return next;
}

/* ---- starting and ending tasks ---- */

static void begin(replay *x, int v, int32_t task, double clock) {
  x->w[v].state = STARTING;
  x->w[v].task = task;
  event_push(x, clock + x->tm->overhead_s, v);
}

static int on_end(replay *x, int v, double t) {
  int32_t task = x->w[v].task;
  x->r->end(x->r->ctx, task, v);
  x->finished++;
  x->last_end = t;
  double clock = t;
  int32_t next = release(x, v, task, &clock);
  if (next == -2)
    return 0;
  if (next >= 0) {
    if (!sched_keeps_continuation(x->d->prio[next], heap_top_prio(x, v),
                                  next_root_prio(x, v))) {
      if (!push_ready(x, v, next, &clock))
        return 0;
      next = find_task(x, v, &clock);
    }
  } else {
    next = find_task(x, v, &clock);
  }
  if (next >= 0)
    begin(x, v, next, clock);
  else
    go_idle(x, v, clock);
  return 1;
}

static void on_look(replay *x, int v, double t) {
  double clock = t;
  int32_t task = find_task(x, v, &clock);
  if (task >= 0)
    begin(x, v, task, clock);
  else
    go_idle(x, v, clock);
}

/* ---- the run ---- */

static int loop(replay *x) {
  const sched_replay_runner *r = x->r;
  while (x->finished < x->d->ntasks) {
    int ender = -1;
    double t_end = r->next_end(r->ctx, &ender);
    double t_ev = x->nev > 0 ? x->ev[0].t : INFINITY;
    if (isinf(t_end) && isinf(t_ev))
      return 0; /* nothing runs and nothing will: a cycle */
    if (t_end <= t_ev) {
      r->advance(r->ctx, t_end);
      if (!on_end(x, ender, t_end))
        return 0;
      continue;
    }
    event e = event_pop(x);
    r->advance(r->ctx, e.t);
    worker *w = &x->w[e.worker];
    if (w->state != STARTING) {
      on_look(x, e.worker, e.t);
      continue;
    }
    w->state = RUNNING;
    if (!r->start(r->ctx, w->task, e.worker, w->node))
      return 0;
  }
  return 1;
}

static int setup(replay *x) {
  int W = x->W, N = x->N;
  size_t n = (size_t)x->d->ntasks + 1;
  x->w = remat__calloc((size_t)W, sizeof *x->w);
  x->pending = remat__malloc(n * sizeof *x->pending);
  x->inbox_next = remat__malloc(n * sizeof *x->inbox_next);
  x->inbox_head = remat__malloc((size_t)N * sizeof *x->inbox_head);
  x->inbox_tail = remat__malloc((size_t)N * sizeof *x->inbox_tail);
  x->inbox_size = remat__calloc((size_t)N, sizeof *x->inbox_size);
  x->inbox_lock = remat__calloc((size_t)N, sizeof *x->inbox_lock);
  x->idle_n = remat__calloc((size_t)N, sizeof *x->idle_n);
  x->place = (sched_placement){
      .nworkers = W, .nnodes = N,
      .worker_node = remat__malloc((size_t)W * sizeof(int)),
      .node_first = remat__malloc(((size_t)N + 1) * sizeof(int))};
  x->victims = remat__malloc((size_t)W * sizeof *x->victims);
  x->idle = remat__malloc((size_t)W * sizeof *x->idle);
  x->ev = remat__malloc((size_t)W * sizeof *x->ev);
  if (!x->w || !x->pending || !x->inbox_next || !x->inbox_head ||
      !x->inbox_tail || !x->inbox_size || !x->inbox_lock || !x->idle_n ||
      !x->place.worker_node || !x->place.node_first || !x->victims ||
      !x->idle || !x->ev)
    return 0;
  for (int k = 0; k <= N; k++)
    x->place.node_first[k] = (int)((int64_t)k * W / N);
  memcpy(x->pending, x->d->npred, (size_t)x->d->ntasks * sizeof *x->pending);
  for (int k = 0; k < N; k++)
    x->inbox_head[k] = x->inbox_tail[k] = -1;
  for (int v = 0; v < W; v++) {
    for (int k = 0; k < N; k++)
      if (v >= x->place.node_first[k] && v < x->place.node_first[k + 1])
        x->w[v].node = x->place.worker_node[v] = k;
    x->w[v].state = LOOKING;
    event_push(x, 0.0, v);
  }
  return 1;
}

static void teardown(replay *x) {
  for (int v = 0; x->w != NULL && v < x->W; v++)
    free(x->w[v].ready.v);
  free(x->w);
  free(x->pending);
  free(x->inbox_next);
  free(x->inbox_head);
  free(x->inbox_tail);
  free(x->inbox_size);
  free(x->inbox_lock);
  free(x->idle_n);
  free(x->place.worker_node);
  free(x->place.node_first);
  free(x->victims);
  free(x->idle);
  free(x->ev);
}

int sched_replay(const sched_replay_dag *d, int nworkers, int nnodes,
                 const sched_replay_timing *tm, const sched_replay_runner *r,
                 double *makespan) {
  *makespan = 0.0;
  if (nnodes < 1 || nworkers < nnodes)
    return 0;
  replay x = {.d = d, .tm = tm, .r = r, .W = nworkers, .N = nnodes};
  int ok = setup(&x) && loop(&x);
  if (ok)
    *makespan = x.last_end;
  teardown(&x);
  return ok;
}

/* ---- fixed durations ---- */

typedef struct fixed_runner {
  const double *seconds;
  double now;
  double *ends; /* [nworkers]: INFINITY while idle */
  int nworkers;
} fixed_runner;

static int fixed_start(void *ctx, int32_t task, int worker, int node) {
  (void)node;
  fixed_runner *f = ctx;
  f->ends[worker] = f->now + f->seconds[task];
  return 1;
}

static double fixed_next_end(void *ctx, int *worker) {
  const fixed_runner *f = ctx;
  double first = INFINITY;
  for (int v = 0; v < f->nworkers; v++)
    if (f->ends[v] < first) {
      first = f->ends[v];
      *worker = v;
    }
  return first;
}

static void fixed_advance(void *ctx, double t) {
  ((fixed_runner *)ctx)->now = t;
}

static void fixed_end(void *ctx, int32_t task, int worker) {
  (void)task;
  ((fixed_runner *)ctx)->ends[worker] = INFINITY;
}

double sched_replay_fixed(const sched_replay_dag *d, int nworkers, int nnodes,
                          const sched_replay_timing *tm,
                          const double *seconds) {
  if (nworkers < 1)
    return -1.0;
  fixed_runner f = {seconds, 0.0,
                    remat__malloc((size_t)nworkers * sizeof *f.ends),
                    nworkers};
  if (f.ends == NULL)
    return -1.0;
  for (int v = 0; v < nworkers; v++)
    f.ends[v] = INFINITY;
  sched_replay_runner r = {&f, fixed_start, fixed_next_end, fixed_advance,
                           fixed_end};
  double makespan;
  int ok = sched_replay(d, nworkers, nnodes, tm, &r, &makespan);
  free(f.ends);
  return ok ? makespan : -1.0;
}

/* ---- the view of a scheduler DAG ---- */

void sched_replay_owned_free(sched_replay_owned *o) {
  free(o->prio);
  free(o->npred);
  free(o->succ);
  free(o->roots);
  free(o->succ_first);
  free(o->node);
  memset(o, 0, sizeof *o);
}

int sched_replay_dag_of(const sched_dag *dag, sched_replay_dag *out,
                        sched_replay_owned *o) {
  size_t n = (size_t)dag->ntasks + 1;
  int64_t nsucc = dag->ntasks > 0
                      ? dag->tasks[dag->ntasks - 1].succ_end
                      : 0;
  int32_t nroots = dag->nroots + dag->naffine_roots;
  o->prio = remat__malloc(n * sizeof *o->prio);
  o->npred = remat__malloc(n * sizeof *o->npred);
  o->succ = remat__malloc(((size_t)nsucc + 1) * sizeof *o->succ);
  o->roots = remat__malloc(((size_t)nroots + 1) * sizeof *o->roots);
  o->succ_first = remat__malloc(n * sizeof *o->succ_first);
  o->node = remat__malloc(n * sizeof *o->node);
  if (!o->prio || !o->npred || !o->succ || !o->roots || !o->succ_first ||
      !o->node) {
    sched_replay_owned_free(o);
    return 0;
  }
  for (int32_t t = 0; t < dag->ntasks; t++) {
    o->prio[t] = dag->info[t].priority;
    o->npred[t] = dag->tasks[t].npred;
    o->succ_first[t] = dag->tasks[t].succ_begin;
    o->node[t] = (int8_t)dag->tasks[t].numa_node;
  }
  o->succ_first[dag->ntasks] = nsucc;
  if (nsucc > 0)
    memcpy(o->succ, dag->succ, (size_t)nsucc * sizeof *o->succ);
  if (nroots > 0)
    memcpy(o->roots, dag->roots, (size_t)nroots * sizeof *o->roots);
  *out = (sched_replay_dag){dag->ntasks, o->prio, o->npred, o->succ_first,
                            o->succ,     o->roots, nroots,  o->node};
  return 1;
}
