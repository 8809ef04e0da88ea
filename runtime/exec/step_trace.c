/* Chrome traces of training steps (step_trace.h). A traced run hands the
 * scheduler an array of records (worker, start, end per task); after the
 * run its step is written: the first step of a file writes the file whole
 * (a new file renamed over it), each later one is appended in place before
 * the closing "]}", so that tracing N steps costs O(N) and the file is a
 * whole JSON document after each step:
 * a thread per worker, one complete ("X") event per task named by layer
 * and tensor (task_names.h) with its id and NUMA affinity ("node", -1
 * none), an event per step on a "steps" thread, and a
 * counter ("C") event of live bytes by category wherever they change.
 * Bytes are rebuilt from the records: a buffer is allocated when the start
 * task of its first writer starts and freed when the last done task of the
 * nodes that use it ends, as tasks.c does; the bytes at a step's start
 * (parameters, optimizer state, gradients, scratch) come from the arena. */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/checked.h"
#include "base/files.h"
#include "runtime/compile/task_names.h"
#include "runtime/exec/step_trace.h"

typedef struct trace_event {
  int64_t ns, delta;
  int counter;
} trace_event;

static const char *const counter_names[TRACE_NUM_COUNTERS] = {
    "parameters",
    "optimizer state",
    "gradients",
    "activations saved",
    "activations not saved",
    "recomputed",
    "activation gradients",
    "scratch"};

/* A category's counter; activations split by the remat decision. */
static int counter_of(const compiled_step *c, remat_mem_category cat,
                      int32_t tensor) {
  switch (cat) {
  case REMAT_MEM_PARAMS:
    return 0;
  case REMAT_MEM_OPTIMIZER:
    return 1;
  case REMAT_MEM_GRADS:
    return 2;
  case REMAT_MEM_ACTIVATIONS:
    return tensor >= 0 && !c->decision.saved[tensor] ? 4 : 3;
  case REMAT_MEM_RECOMPUTED:
    return 5;
  case REMAT_MEM_ACT_GRADS:
    return 6;
  default:
    return 7;
  }
}

/* ---- before and after a run ---- */

static bool grow(void **array, size_t elem, size_t count) {
  size_t bytes = 0;
  if (!remat__mul_size(elem, count ? count : 1, &bytes))
    return false;
  void *p = remat__realloc(*array, bytes);
  if (p != NULL)
    *array = p;
  return p != NULL;
}

/* The records of one run and the writer's scratch, made once. */
static bool reserve(const compiled_step *c, step_trace *t) {
  size_t ntasks = (size_t)sched_dag_num_tasks(c->tasks.dag);
  size_t nbufs = (size_t)c->low.nbufs;
  if (t->events != NULL) /* the last of them: all or none usable */
    return true;
  if (!grow((void **)&t->records, sizeof *t->records, ntasks) ||
      !grow((void **)&t->task_knode, sizeof *t->task_knode, ntasks) ||
      !grow((void **)&t->task_node, sizeof *t->task_node, ntasks) ||
      !grow((void **)&t->free_ns, sizeof *t->free_ns, nbufs) ||
      !grow((void **)&t->events, sizeof *t->events, 2 * nbufs))
    return false;
  int64_t tile = 0; /* tiles in program order, as taskgraph.c adds them */
  for (int32_t i = 0; i < c->low.nknodes; i++) {
    const plan_knode *kn = &c->low.knodes[i];
    for (int64_t k = 0; k < kn->tiles + 2; k++) {
      t->task_knode[c->tasks.start_task[i] + k] = i;
      t->task_node[c->tasks.start_task[i] + k] =
          k < 2 ? -1 : c->numa.affinity[tile++];
    }
  }
  return true;
}

