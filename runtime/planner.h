/* The memory-budget planner's optimizer over a chain of checkpoint regions,
 * apart from the graph so that tests can check it against brute force. */
#ifndef REMAT_RUNTIME_PLANNER_H
#define REMAT_RUNTIME_PLANNER_H

#include <stdint.h>

#define PLANNER_MAX_CHOICES 4

/* One region of the chain: for each candidate policy, the bytes it keeps
 * alive from forward to backward, the extra bytes it needs while its own
 * forward or backward runs, and the FLOPs it recomputes. */
typedef struct chain_region {
  int nchoices;
  int64_t saved[PLANNER_MAX_CHOICES];
  int64_t working[PLANNER_MAX_CHOICES];
  double recompute[PLANNER_MAX_CHOICES];
} chain_region;

/* Peak of an assignment: max over regions r of (saved bytes of regions
 * before r + working bytes of r), and (all saved bytes + tail). */
int64_t chain_peak(const chain_region *r, int n, int64_t tail,
                   const int *choice);

/* Fills `choice` with the assignment of least total recompute whose peak is
 * at most `budget` (ties: the smaller peak). Returns 0, or -1 when no
 * assignment fits, or -2 when out of memory. Exact: dynamic programming
 * over Pareto frontiers of (saved bytes so far, recompute so far). */
int chain_plan(const chain_region *r, int n, int64_t tail, int64_t budget,
               int *choice);

#endif
