/* The sharing layer under threads (run under TSan by make test): 8 threads
 * of one process at once, in 4 pairs. A producer thread allocates shared
 * views in context P, fills them and hands them over its own peer (single
 * sends, batches of 2..16, and ipcref_export over an own transport followed
 * by ipcref_msg_sent); the pair's consumer thread receives them in context C
 * through its own peer (a socketpair to this same process), checks every
 * element, and releases them, forwards some to context F (and takes them
 * back there itself), or leaves them in a pool that any thread releases.
 * The producers drop their own references at once (the blocks go through
 * the limbo), keep some a while, or leave them in the pool as well. Every
 * thread now and then calls ipcref_collect, ipcref_ctx_stats or
 * ipcref_ctx_poll(ctx, 0, NULL) on the contexts it uses.
 *
 * The second variant puts a forked child at the other end of two of the
 * pairs: the child imports what the producer thread sends and forwards each
 * view back to the pair's consumer thread (a forwarded lease in P's ledger,
 * held by this process). The consumers keep the last views they got; the
 * children exit; the forwarded holds outlive them until released here.
 * Children are forked before any thread starts (TSan and fork).
 *
 * At the end every count is back to zero (live slots, limbo, buffers,
 * imported buffers, peers), no lease was reclaimed or refused, and the fds
 * are those of the start. A last test takes the context's own lock (a
 * futex word) from 4 threads at once, and makes one wait for it.
 *
 * Environment: IPCREF_TEST_UNITS sets the hand-offs per pair (default
 * 1500; 400 with IPCREF_UNDER_VALGRIND=1), IPCREF_TEST_SEED the random
 * choices. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"
#include "path.h" /* the channel, or the socket only */

#define PAIRS   4 /* a producer and a consumer thread each: 8 threads */
#define RECV_MS 15000
#define HELD    8  /* views a producer keeps for a while */
#define KEEP    4  /* forwarded views a consumer of a child pair keeps */
#define POOL    96 /* views left for any thread to release */
#define SEGMENT ((size_t)64 << 10) /* P's segments: small, so they churn */

static long units;        /* hand-offs per pair */
static unsigned run_seed; /* IPCREF_TEST_SEED */
static int under_valgrind;

/* ------------------------------------------------------------ failures */

/* Threads cannot use CHECK (its counter is not atomic): they count here,
 * and the main thread checks the count. */
static int thread_errors; /* atomic */
static int stop_all;      /* atomic: a thread failed, the others wind down */

static void fail_at(int line, const char *fmt, ...) {
  va_list ap;
  char msg[256];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  __atomic_fetch_add(&thread_errors, 1, __ATOMIC_RELAXED);
  __atomic_store_n(&stop_all, 1, __ATOMIC_RELAXED);
  printf("    %s:%d: %s\n", __FILE__, line, msg);
  fflush(stdout);
}
#define FAIL(...) fail_at(__LINE__, __VA_ARGS__)
#define STOPPED() __atomic_load_n(&stop_all, __ATOMIC_RELAXED)

/* What the run went through (atomic): the test proves nothing without. */
static long seen_limbo;  /* P's stats, taken by a thread, showed a limbo */
static long n_exports;   /* ipcref_export + own transport */
static long n_batches;   /* ipcref_send_batch */
static long n_forwarded; /* C -> F */
static long n_cross_rel; /* views released from the pool */

static unsigned rnd(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return *s >> 8;
}

/* ------------------------------------------------------------ the plan */

/* What the producer of a pair sends, unit by unit: both ends of the pair
 * draw the same sequence from the same seed, so the consumer knows which
 * transport the next view comes on. */
enum { U_SEND, U_BATCH, U_EXPORT };

static int plan_next(unsigned *plan, int *count) {
  unsigned r = rnd(plan) % 16;
  if (r < 8) {
    *count = 1;
    return U_SEND;
  }
  if (r < 12) {
    *count = 2 + (int)(rnd(plan) % 15); /* 2..16 */
    return U_BATCH;
  }
  *count = 1;
  return U_EXPORT;
}

static unsigned plan_seed(int pair) {
  return run_seed * 31u + (unsigned)pair;
}

/* The contents of view number q of a pair: seed, and element count. */
static uint32_t view_seed(int pair, uint32_t q) {
  return ((uint32_t)pair + 1u) * 0x01000193u ^ (q * 2654435761u) ^ run_seed;
}

