/* share_buf: shared buffers made here. A block's buffer and its release
 * (back to the free list, or to the limbo while leases are out), aliases
 * (the object table's pulled views), AddressSanitizer's poisoning of
 * released blocks, the queue of buffer headers that keeps a released
 * header readable (ctx->hdr_lock), and ipcref_shared_new. Under ctx->lock
 * otherwise. */

#ifdef IPCREF__SHARING_IMPL

/* Under AddressSanitizer, the memory of a block released here is poisoned
 * until it is handed out again: a late read through a stale pointer is
 * caught at the read. (Poisoning is this process's view only: consumers
 * holding leases read on.) */
IPCREF__PRIVATE void ipcref__block_poison(ipcref__block *b) {
  if (!b->seg->pool->be && b->seg->cls != IPCREF__FOREIGN)
    IPCREF__POISON(b->seg->base + b->offset, b->size);
}

IPCREF__PRIVATE void ipcref__block_unpoison(ipcref__block *b) {
  if (!b->seg->pool->be && b->seg->cls != IPCREF__FOREIGN)
    IPCREF__UNPOISON(b->seg->base + b->offset, b->size);
}

/* The release callback of a local shared buffer: the producer's own last
 * reference went. The block goes back, or to the limbo while leased; and
 * since leases may have come back meanwhile, the ledgers are swept. */
IPCREF__PRIVATE void ipcref__block_release(void *user, void *data) {
  ipcref__block *b = (ipcref__block *)user;
  ipcref_ctx *ctx = b->seg->ctx;
  (void)data;
  if (ipcref__forked(ctx)) return; /* a forked child's copy: left alone */
  IPCREF__LOCK(ctx);
  ctx->st.live_bufs--;
  ctx->st.live_bytes -= b->size;
  ipcref__sweep(ctx);
  (void)ipcref__pump(ctx, 0);
  b->local = 0;
  ipcref__block_poison(b);
  if (b->leases == 0) {
    ipcref__block_free(ctx, b);
  } else {
    b->in_limbo = 1;
    IPCREF__LIST_PUSH(ctx->limbo, b, limbo_next, limbo_prev);
    ctx->st.limbo_blocks++;
    ctx->st.limbo_bytes += b->size;
  }
  IPCREF__UNLOCK(ctx);
  /* The buffer's reference to the context goes with its header
   * (ipcref__hdr_put), which weak references may keep. */
}

/* The release callback of an alias's own buffer. */
IPCREF__PRIVATE void ipcref__alias_release(void *user, void *data) {
  ipcref__alias *a = (ipcref__alias *)user;
  ipcref_ctx *ctx = a->block->seg->ctx;
  (void)data;
  if (ipcref__forked(ctx)) return; /* a forked child's copy: left alone */
  IPCREF__LOCK(ctx);
  ipcref__alias_drop(ctx, a);
  IPCREF__UNLOCK(ctx);
}

IPCREF_API int ipcref_buf_is_shared(const ipcref_buf *b) {
  return b && (b->release == ipcref__block_release ||
               b->release == ipcref__import_release ||
               b->release == ipcref__alias_release);
}

/* The block behind a shared buffer made here (itself or an alias), or
 * NULL. */
IPCREF__PRIVATE ipcref__block *ipcref__local_block(const ipcref_buf *b) {
  if (!b) return NULL;
  if (b->release == ipcref__block_release)
    return (ipcref__block *)b->release_user;
  if (b->release == ipcref__alias_release)
    return ((ipcref__alias *)b->release_user)->block;
  return NULL;
}

IPCREF__PRIVATE uint32_t ipcref__buf_leases(const ipcref_buf *b) {
  ipcref__block *blk = ipcref__local_block(b);
  ipcref_ctx *ctx;
  uint32_t n;
  if (!blk) return 0;
  ctx = blk->seg->ctx;
  /* A forked child's copy: the parent's consumers are not known here, and
   * the memory is the parent's too. */
  if (ipcref__forked(ctx)) return 1;
  /* Without the lock while none is out (see ipcref__buf_sole for when a 0
   * is final). Acquire, with the release of the sweep's store that ended
   * the last lease, after it read the consumer's return: what the
   * consumer read comes before what the caller writes next. */
  if (__atomic_load_n(&blk->leases, __ATOMIC_ACQUIRE) == 0) return 0;
  IPCREF__LOCK(ctx);
  ipcref__sweep(ctx);         /* the returns since the last sweep */
  (void)ipcref__pump(ctx, 0); /* the leases of consumers that died */
  n = blk->leases;
  IPCREF__UNLOCK(ctx); /* an alias whose last lease ended lets go here */
  return n;
}

