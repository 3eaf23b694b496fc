/* Crash tests for the sharing layer: processes killed with SIGKILL at random
 * moments and at every labelled step of the protocol, and what the
 * survivors must see afterwards.
 *
 *   1. Kill soak: IPCREF_SOAK_ROUNDS rounds (200; 20 under valgrind) of a
 *      consumer B that imports a random number of blocks (singles and
 *      batches), forwards some to a third process C, and is SIGKILLed at a
 *      random moment (a random delay, or stopped at a random step by the
 *      test hook). After each round the producer (this process) holds
 *      nothing for the dead: its live slots are exactly C's holds, then
 *      zero; no limbo; its counter files, peers, fds and mappings are back
 *      to the start.
 *   2. Kill at every step: the consumer, the forwarder (B forwarding A's
 *      blocks to C) and the producer stop at each label in turn and are
 *      killed there; the survivors' counts equal the ground truth.
 *   3. A producer killed while 4 consumers read its blocks: each finishes
 *      reading correct data and exits 0.
 *   4. No residue: nothing new in /dev/shm or /tmp at the end.
 *
 * Children come from the spawner of tests/proc.h (with the reports, the
 * step hook and the checks this test shares with test_forward_death.c):
 * they close every fd they were not given, report through pipes (8-byte
 * records) and never return into the harness (_exit). Every wait has a
 * timeout and every child is reaped.
 *
 * Environment: IPCREF_SOAK_ROUNDS, IPCREF_TEST_SEED (the seed is printed),
 * IPCREF_SOAK_ONLY=n (with the seed: run soak round n alone, to reproduce
 * it), IPCREF_UNDER_VALGRIND=1 (fewer rounds, longer timeouts). */
#define _GNU_SOURCE
#define IPCREF_TEST_HOOKS
#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#include <dirent.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The soak's plan for one round: decided here, handed to B whole. */
#define SOAK_MAXB 40
#define SOAK_MAXF 12 /* forwards per round (forwarding slots are finite) */

typedef struct soak_plan {
  int k, nmsg, stream, by_hook, kill_msg, delay_us, label, nth, kill_c;
  int gmax; /* views B forwards per message, at most */
  int first[SOAK_MAXB + 1];
  size_t bytes[SOAK_MAXB];
  uint32_t seed[SOAK_MAXB];
  unsigned char fwd[SOAK_MAXB], keep_b[SOAK_MAXB], keep_a[SOAK_MAXB];
} soak_plan;

static soak_plan plan; /* in B: its copy of child_args.plan */

/* What a child gets: its role, its fds (fd[0] its report pipe) and its
 * parameters. */
enum {
  R_HOLDER,
  R_SOAK_B,
  R_CONSUMER,
  R_FORWARDER,
  R_PRODUCER,
  R_READ_PRODUCER,
  R_READER
};
#define CHILD_FDS 8
typedef struct child_args {
  int32_t role, nfds, label, nth;
  int32_t fd[CHILD_FDS];
  soak_plan plan;
} child_args;

#include "proc.h"

static long seed;

/* ------------------------------------------------------------ basics */

static uint64_t rng_state;

static uint32_t rnd(uint32_t below) {
  rng_state = mix64(rng_state);
  return below ? (uint32_t)((rng_state >> 32) % below) : 0;
}

/* ------------------------------------------------------------ reports */

/* What this test's children report, beyond proc.h's 'H' (stopped at a
 * step): 'P' its peers are made, 'D' its script ended, 'r' a release,
 * 'F' n views being forwarded (until 'f' or 'e': the result), 'S' views
 * the producer sent so far, 'A' all sent, 'C' views it holds, 'B'
 * elements that differed, 'V' differences when verified on command, 'R'
 * released, 'E' an error, 'M' the steps its hook saw. */

/* Views a forwarder was forwarding ('F' without 'f' or 'e' after it). */
static int fwd_pending(const clog *l) {
  return l->n['F'] > l->n['f'] + l->n['e'] ? l->v['F'] : 0;
}

static unsigned steps_seen_all; /* every step seen, in any process */

/* Everything left in a dead child's pipe; the steps it saw ('M') join
 * steps_seen_all. */
static void drain(int fd, clog *l) {
  clog_drain(fd, l);
  steps_seen_all |= (unsigned)l->v['M'];
}

/* ------------------------------------------------------------ context */

static void print_stats(const char *what, const ipcref_stats *s) {
  printf("    %s: live_bufs %zu limbo %zu live_slots %zu counter_files %zu "
         "peers %zu segs %zu imported %zu deaths %llu reclaimed %llu "
         "bad_returns %llu refused %llu\n",
         what, s->live_bufs, s->limbo_blocks, s->live_slots, s->counter_files,
         s->peers, s->mapped_segments, s->imported_bufs,
         (unsigned long long)s->peer_deaths, (unsigned long long)s->reclaimed,
         (unsigned long long)s->bad_returns, (unsigned long long)s->refused);
}

/* Late ring entries (behind a hole a killed writer left) show up once the
 * hole is stepped over: give them the time, then sweep. */
static void settle(ipcref_ctx *ctx) {
  int i;
  for (i = 0; i < 15; i++) {
    sleep_us(20000);
    ipcref_collect(ctx);
  }
}

static long slowest_return_ms; /* C's returns seen after a middleman died */

/* ------------------------------------------------------------ the holder */

/* C: holds what B sends it, until B hangs up (B may die before its
 * hello: then C holds nothing). */
static int holder_child(const child_args *a) {
  return run_holder(a->fd[1], a->fd[2], HOLD_MAX, 0, 1);
}

/* Forks C on its socket `sock`; the parent gets C's report and command
 * pipes. */
static pid_t start_holder(int sock, int *st_rd, int *cmd_wr) {
  child_args a;
  int stp[2], cmdp[2];
  pid_t pid;
  *st_rd = *cmd_wr = -1;
  if (xpipe(stp) || xpipe(cmdp)) return -1;
  memset(&a, 0, sizeof a);
  a.role = R_HOLDER;
  a.nfds = 3;
  a.fd[0] = stp[1];
  a.fd[1] = sock;
  a.fd[2] = cmdp[0];
  pid = spawn(&a);
  close(stp[1]);
  close(cmdp[0]);
  *st_rd = stp[0];
  *cmd_wr = cmdp[1];
  return pid;
}

/* ------------------------------------------------------------ 1. soak */

static const int b_labels[] = {L_RECEIVE, L_MAP,     L_IMPORT, L_FORWARD,
                               L_SEND,    L_RELEASE, L_EXPORT};

