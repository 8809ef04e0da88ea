/* Printing sim_scaling's results (sim_report.h), as text or JSON. */
#include <stdlib.h>
#include <string.h>

#include "benchmarks/sim/sim_report.h"
#include "tools/json_out.h"

#define KERNELS_SHOWN 12

/* Adds s seconds of kernel `name` to parts[0..*n), merging by name. */
static void add_part(sim_path_part *parts, int *n, int max, const char *name,
                     double s) {
  for (int i = 0; i < *n; i++)
    if (strcmp(parts[i].name, name) == 0) {
      parts[i].tasks++;
      parts[i].s += s;
      return;
    }
  if (*n < max)
    parts[(*n)++] = (sim_path_part){name, 1, s};
}

static int cmp_part(const void *a, const void *b) {
  double x = ((const sim_path_part *)a)->s, y = ((const sim_path_part *)b)->s;
  return (x < y) - (x > y);
}

int sim_report_set_path(sim_report *r, const sim_layout *l) {
  int32_t *path = malloc((size_t)l->ntasks * sizeof *path), len = 0;
  if (path == NULL)
    return 0;
  r->path_s = sim_critical_path(l, r->c, path, &len);
  for (int32_t i = 0; i < len; i++) {
    int32_t orig = l->orig[path[i]];
    double s = r->c->task_s[orig] * l->share[path[i]] + r->c->overhead_s;
    add_part(r->path, &r->npath, SIM_PATH_PARTS, sim_task_name(r->s, orig), s);
  }
  qsort(r->path, (size_t)r->npath, sizeof *r->path, cmp_part);
  free(path);
  return r->path_s >= 0;
}

/* Tile tasks of each kernel and their summed duration, largest first. */
static int kernel_totals(const sim_report *r, sim_path_part *parts, int max) {
  int n = 0;
  for (int32_t t = 0; t < r->s->ntasks; t++)
    if (r->s->tile[t] >= 0)
      add_part(parts, &n, max, sim_task_name(r->s, t), r->c->task_s[t]);
  qsort(parts, (size_t)n, sizeof *parts, cmp_part);
  return n;
}

static void print_text_head(const sim_report *r, FILE *f) {
  const sim_options *o = r->o;
  fprintf(f, "model: layers %d, d_model %d, heads %d, seq %d, batch %d, "
             "vocab %d, policy %s\n",
          o->cfg.layers, o->cfg.d_model, o->cfg.heads, o->cfg.seq,
          o->cfg.batch, o->cfg.vocab, o->policy);
  fprintf(f, "costs: %s, %d tasks in %d cost groups, %.2f us overhead per task, "
             "one simulated core %.3f s\n",
          o->isolated ? "tiles run in isolation" : "trace of a 1-thread step",
          (int)r->s->ntasks, r->c->groups, r->c->overhead_s * 1e6,
          r->one_core_s);
  if (r->isolated_over_trace > 0)
    fprintf(f, "isolated tiles / traced tiles (sum of durations): %.3f\n",
            r->isolated_over_trace);
  fprintf(f, "server: %.0f GB/s memory and %.0f GB/s links per node, remote "
             "latency x%.2f, core streams %.1f GB/s (memset here)\n",
          o->mem_gbs, o->link_gbs, o->remote_latency, r->core_bw * 1e-9);
  for (int i = 0; i < o->nsplits; i++)
    fprintf(f, "what-if: each %s tile simulated as %d pieces\n",
            o->split_name[i], o->split_parts[i]);
  if (r->nval == 0)
    fprintf(f, "validation: skipped (--costs isolated runs no step of this "
               "model)\n");
  for (int i = 0; i < r->nval; i++) {
    const sim_validation *v = &r->val[i];
    fprintf(f, "validation: %d thread(s): measured %.3f s, predicted %.3f s "
               "(%+.1f%%); the process had %.2f of %d core(s): %.3f s of CPU "
               "per thread\n",
            v->threads, v->measured_s, v->predicted_s,
            100.0 * (v->predicted_s / v->measured_s - 1.0), v->cpu_share,
            v->threads, v->measured_s * v->cpu_share);
  }
}

static void print_text(const sim_report *r, FILE *f) {
  print_text_head(r, f);
  fprintf(f, "%6s %5s %-8s %10s %6s %10s %10s %10s %8s\n", "cores", "nodes",
          "placed", "step_s", "eff", "crit_s", "remote_GB", "stall_s",
          "peak_GB");
  for (int i = 0; i < r->nrows; i++) {
    const sim_row *w = &r->rows[i];
    fprintf(f, "%6d %5d %-8s %10.4f %6.3f %10.4f %10.2f %10.3f %8.2f\n",
            w->cores, w->nodes, w->placed ? "yes" : "no", w->r.step_s,
            w->efficiency, w->r.critical_path_s, w->r.remote_bytes * 1e-9,
            w->r.stall_s, (double)w->r.peak_bytes * 1e-9);
  }
  sim_path_part k[SIM_PATH_PARTS];
  int nk = kernel_totals(r, k, SIM_PATH_PARTS);
  fprintf(f, "kernels (one core): name, tiles, total s, mean tile us\n");
  for (int i = 0; i < nk && i < KERNELS_SHOWN; i++)
    fprintf(f, "  %-20s %8d %9.3f %10.1f\n", k[i].name, k[i].tasks, k[i].s,
            1e6 * k[i].s / k[i].tasks);
  fprintf(f, "critical path %.4f s: kernel, tasks (start, tile, done), s\n",
          r->path_s);
  for (int i = 0; i < r->npath && i < KERNELS_SHOWN; i++)
    fprintf(f, "  %-20s %8d %9.4f\n", r->path[i].name, r->path[i].tasks,
            r->path[i].s);
  fprintf(f, "this run: compile %.1f s, costs and validation %.1f s, "
             "simulation %.1f s\n",
          r->phase_s[0], r->phase_s[1], r->phase_s[2]);
}

