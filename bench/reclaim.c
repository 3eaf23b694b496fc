/* How fast a producer gets back what a SIGKILLed consumer held. Goal (issue
 * 5): with the producer waiting in poll() on ipcref_ctx_poll_fd, everything
 * a killed consumer held, up to 10,000 blocks, is reclaimed within 1 ms of
 * its death (median).
 *
 * Each round: a consumer child imports n blocks (sent in batches of 16 with
 * ipcref_send_batch) and keeps them all; the producer drops its own
 * references (the blocks sit in the limbo, leased out) and waits in poll()
 * on ipcref_ctx_poll_fd. A killer process waits until the producer sleeps,
 * reads CLOCK_MONOTONIC and SIGKILLs the consumer at once. Woken, the
 * producer calls ipcref_ctx_poll(ctx, 0, &freed) until its stats show
 * limbo_blocks == 0 and live_slots == 0. Reported per n: the median and the
 * p90 of reclaimed - kill over the rounds, and its two parts, kill -> wake
 * (the kernel: the consumer's exit, the pidfd, the epoll wake-up) and wake
 * -> reclaimed (the library).
 *
 *   cc -O2 -I. bench/reclaim.c -o reclaim && ./reclaim [rounds=30]
 *      [block_bytes=256] [killer=process|self]
 * killer=self: the producer kills the consumer itself right before poll(). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "bench.h"

#define BATCH      16
#define MAX_ROUNDS 64
#define WAIT_MS    10000

static void die(const char *what, ipcref_result r) {
  fprintf(stderr, "reclaim: %s: %s\n", what, ipcref_strerror(r));
  exit(2);
}

static void die_errno(const char *what) {
  fprintf(stderr, "reclaim: %s: %s\n", what, strerror(errno));
  exit(2);
}

/* Reads exactly n bytes within WAIT_MS; 0 on success. */
static int read_within(int fd, void *p, size_t n) {
  struct pollfd pf;
  ssize_t k;
  pf.fd = fd;
  pf.events = POLLIN;
  pf.revents = 0;
  while (poll(&pf, 1, WAIT_MS) < 0)
    if (errno != EINTR) return -1;
  if (!(pf.revents & (POLLIN | POLLHUP))) return -1;
  do k = read(fd, p, n);
  while (k < 0 && errno == EINTR);
  return k == (ssize_t)n ? 0 : -1;
}

/* The consumer: imports n blocks, keeps them, says so, and waits to die. */
static void consumer(int sock, int ready, long n) {
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view *v = (ipcref_view *)calloc((size_t)n, sizeof *v);
  long i;
  alarm(60);
  if (!v || ipcref_ctx_new(NULL, &ctx) || ipcref_peer_new(ctx, sock, &p))
    _exit(3);
  for (i = 0; i < n; i++)
    if (ipcref_recv(p, &v[i], WAIT_MS) != IPCREF_OK) _exit(4);
  if (write(ready, "r", 1) != 1) _exit(5);
  for (;;) pause(); /* killed here, holding every block */
}

/* 1 when process `pid` sleeps (state S in /proc/pid/stat). */
static int sleeping(pid_t pid) {
  char path[64], buf[512], *rp;
  ssize_t k;
  int fd;
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  k = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (k <= 0) return 0;
  buf[k] = 0;
  rp = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
  return rp && rp[1] == ' ' && rp[2] == 'S';
}

/* The killer: on "go", waits until the producer sleeps (in its poll), then
 * reads the clock and kills the consumer; sends the time back. */
static void killer(int go, int tout, pid_t victim, pid_t producer) {
  double t0, t;
  char c;
  alarm(60);
  if (read_within(go, &c, 1) != 0) _exit(3);
  t0 = now_ns();
  while (!sleeping(producer) && now_ns() - t0 < 100e6) continue;
  t = now_ns();
  if (kill(victim, SIGKILL) != 0) _exit(4);
  if (write(tout, &t, sizeof t) != (ssize_t)sizeof t) _exit(5);
  _exit(0);
}

