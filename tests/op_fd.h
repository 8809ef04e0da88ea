/* The finite-difference harness shared by the op tests (test_ops,
 * test_ops_llama): an op planned alone on one worker, its forward against
 * a double precision reference and every input gradient against central
 * differences of L = sum(out * seed), in overwrite, accumulate and skipped
 * (NULL din) modes. Include after cmocka.h and op_fixture.h; define
 * OP_FD_FWD_TOL first for a forward tolerance other than 1e-4 of the
 * output's largest magnitude. */
#ifndef REMAT_TESTS_OP_FD_H
#define REMAT_TESTS_OP_FD_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "op_fixture.h"
#include "ops/op.h"

#ifndef OP_FD_FWD_TOL
#define OP_FD_FWD_TOL 1e-4
#endif

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  assert_non_null(p);
  return p;
}

static int64_t last(const op_shape *s) { return s->dim[s->ndim - 1]; }
static int64_t rows_of(const op_shape *s) { return op_numel(s) / last(s); }

typedef void (*ref_fn)(const op_desc *d, double *const in[], double *out);

typedef struct op_case {
  op_desc desc;
  ref_fn ref;
  double lo[OP_MAX_IN], hi[OP_MAX_IN]; /* int inputs: ids in [lo, hi) */
  bool causal_mask; /* input 0: -inf above the diagonal of the last 2 dims */
  bool partial_din; /* a din is written only in part (attention) */
  int samples;      /* finite-difference samples per input */
} op_case;

typedef struct op_run {
  op_instance inst;
  op_worker worker;
  op_bufs bufs;
  double *x[OP_MAX_IN];
  int64_t n[OP_MAX_IN], nout;
} op_run;

/* Runs every tile of kernels k[0..nk) in order (or each kernel's tiles
 * reversed). */
static void run_kernels(op_instance *inst, op_bufs *b, op_worker *w,
                        const op_kernel *k, int nk, bool reverse) {
  for (int i = 0; i < nk; i++) {
    assert_non_null(k[i].name);
    assert_true(k[i].tiles >= 1);
    for (int64_t t = 0; t < k[i].tiles; t++) {
      int64_t tile = reverse ? k[i].tiles - 1 - t : t;
      int rs = k[i].fn(inst, b, tile, w);
      if (rs != REMAT_OK)
        fail_msg("%s tile %lld: status %d", k[i].name, (long long)tile, rs);
    }
  }
}

static bool is_int(const op_desc *d, int i) { return d->in_dtype[i] == OP_I32; }

/* Plans the case, draws inputs (double and the float/int32 copies the
 * kernels read), allocates out, aux, ws and an exact-size scratch. */
static void run_setup(op_run *r, const op_case *c) {
  memset(r, 0, sizeof *r);
  char err[OP_ERRMSG_MAX];
  op_desc d = c->desc;
  assert_int_equal(op_infer(&d, err), REMAT_OK);
  remat_status rs = op_plan(&d, engine, &r->inst, err);
  if (rs != REMAT_OK) fail_msg("%s", err);
  r->nout = op_numel(&r->inst.desc.out);
  for (int i = 0; i < d.nin; i++) {
    r->n[i] = op_numel(&d.in[i]);
    r->x[i] = xcalloc(r->n[i], sizeof(double));
    r->bufs.in[i] = xcalloc(r->n[i], sizeof(float));
    int64_t C = last(&d.in[i]);
    for (int64_t j = 0; j < r->n[i]; j++) {
      if (is_int(&d, i)) {
        r->x[i][j] = floor(uniform(c->lo[i], c->hi[i]));
        ((int32_t *)r->bufs.in[i])[j] = (int32_t)r->x[i][j];
        continue;
      }
      double v = (float)uniform(c->lo[i], c->hi[i]);
      if (i == 0 && c->causal_mask && j % C > (j / C) % C) v = -INFINITY;
      r->x[i][j] = v;
      r->bufs.in[i][j] = (float)v;
    }
  }
  r->bufs.out = xcalloc(r->nout, sizeof(float));
  for (int k = 0; k < r->inst.naux; k++)
    r->bufs.aux[k] = xcalloc(r->inst.aux_bytes[k], 1);
  for (int k = 0; k < r->inst.nws; k++)
    r->bufs.ws[k] = xcalloc(r->inst.ws_bytes[k], 1);
  r->worker.stream = stream;
  r->worker.scratch_bytes = r->inst.scratch_bytes;
  r->worker.scratch = r->inst.scratch_bytes ? malloc(r->inst.scratch_bytes) : NULL;
  r->bufs.dout = xcalloc(r->nout, sizeof(float));
}

