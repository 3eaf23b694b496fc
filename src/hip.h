/* ipcref_hip.h: the HIP (ROCm) backend for ipcref's sharing layer.
 *
 * Include ipcref.h first; define IPCREF_HIP_IMPLEMENTATION in the one file
 * that also defines IPCREF_IMPLEMENTATION. Nothing links against
 * libamdhip64: ipcref_hip_open loads the runtime at run time (dlopen
 * "libamdhip64.so.7", ".so.6", ".so.5", then "libamdhip64.so"; every
 * symbol checked), so a program built with this header runs on a machine
 * without a GPU and gets IPCREF_ENODEV, with ipcref_hip_error() saying why.
 *
 *     ipcref_hip *hip;
 *     if (ipcref_hip_open(NULL, &hip) != IPCREF_OK)
 *       fprintf(stderr, "no ROCm: %s\n", ipcref_hip_error());
 *     ipcref_ctx_add_backend(ctx, ipcref_hip_backend(hip));
 *     ipcref_hip_alloc(ctx, 0, bytes, &buf);     (or ipcref_hip_wrap)
 *
 * It is the CUDA backend's logic on HIP (both are written from one source):
 * device segments from hipMalloc, pointers from other allocators found with
 * hipMemGetAddressRange and exported once by their base, one
 * hipIpcOpenMemHandle per allocation and process (counted; this process's
 * own handles resolve to its own pointers), releases fenced by an event on
 * the consumer's stream. One difference: HIP 5 has no usable interprocess
 * events (its header: "Use of this flag will return an error"), so instead
 * of an event travelling with the message, ipcref_send_on synchronizes the
 * producer's stream before the hand-off. The producer's thread waits for
 * its own queued work then, never for a consumer. Another: device memory
 * is legacy (hipMalloc) unless VMM memory is asked for
 * (ipcref_hip_set_memory: hipMemCreate, shared by fd, as the CUDA backend
 * does), since HIP has no device attribute that says it works; memory of
 * a stream-ordered pool created shareable goes as with CUDA (its pool's
 * fd and the pointer's export data: src/gpu_pool.h). */

#ifndef IPCREF_HIP_H_INCLUDED
#define IPCREF_HIP_H_INCLUDED

#ifndef IPCREF_HAVE_SHARING
#error                                                                         \
    "ipcref_hip.h: include ipcref.h first (and do not define IPCREF_NO_SHARING)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ipcref_hip ipcref_hip;

/* Loads the HIP runtime: `runtime_path` names the library (NULL: the
 * usual names, newest first), then hipInit and a device count. Errors:
 * EINVAL (out NULL, runtime_path longer than 255 bytes), ENOMEM, ENODEV
 * (no runtime library, a symbol missing,
 * no device): ipcref_hip_error() says which; EBUSY (another runtime path
 * is loaded in this process). There is one instance per process: opening
 * again gives the same one, counted. */
IPCREF_API ipcref_result ipcref_hip_open(const char *runtime_path,
                                         ipcref_hip **out);

/* Why the last ipcref_hip_open (or backend call) on this thread failed,
 * in English; "" when nothing failed. */
IPCREF_API const char *ipcref_hip_error(void);

/* The backend to give ipcref_ctx_add_backend; NULL for NULL. */
IPCREF_API ipcref_backend *ipcref_hip_backend(ipcref_hip *hip);

/* Drops one open; the last releases the event pool, the imports and the
 * library. Every context the backend was added to must be freed first.
 * NULL: no-op. */
IPCREF_API void ipcref_hip_close(ipcref_hip *hip);

/* What ipcref_hip_alloc's segments are made of (ipcref_hip_set_memory):
 * the values are those of ipcref_cuda.h. AUTO, the default, is legacy
 * memory (hipMalloc, shared by hipIpcGetMemHandle); VMM is hipMemCreate
 * (whole granules), shared by fd, and a runtime without those calls makes
 * ipcref_hip_alloc say ENOTSUP. */
#define IPCREF_HIP_MEMORY_AUTO   0
#define IPCREF_HIP_MEMORY_LEGACY 1
#define IPCREF_HIP_MEMORY_VMM    2

