/* The bodies of a kernel node's tasks, which the DAG stage hands to the
 * scheduler: the start task allocates (or zero-fills) the node's buffers
 * and binds them, each tile task runs one tile, and the done task frees
 * the buffers whose last user it is. */
#ifndef REMAT_RUNTIME_TASKS_H
#define REMAT_RUNTIME_TASKS_H

/* arg: the plan_knode. */
int tasks_start(void *arg, int worker);
/* arg: the plan_tile. */
int tasks_tile(void *arg, int worker);
/* arg: the plan_knode. */
int tasks_done(void *arg, int worker);

#endif
