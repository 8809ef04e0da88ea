/* Fuzz target: policy strings. remat_policy_parse on arbitrary text; a
 * policy that parses must format, and its string form must parse again to
 * a policy with the same string form (a round trip). A failure must come
 * with a message free of control bytes. Formatting fails with an empty
 * string one byte short of the string form and succeeds at its size. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "remat.h"

static void check_message(void) {
  const char *m = remat_last_error();
  FUZZ_CHECK(m[0] != '\0');
  for (; *m; m++)
    FUZZ_CHECK((unsigned char)*m >= 0x20 && *m != 0x7f);
}

/* A buffer one byte short of the string form and one of its exact size. */
static void check_sizes(const remat_policy *p, const char *form) {
  size_t needed = strlen(form) + 1;
  char *exact = malloc(needed);
  if (exact == NULL)
    return;
  memset(exact, 'x', needed);
  FUZZ_CHECK(remat_policy_format(p, exact, needed - 1) == REMAT_ERR_LIMIT);
  FUZZ_CHECK(exact[0] == '\0' && exact[needed - 1] == 'x');
  FUZZ_CHECK(remat_policy_format(p, exact, needed) == REMAT_OK);
  FUZZ_CHECK(strcmp(exact, form) == 0);
  free(exact);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstring(data, size);
  if (text == NULL)
    return 0;
  remat_policy *p = NULL;
  remat_status s = remat_policy_parse(text, &p);
  if (s != REMAT_OK) {
    FUZZ_CHECK(p == NULL);
    check_message();
    free(text);
    return 0;
  }
  FUZZ_CHECK(p != NULL);
  /* Every policy formats within the length limit, no longer than the
   * text it came from (aliases are longer than their canonical names). */
  char *buf = malloc(REMAT_MAX_POLICY_LENGTH + 1);
  char *again = malloc(REMAT_MAX_POLICY_LENGTH + 1);
  if (buf != NULL && again != NULL) {
    FUZZ_CHECK(remat_policy_format(p, buf, REMAT_MAX_POLICY_LENGTH + 1) ==
               REMAT_OK);
    FUZZ_CHECK(strlen(buf) <= strlen(text));
    remat_policy *q = NULL;
    FUZZ_CHECK(remat_policy_parse(buf, &q) == REMAT_OK);
    FUZZ_CHECK(remat_policy_format(q, again, REMAT_MAX_POLICY_LENGTH + 1) ==
               REMAT_OK);
    FUZZ_CHECK(strcmp(buf, again) == 0);
    remat_policy_destroy(q);
    check_sizes(p, buf);
  }
  free(again);
  free(buf);
  /* Small buffers: never overrun, always terminated or an error. */
  for (size_t len = 1; len < 40; len += 7) {
    char small[40];
    memset(small, 'x', sizeof small);
    s = remat_policy_format(p, small, len);
    FUZZ_CHECK(s == REMAT_OK || s == REMAT_ERR_LIMIT);
    FUZZ_CHECK(strlen(small) < len);
    FUZZ_CHECK(small[len] == 'x');
  }
  remat_policy_destroy(p);
  free(text);
  return 0;
}
