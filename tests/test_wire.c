/* The wire format's codec (src/share_wire.h), in one process: no peer.
 *
 *   a. the encoder writes the bytes the format's comment documents, field
 *      by field (built here independently, byte by byte), so that the
 *      format cannot change without its version;
 *   b. whatever it writes decodes to the same fields: views of 0 to 8
 *      dimensions, with and without an event handle, with and without
 *      metadata, several to a message;
 *   c. a message cut short anywhere, or one byte too long, is refused, and
 *      a cursor moved past its end reads nothing;
 *   d. a dtype, ndim, flags, magic, version or count out of range is
 *      refused. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "harness.h"

/* A view record for case `seed`: every field differs from every other and
 * from one seed to the next, so a field read from the wrong place shows. */
static void rec_fill(ipcref__view_rec *r, int nd, int ev, uint64_t seed) {
  int d;
  memset(r, 0, sizeof *r);
  r->origin_pid = (uint32_t)(0x11000000u + seed);
  r->origin_nonce = 0x2200000000000000ull + seed;
  r->seg_id = 0x3300000000000000ull + seed;
  r->seg_size = 0x4400000000000000ull + seed;
  r->block_offset = 0x5500000000000000ull + seed;
  r->block_size = 0x6600000000000000ull + seed;
  r->ledger_id = 0x7700000000000000ull + seed;
  r->slot = (uint32_t)(0x88000000u + seed);
  r->gen = (uint32_t)(0x99000000u + seed);
  r->view.dtype = (ipcref_dtype)(seed % IPCREF_DTYPE_COUNT);
  r->view.ndim = nd;
  r->writable = (int)(seed & 1);
  r->view.byte_offset = -(int64_t)(1000 + seed);
  for (d = 0; d < nd; d++) {
    r->view.shape[d] = (int64_t)(100 * seed + (uint64_t)d + 1);
    r->view.strides[d] = -(int64_t)(1000 * seed + (uint64_t)d + 7);
  }
  r->has_event = ev;
  if (ev)
    for (d = 0; d < IPCREF_HANDLE_BYTES; d++)
      r->event[d] = (unsigned char)(seed * 31u + (unsigned)d);
}

/* Encodes a message of `n` views and `meta_len` bytes of metadata with the
 * library's encoder: its length. */
static size_t encode(unsigned char *buf, size_t cap, const ipcref__view_rec *r,
                     int n, const unsigned char *meta, size_t meta_len) {
  ipcref__wire w;
  ipcref__msg_head h;
  int i;
  memset(&h, 0, sizeof h);
  h.nviews = n;
  h.sender_pid = 4242;
  h.sender_nonce = 0xabcdef0123456789ull;
  h.meta_len = meta_len;
  ipcref__wire_init(&w, buf, cap);
  ipcref__put_msg_head(&w, &h);
  for (i = 0; i < n; i++) ipcref__put_view(&w, &r[i]);
  if (meta_len) ipcref__put_bytes(&w, meta, meta_len);
  return w.bad ? 0 : w.pos;
}

/* The two records hold the same fields, as a decoded record holds them:
 * the dimensions past ndim 0, the event 0 without its flag. */
static int rec_same(const ipcref__view_rec *a, const ipcref__view_rec *b) {
  int d;
  if (a->origin_pid != b->origin_pid || a->origin_nonce != b->origin_nonce ||
      a->seg_id != b->seg_id || a->seg_size != b->seg_size ||
      a->block_offset != b->block_offset || a->block_size != b->block_size ||
      a->ledger_id != b->ledger_id || a->slot != b->slot || a->gen != b->gen ||
      a->view.dtype != b->view.dtype || a->view.ndim != b->view.ndim ||
      a->writable != b->writable || a->has_event != b->has_event ||
      a->view.byte_offset != b->view.byte_offset || b->view.buf != NULL)
    return 0;
  for (d = 0; d < IPCREF_MAX_DIMS; d++)
    if (b->view.shape[d] != (d < a->view.ndim ? a->view.shape[d] : 0) ||
        b->view.strides[d] != (d < a->view.ndim ? a->view.strides[d] : 0))
      return 0;
  for (d = 0; d < IPCREF_HANDLE_BYTES; d++)
    if (b->event[d] != (a->has_event ? a->event[d] : 0)) return 0;
  return 1;
}

