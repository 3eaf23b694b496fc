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

#if defined(IPCREF_CUDA_IMPLEMENTATION) &&                                     \
    !defined(IPCREF_CUDA_IMPLEMENTATION_INCLUDED)
#define IPCREF_CUDA_IMPLEMENTATION_INCLUDED

/* ---- gpu: shared backend logic, first part (src/gpu.h) ------------------ */

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The longest failure message kept, with its terminating NUL. */
#define IPCREF__CU_WHY_BYTES 256

/* Why the last failure on this thread happened, for ipcref_cuda_error(). */
static __thread char ipcref__cu_why[IPCREF__CU_WHY_BYTES];

IPCREF__PRIVATE ipcref_result ipcref__cu_say(ipcref_result r,
                                             const char *what) {
  snprintf(ipcref__cu_why, sizeof ipcref__cu_why, "%s", what);
  return r;
}

/* ---- loading the driver (the driver's loader uses these) ----------------- */

/* One entry point of the driver's table of them (its api struct): the name
 * it is looked up by, where its pointer goes (offsetof the field), and
 * whether a driver may lack it (its pointer then stays NULL). */
typedef struct ipcref__cu_entry {
  const char *name;
  size_t offset;
  int optional;
} ipcref__cu_entry;

/* Looks up entry point `name`: 0 with *fn set (NULL when the driver has no
 * such symbol), or the driver's error number. */
typedef int (*ipcref__cu_lookup)(void *user, const char *name, void **fn);

/* Symbol `name` of `lib` into the function pointer at `slot` (NULL when
 * absent). dlsym gives objects; POSIX makes them functions (memcpy: ISO C
 * has no cast between the two). */
IPCREF__PRIVATE void ipcref__cu_load_symbol(void *lib, const char *name,
                                            void *slot) {
  void *sym = dlsym(lib, name);
  memcpy(slot, &sym, sizeof sym);
}

/* Opens the driver's library: `path`, or else the first of the `n` `names`
 * that loads; *opened is the name tried last (the one loaded, on success).
 * On failure says why, naming the library as `what` ("CUDA driver") and,
 * without a path, what was looked for as `wanted`, and returns NULL. */
IPCREF__PRIVATE void *ipcref__cu_load_library(const char *path,
                                              const char *const *names,
                                              size_t n, const char *what,
                                              const char *wanted,
                                              const char **opened) {
  const char *const *candidates = path ? &path : names;
  size_t count = path ? 1 : n, i;
  const char *e;
  void *lib = NULL;
  for (i = 0; i < count && !lib; i++)
    lib = dlopen(*opened = candidates[i], RTLD_NOW | RTLD_LOCAL);
  if (lib) return lib;
  e = dlerror();
  snprintf(ipcref__cu_why, sizeof ipcref__cu_why,
           "the %s library could not be loaded (%s): %s", what,
           path ? path : wanted, e ? e : "not found");
  return NULL;
}

/* Fills the api struct at `api` from the `n` `entries`, in order, with
 * `lookup`. Returns the first entry that failed, *code saying how (the
 * lookup's error, or 0 for a required entry point missing), or NULL when
 * every one is in. Pointers are stored as ipcref__cu_load_symbol does. */
IPCREF__PRIVATE const ipcref__cu_entry *
ipcref__cu_load_entries(void *api, const ipcref__cu_entry *entries, size_t n,
                        ipcref__cu_lookup lookup, void *user, int *code) {
  size_t i;
  for (i = 0; i < n; i++) {
    void *fn = NULL;
    *code = lookup(user, entries[i].name, &fn);
    if (*code || (!fn && !entries[i].optional)) return &entries[i];
    memcpy((char *)api + entries[i].offset, &fn, sizeof fn);
  }
  return NULL;
}

/* The end of a load that failed (it said why): nothing stays loaded. */
IPCREF__PRIVATE ipcref_result ipcref__cu_load_failed(void **lib) {
  dlclose(*lib);
  *lib = NULL;
  return IPCREF_ENODEV;
}

/* ---- cuda: driver (src/cuda.h) ------------------------------------------ */

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

/* ---- cuda_vmm: driver (src/cuda_vmm.h) ---------------------------------- */

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

/* ---- cuda_load: driver (src/cuda_load.h) -------------------------------- */

/* The stub library's message (cuda's own text says too little). */
IPCREF__PRIVATE ipcref_result ipcref__cu_stub(const char *path) {
  snprintf(ipcref__cu_why, sizeof ipcref__cu_why,
           "%s is the CUDA toolkit's stub library, not a driver "
           "(CUDA_ERROR_STUB_LIBRARY, 34)",
           path);
  return IPCREF_ENODEV;
}

/* The entry points looked up with cuGetProcAddress, in this order (a driver
 * lacking several is said to lack the first); every one is required. */
