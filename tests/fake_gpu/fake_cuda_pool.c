/* fake_cuda_pool.c - the CUDA stream-ordered memory pool entry points of the
 * fake libcuda.so.1, over fake_pool.h. Not compiled alone: fake_cuda.c
 * #includes it (it uses gate(), the contexts and the error mapping there).
 * Each rule quotes the doc comment above the function in cuda.h (CUDA 13);
 * where cuda.h is silent the choice is marked "(the fake)".
 *
 * None of these calls needs a current context (pool memory "is not
 * associated with any CUDA context"), except that naming the default stream
 * without one gives "::CUDA_ERROR_INVALID_CONTEXT (default stream specified
 * with no current context)". An unknown stream: CUDA_ERROR_INVALID_VALUE
 * (the fake; cuda.h lists no INVALID_HANDLE for these calls).
 *
 * Log keys: pool=<pool nonce, 16 hex> (the same in the exporter and every
 * importer), hpool=<this process's handle>, alloc=<allocation nonce> for
 * pointers; ready_in_us / done_in_us = how long until the stream reaches the
 * allocation / the free; imported_elsewhere=N on the exporter's free =
 * importing processes whose release had not completed (a violation when >
 * 0); pending_us on cuMemPoolImportPointer and on copies and memsets that
 * touch pool memory = how long until its allocation completes (> 0: touched
 * too early).
 */

#define PH(h)                                                                  \
  ((unsigned long long)(uintptr_t)(h)) /* pool handles: 0x%016llx              \
                                        */

_Static_assert(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == FK_POOL_POSIX, "");
_Static_assert(sizeof(CUmemPoolPtrExportData) == sizeof(struct fk_pexport), "");
_Static_assert((int)CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE == 17, "");

