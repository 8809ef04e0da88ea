/* Fuzz target: safetensors loading. The input is written to a memfd and
 * loaded with remat_load_safetensors into a small compiled graph (params
 * "w" [3,4], "b" [3], "scale" [2,2,2]). A load that fails must fail with
 * REMAT_ERR_IO or REMAT_ERR_SHAPE, a one-line message that names the
 * function, and every parameter as it was; a load that succeeds is undone
 * for the next input. The seeds include offsets of 2^62 and 1e300,
 * negative and fractional offsets, header lengths of 100 MiB + 1 and
 * 2^64 - 1 in a file of 335 bytes, a header of NUL bytes and a tensor
 * named twice; a load that succeeds must bring only finite values (the
 * regressions hold a NaN, an Inf and a -Inf in a valid file). Every
 * input is also loaded as a training checkpoint: one that loads must
 * step (or reach REMAT_MAX_STEPS) and save a checkpoint that loads again
 * (the regressions hold remat.step 2^63-1, 2^53 and 2^53+1). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "remat.h"

enum { NPARAMS = 3, MAX_NUMEL = 16 };

typedef struct target_graph {
  remat_runtime *rt;
  remat_graph *g;
  remat_tensor *params[NPARAMS];
  float initial[NPARAMS][MAX_NUMEL];
} target_graph;

static target_graph *shared_graph(void) {
  static target_graph tg;
  if (tg.g != NULL)
    return &tg;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS | REMAT_SET_BIND,
                     .num_threads = 1,
                     .bind = REMAT_BIND_NONE};
  FUZZ_CHECK(remat_runtime_create(&rc, &tg.rt) == REMAT_OK);
  FUZZ_CHECK(remat_graph_create(tg.rt, &tg.g) == REMAT_OK);
  int64_t dx[2] = {2, 4}, dw[2] = {3, 4}, db[1] = {3}, ds[3] = {2, 2, 2};
  remat_tensor *x = remat_input(tg.g, "x", REMAT_F32, 2, dx);
  tg.params[0] = remat_param(tg.g, "w", 2, dw, REMAT_INIT_NORMAL, 1.0f);
  tg.params[1] = remat_param(tg.g, "b", 1, db, REMAT_INIT_ONES, 0.0f);
  tg.params[2] = remat_param(tg.g, "scale", 3, ds, REMAT_INIT_NORMAL, 1.0f);
  remat_tensor *y = remat_linear(tg.g, x, tg.params[0], tg.params[1]);
  remat_tensor *loss = remat_add(tg.g, remat_sum(tg.g, y),
                                 remat_sum(tg.g, tg.params[2]));
  FUZZ_CHECK(remat_compile(tg.g, loss, NULL) == REMAT_OK);
  for (int i = 0; i < NPARAMS; i++)
    FUZZ_CHECK(remat_read(tg.g, tg.params[i], tg.initial[i],
                          (size_t)remat_tensor_numel(tg.params[i]) * 4) ==
               REMAT_OK);
  return &tg;
}

static bool params_equal_initial(target_graph *tg) {
  for (int i = 0; i < NPARAMS; i++) {
    float now[MAX_NUMEL];
    size_t bytes = (size_t)remat_tensor_numel(tg->params[i]) * 4;
    FUZZ_CHECK(remat_read(tg->g, tg->params[i], now, bytes) == REMAT_OK);
    if (memcmp(now, tg->initial[i], bytes) != 0)
      return false;
  }
  return true;
}

/* The same input as a checkpoint: a load that succeeds brings a step
 * count that the next step can add to (REMAT_OK, or REMAT_ERR_LIMIT at
 * REMAT_MAX_STEPS) and a checkpoint saved after it loads again; a load
 * that fails changes nothing. */
static void checkpoint_round_trip(target_graph *tg, const char *path) {
  static char saved[64];
  if (saved[0] == '\0')
    snprintf(saved, sizeof saved, "/tmp/fuzz-ckpt-%d.safetensors",
             (int)getpid());
  remat_status s = remat_load_checkpoint(tg->g, path, NULL, NULL, 0);
  if (s != REMAT_OK) {
    FUZZ_CHECK(s == REMAT_ERR_IO || s == REMAT_ERR_SHAPE);
    FUZZ_CHECK(params_equal_initial(tg));
    return;
  }
  s = remat_step(tg->g, NULL);
  FUZZ_CHECK(s == REMAT_OK || s == REMAT_ERR_LIMIT || s == REMAT_ERR_NUMERIC);
  FUZZ_CHECK(remat_save_checkpoint(tg->g, saved, NULL, NULL, 0) == REMAT_OK);
  FUZZ_CHECK(remat_load_checkpoint(tg->g, saved, NULL, NULL, 0) == REMAT_OK);
  unlink(saved);
  for (int i = 0; i < NPARAMS; i++)
    FUZZ_CHECK(remat_write(tg->g, tg->params[i], tg->initial[i],
                           (size_t)remat_tensor_numel(tg->params[i]) * 4) ==
               REMAT_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  target_graph *tg = shared_graph();
  int fd = memfd_create("fuzz.safetensors", 0);
  FUZZ_CHECK(fd >= 0);
  for (size_t done = 0; done < size;) {
    ssize_t n = write(fd, data + done, size - done);
    FUZZ_CHECK(n > 0);
    done += (size_t)n;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  remat_status s = remat_load_safetensors(tg->g, path);
  if (s == REMAT_OK) {
    for (int i = 0; i < NPARAMS; i++) { /* a load brings finite values */
      float now[MAX_NUMEL];
      int64_t n = remat_tensor_numel(tg->params[i]);
      FUZZ_CHECK(remat_read(tg->g, tg->params[i], now, (size_t)n * 4) ==
                 REMAT_OK);
      for (int64_t k = 0; k < n; k++)
        FUZZ_CHECK(isfinite(now[k]));
    }
    for (int i = 0; i < NPARAMS; i++)
      FUZZ_CHECK(remat_write(tg->g, tg->params[i], tg->initial[i],
                             (size_t)remat_tensor_numel(tg->params[i]) * 4) ==
                 REMAT_OK);
  } else {
    const char *msg = remat_last_error();
    FUZZ_CHECK(s == REMAT_ERR_IO || s == REMAT_ERR_SHAPE);
    FUZZ_CHECK(strncmp(msg, "remat_load_safetensors: ", 24) == 0);
    FUZZ_CHECK(strchr(msg, '\n') == NULL);
    FUZZ_CHECK(params_equal_initial(tg));
  }
  checkpoint_round_trip(tg, path);
  close(fd);
  return 0;
}
