/* fake_hip_pool.c - the HIP stream-ordered memory pool entry points of the
 * fake libamdhip64.so.5, over fake_pool.h (the engine the CUDA skin,
 * fake_cuda_pool.c, uses too). Not compiled alone: fake_hip.c #includes it
 * (it uses gate(), the error mapping and the hipFree / hipPointerGetAttribute
 * / hipIpcGetMemHandle hooks there). Each rule quotes the doc comment above
 * the function in the HIP 5.2 <hip/hip_runtime_api.h>; where that header is
 * silent the fake does what the CUDA fake does for the same call (cuda.h's
 * rule, quoted in fake_pool.h / fake_cuda_pool.c) and says "(the fake)".
 *
 * Exported at version node hip_5.1, as the real libamdhip64.so.5.2.21153
 * (objdump -T) exports every hipMemPool* name, hipMallocFromPoolAsync and
 * hipFreeAsync.
 *
 * HIP has no current context: the default (NULL) stream is the current
 * device's. An unknown stream or pool: hipErrorInvalidValue (the header
 * lists no hipErrorInvalidHandle for these calls).
 *
 * Knobs: FAKE_HIP_POOLS=0 - pools are not supported: hipMemPoolCreate and
 * hipMemPoolImportFromShareableHandle fail hipErrorNotSupported (the fake
 * has no hipDeviceGetAttribute to answer
 * hipDeviceAttributeMemoryPoolsSupported). FAKE_HIP_POSIX_FD=0 - a pool asking
 * for hipMemHandleTypePosixFileDescriptor fails hipErrorNotSupported
 * (hipMemHandleTypeNone still works).
 *
 * Log keys (as fake_cuda_pool.c): pool=<pool nonce, 16 hex> last on the line
 * for pool calls, "pool=<16 hex> alloc=<16 hex>" last for pointer calls (the
 * same in the exporter and every importer), hpool=<this process's handle>;
 * ready_in_us / done_in_us = how long until the stream reaches the
 * allocation / the free; imported_elsewhere=N on the exporter's free =
 * importing processes whose release had not completed (a violation when >
 * 0); pending_us on hipMemPoolImportPointer and on hipMemcpy / hipMemset
 * that touch pool memory = how long until its allocation completes (> 0:
 * touched too early).
 */

#define PH(h) ((unsigned long long)(uintptr_t)(h)) /* logged as 0x%016llx */
#define HP(h) ((hipMemPool_t)(uintptr_t)(h))

_Static_assert(hipMemHandleTypePosixFileDescriptor == FK_POOL_POSIX, "");
_Static_assert(sizeof(hipMemPoolPtrExportData) == sizeof(struct fk_pexport),
               "");
_Static_assert((int)HIP_POINTER_ATTRIBUTE_MEMPOOL_HANDLE == 17, "");

/* hipMemPoolProps checks. */
static int hpool_props(const hipMemPoolProps *pp) {
  if (!pp) return FK_EINVAL;
  /* allocType: "Allocation type. Currently must be specified as
   * @p hipMemAllocationTypePinned" */
  if (pp->allocType != hipMemAllocationTypePinned) return FK_EINVAL;
  /* location: "Location where allocations should reside";
   * hipMemLocationTypeDevice "Device location, thus it's HIP device ID" is
   * the only type. An id out of range: the header lists no
   * hipErrorInvalidDevice here, so invalid value (the fake, as CUDA). */
  if (pp->location.type != hipMemLocationTypeDevice) return FK_EINVAL;
  if (pp->location.id < 0 || pp->location.id >= fk_devices()) return FK_EINVAL;
  /* win32SecurityAttributes: "Windows-specific LPSECURITYATTRIBUTES required
   * when @p hipMemHandleTypeWin32 is specified" (the fake, as CUDA: else 0);
   * reserved: "Reserved for future use, must be 0" */
  if (pp->win32SecurityAttributes) return FK_EINVAL;
  for (size_t i = 0; i < sizeof pp->reserved; i++)
    if (pp->reserved[i]) return FK_EINVAL;
  /* "Specifying hipMemHandleTypeNone creates a memory pool that will not
   * support IPC." hipMemHandleTypePosixFileDescriptor: "Allows a file
   * descriptor for exporting. Permitted only on POSIX systems"; the Win32
   * types are not for Linux: not supported; other bits: invalid value. */
  unsigned t = (unsigned)pp->handleTypes;
  if (t & ~(unsigned)(hipMemHandleTypePosixFileDescriptor |
                      hipMemHandleTypeWin32 | hipMemHandleTypeWin32Kmt))
    return FK_EINVAL;
  if (t & ~(unsigned)hipMemHandleTypePosixFileDescriptor) return FK_ENOTSUP;
  return FK_OK;
}