/* Chooses what the segments made from now on are (those made before keep
 * theirs; a consumer maps either kind). Errors: EINVAL (hip NULL, an
 * unknown value). */
IPCREF_API ipcref_result ipcref_hip_set_memory(ipcref_hip *hip, int memory);

/* A shared device buffer of `size` bytes on device `device` (the backend
 * must be added to ctx): ipcref_device_new for ROCm. EINVAL: ctx or out
 * NULL, device negative. */
IPCREF_API ipcref_result ipcref_hip_alloc(ipcref_ctx *ctx, int device,
                                          size_t size, ipcref_buf **out);

/* Adopts `size` bytes at device address `ptr` from another allocator:
 * ipcref_device_wrap for ROCm (see there). EINVAL: ctx, out or ptr NULL,
 * device negative, and as ipcref_device_wrap. */
IPCREF_API ipcref_result ipcref_hip_wrap(ipcref_ctx *ctx, int device, void *ptr,
                                         size_t size,
                                         void (*release)(void *user, void *ptr),
                                         void *user, ipcref_buf **out);

#ifdef __cplusplus
}
#endif

#endif /* IPCREF_HIP_H_INCLUDED */

/* @implementation */

/* ---- HIP's part (the shared part is src/gpu.h) -----------------------------
 * ipcref__hip_d_* names a function of the driver's part ("d" for driver;
 * HIP's driver is its runtime library): the ones src/gpu.h calls as
 * ipcref__gpu_d_*, each wrapping one runtime call, and the loader's steps.
 *
 * The runtime's types: with <hip/hip_runtime_api.h> included first, its
 * own, and the compiler checks each entry point against the header's
 * prototype; without it, the same layouts. */
#include <dlfcn.h>

#ifdef HIP_IPC_HANDLE_SIZE
typedef hipError_t ipcref__hip_result;
typedef hipEvent_t ipcref__hip_event;
typedef hipStream_t ipcref__hip_stream;
typedef hipIpcMemHandle_t ipcref__hip_mem_handle;
typedef hipPointer_attribute ipcref__hip_attr;
typedef hipMemGenericAllocationHandle_t ipcref__hip_vmm_handle;
typedef hipMemAllocationProp ipcref__hip_mem_prop;
typedef hipMemAccessDesc ipcref__hip_access;
typedef hipMemAllocationHandleType ipcref__hip_handle_type;
typedef hipMemAllocationGranularity_flags ipcref__hip_granularity;
typedef hipMemPool_t ipcref__hip_mempool;
typedef hipMemPoolPtrExportData ipcref__hip_mempool_data;
#else
typedef int ipcref__hip_result;
typedef struct ipcref__hip_event_st *ipcref__hip_event;
typedef struct ipcref__hip_stream_st *ipcref__hip_stream;
typedef struct {
  char reserved[64];
} ipcref__hip_mem_handle;
typedef int ipcref__hip_attr;
typedef struct ipcref__hip_vmm_st *ipcref__hip_vmm_handle;
typedef struct ipcref__hip_mem_prop_st ipcref__hip_mem_prop; /* see below */
typedef struct {
  int type, id;
  int flags;
} ipcref__hip_access; /* hipMemAccessDesc's layout */
typedef int ipcref__hip_handle_type;
typedef int ipcref__hip_granularity;
typedef struct ipcref__hip_mempool_st *ipcref__hip_mempool;
typedef struct {
  unsigned char reserved[64];
} ipcref__hip_mempool_data;
#endif

/* The numbers used here (hip_runtime_api.h), and what the shared part
 * needs. */
#define IPCREF__HIP_OOM             2   /* hipErrorOutOfMemory */
#define IPCREF__HIP_NO_DEVICE       100 /* hipErrorNoDevice */
#define IPCREF__HIP_INVALID_CONTEXT 201 /* hipErrorInvalidContext */
#define IPCREF__HIP_NOT_READY       600 /* hipErrorNotReady */
#define IPCREF__HIP_IPC_EVENTS      0   /* HIP 5: none that work */
#define IPCREF__HIP_VMM_AUTO                                                   \
  0 /* legacy by default: HIP has no device attribute that says VMM works */