static void make_plan(int round) {
  static const size_t sizes[] = {64,    256,    1000,   4096,
                                 20000, 100000, 200000, 16};
  int i, m = 0, nf = 0;
  memset(&plan, 0, sizeof plan);
  plan.k = 1 + (int)rnd(SOAK_MAXB);
  for (i = 0; i < plan.k; i++) {
    plan.bytes[i] = sizes[rnd(sizeof sizes / sizeof sizes[0])];
    plan.seed[i] = (uint32_t)(round * 64 + i + 1);
    plan.fwd[i] = nf < SOAK_MAXF && rnd(3) == 0;
    nf += plan.fwd[i];
    plan.keep_b[i] = (unsigned char)rnd(2);
    plan.keep_a[i] = rnd(3) == 0;
  }
  for (i = 0; i < plan.k; m++) {
    int n = rnd(3) == 0 ? 2 + (int)rnd(7) : 1;
    plan.first[m] = i;
    i += n < plan.k - i ? n : plan.k - i;
  }
  plan.nmsg = m;
  plan.first[m] = plan.k;
  plan.gmax = 1 + (int)rnd(3);
  plan.stream = rnd(4) == 0;
  plan.by_hook = rnd(2);
  plan.kill_msg = (int)rnd((uint32_t)plan.nmsg + 1);
  plan.delay_us = rnd(3) == 0 ? 0 : (int)rnd(3000);
  plan.label = b_labels[rnd(sizeof b_labels / sizeof b_labels[0])];
  plan.nth = 1 + (int)rnd(4);
  plan.kill_c = (int)rnd(3); /* 0: lets go, lives; 1: killed; 2: lets go
                                and leaves at once */
}

/* B: receives the plan's blocks from A, forwards some to C (in groups of
 * up to plan.gmax), lets go of some, holds the rest. */
static int soak_b(const child_args *a) {
  static ipcref_view v[SOAK_MAXB], group[16];
  static int gidx[16];
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pa = NULL, *pc = NULL;
  int j, ng = 0, g;
  long bad = 0;
  plan = a->plan;
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[1], &pa) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[2], &pc) != IPCREF_OK)
    return 2;
  st_put('P', 0);
  if (plan.by_hook) arm(plan.label, plan.nth);
  for (j = 0; j < plan.k; j++) {
    ipcref_result r = ipcref_recv(pa, &v[j], WAIT_MS);
    if (r != IPCREF_OK) {
      st_put('E', r);
      break;
    }
    bad += check_view(&v[j], plan.seed[j]) != 0;
    if (plan.fwd[j]) {
      group[ng] = v[j];
      gidx[ng++] = j;
    }
    if (ng && (ng == plan.gmax || j == plan.k - 1)) {
      st_put('F', ng);
      r = ipcref_send_batch(pc, group, ng);
      st_put(r == IPCREF_OK ? 'f' : 'e', r);
      for (g = 0; g < ng; g++)
        if (!plan.keep_b[gidx[g]]) ipcref_view_release(&v[gidx[g]]);
      ng = 0;
    }
    if (!plan.fwd[j] && !plan.keep_b[j]) ipcref_view_release(&v[j]);
  }
  st_put('B', (int)bad);
  st_put('M', (int)steps_seen);
  st_put('D', 0);
  for (;;) pause();
}

typedef struct soak_totals {
  int hook_rounds, hooked, delay_rounds, phantoms, c_counts;
} soak_totals;

