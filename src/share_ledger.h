/* share_ledger: the counter files. Their layout, shared with every
 * process that holds a lease, and the ring push by which a consumer
 * returns one (lock-free, no lock: ipcref__ring_push); the producer's
 * side: making and destroying ledgers, ending and reclaiming leases,
 * linking and adopting forwarded leases, stepping over holes a killed
 * writer left, draining the return ring, and the sweep, under ctx->lock. */

#ifdef IPCREF__SHARING_IMPL

/* ---- layout of a ledger (counter file), shared with every process that
 * maps it. All fields little endian (the host's: peers share a machine).
 *
 *   header   64 bytes: magic, version, nslots, origin pid, origin nonce,
 *            ledger id, `head`, the ring's write position, and `waiting`,
 *            set while the producer waits for returns
 *   slots    nslots x { u64 (generation << 2) | state, u64 holder: its pid,
 *            and for a forwarded lease the parent slot + 1 << 32 (0 while
 *            a forwarding slot is free) }
 *   ring     2 * nslots x u64: returned and linked leases, in order
 *
 * The producer allocates slots [0, nslots/2), each published live (its
 * generation moved on, its holder written) a few leases before a lease
 * takes it (see "slots published ahead"); forwarders claim slots in
 * [nslots/2, nslots) with a compare-and-swap. A consumer returns a lease
 * by taking a ring position (one fetch_add) and storing the entry there:
 * no system call, no lock; only while `waiting` is set does it also send
 * a byte on the producer's bell (its fd came with the ledger's). The
 * producer reads the ring from its private tail, so a sweep costs what
 * was returned since the last one. */
#define IPCREF__LEDGER_MAGIC   0x4c465249u /* "IRFL" */
#define IPCREF__LEDGER_VERSION 2u
#define IPCREF__LEDGER_HDR     64u
#define IPCREF__SLOT_FREE      0u
#define IPCREF__SLOT_LIVE      1u
#define IPCREF__RING_RELEASE   0u /* entry: a lease came back */
#define IPCREF__RING_LINK      1u /* entry pair: a forwarded lease */
#define IPCREF__RING_PARENT    2u /* second half of a link */
#define IPCREF__RING_REFUSED   3u /* entry: a lease given back unused */

typedef struct ipcref__ledger_hdr {
  uint32_t magic, version, nslots, origin_pid;
  uint64_t origin_nonce, ledger_id;
  uint64_t head;    /* atomic: next ring position */
  uint64_t waiting; /* atomic: 1 while the producer waits for returns (a
                       returner then rings its bell, see ring_push) */
  uint64_t reserved[2];
} ipcref__ledger_hdr;

/* A ring entry: slot + 1 in bits 0..29 (0 marks "not written yet"), the
 * kind in bits 30..31, the generation in bits 32..63. */
IPCREF__PRIVATE uint64_t ipcref__ring_entry(uint32_t kind, uint32_t slot,
                                            uint32_t gen) {
  return ((uint64_t)gen << 32) | ((uint64_t)kind << 30) | (slot + 1u);
}

/* A ledger's slots and ring in its mapping at `base`, and its size for n
 * slots. */
IPCREF__PRIVATE uint64_t *ipcref__ledger_slots(unsigned char *base) {
  return (uint64_t *)(void *)(base + IPCREF__LEDGER_HDR);
}
IPCREF__PRIVATE uint64_t *ipcref__ledger_ring(unsigned char *base, uint32_t n) {
  return (uint64_t *)(void *)(base + IPCREF__LEDGER_HDR + (size_t)n * 16);
}
IPCREF__PRIVATE size_t ipcref__ledger_bytes(uint32_t n) {
  return IPCREF__LEDGER_HDR + (size_t)n * 16 + (size_t)n * 16;
}

/* Pushes entries to a ledger's ring: what a consumer does to return a
 * lease (and a forwarder to link one). Lock-free, no system call. A
 * process that dies between taking its positions and writing them leaves
 * a hole, which the producer's sweep steps over once it is stale (see
 * ipcref__hole_stale). `step` labels the moment for the test hook. */
