/* fake_hip_vmm.c - the HIP virtual memory management entry points of the
 * fake libamdhip64.so.5, over fake_vmm.h (the engine the CUDA skin,
 * fake_cuda_vmm.c, uses too). Not compiled alone: fake_hip.c #includes it
 * (it uses gate() and the error mapping there). Each rule quotes the doc
 * comment above the function in the HIP 5.2 <hip/hip_runtime_api.h>; that
 * header is terse (every one of these calls "@returns #hipSuccess,
 * #hipErrorInvalidValue, #hipErrorNotSupported"), so where it is silent the
 * fake does what the CUDA fake does for the same call (cuda.h's rule, quoted
 * in fake_vmm.h / fake_cuda_vmm.c), and says so.
 *
 * Exported at version node hip_5.1, as the real libamdhip64.so.5.2.21153
 * (objdump -T) exports them.
 *
 * HIP 5.2 has no device attribute for VMM support: FAKE_HIP_VMM=0 makes
 * hipMemCreate, hipMemAddressReserve, hipMemImportFromShareableHandle and
 * hipMemGetAllocationGranularity fail hipErrorNotSupported (as a ROCm build
 * without VMM support does); by default VMM is supported.
 *
 * Granularity (AMD: 4 KiB pages, 2 MiB recommended):
 * hipMemAllocationGranularityMinimum answers 4096 (FK_VMM_GRAN_MIN),
 * ...Recommended FAKE_HIP_GRANULARITY (default 2097152). Sizes, addresses
 * and offsets must be multiples of the minimum: hipMemCreate(6912) fails,
 * hipMemCreate(8192) works. Reservations are aligned to the recommended one.
 *
 * Handles (hipMemGenericAllocationHandle_t, a pointer type) carry the
 * engine's 0xfa4e... values; they are not addresses. The log shows them as
 * h=0x<16 hex>, and create / release / map / export / import lines end with
 * alloc=<the allocation's nonce>, the same in every process.
 */

#define VH(h) ((unsigned long long)(uintptr_t)(h)) /* logged as 0x%016llx */
#define HH(h) ((hipMemGenericAllocationHandle_t)(uintptr_t)(h))

_Static_assert(hipMemHandleTypePosixFileDescriptor == FK_VH_POSIX, "");
_Static_assert(hipMemAccessFlagsProtRead == 1 &&
                   hipMemAccessFlagsProtReadWrite == 3,
               "access bits as fk_bytes reads them");

/* The hipMemAllocationProp checks hipMemCreate and
 * hipMemGetAllocationGranularity share. */
static int hvmm_prop(const hipMemAllocationProp *prop) {
  if (!prop) return FK_EINVAL;
  /* hipMemAllocationTypePinned: "This allocation type is 'pinned', i.e.
   * cannot migrate from its current location while the application is
   * actively using it" (the only type but Invalid) */
  if (prop->type != hipMemAllocationTypePinned) return FK_EINVAL;
  /* hipMemLocationTypeDevice: "Device location, thus it's HIP device ID" */
  if (prop->location.type != hipMemLocationTypeDevice) return FK_EINVAL;
  /* Not in the header's list of returns; hip-tests (HIP_VERSION >= 5.2)
   * expect hipErrorInvalidDevice for an id of -1 or the device count. */
  if (prop->location.id < 0 || prop->location.id >= fk_devices())
    return FK_EBADDEV;
  return FK_OK;
}

/* hipMemHandleTypePosixFileDescriptor: "Allows a file descriptor for
 * exporting. Permitted only on POSIX systems"; the Win32 types are not for
 * Linux: not supported; anything else: invalid value. */
static int hvmm_htype(unsigned t) {
  if (t == hipMemHandleTypePosixFileDescriptor) return FK_OK;
  return t == hipMemHandleTypeWin32 || t == hipMemHandleTypeWin32Kmt
             ? FK_ENOTSUP
             : FK_EINVAL;
}

