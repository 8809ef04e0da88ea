/* Memory bandwidth shared by the running tasks of the scaling simulator.
 * Each node's memory serves at most mem_bw bytes/s and each node's
 * cross-node links carry at most link_bw bytes/s (reads and writes of
 * bytes that live on another node use the links of both nodes). A running
 * task asks each resource for its bytes there divided by its duration
 * alone; when the tasks on a resource ask for more than it has, all of
 * them slow down by the ratio, and a task runs at the pace of its slowest
 * resource. Rates change only when a task starts or ends. */
#ifndef REMAT_SIM_FLUID_H
#define REMAT_SIM_FLUID_H

#include "benchmarks/sim/sim_placement.h"

#define SIM_RESOURCES (2 * SIM_MAX_NODES) /* memory of each node, then links */

typedef struct sim_fluid {
  int nodes, slots;
  double mem_bw, link_bw;
  double now;
  double demand[SIM_RESOURCES]; /* bytes/s asked of each resource */
  double *left;                 /* [slots] seconds of work left, alone */
  double *slow;                 /* [slots] current slowdown (>= 1) */
  double (*rate)[SIM_RESOURCES]; /* [slots] what each running task asks */
  unsigned *uses;               /* [slots] bit r: asks resource r */
  int saturated;                /* some resource is asked for too much */
  int *running, nrunning;       /* slots in use */
  int *where;                   /* [slots] index in running, -1 if free */
  double stall_s;               /* time running tasks lost to bandwidth */
} sim_fluid;

int sim_fluid_init(sim_fluid *f, int slots, int nodes, double mem_bw,
                   double link_bw);
void sim_fluid_free(sim_fluid *f);
/* Moves time to t, progressing every running task at its pace. */
void sim_fluid_advance(sim_fluid *f, double t);
/* Starts a task in `slot` now, running on `node`, that takes `seconds`
 * alone and moves bytes[h] bytes held by node h. */
void sim_fluid_add(sim_fluid *f, int slot, int node, double seconds,
                   const float *bytes);
void sim_fluid_remove(sim_fluid *f, int slot);
/* When the next running task ends, and its slot; INFINITY when none. */
double sim_fluid_next(const sim_fluid *f, int *slot);

#endif
