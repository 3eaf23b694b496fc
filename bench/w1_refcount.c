/* W1 refcount for ipcref, defined exactly as the peers define it
 * (bench/peers/w1_atomic.c, w1_shared_ptr.cpp, w1_arc.rs, README.md).
 * One "op" = ipcref_buf_retain + ipcref_buf_release of a buffer whose count
 * never reaches zero (the benchmark keeps its own reference throughout).
 * w1a: 1 thread, n ops.  w1b: 2 threads, each n ops on the same buffer; value =
 * wall time from the earlier start to the later end / n.  Median over reps,
 * after a warm-up of n/10 ops.
 * The implementation is in this translation unit (as in a normal single-TU
 * user build), so retain/release can inline into the loop.
 * Build: gcc -O2 -std=c11 -pthread -I.. w1_refcount.c -o w1_ipcref
 * Run:   ./w1_ipcref [n=1e7] [reps=5] */
#define _GNU_SOURCE /* clock_gettime, pthread_barrier_t */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "bench.h"

static __attribute__((noinline)) void loop(ipcref_buf *b, long n) {
  for (long i = 0; i < n; i++) {
    ipcref_buf *c = ipcref_buf_retain(b); /* clone / retain */
    opaque(c);
    ipcref_buf_release(c); /* drop / release: never the last reference */
  }
}

static ipcref_buf *g_buf;
static long g_n;
static pthread_barrier_t g_bar;
static double g_t0[2], g_t1[2];
static void *worker(void *arg) {
  long id = (long)arg;
  pthread_barrier_wait(&g_bar);
  g_t0[id] = now_ns();
  loop(g_buf, g_n);
  g_t1[id] = now_ns();
  return NULL;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 10000000L;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  double v[100];
  if (n < 1) n = 10000000L;
  if (reps < 1 || reps > 100) reps = 5;
  if (ipcref_buf_new(64, &g_buf) != IPCREF_OK) { /* 64 B, as the Rust peer */
    fprintf(stderr, "ipcref_buf_new failed\n");
    return 1;
  }
  g_n = n;

  loop(g_buf, n / 10); /* warm-up */
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    loop(g_buf, n);
    v[r] = (now_ns() - t0) / (double)n;
  }
  printf("peer=ipcref workload=w1a size=0 metric=ns_per_op value=%.3f n=%ld "
         "reps=%d\n",
         median(v, reps), n, reps);
  fflush(stdout);

  for (int r = 0; r < reps; r++) {
    pthread_t th[2];
    pthread_barrier_init(&g_bar, NULL, 2);
    for (long i = 0; i < 2; i++)
      pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&g_bar);
    double t0 = g_t0[0] < g_t0[1] ? g_t0[0] : g_t0[1];
    double t1 = g_t1[0] > g_t1[1] ? g_t1[0] : g_t1[1];
    v[r] = (t1 - t0) / (double)n;
  }
  printf("peer=ipcref workload=w1b size=0 metric=ns_per_op value=%.3f n=%ld "
         "reps=%d\n",
         median(v, reps), n, reps);
  if (ipcref_buf_strong_count(g_buf) != 1) {
    fprintf(stderr, "refcount mismatch: %zu\n", ipcref_buf_strong_count(g_buf));
    return 1;
  }
  ipcref_buf_release(g_buf);
  return 0;
}
