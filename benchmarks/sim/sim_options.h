/* Command-line options of sim_scaling: the model options of bench_train,
 * the simulated machines (lists of core and node counts) and the figures
 * of the simulated server, each overridable. */
#ifndef REMAT_SIM_OPTIONS_H
#define REMAT_SIM_OPTIONS_H

#include "remat.h"
#include "remat_gpt.h"

#define SIM_MAX_LIST 32
#define SIM_MAX_ROUNDS 100

typedef struct sim_options {
  remat_gpt_config cfg;
  int steps, threads;
  const char *policy;
  int64_t budget;
  int json;
  int isolated; /* --costs isolated: no step of the model is run */
  int cores[SIM_MAX_LIST], ncores;
  int nodes[SIM_MAX_LIST], nnodes;
  double mem_gbs;        /* per node */
  double link_gbs;       /* per node, cross-node */
  double remote_latency; /* remote / local */
  double lock_ns, lock_remote, signal_us, wake_us, spin_us;
  double overhead_us;    /* per task, for --costs isolated */
  char split_name[SIM_MAX_LIST][32]; /* --split: tiles of these kernels */
  int split_parts[SIM_MAX_LIST];     /* simulated as this many pieces */
  int nsplits;
} sim_options;

/* Fills o from argv; prints usage and exits 0 on --help; 0 (after a
 * message on stderr) when an option is not valid. */
int sim_parse_args(int argc, char **argv, sim_options *o);

#endif
