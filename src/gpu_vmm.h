/* gpu_vmm: device memory shared by fd, the logic both backends share
 * (tools/amalgamate.py writes it into src/gpu.h at its "@vmm" line, with
 * the same renaming). Memory made with the driver's virtual memory
 * management (CUDA: cuMemCreate, reserved and mapped with
 * cuMemAddressReserve / cuMemMap / cuMemSetAccess) cannot go through
 * legacy IPC: its allocation is exported as a POSIX fd
 * (cuMemExportToShareableHandle), which crosses to the peer over
 * SCM_RIGHTS like a memfd, and the peer imports it
 * (cuMemImportFromShareableHandle) and maps it into a range of its own,
 * with the access it sets itself (a mapping starts with none).
 *
 * The driver's part makes each call (ipcref__gpu_d_vmm_*) and says
 * whether a device has them all (ipcref__gpu_d_vmm_supported); a device
 * without them is legacy, and asking it for VMM says ENOTSUP. The
 * allocations this process
 * made and the ones it imported are two lists under g->lock, each record
 * holding what its release needs. */

/* One mapped allocation: made here (g->vmm_made) or imported
 * (g->vmm_opened). */
typedef struct ipcref__gpu_vmm {
  uint64_t addr, handle; /* the mapping; the allocation's handle */
  size_t size;           /* of the mapping (whole granules) */
  int dev;
  int n; /* imported in chunks: how many were mapped (handle unused) */
  uint64_t chunk_h[IPCREF_CHUNKS_MAX];
  size_t chunk_size[IPCREF_CHUNKS_MAX];
  int exported; /* made here and exported: the file its fd opens */
  dev_t fd_dev; /* (st_dev, st_ino of that fd), to know the fd when */
  ino_t fd_ino; /* it comes back to this process */
  struct ipcref__gpu_vmm *next;
} ipcref__gpu_vmm;

/* 1 when device `dev` can make memory shareable by fd: asked of the
 * driver once (its attributes), then remembered. */
IPCREF__PRIVATE int ipcref__gpu_vmm_able(ipcref_gpu *g, int dev) {
  signed char known;
  pthread_mutex_lock(&g->lock);
  known = g->vmm_able[dev];
  pthread_mutex_unlock(&g->lock);
  if (known) return known > 0;
  known = ipcref__gpu_d_vmm_supported(&g->drv, dev) ? 1 : -1;
  pthread_mutex_lock(&g->lock);
  g->vmm_able[dev] = known;
  pthread_mutex_unlock(&g->lock);
  return known > 0;
}

/* 1 when a segment of device `dev` is to be VMM memory (the device is
 * current on this thread). */
IPCREF__PRIVATE int ipcref__gpu_vmm_wanted(ipcref_gpu *g, int dev) {
  int memory;
  pthread_mutex_lock(&g->lock);
  memory = g->memory;
  pthread_mutex_unlock(&g->lock);
  if (memory == IPCREF_GPU_MEMORY_LEGACY) return 0;
  return memory == IPCREF_GPU_MEMORY_VMM ||
         (IPCREF__GPU_VMM_AUTO && ipcref__gpu_vmm_able(g, dev));
}

/* `size` rounded up to device `dev`'s granularity into *out: 0, or the
 * driver's error (or -1 when the sum overflows). */
IPCREF__PRIVATE int ipcref__gpu_vmm_round(ipcref_gpu *g, int dev, uint64_t size,
                                          size_t *out) {
  size_t gran = 0;
  int code = ipcref__gpu_d_vmm_granularity(&g->drv, dev, &gran);
  if (code) return code;
  if (gran == 0 || size > (uint64_t)PTRDIFF_MAX - gran) return -1;
  *out = (size_t)((size + gran - 1) / gran * gran);
  return 0;
}

/* Undoes a mapping, in the order the driver documents: the work queued on
 * it is waited for first (unmapping does not wait for it), then unmapped,
 * the allocation's handle released (the memory goes with its last
 * mapping and handle, in every process), the range given back. */