/* "Creates a HIP memory pool and returns the handle in @p mem_pool." "By
 * default, the memory pool will be accessible from the device it is
 * allocated on." HIP 5.2's props have no maxSize: no limit but MEM_LIMIT. */
hipError_t hipMemPoolCreate(hipMemPool_t *mem_pool,
                            const hipMemPoolProps *pool_props) {
  GATE();
  uint64_t h = 0, nonce = 0;
  unsigned types = pool_props ? (unsigned)pool_props->handleTypes : 0;
  if (!e && !mem_pool) e = FK_EINVAL;
  if (!e) e = hpool_props(pool_props);
  /* "@returns #hipSuccess, #hipErrorInvalidValue, #hipErrorNotSupported":
   * FAKE_HIP_POOLS=0, or FAKE_HIP_POSIX_FD=0 for a shareable pool */
  if (!e && !fk_pools_on()) e = FK_ENOTSUP;
  if (!e && (types & ~fk_pool_htypes_supported())) e = FK_ENOTSUP;
  if (!e) e = fk_pool_create(&h, &nonce, pool_props->location.id, types, 0);
  if (!e) *mem_pool = HP(h);
  RET("hipMemPoolCreate", e, "dev=%d types=%u hpool=0x%016llx pool=%016" PRIx64,
      pool_props ? pool_props->location.id : -1, types, PH(h), nonce);
}

/* "If any pointers obtained from this pool haven't been freed or the pool
 * has free operations that haven't completed when @p hipMemPoolDestroy is
 * invoked, the function will return immediately and the resources
 * associated with the pool will be released automatically once there are no
 * more outstanding allocations." The handle is invalid at once (the fake: a
 * second destroy is hipErrorInvalidValue); the pointers stay usable until
 * freed. */
hipError_t hipMemPoolDestroy(hipMemPool_t mem_pool) {
  GATE();
  uint64_t nonce = 0;
  int outstanding = 0;
  if (!e) e = fk_pool_destroy(PH(mem_pool), &nonce, &outstanding);
  RET("hipMemPoolDestroy", e, "hpool=0x%016llx outstanding=%d pool=%016" PRIx64,
      PH(mem_pool), outstanding, nonce);
}

/* "Inserts an allocation operation into @p stream. A pointer to the
 * allocated memory is returned immediately in @p dev_ptr. The allocation must
 * not be accessed until the the allocation operation completes." (pending_us on
 * hipMemcpy / hipMemset shows an early touch.) Size 0: the header is silent;
 * the fake answers hipErrorInvalidValue, as the CUDA fake. */
hipError_t hipMallocFromPoolAsync(void **dev_ptr, size_t size,
                                  hipMemPool_t mem_pool, hipStream_t stream) {
  GATE();
  uintptr_t p = 0;
  uint64_t nonce = 0, pnonce = 0;
  unsigned long long ready_us = 0;
  if (!e && (!dev_ptr || !size)) e = FK_EINVAL;
  /* hipMemPoolImportFromShareableHandle: "Imported memory pools do not
   * support creating new allocations. As such imported memory pools may not
   * be used in @p hipDeviceSetMemPool or @p hipMallocFromPoolAsync calls." (the
   * fake: hipErrorNotSupported). "@returns ... #hipErrorOutOfMemory":
   * MEM_LIMIT. */
  if (!e)
    e = fk_pool_alloc(&p, size, PH(mem_pool), stream, dev, &nonce, &pnonce,
                      &ready_us);
  if (!e) *dev_ptr = (void *)p;
  RET("hipMallocFromPoolAsync", e,
      "size=%zu hpool=0x%016llx stream=0x%llx ptr=0x%llx ready_in_us=%llu "
      "pool=%016" PRIx64 " alloc=%016" PRIx64,
      size, PH(mem_pool), FK_P(stream), FK_P(p), ready_us, pnonce, nonce);
}

/* hipFree (fake_hip.c) of pool memory comes here with now_ = 1:
 * hipMemPoolImportPointer: "The pointer may be freed with @p hipFree or
 * @p hipFreeAsync." hipFree: "This API performs an implicit
 * hipDeviceSynchronize() call." (the fake's hipFree does not wait, for any
 * memory: the free completes at once). Not the pointer allocated or
 * imported (an interior one, freed, not pool memory): hipFreeAsync ->
 * hipErrorInvalidValue; hipFree -> hipErrorInvalidDevicePointer ("if
 * pointer is invalid"). */
