/* The channel: hand-off records in a shared-memory ring beside the peer's
 * socket (src/share_channel.h).
 *
 *   - records take the ring once the segment crossed (seqpacket and
 *     stream), and both paths keep the order the sender sent in: fd
 *     messages, a full ring's messages on the socket, records wrapping
 *     around a small ring;
 *   - a hostile sender: its ring's indices and records corrupted in each
 *     field, a replayed record, a socket message announced that never
 *     comes, malformed setups, a doorbell kept full or its timeout
 *     cleared: EPROTO (or a wait that ends), never a read out of bounds,
 *     a hang or a crash;
 *   - a hostile receiver: its read index and sleep flag corrupted: the
 *     sender never blocks, never overwrites what is unread, and goes on
 *     over the socket;
 *   - waiting: a receiver dozes on the futex, then sleeps on the doorbell,
 *     and a record wakes it either way; a sender dying during the doze
 *     ends the receive; the poll fd wakes for ring records, also after
 *     a burst filled the doorbell; every spin
 *     option ends its waits on time; options out of range are refused;
 *   - processes: 8 consumers of one producer each get theirs; a consumer
 *     killed with records unread pins nothing; a consumer under seccomp
 *     strict mode receives from the ring (no system call while records
 *     are there). */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "share_fixture.h"

#define CTL_MS 30000
#define ELEMS  256 /* u32 elements of a test view */

/* A peer with the channel on, whatever IPCREF_TEST_PATH says: ring of
 * `ring` bytes (0: default), spin `spin` us. */
static ipcref_peer *chan_peer(ipcref_ctx *ctx, int fd, size_t ring, int spin) {
  ipcref_peer_options o;
  ipcref_peer *p = NULL;
  memset(&o, 0, sizeof o);
  o.ring_bytes = ring;
  o.spin_us = spin;
  CHECK_EQ(ipcref_peer_new_with(ctx, fd, &o, &p), IPCREF_OK);
  if (p) tforget(fd);
  return p;
}

/* Two contexts here (the producer's with options `prod`, may be NULL;
 * both with the error hook), a channel peer each on a socketpair of
 * `type`. */
static void chan_pair(local_pair *l, int type, size_t ring,
                      const ipcref_ctx_options *prod) {
  ipcref_ctx_options po, co;
  int sv[2];
  memset(l, 0, sizeof *l);
  memset(&co, 0, sizeof co);
  co.error_hook = error_hook;
  if (prod)
    po = *prod;
  else
    po = co;
  po.error_hook = error_hook;
  if (xsocketpair(type, sv) != 0) return;
  l->prod = make_ctx(&po);
  l->cons = make_ctx(&co);
  if (l->prod) l->pp = chan_peer(l->prod, sv[0], ring, IPCREF_SPIN_AUTO);
  if (l->cons) l->cp = chan_peer(l->cons, sv[1], ring, IPCREF_SPIN_AUTO);
}

/* A view of ELEMS u32 holding seed + i. */
static void seeded_view(ipcref_ctx *ctx, uint32_t seed, ipcref_view *v) {
  const int64_t n = ELEMS;
  int i;
  memset(v, 0, sizeof *v);
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U32, 1, &n, v), IPCREF_OK);
  if (!v->buf) return;
  for (i = 0; i < ELEMS; i++)
    ((uint32_t *)ipcref_view_data_mut(v))[i] = seed + (uint32_t)i;
}

/* 1 when v holds seed + i. */
static int seeded_is(const ipcref_view *v, uint32_t seed) {
  const uint32_t *d = (const uint32_t *)ipcref_view_data(v);
  int i;
  if (!d || v->ndim != 1 || v->shape[0] != ELEMS) return 0;
  for (i = 0; i < ELEMS; i++)
    if (d[i] != seed + (uint32_t)i) return 0;
  return 1;
}

/* Collects until no lease is live and nothing is in the limbo: 1, or 0
 * after ms. */
static int wait_collected(ipcref_ctx *ctx, long ms) {
  long t0 = now_ms();
  for (;;) {
    ipcref_stats s;
    ipcref_collect(ctx);
    if (ipcref_ctx_stats(ctx, &s) == IPCREF_OK && s.live_slots == 0 &&
        s.limbo_blocks == 0)
      return 1;
    if (now_ms() - t0 > ms * slow) return 0;
    sleep_us(2000);
  }
}

/* Sends v with metadata `seq` (4 bytes). */
static ipcref_result send_seq(ipcref_peer *p, const ipcref_view *v,
                              uint32_t seq) {
  return ipcref_send_meta(p, v, 1, &seq, sizeof seq);
}

/* Receives one view within ms and its 4-byte sequence number (~0u: none). */
static ipcref_result recv_seq(ipcref_peer *p, ipcref_view *v, int ms,
                              uint32_t *seq) {
  size_t len = 0;
  const void *m;
  ipcref_result r = ipcref_recv(p, v, ms);
  *seq = ~0u;
  if (r != IPCREF_OK) return r;
  m = ipcref_recv_meta(p, &len);
  if (m && len == sizeof *seq) memcpy(seq, m, sizeof *seq);
  return r;
}

/* ------------------------------------------------------------ the paths */

/* After the first message (the segment's and ledger's fds), the same
 * view's records go through the ring; the socket carries no more. */
static void records_take_the_ring(int type) {
  local_pair l;
  ipcref_view v, got;
  ipcref_peer_info pi, ci;
  int i, bad = 0;
  res_mark m;
  res_begin(&m);
  chan_pair(&l, type, 0, NULL);
  seeded_view(l.prod, 7, &v);
  for (i = 0; i < 300; i++) {
    CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
    if (ipcref_recv(l.cp, &got, 5000) != IPCREF_OK || !seeded_is(&got, 7))
      bad++;
    ipcref_view_release(&got);
  }
  CHECK_EQ(bad, 0);
  pi = peer_info_of(l.pp);
  ci = peer_info_of(l.cp);
  CHECK_EQ(pi.sent_socket, 1);
  CHECK_EQ(pi.sent_channel, 299);
  CHECK_EQ(pi.channel_out, 1);
  CHECK_EQ(ci.channel_in, 1);
  CHECK_EQ(ci.channel_out, 0); /* it sent nothing: no channel its way */
  ipcref_view_release(&v);
  local_pair_close(&l);
  RES_END(&m);
}
static void test_records_take_the_ring_seqpacket(void) {
  records_take_the_ring(SOCK_SEQPACKET);
}
static void test_records_take_the_ring_stream(void) {
  records_take_the_ring(SOCK_STREAM);
}

/* Fresh segments (fds: the socket), resends (the ring) and resends that
 * find the 4 KiB ring full (the socket again), 200 in all before the
 * consumer reads any: it gets them in the order sent. (Many more would
 * fill the socket's buffer too, and the producer would wait there.) */