IPCREF__PRIVATE void
ipcref__gpu_vmm_undo(ipcref_gpu *g, const ipcref__gpu_vmm *m, int mapped) {
  if (m->n) { /* chunks: each mapped one, then the range */
    uint64_t at = m->addr;
    int i;
    (void)ipcref__gpu_d_sync(&g->drv);
    for (i = 0; i < m->n; i++) {
      (void)ipcref__gpu_d_vmm_unmap(&g->drv, at, m->chunk_size[i]);
      (void)ipcref__gpu_d_vmm_release(&g->drv, m->chunk_h[i]);
      at += m->chunk_size[i];
    }
    (void)ipcref__gpu_d_vmm_unreserve(&g->drv, m->addr, m->size);
    return;
  }
  if (mapped) {
    (void)ipcref__gpu_d_sync(&g->drv);
    (void)ipcref__gpu_d_vmm_unmap(&g->drv, m->addr, m->size);
  }
  if (m->handle) (void)ipcref__gpu_d_vmm_release(&g->drv, m->handle);
  if (m->addr) (void)ipcref__gpu_d_vmm_unreserve(&g->drv, m->addr, m->size);
}

/* Maps allocation m->handle (m->size bytes) into a range of its own, with
 * the access given; on failure undoes what it did but the handle. 0, or
 * the driver's error (*what says which step). */
IPCREF__PRIVATE int ipcref__gpu_vmm_place(ipcref_gpu *g, ipcref__gpu_vmm *m,
                                          int writable, const char **what) {
  int code;
  *what = "reserving an address range";
  code = ipcref__gpu_d_vmm_reserve(&g->drv, m->size, &m->addr);
  if (code) {
    m->addr = 0;
    return code;
  }
  *what = "mapping the allocation";
  code = ipcref__gpu_d_vmm_map(&g->drv, m->addr, m->size, m->handle);
  if (!code) {
    *what = "setting the mapping's access";
    code =
        ipcref__gpu_d_vmm_access(&g->drv, m->addr, m->size, m->dev, writable);
    if (code) (void)ipcref__gpu_d_vmm_unmap(&g->drv, m->addr, m->size);
  }
  if (code) {
    (void)ipcref__gpu_d_vmm_unreserve(&g->drv, m->addr, m->size);
    m->addr = 0;
  }
  return code;
}

/* Puts mapping record `m` on a list (under the lock). */
IPCREF__PRIVATE void ipcref__gpu_vmm_push(ipcref_gpu *g, ipcref__gpu_vmm **list,
                                          ipcref__gpu_vmm *m) {
  pthread_mutex_lock(&g->lock);
  m->next = *list;
  *list = m;
  pthread_mutex_unlock(&g->lock);
}

/* Takes the record of the mapping at `addr` off a list: NULL when it is
 * not there. */
IPCREF__PRIVATE ipcref__gpu_vmm *ipcref__gpu_vmm_take(ipcref_gpu *g,
                                                      ipcref__gpu_vmm **list,
                                                      int dev, uint64_t addr) {
  ipcref__gpu_vmm **pp, *m = NULL;
  pthread_mutex_lock(&g->lock);
  for (pp = list; *pp; pp = &(*pp)->next)
    if ((*pp)->addr == addr && (*pp)->dev == dev) {
      m = *pp;
      *pp = m->next;
      break;
    }
  pthread_mutex_unlock(&g->lock);
  return m;
}

/* A segment of VMM memory: `size` rounded up to whole granules, made
 * shareable by fd, mapped read-write for device `dev` (current). */
IPCREF__PRIVATE ipcref_result ipcref__gpu_vmm_alloc(ipcref_gpu *g, int dev,
                                                    size_t size,
                                                    uint64_t *addr) {
  ipcref__gpu_vmm *m;
  const char *what = "finding the allocation granularity";
  int code;
  if (!ipcref__gpu_vmm_able(g, dev))
    return ipcref__gpu_say(IPCREF_ENOTSUP,
                           "the device cannot share memory by fd (virtual "
                           "memory management with POSIX fd handles): "
                           "choose legacy memory (set_memory)");
  m = (ipcref__gpu_vmm *)IPCREF_MALLOC(sizeof *m);
  if (!m) return IPCREF_ENOMEM;
  memset(m, 0, sizeof *m);
  m->dev = dev;
  code = ipcref__gpu_vmm_round(g, dev, size, &m->size);
  if (!code) {
    what = "allocating";
    code = ipcref__gpu_d_vmm_create(&g->drv, dev, m->size, &m->handle);
  }
  if (!code) code = ipcref__gpu_vmm_place(g, m, 1, &what);
  if (code) {
    ipcref__gpu_vmm_undo(g, m, 0);
    IPCREF_FREE(m);
    if (code < 0) return ipcref__gpu_say(IPCREF_ENOMEM, "size too large");
    return ipcref__gpu_fail(ipcref__gpu_code(code), what, g, code);
  }
  ipcref__gpu_vmm_push(g, &g->vmm_made, m);
  *addr = m->addr;
  return IPCREF_OK;
}