static void soak_round(ipcref_ctx *ctx, int round, const res_mark *start,
                       const ipcref_stats *base, soak_totals *tot) {
  static ipcref_view views[SOAK_MAXB], junk[4];
  int fails = harness_failures_in_test;
  int ab[2], bc[2], bst[2], cst = -1, ccmd = -1, m, j;
  int any_sent = 0;
  pid_t b = -1, c = -1;
  child_args ba;
  clog lb, lc;
  ipcref_peer *p = NULL;
  ipcref_stats s0, s;
  ipcref_result r;
  size_t freed = 0;
  memset(&lb, 0, sizeof lb);
  memset(&lc, 0, sizeof lc);
  memset(views, 0, sizeof views);
  memset(junk, 0, sizeof junk);
  errors_reset();
  make_plan(round);
  s0 = stats_of(ctx);
  if (xsocketpair(plan.stream ? SOCK_STREAM : SOCK_SEQPACKET, ab) ||
      xsocketpair(SOCK_SEQPACKET, bc) || xpipe(bst))
    return;
  c = start_holder(bc[1], &cst, &ccmd);
  close(bc[1]);
  memset(&ba, 0, sizeof ba);
  ba.role = R_SOAK_B;
  ba.nfds = 3;
  ba.fd[0] = bst[1];
  ba.fd[1] = ab[1];
  ba.fd[2] = bc[0];
  ba.plan = plan;
  b = spawn(&ba);
  close(ab[1]);
  close(bc[0]);
  close(bst[1]);
  p = make_peer(ctx, ab[0]);
  if (!p) close(ab[0]);
  for (j = 0; j < plan.k; j++)
    CHECK_EQ(new_block(ctx, plan.bytes[j], plan.seed[j], &views[j]), IPCREF_OK);
  for (m = 0; m < plan.nmsg && p; m++) {
    int f = plan.first[m], n = plan.first[m + 1] - f;
    if (!plan.by_hook && m == plan.kill_msg) break;
    r = ipcref_send_batch(p, &views[f], n);
    /* B lives (or is stopped at a step): every send must go through. */
    CHECK_EQ(r, IPCREF_OK);
    any_sent |= r == IPCREF_OK;
    for (j = f; j < f + n; j++)
      if (!plan.keep_a[j]) ipcref_view_release(&views[j]);
  }
  if (plan.by_hook) {
    tot->hook_rounds++;
    if (!clog_wait(bst[0], &lb, "HD", WAIT_MS)) {
      printf("    B neither stopped nor finished\n");
      CHECK(!"B's report");
    }
    tot->hooked += stopped_at(&lb) >= 0;
  } else {
    tot->delay_rounds++;
    sleep_us(plan.delay_us);
  }
  KILL_AND_REAP(b, "B");
  /* Nothing called on the ctx since the kill: the death is news. */
  if (any_sent) {
    EXPECT_DEATH_SEEN(ctx, &freed);
  } else { /* B may have died before its hello: nothing to see */
    r = ipcref_ctx_poll(ctx, 0, &freed);
    CHECK(r == IPCREF_OK || r == IPCREF_ETIMEDOUT);
  }
  drain(bst[0], &lb);
  CHECK_EQ(lb.v['B'], 0);
  CHECK(clog_wait(cst, &lc, "B", WAIT_MS));
  CHECK_EQ(lc.v['B'], 0);
  CHECK_EQ(lc.n['E'], 0);
  tot->c_counts += lc.v['C'];
  tot->phantoms += fwd_pending(&lb);
  ipcref_collect(ctx);
  s = stats_of(ctx);
  /* B's leases are gone; what is left is C's (plus a forward B had linked
   * but not sent when it died: held for C until C is gone). */
  CHECK(s.live_slots >= (size_t)lc.v['C'] &&
        s.live_slots <= (size_t)(lc.v['C'] + fwd_pending(&lb)));
  if (any_sent) CHECK(s.peer_deaths > s0.peer_deaths);
  /* What B's death freed gets reused: never C's blocks. */
  for (j = 0; j < 4 && lc.v['C'] > 0; j++)
    CHECK_EQ(new_scribble(ctx, plan.bytes[j % plan.k], &junk[j]), IPCREF_OK);
  if (lc.v['C'] > 0) {
    cmd_put(ccmd, 'v');
    CHECK(clog_wait(cst, &lc, "V", WAIT_MS));
    CHECK_EQ(lc.v['V'], 0);
  }
  for (j = 0; j < 4; j++) ipcref_view_release(&junk[j]);
  if (plan.kill_c == 1) {
    KILL_AND_REAP(c, "holder C");
  } else {
    cmd_put(ccmd, 'r');
    CHECK(clog_wait(cst, &lc, "R", WAIT_MS));
    if (plan.kill_c == 0) { /* C lives and let go: A frees its blocks */
      long ms = wait_live_slots(ctx, (size_t)fwd_pending(&lb), 2000 * slow);
      if (ms < 0) printf("    C's returns never seen\n");
      CHECK(ms >= 0);
      if (ms > slowest_return_ms) slowest_return_ms = ms;
    }
    cmd_put(ccmd, 'x');
    EXPECT_EXIT0(c, "holder C");
  }
  ipcref_collect(ctx);
  s = stats_of(ctx);
  if (s.live_slots > 0) { /* C's holds: C is gone now */
    EXPECT_DEATH_SEEN(ctx, NULL);
    ipcref_collect(ctx);
    s = stats_of(ctx);
  }
  CHECK_EQ(s.live_slots, 0);
  if (plan.kill_c == 2 &&
      (stopped_at(&lb) == L_FORWARD || stopped_at(&lb) == L_RELEASE))
    settle(ctx); /* B left a hole: C's late returns are not bad ones */
  for (j = 0; j < plan.k; j++) ipcref_view_release(&views[j]);
  ipcref_collect(ctx);
  s = stats_of(ctx);
  CHECK_EQ(s.live_bufs, 0);
  CHECK_EQ(s.limbo_blocks, 0);
  CHECK_EQ(s.limbo_bytes, 0);
  CHECK_EQ(s.live_slots, 0);
  CHECK_EQ(s.imported_bufs, 0);
  CHECK_EQ(s.bad_returns, base->bad_returns);
  ipcref_peer_free(p);
  s = stats_of(ctx);
  CHECK_EQ(s.peers, base->peers);
  CHECK_EQ(s.counter_files, base->counter_files);
  CHECK(s.cached_bytes <= (size_t)512 << 20); /* the default cap */
  (void)ipcref_ctx_trim(ctx, 0);              /* the rest is as it was before */
  close(bst[0]);
  close(cst);
  close(ccmd);
  if (start) RES_END(start);
  EXPECT_ERRORS(0);
  if (harness_failures_in_test != fails) {
    printf("    ^ soak round %d (IPCREF_TEST_SEED=%ld): %d blocks in %d "
           "messages, %s, %s kill (%s #%d, after msg %d + %d us), B hooked "
           "%s, C held %d (pending %d), C %s\n",
           round, seed, plan.k, plan.nmsg, plan.stream ? "stream" : "seqpacket",
           plan.by_hook ? "hook" : "delay", label_names[plan.label], plan.nth,
           plan.kill_msg, plan.delay_us,
           stopped_at(&lb) >= 0 ? label_names[stopped_at(&lb)] : "-", lc.v['C'],
           fwd_pending(&lb),
           plan.kill_c == 1   ? "killed"
           : plan.kill_c == 2 ? "let go and left at once"
                              : "let go and lived on");
    print_stats("now", &s);
  }
}

static void test_kill_soak(void) {
  long rounds =
      harness_env_long("IPCREF_SOAK_ROUNDS", under_valgrind ? 20 : 200);
  long only = harness_env_long("IPCREF_SOAK_ONLY", -1);
  ipcref_ctx *ctx = new_ctx(256 * 1024, 32);
  ipcref_stats base;
  soak_totals tot;
  res_mark start;
  long t0 = now_ms(), i;
  int failed_rounds = 0;
  memset(&tot, 0, sizeof tot);
  if (!ctx) return;
  memset(&base, 0, sizeof base);
  /* The warm-up round. Each round ends with the cache given back (its
   * empty segments are kept by design, and reused across rounds). */
  soak_round(ctx, -1, NULL, &base, &tot);
  harness_failures_in_test = 0;
  base = stats_of(ctx);
  res_begin(&start);
  for (i = 0; i < rounds; i++) {
    int before = harness_failures_in_test;
    if (only >= 0 && i != only) { /* replay the plans up to that round */
      make_plan((int)i);
      continue;
    }
    soak_round(ctx, (int)i, &start, &base, &tot);
    if (harness_failures_in_test != before) {
      res_begin(&start); /* one leak, one report */
      base = stats_of(ctx);
      if (++failed_rounds >= 5) {
        printf("    soak: stopping after 5 failed rounds\n");
        break;
      }
    }
  }
  ipcref_ctx_free(ctx);
  printf("    soak: %ld rounds in %ld ms (hook %d, stopped at a step %d; delay "
         "%d), C held %d views, %d forwards in flight at a death; C's "
         "returns seen after at most %ld ms\n",
         i, now_ms() - t0, tot.hook_rounds, tot.hooked, tot.delay_rounds,
         tot.c_counts, tot.phantoms, slowest_return_ms);
}

/* ------------------------------------------------------------ 2. steps */

static const char *case_role;
static int case_label, case_nth;
static int not_reached[3][NLABELS];

#define CASE_DONE(fails)                                                       \
  do {                                                                         \
    if (harness_failures_in_test != (fails))                                   \
      printf("    ^ %s killed at \"%s\" #%d\n", case_role,                     \
             label_names[case_label], case_nth);                               \
  } while (0)

/* -- the consumer: A (here) sends 7 blocks (3 singles, a batch of 4) to C;
 * C receives them, lets go of 3, holds 4. */
#define CONS_N 7
/* Block 2 is of block 0's size class: its segment has crossed, so over
 * the channel its message is a record in the ring. */
static const size_t cons_bytes[CONS_N] = {1024, 4096, 1024, 700 * 1024,
                                          2048, 128,  20480};
static const int cons_keep_a[CONS_N] = {1, 0, 0, 1, 0, 1, 0};
static const int cons_c_drops[3] = {1, 2, 4};

