/* Backpressure: a producer at its cap waits for room without polling.
 *
 * A peer capped by max_bytes_held refuses a send that would pass the cap
 * (EAGAIN wanting IPCREF_WANTS_ROOM on a non-blocking socket, ETIMEDOUT
 * past send_timeout_ms on a blocking one) and takes nothing; its poll fd
 * becomes readable when the consumer returns a lease, and the send then
 * goes. A context at max_bytes refuses an allocation (ENOMEM); its room fd
 * becomes readable on a return, and ipcref_shared_new_wait sleeps on it.
 * Once room came nothing waits: returns ring no bell, the fds are quiet.
 * Consumers in other processes (fork) return what they were sent. A
 * blocking send waits at most send_timeout_ms in all, for room under the
 * cap and then in the socket. A record a stream took in part goes whole:
 * its rest is kept even out of memory, and wakes the loop. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include "counting_alloc.h" /* before ipcref.h: allocations made to fail */
#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "share_fixture.h"

#define CTL_MS 30000
#define BLOCK  (64 * 1024) /* a size class of its own: 64 KiB exactly */

/* 1 when `fd` is readable within `ms`. */
static int readable(int fd, int ms) {
  struct pollfd pf;
  pf.fd = fd;
  pf.events = POLLIN;
  pf.revents = 0;
  return poll(&pf, 1, ms) == 1 && (pf.revents & POLLIN);
}

static void block_view(ipcref_ctx *ctx, ipcref_view *v) {
  const int64_t n = BLOCK;
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, v), IPCREF_OK);
}

static size_t held_by(ipcref_peer *p) {
  return peer_info_of(p).bytes_held;
}

/* 1 when the producer's ledgers ask returners to ring. */
static int armed(ipcref_ctx *ctx) {
  const ipcref__ledger *l;
  int any = 0;
  for (l = ctx->ledgers; l; l = l->next)
    any |= (int)__atomic_load_n(
        &((ipcref__ledger_hdr *)(void *)l->base)->waiting, __ATOMIC_ACQUIRE);
  return any;
}

/* A producer peer on a socketpair of `type` (flags: SOCK_NONBLOCK) with
 * options `o`, and a consumer peer in context `cons`. */
static void capped_pair(ipcref_ctx *prod, ipcref_ctx *cons, int type,
                        const ipcref_peer_options *o, ipcref_peer **pp,
                        ipcref_peer **cp) {
  int sv[2];
  *pp = *cp = NULL;
  if (xsocketpair(type, sv) != 0) return;
  CHECK_EQ(ipcref_peer_new_with(prod, sv[0], o, pp), IPCREF_OK);
  if (*pp) tforget(sv[0]);
  *cp = make_peer(cons, sv[1]);
}

/* A non-blocking peer capped at two blocks: the third send says EAGAIN
 * wanting room and takes nothing; the poll fd wakes when the consumer
 * lets one go, and the send goes; afterwards nothing is armed. */