/* Frees the VMM segment at `addr`: 1, or 0 when it is not one. */
IPCREF__PRIVATE int ipcref__gpu_vmm_free(ipcref_gpu *g, int dev,
                                         uint64_t addr) {
  ipcref__gpu_vmm *m = ipcref__gpu_vmm_take(g, &g->vmm_made, dev, addr);
  if (!m) return 0;
  ipcref__gpu_vmm_undo(g, m, 1);
  IPCREF_FREE(m);
  return 1;
}

/* An fd for the VMM allocation another allocator mapped at `base` (a
 * wrapped pointer: PyTorch's expandable segments, NCCL's buffers): found
 * with cuMemRetainAllocationHandle, exported, released. ENOTSUP for
 * memory that is not VMM; EINVAL, saying so, for VMM memory made without
 * the POSIX fd handle type (it can never be shared by fd). */
IPCREF__PRIVATE ipcref_result ipcref__gpu_vmm_export_foreign(ipcref_gpu *g,
                                                             uint64_t base,
                                                             int *fd) {
  uint64_t h = 0;
  int fd_ok = 0, code = ipcref__gpu_d_vmm_retain(&g->drv, base, &h, &fd_ok);
  if (code) return IPCREF_ENOTSUP; /* not VMM: legacy IPC's */
  if (!fd_ok) {
    (void)ipcref__gpu_d_vmm_release(&g->drv, h);
    return ipcref__gpu_say(IPCREF_EINVAL,
                           "VMM memory made without the POSIX fd handle type "
                           "(its allocator must ask for it in "
                           "requestedHandleTypes): it cannot be shared");
  }
  code = ipcref__gpu_d_vmm_export(&g->drv, h, fd);
  (void)ipcref__gpu_d_vmm_release(&g->drv, h);
  if (code) {
    *fd = -1;
    return ipcref__gpu_fail(ipcref__gpu_code(code),
                            "exporting the allocation as an fd", g, code);
  }
  return IPCREF_OK;
}

/* The backend's seg_export_fd: an fd for the VMM segment at `base`, made
 * here or by another allocator, or for the pool memory there (its pool's
 * fd and its data: *pooled); ENOTSUP for memory shared by handle. The
 * sharing layer exports and frees a segment under its context's lock, so
 * the record found stays while it is used. */
IPCREF__PRIVATE ipcref_result ipcref__gpu_seg_export_fd(ipcref_backend *be,
                                                        int32_t dev,
                                                        uint64_t base, int *fd,
                                                        unsigned char *data,
                                                        int *pooled) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref__gpu_vmm *m;
  struct stat st;
  ipcref_result r = ipcref__gpu_on(g, dev);
  int code;
  *fd = -1;
  *pooled = 0;
  if (r != IPCREF_OK) return r;
  pthread_mutex_lock(&g->lock);
  for (m = g->vmm_made; m && (m->addr != base || m->dev != dev); m = m->next) {
  }
  pthread_mutex_unlock(&g->lock);
  if (!m) { /* another allocator's: VMM, or a pool's */
    r = ipcref__gpu_vmm_export_foreign(g, base, fd);
    if (r != IPCREF_ENOTSUP) return r;
    r = ipcref__gpu_pool_export(g, dev, base, fd, data);
    *pooled = r == IPCREF_OK;
    return r;
  }
  code = ipcref__gpu_d_vmm_export(&g->drv, m->handle, fd);
  if (code) {
    *fd = -1;
    return ipcref__gpu_fail(ipcref__gpu_code(code),
                            "exporting the allocation as an fd", g, code);
  }
  if (fstat(*fd, &st) == 0) { /* see ipcref__gpu_vmm_own */
    pthread_mutex_lock(&g->lock);
    m->exported = 1;
    m->fd_dev = st.st_dev;
    m->fd_ino = st.st_ino;
    pthread_mutex_unlock(&g->lock);
  }
  return IPCREF_OK;
}

/* The address of this process's own VMM segment that `fd` was exported
 * from (0: none). The sharing layer keeps each exported fd open, and a
 * peer that sends it back sends the same open file: its identity tells,
 * whatever the driver's files are. Its own memory resolves to its own
 * mapping, as a legacy handle does, instead of a second mapping. */