#define IPCREF__HIP_DEVICE_TYPE     IPCREF_DEVICE_ROCM
#define IPCREF__HIP_NAME            "hip"
#define IPCREF__HIP_DEVICES         64
#define IPCREF__HIP_EVENT_NO_TIMING 0x2 /* hipEventDisableTiming */
#define IPCREF__HIP_ATTR_IPC_CAPABLE                                           \
  10 /* HIP_POINTER_ATTRIBUTE_IS_LEGACY_HIP_IPC_CAPABLE */
#define IPCREF__HIP_VERSION_6 60000000 /* hipRuntimeGetVersion's HIP 6.0.0 */

/* The entry points, by their names (HIP has no versioned lookup). */
typedef struct ipcref__hip_api {
  ipcref__hip_result (*Init)(unsigned int);
  ipcref__hip_result (*GetDeviceCount)(int *);
  ipcref__hip_result (*RuntimeGetVersion)(int *);
  const char *(*GetErrorName)(ipcref__hip_result);
  ipcref__hip_result (*SetDevice)(int);
  ipcref__hip_result (*Malloc)(void **, size_t);
  ipcref__hip_result (*Free)(void *);
  ipcref__hip_result (*MemGetAddressRange)(void **, size_t *, void *);
  ipcref__hip_result (*PointerGetAttribute)(void *, ipcref__hip_attr, void *);
  ipcref__hip_result (*IpcGetMemHandle)(ipcref__hip_mem_handle *, void *);
  ipcref__hip_result (*IpcOpenMemHandle)(void **, ipcref__hip_mem_handle,
                                         unsigned int);
  ipcref__hip_result (*IpcCloseMemHandle)(void *);
  ipcref__hip_result (*EventCreateWithFlags)(ipcref__hip_event *, unsigned);
  ipcref__hip_result (*EventRecord)(ipcref__hip_event, ipcref__hip_stream);
  ipcref__hip_result (*EventQuery)(ipcref__hip_event);
  ipcref__hip_result (*EventDestroy)(ipcref__hip_event);
  ipcref__hip_result (*StreamWaitEvent)(ipcref__hip_stream, ipcref__hip_event,
                                        unsigned int);
  ipcref__hip_result (*StreamSynchronize)(ipcref__hip_stream);
  /* Virtual memory management: optional (src/hip_vmm.h). */
  ipcref__hip_result (*DeviceSynchronize)(void);
  ipcref__hip_result (*MemGetAllocationGranularity)(
      size_t *, const ipcref__hip_mem_prop *, ipcref__hip_granularity);
  ipcref__hip_result (*MemCreate)(ipcref__hip_vmm_handle *, size_t,
                                  const ipcref__hip_mem_prop *,
                                  unsigned long long);
  ipcref__hip_result (*MemRelease)(ipcref__hip_vmm_handle);
  ipcref__hip_result (*MemAddressReserve)(void **, size_t, size_t, void *,
                                          unsigned long long);
  ipcref__hip_result (*MemAddressFree)(void *, size_t);
  ipcref__hip_result (*MemMap)(void *, size_t, size_t, ipcref__hip_vmm_handle,
                               unsigned long long);
  ipcref__hip_result (*MemUnmap)(void *, size_t);
  ipcref__hip_result (*MemSetAccess)(void *, size_t, const ipcref__hip_access *,
                                     size_t);
  ipcref__hip_result (*MemExportToShareableHandle)(void *,
                                                   ipcref__hip_vmm_handle,
                                                   ipcref__hip_handle_type,
                                                   unsigned long long);
  ipcref__hip_result (*MemImportFromShareableHandle)(ipcref__hip_vmm_handle *,
                                                     void *,
                                                     ipcref__hip_handle_type);
  ipcref__hip_result (*MemRetainAllocationHandle)(ipcref__hip_vmm_handle *,
                                                  void *);
  ipcref__hip_result (*MemGetAllocationPropertiesFromHandle)(
      ipcref__hip_mem_prop *, ipcref__hip_vmm_handle);
  /* Stream-ordered pools: optional too (src/hip_vmm.h). */
  ipcref__hip_result (*MemPoolExportToShareableHandle)(void *,
                                                       ipcref__hip_mempool,
                                                       ipcref__hip_handle_type,
                                                       unsigned int);
  ipcref__hip_result (*MemPoolImportFromShareableHandle)(
      ipcref__hip_mempool *, void *, ipcref__hip_handle_type, unsigned int);
  ipcref__hip_result (*MemPoolExportPointer)(ipcref__hip_mempool_data *,
                                             void *);
  ipcref__hip_result (*MemPoolImportPointer)(void **, ipcref__hip_mempool,
                                             ipcref__hip_mempool_data *);
  ipcref__hip_result (*MemPoolSetAccess)(ipcref__hip_mempool,
                                         const ipcref__hip_access *, size_t);
  ipcref__hip_result (*MemPoolDestroy)(ipcref__hip_mempool);
} ipcref__hip_api;