static void test_peer_cap_nonblocking(void) {
  ipcref_ctx *prod = make_ctx(NULL), *cons = make_ctx(NULL);
  ipcref_peer_options o;
  ipcref_peer *pp, *cp;
  ipcref_view v[3], got[3];
  ipcref_stats before;
  int i, pfd;
  memset(&o, 0, sizeof o);
  o.max_bytes_held = 2 * BLOCK;
  capped_pair(prod, cons, SOCK_SEQPACKET | SOCK_NONBLOCK, &o, &pp, &cp);
  if (!pp || !cp) return;
  pfd = ipcref_peer_poll_fd(pp);
  CHECK(pfd >= 0);
  for (i = 0; i < 3; i++) block_view(prod, &v[i]);
  (void)ipcref_peer_pid(cp); /* the producer's hello, read */
  for (i = 0; i < 2; i++) {
    while (ipcref_send(pp, &v[i]) == IPCREF_EAGAIN) /* its hello first */
      CHECK(readable(pfd, 5000));
    CHECK_EQ(ipcref_recv(cp, &got[i], 5000), IPCREF_OK);
  }
  CHECK_EQ(held_by(pp), 2 * BLOCK);
  before = stats_of(prod);
  CHECK_EQ(ipcref_send(pp, &v[2]), IPCREF_EAGAIN);
  CHECK_EQ(ipcref_peer_wants(pp), IPCREF_WANTS_ROOM);
  CHECK_EQ(stats_of(prod).live_slots, before.live_slots); /* nothing taken */
  CHECK_EQ(held_by(pp), 2 * BLOCK);
  CHECK(armed(prod));
  CHECK(!readable(pfd, 0));                        /* nothing came back yet */
  CHECK_EQ(ipcref_send(pp, &v[2]), IPCREF_EAGAIN); /* still not */
  ipcref_view_release(&got[0]);
  CHECK(readable(pfd, 5000)); /* the return woke the loop */
  /* A loop that receives first takes the wake-up: nothing to receive, the
   * fd quiet again (no spinning), and the send waiting for room goes. */
  {
    ipcref_view none;
    CHECK_EQ(ipcref_recv(pp, &none, 0), IPCREF_EAGAIN);
    CHECK(!readable(pfd, 0));
  }
  CHECK_EQ(ipcref_send(pp, &v[2]), IPCREF_OK);
  CHECK_EQ(ipcref_recv(cp, &got[2], 5000), IPCREF_OK);
  CHECK(!armed(prod));
  CHECK(!readable(pfd, 0)); /* quiet again */
  CHECK(!readable(ipcref_ctx_room_fd(prod), 0));
  ipcref_view_release(&got[1]); /* not armed: rings nothing */
  CHECK(!readable(ipcref_ctx_room_fd(prod), 0));
  ipcref_view_release(&got[2]);
  for (i = 0; i < 3; i++) ipcref_view_release(&v[i]);
  CHECK_EQ(held_by(pp), 0);
  ipcref_peer_free(cp);
  ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
  ipcref_ctx_free(prod);
}

/* The bell is every waiter's: a peer waiting for room whose consumer
 * returned a lease keeps its wake-up when something else reads the bell
 * first (an allocation on the context, a send on another peer waiting for
 * room): its poll fd stays readable until its own receive takes it, and
 * the send goes; then nothing is armed and the fds are quiet. */
static void bell_shared(int by_peer) {
  ipcref_ctx *prod = make_ctx(NULL), *cons = make_ctx(NULL);
  ipcref_peer_options o;
  ipcref_peer *pp, *cp, *qp, *qc;
  ipcref_view v[2], w[2], got, gw;
  ipcref_buf *other = NULL;
  int pfd;
  memset(&o, 0, sizeof o);
  o.max_bytes_held = BLOCK;
  capped_pair(prod, cons, SOCK_SEQPACKET | SOCK_NONBLOCK, &o, &pp, &cp);
  capped_pair(prod, cons, SOCK_SEQPACKET | SOCK_NONBLOCK, &o, &qp, &qc);
  if (!pp || !cp || !qp || !qc) return;
  pfd = ipcref_peer_poll_fd(pp);
  block_view(prod, &v[0]), block_view(prod, &v[1]);
  block_view(prod, &w[0]), block_view(prod, &w[1]);
  (void)ipcref_peer_pid(cp), (void)ipcref_peer_pid(qc); /* hellos */
  while (ipcref_send(pp, &v[0]) == IPCREF_EAGAIN) CHECK(readable(pfd, 5000));
  CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
  CHECK_EQ(ipcref_send(pp, &v[1]), IPCREF_EAGAIN); /* waits for room */
  CHECK_EQ(ipcref_peer_wants(pp), IPCREF_WANTS_ROOM);
  if (by_peer) { /* another peer waits for room too */
    while (ipcref_send(qp, &w[0]) == IPCREF_EAGAIN)
      CHECK(readable(ipcref_peer_poll_fd(qp), 5000));
    CHECK_EQ(ipcref_recv(qc, &gw, 5000), IPCREF_OK);
    CHECK_EQ(ipcref_send(qp, &w[1]), IPCREF_EAGAIN);
  }
  ipcref_view_release(&got); /* the bell rings */
  CHECK(readable(pfd, 5000));
  if (by_peer) /* the other peer's send reads the bell: still no room */
    CHECK_EQ(ipcref_send(qp, &w[1]), IPCREF_EAGAIN);
  else
    CHECK_EQ(ipcref_shared_new(prod, 64, &other), IPCREF_OK);
  CHECK(readable(pfd, 1000)); /* pp's wake-up is still there */
  CHECK_EQ(ipcref_recv(pp, &got, 0), IPCREF_EAGAIN); /* taken */
  CHECK_EQ(ipcref_send(pp, &v[1]), IPCREF_OK);
  CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
  ipcref_view_release(&got);
  if (by_peer) {
    ipcref_view_release(&gw);
    CHECK(readable(ipcref_peer_poll_fd(qp), 5000));
    CHECK_EQ(ipcref_recv(qp, &gw, 0), IPCREF_EAGAIN);
    CHECK_EQ(ipcref_send(qp, &w[1]), IPCREF_OK);
    CHECK_EQ(ipcref_recv(qc, &gw, 5000), IPCREF_OK);
    ipcref_view_release(&gw);
  }
  CHECK(!armed(prod));
  ipcref_buf_release(other);
  ipcref_collect(prod);
  CHECK(!readable(pfd, 0));
  CHECK(!readable(ipcref_ctx_room_fd(prod), 0));
  ipcref_view_release(&v[0]), ipcref_view_release(&v[1]);
  ipcref_view_release(&w[0]), ipcref_view_release(&w[1]);
  ipcref_peer_free(qc), ipcref_peer_free(qp);
  ipcref_peer_free(cp), ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
  ipcref_ctx_free(prod);
}
static void test_bell_shared(void) {
  bell_shared(0);
  bell_shared(1);
}

