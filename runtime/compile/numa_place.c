/* Stage "NUMA placement" (numa_place.h). The rules:
 *
 * - Deal. The tiles of a row-tiled kernel (op_span rows > 0, and the
 *   optimizer's flat tiles over a parameter) go to the nodes in contiguous
 *   blocks in proportion to each node's workers: node k takes the tiles
 *   whose first row lies in [rows * W<k / W, rows * W<=k / W), W being
 *   workers. Other kernels' tiles (column blocks, batched matmul, one-tile
 *   totals) are dealt the same way by tile number; they are not pinned, so
 *   the deal is where they are expected to run, for slices and counting.
 * - Slices. A buffer's first writer decides where its bytes live: when it
 *   writes the buffer by rows or by its own share (op_span), node k's
 *   slice is what the tiles dealt to k write; otherwise the whole buffer
 *   lies on the node of the writer's tile 0 (node 0 when nothing writes
 *   it: inputs). So activations, their gradients, recomputed copies and
 *   the weight-gradient partials follow the tiles that write them, and
 *   gradients and AdamW moments follow the tiles of the reduce and update
 *   kernels, sharded per node.
 * - Copies. Every tile of a linear reads all of its weight: on several
 *   nodes each parameter has a copy on every node, which the update tile of
 *   each range writes after updating it (exec/node_copies.c). Reads are local;
 *   the update writes (nodes - 1) copies of its range across the link.
 * - Pinning. A dealt tile of a row-tiled kernel gets its node as the
 *   affinity of its task when every byte it writes (outside copies) lies
 *   in that node's slice; the scheduler then runs it only there. Tiles of
 *   other kernels, and tiles whose rows straddle a slice boundary, run
 *   anywhere (-1). On one node nothing is pinned.
 * - Remote bytes. For every tile and every buffer it touches (reads or
 *   writes, as op_span says), the bytes outside its node's slice, or
 *   (nodes - 1) times the bytes it writes into copies; "unplaced" counts the
 *   same tiles on the same nodes with every buffer whole on node 0. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/compile/numa_place.h"
#include "runtime/compile/optim_tiles.h"

/* How a tile touches one buffer (see op_span). */
typedef enum touch_mode {
  TOUCH_ROWS,
  TOUCH_TILE,
  TOUCH_SPREAD,
  TOUCH_WHOLE
} touch_mode;

typedef struct tile_use {
  int32_t buf;
  bool writes;
  touch_mode mode;
  int64_t parts; /* the tile touches 1 / parts of its range */
} tile_use;

/* The tiles of one kernel node: their span and the buffers they touch. */
typedef struct knode_tiles {
  op_span span;
  int64_t tiles;
  tile_use use[PLAN_SLOTS];
  int nuse;
} knode_tiles;

typedef struct numa_ctx {
  const remat_graph *g;
  const plan_lowering *low;
  numa_plan *n;
  const sched_placement *pl;
  bool *sliced; /* [nbufs]: its first writer has placed it */
} numa_ctx;

/* a * b / c without overflow (a * b may pass 2^63: bytes times rows). */
static int64_t mul_div(int64_t a, int64_t b, int64_t c) {
  return (int64_t)((__int128)a * b / c);
}

static touch_mode slot_mode(const op_span *s, uint32_t bit) {
  if (s->rows > 0 && (s->row_slots & bit))
    return TOUCH_ROWS;
  if (s->tile_slots & bit)
    return TOUCH_TILE;
  if (s->spread_slots & bit)
    return TOUCH_SPREAD;
  return TOUCH_WHOLE;
}

/* Op kernels as op_span says; the optimizer's check and update by flat
 * tiles of OPTIM_TILE elements over every buffer; the seed and the gate
 * whole (one tile). */
