/* The cache of shared memory kept for reuse (src/share_segment.h): size
 * classes, recycled large blocks, the one byte cap, trimming, max_bytes,
 * isolation, and what a consumer maps. Consumers are real processes
 * (tests/share_fixture.h): a stream consumer takes commands over its
 * control socket, checks every tensor it receives (each page of it), and
 * checks the ones it holds again before it lets them go, so a block reused
 * while it is still leased shows.
 *
 * Environment: IPCREF_TEST_SEED fixes the sizes of the mixed stream. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "share_fixture.h"

#define CTL_MS 30000 /* longest wait for a command or a reply */
#define MIB    ((size_t)1 << 20)
#define KIB    ((size_t)1 << 10)

static unsigned rng;

/* ---- tensors that carry their sequence number -------------------------
 * The first 8 bytes hold the number; every other byte holds its low byte.
 * tensor_ok reads the number and then a byte of every 512 and the last. */

static void tensor_fill(ipcref_buf *b, uint64_t seq) {
  memset(ipcref_buf_data(b), (int)(seq & 0xff), ipcref_buf_size(b));
  memcpy(ipcref_buf_data(b), &seq, sizeof seq);
}

static ipcref_buf *tensor_new(ipcref_ctx *ctx, size_t size, uint64_t seq) {
  ipcref_buf *b = NULL;
  CHECK_EQ(ipcref_shared_new(ctx, size, &b), IPCREF_OK);
  if (b) tensor_fill(b, seq);
  return b;
}

static int tensor_ok(const unsigned char *p, size_t size, uint64_t *seq) {
  size_t i;
  memcpy(seq, p, sizeof *seq);
  for (i = 8; i < size; i += 512)
    if (p[i] != (unsigned char)(*seq & 0xff)) return 0;
  return p[size - 1] == (unsigned char)(*seq & 0xff);
}

/* A received view's bytes (a 1-d U8 view). */
static int view_ok(const ipcref_view *v, uint64_t *seq) {
  return tensor_ok((const unsigned char *)ipcref_buf_data(v->buf) +
                       v->byte_offset,
                   (size_t)ipcref_view_numel(v), seq);
}

