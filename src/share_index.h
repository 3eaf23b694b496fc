/* share_index: what a hand-off looks up, found in constant time however
 * many segments a process shares. A consumer's mappings, by origin and id
 * (a hash table over ctx->maps and ctx->maps_retired, chained through
 * `hnext`; retired mappings on a list of their own, so that a receive's
 * trim looks at those alone), and what each peer's messages keep mapped,
 * for its caps; what each peer has been sent (an open-addressing set in
 * the peer). All under ctx->lock. Out of memory, the mappings are found
 * by walking their lists instead (correct, only slower), and a peer's set
 * says so to its caller (*fail). */

#ifdef IPCREF__SHARING_IMPL

/* A 64-bit mix of a key (a finalizer of splitmix64's). */
IPCREF__PRIVATE uint64_t ipcref__hash3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = a ^ (b * 0x9e3779b97f4a7c15u) ^ (c * 0xc2b2ae3d27d4eb4fu);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9u;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebu;
  return h ^ (h >> 31);
}

/* ---- mappings -------------------------------------------------------------
 * A lookup asks for a ledger or a segment; a segment is host or device
 * memory, so the table's key is (is a ledger, origin nonce, id). */

IPCREF__PRIVATE size_t ipcref__map_bucket(const ipcref_ctx *ctx, int ledger,
                                          uint64_t nonce, uint64_t id) {
  return (size_t)(ipcref__hash3((uint64_t)ledger, nonce, id) &
                  (ctx->map_buckets - 1));
}

/* Gives up the table for good (out of memory): lookups walk the lists. */
IPCREF__PRIVATE void ipcref__map_index_drop(ipcref_ctx *ctx) {
  IPCREF_FREE(ctx->map_index);
  ctx->map_index = NULL;
  ctx->map_buckets = 0;
  ctx->map_index_off = 1;
}

/* Rehashes into twice the buckets (16 at first). 0 when out of memory. */
IPCREF__PRIVATE int ipcref__map_index_grow(ipcref_ctx *ctx) {
  size_t n = ctx->map_buckets ? 2 * ctx->map_buckets : 16, i, old;
  ipcref__map **t = (ipcref__map **)ipcref__zalloc(n * sizeof *t), **prev;
  if (!t) return 0;
  prev = ctx->map_index;
  old = ctx->map_buckets;
  ctx->map_index = t;
  ctx->map_buckets = n;
  for (i = 0; i < old; i++)
    while (prev[i]) {
      ipcref__map *m = prev[i];
      size_t b = ipcref__map_bucket(ctx, m->kind == IPCREF__KIND_LEDGER,
                                    m->origin_nonce, m->id);
      prev[i] = m->hnext;
      m->hnext = t[b];
      t[b] = m;
    }
  IPCREF_FREE(prev);
  return 1;
}

/* A mapping joins the cache: its list, and the table. */
IPCREF__PRIVATE void ipcref__map_index_add(ipcref_ctx *ctx, ipcref__map *m) {
  size_t b;
  IPCREF__LIST_PUSH(ctx->maps, m, next, prev);
  m->hnext = NULL;
  if (ctx->map_index_off) return;
  /* A full table grows; one that cannot still takes it, in longer chains. */
  if (ctx->nmaps_indexed >= ctx->map_buckets && !ipcref__map_index_grow(ctx) &&
      !ctx->map_buckets) {
    ipcref__map_index_drop(ctx);
    return;
  }
  b = ipcref__map_bucket(ctx, m->kind == IPCREF__KIND_LEDGER, m->origin_nonce,
                         m->id);
  m->hnext = ctx->map_index[b];
  ctx->map_index[b] = m;
  ctx->nmaps_indexed++;
}

/* A mapping leaves the table (lookups no longer find it), not its list. */
IPCREF__PRIVATE void ipcref__map_unhash(ipcref_ctx *ctx, ipcref__map *m) {
  ipcref__map **pp;
  if (ctx->map_last[0] == m) ctx->map_last[0] = NULL;
  if (ctx->map_last[1] == m) ctx->map_last[1] = NULL;
  if (ctx->map_index_off) return;
  pp = &ctx->map_index[ipcref__map_bucket(ctx, m->kind == IPCREF__KIND_LEDGER,
                                          m->origin_nonce, m->id)];
  while (*pp && *pp != m) pp = &(*pp)->hnext;
  if (*pp) {
    *pp = m->hnext;
    ctx->nmaps_indexed--;
  }
}