static void run_free(op_run *r) {
  for (int i = 0; i < r->inst.desc.nin; i++) {
    free(r->x[i]);
    free(r->bufs.in[i]);
  }
  free(r->bufs.out);
  free(r->bufs.dout);
  for (int k = 0; k < OP_MAX_AUX; k++) free(r->bufs.aux[k]);
  for (int k = 0; k < OP_MAX_WS; k++) free(r->bufs.ws[k]);
  free(r->worker.scratch);
  op_instance_release(&r->inst);
}

/* L = sum over the finite outputs of out * seed, in double. */
static double loss_of(const op_case *c, op_run *r, double *out,
                      const double *seed) {
  c->ref(&r->inst.desc, r->x, out);
  double L = 0;
  for (int64_t j = 0; j < r->nout; j++)
    if (isfinite(out[j])) L += out[j] * seed[j];
  return L;
}

static void check_forward(const op_case *c, op_run *r, const double *ref) {
  double scale = 1e-30;
  for (int64_t j = 0; j < r->nout; j++)
    if (isfinite(ref[j])) scale = fmax(scale, fabs(ref[j]));
  for (int64_t j = 0; j < r->nout; j++) {
    double got = r->bufs.out[j];
    if (!isfinite(ref[j])) {
      if (got != ref[j])
        fail_msg("%s: out[%lld] = %g, want %g", op_name(c->desc.type),
                 (long long)j, got, ref[j]);
    } else if (fabs(got - ref[j]) > OP_FD_FWD_TOL * scale) {
      fail_msg("%s: out[%lld] = %.7g, reference %.7g", op_name(c->desc.type),
               (long long)j, got, ref[j]);
    }
  }
}

enum { MODE_OVERWRITE, MODE_ACCUMULATE, MODE_SKIP, MODE_COUNT };

/* Runs the backward in one mode and compares sampled dins with fd. */
static void check_backward(const op_case *c, op_run *r, int mode,
                           int64_t *const idx[], double *const fd[]) {
  const op_desc *d = &r->inst.desc;
  float *init[OP_MAX_IN] = {0};
  int ngrad = 0;
  for (int i = 0; i < d->nin; i++) {
    r->bufs.din[i] = NULL;
    if (is_int(d, i)) continue;
    if (mode == MODE_SKIP && ngrad++ % 2 == 0) continue;
    r->bufs.din[i] = xcalloc(r->n[i], sizeof(float));
    init[i] = xcalloc(r->n[i], sizeof(float));
    r->bufs.din_accumulate[i] = mode == MODE_ACCUMULATE;
    for (int64_t j = 0; j < r->n[i]; j++)
      init[i][j] = mode == MODE_ACCUMULATE ? (float)uniform(-1, 1)
                   : c->partial_din        ? 0.0f
                                           : NAN;
    memcpy(r->bufs.din[i], init[i], r->n[i] * sizeof(float));
  }
  run_kernels(&r->inst, &r->bufs, &r->worker, r->inst.bwd, r->inst.nbwd,
              false);
  for (int i = 0; i < d->nin; i++) {
    if (!r->bufs.din[i]) continue;
    for (int64_t j = 0; j < r->n[i]; j++)
      if (!isfinite(r->bufs.din[i][j]))
        fail_msg("%s mode %d: din[%d][%lld] = %g", op_name(d->type), mode, i,
                 (long long)j, r->bufs.din[i][j]);
    double scale = 1e-6;
    for (int s = 0; s < c->samples; s++) scale = fmax(scale, fabs(fd[i][s]));
    for (int s = 0; s < c->samples; s++) {
      int64_t j = idx[i][s];
      if (!isfinite(r->x[i][j])) continue;
      double base = mode == MODE_ACCUMULATE ? init[i][j] : 0.0;
      double got = (double)r->bufs.din[i][j] - base;
      /* adding onto init rounds at init's float precision */
      if (fabs(got - fd[i][s]) > 2e-3 * scale + 2.4e-7 * fabs(base))
        fail_msg("%s mode %d: din[%d][%lld] = %.7g, finite difference %.7g",
                 op_name(d->type), mode, i, (long long)j, got, fd[i][s]);
    }
    free(r->bufs.din[i]);
    free(init[i]);
    r->bufs.din[i] = NULL;
  }
}

