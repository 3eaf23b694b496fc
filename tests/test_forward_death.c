/* A second forwarder that dies at its forward, and the returns that come
 * after a death was reaped.
 *
 *   1. A chain A -> B -> C -> D of real processes: A (this process) shares
 *      blocks of several sizes with B (small size classes, and one larger
 *      than half a segment: a segment of its own); B forwards them to C
 *      and lets go; A sweeps (ipcref_collect), so it knows C's leases; then
 *      C forwards them to D and dies at each step of that forward: just
 *      before it, at "forward" (a link half written, first and last view),
 *      at "send" (links written, message not sent), after the message
 *      reached D (SIGKILL), at "release" (letting go of its own after the
 *      forward), or by exiting 0 after letting go. A sees the death only
 *      through its event loop: poll() on ipcref_ctx_poll_fd, then
 *      ipcref_ctx_poll (never ipcref_collect before it). Then A allocates
 *      and fills fresh blocks of the same sizes, and D checks that every
 *      word it holds is still the original pattern. A must count no bad
 *      return and no late one, keep exactly the forwards named for D
 *      (those D got, and those C linked but never sent, until D is gone),
 *      and have everything back (no live slot, empty limbo) once D lets go
 *      (ipcref_collect) or, for what never reached it, dies.
 *   2. Late returns: B forwards to C after C died, and A has reaped the
 *      forward (C's lease reclaimed) before B cancels it: by ipcref_send
 *      stopped at "send" until A reaped (the send then fails, EPEER, and
 *      cancels), or by ipcref_export and a later ipcref_msg_free. A counts
 *      one late return (stats.late_returns) and no bad one; a second,
 *      identical return (B frees a copy of the message: a forged return)
 *      is counted in stats.bad_returns and reported to the error hook.
 *
 * On the code before the fix of the death's reap (d80863b: a dead
 * forwarder's links sit in the ring of the ledger it received through,
 * and the reap reclaimed its leases before reading that ring), part 1
 * fails: A frees D's blocks under it (D reads the fresh blocks' bytes,
 * bad_returns goes up) or drops the holds C linked for D; part 2 counts
 * the late return as bad. Build with -DFWD_NO_LATE_RETURNS against such a
 * header (its ipcref_stats has no late_returns) to see it.
 *
 * Children come from a spawner forked first thing in main (they start with
 * nothing of this process: valgrind's leak check sees only their own),
 * report through pipes (8-byte records) and take commands from pipes;
 * every wait has a timeout and every child is reaped. Under valgrind
 * (IPCREF_UNDER_VALGRIND=1) there is no pidfd_open: the poll fd never
 * wakes, and ipcref_ctx_poll sees a death by kill(pid, 0) once the child
 * is reaped. */
#define _GNU_SOURCE
#define IPCREF_TEST_HOOKS
#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

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

#include "harness.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static int under_valgrind;
static int slow = 1; /* timeouts are multiplied by this */

#define WAIT_MS       (10000 * slow) /* longest wait for a child's report */
#define POLL_MS       (5000 * slow)  /* longest wait for a death to be seen */
#define REAP_MS       (10000 * slow) /* longest wait for a child to exit */
#define CHILD_ALARM_S 300            /* a child never outlives this */

/* ------------------------------------------------------------ basics */

static long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_us(long us) {
  struct timespec d;
  d.tv_sec = us / 1000000;
  d.tv_nsec = (us % 1000000) * 1000;
  while (nanosleep(&d, &d) != 0 && errno == EINTR) continue;
}

static uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* ------------------------------------------------------------ labels */

#define NLABELS 9
enum {
  L_ALLOCATE,
  L_EXPORT,
  L_SEND,
  L_RECEIVE,
  L_MAP,
  L_IMPORT,
  L_FORWARD,
  L_RELEASE,
  L_SWEEP
};
static const char *const label_names[NLABELS] = {
    "allocate", "export",  "send",    "receive", "map",
    "import",   "forward", "release", "sweep"};

static int label_index(const char *s) {
  int i;
  for (i = 0; s && i < NLABELS; i++)
    if (strcmp(s, label_names[i]) == 0) return i;
  return -1;
}

/* ------------------------------------------------------------ reports */

/* A child's report: one 8-byte record per write (atomic on a pipe). */
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

/* What the parent has read of one child's reports: for each kind (an
 * ASCII letter), how many came and the last value. */
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
    }
    if (r.kind > 0 && r.kind < 128 && strchr(kinds, (char)r.kind)) return 1;
  }
}

/* Waits for report `kind` from a child: its value, checked present. */
static int expect_report_at(int fd, clog *l, char kind, const char *who,
                            int line) {
  char kinds[2];
  kinds[0] = kind;
  kinds[1] = 0;
  if (l->n[(int)kind] || clog_wait(fd, l, kinds, WAIT_MS))
    return l->v[(int)kind];
  harness_failures_in_test++;
  printf("    %s:%d: no '%c' report from %s\n", __FILE__, line, kind, who);
  return -1;
}
#define EXPECT_REPORT(fd, l, kind, who)                                        \
  expect_report_at(fd, l, kind, who, __LINE__)

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

