/* Measuring kernels in a graph's first runs (step_costs.h), op kernels
 * and the nodes of no op alike (cost_key_of): the
 * scheduler's task records give each tile's start and end; a kernel
 * node's tiles are the tasks after its done task (taskgraph.c adds a
 * node's start, done, then tile tasks). */
#include <stdlib.h>

#include "runtime/exec/step_costs.h"

static bool measured(const plan_knode *kn) { return kn->tiles > 0; }

remat_status step_costs_create(const compiled_step *c, step_state *st) {
  if (c->g->rt->roofline_costs)
    return REMAT_OK;
  size_t n = (size_t)sched_dag_num_tasks(c->tasks.dag) + 1;
  st->cost_records = remat__calloc(n, sizeof *st->cost_records);
  cost_block *b = cost_block_new(c->low.nknodes);
  if (st->cost_records == NULL || b == NULL) {
    free(b);
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  for (int32_t i = 0; i < c->low.nknodes; i++)
    if (measured(&c->low.knodes[i])) {
      op_desc d;
      op_kernel k;
      cost_key_of(&c->low, &c->low.knodes[i], &d, &k);
      cost_block_add(b, &d, &k);
    }
  cost_table_adopt(&c->g->rt->costs, b);
  return REMAT_OK;
}

sched_trace_record *step_costs_records(const compiled_step *c,
                                       step_state *st) {
  if (c->g->rt->roofline_costs || st->cost_runs >= COST_STEPS)
    return NULL;
  return st->cost_records;
}

void step_costs_note(const compiled_step *c, step_state *st,
                     const sched_trace_record *records) {
  if (records == NULL)
    return;
  for (int32_t i = 0; i < c->low.nknodes; i++) {
    const plan_knode *kn = &c->low.knodes[i];
    if (!measured(kn))
      continue;
    int64_t ns = 0;
    for (int64_t k = 1; k <= kn->tiles; k++) {
      const sched_trace_record *r = &records[c->tasks.done_task[i] + k];
      ns += r->end_ns - r->start_ns;
    }
    op_desc d;
    op_kernel k;
    cost_key_of(&c->low, kn, &d, &k);
    cost_table_note(&c->g->rt->costs, &d, &k,
                    1e-9 * (double)ns / (double)kn->tiles);
  }
  if (++st->cost_runs >= COST_STEPS) {
    free(st->cost_records);
    st->cost_records = NULL;
  }
}