/* CUmemPoolProps checks; *dev = the location's device. */
static int pool_props(const CUmemPoolProps *pp) {
  if (!pp) return FK_EINVAL;
  /* allocType: "Currently must be specified as CU_MEM_ALLOCATION_TYPE_PINNED"
   */
  if (pp->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) return FK_EINVAL;
  /* "Specifying ::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT as the
   * ::CUmemPoolProps::CUmemLocation::type will result in
   * ::CUDA_ERROR_INVALID_VALUE." HOST / HOST_NUMA pools are not faked
   * (the fake: NOT_SUPPORTED). */
  if (pp->location.type == CU_MEM_LOCATION_TYPE_HOST ||
      pp->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
    return FK_ENOTSUP;
  if (pp->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return FK_EINVAL;
  /* a device ordinal; cuda.h lists no INVALID_DEVICE here: INVALID_VALUE */
  if (pp->location.id < 0 || pp->location.id >= fk_devices()) return FK_EINVAL;
  /* win32SecurityAttributes: "In all other cases, this field is required to
   * be zero."; reserved: "reserved for future use, must be 0" */
  if (pp->win32SecurityAttributes) return FK_EINVAL;
  for (size_t i = 0; i < sizeof pp->reserved; i++)
    if (pp->reserved[i]) return FK_EINVAL;
  if (pp->usage & ~(unsigned)CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS)
    return FK_EINVAL;
  /* "Specifying CU_MEM_HANDLE_TYPE_NONE creates a memory pool that will not
   * support IPC." POSIX fds are faked; WIN32, WIN32_KMT and FABRIC are not
   * (NOT_SUPPORTED); other bits are not handle types (INVALID_VALUE). */
  unsigned t = (unsigned)pp->handleTypes;
  if (t & ~0xfu) return FK_EINVAL;
  if (t & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return FK_ENOTSUP;
  return FK_OK;
}

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool,
                                 const CUmemPoolProps *poolProps) {
  GATE(NEED_INIT);
  uint64_t h = 0, nonce = 0;
  unsigned types = poolProps ? (unsigned)poolProps->handleTypes : 0;
  if (!e && !pool) e = FK_EINVAL;
  if (!e) e = pool_props(poolProps);
  /* attribute 115: "Device supports using the ::cuMemAllocAsync and
   * ::cuMemPool family of APIs"; FAKE_CUDA_POOLS=0: it does not */
  if (!e && !fk_pools_on()) e = FK_ENOTSUP;
  /* attribute 119: "Handle types supported with mempool based IPC" */
  if (!e && (types & ~fk_pool_htypes_supported())) e = FK_ENOTSUP;
  /* maxSize: "When set to 0, defaults to a system dependent value." (the
   * fake: no limit but MEM_LIMIT) */
  if (!e)
    e = fk_pool_create(&h, &nonce, poolProps->location.id, types,
                       poolProps->maxSize);
  if (!e) *pool = (CUmemoryPool)(uintptr_t)h;
  return fk_ret("cuMemPoolCreate", e,
                "dev=%d types=%u max=%zu hpool=0x%016llx pool=%016" PRIx64,
                poolProps ? poolProps->location.id : -1, types,
                poolProps ? poolProps->maxSize : 0, PH(h), nonce);
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  GATE(NEED_INIT);
  uint64_t nonce = 0;
  int outstanding = 0;
  /* "If any pointers obtained from this pool haven't been freed ... the
   * function will return immediately and the resources associated with the
   * pool will be released automatically once there are no more outstanding
   * allocations." The handle is invalid at once (the fake: INVALID_VALUE for
   * a second destroy); the pointers stay usable until freed. */
  if (!e) e = fk_pool_destroy(PH(pool), &nonce, &outstanding);
  return fk_ret("cuMemPoolDestroy", e,
                "hpool=0x%016llx outstanding=%d pool=%016" PRIx64, PH(pool),
                outstanding, nonce);
}

static CUresult alloc_from_pool(const char *call, CUdeviceptr *dptr,
                                size_t bytesize, CUmemoryPool pool,
                                CUstream hStream) {
  GATE(NEED_INIT);
  uintptr_t p = 0;
  uint64_t nonce = 0, pnonce = 0;
  unsigned long long ready_us = 0;
  /* size 0: the fake answers INVALID_VALUE, as cuMemAlloc does */
  if (!e && (!dptr || !bytesize)) e = FK_EINVAL;
  /* "Imported memory pools do not support creating new allocations. As such
   * imported memory pools may not be used in cuDeviceSetMemPool or
   * ::cuMemAllocFromPoolAsync calls." (the fake: NOT_SUPPORTED) "The
   * allocation must not be accessed until the the allocation operation
   * completes." (see pending_us) */
  if (!e)
    e = fk_pool_alloc(&p, bytesize, PH(pool), hStream, dev, &nonce, &pnonce,
                      &ready_us);
  if (!e) *dptr = p;
  return fk_ret(call, e,
                "size=%zu hpool=0x%016llx stream=0x%llx ptr=0x%llx "
                "ready_in_us=%llu pool=%016" PRIx64 " alloc=%016" PRIx64,
                bytesize, PH(pool), FK_P(hStream), FK_P(p), ready_us, pnonce,
                nonce);
}
CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                         CUmemoryPool pool, CUstream hStream) {
  return alloc_from_pool("cuMemAllocFromPoolAsync", dptr, bytesize, pool,
                         hStream);
}
/* The per-thread default stream variant: the fake's default stream is one
 * per device either way. */
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr,
                                              size_t bytesize,
                                              CUmemoryPool pool,
                                              CUstream hStream) {
  return alloc_from_pool("cuMemAllocFromPoolAsync_ptsz", dptr, bytesize, pool,
                         hStream);
}

/* cuMemFree_v2 (fake_cuda.c) of pool memory comes here with now_ = 1: "This
 * API will not perform any implict synchronization when the pointer was
 * allocated with ::cuMemAllocAsync or ::cuMemAllocFromPoolAsync." */
