/* Where a training process's resident memory goes: builds a GPT, compiles
 * and runs a few steps of it, and at each phase prints the growth of RssAnon
 * over the state before the graph is built, split by kind of mapping
 * (/proc/self/smaps: the arena's huge-page regions, malloc's heaps, thread
 * stacks, executable code), with malloc's own counts (mallinfo2), against
 * the step's peak_bytes.
 *
 *   rss_probe [layers d_model heads threads steps]   (default 4 128 4 2 4)
 *
 * Mappings are told apart by shape, which is what the process can see: a
 * huge-page-aligned anonymous mapping of whole huge pages is the arena's
 * (remat__map); a 64 MiB-aligned one of at most 64 MiB is a malloc heap of
 * a thread other than the first (glibc's HEAP_MAX_SIZE); one that sits just
 * above a no-access guard page and is the size of a thread stack is a
 * thread's stack; one with execute permission is generated code. */
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/alloc.h"
#include "remat.h"
#include "remat_gpt.h"

enum { K_ARENA, K_HEAP, K_THREAD_HEAP, K_STACK, K_EXEC, K_BIG, K_OTHER, NK };
static const char *kind_name[NK] = {
    "arena regions (2 MiB aligned)", "[heap] (main malloc arena)",
    "malloc heaps of other threads", "thread stacks", "executable (JIT code)",
    "other anonymous >= 1 MiB (malloc mmap, oneDNN)", "other anonymous"};

typedef struct {
  int64_t anon[NK];   /* Anonymous: kB summed, in bytes */
  int64_t total;
  int64_t rss_anon;
  struct mallinfo2 mi;
} snapshot;

static int64_t rss_anon(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int64_t kib = -1;
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, "RssAnon:", 8) == 0)
      kib = atoll(line + 8);
  if (f != NULL)
    fclose(f);
  return kib * 1024;
}

static size_t stack_size(void) {
  struct rlimit r;
  if (getrlimit(RLIMIT_STACK, &r) != 0 || r.rlim_cur == RLIM_INFINITY)
    return (size_t)8 << 20;
  return (size_t)r.rlim_cur;
}

typedef struct {
  uintptr_t lo, hi;
  char perms[8], name[64];
  int64_t anon;
} mapping;

/* The kind of mapping i of n (see the top of the file). */
static int classify(const mapping *m, int i, int n) {
  const uintptr_t huge = 2u << 20, heap_max = 64u << 20;
  const size_t stack = stack_size(), size = m[i].hi - m[i].lo;
  const char *name = m[i].name;
  bool after_guard = i > 0 && m[i - 1].hi == m[i].lo &&
                     strncmp(m[i - 1].perms, "---", 3) == 0;
  /* glibc reserves a thread's heap as 64 MiB, aligned, and opens it for
   * reading and writing as it grows: the rest is a no-access mapping */
  uintptr_t reserved = m[i].hi;
  if (i + 1 < n && m[i + 1].lo == m[i].hi &&
      strncmp(m[i + 1].perms, "---", 3) == 0)
    reserved = m[i + 1].hi;
  if (strcmp(name, "[heap]") == 0)
    return K_HEAP;
  if (strncmp(name, "[stack", 6) == 0)
    return K_STACK;
  if (name[0] != '\0')
    return -1; /* a file or a special mapping: not malloc's or remat's */
  if (m[i].perms[2] == 'x')
    return K_EXEC;
  if (m[i].lo % heap_max == 0 && reserved - m[i].lo == heap_max)
    return K_THREAD_HEAP;
  if (after_guard && size + 4096 >= stack && size <= stack + 4096)
    return K_STACK;
  if (m[i].lo % huge == 0 && size % huge == 0 && size >= 2 * huge)
    return K_ARENA;
  return size >= (1u << 20) ? K_BIG : K_OTHER;
}

static void take(snapshot *s) {
  memset(s, 0, sizeof *s);
  s->mi = mallinfo2();
  FILE *f = fopen("/proc/self/smaps", "r");
  if (f == NULL)
    return;
  int n = 0, cap = 0;
  mapping *m = NULL;
  char line[512];
  while (fgets(line, sizeof line, f) != NULL) {
    uintptr_t a, b;
    char perms[8], name[64] = "";
    long kb;
    char *dash = strchr(line, '-'), *space = strchr(line, ' ');
    if (dash != NULL && space != NULL && dash < space &&
        sscanf(line, "%lx-%lx %7s %*s %*s %*s %63s", &a, &b, perms, name) >=
            3) {
      if (n == cap) {
        cap = cap ? 2 * cap : 256;
        mapping *grown = realloc(m, (size_t)cap * sizeof *m);
        if (grown == NULL)
          break;
        m = grown;
      }
      m[n] = (mapping){.lo = a, .hi = b};
      memcpy(m[n].perms, perms, sizeof perms);
      memcpy(m[n].name, name, sizeof name);
      n++;
    } else if (n > 0 && sscanf(line, "Anonymous: %ld kB", &kb) == 1) {
      m[n - 1].anon = (int64_t)kb * 1024;
    }
  }
  fclose(f);
  for (int i = 0; i < n; i++) {
    int kind = classify(m, i, n);
    if (kind >= 0) {
      s->anon[kind] += m[i].anon;
      s->total += m[i].anon;
    }
  }
  free(m);
  s->rss_anon = rss_anon();
}

