/* The replay of one step on simulated workers (sim_engine.h): the
 * scheduler's own replay engine (sched/replay.c) with this simulator's
 * runner, which times tasks by their measured costs and the bandwidth
 * model, and counts the step's bytes. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/sim/sim_engine.h"
#include "benchmarks/sim/sim_fluid.h"
#include "sched/replay.h"

/* The simulator's runner of sched_replay (sched/replay.h): task
 * durations from the measured costs, memory bandwidth shared by the
 * running tasks (sim_fluid.h), and the step's live bytes. */
typedef struct sim {
  const sim_step *s;
  const sim_costs *c;
  const sim_layout *l;
  const sim_machine *m;
  int N;
  sim_fluid fluid;
  int32_t *users_left;
  int64_t live, peak;
  sim_result *out;
} sim;

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
static int on_start(void *ctx, int32_t task, int v, int node) {
  sim *x = ctx;
  int32_t orig = x->l->orig[task];
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
  sim_fluid_add(&x->fluid, v, node, alone, moved);
  return 1;
}

static double next_end(void *ctx, int *worker) {
  return sim_fluid_next(&((sim *)ctx)->fluid, worker);
}

static void advance(void *ctx, double t) {
  sim_fluid_advance(&((sim *)ctx)->fluid, t);
}

static void on_end(void *ctx, int32_t task, int v) {
  sim *x = ctx;
  int32_t orig = x->l->orig[task];
  sim_fluid_remove(&x->fluid, v);
  if (x->s->tile[orig] == SIM_DONE)
    track_free(x, orig);
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

int sim_run(const sim_step *s, const sim_costs *c, const sim_layout *l,
            const sim_machine *m, sim_result *out) {
  memset(out, 0, sizeof *out);
  sim x = {.s = s, .c = c, .l = l, .m = m, .N = l->nodes, .out = out};
  sched_replay_dag d = {l->ntasks, l->prio, l->npred, l->succ_first,
                        l->succ, l->roots, l->nroots, l->node};
  sched_replay_timing tm = {c->overhead_s, m->lock_s, m->lock_remote,
                            m->signal_s, m->wake_s, m->spin_s};
  sched_replay_runner r = {&x, on_start, next_end, advance, on_end};
  x.users_left = malloc(((size_t)s->c->low.nbufs + 1) * sizeof *x.users_left);
  int ok = x.users_left != NULL && l->nodes == m->nodes &&
           sim_fluid_init(&x.fluid, m->cores, x.N, m->mem_bw, m->link_bw);
  for (int32_t b = 0; ok && b < s->c->low.nbufs; b++)
    x.users_left[b] = s->c->low.bufs[b].users;
  ok = ok && sched_replay(&d, m->cores, m->nodes, &tm, &r, &out->step_s);
  if (ok) {
    out->stall_s = x.fluid.stall_s;
    out->peak_bytes = s->persistent_bytes + x.peak;
    out->critical_path_s = sim_critical_path(l, c, NULL, NULL);
  }
  free(x.users_left);
  sim_fluid_free(&x.fluid);
  return ok;
}
