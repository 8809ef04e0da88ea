/* Whether the runtimes a test creates fuse epilogues: unless REMAT_FUSE=0,
 * and in a bf16 graph only with REMAT_FUSE=bf16 (which fuses its residual
 * adds), which the test suite sets through REMAT_FUSE and REMAT_PRECISION
 * when it runs a test again. */
#ifndef REMAT_TESTS_FUSE_ENV_H
#define REMAT_TESTS_FUSE_ENV_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static inline bool fusion_on(void) {
  const char *fuse = getenv("REMAT_FUSE");
  const char *precision = getenv("REMAT_PRECISION");
  if (fuse != NULL && strcmp(fuse, "0") == 0)
    return false;
  return precision == NULL || strcmp(precision, "bf16") != 0 ||
         (fuse != NULL && strcmp(fuse, "bf16") == 0);
}

#endif