/* Samples: the last and the first element, then random ones; for a slice,
 * every third sample lands in the sliced columns of some row. */
static int64_t sample_index(op_run *r, int i, int s) {
  if (s == 0) return r->n[i] - 1;
  if (s == 1) return 0;
  const op_desc *d = &r->inst.desc;
  if (d->type == OP_SLICE && s % 3 == 0) {
    int64_t C = last(&d->in[0]), row = (int64_t)uniform(0, r->n[i] / C);
    return row * C + d->attrs.start + (int64_t)uniform(0, d->attrs.len);
  }
  return (int64_t)uniform(0, (double)r->n[i]);
}

static void check_case(const op_case *c) {
  op_run r;
  run_setup(&r, c);
  double *ref = xcalloc(r.nout, sizeof(double));
  double *seed = xcalloc(r.nout, sizeof(double));
  run_kernels(&r.inst, &r.bufs, &r.worker, r.inst.fwd, r.inst.nfwd, false);
  c->ref(&r.inst.desc, r.x, ref);
  check_forward(c, &r, ref);
  for (int64_t j = 0; j < r.nout; j++) {
    seed[j] = uniform(-1, 1);
    r.bufs.dout[j] = (float)seed[j];
  }
  int64_t *idx[OP_MAX_IN] = {0};
  double *fd[OP_MAX_IN] = {0};
  for (int i = 0; i < c->desc.nin; i++) {
    if (is_int(&c->desc, i)) continue;
    idx[i] = xcalloc(c->samples, sizeof(int64_t));
    fd[i] = xcalloc(c->samples, sizeof(double));
    for (int s = 0; s < c->samples; s++) {
      int64_t j = idx[i][s] = sample_index(&r, i, s);
      double x0 = r.x[i][j], h = 1e-5;
      if (!isfinite(x0)) continue;
      r.x[i][j] = x0 + h;
      double lp = loss_of(c, &r, ref, seed);
      r.x[i][j] = x0 - h;
      double lm = loss_of(c, &r, ref, seed);
      r.x[i][j] = x0;
      fd[i][s] = (lp - lm) / (2 * h);
    }
  }
  for (int mode = 0; mode < MODE_COUNT; mode++)
    check_backward(c, &r, mode, idx, fd);
  for (int i = 0; i < OP_MAX_IN; i++) {
    free(idx[i]);
    free(fd[i]);
  }
  free(ref);
  free(seed);
  run_free(&r);
}

static op_case make_case(op_type type, ref_fn ref, int nin, ...) {
  op_case c = {.desc = {.type = type, .nin = nin}, .ref = ref, .samples = 24};
  va_list ap;
  va_start(ap, nin);
  for (int i = 0; i < nin; i++) {
    c.desc.in[i] = va_arg(ap, op_shape);
    c.lo[i] = -1;
    c.hi[i] = 1;
  }
  va_end(ap);
  return c;
}

#endif
