/* A libFuzzer target for the producer's side of what a consumer writes:
 * its counter file (the ledger's header, slots and return ring) and its
 * channel's control page (read index, sleep word, closed flag), as a
 * hostile consumer would write them (src/share_ledger.h,
 * src/share_channel.h).
 *
 * Per input: a producer context and two consumer contexts in this process,
 * each consumer a peer on a socketpair of its own, with a channel: H, whose
 * shared memory the input writes, and D, an honest consumer. The producer
 * sends H its three views (H holds them) and D the second. Then the input
 * is a list of steps, each a byte (its value mod 9) and its arguments:
 *
 *   0 write    u16 offset (mod the ledger's size), u8 length (mod 33), the
 *              bytes: written over H's ledger (header, slots or ring)
 *   1 return   u8 lease (i < 3: H's lease of view i, else a slot), int8
 *              generation offset: a return pushed as a consumer pushes one
 *   2 link     u8 forwarding slot, u8 parent (as `return`), u8 flags (bit
 *              0 the slot claimed live first, bit 1 the holder this
 *              process, else the u32 that follows, bit 2 the parent's
 *              generation off by one, bit 3 the slot's): a forwarded
 *              lease linked as a forwarder links one
 *   3 head     int8: the ring's head moved (positions taken, not written:
 *              holes; or backwards)
 *   4 control  u8 word (head, asleep, closed), u64: written into H's
 *              channel control page
 *   5 release  u8 i: H lets go of its view i (an honest return)
 *   6 send     u8 i: the producer sends its view i to H, which receives
 *              with no wait and keeps what it got as its view i
 *   7 producer u8: ipcref_collect, ipcref_ctx_timeout, ipcref_ctx_stats, or
 *              8 blocks of the views' size taken, scribbled and let go
 *   8 drop     u8 i: the producer lets go of its view i
 *
 * After every step:
 *   - every call says one of its documented results and returns (the
 *     fuzzer's timeout catches a wait);
 *   - D's view and every view the producer still holds keep their values:
 *     no block is freed, or handed out again, while someone else holds it;
 *   - the stats stay in range (a count that went below zero would not).
 * After every input, once H and D are gone (their leases reclaimed as if
 * they had died): nothing is live or in the limbo, no fd is left open.
 * Any violation aborts. Built and run by tests/fuzz.sh (TARGET returns).
 *
 * Built without -fsanitize=fuzzer and with -DFUZZ_RETURNS_SEEDS, main()
 * writes the seed corpus to the directory given (tests/corpus/returns/). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#define RING  4096
#define NV    3   /* the producer's views */
#define NEL   100 /* i32 elements each */
#define STEPS 64  /* at most, per input */

#define FUZZ_NAME      "fuzz_returns"
#define FUZZ_TRACE_ENV "FUZZ_RETURNS_TRACE"
#include "fuzz_common.h"

/* What the library reports: a code and a reason, printed only when
 * tracing (the default hook's stderr would slow the fuzzer). */
static void hook_fn(void *user, ipcref_result code, const char *message) {
  (void)user;
  if (code >= 0 || !message || !*message)
    fail("a report without an error code or a reason");
  tr("  hook: %s\n", message);
}

static const ipcref_error_hook hook = {hook_fn, NULL};

static ipcref_peer *peer(ipcref_ctx *ctx, int fd) {
  ipcref_peer_options o;
  ipcref_peer *p = NULL;
  memset(&o, 0, sizeof o);
  o.ring_bytes = RING;
  o.spin_us = 0;
  if (ipcref_peer_new_with(ctx, fd, &o, &p) != IPCREF_OK) fail("peer");
  return p;
}

/* ------------------------------------------------------------ the input */

static uint64_t bytes_le(reader *r, int n) {
  uint64_t v = 0;
  int i;
  for (i = 0; i < n; i++) v |= (uint64_t)u8(r) << (8 * i);
  return v;
}