static void order_of_both_paths(int type) {
  ipcref_ctx_options o;
  local_pair l;
  ipcref_view keep, v, got;
  ipcref_peer_info pi;
  uint32_t i, seq, bad = 0, fresh = 0;
  res_mark m;
  res_begin(&m);
  memset(&o, 0, sizeof o);
  o.isolate = 1; /* every block its own segment: its message has fds */
  chan_pair(&l, type, 4096, &o);
  seeded_view(l.prod, 1000, &keep);
  for (i = 0; i < 200; i++) {
    if (i % 5 == 0) {
      seeded_view(l.prod, 1000 + i, &v);
      CHECK_EQ(send_seq(l.pp, &v, i), IPCREF_OK);
      ipcref_view_release(&v);
      fresh++;
    } else {
      CHECK_EQ(send_seq(l.pp, &keep, i), IPCREF_OK);
    }
  }
  for (i = 0; i < 200; i++) {
    if (recv_seq(l.cp, &got, 5000, &seq) != IPCREF_OK || seq != i ||
        !seeded_is(&got, i % 5 == 0 ? 1000 + i : 1000))
      bad++;
    ipcref_view_release(&got);
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(ipcref_recv(l.cp, &got, 0), IPCREF_EAGAIN);
  pi = peer_info_of(l.pp);
  CHECK_EQ(pi.sent_socket + pi.sent_channel, 200);
  CHECK(pi.sent_channel > 10);        /* the ring took some */
  CHECK(pi.sent_socket > fresh + 10); /* and the full ring gave way */
  ipcref_view_release(&keep);
  local_pair_close(&l);
  RES_END(&m);
}
static void test_order_of_both_paths_seqpacket(void) {
  order_of_both_paths(SOCK_SEQPACKET);
}
static void test_order_of_both_paths_stream(void) {
  order_of_both_paths(SOCK_STREAM);
}

/* Records of every size from a bare view to one with 1 KiB of metadata
 * wrap around a 4 KiB ring over and over, read as they come. */
static void test_records_wrap(void) {
  local_pair l;
  ipcref_view v, got;
  unsigned char meta[IPCREF_META_MAX];
  const void *gm;
  size_t len, n;
  int i, bad = 0;
  chan_pair(&l, SOCK_SEQPACKET, 4096, NULL);
  seeded_view(l.prod, 3, &v);
  for (i = 0; i < 3000; i++) {
    n = (size_t)(i * 37) % (IPCREF_META_MAX + 1);
    memset(meta, i & 0xff, n);
    CHECK_EQ(ipcref_send_meta(l.pp, &v, 1, meta, n), IPCREF_OK);
    if (ipcref_recv(l.cp, &got, 5000) != IPCREF_OK || !seeded_is(&got, 3)) {
      bad++;
    } else {
      gm = ipcref_recv_meta(l.cp, &len);
      if (len != n || (n && memcmp(gm, meta, n) != 0)) bad++;
    }
    ipcref_view_release(&got);
  }
  CHECK_EQ(bad, 0);
  CHECK(peer_info_of(l.pp).sent_channel > 2900);
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* Records start on cache lines (a spinning receiver fetches a record's
 * first line with the tail): a view of 1 to 4 dimensions, without
 * metadata, takes 192 bytes of the ring, one of 5 to 8 the next 64; and
 * with metadata every record still starts on a line. */
static void test_records_on_lines(void) {
  unsigned char meta[100];
  int64_t shape[IPCREF_MAX_DIMS];
  local_pair l;
  ipcref_view v, r, got;
  int nd;
  chan_pair(&l, SOCK_SEQPACKET, 0, NULL);
  seeded_view(l.prod, 9, &v);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK); /* the socket: fds */
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  ipcref_view_release(&got);
  memset(meta, 7, sizeof meta);
  for (nd = 1; nd <= IPCREF_MAX_DIMS && l.pp->tx; nd++) {
    uint64_t at = l.pp->tx->tail;
    int64_t left = ELEMS;
    int d;
    for (d = 0; d < nd; d++) { /* 4 x 4 x 4 x 4 x 1 ... */
      shape[d] = d == nd - 1 ? left : d < 4 ? 4 : 1;
      left /= shape[d];
    }
    if (ipcref_view_reshape(&v, nd, shape, &r) != IPCREF_OK) {
      CHECK(!"a reshape of the test view");
      break;
    }
    CHECK_EQ(ipcref_send(l.pp, &r), IPCREF_OK);
    CHECK_EQ(l.pp->tx->tail - at, nd <= 4 ? 192u : 256u);
    CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
    CHECK_EQ(got.ndim, nd);
    ipcref_view_release(&got);
    at = l.pp->tx->tail;
    CHECK_EQ(ipcref_send_meta(l.pp, &r, 1, meta, (size_t)(nd * 11)), IPCREF_OK);
    CHECK(l.pp->tx->tail > at);
    CHECK_EQ(l.pp->tx->tail % IPCREF__CHAN_LINE, 0);
    CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
    ipcref_view_release(&got);
    ipcref_view_release(&r);
  }
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* Sends `s` with no metadata and receives it: 1 when it came whole
 * (seeded with `seed`, of s's shape); *bytes gets the ring bytes its
 * record took (0: it went on the socket). */
static int patch_round(local_pair *l, const ipcref_view *s, uint32_t seed,
                       uint64_t *bytes) {
  ipcref_view got;
  uint64_t at = l->pp->tx ? l->pp->tx->tail : 0;
  int ok;
  CHECK_EQ(ipcref_send(l->pp, s), IPCREF_OK);
  *bytes = l->pp->tx ? l->pp->tx->tail - at : 0;
  memset(&got, 0, sizeof got);
  ok =
      ipcref_recv(l->cp, &got, 5000) == IPCREF_OK && got.ndim == s->ndim &&
      got.shape[0] == s->shape[0] && ipcref_view_data(&got) &&
      ((const uint32_t *)ipcref_view_data(&got))[0] == seed &&
      ((const uint32_t *)ipcref_view_data(&got))[ELEMS - 1] == seed + ELEMS - 1;
  ipcref_view_release(&got);
  return ok;
}

/* A message that differs from the ring's last in a few bytes takes one
 * line, as a patch: the same view again (its lease's slot and generation
 * differ), another of the same shape in the same segment (its block's
 * offset too), the same view with new metadata of the same length. A
 * view of another shape goes whole, and so does the next one (a length
 * that differs); a message on the socket between leaves the patch to
 * apply to the ring's last. Each view comes whole and in order. */
static void test_patches(void) {
  local_pair l;
  ipcref_view v, w, r, big, got;
  const int64_t two[2] = {16, ELEMS / 16}, nbig = (int64_t)5 << 20;
  uint64_t b;
  uint32_t seq;
  int i, bad = 0;
  chan_pair(&l, SOCK_SEQPACKET, 0, NULL);
  seeded_view(l.prod, 5, &v);
  seeded_view(l.prod, 6, &w);
  CHECK(v.buf && w.buf &&
        ipcref__local_block(v.buf)->seg == ipcref__local_block(w.buf)->seg);
  CHECK(patch_round(&l, &v, 5, &b) && b == 0);   /* the socket: fds */
  CHECK(patch_round(&l, &v, 5, &b) && b == 192); /* the ring's first */
  for (i = 0; i < 300; i++) {
    const ipcref_view *s = i % 3 == 2 ? &w : &v;
    if (!patch_round(&l, s, s == &w ? 6 : 5, &b) || b != 64) bad++;
  }
  CHECK_EQ(bad, 0);
  /* Another shape: whole; then v, of another length: whole; then a patch. */
  CHECK_EQ(ipcref_view_reshape(&v, 2, two, &r), IPCREF_OK);
  CHECK(patch_round(&l, &r, 5, &b) && b == 192);
  CHECK(patch_round(&l, &v, 5, &b) && b == 192);
  CHECK(patch_round(&l, &v, 5, &b) && b == 64);
  /* Metadata of the same length, new bytes: a patch, the bytes right. */
  for (i = 0; i < 50; i++) {
    uint64_t at = l.pp->tx->tail;
    CHECK_EQ(send_seq(l.pp, &v, (uint32_t)i * 7919u), IPCREF_OK);
    if (i > 0 && l.pp->tx->tail - at != 64) bad++; /* the first: longer */
    if (recv_seq(l.cp, &got, 5000, &seq) != IPCREF_OK ||
        seq != (uint32_t)i * 7919u || !seeded_is(&got, 5))
      bad++;
    ipcref_view_release(&got);
  }
  CHECK_EQ(bad, 0);
  CHECK(patch_round(&l, &v, 5, &b) && b == 192); /* another length */
  /* Over the sender's copy (IPCREF__CHAN_LAST): whole, again and again. */
  for (i = 0; i < 3; i++) {
    unsigned char meta[IPCREF__CHAN_LAST];
    const void *gm;
    size_t glen;
    uint64_t at = l.pp->tx->tail;
    memset(meta, 'a' + i, sizeof meta);
    CHECK_EQ(ipcref_send_meta(l.pp, &v, 1, meta, sizeof meta), IPCREF_OK);
    CHECK(l.pp->tx->tail - at > IPCREF__CHAN_LAST);
    CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
    gm = ipcref_recv_meta(l.cp, &glen);
    CHECK(seeded_is(&got, 5) && glen == sizeof meta && gm &&
          memcmp(gm, meta, glen) == 0);
    ipcref_view_release(&got);
  }
  CHECK(patch_round(&l, &v, 5, &b) && b == 192); /* whole: nothing kept */
  CHECK(patch_round(&l, &v, 5, &b) && b == 64);
  /* A new segment's message on the socket, then a patch of the ring's
   * last: the socket's comes first, then the patched one. */
  memset(&big, 0, sizeof big);
  CHECK_EQ(ipcref_view_new_shared(l.prod, IPCREF_U8, 1, &nbig, &big),
           IPCREF_OK);
  CHECK_EQ(ipcref_send(l.pp, &big), IPCREF_OK);
  b = l.pp->tx->tail;
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  CHECK_EQ(l.pp->tx->tail - b, 64);
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  CHECK_EQ(got.shape[0], nbig);
  ipcref_view_release(&got);
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  CHECK(seeded_is(&got, 5));
  ipcref_view_release(&got);
  for (i = 0; i < 3; i++) CHECK(patch_round(&l, &w, 6, &b) && b == 64);
  CHECK(peer_info_of(l.cp).channel_in == 1);
  ipcref_view_release(&big);
  ipcref_view_release(&r);
  ipcref_view_release(&w);
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* ------------------------------------------------------------ a hostile sender
 */

/* The sender's ring, as a hostile sender would write it. */
static unsigned char *ring_of(ipcref_peer *p) {
  return p->tx->map + IPCREF__CHAN_HDR;
}
static ipcref__chan_hdr *ring_hdr(ipcref_peer *p) {
  return (ipcref__chan_hdr *)(void *)p->tx->map;
}

/* Writes a record by hand: `len` in its length field, `before` as its
 * socket count, `body` (`n` bytes) after it; the tail moves by `adv`
 * (0: the record's own size). */
static void raw_record(ipcref_peer *p, uint32_t len, uint64_t before,
                       const unsigned char *body, size_t n, uint64_t adv) {
  struct ipcref__chan_tx *t = p->tx;
  unsigned char h[16];
  memset(h, 0, sizeof h);
  memcpy(h, &len, 4);
  memcpy(h + 8, &before, 8);
  ipcref__chan_copy(ring_of(p), t->bytes, t->tail, h, 16, 1);
  if (n)
    ipcref__chan_copy(ring_of(p), t->bytes, t->tail + 16,
                      (unsigned char *)(uintptr_t)body, n, 1);
  t->tail += adv ? adv : ipcref__chan_need(n);
  t->last_len = 0; /* not the library's last message: its next is whole */
  __atomic_store_n(&ring_hdr(p)->tail, t->tail, __ATOMIC_RELEASE);
}

/* Writes a patch record by hand: kind 1, `len` in its length field, the
 * patch's offset `at` and count `n`, and `n` bytes of `fill`. */
static void raw_patch(ipcref_peer *p, uint32_t len, uint16_t at, uint16_t n,
                      unsigned char fill) {
  unsigned char body[4 + IPCREF__CHAN_PATCH_MAX];
  const uint32_t kind = IPCREF__CHAN_PATCH;
  uint64_t from = p->tx->tail;
  unsigned char k[4];
  memset(body, fill, sizeof body);
  ipcref__le_put(body, at, 2);
  ipcref__le_put(body + 2, n, 2);
  ipcref__le_put(k, kind, 4);
  raw_record(p, len, p->tx->sockets, body, sizeof body, 64);
  ipcref__chan_copy(ring_of(p), p->tx->bytes, from + 4, k, 4, 1);
}

/* A pair whose channel is up: one view crossed (socket), one record read. */
static void hostile_pair(local_pair *l, ipcref_view *v) {
  ipcref_view got;
  chan_pair(l, SOCK_SEQPACKET, 4096, NULL);
  seeded_view(l->prod, 11, v);
  CHECK_EQ(ipcref_send(l->pp, v), IPCREF_OK);
  CHECK_EQ(ipcref_send(l->pp, v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l->cp, &got, 5000), IPCREF_OK);
  ipcref_view_release(&got);
  CHECK_EQ(ipcref_recv(l->cp, &got, 5000), IPCREF_OK);
  ipcref_view_release(&got);
  CHECK_EQ(peer_info_of(l->pp).sent_channel, 1);
}

/* The consumer refuses the broken channel for good, by name. */
static void expect_broken(local_pair *l, const char *why) {
  ipcref_view got;
  memset(&got, 0, sizeof got);
  CHECK_EQ(ipcref_recv(l->cp, &got, 0), IPCREF_EPROTO);
  CHECK(got.buf == NULL);
  if (!strstr(err_last, why)) printf("    last report: %s\n", err_last);
  CHECK(strstr(err_last, why) != NULL);
  CHECK_EQ(ipcref_recv(l->cp, &got, 100), IPCREF_EPROTO); /* for good */
  CHECK_EQ(peer_info_of(l->cp).channel_in, -1);
}

enum {
  H_TAIL_FAR,
  H_TAIL_ODD,
  H_TAIL_IN_LINE, /* a multiple of 8 within a line: no record ends there */
  H_LEN_ZERO,
  H_LEN_HUGE,
  H_LEN_PAST,
  H_KIND,
  H_BEFORE_BACK,
  H_SOCKETS_BACK,
  H_PATCH_LONG,    /* a patch of more than one line */
  H_PATCH_COUNT,   /* its byte count and length disagree */
  H_PATCH_ZERO,    /* a patch of no byte */
  H_PATCH_OUTSIDE, /* past the end of the message before it */
  H_NCASES
};

static void test_hostile_sender_indices_and_fields(void) {
  static const char *const why[H_NCASES] = {"write index out of range",
                                            "write index out of range",
                                            "write index out of range",
                                            "length out of range",
                                            "length out of range",
                                            "length out of range",
                                            "unknown kind",
                                            "fewer socket messages",
                                            "socket count went back",
                                            "length out of range",
                                            "count disagrees",
                                            "count disagrees",
                                            "outside the message before"};
  int c;
  for (c = 0; c < H_NCASES; c++) {
    local_pair l;
    ipcref_view v;
    unsigned char body[64];
    struct ipcref__chan_tx *t;
    ipcref_stats before, after;
    memset(body, 0xab, sizeof body);
    errors_reset();
    hostile_pair(&l, &v);
    if (!l.pp || !l.pp->tx) break;
    t = l.pp->tx;
    (void)ipcref_ctx_stats(l.cons, &before);
    switch (c) {
    case H_TAIL_FAR:
      __atomic_store_n(&ring_hdr(l.pp)->tail, t->tail + t->bytes + 8,
                       __ATOMIC_RELEASE);
      break;
    case H_TAIL_ODD:
      __atomic_store_n(&ring_hdr(l.pp)->tail, t->tail + 3, __ATOMIC_RELEASE);
      break;
    case H_TAIL_IN_LINE:
      __atomic_store_n(&ring_hdr(l.pp)->tail, t->tail + 8, __ATOMIC_RELEASE);
      break;
    case H_LEN_ZERO: raw_record(l.pp, 0, t->sockets, body, 0, 64); break;
    case H_LEN_HUGE:
      raw_record(l.pp, IPCREF_MSG_MAX_BYTES + 1, t->sockets, body, 64, 0);
      break;
    case H_LEN_PAST: raw_record(l.pp, 2000, t->sockets, body, 64, 0); break;
    case H_KIND:
      raw_record(l.pp, 64, t->sockets, body, 64, 0);
      ring_of(l.pp)[(t->tail - ipcref__chan_need(64) + 5) & (t->bytes - 1)] = 1;
      break;
    case H_BEFORE_BACK: raw_record(l.pp, 64, 0, body, 64, 0); break;
    case H_SOCKETS_BACK:
      __atomic_store_n(&ring_hdr(l.pp)->sockets, 0, __ATOMIC_RELEASE);
      break;
    case H_PATCH_LONG: raw_patch(l.pp, 4 + 45, 0, 45, 1); break;
    case H_PATCH_COUNT: raw_patch(l.pp, 4 + 8, 0, 9, 1); break;
    case H_PATCH_ZERO: raw_patch(l.pp, 4, 0, 0, 1); break;
    case H_PATCH_OUTSIDE: raw_patch(l.pp, 4 + 8, 1000, 8, 1); break;
    }
    expect_broken(&l, why[c]);
    (void)ipcref_ctx_stats(l.cons, &after);
    CHECK_EQ(after.imported_bufs, before.imported_bufs);
    ipcref_view_release(&v);
    local_pair_close(&l);
  }
}

/* A patch as the ring's first record: there is no message before it. */
static void test_hostile_patch_first(void) {
  local_pair l;
  ipcref_view v, got;
  errors_reset();
  chan_pair(&l, SOCK_SEQPACKET, 4096, NULL);
  seeded_view(l.prod, 12, &v);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK); /* the socket: fds */
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  ipcref_view_release(&got);
  if (l.pp && l.pp->tx) {
    raw_patch(l.pp, 4 + 8, 0, 8, 1);
    expect_broken(&l, "outside the message before");
  } else {
    CHECK(!"a channel after the first send");
  }
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* After a hostile pair's records were refused (see hostile_pair): the
 * next hand-off of `v` still comes, with its data, and the channel to the
 * receiver is still up; then `v` and the pair go. */
static void ring_goes_on(local_pair *l, ipcref_view *v) {
  ipcref_view got;
  memset(&got, 0, sizeof got);
  CHECK_EQ(ipcref_send(l->pp, v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l->cp, &got, 5000), IPCREF_OK);
  CHECK(seeded_is(&got, 11));
  ipcref_view_release(&got);
  CHECK_EQ(peer_info_of(l->cp).channel_in, 1);
  ipcref_view_release(v);
  local_pair_close(l);
}

/* A patch record replayed: the message it makes is the one just
 * imported, and the import refuses it as it refuses a replayed message;
 * once that view is let go and its lease swept, its lease is not live.
 * The ring goes on. */
static void test_hostile_patch_replay(void) {
  local_pair l;
  ipcref_view v, got, held;
  unsigned char line[64];
  struct ipcref__chan_tx *t;
  uint64_t at;
  int k;
  errors_reset();
  hostile_pair(&l, &v);
  if (!l.pp || !l.pp->tx) return;
  t = l.pp->tx;
  at = t->tail;
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  CHECK_EQ(t->tail - at, 64); /* a patch */
  ipcref__chan_copy(ring_of(l.pp), t->bytes, at, line, sizeof line, 0);
  CHECK_EQ(ipcref_recv(l.cp, &held, 5000), IPCREF_OK);
  for (k = 0; k < 2; k++) {
    if (k == 1) { /* let go, and swept */
      ipcref_view_release(&held);
      ipcref_collect(l.prod);
    }
    ipcref__chan_copy(ring_of(l.pp), t->bytes, t->tail, line, sizeof line, 1);
    t->tail += sizeof line;
    __atomic_store_n(&ring_hdr(l.pp)->tail, t->tail, __ATOMIC_RELEASE);
    memset(&got, 0, sizeof got);
    CHECK_EQ(ipcref_recv(l.cp, &got, 0), IPCREF_EPROTO);
    CHECK(got.buf == NULL);
    if (!strstr(err_last, k ? "not live" : "imported twice"))
      printf("    %s\n", err_last);
    CHECK(strstr(err_last, k ? "not live" : "imported twice") != NULL);
  }
  ring_goes_on(&l, &v);
}

/* A well-framed record of garbage, then a replay of a good one: each is
 * refused as a socket message would be (EPROTO), and the ring goes on. */
static void test_hostile_sender_records(void) {
  local_pair l;
  ipcref_view v, got, good_view;
  unsigned char body[200], good[IPCREF_MSG_MAX_BYTES];
  struct ipcref__chan_tx *t;
  uint64_t at;
  size_t glen;
  int i;
  errors_reset();
  hostile_pair(&l, &v);
  if (!l.pp || !l.pp->tx) return;
  t = l.pp->tx;
  for (i = 0; i < (int)sizeof body; i++) body[i] = (unsigned char)(i * 13);
  raw_record(l.pp, sizeof body, t->sockets, body, sizeof body, 0);
  CHECK_EQ(ipcref_recv(l.cp, &got, 0), IPCREF_EPROTO);
  CHECK(strstr(err_last, "message refused") != NULL);
  /* A good record, read; then the same bytes again: a replay. */
  at = t->tail;
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  glen = (size_t)(ipcref__chan_word(ring_of(l.pp), t->bytes, at) & 0xffff);
  ipcref__chan_copy(ring_of(l.pp), t->bytes, at + 16, good, glen, 0);
  CHECK_EQ(ipcref_recv(l.cp, &good_view, 5000), IPCREF_OK);
  CHECK(seeded_is(&good_view, 11));
  raw_record(l.pp, (uint32_t)glen, t->sockets, good, glen, 0);
  CHECK_EQ(ipcref_recv(l.cp, &got, 0), IPCREF_EPROTO);
  CHECK(strstr(err_last, "imported twice") != NULL);
  /* ... and again once the view is let go and its lease swept. */
  ipcref_view_release(&good_view);
  ipcref_collect(l.prod);
  raw_record(l.pp, (uint32_t)glen, t->sockets, good, glen, 0);
  CHECK_EQ(ipcref_recv(l.cp, &got, 0), IPCREF_EPROTO);
  if (!strstr(err_last, "not live")) printf("    %s\n", err_last);
  CHECK(strstr(err_last, "not live") != NULL);
  ring_goes_on(&l, &v); /* the ring is fine */
}

/* A sender that keeps its doorbell full and writes no record (threads
 * here, flooding it): a receive that may not wait says EAGAIN at once,
 * one that may wait 100 ms says ETIMEDOUT, and the receiver's free
 * returns. Nor can a sender take a receive's timeout away: SO_RCVTIMEO
 * is the socket's, and a sender may have kept the receiving end (here a
 * thread clears it all along). An alarm makes a hang a failure. */
typedef struct bell_flood {
  int fd, rx, stop;
} bell_flood;
static void *flood_bell(void *arg) {
  bell_flood *f = (bell_flood *)arg;
  static char b[4096];
  while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
    (void)send(f->fd, b, sizeof b, MSG_DONTWAIT | MSG_NOSIGNAL);
    sched_yield(); /* valgrind runs one thread at a time */
  }
  return NULL;
}
static void *clear_rcvtimeo(void *arg) {
  bell_flood *f = (bell_flood *)arg;
  struct timeval none = {0, 0};
  while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
    (void)setsockopt(f->rx, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    sched_yield();
  }
  return NULL;
}
static void on_hang(int sig) {
  static const char m[] = "test_channel: a receive or a free hung\n";
  (void)sig;
  if (write(2, m, sizeof m - 1) < 0) _exit(4);
  _exit(3);
}

static void test_hostile_sender_doorbell(void) {
  local_pair l;
  ipcref_view v, got;
  bell_flood f;
  pthread_t t[4];
  int i, eagain = 0, timedout = 0, polls = under_valgrind ? 10 : 100;
  hostile_pair(&l, &v);
  if (!l.cp || !l.cp->rx) return;
  memset(&got, 0, sizeof got);
  signal(SIGALRM, on_hang);
  alarm(120 * (unsigned)slow);
  f.fd = l.pp->tx->doorbell;
  f.rx = l.cp->bell_in;
  f.stop = 0;
  CHECK_EQ(pthread_create(&t[0], NULL, clear_rcvtimeo, &f), 0);
  for (i = 0; i < 5; i++)
    timedout += ipcref_recv(l.cp, &got, 100) == IPCREF_ETIMEDOUT;
  CHECK_EQ(timedout, 5);
  for (i = 1; i < 4; i++)
    CHECK_EQ(pthread_create(&t[i], NULL, flood_bell, &f), 0);
  for (i = 0; i < polls; i++)
    eagain += ipcref_recv(l.cp, &got, 0) == IPCREF_EAGAIN;
  CHECK_EQ(eagain, polls);
  CHECK_EQ(ipcref_recv(l.cp, &got, 100), IPCREF_ETIMEDOUT);
  CHECK(got.buf == NULL);
  ipcref_peer_free(l.cp);
  l.cp = NULL;
  __atomic_store_n(&f.stop, 1, __ATOMIC_RELEASE);
  for (i = 0; i < 4; i++) CHECK_EQ(pthread_join(t[i], NULL), 0);
  alarm(0);
  signal(SIGALRM, SIG_DFL);
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* A socket message announced (by the header's count, or a record's) that
 * never comes: the receiver waits for it as long as it was asked to, no
 * longer, and then the message itself still comes in order. */
static void test_hostile_sender_announces_nothing(void) {
  local_pair l;
  ipcref_view v, got;
  struct ipcref__chan_tx *t;
  long t0;
  hostile_pair(&l, &v);
  if (!l.pp || !l.pp->tx) return;
  t = l.pp->tx;
  __atomic_store_n(&ring_hdr(l.pp)->sockets, t->sockets + 1, __ATOMIC_RELEASE);
  CHECK_EQ(ipcref_recv(l.cp, &got, 0), IPCREF_EAGAIN);
  t0 = now_ms();
  CHECK_EQ(ipcref_recv(l.cp, &got, 30), IPCREF_ETIMEDOUT);
  CHECK(now_ms() - t0 >= 29);
  /* The sender sends it after all (the count is already there). */
  __atomic_store_n(&ring_hdr(l.pp)->sockets, t->sockets, __ATOMIC_RELEASE);
  CHECK_EQ(ipcref_recv(l.cp, &got, 0), IPCREF_EAGAIN);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  CHECK(seeded_is(&got, 11));
  ipcref_view_release(&got);
  ipcref_view_release(&v);
  local_pair_close(&l);
}

enum {
  S_VERSION,
  S_LAYOUT, /* layout 0: 8-byte records, which this receiver cannot read */
  S_TWO_FDS,
  S_UNSEALED,
  S_PIPE_BELL,
  S_SIZE,
  S_HEADER,
  S_SECOND,
  S_NCASES
};

/* Malformed channel setups, each refused by name: the receiver then
 * refuses everything from that sender, never maps what it was not sent. */
static void test_hostile_setups(void) {
  static const char *const why[S_NCASES] = {
      "another version",   "another version",   "another version",
      "not sealed memfds", "not sealed memfds", "size out of range",
      "header disagrees",  "second channel"};
  int c;
  for (c = 0; c < S_NCASES; c++) {
    local_pair l;
    ipcref_msg setup, second;
    struct ipcref__chan_tx *t = NULL, *t2 = NULL;
    ipcref_view got;
    int fds[3], i, pf[2] = {-1, -1}, nfds = 3;
    errors_reset();
    chan_pair(&l, SOCK_SEQPACKET, 4096, NULL);
    if (!l.pp || ipcref__chan_make(4096, &t, &setup) != IPCREF_OK) break;
    memcpy(fds, setup.fds, sizeof fds);
    switch (c) {
    case S_VERSION: setup.bytes[4] = 9; break;
    case S_LAYOUT: setup.bytes[6] = 0; break;
    case S_TWO_FDS: nfds = 2; break;
    case S_UNSEALED:
      close(fds[0]);
      fds[0] = memfd_create("plain", MFD_CLOEXEC);
      CHECK_EQ(ftruncate(fds[0], IPCREF__CHAN_HDR + 4096), 0);
      break;
    case S_PIPE_BELL:
      CHECK_EQ(pipe(pf), 0);
      close(fds[2]);
      fds[2] = pf[0];
      break;
    case S_SIZE:
      setup.bytes[8] = 0x10;
      setup.bytes[9] = 0;
      break;
    case S_HEADER: ((ipcref__chan_hdr *)(void *)t->map)->magic = 0; break;
    case S_SECOND:
      CHECK_EQ(xfer_send(l.pp->fd, &setup), 0);
      CHECK_EQ(ipcref_recv(l.cp, &got, 0), IPCREF_EAGAIN);
      CHECK_EQ(peer_info_of(l.cp).channel_in, 1);
      for (i = 0; i < 3; i++) close(fds[i]);
      CHECK_EQ(ipcref__chan_make(4096, &t2, &second), IPCREF_OK);
      memcpy(fds, second.fds, sizeof fds);
      break;
    }
    memcpy(setup.fds, fds, sizeof fds); /* by hand on the sender's socket */
    setup.nfds = nfds;
    CHECK_EQ(xfer_send(l.pp->fd, &setup), 0);
    if (c == S_SECOND) /* the first channel counts it: read in order */
      __atomic_store_n(&((ipcref__chan_hdr *)(void *)t->map)->sockets, 1,
                       __ATOMIC_RELEASE);
    for (i = 0; i < 3; i++) close(fds[i]);
    if (pf[1] >= 0) close(pf[1]);
    memset(&got, 0, sizeof got);
    CHECK_EQ(ipcref_recv(l.cp, &got, 1000), IPCREF_EPROTO);
    if (!strstr(err_last, why[c])) printf("    case %d: %s\n", c, err_last);
    CHECK(strstr(err_last, why[c]) != NULL);
    CHECK_EQ(ipcref_recv(l.cp, &got, 0), IPCREF_EPROTO);
    CHECK_EQ(peer_info_of(l.cp).channel_in, -1);
    CHECK(got.buf == NULL);
    ipcref__chan_tx_free(t);
    ipcref__chan_tx_free(t2);
    local_pair_close(&l);
  }
}

/* ------------------------------------------------------------ a hostile
 * receiver */

/* The receiver's read index far ahead, or not on a cache line: the sender
 * sees it when the ring looks full (it reads the index only then), closes
 * the channel (reported) and goes on over the socket, in order. (An index
 * a little past the tail is a lie that is true by the time it is read:
 * the sender then overwrites what the liar said it read, its own loss.) */
static void bad_head(uint64_t (*head)(uint64_t tail, size_t bytes)) {
  local_pair l;
  ipcref_view v, got;
  ipcref_peer_info pi;
  uint32_t seq;
  int i, bad = 0;
  hostile_pair(&l, &v);
  if (!l.cp || !l.cp->rx) return;
  errors_reset();
  __atomic_store_n(&l.cp->rx->ctl->head, head(l.pp->tx->tail, l.pp->tx->bytes),
                   __ATOMIC_RELEASE);
  for (i = 0; i < 100; i++)
    CHECK_EQ(send_seq(l.pp, &v, (uint32_t)i), IPCREF_OK);
  pi = peer_info_of(l.pp);
  if (pi.channel_out != -1)
    printf("    head %llx tail %llx: %llu by the channel\n",
           (unsigned long long)l.cp->rx->ctl->head,
           (unsigned long long)l.pp->tx->tail,
           (unsigned long long)pi.sent_channel);
  CHECK_EQ(pi.channel_out, -1);
  /* Till it looked full: 4096 bytes of one-line patches. */
  CHECK(pi.sent_channel > 1 && pi.sent_channel <= 4096 / 64);
  CHECK(strstr(err_last, "read index is out of range") != NULL);
  for (i = 0; i < 100; i++) {
    if (recv_seq(l.cp, &got, 5000, &seq) != IPCREF_OK || seq != (uint32_t)i ||
        !seeded_is(&got, 11))
      bad++;
    ipcref_view_release(&got);
  }
  CHECK_EQ(bad, 0);
  ipcref_view_release(&v);
  local_pair_close(&l);
}
static uint64_t head_far(uint64_t tail, size_t bytes) {
  return tail + 2 * bytes;
}
static uint64_t head_odd(uint64_t tail, size_t bytes) {
  (void)bytes;
  return tail - 5;
}
static uint64_t head_in_line(uint64_t tail, size_t bytes) {
  (void)bytes;
  return tail - 8; /* a multiple of 8, within a record's line */
}
static void test_hostile_receiver_head(void) {
  bad_head(head_far);
  bad_head(head_odd);
  bad_head(head_in_line);
}

/* The receiver's read index moved back (it claims to have read less):
 * the sender overwrites nothing the receiver has not read, and what no
 * longer fits goes on the socket; its sleep flag stuck on: every record
 * rings the doorbell, which fills, and the sender never blocks; once it
 * found the doorbell full it rings no more until the receiver says it is
 * awake. */
static void test_hostile_receiver_back_and_asleep(void) {
  local_pair l;
  ipcref_view v, got;
  uint32_t seq;
  int i, bad = 0;
  long t0;
  hostile_pair(&l, &v);
  if (!l.cp || !l.cp->rx) return;
  __atomic_store_n(&l.cp->rx->ctl->head, 0, __ATOMIC_RELEASE);
  for (i = 0; i < 100; i++)
    CHECK_EQ(send_seq(l.pp, &v, (uint32_t)i), IPCREF_OK);
  CHECK(peer_info_of(l.pp).sent_socket >= 100 - 4096 / 64); /* it looked full */
  for (i = 0; i < 100; i++) {
    if (recv_seq(l.cp, &got, 5000, &seq) != IPCREF_OK || seq != (uint32_t)i ||
        !seeded_is(&got, 11))
      bad++;
    ipcref_view_release(&got);
  }
  CHECK_EQ(bad, 0);
  /* Asleep for good, as the sender sees it. */
  t0 = now_ms();
  for (i = 0; i < 3000; i++) {
    __atomic_store_n(&l.cp->rx->ctl->asleep, 0xffffffffu, __ATOMIC_RELEASE);
    CHECK_EQ(send_seq(l.pp, &v, (uint32_t)i), IPCREF_OK);
    if (i % 10 == 9) { /* read in tens: the ring holds them */
      int k;
      for (k = i - 9; k <= i; k++) {
        if (recv_seq(l.cp, &got, 5000, &seq) != IPCREF_OK || seq != (uint32_t)k)
          bad++;
        ipcref_view_release(&got);
      }
    }
  }
  CHECK_EQ(bad, 0);
  CHECK(now_ms() - t0 < 20000 * slow);
  CHECK(peer_info_of(l.pp).channel_out == 1);
  CHECK_EQ(l.pp->tx->bell_full, 1);
  __atomic_store_n(&l.cp->rx->ctl->asleep, 0u, __ATOMIC_RELEASE);
  CHECK_EQ(send_seq(l.pp, &v, 3000), IPCREF_OK);
  CHECK_EQ(l.pp->tx->bell_full, 0);
  if (recv_seq(l.cp, &got, 5000, &seq) != IPCREF_OK || seq != 3000) bad++;
  ipcref_view_release(&got);
  CHECK_EQ(bad, 0);
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* A receiver that says it dozes (`asleep` 2) and never does: every send
 * takes the word back to 0 and wakes nobody, never blocks, and each
 * record is there to be read, in order. */
static void test_hostile_receiver_dozes(void) {
  local_pair l;
  ipcref_view v, got;
  uint32_t seq;
  uint64_t sock0;
  int i, bad = 0;
  hostile_pair(&l, &v);
  if (!l.cp || !l.cp->rx) return;
  sock0 = peer_info_of(l.pp).sent_socket;
  for (i = 0; i < 200; i++) {
    __atomic_store_n(&l.cp->rx->ctl->asleep, 2u, __ATOMIC_RELEASE);
    CHECK_EQ(send_seq(l.pp, &v, (uint32_t)i), IPCREF_OK);
    bad += __atomic_load_n(&l.cp->rx->ctl->asleep, __ATOMIC_ACQUIRE) != 0;
    if (recv_seq(l.cp, &got, 5000, &seq) != IPCREF_OK || seq != (uint32_t)i)
      bad++;
    ipcref_view_release(&got);
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(peer_info_of(l.pp).sent_socket, sock0); /* all through the ring */
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* A socket message counted, then taken back (its send failed with
 * nothing sent: fds past the kernel's limit, say), after the receiver
 * read the count and began to wait for it: the records pushed next still
 * reach a receive that waits for ever (it looks at the count again). */
typedef struct seq_waiter {
  ipcref_peer *p;
  ipcref_result r;
  uint32_t seq;
  int tid; /* the receiving thread's, once it runs */
} seq_waiter;
static void *seq_recv(void *arg) {
  seq_waiter *w = (seq_waiter *)arg;
  ipcref_view got;
  __atomic_store_n(&w->tid, (int)syscall(SYS_gettid), __ATOMIC_RELEASE);
  w->r = recv_seq(w->p, &got, 30000, &w->seq);
  if (w->r == IPCREF_OK) ipcref_view_release(&got);
  return NULL;
}
/* Waits (up to 10 s) until the thread *tid names (0: not yet known) sits
 * in poll(2) or ppoll(2), as /proc says; 0 when it was not seen there. */
static int thread_polls(const int *tid) {
  char path[64], buf[64];
  int i, fd, t;
  ssize_t k;
  for (i = 0; i < 10000; i++, sleep_us(1000)) {
    long nr;
    if ((t = __atomic_load_n(tid, __ATOMIC_ACQUIRE)) == 0) continue;
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", t);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) return 0;
    k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0) return 0;
    buf[k] = 0;
    nr = strtol(buf, NULL, 10);
#ifdef SYS_poll
    if (nr == SYS_poll) return 1;
#endif
    if (nr == SYS_ppoll) return 1;
  }
  return 0;
}

static void test_socket_count_taken_back(void) {
  local_pair l;
  ipcref_view v;
  seq_waiter w;
  pthread_t t;
  hostile_pair(&l, &v);
  if (!l.cp || !l.cp->rx) return;
  w.p = l.cp;
  w.r = IPCREF_EINVAL;
  w.tid = 0;
  ipcref__chan_count(l.pp, 1, 0); /* counted, as a send to the socket is */
  CHECK_EQ(pthread_create(&t, NULL, seq_recv, &w), 0);
  /* The receiver read the count and waits on the socket (the only poll
   * it makes here); where /proc cannot say, most likely after 200 ms. */
  if (!thread_polls(&w.tid)) sleep_us(200000);
  ipcref__chan_count(l.pp, 0, 0);             /* nothing went: taken back */
  CHECK_EQ(send_seq(l.pp, &v, 5), IPCREF_OK); /* a record */
  CHECK_EQ(pthread_join(t, NULL), 0);
  CHECK_EQ(w.r, IPCREF_OK);
  CHECK_EQ(w.seq, 5);
  CHECK_EQ(peer_info_of(l.pp).sent_channel, 2);
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* ------------------------------------------------------------ waiting */

/* A thread standing in for a dozing receiver: its FUTEX_WAIT on the sleep
 * word, for up to 10 s; 0 when woken (or the word changed before). */
static void *futex_waiter(void *arg) {
  uint32_t *word = (uint32_t *)arg;
  struct timespec t = {10, 0};
  long r =
      syscall(SYS_futex, word, FUTEX_WAIT, IPCREF__ASLEEP_FUTEX, &t, NULL, 0);
  return (void *)(intptr_t)(r == 0 || errno == EAGAIN ? 0 : errno);
}

/* A record sent while the receiver dozes takes its word to 0 and wakes
 * its futex: the wait ends at once, not at its timeout. */
static void test_sender_wakes_a_dozer(void) {
  local_pair l;
  ipcref_view v, got;
  pthread_t t;
  void *res = (void *)1;
  uint32_t seq;
  hostile_pair(&l, &v);
  if (!l.cp || !l.cp->rx) return;
  __atomic_store_n(&l.cp->rx->ctl->asleep, IPCREF__ASLEEP_FUTEX,
                   __ATOMIC_SEQ_CST);
  CHECK_EQ(pthread_create(&t, NULL, futex_waiter, &l.cp->rx->ctl->asleep), 0);
  sleep_us(20000); /* most likely waiting by now; if not, it sees the 0 */
  CHECK_EQ(send_seq(l.pp, &v, 7), IPCREF_OK);
  CHECK_EQ(pthread_join(t, &res), 0);
  CHECK(res == NULL); /* woken, not timed out */
  CHECK_EQ(__atomic_load_n(&l.cp->rx->ctl->asleep, __ATOMIC_ACQUIRE), 0);
  CHECK_EQ(recv_seq(l.cp, &got, 5000, &seq), IPCREF_OK);
  CHECK_EQ(seq, 7);
  ipcref_view_release(&got);
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* Waits (up to 10 s) until the receiver's sleep word reads `how`. */
static int asleep_reads(ipcref_peer *sender, uint32_t how) {
  long end = now_ms() + 10000 * slow;
  while (__atomic_load_n(&sender->tx->ctl->asleep, __ATOMIC_ACQUIRE) != how)
    if (now_ms() > end)
      return 0;
    else
      sleep_us(200);
  return 1;
}

static int dozing_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = chan_peer(ctx, k->their_sock[0], 0, 0); /* no spin */
  ipcref_view v;
  uint32_t seq;
  int i;
  for (i = 0; i < 3; i++) {
    int r = recv_seq(p, &v, -1, &seq);
    ctl_put(k->their_ctl, r == IPCREF_OK ? (int)seq : -1);
    ipcref_view_release(&v);
  }
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* A producer that forked a child (which keeps every fd it had, the
 * channel's doorbell too, but closes the peer's socket), then frees its
 * peer: its receiver hears the socket hang up, and says EPEER, from a
 * blocking receive and from the poll fd's loop (the doorbell alone never
 * ended: a receive waited out its time, and the loop spun on EAGAIN). */
static int forking_producer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = chan_peer(ctx, k->their_sock[0], 0, 0);
  ipcref_view v;
  pid_t g;
  seeded_view(ctx, 72, &v);
  if (send_seq(p, &v, 0) != IPCREF_OK) return 2;
  ipcref_view_release(&v);
  g = fork();
  if (g == 0) { /* keeps the doorbell; lets go of the socket */
    close(k->their_sock[0]);
    alarm(CHILD_ALARM_S);
    (void)ctl_get(k->their_ctl, CTL_MS); /* until the test is done */
    _exit(0);
  }
  ipcref_peer_free(p);
  ctl_put(k->their_ctl, g > 0 ? 1 : -1);
  (void)ctl_get(k->their_ctl, CTL_MS);
  if (g > 0) kill(g, SIGKILL), waitpid(g, NULL, 0);
  ipcref_ctx_free(ctx);
  return 0;
}
/* A producer forked from this process (`fn`), this side's channel peer to
 * it in a context of its own, and the producer's first record received
 * (sequence number 0) and let go. */
static ipcref_peer *kid_producer(kid *k, child_fn fn, ipcref_ctx **ctx) {
  ipcref_peer *p;
  ipcref_view got;
  uint32_t seq = 1;
  kid_start(k, 1, SOCK_SEQPACKET, fn);
  *ctx = new_ctx(0, 0);
  p = chan_peer(*ctx, k->sock[0], 0, 0);
  k->sock[0] = -1;
  CHECK_EQ(recv_seq(p, &got, CTL_MS, &seq), IPCREF_OK);
  CHECK_EQ(seq, 0);
  ipcref_view_release(&got);
  return p;
}

static void producer_gone_doorbell_kept(int by_poll) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_view got;
  ipcref_peer *p = kid_producer(&k, forking_producer, &ctx);
  CHECK_EQ(ctl_get(k.ctl, CTL_MS), 1); /* freed, its child holding on */
  if (by_poll) {
    struct pollfd pfd;
    int i;
    ipcref_result r = IPCREF_EAGAIN;
    pfd.fd = ipcref_peer_poll_fd(p);
    pfd.events = POLLIN;
    for (i = 0; i < 100 && r == IPCREF_EAGAIN; i++) {
      pfd.revents = 0;
      if (poll(&pfd, 1, 5000) != 1) break;
      r = ipcref_recv(p, &got, 0);
    }
    CHECK_EQ(r, IPCREF_EPEER);
    CHECK(i < 100); /* not a loop of wake-ups with nothing to say */
  } else {
    CHECK_EQ(ipcref_recv(p, &got, 20000), IPCREF_EPEER);
  }
  ctl_put(k.ctl, 'x');
  ctl_put(k.ctl, 'x');
  KID_END(&k, "producer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}
static void test_producer_gone_doorbell_kept(void) {
  producer_gone_doorbell_kept(0);
  producer_gone_doorbell_kept(1);
}

/* A receiver with nothing to read dozes on the futex (`asleep` 2), and a
 * record wakes it; idle past IPCREF__DOZE_MS, it sleeps on the doorbell
 * (`asleep` 1), and a record wakes it there too. */
static void test_doze_then_doorbell(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v;
  kid_start(&k, 1, SOCK_SEQPACKET, dozing_consumer);
  ctx = new_ctx(0, 0);
  p = chan_peer(ctx, k.sock[0], 0, 0);
  k.sock[0] = -1;
  seeded_view(ctx, 70, &v);
  CHECK_EQ(send_seq(p, &v, 0), IPCREF_OK); /* the socket: fds */
  CHECK_EQ(ctl_get(k.ctl, CTL_MS), 0);
  CHECK(asleep_reads(p, IPCREF__ASLEEP_FUTEX));
  CHECK_EQ(send_seq(p, &v, 1), IPCREF_OK);
  CHECK_EQ(ctl_get(k.ctl, CTL_MS), 1);
  CHECK(asleep_reads(p, IPCREF__ASLEEP_BELL)); /* the doze is over */
  CHECK_EQ(send_seq(p, &v, 2), IPCREF_OK);
  CHECK_EQ(ctl_get(k.ctl, CTL_MS), 2);
  CHECK_EQ(peer_info_of(p).sent_channel, 2);
  KID_END(&k, "consumer");
  ipcref_view_release(&v);
  ipcref_peer_free(p);
  CHECK_EQ(wait_collected(ctx, 5000), 1);
  ipcref_ctx_free(ctx);
}

static int dying_producer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = chan_peer(ctx, k->their_sock[0], 0, 0);
  ipcref_view v;
  seeded_view(ctx, 71, &v);
  if (send_seq(p, &v, 0) != IPCREF_OK) return 2;
  /* Dies while the receiver dozes: no goodbye, no doorbell. */
  if (!asleep_reads(p, IPCREF__ASLEEP_FUTEX)) _exit(3);
  raise(SIGKILL);
  return 4;
}

/* A sender that dies while its receiver dozes on the futex: the receive
 * waiting for ever ends, EPEER (the doze ends, the doorbell's end of file
 * says the sender is gone). */
static void test_sender_dies_during_doze(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_view got;
  ipcref_peer *p = kid_producer(&k, dying_producer, &ctx);
  CHECK_EQ(ipcref_recv(p, &got, -1), IPCREF_EPEER);
  sigkilled_at(wait_child(k.pid, REAP_MS), k.pid, "producer", __FILE__,
               __LINE__);
  k.pid = -1;
  kid_close(&k);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* The receiver's poll fd wakes for a record in the ring (after a receive
 * said EAGAIN), and sleeps again once it is received; for every spin. */
static void poll_fd_wakes(int spin) {
  ipcref_ctx *prod = new_ctx(0, 0), *cons = new_ctx(0, 0);
  ipcref_peer *pp, *cp;
  ipcref_view v, got;
  struct pollfd pfd;
  int sv[2], i;
  if (xsocketpair(SOCK_SEQPACKET, sv) != 0) return;
  pp = chan_peer(prod, sv[0], 0, IPCREF_SPIN_AUTO);
  cp = chan_peer(cons, sv[1], 0, spin);
  seeded_view(prod, 5, &v);
  CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK); /* the socket: fds */
  CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
  ipcref_view_release(&got);
  pfd.fd = ipcref_peer_poll_fd(cp);
  pfd.events = POLLIN;
  CHECK(pfd.fd >= 0);
  for (i = 0; i < 20; i++) {
    CHECK_EQ(ipcref_recv(cp, &got, 0), IPCREF_EAGAIN);
    pfd.revents = 0;
    CHECK_EQ(poll(&pfd, 1, 0), 0);
    CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK);
    pfd.revents = 0;
    CHECK_EQ(poll(&pfd, 1, 5000), 1);
    CHECK_EQ(ipcref_recv(cp, &got, 0), IPCREF_OK);
    CHECK(seeded_is(&got, 5));
    ipcref_view_release(&got);
  }
  CHECK_EQ(ipcref_recv(cp, &got, 0), IPCREF_EAGAIN);
  pfd.revents = 0;
  CHECK_EQ(poll(&pfd, 1, 0), 0);
  CHECK_EQ(peer_info_of(pp).sent_channel, 20);
  ipcref_view_release(&v);
  ipcref_peer_free(cp);
  ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
  ipcref_ctx_free(prod);
}
static void test_poll_fd_wakes_for_records(void) {
  poll_fd_wakes(0);
  poll_fd_wakes(IPCREF_SPIN_AUTO);
  poll_fd_wakes(200);
}

/* A burst to an idle receiver fills its doorbell (a byte a record: the
 * sender stops ringing); the receiver reads it all and sleeps again,
 * never seen awake by the sender: the next record still wakes it, by its
 * poll fd (`thread` 0) or in a receive waiting for ever (1). */
typedef struct bell_waiter {
  ipcref_peer *p;
  ipcref_result r;
} bell_waiter;
static void *bell_recv(void *arg) {
  bell_waiter *w = (bell_waiter *)arg;
  ipcref_view got;
  w->r = ipcref_recv(w->p, &got, 60000);
  if (w->r == IPCREF_OK) ipcref_view_release(&got);
  return NULL;
}
static void doorbell_refills(int thread) {
  enum { BURST = 3000 }; /* rings: more than a doorbell holds */
  ipcref_ctx *prod = new_ctx(0, 0), *cons = new_ctx(0, 0);
  ipcref_peer *pp, *cp;
  ipcref_view v, got;
  struct pollfd pfd;
  bell_waiter w;
  pthread_t t;
  int sv[2], i, n = 0;
  if (xsocketpair(SOCK_SEQPACKET, sv) != 0) return;
  pp = chan_peer(prod, sv[0], 1u << 20, IPCREF_SPIN_AUTO);
  cp = chan_peer(cons, sv[1], 0, 0);
  seeded_view(prod, 6, &v);
  CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK); /* the socket: fds */
  CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
  ipcref_view_release(&got);
  pfd.fd = ipcref_peer_poll_fd(cp);
  pfd.events = POLLIN;
  CHECK_EQ(ipcref_recv(cp, &got, 0), IPCREF_EAGAIN); /* idle: armed */
  for (i = 0; i < BURST; i++) CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK);
  CHECK_EQ(pp->tx->bell_full, 1);
  while (ipcref_recv(cp, &got, 0) == IPCREF_OK) {
    n += seeded_is(&got, 6);
    ipcref_view_release(&got);
  }
  CHECK_EQ(n, BURST);
  CHECK_EQ(__atomic_load_n(&cp->rx->ctl->asleep, __ATOMIC_ACQUIRE),
           IPCREF__ASLEEP_BELL);
  pfd.revents = 0;
  CHECK_EQ(poll(&pfd, 1, 0), 0);
  if (thread) {
    w.p = cp;
    w.r = IPCREF_EINVAL;
    CHECK_EQ(pthread_create(&t, NULL, bell_recv, &w), 0);
    /* Past its doze, most likely: asleep on the doorbell (if not, the
     * record finds it dozing, and wakes it so). */
    sleep_us(IPCREF__DOZE_MS * 3000);
    CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK);
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_EQ(w.r, IPCREF_OK);
  } else {
    CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK);
    pfd.revents = 0;
    CHECK_EQ(poll(&pfd, 1, 5000), 1);
    CHECK_EQ(ipcref_recv(cp, &got, 0), IPCREF_OK);
    ipcref_view_release(&got);
  }
  CHECK_EQ(pp->tx->bell_full, 0);
  ipcref_view_release(&v);
  ipcref_peer_free(cp);
  ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
  ipcref_ctx_free(prod);
}
static void test_doorbell_refills(void) {
  doorbell_refills(0);
  doorbell_refills(1);
}

/* Options: out of range refused; the ring's size rounded up to a power of
 * two; no ring at all; every spin keeps the receive's timeout. */
static void test_options(void) {
  static const int spins[3] = {0, IPCREF_SPIN_AUTO, 300};
  ipcref_ctx *ctx = new_ctx(0, 0);
  ipcref_peer_options o;
  ipcref_peer *p = NULL;
  local_pair l;
  ipcref_view v, got;
  int sv[2], i;
  long t0, dt;
  if (xsocketpair(SOCK_SEQPACKET, sv) != 0) return;
  memset(&o, 0, sizeof o);
  o.spin_us = -2;
  CHECK_EQ(ipcref_peer_new_with(ctx, sv[0], &o, &p), IPCREF_EINVAL);
  o.spin_us = 0;
  o.ring_bytes = ((size_t)16 << 20) + 1;
  CHECK_EQ(ipcref_peer_new_with(ctx, sv[0], &o, &p), IPCREF_EINVAL);
  CHECK(p == NULL);
  tclose(sv[0]);
  tclose(sv[1]);
  ipcref_ctx_free(ctx);
  /* 5000 bytes: an 8 KiB ring. */
  chan_pair(&l, SOCK_SEQPACKET, 5000, NULL);
  seeded_view(l.prod, 9, &v);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  CHECK(l.pp->tx != NULL && l.pp->tx->bytes == 8192);
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  ipcref_view_release(&got);
  /* Spins: a receive with nothing waits its timeout, no less. */
  for (i = 0; i < 3; i++) {
    o.spin_us = spins[i];
    o.ring_bytes = 0;
    CHECK_EQ(ipcref_peer_set_options(l.cp, &o), IPCREF_OK);
    t0 = now_ms();
    CHECK_EQ(ipcref_recv(l.cp, &got, 20), IPCREF_ETIMEDOUT);
    dt = now_ms() - t0;
    CHECK(dt >= 19 && dt < 2000 * slow);
    CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
    CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
    CHECK(seeded_is(&got, 9));
    ipcref_view_release(&got);
  }
  ipcref_view_release(&v);
  local_pair_close(&l);
  /* No ring: the socket carries all. */
  memset(&o, 0, sizeof o);
  o.ring_bytes = IPCREF_KEEP_NONE;
  ctx = new_ctx(0, 0);
  {
    ipcref_ctx *cons = new_ctx(0, 0);
    ipcref_peer *cp = NULL;
    if (xsocketpair(SOCK_SEQPACKET, sv) != 0) return;
    CHECK_EQ(ipcref_peer_new_with(ctx, sv[0], &o, &p), IPCREF_OK);
    tforget(sv[0]);
    cp = chan_peer(cons, sv[1], 0, 0);
    seeded_view(ctx, 4, &v);
    for (i = 0; i < 10; i++) {
      CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
      CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
      ipcref_view_release(&got);
    }
    CHECK(p->tx == NULL);
    CHECK_EQ(peer_info_of(p).sent_socket, 10);
    CHECK_EQ(peer_info_of(p).channel_out, 0);
    CHECK_EQ(peer_info_of(cp).channel_in, 0);
    ipcref_view_release(&v);
    ipcref_peer_free(cp);
    ipcref_peer_free(p);
    ipcref_ctx_free(cons);
  }
  ipcref_ctx_free(ctx);
}

/* ------------------------------------------------------------ processes */

#define FAN     8
#define FAN_MSG 200

static int fan_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = chan_peer(ctx, k->their_sock[0], 0, IPCREF_SPIN_AUTO);
  ipcref_view v;
  uint32_t seq, i;
  int bad = 0;
  for (i = 0; i < FAN_MSG; i++) {
    if (recv_seq(p, &v, 10000, &seq) != IPCREF_OK || seq != i ||
        !seeded_is(&v, 40))
      bad++;
    ipcref_view_release(&v);
  }
  ctl_put(k->their_ctl, bad ? 'b' : 'd');
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return bad;
}

