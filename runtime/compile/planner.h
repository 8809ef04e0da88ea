/* Stage "plan remat": decides, for every activation, saved or recomputed,
 * from each region's policy (its own, the runtime's default, or under a
 * memory budget the candidate with the least recompute that fits). The
 * budget's optimizer over the chain of regions is declared apart from the
 * graph so that tests can check it against brute force. */
#ifndef REMAT_RUNTIME_PLANNER_H
#define REMAT_RUNTIME_PLANNER_H

#include <stdint.h>

#include "runtime/compile/costs.h"
#include "runtime/internal.h"

/* Candidates per region: the four built-in policies that order the
 * tensors by kind (everything, dots, dots without batch dimensions,
 * nothing), then up to PLANNER_MAX_SETS per-tensor save sets: the k-th
 * saves the first k/(sets+1) of the region's tensors ranked by recompute
 * cost per byte (planner.c). */
#define PLANNER_POLICY_CHOICES 4
#define PLANNER_MAX_SETS 12
#define PLANNER_MAX_CHOICES (PLANNER_POLICY_CHOICES + PLANNER_MAX_SETS)

/* The planner's cost of a kernel: its time on a roofline in FLOP units,
 * max(FLOPs, PLANNER_FLOPS_PER_BYTE x bytes it reads and writes), so that
 * recomputing a pass over memory (a norm, an activation) is not counted
 * as nearly free. A fixed machine balance keeps plans the same on every
 * machine and every run. */
#define PLANNER_FLOPS_PER_BYTE 8.0

/* The roofline cost of running graph op o's forward once: max(its FLOPs,
 * PLANNER_FLOPS_PER_BYTE x the bytes of its inputs and output). */
double plan_op_cost(const remat_graph *g, int32_t o);
/* The cost of running graph op o's forward once as the planner counts
 * it: the measured time of its forward kernels in FLOP units
 * (COST_FLOPS_PER_SECOND) when `costs` has every one of them, else
 * plan_op_cost. The per-tensor sets rank a tensor by this cost of its
 * producer per byte of the tensor. `costs` may be NULL. */
double plan_op_time(const remat_graph *g, int32_t o, cost_table *costs);

/* One region of the chain: for each candidate policy,
 * - saved: the bytes the region keeps alive from its forward to its
 *   backward (its share of what is alive when backward starts);
 * - working: the bytes it needs beyond the saved bytes of the regions
 *   before it, while its own forward, recompute or backward runs. Measured
 *   as working = live - before, where live is the most transient bytes
 *   alive while one of its nodes runs and before is the sum of the saved
 *   bytes of the regions before it in the chain;
 * - recompute: the cost of what it recomputes (measured time where the
 *   cost table has it, else the roofline: plan_node_cost). */
typedef struct chain_region {
  int nchoices;
  int64_t saved[PLANNER_MAX_CHOICES];
  int64_t working[PLANNER_MAX_CHOICES];
  double recompute[PLANNER_MAX_CHOICES];
} chain_region;

/* Peak of an assignment: max over regions r of (saved bytes of regions
 * before r + working bytes of r), and (all saved bytes + tail), where the
 * tail is the most bytes that nodes outside every region (the loss, the
 * seed, embeddings) need beyond all regions' saved bytes. */
int64_t chain_peak(const chain_region *r, int n, int64_t tail,
                   const int *choice);

/* Entries kept per region by chain_plan before it thins its frontier. */
#define CHAIN_FRONTIER_MAX 1024

/* Fills `choice` with the assignment of least total recompute whose peak is
 * at most `budget` (ties: the smaller peak among those the frontier kept).
 * Returns 0, or -1 when no assignment fits, or -2 when out of memory.
 * Dynamic programming over Pareto frontiers of (saved bytes so far,
 * recompute so far): exact while a frontier holds at most
 * CHAIN_FRONTIER_MAX entries; past that it is thinned by saved bytes (every
 * assignment it returns still fits), so that its time and memory are
 * O(regions x CHAIN_FRONTIER_MAX x choices). */
int chain_plan(const chain_region *r, int n, int64_t tail, int64_t budget,
               int *choice);

/* Fills choices[k * n .. k * n + n) for k < the returned count (at most
 * `max`) with assignments that fit `budget`, from the dynamic program's
 * last frontier: the first is chain_plan's; the others spread evenly over
 * the rest in order of recompute (each more recompute and fewer saved
 * bytes than the one before). Returns the count, or -1 when none fits,
 * or -2 when out of memory. */
int chain_plans(const chain_region *r, int n, int64_t tail, int64_t budget,
                int max, int *choices);

/* Why a region got its policy. */
typedef enum region_source {
  REGION_OWN,     /* the policy given to remat_region_begin */
  REGION_DEFAULT, /* the runtime's default (REMAT_POLICY) */
  REGION_BUDGET   /* chosen under the memory budget */
} region_source;

/* The output of the stage. */
typedef struct remat_decision {
  int32_t nregions;
  bool *saved;              /* [ntensors]: kept from forward to backward */
  int32_t *deciding_region; /* [ntensors]: region whose policy decided, -1
                               when none did (outside regions: saved) */
  char **region_policy;     /* [nregions]: the policy each region got */
  region_source *source;    /* [nregions] */
} remat_decision;

/* What the planner plans for. Errors are recorded on g (sticky). */
typedef struct plan_target {
  remat_graph *g;
  int32_t loss;     /* -1: forward only */
  bool has_opt;
  remat_optimizer_kind opt_kind;
  const char *default_policy; /* of regions that name none (REMAT_POLICY) */
  int64_t budget;   /* 0: none */
  int nworkers;
  int nnodes;       /* parameters have a copy on each (numa_place.c) */
  cost_table *costs; /* measured kernel times (the runtime's), NULL: the
                        roofline alone */
  int lookahead;     /* the runtime's (taskgraph.h), for the replay */
  bool replay;       /* score the budget's candidates by predicted step
                        time (predict.h), not by recompute */
  int replay_workers, replay_nodes; /* the machine replayed; 0: nworkers,
                                       nnodes (tests and the simulator
                                       plan for machines they are not) */
} plan_target;

/* Candidates the replay scores under a budget: the least recompute's,
 * others along the chain's last frontier (chain_plans) and the least
 * roofline recompute's. A candidate
 * replaces the one of less recompute only when its predicted step is
 * shorter by more than PLANNER_REPLAY_MARGIN of it. */
#define PLANNER_REPLAY_CANDIDATES 8
#define PLANNER_REPLAY_MARGIN 0.01

remat_status plan_remat(const plan_target *t, remat_decision *out);
void decision_free(remat_decision *d);

#endif