/* ------------------------------------------------------------ the world */

typedef struct world {
  ipcref_ctx *prod, *hc, *dc;
  ipcref_peer *ph, *hp, *pd, *dp; /* producer->H, H's, producer->D, D's */
  ipcref__ledger *led;            /* H's ledger, in the producer */
  ipcref_view v[NV], h[NV], d;    /* the producer's, H's, D's */
  int held[NV];                   /* the producer still holds v[i] */
} world;

static void fill(const ipcref_view *v, int32_t seed) {
  int32_t *x = (int32_t *)ipcref_view_data_mut(v);
  int i;
  if (!x) fail("a new view is not writable");
  for (i = 0; i < NEL; i++) x[i] = seed * 1000 + i;
}

static int intact(const ipcref_view *v, int32_t seed) {
  const int32_t *x = (const int32_t *)ipcref_view_data(v);
  int i;
  for (i = 0; i < NEL; i++)
    if (x[i] != seed * 1000 + i) return 0;
  return 1;
}

static int known_send(ipcref_result r) {
  return r == IPCREF_OK || r == IPCREF_EAGAIN || r == IPCREF_EPEER ||
         r == IPCREF_ENOMEM || r == IPCREF_EBUSY || r == IPCREF_ETIMEDOUT;
}

static int known_recv(ipcref_result r) {
  return r == IPCREF_OK || r == IPCREF_EAGAIN || r == IPCREF_EPROTO ||
         r == IPCREF_ENOMEM || r == IPCREF_EPEER;
}

/* H's lease of its view i: slot and generation (0, 0 when it has none). */
static void lease_of(const world *w, int i, uint32_t *slot, uint32_t *gen) {
  const ipcref__import *imp;
  *slot = *gen = 0;
  if (!w->h[i].buf) return;
  imp = (const ipcref__import *)w->h[i].buf->release_user;
  *slot = imp->slot;
  *gen = imp->gen;
}

/* A lease named by one byte: H's of view b (b < NV), else slot b. */
static void named_lease(const world *w, uint8_t b, uint32_t *slot,
                        uint32_t *gen) {
  if (b < NV) {
    lease_of(w, b, slot, gen);
  } else {
    *slot = b;
    *gen = 1;
  }
}

static void setup(world *w) {
  const int64_t n = NEL;
  int sh[2], sd[2], i;
  memset(w, 0, sizeof *w);
  if (ipcref_ctx_new(NULL, &w->prod) != IPCREF_OK ||
      ipcref_ctx_new(NULL, &w->hc) != IPCREF_OK ||
      ipcref_ctx_new(NULL, &w->dc) != IPCREF_OK ||
      socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sh) != 0 ||
      socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sd) != 0)
    fail("setup");
  w->ph = peer(w->prod, sh[0]);
  w->hp = peer(w->hc, sh[1]);
  w->pd = peer(w->prod, sd[0]);
  w->dp = peer(w->dc, sd[1]);
  for (i = 0; i < NV; i++) {
    if (ipcref_view_new_shared(w->prod, IPCREF_I32, 1, &n, &w->v[i]) !=
        IPCREF_OK)
      fail("a view");
    fill(&w->v[i], i + 1);
    w->held[i] = 1;
    if (ipcref_send(w->ph, &w->v[i]) != IPCREF_OK ||
        ipcref_recv(w->hp, &w->h[i], 1000) != IPCREF_OK)
      fail("a hand-off to H");
  }
  if (ipcref_send(w->pd, &w->v[1]) != IPCREF_OK ||
      ipcref_recv(w->dp, &w->d, 1000) != IPCREF_OK)
    fail("the hand-off to D");
  for (w->led = w->prod->ledgers; w->led; w->led = w->led->next)
    if (w->led->peer == w->ph) break;
  if (!w->led || !w->ph->tx) fail("H's ledger or channel");
}

