/* Scaffolding for the tests that run the sharing layer across real
 * processes and kill them (tests/test_crash.c, tests/test_forward_death.c).
 * All static functions; a test uses what it needs. It builds on
 * tests/share_fixture.h (the run, fds and mappings, the error hook,
 * contexts and peers, socketpairs and pipes, wait_child), which it
 * includes.
 *
 * It provides:
 *   - timeouts: WAIT_MS, POLL_MS, REAP_MS, CHILD_ALARM_S (scaled by the
 *     fixture's slow); mix64;
 *   - the protocol's step labels (L_ALLOCATE .. L_SWEEP, label_names) and
 *     the step hook a child is armed with (arm): at the nth passage of a
 *     label it reports 'H' and stays there until killed, or, with
 *     hook_cmd_fd set, until the command 'c'; a process with the hook notes
 *     the steps it passes in steps_seen;
 *   - reports, a child's 8-byte records to the parent (st_put; the parent
 *     reads them into a clog: clog_wait, clog_drain, EXPECT_REPORT,
 *     stopped_at) and command bytes to a child (cmd_put, cmd_get);
 *   - the spawner: a process forked first thing in main that forks the
 *     children, so that they start with nothing of this process (valgrind's
 *     leak check sees only their own); spawn, reap, KILL_AND_REAP,
 *     EXPECT_EXIT0 (the fixture's, on the spawner's reap);
 *   - a death seen as an event loop sees it (EXPECT_DEATH_SEEN),
 *     wait_live_slots;
 *   - test blocks: new_block (a pattern any process can check: check_view),
 *     new_scribble;
 *   - the holder (run_holder), the role of a chain's last process: holds
 *     what it receives, checks it, and lets go on command.
 *
 * How a test uses it:
 *
 *     #define _GNU_SOURCE
 *     #define IPCREF_TEST_HOOKS
 *     #define IPCREF_IMPLEMENTATION
 *     #include "ipcref.h"
 *     #include <stdint.h>
 *     #define CHILD_FDS 4   // the most fds a child is given
 *     typedef struct child_args {
 *       int32_t role, nfds;        // read by the spawner: nfds, fd
 *       int32_t fd[CHILD_FDS];     // fd[0]: the child's report pipe
 *       ...                        // whatever else the child is told
 *     } child_args;
 *     #include "proc.h"            // also brings the fixture and harness
 *
 *     static int run_role(const child_args *a) { ... }  // a child's body
 *
 *     int main(void) {
 *       if (proc_start() != 0) ...  // first thing: before any allocation
 *       RUN(...);
 *       spawner_stop();             // its status: 0 when it was clean
 *       return harness_finish();
 *     }
 *
 * A case passes a child_args to spawn(), which returns the pid; the child,
 * forked by the spawner, gets copies of a->fd[0..nfds) (and closes every
 * other fd), its report pipe as st_fd and the step hook, and _exits with
 * run_role(a). Every wait has a timeout; every child is reaped (reap,
 * KILL_AND_REAP, EXPECT_EXIT0) and the spawner kills what is left. */
#ifndef IPCREF_TEST_PROC_H
#define IPCREF_TEST_PROC_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS       (10000 * slow) /* longest wait for a child's report */
#define POLL_MS       (5000 * slow)  /* longest wait for a death to be seen */
#define REAP_MS       (10000 * slow) /* longest wait for a child to exit */
#define CHILD_ALARM_S 300            /* a child never outlives this */

#include "share_fixture.h" /* also brings tests/harness.h */

/* ------------------------------------------------------------ basics */

static uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* ------------------------------------------------------------ labels */

/* The steps the library names to its test hook (IPCREF_TEST_HOOKS). */
#define NLABELS 12
enum {
  L_ALLOCATE,
  L_EXPORT,
  L_SEND,
  L_RECEIVE,
  L_MAP,
  L_IMPORT,
  L_FORWARD,
  L_RELEASE,
  L_SWEEP,
  L_CHAN_PUSH, /* a record written to the channel, its tail not moved */
  L_CHAN_TAKE, /* a record copied off the channel, its head not moved */
  L_PEER_FREE  /* a peer being freed: what came drained, not closed yet */
};
static const char *const label_names[NLABELS] = {
    "allocate", "export",       "send",         "receive",
    "map",      "import",       "forward",      "release",
    "sweep",    "channel push", "channel take", "peer free"};

