/* What every benchmark program here shares: a monotonic clock in ns, the
 * median of a set of samples, and a barrier that keeps the compiler from
 * folding away the work being timed. Include after the system headers
 * (it needs clock_gettime: define _GNU_SOURCE or _POSIX_C_SOURCE first). */
#ifndef IPCREF_BENCH_H
#define IPCREF_BENCH_H

#include <stdlib.h>
#include <time.h>

/* The compiler must assume `p` escapes and memory changes. */
static inline void opaque(void *p) {
  __asm__ volatile("" : : "r"(p) : "memory");
}

static inline double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v in place and returns its median. */
static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
