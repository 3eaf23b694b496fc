/* share_segment: where shared blocks live. Segments (sealed memfds, or a
 * backend's device allocations) cut into blocks by size class, a segment of
 * its own for a large or isolated block, the cache of empty segments kept
 * for reuse (one byte cap over every pool: how a segment is made does not
 * matter to it), and the end of a lease on a block (freed once nothing
 * holds it). Under ctx->lock. */

#ifdef IPCREF__SHARING_IMPL

/* The size class of a block of `size` bytes, and the class's block size.
 * Up to 64 KiB: the powers of two from IPCREF__MIN_BLOCK (classes 0..10).
 * Above: eight classes per doubling, 2^k * 9/8, 10/8, .. 16/8 for
 * 2^k < size <= 2^(k+1), so a block is at most 1/8 larger than asked (a
 * power of two would waste up to half), and a multiple of 2^(k-3), at
 * least 8 KiB: page aligned in its segment. */
IPCREF__PRIVATE uint32_t ipcref__class_of(size_t size, size_t *block) {
  size_t b = IPCREF__MIN_BLOCK, step, m;
  uint32_t c = 0, k = 16;
  if (size <= IPCREF__FINE_FROM) {
    while (b < size) b <<= 1, c++;
    *block = b;
    return c;
  }
  while ((size - 1) >> (k + 1)) k++; /* 2^k < size <= 2^(k+1) */
  step = (size_t)1 << (k - 3);
  m = (size + step - 1) / step; /* 9 .. 16 */
  *block = m * step;
  return 11u + (k - 16) * 8u + (uint32_t)(m - 9);
}

/* A segment with free blocks joins, or leaves, the list of its class
 * (under the lock, as everything here). */
IPCREF__PRIVATE void ipcref__class_add(ipcref__segment *s) {
  if (s->in_class || s->cls >= IPCREF__CLASSES) return;
  IPCREF__LIST_PUSH(s->pool->classes[s->cls], s, class_next, class_prev);
  s->in_class = 1;
}

IPCREF__PRIVATE void ipcref__class_remove(ipcref__segment *s) {
  if (!s->in_class) return;
  IPCREF__LIST_REMOVE(s->pool->classes[s->cls], s, class_next, class_prev);
  s->in_class = 0;
}

/* Segment `id` is going: each peer that was sent it is told in its next
 * message, so that it unmaps it once unused. */
IPCREF__PRIVATE void ipcref__retire_announce(ipcref_ctx *ctx, uint64_t id) {
  ipcref_peer *p;
  for (p = ctx->peers; p; p = p->next)
    if (ipcref__sent_forget(p, ctx->nonce, ipcref__sent_key(id, 0)) &&
        ipcref__grow((void **)&p->retired, &p->capretired, p->nretired + 1,
                     sizeof(uint64_t)))
      p->retired[p->nretired++] = id;
}

/* Takes an empty segment out of the cache: it is about to be used, or
 * destroyed. */
IPCREF__PRIVATE void ipcref__cache_unlink(ipcref_ctx *ctx, ipcref__segment *s) {
  if (!s->cached) return;
  if (ctx->cache_oldest == s) ctx->cache_oldest = s->cache_prev;
  IPCREF__LIST_REMOVE(ctx->cache, s, cache_next, cache_prev);
  s->cached = 0;
  ctx->ncached--;
  ctx->st.cached_bytes -= s->size;
}

/* Destroys a segment no block of which is used: announced retired to the
 * peers that map it, its memory freed (a wrapped allocation stays its
 * owner's). */
IPCREF__PRIVATE void ipcref__segment_destroy(ipcref_ctx *ctx,
                                             ipcref__segment *s) {
  uint32_t i;
  ipcref__class_remove(s);
  ipcref__cache_unlink(ctx, s);
  IPCREF__LIST_REMOVE(ctx->segments, s, next, prev);
  ipcref__retire_announce(ctx, s->id);
  if (s->pool->be) { /* a wrapped allocation stays its owner's */
    ipcref_backend *be = s->pool->be;
    if (s->cls != IPCREF__FOREIGN && !s->leaked)
      be->seg_free(be, s->pool->dev, s->daddr);
    else if (s->cls == IPCREF__FOREIGN && s->exported && !s->by_fd &&
             be->seg_forget)
      be->seg_forget(be, s->pool->dev, s->daddr);
    if (s->fd >= 0) close(s->fd); /* its shareable fd, if exported so */
    if (s->vmm_chunks) {
      int i;
      for (i = 0; i < s->vmm_chunks->n; i++)
        if (s->vmm_chunks->fd[i] >= 0) close(s->vmm_chunks->fd[i]);
      IPCREF_FREE(s->vmm_chunks);
    }
    ctx->st.device_bytes -= s->size;
  } else {
    IPCREF__UNPOISON(s->base, s->size); /* the addresses will be reused */
    munmap(s->base, s->size);
    close(s->fd);
    if (s->ro_fd >= 0) close(s->ro_fd);
  }
  ctx->st.segment_bytes -= s->size;
  ctx->st.mapped_segments--;
  for (i = 0; i < s->nmade; i += IPCREF__BLOCK_CHUNK)
    IPCREF_FREE(s->chunks[i / IPCREF__BLOCK_CHUNK]);
  IPCREF_FREE(s->chunks);
  IPCREF_FREE(s->free_stack);
  IPCREF_FREE(s);
}