/* One producer, 8 consumers in their processes: each gets its records,
 * through its own channel, in order. */
static void test_fan_out(void) {
  kid k[FAN];
  ipcref_ctx *ctx;
  ipcref_peer *p[FAN];
  ipcref_view v;
  uint32_t i;
  int c;
  for (c = 0; c < FAN; c++) kid_start(&k[c], 1, SOCK_SEQPACKET, fan_consumer);
  ctx = new_ctx(0, 0);
  for (c = 0; c < FAN; c++) p[c] = chan_peer(ctx, k[c].sock[0], 0, 0);
  for (c = 0; c < FAN; c++) k[c].sock[0] = -1;
  seeded_view(ctx, 40, &v);
  for (i = 0; i < FAN_MSG; i++)
    for (c = 0; c < FAN; c++) CHECK_EQ(send_seq(p[c], &v, i), IPCREF_OK);
  for (c = 0; c < FAN; c++) {
    CTL_EXPECT(k[c].ctl, 'd');
    CHECK_EQ(peer_info_of(p[c]).sent_channel, FAN_MSG - 1);
    KID_END(&k[c], "consumer");
  }
  ipcref_view_release(&v);
  for (c = 0; c < FAN; c++) ipcref_peer_free(p[c]);
  CHECK_EQ(wait_collected(ctx, 5000), 1);
  ipcref_ctx_free(ctx);
}