typedef struct sample {
  double total, wake, reclaim; /* ns: kill -> reclaimed, kill -> wake,
                                  wake -> reclaimed */
} sample;

/* One round with n blocks of `block` bytes. */
static sample round_once(long n, size_t block, int self_kill) {
  int sv[2], ready[2], go[2], tp[2], status;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_stats st;
  ipcref_view v[BATCH];
  ipcref_result r;
  struct pollfd pf;
  pid_t cons, kil = -1;
  double t_kill = 0, t_wake, t_done;
  long i;
  int k, pr;
  char c;
  sample s;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) ||
      pipe2(ready, O_CLOEXEC) || pipe2(go, O_CLOEXEC) || pipe2(tp, O_CLOEXEC))
    die_errno("socketpair/pipe");
  fflush(stdout);
  /* Both children first: they inherit nothing of ipcref. */
  cons = fork();
  if (cons < 0) die_errno("fork");
  if (cons == 0) {
    close(sv[0]), close(ready[0]), close(go[0]), close(go[1]);
    close(tp[0]), close(tp[1]);
    consumer(sv[1], ready[1], n);
  }
  close(sv[1]), close(ready[1]);
  if (!self_kill) {
    pid_t me = getpid();
    kil = fork();
    if (kil < 0) die_errno("fork");
    if (kil == 0) {
      close(sv[0]), close(ready[0]), close(go[1]), close(tp[0]);
      killer(go[0], tp[1], cons, me);
    }
  }
  close(go[0]), close(tp[1]);
  if ((r = ipcref_ctx_new(NULL, &ctx)) != IPCREF_OK) die("ctx", r);
  if ((r = ipcref_peer_new(ctx, sv[0], &p)) != IPCREF_OK) die("peer", r);
  for (i = 0; i < n; i += BATCH) {
    int m = n - i < BATCH ? (int)(n - i) : BATCH;
    for (k = 0; k < m; k++) {
      int64_t shape[1];
      shape[0] = (int64_t)block;
      if ((r = ipcref_view_new_shared(ctx, IPCREF_U8, 1, shape, &v[k])) !=
          IPCREF_OK)
        die("alloc", r);
      memset(ipcref_view_data_mut(&v[k]), (int)(i + k), block);
    }
    if ((r = ipcref_send_batch(p, v, m)) != IPCREF_OK) die("send_batch", r);
    for (k = 0; k < m; k++) ipcref_view_release(&v[k]); /* to the limbo */
  }
  if (read_within(ready[0], &c, 1) != 0) {
    fprintf(stderr, "reclaim: the consumer did not get %ld blocks\n", n);
    exit(2);
  }
  if (ipcref_peer_pid(p) != cons) {
    fprintf(stderr, "reclaim: the peer's pid is not the consumer's\n");
    exit(2);
  }
  ipcref_ctx_stats(ctx, &st);
  if ((long)st.limbo_blocks != n || (long)st.live_slots != n) {
    fprintf(stderr, "reclaim: limbo %zu, slots %zu: expected %ld\n",
            st.limbo_blocks, st.live_slots, n);
    exit(2);
  }
  pf.fd = ipcref_ctx_poll_fd(ctx);
  pf.events = POLLIN;
  pf.revents = 0;
  if (pf.fd < 0) die("ipcref_ctx_poll_fd", IPCREF_EINVAL);
  if (self_kill) {
    t_kill = now_ns();
    if (kill(cons, SIGKILL) != 0) die_errno("kill");
  } else if (write(go[1], "g", 1) != 1) {
    die_errno("write to the killer");
  }
  do pr = poll(&pf, 1, WAIT_MS);
  while (pr < 0 && errno == EINTR);
  t_wake = now_ns();
  if (pr != 1) {
    fprintf(stderr, "reclaim: the poll fd did not become readable\n");
    exit(2);
  }
  for (;;) {
    size_t freed = 0;
    r = ipcref_ctx_poll(ctx, 0, &freed);
    if (r != IPCREF_OK && r != IPCREF_ETIMEDOUT) die("ipcref_ctx_poll", r);
    ipcref_ctx_stats(ctx, &st);
    if (st.limbo_blocks == 0 && st.live_slots == 0) break;
    if (now_ns() - t_wake > WAIT_MS * 1e6) {
      fprintf(stderr, "reclaim: not reclaimed: limbo %zu, slots %zu\n",
              st.limbo_blocks, st.live_slots);
      exit(2);
    }
  }
  t_done = now_ns();
  if (!self_kill && read_within(tp[0], &t_kill, sizeof t_kill) != 0) {
    fprintf(stderr, "reclaim: no time from the killer\n");
    exit(2);
  }
  waitpid(cons, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
    fprintf(stderr, "reclaim: the consumer ended with status %#x\n", status);
    exit(2);
  }
  if (kil > 0) {
    waitpid(kil, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "reclaim: the killer ended with status %#x\n", status);
      exit(2);
    }
  }
  ipcref_peer_free(p);
  ipcref_ctx_stats(ctx, &st);
  if (st.live_bufs || st.limbo_blocks || st.live_slots || st.peers) {
    fprintf(stderr, "reclaim: not drained\n");
    exit(2);
  }
  ipcref_ctx_free(ctx);
  close(ready[0]), close(go[1]), close(tp[0]);
  s.total = t_done - t_kill;
  s.wake = t_wake - t_kill;
  s.reclaim = t_done - t_wake;
  return s;
}