/* A mapping leaves the cache: its list, and the table. */
IPCREF__PRIVATE void ipcref__map_index_del(ipcref_ctx *ctx, ipcref__map *m) {
  if (m->retired)
    IPCREF__LIST_REMOVE(ctx->maps_retired, m, next, prev);
  else
    IPCREF__LIST_REMOVE(ctx->maps, m, next, prev);
  ipcref__map_unhash(ctx, m);
}

/* Its origin destroyed the segment: it moves to the retired list, where
 * the trim finds it (and a view of it is refused). */
IPCREF__PRIVATE void ipcref__map_retire(ipcref_ctx *ctx, ipcref__map *m) {
  if (m->retired) return;
  IPCREF__LIST_REMOVE(ctx->maps, m, next, prev);
  m->retired = 1;
  IPCREF__LIST_PUSH(ctx->maps_retired, m, next, prev);
}

/* Another mapping takes `m`'s place (see ipcref__map_displaced): it leaves
 * the table at once (with the table off, lookups walk the live list
 * first), and goes as a retired one does, once unused. */
IPCREF__PRIVATE void ipcref__map_displace(ipcref_ctx *ctx, ipcref__map *m) {
  ipcref__map_retire(ctx, m);
  ipcref__map_unhash(ctx, m);
}

/* 1 when mapping `m` is what a lookup of (kind, nonce, id) asks for: a
 * segment lookup finds host and device segments. */
IPCREF__PRIVATE int ipcref__map_is(const ipcref__map *m, int kind,
                                   uint64_t nonce, uint64_t id) {
  return (m->kind == kind ||
          (kind == IPCREF__KIND_SEGMENT && m->kind == IPCREF__KIND_DEVICE)) &&
         m->origin_nonce == nonce && m->id == id;
}

/* A cached mapping of (origin nonce, id), or NULL (under the lock). A
 * segment is found whether it is host or device memory. */
IPCREF__PRIVATE ipcref__map *ipcref__map_find(ipcref_ctx *ctx, int kind,
                                              uint64_t nonce, uint64_t id) {
  int led = kind == IPCREF__KIND_LEDGER;
  ipcref__map *m = ctx->map_last[led];
  if (m && ipcref__map_is(m, kind, nonce, id)) return m;
  if (ctx->map_index_off) {
    m = ctx->maps;
    while (m && !ipcref__map_is(m, kind, nonce, id)) m = m->next;
    if (!m) m = ctx->maps_retired;
    while (m && !ipcref__map_is(m, kind, nonce, id)) m = m->next;
  } else if (ctx->map_buckets) {
    m = ctx->map_index[ipcref__map_bucket(ctx, led, nonce, id)];
    while (m && !ipcref__map_is(m, kind, nonce, id)) m = m->hnext;
  }
  if (m) ctx->map_last[led] = m;
  return m;
}

/* ---- what peers keep mapped -----------------------------------------------
 * Each mapping is charged to the context, until it goes, and to the peer
 * whose message brought it (`via`), until it goes or the peer does (then
 * NULL). Their caps (opt.max_maps, opt.max_mapped_bytes of each) bound
 * what producers, honest or not, can make this process map: fds and
 * address space. */

IPCREF__PRIVATE void ipcref__map_charge(ipcref_ctx *ctx, ipcref_peer *p,
                                        ipcref__map *m) {
  ctx->st.maps_in++;
  ctx->st.maps_in_bytes += m->size;
  m->via = p;
  if (!p) return;
  p->nmaps++;
  p->mapped_bytes += m->size;
}

/* The peer's charge for `m` ends. */
IPCREF__PRIVATE void ipcref__map_unvia(ipcref__map *m) {
  if (!m->via) return;
  m->via->nmaps--;
  m->via->mapped_bytes -= m->size;
  m->via = NULL;
}

/* `m` goes: both charges end. */
IPCREF__PRIVATE void ipcref__map_uncharge(ipcref_ctx *ctx, ipcref__map *m) {
  ctx->st.maps_in--;
  ctx->st.maps_in_bytes -= m->size;
  ipcref__map_unvia(m);
}

/* 1 when `n` mappings of `bytes` more stay within caps `max_n` and
 * `max_bytes` (0: none) over `have_n` of `have_bytes`. */
