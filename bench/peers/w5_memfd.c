/* W5 peer in C, c_memfd_fresh: a stream of fresh tensors with raw memfds,
 * the same work as bench/w5_stream.c does with ipcref (README.md here).
 * For each item the producer (this process) makes a NEW tensor:
 * memfd_create + ftruncate + mmap, fills every byte (memset of the item's
 * byte), sends the fd with sendmsg(SCM_RIGHTS) over a socketpair, then
 * munmap()s and close()s its own; a forked consumer recvmsg()s the fd,
 * mmap()s it read-only, reads one byte per 4096-byte page (their sum is
 * checked), munmap()s, close()s and acks with 1 byte on a second
 * socketpair.
 *   STREAM     one timed item (the producer's view)
 *   seq        one in flight: make .. ack received
 *   inflight4  the producer runs 4 ahead: wait for ack i-4, then make, fill
 *              and send tensor i (its period: a throughput)
 *   mixed      as seq, the sizes cycling 4, 24, 64 MiB (SIZE 0; printed
 *              as size=0)
 * Items are timed one by one for SECONDS after 2 warm-ups (inflight4: after
 * the 4 that fill the window), at least W5_MIN_ITEMS (default 8) and, once
 * that many are timed, no more than W5_MAX_BYTES (default 2 GiB) in all.
 * Printed: us_median (n, mean, p99 as extras), us_p99, us_per_tensor (the
 * mean), consumer_peak_kb (the largest VmRSS the consumer saw, sampled
 * after reading each item before unmapping it; base_kb = its VmRSS before
 * the first item) and held_kb (window x largest size).
 * Environment: W5_ID = the setup (w5_1cpu, w5_2cpu; default w5), printed
 * as workload $W5_ID_STREAM; W5_PIN=split = the producer on the first and
 * the consumer on the second allowed CPU.
 * Build: gcc -O2 -std=gnu11 -I.. w5_memfd.c -o w5_memfd
 * Run:   ./w5_memfd seq|inflight4|mixed SIZE [SECONDS=1.0] */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
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

#define WARMUPS     2
#define MAX_N       1000000
#define PAGE        4096
#define MIB         ((size_t)1 << 20)
#define ACK_WAIT_MS 60000 /* a consumer silent this long fails the row */
#define DEFAULT_CAP ((double)((size_t)2 << 30))
#define MAX_SIZES   3

static const char *const g_peer = "c_memfd_fresh";
static char g_wl[64] = "w5";
static int g_window = 1, g_nsizes = 1, g_cpu[2];
static size_t g_sizes[MAX_SIZES];
static volatile uint64_t g_sink;

static _Noreturn void fail(const char *what) {
  fprintf(stderr, "%s %s: %s: %s\n", g_peer, g_wl, what, strerror(errno));
  exit(2);
}

static void put_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write");
    c += w;
    n -= (size_t)w;
  }
}

/* The length of the message read (up to n bytes); 0: end of file, or
 * ACK_WAIT_MS of silence (which fails the caller). */