static ipcref_view u8_view(ipcref_buf *b) {
  ipcref_view v;
  int64_t n = (int64_t)ipcref_buf_size(b);
  memset(&v, 0, sizeof v);
  CHECK_EQ(ipcref_view_of(b, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  return v;
}

/* Makes a tensor, sends it and lets go of it here: 0 on failure. */
static int send_fresh(ipcref_ctx *ctx, ipcref_peer *p, size_t size,
                      uint64_t seq) {
  ipcref_buf *b = tensor_new(ctx, size, seq);
  ipcref_view v;
  int ok;
  if (!b) return 0;
  v = u8_view(b);
  ok = ipcref_send(p, &v) == IPCREF_OK;
  CHECK(ok);
  ipcref_view_release(&v);
  ipcref_buf_release(b);
  return ok;
}

/* ---- the stream consumer ----------------------------------------------
 * Commands (one int each on the control socket), each answered:
 *   'r'  receive a tensor, check it, hold it      -> its sequence number
 *   'd'  check the oldest held again, release it  -> 'D' (or 'F')
 *   'm'  its mapped segments                      -> the count
 *   't'  ipcref_ctx_trim(ctx, 0), then            -> the same count
 *   'x'  release all and leave                    -> (exit status)
 * A check that fails answers 'F' (or -1 for 'r'). */
#define HOLD_MAX 8
typedef struct consumer_opts {
  size_t retired_maps;
} consumer_opts;
static consumer_opts g_consumer;

static int stream_consumer(void *arg) {
  kid *k = (kid *)arg;
  ipcref_ctx_options o;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view held[HOLD_MAX];
  uint64_t seqs[HOLD_MAX], seq;
  int n = 0, cmd, i;
  memset(&o, 0, sizeof o);
  o.retired_maps = g_consumer.retired_maps;
  ctx = make_ctx(&o);
  p = make_peer(ctx, k->their_sock[0]);
  if (!p) return 2;
  while ((cmd = ctl_get(k->their_ctl, CTL_MS)) != 'x' && cmd >= 0) {
    if (cmd == 'r') {
      int got = n < HOLD_MAX && ipcref_recv(p, &held[n], CTL_MS) == IPCREF_OK;
      int ok = got && view_ok(&held[n], &seqs[n]);
      CHECK(ok);
      ctl_put(k->their_ctl, ok ? (int)seqs[n] : -1);
      n += got;
    } else if (cmd == 'd' && n > 0) {
      int ok = view_ok(&held[0], &seq) && seq == seqs[0];
      CHECK(ok); /* the block was not reused while held */
      ipcref_view_release(&held[0]);
      for (i = 1; i < n; i++) held[i - 1] = held[i], seqs[i - 1] = seqs[i];
      n--;
      ctl_put(k->their_ctl, ok ? 'D' : 'F');
    } else if (cmd == 'm' || cmd == 't') {
      ipcref_stats st;
      if (cmd == 't') (void)ipcref_ctx_trim(ctx, 0);
      st = stats_of(ctx);
      ctl_put(k->their_ctl, (int)st.mapped_segments);
    } else {
      ctl_put(k->their_ctl, 'F');
    }
  }
  for (i = 0; i < n; i++) ipcref_view_release(&held[i]);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return 0;
}

/* Asks the consumer to receive; CHECKs it got tensor `seq`. */
static void consumer_takes(kid *k, uint64_t seq) {
  ctl_put(k->ctl, 'r');
  CHECK_EQ(ctl_get(k->ctl, CTL_MS), (int)seq);
}

static void consumer_drops(kid *k) {
  ctl_put(k->ctl, 'd');
  CHECK_EQ(ctl_get(k->ctl, CTL_MS), 'D');
}

static ipcref_ctx *ctx_with(size_t segment, size_t cache, size_t max) {
  ipcref_ctx_options o;
  memset(&o, 0, sizeof o);
  o.segment_size = segment;
  o.segment_cache = cache;
  o.max_bytes = max;
  return make_ctx(&o);
}

/* ---- tests --------------------------------------------------------------
 */

/* The block sizes: powers of two up to 64 KiB, then at most 1/8 over the
 * size asked, whole pages, page aligned; a segment of its own (over half a
 * segment) is rounded to the class too, not to the page only. */
static void test_size_classes(void) {
  ipcref_ctx *ctx = ctx_with(4 * MIB, 0, 0);
  size_t sizes[400], i, n = 0, s;
  for (s = 1; s <= 64 * MIB; s = s * 2)
    sizes[n++] = s, sizes[n++] = s + 1, sizes[n++] = s + s / 3;
  for (i = 0; i < 200; i++) sizes[n++] = 1 + (size_t)rand_r(&rng) % (40 * MIB);
  for (i = 0; i < n; i++) {
    ipcref_buf *b = NULL;
    ipcref_stats st0 = stats_of(ctx), st;
    size_t block;
    uintptr_t at;
    CHECK_EQ(ipcref_shared_new(ctx, sizes[i], &b), IPCREF_OK);
    if (!b) continue;
    st = stats_of(ctx);
    block = st.live_bytes - st0.live_bytes;
    at = (uintptr_t)ipcref_buf_data(b);
    CHECK(block >= sizes[i]);
    CHECK_EQ(at % 64, 0);
    if (sizes[i] > 64 * KIB) {
      CHECK(block - sizes[i] <= sizes[i] / 8);
      CHECK_EQ(block % 4096, 0);
      CHECK_EQ(at % 4096, 0);
    } else {
      CHECK(block < 2 * sizes[i] || block == 64);
    }
    if (block - sizes[i] > sizes[i] / 8 && sizes[i] > 64 * KIB)
      printf("    %zu bytes: a block of %zu\n", sizes[i], block);
    ipcref_buf_release(b);
  }
  ipcref_ctx_free(ctx);
}

/* The stream: 1,000 fresh tensors of mixed sizes over half a segment, two
 * held by the consumer at a time, a cache of three tensors' worth. The
 * cache never passes its cap, every tensor's bytes are right (and stay
 * right while held), most allocations are served from the cache, and at
 * the end everything is freed or cached; ipcref_ctx_trim(ctx, 0) then
 * leaves the fds and mappings of before. */
static void test_stream_of_fresh_tensors(void) {
  static const size_t sizes[4] = {600 * KIB, 1 * MIB, 1536 * KIB, 2300 * KIB};
  const size_t cap = 3 * 2304 * KIB; /* 2300 KiB's class: 2.25 MiB */
  int count = under_valgrind ? 100 : 1000, i, held = 0;
  size_t lo = 0, hi = 0;
  uint64_t fds0;
  res_mark m;
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_stats st;
  g_consumer.retired_maps = 0;
  kid_start(&k, 1, SOCK_SEQPACKET, stream_consumer); /* before the ctx */
  ctx = ctx_with(1 * MIB, cap, 0);
  res_begin(&m); /* what the process had before it shared anything */
  p = kid_peer(&k, 0, ctx);
  fds0 = stats_of(ctx).fds_sent;
  for (i = 0; i < count; i++) {
    size_t size = sizes[rand_r(&rng) % 4];
    if (!send_fresh(ctx, p, size, (uint64_t)i)) break;
    consumer_takes(&k, (uint64_t)i);
    if (++held > 2) consumer_drops(&k), held--;
    st = stats_of(ctx);
    CHECK(st.cached_bytes <= cap);
    CHECK(st.segment_bytes <= cap + 3 * 2304 * KIB); /* + what is in use */
    if (st.cached_bytes > cap) break;
    if (i == count / 2) lo = st.segment_bytes;
    if (st.segment_bytes > hi) hi = st.segment_bytes;
  }
  ctl_put(k.ctl, 'x');
  KID_END(&k, "consumer");
  ipcref_collect(ctx);
  st = stats_of(ctx);
  printf("    %d tensors: %llu from the cache, %llu new segments, %llu fds "
         "sent; segments %zu..%zu KiB\n",
         count, (unsigned long long)st.cache_hits,
         (unsigned long long)st.cache_misses,
         (unsigned long long)(st.fds_sent - fds0), lo >> 10, hi >> 10);
  CHECK_EQ(st.cache_hits + st.cache_misses, (uint64_t)count);
  CHECK(st.cache_hits >= (uint64_t)count / 2); /* 75% seen */
  CHECK_EQ(st.live_bufs, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.segment_bytes, st.cached_bytes); /* freed or cached */
  CHECK(st.cached_bytes <= cap && st.cached_bytes > 0);
  ipcref_peer_free(p);
  CHECK_EQ(ipcref_ctx_trim(ctx, 0), st.cached_bytes);
  st = stats_of(ctx);
  CHECK_EQ(st.segment_bytes, 0);
  CHECK_EQ(st.cached_bytes, 0);
  CHECK_EQ(st.mapped_segments, 0);
  RES_END_CHILD(&m, 2); /* the peer's socket and the control socket */
  ipcref_ctx_free(ctx);
}

/* A block the consumer holds is never handed out again, whatever the
 * producer allocates meanwhile; once it lets go, the next allocation of
 * its class gets it back, and sending it crosses no fd: the consumer still
 * maps its segment. Large and pooled blocks alike. */
static void test_no_reuse_while_leased(void) {
  static const size_t sizes[2] = {3 * MIB, 4096};
  int t, i;
  for (t = 0; t < 2; t++) {
    kid k;
    ipcref_ctx *ctx;
    ipcref_peer *p;
    ipcref_buf *b;
    ipcref_stats st;
    const void *first;
    uint64_t seq = 1, fds;
    g_consumer.retired_maps = 0;
    kid_start(&k, 1, SOCK_SEQPACKET, stream_consumer);
    ctx = ctx_with(4 * MIB, 0, 0);
    p = kid_peer(&k, 0, ctx);
    b = tensor_new(ctx, sizes[t], seq);
    if (!b) break;
    first = ipcref_buf_data(b);
    {
      ipcref_view v = u8_view(b);
      CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
      ipcref_view_release(&v);
    }
    ipcref_buf_release(b); /* to the limbo: the consumer holds it */
    consumer_takes(&k, seq);
    for (i = 0; i < 20; i++) { /* 20 more of the class, never that one */
      ipcref_buf *c = tensor_new(ctx, sizes[t], ++seq);
      CHECK(c && ipcref_buf_data(c) != first);
      ipcref_buf_release(c);
    }
    consumer_drops(&k);  /* checks it held tensor 1 intact, lets go */
    ipcref_collect(ctx); /* its block is free, the newest of its class */
    st = stats_of(ctx);
    fds = st.fds_sent;
    b = tensor_new(ctx, sizes[t], ++seq);
    CHECK(b && ipcref_buf_data(b) == first); /* back from the cache */
    ipcref_buf_release(b);
    CHECK(send_fresh(ctx, p, sizes[t], ++seq));
    consumer_takes(&k, seq);
    CHECK_EQ(stats_of(ctx).fds_sent, fds); /* it maps the segment still */
    ctl_put(k.ctl, 'x');
    KID_END(&k, "consumer");
    ipcref_peer_free(p);
    ipcref_ctx_free(ctx);
  }
}

/* Memory pressure: with max_bytes, an allocation that fits only once the
 * cache gives back its oldest segments succeeds, and gives back no more
 * than it needs; one that cannot fit even then says ENOMEM, and the
 * buffers in use are untouched. */
static void test_pressure_trims_cache(void) {
  ipcref_ctx *ctx = ctx_with(1 * MIB, 0, 4 * MIB);
  ipcref_buf *b[3] = {NULL, NULL, NULL}, *c = NULL, *d = NULL;
  ipcref_stats st;
  int i;
  for (i = 0; i < 3; i++) b[i] = tensor_new(ctx, 1 * MIB, (uint64_t)i);
  for (i = 0; i < 3; i++) ipcref_buf_release(b[i]);
  st = stats_of(ctx);
  CHECK_EQ(st.cached_bytes, 3 * MIB);
  CHECK_EQ(st.segment_bytes, 3 * MIB);
  c = tensor_new(ctx, 2 * MIB, 7); /* 3 + 2 > 4: one cached MiB goes */
  st = stats_of(ctx);
  CHECK(c != NULL);
  CHECK_EQ(st.cached_bytes, 2 * MIB);
  CHECK_EQ(st.segment_bytes, 4 * MIB);
  CHECK_EQ(ipcref_shared_new(ctx, 3 * MIB, &d), IPCREF_ENOMEM);
  CHECK(d == NULL);
  if (c) {
    uint64_t seq;
    CHECK(tensor_ok((const unsigned char *)ipcref_buf_data(c), 2 * MIB, &seq));
    CHECK_EQ(seq, 7);
  }
  st = stats_of(ctx);
  CHECK_EQ(st.live_bufs, 1);
  CHECK(st.segment_bytes <= 4 * MIB);
  ipcref_buf_release(c);
  /* What can never fit is refused at once. */
  CHECK_EQ(ipcref_shared_new(ctx, 5 * MIB, &d), IPCREF_ENOMEM);
  ipcref_ctx_free(ctx);
}

/* One cap over everything kept: the oldest go first, ipcref_ctx_trim
 * keeps what it is told to, IPCREF_KEEP_NONE keeps nothing, a segment
 * larger than the cap is never kept, and the counts add up. */
static void test_cap_and_trim(void) {
  ipcref_ctx *ctx = ctx_with(1 * MIB, 5 * MIB, 0);
  ipcref_buf *b[4], *c = NULL;
  ipcref_stats st;
  int i;
  for (i = 0; i < 4; i++) b[i] = tensor_new(ctx, (size_t)(i + 1) * MIB, 0);
  for (i = 0; i < 4; i++) ipcref_buf_release(b[i]); /* 1, 2, 3, 4 MiB */
  st = stats_of(ctx);
  CHECK_EQ(st.cached_bytes, 4 * MIB); /* 4 evicted 1, 2 and 3 */
  CHECK_EQ(st.cache_misses, 4);
  CHECK_EQ(ipcref_ctx_trim(ctx, 4 * MIB), 0);
  CHECK_EQ(ipcref_ctx_trim(ctx, 0), 4 * MIB);
  st = stats_of(ctx);
  CHECK_EQ(st.segment_bytes, 0);
  /* 1 then 2 MiB: both kept; the trim gives back the oldest, then both. */
  for (i = 0; i < 2; i++) b[i] = tensor_new(ctx, (size_t)(i + 1) * MIB, 0);
  for (i = 0; i < 2; i++) ipcref_buf_release(b[i]);
  CHECK_EQ(stats_of(ctx).cached_bytes, 3 * MIB);
  CHECK_EQ(ipcref_ctx_trim(ctx, 2 * MIB), 1 * MIB); /* the oldest */
  c = tensor_new(ctx, 2 * MIB, 1);
  CHECK_EQ(stats_of(ctx).cache_hits, 1);
  ipcref_buf_release(c);
  /* Larger than the cap: never kept. */
  c = tensor_new(ctx, 6 * MIB, 2);
  ipcref_buf_release(c);
  st = stats_of(ctx);
  CHECK_EQ(st.cached_bytes, 2 * MIB);
  CHECK_EQ(st.segment_bytes, 2 * MIB);
  CHECK_EQ(ipcref_ctx_trim(NULL, 0), 0);
  ipcref_ctx_free(ctx);
  /* At most 64 segments are kept, whatever room the cap leaves: each
   * holds fds. 70 blocks of a segment of their own each, freed. */
  ctx = ctx_with(4096, 0, 0);
  {
    ipcref_buf *many[70];
    for (i = 0; i < 70; i++) many[i] = tensor_new(ctx, 8192, (uint64_t)i);
    for (i = 0; i < 70; i++) ipcref_buf_release(many[i]);
  }
  st = stats_of(ctx);
  CHECK_EQ(st.cached_bytes, 64 * 8192);
  CHECK_EQ(st.segment_bytes, 64 * 8192);
  ipcref_ctx_free(ctx);
  /* IPCREF_KEEP_NONE: every emptied segment goes back at once. */
  ctx = ctx_with(1 * MIB, IPCREF_KEEP_NONE, 0);
  c = tensor_new(ctx, 2 * MIB, 3);
  ipcref_buf_release(c);
  b[0] = tensor_new(ctx, 64, 4); /* a pooled segment, emptied */
  ipcref_buf_release(b[0]);
  st = stats_of(ctx);
  CHECK_EQ(st.cached_bytes, 0);
  CHECK_EQ(st.segment_bytes, 0);
  CHECK_EQ(st.cache_misses, 2);
  ipcref_ctx_free(ctx);
}

/* An isolated block always gets a new segment, and its segment is given
 * back once it is freed, never cached: the peer it went to maps it. */
static void test_isolated_never_recycled(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *b = NULL, *c = NULL;
  ipcref_stats st;
  const void *was;
  g_consumer.retired_maps = 0;
  kid_start(&k, 1, SOCK_SEQPACKET, stream_consumer);
  ctx = ctx_with(1 * MIB, 0, 0);
  p = kid_peer(&k, 0, ctx);
  b = tensor_new(ctx, 2 * MIB, 1); /* cached once freed */
  was = b ? ipcref_buf_data(b) : NULL;
  ipcref_buf_release(b);
  CHECK_EQ(stats_of(ctx).cached_bytes, 2 * MIB);
  CHECK_EQ(ipcref_shared_new_isolated(ctx, 2 * MIB, &c), IPCREF_OK);
  CHECK(c && ipcref_buf_data(c) != was); /* not the cached one */
  st = stats_of(ctx);
  CHECK_EQ(st.cache_hits, 0);
  CHECK_EQ(st.cached_bytes, 2 * MIB);
  if (c) {
    ipcref_view v = u8_view(c);
    tensor_fill(c, 2);
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ipcref_view_release(&v);
    ipcref_buf_release(c);
  }
  consumer_takes(&k, 2);
  consumer_drops(&k);
  ipcref_collect(ctx);
  st = stats_of(ctx);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.segment_bytes, 2 * MIB); /* the cached one only */
  CHECK_EQ(st.cached_bytes, 2 * MIB);
  ctl_put(k.ctl, 'x');
  KID_END(&k, "consumer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* A consumer's mappings stay bounded: segments its producer gave back are
 * unmapped at the next receive once they pass retired_maps (here: at
 * once), though the consumer never calls ipcref_collect. */
static void test_consumer_mappings_bounded(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  int i, most = 0;
  g_consumer.retired_maps = IPCREF_KEEP_NONE;
  kid_start(&k, 1, SOCK_SEQPACKET, stream_consumer);
  ctx = ctx_with(1 * MIB, IPCREF_KEEP_NONE, 0); /* nothing cached */
  p = kid_peer(&k, 0, ctx);
  for (i = 0; i < 20; i++) {
    int maps;
    CHECK(send_fresh(ctx, p, 2 * MIB, (uint64_t)i));
    consumer_takes(&k, (uint64_t)i);
    consumer_drops(&k);
    ipcref_collect(ctx); /* the segment goes: retired with the next send */
    ctl_put(k.ctl, 'm');
    maps = ctl_get(k.ctl, CTL_MS);
    if (maps > most) most = maps;
  }
  printf("    20 fresh segments: the consumer mapped %d at most\n", most);
  CHECK(most >= 1 && most <= 2);
  ctl_put(k.ctl, 'x');
  KID_END(&k, "consumer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* With the default retired_maps (64 MiB), a consumer keeps idle mappings
 * of segments its producer gave back, up to that bound, and
 * ipcref_ctx_trim unmaps them. */
static void test_consumer_trim(void) {
  kid k;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  int i, kept, after;
  g_consumer.retired_maps = 0; /* the default */
  kid_start(&k, 1, SOCK_SEQPACKET, stream_consumer);
  ctx = ctx_with(1 * MIB, IPCREF_KEEP_NONE, 0);
  p = kid_peer(&k, 0, ctx);
  for (i = 0; i < 8; i++) {
    CHECK(send_fresh(ctx, p, 2 * MIB, (uint64_t)i));
    consumer_takes(&k, (uint64_t)i);
    consumer_drops(&k);
    ipcref_collect(ctx);
  }
  ctl_put(k.ctl, 'm');
  kept = ctl_get(k.ctl, CTL_MS);
  ctl_put(k.ctl, 't');
  after = ctl_get(k.ctl, CTL_MS);
  printf("    the consumer mapped %d segments, %d after its trim\n", kept,
         after);
  CHECK(kept >= 7); /* 14 MiB retired: under the bound, kept */
  CHECK(after <= 1);
  ctl_put(k.ctl, 'x');
  KID_END(&k, "consumer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
}

/* A consumer that frees its peer while the producer lives lets go of
 * that producer's segments and counter files once nothing uses them (the
 * producer never tells a freed peer what it destroys): a second
 * connection from the same producer keeps them while it lives; a view
 * held keeps its segment until released. */
static void test_consumer_frees_its_peer(void) {
  local_pair l;
  ipcref_peer *again = NULL, *again_prod = NULL;
  ipcref_view v, got, held;
  const int64_t n = 4096;
  int sv[2];
  local_pair_open(&l, NULL, NULL);
  if (!l.pp || !l.cp || xsocketpair(SOCK_SEQPACKET, sv) != 0) return;
  again_prod = make_peer(l.prod, sv[0]);
  again = make_peer(l.cons, sv[1]);
  CHECK_EQ(ipcref_view_new_shared(l.prod, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  CHECK_EQ(ipcref_send(again_prod, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(again, &held, 5000), IPCREF_OK);
  ipcref_view_release(&got);
  ipcref_peer_free(l.cp);
  l.cp = NULL;
  CHECK_EQ(stats_of(l.cons).mapped_segments, 1); /* `again` may use it */
  ipcref_peer_free(again);
  CHECK_EQ(stats_of(l.cons).mapped_segments, 1); /* `held` uses it */
  ipcref_view_release(&held);
  ipcref_collect(l.cons);
  CHECK_EQ(stats_of(l.cons).mapped_segments, 0);
  CHECK_EQ(stats_of(l.cons).counter_files, 0);
  ipcref_view_release(&v);
  ipcref_peer_free(again_prod);
  local_pair_close(&l);
}

/* A producer connects again after the consumer freed its last peer from
 * it, while the consumer still holds a view from then (its segment's
 * mapping retired, in use): the producer sends the segment's fd anew on
 * the new connection, and the consumer maps it anew; a view of the same
 * block imports, three times over, with the right bytes; once nothing is
 * held, nothing stays mapped. */
static void test_producer_connects_again(void) {
  ipcref_ctx *prod = make_ctx(NULL), *cons = make_ctx(NULL);
  ipcref_view v, held[3];
  const int64_t n = 4096;
  int round, sv[2], i;
  CHECK_EQ(ipcref_view_new_shared(prod, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  /* Written again while the consumer holds it: the test knows when. */
  ipcref_buf_set_shared_mut(v.buf, 1);
  for (round = 0; round < 3; round++) {
    ipcref_peer *pp, *cp;
    ipcref_result r;
    held[round].buf = NULL;
    if (xsocketpair(SOCK_SEQPACKET, sv) != 0) break;
    pp = make_peer(prod, sv[0]);
    cp = make_peer(cons, sv[1]);
    memset(ipcref_view_data_mut(&v), 'a' + round, (size_t)n);
    CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK);
    r = ipcref_recv(cp, &held[round], 5000);
    CHECK_EQ(r, IPCREF_OK);
    if (r == IPCREF_OK)
      CHECK_EQ(((const unsigned char *)ipcref_view_data(&held[round]))[7],
               'a' + round);
    else
      held[round].buf = NULL;
    CHECK_EQ(stats_of(cons).mapped_segments, (uint64_t)round + 1);
    ipcref_peer_free(cp);
    ipcref_peer_free(pp);
  }
  for (i = 0; i < round; i++)
    if (held[i].buf) ipcref_view_release(&held[i]);
  ipcref_collect(cons);
  CHECK_EQ(stats_of(cons).mapped_segments, 0);
  CHECK_EQ(stats_of(cons).counter_files, 0);
  ipcref_view_release(&v);
  ipcref_ctx_free(cons);
  ipcref_collect(prod);
  CHECK_EQ(stats_of(prod).live_bufs, 0);
  ipcref_ctx_free(prod);
}

/* The same under a context cap (max_maps 3), the view from before let go
 * after the peer was freed: what the old connection mapped is retired and
 * idle, and room for the new connection's is made by unmapping it, all
 * but the segment mapping the new one displaces, which goes once the new
 * one took its place (it was unmapped first, then used). */
static void test_connects_again_under_a_cap(void) {
  ipcref_ctx_options co;
  ipcref_ctx *prod = make_ctx(NULL), *cons;
  ipcref_view v, got;
  const int64_t n = 4096;
  int sv[2], round;
  memset(&co, 0, sizeof co);
  co.max_maps = 3;
  cons = make_ctx(&co);
  CHECK_EQ(ipcref_view_new_shared(prod, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  for (round = 0; round < 3; round++) {
    ipcref_peer *pp, *cp;
    if (xsocketpair(SOCK_SEQPACKET, sv) != 0) break;
    pp = make_peer(prod, sv[0]);
    cp = make_peer(cons, sv[1]);
    CHECK_EQ(ipcref_send(pp, &v), IPCREF_OK);
    CHECK_EQ(ipcref_recv(cp, &got, 5000), IPCREF_OK);
    ipcref_peer_free(cp); /* its mappings retired; the segment's in use */
    ipcref_peer_free(pp);
    if (got.buf) ipcref_view_release(&got); /* now idle */
    CHECK(stats_of(cons).maps_in <= 3);
  }
  ipcref_collect(cons);
  CHECK_EQ(stats_of(cons).mapped_segments, 0);
  ipcref_view_release(&v);
  ipcref_ctx_free(cons);
  ipcref_collect(prod);
  CHECK_EQ(stats_of(prod).live_bufs, 0);
  ipcref_ctx_free(prod);
}

/* A segment is made with its read-only fd for consumers, or not at all:
 * out of fds after the memfd, the allocation is refused and nothing is
 * kept; with fds again, a block is made and sent. In a child, under a
 * low RLIMIT_NOFILE. */
static int fd_starved(void *arg) {
  struct rlimit rl;
  ipcref_ctx *prod = make_ctx(NULL), *cons = make_ctx(NULL);
  ipcref_peer *pp, *cp;
  ipcref_buf *b = NULL;
  ipcref_view v, got;
  int sv[2], fd, first = -1, last = -1, bad = 0;
  const int64_t n = 4096;
  (void)arg;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return 2;
  pp = make_peer(prod, sv[0]);
  cp = make_peer(cons, sv[1]);
  if (!pp || !cp || getrlimit(RLIMIT_NOFILE, &rl) != 0) return 3;
  rl.rlim_cur = 64; /* valgrind refuses a lower hard limit */
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 3;
  while ((fd = dup(0)) >= 0) {
    if (first < 0) first = fd;
    last = fd;
  }
  if (last < 0) return 4;
  close(last); /* one left: the memfd takes it, its read-only open fails */
  bad += ipcref_shared_new(prod, 4096, &b) == IPCREF_OK;
  bad += stats_of(prod).segment_bytes != 0;
  bad += dup(0) != last; /* the memfd was closed again */
  for (fd = first; fd <= last; fd++) close(fd);
  if (ipcref_shared_new(prod, 4096, &b) != IPCREF_OK) return 5;
  if (ipcref_view_of(b, IPCREF_U8, 1, &n, &v) != IPCREF_OK) return 6;
  bad += ipcref_send(pp, &v) != IPCREF_OK;
  bad += ipcref_recv(cp, &got, 5000) != IPCREF_OK;
  ipcref_view_release(&got);
  ipcref_view_release(&v);
  ipcref_buf_release(b);
  ipcref_peer_free(cp);
  ipcref_peer_free(pp);
  ipcref_ctx_free(cons);
  ipcref_ctx_free(prod);
  return bad;
}
static void test_segment_needs_its_fds(void) {
  pid_t pid = fork_child(fd_starved, NULL, -1);
  CHECK(exit0_at(wait_child(pid, REAP_MS), "child", __FILE__, __LINE__));
}

/* ---- many segments: the lookups of share_index ------------------------
 */

#define MANY 300 /* segments: two fds each across the pair, under 1024 */

/* Hands views v[from], v[from + step], ... (below MANY) over the pair and
 * checks each arrives with byte `at` holding what `want` says: 1 when
 * all did. */
static int hand_over(local_pair *l, const ipcref_view *v, int from, int step,
                     size_t at, int (*want)(int)) {
  int i;
  for (i = from; i >= 0 && i < MANY; i += step) {
    ipcref_view got;
    int ok = ipcref_send(l->pp, &v[i]) == IPCREF_OK &&
             ipcref_recv(l->cp, &got, 5000) == IPCREF_OK;
    CHECK(ok);
    if (!ok) return 0;
    CHECK_EQ(((unsigned char *)ipcref_buf_data(got.buf))[at], want(i));
    ipcref_view_release(&got);
  }
  return 1;
}

/* The byte each view of test_many_segments holds: its index's, then (for
 * the even ones, made again) the next index's. */
static int byte_first(int i) {
  return i & 0xff;
}
static int byte_again(int i) {
  return (i + (i % 2 == 0)) & 0xff;
}

static void new_views(ipcref_ctx *ctx, ipcref_view *v, int step,
                      int (*byte)(int)) {
  const int64_t n = 4096;
  int i;
  for (i = 0; i < MANY; i += step) {
    CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v[i]), IPCREF_OK);
    memset(ipcref_buf_data(v[i].buf), byte(i), 4096);
  }
}

/* What each side finds, with a segment per view: 300 segments cross once
 * and are found again without their fds; half of them destroyed are
 * unmapped by the consumer, the others still found, and new ones cross. */
static void test_many_segments(void) {
  static ipcref_view v[MANY];
  ipcref_ctx_options po;
  local_pair l;
  uint64_t fds0;
  int i;
  memset(&po, 0, sizeof po);
  po.segment_size = 4096;              /* a segment per 4 KiB view */
  po.segment_cache = IPCREF_KEEP_NONE; /* freed segments are destroyed */
  local_pair_open(&l, &po, NULL);
  if (!l.pp || !l.cp) return;
  new_views(l.prod, v, 1, byte_first);
  CHECK_EQ(stats_of(l.prod).mapped_segments, MANY);
  /* Each segment's fd crosses once; found again, none crosses. */
  if (!hand_over(&l, v, 0, 1, 4095, byte_first)) goto out;
  CHECK_EQ(stats_of(l.cons).mapped_segments, MANY);
  fds0 = stats_of(l.prod).fds_sent;
  if (!hand_over(&l, v, MANY - 1, -1, 0, byte_first)) goto out;
  CHECK_EQ(stats_of(l.prod).fds_sent, fds0);
  /* Every other segment destroyed; retired with the next messages. */
  for (i = 0; i < MANY; i += 2) ipcref_view_release(&v[i]);
  ipcref_collect(l.prod);
  CHECK_EQ(stats_of(l.prod).mapped_segments, MANY / 2);
  if (!hand_over(&l, v, 1, 2, 4095, byte_first)) goto out;
  CHECK_EQ(stats_of(l.prod).fds_sent, fds0);
  (void)ipcref_ctx_trim(l.cons, 0);
  CHECK_EQ(stats_of(l.cons).mapped_segments, MANY / 2);
  /* New segments in the freed ones' place: only their fds cross. */
  new_views(l.prod, v, 2, byte_again);
  if (!hand_over(&l, v, 0, 1, 7, byte_again)) goto out;
  CHECK_EQ(stats_of(l.prod).fds_sent, fds0 + MANY / 2);
  CHECK_EQ(stats_of(l.cons).mapped_segments, MANY);
out:
  for (i = 0; i < MANY; i++) ipcref_view_release(&v[i]);
  local_pair_close(&l);
}

/* An imported buffer's header holds its import (one allocation): a weak
 * reference keeps the header, never the lease. The lease goes back at the
 * last strong release, however many there were (the producer's slot is
 * free again after a sweep); the weak reference then upgrades to nothing,
 * and its release frees the rest (the sanitizers and valgrind see no
 * leak, no use after free). */
static void test_weak_outlives_import(void) {
  const int64_t n = 4096;
  ipcref_view v, got;
  ipcref_weak *w = NULL;
  ipcref_buf *again;
  local_pair l;
  local_pair_open(&l, NULL, NULL);
  if (!l.pp || !l.cp) return;
  CHECK_EQ(ipcref_view_new_shared(l.prod, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  memset(ipcref_buf_data(v.buf), 0x5c, 4096);
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  w = ipcref_buf_downgrade(got.buf);
  CHECK(w != NULL);
  again = ipcref_weak_upgrade(w); /* a second strong reference */
  CHECK(again == got.buf);
  ipcref_view_release(&got);
  ipcref_collect(l.prod);
  CHECK_EQ(stats_of(l.prod).live_slots, 1); /* still held */
  CHECK_EQ(((unsigned char *)ipcref_buf_data(again))[4095], 0x5c);
  ipcref_buf_release(again);
  ipcref_collect(l.prod);
  CHECK_EQ(stats_of(l.prod).live_slots, 0); /* back */
  CHECK(ipcref_weak_upgrade(w) == NULL);
  ipcref_weak_release(w);
  /* The next hand-off finds its mappings as before. */
  CHECK_EQ(ipcref_send(l.pp, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(l.cp, &got, 5000), IPCREF_OK);
  CHECK_EQ(((unsigned char *)ipcref_buf_data(got.buf))[0], 0x5c);
  ipcref_view_release(&got);
  ipcref_view_release(&v);
  local_pair_close(&l);
}

/* The set of what a peer was sent, against a list: marks and forgets of
 * random keys in a few hundred slots (runs that wrap, entries moved back
 * over a forgotten one), then everything forgotten. */
static void test_sent_set_model(void) {
  enum { KEYS = 700, OPS = 20000 };
  static char in[KEYS];
  ipcref_peer p;
  int i, fail = 0, bad = 0;
  memset(&p, 0, sizeof p);
  memset(in, 0, sizeof in);
  for (i = 0; i < OPS; i++) {
    int k = (int)(((rng = rng * 1103515245u + 12345u) >> 8) % KEYS);
    uint64_t nonce = 0x1234u + (uint64_t)(k % 7), key = (uint64_t)k * 2u;
    if (i % 3 != 2) {
      bad |= ipcref__sent_mark(&p, nonce, key, &fail) != in[k];
      in[k] = 1;
    } else {
      bad |= ipcref__sent_forget(&p, nonce, key) != in[k];
      in[k] = 0;
    }
    if (i % 997 == 0) { /* every key answers as the list does */
      int j, n = 0;
      for (j = 0; j < KEYS; j++) {
        size_t at = ipcref__sent_slot(&p, 0x1234u + (uint64_t)(j % 7),
                                      (uint64_t)j * 2u);
        bad |= p.sent[at].used != in[j];
        n += in[j];
      }
      bad |= (size_t)n != p.nsent;
    }
  }
  CHECK(!fail);
  CHECK(!bad);
  CHECK(p.capsent >= 2 * p.nsent && (p.capsent & (p.capsent - 1)) == 0);
  for (i = 0; i < KEYS; i++)
    if (in[i])
      CHECK(ipcref__sent_forget(&p, 0x1234u + (uint64_t)(i % 7),
                                (uint64_t)i * 2u));
  CHECK_EQ(p.nsent, 0);
  IPCREF_FREE(p.sent);
}

/* The mappings' table, against a list: mappings of random kinds, origins
 * and ids added, retired and taken out (chains, growth), each lookup
 * answering as a walk of every mapping would. */
static void test_map_index_model(void) {
  enum { MAPS = 500, OPS = 6000 };
  static ipcref__map *all[MAPS];
  static ipcref__map *live[MAPS];
  ipcref_ctx *ctx = make_ctx(NULL);
  int nlive = 0, i, bad = 0;
  if (!ctx) return;
  for (i = 0; i < MAPS; i++) {
    all[i] = (ipcref__map *)calloc(1, sizeof **all);
    if (!all[i]) return;
    all[i]->kind = i % 3 == 0   ? IPCREF__KIND_LEDGER
                   : i % 3 == 1 ? IPCREF__KIND_SEGMENT
                                : IPCREF__KIND_DEVICE;
    all[i]->origin_nonce = 77u + (uint64_t)(i % 5);
    all[i]->id = (uint64_t)(i / 3); /* a ledger and a segment share ids */
  }
  IPCREF__LOCK(ctx);
  for (i = 0; i < OPS; i++) {
    int k = (int)(((rng = rng * 1103515245u + 12345u) >> 8) % MAPS), j;
    ipcref__map *m = all[k], *want = NULL;
    int kind = m->kind == IPCREF__KIND_LEDGER ? IPCREF__KIND_LEDGER
                                              : IPCREF__KIND_SEGMENT;
    for (j = 0; j < nlive && !want; j++)
      if (ipcref__map_is(live[j], kind, m->origin_nonce, m->id)) want = live[j];
    bad |= ipcref__map_find(ctx, kind, m->origin_nonce, m->id) != want;
    for (j = 0; j < nlive && live[j] != m; j++) continue;
    if (j == nlive && !want) { /* one per key, as the cache keeps */
      ipcref__map_index_add(ctx, m);
      live[nlive++] = m;
    } else if (j < nlive && i % 4 == 0) {
      ipcref__map_retire(ctx, m); /* still found */
    } else if (j < nlive) {
      ipcref__map_index_del(ctx, m);
      m->retired = 0;
      live[j] = live[--nlive];
    }
  }
  bad |= ctx->nmaps_indexed != (size_t)nlive;
  while (nlive) ipcref__map_index_del(ctx, live[--nlive]);
  bad |= ctx->maps || ctx->maps_retired || ctx->nmaps_indexed;
  IPCREF__UNLOCK(ctx);
  CHECK(!bad);
  for (i = 0; i < MAPS; i++) free(all[i]);
  ipcref_ctx_free(ctx);
}

int main(void) {
  long seed;
  fixture_start();
  seed = harness_env_long("IPCREF_TEST_SEED", (long)time(NULL));
  rng = (unsigned)seed;
  printf("test_cache: seed %ld (IPCREF_TEST_SEED)\n", seed);
  RUN(test_size_classes);
  RUN(test_stream_of_fresh_tensors);
  RUN(test_no_reuse_while_leased);
  RUN(test_pressure_trims_cache);
  RUN(test_cap_and_trim);
  RUN(test_isolated_never_recycled);
  RUN(test_consumer_mappings_bounded);
  RUN(test_consumer_frees_its_peer);
  RUN(test_producer_connects_again);
  RUN(test_connects_again_under_a_cap);
  RUN(test_segment_needs_its_fds);
  RUN(test_consumer_trim);
  RUN(test_many_segments);
  RUN(test_weak_outlives_import);
  RUN(test_sent_set_model);
  RUN(test_map_index_model);
  return harness_finish();
}