static void describe(const remat_graph *g, const plan_knode *kn,
                     knode_tiles *d) {
  memset(d, 0, sizeof *d);
  d->tiles = kn->tiles;
  if (kn->kernel != NULL) {
    d->span = kn->kernel->span;
    uint32_t used = kn->kernel->reads | kn->kernel->writes;
    for (int s = 0; s < PLAN_SLOTS; s++) {
      if (kn->slot_buf[s] < 0 || ((used >> s) & 1u) == 0)
        continue;
      touch_mode mode = slot_mode(&d->span, 1u << s);
      int64_t parts = mode == TOUCH_ROWS ? d->span.row_parts[s] : 1;
      d->use[d->nuse++] = (tile_use){kn->slot_buf[s],
                                     ((kn->kernel->writes >> s) & 1u) != 0,
                                     mode, parts > 1 ? parts : 1};
    }
    return;
  }
  bool optim = kn->kind == KNODE_CHECK || kn->kind == KNODE_UPDATE;
  if (optim)
    d->span = (op_span){
        .rows = op_numel(&g->tensors[kn->optim.param_tensor]->shape),
        .row_block = OPTIM_TILE,
        .row_tiles = 1};
  knode_use uses[PLAN_MAX_USES];
  int n = knode_uses(kn, uses);
  for (int j = 0; j < n; j++)
    d->use[d->nuse++] = (tile_use){uses[j].buf, uses[j].writes,
                                   optim ? TOUCH_ROWS : TOUCH_WHOLE, 1};
}

/* The first row of tile t (its number when the kernel is not row-tiled),
 * out of *count. */
static int64_t first_row(const knode_tiles *d, int64_t t, int64_t *count) {
  *count = d->span.rows > 0 ? d->span.rows : d->tiles;
  return d->span.rows > 0 ? t / d->span.row_tiles * d->span.row_block : t;
}

/* The node whose share of `count` items, in proportion to its workers,
 * holds item i. */
static int dealt_node(const sched_placement *pl, int64_t count, int64_t i) {
  int k = 0;
  while (k + 1 < pl->nnodes &&
         mul_div(count, pl->node_first[k + 1], pl->nworkers) <= i)
    k++;
  return k;
}

/* Bytes [lo, hi) of a buffer of `bytes` bytes that tile t touches in
 * `mode` (for a spread share: its size, at the tile's own share). */
static void tile_range(const knode_tiles *d, touch_mode mode, int64_t t,
                       int64_t bytes, int64_t *lo, int64_t *hi) {
  if (mode == TOUCH_WHOLE) {
    *lo = 0;
    *hi = bytes;
  } else if (mode == TOUCH_ROWS) {
    int64_t rows = d->span.rows, r0 = t / d->span.row_tiles * d->span.row_block;
    int64_t r1 = r0 + d->span.row_block < rows ? r0 + d->span.row_block : rows;
    *lo = mul_div(bytes, r0, rows);
    *hi = mul_div(bytes, r1, rows);
  } else {
    *lo = mul_div(bytes, t, d->tiles);
    *hi = mul_div(bytes, t + 1, d->tiles);
  }
}

static int64_t slice_lo(const numa_plan *n, int32_t b, int k) {
  return k == 0 ? 0 : n->slice_end[(int64_t)b * n->nnodes + k - 1];
}

static int64_t slice_hi(const numa_plan *n, int32_t b, int k) {
  return n->slice_end[(int64_t)b * n->nnodes + k];
}

/* Buffer b whole on node `node`. */
static void place_whole(numa_plan *n, int32_t b, int64_t bytes, int node) {
  for (int k = 0; k < n->nnodes; k++)
    n->slice_end[(int64_t)b * n->nnodes + k] = k < node ? 0 : bytes;
}

/* The slices of the buffers whose first writer is node i: what each node's
 * tiles write, or the whole buffer on the node of tile 0. */
static void define_slices(numa_ctx *c, int32_t i, const knode_tiles *d,
                          int64_t base) {
  numa_plan *n = c->n;
  for (int u = 0; u < d->nuse; u++) {
    int32_t b = d->use[u].buf;
    const plan_buffer *buf = &c->low->bufs[b];
    if (!d->use[u].writes || buf->first_writer != i || c->sliced[b] ||
        n->replicated[b])
      continue;
    c->sliced[b] = true;
    touch_mode mode = d->use[u].mode;
    if (mode != TOUCH_ROWS && mode != TOUCH_TILE) {
      place_whole(n, b, buf->bytes, n->tile_node[base]);
      continue;
    }
    int64_t *end = n->slice_end + (int64_t)b * n->nnodes;
    memset(end, 0, (size_t)n->nnodes * sizeof *end);
    for (int64_t t = 0; t < d->tiles; t++) {
      int64_t lo, hi;
      tile_range(d, mode, t, buf->bytes, &lo, &hi);
      int k = n->tile_node[base + t];
      end[k] = hi > end[k] ? hi : end[k];
    }
    for (int k = 1; k < n->nnodes; k++)
      end[k] = end[k] > end[k - 1] ? end[k] : end[k - 1];
    end[n->nnodes - 1] = buf->bytes;
  }
}