static size_t get_msg(int fd, void *p, size_t n) {
  struct pollfd pf = {fd, POLLIN, 0};
  ssize_t r;
  int k;
  while ((k = poll(&pf, 1, ACK_WAIT_MS)) < 0)
    if (errno != EINTR) fail("poll");
  if (k == 0) return 0;
  while ((r = read(fd, p, n)) < 0)
    if (errno != EINTR) fail("read");
  return (size_t)r;
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

/* The fd received, or -1 at end of file. */
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

/* VmRSS in kB, from /proc/self/statm (opened once, read again with pread). */
static uint64_t rss_kb(int statm) {
  char b[128];
  unsigned long long size = 0, resident = 0;
  ssize_t r = pread(statm, b, sizeof b - 1, 0);
  if (r <= 0) return 0;
  b[r] = 0;
  if (sscanf(b, "%llu %llu", &size, &resident) != 2) return 0;
  return resident * (uint64_t)sysconf(_SC_PAGESIZE) / 1024;
}

static unsigned char fill_byte(uint64_t i) {
  return (unsigned char)(i % 251 + 1); /* never 0: a fresh page reads 0 */
}

static size_t item_size(uint64_t i) {
  return g_sizes[i % (size_t)g_nsizes];
}

static size_t largest_size(void) {
  size_t m = 0;
  for (int k = 0; k < g_nsizes; k++)
    if (g_sizes[k] > m) m = g_sizes[k];
  return m;
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

/* ---- the consumer (a forked child) -------------------------------------- */

/* One byte per page of item k; 1 when they hold what the producer wrote. */
static int read_item(const unsigned char *b, size_t n, uint64_t k) {
  uint64_t sum = 0, pages = 0;
  for (size_t off = 0; off < n; off += PAGE, pages++) sum += b[off];
  g_sink += sum;
  return sum == pages * fill_byte(k);
}

static _Noreturn void consume(int in, int ack) {
  uint64_t rep[2]; /* peak_kb, base_kb */
  int statm = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  const char one = 1;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  rep[0] = rep[1] = rss_kb(statm);
  for (uint64_t k = 0;; k++) {
    uint64_t len, kb;
    int fd = recv_with_fd(in, &len), ok;
    unsigned char *m;
    if (fd < 0) break;
    if (len != item_size(k)) _exit(3);
    m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) fail("mmap");
    ok = read_item(m, len, k);
    if ((kb = rss_kb(statm)) > rep[0]) rep[0] = kb;
    munmap(m, len);
    close(fd);
    if (!ok) _exit(3);
    put_all(ack, &one, 1);
  }
  put_all(ack, rep, sizeof rep);
  _exit(0);
}

/* ---- the producer ------------------------------------------------------- */

static int to_consumer = -1, from_consumer = -1;

/* A new memfd of tensor i's size, filled, sent; ours unmapped and closed. */
static void produce(uint64_t i) {
  size_t size = item_size(i);
  int fd = memfd_create("w5-peer", MFD_CLOEXEC);
  unsigned char *m;
  if (fd < 0 || ftruncate(fd, (off_t)size)) fail("memfd");
  m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) fail("mmap");
  memset(m, fill_byte(i), size);
  send_with_fd(to_consumer, fd, size);
  munmap(m, size);
  close(fd);
}

static void wait_ack(void) {
  char a;
  if (!get_msg(from_consumer, &a, 1)) {
    errno = EPIPE;
    fail("the consumer died or went silent");
  }
}

/* One item, in ns: seq waits for its own ack, a window for ack i-window. */
static double one_item(uint64_t i) {
  double t0 = now_ns();
  if (g_window > 1 && i >= (uint64_t)g_window) wait_ack();
  produce(i);
  if (g_window == 1) wait_ack();
  return now_ns() - t0;
}

static size_t env_size(const char *name, size_t dflt) {
  const char *e = getenv(name);
  return e && *e ? (size_t)strtod(e, NULL) : dflt;
}

/* Runs the stream; returns the timed items' ns (malloc'd), *n of them. */
static double *run(double secs, size_t *n) {
  uint64_t i = 0, untimed = g_window > WARMUPS ? g_window : WARMUPS;
  size_t cap = 1024, min_items = env_size("W5_MIN_ITEMS", 8);
  double max_bytes = (double)env_size("W5_MAX_BYTES", (size_t)DEFAULT_CAP);
  double *t = malloc(cap * sizeof *t), t0, bytes = 0;
  if (!t) fail("malloc");
  while (i < untimed) one_item(i++);
  *n = 0;
  t0 = now_ns();
  do {
    if (*n == cap && !(t = realloc(t, (cap *= 2) * sizeof *t))) fail("realloc");
    bytes += (double)item_size(i);
    t[(*n)++] = one_item(i++);
  } while (*n < MAX_N && (*n < min_items ||
                          (now_ns() - t0 < secs * 1e9 && bytes < max_bytes)));
  for (int k = g_window > 1 ? g_window : 0; k > 0; k--) wait_ack();
  return t;
}