static CUresult free_pool(const char *call, CUdeviceptr dptr, int now_,
                          CUstream hStream) {
  GATE(NEED_INIT);
  uint64_t nonce = 0, pnonce = 0;
  unsigned long long done_us = 0;
  int elsewhere = 0;
  /* the fake: memory not from a pool, or not the pointer allocated or
   * imported, is INVALID_VALUE */
  if (!e)
    e = fk_pool_free(dptr, now_, hStream, dev, &nonce, &pnonce, &done_us,
                     &elsewhere);
  if (now_)
    return fk_ret(call, e,
                  "ptr=0x%llx imported_elsewhere=%d pool=%016" PRIx64
                  " alloc=%016" PRIx64,
                  FK_P(dptr), elsewhere, pnonce, nonce);
  return fk_ret(call, e,
                "ptr=0x%llx stream=0x%llx done_in_us=%llu "
                "imported_elsewhere=%d pool=%016" PRIx64 " alloc=%016" PRIx64,
                FK_P(dptr), FK_P(hStream), done_us, elsewhere, pnonce, nonce);
}
/* "Inserts a free operation into hStream." For an import: "If cuMemFreeAsync
 * is used, the free must be completed on the importing process before the
 * free operation on the exporting process." */
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return free_pool("cuMemFreeAsync", dptr, 0, hStream);
}
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return free_pool("cuMemFreeAsync_ptsz", dptr, 0, hStream);
}

/* A CUmemAccessDesc array -> acc[device] (see fk_pool_set_access). */
static int pool_access_descs(const CUmemAccessDesc *map, size_t count,
                             int *acc) {
  for (int d = 0; d < FK_MAX_DEV; d++) acc[d] = -1;
  if (!map || !count) return FK_EINVAL;
  for (size_t i = 0; i < count; i++) {
    unsigned f = (unsigned)map[i].flags;
    /* "Each descriptor instructs the access to enable for a single gpu.";
     * cuda.h lists only INVALID_VALUE for a bad one */
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        map[i].location.id < 0 || map[i].location.id >= fk_devices() ||
        (f != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
         f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
         f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
      return FK_EINVAL;
    acc[map[i].location.id] = (int)f;
  }
  return FK_OK;
}

/* An imported pool starts with no access from any device (the fake; cuda.h
 * is silent): the importer sets it here before it touches an imported
 * pointer. Copies and memsets check it (fk_bytes). */
CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool,
                                    const CUmemAccessDesc *map, size_t count) {
  GATE(NEED_INIT);
  int acc[FK_MAX_DEV];
  uint64_t nonce = 0;
  if (!e) e = pool_access_descs(map, count, acc);
  if (!e) e = fk_pool_set_access(PH(pool), acc, &nonce);
  return fk_ret("cuMemPoolSetAccess", e,
                "hpool=0x%016llx count=%zu dev=%d flags=%d pool=%016" PRIx64,
                PH(pool), count, map && count ? map[0].location.id : -1,
                map && count ? (int)map[0].flags : -1, nonce);
}

/* "Returns the accessibility of the pool's memory from the specified
 * location." */
CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags *flags,
                                    CUmemoryPool memPool,
                                    CUmemLocation *location) {
  GATE(NEED_INIT);
  int acc = 0;
  uint64_t nonce = 0;
  if (!e &&
      (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
       location->id < 0 || location->id >= fk_devices()))
    e = FK_EINVAL;
  if (!e) e = fk_pool_get_access(PH(memPool), location->id, &acc, &nonce);
  if (!e) *flags = (CUmemAccess_flags)acc;
  return fk_ret("cuMemPoolGetAccess", e,
                "hpool=0x%016llx dev=%d flags=%d pool=%016" PRIx64, PH(memPool),
                location ? location->id : -1, acc, nonce);
}

/* ---- sharing ------------------------------------------------------------- */