static hipError_t hpool_free(const char *call, void *dev_ptr, int now_,
                             hipStream_t stream) {
  GATE();
  uint64_t nonce = 0, pnonce = 0;
  unsigned long long done_us = 0;
  int elsewhere = 0;
  if (!e)
    e = fk_pool_free((uintptr_t)dev_ptr, now_, stream, dev, &nonce, &pnonce,
                     &done_us, &elsewhere);
  if (now_) {
    if (e == FK_EINVAL) e = FK_EBADFREE;
    RET(call, e,
        "ptr=0x%llx imported_elsewhere=%d pool=%016" PRIx64
        " alloc=%016" PRIx64,
        FK_P(dev_ptr), elsewhere, pnonce, nonce);
  }
  RET(call, e,
      "ptr=0x%llx stream=0x%llx done_in_us=%llu imported_elsewhere=%d "
      "pool=%016" PRIx64 " alloc=%016" PRIx64,
      FK_P(dev_ptr), FK_P(stream), done_us, elsewhere, pnonce, nonce);
}

/* "Inserts a free operation into @p stream. The allocation must not be used
 * after stream execution reaches the free." For an import
 * (hipMemPoolImportPointer): "If @p hipFreeAsync is used, the free must be
 * completed on the importing process before the free operation on the
 * exporting process." (imported_elsewhere=N). Memory not from a pool
 * (hipMalloc's): hipErrorInvalidValue (the fake, as CUDA). */
hipError_t hipFreeAsync(void *dev_ptr, hipStream_t stream) {
  return hpool_free("hipFreeAsync", dev_ptr, 0, stream);
}

/* "desc_list  Array of access descriptors. Each descriptor instructs the
 * access to enable for a single gpu" -> acc[device] (fk_pool_set_access). */
static int hpool_access_descs(const hipMemAccessDesc *desc, size_t count,
                              int *acc) {
  for (int d = 0; d < FK_MAX_DEV; d++) acc[d] = -1;
  if (!desc || !count) return FK_EINVAL;
  for (size_t i = 0; i < count; i++) {
    unsigned f = (unsigned)desc[i].flags;
    /* "@returns #hipSuccess, #hipErrorInvalidValue" for any bad one */
    if (desc[i].location.type != hipMemLocationTypeDevice ||
        desc[i].location.id < 0 || desc[i].location.id >= fk_devices() ||
        (f != hipMemAccessFlagsProtNone && f != hipMemAccessFlagsProtRead &&
         f != hipMemAccessFlagsProtReadWrite))
      return FK_EINVAL;
    acc[desc[i].location.id] = (int)f;
  }
  return FK_OK;
}

/* "Controls visibility of the specified pool between devices". An imported
 * pool starts with no access from any device (the fake; the header is
 * silent): the importer sets it here before it touches an imported pointer.
 * hipMemcpy and hipMemset check it. */
hipError_t hipMemPoolSetAccess(hipMemPool_t mem_pool,
                               const hipMemAccessDesc *desc_list,
                               size_t count) {
  GATE();
  int acc[FK_MAX_DEV];
  uint64_t nonce = 0;
  if (!e) e = hpool_access_descs(desc_list, count, acc);
  if (!e) e = fk_pool_set_access(PH(mem_pool), acc, &nonce);
  RET("hipMemPoolSetAccess", e,
      "hpool=0x%016llx count=%zu dev=%d flags=%d pool=%016" PRIx64,
      PH(mem_pool), count, desc_list && count ? desc_list[0].location.id : -1,
      desc_list && count ? (int)desc_list[0].flags : -1, nonce);
}

/* "Returns the accessibility of the pool's memory from the specified
 * location." */
hipError_t hipMemPoolGetAccess(hipMemAccessFlags *flags, hipMemPool_t mem_pool,
                               hipMemLocation *location) {
  GATE();
  int acc = 0;
  uint64_t nonce = 0;
  if (!e &&
      (!flags || !location || location->type != hipMemLocationTypeDevice ||
       location->id < 0 || location->id >= fk_devices()))
    e = FK_EINVAL;
  if (!e) e = fk_pool_get_access(PH(mem_pool), location->id, &acc, &nonce);
  if (!e) *flags = (hipMemAccessFlags)acc;
  RET("hipMemPoolGetAccess", e,
      "hpool=0x%016llx dev=%d flags=%d pool=%016" PRIx64, PH(mem_pool),
      location ? location->id : -1, acc, nonce);
}

/* ---- sharing ------------------------------------------------------------- */

/* "Given an IPC capable mempool, create an OS handle to share the pool with
 * another process." "To create an IPC capable mempool, create a mempool
 * with a @p hipMemAllocationHandleType other than @p hipMemHandleTypeNone." A
 * pool made with hipMemHandleTypeNone, an imported pool, another handle type or
 * flags ("Must be 0"): hipErrorInvalidValue. The fd is written as an int at
 * shared_handle (the header is silent; as CUDA), a new fd (O_CLOEXEC), the
 * caller's to close. */