#define IPCREF__CU_ENTRY(field)                                                \
  { "cu" #field, offsetof(ipcref__cu_api, field), 0 }
#define IPCREF__CU_OPTIONAL(field)                                             \
  { "cu" #field, offsetof(ipcref__cu_api, field), 1 }
static const ipcref__cu_entry ipcref__cu_entries[] = {
    IPCREF__CU_ENTRY(Init),
    IPCREF__CU_ENTRY(GetErrorName),
    IPCREF__CU_ENTRY(DeviceGet),
    IPCREF__CU_ENTRY(DevicePrimaryCtxRetain),
    IPCREF__CU_ENTRY(DevicePrimaryCtxRelease),
    IPCREF__CU_ENTRY(CtxSetCurrent),
    IPCREF__CU_ENTRY(MemAlloc),
    IPCREF__CU_ENTRY(MemFree),
    IPCREF__CU_ENTRY(MemGetAddressRange),
    IPCREF__CU_ENTRY(PointerGetAttribute),
    IPCREF__CU_ENTRY(IpcGetMemHandle),
    IPCREF__CU_ENTRY(IpcOpenMemHandle),
    IPCREF__CU_ENTRY(IpcCloseMemHandle),
    IPCREF__CU_ENTRY(EventCreate),
    IPCREF__CU_ENTRY(EventRecord),
    IPCREF__CU_ENTRY(EventQuery),
    IPCREF__CU_ENTRY(EventDestroy),
    IPCREF__CU_ENTRY(IpcGetEventHandle),
    IPCREF__CU_ENTRY(IpcOpenEventHandle),
    IPCREF__CU_ENTRY(StreamWaitEvent),
    IPCREF__CU_ENTRY(StreamSynchronize),
    IPCREF__CU_ENTRY(DriverGetVersion),
    IPCREF__CU_OPTIONAL(DeviceGetAttribute),
    IPCREF__CU_OPTIONAL(CtxSynchronize),
    IPCREF__CU_OPTIONAL(MemGetAllocationGranularity),
    IPCREF__CU_OPTIONAL(MemCreate),
    IPCREF__CU_OPTIONAL(MemRelease),
    IPCREF__CU_OPTIONAL(MemAddressReserve),
    IPCREF__CU_OPTIONAL(MemAddressFree),
    IPCREF__CU_OPTIONAL(MemMap),
    IPCREF__CU_OPTIONAL(MemUnmap),
    IPCREF__CU_OPTIONAL(MemSetAccess),
    IPCREF__CU_OPTIONAL(MemExportToShareableHandle),
    IPCREF__CU_OPTIONAL(MemImportFromShareableHandle),
    IPCREF__CU_OPTIONAL(MemRetainAllocationHandle),
    IPCREF__CU_OPTIONAL(MemGetAllocationPropertiesFromHandle),
    IPCREF__CU_OPTIONAL(MemPoolExportToShareableHandle),
    IPCREF__CU_OPTIONAL(MemPoolImportFromShareableHandle),
    IPCREF__CU_OPTIONAL(MemPoolExportPointer),
    IPCREF__CU_OPTIONAL(MemPoolImportPointer),
    IPCREF__CU_OPTIONAL(MemPoolSetAccess),
    IPCREF__CU_OPTIONAL(MemPoolDestroy),
};
#undef IPCREF__CU_ENTRY
#undef IPCREF__CU_OPTIONAL

/* cuGetProcAddress (the _v2 one where the driver has it) and the version
 * every entry point is looked up at. */
typedef struct ipcref__cu_proc {
  ipcref__cu_get_proc_v2 get2;
  ipcref__cu_get_proc_v1 get1;
  int version;
} ipcref__cu_proc;

/* An ipcref__cu_lookup: one entry point by cuGetProcAddress. */
IPCREF__PRIVATE int ipcref__cu_d_lookup(void *user, const char *name,
                                        void **fn) {
  ipcref__cu_proc *p = (ipcref__cu_proc *)user;
  ipcref__cu_query q = (ipcref__cu_query)0;
  return p->get2 ? (int)p->get2(name, fn, p->version, 0, &q)
                 : (int)p->get1(name, fn, p->version, 0);
}

/* Finds cuGetProcAddress and asks the driver its version (capped at the
 * pinned one). Symbols go by their base names at that version: cuda.h's
 * macros do not apply to strings (dlsym "cuMemAlloc" is the 32-bit v1
 * ABI). 0 when it failed, having said why. */
IPCREF__PRIVATE int ipcref__cu_d_proc(ipcref__cu_state *d, const char *path,
                                      ipcref__cu_proc *p) {
  int code;
  p->version = 0;
  ipcref__cu_load_symbol(d->lib, "cuGetProcAddress_v2", &p->get2);
  ipcref__cu_load_symbol(d->lib, "cuGetProcAddress", &p->get1);
  ipcref__cu_load_symbol(d->lib, "cuDriverGetVersion",
                         &d->api.DriverGetVersion);
  if ((!p->get2 && !p->get1) || !d->api.DriverGetVersion) {
    ipcref__cu_say(IPCREF_ENODEV, "the CUDA driver has no cuGetProcAddress "
                                  "(it is older than CUDA 11.3)");
    return 0;
  }
  code = (int)d->api.DriverGetVersion(&p->version);
  if (code == IPCREF__CU_STUB) {
    ipcref__cu_stub(path);
    return 0;
  }
  if (code) {
    snprintf(ipcref__cu_why, sizeof ipcref__cu_why,
             "cuDriverGetVersion failed (%d)", code);
    return 0;
  }
  if (p->version > IPCREF__CU_PROC_VERSION)
    p->version = IPCREF__CU_PROC_VERSION;
  return 1;
}

/* cuInit. 0 when it failed, having said why. */
IPCREF__PRIVATE int ipcref__cu_d_init(ipcref__cu_state *d, const char *path) {
  int code = (int)d->api.Init(0);
  if (code == IPCREF__CU_STUB) {
    ipcref__cu_stub(path);
    return 0;
  }
  if (code) {
    snprintf(ipcref__cu_why, sizeof ipcref__cu_why, "cuInit: %s (%d)%s",
             ipcref__cu_d_errname(d, code), code,
             code == IPCREF__CU_NO_DEVICE ? ": no CUDA-capable device" : "");
    return 0;
  }
  return 1;
}

/* Loads the driver and every entry point (each one checked), then cuInit.
 * On failure, says why and leaves nothing loaded. */
IPCREF__PRIVATE ipcref_result ipcref__cu_d_load(ipcref__cu_state *d,
                                                const char *driver_path) {
  static const char *const names[] = {"libcuda.so.1"};
  const ipcref__cu_entry *lacking;
  const char *path = driver_path;
  ipcref__cu_proc proc;
  int code;
  d->lib =
      ipcref__cu_load_library(driver_path, names, sizeof names / sizeof *names,
                              "CUDA driver", names[0], &path);
  if (!d->lib) return IPCREF_ENODEV;
  if (!ipcref__cu_d_proc(d, path, &proc))
    return ipcref__cu_load_failed(&d->lib);
  lacking = ipcref__cu_load_entries(&d->api, ipcref__cu_entries,
                                    sizeof ipcref__cu_entries /
                                        sizeof *ipcref__cu_entries,
                                    ipcref__cu_d_lookup, &proc, &code);
  if (lacking) {
    if (code == IPCREF__CU_STUB)
      ipcref__cu_stub(path);
    else
      snprintf(ipcref__cu_why, sizeof ipcref__cu_why,
               "the CUDA driver lacks %s (cuGetProcAddress: %d)", lacking->name,
               code);
    return ipcref__cu_load_failed(&d->lib);
  }
  if (!ipcref__cu_d_init(d, path)) return ipcref__cu_load_failed(&d->lib);
  if (pthread_mutex_init(&d->lock, NULL) != 0) {
    ipcref__cu_say(IPCREF_ESYS, "pthread_mutex_init failed");
    return ipcref__cu_load_failed(&d->lib);
  }
  return IPCREF_OK;
}

IPCREF__PRIVATE void ipcref__cu_d_unload(ipcref__cu_state *d) {
  int i;
  for (i = 0; i < IPCREF__CU_DEVICES; i++)
    if (d->ctx[i]) (void)d->api.DevicePrimaryCtxRelease(d->devs[i]);
  pthread_mutex_destroy(&d->lock);
  dlclose(d->lib);
}

/* ---- gpu: shared backend logic (src/gpu.h) ------------------------------ */

/* ---- the backend's state ------------------------------------------------- */

/* An interprocess event of the pool, with its handle made once. */
typedef struct ipcref__cu_ipc_event {
  void *ev;
  int dev;
  unsigned char handle[IPCREF_HANDLE_BYTES];
  struct ipcref__cu_ipc_event *next; /* the free list */
} ipcref__cu_ipc_event;

/* An allocation opened from another process, counted. */
typedef struct ipcref__cu_open {
  unsigned char handle[IPCREF_HANDLE_BYTES];
  int dev;
  uint64_t addr;
  int refs;
  struct ipcref__cu_open *next;
} ipcref__cu_open;

/* An allocation this process exported, so that its handle resolves here. */
typedef struct ipcref__cu_export {
  unsigned char handle[IPCREF_HANDLE_BYTES];
  uint64_t base;
  int refs; /* segments exported with it (contexts that wrap it: several) */
  struct ipcref__cu_export *next;
} ipcref__cu_export;

struct ipcref_cuda {
  ipcref_backend backend; /* first: the backend's pointer is ours */
  int refs;               /* opens of this one instance */
  int pid;                /* the process it belongs to (not a fork's) */
  char path[256];         /* the driver it loaded ("" for the default) */
  ipcref__cu_state drv;
  pthread_mutex_t lock;
  ipcref__cu_ipc_event *free_events; /* the pool: events not in use */
  ipcref__cu_open *opens;
  ipcref__cu_export *exports;
  int memory; /* IPCREF_CUDA_MEMORY_*: what ipcref_cuda_alloc makes */
  signed char vmm_able[IPCREF__CU_DEVICES];     /* shares by fd: 1, not: -1 */
  struct ipcref__cu_vmm *vmm_made, *vmm_opened; /* see src/gpu_vmm.h */
  struct ipcref__cu_pool *pools_out, *pools_in; /* see src/gpu_pool.h */
  struct ipcref__cu_pool_ptr *pool_ptrs, *pool_sent;
};

#define IPCREF__CU_OF(be) ((ipcref_cuda *)(void *)(be))

IPCREF__PRIVATE void ipcref__cu_event_free(ipcref_backend *be, void *event);

/* Records a failed driver call for ipcref_cuda_error(); returns `r`. */
IPCREF__PRIVATE ipcref_result ipcref__cu_fail(ipcref_result r, const char *what,
                                              ipcref_cuda *g, int code) {
  snprintf(ipcref__cu_why, sizeof ipcref__cu_why, "%s: %s (%d)", what,
           ipcref__cu_d_errname(&g->drv, code), code);
  return r;
}

IPCREF_API const char *ipcref_cuda_error(void) {
  return ipcref__cu_why;
}

/* A driver error as an ipcref code. */
IPCREF__PRIVATE ipcref_result ipcref__cu_code(int code) {
  if (code == 0) return IPCREF_OK;
  if (code == IPCREF__CU_OOM) return IPCREF_ENOMEM;
  if (code == IPCREF__CU_NO_DEVICE) return IPCREF_ENODEV;
  return IPCREF_EINVAL;
}

/* Makes device `dev` current on this thread. */
IPCREF__PRIVATE ipcref_result ipcref__cu_on(ipcref_cuda *g, int dev) {
  int code;
  if (dev < 0 || dev >= IPCREF__CU_DEVICES)
    return ipcref__cu_say(IPCREF_ENODEV, "device ordinal out of range");
  code = ipcref__cu_d_use(&g->drv, dev);
  return code ? ipcref__cu_fail(IPCREF_ENODEV, "selecting the device", g, code)
              : IPCREF_OK;
}

/* ---- gpu_pool: pool memory shared by fd (src/gpu_pool.h) ---------------- */

/* A pool this process exported, or imported; a pointer exported or
 * imported. */
typedef struct ipcref__cu_pool {
  uint64_t pool;   /* the driver's handle */
  int fd;          /* exported: the fd every peer gets a copy of */
  dev_t fd_dev;    /* imported: the file its fd opens */
  ino_t fd_ino;    /* (see above) */
  int dev, access; /* imported: the device, and its access (2: read-write) */
  struct ipcref__cu_pool *next;
} ipcref__cu_pool;

typedef struct ipcref__cu_pool_ptr {
  uint64_t addr;
  int dev;
  unsigned char data[IPCREF_HANDLE_BYTES]; /* exported: its export data */
  struct ipcref__cu_pool_ptr *next;
} ipcref__cu_pool_ptr;

/* The fd of pool `pool`, exported once (under the lock): -1 with *r set
 * when the pool was not created shareable. */
IPCREF__PRIVATE int ipcref__cu_pool_fd(ipcref_cuda *g, uint64_t pool,
                                       ipcref_result *r) {
  ipcref__cu_pool *p;
  int code, fd = -1;
  for (p = g->pools_out; p; p = p->next)
    if (p->pool == pool) return p->fd;
  code = ipcref__cu_d_pool_export(&g->drv, pool, &fd);
  if (code) {
    *r = ipcref__cu_say(IPCREF_EINVAL,
                        "memory of a pool not created shareable: create "
                        "the pool with handleTypes "
                        "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR "
                        "(cuMemPoolCreate; a device's default pool is not)");
    return -1;
  }
  p = (ipcref__cu_pool *)IPCREF_MALLOC(sizeof *p);
  if (!p) {
    close(fd);
    *r = IPCREF_ENOMEM;
    return -1;
  }
  memset(p, 0, sizeof *p);
  p->pool = pool;
  p->fd = fd;
  p->next = g->pools_out;
  g->pools_out = p;
  return fd;
}

/* Remembers that this process exported `addr` as `data` (under the lock;
 * one record per address, so that the list is as long as the addresses
 * ever sent). 0 when out of memory. */
IPCREF__PRIVATE int ipcref__cu_pool_own(ipcref_cuda *g, int dev, uint64_t addr,
                                        const unsigned char *data) {
  ipcref__cu_pool_ptr *x;
  for (x = g->pool_sent; x; x = x->next)
    if (x->addr == addr && x->dev == dev) break;
  if (!x) {
    x = (ipcref__cu_pool_ptr *)IPCREF_MALLOC(sizeof *x);
    if (!x) return 0;
    x->addr = addr;
    x->dev = dev;
    x->next = g->pool_sent;
    g->pool_sent = x;
  }
  memcpy(x->data, data, IPCREF_HANDLE_BYTES);
  return 1;
}

/* Exports the pool memory at `base`: a copy of its pool's fd, and its
 * data. ENOTSUP for memory that is not from a pool. */
IPCREF__PRIVATE ipcref_result ipcref__cu_pool_export(ipcref_cuda *g, int dev,
                                                     uint64_t base, int *fd,
                                                     unsigned char *data) {
  uint64_t pool;
  ipcref_result r = IPCREF_OK;
  int code, pfd;
  if (!ipcref__cu_d_pool_supported(&g->drv) ||
      !(pool = ipcref__cu_d_pool_of(&g->drv, base)))
    return IPCREF_ENOTSUP;
  pthread_mutex_lock(&g->lock); /* the pool first: its error says more */
  pfd = ipcref__cu_pool_fd(g, pool, &r);
  code = pfd < 0 ? 0 : ipcref__cu_d_pool_export_ptr(&g->drv, base, data);
  if (code)
    r = ipcref__cu_fail(ipcref__cu_code(code), "exporting the pointer", g,
                        code);
  if (r == IPCREF_OK && !ipcref__cu_pool_own(g, dev, base, data))
    r = IPCREF_ENOMEM;
  if (r == IPCREF_OK &&
      (*fd = fcntl(pfd, F_DUPFD_CLOEXEC, 0)) < 0) /* the same open file */
    r = ipcref__cu_say(IPCREF_ESYS, "dup of the pool's fd failed");
  pthread_mutex_unlock(&g->lock);
  return r;
}

/* The imported pool that `fd` opens (by its file), imported now if new
 * and given the access asked (under the lock): 0 with *code set. */
IPCREF__PRIVATE uint64_t ipcref__cu_pool_in(ipcref_cuda *g, int dev, int fd,
                                            int writable, int *code) {
  ipcref__cu_pool *p;
  struct stat st;
  int access = writable ? 2 : 1;
  *code = -1;
  if (fstat(fd, &st) != 0) return 0;
  for (p = g->pools_in; p; p = p->next)
    if (p->fd_dev == st.st_dev && p->fd_ino == st.st_ino && p->dev == dev)
      break;
  if (!p) {
    p = (ipcref__cu_pool *)IPCREF_MALLOC(sizeof *p);
    if (!p) return 0;
    memset(p, 0, sizeof *p);
    *code = ipcref__cu_d_pool_import(&g->drv, fd, &p->pool);
    if (*code) {
      IPCREF_FREE(p);
      return 0;
    }
    p->fd = -1;
    p->fd_dev = st.st_dev;
    p->fd_ino = st.st_ino;
    p->dev = dev;
    p->next = g->pools_in;
    g->pools_in = p;
  }
  if (p->access < access) { /* an imported pool starts with no access */
    *code = ipcref__cu_d_pool_access(&g->drv, p->pool, dev, writable);
    if (*code) return 0;
    p->access = access;
  }
  *code = 0;
  return p->pool;
}

/* This process's own pointer that `data` names (0: none). */
IPCREF__PRIVATE uint64_t ipcref__cu_pool_mine(ipcref_cuda *g, int dev,
                                              const unsigned char *data) {
  ipcref__cu_pool_ptr *x;
  uint64_t addr = 0;
  pthread_mutex_lock(&g->lock);
  for (x = g->pool_sent; x && !addr; x = x->next)
    if (x->dev == dev && !memcmp(x->data, data, IPCREF_HANDLE_BYTES))
      addr = x->addr;
  pthread_mutex_unlock(&g->lock);
  return addr;
}

/* 1 when the pool allocation at `addr` starts there and holds `size`
 * bytes, as the driver says. */
IPCREF__PRIVATE int ipcref__cu_pool_fits(ipcref_cuda *g, uint64_t addr,
                                         uint64_t size) {
  uint64_t base = 0;
  size_t have = 0;
  return !ipcref__cu_d_range(&g->drv, addr, &base, &have) && base == addr &&
         (uint64_t)have >= size;
}

/* Imports the pool memory `fd` (its pool's) and `data` name, `size` bytes
 * at least (checked against the allocation the driver gives: EPROTO). */
IPCREF__PRIVATE ipcref_result ipcref__cu_pool_import(
    ipcref_cuda *g, int dev, int fd, const unsigned char *data, uint64_t size,
    int writable, uint64_t *addr) {
  ipcref__cu_pool_ptr *x;
  uint64_t pool;
  int code;
  if ((*addr = ipcref__cu_pool_mine(g, dev, data)) != 0) /* our own */
    return ipcref__cu_pool_fits(g, *addr, size)
               ? IPCREF_OK
               : ipcref__cu_say(IPCREF_EPROTO, "pool memory smaller than "
                                               "its record says");
  if (!ipcref__cu_d_pool_supported(&g->drv))
    return ipcref__cu_say(IPCREF_ENODEV, "the driver shares no pool memory");
  x = (ipcref__cu_pool_ptr *)IPCREF_MALLOC(sizeof *x);
  if (!x) return IPCREF_ENOMEM;
  memset(x, 0, sizeof *x);
  pthread_mutex_lock(&g->lock);
  pool = ipcref__cu_pool_in(g, dev, fd, writable, &code);
  pthread_mutex_unlock(&g->lock);
  if (pool) code = ipcref__cu_d_pool_import_ptr(&g->drv, pool, data, addr);
  if (!pool || code) {
    IPCREF_FREE(x);
    return code == IPCREF__CU_OOM
               ? IPCREF_ENOMEM
               : ipcref__cu_fail(IPCREF_EPROTO,
                                 pool ? "importing the pointer"
                                      : "importing the pool",
                                 g, code);
  }
  if (!ipcref__cu_pool_fits(g, *addr, size)) {
    (void)ipcref__cu_d_free(&g->drv, *addr);
    IPCREF_FREE(x);
    return ipcref__cu_say(IPCREF_EPROTO, "pool memory smaller than its "
                                         "record says");
  }
  x->addr = *addr;
  x->dev = dev;
  pthread_mutex_lock(&g->lock);
  x->next = g->pool_ptrs;
  g->pool_ptrs = x;
  pthread_mutex_unlock(&g->lock);
  return IPCREF_OK;
}

/* Frees the imported pool pointer at `addr`: 1, or 0 when it is not one. */
IPCREF__PRIVATE int ipcref__cu_pool_close(ipcref_cuda *g, int dev,
                                          uint64_t addr) {
  ipcref__cu_pool_ptr **pp, *x = NULL;
  pthread_mutex_lock(&g->lock);
  for (pp = &g->pool_ptrs; *pp; pp = &(*pp)->next)
    if ((*pp)->addr == addr && (*pp)->dev == dev) {
      x = *pp;
      *pp = x->next;
      break;
    }
  pthread_mutex_unlock(&g->lock);
  if (!x) return 0;
  if (ipcref__cu_on(g, dev) == IPCREF_OK)
    (void)ipcref__cu_d_free(&g->drv, addr);
  IPCREF_FREE(x);
  return 1;
}

/* At ipcref_cuda_close: the pointers imported are freed, the pools
 * imported destroyed, the exported pools' fds closed. */
IPCREF__PRIVATE void ipcref__cu_pool_close_all(ipcref_cuda *g) {
  ipcref__cu_pool *p;
  ipcref__cu_pool_ptr *x;
  while ((x = g->pool_ptrs) != NULL) {
    g->pool_ptrs = x->next;
    if (ipcref__cu_on(g, x->dev) == IPCREF_OK)
      (void)ipcref__cu_d_free(&g->drv, x->addr);
    IPCREF_FREE(x);
  }
  while ((x = g->pool_sent) != NULL) {
    g->pool_sent = x->next;
    IPCREF_FREE(x);
  }
  while ((p = g->pools_in) != NULL) {
    g->pools_in = p->next;
    (void)ipcref__cu_d_pool_destroy(&g->drv, p->pool);
    IPCREF_FREE(p);
  }
  while ((p = g->pools_out) != NULL) {
    g->pools_out = p->next;
    close(p->fd);
    IPCREF_FREE(p);
  }
}

/* ---- gpu_vmm: memory shared by fd (src/gpu_vmm.h) ----------------------- */

/* One mapped allocation: made here (g->vmm_made) or imported
 * (g->vmm_opened). */
typedef struct ipcref__cu_vmm {
  uint64_t addr, handle; /* the mapping; the allocation's handle */
  size_t size;           /* of the mapping (whole granules) */
  int dev;
  int n; /* imported in chunks: how many were mapped (handle unused) */
  uint64_t chunk_h[IPCREF_CHUNKS_MAX];
  size_t chunk_size[IPCREF_CHUNKS_MAX];
  int exported; /* made here and exported: the file its fd opens */
  dev_t fd_dev; /* (st_dev, st_ino of that fd), to know the fd when */
  ino_t fd_ino; /* it comes back to this process */
  struct ipcref__cu_vmm *next;
} ipcref__cu_vmm;

/* 1 when device `dev` can make memory shareable by fd: asked of the
 * driver once (its attributes), then remembered. */
IPCREF__PRIVATE int ipcref__cu_vmm_able(ipcref_cuda *g, int dev) {
  signed char known;
  pthread_mutex_lock(&g->lock);
  known = g->vmm_able[dev];
  pthread_mutex_unlock(&g->lock);
  if (known) return known > 0;
  known = ipcref__cu_d_vmm_supported(&g->drv, dev) ? 1 : -1;
  pthread_mutex_lock(&g->lock);
  g->vmm_able[dev] = known;
  pthread_mutex_unlock(&g->lock);
  return known > 0;
}

/* 1 when a segment of device `dev` is to be VMM memory (the device is
 * current on this thread). */
IPCREF__PRIVATE int ipcref__cu_vmm_wanted(ipcref_cuda *g, int dev) {
  int memory;
  pthread_mutex_lock(&g->lock);
  memory = g->memory;
  pthread_mutex_unlock(&g->lock);
  if (memory == IPCREF_CUDA_MEMORY_LEGACY) return 0;
  return memory == IPCREF_CUDA_MEMORY_VMM ||
         (IPCREF__CU_VMM_AUTO && ipcref__cu_vmm_able(g, dev));
}

/* `size` rounded up to device `dev`'s granularity into *out: 0, or the
 * driver's error (or -1 when the sum overflows). */
IPCREF__PRIVATE int ipcref__cu_vmm_round(ipcref_cuda *g, int dev, uint64_t size,
                                         size_t *out) {
  size_t gran = 0;
  int code = ipcref__cu_d_vmm_granularity(&g->drv, dev, &gran);
  if (code) return code;
  if (gran == 0 || size > (uint64_t)PTRDIFF_MAX - gran) return -1;
  *out = (size_t)((size + gran - 1) / gran * gran);
  return 0;
}

/* Undoes a mapping, in the order the driver documents: the work queued on
 * it is waited for first (unmapping does not wait for it), then unmapped,
 * the allocation's handle released (the memory goes with its last
 * mapping and handle, in every process), the range given back. */
IPCREF__PRIVATE void ipcref__cu_vmm_undo(ipcref_cuda *g,
                                         const ipcref__cu_vmm *m, int mapped) {
  if (m->n) { /* chunks: each mapped one, then the range */
    uint64_t at = m->addr;
    int i;
    (void)ipcref__cu_d_sync(&g->drv);
    for (i = 0; i < m->n; i++) {
      (void)ipcref__cu_d_vmm_unmap(&g->drv, at, m->chunk_size[i]);
      (void)ipcref__cu_d_vmm_release(&g->drv, m->chunk_h[i]);
      at += m->chunk_size[i];
    }
    (void)ipcref__cu_d_vmm_unreserve(&g->drv, m->addr, m->size);
    return;
  }
  if (mapped) {
    (void)ipcref__cu_d_sync(&g->drv);
    (void)ipcref__cu_d_vmm_unmap(&g->drv, m->addr, m->size);
  }
  if (m->handle) (void)ipcref__cu_d_vmm_release(&g->drv, m->handle);
  if (m->addr) (void)ipcref__cu_d_vmm_unreserve(&g->drv, m->addr, m->size);
}

/* Maps allocation m->handle (m->size bytes) into a range of its own, with
 * the access given; on failure undoes what it did but the handle. 0, or
 * the driver's error (*what says which step). */
IPCREF__PRIVATE int ipcref__cu_vmm_place(ipcref_cuda *g, ipcref__cu_vmm *m,
                                         int writable, const char **what) {
  int code;
  *what = "reserving an address range";
  code = ipcref__cu_d_vmm_reserve(&g->drv, m->size, &m->addr);
  if (code) {
    m->addr = 0;
    return code;
  }
  *what = "mapping the allocation";
  code = ipcref__cu_d_vmm_map(&g->drv, m->addr, m->size, m->handle);
  if (!code) {
    *what = "setting the mapping's access";
    code = ipcref__cu_d_vmm_access(&g->drv, m->addr, m->size, m->dev, writable);
    if (code) (void)ipcref__cu_d_vmm_unmap(&g->drv, m->addr, m->size);
  }
  if (code) {
    (void)ipcref__cu_d_vmm_unreserve(&g->drv, m->addr, m->size);
    m->addr = 0;
  }
  return code;
}

/* Puts mapping record `m` on a list (under the lock). */
IPCREF__PRIVATE void ipcref__cu_vmm_push(ipcref_cuda *g, ipcref__cu_vmm **list,
                                         ipcref__cu_vmm *m) {
  pthread_mutex_lock(&g->lock);
  m->next = *list;
  *list = m;
  pthread_mutex_unlock(&g->lock);
}

/* Takes the record of the mapping at `addr` off a list: NULL when it is
 * not there. */
IPCREF__PRIVATE ipcref__cu_vmm *ipcref__cu_vmm_take(ipcref_cuda *g,
                                                    ipcref__cu_vmm **list,
                                                    int dev, uint64_t addr) {
  ipcref__cu_vmm **pp, *m = NULL;
  pthread_mutex_lock(&g->lock);
  for (pp = list; *pp; pp = &(*pp)->next)
    if ((*pp)->addr == addr && (*pp)->dev == dev) {
      m = *pp;
      *pp = m->next;
      break;
    }
  pthread_mutex_unlock(&g->lock);
  return m;
}

/* A segment of VMM memory: `size` rounded up to whole granules, made
 * shareable by fd, mapped read-write for device `dev` (current). */
IPCREF__PRIVATE ipcref_result ipcref__cu_vmm_alloc(ipcref_cuda *g, int dev,
                                                   size_t size,
                                                   uint64_t *addr) {
  ipcref__cu_vmm *m;
  const char *what = "finding the allocation granularity";
  int code;
  if (!ipcref__cu_vmm_able(g, dev))
    return ipcref__cu_say(IPCREF_ENOTSUP,
                          "the device cannot share memory by fd (virtual "
                          "memory management with POSIX fd handles): "
                          "choose legacy memory (set_memory)");
  m = (ipcref__cu_vmm *)IPCREF_MALLOC(sizeof *m);
  if (!m) return IPCREF_ENOMEM;
  memset(m, 0, sizeof *m);
  m->dev = dev;
  code = ipcref__cu_vmm_round(g, dev, size, &m->size);
  if (!code) {
    what = "allocating";
    code = ipcref__cu_d_vmm_create(&g->drv, dev, m->size, &m->handle);
  }
  if (!code) code = ipcref__cu_vmm_place(g, m, 1, &what);
  if (code) {
    ipcref__cu_vmm_undo(g, m, 0);
    IPCREF_FREE(m);
    if (code < 0) return ipcref__cu_say(IPCREF_ENOMEM, "size too large");
    return ipcref__cu_fail(ipcref__cu_code(code), what, g, code);
  }
  ipcref__cu_vmm_push(g, &g->vmm_made, m);
  *addr = m->addr;
  return IPCREF_OK;
}

/* Frees the VMM segment at `addr`: 1, or 0 when it is not one. */
IPCREF__PRIVATE int ipcref__cu_vmm_free(ipcref_cuda *g, int dev,
                                        uint64_t addr) {
  ipcref__cu_vmm *m = ipcref__cu_vmm_take(g, &g->vmm_made, dev, addr);
  if (!m) return 0;
  ipcref__cu_vmm_undo(g, m, 1);
  IPCREF_FREE(m);
  return 1;
}

/* An fd for the VMM allocation another allocator mapped at `base` (a
 * wrapped pointer: PyTorch's expandable segments, NCCL's buffers): found
 * with cuMemRetainAllocationHandle, exported, released. ENOTSUP for
 * memory that is not VMM; EINVAL, saying so, for VMM memory made without
 * the POSIX fd handle type (it can never be shared by fd). */
IPCREF__PRIVATE ipcref_result ipcref__cu_vmm_export_foreign(ipcref_cuda *g,
                                                            uint64_t base,
                                                            int *fd) {
  uint64_t h = 0;
  int fd_ok = 0, code = ipcref__cu_d_vmm_retain(&g->drv, base, &h, &fd_ok);
  if (code) return IPCREF_ENOTSUP; /* not VMM: legacy IPC's */
  if (!fd_ok) {
    (void)ipcref__cu_d_vmm_release(&g->drv, h);
    return ipcref__cu_say(IPCREF_EINVAL,
                          "VMM memory made without the POSIX fd handle type "
                          "(its allocator must ask for it in "
                          "requestedHandleTypes): it cannot be shared");
  }
  code = ipcref__cu_d_vmm_export(&g->drv, h, fd);
  (void)ipcref__cu_d_vmm_release(&g->drv, h);
  if (code) {
    *fd = -1;
    return ipcref__cu_fail(ipcref__cu_code(code),
                           "exporting the allocation as an fd", g, code);
  }
  return IPCREF_OK;
}

/* The backend's seg_export_fd: an fd for the VMM segment at `base`, made
 * here or by another allocator, or for the pool memory there (its pool's
 * fd and its data: *pooled); ENOTSUP for memory shared by handle. The
 * sharing layer exports and frees a segment under its context's lock, so
 * the record found stays while it is used. */
IPCREF__PRIVATE ipcref_result ipcref__cu_seg_export_fd(ipcref_backend *be,
                                                       int32_t dev,
                                                       uint64_t base, int *fd,
                                                       unsigned char *data,
                                                       int *pooled) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref__cu_vmm *m;
  struct stat st;
  ipcref_result r = ipcref__cu_on(g, dev);
  int code;
  *fd = -1;
  *pooled = 0;
  if (r != IPCREF_OK) return r;
  pthread_mutex_lock(&g->lock);
  for (m = g->vmm_made; m && (m->addr != base || m->dev != dev); m = m->next) {
  }
  pthread_mutex_unlock(&g->lock);
  if (!m) { /* another allocator's: VMM, or a pool's */
    r = ipcref__cu_vmm_export_foreign(g, base, fd);
    if (r != IPCREF_ENOTSUP) return r;
    r = ipcref__cu_pool_export(g, dev, base, fd, data);
    *pooled = r == IPCREF_OK;
    return r;
  }
  code = ipcref__cu_d_vmm_export(&g->drv, m->handle, fd);
  if (code) {
    *fd = -1;
    return ipcref__cu_fail(ipcref__cu_code(code),
                           "exporting the allocation as an fd", g, code);
  }
  if (fstat(*fd, &st) == 0) { /* see ipcref__cu_vmm_own */
    pthread_mutex_lock(&g->lock);
    m->exported = 1;
    m->fd_dev = st.st_dev;
    m->fd_ino = st.st_ino;
    pthread_mutex_unlock(&g->lock);
  }
  return IPCREF_OK;
}

/* The address of this process's own VMM segment that `fd` was exported
 * from (0: none). The sharing layer keeps each exported fd open, and a
 * peer that sends it back sends the same open file: its identity tells,
 * whatever the driver's files are. Its own memory resolves to its own
 * mapping, as a legacy handle does, instead of a second mapping. */
IPCREF__PRIVATE uint64_t ipcref__cu_vmm_own(ipcref_cuda *g, int dev, int fd,
                                            size_t *size) {
  ipcref__cu_vmm *m;
  struct stat st;
  uint64_t addr = 0;
  if (fstat(fd, &st) != 0) return 0;
  pthread_mutex_lock(&g->lock);
  for (m = g->vmm_made; m && !addr; m = m->next)
    if (m->exported && m->dev == dev && m->fd_dev == st.st_dev &&
        m->fd_ino == st.st_ino) {
      addr = m->addr;
      *size = m->size;
    }
  pthread_mutex_unlock(&g->lock);
  return addr;
}

/* A new record of an import on device `dev`, which must map memory shared
 * by fd: ENODEV, said, when it cannot. */
IPCREF__PRIVATE ipcref_result ipcref__cu_vmm_new(ipcref_cuda *g, int dev,
                                                 ipcref__cu_vmm **out) {
  ipcref__cu_vmm *m;
  if (!ipcref__cu_vmm_able(g, dev))
    return ipcref__cu_say(IPCREF_ENODEV, "the device cannot map memory "
                                         "shared by fd");
  m = (ipcref__cu_vmm *)IPCREF_MALLOC(sizeof *m);
  if (!m) return IPCREF_ENOMEM;
  memset(m, 0, sizeof *m);
  m->dev = dev;
  *out = m;
  return IPCREF_OK;
}

/* The backend's seg_import_fd: the allocation `fd` shares, mapped at
 * `size` rounded up to whole granules (the driver refuses a mapping past
 * the allocation's end, so a record that claims more than was shared is
 * refused), with read or read-write access for device `dev`; or the pool
 * memory `fd` (its pool's) and `data` name. Whatever the driver refuses
 * of the fd is the peer's fault: EPROTO, but for out of memory. */
IPCREF__PRIVATE ipcref_result ipcref__cu_seg_import_fd(
    ipcref_backend *be, int32_t dev, int fd, const unsigned char *data,
    int pooled, uint64_t size, int writable, uint64_t *addr) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref__cu_vmm *m;
  const char *what = "importing the fd";
  size_t own_size = 0;
  ipcref_result r = ipcref__cu_on(g, dev);
  int code;
  if (r != IPCREF_OK) return r;
  if (pooled)
    return ipcref__cu_pool_import(g, dev, fd, data, size, writable, addr);
  if ((*addr = ipcref__cu_vmm_own(g, dev, fd, &own_size)) != 0)
    return size <= own_size
               ? IPCREF_OK
               : ipcref__cu_say(IPCREF_EPROTO, "a size past the allocation's");
  if ((r = ipcref__cu_vmm_new(g, dev, &m)) != IPCREF_OK) return r;
  code = ipcref__cu_d_vmm_import(&g->drv, fd, &m->handle);
  if (!code) {
    what = "finding the allocation granularity";
    code = ipcref__cu_vmm_round(g, dev, size, &m->size);
  }
  if (!code) code = ipcref__cu_vmm_place(g, m, writable, &what);
  if (code) {
    ipcref__cu_vmm_undo(g, m, 0);
    IPCREF_FREE(m);
    if (code < 0)
      return ipcref__cu_say(IPCREF_EPROTO, "a shared size out of range");
    return ipcref__cu_fail(
        code == IPCREF__CU_OOM ? IPCREF_ENOMEM : IPCREF_EPROTO, what, g, code);
  }
  ipcref__cu_vmm_push(g, &g->vmm_opened, m);
  *addr = m->addr;
  return IPCREF_OK;
}

