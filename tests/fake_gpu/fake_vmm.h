/* fake_vmm.h - the virtual memory management (VMM) engine of ipcref's fake
 * drivers (tests only), shared by both skins: fake_cuda_vmm.c (cuMemCreate,
 * cuMemAddressReserve, cuMemMap, cuMemSetAccess, POSIX fd export/import, in
 * fake_cuda.c) and fake_hip_vmm.c (the same hipMem* calls, in fake_hip.c).
 * Included after fake_core.h; API-neutral like it (each skin checks its
 * API's structures, quotes its header and maps errors). The rules quoted
 * here are cuda.h's, whose wording the HIP header (terser) does not
 * contradict. Everything here runs under fk.mu.
 *
 * Allocations. Creating one (cuMemCreate / hipMemCreate) makes a record
 * (struct fk_valloc) owning a memfd named
 * "fake_gpu_vmm:<nonce, 16 hex>:<device ordinal>" (MFD_CLOEXEC) of the
 * requested size; it counts against MEM_LIMIT like a plain allocation. The
 * handle is an opaque value 0xfa4e<48-bit sequence number> (never 0, never
 * reused in a process, not an address) naming the record. The record has
 * refs (the creation or import, plus each retain of the handle by address)
 * and maps (live mappings); the handle is valid while refs > 0; the record
 * and its memory go when both are 0. An import is a new record (new handle)
 * over a new open of the same memfd; it does not count against MEM_LIMIT.
 *
 * Address space. A reservation is a PROT_NONE anonymous mapping (struct
 * fk_vres); mapping an allocation replaces part of it with the memfd,
 * MAP_SHARED | MAP_FIXED, PROT_NONE, and adds an FK_MEM_VMAP entry to
 * fake_core.h's table (so address-range and pointer-attribute queries and
 * copies find it); setting access records per-device access in that entry
 * (copies check it, see fk_bytes) and mprotects the mapping to the union of
 * the devices' rights, unless HOSTPTR=none, where it stays PROT_NONE and
 * copies go through a second read-write mapping of the memfd. Unmapping puts
 * PROT_NONE anonymous memory back (the range is a reservation again).
 *
 * Knobs (read on every call; <P> is FK_PREFIX, FAKE_CUDA_ or FAKE_HIP_):
 *   <P>VMM=0          no VMM: creating, reserving, importing and asking the
 *                     granularity fail not-supported (CUDA: the device
 *                     attributes ..._VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and
 *                     ..._POSIX_FILE_DESCRIPTOR_SUPPORTED answer 0; HIP 5.2
 *                     has no such attribute)
 *   <P>POSIX_FD=0     creating an allocation that asks for the POSIX fd
 *                     handle type fails not-supported (CUDA: only
 *                     ..._POSIX_FILE_DESCRIPTOR_SUPPORTED is 0)
 *   <P>GRANULARITY    bytes, a power of two >= 4096 (else the default),
 *                     default 2097152: the RECOMMENDED granularity and the
 *                     default alignment of reservations. The MINIMUM one
 *                     (what sizes, addresses and offsets must be multiples
 *                     of) is the same, unless the skin fixes it with
 *                     FK_VMM_GRAN_MIN (HIP: 4096, AMD's page).
 */
#ifndef FAKE_VMM_H
#define FAKE_VMM_H

#include <stdio.h>

#define FK_VMM_HTAG 0xfa4e000000000000ull /* handle = tag | sequence */
#define FK_VMM_NAME "fake_gpu_vmm:"
#define FK_VH_POSIX                                                            \
  0x1 /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ==                           \
           hipMemHandleTypePosixFileDescriptor */
#define FK_VMM_GRAN0 2097152u
#ifndef FK_VMM_GRAN_MIN
#define FK_VMM_GRAN_MIN 0 /* the minimum granularity is the recommended one */
#endif

struct fk_valloc {
  uint64_t h, nonce;
  size_t size;
  int fd, dev, refs, maps, counted; /* counted: in fk.live (not an import) */
  unsigned htypes;                  /* requestedHandleTypes */
};
struct fk_vres {
  uintptr_t base;
  size_t size;
};

static struct {
  struct fk_valloc *a;
  size_t na, capa;
  struct fk_vres *r;
  size_t nr, capr;
  uint64_t seq;
} fkv;

