/* remat-serve's request metrics: counts by endpoint and status and latency
 * histograms, written in Prometheus' text format for GET /metrics (the
 * generation and job gauges are the other files'). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/serve.h"

static const char *const endpoint_names[EP_COUNT] = {
    "generate", "jobs_create", "jobs_get", "jobs_delete", "models_load",
    "metrics", "healthz", "other"};
/* The statuses the server answers with, in the order of `counts`. */
static const int statuses[] = {200, 400, 404, 405, 409, 413, 500, 503};
enum { NSTATUS = sizeof statuses / sizeof statuses[0] };
/* Upper bounds of the latency buckets, seconds. */
static const double bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0};
enum { NBUCKET = sizeof bounds / sizeof bounds[0] };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long counts[EP_COUNT][NSTATUS];
static unsigned long long buckets[EP_COUNT][NBUCKET + 1]; /* + Inf */
static double sums[EP_COUNT];

void metrics_request(serve_endpoint ep, int status, double seconds) {
  int k = 0;
  while (k < NSTATUS - 1 && statuses[k] != status)
    k++;
  int b = 0;
  while (b < NBUCKET && seconds > bounds[b])
    b++;
  pthread_mutex_lock(&lock);
  counts[ep][k]++;
  buckets[ep][b]++;
  sums[ep] += seconds;
  pthread_mutex_unlock(&lock);
}

int metrics_printf(char **buf, size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0)
    return -1;
  char *grown = realloc(*buf, *len + (size_t)n + 1);
  if (grown == NULL)
    return -1;
  *buf = grown;
  va_start(ap, fmt);
  vsnprintf(*buf + *len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  *len += (size_t)n;
  return 0;
}

int metrics_format(char **buf, size_t *len) {
  unsigned long long c[EP_COUNT][NSTATUS], h[EP_COUNT][NBUCKET + 1];
  double s[EP_COUNT];
  pthread_mutex_lock(&lock);
  memcpy(c, counts, sizeof c);
  memcpy(h, buckets, sizeof h);
  memcpy(s, sums, sizeof s);
  pthread_mutex_unlock(&lock);
  int rc = metrics_printf(buf, len,
                          "# HELP remat_requests_total HTTP requests "
                          "answered, by endpoint and status.\n"
                          "# TYPE remat_requests_total counter\n");
  for (int e = 0; e < EP_COUNT; e++)
    for (int k = 0; k < NSTATUS; k++)
      if (c[e][k] > 0)
        rc |= metrics_printf(buf, len, "remat_requests_total{endpoint=\"%s\","
                             "status=\"%d\"} %llu\n", endpoint_names[e],
                             statuses[k], c[e][k]);
  rc |= metrics_printf(buf, len,
                       "# HELP remat_request_seconds Time from a request's "
                       "first byte to its answer.\n"
                       "# TYPE remat_request_seconds histogram\n");
  for (int e = 0; e < EP_COUNT; e++) {
    unsigned long long cum = 0;
    for (int b = 0; b <= NBUCKET; b++) {
      cum += h[e][b];
      if (b < NBUCKET)
        rc |= metrics_printf(buf, len, "remat_request_seconds_bucket{"
                             "endpoint=\"%s\",le=\"%g\"} %llu\n",
                             endpoint_names[e], bounds[b], cum);
      else
        rc |= metrics_printf(buf, len, "remat_request_seconds_bucket{"
                             "endpoint=\"%s\",le=\"+Inf\"} %llu\n",
                             endpoint_names[e], cum);
    }
    rc |= metrics_printf(buf, len, "remat_request_seconds_sum{endpoint="
                         "\"%s\"} %.6f\nremat_request_seconds_count{endpoint="
                         "\"%s\"} %llu\n", endpoint_names[e], s[e],
                         endpoint_names[e], cum);
  }
  return rc != 0 ? -1 : 0;
}
