/* The set-up the multi-process sharing tests have in common
 * (tests/test_share.c, test_hostile.c, test_gpu.c, and through
 * tests/proc.h test_crash.c and test_forward_death.c). Include it after
 * ipcref.h; it brings tests/harness.h. All static; a test uses what it
 * needs.
 *
 *   - the run: UNDER_ASAN, under_valgrind and slow (fixture_start sets
 *     them), now_ms, sleep_us; REAP_MS and CHILD_ALARM_S unless the test
 *     defines its own before the include;
 *   - what a case leaves behind: count_fds (fds_ignore: a path prefix not
 *     counted), count_maps, res_begin / RES_END / RES_END_CHILD (with
 *     res_all_maps set, every mapping counts in plain builds), stats_of,
 *     peer_info_of, nothing_waits (ipcref_ctx_timeout with nothing due);
 *   - the error hook (error_hook: err_count, err_eproto, err_epeer,
 *     err_last; errors_reset, EXPECT_ERRORS), new_ctx, make_ctx,
 *     make_peer, and local_pair (two contexts of this process with a peer
 *     each on one socketpair);
 *   - fds: the test's own sockets and pipes (xsocketpair, xpipe) are
 *     registered, so that a forked child closes those it was not given and
 *     hang-ups are seen (tforget: a peer owns it now; tclose); control
 *     messages (ctl_send / ctl_recv: bytes; ctl_put / ctl_get /
 *     CTL_EXPECT: an int, CTL_MS the test's wait); an own transport for
 *     ipcref_export / ipcref_import (xfer_send, xfer_recv, msg_dup,
 *     msg_close_fds);
 *   - children forked from this process: fork_child (with the fds it
 *     keeps), wait_child, EXPECT_EXIT0; and the kid, a child with sockets
 *     to this process and a control socket: kid_open, kid_fork (kid_start:
 *     both), kid_peer, KID_EXIT0, KID_KILL, kid_close, KID_END.
 *
 * How a new sharing test looks:
 *
 *     static int consumer(void *arg) {             // the child
 *       kid *k = (kid *)arg;
 *       ipcref_ctx *ctx = make_ctx(NULL);
 *       ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
 *       ipcref_view v;
 *       CHECK_EQ(ipcref_recv(p, &v, 5000), IPCREF_OK);  // ... and checks v
 *       ipcref_view_release(&v);
 *       ctl_put(k->their_ctl, 'd');
 *       ipcref_peer_free(p);
 *       ipcref_ctx_free(ctx);
 *       return 0;                        // exit 0: every CHECK held
 *     }
 *     static void test_hand_off(void) {
 *       const int64_t n = 4096;
 *       kid k;
 *       ipcref_ctx *ctx;
 *       ipcref_peer *p;
 *       ipcref_view v;
 *       kid_start(&k, 1, SOCK_SEQPACKET, consumer);  // fork before the ctx
 *       ctx = make_ctx(NULL);
 *       p = kid_peer(&k, 0, ctx);
 *       CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v), IPCREF_OK);
 *       CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
 *       CTL_EXPECT(k.ctl, 'd');                    // CTL_MS: the test's wait
 *       KID_END(&k, "consumer");                   // sockets closed; exit 0
 *       ipcref_view_release(&v);
 *       ipcref_peer_free(p);
 *       ipcref_ctx_free(ctx);
 *     }
 *
 * A child that needs more than its sockets gets its own argument:
 * kid_open, fill it with k.their_sock[i] and k.their_ctl, then kid_fork. */
#ifndef IPCREF_TEST_SHARE_FIXTURE_H
#define IPCREF_TEST_SHARE_FIXTURE_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "path.h" /* the channel, or the socket only */

#define FIXTURE_FN static __attribute__((unused))

/* ------------------------------------------------------------ the run */

static int under_valgrind;
static int slow = 1; /* timeouts that scale are multiplied by this */

#ifndef REAP_MS
#define REAP_MS (30000 * slow) /* longest wait for a child to exit */
#endif
#ifndef CHILD_ALARM_S
#define CHILD_ALARM_S 120 /* a forked child never outlives this */
#endif

FIXTURE_FN long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

