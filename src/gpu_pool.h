/* gpu_pool: stream-ordered pool memory shared by fd, the logic both
 * backends share (tools/amalgamate.py writes it into src/gpu.h after
 * src/gpu_vmm.h, with the same renaming). A pointer from a pool created
 * shareable (cudaMallocAsync from a pool whose handleTypes is
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) is wrapped like any other; it
 * goes to a peer as its pool's fd (cuMemPoolExportToShareableHandle, made
 * once per pool: every peer gets the same open file, so an importer knows
 * the pool by it) and the pointer's export data (cuMemPoolExportPointer).
 * The peer imports the pool once (cuMemPoolImportFromShareableHandle, then
 * cuMemPoolSetAccess for its device) and the pointer each time it maps it
 * (cuMemPoolImportPointer), and frees it (cuMemFree) when its last buffer
 * in it goes, before that buffer's lease returns: the driver wants
 * imported memory freed in every importer before its exporter frees it.
 * The producer's send records an event after its stream's work, which
 * includes the allocation when it is sent on the allocating stream.
 *
 * Four lists under g->lock: the pools exported (their fds), the pools
 * imported (known by their fd's file), the pointers imported, and the
 * pointers exported (their data, so that one coming back to this process
 * resolves to its own address: the driver refuses to import it here). */

/* A pool this process exported, or imported; a pointer exported or
 * imported. */
typedef struct ipcref__gpu_pool {
  uint64_t pool;   /* the driver's handle */
  int fd;          /* exported: the fd every peer gets a copy of */
  dev_t fd_dev;    /* imported: the file its fd opens */
  ino_t fd_ino;    /* (see above) */
  int dev, access; /* imported: the device, and its access (2: read-write) */
  struct ipcref__gpu_pool *next;
} ipcref__gpu_pool;

typedef struct ipcref__gpu_pool_ptr {
  uint64_t addr;
  int dev;
  unsigned char data[IPCREF_HANDLE_BYTES]; /* exported: its export data */
  struct ipcref__gpu_pool_ptr *next;
} ipcref__gpu_pool_ptr;

/* The fd of pool `pool`, exported once (under the lock): -1 with *r set
 * when the pool was not created shareable. */
IPCREF__PRIVATE int ipcref__gpu_pool_fd(ipcref_gpu *g, uint64_t pool,
                                        ipcref_result *r) {
  ipcref__gpu_pool *p;
  int code, fd = -1;
  for (p = g->pools_out; p; p = p->next)
    if (p->pool == pool) return p->fd;
  code = ipcref__gpu_d_pool_export(&g->drv, pool, &fd);
  if (code) {
    *r = ipcref__gpu_say(IPCREF_EINVAL,
                         "memory of a pool not created shareable: create "
                         "the pool with handleTypes "
                         "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR "
                         "(cuMemPoolCreate; a device's default pool is not)");
    return -1;
  }
  p = (ipcref__gpu_pool *)IPCREF_MALLOC(sizeof *p);
  if (!p) {
    close(fd);
    *r = IPCREF_ENOMEM;
    return -1;
  }
  memset(p, 0, sizeof *p);
  p->pool = pool;
  p->fd = fd;
  p->next = g->pools_out;
  g->pools_out = p;
  return fd;
}

/* Remembers that this process exported `addr` as `data` (under the lock;
 * one record per address, so that the list is as long as the addresses
 * ever sent). 0 when out of memory. */
IPCREF__PRIVATE int ipcref__gpu_pool_own(ipcref_gpu *g, int dev, uint64_t addr,
                                         const unsigned char *data) {
  ipcref__gpu_pool_ptr *x;
  for (x = g->pool_sent; x; x = x->next)
    if (x->addr == addr && x->dev == dev) break;
  if (!x) {
    x = (ipcref__gpu_pool_ptr *)IPCREF_MALLOC(sizeof *x);
    if (!x) return 0;
    x->addr = addr;
    x->dev = dev;
    x->next = g->pool_sent;
    g->pool_sent = x;
  }
  memcpy(x->data, data, IPCREF_HANDLE_BYTES);
  return 1;
}

