/* ipcref_cuda.h: the CUDA backend for ipcref's sharing layer.
 *
 * Include ipcref.h first; define IPCREF_CUDA_IMPLEMENTATION in the one file
 * that also defines IPCREF_IMPLEMENTATION. Nothing links against libcuda:
 * ipcref_cuda_open loads the driver at run time (dlopen "libcuda.so.1",
 * then cuGetProcAddress for every symbol at a pinned low version, each one
 * checked), so a program built with this header runs on a machine without
 * a GPU and gets IPCREF_ENODEV, with ipcref_cuda_error() saying why.
 *
 *     ipcref_cuda *cu;
 *     if (ipcref_cuda_open(NULL, &cu) != IPCREF_OK)
 *       fprintf(stderr, "no CUDA: %s\n", ipcref_cuda_error());
 *     ipcref_ctx_add_backend(ctx, ipcref_cuda_backend(cu));
 *     ipcref_cuda_alloc(ctx, 0, bytes, &buf);     (or ipcref_cuda_wrap)
 *     ... write it on `stream`, then ipcref_send_on(peer, &view, stream)
 *
 * What it does for the sharing layer (see ipcref_backend in ipcref.h):
 *   - device segments, from cuMemAlloc (legacy memory, shared by
 *     cuIpcGetMemHandle) or made with the virtual memory management calls
 *     (cuMemCreate, shareable by POSIX fd, reserved and mapped with
 *     cuMemAddressReserve / cuMemMap / cuMemSetAccess: VMM memory, whose
 *     fd crosses over SCM_RIGHTS and is imported with
 *     cuMemImportFromShareableHandle, needing no ptrace rights); by
 *     default VMM where the device says it can share by fd, legacy
 *     elsewhere (ipcref_cuda_set_memory). Blocks are cut from them as host
 *     blocks are from memfds, and an allocation that fails sweeps the
 *     limbo and retries first;
 *   - a pointer from any other allocator is found in its allocation with
 *     cuMemGetAddressRange; the allocation is exported once and the
 *     offset travels beside it: legacy memory by cuIpcGetMemHandle, VMM
 *     memory by fd (cuMemRetainAllocationHandle; a buffer across several
 *     chunks of one range, by an fd each), memory of a pool
 *     created shareable by its pool's fd and the pointer's export data
 *     (src/gpu_pool.h: each importer frees it before its lease returns);
 *   - cuIpcOpenMemHandle runs once per (exporter, allocation) in a process,
 *     counted, and cuIpcCloseMemHandle when the last user goes; a handle
 *     this process exported resolves to its own pointer (the driver refuses
 *     to open it here);
 *   - ordering: an interprocess event (CU_EVENT_INTERPROCESS |
 *     CU_EVENT_DISABLE_TIMING) is recorded on the producer's stream after
 *     its writes, and the consumer's stream waits on it. Events come from a
 *     pool and go back when the lease ends; they are destroyed only by
 *     ipcref_cuda_close, so an event handle a consumer still holds never
 *     names a destroyed event;
 *   - a consumer's release is fenced by an event on its stream and returned
 *     once the work using the buffer has completed; no thread waits.
 *
 * Each device's primary context is retained on first use and made current
 * on the calling thread for every driver call. */

#ifndef IPCREF_CUDA_H_INCLUDED
#define IPCREF_CUDA_H_INCLUDED

#ifndef IPCREF_HAVE_SHARING
#error                                                                         \
    "ipcref_cuda.h: include ipcref.h first (and do not define IPCREF_NO_SHARING)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ipcref_cuda ipcref_cuda;

/* Loads the CUDA driver: `driver_path` names the library (NULL:
 * "libcuda.so.1", found the usual way), then cuInit. Errors: EINVAL (out
 * NULL, driver_path longer than 255 bytes), ENOMEM, ENODEV (no driver library,
 * a driver older than CUDA 11.3, the toolkit's stub library, no device):
 * ipcref_cuda_error() says which; EBUSY (another driver path is loaded in this
 * process). There is one instance per process: opening again gives the same
 * one, counted. */
IPCREF_API ipcref_result ipcref_cuda_open(const char *driver_path,
                                          ipcref_cuda **out);