/* 1 for the labels only the channel passes (none over the socket only:
 * IPCREF_TEST_PATH=socket, see tests/path.h). */
static __attribute__((unused)) int label_channel_only(int label) {
  return label == L_CHAN_PUSH || label == L_CHAN_TAKE;
}

static int label_index(const char *s) {
  int i;
  for (i = 0; s && i < NLABELS; i++)
    if (strcmp(s, label_names[i]) == 0) return i;
  return -1;
}

/* ------------------------------------------------------------ reports */

/* A child's report: one 8-byte record per write (atomic on a pipe). The
 * kind is an ASCII letter; what each means is the test's. */
typedef struct srec {
  int32_t kind, v;
} srec;

static int st_fd = -1; /* a child's end of its report pipe */

static void st_put(int kind, int v) {
  srec r;
  ssize_t k;
  r.kind = kind;
  r.v = v;
  do k = write(st_fd, &r, sizeof r);
  while (k < 0 && errno == EINTR);
}

/* What the parent has read of one child's reports: for each kind, how many
 * came (n) and the last value (v). Zeroed before use. */
typedef struct clog {
  int n[128], v[128];
  int eof;
} clog;

/* Reads reports until one of `kinds` arrives (1), or EOF or the timeout
 * (0). */
static int clog_wait(int fd, clog *l, const char *kinds, int timeout_ms) {
  long end = now_ms() + timeout_ms;
  for (;;) {
    struct pollfd pf;
    srec r;
    ssize_t k;
    long left = end - now_ms();
    if (l->eof || left < 0) return 0;
    pf.fd = fd;
    pf.events = POLLIN;
    pf.revents = 0;
    k = poll(&pf, 1, (int)left);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return 0;
    do k = read(fd, &r, sizeof r);
    while (k < 0 && errno == EINTR);
    if (k != (ssize_t)sizeof r) {
      l->eof = 1;
      return 0;
    }
    if (r.kind > 0 && r.kind < 128) {
      l->n[r.kind]++;
      l->v[r.kind] = r.v;
      if (strchr(kinds, (char)r.kind)) return 1;
    }
  }
}

/* Everything left in a dead child's pipe. */
static __attribute__((unused)) void clog_drain(int fd, clog *l) {
  while (clog_wait(fd, l, "", 1000)) continue;
}

/* Waits for report `kind` from a child (unless it came already): its
 * value, checked present. */
static __attribute__((unused)) int expect_report_at(int fd, clog *l, char kind,
                                                    const char *who,
                                                    const char *file,
                                                    int line) {
  char kinds[2];
  kinds[0] = kind;
  kinds[1] = 0;
  if (l->n[(int)kind] || clog_wait(fd, l, kinds, WAIT_MS))
    return l->v[(int)kind];
  harness_failures_in_test++;
  printf("    %s:%d: no '%c' report from %s\n", file, line, kind, who);
  return -1;
}
#define EXPECT_REPORT(fd, l, kind, who)                                        \
  expect_report_at(fd, l, kind, who, __FILE__, __LINE__)

/* The label at which the child's hook stopped it ('H'), or -1. */
static __attribute__((unused)) int stopped_at(const clog *l) {
  return l->n['H'] ? l->v['H'] : -1;
}

static void cmd_put(int fd, char c) {
  ssize_t k;
  do k = write(fd, &c, 1);
  while (k < 0 && errno == EINTR);
}

/* A command byte, or 0 on EOF or timeout. */
static char cmd_get(int fd, int timeout_ms) {
  struct pollfd pf;
  char c = 0;
  ssize_t k;
  pf.fd = fd;
  pf.events = POLLIN;
  pf.revents = 0;
  do k = poll(&pf, 1, timeout_ms);
  while (k < 0 && errno == EINTR);
  if (k <= 0) return 0;
  do k = read(fd, &c, 1);
  while (k < 0 && errno == EINTR);
  return k == 1 ? c : 0;
}