static int consumer_child(const child_args *a) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v[CONS_N];
  int i;
  long bad = 0;
  memset(v, 0, sizeof v);
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[1], &p) != IPCREF_OK)
    return 2;
  st_put('P', 0);
  arm(a->label, a->nth);
  for (i = 0; i < CONS_N; i++) {
    ipcref_result r = ipcref_recv(p, &v[i], WAIT_MS);
    if (r != IPCREF_OK) {
      st_put('E', r);
      break;
    }
    bad += check_view(&v[i], 100 + (uint32_t)i) != 0;
  }
  st_put('B', (int)bad);
  for (i = 0; i < 3; i++) {
    ipcref_view_release(&v[cons_c_drops[i]]);
    st_put('r', cons_c_drops[i]);
  }
  st_put('M', (int)steps_seen);
  st_put('D', 0);
  for (;;) pause();
}

static void consumer_case(int label, int nth, int required) {
  int fails = harness_failures_in_test;
  int sv[2], stp[2], i;
  child_args a;
  res_mark m;
  clog l;
  pid_t pid;
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_view v[CONS_N];
  ipcref_stats before, after;
  ipcref_result r;
  size_t freed = 0;
  case_role = "consumer";
  case_label = label;
  case_nth = nth;
  memset(&l, 0, sizeof l);
  memset(v, 0, sizeof v);
  errors_reset();
  res_begin(&m);
  if (xsocketpair(SOCK_SEQPACKET, sv) || xpipe(stp)) return;
  memset(&a, 0, sizeof a);
  a.role = R_CONSUMER;
  a.nfds = 2;
  a.fd[0] = stp[1];
  a.fd[1] = sv[1];
  a.label = label;
  a.nth = nth;
  pid = spawn(&a);
  close(sv[1]);
  close(stp[1]);
  ctx = new_ctx(1 << 20, 64);
  p = make_peer(ctx, sv[0]);
  for (i = 0; i < CONS_N; i++)
    CHECK_EQ(new_block(ctx, cons_bytes[i], 100 + (uint32_t)i, &v[i]),
             IPCREF_OK);
  CHECK_EQ(ipcref_send(p, &v[0]), IPCREF_OK);
  CHECK_EQ(ipcref_send(p, &v[1]), IPCREF_OK);
  CHECK_EQ(ipcref_send(p, &v[2]), IPCREF_OK);
  CHECK_EQ(ipcref_send_batch(p, &v[3], 4), IPCREF_OK);
  for (i = 0; i < CONS_N; i++)
    if (!cons_keep_a[i]) ipcref_view_release(&v[i]);
  CHECK(clog_wait(stp[0], &l, "HD", WAIT_MS));
  if (stopped_at(&l) < 0) {
    not_reached[0][label]++;
    if (required) {
      printf("    the consumer never passed \"%s\" #%d\n", label_names[label],
             nth);
      CHECK(!"step reached");
    }
  }
  CHECK_EQ(l.n['E'], 0);
  before = stats_of(ctx); /* C is stopped: its returns so far are in */
  CHECK_EQ(before.live_slots, (size_t)(CONS_N - l.n['r']));
  KILL_AND_REAP(pid, "consumer");
  EXPECT_DEATH_SEEN(ctx, &freed);
  after = stats_of(ctx);
  CHECK_EQ(after.live_slots, 0);
  CHECK_EQ(after.limbo_blocks, 0);
  CHECK_EQ(after.limbo_bytes, 0);
  CHECK_EQ(freed, before.limbo_bytes); /* what only C held */
  CHECK_EQ(after.reclaimed - before.reclaimed, before.live_slots);
  CHECK(after.peer_deaths > before.peer_deaths);
  CHECK_EQ(after.bad_returns, 0);
  CHECK_EQ(ipcref_peer_alive(p), 0);
  r = ipcref_ctx_poll(ctx, 0, NULL); /* nothing new */
  CHECK_EQ(r, IPCREF_ETIMEDOUT);
  for (i = 0; i < CONS_N; i++) {
    if (v[i].buf) CHECK_EQ(check_view(&v[i], 100 + (uint32_t)i), 0);
    ipcref_view_release(&v[i]);
  }
  ipcref_collect(ctx);
  after = stats_of(ctx);
  CHECK_EQ(after.live_bufs, 0);
  CHECK_EQ(after.live_bytes, 0);
  CHECK_EQ(after.limbo_blocks, 0);
  ipcref_peer_free(p);
  after = stats_of(ctx);
  CHECK_EQ(after.peers, 0);
  CHECK_EQ(after.counter_files, 0);
  CHECK_EQ(after.bad_returns, 0);
  CHECK_EQ(after.refused, 0);
  if (harness_failures_in_test != fails) print_stats("after", &after);
  ipcref_ctx_free(ctx);
  drain(stp[0], &l);
  close(stp[0]);
  EXPECT_ERRORS(0);
  RES_END(&m);
  CASE_DONE(fails);
}

static void test_kill_consumer_at_each_step(void) {
  static const int labels[] = {L_RECEIVE, L_CHAN_TAKE, L_MAP, L_IMPORT,
                               L_RELEASE};
  int i, nth;
  for (i = 0; i < 5; i++)
    if (!(label_channel_only(labels[i]) && path_socket_only()))
      for (nth = 1; nth <= 2; nth++) consumer_case(labels[i], nth, nth == 1);
}

/* -- the forwarder: A (here) sends 5 blocks to B (2 singles, a batch of
 * 3); B forwards block 0 alone and blocks 1, 2 in one message to C, lets go
 * of 0, 2 and 4, holds 1 and 3. */
#define FWD_N 5
static const size_t fwd_bytes[FWD_N] = {2048, 8192, 512, 700 * 1024, 4096};

static int forwarder_child(const child_args *a) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *pa = NULL, *pc = NULL;
  ipcref_view v[FWD_N];
  ipcref_result r;
  int i;
  long bad = 0;
  memset(v, 0, sizeof v);
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[1], &pa) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[2], &pc) != IPCREF_OK)
    return 2;
  st_put('P', 0);
  arm(a->label, a->nth);
  for (i = 0; i < FWD_N; i++) {
    r = ipcref_recv(pa, &v[i], WAIT_MS);
    if (r != IPCREF_OK) {
      st_put('E', r);
      break;
    }
    bad += check_view(&v[i], 200 + (uint32_t)i) != 0;
  }
  st_put('B', (int)bad);
  st_put('F', 1);
  r = ipcref_send(pc, &v[0]);
  st_put(r == IPCREF_OK ? 'f' : 'e', r);
  if (r != IPCREF_OK) st_put('E', r);
  st_put('F', 2);
  r = ipcref_send_batch(pc, &v[1], 2);
  st_put(r == IPCREF_OK ? 'f' : 'e', r);
  if (r != IPCREF_OK) st_put('E', r);
  for (i = 0; i < FWD_N; i += 2) {
    ipcref_view_release(&v[i]);
    st_put('r', i);
  }
  st_put('M', (int)steps_seen);
  st_put('D', 0);
  for (;;) pause();
}