static void print_json_head(const sim_report *r, FILE *f) {
  const sim_options *o = r->o;
  fprintf(f, "{\"model\": {\"layers\": %d, \"d_model\": %d, \"heads\": %d, "
             "\"seq\": %d, \"batch\": %d, \"vocab\": %d, \"policy\": \"%s\"},\n",
          o->cfg.layers, o->cfg.d_model, o->cfg.heads, o->cfg.seq,
          o->cfg.batch, o->cfg.vocab, o->policy);
  json_nulls nulls = {0};
  fprintf(f, " \"costs\": {\"source\": \"%s\", \"tasks\": %d, \"groups\": %d",
          o->isolated ? "isolated" : "trace", (int)r->s->ntasks, r->c->groups);
  json_fput(f, &nulls, "overhead_s", "%.9f", r->c->overhead_s);
  json_fput(f, &nulls, "one_core_s", "%.6f", r->one_core_s);
  json_fput(f, &nulls, "isolated_over_trace", "%.4f", r->isolated_over_trace);
  fprintf(f, "%s},\n", json_nonfinite(&nulls));
  fprintf(f, " \"machine\": {\"mem_gbs\": %g, \"link_gbs\": %g, "
             "\"remote_latency\": %g, \"lock_ns\": %g, \"lock_remote\": %g, "
             "\"signal_us\": %g, \"wake_us\": %g, \"spin_us\": %g, "
             "\"core_gbs\": %.2f, \"here_gbs\": %.2f},\n",
          o->mem_gbs, o->link_gbs, o->remote_latency, o->lock_ns,
          o->lock_remote, o->signal_us, o->wake_us, o->spin_us,
          r->core_bw * 1e-9, r->here_bw * 1e-9);
  fprintf(f, " \"splits\": [");
  for (int i = 0; i < o->nsplits; i++)
    fprintf(f, "%s{\"name\": \"%s\", \"parts\": %d}", i ? ", " : "",
            o->split_name[i], o->split_parts[i]);
  fprintf(f, "],\n \"validation\": [");
  for (int i = 0; i < r->nval; i++) {
    json_nulls row = {0};
    fprintf(f, "%s{\"threads\": %d", i ? ", " : "", r->val[i].threads);
    json_fput(f, &row, "measured_s", "%.6f", r->val[i].measured_s);
    json_fput(f, &row, "predicted_s", "%.6f", r->val[i].predicted_s);
    json_fput(f, &row, "cpu_share", "%.3f", r->val[i].cpu_share);
    fprintf(f, "%s}", json_nonfinite(&row));
  }
  fprintf(f, "],\n");
}

static void print_json_lists(const sim_report *r, FILE *f) {
  sim_path_part k[SIM_PATH_PARTS];
  int nk = kernel_totals(r, k, SIM_PATH_PARTS);
  fprintf(f, " \"kernels\": [");
  for (int i = 0; i < nk; i++)
    fprintf(f, "%s\n  {\"name\": \"%s\", \"tiles\": %d, \"total_s\": %.6f}",
            i ? "," : "", k[i].name, k[i].tasks, k[i].s);
  fprintf(f, "],\n \"critical_path_s\": %.6f,\n \"critical_path\": [", r->path_s);
  for (int i = 0; i < r->npath; i++)
    fprintf(f, "%s\n  {\"name\": \"%s\", \"tasks\": %d, \"s\": %.6f}",
            i ? "," : "", r->path[i].name, r->path[i].tasks, r->path[i].s);
  fprintf(f, "],\n \"run_s\": {\"compile\": %.2f, \"costs\": %.2f, "
             "\"simulation\": %.2f}}\n",
          r->phase_s[0], r->phase_s[1], r->phase_s[2]);
}

static void print_json(const sim_report *r, FILE *f) {
  print_json_head(r, f);
  fprintf(f, " \"scaling\": [");
  for (int i = 0; i < r->nrows; i++) {
    const sim_row *w = &r->rows[i];
    json_nulls row = {0};
    fprintf(f, "%s\n  {\"cores\": %d, \"nodes\": %d, \"placed\": %s",
            i ? "," : "", w->cores, w->nodes, w->placed ? "true" : "false");
    json_fput(f, &row, "step_s", "%.6f", w->r.step_s);
    json_fput(f, &row, "efficiency", "%.4f", w->efficiency);
    json_fput(f, &row, "critical_path_s", "%.6f", w->r.critical_path_s);
    json_fput(f, &row, "remote_bytes", "%.0f", w->r.remote_bytes);
    json_fput(f, &row, "bytes", "%.0f", w->r.bytes);
    json_fput(f, &row, "stall_s", "%.6f", w->r.stall_s);
    fprintf(f, ", \"peak_bytes\": %lld%s}", (long long)w->r.peak_bytes,
            json_nonfinite(&row));
  }
  fprintf(f, "],\n");
  print_json_lists(r, f);
}

void sim_report_print(const sim_report *r, FILE *f) {
  if (r->o->json)
    print_json(r, f);
  else
    print_text(r, f);
}
