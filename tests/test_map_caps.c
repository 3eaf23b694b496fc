/* What a producer can make its consumer map: the caps of the consumer's
 * peer (ipcref_peer_options.max_maps, max_mapped_bytes), and of its
 * context over every peer (ipcref_ctx_options, the same names).
 *
 * Every segment, ledger or device segment a message brings stays mapped
 * in the consumer (an fd and an address range each) until its producer
 * destroys it or the peer goes. A peer with caps refuses a message that
 * would pass them with ERANGE: the message's leases go back to its
 * producer, nothing it brought stays mapped, the error hook hears it, and
 * the next message that fits goes. Idle mappings of what the producer
 * destroyed make room first. A message that brings nothing new goes at
 * the cap. The producer sends the fds of what a refused message brought
 * again, and still says when what it sent before goes. Messages on their
 * way when one was refused are refused too, their leases given back
 * (through the refused message's ledger when it brought one). A hostile
 * producer in another process (fork) that sends a new segment in every
 * message holds the consumer to its cap in fds. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "share_fixture.h"

#define CTL_MS   30000
#define FLOOD    64 /* messages the hostile producer sends */
#define CAP      8  /* what the consumer of the flood may keep mapped */
#define PAGE     4096
#define REFUSALS 40 /* in flight at once (test_refused_many) */
#define WAIT_MS  (5000 * slow)

/* A producer whose every block has a segment of its own (and keeps no
 * empty one), its consumer with the error hook, and their peers. */
static void caps_open(local_pair *l) {
  ipcref_ctx_options po, co;
  memset(&po, 0, sizeof po);
  memset(&co, 0, sizeof co);
  po.isolate = 1;
  po.segment_cache = IPCREF_KEEP_NONE;
  co.error_hook = error_hook;
  local_pair_open(l, &po, &co);
}

/* Sets the caps of peer `p` (0: none). */
static void set_caps(ipcref_peer *p, size_t maps, size_t bytes) {
  ipcref_peer_options o;
  memset(&o, 0, sizeof o);
  o.max_maps = maps;
  o.max_mapped_bytes = bytes;
  CHECK_EQ(ipcref_peer_set_options(p, &o), IPCREF_OK);
}

static void bytes_view(ipcref_ctx *ctx, int64_t n, ipcref_view *v) {
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, v), IPCREF_OK);
}

/* Receives a view that must come, CHECKed: 1; else 0 with `v` zeroed, so
 * that a failing case releases nothing it did not get. */
static int take(ipcref_peer *p, ipcref_view *v) {
  ipcref_result r = ipcref_recv(p, v, WAIT_MS);
  CHECK_EQ(r, IPCREF_OK);
  if (r != IPCREF_OK) memset(v, 0, sizeof *v);
  return r == IPCREF_OK;
}

/* The leases the consumer on `p` holds, once what came back is swept. */
static size_t leases_of(ipcref_peer *p) {
  return peer_info_of(p).leases;
}

/* Writes byte `at` of the producer's view, which a consumer may hold: the
 * test knows when it reads, so the buffer is open for shared writes. */
static void poke(const ipcref_view *v, size_t at, unsigned char val) {
  unsigned char *d;
  ipcref_buf_set_shared_mut(v->buf, 1);
  d = (unsigned char *)ipcref_view_data_mut(v);
  CHECK(d != NULL);
  if (d) d[at] = val;
}
/* At four mappings (a ledger and three segments) a message with a fourth
 * segment is refused, its lease given back, nothing kept; one that brings
 * nothing new goes; a segment the producer destroyed makes room once idle
 * (here, once the producer says so in its next message). A peer freed
 * while views it brought live: they stay valid, charged to nobody. */
