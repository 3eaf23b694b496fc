/* W5 a stream of fresh tensors, for ipcref, defined as the peers define it
 * (bench/peers/w5_memfd.c, w5_stream.py and README.md). For each item the
 * producer makes a NEW tensor, fills every byte of it (memset of the item's
 * byte), hands it to the consumer and drops its own reference; the consumer
 * receives it, reads one byte per 4096-byte page (their sum is checked),
 * releases it and acks with 1 byte. What it measures: whether a producer
 * that makes a new large tensor per item, and calls nothing special, runs
 * as fast as one that re-sends a tensor made once.
 *   MODE    peer           one item
 *   ipcref  ipcref         ipcref_view_new_shared with the default options
 *                          (a zeroed ipcref_ctx_options), the fill,
 *                          ipcref_send, ipcref_view_release at once
 *   reused  ipcref_reused  the bound: the tensors are made once (one per
 *                          size and in-flight slot), then filled and re-sent
 *                          every item
 *   STREAM     one timed item (the producer's view)
 *   seq        one in flight: make .. ack received
 *   inflight4  the producer runs 4 ahead: wait for ack i-4, then make, fill
 *              and send tensor i (its period: a throughput)
 *   mixed      as seq, the sizes cycling 4, 24, 64 MiB (SIZE 0; printed
 *              as size=0)
 * The consumer is forked; the data goes over a socketpair(AF_UNIX,
 * SOCK_SEQPACKET) owned by the two ipcref_peers, the acks over a second
 * socketpair. Items are timed one by one for SECONDS after 2 warm-ups
 * (inflight4: after the 4 that fill the window), at least W5_MIN_ITEMS
 * (default 8) and, once that many are timed, no more than W5_MAX_BYTES
 * (default 2 GiB) in all. Printed: us_median (n, mean, p99 as extras),
 * us_p99, us_per_tensor (the mean: total time / items), consumer_peak_kb
 * (the largest VmRSS the consumer saw, sampled after reading each item
 * before releasing it; base_kb = its VmRSS before the first item) and
 * held_kb (what the stream keeps in flight: window x largest size).
 * The workload id is $W5_ID (w5_1cpu, w5_2cpu; default w5) + _STREAM.
 * W5_PIN=split pins the producer to the first and the consumer to the
 * second allowed CPU.
 *
 * frames: the stream of two programs started separately. `frames-recv
 * PATH` listens on an AF_UNIX SOCK_SEQPACKET socket at PATH and takes two
 * connections (the data, wrapped in an ipcref_peer, then the acks);
 * `frames-send MODE PATH FRAMES` connects twice and streams FRAMES frames
 * (after 2 warm-ups), seq: a 4096-byte header (sequence number, dtype,
 * shape) then 3x1080x1920 float32, one shared buffer of 24,887,296 bytes,
 * filled whole. It prints, for workload w5_frames: frames_per_s, us_median,
 * us_p99, consumer_peak_kb, held_kb.
 * Build: gcc -O2 -std=c11 -I.. w5_stream.c -o w5_stream -pthread
 * Run:   ./w5_stream ipcref|reused seq|inflight4|mixed SIZE [SECONDS=1.0]
 *        ./w5_stream frames-recv PATH &
 *        ./w5_stream frames-send ipcref|reused PATH [FRAMES=300] */
#define _GNU_SOURCE /* clock_gettime, sched_setaffinity */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "bench.h"

#define WARMUPS     2
#define MAX_N       1000000
#define PAGE        4096
#define MIB         ((size_t)1 << 20)
#define FRAME_HEAD  4096
#define FRAME_BYTES ((size_t)3 * 1080 * 1920 * 4)
#define FRAME_MAGIC 0x5735465241u /* "W5FRA" */
#define WAIT_MS     30000         /* frames: accept and connect */
#define ACK_WAIT_MS 60000         /* a consumer silent this long fails */
#define DEFAULT_CAP ((double)((size_t)2 << 30))
#define MAX_SIZES   3
#define MAX_WINDOW  4
#define MAX_KEPT    (MAX_SIZES * MAX_WINDOW)

enum { MODE_FRESH, MODE_REUSED };

typedef struct frame_header { /* at the start of every frame's buffer */
  uint64_t magic, seq;
  uint32_t dtype, ndim;
  int64_t shape[3];
} frame_header;

