/* fake_pool.h - the stream-ordered memory pool engine of ipcref's fake
 * drivers (tests only): pool create/destroy, allocate and free on a stream,
 * pool export/import by POSIX fd, pointer export/import. API-neutral like
 * fake_core.h: the skins check the API's structures, map errors and log -
 * fake_cuda_pool.c (cuMemPoolCreate, cuMemAllocFromPoolAsync, cuMemFreeAsync,
 * cuMemPool{Export,Import}*, #included by fake_cuda.c) and fake_hip_pool.c
 * (hipMemPoolCreate, hipMallocFromPoolAsync, hipFreeAsync,
 * hipMemPool{Export,Import}*, #included by fake_hip.c). Included after
 * fake_core.h. The doc quotes below are cuda.h's; the HIP 5.2 header says
 * the same in the same words (hip for cu). Everything here runs under fk.mu.
 *
 * Pools. A pool is a per-process record (struct fk_pool) named by an opaque
 * handle 0xfa50<48-bit sequence number> (never 0, never reused in a process,
 * not an address) and a random nonce. An imported pool is a new record (new
 * handle) carrying the exporter's pool nonce, so logs match across processes
 * by pool=<nonce>.
 *
 * Pool memory. Every allocation is its own memfd named
 * "fake_gpu_pool:<pool nonce>:<ptr nonce>" (16 hex digits each, MFD_CLOEXEC),
 * counted against MEM_LIMIT (and the pool's maxSize, CUDA only), held open
 * while it lives and mapped MAP_SHARED (honouring HOSTPTR=none) as an
 * FK_MEM_POOL entry of fake_core.h's table. The memfd is the size rounded up
 * to 4096 plus one page: that last page is a header shared by the exporter
 * and every importer (struct fk_pshm): when the allocation completes and,
 * per importing process, when its import is released (a time in the future
 * for a stream-ordered free whose stream has not reached it; UINT64_MAX
 * while held).
 *
 * Stream order. Allocating or freeing on a stream is work like an event
 * record: it completes at max(now + WORK_US, the stream's done time) and
 * moves the stream's done time there. The allocation's completion time is
 * kept in its table entries (exporter and importers); a copy or memset that
 * touches pool memory before then logs pending_us=<us still to go> (> 0: the
 * memory was touched before the allocation completed; the copy is still
 * done; fk_pool_touched gives the keys). The mapping itself goes at the free
 * call (API queries on a freed pointer are undefined; the fake answers as
 * for unknown memory); only the shared release time follows the stream.
 *
 * Sharing. Exporting a pool (cuMemPoolExportToShareableHandle /
 * hipMemPoolExportToShareableHandle) makes a new memfd
 * "fake_gpu_poolfd:<pool nonce>:<device>" holding a struct fk_poolfd (magic,
 * exporter pid, pool nonce, device); the caller owns it. The importer checks
 * its name and contents. Exporting a pointer writes struct fk_pexport (64
 * bytes = CUmemPoolPtrExportData = hipMemPoolPtrExportData, native byte
 * order):
 *    0 u32 magic  "FKPP"
 *    4 i32 pid    exporting process
 *    8 i32 fd     the allocation's memfd in the exporter
 *   12 i32 dev    the pool's device
 *   16 u64 ino    the memfd's inode
 *   24 u64 pool   pool nonce
 *   32 u64 alloc  allocation (pointer) nonce
 *   40 u64 size   allocation size
 *   48 u64 off    offset of the exported pointer in its allocation
 *   56 8 bytes of zeros
 * Importing a pointer opens /proc/<pid>/fd/<fd> as legacy IPC does and
 * checks name, inode and size; it fails once the exporter exited, freed the
 * allocation (its header says so) or closed the memfd.
 *
 * Freeing an exported allocation while another process has it imported, its
 * release not complete by the time the exporter's free completes, breaks
 * "The imported memory must be freed from all importing processes before
 * being freed in the exporting process": the free still succeeds and reports
 * how many such processes there were (imported_elsewhere=N in the log). An
 * importer that exited counts as released.
 *
 * Knobs (read on every call; <P> is FK_PREFIX, FAKE_CUDA_ or FAKE_HIP_):
 *   <P>POOLS=0     pools are not supported: creating one fails NOT_SUPPORTED
 *                  (CUDA: CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED and
 *                  ..._MEMPOOL_SUPPORTED_HANDLE_TYPES answer 0; HIP: see
 *                  fake_hip_pool.c)
 *   <P>POSIX_FD=0  (shared with fake_vmm.h) no shareable pools: a pool asking
 *                  for the POSIX fd handle type fails NOT_SUPPORTED (CUDA:
 *                  ..._MEMPOOL_SUPPORTED_HANDLE_TYPES answers 0)
 */
