/* Status names and the per-thread message of the last failure. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

static _Thread_local char last_error[REMAT__ERRMSG_MAX];
/* Failures recorded on this thread so far (graph_check.c compares). */
static _Thread_local unsigned long fail_count;

const char *remat_status_string(remat_status status) {
  switch (status) {
  case REMAT_OK: return "REMAT_OK";
  case REMAT_ERR_INVALID_ARG: return "REMAT_ERR_INVALID_ARG";
  case REMAT_ERR_OUT_OF_MEMORY: return "REMAT_ERR_OUT_OF_MEMORY";
  case REMAT_ERR_SHAPE: return "REMAT_ERR_SHAPE";
  case REMAT_ERR_CONFIG: return "REMAT_ERR_CONFIG";
  case REMAT_ERR_LIMIT: return "REMAT_ERR_LIMIT";
  case REMAT_ERR_CYCLE: return "REMAT_ERR_CYCLE";
  case REMAT_ERR_STATE: return "REMAT_ERR_STATE";
  case REMAT_ERR_BACKEND: return "REMAT_ERR_BACKEND";
  case REMAT_ERR_IO: return "REMAT_ERR_IO";
  case REMAT_ERR_NUMERIC: return "REMAT_ERR_NUMERIC";
  case REMAT_ERR_BUDGET: return "REMAT_ERR_BUDGET";
  case REMAT_ERR_POLICY: return "REMAT_ERR_POLICY";
  case REMAT_ERR_CANCELLED: return "REMAT_ERR_CANCELLED";
  }
  return "REMAT_ERR_UNKNOWN";
}

const char *remat_last_error(void) { return last_error; }

/* Formats into a local buffer first: the arguments may point into
 * last_error itself. */
remat_status remat__fail(remat_status status, const char *fmt, ...) {
  char msg[REMAT__ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(last_error, msg, sizeof msg);
  fail_count++;
  return status;
}

remat_status remat__fail_msg(remat_status status, const char *msg) {
  if (msg != last_error)
    snprintf(last_error, sizeof last_error, "%s", msg);
  fail_count++;
  return status;
}

void remat__clear_error(void) { last_error[0] = '\0'; }

unsigned long remat__fail_count(void) { return fail_count; }

const char *remat__quote_n(remat__quoted *q, const char *s, size_t len) {
  size_t n = 0, i = 0;
  for (; i < len && s[i] != '\0'; i++) {
    unsigned char c = (unsigned char)s[i];
    size_t width = c >= 0x20 && c < 0x7F ? 1 : 4; /* c or \xNN */
    if (n + width > REMAT__QUOTE_MAX)
      break;
    if (c >= 0x20 && c < 0x7F)
      q->text[n++] = (char)c;
    else
      n += (size_t)snprintf(q->text + n, sizeof q->text - n, "\\x%02X", c);
  }
  snprintf(q->text + n, sizeof q->text - n, "%s",
           i < len && s[i] != '\0' ? "..." : "");
  return q->text;
}

const char *remat__quote(remat__quoted *q, const char *s) {
  return remat__quote_n(q, s, SIZE_MAX);
}
