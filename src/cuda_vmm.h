/* cuda_vmm: the CUDA driver's virtual memory management calls, one
 * function each, for src/gpu_vmm.h (as ipcref__gpu_d_vmm_*): tools/
 * amalgamate.py puts them after src/cuda.h's driver part in
 * ipcref_cuda.h. The entry points are optional (src/cuda.h's table):
 * without one of them, no device shares memory by fd. */

/* Virtual memory management (src/gpu_vmm.h uses these). An allocation is
 * pinned memory of one device, shareable by POSIX fd. */
IPCREF__PRIVATE void ipcref__cu_vmm_prop(ipcref__cu_mem_prop *p, int dev) {
  memset(p, 0, sizeof *p);
  p->type = (ipcref__cu_alloc_type)IPCREF__CU_ALLOC_PINNED;
  p->requestedHandleTypes = (ipcref__cu_handle_type)IPCREF__CU_HANDLE_POSIX_FD;
  p->location.type = (ipcref__cu_location_type)IPCREF__CU_LOCATION_DEVICE;
  p->location.id = dev;
}
/* Read (or read-write) access for device `dev`. */
IPCREF__PRIVATE void ipcref__cu_access_of(ipcref__cu_access *a, int dev,
                                          int writable) {
  memset(a, 0, sizeof *a);
  a->location.type = (ipcref__cu_location_type)IPCREF__CU_LOCATION_DEVICE;
  a->location.id = dev;
  a->flags = (ipcref__cu_access_flags)(writable ? IPCREF__CU_PROT_READWRITE
                                                : IPCREF__CU_PROT_READ);
}
/* 1 when device `dev` (current) makes such memory: the driver has every
 * call, and the device both attributes. */