/* Gives back the oldest cached segments until at most `keep` bytes are
 * cached. Returns the bytes given back. Unmapping populated memory takes
 * time in proportion to its size: a stream whose sizes fit in the cache
 * never comes here. */
IPCREF__PRIVATE size_t ipcref__cache_trim(ipcref_ctx *ctx, size_t keep) {
  size_t freed = 0;
  while (ctx->cache_oldest && ctx->st.cached_bytes > keep) {
    freed += ctx->cache_oldest->size;
    ipcref__segment_destroy(ctx, ctx->cache_oldest);
  }
  return freed;
}

/* A segment that just became empty is kept for reuse, newest first, the
 * oldest ones given back to make room under the cap (of bytes, and of
 * IPCREF__CACHE_MAX segments: each holds fds). One larger than the cap is
 * given back, and so is an isolated one: the peer it was sent to still
 * maps it. */
IPCREF__PRIVATE void ipcref__cache_put(ipcref_ctx *ctx, ipcref__segment *s) {
  size_t cap = ctx->opt.segment_cache;
  if (s->isolated || s->size > cap) {
    ipcref__segment_destroy(ctx, s);
    return;
  }
  (void)ipcref__cache_trim(ctx, cap - s->size);
  if (ctx->ncached == IPCREF__CACHE_MAX)
    ipcref__segment_destroy(ctx, ctx->cache_oldest);
  ctx->ncached++;
  s->cached = 1;
  IPCREF__LIST_PUSH(ctx->cache, s, cache_next, cache_prev);
  if (!ctx->cache_oldest) ctx->cache_oldest = s;
  ctx->st.cached_bytes += s->size;
  ipcref__class_add(s);
}

/* 1 when `size` more segment bytes fit under opt.max_bytes, after giving
 * back as many cached segments as that takes (none, if all of them would
 * not be enough). */
IPCREF__PRIVATE int ipcref__room_for(ipcref_ctx *ctx, size_t size) {
  size_t max = ctx->opt.max_bytes, over;
  if (!max) return 1;
  if (size > max) return 0;
  if (ctx->st.segment_bytes <= max - size) return 1;
  over = ctx->st.segment_bytes - (max - size);
  if (over > ctx->st.cached_bytes) return 0;
  (void)ipcref__cache_trim(ctx, ctx->st.cached_bytes - over);
  return 1;
}

/* A new segment of `size` bytes in `pool`, cut into blocks of `block`
 * bytes (none for IPCREF__FOREIGN: the caller adds its wraps); device
 * memory comes from the pool's backend (daddr: given for a foreign one). */
IPCREF__PRIVATE ipcref_result ipcref__segment_new(ipcref_ctx *ctx,
                                                  ipcref__pool *pool,
                                                  size_t size, size_t block,
                                                  uint32_t cls, uint64_t daddr,
                                                  ipcref__segment **out) {
  ipcref__segment *s;
  ipcref_result r;
  if (cls != IPCREF__FOREIGN && !ipcref__room_for(ctx, size))
    return IPCREF_ENOMEM;
  s = (ipcref__segment *)ipcref__zalloc(sizeof *s);
  if (!s) return IPCREF_ENOMEM;
  s->nblocks = cls == IPCREF__FOREIGN ? 0 : (uint32_t)(size / block);
  s->chunks =
      (ipcref__block **)ipcref__zalloc((s->nblocks + IPCREF__BLOCK_CHUNK - 1) /
                                       IPCREF__BLOCK_CHUNK * sizeof *s->chunks);
  r = IPCREF_ENOMEM;
  if (!s->chunks) goto fail;
  s->pool = pool;
  s->fd = s->ro_fd = -1;
  s->daddr = daddr;
  if (pool->be) {
    if (cls != IPCREF__FOREIGN) {
      r = pool->be->seg_alloc(pool->be, pool->dev, size, &s->daddr);
      if (r != IPCREF_OK) goto fail;
    }
    ctx->st.device_bytes += size;
  } else {
    s->fd = ipcref__memfd("ipcref-segment", size, !ctx->opt.writable_shares,
                          &s->base);
    if (s->fd < 0) goto sys;
  }
  if (!pool->be && !ctx->opt.writable_shares) {
    /* A second open of the memfd, read-only, for consumers: made here, off
     * the hand-off path. */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", s->fd);
    s->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->ro_fd < 0) { /* out of fds: no segment that can never be sent */
      int e = errno;
      munmap(s->base, size);
      close(s->fd);
      errno = e;
      goto sys;
    }
  }
  s->ctx = ctx;
  s->id = ++ctx->next_id;
  s->size = size;
  s->block_size = block;
  s->cls = cls;
  s->nfree = s->nblocks;
  IPCREF__LIST_PUSH(ctx->segments, s, next, prev);
  ctx->st.segment_bytes += size;
  ctx->st.mapped_segments++;
  *out = s;
  return IPCREF_OK;
