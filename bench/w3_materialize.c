/* W3 materialize for ipcref, defined as the peers define it
 * (bench/peers/w3_copy.py, w3_memcpy.c and README.md): a
 * contiguous copy of a strided view of a 4096x4096 f32 base filled with
 * values (a[i][j] = i * 4096 + j, as np.arange(N * N).reshape(N, N)).
 *   w3_transpose  a.T       -> 67108864 output bytes
 *   w3_stride2    a[:, ::2] -> 33554432 output bytes
 * GBps = output bytes / seconds / 1e9; value = the median of reps single
 * calls, after 1 warm-up call.
 *   peer=ipcref           ipcref_view_contiguous(&view, &out): a fresh output
 *                         each call, released after the timing (as the
 *                         peers' numpy / torch rows)
 *   peer=ipcref_prealloc  ipcref_view_copy(&dst, &view) into a pre-faulted,
 *                         reused destination (as numpy_prealloc /
 *                         torch_prealloc, and c_memcpy: the limit)
 * After every call, outside the timed region, a sample of output elements is
 * checked (for the reused destination they are overwritten with a sentinel
 * before the call); a wrong element makes the program exit 1.
 * Build: gcc -O2 -std=c11 -I.. w3_materialize.c -o w3_ipcref
 * Run:   ./w3_ipcref [reps=7] */
#define _GNU_SOURCE /* clock_gettime; madvise(MADV_HUGEPAGE) (README.md) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "bench.h"

#define N       4096
#define SAMPLES 64

typedef struct w3_case {
  const char *wl;
  int transpose; /* 1: a.T; 0: a[:, ::2] */
} w3_case;

/* The value out[r][c] must hold: the base element the view maps it to. */
static float expected(const w3_case *k, int64_t r, int64_t c) {
  return k->transpose ? (float)(c * N + r) : (float)(r * N + 2 * c);
}

/* The sample positions of call `call`: the four corners and pseudo-random
 * ones that change from call to call. */
static void sample(const ipcref_view *out, int call, int64_t *rs, int64_t *cs) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(call + 1);
  int64_t rows = out->shape[0], cols = out->shape[1];
  for (int i = 0; i < SAMPLES; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
    rs[i] = (int64_t)(x % (uint64_t)rows);
    cs[i] = (int64_t)((x >> 32) % (uint64_t)cols);
  }
  rs[0] = 0, cs[0] = 0;
  rs[1] = 0, cs[1] = cols - 1;
  rs[2] = rows - 1, cs[2] = 0;
  rs[3] = rows - 1, cs[3] = cols - 1;
}

/* 1 when `out` is a C-contiguous f32 view of the case's shape whose sampled
 * elements are right. */
static int check(const w3_case *k, const ipcref_view *out, int call,
                 const char *peer) {
  int64_t rs[SAMPLES], cs[SAMPLES];
  int64_t rows = N, cols = k->transpose ? N : N / 2;
  if (out->dtype != IPCREF_F32 || out->ndim != 2 || out->shape[0] != rows ||
      out->shape[1] != cols || !ipcref_view_is_contiguous(out)) {
    fprintf(stderr, "%s %s: wrong output geometry\n", peer, k->wl);
    return 0;
  }
  sample(out, call, rs, cs);
  for (int i = 0; i < SAMPLES; i++) {
    int64_t idx[2] = {rs[i], cs[i]};
    float got, want = expected(k, rs[i], cs[i]);
    memcpy(&got, ipcref_view_ptr(out, idx), sizeof got);
    if (got != want) {
      fprintf(stderr, "%s %s call %d: out[%lld][%lld] = %g, expected %g\n",
              peer, k->wl, call, (long long)rs[i], (long long)cs[i],
              (double)got, (double)want);
      return 0;
    }
  }
  return 1;
}

/* Overwrites the elements `call` will check with a sentinel, so that a copy
 * that leaves them alone cannot pass. */