hipError_t
hipMemPoolExportToShareableHandle(void *shared_handle, hipMemPool_t mem_pool,
                                  hipMemAllocationHandleType handle_type,
                                  unsigned int flags) {
  GATE();
  int fd = -1;
  uint64_t nonce = 0;
  if (!e && (!shared_handle || flags ||
             handle_type != hipMemHandleTypePosixFileDescriptor))
    e = FK_EINVAL;
  if (!e) e = fk_pool_export_fd(&fd, PH(mem_pool), &nonce);
  if (!e) memcpy(shared_handle, &fd, sizeof fd);
  RET("hipMemPoolExportToShareableHandle", e,
      "hpool=0x%016llx type=%d fd=%d pool=%016" PRIx64, PH(mem_pool),
      (int)handle_type, fd, nonce);
}

/* "Imports a memory pool from a shared handle." shared_handle: "OS handle
 * of the pool to open" - for a POSIX fd, the fd itself:
 * (void *)(uintptr_t)fd, as hipMemImportFromShareableHandle takes it. What
 * is not a fake pool's fd (a pipe, another memfd, an allocation's, a closed
 * fd), another handle type, flags ("Must be 0"): hipErrorInvalidValue. The
 * caller may close the fd afterwards (the fake keeps nothing open).
 * FAKE_HIP_POOLS=0: hipErrorNotSupported (not in the header's list; as
 * hipMemCreate & co. with FAKE_HIP_VMM=0). */
hipError_t
hipMemPoolImportFromShareableHandle(hipMemPool_t *mem_pool, void *shared_handle,
                                    hipMemAllocationHandleType handle_type,
                                    unsigned int flags) {
  GATE();
  uint64_t h = 0, nonce = 0;
  int fd = (int)(intptr_t)shared_handle, d = -1;
  if (!e && (!mem_pool || flags ||
             handle_type != hipMemHandleTypePosixFileDescriptor))
    e = FK_EINVAL;
  if (!e && !fk_pools_on()) e = FK_ENOTSUP;
  if (!e) e = fk_pool_import_fd(&h, fd, &nonce, &d);
  if (!e) *mem_pool = HP(h);
  RET("hipMemPoolImportFromShareableHandle", e,
      "fd=%d type=%d dev=%d hpool=0x%016llx pool=%016" PRIx64, fd,
      (int)handle_type, d, PH(h), nonce);
}

/* "Constructs @p export_data for sharing a specific allocation from an already
 * shared memory pool." "The data is not a handle and may be shared through
 * any IPC mechanism." Any address in the allocation (the fake); the
 * importer gets the same offset in its mapping. Memory of a pool made with
 * hipMemHandleTypeNone, an imported pointer, not pool memory:
 * hipErrorInvalidValue. */
hipError_t hipMemPoolExportPointer(hipMemPoolPtrExportData *export_data,
                                   void *dev_ptr) {
  GATE();
  struct fk_pexport x = {0};
  uint64_t nonce = 0, pnonce = 0;
  if (!e && !export_data) e = FK_EINVAL;
  if (!e) e = fk_pool_export_ptr(&x, (uintptr_t)dev_ptr, &nonce, &pnonce);
  if (!e) memcpy(export_data, &x, sizeof x);
  RET("hipMemPoolExportPointer", e,
      "ptr=0x%llx off=%llu pool=%016" PRIx64 " alloc=%016" PRIx64,
      FK_P(dev_ptr), (unsigned long long)x.off, pnonce, nonce);
}

/* "Returns in @p dev_ptr a pointer to the imported memory. The imported memory
 * must not be accessed before the allocation operation completes in the
 * exporting process." (pending_us = how long until then). mem_pool: "Memory
 * pool from which to import a pointer" - the import of the data's pool
 * (another pool, the exporting process itself, data the exporter freed or
 * an exporter gone: hipErrorInvalidValue). The same data imported again in
 * a process: the same pointer, counted; each import is freed once (the
 * fake; the header is silent). */
hipError_t hipMemPoolImportPointer(void **dev_ptr, hipMemPool_t mem_pool,
                                   hipMemPoolPtrExportData *export_data) {
  GATE();
  struct fk_pexport x = {0};
  uintptr_t p = 0;
  unsigned long long pending = 0;
  if (export_data) memcpy(&x, export_data, sizeof x);
  if (!e && (!dev_ptr || !export_data)) e = FK_EINVAL;
  if (!e) e = fk_pool_import_ptr(&p, PH(mem_pool), &x, &pending);
  if (!e) *dev_ptr = (void *)p;
  RET("hipMemPoolImportPointer", e,
      "hpool=0x%016llx src=%d ptr=0x%llx pending_us=%llu pool=%016" PRIx64
      " alloc=%016" PRIx64,
      PH(mem_pool), (int)x.pid, FK_P(p), pending, x.pool, x.alloc);
}
