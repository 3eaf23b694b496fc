/* W4 cross-process hand-off for ipcref, defined as the peers define it
 * (bench/peers/w4_handoff.c and README.md). The producer (parent)
 * hands a buffer of SIZE bytes to a forked consumer, which receives it, reads
 * and checks its first and last byte, releases it and acks; one hand-off =
 * producer start .. ack received. Before each hand-off the producer writes
 * the first and the last byte. Timed one by one for SECONDS after 3
 * warm-ups; us_per_handoff = the median (n, mean, p99 as extras), GBps =
 * SIZE / median.
 *   MODE          peer              what a hand-off is
 *   ipcref        ipcref            the socket path (ring_bytes
 *                                   IPCREF_KEEP_NONE on both peers: no
 *                                   channel): ipcref_send of a view of one
 *                                   shared buffer (ipcref_shared_new,
 *                                   allocated and filled once; the producer
 *                                   keeps its reference); the consumer
 *                                   ipcref_recv, reads, checks,
 *                                   ipcref_view_release, acks (1 byte on a
 *                                   socket). Its segment crossed at the
 *                                   first hand-off: compare with c_msg64
 *   first         ipcref_first      the FIRST hand-off of a new segment
 *                                   (socket path, as ipcref): each iteration
 *                                   allocates a new buffer that gets a
 *                                   segment of its own (segment_size 4096,
 *                                   the smallest: blocks over half a segment
 *                                   get their own; no segment cache), so its
 *                                   memfd crosses and the consumer maps it.
 *                                   The allocation (and writing the two
 *                                   bytes) and the producer's release after
 *                                   the ack are not timed, as c_memfd_scm's
 *                                   memfd is made once. Every timed hand-off
 *                                   must send an fd (ipcref_stats.fds_sent),
 *                                   else the row fails. Compare with
 *                                   c_memfd_scm
 *   chan_spin     ipcref_chan_spin  as ipcref through the channel (the
 *                                   default 64 KiB ring), the consumer
 *                                   spinning W4_SPIN_US (default 50, a fixed
 *                                   budget: the adaptive one's ceiling)
 *                                   before it sleeps; the ack through shared
 *                                   memory as c_shm_spin's: the consumer
 *                                   stores the hand-off's number in a
 *                                   MAP_SHARED page made before the fork,
 *                                   the producer spins on it (pause; a
 *                                   sched_yield every 64Ki looks, or after
 *                                   each look where both may only share one
 *                                   CPU). Pinned as c_shm_spin is: producer
 *                                   and consumer on two CPUs wherever two
 *                                   are allowed (w4 too); under one CPU
 *                                   (w4_1cpu) both share it. Compare with
 *                                   c_shm_spin and iceoryx (busy-polling).
 *                                   Paired with a bare spin: the timed
 *                                   hand-offs go in blocks of PAIR_BLOCK,
 *                                   every other block through the channel
 *                                   and every other as c_shm_spin makes
 *                                   one (a sequence number in the shared
 *                                   page; the consumer checks the first
 *                                   and last byte of a buffer both
 *                                   processes mapped before the fork and
 *                                   acks the same way). A second line,
 *                                   metric=pair_ratio, says value / the
 *                                   bare spin's median (bare_us=): the
 *                                   ratio of the two measured in the same
 *                                   second, where this machine's
 *                                   cross-CPU speed changes threefold from
 *                                   one minute to the next (a ratio to
 *                                   c_shm_spin's own run can then say 0.8
 *                                   or 4). Its other figures (value, n,
 *                                   the CPU, the counts) are the channel's
 *                                   hand-offs alone
 *   chan_sockack  ipcref_chan_sockack  the channel, spin W4_SPIN_US, the
 *                                   ack on the socket: compare with c_msg64
 *   chan_nospin   ipcref_chan_nospin  the channel, spin_us 0 (the consumer
 *                                   sleeps at once: a futex doze, the
 *                                   doorbell once idle IPCREF__DOZE_MS),
 *                                   the ack on the socket: compare with
 *                                   c_msg64 and iceoryx_waitset. Paired
 *                                   as chan_spin is, with c_msg64's
 *                                   hand-off (blocks of
 *                                   PAIR_BLOCK_SLEEP): the producer sends
 *                                   a 64-byte message (the hand-off's
 *                                   number) on a third socketpair
 *                                   (SOCK_STREAM), the consumer checks the
 *                                   first and last byte of the buffer made
 *                                   before the fork and acks with one byte
 *                                   on that socket; its pair_ratio line
 *                                   says value / c_msg64's median, both
 *                                   woken by the same kernel in the same
 *                                   second
 *   chan_auto     ipcref_chan_auto  the defaults: peers made with
 *                                   ipcref_peer_new (the channel, spin
 *                                   IPCREF_SPIN_AUTO), the ack on the
 *                                   socket: what a user gets; compare with
 *                                   ipcref (it must not slow one CPU)
 * W4_RING_BYTES (default unset: the library's 64 KiB) sets the ring of every
 * channel row, chan_auto and tput_chan too (which then keep the defaults
 * but that one: ipcref_peer_new_with, spin IPCREF_SPIN_AUTO); the rows say
 * ring_bytes= (0: the default; none: no channel).
 * The channel rows fail (exit 2) unless every timed hand-off went through
 * the ring (ipcref_peer_stats' sent_channel on the producer's peer); the
 * socket rows fail unless none did.
 * Every row also prints prod_cpu_us and cons_cpu_us: the producer's and
 * the consumer's user + system CPU time per timed hand-off (getrusage
 * RUSAGE_SELF around the timed loop in each process; the consumer's window
 * runs from its last warm-up's ack to the producer's hang-up, and its
 * figure comes back through the shared page), spin_us (the consumer's,
 * "auto" for IPCREF_SPIN_AUTO), ack (socket or shm), pin (split: the two
 * processes on two CPUs; none), sent_channel and sent_socket (the
 * producer's messages by each path over the timed loop).
 *
 * Throughput, workload w4_tput (SIZE 4096 in bench/run.sh):
 *   tput_chan     ipcref_tput_chan  N hand-offs of one 4 KiB view, the
 *                                   defaults (ipcref_peer_new: the channel,
 *                                   spin IPCREF_SPIN_AUTO)
 *   tput_sock     ipcref_tput_sock  the same on the socket path (ring_bytes
 *                                   IPCREF_KEEP_NONE)
 * After the 3 acked warm-ups the producer sends the same view N times as
 * fast as the path allows, with no ack (each send takes a lease on the same
 * block: the steady state when a producer reuses one buffer); a blocking
 * peer, so a full socket waits. A ring that is full sends on the socket (the
 * library's fallback: sent_channel and sent_socket say how many went each
 * way). A send that says IPCREF_EAGAIN or IPCREF_ENOMEM (no ledger slot or
 * memory left) sweeps (ipcref_collect) and tries again (retries=). The
 * consumer receives, reads a byte, releases; after the N-th it acks. Timed
 * from the first send to that ack: records_per_s = N / time (extras:
 * us_per_record, prod_cpu_us and cons_cpu_us per record over the same
 * span, counter_files: the producer's ledgers after the last ack). N: the third
 * argument, else $W4_TPUT_N, else 1000000.
 *
 * The data travels over a socketpair(AF_UNIX, SOCK_SEQPACKET) owned by the
 * two ipcref_peers (and the channel's ring beside it); socket acks over a
 * second socketpair(AF_UNIX, SOCK_STREAM).
 * W4_PIN=split pins the producer to the first and the consumer to the second
 * allowed CPU. The workload id printed is $W4_ID if set (w4, w4_1cpu,
 * w4_2cpu), else w4 (w4_tput for the throughput modes). The library has no
 * inline small-block path (a view's bytes inside the message), so there is
 * no ipcref_inline row.
 * Build: gcc -O2 -std=c11 -I.. w4_handoff.c -o w4_ipcref -pthread
 * Run:   ./w4_ipcref MODE SIZE [SECONDS=1.0]
 *        ./w4_ipcref tput_chan|tput_sock SIZE [N] */