/* Why the last ipcref_cuda_open (or backend call) on this thread failed,
 * in English; "" when nothing failed. */
IPCREF_API const char *ipcref_cuda_error(void);

/* The backend to give ipcref_ctx_add_backend; NULL for NULL. */
IPCREF_API ipcref_backend *ipcref_cuda_backend(ipcref_cuda *cu);

/* Drops one open; the last releases the driver's contexts, the event
 * pool and the library. Every context the backend was added to must be
 * freed first. NULL: no-op. */
IPCREF_API void ipcref_cuda_close(ipcref_cuda *cu);

/* What ipcref_cuda_alloc's segments are made of (ipcref_cuda_set_memory). */
#define IPCREF_CUDA_MEMORY_AUTO                                                \
  0 /* VMM where the device reports POSIX fd handles                           \
       (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and            \
       _HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED), else legacy: the default \
     */
#define IPCREF_CUDA_MEMORY_LEGACY                                              \
  1 /* cuMemAlloc; shared by cuIpcGetMemHandle */
#define IPCREF_CUDA_MEMORY_VMM                                                 \
  2 /* cuMemCreate (size rounded up to the allocation granularity), shared by  \
       fd; a device that cannot share so makes ipcref_cuda_alloc say ENOTSUP   \
     */

/* Chooses what the segments made from now on are (those made before keep
 * theirs; a consumer maps either kind, whatever it chose): one of
 * IPCREF_CUDA_MEMORY_*. Errors: EINVAL (cu NULL, an unknown value). */
IPCREF_API ipcref_result ipcref_cuda_set_memory(ipcref_cuda *cu, int memory);

/* A shared device buffer of `size` bytes on device `device` (the backend
 * must be added to ctx): ipcref_device_new for CUDA. EINVAL: ctx or out
 * NULL, device negative. */
IPCREF_API ipcref_result ipcref_cuda_alloc(ipcref_ctx *ctx, int device,
                                           size_t size, ipcref_buf **out);

/* Adopts `size` bytes at device address `ptr` (a CUdeviceptr, cast) from
 * another allocator: ipcref_device_wrap for CUDA (see there). EINVAL:
 * ctx, out or ptr NULL, device negative, and as ipcref_device_wrap. */
IPCREF_API ipcref_result ipcref_cuda_wrap(
    ipcref_ctx *ctx, int device, void *ptr, size_t size,
    void (*release)(void *user, void *ptr), void *user, ipcref_buf **out);

#ifdef __cplusplus
}
#endif

#endif /* IPCREF_CUDA_H_INCLUDED */

/* @implementation */

/* ---- CUDA's part (the shared part is src/gpu.h) ---------------------------
 * ipcref__cu_d_* names a function of the driver's part ("d" for driver):
 * the ones src/gpu.h calls as ipcref__gpu_d_*, each wrapping one driver
 * call, and the loader's steps.
 *
 * The driver's types: with <cuda.h> included first, its own, and the
 * compiler checks each entry point below against the header's prototype;
 * without it, the same layouts (a CUipcMemHandle is a 64-byte struct passed
 * by value). */
#include <dlfcn.h>

