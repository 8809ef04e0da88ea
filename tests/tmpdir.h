/* A scratch directory for tests that write files: created in the group
 * setup, removed with its contents in the group teardown. */
#ifndef REMAT_TESTS_TMPDIR_H
#define REMAT_TESTS_TMPDIR_H

#include <stdio.h>
#include <stdlib.h>

static char dir[64];

static int make_dir(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/remat-test-XXXXXX");
  return mkdtemp(dir) == NULL;
}

static int remove_dir(void **state) {
  (void)state;
  char cmd[96];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) != 0;
}

#endif
