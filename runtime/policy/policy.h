/* Remat policies inside the runtime: their representation and the
 * decisions the planner builds on. */
#ifndef REMAT_RUNTIME_POLICY_H
#define REMAT_RUNTIME_POLICY_H

#include "runtime/internal.h"

typedef enum policy_kind {
  POLICY_EVERYTHING,
  POLICY_NOTHING,
  POLICY_DOTS,
  POLICY_DOTS_NO_BATCH,
  POLICY_ONLY_NAMES,
  POLICY_ALL_BUT_NAMES,
  POLICY_BOTH,
  POLICY_AUTO
} policy_kind;

struct remat_policy {
  policy_kind kind;
  char **names;
  int nnames;
  struct remat_policy *a, *b; /* POLICY_BOTH */
};

remat_policy *policy_clone(const remat_policy *src);
/* Frees the policies of every region of g. */
void policy_free_all(remat_graph *g);
/* Does policy p save tensor t, the output of an op described by producer? */
bool policy_saves(const remat_policy *p, const op_desc *producer,
                  const remat_tensor *t);
remat_status policy_check_names(remat_graph *g, const remat_policy *p);
/* The default policy of regions that name none, parsed from `text` (the
 * runtime's REMAT_POLICY); a bad one is recorded on g. */
remat_status policy_resolve_default(remat_graph *g, const char *text,
                                    remat_policy **out);
/* The decision for every tensor given one policy per region: saved[t],
 * and deciding[t], the region whose policy decided (-1: none, saved). */
remat_status policy_decide_with(const remat_graph *g, bool *saved,
                                int32_t *deciding,
                                const remat_policy *const *region_policy);

#endif
