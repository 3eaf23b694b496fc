/* The sharing layer against hostile processes (issue 5): what a malicious
 * producer sends, what a malicious consumer does with the fds it got, who
 * may connect, and what a consumer can write into its ledger. Real
 * processes (fork, socketpairs) wherever the other side matters; the
 * malformed-message cases run both ends in this process, since what is
 * tested there is ipcref_import itself.
 *
 *   a. malicious producer: hand-built IPCM messages (bad fds, lying sizes,
 *      offsets past the end, slots past the counter file, wrong generations,
 *      replays, lying ledger headers) are refused with EPROTO, with nothing
 *      mapped, no fd leaked, stats.refused counted, and the peer still works;
 *      slots published ahead of their leases: a forged return of one is
 *      refused, a record naming one costs only the producer; a message
 *      with the most fds comes whole
 *   b. a consumer cannot shrink, grow, punch or write a segment it received
 *   c. isolation: an isolated block reaches the consumer in a segment of its
 *      own (page-rounded); a pooled one shows its neighbours (the trade-off)
 *   d. who may connect: a peer of another uid is refused (EPEER) unless
 *      allowed (runs as root: a child setuid()s to nobody)
 *   e. counters that cannot lie: forged ledger entries are reported to the
 *      context's error hook, counted in stats.bad_returns, and never free a
 *      block early; holes made on purpose cost a sweep a bounded scan
 *   f. holders a consumer names: a forwarding consumer names the processes
 *      that hold its forwards, and the producer watches them; a consumer
 *      naming hundreds cannot take the producer's fds (and the cap's
 *      bookkeeping, when a named process turns out to be a peer)
 *   g. impostors: a producer cannot speak for another one (retire the
 *      segments another producer sent the same consumer), nor plant a
 *      segment of its own under another one's name for that one's own
 *      messages
 *
 * Children are forked before the parent makes its contexts; each reports
 * through its exit status (0: every CHECK held) and a control socket.
 * Environment: IPCREF_UNDER_VALGRIND=1 (set by tests/run.sh under valgrind)
 * only relaxes the total-mapping count, which valgrind moves at will. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#define WAIT_MS       20000 /* longest wait for a control byte or a view */
#define CTL_MS        WAIT_MS
#define REAP_MS       WAIT_MS
#define CHILD_ALARM_S 60 /* a child never outlives this */
#define NOBODY        65534u

#include "share_fixture.h"

/* CHECK that a system call failed with `err`. */
#define CHECK_ERRNO(expr, err)                                                 \
  do {                                                                         \
    long check_rc_ = (long)(expr);                                             \
    int check_errno_ = errno;                                                  \
    if (check_rc_ != -1 || check_errno_ != (err)) {                            \
      harness_failures_in_test++;                                              \
      printf("    %s:%d: %s: returned %ld (errno %d: %s), not -1 with %s\n",   \
             __FILE__, __LINE__, #expr, check_rc_, check_errno_,               \
             strerror(check_errno_), #err);                                    \
    }                                                                          \
  } while (0)

/* ------------------------------------------------------------ data */

static unsigned char pat(uint32_t seed, size_t i) {
  return (unsigned char)(seed * 131u + i * 7u + (i >> 9) + 1u);
}

static size_t view_bytes(const ipcref_view *v) {
  return (size_t)ipcref_view_numel(v) * ipcref_dtype_size(v->dtype);
}

static unsigned char *view_data(const ipcref_view *v) {
  return (unsigned char *)ipcref_buf_data(v->buf) + v->byte_offset;
}

static void fill(const ipcref_view *v, uint32_t seed) {
  unsigned char *d = view_data(v);
  size_t i, n = view_bytes(v);
  for (i = 0; i < n; i++) d[i] = pat(seed, i);
}

/* Bytes of a contiguous view that differ from the pattern (n: all bytes). */
static size_t bad_bytes(const ipcref_view *v, uint32_t seed) {
  const unsigned char *d;
  size_t i, n, bad = 0;
  if (!v->buf) return (size_t)-1;
  d = view_data(v);
  n = view_bytes(v);
  for (i = 0; i < n; i++) bad += d[i] != pat(seed, i);
  return bad;
}

/* A 1-d shared view of `n` bytes filled with a pattern. */
static ipcref_result u8_view(ipcref_ctx *ctx, int64_t n, uint32_t seed,
                             ipcref_view *out) {
  ipcref_result r = ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, out);
  if (r == IPCREF_OK) fill(out, seed);
  return r;
}

/* The same in a block of its own (ipcref_shared_new_isolated). */
static ipcref_result isolated_view(ipcref_ctx *ctx, int64_t n, uint32_t seed,
                                   ipcref_view *out) {
  ipcref_buf *b = NULL;
  ipcref_result r = ipcref_shared_new_isolated(ctx, (size_t)n, &b);
  if (r != IPCREF_OK) return r;
  r = ipcref_view_of(b, IPCREF_U8, 1, &n, out);
  ipcref_buf_release(b);
  if (r == IPCREF_OK) fill(out, seed);
  return r;
}

/* ------------------------------------------------------------ the wire
 * The IPCM v2 record of src/share_wire.h, field by field, little endian:
 *   header  u32 magic  u16 version  u16 nviews  u16 nfds  u16 nretired
 *           u32 sender pid  u64 sender nonce  u16 meta length   (26 bytes)
 *   fd      u8 kind  u8 writable  u32 origin pid  u64 origin nonce  u64 id
 *           u64 size                                            (30 bytes)
 *   retired u64 id
 *   view    u32 origin pid  u64 origin nonce  u64 segment id  u64 segment
 *           size  u64 block offset  u64 block size  u64 ledger id  u32 slot
 *           u32 generation  u8 dtype  u8 ndim  u8 writable  u8 0
 *           i64 byte offset  ndim x i64 shape  ndim x i64 strides
 *   meta    meta length x u8
 * A malicious producer writes whatever it likes in them. */
#define W_MAXD IPCREF_MAX_DIMS

typedef struct wfd {
  unsigned kind, writable;
  uint32_t pid;
  uint64_t nonce, id, size;
} wfd;

typedef struct wview {
  uint32_t pid;
  uint64_t nonce, seg_id, seg_size, block_offset, block_size, ledger_id;
  uint32_t slot, gen;
  unsigned dtype, ndim, writable, pad;
  int64_t byte_offset, shape[W_MAXD], strides[W_MAXD];
} wview;

typedef struct wmsg {
  uint32_t magic;
  unsigned version, nviews, nfds, nret;
  uint32_t pid;
  uint64_t nonce;
  unsigned meta_len;
  wfd fd[IPCREF_MSG_MAX_FDS];
  uint64_t ret[64];
  wview v[IPCREF_MSG_MAX_VIEWS];
  unsigned char meta[IPCREF_META_MAX];
} wmsg;

typedef struct wcur {
  const unsigned char *p;
  size_t len, pos;
  int bad;
} wcur;

static uint64_t wget(wcur *c, int bytes) {
  uint64_t v = 0;
  int i;
  if (c->pos + (size_t)bytes > c->len) {
    c->bad = 1;
    return 0;
  }
  for (i = 0; i < bytes; i++) v |= (uint64_t)c->p[c->pos++] << (8 * i);
  return v;
}

/* 1 when `m` parses as a whole IPCM v1 record. */
static int wparse(const ipcref_msg *m, wmsg *w) {
  wcur c;
  unsigned i, d;
  c.p = m->bytes;
  c.len = m->len;
  c.pos = 0;
  c.bad = 0;
  memset(w, 0, sizeof *w);
  w->magic = (uint32_t)wget(&c, 4);
  w->version = (unsigned)wget(&c, 2);
  w->nviews = (unsigned)wget(&c, 2);
  w->nfds = (unsigned)wget(&c, 2);
  w->nret = (unsigned)wget(&c, 2);
  w->pid = (uint32_t)wget(&c, 4);
  w->nonce = wget(&c, 8);
  w->meta_len = (unsigned)wget(&c, 2);
  if (c.bad || w->magic != 0x4d435049u || w->version != 2 ||
      w->nviews > IPCREF_MSG_MAX_VIEWS || w->nfds > IPCREF_MSG_MAX_FDS ||
      w->nret > 64 || w->meta_len > IPCREF_META_MAX)
    return 0;
  for (i = 0; i < w->nfds; i++) {
    w->fd[i].kind = (unsigned)wget(&c, 1);
    w->fd[i].writable = (unsigned)wget(&c, 1);
    w->fd[i].pid = (uint32_t)wget(&c, 4);
    w->fd[i].nonce = wget(&c, 8);
    w->fd[i].id = wget(&c, 8);
    w->fd[i].size = wget(&c, 8);
  }
  for (i = 0; i < w->nret; i++) w->ret[i] = wget(&c, 8);
  for (i = 0; i < w->nviews; i++) {
    wview *v = &w->v[i];
    v->pid = (uint32_t)wget(&c, 4);
    v->nonce = wget(&c, 8);
    v->seg_id = wget(&c, 8);
    v->seg_size = wget(&c, 8);
    v->block_offset = wget(&c, 8);
    v->block_size = wget(&c, 8);
    v->ledger_id = wget(&c, 8);
    v->slot = (uint32_t)wget(&c, 4);
    v->gen = (uint32_t)wget(&c, 4);
    v->dtype = (unsigned)wget(&c, 1);
    v->ndim = (unsigned)wget(&c, 1);
    v->writable = (unsigned)wget(&c, 1);
    v->pad = (unsigned)wget(&c, 1);
    if (v->ndim > W_MAXD) return 0;
    v->byte_offset = (int64_t)wget(&c, 8);
    for (d = 0; d < v->ndim; d++) v->shape[d] = (int64_t)wget(&c, 8);
    for (d = 0; d < v->ndim; d++) v->strides[d] = (int64_t)wget(&c, 8);
  }
  for (i = 0; i < w->meta_len; i++) w->meta[i] = (unsigned char)wget(&c, 1);
  return !c.bad && c.pos == c.len;
}

static void wput(unsigned char *b, size_t *pos, uint64_t v, int bytes) {
  int i;
  for (i = 0; i < bytes; i++)
    if (*pos < IPCREF_MSG_MAX_BYTES)
      b[(*pos)++] = (unsigned char)(v >> (8 * i));
}

/* Encodes `w` into m->bytes/len (an ndim over the limit is written as is,
 * with the limit's worth of shape and strides). */
static void wencode(const wmsg *w, ipcref_msg *m) {
  size_t pos = 0;
  unsigned i, d, nd;
  wput(m->bytes, &pos, w->magic, 4);
  wput(m->bytes, &pos, w->version, 2);
  wput(m->bytes, &pos, w->nviews, 2);
  wput(m->bytes, &pos, w->nfds, 2);
  wput(m->bytes, &pos, w->nret, 2);
  wput(m->bytes, &pos, w->pid, 4);
  wput(m->bytes, &pos, w->nonce, 8);
  wput(m->bytes, &pos, w->meta_len, 2);
  for (i = 0; i < w->nfds && i < IPCREF_MSG_MAX_FDS; i++) {
    wput(m->bytes, &pos, w->fd[i].kind, 1);
    wput(m->bytes, &pos, w->fd[i].writable, 1);
    wput(m->bytes, &pos, w->fd[i].pid, 4);
    wput(m->bytes, &pos, w->fd[i].nonce, 8);
    wput(m->bytes, &pos, w->fd[i].id, 8);
    wput(m->bytes, &pos, w->fd[i].size, 8);
  }
  for (i = 0; i < w->nret && i < 64; i++) wput(m->bytes, &pos, w->ret[i], 8);
  for (i = 0; i < w->nviews && i < IPCREF_MSG_MAX_VIEWS; i++) {
    const wview *v = &w->v[i];
    wput(m->bytes, &pos, v->pid, 4);
    wput(m->bytes, &pos, v->nonce, 8);
    wput(m->bytes, &pos, v->seg_id, 8);
    wput(m->bytes, &pos, v->seg_size, 8);
    wput(m->bytes, &pos, v->block_offset, 8);
    wput(m->bytes, &pos, v->block_size, 8);
    wput(m->bytes, &pos, v->ledger_id, 8);
    wput(m->bytes, &pos, v->slot, 4);
    wput(m->bytes, &pos, v->gen, 4);
    wput(m->bytes, &pos, v->dtype, 1);
    wput(m->bytes, &pos, v->ndim, 1);
    wput(m->bytes, &pos, v->writable, 1);
    wput(m->bytes, &pos, v->pad, 1);
    wput(m->bytes, &pos, (uint64_t)v->byte_offset, 8);
    nd = v->ndim < W_MAXD ? v->ndim : W_MAXD;
    for (d = 0; d < nd; d++) wput(m->bytes, &pos, (uint64_t)v->shape[d], 8);
    for (d = 0; d < nd; d++) wput(m->bytes, &pos, (uint64_t)v->strides[d], 8);
  }
  for (i = 0; i < w->meta_len && i < IPCREF_META_MAX; i++)
    wput(m->bytes, &pos, w->meta[i], 1);
  m->len = pos;
}

