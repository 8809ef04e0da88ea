/* The library's messages in remat-train's words. The library names its
 * own fields (remat_config.num_threads, REMAT_MEMORY_BUDGET, ...), which
 * remat-train sets from its options; here, in one place, those names
 * become the options that set them. remat-train checks its options before
 * it calls the library where it can (train_options.c), so this covers
 * what only the library can find (a budget too small, a policy that names
 * a tensor the model lacks, ...). */
#include <string.h>

#include "tools/train.h"

/* Longest first: a name that contains another is replaced whole. */
static const struct {
  const char *library, *option;
} names[] = {
    {"REMAT_MEMORY_BUDGET or remat_config.memory_budget", "--budget"},
    {"remat_config.memory_budget", "--budget"},
    {"remat_config.num_threads", "--threads"},
    {"remat_config.precision", "--precision"},
    {"remat_config.policy", "--policy"},
};

const char *train_message(const char *message) {
  static char out[1024];
  size_t n = 0;
  for (const char *p = message; *p != '\0' && n + 1 < sizeof out;) {
    size_t k = 0, len = 0;
    for (; k < sizeof names / sizeof *names; k++) {
      len = strlen(names[k].library);
      if (strncmp(p, names[k].library, len) == 0)
        break;
    }
    if (k == sizeof names / sizeof *names) {
      out[n++] = *p++;
      continue;
    }
    size_t add = strlen(names[k].option);
    if (n + add + 1 > sizeof out)
      break;
    memcpy(out + n, names[k].option, add);
    n += add;
    p += len;
  }
  out[n] = '\0';
  return out;
}