remat_status step_trace_begin(const compiled_step *c, step_trace *t,
                              const mem_arena *arena, const char *run_name,
                              const char *config_path,
                              sched_trace_record **records) {
  *records = NULL;
  t->target = t->steps_left > 0 ? t->path : config_path;
  if (t->target == NULL)
    return REMAT_OK;
  if (t->target == config_path)
    t->nsteps = 0; /* REMAT_TRACE: the file holds the latest step */
  if (!reserve(c, t)) {
    t->target = NULL;
    return REMAT_ERR_OUT_OF_MEMORY;
  }
  memset(t->base, 0, sizeof t->base);
  for (int k = 0; k < REMAT_MEM_NUM_CATEGORIES; k++)
    t->base[counter_of(c, (remat_mem_category)k, -1)] +=
        atomic_load(&arena->current[k]);
  t->run_name = run_name;
  t->start_ns = sched_now_ns();
  if (t->nsteps == 0)
    t->origin_ns = t->start_ns;
  *records = t->records;
  return REMAT_OK;
}

void step_trace_cancel(step_trace *t) { t->target = NULL; }

/* ---- the file ---- */

/* Microseconds from the start of the file's first step. */
static double from_origin(const step_trace *t, int64_t ns) {
  return (double)(ns - t->origin_ns) / 1e3;
}

static void write_threads(FILE *f, const compiled_step *c) {
  const sched_placement *pl = sched_pool_placement(c->g->rt->pool);
  int nw = c->g->rt->nworkers;
  fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,"
             "\"args\":{\"name\":\"remat\"}}");
  for (int w = 0; w < nw; w++)
    fprintf(f,
            ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
            "\"args\":{\"name\":\"worker %d (node %d)\"}}",
            w, w, pl->worker_node[w]);
  fprintf(f,
          ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
          "\"args\":{\"name\":\"steps\"}}",
          nw);
}

static void write_tasks(FILE *f, const compiled_step *c, step_trace *t,
                        int s) {
  int32_t ntasks = sched_dag_num_tasks(c->tasks.dag);
  const sched_trace_record *rec = t->records;
  for (int32_t task = 0; task < ntasks; task++) {
    const plan_knode *kn = &c->low.knodes[t->task_knode[task]];
    /* 0 start, 1 done, 2.. tiles */
    int64_t part = task - c->tasks.start_task[t->task_knode[task]];
    fputs(",\n{\"name\":\"", f);
    remat__write_json_text(f,
                  c->tasks.names + (size_t)t->task_knode[task] * TASK_NAME_MAX);
    fprintf(f,
            "\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
            "\"pid\":1,\"tid\":%d,\"args\":{\"step\":%d,\"id\":%d,"
            "\"node\":%d,\"kernel\":\"%s\",\"part\":",
            task_names_category(kn->kind), from_origin(t, rec[task].start_ns),
            (double)(rec[task].end_ns - rec[task].start_ns) / 1e3,
            (int)rec[task].worker, s + 1, (int)task, (int)t->task_node[task],
            kn->kernel != NULL ? kn->kernel->name : "");
    if (part >= 2)
      fprintf(f, "\"tile %lld\"}}", (long long)(part - 2));
    else
      fprintf(f, "\"%s\"}}", part == 0 ? "start" : "done");
  }
}

static int cmp_event(const void *a, const void *b) {
  const trace_event *x = a, *y = b;
  if (x->ns != y->ns)
    return x->ns < y->ns ? -1 : 1;
  return (x->delta > y->delta) - (x->delta < y->delta); /* frees first */
}

