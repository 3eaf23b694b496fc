/* Metadata with each view: a user payload of up to IPCREF_META_MAX bytes
 * (a frame number, a name, a shape as the user sees it) that travels in
 * the message with its views and is received beside them.
 *
 * Every length from 0 to the limit round-trips, through ipcref_send_meta /
 * ipcref_recv_meta on both kinds of socket and through ipcref_export_meta
 * / ipcref_import; one byte over, or NULL bytes with a length, is refused
 * by name with nothing leased; a batch's views each come with their
 * message's metadata; a forked consumer reads what the producer wrote. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "share_fixture.h"

#define CTL_MS 30000

/* Metadata of length `n` for message `seed`: no two lengths or seeds
 * alike, so a stale or shifted payload is seen. */
static void meta_fill(unsigned char *b, size_t n, unsigned seed) {
  size_t i;
  for (i = 0; i < n; i++) b[i] = (unsigned char)(seed * 131u + i * 7u + n);
}

/* The peer's last received metadata equals meta_fill(n, seed). */
static int meta_is(ipcref_peer *p, size_t n, unsigned seed) {
  unsigned char want[IPCREF_META_MAX];
  size_t len = 99;
  const void *got = ipcref_recv_meta(p, &len);
  meta_fill(want, n, seed);
  if (len != n) return 0;
  if (n == 0) return got == NULL;
  return got != NULL && memcmp(got, want, n) == 0;
}

/* A one-byte view of a new shared block. */
static void small_view(ipcref_ctx *ctx, ipcref_view *v) {
  const int64_t one = 1;
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &one, v), IPCREF_OK);
}

/* Leases the producer's peer holds now. */
static size_t leases_of(ipcref_peer *p) {
  ipcref_peer_info in;
  CHECK_EQ(ipcref_peer_stats(p, &in), IPCREF_OK);
  return in.leases;
}

/* Every length from 0 to IPCREF_META_MAX over a socketpair of `type`. */
static void every_length(int type) {
  ipcref_ctx *prod = new_ctx(0, 0), *cons = new_ctx(0, 0);
  ipcref_peer *pp, *cp;
  unsigned char meta[IPCREF_META_MAX];
  ipcref_view v, got;
  size_t n, bad = 0;
  int sv[2];
  if (!prod || !cons || xsocketpair(type, sv) != 0) return;
  pp = make_peer(prod, sv[0]);
  cp = make_peer(cons, sv[1]);
  if (!pp || !cp) return;
  small_view(prod, &v);
  for (n = 0; n <= IPCREF_META_MAX; n++) {
    meta_fill(meta, n, (unsigned)type);
    CHECK_EQ(ipcref_send_meta(pp, &v, 1, n ? meta : NULL, n), IPCREF_OK);
    CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
    bad += !meta_is(cp, n, (unsigned)type);
    ipcref_view_release(&got);
  }
  printf("    %zu of %d lengths came back wrong\n", bad, IPCREF_META_MAX + 1);
  CHECK_EQ(bad, 0);
  /* A message without metadata after one with: none. */
  CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
  CHECK(meta_is(cp, 0, 0));
  ipcref_view_release(&got);
  ipcref_view_release(&v);
  ipcref_peer_free(cp);
  ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
  ipcref_ctx_free(prod);
}

static void test_every_length_seqpacket(void) {
  every_length(SOCK_SEQPACKET);
}

static void test_every_length_stream(void) {
  every_length(SOCK_STREAM);
}

/* One byte over the limit, or NULL bytes with a length: EINVAL, named,
 * and nothing leased or sent; NULL with length 0 is no metadata. */
