/* share_map: what a message brings, checked and mapped for an import
 * (share_import's step 2). A host segment or a ledger by its fd: a memfd
 * sealed, of its announced size and access, a ledger's header and bell as
 * its record says. A device segment another process exported: by its IPC
 * handle, by the fd of a VMM allocation or of a pool (with the pointer's
 * data), or as VMM chunks by an fd each; each opening the backend's,
 * checked against what its record announces. Under ctx->lock. */

#ifdef IPCREF__SHARING_IMPL

/* 1 when `fd` may be a ledger's bell: a datagram socket, to which a
 * return sends one byte, never waiting (whatever it is connected to, the
 * producer could send there itself). */
IPCREF__PRIVATE int ipcref__bell_ok(int fd) {
  struct stat st;
  int type = 0;
  socklen_t len = sizeof type;
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) &&
         getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 &&
         type == SOCK_DGRAM;
}

/* What is wrong with a received fd for record `r` (NULL: nothing), and
 * the protection to map it with. It must be a memfd sealed against
 * shrinking and growing (so the mapping can never SIGBUS), of exactly the
 * announced size, opened with the access the mapping needs; a ledger's
 * bell (the fd after it) must be one (see ipcref__bell_ok). */
IPCREF__PRIVATE const char *ipcref__fd_why(int fd, int bell,
                                           const ipcref__fd_rec *r, int *prot) {
  struct stat st;
  int seals, fl;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return "a segment or ledger fd that is not a memfd";
  if ((uint64_t)st.st_size != r->size || r->size == 0 ||
      r->size > (uint64_t)PTRDIFF_MAX)
    return "a segment or ledger fd not of the size its record says";
  seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    return "a segment or ledger fd not sealed against shrinking and growing";
  fl = fcntl(fd, F_GETFL);
  if (fl < 0) return "an fd whose access mode cannot be read";
  if (r->kind == IPCREF__KIND_LEDGER && r->size < IPCREF__LEDGER_HDR)
    return "a ledger smaller than its header";
  if (r->kind == IPCREF__KIND_LEDGER && !ipcref__bell_ok(bell))
    return "a ledger's bell that is not a datagram socket";
  *prot = PROT_READ;
  if (r->kind == IPCREF__KIND_LEDGER || r->writable) { /* mapped writable */
    if ((fl & O_ACCMODE) != O_RDWR ||
        (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0)
      return "a ledger or writable segment fd not open read-write, or "
             "sealed against writes";
    *prot = PROT_READ | PROT_WRITE;
  } else if ((fl & O_ACCMODE) == O_WRONLY) {
    return "a segment fd opened write-only";
  }
  return NULL;
}

/* Checks a received fd against its record and maps it (*why says what
 * was wrong on EPROTO). A ledger's header must agree with the record. */
IPCREF__PRIVATE ipcref_result ipcref__map_fd(int fd, int bell,
                                             const ipcref__fd_rec *r,
                                             ipcref__map **out,
                                             const char **why) {
  int prot = PROT_READ;
  ipcref__map *m;
  unsigned char *base;
  if ((*why = ipcref__fd_why(fd, bell, r, &prot)) != NULL) return IPCREF_EPROTO;
  base = (unsigned char *)mmap(NULL, (size_t)r->size, prot, MAP_SHARED, fd, 0);
  if (base == (unsigned char *)MAP_FAILED) return IPCREF_ESYS;
  m = (ipcref__map *)ipcref__zalloc(sizeof *m);
  if (!m) {
    munmap(base, (size_t)r->size);
    return IPCREF_ENOMEM;
  }
  m->kind = r->kind;
  m->origin_nonce = r->origin_nonce;
  m->origin_pid = (int)r->origin_pid;
  m->id = r->id;
  m->fd = fd;
  m->bell = r->kind == IPCREF__KIND_LEDGER ? bell : -1;
  m->base = base;
  m->size = (size_t)r->size;
  m->writable = r->kind == IPCREF__KIND_SEGMENT && r->writable;
  if (r->kind == IPCREF__KIND_LEDGER) {
    ipcref__ledger_hdr *h = (ipcref__ledger_hdr *)(void *)base;
    uint32_t n = h->nslots;
    if (h->magic != IPCREF__LEDGER_MAGIC ||
        h->version != IPCREF__LEDGER_VERSION || n < 2 || n > (1u << 24) ||
        (n & 1) || ipcref__ledger_bytes(n) != r->size ||
        h->origin_nonce != r->origin_nonce || h->ledger_id != r->id) {
      munmap(base, (size_t)r->size);
      IPCREF_FREE(m);
      *why = "a ledger whose header disagrees with its record";
      return IPCREF_EPROTO;
    }
    m->nslots = n;
    m->imported = (uint32_t *)ipcref__zalloc(n * sizeof(uint32_t));
    if (!m->imported) {
      munmap(base, (size_t)r->size);
      IPCREF_FREE(m);
      return IPCREF_ENOMEM;
    }
  }
  *out = m;
  return IPCREF_OK;
}

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