IPCREF__PRIVATE void ipcref__ring_push(unsigned char *base, uint32_t n,
                                       int bell, const uint64_t *e, int count,
                                       const char *step) {
  ipcref__ledger_hdr *h = (ipcref__ledger_hdr *)(void *)base;
  uint64_t *ring = ipcref__ledger_ring(base, n);
  /* Release: a forwarder's slot, written before, is seen by the producer
   * that reads this head (see ipcref__adopt_forwards). */
  uint64_t pos =
      __atomic_fetch_add(&h->head, (uint64_t)count, __ATOMIC_RELEASE);
  int i;
  (void)step;
  if (step) IPCREF__STEP(step);
  /* Release: everything this process did with the data happens before the
   * producer sees the entry and frees the block. */
  for (i = 0; i < count; i++)
    __atomic_store_n(&ring[(pos + (uint64_t)i) % (2u * (uint64_t)n)], e[i],
                     __ATOMIC_RELEASE);
  /* Seq-cst, paired with the producer's in ipcref__room_arm: either this
   * load sees it waiting, or its look at the ring after arming sees these
   * entries. A full bell (EAGAIN) has a wake-up pending already. */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (bell >= 0 && __atomic_load_n(&h->waiting, __ATOMIC_RELAXED))
    (void)send(bell, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Destroys a ledger nobody can use any more: its watches go, its counter
 * file is unmapped and closed (under the lock). */
IPCREF__PRIVATE void ipcref__ledger_destroy(ipcref_ctx *ctx,
                                            ipcref__ledger *l) {
  uint32_t s;
  IPCREF__LIST_REMOVE(ctx->ledgers, l, next, prev);
  for (s = l->n / 2; s < l->n; s++) ipcref__watch_put(ctx, l->leases[s].watch);
  ipcref__watch_put(ctx, l->watch);
  munmap(l->base, ipcref__ledger_bytes(l->n));
  close(l->fd);
  ctx->st.counter_files--;
  IPCREF_FREE(l->leases);
  IPCREF_FREE(l->free_stack);
  IPCREF_FREE(l);
}

/* The context's bell, made with it: a non-blocking datagram socketpair. Every
 * ledger travels with bell_tx; a consumer that returns a lease while the ledger
 * says `waiting` sends a byte on it, and bell_rx becomes readable: what a
 * producer waiting for room sleeps on (see share_loop). 0 when it cannot be
 * made. */
IPCREF__PRIVATE int ipcref__bell_make(ipcref_ctx *ctx) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) !=
      0)
    return 0;
  ctx->bell_rx = sv[0];
  ctx->bell_tx = sv[1];
  return 1;
}

/* Sets (on 1) or clears the `waiting` word of every ledger made here
 * (under the lock). Seq-cst, paired with the fence in ipcref__ring_push:
 * a return pushed before this store is seen by the sweep the caller runs
 * next; one after it rings the bell. */
IPCREF__PRIVATE void ipcref__room_arm(ipcref_ctx *ctx, int on) {
  ipcref__ledger *l;
  if (ctx->room_armed == on) return;
  __atomic_store_n(&ctx->room_armed, on, __ATOMIC_RELAXED);
  for (l = ctx->ledgers; l; l = l->next)
    __atomic_store_n(&((ipcref__ledger_hdr *)(void *)l->base)->waiting,
                     (uint64_t)on, __ATOMIC_SEQ_CST);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* Arms the ledgers while anything waits for room: an allocation refused
 * under max_bytes, a peer's send refused under its max_bytes_held (under
 * the lock). The caller sweeps after arming, so that no return slips
 * between its look and the arming. */
IPCREF__PRIVATE void ipcref__room_update(ipcref_ctx *ctx) {
  ipcref_peer *p;
  int need = ctx->room_alloc;
  for (p = ctx->peers; p && !need; p = p->next) need = p->room_wait;
  ipcref__room_arm(ctx, need);
}

