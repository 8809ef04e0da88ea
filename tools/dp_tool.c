/* MPI for the command-line tools (dp_tool.h): set-up under mpirun, the
 * data-parallel graph, parameter checksums and the JSON figures. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/dp_tool.h"

#ifdef REMAT_HAVE_MPI
#include "remat_mpi.h"
#endif

static int rank_, size_ = 1;
#ifdef REMAT_HAVE_MPI
static int started;
static remat_dp_stats marked;
#endif

/* Launched by mpirun (Open MPI, or a PMI launcher)? */
static int under_mpirun(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMI_SIZE") != NULL ||
         getenv("PMIX_RANK") != NULL;
}

#ifdef REMAT_HAVE_MPI
/* Threads per rank when the user set none: the CPUs this rank may use,
 * shared with the node's other ranks when mpirun bound nothing. */
static void default_threads(void) {
  cpu_set_t set;
  if (getenv("REMAT_NUM_THREADS") != NULL ||
      sched_getaffinity(0, sizeof set, &set) != 0)
    return;
  long cpus = CPU_COUNT(&set), online = sysconf(_SC_NPROCESSORS_ONLN);
  const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  long ranks = local != NULL ? atol(local) : 1;
  if (cpus == online && ranks > 1)
    cpus /= ranks;
  char v[32];
  snprintf(v, sizeof v, "%ld", cpus < 1 ? 1 : cpus);
  setenv("REMAT_NUM_THREADS", v, 0);
}
#endif

int dp_tool_init(int *argc, char ***argv, const char *prog) {
#ifdef REMAT_HAVE_MPI
  if (!under_mpirun())
    return 0;
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) !=
          MPI_SUCCESS ||
      provided < MPI_THREAD_MULTIPLE) {
    fprintf(stderr, "%s: MPI_Init_thread did not give MPI_THREAD_MULTIPLE "
                    "(thread level %d)\n", prog, provided);
    return 1;
  }
  started = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  if (size_ > 1) {
    setenv("REMAT_BIND", "none", 0);
    default_threads();
    const char *trace = getenv("REMAT_TRACE");
    if (trace != NULL && rank_ > 0) { /* one trace file per rank */
      char *own = malloc(strlen(trace) + 32);
      if (own == NULL)
        return 1;
      sprintf(own, "%s.rank%d", trace, rank_);
      setenv("REMAT_TRACE", own, 1);
      free(own);
    }
  }
  if (rank_ != 0 && freopen("/dev/null", "w", stdout) == NULL) {
    fprintf(stderr, "%s: rank %d cannot silence stdout\n", prog, rank_);
    return 1;
  }
#else
  (void)argc;
  (void)argv;
  (void)prog;
  if (under_mpirun())
    fprintf(stderr, "%s: launched by mpirun, but remat was built without "
                    "MPI: every rank trains alone\n", prog);
#endif
  return 0;
}

void dp_tool_finalize(void) {
#ifdef REMAT_HAVE_MPI
  if (started)
    MPI_Finalize();
  started = 0;
#endif
}

void dp_tool_abort_on_failure(int rc) {
#ifdef REMAT_HAVE_MPI
  if (started && size_ > 1 && rc != 0) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, rc);
  }
#else
  (void)rc;
#endif
}

int dp_tool_rank(void) { return rank_; }
int dp_tool_size(void) { return size_; }

remat_status dp_tool_attach(remat_graph *g) {
#ifdef REMAT_HAVE_MPI
  if (size_ > 1)
    return remat_graph_data_parallel(g, MPI_COMM_WORLD);
#else
  (void)g;
#endif
  return REMAT_OK;
}

uint64_t dp_tool_checksum(remat_graph *g, bool grads) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < remat_num_params(g); i++) {
    remat_tensor *p = remat_param_at(g, i);
    size_t n = (size_t)remat_tensor_numel(p);
    float *buf = malloc(n * sizeof *buf);
    size_t bytes = n * sizeof *buf;
    if (buf == NULL || (grads ? remat_read_grad(g, p, buf, bytes)
                              : remat_read(g, p, buf, bytes)) != REMAT_OK) {
      free(buf);
      return 0;
    }
    const unsigned char *b = (const unsigned char *)buf;
    for (size_t k = 0; k < n * sizeof *buf; k++)
      h = (h ^ b[k]) * 1099511628211ull;
    free(buf);
  }
  return h;
}

void dp_tool_mark(remat_graph *g) {
#ifdef REMAT_HAVE_MPI
  if (size_ > 1)
    remat_graph_dp_stats(g, &marked);
#else
  (void)g;
#endif
}

void dp_tool_json(remat_graph *g, char *buf, size_t size) {
  uint64_t mine = dp_tool_checksum(g, false);
  int len = snprintf(buf, size,
                     ", \"world_size\": %d, \"param_checksum\": \"%016llx\"",
                     size_, (unsigned long long)mine);
#ifdef REMAT_HAVE_MPI
  if (size_ <= 1 || len < 0 || (size_t)len >= size)
    return;
  uint64_t *all = malloc((size_t)size_ * sizeof *all);
  if (all == NULL)
    return;
  MPI_Gather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  len += snprintf(buf + len, size - (size_t)len, ", \"param_checksums\": [");
  for (int r = 0; r < size_ && (size_t)len < size; r++)
    len += snprintf(buf + len, size - (size_t)len, "%s\"%016llx\"",
                    r ? ", " : "", (unsigned long long)all[r]);
  free(all);
  remat_dp_stats st = {0};
  remat_graph_dp_stats(g, &st);
  int64_t n = st.steps - marked.steps;
  double per = n > 0 ? 1.0 / (double)n : 0.0;
  if ((size_t)len < size)
    snprintf(buf + len, size - (size_t)len,
             "], \"buckets\": %d, \"comm_bytes\": %lld, \"comm_s\": %.6f, "
             "\"exposed_comm_s\": %.6f",
             st.buckets, (long long)((double)(st.comm_bytes - marked.comm_bytes) * per),
             (st.comm_s - marked.comm_s) * per,
             (st.exposed_comm_s - marked.exposed_comm_s) * per);
#else
  (void)g;
  (void)len;
#endif
}