static void test_count_cap(void) {
  local_pair l;
  ipcref_view v[6], got[6];
  ipcref_stats before;
  res_mark mark;
  int i, have4;
  res_begin(&mark);
  caps_open(&l);
  if (!l.pp || !l.cp) return;
  set_caps(l.cp, 4, 0);
  for (i = 0; i < 5; i++) bytes_view(l.prod, PAGE, &v[i]);
  for (i = 0; i < 4; i++) CHECK_EQ(ipcref_send(l.pp, &v[i]), IPCREF_OK);
  for (i = 0; i < 3; i++) (void)take(l.cp, &got[i]);
  CHECK_EQ(peer_info_of(l.cp).maps, 4);
  CHECK(peer_info_of(l.cp).mapped_bytes > 3 * PAGE); /* and the ledger's */
  before = stats_of(l.cons);
  errors_reset();
  CHECK_EQ(ipcref_recv(l.cp, &got[3], WAIT_MS), IPCREF_ERANGE);
  CHECK(strstr(err_last, "max_maps") != NULL);
  EXPECT_ERRORS(1);
  CHECK_EQ(stats_of(l.cons).refused, before.refused + 1);
  CHECK_EQ(stats_of(l.cons).mapped_segments, before.mapped_segments);
  CHECK_EQ(stats_of(l.cons).imported_bufs, before.imported_bufs);
  CHECK_EQ(peer_info_of(l.cp).maps, 4);
  CHECK_EQ(leases_of(l.pp), 3); /* the fourth came back */
  /* A view of a segment mapped already brings nothing new: it goes, even
   * under a cap lowered below what is mapped. */
  set_caps(l.cp, 1, 1);
  CHECK_EQ(ipcref_send(l.pp, &v[1]), IPCREF_OK);
  (void)take(l.cp, &got[3]);
  CHECK_EQ(peer_info_of(l.cp).maps, 4);
  set_caps(l.cp, 4, 0);
  /* The first segment's block freed on both sides: the producer destroys
   * the segment and says so with its next message, which then fits. */
  ipcref_view_release(&got[0]);
  ipcref_view_release(&v[0]);
  CHECK_EQ(ipcref_collect(l.prod), IPCREF_OK);
  CHECK_EQ(ipcref_send(l.pp, &v[4]), IPCREF_OK);
  have4 = take(l.cp, &got[4]);
  EXPECT_ERRORS(0);
  CHECK_EQ(peer_info_of(l.cp).maps, 4);
  /* The consumer's peer goes first; the views it brought stay valid. */
  ipcref_peer_free(l.cp);
  l.cp = NULL;
  poke(&v[4], 0, 7);
  if (have4) CHECK_EQ(((const unsigned char *)ipcref_view_data(&got[4]))[0], 7);
  for (i = 1; i < 4 + have4; i++) ipcref_view_release(&got[i]);
  for (i = 1; i < 5; i++) ipcref_view_release(&v[i]);
  CHECK_EQ(ipcref_collect(l.cons), IPCREF_OK);
  CHECK_EQ(stats_of(l.cons).mapped_segments, 0);
  local_pair_close(&l);
  RES_END(&mark);
}

/* The byte cap, set after the first message (the ledger's size is the
 * library's): a block larger than the room left is refused, one that fits
 * goes, and then nothing more that brings a segment. */
