/* share_demo: two processes share tensors with zero copies.
 *
 * A producer forks a consumer and talks to it over a socketpair(AF_UNIX,
 * SOCK_SEQPACKET) (ipcref_peer_new on each side). For sizes from 4 KiB up to
 * a cap (256 MiB; --max-mib N raises it, e.g. 1024 for 1 GiB), growing x4,
 * it makes tensors in shared memory (ipcref_view_new_shared, u8 and f32 in
 * turn), fills them with a pattern, hands each over with ipcref_send and
 * drops it at once (ipcref_view_release right after the send). The consumer
 * gets each one with ipcref_recv, acks, checks the data against the pattern
 * (first, last and sampled elements), keeps the last tensor of every size
 * and releases the others.
 *
 * What the output shows:
 *   - hand-off time: send -> the consumer has the view (round trip with an
 *     ack, and one way from the shared monotonic clock), the median of a few
 *     hand-offs per size. No byte is copied, so it should be flat across
 *     sizes; the verdict (slowest / fastest round trip within 5x) is printed.
 *     Each hand-off starts once the consumer says it is awake and about to
 *     receive (done checking the last one), so neither its own work nor its
 *     wake-up from sleeping through the fill is timed; and after the same
 *     write of other memory (as large as the largest tensor), so that all
 *     of them run on caches that a fill just evicted, not only the large;
 *     Freeing the tensors the consumer let go of (ipcref_collect before each
 *     hand-off) is timed on its own: the "sweep" column;
 *   - fds: a segment's fd crosses once; small tensors share segments, large
 *     ones get a segment of their own;
 *   - the producer's stats after each size (after ipcref_collect): the
 *     tensors it dropped but the consumer still holds sit in the limbo
 *     (blocks, bytes, live leases), and the consumer still reads them;
 *   - the consumer lets go: the next sweep (ipcref_collect) frees them, and
 *     at the end everything is reclaimed (live bytes, limbo, slots all 0).
 * Any failed check makes the program exit 1.
 *
 *   cc -O2 -I. examples/share_demo.c -o share_demo -pthread
 *   ./share_demo [--max-mib N] */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#define REPS       5     /* hand-offs per size; the consumer keeps the last */
#define MAX_STEPS  16    /* 4 KiB x 4^k up to the cap (and the cap itself) */
#define SAMPLES    64    /* elements checked per tensor */
#define ROW_BYTES  1024  /* shape: [size / 1024, 1024 / element size] */
#define TIMEOUT_MS 60000 /* a stuck peer fails the demo instead of hanging */
#define FLAT       5.0   /* "flat": slowest / fastest median round trip */

/* ---- the schedule (both processes know it: the consumer is forked) ---- */

static size_t g_sizes[MAX_STEPS];
static int g_steps;

static ipcref_dtype step_dtype(int step) {
  return step % 2 ? IPCREF_F32 : IPCREF_U8;
}

static void step_shape(int step, int64_t shape[2]) {
  size_t es = ipcref_dtype_size(step_dtype(step));
  shape[0] = (int64_t)(g_sizes[step] / ROW_BYTES);
  shape[1] = (int64_t)(ROW_BYTES / es);
}

/* Each hand-off has its own seed, so a tensor mixed up with another fails. */
static uint32_t seed_of(int step, int rep) {
  return (uint32_t)(step * REPS + rep + 1);
}

/* Element i of the tensor with seed s. f32 values stay exact (< 2^24). */
static uint8_t pattern_u8(uint64_t i, uint32_t s) {
  return (uint8_t)(i * 7 + (i >> 10) + s * 13);
}
static float pattern_f32(uint64_t i, uint32_t s) {
  return (float)((i & 0xFFFFF) + s);
}

/* Writes as many bytes as the largest tensor has, elsewhere. Filling a
 * tensor evicts the caches in proportion to its size, and what runs next
 * (the send, the consumer's receive) then runs cold: measured here, a
 * 4 KiB hand-off takes 7 us after a 4 KiB fill and 50 us after a 256 MiB
 * one. So every hand-off is timed after the same eviction, and what is
 * left to follow the size is the hand-off's own. */