typedef struct consumer_report { /* the consumer's last message */
  uint64_t peak_kb, base_kb;
} consumer_report;

static int g_mode, g_frames, g_window = 1, g_nsizes = 1;
static size_t g_sizes[MAX_SIZES];
static const char *g_peer = "ipcref";
static char g_wl[64] = "w5";
static volatile uint64_t g_sink;

static _Noreturn void die(const char *what, ipcref_result r) {
  fprintf(stderr, "w5 %s %s: %s: %s\n", g_peer, g_wl, what,
          r ? ipcref_strerror(r) : strerror(errno));
  exit(2);
}

static void put_all(int fd, const void *p, size_t n) {
  const char *c = (const char *)p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("write", IPCREF_OK);
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
    if (errno != EINTR) die("poll", IPCREF_OK);
  if (k == 0) return 0;
  while ((r = read(fd, p, n)) < 0)
    if (errno != EINTR) die("read", IPCREF_OK);
  return (size_t)r;
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

/* ---- pinning (W5_PIN=split) ------------------------------------------- */

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

/* ---- the consumer -------------------------------------------------------- */

/* Reads item k: one byte per page (a frame: its header, then the frame's
 * pages); 1 when everything read holds what the producer wrote. */
static int read_item(const unsigned char *b, size_t n, uint64_t k) {
  unsigned char e = fill_byte(k);
  uint64_t sum = 0, pages = 0;
  size_t off = 0;
  if (g_frames) {
    frame_header h;
    memcpy(&h, b, sizeof h);
    if (h.magic != FRAME_MAGIC || h.seq != k || h.dtype != IPCREF_F32 ||
        h.ndim != 3 || h.shape[0] != 3 || h.shape[1] != 1080 ||
        h.shape[2] != 1920 || n != FRAME_HEAD + FRAME_BYTES)
      return 0;
    off = FRAME_HEAD;
  }
  for (; off < n; off += PAGE, pages++) sum += b[off];
  g_sink += sum;
  return sum == pages * e;
}

static _Noreturn void consumer(int data_fd, int ack_fd) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *peer = NULL;
  consumer_report rep;
  ipcref_result r;
  int statm = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  rep.base_kb = rep.peak_kb = rss_kb(statm);
  if ((r = ipcref_ctx_new(NULL, &ctx)) ||
      (r = ipcref_peer_new(ctx, data_fd, &peer)))
    die("consumer setup", r);
  for (uint64_t k = 0;; k++) {
    ipcref_view v;
    uint64_t kb;
    const char one = 1;
    memset(&v, 0, sizeof v);
    r = ipcref_recv(peer, &v, -1);
    if (r == IPCREF_EPEER) break; /* the producer is done */
    if (r) die("ipcref_recv", r);
    if (v.ndim != 1 || (size_t)v.shape[0] != item_size(k)) _exit(3);
    if (!read_item((const unsigned char *)ipcref_buf_data(v.buf) +
                       v.byte_offset,
                   (size_t)v.shape[0], k))
      _exit(3);
    if ((kb = rss_kb(statm)) > rep.peak_kb) rep.peak_kb = kb;
    ipcref_view_release(&v);
    put_all(ack_fd, &one, 1);
  }
  put_all(ack_fd, &rep, sizeof rep);
  ipcref_peer_free(peer);
  ipcref_ctx_free(ctx);
  _exit(0);
}

/* ---- the producer -------------------------------------------------------- */

typedef struct producer {
  ipcref_ctx *ctx;
  ipcref_peer *peer;
  int ack_fd;
  ipcref_view kept[MAX_KEPT]; /* MODE_REUSED: made once */
} producer;

static ipcref_view new_tensor(producer *p, size_t size) {
  ipcref_view v;
  int64_t shape[1];
  ipcref_result r;
  shape[0] = (int64_t)size;
  memset(&v, 0, sizeof v);
  if ((r = ipcref_view_new_shared(p->ctx, IPCREF_U8, 1, shape, &v)))
    die("ipcref_view_new_shared", r);
  return v;
}

static void fill(const ipcref_view *v, size_t size, uint64_t i) {
  unsigned char *d = (unsigned char *)ipcref_view_data_mut(v);
  if (!d) die("ipcref_view_data_mut: not writable", IPCREF_EBUSY);
  memset(d, fill_byte(i), size);
  if (g_frames) {
    frame_header h = {FRAME_MAGIC, i, IPCREF_F32, 3, {3, 1080, 1920}};
    memcpy(d, &h, sizeof h);
  }
}

