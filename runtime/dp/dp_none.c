/* The data-parallel hooks (dp.h) of a build without MPI: no graph is ever
 * data parallel, so each does nothing. */
#include "runtime/dp/dp.h"

remat_status dp_add_tasks(const compiled_step *c, step_state *state,
                          sched_dag *dag, struct dp_plan **out) {
  (void)c;
  (void)state;
  (void)dag;
  *out = NULL;
  return REMAT_OK;
}

remat_status dp_step_begin(const compiled_step *c, step_state *state) {
  (void)c;
  (void)state;
  return REMAT_OK;
}

remat_status dp_step_end(const compiled_step *c, step_state *state,
                         remat_status s, char *err, size_t err_size) {
  (void)c;
  (void)state;
  (void)err;
  (void)err_size;
  return s;
}

void dp_plan_free(struct dp_plan *d) { (void)d; }

void dp_graph_free(remat_graph *g) { (void)g; }
