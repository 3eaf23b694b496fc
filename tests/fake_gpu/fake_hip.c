/* fake_hip.c - a fake libamdhip64.so.5 (HIP 5.2) for ipcref's tests: the HIP
 * runtime entry points ipcref_hip.h uses, over fake_core.h (host shared
 * memory). Built against the real <hip/hip_runtime_api.h>
 * (-D__HIP_PLATFORM_AMD__), so prototypes match; exported with the real
 * library's ELF symbol versions (fake_hip.map: hip_4.2, hipPointerGetAttribute
 * @hip_5.0, the VMM and memory pool calls @hip_5.1).
 *
 * HIP has no current-context rule: calls use the thread's device
 * (hipSetDevice, default 0) and initialise implicitly.
 *
 * HIP-only knob (besides those in fake_core.h):
 *   FAKE_HIP_IPC_EVENTS=1  let hipEventCreateWithFlags accept
 *                          hipEventInterprocess (as ROCm >= 6 does); by
 *                          default it fails as the 5.2 header says.
 *   FAKE_HIP_VMM, FAKE_HIP_POSIX_FD, FAKE_HIP_GRANULARITY  the virtual memory
 *                          management calls (hipMemCreate & co.): see
 *                          fake_vmm.h; the entry points are in
 *                          fake_hip_vmm.c
 *   FAKE_HIP_POOLS         the stream-ordered memory pool calls
 *                          (hipMemPoolCreate, hipMallocFromPoolAsync,
 *                          hipFreeAsync, pool and pointer export/import):
 *                          see fake_pool.h; the entry points are in
 *                          fake_hip_pool.c (hipMemPool*, hipMallocFromPoolAsync
 *                          and hipFreeAsync at version node hip_5.1)
 */
#define _GNU_SOURCE
#include <hip/hip_runtime_api.h>

#define FK_PREFIX "FAKE_HIP_"
#define FK_MAGIC  0x50484b46u /* "FKHP" */
#include "fake_core.h"
#define FK_VMM_GRAN_MIN 4096 /* AMD: 4 KiB minimum, 2 MiB recommended */
#include "fake_vmm.h"
#include "fake_pool.h"

_Static_assert(sizeof(hipIpcMemHandle_t) == sizeof(struct fk_handle),
               "handle size");
_Static_assert(sizeof(hipIpcEventHandle_t) == sizeof(struct fk_handle),
               "handle size");
_Static_assert(hipEventDisableTiming == FK_EV_DISABLE_TIMING &&
                   hipEventInterprocess == FK_EV_INTERPROCESS,
               "");
_Static_assert(hipStreamNonBlocking == FK_STREAM_NON_BLOCKING, "");
_Static_assert((int)HIP_POINTER_ATTRIBUTE_IS_LEGACY_HIP_IPC_CAPABLE ==
                       FK_PA_IS_LEGACY_IPC_CAPABLE &&
                   (int)HIP_POINTER_ATTRIBUTE_MAPPED == FK_PA_MAPPED &&
                   (int)HIP_POINTER_ATTRIBUTE_BUFFER_ID == FK_PA_BUFFER_ID,
               "");

/* Measured on the real libamdhip64.so.5.2.21153: hipRuntimeGetVersion and
 * hipDriverGetVersion both give 50221153. */
#define HIP_VERSION_5_2 50221153

static const struct {
  hipError_t code;
  const char *name;
} errs[] = {
    {hipSuccess, "hipSuccess"},
    {hipErrorInvalidValue, "hipErrorInvalidValue"},
    {hipErrorOutOfMemory, "hipErrorOutOfMemory"},
    {hipErrorNotInitialized, "hipErrorNotInitialized"},
    {hipErrorInvalidDevicePointer, "hipErrorInvalidDevicePointer"},
    {hipErrorNoDevice, "hipErrorNoDevice"},
    {hipErrorInvalidDevice, "hipErrorInvalidDevice"},
    {hipErrorInvalidContext, "hipErrorInvalidContext"},
    {hipErrorMapFailed, "hipErrorMapFailed"},
    {hipErrorAlreadyMapped, "hipErrorAlreadyMapped"},
    {hipErrorInvalidHandle, "hipErrorInvalidHandle"},
    {hipErrorNotFound, "hipErrorNotFound"},
    {hipErrorNotReady, "hipErrorNotReady"},
    {hipErrorNotSupported, "hipErrorNotSupported"},
    {hipErrorUnknown, "hipErrorUnknown"},
};

