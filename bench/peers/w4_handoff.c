/* W4 peers in C: how a buffer of SIZE bytes is handed to another process
 * without ipcref. The producer (this process) forks a consumer; one hand-off
 * is: the producer makes the buffer available, the consumer receives it,
 * checks its first and last byte, lets it go and acks; the producer has the
 * ack. Before each hand-off (not timed) the producer writes the hand-off
 * number into the first and the last byte.
 *   MODE         peer           one hand-off
 *   pipe_copy    c_pipe_copy    write() of the SIZE bytes into a pipe (default
 *                               capacity); the consumer read()s them into its
 *                               own buffer, touched beforehand and reused; a
 *                               1-byte ack through a second pipe
 *   socket_copy  c_socket_copy  the same through a socketpair(AF_UNIX,
 *                               SOCK_STREAM); the ack on the same socket
 *   memfd_scm    c_memfd_scm    one memfd, made and filled once, sent with
 *                               sendmsg(SCM_RIGHTS) every time; the consumer
 *                               recvmsg()s, mmap()s SIZE bytes, checks,
 *                               munmap()s, close()s: zero-copy when the fd
 *                               crosses every time
 *   msg64        c_msg64        a 64-byte message (sequence, offset, length)
 *                               over a socketpair; the consumer mapped the
 *                               memfd once, at setup: zero-copy into a
 *                               mapping both sides already have; the ack on
 *                               the same socket
 *   msg64_2sock  c_msg64_2sock  the same, the ack through a second
 *                               socketpair, as ipcref's W4 rows ack. Not
 *                               the same cost: with one socket, the
 *                               consumer's read of the message frees its
 *                               buffer, and the kernel wakes whoever waits
 *                               on the other end for room or data: the
 *                               producer, asleep for the ack, is woken
 *                               early, and so is the consumer when the
 *                               producer reads the ack. Each wake-up
 *                               starts before it is needed, and its
 *                               latency is partly hidden (here, on two
 *                               CPUs, 4-9 us of a 45 us hand-off; on one,
 *                               the early wake-up is a switch too many and
 *                               costs). With two sockets, each process is
 *                               woken by what it waits for
 *   shm_spin     c_shm_spin     no system call: the producer stores a sequence
 *                               number in a shared page and spins until the
 *                               consumer stores it back; both processes
 *                               pinned to two CPUs (skipped with one): the
 *                               floor of a polled shared-memory ring
 * The buffer is one per run, made and touched once. Hand-offs are timed one
 * by one for SECONDS after 3 warm-ups: us_per_handoff = the median (n, mean,
 * p99 as extra fields), GBps = SIZE / median (bytes made available per
 * second, not a copy bandwidth for the zero-copy modes).
 * Environment: W4_ID = the workload id printed (default w4); W4_PIN=split =
 * the producer on the first and the consumer on the second allowed CPU.
 * Build: gcc -O2 -std=gnu11 -I.. w4_handoff.c -o w4_handoff
 * Run:   ./w4_handoff MODE SIZE [SECONDS=1.0] */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define WARMUPS 3
#define MAX_N   50000000
#define STOP    UINT64_MAX

enum mode {
  PIPE_COPY,
  SOCKET_COPY,
  MEMFD_SCM,
  MSG64,
  MSG64_2SOCK,
  SHM_SPIN,
  N_MODES
};
static const char *const mode_name[N_MODES] = {"pipe_copy",   "socket_copy",
                                               "memfd_scm",   "msg64",
                                               "msg64_2sock", "shm_spin"};

struct msg64 { /* what a real ring entry would carry */
  uint64_t seq, offset, length, spare[5];
};
struct spin_page {
  _Alignas(64) _Atomic uint64_t posted;
  _Alignas(64) _Atomic uint64_t taken;
};

static enum mode g_mode;
static size_t S;
static const char *g_wl = "w4";
static char g_peer[32];
static int g_cpu[2];
static pid_t g_child;

static _Noreturn void fail(const char *what) {
  fprintf(stderr, "%s size=%zu: %s: %s\n", g_peer, S, what, strerror(errno));
  exit(2);
}

static void put(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write");
    c += w;
    n -= (size_t)w;
  }
}

/* 1: n bytes read; 0: end of file before the first byte */
static int get(int fd, void *p, size_t n) {
  char *c = p;
  size_t have = 0;
  while (have < n) {
    ssize_t r = read(fd, c + have, n - have);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("read");
    if (r == 0) {
      if (have == 0) return 0;
      errno = EPIPE;
      fail("short read");
    }
    have += (size_t)r;
  }
  return 1;
}