static int64_t view_len(uint32_t seed) {
  uint32_t h = seed * 0x9E3779B1u;
  h ^= h >> 15;
  if (h % 40 == 0) return 20000 + (int64_t)(h % 4000); /* own segment */
  return 1 + (int64_t)(h % 3000);                      /* 4 B .. 12 KB */
}

static uint32_t elem(uint32_t seed, int64_t j) {
  return seed ^ ((uint32_t)j * 0x9E3779B1u);
}

/* A fresh shared view of P holding the pattern of `seed`. */
static int make_view(ipcref_ctx *ctx, uint32_t seed, ipcref_view *out) {
  int64_t shape[1], j;
  uint32_t *d;
  ipcref_result r;
  shape[0] = view_len(seed);
  r = ipcref_view_new_shared(ctx, IPCREF_U32, 1, shape, out);
  if (r != IPCREF_OK) {
    FAIL("ipcref_view_new_shared: %s", ipcref_strerror(r));
    return -1;
  }
  d = (uint32_t *)ipcref_view_data_mut(out);
  if (!d) {
    FAIL("a fresh shared view is not writable");
    ipcref_view_release(out);
    return -1;
  }
  for (j = 0; j < shape[0]; j++) d[j] = elem(seed, j);
  return 0;
}

/* 0 when v holds the pattern of `seed` (every element when `full`, else
 * the first, the middle and the last). */
