/* Peers in real programs: event loops and forks.
 *
 * What an epoll loop sees of a peer: a consumer forked from this process
 * waits only on ipcref_peer_poll_fd and receives once per wake-up, as the
 * simplest loop does; every view sent must reach it with no further
 * message. (Over the socket alone, the views of a batch after its first
 * wait inside the peer, and the loop never wakes.)
 *
 * A child forked after the contexts were made (a data loader's worker)
 * must not use them: its calls are refused and named, and letting go of
 * its copies of buffers changes nothing in the parent. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#define IPCREF_TEST_HOOKS /* a consumer stopped in its peer's free */
#include "../ipcref.h"
#include "share_fixture.h"

#define CTL_MS  30000 /* longest wait for a command or a reply */
#define BATCH   IPCREF_MSG_MAX_VIEWS
#define LOOP_MS 5000 /* the loop gives up after this long without a view */

/* The consumer's loop: waits on the peer's poll fd (epoll), receives once
 * per wake-up with a zero timeout, until `want` views came or LOOP_MS pass
 * without one. Replies with the views received, then the wake-ups that
 * found nothing (its hello, say). */
static int loop_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
  ipcref_view held[BATCH];
  int ep, pfd, got = 0, idle = 0, want = ctl_get(k->their_ctl, CTL_MS), i;
  struct epoll_event ev;
  if (!p || want <= 0 || want > BATCH) return 2;
  pfd = ipcref_peer_poll_fd(p);
  CHECK(pfd >= 0);
  CHECK_EQ(ipcref_peer_poll_fd(p), pfd); /* the same fd every call */
  ep = epoll_create1(EPOLL_CLOEXEC);
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  CHECK_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, pfd, &ev), 0);
  ctl_put(k->their_ctl, 'l'); /* in the loop */
  while (got < want && epoll_wait(ep, &ev, 1, LOOP_MS) == 1) {
    ipcref_result r = ipcref_recv(p, &held[got], 0);
    if (r == IPCREF_OK)
      got++;
    else if (r == IPCREF_EAGAIN)
      idle++;
    else
      break;
  }
  ctl_put(k->their_ctl, got);
  ctl_put(k->their_ctl, idle);
  for (i = 0; i < got; i++) ipcref_view_release(&held[i]);
  close(ep);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* Sends `n` views of one block each, in one message. */
static void send_batch(ipcref_ctx *ctx, ipcref_peer *p, int n) {
  ipcref_view v[BATCH];
  int i;
  const int64_t len = 256;
  for (i = 0; i < n; i++)
    CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &len, &v[i]), IPCREF_OK);
  CHECK_EQ(ipcref_send_batch(p, v, n), IPCREF_OK);
  for (i = 0; i < n; i++) ipcref_view_release(&v[i]);
}

/* A batch of 16 received by an epoll loop: all 16 come, one per wake-up,
 * though the socket is readable only for the first. */
