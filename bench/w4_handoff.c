/* W4 cross-process hand-off for ipcref, defined as the peers define it
 * (bench/peers/w4_handoff.c and README.md). The producer (parent)
 * hands a buffer of SIZE bytes to a forked consumer, which receives it, reads
 * and checks its first and last byte, releases it and acks with 1 byte; one
 * hand-off = producer start .. ack received. Before each hand-off the
 * producer writes the first and the last byte. Timed one by one for SECONDS
 * after 3 warm-ups; us_per_handoff = the median (n, mean, p99 as extras),
 * GBps = SIZE / median.
 *   MODE          peer name       what a hand-off is
 *   ipcref        ipcref          ipcref_send of a view of one shared buffer
 *                                 (ipcref_shared_new, allocated and filled
 *                                 once; the producer keeps its reference);
 *                                 the consumer ipcref_recv, reads, checks,
 *                                 ipcref_view_release, acks. Its segment
 *                                 crossed at the first hand-off: compare with
 *                                 c_msg64
 *   first         ipcref_first    the FIRST hand-off of a new segment: each
 *                                 iteration allocates a new buffer that gets
 *                                 a segment of its own (segment_size 4096,
 *                                 the smallest: blocks over half a segment
 *                                 get their own; no segment cache), so its
 *                                 memfd crosses and the consumer maps it.
 *                                 The allocation (and writing the two bytes)
 *                                 and the producer's release after the ack
 *                                 are not timed, as c_memfd_scm's memfd is
 *                                 made once. Every timed hand-off must send
 *                                 an fd (ipcref_stats.fds_sent), else the
 *                                 row fails. Compare with c_memfd_scm
 * The data travels over a socketpair(AF_UNIX, SOCK_SEQPACKET) owned by the
 * two ipcref_peers; the 1-byte ack over a second socketpair.
 * W4_PIN=split pins the producer to the first and the consumer to the second
 * allowed CPU. The workload id printed is $W4_ID if set (w4, w4_1cpu,
 * w4_2cpu), else w4. The library has no inline small-block path (a view's
 * bytes inside the message), so there is no ipcref_inline row.
 * Build: gcc -O2 -std=c11 -I.. w4_handoff.c -o w4_ipcref -pthread
 * Run:   ./w4_ipcref ipcref|first SIZE [SECONDS=1.0] */
#define _GNU_SOURCE /* clock_gettime, sched_setaffinity */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "bench.h"

#define WARMUPS 3
#define MAX_N   50000000
#define SEG_MIN 4096 /* the smallest segment_size ipcref_ctx_new takes */

enum { MODE_STEADY, MODE_FIRST };

static int g_mode;
static size_t S;
static const char *g_wl = "w4";
static const char *g_peer = "ipcref";
static volatile unsigned g_sink;

static _Noreturn void die(const char *what, ipcref_result r) {
  fprintf(stderr, "w4 %s size=%zu: %s: %s\n", g_peer, S, what,
          r ? ipcref_strerror(r) : strerror(errno));
  exit(2);
}

static void write_byte(int fd) {
  char a = 1;
  while (write(fd, &a, 1) != 1)
    if (errno != EINTR) die("write ack", IPCREF_OK);
}

/* 1 = got the ack, 0 = EOF */
static int read_byte(int fd) {
  char a;
  ssize_t r;
  while ((r = read(fd, &a, 1)) < 0)
    if (errno != EINTR) die("read ack", IPCREF_OK);
  return r == 1;
}

static int g_cpu[2] = {0, 1}; /* first two CPUs of the inherited mask */
static int two_cpus(void) {
  cpu_set_t s;
  int k = 0;
  if (sched_getaffinity(0, sizeof s, &s)) return 0;
  for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &s)) g_cpu[k++] = c;
  return k == 2;
}
static void pin(int which) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(g_cpu[which], &s);
  sched_setaffinity(0, sizeof s, &s); /* best effort */
}

