/* share_device: device memory. Backends added to a context, a pool per
 * device, ipcref_device_new and ipcref_device_wrap (a foreign allocation
 * found by its base and exported once), and ipcref_view_new_shared. Under
 * ctx->lock. */

#ifdef IPCREF__SHARING_IMPL

/* The backend added for device type `type`, or NULL (under the lock). */
IPCREF__PRIVATE ipcref_backend *ipcref__backend_of(ipcref_ctx *ctx,
                                                   int32_t type) {
  int i;
  for (i = 0; i < IPCREF__MAX_BACKENDS; i++)
    if (ctx->backends[i] && ctx->backends[i]->device_type == type)
      return ctx->backends[i];
  return NULL;
}

IPCREF_API ipcref_result ipcref_ctx_add_backend(ipcref_ctx *ctx,
                                                ipcref_backend *be) {
  int i;
  ipcref_result r = IPCREF_EINVAL;
  if (!ctx || !be || be->device_type <= IPCREF_DEVICE_CPU || !be->seg_alloc ||
      !be->seg_free || !be->seg_range || !be->seg_export || !be->seg_import ||
      !be->seg_close || !be->event_record || !be->event_free ||
      !be->event_wait || !be->fence || !be->fence_done ||
      !be->seg_export_fd != !be->seg_import_fd ||
      !be->seg_export_chunks != !be->seg_import_chunks)
    return ipcref__invalid(__func__,
                           !ctx || !be ? "ctx or be is NULL"
                           : be->device_type <= IPCREF_DEVICE_CPU
                               ? "be->device_type is not a device"
                               : "the backend lacks a function (or has one "
                                 "of a pair: seg_export_fd and "
                                 "seg_import_fd, seg_export_chunks and "
                                 "seg_import_chunks)");
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  IPCREF__LOCK(ctx);
  if (!ipcref__backend_of(ctx, be->device_type))
    for (i = 0; i < IPCREF__MAX_BACKENDS; i++)
      if (!ctx->backends[i]) {
        ctx->backends[i] = be;
        r = IPCREF_OK;
        break;
      }
  IPCREF__UNLOCK(ctx);
  return r == IPCREF_OK
             ? r
             : ipcref__invalid(__func__,
                               "a backend serves that device type already, "
                               "or every slot is taken");
}

/* The pool of device `dev` (under the lock); NULL with *r set. */
IPCREF__PRIVATE ipcref__pool *
ipcref__pool_of(ipcref_ctx *ctx, ipcref_device dev, ipcref_result *r) {
  ipcref_backend *be = ipcref__backend_of(ctx, dev.type);
  ipcref__pool *pool;
  if (!be) {
    *r = IPCREF_ENODEV;
    return NULL;
  }
  for (pool = ctx->pools; pool; pool = pool->next)
    if (pool->be == be && pool->dev == dev.id) return pool;
  pool = (ipcref__pool *)ipcref__zalloc(sizeof *pool);
  if (!pool) {
    *r = IPCREF_ENOMEM;
    return NULL;
  }
  pool->be = be;
  pool->dev = dev.id;
  pool->next = ctx->pools;
  ctx->pools = pool;
  return pool;
}

IPCREF_API ipcref_result ipcref_device_new(ipcref_ctx *ctx, ipcref_device dev,
                                           size_t size, ipcref_buf **out) {
  ipcref__pool *pool;
  ipcref_result r = IPCREF_OK;
  if (!ctx || !out || dev.type <= IPCREF_DEVICE_CPU || dev.id < 0)
    return ipcref__invalid(__func__, !ctx || !out
                                         ? "ctx or out is NULL"
                                         : "dev is not a device (type, id)");
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  IPCREF__LOCK(ctx);
  pool = ipcref__pool_of(ctx, dev, &r);
  IPCREF__UNLOCK(ctx);
  if (!pool) return r;
  return ipcref__shared_new_in(ctx, pool, size, ctx->opt.isolate, out);
}

/* Extends chunk list `c` (its first: the allocation at `base`) with the
 * allocations that follow it one after the other up to `end`: VMM chunks
 * mapped in one range, found as the first was. EINVAL when there is a
 * gap, more than IPCREF_CHUNKS_MAX would be needed, or the backend maps
 * no chunks. */
IPCREF__PRIVATE ipcref_result ipcref__wrap_chunks(ipcref__pool *pool,
                                                  int32_t dev, uint64_t base,
                                                  uint64_t end,
                                                  ipcref__chunks *c) {
  ipcref_backend *be = pool->be;
  uint64_t top = base + c->size[0], next;
  size_t size;
  while (top < end) {
    if (!be->seg_export_chunks || c->n == IPCREF_CHUNKS_MAX ||
        be->seg_range(be, dev, top, &next, &size) != IPCREF_OK || next != top ||
        size == 0)
      return ipcref__invalid("ipcref_device_wrap",
                             "ptr and size not inside one allocation (nor "
                             "in IPCREF_CHUNKS_MAX VMM chunks mapped one "
                             "after the other)");
    c->fd[c->n] = -1;
    c->size[c->n++] = size;
    top += size;
  }
  return IPCREF_OK;
}