/* The step hook of a child armed with a target: at the nth passage of
 * that step it reports 'H' (the label), then either stays there until it
 * is killed or, with hook_cmd_fd set, waits for the command 'c' to go on.
 * It never calls ipcref. */
static volatile int hook_target = -1, hook_nth = 1;
static int hook_hits, hook_cmd_fd = -1;

static void step_hook(const char *step) {
  int i = label_index(step);
  if (i < 0 || i != hook_target || ++hook_hits != hook_nth) return;
  st_put('H', i);
  if (hook_cmd_fd < 0)
    for (;;) pause();
  if (cmd_get(hook_cmd_fd, WAIT_MS * 3) != 'c') _exit(7);
}

static void arm(int label, int nth) {
  hook_hits = 0;
  hook_nth = nth;
  hook_target = label;
}

/* What the library reports through the error hook (in this process). */
static int err_count;
static char err_last[200];

static void on_error(void *user, ipcref_result code, const char *msg) {
  (void)user;
  err_count++;
  snprintf(err_last, sizeof err_last, "%s (%s)", msg ? msg : "?",
           ipcref_strerror(code));
}
static const ipcref_error_hook error_hook = {on_error, NULL};

#define EXPECT_ERRORS(n)                                                       \
  do {                                                                         \
    if (err_count != (n))                                                      \
      printf("    %d error report(s), last: %s\n", err_count, err_last);       \
    CHECK_EQ(err_count, (n));                                                  \
    err_count = 0;                                                             \
    err_last[0] = 0;                                                           \
  } while (0)

/* ------------------------------------------------------------ resources */

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int n = 0;
  if (!d) return -1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own fd */
}

/* Mappings of memfds (segments and ledgers), read with read(2). */
static int count_memfd_maps(void) {
  static char buf[1 << 16];
  static const char pat[] = "/memfd:";
  size_t m = 0;
  ssize_t n, i;
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC), count = 0;
  if (fd < 0) return -1;
  while ((n = read(fd, buf, sizeof buf)) > 0)
    for (i = 0; i < n; i++) {
      m = buf[i] == pat[m] ? m + 1 : buf[i] == pat[0] ? 1 : 0;
      if (m == sizeof pat - 1) count++, m = 0;
    }
  close(fd);
  return count;
}

typedef struct res_mark {
  int fds, memfd_maps;
} res_mark;

static void res_begin(res_mark *m) {
  m->fds = count_fds();
  m->memfd_maps = count_memfd_maps();
}

static void res_end_at(const res_mark *m, int line) {
  int fds = count_fds(), maps = count_memfd_maps();
  if (fds != m->fds) {
    printf("    %s:%d: open fds %d, %d before\n", __FILE__, line, fds, m->fds);
    harness_failures_in_test++;
  }
  if (maps != m->memfd_maps) {
    printf("    %s:%d: memfd mappings %d, %d before\n", __FILE__, line, maps,
           m->memfd_maps);
    harness_failures_in_test++;
  }
}
#define RES_END(m) res_end_at(m, __LINE__)

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

/* What a child gets: its role, its fds (fd[0] its report pipe, fd[1] its
 * command pipe, then its sockets) and its parameters. */
enum { R_B, R_C, R_D, R_LATE_B, R_HELLO };
#define CHILD_FDS 6
typedef struct child_args {
  int32_t role, nfds, label, nth, mode;
  int32_t fd[CHILD_FDS];
} child_args;

static int run_role(const child_args *a);

/* The spawner gets a child's fds by SCM_RIGHTS, forks it, reaps it on
 * request, and kills what is left when told to quit or when this process
 * goes. */
enum { SP_SPAWN = 1, SP_WAIT, SP_QUIT };
typedef struct sp_req {
  int32_t op, pid, timeout_ms, pad;
  child_args a;
} sp_req;
typedef struct sp_rep {
  int32_t pid, status;
} sp_rep;

static int spawner_sock = -1; /* this process's end */
static pid_t spawner_pid = -1;

/* Waits for child pid, killing it after timeout_ms: its status, or -1. */
static int wait_child(pid_t pid, int timeout_ms) {
  int st = 0;
  long end = now_ms() + timeout_ms;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 && errno != EINTR) return -1;
    if (now_ms() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    sleep_us(300);
  }
}

static void spawner_main(int sock) {
  static pid_t live[64];
  int nlive = 0, i;
  for (;;) {
    union {
      char buf[CMSG_SPACE(sizeof(int) * CHILD_FDS)];
      struct cmsghdr align;
    } u;
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
    if (q.op == SP_SPAWN && nfds == q.a.nfds && nlive < 64) {
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

static int spawner_stop(void) {
  sp_req q;
  memset(&q, 0, sizeof q);
  q.op = SP_QUIT;
  (void)send(spawner_sock, &q, sizeof q, MSG_NOSIGNAL);
  close(spawner_sock);
  return wait_child(spawner_pid, REAP_MS);
}

static sp_rep spawner_call(sp_req *q, const int *fds, int nfds, int wait_ms) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * CHILD_FDS)];
    struct cmsghdr align;
  } u;
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

