/* The data-parallel hooks (dp.h) of a build without MPI: no graph is ever
 * data parallel, so each does nothing. */
#include "runtime/dp/dp.h"

remat_status dp_add_tasks(remat_step_plan *p) {
  (void)p;
  return REMAT_OK;
}

remat_status dp_step_begin(remat_step_plan *p) {
  (void)p;
  return REMAT_OK;
}

remat_status dp_step_end(remat_step_plan *p, remat_status s, char *err,
                         size_t err_size) {
  (void)p;
  (void)err;
  (void)err_size;
  return s;
}

void dp_plan_free(remat_step_plan *p) { (void)p; }

void dp_graph_free(remat_graph *g) { (void)g; }