static void test_byte_cap(void) {
  local_pair l;
  ipcref_view v[4], got[4];
  size_t base;
  res_mark mark;
  int i;
  res_begin(&mark);
  caps_open(&l);
  if (!l.pp || !l.cp) return;
  bytes_view(l.prod, PAGE, &v[0]);
  bytes_view(l.prod, 4 * PAGE, &v[1]);
  bytes_view(l.prod, 2 * PAGE, &v[2]);
  bytes_view(l.prod, PAGE, &v[3]);
  CHECK_EQ(ipcref_send(l.pp, &v[0]), IPCREF_OK);
  (void)take(l.cp, &got[0]);
  base = peer_info_of(l.cp).mapped_bytes;
  CHECK(base > PAGE);
  set_caps(l.cp, 0, base + 2 * PAGE);
  for (i = 1; i < 4; i++) CHECK_EQ(ipcref_send(l.pp, &v[i]), IPCREF_OK);
  errors_reset();
  CHECK_EQ(ipcref_recv(l.cp, &got[1], WAIT_MS), IPCREF_ERANGE);
  (void)take(l.cp, &got[2]);
  CHECK_EQ(ipcref_recv(l.cp, &got[3], WAIT_MS), IPCREF_ERANGE);
  EXPECT_ERRORS(2);
  CHECK_EQ(peer_info_of(l.cp).mapped_bytes, base + 2 * PAGE);
  CHECK_EQ(peer_info_of(l.cp).maps, 3);
  CHECK_EQ(leases_of(l.pp), 2);
  /* Without caps, the same message goes. */
  set_caps(l.cp, 0, 0);
  CHECK_EQ(ipcref_send(l.pp, &v[3]), IPCREF_OK);
  (void)take(l.cp, &got[3]);
  CHECK_EQ(peer_info_of(l.cp).maps, 4);
  ipcref_view_release(&got[0]);
  ipcref_view_release(&got[2]);
  ipcref_view_release(&got[3]);
  CHECK_EQ(leases_of(l.pp), 0);
  for (i = 0; i < 4; i++) ipcref_view_release(&v[i]);
  local_pair_close(&l);
  RES_END(&mark);
}

/* Messages sent before the producer heard of a refusal name what it
 * brought without its fds: they are refused so too (ERANGE, not EPROTO),
 * their leases given back. Once the producer has swept the refusal it
 * sends the fds again, and a view goes when there is room. */
static void test_refused_in_flight(void) {
  local_pair l;
  ipcref_view a, b, got[2];
  res_mark mark;
  int i;
  res_begin(&mark);
  caps_open(&l);
  if (!l.pp || !l.cp) return;
  bytes_view(l.prod, PAGE, &a);
  bytes_view(l.prod, PAGE, &b);
  CHECK_EQ(ipcref_send(l.pp, &a), IPCREF_OK);
  (void)take(l.cp, &got[0]);
  set_caps(l.cp, 2, 0);                       /* the ledger and a's segment */
  CHECK_EQ(ipcref_send(l.pp, &b), IPCREF_OK); /* b's segment's fd */
  CHECK_EQ(ipcref_send(l.pp, &b), IPCREF_OK); /* none: sent, it thinks */
  errors_reset();
  for (i = 0; i < 2; i++)
    CHECK_EQ(ipcref_recv(l.cp, &got[1], WAIT_MS), IPCREF_ERANGE);
  CHECK_EQ(err_eproto, 0);
  EXPECT_ERRORS(2);
  CHECK_EQ(leases_of(l.pp), 1); /* swept: both came back */
  CHECK_EQ(ipcref_send(l.pp, &b), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l.cp, &got[1], WAIT_MS), IPCREF_ERANGE);
  EXPECT_ERRORS(1);
  CHECK_EQ(leases_of(l.pp), 1);
  /* With room, the next view of b goes: its fd came again. */
  set_caps(l.cp, 3, 0);
  poke(&b, PAGE - 1, 9);
  CHECK_EQ(ipcref_send(l.pp, &b), IPCREF_OK);
  if (take(l.cp, &got[1]))
    CHECK_EQ(((const unsigned char *)ipcref_view_data(&got[1]))[PAGE - 1], 9);
  ipcref_view_release(&got[1]);
  EXPECT_ERRORS(0);
  CHECK_EQ(peer_info_of(l.cp).maps, 3);
  ipcref_view_release(&got[0]);
  CHECK_EQ(leases_of(l.pp), 0);
  ipcref_view_release(&a);
  ipcref_view_release(&b);
  local_pair_close(&l);
  RES_END(&mark);
}

/* A producer may send many messages before it reads a refusal: one on
 * its way that names a segment refused 40 refusals before is refused the
 * same way (ERANGE, its lease back), and the fds come again. */
