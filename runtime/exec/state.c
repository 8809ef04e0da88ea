/* The step state's lifetime (step_state.h): the arena laid out as the
 * compiled step says (its slice layouts, the blocks the first step
 * reserves), the buffers that live with the graph (parameters, their
 * gradients, optimizer moments, inputs, kept tensors) with parameters
 * initialized from the graph's seed, the per-node copies of parameters,
 * the per-worker scratchpads and the per-tile gradient sums of squares;
 * and freeing all of it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/bf16.h"
#include "runtime/exec/optim.h"
#include "runtime/exec/step_costs.h"
#include "runtime/exec/step_state.h"

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uniform01(uint64_t *state) {
  return ((double)(splitmix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Fills parameter t's value buffer x from the graph's seed: f32 values,
 * rounded to bf16 in chunks for a parameter stored in bf16 (a frozen one),
 * so that both storages draw the same values. */
static void init_param(const remat_graph *g, const remat_tensor *t, void *x) {
  enum { CHUNK = 1024 };
  float chunk[CHUNK];
  int64_t n = op_numel(&t->shape);
  uint64_t state = g->seed * 0x100000001B3ull + (uint64_t)t->id * 0x9E37ull + 1;
  for (int64_t lo = 0; lo < n; lo += CHUNK) {
    int64_t len = n - lo < CHUNK ? n - lo : CHUNK;
    float *dst = t->store == OP_BF16 ? chunk : (float *)x + lo;
    for (int64_t i = 0; i < len; i++) {
      switch (t->init) {
      case REMAT_INIT_ZEROS: dst[i] = 0.0f; break;
      case REMAT_INIT_ONES: dst[i] = 1.0f; break;
      default: {
        double u1 = uniform01(&state), u2 = uniform01(&state);
        dst[i] = (float)(t->init_scale * sqrt(-2.0 * log(u1)) *
                         cos(6.283185307179586 * u2));
      }
      }
    }
    if (t->store == OP_BF16)
      bf16_from_f32_row((uint16_t *)x + lo, chunk, len);
  }
}

/* The arena with a home per node of the pool's placement, then c's slice
 * layouts, in the order that numbers them (numa_plan.home). */
static remat_status make_arena(const compiled_step *c, step_state *s) {
  const remat_runtime *rt = c->g->rt;
  remat_status st = mem_arena_init(&s->arena, rt->topo,
                                   sched_pool_placement(rt->pool));
  if (st != REMAT_OK)
    return st;
  const numa_plan *n = &c->numa;
  for (int j = 0; j < n->nlayouts; j++) {
    int home = mem_arena_layout(&s->arena, (size_t)n->layout_bytes[j],
                                n->layout_ends + (size_t)j * (size_t)n->nnodes);
    if (home < 0)
      return REMAT_ERR_OUT_OF_MEMORY;
    if (home != n->nnodes + j)
      return remat__fail(REMAT_ERR_STATE,
                         "remat_compile: internal: slice layout %d became arena home "
                         "%d, expected %d",
                         j, home, n->nnodes + j);
  }
  return REMAT_OK;
}

static remat_status alloc_arrays(const compiled_step *c, step_state *s) {
  size_t nb = (size_t)c->low.nbufs + 1, nw = (size_t)c->nworkers;
  s->data = remat__calloc(nb, sizeof *s->data);
  s->users_left = remat__calloc(nb, sizeof *s->users_left);
  s->bufs = remat__calloc((size_t)c->low.nknodes + 1, sizeof *s->bufs);
  s->workers = remat__calloc(nw, sizeof *s->workers);
  s->worker_recompute_flops =
      remat__calloc(nw * 8, sizeof *s->worker_recompute_flops);
  s->check_sumsq =
      remat__calloc((size_t)c->low.ncheck_tiles + 1, sizeof *s->check_sumsq);
  s->tile_max = remat__calloc(((size_t)c->low.ncheck_tiles + 1) * OPTIM_NMAX,
                              sizeof *s->tile_max);
  if (s->data == NULL || s->users_left == NULL || s->bufs == NULL ||
      s->workers == NULL || s->worker_recompute_flops == NULL ||
      s->check_sumsq == NULL || s->tile_max == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  return REMAT_OK;
}

static remat_status alloc_persistent(const compiled_step *c, step_state *s) {
  const plan_lowering *l = &c->low;
  for (int32_t b = 0; b < l->nbufs; b++) {
    const plan_buffer *buf = &l->bufs[b];
    if (!buf->persistent)
      continue;
    s->data[b] = mem_alloc(&s->arena, (size_t)buf->bytes, buf->cat,
                           c->numa.home[b], false);
    if (s->data[b] == NULL)
      return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                         "remat_compile: out of memory allocating %lld bytes",
                         (long long)buf->bytes);
    memset(s->data[b], 0, (size_t)buf->bytes);
    if (buf->tensor >= 0 && buf->cat == REMAT_MEM_PARAMS &&
        l->value_buf[buf->tensor] == b) /* not a bf16 copy */
      init_param(c->g, c->g->tensors[buf->tensor], s->data[b]);
  }
  return REMAT_OK;
}

/* The copies of replicated buffers on the other nodes, filled from their
 * data. */
