/* Measured kernel time as the planner's recompute cost: a table, kept by
 * the runtime, of the seconds one tile of a kernel takes on this machine,
 * keyed by the kernel and its op's shapes, filled from the task times of a
 * graph's first steps and read by every later compile of the runtime in
 * place of the roofline. */
#ifndef REMAT_RUNTIME_COSTS_H
#define REMAT_RUNTIME_COSTS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

/* FLOP units per measured second: the planner's costs stay in the
 * roofline's units (planner.h), so that a measured kernel and one not yet
 * measured add up in one sum (1e11: about one core's f32 matmul rate). */
#define COST_FLOPS_PER_SECOND 1.0e11

/* Steps of a graph whose task times fill the table (the first of them
 * warms caches and pages: each kernel keeps its least time per tile). */
#define COST_STEPS 3

typedef struct cost_entry cost_entry;
typedef struct cost_block cost_block;

typedef struct cost_table {
  pthread_mutex_t lock;
  cost_block *blocks;  /* graphs' blocks, newest first (owned) */
  cost_entry *loose;   /* entries noted without a block */
  int32_t nloose, cap;
} cost_table;

void cost_table_init(cost_table *t);
void cost_table_free(cost_table *t);

/* The measured seconds of one tile of kernel k of an op of description d
 * (the op it belongs to), or -1 when it was never measured. */
double cost_table_tile_seconds(cost_table *t, const op_desc *d,
                               const op_kernel *k);
/* Records one tile time of kernel k: every entry of its key keeps the
 * least seen. A key that no block holds gets an entry of the table's own,
 * which may allocate: false when out of memory (the table unchanged). */
bool cost_table_note(cost_table *t, const op_desc *d, const op_kernel *k,
                     double tile_seconds);
/* Kernels with a measured time. */
int32_t cost_table_count(cost_table *t);
/* Forgets every time. */
void cost_table_clear(cost_table *t);

/* A block of room for `cap` keys (one allocation; NULL when out of
 * memory), filled with cost_block_add (a key it holds already, or past
 * its room, is left out) and handed to the table, which owns it from
 * then on: a graph's kernels get their entries before any step, so that
 * noting their times allocates nothing. An adopted block's entries start
 * with the times the table has for their keys (lookups read the newest
 * block first, so an unmeasured entry must not hide a measured one). */
cost_block *cost_block_new(int32_t cap);
void cost_block_add(cost_block *b, const op_desc *d, const op_kernel *k);
void cost_table_adopt(cost_table *t, cost_block *b);

/* The description and kernel by which the table keys kernel node kn of
 * l: its op's, or for a node of no op (seed, check, gate, update) one
 * named by its kind ("optimizer.update") with its tiles and the bytes of
 * the buffers it touches. */
struct plan_lowering;
struct plan_knode;
void cost_key_of(const struct plan_lowering *l, const struct plan_knode *kn,
                 op_desc *d, op_kernel *k);

/* The cost of running kernel k over `tiles` tiles, in FLOP units: the
 * measured time x COST_FLOPS_PER_SECOND when `t` has it, else `roofline`
 * (the caller's roofline cost). `t` may be NULL. */
double cost_of_kernel(cost_table *t, const op_desc *d, const op_kernel *k,
                      int64_t tiles, double roofline);

#endif