/* The options of both sides. For the first-hand-off mode every buffer gets a
 * segment of its own and no empty segment is kept for reuse, so each
 * allocation makes a new memfd. */
static ipcref_ctx_options options(void) {
  ipcref_ctx_options o;
  memset(&o, 0, sizeof o);
  if (g_mode == MODE_FIRST) {
    o.segment_size = SEG_MIN;
    o.segment_cache = 1; /* less than any segment: none is kept */
  }
  return o;
}

static void consumer(int data_fd, int ack_fd) {
  ipcref_ctx_options o = options();
  ipcref_ctx *ctx = NULL;
  ipcref_peer *peer = NULL;
  ipcref_result r;
  uint64_t k = 0;
  if ((r = ipcref_ctx_new(&o, &ctx)) ||
      (r = ipcref_peer_new(ctx, data_fd, &peer)))
    die("consumer setup", r);
  for (;; k++) {
    ipcref_view v;
    const unsigned char *b;
    unsigned char e = (unsigned char)k;
    memset(&v, 0, sizeof v);
    r = ipcref_recv(peer, &v, -1);
    if (r == IPCREF_EPEER) break; /* the producer is done */
    if (r) die("ipcref_recv", r);
    if (v.ndim != 1 || (size_t)v.shape[0] != S) _exit(3);
    b = (const unsigned char *)ipcref_buf_data(v.buf) + v.byte_offset;
    g_sink += b[0] + b[S - 1];
    if (b[0] != e || b[S - 1] != e) _exit(3);
    ipcref_view_release(&v);
    write_byte(ack_fd);
  }
  ipcref_peer_free(peer);
  ipcref_ctx_free(ctx);
  _exit(0);
}

typedef struct producer {
  ipcref_ctx *ctx;
  ipcref_peer *peer;
  int ack_fd;
  ipcref_view view; /* MODE_STEADY: the one reused buffer */
  uint64_t new_fds; /* MODE_FIRST: hand-offs on which an fd crossed */
} producer;

static ipcref_view new_buffer(producer *p) {
  ipcref_buf *b;
  ipcref_view v;
  int64_t shape[1];
  ipcref_result r;
  shape[0] = (int64_t)S;
  memset(&v, 0, sizeof v);
  if ((r = ipcref_shared_new(p->ctx, S, &b))) die("ipcref_shared_new", r);
  if ((r = ipcref_view_of(b, IPCREF_U8, 1, shape, &v))) die("view_of", r);
  ipcref_buf_release(b); /* the view holds it */
  return v;
}

static void send_and_wait(producer *p, const ipcref_view *v) {
  ipcref_result r = ipcref_send(p->peer, v);
  if (r) die("ipcref_send", r);
  if (!read_byte(p->ack_fd)) {
    fprintf(stderr, "consumer died\n");
    exit(2);
  }
}

/* One hand-off number i; returns its time in ns. */
static double handoff(producer *p, uint64_t i) {
  unsigned char *d;
  double t0, dt;
  if (g_mode == MODE_STEADY) {
    d = (unsigned char *)ipcref_buf_data(p->view.buf);
    d[0] = d[S - 1] = (unsigned char)i; /* "produce" */
    t0 = now_ns();
    send_and_wait(p, &p->view);
    return now_ns() - t0;
  } else {
    ipcref_stats before, after;
    ipcref_view v = new_buffer(p); /* a new segment: not timed */
    memset(&before, 0, sizeof before);
    memset(&after, 0, sizeof after);
    d = (unsigned char *)ipcref_buf_data(v.buf);
    d[0] = d[S - 1] = (unsigned char)i;
    ipcref_ctx_stats(p->ctx, &before);
    t0 = now_ns();
    send_and_wait(p, &v);
    dt = now_ns() - t0;
    ipcref_ctx_stats(p->ctx, &after);
    if (after.fds_sent > before.fds_sent) p->new_fds++;
    ipcref_view_release(&v); /* frees the block and its segment */
    return dt;
  }
}