/* Where HIP 5.2 differs from CUDA, the code documented in its header wins:
 * hipMemGetAddressRange and hipFree of an unknown pointer ->
 * hipErrorInvalidDevicePointer; hipIpcGetMemHandle/OpenMemHandle/CloseMemHandle
 * failures -> hipErrorInvalidHandle. */
static int fk_code(int e) {
  static const hipError_t map[] = {
      [FK_OK] = hipSuccess,
      [FK_EINVAL] = hipErrorInvalidValue,
      [FK_ENOMEM] = hipErrorOutOfMemory,
      [FK_ENOINIT] = hipErrorNotInitialized,
      [FK_ESTUB] = hipErrorUnknown,
      [FK_ENODEV] = hipErrorNoDevice,
      [FK_EBADDEV] = hipErrorInvalidDevice,
      [FK_ECTX] = hipErrorInvalidContext,
      [FK_EMAPPED] = hipErrorAlreadyMapped,
      [FK_EHANDLE] = hipErrorInvalidHandle,
      [FK_ENOTFOUND] = hipErrorInvalidDevicePointer,
      [FK_ENOTREADY] = hipErrorNotReady,
      [FK_ENOTSUP] = hipErrorNotSupported,
      [FK_ENOEXPORT] = hipErrorInvalidHandle,
      [FK_ENOTOPEN] = hipErrorInvalidHandle,
      [FK_EBADFREE] = hipErrorInvalidDevicePointer,
  };
  return (int)map[e];
}

static const char *fk_code_name(int code) {
  for (size_t i = 0; i < sizeof errs / sizeof *errs; i++)
    if ((int)errs[i].code == code) return errs[i].name;
  return "hipErrorUnknown"; /* as the real 5.2 library answers unknown codes */
}

static _Thread_local int cur_dev; /* hipSetDevice is per thread; default 0 */
static char
    dev_ctx[FK_MAX_DEV]; /* what HIP_POINTER_ATTRIBUTE_CONTEXT points at */
static void *const ctx_ptrs[FK_MAX_DEV] = {
    &dev_ctx[0], &dev_ctx[1], &dev_ctx[2], &dev_ctx[3],
    &dev_ctx[4], &dev_ctx[5], &dev_ctx[6], &dev_ctx[7]};

/* What every device call checks first. Measured on a GPU-less host with the
 * real 5.2 library: hipInit, hipSetDevice, hipGetDevice, hipMalloc,
 * hipEventCreateWithFlags -> hipErrorInvalidDevice (101). */
static int gate(int *dev) {
  *dev = cur_dev;
  if (fk_forked()) return FK_ENOINIT;
  if (fk_knob_is("MODE", "nodevice") || cur_dev >= fk_devices())
    return FK_EBADDEV;
  fk_mark_init(); /* HIP initialises implicitly on first use */
  return FK_OK;
}
#define GATE()                                                                 \
  int dev, e = gate(&dev);                                                     \
  (void)dev

#define RET(...) return (hipError_t)fk_ret(__VA_ARGS__)

hipError_t hipInit(unsigned int flags) {
  GATE();
  if (!e && flags) e = FK_EINVAL;
  RET("hipInit", e, "flags=%u", flags);
}

hipError_t hipDriverGetVersion(int *driverVersion) {
  int e = driverVersion ? FK_OK : FK_EINVAL;
  if (!e) *driverVersion = HIP_VERSION_5_2;
  RET("hipDriverGetVersion", e, "version=%d", HIP_VERSION_5_2);
}

hipError_t hipRuntimeGetVersion(int *runtimeVersion) {
  int e = runtimeVersion ? FK_OK : FK_EINVAL;
  if (!e) *runtimeVersion = HIP_VERSION_5_2;
  RET("hipRuntimeGetVersion", e, "version=%d", HIP_VERSION_5_2);
}

