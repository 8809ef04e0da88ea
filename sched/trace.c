/* Writes the trace of a run as Chrome trace-event JSON (opens in Perfetto
 * and chrome://tracing): a thread_name metadata event per worker, naming
 * its NUMA node ("worker 3 (node 1)"), and one complete ("X") event per task
 * whose args hold its id and its affinity ("node", -1 for none), times in
 * microseconds from the run's start. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "sched/sched_internal.h"

/* Writes `s` as the body of a JSON string. */
static void write_escaped(FILE *f, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\')
      fprintf(f, "\\%c", *c);
    else if (*c < 0x20)
      fprintf(f, "\\u%04x", *c);
    else
      fputc(*c, f);
  }
}

static void write_workers(FILE *f, const sched_pool *pool) {
  for (int w = 0; w < pool->nworkers; w++)
    fprintf(f,
            "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
            "\"args\":{\"name\":\"worker %d (node %d)\"}}",
            w ? ",\n" : "\n", w, w, pool->place.worker_node[w]);
}

static void write_task(FILE *f, const sched_pool *pool, const sched_dag *dag,
                       int32_t t) {
  const sched_trace_record *r = &pool->trace[t];
  const sched_task_info *task = &dag->info[t];
  fputs(",\n{\"name\":\"", f);
  write_escaped(f, task->name ? task->name : "task");
  fputs("\",\"cat\":\"", f);
  write_escaped(f, task->category ? task->category : "task");
  fprintf(f,
          "\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d,"
          "\"args\":{\"id\":%d,\"node\":%d}}",
          (double)(r->start_ns - pool->trace_origin_ns) / 1e3,
          (double)(r->end_ns - r->start_ns) / 1e3, (int)r->worker, (int)t,
          (int)dag->tasks[t].numa_node);
}

remat_status sched_trace_write(const sched_pool *pool, const sched_dag *dag,
                               const char *path, char err[SCHED_ERRMSG_MAX]) {
  FILE *f = fopen(path, "w");
  if (!f) {
    snprintf(err, SCHED_ERRMSG_MAX, "cannot write trace '%s': %s", path,
             strerror(errno));
    return REMAT_ERR_IO;
  }
  fputs("{\"traceEvents\":[", f);
  write_workers(f, pool);
  for (int32_t t = 0; t < dag->ntasks; t++)
    write_task(f, pool, dag, t);
  fputs("\n]}\n", f);
  int failed = ferror(f);
  int saved_errno = errno;
  if (fclose(f) != 0 && !failed) {
    failed = 1;
    saved_errno = errno;
  }
  if (failed) {
    snprintf(err, SCHED_ERRMSG_MAX, "cannot write trace '%s': %s", path,
             strerror(saved_errno ? saved_errno : EIO));
    return REMAT_ERR_IO;
  }
  return REMAT_OK;
}
