/* Bandwidth sharing among running tasks (sim_fluid.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/sim/sim_fluid.h"

int sim_fluid_init(sim_fluid *f, int slots, int nodes, double mem_bw,
                   double link_bw) {
  memset(f, 0, sizeof *f);
  f->nodes = nodes;
  f->slots = slots;
  f->mem_bw = mem_bw;
  f->link_bw = link_bw;
  f->left = calloc((size_t)slots, sizeof *f->left);
  f->slow = calloc((size_t)slots, sizeof *f->slow);
  f->rate = calloc((size_t)slots, sizeof *f->rate);
  f->running = calloc((size_t)slots, sizeof *f->running);
  f->where = malloc((size_t)slots * sizeof *f->where);
  f->uses = calloc((size_t)slots, sizeof *f->uses);
  if (!f->left || !f->slow || !f->rate || !f->running || !f->where ||
      !f->uses) {
    sim_fluid_free(f);
    return 0;
  }
  for (int i = 0; i < slots; i++)
    f->where[i] = -1;
  return 1;
}

void sim_fluid_free(sim_fluid *f) {
  free(f->left);
  free(f->slow);
  free(f->rate);
  free(f->running);
  free(f->where);
  free(f->uses);
  memset(f, 0, sizeof *f);
}

/* Each task's slowdown from the resources' load (nothing to do while no
 * resource is or was overloaded: every pace stays 1). */
static void update_pace(sim_fluid *f) {
  double factor[SIM_RESOURCES];
  int saturated = 0;
  for (int r = 0; r < 2 * f->nodes; r++) {
    double cap = r < f->nodes ? f->mem_bw : f->link_bw;
    factor[r] = f->demand[r] > cap ? f->demand[r] / cap : 1.0;
    saturated |= factor[r] > 1.0;
  }
  if (!saturated && !f->saturated)
    return;
  f->saturated = saturated;
  for (int i = 0; i < f->nrunning; i++) {
    int s = f->running[i];
    double slow = 1.0;
    for (unsigned m = f->uses[s]; m != 0; m &= m - 1) {
      int r = __builtin_ctz(m);
      if (factor[r] > slow)
        slow = factor[r];
    }
    f->slow[s] = slow;
  }
}

void sim_fluid_advance(sim_fluid *f, double t) {
  double dt = t - f->now;
  if (dt <= 0.0)
    return;
  for (int i = 0; i < f->nrunning; i++) {
    int s = f->running[i];
    f->left[s] -= dt / f->slow[s];
    f->stall_s += dt * (1.0 - 1.0 / f->slow[s]);
    if (f->left[s] < 0.0)
      f->left[s] = 0.0;
  }
  f->now = t;
}

void sim_fluid_add(sim_fluid *f, int slot, int node, double seconds,
                   const float *bytes) {
  double *rate = f->rate[slot];
  memset(rate, 0, sizeof f->rate[slot]);
  double t = seconds > 1e-12 ? seconds : 1e-12;
  for (int h = 0; h < f->nodes; h++) {
    rate[h] = bytes[h] / t;
    if (h != node && bytes[h] > 0.0f) {
      rate[f->nodes + h] += bytes[h] / t;
      rate[f->nodes + node] += bytes[h] / t;
    }
  }
  f->uses[slot] = 0;
  for (int r = 0; r < 2 * f->nodes; r++) {
    f->demand[r] += rate[r];
    if (rate[r] > 0.0)
      f->uses[slot] |= 1u << r;
  }
  f->left[slot] = seconds;
  f->slow[slot] = 1.0;
  f->where[slot] = f->nrunning;
  f->running[f->nrunning++] = slot;
  update_pace(f);
}

void sim_fluid_remove(sim_fluid *f, int slot) {
  for (int r = 0; r < 2 * f->nodes; r++) {
    f->demand[r] -= f->rate[slot][r];
    if (f->demand[r] < 1e-6)
      f->demand[r] = 0.0;
  }
  int i = f->where[slot], last = f->running[--f->nrunning];
  f->running[i] = last;
  f->where[last] = i;
  f->where[slot] = -1;
  update_pace(f);
}

double sim_fluid_next(const sim_fluid *f, int *slot) {
  double best = INFINITY;
  *slot = -1;
  for (int i = 0; i < f->nrunning; i++) {
    int s = f->running[i];
    double end = f->now + f->left[s] * f->slow[s];
    if (end < best) {
      best = end;
      *slot = s;
    }
  }
  return best;
}