static int idle_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = chan_peer(ctx, k->their_sock[0], 0, IPCREF_SPIN_AUTO);
  ipcref_view v;
  int r = ipcref_recv(p, &v, 10000);
  ctl_put(k->their_ctl, r == IPCREF_OK ? 'r' : 'e');
  (void)ctl_get(k->their_ctl, 60000); /* killed here, 50 records unread */
  return 0;
}

/* A consumer killed with records unread in its ring (and one view held):
 * the producer gets every lease back once it notices. */
static void test_consumer_killed_with_records_unread(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v;
  ipcref_stats s;
  int i;
  kid_start(&k, 1, SOCK_SEQPACKET, idle_consumer);
  ctx = new_ctx(0, 0);
  p = kid_peer(&k, 0, ctx);
  seeded_view(ctx, 50, &v);
  CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  CTL_EXPECT(k.ctl, 'r');
  for (i = 0; i < 50; i++) CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  CHECK_EQ(peer_info_of(p).sent_channel, 50);
  s = stats_of(ctx);
  CHECK_EQ(s.live_slots, 51);
  ipcref_view_release(&v); /* in the limbo now, held by the leases */
  KID_KILL(&k, "consumer");
  CHECK_EQ(wait_collected(ctx, 10000), 1);
  s = stats_of(ctx);
  CHECK_EQ(s.live_slots, 0);
  CHECK_EQ(s.limbo_blocks, 0);
  CHECK_EQ(s.reclaimed, 51);
  kid_close(&k);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* -- under seccomp strict mode: only read, write, _exit, sigreturn. */
#define SEC_N 64

static int seccomp_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = chan_peer(ctx, k->their_sock[0], 0, IPCREF_SPIN_AUTO);
  ipcref_view v[SEC_N];
  char go = 0;
  int i, got = 0, res;
  for (i = 0; i < SEC_N; i++) /* warm: mappings, caches, malloc's bins */
    if (ipcref_recv(p, &v[i], 10000) != IPCREF_OK) return 1;
  for (i = 0; i < SEC_N; i++) ipcref_view_release(&v[i]);
  ctl_put(k->their_ctl, 'w');
  fflush(stdout);
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) return 2;
  /* From here a system call other than read or write kills us. */
  if (read(k->their_ctl, &go, 1) != 1 || go != 'g') syscall(SYS_exit, 3);
  for (i = 0; i < SEC_N; i++)
    if (ipcref_recv(p, &v[i], 0) == IPCREF_OK && seeded_is(&v[i], 60)) got++;
  for (i = 0; i < SEC_N; i++) ipcref_view_release(&v[i]);
  res = got == SEC_N ? 'd' : 'b';
  if (write(k->their_ctl, &res, sizeof res) != (ssize_t)sizeof res)
    syscall(SYS_exit, 4);
  syscall(SYS_exit, 0); /* _exit is exit_group: not allowed */
  return 5;
}