IPCREF__PRIVATE int ipcref__caps_room(size_t have_n, size_t have_bytes,
                                      size_t max_n, size_t max_bytes, size_t n,
                                      size_t bytes) {
  size_t total;
  if (max_n && have_n + n > max_n) return 0;
  return !max_bytes || (!__builtin_add_overflow(have_bytes, bytes, &total) &&
                        total <= max_bytes);
}

/* 1 when peer `p` and its context may keep `n` mappings of `bytes` more. */
IPCREF__PRIVATE int ipcref__map_room(const ipcref_peer *p, size_t n,
                                     size_t bytes) {
  const ipcref_ctx *ctx = p->ctx;
  return ipcref__caps_room(p->nmaps, p->mapped_bytes, p->opt.max_maps,
                           p->opt.max_mapped_bytes, n, bytes) &&
         ipcref__caps_room(ctx->st.maps_in, ctx->st.maps_in_bytes,
                           ctx->opt.max_maps, ctx->opt.max_mapped_bytes, n,
                           bytes);
}

/* Notes a mapping that a message refused for the caps brought: a message
 * its producer sent before it heard of that names it without its fd, and
 * is refused so too (ERANGE), not as a forgery. A producer may send many
 * such before it reads the refusal (it reads returns once per clock
 * tick): the ring recalls the last IPCREF__REFUSED (24 KiB). Out of
 * memory, nothing is noted: such messages are refused as never sent. */
IPCREF__PRIVATE void ipcref__refused_note(ipcref_peer *p,
                                          const ipcref__map *m) {
  ipcref__sent *s;
  if (!p->refused)
    p->refused =
        (ipcref__sent *)ipcref__zalloc(IPCREF__REFUSED * sizeof *p->refused);
  if (!p->refused) return;
  s = &p->refused[p->refused_at++ % IPCREF__REFUSED];
  s->nonce = m->origin_nonce;
  s->key = ipcref__sent_key(m->id, m->kind == IPCREF__KIND_LEDGER);
  s->used = 1;
}

/* 1 when segment or ledger `key` of origin `nonce` was noted so lately. */
IPCREF__PRIVATE int ipcref__refused_was(const ipcref_peer *p, uint64_t nonce,
                                        uint64_t key) {
  int i;
  for (i = 0; p->refused && i < IPCREF__REFUSED; i++)
    if (p->refused[i].used && p->refused[i].nonce == nonce &&
        p->refused[i].key == key)
      return 1;
  return 0;
}

/* A ledger a refused message brought that `p` keeps (see
 * ipcref__refused_keep), or NULL. */
IPCREF__PRIVATE ipcref__map *ipcref__kept_find(const ipcref_peer *p,
                                               uint64_t nonce, uint64_t id) {
  int i;
  for (i = 0; i < IPCREF__KEPT; i++)
    if (p->kept[i] && p->kept[i]->origin_nonce == nonce && p->kept[i]->id == id)
      return p->kept[i];
  return NULL;
}

/* Peer `p` is freed: what it brought is charged to nobody. */
IPCREF__PRIVATE void ipcref__maps_unvia(ipcref_ctx *ctx, ipcref_peer *p) {
  ipcref__map *m;
  for (m = ctx->maps; m; m = m->next)
    if (m->via == p) ipcref__map_unvia(m);
  for (m = ctx->maps_retired; m; m = m->next)
    if (m->via == p) ipcref__map_unvia(m);
}

/* ---- what a peer was sent -------------------------------------------------
 * Linear probing, at most half full, deleted by moving the later entries
 * of a run back (no tombstones): p->sent holds p->capsent entries (0 or a
 * power of two), p->nsent of them used. p->sent_last holds the segment and
 * the ledger last asked for, each in the set until it is forgotten. */

IPCREF__PRIVATE size_t ipcref__sent_home(const ipcref_peer *p, uint64_t nonce,
                                         uint64_t key) {
  return (size_t)(ipcref__hash3(0, nonce, key) & (p->capsent - 1));
}

/* Where (nonce, key) is in the set, or where it would go. */
IPCREF__PRIVATE size_t ipcref__sent_slot(const ipcref_peer *p, uint64_t nonce,
                                         uint64_t key) {
  size_t i = ipcref__sent_home(p, nonce, key);
  while (p->sent[i].used &&
         (p->sent[i].nonce != nonce || p->sent[i].key != key))
    i = (i + 1) & (p->capsent - 1);
  return i;
}