static void forwarder_case(int label, int nth, int required) {
  int fails = harness_failures_in_test;
  int ab[2], bc[2], bst[2], cst = -1, ccmd = -1, i;
  child_args a;
  res_mark m;
  clog lb, lc;
  pid_t b, c;
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_view v[FWD_N], scribble[FWD_N];
  ipcref_stats before, s;
  size_t held;
  case_role = "forwarder";
  case_label = label;
  case_nth = nth;
  memset(&lb, 0, sizeof lb);
  memset(&lc, 0, sizeof lc);
  memset(v, 0, sizeof v);
  memset(scribble, 0, sizeof scribble);
  errors_reset();
  res_begin(&m);
  if (xsocketpair(SOCK_SEQPACKET, ab) || xsocketpair(SOCK_SEQPACKET, bc) ||
      xpipe(bst))
    return;
  c = start_holder(bc[1], &cst, &ccmd);
  close(bc[1]);
  memset(&a, 0, sizeof a);
  a.role = R_FORWARDER;
  a.nfds = 3;
  a.fd[0] = bst[1];
  a.fd[1] = ab[1];
  a.fd[2] = bc[0];
  a.label = label;
  a.nth = nth;
  b = spawn(&a);
  close(ab[1]);
  close(bc[0]);
  close(bst[1]);
  ctx = new_ctx(1 << 20, 64);
  p = make_peer(ctx, ab[0]);
  for (i = 0; i < FWD_N; i++)
    CHECK_EQ(new_block(ctx, fwd_bytes[i], 200 + (uint32_t)i, &v[i]), IPCREF_OK);
  CHECK_EQ(ipcref_send(p, &v[0]), IPCREF_OK);
  CHECK_EQ(ipcref_send(p, &v[1]), IPCREF_OK);
  CHECK_EQ(ipcref_send_batch(p, &v[2], 3), IPCREF_OK);
  for (i = 0; i < FWD_N; i++)
    if (i != 1) ipcref_view_release(&v[i]); /* A keeps block 1 */
  CHECK(clog_wait(bst[0], &lb, "HD", WAIT_MS));
  if (stopped_at(&lb) < 0) {
    not_reached[1][label]++;
    if (required) {
      printf("    the forwarder never passed \"%s\" #%d\n", label_names[label],
             nth);
      CHECK(!"step reached");
    }
  }
  before = stats_of(ctx);
  KILL_AND_REAP(b, "forwarder");
  EXPECT_DEATH_SEEN(ctx, NULL);
  drain(bst[0], &lb);
  CHECK_EQ(lb.v['B'], 0);
  CHECK_EQ(lb.n['E'], 0);
  CHECK(clog_wait(cst, &lc, "B", WAIT_MS)); /* C saw B hang up */
  CHECK_EQ(lc.v['B'], 0);
  CHECK_EQ(lc.n['E'], 0);
  ipcref_collect(ctx);
  s = stats_of(ctx);
  /* Ground truth: C's holds, plus (killed between linking a forward and
   * sending it) the views of that message, kept for C until C is gone. */
  CHECK(s.live_slots >= (size_t)lc.v['C'] &&
        s.live_slots <= (size_t)(lc.v['C'] + fwd_pending(&lb)));
  if (label != L_SEND && label != L_EXPORT && label != L_FORWARD)
    CHECK_EQ(fwd_pending(&lb), 0);
  CHECK(s.peer_deaths > before.peer_deaths);
  CHECK_EQ(s.bad_returns, 0);
  CHECK_EQ(s.live_bufs, 1);
  held = s.live_slots;
  /* Fresh blocks must not be C's: scribble over them, C reads its own. */
  for (i = 0; i < FWD_N; i++)
    CHECK_EQ(new_scribble(ctx, fwd_bytes[i], &scribble[i]), IPCREF_OK);
  cmd_put(ccmd, 'v');
  CHECK(clog_wait(cst, &lc, "V", WAIT_MS));
  CHECK_EQ(lc.v['V'], 0);
  CHECK_EQ(stats_of(ctx).live_slots, held);
  cmd_put(ccmd, 'r');
  CHECK(clog_wait(cst, &lc, "R", WAIT_MS));
  if (nth == 1) {
    /* C lets go and lives on: A frees what only C held, although B died
     * with its ring entries half written. */
    long ms = wait_live_slots(ctx, (size_t)fwd_pending(&lb), 2000 * slow);
    if (ms < 0 || ms > 50)
      printf("    note: C's returns seen by A after %ld ms (B killed at "
             "\"%s\" #%d)\n",
             ms, label_names[label], nth);
    if (ms > slowest_return_ms) slowest_return_ms = ms;
    CHECK(ms >= 0);
    cmd_put(ccmd, 'x');
    EXPECT_EXIT0(c, "holder C");
  } else {
    /* C lets go and leaves at once: its returns, written before it died,
     * are honest ones, whenever A reads them. */
    cmd_put(ccmd, 'x');
    EXPECT_EXIT0(c, "holder C");
    if (stats_of(ctx).live_slots > 0) EXPECT_DEATH_SEEN(ctx, NULL);
    settle(ctx);
  }
  ipcref_collect(ctx);
  s = stats_of(ctx);
  if (s.live_slots > 0) { /* a hold for C that never reached C */
    CHECK(s.live_slots <= (size_t)fwd_pending(&lb));
    EXPECT_DEATH_SEEN(ctx, NULL);
  }
  for (i = 0; i < FWD_N; i++) {
    ipcref_view_release(&scribble[i]);
    ipcref_view_release(&v[i]);
  }
  ipcref_collect(ctx);
  s = stats_of(ctx);
  CHECK_EQ(s.live_slots, 0);
  CHECK_EQ(s.live_bufs, 0);
  CHECK_EQ(s.limbo_blocks, 0);
  CHECK_EQ(s.bad_returns, 0);
  ipcref_peer_free(p);
  s = stats_of(ctx);
  CHECK_EQ(s.peers, 0);
  CHECK_EQ(s.counter_files, 0);
  if (harness_failures_in_test != fails) {
    printf("    C held %d, B forwarding %d when killed\n", lc.v['C'],
           fwd_pending(&lb));
    print_stats("after", &s);
  }
  ipcref_ctx_free(ctx);
  close(bst[0]);
  close(cst);
  close(ccmd);
  EXPECT_ERRORS(0);
  RES_END(&m);
  CASE_DONE(fails);
}