/* The backend's seg_export_chunks: an fd for each VMM chunk another
 * allocator mapped one after the other from `base` (PyTorch's expandable
 * segments), each found and exported as a single one is; all or none. */
IPCREF__PRIVATE ipcref_result
ipcref__cu_seg_export_chunks(ipcref_backend *be, int32_t dev, uint64_t base,
                             const uint64_t *sizes, int n, int *fds) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref_result r = ipcref__cu_on(g, dev);
  uint64_t at = base;
  int i;
  for (i = 0; i < n; i++) fds[i] = -1;
  for (i = 0; i < n && r == IPCREF_OK; i++) {
    r = ipcref__cu_vmm_export_foreign(g, at, &fds[i]);
    if (r == IPCREF_ENOTSUP)
      r = ipcref__cu_say(IPCREF_EINVAL, "a buffer across allocations that "
                                        "are not VMM memory");
    at += sizes[i];
  }
  if (r != IPCREF_OK)
    for (i = 0; i < n; i++)
      if (fds[i] >= 0) {
        close(fds[i]);
        fds[i] = -1;
      }
  return r;
}

/* Maps chunk i of `m` (imported from fds[i]) at its place: 0, or the
 * driver's error (*what says which step). */
IPCREF__PRIVATE int ipcref__cu_vmm_chunk(ipcref_cuda *g, ipcref__cu_vmm *m,
                                         int fd, uint64_t at, int writable,
                                         const char **what) {
  size_t size = m->chunk_size[m->n];
  uint64_t h = 0;
  int code;
  *what = "importing a chunk's fd";
  code = ipcref__cu_d_vmm_import(&g->drv, fd, &h);
  if (code) return code;
  *what = "mapping a chunk";
  code = ipcref__cu_d_vmm_map(&g->drv, at, size, h);
  if (!code) {
    *what = "setting a chunk's access";
    code = ipcref__cu_d_vmm_access(&g->drv, at, size, m->dev, writable);
    if (code) (void)ipcref__cu_d_vmm_unmap(&g->drv, at, size);
  }
  if (code) {
    (void)ipcref__cu_d_vmm_release(&g->drv, h);
    return code;
  }
  m->chunk_h[m->n++] = h;
  return 0;
}

