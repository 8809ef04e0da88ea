/* remat-serve's HTTP side (libmicrohttpd, a thread per connection): reads
 * request bodies up to --max-body, routes each method and path to its
 * handler, answers JSON (errors as {"error": message}) and counts every
 * answer in the metrics. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tools/serve.h"

/* A connection's request while its body arrives. */
typedef struct request {
  char *body;
  size_t len;
  int too_big;
  double start;
} request;

static struct MHD_Daemon *daemon_;
static server *srv;
/* Requests begun and not yet answered to the end (on_completed). */
static atomic_int open_requests;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Queues `body` (taken over) with `status` and counts it. */
static enum MHD_Result answer(struct MHD_Connection *c, request *r,
                              serve_endpoint ep, int status, char *body,
                              const char *type, const char *allow,
                              int retry_after) {
  if (body == NULL) {
    status = 500;
    body = strdup("{\"error\":\"out of memory\"}");
    type = "application/json";
  }
  size_t len = body != NULL ? strlen(body) : 0;
  struct MHD_Response *resp = MHD_create_response_from_buffer(
      len, body != NULL ? body : (char *)"", body != NULL
                                                  ? MHD_RESPMEM_MUST_FREE
                                                  : MHD_RESPMEM_PERSISTENT);
  if (resp == NULL) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (allow != NULL)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
  if (atomic_load(&srv->stopping)) /* no next request on this connection */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  if (retry_after > 0) {
    char secs[16];
    snprintf(secs, sizeof secs, "%d", retry_after);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, secs);
  }
  enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
  MHD_destroy_response(resp);
  metrics_request(ep, status, now() - r->start);
  return rc;
}

static enum MHD_Result fail(struct MHD_Connection *c, request *r,
                            serve_endpoint ep, int status, const char *msg) {
  char *body = json_error(msg);
  size_t len = body != NULL ? strlen(body) : 0;
  char *line = body != NULL ? realloc(body, len + 2) : NULL;
  if (line != NULL) {
    line[len] = '\n';
    line[len + 1] = '\0';
  }
  return answer(c, r, ep, status, line != NULL ? line : body,
                "application/json", NULL, status == 503 ? 1 : 0);
}

static enum MHD_Result ok_json(struct MHD_Connection *c, request *r,
                               serve_endpoint ep, char *json) {
  return answer(c, r, ep, 200, json, "application/json", NULL, 0);
}

/* The length of the well-formed UTF-8 sequence at t[0..n) (RFC 3629: no
 * overlong forms, surrogates or code points above U+10FFFF; no NUL), 0
 * if there is none. */
static int utf8_length(const int32_t *t, int n) {
  int b = t[0], more, lo = 0x80, hi = 0xbf;
  if (b > 0 && b < 0x80)
    return 1;
  if (b >= 0xc2 && b <= 0xdf)
    more = 1;
  else if (b >= 0xe0 && b <= 0xef)
    more = 2;
  else if (b >= 0xf0 && b <= 0xf4)
    more = 3;
  else
    return 0;
  if (b == 0xe0)
    lo = 0xa0;
  else if (b == 0xed)
    hi = 0x9f;
  else if (b == 0xf0)
    lo = 0x90;
  else if (b == 0xf4)
    hi = 0x8f;
  if (more >= n || t[1] < lo || t[1] > hi)
    return 0;
  for (int m = 2; m <= more; m++)
    if (t[m] < 0x80 || t[m] > 0xbf)
      return 0;
  return more + 1;
}

/* The generated tokens' text: the addition task's characters, or the
 * bytes where they are well-formed UTF-8 with U+FFFD for each other byte;
 * NULL for u16 ids. */
static char *tokens_text(const int32_t *t, int n) {
  serve_format f = srv->limits.format;
  if (f == FORMAT_U16)
    return NULL;
  char *out = malloc((size_t)n * 3 + 1);
  if (out == NULL)
    return NULL;
  size_t k = 0;
  for (int i = 0; i < n;) {
    if (f == FORMAT_ADDITION) {
      out[k++] = "0123456789+=\n_"[t[i++]];
      continue;
    }
    int len = utf8_length(t + i, n - i);
    for (int m = 0; m < len; m++)
      out[k++] = (char)t[i + m];
    if (len == 0) {
      memcpy(out + k, "\xef\xbf\xbd", 3);
      k += 3;
    }
    i += len > 0 ? len : 1;
  }
  out[k] = '\0';
  return out;
}