CUresult CUDAAPI cuMemPoolExportToShareableHandle(
    void *handle_out, CUmemoryPool pool, CUmemAllocationHandleType handleType,
    unsigned long long flags) {
  GATE(NEED_INIT);
  int fd = -1;
  uint64_t nonce = 0;
  /* flags: "must be 0"; cuda.h lists INVALID_VALUE (not NOT_SUPPORTED) for
   * any other failure, e.g. a handle type the pool was not created with:
   * "Given an IPC capable mempool" */
  if (!e && (!handle_out || flags ||
             handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    e = FK_EINVAL;
  /* "(int)": a new fd (O_CLOEXEC), the caller's to close */
  if (!e) e = fk_pool_export_fd(&fd, PH(pool), &nonce);
  if (!e) memcpy(handle_out, &fd, sizeof fd);
  return fk_ret("cuMemPoolExportToShareableHandle", e,
                "hpool=0x%016llx type=%d fd=%d pool=%016" PRIx64, PH(pool),
                (int)handleType, fd, nonce);
}

/* For a POSIX fd, handle is the fd itself: (void *)(uintptr_t)fd. The caller
 * may close it afterwards (the fake keeps nothing open). */
CUresult CUDAAPI cuMemPoolImportFromShareableHandle(
    CUmemoryPool *pool_out, void *handle, CUmemAllocationHandleType handleType,
    unsigned long long flags) {
  GATE(NEED_INIT);
  uint64_t h = 0, nonce = 0;
  int fd = (int)(intptr_t)handle, d = -1;
  /* flags: "must be 0" */
  if (!e && (!pool_out || flags ||
             handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    e = FK_EINVAL;
  if (!e) e = fk_pool_import_fd(&h, fd, &nonce, &d);
  if (!e) *pool_out = (CUmemoryPool)(uintptr_t)h;
  return fk_ret("cuMemPoolImportFromShareableHandle", e,
                "fd=%d type=%d dev=%d hpool=0x%016llx pool=%016" PRIx64, fd,
                (int)handleType, d, PH(h), nonce);
}

/* "Constructs shareData_out for sharing a specific allocation from an
 * already shared memory pool." Any address in the allocation (the fake);
 * the importer gets the same offset in its mapping. Not an imported pointer
 * (the fake: INVALID_VALUE). */
CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out,
                                        CUdeviceptr ptr) {
  GATE(NEED_INIT);
  struct fk_pexport x = {0};
  uint64_t nonce = 0, pnonce = 0;
  if (!e && !shareData_out) e = FK_EINVAL;
  if (!e) e = fk_pool_export_ptr(&x, ptr, &nonce, &pnonce);
  if (!e) memcpy(shareData_out, &x, sizeof x);
  return fk_ret("cuMemPoolExportPointer", e,
                "ptr=0x%llx off=%llu pool=%016" PRIx64 " alloc=%016" PRIx64,
                FK_P(ptr), (unsigned long long)x.off, pnonce, nonce);
}

/* "The imported memory must not be accessed before the allocation operation
 * completes in the exporting process." (pending_us = how long until then).
 * The same data imported again in a process: the same pointer, counted;
 * each import is freed once (the fake; cuda.h is silent). */
CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                        CUmemPoolPtrExportData *shareData) {
  GATE(NEED_INIT);
  struct fk_pexport x = {0};
  uintptr_t p = 0;
  unsigned long long pending = 0;
  if (shareData) memcpy(&x, shareData, sizeof x);
  if (!e && (!ptr_out || !shareData)) e = FK_EINVAL;
  if (!e) e = fk_pool_import_ptr(&p, PH(pool), &x, &pending);
  if (!e) *ptr_out = p;
  return fk_ret("cuMemPoolImportPointer", e,
                "hpool=0x%016llx src=%d ptr=0x%llx pending_us=%llu "
                "pool=%016" PRIx64 " alloc=%016" PRIx64,
                PH(pool), (int)x.pid, FK_P(p), pending, x.pool, x.alloc);
}