/* The backend's seg_import_chunks: the `n` chunks the fds share, mapped
 * one after the other in one range of this process's, with read or
 * read-write access for device `dev`. What the driver refuses is the
 * peer's fault (EPROTO), but for out of memory. */
IPCREF__PRIVATE ipcref_result ipcref__cu_seg_import_chunks(
    ipcref_backend *be, int32_t dev, const int *fds, const uint64_t *sizes,
    int n, int writable, uint64_t *addr) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref__cu_vmm *m;
  const char *what = "reserving an address range";
  ipcref_result r = ipcref__cu_on(g, dev);
  uint64_t at;
  int i, code;
  if (r != IPCREF_OK) return r;
  if (n < 1 || n > IPCREF_CHUNKS_MAX) return IPCREF_EPROTO; /* checked */
  if ((r = ipcref__cu_vmm_new(g, dev, &m)) != IPCREF_OK) return r;
  for (i = 0; i < n; i++) { /* the sum was checked against the record's */
    m->chunk_size[i] = (size_t)sizes[i];
    m->size += (size_t)sizes[i];
  }
  code = ipcref__cu_d_vmm_reserve(&g->drv, m->size, &m->addr);
  for (i = 0, at = m->addr; !code && i < n; at += sizes[i++])
    code = ipcref__cu_vmm_chunk(g, m, fds[i], at, writable, &what);
  if (code) {
    if (m->addr && m->n)
      ipcref__cu_vmm_undo(g, m, 1);
    else if (m->addr)
      (void)ipcref__cu_d_vmm_unreserve(&g->drv, m->addr, m->size);
    IPCREF_FREE(m);
    return ipcref__cu_fail(
        code == IPCREF__CU_OOM ? IPCREF_ENOMEM : IPCREF_EPROTO, what, g, code);
  }
  ipcref__cu_vmm_push(g, &g->vmm_opened, m);
  *addr = m->addr;
  return IPCREF_OK;
}