static void evict_caches(void) {
  static unsigned char *scratch;
  static size_t len;
  static int byte;
  if (!scratch) {
    len = g_sizes[g_steps - 1];
    scratch = (unsigned char *)malloc(len);
    if (!scratch) return;
  }
  memset(scratch, ++byte & 0xff, len); /* a different byte each time */
}

static void fill(const ipcref_view *v, uint32_t s) {
  uint64_t i, n = (uint64_t)ipcref_view_numel(v);
  void *p = ipcref_view_data_mut(v); /* the producer's view is unique */
  if (v->dtype == IPCREF_U8) {
    uint8_t *d = (uint8_t *)p;
    for (i = 0; i < n; i++) d[i] = pattern_u8(i, s);
  } else {
    float *d = (float *)p;
    for (i = 0; i < n; i++) d[i] = pattern_f32(i, s);
  }
}

/* 1 when element i (flat, C order) of v holds the pattern. Reads through
 * ipcref_view_ptr with a 2-D index. */
static int element_ok(const ipcref_view *v, uint64_t i, uint32_t s) {
  int64_t idx[2];
  const void *p;
  idx[0] = (int64_t)(i / (uint64_t)v->shape[1]);
  idx[1] = (int64_t)(i % (uint64_t)v->shape[1]);
  p = ipcref_view_ptr(v, idx);
  if (!p) return 0;
  if (v->dtype == IPCREF_U8) return *(const uint8_t *)p == pattern_u8(i, s);
  return *(const float *)p == pattern_f32(i, s);
}

/* The geometry the consumer expects for this step, and the first and last
 * elements: what the consumer checks before it acks. */
static int quick_check(const ipcref_view *v, int step, uint32_t s) {
  int64_t shape[2];
  uint64_t n;
  step_shape(step, shape);
  if (!v->buf || !ipcref_buf_is_shared(v->buf) ||
      v->dtype != step_dtype(step) || v->ndim != 2 || v->shape[0] != shape[0] ||
      v->shape[1] != shape[1] || !ipcref_view_is_contiguous(v))
    return 0;
  n = (uint64_t)ipcref_view_numel(v);
  return element_ok(v, 0, s) && element_ok(v, n - 1, s);
}

/* Sampled elements all over the tensor (and the first and last again). */
static int full_check(const ipcref_view *v, uint32_t s) {
  uint64_t n = (uint64_t)ipcref_view_numel(v), x = 0x9E3779B97F4A7C15ull * s;
  int k;
  for (k = 0; k < SAMPLES; k++) {
    uint64_t i;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
    i = k == 0 ? 0 : k == 1 ? n - 1 : x % n;
    if (!element_ok(v, i, s)) return 0;
  }
  return 1;
}

/* ---- the control channel: acks and reports (a 2nd socketpair) ---- */

enum { MSG_ACK, MSG_REPORT, MSG_RELEASE_ALL, MSG_QUIT, MSG_GO, MSG_READY };