/* An alias of `src` (see ipcref__alias) into *out, read-only when `src`
 * is: 1 when made, 0 when `src` is not a shared buffer made here, -1 when
 * out of memory. */
IPCREF__PRIVATE int ipcref__shared_alias(ipcref_buf *src, void (*fn)(void *),
                                         void *user, ipcref_buf **out) {
  ipcref__block *blk = ipcref__local_block(src);
  ipcref__alias *a;
  if (!blk) return 0;
  a = (ipcref__alias *)IPCREF_MALLOC(sizeof *a);
  if (!a) return -1;
  a->block = blk;
  a->src = src;
  a->holds = 1; /* its own buffer */
  a->fn = fn;
  a->user = user;
  a->next = NULL;
  if (ipcref_buf_wrap_device(src->data, src->size, ipcref_buf_device(src),
                             ipcref__alias_release, a, out) != IPCREF_OK) {
    IPCREF_FREE(a);
    return -1;
  }
  ipcref_buf_retain(src);
  return 1;
}

/* ---- headers of shared buffers ----------------------------------------
 * A shared buffer made here has its header in its context's memory, not
 * the heap's: a released header waits at the back of a queue, whole and
 * marked dead (strong count 0), and is handed out again only once
 * IPCREF__HDR_DELAY others wait before it. So a late send or release of a
 * buffer already released finds the count at 0 and is refused, in every
 * build, while the context lives. Guarded by ctx->hdr_lock: headers are
 * put back outside ctx->lock. */
#ifdef IPCREF_CHECKED
#define IPCREF__HDR_DELAY 4096
#else
#define IPCREF__HDR_DELAY 256
#endif

/* The header allocator's free: the last reference, strong or weak, went. */
IPCREF__PRIVATE void ipcref__hdr_put(void *user, void *ptr, size_t size) {
  ipcref_ctx *ctx = (ipcref_ctx *)user;
  ipcref__hdr *h = (ipcref__hdr *)ptr;
  (void)size;
  if (ipcref__forked(ctx)) return; /* a forked child's copy: left alone */
  h->next = NULL;
  pthread_mutex_lock(&ctx->hdr_lock);
  if (ctx->hdr_last)
    ctx->hdr_last->next = h;
  else
    ctx->hdr_first = h;
  ctx->hdr_last = h;
  ctx->hdr_free++;
  pthread_mutex_unlock(&ctx->hdr_lock);
  ipcref__ctx_unref(ctx); /* the buffer's reference to its context */
}

/* A header for a new shared buffer, or NULL (out of memory). New headers
 * go to the front of the queue, so released ones keep aging at its back. */
IPCREF__PRIVATE ipcref__hdr *ipcref__hdr_get(ipcref_ctx *ctx) {
  ipcref__hdr *h;
  pthread_mutex_lock(&ctx->hdr_lock);
  if (ctx->hdr_free <= IPCREF__HDR_DELAY) {
    ipcref__hdr_chunk *c = (ipcref__hdr_chunk *)ipcref__zalloc(sizeof *c);
    int i;
    if (c) {
      c->next = ctx->hdr_chunks;
      ctx->hdr_chunks = c;
      for (i = IPCREF__HDR_CHUNK - 1; i >= 0; i--) {
        c->h[i].next = ctx->hdr_first;
        ctx->hdr_first = &c->h[i];
        if (!ctx->hdr_last) ctx->hdr_last = &c->h[i];
      }
      ctx->hdr_free += IPCREF__HDR_CHUNK;
    }
  }
  h = ctx->hdr_first;
  if (h) {
    ctx->hdr_first = h->next;
    if (!ctx->hdr_first) ctx->hdr_last = NULL;
    ctx->hdr_free--;
  }
  pthread_mutex_unlock(&ctx->hdr_lock);
  return h;
}

/* The buffer of a new block (its first local reference, and one reference
 * to the context, held by its header); on error the block goes back (a
 * wrap without calling its owner's release). */
