/* Whether the runtimes a test creates fuse epilogues: unless REMAT_FUSE=0,
 * which the test suite sets when it runs a test again (in f32 and in bf16
 * precision alike: the residual adds fuse in both). */
#ifndef REMAT_TESTS_FUSE_ENV_H
#define REMAT_TESTS_FUSE_ENV_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static inline bool fusion_on(void) {
  const char *fuse = getenv("REMAT_FUSE");
  return fuse == NULL || strcmp(fuse, "0") != 0;
}

#endif