/* MODE_REUSED: tensor (size k, slot s) at kept[k * window + s], made and
 * touched once, before the stream. */
static void make_kept(producer *p) {
  for (int k = 0; k < g_nsizes; k++)
    for (int s = 0; s < g_window; s++) {
      ipcref_view *v = &p->kept[k * g_window + s];
      *v = new_tensor(p, g_sizes[k]);
      fill(v, g_sizes[k], 0); /* touched once */
    }
}

static ipcref_view *kept_for(producer *p, uint64_t i) {
  size_t k = i % (size_t)g_nsizes;
  size_t s = (i / (size_t)g_nsizes) % (size_t)g_window;
  return &p->kept[k * (size_t)g_window + s];
}

/* Makes (or takes) tensor i, fills it, sends it, drops a fresh one. */
static void produce(producer *p, uint64_t i) {
  size_t size = item_size(i);
  ipcref_view fresh, *v = &fresh;
  ipcref_result r;
  if (g_mode == MODE_REUSED)
    v = kept_for(p, i);
  else
    fresh = new_tensor(p, size);
  fill(v, size, i);
  if ((r = ipcref_send(p->peer, v))) die("ipcref_send", r);
  if (g_mode == MODE_FRESH) ipcref_view_release(&fresh);
}

static void wait_ack(producer *p) {
  char a;
  if (!get_msg(p->ack_fd, &a, 1)) {
    fprintf(stderr, "w5 %s %s: the consumer died or went silent\n", g_peer,
            g_wl);
    exit(2);
  }
}

/* One item, in ns: seq waits for its own ack, a window for ack i-window. */
static double one_item(producer *p, uint64_t i) {
  double t0 = now_ns();
  if (g_window > 1 && i >= (uint64_t)g_window) wait_ack(p);
  produce(p, i);
  if (g_window == 1) wait_ack(p);
  return now_ns() - t0;
}

typedef struct limits {
  double secs, max_bytes;
  size_t min_items, frames; /* frames: exactly that many timed, else time */
} limits;

static int done(const limits *l, size_t n, double t0, double bytes) {
  if (n >= MAX_N) return 1;
  if (l->frames) return n >= l->frames;
  return n >= l->min_items &&
         (now_ns() - t0 >= l->secs * 1e9 || bytes >= l->max_bytes);
}

/* The first timed item: after the warm-ups, or the window's fill. */
static uint64_t first_timed(void) {
  return g_window > WARMUPS ? (uint64_t)g_window : WARMUPS;
}

/* Runs the stream; returns the timed items' ns (malloc'd), *n of them. */
static double *run(producer *p, const limits *l, size_t *n) {
  uint64_t i = 0, untimed = first_timed();
  size_t cap = 1024;
  double *v = (double *)malloc(cap * sizeof *v), t0, bytes = 0;
  if (!v) die("malloc", IPCREF_OK);
  while (i < untimed) one_item(p, i++);
  *n = 0;
  t0 = now_ns();
  do {
    if (*n == cap && !(v = (double *)realloc(v, (cap *= 2) * sizeof *v)))
      die("realloc", IPCREF_OK);
    bytes += (double)item_size(i);
    v[(*n)++] = one_item(p, i++);
  } while (!done(l, *n, t0, bytes));
  for (uint64_t k = g_window > 1 ? (uint64_t)g_window : 0; k > 0; k--)
    wait_ack(p); /* the window drains */
  return v;
}

/* ---- results ------------------------------------------------------------ */

static void line(const char *metric, double value, const char *extra) {
  size_t size = g_nsizes > 1 ? 0 : g_sizes[0];
  printf("peer=%s workload=%s size=%zu metric=%s value=%.3f%s\n", g_peer, g_wl,
         size, metric, value, extra);
}

/* The mixed stream: its items' times follow their sizes, so its spread is
 * read per size: the largest p99 / median among the sizes (timed item k is
 * item `first` + k). */