/* A blocking send waiting for room beside a non-blocking peer that waits
 * too and gets room from a return: the blocking wait reads the bell, the
 * other peer's poll fd is told (its flag set, once), and the blocking
 * wait goes on sleeping until its time is up. Not the bell rung again for
 * the other peer: the blocking wait woke to that at once, over and over,
 * a sweep each time. */
static void test_blocking_wait_beside_a_waiting_peer(void) {
  ipcref_ctx *prod = make_ctx(NULL), *cons = make_ctx(NULL);
  ipcref_peer_options o;
  ipcref_peer *pp, *cp, *qp, *qc;
  ipcref_view v[3], w[2], got[2], gw;
  uint64_t sweeps;
  int i, pfd;
  memset(&o, 0, sizeof o);
  o.max_bytes_held = 2 * BLOCK;
  capped_pair(prod, cons, SOCK_SEQPACKET | SOCK_NONBLOCK, &o, &pp, &cp);
  o.max_bytes_held = BLOCK;
  o.send_timeout_ms = 300 * slow;
  capped_pair(prod, cons, SOCK_SEQPACKET, &o, &qp, &qc);
  if (!pp || !cp || !qp || !qc) return;
  pfd = ipcref_peer_poll_fd(pp);
  for (i = 0; i < 3; i++) block_view(prod, &v[i]);
  block_view(prod, &w[0]), block_view(prod, &w[1]);
  (void)ipcref_peer_pid(cp), (void)ipcref_peer_pid(qc); /* hellos */
  for (i = 0; i < 2; i++) {
    while (ipcref_send(pp, &v[i]) == IPCREF_EAGAIN) CHECK(readable(pfd, 5000));
    CHECK_EQ(ipcref_recv(cp, &got[i], 5000), IPCREF_OK);
  }
  CHECK_EQ(ipcref_send(pp, &v[2]), IPCREF_EAGAIN); /* waits for room */
  CHECK_EQ(ipcref_send(qp, &w[0]), IPCREF_OK);
  CHECK_EQ(ipcref_recv(qc, &gw, 5000), IPCREF_OK);
  ipcref_view_release(&got[0]); /* room for pp: the bell rings */
  sweeps = stats_of(prod).sweeps;
  CHECK_EQ(ipcref_send(qp, &w[1]), IPCREF_ETIMEDOUT); /* no room for qp */
  printf("    a blocking wait of %d ms: %llu sweeps\n", 300 * slow,
         (unsigned long long)(stats_of(prod).sweeps - sweeps));
  CHECK(stats_of(prod).sweeps - sweeps < 100);
  CHECK(!readable(ipcref_ctx_room_fd(prod), 0)); /* read, not rung again */
  CHECK(readable(pfd, 0));                       /* pp was told */
  CHECK_EQ(ipcref_recv(pp, &got[0], 0), IPCREF_EAGAIN); /* takes it */
  CHECK_EQ(ipcref_send(pp, &v[2]), IPCREF_OK);
  CHECK(!readable(pfd, 0));
  CHECK_EQ(ipcref_recv(cp, &got[0], 5000), IPCREF_OK);
  ipcref_view_release(&got[0]), ipcref_view_release(&got[1]);
  ipcref_view_release(&gw);
  for (i = 0; i < 3; i++) ipcref_view_release(&v[i]);
  ipcref_view_release(&w[0]), ipcref_view_release(&w[1]);
  ipcref_peer_free(qc), ipcref_peer_free(qp);
  ipcref_peer_free(cp), ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
  ipcref_ctx_free(prod);
}