static void test_kill_forwarder_at_each_step(void) {
  static const int labels[] = {L_RECEIVE, L_MAP,     L_IMPORT, L_FORWARD,
                               L_SEND,    L_RELEASE, L_EXPORT};
  int i, nth;
  for (i = 0; i < 7; i++)
    for (nth = 1; nth <= 2; nth++)
      forwarder_case(labels[i], nth, nth == 1 && labels[i] != L_EXPORT);
}

/* -- the producer: P (a child) allocates and sends 6 blocks to the
 * consumer (here): [0] [1] [2 3] [4] [5]; it lets go of 0-2 once sent. For
 * "sweep" the consumer first receives all and lets go of two, then P
 * sweeps. */
#define PROD_N 6
/* Block 4 is of block 0's size class (see cons_bytes). */
static const size_t prod_bytes[PROD_N] = {1024, 4096, 700 * 1024,
                                          256,  1024, 2048};
static const int prod_first[6] = {0, 1, 2, 4, 5, 6};

static int producer_child(const child_args *a) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v[PROD_N];
  int msg, i, sent = 0;
  memset(v, 0, sizeof v);
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[1], &p) != IPCREF_OK)
    return 2;
  st_put('P', 0);
  if (a->label != L_SWEEP) arm(a->label, a->nth);
  for (msg = 0; msg < 5; msg++) {
    int f = prod_first[msg], n = prod_first[msg + 1] - f;
    ipcref_result r;
    for (i = f; i < f + n; i++)
      if (new_block(ctx, prod_bytes[i], 300 + (uint32_t)i, &v[i]) != IPCREF_OK)
        st_put('E', -100);
    r = ipcref_send_batch(p, &v[f], n);
    if (r != IPCREF_OK) st_put('E', r);
    sent += n;
    st_put('S', sent);
    for (i = f; i < f + n; i++)
      if (i <= 2) ipcref_view_release(&v[i]);
  }
  st_put('A', 0);
  if (cmd_get(a->fd[2], WAIT_MS) != 'g') return 3;
  if (a->label == L_SWEEP) arm(L_SWEEP, a->nth);
  ipcref_collect(ctx);
  st_put('M', (int)steps_seen);
  st_put('D', 0);
  for (;;) pause();
}

static void producer_case(int label, int nth, int required) {
  int fails = harness_failures_in_test;
  int sv[2], stp[2], cmdp[2], i, n = 0;
  child_args a;
  res_mark m;
  clog l;
  pid_t pid;
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_view v[PROD_N], extra;
  ipcref_stats s;
  case_role = "producer";
  case_label = label;
  case_nth = nth;
  memset(&l, 0, sizeof l);
  memset(v, 0, sizeof v);
  memset(&extra, 0, sizeof extra);
  errors_reset();
  res_begin(&m);
  if (xsocketpair(SOCK_SEQPACKET, sv) || xpipe(stp) || xpipe(cmdp)) return;
  memset(&a, 0, sizeof a);
  a.role = R_PRODUCER;
  a.nfds = 3;
  a.fd[0] = stp[1];
  a.fd[1] = sv[1];
  a.fd[2] = cmdp[0];
  a.label = label;
  a.nth = nth;
  pid = spawn(&a);
  close(sv[1]);
  close(stp[1]);
  close(cmdp[0]);
  ctx = new_ctx(0, 0);
  p = make_peer(ctx, sv[0]);
  if (label == L_SWEEP) {
    CHECK(clog_wait(stp[0], &l, "A", WAIT_MS));
    for (n = 0; n < PROD_N; n++)
      if (ipcref_recv(p, &v[n], WAIT_MS) != IPCREF_OK) break;
    CHECK_EQ(n, PROD_N);
    for (i = 0; i < n; i++) CHECK_EQ(check_view(&v[i], 300 + (uint32_t)i), 0);
    ipcref_view_release(&v[0]); /* returns for P to sweep */
    ipcref_view_release(&v[4]);
    cmd_put(cmdp[1], 'g');
    CHECK(clog_wait(stp[0], &l, "HD", WAIT_MS));
  } else {
    CHECK(clog_wait(stp[0], &l, "HA", WAIT_MS));
    for (n = 0; n < l.v['S']; n++)
      if (ipcref_recv(p, &v[n], WAIT_MS) != IPCREF_OK) break;
    CHECK_EQ(n, l.v['S']);
  }
  if (stopped_at(&l) < 0) {
    not_reached[2][label]++;
    if (required) {
      printf("    the producer never passed \"%s\" #%d\n", label_names[label],
             nth);
      CHECK(!"step reached");
    }
  }
  CHECK_EQ(l.n['E'], 0);
  CHECK_EQ(ipcref_peer_alive(p), 1);
  KILL_AND_REAP(pid, "producer");
  CHECK_EQ(ipcref_recv(p, &extra, WAIT_MS), IPCREF_EPEER);
  ipcref_view_release(&extra);
  if (n > 0) EXPECT_DEATH_SEEN(ctx, NULL);
  CHECK_EQ(ipcref_peer_alive(p), 0);
  /* The views outlive their producer: readable, correct, releasable. */
  for (i = 0; i < n; i++)
    if (v[i].buf) CHECK_EQ(check_view(&v[i], 300 + (uint32_t)i), 0);
  for (i = 0; i < n; i++) ipcref_view_release(&v[i]);
  ipcref_collect(ctx);
  s = stats_of(ctx);
  CHECK_EQ(s.imported_bufs, 0);
  CHECK_EQ(s.live_slots, 0);
  if (n > 0) CHECK(s.peer_deaths >= 1);
  ipcref_peer_free(p);
  ipcref_collect(ctx);
  s = stats_of(ctx);
  CHECK_EQ(s.peers, 0);
  CHECK_EQ(s.bad_returns, 0);
  CHECK_EQ(s.refused, 0);
  if (harness_failures_in_test != fails) print_stats("after", &s);
  ipcref_ctx_free(ctx); /* unmaps what the dead producer left mapped */
  drain(stp[0], &l);
  close(stp[0]);
  close(cmdp[1]);
  EXPECT_ERRORS(0);
  RES_END(&m);
  CASE_DONE(fails);
}

static void test_kill_producer_at_each_step(void) {
  static const int labels[] = {L_ALLOCATE, L_EXPORT, L_SEND, L_CHAN_PUSH,
                               L_SWEEP};
  int i, nth;
  for (i = 0; i < 5; i++)
    if (!(label_channel_only(labels[i]) && path_socket_only()))
      for (nth = 1; nth <= 2; nth++) producer_case(labels[i], nth, nth == 1);
}