#define IPCREF__ROOM_MS 100 /* longest sleep between looks while waiting */

/* A new ledger for peer p. Each one a peer gets is twice the size of its
 * last (up to 2^22 slots), so a peer holding n leases needs O(log n)
 * ledgers, and a sweep, which looks at every ledger, stays cheap. */
IPCREF__PRIVATE ipcref_result ipcref__ledger_new(ipcref_ctx *ctx,
                                                 ipcref_peer *p,
                                                 ipcref__ledger **out) {
  uint32_t n = ctx->opt.ledger_slots, i;
  size_t bytes;
  ipcref__ledger *l;
  ipcref__ledger_hdr *h;
  ipcref_result r = IPCREF_ENOMEM;
  if (p && p->ledger && p->ledger->n < (1u << 22)) n = p->ledger->n * 2;
  bytes = ipcref__ledger_bytes(n);
  l = (ipcref__ledger *)ipcref__zalloc(sizeof *l);
  if (!l) return IPCREF_ENOMEM;
  l->leases = (ipcref__lease *)ipcref__zalloc(n * sizeof *l->leases);
  l->free_stack = (uint32_t *)ipcref__zalloc(n / 2 * sizeof(uint32_t));
  if (!l->leases || !l->free_stack) goto fail;
  /* Consumers write their returns into it: no write seal. */
  l->fd = ipcref__memfd("ipcref-ledger", bytes, 0, &l->base);
  r = IPCREF_ESYS;
  if (l->fd < 0) goto fail;
  l->n = n;
  l->id = ++ctx->next_id;
  l->peer = p;
  if (p) l->holder = p->hello > 0 ? p->pid : 0;
  if (p && p->watch) { /* the same process as the peer's */
    l->watch = p->watch;
    l->watch->refs++;
  }
  for (i = 0; i < n / 2; i++) l->free_stack[i] = n / 2 - 1 - i;
  l->nfree = n / 2;
  h = (ipcref__ledger_hdr *)(void *)l->base;
  h->magic = IPCREF__LEDGER_MAGIC;
  h->version = IPCREF__LEDGER_VERSION;
  h->nslots = n;
  h->origin_pid = (uint32_t)ctx->pid;
  h->origin_nonce = ctx->nonce;
  h->ledger_id = l->id;
  h->waiting = (uint64_t)ctx->room_armed;
  IPCREF__LIST_PUSH(ctx->ledgers, l, next, prev);
  ctx->st.counter_files++;
  *out = l;
  return IPCREF_OK;
fail:
  IPCREF_FREE(l->leases);
  IPCREF_FREE(l->free_stack);
  IPCREF_FREE(l);
  return r;
}

/* Ends lease (slot, gen) of ledger `l` (under the lock): the slot is free
 * again at the same generation (the next lease on it takes the next one,
 * so a replay of this one is refused), and the block goes when nothing
 * else holds it. 0 when there is no such live lease. */
IPCREF__PRIVATE int ipcref__lease_end(ipcref_ctx *ctx, ipcref__ledger *l,
                                      uint32_t slot, uint32_t gen,
                                      size_t *freed) {
  uint64_t *slots = ipcref__ledger_slots(l->base);
  ipcref__block *b;
  if (slot >= l->n || !l->leases[slot].block || l->leases[slot].gen != gen)
    return 0;
  b = l->leases[slot].block;
  l->leases[slot].block = NULL;
  ipcref__watch_put(ctx, l->leases[slot].watch);
  l->leases[slot].watch = NULL;
  if (l->leases[slot].event)
    l->leases[slot].be->event_free(l->leases[slot].be, l->leases[slot].event);
  l->leases[slot].event = NULL;
  if (l->leases[slot].alias) ipcref__alias_drop(ctx, l->leases[slot].alias);
  l->leases[slot].alias = NULL;
  l->live--;
  if (slot < l->n / 2 && l->peer) l->peer->held_bytes -= b->size;
  /* A forwarding slot's holder word is cleared (see share_claims), before
   * the slot's word says free: its release store orders the two. */
  if (slot >= l->n / 2)
    __atomic_store_n(&slots[2 * (size_t)slot + 1], 0, __ATOMIC_RELAXED);
  __atomic_store_n(&slots[2 * (size_t)slot],
                   ((uint64_t)gen << 2) | IPCREF__SLOT_FREE, __ATOMIC_RELEASE);
  if (slot < l->n / 2) l->free_stack[l->nfree++] = slot;
  *freed += ipcref__block_unlease(ctx, b);
  return 1;
}