/* The run's allocations and frees, sorted; returns how many. */
static size_t step_events(const compiled_step *c, step_trace *t) {
  const sched_trace_record *rec = t->records;
  for (int32_t b = 0; b < c->low.nbufs; b++)
    t->free_ns[b] = -1;
  size_t n = 0;
  for (int32_t i = 0; i < c->low.nknodes; i++) {
    const plan_knode *kn = &c->low.knodes[i];
    for (int k = 0; k < kn->ntouch; k++) {
      int64_t end = rec[c->tasks.done_task[i]].end_ns;
      if (end > t->free_ns[kn->touch[k]])
        t->free_ns[kn->touch[k]] = end;
    }
    for (int k = 0; k < kn->ninit; k++) {
      const plan_buffer *b = &c->low.bufs[kn->init[k]];
      if (!b->persistent)
        t->events[n++] = (trace_event){rec[c->tasks.start_task[i]].start_ns,
                                       mem_block_bytes(b->bytes),
                                       counter_of(c, b->cat, b->tensor)};
    }
  }
  for (int32_t b = 0; b < c->low.nbufs; b++) {
    const plan_buffer *buf = &c->low.bufs[b];
    if (!buf->persistent && buf->first_writer >= 0 && t->free_ns[b] >= 0)
      t->events[n++] =
          (trace_event){t->free_ns[b], -mem_block_bytes(buf->bytes),
                        counter_of(c, buf->cat, buf->tensor)};
  }
  qsort(t->events, n, sizeof *t->events, cmp_event);
  return n;
}

static void write_counter(FILE *f, double ts, const int64_t *live) {
  fprintf(f,
          ",\n{\"name\":\"live bytes\",\"ph\":\"C\",\"ts\":%.3f,"
          "\"pid\":1,\"args\":{",
          ts);
  for (int c = 0; c < TRACE_NUM_COUNTERS; c++)
    fprintf(f, "%s\"%s\":%lld", c ? "," : "", counter_names[c],
            (long long)live[c]);
  fputs("}}", f);
}

static void write_counters(FILE *f, const compiled_step *c, step_trace *t) {
  int64_t live[TRACE_NUM_COUNTERS];
  memcpy(live, t->base, sizeof live);
  write_counter(f, from_origin(t, t->start_ns), live);
  size_t n = step_events(c, t);
  for (size_t i = 0; i < n; i++) {
    live[t->events[i].counter] += t->events[i].delta;
    if (i + 1 == n || t->events[i + 1].ns != t->events[i].ns)
      write_counter(f, from_origin(t, t->events[i].ns), live);
  }
}

/* The run in progress as step s (from 0) of the file: its event on the
 * "steps" thread, its tasks and its counters, each after ",\n". */
static void write_step(FILE *f, const compiled_step *c, step_trace *t, int s) {
  fprintf(f,
          ",\n{\"name\":\"step %d (%s)\",\"cat\":\"step\",\"ph\":\"X\","
          "\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d}",
          s + 1, t->run_name, from_origin(t, t->start_ns),
          (double)(t->end_ns - t->start_ns) / 1e3, c->g->rt->nworkers);
  write_tasks(f, c, t, s);
  write_counters(f, c, t);
}

static const char trace_head[] = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
static const char trace_tail[] = "\n]}\n";
#define TRACE_TAIL_BYTES ((int64_t)sizeof trace_tail - 1)

/* The file's first step: the whole file written to a new file renamed over
 * the target (files.h), so the target, and whoever reads it, another graph
 * writing it at the same time included, only ever sees a whole trace; on
 * failure it is as it was. */
static remat_status write_file(const compiled_step *c, step_trace *t,
                               const char *path, char *err, size_t len) {
  remat__replacing r;
  FILE *f = remat__replace_begin(path, &r);
  if (f == NULL) {
    snprintf(err, len, "cannot write trace '%s': %s",
             remat__quote(&(remat__quoted){0}, path), strerror(errno));
    return REMAT_ERR_IO;
  }
  fputs(trace_head, f);
  write_threads(f, c);
  write_step(f, c, t, 0);
  fputs(trace_tail, f);
  long bytes = ftell(f);
  int e = remat__replace_end(f, &r);
  if (e != 0) {
    snprintf(err, len, "cannot %s trace '%s': %s",
             r.failed == REMAT__REPLACE_SYNC_DIR ? "sync the directory of"
                                                 : "write",
             remat__quote(&(remat__quoted){0}, path), strerror(e));
    return REMAT_ERR_IO;
  }
  t->file_bytes = bytes;
  return REMAT_OK;
}

