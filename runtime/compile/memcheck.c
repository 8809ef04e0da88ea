/* Stage "memory check" (memcheck.h): the predicted peak against what the
 * process can get. The cgroup comes from /proc/self/cgroup (the v2 line
 * "0::PATH", or v1's "memory" controller), read under /sys/fs/cgroup. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "runtime/compile/memcheck.h"

/* The first number of a file, -1 when it is missing or not a number
 * ("max" included). */
static int64_t read_number(const char *path) {
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return -1;
  long long v = -1;
  if (fscanf(f, "%lld", &v) != 1)
    v = -1;
  fclose(f);
  return v;
}

/* The cgroup path of this process for v2 (controllers "") or v1's memory
 * controller, in `out`; false when there is none. */
static bool cgroup_path(bool v2, char *out, size_t len) {
  FILE *f = fopen("/proc/self/cgroup", "re");
  if (f == NULL)
    return false;
  char line[4096];
  bool found = false;
  while (!found && fgets(line, sizeof line, f) != NULL) {
    char *controllers = strchr(line, ':');
    char *path = controllers ? strchr(controllers + 1, ':') : NULL;
    if (path == NULL)
      continue;
    *path++ = '\0';
    controllers++;
    path[strcspn(path, "\n")] = '\0';
    found = v2 ? *controllers == '\0'
               : strstr(controllers, "memory") != NULL;
    if (found)
      snprintf(out, len, "%s", strcmp(path, "/") == 0 ? "" : path);
  }
  fclose(f);
  return found;
}

/* A cgroup's limit less its use, -1 without a limit. */
static int64_t cgroup_room(const char *dir, const char *limit_name,
                           const char *use_name) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, limit_name);
  int64_t limit = read_number(path);
  snprintf(path, sizeof path, "%s/%s", dir, use_name);
  int64_t use = read_number(path);
  /* v1 writes "no limit" as a page-rounded INT64_MAX */
  if (limit < 0 || limit >= INT64_MAX / 2)
    return -1;
  return use > 0 && use < limit ? limit - use : use >= limit ? 0 : limit;
}

/* The process's cgroup under `mount`, else (in a container, whose cgroup
 * namespace shows "/" or a path the mount does not have) the mount's
 * root. */
static int64_t cgroup_at(const char *mount, bool v2, const char *limit_name,
                         const char *use_name) {
  char rel[4096], dir[4200];
  int64_t room = -1;
  if (cgroup_path(v2, rel, sizeof rel)) {
    snprintf(dir, sizeof dir, "%s%s", mount, rel);
    room = cgroup_room(dir, limit_name, use_name);
  }
  return room >= 0 ? room : cgroup_room(mount, limit_name, use_name);
}

static int64_t cgroup_figure(void) {
  int64_t room = cgroup_at("/sys/fs/cgroup", true, "memory.max",
                           "memory.current");
  if (room < 0)
    room = cgroup_at("/sys/fs/cgroup/unified", true, "memory.max",
                     "memory.current");
  if (room < 0)
    room = cgroup_at("/sys/fs/cgroup/memory", false, "memory.limit_in_bytes",
                     "memory.usage_in_bytes");
  return room;
}

static int64_t rlimit_figure(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
      rl.rlim_cur > (rlim_t)INT64_MAX)
    return -1;
  long long pages = -1;
  FILE *f = fopen("/proc/self/statm", "re");
  if (f != NULL) {
    if (fscanf(f, "%lld", &pages) != 1)
      pages = -1;
    fclose(f);
  }
  int64_t used = pages > 0 ? pages * (int64_t)sysconf(_SC_PAGESIZE) : 0;
  int64_t limit = (int64_t)rl.rlim_cur;
  return used < limit ? limit - used : 0;
}

static int64_t available_figure(void) {
  FILE *f = fopen("/proc/meminfo", "re");
  if (f == NULL)
    return -1;
  char line[256];
  long long kib = -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "MemAvailable: %lld kB", &kib) == 1)
      break;
  fclose(f);
  return kib >= 0 ? kib * 1024 : -1;
}

mem_room memcheck_room(void) {
  return (mem_room){cgroup_figure(), rlimit_figure(), available_figure()};
}

remat_status memcheck_fit(remat_graph *g, int64_t peak, const mem_room *room) {
  const struct {
    int64_t bytes;
    const char *source;
  } figures[3] = {
      {room->cgroup, "the cgroup's memory limit less its use"},
      {room->rlimit_as, "RLIMIT_AS less the address space in use"},
      {room->available, "MemAvailable in /proc/meminfo"}};
  int least = -1;
  for (int i = 0; i < 3; i++)
    if (figures[i].bytes >= 0 &&
        (least < 0 || figures[i].bytes < figures[least].bytes))
      least = i;
  if (least < 0 || peak <= figures[least].bytes)
    return REMAT_OK;
  int64_t room_bytes = figures[least].bytes;
  return graph_fail(
      g, REMAT_ERR_OUT_OF_MEMORY,
      "remat_compile: the step needs %" PRId64 " bytes (%.2f MiB) at its "
      "peak, but the process can get %" PRId64 " bytes (%.2f MiB, %s): set "
      "a memory budget (%s) of at most %" PRId64 " bytes so that the "
      "planner recomputes activations, or build a smaller model",
      peak, (double)peak / 1048576.0, room_bytes,
      (double)room_bytes / 1048576.0, figures[least].source,
      graph_budget_origin(g), room_bytes);
}
