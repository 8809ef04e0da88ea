/* The per-thread message of the last failure and the helpers that set it.
 * base/ and runtime/ report through these; sched/ and ops/ return a status
 * with their words in a buffer of the caller's (SCHED_ERRMSG_MAX, op
 * messages), which runtime/ passes on here, so that a caller reads one
 * message with remat_last_error(). */
#ifndef REMAT_BASE_ERROR_H
#define REMAT_BASE_ERROR_H

#include "remat.h"

#define REMAT__ERRMSG_MAX 512

/* Records a formatted message and returns `status`. */
remat_status remat__fail(remat_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Records `msg` (which may be the current message) and returns `status`. */
remat_status remat__fail_msg(remat_status status, const char *msg);
void remat__clear_error(void);
/* How many failures the calling thread has recorded (remat__fail and
 * remat__fail_msg): a call that sees it change failed somewhere inside. */
unsigned long remat__fail_count(void);

/* The one quoter of the library's messages: a caller's (or a file's)
 * string made fit for a one-line message, bytes outside 0x20-0x7E as \xNN,
 * cut with "..." where the quoted text would pass REMAT__QUOTE_MAX bytes
 * (escapes count as the 4 bytes they print), so that a long value cannot
 * push what is accepted, or the cause, out of the message. Use as
 * remat__quote(&(remat__quoted){0}, value); remat__quote_n quotes the first
 * len bytes of s (fewer at a NUL). */
#define REMAT__QUOTE_MAX 100
typedef struct remat__quoted {
  char text[REMAT__QUOTE_MAX + sizeof "..."];
} remat__quoted;
const char *remat__quote_n(remat__quoted *q, const char *s, size_t len);
const char *remat__quote(remat__quoted *q, const char *s);

#endif