/* GPU-less host, real 5.2: hipErrorNoDevice (100) and *count 0. */
hipError_t hipGetDeviceCount(int *count) {
  int n = fk_knob_is("MODE", "nodevice") ? 0 : fk_devices();
  int e = fk_forked() ? FK_ENOINIT
          : !count    ? FK_EINVAL
          : n == 0    ? FK_ENODEV
                      : FK_OK;
  if (count && e != FK_ENOINIT) *count = n;
  RET("hipGetDeviceCount", e, "count=%d", n);
}

hipError_t hipSetDevice(int deviceId) {
  int e = fk_forked()                      ? FK_ENOINIT
          : fk_knob_is("MODE", "nodevice") ? FK_EBADDEV
                                           : FK_OK;
  if (!e && (deviceId < 0 || deviceId >= fk_devices())) e = FK_EBADDEV;
  if (!e) {
    cur_dev = deviceId;
    fk_mark_init();
  }
  RET("hipSetDevice", e, "dev=%d", deviceId);
}

hipError_t hipGetDevice(int *deviceId) {
  GATE();
  if (!e && !deviceId) e = FK_EINVAL;
  if (!e) *deviceId = dev;
  RET("hipGetDevice", e, "dev=%d", dev);
}

hipError_t hipDeviceSynchronize(void) {
  GATE();
  unsigned long long us = 0;
  if (!e) e = fk_device_sync(dev, &us);
  RET("hipDeviceSynchronize", e, "dev=%d waited_us=%llu", dev, us);
}

/* ---- memory -------------------------------------------------------------- */

hipError_t hipMalloc(void **ptr, size_t size) {
  GATE();
  uintptr_t p = 0;
  if (!e && !ptr) e = FK_EINVAL;
  if (!e && size) e = fk_mem_alloc(&p, size, FK_MEM_ALLOC, dev);
  if (!e) *ptr = (void *)p; /* size 0: hipSuccess with *ptr NULL (ihipMalloc) */
  RET("hipMalloc", e, "size=%zu ptr=0x%llx", size, FK_P(p));
}

/* Test-only: memory legacy IPC cannot export (VMM / pool memory):
 * HIP_POINTER_ATTRIBUTE_IS_LEGACY_HIP_IPC_CAPABLE 0, hipIpcGetMemHandle fails.
 * Freed with hipFree. */
int fake_gpu_alloc_vmm(void **ptr, size_t size) {
  GATE();
  uintptr_t p = 0;
  if (!e && (!ptr || !size)) e = FK_EINVAL;
  if (!e) e = fk_mem_alloc(&p, size, FK_MEM_VMM, dev);
  if (!e) *ptr = (void *)p;
  RET("fake_gpu_alloc_vmm", e, "size=%zu ptr=0x%llx", size, FK_P(p));
}

static hipError_t hpool_free(const char *call, void *dev_ptr, int now_,
                             hipStream_t stream); /* fake_hip_pool.c */

/* A VMM address (hipMemAddressReserve / hipMemMap, fake_vmm.h) is not
 * hipFree's: hipErrorInvalidValue (undo it with hipMemUnmap,
 * hipMemAddressFree, hipMemRelease). Pool memory, and an imported pool
 * pointer (hipMemPoolImportPointer: "The pointer may be freed with @p
 * hipFree or @p hipFreeAsync."): fake_pool.h frees it, logged with its
 * imported_elsewhere=, pool= and alloc= keys (fake_hip_pool.c). */
hipError_t hipFree(void *ptr) {
  GATE();
  uint64_t h, pn, n;
  if (!e && ptr && fk_pool_of((uintptr_t)ptr, &h, &pn, &n))
    return hpool_free("hipFree", ptr, 1, NULL);
  if (!e && ptr && fk_vmm_owns((uintptr_t)ptr)) e = FK_EINVAL;
  if (!e) e = fk_mem_free((uintptr_t)ptr);
  RET("hipFree", e, "ptr=0x%llx", FK_P(ptr));
}

/* Pool memory (fake_pool.h), imported pool pointers too: the allocation's
 * base and size. */
