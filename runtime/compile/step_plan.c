/* The compiled step's lifetime (step_plan.h): everything compile built is
 * freed here, whether compile finished or failed half-way. */
#include <stdlib.h>

#include "runtime/dp/dp.h"
#include "runtime/compile/step_plan.h"

void step_plan_destroy(remat_graph *g) {
  remat_step_plan *p = g->plan;
  if (p == NULL)
    return;
  dp_plan_free(p);
  if (p->dag != NULL)
    sched_dag_destroy(p->dag);
  numa_plan_free(p);
  for (int32_t b = 0; b < p->low.nbufs; b++) {
    plan_buffer *buf = &p->low.bufs[b];
    if (buf->data != NULL)
      mem_free(&p->arena, buf->data, (size_t)buf->bytes, buf->cat, buf->node,
               !buf->persistent);
  }
  for (int32_t t = 0; p->accum != NULL && t < g->ntensors; t++)
    if (p->accum[t] != NULL) {
      const plan_buffer *grad = &p->low.bufs[p->low.grad_buf[t]];
      mem_free(&p->arena, p->accum[t], (size_t)grad->bytes, REMAT_MEM_GRADS,
               grad->node, false);
    }
  free(p->accum);
  free(p->task_names);
  step_trace_free(&p->trace);
  free(p->check_sumsq);
  if (p->scratch != NULL)
    mem_free(&p->arena, p->scratch, p->scratch_bytes * (size_t)g->rt->nworkers,
             REMAT_MEM_WORKSPACE, 0, false);
  lowering_free(&p->low);
  decision_free(&p->decision);
  mem_arena_destroy(&p->arena);
  free(p->tiles);
  free(p->workers);
  free(p->worker_recompute_flops);
  free(p->region_stats);
  free(p);
  g->plan = NULL;
}