/* Every label was passed somewhere: the hook covers the protocol. */
static void test_every_step_labelled(void) {
  int i, r;
  unsigned all = steps_seen_all | steps_seen;
  for (i = 0; i < NLABELS; i++)
    if (label_channel_only(i) && path_socket_only()) {
      if (all & (1u << i)) { /* the parameter took: no channel at all */
        printf("    \"%s\" passed over the socket only\n", label_names[i]);
        CHECK(!"no channel over the socket only");
      }
    } else if (!(all & (1u << i))) {
      printf("    no process ever passed \"%s\"\n", label_names[i]);
      CHECK(!"every step labelled");
    }
  if (all & (1u << 31)) {
    printf("    the hook heard a label this test does not know\n");
    CHECK(!"known labels");
  }
  for (r = 0; r < 3; r++)
    for (i = 0; i < NLABELS; i++)
      if (not_reached[r][i])
        printf("    note: %s never reached \"%s\" #%d in its script\n",
               r == 0   ? "consumer"
               : r == 1 ? "forwarder"
                        : "producer",
               label_names[i], 2 - (not_reached[r][i] > 1));
  printf("    C's returns after a middleman's death seen within %ld ms\n",
         slowest_return_ms);
}

/* ------------------------------------------------------------ 3. readers */

/* P sends READ_N blocks to each of 4 consumers and lets go of its own
 * references; once all 4 are reading, P is killed. Each consumer keeps
 * reading until it has seen the producer die and has read everything
 * correctly 3 more times, then lets go and exits 0. */
#define READERS 4
#define READ_N  6
static size_t read_bytes = 512 * 1024;

static int reader_producer(const child_args *a) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p[READERS];
  ipcref_view v[READ_N];
  int i;
  memset(v, 0, sizeof v);
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK) return 2;
  for (i = 0; i < READERS; i++)
    if (ipcref_peer_new(ctx, a->fd[1 + i], &p[i]) != IPCREF_OK) return 2;
  for (i = 0; i < READ_N; i++)
    if (new_block(ctx, read_bytes, 400 + (uint32_t)i, &v[i]) != IPCREF_OK)
      return 3;
  for (i = 0; i < READERS; i++)
    if (ipcref_send_batch(p[i], v, READ_N) != IPCREF_OK) return 4;
  for (i = 0; i < READ_N; i++) ipcref_view_release(&v[i]);
  st_put('A', 0);
  for (;;) pause();
}

static int reader_child(const child_args *a) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p = NULL;
  ipcref_view v[READ_N];
  int i, passes = 0, after_death = -1;
  long bad = 0, end;
  memset(v, 0, sizeof v);
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_peer_new(ctx, a->fd[1], &p) != IPCREF_OK)
    return 2;
  for (i = 0; i < READ_N; i++)
    if (ipcref_recv(p, &v[i], WAIT_MS) != IPCREF_OK) return 3;
  end = now_ms() + 3L * WAIT_MS;
  while (after_death < 3 && now_ms() < end) {
    for (i = 0; i < READ_N; i++)
      bad += check_view(&v[i], 400 + (uint32_t)i) != 0;
    if (++passes == 1) st_put('R', 0); /* reading: kill it now */
    if (after_death >= 0)
      after_death++;
    else if (!ipcref_peer_alive(p))
      after_death = 0;
  }
  for (i = 0; i < READ_N; i++) ipcref_view_release(&v[i]);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  st_put('B', (int)bad);
  st_put('C', passes);
  if (bad) return 4;
  if (after_death < 3) return 5; /* never saw the producer die */
  return 0;
}

static void test_producer_killed_while_read(void) {
  int sv[READERS][2], pst[2], rst[READERS][2], i;
  child_args pa, ra;
  pid_t prod, rd[READERS];
  clog lp, lr[READERS];
  res_mark m;
  res_begin(&m);
  memset(&lp, 0, sizeof lp);
  memset(lr, 0, sizeof lr);
  if (under_valgrind) read_bytes = 128 * 1024;
  for (i = 0; i < READERS; i++)
    if (xsocketpair(SOCK_SEQPACKET, sv[i]) || xpipe(rst[i])) return;
  if (xpipe(pst)) return;
  for (i = 0; i < READERS; i++) {
    memset(&ra, 0, sizeof ra);
    ra.role = R_READER;
    ra.nfds = 2;
    ra.fd[0] = rst[i][1];
    ra.fd[1] = sv[i][1];
    rd[i] = spawn(&ra);
    close(sv[i][1]);
    close(rst[i][1]);
  }
  memset(&pa, 0, sizeof pa);
  pa.role = R_READ_PRODUCER;
  pa.nfds = 1 + READERS;
  pa.fd[0] = pst[1];
  for (i = 0; i < READERS; i++) pa.fd[1 + i] = sv[i][0];
  prod = spawn(&pa);
  close(pst[1]);
  for (i = 0; i < READERS; i++) close(sv[i][0]);
  CHECK(clog_wait(pst[0], &lp, "A", WAIT_MS));
  for (i = 0; i < READERS; i++)
    CHECK(clog_wait(rst[i][0], &lr[i], "R", WAIT_MS));
  KILL_AND_REAP(prod, "producer");
  for (i = 0; i < READERS; i++) {
    EXPECT_EXIT0(rd[i], "reader");
    drain(rst[i][0], &lr[i]);
    CHECK_EQ(lr[i].v['B'], 0);
    close(rst[i][0]);
  }
  close(pst[0]);
  RES_END(&m);
}

/* ------------------------------------------------------------ 4. residue */

#define MAX_NAMES 4096
typedef struct name_set {
  int n;
  char *names[MAX_NAMES];
} name_set;

static void names_of(const char *dir, name_set *s) {
  DIR *d = opendir(dir);
  struct dirent *e;
  s->n = 0;
  if (!d) return;
  while ((e = readdir(d)) != NULL && s->n < MAX_NAMES)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      s->names[s->n++] = strdup(e->d_name);
  closedir(d);
}

static void names_free(name_set *s) {
  int i;
  for (i = 0; i < s->n; i++) free(s->names[i]);
  s->n = 0;
}

static int names_has(const name_set *s, const char *name) {
  int i;
  for (i = 0; i < s->n; i++)
    if (strcmp(s->names[i], name) == 0) return 1;
  return 0;
}

static name_set before_shm, before_tmp;

/* 1 when a process other than this one has `path` open (another
 * program's temporary, not ours). */