static enum MHD_Result do_generate(struct MHD_Connection *c, request *r) {
  char err[512];
  gen_params p;
  if (parse_generate(r->body, r->len, &srv->limits, &p, err, sizeof err))
    return fail(c, r, EP_GENERATE, 400, err);
  int32_t *tokens = NULL;
  int n = 0;
  double seconds = 0.0;
  int status = gen_run(srv, &p, &tokens, &n, &seconds, err, sizeof err);
  int prompt = p.n;
  gen_params_free(&p);
  if (status != 200)
    return fail(c, r, EP_GENERATE, status, err);
  cJSON *o = cJSON_CreateObject();
  cJSON *arr = cJSON_AddArrayToObject(o, "tokens");
  for (int i = prompt; i < n && arr != NULL; i++)
    cJSON_AddItemToArray(arr, cJSON_CreateNumber(tokens[i]));
  char *text = tokens_text(tokens + prompt, n - prompt);
  if (text != NULL)
    cJSON_AddStringToObject(o, "text", text);
  free(text);
  cJSON_AddNumberToObject(o, "seconds", seconds);
  free(tokens);
  char *json = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return ok_json(c, r, EP_GENERATE, json);
}

static enum MHD_Result do_jobs_post(struct MHD_Connection *c, request *r) {
  char err[1024], id[32];
  job_params p;
  if (parse_job(r->body, r->len, &p, err, sizeof err))
    return fail(c, r, EP_JOBS_POST, 400, err);
  int status = jobs_create(srv, &p, id, sizeof id, err, sizeof err);
  job_params_free(&p);
  if (status != 0)
    return fail(c, r, EP_JOBS_POST, status, err);
  char json[64];
  snprintf(json, sizeof json, "{\"id\":\"%s\"}", id);
  return ok_json(c, r, EP_JOBS_POST, strdup(json));
}

static enum MHD_Result do_load(struct MHD_Connection *c, request *r) {
  char err[1024], *path, *job;
  if (parse_load(r->body, r->len, &path, &job, err, sizeof err))
    return fail(c, r, EP_MODELS_LOAD, 400, err);
  int status = 0;
  if (job != NULL) {
    status = jobs_weights(srv, job, &path, err, sizeof err);
    free(job);
  }
  if (status == 0 && gen_load(srv, path, err, sizeof err) != 0)
    status = 400;
  if (status != 0) {
    free(path);
    return fail(c, r, EP_MODELS_LOAD, status, err);
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "loaded", path);
  free(path);
  char *json = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return ok_json(c, r, EP_MODELS_LOAD, json);
}

static enum MHD_Result do_metrics(struct MHD_Connection *c, request *r) {
  char *buf = NULL;
  size_t len = 0;
  int rc = metrics_format(&buf, &len);
  rc |= metrics_printf(&buf, &len, "# HELP remat_generate_queue_depth "
                       "Generate requests waiting or running.\n# TYPE "
                       "remat_generate_queue_depth gauge\n"
                       "remat_generate_queue_depth %d\n"
                       "# HELP remat_generate_peak_bytes The generation "
                       "graph's peak memory.\n# TYPE remat_generate_peak_bytes "
                       "gauge\nremat_generate_peak_bytes %lld\n",
                       gen_depth(srv), (long long)gen_peak(srv));
  rc |= jobs_metrics(srv, &buf, &len);
  if (rc != 0) {
    free(buf);
    return fail(c, r, EP_METRICS, 500, "out of memory");
  }
  return answer(c, r, EP_METRICS, 200, buf,
                "text/plain; version=0.0.4; charset=utf-8", NULL, 0);
}

/* One route: a path (an exact one, or a prefix ending in '/'), its
 * methods and their endpoints. */
typedef struct route {
  const char *path;
  const char *methods[2];
  serve_endpoint eps[2];
  const char *allow;
} route;

static const route routes[] = {
    {"/v1/generate", {"POST"}, {EP_GENERATE}, "POST"},
    {"/v1/jobs", {"POST"}, {EP_JOBS_POST}, "POST"},
    {"/v1/jobs/", {"GET", "DELETE"}, {EP_JOBS_GET, EP_JOBS_DELETE},
     "GET, DELETE"},
    {"/v1/models/load", {"POST"}, {EP_MODELS_LOAD}, "POST"},
    {"/metrics", {"GET"}, {EP_METRICS}, "GET"},
    {"/healthz", {"GET"}, {EP_HEALTHZ}, "GET"},
};
enum { NROUTES = sizeof routes / sizeof routes[0] };

static const route *find_route(const char *url) {
  for (int i = 0; i < NROUTES; i++) {
    size_t n = strlen(routes[i].path);
    if (routes[i].path[n - 1] == '/'
            ? strncmp(url, routes[i].path, n) == 0 && url[n] != '\0' &&
                  strchr(url + n, '/') == NULL
            : strcmp(url, routes[i].path) == 0)
      return &routes[i];
  }
  return NULL;
}

static enum MHD_Result route_request(struct MHD_Connection *c, request *r,
                                     serve_endpoint ep, const char *id);

