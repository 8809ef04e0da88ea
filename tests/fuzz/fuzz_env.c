/* Fuzz target: environment values. The input is a list of records split
 * by NUL bytes; a record's first byte picks a REMAT_* variable and the rest
 * is its value. Each value goes through remat_parse_bytes, then all are set
 * and a runtime is created (one worker, set in code, so that creation stays
 * fast whatever REMAT_NUM_THREADS says; the variable is still parsed). A
 * bad value must fail with REMAT_ERR_CONFIG and a message naming it. A
 * record that starts with '!' sets nothing and asks for REMAT_SET_NO_ENV:
 * then creation must succeed with the defaults, whatever the values. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "remat.h"

static const char *const variables[] = {
    "REMAT_NUM_THREADS", "REMAT_BIND",    "REMAT_POLICY",  "REMAT_MEMORY_BUDGET",
    "REMAT_LOOKAHEAD",   "REMAT_TRACE",   "REMAT_VERBOSE", "REMAT_PRECISION",
};
enum { NVARS = sizeof variables / sizeof *variables };

static void check_parse_bytes(const char *value) {
  int64_t bytes = -1;
  remat_status s = remat_parse_bytes(value, &bytes);
  if (s == REMAT_OK)
    FUZZ_CHECK(bytes >= 1);
  else
    FUZZ_CHECK(s == REMAT_ERR_CONFIG &&
               strstr(remat_last_error(), "is not a byte size") != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A synthetic topology loads in microseconds instead of milliseconds;
   * it binds nothing, which is all the same to configuration parsing. */
  setenv("HWLOC_SYNTHETIC", "pack:1 core:2 pu:1", 0);
  char *text = fuzz_cstring(data, size);
  if (text == NULL)
    return 0;
  bool set[NVARS] = {false};
  bool no_env = false;
  for (size_t pos = 0; pos < size;) {
    const char *record = text + pos;
    size_t len = strlen(record);
    pos += len + 1;
    if (len == 0)
      continue;
    if (record[0] == '!') {
      no_env = true;
      continue;
    }
    int v = (unsigned char)record[0] % NVARS;
    check_parse_bytes(record + 1);
    setenv(variables[v], record + 1, 1);
    set[v] = true;
  }
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = 1};
  if (no_env)
    rc.set |= REMAT_SET_NO_ENV;
  remat_runtime *rt = NULL;
  remat_status s = remat_runtime_create(&rc, &rt);
  if (s == REMAT_OK) {
    FUZZ_CHECK(rt != NULL && remat_runtime_num_threads(rt) == 1);
    remat_config got;
    FUZZ_CHECK(remat_runtime_config(rt, &got) == REMAT_OK);
    FUZZ_CHECK(got.policy != NULL && got.lookahead >= 1 &&
               got.lookahead <= 64 && got.verbose >= 0 && got.verbose <= 2 &&
               got.memory_budget >= 0 &&
               (got.precision == REMAT_PRECISION_F32 ||
                got.precision == REMAT_PRECISION_BF16));
    if (no_env)
      FUZZ_CHECK(strcmp(got.policy, "nothing_saveable") == 0 &&
                 got.lookahead == 1 && got.verbose == 0 &&
                 got.memory_budget == 0 && got.trace_path == NULL &&
                 got.bind == REMAT_BIND_CORE &&
                 got.precision == REMAT_PRECISION_F32);
    remat_runtime_destroy(rt);
  } else {
    FUZZ_CHECK(!no_env);
    FUZZ_CHECK(rt == NULL);
    FUZZ_CHECK(s == REMAT_ERR_CONFIG);
    FUZZ_CHECK(strstr(remat_last_error(), "REMAT_") != NULL);
  }
  for (int v = 0; v < NVARS; v++)
    if (set[v])
      unsetenv(variables[v]);
  free(text);
  return 0;
}