static int fk_vmm_on(void) {
  return fk_knob_num("VMM", 1) != 0;
}
static int fk_vmm_posix_on(void) {
  return fk_vmm_on() && fk_knob_num("POSIX_FD", 1) != 0;
}
static size_t fk_vmm_gran(void) {
  long long g = fk_knob_num("GRANULARITY", FK_VMM_GRAN0);
  return g >= 4096 && !(g & (g - 1)) ? (size_t)g : FK_VMM_GRAN0;
}
/* What sizes, addresses and offsets must be multiples of. */
static inline size_t fk_vmm_gran_min(void) {
  size_t g = fk_vmm_gran();
  return FK_VMM_GRAN_MIN && FK_VMM_GRAN_MIN < g ? (size_t)FK_VMM_GRAN_MIN : g;
}

/* Grow a table by one slot (fkv's arrays). */
static void *fk_vgrow(void **arr, size_t *n, size_t *cap, size_t elem) {
  if (*n == *cap) {
    size_t c = *cap ? 2 * *cap : 8;
    void *p = realloc(*arr, c * elem);
    if (!p) return NULL;
    *arr = p;
    *cap = c;
  }
  return (char *)*arr + (*n)++ * elem;
}

static struct fk_valloc *fk_valloc_find(uint64_t h) {
  for (size_t i = 0; i < fkv.na; i++)
    if (fkv.a[i].h == h) return &fkv.a[i];
  return NULL;
}
/* A handle the API may name: known and not released. */
static struct fk_valloc *fk_valloc_live(uint64_t h) {
  struct fk_valloc *a = fk_valloc_find(h);
  return a && a->refs > 0 ? a : NULL;
}

/* cuMemRelease: "The memory allocation will be freed when all outstanding
 * mappings to the memory are unmapped and when all outstanding references to
 * the handle (including it's shareable counterparts) are also released." */
static void fk_valloc_maybe_free(struct fk_valloc *a) {
  if (a->refs > 0 || a->maps > 0) return;
  close(a->fd);
  if (a->counted) fk.live -= a->size;
  *a = fkv.a[--fkv.na];
}

static uint64_t fk_vmm_new_handle(void) {
  return FK_VMM_HTAG | (++fkv.seq & 0xffffffffffffull);
}

static int fk_vmm_create(uint64_t *h, size_t size, int dev, unsigned htypes,
                         uint64_t *nonce) {
  long long limit = fk_knob_num("MEM_LIMIT", -1);
  char name[48];
  int e = FK_OK;
  FK_LOCK();
  struct fk_valloc a = {.nonce = fk_nonce(),
                        .size = size,
                        .fd = -1,
                        .dev = dev,
                        .refs = 1,
                        .counted = 1,
                        .htypes = htypes};
  snprintf(name, sizeof name, FK_VMM_NAME "%016" PRIx64 ":%d", a.nonce, dev);
  if (limit >= 0 && (size > (unsigned long long)limit ||
                     fk.live > (unsigned long long)limit - size)) {
    e = FK_ENOMEM; /* as a plain allocation: out of memory */
  } else if ((a.fd = memfd_create(name, MFD_CLOEXEC)) < 0 ||
             ftruncate(a.fd, (off_t)size)) {
    e = FK_ENOMEM;
  } else {
    struct fk_valloc *slot =
        fk_vgrow((void **)&fkv.a, &fkv.na, &fkv.capa, sizeof *fkv.a);
    if (!slot) {
      e = FK_ENOMEM;
    } else {
      a.h = fk_vmm_new_handle();
      *slot = a;
      fk.live += size;
      *h = a.h;
      *nonce = a.nonce;
    }
  }
  if (e && a.fd >= 0) close(a.fd);
  FK_UNLOCK();
  return e;
}

static int fk_vmm_release(uint64_t h, uint64_t *nonce) {
  FK_LOCK();
  struct fk_valloc *a = fk_valloc_live(h);
  if (a) {
    *nonce = a->nonce;
    a->refs--;
    fk_valloc_maybe_free(a);
  }
  FK_UNLOCK();
  /* "If handle is not a valid handle the behavior is undefined": the fake
   * answers invalid value (also for a second release). */
  return a ? FK_OK : FK_EINVAL;
}

