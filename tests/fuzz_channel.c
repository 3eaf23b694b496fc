/* A libFuzzer target for the channel's receiving side: the ring's contents
 * and indices as a malicious producer would write them
 * (src/share_channel.h).
 *
 * Per input: a producer and a consumer context in this process, a peer
 * each on a socketpair, the channel up (one view crossed on the socket,
 * one record read off the ring and held, so a replay has a live lease to
 * name). Then the producer, here the fuzzer, writes:
 *
 *   byte 0   flags: bit 0 a genuine record of the held view goes into the
 *            ring first (its lease live; what follows may patch it), a
 *            whole message, or with bit 3 a patch record of the one
 *            before (see src/share_channel.h); bit 1 the tail is set
 *            from bytes 1-2 (else it covers the bytes written); bit 2
 *            the header's socket count moves by byte 3 (int8)
 *   1-2      u16: the tail, as bytes past the consumer's read index
 *   3        int8: the socket count's move
 *   the rest patch list {u16 offset from the read index, u8 length (mod
 *            33), bytes} over the ring (it wraps), when bit 0 is set;
 *            else the bytes themselves, written at the read index
 *
 * and the consumer receives up to 8 times with no wait. After every input:
 *   - each receive says OK, EPROTO, EAGAIN or ENOMEM, never waits, and a
 *     view it gives is valid and every byte of it is read;
 *   - once the producer's leases are reclaimed (as if the consumer died),
 *     nothing is live, no fd is left open, no ledger is left.
 * Any violation aborts. Built and run by tests/fuzz.sh (TARGET channel).
 *
 * Built without -fsanitize=fuzzer and with -DFUZZ_CHANNEL_SEEDS, main()
 * writes the seed corpus to the directory given (tests/corpus/channel/). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#define RING 4096

#define FUZZ_NAME      "fuzz_channel"
#define FUZZ_TRACE_ENV "FUZZ_CHANNEL_TRACE"
#include "fuzz_common.h"

static ipcref_peer *peer(ipcref_ctx *ctx, int fd) {
  ipcref_peer_options o;
  ipcref_peer *p = NULL;
  memset(&o, 0, sizeof o);
  o.ring_bytes = RING;
  o.spin_us = 0;
  if (ipcref_peer_new_with(ctx, fd, &o, &p) != IPCREF_OK) fail("peer");
  return p;
}

/* Reads every element a received view reaches (the import checked its
 * geometry against its block: a bad one is ASan's to find here). */
static void check_view(const ipcref_view *v) {
  ipcref_view_iter it;
  const unsigned char *e;
  size_t item = ipcref_dtype_size(v->dtype), i;
  volatile unsigned sum = 0;
  if (!v->buf || ipcref__view_check_new(v) != IPCREF_OK)
    fail("an invalid view received");
  if (ipcref_view_numel(v) > 65536) return;
  if (ipcref_view_iter_init(v, &it) != IPCREF_OK) fail("iter_init");
  while ((e = (const unsigned char *)ipcref_view_iter_next(&it)) != NULL)
    for (i = 0; i < item; i++) sum += e[i];
  (void)sum;
}

