/* Option parsing of sim_scaling (sim_options.h), in bench_train's style.
 *
 * Defaults of the simulated server, a two-socket Xeon "Sapphire Rapids"
 * (each NUMA node one socket with 8 channels of DDR5-4800):
 *  --mem-gbs 250: 8 channels x 4800 MT/s x 8 bytes = 307.2 GB/s per socket
 *    in theory; STREAM-class kernels sustain about 80% of it;
 *  --link-gbs 65: what one socket's UPI 2.0 links (16 GT/s) carry to the
 *    other per direction in remote-read tests, about half their raw rate;
 *  --remote-latency 1.7: a load from the other socket's memory takes about
 *    190 ns against about 110 ns from the own socket's (idle latency);
 *  --lock-ns 80, --lock-remote 2.5: one operation on a contended queue
 *    (its cache lines move between cores; across sockets 2.5 times as long);
 *  --signal-us 2, --wake-us 5, --spin-us 50: a futex wake-up as the waker
 *    pays it, the woken thread's delay, and how long an idle worker of
 *    sched/run.c polls (SPIN_PAUSES and SPIN_YIELDS attempts) before it
 *    sleeps. */
#include <ctype.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/sim/sim_options.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: sim_scaling [--layers L] [--d-model D] [--heads H] [--seq T]\n"
          "                   [--batch B] [--vocab V] [--steps S] [--threads N]\n"
          "                   [--policy P] [--budget BYTES] [--json]\n"
          "                   [--cores LIST] [--nodes LIST] [--costs step|isolated]\n"
          "                   [--mem-gbs X] [--link-gbs X] [--remote-latency X]\n"
          "                   [--lock-ns X] [--lock-remote X] [--signal-us X]\n"
          "                   [--wake-us X] [--spin-us X] [--overhead-us X]\n"
          "                   [--split KERNEL=PARTS[,KERNEL=PARTS...]]\n"
          "defaults: L=8 D=512 H=8 T=256 B=8 V=256 S=6 N=2 P=everything_saveable\n"
          "          cores 8,16,32,64,128,256  nodes 1,2,4  costs step\n"
          "          mem-gbs 250 link-gbs 65 remote-latency 1.7 lock-ns 80\n"
          "          lock-remote 2.5 signal-us 2 wake-us 5 spin-us 50\n"
          "          overhead-us 2 (costs isolated only; step measures it)\n"
          "S is the number of interleaved validation rounds (1 and N threads).\n"
          "--split simulates each tile of a kernel (linear.fwd, ...) as PARTS\n"
          "equal pieces: a what-if for finer tiles.\n");
}

static int parse_int(const char *opt, const char *v, int *out) {
  char *end;
  long x = strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || x < 1 || x > 1000000) {
    fprintf(stderr, "sim_scaling: %s '%s': expected a whole number >= 1\n", opt, v);
    return 0;
  }
  *out = (int)x;
  return 1;
}

static int parse_real(const char *opt, const char *v, double min, double *out) {
  char *end;
  double x = strtod(v, &end);
  if (*v == '\0' || *end != '\0' || !(x >= min) || x > 1e9) {
    fprintf(stderr, "sim_scaling: %s '%s': expected a number >= %g\n", opt, v,
            min);
    return 0;
  }
  *out = x;
  return 1;
}

/* "8,16,32": whole numbers in [1, max], at most SIM_MAX_LIST. */
static int parse_list(const char *opt, const char *v, int max, int *out,
                      int *n) {
  *n = 0;
  const char *p = v;
  for (;;) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || x < 1 || x > max || *n == SIM_MAX_LIST ||
        (*end != ',' && *end != '\0')) {
      fprintf(stderr,
              "sim_scaling: %s '%s': expected up to %d comma-separated whole "
              "numbers from 1 to %d\n",
              opt, v, SIM_MAX_LIST, max);
      return 0;
    }
    out[(*n)++] = (int)x;
    if (*end == '\0')
      return 1;
    p = end + 1;
  }
}

static bool kernel_name_ok(const char *p, const char *end) {
  for (; p < end; p++)
    if (!isalnum((unsigned char)*p) && *p != '_' && *p != '.')
      return false;
  return true;
}

/* "linear.fwd=4,linear.dx=4": kernel names and piece counts (2 to 64). */
static int parse_splits(const char *v, sim_options *o) {
  o->nsplits = 0;
  for (const char *p = v; *p;) {
    const char *eq = strchr(p, '='), *end = strchr(p, ',');
    end = end != NULL ? end : p + strlen(p);
    char *stop;
    long parts = eq != NULL && eq < end ? strtol(eq + 1, &stop, 10) : 0;
    if (eq == NULL || eq >= end || eq == p || eq - p >= 32 || stop != end ||
        parts < 2 || parts > 64 || o->nsplits == SIM_MAX_LIST ||
        !kernel_name_ok(p, eq)) {
      fprintf(stderr,
              "sim_scaling: --split '%s': expected KERNEL=PARTS[,...], a "
              "kernel name of letters, digits, '_' and '.', PARTS from 2 to "
              "64\n",
              v);
      return 0;
    }
    memcpy(o->split_name[o->nsplits], p, (size_t)(eq - p));
    o->split_name[o->nsplits][eq - p] = '\0';
    o->split_parts[o->nsplits++] = (int)parts;
    p = *end ? end + 1 : end;
  }
  return 1;
}