static void line(const char *metric, double value, const char *extra) {
  printf("peer=%s workload=%s size=%zu metric=%s value=%.3f%s\n", g_peer, g_wl,
         g_nsizes > 1 ? (size_t)0 : g_sizes[0], metric, value, extra);
}

static void report(double *t, size_t n, const uint64_t rep[2]) {
  double sum = 0, med, p99;
  size_t held = (size_t)g_window * largest_size() / 1024;
  char extra[160];
  for (size_t k = 0; k < n; k++) sum += t[k];
  med = median(t, (int)n); /* sorts t */
  p99 = t[(size_t)(0.99 * (double)(n - 1))];
  snprintf(extra, sizeof extra, " n=%zu mean=%.3f p99=%.3f", n,
           sum / (double)n / 1e3, p99 / 1e3);
  line("us_median", med / 1e3, extra);
  line("us_p99", p99 / 1e3, "");
  line("us_per_tensor", sum / (double)n / 1e3, "");
  snprintf(extra, sizeof extra, " base_kb=%llu held_kb=%zu",
           (unsigned long long)rep[1], held);
  line("consumer_peak_kb", (double)rep[0], extra);
  line("held_kb", (double)held, "");
}

/* The stream variant and sizes from argv; 0 when they make no sense. */
static int parse(int argc, char **argv) {
  const char *id = getenv("W5_ID");
  if (argc < 3) return 0;
  if (!strcmp(argv[1], "mixed")) {
    g_nsizes = 3;
    g_sizes[0] = 4 * MIB, g_sizes[1] = 24 * MIB, g_sizes[2] = 64 * MIB;
  } else if (!strcmp(argv[1], "seq") || !strcmp(argv[1], "inflight4")) {
    g_window = argv[1][0] == 'i' ? 4 : 1;
    if ((g_sizes[0] = strtoull(argv[2], NULL, 0)) < PAGE) return 0;
  } else {
    return 0;
  }
  snprintf(g_wl, sizeof g_wl, "%s_%s", id && *id ? id : "w5", argv[1]);
  return 1;
}

int main(int argc, char **argv) {
  int split, data[2], ack[2], st;
  uint64_t rep[2];
  double *t;
  size_t n;
  pid_t child;
  if (!parse(argc, argv)) {
    fprintf(stderr, "usage: %s seq|inflight4|mixed SIZE [SECONDS]\n", argv[0]);
    return 2;
  }
  split = getenv("W5_PIN") && !strcmp(getenv("W5_PIN"), "split");
  if (split && !first_two_cpus()) {
    printf("peer=%s workload=%s status=skipped reason=needs-2-allowed-cpus\n",
           g_peer, g_wl);
    return 0;
  }
  signal(SIGPIPE, SIG_IGN);
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, data) ||
      socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ack))
    fail("socketpair");
  fflush(stdout);
  if ((child = fork()) < 0) fail("fork");
  if (child == 0) {
    if (split) pin_to(1);
    close(data[0]);
    close(ack[0]);
    consume(data[1], ack[1]);
  }
  if (split) pin_to(0);
  close(data[1]);
  close(ack[1]);
  to_consumer = data[0];
  from_consumer = ack[0];

  t = run(argc > 3 ? atof(argv[3]) : 1.0, &n);
  close(to_consumer); /* the consumer sees the end, reports, exits */
  if (get_msg(from_consumer, rep, sizeof rep) != sizeof rep) {
    errno = EPIPE;
    fail("no consumer report");
  }
  if (waitpid(child, &st, 0) < 0) fail("waitpid");
  if (!WIFEXITED(st) || WEXITSTATUS(st)) {
    printf("peer=%s workload=%s status=failed reason=consumer-%s-%d\n", g_peer,
           g_wl, WIFEXITED(st) ? "exit" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return 1;
  }
  report(t, n, rep);
  free(t);
  return 0;
}