static void test_refused_many(void) {
  local_pair l;
  ipcref_view a, v[REFUSALS], got[2];
  res_mark mark;
  int i;
  res_begin(&mark);
  caps_open(&l);
  if (!l.pp || !l.cp) return;
  bytes_view(l.prod, PAGE, &a);
  CHECK_EQ(ipcref_send(l.pp, &a), IPCREF_OK);
  (void)take(l.cp, &got[0]);
  CHECK(l.cp->refused == NULL);    /* the recall: made on the first refusal */
  set_caps(l.cp, 2, 0);            /* the ledger and a's segment */
  for (i = 0; i < REFUSALS; i++) { /* a new segment each, its fd with it */
    bytes_view(l.prod, PAGE, &v[i]);
    CHECK_EQ(ipcref_send(l.pp, &v[i]), IPCREF_OK);
  }
  CHECK_EQ(ipcref_send(l.pp, &v[0]), IPCREF_OK); /* no fd: sent, it thinks */
  errors_reset();
  for (i = 0; i <= REFUSALS; i++)
    CHECK_EQ(ipcref_recv(l.cp, &got[1], WAIT_MS), IPCREF_ERANGE);
  CHECK_EQ(err_eproto, 0);
  EXPECT_ERRORS(REFUSALS + 1);
  CHECK_EQ(leases_of(l.pp), 1); /* every refused lease came back */
  /* The README's figures: the last 1024 recalled, 24 KiB; 4 kept. */
  CHECK(l.cp->refused != NULL);
  CHECK_EQ(IPCREF__REFUSED, 1024);
  CHECK_EQ(IPCREF__REFUSED * sizeof *l.cp->refused, (size_t)24 * 1024);
  CHECK_EQ(IPCREF__KEPT, 4);
  set_caps(l.cp, 0, 0);
  poke(&v[0], 1, 5);
  CHECK_EQ(ipcref_send(l.pp, &v[0]), IPCREF_OK); /* its fd again */
  if (take(l.cp, &got[1])) {
    CHECK_EQ(((const unsigned char *)ipcref_view_data(&got[1]))[1], 5);
    ipcref_view_release(&got[1]);
  }
  EXPECT_ERRORS(0);
  ipcref_view_release(&got[0]);
  CHECK_EQ(leases_of(l.pp), 0);
  ipcref_view_release(&a);
  for (i = 0; i < REFUSALS; i++) ipcref_view_release(&v[i]);
  local_pair_close(&l);
  RES_END(&mark);
}

/* Refused from its first message on (a cap of 1): the ledger that message
 * brought is kept a while, so a message already on its way that names it
 * gives its lease back too; then, without caps, the fds come again. */
static void test_refused_ledger(void) {
  local_pair l;
  ipcref_view v, got;
  res_mark mark;
  int i;
  res_begin(&mark);
  caps_open(&l);
  if (!l.pp || !l.cp) return;
  set_caps(l.cp, 1, 0);
  bytes_view(l.prod, PAGE, &v);
  for (i = 0; i < 2; i++) CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  errors_reset();
  for (i = 0; i < 2; i++)
    CHECK_EQ(ipcref_recv(l.cp, &got, WAIT_MS), IPCREF_ERANGE);
  EXPECT_ERRORS(2);
  CHECK_EQ(peer_info_of(l.cp).maps, 0);
  CHECK_EQ(leases_of(l.pp), 0);
  set_caps(l.cp, 0, 0);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  (void)take(l.cp, &got);
  ipcref_view_release(&got);
  CHECK_EQ(peer_info_of(l.cp).maps, 2);
  CHECK_EQ(leases_of(l.pp), 0);
  ipcref_view_release(&v);
  local_pair_close(&l);
  RES_END(&mark);
}

/* A consumer's peer freed with messages unread gives their leases back,
 * past one its caps refuse. */