/* ------------------------------------------------------------ the steps */

static void step_write(world *w, reader *r) {
  size_t size = ipcref__ledger_bytes(w->led->n);
  size_t off = (size_t)bytes_le(r, 2) % size, len = u8(r) % 33u, i;
  tr("write %zu bytes at %zu\n", len, off);
  for (i = 0; i < len && off + i < size; i++) w->led->base[off + i] = u8(r);
}

static void step_return(world *w, reader *r) {
  uint32_t slot, gen;
  uint64_t e;
  named_lease(w, u8(r), &slot, &gen);
  gen += (uint32_t)(int32_t)(int8_t)u8(r);
  tr("return slot %u gen %u\n", slot, gen);
  e = ipcref__ring_entry(IPCREF__RING_RELEASE, slot, gen);
  ipcref__ring_push(w->led->base, w->led->n, -1, &e, 1, NULL);
}

static void step_link(world *w, reader *r) {
  uint32_t n = w->led->n, s = n / 2 + u8(r) % (n / 2), ps, pg, gen;
  uint64_t *slots = ipcref__ledger_slots(w->led->base), e[2], word;
  uint8_t flags;
  int holder;
  named_lease(w, u8(r), &ps, &pg);
  flags = u8(r);
  holder = flags & 2 ? (int)getpid() : (int)(uint32_t)bytes_le(r, 4);
  word = __atomic_load_n(&slots[2 * (size_t)s], __ATOMIC_ACQUIRE);
  gen = (uint32_t)(word >> 2) + 1u;
  if (flags & 1) {
    __atomic_store_n(&slots[2 * (size_t)s],
                     ((uint64_t)gen << 2) | IPCREF__SLOT_LIVE,
                     __ATOMIC_RELEASE);
    __atomic_store_n(&slots[2 * (size_t)s + 1],
                     ((uint64_t)(ps + 1u) << 32) | (uint32_t)holder,
                     __ATOMIC_RELEASE);
  }
  if (flags & 4) pg++;
  if (flags & 8) gen++;
  tr("link slot %u gen %u (claimed %d, holder %d) to %u gen %u\n", s, gen,
     flags & 1, holder, ps, pg);
  e[0] = ipcref__ring_entry(IPCREF__RING_LINK, s, gen);
  e[1] = ipcref__ring_entry(IPCREF__RING_PARENT, ps, pg);
  ipcref__ring_push(w->led->base, n, -1, e, 2, NULL);
}

static void step_head(world *w, reader *r) {
  ipcref__ledger_hdr *h = (ipcref__ledger_hdr *)(void *)w->led->base;
  int k = (int8_t)u8(r);
  tr("head moved by %d\n", k);
  (void)__atomic_fetch_add(&h->head, (uint64_t)(int64_t)k, __ATOMIC_RELEASE);
}

static void step_control(world *w, reader *r) {
  ipcref__chan_ctl *c = w->ph->tx->ctl;
  uint8_t which = u8(r) % 3;
  uint64_t x = bytes_le(r, 8);
  tr("control word %u = %llu\n", which, (unsigned long long)x);
  if (which == 0) __atomic_store_n(&c->head, x, __ATOMIC_RELEASE);
  if (which == 1) __atomic_store_n(&c->asleep, (uint32_t)x, __ATOMIC_RELEASE);
  if (which == 2) __atomic_store_n(&c->closed, (uint32_t)x, __ATOMIC_RELEASE);
}

static void step_send(world *w, reader *r) {
  int i = u8(r) % NV;
  ipcref_view got;
  ipcref_result res;
  if (!w->held[i]) return;
  res = ipcref_send(w->ph, &w->v[i]);
  tr("send view %d: %s\n", i, ipcref_strerror(res));
  if (!known_send(res)) fail("a send said something undocumented");
  memset(&got, 0, sizeof got);
  res = ipcref_recv(w->hp, &got, 0);
  tr("  received: %s\n", ipcref_strerror(res));
  if (!known_recv(res)) fail("a receive said something undocumented");
  if (res != IPCREF_OK) return;
  ipcref_view_release(&w->h[i]);
  w->h[i] = got;
}

