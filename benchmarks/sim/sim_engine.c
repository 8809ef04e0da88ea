/* The replay of one step on simulated workers (sim_engine.h). Events are
 * task ends (from the bandwidth model), task starts (after the per-task
 * overhead and any waiting for a queue lock) and idle workers looking for
 * work (right away while they spin, after a wake-up delay once asleep). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/sim/sim_engine.h"
#include "benchmarks/sim/sim_fluid.h"

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

typedef struct sim {
  const sim_step *s;
  const sim_costs *c;
  const sim_layout *l;
  const sim_machine *m;
  int W, N;
  int node_first[SIM_MAX_NODES + 1];
  worker *w;
  int32_t *pending, *inbox_next;
  int32_t inbox_head[SIM_MAX_NODES], inbox_tail[SIM_MAX_NODES];
  int32_t inbox_size[SIM_MAX_NODES];
  double inbox_lock[SIM_MAX_NODES], root_lock;
  sched_placement place; /* the workers' nodes, as the pool's */
  int *victims;          /* [W - 1] scratch for sched_steal_order */
  int *idle, idle_n[SIM_MAX_NODES]; /* per node: a stack at node_first */
  event *ev;
  int nev;
  int32_t root_cursor;
  int64_t seq, finished;
  sim_fluid fluid;
  int32_t *users_left;
  int64_t live, peak;
  sim_result *out;
} sim;

/* ---- queues ---- */

static int entry_before(const entry *a, const entry *b) {
  return a->prio != b->prio ? a->prio > b->prio : a->seq < b->seq;
}