#if defined(HIP_IPC_HANDLE_SIZE) && !defined(__cplusplus)
/* Each pointer type against the real prototype: a mismatch is a
 * diagnostic (distinct pointer types), and sizeof keeps it from linking.
 * (In C, where the header's functions are not overloaded.) */
#define IPCREF__HIP_CHECK(field, fn)                                           \
  (void)sizeof(((ipcref__hip_api *)0)->field == &fn)
IPCREF__PRIVATE void ipcref__hip_check_prototypes(void) {
  IPCREF__HIP_CHECK(Init, hipInit);
  IPCREF__HIP_CHECK(GetDeviceCount, hipGetDeviceCount);
  IPCREF__HIP_CHECK(RuntimeGetVersion, hipRuntimeGetVersion);
  IPCREF__HIP_CHECK(GetErrorName, hipGetErrorName);
  IPCREF__HIP_CHECK(SetDevice, hipSetDevice);
  IPCREF__HIP_CHECK(Malloc, hipMalloc);
  IPCREF__HIP_CHECK(Free, hipFree);
  IPCREF__HIP_CHECK(MemGetAddressRange, hipMemGetAddressRange);
  IPCREF__HIP_CHECK(PointerGetAttribute, hipPointerGetAttribute);
  IPCREF__HIP_CHECK(IpcGetMemHandle, hipIpcGetMemHandle);
  IPCREF__HIP_CHECK(IpcOpenMemHandle, hipIpcOpenMemHandle);
  IPCREF__HIP_CHECK(IpcCloseMemHandle, hipIpcCloseMemHandle);
  IPCREF__HIP_CHECK(EventCreateWithFlags, hipEventCreateWithFlags);
  IPCREF__HIP_CHECK(EventQuery, hipEventQuery);
  IPCREF__HIP_CHECK(EventDestroy, hipEventDestroy);
  IPCREF__HIP_CHECK(StreamWaitEvent, hipStreamWaitEvent);
  IPCREF__HIP_CHECK(StreamSynchronize, hipStreamSynchronize);
  IPCREF__HIP_CHECK(DeviceSynchronize, hipDeviceSynchronize);
  IPCREF__HIP_CHECK(MemGetAllocationGranularity,
                    hipMemGetAllocationGranularity);
  IPCREF__HIP_CHECK(MemCreate, hipMemCreate);
  IPCREF__HIP_CHECK(MemRelease, hipMemRelease);
  IPCREF__HIP_CHECK(MemAddressReserve, hipMemAddressReserve);
  IPCREF__HIP_CHECK(MemAddressFree, hipMemAddressFree);
  IPCREF__HIP_CHECK(MemMap, hipMemMap);
  IPCREF__HIP_CHECK(MemUnmap, hipMemUnmap);
  IPCREF__HIP_CHECK(MemSetAccess, hipMemSetAccess);
  IPCREF__HIP_CHECK(MemExportToShareableHandle, hipMemExportToShareableHandle);
  IPCREF__HIP_CHECK(MemImportFromShareableHandle,
                    hipMemImportFromShareableHandle);
  IPCREF__HIP_CHECK(MemRetainAllocationHandle, hipMemRetainAllocationHandle);
  IPCREF__HIP_CHECK(MemGetAllocationPropertiesFromHandle,
                    hipMemGetAllocationPropertiesFromHandle);
  IPCREF__HIP_CHECK(MemPoolExportToShareableHandle,
                    hipMemPoolExportToShareableHandle);
  IPCREF__HIP_CHECK(MemPoolImportFromShareableHandle,
                    hipMemPoolImportFromShareableHandle);
  IPCREF__HIP_CHECK(MemPoolExportPointer, hipMemPoolExportPointer);
  IPCREF__HIP_CHECK(MemPoolImportPointer, hipMemPoolImportPointer);
  IPCREF__HIP_CHECK(MemPoolSetAccess, hipMemPoolSetAccess);
  IPCREF__HIP_CHECK(MemPoolDestroy, hipMemPoolDestroy);
  (void)sizeof(char[sizeof(hipIpcMemHandle_t) == IPCREF_HANDLE_BYTES ? 1 : -1]);
}
#endif

