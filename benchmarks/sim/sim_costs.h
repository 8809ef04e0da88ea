/* Task durations for the scaling simulator, measured on this machine on one
 * thread: either from the Chrome trace of a real step (the median duration
 * of the tasks that share a cost key), or by running sample tiles of each
 * kernel in isolation on buffers allocated for the purpose (for a model too
 * large to run a step of here). */
#ifndef REMAT_SIM_COSTS_H
#define REMAT_SIM_COSTS_H

#include "benchmarks/sim/sim_step.h"

typedef struct sim_costs {
  double *task_s;    /* [ntasks] duration of each task on one core */
  double overhead_s; /* per task: the scheduler's own time between tasks */
  int groups;        /* distinct cost keys */
} sim_costs;

/* From the traces at paths[0..n) of steps of s's DAG on one thread that
 * took walls[i] each: each task gets the median duration of its key over
 * every trace, and overhead_s is the median over the steps of the time
 * outside task bodies, spread over the tasks. 0 on failure with a message
 * in err. */
int sim_costs_from_traces(const sim_step *s, const char *const *paths,
                          const double *walls, int n, sim_costs *c,
                          char err[256]);

/* By running, for each key, up to three tiles of one kernel node (one
 * run to warm up, then the median of nine, in thread CPU time so that
 * other processes on a shared machine do not count) on worker 0 of s's
 * plan, with the buffers
 * the node touches allocated and zeroed if the step holds none. Start tasks
 * cost their zero-fill at memset_bw bytes/s, done tasks nothing; both pay
 * overhead_s, which the caller gives (a trace's figure). Updates run with
 * the parameters of the graph: call it after the graph's real steps. */
int sim_costs_isolated(const sim_step *s, double memset_bw, double overhead_s,
                       sim_costs *c, char err[256]);

/* Bytes per second of memset by `threads` OpenMP threads over 64 MiB
 * each: the best of three runs after one that faults the pages in (the
 * best, because other processes on a shared machine only slow it). */
double sim_memset_bw(int threads);

void sim_costs_free(sim_costs *c);

#endif
