/* W2 view creation for ipcref, defined as the peers define it
 * (bench/peers/w2_views.py and README.md): the base is a 4096x4096 f32
 * view (size=67108864 bytes); one op creates a view and releases it, and no
 * data is touched.
 *   w2_slice      a[1:100]  ipcref_view_slice(&a, 0, 1, 100, 1, &tmp)
 *   w2_transpose  a.T       ipcref_view_transpose(&a, 0, 1, &tmp)
 * each followed by ipcref_view_release(&tmp). As timeit does, the number of
 * ops per repetition is calibrated so that one repetition takes about
 * `target` seconds; value = the median over reps of time / n, in ns.
 * The peers' figures include Python's per-statement cost (reported by them as
 * peer=python_timeit_empty workload=w2_empty); ours is a native loop.
 * Build: gcc -O2 -std=c11 -I.. w2_views.c -o w2_ipcref
 * Run:   ./w2_ipcref [reps=7] [target_s_per_rep=0.1] */
#define _GNU_SOURCE /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "bench.h"

#define ROWS 4096
#define COLS 4096
#define SIZE ((long long)ROWS * COLS * 4)

static int g_failed;

static __attribute__((noinline)) void loop_slice(const ipcref_view *a, long n) {
  for (long i = 0; i < n; i++) {
    ipcref_view tmp;
    if (ipcref_view_slice(a, 0, 1, 100, 1, &tmp) != IPCREF_OK) g_failed = 1;
    opaque(&tmp);
    ipcref_view_release(&tmp);
  }
}
static __attribute__((noinline)) void loop_transpose(const ipcref_view *a,
                                                     long n) {
  for (long i = 0; i < n; i++) {
    ipcref_view tmp;
    if (ipcref_view_transpose(a, 0, 1, &tmp) != IPCREF_OK) g_failed = 1;
    opaque(&tmp);
    ipcref_view_release(&tmp);
  }
}

typedef void (*loop_fn)(const ipcref_view *, long);

/* Seconds for n ops. */
static double run(loop_fn f, const ipcref_view *a, long n) {
  double t0 = now_ns();
  f(a, n);
  return (now_ns() - t0) * 1e-9;
}

static void bench(const char *wl, loop_fn f, const ipcref_view *a, int reps,
                  double target) {
  long n = 1000;
  double dt, v[100];
  for (;;) { /* calibrate as w2_views.py does: one rep ~ target s */
    dt = run(f, a, n);
    if (dt >= target / 4 || n >= 1000000000L) break;
    n *= 4;
  }
  n = (long)((double)n * target / (dt > 1e-9 ? dt : 1e-9));
  if (n < 1000) n = 1000;
  for (int r = 0; r < reps; r++) v[r] = run(f, a, n) * 1e9 / (double)n;
  printf("peer=ipcref workload=%s size=%lld metric=ns_per_op value=%.2f "
         "n=%ld reps=%d\n",
         wl, SIZE, median(v, reps), n, reps);
  fflush(stdout);
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 7;
  double target = argc > 2 ? atof(argv[2]) : 0.1;
  const int64_t shape[2] = {ROWS, COLS};
  ipcref_view a, tmp;
  if (reps < 1 || reps > 100) reps = 7;
  if (!(target > 0 && target < 10)) target = 0.1;
  if (ipcref_view_new(IPCREF_F32, 2, shape, &a) != IPCREF_OK) {
    fprintf(stderr, "ipcref_view_new failed\n");
    return 1;
  }

  /* The views are what the peers make: a[1:100] is 99x4096, a.T 4096x4096
   * with swapped strides. */
  if (ipcref_view_slice(&a, 0, 1, 100, 1, &tmp) != IPCREF_OK ||
      tmp.shape[0] != 99 || tmp.shape[1] != COLS ||
      tmp.byte_offset != COLS * 4) {
    fprintf(stderr, "a[1:100] is wrong\n");
    return 1;
  }
  ipcref_view_release(&tmp);
  if (ipcref_view_transpose(&a, 0, 1, &tmp) != IPCREF_OK ||
      tmp.strides[0] != 1 || tmp.strides[1] != COLS) {
    fprintf(stderr, "a.T is wrong\n");
    return 1;
  }
  ipcref_view_release(&tmp);

  printf("# ipcref w2: a native C loop (no interpreter); the numpy/torch w2 "
         "figures include Python's per-statement cost, reported as "
         "peer=python_timeit_empty workload=w2_empty\n");
  bench("w2_slice", loop_slice, &a, reps, target);
  bench("w2_transpose", loop_transpose, &a, reps, target);

  if (g_failed || ipcref_buf_strong_count(a.buf) != 1) {
    fprintf(stderr, "a view operation failed or leaked a reference\n");
    return 1;
  }
  ipcref_view_release(&a);
  return 0;
}