/* Exports the pool memory at `base`: a copy of its pool's fd, and its
 * data. ENOTSUP for memory that is not from a pool. */
IPCREF__PRIVATE ipcref_result ipcref__gpu_pool_export(ipcref_gpu *g, int dev,
                                                      uint64_t base, int *fd,
                                                      unsigned char *data) {
  uint64_t pool;
  ipcref_result r = IPCREF_OK;
  int code, pfd;
  if (!ipcref__gpu_d_pool_supported(&g->drv) ||
      !(pool = ipcref__gpu_d_pool_of(&g->drv, base)))
    return IPCREF_ENOTSUP;
  pthread_mutex_lock(&g->lock); /* the pool first: its error says more */
  pfd = ipcref__gpu_pool_fd(g, pool, &r);
  code = pfd < 0 ? 0 : ipcref__gpu_d_pool_export_ptr(&g->drv, base, data);
  if (code)
    r = ipcref__gpu_fail(ipcref__gpu_code(code), "exporting the pointer", g,
                         code);
  if (r == IPCREF_OK && !ipcref__gpu_pool_own(g, dev, base, data))
    r = IPCREF_ENOMEM;
  if (r == IPCREF_OK &&
      (*fd = fcntl(pfd, F_DUPFD_CLOEXEC, 0)) < 0) /* the same open file */
    r = ipcref__gpu_say(IPCREF_ESYS, "dup of the pool's fd failed");
  pthread_mutex_unlock(&g->lock);
  return r;
}

/* The imported pool that `fd` opens (by its file), imported now if new
 * and given the access asked (under the lock): 0 with *code set. */
IPCREF__PRIVATE uint64_t ipcref__gpu_pool_in(ipcref_gpu *g, int dev, int fd,
                                             int writable, int *code) {
  ipcref__gpu_pool *p;
  struct stat st;
  int access = writable ? 2 : 1;
  *code = -1;
  if (fstat(fd, &st) != 0) return 0;
  for (p = g->pools_in; p; p = p->next)
    if (p->fd_dev == st.st_dev && p->fd_ino == st.st_ino && p->dev == dev)
      break;
  if (!p) {
    p = (ipcref__gpu_pool *)IPCREF_MALLOC(sizeof *p);
    if (!p) return 0;
    memset(p, 0, sizeof *p);
    *code = ipcref__gpu_d_pool_import(&g->drv, fd, &p->pool);
    if (*code) {
      IPCREF_FREE(p);
      return 0;
    }
    p->fd = -1;
    p->fd_dev = st.st_dev;
    p->fd_ino = st.st_ino;
    p->dev = dev;
    p->next = g->pools_in;
    g->pools_in = p;
  }
  if (p->access < access) { /* an imported pool starts with no access */
    *code = ipcref__gpu_d_pool_access(&g->drv, p->pool, dev, writable);
    if (*code) return 0;
    p->access = access;
  }
  *code = 0;
  return p->pool;
}

/* This process's own pointer that `data` names (0: none). */
IPCREF__PRIVATE uint64_t ipcref__gpu_pool_mine(ipcref_gpu *g, int dev,
                                               const unsigned char *data) {
  ipcref__gpu_pool_ptr *x;
  uint64_t addr = 0;
  pthread_mutex_lock(&g->lock);
  for (x = g->pool_sent; x && !addr; x = x->next)
    if (x->dev == dev && !memcmp(x->data, data, IPCREF_HANDLE_BYTES))
      addr = x->addr;
  pthread_mutex_unlock(&g->lock);
  return addr;
}

/* 1 when the pool allocation at `addr` starts there and holds `size`
 * bytes, as the driver says. */
IPCREF__PRIVATE int ipcref__gpu_pool_fits(ipcref_gpu *g, uint64_t addr,
                                          uint64_t size) {
  uint64_t base = 0;
  size_t have = 0;
  return !ipcref__gpu_d_range(&g->drv, addr, &base, &have) && base == addr &&
         (uint64_t)have >= size;
}

/* Imports the pool memory `fd` (its pool's) and `data` name, `size` bytes
 * at least (checked against the allocation the driver gives: EPROTO). */