#define _GNU_SOURCE /* clock_gettime, sched_setaffinity */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "bench.h"

#define WARMUPS          3
#define MAX_N            50000000
#define SEG_MIN          4096 /* the smallest segment_size ipcref_ctx_new takes */
#define SPIN_US          50   /* W4_SPIN_US's default */
#define TPUT_N           1000000
#define TPUT_BYTE        0x5a
#define MAX_RETRIES      1000000 /* tries of one throughput send in a row */
#define PAIR_BLOCK       4096 /* chan_spin: hand-offs per block of each kind */
#define PAIR_BLOCK_SLEEP 512  /* chan_nospin's (45 us each, not 0.4) */
#define BARE_STOP        UINT64_MAX

enum mode {
  MODE_IPCREF,
  MODE_FIRST,
  MODE_CHAN_SPIN,
  MODE_CHAN_SOCKACK,
  MODE_CHAN_NOSPIN,
  MODE_CHAN_AUTO,
  MODE_TPUT_CHAN,
  MODE_TPUT_SOCK,
  N_MODES
};
static const char *const mode_name[N_MODES] = {
    "ipcref",      "first",     "chan_spin", "chan_sockack",
    "chan_nospin", "chan_auto", "tput_chan", "tput_sock"};
static const char *const peer_name[N_MODES] = {"ipcref",
                                               "ipcref_first",
                                               "ipcref_chan_spin",
                                               "ipcref_chan_sockack",
                                               "ipcref_chan_nospin",
                                               "ipcref_chan_auto",
                                               "ipcref_tput_chan",
                                               "ipcref_tput_sock"};