/* ------------------------------------------------------------ hooks */

/* The step hook: notes every step in steps_seen (bit 31: a label this
 * header does not know). In a child armed with a target, at the nth
 * passage of that step it reports 'H' (the label), then stays there until
 * it is killed or, with hook_cmd_fd set, waits for the command 'c' to go
 * on. It never calls ipcref. */
static volatile int hook_target = -1, hook_nth = 1;
static int hook_hits, hook_cmd_fd = -1;
static volatile unsigned steps_seen;

static void step_hook(const char *step) {
  int i = label_index(step);
  steps_seen |= 1u << (i < 0 ? 31 : i);
  if (i < 0 || i != hook_target || ++hook_hits != hook_nth) return;
  st_put('H', i);
  if (hook_cmd_fd < 0)
    for (;;) pause();
  if (cmd_get(hook_cmd_fd, WAIT_MS * 3) != 'c') _exit(7);
}

static __attribute__((unused)) void arm(int label, int nth) {
  hook_hits = 0;
  hook_nth = nth;
  hook_target = label;
}

/* ------------------------------------------------------------ children */

/* Closes every fd above 2 but the listed ones (and the ones past the soft
 * limit, which valgrind keeps for itself). */
static void close_fds_except(const int *keep, int nkeep) {
  static int fds[4096];
  struct rlimit rl;
  struct dirent *e;
  int n = 0, i, j;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) rl.rlim_cur = 1024;
  while ((e = readdir(d)) != NULL && n < 4096) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] == '.' || fd <= 2 || fd == dirfd(d) ||
        (rlim_t)fd >= rl.rlim_cur)
      continue;
    for (j = 0; j < nkeep && keep[j] != fd; j++) continue;
    if (j == nkeep) fds[n++] = fd;
  }
  closedir(d);
  for (i = 0; i < n; i++) close(fds[i]);
}

/* A child's body, defined by the test: its return is the exit status. */
static int run_role(const child_args *a);

/* Children come from the spawner, a process forked first thing in main:
 * they start clean (no context, segment, fd or heap block of this process
 * in them), so that a child's own teardown is all that valgrind's leak
 * check sees. The spawner gets a child's fds by SCM_RIGHTS, forks it,
 * reaps it on request, and kills what is left when told to quit or when
 * this process goes. */
enum { SP_SPAWN = 1, SP_WAIT, SP_QUIT };
typedef struct sp_req {
  int32_t op, pid, timeout_ms, pad;
  child_args a;
} sp_req;
typedef struct sp_rep {
  int32_t pid, status;
} sp_rep;
/* Room for a child's fds in one SCM_RIGHTS message. */
typedef union sp_cbuf {
  char buf[CMSG_SPACE(sizeof(int) * CHILD_FDS)];
  struct cmsghdr align;
} sp_cbuf;

static int spawner_sock = -1; /* this process's end */
static pid_t spawner_pid = -1;

static void spawner_main(int sock) {
  static pid_t live[256];
  int nlive = 0, i;
  for (;;) {
    sp_cbuf u;
    struct msghdr mh;
    struct iovec iov;
    struct cmsghdr *c;
    sp_req q;
    sp_rep rep;
    int fds[CHILD_FDS], nfds = 0;
    ssize_t k;
    memset(&mh, 0, sizeof mh);
    iov.iov_base = &q;
    iov.iov_len = sizeof q;
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof u.buf;
    do k = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    while (k < 0 && errno == EINTR);
    for (c = k > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)nfds);
      }
    if (k != (ssize_t)sizeof q || q.op == SP_QUIT) break;
    rep.pid = -1;
    rep.status = -1;
    if (q.op == SP_SPAWN && nfds == q.a.nfds && nlive < 256) {
      pid_t pid;
      for (i = 0; i < nfds; i++) q.a.fd[i] = fds[i];
      pid = fork();
      if (pid == 0) {
        close(sock);
        close_fds_except(q.a.fd, q.a.nfds);
        st_fd = q.a.fd[0];
        ipcref_test_set_step_hook(step_hook);
        alarm(CHILD_ALARM_S);
        _exit(run_role(&q.a));
      }
      if (pid > 0) live[nlive++] = pid;
      rep.pid = (int32_t)pid;
    } else if (q.op == SP_WAIT) {
      rep.pid = q.pid;
      rep.status = wait_child(q.pid, q.timeout_ms);
      for (i = 0; i < nlive; i++)
        if (live[i] == q.pid) live[i] = live[--nlive];
    }
    for (i = 0; i < nfds; i++) close(fds[i]);
    if (send(sock, &rep, sizeof rep, MSG_NOSIGNAL) != (ssize_t)sizeof rep)
      break;
  }
  for (i = 0; i < nlive; i++) kill(live[i], SIGKILL);
  for (i = 0; i < nlive; i++) waitpid(live[i], NULL, 0);
  close(sock);
  _exit(0);
}

