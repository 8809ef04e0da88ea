/* Names of the step's kernel nodes as traces show them: the layer (the
 * name of the region, remat_region_name), the tensor and what the node
 * does, e.g. "h3.attn_probs recompute", "h3.ffn_in dW". */
#ifndef REMAT_RUNTIME_TASK_NAMES_H
#define REMAT_RUNTIME_TASK_NAMES_H

#include "runtime/compile/lowering.h"

#define TASK_NAME_MAX 160

/* The nearest named region (remat_region_name) at or around region r,
 * "" when none. */
const char *task_names_layer(const remat_graph *g, int32_t r);

/* The one table of kernel-node names, by kind (knode_kind): */
/* the kind as a word: "forward", "seed", "backward", "recompute", "check",
 * "gate" or "update" (REMAT_VERBOSE's node list); */
const char *task_names_kind(knode_kind kind);
/* the category traces group it in (the step trace's and the scheduler's):
 * the kind, or "optimizer" for check, gate and update; */
const char *task_names_category(knode_kind kind);
/* its kernel's name ("linear.fwd"), or for a node without a kernel
 * "loss.seed", "optimizer.check", "optimizer.gate" or "optimizer.update":
 * the scheduler's messages and the simulator's cost groups. */
const char *task_names_kernel(const plan_knode *kn);

/* One name per kernel node of `l`, TASK_NAME_MAX bytes each, in an array
 * the caller frees; NULL when out of memory. */
char *task_names_build(const remat_graph *g, const plan_lowering *l);

#endif