static void test_free_past_refusal(void) {
  local_pair l;
  ipcref_view v[2], got;
  res_mark mark;
  int i;
  res_begin(&mark);
  caps_open(&l);
  if (!l.pp || !l.cp) return;
  for (i = 0; i < 2; i++) bytes_view(l.prod, PAGE, &v[i]);
  CHECK_EQ(ipcref_send(l.pp, &v[0]), IPCREF_OK);
  (void)take(l.cp, &got);
  set_caps(l.cp, 2, 0);
  CHECK_EQ(ipcref_send(l.pp, &v[1]), IPCREF_OK); /* refused: a new segment */
  CHECK_EQ(ipcref_send(l.pp, &v[0]), IPCREF_OK); /* fits: nothing new */
  CHECK_EQ(leases_of(l.pp), 3);
  errors_reset();
  ipcref_peer_free(l.cp);
  l.cp = NULL;
  EXPECT_ERRORS(1);
  CHECK_EQ(leases_of(l.pp), 1); /* the view the consumer holds */
  ipcref_view_release(&got);
  CHECK_EQ(leases_of(l.pp), 0);
  for (i = 0; i < 2; i++) ipcref_view_release(&v[i]);
  local_pair_close(&l);
  RES_END(&mark);
}

/* A context whose byte cap no ledger fits in refuses every message that
 * brings one, and gives its lease back. */
static void test_ctx_byte_cap(void) {
  ipcref_ctx_options co;
  local_pair l;
  ipcref_view v, got;
  res_mark mark;
  res_begin(&mark);
  memset(&co, 0, sizeof co);
  co.max_mapped_bytes = PAGE;
  co.error_hook = error_hook;
  local_pair_open(&l, NULL, &co);
  if (!l.pp || !l.cp) return;
  bytes_view(l.prod, PAGE, &v);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  errors_reset();
  CHECK_EQ(ipcref_recv(l.cp, &got, WAIT_MS), IPCREF_ERANGE);
  CHECK(strstr(err_last, "context") != NULL);
  EXPECT_ERRORS(1);
  CHECK_EQ(stats_of(l.cons).maps_in, 0);
  CHECK_EQ(stats_of(l.cons).maps_in_bytes, 0);
  CHECK_EQ(leases_of(l.pp), 0);
  ipcref_view_release(&v);
  local_pair_close(&l);
  RES_END(&mark);
}

/* A batch refused for one new segment, beside one the consumer has: the
 * producer still tells the consumer when the one it has goes, and that
 * makes the room for the next view of the new one. `unsent`: the message
 * that carries v[0]'s fds again never leaves (exported, then freed), and
 * the producer still counts v[0]'s segment sent, as the consumer has it. */
static void refused_batch(int unsent) {
  local_pair l;
  ipcref_view v[2], got;
  ipcref_msg msg;
  res_mark mark;
  res_begin(&mark);
  caps_open(&l);
  if (!l.pp || !l.cp) return;
  bytes_view(l.prod, PAGE, &v[0]);
  bytes_view(l.prod, PAGE, &v[1]);
  CHECK_EQ(ipcref_send(l.pp, &v[0]), IPCREF_OK);
  (void)take(l.cp, &got);
  ipcref_view_release(&got);
  set_caps(l.cp, 2, 0); /* the ledger and v[0]'s segment */
  CHECK_EQ(ipcref_send_batch(l.pp, v, 2), IPCREF_OK);
  errors_reset();
  CHECK_EQ(ipcref_recv(l.cp, &got, WAIT_MS), IPCREF_ERANGE);
  EXPECT_ERRORS(1);
  CHECK_EQ(leases_of(l.pp), 0); /* swept: v[0]'s fds are to go again */
  if (unsent && ipcref_export(l.pp, &v[0], &msg) == IPCREF_OK) {
    CHECK_EQ(msg.nfds, 3); /* its segment's, its ledger's and the bell */
    ipcref_msg_free(&msg);
  }
  ipcref_view_release(&v[0]); /* its segment goes: the consumer is told */
  CHECK_EQ(ipcref_collect(l.prod), IPCREF_OK);
  CHECK_EQ(ipcref_send(l.pp, &v[1]), IPCREF_OK);
  (void)take(l.cp, &got); /* v[1], once v[0]'s segment went */
  ipcref_view_release(&got);
  EXPECT_ERRORS(0);
  CHECK_EQ(peer_info_of(l.cp).maps, 2);
  CHECK_EQ(stats_of(l.cons).mapped_segments, 1);
  ipcref_view_release(&v[1]);
  local_pair_close(&l);
  RES_END(&mark);
}
static void test_refused_batch(void) {
  refused_batch(0);
}
static void test_resend_unsent(void) {
  refused_batch(1);
}

