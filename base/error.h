/* The per-thread message of the last failure and the helpers that set it:
 * every folder of the library reports errors through these, so a caller
 * reads one message with remat_last_error(). */
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

#endif