/* The index of the fd record of `kind` (1 segment, 2 ledger), or -1. */
static int wfd_of(const wmsg *w, unsigned kind) {
  unsigned i;
  for (i = 0; i < w->nfds; i++)
    if (w->fd[i].kind == kind) return (int)i;
  return -1;
}

/* ------------------------------------------------------------ fakes */

/* A memfd of `size` bytes holding `content` (clen bytes, may be NULL),
 * with `seals` added (0: none; -1: created without MFD_ALLOW_SEALING). */
static int fake_memfd(size_t size, int seals, const void *content,
                      size_t clen) {
  int fd = memfd_create("ipcref-hostile-fake",
                        MFD_CLOEXEC | (seals >= 0 ? MFD_ALLOW_SEALING : 0));
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)size) != 0 ||
      (content && pwrite(fd, content, clen, 0) != (ssize_t)clen) ||
      (seals > 0 && fcntl(fd, F_ADD_SEALS, seals) != 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* A regular file of `size` bytes, unlinked at once (no residue in /tmp). */
static int fake_regular(size_t size) {
  char path[] = "/tmp/ipcref-hostile-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  unlink(path);
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 || ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int fake_socket(void) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  close(sv[1]);
  return sv[0];
}

static int fake_pipe(void) {
  int pv[2];
  if (pipe2(pv, O_CLOEXEC) != 0) return -1;
  close(pv[1]);
  return pv[0];
}

/* The file behind `fd` opened again with `flags` (through /proc). */
static int reopen(int fd, int flags) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  return open(path, flags | O_CLOEXEC);
}

/* ============================================================ a. producer */

/* Both ends in this process: producer P (peer pp) and consumer C (peer cp)
 * over a socketpair; `tmpl` is a genuine one-view message with both fds
 * (segment and ledger), which the cases below copy and break. */
static struct {
  local_pair l; /* prod P, cons C; their peers pp, cp */
  ipcref_view v;
  ipcref_msg tmpl; /* owns its fds; origin NULL */
  wmsg w;
  int seg_i, led_i;
  size_t seg_size, led_size;
  uint32_t nslots;
  unsigned char *ledger_copy;
  int refusals;
} A;

/* A copy of the template's fds, with the segment's and the ledger's
 * replaced by `seg_fd`/`led_fd` where those are >= 0 (taken), and `w`
 * as its bytes. */
static void evil_msg(const wmsg *w, int seg_fd, int led_fd, ipcref_msg *out) {
  int i;
  memset(out, 0, sizeof *out);
  wencode(w, out);
  out->nfds = A.tmpl.nfds;
  for (i = 0; i < A.tmpl.nfds; i++) {
    if (i == A.seg_i && seg_fd >= 0)
      out->fds[i] = seg_fd;
    else if (i == A.led_i && led_fd >= 0)
      out->fds[i] = led_fd;
    else
      out->fds[i] = fcntl(A.tmpl.fds[i], F_DUPFD_CLOEXEC, 0);
  }
  if (seg_fd < -1 || led_fd < -1) CHECK(!"a fake fd could not be made");
}

typedef struct evil_mark {
  res_mark res;
  ipcref_stats st;
} evil_mark;

static void evil_begin(evil_mark *m) {
  res_begin(&m->res);
  m->st = stats_of(A.l.cons);
  errors_reset();
}

/* Imports `msg` on the consumer: it must be refused with EPROTO, its fds
 * closed, nothing mapped, kept or leaked, and the refusal counted. */
static void evil_end_at(const evil_mark *m, ipcref_msg *msg, const char *what,
                        int line) {
  ipcref_view v;
  ipcref_stats s;
  ipcref_result rc;
  int before = harness_failures_in_test;
  memset(&v, 0, sizeof v);
  rc = ipcref_import(A.l.cp, msg, &v);
  if (rc != IPCREF_EPROTO) {
    harness_failures_in_test++;
    printf("    %s:%d: %s: %s, not EPROTO\n", __FILE__, line, what,
           ipcref_strerror(rc));
    ipcref_view_release(&v);
  }
  if (msg->nfds != 0) {
    harness_failures_in_test++;
    printf("    %s:%d: %s: the message's fds were not taken\n", __FILE__, line,
           what);
    msg_close_fds(msg);
  }
  res_end_at(&m->res, 0, __FILE__, line);
  s = stats_of(A.l.cons);
  if (s.mapped_segments != m->st.mapped_segments ||
      s.counter_files != m->st.counter_files ||
      s.imported_bufs != m->st.imported_bufs ||
      s.fds_received != m->st.fds_received) {
    harness_failures_in_test++;
    printf("    %s:%d: %s: consumer kept something (segments %zu, ledgers "
           "%zu, imported %zu, fds received %llu)\n",
           __FILE__, line, what, s.mapped_segments, s.counter_files,
           s.imported_bufs, (unsigned long long)s.fds_received);
  }
  if (rc == IPCREF_EPROTO && s.refused != m->st.refused + 1) {
    harness_failures_in_test++;
    printf("    %s:%d: %s: stats.refused %llu, %llu before\n", __FILE__, line,
           what, (unsigned long long)s.refused,
           (unsigned long long)m->st.refused);
  }
  /* Named: the hook heard why, in words other than the catch-all. */
  if (rc == IPCREF_EPROTO &&
      (err_eproto != 1 || strncmp(err_last, "message refused: ", 17) != 0 ||
       strncmp(err_last + 17, "malformed", 9) == 0)) {
    harness_failures_in_test++;
    printf("    %s:%d: %s: %d reports, the last: %s\n", __FILE__, line, what,
           err_eproto, err_last);
  }
  if (harness_failures_in_test != before) printf("      (case: %s)\n", what);
  A.refusals++;
}
#define EVIL(m, msg, what) evil_end_at(m, msg, what, __LINE__)

/* One case that breaks only the bytes: `edit` is a statement on `w`. */
#define EVIL_BYTES(what, edit)                                                 \
  do {                                                                         \
    evil_mark m_;                                                              \
    ipcref_msg msg_;                                                           \
    wmsg w = A.w;                                                              \
    evil_begin(&m_);                                                           \
    edit;                                                                      \
    evil_msg(&w, -1, -1, &msg_);                                               \
    EVIL(&m_, &msg_, what);                                                    \
  } while (0)

/* One case that replaces the segment's fd (and may edit the bytes). */
#define EVIL_SEG(what, make_fd, edit)                                          \
  do {                                                                         \
    evil_mark m_;                                                              \
    ipcref_msg msg_;                                                           \
    wmsg w = A.w;                                                              \
    int fd_;                                                                   \
    evil_begin(&m_);                                                           \
    fd_ = (make_fd);                                                           \
    edit;                                                                      \
    evil_msg(&w, fd_ < 0 ? -2 : fd_, -1, &msg_);                               \
    EVIL(&m_, &msg_, what);                                                    \
  } while (0)

#define EVIL_LEDGER(what, make_fd)                                             \
  do {                                                                         \
    evil_mark m_;                                                              \
    ipcref_msg msg_;                                                           \
    int fd_;                                                                   \
    evil_begin(&m_);                                                           \
    fd_ = (make_fd);                                                           \
    evil_msg(&A.w, -1, fd_ < 0 ? -2 : fd_, &msg_);                             \
    EVIL(&m_, &msg_, what);                                                    \
  } while (0)

/* A sealed copy of the real ledger whose header field at `off` (`bytes`
 * wide) says `value` instead: a ledger whose header lies. */
static int lying_ledger(size_t off, int bytes, uint64_t value) {
  unsigned char *copy = (unsigned char *)malloc(A.led_size);
  int i, fd;
  if (!copy) return -1;
  memcpy(copy, A.ledger_copy, A.led_size);
  for (i = 0; i < bytes; i++)
    copy[off + (size_t)i] = (unsigned char)(value >> (8 * i));
  fd = fake_memfd(A.led_size, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, copy,
                  A.led_size);
  free(copy);
  return fd;
}

static void a_setup(void) {
  ipcref_msg orig;
  int64_t shape[1] = {4096}; /* 16 KiB of f32 in a pooled segment */
  void *lm;
  memset(&A, 0, sizeof A);
  ipcref_set_error_hook(&error_hook); /* each refusal names its reason */
  local_pair_open(&A.l, NULL, NULL);
  /* Read the producer's hello now: the watch on it (a pidfd) is the
   * peer's, not something an import leaks. */
  CHECK_EQ(ipcref_peer_pid(A.l.cp), (int)getpid());
  CHECK_EQ(ipcref_view_new_shared(A.l.prod, IPCREF_F32, 1, shape, &A.v),
           IPCREF_OK);
  fill(&A.v, 5);
  memset(&orig, 0, sizeof orig);
  CHECK_EQ(ipcref_export(A.l.pp, &A.v, &orig), IPCREF_OK);
  /* Keep our own copy of the fds; the lease goes to the consumer. */
  A.tmpl = orig;
  A.tmpl.origin_ctx = A.tmpl.origin_peer = 0;
  {
    int i;
    for (i = 0; i < orig.nfds; i++)
      A.tmpl.fds[i] = fcntl(orig.fds[i], F_DUPFD_CLOEXEC, 0);
  }
  ipcref_msg_sent(&orig);
  CHECK(wparse(&A.tmpl, &A.w));
  {
    ipcref_msg again;
    memset(&again, 0, sizeof again);
    wencode(&A.w, &again);
    CHECK(again.len == A.tmpl.len &&
          memcmp(again.bytes, A.tmpl.bytes, again.len) == 0);
  }
  CHECK_EQ(A.w.nviews, 1);
  CHECK_EQ(A.w.nfds, 2);
  A.seg_i = wfd_of(&A.w, 1);
  A.led_i = wfd_of(&A.w, 2);
  CHECK(A.seg_i >= 0 && A.led_i >= 0);
  if (A.seg_i < 0 || A.led_i < 0) return;
  A.seg_size = (size_t)A.w.fd[A.seg_i].size;
  A.led_size = (size_t)A.w.fd[A.led_i].size;
  lm = mmap(NULL, A.led_size, PROT_READ, MAP_SHARED, A.tmpl.fds[A.led_i], 0);
  CHECK(lm != MAP_FAILED);
  A.ledger_copy = (unsigned char *)malloc(A.led_size);
  if (lm != MAP_FAILED && A.ledger_copy) {
    memcpy(A.ledger_copy, lm, A.led_size);
    A.nslots = ((const ipcref__ledger_hdr *)lm)->nslots;
    munmap(lm, A.led_size);
  }
  CHECK(A.nslots >= 8);
}

static void a_teardown(void) {
  ipcref_set_error_hook(NULL);
  msg_close_fds(&A.tmpl);
  free(A.ledger_copy);
  ipcref_view_release(&A.v);
  local_pair_close(&A.l);
}

