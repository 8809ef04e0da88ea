/* Whether the runtimes a test creates fuse epilogues: unless REMAT_FUSE=0,
 * and only in f32 (a bf16 graph does not fuse), which the test suite sets
 * through REMAT_FUSE and REMAT_PRECISION when it runs a test again. */
#ifndef REMAT_TESTS_FUSE_ENV_H
#define REMAT_TESTS_FUSE_ENV_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static inline bool fusion_on(void) {
  const char *fuse = getenv("REMAT_FUSE");
  const char *precision = getenv("REMAT_PRECISION");
  return (fuse == NULL || strcmp(fuse, "0") != 0) &&
         (precision == NULL || strcmp(precision, "bf16") != 0);
}

#endif
