/* share_devmap: device segments another process exported, opened for an
 * import: by their IPC handle, by the fd of a VMM allocation or of a pool
 * (with the pointer's data), or as VMM chunks by an fd each; each opening
 * the backend's, checked against what its record announces. Under
 * ctx->lock (share_import's step 2). */

#ifdef IPCREF__SHARING_IMPL

/* What every device map takes from its record: origin, id, size, device,
 * and where the backend (NULL: none here) opened it. */
IPCREF__PRIVATE void ipcref__map_device_fill(ipcref__map *m,
                                             const ipcref__fd_rec *r,
                                             ipcref_backend *be,
                                             uint64_t addr) {
  m->kind = IPCREF__KIND_DEVICE;
  m->bell = -1;
  m->origin_nonce = r->origin_nonce;
  m->origin_pid = (int)r->origin_pid;
  m->id = r->id;
  m->size = (size_t)r->size;
  m->writable = r->writable != 0;
  m->be = be;
  m->dev_type = r->dev_type;
  m->dev_id = r->dev_id;
  m->daddr = addr;
}

/* Opens a device segment another process exported (under the lock): by
 * its handle (fd -1), where the allocation the driver opens must be at
 * least as large as announced, or by the fd it came with (record kind 4),
 * which the backend maps at the announced size or refuses. Without a
 * backend for its device here (or one that takes no fds), the map is a
 * placeholder (be NULL): the views in it are refused with ENODEV and
 * their leases given back, and the peer, which counts the segment as
 * sent, stays usable. The map takes the fd on success. */
IPCREF__PRIVATE ipcref_result ipcref__map_device(ipcref_ctx *ctx,
                                                 const ipcref__fd_rec *r,
                                                 int fd, ipcref__map **out,
                                                 const char **why) {
  ipcref_backend *be = ipcref__backend_of(ctx, r->dev_type);
  ipcref__map *m;
  int pooled = r->kind == IPCREF__KIND_DEVICE_POOL;
  uint64_t addr = 0, base;
  size_t size;
  ipcref_result res;
  *why = "a device segment of size 0 or too large";
  if (r->size == 0 || r->size > (uint64_t)PTRDIFF_MAX) return IPCREF_EPROTO;
  if (fd >= 0 && be && !be->seg_import_fd) be = NULL;
  m = (ipcref__map *)ipcref__zalloc(sizeof *m);
  if (!m) return IPCREF_ENOMEM;
  if (!be) goto fill;
  *why = pooled    ? "pool memory that its pool's fd and data do not give, "
                     "at its announced size"
         : fd >= 0 ? "a device fd that is no shareable allocation of its "
                     "announced size"
                   : "a device handle the driver does not open";
  res = fd >= 0 ? be->seg_import_fd(be, r->dev_id, fd, r->handle, pooled,
                                    r->size, r->writable != 0, &addr)
                : be->seg_import(be, r->dev_id, r->handle, &addr);
  if (res != IPCREF_OK) {
    IPCREF_FREE(m);
    return res;
  }
  if (fd < 0 &&
      (be->seg_range(be, r->dev_id, addr, &base, &size) != IPCREF_OK ||
       base != addr || (uint64_t)size < r->size)) {
    be->seg_close(be, r->dev_id, addr);
    IPCREF_FREE(m);
    *why = "a device handle whose allocation is not the one announced";
    return IPCREF_EPROTO;
  }
fill:
  ipcref__map_device_fill(m, r, be, addr);
  m->fd = fd; /* kept for forwarding */
  m->by_fd = fd >= 0;
  m->pooled = pooled;
  memcpy(m->handle, r->handle, sizeof m->handle);
  *out = m;
  return IPCREF_OK;
}

/* Opens a device segment of VMM chunks another process exported, by the
 * fds it came with (record kind 6, the map takes them on success; with
 * no backend here that maps chunks, a placeholder, as ipcref__map_device
 * makes). */
IPCREF__PRIVATE ipcref_result ipcref__map_chunks(ipcref_ctx *ctx,
                                                 const ipcref__fd_rec *r,
                                                 const int *fds,
                                                 ipcref__map **out,
                                                 const char **why) {
  ipcref_backend *be = ipcref__backend_of(ctx, r->dev_type);
  ipcref__map *m;
  ipcref__chunks *c;
  uint64_t addr = 0;
  int i;
  *why = "a device segment of size 0 or too large";
  if (r->size > (uint64_t)PTRDIFF_MAX) return IPCREF_EPROTO;
  m = (ipcref__map *)ipcref__zalloc(sizeof *m);
  c = (ipcref__chunks *)ipcref__zalloc(sizeof *c);
  if (!m || !c) {
    IPCREF_FREE(m);
    IPCREF_FREE(c);
    return IPCREF_ENOMEM;
  }
  if (be && be->seg_import_chunks) {
    ipcref_result res;
    *why = "device chunks whose fds are no shareable allocations of their "
           "announced sizes";
    res = be->seg_import_chunks(be, r->dev_id, fds, r->chunk, r->nchunks,
                                r->writable != 0, &addr);
    if (res != IPCREF_OK) {
      IPCREF_FREE(m);
      IPCREF_FREE(c);
      return res;
    }
  } else {
    be = NULL;
  }
  c->n = r->nchunks;
  for (i = 0; i < c->n; i++) {
    c->size[i] = r->chunk[i];
    c->fd[i] = fds[i]; /* kept for forwarding */
  }
  ipcref__map_device_fill(m, r, be, addr);
  m->fd = -1;
  m->by_fd = 1;
  m->vmm_chunks = c;
  *out = m;
  return IPCREF_OK;
}

/* The address of `offset` in a mapped segment, host or device. */
IPCREF__PRIVATE void *ipcref__map_addr(const ipcref__map *m, uint64_t offset) {
  return m->kind == IPCREF__KIND_DEVICE ? (void *)(uintptr_t)(m->daddr + offset)
                                        : (void *)(m->base + offset);
}

#endif /* IPCREF__SHARING_IMPL */