int main(int argc, char **argv) {
  producer p;
  ipcref_ctx_options o;
  ipcref_result r;
  int dv[2], av[2], st, split;
  pid_t pid;
  double secs, start, total = 0, *v, med, p99;
  size_t cap = 1 << 16, n = 0;
  uint64_t i = 0;

  if (argc < 3 || (strcmp(argv[1], "ipcref") && strcmp(argv[1], "first"))) {
    fprintf(stderr, "usage: %s ipcref|first SIZE [SECONDS]\n", argv[0]);
    return 2;
  }
  g_mode = strcmp(argv[1], "first") ? MODE_STEADY : MODE_FIRST;
  g_peer = g_mode == MODE_FIRST ? "ipcref_first" : "ipcref";
  S = strtoull(argv[2], NULL, 0);
  secs = argc > 3 ? atof(argv[3]) : 1.0;
  if (S < 1) return 2;
  if (getenv("W4_ID")) g_wl = getenv("W4_ID");
  signal(SIGPIPE, SIG_IGN);
  split = getenv("W4_PIN") && !strcmp(getenv("W4_PIN"), "split");
  if (split && !two_cpus()) {
    printf("peer=%s workload=%s size=%zu status=skipped reason=needs-2-cpus\n",
           g_peer, g_wl, S);
    return 0;
  }
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, dv) ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, av))
    die("socketpair", IPCREF_OK);
  fflush(stdout);
  pid = fork();
  if (pid < 0) die("fork", IPCREF_OK);
  if (pid == 0) {
    if (split) pin(1);
    close(dv[0]);
    close(av[0]);
    consumer(dv[1], av[1]);
  }
  close(dv[1]);
  close(av[1]);
  if (split) pin(0);

  memset(&p, 0, sizeof p);
  o = options();
  p.ack_fd = av[0];
  if ((r = ipcref_ctx_new(&o, &p.ctx)) ||
      (r = ipcref_peer_new(p.ctx, dv[0], &p.peer)))
    die("producer setup", r);
  if (g_mode == MODE_STEADY) {
    p.view = new_buffer(&p);
    memset(ipcref_buf_data(p.view.buf), 1, S); /* filled (pre-faulted) once */
  }

  for (int w = 0; w < WARMUPS; w++) handoff(&p, i++);
  p.new_fds = 0;
  v = malloc(cap * sizeof *v);
  start = now_ns();
  do {
    double dt = handoff(&p, i++);
    if (n == cap) {
      cap *= 2;
      v = realloc(v, cap * sizeof *v);
    }
    if (!v) die("realloc", IPCREF_OK);
    v[n++] = dt;
    total += dt;
  } while ((n < 5 || now_ns() - start < secs * 1e9) && n < MAX_N);

  ipcref_view_release(&p.view);
  ipcref_peer_free(p.peer); /* the consumer sees the hang-up */
  close(p.ack_fd);
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("peer=%s workload=%s size=%zu status=failed "
           "reason=consumer-exit-%d\n",
           g_peer, g_wl, S, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 1;
  }
  if (g_mode == MODE_FIRST && p.new_fds != n) {
    printf("peer=%s workload=%s size=%zu status=failed "
           "reason=only-%llu-of-%zu-hand-offs-sent-an-fd\n",
           g_peer, g_wl, S, (unsigned long long)p.new_fds, n);
    return 1;
  }
  ipcref_collect(p.ctx);
  ipcref_ctx_free(p.ctx);
  med = median(v, (int)n); /* sorts v */
  p99 = v[(size_t)(0.99 * (double)(n - 1))];
  printf("peer=%s workload=%s size=%zu metric=us_per_handoff value=%.3f n=%zu "
         "mean=%.3f p99=%.3f\n",
         g_peer, g_wl, S, med / 1e3, n, total / (double)n / 1e3, p99 / 1e3);
  printf("peer=%s workload=%s size=%zu metric=GBps value=%.3f\n", g_peer, g_wl,
         S, (double)S / med);
  free(v);
  return 0;
}