/* Starts the spawner: first thing in main, before anything is allocated. */
static int spawner_start(void) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  spawner_pid = fork();
  if (spawner_pid < 0) return -1;
  if (spawner_pid == 0) {
    close(sv[0]);
    spawner_main(sv[1]);
  }
  close(sv[1]);
  spawner_sock = sv[0];
  return 0;
}

/* Tells the spawner to quit (it kills what is left): its wait status, 0
 * when it exited cleanly, or -1. */
static int spawner_stop(void) {
  sp_req q;
  memset(&q, 0, sizeof q);
  q.op = SP_QUIT;
  (void)send(spawner_sock, &q, sizeof q, MSG_NOSIGNAL);
  close(spawner_sock);
  return wait_child(spawner_pid, REAP_MS);
}

static sp_rep spawner_call(sp_req *q, const int *fds, int nfds, int wait_ms) {
  sp_cbuf u;
  struct msghdr mh;
  struct iovec iov;
  struct pollfd pf;
  sp_rep rep;
  memset(&mh, 0, sizeof mh);
  memset(&u, 0, sizeof u);
  rep.pid = rep.status = -1;
  iov.iov_base = q;
  iov.iov_len = sizeof *q;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds > 0) {
    struct cmsghdr *c;
    mh.msg_control = u.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  if (sendmsg(spawner_sock, &mh, MSG_NOSIGNAL) != (ssize_t)sizeof *q)
    return rep;
  pf.fd = spawner_sock;
  pf.events = POLLIN;
  pf.revents = 0;
  if (poll(&pf, 1, wait_ms) != 1 ||
      recv(spawner_sock, &rep, sizeof rep, 0) != (ssize_t)sizeof rep)
    rep.pid = rep.status = -1;
  return rep;
}

/* Starts a child with the fds a->fd[0..nfds) (its own copies: the caller
 * closes its ends after). */
static pid_t spawn(child_args *a) {
  sp_req q;
  sp_rep rep;
  memset(&q, 0, sizeof q);
  q.op = SP_SPAWN;
  q.a = *a;
  rep = spawner_call(&q, a->fd, a->nfds, WAIT_MS);
  if (rep.pid <= 0) CHECK(!"spawn");
  return rep.pid;
}

/* Waits for the child to end (killing it after timeout_ms): its wait
 * status, or -1. */
static int reap(pid_t pid, int timeout_ms) {
  sp_req q;
  if (pid <= 0) return -1;
  memset(&q, 0, sizeof q);
  q.op = SP_WAIT;
  q.pid = pid;
  q.timeout_ms = timeout_ms;
  return spawner_call(&q, NULL, 0, timeout_ms + 10000 * slow).status;
}

/* Children of the spawner are reaped through it: the fixture's checks on
 * the status reap() gives. */
#define KILL_AND_REAP(pid, who)                                                \
  do {                                                                         \
    pid_t kill_pid = (pid);                                                    \
    if (kill_pid > 0) {                                                        \
      kill(kill_pid, SIGKILL);                                                 \
      sigkilled_at(reap(kill_pid, REAP_MS), kill_pid, who, __FILE__,           \
                   __LINE__);                                                  \
    }                                                                          \
  } while (0)