FIXTURE_FN void sleep_us(long us) {
  struct timespec d;
  d.tv_sec = us / 1000000;
  d.tv_nsec = (us % 1000000) * 1000;
  while (nanosleep(&d, &d) != 0 && errno == EINTR) continue;
}

/* 1 under valgrind: IPCREF_UNDER_VALGRIND=1, or its preload mapped. */
FIXTURE_FN int detect_valgrind(void) {
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

/* First thing in main: notes valgrind (children inherit it) and sets slow. */
FIXTURE_FN void fixture_start(void) {
  under_valgrind = detect_valgrind();
  slow = under_valgrind ? 4 : UNDER_ASAN ? 2 : 1;
}

/* ------------------------------------------------------------ resources */

static const char *fds_ignore; /* fds on paths under it are not counted */

/* Open fds (not the directory's own that counts them). */
FIXTURE_FN int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  size_t skip = fds_ignore ? strlen(fds_ignore) : 0;
  int n = 0;
  if (!d) return -1;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d)) continue;
    if (skip) {
      char path[300], target[512];
      ssize_t k;
      snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
      k = readlink(path, target, sizeof target - 1);
      target[k > 0 ? k : 0] = 0;
      if (strncmp(target, fds_ignore, skip) == 0) continue;
    }
    n++;
  }
  closedir(d);
  return n;
}

/* One line of /proc/self/maps: counted unless it continues the previous
 * one (adjacent, same permissions and name: the kernel splits and merges
 * [heap] at will). */
FIXTURE_FN void count_map_line(const char *line, int *all, int *memfd) {
  static unsigned long prev_end;
  static char prev_rest[256];
  unsigned long start, end;
  const char *rest = strchr(line, ' ');
  if (sscanf(line, "%lx-%lx", &start, &end) != 2 || !rest) return;
  if (strstr(line, "/memfd:")) (*memfd)++;
  if (!(start == prev_end && strncmp(rest, prev_rest, 5) == 0 &&
        strcmp(strrchr(rest, ' '), strrchr(prev_rest, ' ')) == 0))
    (*all)++;
  prev_end = end;
  snprintf(prev_rest, sizeof prev_rest, "%s", rest);
}

/* Counts mappings and memfd mappings (segments and ledgers) with read(2)
 * into static buffers: the count must not allocate, or malloc's own
 * mappings would move under it. */
FIXTURE_FN void count_maps(int *all, int *memfd) {
  static char buf[1 << 16], line[512];
  size_t len = 0, i;
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  ssize_t n;
  *all = *memfd = 0;
  if (fd < 0) return;
  count_map_line("0-0 reset", all, memfd); /* no previous line */
  *all = 0;
  while ((n = read(fd, buf, sizeof buf)) > 0)
    for (i = 0; i < (size_t)n; i++) {
      if (buf[i] != '\n') {
        if (len < sizeof line - 1) line[len++] = buf[i];
        continue;
      }
      line[len] = 0;
      len = 0;
      count_map_line(line, all, memfd);
    }
  close(fd);
}

/* Open fds and mappings around a case: fds and memfd mappings must be
 * back where they were; with res_all_maps set, so must the total of
 * mappings, in plain builds only (ASan's and valgrind's allocators map at
 * will). */
static int res_all_maps;

typedef struct res_mark {
  int fds, maps, memfd_maps;
} res_mark;

FIXTURE_FN void res_begin(res_mark *m) {
  m->fds = count_fds();
  count_maps(&m->maps, &m->memfd_maps);
}

/* `gone`: fds open at res_begin that were handed over and closed since (a
 * child's peer sockets). The number of differences, each a failure. */
FIXTURE_FN int res_end_at(const res_mark *m, int gone, const char *file,
                          int line) {
  int fds = count_fds(), maps, memfd_maps, bad = 0;
  count_maps(&maps, &memfd_maps);
  if (fds != m->fds - gone) {
    printf("    %s:%d: open fds %d, %d before\n", file, line, fds,
           m->fds - gone);
    bad++;
  }
  if (memfd_maps != m->memfd_maps) {
    printf("    %s:%d: memfd mappings %d, %d before\n", file, line, memfd_maps,
           m->memfd_maps);
    bad++;
  }
  if (res_all_maps && !UNDER_ASAN && !under_valgrind && maps != m->maps) {
    printf("    %s:%d: mappings %d, %d before\n", file, line, maps, m->maps);
    bad++;
  }
  harness_failures_in_test += bad;
  return bad;
}
#define RES_END(m)                res_end_at(m, 0, __FILE__, __LINE__)
#define RES_END_CHILD(m, sockets) res_end_at(m, sockets, __FILE__, __LINE__)