/* Ends lease `slot` of ledger `l` because its holder died (under the
 * lock). Its generation is remembered: a return of it that comes later
 * (a forwarder cancelling a send to the dead one) is late, not forged. */
IPCREF__PRIVATE void ipcref__lease_reclaim(ipcref_ctx *ctx, ipcref__ledger *l,
                                           uint32_t slot, size_t *freed) {
  uint32_t gen = l->leases[slot].gen;
  if (!l->leases[slot].block || !ipcref__lease_end(ctx, l, slot, gen, freed))
    return;
  l->leases[slot].reclaimed = gen + 1u;
  ctx->st.reclaimed++;
}

/* ---- slots published ahead ----------------------------------------------
 * A lease's slot is published live (its generation moved on, its holder
 * written) IPCREF__AHEAD leases before the lease takes it: the consumer's
 * import then checks a line written a few hand-offs before, where a slot
 * published as its lease was taken crossed to the consumer again on the
 * hand-off's path (a spinning hand-off about 8% faster: bench/lines.c).
 * A slot published and not taken has no block: a return of it is refused
 * as a forged one, a death reclaims nothing of it, no stat counts it. A
 * record that names one is the producer's own lie, which costs only the
 * producer, as any other (see share_import). Under the lock. */

/* Publishes the free slot on top of `l`'s stack for holder `pid`, at the
 * generation after its last lease's. The generation is kept here, in the
 * private lease table (the slot is free: no block), never read back from
 * the shared word, which a consumer can write. */
IPCREF__PRIVATE void ipcref__slot_publish(ipcref__ledger *l, int pid) {
  uint64_t *slots = ipcref__ledger_slots(l->base);
  uint32_t s = l->free_stack[--l->nfree], gen = ++l->leases[s].gen;
  slots[2 * (size_t)s + 1] = (uint64_t)(uint32_t)pid; /* holder */
  /* Release: the holder before the state that makes the slot live. */
  __atomic_store_n(&slots[2 * (size_t)s],
                   ((uint64_t)gen << 2) | IPCREF__SLOT_LIVE, __ATOMIC_RELEASE);
  l->ahead[(l->ahead_at + l->nahead++) % IPCREF__AHEAD] = s;
}

/* 1 when ledger `l` has a slot for a lease. */
IPCREF__PRIVATE int ipcref__ledger_room(const ipcref__ledger *l) {
  return l->nfree + l->nahead > 0;
}

/* Publishes slots of `l` until IPCREF__AHEAD of them are, or none is
 * free. A send calls it once its record has left (ipcref__send_views): a
 * store into a line the consumer read, made before the record's, would
 * hold the record back until it had crossed (so, no faster than a slot
 * published as its lease is taken). */
IPCREF__PRIVATE void ipcref__slots_top_up(ipcref__ledger *l, int pid) {
  while (l->nahead < IPCREF__AHEAD && l->nfree) ipcref__slot_publish(l, pid);
}

/* The slot for a lease of `l` (which has room), published live already
 * (now, when none was), and its generation in *gen. */
