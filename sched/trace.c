/* Writes the trace of a run as Chrome trace-event JSON (opens in Perfetto
 * and chrome://tracing): a thread_name metadata event per worker, naming
 * its NUMA node ("worker 3 (node 1)"), and one complete ("X") event per task
 * whose args hold its id and its affinity ("node", -1 for none), times in
 * microseconds from the run's start. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/files.h"
#include "sched/sched_internal.h"

static void write_workers(FILE *f, const sched_pool *pool) {
  for (int w = 0; w < pool->nworkers; w++)
    fprintf(f,
            "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
            "\"args\":{\"name\":\"worker %d (node %d)\"}}",
            w ? ",\n" : "\n", w, w, pool->place.worker_node[w]);
}

static void write_task(FILE *f, const sched_run_state *run,
                       const sched_dag *dag, int32_t t) {
  const sched_trace_record *r = &run->trace[t];
  const sched_task_info *task = &dag->info[t];
  fputs(",\n{\"name\":\"", f);
  remat__write_json_text(f, task->name ? task->name : "task");
  fputs("\",\"cat\":\"", f);
  remat__write_json_text(f, task->category ? task->category : "task");
  fprintf(f,
          "\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d,"
          "\"args\":{\"id\":%d,\"node\":%d}}",
          (double)(r->start_ns - run->trace_origin_ns) / 1e3,
          (double)(r->end_ns - r->start_ns) / 1e3, (int)r->worker, (int)t,
          (int)dag->tasks[t].numa_node);
}

/* The file is written whole beside the target and renamed over it
 * (base/files.h), so that it never holds a part of a trace. */
remat_status sched_trace_write(const sched_pool *pool,
                               const sched_run_state *run,
                               const sched_dag *dag, const char *path,
                               char err[SCHED_ERRMSG_MAX]) {
  remat__replacing r;
  FILE *f = remat__replace_begin(path, &r);
  if (!f) {
    snprintf(err, SCHED_ERRMSG_MAX, "cannot write trace '%s': %s",
             remat__quote(&(remat__quoted){0}, path), strerror(errno));
    return REMAT_ERR_IO;
  }
  fputs("{\"traceEvents\":[", f);
  write_workers(f, pool);
  for (int32_t t = 0; t < dag->ntasks; t++)
    write_task(f, run, dag, t);
  fputs("\n]}\n", f);
  int e = remat__replace_end(f, &r);
  if (e != 0) {
    snprintf(err, SCHED_ERRMSG_MAX, "cannot write trace '%s': %s",
             remat__quote(&(remat__quoted){0}, path), strerror(e));
    return REMAT_ERR_IO;
  }
  return REMAT_OK;
}
