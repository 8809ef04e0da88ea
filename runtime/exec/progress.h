/* The progress callback of a graph (remat_set_progress): a thread of the
 * graph's own, never a worker, that calls it with the fraction of the
 * run's tasks finished at most every min_interval_ms while a run is in
 * progress, holding no lock of the scheduler or of the graph. */
#ifndef REMAT_RUNTIME_PROGRESS_H
#define REMAT_RUNTIME_PROGRESS_H

#include "runtime/internal.h"

/* Sets, changes or (fn NULL) removes g's callback; the caller is inside g
 * (graph_enter), so no run is in progress. */
remat_status progress_set(remat_graph *g, remat_progress_fn fn, void *user,
                          int min_interval_ms);
/* Stops the thread and frees it (graph destroy); NULL is a no-op. */
void progress_free(struct graph_progress *p);
/* Before a run of `ntasks` tasks: zeroes the counters and starts the
 * clock; returns the counters for sched_run_opts.progress (NULL when the
 * graph has no callback). */
_Atomic int64_t *progress_begin(struct graph_progress *p, int64_t ntasks);
/* After the run: no call starts any more, and one in progress has
 * returned when this returns. */
void progress_end(struct graph_progress *p);

#endif