IPCREF__PRIVATE uint32_t ipcref__slot_take(ipcref__ledger *l, int pid,
                                           uint32_t *gen) {
  uint32_t s;
  if (l->nahead == 0) ipcref__slot_publish(l, pid);
  s = l->ahead[l->ahead_at];
  l->ahead_at = (l->ahead_at + 1u) % IPCREF__AHEAD;
  l->nahead--;
  *gen = l->leases[s].gen;
  return s;
}

/* A ring entry refused (under the lock): counted, and reported to the
 * context's hook (the first 8, then the 16th, 32nd, ...: a consumer that
 * fills its ring with lies every sweep must not flood the log). Never a
 * free: the private lease table decides. */
IPCREF__PRIVATE void ipcref__bad_return(ipcref_ctx *ctx, const char *what) {
  uint64_t n = ++ctx->st.bad_returns;
  if (n <= 8 || (n & (n - 1)) == 0)
    ipcref__ctx_report(ctx, IPCREF_EPROTO, what);
}

/* Records a forwarded lease (slot, gen) on block `b`, held by `holder`
 * (under the lock). */
IPCREF__PRIVATE void ipcref__lease_link(ipcref_ctx *ctx, ipcref__ledger *l,
                                        uint32_t slot, uint32_t gen,
                                        ipcref__block *b, int holder) {
  l->leases[slot].block = b;
  l->leases[slot].gen = gen;
  l->leases[slot].holder = holder;
  l->leases[slot].watch = ipcref__watch_get(ctx, holder, 1);
  __atomic_store_n(&b->leases, b->leases + 1u, __ATOMIC_RELAXED);
  l->live++;
  ctx->st.live_slots++;
}

/* Adopts the forwarded leases whose link the ring has not delivered
 * (under the lock): every forwarding slot that is live in the shared
 * table, unknown here, and names a live parent. A forwarder writes the
 * slot (holder pid, parent slot + 1) before it takes its ring positions,
 * so when a hole is stepped over its link is found here, before any later
 * entry (the parent's own return comes later) is read. A link that
 * arrives after all is then taken as already known. */
IPCREF__PRIVATE void ipcref__adopt_forwards(ipcref_ctx *ctx,
                                            ipcref__ledger *l) {
  uint64_t *slots = ipcref__ledger_slots(l->base);
  uint32_t s;
  for (s = l->n / 2; s < l->n; s++) {
    uint64_t w = __atomic_load_n(&slots[2 * (size_t)s], __ATOMIC_ACQUIRE), h;
    uint32_t parent;
    if ((w & 3u) != IPCREF__SLOT_LIVE || l->leases[s].block) continue;
    h = __atomic_load_n(&slots[2 * (size_t)s + 1], __ATOMIC_ACQUIRE);
    parent = (uint32_t)(h >> 32);
    if (parent == 0 || parent > l->n || !l->leases[parent - 1].block)
      continue; /* not written yet (its link will come), or never linked */
    ipcref__lease_link(ctx, l, s, (uint32_t)(w >> 2),
                       l->leases[parent - 1].block, (int)(uint32_t)h);
  }
}

/* A hole at the ring's tail: a position taken whose entry is not written.
 * Normally its writer is between two instructions and the next sweep
 * finds it; but a writer killed there never writes it, and every entry
 * behind it would wait forever. So a hole is stepped over at once when it
 * lies before the head the ring had when a death was reaped (its writer
 * may be the dead one), and otherwise once it is 100 ms old. Stepping over
 * a live writer's hole frees nothing early: the forwarded leases it may
 * have been linking are adopted from the shared slots at once, and its
 * position is remembered, so an entry written late is still read (unless
 * the ring has come round to that cell again by then, when a return is
 * lost and its block stays until its holder dies).
 *
 * The hole at ring position `pos` is remembered by that position (+ 1),
 * whatever the drain was looking at (a link's second half is one past the
 * tail), and timed from when it was first seen: so ipcref__hole_due tells
 * an event loop when it is due. 1 when it is to be stepped over now. */