static void kill_and_reap_at(pid_t pid, const char *who, int line) {
  int st;
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  st = reap(pid, REAP_MS);
  if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
    harness_failures_in_test++;
    printf("    %s:%d: %s was not killed by SIGKILL (status %#x)\n", __FILE__,
           line, who, st);
  }
}
#define KILL_AND_REAP(pid, who) kill_and_reap_at(pid, who, __LINE__)

static void expect_exit0_at(pid_t pid, const char *who, int line) {
  int st = reap(pid, REAP_MS);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    harness_failures_in_test++;
    if (st != -1 && WIFSIGNALED(st))
      printf("    %s:%d: %s killed by signal %d\n", __FILE__, line, who,
             WTERMSIG(st));
    else
      printf("    %s:%d: %s exited with %d\n", __FILE__, line, who,
             st == -1 ? -1 : WEXITSTATUS(st));
  }
}
#define EXPECT_EXIT0(pid, who) expect_exit0_at(pid, who, __LINE__)

/* A child's channels: its report pipe, its command pipe. */
typedef struct chan {
  int st[2], cmd[2];
  clog log;
} chan;

static int chan_open(chan *c) {
  memset(c, 0, sizeof *c);
  c->st[0] = c->st[1] = c->cmd[0] = c->cmd[1] = -1;
  if (pipe2(c->st, O_CLOEXEC) == 0 && pipe2(c->cmd, O_CLOEXEC) == 0) return 0;
  CHECK(!"pipe");
  return -1;
}

/* Starts a child on channel c with the sockets s[0..n) (closed here). */
static pid_t chan_spawn(chan *c, int role, const int *s, int n, int label,
                        int nth, int mode) {
  child_args a;
  pid_t pid;
  int i;
  memset(&a, 0, sizeof a);
  a.role = role;
  a.nfds = 2 + n;
  a.fd[0] = c->st[1];
  a.fd[1] = c->cmd[0];
  for (i = 0; i < n; i++) a.fd[2 + i] = s[i];
  a.label = label;
  a.nth = nth;
  a.mode = mode;
  pid = spawn(&a);
  close(c->st[1]);
  close(c->cmd[0]);
  c->st[1] = c->cmd[0] = -1;
  for (i = 0; i < n; i++) close(s[i]);
  return pid;
}

static void chan_close(chan *c) {
  if (c->st[0] >= 0) close(c->st[0]);
  if (c->cmd[1] >= 0) close(c->cmd[1]);
  c->st[0] = c->cmd[1] = -1;
}

static int xsocketpair(int sv[2]) {
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0) return 0;
  CHECK(!"socketpair");
  sv[0] = sv[1] = -1;
  return -1;
}

/* ------------------------------------------------------------ data */

/* A block is u64 words: word 0 names its seed, word i a function of seed
 * and i. */
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

/* Words of block `s` that differ from its pattern (all of them when the
 * view is not one). */
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
  bad += w[0] != (BLOCK_MAGIC | s);
  for (i = 1; i < n; i++) bad += w[i] != word_of(s, i);
  return bad;
}

/* The blocks of the chain: small size classes, and one larger than half
 * a segment (a segment of its own). Each small class also has an anchor
 * block that A holds throughout, so that the class's segment never
 * empties: a block freed there is the next one A allocates. */
#define SEGMENT (1u << 20)
#define NV      5
#define SEED    300u
static const size_t sizes[NV] = {64, 1000, 4096, 40000, 600 * 1024};

/* ------------------------------------------------------------ context */

static ipcref_ctx *new_ctx(void) {
  ipcref_ctx_options o;
  ipcref_ctx *ctx = NULL;
  memset(&o, 0, sizeof o);
  o.segment_size = SEGMENT;
  o.ledger_slots = 64;
  o.error_hook = error_hook;
  CHECK_EQ(ipcref_ctx_new(&o, &ctx), IPCREF_OK);
  return ctx;
}

static ipcref_stats stats_of(ipcref_ctx *ctx) {
  ipcref_stats s;
  memset(&s, 0, sizeof s);
  CHECK_EQ(ipcref_ctx_stats(ctx, &s), IPCREF_OK);
  return s;
}

/* A check of stats.late_returns; none with -DFWD_NO_LATE_RETURNS (a
 * header from before it: see the top). */
#ifdef FWD_NO_LATE_RETURNS
#define CHECK_LATE(s, n) ((void)(s))
#else
#define CHECK_LATE(s, n) CHECK_EQ((s).late_returns, (n))
#endif