hipError_t hipMemGetAddressRange(hipDeviceptr_t *pbase, size_t *psize,
                                 hipDeviceptr_t dptr) {
  GATE();
  uintptr_t base = 0;
  size_t size = 0;
  if (!e && (!pbase || !psize))
    e = FK_EINVAL; /* 5.2 writes both unconditionally */
  if (!e) e = fk_mem_range((uintptr_t)dptr, &base, &size);
  if (!e) {
    *pbase = (void *)base;
    *psize = size;
  }
  RET("hipMemGetAddressRange", e, "ptr=0x%llx base=0x%llx size=%zu", FK_P(dptr),
      FK_P(base), size);
}

/* Synchronous: done before returning. The kind must match where the pointers
 * are (hipMemcpyDefault: whatever they are). A copy or memset that touches
 * pool memory adds " pending_us=<us> alloc=<nonce>" (fk_pool_touched). */
hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes,
                     hipMemcpyKind kind) {
  GATE();
  char t[64];
  fk_touch.pool = 0;
  int d_dev = kind == hipMemcpyHostToDevice || kind == hipMemcpyDeviceToDevice;
  int s_dev = kind == hipMemcpyDeviceToHost || kind == hipMemcpyDeviceToDevice;
  if (kind == hipMemcpyDefault) {
    d_dev = fk_is_device_ptr((uintptr_t)dst);
    s_dev = fk_is_device_ptr((uintptr_t)src);
  }
  if (!e && (unsigned)kind > hipMemcpyDefault) e = FK_EINVAL;
  if (!e)
    e = fk_copy((uintptr_t)dst, d_dev, (uintptr_t)src, s_dev, sizeBytes, dev);
  RET("hipMemcpy", e, "dst=0x%llx src=0x%llx n=%zu kind=%d%s", FK_P(dst),
      FK_P(src), sizeBytes, (int)kind, fk_pool_touched(t));
}

hipError_t hipMemset(void *dst, int value, size_t sizeBytes) {
  GATE();
  char t[64];
  fk_touch.pool = 0;
  if (!e) e = fk_memset((uintptr_t)dst, value, sizeBytes, dev);
  RET("hipMemset", e, "dst=0x%llx value=%d n=%zu%s", FK_P(dst), value,
      sizeBytes, fk_pool_touched(t));
}

/* fk_ptr_attr (unknown memory -> hipErrorInvalidValue; HOST_POINTER of device
 * memory -> hipErrorInvalidValue; P2P_TOKENS, SYNC_MEMOPS,
 * ALLOWED_HANDLE_TYPES, IS_GPU_DIRECT_RDMA_CAPABLE, ACCESS_FLAGS ->
 * hipErrorNotSupported), plus HIP_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: "Returns
 * the mempool handle for the allocation if it was allocated from a mempool"
 * (marked "not supported in HIP" in 5.2; the fake answers as CUDA: the pool
 * of pool memory, the imported pool for an imported pointer, NULL for other
 * device memory). IS_LEGACY_HIP_IPC_CAPABLE is 0 for pool memory. */
hipError_t hipPointerGetAttribute(void *data, hipPointer_attribute attribute,
                                  hipDeviceptr_t ptr) {
  GATE();
  uint64_t h = 0, pn, n;
  if (!e && attribute == HIP_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) {
    if (!data || !fk_is_device_ptr((uintptr_t)ptr)) {
      e = FK_EINVAL;
    } else {
      if (!fk_pool_of((uintptr_t)ptr, &h, &pn, &n)) h = 0;
      *(hipMemPool_t *)data = (hipMemPool_t)(uintptr_t)h;
    }
  } else if (!e) {
    e = fk_ptr_attr(data, attribute, (uintptr_t)ptr, hipMemoryTypeDevice,
                    ctx_ptrs);
  }
  RET("hipPointerGetAttribute", e, "attr=%d ptr=0x%llx", (int)attribute,
      FK_P(ptr));
}

/* ---- IPC memory ---------------------------------------------------------- */

/* "Takes a pointer to the base of an existing device memory allocation
 * created with hipMalloc": other memory -> hipErrorInvalidHandle, except pool
 * memory (fake_pool.h; share it with hipMemPoolExportPointer) ->
 * hipErrorInvalidValue (not in the header's list; as CUDA answers for
 * cudaMallocAsync memory). */
hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *devPtr) {
  GATE();
  struct fk_handle h = {0};
  char id[40];
  uint64_t ph, pn, n;
  if (!e && (!handle || !devPtr)) e = FK_EINVAL;
  if (!e && fk_pool_of((uintptr_t)devPtr, &ph, &pn, &n)) e = FK_EINVAL;
  if (!e) e = fk_ipc_get_mem(&h, (uintptr_t)devPtr);
  if (!e) memcpy(handle, &h, sizeof h);
  RET("hipIpcGetMemHandle", e, "ptr=0x%llx h=%s", FK_P(devPtr),
      fk_hid(id, h.pid, h.nonce));
}

hipError_t hipIpcOpenMemHandle(void **devPtr, hipIpcMemHandle_t handle,
                               unsigned int flags) {
  GATE();
  struct fk_handle h;
  uintptr_t p = 0;
  char id[40];
  memcpy(&h, &handle, sizeof h);
  /* "Must be specified as hipIpcMemLazyEnablePeerAccess" (0 in 5.2; later clr
   * checks flags != hipIpcMemLazyEnablePeerAccess -> hipErrorInvalidValue) */
  if (!e && (!devPtr || flags != hipIpcMemLazyEnablePeerAccess)) e = FK_EINVAL;
  if (!e) e = fk_ipc_open_mem(&p, &h, dev);
  if (!e) *devPtr = (void *)p;
  RET("hipIpcOpenMemHandle", e, "h=%s flags=%u ptr=0x%llx",
      fk_hid(id, h.pid, h.nonce), flags, FK_P(p));
}

hipError_t hipIpcCloseMemHandle(void *devPtr) {
  GATE();
  pid_t src = 0;
  uint64_t nonce = 0;
  char id[40];
  if (!e && !devPtr) e = FK_EINVAL;
  if (!e) e = fk_ipc_close_mem((uintptr_t)devPtr, &src, &nonce);
  RET("hipIpcCloseMemHandle", e, "ptr=0x%llx h=%s", FK_P(devPtr),
      fk_hid(id, src, nonce));
}

/* ---- streams and events -------------------------------------------------- */

hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags) {
  GATE();
  void *s = NULL;
  if (!e && (!stream || (flags & ~(unsigned)hipStreamNonBlocking)))
    e = FK_EINVAL;
  if (!e) e = fk_stream_create(&s, flags, dev);
  if (!e) *stream = s;
  RET("hipStreamCreateWithFlags", e, "flags=%u stream=0x%llx", flags, FK_P(s));
}

hipError_t hipStreamCreate(hipStream_t *stream) {
  GATE();
  void *s = NULL;
  if (!e && !stream) e = FK_EINVAL;
  if (!e) e = fk_stream_create(&s, hipStreamDefault, dev);
  if (!e) *stream = s;
  RET("hipStreamCreate", e, "stream=0x%llx", FK_P(s));
}

hipError_t hipStreamDestroy(hipStream_t stream) {
  GATE();
  if (!e) e = fk_stream_destroy(stream);
  RET("hipStreamDestroy", e, "stream=0x%llx", FK_P(stream));
}

hipError_t hipStreamSynchronize(hipStream_t stream) {
  GATE();
  unsigned long long us = 0;
  if (!e) e = fk_stream_sync(stream, dev, 1, &us);
  RET("hipStreamSynchronize", e, "stream=0x%llx waited_us=%llu", FK_P(stream),
      us);
}

hipError_t hipStreamQuery(hipStream_t stream) {
  GATE();
  unsigned long long us = 0;
  if (!e) e = fk_stream_sync(stream, dev, 0, &us);
  RET("hipStreamQuery", e, "stream=0x%llx left_us=%llu", FK_P(stream), us);
}

hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event,
                              unsigned int flags) {
  GATE();
  unsigned long long us = 0;
  if (!e && flags) e = FK_EINVAL; /* "flags: Must be 0" */
  if (!e) e = fk_stream_wait_event(stream, event, dev, &us);
  RET("hipStreamWaitEvent", e,
      "stream=0x%llx event=0x%llx flags=%u pending_us=%llu", FK_P(stream),
      FK_P(event), flags, us);
}