/* The wrapped allocation's segment (under the lock): the one made for it
 * before, else a new one (of its chunks, when several). */
IPCREF__PRIVATE ipcref_result ipcref__wrap_segment(ipcref_ctx *ctx,
                                                   ipcref__pool *pool,
                                                   uint64_t base,
                                                   const ipcref__chunks *c,
                                                   ipcref__segment **out) {
  ipcref__segment *s;
  ipcref_result r;
  uint64_t total = 0;
  int i;
  for (i = 0; i < c->n; i++) total += c->size[i];
  for (s = ctx->segments; s; s = s->next)
    if (s->pool == pool && s->cls == IPCREF__FOREIGN && s->daddr == base &&
        s->size == total && (s->vmm_chunks ? s->vmm_chunks->n : 1) == c->n) {
      *out = s;
      return IPCREF_OK;
    }
  r = ipcref__segment_new(ctx, pool, (size_t)total, 0, IPCREF__FOREIGN, base,
                          &s);
  if (r != IPCREF_OK || c->n == 1) {
    *out = s;
    return r;
  }
  s->vmm_chunks = (ipcref__chunks *)ipcref__zalloc(sizeof *s->vmm_chunks);
  if (!s->vmm_chunks) {
    ipcref__segment_destroy(ctx, s);
    return IPCREF_ENOMEM;
  }
  *s->vmm_chunks = *c;
  *out = s;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_device_wrap(
    ipcref_ctx *ctx, ipcref_device dev, void *ptr, size_t size,
    void (*release)(void *user, void *ptr), void *user, ipcref_buf **out) {
  ipcref__pool *pool;
  ipcref__segment *s;
  ipcref__block *b;
  ipcref_result r = IPCREF_OK;
  uint64_t addr = (uint64_t)(uintptr_t)ptr, base, end;
  size_t alloc_size;
  ipcref__chunks c;
  if (!ctx || !out || !ptr || dev.type <= IPCREF_DEVICE_CPU || dev.id < 0)
    return ipcref__invalid(__func__, !ctx || !out || !ptr
                                         ? "ctx, ptr or out is NULL"
                                         : "dev is not a device (type, id)");
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  IPCREF__LOCK(ctx);
  pool = ipcref__pool_of(ctx, dev, &r);
  IPCREF__UNLOCK(ctx);
  if (!pool) return r;
  /* The allocation that holds it (a driver call: not under the lock). */
  r = pool->be->seg_range(pool->be, dev.id, addr, &base, &alloc_size);
  if (r != IPCREF_OK) return r;
  if (addr < base || __builtin_add_overflow(addr, (uint64_t)size, &end))
    return ipcref__invalid(__func__, "ptr and size not inside one allocation");
  c.n = 1;
  c.size[0] = alloc_size;
  c.fd[0] = -1;
  r = ipcref__wrap_chunks(pool, dev.id, base, end, &c); /* VMM: several? */
  if (r != IPCREF_OK) return r;
  b = (ipcref__block *)ipcref__zalloc(sizeof *b);
  if (!b) return IPCREF_ENOMEM;
  IPCREF__LOCK(ctx);
  r = ipcref__wrap_segment(ctx, pool, base, &c, &s);
  if (r == IPCREF_OK) {
    s->nwraps++;
    b->seg = s;
    b->offset = (size_t)(addr - base);
    b->size = size;
    b->local = 1;
    b->release = release;
    b->user = user;
    b->ptr = ptr;
    ipcref__block_live(ctx, b);
  }
  IPCREF__UNLOCK(ctx);
  if (r != IPCREF_OK) {
    IPCREF_FREE(b);
    return r;
  }
  return ipcref__block_buf(b, size, out);
}

IPCREF_API ipcref_result ipcref_view_new_shared(ipcref_ctx *ctx,
                                                ipcref_dtype dt, int ndim,
                                                const int64_t *shape,
                                                ipcref_view *out) {
  ipcref_buf *b;
  ipcref_result r;
  int64_t n;
  if (!ctx || !out || (unsigned)dt >= IPCREF_DTYPE_COUNT)
    return ipcref__invalid(__func__, !ctx || !out ? "ctx or out is NULL"
                                                  : "dt out of range");
  r = ipcref__shape_numel(ndim, shape, ipcref__dtype_sizes[dt], &n);
  if (r == IPCREF_EINVAL) return ipcref__invalid(__func__, IPCREF__NO_SHAPE);
  if (r != IPCREF_OK) return r;
  r = ipcref_shared_new(ctx, (size_t)n * ipcref__dtype_sizes[dt], &b);
  if (r != IPCREF_OK) return r;
  r = ipcref_view_of(b, dt, ndim, shape, out);
  ipcref_buf_release(b); /* the view holds it now (or nothing does) */
  return r;
}

#endif /* IPCREF__SHARING_IMPL */
