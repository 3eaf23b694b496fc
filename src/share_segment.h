/* share_segment: where shared blocks live. Segments (sealed memfds, or a
 * backend's device allocations) cut into power-of-two blocks by size
 * class, a block of its own for large or isolated ones, the cache of empty
 * segments, and the end of a lease on a block (freed once nothing holds
 * it). Under ctx->lock. */

#ifdef IPCREF__SHARING_IMPL

/* The size class of a block of `size` bytes, and the class's block size
 * (a power of two, at least IPCREF__MIN_BLOCK). */
IPCREF__PRIVATE uint32_t ipcref__class_of(size_t size, size_t *block) {
  size_t b = IPCREF__MIN_BLOCK;
  uint32_t c = 0;
  while (b < size) b <<= 1, c++;
  *block = b;
  return c;
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

/* Destroys a segment no block of which is used: announced retired to the
 * peers that map it, its memory freed (a wrapped allocation stays its
 * owner's). */
IPCREF__PRIVATE void ipcref__segment_destroy(ipcref_ctx *ctx,
                                             ipcref__segment *s) {
  uint32_t i;
  ipcref__class_remove(s);
  if (s->cached) ctx->empty_bytes -= s->size;
  IPCREF__LIST_REMOVE(ctx->segments, s, next, prev);
  ipcref__retire_announce(ctx, s->id);
  if (s->pool->be) { /* a wrapped allocation stays its owner's */
    if (s->cls != IPCREF__FOREIGN && !s->leaked)
      s->pool->be->seg_free(s->pool->be, s->pool->dev, s->daddr);
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
  if (ctx->opt.max_bytes && cls != IPCREF__FOREIGN &&
      ctx->st.segment_bytes + size > ctx->opt.max_bytes)
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

/* A free block of at least `size` bytes in `pool` (under the lock); `own`:
 * in a segment of its own. */
IPCREF__PRIVATE ipcref_result ipcref__block_alloc(ipcref_ctx *ctx,
                                                  ipcref__pool *pool,
                                                  size_t size, int own,
                                                  ipcref__block **out) {
  ipcref__segment *s;
  ipcref__block *b;
  size_t block;
  uint32_t cls = ipcref__class_of(size, &block);
  ipcref_result r;
  if (own || block > ctx->opt.segment_size / 2 || cls >= IPCREF__CLASSES) {
    /* Isolated or large: a segment of its own, rounded to pages. */
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    size_t bytes = (size + page - 1) & ~(page - 1);
    if (bytes == 0) bytes = page;
    r = ipcref__segment_new(ctx, pool, bytes, bytes, IPCREF__OWN, 0, &s);
    if (r != IPCREF_OK) return r;
  } else if ((s = pool->classes[cls]) == NULL) {
    r = ipcref__segment_new(ctx, pool, ctx->opt.segment_size, block, cls, 0,
                            &s);
    if (r != IPCREF_OK) return r;
    ipcref__class_add(s);
  }
  if (s->cached) { /* an empty cached segment comes back into use */
    ctx->empty_bytes -= s->size;
    s->cached = 0;
  }
  b = ipcref__segment_take(s);
  if (!b) { /* out of memory: a segment made for this block goes again */
    if (s->nfree == s->nblocks) ipcref__segment_destroy(ctx, s);
    return IPCREF_ENOMEM;
  }
  if (s->nfree == 0) ipcref__class_remove(s);
  b->leases = 0;
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
 * else to its segment, which is cached or destroyed once empty. */
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
  if (s->nfree < s->nblocks) {
    ipcref__class_add(s);
    return;
  }
  /* Empty: keep it while the cache has room, else return it to the OS. */
  if (s->cls < IPCREF__CLASSES &&
      ctx->empty_bytes + s->size <= ctx->opt.segment_cache) {
    ctx->empty_bytes += s->size;
    s->cached = 1;
    ipcref__class_add(s);
    return;
  }
  ipcref__segment_destroy(ctx, s);
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
  b->leases--;
  ctx->st.live_slots--;
  if (b->leases || b->local) return 0;
  bytes = b->size;
  if (b->in_limbo) ipcref__limbo_remove(ctx, b);
  ipcref__block_free(ctx, b);
  return bytes;
}

#endif /* IPCREF__SHARING_IMPL */