#ifdef CUDA_VERSION
typedef CUresult ipcref__cu_result;
typedef CUdevice ipcref__cu_device;
typedef CUcontext ipcref__cu_context;
typedef CUdeviceptr ipcref__cu_ptr;
typedef CUevent ipcref__cu_event;
typedef CUstream ipcref__cu_stream;
typedef CUipcMemHandle ipcref__cu_mem_handle;
typedef CUipcEventHandle ipcref__cu_event_handle;
typedef CUpointer_attribute ipcref__cu_attr;
typedef CUdriverProcAddressQueryResult ipcref__cu_query;
typedef CUdevice_attribute ipcref__cu_dev_attr;
typedef CUmemGenericAllocationHandle ipcref__cu_vmm_handle;
typedef CUmemAllocationProp ipcref__cu_mem_prop;
typedef CUmemAccessDesc ipcref__cu_access;
typedef CUmemAllocationHandleType ipcref__cu_handle_type;
typedef CUmemAllocationGranularity_flags ipcref__cu_granularity;
typedef CUmemAllocationType ipcref__cu_alloc_type;
typedef CUmemLocationType ipcref__cu_location_type;
typedef CUmemAccess_flags ipcref__cu_access_flags;
typedef CUmemoryPool ipcref__cu_mempool;
typedef CUmemPoolPtrExportData ipcref__cu_mempool_data;
#else
typedef int ipcref__cu_result;
typedef int ipcref__cu_device;
typedef struct ipcref__cu_ctx_st *ipcref__cu_context;
typedef unsigned long long ipcref__cu_ptr;
typedef struct ipcref__cu_event_st *ipcref__cu_event;
typedef struct ipcref__cu_stream_st *ipcref__cu_stream;
typedef struct {
  char reserved[64];
} ipcref__cu_mem_handle;
typedef struct {
  char reserved[64];
} ipcref__cu_event_handle;
typedef int ipcref__cu_attr;
typedef int ipcref__cu_query;
typedef int ipcref__cu_dev_attr;
typedef unsigned long long ipcref__cu_vmm_handle;
typedef int ipcref__cu_handle_type;
typedef int ipcref__cu_granularity;
typedef int ipcref__cu_alloc_type;
typedef int ipcref__cu_location_type;
typedef int ipcref__cu_access_flags;
typedef struct ipcref__cu_mempool_st *ipcref__cu_mempool;
typedef struct {
  unsigned char reserved[64];
} ipcref__cu_mempool_data;
typedef struct {
  ipcref__cu_location_type type;
  int id;
} ipcref__cu_location;
typedef struct { /* CUmemAllocationProp's layout */
  ipcref__cu_alloc_type type;
  ipcref__cu_handle_type requestedHandleTypes;
  ipcref__cu_location location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType, gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} ipcref__cu_mem_prop;
typedef struct { /* CUmemAccessDesc's layout */
  ipcref__cu_location location;
  ipcref__cu_access_flags flags;
} ipcref__cu_access;
#endif

/* The numbers used here (cuda.h), and what the shared part needs. */
#define IPCREF__CU_OOM              2   /* CUDA_ERROR_OUT_OF_MEMORY */
#define IPCREF__CU_STUB             34  /* CUDA_ERROR_STUB_LIBRARY */
#define IPCREF__CU_NO_DEVICE        100 /* CUDA_ERROR_NO_DEVICE */
#define IPCREF__CU_INVALID_CONTEXT  201 /* CUDA_ERROR_INVALID_CONTEXT */
#define IPCREF__CU_NOT_READY        600 /* CUDA_ERROR_NOT_READY */
#define IPCREF__CU_NOT_SUPPORTED    801 /* CUDA_ERROR_NOT_SUPPORTED */
#define IPCREF__CU_IPC_EVENTS       1   /* interprocess events exist */
#define IPCREF__CU_DEVICE_TYPE      IPCREF_DEVICE_CUDA
#define IPCREF__CU_NAME             "cuda"
#define IPCREF__CU_DEVICES          64
#define IPCREF__CU_EVENT_NO_TIMING  0x2 /* CU_EVENT_DISABLE_TIMING */
#define IPCREF__CU_EVENT_IPC        0x4 /* CU_EVENT_INTERPROCESS */
#define IPCREF__CU_LAZY_PEER        0x1 /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */
#define IPCREF__CU_ATTR_IPC_CAPABLE 10  /* ..._IS_LEGACY_CUDA_IPC_CAPABLE */
#define IPCREF__CU_PROC_VERSION     12000 /* covers every symbol used */
#define IPCREF__CU_VMM_AUTO         1 /* VMM by default where it can share */
#define IPCREF__CU_ATTR_VMM         102 /* ..._VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
#define IPCREF__CU_ATTR_POSIX_FD                                               \
  103 /* CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
#define IPCREF__CU_HANDLE_POSIX_FD                                             \
  0x1 /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
#define IPCREF__CU_ALLOC_PINNED    0x1 /* CU_MEM_ALLOCATION_TYPE_PINNED */
#define IPCREF__CU_LOCATION_DEVICE 0x1 /* CU_MEM_LOCATION_TYPE_DEVICE */
#define IPCREF__CU_GRANULARITY_MIN 0x0 /* CU_MEM_ALLOC_GRANULARITY_MINIMUM */
#define IPCREF__CU_PROT_READ       0x1 /* CU_MEM_ACCESS_FLAGS_PROT_READ */
#define IPCREF__CU_PROT_READWRITE  0x3 /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
#define IPCREF__CU_ATTR_MEMPOOL    17  /* CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE */

