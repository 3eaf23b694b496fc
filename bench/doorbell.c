/* The channel's doorbell, by measurement: the cost of waking a process
 * asleep in each candidate primitive, between two processes (fork).
 * The channel (src/share_channel.h) rings a doorbell after a record only
 * while the receiver says it sleeps. The doorbell must be an fd, for the
 * peer's poll fd (ipcref_peer_poll_fd) to wait on: a futex is not one. An
 * eventfd is, but its O_NONBLOCK is a flag of the open file description
 * both sides share, which the receiver could clear with fcntl, and it
 * could fill the counter: the sender's next write would then hang.
 * A socket's MSG_DONTWAIT is the sender's own, per call. The kinds:
 *   futex    FUTEX_WAIT/FUTEX_WAKE (not the private ops) on a 32-bit word
 *            in a MAP_SHARED|MAP_ANONYMOUS page: the ring adds 1 and wakes,
 *            the waiter sleeps while the word holds what it last saw
 *   eventfd  EFD_NONBLOCK; ring: write 8 bytes; wait: poll() then read
 *   dgram    socketpair(AF_UNIX, SOCK_DGRAM|SOCK_NONBLOCK); ring: send(fd,
 *            "", 1, MSG_DONTWAIT|MSG_NOSIGNAL); wait: poll(), recv(DONTWAIT)
 *   stream   the same on SOCK_STREAM, the receiver's end made blocking, it
 *            sleeps in one recv: what share_channel.h does today
 *   spin     the floor, no sleep: a shared atomic counter, the waiter
 *            spinning (pause; sched_yield every 1Ki looks, or every look
 *            where the two may only share one CPU). Pinned split wherever
 *            two CPUs are allowed (as w4's chan_spin): two spinners put on
 *            one CPU by the scheduler would measure the scheduler
 * A ping-pong: A (the parent) rings B through one instance and waits on a
 * second; B, asleep in the first one's wait, wakes and rings back. After
 * 200 warm-ups, N round trips (DOORBELL_N, default 20000) are timed one by
 * one (CLOCK_MONOTONIC): us_per_roundtrip is the median, p99_us the 99th
 * percentile. ring_ns: the mean cost of one ring with nobody waiting (the
 * FUTEX_WAKE, write or send alone), N rings before the fork, timed in
 * batches of 16, the fd drained (untimed) after each batch.
 * CPUs: unpinned by default; DOORBELL_PIN=split pins A to the first allowed
 * CPU, B to the second. One CPU: `taskset -c 0 ./doorbell` (workload
 * doorbell_1cpu). No metric=/value= pair: bench/ratios.py skips the lines.
 * Build: gcc -O2 -std=c11 -Wall -Wextra -Wpedantic -Werror doorbell.c \
 *          -o doorbell -pthread
 * Run:   [DOORBELL_N=20000] [DOORBELL_PIN=split] ./doorbell [KIND ...]
 *        (KIND: futex eventfd dgram stream spin; default all) */
#define _GNU_SOURCE /* syscall, sched_setaffinity, eventfd */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define WARMUPS   200
#define BATCH     16
#define MAX_N     10000000
#define TIMEOUT_S 300 /* per kind: SIGALRM ends a stuck run (B: PDEATHSIG) */

enum kind { K_FUTEX, K_EVENTFD, K_DGRAM, K_STREAM, K_SPIN, N_KINDS };
static const char *const kind_name[N_KINDS] = {"futex", "eventfd", "dgram",
                                               "stream", "spin"};

/* The page both processes share holds 3 of these (A to B, B to A, the
 * ring alone): a futex or spin word on a cache line of its own. */
struct slot {
  _Alignas(64) _Atomic uint32_t w;
};

/* One doorbell, one direction. */
typedef struct bell {
  enum kind k;
  _Atomic uint32_t *word; /* futex, spin */
  int tx, rx;             /* eventfd: the same fd; sockets: the two ends */
  uint32_t seen;          /* the waiter's last look at *word */
} bell;

static int g_one_cpu, g_cpu[2] = {0, 1};
static cpu_set_t g_mask; /* the CPUs allowed at the start */

static _Noreturn void die(const char *what) {
  fprintf(stderr, "doorbell: %s: %s\n", what, strerror(errno));
  _exit(2);
}

static long futex(_Atomic uint32_t *w, int op, uint32_t val) {
  return syscall(SYS_futex, (void *)w, op, val, NULL, NULL, 0);
}