static double worst_size_spread(const double *v, size_t n, uint64_t first) {
  double worst = 0, *w = (double *)malloc((n + 1) * sizeof *w);
  if (!w) die("malloc", IPCREF_OK);
  for (int s = 0; s < g_nsizes; s++) {
    size_t m = 0;
    for (size_t k = 0; k < n; k++)
      if ((first + k) % (uint64_t)g_nsizes == (uint64_t)s) w[m++] = v[k];
    if (m == 0) continue;
    double med = median(w, (int)m); /* sorts w */
    double r = w[(size_t)(0.99 * (double)(m - 1))] / med;
    if (r > worst) worst = r;
  }
  free(w);
  return worst;
}

static void report(double *v, size_t n, const consumer_report *c) {
  double sum = 0, med, p99;
  char extra[160];
  if (g_nsizes > 1) /* before median() sorts v */
    line("p99_per_size", worst_size_spread(v, n, first_timed()), "");
  for (size_t k = 0; k < n; k++) sum += v[k];
  med = median(v, (int)n); /* sorts v */
  p99 = v[(size_t)(0.99 * (double)(n - 1))];
  snprintf(extra, sizeof extra, " n=%zu mean=%.3f p99=%.3f", n,
           sum / (double)n / 1e3, p99 / 1e3);
  if (g_frames) line("frames_per_s", (double)n / (sum / 1e9), "");
  line("us_median", med / 1e3, extra);
  line("us_p99", p99 / 1e3, "");
  if (!g_frames) line("us_per_tensor", sum / (double)n / 1e3, "");
  snprintf(extra, sizeof extra, " base_kb=%llu held_kb=%zu",
           (unsigned long long)c->base_kb,
           (size_t)g_window * largest_size() / 1024);
  line("consumer_peak_kb", (double)c->peak_kb, extra);
  line("held_kb", (double)((size_t)g_window * largest_size() / 1024), "");
}

/* Runs the producer over connected sockets; the consumer's report comes
 * last, once the data socket is closed. Returns 0, or 1 for a failed row. */
static int produce_all(int data_fd, int ack_fd, const limits *l) {
  producer p;
  consumer_report c;
  ipcref_result r;
  double *v;
  size_t n;
  memset(&p, 0, sizeof p);
  p.ack_fd = ack_fd;
  if ((r = ipcref_ctx_new(NULL, &p.ctx)) ||
      (r = ipcref_peer_new(p.ctx, data_fd, &p.peer)))
    die("producer setup", r);
  if (g_mode == MODE_REUSED) make_kept(&p);
  v = run(&p, l, &n);
  if (g_mode == MODE_REUSED)
    for (int k = 0; k < g_nsizes * g_window; k++)
      ipcref_view_release(&p.kept[k]);
  ipcref_peer_free(p.peer); /* the consumer sees the hang-up */
  if (get_msg(ack_fd, &c, sizeof c) != sizeof c) {
    printf("peer=%s workload=%s status=failed reason=no-consumer-report\n",
           g_peer, g_wl);
    return 1;
  }
  ipcref_ctx_free(p.ctx);
  report(v, n, &c);
  free(v);
  return 0;
}

/* ---- setup ------------------------------------------------------------- */

/* Sets the mode and the peer's name; 0 for an unknown mode. */
static int parse_mode(const char *m) {
  if (!strcmp(m, "ipcref")) {
    g_mode = MODE_FRESH, g_peer = "ipcref";
    return 1;
  }
  if (!strcmp(m, "reused")) {
    g_mode = MODE_REUSED, g_peer = "ipcref_reused";
    return 1;
  }
  return 0;
}

static void frames_setup(void) {
  g_frames = 1;
  g_sizes[0] = FRAME_HEAD + FRAME_BYTES;
  snprintf(g_wl, sizeof g_wl, "w5_frames");
}

static limits env_limits(double secs) {
  limits l;
  const char *e;
  l.secs = secs;
  l.min_items = (e = getenv("W5_MIN_ITEMS")) && *e ? strtoul(e, NULL, 0) : 8;
  l.max_bytes = (e = getenv("W5_MAX_BYTES")) && *e ? atof(e) : DEFAULT_CAP;
  l.frames = 0;
  if (l.min_items < 1) l.min_items = 1;
  return l;
}

