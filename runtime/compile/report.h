/* The compiled step's summary per region, and the REMAT_VERBOSE report. */
#ifndef REMAT_RUNTIME_REPORT_H
#define REMAT_RUNTIME_REPORT_H

#include "runtime/compile/compiled.h"

/* Stage "report": *stats gets the per-region summary of c (the caller
 * frees it); prints the plan when REMAT_VERBOSE >= 1. */
remat_status report_plan(const compiled_step *c, plan_region_stats **stats);
/* After the first run that succeeded (REMAT_VERBOSE >= 1; the caller
 * calls it once): its measured peak beside the predicted one, on one line
 * of stderr. */
void report_first_run(const compiled_step *c, const remat_step_stats *st,
                      const char *what);

#endif