/* Closes an imported VMM mapping or pool pointer at `addr`: 1, or 0 when
 * it is neither. */
IPCREF__PRIVATE int ipcref__cu_vmm_close(ipcref_cuda *g, int dev,
                                         uint64_t addr) {
  ipcref__cu_vmm *m = ipcref__cu_vmm_take(g, &g->vmm_opened, dev, addr);
  if (!m) return ipcref__cu_pool_close(g, dev, addr);
  if (ipcref__cu_on(g, dev) == IPCREF_OK) ipcref__cu_vmm_undo(g, m, 1);
  IPCREF_FREE(m);
  return 1;
}

/* At ipcref_cuda_close: what is still mapped goes (the contexts that used
 * it are gone: see ipcref_cuda_close). */
IPCREF__PRIVATE void ipcref__cu_vmm_close_all(ipcref_cuda *g) {
  ipcref__cu_vmm **lists[2], *m;
  int i;
  ipcref__cu_pool_close_all(g);
  lists[0] = &g->vmm_made;
  lists[1] = &g->vmm_opened;
  for (i = 0; i < 2; i++)
    while ((m = *lists[i]) != NULL) {
      *lists[i] = m->next;
      if (ipcref__cu_on(g, m->dev) == IPCREF_OK) ipcref__cu_vmm_undo(g, m, 1);
      IPCREF_FREE(m);
    }
}