/* The context's caps count what every peer brought, and what stays mapped
 * once its peer is gone: with 4 mappings allowed, one producer's ledger
 * and segment, then another's, fill them; the second producer's next
 * segment is refused on a peer without caps of its own. The first peer
 * freed while its view lives keeps its mappings counted; once the view
 * goes, they make room. */
static void test_ctx_cap(void) {
  ipcref_ctx_options po, co;
  ipcref_ctx *prod[2], *cons;
  ipcref_peer *pp[2], *cp[2];
  ipcref_view v[3], got[3];
  res_mark mark;
  int i, sv[2];
  res_begin(&mark);
  memset(&po, 0, sizeof po);
  memset(&co, 0, sizeof co);
  po.isolate = 1;
  co.max_maps = 4;
  co.error_hook = error_hook;
  cons = make_ctx(&co);
  for (i = 0; i < 2; i++) {
    prod[i] = make_ctx(&po);
    pp[i] = cp[i] = NULL;
    if (xsocketpair(SOCK_SEQPACKET, sv) != 0) continue;
    pp[i] = prod[i] ? make_peer(prod[i], sv[0]) : NULL;
    cp[i] = cons ? make_peer(cons, sv[1]) : NULL;
    if (!pp[i]) tclose(sv[0]);
    if (!cp[i]) tclose(sv[1]);
  }
  if (!pp[0] || !pp[1] || !cp[0] || !cp[1]) {
    CHECK(!"the set-up");
    return;
  }
  bytes_view(prod[0], PAGE, &v[0]);
  bytes_view(prod[1], PAGE, &v[1]);
  bytes_view(prod[1], PAGE, &v[2]);
  for (i = 0; i < 2; i++) {
    CHECK_EQ(ipcref_send(pp[i], &v[i]), IPCREF_OK);
    (void)take(cp[i], &got[i]);
  }
  CHECK_EQ(stats_of(cons).maps_in, 4);
  CHECK(stats_of(cons).maps_in_bytes > 2 * PAGE);
  errors_reset();
  CHECK_EQ(ipcref_send(pp[1], &v[2]), IPCREF_OK);
  CHECK_EQ(ipcref_recv(cp[1], &got[2], WAIT_MS), IPCREF_ERANGE);
  CHECK(strstr(err_last, "context") != NULL);
  EXPECT_ERRORS(1);
  CHECK_EQ(peer_info_of(cp[1]).maps, 2);
  /* The first producer's peer goes; its view lives, and so do its maps. */
  ipcref_peer_free(cp[0]);
  CHECK_EQ(stats_of(cons).maps_in, 4);
  CHECK_EQ(ipcref_send(pp[1], &v[2]), IPCREF_OK);
  CHECK_EQ(ipcref_recv(cp[1], &got[2], WAIT_MS), IPCREF_ERANGE);
  EXPECT_ERRORS(1);
  ipcref_view_release(&got[0]);
  sleep_us(20000); /* a clock tick: the send reads the refusals first */
  CHECK_EQ(ipcref_send(pp[1], &v[2]), IPCREF_OK);
  (void)take(cp[1], &got[2]); /* room once the first one's view went */
  ipcref_view_release(&got[2]);
  EXPECT_ERRORS(0);
  CHECK_EQ(stats_of(cons).maps_in, 3);
  ipcref_view_release(&got[1]);
  for (i = 0; i < 3; i++) ipcref_view_release(&v[i]);
  for (i = 0; i < 2; i++) ipcref_peer_free(pp[i]);
  ipcref_peer_free(cp[1]);
  ipcref_ctx_free(cons);
  for (i = 0; i < 2; i++) ipcref_ctx_free(prod[i]);
  RES_END(&mark);
}

