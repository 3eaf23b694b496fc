/* share_claims: forwarding slots that a claimer killed before it linked
 * them left live in a ledger's shared table, and how the reap (share_ctx)
 * frees them once the claimer is known gone. Under ctx->lock. */

#ifdef IPCREF__SHARING_IMPL

/* ---- forwarding slots a dead claimer left --------------------------------
 * A forwarder claims a forwarding slot (the compare-and-swap in
 * ipcref__lease_take_forward), writes its holder word (parent slot + 1,
 * holder pid), then takes its ring positions. Killed before it took them,
 * it leaves the slot live in the shared table with no link and no hole:
 * nothing adopts it, and each such death would take a forwarding slot from
 * the ledger for good (forwards fail with EBUSY once all are gone). The
 * reap frees such a slot once its claimer is known to be gone, never
 * before: a live claimer still pushes its link and sends the lease, which
 * must then be counted. What tells:
 *   - a claimer holds its parent lease from before its claim until its
 *     forward is done, and that lease's own link (if it is a forwarded one)
 *     was pushed before the claim. So once the ring is read to a head
 *     loaded after the slot, a live claimer's parent is live here;
 *   - the holder word of a free forwarding slot is 0 (ipcref__lease_end
 *     and ipcref__slot_unclaim clear it before the slot is free), so that
 *     of a live one is its claimer's, or 0 while the claimer has not
 *     written it: never a former holder's.
 * So a slot whose holder word names a parent that is not live was claimed
 * by a process now dead; one whose holder word is 0 by one of the
 * ledger's holders, unknown: it is freed once the ledger has no live
 * lease, which no live claimer allows. (Which holder it was cannot be
 * told: the claim names nobody. A claim that named its claimer first, its
 * holder word taken by compare-and-swap from 0 before the slot, would be
 * a change of the protocol that every forwarder and producer shares.) A
 * link that still comes for a freed slot (forged: no live claimer is left
 * to push it) names a generation the slot no longer has, and
 * ipcref__ring_link refuses it. Under the lock. */

/* 1 when the claimer of forwarding slot `s` of `l` (live in the shared
 * table, unknown here) is gone, as above. */
IPCREF__PRIVATE int ipcref__claimer_gone(const ipcref__ledger *l, uint32_t s) {
  const ipcref__ledger_hdr *h = (const ipcref__ledger_hdr *)(void *)l->base;
  const uint64_t *slots = ipcref__ledger_slots(l->base);
  uint64_t w = __atomic_load_n(&slots[2 * (size_t)s + 1], __ATOMIC_ACQUIRE);
  uint32_t parent = (uint32_t)(w >> 32);
  /* Acquire, after the slot's word (read by the caller, acquire): a link
   * pushed before the claim lies before this head. */
  if (__atomic_load_n(&h->head, __ATOMIC_ACQUIRE) != l->tail) return 0;
  if (parent == 0 || parent > l->n) return l->live == 0; /* unknown */
  return !l->leases[parent - 1].block;
}

/* Frees forwarding slot `s` of `l`, live in the shared table at word `w`:
 * its holder word cleared first (release: before the slot is free). */
IPCREF__PRIVATE void ipcref__slot_unclaim(ipcref__ledger *l, uint32_t s,
                                          uint64_t w) {
  uint64_t *slots = ipcref__ledger_slots(l->base);
  __atomic_store_n(&slots[2 * (size_t)s + 1], 0, __ATOMIC_RELAXED);
  (void)__atomic_compare_exchange_n(&slots[2 * (size_t)s], &w,
                                    (w & ~(uint64_t)3) | IPCREF__SLOT_FREE, 0,
                                    __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

/* Frees the forwarding slots of `l` that a dead claimer left (the reap,
 * after the rings were read and the dead's leases reclaimed). */
IPCREF__PRIVATE void ipcref__forwards_lost(ipcref__ledger *l) {
  const uint64_t *slots = ipcref__ledger_slots(l->base);
  uint32_t s;
  for (s = l->n / 2; s < l->n; s++) {
    uint64_t w = __atomic_load_n(&slots[2 * (size_t)s], __ATOMIC_ACQUIRE);
    if ((w & 3u) == IPCREF__SLOT_LIVE && !l->leases[s].block &&
        ipcref__claimer_gone(l, s))
      ipcref__slot_unclaim(l, s, w);
  }
}

#endif /* IPCREF__SHARING_IMPL */