/* ---- segments ------------------------------------------------------------ */

IPCREF__PRIVATE ipcref_result ipcref__cu_seg_alloc(ipcref_backend *be,
                                                   int32_t dev, size_t size,
                                                   uint64_t *addr) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref_result r = ipcref__cu_on(g, dev);
  int code;
  if (r != IPCREF_OK) return r;
  if (ipcref__cu_vmm_wanted(g, dev))
    return ipcref__cu_vmm_alloc(g, dev, size, addr);
  code = ipcref__cu_d_alloc(&g->drv, size, addr);
  return code ? ipcref__cu_fail(ipcref__cu_code(code), "allocating", g, code)
              : IPCREF_OK;
}

IPCREF__PRIVATE void ipcref__cu_seg_free(ipcref_backend *be, int32_t dev,
                                         uint64_t addr) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref__cu_export **pp;
  pthread_mutex_lock(&g->lock); /* its handle no longer names it */
  for (pp = &g->exports; *pp; pp = &(*pp)->next)
    if ((*pp)->base == addr) {
      ipcref__cu_export *x = *pp;
      *pp = x->next;
      IPCREF_FREE(x);
      break;
    }
  pthread_mutex_unlock(&g->lock);
  if (ipcref__cu_on(g, dev) == IPCREF_OK && !ipcref__cu_vmm_free(g, dev, addr))
    (void)ipcref__cu_d_free(&g->drv, addr);
}

/* A wrapped allocation's segment went (its memory stays its owner's, who
 * may free it, and the driver may give its address to another): once no
 * segment is exported with it, its handle no longer names it here. */
IPCREF__PRIVATE void ipcref__cu_seg_forget(ipcref_backend *be, int32_t dev,
                                           uint64_t base) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref__cu_export **pp;
  (void)dev;
  pthread_mutex_lock(&g->lock);
  for (pp = &g->exports; *pp; pp = &(*pp)->next)
    if ((*pp)->base == base) {
      ipcref__cu_export *x = *pp;
      if (--x->refs == 0) {
        *pp = x->next;
        IPCREF_FREE(x);
      }
      break;
    }
  pthread_mutex_unlock(&g->lock);
}

IPCREF__PRIVATE ipcref_result ipcref__cu_seg_range(ipcref_backend *be,
                                                   int32_t dev, uint64_t addr,
                                                   uint64_t *base,
                                                   size_t *size) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref_result r = ipcref__cu_on(g, dev);
  int code;
  if (r != IPCREF_OK) return r;
  code = ipcref__cu_d_range(&g->drv, addr, base, size);
  return code ? ipcref__cu_fail(IPCREF_EINVAL,
                                "finding the allocation (not device memory "
                                "of this device?)",
                                g, code)
              : IPCREF_OK;
}

/* The export record of the allocation at `base` (under g->lock), or NULL. */
IPCREF__PRIVATE ipcref__cu_export *ipcref__cu_export_of(ipcref_cuda *g,
                                                        uint64_t base) {
  ipcref__cu_export *x = g->exports;
  while (x && x->base != base) x = x->next;
  return x;
}

/* An allocation exported already (another context wraps it too) gives
 * the handle it got then: one record per allocation, counted. */
