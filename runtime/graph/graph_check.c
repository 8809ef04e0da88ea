/* The graph's sticky error, the checks every graph call makes on the
 * handles it gets, and the entry and exit of calls that use the compiled
 * step (one thread at a time; the message of the last one that failed).
 * Every stage of the runtime may call these; they call nothing of the
 * runtime. */
#include <stdarg.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/internal.h"

remat_status graph_fail(remat_graph *g, remat_status status, const char *fmt,
                        ...) {
  if (g->compiled) { /* a builder call after compile: only the call fails */
    char msg[REMAT__ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return remat__fail_msg(status, msg);
  }
  if (g->status == REMAT_OK) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->error, sizeof g->error, fmt, ap);
    va_end(ap);
    g->status = status;
  }
  return remat__fail_msg(status, g->error);
}

bool graph_tensor_ok(remat_graph *g, const remat_tensor *t, const char *what) {
  if (t == NULL) {
    graph_fail(g, REMAT_ERR_INVALID_ARG, "%s: tensor argument is NULL", what);
    return false;
  }
  if (t->graph != g) {
    graph_fail(g, REMAT_ERR_INVALID_ARG,
               "%s: tensor '%s' belongs to another graph", what, t->name);
    return false;
  }
  return true;
}

/* A token per thread: its address tells the threads apart. */
static _Thread_local char thread_token;

static uintptr_t self(void) { return (uintptr_t)&thread_token; }

remat_status graph_enter(remat_graph *g, const char *what) {
  if (atomic_load(&g->owner) == self()) { /* a call inside a call */
    g->depth++;
    return REMAT_OK;
  }
  if (atomic_exchange(&g->busy, 1) != 0)
    return remat__fail(REMAT_ERR_STATE,
                       "%s: another thread is using this graph: a graph takes "
                       "one call at a time (use one graph per thread, or "
                       "serialize the calls)",
                       what);
  atomic_store(&g->owner, self());
  g->depth = 1;
  g->enter_fails = remat__fail_count();
  return REMAT_OK;
}

void graph_leave(remat_graph *g) {
  if (--g->depth > 0)
    return;
  if (remat__fail_count() != g->enter_fails)
    snprintf(g->call_error, sizeof g->call_error, "%s", remat_last_error());
  else
    g->call_error[0] = '\0';
  atomic_store(&g->owner, 0);
  atomic_store(&g->busy, 0);
}

void graph_enter_wait(remat_graph *g) {
  while (atomic_exchange(&g->busy, 1) != 0)
    sched_yield();
  atomic_store(&g->owner, self());
  g->depth = 1;
}
