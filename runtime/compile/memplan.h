/* Stage "memory prediction": the peak bytes of a lowering run in program
 * order (each buffer allocated at its first writer, freed after its last
 * user), the persistent bytes, and the blocks the arena should reserve. */
#ifndef REMAT_RUNTIME_MEMPLAN_H
#define REMAT_RUNTIME_MEMPLAN_H

#include "runtime/compile/numa_place.h"

/* Parameters, their gradients, optimizer moments, inputs, kept tensors and
 * the per-worker scratchpads, rounded as the arena rounds them. */
int64_t memplan_persistent_bytes(const remat_graph *g, const plan_lowering *l,
                                 int nworkers, int nnodes);
/* Peak of the transient (per-step) bytes in program order; live[i] (live
 * may be NULL) gets the transient bytes while node i runs. -1: out of
 * memory. */
int64_t memplan_transient_peak(const plan_lowering *l, int64_t *live);

/* `count` blocks of `bytes` bytes (rounded as the arena rounds) live at
 * once in arena home `home` (numa_plan.home). */
typedef struct memplan_blocks {
  int64_t bytes, count;
  int home;
} memplan_blocks;

typedef struct memplan_prediction {
  int64_t peak;           /* persistent + transient */
  int64_t transient_peak; /* the activation peak */
  memplan_blocks *expect; /* [nexpect]: what the first step reserves */
  int nexpect;
} memplan_prediction;

/* Predicts the step's peak, and how many transient blocks of each size and
 * home program order holds at once (the step state reserves them before
 * the first step). On failure `out` holds nothing. */
remat_status memplan_predict(const remat_graph *g, const plan_lowering *l,
                             const numa_plan *numa, int nworkers,
                             memplan_prediction *out);
void memplan_prediction_free(memplan_prediction *p);

#endif
