/* W1 peer c_atomic: the bare C11 atomic reference count, the floor any
 * refcounted handle is measured against. One op = a clone (atomic_fetch_add)
 * and a drop (atomic_fetch_sub, with the branch a real release takes when the
 * count reaches zero; it never does here). The counter sits alone on a 64-byte
 * line. seq_cst, the default: on x86-64 it is the same `lock xadd` as the
 * relaxed / release pair a refcount needs.
 *   w1a  one thread, n ops per repetition
 *   w1b  two threads, n ops each on the same counter, started together; the
 *        time runs from the first start to the last end, divided by n
 * value = the median over reps of ns per op, after a warm-up of n/10 ops.
 * Build: gcc -O2 -std=gnu11 -pthread -I.. w1_atomic.c -o w1_atomic
 * Run:   ./w1_atomic [n=10000000] [reps=5] */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

#define MAX_REPS 101

typedef struct counted {
  _Alignas(64) atomic_long refs;
  char rest[64 - sizeof(atomic_long)];
} counted;

static counted g_obj;
static long g_n;
static atomic_int g_arrived;
static double g_start[2], g_end[2];

static __attribute__((noinline)) void clone_drop(counted *o, long n) {
  for (long i = 0; i < n; i++) {
    atomic_fetch_add(&o->refs, 1);
    opaque(o);
    if (atomic_fetch_sub(&o->refs, 1) == 1) abort(); /* would free */
  }
}

static void *contender(void *arg) {
  int me = (int)(long)arg;
  atomic_fetch_add(&g_arrived, 1);
  while (atomic_load(&g_arrived) < 2) {
  } /* both spin here, then go at once */
  g_start[me] = now_ns();
  clone_drop(&g_obj, g_n);
  g_end[me] = now_ns();
  return NULL;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 10000000L;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  double t[MAX_REPS];
  if (n < 1) n = 10000000L;
  if (reps < 1 || reps > MAX_REPS) reps = 5;
  g_n = n;
  atomic_init(&g_obj.refs, 1);

  clone_drop(&g_obj, n / 10);
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    clone_drop(&g_obj, n);
    t[r] = (now_ns() - t0) / (double)n;
  }
  printf("peer=c_atomic workload=w1a size=0 metric=ns_per_op value=%.3f "
         "n=%ld reps=%d\n",
         median(t, reps), n, reps);
  fflush(stdout);

  for (int r = 0; r < reps; r++) {
    pthread_t th[2];
    atomic_store(&g_arrived, 0);
    for (long k = 0; k < 2; k++)
      if (pthread_create(&th[k], NULL, contender, (void *)k)) return 2;
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    t[r] = ((g_end[0] > g_end[1] ? g_end[0] : g_end[1]) -
            (g_start[0] < g_start[1] ? g_start[0] : g_start[1])) /
           (double)n;
  }
  printf("peer=c_atomic workload=w1b size=0 metric=ns_per_op value=%.3f "
         "n=%ld reps=%d\n",
         median(t, reps), n, reps);
  if (atomic_load(&g_obj.refs) != 1) {
    fprintf(stderr, "w1_atomic: count is %ld, not 1\n",
            (long)atomic_load(&g_obj.refs));
    return 1;
  }
  return 0;
}
