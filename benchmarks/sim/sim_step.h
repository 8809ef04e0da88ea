/* What the scaling simulator reads of a compiled step: for each task of the
 * step's DAG, the kernel node it belongs to, whether it is the node's start
 * task, one of its tiles or its done task, and a cost key that groups tasks
 * whose durations should be equal (same kernel, same shapes, same kind of
 * tile). */
#ifndef REMAT_SIM_STEP_H
#define REMAT_SIM_STEP_H

#include "runtime/exec/step_state.h"
#include "sched/sched_internal.h"

#define SIM_START (-1) /* sim_step.tile of a start task */
#define SIM_DONE (-2)  /* sim_step.tile of a done task */

typedef struct sim_step {
  const compiled_step *c;
  step_state *state;  /* the graph's: tiles measured in isolation run on it */
  const sched_dag *dag;
  int32_t ntasks;
  int32_t *knode;     /* [ntasks] index into c->low.knodes */
  int64_t *tile;      /* [ntasks] tile index, SIM_START or SIM_DONE */
  uint64_t *key;      /* [ntasks] cost key */
  int64_t persistent_bytes; /* parameters, moments, inputs, scratch */
} sim_step;

/* Reads g's compiled step; 0 when g is not compiled or memory runs out. */
int sim_step_init(sim_step *s, remat_graph *g);
void sim_step_free(sim_step *s);

static inline const plan_knode *sim_knode(const sim_step *s, int32_t task) {
  return &s->c->low.knodes[s->knode[task]];
}

/* Name of a task's kernel ("linear.fwd", "optimizer.update", ...). */
const char *sim_task_name(const sim_step *s, int32_t task);

#endif