static void bell_open(bell *b, enum kind k, _Atomic uint32_t *word) {
  int sv[2], fl;
  memset(b, 0, sizeof *b);
  b->k = k;
  b->word = word;
  b->tx = b->rx = -1;
  atomic_store(word, 0);
  if (k == K_EVENTFD) {
    if ((b->tx = b->rx = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
      die("eventfd");
  } else if (k == K_DGRAM || k == K_STREAM) {
    int type = k == K_DGRAM ? SOCK_DGRAM : SOCK_STREAM;
    if (socketpair(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv))
      die("socketpair");
    b->tx = sv[0];
    b->rx = sv[1];
    /* the stream receiver sleeps in recv: its own end (its own open file
     * description: the sender's keeps O_NONBLOCK) made blocking */
    if (k == K_STREAM && ((fl = fcntl(b->rx, F_GETFL)) < 0 ||
                          fcntl(b->rx, F_SETFL, fl & ~O_NONBLOCK)))
      die("fcntl");
  }
}

static void bell_close(bell *b) {
  if (b->rx != b->tx) close(b->rx);
  if (b->tx >= 0) close(b->tx);
}

/* 0, or -1 when the ring failed. */
static int ring(bell *b) {
  uint64_t one = 1;
  switch (b->k) {
  case K_FUTEX:
    atomic_fetch_add(b->word, 1);
    return futex(b->word, FUTEX_WAKE, 1) < 0 ? -1 : 0;
  case K_EVENTFD: return write(b->tx, &one, sizeof one) == sizeof one ? 0 : -1;
  case K_SPIN: atomic_fetch_add(b->word, 1); return 0;
  default: return send(b->tx, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1 ? 0 : -1;
  }
}

static inline void relax(unsigned *looks) {
  if (g_one_cpu || (++*looks & 0x3ff) == 0) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

static void sleep_in_poll(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  while (poll(&p, 1, -1) < 0)
    if (errno != EINTR) die("poll");
}

/* Returns once the bell rang (sleeping until it does; spin: spinning). */
static void wait_bell(bell *b) {
  char buf[64];
  uint64_t v;
  uint32_t w;
  unsigned looks = 0;
  ssize_t k;
  for (;;) {
    switch (b->k) {
    case K_FUTEX:
    case K_SPIN:
      if ((w = atomic_load(b->word)) != b->seen) {
        b->seen = w;
        return;
      }
      if (b->k == K_SPIN)
        relax(&looks);
      else if (futex(b->word, FUTEX_WAIT, b->seen) < 0 && errno != EAGAIN &&
               errno != EINTR)
        die("FUTEX_WAIT");
      break;
    case K_EVENTFD:
      sleep_in_poll(b->rx);
      if (read(b->rx, &v, sizeof v) == sizeof v) return;
      if (errno != EAGAIN && errno != EINTR) die("read eventfd");
      break;
    case K_DGRAM:
      sleep_in_poll(b->rx);
      if ((k = recv(b->rx, buf, sizeof buf, MSG_DONTWAIT)) > 0) return;
      if (k < 0 && errno != EAGAIN && errno != EINTR) die("recv dgram");
      break;
    default: /* K_STREAM */
      if ((k = recv(b->rx, buf, sizeof buf, 0)) > 0) return;
      if (k == 0) die("the other side hung up");
      if (errno != EINTR) die("recv stream");
    }
  }
}

/* Empties what rings left in the fd, without waiting. */
static void drain(bell *b) {
  char buf[4096];
  if (b->k == K_EVENTFD) {
    uint64_t v;
    (void)!read(b->rx, &v, sizeof v);
  } else if (b->k == K_DGRAM || b->k == K_STREAM) {
    while (recv(b->rx, buf, sizeof buf, MSG_DONTWAIT) > 0) continue;
  }
}

/* The mean cost of one ring with nobody waiting, in ns (<0: a ring failed). */
static double ring_alone(enum kind k, _Atomic uint32_t *word, long n) {
  bell b;
  double t = 0, t0;
  long i, j, fails = 0;
  bell_open(&b, k, word);
  for (j = 0; j < BATCH; j++) fails += ring(&b) != 0; /* warm */
  drain(&b);
  for (i = 0; i < n; i += BATCH) {
    t0 = now_ns();
    for (j = 0; j < BATCH; j++) fails += ring(&b) != 0;
    t += now_ns() - t0;
    drain(&b);
  }
  bell_close(&b);
  return fails ? -1.0 : t / (double)((n + BATCH - 1) / BATCH * BATCH);
}

static int allowed(int *first_two) {
  int c, k = 0;
  if (sched_getaffinity(0, sizeof g_mask, &g_mask)) return 1;
  for (c = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &g_mask)) first_two[k++] = c;
  return CPU_COUNT(&g_mask);
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  if (sched_setaffinity(0, sizeof s, &s)) die("sched_setaffinity");
}

static int run(enum kind k, struct slot *pg, long n, int pinned, int cpus,
               double *v) {
  int split = pinned || (k == K_SPIN && cpus >= 2); /* spin: always split */
  const char *wl = cpus < 2 ? "doorbell_1cpu" : "doorbell";
  bell ab, ba;
  double rns = ring_alone(k, &pg[2].w, n), t0, med, p99;
  long i;
  int st;
  pid_t child;
  bell_open(&ab, k, &pg[0].w);
  bell_open(&ba, k, &pg[1].w);
  fflush(stdout);
  if (split && !pinned) pin(g_cpu[0]);
  if ((child = fork()) < 0) die("fork");
  if (child == 0) { /* B */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (split) pin(g_cpu[1]);
    for (i = 0; i < WARMUPS + n; i++) {
      wait_bell(&ab);
      if (ring(&ba)) die("ring (B)");
    }
    _exit(0);
  }
  alarm(TIMEOUT_S);
  for (i = 0; i < WARMUPS; i++) {
    if (ring(&ab)) die("ring (A)");
    wait_bell(&ba);
  }
  for (i = 0; i < n; i++) {
    t0 = now_ns();
    if (ring(&ab)) die("ring (A)");
    wait_bell(&ba);
    v[i] = now_ns() - t0;
  }
  alarm(0);
  if (waitpid(child, &st, 0) < 0) die("waitpid");
  if (split && !pinned) sched_setaffinity(0, sizeof g_mask, &g_mask);
  bell_close(&ab);
  bell_close(&ba);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || rns < 0) {
    printf("peer=doorbell_%s workload=%s status=failed reason=%s\n",
           kind_name[k], wl, rns < 0 ? "a-ring-alone-failed" : "b-failed");
    return 1;
  }
  med = median(v, (int)n); /* sorts v */
  p99 = v[(size_t)(0.99 * (double)(n - 1))];
  printf("peer=doorbell_%s workload=%s size=1 metric=us_per_roundtrip "
         "value=%.3f n=%ld p99_us=%.3f ring_ns=%.1f pin=%s cpus=%d\n",
         kind_name[k], wl, med / 1e3, n, p99 / 1e3, rns,
         split ? "split" : "none", split ? 2 : cpus);
  return 0;
}

int main(int argc, char **argv) {
  const char *e = getenv("DOORBELL_N"), *p = getenv("DOORBELL_PIN");
  long n = e && *e ? strtol(e, NULL, 0) : 20000;
  int cpus = allowed(g_cpu), split = p && !strcmp(p, "split"), rc = 0, a, k;
  int want[N_KINDS];
  struct slot *pg;
  double *v;
  if (n < 1 || n > MAX_N) return fprintf(stderr, "bad DOORBELL_N\n"), 2;
  for (k = 0; k < N_KINDS; k++) want[k] = argc < 2;
  for (a = 1; a < argc; a++) {
    for (k = 0; k < N_KINDS && strcmp(argv[a], kind_name[k]);) k++;
    if (k == N_KINDS) {
      fprintf(stderr, "usage: %s [futex|eventfd|dgram|stream|spin ...]\n",
              argv[0]);
      return 2;
    }
    want[k] = 1;
  }
  if (split && cpus < 2) {
    printf("peer=doorbell workload=doorbell status=skipped "
           "reason=needs-2-cpus\n");
    return 0;
  }
  g_one_cpu = !split && cpus < 2;
  signal(SIGPIPE, SIG_IGN);
  pg = mmap(NULL, 3 * sizeof *pg, PROT_READ | PROT_WRITE,
            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (pg == MAP_FAILED) die("mmap");
  if (!(v = malloc((size_t)n * sizeof *v))) die("malloc");
  if (split) pin(g_cpu[0]);
  for (k = 0; k < N_KINDS; k++)
    if (want[k]) rc |= run((enum kind)k, pg, n, split, cpus, v);
  free(v);
  return rc;
}