/* ---- reservations -------------------------------------------------------- */

static int fk_vmm_reserve(uintptr_t *out, size_t size, size_t align) {
  size_t g = fk_vmm_gran();
  if (align < g) align = g;
  if (size > SIZE_MAX - align) return FK_ENOMEM;
  void *p = mmap(NULL, size + align, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return FK_ENOMEM;
  /* over-reserve by the alignment, then trim both ends */
  uintptr_t raw = (uintptr_t)p,
            base = (raw + align - 1) & ~(uintptr_t)(align - 1);
  if (base > raw) munmap(p, base - raw);
  if (raw + align > base) munmap((void *)(base + size), raw + align - base);
  FK_LOCK();
  struct fk_vres *r =
      fk_vgrow((void **)&fkv.r, &fkv.nr, &fkv.capr, sizeof *fkv.r);
  if (r) *r = (struct fk_vres){base, size};
  FK_UNLOCK();
  if (!r) {
    munmap((void *)base, size);
    return FK_ENOMEM;
  }
  *out = base;
  return FK_OK;
}

static struct fk_vres *fk_vres_of(uintptr_t p, size_t n) {
  for (size_t i = 0; i < fkv.nr; i++)
    if (p >= fkv.r[i].base && p - fkv.r[i].base <= fkv.r[i].size &&
        n <= fkv.r[i].size - (p - fkv.r[i].base))
      return &fkv.r[i];
  return NULL;
}

/* The VMAP entry overlapping [p, p+n), if any. */
static struct fk_mem *fk_vmap_overlap(uintptr_t p, size_t n) {
  for (size_t i = 0; i < fk.nmem; i++) {
    struct fk_mem *m = &fk.mem[i];
    if (m->kind == FK_MEM_VMAP && m->base < p + n && p < m->base + m->size)
      return m;
  }
  return NULL;
}

static int fk_vmm_address_free(uintptr_t p, size_t size) {
  int e = FK_EINVAL;
  FK_LOCK();
  for (size_t i = 0; i < fkv.nr; i++) {
    /* "The size must match what was given to memAddressReserve and the ptr
     * given must match what was returned from memAddressReserve." */
    if (fkv.r[i].base != p || fkv.r[i].size != size) continue;
    /* The documentation does not say what happens to mappings still in the
     * range: the fake refuses (invalid value); unmap first. */
    if (!fk_vmap_overlap(p, size)) {
      munmap((void *)p, size);
      fkv.r[i] = fkv.r[--fkv.nr];
      e = FK_OK;
    }
    break;
  }
  FK_UNLOCK();
  return e;
}

/* ---- mappings ------------------------------------------------------------ */

static int fk_vmm_map(uintptr_t p, size_t size, uint64_t h, int owner,
                      uint64_t *nonce) {
  int e = FK_OK;
  FK_LOCK();
  struct fk_valloc *a = fk_valloc_live(h);
  if (!a || size > a->size) {
    /* "offset + size must be less than the size of the memory allocation"
     * (read as "not more than": mapping a whole allocation works) */
    e = FK_EINVAL;
  } else if (!fk_vres_of(p, size)) {
    /* "This range must be an address reservation previously reserved with
     * ::cuMemAddressReserve" */
    e = FK_EINVAL;
  } else if (fk_vmap_overlap(p, size)) {
    /* "::cuMemMap can only create mappings on VA range reservations that are
     * not currently mapped." */
    e = FK_EINVAL;
  } else if (!fk_add()) {
    e = FK_ENOMEM;
  } else {
    /* "Please note calling ::cuMemMap does not make the address accessible":
     * PROT_NONE until cuMemSetAccess */
    int hidden = fk_knob_is("HOSTPTR", "none");
    void *d = MAP_FAILED;
    void *b =
        mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, 0);
    if (b != MAP_FAILED)
      d = hidden
              ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0)
              : b;
    if (d == MAP_FAILED) {
      if (b != MAP_FAILED) /* give the range back to the reservation */
        mmap((void *)p, size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      fk.nmem--;
      e = FK_ENOMEM;
    } else {
      fk.mem[fk.nmem - 1] = (struct fk_mem){.base = p,
                                            .data = d,
                                            .size = size,
                                            .kind = FK_MEM_VMAP,
                                            .dev = a->dev,
                                            .owner = owner < 0 ? a->dev : owner,
                                            .fd = -1,
                                            .src = getpid(),
                                            .nonce = a->nonce,
                                            .id = ++fk.last_id,
                                            .vh = h};
      a->maps++; /* the mapping holds the memory */
      *nonce = a->nonce;
    }
  }
  FK_UNLOCK();
  return e;
}