IPCREF__PRIVATE ipcref_result ipcref__cu_seg_export(ipcref_backend *be,
                                                    int32_t dev, uint64_t base,
                                                    unsigned char *handle) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref__cu_export *x;
  ipcref_result r;
  int code;
  pthread_mutex_lock(&g->lock);
  if ((x = ipcref__cu_export_of(g, base)) != NULL) {
    memcpy(handle, x->handle, IPCREF_HANDLE_BYTES);
    x->refs++;
  }
  pthread_mutex_unlock(&g->lock);
  if (x) return IPCREF_OK;
  r = ipcref__cu_on(g, dev);
  if (r != IPCREF_OK) return r;
  /* VMM and stream-ordered pool memory cannot go through legacy IPC. */
  if (!ipcref__cu_d_ipc_capable(&g->drv, base))
    return ipcref__cu_say(IPCREF_EINVAL,
                          "memory not exportable by legacy IPC (virtual "
                          "memory management or a stream-ordered pool)");
  code = ipcref__cu_d_ipc_get(&g->drv, base, handle);
  if (code)
    return ipcref__cu_fail(ipcref__cu_code(code), "exporting the handle", g,
                           code);
  x = (ipcref__cu_export *)IPCREF_MALLOC(sizeof *x);
  if (!x) return IPCREF_ENOMEM;
  memcpy(x->handle, handle, IPCREF_HANDLE_BYTES);
  x->base = base;
  x->refs = 1;
  pthread_mutex_lock(&g->lock);
  x->next = g->exports;
  g->exports = x;
  pthread_mutex_unlock(&g->lock);
  return IPCREF_OK;
}

IPCREF__PRIVATE ipcref_result ipcref__cu_seg_import(ipcref_backend *be,
                                                    int32_t dev,
                                                    const unsigned char *handle,
                                                    uint64_t *addr) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref__cu_export *x;
  ipcref__cu_open *o;
  ipcref_result r;
  int code;
  pthread_mutex_lock(&g->lock);
  for (x = g->exports; x; x = x->next) /* ours: the pointer itself */
    if (memcmp(x->handle, handle, IPCREF_HANDLE_BYTES) == 0) {
      *addr = x->base;
      pthread_mutex_unlock(&g->lock);
      return IPCREF_OK;
    }
  for (o = g->opens; o; o = o->next) /* opened already: one more user */
    if (o->dev == dev && memcmp(o->handle, handle, IPCREF_HANDLE_BYTES) == 0) {
      o->refs++;
      *addr = o->addr;
      pthread_mutex_unlock(&g->lock);
      return IPCREF_OK;
    }
  pthread_mutex_unlock(&g->lock);
  o = (ipcref__cu_open *)IPCREF_MALLOC(sizeof *o);
  if (!o) return IPCREF_ENOMEM;
  r = ipcref__cu_on(g, dev);
  if (r != IPCREF_OK) {
    IPCREF_FREE(o);
    return r;
  }
  code = ipcref__cu_d_ipc_open(&g->drv, handle, &o->addr);
  if (code) {
    IPCREF_FREE(o);
    /* A handle that opens nothing (freed, forged, its exporter gone) is
     * bad input; running out of memory is not. */
    return ipcref__cu_fail(code == IPCREF__CU_OOM ? IPCREF_ENOMEM
                                                  : IPCREF_EPROTO,
                           "opening the handle", g, code);
  }
  memcpy(o->handle, handle, IPCREF_HANDLE_BYTES);
  o->dev = dev;
  o->refs = 1;
  pthread_mutex_lock(&g->lock);
  o->next = g->opens;
  g->opens = o;
  pthread_mutex_unlock(&g->lock);
  *addr = o->addr;
  return IPCREF_OK;
}

IPCREF__PRIVATE void ipcref__cu_seg_close(ipcref_backend *be, int32_t dev,
                                          uint64_t addr) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref__cu_open **pp, *o = NULL;
  if (ipcref__cu_vmm_close(g, dev, addr)) return; /* imported by fd */
  pthread_mutex_lock(&g->lock);
  for (pp = &g->opens; *pp; pp = &(*pp)->next)
    if ((*pp)->dev == dev && (*pp)->addr == addr) {
      if (--(*pp)->refs == 0) {
        o = *pp;
        *pp = o->next;
      }
      break;
    }
  pthread_mutex_unlock(&g->lock);
  if (!o) return; /* ours, or still used */
  if (ipcref__cu_on(g, dev) == IPCREF_OK)
    (void)ipcref__cu_d_ipc_close(&g->drv, o->addr);
  IPCREF_FREE(o);
}

/* ---- gpu_events: ordering (src/gpu_events.h) ---------------------------- */

IPCREF__PRIVATE ipcref_result ipcref__cu_event_record(ipcref_backend *be,
                                                      int32_t dev, void *stream,
                                                      unsigned char *handle,
                                                      void **event) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref__cu_ipc_event *e, **pp;
  ipcref_result r = ipcref__cu_on(g, dev);
  int code;
  *event = NULL;
  if (r != IPCREF_OK) return r;
  if (!IPCREF__CU_IPC_EVENTS) { /* no interprocess events: wait here */
    code = ipcref__cu_d_stream_sync(&g->drv, stream);
    memset(handle, 0, IPCREF_HANDLE_BYTES);
    return code ? ipcref__cu_fail(ipcref__cu_code(code),
                                  "synchronizing the stream", g, code)
                : IPCREF_OK;
  }
  pthread_mutex_lock(&g->lock); /* a free event of this device */
  for (pp = &g->free_events; *pp && (*pp)->dev != dev; pp = &(*pp)->next) {
  }
  e = *pp;
  if (e) *pp = e->next;
  pthread_mutex_unlock(&g->lock);
  if (!e) { /* the pool grows: no limit on events outstanding */
    e = (ipcref__cu_ipc_event *)IPCREF_MALLOC(sizeof *e);
    if (!e) return IPCREF_ENOMEM;
    code = ipcref__cu_d_event_new(&g->drv, 1, &e->ev);
    if (!code) {
      code = ipcref__cu_d_event_handle(&g->drv, e->ev, e->handle);
      if (code) (void)ipcref__cu_d_event_destroy(&g->drv, e->ev);
    }
    if (code) {
      IPCREF_FREE(e);
      return ipcref__cu_fail(ipcref__cu_code(code),
                             "making an interprocess event", g, code);
    }
    e->dev = dev;
  }
  code = ipcref__cu_d_event_record(&g->drv, e->ev, stream);
  if (code) {
    ipcref__cu_event_free(be, e);
    return ipcref__cu_fail(ipcref__cu_code(code), "recording the event", g,
                           code);
  }
  memcpy(handle, e->handle, IPCREF_HANDLE_BYTES);
  *event = e;
  return IPCREF_OK;
}

/* Back to the pool, never destroyed before ipcref_cuda_close: a consumer
 * that opens the handle late finds the event recorded again later, which
 * only makes it wait longer. */
IPCREF__PRIVATE void ipcref__cu_event_free(ipcref_backend *be, void *event) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  ipcref__cu_ipc_event *e = (ipcref__cu_ipc_event *)event;
  pthread_mutex_lock(&g->lock);
  e->next = g->free_events;
  g->free_events = e;
  pthread_mutex_unlock(&g->lock);
}

IPCREF__PRIVATE ipcref_result
ipcref__cu_event_wait(ipcref_backend *be, int32_t dev, void *stream,
                      const unsigned char *handle) {
  static const unsigned char zero[IPCREF_HANDLE_BYTES] = {0};
  ipcref_cuda *g = IPCREF__CU_OF(be);
  void *ev = NULL;
  ipcref_result r;
  int code;
  if (memcmp(handle, zero, IPCREF_HANDLE_BYTES) == 0) return IPCREF_OK;
  r = ipcref__cu_on(g, dev);
  if (r != IPCREF_OK) return r;
  code = ipcref__cu_d_event_open(&g->drv, handle, &ev);
  if (code == IPCREF__CU_INVALID_CONTEXT) { /* one of our own events */
    ipcref__cu_ipc_event *e;
    pthread_mutex_lock(&g->lock);
    for (e = g->free_events;
         e && memcmp(e->handle, handle, IPCREF_HANDLE_BYTES) != 0;
         e = e->next) {
    }
    pthread_mutex_unlock(&g->lock);
    /* One in use is not on the free list: it was recorded in this process
     * on the producer's stream, and the caller orders its own streams. */
    if (!e) return IPCREF_OK;
    code = ipcref__cu_d_stream_wait(&g->drv, stream, e->ev);
    return code
               ? ipcref__cu_fail(IPCREF_EPROTO, "waiting on the event", g, code)
               : IPCREF_OK;
  }
  if (code) return ipcref__cu_fail(IPCREF_EPROTO, "opening the event", g, code);
  code = ipcref__cu_d_stream_wait(&g->drv, stream, ev);
  (void)ipcref__cu_d_event_destroy(&g->drv, ev); /* the wait is queued */
  return code ? ipcref__cu_fail(ipcref__cu_code(code), "waiting on the event",
                                g, code)
              : IPCREF_OK;
}

/* A fence: a plain event after the work queued on `stream`; NULL when
 * that work has completed already. */