/* The consumer receives SEC_N records already in its ring under seccomp
 * strict mode: the receive path makes no system call while records are
 * there (the process would be killed). Plain builds only: sanitizers and
 * valgrind make system calls of their own. */
static void test_seccomp_consumer(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v;
  int i;
  char go = 'g';
  if (UNDER_ASAN || under_valgrind) {
    printf("    (plain builds only: a sanitizer's or valgrind's own system "
           "calls would kill it)\n");
    return;
  }
  kid_start(&k, 1, SOCK_SEQPACKET, seccomp_consumer);
  ctx = new_ctx(0, 0);
  p = kid_peer(&k, 0, ctx);
  seeded_view(ctx, 60, &v);
  for (i = 0; i < SEC_N; i++) CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  CTL_EXPECT(k.ctl, 'w');
  for (i = 0; i < SEC_N; i++) CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
  CHECK_EQ(peer_info_of(p).sent_channel, 2 * SEC_N - 1);
  CHECK_EQ(ctl_send(k.ctl, &go, 1), 0);
  CTL_EXPECT(k.ctl, 'd');
  KID_END(&k, "consumer under seccomp");
  ipcref_view_release(&v);
  ipcref_peer_free(p);
  CHECK_EQ(wait_collected(ctx, 5000), 1);
  ipcref_ctx_free(ctx);
}