/* Whether [p, p+size) is exactly a run of whole, adjacent mappings. */
static int fk_vmap_exact(uintptr_t p, size_t size) {
  uintptr_t end = p + size;
  for (uintptr_t cur = p; cur < end;) {
    struct fk_mem *m = fk_find(cur);
    if (!m || m->kind != FK_MEM_VMAP || m->base != cur || m->size > end - cur)
      return 0;
    cur += m->size;
  }
  return size > 0 && end > p;
}

static int fk_vmm_unmap(uintptr_t p, size_t size) {
  FK_LOCK();
  /* "The range must be the entire contiguous address range that was mapped
   * to. In other words, ::cuMemUnmap cannot unmap a sub-range of an address
   * range mapped by ::cuMemCreate / ::cuMemMap." */
  int ok = fk_vmap_exact(p, size);
  for (uintptr_t cur = p; ok && cur < p + size;) {
    struct fk_mem *m = fk_find(cur);
    /* "When ::cuMemUnmap returns successfully the address range is converted
     * to an address reservation" */
    mmap((void *)m->base, m->size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (m->data != (char *)m->base) munmap(m->data, m->size);
    struct fk_valloc *a = fk_valloc_find(m->vh);
    cur += m->size;
    *m = fk.mem[--fk.nmem];
    if (a) {
      a->maps--;
      fk_valloc_maybe_free(a);
    }
  }
  FK_UNLOCK();
  return ok ? FK_OK : FK_EINVAL;
}

/* acc[d]: the new access of device d (0, 1 = read, 3 = read-write), or -1 to
 * leave it. */
static int fk_vmm_set_access(uintptr_t p, size_t size, const int *acc) {
  FK_LOCK();
  /* "The range must be a fully mapped address range containing all
   * allocations created by ::cuMemMap / ::cuMemCreate." (the fake: whole
   * mappings) */
  int ok = fk_vmap_exact(p, size);
  for (uintptr_t cur = p; ok && cur < p + size;) {
    struct fk_mem *m = fk_find(cur);
    int any = 0;
    for (int d = 0; d < FK_MAX_DEV; d++) {
      if (acc[d] >= 0) m->access[d] = (unsigned char)acc[d];
      any |= m->access[d];
    }
    if (m->data == (char *)m->base) /* HOSTPTR=none: stays PROT_NONE */
      mprotect((void *)m->base, m->size,
               (any & 1 ? PROT_READ : 0) | (any & 2 ? PROT_WRITE : 0));
    cur += m->size;
  }
  FK_UNLOCK();
  return ok ? FK_OK : FK_EINVAL;
}

/* cuMemRetainAllocationHandle: "The handle is guaranteed to be the same
 * handle value used to map the memory. If the address requested is not
 * mapped, the function will fail." */
static int fk_vmm_retain(uint64_t *h, uintptr_t addr) {
  FK_LOCK();
  struct fk_mem *m = fk_find(addr);
  struct fk_valloc *a =
      m && m->kind == FK_MEM_VMAP ? fk_valloc_find(m->vh) : NULL;
  if (a) {
    a->refs++; /* "must be released with corresponding number of calls to
                  ::cuMemRelease" */
    *h = a->h;
  }
  FK_UNLOCK();
  return a ? FK_OK : FK_EINVAL;
}

static int fk_vmm_props(uint64_t h, int *dev, unsigned *htypes) {
  FK_LOCK();
  struct fk_valloc *a = fk_valloc_live(h);
  if (a) {
    *dev = a->dev;
    *htypes = a->htypes;
  }
  FK_UNLOCK();
  return a ? FK_OK : FK_EINVAL;
}

/* ---- sharing by POSIX fd ------------------------------------------------- */

static int fk_vmm_export_fd(int *out, uint64_t h, uint64_t *nonce) {
  int e = FK_OK;
  FK_LOCK();
  struct fk_valloc *a = fk_valloc_live(h);
  if (!a || !(a->htypes & FK_VH_POSIX)) {
    /* attribute 103: "Device supports exporting memory to a posix file
     * descriptor with ::cuMemExportToShareableHandle, if requested via
     * ::cuMemCreate"; the error for an allocation that did not request it
     * is not documented: invalid value */
    e = FK_EINVAL;
  } else if ((*out = fcntl(a->fd, F_DUPFD_CLOEXEC, 0)) < 0) {
    e = FK_ENOMEM;
  } else {
    *nonce = a->nonce;
  }
  FK_UNLOCK();
  return e;
}

/* The nonce and device of a fake VMM allocation's fd, from the memfd's name
 * ("/memfd:fake_gpu_vmm:<nonce>:<dev> (deleted)"); 0 if it is not one. */
static int fk_vmm_fd_ident(int fd, uint64_t *nonce, int *dev) {
  char path[64], link[160];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n <= 0) return 0;
  link[n] = 0;
  return sscanf(link, "/memfd:" FK_VMM_NAME "%16" SCNx64 ":%d", nonce, dev) ==
         2;
}