static int open_elsewhere(const char *path) {
  DIR *procs = opendir("/proc");
  struct dirent *pe;
  int found = 0;
  char me[32];
  snprintf(me, sizeof me, "%d", (int)getpid());
  if (!procs) return 0;
  while (!found && (pe = readdir(procs)) != NULL) {
    char dir[300], link[600], target[600];
    DIR *fds;
    struct dirent *fe;
    if (pe->d_name[0] < '0' || pe->d_name[0] > '9' ||
        strcmp(pe->d_name, me) == 0)
      continue;
    snprintf(dir, sizeof dir, "/proc/%s/fd", pe->d_name);
    if ((fds = opendir(dir)) == NULL) continue;
    while (!found && (fe = readdir(fds)) != NULL) {
      ssize_t n;
      snprintf(link, sizeof link, "%s/%s", dir, fe->d_name);
      n = readlink(link, target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = 0;
      found = strcmp(target, path) == 0;
    }
    closedir(fds);
  }
  closedir(procs);
  return found;
}

/* A consumer killed while another process (its child) keeps its socket
 * open: the producer reaps what it held, and a send after that is refused
 * (EPEER) where the socket took it and its lease stayed out for good (the
 * reap looks at a dead holder's ledger once). Socket only: the channel
 * says EPEER for a dead receiver already. */
typedef struct heir_args {
  int sock, said, hold;
} heir_args;
static int heir_keeper(void *arg) {
  heir_args *a = (heir_args *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = make_peer(ctx, a->sock); /* its hello goes */
  pid_t g = fork();
  if (g == 0) { /* keeps the socket open until the test closes `hold` */
    char b;
    alarm(CHILD_ALARM_S);
    while (read(a->hold, &b, 1) < 0 && errno == EINTR) continue;
    _exit(0);
  }
  ctl_put(a->said, g > 0 ? 1 : -1);
  pause(); /* until killed */
  (void)p;
  return 0;
}
static void test_send_after_reaped_death(void) {
  int sv[2], said[2], hold[2];
  heir_args a;
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_peer_options o;
  ipcref_view v;
  const int64_t n = 4096;
  pid_t c;
  if (xsocketpair(SOCK_SEQPACKET, sv) || xsocketpair(SOCK_SEQPACKET, said) ||
      xpipe(hold))
    return;
  a.sock = sv[1];
  a.said = said[1];
  a.hold = hold[0];
  c = fork_child(heir_keeper, &a, sv[1], said[1], hold[0], -1);
  tclose(sv[1]);
  tclose(said[1]);
  tclose(hold[0]);
  ctx = make_ctx(NULL);
  memset(&o, 0, sizeof o);
  o.ring_bytes = IPCREF_KEEP_NONE;
  CHECK_EQ(ipcref_peer_new_with(ctx, sv[0], &o, &p), IPCREF_OK);
  if (p) tforget(sv[0]);
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  CHECK_EQ(ctl_get(said[0], WAIT_MS), 1);
  CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  kill(c, SIGKILL);
  sigkilled_at(wait_child(c, REAP_MS), c, "consumer", __FILE__, __LINE__);
  ipcref_collect(ctx);
  CHECK_EQ(stats_of(ctx).live_slots, 0);
  CHECK_EQ(ipcref_send(p, &v), IPCREF_EPEER);
  CHECK_EQ(stats_of(ctx).live_slots, 0);
  tclose(hold[1]); /* its child goes: nobody holds the socket */
  ipcref_view_release(&v);
  ipcref_collect(ctx);
  CHECK_EQ(stats_of(ctx).live_slots, 0);
  CHECK_EQ(stats_of(ctx).limbo_blocks, 0);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  tclose(said[0]);
}

/* New entries in `dir` that stay: other programs' temporaries (a compiler
 * running beside this test) come and go, so a new entry counts only if it
 * is still there after up to 5 s and no other process has it open.
 * valgrind's own vgdb FIFOs of the killed children are not ours. */
static int ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), t = strlen(tail);
  return n >= t && strcmp(s + n - t, tail) == 0;
}

static int new_entries(const char *dir, const name_set *before) {
  name_set now;
  int i, n, tries;
  for (tries = 0;; tries++) {
    names_of(dir, &now);
    for (n = 0, i = 0; i < now.n; i++) {
      char path[600];
      if (names_has(before, now.names[i])) continue;
      /* valgrind's own files (this run's, or another valgrind's on the
       * machine): not ipcref's. */
      if (strncmp(now.names[i], "vgdb-pipe-", 10) == 0) continue;
      /* A compiler's temporaries (another build on the machine): ipcref
       * makes no file at all, only memfds. */
      if (ends_with(now.names[i], ".o") || ends_with(now.names[i], ".s"))
        continue;
      snprintf(path, sizeof path, "%s/%s", dir, now.names[i]);
      if (open_elsewhere(path)) continue;
      if (tries == 50) printf("    new in %s: %s\n", dir, now.names[i]);
      n++;
    }
    names_free(&now);
    if (n == 0 || tries == 50) return n;
    sleep_us(100000);
  }
}

static void test_no_residue(void) {
  CHECK_EQ(new_entries("/dev/shm", &before_shm), 0);
  CHECK_EQ(new_entries("/tmp", &before_tmp), 0);
  names_free(&before_shm);
  names_free(&before_tmp);
}

/* ------------------------------------------------------------ main */

static int run_role(const child_args *a) {
  switch (a->role) {
  case R_HOLDER: return holder_child(a);
  case R_SOAK_B: return soak_b(a);
  case R_CONSUMER: return consumer_child(a);
  case R_FORWARDER: return forwarder_child(a);
  case R_PRODUCER: return producer_child(a);
  case R_READ_PRODUCER: return reader_producer(a);
  case R_READER: return reader_child(a);
  default: return 99;
  }
}

/* One consumer case before the measured ones, so that one-time
 * allocations (stdio, malloc arenas) are not counted as a case's. */
static void warm_up(void) {
  int fails = harness_failures_in_test;
  consumer_case(L_RECEIVE, 99, 0);
  memset(not_reached, 0, sizeof not_reached);
  harness_failures_in_test = fails;
}

int main(void) {
  long t0 = now_ms();
  path_say("test_crash");
  if (proc_start() != 0) {
    printf("test_crash: cannot start the spawner\n0 passed, 1 failed\n");
    return 1;
  }
  res_all_maps = 1; /* every mapping is back after a case, not only memfds */
  names_of("/dev/shm", &before_shm);
  names_of("/tmp", &before_tmp);
  seed = harness_env_long("IPCREF_TEST_SEED", (long)time(NULL));
  rng_state = (uint64_t)seed;
  printf("test_crash: seed %ld (IPCREF_TEST_SEED)%s\n", seed,
         have_pidfd ? "" : "; no pidfd_open: deaths seen by pid");
  ipcref_set_error_hook(&error_hook);
  ipcref_test_set_step_hook(step_hook); /* notes steps; never stops here */
  warm_up();
  RUN(test_kill_consumer_at_each_step);
  RUN(test_kill_forwarder_at_each_step);
  RUN(test_kill_producer_at_each_step);
  RUN(test_every_step_labelled);
  RUN(test_producer_killed_while_read);
  RUN(test_send_after_reaped_death);
  RUN(test_kill_soak);
  if (spawner_stop() != 0) printf("    spawner: not clean\n");
  RUN(test_no_residue);
  ipcref_test_set_step_hook(NULL);
  ipcref_set_error_hook(NULL);
  printf("test_crash: %ld ms\n", now_ms() - t0);
  return harness_finish();
}
