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
 *   3. A hole at a link's second half: C, a consumer of A, forwards to D
 *      and stops between the two ring stores of its link (its hook at
 *      "forward" writes the first half, as ring_push would, and stops
 *      there). A's event loop must be told when the hole is due
 *      (ipcref_ctx_timeout between 0 and 100 ms, never -1), and steps over
 *      it by following that alone; the forward is adopted for D until D is
 *      gone.
 *   4. A forwarder killed at its claim: B holds a block of A's and forwards
 *      it to C; C starts forwarding it on to D and is killed just after
 *      claiming its forwarding slot, before any ring position: its holder
 *      word not written yet, or written. No step of the hook lies there
 *      (a new label would be one tests/proc.h does not know), so C does by
 *      hand what ipcref__lease_take_forward does up to there. A's ledger
 *      has 4 forwarding slots; once A has reaped C (and, with no holder
 *      word, once B has let go: while B holds a lease, B could be that
 *      slot's claimer, alive), B forwards a block to E four times: every
 *      forward must find a slot. And the other way round: C claims and
 *      lives on, slow, while B dies; A's reap must keep the slot, so that
 *      C's link (pushed by hand after) is counted for D, with no bad
 *      return.
 *
 * Before the fixes of parts 3 and 4 (ipcref__hole_due, and the reap's
 * ipcref__forwards_lost), part 3 sees -1 while the hole waits, and part 4
 * finds 3 free forwarding slots (the fourth forward: EBUSY).
 *
 * On the code before the fix of the death's reap (d80863b: a dead
 * forwarder's links sit in the ring of the ledger it received through,
 * and the reap reclaimed its leases before reading that ring), part 1
 * fails: A frees D's blocks under it (D reads the fresh blocks' bytes,
 * bad_returns goes up) or drops the holds C linked for D; part 2 counts
 * the late return as bad. Build with -DFWD_NO_LATE_RETURNS against such a
 * header (its ipcref_stats has no late_returns) to see it.
 *
 * Children come from the spawner of tests/proc.h, forked first thing in
 * main (they start with nothing of this process: valgrind's leak check sees
 * only their own), report through pipes (8-byte records) and take commands
 * from pipes; every wait has a timeout and every child is reaped. Under
 * valgrind (IPCREF_UNDER_VALGRIND=1) there is no pidfd_open: the poll fd
 * never wakes, and ipcref_ctx_poll sees a death by kill(pid, 0) once the
 * child is reaped. */
#define _GNU_SOURCE
#define IPCREF_TEST_HOOKS
#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#include <stdint.h>
#include <string.h>

/* What a child gets: its role, its fds (fd[0] its report pipe, fd[1] its
 * command pipe, then its sockets) and its parameters. */
enum {
  R_B,
  R_C,
  R_D,
  R_LATE_B,
  R_HELLO,
  R_HALF_C,
  R_CLAIM_B,
  R_CLAIM_C,
  R_HOLDER
};
#define CHILD_FDS 6
typedef struct child_args {
  int32_t role, nfds, label, nth, mode;
  int32_t fd[CHILD_FDS];
} child_args;

#include "proc.h"

/* ------------------------------------------------------------ channels */

/* A child's channels: its report pipe, its command pipe. */
typedef struct chan {
  int st[2], cmd[2];
  clog log;
} chan;

