/* Chrome traces of training steps (step_trace.h). A traced run hands the
 * scheduler an array of records (worker, start, end per task); after the
 * run the whole file is rewritten (a new file renamed over it) with every
 * step traced into it so far:
 * a thread per worker, one complete ("X") event per task named by layer
 * and tensor (task_names.h) with its id and NUMA affinity ("node", -1
 * none), an event per step on a "steps" thread, and a
 * counter ("C") event of live bytes by category wherever they change.
 * Bytes are rebuilt from the records: a buffer is allocated when the start
 * task of its first writer starts and freed when the last done task of the
 * nodes that use it ends, as tasks.c does; the bytes at a step's start
 * (parameters, optimizer state, gradients, scratch) come from the arena. */
#include <errno.h>
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

/* Room for one more step, and the writer's scratch. */
static bool reserve(const compiled_step *c, step_trace *t) {
  size_t ntasks = (size_t)sched_dag_num_tasks(c->tasks.dag);
  size_t nbufs = (size_t)c->low.nbufs;
  if (t->events == NULL) { /* the last of the three: all or none usable */
    if (!grow((void **)&t->task_knode, sizeof *t->task_knode, ntasks) ||
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
  }
  if (t->nsteps < t->cap_steps)
    return true;
  /* Doubling, up to the steps remat_trace_steps still asks for, so that N
   * traced steps reallocate log2(N) times, not N. */
  int64_t want =
      (int64_t)t->nsteps + (t->target == t->path ? t->steps_left : 1);
  int64_t doubled = 2 * (int64_t)t->cap_steps;
  int64_t grown = doubled < want ? doubled : want;
  size_t cap = (size_t)(grown > t->nsteps ? grown : t->nsteps + 1), records;
  bool ok = remat__mul_size(cap, ntasks, &records) &&
            grow((void **)&t->records, sizeof *t->records, records) &&
            grow((void **)&t->origin_ns, sizeof *t->origin_ns, cap) &&
            grow((void **)&t->end_ns, sizeof *t->end_ns, cap) &&
            grow((void **)&t->run_name, sizeof *t->run_name, cap) &&
            grow((void **)&t->base, sizeof *t->base, cap * TRACE_NUM_COUNTERS);
  if (ok)
    t->cap_steps = (int)cap;
  return ok;
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
  int s = t->nsteps;
  int64_t *base = t->base + (size_t)s * TRACE_NUM_COUNTERS;
  memset(base, 0, TRACE_NUM_COUNTERS * sizeof *base);
  for (int k = 0; k < REMAT_MEM_NUM_CATEGORIES; k++)
    base[counter_of(c, (remat_mem_category)k, -1)] +=
        atomic_load(&arena->current[k]);
  t->run_name[s] = run_name;
  t->origin_ns[s] = sched_now_ns();
  *records = t->records + (size_t)s * (size_t)sched_dag_num_tasks(c->tasks.dag);
  return REMAT_OK;
}

void step_trace_cancel(step_trace *t) { t->target = NULL; }

/* ---- the file ---- */

/* Microseconds from the first traced step's start. */
static double from_origin(const step_trace *t, int64_t ns) {
  return (double)(ns - t->origin_ns[0]) / 1e3;
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

static void write_tasks(FILE *f, const compiled_step *c, step_trace *t, int s) {
  int32_t ntasks = sched_dag_num_tasks(c->tasks.dag);
  const sched_trace_record *rec = t->records + (size_t)s * (size_t)ntasks;
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

/* The step's allocations and frees, sorted; returns how many. */
static size_t step_events(const compiled_step *c, step_trace *t, int s) {
  const sched_trace_record *rec =
      t->records + (size_t)s * (size_t)sched_dag_num_tasks(c->tasks.dag);
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

static void write_counters(FILE *f, const compiled_step *c, step_trace *t, int s) {
  int64_t live[TRACE_NUM_COUNTERS];
  memcpy(live, t->base + (size_t)s * TRACE_NUM_COUNTERS, sizeof live);
  write_counter(f, from_origin(t, t->origin_ns[s]), live);
  size_t n = step_events(c, t, s);
  for (size_t i = 0; i < n; i++) {
    live[t->events[i].counter] += t->events[i].delta;
    if (i + 1 == n || t->events[i + 1].ns != t->events[i].ns)
      write_counter(f, from_origin(t, t->events[i].ns), live);
  }
}

static void write_steps(FILE *f, const compiled_step *c, step_trace *t) {
  for (int s = 0; s < t->nsteps; s++) {
    fprintf(f,
            ",\n{\"name\":\"step %d (%s)\",\"cat\":\"step\",\"ph\":\"X\","
            "\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d}",
            s + 1, t->run_name[s], from_origin(t, t->origin_ns[s]),
            (double)(t->end_ns[s] - t->origin_ns[s]) / 1e3, c->g->rt->nworkers);
    write_tasks(f, c, t, s);
    write_counters(f, c, t, s);
  }
}

/* Writes the whole trace to a new file renamed over the target
 * (files.h): the target, and whoever reads it, another graph writing it
 * at the same time included, only ever sees a whole trace; on failure it
 * is as it was. */
static remat_status write_file(const compiled_step *c, step_trace *t, const char *path,
                               char *err, size_t len) {
  remat__replacing r;
  FILE *f = remat__replace_begin(path, &r);
  if (f == NULL) {
    snprintf(err, len, "cannot write trace '%s': %s",
             remat__quote(&(remat__quoted){0}, path), strerror(errno));
    return REMAT_ERR_IO;
  }
  fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
  write_threads(f, c);
  write_steps(f, c, t);
  fputs("\n]}\n", f);
  int e = remat__replace_end(f, &r);
  if (e != 0) {
    snprintf(err, len, "cannot %s trace '%s': %s",
             r.failed == REMAT__REPLACE_SYNC_DIR ? "sync the directory of"
                                                 : "write",
             remat__quote(&(remat__quoted){0}, path), strerror(e));
    return REMAT_ERR_IO;
  }
  return REMAT_OK;
}

remat_status step_trace_end(const compiled_step *c, step_trace *t, char *err,
                            size_t len) {
  if (t->target == NULL)
    return REMAT_OK;
  t->end_ns[t->nsteps++] = sched_now_ns();
  if (t->target == t->path)
    t->steps_left--;
  remat_status s = write_file(c, t, t->target, err, len);
  t->target = NULL;
  return s;
}

void step_trace_free(step_trace *t) {
  free(t->records);
  free(t->origin_ns);
  free(t->end_ns);
  free(t->run_name);
  free(t->base);
  free(t->task_knode);
  free(t->task_node);
  free(t->free_ns);
  free(t->events);
  memset(t, 0, sizeof *t);
}