/* The fds a malicious producer can send in place of a sealed memfd. */
static void a_fd_cases(void) {
  const int sealed = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  size_t S = A.seg_size;
  /* The segment. */
  EVIL_SEG("unsealed memfd (no sealing allowed)", fake_memfd(S, -1, NULL, 0),
           (void)0);
  EVIL_SEG("memfd that allows sealing, no seals", fake_memfd(S, 0, NULL, 0),
           (void)0);
  EVIL_SEG("memfd sealed against shrinking only",
           fake_memfd(S, F_SEAL_SHRINK, NULL, 0), (void)0);
  EVIL_SEG("memfd sealed against growing only",
           fake_memfd(S, F_SEAL_GROW, NULL, 0), (void)0);
  EVIL_SEG("sealed memfd smaller than claimed",
           fake_memfd(4096, sealed, NULL, 0), (void)0);
  EVIL_SEG("sealed memfd larger than claimed",
           fake_memfd(S + 4096, sealed, NULL, 0), (void)0);
  EVIL_SEG("sealed memfd, empty", fake_memfd(0, sealed, NULL, 0), (void)0);
  EVIL_SEG("regular file (unlinked tmpfile)", fake_regular(S), (void)0);
  EVIL_SEG("socket", fake_socket(), (void)0);
  EVIL_SEG("pipe", fake_pipe(), (void)0);
  EVIL_SEG("/dev/null", open("/dev/null", O_RDONLY | O_CLOEXEC), (void)0);
  EVIL_SEG("/dev/zero", open("/dev/zero", O_RDONLY | O_CLOEXEC), (void)0);
  EVIL_SEG("a directory", open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC),
           (void)0);
  EVIL_SEG("the ledger's fd for the segment",
           fcntl(A.tmpl.fds[A.led_i], F_DUPFD_CLOEXEC, 0), (void)0);
  EVIL_SEG("the segment as an O_PATH fd", reopen(A.tmpl.fds[A.seg_i], O_PATH),
           (void)0);
  EVIL_SEG("the segment opened write-only",
           reopen(A.tmpl.fds[A.seg_i], O_WRONLY), (void)0);
  EVIL_SEG("read-only fd announced writable",
           fcntl(A.tmpl.fds[A.seg_i], F_DUPFD_CLOEXEC, 0),
           (w.fd[A.seg_i].writable = 1, w.v[0].writable = 1));
  EVIL_SEG("read-only segment reopened read-write, announced writable",
           reopen(A.tmpl.fds[A.seg_i], O_RDWR),
           (w.fd[A.seg_i].writable = 1, w.v[0].writable = 1));
  EVIL_SEG("sealed memfd of 4 KiB, claims shrunk to match",
           fake_memfd(4096, sealed, NULL, 0),
           (w.fd[A.seg_i].size = 4096, w.v[0].seg_size = 4096));
  /* Both fds swapped. */
  {
    evil_mark m;
    ipcref_msg msg;
    evil_begin(&m);
    evil_msg(&A.w, fcntl(A.tmpl.fds[A.led_i], F_DUPFD_CLOEXEC, 0),
             fcntl(A.tmpl.fds[A.seg_i], F_DUPFD_CLOEXEC, 0), &msg);
    EVIL(&m, &msg, "segment and ledger fds swapped");
  }
  /* The ledger. */
  EVIL_LEDGER("ledger: unsealed copy",
              fake_memfd(A.led_size, 0, A.ledger_copy, A.led_size));
  EVIL_LEDGER("ledger: sealed, all zeros",
              fake_memfd(A.led_size, sealed, NULL, 0));
  EVIL_LEDGER("ledger: read-only fd", reopen(A.tmpl.fds[A.led_i], O_RDONLY));
  EVIL_LEDGER("ledger: sealed against writes",
              fake_memfd(A.led_size, sealed | F_SEAL_FUTURE_WRITE,
                         A.ledger_copy, A.led_size));
  EVIL_LEDGER("ledger: regular file", fake_regular(A.led_size));
  EVIL_LEDGER("ledger: pipe", fake_pipe());
  EVIL_LEDGER("ledger: socket", fake_socket());
  EVIL_LEDGER("ledger header lies: magic",
              lying_ledger(offsetof(ipcref__ledger_hdr, magic), 4, 0x12345678));
  EVIL_LEDGER("ledger header lies: version",
              lying_ledger(offsetof(ipcref__ledger_hdr, version), 4, 99));
  EVIL_LEDGER("ledger header lies: twice the slots",
              lying_ledger(offsetof(ipcref__ledger_hdr, nslots), 4,
                           (uint64_t)A.nslots * 2));
  EVIL_LEDGER("ledger header lies: half the slots",
              lying_ledger(offsetof(ipcref__ledger_hdr, nslots), 4,
                           (uint64_t)A.nslots / 2));
  EVIL_LEDGER("ledger header lies: an odd slot count",
              lying_ledger(offsetof(ipcref__ledger_hdr, nslots), 4,
                           (uint64_t)A.nslots - 1));
  EVIL_LEDGER(
      "ledger header lies: 2^31 slots",
      lying_ledger(offsetof(ipcref__ledger_hdr, nslots), 4, (uint64_t)1 << 31));
  EVIL_LEDGER("ledger header lies: origin nonce",
              lying_ledger(offsetof(ipcref__ledger_hdr, origin_nonce), 8,
                           A.w.v[0].nonce ^ 1));
  EVIL_LEDGER("ledger header lies: ledger id",
              lying_ledger(offsetof(ipcref__ledger_hdr, ledger_id), 8,
                           A.w.v[0].ledger_id + 1));
}

/* Records that lie about sizes, offsets, geometry, slots and generations,
 * sent with the genuine fds. */
static void a_byte_cases(void) {
  const uint64_t S = A.seg_size, B = A.w.v[0].block_size;
  const uint32_t slot = A.w.v[0].slot, gen = A.w.v[0].gen;
  uint32_t other_slot = slot + 1 < A.nslots / 2 ? slot + 1 : 0;
  /* Offsets past the end of the segment. */
  EVIL_BYTES("block runs past the segment", w.v[0].block_offset = S - B / 2);
  EVIL_BYTES("block starts at the segment's end", w.v[0].block_offset = S);
  EVIL_BYTES("block offset wraps around",
             w.v[0].block_offset = UINT64_MAX - B / 2);
  EVIL_BYTES("block larger than the segment", w.v[0].block_size = S + 4096);
  EVIL_BYTES("block size wraps around", w.v[0].block_size = UINT64_MAX);
  EVIL_BYTES("block size 0", w.v[0].block_size = 0);
  EVIL_BYTES("segment size claimed larger",
             (w.v[0].seg_size = S + 4096, w.fd[A.seg_i].size = S + 4096));
  EVIL_BYTES("segment size disagrees with its fd record",
             w.v[0].seg_size = S + 4096);
  /* Views that reach past the block. */
  EVIL_BYTES("byte offset past the block", w.v[0].byte_offset = (int64_t)B);
  EVIL_BYTES("byte offset one element in", w.v[0].byte_offset = 4);
  EVIL_BYTES("byte offset negative", w.v[0].byte_offset = -4);
  EVIL_BYTES("byte offset huge", w.v[0].byte_offset = INT64_MAX);
  EVIL_BYTES("byte offset not aligned", w.v[0].byte_offset = 2);
  EVIL_BYTES("stride 2 over the whole block", w.v[0].strides[0] = 2);
  EVIL_BYTES("stride -1 from element 0", w.v[0].strides[0] = -1);
  EVIL_BYTES("stride that overflows",
             (w.v[0].shape[0] = 2, w.v[0].strides[0] = INT64_MAX / 2));
  EVIL_BYTES("one element too many", w.v[0].shape[0] = 4097);
  EVIL_BYTES("negative shape", w.v[0].shape[0] = -1);
  EVIL_BYTES("f64 over an f32-sized block", w.v[0].dtype = IPCREF_F64);
  EVIL_BYTES("unknown dtype", w.v[0].dtype = 200);
  EVIL_BYTES("too many dims", w.v[0].ndim = 200);
  EVIL_BYTES("2-d shape whose product overflows",
             (w.v[0].ndim = 2, w.v[0].shape[0] = INT64_MAX / 2,
              w.v[0].shape[1] = 4, w.v[0].strides[0] = 0,
              w.v[0].strides[1] = 0));
  EVIL_BYTES("writable view of a read-only segment", w.v[0].writable = 1);
  /* Slots, generations, ids. */
  EVIL_BYTES("slot past the counter file", w.v[0].slot = A.nslots);
  EVIL_BYTES("slot far past the counter file", w.v[0].slot = UINT32_MAX);
  EVIL_BYTES("a slot that was never given", w.v[0].slot = other_slot);
  EVIL_BYTES("a forwarding slot never claimed", w.v[0].slot = A.nslots / 2 + 1);
  EVIL_BYTES("next generation", w.v[0].gen = gen + 1);
  EVIL_BYTES("previous generation", w.v[0].gen = gen - 1);
  EVIL_BYTES("generation 0", w.v[0].gen = 0);
  EVIL_BYTES("segment id of nothing sent", w.v[0].seg_id += 1000);
  EVIL_BYTES("ledger id of nothing sent", w.v[0].ledger_id += 1000);
  EVIL_BYTES("view names another origin", w.v[0].nonce ^= 1);
  EVIL_BYTES("fd records name another origin",
             (w.fd[0].nonce ^= 1, w.fd[1].nonce ^= 1));
  EVIL_BYTES("unknown fd kind", w.fd[A.seg_i].kind = 3);
  EVIL_BYTES("two ledgers, no segment", w.fd[A.seg_i].kind = 2);
  /* Counts. */
  EVIL_BYTES("the same lease twice in one batch",
             (w.nviews = 2, w.v[1] = w.v[0]));
  EVIL_BYTES("no views", w.nviews = 0);
  EVIL_BYTES("more views than a batch holds",
             (w.nviews = IPCREF_MSG_MAX_VIEWS + 1));
  EVIL_BYTES("more retired ids than allowed", w.nret = 65);
  EVIL_BYTES("wrong magic", w.magic ^= 0x01000000u);
  EVIL_BYTES("wrong version", w.version = 1);
  CHECK(strstr(err_last, "message refused: its header") != NULL);
  EVIL_BYTES("metadata over IPCREF_META_MAX", w.meta_len = IPCREF_META_MAX + 1);
  {
    evil_mark m;
    ipcref_msg msg;
    evil_begin(&m);
    evil_msg(&A.w, -1, -1, &msg);
    msg.fds[msg.nfds++] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    EVIL(&m, &msg, "an fd more than the records say");
    evil_begin(&m);
    evil_msg(&A.w, -1, -1, &msg);
    close(msg.fds[--msg.nfds]);
    EVIL(&m, &msg, "an fd fewer than the records say");
  }
  /* The ledger's bell (the fd after it) must be a datagram socket: a
   * return writes to it, and must never block or write into a file. */
  {
    static const char *what[3] = {"a bell that is a file",
                                  "a bell that is a pipe",
                                  "a bell that is a stream socket"};
    int k;
    for (k = 0; k < 3; k++) {
      evil_mark m;
      ipcref_msg msg;
      int sv[2] = {-1, -1};
      evil_begin(&m);
      evil_msg(&A.w, -1, -1, &msg);
      close(msg.fds[A.led_i + 1]);
      if (k == 0) sv[0] = open("/dev/null", O_WRONLY | O_CLOEXEC);
      if (k == 1 && pipe2(sv, O_CLOEXEC) == 0) close(sv[0]), sv[0] = sv[1];
      if (k == 2 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0)
        close(sv[1]);
      CHECK(sv[0] >= 0);
      msg.fds[A.led_i + 1] = sv[0];
      EVIL(&m, &msg, what[k]);
      CHECK(strstr(err_last, "bell that is not a datagram socket") != NULL);
    }
  }
  /* Every truncation of the record, and trailing bytes. */
  {
    size_t len;
    for (len = 1; len < A.tmpl.len; len++) {
      evil_mark m;
      ipcref_msg msg;
      char what[64];
      evil_begin(&m);
      evil_msg(&A.w, -1, -1, &msg);
      msg.len = len;
      snprintf(what, sizeof what, "truncated to %zu bytes", len);
      EVIL(&m, &msg, what);
    }
  }
  {
    evil_mark m;
    ipcref_msg msg;
    evil_begin(&m);
    evil_msg(&A.w, -1, -1, &msg);
    memset(msg.bytes + msg.len, 0, 8);
    msg.len += 8;
    EVIL(&m, &msg, "trailing bytes");
  }
}

/* A malicious producer: every broken message is refused (EPROTO) with
 * nothing mapped, no fd left open, stats.refused counting each; the
 * producer's lease is untouched; then the genuine message is imported,
 * a replay of it is refused (held, then released), and hand-offs on the
 * same peer still work. No file of ours is left in /tmp. */