/* A batch counts as a whole; a message larger than the cap goes when the
 * peer holds nothing, and only then. */
static void test_peer_cap_batch_and_oversize(void) {
  ipcref_ctx *prod = make_ctx(NULL), *cons = make_ctx(NULL);
  ipcref_peer_options o;
  ipcref_peer *pp, *cp;
  ipcref_view v[3], got;
  int i;
  memset(&o, 0, sizeof o);
  o.max_bytes_held = BLOCK + BLOCK / 2;
  o.send_timeout_ms = 1; /* blocking: refused after 1 ms */
  capped_pair(prod, cons, SOCK_SEQPACKET, &o, &pp, &cp);
  if (!pp || !cp) return;
  for (i = 0; i < 3; i++) block_view(prod, &v[i]);
  CHECK_EQ(ipcref_send_batch(pp, v, 2), IPCREF_OK); /* over, but alone */
  CHECK_EQ(held_by(pp), 2 * BLOCK);
  CHECK_EQ(ipcref_send(pp, &v[2]), IPCREF_ETIMEDOUT);
  CHECK_EQ(held_by(pp), 2 * BLOCK);
  CHECK(!armed(prod)); /* nobody waits after the timeout */
  for (i = 0; i < 2; i++) {
    CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
    ipcref_view_release(&got);
  }
  CHECK_EQ(ipcref_send(pp, &v[2]), IPCREF_OK); /* room again */
  CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
  ipcref_view_release(&got);
  for (i = 0; i < 3; i++) ipcref_view_release(&v[i]);
  ipcref_peer_free(cp);
  ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
  ipcref_ctx_free(prod);
}

/* ---- a record a stream took in part ------------------------------------ */

/* A non-blocking SOCK_STREAM pair, socket only, whose producer's socket
 * takes the least the kernel allows (a large message goes in part), both
 * hellos read. */
static void small_stream_pair(ipcref_ctx *prod, ipcref_ctx *cons,
                              ipcref_peer **pp, ipcref_peer **cp) {
  ipcref_peer_options o;
  int small = 1;
  memset(&o, 0, sizeof o);
  o.ring_bytes = IPCREF_KEEP_NONE; /* every message on the socket */
  capped_pair(prod, cons, SOCK_STREAM | SOCK_NONBLOCK, &o, pp, cp);
  if (!*pp || !*cp) return;
  CHECK_EQ(setsockopt((*pp)->fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small),
           0);
  (void)ipcref_peer_pid(*pp);
  (void)ipcref_peer_pid(*cp);
}

/* Sends the largest messages there are (IPCREF_MSG_MAX_VIEWS views of
 * `v`, IPCREF_META_MAX bytes of metadata) until one is taken in part (1)
 * or a send fails otherwise (0); *sent counts the views of those that
 * went. `starve`: every allocation the send would make fails (ENOMEM
 * then means that nothing of it went). */
static int send_until_cut(ipcref_peer *pp, const ipcref_view *v, int starve,
                          int *sent) {
  ipcref_view vs[IPCREF_MSG_MAX_VIEWS];
  char meta[IPCREF_META_MAX];
  int i;
  memset(meta, 'm', sizeof meta);
  for (i = 0; i < IPCREF_MSG_MAX_VIEWS; i++) vs[i] = *v;
  for (i = 0; i < 1000; i++) {
    ipcref_result r;
    fail_next_alloc = starve;
    r = ipcref_send_meta(pp, vs, IPCREF_MSG_MAX_VIEWS, meta, sizeof meta);
    fail_next_alloc = 0;
    if (r == IPCREF_ENOMEM) continue;
    if (r != IPCREF_OK) return 0;
    *sent += IPCREF_MSG_MAX_VIEWS;
    if (pp->out_pos < pp->out_len) return 1;
  }
  return 0;
}

/* Receives what waits for the consumer without waiting, CHECKing that it
 * makes sense (EAGAIN at the end, not EPROTO); the views it got. */
static int drain(ipcref_peer *cp) {
  ipcref_view got;
  ipcref_result r;
  int n = 0;
  while ((r = ipcref_recv(cp, &got, 0)) == IPCREF_OK) {
    ipcref_view_release(&got);
    n++;
  }
  CHECK_EQ(r, IPCREF_EAGAIN);
  return n;
}

