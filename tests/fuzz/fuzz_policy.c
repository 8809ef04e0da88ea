/* Fuzz target: policy strings. remat_policy_parse on arbitrary text; a
 * policy that parses must format, and its string form must parse again to
 * a policy with the same string form (a round trip). A failure must come
 * with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "remat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstring(data, size);
  if (text == NULL)
    return 0;
  remat_policy *p = NULL;
  remat_status s = remat_policy_parse(text, &p);
  if (s != REMAT_OK) {
    FUZZ_CHECK(p == NULL);
    FUZZ_CHECK(remat_last_error()[0] != '\0');
    free(text);
    return 0;
  }
  FUZZ_CHECK(p != NULL);
  char buf[4096], again[4096];
  s = remat_policy_format(p, buf, sizeof buf);
  if (s == REMAT_OK) {
    remat_policy *q = NULL;
    FUZZ_CHECK(remat_policy_parse(buf, &q) == REMAT_OK);
    FUZZ_CHECK(remat_policy_format(q, again, sizeof again) == REMAT_OK);
    FUZZ_CHECK(strcmp(buf, again) == 0);
    remat_policy_destroy(q);
  } else {
    FUZZ_CHECK(s == REMAT_ERR_LIMIT);
  }
  /* Small buffers: never overrun, always terminated or an error. */
  for (size_t len = 1; len < 40; len += 7) {
    char small[40];
    memset(small, 'x', sizeof small);
    s = remat_policy_format(p, small, len);
    FUZZ_CHECK(s == REMAT_OK || s == REMAT_ERR_LIMIT);
    if (s == REMAT_OK)
      FUZZ_CHECK(strlen(small) < len);
    FUZZ_CHECK(small[len] == 'x');
  }
  remat_policy_destroy(p);
  free(text);
  return 0;
}