/* "@brief Calculates either the minimal or recommended granularity." */
hipError_t
hipMemGetAllocationGranularity(size_t *granularity,
                               const hipMemAllocationProp *prop,
                               hipMemAllocationGranularity_flags option) {
  GATE();
  size_t g = 0;
  if (!e &&
      (!granularity || (option != hipMemAllocationGranularityMinimum &&
                        option != hipMemAllocationGranularityRecommended)))
    e = FK_EINVAL;
  if (!e) e = hvmm_prop(prop);
  if (!e && !fk_vmm_on()) e = FK_ENOTSUP;
  /* hipMemAllocationGranularityMinimum "Minimum granularity",
   * ...Recommended "Recommended granularity for performance" */
  if (!e) {
    g = option == hipMemAllocationGranularityMinimum ? fk_vmm_gran_min()
                                                     : fk_vmm_gran();
    *granularity = g;
  }
  RET("hipMemGetAllocationGranularity", e, "option=%d size=%zu", (int)option,
      g);
}

/* "@brief Creates a memory allocation described by the properties and
 * size" */
hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size,
                        const hipMemAllocationProp *prop,
                        unsigned long long flags) {
  GATE();
  uint64_t h = 0, nonce = 0;
  unsigned types = prop ? (unsigned)prop->requestedHandleType : 0;
  /* flags: "currently unused, must be zero." */
  if (!e && (!handle || flags)) e = FK_EINVAL;
  if (!e) e = hvmm_prop(prop);
  if (!e && !fk_vmm_on()) e = FK_ENOTSUP;
  /* hipMemHandleTypeNone: "Does not allow any export mechanism" */
  if (!e && types) e = hvmm_htype(types);
  if (!e && types && !fk_vmm_posix_on()) e = FK_ENOTSUP; /* POSIX_FD=0 */
  /* The header is silent on the size; cuda.h: "a multiple of the the value
   * given via ::cuMemGetAllocationGranularity with the
   * ::CU_MEM_ALLOC_GRANULARITY_MINIMUM flag" (here 4096; hip-tests: a size
   * that is not a multiple -> hipErrorInvalidValue) */
  if (!e && (!size || size % fk_vmm_gran_min())) e = FK_EINVAL;
  if (!e) e = fk_vmm_create(&h, size, prop->location.id, types, &nonce);
  if (!e) *handle = HH(h);
  RET("hipMemCreate", e,
      "size=%zu dev=%d types=%u h=0x%016llx alloc=%016" PRIx64, size,
      prop ? prop->location.id : -1, types, VH(h), nonce);
}

/* "@brief Release a memory handle representing a memory allocation which
 * was previously allocated through hipMemCreate." (the memory itself stays
 * while it is mapped, as in CUDA) */
hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle) {
  GATE();
  uint64_t nonce = 0;
  if (!e) e = fk_vmm_release(VH(handle), &nonce);
  RET("hipMemRelease", e, "h=0x%016llx alloc=%016" PRIx64, VH(handle), nonce);
}

/* "@brief Reserves an address range" */
hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment,
                                void *addr, unsigned long long flags) {
  GATE();
  uintptr_t p = 0;
  /* flags: "currently unused, must be zero."; alignment: "alignment of the
   * address." (the fake: a power of two, or 0 for the default); addr:
   * "requested starting address of the range." (the fake, as CUDA's "hint":
   * ignored, but a multiple of 4096). The size: silent; the fake wants a
   * multiple of the minimum granularity, as hipMemMap does. */
  if (!e && (!ptr || !size || flags || (alignment & (alignment - 1)) ||
             (uintptr_t)addr % 4096 || size % fk_vmm_gran_min()))
    e = FK_EINVAL;
  if (!e && !fk_vmm_on()) e = FK_ENOTSUP;
  if (!e) e = fk_vmm_reserve(&p, size, alignment);
  if (!e) *ptr = (void *)p;
  RET("hipMemAddressReserve", e, "size=%zu align=%zu addr=0x%llx ptr=0x%llx",
      size, alignment, FK_P(addr), FK_P(p));
}

/* "@brief Frees an address range reservation made via hipMemAddressReserve"
 * (devPtr: "starting address of the range.", size: "size of the range.":
 * exactly a reservation; one still mapped is refused) */