/* The consumer reads while the producer sends what a stream left, until
 * all of it went; the views the consumer got. */
static int drain_all(ipcref_peer *pp, ipcref_peer *cp) {
  long t0 = now_ms();
  int n = drain(cp);
  ipcref_result r;
  while ((r = ipcref_peer_flush(pp)) == IPCREF_EAGAIN && now_ms() - t0 < CTL_MS)
    n += drain(cp);
  CHECK_EQ(r, IPCREF_OK);
  return n + drain(cp);
}

/* An event loop's producer that also receives on its peer: a receive
 * with nothing to say (EAGAIN, wanting POLLIN) while the rest of a record
 * waits must leave POLLOUT wanted and in the poll fd, or nothing would
 * wake the loop to send it, and the consumer would never get the record. */
static void test_rest_wakes_the_loop(void) {
  ipcref_ctx *prod = make_ctx(NULL), *cons = make_ctx(NULL);
  ipcref_peer *pp, *cp;
  ipcref_view v, none;
  int sent = 1, got, pfd;
  small_stream_pair(prod, cons, &pp, &cp);
  if (!pp || !cp) return;
  pfd = ipcref_peer_poll_fd(pp);
  CHECK(pfd >= 0);
  block_view(prod, &v);
  CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK); /* unread: the socket part full */
  CHECK(send_until_cut(pp, &v, 0, &sent));
  CHECK_EQ(ipcref_peer_wants(pp), POLLOUT);
  CHECK_EQ(ipcref_recv(pp, &none, 0), IPCREF_EAGAIN);
  CHECK(ipcref_peer_wants(pp) & POLLOUT); /* beside POLLIN */
  got = drain(cp);            /* what came: room in the socket again */
  CHECK(readable(pfd, 5000)); /* the loop wakes for the rest */
  got += drain_all(pp, cp);
  CHECK_EQ(got, sent);
  CHECK_EQ(ipcref_peer_wants(pp), 0); /* all of it went */
  CHECK(!readable(pfd, 0));
  ipcref_view_release(&v);
  ipcref_peer_free(cp);
  ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
  ipcref_ctx_free(prod);
}

/* Out of memory while a stream takes a record in part: the room for its
 * rest was made before its first byte went, so the record still goes
 * whole and its send says OK (its leases stay); a send that fails for
 * memory sent nothing. The consumer gets every view sent, and the stream
 * still makes sense after it. */
static void test_rest_kept_without_memory(void) {
  ipcref_ctx *prod = make_ctx(NULL), *cons = make_ctx(NULL);
  ipcref_peer *pp, *cp;
  ipcref_view v, got;
  ipcref_result r;
  int sent = 1, n;
  small_stream_pair(prod, cons, &pp, &cp);
  if (!pp || !cp) return;
  block_view(prod, &v);
  CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK); /* unread: the socket part full */
  CHECK(send_until_cut(pp, &v, 1, &sent));
  n = drain_all(pp, cp);
  CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK); /* the next one, read as itself */
  r = ipcref_recv(cp, &got, 5000);
  CHECK_EQ(r, IPCREF_OK);
  if (r == IPCREF_OK) ipcref_view_release(&got);
  CHECK_EQ(n, sent);
  ipcref_view_release(&v);
  ipcref_collect(prod);
  CHECK_EQ(stats_of(prod).live_slots, 0); /* every lease came back, once */
  ipcref_peer_free(cp);
  ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
  ipcref_ctx_free(prod);
}

/* ---- one deadline per send ---------------------------------------------- */

#define SEND_MS (500 * slow)  /* test_send_timeout_in_all's send_timeout_ms */
#define HOLD_MS (1000 * slow) /* and how long its consumer holds the cap */

/* The consumer of test_send_timeout_in_all: takes one view, holds it
 * HOLD_MS, lets it go, and reads nothing more (what follows is junk: its
 * free refuses it, to the error hook). */
