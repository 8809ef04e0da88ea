/* The communication thread of a data-parallel step: a fixed sequence of
 * allreduce items per step, each started (MPI_Iallreduce) when a worker
 * marks it ready and every earlier item has started (collectives start in
 * the same order on every rank), progressed with MPI_Test, and finished by
 * a callback on this thread. Workers never call MPI. */
#ifndef REMAT_RUNTIME_MPI_COMM_H
#define REMAT_RUNTIME_MPI_COMM_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define COMM_ERRMSG_MAX 256

/* One allreduce, or two at once (the second when count2 > 0). */
typedef struct comm_item {
  void *buf;
  int count;
  MPI_Datatype type;
  MPI_Op op;
  void *buf2;
  int count2;
  MPI_Datatype type2;
  MPI_Op op2;
  int64_t bytes;          /* of both, for the statistics */
  /* Per step. */
  bool ready;             /* under the mutex */
  bool by_task;           /* marked ready by its task (not by a catch-up) */
  bool started, done;
  MPI_Request req[2];
  double t_ready, t_start, t_done;
} comm_item;

/* Called on the communication thread when item i has completed (or, once
 * the communicator is broken, has been given up). */
typedef void (*comm_done_fn)(void *ctx, int i);

typedef struct comm_thread {
  MPI_Comm comm;
  comm_item *items;
  int nitems;
  comm_done_fn done;
  void *ctx;
  double timeout_s;        /* an item in flight longer breaks the comm */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;  /* an item became ready, or stop */
  pthread_cond_t done_cv;  /* every item of the step has completed */
  bool running, stop;
  int next_start;          /* items start in order */
  int ncompleted;
  bool broken;             /* an MPI call failed or timed out: every later
                              item completes at once, unsent */
  char errmsg[COMM_ERRMSG_MAX];
} comm_thread;

/* Starts the thread on c's filled items; false (with c->errmsg) if it
 * cannot. */
bool comm_start(comm_thread *c);
/* Stops and joins the thread (no step may be in progress). */
void comm_stop(comm_thread *c);
/* Resets the items for a new step (the thread is idle between steps). */
void comm_begin_step(comm_thread *c);
/* Item i's buffers are filled: it may start. Any thread. */
void comm_ready(comm_thread *c, int i, bool by_task);
/* Marks every item not yet ready as ready (by_task false), then waits until
 * every item of the step has completed. Returns !c->broken. */
bool comm_finish_step(comm_thread *c);
/* Seconds of the monotonic clock. */
double comm_now(void);

/* What comm_wait returns when the timeout passed first (no MPI error code
 * is negative). */
#define COMM_TIMED_OUT (-1)
/* Waits for n requests of collectives started on the calling thread
 * (outside the thread's steps: the first step's check and broadcast),
 * polling as the thread does, at most timeout_s seconds: MPI_SUCCESS, the
 * error code of a failed MPI call, or COMM_TIMED_OUT (the requests are then
 * left in flight: a collective cannot be cancelled). */
int comm_wait(MPI_Request *req, int n, double timeout_s);
/* Marks c broken with `what` (and MPI's words for rc when it is an MPI
 * error code), as a failure on the thread does: every later item
 * completes unsent. Any thread, between steps. */
void comm_break(comm_thread *c, const char *what, int rc);

#endif