IPCREF__PRIVATE ipcref_result ipcref__gpu_pool_import(
    ipcref_gpu *g, int dev, int fd, const unsigned char *data, uint64_t size,
    int writable, uint64_t *addr) {
  ipcref__gpu_pool_ptr *x;
  uint64_t pool;
  int code;
  if ((*addr = ipcref__gpu_pool_mine(g, dev, data)) != 0) /* our own */
    return ipcref__gpu_pool_fits(g, *addr, size)
               ? IPCREF_OK
               : ipcref__gpu_say(IPCREF_EPROTO, "pool memory smaller than "
                                                "its record says");
  if (!ipcref__gpu_d_pool_supported(&g->drv))
    return ipcref__gpu_say(IPCREF_ENODEV, "the driver shares no pool memory");
  x = (ipcref__gpu_pool_ptr *)IPCREF_MALLOC(sizeof *x);
  if (!x) return IPCREF_ENOMEM;
  memset(x, 0, sizeof *x);
  pthread_mutex_lock(&g->lock);
  pool = ipcref__gpu_pool_in(g, dev, fd, writable, &code);
  pthread_mutex_unlock(&g->lock);
  if (pool) code = ipcref__gpu_d_pool_import_ptr(&g->drv, pool, data, addr);
  if (!pool || code) {
    IPCREF_FREE(x);
    return code == IPCREF__GPU_OOM
               ? IPCREF_ENOMEM
               : ipcref__gpu_fail(IPCREF_EPROTO,
                                  pool ? "importing the pointer"
                                       : "importing the pool",
                                  g, code);
  }
  if (!ipcref__gpu_pool_fits(g, *addr, size)) {
    (void)ipcref__gpu_d_free(&g->drv, *addr);
    IPCREF_FREE(x);
    return ipcref__gpu_say(IPCREF_EPROTO, "pool memory smaller than its "
                                          "record says");
  }
  x->addr = *addr;
  x->dev = dev;
  pthread_mutex_lock(&g->lock);
  x->next = g->pool_ptrs;
  g->pool_ptrs = x;
  pthread_mutex_unlock(&g->lock);
  return IPCREF_OK;
}

/* Frees the imported pool pointer at `addr`: 1, or 0 when it is not one. */
IPCREF__PRIVATE int ipcref__gpu_pool_close(ipcref_gpu *g, int dev,
                                           uint64_t addr) {
  ipcref__gpu_pool_ptr **pp, *x = NULL;
  pthread_mutex_lock(&g->lock);
  for (pp = &g->pool_ptrs; *pp; pp = &(*pp)->next)
    if ((*pp)->addr == addr && (*pp)->dev == dev) {
      x = *pp;
      *pp = x->next;
      break;
    }
  pthread_mutex_unlock(&g->lock);
  if (!x) return 0;
  if (ipcref__gpu_on(g, dev) == IPCREF_OK)
    (void)ipcref__gpu_d_free(&g->drv, addr);
  IPCREF_FREE(x);
  return 1;
}

/* At ipcref_gpu_close: the pointers imported are freed, the pools
 * imported destroyed, the exported pools' fds closed. */
IPCREF__PRIVATE void ipcref__gpu_pool_close_all(ipcref_gpu *g) {
  ipcref__gpu_pool *p;
  ipcref__gpu_pool_ptr *x;
  while ((x = g->pool_ptrs) != NULL) {
    g->pool_ptrs = x->next;
    if (ipcref__gpu_on(g, x->dev) == IPCREF_OK)
      (void)ipcref__gpu_d_free(&g->drv, x->addr);
    IPCREF_FREE(x);
  }
  while ((x = g->pool_sent) != NULL) {
    g->pool_sent = x->next;
    IPCREF_FREE(x);
  }
  while ((p = g->pools_in) != NULL) {
    g->pools_in = p->next;
    (void)ipcref__gpu_d_pool_destroy(&g->drv, p->pool);
    IPCREF_FREE(p);
  }
  while ((p = g->pools_out) != NULL) {
    g->pools_out = p->next;
    close(p->fd);
    IPCREF_FREE(p);
  }
}