static int timed_holder(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = new_ctx(0, 0);
  ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
  ipcref_view v;
  if (p && ipcref_recv(p, &v, 10000) == IPCREF_OK) {
    ctl_put(k->their_ctl, 'h');
    sleep_us(HOLD_MS * 1000L);
    ipcref_view_release(&v);
  }
  (void)ctl_get(k->their_ctl, CTL_MS);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* A blocking send that waits for room under the cap (the lease comes back
 * after HOLD_MS), then for room in a full socket (none comes): ETIMEDOUT
 * once send_timeout_ms has passed since the send began, not a fresh
 * timeout for each wait (HOLD_MS + SEND_MS). */
static void test_send_timeout_in_all(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_peer_options o;
  ipcref_view v[2];
  char junk[256];
  long t0, took;
  int i, fd;
  kid_start(&k, 1, SOCK_SEQPACKET, timed_holder);
  ctx = make_ctx(NULL);
  memset(&o, 0, sizeof o);
  o.max_bytes_held = BLOCK;
  o.send_timeout_ms = SEND_MS;
  o.ring_bytes = IPCREF_KEEP_NONE; /* every message on the socket */
  fd = k.sock[0];
  CHECK_EQ(ipcref_peer_new_with(ctx, fd, &o, &p), IPCREF_OK);
  if (p) {
    tforget(fd); /* the peer's now */
    k.sock[0] = -1;
  }
  for (i = 0; i < 2; i++) block_view(ctx, &v[i]);
  CHECK_EQ(ipcref_send(p, &v[0]), IPCREF_OK);
  CTL_EXPECT(k.ctl, 'h'); /* it holds the cap, for HOLD_MS */
  memset(junk, 0, sizeof junk);
  while (send(fd, junk, sizeof junk, MSG_DONTWAIT | MSG_NOSIGNAL) > 0)
    continue; /* the socket full, for good */
  t0 = now_ms();
  CHECK_EQ(ipcref_send(p, &v[1]), IPCREF_ETIMEDOUT);
  took = now_ms() - t0;
  printf("    ETIMEDOUT after %ld ms (send_timeout_ms %d)\n", took, SEND_MS);
  CHECK(took >= SEND_MS * 9 / 10);
  CHECK(took < SEND_MS + HOLD_MS / 2);
  ctl_put(k.ctl, 'x');
  KID_END(&k, "consumer");
  for (i = 0; i < 2; i++) ipcref_view_release(&v[i]);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* Options set on a peer made without them (as ipcref_accept makes it):
 * a cap, then none; a negative timeout refused by name. */
static void test_set_options(void) {
  local_pair l;
  ipcref_peer_options o;
  ipcref_view v[2], got;
  int i;
  local_pair_open(&l, NULL, NULL);
  if (!l.pp || !l.cp) return;
  ipcref_set_error_hook(&error_hook);
  errors_reset();
  memset(&o, 0, sizeof o);
  o.send_timeout_ms = -1;
  CHECK_EQ(ipcref_peer_set_options(l.pp, &o), IPCREF_EINVAL);
  CHECK(strstr(err_last, "negative") != NULL);
  CHECK_EQ(ipcref_peer_set_options(NULL, NULL), IPCREF_EINVAL);
  errors_reset();
  o.send_timeout_ms = 1;
  o.max_bytes_held = BLOCK;
  CHECK_EQ(ipcref_peer_set_options(l.pp, &o), IPCREF_OK);
  for (i = 0; i < 2; i++) block_view(l.prod, &v[i]);
  CHECK_EQ(ipcref_send(l.pp, &v[0]), IPCREF_OK);
  CHECK_EQ(ipcref_send(l.pp, &v[1]), IPCREF_ETIMEDOUT);
  CHECK_EQ(ipcref_peer_set_options(l.pp, NULL), IPCREF_OK); /* no cap */
  CHECK_EQ(ipcref_send(l.pp, &v[1]), IPCREF_OK);
  CHECK(!armed(l.prod));
  for (i = 0; i < 2; i++) {
    CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
    ipcref_view_release(&got);
    ipcref_view_release(&v[i]);
  }
  EXPECT_ERRORS(0);
  ipcref_set_error_hook(NULL);
  local_pair_close(&l);
}

/* The consumer of the blocking cases: takes `want` views, holds them
 * until told (any byte), lets them go one every 50 ms, and says 'd'. */
static int slow_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
  ipcref_view held[8];
  int want = ctl_get(k->their_ctl, CTL_MS), got = 0, i;
  while (p && got < want && got < 8 &&
         ipcref_recv(p, &held[got], 10000) == IPCREF_OK)
    got++;
  ctl_put(k->their_ctl, got);
  (void)ctl_get(k->their_ctl, CTL_MS);
  for (i = 0; i < got; i++) {
    sleep_us(50000);
    ipcref_view_release(&held[i]);
  }
  ctl_put(k->their_ctl, 'd');
  /* Whatever else comes, taken and let go. */
  for (;;) {
    ipcref_view v;
    if (!p || ipcref_recv(p, &v, 10000) != IPCREF_OK) break;
    ipcref_view_release(&v);
  }
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* A blocking send at the cap sleeps until another process returns a
 * lease, then goes: no retry loop in the caller. */
static void test_peer_cap_blocking_across(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p = NULL;
  ipcref_peer_options o;
  ipcref_view v[3];
  int i;
  kid_start(&k, 1, SOCK_SEQPACKET, slow_consumer);
  ctx = make_ctx(NULL);
  memset(&o, 0, sizeof o);
  o.max_bytes_held = 2 * BLOCK;
  o.send_timeout_ms = 20000;
  CHECK_EQ(ipcref_peer_new_with(ctx, k.sock[0], &o, &p), IPCREF_OK);
  if (p) k.sock[0] = -1;
  ctl_put(k.ctl, 2);
  for (i = 0; i < 3; i++) block_view(ctx, &v[i]);
  for (i = 0; p && i < 2; i++) CHECK_EQ(ipcref_send(p, &v[i]), IPCREF_OK);
  CTL_EXPECT(k.ctl, 2);
  ctl_put(k.ctl, 'g');                        /* let go, slowly */
  CHECK_EQ(ipcref_send(p, &v[2]), IPCREF_OK); /* waits for the first */
  CHECK(held_by(p) <= 2 * BLOCK);
  CTL_EXPECT(k.ctl, 'd');
  for (i = 0; i < 3; i++) ipcref_view_release(&v[i]);
  ipcref_peer_free(p);
  KID_END(&k, "consumer");
  ipcref_ctx_free(ctx);
}

/* An allocation that no return can make room for is refused at once
 * (ENOMEM), even by ipcref_shared_new_wait, and arms nothing: a block
 * whose size class rounds it past max_bytes, and any pooled block when
 * segment_size is past it. */
static void test_room_that_cannot_come(void) {
  static const size_t sizes[2][3] = {
      {(size_t)100 << 20, (size_t)99 << 20, 0}, /* max, size, segment */
      {(size_t)1 << 20, 100, (size_t)16 << 20}};
  int i;
  for (i = 0; i < 2; i++) {
    ipcref_ctx_options o;
    ipcref_ctx *ctx;
    ipcref_buf *b = NULL;
    memset(&o, 0, sizeof o);
    o.max_bytes = sizes[i][0];
    o.segment_size = sizes[i][2];
    ctx = make_ctx(&o);
    if (!ctx) continue;
    CHECK_EQ(ipcref_shared_new(ctx, sizes[i][1], &b), IPCREF_ENOMEM);
    CHECK_EQ(ipcref_ctx_timeout(ctx), -1); /* nothing armed */
    CHECK(!readable(ipcref_ctx_room_fd(ctx), 0));
    CHECK_EQ(ipcref_shared_new_wait(ctx, sizes[i][1], 20000, &b),
             IPCREF_ENOMEM);
    CHECK(b == NULL);
    CHECK_EQ(ipcref_ctx_timeout(ctx), -1);
    CHECK_EQ(stats_of(ctx).segment_bytes, 0);
    ipcref_ctx_free(ctx);
  }
}
/* A context at max_bytes: the allocation says ENOMEM and arms; the room
 * fd wakes on a return; the next allocation succeeds and disarms; the fd
 * is quiet again. ipcref_shared_new_wait: at once (0), ETIMEDOUT; too
 * large for the cap, ENOMEM; with a return coming, it waits for it. */
static void test_ctx_room(void) {
  ipcref_ctx_options co;
  local_pair l;
  ipcref_view v[2], got[2];
  ipcref_buf *b = NULL;
  int i, rfd;
  memset(&co, 0, sizeof co);
  co.segment_size = 1 << 20;
  co.max_bytes = 2 * BLOCK;
  co.segment_cache = IPCREF_KEEP_NONE;
  co.isolate = 1; /* a segment per block: 64 KiB each */
  local_pair_open(&l, &co, NULL);
  if (!l.pp || !l.cp) return;
  rfd = ipcref_ctx_room_fd(l.prod);
  CHECK(rfd >= 0);
  CHECK_EQ(ipcref_ctx_room_fd(l.prod), rfd);
  for (i = 0; i < 2; i++) {
    block_view(l.prod, &v[i]);
    CHECK_EQ(ipcref_send(l.pp, &v[i]), IPCREF_OK);
    CHECK_EQ(ipcref_recv(l.cp, &got[i], 5000), IPCREF_OK);
    ipcref_view_release(&v[i]); /* in the limbo: the consumer holds it */
  }
  CHECK_EQ(ipcref_shared_new(l.prod, BLOCK, &b), IPCREF_ENOMEM);
  CHECK(armed(l.prod));
  CHECK(!readable(rfd, 0));
  CHECK_EQ(ipcref_shared_new_wait(l.prod, BLOCK, 0, &b), IPCREF_ETIMEDOUT);
  CHECK_EQ(ipcref_shared_new_wait(l.prod, BLOCK, 30, &b), IPCREF_ETIMEDOUT);
  CHECK_EQ(ipcref_shared_new_wait(l.prod, 3 * BLOCK, -1, &b), IPCREF_ENOMEM);
  {
    int t = ipcref_ctx_timeout(l.prod); /* a look now and then */
    CHECK(t >= 0 && t <= 100);
  }
  ipcref_view_release(&got[0]);
  CHECK(readable(rfd, 5000));
  CHECK_EQ(ipcref_shared_new(l.prod, BLOCK, &b), IPCREF_OK);
  CHECK(!armed(l.prod));
  CHECK(!readable(rfd, 0));
  CHECK(nothing_waits(l.prod)); /* nothing waits any more */
  ipcref_buf_release(b);
  ipcref_view_release(&got[1]);
  local_pair_close(&l);
}

/* The consumer of test_shared_new_wait_across: takes one view, holds it
 * 100 ms, lets it go. */
static int brief_holder(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
  ipcref_view v;
  if (p && ipcref_recv(p, &v, 10000) == IPCREF_OK) {
    ctl_put(k->their_ctl, 'h');
    sleep_us(100000);
    ipcref_view_release(&v);
  }
  (void)ctl_get(k->their_ctl, CTL_MS);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* ipcref_shared_new_wait sleeps until another process returns a lease. */
static void test_shared_new_wait_across(void) {
  ipcref_ctx_options co;
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v;
  ipcref_buf *b = NULL;
  kid_start(&k, 1, SOCK_SEQPACKET, brief_holder);
  memset(&co, 0, sizeof co);
  co.max_bytes = BLOCK;
  co.segment_cache = IPCREF_KEEP_NONE;
  co.isolate = 1;
  ctx = make_ctx(&co);
  p = kid_peer(&k, 0, ctx);
  block_view(ctx, &v);
  CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  ipcref_view_release(&v);
  CTL_EXPECT(k.ctl, 'h');
  CHECK_EQ(ipcref_shared_new_wait(ctx, BLOCK, 20000, &b), IPCREF_OK);
  ipcref_buf_release(b);
  ctl_put(k.ctl, 'x');
  KID_END(&k, "consumer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* Wrong arguments: named, nothing done. */
static void test_room_arguments(void) {
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_buf *b = NULL;
  ipcref_set_error_hook(&error_hook);
  errors_reset();
  CHECK_EQ(ipcref_ctx_room_fd(NULL), -1);
  CHECK_EQ(ipcref_shared_new_wait(NULL, 64, 0, &b), IPCREF_EINVAL);
  CHECK_EQ(ipcref_shared_new_wait(ctx, 64, 0, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_shared_new_wait(ctx, 64, -2, &b), IPCREF_EINVAL);
  CHECK(strstr(err_last, "ipcref_shared_new_wait: timeout_ms") != NULL);
  errors_reset();
  CHECK_EQ(ipcref_shared_new_wait(ctx, 64, -1, &b), IPCREF_OK); /* no cap */
  ipcref_buf_release(b);
  EXPECT_ERRORS(0);
  ipcref_set_error_hook(NULL);
  ipcref_ctx_free(ctx);
}

int main(void) {
  fixture_start();
  RUN(test_peer_cap_nonblocking);
  RUN(test_bell_shared);
  RUN(test_blocking_wait_beside_a_waiting_peer);
  RUN(test_peer_cap_batch_and_oversize);
  RUN(test_peer_cap_blocking_across);
  RUN(test_rest_wakes_the_loop);
  RUN(test_rest_kept_without_memory);
  RUN(test_send_timeout_in_all);
  RUN(test_set_options);
  RUN(test_ctx_room);
  RUN(test_room_that_cannot_come);
  RUN(test_shared_new_wait_across);
  RUN(test_room_arguments);
  return harness_finish();
}
