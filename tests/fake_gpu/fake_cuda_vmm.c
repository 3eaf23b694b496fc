/* fake_cuda_vmm.c - the CUDA virtual memory management entry points of the
 * fake libcuda.so.1, over fake_vmm.h. Not compiled alone: fake_cuda.c
 * #includes it (it uses gate(), the contexts and the error mapping there).
 * Each rule quotes the doc comment above the function in cuda.h (CUDA 13).
 *
 * None of these calls needs a current context (cuda.h lists no
 * CUDA_ERROR_INVALID_CONTEXT for them): they name devices in their
 * arguments. A mapping's CU_POINTER_ATTRIBUTE_CONTEXT is the context current
 * at cuMemMap, else the allocation's device's primary context.
 */

#define VH(h) ((unsigned long long)(h)) /* handles are logged as 0x%016llx */

_Static_assert(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == FK_VH_POSIX, "");

/* The CUmemAllocationProp checks cuMemCreate and
 * cuMemGetAllocationGranularity share. */
static int vmm_prop(const CUmemAllocationProp *prop) {
  if (!prop) return FK_EINVAL;
  /* the only type with a meaning for cuMemCreate: "This allocation type is
   * 'pinned', i.e. cannot migrate from its current location" */
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return FK_EINVAL;
  /* CU_MEM_LOCATION_TYPE_DEVICE: "Location is a device location, thus id is
   * a device ordinal" (HOST / HOST_NUMA locations are not faked) */
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return FK_EINVAL;
  if (prop->location.id < 0 || prop->location.id >= fk_devices())
    return FK_EBADDEV;
  /* win32HandleMetaData: "In all other cases, this field is required to be
   * zero." */
  if (prop->win32HandleMetaData) return FK_EINVAL;
  return FK_OK;
}

/* Other handle types exist, but not on Linux ("Permitted only on POSIX
 * systems" is the fd's; WIN32 / FABRIC are not faked): NOT_SUPPORTED. */
