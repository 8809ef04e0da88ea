/* The REMAT_VERBOSE report of a compiled step and of its first run. */
#ifndef REMAT_RUNTIME_REPORT_H
#define REMAT_RUNTIME_REPORT_H

#include "runtime/compile/compiled.h"

/* Stage "report": prints the compiled step's decision per region when
 * REMAT_VERBOSE >= 1 (and its kernel nodes at 2); nothing else. */
remat_status report_plan(const compiled_step *c);
/* After the first run that succeeded (REMAT_VERBOSE >= 1; the caller
 * calls it once): its measured peak beside the predicted one, on one line
 * of stderr. */
void report_first_run(const compiled_step *c, const remat_step_stats *st,
                      const char *what);

/* After a graph was planned again with its measured kernel times
 * (exec/replan.h; REMAT_VERBOSE >= 1): one line of stderr saying that
 * the plan printed just before replaces the compiled one (status
 * REMAT_OK), that the same tensors stay saved (REMAT_ERR_STATE), or why
 * the compiled plan stays (another status, with `error`). */
void report_replan(const compiled_step *c, remat_status status,
                   const char *error);

#endif
