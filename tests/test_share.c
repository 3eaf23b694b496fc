/* The sharing layer across real processes: every test forks its consumers
 * (socketpair(AF_UNIX, SOCK_SEQPACKET), one test SOCK_STREAM), drives them
 * over a control socket, and checks the producer's stats, fds and mappings.
 *
 * Children are forked before the parent makes its context, so they never
 * inherit a producer's (writable) segment fds; each child makes its own
 * context, answers commands, reports through its replies and its exit
 * status, and leaves with _exit (never through the harness summary).
 *
 * Environment: IPCREF_TEST_OPS scales the hand-off count (ops/100; 10,000
 * when unset), IPCREF_UNDER_VALGRIND=1 skips the seccomp and SIGSEGV parts,
 * IPCREF_TEST_SEED fixes the random release orders. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "counting_alloc.h" /* allocations that can be made to fail */
#include "../ipcref.h"

#define CTL_MS        30000 /* longest wait for a command or a reply */
#define RECV_MS       20000 /* longest ipcref_recv in a child */
#define REAP_MS       30000 /* longest wait for a child to exit */
#define CHILD_ALARM_S 120   /* safety net: a child never outlives this */
#define HELD_MAX      64    /* views a server child can hold */

#include "share_fixture.h"

/* The message layout this suite knows (src/share_wire.h): a 4-byte magic, then
 * the format version. */
#define MSG_MAGIC_OFFSET   0
#define MSG_VERSION_OFFSET 4

static long test_ops;
static unsigned rng;

static unsigned next_rand(void) {
  rng = rng * 1103515245u + 12345u;
  return rng >> 8;
}

/* ------------------------------------------------------------ data */

/* The bytes of element i of a pattern: a function of dtype, seed and i. */
static void pattern(ipcref_dtype dt, uint32_t seed, int64_t i,
                    unsigned char *out) {
  size_t n = ipcref_dtype_size(dt), k;
  uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull +
               (uint64_t)seed * 0xBF58476D1CE4E5B9ull + (uint64_t)dt + 1;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  if (dt == IPCREF_BOOL) {
    out[0] = (unsigned char)(x & 1);
    return;
  }
  for (k = 0; k < n; k++) {
    out[k] = (unsigned char)(x >> ((k % 8) * 8));
    if (k % 8 == 7) x = x * 0x2545F4914F6CDD1Dull + 1;
  }
}

/* Writes the pattern into v's elements in C order (v must be writable). */
static ipcref_result fill_pattern(const ipcref_view *v, uint32_t seed) {
  ipcref_view_iter it;
  unsigned char *p;
  int64_t i = 0;
  ipcref_result rc = ipcref_view_iter_init(v, &it);
  if (rc != IPCREF_OK) return rc;
  while ((p = (unsigned char *)ipcref_view_iter_next(&it)) != NULL)
    pattern(v->dtype, seed, i++, p);
  return IPCREF_OK;
}

/* The elements (in C order) that differ from the pattern; -1 when the view
 * cannot be read. */
static int64_t check_pattern(const ipcref_view *v, uint32_t seed) {
  ipcref_view_iter it;
  unsigned char want[16];
  const unsigned char *p;
  int64_t i = 0, bad = 0;
  size_t n = ipcref_dtype_size(v->dtype);
  if (!v->buf || ipcref_view_iter_init(v, &it) != IPCREF_OK) return -1;
  while ((p = (const unsigned char *)ipcref_view_iter_next(&it)) != NULL) {
    pattern(v->dtype, seed, i++, want);
    if (memcmp(p, want, n) != 0) bad++;
  }
  return bad;
}

/* A fresh C-contiguous view filled with the pattern: shared when ctx is
 * given, private otherwise. */
static ipcref_result pattern_view(ipcref_ctx *ctx, ipcref_dtype dt, int ndim,
                                  const int64_t *shape, uint32_t seed,
                                  ipcref_view *out) {
  ipcref_view v;
  ipcref_result rc;
  memset(&v, 0, sizeof v);
  rc = ctx ? ipcref_view_new_shared(ctx, dt, ndim, shape, &v)
           : ipcref_view_new(dt, ndim, shape, &v);
  if (rc != IPCREF_OK) return rc;
  rc = fill_pattern(&v, seed);
  if (rc != IPCREF_OK) {
    ipcref_view_release(&v);
    return rc;
  }
  *out = v;
  return IPCREF_OK;
}

/* The round-trip cases: every dtype small and large, then strided views
 * (transposed, sliced with a step, flipped, permuted, broadcast, 0-d,
 * empty, offset deep in the buffer, 5-d). Built the same way on both sides:
 * the consumer builds a private copy and compares. */
#define NCASES 41
static ipcref_result make_case(int c, ipcref_ctx *ctx, ipcref_view *out) {
  ipcref_view v;
  ipcref_result rc;
  ipcref_dtype dt = IPCREF_F32;
  int ndim = 2;
  int64_t shape[5] = {3, 5, 0, 0, 0};
  static const int perm3[3] = {2, 0, 1};
  if (c < 15) {
    dt = (ipcref_dtype)c;
  } else if (c < 30) {
    dt = (ipcref_dtype)(c - 15);
    shape[0] = 40, shape[1] = 70;
  } else {
    switch (c) {
    case 30: dt = IPCREF_F32, shape[0] = 64, shape[1] = 48; break;
    case 31: dt = IPCREF_I16, shape[0] = 50, shape[1] = 40; break;
    case 32: dt = IPCREF_C128, shape[0] = 20, shape[1] = 30; break;
    case 33:
      dt = IPCREF_F64, ndim = 3;
      shape[0] = 6, shape[1] = 7, shape[2] = 8;
      break;
    case 34: dt = IPCREF_U8, shape[0] = 1, shape[1] = 100; break;
    case 35: dt = IPCREF_I32, shape[0] = 10, shape[1] = 10; break;
    case 36: dt = IPCREF_I64, shape[0] = 10, shape[1] = 10; break;
    case 37: dt = IPCREF_BF16, shape[0] = 4, shape[1] = 1000; break;
    case 38:
      dt = IPCREF_U64, ndim = 5;
      shape[0] = 2, shape[1] = 3, shape[2] = 4, shape[3] = 5, shape[4] = 6;
      break;
    case 39: dt = IPCREF_F16, shape[0] = 300, shape[1] = 200; break;
    default: dt = IPCREF_C64, shape[0] = 1024, shape[1] = 16; break;
    }
  }
  rc = pattern_view(ctx, dt, ndim, shape, (uint32_t)c + 1, &v);
  if (rc != IPCREF_OK) return rc;
  switch (c) {
  case 30: rc = ipcref_view_transpose(&v, 0, 1, &v); break;
  case 31: rc = ipcref_view_slice(&v, 1, 1, IPCREF_SLICE_MAX, 3, &v); break;
  case 32: rc = ipcref_view_flip(&v, 0, &v); break;
  case 33:
    rc = ipcref_view_permute(&v, perm3, &v);
    if (rc == IPCREF_OK)
      rc = ipcref_view_slice(&v, 0, IPCREF_SLICE_MAX, IPCREF_SLICE_MIN, -2, &v);
    break;
  case 34: {
    int64_t to[2] = {5, 100};
    rc = ipcref_view_expand(&v, 2, to, &v);
    break;
  }
  case 35:
    rc = ipcref_view_select(&v, 0, 3, &v);
    if (rc == IPCREF_OK) rc = ipcref_view_select(&v, 0, 4, &v);
    break;
  case 36: rc = ipcref_view_slice(&v, 0, 5, 5, 1, &v); break;
  case 37: rc = ipcref_view_narrow(&v, 1, 500, 300, &v); break;
  case 38:
    rc = ipcref_view_flip(&v, 4, &v);
    if (rc == IPCREF_OK) rc = ipcref_view_transpose(&v, 1, 3, &v);
    break;
  case 39:
    rc = ipcref_view_slice(&v, 0, 10, 290, 7, &v);
    if (rc == IPCREF_OK) rc = ipcref_view_flip(&v, 1, &v);
    break;
  case 40: rc = ipcref_view_select(&v, 1, 5, &v); break;
  default: break;
  }
  if (rc != IPCREF_OK) {
    ipcref_view_release(&v);
    return rc;
  }
  *out = v;
  return IPCREF_OK;
}

/* Differences between a received view and the expected one: metadata
 * (dtype, shape, strides) and every element's bytes. */
static int64_t compare_views(const ipcref_view *got, const ipcref_view *want) {
  ipcref_view_iter ig, iw;
  const unsigned char *pg, *pw;
  int64_t bad = 0;
  int d;
  size_t n = ipcref_dtype_size(want->dtype);
  if (got->dtype != want->dtype || got->ndim != want->ndim) return 1000000;
  for (d = 0; d < want->ndim; d++)
    if (got->shape[d] != want->shape[d] || got->strides[d] != want->strides[d])
      bad++;
  if (bad) return 1000000 + bad;
  if (ipcref_view_numel(got) != ipcref_view_numel(want)) return 1000000;
  if (ipcref_view_iter_init(got, &ig) != IPCREF_OK ||
      ipcref_view_iter_init(want, &iw) != IPCREF_OK)
    return 1000000;
  while ((pw = (const unsigned char *)ipcref_view_iter_next(&iw)) != NULL) {
    pg = (const unsigned char *)ipcref_view_iter_next(&ig);
    if (!pg) return bad + 1;
    if (memcmp(pg, pw, n) != 0) bad++;
  }
  if (ipcref_view_iter_next(&ig) != NULL) bad++;
  return bad;
}

/* ------------------------------------------------------------ stats */

#define STAT_IS(s, field, want, line)                                          \
  do {                                                                         \
    if ((long long)(s).field != (long long)(want)) {                           \
      harness_failures_in_test++;                                              \
      printf("    %s:%d: stats." #field " = %lld, expected %lld\n", __FILE__,  \
             line, (long long)(s).field, (long long)(want));                   \
    }                                                                          \
  } while (0)

#define STAT_NONZERO(s, field, line)                                           \
  do {                                                                         \
    if ((s).field == 0) {                                                      \
      harness_failures_in_test++;                                              \
      printf("    %s:%d: stats." #field " = 0, expected > 0\n", __FILE__,      \
             line);                                                            \
    }                                                                          \
  } while (0)

/* After a collect: the producer holds `bufs` buffers, `limbo` blocks sit
 * in the limbo and `slots` leases are out (-1 skips a check). Bytes follow
 * the counts: zero exactly when the count is zero. */
static void expect_stats_at(ipcref_ctx *ctx, long bufs, long limbo, long slots,
                            int line) {
  ipcref_stats s;
  ipcref_collect(ctx);
  s = stats_of(ctx);
  if (bufs >= 0) {
    STAT_IS(s, live_bufs, bufs, line);
    if (bufs == 0) STAT_IS(s, live_bytes, 0, line);
    if (bufs > 0) STAT_NONZERO(s, live_bytes, line);
  }
  if (limbo >= 0) {
    STAT_IS(s, limbo_blocks, limbo, line);
    if (limbo == 0) STAT_IS(s, limbo_bytes, 0, line);
    if (limbo > 0) STAT_NONZERO(s, limbo_bytes, line);
  }
  if (slots >= 0) STAT_IS(s, live_slots, slots, line);
}
#define EXPECT_STATS(ctx, bufs, limbo, slots)                                  \
  expect_stats_at(ctx, bufs, limbo, slots, __LINE__)

/* Everything handed back: call after the peers are freed. */
static void expect_drained_at(ipcref_ctx *ctx, int line) {
  ipcref_stats s;
  expect_stats_at(ctx, 0, 0, 0, line);
  s = stats_of(ctx);
  STAT_IS(s, imported_bufs, 0, line);
  STAT_IS(s, peers, 0, line);
}
#define EXPECT_DRAINED(ctx) expect_drained_at(ctx, __LINE__)

/* ------------------------------------------------------------ the server */

/* A consumer child driven by commands over its control socket. It holds
 * up to HELD_MAX views; `sock2` (optional) is a second peer to forward to;
 * `xs` (optional) is an own transport for raw messages. */
enum {
  OP_RECV = 1, /* recv into held[k], check pattern seed */
  OP_VERIFY,   /* check held[k] against pattern seed */
  OP_DROP,     /* release held[k] */
  OP_FORWARD,  /* ipcref_send(peer2, held[k]) */
  OP_STATS,    /* just the reply */
  OP_XRECV,    /* receive raw message k from the own transport */
  OP_XIMPORT,  /* import a copy of raw message k into held[to] */
  OP_MALFORM,  /* import broken copies of raw message k: all refused */
  OP_QUIT      /* release everything, free, check, exit */
};

typedef struct cmd {
  int32_t op, k;
  uint32_t seed;
  int32_t to; /* OP_XIMPORT: the held view to import into */
} cmd;

typedef struct reply {
  int32_t rc;
  int32_t pad;
  int64_t bad;  /* mismatches (elements, refusals) */
  int64_t info; /* per command */
  ipcref_stats st;
} reply;

typedef struct server_arg {
  int sock, sock2, xs, ctl;
  int delay_ms; /* before making the peer (its hello comes late) */
} server_arg;

static int64_t malformed_imports(ipcref_peer *p, ipcref_ctx *ctx,
                                 const ipcref_msg *good);

