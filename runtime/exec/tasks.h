/* The bodies of a kernel node's tasks, which the DAG stage hands to the
 * scheduler: the start task allocates (or zero-fills) the node's buffers
 * and binds them, each tile task runs one tile, and the done task frees
 * the buffers whose last user it is. Each gets the run (step_run) as its
 * context. */
#ifndef REMAT_RUNTIME_TASKS_H
#define REMAT_RUNTIME_TASKS_H

#include "runtime/exec/step_state.h"

/* start, tile and done, for the DAG stage (taskgraph.h). */
extern const task_bodies remat__task_bodies;

/* Points knode k's op_bufs (s->bufs[k]) at its buffers' memory, as its
 * start task does (also for tiles run outside a step: the simulator). */
void tasks_bind(const compiled_step *c, step_state *s, int32_t k);
/* The maxima of every update tile (step_state.tile_max) from the
 * parameters and moments as they are, after something else than an update
 * wrote them (creation, remat_write, a load, the broadcast). */
void tasks_scan_maxima(const compiled_step *c, step_state *s);

/* Test hook: when set, called with the graph and the knode_kind at
 * the start of each task body, before the task looks at remat_cancel (a
 * test cancels at a chosen point of the step from it). */
extern void (*remat__task_hook)(const remat_graph *g, int knode_kind);

/* arg: the plan_knode. */
int tasks_start(void *run, void *arg, int worker);
/* arg: the plan_tile. */
int tasks_tile(void *run, void *arg, int worker);
/* arg: the plan_knode. */
int tasks_done(void *run, void *arg, int worker);

#endif