#ifndef FAKE_POOL_H
#define FAKE_POOL_H

#include <signal.h>
#include <stdio.h>

#define FK_POOL_HTAG   0xfa50000000000000ull /* handle = tag | sequence */
#define FK_POOL_NAME   "fake_gpu_pool:"
#define FK_POOLFD_NAME "fake_gpu_poolfd:"
#define FK_POOL_POSIX                                                          \
  0x1 /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ==                           \
           hipMemHandleTypePosixFileDescriptor */
#define FK_PAGE       4096u
#define FK_PSHM_SLOTS 64
#define FK_HELD       UINT64_MAX

struct fk_pool {
  struct fk_pool *next;
  uint64_t h, nonce;
  int dev, imported, destroyed;
  unsigned htypes;
  pid_t src;        /* exporting process (imports), else this one */
  size_t used, max; /* bytes allocated; maxSize (0: no limit) */
  int nptrs;        /* outstanding allocations or imported pointers */
  unsigned char access[FK_MAX_DEV];
};

/* The header page at the end of every pool allocation's memfd. */
struct fk_pshm {
  uint64_t magic, ready, freed; /* freed: when the exporter's free completes */
  struct {
    int32_t pid, pad;
    uint64_t released; /* FK_HELD while imported */
  } slot[FK_PSHM_SLOTS];
};
_Static_assert(sizeof(struct fk_pshm) <= FK_PAGE, "one page");
#define FK_PSHM_MAGIC 0x4d4853504b46ull /* "FKPSHM" */

struct fk_poolfd {
  uint32_t magic;
  int32_t pid;
  uint64_t nonce;
  int32_t dev, zero;
};
#define FK_POOLFD_MAGIC 0x4c504b46u /* "FKPL" */

struct fk_pexport {
  uint32_t magic;
  int32_t pid, fd, dev;
  uint64_t ino, pool, alloc, size, off;
  uint8_t zero[8];
};
_Static_assert(sizeof(struct fk_pexport) == 64, "pointer export data size");
#define FK_PEXPORT_MAGIC 0x50504b46u /* "FKPP" */

static struct {
  struct fk_pool *pools;
  uint64_t seq;
} fkp;

static int fk_pools_on(void) {
  return fk_knob_num("POOLS", 1) != 0;
}
/* The handle types pools may ask for (CUDA:
 * CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES) */
static unsigned fk_pool_htypes_supported(void) {
  return fk_pools_on() && fk_knob_num("POSIX_FD", 1) != 0 ? FK_POOL_POSIX : 0;
}

static size_t fk_page_up(size_t n) {
  return (n + FK_PAGE - 1) & ~(size_t)(FK_PAGE - 1);
}

/* A pool the API may name: known and not destroyed. */
static struct fk_pool *fk_pool_live(uint64_t h) {
  for (struct fk_pool *p = fkp.pools; p; p = p->next)
    if (p->h == h && !p->destroyed) return p;
  return NULL;
}
static struct fk_pool *fk_pool_any(uint64_t h) {
  for (struct fk_pool *p = fkp.pools; p; p = p->next)
    if (p->h == h) return p;
  return NULL;
}
/* cuMemPoolDestroy / hipMemPoolDestroy: "the resources associated with the
 * pool will be released automatically once there are no more outstanding
 * allocations." */
static void fk_pool_maybe_free(struct fk_pool *pool) {
  if (!pool->destroyed || pool->nptrs > 0) return;
  for (struct fk_pool **p = &fkp.pools; *p; p = &(*p)->next)
    if (*p == pool) {
      *p = pool->next;
      free(pool);
      return;
    }
}

static struct fk_pool *fk_pool_new(void) {
  struct fk_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->h = FK_POOL_HTAG | (++fkp.seq & 0xffffffffffffull);
  p->next = fkp.pools;
  fkp.pools = p;
  return p;
}