static void print_stats(const char *what, const ipcref_stats *s) {
  printf("    %s: live_bufs %zu limbo %zu (%zu bytes) live_slots %zu "
         "counter_files %zu peers %zu deaths %llu reclaimed %llu bad_returns "
         "%llu refused %llu",
         what, s->live_bufs, s->limbo_blocks, s->limbo_bytes, s->live_slots,
         s->counter_files, s->peers, (unsigned long long)s->peer_deaths,
         (unsigned long long)s->reclaimed, (unsigned long long)s->bad_returns,
         (unsigned long long)s->refused);
#ifndef FWD_NO_LATE_RETURNS
  printf(" late_returns %llu", (unsigned long long)s->late_returns);
#endif
  printf("\n");
}

/* 1 where pidfd_open works (valgrind 3.19 lacks it): then the poll fd
 * must wake on a death. */
static int have_pidfd;

static void probe_pidfd(void) {
#ifdef SYS_pidfd_open
  int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
  have_pidfd = fd >= 0;
  if (fd >= 0) close(fd);
#endif
}

/* The event loop of A: waits for the poll fd to be readable (where there
 * are pidfds), then ipcref_ctx_poll, which must have a death to handle. */
static void event_loop_at(ipcref_ctx *ctx, size_t *freed, int line) {
  struct pollfd pf;
  ipcref_result r;
  int k;
  pf.fd = ipcref_ctx_poll_fd(ctx);
  pf.events = POLLIN;
  pf.revents = 0;
  if (have_pidfd) {
    do k = poll(&pf, 1, POLL_MS);
    while (k < 0 && errno == EINTR);
    if (k != 1 || !(pf.revents & POLLIN)) {
      harness_failures_in_test++;
      printf("    %s:%d: the poll fd did not wake on the death\n", __FILE__,
             line);
    }
  }
  r = ipcref_ctx_poll(ctx, have_pidfd ? POLL_MS : 0, freed);
  if (r != IPCREF_OK) {
    harness_failures_in_test++;
    printf("    %s:%d: ipcref_ctx_poll: %s, expected a death\n", __FILE__, line,
           ipcref_strerror(r));
  }
}
#define EVENT_LOOP(ctx, freed) event_loop_at(ctx, freed, __LINE__)

/* Collects until at most `want` leases are live: 1, or 0 after timeout. */
static int wait_live_slots(ipcref_ctx *ctx, size_t want, int timeout_ms) {
  long end = now_ms() + timeout_ms;
  for (;;) {
    ipcref_stats s;
    ipcref_collect(ctx);
    if (ipcref_ctx_stats(ctx, &s) == IPCREF_OK && s.live_slots <= want)
      return 1;
    if (now_ms() > end) return 0;
    sleep_us(2000);
  }
}

/* ------------------------------------------------------------ children */

/* B: receives the NV blocks from A, forwards them to C in one message
 * ('f': the result), lets go ('R'), and lives until told to leave ('x'). */
static int b_child(const child_args *a) {
  int cmd = a->fd[1], n, i;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pa = NULL, *pc = NULL;
  ipcref_view v[NV];
  ipcref_result r = IPCREF_OK;
  long bad = 0;
  memset(v, 0, sizeof v);
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[2], &pa) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[3], &pc) != IPCREF_OK)
    return 2;
  for (n = 0; n < NV; n++) {
    r = ipcref_recv(pa, &v[n], WAIT_MS);
    if (r != IPCREF_OK) break;
    bad += check_view(&v[n], SEED + (uint32_t)n);
  }
  st_put('B', (int)bad);
  if (n == NV) r = ipcref_send_batch(pc, v, NV);
  st_put('f', r);
  for (i = 0; i < n; i++) ipcref_view_release(&v[i]);
  st_put('R', 0);
  if (cmd_get(cmd, WAIT_MS * 3) != 'x') return 3;
  ipcref_peer_free(pa);
  ipcref_peer_free(pc);
  ipcref_ctx_free(ctx);
  return 0;
}

/* How C ends: stays where it stands (killed there: at its hook, or after
 * the forward), or lets go of its own views after the forward (its hook
 * at "release" stops it there) and, for C_EXIT, leaves with exit 0. */
enum { C_BEFORE, C_HOLD, C_RELEASE, C_EXIT };

/* C: receives the NV blocks from B ('C': how many, 'B': words that
 * differ), waits for A's go ('g'), then forwards them all to D in one
 * message ('f': the result), its hook armed at the case's step. */
static int c_child(const child_args *a) {
  int cmd = a->fd[1], n, i;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pb = NULL, *pd = NULL;
  ipcref_view v[NV];
  ipcref_result r = IPCREF_OK;
  long bad = 0;
  memset(v, 0, sizeof v);
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[2], &pb) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[3], &pd) != IPCREF_OK)
    return 2;
  for (n = 0; n < NV; n++) {
    r = ipcref_recv(pb, &v[n], WAIT_MS);
    if (r != IPCREF_OK) break;
    bad += check_view(&v[n], SEED + (uint32_t)n);
  }
  st_put('C', n);
  st_put('B', (int)bad);
  if (cmd_get(cmd, WAIT_MS * 3) != 'g') return 3;
  if (a->mode == C_BEFORE) { /* at the forward, not into it */
    st_put('W', 0);
    for (;;) pause();
  }
  arm(a->label, a->nth);
  r = ipcref_send_batch(pd, v, n);
  st_put('f', r);
  if (a->mode == C_HOLD)
    for (;;) pause();
  for (i = 0; i < n; i++) ipcref_view_release(&v[i]);
  st_put('R', 0);
  if (a->mode != C_EXIT)
    for (;;) pause();
  ipcref_peer_free(pb);
  ipcref_peer_free(pd);
  ipcref_ctx_free(ctx);
  return r == IPCREF_OK && bad == 0 ? 0 : 4;
}