/* The page both processes share, made before the fork: the shm ack
 * (chan_spin) and, at the end, the consumer's CPU figure. */
struct shared_page {
  _Alignas(64) _Atomic uint64_t taken;  /* hand-offs acked */
  _Alignas(64) _Atomic uint64_t posted; /* chan_spin's bare hand-offs */
  _Alignas(64) _Atomic uint64_t cons_cpu_ns;
  _Atomic uint64_t cons_n; /* hand-offs (records) in the consumer's window */
};

static enum mode g_mode;
static size_t S;
static uint64_t g_tput_n = TPUT_N;
static int g_spin_us = SPIN_US;
static size_t g_ring; /* W4_RING_BYTES: the channel's ring (0: the default) */
static int g_one_cpu; /* producer and consumer may only share one CPU */
static const char *g_wl = "w4";
static const char *g_peer = "ipcref";
static struct shared_page *g_page;
static unsigned char *g_bare; /* the pair's buffer (chan_spin, chan_nospin) */
static int g_bare_fd = -1;    /* chan_nospin's pair: its socket, this end */
static pid_t g_child;
static volatile unsigned g_sink;

static int is_tput(void) {
  return g_mode == MODE_TPUT_CHAN || g_mode == MODE_TPUT_SOCK;
}
static int has_channel(void) {
  return g_mode != MODE_IPCREF && g_mode != MODE_FIRST &&
         g_mode != MODE_TPUT_SOCK;
}
static int shm_ack(void) {
  return g_mode == MODE_CHAN_SPIN;
}
/* 1 for the rows paired with a bare hand-off in the same run. */
static int is_paired(void) {
  return g_mode == MODE_CHAN_SPIN || g_mode == MODE_CHAN_NOSPIN;
}
/* Hand-off number k (from 0) of a paired row is its pair's (c_shm_spin's
 * or c_msg64's): every other block after the warm-ups. */
static int is_bare(uint64_t k) {
  uint64_t block = g_mode == MODE_CHAN_SPIN ? PAIR_BLOCK : PAIR_BLOCK_SLEEP;
  return is_paired() && k >= WARMUPS && (k - WARMUPS) / block % 2 == 1;
}
/* the consumer's spin_us; IPCREF_SPIN_AUTO for the defaults */
static int consumer_spin(void) {
  switch (g_mode) {
  case MODE_CHAN_SPIN:
  case MODE_CHAN_SOCKACK: return g_spin_us;
  case MODE_CHAN_AUTO:
  case MODE_TPUT_CHAN: return IPCREF_SPIN_AUTO;
  default: return 0;
  }
}

static _Noreturn void die(const char *what, ipcref_result r) {
  fprintf(stderr, "w4 %s size=%zu: %s: %s\n", g_peer, S, what,
          r ? ipcref_strerror(r) : strerror(errno));
  exit(2);
}

/* Writes all n bytes to a stream socket. */
static void write_all(int fd, const void *buf, size_t n) {
  size_t put = 0;
  while (put < n) {
    ssize_t r = write(fd, (const char *)buf + put, n - put);
    if (r < 0 && errno != EINTR) die("write", IPCREF_OK);
    if (r > 0) put += (size_t)r;
  }
}