#undef EXPECT_EXIT0
#define EXPECT_EXIT0(pid, who)                                                 \
  exit0_at(reap(pid, REAP_MS), who, __FILE__, __LINE__)

/* ------------------------------------------------------------ data */

/* A block is u64 words: word 0 names its seed, word i a function of seed
 * and i. Anyone can check a block without being told which it is. */
#define BLOCK_MAGIC 0xB10C000000000000ull

static uint64_t word_of(uint32_t s, size_t i) {
  return mix64(((uint64_t)s << 32) ^ (uint64_t)i);
}

static ipcref_result new_block(ipcref_ctx *ctx, size_t bytes, uint32_t s,
                               ipcref_view *out) {
  int64_t shape[1];
  uint64_t *w;
  size_t i, n = bytes / 8;
  ipcref_result r;
  shape[0] = (int64_t)n;
  memset(out, 0, sizeof *out);
  r = ipcref_view_new_shared(ctx, IPCREF_U64, 1, shape, out);
  if (r != IPCREF_OK) return r;
  w = (uint64_t *)ipcref_view_data_mut(out);
  if (!w) return IPCREF_EINVAL;
  w[0] = BLOCK_MAGIC | s;
  for (i = 1; i < n; i++) w[i] = word_of(s, i);
  return IPCREF_OK;
}

/* A fresh shared block filled with 0xEE: no block's pattern. */
static ipcref_result new_scribble(ipcref_ctx *ctx, size_t bytes,
                                  ipcref_view *out) {
  int64_t shape[1];
  void *w;
  ipcref_result r;
  shape[0] = (int64_t)(bytes / 8);
  memset(out, 0, sizeof *out);
  r = ipcref_view_new_shared(ctx, IPCREF_U64, 1, shape, out);
  if (r != IPCREF_OK) return r;
  if ((w = ipcref_view_data_mut(out)) == NULL) return IPCREF_EINVAL;
  memset(w, 0xEE, bytes / 8 * 8);
  return IPCREF_OK;
}

/* Words of block `s` that differ from its pattern; `s` 0 takes the seed
 * from the block. Not a block (unreadable, or no seed in word 0 to take):
 * 1, or all of its words. Never negative: sums of it add up. */
static long check_view(const ipcref_view *v, uint32_t s) {
  const int64_t zero[1] = {0};
  const uint64_t *w;
  size_t i, n;
  long bad = 0;
  if (!v->buf || v->dtype != IPCREF_U64 || v->ndim != 1 || v->shape[0] < 1)
    return 1;
  w = (const uint64_t *)ipcref_view_ptr(v, zero);
  if (!w) return 1;
  n = (size_t)v->shape[0];
  if (s == 0) {
    if ((w[0] & 0xFFFFFFFF00000000ull) != BLOCK_MAGIC) return (long)n;
    s = (uint32_t)w[0];
  }
  bad += w[0] != (BLOCK_MAGIC | s);
  for (i = 1; i < n; i++) bad += w[i] != word_of(s, i);
  return bad;
}

/* ------------------------------------------------------------ the holder */

/* A child's role both tests give the last process of a chain: receives
 * views on `sock` until it has `max` (HOLD_MAX at most) or the sender
 * hangs up, and checks block i against seed `seed0 + i` (`seed0` 0: the
 * seed each block names); reports 'C' (views held) and 'B' (words that
 * differ), then obeys commands on `cmd`: 'v' verify again ('V'), 'r' let
 * go of all ('R'), 'x' leave (exit 0); silence or EOF: exit 3. Any error
 * but the sender's hang-up is reported 'E'. A sender that died before its
 * hello is one that sent nothing where `early_death_ok`, else exit 2. */
#define HOLD_MAX 64