/* D: receives from C until it has NV views or C is gone ('C': how many,
 * 'B': words that differ), then obeys: 'v' verify again ('V'), 'r' let go
 * ('R'), 'x' leave (exit 0). */
static int d_child(const child_args *a) {
  int cmd = a->fd[1], n, i;
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pc = NULL;
  ipcref_view v[NV];
  long bad = 0;
  memset(v, 0, sizeof v);
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[2], &pc) != IPCREF_OK)
    return 2;
  for (n = 0; n < NV; n++) {
    ipcref_result r = ipcref_recv(pc, &v[n], WAIT_MS);
    if (r != IPCREF_OK) {
      if (r != IPCREF_EPEER) st_put('E', r); /* C hung up: expected */
      break;
    }
    bad += check_view(&v[n], SEED + (uint32_t)n);
  }
  st_put('C', n);
  st_put('B', (int)bad);
  for (;;) {
    switch (cmd_get(cmd, WAIT_MS * 3)) {
    case 'v':
      for (bad = 0, i = 0; i < n; i++)
        if (v[i].buf) bad += check_view(&v[i], SEED + (uint32_t)i);
      st_put('V', (int)bad);
      break;
    case 'r':
      for (i = 0; i < n; i++) ipcref_view_release(&v[i]);
      st_put('R', 0);
      break;
    case 'x':
      for (i = 0; i < n; i++) ipcref_view_release(&v[i]);
      ipcref_peer_free(pc);
      ipcref_ctx_free(ctx);
      return 0;
    default: return 3; /* the parent is gone or silent */
    }
  }
}

/* ------------------------------------------------------------ 1. chain */

typedef struct fcase {
  const char *what;
  int label, nth; /* where C's hook stops it (-1: nowhere) */
  int mode;       /* C_BEFORE, C_HOLD, C_RELEASE, C_EXIT */
  int named;      /* forwards A keeps for D once C is dead */
  int got;        /* views D receives */
  int reclaimed;  /* C's leases A takes back from the dead */
} fcase;