static int server_child(void *argp) {
  server_arg *a = (server_arg *)argp;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL, *p2 = NULL;
  static ipcref_view held[HELD_MAX];
  static ipcref_msg raw[HELD_MAX];
  int k, failed = 0;
  res_mark res;
  res_begin(&res);
  memset(held, 0, sizeof held);
  memset(raw, 0, sizeof raw);
  if (a->delay_ms > 0) {
    struct timespec d;
    d.tv_sec = a->delay_ms / 1000;
    d.tv_nsec = (long)(a->delay_ms % 1000) * 1000000;
    nanosleep(&d, NULL);
  }
  if ((ctx = make_ctx(NULL)) == NULL) return 1;
  if ((p = make_peer(ctx, a->sock)) == NULL) failed = 1;
  if (a->sock2 >= 0 && (p2 = make_peer(ctx, a->sock2)) == NULL) failed = 1;
  while (!failed) {
    cmd c;
    reply r;
    ipcref_msg m;
    memset(&r, 0, sizeof r);
    if (ctl_recv(a->ctl, &c, sizeof c, CTL_MS) != (ssize_t)sizeof c) {
      printf("    server %d: no command\n", (int)getpid());
      failed = 1;
      break;
    }
    k = c.k >= 0 && c.k < HELD_MAX ? c.k : 0;
    switch (c.op) {
    case OP_RECV:
      ipcref_view_release(&held[k]);
      r.rc = ipcref_recv(p, &held[k], RECV_MS);
      if (r.rc == IPCREF_OK) r.bad = check_pattern(&held[k], c.seed);
      break;
    case OP_VERIFY: r.bad = check_pattern(&held[k], c.seed); break;
    case OP_DROP: ipcref_view_release(&held[k]); break;
    case OP_FORWARD: r.rc = ipcref_send(p2, &held[k]); break;
    case OP_STATS: break;
    case OP_XRECV:
      msg_close_fds(&raw[k]);
      r.rc = xfer_recv(a->xs, &raw[k], RECV_MS) == 0 ? 0 : -1000;
      r.info = raw[k].nfds;
      break;
    case OP_XIMPORT: {
      int to = c.to >= 0 && c.to < HELD_MAX ? c.to : k;
      msg_dup(&raw[k], &m);
      ipcref_view_release(&held[to]);
      r.rc = ipcref_import(p, &m, &held[to]);
      if (r.rc == IPCREF_OK) r.bad = check_pattern(&held[to], c.seed);
      break;
    }
    case OP_MALFORM: r.bad = malformed_imports(p, ctx, &raw[k]); break;
    case OP_QUIT:
      for (k = 0; k < HELD_MAX; k++) {
        ipcref_view_release(&held[k]);
        msg_close_fds(&raw[k]);
      }
      ipcref_peer_free(p);
      ipcref_peer_free(p2);
      p = p2 = NULL;
      break;
    default: r.rc = -1000; break;
    }
    ipcref_ctx_stats(ctx, &r.st);
    if (c.op == OP_QUIT) {
      CHECK_EQ(r.st.imported_bufs, 0);
      CHECK_EQ(r.st.live_bufs, 0);
      CHECK_EQ(r.st.live_slots, 0);
      CHECK_EQ(r.st.limbo_blocks, 0);
      CHECK_EQ(r.st.peers, 0);
      ipcref_ctx_free(ctx);
      ctx = NULL;
      /* The consumer's own fds and mappings are back too. */
      RES_END_CHILD(&res, 1 + (a->sock2 >= 0));
    }
    if (ctl_send(a->ctl, &r, sizeof r) != 0) failed = 1;
    if (c.op == OP_QUIT) return 0;
  }
  for (k = 0; k < HELD_MAX; k++) {
    ipcref_view_release(&held[k]);
    msg_close_fds(&raw[k]);
  }
  ipcref_peer_free(p);
  ipcref_peer_free(p2);
  ipcref_ctx_free(ctx);
  return 1;
}

static reply call_to(int ctl, int op, int k, int to, uint32_t seed) {
  cmd c;
  reply r;
  memset(&c, 0, sizeof c);
  memset(&r, 0, sizeof r);
  c.op = op;
  c.k = k;
  c.to = to;
  c.seed = seed;
  if (ctl_send(ctl, &c, sizeof c) != 0 ||
      ctl_recv(ctl, &r, sizeof r, CTL_MS) != (ssize_t)sizeof r) {
    memset(&r, 0, sizeof r);
    r.rc = -1000; /* no answer */
    r.bad = -1;
  }
  return r;
}

static reply call(int ctl, int op, int k, uint32_t seed) {
  return call_to(ctl, op, k, k, seed);
}

/* CHECKs a reply: rc as expected and nothing bad. */
#define CALL_OK(ctl, op, k, seed)                                              \
  do {                                                                         \
    reply call_r = call(ctl, op, k, seed);                                     \
    CHECK_EQ(call_r.rc, IPCREF_OK);                                            \
    CHECK_EQ(call_r.bad, 0);                                                   \
  } while (0)

/* A server child (a kid) with a control socket. */
typedef struct conn {
  kid k;
  int ctl; /* k.ctl */
  int xs;  /* this process's end of the own transport, or -1 */
  pid_t pid;
  server_arg a;
} conn;

/* Forks the server of c->a (kid_open made c->k); `other`: a socket to
 * another process it keeps (-1: none). */
static void conn_fork(conn *c, int other) {
  kid_fork(&c->k, server_child, &c->a, other);
  c->ctl = c->k.ctl;
  c->xs = c->k.nsock > 1 ? c->k.sock[1] : -1;
  c->pid = c->k.pid;
}

/* A server on a fresh socketpair of `type` to this process, with an own
 * transport if asked; its hello comes delay_ms late. */
static void conn_start_late(conn *c, int type, int with_xfer, int delay_ms) {
  memset(c, 0, sizeof *c);
  kid_open(&c->k, with_xfer ? 2 : 1, type);
  c->a.sock = c->k.their_sock[0];
  c->a.sock2 = -1;
  c->a.xs = with_xfer ? c->k.their_sock[1] : -1;
  c->a.ctl = c->k.their_ctl;
  c->a.delay_ms = delay_ms;
  conn_fork(c, -1);
}

static void conn_start(conn *c, int type, int with_xfer) {
  conn_start_late(c, type, with_xfer, 0);
}

/* Makes the parent's peer on the server's socket. */
static ipcref_peer *conn_peer(conn *c, ipcref_ctx *ctx) {
  return kid_peer(&c->k, 0, ctx);
}

/* Quits the server, closes the parent's fds, checks its exit. */
static void conn_stop_at(conn *c, int line) {
  reply r = call(c->ctl, OP_QUIT, 0, 0);
  if (r.rc != 0) {
    harness_failures_in_test++;
    printf("    %s:%d: server did not quit cleanly (%d)\n", __FILE__, line,
           (int)r.rc);
  }
  kid_close(&c->k);
  kid_exit0_at(&c->k, "server child", __FILE__, line);
  c->ctl = c->xs = -1;
}
#define CONN_STOP(c) conn_stop_at(c, __LINE__)

/* ------------------------------------------------------------ 1. round trip */

typedef struct rt_arg {
  int sock, ctl;
} rt_arg;

static const int batch_cases[3] = {31, 0, 38};

static int rt_child(void *argp) {
  rt_arg *a = (rt_arg *)argp;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  int64_t res[2] = {0, 0}; /* bad cases, received */
  int c;
  res_mark m;
  res_begin(&m);
  ctx = make_ctx(NULL);
  p = make_peer(ctx, a->sock);
  for (c = 0; c < NCASES + 3 && p; c++) {
    int id = c < NCASES ? c : batch_cases[c - NCASES];
    ipcref_view got, want;
    ipcref_result rc;
    int64_t bad;
    memset(&got, 0, sizeof got);
    memset(&want, 0, sizeof want);
    rc = ipcref_recv(p, &got, RECV_MS);
    if (rc != IPCREF_OK) {
      printf("    case %d: ipcref_recv: %s\n", id, ipcref_strerror(rc));
      res[0]++;
      break;
    }
    res[1]++;
    CHECK_EQ(make_case(id, NULL, &want), IPCREF_OK);
    bad = compare_views(&got, &want);
    if (bad) {
      printf("    case %d (%s): %lld differences\n", id,
             ipcref_dtype_name(want.dtype), (long long)bad);
      res[0]++;
    }
    ipcref_view_release(&got);
    ipcref_view_release(&want);
  }
  ctl_send(a->ctl, res, sizeof res);
  ipcref_peer_free(p);
  {
    ipcref_stats s = stats_of(ctx);
    CHECK_EQ(s.imported_bufs, 0);
    CHECK_EQ(s.peers, 0);
  }
  ipcref_ctx_free(ctx);
  RES_END_CHILD(&m, 1);
  return 0;
}

static void round_trip(int type) {
  res_mark m;
  kid k;
  int c;
  rt_arg a;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view batch[3];
  int64_t res[2] = {-1, -1};
  res_begin(&m);
  memset(batch, 0, sizeof batch);
  kid_open(&k, 1, type);
  a.sock = k.their_sock[0];
  a.ctl = k.their_ctl;
  kid_fork(&k, rt_child, &a, -1);
  ctx = make_ctx(NULL);
  p = kid_peer(&k, 0, ctx);
  for (c = 0; c < NCASES; c++) {
    ipcref_view v;
    memset(&v, 0, sizeof v);
    CHECK_EQ(make_case(c, ctx, &v), IPCREF_OK);
    CHECK(ipcref_buf_is_shared(v.buf));
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ipcref_view_release(&v); /* sent: the consumer's lease keeps it */
  }
  for (c = 0; c < 3; c++)
    CHECK_EQ(make_case(batch_cases[c], ctx, &batch[c]), IPCREF_OK);
  CHECK_EQ(ipcref_send_batch(p, batch, 3), IPCREF_OK);
  for (c = 0; c < 3; c++) ipcref_view_release(&batch[c]);
  CHECK_EQ(ctl_recv(k.ctl, res, sizeof res, CTL_MS), (ssize_t)sizeof res);
  CHECK_EQ(res[0], 0);          /* cases that differed */
  CHECK_EQ(res[1], NCASES + 3); /* views received */
  KID_EXIT0(&k, "consumer");
  ipcref_peer_free(p);
  kid_close(&k);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

static void test_round_trip_seqpacket(void) {
  round_trip(SOCK_SEQPACKET);
}
static void test_round_trip_stream(void) {
  round_trip(SOCK_STREAM);
}

/* ------------------------------------------------------------ 2. drop first */

/* The producer drops its reference right after sending: the consumer still
 * reads the right data, even after the producer allocated (and scribbled
 * over) fresh blocks; the block sits in the limbo until the consumer lets
 * go, then a collect frees it. Once with the message still in flight, once
 * after the consumer received it. */
static void test_producer_drops_first(void) {
  res_mark m;
  conn c;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p;
  int round, i;
  const int64_t shape[2] = {512, 512}; /* 1 MiB of f32 */
  res_begin(&m);
  conn_start(&c, SOCK_SEQPACKET, 0);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  p = conn_peer(&c, ctx);
  for (round = 0; round < 2; round++) {
    uint32_t seed = 100 + (uint32_t)round;
    ipcref_view v, scribble[4];
    size_t freed;
    memset(&v, 0, sizeof v);
    memset(scribble, 0, sizeof scribble);
    CHECK_EQ(pattern_view(ctx, IPCREF_F32, 2, shape, seed, &v), IPCREF_OK);
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    if (round == 1) CALL_OK(c.ctl, OP_RECV, 0, seed); /* received first */
    ipcref_view_release(&v);
    EXPECT_STATS(ctx, 0, 1, 1); /* in the limbo, leased */
    for (i = 0; i < 4; i++) {   /* fresh blocks: must not be that one */
      CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_F32, 2, shape, &scribble[i]),
               IPCREF_OK);
      if (scribble[i].buf)
        memset(ipcref_view_data_mut(&scribble[i]), 0xEE, 512 * 512 * 4);
    }
    for (i = 0; i < 4; i++) ipcref_view_release(&scribble[i]);
    EXPECT_STATS(ctx, 0, 1, 1);
    if (round == 0) CALL_OK(c.ctl, OP_RECV, 0, seed); /* was in flight */
    CALL_OK(c.ctl, OP_VERIFY, 0, seed);
    EXPECT_STATS(ctx, 0, 1, 1); /* the consumer still holds it */
    CALL_OK(c.ctl, OP_DROP, 0, 0);
    freed = ipcref_collect(ctx);
    CHECK(freed >= 512 * 512 * 4);
    EXPECT_STATS(ctx, 0, 0, 0);
  }
  {
    reply r = call(c.ctl, OP_STATS, 0, 0);
    CHECK_EQ(r.st.imported_bufs, 0);
  }
  ipcref_peer_free(p);
  CONN_STOP(&c);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* ------------------------------------------------------------ 3. 8 holders */

#define NCONS 8

/* One block to 8 consumers at once, let go in a random order with the
 * producer somewhere in it: freed exactly when the last holder lets go. */