static int chan_open(chan *c) {
  memset(c, 0, sizeof *c);
  c->st[0] = c->st[1] = c->cmd[0] = c->cmd[1] = -1;
  return xpipe(c->st) || xpipe(c->cmd) ? -1 : 0;
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

/* ------------------------------------------------------------ data */

/* The blocks of the chain: small size classes, and one larger than half
 * a segment (a segment of its own). Each small class also has an anchor
 * block that A holds throughout, so that the class's segment never
 * empties: a block freed there is the next one A allocates. */
#define SEGMENT (1u << 20)
#define NV      5
#define SEED    300u
static const size_t sizes[NV] = {64, 1000, 4096, 40000, 600 * 1024};

/* ------------------------------------------------------------ stats */

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

/* ------------------------------------------------------------ children */

/* A child's context and its peers on fd[2] and fd[3]: 1 when made. */
static int child_peers(const child_args *a, ipcref_ctx **ctx, ipcref_peer **p2,
                       ipcref_peer **p3) {
  return ipcref_ctx_new(NULL, ctx) == IPCREF_OK &&
         ipcref_peer_new(*ctx, a->fd[2], p2) == IPCREF_OK &&
         ipcref_peer_new(*ctx, a->fd[3], p3) == IPCREF_OK;
}

/* One block received on `p` into v, said to the test ('C': received,
 * 'B': its words that differ, -1 if none came). */
static ipcref_result child_recv_one(ipcref_peer *p, ipcref_view *v) {
  ipcref_result r = ipcref_recv(p, v, WAIT_MS);
  st_put('C', r == IPCREF_OK);
  st_put('B', r == IPCREF_OK ? (int)check_view(v, SEED) : -1);
  return r;
}

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
  if (!child_peers(a, &ctx, &pa, &pc)) return 2;
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
  if (!child_peers(a, &ctx, &pb, &pd)) return 2;
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

/* D: holds what C forwards (NV views, or fewer if C is gone first):
 * block i must be SEED + i. On a loaded machine C may be killed before D
 * has even said its hello: D then holds nothing, as when C dies later. */
static int d_child(const child_args *a) {
  return run_holder(a->fd[2], a->fd[1], NV, SEED, 1);
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
  if (xsocketpair(SOCK_SEQPACKET, ab) || xsocketpair(SOCK_SEQPACKET, bc) ||
      xsocketpair(SOCK_SEQPACKET, cd) || chan_open(&cb) || chan_open(&cc) ||
      chan_open(&cdd))
    return;
  d = chan_spawn(&cdd, R_D, &cd[1], 1, -1, 0, 0);
  s[0] = bc[1];
  s[1] = cd[0];
  c = chan_spawn(&cc, R_C, s, 2, fc->label, fc->nth, fc->mode);
  s[0] = ab[1];
  s[1] = bc[0];
  b = chan_spawn(&cb, R_B, s, 2, -1, 0, 0);

  /* A shares the blocks with B and lets go of its own references. */
  ctx = new_ctx(SEGMENT, 64);
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
  EXPECT_DEATH_SEEN(ctx, &freed);
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
    CHECK(wait_live_slots(ctx, 0, 2000 * slow) >= 0);
  } else {
    ipcref_collect(ctx);
    CHECK_EQ(stats_of(ctx).live_slots, fc->named);
  }
  cmd_put(cdd.cmd[1], 'x');
  EXPECT_EXIT0(d, "D");
  if (!fc->got && fc->named) EXPECT_DEATH_SEEN(ctx, NULL);
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
  if (!child_peers(a, &ctx, &pa, &pc)) return 2;
  r = child_recv_one(pa, &v);
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
  if (xsocketpair(SOCK_SEQPACKET, ab) || xsocketpair(SOCK_SEQPACKET, bc) ||
      chan_open(&cb) || chan_open(&cc))
    return;
  c = chan_spawn(&cc, R_HELLO, &bc[1], 1, -1, 0, 0);
  s[0] = ab[1];
  s[1] = bc[0];
  b = chan_spawn(&cb, R_LATE_B, s, 2, -1, 0, mode);
  ctx = new_ctx(SEGMENT, 64);
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

/* ------------------------------------------------------------ 3. hole */

/* C's hook in case 3: at its first "forward" (the positions of its link
 * taken, nothing written), it writes the link's first half, as ring_push
 * does, then stops there (proc.h's step_hook): its second half is a hole
 * at the ring's tail + 1. C is the only writer of that ring. */
static const ipcref__map *half_ledger; /* the ledger C's lease came through */
static uint32_t half_parent;           /* C's lease there */

static void half_link_hook(const char *step) {
  if (half_ledger && strcmp(step, "forward") == 0) {
    uint32_t n = half_ledger->nslots, s;
    const ipcref__ledger_hdr *h =
        (const ipcref__ledger_hdr *)(const void *)half_ledger->base;
    uint64_t *slots = ipcref__ledger_slots(half_ledger->base);
    uint64_t *ring = ipcref__ledger_ring(half_ledger->base, n), w = 0;
    uint64_t pos = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE) - 2;
    for (s = n / 2; s < n; s++) { /* the slot just claimed, under our lease */
      w = __atomic_load_n(&slots[2 * (size_t)s], __ATOMIC_ACQUIRE);
      if ((w & 3u) == IPCREF__SLOT_LIVE &&
          slots[2 * (size_t)s + 1] >> 32 == half_parent + 1u)
        break;
    }
    __atomic_store_n(
        &ring[pos % (2u * n)],
        ipcref__ring_entry(IPCREF__RING_LINK, s, (uint32_t)(w >> 2)),
        __ATOMIC_RELEASE);
    half_ledger = NULL;
  }
  step_hook(step);
}