static int fk_pool_create(uint64_t *h, uint64_t *nonce, int dev,
                          unsigned htypes, size_t max) {
  FK_LOCK();
  struct fk_pool *p = fk_pool_new();
  if (p) {
    p->nonce = fk_nonce();
    p->dev = dev;
    p->htypes = htypes;
    p->max = max;
    p->src = getpid();
    /* "By default, the pool's memory will be accessible from the device it
     * is allocated on." */
    p->access[dev] = 3;
    *h = p->h;
    *nonce = p->nonce;
  }
  FK_UNLOCK();
  return p ? FK_OK : FK_ENOMEM;
}

static int fk_pool_destroy(uint64_t h, uint64_t *nonce, int *outstanding) {
  FK_LOCK();
  struct fk_pool *p = fk_pool_live(h);
  if (p) {
    *nonce = p->nonce;
    *outstanding = p->nptrs;
    p->destroyed = 1;
    fk_pool_maybe_free(p);
  }
  FK_UNLOCK();
  return p ? FK_OK : FK_EINVAL;
}

/* When work put on stream now completes; moves the stream's time there. */
static int fk_pool_stream_op(void *stream, int dev, uint64_t *done) {
  struct fk_stream *s = fk_stream_find(stream, dev);
  if (!s) return (uintptr_t)stream <= 2 ? FK_ECTX : FK_EINVAL;
  uint64_t t = fk_now() + (uint64_t)fk_knob_num("WORK_US", 0) * 1000u;
  uint64_t tail = fk_stream_tail(s);
  if (tail > t) t = tail;
  if (fk_is_null_stream(s))
    fk.null_stream[s - fk.null_stream].tail = t;
  else
    s->tail = t;
  *done = t;
  return FK_OK;
}

/* Map the header page of a pool allocation's memfd. */
static struct fk_pshm *fk_pshm_map(int fd, size_t size) {
  void *p = mmap(NULL, FK_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                 (off_t)fk_page_up(size));
  return p == MAP_FAILED ? NULL : p;
}

static int fk_pool_alloc(uintptr_t *out, size_t size, uint64_t h, void *stream,
                         int dev, uint64_t *nonce, uint64_t *pnonce,
                         unsigned long long *ready_in_us) {
  long long limit = fk_knob_num("MEM_LIMIT", -1);
  char name[64];
  int e = FK_OK;
  uint64_t done = 0;
  FK_LOCK();
  struct fk_pool *p = fk_pool_live(h);
  struct fk_mem m = {.size = size, .kind = FK_MEM_POOL, .src = getpid()};
  if (!p) {
    e = FK_EINVAL;
  } else if (p->imported) {
    /* "Imported memory pools do not support creating new allocations." */
    e = FK_ENOTSUP;
  } else if (size > SIZE_MAX - 2 * FK_PAGE) {
    e = FK_ENOMEM;
  } else if ((limit >= 0 && (size > (unsigned long long)limit ||
                             fk.live > (unsigned long long)limit - size)) ||
             (p->max && (size > p->max || p->used > p->max - size))) {
    e = FK_ENOMEM; /* out of memory */
  } else if ((e = fk_pool_stream_op(stream, dev, &done)) == FK_OK) {
    *pnonce = p->nonce;
    m.nonce = fk_nonce();
    m.dev = m.owner = p->dev;
    m.pool = p->h;
    m.pnonce = p->nonce;
    m.ready = done;
    memcpy(m.access, p->access, sizeof m.access);
    snprintf(name, sizeof name, FK_POOL_NAME "%016" PRIx64 ":%016" PRIx64,
             p->nonce, m.nonce);
    struct stat st;
    struct fk_pshm *hdr = NULL;
    m.fd = memfd_create(name, MFD_CLOEXEC);
    if (m.fd < 0 || ftruncate(m.fd, (off_t)(fk_page_up(size) + FK_PAGE)) ||
        fstat(m.fd, &st) || !(hdr = fk_pshm_map(m.fd, size)) || !fk_add()) {
      e = FK_ENOMEM;
    } else if (fk_map(m.fd, size, &m.base, &m.data)) {
      fk.nmem--;
      e = FK_ENOMEM;
    }
    if (e) {
      if (hdr) munmap(hdr, FK_PAGE);
      if (m.fd >= 0) close(m.fd);
    } else {
      hdr->magic = FK_PSHM_MAGIC;
      hdr->ready = done;
      m.ino = (uint64_t)st.st_ino;
      m.aux = hdr;
      m.id = ++fk.last_id;
      fk.mem[fk.nmem - 1] = m;
      fk.live += size;
      p->used += size;
      p->nptrs++;
      *out = m.base;
      *nonce = m.nonce;
      *ready_in_us = fk_us_left(done);
    }
  }
  FK_UNLOCK();
  return e;
}