/* Whether every byte tile t writes (outside copies) lies on node k. */
static bool owns_writes(const numa_ctx *c, const knode_tiles *d, int64_t t,
                        int k) {
  for (int u = 0; u < d->nuse; u++) {
    int32_t b = d->use[u].buf;
    if (!d->use[u].writes || c->n->replicated[b])
      continue;
    int64_t lo = 0, hi = c->low->bufs[b].bytes;
    if (d->use[u].mode != TOUCH_SPREAD)
      tile_range(d, d->use[u].mode, t, hi, &lo, &hi);
    if (lo < slice_lo(c->n, b, k) || hi > slice_hi(c->n, b, k))
      return false;
  }
  return true;
}

/* Bytes of [lo, hi) of buffer b outside node k's slice. */
static int64_t outside(const numa_plan *n, int32_t b, int k, int64_t lo,
                       int64_t hi) {
  int64_t a = slice_lo(n, b, k), z = slice_hi(n, b, k);
  int64_t in = (hi < z ? hi : z) - (lo > a ? lo : a);
  return hi - lo - (in > 0 ? in : 0);
}

/* Adds tile t's remote bytes, placed and unplaced: of a range split in
 * `parts`, the tile touches one part (of the same rows). */
static void count_remote(numa_ctx *c, const knode_tiles *d, int64_t t,
                         int k) {
  numa_plan *n = c->n;
  for (int u = 0; u < d->nuse; u++) {
    const tile_use *use = &d->use[u];
    int64_t bytes = c->low->bufs[use->buf].bytes, lo, hi, remote;
    tile_range(d, use->mode, t, bytes, &lo, &hi);
    if (n->replicated[use->buf])
      remote = use->writes ? (n->nnodes - 1) * (hi - lo) : 0;
    else if (use->mode == TOUCH_SPREAD)
      remote = bytes > 0 ? mul_div(hi - lo, outside(n, use->buf, k, 0, bytes),
                                   bytes)
                         : 0;
    else
      remote = outside(n, use->buf, k, lo, hi);
    n->remote_bytes += remote / use->parts;
    n->remote_bytes_unplaced += k != 0 ? (hi - lo) / use->parts : 0;
  }
}

static void place_knode(numa_ctx *c, int32_t i) {
  numa_plan *n = c->n;
  knode_tiles d;
  describe(c->g, &c->low->knodes[i], &d);
  int64_t base = n->first_tile[i];
  for (int64_t t = 0; t < d.tiles; t++) {
    int64_t count, row = first_row(&d, t, &count);
    n->tile_node[base + t] = dealt_node(c->pl, count, row);
  }
  define_slices(c, i, &d, base);
  for (int64_t t = 0; t < d.tiles; t++) {
    int k = n->tile_node[base + t];
    bool pin = n->nnodes > 1 && d.span.rows > 0 && owns_writes(c, &d, t, k);
    n->affinity[base + t] = pin ? k : -1;
    count_remote(c, &d, t, k);
  }
}