/* C of case 3: receives a block from A ('C', 'B'), and on 'g' forwards it
 * to D with half_link_hook armed ('H' where it stops). */
static int half_c_child(const child_args *a) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pa = NULL, *pd = NULL;
  ipcref_view v;
  ipcref_result r;
  memset(&v, 0, sizeof v);
  if (!child_peers(a, &ctx, &pa, &pd)) return 2;
  r = child_recv_one(pa, &v);
  if (r != IPCREF_OK || cmd_get(a->fd[1], WAIT_MS * 3) != 'g') return 3;
  if (v.buf->release == ipcref__import_release) {
    const ipcref__import *imp = (const ipcref__import *)v.buf->release_user;
    half_ledger = imp->ledger;
    half_parent = imp->slot;
  }
  ipcref_test_set_step_hook(half_link_hook);
  arm(L_FORWARD, 1);
  st_put('f', ipcref_send(pd, &v));
  for (;;) pause();
}

/* A's event loop while the hole waits: sleeps on the poll fd for as long
 * as ipcref_ctx_timeout says, until the forward was adopted (live_slots
 * `want`). The first timeout is the hole's, within 100 ms
 * (IPCREF__HOLE_MS); none may be -1, on which such a loop sleeps for ever
 * (here it looks again after 20 ms). The ms it took, or -1. */
static long follow_timeout(ipcref_ctx *ctx, size_t want) {
  long t0 = now_ms();
  int t = ipcref_ctx_timeout(ctx), never = 0;
  CHECK(t >= 0 && t <= 100 + 10);
  while (stats_of(ctx).live_slots != want) {
    struct pollfd pf;
    if (now_ms() - t0 > 2000 * slow) return -1;
    never += t < 0;
    pf.fd = ipcref_ctx_poll_fd(ctx);
    pf.events = POLLIN;
    pf.revents = 0;
    (void)poll(&pf, 1, t >= 0 ? t : 20);
    t = ipcref_ctx_timeout(ctx);
  }
  CHECK_EQ(never, 0);
  return now_ms() - t0;
}