typedef ipcref__cu_result (*ipcref__cu_get_proc_v2)(const char *, void **, int,
                                                    unsigned long long,
                                                    ipcref__cu_query *);
typedef ipcref__cu_result (*ipcref__cu_get_proc_v1)(const char *, void **, int,
                                                    unsigned long long);

/* The entry points, by the names cuGetProcAddress knows them by. */
typedef struct ipcref__cu_api {
  ipcref__cu_result (*Init)(unsigned int);
  ipcref__cu_result (*DriverGetVersion)(int *);
  ipcref__cu_result (*GetErrorName)(ipcref__cu_result, const char **);
  ipcref__cu_result (*DeviceGet)(ipcref__cu_device *, int);
  ipcref__cu_result (*DevicePrimaryCtxRetain)(ipcref__cu_context *,
                                              ipcref__cu_device);
  ipcref__cu_result (*DevicePrimaryCtxRelease)(ipcref__cu_device);
  ipcref__cu_result (*CtxSetCurrent)(ipcref__cu_context);
  ipcref__cu_result (*MemAlloc)(ipcref__cu_ptr *, size_t);
  ipcref__cu_result (*MemFree)(ipcref__cu_ptr);
  ipcref__cu_result (*MemGetAddressRange)(ipcref__cu_ptr *, size_t *,
                                          ipcref__cu_ptr);
  ipcref__cu_result (*PointerGetAttribute)(void *, ipcref__cu_attr,
                                           ipcref__cu_ptr);
  ipcref__cu_result (*IpcGetMemHandle)(ipcref__cu_mem_handle *, ipcref__cu_ptr);
  ipcref__cu_result (*IpcOpenMemHandle)(ipcref__cu_ptr *, ipcref__cu_mem_handle,
                                        unsigned int);
  ipcref__cu_result (*IpcCloseMemHandle)(ipcref__cu_ptr);
  ipcref__cu_result (*EventCreate)(ipcref__cu_event *, unsigned int);
  ipcref__cu_result (*EventRecord)(ipcref__cu_event, ipcref__cu_stream);
  ipcref__cu_result (*EventQuery)(ipcref__cu_event);
  ipcref__cu_result (*EventDestroy)(ipcref__cu_event);
  ipcref__cu_result (*IpcGetEventHandle)(ipcref__cu_event_handle *,
                                         ipcref__cu_event);
  ipcref__cu_result (*IpcOpenEventHandle)(ipcref__cu_event *,
                                          ipcref__cu_event_handle);
  ipcref__cu_result (*StreamWaitEvent)(ipcref__cu_stream, ipcref__cu_event,
                                       unsigned int);
  ipcref__cu_result (*StreamSynchronize)(ipcref__cu_stream);
  /* Virtual memory management: optional (without one of them, no device
   * shares memory by fd). */
  ipcref__cu_result (*DeviceGetAttribute)(int *, ipcref__cu_dev_attr,
                                          ipcref__cu_device);
  ipcref__cu_result (*CtxSynchronize)(void);
  ipcref__cu_result (*MemGetAllocationGranularity)(size_t *,
                                                   const ipcref__cu_mem_prop *,
                                                   ipcref__cu_granularity);
  ipcref__cu_result (*MemCreate)(ipcref__cu_vmm_handle *, size_t,
                                 const ipcref__cu_mem_prop *,
                                 unsigned long long);
  ipcref__cu_result (*MemRelease)(ipcref__cu_vmm_handle);
  ipcref__cu_result (*MemAddressReserve)(ipcref__cu_ptr *, size_t, size_t,
                                         ipcref__cu_ptr, unsigned long long);
  ipcref__cu_result (*MemAddressFree)(ipcref__cu_ptr, size_t);
  ipcref__cu_result (*MemMap)(ipcref__cu_ptr, size_t, size_t,
                              ipcref__cu_vmm_handle, unsigned long long);
  ipcref__cu_result (*MemUnmap)(ipcref__cu_ptr, size_t);
  ipcref__cu_result (*MemSetAccess)(ipcref__cu_ptr, size_t,
                                    const ipcref__cu_access *, size_t);
  ipcref__cu_result (*MemExportToShareableHandle)(void *, ipcref__cu_vmm_handle,
                                                  ipcref__cu_handle_type,
                                                  unsigned long long);
  ipcref__cu_result (*MemImportFromShareableHandle)(ipcref__cu_vmm_handle *,
                                                    void *,
                                                    ipcref__cu_handle_type);
  ipcref__cu_result (*MemRetainAllocationHandle)(ipcref__cu_vmm_handle *,
                                                 void *);
  ipcref__cu_result (*MemGetAllocationPropertiesFromHandle)(
      ipcref__cu_mem_prop *, ipcref__cu_vmm_handle);
  /* Stream-ordered pools: optional too (without one, no pool memory is
   * shared). */
  ipcref__cu_result (*MemPoolExportToShareableHandle)(void *,
                                                      ipcref__cu_mempool,
                                                      ipcref__cu_handle_type,
                                                      unsigned long long);
  ipcref__cu_result (*MemPoolImportFromShareableHandle)(ipcref__cu_mempool *,
                                                        void *,
                                                        ipcref__cu_handle_type,
                                                        unsigned long long);
  ipcref__cu_result (*MemPoolExportPointer)(ipcref__cu_mempool_data *,
                                            ipcref__cu_ptr);
  ipcref__cu_result (*MemPoolImportPointer)(ipcref__cu_ptr *,
                                            ipcref__cu_mempool,
                                            ipcref__cu_mempool_data *);
  ipcref__cu_result (*MemPoolSetAccess)(ipcref__cu_mempool,
                                        const ipcref__cu_access *, size_t);
  ipcref__cu_result (*MemPoolDestroy)(ipcref__cu_mempool);
} ipcref__cu_api;