static void send_with_fd(int sock, int fd, uint64_t word) {
  union {
    char space[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {&word, sizeof word};
  struct msghdr m;
  struct cmsghdr *c;
  memset(&ctl, 0, sizeof ctl);
  memset(&m, 0, sizeof m);
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl.space;
  m.msg_controllen = sizeof ctl.space;
  c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  while (sendmsg(sock, &m, MSG_NOSIGNAL) < 0)
    if (errno != EINTR) fail("sendmsg");
}

/* the fd received, or -1 at end of file */
static int recv_with_fd(int sock, uint64_t *word) {
  union {
    char space[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {word, sizeof *word};
  struct msghdr m;
  struct cmsghdr *c;
  ssize_t r;
  int fd;
  memset(&m, 0, sizeof m);
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl.space;
  m.msg_controllen = sizeof ctl.space;
  while ((r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC)) < 0)
    if (errno != EINTR) fail("recvmsg");
  if (r == 0) return -1;
  c = CMSG_FIRSTHDR(&m);
  if (r != sizeof *word || !c || c->cmsg_type != SCM_RIGHTS) {
    errno = EPROTO;
    fail("recvmsg without an fd");
  }
  memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

static int first_two_cpus(void) {
  cpu_set_t set;
  int k = 0;
  if (sched_getaffinity(0, sizeof set, &set)) return 0;
  for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &set)) g_cpu[k++] = c;
  return k == 2;
}

static void pin_to(int which) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(g_cpu[which], &set);
  if (sched_setaffinity(0, sizeof set, &set)) fail("sched_setaffinity");
}

static inline void relax(unsigned *spins) {
  if ((++*spins & 0xffff) == 0) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

static int holds(const unsigned char *b, uint64_t k) {
  unsigned char e = (unsigned char)k;
  return b[0] == e && b[S - 1] == e;
}

/* ---- the consumer (a forked child) -------------------------------------- */

static _Noreturn void consume(int in, int ack, int memfd, unsigned char *buf,
                              struct spin_page *page) {
  unsigned char *mine = NULL, *map = NULL;
  const char one = 1;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (g_mode == PIPE_COPY || g_mode == SOCKET_COPY) {
    if (!(mine = malloc(S))) fail("malloc");
    memset(mine, 0, S);
  } else if (g_mode == MSG64 || g_mode == MSG64_2SOCK) {
    map = mmap(NULL, S, PROT_READ, MAP_SHARED, memfd, 0);
    if (map == MAP_FAILED) fail("mmap");
  }
  for (uint64_t k = 0;; k++) {
    switch (g_mode) {
    case PIPE_COPY:
    case SOCKET_COPY:
      if (!get(in, mine, S)) _exit(0);
      if (!holds(mine, k)) _exit(3);
      break;
    case MEMFD_SCM: {
      uint64_t len;
      int fd = recv_with_fd(in, &len);
      unsigned char *m;
      int ok;
      if (fd < 0) _exit(0);
      m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) fail("mmap");
      ok = holds(m, k);
      munmap(m, len);
      close(fd);
      if (!ok) _exit(3);
      break;
    }
    case MSG64:
    case MSG64_2SOCK: {
      struct msg64 m;
      if (!get(in, &m, sizeof m)) _exit(0);
      if (m.seq != k || !holds(map + m.offset, k)) _exit(3);
      break;
    }
    case SHM_SPIN: {
      uint64_t v;
      unsigned spins = 0;
      while ((v = atomic_load_explicit(&page->posted, memory_order_acquire)) ==
             k)
        relax(&spins);
      if (v == STOP) _exit(0);
      if (!holds(buf, k)) _exit(3);
      atomic_store_explicit(&page->taken, v, memory_order_release);
      continue; /* the store above is the ack */
    }
    default: _exit(2);
    }
    put(ack, &one, 1);
  }
}

/* ---- the producer ------------------------------------------------------- */

static int to_consumer = -1, from_consumer = -1, g_memfd = -1;
static unsigned char *g_buf;
static struct spin_page *g_page;

static void hand_off(uint64_t i) {
  char a;
  switch (g_mode) {
  case PIPE_COPY:
  case SOCKET_COPY: put(to_consumer, g_buf, S); break;
  case MEMFD_SCM: send_with_fd(to_consumer, g_memfd, S); break;
  case MSG64:
  case MSG64_2SOCK: {
    struct msg64 m;
    memset(&m, 0, sizeof m);
    m.seq = i;
    m.length = S;
    put(to_consumer, &m, sizeof m);
    break;
  }
  case SHM_SPIN: {
    unsigned spins = 0;
    atomic_store_explicit(&g_page->posted, i + 1, memory_order_release);
    while (atomic_load_explicit(&g_page->taken, memory_order_acquire) !=
           i + 1) {
      relax(&spins);
      if ((spins & 0xfffff) == 0 && waitpid(g_child, NULL, WNOHANG) != 0) {
        errno = ECHILD;
        fail("consumer gone");
      }
    }
    return;
  }
  default: return;
  }
  if (!get(from_consumer, &a, 1)) {
    errno = EPIPE;
    fail("consumer gone");
  }
}

static void stop_consumer(void) {
  if (g_mode == SHM_SPIN) {
    atomic_store_explicit(&g_page->posted, STOP, memory_order_release);
    return;
  }
  close(to_consumer);
  if (from_consumer != to_consumer) close(from_consumer);
}

int main(int argc, char **argv) {
  int split, cons_in = -1, cons_ack = -1, st;
  double secs, start, sum = 0, med, *t;
  size_t n = 0, cap = 1 << 16;
  uint64_t i = 0;

  g_mode = N_MODES;
  for (int m = 0; argc > 1 && m < N_MODES; m++)
    if (!strcmp(argv[1], mode_name[m])) g_mode = (enum mode)m;
  if (argc < 3 || g_mode == N_MODES) {
    fprintf(stderr,
            "usage: %s pipe_copy|socket_copy|memfd_scm|msg64|msg64_2sock|"
            "shm_spin "
            "SIZE [SECONDS]\n",
            argv[0]);
    return 2;
  }
  snprintf(g_peer, sizeof g_peer, "c_%s", mode_name[g_mode]);
  S = strtoull(argv[2], NULL, 0);
  secs = argc > 3 ? atof(argv[3]) : 1.0;
  if (S < 1) return 2;
  if (getenv("W4_ID") && *getenv("W4_ID")) g_wl = getenv("W4_ID");
  split = g_mode == SHM_SPIN ||
          (getenv("W4_PIN") && !strcmp(getenv("W4_PIN"), "split"));
  if (split && !first_two_cpus()) {
    printf("peer=%s workload=%s size=%zu status=skipped "
           "reason=needs-2-allowed-cpus\n",
           g_peer, g_wl, S);
    return 0;
  }
  signal(SIGPIPE, SIG_IGN);

  if (g_mode == PIPE_COPY) {
    int data[2], ack[2];
    if (pipe2(data, O_CLOEXEC) || pipe2(ack, O_CLOEXEC)) fail("pipe");
    to_consumer = data[1];
    cons_in = data[0];
    cons_ack = ack[1];
    from_consumer = ack[0];
  } else if (g_mode != SHM_SPIN) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
      fail("socketpair");
    to_consumer = from_consumer = sv[0];
    cons_in = cons_ack = sv[1];
    if (g_mode == MSG64_2SOCK) { /* the ack on a socketpair of its own */
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
        fail("socketpair");
      from_consumer = sv[0];
      cons_ack = sv[1];
    }
  }
  if (g_mode == PIPE_COPY || g_mode == SOCKET_COPY) {
    if (!(g_buf = malloc(S))) fail("malloc");
  } else {
    g_memfd = memfd_create("w4-peer", MFD_CLOEXEC);
    if (g_memfd < 0 || ftruncate(g_memfd, (off_t)S)) fail("memfd");
    g_buf = mmap(NULL, S, PROT_READ | PROT_WRITE, MAP_SHARED, g_memfd, 0);
    if (g_buf == MAP_FAILED) fail("mmap");
  }
  memset(g_buf, 0xee, S); /* made and touched once */
  if (g_mode == SHM_SPIN) {
    g_page = mmap(NULL, sizeof *g_page, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_page == MAP_FAILED) fail("mmap");
  }

  fflush(stdout);
  g_child = fork();
  if (g_child < 0) fail("fork");
  if (g_child == 0) {
    if (split) pin_to(1);
    if (to_consumer >= 0) close(to_consumer);
    if (from_consumer >= 0 && from_consumer != to_consumer)
      close(from_consumer);
    consume(cons_in, cons_ack, g_memfd, g_buf, g_page);
  }
  if (split) pin_to(0);
  if (cons_in >= 0) close(cons_in);
  if (cons_ack >= 0 && cons_ack != cons_in) close(cons_ack);

  if (!(t = malloc(cap * sizeof *t))) fail("malloc");
  for (int w = 0; w < WARMUPS; w++, i++) {
    g_buf[0] = g_buf[S - 1] = (unsigned char)i;
    hand_off(i);
  }
  start = now_ns();
  do {
    double t0;
    g_buf[0] = g_buf[S - 1] = (unsigned char)i;
    t0 = now_ns();
    hand_off(i++);
    if (n == cap && !(t = realloc(t, (cap *= 2) * sizeof *t))) fail("realloc");
    t[n] = now_ns() - t0;
    sum += t[n++];
  } while ((n < 5 || now_ns() - start < secs * 1e9) && n < MAX_N);

  stop_consumer();
  if (waitpid(g_child, &st, 0) < 0) fail("waitpid");
  if (!WIFEXITED(st) || WEXITSTATUS(st)) {
    printf("peer=%s workload=%s size=%zu status=failed reason=consumer-%s-%d\n",
           g_peer, g_wl, S, WIFEXITED(st) ? "exit" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return 1;
  }
  med = median(t, (int)n); /* sorts t */
  printf("peer=%s workload=%s size=%zu metric=us_per_handoff value=%.3f n=%zu "
         "mean=%.3f p99=%.3f\n",
         g_peer, g_wl, S, med / 1e3, n, sum / (double)n / 1e3,
         t[(size_t)(0.99 * (double)(n - 1))] / 1e3);
  printf("peer=%s workload=%s size=%zu metric=GBps value=%.3f\n", g_peer, g_wl,
         S, (double)S / med);
  free(t);
  return 0;
}