/* Reads all n bytes from a stream socket: 0 at its end instead. */
static int read_all(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r == 0) return 0;
    if (r < 0 && errno != EINTR) die("read", IPCREF_OK);
    if (r > 0) got += (size_t)r;
  }
  return 1;
}

static void write_byte(int fd) {
  write_all(fd, "", 1);
}

/* 1 = got the ack, 0 = EOF */
static int read_byte(int fd) {
  char a;
  return read_all(fd, &a, 1);
}

/* user + system CPU time of this process, in ns */
static uint64_t cpu_ns(void) {
  struct rusage u;
  if (getrusage(RUSAGE_SELF, &u)) die("getrusage", IPCREF_OK);
  return ((uint64_t)u.ru_utime.tv_sec + (uint64_t)u.ru_stime.tv_sec) *
             1000000000u +
         ((uint64_t)u.ru_utime.tv_usec + (uint64_t)u.ru_stime.tv_usec) * 1000u;
}

/* CPU time summed over the stretches a process spends on the row's own
 * hand-offs (chan_spin leaves its bare blocks out). */
typedef struct cpu_window {
  uint64_t sum, since;
  int on;
} cpu_window;
static void cpu_on(cpu_window *w) {
  if (w->on) return;
  w->since = cpu_ns();
  w->on = 1;
}
static void cpu_off(cpu_window *w) {
  if (!w->on) return;
  w->sum += cpu_ns() - w->since;
  w->on = 0;
}

static int g_cpu[2] = {0, 1}; /* first two CPUs of the inherited mask */
static int allowed_cpus(void) {
  cpu_set_t s;
  if (sched_getaffinity(0, sizeof s, &s)) return 1;
  return CPU_COUNT(&s);
}
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

/* A pause between looks at the shared page, as c_shm_spin's; where both
 * processes may only share one CPU, a yield after every look (as the
 * iceoryx peer's poll), so that the consumer runs. */