FIXTURE_FN ipcref_stats stats_of(ipcref_ctx *ctx) {
  ipcref_stats s;
  memset(&s, 0, sizeof s);
  CHECK_EQ(ipcref_ctx_stats(ctx, &s), IPCREF_OK);
  return s;
}

/* What peer `p` holds and brought (ipcref_peer_stats), CHECKed. */
FIXTURE_FN ipcref_peer_info peer_info_of(ipcref_peer *p) {
  ipcref_peer_info in;
  memset(&in, 0, sizeof in);
  CHECK_EQ(ipcref_peer_stats(p, &in), IPCREF_OK);
  return in;
}

/* 1 when ipcref_ctx_timeout says that nothing waits on time: -1; but
 * while the context watches a process without a pidfd (every one under
 * valgrind, which has no pidfd_open), its next look at it, due within
 * IPCREF__POLL_MS. */
FIXTURE_FN int nothing_waits(ipcref_ctx *ctx) {
  int t = ipcref_ctx_timeout(ctx);
  if (ipcref__watch_polled(ctx)) return t >= 0 && t <= IPCREF__POLL_MS;
  return t == -1;
}

/* ------------------------------------------------------------ contexts */

/* What the library reports through the error hook (in this process): a
 * ctx made by new_ctx has it, a test may put it in its own options or
 * install it globally. */
static int err_count, err_eproto, err_epeer;
static char err_last[200];

static void on_error(void *user, ipcref_result code, const char *msg) {
  (void)user;
  err_count++;
  err_eproto += code == IPCREF_EPROTO;
  err_epeer += code == IPCREF_EPEER;
  snprintf(err_last, sizeof err_last, "%s (%s)", msg ? msg : "?",
           ipcref_strerror(code));
}
static const ipcref_error_hook error_hook = {on_error, NULL};

FIXTURE_FN void errors_reset(void) {
  err_count = err_eproto = err_epeer = 0;
  err_last[0] = 0;
}

/* CHECKs that the error hook heard n reports since the last reset, and
 * resets. */
#define EXPECT_ERRORS(n)                                                       \
  do {                                                                         \
    if (err_count != (n))                                                      \
      printf("    %d error report(s), last: %s\n", err_count, err_last);       \
    CHECK_EQ(err_count, (n));                                                  \
    errors_reset();                                                            \
  } while (0)

/* A context with options `o` (NULL: the defaults), CHECKed: NULL when it
 * failed. */
FIXTURE_FN ipcref_ctx *make_ctx(const ipcref_ctx_options *o) {
  ipcref_ctx *ctx = NULL;
  CHECK_EQ(ipcref_ctx_new(o, &ctx), IPCREF_OK);
  return ctx;
}

/* A context with the error hook, a segment size and ledger slots (0: the
 * defaults). */
FIXTURE_FN ipcref_ctx *new_ctx(size_t segment, uint32_t slots) {
  ipcref_ctx_options o;
  memset(&o, 0, sizeof o);
  o.segment_size = segment;
  o.ledger_slots = slots;
  o.error_hook = error_hook;
  return make_ctx(&o);
}

static void tforget(int fd);

/* A peer on socket fd, CHECKed. The peer owns fd from then on (it leaves
 * the registry); on failure fd stays the caller's. */
FIXTURE_FN ipcref_peer *make_peer(ipcref_ctx *ctx, int fd) {
  ipcref_peer *p = NULL;
  CHECK_EQ(ipcref_peer_new(ctx, fd, &p), IPCREF_OK);
  if (p) tforget(fd);
  return p;
}

/* ------------------------------------------------------------ fds */

/* The fds the test itself opened (sockets, pipes): a forked child closes
 * every one it was not given, so that hang-ups are seen. An fd closed
 * with plain close() may stay listed; its number is listed once. */
#define MAX_TFDS 128
static int tfds[MAX_TFDS];
static int ntfds;