/* Whether the process pid still runs (an exited importer holds nothing). */
static int fk_pid_alive(pid_t pid) {
  return kill(pid, 0) == 0 || errno == EPERM;
}

/* Free pool memory p (the base, or the pointer an import returned): now if
 * stream is NULL and now_ = 1 (cuMemFree, hipFree), else in stream order. */
static int fk_pool_free(uintptr_t p, int now_, void *stream, int dev,
                        uint64_t *nonce, uint64_t *pnonce,
                        unsigned long long *done_in_us, int *elsewhere) {
  int e = FK_OK;
  uint64_t done = fk_now();
  FK_LOCK();
  struct fk_mem *m = fk_find(p);
  if (!m || (m->kind != FK_MEM_POOL && m->kind != FK_MEM_PIMPORT) ||
      (p != m->base && p != m->base + m->off))
    e = FK_EINVAL;
  else if (!now_)
    e = fk_pool_stream_op(stream, dev, &done);
  if (!e) {
    struct fk_pshm *hdr = m->aux;
    struct fk_pool *pool = fk_pool_any(m->pool);
    *nonce = m->nonce;
    *pnonce = m->pnonce;
    *done_in_us = fk_us_left(done);
    int gone = 1;
    if (m->kind == FK_MEM_PIMPORT) {
      /* "The pointer may be freed with cuMemFree or cuMemFreeAsync." (HIP:
       * "with @p hipFree or @p hipFreeAsync.") */
      if (--m->refs > 0) {
        gone = 0;
      } else {
        for (int i = 0; i < FK_PSHM_SLOTS; i++)
          if (__atomic_load_n(&hdr->slot[i].pid, __ATOMIC_ACQUIRE) ==
              (int32_t)getpid())
            __atomic_store_n(&hdr->slot[i].released, done, __ATOMIC_RELEASE);
      }
    } else {
      /* an importer's release must complete before this free does */
      for (int i = 0; i < FK_PSHM_SLOTS; i++) {
        int32_t pid = __atomic_load_n(&hdr->slot[i].pid, __ATOMIC_ACQUIRE);
        uint64_t rel =
            __atomic_load_n(&hdr->slot[i].released, __ATOMIC_ACQUIRE);
        if (pid && rel > done && fk_pid_alive(pid)) ++*elsewhere;
      }
      __atomic_store_n(&hdr->freed, done, __ATOMIC_RELEASE);
      if (pool) pool->used -= m->size;
    }
    if (gone) {
      munmap(hdr, FK_PAGE);
      fk_remove(m);
      if (pool) {
        pool->nptrs--;
        fk_pool_maybe_free(pool);
      }
    }
  }
  FK_UNLOCK();
  return e;
}

/* The pool handle, nonces and kind of the pool memory containing p. */
static int fk_pool_of(uintptr_t p, uint64_t *h, uint64_t *pnonce,
                      uint64_t *nonce) {
  FK_LOCK();
  struct fk_mem *m = fk_find(p);
  int yes = m && (m->kind == FK_MEM_POOL || m->kind == FK_MEM_PIMPORT);
  if (yes) {
    *h = m->pool;
    *pnonce = m->pnonce;
    *nonce = m->nonce;
  }
  FK_UNLOCK();
  return yes;
}

/* acc[d]: new access of device d (0, 1, 3), or -1 to leave it. Applies to
 * the pool's present and future allocations or imports. */
static int fk_pool_set_access(uint64_t h, const int *acc, uint64_t *nonce) {
  FK_LOCK();
  struct fk_pool *p = fk_pool_live(h);
  if (p) {
    *nonce = p->nonce;
    for (int d = 0; d < FK_MAX_DEV; d++)
      if (acc[d] >= 0) p->access[d] = (unsigned char)acc[d];
    for (size_t i = 0; i < fk.nmem; i++)
      if ((fk.mem[i].kind == FK_MEM_POOL || fk.mem[i].kind == FK_MEM_PIMPORT) &&
          fk.mem[i].pool == h)
        memcpy(fk.mem[i].access, p->access, sizeof p->access);
  }
  FK_UNLOCK();
  return p ? FK_OK : FK_EINVAL;
}