typedef struct ctl_msg {
  int kind;
  int failures;        /* REPORT: failed checks so far (consumer) */
  double t_view;       /* ACK: when the consumer had the view (ns) */
  uint64_t held;       /* REPORT: tensors the consumer holds */
  uint64_t held_bytes; /* REPORT: their bytes */
  uint64_t received;   /* REPORT: views received so far */
  ipcref_stats stats;  /* REPORT: the consumer's stats */
} ctl_msg;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int ctl_send(int fd, const ctl_msg *m) {
  ssize_t w;
  do w = send(fd, m, sizeof *m, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  return w == (ssize_t)sizeof *m ? 0 : -1;
}

/* 0: got one message; -1: error, time-out or the other side is gone. */
static int ctl_recv(int fd, ctl_msg *m) {
  struct pollfd pfd;
  ssize_t r;
  int n;
  pfd.fd = fd;
  pfd.events = POLLIN;
  do n = poll(&pfd, 1, TIMEOUT_MS);
  while (n < 0 && errno == EINTR);
  if (n != 1) return -1;
  do r = recv(fd, m, sizeof *m, 0);
  while (r < 0 && errno == EINTR);
  return r == (ssize_t)sizeof *m ? 0 : -1;
}

/* ---- the consumer ---- */

static int consumer(int data_fd, int ctl_fd) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *peer = NULL;
  ipcref_view kept[MAX_STEPS];
  ctl_msg m;
  ipcref_result r;
  int step, rep, failures = 0;
  uint64_t received = 0, held_bytes = 0;

  memset(kept, 0, sizeof kept);
  if ((r = ipcref_ctx_new(NULL, &ctx)) != IPCREF_OK ||
      (r = ipcref_peer_new(ctx, data_fd, &peer)) != IPCREF_OK) {
    fprintf(stderr, "consumer: setup: %s\n", ipcref_strerror(r));
    return 1;
  }
  for (step = 0; step < g_steps; step++) {
    for (rep = 0; rep < REPS; rep++) {
      ipcref_view v;
      uint32_t s = seed_of(step, rep);
      memset(&v, 0, sizeof v);
      if (ctl_recv(ctl_fd, &m) || m.kind != MSG_GO) return 1;
      memset(&m, 0, sizeof m);
      m.kind = MSG_READY; /* awake, and about to wait in a receive */
      if (ctl_send(ctl_fd, &m)) return 1;
      r = ipcref_recv(peer, &v, TIMEOUT_MS);
      if (r != IPCREF_OK) {
        fprintf(stderr, "consumer: ipcref_recv: %s\n", ipcref_strerror(r));
        return 1;
      }
      received++;
      if (!quick_check(&v, step, s)) {
        fprintf(stderr, "consumer: tensor %u: wrong geometry or data\n", s);
        failures++;
      }
      memset(&m, 0, sizeof m);
      m.kind = MSG_ACK;
      m.t_view = now_ns();
      if (ctl_send(ctl_fd, &m)) return 1;
      if (!full_check(&v, s)) {
        fprintf(stderr, "consumer: tensor %u: a sampled element is wrong\n", s);
        failures++;
      }
      if (rep == REPS - 1) {
        kept[step] = v; /* keep the last of each size */
        held_bytes += g_sizes[step];
      } else {
        ipcref_view_release(&v);
        /* Unmap what the producer retired and nothing here uses any more
         * (the consumer's side of the sweep; it costs time in proportion
         * to the size freed, so it is done here, after the ack). */
        ipcref_collect(ctx);
      }
    }
    memset(&m, 0, sizeof m);
    m.kind = MSG_REPORT;
    m.failures = failures;
    m.held = (uint64_t)step + 1;
    m.held_bytes = held_bytes;
    m.received = received;
    ipcref_ctx_stats(ctx, &m.stats);
    if (ctl_send(ctl_fd, &m)) return 1;
  }

  /* The producer dropped every tensor long ago: read the kept ones again
   * (all of them still hold their own pattern), then let go. */
  if (ctl_recv(ctl_fd, &m) || m.kind != MSG_RELEASE_ALL) return 1;
  for (step = 0; step < g_steps; step++) {
    if (!quick_check(&kept[step], step, seed_of(step, REPS - 1)) ||
        !full_check(&kept[step], seed_of(step, REPS - 1))) {
      fprintf(stderr, "consumer: kept tensor of step %d changed\n", step);
      failures++;
    }
    ipcref_view_release(&kept[step]);
  }
  memset(&m, 0, sizeof m);
  m.kind = MSG_REPORT;
  m.failures = failures;
  m.received = received;
  ipcref_ctx_stats(ctx, &m.stats);
  if (ctl_send(ctl_fd, &m)) return 1;

  if (ctl_recv(ctl_fd, &m) || m.kind != MSG_QUIT) return 1;
  ipcref_peer_free(peer);
  ipcref_ctx_free(ctx);
  return failures ? 1 : 0;
}

/* ---- the producer ---- */

static int g_failures;