static void test_malicious_producer(void) {
  res_mark start;
  ipcref_view got, again;
  ipcref_msg msg;
  ipcref_stats s;
  res_begin(&start);
  a_setup();
  if (A.seg_i < 0 || A.led_i < 0 || !A.ledger_copy) {
    a_teardown();
    return;
  }
  CHECK_EQ(stats_of(A.l.cons).mapped_segments, 0);
  a_fd_cases();
  a_byte_cases();
  s = stats_of(A.l.cons);
  CHECK_EQ(s.refused, (uint64_t)A.refusals);
  CHECK_EQ(s.mapped_segments, 0);
  CHECK_EQ(s.counter_files, 0);
  printf("  %d malicious messages refused\n", A.refusals);
  /* Nothing changed for the producer: the lease is still out. */
  s = stats_of(A.l.prod);
  CHECK_EQ(s.live_slots, 1);
  /* The genuine message still imports, with the right data. */
  memset(&got, 0, sizeof got);
  memset(&again, 0, sizeof again);
  memset(&msg, 0, sizeof msg);
  evil_msg(&A.w, -1, -1, &msg);
  CHECK_EQ(ipcref_import(A.l.cp, &msg, &got), IPCREF_OK);
  CHECK_EQ(bad_bytes(&got, 5), 0);
  s = stats_of(A.l.cons);
  CHECK_EQ(s.mapped_segments, 1);
  CHECK_EQ(s.counter_files, 1);
  /* A replay while it is held, and after its release. */
  {
    evil_mark m;
    evil_begin(&m);
    evil_msg(&A.w, -1, -1, &msg);
    EVIL(&m, &msg, "replay of an imported message (held)");
    ipcref_view_release(&got);
    CHECK_EQ(stats_of(A.l.prod).live_slots, 0);
    evil_begin(&m);
    evil_msg(&A.w, -1, -1, &msg);
    EVIL(&m, &msg, "replay of an imported message (released)");
  }
  /* The same peer goes on working: a send/recv and an export/import. */
  CHECK_EQ(ipcref_send(A.l.pp, &A.v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(A.l.cp, &got, WAIT_MS), IPCREF_OK);
  CHECK_EQ(bad_bytes(&got, 5), 0);
  memset(&msg, 0, sizeof msg);
  CHECK_EQ(ipcref_export(A.l.pp, &A.v, &msg), IPCREF_OK);
  msg.origin_ctx = msg.origin_peer = 0; /* delivered by hand, in-process */
  CHECK_EQ(ipcref_import(A.l.cp, &msg, &again), IPCREF_OK);
  CHECK_EQ(bad_bytes(&again, 5), 0);
  CHECK_EQ(stats_of(A.l.prod).live_slots, 2);
  ipcref_view_release(&got);
  ipcref_view_release(&again);
  s = stats_of(A.l.prod);
  CHECK_EQ(s.live_slots, 0);
  CHECK_EQ(s.bad_returns, 0);
  a_teardown();
  RES_END(&start);
  /* No residue: the regular files were unlinked at once. */
  {
    DIR *d = opendir("/tmp");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
      if (strncmp(e->d_name, "ipcref-hostile-", 15) == 0) {
        printf("    residue: /tmp/%s\n", e->d_name);
        CHECK(!"a file left in /tmp");
      }
    if (d) closedir(d);
  }
}

/* Slots published ahead (share_ledger): after a send, IPCREF__AHEAD free
 * slots of the peer's ledger are live at their next generation, held by
 * the peer, with no lease behind them, and no stat counts them. A
 * consumer that returns one it was never given is refused as any forger
 * (counted, nothing freed, the slot still published), and the hand-off
 * that then takes that slot goes through. A producer that names one in a
 * record lies in a way its consumer cannot see: the view imports (the
 * block is the producer's own, mapped as any other) and its return is
 * refused as one of a lease never taken; the lie costs the producer
 * alone. */
static void test_published_slots(void) {
  res_mark start;
  ipcref__ledger *L;
  uint64_t *slots, e;
  ipcref_view got;
  ipcref_msg msg;
  ipcref_stats s;
  uint32_t k, sl, gen;
  int i;
  res_begin(&start);
  a_setup();
  L = A.l.pp ? A.l.pp->ledger : NULL;
  CHECK(L != NULL);
  if (A.seg_i < 0 || A.led_i < 0 || !L) {
    a_teardown();
    return;
  }
  /* The template's genuine message first: the consumer maps what the
   * sends below name. Then a hand-off by ipcref_send, after which the
   * ledger publishes ahead. */
  memset(&got, 0, sizeof got);
  evil_msg(&A.w, -1, -1, &msg);
  CHECK_EQ(ipcref_import(A.l.cp, &msg, &got), IPCREF_OK);
  ipcref_view_release(&got);
  CHECK_EQ(ipcref_send(A.l.pp, &A.v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(A.l.cp, &got, WAIT_MS), IPCREF_OK);
  ipcref_view_release(&got);
  (void)ipcref_collect(A.l.prod);
  slots = ipcref__ledger_slots(L->base);
  CHECK_EQ(L->nahead, IPCREF__AHEAD);
  for (k = 0; k < L->nahead; k++) {
    sl = L->ahead[(L->ahead_at + k) % IPCREF__AHEAD];
    CHECK(sl < L->n / 2 && L->leases[sl].block == NULL);
    CHECK_EQ(slots[2 * (size_t)sl] & 3u, IPCREF__SLOT_LIVE);
    CHECK_EQ(slots[2 * (size_t)sl + 1], (uint64_t)(uint32_t)getpid());
  }
  s = stats_of(A.l.prod);
  CHECK_EQ(s.live_slots, 0);
  /* A consumer returns the next published slot, never given to it. */
  sl = L->ahead[L->ahead_at];
  gen = (uint32_t)(slots[2 * (size_t)sl] >> 2);
  e = ipcref__ring_entry(IPCREF__RING_RELEASE, sl, gen);
  ipcref__ring_push(L->base, L->n, -1, &e, 1, NULL);
  (void)ipcref_collect(A.l.prod);
  s = stats_of(A.l.prod);
  CHECK_EQ(s.bad_returns, 1);
  CHECK_EQ(s.live_slots, 0);
  CHECK_EQ(slots[2 * (size_t)sl], ((uint64_t)gen << 2) | IPCREF__SLOT_LIVE);
  CHECK_EQ(L->ahead[L->ahead_at], sl);
  /* The next hand-offs take the published slots, that one first. */
  for (i = 0; i < 2 * IPCREF__AHEAD; i++) {
    memset(&got, 0, sizeof got);
    CHECK_EQ(ipcref_send(A.l.pp, &A.v), IPCREF_OK);
    if (i == 0) CHECK(L->leases[sl].block != NULL && L->leases[sl].gen == gen);
    CHECK_EQ(ipcref_recv(A.l.cp, &got, WAIT_MS), IPCREF_OK);
    CHECK_EQ(bad_bytes(&got, 5), 0);
    ipcref_view_release(&got);
  }
  (void)ipcref_collect(A.l.prod);
  s = stats_of(A.l.prod);
  CHECK_EQ(s.live_slots, 0);
  CHECK_EQ(s.bad_returns, 1);
  /* A producer's record naming the youngest published slot. */
  sl = L->ahead[(L->ahead_at + L->nahead - 1) % IPCREF__AHEAD];
  gen = (uint32_t)(slots[2 * (size_t)sl] >> 2);
  {
    wmsg w = A.w;
    w.v[0].slot = sl;
    w.v[0].gen = gen;
    evil_msg(&w, -1, -1, &msg);
  }
  memset(&got, 0, sizeof got);
  CHECK_EQ(ipcref_import(A.l.cp, &msg, &got), IPCREF_OK);
  CHECK_EQ(bad_bytes(&got, 5), 0);
  ipcref_view_release(&got);
  (void)ipcref_collect(A.l.prod);
  s = stats_of(A.l.prod);
  CHECK_EQ(s.bad_returns, 2); /* its return: a lease never taken */
  CHECK_EQ(s.live_slots, 0);
  a_teardown();
  RES_END(&start);
}

/* A message with as many fds as any may carry (IPCREF_MSG_MAX_FDS) comes
 * whole on a SOCK_SEQPACKET socket, its sender's credentials beside them
 * (SO_PASSCRED), and is judged by its bytes (garbage here): refused for
 * its header, not cut (MSG_CTRUNC) for want of room, every fd closed. */
static void test_most_fds(void) {
  res_mark m;
  local_pair l;
  ipcref_view got;
  ipcref_msg *junk = (ipcref_msg *)calloc(1, sizeof *junk);
  int pv[2], i;
  res_begin(&m);
  local_pair_open(&l, NULL, NULL);
  CHECK_EQ(pipe2(pv, O_CLOEXEC), 0);
  junk->len = 64;
  memset(junk->bytes, 0xab, junk->len);
  junk->nfds = IPCREF_MSG_MAX_FDS;
  for (i = 0; i < IPCREF_MSG_MAX_FDS; i++) junk->fds[i] = pv[0];
  CHECK_EQ(xfer_send(l.pp->fd, junk), 0);
  close(pv[0]);
  close(pv[1]);
  ipcref_set_error_hook(&error_hook);
  errors_reset();
  memset(&got, 0, sizeof got);
  CHECK_EQ(ipcref_recv(l.cp, &got, WAIT_MS), IPCREF_EPROTO);
  CHECK(got.buf == NULL);
  if (!strstr(err_last, "header")) printf("    refused: %s\n", err_last);
  CHECK(strstr(err_last, "header") != NULL);
  ipcref_set_error_hook(NULL);
  local_pair_close(&l);
  free(junk);
  RES_END(&m);
}

/* ============================================================ b. shrinking */

typedef struct b_arg {
  int peer_ro, peer_rw, xs, ctl;
} b_arg;

/* What a consumer tries on the fds it received. Read-only share: nothing
 * at all; writable share: no shrink, no grow, no new seals. */
static void b_attack_ro(int fd) {
  struct stat st;
  size_t S;
  int fd2, seals;
  void *q;
  CHECK_EQ(fstat(fd, &st), 0);
  S = (size_t)st.st_size;
  CHECK(S >= 4096);
  seals = fcntl(fd, F_GET_SEALS);
  CHECK(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW) &&
        (seals & F_SEAL_SEAL) && (seals & F_SEAL_FUTURE_WRITE));
  CHECK_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  /* Through the fd as received (read-only). */
  CHECK(ftruncate(fd, (off_t)S / 2) == -1);
  CHECK(write(fd, "x", 1) == -1);
  q = mmap(NULL, S, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(q == MAP_FAILED);
  if (q != MAP_FAILED) munmap(q, S);
  q = mmap(NULL, S, PROT_READ, MAP_SHARED, fd, 0);
  CHECK(q != MAP_FAILED);
  if (q != MAP_FAILED) {
    CHECK_ERRNO(mprotect(q, 4096, PROT_READ | PROT_WRITE), EACCES);
    munmap(q, S);
  }
  /* Reopened read-write (a hostile consumer can): the seals hold. */
  fd2 = reopen(fd, O_RDWR);
  CHECK(fd2 >= 0);
  if (fd2 < 0) return;
  CHECK_ERRNO(ftruncate(fd2, (off_t)S / 2), EPERM);
  CHECK_ERRNO(ftruncate(fd2, 0), EPERM);
  CHECK_ERRNO(ftruncate(fd2, (off_t)S + 4096), EPERM);
  CHECK_ERRNO(fallocate(fd2, 0, 0, (off_t)S + 4096), EPERM);
  CHECK_ERRNO(
      fallocate(fd2, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)S),
      EPERM);
  CHECK_ERRNO(write(fd2, "x", 1), EPERM);
  CHECK_ERRNO(pwrite(fd2, "x", 1, 0), EPERM);
  CHECK_ERRNO(fcntl(fd2, F_ADD_SEALS, F_SEAL_WRITE), EPERM);
  q = mmap(NULL, S, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
  CHECK(q == MAP_FAILED && errno == EPERM);
  if (q != MAP_FAILED) munmap(q, S);
  CHECK_EQ(fstat(fd2, &st), 0);
  CHECK_EQ(st.st_size, (off_t)S);
  close(fd2);
}

static void b_attack_sizes(int fd, int need_rdwr) {
  struct stat st;
  size_t S;
  int fd2;
  CHECK_EQ(fstat(fd, &st), 0);
  S = (size_t)st.st_size;
  if (need_rdwr) CHECK_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);
  fd2 = reopen(fd, O_RDWR);
  CHECK(fd2 >= 0);
  if (fd2 < 0) return;
  CHECK_ERRNO(ftruncate(fd2, (off_t)S / 2), EPERM);
  CHECK_ERRNO(ftruncate(fd2, 0), EPERM);
  CHECK_ERRNO(ftruncate(fd2, (off_t)S + 4096), EPERM);
  CHECK_ERRNO(fallocate(fd2, 0, 0, (off_t)S + 4096), EPERM);
  CHECK_ERRNO(fcntl(fd2, F_ADD_SEALS, F_SEAL_WRITE), EPERM);
  CHECK_EQ(fstat(fd2, &st), 0);
  CHECK_EQ(st.st_size, (off_t)S);
  close(fd2);
}

static int b_child(void *argp) {
  b_arg *a = (b_arg *)argp;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pro = NULL, *prw = NULL;
  ipcref_msg mro, mrw;
  ipcref_view vro, vrw;
  wmsg w;
  int i;
  memset(&vro, 0, sizeof vro);
  memset(&vrw, 0, sizeof vrw);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new(ctx, a->peer_ro, &pro), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new(ctx, a->peer_rw, &prw), IPCREF_OK);
  CHECK_EQ(xfer_recv(a->xs, &mro, WAIT_MS), 0);
  CHECK_EQ(xfer_recv(a->xs, &mrw, WAIT_MS), 0);
  CHECK(wparse(&mro, &w) && w.nfds == 2);
  for (i = 0; i < (int)w.nfds && i < mro.nfds; i++) {
    if (w.fd[i].kind == 1) b_attack_ro(mro.fds[i]);
    if (w.fd[i].kind == 2) b_attack_sizes(mro.fds[i], 1);
  }
  CHECK(wparse(&mrw, &w) && w.nfds == 2);
  for (i = 0; i < (int)w.nfds && i < mrw.nfds; i++)
    b_attack_sizes(mrw.fds[i], 1);
  /* The data survived, and the messages still import. */
  CHECK_EQ(ipcref_import(pro, &mro, &vro), IPCREF_OK);
  CHECK_EQ(ipcref_import(prw, &mrw, &vrw), IPCREF_OK);
  CHECK_EQ(bad_bytes(&vro, 21), 0);
  CHECK_EQ(bad_bytes(&vrw, 22), 0);
  ipcref_view_release(&vro);
  ipcref_view_release(&vrw);
  ctl_put(a->ctl, 'd');
  ipcref_peer_free(pro);
  ipcref_peer_free(prw);
  ipcref_ctx_free(ctx);
  return 0;
}