static int check_view(const ipcref_view *v, uint32_t seed, int full,
                      const char *who) {
  int64_t n = view_len(seed), j, step;
  const uint32_t *d;
  if (!v->buf || v->dtype != IPCREF_U32 || v->ndim != 1 || v->shape[0] != n ||
      v->strides[0] != 1) {
    FAIL("%s: view of seed %08x has the wrong geometry", who, seed);
    return -1;
  }
  d = (const uint32_t *)((const char *)ipcref_buf_data(v->buf) +
                         v->byte_offset);
  step = full ? 1 : (n > 2 ? n / 2 : 1);
  for (j = 0; j < n; j += step)
    if (d[j] != elem(seed, j)) {
      FAIL("%s: seed %08x element %lld is %08x, not %08x", who, seed,
           (long long)j, d[j], elem(seed, j));
      return -1;
    }
  if (d[n - 1] != elem(seed, n - 1)) {
    FAIL("%s: seed %08x: the last element is wrong", who, seed);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------ the pool */

/* Views any thread releases: the producers' own references, imported
 * views, forwarded ones. */
static struct pooled {
  ipcref_view v;
  uint32_t seed;
} pool[POOL];
static int pool_n;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

/* Moves *v into the pool, or releases it when the pool is full. */
static void pool_put(ipcref_view *v, uint32_t seed) {
  int in = 0;
  pthread_mutex_lock(&pool_lock);
  if (pool_n < POOL) {
    pool[pool_n].v = *v;
    pool[pool_n].seed = seed;
    pool_n++;
    in = 1;
  }
  pthread_mutex_unlock(&pool_lock);
  if (in)
    memset(v, 0, sizeof *v);
  else
    ipcref_view_release(v);
}

/* Takes one view out of the pool (at random), checks and releases it. */
static void pool_release_one(unsigned *rs) {
  struct pooled e;
  int got = 0;
  pthread_mutex_lock(&pool_lock);
  if (pool_n > 0) {
    int i = (int)(rnd(rs) % (unsigned)pool_n);
    e = pool[i];
    pool[i] = pool[--pool_n];
    got = 1;
  }
  pthread_mutex_unlock(&pool_lock);
  if (!got) return;
  __atomic_fetch_add(&n_cross_rel, 1, __ATOMIC_RELAXED);
  (void)check_view(&e.v, e.seed, 0, "pool");
  ipcref_view_release(&e.v);
}

static void pool_drain(void) {
  unsigned rs = 1;
  while (__atomic_load_n(&pool_n, __ATOMIC_RELAXED) > 0) pool_release_one(&rs);
}

#include "xfer.h"

/* Receives view number q of a pair's plan on the way the plan says. */
static int recv_planned(ipcref_peer *p, int xs, int kind, ipcref_view *out,
                        const char *who) {
  ipcref_result r;
  if (kind == U_EXPORT) {
    ipcref_msg msg;
    if (xfer_recv(xs, &msg, RECV_MS) != 0) {
      if (!STOPPED()) FAIL("%s: nothing on the own transport", who);
      return -1;
    }
    r = ipcref_import(p, &msg, out);
    if (r != IPCREF_OK) {
      FAIL("%s: ipcref_import: %s", who, ipcref_strerror(r));
      return -1;
    }
    return 0;
  }
  r = ipcref_recv(p, out, RECV_MS);
  if (r != IPCREF_OK) {
    if (!STOPPED() || r != IPCREF_ETIMEDOUT)
      FAIL("%s: ipcref_recv: %s", who, ipcref_strerror(r));
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------ the pairs */

typedef struct pair {
  int idx;
  int child;            /* a forked child is the consumer end of sock */
  pid_t pid;            /* that child */
  int sock[2];          /* [0] P's peer, [1] C's (or the child's) */
  int xs[2];            /* own transport, producer -> consumer */
  int fwd[2];           /* [0] C's peer to F, [1] F's peer (in-process pairs) */
  int back[2];          /* [0] the child's peer, [1] C's (child pairs) */
  ipcref_peer *pp;      /* producer thread: P's end */
  ipcref_peer *pc;      /* consumer thread: C's end (of sock, or of back) */
  ipcref_peer *cf, *fc; /* consumer thread: C -> F and F's end */
  ipcref_view kept[KEEP];
  uint32_t kept_seed[KEEP];
  int nkept;
  long received;
} pair;

static ipcref_ctx *P, *C, *F;
static int expect_no_deaths; /* in-process only: ipcref_ctx_poll times out */

/* Now and then: a collect, the stats, or a poll that does not wait. */
static void housekeeping(ipcref_ctx *ctx, unsigned *rs, const char *who) {
  ipcref_stats st;
  ipcref_result r;
  switch (rnd(rs) % 3) {
  case 0: (void)ipcref_collect(ctx); break;
  case 1:
    r = ipcref_ctx_stats(ctx, &st);
    if (r != IPCREF_OK)
      FAIL("%s: ipcref_ctx_stats: %s", who, ipcref_strerror(r));
    if (ctx == P && st.limbo_blocks > 0)
      __atomic_fetch_add(&seen_limbo, 1, __ATOMIC_RELAXED);
    break;
  default:
    r = ipcref_ctx_poll(ctx, 0, NULL);
    if (r != IPCREF_ETIMEDOUT && (expect_no_deaths || r != IPCREF_OK))
      FAIL("%s: ipcref_ctx_poll(0): %s", who, ipcref_strerror(r));
  }
}

static void *producer(void *arg) {
  pair *pr = (pair *)arg;
  unsigned plan = plan_seed(pr->idx);
  unsigned rs = run_seed ^ (0x1000u + (unsigned)pr->idx) * 2654435761u;
  ipcref_view held[HELD], v[16];
  uint32_t seeds[16], q = 0;
  long u;
  int hpos = 0, k, count, kind;
  memset(held, 0, sizeof held);
  for (u = 0; u < units && !STOPPED(); u++) {
    ipcref_result r = IPCREF_OK;
    kind = plan_next(&plan, &count);
    for (k = 0; k < count; k++) {
      seeds[k] = view_seed(pr->idx, q++);
      if (make_view(P, seeds[k], &v[k]) != 0) break;
    }
    if (k < count) {
      while (k-- > 0) ipcref_view_release(&v[k]);
      break;
    }
    if (kind == U_SEND) {
      r = ipcref_send(pr->pp, &v[0]);
    } else if (kind == U_BATCH) {
      r = ipcref_send_batch(pr->pp, v, count);
      __atomic_fetch_add(&n_batches, 1, __ATOMIC_RELAXED);
    } else {
      ipcref_msg msg;
      r = ipcref_export(pr->pp, &v[0], &msg);
      __atomic_fetch_add(&n_exports, 1, __ATOMIC_RELAXED);
      if (r == IPCREF_OK) {
        if (xfer_send(pr->xs[0], &msg) == 0) {
          ipcref_msg_sent(&msg);
        } else {
          ipcref_msg_free(&msg);
          FAIL("producer %d: own transport send failed", pr->idx);
        }
      }
    }
    if (r != IPCREF_OK)
      FAIL("producer %d: send (kind %d): %s", pr->idx, kind,
           ipcref_strerror(r));
    /* Our own references: dropped now (to the limbo while the consumer
     * holds the block), kept a while, or left for another thread. */
    for (k = 0; k < count; k++) {
      switch (rnd(&rs) % 4) {
      case 1: pool_put(&v[k], seeds[k]); break;
      case 2:
        ipcref_view_release(&held[hpos]);
        held[hpos] = v[k];
        hpos = (hpos + 1) % HELD;
        break;
      default: ipcref_view_release(&v[k]);
      }
    }
    if (rnd(&rs) % 4 == 0) housekeeping(P, &rs, "producer");
    pool_release_one(&rs);
  }
  for (k = 0; k < HELD; k++) ipcref_view_release(&held[k]);
  return NULL;
}

/* In-process pairs: forwards v to F and takes it there (this thread owns
 * both peers); the forwarded view goes to the pool or is released. */
static void forward_to_f(pair *pr, ipcref_view *v, uint32_t seed,
                         unsigned *rs) {
  ipcref_view w;
  ipcref_result r = ipcref_send(pr->cf, v);
  if (r != IPCREF_OK) {
    FAIL("consumer %d: forward: %s", pr->idx, ipcref_strerror(r));
    return;
  }
  r = ipcref_recv(pr->fc, &w, RECV_MS);
  if (r != IPCREF_OK) {
    FAIL("consumer %d: receive the forwarded view: %s", pr->idx,
         ipcref_strerror(r));
    return;
  }
  (void)check_view(&w, seed, 1, "forwarded");
  __atomic_fetch_add(&n_forwarded, 1, __ATOMIC_RELAXED);
  if (rnd(rs) % 2)
    pool_put(&w, seed);
  else
    ipcref_view_release(&w);
}

static void *consumer(void *arg) {
  pair *pr = (pair *)arg;
  unsigned plan = plan_seed(pr->idx);
  unsigned rs = run_seed ^ (0x2000u + (unsigned)pr->idx) * 2654435761u;
  uint32_t q = 0;
  long u;
  int k, count, kind, kpos = 0;
  for (u = 0; u < units && !STOPPED(); u++) {
    kind = plan_next(&plan, &count);
    for (k = 0; k < count && !STOPPED(); k++) {
      ipcref_view v;
      uint32_t seed = view_seed(pr->idx, q++);
      /* A child sends everything back one view at a time. */
      if (recv_planned(pr->pc, pr->xs[1], pr->child ? U_SEND : kind, &v,
                       "consumer") != 0)
        break;
      pr->received++;
      if (check_view(&v, seed, 1, "consumer") != 0) {
        ipcref_view_release(&v);
        break;
      }
      if (pr->child) { /* keep the last KEEP: they outlive the child */
        if (pr->nkept == KEEP) pool_put(&pr->kept[kpos], pr->kept_seed[kpos]);
        pr->kept[kpos] = v;
        pr->kept_seed[kpos] = seed;
        kpos = (kpos + 1) % KEEP;
        if (pr->nkept < KEEP) pr->nkept++;
        continue;
      }
      switch (rnd(&rs) % 4) {
      case 1: pool_put(&v, seed); break;
      case 2:
        forward_to_f(pr, &v, seed, &rs);
        ipcref_view_release(&v);
        break;
      default: ipcref_view_release(&v);
      }
    }
    if (rnd(&rs) % 4 == 0) housekeeping(C, &rs, "consumer");
    if (!pr->child && rnd(&rs) % 8 == 0) housekeeping(F, &rs, "consumer/F");
    pool_release_one(&rs);
  }
  return NULL;
}

/* ------------------------------------------------------------ a child */

/* The consumer end of a child pair: imports what the producer thread
 * sends (on the way the plan says), checks it, forwards it back to this
 * process's context C, keeps the last few a while, and leaves. */
static int child_main(pair *pr) {
  ipcref_ctx *ctx;
  ipcref_peer *in, *out;
  ipcref_view ring[HELD];
  unsigned plan = plan_seed(pr->idx);
  uint32_t q = 0;
  long u;
  int k, count, kind, pos = 0, bad = 0;
  ipcref_stats st;
  memset(ring, 0, sizeof ring);
  alarm(60);
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, pr->sock[1], &in) != IPCREF_OK ||
      ipcref_peer_new(ctx, pr->back[0], &out) != IPCREF_OK)
    return 2;
  for (u = 0; u < units && !bad; u++) {
    kind = plan_next(&plan, &count);
    for (k = 0; k < count && !bad; k++) {
      ipcref_view v;
      uint32_t seed = view_seed(pr->idx, q++);
      ipcref_result r;
      if (recv_planned(in, pr->xs[1], kind, &v, "child") != 0 ||
          check_view(&v, seed, 1, "child") != 0) {
        bad = 3;
        break;
      }
      r = ipcref_send(out, &v);
      if (r != IPCREF_OK) {
        FAIL("child: forward back: %s", ipcref_strerror(r));
        bad = 4;
      }
      ipcref_view_release(&ring[pos]);
      ring[pos] = v;
      pos = (pos + 1) % HELD;
    }
  }
  for (k = 0; k < HELD; k++) ipcref_view_release(&ring[k]);
  ipcref_peer_free(in);
  ipcref_peer_free(out);
  if (ipcref_ctx_stats(ctx, &st) != IPCREF_OK || st.imported_bufs != 0 ||
      st.bad_returns != 0 || st.refused != 0)
    bad = bad ? bad : 5;
  ipcref_ctx_free(ctx);
  return bad ? bad : (thread_errors ? 6 : 0);
}

/* ------------------------------------------------------------ the test */

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int n = 0;
  if (!d) return -1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static int xsocketpair(int sv[2]) {
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0) return 0;
  sv[0] = sv[1] = -1;
  return -1;
}

static void xclose(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static int reap_child(pid_t pid) {
  int st = 0, i;
  for (i = 0; i < 30000; i++) { /* 30 s */
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 && errno != EINTR) return -1;
    {
      struct timespec ms = {0, 1000000};
      nanosleep(&ms, NULL);
    }
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

/* A peer on *fd, which it then owns (*fd becomes -1). */
static ipcref_peer *adopt(ipcref_ctx *ctx, int *fd) {
  ipcref_peer *p = NULL;
  CHECK_EQ(ipcref_peer_new(ctx, *fd, &p), IPCREF_OK);
  if (p) *fd = -1;
  return p;
}

static void expect_zero_counts(ipcref_ctx *ctx, const char *name) {
  ipcref_stats st;
  memset(&st, 0, sizeof st);
  (void)ipcref_collect(ctx);
  CHECK_EQ(ipcref_ctx_stats(ctx, &st), IPCREF_OK);
  if (st.live_bufs || st.live_bytes || st.limbo_blocks || st.limbo_bytes ||
      st.live_slots || st.imported_bufs || st.peers || st.bad_returns ||
      st.refused || st.reclaimed)
    printf("    %s: live_bufs %zu live_bytes %zu limbo %zu/%zu B slots %zu "
           "imported %zu peers %zu bad_returns %llu refused %llu reclaimed "
           "%llu\n",
           name, st.live_bufs, st.live_bytes, st.limbo_blocks, st.limbo_bytes,
           st.live_slots, st.imported_bufs, st.peers,
           (unsigned long long)st.bad_returns, (unsigned long long)st.refused,
           (unsigned long long)st.reclaimed);
  CHECK_EQ(st.live_bufs, 0);
  CHECK_EQ(st.live_bytes, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.limbo_bytes, 0);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.imported_bufs, 0);
  CHECK_EQ(st.peers, 0);
  CHECK_EQ(st.bad_returns, 0);
  CHECK_EQ(st.refused, 0);
  CHECK_EQ(st.reclaimed, 0); /* every holder let go before it died */
}

/* nchild: how many pairs (the last ones) have a forked child at the
 * consumer end. */
static void run_pairs(int nchild) {
  pair pairs[PAIRS];
  pthread_t th[2 * PAIRS];
  ipcref_ctx_options opt;
  ipcref_stats st;
  int i, k, fds0 = count_fds(), started = 0;
  long total = 0;
  memset(pairs, 0, sizeof pairs);
  thread_errors = 0;
  stop_all = 0;
  seen_limbo = n_exports = n_batches = n_forwarded = n_cross_rel = 0;
  expect_no_deaths = nchild == 0;
  for (i = 0; i < PAIRS; i++) {
    pair *pr = &pairs[i];
    pr->idx = i;
    pr->child = i >= PAIRS - nchild;
    pr->fwd[0] = pr->fwd[1] = pr->back[0] = pr->back[1] = -1;
    CHECK_EQ(xsocketpair(pr->sock), 0);
    CHECK_EQ(xsocketpair(pr->xs), 0);
    if (pr->child)
      CHECK_EQ(xsocketpair(pr->back), 0);
    else
      CHECK_EQ(xsocketpair(pr->fwd), 0);
  }
  if (harness_failures_in_test) goto close_all;
  /* The children first: before any context and any thread. */
  fflush(stdout);
  for (i = 0; i < PAIRS; i++) {
    pair *pr = &pairs[i];
    if (!pr->child) continue;
    pr->pid = fork();
    CHECK(pr->pid >= 0);
    if (pr->pid == 0) {
      for (k = 0; k < PAIRS; k++) { /* keep only this pair's child ends */
        xclose(&pairs[k].sock[0]);
        xclose(&pairs[k].xs[0]);
        xclose(&pairs[k].back[1]);
        xclose(&pairs[k].fwd[0]);
        xclose(&pairs[k].fwd[1]);
        if (k != i) {
          xclose(&pairs[k].sock[1]);
          xclose(&pairs[k].xs[1]);
          xclose(&pairs[k].back[0]);
        }
      }
      fflush(stdout);
      _exit(child_main(pr));
    }
    xclose(&pr->sock[1]);
    xclose(&pr->xs[1]);
    xclose(&pr->back[0]);
  }
  memset(&opt, 0, sizeof opt);
  opt.segment_size = SEGMENT;
  CHECK_EQ(ipcref_ctx_new(&opt, &P), IPCREF_OK);
  CHECK_EQ(ipcref_ctx_new(NULL, &C), IPCREF_OK);
  CHECK_EQ(ipcref_ctx_new(NULL, &F), IPCREF_OK);
  if (harness_failures_in_test) goto close_all;
  CHECK(ipcref_ctx_poll_fd(P) >= 0);
  CHECK(ipcref_ctx_poll_fd(C) >= 0);
  CHECK(ipcref_ctx_poll_fd(F) >= 0);
  for (i = 0; i < PAIRS; i++) {
    pair *pr = &pairs[i];
    pr->pp = adopt(P, &pr->sock[0]);
    if (pr->child) {
      pr->pc = adopt(C, &pr->back[1]);
    } else {
      pr->pc = adopt(C, &pr->sock[1]);
      pr->cf = adopt(C, &pr->fwd[0]);
      pr->fc = adopt(F, &pr->fwd[1]);
    }
  }
  if (harness_failures_in_test) goto free_peers;
  for (i = 0; i < PAIRS; i++) {
    if (pthread_create(&th[started], NULL, producer, &pairs[i]) == 0) started++;
    if (pthread_create(&th[started], NULL, consumer, &pairs[i]) == 0) started++;
  }
  CHECK_EQ(started, 2 * PAIRS);
  for (i = 0; i < started; i++) pthread_join(th[i], NULL);
  CHECK_EQ(thread_errors, 0);
  if (units >= 200) { /* the run went through every path */
    CHECK(n_exports > 0 && n_batches > 0 && n_cross_rel > 0);
    CHECK(n_forwarded > 0);
    CHECK(seen_limbo > 0); /* blocks went through the limbo */
  }
  for (i = 0; i < PAIRS; i++) total += pairs[i].received;
  /* Every view of every unit arrived. */
  {
    long want = 0;
    for (i = 0; i < PAIRS; i++) {
      unsigned plan = plan_seed(i);
      long u;
      int count;
      for (u = 0; u < units; u++) {
        (void)plan_next(&plan, &count);
        want += count;
      }
    }
    CHECK_EQ(total, want);
    printf("    %ld views, %ld batches, %ld exports, %ld forwarded, %ld "
           "released from the pool, limbo seen %ld times\n",
           total, n_batches, n_exports, n_forwarded, n_cross_rel, seen_limbo);
  }
  pool_drain();

  if (nchild) {
    long kept = 0;
    /* The children exit once they have let go of everything. */
    for (i = 0; i < PAIRS; i++)
      if (pairs[i].child) {
        int status = reap_child(pairs[i].pid);
        CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (status != -1 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
          printf("    child of pair %d: status %#x\n", i, status);
        pairs[i].pid = 0;
        kept += pairs[i].nkept;
      }
    /* P sees them die; what they forwarded here stays: it is ours. */
    {
      size_t freed = 0;
      ipcref_result r = ipcref_ctx_poll(P, 0, &freed);
      CHECK(r == IPCREF_OK || r == IPCREF_ETIMEDOUT);
    }
    (void)ipcref_collect(P);
    memset(&st, 0, sizeof st);
    CHECK_EQ(ipcref_ctx_stats(P, &st), IPCREF_OK);
    CHECK_EQ(st.peer_deaths, nchild);
    CHECK_EQ(st.live_slots, kept);
    CHECK_EQ(st.limbo_blocks, kept);
    CHECK_EQ(st.live_bufs, 0);
    CHECK_EQ(st.reclaimed, 0);
    for (i = 0; i < PAIRS; i++)
      for (k = 0; k < pairs[i].nkept; k++) {
        (void)check_view(&pairs[i].kept[k], pairs[i].kept_seed[k], 1, "kept");
        ipcref_view_release(&pairs[i].kept[k]);
      }
    CHECK_EQ(thread_errors, 0);
  } else {
    memset(&st, 0, sizeof st);
    CHECK_EQ(ipcref_ctx_stats(P, &st), IPCREF_OK);
    CHECK_EQ(st.peer_deaths, 0);
  }

free_peers:
  for (i = 0; i < PAIRS; i++) {
    ipcref_peer_free(pairs[i].pp);
    ipcref_peer_free(pairs[i].pc);
    ipcref_peer_free(pairs[i].cf);
    ipcref_peer_free(pairs[i].fc);
  }
  if (P && C && F) {
    expect_zero_counts(P, "P");
    expect_zero_counts(C, "C");
    expect_zero_counts(F, "F");
  }
  ipcref_ctx_free(P);
  ipcref_ctx_free(C);
  ipcref_ctx_free(F);
  P = C = F = NULL;
close_all:
  for (i = 0; i < PAIRS; i++) {
    pair *pr = &pairs[i];
    if (pr->pid > 0) {
      kill(pr->pid, SIGKILL);
      waitpid(pr->pid, NULL, 0);
    }
    xclose(&pr->sock[0]);
    xclose(&pr->sock[1]);
    xclose(&pr->xs[0]);
    xclose(&pr->xs[1]);
    xclose(&pr->fwd[0]);
    xclose(&pr->fwd[1]);
    xclose(&pr->back[0]);
    xclose(&pr->back[1]);
  }
  CHECK_EQ(count_fds(), fds0);
}

/* Two pairs with a forked child at the consumer end (run first: no thread
 * has started yet when the children are forked). */
static void test_threads_with_children(void) {
  run_pairs(2);
}

/* All four pairs inside this process. */
static void test_threads_in_process(void) {
  run_pairs(0);
}

/* ---- the context's lock ------------------------------------------------
 * IPCREF__LOCK is a futex word (share_state). Threads that take it in
 * turn lose no update of what it guards (and TSan, which runs this file,
 * would name a race); a thread that finds it held sleeps until it is
 * given back: the word then says 2 (held, waited for), and the sleeper
 * gets the lock only after the holder has let go. */
static struct {
  ipcref_ctx *ctx;
  long count, rounds;
  int released; /* atomic: the holder let go */
} lk;

static void *lock_hammer(void *arg) {
  long i;
  (void)arg;
  for (i = 0; i < lk.rounds; i++) {
    IPCREF__LOCK(lk.ctx);
    lk.count++;
    IPCREF__UNLOCK(lk.ctx);
  }
  return NULL;
}

static void *lock_waiter(void *arg) {
  int *saw = (int *)arg;
  IPCREF__LOCK(lk.ctx);
  *saw = __atomic_load_n(&lk.released, __ATOMIC_ACQUIRE);
  IPCREF__UNLOCK(lk.ctx);
  return NULL;
}

static uint32_t lock_word(void) {
  return __atomic_load_n(&lk.ctx->lock.word, __ATOMIC_ACQUIRE);
}

static void test_ctx_lock(void) {
  pthread_t th[4];
  int i, saw = -1, started = 0;
  long waited_ms = 0;
  memset(&lk, 0, sizeof lk);
  CHECK_EQ(ipcref_ctx_new(NULL, &lk.ctx), IPCREF_OK);
  if (!lk.ctx) return;
  lk.rounds = under_valgrind ? 20000 : 200000;
  for (i = 0; i < 4; i++)
    if (pthread_create(&th[i], NULL, lock_hammer, NULL) == 0) started++;
  for (i = 0; i < started; i++) pthread_join(th[i], NULL);
  CHECK_EQ(started, 4);
  CHECK_EQ(lk.count, started * lk.rounds);
  CHECK_EQ(lock_word(), 0u);
  /* Held here: the waiter goes to sleep, saying so in the word. */
  IPCREF__LOCK(lk.ctx);
  if (pthread_create(&th[0], NULL, lock_waiter, &saw) != 0) {
    IPCREF__UNLOCK(lk.ctx);
    CHECK(!"pthread_create");
    ipcref_ctx_free(lk.ctx);
    return;
  }
  while (lock_word() != 2u && waited_ms++ < 10000) usleep(1000);
  CHECK_EQ(lock_word(), 2u);
  usleep(10000); /* well inside FUTEX_WAIT by now */
  __atomic_store_n(&lk.released, 1, __ATOMIC_RELEASE);
  IPCREF__UNLOCK(lk.ctx);
  pthread_join(th[0], NULL);
  CHECK_EQ(saw, 1);
  CHECK_EQ(lock_word(), 0u);
  ipcref_ctx_free(lk.ctx);
}

/* Peers made, hello read and freed by one thread each, in two contexts,
 * while the other thread makes and frees its own and asks both contexts
 * what waits on time: the context-wide calls read every peer's hello
 * state, which each peer's own thread sets (under TSan, a race there
 * fails the suite). */
typedef struct hello_arg {
  ipcref_ctx *p, *c;
  int rounds, bad, *stop;
} hello_arg;
static void hello_round(hello_arg *a) {
  int sv[2];
  ipcref_peer *x, *y;
  ipcref_view v, w;
  const int64_t n = 16;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    a->bad++;
    return;
  }
  if (ipcref_peer_new(a->p, sv[0], &x) != IPCREF_OK ||
      ipcref_peer_new(a->c, sv[1], &y) != IPCREF_OK) {
    a->bad++; /* (leaks a socket on this failure only) */
    return;
  }
  if (ipcref_view_new_shared(a->p, IPCREF_U8, 1, &n, &v) == IPCREF_OK) {
    a->bad += ipcref_send(x, &v) != IPCREF_OK;
    ipcref_view_release(&v);
    if (ipcref_recv(y, &w, 5000) == IPCREF_OK)
      ipcref_view_release(&w);
    else
      a->bad++;
  }
  ipcref_peer_free(y);
  ipcref_peer_free(x);
}
static void *hello_maker(void *arg) {
  hello_arg *a = (hello_arg *)arg;
  int i;
  for (i = 0; i < a->rounds; i++) hello_round(a);
  __atomic_store_n(a->stop, 1, __ATOMIC_RELEASE);
  return NULL;
}
static void *hello_asker(void *arg) {
  hello_arg *a = (hello_arg *)arg;
  while (!__atomic_load_n(a->stop, __ATOMIC_ACQUIRE)) {
    (void)ipcref_ctx_timeout(a->p);
    (void)ipcref_ctx_timeout(a->c);
    hello_round(a);
  }
  return NULL;
}
static void test_hello_under_ctx_wide_calls(void) {
  hello_arg a[2];
  pthread_t t[2];
  int stop = 0, i;
  memset(a, 0, sizeof a);
  CHECK_EQ(ipcref_ctx_new(NULL, &a[0].p), IPCREF_OK);
  CHECK_EQ(ipcref_ctx_new(NULL, &a[0].c), IPCREF_OK);
  if (!a[0].p || !a[0].c) return;
  a[0].rounds = under_valgrind ? 20 : 100;
  a[0].stop = &stop;
  a[1] = a[0];
  CHECK_EQ(pthread_create(&t[0], NULL, hello_maker, &a[0]), 0);
  CHECK_EQ(pthread_create(&t[1], NULL, hello_asker, &a[1]), 0);
  for (i = 0; i < 2; i++) pthread_join(t[i], NULL);
  CHECK_EQ(a[0].bad + a[1].bad, 0);
  {
    ipcref_stats st;
    ipcref_collect(a[0].p);
    CHECK_EQ(ipcref_ctx_stats(a[0].p, &st), IPCREF_OK);
    CHECK_EQ(st.live_slots, 0);
    CHECK_EQ(st.peers, 0);
  }
  ipcref_ctx_free(a[0].c);
  ipcref_ctx_free(a[0].p);
}

static int detect_valgrind(void) {
  static char buf[1 << 16];
  ssize_t n;
  int fd, found = 0;
  if (harness_env_long("IPCREF_UNDER_VALGRIND", 0) != 0) return 1;
  fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  while (!found && (n = read(fd, buf, sizeof buf - 1)) > 0) {
    buf[n] = 0;
    found = strstr(buf, "vgpreload") != NULL;
  }
  close(fd);
  return found;
}

int main(void) {
  long seed;
  under_valgrind = detect_valgrind();
  path_say("test_share_threads");
  units = harness_env_long("IPCREF_TEST_UNITS", under_valgrind ? 400 : 1500);
  if (units < 1) units = 1;
  seed = harness_env_long("IPCREF_TEST_SEED", (long)time(NULL));
  run_seed = (unsigned)seed;
  printf("test_share_threads: seed %ld (IPCREF_TEST_SEED), %ld units per "
         "pair\n",
         seed, units);
  RUN(test_threads_with_children);
  RUN(test_threads_in_process);
  RUN(test_ctx_lock);
  RUN(test_hello_under_ctx_wide_calls);
  return harness_finish();
}