/* After an append that failed: the closing written back at `at` and the
 * file cut after it, then read back, so that the file is the document the
 * last step left (when nothing could be written at `at`, as past a file
 * size limit, it still is). */
static bool restore_tail(int fd, off_t at) {
  char back[sizeof trace_tail];
  if (pwrite(fd, trace_tail, TRACE_TAIL_BYTES, at) == TRACE_TAIL_BYTES)
    (void)fsync(fd);
  struct stat st;
  if (fstat(fd, &st) != 0)
    return false;
  if (st.st_size != at + TRACE_TAIL_BYTES &&
      (ftruncate(fd, at + TRACE_TAIL_BYTES) != 0 || fstat(fd, &st) != 0))
    return false;
  return st.st_size == at + TRACE_TAIL_BYTES &&
         pread(fd, back, TRACE_TAIL_BYTES, at) == TRACE_TAIL_BYTES &&
         memcmp(back, trace_tail, TRACE_TAIL_BYTES) == 0;
}

/* A later step: written over the closing of the file as the last step left
 * it (a file of another size, or no regular file, is refused: something
 * else changed it), closed again, flushed and synced. On failure the file
 * is cut back to the last step's bytes and closed again. */
static remat_status append_step(const compiled_step *c, step_trace *t,
                                const char *path, char *err, size_t len) {
  int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_size != t->file_bytes) {
    int e = fd < 0 ? errno : 0;
    snprintf(err, len, "cannot append to trace '%s': %s",
             remat__quote(&(remat__quoted){0}, path),
             e != 0 ? strerror(e)
                    : "it changed since the last step was written (another "
                      "size or kind); call remat_trace_steps again to start "
                      "a new trace");
    if (fd >= 0)
      close(fd);
    return REMAT_ERR_IO;
  }
  off_t at = (off_t)(t->file_bytes - TRACE_TAIL_BYTES);
  FILE *f = lseek(fd, at, SEEK_SET) == at ? fdopen(fd, "w") : NULL;
  if (f == NULL) {
    snprintf(err, len, "cannot append to trace '%s': %s",
             remat__quote(&(remat__quoted){0}, path), strerror(errno));
    close(fd);
    return REMAT_ERR_IO;
  }
  write_step(f, c, t, t->nsteps);
  fputs(trace_tail, f);
  long bytes = ftell(f);
  int e = fflush(f) != 0 || ferror(f) || fsync(fd) != 0 ? errno : 0;
  if (e != 0 && !restore_tail(fd, at))
    t->file_bytes = -1; /* not restored: the next step refuses to append */
  fclose(f);
  if (e != 0) {
    snprintf(err, len, "cannot append to trace '%s': %s",
             remat__quote(&(remat__quoted){0}, path), strerror(e));
    return REMAT_ERR_IO;
  }
  t->file_bytes = bytes;
  return REMAT_OK;
}

remat_status step_trace_end(const compiled_step *c, step_trace *t, char *err,
                            size_t len) {
  if (t->target == NULL)
    return REMAT_OK;
  t->end_ns = sched_now_ns();
  bool steps = t->target == t->path;
  if (steps)
    t->steps_left--;
  remat_status s = t->nsteps == 0 ? write_file(c, t, t->target, err, len)
                                  : append_step(c, t, t->target, err, len);
  if (s == REMAT_OK && steps)
    t->nsteps++;
  t->target = NULL;
  return s;
}

void step_trace_free(step_trace *t) {
  free(t->records);
  free(t->task_knode);
  free(t->task_node);
  free(t->free_ns);
  free(t->events);
  memset(t, 0, sizeof *t);
}

void step_trace_move(step_trace *to, step_trace *from) {
  step_trace_free(to);
  memcpy(to->path, from->path, sizeof to->path);
  to->steps_left = from->steps_left;
  to->nsteps = from->nsteps;
  to->file_bytes = from->file_bytes;
  to->origin_ns = from->origin_ns;
  step_trace_free(from);
}