static double mib(int64_t b) { return (double)b / 1048576.0; }

static void print(const char *phase, const snapshot *b, const snapshot *s) {
  printf("%-14s RssAnon +%7.2f MiB |", phase, mib(s->rss_anon - b->rss_anon));
  for (int k = 0; k < NK; k++)
    printf(" %+.2f", mib(s->anon[k] - b->anon[k]));
  printf(" | remat's allocations %lld", (long long)remat__alloc_count());
  printf(" | malloc in use %+.2f, held %+.2f (mmapped %+.2f)\n",
         mib((int64_t)s->mi.uordblks + (int64_t)s->mi.hblkhd -
             (int64_t)b->mi.uordblks - (int64_t)b->mi.hblkhd),
         mib((int64_t)s->mi.arena + (int64_t)s->mi.hblkhd -
             (int64_t)b->mi.arena - (int64_t)b->mi.hblkhd),
         mib((int64_t)s->mi.hblkhd - (int64_t)b->mi.hblkhd));
}

#define CHECK(x)                                                          \
  do {                                                                    \
    if ((x) != REMAT_OK) {                                                \
      fprintf(stderr, "%s failed: %s\n", #x, remat_last_error());        \
      return 1;                                                           \
    }                                                                     \
  } while (0)

int main(int argc, char **argv) {
  int layers = argc > 1 ? atoi(argv[1]) : 4;
  int d_model = argc > 2 ? atoi(argv[2]) : 128;
  int heads = argc > 3 ? atoi(argv[3]) : 4;
  int threads = argc > 4 ? atoi(argv[4]) : 2;
  int steps = argc > 5 ? atoi(argv[5]) : 4;
  remat_config rc = {.set = REMAT_SET_NUM_THREADS, .num_threads = threads};
  remat_runtime *rt = NULL;
  CHECK(remat_runtime_create(&rc, &rt));
  snapshot before, now;
  take(&before);
  printf("GPT %d layers d%d, seq 256, batch 8, %d threads\n", layers,
         d_model, threads);
  printf("%-14s %-20s |", "phase", "growth");
  for (int k = 0; k < NK; k++)
    printf(" [%d]", k);
  printf("\n");
  for (int k = 0; k < NK; k++)
    printf("  [%d] %s\n", k, kind_name[k]);
  const remat_gpt_config cfg = {.layers = layers, .d_model = d_model,
                                .heads = heads, .seq = 256, .batch = 8,
                                .vocab = 256};
  remat_graph *g = NULL;
  remat_gpt m;
  CHECK(remat_graph_create(rt, &g));
  CHECK(remat_gpt_build(g, &cfg, &m));
  take(&now);
  print("built", &before, &now);
  const remat_optimizer opt = {.kind = REMAT_OPT_ADAMW, .lr = 1e-4f};
  CHECK(remat_compile(g, m.loss, &opt));
  take(&now);
  print("compiled", &before, &now);
  size_t n = (size_t)cfg.batch * (size_t)cfg.seq;
  int32_t *tokens = malloc(n * sizeof *tokens);
  if (tokens == NULL)
    return 1;
  for (size_t i = 0; i < n; i++)
    tokens[i] = (int32_t)((i * 7 + 3) % 256);
  CHECK(remat_feed(g, m.tokens, tokens, n * sizeof *tokens));
  CHECK(remat_feed(g, m.targets, tokens, n * sizeof *tokens));
  free(tokens);
  int64_t peak = 0;
  for (int step = 0; step < steps; step++) {
    remat_step_stats st = {.size = sizeof st};
    CHECK(remat_step(g, &st));
    if (st.peak_bytes > peak)
      peak = st.peak_bytes;
    char phase[32];
    snprintf(phase, sizeof phase, "step %d", step + 1);
    take(&now);
    print(phase, &before, &now);
  }
  int64_t growth = now.rss_anon - before.rss_anon;
  printf("peak_bytes %.2f MiB, RssAnon growth %.2f MiB, ratio %.3f, "
         "outside the arena %.2f MiB\n",
         mib(peak), mib(growth), (double)growth / (double)peak,
         mib(growth - (now.anon[K_ARENA] - before.anon[K_ARENA])));
  int64_t d[NK];
  for (int k = 0; k < NK; k++)
    d[k] = now.anon[k] - before.anon[k];
  printf("summary: arena over peak_bytes %.2f MiB; outside the arena: "
         "generated code %.2f, main heap and malloc's mmaps %.2f, other "
         "threads' malloc heaps %.2f, stacks %.2f, rest %.2f; growth over "
         "1.05 x peak_bytes %.2f MiB\n",
         mib(d[K_ARENA] - peak), mib(d[K_EXEC]),
         mib(d[K_HEAP] + d[K_BIG] + d[K_OTHER]), mib(d[K_THREAD_HEAP]),
         mib(d[K_STACK]),
         mib(growth - d[K_ARENA] - d[K_EXEC] - d[K_HEAP] - d[K_BIG] -
             d[K_OTHER] - d[K_THREAD_HEAP] - d[K_STACK]),
         mib(growth - peak / 1000 * 1050));
  remat_graph_destroy(g);
  remat_runtime_destroy(rt);
  return 0;
}
