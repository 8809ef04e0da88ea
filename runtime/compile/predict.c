/* Predicting a plan's step time (predict.h): NUMA placement and the task
 * DAG as compile makes them (for workers dealt evenly over the nodes),
 * then the replay with each tile's time. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/measure.h"
#include "runtime/compile/predict.h"
#include "runtime/compile/taskgraph.h"
#include "sched/replay.h"

/* Bodies the replayed DAG names but never runs. */
static int no_body(void *run, void *arg, int worker) {
  (void)run;
  (void)arg;
  (void)worker;
  return 0;
}

static const task_bodies replay_bodies = {no_body, no_body, no_body, NULL,
                                          NULL};

double predict_tile_seconds(const plan_lowering *l, const plan_knode *kn,
                            cost_table *costs) {
  double tiles = kn->tiles > 0 ? (double)kn->tiles : 1.0;
  return plan_node_cost(l, kn, costs) / tiles / COST_FLOPS_PER_SECOND;
}

/* Each task's duration: a tile's time for the tiles of every kernel node
 * (its tasks after its done task), nothing for start and done tasks. */
static double *task_seconds(const predict_request *r, const plan_tasks *t) {
  int32_t n = sched_dag_num_tasks(t->dag);
  double *seconds = remat__calloc((size_t)n + 1, sizeof *seconds);
  for (int32_t i = 0; seconds != NULL && i < r->low->nknodes; i++) {
    const plan_knode *kn = &r->low->knodes[i];
    double tile = predict_tile_seconds(r->low, kn, r->costs);
    for (int64_t k = 1; k <= kn->tiles; k++)
      seconds[t->done_task[i] + k] = tile;
  }
  return seconds;
}

static remat_status replay(const predict_request *r, const plan_tasks *t,
                           double *out) {
  sched_replay_dag d;
  sched_replay_owned owned;
  double *seconds = task_seconds(r, t);
  remat_status s = REMAT_ERR_OUT_OF_MEMORY;
  if (seconds != NULL && sched_replay_dag_of(t->dag, &d, &owned)) {
    sched_replay_timing tm = {.overhead_s = PREDICT_TASK_OVERHEAD_S,
                              .lock_s = PREDICT_LOCK_S,
                              .lock_remote = 1.0,
                              .wake_s = PREDICT_WAKE_S};
    *out = sched_replay_fixed(&d, r->nworkers, r->nnodes, &tm, seconds);
    if (*out >= 0)
      s = REMAT_OK;
    sched_replay_owned_free(&owned);
  }
  free(seconds);
  return s;
}

remat_status predict_step_seconds(const predict_request *r, double *seconds) {
  int nodes = r->nnodes < 1 ? 1 : r->nnodes;
  int *worker_node = remat__malloc((size_t)r->nworkers * sizeof(int));
  int *node_first = remat__malloc(((size_t)nodes + 1) * sizeof(int));
  numa_plan numa;
  plan_tasks tasks;
  memset(&numa, 0, sizeof numa);
  memset(&tasks, 0, sizeof tasks);
  remat_status s = REMAT_ERR_OUT_OF_MEMORY;
  if (worker_node != NULL && node_first != NULL) {
    for (int k = 0; k <= nodes; k++)
      node_first[k] = (int)((int64_t)k * r->nworkers / nodes);
    for (int k = 0; k < nodes; k++)
      for (int v = node_first[k]; v < node_first[k + 1]; v++)
        worker_node[v] = k;
    sched_placement pl = {.nworkers = r->nworkers, .nnodes = nodes,
                          .worker_node = worker_node,
                          .node_first = node_first};
    s = numa_place(r->g, r->low, &pl, &numa);
    if (s == REMAT_OK) {
      taskgraph_request tr = {r->g, r->low, &numa, r->lookahead,
                              &replay_bodies};
      s = taskgraph_build(&tr, &tasks);
    }
    if (s == REMAT_OK)
      s = taskgraph_finalize(&tasks);
    if (s == REMAT_OK)
      s = replay(r, &tasks, seconds);
  }
  plan_tasks_free(&tasks);
  numa_plan_free(&numa);
  free(worker_node);
  free(node_first);
  return s;
}