static void expect(int ok, const char *what) {
  if (ok) return;
  printf("  CHECK FAILED: %s\n", what);
  g_failures++;
}

static const char *human(double bytes, char *out, size_t n) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
  if (u == 0 || bytes == (double)(uint64_t)bytes)
    snprintf(out, n, "%.0f %s", bytes, unit[u]);
  else
    snprintf(out, n, "%.1f %s", bytes, unit[u]);
  return out;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void print_stats_line(const char *label, const ipcref_stats *st) {
  char lb[32];
  printf("  %-16s live_bufs %zu, live_bytes %zu, limbo %zu blocks / %s, "
         "live_slots %zu\n",
         label, st->live_bufs, st->live_bytes, st->limbo_blocks,
         human((double)st->limbo_bytes, lb, sizeof lb), st->live_slots);
}

static int producer(ipcref_ctx *ctx, ipcref_peer *peer, int ctl_fd,
                    pid_t child) {
  double rtt_med[MAX_STEPS], one_med[MAX_STEPS], sweep_med;
  ipcref_stats st, st0;
  ctl_msg m;
  ipcref_result r;
  char b1[32], b2[32], b3[32];
  int step, rep, lo = 0, hi = 0;
  size_t freed;
  uint64_t fds_before;

  printf("producer pid %d, consumer pid %d (ipcref_peer_pid: %d)\n",
         (int)getpid(), (int)child, ipcref_peer_pid(peer));
  expect(ipcref_peer_pid(peer) == (int)child,
         "ipcref_peer_pid() names the consumer");
  printf("%d hand-offs per size: make, fill, ipcref_send, ipcref_view_release "
         "at once;\nthe consumer acks when it has the view, checks it, keeps "
         "the last one of each size.\n\n",
         REPS);
  printf("     size dtype shape           one-way round-trip    sweep  fds |  "
         "held      bytes |  limbo      bytes  slots\n");
  ipcref_ctx_stats(ctx, &st0);
  fds_before = st0.fds_sent;
  for (step = 0; step < g_steps; step++) {
    double rtt[REPS], one[REPS], sweep[REPS];
    int64_t shape[2];
    step_shape(step, shape);
    for (rep = 0; rep < REPS; rep++) {
      ipcref_view v;
      double t0, t1;
      memset(&v, 0, sizeof v);
      r = ipcref_view_new_shared(ctx, step_dtype(step), 2, shape, &v);
      if (r != IPCREF_OK) {
        printf("ipcref_view_new_shared(%zu bytes): %s\n", g_sizes[step],
               ipcref_strerror(r));
        return 1;
      }
      fill(&v, seed_of(step, rep));
      evict_caches();
      /* Free what the consumer let go of (the earlier tensors) now, so that
       * returning their memory to the OS is timed on its own, not as part
       * of this hand-off. */
      t0 = now_ns();
      ipcref_collect(ctx);
      sweep[rep] = (now_ns() - t0) / 1e3;
      /* The consumer is done with the last one and awake: the hand-off is
       * timed alone, not behind the consumer's own work nor its wake-up
       * from a long sleep (the fill's; a virtual CPU halted that long can
       * take 100 us and more to wake, so that would follow the size). */
      memset(&m, 0, sizeof m);
      m.kind = MSG_GO;
      if (ctl_send(ctl_fd, &m) || ctl_recv(ctl_fd, &m) || m.kind != MSG_READY) {
        printf("the consumer is not ready\n");
        return 1;
      }
      t0 = now_ns();
      r = ipcref_send(peer, &v);
      ipcref_view_release(&v); /* dropped at once: the consumer keeps it */
      if (r != IPCREF_OK) {
        printf("ipcref_send: %s\n", ipcref_strerror(r));
        return 1;
      }
      if (ctl_recv(ctl_fd, &m) || m.kind != MSG_ACK) {
        printf("no ack from the consumer\n");
        return 1;
      }
      t1 = now_ns();
      rtt[rep] = (t1 - t0) / 1e3;
      one[rep] = (m.t_view - t0) / 1e3;
    }
    if (ctl_recv(ctl_fd, &m) || m.kind != MSG_REPORT) {
      printf("no report from the consumer\n");
      return 1;
    }
    ipcref_collect(ctx); /* the REPS - 1 released ones are freed here */
    ipcref_ctx_stats(ctx, &st);
    sweep_med = median(sweep, REPS);
    rtt_med[step] = median(rtt, REPS);
    one_med[step] = median(one, REPS);
    if (rtt_med[step] < rtt_med[lo]) lo = step;
    if (rtt_med[step] > rtt_med[hi]) hi = step;
    {
      char shp[32];
      snprintf(shp, sizeof shp, "[%lld,%lld]", (long long)shape[0],
               (long long)shape[1]);
      printf("%9s %-5s %-13s %9.1f %10.1f %8.1f %4llu | %5llu %10s | %6zu %10s "
             "%6zu\n",
             human((double)g_sizes[step], b1, sizeof b1),
             ipcref_dtype_name(step_dtype(step)), shp, one_med[step],
             rtt_med[step], sweep_med,
             (unsigned long long)(st.fds_sent - fds_before),
             (unsigned long long)m.held,
             human((double)m.held_bytes, b2, sizeof b2), st.limbo_blocks,
             human((double)st.limbo_bytes, b3, sizeof b3), st.live_slots);
    }
    fds_before = st.fds_sent;
    expect(m.failures == 0, "the consumer's data checks");
    expect(st.limbo_blocks == m.held,
           "limbo blocks == tensors the consumer holds");
    expect(st.limbo_bytes >= m.held_bytes,
           "limbo bytes cover the tensors the consumer holds");
    expect(st.live_slots == m.held, "live slots == tensors the consumer holds");
    expect(st.live_bufs == 0, "the producer holds no tensor of its own");
  }

  printf(
      "\n  one-way     send -> the consumer has the view (us; median of %d)\n"
      "  round-trip  send -> the consumer's ack is back (us; median of %d)\n"
      "  sweep       ipcref_collect before each hand-off, untimed in it: frees "
      "what\n"
      "              the consumer let go of (us; median)\n"
      "  fds         fds sent for this size: a segment's fd crosses once\n"
      "  held        tensors the consumer keeps (the last of each size)\n"
      "  limbo       the producer's limbo after the step's ipcref_collect: "
      "dropped\n"
      "              here, still held there; slots: live leases\n",
      REPS, REPS);
  {
    double spread = rtt_med[hi] / rtt_med[lo];
    double grew = (double)g_sizes[g_steps - 1] / (double)g_sizes[0];
    printf("\nround trip %.1f us (%s) .. %.1f us (%s): %.1fx, while the size "
           "grew %.0fx:\n",
           rtt_med[lo], human((double)g_sizes[lo], b1, sizeof b1), rtt_med[hi],
           human((double)g_sizes[hi], b2, sizeof b2), spread, grew);
    if (spread <= FLAT)
      printf("flat. No byte is copied: the time does not follow the size.\n");
    else
      printf("NOT flat (more than %.0fx): something on the hand-off path "
             "follows the size.\n",
             FLAT);
  }

  /* The consumer lets go of everything it kept. */
  memset(&m, 0, sizeof m);
  m.kind = MSG_RELEASE_ALL;
  if (ctl_send(ctl_fd, &m) || ctl_recv(ctl_fd, &m) || m.kind != MSG_REPORT) {
    printf("no report from the consumer\n");
    return 1;
  }
  printf("\nthe consumer re-read its %d kept tensors (dropped here long ago: "
         "%s), then released them\n",
         g_steps, m.failures ? "SOME CHANGED" : "all intact");
  expect(m.failures == 0, "the kept tensors are intact");
  expect(m.stats.imported_bufs == 0, "the consumer holds no imported buffer");
  ipcref_ctx_stats(ctx, &st);
  print_stats_line("before a sweep:", &st);
  freed = ipcref_collect(ctx);
  printf("  ipcref_collect() freed %s\n", human((double)freed, b1, sizeof b1));
  ipcref_ctx_stats(ctx, &st);
  print_stats_line("after it:", &st);
  expect(st.limbo_blocks == 0 && st.limbo_bytes == 0, "the limbo is empty");
  expect(st.live_slots == 0, "every lease came back");
  printf("consumer: %llu views received, %llu fds received, %zu segments "
         "mapped, %zu imported buffers alive\n",
         (unsigned long long)m.received,
         (unsigned long long)m.stats.fds_received, m.stats.mapped_segments,
         m.stats.imported_bufs);
  expect(m.received == (uint64_t)g_steps * REPS, "every view arrived");

  memset(&m, 0, sizeof m);
  m.kind = MSG_QUIT;
  ctl_send(ctl_fd, &m);
  ipcref_peer_free(peer);
  ipcref_ctx_stats(ctx, &st);
  printf("\nat the end (consumer gone, peer freed):\n");
  printf("  live_bufs %zu, live_bytes %zu, limbo %zu / %zu bytes, live_slots "
         "%zu, peers %zu, segments mapped %zu (%s kept for reuse), fds sent "
         "%llu, sweeps %llu\n",
         st.live_bufs, st.live_bytes, st.limbo_blocks, st.limbo_bytes,
         st.live_slots, st.peers, st.mapped_segments,
         human((double)st.segment_bytes, b1, sizeof b1),
         (unsigned long long)st.fds_sent, (unsigned long long)st.sweeps);
  expect(st.live_bufs == 0 && st.live_bytes == 0, "live bytes 0");
  expect(st.limbo_blocks == 0 && st.limbo_bytes == 0, "limbo 0");
  expect(st.live_slots == 0, "live slots 0");
  expect(st.peers == 0, "no peer left");
  return 0;
}