static void run_one(const uint8_t *data, size_t size) {
  static int base_fds = -1;
  ipcref_ctx *prod = NULL, *cons = NULL;
  ipcref_peer *pp, *cp;
  ipcref_view v, held, got;
  ipcref_stats st;
  struct ipcref__chan_tx *t;
  unsigned char *ring;
  uint64_t head, tail;
  const int64_t n = 100;
  unsigned flags = size ? data[0] : 0;
  size_t at = 4, i;
  int sv[2], k;
  if (base_fds < 0) base_fds = count_fds();
  if (ipcref_ctx_new(NULL, &prod) != IPCREF_OK ||
      ipcref_ctx_new(NULL, &cons) != IPCREF_OK ||
      socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    fail("setup");
  pp = peer(prod, sv[0]);
  cp = peer(cons, sv[1]);
  if (ipcref_view_new_shared(prod, IPCREF_I32, 1, &n, &v) != IPCREF_OK ||
      ipcref_send(pp, &v) != IPCREF_OK || ipcref_send(pp, &v) != IPCREF_OK ||
      ipcref_recv(cp, &got, 1000) != IPCREF_OK ||
      ipcref_recv(cp, &held, 1000) != IPCREF_OK)
    fail("the channel did not come up");
  ipcref_view_release(&got);
  if (!(flags & 8)) pp->tx->last_len = 0; /* whole, not a patch */
  if (flags & 1 && ipcref_send(pp, &v) != IPCREF_OK) fail("genuine record");
  t = pp->tx;
  ring = t->map + IPCREF__CHAN_HDR;
  head = cp->rx->head;
  tail = head;
  if (flags & 1) { /* patches over what is there */
    tail = t->tail;
    while (at + 3 <= size) {
      uint64_t off = (uint64_t)data[at] | (uint64_t)data[at + 1] << 8;
      size_t len = data[at + 2] % 33u;
      at += 3;
      for (i = 0; i < len && at < size; i++, at++)
        ring[(head + off + i) & (RING - 1)] = data[at];
    }
  } else if (size > at) {
    size_t len = size - at < RING ? size - at : RING;
    ipcref__chan_copy(ring, RING, head, (unsigned char *)(uintptr_t)data + at,
                      len, 1);
    tail = head + len;
  }
  if (flags & 2 && size >= 3)
    tail = head + ((uint64_t)data[1] | (uint64_t)data[2] << 8);
  if (flags & 4 && size >= 4)
    __atomic_store_n(&((ipcref__chan_hdr *)(void *)t->map)->sockets,
                     t->sockets + (uint64_t)(int64_t)(int8_t)data[3],
                     __ATOMIC_RELEASE);
  __atomic_store_n(&((ipcref__chan_hdr *)(void *)t->map)->tail, tail,
                   __ATOMIC_RELEASE);
  tr("flags %u: tail %llu bytes past the read index\n", flags,
     (unsigned long long)(tail - head));
  for (k = 0; k < 8; k++) {
    ipcref_result r;
    struct timespec a, b;
    memset(&got, 0, sizeof got);
    clock_gettime(CLOCK_MONOTONIC, &a);
    r = ipcref_recv(cp, &got, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    tr("receive %d: %s\n", k, ipcref_strerror(r));
    if (b.tv_sec - a.tv_sec > 2) fail("a receive with no wait waited");
    if (r == IPCREF_OK) {
      check_view(&got);
      ipcref_view_release(&got);
    } else if (r != IPCREF_EPROTO && r != IPCREF_EAGAIN && r != IPCREF_ENOMEM) {
      fail("an undocumented result");
    } else if (got.buf) {
      fail("a failed receive gave a buffer");
    }
  }
  ipcref_view_release(&held);
  ipcref_view_release(&v);
  ipcref_peer_free(cp);
  ipcref_ctx_free(cons);
  reclaim_all(prod);
  if (ipcref_ctx_stats(prod, &st) != IPCREF_OK || st.live_slots ||
      st.limbo_blocks)
    fail("leases left");
  ipcref_peer_free(pp);
  ipcref_ctx_free(prod);
  if (count_fds() != base_fds) fail("an fd leaked");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  run_one(data, size);
  return 0;
}

#ifdef FUZZ_CHANNEL_SEEDS
/* Seeds: a genuine record; it patched in its length, its socket count and
 * its message; tails far, odd and short; a socket count moved both ways;
 * raw bytes; a genuine patch record, and it patched in its offset, its
 * count and its bytes; a record of an unknown kind. */
static void seed(const char *dir, const char *name, const unsigned char *b,
                 size_t n) {
  write_seed(dir, name, b, n);
  run_one(b, n);
  printf("%s: %zu bytes\n", name, n);
}

int main(int argc, char **argv) {
  static const unsigned char genuine[] = {1, 0, 0, 0};
  static const unsigned char len_huge[] = {1, 0,    0,    0,    0,   0,
                                           4, 0xff, 0xff, 0xff, 0x7f};
  static const unsigned char len_zero[] = {1, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0};
  static const unsigned char before[] = {1, 0, 0, 0, 8, 0, 1, 9};
  static const unsigned char nviews[] = {1, 0, 0, 0, 22, 0, 2, 0, 0};
  static const unsigned char slot[] = {1, 0, 0, 0, 90, 0, 4, 1, 2, 3, 4};
  static const unsigned char tail_far[] = {3, 0xff, 0xff, 0};
  static const unsigned char tail_odd[] = {3, 13, 0, 0};
  static const unsigned char sock_up[] = {5, 0, 0, 2};
  static const unsigned char sock_down[] = {5, 0, 0, 0xfe};
  static const unsigned char patch[] = {9, 0, 0, 0};
  static const unsigned char patch_at[] = {9, 0, 0, 0, 16, 0, 2, 0xff, 0xff};
  static const unsigned char patch_n[] = {9, 0, 0, 0, 18, 0, 2, 45, 0};
  static const unsigned char patch_bytes[] = {9, 0, 0, 0, 20, 0, 1, 0x7f};
  static const unsigned char kind[] = {1, 0, 0, 0, 4, 0, 1, 2};
  unsigned char raw[64];
  size_t i;
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  seed(argv[1], "genuine", genuine, sizeof genuine);
  seed(argv[1], "len_huge", len_huge, sizeof len_huge);
  seed(argv[1], "len_zero", len_zero, sizeof len_zero);
  seed(argv[1], "before", before, sizeof before);
  seed(argv[1], "nviews", nviews, sizeof nviews);
  seed(argv[1], "slot", slot, sizeof slot);
  seed(argv[1], "tail_far", tail_far, sizeof tail_far);
  seed(argv[1], "tail_odd", tail_odd, sizeof tail_odd);
  seed(argv[1], "sock_up", sock_up, sizeof sock_up);
  seed(argv[1], "sock_down", sock_down, sizeof sock_down);
  memset(raw, 0, sizeof raw);
  for (i = 4; i < sizeof raw; i++) raw[i] = (unsigned char)(i * 29);
  raw[4] = 40; /* a length of 40, then noise */
  seed(argv[1], "raw", raw, sizeof raw);
  seed(argv[1], "patch", patch, sizeof patch);
  seed(argv[1], "patch_at", patch_at, sizeof patch_at);
  seed(argv[1], "patch_n", patch_n, sizeof patch_n);
  seed(argv[1], "patch_bytes", patch_bytes, sizeof patch_bytes);
  seed(argv[1], "kind", kind, sizeof kind);
  return 0;
}
#endif