/* Doubles the set (16 at first). 0 when out of memory. */
IPCREF__PRIVATE int ipcref__sent_grow(ipcref_peer *p) {
  size_t n = p->capsent ? 2 * p->capsent : 16, old = p->capsent, i;
  ipcref__sent *t = (ipcref__sent *)ipcref__zalloc(n * sizeof *t),
               *prev = p->sent;
  if (!t) return 0;
  p->sent = t;
  p->capsent = n;
  for (i = 0; i < old; i++)
    if (prev[i].used)
      t[ipcref__sent_slot(p, prev[i].nonce, prev[i].key)] = prev[i];
  IPCREF_FREE(prev);
  return 1;
}

/* Notes (nonce, key) as the last segment or ledger (its key's low bit)
 * found in the set or added to it: the next send of a view of the same
 * block asks for both again, and finds them without hashing. */
IPCREF__PRIVATE void ipcref__sent_remember(ipcref_peer *p, uint64_t nonce,
                                           uint64_t key) {
  ipcref__sent *last = &p->sent_last[key & 1u];
  last->nonce = nonce;
  last->key = key;
  last->used = 1;
}

/* ipcref__sent_mark past its remembered pair: the set itself. */
IPCREF__PRIVATE IPCREF__NOINLINE int
ipcref__sent_mark_set(ipcref_peer *p, uint64_t nonce, uint64_t key, int *fail) {
  size_t i;
  if (p->capsent && p->sent[i = ipcref__sent_slot(p, nonce, key)].used) {
    if (p->sent[i].resend) { /* once more, then as any other */
      p->sent[i].resend = 0;
      return 0;
    }
    ipcref__sent_remember(p, nonce, key);
    return 1;
  }
  if (2 * (p->nsent + 1) > p->capsent && !ipcref__sent_grow(p)) {
    *fail = 1;
    return 0;
  }
  i = ipcref__sent_slot(p, nonce, key);
  p->sent[i].nonce = nonce;
  p->sent[i].key = key;
  p->sent[i].used = 1;
  p->sent[i].resend = 0;
  p->nsent++;
  ipcref__sent_remember(p, nonce, key);
  return 0;
}

/* 1 when peer `p` was sent the segment or ledger (nonce, key) already;
 * else notes it and gives 0 (with *fail set when out of memory). Under the
 * lock, as the next. */
IPCREF__PRIVATE int ipcref__sent_mark(ipcref_peer *p, uint64_t nonce,
                                      uint64_t key, int *fail) {
  const ipcref__sent *last = &p->sent_last[key & 1u];
  if (last->used && last->key == key && last->nonce == nonce) return 1;
  return ipcref__sent_mark_set(p, nonce, key, fail);
}

/* Peer `p` did not keep the segment or ledger (nonce, key) a message
 * brought (its caps refused the message, or the message never left): its
 * fds go with the next view of it. It stays in the set: it is still told
 * when the segment goes, should it have kept an earlier copy. */
IPCREF__PRIVATE void ipcref__sent_resend(ipcref_peer *p, uint64_t nonce,
                                         uint64_t key) {
  size_t i;
  ipcref__sent *last = &p->sent_last[key & 1u];
  if (last->used && last->key == key && last->nonce == nonce) last->used = 0;
  if (!p->capsent) return;
  i = ipcref__sent_slot(p, nonce, key);
  if (p->sent[i].used) p->sent[i].resend = 1;
}

/* Forgets that peer `p` was sent (nonce, key): 1 when it had been. The
 * entries after it in its run move back where a lookup still finds them
 * (each one whose home is not cyclically in (hole, its place]). */
IPCREF__PRIVATE int ipcref__sent_forget(ipcref_peer *p, uint64_t nonce,
                                        uint64_t key) {
  size_t hole, j, home, mask = p->capsent - 1;
  ipcref__sent *last = &p->sent_last[key & 1u];
  if (last->used && last->key == key && last->nonce == nonce) last->used = 0;
  if (!p->capsent) return 0;
  hole = ipcref__sent_slot(p, nonce, key);
  if (!p->sent[hole].used) return 0;
  for (j = (hole + 1) & mask; p->sent[j].used; j = (j + 1) & mask) {
    home = ipcref__sent_home(p, p->sent[j].nonce, p->sent[j].key);
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      p->sent[hole] = p->sent[j];
      hole = j;
    }
  }
  p->sent[hole].used = 0;
  p->nsent--;
  return 1;
}

#endif /* IPCREF__SHARING_IMPL */