IPCREF__PRIVATE ipcref_result ipcref__block_buf(ipcref__block *b, size_t size,
                                                ipcref_buf **out) {
  ipcref_ctx *ctx = b->seg->ctx;
  ipcref__pool *pool = b->seg->pool;
  ipcref__hdr *h = ipcref__hdr_get(ctx);
  ipcref_allocator a;
  ipcref_device dev;
  void *data;
  if (!h) {
    b->release = NULL;
    ipcref__block_release(b, NULL);
    ipcref__ctx_unref(ctx);
    return IPCREF_ENOMEM;
  }
  a.alloc = ipcref__default_alloc; /* unused: the header is never resized */
  a.free = ipcref__hdr_put;
  a.user = ctx;
  dev.type = pool->be ? pool->be->device_type : IPCREF_DEVICE_CPU;
  dev.id = pool->be ? pool->dev : 0;
  if (pool->be)
    data = (void *)(uintptr_t)(b->seg->daddr + b->offset);
  else
    data = b->seg->base + b->offset;
  ipcref__block_unpoison(b);
  ipcref__buf_adopt(&h->buf, data, size, dev, ipcref__block_release, b, &a);
  *out = &h->buf;
  return IPCREF_OK;
}

/* Counts a new block as live (under the lock). */
IPCREF__PRIVATE void ipcref__block_live(ipcref_ctx *ctx, ipcref__block *b) {
  ctx->st.live_bufs++;
  ctx->st.live_bytes += b->size;
  __atomic_fetch_add(&ctx->refs, 1, __ATOMIC_RELAXED);
}

/* A new shared buffer of `size` bytes in `pool` (host memory or one
 * device's), in a segment of its own with `own`: what ipcref_shared_new,
 * ipcref_shared_new_isolated and ipcref_device_new make. */
IPCREF__PRIVATE ipcref_result ipcref__shared_new_in(ipcref_ctx *ctx,
                                                    ipcref__pool *pool,
                                                    size_t size, int own,
                                                    ipcref_buf **out) {
  ipcref__block *b;
  ipcref_result r;
  if (size > (size_t)PTRDIFF_MAX / 2) return IPCREF_ERANGE;
  if (__atomic_load_n(&ctx->room_armed, __ATOMIC_RELAXED))
    ipcref__bell_drain(ctx); /* this try answers the wake-up */
  IPCREF__LOCK(ctx);
  (void)ipcref__pump(ctx, 0);
  /* A free block first; if none, leases that came back since the last
   * sweep may free one (a stream's previous tensor, mostly): a sweep costs
   * far less than a new segment. */
  r = ipcref__block_alloc(ctx, pool, size, own, own, &b);
  if (r == IPCREF_OK && !b) {
    ipcref__sweep(ctx);
    r = ipcref__block_alloc(ctx, pool, size, own, 1, &b);
  }
  if (r == IPCREF_ENOMEM) { /* the limbo, or the dead, may hold it */
    ipcref__sweep(ctx);
    (void)ipcref__pump(ctx, 1);
    r = ipcref__block_alloc(ctx, pool, size, own, 1, &b);
  }
  if (r == IPCREF_ENOMEM && ctx->cache) { /* then what the cache keeps */
    (void)ipcref__cache_trim(ctx, 0);
    r = ipcref__block_alloc(ctx, pool, size, own, 1, &b);
  }
  if (r == IPCREF_ENOMEM && !ctx->room_alloc &&
      ipcref__room_can_come(ctx, size, own)) {
    ctx->room_alloc = 1; /* wake the room fd on returns (see share_loop) */
    ipcref__room_update(ctx);
    ipcref__sweep(ctx); /* what came back before the arming */
    r = ipcref__block_alloc(ctx, pool, size, own, 1, &b);
  }
  if (r == IPCREF_OK && ctx->room_alloc) {
    ctx->room_alloc = 0;
    ipcref__room_update(ctx);
  }
  if (r == IPCREF_OK) {
    IPCREF__STEP("allocate");
    ipcref__block_live(ctx, b);
  }
  IPCREF__UNLOCK(ctx);
  if (r != IPCREF_OK) return r;
  return ipcref__block_buf(b, size, out);
}

IPCREF_API ipcref_result ipcref_shared_new(ipcref_ctx *ctx, size_t size,
                                           ipcref_buf **out) {
  if (!ctx || !out) return ipcref__invalid(__func__, "ctx or out is NULL");
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  return ipcref__shared_new_in(ctx, &ctx->host, size, ctx->opt.isolate, out);
}

IPCREF_API ipcref_result ipcref_shared_new_isolated(ipcref_ctx *ctx,
                                                    size_t size,
                                                    ipcref_buf **out) {
  if (!ctx || !out) return ipcref__invalid(__func__, "ctx or out is NULL");
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  return ipcref__shared_new_in(ctx, &ctx->host, size, 1, out);
}

#endif /* IPCREF__SHARING_IMPL */