static remat_status alloc_copies(const compiled_step *c, step_state *s) {
  const numa_plan *n = &c->numa;
  if (n->copy_bytes == 0)
    return REMAT_OK;
  s->copies = remat__calloc((size_t)c->low.nbufs * (size_t)n->nnodes,
                            sizeof *s->copies);
  if (s->copies == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t b = 0; b < c->low.nbufs; b++) {
    int64_t bytes = c->low.bufs[b].bytes;
    if (!n->replicated[b])
      continue;
    float **copy = s->copies + (int64_t)b * n->nnodes;
    copy[0] = s->data[b];
    for (int k = 1; k < n->nnodes; k++) {
      copy[k] = mem_alloc(&s->arena, (size_t)bytes, REMAT_MEM_PARAMS, k, false);
      if (copy[k] == NULL)
        return remat__fail(REMAT_ERR_OUT_OF_MEMORY,
                           "remat_compile: out of memory copying %lld bytes "
                           "of parameters to NUMA node %d",
                           (long long)bytes, k);
      memcpy(copy[k], s->data[b], (size_t)bytes);
    }
  }
  return REMAT_OK;
}

/* One scratchpad per worker, as large as any op's. */
static remat_status alloc_scratch(const compiled_step *c, step_state *s) {
  const remat_graph *g = c->g;
  size_t max_scratch = 0;
  for (int32_t o = 0; o < g->nops; o++)
    if (g->ops[o].inst.scratch_bytes > max_scratch)
      max_scratch = g->ops[o].inst.scratch_bytes;
  size_t per_worker = (size_t)remat__round64((int64_t)max_scratch);
  if (per_worker > 0) {
    s->scratch = mem_alloc(&s->arena, per_worker * (size_t)c->nworkers,
                           REMAT_MEM_WORKSPACE, 0, false);
    if (s->scratch == NULL)
      return REMAT_ERR_OUT_OF_MEMORY;
  }
  for (int w = 0; w < c->nworkers; w++) {
    s->workers[w].stream = g->rt->workers[w].stream;
    s->workers[w].scratch =
        s->scratch == NULL ? NULL : (char *)s->scratch + (size_t)w * per_worker;
    s->workers[w].scratch_bytes = per_worker;
  }
  return REMAT_OK;
}

/* The blocks the first step reserves (memplan.h), on top of the
 * persistent ones. */
static remat_status expect_blocks(const compiled_step *c, step_state *s) {
  remat_status st = REMAT_OK;
  for (int i = 0; st == REMAT_OK && i < c->predicted.nexpect; i++) {
    const memplan_blocks *e = &c->predicted.expect[i];
    st = mem_expect(&s->arena, (size_t)e->bytes, e->count, e->home);
  }
  return st;
}

remat_status step_state_create(const compiled_step *c, step_state *out) {
  memset(out, 0, sizeof *out);
  out->lr = c->opt.lr;
  out->grad_scale = 1.0f;
  out->params_written = true; /* bf16 copies: made before the first run */
  remat_status s = make_arena(c, out);
  if (s == REMAT_OK)
    s = alloc_arrays(c, out);
  if (s == REMAT_OK)
    s = alloc_persistent(c, out);
  if (s == REMAT_OK)
    s = alloc_copies(c, out);
  if (s == REMAT_OK)
    s = alloc_scratch(c, out);
  if (s == REMAT_OK)
    s = expect_blocks(c, out);
  if (s == REMAT_OK)
    s = step_costs_create(c, out);
  if (s != REMAT_OK)
    step_state_free(c, out);
  return s;
}

void step_state_free(const compiled_step *c, step_state *s) {
  const numa_plan *n = &c->numa;
  int32_t nb = s->data != NULL ? c->low.nbufs : 0;
  for (int32_t b = 0; s->copies != NULL && b < nb; b++)
    for (int k = 1; n->replicated[b] && k < n->nnodes; k++)
      mem_free(&s->arena, s->copies[(int64_t)b * n->nnodes + k],
               (size_t)c->low.bufs[b].bytes, REMAT_MEM_PARAMS, k, false);
  for (int32_t b = 0; b < nb; b++) {
    const plan_buffer *buf = &c->low.bufs[b];
    mem_free(&s->arena, s->data[b], (size_t)buf->bytes, buf->cat,
             n->home[b], !buf->persistent);
  }
  for (int32_t t = 0; s->accum != NULL && t < c->g->ntensors; t++)
    if (s->accum[t] != NULL) {
      int32_t grad = c->low.grad_buf[t];
      mem_free(&s->arena, s->accum[t], (size_t)c->low.bufs[grad].bytes,
               REMAT_MEM_GRADS, n->home[grad], false);
    }
  if (s->scratch != NULL)
    mem_free(&s->arena, s->scratch,
             s->workers[0].scratch_bytes * (size_t)c->nworkers,
             REMAT_MEM_WORKSPACE, 0, false);
  step_trace_free(&s->trace);
  free(s->cost_records);
  mem_arena_destroy(&s->arena);
  free(s->accum);
  free(s->copies);
  free(s->data);
  free(s->users_left);
  free(s->bufs);
  free(s->workers);
  free(s->worker_recompute_flops);
  free(s->check_sumsq);
  free(s->tile_max);
  memset(s, 0, sizeof *s);
}

void step_state_params_loaded(step_state *s) {
  s->accum_count = 0;
  s->params_written = true;
}