static int heap_push(heap *h, entry e) {
  if (h->n == h->cap) {
    int32_t cap = h->cap ? 2 * h->cap : 64;
    entry *v = realloc(h->v, (size_t)cap * sizeof *v);
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

static double lock_hold(const sim *x, int worker_node, int queue_node) {
  return x->m->lock_s * (worker_node == queue_node ? 1.0 : x->m->lock_remote);
}

static int32_t pop_heap_of(sim *x, int v, int thief, double *clock) {
  heap *h = &x->w[v].ready;
  lock_op(&h->lock_free, clock, lock_hold(x, x->w[thief].node, x->w[v].node));
  return heap_pop(h);
}

static int32_t inbox_pop(sim *x, int node, int worker, double *clock) {
  lock_op(&x->inbox_lock[node], clock, lock_hold(x, x->w[worker].node, node));
  int32_t t = x->inbox_head[node];
  x->inbox_head[node] = x->inbox_next[t];
  if (x->inbox_head[node] < 0)
    x->inbox_tail[node] = -1;
  x->inbox_size[node]--;
  return t;
}

/* ---- events and waking ---- */

static void event_push(sim *x, double t, int worker) {
  int i = x->nev++;
  event e = {t, worker};
  while (i > 0 && x->ev[(i - 1) / 2].t > t) {
    x->ev[i] = x->ev[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  x->ev[i] = e;
}

static event event_pop(sim *x) {
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

static void go_idle(sim *x, int v, double t) {
  int n = x->w[v].node;
  x->w[v].state = IDLE;
  x->w[v].idle_since = t;
  x->idle[x->node_first[n] + x->idle_n[n]++] = v;
}

/* Gets the most recently idle worker of `node` looking: at once while it
 * still spins, else after the waker signals it and it wakes. */
static void wake_one(sim *x, int node, double *clock) {
  int v = x->idle[x->node_first[node] + --x->idle_n[node]];
  double t = *clock;
  if (t - x->w[v].idle_since >= x->m->spin_s) {
    *clock += x->m->signal_s;
    t = *clock + x->m->wake_s;
  }
  x->w[v].state = LOOKING;
  event_push(x, t, v);
}

/* A task pushed on a heap: a worker of the pusher's node, else of the
 * nearest node with one idle. */
static void wake_for_push(sim *x, int pusher, double *clock) {
  int node = x->w[pusher].node;
  for (int k = 0; k < 2 * x->N; k++) {
    int n = node ^ k;
    if (n < x->N && x->idle_n[n] > 0) {
      wake_one(x, n, clock);
      return;
    }
  }
}

static int push_ready(sim *x, int v, int32_t task, double *clock) {
  int node = x->l->node[task];
  if (node < 0) {
    heap *h = &x->w[v].ready;
    lock_op(&h->lock_free, clock, x->m->lock_s);
    if (!heap_push(h, (entry){x->l->prio[task], task, x->seq++}))
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

static int32_t next_root_prio(const sim *x, int v) {
  const worker *w = &x->w[v];
  if (w->root_next < w->root_end)
    return x->l->prio[x->l->roots[w->root_next]];
  return x->root_cursor < x->l->nroots ? x->l->prio[x->l->roots[x->root_cursor]]
                                       : INT32_MIN;
}

static int32_t next_root(sim *x, int v, double *clock) {
  worker *w = &x->w[v];
  if (w->root_next < w->root_end)
    return x->l->roots[w->root_next++];
  int32_t n = x->l->nroots, first = x->root_cursor;
  if (first >= n)
    return -1;
  int32_t batch = sched_root_batch(n, first, x->W);
  lock_op(&x->root_lock, clock, x->m->lock_s);
  x->root_cursor += batch;
  w->root_next = first + 1;
  w->root_end = first + batch < n ? first + batch : n;
  return x->l->roots[first];
}

static int32_t heap_top_prio(const sim *x, int v) {
  const heap *h = &x->w[v].ready;
  return h->n > 0 ? h->v[0].prio : INT32_MIN;
}

/* Other workers' heaps in the order of sched_steal_order. */
static int32_t steal(sim *x, int v, double *clock) {
  sched_steal_order(&x->place, v, x->victims);
  for (int i = 0; i < x->W - 1; i++)
    if (x->w[x->victims[i]].ready.n > 0)
      return pop_heap_of(x, x->victims[i], v, clock);
  return -1;
}

static int32_t find_task(sim *x, int v, double *clock) {
  const worker *w = &x->w[v];
  int node = w->node;
  sched_view view = {
      .heap_top = heap_top_prio(x, v),
      .root_prio = next_root_prio(x, v),
      .heap_ready = w->ready.n > 0,
      .root_ready = w->root_next < w->root_end || x->root_cursor < x->l->nroots,
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
static int32_t release(sim *x, int v, int32_t task, double *clock) {
  const sim_layout *l = x->l;
  int32_t next = -1;
  for (int64_t e = l->succ_first[task + 1] - 1; e >= l->succ_first[task]; e--) {
    int32_t s = l->succ[e];
    if (--x->pending[s] > 0)
      continue;
    if (!sched_may_continue(l->node[s], x->w[v].node)) {
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

static void begin(sim *x, int v, int32_t task, double clock) {
  x->w[v].state = STARTING;
  x->w[v].task = task;
  event_push(x, clock + x->c->overhead_s, v);
}

static void track_alloc(sim *x, int32_t orig) {
  const plan_knode *kn = sim_knode(x->s, orig);
  for (int i = 0; i < kn->ninit; i++) {
    const plan_buffer *b = &x->s->c->low.bufs[kn->init[i]];
    if (!b->persistent)
      x->live += b->bytes;
  }
  if (x->live > x->peak)
    x->peak = x->live;
}

static void track_free(sim *x, int32_t orig) {
  const plan_knode *kn = sim_knode(x->s, orig);
  for (int i = 0; i < kn->ntouch; i++) {
    const plan_buffer *b = &x->s->c->low.bufs[kn->touch[i]];
    if (!b->persistent && --x->users_left[kn->touch[i]] == 0)
      x->live -= b->bytes;
  }
}

/* A task starts on worker v. What its footprint says it moves beyond what
 * one core streams here in its measured time must have come from cache:
 * only the rest loads memory and links. Its remote share streams
 * remote_latency times slower. */
static void on_start(sim *x, int v) {
  int32_t task = x->w[v].task, orig = x->l->orig[task];
  int node = x->w[v].node;
  const float *bytes = x->l->bytes[task];
  double base = x->c->task_s[orig] * x->l->share[task], remote = 0.0, total = 0.0;
  for (int h = 0; h < x->N; h++) {
    total += bytes[h];
    if (h != node)
      remote += bytes[h];
  }
  double dram = total < x->m->core_bw * base ? 1.0 : x->m->core_bw * base / total;
  double stream = dram * remote / x->m->core_bw;
  double alone = base + (x->m->remote_latency - 1.0) * (stream < base ? stream : base);
  float moved[SIM_MAX_NODES];
  for (int h = 0; h < x->N; h++)
    moved[h] = (float)(dram * bytes[h]);
  x->out->bytes += total;
  x->out->remote_bytes += remote;
  x->out->work_s += alone + x->c->overhead_s;
  if (x->s->tile[orig] == SIM_START)
    track_alloc(x, orig);
  x->w[v].state = RUNNING;
  sim_fluid_add(&x->fluid, v, node, alone, moved);
}

static int on_end(sim *x, int v, double t) {
  int32_t task = x->w[v].task, orig = x->l->orig[task];
  x->finished++;
  x->out->step_s = t;
  if (x->s->tile[orig] == SIM_DONE)
    track_free(x, orig);
  double clock = t;
  int32_t next = release(x, v, task, &clock);
  if (next == -2)
    return 0;
  if (next >= 0) {
    if (!sched_keeps_continuation(x->l->prio[next], heap_top_prio(x, v),
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

static void on_look(sim *x, int v, double t) {
  double clock = t;
  int32_t task = find_task(x, v, &clock);
  if (task >= 0)
    begin(x, v, task, clock);
  else
    go_idle(x, v, clock);
}

/* ---- the run ---- */

static int loop(sim *x) {
  while (x->finished < x->l->ntasks) {
    int slot;
    double t_end = sim_fluid_next(&x->fluid, &slot);
    double t_ev = x->nev > 0 ? x->ev[0].t : INFINITY;
    if (isinf(t_end) && isinf(t_ev))
      return 0; /* nothing runs and nothing will: a cycle */
    if (t_end <= t_ev) {
      sim_fluid_advance(&x->fluid, t_end);
      sim_fluid_remove(&x->fluid, slot);
      if (!on_end(x, slot, t_end))
        return 0;
      continue;
    }
    event e = event_pop(x);
    sim_fluid_advance(&x->fluid, e.t);
    if (x->w[e.worker].state == STARTING)
      on_start(x, e.worker);
    else
      on_look(x, e.worker, e.t);
  }
  return 1;
}

/* Walks back from the task that ends last along the predecessors that
 * ended last. */
static void trace_path(const int32_t *from, int32_t last, int32_t *path,
                       int32_t *len) {
  int32_t n = 0;
  for (int32_t t = last; t >= 0; t = from[t])
    path[n++] = t;
  for (int32_t i = 0; i < n / 2; i++) {
    int32_t tmp = path[i];
    path[i] = path[n - 1 - i];
    path[n - 1 - i] = tmp;
  }
  *len = n;
}

double sim_critical_path(const sim_layout *l, const sim_costs *c,
                         int32_t *path, int32_t *len) {
  double *finish = calloc((size_t)l->ntasks, sizeof *finish);
  int32_t *left = malloc((size_t)l->ntasks * sizeof *left);
  int32_t *order = malloc((size_t)l->ntasks * sizeof *order);
  int32_t *from = malloc((size_t)l->ntasks * sizeof *from);
  double longest = -1.0;
  int32_t last = -1;
  if (finish != NULL && left != NULL && order != NULL && from != NULL) {
    memcpy(left, l->npred, (size_t)l->ntasks * sizeof *left);
    memset(from, 0xff, (size_t)l->ntasks * sizeof *from);
    int32_t n = 0;
    for (int32_t i = 0; i < l->nroots; i++)
      order[n++] = l->roots[i];
    for (int32_t i = 0; i < n; i++) {
      int32_t t = order[i];
      finish[t] += c->task_s[l->orig[t]] * l->share[t] + c->overhead_s;
      if (finish[t] > longest) {
        longest = finish[t];
        last = t;
      }
      for (int64_t e = l->succ_first[t]; e < l->succ_first[t + 1]; e++) {
        int32_t s = l->succ[e];
        if (finish[t] > finish[s] || from[s] < 0) {
          finish[s] = finish[t] > finish[s] ? finish[t] : finish[s];
          from[s] = t;
        }
        if (--left[s] == 0)
          order[n++] = s;
      }
    }
    if (path != NULL && last >= 0)
      trace_path(from, last, path, len);
  }
  free(finish);
  free(left);
  free(order);
  free(from);
  return longest;
}

static int setup(sim *x) {
  int W = x->W, N = x->N;
  for (int n = 0; n <= N; n++)
    x->node_first[n] = (int)((int64_t)n * W / N);
  x->w = calloc((size_t)W, sizeof *x->w);
  x->pending = malloc((size_t)x->l->ntasks * sizeof *x->pending);
  x->inbox_next = malloc((size_t)x->l->ntasks * sizeof *x->inbox_next);
  x->place = (sched_placement){.nworkers = W, .nnodes = N,
                                .worker_node = malloc((size_t)W * sizeof(int)),
                                .node_first = x->node_first};
  x->victims = malloc((size_t)W * sizeof *x->victims);
  x->idle = malloc((size_t)W * sizeof *x->idle);
  x->ev = malloc((size_t)W * sizeof *x->ev);
  x->users_left = malloc(((size_t)x->s->c->low.nbufs + 1) * sizeof *x->users_left);
  if (!x->w || !x->pending || !x->inbox_next || !x->place.worker_node ||
      !x->victims || !x->idle || !x->ev || !x->users_left ||
      !sim_fluid_init(&x->fluid, W, N, x->m->mem_bw, x->m->link_bw))
    return 0;
  memcpy(x->pending, x->l->npred, (size_t)x->l->ntasks * sizeof *x->pending);
  for (int32_t b = 0; b < x->s->c->low.nbufs; b++)
    x->users_left[b] = x->s->c->low.bufs[b].users;
  for (int n = 0; n < N; n++)
    x->inbox_head[n] = x->inbox_tail[n] = -1;
  for (int v = 0; v < W; v++) {
    for (int n = 0; n < N; n++)
      if (v >= x->node_first[n] && v < x->node_first[n + 1])
        x->w[v].node = x->place.worker_node[v] = n;
    x->w[v].state = LOOKING;
    event_push(x, 0.0, v);
  }
  return 1;
}

static void teardown(sim *x) {
  for (int v = 0; x->w != NULL && v < x->W; v++)
    free(x->w[v].ready.v);
  free(x->w);
  free(x->pending);
  free(x->inbox_next);
  free(x->place.worker_node);
  free(x->victims);
  free(x->idle);
  free(x->ev);
  free(x->users_left);
  sim_fluid_free(&x->fluid);
}

int sim_run(const sim_step *s, const sim_costs *c, const sim_layout *l,
            const sim_machine *m, sim_result *out) {
  memset(out, 0, sizeof *out);
  sim x = {.s = s, .c = c, .l = l, .m = m, .W = m->cores, .N = l->nodes,
           .out = out};
  int ok = m->cores >= m->nodes && l->nodes == m->nodes && setup(&x) && loop(&x);
  if (ok) {
    out->stall_s = x.fluid.stall_s;
    out->peak_bytes = s->persistent_bytes + x.peak;
    out->critical_path_s = sim_critical_path(l, c, NULL, NULL);
  }
  teardown(&x);
  return ok;
}