static void poison(ipcref_view *out, int call) {
  int64_t rs[SAMPLES], cs[SAMPLES];
  float bad = -1.0f;
  char *data = ipcref_view_data_mut(out);
  sample(out, call, rs, cs);
  for (int i = 0; i < SAMPLES; i++)
    memcpy(data + (rs[i] * out->strides[0] + cs[i] * out->strides[1]) * 4, &bad,
           sizeof bad);
}

static void report(const char *peer, const char *wl, double bytes, double *ns,
                   int reps) {
  printf("peer=%s workload=%s size=%.0f metric=GBps value=%.3f reps=%d\n", peer,
         wl, bytes, bytes / median(ns, reps), reps);
  fflush(stdout);
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 7;
  const int64_t shape[2] = {N, N};
  const w3_case cases[2] = {{"w3_transpose", 1}, {"w3_stride2", 0}};
  ipcref_view a;
  double ns[100];
  if (reps < 1 || reps > 100) reps = 7;
  if (ipcref_view_new(IPCREF_F32, 2, shape, &a) != IPCREF_OK) {
    fprintf(stderr, "ipcref_view_new failed\n");
    return 1;
  }
  { /* a touched source, as np.arange(N * N, dtype=np.float32) */
    float *p = ipcref_view_data_mut(&a);
    for (int64_t i = 0; i < (int64_t)N * N; i++) p[i] = (float)i;
  }

  for (int c = 0; c < 2; c++) {
    const w3_case *k = &cases[c];
    ipcref_view view, out, dst;
    ipcref_result res =
        k->transpose ? ipcref_view_transpose(&a, 0, 1, &view)
                     : ipcref_view_slice(&a, 1, 0, IPCREF_SLICE_MAX, 2, &view);
    double bytes;
    if (res != IPCREF_OK || ipcref_view_is_contiguous(&view)) {
      fprintf(stderr, "%s: view failed (%d)\n", k->wl, (int)res);
      return 1;
    }
    bytes = (double)ipcref_view_numel(&view) * 4;

    /* ipcref: a fresh output each call (1 warm-up call first). */
    for (int r = -1; r < reps; r++) {
      double t0 = now_ns();
      res = ipcref_view_contiguous(&view, &out);
      double t1 = now_ns();
      if (res != IPCREF_OK) {
        fprintf(stderr, "ipcref %s: ipcref_view_contiguous: %d\n", k->wl,
                (int)res);
        return 1;
      }
      if (r >= 0) ns[r] = t1 - t0;
      if (!check(k, &out, r + 1, "ipcref")) return 1;
      ipcref_view_release(&out);
    }
    report("ipcref", k->wl, bytes, ns, reps);

    /* ipcref_prealloc: a pre-faulted destination, reused. */
    if (ipcref_view_new(IPCREF_F32, 2, view.shape, &dst) != IPCREF_OK) {
      fprintf(stderr, "ipcref_view_new failed\n");
      return 1;
    }
    {
      float *p = ipcref_view_data_mut(&dst);
      for (int64_t i = 0; i < ipcref_view_numel(&dst); i++) p[i] = 1.0f;
    }
    for (int r = -1; r < reps; r++) {
      poison(&dst, 1000 + r);
      double t0 = now_ns();
      res = ipcref_view_copy(&dst, &view);
      double t1 = now_ns();
      if (res != IPCREF_OK) {
        fprintf(stderr, "ipcref_prealloc %s: ipcref_view_copy: %d\n", k->wl,
                (int)res);
        return 1;
      }
      if (r >= 0) ns[r] = t1 - t0;
      if (!check(k, &dst, 1000 + r, "ipcref_prealloc")) return 1;
    }
    report("ipcref_prealloc", k->wl, bytes, ns, reps);
    ipcref_view_release(&dst);
    ipcref_view_release(&view);
  }
  ipcref_view_release(&a);
  return 0;
}
