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

#endif