IPCREF__PRIVATE uint64_t ipcref__gpu_vmm_own(ipcref_gpu *g, int dev, int fd,
                                             size_t *size) {
  ipcref__gpu_vmm *m;
  struct stat st;
  uint64_t addr = 0;
  if (fstat(fd, &st) != 0) return 0;
  pthread_mutex_lock(&g->lock);
  for (m = g->vmm_made; m && !addr; m = m->next)
    if (m->exported && m->dev == dev && m->fd_dev == st.st_dev &&
        m->fd_ino == st.st_ino) {
      addr = m->addr;
      *size = m->size;
    }
  pthread_mutex_unlock(&g->lock);
  return addr;
}

/* A new record of an import on device `dev`, which must map memory shared
 * by fd: ENODEV, said, when it cannot. */
IPCREF__PRIVATE ipcref_result ipcref__gpu_vmm_new(ipcref_gpu *g, int dev,
                                                  ipcref__gpu_vmm **out) {
  ipcref__gpu_vmm *m;
  if (!ipcref__gpu_vmm_able(g, dev))
    return ipcref__gpu_say(IPCREF_ENODEV, "the device cannot map memory "
                                          "shared by fd");
  m = (ipcref__gpu_vmm *)IPCREF_MALLOC(sizeof *m);
  if (!m) return IPCREF_ENOMEM;
  memset(m, 0, sizeof *m);
  m->dev = dev;
  *out = m;
  return IPCREF_OK;
}

/* The backend's seg_import_fd: the allocation `fd` shares, mapped at
 * `size` rounded up to whole granules (the driver refuses a mapping past
 * the allocation's end, so a record that claims more than was shared is
 * refused), with read or read-write access for device `dev`; or the pool
 * memory `fd` (its pool's) and `data` name. Whatever the driver refuses
 * of the fd is the peer's fault: EPROTO, but for out of memory. */
IPCREF__PRIVATE ipcref_result ipcref__gpu_seg_import_fd(
    ipcref_backend *be, int32_t dev, int fd, const unsigned char *data,
    int pooled, uint64_t size, int writable, uint64_t *addr) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref__gpu_vmm *m;
  const char *what = "importing the fd";
  size_t own_size = 0;
  ipcref_result r = ipcref__gpu_on(g, dev);
  int code;
  if (r != IPCREF_OK) return r;
  if (pooled)
    return ipcref__gpu_pool_import(g, dev, fd, data, size, writable, addr);
  if ((*addr = ipcref__gpu_vmm_own(g, dev, fd, &own_size)) != 0)
    return size <= own_size
               ? IPCREF_OK
               : ipcref__gpu_say(IPCREF_EPROTO, "a size past the allocation's");
  if ((r = ipcref__gpu_vmm_new(g, dev, &m)) != IPCREF_OK) return r;
  code = ipcref__gpu_d_vmm_import(&g->drv, fd, &m->handle);
  if (!code) {
    what = "finding the allocation granularity";
    code = ipcref__gpu_vmm_round(g, dev, size, &m->size);
  }
  if (!code) code = ipcref__gpu_vmm_place(g, m, writable, &what);
  if (code) {
    ipcref__gpu_vmm_undo(g, m, 0);
    IPCREF_FREE(m);
    if (code < 0)
      return ipcref__gpu_say(IPCREF_EPROTO, "a shared size out of range");
    return ipcref__gpu_fail(
        code == IPCREF__GPU_OOM ? IPCREF_ENOMEM : IPCREF_EPROTO, what, g, code);
  }
  ipcref__gpu_vmm_push(g, &g->vmm_opened, m);
  *addr = m->addr;
  return IPCREF_OK;
}

/* The backend's seg_export_chunks: an fd for each VMM chunk another
 * allocator mapped one after the other from `base` (PyTorch's expandable
 * segments), each found and exported as a single one is; all or none. */
IPCREF__PRIVATE ipcref_result
ipcref__gpu_seg_export_chunks(ipcref_backend *be, int32_t dev, uint64_t base,
                              const uint64_t *sizes, int n, int *fds) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref_result r = ipcref__gpu_on(g, dev);
  uint64_t at = base;
  int i;
  for (i = 0; i < n; i++) fds[i] = -1;
  for (i = 0; i < n && r == IPCREF_OK; i++) {
    r = ipcref__gpu_vmm_export_foreign(g, at, &fds[i]);
    if (r == IPCREF_ENOTSUP)
      r = ipcref__gpu_say(IPCREF_EINVAL, "a buffer across allocations that "
                                         "are not VMM memory");
    at += sizes[i];
  }
  if (r != IPCREF_OK)
    for (i = 0; i < n; i++)
      if (fds[i] >= 0) {
        close(fds[i]);
        fds[i] = -1;
      }
  return r;
}