/* The loaded runtime. */
typedef struct ipcref__hip_state {
  void *lib;
  ipcref__hip_api api;
  unsigned int lazy_peer; /* hipIpcMemLazyEnablePeerAccess: 0 in HIP 5,
                             1 from HIP 6 on, which insists on it */
  int version;            /* hipRuntimeGetVersion's */
} ipcref__hip_state;

IPCREF__PRIVATE const char *ipcref__hip_d_errname(ipcref__hip_state *d,
                                                  int code) {
  const char *name =
      d->api.GetErrorName ? d->api.GetErrorName((ipcref__hip_result)code) : 0;
  return name ? name : "HIP error";
}

/* One function per runtime call the shared part makes. */
IPCREF__PRIVATE int ipcref__hip_d_use(ipcref__hip_state *d, int dev) {
  return (int)d->api.SetDevice(dev);
}
IPCREF__PRIVATE int ipcref__hip_d_alloc(ipcref__hip_state *d, size_t size,
                                        uint64_t *addr) {
  void *p = NULL;
  int code = (int)d->api.Malloc(&p, size);
  *addr = (uint64_t)(uintptr_t)p;
  return code;
}
IPCREF__PRIVATE int ipcref__hip_d_free(ipcref__hip_state *d, uint64_t addr) {
  return (int)d->api.Free((void *)(uintptr_t)addr);
}
IPCREF__PRIVATE int ipcref__hip_d_range(ipcref__hip_state *d, uint64_t addr,
                                        uint64_t *base, size_t *size) {
  void *b = NULL;
  int code = (int)d->api.MemGetAddressRange(&b, size, (void *)(uintptr_t)addr);
  *base = (uint64_t)(uintptr_t)b;
  return code;
}
IPCREF__PRIVATE int ipcref__hip_d_ipc_capable(ipcref__hip_state *d,
                                              uint64_t addr) {
  int capable = 1; /* HIP 5 does not answer: assume it can */
  if (d->api.PointerGetAttribute)
    (void)d->api.PointerGetAttribute(
        &capable, (ipcref__hip_attr)IPCREF__HIP_ATTR_IPC_CAPABLE,
        (void *)(uintptr_t)addr);
  return capable != 0;
}
IPCREF__PRIVATE int ipcref__hip_d_ipc_get(ipcref__hip_state *d, uint64_t addr,
                                          unsigned char *handle) {
  ipcref__hip_mem_handle h;
  int code;
  memset(&h, 0, sizeof h);
  code = (int)d->api.IpcGetMemHandle(&h, (void *)(uintptr_t)addr);
  memcpy(handle, &h, IPCREF_HANDLE_BYTES);
  return code;
}
IPCREF__PRIVATE int ipcref__hip_d_ipc_open(ipcref__hip_state *d,
                                           const unsigned char *handle,
                                           uint64_t *addr) {
  ipcref__hip_mem_handle h;
  void *p = NULL;
  int code;
  memcpy(&h, handle, IPCREF_HANDLE_BYTES);
  code = (int)d->api.IpcOpenMemHandle(&p, h, d->lazy_peer);
  *addr = (uint64_t)(uintptr_t)p;
  return code;
}
IPCREF__PRIVATE int ipcref__hip_d_ipc_close(ipcref__hip_state *d,
                                            uint64_t addr) {
  return (int)d->api.IpcCloseMemHandle((void *)(uintptr_t)addr);
}
IPCREF__PRIVATE int ipcref__hip_d_event_new(ipcref__hip_state *d, int ipc,
                                            void **ev) {
  ipcref__hip_event e = NULL;
  int code = (int)d->api.EventCreateWithFlags(&e, IPCREF__HIP_EVENT_NO_TIMING);
  (void)ipc; /* never asked for: IPCREF__HIP_IPC_EVENTS is 0 */
  *ev = (void *)e;
  return code;
}
IPCREF__PRIVATE int ipcref__hip_d_event_handle(ipcref__hip_state *d, void *ev,
                                               unsigned char *handle) {
  (void)d;
  (void)ev;
  memset(handle, 0, IPCREF_HANDLE_BYTES);
  return 0;
}
IPCREF__PRIVATE int ipcref__hip_d_event_open(ipcref__hip_state *d,
                                             const unsigned char *handle,
                                             void **ev) {
  (void)d;
  (void)handle;
  *ev = NULL;
  return IPCREF__HIP_INVALID_CONTEXT; /* none are sent: never asked */
}
IPCREF__PRIVATE int ipcref__hip_d_event_record(ipcref__hip_state *d, void *ev,
                                               void *stream) {
  return (int)d->api.EventRecord((ipcref__hip_event)ev,
                                 (ipcref__hip_stream)stream);
}
IPCREF__PRIVATE int ipcref__hip_d_event_query(ipcref__hip_state *d, void *ev) {
  return (int)d->api.EventQuery((ipcref__hip_event)ev);
}
IPCREF__PRIVATE int ipcref__hip_d_event_destroy(ipcref__hip_state *d,
                                                void *ev) {
  return (int)d->api.EventDestroy((ipcref__hip_event)ev);
}
IPCREF__PRIVATE int ipcref__hip_d_stream_wait(ipcref__hip_state *d,
                                              void *stream, void *ev) {
  return (int)d->api.StreamWaitEvent((ipcref__hip_stream)stream,
                                     (ipcref__hip_event)ev, 0);
}
IPCREF__PRIVATE int ipcref__hip_d_stream_sync(ipcref__hip_state *d,
                                              void *stream) {
  return (int)d->api.StreamSynchronize((ipcref__hip_stream)stream);
}