/* A consumer cannot shrink or grow a segment it received (ftruncate and
 * fallocate: EPERM, even through a read-write reopen), cannot add seals,
 * and for a read-only share (the default) cannot write it by write(),
 * pwrite(), a shared writable mmap, mprotect or a hole punch. The
 * producer's data stays intact and its mapping can never SIGBUS. */
static void test_shrink_attempts(void) {
  res_mark m;
  kid k;
  b_arg a;
  ipcref_ctx *P = NULL, *W = NULL;
  ipcref_peer *pro = NULL, *prw = NULL;
  ipcref_ctx_options opt;
  ipcref_view vro, vrw;
  ipcref_msg msg;
  res_begin(&m);
  memset(&vro, 0, sizeof vro);
  memset(&vrw, 0, sizeof vrw);
  kid_open(&k, 3, SOCK_SEQPACKET); /* read-only peer, writable, own */
  a.peer_ro = k.their_sock[0];
  a.peer_rw = k.their_sock[1];
  a.xs = k.their_sock[2];
  a.ctl = k.their_ctl;
  kid_fork(&k, b_child, &a, -1);
  memset(&opt, 0, sizeof opt);
  opt.writable_shares = 1;
  P = make_ctx(NULL);
  W = make_ctx(&opt);
  pro = kid_peer(&k, 0, P);
  prw = kid_peer(&k, 1, W);
  CHECK_EQ(u8_view(P, 100000, 21, &vro), IPCREF_OK);
  CHECK_EQ(u8_view(W, 100000, 22, &vrw), IPCREF_OK);
  memset(&msg, 0, sizeof msg);
  CHECK_EQ(ipcref_export(pro, &vro, &msg), IPCREF_OK);
  CHECK_EQ(xfer_send(k.sock[2], &msg), 0);
  ipcref_msg_sent(&msg);
  CHECK_EQ(ipcref_export(prw, &vrw, &msg), IPCREF_OK);
  CHECK_EQ(xfer_send(k.sock[2], &msg), 0);
  ipcref_msg_sent(&msg);
  CTL_EXPECT(k.ctl, 'd');
  KID_EXIT0(&k, "consumer");
  /* Our data is intact and every byte of it is still there to read. */
  CHECK_EQ(bad_bytes(&vro, 21), 0);
  CHECK_EQ(bad_bytes(&vrw, 22), 0);
  ipcref_view_release(&vro);
  ipcref_view_release(&vrw);
  CHECK_EQ(stats_of(P).live_slots, 0);
  CHECK_EQ(stats_of(W).live_slots, 0);
  ipcref_peer_free(pro);
  ipcref_peer_free(prw);
  ipcref_ctx_free(P);
  ipcref_ctx_free(W);
  kid_close(&k);
  RES_END(&m);
}

/* ============================================================ c. isolation */

static const char secret[] = "IPCREF-HOSTILE-SECRET-NEIGHBOUR";

typedef struct c_arg {
  int peer_pool, peer_iso, ctl;
  size_t pool_segment;
} c_arg;

/* The mapping that holds `addr`: its range and inode (0 when none). */
static unsigned long mapping_of(const void *addr, unsigned long *start,
                                unsigned long *end) {
  char line[512];
  unsigned long s, e, off, ino, want = (unsigned long)(uintptr_t)addr;
  unsigned long found = 0;
  unsigned maj, mnr;
  char perms[8];
  FILE *f = fopen("/proc/self/maps", "r");
  *start = *end = 0;
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

/* The size of the open memfd with inode `ino` (-1 when none is open). */
static long memfd_size(unsigned long ino) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  long size = -1;
  while (d && (e = readdir(d)) != NULL) {
    struct stat st;
    int fd = atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == dirfd(d)) continue;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        (unsigned long)st.st_ino == ino) {
      size = (long)st.st_size;
      break;
    }
  }
  if (d) closedir(d);
  return size;
}

/* Checks what a consumer of `v` can reach: the whole mapping that holds it
 * is `want` bytes, so is the segment fd it received, and `secret` is (or
 * is not) readable in it. */
static void c_reach(const ipcref_view *v, size_t want, int secret_visible,
                    const char *what) {
  unsigned long start, end, ino;
  long fd_size;
  int seen;
  ino = mapping_of(view_data(v), &start, &end);
  CHECK(ino != 0);
  if (!ino) return;
  fd_size = memfd_size(ino);
  seen = memmem((const void *)(uintptr_t)start, end - start, secret,
                sizeof secret) != NULL;
  if (end - start != want || fd_size != (long)want || seen != secret_visible) {
    harness_failures_in_test++;
    printf("    %s: mapping %lu bytes, fd %ld bytes (want %zu); neighbour's "
           "secret %s\n",
           what, end - start, fd_size, want, seen ? "readable" : "not seen");
  }
}

static int c_child(void *argp) {
  c_arg *a = (c_arg *)argp;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pp = NULL, *pi = NULL;
  ipcref_view pooled, iso1, iso2, iso3;
  long page = sysconf(_SC_PAGESIZE);
  memset(&pooled, 0, sizeof pooled);
  memset(&iso1, 0, sizeof iso1);
  memset(&iso2, 0, sizeof iso2);
  memset(&iso3, 0, sizeof iso3);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new(ctx, a->peer_pool, &pp), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new(ctx, a->peer_iso, &pi), IPCREF_OK);
  CHECK_EQ(ipcref_recv(pp, &pooled, WAIT_MS), IPCREF_OK);
  CHECK_EQ(ipcref_recv(pp, &iso1, WAIT_MS), IPCREF_OK);
  CHECK_EQ(ipcref_recv(pp, &iso2, WAIT_MS), IPCREF_OK);
  CHECK_EQ(ipcref_recv(pi, &iso3, WAIT_MS), IPCREF_OK);
  if (pooled.buf && iso1.buf && iso2.buf && iso3.buf) {
    CHECK_EQ(bad_bytes(&pooled, 31), 0);
    CHECK_EQ(bad_bytes(&iso1, 32), 0);
    CHECK_EQ(bad_bytes(&iso2, 33), 0);
    CHECK_EQ(bad_bytes(&iso3, 34), 0);
    /* The trade-off: a pooled block travels in its whole segment, so its
     * consumer can read every other block in it (never write them). */
    c_reach(&pooled, a->pool_segment, 1, "pooled block");
    /* Isolated: a segment of the block's size, rounded up to pages. */
    c_reach(&iso1, (size_t)page, 0, "isolated 1000-byte block");
    c_reach(&iso2, 2 * (size_t)page, 0, "isolated 5000-byte block");
    c_reach(&iso3, (size_t)page, 0, "block of an isolate=1 context");
  }
  ipcref_view_release(&pooled);
  ipcref_view_release(&iso1);
  ipcref_view_release(&iso2);
  ipcref_view_release(&iso3);
  ctl_put(a->ctl, 'd');
  ipcref_peer_free(pp);
  ipcref_peer_free(pi);
  ipcref_ctx_free(ctx);
  return 0;
}

/* Isolation: blocks from ipcref_shared_new_isolated, and every block of a
 * context with options.isolate = 1, reach the consumer in a segment of
 * their own whose size is the block's rounded up to pages (the received
 * fd and the consumer's mapping): a neighbour's bytes are out of reach. A
 * pooled block's consumer maps the whole segment and can read a
 * neighbour's secret: that is the price of pooling (one fd and one mmap
 * per segment instead of per block, and no page rounding). */
static void test_isolation(void) {
  res_mark m;
  kid k;
  c_arg a;
  ipcref_ctx *P = NULL, *I = NULL;
  ipcref_peer *pp = NULL, *pi = NULL;
  ipcref_ctx_options opt;
  ipcref_view sec, pooled, iso1, iso2, sec2, iso3;
  const size_t segment = (size_t)1 << 20;
  size_t before;
  res_begin(&m);
  memset(&sec, 0, sizeof sec);
  memset(&pooled, 0, sizeof pooled);
  memset(&iso1, 0, sizeof iso1);
  memset(&iso2, 0, sizeof iso2);
  memset(&sec2, 0, sizeof sec2);
  memset(&iso3, 0, sizeof iso3);
  kid_open(&k, 2, SOCK_SEQPACKET); /* to the pooled ctx, the isolating */
  a.peer_pool = k.their_sock[0];
  a.peer_iso = k.their_sock[1];
  a.ctl = k.their_ctl;
  a.pool_segment = segment;
  kid_fork(&k, c_child, &a, -1);
  memset(&opt, 0, sizeof opt);
  opt.segment_size = segment;
  P = make_ctx(&opt);
  opt.isolate = 1;
  I = make_ctx(&opt);
  pp = kid_peer(&k, 0, P);
  pi = kid_peer(&k, 1, I);
  /* A secret next to the pooled block (same size class: same segment). */
  CHECK_EQ(u8_view(P, 256, 30, &sec), IPCREF_OK);
  CHECK_EQ(u8_view(P, 256, 31, &pooled), IPCREF_OK);
  if (sec.buf) memcpy(view_data(&sec) + 64, secret, sizeof secret);
  before = stats_of(P).mapped_segments;
  CHECK_EQ(isolated_view(P, 1000, 32, &iso1), IPCREF_OK);
  CHECK_EQ(isolated_view(P, 5000, 33, &iso2), IPCREF_OK);
  CHECK_EQ(stats_of(P).mapped_segments, before + 2); /* one each */
  /* A context that isolates every block: the secret is in a block of its
   * own too. */
  CHECK_EQ(u8_view(I, 100, 35, &sec2), IPCREF_OK);
  if (sec2.buf) memcpy(view_data(&sec2), secret, sizeof secret);
  CHECK_EQ(u8_view(I, 100, 34, &iso3), IPCREF_OK);
  CHECK_EQ(stats_of(I).mapped_segments, 2);
  CHECK_EQ(ipcref_send(pp, &pooled), IPCREF_OK);
  CHECK_EQ(ipcref_send(pp, &iso1), IPCREF_OK);
  CHECK_EQ(ipcref_send(pp, &iso2), IPCREF_OK);
  CHECK_EQ(ipcref_send(pi, &iso3), IPCREF_OK);
  CTL_EXPECT(k.ctl, 'd');
  KID_EXIT0(&k, "consumer");
  ipcref_view_release(&sec);
  ipcref_view_release(&pooled);
  ipcref_view_release(&iso1);
  ipcref_view_release(&iso2);
  ipcref_view_release(&sec2);
  ipcref_view_release(&iso3);
  CHECK_EQ(stats_of(P).live_slots, 0);
  CHECK_EQ(stats_of(I).live_slots, 0);
  CHECK_EQ(stats_of(I).mapped_segments, 0); /* own segments go with them */
  ipcref_peer_free(pp);
  ipcref_peer_free(pi);
  ipcref_ctx_free(P);
  ipcref_ctx_free(I);
  kid_close(&k);
  RES_END(&m);
}

/* ============================================================ d. uids */

typedef struct d_arg {
  int sock, ctl, accepted;
  uint32_t parent_uid;
} d_arg;

static int d_child(void *argp) {
  d_arg *a = (d_arg *)argp;
  ipcref_ctx_options opt;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view got, mine;
  memset(&got, 0, sizeof got);
  memset(&mine, 0, sizeof mine);
  if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0) {
    printf("    child: cannot become uid %u: %s\n", NOBODY, strerror(errno));
    return 1;
  }
  /* Dumpable again, so that /proc/self stays ours. */
  prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
  CHECK_EQ(getuid(), NOBODY);
  memset(&opt, 0, sizeof opt);
  opt.allow_uids = &a->parent_uid; /* the parent made the socketpair */
  opt.allow_uids_count = 1;
  CHECK_EQ(ipcref_ctx_new(&opt, &ctx), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new(ctx, a->sock, &p), IPCREF_OK);
  ctl_put(a->ctl, 'r');
  if (a->accepted && p) {
    CHECK_EQ(ipcref_recv(p, &got, WAIT_MS), IPCREF_OK);
    CHECK_EQ(bad_bytes(&got, 41), 0);
    CHECK_EQ(u8_view(ctx, 3000, 42, &mine), IPCREF_OK);
    CHECK_EQ(ipcref_send(p, &mine), IPCREF_OK);
  }
  CTL_EXPECT(a->ctl, 'q');
  ipcref_view_release(&got);
  ipcref_view_release(&mine);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