static int vmm_htype(unsigned t) {
  if (t == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return FK_OK;
  return t == CU_MEM_HANDLE_TYPE_WIN32 || t == CU_MEM_HANDLE_TYPE_WIN32_KMT ||
                 t == CU_MEM_HANDLE_TYPE_FABRIC
             ? FK_ENOTSUP
             : FK_EINVAL;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(
    size_t *granularity, const CUmemAllocationProp *prop,
    CUmemAllocationGranularity_flags option) {
  GATE(NEED_INIT);
  if (!e && (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                              option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))
    e = FK_EINVAL;
  if (!e) e = vmm_prop(prop);
  if (!e && !fk_vmm_on()) e = FK_ENOTSUP;
  /* "This granularity can be used as a multiple for alignment, size, or
   * address mapping." The fake answers the same for both options. */
  if (!e) *granularity = fk_vmm_gran();
  return fk_ret("cuMemGetAllocationGranularity", e, "option=%d size=%zu",
                (int)option, e ? 0 : *granularity);
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop,
                             unsigned long long flags) {
  GATE(NEED_INIT);
  uint64_t h = 0, nonce = 0;
  unsigned types = prop ? (unsigned)prop->requestedHandleTypes : 0;
  /* flags: "flags for future use, must be zero now." */
  if (!e && (!handle || flags)) e = FK_EINVAL;
  if (!e) e = vmm_prop(prop);
  if (!e && !fk_vmm_on()) e = FK_ENOTSUP;
  if (!e && types) e = vmm_htype(types);
  /* attribute 103: "Device supports exporting memory to a posix file
   * descriptor with ::cuMemExportToShareableHandle, if requested via
   * ::cuMemCreate" */
  if (!e && types && !fk_vmm_posix_on()) e = FK_ENOTSUP;
  /* "The size of this allocation must be a multiple of the the value given
   * via ::cuMemGetAllocationGranularity with the
   * ::CU_MEM_ALLOC_GRANULARITY_MINIMUM flag." */
  if (!e && (!size || size % fk_vmm_gran())) e = FK_EINVAL;
  /* "The created allocation will not have any device or host mappings." */
  if (!e) e = fk_vmm_create(&h, size, prop->location.id, types, &nonce);
  if (!e) *handle = h;
  return fk_ret("cuMemCreate", e,
                "size=%zu dev=%d types=%u h=0x%016llx alloc=%016" PRIx64, size,
                prop ? prop->location.id : -1, types, VH(h), nonce);
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  GATE(NEED_INIT);
  uint64_t nonce = 0;
  if (!e) e = fk_vmm_release(handle, &nonce);
  return fk_ret("cuMemRelease", e, "h=0x%016llx alloc=%016" PRIx64, VH(handle),
                nonce);
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size,
                                     size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
  GATE(NEED_INIT);
  uintptr_t p = 0;
  /* flags: "Currently unused, must be zero"; "the alignment must be a power
   * of two or zero for default alignment"; "The size and address parameters
   * must be a multiple of the host page size" (the fake: the size, of the
   * granularity). "when it is non-zero then the driver treats it as a hint
   * about where to place the reservation": the fake ignores the hint. */
  if (!e && (!ptr || !size || flags || (alignment & (alignment - 1)) ||
             addr % 4096 || size % fk_vmm_gran()))
    e = FK_EINVAL;
  if (!e && !fk_vmm_on()) e = FK_ENOTSUP;
  if (!e) e = fk_vmm_reserve(&p, size, alignment);
  if (!e) *ptr = p;
  return fk_ret("cuMemAddressReserve", e,
                "size=%zu align=%zu addr=0x%llx ptr=0x%llx", size, alignment,
                FK_P(addr), FK_P(p));
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  GATE(NEED_INIT);
  if (!e) e = fk_vmm_address_free(ptr, size);
  return fk_ret("cuMemAddressFree", e, "ptr=0x%llx size=%zu", FK_P(ptr), size);
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  GATE(NEED_INIT);
  size_t g = fk_vmm_gran();
  uint64_t nonce = 0;
  /* offset: "Note: currently must be zero."; flags: "flags for future use,
   * must be zero now."; "Both ptr, size, and offset must be a multiple of the
   * value given via ::cuMemGetAllocationGranularity with the
   * ::CU_MEM_ALLOC_GRANULARITY_MINIMUM flag." */
  if (!e && (offset || flags || !size || ptr % g || size % g)) e = FK_EINVAL;
  if (!e) e = fk_vmm_map(ptr, size, handle, dev, &nonce);
  return fk_ret("cuMemMap", e,
                "ptr=0x%llx size=%zu offset=%zu h=0x%016llx alloc=%016" PRIx64,
                FK_P(ptr), size, offset, VH(handle), nonce);
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  GATE(NEED_INIT);
  if (!e) e = fk_vmm_unmap(ptr, size);
  return fk_ret("cuMemUnmap", e, "ptr=0x%llx size=%zu", FK_P(ptr), size);
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                const CUmemAccessDesc *desc, size_t count) {
  GATE(NEED_INIT);
  int acc[FK_MAX_DEV];
  for (int d = 0; d < FK_MAX_DEV; d++) acc[d] = -1; /* unchanged */
  if (!e && (!desc || !count)) e = FK_EINVAL;
  for (size_t i = 0; !e && i < count; i++) {
    unsigned f = (unsigned)desc[i].flags;
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
      e = FK_EINVAL; /* only device locations are faked */
    else if (desc[i].location.id < 0 || desc[i].location.id >= fk_devices())
      e = FK_EBADDEV; /* "thus id is a device ordinal" */
    else if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
             f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
             f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      e = FK_EINVAL;
    else
      acc[desc[i].location.id] = (int)f;
  }
  if (!e) e = fk_vmm_set_access(ptr, size, acc);
  return fk_ret("cuMemSetAccess", e, "ptr=0x%llx size=%zu count=%zu flags=%d",
                FK_P(ptr), size, count,
                desc && count ? (int)desc[0].flags : -1);
}

CUresult CUDAAPI cuMemExportToShareableHandle(
    void *shareableHandle, CUmemGenericAllocationHandle handle,
    CUmemAllocationHandleType handleType, unsigned long long flags) {
  GATE(NEED_INIT);
  int fd = -1;
  uint64_t nonce = 0;
  /* flags: "Reserved, must be zero" */
  if (!e && (!shareableHandle || flags)) e = FK_EINVAL;
  if (!e) e = vmm_htype((unsigned)handleType);
  /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: "(int)": a new fd, the
   * caller's to close (O_CLOEXEC) */
  if (!e) e = fk_vmm_export_fd(&fd, handle, &nonce);
  if (!e) memcpy(shareableHandle, &fd, sizeof fd);
  return fk_ret("cuMemExportToShareableHandle", e,
                "h=0x%016llx type=%d fd=%d alloc=%016" PRIx64, VH(handle),
                (int)handleType, fd, nonce);
}

/* For a POSIX fd, osHandle is the fd itself: (void *)(uintptr_t)fd. */
CUresult CUDAAPI cuMemImportFromShareableHandle(
    CUmemGenericAllocationHandle *handle, void *osHandle,
    CUmemAllocationHandleType shHandleType) {
  GATE(NEED_INIT);
  uint64_t h = 0, nonce = 0;
  size_t size = 0;
  int fd = (int)(intptr_t)osHandle;
  if (!e && !handle) e = FK_EINVAL;
  if (!e) e = vmm_htype((unsigned)shHandleType);
  if (!e && !fk_vmm_on()) e = FK_ENOTSUP;
  if (!e) e = fk_vmm_import_fd(&h, fd, &nonce, &size);
  if (!e) *handle = h;
  return fk_ret("cuMemImportFromShareableHandle", e,
                "fd=%d type=%d h=0x%016llx size=%zu alloc=%016" PRIx64, fd,
                (int)shHandleType, VH(h), size, nonce);
}

CUresult CUDAAPI
cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
  GATE(NEED_INIT);
  uint64_t h = 0;
  /* "The address addr, can be any address in a range previously mapped by
   * ::cuMemMap, and not necessarily the start address." */
  if (!e && !handle) e = FK_EINVAL;
  if (!e) e = fk_vmm_retain(&h, (uintptr_t)addr);
  if (!e) *handle = h;
  return fk_ret("cuMemRetainAllocationHandle", e, "ptr=0x%llx h=0x%016llx",
                FK_P(addr), VH(h));
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle) {
  GATE(NEED_INIT);
  int d = -1;
  unsigned types = 0;
  if (!e && !prop) e = FK_EINVAL;
  if (!e) e = fk_vmm_props(handle, &d, &types);
  if (!e) {
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = d;
    prop->requestedHandleTypes = (CUmemAllocationHandleType)types;
  }
  return fk_ret("cuMemGetAllocationPropertiesFromHandle", e,
                "h=0x%016llx dev=%d types=%u", VH(handle), d, types);
}

/* ---- context synchronisation --------------------------------------------- */

/* "Blocks until the current context has completed all preceding requested
 * tasks.": every stream of its device, as cuStreamSynchronize waits for one */
CUresult CUDAAPI cuCtxSynchronize(void) {
  GATE(NEED_CTX);
  unsigned long long us = 0;
  if (!e) e = fk_device_sync(dev, &us);
  return fk_ret("cuCtxSynchronize", e, "dev=%d waited_us=%llu", dev, us);
}

/* CUDA 13 (PFN_cuCtxSynchronize_v13000): "If the specified context is NULL,
 * the API will operate on the current context." */
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  GATE(NEED_INIT);
  unsigned long long us = 0;
  int d = -1;
  for (int i = 0; i < FK_MAX_DEV; i++)
    if (ctx == &ctxs[i] && ctxs[i].alive) d = i;
  if (!ctx) d = dev;
  if (!e && d < 0) e = FK_ECTX;
  if (!e) e = fk_device_sync(d, &us);
  return fk_ret("cuCtxSynchronize_v2", e, "ctx=0x%llx dev=%d waited_us=%llu",
                FK_P(ctx), d, us);
}
