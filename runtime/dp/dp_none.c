/* The data-parallel hooks (dp.h) of a build without MPI: no graph is ever
 * data parallel, so compile places no data-parallel task and each hook
 * does nothing. */
#include "runtime/dp/dp.h"

int64_t dp_bucket_bytes(const remat_graph *g) {
  (void)g;
  return 0;
}

remat_status dp_state_create(const compiled_step *c, step_state *state,
                             struct dp_plan **out) {
  (void)c;
  (void)state;
  *out = NULL;
  return REMAT_OK;
}

int dp_bucket_task(void *run, void *arg, int worker) {
  (void)run;
  (void)arg;
  (void)worker;
  return REMAT_ERR_STATE; /* never placed without MPI */
}

int dp_agree_task(void *run, void *arg, int worker) {
  (void)run;
  (void)arg;
  (void)worker;
  return REMAT_ERR_STATE; /* never placed without MPI */
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