static void d_round(int accepted) {
  kid k;
  d_arg a;
  ipcref_ctx_options opt;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v, got;
  ipcref_msg msg;
  ipcref_stats s;
  const uint32_t nobody = NOBODY;
  memset(&v, 0, sizeof v);
  memset(&got, 0, sizeof got);
  kid_open(&k, 1, SOCK_SEQPACKET);
  a.sock = k.their_sock[0];
  a.ctl = k.their_ctl;
  a.accepted = accepted;
  a.parent_uid = (uint32_t)getuid();
  kid_fork(&k, d_child, &a, -1);
  memset(&opt, 0, sizeof opt);
  opt.error_hook = error_hook;
  errors_reset();
  if (accepted) {
    opt.allow_uids = &nobody;
    opt.allow_uids_count = 1;
  }
  ctx = make_ctx(&opt);
  p = kid_peer(&k, 0, ctx);
  CHECK_EQ(u8_view(ctx, 5000, 41, &v), IPCREF_OK);
  CTL_EXPECT(k.ctl, 'r');
  if (!accepted) {
    CHECK_EQ(ipcref_recv(p, &got, WAIT_MS), IPCREF_EPEER);
    CHECK_EQ(ipcref_send(p, &v), IPCREF_EPEER);
    memset(&msg, 0, sizeof msg);
    CHECK_EQ(ipcref_export(p, &v, &msg), IPCREF_EPEER);
    CHECK_EQ(msg.nfds, 0);
    s = stats_of(ctx);
    CHECK(s.refused >= 1);
    CHECK_EQ(err_epeer, 1);       /* the context's hook heard of it, once */
    CHECK_EQ(s.live_slots, 0);    /* nothing leased to it */
    CHECK_EQ(s.counter_files, 0); /* not even a ledger made */
    CHECK_EQ(s.fds_sent, 0);
  } else {
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    CHECK_EQ(ipcref_recv(p, &got, WAIT_MS), IPCREF_OK);
    CHECK_EQ(bad_bytes(&got, 42), 0);
    s = stats_of(ctx);
    CHECK_EQ(s.refused, 0);
    CHECK_EQ(err_count, 0);
    ipcref_view_release(&got);
  }
  ctl_put(k.ctl, 'q');
  KID_EXIT0(&k, accepted ? "allowed child" : "refused child");
  ipcref_view_release(&v);
  CHECK_EQ(stats_of(ctx).live_slots, 0);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  kid_close(&k);
}

/* Who may connect: a child that became uid 65534 (nobody) is refused by a
 * default context (receive, send and export all EPEER, stats.refused
 * counts it, nothing is leased or sent); a context that lists 65534 in
 * allow_uids accepts it and hand-offs work both ways. Needs root to
 * change uids: CI runs as root; elsewhere this test fails (no skip). */
static void test_other_uid(void) {
  res_mark m;
  if (geteuid() != 0) {
    printf("    not root: cannot make a peer of another uid (an unprivileged "
           "user namespace maps one uid only, which the kernel translates "
           "back to ours); run as root\n");
    CHECK(!"test_other_uid needs root");
    return;
  }
  res_begin(&m);
  d_round(0);
  d_round(1);
  RES_END(&m);
}

/* ============================================================ e. ledgers */

typedef struct e_arg {
  int peer, xs, ctl;
} e_arg;

/* The forged entries the hostile consumer writes in phase 1 (each one is
 * one refused entry). */
#define E_FORGED 7

static void e_push(unsigned char *base, uint32_t n, uint64_t e) {
  ipcref__ring_push(base, n, -1, &e, 1, NULL);
}

/* The child: receives one view over its own transport and imports it;
 * the first time a ledger's fd comes with one, keeps a copy in *ledger
 * (what a consumer could always do). Its lease: *slot, *gen. */
static void e_take(const e_arg *a, ipcref_peer *p, ipcref_view *v, int *ledger,
                   uint32_t *slot, uint32_t *gen) {
  ipcref_msg msg;
  wmsg w;
  int k;
  CHECK_EQ(xfer_recv(a->xs, &msg, WAIT_MS), 0);
  CHECK(wparse(&msg, &w) && w.nviews == 1);
  *slot = w.v[0].slot;
  *gen = w.v[0].gen;
  k = wfd_of(&w, 2);
  if (k >= 0 && k < msg.nfds && *ledger < 0)
    *ledger = fcntl(msg.fds[k], F_DUPFD_CLOEXEC, 0); /* ours to keep */
  CHECK_EQ(ipcref_import(p, &msg, v), IPCREF_OK);
}

/* The child: maps the ledger read-write, as any holder of its fd can.
 * NULL (CHECKed) unless it has at least `min` slots and the size they
 * make; else its size in *bytes and its slots in *n. */
static unsigned char *e_map(int ledger, size_t *bytes, uint32_t *n,
                            uint32_t min) {
  unsigned char *base;
  struct stat st;
  *bytes = 0;
  *n = 0;
  CHECK(ledger >= 0 && fstat(ledger, &st) == 0);
  if (ledger < 0 || fstat(ledger, &st) != 0) return NULL;
  base = (unsigned char *)mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
                               MAP_SHARED, ledger, 0);
  CHECK(base != MAP_FAILED);
  if (base == MAP_FAILED) return NULL;
  *n = ((ipcref__ledger_hdr *)(void *)base)->nslots;
  CHECK(*n >= min && ipcref__ledger_bytes(*n) == (size_t)st.st_size);
  if (*n < min || ipcref__ledger_bytes(*n) != (size_t)st.st_size) {
    munmap(base, (size_t)st.st_size);
    *n = 0;
    return NULL;
  }
  *bytes = (size_t)st.st_size;
  return base;
}

/* The child, at its end: the ledger unmapped and closed, the peer and the
 * context freed. */
static void e_end(unsigned char *base, size_t bytes, int ledger, ipcref_peer *p,
                  ipcref_ctx *ctx) {
  if (base) munmap(base, bytes);
  if (ledger >= 0) close(ledger);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* The parent: forks the hostile consumer `fn` (its peer's socket, its own
 * transport, its control socket) and makes the producer, whose error
 * hook counts what it hears, and its peer. */
static void e_start(kid *k, e_arg *a, child_fn fn, ipcref_ctx **P,
                    ipcref_peer **pp) {
  ipcref_ctx_options opt;
  kid_open(k, 2, SOCK_SEQPACKET); /* the peer, the own transport */
  a->peer = k->their_sock[0];
  a->xs = k->their_sock[1];
  a->ctl = k->their_ctl;
  kid_fork(k, fn, a, -1);
  errors_reset();
  memset(&opt, 0, sizeof opt);
  opt.error_hook = error_hook;
  *P = make_ctx(&opt);
  *pp = kid_peer(k, 0, *P);
}

/* The parent: exports `v` to the child and sends it, fds and all, over
 * the child's own transport. */
static void e_hand(kid *k, ipcref_peer *pp, const ipcref_view *v) {
  ipcref_msg msg;
  memset(&msg, 0, sizeof msg);
  CHECK_EQ(ipcref_export(pp, v, &msg), IPCREF_OK);
  CHECK_EQ(xfer_send(k->sock[1], &msg), 0);
  ipcref_msg_sent(&msg);
}

static int e_child(void *argp) {
  e_arg *a = (e_arg *)argp;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v[3];
  uint32_t slot[3] = {0, 0, 0}, gen[3] = {0, 0, 0}, n = 0, never;
  unsigned char *base = NULL;
  size_t bytes = 0;
  int ledger = -1, i;
  memset(v, 0, sizeof v);
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new(ctx, a->peer, &p), IPCREF_OK);
  for (i = 0; i < 3; i++) {
    e_take(a, p, &v[i], &ledger, &slot[i], &gen[i]);
    CHECK_EQ(bad_bytes(&v[i], 50 + (uint32_t)i), 0);
  }
  base = e_map(ledger, &bytes, &n, 8);
  if (!base) {
    ctl_put(a->ctl, 'x');
    goto out;
  }
  ctl_put(a->ctl, 'r');
  CTL_EXPECT(a->ctl, 'g');
  /* Phase 1: one genuine return, then lies. */
  ipcref_view_release(&v[0]);
  never = n / 2 - 1; /* a producer slot it was never given */
  for (i = 0; i < 3; i++) CHECK(slot[i] != never);
  e_push(base, n, ipcref__ring_entry(IPCREF__RING_RELEASE, slot[0], gen[0]));
  e_push(base, n, ipcref__ring_entry(IPCREF__RING_RELEASE, never, 1));
  e_push(base, n,
         ipcref__ring_entry(IPCREF__RING_RELEASE, slot[1], gen[1] - 1));
  e_push(base, n,
         ipcref__ring_entry(IPCREF__RING_RELEASE, slot[1], gen[1] + 1));
  e_push(base, n, ipcref__ring_entry(IPCREF__RING_RELEASE, n + 5, 1));
  e_push(base, n,
         ipcref__ring_entry(IPCREF__RING_REFUSED, slot[2], gen[2] + 1));
  e_push(base, n, ipcref__ring_entry(IPCREF__RING_PARENT, slot[2], gen[2]));
  ctl_put(a->ctl, 'f');
  CTL_EXPECT(a->ctl, 'l');
  /* Phase 2: a forwarded hold that was never claimed (its slot word is
   * not live), linked to a lease it holds. */
  {
    uint64_t pair2[2];
    pair2[0] = ipcref__ring_entry(IPCREF__RING_LINK, n / 2 + 3, 1);
    pair2[1] = ipcref__ring_entry(IPCREF__RING_PARENT, slot[2], gen[2]);
    ipcref__ring_push(base, n, -1, pair2, 2, NULL);
  }
  ctl_put(a->ctl, 'k');
  CTL_EXPECT(a->ctl, 'c');
  /* Phase 3: after all that, and after the producer dropped its own
   * references and allocated more, what it still holds is intact. */
  CHECK_EQ(bad_bytes(&v[1], 51), 0);
  CHECK_EQ(bad_bytes(&v[2], 52), 0);
  /* Phase 4: B's genuine return; then ring positions taken and never
   * written (holes), with C's genuine return and a second return of B
   * behind them. */
  ipcref_view_release(&v[1]);
  __atomic_fetch_add(&((ipcref__ledger_hdr *)(void *)base)->head, 4,
                     __ATOMIC_RELAXED);
  ipcref_view_release(&v[2]);
  e_push(base, n, ipcref__ring_entry(IPCREF__RING_RELEASE, slot[1], gen[1]));
  ctl_put(a->ctl, 'd');
  CTL_EXPECT(a->ctl, 'q');
out:
  for (i = 0; i < 3; i++) ipcref_view_release(&v[i]);
  e_end(base, bytes, ledger, p, ctx);
  return 0;
}

/* Counters that cannot lie: a consumer (a child) maps the ledger fd it
 * received and writes forged entries into the ring: a second return of a
 * lease it returned, a return for a slot it was never given, stale and
 * future generations, a slot past the ledger, a refusal (the return of a
 * lease whose message was refused) at a wrong generation, a lone
 * parent half, a link of a forwarding slot never claimed, and finally a
 * second return after its genuine one, behind ring positions it took and
 * never wrote (holes, which the sweep steps over once stale, so a consumer
 * cannot stall its ledger). The producer's error hook hears
 * each of the first 8 and then the 16th, 32nd, ... (told_of), and
 * stats.bad_returns counts each, live_slots stays exact, and no
 * block is freed early: one the child and a legitimate consumer still
 * hold keeps its data while the producer drops its references and reuses
 * every free block around it. */
/* How many of n bad returns the error hook hears (ipcref__bad_return). */
static long long told_of(uint64_t n) {
  long long told = 0;
  uint64_t k;
  for (k = 1; k <= n; k++) told += k <= 8 || (k & (k - 1)) == 0;
  return told;
}