static void chain_case(const fcase *fc) {
  int fails = harness_failures_in_test;
  int ab[2], bc[2], cd[2], s[2], i;
  chan cb, cc, cdd;
  pid_t b, c, d;
  res_mark m;
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_view v[NV], anchor[NV], fresh[2 * NV];
  ipcref_stats s0, s1, s2;
  size_t freed = 0;
  memset(v, 0, sizeof v);
  memset(anchor, 0, sizeof anchor);
  memset(fresh, 0, sizeof fresh);
  res_begin(&m);
  if (xsocketpair(ab) || xsocketpair(bc) || xsocketpair(cd) || chan_open(&cb) ||
      chan_open(&cc) || chan_open(&cdd))
    return;
  d = chan_spawn(&cdd, R_D, &cd[1], 1, -1, 0, 0);
  s[0] = bc[1];
  s[1] = cd[0];
  c = chan_spawn(&cc, R_C, s, 2, fc->label, fc->nth, fc->mode);
  s[0] = ab[1];
  s[1] = bc[0];
  b = chan_spawn(&cb, R_B, s, 2, -1, 0, 0);

  /* A shares the blocks with B and lets go of its own references. */
  ctx = new_ctx();
  CHECK_EQ(ipcref_peer_new(ctx, ab[0], &p), IPCREF_OK);
  for (i = 0; i < NV; i++)
    if (sizes[i] <= SEGMENT / 2)
      CHECK_EQ(new_scribble(ctx, sizes[i], &anchor[i]), IPCREF_OK);
  for (i = 0; i < NV; i++)
    CHECK_EQ(new_block(ctx, sizes[i], SEED + (uint32_t)i, &v[i]), IPCREF_OK);
  CHECK_EQ(ipcref_send_batch(p, v, NV), IPCREF_OK);
  for (i = 0; i < NV; i++) ipcref_view_release(&v[i]);

  /* B forwarded them to C and let go; C holds them. */
  CHECK_EQ(EXPECT_REPORT(cb.st[0], &cb.log, 'R', "B"), 0);
  CHECK_EQ(cb.log.v['f'], IPCREF_OK);
  CHECK_EQ(cb.log.v['B'], 0);
  CHECK_EQ(EXPECT_REPORT(cc.st[0], &cc.log, 'B', "C"), 0);
  CHECK_EQ(cc.log.v['C'], NV);

  /* A sweeps: now it knows C's leases. */
  ipcref_collect(ctx);
  s0 = stats_of(ctx);
  CHECK_EQ(s0.live_slots, NV);
  CHECK_EQ(s0.limbo_blocks, NV);
  CHECK_EQ(s0.bad_returns, 0);

  /* C forwards to D and dies. From here to the event loop, A makes no
   * call on its context. */
  cmd_put(cc.cmd[1], 'g');
  if (fc->mode == C_BEFORE) {
    CHECK_EQ(EXPECT_REPORT(cc.st[0], &cc.log, 'W', "C"), 0);
  } else if (fc->label >= 0) {
    CHECK_EQ(EXPECT_REPORT(cc.st[0], &cc.log, 'H', "C"), fc->label);
  } else {
    CHECK_EQ(EXPECT_REPORT(cc.st[0], &cc.log, 'f', "C"), IPCREF_OK);
  }
  if (fc->got) /* the message reached D, which checked it */
    CHECK_EQ(EXPECT_REPORT(cdd.st[0], &cdd.log, 'B', "D"), 0);
  if (fc->mode == C_EXIT) {
    CHECK_EQ(EXPECT_REPORT(cc.st[0], &cc.log, 'R', "C"), 0);
    EXPECT_EXIT0(c, "C");
  } else {
    KILL_AND_REAP(c, "C");
  }
  EVENT_LOOP(ctx, &freed);
  s1 = stats_of(ctx);
  CHECK_EQ(s1.bad_returns, 0);
  CHECK_LATE(s1, 0);
  CHECK_EQ(s1.live_slots, fc->named);
  CHECK_EQ(s1.limbo_blocks, fc->named);
  CHECK_EQ(freed, s0.limbo_bytes - s1.limbo_bytes);
  if (fc->named == NV) CHECK_EQ(freed, 0); /* every block is D's */
  CHECK_EQ(s1.reclaimed - s0.reclaimed, fc->reclaimed);
  CHECK(s1.peer_deaths > s0.peer_deaths);
  CHECK_EQ(ipcref_ctx_poll(ctx, 0, NULL), IPCREF_ETIMEDOUT); /* nothing new */

  /* D has what it got; fresh blocks of the same sizes are not D's. */
  CHECK_EQ(EXPECT_REPORT(cdd.st[0], &cdd.log, 'B', "D"), 0);
  CHECK_EQ(cdd.log.v['C'], fc->got);
  CHECK_EQ(cdd.log.n['E'], 0);
  for (i = 0; i < 2 * NV; i++)
    CHECK_EQ(new_scribble(ctx, sizes[i % NV], &fresh[i]), IPCREF_OK);
  cmd_put(cdd.cmd[1], 'v');
  CHECK_EQ(EXPECT_REPORT(cdd.st[0], &cdd.log, 'V', "D"), 0);
  s2 = stats_of(ctx);
  CHECK_EQ(s2.live_slots, fc->named);
  CHECK_EQ(s2.bad_returns, 0);

  /* D lets go: A has everything back. What C linked for D but never sent
   * stays while D lives, and comes back when D goes. */
  cmd_put(cdd.cmd[1], 'r');
  CHECK_EQ(EXPECT_REPORT(cdd.st[0], &cdd.log, 'R', "D"), 0);
  if (fc->got) {
    CHECK(wait_live_slots(ctx, 0, 2000 * slow));
  } else {
    ipcref_collect(ctx);
    CHECK_EQ(stats_of(ctx).live_slots, fc->named);
  }
  cmd_put(cdd.cmd[1], 'x');
  EXPECT_EXIT0(d, "D");
  if (!fc->got && fc->named) EVENT_LOOP(ctx, NULL);
  ipcref_collect(ctx);
  s2 = stats_of(ctx);
  CHECK_EQ(s2.live_slots, 0);
  CHECK_EQ(s2.limbo_blocks, 0);
  CHECK_EQ(s2.limbo_bytes, 0);
  CHECK_EQ(s2.live_bufs, 3 * NV - 1);

  cmd_put(cb.cmd[1], 'x');
  EXPECT_EXIT0(b, "B");
  for (i = 0; i < 2 * NV; i++) ipcref_view_release(&fresh[i]);
  for (i = 0; i < NV; i++) ipcref_view_release(&anchor[i]);
  ipcref_collect(ctx);
  s2 = stats_of(ctx);
  CHECK_EQ(s2.live_bufs, 0);
  CHECK_EQ(s2.live_slots, 0);
  CHECK_EQ(s2.limbo_blocks, 0);
  CHECK_EQ(s2.bad_returns, 0);
  CHECK_LATE(s2, 0);
  CHECK_EQ(s2.refused, 0);
  ipcref_peer_free(p);
  s2 = stats_of(ctx);
  CHECK_EQ(s2.peers, 0);
  CHECK_EQ(s2.counter_files, 0);
  if (harness_failures_in_test != fails) {
    printf("    C %s\n", fc->what);
    print_stats("after the sweep", &s0);
    print_stats("after C's death", &s1);
    print_stats("at the end", &s2);
  }
  ipcref_ctx_free(ctx);
  chan_close(&cb);
  chan_close(&cc);
  chan_close(&cdd);
  EXPECT_ERRORS(0);
  RES_END(&m);
}