hipError_t hipMemAddressFree(void *devPtr, size_t size) {
  GATE();
  if (!e) e = fk_vmm_address_free((uintptr_t)devPtr, size);
  RET("hipMemAddressFree", e, "ptr=0x%llx size=%zu", FK_P(devPtr), size);
}

/* "@brief Maps an allocation handle to a reserved virtual address range." */
hipError_t hipMemMap(void *ptr, size_t size, size_t offset,
                     hipMemGenericAllocationHandle_t handle,
                     unsigned long long flags) {
  GATE();
  size_t g = fk_vmm_gran_min();
  uint64_t nonce = 0;
  /* offset: "offset into the memory, currently must be zero."; flags:
   * "currently unused, must be zero."; ptr and size: silent, multiples of
   * the minimum granularity as in CUDA. No further than the allocation, in
   * a reservation, not over a mapping, and no access yet: fk_vmm_map. */
  if (!e && (offset || flags || !size || (uintptr_t)ptr % g || size % g))
    e = FK_EINVAL;
  if (!e) e = fk_vmm_map((uintptr_t)ptr, size, VH(handle), dev, &nonce);
  RET("hipMemMap", e,
      "ptr=0x%llx size=%zu offset=%zu h=0x%016llx alloc=%016" PRIx64, FK_P(ptr),
      size, offset, VH(handle), nonce);
}

/* "@brief Unmap memory allocation of a given address range." (the fake, as
 * CUDA: whole mappings only) */
hipError_t hipMemUnmap(void *ptr, size_t size) {
  GATE();
  if (!e) e = fk_vmm_unmap((uintptr_t)ptr, size);
  RET("hipMemUnmap", e, "ptr=0x%llx size=%zu", FK_P(ptr), size);
}

/* "@brief Set the access flags for each location specified in desc for the
 * given virtual address range." */
hipError_t hipMemSetAccess(void *ptr, size_t size, const hipMemAccessDesc *desc,
                           size_t count) {
  GATE();
  int acc[FK_MAX_DEV];
  for (int d = 0; d < FK_MAX_DEV; d++) acc[d] = -1; /* unchanged */
  if (!e && (!desc || !count)) e = FK_EINVAL;
  for (size_t i = 0; !e && i < count; i++) {
    unsigned f = (unsigned)desc[i].flags;
    /* location: "Location on which the accessibility has to change"; only
     * hipMemLocationTypeDevice exists. A device id out of range: invalid
     * value here (the header's list; hip-tests for 5.2 expect it too). */
    if (desc[i].location.type != hipMemLocationTypeDevice ||
        desc[i].location.id < 0 || desc[i].location.id >= fk_devices())
      e = FK_EINVAL;
    else if (f != hipMemAccessFlagsProtNone && f != hipMemAccessFlagsProtRead &&
             f != hipMemAccessFlagsProtReadWrite)
      e = FK_EINVAL;
    else
      acc[desc[i].location.id] = (int)f;
  }
  if (!e) e = fk_vmm_set_access((uintptr_t)ptr, size, acc);
  RET("hipMemSetAccess", e, "ptr=0x%llx size=%zu count=%zu flags=%d", FK_P(ptr),
      size, count, desc && count ? (int)desc[0].flags : -1);
}

/* "@brief Get the access flags set for the given location and ptr." */
hipError_t hipMemGetAccess(unsigned long long *flags,
                           const hipMemLocation *location, void *ptr) {
  GATE();
  int acc = 0;
  if (!e &&
      (!flags || !location || location->type != hipMemLocationTypeDevice ||
       location->id < 0 || location->id >= fk_devices()))
    e = FK_EINVAL;
  if (!e) e = fk_vmm_get_access((uintptr_t)ptr, location->id, &acc);
  if (!e) *flags = (unsigned long long)acc;
  RET("hipMemGetAccess", e, "ptr=0x%llx dev=%d flags=%d", FK_P(ptr),
      location ? location->id : -1, acc);
}