static void test_forged_returns(void) {
  res_mark m;
  int sl[2];
  kid k;
  e_arg a;
  ipcref_ctx *P = NULL, *L = NULL;
  ipcref_peer *pp = NULL, *pl = NULL, *lc = NULL;
  ipcref_view v[3], lv, more[64];
  ipcref_stats s;
  int i, c;
  res_begin(&m);
  memset(v, 0, sizeof v);
  memset(&lv, 0, sizeof lv);
  memset(more, 0, sizeof more);
  e_start(&k, &a, e_child, &P, &pp);
  L = make_ctx(NULL);
  /* The legitimate consumer, in this process. */
  xsocketpair(SOCK_SEQPACKET, sl);
  pl = make_peer(P, sl[0]);
  lc = make_peer(L, sl[1]);
  for (i = 0; i < 3; i++) {
    CHECK_EQ(u8_view(P, 4096, 50 + (uint32_t)i, &v[i]), IPCREF_OK);
    e_hand(&k, pp, &v[i]);
  }
  CHECK_EQ(ipcref_send(pl, &v[1]), IPCREF_OK);
  CHECK_EQ(ipcref_recv(lc, &lv, WAIT_MS), IPCREF_OK);
  c = ctl_get(k.ctl, CTL_MS);
  CHECK_EQ(c, 'r');
  if (c != 'r') goto out;
  s = stats_of(P);
  CHECK_EQ(s.live_slots, 4);
  CHECK_EQ(s.bad_returns, 0);
  CHECK_EQ(err_count, 0);
  ctl_put(k.ctl, 'g');
  CTL_EXPECT(k.ctl, 'f');
  /* Phase 1: A's genuine return ends its lease; each lie is refused. */
  s = stats_of(P);
  CHECK_EQ(s.bad_returns, E_FORGED);
  CHECK_EQ(err_count, E_FORGED);
  CHECK_EQ(err_eproto, E_FORGED);
  CHECK_EQ(s.live_slots, 3); /* B and C at the child, B at L */
  CHECK_EQ(s.live_bufs, 3);
  ctl_put(k.ctl, 'l');
  CTL_EXPECT(k.ctl, 'k');
  s = stats_of(P);
  CHECK(s.bad_returns > E_FORGED);
  CHECK(err_count > E_FORGED);
  CHECK_EQ(s.live_slots, 3); /* the forged link added no lease */
  /* The producer lets go of A, B and C: A is free, B and C wait. Then it
   * takes and scribbles on every free block of that size it can get: a
   * block freed early would be among them. */
  for (i = 0; i < 3; i++) ipcref_view_release(&v[i]);
  s = stats_of(P);
  CHECK_EQ(s.limbo_blocks, 2);
  CHECK_EQ(s.live_slots, 3);
  for (i = 0; i < 64; i++)
    if (u8_view(P, 4096, 99, &more[i]) == IPCREF_OK)
      memset(view_data(&more[i]), 0xee, 4096);
  CHECK_EQ(bad_bytes(&lv, 51), 0);
  ctl_put(k.ctl, 'c');
  CTL_EXPECT(k.ctl, 'd');
  /* Phase 4: the child (still alive) left holes in its ring: the sweep
   * steps over them (they are stale after a while), so its genuine
   * returns behind them still come back, and its late lie still does not
   * count as one; B stays for L. */
  {
    long end = now_ms() + 5000;
    struct timespec ms10 = {0, 10000000};
    for (;;) {
      s = stats_of(P);
      if (s.live_slots <= 1 || now_ms() > end) break;
      nanosleep(&ms10, NULL);
    }
  }
  CHECK_EQ(s.live_slots, 1);
  CHECK_EQ(s.limbo_blocks, 1);
  CHECK_EQ(s.bad_returns, E_FORGED + 2);
  CHECK_EQ(told_of(s.bad_returns), (long long)err_eproto);
  CHECK_EQ(err_count, err_eproto);
  CHECK_EQ(bad_bytes(&lv, 51), 0);
  ctl_put(k.ctl, 'q');
  KID_EXIT0(&k, "forging consumer");
  s = stats_of(P);
  CHECK_EQ(s.live_slots, 1);
  CHECK_EQ(s.limbo_blocks, 1);
  CHECK_EQ(bad_bytes(&lv, 51), 0);
  ipcref_view_release(&lv);
  s = stats_of(P);
  CHECK_EQ(s.live_slots, 0);
  CHECK_EQ(s.limbo_blocks, 0);
out:
  for (i = 0; i < 64; i++) ipcref_view_release(&more[i]);
  for (i = 0; i < 3; i++) ipcref_view_release(&v[i]);
  ipcref_view_release(&lv);
  if (c != 'r') KID_EXIT0(&k, "forging consumer");
  ipcref_peer_free(lc);
  ipcref_peer_free(pl);
  ipcref_peer_free(pp);
  ipcref_ctx_free(L);
  ipcref_ctx_free(P);
  kid_close(&k);
  RES_END(&m);
}

/* Ring positions a consumer takes and never writes (holes), all before
 * the head a death left, so each is stepped over at once: a sweep steps
 * over IPCREF__HOLES of them at most (each scans the forwarding slots, so
 * a consumer making holes on purpose could make one sweep quadratic),
 * the next sweeps go on, and the return behind them still comes back. */
static void test_holes_per_sweep(void) {
  res_mark m;
  local_pair l;
  ipcref_view v, got;
  ipcref__ledger *led;
  uint64_t t0;
  const int64_t n = 64;
  int sweeps;
  res_begin(&m);
  local_pair_open(&l, NULL, NULL);
  CHECK_EQ(ipcref_view_new_shared(l.prod, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l.cp, &got, WAIT_MS), IPCREF_OK);
  led = l.prod->ledgers;
  if (!led) return;
  IPCREF__LOCK(l.prod);
  t0 = led->tail;
  __atomic_fetch_add(&((ipcref__ledger_hdr *)(void *)led->base)->head, 10,
                     __ATOMIC_RELEASE);
  led->death_head = t0 + 10; /* as a reap would say */
  IPCREF__UNLOCK(l.prod);
  ipcref_view_release(&got); /* its return, behind the ten holes */
  IPCREF__LOCK(l.prod);
  (void)ipcref__ledger_drain(l.prod, led);
  CHECK_EQ(led->tail - t0, (uint64_t)IPCREF__HOLES);
  for (sweeps = 1; led->tail != t0 + 11 && sweeps < 10; sweeps++)
    (void)ipcref__ledger_drain(l.prod, led);
  IPCREF__UNLOCK(l.prod);
  CHECK_EQ(sweeps, (10 + IPCREF__HOLES - 1) / IPCREF__HOLES);
  CHECK_EQ(stats_of(l.prod).live_slots, 0);
  CHECK_EQ(stats_of(l.prod).bad_returns, 0);
  ipcref_view_release(&v);
  local_pair_close(&l);
  RES_END(&m);
}

/* ============================================================ f. holders */

/* The processes the hostile consumer names as holders of forwarded
 * leases: more than the context watches through pidfds. */
#define F_HOLDERS (IPCREF__NAMED_PIDFDS + 24)

/* A holder: lives until the gate's write end closes (or its parent dies). */
static void f_holder(int gate) {
  char b;
  (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
  while (read(gate, &b, 1) < 0 && errno == EINTR) continue;
  _exit(0);
}

/* Claims forwarding slot `s` of the ledger at `base` (n slots) for
 * `holder` as a forwarder would (the slot live at a new generation, its
 * holder and parent written), then links it to the lease (ps, pg). */
static void f_forge(unsigned char *base, uint32_t n, uint32_t s, int holder,
                    uint32_t ps, uint32_t pg) {
  uint64_t *slots = ipcref__ledger_slots(base), e[2];
  uint64_t w = __atomic_load_n(&slots[2 * (size_t)s], __ATOMIC_ACQUIRE);
  uint32_t gen = (uint32_t)(w >> 2) + 1u;
  __atomic_store_n(&slots[2 * (size_t)s],
                   ((uint64_t)gen << 2) | IPCREF__SLOT_LIVE, __ATOMIC_RELEASE);
  __atomic_store_n(&slots[2 * (size_t)s + 1],
                   ((uint64_t)(ps + 1u) << 32) | (uint32_t)holder,
                   __ATOMIC_RELEASE);
  e[0] = ipcref__ring_entry(IPCREF__RING_LINK, s, gen);
  e[1] = ipcref__ring_entry(IPCREF__RING_PARENT, ps, pg);
  ipcref__ring_push(base, n, -1, e, 2, NULL);
}

/* Closes the gate's write end and reaps the holders (no zombies: a
 * zombie's pid still answers kill(pid, 0)). */
static void f_holders_end(int *gate, pid_t *kids) {
  int i;
  if (gate[1] >= 0) close(gate[1]);
  gate[1] = -1;
  for (i = 0; i < F_HOLDERS; i++) {
    if (kids[i] > 0) CHECK_EQ(waitpid(kids[i], NULL, 0), kids[i]);
    kids[i] = 0;
  }
}

static int f_child(void *argp) {
  e_arg *a = (e_arg *)argp;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v;
  pid_t kids[F_HOLDERS];
  unsigned char *base = NULL;
  size_t bytes = 0;
  uint32_t n = 0, slot = 0, gen = 0;
  int ledger = -1, gate[2] = {-1, -1}, i;
  memset(&v, 0, sizeof v);
  memset(kids, 0, sizeof kids);
  /* The holders first, before this process has anything to leak. */
  CHECK_EQ(pipe(gate), 0);
  for (i = 0; i < F_HOLDERS && gate[0] >= 0; i++) {
    kids[i] = fork();
    if (kids[i] == 0) {
      close(gate[1]);
      f_holder(gate[0]);
    }
    CHECK(kids[i] > 0);
  }
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new(ctx, a->peer, &p), IPCREF_OK);
  e_take(a, p, &v, &ledger, &slot, &gen);
  base = e_map(ledger, &bytes, &n, 2 * F_HOLDERS);
  if (!base || gate[0] < 0) {
    ctl_put(a->ctl, 'x');
    goto out;
  }
  ctl_put(a->ctl, 'r');
  CTL_EXPECT(a->ctl, 'g');
  for (i = 0; i < F_HOLDERS; i++)
    if (kids[i] > 0)
      f_forge(base, n, n / 2 + (uint32_t)i, (int)kids[i], slot, gen);
  ctl_put(a->ctl, 'f');
  CTL_EXPECT(a->ctl, 'k');
  f_holders_end(gate, kids);
  ctl_put(a->ctl, 'd');
  CTL_EXPECT(a->ctl, 'q');
out:
  f_holders_end(gate, kids);
  if (gate[0] >= 0) close(gate[0]);
  ipcref_view_release(&v);
  e_end(base, bytes, ledger, p, ctx);
  return 0;
}

/* Holders a consumer names cannot take the producer's fds: a child that
 * holds one lease claims F_HOLDERS forwarding slots in its ledger and
 * names as their holders as many live processes of its own. The producer
 * counts every such lease (they are indistinguishable from real
 * forwards), but opens pidfds for the first IPCREF__NAMED_PIDFDS of those
 * processes only and watches the rest by pid; ipcref_ctx_timeout then
 * asks for a call within IPCREF__POLL_MS. Once the holders are gone, the
 * calls an application makes anyway (an allocation, a release) see it,
 * with no ipcref_collect, and reclaim their leases: the child's own is
 * all that stays. */
static void test_forged_holders(void) {
  res_mark m;
  kid k;
  e_arg a;
  ipcref_ctx *P = NULL;
  ipcref_peer *pp = NULL;
  ipcref_view v, t;
  ipcref_stats s;
  long end;
  int c, fds0, to;
  res_begin(&m);
  memset(&v, 0, sizeof v);
  e_start(&k, &a, f_child, &P, &pp);
  CHECK_EQ(u8_view(P, 4096, 70, &v), IPCREF_OK);
  e_hand(&k, pp, &v);
  c = ctl_get(k.ctl, CTL_MS);
  CHECK_EQ(c, 'r');
  if (c != 'r') goto out;
  if (u8_view(P, 64, 71, &t) == IPCREF_OK) /* its segment, made now */
    ipcref_view_release(&t);
  fds0 = count_fds();
  ctl_put(k.ctl, 'g');
  CTL_EXPECT(k.ctl, 'f');
  (void)ipcref_collect(P);
  s = stats_of(P);
  CHECK_EQ(s.live_slots, 1 + F_HOLDERS);
  CHECK_EQ(s.bad_returns, 0);
  CHECK(count_fds() - fds0 <= IPCREF__NAMED_PIDFDS);
  to = ipcref_ctx_timeout(P);
  CHECK(to >= 0 && to <= IPCREF__POLL_MS);
  ipcref_view_release(&v); /* the limbo keeps it for the leases */
  ctl_put(k.ctl, 'k');
  CTL_EXPECT(k.ctl, 'd');
  end = now_ms() + 5000L * slow;
  while (P->st.live_slots > 1 && now_ms() < end) {
    if (u8_view(P, 64, 71, &t) == IPCREF_OK) ipcref_view_release(&t);
    sleep_us(5000);
  }
  s = stats_of(P);
  CHECK_EQ(s.live_slots, 1);
  CHECK_EQ(s.limbo_blocks, 1);
  CHECK_EQ(s.bad_returns, 0);
  CHECK_EQ(err_count, 0);
  CHECK(count_fds() <= fds0);
  ctl_put(k.ctl, 'q');
  KID_EXIT0(&k, "naming consumer");
  s = stats_of(P);
  CHECK_EQ(s.live_slots, 0);
  CHECK_EQ(s.limbo_blocks, 0);
out:
  ipcref_view_release(&v);
  if (c != 'r') KID_EXIT0(&k, "naming consumer");
  ipcref_peer_free(pp);
  ipcref_ctx_free(P);
  kid_close(&k);
  RES_END(&m);
}

