/* hip_vmm: the HIP runtime's virtual memory management calls, one
 * function each, for src/gpu_vmm.h (as ipcref__gpu_d_vmm_*):
 * tools/amalgamate.py puts them after src/hip.h's driver part in
 * ipcref_hip.h. The entry points are optional (src/hip.h's table):
 * without one of them, no device shares memory by fd.
 *
 * hipMemAllocationProp changed its layout in HIP 5.3 (HIP 5.2's header
 * puts compressionType first and the type after the location; from 5.3 on
 * it is CUDA's), so the properties are written in the layout of the
 * runtime loaded (hipRuntimeGetVersion), never in the header's. */

/* hipMemAllocationProp up to HIP 5.2, and from HIP 5.3 on. */
typedef struct {
  unsigned char compressionType;
  struct {
    int type, id;
  } location;
  int requestedHandleType, type;
  unsigned short usage;
  void *win32HandleMetaData;
} ipcref__hip_prop52;
typedef struct {
  int type, requestedHandleType;
  struct {
    int type, id;
  } location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType, gpuDirectRDMACapable;
    unsigned short usage;
  } allocFlags;
} ipcref__hip_prop53;
typedef union {
  ipcref__hip_prop52 v52;
  ipcref__hip_prop53 v53;
  unsigned char room[64]; /* what a later layout may add */
} ipcref__hip_prop;

#define IPCREF__HIP_VERSION_5_3     50300000 /* the layout's change */
#define IPCREF__HIP_HANDLE_POSIX_FD 0x1      /* ...PosixFileDescriptor */
#define IPCREF__HIP_NOT_SUPPORTED   801      /* hipErrorNotSupported */

/* hipMemAccessDesc's layout (a hipMemLocation, then the flags): read (or
 * read-write) access for device `dev`. */
typedef struct {
  int type, id, flags;
} ipcref__hip_access_desc;
IPCREF__PRIVATE const ipcref__hip_access *
ipcref__hip_access_of(ipcref__hip_access_desc *a, int dev, int writable) {
  a->type = 1; /* hipMemLocationTypeDevice */
  a->id = dev;
  a->flags = writable ? 3 : 1; /* hipMemAccessFlagsProtReadWrite, ...Read */
  return (const ipcref__hip_access *)(const void *)a;
}

/* Pinned memory of device `dev`, shareable by POSIX fd, in the loaded
 * runtime's layout. */
IPCREF__PRIVATE const ipcref__hip_mem_prop *
ipcref__hip_vmm_prop(const ipcref__hip_state *d, ipcref__hip_prop *p, int dev) {
  memset(p, 0, sizeof *p);
  if (d->version < IPCREF__HIP_VERSION_5_3) {
    p->v52.type = 1; /* hipMemAllocationTypePinned */
    p->v52.requestedHandleType = IPCREF__HIP_HANDLE_POSIX_FD;
    p->v52.location.type = 1; /* hipMemLocationTypeDevice */
    p->v52.location.id = dev;
  } else {
    p->v53.type = 1;
    p->v53.requestedHandleType = IPCREF__HIP_HANDLE_POSIX_FD;
    p->v53.location.type = 1;
    p->v53.location.id = dev;
  }
  return (const ipcref__hip_mem_prop *)(const void *)p;
}

IPCREF__PRIVATE int ipcref__hip_d_vmm_granularity(ipcref__hip_state *d, int dev,
                                                  size_t *g) {
  ipcref__hip_prop p;
  return (int)d->api.MemGetAllocationGranularity(
      g, ipcref__hip_vmm_prop(d, &p, dev),
      (ipcref__hip_granularity)0 /* hipMemAllocationGranularityMinimum */);
}
/* 1 when device `dev` (current) makes such memory: the runtime has every
 * call and answers a granularity (HIP has no attribute to ask). */