sys:
  r = errno == ENOMEM ? IPCREF_ENOMEM : IPCREF_ESYS;
fail:
  IPCREF_FREE(s->chunks);
  IPCREF_FREE(s);
  return r;
}

/* A free block of segment `s` (under the lock): the last one freed, else
 * the next never handed out (low offsets first), its chunk of descriptors
 * made when it is the chunk's first, with room on the free stack for every
 * block made, so that a free never allocates. NULL when out of memory. */
IPCREF__PRIVATE ipcref__block *ipcref__segment_take(ipcref__segment *s) {
  uint32_t i = s->nstack ? s->free_stack[--s->nstack] : s->nmade;
  if (i == s->nmade) { /* a block never handed out */
    if (i % IPCREF__BLOCK_CHUNK == 0) {
      uint32_t n = s->nblocks - i < IPCREF__BLOCK_CHUNK ? s->nblocks - i
                                                        : IPCREF__BLOCK_CHUNK;
      uint32_t k;
      ipcref__block *c;
      if (!ipcref__grow((void **)&s->free_stack, &s->capstack, (size_t)i + n,
                        sizeof(uint32_t)))
        return NULL;
      c = (ipcref__block *)ipcref__zalloc(n * sizeof *c);
      if (!c) return NULL;
      for (k = 0; k < n; k++) {
        c[k].seg = s;
        c[k].index = i + k;
        c[k].offset = (size_t)(i + k) * s->block_size;
        c[k].size = s->block_size;
      }
      s->chunks[i / IPCREF__BLOCK_CHUNK] = c;
    }
    s->nmade++;
  }
  s->nfree--;
  return &s->chunks[i / IPCREF__BLOCK_CHUNK][i % IPCREF__BLOCK_CHUNK];
}

/* The page size, for segments of one block. */
IPCREF__PRIVATE size_t ipcref__page(void) {
  long pg = sysconf(_SC_PAGESIZE);
  return pg > 0 ? (size_t)pg : 4096;
}

/* A new segment for a block of class `cls` (`block` bytes): pooled, cut
 * into blocks of that size; or, for a block larger than half a segment or
 * an isolated one, a segment of that one block, rounded to pages. Its
 * pages are not made ahead (MADV_POPULATE_WRITE): that halves the cost of
 * filling the whole block, but makes every page however little is
 * written, and the last unmap then frees them all (a first hand-off of 64
 * MiB went from 25 us to 6.5 ms). Recycling spares a stream its faults. */
IPCREF__PRIVATE ipcref_result ipcref__segment_for(ipcref_ctx *ctx,
                                                  ipcref__pool *pool,
                                                  uint32_t cls, size_t block,
                                                  int own,
                                                  ipcref__segment **out) {
  size_t page = ipcref__page(), bytes;
  ipcref_result r;
  if (!own && block <= ctx->opt.segment_size / 2)
    return ipcref__segment_new(ctx, pool, ctx->opt.segment_size, block, cls, 0,
                               out);
  bytes = (block + page - 1) & ~(page - 1);
  r = ipcref__segment_new(ctx, pool, bytes, bytes, cls, 0, out);
  if (r == IPCREF_OK) (*out)->isolated = own;
  return r;
}

/* The bytes of the segment a new block of `size` bytes is made in (see
 * ipcref__segment_for and ipcref__block_alloc). */
IPCREF__PRIVATE size_t ipcref__segment_bytes(const ipcref_ctx *ctx, size_t size,
                                             int own) {
  size_t page = ipcref__page(), block;
  if (own && size < page) size = page;
  (void)ipcref__class_of(size, &block);
  if (!own && block <= ctx->opt.segment_size / 2) return ctx->opt.segment_size;
  return (block + page - 1) & ~(page - 1);
}