/* The p90 of v[0..n) (sorts v). */
static double p90(double *v, int n) {
  int i = (9 * n + 9) / 10 - 1; /* ceil(0.9 n) - 1 */
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return v[i < 0 ? 0 : i];
}

int main(int argc, char **argv) {
  static const long counts[] = {1, 100, 1000, 10000};
  int rounds = argc > 1 ? atoi(argv[1]) : 30;
  long block_arg = argc > 2 ? atol(argv[2]) : 256;
  int self_kill = argc > 3 && strcmp(argv[3], "self") == 0;
  size_t block;
  size_t c;
  if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 30;
  if (block_arg < 1 || block_arg > (1L << 20)) block_arg = 256;
  block = (size_t)block_arg;
  signal(SIGPIPE, SIG_IGN);
  for (c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    double total[MAX_ROUNDS], wake[MAX_ROUNDS], rec[MAX_ROUNDS];
    double med[3], hi[3];
    int i;
    (void)round_once(counts[c], block, self_kill); /* warm-up */
    for (i = 0; i < rounds; i++) {
      sample s = round_once(counts[c], block, self_kill);
      total[i] = s.total / 1e3;
      wake[i] = s.wake / 1e3;
      rec[i] = s.reclaim / 1e3;
    }
    hi[0] = p90(total, rounds);
    hi[1] = p90(wake, rounds);
    hi[2] = p90(rec, rounds);
    med[0] = median(total, rounds);
    med[1] = median(wake, rounds);
    med[2] = median(rec, rounds);
    printf("peer=ipcref workload=reclaim size=%ld metric=us_median "
           "value=%.1f kill_to_wake_us=%.1f wake_to_reclaimed_us=%.1f "
           "rounds=%d block_bytes=%zu killer=%s\n",
           counts[c], med[0], med[1], med[2], rounds, block,
           self_kill ? "self" : "process");
    printf("peer=ipcref workload=reclaim size=%ld metric=us_p90 value=%.1f "
           "kill_to_wake_us=%.1f wake_to_reclaimed_us=%.1f rounds=%d "
           "block_bytes=%zu killer=%s\n",
           counts[c], hi[0], hi[1], hi[2], rounds, block,
           self_kill ? "self" : "process");
    if (counts[c] == 10000)
      printf("# reclaim of 10000 blocks: median %.1f us (kill -> wake %.1f, "
             "wake -> reclaimed %.1f), p90 %.1f us (goal: median <= 1000 "
             "us)\n",
             med[0], med[1], med[2], hi[0]);
    fflush(stdout);
  }
  return 0;
}