IPCREF__PRIVATE ipcref_result ipcref__cu_fence(ipcref_backend *be, int32_t dev,
                                               void *stream, void **fence) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  void *ev = NULL;
  ipcref_result r = ipcref__cu_on(g, dev);
  int code;
  *fence = NULL;
  if (r != IPCREF_OK) return r;
  code = ipcref__cu_d_event_new(&g->drv, 0, &ev);
  if (code)
    return ipcref__cu_fail(ipcref__cu_code(code), "making an event", g, code);
  code = ipcref__cu_d_event_record(&g->drv, ev, stream);
  if (code || ipcref__cu_d_event_query(&g->drv, ev) == 0) {
    (void)ipcref__cu_d_event_destroy(&g->drv, ev);
    return code ? ipcref__cu_fail(ipcref__cu_code(code), "recording the event",
                                  g, code)
                : IPCREF_OK;
  }
  *fence = ev;
  return IPCREF_OK;
}

IPCREF__PRIVATE int ipcref__cu_fence_done(ipcref_backend *be, void *fence) {
  ipcref_cuda *g = IPCREF__CU_OF(be);
  if (ipcref__cu_d_event_query(&g->drv, fence) == IPCREF__CU_NOT_READY)
    return 0;
  /* Done, or an error: either way nothing more to wait for. */
  (void)ipcref__cu_d_event_destroy(&g->drv, fence);
  return 1;
}

/* ---- the public part ----------------------------------------------------- */

/* One instance per process, shared by every open: a handle this process
 * exported must resolve here whichever context imports it (the driver
 * refuses to open it), and an allocation is opened once per process. */
static ipcref_cuda *ipcref__cu_instance;
static pthread_mutex_t ipcref__cu_instance_lock = PTHREAD_MUTEX_INITIALIZER;

IPCREF_API ipcref_result ipcref_cuda_open(const char *driver_path,
                                          ipcref_cuda **out) {
  const char *path = driver_path ? driver_path : "";
  ipcref_cuda *g;
  ipcref_result r;
  ipcref__cu_why[0] = 0;
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  if (strlen(path) >= sizeof g->path)
    return ipcref__invalid(__func__, "the library path is over 255 bytes");
  pthread_mutex_lock(&ipcref__cu_instance_lock);
  g = ipcref__cu_instance;
  if (g && g->pid != (int)getpid()) g = NULL; /* the parent's: not ours */
  if (g) {
    r = IPCREF_OK;
    if (strcmp(g->path, path) == 0)
      g->refs++;
    else
      r = ipcref__cu_say(IPCREF_EBUSY, "another driver is loaded already "
                                       "(one per process)");
    pthread_mutex_unlock(&ipcref__cu_instance_lock);
    if (r == IPCREF_OK) *out = g;
    return r;
  }
  g = (ipcref_cuda *)IPCREF_MALLOC(sizeof *g);
  if (!g) {
    pthread_mutex_unlock(&ipcref__cu_instance_lock);
    return IPCREF_ENOMEM;
  }
  memset(g, 0, sizeof *g);
  if (pthread_mutex_init(&g->lock, NULL) != 0) {
    pthread_mutex_unlock(&ipcref__cu_instance_lock);
    IPCREF_FREE(g);
    return ipcref__cu_say(IPCREF_ESYS, "pthread_mutex_init failed");
  }
  r = ipcref__cu_d_load(&g->drv, driver_path);
  if (r != IPCREF_OK) { /* it said why */
    pthread_mutex_unlock(&ipcref__cu_instance_lock);
    pthread_mutex_destroy(&g->lock);
    IPCREF_FREE(g);
    return r;
  }
  memcpy(g->path, path, strlen(path) + 1);
  g->refs = 1;
  g->pid = (int)getpid();
  ipcref__cu_instance = g;
  pthread_mutex_unlock(&ipcref__cu_instance_lock);
  g->backend.device_type = IPCREF__CU_DEVICE_TYPE;
  g->backend.name = IPCREF__CU_NAME;
  g->backend.user = g;
  g->backend.seg_alloc = ipcref__cu_seg_alloc;
  g->backend.seg_free = ipcref__cu_seg_free;
  g->backend.seg_forget = ipcref__cu_seg_forget;
  g->backend.seg_range = ipcref__cu_seg_range;
  g->backend.seg_export = ipcref__cu_seg_export;
  g->backend.seg_import = ipcref__cu_seg_import;
  g->backend.seg_close = ipcref__cu_seg_close;
  g->backend.event_record = ipcref__cu_event_record;
  g->backend.event_free = ipcref__cu_event_free;
  g->backend.event_wait = ipcref__cu_event_wait;
  g->backend.fence = ipcref__cu_fence;
  g->backend.fence_done = ipcref__cu_fence_done;
  g->backend.seg_export_fd = ipcref__cu_seg_export_fd;
  g->backend.seg_import_fd = ipcref__cu_seg_import_fd;
  g->backend.seg_export_chunks = ipcref__cu_seg_export_chunks;
  g->backend.seg_import_chunks = ipcref__cu_seg_import_chunks;
  *out = g;
  return IPCREF_OK;
}

IPCREF_API ipcref_backend *ipcref_cuda_backend(ipcref_cuda *g) {
  return g ? &g->backend : NULL;
}

IPCREF_API void ipcref_cuda_close(ipcref_cuda *g) {
  int last;
  if (!g) return;
  pthread_mutex_lock(&ipcref__cu_instance_lock);
  last = --g->refs == 0;
  if (last) ipcref__cu_instance = NULL;
  pthread_mutex_unlock(&ipcref__cu_instance_lock);
  if (!last) return;
  while (g->free_events) {
    ipcref__cu_ipc_event *e = g->free_events;
    g->free_events = e->next;
    if (ipcref__cu_on(g, e->dev) == IPCREF_OK)
      (void)ipcref__cu_d_event_destroy(&g->drv, e->ev);
    IPCREF_FREE(e);
  }
  while (g->opens) {
    ipcref__cu_open *o = g->opens;
    g->opens = o->next;
    if (ipcref__cu_on(g, o->dev) == IPCREF_OK)
      (void)ipcref__cu_d_ipc_close(&g->drv, o->addr);
    IPCREF_FREE(o);
  }
  while (g->exports) {
    ipcref__cu_export *x = g->exports;
    g->exports = x->next;
    IPCREF_FREE(x);
  }
  ipcref__cu_vmm_close_all(g);
  ipcref__cu_d_unload(&g->drv);
  pthread_mutex_destroy(&g->lock);
  IPCREF_FREE(g);
}

IPCREF_API ipcref_result ipcref_cuda_set_memory(ipcref_cuda *g, int memory) {
  if (!g) return ipcref__invalid(__func__, "the backend is NULL");
  if (memory != IPCREF_CUDA_MEMORY_AUTO &&
      memory != IPCREF_CUDA_MEMORY_LEGACY && memory != IPCREF_CUDA_MEMORY_VMM)
    return ipcref__invalid(__func__, "memory is not an IPCREF_*_MEMORY_ value");
  pthread_mutex_lock(&g->lock);
  g->memory = memory;
  pthread_mutex_unlock(&g->lock);
  return IPCREF_OK;
}

/* The arguments a device call checks itself, so that a refusal names it
 * (the rest are ipcref_device_new's and ipcref_device_wrap's checks). */
#define IPCREF__CU_ARGS(ctx, device, out)                                      \
  do {                                                                         \
    if (!(ctx)) return ipcref__invalid(__func__, "ctx is NULL");               \
    if (!(out)) return ipcref__invalid(__func__, "out is NULL");               \
    if ((device) < 0) return ipcref__invalid(__func__, "device is negative");  \
  } while (0)

IPCREF_API ipcref_result ipcref_cuda_alloc(ipcref_ctx *ctx, int device,
                                           size_t size, ipcref_buf **out) {
  ipcref_device dev;
  IPCREF__CU_ARGS(ctx, device, out);
  dev.type = IPCREF__CU_DEVICE_TYPE;
  dev.id = device;
  return ipcref_device_new(ctx, dev, size, out);
}

IPCREF_API ipcref_result ipcref_cuda_wrap(
    ipcref_ctx *ctx, int device, void *ptr, size_t size,
    void (*release)(void *user, void *ptr), void *user, ipcref_buf **out) {
  ipcref_device dev;
  IPCREF__CU_ARGS(ctx, device, out);
  if (!ptr) return ipcref__invalid(__func__, "ptr is NULL");
  dev.type = IPCREF__CU_DEVICE_TYPE;
  dev.id = device;
  return ipcref_device_wrap(ctx, dev, ptr, size, release, user, out);
}

#endif /* IPCREF_CUDA_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
LICENCE (MIT)

Copyright (c) 2026 the ipcref authors

Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
*/