/* Blocks of the views' size, taken and scribbled on: a block freed or
 * handed out while held would be among them. */
static void churn(world *w) {
  const int64_t n = NEL;
  ipcref_view t[8];
  int i;
  for (i = 0; i < 8; i++)
    if (ipcref_view_new_shared(w->prod, IPCREF_I32, 1, &n, &t[i]) == IPCREF_OK)
      memset(ipcref_view_data_mut(&t[i]), 0xee, NEL * 4);
    else
      memset(&t[i], 0, sizeof t[i]);
  for (i = 0; i < 8; i++) ipcref_view_release(&t[i]);
}

static void step_producer(world *w, reader *r) {
  ipcref_stats st;
  uint8_t what = u8(r) % 4;
  tr("producer: %s\n", what == 0   ? "collect"
                       : what == 1 ? "timeout"
                       : what == 2 ? "stats"
                                   : "churn");
  switch (what) {
  case 0: (void)ipcref_collect(w->prod); break;
  case 1:
    if (ipcref_ctx_timeout(w->prod) < -1) fail("a timeout below -1");
    break;
  case 2:
    if (ipcref_ctx_stats(w->prod, &st) != IPCREF_OK) fail("stats");
    break;
  default: churn(w);
  }
}

static void check(world *w) {
  ipcref_stats st;
  int i;
  if (!intact(&w->d, 2)) fail("D's view changed");
  for (i = 0; i < NV; i++)
    if (w->held[i] && !intact(&w->v[i], i + 1))
      fail("a view the producer holds changed");
  /* Read, not asked for: ipcref_ctx_stats sweeps, and entries are left
   * to pile up until a step of the producer's reads them. */
  st = w->prod->st;
  /* The producer half of each ledger, and its forwarding half. */
  if (st.live_slots > 2 * (uint64_t)w->led->n + 8 || st.limbo_blocks > NV)
    fail("the stats went out of range");
}

static void step(world *w, reader *r) {
  uint8_t op = u8(r) % 9, i;
  switch (op) {
  case 0: step_write(w, r); break;
  case 1: step_return(w, r); break;
  case 2: step_link(w, r); break;
  case 3: step_head(w, r); break;
  case 4: step_control(w, r); break;
  case 5:
    i = u8(r) % NV;
    tr("H releases view %u\n", i);
    ipcref_view_release(&w->h[i]);
    break;
  case 6: step_send(w, r); break;
  case 7: step_producer(w, r); break;
  default:
    i = u8(r) % NV;
    tr("the producer drops view %u\n", i);
    if (w->held[i]) ipcref_view_release(&w->v[i]);
    w->held[i] = 0;
  }
}

/* ------------------------------------------------------------ the end */

static void teardown(world *w) {
  ipcref_stats st;
  int i;
  for (i = 0; i < NV; i++) {
    ipcref_view_release(&w->h[i]);
    if (w->held[i]) ipcref_view_release(&w->v[i]);
  }
  ipcref_view_release(&w->d);
  ipcref_peer_free(w->hp);
  ipcref_peer_free(w->dp);
  ipcref_ctx_free(w->hc);
  ipcref_ctx_free(w->dc);
  reclaim_all(w->prod);
  if (ipcref_ctx_stats(w->prod, &st) != IPCREF_OK || st.live_slots ||
      st.limbo_blocks)
    fail("leases left");
  ipcref_peer_free(w->ph);
  ipcref_peer_free(w->pd);
  ipcref_ctx_free(w->prod);
}