static int fk_pool_get_access(uint64_t h, int dev, int *acc, uint64_t *nonce) {
  FK_LOCK();
  struct fk_pool *p = fk_pool_live(h);
  if (p) {
    *acc = p->access[dev];
    *nonce = p->nonce;
  }
  FK_UNLOCK();
  return p ? FK_OK : FK_EINVAL;
}

/* ---- sharing by POSIX fd ------------------------------------------------- */

static int fk_pool_export_fd(int *out, uint64_t h, uint64_t *nonce) {
  char name[64];
  int e = FK_OK;
  FK_LOCK();
  struct fk_pool *p = fk_pool_live(h);
  /* "Given an IPC capable mempool"; an imported pool is not re-exported */
  if (!p || p->imported || !(p->htypes & FK_POOL_POSIX)) {
    e = FK_EINVAL;
  } else {
    struct fk_poolfd rec = {FK_POOLFD_MAGIC, (int32_t)getpid(), p->nonce,
                            p->dev, 0};
    snprintf(name, sizeof name, FK_POOLFD_NAME "%016" PRIx64 ":%d", p->nonce,
             p->dev);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || pwrite(fd, &rec, sizeof rec, 0) != (ssize_t)sizeof rec) {
      if (fd >= 0) close(fd);
      e = FK_ENOMEM;
    } else {
      *out = fd;
      *nonce = p->nonce;
    }
  }
  FK_UNLOCK();
  return e;
}

static int fk_pool_import_fd(uint64_t *h, int fd, uint64_t *nonce, int *dev) {
  char path[64], link[160];
  struct fk_poolfd rec;
  struct stat st;
  uint64_t n = 0;
  int d = -1;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t len = fd < 0 ? -1 : readlink(path, link, sizeof link - 1);
  if (len <= 0) return FK_EINVAL;
  link[len] = 0;
  if (sscanf(link, "/memfd:" FK_POOLFD_NAME "%16" SCNx64 ":%d", &n, &d) != 2 ||
      fstat(fd, &st) || !S_ISREG(st.st_mode) ||
      st.st_size != (off_t)sizeof rec ||
      pread(fd, &rec, sizeof rec, 0) != (ssize_t)sizeof rec ||
      rec.magic != FK_POOLFD_MAGIC || rec.nonce != n || rec.dev != d || d < 0 ||
      d >= fk_devices())
    return FK_EINVAL; /* a pipe, another memfd, an allocation's memfd */
  FK_LOCK();
  struct fk_pool *p = fk_pool_new();
  if (p) {
    p->nonce = n;
    p->dev = d;
    p->imported = 1;
    p->htypes = FK_POOL_POSIX;
    p->src = rec.pid;
    /* no access until the skin's SetAccess (see fake_cuda_pool.c) */
    *h = p->h;
    *nonce = n;
    *dev = d;
  }
  FK_UNLOCK();
  return p ? FK_OK : FK_ENOMEM;
}

static int fk_pool_export_ptr(struct fk_pexport *x, uintptr_t p,
                              uint64_t *nonce, uint64_t *pnonce) {
  FK_LOCK();
  struct fk_mem *m = fk_find(p);
  struct fk_pool *pool =
      m && m->kind == FK_MEM_POOL ? fk_pool_any(m->pool) : NULL;
  /* "Constructs shareData_out for sharing a specific allocation from an
   * already shared memory pool": a pool made with a handle type */
  int ok = pool && (pool->htypes & FK_POOL_POSIX);
  if (ok) {
    *x = (struct fk_pexport){
        FK_PEXPORT_MAGIC, (int32_t)getpid(), m->fd,   m->dev,      m->ino,
        m->pnonce,        m->nonce,          m->size, p - m->base, {0}};
    *nonce = m->nonce;
    *pnonce = m->pnonce;
  }
  FK_UNLOCK();
  return ok ? FK_OK : FK_EINVAL;
}

/* Open the exporter's allocation memfd named by x (see fk_proc_open). */
static int fk_pool_proc_open(const struct fk_pexport *x) {
  char path[64], link[160], want[80];
  struct stat st;
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)x->pid, (int)x->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  link[n > 0 ? n : 0] = 0;
  snprintf(want, sizeof want,
           "/memfd:" FK_POOL_NAME "%016" PRIx64 ":%016" PRIx64, x->pool,
           x->alloc);
  if (strncmp(link, want, strlen(want)) || fstat(fd, &st) ||
      (uint64_t)st.st_ino != x->ino ||
      (uint64_t)st.st_size != fk_page_up(x->size) + FK_PAGE) {
    close(fd);
    return -1;
  }
  return fd;
}