static void test_eight_consumers(void) {
  res_mark m;
  conn c[NCONS];
  ipcref_peer *p[NCONS];
  ipcref_ctx *ctx = NULL;
  int i, round;
  const int64_t shape[2] = {128, 512};
  res_begin(&m);
  for (i = 0; i < NCONS; i++) conn_start(&c[i], SOCK_SEQPACKET, 0);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  for (i = 0; i < NCONS; i++) p[i] = conn_peer(&c[i], ctx);
  for (round = 0; round < 4; round++) {
    uint32_t seed = 200 + (uint32_t)round;
    int order[NCONS + 1], held = NCONS, mine = 1, j;
    ipcref_view v;
    memset(&v, 0, sizeof v);
    CHECK_EQ(pattern_view(ctx, IPCREF_F32, 2, shape, seed, &v), IPCREF_OK);
    for (i = 0; i < NCONS; i++) CHECK_EQ(ipcref_send(p[i], &v), IPCREF_OK);
    for (i = 0; i < NCONS; i++) CALL_OK(c[i].ctl, OP_RECV, 0, seed);
    EXPECT_STATS(ctx, 1, 0, NCONS);
    /* A random order of the 8 consumers and the producer (NCONS); round 0
     * has the producer first. */
    for (i = 0; i <= NCONS; i++) order[i] = i;
    for (i = NCONS; i > 0; i--) {
      int t, r = (int)(next_rand() % (unsigned)(i + 1));
      t = order[i], order[i] = order[r], order[r] = t;
    }
    if (round == 0)
      for (i = 0; i <= NCONS; i++)
        if (order[i] == NCONS) order[i] = order[0], order[0] = NCONS;
    for (j = 0; j <= NCONS; j++) {
      i = order[j];
      if (i == NCONS) {
        ipcref_view_release(&v);
        mine = 0;
      } else {
        CALL_OK(c[i].ctl, OP_VERIFY, 0, seed);
        CALL_OK(c[i].ctl, OP_DROP, 0, 0);
        held--;
      }
      EXPECT_STATS(ctx, mine, !mine && held > 0, held);
    }
  }
  for (i = 0; i < NCONS; i++) ipcref_peer_free(p[i]);
  for (i = 0; i < NCONS; i++) CONN_STOP(&c[i]);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* ------------------------------------------------------------ 4. forwarding */

/* A -> B -> C: A (this process) sends to B, B forwards to C; the three let
 * go in each of the 6 orders. A sees every holder in its own ledgers, and
 * the block is freed when the last one lets go. */
static void test_forwarding(void) {
  static const char orders[6][4] = {"ABC", "ACB", "BAC", "BCA", "CAB", "CBA"};
  res_mark m;
  conn b, cc;
  int bc[2];
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p;
  int round, j;
  const int64_t shape[2] = {256, 256};
  res_begin(&m);
  xsocketpair(SOCK_SEQPACKET, bc);
  /* B: peer sockets to A and to C. */
  memset(&b, 0, sizeof b);
  kid_open(&b.k, 1, SOCK_SEQPACKET);
  b.a.sock = b.k.their_sock[0];
  b.a.sock2 = bc[0];
  b.a.xs = -1;
  b.a.ctl = b.k.their_ctl;
  conn_fork(&b, bc[0]);
  tclose(bc[0]);
  /* C: a plain server on B's socket. */
  memset(&cc, 0, sizeof cc);
  kid_open(&cc.k, 0, SOCK_SEQPACKET);
  cc.a.sock = bc[1];
  cc.a.sock2 = -1;
  cc.a.xs = -1;
  cc.a.ctl = cc.k.their_ctl;
  conn_fork(&cc, bc[1]);
  tclose(bc[1]);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  p = conn_peer(&b, ctx);
  for (round = 0; round < 6; round++) {
    uint32_t seed = 300 + (uint32_t)round;
    int a_holds = 1, b_holds = 1, c_holds = 1;
    ipcref_view v;
    memset(&v, 0, sizeof v);
    CHECK_EQ(pattern_view(ctx, IPCREF_U16, 2, shape, seed, &v), IPCREF_OK);
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    CALL_OK(b.ctl, OP_RECV, 0, seed);
    CALL_OK(b.ctl, OP_FORWARD, 0, 0);
    CALL_OK(cc.ctl, OP_RECV, 0, seed);
    EXPECT_STATS(ctx, 1, 0, 2); /* B's lease and C's, both at A */
    for (j = 0; j < 3; j++) {
      switch (orders[round][j]) {
      case 'A':
        ipcref_view_release(&v);
        a_holds = 0;
        break;
      case 'B':
        CALL_OK(b.ctl, OP_VERIFY, 0, seed);
        CALL_OK(b.ctl, OP_DROP, 0, 0);
        b_holds = 0;
        break;
      default:
        CALL_OK(cc.ctl, OP_VERIFY, 0, seed); /* C reads correct data */
        CALL_OK(cc.ctl, OP_DROP, 0, 0);
        c_holds = 0;
        break;
      }
      EXPECT_STATS(ctx, a_holds, !a_holds && (b_holds || c_holds),
                   b_holds + c_holds);
    }
    {
      reply r = call(b.ctl, OP_STATS, 0, 0);
      CHECK_EQ(r.st.imported_bufs, 0);
      CHECK_EQ(r.st.live_slots, 0);
      r = call(cc.ctl, OP_STATS, 0, 0);
      CHECK_EQ(r.st.imported_bufs, 0);
    }
  }
  ipcref_peer_free(p);
  CONN_STOP(&cc);
  CONN_STOP(&b);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* ------------------------------------------------------------ 5. hand-offs */

/* 64 KiB segments hold 256 blocks of 256 bytes; at most 128 are out at a
 * time, so 10,000 hand-offs stay in one segment only if freed blocks are
 * reused. */
#define HANDOFF_BYTES   256
#define HANDOFF_WINDOW  128
#define HANDOFF_SEGMENT (64 * 1024)

typedef struct handoff_arg {
  int sock, ctl;
  long n;
} handoff_arg;

static void handoff_fill(unsigned char *d, long i) {
  int k;
  for (k = 0; k < HANDOFF_BYTES; k++) d[k] = (unsigned char)(i * 7 + k * 13);
  memcpy(d, &i, sizeof i);
}

static int handoff_child(void *argp) {
  handoff_arg *a = (handoff_arg *)argp;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  long i, bad = 0;
  uint64_t res[4] = {0, 0, 0, 0};
  unsigned char want[HANDOFF_BYTES];
  res_mark m;
  res_begin(&m);
  ctx = make_ctx(NULL);
  p = make_peer(ctx, a->sock);
  for (i = 0; i < a->n && p; i++) {
    ipcref_view v;
    const int64_t zero[1] = {0};
    const unsigned char *d;
    memset(&v, 0, sizeof v);
    if (ipcref_recv(p, &v, RECV_MS) != IPCREF_OK) {
      bad++;
      break;
    }
    handoff_fill(want, i);
    d = (const unsigned char *)ipcref_view_ptr(&v, zero);
    if (v.ndim != 1 || v.shape[0] != HANDOFF_BYTES || !d ||
        memcmp(d, want, HANDOFF_BYTES) != 0)
      bad++;
    ipcref_view_release(&v);
    if ((i + 1) % HANDOFF_WINDOW == 0 || i + 1 == a->n) {
      int64_t done = i + 1;
      if (ctl_send(a->ctl, &done, sizeof done) != 0) bad++;
    }
  }
  {
    ipcref_stats s = stats_of(ctx);
    res[0] = (uint64_t)bad;
    res[1] = s.fds_received;
    res[2] = s.mapped_segments;
    res[3] = s.imported_bufs;
  }
  ctl_send(a->ctl, res, sizeof res);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  RES_END_CHILD(&m, 1);
  return bad != 0;
}

/* 10,000 fresh small blocks handed off one after the other through the
 * same segment: one segment fd and one ledger fd cross, no more, and the
 * producer reuses the freed blocks (one 64 KiB segment for all). */
static void test_many_handoffs(void) {
  res_mark m;
  kid k;
  handoff_arg a;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  long i, n = test_ops > 0 ? test_ops / 100 : 10000;
  uint64_t res[4] = {1, 0, 0, 0};
  ipcref_stats s;
  ipcref_ctx_options opt;
  if (n < 10) n = 10;
  memset(&opt, 0, sizeof opt);
  opt.segment_size = HANDOFF_SEGMENT;
  res_begin(&m);
  kid_open(&k, 1, SOCK_SEQPACKET);
  a.sock = k.their_sock[0];
  a.ctl = k.their_ctl;
  a.n = n;
  kid_fork(&k, handoff_child, &a, -1);
  ctx = make_ctx(&opt);
  p = kid_peer(&k, 0, ctx);
  for (i = 0; i < n && p; i++) {
    ipcref_buf *b = NULL;
    ipcref_view v;
    const int64_t len = HANDOFF_BYTES;
    unsigned char *d;
    ipcref_result rc = ipcref_shared_new(ctx, HANDOFF_BYTES, &b);
    if (rc != IPCREF_OK) {
      CHECK_EQ(rc, IPCREF_OK);
      break;
    }
    d = (unsigned char *)ipcref_buf_get_mut(b);
    CHECK(d != NULL);
    if (d) handoff_fill(d, i);
    memset(&v, 0, sizeof v);
    CHECK_EQ(ipcref_view_of(b, IPCREF_U8, 1, &len, &v), IPCREF_OK);
    ipcref_buf_release(b);
    rc = ipcref_send(p, &v);
    ipcref_view_release(&v); /* at once: the consumer's lease keeps it */
    if (rc != IPCREF_OK) {
      CHECK_EQ(rc, IPCREF_OK);
      break;
    }
    if ((i + 1) % HANDOFF_WINDOW == 0 || i + 1 == n) {
      int64_t done = -1;
      if (ctl_recv(k.ctl, &done, sizeof done, CTL_MS) != (ssize_t)sizeof done) {
        CHECK(!"consumer acknowledged");
        break;
      }
      CHECK_EQ(done, i + 1);
    }
  }
  CHECK_EQ(i, n);
  CHECK_EQ(ctl_recv(k.ctl, res, sizeof res, CTL_MS), (ssize_t)sizeof res);
  CHECK_EQ(res[0], 0); /* blocks with wrong data */
  CHECK_EQ(res[1], 3); /* the consumer received 3 fds in all */
  CHECK_EQ(res[2], 1); /* and mapped 1 segment */
  CHECK_EQ(res[3], 0);
  s = stats_of(ctx);
  CHECK_EQ(s.fds_sent, 3); /* one segment fd, one ledger fd, its bell */
  CHECK_EQ(s.mapped_segments, 1);
  CHECK_EQ(s.segment_bytes, HANDOFF_SEGMENT); /* blocks were reused */
  KID_EXIT0(&k, "consumer");
  ipcref_peer_free(p);
  kid_close(&k);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* ------------------------------------------------------------ 6. no syscall */

typedef struct strict_arg {
  int sock, ctl, strict;
} strict_arg;

static int strict_child(void *argp) {
  strict_arg *a = (strict_arg *)argp;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v;
  char ch = 'f';
  const int64_t shape[1] = {1 << 16};
  res_mark m;
  res_begin(&m);
  memset(&v, 0, sizeof v);
  ctx = make_ctx(NULL);
  p = make_peer(ctx, a->sock);
  if (ipcref_recv(p, &v, RECV_MS) == IPCREF_OK && v.ndim == 1 &&
      v.shape[0] == shape[0] && check_pattern(&v, 600) == 0)
    ch = 'r';
  fflush(stdout);
  if (ctl_send(a->ctl, &ch, 1) != 0 || ch != 'r') goto out;
  if (ctl_recv(a->ctl, &ch, 1, CTL_MS) != 1) goto out;
  if (a->strict) {
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) {
      ch = 'e'; /* no seccomp here: say so, go on without */
      ctl_send(a->ctl, &ch, 1);
      a->strict = 0;
    }
  }
  /* From here on (strict mode): only read, write, exit, sigreturn. */
  ipcref_view_release(&v);
  ch = 'k';
  if (write(a->ctl, &ch, 1) != 1) goto out;
  if (read(a->ctl, &ch, 1) != 1) goto out; /* the producer looked */
  if (a->strict) syscall(SYS_exit, 0);
out:
  ipcref_view_release(&v);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  RES_END_CHILD(&m, 1);
  return ch == 'x' ? 0 : 1;
}

/* The consumer's release is one store: it runs in seccomp strict mode
 * (any system call but read/write/exit kills it), and the producer sees
 * the lease back while the consumer is still alive. */
static void test_release_without_syscalls(void) {
  res_mark m;
  kid k;
  strict_arg a;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v;
  char ch = 0;
  const int64_t shape[1] = {1 << 16};
  int strict = !UNDER_ASAN && !under_valgrind;
  if (!strict)
    printf("  note: seccomp strict mode skipped under %s; the release is "
           "still checked\n",
           UNDER_ASAN ? "ASan" : "valgrind");
  res_begin(&m);
  memset(&v, 0, sizeof v);
  kid_open(&k, 1, SOCK_SEQPACKET);
  a.sock = k.their_sock[0];
  a.ctl = k.their_ctl;
  a.strict = strict;
  kid_fork(&k, strict_child, &a, -1);
  ctx = make_ctx(NULL);
  p = kid_peer(&k, 0, ctx);
  CHECK_EQ(pattern_view(ctx, IPCREF_U32, 1, shape, 600, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  CHECK_EQ(ctl_recv(k.ctl, &ch, 1, CTL_MS), 1);
  CHECK_EQ(ch, 'r'); /* imported and checked */
  EXPECT_STATS(ctx, 1, 0, 1);
  ch = 'g';
  CHECK_EQ(ctl_send(k.ctl, &ch, 1), 0);
  CHECK_EQ(ctl_recv(k.ctl, &ch, 1, CTL_MS), 1);
  if (ch == 'e') {
    printf("  note: prctl(PR_SET_SECCOMP) refused here: strict part "
           "skipped\n");
    CHECK_EQ(ctl_recv(k.ctl, &ch, 1, CTL_MS), 1);
  }
  CHECK_EQ(ch, 'k');          /* released in strict mode, still alive */
  EXPECT_STATS(ctx, 1, 0, 0); /* the lease is back */
  ch = 'x';
  CHECK_EQ(ctl_send(k.ctl, &ch, 1), 0);
  KID_EXIT0(&k, "consumer in strict mode");
  ipcref_view_release(&v);
  ipcref_peer_free(p);
  kid_close(&k);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* ------------------------------------------------------------ 7. read-only */

/* The inode of the mapping that holds `addr` (0 when none). */
static unsigned long inode_at(const void *addr, unsigned long *start,
                              unsigned long *end) {
  char line[512];
  unsigned long s, e, off, ino, want = (unsigned long)addr, found = 0;
  unsigned maj, mnr;
  char perms[8];
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &s, &e, perms, &off, &maj,
               &mnr, &ino) == 7 &&
        s <= want && want < e) {
      found = ino;
      *start = s;
      *end = e;
      break;
    }
  fclose(f);
  return found;
}

/* Tries to map fd writable and shared; 0 when refused with EACCES/EPERM. */
static int try_map_writable(int fd, const char *what) {
  struct stat st;
  void *q;
  if (fstat(fd, &st) != 0 || st.st_size == 0) return 0;
  q = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (q != MAP_FAILED) {
    munmap(q, (size_t)st.st_size);
    printf("    %s: mmap(PROT_WRITE, MAP_SHARED) succeeded\n", what);
    return 1;
  }
  if (errno != EACCES && errno != EPERM) {
    printf("    %s: mmap failed with errno %d, not EACCES/EPERM\n", what,
           errno);
    return 1;
  }
  return 0;
}

static int rdonly_child(void *argp) {
  rt_arg *a = (rt_arg *)argp;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v, other;
  const int64_t zero[1] = {0};
  const int64_t shape[1] = {1 << 20};
  unsigned long ino, start = 0, end = 0;
  long page = sysconf(_SC_PAGESIZE);
  const char *d;
  int seg_fds = 0, memfds = 0;
  DIR *dir;
  struct dirent *e;
  res_mark m;
  res_begin(&m);
  memset(&v, 0, sizeof v);
  memset(&other, 0, sizeof other);
  ctx = make_ctx(NULL);
  p = make_peer(ctx, a->sock);
  CHECK_EQ(ipcref_recv(p, &v, RECV_MS), IPCREF_OK);
  CHECK_EQ(check_pattern(&v, 700), 0);
  d = (const char *)ipcref_view_ptr(&v, zero);
  CHECK(d != NULL);
  if (!d) goto out;
  /* Not writable through the library. */
  CHECK(ipcref_view_data_mut(&v) == NULL);
  CHECK(ipcref_buf_get_mut(v.buf) == NULL);
  CHECK_EQ(pattern_view(NULL, IPCREF_U8, 1, shape, 1, &other), IPCREF_OK);
  CHECK_EQ(ipcref_view_copy(&v, &other), IPCREF_EBUSY);
  CHECK_EQ(check_pattern(&v, 700), 0);
  /* Not writable through mprotect. */
  {
    void *pg = (void *)((uintptr_t)d & ~(uintptr_t)(page - 1));
    int r = mprotect(pg, (size_t)page, PROT_READ | PROT_WRITE);
    CHECK_EQ(r, -1);
    if (r == 0)
      mprotect(pg, (size_t)page, PROT_READ);
    else
      CHECK(errno == EACCES);
  }
  /* Not writable through the segment's fd, or a reopened one. */
  ino = inode_at(d, &start, &end);
  CHECK(ino != 0);
  dir = opendir("/proc/self/fd");
  CHECK(dir != NULL);
  while (dir && (e = readdir(dir)) != NULL) {
    char path[64], link[256];
    struct stat st;
    ssize_t n;
    int fd = atoi(e->d_name), fd2;
    if (e->d_name[0] == '.' || fd == dirfd(dir)) continue;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    n = readlink(path, link, sizeof link - 1);
    if (n <= 0) continue;
    link[n] = 0;
    if (strncmp(link, "/memfd:", 7) != 0) continue;
    memfds++;
    if (fstat(fd, &st) != 0 || st.st_ino != ino) continue; /* the ledger */
    seg_fds++;
    CHECK_EQ(try_map_writable(fd, "the segment fd"), 0);
    {
      int seals = fcntl(fd, F_GET_SEALS);
      CHECK(seals >= 0 && (seals & F_SEAL_SHRINK));
    }
    fd2 = open(path, O_RDWR | O_CLOEXEC);
    if (fd2 >= 0) { /* a hostile consumer reopens it read-write */
      CHECK_EQ(try_map_writable(fd2, "the segment reopened O_RDWR"), 0);
      close(fd2);
    }
  }
  if (dir) closedir(dir);
  CHECK(memfds >= 1);
  if (seg_fds == 0) { /* the fd was closed after mapping: the mapping's file */
    char path[96];
    int fd2;
    snprintf(path, sizeof path, "/proc/self/map_files/%lx-%lx", start, end);
    fd2 = open(path, O_RDWR | O_CLOEXEC);
    if (fd2 >= 0) {
      CHECK_EQ(try_map_writable(fd2, "the mapped segment reopened"), 0);
      close(fd2);
    } else {
      printf("  note: the segment's fd is closed and map_files is not open "
             "to us: only mprotect and the store were tried\n");
    }
  }
  /* A write to the data faults (not under valgrind: its report is noise). */
  if (!under_valgrind) {
    pid_t w;
    fflush(stdout);
    w = fork();
    if (w == 0) {
      signal(SIGSEGV, SIG_DFL);
      *(volatile char *)d = 1;
      _exit(0);
    }
    if (w > 0) {
      int st = wait_child(w, REAP_MS);
      CHECK(st != -1 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0));
    }
  }
  /* Copy-on-write gives a private, writable copy with the same values:
   * of the buffer (unique here, but read-only) and of the view. */
  {
    ipcref_view w = v; /* a view of its own over the same block */
    ipcref_buf *orig = v.buf;
    ipcref_buf_retain(w.buf);
    CHECK_EQ(ipcref_view_make_mut(&w), IPCREF_OK);
    CHECK(ipcref_view_data_mut(&w) != NULL);
    CHECK_EQ(check_pattern(&w, 700), 0);
    ipcref_view_release(&w);
    CHECK_EQ(ipcref_buf_strong_count(orig), 1); /* unique, but read-only */
    CHECK_EQ(ipcref_buf_make_mut(&v.buf), IPCREF_OK);
    CHECK(v.buf != orig);
    CHECK(ipcref_buf_get_mut(v.buf) != NULL);
  }
  CHECK_EQ(ipcref_view_make_mut(&v), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&v) != NULL);
  CHECK_EQ(check_pattern(&v, 700), 0);
out:
  ipcref_view_release(&v);
  ipcref_view_release(&other);
  {
    char ch = 'd';
    ctl_send(a->ctl, &ch, 1);
  }
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  RES_END_CHILD(&m, 1);
  return 0;
}

/* A consumer cannot write the producer's memory: data_mut is NULL, the
 * page cannot be made writable, the segment fd cannot be mapped writable
 * (not even reopened read-write), and a store faults. */
static void test_read_only_mapping(void) {
  res_mark m;
  kid k;
  rt_arg a;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v;
  char ch = 0;
  const int64_t shape[1] = {1 << 20};
  res_begin(&m);
  memset(&v, 0, sizeof v);
  kid_open(&k, 1, SOCK_SEQPACKET);
  a.sock = k.their_sock[0];
  a.ctl = k.their_ctl;
  kid_fork(&k, rdonly_child, &a, -1);
  ctx = make_ctx(NULL);
  p = kid_peer(&k, 0, ctx);
  CHECK_EQ(pattern_view(ctx, IPCREF_U8, 1, shape, 700, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  CHECK_EQ(ctl_recv(k.ctl, &ch, 1, CTL_MS), 1);
  KID_EXIT0(&k, "consumer");
  CHECK_EQ(check_pattern(&v, 700), 0); /* untouched */
  ipcref_view_release(&v);
  ipcref_peer_free(p);
  kid_close(&k);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* A consumer that holds a sent buffer, checks that the producer's writes
 * never reached it ('c': look again), and lets go ('d'); a killed one
 * never does. */
static int holding_child(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
  ipcref_view v;
  CHECK_EQ(ipcref_recv(p, &v, 5000 * slow), IPCREF_OK);
  CHECK_EQ(check_pattern(&v, 41), 0);
  ctl_put(k->their_ctl, 'r');
  if (ctl_get(k->their_ctl, CTL_MS) == 'c') {
    CHECK_EQ(check_pattern(&v, 41), 0); /* none of the producer's writes */
    ipcref_view_release(&v);
    ctl_put(k->their_ctl, 'd');
    ctl_get(k->their_ctl, CTL_MS); /* its end closed */
  }
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* While a consumer holds a buffer it was sent, the producer's buffer is
 * not its alone: every way to write it in place is refused (get_mut,
 * view_data_mut, view_copy) and make_mut copies, so no write of the
 * producer reaches what the consumer reads. Once the consumer lets go,
 * or dies, the same memory is writable in place again, without a copy:
 * the look sweeps the returns, and notices the death. */
static void test_sent_buffer_not_writable(void) {
  const int64_t n = 4096;
  int64_t at[1] = {0};
  kid kids[2]; /* one lets go, one is killed; forked before the context */
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v, copy, src;
  ipcref_buf *b;
  unsigned char *mem;
  long deadline;
  int round;
  for (round = 0; round < 2; round++)
    kid_start(&kids[round], 1, SOCK_SEQPACKET, holding_child);
  ctx = make_ctx(NULL);
  CHECK_EQ(pattern_view(ctx, IPCREF_U8, 1, &n, 41, &v), IPCREF_OK);
  mem = (unsigned char *)ipcref_view_data_mut(&v);
  CHECK(mem != NULL); /* unique and not sent: ours */
  CHECK_EQ(ipcref_view_new(IPCREF_U8, 1, &n, &src), IPCREF_OK);
  for (round = 0; round < 2; round++) {
    kid *k = &kids[round];
    if (k->pid <= 0 || !mem || !(p = kid_peer(k, 0, ctx))) {
      KID_KILL(k, "consumer");
      kid_close(k);
      continue;
    }
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    CTL_EXPECT(k->ctl, 'r');
    CHECK(ipcref_buf_get_mut(v.buf) == NULL);
    CHECK(ipcref_view_data_mut(&v) == NULL);
    CHECK_EQ(ipcref_view_copy(&v, &src), IPCREF_EBUSY);
    CHECK_EQ(ipcref_view_clone(&v, &copy), IPCREF_OK);
    CHECK_EQ(ipcref_view_make_mut(&copy), IPCREF_OK); /* a copy */
    CHECK(ipcref_view_data_mut(&copy) != NULL &&
          ipcref_view_data_mut(&copy) != (void *)mem);
    if (ipcref_view_data_mut(&copy)) memset(ipcref_view_data_mut(&copy), 0, 64);
    ipcref_view_release(&copy);
    b = ipcref_buf_retain(v.buf);
    CHECK_EQ(ipcref_buf_make_mut(&b), IPCREF_OK); /* a copy too */
    CHECK(b != v.buf && ipcref_buf_get_mut(b) != NULL);
    ipcref_buf_release(b);
    CHECK(ipcref_view_ptr(&v, at) == (void *)mem); /* v itself kept */
    if (round == 0) {
      ctl_put(k->ctl, 'c');
      CTL_EXPECT(k->ctl, 'd'); /* it let go: the lease is back */
    } else {
      KID_KILL(k, "consumer");
    }
    deadline = now_ms() + 5000 * slow; /* a death is heard in a tick */
    while (!ipcref_buf_get_mut(v.buf) && now_ms() < deadline) sleep_us(1000);
    CHECK(ipcref_buf_get_mut(v.buf) == (void *)mem); /* no copy */
    CHECK(ipcref_view_data_mut(&v) == (void *)mem);
    CHECK_EQ(ipcref_view_copy(&v, &src), IPCREF_OK);
    CHECK_EQ(fill_pattern(&v, 41), IPCREF_OK); /* as it was, once more */
    ipcref_peer_free(p);
    KID_END(k, "consumer");
  }
  ipcref_view_release(&src);
  ipcref_view_release(&v);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
}

/* ------------------------------------------------------------ 8. pressure */

/* A tiny cap (two 64 KiB segments) filled by blocks the consumer holds: the
 * next allocation is ENOMEM; once the consumer lets go, the next
 * allocation sweeps and succeeds, and the whole capacity is back. */
static void test_allocation_pressure(void) {
  res_mark m;
  conn c;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p;
  ipcref_ctx_options opt;
  ipcref_buf *mine[64];
  ipcref_result rc = IPCREF_OK;
  uint64_t sweeps;
  int n, n2, i;
  const size_t blk = 16384;
  res_begin(&m);
  memset(mine, 0, sizeof mine);
  memset(&opt, 0, sizeof opt);
  opt.segment_size = 64 * 1024;
  opt.max_bytes = 2 * 64 * 1024;
  conn_start(&c, SOCK_SEQPACKET, 0);
  CHECK_EQ(ipcref_ctx_new(&opt, &ctx), IPCREF_OK);
  p = conn_peer(&c, ctx);
  for (n = 0; n < HELD_MAX && ctx; n++) {
    ipcref_view v;
    const int64_t shape[1] = {(int64_t)blk};
    memset(&v, 0, sizeof v);
    rc = pattern_view(ctx, IPCREF_U8, 1, shape, 800 + (uint32_t)n, &v);
    if (rc != IPCREF_OK) break;
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ipcref_view_release(&v);
    CALL_OK(c.ctl, OP_RECV, n, 800 + (uint32_t)n);
  }
  CHECK_EQ(rc, IPCREF_ENOMEM);
  CHECK(n >= 2 && n <= 8);
  EXPECT_STATS(ctx, 0, n, n); /* everything is in the limbo */
  {
    ipcref_stats s = stats_of(ctx);
    CHECK(s.segment_bytes <= opt.max_bytes);
  }
  for (i = 0; i < n; i++) {
    CALL_OK(c.ctl, OP_VERIFY, i, 800 + (uint32_t)i);
    CALL_OK(c.ctl, OP_DROP, i, 0);
  }
  /* No collect: the failing allocation itself sweeps and retries. */
  sweeps = stats_of(ctx).sweeps;
  CHECK_EQ(ipcref_shared_new(ctx, blk, &mine[0]), IPCREF_OK);
  CHECK(stats_of(ctx).sweeps > sweeps);
  for (n2 = 1; n2 < 64 && mine[n2 - 1]; n2++) {
    rc = ipcref_shared_new(ctx, blk, &mine[n2]);
    if (rc != IPCREF_OK) break;
  }
  CHECK_EQ(rc, IPCREF_ENOMEM);
  CHECK_EQ(n2, n); /* the same capacity as before */
  EXPECT_STATS(ctx, n2, 0, 0);
  for (i = 0; i < 64; i++) ipcref_buf_release(mine[i]);
  ipcref_peer_free(p);
  CONN_STOP(&c);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* ------------------------------------------------------------ 9. replays */

/* What the producer does with a message it moved itself: the consumer got
 * duplicates of its fds, so the producer closes its own. */
static void sent_by_hand(ipcref_msg *msg) {
  ipcref_msg_sent(msg); /* the fds are closed, the leases stay live */
  CHECK_EQ(msg->nfds, 0);
  CHECK(msg->origin_ctx == 0 && msg->origin_peer == 0);
}

static uint64_t le(const unsigned char *b, size_t at, int bytes) {
  uint64_t v = 0;
  int i;
  for (i = 0; i < bytes; i++) v |= (uint64_t)b[at + (size_t)i] << (8 * i);
  return v;
}

/* White box: the lease (slot, generation) a one-view message carries, in
 * the wire format of src/share_wire.h version 1: a 24-byte header (magic,
 * version, nviews, nfds, nretired, pid, nonce), 30 bytes per fd record, 8
 * per retired id, then the view record with its slot at byte 52. 0 when
 * the message has another layout. */
static int msg_lease(const ipcref_msg *m, uint32_t lease[2]) {
  size_t at;
  if (m->len < 26 || le(m->bytes, 0, 4) != 0x4d435049u ||
      le(m->bytes, MSG_VERSION_OFFSET, 2) != 2 || le(m->bytes, 6, 2) != 1)
    return 0;
  at = 26 + (size_t)le(m->bytes, 8, 2) * 30 + (size_t)le(m->bytes, 10, 2) * 8 +
       52;
  if (at + 8 > m->len) return 0;
  lease[0] = (uint32_t)le(m->bytes, at, 4);
  lease[1] = (uint32_t)le(m->bytes, at + 4, 4);
  return 1;
}

/* Sends an exported message over the own transport (CHECKs both); its
 * lease goes to `lease` when the layout is known (else it is zeroed). */
static void export_and_send(ipcref_peer *p, const ipcref_view *v, int xs,
                            uint32_t lease[2]) {
  ipcref_msg msg;
  memset(&msg, 0, sizeof msg);
  CHECK_EQ(ipcref_export(p, v, &msg), IPCREF_OK);
  CHECK_EQ(xfer_send(xs, &msg), 0);
  if (lease && !msg_lease(&msg, lease)) lease[0] = lease[1] = 0;
  sent_by_hand(&msg);
}

/* The consumer's side of the malformed-message checks: every broken copy
 * of `good` is refused, its fds are closed, and nothing is mapped, kept or
 * leaked. Returns the number of surprises. */
static int64_t malformed_imports(ipcref_peer *p, ipcref_ctx *ctx,
                                 const ipcref_msg *good) {
  static ipcref_msg msg;
  ipcref_view v;
  ipcref_stats s;
  int64_t bad = 0;
  size_t len;
  int fds, i;
  ipcref_result rc;
  /* The producer's hello first: the pidfd that watches it is the one fd
   * an import may add. */
  (void)ipcref_peer_pid(p);
  fds = count_fds();
  memset(&v, 0, sizeof v);
  memset(&s, 0, sizeof s);
#define REFUSED(expr, what)                                                    \
  do {                                                                         \
    rc = (expr);                                                               \
    if (rc != IPCREF_EPROTO) {                                                 \
      printf("    malformed (%s): %s, not EPROTO\n", what,                     \
             ipcref_strerror(rc));                                             \
      bad++;                                                                   \
      ipcref_view_release(&v);                                                 \
    }                                                                          \
  } while (0)
  /* Every truncation. */
  for (len = 0; len < good->len; len++) {
    msg_dup(good, &msg);
    msg.len = len;
    rc = ipcref_import(p, &msg, &v);
    if (rc != IPCREF_EPROTO && !(len == 0 && rc == IPCREF_EINVAL)) {
      printf("    truncated to %zu of %zu bytes: %s\n", len, good->len,
             ipcref_strerror(rc));
      bad++;
      ipcref_view_release(&v);
    }
  }
  msg_dup(good, &msg);
  msg.bytes[MSG_MAGIC_OFFSET] ^= 0x5a;
  REFUSED(ipcref_import(p, &msg, &v), "bad magic");
  msg_dup(good, &msg);
  msg.bytes[MSG_VERSION_OFFSET] ^= 0x7f;
  REFUSED(ipcref_import(p, &msg, &v), "wrong version");
  msg_dup(good, &msg);
  memset(msg.bytes + msg.len, 0, 8);
  msg.len += 8;
  REFUSED(ipcref_import(p, &msg, &v), "trailing bytes");
  if (good->nfds > 0) {
    msg_dup(good, &msg);
    msg_close_fds(&msg);
    REFUSED(ipcref_import(p, &msg, &v), "fds withheld");
  }
  if (good->nfds < IPCREF_MSG_MAX_FDS) {
    msg_dup(good, &msg);
    msg.fds[msg.nfds++] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    REFUSED(ipcref_import(p, &msg, &v), "an extra fd");
  }
  for (i = 0; i < good->nfds; i++) { /* an unsealed memfd in its place */
    struct stat st;
    int fake = memfd_create("ipcref-test-fake", MFD_CLOEXEC);
    msg_dup(good, &msg);
    if (fake >= 0 && fstat(msg.fds[i], &st) == 0 &&
        ftruncate(fake, st.st_size) == 0) {
      close(msg.fds[i]);
      msg.fds[i] = fake;
      REFUSED(ipcref_import(p, &msg, &v), "an unsealed fd in its place");
    } else {
      if (fake >= 0) close(fake);
      msg_close_fds(&msg);
      bad++;
    }
  }
  /* Counts out of range, no fds attached. */
  memcpy(&msg, good, sizeof msg);
  msg.nfds = -1;
  rc = ipcref_import(p, &msg, &v);
  if (rc != IPCREF_EPROTO && rc != IPCREF_EINVAL)
    bad++, printf("    nfds -1\n");
  msg.nfds = IPCREF_MSG_MAX_FDS + 1;
  rc = ipcref_import(p, &msg, &v);
  if (rc != IPCREF_EPROTO && rc != IPCREF_EINVAL)
    bad++, printf("    nfds 17\n");
  msg.nfds = 0;
  msg.len = IPCREF_MSG_MAX_BYTES + 1;
  rc = ipcref_import(p, &msg, &v);
  if (rc != IPCREF_EPROTO && rc != IPCREF_EINVAL)
    bad++, printf("    len big\n");
#undef REFUSED
  /* Nothing kept: no view, no mapping, no ledger, no fd. */
  ipcref_ctx_stats(ctx, &s);
  if (s.imported_bufs || s.mapped_segments || s.counter_files) {
    printf("    after refusals: imported_bufs %zu mapped_segments %zu "
           "counter_files %zu\n",
           s.imported_bufs, s.mapped_segments, s.counter_files);
    bad++;
  }
  if (count_fds() != fds) {
    printf("    after refusals: %d fds, %d before\n", count_fds(), fds);
    bad++;
  }
  return bad;
}

/* Own transport: a malformed message (truncated, bad magic, wrong version,
 * wrong fds) is refused with nothing leaked; a replayed old message is
 * refused once its slot was released and reused (generations), and one
 * message imported twice is refused the second time. */
static void test_replay_and_malformed(void) {
  res_mark m;
  conn c;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p;
  ipcref_view v0, v1, priv;
  ipcref_msg msg;
  reply r;
  uint32_t lease1[2], lease2[2];
  const int64_t shape[1] = {4096}; /* 16 KiB of f32: never inline */
  res_begin(&m);
  memset(&v0, 0, sizeof v0);
  memset(&v1, 0, sizeof v1);
  memset(&priv, 0, sizeof priv);
  conn_start(&c, SOCK_SEQPACKET, 1);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  p = conn_peer(&c, ctx);
  CHECK_EQ(pattern_view(ctx, IPCREF_F32, 1, shape, 900, &v0), IPCREF_OK);
  CHECK_EQ(pattern_view(ctx, IPCREF_F32, 1, shape, 901, &v1), IPCREF_OK);

  /* A first export that is never sent: freeing it ends its lease and
   * forgets that the peer has the fds, so the next message carries them. */
  memset(&msg, 0, sizeof msg);
  CHECK_EQ(ipcref_export(p, &v0, &msg), IPCREF_OK);
  CHECK_EQ(msg.nfds, 3); /* the segment's, the ledger's and its bell's */
  CHECK(msg.origin_ctx != 0 && msg.origin_peer != 0);
  EXPECT_STATS(ctx, 2, 0, 1);
  ipcref_msg_free(&msg);
  CHECK_EQ(msg.nfds, 0);
  EXPECT_STATS(ctx, 2, 0, 0);

  /* m0: the first message carries the fds; broken copies are refused. */
  export_and_send(p, &v0, c.xs, NULL);
  r = call(c.ctl, OP_XRECV, 0, 0);
  CHECK_EQ(r.rc, 0);
  CHECK_EQ(r.info, 3); /* the segment's fd, the ledger's, its bell's */
  r = call(c.ctl, OP_MALFORM, 0, 0);
  CHECK_EQ(r.rc, 0);
  CHECK_EQ(r.bad, 0);
  r = call(c.ctl, OP_XIMPORT, 0, 900); /* the genuine one still works */
  CHECK_EQ(r.rc, IPCREF_OK);
  CHECK_EQ(r.bad, 0);
  CHECK_EQ(r.st.imported_bufs, 1);
  CALL_OK(c.ctl, OP_DROP, 0, 0);
  r = call(c.ctl, OP_XIMPORT, 0, 900); /* replayed after release */
  CHECK_EQ(r.rc, IPCREF_EPROTO);
  EXPECT_STATS(ctx, 2, 0, 0);

  /* m1: imported, released; its slot is free again. */
  export_and_send(p, &v1, c.xs, lease1);
  CALL_OK(c.ctl, OP_XRECV, 1, 0);
  CALL_OK(c.ctl, OP_XIMPORT, 1, 901);
  CALL_OK(c.ctl, OP_DROP, 1, 0);
  EXPECT_STATS(ctx, 2, 0, 0);
  r = call(c.ctl, OP_XIMPORT, 1, 901); /* replay: slot free */
  CHECK_EQ(r.rc, IPCREF_EPROTO);

  /* m2: the same block again, reusing the slot with a new generation. */
  export_and_send(p, &v1, c.xs, lease2);
  CALL_OK(c.ctl, OP_XRECV, 2, 0);
  EXPECT_STATS(ctx, 2, 0, 1);
  if (lease1[1] && lease2[1]) {
    CHECK_EQ(lease2[0], lease1[0]);     /* the same slot */
    CHECK_EQ(lease2[1], lease1[1] + 1); /* the next generation */
  } else {
    CHECK(!"the message layout of src/share_wire.h, v2");
  }
  r = call(c.ctl, OP_XIMPORT, 1, 901); /* replay of m1: old generation */
  CHECK_EQ(r.rc, IPCREF_EPROTO);
  CHECK_EQ(r.st.imported_bufs, 0);
  CALL_OK(c.ctl, OP_XIMPORT, 2, 901);
  r = call_to(c.ctl, OP_XIMPORT, 2, 3, 901); /* twice, the first held */
  CHECK_EQ(r.rc, IPCREF_EPROTO);
  CHECK_EQ(r.st.imported_bufs, 1);
  EXPECT_STATS(ctx, 2, 0, 1);
  CALL_OK(c.ctl, OP_DROP, 2, 0);
  r = call(c.ctl, OP_XIMPORT, 2, 901); /* and after its release */
  CHECK_EQ(r.rc, IPCREF_EPROTO);
  r = call(c.ctl, OP_XIMPORT, 1, 901); /* m1 still refused */
  CHECK_EQ(r.rc, IPCREF_EPROTO);
  EXPECT_STATS(ctx, 2, 0, 0);

  /* An exported message never sent: freeing it cancels its lease. */
  memset(&msg, 0, sizeof msg);
  CHECK_EQ(ipcref_export(p, &v1, &msg), IPCREF_OK);
  EXPECT_STATS(ctx, 2, 0, 1);
  ipcref_msg_free(&msg);
  EXPECT_STATS(ctx, 2, 0, 0);

  /* After all the refusals, a fresh message still goes through. */
  export_and_send(p, &v1, c.xs, NULL);
  CALL_OK(c.ctl, OP_XRECV, 4, 0);
  CALL_OK(c.ctl, OP_XIMPORT, 4, 901);
  ipcref_view_release(&v1); /* the consumer's import keeps it */
  EXPECT_STATS(ctx, 1, 1, 1);
  CALL_OK(c.ctl, OP_VERIFY, 4, 901);
  CALL_OK(c.ctl, OP_DROP, 4, 0);
  EXPECT_STATS(ctx, 1, 0, 0);

  /* Exporting what is not shared. */
  CHECK_EQ(ipcref_view_new(IPCREF_F32, 1, shape, &priv), IPCREF_OK);
  memset(&msg, 0, sizeof msg);
  CHECK_EQ(ipcref_export(p, &priv, &msg), IPCREF_EINVAL);
  CHECK_EQ(ipcref_send(p, &priv), IPCREF_EINVAL);
  CHECK_EQ(ipcref_send_batch(p, &priv, 1), IPCREF_EINVAL);
  {
    ipcref_view two[2];
    two[0] = v0;
    two[1] = priv; /* one bad view: nothing of the batch is sent */
    CHECK_EQ(ipcref_send_batch(p, two, 2), IPCREF_EINVAL);
  }
  EXPECT_STATS(ctx, 1, 0, 0);
  /* A view whose fields lie about its shared buffer. */
  {
    ipcref_view bad = v0;
    bad.shape[0] = 1 << 20;
    CHECK(ipcref_export(p, &bad, &msg) != IPCREF_OK);
    bad = v0;
    bad.byte_offset = -4;
    CHECK(ipcref_export(p, &bad, &msg) != IPCREF_OK);
    bad = v0;
    bad.dtype = IPCREF_DTYPE_COUNT;
    CHECK(ipcref_export(p, &bad, &msg) != IPCREF_OK);
  }
  EXPECT_STATS(ctx, 1, 0, 0);
  ipcref_view_release(&priv);
  ipcref_view_release(&v0);
  r = call(c.ctl, OP_STATS, 0, 0);
  CHECK_EQ(r.st.imported_bufs, 0);
  ipcref_peer_free(p);
  CONN_STOP(&c);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* ------------------------------------------------------------ timeouts */

static int sigpipes;
static void on_sigpipe(int sig) {
  (void)sig;
  sigpipes++;
}

/* recv with nothing sent times out (0 and 10 ms, and 400 ms in all when
 * the other side's hello comes late); once the other side has closed,
 * recv and send say EPEER (no SIGPIPE), and the failed send's lease is
 * given back. */
static void timeouts_and_hangup(int type) {
  res_mark m;
  conn c, late;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p, *pl;
  ipcref_view v, got;
  long t0, dt;
  const int64_t shape[1] = {10000};
  struct sigaction sa, old;
  res_begin(&m);
  memset(&v, 0, sizeof v);
  memset(&got, 0, sizeof got);
  conn_start_late(&late, type, 0, 250); /* its hello comes 250 ms late */
  conn_start(&c, type, 0);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  /* The whole wait counts, the hello's and the message's: 400 ms, not
   * 250 + 400 (the margin is for loaded machines). */
  pl = conn_peer(&late, ctx);
  t0 = now_ms();
  CHECK_EQ(ipcref_recv(pl, &got, 400), IPCREF_ETIMEDOUT);
  dt = now_ms() - t0;
  if (dt >= 550) printf("    ipcref_recv(400 ms) took %ld ms\n", dt);
  CHECK(dt >= 390 && dt < 550);
  CALL_OK(late.ctl, OP_STATS, 0, 0); /* its peer exists: ours may go */
  ipcref_peer_free(pl);
  CONN_STOP(&late);
  p = conn_peer(&c, ctx);
  CALL_OK(c.ctl, OP_STATS, 0, 0); /* the consumer is up */
  t0 = now_ms();
  CHECK_EQ(ipcref_recv(p, &got, 0), IPCREF_EAGAIN);
  CHECK(now_ms() - t0 < 150); /* a poll: no wait */
  t0 = now_ms();
  CHECK_EQ(ipcref_recv(p, &got, 10), IPCREF_ETIMEDOUT);
  dt = now_ms() - t0;
  CHECK(dt >= 9 && dt < 500);
  CHECK(got.buf == NULL);
  /* The consumer leaves: its socket closes. */
  CONN_STOP(&c);
  t0 = now_ms();
  CHECK_EQ(ipcref_recv(p, &got, 5000), IPCREF_EPEER);
  CHECK(now_ms() - t0 < 4000);
  CHECK_EQ(ipcref_recv(p, &got, -1), IPCREF_EPEER); /* at once, again */
  CHECK(got.buf == NULL);
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigpipe;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPIPE, &sa, &old);
  sigpipes = 0;
  CHECK_EQ(pattern_view(ctx, IPCREF_I32, 1, shape, 1000, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(p, &v), IPCREF_EPEER);
  CHECK_EQ(ipcref_send_batch(p, &v, 1), IPCREF_EPEER);
  CHECK_EQ(sigpipes, 0); /* MSG_NOSIGNAL: callers need not ignore it (only
                            SOCK_STREAM raises SIGPIPE here) */
  sigaction(SIGPIPE, &old, NULL);
  EXPECT_STATS(ctx, 1, 0, 0); /* the failed sends took no lease */
  ipcref_view_release(&v);
  ipcref_peer_free(p);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

static void test_timeouts_and_hangup_seqpacket(void) {
  timeouts_and_hangup(SOCK_SEQPACKET);
}
static void test_timeouts_and_hangup_stream(void) {
  timeouts_and_hangup(SOCK_STREAM);
}

/* ------------------------------------------------------------ arguments */

static void test_wrong_arguments(void) {
  res_mark m;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_buf *b = NULL;
  ipcref_view v;
  ipcref_stats s;
  ipcref_msg msg;
  int pv[2], us;
  const int64_t shape[1] = {16};
  res_begin(&m);
  memset(&v, 0, sizeof v);
  memset(&msg, 0, sizeof msg);
  CHECK_EQ(ipcref_ctx_new(NULL, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  ipcref_ctx_free(NULL);
  ipcref_peer_free(NULL);
  CHECK_EQ(ipcref_collect(NULL), 0);
  CHECK_EQ(ipcref_ctx_stats(NULL, &s), IPCREF_EINVAL);
  CHECK_EQ(ipcref_ctx_stats(ctx, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_shared_new(NULL, 64, &b), IPCREF_EINVAL);
  CHECK_EQ(ipcref_shared_new(ctx, 64, NULL), IPCREF_EINVAL);
  {
    ipcref_result rc = ipcref_shared_new(ctx, SIZE_MAX, &b);
    CHECK(rc == IPCREF_ERANGE || rc == IPCREF_ENOMEM);
    CHECK(b == NULL);
    rc = ipcref_shared_new(ctx, SIZE_MAX / 2, &b);
    CHECK(rc == IPCREF_ERANGE || rc == IPCREF_ENOMEM);
    CHECK(b == NULL);
  }
  CHECK_EQ(ipcref_view_new_shared(NULL, IPCREF_F32, 1, shape, &v),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_DTYPE_COUNT, 1, shape, &v),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_F32, 1, shape, NULL),
           IPCREF_EINVAL);
  CHECK(v.buf == NULL);
  CHECK_EQ(ipcref_buf_is_shared(NULL), 0);
  CHECK_EQ(ipcref_peer_pid(NULL), 0);
  /* Sockets that are not sockets, not AF_UNIX, not connected: refused, and
   * not closed. */
  CHECK_EQ(ipcref_peer_new(NULL, 0, &p), IPCREF_EINVAL);
  CHECK(ipcref_peer_new(ctx, -1, &p) != IPCREF_OK);
  CHECK(p == NULL);
  if (pipe(pv) == 0) {
    CHECK(ipcref_peer_new(ctx, pv[0], &p) != IPCREF_OK);
    CHECK(p == NULL);
    CHECK(fcntl(pv[0], F_GETFD) != -1); /* still open */
    close(pv[0]);
    close(pv[1]);
  }
  us = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (us >= 0) {
    CHECK(ipcref_peer_new(ctx, us, &p) != IPCREF_OK);
    CHECK(p == NULL);
    CHECK(fcntl(us, F_GETFD) != -1);
    close(us);
  }
  us = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0); /* unconnected */
  if (us >= 0) {
    CHECK(ipcref_peer_new(ctx, us, &p) != IPCREF_OK);
    CHECK(p == NULL);
    CHECK(fcntl(us, F_GETFD) != -1);
    close(us);
  }
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pv) == 0) {
    close(pv[1]); /* the other end is gone: its hello cannot go out */
    CHECK_EQ(ipcref_peer_new(ctx, pv[0], &p), IPCREF_EPEER);
    CHECK(p == NULL);
    CHECK(fcntl(pv[0], F_GETFD) != -1);
    close(pv[0]);
  }
  CHECK_EQ(ipcref_export(NULL, &v, &msg), IPCREF_EINVAL);
  CHECK_EQ(ipcref_import(NULL, &msg, &v), IPCREF_EINVAL);
  CHECK_EQ(ipcref_send(NULL, &v), IPCREF_EINVAL);
  CHECK_EQ(ipcref_send_batch(NULL, &v, 1), IPCREF_EINVAL);
  CHECK_EQ(ipcref_recv(NULL, &v, 0), IPCREF_EINVAL);
  s = stats_of(ctx);
  CHECK_EQ(s.peers, 0);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* A message exported for the user's own transport outlives its peer (and
 * the 8 freed peers a context keeps, marked dead), then its context:
 * ipcref_msg_free ends its lease while the context lives, and only closes
 * its fds once it is gone; a copy naming a context of another process
 * only closes its fds too. */
static void test_msg_outlives_peer(void) {
  res_mark m;
  local_pair l;
  ipcref_msg *msg = (ipcref_msg *)malloc(sizeof *msg);
  ipcref_msg *later = (ipcref_msg *)malloc(sizeof *later);
  ipcref_msg *copy = (ipcref_msg *)malloc(sizeof *copy);
  ipcref_view v;
  int i, sv[2];
  const int64_t shape[1] = {256};
  res_begin(&m);
  local_pair_open(&l, NULL, NULL);
  CHECK_EQ(ipcref_view_new_shared(l.prod, IPCREF_F32, 1, shape, &v), IPCREF_OK);
  CHECK_EQ(ipcref_export(l.pp, &v, msg), IPCREF_OK);
  CHECK_EQ(ipcref_export(l.pp, &v, later), IPCREF_OK);
  EXPECT_STATS(l.prod, 1, 0, 2);
  memcpy(copy, msg, sizeof *copy);
  for (i = 0; i < copy->nfds; i++)
    copy->fds[i] = fcntl(msg->fds[i], F_DUPFD_CLOEXEC, 0);
  copy->origin_ctx ^= 1; /* as another process's message would say */
  ipcref_msg_free(copy);
  CHECK_EQ(copy->nfds, 0);
  EXPECT_STATS(l.prod, 1, 0, 2);
  ipcref_peer_free(l.pp);
  l.pp = NULL;
  for (i = 0; i < 9; i++) {
    ipcref_peer *q;
    CHECK_EQ(xsocketpair(SOCK_SEQPACKET, sv), 0);
    q = make_peer(l.prod, sv[0]);
    ipcref_peer_free(q);
    close(sv[1]);
  }
  ipcref_msg_free(msg); /* the peer is long gone; its ledger is not */
  CHECK_EQ(msg->nfds, 0);
  EXPECT_STATS(l.prod, 1, 0, 1);
  ipcref_view_release(&v);
  local_pair_close(&l); /* the producer's context goes with its buffer */
  ipcref_msg_free(later);
  CHECK_EQ(later->nfds, 0);
  free(copy);
  free(later);
  free(msg);
  RES_END(&m);
}

/* What the forked child of test_msg_free_in_child does with its copy of
 * the parent's message: frees it, says whether that closed its fds and
 * only those, and is killed (it holds the parent's heap: an exit would
 * have valgrind's leak check blame it for that heap). */
typedef struct child_msg {
  ipcref_msg *msg;
  int ctl;
} child_msg;

static int msg_free_child(void *arg) {
  child_msg *c = (child_msg *)arg;
  int fds = count_fds(), open = 0, shut = 1, i, n = c->msg->nfds;
  int fd[IPCREF_MSG_MAX_FDS];
  /* (fork_child_keeping may have closed one: a number the fd registry
   * kept from an earlier test's socket) */
  for (i = 0; i < n; i++) {
    fd[i] = c->msg->fds[i];
    open += fcntl(fd[i], F_GETFD) >= 0;
  }
  ipcref_msg_free(c->msg);
  for (i = 0; i < n; i++) shut &= fcntl(fd[i], F_GETFD) < 0;
  ctl_put(c->ctl,
          n > 0 && c->msg->nfds == 0 && shut && count_fds() == fds - open);
  raise(SIGKILL);
  return 1;
}

/* A consumer C gets O's block forwarded by F, and has a connection of its
 * own to O, which it frees: what F brought stays mapped (F may name it
 * again and will not send its fds again), so F's next forward of the same
 * block imports, and O gets every lease back; held or not while the peer
 * goes. */
static void forward_outlives_origin_peer(int hold) {
  ipcref_ctx *O = new_ctx(0, 0), *F = new_ctx(0, 0), *C = new_ctx(0, 0);
  ipcref_peer *o_f, *f_o, *f_c, *c_f, *o_c, *c_o;
  ipcref_view v, fv, cv1, cv2, none;
  const int64_t n = 4096;
  int sv[3][2], i;
  for (i = 0; i < 3; i++)
    if (xsocketpair(SOCK_SEQPACKET, sv[i]) != 0) return;
  o_f = make_peer(O, sv[0][0]), f_o = make_peer(F, sv[0][1]);
  f_c = make_peer(F, sv[1][0]), c_f = make_peer(C, sv[1][1]);
  o_c = make_peer(O, sv[2][0]), c_o = make_peer(C, sv[2][1]);
  CHECK_EQ(ipcref_view_new_shared(O, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(o_f, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(f_o, &fv, 5000), IPCREF_OK);
  CHECK_EQ(ipcref_send(f_c, &fv), IPCREF_OK);
  CHECK_EQ(ipcref_recv(c_f, &cv1, 5000), IPCREF_OK);
  if (!hold) ipcref_view_release(&cv1);
  CHECK_EQ(ipcref_recv(c_o, &none, 0), IPCREF_EAGAIN); /* O's hello read */
  ipcref_peer_free(c_o);
  CHECK_EQ(ipcref_send(f_c, &fv), IPCREF_OK);
  CHECK_EQ(ipcref_recv(c_f, &cv2, 5000), IPCREF_OK);
  ipcref_view_release(&cv2);
  if (hold) ipcref_view_release(&cv1);
  ipcref_view_release(&fv);
  ipcref_view_release(&v);
  ipcref_collect(F);
  ipcref_collect(O);
  CHECK_EQ(stats_of(O).live_slots, 0);
  CHECK_EQ(stats_of(O).limbo_blocks, 0);
  ipcref_peer_free(c_f), ipcref_peer_free(f_c);
  ipcref_peer_free(f_o), ipcref_peer_free(o_f), ipcref_peer_free(o_c);
  ipcref_ctx_free(C), ipcref_ctx_free(F), ipcref_ctx_free(O);
}
static void test_forward_outlives_origin_peer(void) {
  forward_outlives_origin_peer(0);
  forward_outlives_origin_peer(1);
}

/* A message exported for one process, imported by mistake through another
 * peer of the context that exported it: refused (EINVAL), nothing taken,
 * and ipcref_msg_free still ends its lease (a refusal that took it left
 * the lease to nobody, for good). Two peers of one context connected to
 * each other still hand messages over so. */
static void test_msg_import_by_its_context(void) {
  ipcref_ctx *c1 = make_ctx(NULL), *c2 = make_ctx(NULL), *c3 = make_ctx(NULL);
  ipcref_peer *pa, *qa, *pb, *qb, *sa, *sb;
  ipcref_msg *msg = (ipcref_msg *)malloc(sizeof *msg);
  ipcref_view v, out;
  int s1[2], s2[2], s3[2], nfds;
  const int64_t n = 64;
  if (xsocketpair(SOCK_SEQPACKET, s1) || xsocketpair(SOCK_SEQPACKET, s2) ||
      xsocketpair(SOCK_SEQPACKET, s3))
    return;
  pa = make_peer(c1, s1[0]), qa = make_peer(c2, s1[1]);
  pb = make_peer(c1, s2[0]), qb = make_peer(c3, s2[1]);
  sa = make_peer(c1, s3[0]), sb = make_peer(c1, s3[1]); /* c1 to c1 */
  CHECK_EQ(ipcref_view_new_shared(c1, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(pb, &v), IPCREF_OK); /* pb's hello is done */
  CHECK_EQ(ipcref_recv(qb, &out, 5000), IPCREF_OK);
  ipcref_view_release(&out);
  CHECK_EQ(ipcref_export(pa, &v, msg), IPCREF_OK);
  nfds = msg->nfds;
  CHECK_EQ(ipcref_import(pb, msg, &out), IPCREF_EINVAL);
  CHECK_EQ(msg->nfds, nfds); /* nothing taken */
  ipcref_msg_free(msg);
  ipcref_collect(c1);
  CHECK_EQ(stats_of(c1).live_slots, 0);
  CHECK_EQ(ipcref_export(sa, &v, msg), IPCREF_OK);
  CHECK_EQ(ipcref_import(sb, msg, &out), IPCREF_OK);
  ipcref_view_release(&out);
  ipcref_view_release(&v);
  ipcref_collect(c1);
  CHECK_EQ(stats_of(c1).live_slots, 0);
  free(msg);
  ipcref_peer_free(sa), ipcref_peer_free(sb);
  ipcref_peer_free(qb), ipcref_peer_free(pb);
  ipcref_peer_free(qa), ipcref_peer_free(pa);
  ipcref_ctx_free(c3), ipcref_ctx_free(c2), ipcref_ctx_free(c1);
}
/* A forked child that frees its copy of a message the parent exported
 * closes its own fds and nothing more: the lease is the parent's (the
 * child's copy of the context is not live), and the consumer the parent
 * then gives the message takes it. */
static void test_msg_free_in_child(void) {
  res_mark m;
  local_pair l;
  child_msg c;
  ipcref_view v, got;
  int sv[2];
  pid_t pid;
  const int64_t shape[1] = {64};
  res_begin(&m);
  local_pair_open(&l, NULL, NULL);
  c.msg = (ipcref_msg *)malloc(sizeof *c.msg);
  if (!l.pp || !c.msg || xsocketpair(SOCK_SEQPACKET, sv) != 0) {
    CHECK(!"the set-up");
    free(c.msg);
    local_pair_close(&l);
    return;
  }
  CHECK_EQ(ipcref_view_new_shared(l.prod, IPCREF_F32, 1, shape, &v), IPCREF_OK);
  CHECK_EQ(ipcref_export(l.pp, &v, c.msg), IPCREF_OK);
  EXPECT_STATS(l.prod, 1, 0, 1);
  c.ctl = sv[1];
  pid = fork_child_keeping(msg_free_child, &c, &sv[1], 1);
  CHECK_EQ(ctl_get(sv[0], CTL_MS), 1);
  sigkilled_at(wait_child(pid, REAP_MS), pid, "the child", __FILE__, __LINE__);
  CHECK_EQ(ipcref_collect(l.prod), IPCREF_OK);
  EXPECT_STATS(l.prod, 1, 0, 1); /* the child returned nothing */
  CHECK(c.msg->nfds > 0);        /* the parent's fds are its own */
  /* and the lease is live still: the consumer takes the message */
  if (ipcref_import(l.cp, c.msg, &got) == IPCREF_OK)
    ipcref_view_release(&got);
  else
    CHECK(!"the import after the child's free");
  ipcref_msg_sent(c.msg);
  CHECK_EQ(ipcref_collect(l.prod), IPCREF_OK);
  EXPECT_STATS(l.prod, 1, 0, 0);
  ipcref_view_release(&v);
  tclose(sv[0]);
  tclose(sv[1]);
  free(c.msg);
  local_pair_close(&l);
  RES_END(&m);
}

/* The same with a live peer: NULL views, messages and outs. */
static void test_wrong_arguments_with_peer(void) {
  res_mark m;
  conn c;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p;
  ipcref_view v, out;
  ipcref_msg msg;
  const int64_t shape[1] = {16};
  res_begin(&m);
  memset(&v, 0, sizeof v);
  memset(&out, 0, sizeof out);
  memset(&msg, 0, sizeof msg);
  conn_start(&c, SOCK_SEQPACKET, 0);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  p = conn_peer(&c, ctx);
  CHECK(ipcref_peer_pid(p) == c.pid);
  CHECK_EQ(pattern_view(ctx, IPCREF_F32, 1, shape, 1, &v), IPCREF_OK);
  CHECK_EQ(ipcref_export(p, NULL, &msg), IPCREF_EINVAL);
  CHECK_EQ(ipcref_export(p, &v, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_import(p, NULL, &out), IPCREF_EINVAL);
  CHECK_EQ(ipcref_send(p, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_send_batch(p, NULL, 1), IPCREF_EINVAL);
  CHECK_EQ(ipcref_send_batch(p, &v, -1), IPCREF_EINVAL);
  CHECK_EQ(ipcref_recv(p, NULL, 0), IPCREF_EINVAL);
  {
    ipcref_view empty;
    memset(&empty, 0, sizeof empty);
    CHECK_EQ(ipcref_send(p, &empty), IPCREF_EINVAL); /* a zeroed view */
  }
  /* Garbage bytes with our own peer: refused. */
  memset(&msg, 0, sizeof msg);
  msg.len = 64;
  memset(msg.bytes, 0xab, 64);
  CHECK_EQ(ipcref_import(p, &msg, &out), IPCREF_EPROTO);
  CHECK(out.buf == NULL);
  EXPECT_STATS(ctx, 1, 0, 0);
  ipcref_view_release(&v);
  ipcref_peer_free(p);
  CONN_STOP(&c);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* ------------------------------------------------------------ main */

/* One hand-off before the measured tests, so that one-time allocations
 * (stdio buffers, malloc arenas) are not counted as a test's. */
static void warm_up(void) {
  conn c;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p;
  ipcref_view v;
  const int64_t shape[1] = {1 << 16};
  int fails = harness_failures_in_test;
  memset(&v, 0, sizeof v);
  conn_start(&c, SOCK_SEQPACKET, 0);
  if (ipcref_ctx_new(NULL, &ctx) == IPCREF_OK) {
    p = conn_peer(&c, ctx);
    if (pattern_view(ctx, IPCREF_U8, 1, shape, 1, &v) == IPCREF_OK &&
        ipcref_send(p, &v) == IPCREF_OK)
      call(c.ctl, OP_RECV, 0, 1);
    ipcref_view_release(&v);
    ipcref_peer_free(p);
  }
  CONN_STOP(&c);
  ipcref_ctx_free(ctx);
  harness_failures_in_test = fails;
}

/* ipcref_ctx_free with buffers still alive: the producer's own view and a
 * consumer's imported one (both ends in this process, over a socketpair)
 * stay valid, and the last release tears each context down, leaving no fd
 * and no mapping behind. */
/* The object table's pull across processes: a table view of a shared
 * buffer is itself shared (an alias of the block), so it can be sent, and
 * its table reference lasts until the consumer's lease comes back, after
 * the producer dropped both its handle on the id and its views. */
static int table_deallocs;
static void count_dealloc(void *user, ipcref_id id, const uint32_t *stores,
                          size_t nstores) {
  (void)user, (void)id, (void)stores, (void)nstores;
  table_deallocs++;
}

static void test_table_view_sent(void) {
  ipcref_table_hooks hooks = {count_dealloc, NULL, NULL};
  const int64_t shape[1] = {1024};
  local_pair l;
  ipcref_ctx *prod;
  ipcref_peer *pp, *cp;
  ipcref_table *t = NULL;
  ipcref_view v, tv, got;
  ipcref_stats st;
  ipcref_id id;
  int i, bad = 0;
  table_deallocs = 0;
  local_pair_open(&l, NULL, NULL);
  prod = l.prod;
  pp = l.pp;
  cp = l.cp;
  CHECK_EQ(ipcref_table_new(&hooks, &t), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &id), IPCREF_OK);
  CHECK_EQ(ipcref_view_new_shared(prod, IPCREF_I32, 1, shape, &v), IPCREF_OK);
  for (i = 0; i < 1024; i++) ((int32_t *)ipcref_view_data_mut(&v))[i] = i;
  CHECK_EQ(ipcref_table_view(t, id, &v, &tv), IPCREF_OK);
  CHECK(ipcref_buf_is_shared(tv.buf));
  CHECK(ipcref_view_data_mut(&tv) == NULL); /* read-only: others see it */
  CHECK_EQ(ipcref_send(pp, &tv), IPCREF_OK);
  ipcref_view_release(&tv);
  ipcref_view_release(&v);
  CHECK_EQ(ipcref_table_decref(t, id), IPCREF_OK); /* the handle goes */
  CHECK_EQ(table_deallocs, 0);                     /* the lease holds it */
  CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
  for (i = 0; i < 1024; i++)
    bad += ((const int32_t *)ipcref_buf_data(got.buf))[i] != i;
  CHECK_EQ(bad, 0);
  ipcref_collect(prod);
  CHECK_EQ(table_deallocs, 0);
  ipcref_view_release(&got); /* the lease comes back */
  ipcref_collect(prod);      /* the sweep ends the alias, then the pin */
  CHECK_EQ(table_deallocs, 1);
  CHECK_EQ(ipcref_ctx_stats(prod, &st), IPCREF_OK);
  CHECK_EQ(st.live_bufs, 0);
  CHECK_EQ(st.live_slots, 0);
  ipcref_table_free(t);
  local_pair_close(&l);
}

/* A pull of the object table sent on holds the pulled buffer (its alias
 * does) while the consumer holds the view: the producer's own view of it
 * is not writable, and make_mut copies. Once the consumer lets go, the
 * producer's next look sweeps the return, the alias lets go, and the same
 * memory is writable in place, without ipcref_collect. */
static void test_table_view_sent_then_written(void) {
  const int64_t shape[1] = {256};
  local_pair l;
  ipcref_table *t = NULL;
  ipcref_view v, tv, got, copy;
  ipcref_id id;
  void *mem;
  local_pair_open(&l, NULL, NULL);
  CHECK_EQ(ipcref_table_new(NULL, &t), IPCREF_OK);
  CHECK_EQ(ipcref_table_create(t, &id), IPCREF_OK);
  CHECK_EQ(ipcref_view_new_shared(l.prod, IPCREF_I32, 1, shape, &v), IPCREF_OK);
  mem = ipcref_view_data_mut(&v);
  CHECK(mem != NULL);
  CHECK_EQ(ipcref_table_view(t, id, &v, &tv), IPCREF_OK);
  CHECK_EQ(ipcref_send(l.pp, &tv), IPCREF_OK);
  ipcref_view_release(&tv);
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&v) == NULL); /* the consumer reads it */
  CHECK_EQ(ipcref_view_clone(&v, &copy), IPCREF_OK);
  CHECK_EQ(ipcref_view_make_mut(&copy), IPCREF_OK);
  CHECK(ipcref_view_data_mut(&copy) != NULL &&
        ipcref_view_data_mut(&copy) != mem);
  ipcref_view_release(&copy);
  ipcref_view_release(&got); /* the lease comes back; nothing collects */
  CHECK(ipcref_view_data_mut(&v) == mem);
  CHECK(ipcref_buf_get_mut(v.buf) == mem);
  ipcref_view_release(&v);
  CHECK_EQ(ipcref_table_decref(t, id), IPCREF_OK);
  ipcref_table_free(t);
  local_pair_close(&l);
}

static void test_ctx_free_with_live_buffers(void) {
  res_mark m;
  local_pair l;
  ipcref_view v, w;
  const int64_t shape[1] = {1000};
  int64_t last[1] = {999};
  float *p;
  res_begin(&m);
  local_pair_open(&l, NULL, NULL);
  CHECK_EQ(ipcref_view_new_shared(l.prod, IPCREF_F32, 1, shape, &v), IPCREF_OK);
  *(float *)ipcref_view_ptr(&v, last) = 7.5f;
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l.cp, &w, 1000), IPCREF_OK);
  ipcref_ctx_free(l.prod); /* frees its peer; v keeps the rest alive */
  ipcref_ctx_free(l.cons);
  CHECK(*(float *)ipcref_view_ptr(&v, last) == 7.5f);
  CHECK(*(float *)ipcref_view_ptr(&w, last) == 7.5f);
  CHECK(ipcref_view_data_mut(&v) == NULL); /* w's lease: not ours alone */
  ipcref_view_release(&w);               /* the consumer's context goes here */
  p = (float *)ipcref_view_data_mut(&v); /* the lease back: ours to write */
  CHECK(p != NULL);
  if (p) *p = 1.0f;
  ipcref_view_release(&v); /* and the producer's */
  RES_END(&m);
}

/* A consumer killed with SIGKILL while it holds blocks: the producer's next
 * ipcref_collect reclaims every lease it held. And a middleman killed
 * after forwarding: the hold of the process it forwarded to stays until
 * that one lets go (or dies too). */
#define KILL_HOLD 100 /* views the killed consumer holds */

static int kill_holder_child(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *c;
  ipcref_peer *p;
  ipcref_view v;
  int i;
  if (ipcref_ctx_new(NULL, &c) || ipcref_peer_new(c, k->their_sock[0], &p))
    return 2;
  for (i = 0; i < KILL_HOLD; i++)
    if (ipcref_recv(p, &v, 5000) != IPCREF_OK)
      return 3; /* held, never let go */
  ctl_put(k->their_ctl, 'r');
  ctl_get(k->their_ctl, CTL_MS * 10); /* killed while waiting here */
  return 6;
}

static void test_consumer_killed(void) {
  res_mark m;
  kid k;
  int i;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p;
  ipcref_stats st;
  const int n = KILL_HOLD;
  res_begin(&m);
  kid_start(&k, 1, SOCK_SEQPACKET, kill_holder_child);
  ctx = make_ctx(NULL);
  p = kid_peer(&k, 0, ctx);
  for (i = 0; i < n; i++) {
    ipcref_view v;
    const int64_t shape[1] = {64 + i};
    CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, shape, &v), IPCREF_OK);
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ipcref_view_release(&v); /* to the limbo: the consumer holds it */
  }
  CTL_EXPECT(k.ctl, 'r');
  CHECK_EQ(ipcref_peer_pid(p), k.pid);
  ipcref_collect(ctx);
  st = stats_of(ctx);
  CHECK_EQ(st.limbo_blocks, (size_t)n); /* alive: everything stays */
  CHECK_EQ(st.live_slots, (size_t)n);
  KID_KILL(&k, "consumer");
  ipcref_collect(ctx); /* sees the death, reclaims */
  st = stats_of(ctx);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.live_bytes, 0);
  ipcref_peer_free(p);
  kid_close(&k);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* A -> B -> C, then B is killed holding its own lease: A keeps the block
 * for C (whose hold it counts itself), and frees it when C lets go. */
typedef struct mm_arg {
  int peer, ctl, other; /* other: the socket between B and C */
} mm_arg;

/* C: holds what B forwards until told to let go. */
static int mm_c(void *arg) {
  mm_arg *a = (mm_arg *)arg;
  ipcref_ctx *cc;
  ipcref_peer *cp;
  ipcref_view v;
  int64_t last[1] = {255};
  if (ipcref_ctx_new(NULL, &cc) || ipcref_peer_new(cc, a->other, &cp) ||
      ipcref_recv(cp, &v, 5000))
    return 2;
  ctl_put(a->ctl, 'c');
  if (ctl_get(a->ctl, CTL_MS) != 'g') return 3;
  /* B is dead by now; the data is still A's block, intact. */
  if (*(unsigned char *)ipcref_view_ptr(&v, last) != 0xab) return 4;
  ipcref_view_release(&v);
  ipcref_peer_free(cp);
  ipcref_ctx_free(cc);
  return 0;
}

/* B: forwards to C, then waits to be killed. */
static int mm_b(void *arg) {
  mm_arg *a = (mm_arg *)arg;
  ipcref_ctx *bctx;
  ipcref_peer *pa, *pc;
  ipcref_view v;
  if (ipcref_ctx_new(NULL, &bctx) || ipcref_peer_new(bctx, a->peer, &pa) ||
      ipcref_peer_new(bctx, a->other, &pc) || ipcref_recv(pa, &v, 5000) ||
      ipcref_send(pc, &v))
    return 2;
  ctl_put(a->ctl, 'b');
  for (;;) pause();
}

static void test_middleman_killed(void) {
  res_mark m;
  int bc[2];
  kid kb, kc;
  mm_arg ab, ac;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p;
  ipcref_stats st;
  res_begin(&m);
  xsocketpair(SOCK_SEQPACKET, bc);
  kid_open(&kc, 0, SOCK_SEQPACKET);
  ac.peer = -1;
  ac.ctl = kc.their_ctl;
  ac.other = bc[1];
  kid_fork(&kc, mm_c, &ac, bc[1]);
  kid_open(&kb, 1, SOCK_SEQPACKET);
  ab.peer = kb.their_sock[0];
  ab.ctl = kb.their_ctl;
  ab.other = bc[0];
  kid_fork(&kb, mm_b, &ab, bc[0]);
  tclose(bc[0]);
  tclose(bc[1]);
  ctx = make_ctx(NULL);
  p = kid_peer(&kb, 0, ctx);
  {
    ipcref_view v;
    const int64_t shape[1] = {256};
    CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, shape, &v), IPCREF_OK);
    memset(ipcref_view_data_mut(&v), 0xab, 256);
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ipcref_view_release(&v);
  }
  CTL_EXPECT(kb.ctl, 'b');
  CTL_EXPECT(kc.ctl, 'c');
  /* B's identity comes with its hello, which this producer may not have
   * read yet (it only sent): reading it is what lets A see B die. */
  CHECK_EQ(ipcref_peer_pid(p), kb.pid);
  KID_KILL(&kb, "B");
  ipcref_collect(ctx); /* B's own hold goes; C's stays */
  st = stats_of(ctx);
  CHECK_EQ(st.limbo_blocks, 1);
  CHECK_EQ(st.live_slots, 1);
  ctl_put(kc.ctl, 'g');
  KID_EXIT0(&kc, "C");
  ipcref_collect(ctx);
  st = stats_of(ctx);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.live_slots, 0);
  ipcref_peer_free(p);
  kid_close(&kb);
  kid_close(&kc);
  EXPECT_DRAINED(ctx);
  ipcref_ctx_free(ctx);
  RES_END(&m);
}

/* Out of memory at each allocation a new buffer makes in turn (the
 * segment, its descriptors made lazily, the header): the call fails with
 * ENOMEM or succeeds on its retry, and a failure leaves nothing behind: no
 * segment, no buffer, no fd, no mapping, no allocation. */
static void test_allocation_fails_at_each_step(void) {
  res_mark m;
  ipcref_ctx *ctx;
  long base = live_allocs;
  int k, reached = 1, failed = 0;
  res_begin(&m);
  ctx = make_ctx(NULL);
  for (k = 1; reached && k < 100; k++) {
    ipcref_buf *b = NULL;
    ipcref_result r;
    ipcref_stats st;
    fail_alloc_in = k;
    r = ipcref_shared_new_isolated(ctx, 100, &b); /* a segment each time */
    reached = fail_alloc_in == 0;
    fail_alloc_in = 0;
    CHECK(r == IPCREF_OK || r == IPCREF_ENOMEM);
    failed += r == IPCREF_ENOMEM;
    if (r == IPCREF_OK) ipcref_buf_release(b);
    st = stats_of(ctx);
    CHECK_EQ(st.segment_bytes, 0);
    CHECK_EQ(st.live_bufs, 0);
  }
  CHECK(!reached); /* every allocation was made to fail once */
  printf("    %d allocations failed in turn, %d calls said ENOMEM\n", k - 2,
         failed);
  ipcref_ctx_free(ctx);
  CHECK_EQ(live_allocs, base);
  RES_END(&m);
}

/* What this process has resident and private, in kB (smaps_rollup). */
static void memory_kb(long *rss, long *priv) {
  char line[256];
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  long v;
  *rss = *priv = 0;
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "Rss: %ld kB", &v) == 1) *rss = v;
    if (sscanf(line, "Private_Clean: %ld kB", &v) == 1) *priv += v;
    if (sscanf(line, "Private_Dirty: %ld kB", &v) == 1) *priv += v;
  }
  fclose(f);
}