IPCREF__PRIVATE int ipcref__hole_stale(ipcref__ledger *l, uint64_t pos) {
  long now = ipcref__now_ms();
  if (l->hole_pos != pos + 1) {
    l->hole_pos = pos + 1;
    l->hole_ms = now;
  }
  return pos < l->death_head || now - l->hole_ms >= IPCREF__HOLE_MS;
}

/* When the hole that ledger `l`'s drain stopped at is due to be stepped
 * over, in *due (a time of ipcref__now_ms; `now` for one a death made
 * stale, left to the next sweep by the IPCREF__HOLES bound): 1, or 0 when
 * the drain waits on no hole. The hole is the one ipcref__hole_stale
 * remembered: at the tail, or one past it (a link whose second half is
 * the hole), and still not written. Under the lock, after a sweep. */
IPCREF__PRIVATE int ipcref__hole_due(const ipcref__ledger *l, long now,
                                     long *due) {
  const ipcref__ledger_hdr *h = (const ipcref__ledger_hdr *)(void *)l->base;
  const uint64_t *ring = ipcref__ledger_ring(l->base, l->n);
  uint64_t head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
  uint64_t pos = l->hole_pos - 1;
  if (l->hole_pos == 0 || pos < l->tail || pos > l->tail + 1 || pos >= head ||
      __atomic_load_n(&ring[pos % (2u * (uint64_t)l->n)], __ATOMIC_ACQUIRE))
    return 0;
  *due = pos < l->death_head ? now : l->hole_ms + IPCREF__HOLE_MS;
  return 1;
}

/* Steps over the hole at ring position `pos` (under the lock). */
IPCREF__PRIVATE void ipcref__hole_skip(ipcref_ctx *ctx, ipcref__ledger *l,
                                       uint64_t pos) {
  if (l->nlate == IPCREF__LATE) { /* forget the oldest */
    memmove(l->late, l->late + 1, (IPCREF__LATE - 1) * sizeof l->late[0]);
    l->nlate--;
  }
  l->late[l->nlate++] = pos;
  ipcref__adopt_forwards(ctx, l);
}

/* A lease of ours came back refused (IPCREF__RING_REFUSED): its consumer
 * may not have kept what the message brought, so the peer is sent the fds
 * of the lease's segment and ledger again with its next view of them (an
 * fd for what it has mapped is closed there). */
IPCREF__PRIVATE void ipcref__lease_refused(ipcref_ctx *ctx, ipcref__ledger *l,
                                           uint32_t slot, uint32_t gen) {
  const ipcref__block *b;
  if (slot >= l->n / 2 || !l->peer || !l->leases[slot].block ||
      l->leases[slot].gen != gen)
    return;
  b = l->leases[slot].block;
  ipcref__sent_resend(l->peer, ctx->nonce, ipcref__sent_key(b->seg->id, 0));
  ipcref__sent_resend(l->peer, ctx->nonce, ipcref__sent_key(l->id, 1));
}

/* One ring entry that is not a link (under the lock). */
IPCREF__PRIVATE void ipcref__ring_release(ipcref_ctx *ctx, ipcref__ledger *l,
                                          uint64_t e, size_t *freed) {
  uint32_t slot = (uint32_t)(e & 0x3fffffffu) - 1u, gen = (uint32_t)(e >> 32);
  uint32_t kind = (uint32_t)(e >> 30) & 3u;
  if (kind == IPCREF__RING_REFUSED) ipcref__lease_refused(ctx, l, slot, gen);
  if (kind != IPCREF__RING_RELEASE && kind != IPCREF__RING_REFUSED) {
    ipcref__bad_return(ctx, "invalid lease return in a ledger");
  } else if (ipcref__lease_end(ctx, l, slot, gen, freed)) {
    return;
  } else if (slot < l->n && l->leases[slot].reclaimed == gen + 1u) {
    l->leases[slot].reclaimed = 0; /* late, once: a second one is forged */
    ctx->st.late_returns++;
  } else {
    ipcref__bad_return(ctx, "invalid lease return in a ledger");
  }
}