/* The forked stream: `MODE STREAM SIZE [SECONDS]`. */
static int stream_main(int argc, char **argv) {
  int dv[2], av[2], st, split, rc;
  const char *id = getenv("W5_ID");
  limits l = env_limits(argc > 4 ? atof(argv[4]) : 1.0);
  pid_t pid;
  if (!strcmp(argv[2], "mixed")) {
    g_nsizes = 3;
    g_sizes[0] = 4 * MIB, g_sizes[1] = 24 * MIB, g_sizes[2] = 64 * MIB;
  } else if (!strcmp(argv[2], "seq") || !strcmp(argv[2], "inflight4")) {
    g_window = argv[2][0] == 'i' ? 4 : 1;
    g_sizes[0] = strtoull(argv[3], NULL, 0);
    if (g_sizes[0] < PAGE) return 2;
  } else {
    return 2;
  }
  snprintf(g_wl, sizeof g_wl, "%s_%s", id && *id ? id : "w5", argv[2]);
  split = getenv("W5_PIN") && !strcmp(getenv("W5_PIN"), "split");
  if (split && !two_cpus()) {
    printf("peer=%s workload=%s status=skipped reason=needs-2-cpus\n", g_peer,
           g_wl);
    return 0;
  }
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, dv) ||
      socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, av))
    die("socketpair", IPCREF_OK);
  fflush(stdout);
  if ((pid = fork()) < 0) die("fork", IPCREF_OK);
  if (pid == 0) {
    if (split) pin(1);
    close(dv[0]);
    close(av[0]);
    consumer(dv[1], av[1]);
  }
  close(dv[1]);
  close(av[1]);
  if (split) pin(0);
  rc = produce_all(dv[0], av[0], &l);
  close(av[0]);
  waitpid(pid, &st, 0);
  if (rc == 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
    printf("peer=%s workload=%s status=failed reason=consumer-exit-%d\n",
           g_peer, g_wl, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 1;
  }
  return rc;
}

/* ---- frames: two programs, one socket path ------------------------------ */

static struct sockaddr_un address(const char *path) {
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof a.sun_path) {
    errno = ENAMETOOLONG;
    die(path, IPCREF_OK);
  }
  strcpy(a.sun_path, path);
  return a;
}

static int accept_within(int ls) {
  struct pollfd pf = {ls, POLLIN, 0};
  int fd;
  if (poll(&pf, 1, WAIT_MS) != 1) die("no producer connected", IPCREF_OK);
  if ((fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC)) < 0)
    die("accept", IPCREF_OK);
  return fd;
}

/* `frames-recv PATH`: the consumer program. */
static int frames_recv_main(const char *path) {
  struct sockaddr_un a = address(path);
  int ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), data, ack;
  frames_setup();
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 2))
    die("listen", IPCREF_OK);
  data = accept_within(ls); /* the producer connects for the data first */
  ack = accept_within(ls);
  close(ls);
  unlink(path);
  consumer(data, ack);
}

static int connect_within(const char *path) {
  struct sockaddr_un a = address(path);
  double until = now_ns() + WAIT_MS * 1e6;
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket", IPCREF_OK);
    if (!connect(fd, (struct sockaddr *)&a, sizeof a)) return fd;
    close(fd);
    if ((errno != ENOENT && errno != ECONNREFUSED) || now_ns() > until)
      die("connect", IPCREF_OK);
    usleep(2000); /* the consumer is not listening yet */
  }
}

/* `frames-send MODE PATH [FRAMES]`: the producer program. */
static int frames_send_main(int argc, char **argv) {
  limits l = env_limits(0);
  int data, ack;
  l.frames = argc > 4 ? strtoul(argv[4], NULL, 0) : 300;
  if (l.frames < 1) return 2;
  frames_setup();
  data = connect_within(argv[3]);
  ack = connect_within(argv[3]);
  return produce_all(data, ack, &l);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc == 3 && !strcmp(argv[1], "frames-recv"))
    return frames_recv_main(argv[2]);
  if (argc >= 4 && !strcmp(argv[1], "frames-send") && parse_mode(argv[2]))
    return frames_send_main(argc, argv);
  if (argc >= 4 && parse_mode(argv[1])) return stream_main(argc, argv);
  fprintf(stderr,
          "usage: %s ipcref|reused seq|inflight4|mixed SIZE [SECONDS]\n"
          "       %s frames-recv PATH\n"
          "       %s frames-send ipcref|reused PATH [FRAMES]\n",
          argv[0], argv[0], argv[0]);
  return 2;
}