static int fk_pool_import_ptr(uintptr_t *out, uint64_t h,
                              const struct fk_pexport *x,
                              unsigned long long *pending_us) {
  int e = FK_OK;
  FK_LOCK();
  struct fk_pool *pool = fk_pool_live(h);
  /* pool: "pool from which to import": the import of the data's pool; the
   * exporting process does not import its own pointers */
  if (!pool || !pool->imported || x->magic != FK_PEXPORT_MAGIC ||
      x->pool != pool->nonce || x->pid == (int32_t)getpid() ||
      x->off >= x->size) {
    FK_UNLOCK();
    return FK_EINVAL;
  }
  for (size_t i = 0; i < fk.nmem; i++) {
    struct fk_mem *m = &fk.mem[i];
    if (m->kind == FK_MEM_PIMPORT && m->pnonce == x->pool &&
        m->nonce == x->alloc) {
      /* imported before in this process: the same pointer, counted */
      m->refs++;
      *out = m->base + m->off;
      *pending_us = fk_us_left(m->ready);
      FK_UNLOCK();
      return FK_OK;
    }
  }
  struct fk_pshm *hdr = NULL;
  struct fk_mem m = {.size = x->size,
                     .kind = FK_MEM_PIMPORT,
                     .dev = pool->dev,
                     .owner = pool->dev,
                     .fd = -1,
                     .refs = 1,
                     .src = x->pid,
                     .ino = x->ino,
                     .nonce = x->alloc,
                     .pool = h,
                     .pnonce = x->pool,
                     .off = x->off};
  memcpy(m.access, pool->access, sizeof m.access);
  int fd = fk_pool_proc_open(x), slot = -1;
  if (fd >= 0) hdr = fk_pshm_map(fd, x->size);
  if (hdr && (hdr->magic != FK_PSHM_MAGIC ||
              __atomic_load_n(&hdr->freed, __ATOMIC_ACQUIRE))) {
    munmap(hdr, FK_PAGE); /* freed by the exporter (its memfd still open) */
    hdr = NULL;
  }
  if (!hdr) {
    e = FK_EINVAL; /* exporter gone, or the allocation freed */
  } else {
    for (int i = 0; i < FK_PSHM_SLOTS && slot < 0; i++) {
      int32_t zero = 0, me = (int32_t)getpid();
      if (__atomic_load_n(&hdr->slot[i].pid, __ATOMIC_ACQUIRE) == me ||
          __atomic_compare_exchange_n(&hdr->slot[i].pid, &zero, me, 0,
                                      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        slot = i;
    }
    if (slot < 0 || !fk_add()) {
      e = FK_ENOMEM;
    } else if (fk_map(fd, x->size, &m.base, &m.data)) {
      fk.nmem--;
      e = FK_ENOMEM;
    } else {
      __atomic_store_n(&hdr->slot[slot].released, FK_HELD, __ATOMIC_RELEASE);
      m.ready = __atomic_load_n(&hdr->ready, __ATOMIC_ACQUIRE);
      m.aux = hdr;
      m.id = ++fk.last_id;
      fk.mem[fk.nmem - 1] = m;
      pool->nptrs++;
      *out = m.base + m.off;
      *pending_us = fk_us_left(m.ready);
    }
    if (e) munmap(hdr, FK_PAGE);
  }
  if (fd >= 0) close(fd); /* the mappings keep the memory */
  FK_UNLOCK();
  return e;
}

/* The keys a copy or memset that touched pool memory adds to its line:
 * " pending_us=<us until the allocation completes> alloc=<its nonce>" (the
 * most pending side, from fake_core.h's fk_touch); "" for other memory. */
static const char *fk_pool_touched(char buf[64]) {
  buf[0] = 0;
  if (fk_touch.pool)
    snprintf(buf, 64, " pending_us=%llu alloc=%016" PRIx64, fk_touch.pending_us,
             fk_touch.nonce);
  return buf;
}

/* What dlclose must release (see fk_fini). */
__attribute__((destructor)) static void fk_pool_fini(void) {
  while (fkp.pools) {
    struct fk_pool *p = fkp.pools;
    fkp.pools = p->next;
    free(p);
  }
}

#endif /* FAKE_POOL_H */