static void test_batch_wakes_the_loop(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  int got, idle;
  kid_start(&k, 1, SOCK_SEQPACKET, loop_consumer);
  ctx = make_ctx(NULL);
  p = kid_peer(&k, 0, ctx);
  ctl_put(k.ctl, BATCH);
  CTL_EXPECT(k.ctl, 'l');
  send_batch(ctx, p, BATCH);
  got = ctl_get(k.ctl, CTL_MS);
  idle = ctl_get(k.ctl, CTL_MS);
  printf("    %d of %d views, %d wake-ups with nothing\n", got, BATCH, idle);
  CHECK_EQ(got, BATCH);
  CHECK(idle <= 2); /* the hello; a spurious one is allowed */
  KID_END(&k, "consumer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* A batch received before the poll fd was made: the fd is readable at
 * once, and stays so until its last view is taken. */
static void test_batch_before_the_fd(void) {
  local_pair l;
  ipcref_view v[3], extra;
  struct pollfd pf;
  res_mark m;
  int i;
  res_begin(&m);
  local_pair_open(&l, NULL, NULL);
  if (!l.pp || !l.cp) return;
  send_batch(l.prod, l.pp, 3);
  CHECK_EQ(ipcref_recv(l.cp, &v[0], 1000), IPCREF_OK);
  pf.fd = ipcref_peer_poll_fd(l.cp);
  pf.events = POLLIN;
  for (i = 1; i < 3; i++) {
    pf.revents = 0;
    CHECK_EQ(poll(&pf, 1, 0), 1); /* views wait */
    CHECK_EQ(ipcref_recv(l.cp, &v[i], 0), IPCREF_OK);
  }
  pf.revents = 0;
  CHECK_EQ(poll(&pf, 1, 0), 0); /* nothing left, nothing on the socket */
  CHECK_EQ(ipcref_recv(l.cp, &extra, 0), IPCREF_EAGAIN);
  for (i = 0; i < 3; i++) ipcref_view_release(&v[i]);
  local_pair_close(&l);
  RES_END(&m); /* the poll fd and its eventfd went with the peer */
}

/* ---- records cut short on a stream -----------------------------------------
 */

/* Writes bytes [from, to) of `msg` framed as a stream record (its 4-byte
 * length, then its bytes) to `fd`, with its fds when `with_fds` (through
 * the tests' own transport, tests/xfer.h). */
static void write_part(int fd, const ipcref_msg *msg, size_t from, size_t to,
                       int with_fds) {
  static ipcref_msg part; /* large: not on the stack */
  unsigned char framed[4 + IPCREF_MSG_MAX_BYTES];
  size_t len = msg->len;
  framed[0] = (unsigned char)len, framed[1] = (unsigned char)(len >> 8);
  framed[2] = (unsigned char)(len >> 16),
  framed[3] = (unsigned char)(len >> 24);
  memcpy(framed + 4, msg->bytes, len);
  memset(&part, 0, sizeof part);
  memcpy(part.bytes, framed + from, to - from);
  part.len = to - from;
  part.nfds = with_fds ? msg->nfds : 0;
  memcpy(part.fds, msg->fds, sizeof(int) * (size_t)part.nfds);
  CHECK_EQ(xfer_send(fd, &part), 0);
}

/* A stream peer that sends a record's length (or a little more) and stops:
 * a zero-timeout receive returns at once, and keeps what came; the rest
 * completes the record at a later call, whose view is whole. Cut after 4
 * bytes (the length), after 10, and one byte before the end. */
static void test_record_cut_short(void) {
  static const size_t cuts[3] = {4, 10, 0};
  int t, sv[2];
  for (t = 0; t < 3; t++) {
    ipcref_ctx *prod = make_ctx(NULL), *cons = make_ctx(NULL);
    ipcref_peer *pp, *cp;
    ipcref_msg msg;
    ipcref_view v, got;
    const int64_t n = 4096;
    size_t cut;
    long t0;
    if (xsocketpair(SOCK_STREAM, sv) != 0) return;
    pp = make_peer(prod, sv[0]);
    cp = make_peer(cons, sv[1]);
    CHECK_EQ(ipcref_view_new_shared(prod, IPCREF_U8, 1, &n, &v), IPCREF_OK);
    memset(ipcref_buf_data(v.buf), 0x5a, 4096);
    CHECK_EQ(ipcref_export(pp, &v, &msg), IPCREF_OK);
    cut = cuts[t] ? cuts[t] : 4 + msg.len - 1;
    write_part(sv[0], &msg, 0, cut, 1);
    t0 = now_ms();
    CHECK_EQ(ipcref_recv(cp, &got, 0), IPCREF_EAGAIN);
    CHECK_EQ(ipcref_recv(cp, &got, 50), IPCREF_ETIMEDOUT);
    CHECK(now_ms() - t0 < 2000); /* it never hung */
    write_part(sv[0], &msg, cut, 4 + msg.len, 0);
    ipcref_msg_sent(&msg);
    CHECK_EQ(ipcref_recv(cp, &got, 0), IPCREF_OK);
    CHECK_EQ(((unsigned char *)ipcref_buf_data(got.buf))[got.byte_offset],
             0x5a);
    CHECK_EQ(ipcref_view_numel(&got), 4096);
    ipcref_view_release(&got);
    ipcref_view_release(&v);
    ipcref_peer_free(cp);
    ipcref_peer_free(pp);
    CHECK_EQ(stats_of(prod).live_slots, 0);
    ipcref_ctx_free(cons);
    ipcref_ctx_free(prod);
  }
}

/* A hello cut short on a stream: a receive with a zero timeout does not
 * wait for the rest, and a peer that never finishes its hello is freed
 * without a hang. */
static void test_hello_cut_short(void) {
  ipcref_ctx *cons = make_ctx(NULL);
  ipcref_peer *cp;
  ipcref_view got;
  int sv[2];
  long t0;
  const unsigned char part[2] = {20, 0};
  if (xsocketpair(SOCK_STREAM, sv) != 0) return;
  cp = make_peer(cons, sv[1]);
  CHECK_EQ(write(sv[0], part, sizeof part), (ssize_t)sizeof part);
  t0 = now_ms();
  CHECK_EQ(ipcref_recv(cp, &got, 0), IPCREF_EAGAIN);
  CHECK_EQ(ipcref_recv(cp, &got, 0), IPCREF_EAGAIN);
  CHECK_EQ(ipcref_peer_alive(cp), 1);
  CHECK(now_ms() - t0 < 2000);
  ipcref_peer_free(cp);
  tclose(sv[0]);
  ipcref_ctx_free(cons);
}

/* ---- the wire version -----------------------------------------------------
 */

static char heard_msg[256];
static int heard_eproto;
static void hear_eproto(void *user, ipcref_result code, const char *msg) {
  (void)user;
  if (code != IPCREF_EPROTO) return;
  heard_eproto++;
  snprintf(heard_msg, sizeof heard_msg, "%s", msg ? msg : "");
}

/* Sends a hello of wire version `version` on a SOCK_SEQPACKET socket, with
 * this process's credentials, as another build of ipcref.h would. */
static void send_hello(int fd, uint32_t version) {
  unsigned char b[20];
  uint32_t magic = 0x48435049u, pid = (uint32_t)getpid();
  uint64_t nonce = 12345;
  union {
    char buf[CMSG_SPACE(sizeof(struct ucred))];
    struct cmsghdr align;
  } u;
  struct ucred cred;
  struct msghdr mh;
  struct iovec iov;
  struct cmsghdr *c;
  memcpy(b, &magic, 4), memcpy(b + 4, &version, 4), memcpy(b + 8, &pid, 4);
  memcpy(b + 12, &nonce, 8);
  memset(&u, 0, sizeof u);
  cred.pid = getpid(), cred.uid = getuid(), cred.gid = getgid();
  memset(&mh, 0, sizeof mh);
  iov.iov_base = b;
  iov.iov_len = sizeof b;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = u.buf;
  mh.msg_controllen = sizeof u.buf;
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_CREDENTIALS;
  c->cmsg_len = CMSG_LEN(sizeof cred);
  memcpy(CMSG_DATA(c), &cred, sizeof cred);
  CHECK_EQ(sendmsg(fd, &mh, 0), (ssize_t)sizeof b);
}

/* A peer that speaks another wire version (a program built with another
 * ipcref.h) is refused with EPROTO, and the error hook names both
 * versions; it is never read as if it spoke ours. */
static void test_other_wire_version(void) {
  ipcref_ctx_options o;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view got;
  int sv[2];
  memset(&o, 0, sizeof o);
  o.error_hook.fn = hear_eproto;
  ctx = make_ctx(&o);
  if (xsocketpair(SOCK_SEQPACKET, sv) != 0) return;
  p = make_peer(ctx, sv[1]);
  send_hello(sv[0], 99);
  heard_eproto = 0;
  CHECK_EQ(ipcref_recv(p, &got, 1000), IPCREF_EPROTO);
  CHECK_EQ(heard_eproto, 1);
  printf("    heard: %s\n", heard_msg);
  CHECK(strstr(heard_msg, "version 99") != NULL);
  CHECK(strstr(heard_msg, "this process 2") != NULL);
  CHECK_EQ(ipcref_recv(p, &got, 0), IPCREF_EPROTO); /* and stays refused */
  ipcref_peer_free(p);
  tclose(sv[0]);
  ipcref_ctx_free(ctx);
}

/* ---- fork ---------------------------------------------------------------
 */

static int heard_dead;
static void hear(void *user, ipcref_result code, const char *msg) {
  (void)user;
  (void)msg;
  heard_dead += code == IPCREF_EDEAD;
}

/* What the forked child does with its parent's contexts, peer and
 * buffers: every call is refused (and heard), every release is a no-op. */
typedef struct fork_arg {
  local_pair *l;
  ipcref_view got;  /* received by the parent's consumer */
  ipcref_buf *mine; /* made by the parent's producer */
  int report;       /* the child writes its failed checks here */
} fork_arg;

static int forked_child(void *arg) {
  fork_arg *a = (fork_arg *)arg;
  ipcref_buf *b = NULL;
  ipcref_view v;
  ipcref_stats st;
  ipcref_error_hook h;
  h.fn = hear;
  h.user = NULL;
  ipcref_set_error_hook(&h);
  CHECK_EQ(ipcref_shared_new(a->l->prod, 64, &b), IPCREF_EDEAD);
  CHECK(b == NULL);
  CHECK_EQ(ipcref_send(a->l->pp, &a->got), IPCREF_EDEAD);
  CHECK_EQ(ipcref_recv(a->l->cp, &v, 0), IPCREF_EDEAD);
  CHECK_EQ(ipcref_ctx_stats(a->l->prod, &st), IPCREF_EDEAD);
  CHECK_EQ(ipcref_collect(a->l->cons), 0);
  CHECK_EQ(ipcref_peer_poll_fd(a->l->cp), -1);
  ipcref_view_release(&a->got); /* the parent's lease stays the parent's */
  ipcref_buf_release(a->mine);
  ipcref_peer_free(a->l->cp);
  ipcref_ctx_free(a->l->prod);
  CHECK_EQ(heard_dead, 8);
  /* Its copies of the parent's objects are left by design: under valgrind
   * the child ends in an exec, so that they are not counted as leaks. */
  CHECK_EQ(write(a->report, &harness_failures_in_test, sizeof(int)),
           (ssize_t)sizeof(int));
  if (under_valgrind) execl("/bin/true", "true", (char *)NULL);
  return 0;
}

/* A child forked after the contexts were made: refused by name, and the
 * parent's producer sees nothing of it: the lease its consumer holds is
 * still live (the child's release of its copy returned nothing), no
 * return is bad, and the pair goes on working. */
static void test_forked_child_refused(void) {
  local_pair l;
  fork_arg a;
  ipcref_view v;
  ipcref_stats st;
  res_mark m;
  const int64_t len = 4096;
  res_begin(&m);
  local_pair_open(&l, NULL, NULL);
  if (!l.pp || !l.cp) return;
  a.l = &l;
  CHECK_EQ(ipcref_view_new_shared(l.prod, IPCREF_U8, 1, &len, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l.cp, &a.got, 1000), IPCREF_OK);
  a.mine = ipcref_buf_retain(v.buf);
  {
    int fds[2], failed = -1, st;
    pid_t pid;
    CHECK_EQ(xpipe(fds), 0);
    a.report = fds[1];
    pid = fork_child(forked_child, &a, fds[1], -1);
    CHECK_EQ(read(fds[0], &failed, sizeof failed), (ssize_t)sizeof failed);
    CHECK_EQ(failed, 0); /* the child's checks */
    st = wait_child(pid, REAP_MS);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    tclose(fds[0]);
    tclose(fds[1]);
  }
  st = stats_of(l.prod);
  CHECK_EQ(st.live_slots, 1); /* the parent's consumer still holds it */
  CHECK_EQ(st.live_bufs, 1);
  ipcref_view_release(&a.got);
  ipcref_buf_release(a.mine);
  ipcref_view_release(&v);
  ipcref_collect(l.prod);
  st = stats_of(l.prod);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.bad_returns, 0);
  CHECK_EQ(ipcref_view_new_shared(l.prod, IPCREF_U8, 1, &len, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK); /* still works */
  ipcref_view_release(&v);
  CHECK_EQ(ipcref_recv(l.cp, &v, 1000), IPCREF_OK);
  ipcref_view_release(&v);
  local_pair_close(&l);
  RES_END(&m); /* everything of the parent's went */
}

/* ---- a stuck consumer ------------------------------------------------------
 */

/* A consumer that reads nothing until told ('a'), then receives all there
 * is (until nothing comes for 500 ms), each checked to carry the next
 * sequence number in its first 8 bytes, and releases it. Replies with the
 * count, or -1 when one was out of order. */
static int drain_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
  uint64_t want = 0, seq;
  ipcref_view v;
  int bad = 0;
  if (!p) return 2;
  ctl_put(k->their_ctl, 'h'); /* its hello is out */
  if (ctl_get(k->their_ctl, CTL_MS) != 'a') return 3;
  while (ipcref_recv(p, &v, 500) == IPCREF_OK) {
    memcpy(&seq, ipcref_view_data(&v), sizeof seq);
    bad += seq != want++;
    ipcref_view_release(&v);
  }
  ctl_put(k->their_ctl, bad ? -1 : (int)want);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* Sends `n` views numbered from *seq in one message. Eight dimensions
 * each: a batch's record is then larger than a small stream socket takes
 * at once. */
static ipcref_result send_numbered(ipcref_ctx *ctx, ipcref_peer *p, int n,
                                   uint64_t *seq) {
  ipcref_view v[BATCH];
  const int64_t shape[8] = {1, 1, 1, 1, 1, 1, 1, 64};
  ipcref_result r;
  int i;
  for (i = 0; i < n; i++) {
    uint64_t s = *seq + (uint64_t)i;
    CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 8, shape, &v[i]),
             IPCREF_OK);
    memcpy(ipcref_buf_data(v[i].buf), &s, sizeof s);
  }
  r = ipcref_send_batch(p, v, n);
  if (r == IPCREF_OK) *seq += (uint64_t)n;
  for (i = 0; i < n; i++) ipcref_view_release(&v[i]);
  return r;
}