/* A consumer that takes one view, says so, and holds it until told. */
static int hold_one_child(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
  ipcref_view v;
  if (!p || ipcref_recv(p, &v, 5000) != IPCREF_OK) return 2;
  ctl_put(k->their_ctl, 'h');
  if (ctl_get(k->their_ctl, CTL_MS) != 'x') return 3;
  ipcref_view_release(&v);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* Memory in proportion to use: a process that shares one 64-byte buffer
 * (made, sent, held by the consumer) has under 1 MiB more resident and
 * private memory than before it used ipcref, though the buffer's segment
 * has room for 262,144 such blocks (their descriptors are made as blocks
 * are handed out). Under ASan or valgrind the figures are theirs. */
static void test_one_small_buffer_costs_little(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v;
  const int64_t n = 64;
  long rss0, priv0, rss1, priv1;
  kid_start(&k, 1, SOCK_SEQPACKET, hold_one_child);
  memory_kb(&rss0, &priv0);
  ctx = make_ctx(NULL);
  p = kid_peer(&k, 0, ctx);
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  memset(ipcref_buf_data(v.buf), 7, 64);
  CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  CTL_EXPECT(k.ctl, 'h');
  memory_kb(&rss1, &priv1);
  printf("    one 64-byte buffer shared: +%ld kB resident, +%ld kB private\n",
         rss1 - rss0, priv1 - priv0);
  if (!UNDER_ASAN && !under_valgrind) {
    CHECK(rss0 > 0);
    CHECK(rss1 - rss0 < 1024);
    CHECK(priv1 - priv0 < 1024);
  }
  ctl_put(k.ctl, 'x');
  KID_END(&k, "consumer");
  ipcref_view_release(&v);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

int main(void) {
  long seed;
  fixture_start();
  path_say("test_share");
  res_all_maps = 1; /* every mapping is back after a test (plain builds) */
  test_ops = harness_env_long("IPCREF_TEST_OPS", 0);
  seed = harness_env_long("IPCREF_TEST_SEED", (long)time(NULL));
  rng = (unsigned)seed;
  printf("test_share: seed %ld (IPCREF_TEST_SEED)\n", seed);
  warm_up();
  RUN(test_one_small_buffer_costs_little); /* first: a heap not warm yet */
  RUN(test_round_trip_seqpacket);
  RUN(test_round_trip_stream);
  RUN(test_producer_drops_first);
  RUN(test_eight_consumers);
  RUN(test_forwarding);
  RUN(test_many_handoffs);
  RUN(test_release_without_syscalls);
  RUN(test_read_only_mapping);
  RUN(test_sent_buffer_not_writable);
  RUN(test_allocation_pressure);
  RUN(test_allocation_fails_at_each_step);
  RUN(test_replay_and_malformed);
  RUN(test_timeouts_and_hangup_seqpacket);
  RUN(test_timeouts_and_hangup_stream);
  RUN(test_wrong_arguments);
  RUN(test_wrong_arguments_with_peer);
  RUN(test_msg_outlives_peer);
  RUN(test_msg_import_by_its_context);
  RUN(test_forward_outlives_origin_peer);
  RUN(test_msg_free_in_child);
  RUN(test_ctx_free_with_live_buffers);
  RUN(test_table_view_sent);
  RUN(test_table_view_sent_then_written);
  RUN(test_consumer_killed);
  RUN(test_middleman_killed);
  return harness_finish();
}
