/* Reads a compiled step for the simulator (sim_step.h): maps each task of
 * the DAG back to its kernel node and tile through the task's body and
 * argument, and gives it a cost key. */
#include <stdlib.h>
#include <string.h>

#include "benchmarks/sim/sim_step.h"
#include "runtime/exec/tasks.h"

static uint64_t mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) {
    h ^= (v >> (8 * i)) & 0xffu;
    h *= 1099511628211ull;
  }
  return h;
}

static uint64_t mix_str(uint64_t h, const char *s) {
  for (; s != NULL && *s; s++)
    h = mix(h, (unsigned char)*s);
  return h;
}

const char *sim_task_name(const sim_step *s, int32_t task) {
  const char *name = s->dag->info[task].name;
  return name != NULL ? name : "task";
}

/* Bytes a start task zero-fills and buffers it allocates: what its cost
 * depends on. */
static uint64_t start_key(const sim_step *s, const plan_knode *kn, uint64_t h) {
  for (int i = 0; i < kn->ninit; i++) {
    const plan_buffer *b = &s->c->low.bufs[kn->init[i]];
    h = mix(h, (uint64_t)b->persistent);
    h = mix(h, b->zero_fill ? (uint64_t)b->bytes : 0);
  }
  return h;
}

/* Same kernel on the same shapes, same kind of task, and for tiles whether
 * it is the last one (which may be shorter). Recompute tiles share the key
 * of the forward tiles they repeat. */
static uint64_t task_key(const sim_step *s, int32_t task) {
  const plan_knode *kn = sim_knode(s, task);
  int64_t tile = s->tile[task];
  uint64_t h = mix_str(1469598103934665603ull, sim_task_name(s, task));
  h = mix(h, (uint64_t)(tile < 0 ? tile : 0));
  h = mix(h, (uint64_t)(kn->kind == KNODE_RECOMPUTE ? KNODE_FORWARD : kn->kind));
  if (kn->inst != NULL)
    for (int i = 0; i < kn->inst->desc.nin; i++)
      for (int d = 0; d < kn->inst->desc.in[i].ndim; d++)
        h = mix(h, (uint64_t)kn->inst->desc.in[i].dim[d]);
  if (kn->optim.param_tensor >= 0)
    h = mix(h, (uint64_t)op_numel(&s->c->g->tensors[kn->optim.param_tensor]->shape));
  if (tile >= 0)
    h = mix(h, (uint64_t)(tile == kn->tiles - 1 && kn->tiles > 1));
  if (tile == SIM_START)
    h = start_key(s, kn, h);
  return h;
}

static void map_task(sim_step *s, int32_t t) {
  const sched_task *task = &s->dag->tasks[t];
  const plan_knode *base = s->c->low.knodes;
  if (task->fn == tasks_tile) {
    const plan_tile *tile = task->arg;
    s->knode[t] = (int32_t)(tile->kn - base);
    s->tile[t] = tile->tile;
  } else {
    s->knode[t] = (int32_t)((const plan_knode *)task->arg - base);
    s->tile[t] = task->fn == tasks_start ? SIM_START : SIM_DONE;
  }
}

int sim_step_init(sim_step *s, remat_graph *g) {
  memset(s, 0, sizeof *s);
  if (g == NULL || !g->compiled)
    return 0;
  s->c = &g->step->compiled;
  s->state = &g->step->state;
  s->dag = s->c->tasks.dag;
  s->ntasks = s->dag->ntasks;
  s->knode = malloc((size_t)s->ntasks * sizeof *s->knode);
  s->tile = malloc((size_t)s->ntasks * sizeof *s->tile);
  s->key = malloc((size_t)s->ntasks * sizeof *s->key);
  if (s->knode == NULL || s->tile == NULL || s->key == NULL) {
    sim_step_free(s);
    return 0;
  }
  for (int32_t t = 0; t < s->ntasks; t++)
    map_task(s, t);
  for (int32_t t = 0; t < s->ntasks; t++)
    s->key[t] = task_key(s, t);
  s->persistent_bytes = s->c->predicted.peak - s->c->predicted.transient_peak;
  return 1;
}

void sim_step_free(sim_step *s) {
  free(s->knode);
  free(s->tile);
  free(s->key);
  memset(s, 0, sizeof *s);
}