static remat_status alloc_plan(const plan_lowering *low, numa_plan *n,
                               int nnodes) {
  n->nnodes = nnodes;
  int32_t nk = low->nknodes, nb = low->nbufs;
  n->first_tile = remat__malloc(((size_t)nk + 1) * sizeof *n->first_tile);
  if (n->first_tile == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t i = 0; i < nk; i++) {
    n->first_tile[i] = n->ntiles;
    n->ntiles += low->knodes[i].tiles;
  }
  n->tile_node = remat__malloc(((size_t)n->ntiles + 1) * sizeof *n->tile_node);
  n->affinity = remat__malloc(((size_t)n->ntiles + 1) * sizeof *n->affinity);
  n->slice_end = remat__malloc(((size_t)nb * (size_t)nnodes + 1) *
                               sizeof *n->slice_end);
  n->replicated = remat__calloc((size_t)nb + 1, sizeof *n->replicated);
  n->home = remat__calloc((size_t)nb + 1, sizeof *n->home);
  if (n->tile_node == NULL || n->affinity == NULL || n->slice_end == NULL ||
      n->replicated == NULL || n->home == NULL)
    return REMAT_ERR_OUT_OF_MEMORY;
  for (int32_t b = 0; b < nb; b++) {
    const plan_buffer *buf = &low->bufs[b];
    place_whole(n, b, buf->bytes, 0);
    n->replicated[b] = plan_buffer_replicated(buf, nnodes);
    if (n->replicated[b])
      n->copy_bytes += (nnodes - 1) * mem_block_bytes(buf->bytes);
  }
  return REMAT_OK;
}

/* The layout of `bytes` bytes sliced at `ends`: an earlier one when they
 * are the same, else a new one; -1 when out of memory. */
static int layout_of(numa_plan *n, int64_t bytes, const int64_t *ends) {
  size_t row = (size_t)n->nnodes * sizeof *ends;
  for (int j = 0; j < n->nlayouts; j++)
    if (n->layout_bytes[j] == bytes &&
        memcmp(n->layout_ends + (size_t)j * (size_t)n->nnodes, ends, row) == 0)
      return j;
  int64_t *b = remat__realloc(n->layout_bytes,
                              ((size_t)n->nlayouts + 1) * sizeof *b);
  if (b != NULL)
    n->layout_bytes = b;
  int64_t *e = remat__realloc(n->layout_ends,
                              ((size_t)n->nlayouts + 1) * row);
  if (e != NULL)
    n->layout_ends = e;
  if (b == NULL || e == NULL)
    return -1;
  n->layout_bytes[n->nlayouts] = bytes;
  memcpy(n->layout_ends + (size_t)n->nlayouts * (size_t)n->nnodes, ends, row);
  return n->nlayouts++;
}

/* Each buffer's arena home: the node of its only non-empty slice, else its
 * slice layout. */
static remat_status set_homes(const plan_lowering *low, numa_plan *n) {
  for (int32_t b = 0; b < low->nbufs; b++) {
    int nonempty = 0, node = 0;
    for (int k = 0; k < n->nnodes; k++)
      if (slice_hi(n, b, k) > slice_lo(n, b, k)) {
        nonempty++;
        node = k;
      }
    if (nonempty <= 1) {
      n->home[b] = node;
      continue;
    }
    int j = layout_of(n, low->bufs[b].bytes,
                      n->slice_end + (int64_t)b * n->nnodes);
    if (j < 0)
      return REMAT_ERR_OUT_OF_MEMORY;
    n->home[b] = n->nnodes + j;
  }
  return REMAT_OK;
}

remat_status numa_place(const remat_graph *g, const plan_lowering *low,
                        const sched_placement *pl, numa_plan *out) {
  memset(out, 0, sizeof *out);
  numa_ctx c = {g, low, out, pl, NULL};
  remat_status s = alloc_plan(low, out, pl->nnodes < 1 ? 1 : pl->nnodes);
  if (s == REMAT_OK) {
    c.sliced = remat__calloc((size_t)low->nbufs + 1, sizeof *c.sliced);
    s = c.sliced != NULL ? REMAT_OK : REMAT_ERR_OUT_OF_MEMORY;
  }
  for (int32_t i = 0; s == REMAT_OK && i < low->nknodes; i++)
    place_knode(&c, i);
  free(c.sliced);
  if (s == REMAT_OK)
    s = set_homes(low, out);
  if (s != REMAT_OK) {
    numa_plan_free(out);
    return remat__fail(s, "remat_compile: out of memory placing the step on "
                          "NUMA nodes");
  }
  return REMAT_OK;
}

void numa_plan_free(numa_plan *n) {
  free(n->first_tile);
  free(n->tile_node);
  free(n->affinity);
  free(n->slice_end);
  free(n->replicated);
  free(n->home);
  free(n->layout_bytes);
  free(n->layout_ends);
  memset(n, 0, sizeof *n);
}
