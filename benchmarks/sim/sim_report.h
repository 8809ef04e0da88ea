/* What sim_scaling prints: the model and how costs were measured, the
 * validation against steps measured here, the scaling table, the kernels
 * that take the most time and the kernels on the critical path; as text
 * or as JSON. */
#ifndef REMAT_SIM_REPORT_H
#define REMAT_SIM_REPORT_H

#include <stdbool.h>
#include <stdio.h>

#include "benchmarks/sim/sim_engine.h"
#include "benchmarks/sim/sim_options.h"

typedef struct sim_row {
  int cores, nodes;
  bool placed;
  double efficiency; /* one simulated core's step / (cores x this step) */
  sim_result r;
} sim_row;

typedef struct sim_validation {
  int threads;
  double measured_s, predicted_s;
  double cpu_share; /* CPU time / (wall x threads) of the measured steps */
} sim_validation;

/* The tasks of one kernel on the critical path. */
typedef struct sim_path_part {
  const char *name;
  int tasks;
  double s;
} sim_path_part;

#define SIM_PATH_PARTS 64

typedef struct sim_report {
  const sim_options *o;
  const sim_step *s;
  const sim_costs *c;
  double isolated_over_trace; /* sum of isolated costs / trace costs, 0 if
                                 not measured */
  double one_core_s;          /* simulated step on one core */
  double here_bw, core_bw;    /* memset bytes/s here: N threads, 1 thread */
  sim_split splits[SIM_MAX_LIST]; /* --split */
  double phase_s[3];          /* this run: compile, costs and validation,
                                 simulation */
  sim_validation val[2];
  int nval;
  sim_row *rows;
  int nrows;
  sim_path_part path[SIM_PATH_PARTS]; /* the critical path of the
                                         one-node layout, by kernel */
  int npath;
  double path_s;
} sim_report;

/* Fills r->path from the critical path of l; 0 when memory runs out. */
int sim_report_set_path(sim_report *r, const sim_layout *l);

void sim_report_print(const sim_report *r, FILE *f);

#endif