static void run_one(const uint8_t *data, size_t size) {
  static int base_fds = -1;
  world w;
  reader r;
  int k;
  if (base_fds < 0) {
    (void)ipcref_set_error_hook(&hook);
    base_fds = count_fds();
  }
  setup(&w);
  r.p = data;
  r.n = size;
  for (k = 0; k < STEPS && r.n; k++) {
    step(&w, &r);
    check(&w);
  }
  teardown(&w);
  if (count_fds() != base_fds) fail("an fd leaked");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  run_one(data, size);
  return 0;
}

#ifdef FUZZ_RETURNS_SEEDS
/* Seeds: one of each step, then a few lies in a row: a second return of a
 * lease H gave back, a link of a slot never claimed, a holder that is no
 * process, holes before an honest return, a read index far ahead with
 * the sender then sending, a header overwritten. */
static void seed(const char *dir, const char *name, const unsigned char *b,
                 size_t n) {
  write_seed(dir, name, b, n);
  run_one(b, n);
  printf("%s: %zu bytes\n", name, n);
}

int main(int argc, char **argv) {
  static const unsigned char write_hdr[] = {
      0, 0, 0, 16, 0xff, 0xff, 0xff, 0xff, 1,  2, 3,
      4, 5, 6, 7,  8,    9,    10,   11,   12, 7, 0};
  static const unsigned char twice[] = {5, 0, 1, 0, 0, 7, 0, 7, 3};
  static const unsigned char gen_off[] = {1, 1, 1, 1, 1, 0xff,
                                          7, 0, 8, 1, 7, 3};
  static const unsigned char link_live[] = {2, 5, 0, 3, 7, 0, 8, 0, 7, 0, 7, 3};
  static const unsigned char link_free[] = {2, 6, 1, 2, 7, 0};
  static const unsigned char link_nobody[] = {2,    7,    2, 1, 0xfe, 0xff,
                                              0xff, 0x7f, 7, 0, 7,    3};
  static const unsigned char link_bad_gen[] = {2, 8, 0, 7, 2, 9, 0, 13, 7, 0};
  static const unsigned char holes[] = {3, 3, 5, 2, 7, 0, 7, 1, 7, 0};
  static const unsigned char back[] = {3, 0xf0, 7, 0, 5, 0, 7, 0};
  static const unsigned char ctl_head[] = {4, 0, 0, 0, 0, 0, 0, 0, 0,
                                           1, 6, 0, 6, 1, 6, 2, 7, 3};
  static const unsigned char ctl_asleep[] = {
      4, 1, 7, 0, 0, 0, 0, 0, 0, 0, 6, 1, 4, 1, 1, 0, 0, 0, 0, 0, 0, 0, 6, 2};
  static const unsigned char ctl_closed[] = {4, 2, 1, 0, 0, 0, 0, 0,
                                             0, 0, 6, 0, 6, 0, 7, 3};
  static const unsigned char drops[] = {8, 0, 8, 1, 8, 2, 7, 3, 5, 0, 7, 0};
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  seed(argv[1], "write_hdr", write_hdr, sizeof write_hdr);
  seed(argv[1], "twice", twice, sizeof twice);
  seed(argv[1], "gen_off", gen_off, sizeof gen_off);
  seed(argv[1], "link_live", link_live, sizeof link_live);
  seed(argv[1], "link_free", link_free, sizeof link_free);
  seed(argv[1], "link_nobody", link_nobody, sizeof link_nobody);
  seed(argv[1], "link_bad_gen", link_bad_gen, sizeof link_bad_gen);
  seed(argv[1], "holes", holes, sizeof holes);
  seed(argv[1], "back", back, sizeof back);
  seed(argv[1], "ctl_head", ctl_head, sizeof ctl_head);
  seed(argv[1], "ctl_asleep", ctl_asleep, sizeof ctl_asleep);
  seed(argv[1], "ctl_closed", ctl_closed, sizeof ctl_closed);
  seed(argv[1], "drops", drops, sizeof drops);
  return 0;
}
#endif