#ifdef CUDA_VERSION
/* Each pointer type against the real prototype: a mismatch is a
 * diagnostic (distinct pointer types), and sizeof keeps it from linking. */
#define IPCREF__CU_CHECK(field, fn)                                            \
  (void)sizeof(((ipcref__cu_api *)0)->field == &fn)
IPCREF__PRIVATE void ipcref__cu_check_prototypes(void) {
  IPCREF__CU_CHECK(Init, cuInit);
  IPCREF__CU_CHECK(DriverGetVersion, cuDriverGetVersion);
  IPCREF__CU_CHECK(GetErrorName, cuGetErrorName);
  IPCREF__CU_CHECK(DeviceGet, cuDeviceGet);
  IPCREF__CU_CHECK(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
  IPCREF__CU_CHECK(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease);
  IPCREF__CU_CHECK(CtxSetCurrent, cuCtxSetCurrent);
  IPCREF__CU_CHECK(MemAlloc, cuMemAlloc);
  IPCREF__CU_CHECK(MemFree, cuMemFree);
  IPCREF__CU_CHECK(MemGetAddressRange, cuMemGetAddressRange);
  IPCREF__CU_CHECK(PointerGetAttribute, cuPointerGetAttribute);
  IPCREF__CU_CHECK(IpcGetMemHandle, cuIpcGetMemHandle);
  IPCREF__CU_CHECK(IpcOpenMemHandle, cuIpcOpenMemHandle);
  IPCREF__CU_CHECK(IpcCloseMemHandle, cuIpcCloseMemHandle);
  IPCREF__CU_CHECK(EventCreate, cuEventCreate);
  IPCREF__CU_CHECK(EventRecord, cuEventRecord);
  IPCREF__CU_CHECK(EventQuery, cuEventQuery);
  IPCREF__CU_CHECK(EventDestroy, cuEventDestroy);
  IPCREF__CU_CHECK(IpcGetEventHandle, cuIpcGetEventHandle);
  IPCREF__CU_CHECK(IpcOpenEventHandle, cuIpcOpenEventHandle);
  IPCREF__CU_CHECK(StreamWaitEvent, cuStreamWaitEvent);
  IPCREF__CU_CHECK(StreamSynchronize, cuStreamSynchronize);
  IPCREF__CU_CHECK(DeviceGetAttribute, cuDeviceGetAttribute);
  IPCREF__CU_CHECK(CtxSynchronize, cuCtxSynchronize);
  IPCREF__CU_CHECK(MemGetAllocationGranularity, cuMemGetAllocationGranularity);
  IPCREF__CU_CHECK(MemCreate, cuMemCreate);
  IPCREF__CU_CHECK(MemRelease, cuMemRelease);
  IPCREF__CU_CHECK(MemAddressReserve, cuMemAddressReserve);
  IPCREF__CU_CHECK(MemAddressFree, cuMemAddressFree);
  IPCREF__CU_CHECK(MemMap, cuMemMap);
  IPCREF__CU_CHECK(MemUnmap, cuMemUnmap);
  IPCREF__CU_CHECK(MemSetAccess, cuMemSetAccess);
  IPCREF__CU_CHECK(MemExportToShareableHandle, cuMemExportToShareableHandle);
  IPCREF__CU_CHECK(MemImportFromShareableHandle,
                   cuMemImportFromShareableHandle);
  IPCREF__CU_CHECK(MemRetainAllocationHandle, cuMemRetainAllocationHandle);
  IPCREF__CU_CHECK(MemGetAllocationPropertiesFromHandle,
                   cuMemGetAllocationPropertiesFromHandle);
  IPCREF__CU_CHECK(MemPoolExportToShareableHandle,
                   cuMemPoolExportToShareableHandle);
  IPCREF__CU_CHECK(MemPoolImportFromShareableHandle,
                   cuMemPoolImportFromShareableHandle);
  IPCREF__CU_CHECK(MemPoolExportPointer, cuMemPoolExportPointer);
  IPCREF__CU_CHECK(MemPoolImportPointer, cuMemPoolImportPointer);
  IPCREF__CU_CHECK(MemPoolSetAccess, cuMemPoolSetAccess);
  IPCREF__CU_CHECK(MemPoolDestroy, cuMemPoolDestroy);
  (void)sizeof(
      char[sizeof(CUmemPoolPtrExportData) == IPCREF_HANDLE_BYTES ? 1 : -1]);
  (void)sizeof(char[sizeof(CUipcMemHandle) == IPCREF_HANDLE_BYTES ? 1 : -1]);
}
#endif

/* The loaded driver: its entry points, and each device's primary context
 * (retained on first use). */
typedef struct ipcref__cu_state {
  void *lib;
  ipcref__cu_api api;
  pthread_mutex_t lock;
  ipcref__cu_context ctx[IPCREF__CU_DEVICES];
  ipcref__cu_device devs[IPCREF__CU_DEVICES];
} ipcref__cu_state;

IPCREF__PRIVATE const char *ipcref__cu_d_errname(ipcref__cu_state *d,
                                                 int code) {
  const char *name = NULL;
  if (d->api.GetErrorName)
    (void)d->api.GetErrorName((ipcref__cu_result)code, &name);
  return name ? name : "CUDA error";
}

/* Makes device `dev`'s primary context current on this thread. */
IPCREF__PRIVATE int ipcref__cu_d_use(ipcref__cu_state *d, int dev) {
  ipcref__cu_context c;
  int code = 0;
  pthread_mutex_lock(&d->lock);
  c = d->ctx[dev];
  if (!c) {
    ipcref__cu_device dv;
    code = (int)d->api.DeviceGet(&dv, dev);
    if (!code) code = (int)d->api.DevicePrimaryCtxRetain(&c, dv);
    if (!code) {
      d->ctx[dev] = c;
      d->devs[dev] = dv;
    }
  }
  pthread_mutex_unlock(&d->lock);
  return code ? code : (int)d->api.CtxSetCurrent(c);
}

/* One function per driver call the shared part makes. */
IPCREF__PRIVATE int ipcref__cu_d_alloc(ipcref__cu_state *d, size_t size,
                                       uint64_t *addr) {
  ipcref__cu_ptr p = 0;
  int code = (int)d->api.MemAlloc(&p, size);
  *addr = (uint64_t)p;
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_free(ipcref__cu_state *d, uint64_t addr) {
  return (int)d->api.MemFree((ipcref__cu_ptr)addr);
}
IPCREF__PRIVATE int ipcref__cu_d_range(ipcref__cu_state *d, uint64_t addr,
                                       uint64_t *base, size_t *size) {
  ipcref__cu_ptr b = 0;
  int code = (int)d->api.MemGetAddressRange(&b, size, (ipcref__cu_ptr)addr);
  *base = (uint64_t)b;
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_ipc_capable(ipcref__cu_state *d,
                                             uint64_t addr) {
  int capable = 1;
  (void)d->api.PointerGetAttribute(&capable,
                                   (ipcref__cu_attr)IPCREF__CU_ATTR_IPC_CAPABLE,
                                   (ipcref__cu_ptr)addr);
  return capable != 0;
}
IPCREF__PRIVATE int ipcref__cu_d_ipc_get(ipcref__cu_state *d, uint64_t addr,
                                         unsigned char *handle) {
  ipcref__cu_mem_handle h;
  int code;
  memset(&h, 0, sizeof h);
  code = (int)d->api.IpcGetMemHandle(&h, (ipcref__cu_ptr)addr);
  memcpy(handle, &h, IPCREF_HANDLE_BYTES);
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_ipc_open(ipcref__cu_state *d,
                                          const unsigned char *handle,
                                          uint64_t *addr) {
  ipcref__cu_mem_handle h;
  ipcref__cu_ptr p = 0;
  int code;
  memcpy(&h, handle, IPCREF_HANDLE_BYTES);
  code = (int)d->api.IpcOpenMemHandle(&p, h, IPCREF__CU_LAZY_PEER);
  *addr = (uint64_t)p;
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_ipc_close(ipcref__cu_state *d, uint64_t addr) {
  return (int)d->api.IpcCloseMemHandle((ipcref__cu_ptr)addr);
}
IPCREF__PRIVATE int ipcref__cu_d_event_new(ipcref__cu_state *d, int ipc,
                                           void **ev) {
  ipcref__cu_event e = NULL;
  int code = (int)d->api.EventCreate(&e, IPCREF__CU_EVENT_NO_TIMING |
                                             (ipc ? IPCREF__CU_EVENT_IPC : 0));
  *ev = (void *)e;
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_event_handle(ipcref__cu_state *d, void *ev,
                                              unsigned char *handle) {
  ipcref__cu_event_handle h;
  int code;
  memset(&h, 0, sizeof h);
  code = (int)d->api.IpcGetEventHandle(&h, (ipcref__cu_event)ev);
  memcpy(handle, &h, IPCREF_HANDLE_BYTES);
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_event_open(ipcref__cu_state *d,
                                            const unsigned char *handle,
                                            void **ev) {
  ipcref__cu_event_handle h;
  ipcref__cu_event e = NULL;
  int code;
  memcpy(&h, handle, IPCREF_HANDLE_BYTES);
  code = (int)d->api.IpcOpenEventHandle(&e, h);
  *ev = (void *)e;
  return code;
}
IPCREF__PRIVATE int ipcref__cu_d_event_record(ipcref__cu_state *d, void *ev,
                                              void *stream) {
  return (int)d->api.EventRecord((ipcref__cu_event)ev,
                                 (ipcref__cu_stream)stream);
}
IPCREF__PRIVATE int ipcref__cu_d_event_query(ipcref__cu_state *d, void *ev) {
  return (int)d->api.EventQuery((ipcref__cu_event)ev);
}
IPCREF__PRIVATE int ipcref__cu_d_event_destroy(ipcref__cu_state *d, void *ev) {
  return (int)d->api.EventDestroy((ipcref__cu_event)ev);
}
IPCREF__PRIVATE int ipcref__cu_d_stream_wait(ipcref__cu_state *d, void *stream,
                                             void *ev) {
  return (int)d->api.StreamWaitEvent((ipcref__cu_stream)stream,
                                     (ipcref__cu_event)ev, 0);
}
IPCREF__PRIVATE int ipcref__cu_d_stream_sync(ipcref__cu_state *d,
                                             void *stream) {
  return (int)d->api.StreamSynchronize((ipcref__cu_stream)stream);
}