static const fcase chain_cases[] = {
    {"killed just before its forward", -1, 0, C_BEFORE, 0, 0, NV},
    {"killed at \"forward\" #1 (first link half written)", L_FORWARD, 1, C_HOLD,
     1, 0, NV},
    {"killed at \"forward\" #5 (last link half written)", L_FORWARD, NV, C_HOLD,
     NV, 0, NV},
    {"killed at \"send\" (links written, not sent)", L_SEND, 1, C_HOLD, NV, 0,
     NV},
    {"killed after its forward reached D", -1, 0, C_HOLD, NV, NV, NV},
    {"killed at \"release\" after its forward", L_RELEASE, 1, C_RELEASE, NV, NV,
     NV},
    {"exits 0 after its forward (lets go first)", -1, 0, C_EXIT, NV, NV, 0}};

static void test_c_killed_before_forward(void) {
  chain_case(&chain_cases[0]);
}
static void test_c_killed_at_forward_first(void) {
  chain_case(&chain_cases[1]);
}
static void test_c_killed_at_forward_last(void) {
  chain_case(&chain_cases[2]);
}
static void test_c_killed_at_send(void) {
  chain_case(&chain_cases[3]);
}
static void test_c_killed_after_forward(void) {
  chain_case(&chain_cases[4]);
}
static void test_c_killed_at_release(void) {
  chain_case(&chain_cases[5]);
}
static void test_c_exits_after_forward(void) {
  chain_case(&chain_cases[6]);
}

/* ------------------------------------------------------------ 2. late */

/* C of the late cases: says hello to B ('P'), then waits to be killed. */
static int hello_child(const child_args *a) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[2], &p) != IPCREF_OK)
    return 2;
  st_put('P', 0);
  for (;;) pause();
}

enum { LATE_SEND, LATE_EXPORT };

/* B of the late cases: receives a block from A ('C', 'B'), and on 's'
 * forwards it to C, who is dead by then. LATE_SEND: ipcref_send, stopped
 * at "send" ('H') until 'c', then its result ('f'). LATE_EXPORT:
 * ipcref_export ('X'), keeping a copy of the message; 'm' frees the
 * message ('m'), 'F' frees the copy too ('F': a forged second return).
 * 'x': lets go and leaves. */
static int late_b_child(const child_args *a) {
  static ipcref_msg msg, copy;
  int cmd = a->fd[1];
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pa = NULL, *pc = NULL;
  ipcref_view v;
  ipcref_result r;
  memset(&v, 0, sizeof v);
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[2], &pa) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[3], &pc) != IPCREF_OK)
    return 2;
  r = ipcref_recv(pa, &v, WAIT_MS);
  st_put('C', r == IPCREF_OK);
  st_put('B', r == IPCREF_OK ? (int)check_view(&v, SEED) : -1);
  if (r != IPCREF_OK || cmd_get(cmd, WAIT_MS * 3) != 's') return 3;
  if (a->mode == LATE_SEND) {
    hook_cmd_fd = cmd;
    arm(L_SEND, 1);
    st_put('f', ipcref_send(pc, &v));
  } else {
    st_put('X', ipcref_export(pc, &v, &msg));
    copy = msg;
    copy.nfds = 0; /* the fds are the message's */
  }
  for (;;) {
    switch (cmd_get(cmd, WAIT_MS * 3)) {
    case 'm':
      ipcref_msg_free(&msg);
      st_put('m', 0);
      break;
    case 'F':
      ipcref_msg_free(&copy);
      st_put('F', 0);
      break;
    case 'x':
      ipcref_view_release(&v);
      ipcref_peer_free(pa);
      ipcref_peer_free(pc);
      ipcref_ctx_free(ctx);
      return 0;
    default: return 3;
    }
  }
}