/* An independent little-endian writer, for the expected bytes. */
static size_t put_le(unsigned char *b, size_t at, uint64_t v, int bytes) {
  int i;
  for (i = 0; i < bytes; i++) b[at + (size_t)i] = (unsigned char)(v >> (8 * i));
  return at + (size_t)bytes;
}

/* a. The documented layout, byte by byte: the header, one view of two
 * dimensions with its event, three bytes of metadata. */
static void test_known_bytes(void) {
  unsigned char got[512], want[512], meta[3] = {0xa1, 0xa2, 0xa3};
  ipcref__view_rec r;
  size_t n, at = 0;
  int d;
  rec_fill(&r, 2, 1, 5);
  n = encode(got, sizeof got, &r, 1, meta, sizeof meta);
  at = put_le(want, at, 0x4d435049u, 4); /* "IPCM" */
  at = put_le(want, at, 2, 2);           /* version */
  at = put_le(want, at, 1, 2);           /* nviews */
  at = put_le(want, at, 0, 2);           /* nrecs */
  at = put_le(want, at, 0, 2);           /* nretired */
  at = put_le(want, at, 4242, 4);
  at = put_le(want, at, 0xabcdef0123456789ull, 8);
  at = put_le(want, at, sizeof meta, 2);
  at = put_le(want, at, r.origin_pid, 4);
  at = put_le(want, at, r.origin_nonce, 8);
  at = put_le(want, at, r.seg_id, 8);
  at = put_le(want, at, r.seg_size, 8);
  at = put_le(want, at, r.block_offset, 8);
  at = put_le(want, at, r.block_size, 8);
  at = put_le(want, at, r.ledger_id, 8);
  at = put_le(want, at, r.slot, 4);
  at = put_le(want, at, r.gen, 4);
  at = put_le(want, at, (uint64_t)r.view.dtype, 1);
  at = put_le(want, at, 2, 1); /* ndim */
  at = put_le(want, at, (uint64_t)r.writable, 1);
  at = put_le(want, at, 1, 1); /* flags: an event */
  at = put_le(want, at, (uint64_t)r.view.byte_offset, 8);
  for (d = 0; d < 2; d++) at = put_le(want, at, (uint64_t)r.view.shape[d], 8);
  for (d = 0; d < 2; d++) at = put_le(want, at, (uint64_t)r.view.strides[d], 8);
  memcpy(want + at, r.event, IPCREF_HANDLE_BYTES);
  at += IPCREF_HANDLE_BYTES;
  memcpy(want + at, meta, sizeof meta);
  at += sizeof meta;
  CHECK_EQ(n, at);
  CHECK(n == at && memcmp(got, want, at) == 0);
}

/* b. Every shape of record round-trips, three to a message. */
static void test_round_trip(void) {
  static ipcref__msg_in m;
  unsigned char buf[IPCREF_MSG_MAX_BYTES], meta[7] = {1, 2, 3, 4, 5, 6, 7};
  ipcref__view_rec r[3];
  int nd, ev, k, i, bad = 0;
  size_t meta_len;
  for (nd = 0; nd <= IPCREF_MAX_DIMS; nd++)
    for (ev = 0; ev <= 1; ev++)
      for (k = 0; k < 2; k++) {
        size_t n;
        meta_len = k ? sizeof meta : 0;
        for (i = 0; i < 3; i++)
          rec_fill(&r[i], (nd + i) % (IPCREF_MAX_DIMS + 1), (ev + i) & 1,
                   (uint64_t)(100 * nd + 10 * ev + i));
        n = encode(buf, sizeof buf, r, 3, meta, meta_len);
        if (!n || !ipcref__msg_decode(buf, n, &m)) {
          bad++;
          printf("    nd %d ev %d meta %zu: not decoded (%s)\n", nd, ev,
                 meta_len, n ? m.why : "not encoded");
          continue;
        }
        if (m.head.nviews != 3 || m.head.nrecs != 0 || m.head.nretired != 0 ||
            m.head.sender_pid != 4242 || m.head.meta_len != meta_len ||
            m.head.sender_nonce != 0xabcdef0123456789ull)
          bad++;
        for (i = 0; i < 3; i++)
          if (!rec_same(&r[i], &m.views[i])) {
            bad++;
            printf("    nd %d ev %d view %d: fields differ\n", nd, ev, i);
          }
      }
  CHECK_EQ(bad, 0);
}