/* The cap's bookkeeping, on this process's own pid: a named holder's
 * pidfd counts in named_pidfds until it closes; past the cap a named
 * holder gets none, and gets one when the same process turns out to be a
 * peer (whose pid the kernel vouches for), without counting as named. */
static void test_named_then_peer(void) {
  res_mark m;
  ipcref_ctx *P;
  ipcref__watch *w, *again;
  res_begin(&m);
  P = make_ctx(NULL);
  IPCREF__LOCK(P);
  w = ipcref__watch_get(P, (int)getpid(), 1);
  CHECK(w != NULL);
  CHECK_EQ(P->named_pidfds, P->no_pidfd ? 0 : 1);
  ipcref__watch_put(P, w);
  CHECK_EQ(P->named_pidfds, 0);
  P->named_pidfds = IPCREF__NAMED_PIDFDS; /* as if others held them all */
  w = ipcref__watch_get(P, (int)getpid(), 1);
  CHECK(w != NULL && w->pidfd < 0);
  again = ipcref__watch_get(P, (int)getpid(), 0);
  CHECK(again == w);
  if (!P->no_pidfd) CHECK(w->pidfd >= 0); /* valgrind: no pidfd_open */
  CHECK_EQ(P->named_pidfds, IPCREF__NAMED_PIDFDS);
  ipcref__watch_put(P, again);
  ipcref__watch_put(P, w);
  CHECK_EQ(P->named_pidfds, IPCREF__NAMED_PIDFDS);
  P->named_pidfds = 0;
  IPCREF__UNLOCK(P);
  ipcref_ctx_free(P);
  RES_END(&m);
}

/* ============================================================ g. impostors */

/* A copy of `src`'s bytes rewritten as `w`, with duplicates of its fds. */
static void w_lie(const ipcref_msg *src, const wmsg *w, ipcref_msg *out) {
  int i;
  memset(out, 0, sizeof *out);
  wencode(w, out);
  out->nfds = src->nfds;
  for (i = 0; i < src->nfds; i++)
    out->fds[i] = fcntl(src->fds[i], F_DUPFD_CLOEXEC, 0);
}

/* Producer B sends a message in producer A's name (A's nonce as its
 * sender) that says A destroyed the segment the consumer has of it:
 * refused, and A's next message over that segment, which brings no fd for
 * it, is imported as before. Without the check the consumer unmapped A's
 * segment, and then refused A's honest message. */
static void test_speaking_for_another(void) {
  res_mark m;
  ipcref_ctx_options co;
  ipcref_ctx *a, *b, *c;
  ipcref_peer *pa, *pb, *ca, *cb;
  ipcref_view va, vb, got;
  ipcref_msg *msg = (ipcref_msg *)malloc(sizeof *msg);
  ipcref_msg *lie = (ipcref_msg *)malloc(sizeof *lie);
  wmsg *w = (wmsg *)malloc(sizeof *w);
  uint64_t seg_a = 0;
  int sa[2], sb[2];
  const int64_t shape[1] = {1024};
  res_begin(&m);
  memset(&co, 0, sizeof co);
  co.retired_maps = IPCREF_KEEP_NONE; /* a retired mapping goes at once */
  a = make_ctx(NULL);
  b = make_ctx(NULL);
  c = make_ctx(&co);
  CHECK_EQ(xsocketpair(SOCK_SEQPACKET, sa), 0);
  CHECK_EQ(xsocketpair(SOCK_SEQPACKET, sb), 0);
  pa = make_peer(a, sa[0]);
  ca = make_peer(c, sa[1]);
  pb = make_peer(b, sb[0]);
  cb = make_peer(c, sb[1]);
  CHECK_EQ(ipcref_view_new_shared(a, IPCREF_F32, 1, shape, &va), IPCREF_OK);
  CHECK_EQ(ipcref_view_new_shared(b, IPCREF_F32, 1, shape, &vb), IPCREF_OK);
  fill(&va, 7);
  CHECK_EQ(ipcref_send(pa, &va), IPCREF_OK);
  CHECK_EQ(ipcref_recv(ca, &got, WAIT_MS), IPCREF_OK);
  CHECK_EQ(bad_bytes(&got, 7), 0);
  ipcref_view_release(&got); /* A's segment stays mapped in c, unused */
  CHECK_EQ(ipcref_export(pa, &va, msg), IPCREF_OK); /* for its segment id */
  if (wparse(msg, w)) seg_a = w->v[0].seg_id;
  ipcref_msg_free(msg);
  CHECK_EQ(ipcref_export(pb, &vb, msg), IPCREF_OK);
  CHECK(wparse(msg, w));
  w->nonce = a->nonce;
  w->nret = 1;
  w->ret[0] = seg_a;
  w_lie(msg, w, lie);
  CHECK_EQ(ipcref_import(cb, lie, &got), IPCREF_EPROTO);
  CHECK(got.buf == NULL);
  ipcref_msg_free(msg); /* B's lease ends */
  CHECK_EQ(ipcref_send(pa, &va), IPCREF_OK);
  CHECK_EQ(ipcref_recv(ca, &got, WAIT_MS), IPCREF_OK);
  CHECK_EQ(bad_bytes(&got, 7), 0);
  ipcref_view_release(&got);
  ipcref_view_release(&va);
  ipcref_view_release(&vb);
  ipcref_peer_free(ca);
  ipcref_peer_free(cb);
  ipcref_peer_free(pa);
  ipcref_peer_free(pb);
  ipcref_ctx_free(c);
  ipcref_ctx_free(b);
  ipcref_ctx_free(a);
  free(w);
  free(lie);
  free(msg);
  RES_END(&m);
}

/* What the planting child is told: the name it forwards under. */
typedef struct plant_name {
  uint64_t nonce, seg, led;
  uint32_t pid;
} plant_name;

/* A producer of its own (this child) that forwards, as if from producer
 * A, a segment and a ledger of its own under the ids A will use: its
 * genuine export with every origin rewritten to A's, and its ledger's
 * header too. It keeps them alive until told to go. */
static int planting_producer(void *arg) {
  kid *k = (kid *)arg;
  plant_name a;
  ipcref_ctx *b = make_ctx(NULL);
  ipcref_peer *p = make_peer(b, k->their_sock[0]);
  ipcref_msg *msg = (ipcref_msg *)malloc(sizeof *msg);
  ipcref_msg *lie = (ipcref_msg *)malloc(sizeof *lie);
  wmsg *w = (wmsg *)malloc(sizeof *w);
  ipcref__ledger_hdr *h;
  ipcref_view vb;
  const int64_t shape[1] = {1024};
  unsigned i;
  if (ctl_recv(k->their_ctl, &a, sizeof a, CTL_MS) != (ssize_t)sizeof a)
    return 2;
  CHECK_EQ(ipcref_view_new_shared(b, IPCREF_F32, 1, shape, &vb), IPCREF_OK);
  fill(&vb, 99);
  CHECK_EQ(ipcref_export(p, &vb, msg), IPCREF_OK);
  CHECK(wparse(msg, w));
  for (i = 0; i < w->nfds; i++) {
    w->fd[i].nonce = a.nonce;
    w->fd[i].pid = a.pid;
    w->fd[i].id = w->fd[i].kind == 2 ? a.led : a.seg;
  }
  w->v[0].nonce = a.nonce;
  w->v[0].pid = a.pid;
  w->v[0].seg_id = a.seg;
  w->v[0].ledger_id = a.led;
  h = (ipcref__ledger_hdr *)(void *)b->ledgers->base;
  h->origin_nonce = a.nonce;
  h->origin_pid = a.pid;
  h->ledger_id = a.led;
  w_lie(msg, w, lie);
  CHECK_EQ(xfer_send(p->fd, lie), 0);
  msg_close_fds(lie);
  ipcref_msg_sent(msg);
  CTL_EXPECT(k->their_ctl, 'q');
  ipcref_view_release(&vb);
  ipcref_peer_free(p);
  ipcref_ctx_free(b);
  free(w);
  free(lie);
  free(msg);
  return 0;
}

/* A process forwards to consumer C, under producer A's name, a segment
 * and a ledger of its own with the ids A will use, before A sends C
 * anything: C takes them as forwarded (a forwarder vouches for what it
 * forwards), but A's own first message brings A's segment and ledger,
 * which displace the planted ones: C reads A's data, not the planter's.
 * Without that, C kept the planted mappings (an fd for something mapped
 * was redundant): A's message was refused, its lease looked up in the
 * planted ledger, and had the planter marked every slot there live, C
 * would have read the planter's memory as A's. */
static void test_planted_segment(void) {
  res_mark m;
  kid k;
  plant_name a;
  ipcref_ctx *A, *C;
  ipcref_peer *pa, *ca, *cb;
  ipcref_view va, got;
  ipcref_msg *msg;
  wmsg *w;
  int sa[2];
  const int64_t shape[1] = {1024};
  res_begin(&m);
  kid_start(&k, 1, SOCK_SEQPACKET, planting_producer);
  msg = (ipcref_msg *)malloc(sizeof *msg); /* after the fork: the child's */
  w = (wmsg *)malloc(sizeof *w);           /* copies would be its leaks */
  A = make_ctx(NULL);
  C = make_ctx(NULL);
  CHECK_EQ(xsocketpair(SOCK_SEQPACKET, sa), 0);
  pa = make_peer(A, sa[0]);
  ca = make_peer(C, sa[1]);
  cb = kid_peer(&k, 0, C);
  CHECK_EQ(ipcref_view_new_shared(A, IPCREF_F32, 1, shape, &va), IPCREF_OK);
  fill(&va, 7);
  memset(&a, 0, sizeof a);
  CHECK_EQ(ipcref_export(pa, &va, msg), IPCREF_OK); /* A's ids for C */
  if (wparse(msg, w)) {
    a.seg = w->v[0].seg_id;
    a.led = w->v[0].ledger_id;
  }
  ipcref_msg_free(msg); /* never sent: the next one brings the fds again */
  a.nonce = A->nonce;
  a.pid = (uint32_t)getpid();
  CHECK_EQ(ctl_send(k.ctl, &a, sizeof a), 0);
  CHECK_EQ(ipcref_recv(cb, &got, WAIT_MS), IPCREF_OK); /* vouched for */
  CHECK_EQ(bad_bytes(&got, 99), 0);
  ipcref_view_release(&got);
  CHECK_EQ(ipcref_send(pa, &va), IPCREF_OK);
  CHECK_EQ(ipcref_recv(ca, &got, WAIT_MS), IPCREF_OK);
  CHECK_EQ(bad_bytes(&got, 7), 0);
  ipcref_view_release(&got);
  ctl_put(k.ctl, 'q');
  KID_EXIT0(&k, "planting producer");
  ipcref_view_release(&va);
  ipcref_peer_free(cb);
  ipcref_peer_free(ca);
  ipcref_peer_free(pa);
  ipcref_ctx_free(C);
  ipcref_ctx_free(A);
  kid_close(&k);
  free(w);
  free(msg);
  RES_END(&m);
}

/* ------------------------------------------------------------ main */

/* One hand-off first, so that one-time allocations (stdio, malloc arenas)
 * are not counted as a test's. */
static void warm_up(void) {
  int fails = harness_failures_in_test;
  a_setup();
  a_teardown();
  harness_failures_in_test = fails;
}

int main(void) {
  fixture_start();
  path_say("test_hostile");
  res_all_maps = 1; /* every mapping is back after a case (plain builds) */
  signal(SIGPIPE, SIG_IGN);
  warm_up();
  RUN(test_malicious_producer);
  RUN(test_published_slots);
  RUN(test_most_fds);
  RUN(test_shrink_attempts);
  RUN(test_isolation);
  RUN(test_other_uid);
  RUN(test_forged_returns);
  RUN(test_holes_per_sweep);
  RUN(test_forged_holders);
  RUN(test_named_then_peer);
  RUN(test_speaking_for_another);
  RUN(test_planted_segment);
  return harness_finish();
}
