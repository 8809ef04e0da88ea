/* Bytes and rows of each buffer a task touches (sim_footprint.h).
 *
 * A tile of a row-tiled kernel (forward, input gradients, elementwise ops,
 * layer norm, softmax, attention per (batch, head), the loss rows) touches
 * the same share of each activation it reads or writes: tile t of T covers
 * rows [t/T, (t+1)/T), and moves bytes/T of each, times the share of
 * columns it reads (attention reads q and k, or v, of the packed qkv rows:
 * 2/3 or 1/3). Parameters and scalars it reads are SHARED: read whole by
 * every tile, which the placement model charges once per node (they stay
 * in each node's cache after the first tile). A gradient it accumulates
 * into moves twice (read and write).
 *
 * A tile of a reducing kernel reads a block of columns of every row:
 * linear.dw's tile (256 rows of dW by up to 256 of its columns, as
 * ops/linear.c tiles it) reads 256 columns of dY and the matching columns
 * of X; the bias, layer-norm parameter, embedding and loss reductions read
 * their column block (bytes / tiles), embed.dwte every token. What it
 * writes (its block of a parameter gradient) is bytes / tiles.
 *
 * Optimizer tiles move their element range of the parameter, gradient
 * and moments (the update reads and writes parameter and moments); start
 * tasks write the buffers they zero-fill. */
#include <string.h>

#include "benchmarks/sim/sim_footprint.h"
#include "runtime/exec/optim.h"

#define DW_ROWS 256     /* OP_DW_ROWS of ops/linear.c */
#define DW_COLS 256     /* OP_DW_COLS of ops/linear.c */
#define TINY_BYTES 4096 /* a buffer this small is read whole (scalars) */

static const char *const reducing[] = {
    "linear.dw",          "linear.db",  "bias_add.db", "layernorm.dparams",
    "embed.dwte",         "embed.dwpe", "matmul.db",   "cross_entropy.mean",
    "mean.total",         "sum.total"};

static bool name_is(const plan_knode *kn, const char *name) {
  return kn->kernel != NULL && strcmp(kn->kernel->name, name) == 0;
}

bool sim_reduces_rows(const sim_step *s, int32_t task) {
  const plan_knode *kn = sim_knode(s, task);
  for (size_t i = 0; i < sizeof reducing / sizeof *reducing; i++)
    if (name_is(kn, reducing[i]))
      return true;
  return false;
}

/* Share of the columns of a row that attention tiles read of qkv. */
static double column_share(const plan_knode *kn, uint32_t slot) {
  bool scores_bwd =
      name_is(kn, "attn_scores.dq") || name_is(kn, "attn_scores.dk");
  if ((name_is(kn, "attn_scores.fwd") || scores_bwd) &&
      slot == OP_SLOT_IN(0))
    return 2.0 / 3.0; /* q and k */
  if (scores_bwd && slot == OP_SLOT_DIN(0))
    return 1.0 / 3.0; /* dq or dk */
  if ((name_is(kn, "attn_values.fwd") || name_is(kn, "attn_values.dp") ||
       name_is(kn, "attn_values.dv")) &&
      (slot == OP_SLOT_IN(1) || slot == OP_SLOT_DIN(1)))
    return 1.0 / 3.0;
  return 1.0;
}

/* Tiles that read the same block of an operand of a reducing kernel: for
 * linear.dw, the tiles of one row block of dW share a block of dY and those
 * of one column block share a block of X. */
static double reduce_divisor(const plan_knode *kn, uint32_t slot) {
  double tiles = (double)kn->tiles;
  if (name_is(kn, "embed.dwte") && slot == OP_SLOT_IN(0))
    return 1.0;
  if (!name_is(kn, "linear.dw"))
    return tiles;
  int64_t M = kn->inst->desc.in[1].dim[0], K = kn->inst->desc.in[1].dim[1];
  int64_t rows = (M + DW_ROWS - 1) / DW_ROWS;
  int64_t cols_each = K <= 2 * DW_COLS ? K : DW_COLS;
  int64_t cols = (K + cols_each - 1) / cols_each;
  if (rows * cols != kn->tiles)
    return tiles;
  return slot == OP_SLOT_DOUT ? (double)rows : (double)cols;
}