/* A consumer that stops reading, with a non-blocking socket (seqpacket
 * and stream) or a blocking one with a send timeout: the producer's send
 * says EAGAIN (wanting POLLOUT) or ETIMEDOUT, and takes nothing then: its
 * live leases are those of what was sent, and the consumer, once it reads,
 * gets every one of those, whole and in order, and no other. On a stream a
 * record the socket took in part is finished by ipcref_peer_flush. */
static void stuck_consumer(int type, int nonblocking, int per_msg) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_peer_options o;
  ipcref_result r = IPCREF_OK;
  ipcref_stats st;
  struct pollfd pf;
  uint64_t seq = 0;
  long t0 = 0;
  int i;
  memset(&o, 0, sizeof o);
  o.send_timeout_ms = nonblocking ? 0 : 100;
  kid_start(&k, 1, type, drain_consumer);
  ctx = make_ctx(NULL);
  if (nonblocking)
    CHECK_EQ(fcntl(k.sock[0], F_SETFL, fcntl(k.sock[0], F_GETFL) | O_NONBLOCK),
             0);
  if (type == SOCK_STREAM) { /* small buffers: records taken in part */
    int small = 1;           /* the least the kernel allows */
    CHECK_EQ(setsockopt(k.sock[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small),
             0);
  }
  CHECK_EQ(ipcref_peer_new_with(ctx, k.sock[0], &o, &p), IPCREF_OK);
  tforget(k.sock[0]);
  k.sock[0] = -1;
  CTL_EXPECT(k.ctl, 'h');
  for (i = 0; i < 100000 && r == IPCREF_OK; i++) {
    t0 = now_ms();
    r = send_numbered(ctx, p, per_msg, &seq);
  }
  CHECK_EQ(r, nonblocking ? IPCREF_EAGAIN : IPCREF_ETIMEDOUT);
  pf.fd = ipcref_peer_poll_fd(p);
  pf.events = POLLIN;
  pf.revents = 0;
  if (nonblocking) {
    CHECK_EQ(ipcref_peer_wants(p), POLLOUT);
    CHECK_EQ(poll(&pf, 1, 0), 0); /* full, and nothing to read */
  }
  if (!nonblocking) CHECK(now_ms() - t0 >= 90); /* it waited its timeout */
  st = stats_of(ctx);
  printf("    %s, %s: %llu views sent before %s\n",
         type == SOCK_STREAM ? "stream" : "seqpacket",
         nonblocking ? "non-blocking" : "a 100 ms send timeout",
         (unsigned long long)seq, ipcref_strerror(r));
  CHECK_EQ(st.live_slots, seq); /* what failed took nothing */
  CHECK_EQ(st.limbo_blocks, seq);
  ctl_put(k.ctl, 'a');
  if (nonblocking) /* the poll fd wakes once there is room */
    CHECK_EQ(poll(&pf, 1, CTL_MS), 1);
  t0 = now_ms();
  while ((r = ipcref_peer_flush(p)) != IPCREF_OK && now_ms() - t0 < CTL_MS)
    sleep_us(1000); /* a record the stream took in part */
  CHECK_EQ(r, IPCREF_OK);
  CHECK_EQ(ctl_get(k.ctl, CTL_MS), (int)seq);
  KID_END(&k, "consumer");
  ipcref_collect(ctx);
  st = stats_of(ctx);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

static void test_stuck_consumer_seqpacket(void) {
  stuck_consumer(SOCK_SEQPACKET, 1, 1);
}
static void test_stuck_consumer_stream(void) {
  stuck_consumer(SOCK_STREAM, 1, BATCH);
}
static void test_stuck_consumer_send_timeout(void) {
  stuck_consumer(SOCK_SEQPACKET, 0, 4);
}

/* A client that connects and never says hello: with non-blocking sockets
 * the producer's send to it says EAGAIN (wanting POLLIN) at once, and a
 * consumer beside it gets its views without waiting; past hello_timeout_ms
 * the silent one is refused for good (EPEER), nothing leased to it. */
static void test_silent_client(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *silent = NULL, *p = NULL;
  ipcref_peer_options o;
  uint64_t seq = 0;
  long t0, dt;
  int sv[2];
  memset(&o, 0, sizeof o);
  o.hello_timeout_ms = 300;
  kid_start(&k, 1, SOCK_SEQPACKET, drain_consumer);
  ctx = make_ctx(NULL);
  CHECK_EQ(xsocketpair(SOCK_SEQPACKET, sv), 0);
  CHECK_EQ(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
  CHECK_EQ(fcntl(k.sock[0], F_SETFL, O_NONBLOCK), 0);
  CHECK_EQ(ipcref_peer_new_with(ctx, sv[0], &o, &silent), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new_with(ctx, k.sock[0], &o, &p), IPCREF_OK);
  tforget(sv[0]);
  tforget(k.sock[0]);
  k.sock[0] = -1;
  CTL_EXPECT(k.ctl, 'h');
  t0 = now_ms();
  CHECK_EQ(send_numbered(ctx, silent, 1, &seq), IPCREF_EAGAIN);
  CHECK_EQ(ipcref_peer_wants(silent), POLLIN);
  CHECK_EQ(send_numbered(ctx, p, 1, &seq), IPCREF_OK);
  dt = now_ms() - t0;
  printf("    the consumer beside a silent client: served in %ld ms\n", dt);
  CHECK(dt < 100 * slow);
  sleep_us(400 * 1000L); /* past its hello_timeout_ms */
  CHECK_EQ(send_numbered(ctx, silent, 1, &seq), IPCREF_EPEER);
  CHECK_EQ(send_numbered(ctx, silent, 1, &seq), IPCREF_EPEER); /* for good */
  CHECK_EQ(stats_of(ctx).live_slots, 1); /* the consumer's only */
  ctl_put(k.ctl, 'a');
  CHECK_EQ(ctl_get(k.ctl, CTL_MS), 1);
  KID_END(&k, "consumer");
  ipcref_peer_free(silent);
  ipcref_peer_free(p);
  tclose(sv[1]);
  ipcref_ctx_free(ctx);
}

/* ---- what waits on time -----------------------------------------------------
 */

/* ipcref_ctx_timeout: -1 with nothing waiting; a hello awaited counts
 * down to its deadline; a hole in a return ring (a consumer that took a
 * ring position and died before writing it) is due 100 ms after it was
 * seen, and once stepped over nothing waits. */
static void test_ctx_timeout(void) {
  local_pair l;
  ipcref_peer_options o;
  ipcref_peer *silent = NULL;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_view got;
  ipcref__ledger_hdr *h;
  uint64_t seq = 0;
  int sv[2], t;
  CHECK_EQ(ipcref_ctx_timeout(ctx), -1);
  CHECK_EQ(ipcref_ctx_timeout(NULL), -1);
  memset(&o, 0, sizeof o);
  o.hello_timeout_ms = 300;
  CHECK_EQ(xsocketpair(SOCK_SEQPACKET, sv), 0);
  CHECK_EQ(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
  CHECK_EQ(ipcref_peer_new_with(ctx, sv[0], &o, &silent), IPCREF_OK);
  tforget(sv[0]);
  CHECK_EQ(ipcref_ctx_timeout(ctx), -1); /* nothing asked for its hello */
  CHECK_EQ(send_numbered(ctx, silent, 1, &seq), IPCREF_EAGAIN);
  t = ipcref_ctx_timeout(ctx);
  CHECK(t >= 0 && t <= 300); /* 0: a slow machine took it all already */
  sleep_us((t + 20) * 1000L);
  CHECK_EQ(ipcref_ctx_timeout(ctx), 0); /* due */
  CHECK_EQ(send_numbered(ctx, silent, 1, &seq), IPCREF_EPEER);
  CHECK_EQ(ipcref_ctx_timeout(ctx), -1); /* refused: nothing waits */
  ipcref_peer_free(silent);
  tclose(sv[1]);
  ipcref_ctx_free(ctx);
  /* A hole. */
  local_pair_open(&l, NULL, NULL);
  if (!l.pp || !l.cp) return;
  send_batch(l.prod, l.pp, 1);
  CHECK_EQ(ipcref_recv(l.cp, &got, 1000), IPCREF_OK);
  h = (ipcref__ledger_hdr *)(void *)l.prod->ledgers->base;
  (void)__atomic_fetch_add(&h->head, 1, __ATOMIC_RELEASE); /* never written */
  t = ipcref_ctx_timeout(l.prod);
  CHECK(t >= 0 && t <= IPCREF__HOLE_MS);
  /* Not t: under valgrind the look at the watches may come sooner. */
  sleep_us((IPCREF__HOLE_MS + 20) * 1000L);
  CHECK(nothing_waits(l.prod)); /* stepped over */
  ipcref_view_release(&got);    /* its own return comes after the hole */
  ipcref_collect(l.prod);
  CHECK_EQ(stats_of(l.prod).live_slots, 0);
  CHECK_EQ(stats_of(l.prod).bad_returns, 0);
  local_pair_close(&l);
}

/* ---- peers by path ----------------------------------------------------------
 */

static char g_path[108];
static int g_late_ms; /* path_consumer connects this long after 'g' */

/* A consumer started on its own: connects by path (g_late_ms after it is
 * told), takes one view, checks its bytes, acks. */
static int path_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = NULL;
  ipcref_view v;
  int ok;
  if (ctl_get(k->their_ctl, CTL_MS) != 'g') return 3; /* it listens */
  sleep_us(g_late_ms * 1000L);
  CHECK_EQ(ipcref_connect(ctx, g_path, &p), IPCREF_OK);
  if (!p) return 2;
  ok = ipcref_recv(p, &v, CTL_MS) == IPCREF_OK;
  ok = ok && ((const unsigned char *)ipcref_view_data(&v))[4095] == 0x33;
  if (ok) ipcref_view_release(&v);
  ctl_put(k->their_ctl, ok ? 'y' : 'n');
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* A producer listens at a path, a consumer process connects by it; a view
 * crosses. Filesystem paths and the abstract namespace. */
static void test_listen_and_connect(void) {
  char dir[] = "/tmp/ipcref-path-XXXXXX";
  int t;
  if (!mkdtemp(dir)) {
    CHECK(!"mkdtemp");
    return;
  }
  for (t = 0; t < 2; t++) {
    ipcref_ctx *ctx;
    ipcref_peer *p = NULL;
    ipcref_view v;
    int lfd = -1;
    const int64_t n = 4096;
    kid k;
    if (t == 0)
      snprintf(g_path, sizeof g_path, "%s/sock", dir);
    else
      snprintf(g_path, sizeof g_path, "@ipcref-test-%d", (int)getpid());
    kid_start(&k, 0, SOCK_SEQPACKET, path_consumer); /* before the ctx */
    ctx = make_ctx(NULL);
    CHECK_EQ(ipcref_listen(ctx, g_path, &lfd), IPCREF_OK);
    if (t == 1) CHECK_EQ(fcntl(lfd, F_SETFL, O_NONBLOCK), 0);
    ctl_put(k.ctl, 'g');
    CHECK_EQ(ipcref_accept(ctx, lfd, CTL_MS, &p), IPCREF_OK);
    if (p) /* a non-blocking listener's peers are non-blocking */
      CHECK_EQ(ipcref__nonblocking(p->fd), t == 1);
    if (p) {
      CHECK_EQ(ipcref_peer_pid(p), k.pid);
      CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v), IPCREF_OK);
      memset(ipcref_buf_data(v.buf), 0x33, 4096);
      CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
      ipcref_view_release(&v);
      CTL_EXPECT(k.ctl, 'y');
    }
    KID_END(&k, "consumer");
    ipcref_peer_free(p);
    close(lfd);
    if (t == 0) unlink(g_path);
    ipcref_ctx_free(ctx);
  }
  rmdir(dir);
}

/* A socket file left by a listener that died is replaced; one a listener
 * lives at is not (ESYS, EADDRINUSE). Wrong paths and a silent listener. */
static void test_listen_errors(void) {
  char dir[] = "/tmp/ipcref-path-XXXXXX", path[108], longp[200];
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = NULL;
  int a = -1, b = -1;
  if (!mkdtemp(dir)) {
    CHECK(!"mkdtemp");
    return;
  }
  snprintf(path, sizeof path, "%s/sock", dir);
  CHECK_EQ(ipcref_listen(ctx, path, &a), IPCREF_OK);
  CHECK_EQ(ipcref_listen(ctx, path, &b), IPCREF_ESYS); /* a lives */
  CHECK_EQ(errno, EADDRINUSE);
  /* Its probe connected and left: a hang-up to accept, then nothing. */
  CHECK_EQ(ipcref_accept(ctx, a, 0, &p), IPCREF_EPEER);
  CHECK_EQ(ipcref_accept(ctx, a, 0, &p), IPCREF_ETIMEDOUT);
  CHECK(p == NULL);
  close(a); /* its listener gone, the file stays */
  CHECK_EQ(ipcref_listen(ctx, path, &b), IPCREF_OK); /* replaced */
  close(b);
  unlink(path);
  CHECK_EQ(ipcref_connect(ctx, path, &p), IPCREF_EPEER); /* nobody */
  memset(longp, 'x', sizeof longp - 1);
  longp[sizeof longp - 1] = '\0';
  CHECK_EQ(ipcref_listen(ctx, longp, &b), IPCREF_EINVAL);
  CHECK_EQ(ipcref_listen(ctx, "", &b), IPCREF_EINVAL);
  CHECK_EQ(ipcref_listen(ctx, "@", &b), IPCREF_EINVAL);
  CHECK_EQ(ipcref_listen(ctx, NULL, &b), IPCREF_EINVAL);
  CHECK_EQ(ipcref_listen(ctx, path, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_listen(NULL, path, &b), IPCREF_EINVAL);
  CHECK_EQ(ipcref_connect(ctx, longp, &p), IPCREF_EINVAL);
  CHECK_EQ(ipcref_connect(ctx, path, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_accept(ctx, -1, 0, &p), IPCREF_EINVAL);
  CHECK_EQ(ipcref_accept(ctx, 0, 0, NULL), IPCREF_EINVAL);
  {
    int sv[2]; /* not a listening socket */
    CHECK_EQ(xsocketpair(SOCK_SEQPACKET, sv), 0);
    CHECK_EQ(ipcref_accept(ctx, sv[0], -1, &p), IPCREF_EINVAL);
    tclose(sv[0]);
    tclose(sv[1]);
  }
  ipcref_ctx_free(ctx);
  rmdir(dir);
}

/* A path taken by anything but a socket is left alone: ipcref_listen
 * refuses it (ESYS, EADDRINUSE) and the hook says why. Connecting to a
 * regular file, or a symlink to one, is refused as to a dead listener's
 * socket, but neither is one: the file keeps its bytes, the link stays. */
static void test_listen_leaves_files(void) {
  char dir[] = "/tmp/ipcref-path-XXXXXX", file[108], link[108], got[16];
  const char *taken[2];
  ipcref_ctx *ctx = new_ctx(0, 0);
  struct stat st;
  int fd, lfd, i;
  if (!mkdtemp(dir)) {
    CHECK(!"mkdtemp");
    ipcref_ctx_free(ctx);
    return;
  }
  snprintf(file, sizeof file, "%s/data", dir);
  snprintf(link, sizeof link, "%s/link", dir);
  fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  CHECK(fd >= 0 && write(fd, "precious", 8) == 8);
  if (fd >= 0) close(fd);
  CHECK_EQ(symlink(file, link), 0);
  taken[0] = link; /* first, while it names a file */
  taken[1] = file;
  errors_reset();
  for (i = 0; i < 2; i++) {
    lfd = -1;
    CHECK_EQ(ipcref_listen(ctx, taken[i], &lfd), IPCREF_ESYS);
    CHECK_EQ(errno, EADDRINUSE);
    EXPECT_ERRORS(1);
    CHECK_EQ(lfd, -1);
    if (lfd >= 0) close(lfd);
  }
  CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
  CHECK(lstat(file, &st) == 0 && S_ISREG(st.st_mode));
  memset(got, 0, sizeof got);
  fd = open(file, O_RDONLY | O_CLOEXEC);
  CHECK(fd >= 0 && read(fd, got, sizeof got) == 8);
  CHECK(strcmp(got, "precious") == 0);
  if (fd >= 0) close(fd);
  unlink(link);
  unlink(file);
  rmdir(dir);
  ipcref_ctx_free(ctx);
}

/* A non-blocking listener: ipcref_accept with -1 waits for a consumer
 * that connects late; with a timeout and nobody there, ETIMEDOUT, not
 * before it. */
static void test_accept_waits_nonblocking(void) {
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_view v;
  const int64_t n = 4096;
  int lfd = -1;
  long t0, dt;
  kid k;
  snprintf(g_path, sizeof g_path, "@ipcref-test-late-%d", (int)getpid());
  g_late_ms = 100;
  kid_start(&k, 0, SOCK_SEQPACKET, path_consumer); /* before the ctx */
  g_late_ms = 0;
  ctx = make_ctx(NULL);
  CHECK_EQ(ipcref_listen(ctx, g_path, &lfd), IPCREF_OK);
  CHECK_EQ(fcntl(lfd, F_SETFL, O_NONBLOCK), 0);
  t0 = now_ms();
  CHECK_EQ(ipcref_accept(ctx, lfd, 100, &p), IPCREF_ETIMEDOUT); /* nobody */
  dt = now_ms() - t0;
  CHECK(dt >= 100 && dt < 1000 * slow);
  ctl_put(k.ctl, 'g');
  CHECK_EQ(ipcref_accept(ctx, lfd, -1, &p), IPCREF_OK);
  if (p) {
    CHECK_EQ(ipcref_peer_pid(p), k.pid);
    CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v), IPCREF_OK);
    memset(ipcref_buf_data(v.buf), 0x33, 4096);
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ipcref_view_release(&v);
    CTL_EXPECT(k.ctl, 'y');
  }
  close(lfd); /* first: a consumer nobody accepted hears it at once */
  KID_END(&k, "consumer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* ---- waits on a non-blocking socket, and under signals ---------------------
 */

/* A consumer whose socket is non-blocking: one ipcref_recv(p, .., -1)
 * waits for the hello, then for the view; replies with what it returned. */
static int nonblocking_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p;
  ipcref_view v;
  ipcref_result r;
  CHECK_EQ(fcntl(k->their_sock[0], F_SETFL, O_NONBLOCK), 0);
  p = make_peer(ctx, k->their_sock[0]);
  if (!p) return 2;
  ctl_put(k->their_ctl, 'w'); /* about to wait */
  r = ipcref_recv(p, &v, -1);
  ctl_put(k->their_ctl, (int)r);
  if (r == IPCREF_OK) ipcref_view_release(&v);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* A receive with -1 on a non-blocking socket waits as on a blocking one:
 * the hello and then the view come later. SOCK_SEQPACKET and
 * SOCK_STREAM. */
static void test_recv_waits_nonblocking(void) {
  int t;
  for (t = 0; t < 2; t++) {
    const int64_t n = 256;
    ipcref_ctx *ctx;
    ipcref_peer *p;
    ipcref_view v;
    kid k;
    kid_start(&k, 1, t == 0 ? SOCK_SEQPACKET : SOCK_STREAM,
              nonblocking_consumer);
    ctx = make_ctx(NULL);
    CTL_EXPECT(k.ctl, 'w');
    sleep_us(50 * 1000L); /* it waits for the hello */
    p = kid_peer(&k, 0, ctx);
    sleep_us(100 * 1000L); /* and then for the view */
    CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v), IPCREF_OK);
    if (p) CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ipcref_view_release(&v);
    CTL_EXPECT(k.ctl, IPCREF_OK);
    KID_END(&k, "consumer");
    ipcref_peer_free(p);
    ipcref_ctx_free(ctx);
  }
}

#define TICK_MS     50  /* a signal this often */
#define SIG_WAIT_MS 200 /* the timeout of each wait under them */

static pthread_t tick_target;
static int tick_stop;

static void on_tick(int sig) {
  (void)sig;
}

/* SIGUSR1 to the main thread every TICK_MS, *(int *)arg times at most or
 * until tick_stop. */
static void *ticker(void *arg) {
  int i, max = *(int *)arg;
  for (i = 0; i < max && !__atomic_load_n(&tick_stop, __ATOMIC_ACQUIRE); i++) {
    sleep_us(TICK_MS * 1000L);
    pthread_kill(tick_target, SIGUSR1);
  }
  return NULL;
}

/* What waits: an accept (lfd) or a receive (p). */
typedef struct sig_case {
  ipcref_ctx *ctx;
  ipcref_peer *p;
  int lfd;
} sig_case;

static ipcref_result sig_accept(sig_case *c) {
  ipcref_peer *p = NULL;
  ipcref_result r = ipcref_accept(c->ctx, c->lfd, SIG_WAIT_MS, &p);
  ipcref_peer_free(p);
  return r;
}

static ipcref_result sig_recv(sig_case *c) {
  ipcref_view v;
  ipcref_result r = ipcref_recv(c->p, &v, SIG_WAIT_MS);
  if (r == IPCREF_OK) ipcref_view_release(&v);
  return r;
}

static ipcref_result sig_ctx_poll(sig_case *c) {
  return ipcref_ctx_poll(c->ctx, SIG_WAIT_MS, NULL);
}

/* fn waits SIG_WAIT_MS for what never comes, a signal cutting it short
 * every TICK_MS: ETIMEDOUT, not before its time, and well within 10 times
 * it. The signals go on for twice that, so a wait that each one started
 * over would outlast it. */
static void timeout_under_signals(const char *what,
                                  ipcref_result (*fn)(sig_case *),
                                  sig_case *c) {
  int max = 2 * 10 * SIG_WAIT_MS * slow / TICK_MS;
  ipcref_result r;
  pthread_t t;
  long t0, dt;
  tick_target = pthread_self();
  __atomic_store_n(&tick_stop, 0, __ATOMIC_RELEASE);
  if (pthread_create(&t, NULL, ticker, &max) != 0) {
    CHECK(!"pthread_create");
    return;
  }
  t0 = now_ms();
  r = fn(c);
  dt = now_ms() - t0;
  __atomic_store_n(&tick_stop, 1, __ATOMIC_RELEASE);
  pthread_join(t, NULL);
  printf("    %s under signals: %s after %ld ms\n", what, ipcref_strerror(r),
         dt);
  CHECK_EQ(r, IPCREF_ETIMEDOUT);
  CHECK(dt >= SIG_WAIT_MS);
  CHECK(dt < 10 * SIG_WAIT_MS * slow);
}

/* Signals (no SA_RESTART) that interrupt a wait do not start its timeout
 * over: an accept nobody connects to, ipcref_ctx_poll with nobody to
 * reap, a receive of a hello that never comes, and one of a message that
 * never comes. */
static void test_signals_do_not_restart_waits(void) {
  struct sigaction sa, old;
  sig_case c;
  local_pair l;
  char name[64];
  int sv[2];
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_tick; /* no SA_RESTART: each one is an EINTR */
  sigemptyset(&sa.sa_mask);
  CHECK_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  memset(&c, 0, sizeof c);
  c.ctx = make_ctx(NULL);
  c.lfd = -1;
  snprintf(name, sizeof name, "@ipcref-test-signals-%d", (int)getpid());
  CHECK_EQ(ipcref_listen(c.ctx, name, &c.lfd), IPCREF_OK);
  if (c.lfd >= 0) timeout_under_signals("accept", sig_accept, &c);
  if (c.lfd >= 0) close(c.lfd);
  timeout_under_signals("ctx_poll, nobody dies", sig_ctx_poll, &c);
  if (xsocketpair(SOCK_SEQPACKET, sv) == 0) {
    c.p = make_peer(c.ctx, sv[0]); /* the other end never says hello */
    if (c.p) timeout_under_signals("recv, no hello", sig_recv, &c);
    if (!c.p) tclose(sv[0]);
    ipcref_peer_free(c.p);
    tclose(sv[1]);
  }
  ipcref_ctx_free(c.ctx);
  local_pair_open(&l, NULL, NULL);
  if (l.pp && l.cp) {
    CHECK_EQ(ipcref_peer_pid(l.cp), (int)getpid()); /* its hello is read */
    c.p = l.cp;
    timeout_under_signals("recv, nothing sent", sig_recv, &c);
  }
  local_pair_close(&l);
  CHECK_EQ(sigaction(SIGUSR1, &old, NULL), 0);
}

/* ---- who holds what -------------------------------------------------------
 */

/* A forked consumer that holds what it receives until told: replies with
 * the count after each receive ('r'), lets go of all ('d'). */
static int holding_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
  ipcref_view held[BATCH];
  int n = 0, cmd, i;
  if (!p) return 2;
  while ((cmd = ctl_get(k->their_ctl, CTL_MS)) == 'r' || cmd == 'd') {
    if (cmd == 'r') {
      n += n < BATCH && ipcref_recv(p, &held[n], CTL_MS) == IPCREF_OK;
      ctl_put(k->their_ctl, n);
    } else {
      for (i = 0; i < n; i++) ipcref_view_release(&held[i]);
      n = 0;
      ctl_put(k->their_ctl, 0);
    }
  }
  for (i = 0; i < n; i++) ipcref_view_release(&held[i]);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* ipcref_peer_stats says which consumer pins what: the leases a live
 * consumer holds and their bytes, none once it lets go; its pid. */
static void test_peer_stats(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_peer_info in;
  ipcref_view v;
  const int64_t sizes[3] = {100, 5000, 70000};
  size_t bytes = 0;
  int i;
  kid_start(&k, 1, SOCK_SEQPACKET, holding_consumer);
  ctx = make_ctx(NULL);
  p = kid_peer(&k, 0, ctx);
  for (i = 0; i < 3; i++) {
    ipcref_stats st0 = stats_of(ctx);
    CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &sizes[i], &v),
             IPCREF_OK);
    bytes += stats_of(ctx).live_bytes - st0.live_bytes; /* its block */
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ipcref_view_release(&v);
    ctl_put(k.ctl, 'r');
    CTL_EXPECT(k.ctl, i + 1);
  }
  CHECK_EQ(ipcref_peer_stats(p, &in), IPCREF_OK);
  CHECK_EQ(in.pid, k.pid);
  CHECK_EQ(in.alive, 1);
  CHECK_EQ(in.leases, 3);
  CHECK_EQ(in.bytes_held, bytes);
  CHECK_EQ(in.forwarded, 0);
  CHECK_EQ(in.pending, 0);
  ctl_put(k.ctl, 'd');
  CTL_EXPECT(k.ctl, 0);
  CHECK_EQ(ipcref_peer_stats(p, &in), IPCREF_OK);
  CHECK_EQ(in.leases, 0);
  CHECK_EQ(in.bytes_held, 0);
  ctl_put(k.ctl, 'x');
  KID_END(&k, "consumer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* The rest of a batch waiting in the consumer's peer counts as pending. */
static void test_peer_stats_pending(void) {
  local_pair l;
  ipcref_view v;
  ipcref_peer_info in;
  local_pair_open(&l, NULL, NULL);
  if (!l.pp || !l.cp) return;
  send_batch(l.prod, l.pp, 4);
  CHECK_EQ(ipcref_recv(l.cp, &v, 1000), IPCREF_OK);
  CHECK_EQ(ipcref_peer_stats(l.cp, &in), IPCREF_OK);
  CHECK_EQ(in.pending, 3);
  CHECK_EQ(ipcref_peer_stats(l.pp, &in), IPCREF_OK);
  CHECK_EQ(in.leases, 4);
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* Wrong arguments. */
static void test_poll_fd_arguments(void) {
  ipcref_peer_info in;
  local_pair l;
  ipcref_peer_options o;
  ipcref_peer *p = NULL;
  CHECK_EQ(ipcref_peer_poll_fd(NULL), -1);
  CHECK_EQ(ipcref_peer_stats(NULL, &in), IPCREF_EINVAL);
  CHECK_EQ(ipcref_peer_flush(NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_peer_wants(NULL), 0);
  memset(&o, 0, sizeof o);
  o.send_timeout_ms = -1;
  {
    ipcref_ctx *ctx = make_ctx(NULL);
    int sv[2];
    CHECK_EQ(xsocketpair(SOCK_SEQPACKET, sv), 0);
    CHECK_EQ(ipcref_peer_new_with(ctx, sv[0], &o, &p), IPCREF_EINVAL);
    o.send_timeout_ms = 0;
    o.hello_timeout_ms = -5;
    CHECK_EQ(ipcref_peer_new_with(ctx, sv[0], &o, &p), IPCREF_EINVAL);
    CHECK(p == NULL);
    CHECK_EQ(ipcref_peer_new_with(ctx, sv[0], NULL, &p), IPCREF_OK);
    if (p) {
      tforget(sv[0]);
      CHECK_EQ(ipcref_peer_flush(p), IPCREF_OK); /* nothing left */
      CHECK_EQ(ipcref_peer_wants(p), 0);
      ipcref_peer_free(p);
    }
    tclose(sv[1]);
    ipcref_ctx_free(ctx);
  }
  local_pair_open(&l, NULL, NULL);
  if (l.pp) CHECK_EQ(ipcref_peer_stats(l.pp, NULL), IPCREF_EINVAL);
  local_pair_close(&l);
}

/* A consumer that frees its peer while its producer keeps sending, over
 * the socket: what the producer sent before the free is read and given
 * back, and a send after the free drained the socket, before it closed
 * it, fails (EPEER, its lease back) instead of going down, unread, with
 * the socket: once the consumer holds nothing, no lease is out, though it
 * lives on. The consumer leaves 5 records unread for the free's drain,
 * and stops in ipcref_peer_free after it (the step hook) until its
 * producer has sent. */
static int free_stop_ctl = -1; /* the stopped consumer's control socket */
static void free_stop_hook(const char *step) {
  if (strcmp(step, "peer free") != 0 || free_stop_ctl < 0) return;
  ctl_put(free_stop_ctl, 'f');                   /* drained */
  CHECK_EQ(ctl_get(free_stop_ctl, CTL_MS), 's'); /* sent to */
  free_stop_ctl = -1;
}
static int frees_while_sent_to(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
  ipcref_view v;
  int i;
  for (i = 0; i < 45; i++) {
    if (ipcref_recv(p, &v, CTL_MS) != IPCREF_OK) return 2;
    ipcref_view_release(&v);
  }
  /* All 50 sent: 5 wait unread, for the free's drain to give back. */
  if (ctl_get(k->their_ctl, CTL_MS) != 'a') return 3;
  free_stop_ctl = k->their_ctl;
  ipcref_test_set_step_hook(free_stop_hook);
  ipcref_peer_free(p);
  ipcref_test_set_step_hook(NULL);
  ctl_put(k->their_ctl, 1);
  (void)ctl_get(k->their_ctl, CTL_MS); /* lives on, holding nothing */
  ipcref_ctx_free(ctx);
  return 0;
}
static void test_consumer_frees_while_sent_to(void) {
  static const int types[2] = {SOCK_SEQPACKET, SOCK_STREAM};
  int t, i;
  for (t = 0; t < 2; t++) {
    ipcref_peer_options o;
    ipcref_ctx *ctx;
    ipcref_peer *p = NULL;
    ipcref_view v;
    const int64_t n = 64;
    kid k;
    kid_start(&k, 1, types[t], frees_while_sent_to);
    ctx = make_ctx(NULL); /* after the fork: not the child's to free */
    memset(&o, 0, sizeof o);
    o.ring_bytes = IPCREF_KEEP_NONE; /* the socket: where it was lost */
    CHECK_EQ(ipcref_peer_new_with(ctx, k.sock[0], &o, &p), IPCREF_OK);
    if (p) tforget(k.sock[0]), k.sock[0] = -1;
    CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v), IPCREF_OK);
    for (i = 0; p && i < 50; i++) CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ctl_put(k.ctl, 'a'); /* it read 45: 5 wait for its free's drain */
    CHECK_EQ(ctl_get(k.ctl, CTL_MS), 'f'); /* it stopped in its free */
    if (p) CHECK_EQ(ipcref_send(p, &v), IPCREF_EPEER); /* not taken */
    ctl_put(k.ctl, 's');
    CHECK_EQ(ctl_get(k.ctl, CTL_MS), 1);
    ipcref_view_release(&v);
    ipcref_collect(ctx);
    CHECK_EQ(stats_of(ctx).live_slots, 0);
    ctl_put(k.ctl, 'x');
    KID_END(&k, "consumer");
    ipcref_peer_free(p);
    ipcref_ctx_free(ctx);
  }
}

int main(void) {
  fixture_start();
  RUN(test_poll_fd_arguments);
  RUN(test_batch_wakes_the_loop);
  RUN(test_batch_before_the_fd);
  RUN(test_record_cut_short);
  RUN(test_hello_cut_short);
  RUN(test_other_wire_version);
  RUN(test_forked_child_refused);
  RUN(test_peer_stats);
  RUN(test_peer_stats_pending);
  RUN(test_stuck_consumer_seqpacket);
  RUN(test_stuck_consumer_stream);
  RUN(test_stuck_consumer_send_timeout);
  RUN(test_silent_client);
  RUN(test_ctx_timeout);
  RUN(test_listen_and_connect);
  RUN(test_listen_errors);
  RUN(test_listen_leaves_files);
  RUN(test_accept_waits_nonblocking);
  RUN(test_recv_waits_nonblocking);
  RUN(test_signals_do_not_restart_waits);
  RUN(test_consumer_frees_while_sent_to);
  return harness_finish();
}