IPCREF__PRIVATE int ipcref__hip_d_vmm_supported(ipcref__hip_state *d, int dev) {
  const ipcref__hip_api *a = &d->api;
  size_t g = 0;
  if (!a->DeviceSynchronize || !a->MemGetAllocationGranularity ||
      !a->MemCreate || !a->MemRelease || !a->MemAddressReserve ||
      !a->MemAddressFree || !a->MemMap || !a->MemUnmap || !a->MemSetAccess ||
      !a->MemExportToShareableHandle || !a->MemImportFromShareableHandle ||
      !a->MemRetainAllocationHandle || !a->MemGetAllocationPropertiesFromHandle)
    return 0;
  return ipcref__hip_d_vmm_granularity(d, dev, &g) == 0 && g > 0;
}
IPCREF__PRIVATE int ipcref__hip_d_vmm_create(ipcref__hip_state *d, int dev,
                                             size_t size, uint64_t *h) {
  ipcref__hip_prop p;
  ipcref__hip_vmm_handle vh = NULL;
  int code =
      (int)d->api.MemCreate(&vh, size, ipcref__hip_vmm_prop(d, &p, dev), 0);
  *h = (uint64_t)(uintptr_t)vh;
  return code;
}
IPCREF__PRIVATE int ipcref__hip_d_vmm_release(ipcref__hip_state *d,
                                              uint64_t h) {
  return (int)d->api.MemRelease((ipcref__hip_vmm_handle)(uintptr_t)h);
}
IPCREF__PRIVATE int ipcref__hip_d_vmm_reserve(ipcref__hip_state *d, size_t size,
                                              uint64_t *addr) {
  void *p = NULL;
  int code = (int)d->api.MemAddressReserve(&p, size, 0, NULL, 0);
  *addr = (uint64_t)(uintptr_t)p;
  return code;
}
IPCREF__PRIVATE int ipcref__hip_d_vmm_unreserve(ipcref__hip_state *d,
                                                uint64_t addr, size_t size) {
  return (int)d->api.MemAddressFree((void *)(uintptr_t)addr, size);
}
IPCREF__PRIVATE int ipcref__hip_d_vmm_map(ipcref__hip_state *d, uint64_t addr,
                                          size_t size, uint64_t h) {
  return (int)d->api.MemMap((void *)(uintptr_t)addr, size, 0,
                            (ipcref__hip_vmm_handle)(uintptr_t)h, 0);
}
IPCREF__PRIVATE int ipcref__hip_d_vmm_unmap(ipcref__hip_state *d, uint64_t addr,
                                            size_t size) {
  return (int)d->api.MemUnmap((void *)(uintptr_t)addr, size);
}
IPCREF__PRIVATE int ipcref__hip_d_vmm_access(ipcref__hip_state *d,
                                             uint64_t addr, size_t size,
                                             int dev, int writable) {
  ipcref__hip_access_desc a;
  return (int)d->api.MemSetAccess((void *)(uintptr_t)addr, size,
                                  ipcref__hip_access_of(&a, dev, writable), 1);
}
IPCREF__PRIVATE int ipcref__hip_d_vmm_export(ipcref__hip_state *d, uint64_t h,
                                             int *fd) {
  return (int)d->api.MemExportToShareableHandle(
      fd, (ipcref__hip_vmm_handle)(uintptr_t)h,
      (ipcref__hip_handle_type)IPCREF__HIP_HANDLE_POSIX_FD, 0);
}
/* The fd goes by value, in the pointer (the runtime's convention). */
IPCREF__PRIVATE int ipcref__hip_d_vmm_import(ipcref__hip_state *d, int fd,
                                             uint64_t *h) {
  ipcref__hip_vmm_handle vh = NULL;
  int code = (int)d->api.MemImportFromShareableHandle(
      &vh, (void *)(uintptr_t)fd,
      (ipcref__hip_handle_type)IPCREF__HIP_HANDLE_POSIX_FD);
  *h = (uint64_t)(uintptr_t)vh;
  return code;
}
/* The allocation handle of the VMM mapping holding `addr`, retained; an
 * error for memory that is not VMM. *fd_ok: made shareable by fd. */
IPCREF__PRIVATE int ipcref__hip_d_vmm_retain(ipcref__hip_state *d,
                                             uint64_t addr, uint64_t *h,
                                             int *fd_ok) {
  ipcref__hip_vmm_handle vh = NULL;
  ipcref__hip_prop p;
  int code, types;
  *fd_ok = 0;
  if (!d->api.MemRetainAllocationHandle) return IPCREF__HIP_NOT_SUPPORTED;
  code = (int)d->api.MemRetainAllocationHandle(&vh, (void *)(uintptr_t)addr);
  *h = (uint64_t)(uintptr_t)vh;
  if (code) return code;
  memset(&p, 0, sizeof p);
  if (d->api.MemGetAllocationPropertiesFromHandle(
          (ipcref__hip_mem_prop *)(void *)&p, vh) == 0) {
    types = d->version < IPCREF__HIP_VERSION_5_3 ? p.v52.requestedHandleType
                                                 : p.v53.requestedHandleType;
    *fd_ok = (types & IPCREF__HIP_HANDLE_POSIX_FD) != 0;
  }
  return 0;
}
IPCREF__PRIVATE int ipcref__hip_d_sync(ipcref__hip_state *d) {
  return (int)d->api.DeviceSynchronize();
}