static int usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--max-mib N]   (largest tensor, default 256 MiB)\n",
          argv0);
  return 2;
}

int main(int argc, char **argv) {
  size_t cap = (size_t)256 << 20, s;
  int sv[2], cv[2], i, status, rc;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *peer = NULL;
  ipcref_result r;
  pid_t pid;
  char b1[32];

  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--max-mib") && i + 1 < argc) {
      char *end;
      unsigned long long mib = strtoull(argv[++i], &end, 10);
      if (*end || mib < 1 || mib > ((size_t)-1 >> 21)) return usage(argv[0]);
      cap = (size_t)mib << 20;
    } else {
      return usage(argv[0]);
    }
  }
  for (s = 4096; s <= cap && g_steps < MAX_STEPS - 1; s *= 4)
    g_sizes[g_steps++] = s;
  if (g_sizes[g_steps - 1] != cap) g_sizes[g_steps++] = cap;

  printf("share_demo: tensors of 4 KiB .. %s cross to another process "
         "without a copy\n",
         human((double)cap, b1, sizeof b1));
  signal(SIGPIPE, SIG_IGN);
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) ||
      socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, cv)) {
    perror("socketpair");
    return 1;
  }
  fflush(stdout);
  pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) { /* the consumer: its own ctx, made after the fork */
    close(sv[0]);
    close(cv[0]);
    _exit(consumer(sv[1], cv[1]));
  }
  close(sv[1]);
  close(cv[1]);
  if ((r = ipcref_ctx_new(NULL, &ctx)) != IPCREF_OK ||
      (r = ipcref_peer_new(ctx, sv[0], &peer)) != IPCREF_OK) {
    printf("producer: setup: %s\n", ipcref_strerror(r));
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return 1;
  }
  rc = producer(ctx, peer, cv[0], pid);
  if (rc) {
    ipcref_peer_free(peer); /* the consumer sees the hang-up */
    kill(pid, SIGKILL);
  }
  close(cv[0]);
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    printf("the consumer failed (status %d)\n", status);
    rc = 1;
  }
  if (!rc) ipcref_ctx_free(ctx);
  if (rc || g_failures) {
    if (g_failures)
      printf("\nFAILED (%d checks)\n", g_failures);
    else
      printf("\nFAILED\n");
    return 1;
  }
  printf("\nall checks passed\n");
  return 0;
}