FIXTURE_FN void treg(int fd) {
  int i;
  for (i = 0; i < ntfds; i++)
    if (tfds[i] == fd) return;
  if (fd >= 0 && ntfds < MAX_TFDS) tfds[ntfds++] = fd;
}
static void tforget(int fd) {
  int i;
  for (i = 0; i < ntfds; i++)
    if (tfds[i] == fd) {
      tfds[i] = tfds[--ntfds];
      return;
    }
}
FIXTURE_FN void tclose(int fd) {
  if (fd < 0) return;
  tforget(fd);
  close(fd);
}

/* A registered socketpair (AF_UNIX, close-on-exec), CHECKed: -1 and both
 * ends -1 when it failed. */
FIXTURE_FN int xsocketpair(int type, int sv[2]) {
  if (socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, sv) != 0) {
    CHECK(!"socketpair");
    sv[0] = sv[1] = -1;
    return -1;
  }
  treg(sv[0]);
  treg(sv[1]);
  return 0;
}

FIXTURE_FN int xpipe(int p[2]) {
  if (pipe2(p, O_CLOEXEC) != 0) {
    CHECK(!"pipe");
    p[0] = p[1] = -1;
    return -1;
  }
  treg(p[0]);
  treg(p[1]);
  return 0;
}

/* Control messages: one send, one packet (SOCK_SEQPACKET). */
FIXTURE_FN int ctl_send(int fd, const void *p, size_t n) {
  return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}
/* The next packet (at most n bytes): its length, or -1 on EOF or after
 * timeout_ms. */
FIXTURE_FN ssize_t ctl_recv(int fd, void *p, size_t n, int timeout_ms) {
  struct pollfd pf;
  ssize_t r;
  pf.fd = fd;
  pf.events = POLLIN;
  pf.revents = 0;
  do r = poll(&pf, 1, timeout_ms);
  while (r < 0 && errno == EINTR);
  if (r <= 0) return -1;
  do r = recv(fd, p, n, 0);
  while (r < 0 && errno == EINTR);
  return r > 0 ? r : -1;
}

/* A control value (an int), CHECKed sent. */
FIXTURE_FN void ctl_put(int fd, int v) {
  if (ctl_send(fd, &v, sizeof v) != 0) CHECK(!"ctl_put");
}
/* The next control value; -1 if none came within timeout_ms. */
FIXTURE_FN int ctl_get(int fd, int timeout_ms) {
  int v = -1;
  return ctl_recv(fd, &v, sizeof v, timeout_ms) == (ssize_t)sizeof v ? v : -1;
}
#define CTL_EXPECT(fd, v) CHECK_EQ(ctl_get((fd), CTL_MS), (v))

#include "xfer.h" /* xfer_send, xfer_recv: an own transport */

/* A copy of a message that owns duplicates of its fds. */
FIXTURE_FN void msg_dup(const ipcref_msg *src, ipcref_msg *dst) {
  int i;
  memcpy(dst, src, sizeof *dst);
  dst->origin_ctx = dst->origin_peer = 0;
  for (i = 0; i < src->nfds && i < IPCREF_MSG_MAX_FDS; i++)
    dst->fds[i] = fcntl(src->fds[i], F_DUPFD_CLOEXEC, 0);
}

FIXTURE_FN void msg_close_fds(ipcref_msg *m) {
  int i;
  for (i = 0; i < m->nfds && i < IPCREF_MSG_MAX_FDS; i++)
    if (m->fds[i] >= 0) close(m->fds[i]);
  m->nfds = 0;
}

/* ------------------------------------------------------------ both ends here
 */

/* A producer and a consumer context in this process, with a peer each on
 * the two ends of one SOCK_SEQPACKET socketpair. */
typedef struct local_pair {
  ipcref_ctx *prod, *cons;
  ipcref_peer *pp, *cp; /* the producer's peer, the consumer's */
} local_pair;

/* The options of each context may be NULL (the defaults). */
FIXTURE_FN void local_pair_open(local_pair *l, const ipcref_ctx_options *prod,
                                const ipcref_ctx_options *cons) {
  int sv[2];
  memset(l, 0, sizeof *l);
  if (xsocketpair(SOCK_SEQPACKET, sv) != 0) return;
  l->prod = make_ctx(prod);
  l->cons = make_ctx(cons);
  if (l->prod) l->pp = make_peer(l->prod, sv[0]);
  if (l->cons) l->cp = make_peer(l->cons, sv[1]);
  if (!l->pp) tclose(sv[0]);
  if (!l->cp) tclose(sv[1]);
}