static void test_meta_refused(void) {
  local_pair l;
  unsigned char meta[IPCREF_META_MAX + 1];
  ipcref_view v, got;
  ipcref_msg *msg = (ipcref_msg *)malloc(sizeof *msg);
  local_pair_open(&l, NULL, NULL);
  if (!l.pp || !l.cp || !msg) return;
  ipcref_set_error_hook(&error_hook);
  errors_reset();
  small_view(l.prod, &v);
  memset(meta, 1, sizeof meta);
  CHECK_EQ(ipcref_send_meta(l.pp, &v, 1, meta, IPCREF_META_MAX + 1),
           IPCREF_EINVAL);
  CHECK(strstr(err_last, "ipcref_send_meta: meta_len over") != NULL);
  EXPECT_ERRORS(1);
  CHECK_EQ(ipcref_send_meta(l.pp, &v, 1, NULL, 5), IPCREF_EINVAL);
  CHECK(strstr(err_last, "ipcref_send_meta: meta is NULL") != NULL);
  EXPECT_ERRORS(1);
  CHECK_EQ(ipcref_export_meta(l.pp, &v, meta, IPCREF_META_MAX + 1, msg),
           IPCREF_EINVAL);
  CHECK(strstr(err_last, "ipcref_export_meta: meta_len over") != NULL);
  EXPECT_ERRORS(1);
  CHECK_EQ(ipcref_export_meta(l.pp, &v, NULL, 1, msg), IPCREF_EINVAL);
  EXPECT_ERRORS(1);
  CHECK_EQ(leases_of(l.pp), 0);
  CHECK_EQ(ipcref_recv(l.cp, &got, 0), IPCREF_EAGAIN); /* nothing came */
  CHECK_EQ(ipcref_send_meta(l.pp, &v, 1, NULL, 0), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  CHECK(meta_is(l.cp, 0, 0));
  ipcref_view_release(&got);
  /* The other wrong arguments. */
  CHECK_EQ(ipcref_send_meta(NULL, &v, 1, meta, 1), IPCREF_EINVAL);
  CHECK_EQ(ipcref_send_meta(l.pp, NULL, 1, meta, 1), IPCREF_EINVAL);
  CHECK_EQ(ipcref_send_meta(l.pp, &v, 0, meta, 1), IPCREF_EINVAL);
  CHECK_EQ(ipcref_export_meta(NULL, &v, meta, 1, msg), IPCREF_EINVAL);
  CHECK_EQ(ipcref_export_meta(l.pp, &v, meta, 1, NULL), IPCREF_EINVAL);
  CHECK(ipcref_recv_meta(NULL, NULL) == NULL);
  CHECK_EQ(ipcref_recv_pending(NULL), 0);
  {
    size_t len = 7;
    CHECK(ipcref_recv_meta(NULL, &len) == NULL && len == 0);
    CHECK(ipcref_msg_meta(NULL, &len) == NULL && len == 0);
    CHECK(ipcref_recv_meta(l.pp, &len) == NULL && len == 0); /* none yet */
  }
  CHECK_EQ(leases_of(l.pp), 0);
  errors_reset();
  ipcref_set_error_hook(NULL);
  ipcref_view_release(&v);
  free(msg);
  local_pair_close(&l);
}

/* Every length through the user's own transport: ipcref_export_meta, then
 * ipcref_msg_meta on both sides of ipcref_import; a message freed unused
 * gives its lease back as ever. */
static void test_export_every_length(void) {
  local_pair l;
  unsigned char meta[IPCREF_META_MAX], want[IPCREF_META_MAX];
  ipcref_msg *msg = (ipcref_msg *)malloc(sizeof *msg);
  ipcref_view v, got;
  size_t n, len, bad = 0;
  const void *m;
  local_pair_open(&l, NULL, NULL);
  if (!l.pp || !l.cp || !msg) return;
  small_view(l.prod, &v);
  for (n = 0; n <= IPCREF_META_MAX; n++) {
    meta_fill(meta, n, 3);
    CHECK_EQ(ipcref_export_meta(l.pp, &v, meta, n, msg), IPCREF_OK);
    m = ipcref_msg_meta(msg, &len);
    bad += len != n || (n && memcmp(m, meta, n) != 0) || (!n && m);
    memset(meta, 0, n); /* the message holds its own copy */
    CHECK_EQ(ipcref_import(l.cp, msg, &got), IPCREF_OK);
    m = ipcref_msg_meta(msg, &len);
    meta_fill(want, n, 3);
    bad += len != n || (n && memcmp(m, want, n) != 0);
    ipcref_view_release(&got);
  }
  CHECK_EQ(bad, 0);
  meta_fill(meta, 40, 4);
  CHECK_EQ(ipcref_export_meta(l.pp, &v, meta, 40, msg), IPCREF_OK);
  CHECK_EQ(leases_of(l.pp), 1);
  ipcref_msg_free(msg);
  CHECK_EQ(leases_of(l.pp), 0);
  ipcref_view_release(&v);
  free(msg);
  local_pair_close(&l);
}

/* A batch with metadata: each of its views is received beside it, and
 * the peer's stats say how many of the batch wait still. */
static void test_batch_meta(void) {
  local_pair l;
  ipcref_view v[3], got[3];
  ipcref_peer_info in;
  unsigned char meta[64];
  int i;
  local_pair_open(&l, NULL, NULL);
  if (!l.pp || !l.cp) return;
  for (i = 0; i < 3; i++) small_view(l.prod, &v[i]);
  meta_fill(meta, sizeof meta, 9);
  CHECK_EQ(ipcref_send_meta(l.pp, v, 3, meta, sizeof meta), IPCREF_OK);
  CHECK_EQ(ipcref_send(l.pp, &v[0]), IPCREF_OK); /* a message without */
  for (i = 0; i < 3; i++) {
    CHECK_EQ(ipcref_recv(l.cp, &got[i], 5000), IPCREF_OK);
    CHECK(got[i].buf != NULL);
    CHECK(meta_is(l.cp, sizeof meta, 9));
    CHECK_EQ(ipcref_peer_stats(l.cp, &in), IPCREF_OK);
    CHECK_EQ(in.pending, (size_t)(2 - i));
    CHECK_EQ(ipcref_recv_pending(l.cp), 2 - i);
  }
  for (i = 0; i < 3; i++) ipcref_view_release(&got[i]);
  CHECK_EQ(ipcref_recv(l.cp, &got[0], 5000), IPCREF_OK);
  CHECK(meta_is(l.cp, 0, 0));
  ipcref_view_release(&got[0]);
  for (i = 0; i < 3; i++) ipcref_view_release(&v[i]);
  local_pair_close(&l);
}

/* The consumer of test_meta_across: receives frames and checks that each
 * one's metadata names it (its number, and the byte the producer wrote). */
static int frame_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx *ctx = make_ctx(NULL);
  ipcref_peer *p = make_peer(ctx, k->their_sock[0]);
  int i, ok = 0;
  for (i = 0; p && i < 20; i++) {
    ipcref_view v;
    char want[64];
    size_t len;
    const char *m;
    if (ipcref_recv(p, &v, 10000) != IPCREF_OK) break;
    m = (const char *)ipcref_recv_meta(p, &len);
    snprintf(want, sizeof want, "frame %d", i);
    ok += m && len == strlen(want) + 1 && strcmp(m, want) == 0 &&
          *(const unsigned char *)ipcref_view_data(&v) == (unsigned char)i;
    ipcref_view_release(&v);
  }
  ctl_put(k->their_ctl, ok);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* Frames with their names, to another process. */
static void test_meta_across(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  int i;
  kid_start(&k, 1, SOCK_SEQPACKET, frame_consumer);
  ctx = make_ctx(NULL);
  p = kid_peer(&k, 0, ctx);
  for (i = 0; p && i < 20; i++) {
    ipcref_view v;
    char name[64];
    small_view(ctx, &v);
    *(unsigned char *)ipcref_view_data_mut(&v) = (unsigned char)i;
    snprintf(name, sizeof name, "frame %d", i);
    CHECK_EQ(ipcref_send_meta(p, &v, 1, name, strlen(name) + 1), IPCREF_OK);
    ipcref_view_release(&v);
  }
  CTL_EXPECT(k.ctl, 20);
  KID_END(&k, "consumer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

int main(void) {
  fixture_start();
  RUN(test_every_length_seqpacket);
  RUN(test_every_length_stream);
  RUN(test_meta_refused);
  RUN(test_export_every_length);
  RUN(test_batch_meta);
  RUN(test_meta_across);
  return harness_finish();
}