int main(void) {
  fixture_start();
  RUN(test_records_take_the_ring_seqpacket);
  RUN(test_records_take_the_ring_stream);
  RUN(test_order_of_both_paths_seqpacket);
  RUN(test_order_of_both_paths_stream);
  RUN(test_records_wrap);
  RUN(test_records_on_lines);
  RUN(test_patches);
  RUN(test_hostile_sender_indices_and_fields);
  RUN(test_hostile_patch_first);
  RUN(test_hostile_patch_replay);
  RUN(test_hostile_sender_records);
  RUN(test_hostile_sender_announces_nothing);
  RUN(test_hostile_sender_doorbell);
  RUN(test_hostile_setups);
  RUN(test_hostile_receiver_head);
  RUN(test_hostile_receiver_back_and_asleep);
  RUN(test_hostile_receiver_dozes);
  RUN(test_socket_count_taken_back);
  RUN(test_sender_wakes_a_dozer);
  RUN(test_doze_then_doorbell);
  RUN(test_sender_dies_during_doze);
  RUN(test_producer_gone_doorbell_kept);
  RUN(test_poll_fd_wakes_for_records);
  RUN(test_doorbell_refills);
  RUN(test_options);
  RUN(test_fan_out);
  RUN(test_consumer_killed_with_records_unread);
  RUN(test_seccomp_consumer);
  return harness_finish();
}
