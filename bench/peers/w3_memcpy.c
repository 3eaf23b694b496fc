/* W3 peers c_memcpy and c_memcpy_fresh: a plain memcpy of as many bytes as
 * each W3 output holds (w3_transpose 67108864, w3_stride2 33554432). No
 * layout change: this is what moving the bytes costs at all.
 *   c_memcpy        into a destination made and touched once, reused every
 *                   call: the memory-bandwidth limit for a preallocated output
 *   c_memcpy_fresh  malloc, memcpy, free every call: a fresh output pays its
 *                   first-touch page faults, as every fresh numpy / torch /
 *                   ipcref output does
 * GBps = bytes copied / seconds / 1e9; value = the median over reps single
 * calls, after one warm-up call.
 * Build: gcc -O2 -std=gnu11 -I.. w3_memcpy.c -o w3_memcpy
 * Run:   ./w3_memcpy [reps=7] */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define MAX_REPS 101
#define FULL     ((size_t)4096 * 4096 * 4)

static void copy_reused(char *dst, const char *src, size_t n) {
  memcpy(dst, src, n);
  opaque(dst);
}

static void copy_fresh(char *unused, const char *src, size_t n) {
  char *dst = malloc(n);
  (void)unused;
  if (!dst) {
    perror("malloc");
    exit(2);
  }
  memcpy(dst, src, n);
  opaque(dst);
  free(dst);
}

static double gbps(void (*copy)(char *, const char *, size_t), char *dst,
                   const char *src, size_t n, int reps) {
  double t[MAX_REPS];
  copy(dst, src, n); /* warm-up */
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    copy(dst, src, n);
    t[r] = now_ns() - t0;
  }
  return (double)n / median(t, reps);
}

int main(int argc, char **argv) {
  static const struct {
    const char *wl;
    size_t bytes;
  } cases[] = {{"w3_transpose", FULL}, {"w3_stride2", FULL / 2}};
  int reps = argc > 1 ? atoi(argv[1]) : 7;
  char *src = malloc(FULL), *dst = malloc(FULL);
  if (reps < 1 || reps > MAX_REPS) reps = 7;
  if (!src || !dst) {
    perror("malloc");
    return 2;
  }
  memset(src, 0x5a, FULL);
  memset(dst, 0xa5, FULL); /* touched: no page fault while timed */
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    size_t n = cases[c].bytes;
    printf("peer=c_memcpy workload=%s size=%zu metric=GBps value=%.3f "
           "reps=%d\n",
           cases[c].wl, n, gbps(copy_reused, dst, src, n, reps), reps);
    printf("peer=c_memcpy_fresh workload=%s size=%zu metric=GBps value=%.3f "
           "reps=%d\n",
           cases[c].wl, n, gbps(copy_fresh, dst, src, n, reps), reps);
    fflush(stdout);
  }
  if (dst[0] != 0x5a || dst[FULL / 2 - 1] != 0x5a) return 1;
  free(src);
  free(dst);
  return 0;
}
