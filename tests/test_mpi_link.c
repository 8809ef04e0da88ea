/* Data parallel through the installed libraries: this program uses only
 * the public headers and links libremat.so and libremat_mpi.so (not the
 * internal archive), so it checks the split of dp/dp_link.h: that
 * libremat_mpi's hooks are found (the ranks' parameters stay bitwise equal
 * after steps on different data, and gradients were allreduced), that its
 * errors reach remat_last_error() of libremat, and that libremat alone
 * needs no MPI (checked by check_mpi_split in tests/meson.build). Run on 2
 * ranks by mpi_test.sh; prints "ok: ..." lines, exits 1 on a failure. */
#include <stdio.h>
#include <string.h>

#include "remat_mpi.h"

#define CHECK(call)                                                        \
  do {                                                                     \
    remat_status s_ = (call);                                              \
    if (s_ != REMAT_OK) {                                                  \
      fprintf(stderr, "FAIL: %s: %s: %s\n", #call,                        \
              remat_status_string(s_), remat_last_error());                \
      MPI_Abort(MPI_COMM_WORLD, 1);                                        \
    }                                                                      \
  } while (0)

enum { ROWS = 8, IN = 16, HIDDEN = 32, CLASSES = 4, STEPS = 3 };

static void fail(const char *what) {
  fprintf(stderr, "FAIL: %s\n", what);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv) {
  int level = 0, rank = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  remat_config cfg = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_BIND,
                      .num_threads = 1, .bind = REMAT_BIND_NONE};
  remat_runtime *rt;
  CHECK(remat_runtime_create(&cfg, &rt));
  remat_graph *g;
  CHECK(remat_graph_create(rt, &g));
  /* An error raised inside libremat_mpi, read through libremat. */
  if (remat_graph_dp_bucket_bytes(g, 1) != REMAT_ERR_INVALID_ARG ||
      strstr(remat_last_error(), "remat_graph_dp_bucket_bytes: needs a "
                                 "data-parallel graph") == NULL)
    fail("libremat_mpi's error did not reach remat_last_error()");
  CHECK(remat_graph_data_parallel(g, MPI_COMM_WORLD));
  const int64_t xd[] = {ROWS, IN}, td[] = {ROWS}, w1d[] = {HIDDEN, IN},
                w2d[] = {CLASSES, HIDDEN};
  remat_tensor *x = remat_input(g, "x", REMAT_F32, 2, xd);
  remat_tensor *t = remat_input(g, "t", REMAT_I32, 1, td);
  remat_tensor *w1 = remat_param(g, "w1", 2, w1d, REMAT_INIT_NORMAL, 0.2f);
  remat_tensor *w2 = remat_param(g, "w2", 2, w2d, REMAT_INIT_NORMAL, 0.2f);
  remat_tensor *h = remat_relu(g, remat_linear(g, x, w1, NULL));
  remat_tensor *loss = remat_cross_entropy(g, remat_linear(g, h, w2, NULL), t);
  /* Each rank initializes differently: rank 0's weights are broadcast. */
  CHECK(remat_graph_seed(g, (uint64_t)rank + 1));
  remat_optimizer opt = {.kind = REMAT_OPT_SGD, .lr = 0.1f};
  CHECK(remat_compile(g, loss, &opt));
  float xs[ROWS * IN];
  int32_t ts[ROWS];
  for (int step = 0; step < STEPS; step++) {
    for (int i = 0; i < ROWS * IN; i++) /* different data on each rank */
      xs[i] = (float)((i * 7 + step * 3 + rank * 11) % 13) / 13.0f - 0.5f;
    for (int i = 0; i < ROWS; i++)
      ts[i] = (i + rank + step) % CLASSES;
    CHECK(remat_feed(g, x, xs, sizeof xs));
    CHECK(remat_feed(g, t, ts, sizeof ts));
    CHECK(remat_step(g, NULL));
  }
  remat_dp_stats st;
  CHECK(remat_graph_dp_stats(g, &st));
  if (st.world_size != 2 || st.steps != STEPS || st.buckets < 1 ||
      st.comm_bytes <= 0)
    fail("remat_graph_dp_stats: expected 2 ranks, 3 steps, allreduces");
  float w[HIDDEN * IN], other[HIDDEN * IN];
  CHECK(remat_read(g, w1, w, sizeof w));
  memcpy(other, w, sizeof w);
  MPI_Bcast(other, (int)(sizeof other), MPI_BYTE, 0, MPI_COMM_WORLD);
  int differ = memcmp(w, other, sizeof w) != 0, any = 0;
  MPI_Allreduce(&differ, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any)
    fail("the ranks' w1 differ after data-parallel steps");
  printf("ok: rank %d: %d buckets, %lld bytes allreduced, w1 equal on both "
         "ranks\n", rank, st.buckets, (long long)st.comm_bytes);
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  MPI_Finalize();
  return 0;
}
