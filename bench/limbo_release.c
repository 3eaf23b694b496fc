/* The limbo must not slow the hot path: the release of a shared block
 * (which sweeps) should cost about the same with 10 blocks in the limbo as
 * with 100,000. A consumer process holds N blocks the producer has already
 * dropped (so they sit in its limbo); the producer then times allocate +
 * release of a fresh shared block, the release sweeping every time.
 *
 * Also: how fast a consumer returns leases (the one fetch_add and store per
 * release into the ledger's ring), from one thread and from two threads of
 * one consumer at once (they share the ring's head: the cost of that line
 * bouncing between cores is the price of the design).
 *
 *   cc -O2 -I. bench/limbo_release.c -o limbo -pthread && ./limbo [reps=5] */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "bench.h"

#define OPS 200000

static void die(const char *what, ipcref_result r) {
  fprintf(stderr, "limbo_release: %s: %s\n", what, ipcref_strerror(r));
  exit(2);
}

/* The consumer: takes n views, says so, waits, releases them all (from
 * `threads` threads), reports how long the releases took, and exits. */
static void consumer(int sock, int ctl, long n, int threads);

typedef struct rel_job {
  ipcref_view *v;
  long from, to;
} rel_job;

static void *release_range(void *arg) {
  rel_job *j = (rel_job *)arg;
  long i;
  for (i = j->from; i < j->to; i++) ipcref_view_release(&j->v[i]);
  return NULL;
}

static void consumer(int sock, int ctl, long n, int threads) {
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view *v = (ipcref_view *)calloc((size_t)n, sizeof *v);
  pthread_t th[2];
  rel_job jobs[2];
  double t0, ns;
  long i;
  char c;
  int k;
  if (!v || ipcref_ctx_new(NULL, &ctx) || ipcref_peer_new(ctx, sock, &p))
    _exit(3);
  for (i = 0; i < n; i++)
    if (ipcref_recv(p, &v[i], 10000) != IPCREF_OK) _exit(4);
  if (write(ctl, "h", 1) != 1 || read(ctl, &c, 1) != 1) _exit(5);
  t0 = now_ns();
  for (k = 0; k < threads; k++) {
    jobs[k].v = v;
    jobs[k].from = n * k / threads;
    jobs[k].to = n * (k + 1) / threads;
    pthread_create(&th[k], NULL, release_range, &jobs[k]);
  }
  for (k = 0; k < threads; k++) pthread_join(th[k], NULL);
  ns = (now_ns() - t0) / (double)n;
  if (write(ctl, &ns, sizeof ns) != sizeof ns) _exit(6);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  free(v);
  _exit(0);
}

/* With n blocks in the limbo: ns per allocate + release of a shared block,
 * and the consumer's ns per lease returned with `threads` threads. */
static void run(long n, int threads, int reps, double *release_ns,
                double *return_ns) {
  int sv[2], ctl[2], r, status;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_stats st = {0};
  double samples[16];
  pid_t pid;
  long i;
  char c;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) ||
      socketpair(AF_UNIX, SOCK_STREAM, 0, ctl))
    exit(2);
  pid = fork();
  if (pid == 0) {
    close(sv[0]);
    close(ctl[0]);
    consumer(sv[1], ctl[1], n, threads);
  }
  close(sv[1]);
  close(ctl[1]);
  if ((r = ipcref_ctx_new(NULL, &ctx)) != IPCREF_OK) die("ctx", r);
  if ((r = ipcref_peer_new(ctx, sv[0], &p)) != IPCREF_OK) die("peer", r);
  for (i = 0; i < n; i++) {
    ipcref_buf *b;
    ipcref_view v;
    int64_t shape[1] = {256};
    if ((r = ipcref_shared_new(ctx, 256, &b)) != IPCREF_OK) die("alloc", r);
    if ((r = ipcref_view_of(b, IPCREF_U8, 1, shape, &v)) != IPCREF_OK)
      die("view", r);
    ipcref_buf_release(b);
    if ((r = ipcref_send(p, &v)) != IPCREF_OK) die("send", r);
    ipcref_view_release(&v); /* to the limbo */
  }
  if (read(ctl[0], &c, 1) != 1) exit(2);
  ipcref_ctx_stats(ctx, &st);
  if ((long)st.limbo_blocks != n) {
    fprintf(stderr, "limbo holds %zu, expected %ld\n", st.limbo_blocks, n);
    exit(2);
  }
  for (r = 0; r < reps; r++) {
    double t0 = now_ns();
    for (i = 0; i < OPS; i++) {
      ipcref_buf *b;
      if (ipcref_shared_new(ctx, 256, &b) != IPCREF_OK) exit(2);
      opaque(b);
      ipcref_buf_release(b); /* sweeps */
    }
    samples[r] = (now_ns() - t0) / OPS;
  }
  *release_ns = median(samples, reps);
  if (write(ctl[0], "r", 1) != 1 || read(ctl[0], return_ns, 8) != 8) exit(2);
  waitpid(pid, &status, 0);
  ipcref_collect(ctx);
  ipcref_ctx_stats(ctx, &st);
  if (st.limbo_blocks != 0 || st.live_slots != 0) {
    fprintf(stderr, "not drained: limbo %zu, slots %zu\n", st.limbo_blocks,
            st.live_slots);
    exit(2);
  }
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  close(ctl[0]);
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 5;
  long sizes[2] = {10, 100000};
  double rel[2], ret1[2], ret2;
  int k;
  if (reps < 1 || reps > 16) reps = 5;
  for (k = 0; k < 2; k++) {
    run(sizes[k], 1, reps, &rel[k], &ret1[k]);
    printf("peer=ipcref workload=limbo_release size=%ld metric=ns_per_op "
           "value=%.1f reps=%d\n",
           sizes[k], rel[k], reps);
    fflush(stdout);
  }
  printf("# release with 100000 in the limbo / with 10: %.2fx (goal <= 2x)\n",
         rel[1] / rel[0]);
  run(100000, 2, 1, &rel[0], &ret2);
  printf("peer=ipcref workload=lease_return size=1 metric=ns_per_op "
         "value=%.1f threads=1\n",
         ret1[1]);
  printf("peer=ipcref workload=lease_return size=2 metric=ns_per_op "
         "value=%.1f threads=2\n",
         ret2);
  return 0;
}