/* The entry points, looked up by dlsym in this order (a runtime lacking
 * several is said to lack the first). */
#define IPCREF__HIP_ENTRY(field, optional)                                     \
  { "hip" #field, offsetof(ipcref__hip_api, field), optional }
static const ipcref__hip_entry ipcref__hip_entries[] = {
    IPCREF__HIP_ENTRY(Init, 0),
    IPCREF__HIP_ENTRY(GetDeviceCount, 0),
    IPCREF__HIP_ENTRY(RuntimeGetVersion, 0),
    IPCREF__HIP_ENTRY(GetErrorName, 0),
    IPCREF__HIP_ENTRY(SetDevice, 0),
    IPCREF__HIP_ENTRY(Malloc, 0),
    IPCREF__HIP_ENTRY(Free, 0),
    IPCREF__HIP_ENTRY(MemGetAddressRange, 0),
    IPCREF__HIP_ENTRY(PointerGetAttribute, 1), /* HIP 5.0 on */
    IPCREF__HIP_ENTRY(IpcGetMemHandle, 0),
    IPCREF__HIP_ENTRY(IpcOpenMemHandle, 0),
    IPCREF__HIP_ENTRY(IpcCloseMemHandle, 0),
    IPCREF__HIP_ENTRY(EventCreateWithFlags, 0),
    IPCREF__HIP_ENTRY(EventRecord, 0),
    IPCREF__HIP_ENTRY(EventQuery, 0),
    IPCREF__HIP_ENTRY(EventDestroy, 0),
    IPCREF__HIP_ENTRY(StreamWaitEvent, 0),
    IPCREF__HIP_ENTRY(StreamSynchronize, 0),
    IPCREF__HIP_ENTRY(DeviceSynchronize, 1),
    IPCREF__HIP_ENTRY(MemGetAllocationGranularity, 1),
    IPCREF__HIP_ENTRY(MemCreate, 1),
    IPCREF__HIP_ENTRY(MemRelease, 1),
    IPCREF__HIP_ENTRY(MemAddressReserve, 1),
    IPCREF__HIP_ENTRY(MemAddressFree, 1),
    IPCREF__HIP_ENTRY(MemMap, 1),
    IPCREF__HIP_ENTRY(MemUnmap, 1),
    IPCREF__HIP_ENTRY(MemSetAccess, 1),
    IPCREF__HIP_ENTRY(MemExportToShareableHandle, 1),
    IPCREF__HIP_ENTRY(MemImportFromShareableHandle, 1),
    IPCREF__HIP_ENTRY(MemRetainAllocationHandle, 1),
    IPCREF__HIP_ENTRY(MemGetAllocationPropertiesFromHandle, 1),
    IPCREF__HIP_ENTRY(MemPoolExportToShareableHandle, 1),
    IPCREF__HIP_ENTRY(MemPoolImportFromShareableHandle, 1),
    IPCREF__HIP_ENTRY(MemPoolExportPointer, 1),
    IPCREF__HIP_ENTRY(MemPoolImportPointer, 1),
    IPCREF__HIP_ENTRY(MemPoolSetAccess, 1),
    IPCREF__HIP_ENTRY(MemPoolDestroy, 1),
};
#undef IPCREF__HIP_ENTRY

/* An ipcref__hip_lookup: one entry point of library `lib` by dlsym. */
IPCREF__PRIVATE int ipcref__hip_d_lookup(void *lib, const char *name,
                                         void **fn) {
  *fn = dlsym(lib, name);
  return 0;
}

/* hipInit and a device count, then the version's choice of flags. 0 when
 * it failed, having said why. */
IPCREF__PRIVATE int ipcref__hip_d_init(ipcref__hip_state *d) {
  int code, count = 0, version = 0;
  code = (int)d->api.Init(0);
  if (!code) code = (int)d->api.GetDeviceCount(&count);
  if (code || count < 1) {
    snprintf(ipcref__hip_why, sizeof ipcref__hip_why, "%s: %s (%d)%s",
             code ? "hipInit/hipGetDeviceCount" : "hipGetDeviceCount",
             code ? ipcref__hip_d_errname(d, code) : "no device", code,
             code == IPCREF__HIP_NO_DEVICE || count < 1
                 ? ": no ROCm-capable device"
                 : "");
    return 0;
  }
  (void)d->api.RuntimeGetVersion(&version);
  d->version = version;
  d->lazy_peer = version >= IPCREF__HIP_VERSION_6 ? 1u : 0u;
  return 1;
}

/* Loads the runtime and every entry point (each one checked), then
 * hipInit and a device count. On failure, says why and leaves nothing
 * loaded. */
IPCREF__PRIVATE ipcref_result ipcref__hip_d_load(ipcref__hip_state *d,
                                                 const char *runtime_path) {
  static const char *const names[] = {"libamdhip64.so.7", "libamdhip64.so.6",
                                      "libamdhip64.so.5", "libamdhip64.so"};
  const ipcref__hip_entry *lacking;
  const char *path = runtime_path;
  int code;
  d->lib = ipcref__hip_load_library(runtime_path, names,
                                    sizeof names / sizeof *names, "HIP runtime",
                                    "libamdhip64.so.5 or later", &path);
  if (!d->lib) return IPCREF_ENODEV;
  lacking = ipcref__hip_load_entries(&d->api, ipcref__hip_entries,
                                     sizeof ipcref__hip_entries /
                                         sizeof *ipcref__hip_entries,
                                     ipcref__hip_d_lookup, d->lib, &code);
  if (lacking) {
    snprintf(ipcref__hip_why, sizeof ipcref__hip_why,
             "the HIP runtime %s lacks %s", path, lacking->name);
    return ipcref__hip_load_failed(&d->lib);
  }
  if (!ipcref__hip_d_init(d)) return ipcref__hip_load_failed(&d->lib);
  return IPCREF_OK;
}

IPCREF__PRIVATE void ipcref__hip_d_unload(ipcref__hip_state *d) {
  dlclose(d->lib);
}