/* Entries written late into holes stepped over (under the lock): a return
 * is taken as any other; half a link is known already (adopted). A cell
 * is watched until the ring's head reaches its next lap. */
IPCREF__PRIVATE void ipcref__late_entries(ipcref_ctx *ctx, ipcref__ledger *l,
                                          uint64_t head, size_t *freed) {
  uint64_t *ring = ipcref__ledger_ring(l->base, l->n);
  uint64_t cap = 2u * (uint64_t)l->n;
  uint32_t i = 0;
  while (i < l->nlate) {
    uint64_t pos = l->late[i], e = 0;
    if (head <= pos + cap) {
      e = __atomic_load_n(&ring[pos % cap], __ATOMIC_ACQUIRE);
      if (e == 0) {
        i++;
        continue;
      }
      __atomic_store_n(&ring[pos % cap], 0, __ATOMIC_RELAXED);
    }
    l->late[i] = l->late[--l->nlate];
    if (e && (((e >> 30) & 3u) == IPCREF__RING_RELEASE ||
              ((e >> 30) & 3u) == IPCREF__RING_REFUSED))
      ipcref__ring_release(ctx, l, e, freed);
  }
}

/* A link pair read off ledger `l`'s ring (under the lock): entry `e` names
 * a forwarded lease, `p` its parent. Checked against the lease table as a
 * return is; a valid one counts the forwarded lease on its parent's block
 * (one that was adopted while its link was a hole is already counted). */
IPCREF__PRIVATE void ipcref__ring_link(ipcref_ctx *ctx, ipcref__ledger *l,
                                       uint64_t e, uint64_t p) {
  uint64_t *slots = ipcref__ledger_slots(l->base);
  uint32_t slot = (uint32_t)(e & 0x3fffffffu) - 1u, gen = (uint32_t)(e >> 32);
  uint32_t ps = (uint32_t)(p & 0x3fffffffu) - 1u;
  ipcref__lease *parent = ps < l->n ? &l->leases[ps] : NULL;
  if (slot >= l->n / 2 && slot < l->n && l->leases[slot].block &&
      l->leases[slot].gen == gen && parent &&
      parent->block == l->leases[slot].block)
    return; /* adopted already */
  if (((p >> 30) & 3u) != IPCREF__RING_PARENT || slot < l->n / 2 ||
      slot >= l->n || l->leases[slot].block || !parent || !parent->block ||
      parent->gen != (uint32_t)(p >> 32) ||
      __atomic_load_n(&slots[2 * (size_t)slot], __ATOMIC_ACQUIRE) !=
          (((uint64_t)gen << 2) | IPCREF__SLOT_LIVE)) {
    ipcref__bad_return(ctx, "invalid forwarded lease in a ledger");
    return;
  }
  /* The holder, as the forwarder wrote it before the link. */
  ipcref__lease_link(ctx, l, slot, gen, parent->block,
                     (int)(uint32_t)__atomic_load_n(
                         &slots[2 * (size_t)slot + 1], __ATOMIC_RELAXED));
}

/* Reads what came back to ledger `l` since the last sweep (under the
 * lock). Every entry is checked against the private lease table: a
 * ledger can only end its own peer's leases, and a stale, replayed or
 * forged entry (a second return of one lease, a return from a process
 * that died and was reclaimed) is reported and ignored: a count can never
 * go below zero. Returns the bytes freed. */
