/* Stage "memory prediction": the peak bytes of a lowering run in program
 * order (each buffer allocated at its first writer, freed after its last
 * user), the persistent bytes, and the blocks the arena should reserve. */
#ifndef REMAT_RUNTIME_MEMPLAN_H
#define REMAT_RUNTIME_MEMPLAN_H

#include "runtime/compile/lowering.h"

/* Parameters, their gradients, optimizer moments, inputs, kept tensors and
 * the per-worker scratchpads, rounded as the arena rounds them. */
int64_t memplan_persistent_bytes(const remat_graph *g, const plan_lowering *l,
                                 int nworkers, int nnodes);
/* Peak of the transient (per-step) bytes in program order; live[i] (live
 * may be NULL) gets the transient bytes while node i runs. -1: out of
 * memory. */
int64_t memplan_transient_peak(const plan_lowering *l, int64_t *live);

typedef struct memplan_prediction {
  int64_t peak;           /* persistent + transient */
  int64_t transient_peak; /* the activation peak */
} memplan_prediction;

/* Predicts the step's peak and tells the arena how many blocks of each size
 * program order holds at once, so that the first step reserves them. */
remat_status memplan_predict(const remat_graph *g, const plan_lowering *l,
                             int nworkers, int nnodes, mem_arena *arena,
                             memplan_prediction *out);

#endif