/* Frees the peers, then the contexts (the consumer's first). */
FIXTURE_FN void local_pair_close(local_pair *l) {
  ipcref_peer_free(l->cp);
  ipcref_peer_free(l->pp);
  ipcref_ctx_free(l->cons);
  ipcref_ctx_free(l->prod);
  memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------ children */

typedef int (*child_fn)(void *arg);

/* Forks a child that runs fn(arg) with only the fds keep[0..nkeep) of
 * those the test registered; the rest of them it closes. It _exits 0
 * when fn returned 0 and no CHECK failed in it, and never outlives
 * CHILD_ALARM_S. */
FIXTURE_FN pid_t fork_child_keeping(child_fn fn, void *arg, const int *keep,
                                    int nkeep) {
  int i, j;
  pid_t pid;
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  if (pid < 0) {
    CHECK(!"fork");
    return -1;
  }
  if (pid == 0) {
    int base = harness_failures_in_test, rc;
    for (i = 0; i < ntfds; i++) {
      for (j = 0; j < nkeep && keep[j] != tfds[i]; j++) continue;
      if (j == nkeep) close(tfds[i]);
    }
    ntfds = 0;
    for (j = 0; j < nkeep; j++) treg(keep[j]);
    alarm(CHILD_ALARM_S);
    rc = fn(arg);
    if (rc != 0 || harness_failures_in_test != base)
      printf("    (child %d: %d failed checks, rc %d)\n", (int)getpid(),
             harness_failures_in_test - base, rc);
    fflush(stdout);
    _exit(rc != 0 || harness_failures_in_test != base ? 1 : 0);
  }
  return pid;
}

/* The same with the fds it keeps listed (-1 ends the list). */
FIXTURE_FN pid_t fork_child(child_fn fn, void *arg, ...) {
  int keep[16], nkeep = 0, fd;
  va_list ap;
  va_start(ap, arg);
  while ((fd = va_arg(ap, int)) >= 0 && nkeep < 16) keep[nkeep++] = fd;
  va_end(ap);
  return fork_child_keeping(fn, arg, keep, nkeep);
}

/* Waits for child pid, killing it after timeout_ms: its wait status, or
 * -1. */
FIXTURE_FN int wait_child(pid_t pid, int timeout_ms) {
  int st = 0;
  long end = now_ms() + timeout_ms;
  if (pid <= 0) return -1;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 && errno != EINTR) return -1;
    if (now_ms() > end) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) continue;
      printf("    child %d timed out: killed\n", (int)pid);
      return -1;
    }
    sleep_us(300);
  }
}

/* CHECKs a wait status: exited 0. 1 when it did. */
FIXTURE_FN int exit0_at(int st, const char *who, const char *file, int line) {
  if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) return 1;
  harness_failures_in_test++;
  if (st != -1 && WIFSIGNALED(st))
    printf("    %s:%d: %s killed by signal %d\n", file, line, who,
           WTERMSIG(st));
  else
    printf("    %s:%d: %s exited with %d\n", file, line, who,
           st == -1 ? -1 : WEXITSTATUS(st));
  return 0;
}

/* CHECKs a wait status: killed by SIGKILL. */
FIXTURE_FN void sigkilled_at(int st, pid_t pid, const char *who,
                             const char *file, int line) {
  if (st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) return;
  harness_failures_in_test++;
  printf("    %s:%d: %s (pid %d) was not killed by SIGKILL (status %#x)\n",
         file, line, who, (int)pid, st);
}

/* Waits for a forked child (REAP_MS at most) and CHECKs it exited 0. */
#define EXPECT_EXIT0(pid, who)                                                 \
  exit0_at(wait_child(pid, REAP_MS), who, __FILE__, __LINE__)

/* ------------------------------------------------------------ the kid */

/* A forked child with `nsock` sockets to this process and a control
 * socket (SOCK_SEQPACKET). */