static inline void relax(unsigned *spins) {
  if (g_one_cpu || (++*spins & 0xffff) == 0) {
    sched_yield();
    if (g_one_cpu) ++*spins;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

/* c_msg64's message (bench/peers/w4_handoff.c). */
struct msg64 {
  uint64_t seq, offset, length, spare[5];
};

/* The pair's hand-off k, the consumer's side: c_shm_spin's (chan_spin) or
 * c_msg64's (chan_nospin). 0 when the producer is done instead. */
static int bare_take(uint64_t k) {
  uint64_t v;
  unsigned spins = 0;
  if (g_mode == MODE_CHAN_NOSPIN) {
    struct msg64 m;
    if (!read_all(g_bare_fd, &m, sizeof m)) return 0;
    if (m.seq != k || g_bare[0] != (unsigned char)k ||
        g_bare[S - 1] != (unsigned char)k)
      _exit(3);
    write_byte(g_bare_fd);
    return 1;
  }
  while ((v = atomic_load_explicit(&g_page->posted, memory_order_acquire)) !=
         k + 1) {
    if (v == BARE_STOP) return 0;
    relax(&spins);
  }
  if (g_bare[0] != (unsigned char)k || g_bare[S - 1] != (unsigned char)k)
    _exit(3);
  atomic_store_explicit(&g_page->taken, k + 1, memory_order_release);
  return 1;
}

/* The context options of both sides. For the first-hand-off mode every
 * buffer gets a segment of its own and no empty segment is kept for reuse,
 * so each allocation makes a new memfd. */
static ipcref_ctx_options options(void) {
  ipcref_ctx_options o;
  memset(&o, 0, sizeof o);
  if (g_mode == MODE_FIRST) {
    o.segment_size = SEG_MIN;
    o.segment_cache = 1; /* less than any segment: none is kept */
  }
  return o;
}

/* The peer of either side: the defaults (ipcref_peer_new) for chan_auto and
 * the throughput's channel, else options saying the path and the spin. */
static ipcref_result make_peer(ipcref_ctx *ctx, int fd, ipcref_peer **out) {
  ipcref_peer_options po;
  if ((g_mode == MODE_CHAN_AUTO || g_mode == MODE_TPUT_CHAN) && !g_ring)
    return ipcref_peer_new(ctx, fd, out);
  memset(&po, 0, sizeof po);
  po.ring_bytes = has_channel() ? g_ring : IPCREF_KEEP_NONE; /* 0: 64 KiB */
  po.spin_us = consumer_spin();
  return ipcref_peer_new_with(ctx, fd, &po, out);
}

static void consumer(int data_fd, int ack_fd) {
  ipcref_ctx_options o = options();
  ipcref_ctx *ctx = NULL;
  ipcref_peer *peer = NULL;
  ipcref_result r;
  uint64_t k = 0, timed = 0, last = 0;
  cpu_window cpu = {0, 0, 0};
  if ((r = ipcref_ctx_new(&o, &ctx)) || (r = make_peer(ctx, data_fd, &peer)))
    die("consumer setup", r);
  for (;; k++) {
    ipcref_view v;
    const unsigned char *b;
    unsigned char e = (unsigned char)k;
    if (is_bare(k)) {
      cpu_off(&cpu);
      if (!bare_take(k)) break;
      continue;
    }
    if (k > WARMUPS && is_bare(k - 1)) cpu_on(&cpu);
    memset(&v, 0, sizeof v);
    r = ipcref_recv(peer, &v, -1);
    if (r == IPCREF_EPEER) break; /* the producer is done */
    if (r) die("ipcref_recv", r);
    if (v.ndim != 1 || (size_t)v.shape[0] != S) _exit(3);
    b = (const unsigned char *)ipcref_buf_data(v.buf) + v.byte_offset;
    g_sink += b[0] + b[S - 1];
    if (is_tput() && k >= WARMUPS) e = TPUT_BYTE;
    if (b[0] != e || b[S - 1] != e) _exit(3);
    ipcref_view_release(&v);
    if (k >= WARMUPS) timed++;
    if (is_tput() && k + 1 == WARMUPS + g_tput_n) { /* the last record */
      cpu_off(&cpu);
      last = 1;
      write_byte(ack_fd);
    } else if (shm_ack()) {
      atomic_store_explicit(&g_page->taken, k + 1, memory_order_release);
    } else if (!is_tput() || k < WARMUPS) {
      write_byte(ack_fd);
    }
    if (k + 1 == WARMUPS) cpu_on(&cpu); /* the timed window starts */
  }
  cpu_off(&cpu);
  atomic_store(&g_page->cons_cpu_ns, cpu.sum);
  if (is_tput())
    atomic_store(&g_page->cons_n, last ? g_tput_n : 0);
  else
    atomic_store(&g_page->cons_n, timed);
  ipcref_peer_free(peer);
  ipcref_ctx_free(ctx);
  _exit(0);
}

typedef struct producer {
  ipcref_ctx *ctx;
  ipcref_peer *peer;
  int ack_fd;
  ipcref_view view; /* all but MODE_FIRST: the one reused buffer */
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

static void consumer_gone(void) {
  fprintf(stderr, "w4 %s size=%zu: consumer died\n", g_peer, S);
  exit(2);
}

/* The ack of hand-off number i. */
static void wait_ack(producer *p, uint64_t i) {
  unsigned spins = 0;
  if (!shm_ack()) {
    if (!read_byte(p->ack_fd)) consumer_gone();
    return;
  }
  while (atomic_load_explicit(&g_page->taken, memory_order_acquire) != i + 1) {
    relax(&spins);
    if ((spins & 0xfffff) == 0 && waitpid(g_child, NULL, WNOHANG) != 0)
      consumer_gone();
  }
}

static void send_and_wait(producer *p, const ipcref_view *v, uint64_t i) {
  ipcref_result r = ipcref_send(p->peer, v);
  if (r) die("ipcref_send", r);
  wait_ack(p, i);
}

/* One hand-off number i; returns its time in ns. */
static double handoff(producer *p, uint64_t i) {
  unsigned char *d;
  double t0, dt;
  if (g_mode != MODE_FIRST) {
    d = (unsigned char *)ipcref_buf_data(p->view.buf);
    d[0] = d[S - 1] = (unsigned char)i; /* "produce" */
    t0 = now_ns();
    send_and_wait(p, &p->view, i);
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
    send_and_wait(p, &v, i);
    dt = now_ns() - t0;
    ipcref_ctx_stats(p->ctx, &after);
    if (after.fds_sent > before.fds_sent) p->new_fds++;
    ipcref_view_release(&v); /* frees the block and its segment */
    return dt;
  }
}

/* The pair's hand-off number i, as c_shm_spin (chan_spin) or c_msg64
 * (chan_nospin) makes it; its time in ns. */
static double bare_handoff(producer *p, uint64_t i) {
  double t0;
  g_bare[0] = g_bare[S - 1] = (unsigned char)i; /* "produce" */
  t0 = now_ns();
  if (g_mode == MODE_CHAN_NOSPIN) {
    struct msg64 m;
    memset(&m, 0, sizeof m);
    m.seq = i;
    m.length = S;
    write_all(g_bare_fd, &m, sizeof m);
    if (!read_byte(g_bare_fd)) consumer_gone();
  } else {
    atomic_store_explicit(&g_page->posted, i + 1, memory_order_release);
    wait_ack(p, i);
  }
  return now_ns() - t0;
}

/* The producer's messages by each path since `before`. */
static void sent_since(producer *p, const ipcref_peer_info *before,
                       uint64_t *chan, uint64_t *sock) {
  ipcref_peer_info now;
  ipcref_result r;
  memset(&now, 0, sizeof now);
  if ((r = ipcref_peer_stats(p->peer, &now))) die("ipcref_peer_stats", r);
  *chan = now.sent_channel - before->sent_channel;
  *sock = now.sent_socket - before->sent_socket;
}

/* The throughput's timed part: N sends of the one view, then the ack. */
static uint64_t tput_run(producer *p) {
  uint64_t retries = 0;
  for (uint64_t j = 0; j < g_tput_n; j++) {
    unsigned tries = 0;
    ipcref_result r;
    while ((r = ipcref_send(p->peer, &p->view)) != IPCREF_OK) {
      if ((r != IPCREF_EAGAIN && r != IPCREF_ENOMEM) || ++tries > MAX_RETRIES)
        die("ipcref_send", r);
      retries++;
      ipcref_collect(p->ctx); /* leases the consumer gave back */
      sched_yield();
    }
  }
  if (!read_byte(p->ack_fd)) consumer_gone();
  return retries;
}

static const char *spin_text(char *buf, size_t n) {
  int s = consumer_spin();
  if (!has_channel()) return "none";
  if (s == IPCREF_SPIN_AUTO) return "auto";
  snprintf(buf, n, "%d", s);
  return buf;
}

static const char *ring_text(char *buf, size_t n) {
  if (!has_channel()) return "none";
  snprintf(buf, n, "%zu", g_ring);
  return buf;
}

int main(int argc, char **argv) {
  producer p;
  ipcref_ctx_options o;
  ipcref_peer_info before;
  ipcref_stats cs;
  ipcref_result r;
  int dv[2], av[2], bv[2] = {-1, -1}, st, split;
  double secs = 1.0, start, total = 0, *v, *vb, med, p99, bare = 0;
  size_t cap = 1 << 16, n = 0, capb = 1 << 16, nb = 0;
  uint64_t i = 0, chan = 0, sock = 0, retries = 0, cons_n;
  cpu_window cpu = {0, 0, 0};
  char spin[16], ring[24];

  g_mode = N_MODES;
  for (int m = 0; argc > 1 && m < N_MODES; m++)
    if (!strcmp(argv[1], mode_name[m]) || !strcmp(argv[1], peer_name[m]))
      g_mode = (enum mode)m;
  if (argc < 3 || g_mode == N_MODES) {
    fprintf(stderr,
            "usage: %s ipcref|first|chan_spin|chan_sockack|chan_nospin|"
            "chan_auto SIZE [SECONDS]\n"
            "       %s tput_chan|tput_sock SIZE [N]\n",
            argv[0], argv[0]);
    return 2;
  }
  g_peer = peer_name[g_mode];
  S = strtoull(argv[2], NULL, 0);
  if (S < 1) return 2;
  if (is_tput()) {
    g_wl = "w4_tput";
    if (argc > 3)
      g_tput_n = strtoull(argv[3], NULL, 0);
    else if (getenv("W4_TPUT_N") && *getenv("W4_TPUT_N"))
      g_tput_n = strtoull(getenv("W4_TPUT_N"), NULL, 0);
    if (g_tput_n < 1) return 2;
  } else {
    secs = argc > 3 ? atof(argv[3]) : 1.0;
    if (getenv("W4_ID") && *getenv("W4_ID")) g_wl = getenv("W4_ID");
  }
  if (getenv("W4_SPIN_US") && *getenv("W4_SPIN_US"))
    g_spin_us = atoi(getenv("W4_SPIN_US"));
  if (g_spin_us < 0) g_spin_us = IPCREF_SPIN_AUTO;
  if (getenv("W4_RING_BYTES") && *getenv("W4_RING_BYTES"))
    g_ring = strtoull(getenv("W4_RING_BYTES"), NULL, 0);
  signal(SIGPIPE, SIG_IGN);
  split = !is_tput() && getenv("W4_PIN") && !strcmp(getenv("W4_PIN"), "split");
  /* chan_spin is pinned as c_shm_spin is, wherever two CPUs are allowed (two
   * spinning sides put on one CPU by the scheduler measure the scheduler) */
  if (g_mode == MODE_CHAN_SPIN && !split && two_cpus()) split = 1;
  if (split && !two_cpus()) {
    printf("peer=%s workload=%s size=%zu status=skipped reason=needs-2-cpus\n",
           g_peer, g_wl, S);
    return 0;
  }
  g_one_cpu = !split && allowed_cpus() < 2;
  g_page = mmap(NULL, sizeof *g_page, PROT_READ | PROT_WRITE,
                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_page == MAP_FAILED) die("mmap", IPCREF_OK);
  if (is_paired()) {
    g_bare = mmap(NULL, S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                  -1, 0);
    if (g_bare == MAP_FAILED) die("mmap", IPCREF_OK);
    memset(g_bare, 1, S); /* pre-faulted, as the channel's buffer is */
  }
  if (g_mode == MODE_CHAN_NOSPIN &&
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, bv))
    die("socketpair", IPCREF_OK);
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, dv) ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, av))
    die("socketpair", IPCREF_OK);
  fflush(stdout);
  g_child = fork();
  if (g_child < 0) die("fork", IPCREF_OK);
  if (g_child == 0) {
    if (split) pin(1);
    close(dv[0]);
    close(av[0]);
    if (bv[0] >= 0) close(bv[0]);
    g_bare_fd = bv[1];
    consumer(dv[1], av[1]);
  }
  close(dv[1]);
  close(av[1]);
  if (bv[1] >= 0) close(bv[1]);
  g_bare_fd = bv[0];
  if (split) pin(0);

  memset(&p, 0, sizeof p);
  o = options();
  p.ack_fd = av[0];
  if ((r = ipcref_ctx_new(&o, &p.ctx)) ||
      (r = make_peer(p.ctx, dv[0], &p.peer)))
    die("producer setup", r);
  if (g_mode != MODE_FIRST) {
    p.view = new_buffer(&p);
    memset(ipcref_buf_data(p.view.buf), 1, S); /* filled (pre-faulted) once */
  }

  for (int w = 0; w < WARMUPS; w++) handoff(&p, i++);
  p.new_fds = 0;
  memset(&before, 0, sizeof before);
  if ((r = ipcref_peer_stats(p.peer, &before))) die("ipcref_peer_stats", r);
  v = malloc(cap * sizeof *v);
  vb = malloc(capb * sizeof *vb);
  if (!v || !vb) die("malloc", IPCREF_OK);
  if (is_tput()) {
    unsigned char *d = (unsigned char *)ipcref_buf_data(p.view.buf);
    d[0] = d[S - 1] = TPUT_BYTE;
    cpu_on(&cpu);
    start = now_ns();
    retries = tput_run(&p);
    total = now_ns() - start;
    cpu_off(&cpu);
    n = (size_t)g_tput_n;
  } else {
    cpu_on(&cpu);
    start = now_ns();
    do {
      if (is_bare(i)) { /* the pair's: not the row's own */
        cpu_off(&cpu);
        if (nb == capb) vb = realloc(vb, (capb *= 2) * sizeof *vb);
        if (!vb) die("realloc", IPCREF_OK);
        vb[nb++] = bare_handoff(&p, i++);
        continue;
      }
      cpu_on(&cpu);
      double dt = handoff(&p, i++);
      if (n == cap) {
        cap *= 2;
        v = realloc(v, cap * sizeof *v);
      }
      if (!v) die("realloc", IPCREF_OK);
      v[n++] = dt;
      total += dt;
    } while ((n < 5 || (g_bare && nb < 5) || now_ns() - start < secs * 1e9) &&
             n < MAX_N);
    cpu_off(&cpu);
  }
  /* A consumer waiting for a bare hand-off: done (chan_nospin's at its
   * socket's end of file). */
  if (g_mode == MODE_CHAN_SPIN)
    atomic_store_explicit(&g_page->posted, BARE_STOP, memory_order_release);
  if (g_bare_fd >= 0) close(g_bare_fd);
  sent_since(&p, &before, &chan, &sock);
  memset(&cs, 0, sizeof cs);
  ipcref_ctx_stats(p.ctx, &cs); /* before the peer goes with its ledgers */

  ipcref_view_release(&p.view);
  ipcref_peer_free(p.peer); /* the consumer sees the hang-up */
  close(p.ack_fd);
  waitpid(g_child, &st, 0);
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
  /* The path each row says it measures. A throughput over the channel sends
   * on the socket what finds the ring full: some must have used the ring. */
  if (has_channel() ? (is_tput() ? chan == 0 : chan < n) : chan != 0) {
    printf("peer=%s workload=%s size=%zu status=failed "
           "reason=%llu-of-%zu-hand-offs-went-through-the-channel\n",
           g_peer, g_wl, S, (unsigned long long)chan, n);
    return 2;
  }
  cons_n = atomic_load(&g_page->cons_n);
  if (cons_n != n) {
    printf("peer=%s workload=%s size=%zu status=failed "
           "reason=the-consumer-counted-%llu-of-%zu-hand-offs\n",
           g_peer, g_wl, S, (unsigned long long)cons_n, n);
    return 2;
  }
  if (is_tput()) {
    ipcref_collect(p.ctx);
    printf("peer=%s workload=%s size=%zu metric=records_per_s value=%.0f "
           "n=%zu secs=%.3f us_per_record=%.4f prod_cpu_us=%.4f "
           "cons_cpu_us=%.4f spin_us=%s ring_bytes=%s sent_channel=%llu "
           "sent_socket=%llu "
           "counter_files=%zu retries=%llu\n",
           g_peer, g_wl, S, (double)n / (total / 1e9), n, total / 1e9,
           total / (double)n / 1e3, (double)cpu.sum / (double)n / 1e3,
           (double)atomic_load(&g_page->cons_cpu_ns) / (double)n / 1e3,
           spin_text(spin, sizeof spin), ring_text(ring, sizeof ring),
           (unsigned long long)chan, (unsigned long long)sock, cs.counter_files,
           (unsigned long long)retries);
    ipcref_ctx_free(p.ctx);
    free(v);
    free(vb);
    return 0;
  }
  ipcref_collect(p.ctx);
  ipcref_ctx_free(p.ctx);
  med = median(v, (int)n); /* sorts v */
  p99 = v[(size_t)(0.99 * (double)(n - 1))];
  if (nb) bare = median(vb, (int)nb);
  printf("peer=%s workload=%s size=%zu metric=us_per_handoff value=%.3f n=%zu "
         "mean=%.3f p99=%.3f prod_cpu_us=%.3f cons_cpu_us=%.3f spin_us=%s "
         "ring_bytes=%s ack=%s pin=%s sent_channel=%llu sent_socket=%llu\n",
         g_peer, g_wl, S, med / 1e3, n, total / (double)n / 1e3, p99 / 1e3,
         (double)cpu.sum / (double)n / 1e3,
         (double)atomic_load(&g_page->cons_cpu_ns) / (double)n / 1e3,
         spin_text(spin, sizeof spin), ring_text(ring, sizeof ring),
         shm_ack() ? "shm" : "socket", split ? "split" : "none",
         (unsigned long long)chan, (unsigned long long)sock);
  if (nb) /* a paired row: the ratio to its pair */
    printf("peer=%s workload=%s size=%zu metric=pair_ratio value=%.3f "
           "bare_us=%.3f n_bare=%zu\n",
           g_peer, g_wl, S, med / bare, bare / 1e3, nb);
  printf("peer=%s workload=%s size=%zu metric=GBps value=%.3f\n", g_peer, g_wl,
         S, (double)S / med);
  free(v);
  free(vb);
  return 0;
}
