/* Chrome traces of training steps (step_trace.c): which runs are traced
 * (remat_trace_steps on a graph, else REMAT_TRACE), the records the
 * scheduler fills, and the file: task events named by layer and tensor,
 * and counter tracks of live bytes by category over each step. */
#ifndef REMAT_RUNTIME_STEP_TRACE_H
#define REMAT_RUNTIME_STEP_TRACE_H

#include <limits.h>

#include "runtime/compile/compiled.h"
#include "sched/sched.h"

/* The counter series of the trace, in their order. */
enum { TRACE_NUM_COUNTERS = 8 };

typedef struct step_trace {
  char path[PATH_MAX];         /* remat_trace_steps' file, "" none */
  int steps_left;              /* steps still to trace into path */
  const char *target;          /* the file of the run in progress, or NULL */
  int nsteps;                  /* steps already in the target file */
  int64_t file_bytes;          /* its size after the last step written */
  sched_trace_record *records; /* [ntasks]: the run in progress */
  int64_t origin_ns;           /* start of the file's first step */
  int64_t start_ns, end_ns;    /* of the run in progress */
  const char *run_name;        /* "remat_step", ... */
  int64_t base[TRACE_NUM_COUNTERS]; /* bytes at the run's start */
  int32_t *task_knode;         /* [ntasks] */
  int32_t *task_node;          /* [ntasks]: NUMA affinity, -1 none */
  int64_t *free_ns;            /* [nbufs]: scratch of the writer */
  struct trace_event *events;  /* [2 * nbufs]: scratch of the writer */
} step_trace;

/* Before a run (`run_name`: "remat_step", ...; `arena`: the live bytes at
 * its start): whether it is traced and into which file, and the array the
 * scheduler fills (*records, NULL when not traced). Everything the
 * writer needs is allocated here, so a traced run fails for memory before
 * any task runs. */
remat_status step_trace_begin(const compiled_step *c, step_trace *t,
                              const mem_arena *arena, const char *run_name,
                              const char *config_path,
                              sched_trace_record **records);
/* After a run that succeeded: writes its step into the file. The first
 * step of a file writes it whole (a new file renamed over it); each later
 * one seeks back over the closing "]}" and appends its events and the
 * closing again, so a step costs the same whatever came before it, and
 * the file is a whole JSON document after each. A failed write gives
 * REMAT_ERR_IO and a message in `err`, and leaves the file as it was. */
remat_status step_trace_end(const compiled_step *c, step_trace *t, char *err,
                            size_t len);
/* After a run that failed: forgets its records. */
void step_trace_cancel(step_trace *t);
void step_trace_free(step_trace *t);
/* Between runs, to the trace of a new step state (replan.h): the file
 * and the steps still to trace move from `from` to `to` (zeroed, made
 * for the new compiled step); `from` keeps nothing. */
void step_trace_move(step_trace *to, step_trace *from);

#endif