#define KID_SOCKS 3
typedef struct kid {
  pid_t pid; /* -1 before kid_fork and once reaped */
  int nsock;
  int sock[KID_SOCKS]; /* this process's ends: -1 once a peer owns one */
  int ctl;             /* this process's end of the control socket */
  int their_sock[KID_SOCKS], their_ctl; /* the child's ends */
} kid;

/* The sockets: sock[0] of `type`, the others SOCK_SEQPACKET. */
FIXTURE_FN int kid_open(kid *k, int nsock, int type) {
  int sv[2], i;
  memset(k, 0, sizeof *k);
  k->pid = -1;
  k->ctl = k->their_ctl = -1;
  for (i = 0; i < KID_SOCKS; i++) k->sock[i] = k->their_sock[i] = -1;
  for (i = 0; i < nsock && i < KID_SOCKS; i++) {
    if (xsocketpair(i == 0 ? type : SOCK_SEQPACKET, sv) != 0) return -1;
    k->sock[i] = sv[0];
    k->their_sock[i] = sv[1];
    k->nsock = i + 1;
  }
  if (xsocketpair(SOCK_SEQPACKET, sv) != 0) return -1;
  k->ctl = sv[0];
  k->their_ctl = sv[1];
  return 0;
}

/* Forks fn(arg) with the child's ends and `extra` (another fd it keeps,
 * or -1), then closes the child's ends here (not `extra`). */
FIXTURE_FN pid_t kid_fork(kid *k, child_fn fn, void *arg, int extra) {
  int keep[KID_SOCKS + 2], n = 0, i;
  if (k->their_ctl < 0) return -1; /* kid_open failed: CHECKed there */
  keep[n++] = k->their_ctl;
  for (i = 0; i < k->nsock; i++) keep[n++] = k->their_sock[i];
  if (extra >= 0) keep[n++] = extra;
  k->pid = fork_child_keeping(fn, arg, keep, n);
  for (i = 0; i < k->nsock; i++) tclose(k->their_sock[i]);
  tclose(k->their_ctl);
  for (i = 0; i < KID_SOCKS; i++) k->their_sock[i] = -1; /* the child's now */
  k->their_ctl = -1;
  return k->pid;
}

/* kid_open and kid_fork, with the kid itself as the child's argument. */
FIXTURE_FN pid_t kid_start(kid *k, int nsock, int type, child_fn fn) {
  if (kid_open(k, nsock, type) != 0) return -1;
  return kid_fork(k, fn, k, -1);
}

/* A peer in ctx on this process's end of socket i, CHECKed; it owns the
 * socket then. */
FIXTURE_FN ipcref_peer *kid_peer(kid *k, int i, ipcref_ctx *ctx) {
  ipcref_peer *p = make_peer(ctx, k->sock[i]);
  if (p) k->sock[i] = -1;
  return p;
}

/* Waits for the kid (unless it was reaped) and CHECKs it exited 0. */
FIXTURE_FN int kid_exit0_at(kid *k, const char *who, const char *file,
                            int line) {
  int ok;
  if (k->pid <= 0) return 1;
  ok = exit0_at(wait_child(k->pid, REAP_MS), who, file, line);
  k->pid = -1;
  return ok;
}
#define KID_EXIT0(k, who) kid_exit0_at(k, who, __FILE__, __LINE__)

/* SIGKILLs the kid, reaps it, CHECKs it died of it. */
FIXTURE_FN void kid_kill_at(kid *k, const char *who, const char *file,
                            int line) {
  if (k->pid <= 0) return;
  kill(k->pid, SIGKILL);
  sigkilled_at(wait_child(k->pid, REAP_MS), k->pid, who, file, line);
  k->pid = -1;
}
#define KID_KILL(k, who) kid_kill_at(k, who, __FILE__, __LINE__)

/* Closes this process's ends that are left. */
FIXTURE_FN void kid_close(kid *k) {
  int i;
  for (i = 0; i < k->nsock; i++) tclose(k->sock[i]);
  tclose(k->ctl);
  for (i = 0; i < KID_SOCKS; i++) k->sock[i] = -1;
  k->ctl = -1;
}

/* The end of a kid: its sockets closed here (it sees EOF), then it must
 * exit 0 (unless it was reaped already). */
#define KID_END(k, who)                                                        \
  do {                                                                         \
    kid_close(k);                                                              \
    KID_EXIT0(k, who);                                                         \
  } while (0)

#endif