static void test_hole_at_link_half(void) {
  int ac[2], cd[2], s[2];
  chan cc, cdd;
  pid_t c, d;
  res_mark m;
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_view v;
  ipcref_stats st;
  memset(&v, 0, sizeof v);
  res_begin(&m);
  if (xsocketpair(SOCK_SEQPACKET, ac) || xsocketpair(SOCK_SEQPACKET, cd) ||
      chan_open(&cc) || chan_open(&cdd))
    return;
  d = chan_spawn(&cdd, R_D, &cd[1], 1, -1, 0, 0);
  s[0] = ac[1];
  s[1] = cd[0];
  c = chan_spawn(&cc, R_HALF_C, s, 2, -1, 0, 0);
  ctx = new_ctx(SEGMENT, 64);
  CHECK_EQ(ipcref_peer_new(ctx, ac[0], &p), IPCREF_OK);
  CHECK_EQ(new_block(ctx, 4096, SEED, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  ipcref_view_release(&v);
  CHECK_EQ(EXPECT_REPORT(cc.st[0], &cc.log, 'B', "C"), 0);

  /* C stops with half a link written: the hole is due in 100 ms. */
  cmd_put(cc.cmd[1], 'g');
  CHECK_EQ(EXPECT_REPORT(cc.st[0], &cc.log, 'H', "C"), L_FORWARD);
  CHECK(follow_timeout(ctx, 2) >= 0); /* C's lease, D's adopted */
  if (have_pidfd) CHECK_EQ(ipcref_ctx_timeout(ctx), -1); /* nothing waits */
  st = stats_of(ctx);
  CHECK_EQ(st.bad_returns, 0);

  /* C dies: its lease comes back; the forward stays D's while D lives. */
  KILL_AND_REAP(c, "C");
  EXPECT_DEATH_SEEN(ctx, NULL);
  CHECK_EQ(stats_of(ctx).live_slots, 1);
  CHECK_EQ(EXPECT_REPORT(cdd.st[0], &cdd.log, 'C', "D"), 0);
  cmd_put(cdd.cmd[1], 'x');
  EXPECT_EXIT0(d, "D");
  EXPECT_DEATH_SEEN(ctx, NULL);
  ipcref_collect(ctx);
  st = stats_of(ctx);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.live_bufs, 0);
  CHECK_EQ(st.bad_returns, 0);
  ipcref_peer_free(p);
  CHECK_EQ(stats_of(ctx).counter_files, 0);
  ipcref_ctx_free(ctx);
  chan_close(&cc);
  chan_close(&cdd);
  EXPECT_ERRORS(0);
  RES_END(&m);
}

/* ------------------------------------------------------------ 4. claim */

/* B of case 4: receives a block from A ('C', 'B'), then obeys: 'f'
 * forward it to C ('f': the result), 'e' forward it to E four times, a
 * message each ('e': how many went, 'y': the last result), 'r' let go of
 * it ('R'), 'n' receive another from A ('C', 'B'), 'x' let go and leave. */
static int claim_b_recv(ipcref_peer *pa, ipcref_view *v) {
  ipcref_result r = ipcref_recv(pa, v, WAIT_MS);
  st_put('C', r == IPCREF_OK);
  st_put('B', r == IPCREF_OK ? (int)check_view(v, 0) : -1);
  return r == IPCREF_OK;
}

static void claim_b_to_e(ipcref_peer *pe, const ipcref_view *v) {
  ipcref_result r = IPCREF_OK;
  int i;
  for (i = 0; i < 4 && r == IPCREF_OK; i++) r = ipcref_send(pe, v);
  st_put('y', r);
  st_put('e', i - (r != IPCREF_OK));
}

static int claim_b_child(const child_args *a) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pa = NULL, *pc = NULL, *pe = NULL;
  ipcref_view v;
  memset(&v, 0, sizeof v);
  if (!child_peers(a, &ctx, &pa, &pc) ||
      ipcref_peer_new(ctx, a->fd[4], &pe) != IPCREF_OK || !claim_b_recv(pa, &v))
    return 2;
  for (;;) {
    switch (cmd_get(a->fd[1], WAIT_MS * 3)) {
    case 'f': st_put('f', ipcref_send(pc, &v)); break;
    case 'e': claim_b_to_e(pe, &v); break;
    case 'r':
      ipcref_view_release(&v);
      st_put('R', 0);
      break;
    case 'n':
      if (!claim_b_recv(pa, &v)) return 4;
      break;
    case 'x':
      ipcref_view_release(&v);
      ipcref_peer_free(pa);
      ipcref_peer_free(pc);
      ipcref_peer_free(pe);
      ipcref_ctx_free(ctx);
      return 0;
    default: return 3;
    }
  }
}

/* What ipcref__lease_take_forward does for view `v` and the peer whose
 * process is `pid` before it takes ring positions, done here by hand (no
 * step of the hook lies there): the first free forwarding slot claimed,
 * and (`holder`) its holder word written. 'K' when done. The slot, or n. */