static int fk_vmm_import_fd(uint64_t *h, int fd, uint64_t *nonce,
                            size_t *size) {
  struct stat st;
  int dev = -1;
  if (fd < 0 || !fk_vmm_fd_ident(fd, nonce, &dev) || fstat(fd, &st) ||
      !S_ISREG(st.st_mode) || st.st_size <= 0)
    return FK_EINVAL; /* a pipe, a socket, another memfd, a closed fd */
  /* "If the current process cannot support the memory described by this
   * shareable handle, this API will error as ::CUDA_ERROR_NOT_SUPPORTED."
   * (an allocation on a device this process does not have): not supported */
  if (dev < 0 || dev >= fk_devices()) return FK_ENOTSUP;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int own = open(path, O_RDWR | O_CLOEXEC); /* the caller may close fd */
  if (own < 0) return FK_EINVAL;
  FK_LOCK();
  struct fk_valloc *a =
      fk_vgrow((void **)&fkv.a, &fkv.na, &fkv.capa, sizeof *fkv.a);
  if (a) {
    /* "There is no guarantee that the contents of handle will be the same
     * CUDA memory handle for the same given OS shareable handle": each
     * import is a new handle, even in the exporting process */
    *a = (struct fk_valloc){.h = fk_vmm_new_handle(),
                            .nonce = *nonce,
                            .size = (size_t)st.st_size,
                            .fd = own,
                            .dev = dev,
                            .refs = 1,
                            .htypes = FK_VH_POSIX};
    *h = a->h;
    *size = a->size;
  }
  FK_UNLOCK();
  if (!a) close(own);
  return a ? FK_OK : FK_ENOMEM;
}

/* The access device dev has to the mapping containing p (0, 1 = read,
 * 3 = read-write); invalid value if p is not in a mapping. */
static inline int fk_vmm_get_access(uintptr_t p, int dev, int *acc) {
  FK_LOCK();
  struct fk_mem *m = fk_find(p);
  int ok = m && m->kind == FK_MEM_VMAP && dev >= 0 && dev < FK_MAX_DEV;
  if (ok) *acc = m->access[dev];
  FK_UNLOCK();
  return ok ? FK_OK : FK_EINVAL;
}

/* Whether p is in a reservation (mapped or not): a plain free must not take
 * it. */
static inline int fk_vmm_owns(uintptr_t p) {
  FK_LOCK();
  int yes = 0;
  for (size_t i = 0; i < fkv.nr && !yes; i++)
    yes = p >= fkv.r[i].base && p - fkv.r[i].base < fkv.r[i].size;
  FK_UNLOCK();
  return yes;
}

/* What dlclose must release (see fk_fini). */
__attribute__((destructor)) static void fk_vmm_fini(void) {
  for (size_t i = 0; i < fkv.na; i++) close(fkv.a[i].fd);
  free(fkv.a);
  free(fkv.r);
}

#endif /* FAKE_VMM_H */