/* "@brief Exports an allocation to a requested shareable handle type." */
hipError_t hipMemExportToShareableHandle(void *shareableHandle,
                                         hipMemGenericAllocationHandle_t handle,
                                         hipMemAllocationHandleType handleType,
                                         unsigned long long flags) {
  GATE();
  int fd = -1;
  uint64_t nonce = 0;
  /* flags: "currently unused, must be zero." */
  if (!e && (!shareableHandle || flags)) e = FK_EINVAL;
  if (!e) e = hvmm_htype((unsigned)handleType);
  /* Only an allocation created with requestedHandleType
   * hipMemHandleTypePosixFileDescriptor (hipMemHandleTypeNone: "Does not
   * allow any export mechanism"): else invalid value. The fd is written as
   * an int at shareableHandle (as CUDA), a new fd (O_CLOEXEC), the
   * caller's to close. */
  if (!e) e = fk_vmm_export_fd(&fd, VH(handle), &nonce);
  if (!e) memcpy(shareableHandle, &fd, sizeof fd);
  RET("hipMemExportToShareableHandle", e,
      "h=0x%016llx type=%d fd=%d alloc=%016" PRIx64, VH(handle),
      (int)handleType, fd, nonce);
}

/* "@brief Imports an allocation from a requested shareable handle type."
 * osHandle: "shareable handle representing the memory allocation." - for a
 * POSIX fd, the fd itself: (void *)(uintptr_t)fd, as hip-tests pass it.
 * What is not a fake VMM allocation's fd (a pipe, another memfd, a closed
 * fd): invalid value. In the exporting process too: a new handle. */
hipError_t
hipMemImportFromShareableHandle(hipMemGenericAllocationHandle_t *handle,
                                void *osHandle,
                                hipMemAllocationHandleType shHandleType) {
  GATE();
  uint64_t h = 0, nonce = 0;
  size_t size = 0;
  int fd = (int)(intptr_t)osHandle;
  if (!e && !handle) e = FK_EINVAL;
  if (!e) e = hvmm_htype((unsigned)shHandleType);
  if (!e && !fk_vmm_on()) e = FK_ENOTSUP;
  if (!e) e = fk_vmm_import_fd(&h, fd, &nonce, &size);
  if (!e) *handle = HH(h);
  RET("hipMemImportFromShareableHandle", e,
      "fd=%d type=%d h=0x%016llx size=%zu alloc=%016" PRIx64, fd,
      (int)shHandleType, VH(h), size, nonce);
}

/* "@brief Returns the allocation handle of the backing memory allocation
 * given the address." addr: "address to look up." - any address inside a
 * mapping; the handle that was mapped there, one more reference to release
 * with hipMemRelease (as CUDA). */
hipError_t hipMemRetainAllocationHandle(hipMemGenericAllocationHandle_t *handle,
                                        void *addr) {
  GATE();
  uint64_t h = 0;
  if (!e && !handle) e = FK_EINVAL;
  if (!e) e = fk_vmm_retain(&h, (uintptr_t)addr);
  if (!e) *handle = HH(h);
  RET("hipMemRetainAllocationHandle", e, "ptr=0x%llx h=0x%016llx", FK_P(addr),
      VH(h));
}

/* "@brief Retrieve the property structure of the given handle." */
hipError_t hipMemGetAllocationPropertiesFromHandle(
    hipMemAllocationProp *prop, hipMemGenericAllocationHandle_t handle) {
  GATE();
  int d = -1;
  unsigned types = 0;
  if (!e && !prop) e = FK_EINVAL;
  if (!e) e = fk_vmm_props(VH(handle), &d, &types);
  if (!e) {
    memset(prop, 0, sizeof *prop);
    prop->type = hipMemAllocationTypePinned;
    prop->location.type = hipMemLocationTypeDevice;
    prop->location.id = d;
    prop->requestedHandleType = (hipMemAllocationHandleType)types;
  }
  RET("hipMemGetAllocationPropertiesFromHandle", e,
      "h=0x%016llx dev=%d types=%u", VH(handle), d, types);
}