/* Maps chunk i of `m` (imported from fds[i]) at its place: 0, or the
 * driver's error (*what says which step). */
IPCREF__PRIVATE int ipcref__gpu_vmm_chunk(ipcref_gpu *g, ipcref__gpu_vmm *m,
                                          int fd, uint64_t at, int writable,
                                          const char **what) {
  size_t size = m->chunk_size[m->n];
  uint64_t h = 0;
  int code;
  *what = "importing a chunk's fd";
  code = ipcref__gpu_d_vmm_import(&g->drv, fd, &h);
  if (code) return code;
  *what = "mapping a chunk";
  code = ipcref__gpu_d_vmm_map(&g->drv, at, size, h);
  if (!code) {
    *what = "setting a chunk's access";
    code = ipcref__gpu_d_vmm_access(&g->drv, at, size, m->dev, writable);
    if (code) (void)ipcref__gpu_d_vmm_unmap(&g->drv, at, size);
  }
  if (code) {
    (void)ipcref__gpu_d_vmm_release(&g->drv, h);
    return code;
  }
  m->chunk_h[m->n++] = h;
  return 0;
}

/* The backend's seg_import_chunks: the `n` chunks the fds share, mapped
 * one after the other in one range of this process's, with read or
 * read-write access for device `dev`. What the driver refuses is the
 * peer's fault (EPROTO), but for out of memory. */
IPCREF__PRIVATE ipcref_result ipcref__gpu_seg_import_chunks(
    ipcref_backend *be, int32_t dev, const int *fds, const uint64_t *sizes,
    int n, int writable, uint64_t *addr) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref__gpu_vmm *m;
  const char *what = "reserving an address range";
  ipcref_result r = ipcref__gpu_on(g, dev);
  uint64_t at;
  int i, code;
  if (r != IPCREF_OK) return r;
  if (n < 1 || n > IPCREF_CHUNKS_MAX) return IPCREF_EPROTO; /* checked */
  if ((r = ipcref__gpu_vmm_new(g, dev, &m)) != IPCREF_OK) return r;
  for (i = 0; i < n; i++) { /* the sum was checked against the record's */
    m->chunk_size[i] = (size_t)sizes[i];
    m->size += (size_t)sizes[i];
  }
  code = ipcref__gpu_d_vmm_reserve(&g->drv, m->size, &m->addr);
  for (i = 0, at = m->addr; !code && i < n; at += sizes[i++])
    code = ipcref__gpu_vmm_chunk(g, m, fds[i], at, writable, &what);
  if (code) {
    if (m->addr && m->n)
      ipcref__gpu_vmm_undo(g, m, 1);
    else if (m->addr)
      (void)ipcref__gpu_d_vmm_unreserve(&g->drv, m->addr, m->size);
    IPCREF_FREE(m);
    return ipcref__gpu_fail(
        code == IPCREF__GPU_OOM ? IPCREF_ENOMEM : IPCREF_EPROTO, what, g, code);
  }
  ipcref__gpu_vmm_push(g, &g->vmm_opened, m);
  *addr = m->addr;
  return IPCREF_OK;
}

/* Closes an imported VMM mapping or pool pointer at `addr`: 1, or 0 when
 * it is neither. */
IPCREF__PRIVATE int ipcref__gpu_vmm_close(ipcref_gpu *g, int dev,
                                          uint64_t addr) {
  ipcref__gpu_vmm *m = ipcref__gpu_vmm_take(g, &g->vmm_opened, dev, addr);
  if (!m) return ipcref__gpu_pool_close(g, dev, addr);
  if (ipcref__gpu_on(g, dev) == IPCREF_OK) ipcref__gpu_vmm_undo(g, m, 1);
  IPCREF_FREE(m);
  return 1;
}

/* At ipcref_gpu_close: what is still mapped goes (the contexts that used
 * it are gone: see ipcref_gpu_close). */
IPCREF__PRIVATE void ipcref__gpu_vmm_close_all(ipcref_gpu *g) {
  ipcref__gpu_vmm **lists[2], *m;
  int i;
  ipcref__gpu_pool_close_all(g);
  lists[0] = &g->vmm_made;
  lists[1] = &g->vmm_opened;
  for (i = 0; i < 2; i++)
    while ((m = *lists[i]) != NULL) {
      *lists[i] = m->next;
      if (ipcref__gpu_on(g, m->dev) == IPCREF_OK) ipcref__gpu_vmm_undo(g, m, 1);
      IPCREF_FREE(m);
    }
}