/* Stream-ordered pools (src/gpu_pool.h uses these). */
#define IPCREF__HIP_ATTR_MEMPOOL 17 /* HIP_POINTER_ATTRIBUTE_MEMPOOL_HANDLE */
IPCREF__PRIVATE int ipcref__hip_d_pool_supported(ipcref__hip_state *d) {
  const ipcref__hip_api *a = &d->api;
  return a->PointerGetAttribute && a->MemPoolExportToShareableHandle &&
         a->MemPoolImportFromShareableHandle && a->MemPoolExportPointer &&
         a->MemPoolImportPointer && a->MemPoolSetAccess && a->MemPoolDestroy;
}
/* The pool `addr` was allocated from (0: none, or no answer). */
IPCREF__PRIVATE uint64_t ipcref__hip_d_pool_of(ipcref__hip_state *d,
                                               uint64_t addr) {
  ipcref__hip_mempool pool = NULL;
  if (d->api.PointerGetAttribute(&pool,
                                 (ipcref__hip_attr)IPCREF__HIP_ATTR_MEMPOOL,
                                 (void *)(uintptr_t)addr))
    return 0;
  return (uint64_t)(uintptr_t)pool;
}
IPCREF__PRIVATE int ipcref__hip_d_pool_export(ipcref__hip_state *d,
                                              uint64_t pool, int *fd) {
  return (int)d->api.MemPoolExportToShareableHandle(
      fd, (ipcref__hip_mempool)(uintptr_t)pool,
      (ipcref__hip_handle_type)IPCREF__HIP_HANDLE_POSIX_FD, 0);
}
IPCREF__PRIVATE int ipcref__hip_d_pool_export_ptr(ipcref__hip_state *d,
                                                  uint64_t addr,
                                                  unsigned char *data) {
  ipcref__hip_mempool_data x;
  int code;
  memset(&x, 0, sizeof x);
  code = (int)d->api.MemPoolExportPointer(&x, (void *)(uintptr_t)addr);
  memcpy(data, &x, IPCREF_HANDLE_BYTES);
  return code;
}
/* The fd goes by value, in the pointer (the runtime's convention). */
IPCREF__PRIVATE int ipcref__hip_d_pool_import(ipcref__hip_state *d, int fd,
                                              uint64_t *pool) {
  ipcref__hip_mempool p = NULL;
  int code = (int)d->api.MemPoolImportFromShareableHandle(
      &p, (void *)(uintptr_t)fd,
      (ipcref__hip_handle_type)IPCREF__HIP_HANDLE_POSIX_FD, 0);
  *pool = (uint64_t)(uintptr_t)p;
  return code;
}
IPCREF__PRIVATE int ipcref__hip_d_pool_access(ipcref__hip_state *d,
                                              uint64_t pool, int dev,
                                              int writable) {
  ipcref__hip_access_desc a;
  return (int)d->api.MemPoolSetAccess((ipcref__hip_mempool)(uintptr_t)pool,
                                      ipcref__hip_access_of(&a, dev, writable),
                                      1);
}
IPCREF__PRIVATE int ipcref__hip_d_pool_import_ptr(ipcref__hip_state *d,
                                                  uint64_t pool,
                                                  const unsigned char *data,
                                                  uint64_t *addr) {
  ipcref__hip_mempool_data x;
  void *p = NULL;
  int code;
  memcpy(&x, data, sizeof x);
  code = (int)d->api.MemPoolImportPointer(
      &p, (ipcref__hip_mempool)(uintptr_t)pool, &x);
  *addr = (uint64_t)(uintptr_t)p;
  return code;
}
IPCREF__PRIVATE int ipcref__hip_d_pool_destroy(ipcref__hip_state *d,
                                               uint64_t pool) {
  return (int)d->api.MemPoolDestroy((ipcref__hip_mempool)(uintptr_t)pool);
}