/* The hostile producer: a new segment in every one of FLOOD messages.
 * Told how many the consumer took, it checks that only those leases are
 * out; told they went, that none is. */
static int flooder(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx_options o;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v;
  int i, took;
  memset(&o, 0, sizeof o);
  o.isolate = 1;
  ctx = make_ctx(&o);
  p = make_peer(ctx, k->their_sock[0]);
  if (!p) return 1;
  for (i = 0; i < FLOOD; i++) {
    bytes_view(ctx, PAGE, &v);
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ipcref_view_release(&v);
  }
  took = ctl_get(k->their_ctl, CTL_MS);
  CHECK_EQ(leases_of(p), (size_t)took);
  ctl_put(k->their_ctl, 'k');
  CHECK_EQ(ctl_get(k->their_ctl, CTL_MS), 'f');
  CHECK_EQ(leases_of(p), 0);
  CHECK_EQ(stats_of(ctx).live_bytes, 0);
  ctl_put(k->their_ctl, 'e');
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return harness_failures_in_test ? 1 : 0;
}

/* A consumer capped at CAP mappings takes CAP - 1 of the flood's views
 * (the ledger is the first mapping) and refuses the rest; past the first
 * message its fds grow by a segment's each, no more, and the producer gets
 * back every lease it refused. */
static void test_hostile_flood(void) {
  ipcref_ctx_options o;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view got[CAP];
  int i, ok = 0, refused = 0, fds = 0;
  kid k;
  kid_start(&k, 1, SOCK_SEQPACKET, flooder);
  memset(&o, 0, sizeof o);
  o.error_hook = error_hook;
  ctx = make_ctx(&o);
  p = ctx ? kid_peer(&k, 0, ctx) : NULL;
  if (!p) {
    KID_KILL(&k, "flooder");
    kid_close(&k);
    ipcref_ctx_free(ctx);
    return;
  }
  set_caps(p, CAP, 0);
  errors_reset();
  for (i = 0; i < FLOOD; i++) {
    ipcref_view v;
    ipcref_result r = ipcref_recv(p, &v, WAIT_MS);
    if (i == 0) fds = count_fds(); /* the ledger's, the channel's, one more */
    if (r == IPCREF_OK && ok < CAP) got[ok++] = v;
    refused += r == IPCREF_ERANGE;
    if (r != IPCREF_OK && r != IPCREF_ERANGE) CHECK_EQ(r, IPCREF_OK);
  }
  CHECK_EQ(ok, CAP - 1);
  CHECK_EQ(refused, FLOOD - (CAP - 1));
  EXPECT_ERRORS(FLOOD - (CAP - 1));
  CHECK_EQ(peer_info_of(p).maps, CAP);
  CHECK_EQ(count_fds(), fds + CAP - 2); /* a segment's each */
  ctl_put(k.ctl, ok);
  CTL_EXPECT(k.ctl, 'k');
  for (i = 0; i < ok; i++) ipcref_view_release(&got[i]);
  ctl_put(k.ctl, 'f');
  CTL_EXPECT(k.ctl, 'e');
  KID_END(&k, "flooder");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

int main(void) {
  fixture_start();
  RUN(test_count_cap);
  RUN(test_byte_cap);
  RUN(test_refused_in_flight);
  RUN(test_refused_many);
  RUN(test_refused_batch);
  RUN(test_resend_unsent);
  RUN(test_refused_ledger);
  RUN(test_ctx_cap);
  RUN(test_ctx_byte_cap);
  RUN(test_free_past_refusal);
  RUN(test_hostile_flood);
  return harness_finish();
}