/* HIP 5.2 header on hipEventInterprocess: "Use of this flag will return an
 * error" -> hipErrorInvalidValue, unless FAKE_HIP_IPC_EVENTS=1. */
hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags) {
  GATE();
  void *ev = NULL;
  const unsigned known = hipEventBlockingSync | hipEventDisableTiming |
                         hipEventInterprocess | hipEventReleaseToDevice |
                         hipEventReleaseToSystem;
  if (!e && (!event || (flags & ~known))) e = FK_EINVAL;
  if (!e && (flags & hipEventInterprocess) &&
      (!fk_knob_is("IPC_EVENTS", "1") || !(flags & hipEventDisableTiming)))
    e = FK_EINVAL;
  if (!e) e = fk_event_create(&ev, flags, dev);
  if (!e) *event = ev;
  RET("hipEventCreateWithFlags", e, "flags=%u event=0x%llx", flags, FK_P(ev));
}

hipError_t hipEventCreate(hipEvent_t *event) {
  GATE();
  void *ev = NULL;
  if (!e && !event) e = FK_EINVAL;
  if (!e) e = fk_event_create(&ev, hipEventDefault, dev);
  if (!e) *event = ev;
  RET("hipEventCreate", e, "event=0x%llx", FK_P(ev));
}

hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
  GATE();
  unsigned long long rec = 0, us = 0;
  if (!e) e = fk_event_record(event, stream, dev, &rec, &us);
  RET("hipEventRecord", e,
      "event=0x%llx stream=0x%llx rec=%llu done_in_us=%llu", FK_P(event),
      FK_P(stream), rec, us);
}

hipError_t hipEventQuery(hipEvent_t event) {
  GATE();
  unsigned long long us = 0;
  if (!e) e = fk_event_sync(event, 0, &us); /* hipErrorNotReady until done */
  RET("hipEventQuery", e, "event=0x%llx left_us=%llu", FK_P(event), us);
}

hipError_t hipEventSynchronize(hipEvent_t event) {
  GATE();
  unsigned long long us = 0;
  if (!e) e = fk_event_sync(event, 1, &us);
  RET("hipEventSynchronize", e, "event=0x%llx waited_us=%llu", FK_P(event), us);
}

hipError_t hipEventDestroy(hipEvent_t event) {
  GATE();
  if (!e) e = fk_event_destroy(event);
  RET("hipEventDestroy", e, "event=0x%llx", FK_P(event));
}

hipError_t hipIpcGetEventHandle(hipIpcEventHandle_t *handle, hipEvent_t event) {
  GATE();
  struct fk_handle h = {0};
  char id[40];
  if (!e && !handle) e = FK_EINVAL;
  if (!e) e = fk_ipc_get_event(&h, event);
  if (!e) memcpy(handle, &h, sizeof h);
  RET("hipIpcGetEventHandle", e, "event=0x%llx h=%s", FK_P(event),
      fk_hid(id, h.pid, h.nonce));
}

hipError_t hipIpcOpenEventHandle(hipEvent_t *event,
                                 hipIpcEventHandle_t handle) {
  GATE();
  struct fk_handle h;
  void *ev = NULL;
  char id[40];
  memcpy(&h, &handle, sizeof h);
  if (!e && !event) e = FK_EINVAL;
  if (!e) e = fk_ipc_open_event(&ev, &h, dev);
  if (!e) *event = ev;
  RET("hipIpcOpenEventHandle", e, "h=%s event=0x%llx",
      fk_hid(id, h.pid, h.nonce), FK_P(ev));
}

/* ---- virtual memory management ------------------------------------------ */

#include "fake_hip_vmm.c"

/* ---- stream-ordered memory pools ----------------------------------------- */

#include "fake_hip_pool.c"

/* ---- errors -------------------------------------------------------------- */

/* The real 5.2 library returns the name from both (measured). */
const char *hipGetErrorName(hipError_t hip_error) {
  const char *s = fk_code_name((int)hip_error);
  fk_ret("hipGetErrorName", FK_OK, "error=%d", (int)hip_error);
  return s;
}
const char *hipGetErrorString(hipError_t hipError) {
  const char *s = fk_code_name((int)hipError);
  fk_ret("hipGetErrorString", FK_OK, "error=%d", (int)hipError);
  return s;
}