static enum MHD_Result dispatch(struct MHD_Connection *c, request *r,
                                const char *url, const char *method) {
  char msg[512];
  const route *rt = find_route(url);
  if (rt == NULL) {
    snprintf(msg, sizeof msg, "no endpoint '%.200s': the endpoints are POST "
             "/v1/generate, POST /v1/jobs, GET and DELETE /v1/jobs/ID, POST "
             "/v1/models/load, GET /metrics and GET /healthz", url);
    return fail(c, r, EP_OTHER, 404, msg);
  }
  int k = 0;
  while (k < 2 && (rt->methods[k] == NULL || strcmp(rt->methods[k], method)))
    k++;
  if (k == 2) {
    snprintf(msg, sizeof msg, "method %.32s is not allowed on %s: it takes "
             "%s", method, url[strlen(rt->path) - 1] == '/' ? "/v1/jobs/ID"
             : rt->path, rt->allow);
    char *body = json_error(msg);
    return answer(c, r, rt->eps[0], 405, body, "application/json",
                  rt->allow, 0);
  }
  serve_endpoint ep = rt->eps[k];
  if (r->too_big) {
    snprintf(msg, sizeof msg, "the body is over %lld bytes (--max-body)",
             (long long)srv->max_body);
    return fail(c, r, ep, 413, msg);
  }
  /* --timeout is for idle clients (a slow body): while the request is
   * worked on, the connection has none, and setting it again afterwards
   * starts it from now (libmicrohttpd restarts an idle timer that was 0) */
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
  enum MHD_Result rc = route_request(c, r, ep, url + strlen(rt->path));
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT,
                            (unsigned)srv->timeout_s);
  return rc;
}

/* The endpoint's handler; `id` is what follows "/v1/jobs/". */
static enum MHD_Result route_request(struct MHD_Connection *c, request *r,
                                     serve_endpoint ep, const char *id) {
  char err[1024];
  char *json = NULL;
  int status;
  switch (ep) {
  case EP_GENERATE: return do_generate(c, r);
  case EP_JOBS_POST: return do_jobs_post(c, r);
  case EP_MODELS_LOAD: return do_load(c, r);
  case EP_METRICS: return do_metrics(c, r);
  case EP_HEALTHZ:
    if (atomic_load(&srv->stopping))
      return fail(c, r, ep, 503, "the server is shutting down");
    return ok_json(c, r, ep, strdup("{\"status\":\"ok\"}"));
  case EP_JOBS_GET:
  case EP_JOBS_DELETE:
    status = ep == EP_JOBS_GET
                 ? jobs_get(srv, id, &json, err, sizeof err)
                 : jobs_delete(srv, id, &json, err, sizeof err);
    if (status != 200)
      return fail(c, r, ep, status, err);
    return ok_json(c, r, ep, json);
  default: return fail(c, r, EP_OTHER, 404, "no such endpoint");
  }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version,
                                  const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
  (void)cls;
  (void)version;
  request *r = *con_cls;
  if (r == NULL) {
    r = calloc(1, sizeof *r);
    if (r == NULL)
      return MHD_NO;
    r->start = now();
    atomic_fetch_add(&open_requests, 1);
    const char *cl = MHD_lookup_connection_value(
        c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl != NULL && strtoll(cl, NULL, 10) > srv->max_body)
      r->too_big = 1;
    *con_cls = r;
    return MHD_YES;
  }
  if (*upload_size > 0) {
    if (!r->too_big && r->len + *upload_size > (size_t)srv->max_body)
      r->too_big = 1;
    if (!r->too_big) {
      char *grown = realloc(r->body, r->len + *upload_size + 1);
      if (grown == NULL)
        return MHD_NO;
      memcpy(grown + r->len, upload_data, *upload_size);
      r->body = grown;
      r->len += *upload_size;
      r->body[r->len] = '\0';
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (r->body == NULL && (r->body = strdup("")) == NULL)
    return MHD_NO;
  return dispatch(c, r, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode code) {
  (void)cls;
  (void)c;
  (void)code;
  request *r = *con_cls;
  if (r != NULL) {
    free(r->body);
    free(r);
    atomic_fetch_sub(&open_requests, 1);
  }
  *con_cls = NULL;
}

int http_start(server *s, char *err, size_t err_len) {
  srv = s;
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)s->port);
  if (inet_pton(AF_INET, s->listen, &addr.sin_addr) != 1) {
    snprintf(err, err_len, "--listen '%s' is not an IPv4 address such as "
             "127.0.0.1 or 0.0.0.0", s->listen);
    return -1;
  }
  daemon_ = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
          MHD_USE_ITC,
      (uint16_t)s->port, NULL, NULL, on_request, NULL,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->timeout_s,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->max_queue + 64),
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
  if (daemon_ == NULL) {
    snprintf(err, err_len, "cannot listen on %s port %d (in use, or not an "
             "address of this machine)", s->listen, s->port);
    return -1;
  }
  const union MHD_DaemonInfo *info =
      MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
  if (info != NULL)
    s->port = info->port;
  return 0;
}

void http_quiesce(void) {
  MHD_socket fd = MHD_quiesce_daemon(daemon_);
  if (fd != MHD_INVALID_SOCKET)
    close(fd);
}

void http_drain(double seconds) {
  double until = now() + seconds;
  while (atomic_load(&open_requests) > 0 && now() < until) {
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
}

void http_stop(void) { MHD_stop_daemon(daemon_); }
