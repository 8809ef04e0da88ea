/* The scaling simulator's replay of one step: the layout's task DAG run by
 * `cores` simulated workers split evenly over `nodes` nodes by the
 * scheduler's own replay engine (sched/replay.h: the pick rule of
 * sched/run.c through sched/sched_pick.h and sched_steal_order, a per-task
 * overhead, queue locks held for a fixed time, sleeping and waking of idle
 * workers), with task durations measured here and memory bandwidth shared
 * as in sim_fluid.h. */
#ifndef REMAT_SIM_ENGINE_H
#define REMAT_SIM_ENGINE_H

#include "benchmarks/sim/sim_costs.h"
#include "benchmarks/sim/sim_placement.h"

typedef struct sim_machine {
  int cores, nodes;
  double mem_bw;         /* bytes/s of each node's memory */
  double link_bw;        /* bytes/s through each node's cross-node links */
  double core_bw;        /* bytes/s one core streams (this machine's) */
  double remote_latency; /* remote / local load latency: a task's remote
                            bytes, streamed at core_bw, take this much
                            longer */
  double lock_s;         /* one operation on a queue of the own node */
  double lock_remote;    /* factor for a queue of another node */
  double signal_s;       /* waking a sleeping worker, paid by the waker */
  double wake_s;         /* a woken worker's delay before it looks */
  double spin_s;         /* an idle worker looks this long, then sleeps */
} sim_machine;

typedef struct sim_result {
  double step_s;          /* from the first task's start to the last end */
  double work_s;          /* task durations alone and overheads, summed */
  double stall_s;         /* time tasks lost to bandwidth limits */
  double critical_path_s; /* longest path of durations and overheads */
  double bytes;           /* moved by the step's tasks */
  double remote_bytes;    /* of those, held by another node than the
                             task's worker's */
  int64_t peak_bytes;     /* persistent + live step buffers, at peak */
} sim_result;

/* Replays s laid out by l (l->nodes == m->nodes) with durations c; 0 when
 * memory runs out. */
int sim_run(const sim_step *s, const sim_costs *c, const sim_layout *l,
            const sim_machine *m, sim_result *out);

/* The longest path of durations alone plus overheads through l's DAG (-1
 * when memory runs out). When path is not NULL it receives the path's
 * tasks, first to last (room for l->ntasks), and *len their number. */
double sim_critical_path(const sim_layout *l, const sim_costs *c,
                         int32_t *path, int32_t *len);

#endif