IPCREF__PRIVATE size_t ipcref__ledger_drain(ipcref_ctx *ctx,
                                            ipcref__ledger *l) {
  ipcref__ledger_hdr *h = (ipcref__ledger_hdr *)(void *)l->base;
  uint64_t *ring = ipcref__ledger_ring(l->base, l->n);
  uint64_t cap = 2u * (uint64_t)l->n;
  /* Acquire: pairs with the release of a writer's fetch_add, so what it
   * wrote before taking its positions (a forwarded slot) is seen. */
  uint64_t head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
  size_t freed = 0;
  int holes = 0; /* stepped over: each scans the forwarding slots */
  if (l->nlate) ipcref__late_entries(ctx, l, head, &freed);
  if (head == l->tail) return freed;
  IPCREF__STEP("sweep");
  if (head - l->tail > cap) { /* a consumer wrote past the ring: distrust */
    ipcref__bad_return(ctx, "ledger ring overrun by a peer");
    l->tail = head - cap;
  }
  while (l->tail != head) {
    uint64_t *cell = &ring[l->tail % cap], *next = &ring[(l->tail + 1) % cap];
    uint64_t e = __atomic_load_n(cell, __ATOMIC_ACQUIRE), p;
    if (e == 0) { /* taken but not written (yet): remembered, then waited
                     for, or stepped over (at most IPCREF__HOLES a drain) */
      if (!ipcref__hole_stale(l, l->tail) || holes == IPCREF__HOLES) break;
      ipcref__hole_skip(ctx, l, l->tail++);
      holes++;
      continue;
    }
    if (((e >> 30) & 3u) != IPCREF__RING_LINK) {
      __atomic_store_n(cell, 0, __ATOMIC_RELAXED);
      l->tail++;
      ipcref__ring_release(ctx, l, e, &freed);
      continue;
    }
    /* A link: two entries, the forwarded lease and its parent. */
    if (l->tail + 1 == head) break; /* the pair is not complete yet */
    p = __atomic_load_n(next, __ATOMIC_ACQUIRE);
    if (p == 0) { /* its second half is a hole: wait, or step over both */
      if (!ipcref__hole_stale(l, l->tail + 1) || holes == IPCREF__HOLES) break;
      __atomic_store_n(cell, 0, __ATOMIC_RELAXED);
      ipcref__hole_skip(ctx, l, l->tail + 1);
      holes++;
      l->tail += 2;
      continue;
    }
    __atomic_store_n(next, 0, __ATOMIC_RELAXED);
    __atomic_store_n(cell, 0, __ATOMIC_RELAXED);
    l->tail += 2;
    ipcref__ring_link(ctx, l, e, p);
  }
  return freed;
}

/* The sweep (under the lock): every ledger's returns, then the ledgers
 * that nobody can use any more. */
IPCREF__PRIVATE size_t ipcref__sweep(ipcref_ctx *ctx) {
  ipcref__ledger *l, *next;
  size_t freed = 0;
  ctx->st.sweeps++;
  for (l = ctx->ledgers; l; l = next) {
    next = l->next;
    freed += ipcref__ledger_drain(ctx, l);
    if (!l->peer && l->live == 0) ipcref__ledger_destroy(ctx, l);
  }
  return freed;
}

/* share_loop's: tells peers waiting for room that came (after a read of
 * the bell for `self`). */
IPCREF__PRIVATE void ipcref__bell_pass(ipcref_ctx *ctx,
                                       const ipcref_peer *self);

/* Reads what rang the bell for `self` (see ipcref__bell_pass; not under
 * the lock; never waits): it stays readable until someone does. */
IPCREF__PRIVATE void ipcref__bell_drain_for(ipcref_ctx *ctx,
                                            const ipcref_peer *self) {
  char b[16];
  int i, rung = 0; /* at most 64: a consumer that keeps ringing must not
                      keep us */
  for (i = 0; ctx->bell_rx >= 0 && i < 64; i++) {
    if (recv(ctx->bell_rx, b, sizeof b, MSG_DONTWAIT) <= 0) break;
    rung = 1;
  }
  if (rung) ipcref__bell_pass(ctx, self);
}

/* The same for the context: an allocation, or a wait on its room fd. */
IPCREF__PRIVATE void ipcref__bell_drain(ipcref_ctx *ctx) {
  ipcref__bell_drain_for(ctx, NULL);
}

#endif /* IPCREF__SHARING_IMPL */