/* c. Cut short at every length, or one byte too long: refused. */
static void test_cut_short(void) {
  static ipcref__msg_in m;
  unsigned char buf[IPCREF_MSG_MAX_BYTES], meta[5] = {9, 8, 7, 6, 5};
  ipcref__view_rec r[2];
  size_t n, cut;
  int took = 0;
  rec_fill(&r[0], 3, 1, 1);
  rec_fill(&r[1], IPCREF_MAX_DIMS, 0, 2);
  n = encode(buf, sizeof buf, r, 2, meta, sizeof meta);
  CHECK(n > 0 && ipcref__msg_decode(buf, n, &m));
  for (cut = 0; cut < n; cut++) took += ipcref__msg_decode(buf, cut, &m);
  CHECK_EQ(took, 0);
  buf[n] = 0;
  CHECK(!ipcref__msg_decode(buf, n + 1, &m));
  { /* a cursor moved past its end (as a count of retired ids can move it)
       reads nothing more */
    ipcref__wire w;
    ipcref__msg_head h;
    ipcref__view_rec v;
    ipcref__wire_init(&w, buf, 40);
    w.pos = 48;
    CHECK(!ipcref__get_view(&w, &v));
    CHECK(w.bad);
    ipcref__wire_init(&w, buf, 40);
    w.pos = 41;
    CHECK(!ipcref__get_msg_head(&w, &h));
  }
}

/* d. One field out of range at a time, at its documented offset: refused
 * (the header is 26 bytes; a view's dtype, ndim and flags are its bytes
 * 60, 61 and 63). */
static void test_out_of_range(void) {
  static ipcref__msg_in m;
  static const struct {
    size_t at;
    uint64_t value;
    int bytes;
  } bad[] = {
      {0, 0x4d435048u, 4},               /* magic */
      {4, 3, 2},                         /* version */
      {6, 0, 2},                         /* nviews 0 */
      {6, IPCREF_MSG_MAX_VIEWS + 1, 2},  /* nviews */
      {8, IPCREF_MSG_MAX_FDS + 1, 2},    /* nrecs */
      {10, 65, 2},                       /* nretired */
      {24, IPCREF_META_MAX + 1, 2},      /* meta_len */
      {26 + 60, IPCREF_DTYPE_COUNT, 1},  /* dtype */
      {26 + 61, IPCREF_MAX_DIMS + 1, 1}, /* ndim */
      {26 + 63, 2, 1},                   /* flags */
  };
  unsigned char buf[IPCREF_MSG_MAX_BYTES], copy[IPCREF_MSG_MAX_BYTES];
  ipcref__view_rec r;
  size_t n, i;
  rec_fill(&r, 1, 0, 3);
  n = encode(buf, sizeof buf, &r, 1, NULL, 0);
  CHECK(n > 0 && ipcref__msg_decode(buf, n, &m));
  for (i = 0; i < sizeof bad / sizeof *bad; i++) {
    memcpy(copy, buf, n);
    (void)put_le(copy, bad[i].at, bad[i].value, bad[i].bytes);
    if (ipcref__msg_decode(copy, n, &m))
      printf("    byte %zu = %llu: decoded\n", bad[i].at,
             (unsigned long long)bad[i].value);
    CHECK(!ipcref__msg_decode(copy, n, &m));
  }
}

int main(void) {
  RUN(test_known_bytes);
  RUN(test_round_trip);
  RUN(test_cut_short);
  RUN(test_out_of_range);
  return harness_finish();
}