static uint32_t claim_by_hand(const ipcref_view *v, int pid, int holder) {
  const ipcref__import *imp = (const ipcref__import *)v->buf->release_user;
  uint32_t n = imp->ledger->nslots, s;
  uint64_t *slots = ipcref__ledger_slots(imp->ledger->base);
  for (s = n / 2; s < n; s++) {
    uint64_t w = __atomic_load_n(&slots[2 * (size_t)s], __ATOMIC_ACQUIRE);
    if ((w & 3u) == IPCREF__SLOT_FREE &&
        __atomic_compare_exchange_n(&slots[2 * (size_t)s], &w,
                                    (((w >> 2) + 1) << 2) | IPCREF__SLOT_LIVE,
                                    0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
      break;
  }
  if (s < n && holder)
    __atomic_store_n(&slots[2 * (size_t)s + 1],
                     ((uint64_t)(imp->slot + 1u) << 32) | (uint32_t)pid,
                     __ATOMIC_RELEASE);
  st_put('K', s < n);
  return s;
}

/* The rest of that forward up to its message, by hand: the holder word
 * (again), then the link pair pushed to the ring. 'L' when done. */
static void link_by_hand(const ipcref_view *v, int pid, uint32_t s) {
  const ipcref__import *imp = (const ipcref__import *)v->buf->release_user;
  uint32_t n = imp->ledger->nslots;
  uint64_t *slots = ipcref__ledger_slots(imp->ledger->base), e[2];
  __atomic_store_n(&slots[2 * (size_t)s + 1],
                   ((uint64_t)(imp->slot + 1u) << 32) | (uint32_t)pid,
                   __ATOMIC_RELEASE);
  e[0] = ipcref__ring_entry(IPCREF__RING_LINK, s,
                            (uint32_t)(slots[2 * (size_t)s] >> 2));
  e[1] = ipcref__ring_entry(IPCREF__RING_PARENT, imp->slot, imp->gen);
  ipcref__ring_push(imp->ledger->base, n, imp->ledger->bell, e, 2, NULL);
  st_put('L', 0);
}

/* C of case 4: receives B's forward ('C', 'B'), and on 'g' claims a slot
 * to forward it to D (claim_by_hand, its holder word written if mode is
 * 1); on 'l', links it (link_by_hand). Then waits to be killed. */
static int claim_c_child(const child_args *a) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pb = NULL, *pd = NULL;
  ipcref_view v;
  ipcref_result r;
  uint32_t s;
  int pid;
  memset(&v, 0, sizeof v);
  if (!child_peers(a, &ctx, &pb, &pd)) return 2;
  r = child_recv_one(pb, &v);
  if (r != IPCREF_OK || cmd_get(a->fd[1], WAIT_MS * 3) != 'g' ||
      v.buf->release != ipcref__import_release)
    return 3;
  pid = ipcref_peer_pid(pd); /* D's, from its hello */
  s = claim_by_hand(&v, pid, a->mode);
  if (cmd_get(a->fd[1], WAIT_MS * 3) == 'l' &&
      s < ((const ipcref__import *)v.buf->release_user)->ledger->nslots)
    link_by_hand(&v, pid, s);
  for (;;) pause();
}

/* The processes of case 4 and A's side of them. */
typedef struct claim_world {
  chan cb, cc, cd, ce;
  pid_t b, c, d, e;
  ipcref_ctx *ctx;
  ipcref_peer *p;
} claim_world;

/* Starts D, E, C and B, and A's context (4 forwarding slots), which sends
 * B a block. 0 when the sockets could not be made. */
static int claim_start(claim_world *w, int holder) {
  int ab[2], bc[2], cd[2], be[2], s[3];
  ipcref_view v;
  memset(w, 0, sizeof *w);
  memset(&v, 0, sizeof v);
  if (xsocketpair(SOCK_SEQPACKET, ab) || xsocketpair(SOCK_SEQPACKET, bc) ||
      xsocketpair(SOCK_SEQPACKET, cd) || xsocketpair(SOCK_SEQPACKET, be) ||
      chan_open(&w->cb) || chan_open(&w->cc) || chan_open(&w->cd) ||
      chan_open(&w->ce))
    return 0;
  w->d = chan_spawn(&w->cd, R_D, &cd[1], 1, -1, 0, 0);
  w->e = chan_spawn(&w->ce, R_HOLDER, &be[1], 1, -1, 4, 0);
  s[0] = bc[1];
  s[1] = cd[0];
  w->c = chan_spawn(&w->cc, R_CLAIM_C, s, 2, -1, 0, holder);
  s[0] = ab[1];
  s[1] = bc[0];
  s[2] = be[0];
  w->b = chan_spawn(&w->cb, R_CLAIM_B, s, 3, -1, 0, 0);
  w->ctx = new_ctx(SEGMENT, 8);
  CHECK_EQ(ipcref_peer_new(w->ctx, ab[0], &w->p), IPCREF_OK);
  CHECK_EQ(new_block(w->ctx, 4096, SEED, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(w->p, &v), IPCREF_OK);
  ipcref_view_release(&v);
  return 1;
}

/* Ends case 4: E, D and B (those alive) leave, A has everything back. */
static void claim_end(claim_world *w) {
  ipcref_stats st;
  cmd_put(w->ce.cmd[1], 'x');
  EXPECT_EXIT0(w->e, "E");
  cmd_put(w->cd.cmd[1], 'x');
  EXPECT_EXIT0(w->d, "D");
  if (w->b > 0) {
    cmd_put(w->cb.cmd[1], 'x');
    EXPECT_EXIT0(w->b, "B");
  }
  CHECK(wait_live_slots(w->ctx, 0, 2000 * slow) >= 0);
  st = stats_of(w->ctx);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.live_bufs, 0);
  CHECK_EQ(st.bad_returns, 0);
  ipcref_peer_free(w->p);
  CHECK_EQ(stats_of(w->ctx).counter_files, 0);
  ipcref_ctx_free(w->ctx);
  chan_close(&w->cb);
  chan_close(&w->cc);
  chan_close(&w->cd);
  chan_close(&w->ce);
}

/* C killed after claiming a forwarding slot, its holder word written
 * (`holder`) or not. */
static void claim_case(int holder) {
  claim_world w;
  res_mark m;
  ipcref_view v;
  res_begin(&m);
  if (!claim_start(&w, holder)) return;
  CHECK_EQ(EXPECT_REPORT(w.cb.st[0], &w.cb.log, 'B', "B"), 0);
  cmd_put(w.cb.cmd[1], 'f');
  CHECK_EQ(EXPECT_REPORT(w.cb.st[0], &w.cb.log, 'f', "B"), IPCREF_OK);
  CHECK_EQ(EXPECT_REPORT(w.cc.st[0], &w.cc.log, 'B', "C"), 0);
  ipcref_collect(w.ctx); /* A knows C's lease */
  CHECK_EQ(stats_of(w.ctx).live_slots, 2);

  /* C claims a forwarding slot and is killed there. */
  cmd_put(w.cc.cmd[1], 'g');
  CHECK_EQ(EXPECT_REPORT(w.cc.st[0], &w.cc.log, 'K', "C"), 1);
  KILL_AND_REAP(w.c, "C");
  EXPECT_DEATH_SEEN(w.ctx, NULL);
  CHECK_EQ(stats_of(w.ctx).live_slots, 1); /* B's */
  if (!holder) { /* B, alive, could be the claimer until it lets go */
    cmd_put(w.cb.cmd[1], 'r');
    CHECK_EQ(EXPECT_REPORT(w.cb.st[0], &w.cb.log, 'R', "B"), 0);
    ipcref_collect(w.ctx);
    memset(&v, 0, sizeof v);
    CHECK_EQ(new_block(w.ctx, 4096, SEED + 1, &v), IPCREF_OK);
    CHECK_EQ(ipcref_send(w.p, &v), IPCREF_OK);
    ipcref_view_release(&v);
    cmd_put(w.cb.cmd[1], 'n');
    w.cb.log.n['B'] = 0;
    CHECK_EQ(EXPECT_REPORT(w.cb.st[0], &w.cb.log, 'B', "B"), 0);
  }

  /* Every forwarding slot is free again: B forwards to E four times. */
  cmd_put(w.cb.cmd[1], 'e');
  CHECK_EQ(EXPECT_REPORT(w.cb.st[0], &w.cb.log, 'e', "B"), 4);
  CHECK_EQ(w.cb.log.v['y'], IPCREF_OK);
  CHECK_EQ(EXPECT_REPORT(w.ce.st[0], &w.ce.log, 'B', "E"), 0);
  CHECK_EQ(w.ce.log.v['C'], 4);
  ipcref_collect(w.ctx);
  CHECK_EQ(stats_of(w.ctx).live_slots, 5); /* B's, E's four */
  claim_end(&w);
  EXPECT_ERRORS(0);
  RES_END(&m);
}

/* C claims a slot (its holder word written or not) and lives on, slow:
 * B dies meanwhile, and A's reap must keep the slot (C's lease, the
 * parent, is live: C may be its claimer), so that C's link, when it comes,
 * is taken: the lease is counted for D (until D goes), no return is bad. */
static void claim_alive_case(int holder) {
  claim_world w;
  res_mark m;
  res_begin(&m);
  if (!claim_start(&w, holder)) return;
  CHECK_EQ(EXPECT_REPORT(w.cb.st[0], &w.cb.log, 'B', "B"), 0);
  cmd_put(w.cb.cmd[1], 'f');
  CHECK_EQ(EXPECT_REPORT(w.cb.st[0], &w.cb.log, 'f', "B"), IPCREF_OK);
  CHECK_EQ(EXPECT_REPORT(w.cc.st[0], &w.cc.log, 'B', "C"), 0);
  ipcref_collect(w.ctx); /* A knows C's lease */
  cmd_put(w.cc.cmd[1], 'g');
  CHECK_EQ(EXPECT_REPORT(w.cc.st[0], &w.cc.log, 'K', "C"), 1);
  KILL_AND_REAP(w.b, "B");
  w.b = 0;
  EXPECT_DEATH_SEEN(w.ctx, NULL);
  CHECK_EQ(stats_of(w.ctx).live_slots, 1); /* C's */
  cmd_put(w.cc.cmd[1], 'l');
  CHECK_EQ(EXPECT_REPORT(w.cc.st[0], &w.cc.log, 'L', "C"), 0);
  ipcref_collect(w.ctx);
  CHECK_EQ(stats_of(w.ctx).live_slots, 2); /* C's, D's */
  CHECK_EQ(stats_of(w.ctx).bad_returns, 0);
  KILL_AND_REAP(w.c, "C");
  EXPECT_DEATH_SEEN(w.ctx, NULL);
  CHECK_EQ(stats_of(w.ctx).live_slots, 1); /* D's, never sent */
  claim_end(&w);
  EXPECT_ERRORS(0);
  RES_END(&m);
}

static void test_claim_alive_before_holder(void) {
  claim_alive_case(0);
}
static void test_claim_alive_after_holder(void) {
  claim_alive_case(1);
}
static void test_claim_killed_before_holder(void) {
  claim_case(0);
}
static void test_claim_killed_after_holder(void) {
  claim_case(1);
}

/* ------------------------------------------------------------ main */

static int run_role(const child_args *a) {
  switch (a->role) {
  case R_B: return b_child(a);
  case R_C: return c_child(a);
  case R_D: return d_child(a);
  case R_LATE_B: return late_b_child(a);
  case R_HELLO: return hello_child(a);
  case R_HALF_C: return half_c_child(a);
  case R_CLAIM_B: return claim_b_child(a);
  case R_CLAIM_C: return claim_c_child(a);
  case R_HOLDER: return run_holder(a->fd[2], a->fd[1], a->nth, 0, 1);
  default: return 99;
  }
}

int main(void) {
  long t0 = now_ms();
  int st;
  if (proc_start() != 0) {
    printf("test_forward_death: cannot start the spawner\n0 passed, 1 "
           "failed\n");
    return 1;
  }
  printf("test_forward_death:%s\n",
         have_pidfd ? "" : " no pidfd_open: deaths seen by pid");
  RUN(test_c_killed_before_forward);
  RUN(test_c_killed_at_forward_first);
  RUN(test_c_killed_at_forward_last);
  RUN(test_c_killed_at_send);
  RUN(test_c_killed_after_forward);
  RUN(test_c_killed_at_release);
  RUN(test_c_exits_after_forward);
  RUN(test_late_return_of_cancelled_send);
  RUN(test_late_return_then_forged);
  RUN(test_hole_at_link_half);
  RUN(test_claim_killed_before_holder);
  RUN(test_claim_killed_after_holder);
  RUN(test_claim_alive_before_holder);
  RUN(test_claim_alive_after_holder);
  st = spawner_stop();
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("FAIL spawner: status %#x\n", st);
    harness_failed++;
  }
  printf("test_forward_death: %ld ms\n", now_ms() - t0);
  return harness_finish();
}