/* 1 when an allocation of `size` refused for want of memory can fit once
 * consumers return what they hold (under the lock): the cap refused it,
 * and its segment alone fits under the cap. Else (a segment larger than
 * max_bytes, or the system out of memory) no return will help. */
IPCREF__PRIVATE int ipcref__room_can_come(const ipcref_ctx *ctx, size_t size,
                                          int own) {
  size_t max = ctx->opt.max_bytes, need = ipcref__segment_bytes(ctx, size, own);
  return max && need <= max && ctx->st.segment_bytes > max - need;
}

/* A free block of at least `size` bytes in `pool` (under the lock); `own`:
 * in a new segment of its own (isolated). A block of a segment that has
 * one free comes first, a cached one's counting as a hit; else, with
 * `make`, a new segment (a miss); without, *out is NULL. */
IPCREF__PRIVATE ipcref_result ipcref__block_alloc(ipcref_ctx *ctx,
                                                  ipcref__pool *pool,
                                                  size_t size, int own,
                                                  int make,
                                                  ipcref__block **out) {
  ipcref__segment *s;
  ipcref__block *b;
  size_t block;
  uint32_t cls;
  ipcref_result r;
  /* An isolated block is at least a page: classes round pages up to
   * pages. */
  if (own && size < ipcref__page()) size = ipcref__page();
  cls = ipcref__class_of(size, &block);
  *out = NULL;
  s = own ? NULL : pool->classes[cls];
  if (!s) {
    if (!make) return IPCREF_OK;
    r = ipcref__segment_for(ctx, pool, cls, block, own, &s);
    if (r != IPCREF_OK) return r;
    ctx->st.cache_misses++;
    ipcref__class_add(s);
  } else if (s->cached) { /* an empty cached segment comes back into use */
    ipcref__cache_unlink(ctx, s);
    ctx->st.cache_hits++;
  }
  b = ipcref__segment_take(s);
  if (!b) { /* out of memory: a segment made for this block goes again */
    if (s->nfree == s->nblocks) ipcref__segment_destroy(ctx, s);
    return IPCREF_ENOMEM;
  }
  if (s->nfree == 0) ipcref__class_remove(s);
  __atomic_store_n(&b->leases, 0u, __ATOMIC_RELAXED);
  b->local = 1;
  b->in_limbo = 0;
  *out = b;
  return IPCREF_OK;
}

/* One hold of an alias less (under the lock); the last ends it after the
 * unlock. */
IPCREF__PRIVATE void ipcref__alias_drop(ipcref_ctx *ctx, ipcref__alias *a) {
  if (--a->holds) return;
  a->next = ctx->unpinned;
  ctx->unpinned = a;
}

/* A block nothing holds goes back: a wrap to its owner (after the unlock),
 * else to its segment, which is cached or given back once empty. */
IPCREF__PRIVATE void ipcref__block_free(ipcref_ctx *ctx, ipcref__block *b) {
  ipcref__segment *s = b->seg;
  if (s->cls == IPCREF__FOREIGN) { /* back to its owner, after the unlock */
    b->limbo_next = ctx->released;
    ctx->released = b;
    if (--s->nwraps == 0) ipcref__segment_destroy(ctx, s);
    return;
  }
  s->free_stack[s->nstack++] = b->index;
  s->nfree++;
  if (s->nfree < s->nblocks)
    ipcref__class_add(s);
  else
    ipcref__cache_put(ctx, s); /* empty: kept for reuse, or given back */
}

/* Takes a block out of the limbo. */
IPCREF__PRIVATE void ipcref__limbo_remove(ipcref_ctx *ctx, ipcref__block *b) {
  IPCREF__LIST_REMOVE(ctx->limbo, b, limbo_next, limbo_prev);
  b->in_limbo = 0;
  ctx->st.limbo_blocks--;
  ctx->st.limbo_bytes -= b->size;
}

/* One lease less on `b` (under the lock): frees the block when nothing
 * holds it any more. Returns the bytes freed. */
IPCREF__PRIVATE size_t ipcref__block_unlease(ipcref_ctx *ctx,
                                             ipcref__block *b) {
  size_t bytes;
  __atomic_store_n(&b->leases, b->leases - 1u, __ATOMIC_RELEASE);
  ctx->st.live_slots--;
  if (b->leases || b->local) return 0;
  bytes = b->size;
  if (b->in_limbo) ipcref__limbo_remove(ctx, b);
  ipcref__block_free(ctx, b);
  return bytes;
}

#endif /* IPCREF__SHARING_IMPL */