static int run_holder(int sock, int cmd, int max, uint32_t seed0,
                      int early_death_ok) {
  static ipcref_view v[HOLD_MAX];
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  int n = 0, i;
  long bad = 0;
  if (max > HOLD_MAX) max = HOLD_MAX;
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK) return 2;
  if (ipcref_peer_new(ctx, sock, &p) != IPCREF_OK) {
    if (!early_death_ok) return 2;
    close(sock);
    p = NULL;
  }
  while (p && n < max) {
    ipcref_result r = ipcref_recv(p, &v[n], WAIT_MS);
    if (r != IPCREF_OK) {
      if (r != IPCREF_EPEER) st_put('E', r);
      break;
    }
    bad += check_view(&v[n], seed0 ? seed0 + (uint32_t)n : 0);
    n++;
  }
  st_put('C', n);
  st_put('B', (int)bad);
  for (;;) {
    switch (cmd_get(cmd, WAIT_MS * 3)) {
    case 'v':
      for (bad = 0, i = 0; i < n; i++)
        bad += check_view(&v[i], seed0 ? seed0 + (uint32_t)i : 0);
      st_put('V', (int)bad);
      break;
    case 'r':
      for (i = 0; i < n; i++) ipcref_view_release(&v[i]);
      st_put('R', 0);
      break;
    case 'x':
      for (i = 0; i < n; i++) ipcref_view_release(&v[i]);
      ipcref_peer_free(p);
      ipcref_ctx_free(ctx);
      return 0;
    default: return 3; /* the parent is gone or silent */
    }
  }
}

/* ------------------------------------------------------------ context */

/* 1 where pidfd_open works (Linux 5.3; valgrind 3.19 lacks it): then the
 * poll fd must wake on a death; without it the library sees deaths by
 * kill(pid, 0), on ipcref_collect or ipcref_ctx_poll. */
static int have_pidfd;

static void probe_pidfd(void) {
#ifdef SYS_pidfd_open
  int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
  have_pidfd = fd >= 0;
  if (fd >= 0) close(fd);
#endif
}

/* Waits until the ctx's poll fd is readable: 1, or 0 after timeout_ms. */
static int poll_fd_readable(ipcref_ctx *ctx, int timeout_ms) {
  struct pollfd pf;
  int k;
  pf.fd = ipcref_ctx_poll_fd(ctx);
  pf.events = POLLIN;
  pf.revents = 0;
  if (pf.fd < 0) return 0;
  do k = poll(&pf, 1, timeout_ms);
  while (k < 0 && errno == EINTR);
  return k == 1 && (pf.revents & POLLIN);
}

/* After a watched process was killed and reaped, what an event loop does:
 * the poll fd must wake (where there are pidfds), and ipcref_ctx_poll must
 * have a death to handle (it reclaims what the dead held). */
static void expect_death_seen_at(ipcref_ctx *ctx, size_t *freed,
                                 const char *file, int line) {
  ipcref_result r;
  if (have_pidfd && !poll_fd_readable(ctx, POLL_MS)) {
    harness_failures_in_test++;
    printf("    %s:%d: the poll fd did not wake on the death\n", file, line);
  }
  r = ipcref_ctx_poll(ctx, have_pidfd ? POLL_MS : 0, freed);
  if (r != IPCREF_OK) {
    harness_failures_in_test++;
    printf("    %s:%d: ipcref_ctx_poll: %s, expected a death\n", file, line,
           ipcref_strerror(r));
  }
}
#define EXPECT_DEATH_SEEN(ctx, freed)                                          \
  expect_death_seen_at(ctx, freed, __FILE__, __LINE__)

/* Collects until at most `want` leases are live: the ms it took, or -1
 * after timeout_ms. */
static long wait_live_slots(ipcref_ctx *ctx, size_t want, int timeout_ms) {
  long t0 = now_ms();
  for (;;) {
    ipcref_stats s;
    ipcref_collect(ctx);
    if (ipcref_ctx_stats(ctx, &s) == IPCREF_OK && s.live_slots <= want)
      return now_ms() - t0;
    if (now_ms() - t0 > timeout_ms) return -1;
    sleep_us(2000);
  }
}

/* ------------------------------------------------------------ start */

/* First thing in main: notes valgrind (the children inherit it) and sets
 * the timeouts, starts the spawner, probes pidfd_open, ignores SIGPIPE
 * (here: the children keep the default). 0, or -1 without a spawner. */
static int proc_start(void) {
  fixture_start();
  if (spawner_start() != 0) return -1;
  probe_pidfd();
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

#endif