static void late_case(int mode) {
  int fails = harness_failures_in_test;
  int ab[2], bc[2], s[2];
  chan cb, cc;
  pid_t b, c;
  res_mark m;
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_view v;
  ipcref_stats s0, s1, s2;
  memset(&v, 0, sizeof v);
  memset(&s1, 0, sizeof s1);
  res_begin(&m);
  if (xsocketpair(ab) || xsocketpair(bc) || chan_open(&cb) || chan_open(&cc))
    return;
  c = chan_spawn(&cc, R_HELLO, &bc[1], 1, -1, 0, 0);
  s[0] = ab[1];
  s[1] = bc[0];
  b = chan_spawn(&cb, R_LATE_B, s, 2, -1, 0, mode);
  ctx = new_ctx();
  CHECK_EQ(ipcref_peer_new(ctx, ab[0], &p), IPCREF_OK);
  CHECK_EQ(new_block(ctx, 4096, SEED, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  ipcref_view_release(&v);
  CHECK_EQ(EXPECT_REPORT(cb.st[0], &cb.log, 'B', "B"), 0);
  CHECK_EQ(cb.log.v['C'], 1);
  CHECK_EQ(EXPECT_REPORT(cc.st[0], &cc.log, 'P', "C"), 0);

  /* C dies (its hello was sent); B forwards to it after. */
  KILL_AND_REAP(c, "C");
  s0 = stats_of(ctx);
  cmd_put(cb.cmd[1], 's');
  if (mode == LATE_SEND)
    CHECK_EQ(EXPECT_REPORT(cb.st[0], &cb.log, 'H', "B"), L_SEND);
  else
    CHECK_EQ(EXPECT_REPORT(cb.st[0], &cb.log, 'X', "B"), IPCREF_OK);

  /* A reaps: the forward, named for the dead C, is reclaimed. */
  ipcref_collect(ctx);
  s1 = stats_of(ctx);
  CHECK_EQ(s1.reclaimed - s0.reclaimed, 1);
  CHECK_EQ(s1.live_slots, 1); /* B's */
  CHECK_EQ(s1.bad_returns, 0);
  CHECK_LATE(s1, 0);

  /* B's forward is cancelled after that: a late return, not a bad one. */
  if (mode == LATE_SEND) {
    cmd_put(cb.cmd[1], 'c');
    CHECK_EQ(EXPECT_REPORT(cb.st[0], &cb.log, 'f', "B"), IPCREF_EPEER);
  } else {
    cmd_put(cb.cmd[1], 'm');
    CHECK_EQ(EXPECT_REPORT(cb.st[0], &cb.log, 'm', "B"), 0);
  }
  ipcref_collect(ctx);
  s2 = stats_of(ctx);
  CHECK_EQ(s2.bad_returns, 0);
  CHECK_LATE(s2, 1);
  CHECK_EQ(s2.reclaimed, s1.reclaimed);
  CHECK_EQ(s2.live_slots, 1);
  EXPECT_ERRORS(0);

  if (mode == LATE_EXPORT) { /* the same return again: forged */
    cmd_put(cb.cmd[1], 'F');
    CHECK_EQ(EXPECT_REPORT(cb.st[0], &cb.log, 'F', "B"), 0);
    ipcref_collect(ctx);
    s2 = stats_of(ctx);
    CHECK_EQ(s2.bad_returns, 1);
    CHECK_LATE(s2, 1);
    CHECK_EQ(s2.live_slots, 1);
    EXPECT_ERRORS(1);
  }

  cmd_put(cb.cmd[1], 'x');
  EXPECT_EXIT0(b, "B");
  ipcref_collect(ctx);
  s2 = stats_of(ctx);
  CHECK_EQ(s2.live_slots, 0);
  CHECK_EQ(s2.limbo_blocks, 0);
  CHECK_EQ(s2.live_bufs, 0);
  CHECK_EQ(s2.bad_returns, mode == LATE_EXPORT);
  CHECK_LATE(s2, 1);
  ipcref_peer_free(p);
  s2 = stats_of(ctx);
  CHECK_EQ(s2.peers, 0);
  CHECK_EQ(s2.counter_files, 0);
  if (harness_failures_in_test != fails) {
    print_stats("after the reap", &s1);
    print_stats("at the end", &s2);
  }
  ipcref_ctx_free(ctx);
  chan_close(&cb);
  chan_close(&cc);
  EXPECT_ERRORS(0);
  RES_END(&m);
}

static void test_late_return_of_cancelled_send(void) {
  late_case(LATE_SEND);
}
static void test_late_return_then_forged(void) {
  late_case(LATE_EXPORT);
}

/* ------------------------------------------------------------ main */

static int run_role(const child_args *a) {
  switch (a->role) {
  case R_B: return b_child(a);
  case R_C: return c_child(a);
  case R_D: return d_child(a);
  case R_LATE_B: return late_b_child(a);
  case R_HELLO: return hello_child(a);
  default: return 99;
  }
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
  long t0 = now_ms();
  int st;
  under_valgrind = detect_valgrind(); /* before the spawner: children too */
  slow = under_valgrind ? 4 : UNDER_ASAN ? 2 : 1;
  if (spawner_start() != 0) {
    printf("test_forward_death: cannot start the spawner\n0 passed, 1 "
           "failed\n");
    return 1;
  }
  probe_pidfd();
  printf("test_forward_death:%s\n",
         have_pidfd ? "" : " no pidfd_open: deaths seen by pid");
  signal(SIGPIPE, SIG_IGN);
  RUN(test_c_killed_before_forward);
  RUN(test_c_killed_at_forward_first);
  RUN(test_c_killed_at_forward_last);
  RUN(test_c_killed_at_send);
  RUN(test_c_killed_after_forward);
  RUN(test_c_killed_at_release);
  RUN(test_c_exits_after_forward);
  RUN(test_late_return_of_cancelled_send);
  RUN(test_late_return_then_forged);
  st = spawner_stop();
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("FAIL spawner: status %#x\n", st);
    harness_failed++;
  }
  printf("test_forward_death: %ld ms\n", now_ms() - t0);
  return harness_finish();
}
