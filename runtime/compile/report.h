/* The plan's summary per region, and the REMAT_VERBOSE report. */
#ifndef REMAT_RUNTIME_REPORT_H
#define REMAT_RUNTIME_REPORT_H

#include "runtime/compile/step_plan.h"

/* Fills p->region_stats and prints the plan when REMAT_VERBOSE >= 1. */
remat_status report_plan(remat_step_plan *p);
/* After the first run that succeeded (REMAT_VERBOSE >= 1): its measured
 * peak beside the predicted one, on one line of stderr. */
void report_first_run(remat_step_plan *p, const remat_step_stats *st,
                      const char *what);

#endif