static void set_defaults(sim_options *o) {
  static const int cores[] = {8, 16, 32, 64, 128, 256}, nodes[] = {1, 2, 4};
  *o = (sim_options){.cfg = {.layers = 8, .d_model = 512, .heads = 8,
                             .seq = 256, .batch = 8, .vocab = 256},
                     .steps = 6, .threads = 2, .policy = "everything_saveable",
                     .ncores = 6, .nnodes = 3, .mem_gbs = 250, .link_gbs = 65,
                     .remote_latency = 1.7, .lock_ns = 80, .lock_remote = 2.5,
                     .signal_us = 2, .wake_us = 5, .spin_us = 50,
                     .overhead_us = 2};
  memcpy(o->cores, cores, sizeof cores);
  memcpy(o->nodes, nodes, sizeof nodes);
}

static int parse_costs(const char *v, int *isolated) {
  if (strcmp(v, "step") == 0 || strcmp(v, "isolated") == 0) {
    *isolated = strcmp(v, "isolated") == 0;
    return 1;
  }
  fprintf(stderr, "sim_scaling: --costs '%s': expected step or isolated\n", v);
  return 0;
}

static int parse_one(int c, sim_options *o) {
  switch (c) {
  case 'L': return parse_int("--layers", optarg, &o->cfg.layers);
  case 'D': return parse_int("--d-model", optarg, &o->cfg.d_model);
  case 'H': return parse_int("--heads", optarg, &o->cfg.heads);
  case 'T': return parse_int("--seq", optarg, &o->cfg.seq);
  case 'B': return parse_int("--batch", optarg, &o->cfg.batch);
  case 'V': return parse_int("--vocab", optarg, &o->cfg.vocab);
  case 'S':
    if (parse_int("--steps", optarg, &o->steps) && o->steps <= SIM_MAX_ROUNDS)
      return 1;
    fprintf(stderr, "sim_scaling: --steps: at most %d rounds\n", SIM_MAX_ROUNDS);
    return 0;
  case 'N': return parse_int("--threads", optarg, &o->threads);
  case 'P': o->policy = optarg; return 1;
  case 'M':
    if (remat_parse_bytes(optarg, &o->budget) == REMAT_OK)
      return 1;
    fprintf(stderr, "sim_scaling: --budget: %s\n", remat_last_error());
    return 0;
  case 'j': o->json = 1; return 1;
  case 'c': return parse_list("--cores", optarg, 4096, o->cores, &o->ncores);
  case 'n': return parse_list("--nodes", optarg, 8, o->nodes, &o->nnodes);
  case 'C': return parse_costs(optarg, &o->isolated);
  case 'm': return parse_real("--mem-gbs", optarg, 0.001, &o->mem_gbs);
  case 'l': return parse_real("--link-gbs", optarg, 0.001, &o->link_gbs);
  case 'r': return parse_real("--remote-latency", optarg, 1.0, &o->remote_latency);
  case 'k': return parse_real("--lock-ns", optarg, 0.0, &o->lock_ns);
  case 'K': return parse_real("--lock-remote", optarg, 1.0, &o->lock_remote);
  case 'g': return parse_real("--signal-us", optarg, 0.0, &o->signal_us);
  case 'w': return parse_real("--wake-us", optarg, 0.0, &o->wake_us);
  case 's': return parse_real("--spin-us", optarg, 0.0, &o->spin_us);
  case 'o': return parse_real("--overhead-us", optarg, 0.0, &o->overhead_us);
  case 'x': return parse_splits(optarg, o);
  case 'h': usage(stdout); exit(0);
  default: return 0;
  }
}

int sim_parse_args(int argc, char **argv, sim_options *o) {
  static const struct option longopts[] = {
      {"layers", 1, 0, 'L'},    {"d-model", 1, 0, 'D'},  {"heads", 1, 0, 'H'},
      {"seq", 1, 0, 'T'},       {"batch", 1, 0, 'B'},    {"vocab", 1, 0, 'V'},
      {"steps", 1, 0, 'S'},     {"threads", 1, 0, 'N'},  {"policy", 1, 0, 'P'},
      {"budget", 1, 0, 'M'},    {"json", 0, 0, 'j'},     {"cores", 1, 0, 'c'},
      {"nodes", 1, 0, 'n'},     {"costs", 1, 0, 'C'},    {"mem-gbs", 1, 0, 'm'},
      {"link-gbs", 1, 0, 'l'},  {"remote-latency", 1, 0, 'r'},
      {"lock-ns", 1, 0, 'k'},   {"lock-remote", 1, 0, 'K'},
      {"signal-us", 1, 0, 'g'}, {"wake-us", 1, 0, 'w'},  {"spin-us", 1, 0, 's'},
      {"overhead-us", 1, 0, 'o'}, {"split", 1, 0, 'x'},  {"help", 0, 0, 'h'},
      {0, 0, 0, 0}};
  set_defaults(o);
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1)
    if (!parse_one(c, o)) {
      usage(stderr);
      return 0;
    }
  if (optind < argc) {
    fprintf(stderr, "sim_scaling: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 0;
  }
  for (int i = 0; i < o->ncores; i++)
    for (int j = 0; j < o->nnodes; j++)
      if (o->cores[i] < o->nodes[j]) {
        fprintf(stderr, "sim_scaling: %d cores cannot fill %d nodes\n",
                o->cores[i], o->nodes[j]);
        return 0;
      }
  return 1;
}