IPCREF__PRIVATE int ipcref__cu_d_vmm_supported(ipcref__cu_state *d, int dev) {
  const ipcref__cu_api *a = &d->api;
  int vmm = 0, fd = 0;
  if (!a->DeviceGetAttribute || !a->CtxSynchronize ||
      !a->MemGetAllocationGranularity || !a->MemCreate || !a->MemRelease ||
      !a->MemAddressReserve || !a->MemAddressFree || !a->MemMap ||
      !a->MemUnmap || !a->MemSetAccess || !a->MemExportToShareableHandle ||
      !a->MemImportFromShareableHandle || !a->MemRetainAllocationHandle ||
      !a->MemGetAllocationPropertiesFromHandle)
    return 0;
  if (a->DeviceGetAttribute(&vmm, (ipcref__cu_dev_attr)IPCREF__CU_ATTR_VMM,
                            d->devs[dev]) ||
      a->DeviceGetAttribute(&fd, (ipcref__cu_dev_attr)IPCREF__CU_ATTR_POSIX_FD,
                            d->devs[dev]))
    return 0;
  return vmm && fd;
}
IPCREF__PRIVATE int ipcref__cu_d_vmm_granularity(ipcref__cu_state *d, int dev,
                                                 size_t *g) {
  ipcref__cu_mem_prop p;
  ipcref__cu_vmm_prop(&p, dev);
  return (int)d->api.MemGetAllocationGranularity(
      g, &p, (ipcref__cu_granularity)IPCREF__CU_GRANULARITY_MIN);
}
IPCREF__PRIVATE int ipcref__cu_d_vmm_create(ipcref__cu_state *d, int dev,
                                            size_t size, uint64_t *h) {
  ipcref__cu_mem_prop p;
  ipcref__cu_vmm_handle vh = 0;
  int code;
  ipcref__cu_vmm_prop(&p, dev);
  code = (int)d->api.MemCreate(&vh, size, &p, 0);
  *h = (uint64_t)vh;
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_vmm_release(ipcref__cu_state *d, uint64_t h) {
  return (int)d->api.MemRelease((ipcref__cu_vmm_handle)h);
}
IPCREF__PRIVATE int ipcref__cu_d_vmm_reserve(ipcref__cu_state *d, size_t size,
                                             uint64_t *addr) {
  ipcref__cu_ptr p = 0;
  int code = (int)d->api.MemAddressReserve(&p, size, 0, 0, 0);
  *addr = (uint64_t)p;
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_vmm_unreserve(ipcref__cu_state *d,
                                               uint64_t addr, size_t size) {
  return (int)d->api.MemAddressFree((ipcref__cu_ptr)addr, size);
}
IPCREF__PRIVATE int ipcref__cu_d_vmm_map(ipcref__cu_state *d, uint64_t addr,
                                         size_t size, uint64_t h) {
  return (int)d->api.MemMap((ipcref__cu_ptr)addr, size, 0,
                            (ipcref__cu_vmm_handle)h, 0);
}
IPCREF__PRIVATE int ipcref__cu_d_vmm_unmap(ipcref__cu_state *d, uint64_t addr,
                                           size_t size) {
  return (int)d->api.MemUnmap((ipcref__cu_ptr)addr, size);
}
IPCREF__PRIVATE int ipcref__cu_d_vmm_access(ipcref__cu_state *d, uint64_t addr,
                                            size_t size, int dev,
                                            int writable) {
  ipcref__cu_access a;
  ipcref__cu_access_of(&a, dev, writable);
  return (int)d->api.MemSetAccess((ipcref__cu_ptr)addr, size, &a, 1);
}
IPCREF__PRIVATE int ipcref__cu_d_vmm_export(ipcref__cu_state *d, uint64_t h,
                                            int *fd) {
  return (int)d->api.MemExportToShareableHandle(
      fd, (ipcref__cu_vmm_handle)h,
      (ipcref__cu_handle_type)IPCREF__CU_HANDLE_POSIX_FD, 0);
}
/* The fd goes by value, in the pointer (the driver's convention). */
IPCREF__PRIVATE int ipcref__cu_d_vmm_import(ipcref__cu_state *d, int fd,
                                            uint64_t *h) {
  ipcref__cu_vmm_handle vh = 0;
  int code = (int)d->api.MemImportFromShareableHandle(
      &vh, (void *)(uintptr_t)fd,
      (ipcref__cu_handle_type)IPCREF__CU_HANDLE_POSIX_FD);
  *h = (uint64_t)vh;
  return code;
}
/* The allocation handle of the VMM mapping holding `addr` (another
 * allocator's), retained: released with ipcref__cu_d_vmm_release. An
 * error for memory that is not VMM. *fd_ok: made shareable by POSIX fd. */
IPCREF__PRIVATE int ipcref__cu_d_vmm_retain(ipcref__cu_state *d, uint64_t addr,
                                            uint64_t *h, int *fd_ok) {
  ipcref__cu_vmm_handle vh = 0;
  ipcref__cu_mem_prop p;
  int code;
  *fd_ok = 0;
  if (!d->api.MemRetainAllocationHandle) return IPCREF__CU_NOT_SUPPORTED;
  code = (int)d->api.MemRetainAllocationHandle(&vh, (void *)(uintptr_t)addr);
  *h = (uint64_t)vh;
  if (code) return code;
  memset(&p, 0, sizeof p);
  if (d->api.MemGetAllocationPropertiesFromHandle(&p, vh) == 0)
    *fd_ok = ((int)p.requestedHandleTypes & IPCREF__CU_HANDLE_POSIX_FD) != 0;
  return 0;
}
IPCREF__PRIVATE int ipcref__cu_d_sync(ipcref__cu_state *d) {
  return (int)d->api.CtxSynchronize();
}

/* Stream-ordered pools (src/gpu_pool.h uses these). */
IPCREF__PRIVATE int ipcref__cu_d_pool_supported(ipcref__cu_state *d) {
  const ipcref__cu_api *a = &d->api;
  return a->MemPoolExportToShareableHandle &&
         a->MemPoolImportFromShareableHandle && a->MemPoolExportPointer &&
         a->MemPoolImportPointer && a->MemPoolSetAccess && a->MemPoolDestroy;
}
/* The pool `addr` was allocated from (0: none, or not device memory). */
IPCREF__PRIVATE uint64_t ipcref__cu_d_pool_of(ipcref__cu_state *d,
                                              uint64_t addr) {
  ipcref__cu_mempool pool = NULL;
  if (d->api.PointerGetAttribute(&pool,
                                 (ipcref__cu_attr)IPCREF__CU_ATTR_MEMPOOL,
                                 (ipcref__cu_ptr)addr))
    return 0;
  return (uint64_t)(uintptr_t)pool;
}
IPCREF__PRIVATE int ipcref__cu_d_pool_export(ipcref__cu_state *d, uint64_t pool,
                                             int *fd) {
  return (int)d->api.MemPoolExportToShareableHandle(
      fd, (ipcref__cu_mempool)(uintptr_t)pool,
      (ipcref__cu_handle_type)IPCREF__CU_HANDLE_POSIX_FD, 0);
}
IPCREF__PRIVATE int ipcref__cu_d_pool_export_ptr(ipcref__cu_state *d,
                                                 uint64_t addr,
                                                 unsigned char *data) {
  ipcref__cu_mempool_data x;
  int code;
  memset(&x, 0, sizeof x);
  code = (int)d->api.MemPoolExportPointer(&x, (ipcref__cu_ptr)addr);
  memcpy(data, &x, IPCREF_HANDLE_BYTES);
  return code;
}
/* The fd goes by value, in the pointer (the driver's convention). */
IPCREF__PRIVATE int ipcref__cu_d_pool_import(ipcref__cu_state *d, int fd,
                                             uint64_t *pool) {
  ipcref__cu_mempool p = NULL;
  int code = (int)d->api.MemPoolImportFromShareableHandle(
      &p, (void *)(uintptr_t)fd,
      (ipcref__cu_handle_type)IPCREF__CU_HANDLE_POSIX_FD, 0);
  *pool = (uint64_t)(uintptr_t)p;
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_pool_access(ipcref__cu_state *d, uint64_t pool,
                                             int dev, int writable) {
  ipcref__cu_access a;
  ipcref__cu_access_of(&a, dev, writable);
  return (int)d->api.MemPoolSetAccess((ipcref__cu_mempool)(uintptr_t)pool, &a,
                                      1);
}
IPCREF__PRIVATE int ipcref__cu_d_pool_import_ptr(ipcref__cu_state *d,
                                                 uint64_t pool,
                                                 const unsigned char *data,
                                                 uint64_t *addr) {
  ipcref__cu_mempool_data x;
  ipcref__cu_ptr p = 0;
  int code;
  memcpy(&x, data, sizeof x);
  code = (int)d->api.MemPoolImportPointer(
      &p, (ipcref__cu_mempool)(uintptr_t)pool, &x);
  *addr = (uint64_t)p;
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_pool_destroy(ipcref__cu_state *d,
                                              uint64_t pool) {
  return (int)d->api.MemPoolDestroy((ipcref__cu_mempool)(uintptr_t)pool);
}