static bool is_param(const plan_buffer *b) {
  return b->cat == REMAT_MEM_PARAMS || b->cat == REMAT_MEM_GRADS ||
         b->cat == REMAT_MEM_OPTIMIZER;
}

static sim_access kernel_access(const sim_step *s, const plan_knode *kn,
                                int64_t tile, uint32_t slot, bool reduces) {
  int32_t b = kn->slot_buf[plan_slot(slot)];
  const plan_buffer *buf = &s->c->low.bufs[b];
  double T = (double)kn->tiles, bytes = (double)buf->bytes;
  bool writes = (kn->kernel->writes & slot) != 0;
  double twice = writes && buf->zero_fill ? 2.0 : 1.0;
  sim_access a = {b, twice * bytes / T, SIM_ROWS_TILE, (double)tile / T,
                  (double)(tile + 1) / T, is_param(buf)};
  if (reduces && !a.param) {
    a.rows = SIM_ROWS_ALL;
    a.bytes = bytes / reduce_divisor(kn, slot);
  } else if (!reduces && (a.param || buf->bytes <= TINY_BYTES) && !writes) {
    a.rows = SIM_ROWS_SHARED;
  } else {
    a.bytes *= column_share(kn, slot);
  }
  if (a.rows != SIM_ROWS_TILE) {
    a.lo = 0.0;
    a.hi = 1.0;
  }
  return a;
}

static int kernel_footprint(const sim_step *s, int32_t task, sim_access *out) {
  const plan_knode *kn = sim_knode(s, task);
  bool reduces = sim_reduces_rows(s, task);
  uint32_t slots = kn->kernel->reads | kn->kernel->writes;
  int n = 0;
  for (int i = 0; i < PLAN_SLOTS; i++) {
    uint32_t slot = 1u << i;
    if ((slots & slot) && kn->slot_buf[i] >= 0)
      out[n++] = kernel_access(s, kn, s->tile[task], slot, reduces);
  }
  return n;
}

/* An optimizer tile: its element range of each buffer. */
static int optim_footprint(const sim_step *s, int32_t task, sim_access *out) {
  const plan_knode *kn = sim_knode(s, task);
  int64_t numel = op_numel(&s->c->g->tensors[kn->optim.param_tensor]->shape);
  int64_t lo, hi;
  optim_tile_range(numel, s->tile[task], &lo, &hi);
  double flo = (double)lo / (double)numel, fhi = (double)hi / (double)numel;
  double bytes = 4.0 * (double)(hi - lo);
  int32_t bufs[4] = {kn->optim.grad, kn->optim.param, kn->optim.adam_m,
                     kn->optim.adam_v};
  int nbufs = kn->kind == KNODE_CHECK ? 1 : 4, n = 0;
  for (int i = 0; i < nbufs; i++)
    if (bufs[i] >= 0)
      out[n++] = (sim_access){bufs[i], i == 0 ? bytes : 2.0 * bytes,
                              SIM_ROWS_TILE, flo, fhi, true};
  return n;
}

static int start_footprint(const sim_step *s, int32_t task, sim_access *out) {
  const plan_knode *kn = sim_knode(s, task);
  int n = 0;
  for (int i = 0; i < kn->ninit; i++) {
    const plan_buffer *b = &s->c->low.bufs[kn->init[i]];
    if (b->zero_fill)
      out[n++] = (sim_access){kn->init[i], (double)b->bytes, SIM_ROWS_ALL,
                              0.0, 1.0, is_param(b)};
  }
  return n;
}

int sim_footprint(const sim_step *s, int32_t task, sim_access *out) {
  const plan_knode *kn = sim_knode(s, task);
  if (s->tile[task] == SIM_START)
    return start_footprint(s, task, out);
  if (s->tile[task] == SIM_DONE)
    return 0;
  if (kn->kernel != NULL)
    return kernel_footprint(s, task, out);
  if (kn->kind == KNODE_CHECK || kn->kind == KNODE_UPDATE)
    return optim_footprint(s, task, out);
  return 0;
}
