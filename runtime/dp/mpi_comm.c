/* The communication thread (mpi_comm.h): starts the items' allreduces in
 * order as they become ready, polls them with MPI_Test (sleeping briefly
 * between polls so that it does not take a core from the workers), and
 * runs the completion callback of each. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runtime/dp/mpi_comm.h"

#define POLL_NS 20000 /* between MPI_Test rounds while items are in flight */

double comm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Records the first failure; from then on items complete unsent. Called
 * with the mutex held. */
static void set_broken(comm_thread *c, const char *what, int rc) {
  if (c->broken)
    return;
  c->broken = true;
  char mpi_err[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  bool mpi_error = rc != MPI_SUCCESS && rc != COMM_TIMED_OUT;
  if (mpi_error)
    MPI_Error_string(rc, mpi_err, &len);
  snprintf(c->errmsg, sizeof c->errmsg, "%s%s%s", what,
           mpi_error ? ": " : "", mpi_err);
}

void comm_break(comm_thread *c, const char *what, int rc) {
  pthread_mutex_lock(&c->mu);
  set_broken(c, what, rc);
  pthread_mutex_unlock(&c->mu);
}

int comm_wait(MPI_Request *req, int n, double timeout_s) {
  double start = comm_now();
  for (;;) {
    int flag = 0;
    int rc = MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS || flag)
      return rc;
    if (comm_now() - start > timeout_s)
      return COMM_TIMED_OUT;
    struct timespec ts = {0, POLL_NS};
    nanosleep(&ts, NULL);
  }
}

static int start_item(comm_thread *c, comm_item *it) {
  int rc = MPI_Iallreduce(MPI_IN_PLACE, it->buf, it->count, it->type, it->op,
                          c->comm, &it->req[0]);
  it->req[1] = MPI_REQUEST_NULL;
  if (rc == MPI_SUCCESS && it->count2 > 0)
    rc = MPI_Iallreduce(MPI_IN_PLACE, it->buf2, it->count2, it->type2,
                        it->op2, c->comm, &it->req[1]);
  return rc;
}

/* Completes item i: statistics, then the callback (mutex not held). */
static void complete(comm_thread *c, int i) {
  comm_item *it = &c->items[i];
  it->t_done = comm_now();
  it->done = true;
  c->done(c->ctx, i);
  pthread_mutex_lock(&c->mu);
  if (++c->ncompleted == c->nitems)
    pthread_cond_broadcast(&c->done_cv);
  pthread_mutex_unlock(&c->mu);
}

/* Starts every ready item whose turn it is; returns how many started. */
static int start_ready(comm_thread *c) {
  int n = 0;
  pthread_mutex_lock(&c->mu);
  while (c->next_start < c->nitems && c->items[c->next_start].ready) {
    comm_item *it = &c->items[c->next_start++];
    bool broken = c->broken;
    pthread_mutex_unlock(&c->mu);
    it->t_start = comm_now();
    int rc = broken ? MPI_SUCCESS : start_item(c, it);
    pthread_mutex_lock(&c->mu);
    if (rc != MPI_SUCCESS)
      set_broken(c, "MPI_Iallreduce failed", rc);
    it->started = true;
    n++;
  }
  pthread_mutex_unlock(&c->mu);
  return n;
}

/* Tests the items in flight; completes those done. Returns how many are
 * still in flight. */
static int poll_items(comm_thread *c) {
  int inflight = 0;
  for (int i = 0; i < c->nitems; i++) {
    comm_item *it = &c->items[i];
    if (!it->started || it->done)
      continue;
    pthread_mutex_lock(&c->mu);
    bool broken = c->broken;
    pthread_mutex_unlock(&c->mu);
    int flag = 1;
    if (!broken) {
      int rc = MPI_Testall(2, it->req, &flag, MPI_STATUSES_IGNORE);
      if (rc == MPI_SUCCESS && !flag &&
          comm_now() - it->t_start > c->timeout_s) {
        char what[128];
        snprintf(what, sizeof what,
                 "an allreduce did not complete within %g s: a rank died "
                 "or stopped stepping",
                 c->timeout_s);
        pthread_mutex_lock(&c->mu);
        set_broken(c, what, MPI_SUCCESS);
        pthread_mutex_unlock(&c->mu);
        flag = 1;
      } else if (rc != MPI_SUCCESS) {
        pthread_mutex_lock(&c->mu);
        set_broken(c, "MPI_Testall failed", rc);
        pthread_mutex_unlock(&c->mu);
        flag = 1;
      }
    }
    if (flag)
      complete(c, i);
    else
      inflight++;
  }
  return inflight;
}

static void *comm_main(void *arg) {
  comm_thread *c = arg;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    for (;;) {
      if (c->stop) {
        pthread_mutex_unlock(&c->mu);
        return NULL;
      }
      bool startable = c->next_start < c->nitems && c->items[c->next_start].ready;
      bool inflight = c->next_start > c->ncompleted;
      if (startable || inflight)
        break;
      pthread_cond_wait(&c->work_cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    start_ready(c);
    if (poll_items(c) > 0) {
      struct timespec ts = {0, POLL_NS};
      nanosleep(&ts, NULL);
    }
  }
}

bool comm_start(comm_thread *c) {
  c->stop = false;
  c->broken = false;
  c->errmsg[0] = '\0';
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->work_cv, NULL);
  pthread_cond_init(&c->done_cv, NULL);
  comm_begin_step(c);
  int rc = pthread_create(&c->thread, NULL, comm_main, c);
  if (rc != 0) {
    snprintf(c->errmsg, sizeof c->errmsg,
             "cannot start the communication thread: %s", strerror(rc));
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->work_cv);
    pthread_cond_destroy(&c->done_cv);
    return false;
  }
  c->running = true;
  return true;
}

void comm_stop(comm_thread *c) {
  if (!c->running)
    return;
  pthread_mutex_lock(&c->mu);
  c->stop = true;
  pthread_cond_signal(&c->work_cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->thread, NULL);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->work_cv);
  pthread_cond_destroy(&c->done_cv);
  c->running = false;
}

void comm_begin_step(comm_thread *c) {
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < c->nitems; i++) {
    comm_item *it = &c->items[i];
    it->ready = it->by_task = it->started = it->done = false;
    it->req[0] = it->req[1] = MPI_REQUEST_NULL;
    it->t_ready = it->t_start = it->t_done = 0.0;
  }
  c->next_start = 0;
  c->ncompleted = 0;
  pthread_mutex_unlock(&c->mu);
}

void comm_ready(comm_thread *c, int i, bool by_task) {
  pthread_mutex_lock(&c->mu);
  c->items[i].t_ready = comm_now();
  c->items[i].by_task = by_task;
  c->items[i].ready = true;
  if (i == c->next_start)
    pthread_cond_signal(&c->work_cv);
  pthread_mutex_unlock(&c->mu);
}

bool comm_finish_step(comm_thread *c) {
  pthread_mutex_lock(&c->mu);
  bool any = false;
  for (int i = 0; i < c->nitems; i++)
    if (!c->items[i].ready) {
      c->items[i].t_ready = comm_now();
      c->items[i].ready = true;
      any = true;
    }
  if (any)
    pthread_cond_signal(&c->work_cv);
  while (c->ncompleted < c->nitems)
    pthread_cond_wait(&c->done_cv, &c->mu);
  bool ok = !c->broken;
  pthread_mutex_unlock(&c->mu);
  return ok;
}
