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

#if defined(IPCREF_HIP_IMPLEMENTATION) &&                                      \
    !defined(IPCREF_HIP_IMPLEMENTATION_INCLUDED)
#define IPCREF_HIP_IMPLEMENTATION_INCLUDED

/* ---- gpu: shared backend logic, first part (src/gpu.h) ------------------ */

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The longest failure message kept, with its terminating NUL. */
#define IPCREF__HIP_WHY_BYTES 256

/* Why the last failure on this thread happened, for ipcref_hip_error(). */
static __thread char ipcref__hip_why[IPCREF__HIP_WHY_BYTES];

IPCREF__PRIVATE ipcref_result ipcref__hip_say(ipcref_result r,
                                              const char *what) {
  snprintf(ipcref__hip_why, sizeof ipcref__hip_why, "%s", what);
  return r;
}

/* ---- loading the driver (the driver's loader uses these) ----------------- */

/* One entry point of the driver's table of them (its api struct): the name
 * it is looked up by, where its pointer goes (offsetof the field), and
 * whether a driver may lack it (its pointer then stays NULL). */
typedef struct ipcref__hip_entry {
  const char *name;
  size_t offset;
  int optional;
} ipcref__hip_entry;

/* Looks up entry point `name`: 0 with *fn set (NULL when the driver has no
 * such symbol), or the driver's error number. */
typedef int (*ipcref__hip_lookup)(void *user, const char *name, void **fn);

/* Symbol `name` of `lib` into the function pointer at `slot` (NULL when
 * absent). dlsym gives objects; POSIX makes them functions (memcpy: ISO C
 * has no cast between the two). */
IPCREF__PRIVATE void ipcref__hip_load_symbol(void *lib, const char *name,
                                             void *slot) {
  void *sym = dlsym(lib, name);
  memcpy(slot, &sym, sizeof sym);
}

/* Opens the driver's library: `path`, or else the first of the `n` `names`
 * that loads; *opened is the name tried last (the one loaded, on success).
 * On failure says why, naming the library as `what` ("CUDA driver") and,
 * without a path, what was looked for as `wanted`, and returns NULL. */
IPCREF__PRIVATE void *ipcref__hip_load_library(const char *path,
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
  snprintf(ipcref__hip_why, sizeof ipcref__hip_why,
           "the %s library could not be loaded (%s): %s", what,
           path ? path : wanted, e ? e : "not found");
  return NULL;
}

/* Fills the api struct at `api` from the `n` `entries`, in order, with
 * `lookup`. Returns the first entry that failed, *code saying how (the
 * lookup's error, or 0 for a required entry point missing), or NULL when
 * every one is in. Pointers are stored as ipcref__hip_load_symbol does. */
IPCREF__PRIVATE const ipcref__hip_entry *
ipcref__hip_load_entries(void *api, const ipcref__hip_entry *entries, size_t n,
                         ipcref__hip_lookup lookup, void *user, int *code) {
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
IPCREF__PRIVATE ipcref_result ipcref__hip_load_failed(void **lib) {
  dlclose(*lib);
  *lib = NULL;
  return IPCREF_ENODEV;
}

/* ---- hip: driver (src/hip.h) -------------------------------------------- */

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

/* ---- hip_vmm: driver (src/hip_vmm.h) ------------------------------------ */

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

/* ---- gpu: shared backend logic (src/gpu.h) ------------------------------ */

/* ---- the backend's state ------------------------------------------------- */

/* An interprocess event of the pool, with its handle made once. */
typedef struct ipcref__hip_ipc_event {
  void *ev;
  int dev;
  unsigned char handle[IPCREF_HANDLE_BYTES];
  struct ipcref__hip_ipc_event *next; /* the free list */
} ipcref__hip_ipc_event;

/* An allocation opened from another process, counted. */
typedef struct ipcref__hip_open {
  unsigned char handle[IPCREF_HANDLE_BYTES];
  int dev;
  uint64_t addr;
  int refs;
  struct ipcref__hip_open *next;
} ipcref__hip_open;

/* An allocation this process exported, so that its handle resolves here. */
typedef struct ipcref__hip_export {
  unsigned char handle[IPCREF_HANDLE_BYTES];
  uint64_t base;
  int refs; /* segments exported with it (contexts that wrap it: several) */
  struct ipcref__hip_export *next;
} ipcref__hip_export;

struct ipcref_hip {
  ipcref_backend backend; /* first: the backend's pointer is ours */
  int refs;               /* opens of this one instance */
  int pid;                /* the process it belongs to (not a fork's) */
  char path[256];         /* the driver it loaded ("" for the default) */
  ipcref__hip_state drv;
  pthread_mutex_t lock;
  ipcref__hip_ipc_event *free_events; /* the pool: events not in use */
  ipcref__hip_open *opens;
  ipcref__hip_export *exports;
  int memory; /* IPCREF_HIP_MEMORY_*: what ipcref_hip_alloc makes */
  signed char vmm_able[IPCREF__HIP_DEVICES];     /* shares by fd: 1, not: -1 */
  struct ipcref__hip_vmm *vmm_made, *vmm_opened; /* see src/gpu_vmm.h */
  struct ipcref__hip_pool *pools_out, *pools_in; /* see src/gpu_pool.h */
  struct ipcref__hip_pool_ptr *pool_ptrs, *pool_sent;
};

#define IPCREF__HIP_OF(be) ((ipcref_hip *)(void *)(be))

IPCREF__PRIVATE void ipcref__hip_event_free(ipcref_backend *be, void *event);

/* Records a failed driver call for ipcref_hip_error(); returns `r`. */
IPCREF__PRIVATE ipcref_result ipcref__hip_fail(ipcref_result r,
                                               const char *what, ipcref_hip *g,
                                               int code) {
  snprintf(ipcref__hip_why, sizeof ipcref__hip_why, "%s: %s (%d)", what,
           ipcref__hip_d_errname(&g->drv, code), code);
  return r;
}

IPCREF_API const char *ipcref_hip_error(void) {
  return ipcref__hip_why;
}

/* A driver error as an ipcref code. */
IPCREF__PRIVATE ipcref_result ipcref__hip_code(int code) {
  if (code == 0) return IPCREF_OK;
  if (code == IPCREF__HIP_OOM) return IPCREF_ENOMEM;
  if (code == IPCREF__HIP_NO_DEVICE) return IPCREF_ENODEV;
  return IPCREF_EINVAL;
}

/* Makes device `dev` current on this thread. */
IPCREF__PRIVATE ipcref_result ipcref__hip_on(ipcref_hip *g, int dev) {
  int code;
  if (dev < 0 || dev >= IPCREF__HIP_DEVICES)
    return ipcref__hip_say(IPCREF_ENODEV, "device ordinal out of range");
  code = ipcref__hip_d_use(&g->drv, dev);
  return code ? ipcref__hip_fail(IPCREF_ENODEV, "selecting the device", g, code)
              : IPCREF_OK;
}

/* ---- gpu_pool: pool memory shared by fd (src/gpu_pool.h) ---------------- */

/* A pool this process exported, or imported; a pointer exported or
 * imported. */
typedef struct ipcref__hip_pool {
  uint64_t pool;   /* the driver's handle */
  int fd;          /* exported: the fd every peer gets a copy of */
  dev_t fd_dev;    /* imported: the file its fd opens */
  ino_t fd_ino;    /* (see above) */
  int dev, access; /* imported: the device, and its access (2: read-write) */
  struct ipcref__hip_pool *next;
} ipcref__hip_pool;

typedef struct ipcref__hip_pool_ptr {
  uint64_t addr;
  int dev;
  unsigned char data[IPCREF_HANDLE_BYTES]; /* exported: its export data */
  struct ipcref__hip_pool_ptr *next;
} ipcref__hip_pool_ptr;

/* The fd of pool `pool`, exported once (under the lock): -1 with *r set
 * when the pool was not created shareable. */
IPCREF__PRIVATE int ipcref__hip_pool_fd(ipcref_hip *g, uint64_t pool,
                                        ipcref_result *r) {
  ipcref__hip_pool *p;
  int code, fd = -1;
  for (p = g->pools_out; p; p = p->next)
    if (p->pool == pool) return p->fd;
  code = ipcref__hip_d_pool_export(&g->drv, pool, &fd);
  if (code) {
    *r = ipcref__hip_say(IPCREF_EINVAL,
                         "memory of a pool not created shareable: create "
                         "the pool with handleTypes "
                         "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR "
                         "(cuMemPoolCreate; a device's default pool is not)");
    return -1;
  }
  p = (ipcref__hip_pool *)IPCREF_MALLOC(sizeof *p);
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
IPCREF__PRIVATE int ipcref__hip_pool_own(ipcref_hip *g, int dev, uint64_t addr,
                                         const unsigned char *data) {
  ipcref__hip_pool_ptr *x;
  for (x = g->pool_sent; x; x = x->next)
    if (x->addr == addr && x->dev == dev) break;
  if (!x) {
    x = (ipcref__hip_pool_ptr *)IPCREF_MALLOC(sizeof *x);
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
IPCREF__PRIVATE ipcref_result ipcref__hip_pool_export(ipcref_hip *g, int dev,
                                                      uint64_t base, int *fd,
                                                      unsigned char *data) {
  uint64_t pool;
  ipcref_result r = IPCREF_OK;
  int code, pfd;
  if (!ipcref__hip_d_pool_supported(&g->drv) ||
      !(pool = ipcref__hip_d_pool_of(&g->drv, base)))
    return IPCREF_ENOTSUP;
  pthread_mutex_lock(&g->lock); /* the pool first: its error says more */
  pfd = ipcref__hip_pool_fd(g, pool, &r);
  code = pfd < 0 ? 0 : ipcref__hip_d_pool_export_ptr(&g->drv, base, data);
  if (code)
    r = ipcref__hip_fail(ipcref__hip_code(code), "exporting the pointer", g,
                         code);
  if (r == IPCREF_OK && !ipcref__hip_pool_own(g, dev, base, data))
    r = IPCREF_ENOMEM;
  if (r == IPCREF_OK &&
      (*fd = fcntl(pfd, F_DUPFD_CLOEXEC, 0)) < 0) /* the same open file */
    r = ipcref__hip_say(IPCREF_ESYS, "dup of the pool's fd failed");
  pthread_mutex_unlock(&g->lock);
  return r;
}

/* The imported pool that `fd` opens (by its file), imported now if new
 * and given the access asked (under the lock): 0 with *code set. */
IPCREF__PRIVATE uint64_t ipcref__hip_pool_in(ipcref_hip *g, int dev, int fd,
                                             int writable, int *code) {
  ipcref__hip_pool *p;
  struct stat st;
  int access = writable ? 2 : 1;
  *code = -1;
  if (fstat(fd, &st) != 0) return 0;
  for (p = g->pools_in; p; p = p->next)
    if (p->fd_dev == st.st_dev && p->fd_ino == st.st_ino && p->dev == dev)
      break;
  if (!p) {
    p = (ipcref__hip_pool *)IPCREF_MALLOC(sizeof *p);
    if (!p) return 0;
    memset(p, 0, sizeof *p);
    *code = ipcref__hip_d_pool_import(&g->drv, fd, &p->pool);
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
    *code = ipcref__hip_d_pool_access(&g->drv, p->pool, dev, writable);
    if (*code) return 0;
    p->access = access;
  }
  *code = 0;
  return p->pool;
}

/* This process's own pointer that `data` names (0: none). */
IPCREF__PRIVATE uint64_t ipcref__hip_pool_mine(ipcref_hip *g, int dev,
                                               const unsigned char *data) {
  ipcref__hip_pool_ptr *x;
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
IPCREF__PRIVATE int ipcref__hip_pool_fits(ipcref_hip *g, uint64_t addr,
                                          uint64_t size) {
  uint64_t base = 0;
  size_t have = 0;
  return !ipcref__hip_d_range(&g->drv, addr, &base, &have) && base == addr &&
         (uint64_t)have >= size;
}

/* Imports the pool memory `fd` (its pool's) and `data` name, `size` bytes
 * at least (checked against the allocation the driver gives: EPROTO). */
IPCREF__PRIVATE ipcref_result ipcref__hip_pool_import(
    ipcref_hip *g, int dev, int fd, const unsigned char *data, uint64_t size,
    int writable, uint64_t *addr) {
  ipcref__hip_pool_ptr *x;
  uint64_t pool;
  int code;
  if ((*addr = ipcref__hip_pool_mine(g, dev, data)) != 0) /* our own */
    return ipcref__hip_pool_fits(g, *addr, size)
               ? IPCREF_OK
               : ipcref__hip_say(IPCREF_EPROTO, "pool memory smaller than "
                                                "its record says");
  if (!ipcref__hip_d_pool_supported(&g->drv))
    return ipcref__hip_say(IPCREF_ENODEV, "the driver shares no pool memory");
  x = (ipcref__hip_pool_ptr *)IPCREF_MALLOC(sizeof *x);
  if (!x) return IPCREF_ENOMEM;
  memset(x, 0, sizeof *x);
  pthread_mutex_lock(&g->lock);
  pool = ipcref__hip_pool_in(g, dev, fd, writable, &code);
  pthread_mutex_unlock(&g->lock);
  if (pool) code = ipcref__hip_d_pool_import_ptr(&g->drv, pool, data, addr);
  if (!pool || code) {
    IPCREF_FREE(x);
    return code == IPCREF__HIP_OOM
               ? IPCREF_ENOMEM
               : ipcref__hip_fail(IPCREF_EPROTO,
                                  pool ? "importing the pointer"
                                       : "importing the pool",
                                  g, code);
  }
  if (!ipcref__hip_pool_fits(g, *addr, size)) {
    (void)ipcref__hip_d_free(&g->drv, *addr);
    IPCREF_FREE(x);
    return ipcref__hip_say(IPCREF_EPROTO, "pool memory smaller than its "
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
IPCREF__PRIVATE int ipcref__hip_pool_close(ipcref_hip *g, int dev,
                                           uint64_t addr) {
  ipcref__hip_pool_ptr **pp, *x = NULL;
  pthread_mutex_lock(&g->lock);
  for (pp = &g->pool_ptrs; *pp; pp = &(*pp)->next)
    if ((*pp)->addr == addr && (*pp)->dev == dev) {
      x = *pp;
      *pp = x->next;
      break;
    }
  pthread_mutex_unlock(&g->lock);
  if (!x) return 0;
  if (ipcref__hip_on(g, dev) == IPCREF_OK)
    (void)ipcref__hip_d_free(&g->drv, addr);
  IPCREF_FREE(x);
  return 1;
}

/* At ipcref_hip_close: the pointers imported are freed, the pools
 * imported destroyed, the exported pools' fds closed. */
IPCREF__PRIVATE void ipcref__hip_pool_close_all(ipcref_hip *g) {
  ipcref__hip_pool *p;
  ipcref__hip_pool_ptr *x;
  while ((x = g->pool_ptrs) != NULL) {
    g->pool_ptrs = x->next;
    if (ipcref__hip_on(g, x->dev) == IPCREF_OK)
      (void)ipcref__hip_d_free(&g->drv, x->addr);
    IPCREF_FREE(x);
  }
  while ((x = g->pool_sent) != NULL) {
    g->pool_sent = x->next;
    IPCREF_FREE(x);
  }
  while ((p = g->pools_in) != NULL) {
    g->pools_in = p->next;
    (void)ipcref__hip_d_pool_destroy(&g->drv, p->pool);
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
typedef struct ipcref__hip_vmm {
  uint64_t addr, handle; /* the mapping; the allocation's handle */
  size_t size;           /* of the mapping (whole granules) */
  int dev;
  int n; /* imported in chunks: how many were mapped (handle unused) */
  uint64_t chunk_h[IPCREF_CHUNKS_MAX];
  size_t chunk_size[IPCREF_CHUNKS_MAX];
  int exported; /* made here and exported: the file its fd opens */
  dev_t fd_dev; /* (st_dev, st_ino of that fd), to know the fd when */
  ino_t fd_ino; /* it comes back to this process */
  struct ipcref__hip_vmm *next;
} ipcref__hip_vmm;

/* 1 when device `dev` can make memory shareable by fd: asked of the
 * driver once (its attributes), then remembered. */
IPCREF__PRIVATE int ipcref__hip_vmm_able(ipcref_hip *g, int dev) {
  signed char known;
  pthread_mutex_lock(&g->lock);
  known = g->vmm_able[dev];
  pthread_mutex_unlock(&g->lock);
  if (known) return known > 0;
  known = ipcref__hip_d_vmm_supported(&g->drv, dev) ? 1 : -1;
  pthread_mutex_lock(&g->lock);
  g->vmm_able[dev] = known;
  pthread_mutex_unlock(&g->lock);
  return known > 0;
}

/* 1 when a segment of device `dev` is to be VMM memory (the device is
 * current on this thread). */
IPCREF__PRIVATE int ipcref__hip_vmm_wanted(ipcref_hip *g, int dev) {
  int memory;
  pthread_mutex_lock(&g->lock);
  memory = g->memory;
  pthread_mutex_unlock(&g->lock);
  if (memory == IPCREF_HIP_MEMORY_LEGACY) return 0;
  return memory == IPCREF_HIP_MEMORY_VMM ||
         (IPCREF__HIP_VMM_AUTO && ipcref__hip_vmm_able(g, dev));
}

/* `size` rounded up to device `dev`'s granularity into *out: 0, or the
 * driver's error (or -1 when the sum overflows). */
IPCREF__PRIVATE int ipcref__hip_vmm_round(ipcref_hip *g, int dev, uint64_t size,
                                          size_t *out) {
  size_t gran = 0;
  int code = ipcref__hip_d_vmm_granularity(&g->drv, dev, &gran);
  if (code) return code;
  if (gran == 0 || size > (uint64_t)PTRDIFF_MAX - gran) return -1;
  *out = (size_t)((size + gran - 1) / gran * gran);
  return 0;
}

/* Undoes a mapping, in the order the driver documents: the work queued on
 * it is waited for first (unmapping does not wait for it), then unmapped,
 * the allocation's handle released (the memory goes with its last
 * mapping and handle, in every process), the range given back. */
IPCREF__PRIVATE void
ipcref__hip_vmm_undo(ipcref_hip *g, const ipcref__hip_vmm *m, int mapped) {
  if (m->n) { /* chunks: each mapped one, then the range */
    uint64_t at = m->addr;
    int i;
    (void)ipcref__hip_d_sync(&g->drv);
    for (i = 0; i < m->n; i++) {
      (void)ipcref__hip_d_vmm_unmap(&g->drv, at, m->chunk_size[i]);
      (void)ipcref__hip_d_vmm_release(&g->drv, m->chunk_h[i]);
      at += m->chunk_size[i];
    }
    (void)ipcref__hip_d_vmm_unreserve(&g->drv, m->addr, m->size);
    return;
  }
  if (mapped) {
    (void)ipcref__hip_d_sync(&g->drv);
    (void)ipcref__hip_d_vmm_unmap(&g->drv, m->addr, m->size);
  }
  if (m->handle) (void)ipcref__hip_d_vmm_release(&g->drv, m->handle);
  if (m->addr) (void)ipcref__hip_d_vmm_unreserve(&g->drv, m->addr, m->size);
}

/* Maps allocation m->handle (m->size bytes) into a range of its own, with
 * the access given; on failure undoes what it did but the handle. 0, or
 * the driver's error (*what says which step). */
IPCREF__PRIVATE int ipcref__hip_vmm_place(ipcref_hip *g, ipcref__hip_vmm *m,
                                          int writable, const char **what) {
  int code;
  *what = "reserving an address range";
  code = ipcref__hip_d_vmm_reserve(&g->drv, m->size, &m->addr);
  if (code) {
    m->addr = 0;
    return code;
  }
  *what = "mapping the allocation";
  code = ipcref__hip_d_vmm_map(&g->drv, m->addr, m->size, m->handle);
  if (!code) {
    *what = "setting the mapping's access";
    code =
        ipcref__hip_d_vmm_access(&g->drv, m->addr, m->size, m->dev, writable);
    if (code) (void)ipcref__hip_d_vmm_unmap(&g->drv, m->addr, m->size);
  }
  if (code) {
    (void)ipcref__hip_d_vmm_unreserve(&g->drv, m->addr, m->size);
    m->addr = 0;
  }
  return code;
}

/* Puts mapping record `m` on a list (under the lock). */
IPCREF__PRIVATE void ipcref__hip_vmm_push(ipcref_hip *g, ipcref__hip_vmm **list,
                                          ipcref__hip_vmm *m) {
  pthread_mutex_lock(&g->lock);
  m->next = *list;
  *list = m;
  pthread_mutex_unlock(&g->lock);
}

/* Takes the record of the mapping at `addr` off a list: NULL when it is
 * not there. */
IPCREF__PRIVATE ipcref__hip_vmm *ipcref__hip_vmm_take(ipcref_hip *g,
                                                      ipcref__hip_vmm **list,
                                                      int dev, uint64_t addr) {
  ipcref__hip_vmm **pp, *m = NULL;
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
IPCREF__PRIVATE ipcref_result ipcref__hip_vmm_alloc(ipcref_hip *g, int dev,
                                                    size_t size,
                                                    uint64_t *addr) {
  ipcref__hip_vmm *m;
  const char *what = "finding the allocation granularity";
  int code;
  if (!ipcref__hip_vmm_able(g, dev))
    return ipcref__hip_say(IPCREF_ENOTSUP,
                           "the device cannot share memory by fd (virtual "
                           "memory management with POSIX fd handles): "
                           "choose legacy memory (set_memory)");
  m = (ipcref__hip_vmm *)IPCREF_MALLOC(sizeof *m);
  if (!m) return IPCREF_ENOMEM;
  memset(m, 0, sizeof *m);
  m->dev = dev;
  code = ipcref__hip_vmm_round(g, dev, size, &m->size);
  if (!code) {
    what = "allocating";
    code = ipcref__hip_d_vmm_create(&g->drv, dev, m->size, &m->handle);
  }
  if (!code) code = ipcref__hip_vmm_place(g, m, 1, &what);
  if (code) {
    ipcref__hip_vmm_undo(g, m, 0);
    IPCREF_FREE(m);
    if (code < 0) return ipcref__hip_say(IPCREF_ENOMEM, "size too large");
    return ipcref__hip_fail(ipcref__hip_code(code), what, g, code);
  }
  ipcref__hip_vmm_push(g, &g->vmm_made, m);
  *addr = m->addr;
  return IPCREF_OK;
}

/* Frees the VMM segment at `addr`: 1, or 0 when it is not one. */
IPCREF__PRIVATE int ipcref__hip_vmm_free(ipcref_hip *g, int dev,
                                         uint64_t addr) {
  ipcref__hip_vmm *m = ipcref__hip_vmm_take(g, &g->vmm_made, dev, addr);
  if (!m) return 0;
  ipcref__hip_vmm_undo(g, m, 1);
  IPCREF_FREE(m);
  return 1;
}

/* An fd for the VMM allocation another allocator mapped at `base` (a
 * wrapped pointer: PyTorch's expandable segments, NCCL's buffers): found
 * with cuMemRetainAllocationHandle, exported, released. ENOTSUP for
 * memory that is not VMM; EINVAL, saying so, for VMM memory made without
 * the POSIX fd handle type (it can never be shared by fd). */
IPCREF__PRIVATE ipcref_result ipcref__hip_vmm_export_foreign(ipcref_hip *g,
                                                             uint64_t base,
                                                             int *fd) {
  uint64_t h = 0;
  int fd_ok = 0, code = ipcref__hip_d_vmm_retain(&g->drv, base, &h, &fd_ok);
  if (code) return IPCREF_ENOTSUP; /* not VMM: legacy IPC's */
  if (!fd_ok) {
    (void)ipcref__hip_d_vmm_release(&g->drv, h);
    return ipcref__hip_say(IPCREF_EINVAL,
                           "VMM memory made without the POSIX fd handle type "
                           "(its allocator must ask for it in "
                           "requestedHandleTypes): it cannot be shared");
  }
  code = ipcref__hip_d_vmm_export(&g->drv, h, fd);
  (void)ipcref__hip_d_vmm_release(&g->drv, h);
  if (code) {
    *fd = -1;
    return ipcref__hip_fail(ipcref__hip_code(code),
                            "exporting the allocation as an fd", g, code);
  }
  return IPCREF_OK;
}

/* The backend's seg_export_fd: an fd for the VMM segment at `base`, made
 * here or by another allocator, or for the pool memory there (its pool's
 * fd and its data: *pooled); ENOTSUP for memory shared by handle. The
 * sharing layer exports and frees a segment under its context's lock, so
 * the record found stays while it is used. */
IPCREF__PRIVATE ipcref_result ipcref__hip_seg_export_fd(ipcref_backend *be,
                                                        int32_t dev,
                                                        uint64_t base, int *fd,
                                                        unsigned char *data,
                                                        int *pooled) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref__hip_vmm *m;
  struct stat st;
  ipcref_result r = ipcref__hip_on(g, dev);
  int code;
  *fd = -1;
  *pooled = 0;
  if (r != IPCREF_OK) return r;
  pthread_mutex_lock(&g->lock);
  for (m = g->vmm_made; m && (m->addr != base || m->dev != dev); m = m->next) {
  }
  pthread_mutex_unlock(&g->lock);
  if (!m) { /* another allocator's: VMM, or a pool's */
    r = ipcref__hip_vmm_export_foreign(g, base, fd);
    if (r != IPCREF_ENOTSUP) return r;
    r = ipcref__hip_pool_export(g, dev, base, fd, data);
    *pooled = r == IPCREF_OK;
    return r;
  }
  code = ipcref__hip_d_vmm_export(&g->drv, m->handle, fd);
  if (code) {
    *fd = -1;
    return ipcref__hip_fail(ipcref__hip_code(code),
                            "exporting the allocation as an fd", g, code);
  }
  if (fstat(*fd, &st) == 0) { /* see ipcref__hip_vmm_own */
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
IPCREF__PRIVATE uint64_t ipcref__hip_vmm_own(ipcref_hip *g, int dev, int fd,
                                             size_t *size) {
  ipcref__hip_vmm *m;
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
IPCREF__PRIVATE ipcref_result ipcref__hip_vmm_new(ipcref_hip *g, int dev,
                                                  ipcref__hip_vmm **out) {
  ipcref__hip_vmm *m;
  if (!ipcref__hip_vmm_able(g, dev))
    return ipcref__hip_say(IPCREF_ENODEV, "the device cannot map memory "
                                          "shared by fd");
  m = (ipcref__hip_vmm *)IPCREF_MALLOC(sizeof *m);
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
IPCREF__PRIVATE ipcref_result ipcref__hip_seg_import_fd(
    ipcref_backend *be, int32_t dev, int fd, const unsigned char *data,
    int pooled, uint64_t size, int writable, uint64_t *addr) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref__hip_vmm *m;
  const char *what = "importing the fd";
  size_t own_size = 0;
  ipcref_result r = ipcref__hip_on(g, dev);
  int code;
  if (r != IPCREF_OK) return r;
  if (pooled)
    return ipcref__hip_pool_import(g, dev, fd, data, size, writable, addr);
  if ((*addr = ipcref__hip_vmm_own(g, dev, fd, &own_size)) != 0)
    return size <= own_size
               ? IPCREF_OK
               : ipcref__hip_say(IPCREF_EPROTO, "a size past the allocation's");
  if ((r = ipcref__hip_vmm_new(g, dev, &m)) != IPCREF_OK) return r;
  code = ipcref__hip_d_vmm_import(&g->drv, fd, &m->handle);
  if (!code) {
    what = "finding the allocation granularity";
    code = ipcref__hip_vmm_round(g, dev, size, &m->size);
  }
  if (!code) code = ipcref__hip_vmm_place(g, m, writable, &what);
  if (code) {
    ipcref__hip_vmm_undo(g, m, 0);
    IPCREF_FREE(m);
    if (code < 0)
      return ipcref__hip_say(IPCREF_EPROTO, "a shared size out of range");
    return ipcref__hip_fail(
        code == IPCREF__HIP_OOM ? IPCREF_ENOMEM : IPCREF_EPROTO, what, g, code);
  }
  ipcref__hip_vmm_push(g, &g->vmm_opened, m);
  *addr = m->addr;
  return IPCREF_OK;
}

/* The backend's seg_export_chunks: an fd for each VMM chunk another
 * allocator mapped one after the other from `base` (PyTorch's expandable
 * segments), each found and exported as a single one is; all or none. */
IPCREF__PRIVATE ipcref_result
ipcref__hip_seg_export_chunks(ipcref_backend *be, int32_t dev, uint64_t base,
                              const uint64_t *sizes, int n, int *fds) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref_result r = ipcref__hip_on(g, dev);
  uint64_t at = base;
  int i;
  for (i = 0; i < n; i++) fds[i] = -1;
  for (i = 0; i < n && r == IPCREF_OK; i++) {
    r = ipcref__hip_vmm_export_foreign(g, at, &fds[i]);
    if (r == IPCREF_ENOTSUP)
      r = ipcref__hip_say(IPCREF_EINVAL, "a buffer across allocations that "
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
IPCREF__PRIVATE int ipcref__hip_vmm_chunk(ipcref_hip *g, ipcref__hip_vmm *m,
                                          int fd, uint64_t at, int writable,
                                          const char **what) {
  size_t size = m->chunk_size[m->n];
  uint64_t h = 0;
  int code;
  *what = "importing a chunk's fd";
  code = ipcref__hip_d_vmm_import(&g->drv, fd, &h);
  if (code) return code;
  *what = "mapping a chunk";
  code = ipcref__hip_d_vmm_map(&g->drv, at, size, h);
  if (!code) {
    *what = "setting a chunk's access";
    code = ipcref__hip_d_vmm_access(&g->drv, at, size, m->dev, writable);
    if (code) (void)ipcref__hip_d_vmm_unmap(&g->drv, at, size);
  }
  if (code) {
    (void)ipcref__hip_d_vmm_release(&g->drv, h);
    return code;
  }
  m->chunk_h[m->n++] = h;
  return 0;
}

/* The backend's seg_import_chunks: the `n` chunks the fds share, mapped
 * one after the other in one range of this process's, with read or
 * read-write access for device `dev`. What the driver refuses is the
 * peer's fault (EPROTO), but for out of memory. */
IPCREF__PRIVATE ipcref_result ipcref__hip_seg_import_chunks(
    ipcref_backend *be, int32_t dev, const int *fds, const uint64_t *sizes,
    int n, int writable, uint64_t *addr) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref__hip_vmm *m;
  const char *what = "reserving an address range";
  ipcref_result r = ipcref__hip_on(g, dev);
  uint64_t at;
  int i, code;
  if (r != IPCREF_OK) return r;
  if (n < 1 || n > IPCREF_CHUNKS_MAX) return IPCREF_EPROTO; /* checked */
  if ((r = ipcref__hip_vmm_new(g, dev, &m)) != IPCREF_OK) return r;
  for (i = 0; i < n; i++) { /* the sum was checked against the record's */
    m->chunk_size[i] = (size_t)sizes[i];
    m->size += (size_t)sizes[i];
  }
  code = ipcref__hip_d_vmm_reserve(&g->drv, m->size, &m->addr);
  for (i = 0, at = m->addr; !code && i < n; at += sizes[i++])
    code = ipcref__hip_vmm_chunk(g, m, fds[i], at, writable, &what);
  if (code) {
    if (m->addr && m->n)
      ipcref__hip_vmm_undo(g, m, 1);
    else if (m->addr)
      (void)ipcref__hip_d_vmm_unreserve(&g->drv, m->addr, m->size);
    IPCREF_FREE(m);
    return ipcref__hip_fail(
        code == IPCREF__HIP_OOM ? IPCREF_ENOMEM : IPCREF_EPROTO, what, g, code);
  }
  ipcref__hip_vmm_push(g, &g->vmm_opened, m);
  *addr = m->addr;
  return IPCREF_OK;
}

/* Closes an imported VMM mapping or pool pointer at `addr`: 1, or 0 when
 * it is neither. */
IPCREF__PRIVATE int ipcref__hip_vmm_close(ipcref_hip *g, int dev,
                                          uint64_t addr) {
  ipcref__hip_vmm *m = ipcref__hip_vmm_take(g, &g->vmm_opened, dev, addr);
  if (!m) return ipcref__hip_pool_close(g, dev, addr);
  if (ipcref__hip_on(g, dev) == IPCREF_OK) ipcref__hip_vmm_undo(g, m, 1);
  IPCREF_FREE(m);
  return 1;
}

/* At ipcref_hip_close: what is still mapped goes (the contexts that used
 * it are gone: see ipcref_hip_close). */
IPCREF__PRIVATE void ipcref__hip_vmm_close_all(ipcref_hip *g) {
  ipcref__hip_vmm **lists[2], *m;
  int i;
  ipcref__hip_pool_close_all(g);
  lists[0] = &g->vmm_made;
  lists[1] = &g->vmm_opened;
  for (i = 0; i < 2; i++)
    while ((m = *lists[i]) != NULL) {
      *lists[i] = m->next;
      if (ipcref__hip_on(g, m->dev) == IPCREF_OK) ipcref__hip_vmm_undo(g, m, 1);
      IPCREF_FREE(m);
    }
}

/* ---- segments ------------------------------------------------------------ */

IPCREF__PRIVATE ipcref_result ipcref__hip_seg_alloc(ipcref_backend *be,
                                                    int32_t dev, size_t size,
                                                    uint64_t *addr) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref_result r = ipcref__hip_on(g, dev);
  int code;
  if (r != IPCREF_OK) return r;
  if (ipcref__hip_vmm_wanted(g, dev))
    return ipcref__hip_vmm_alloc(g, dev, size, addr);
  code = ipcref__hip_d_alloc(&g->drv, size, addr);
  return code ? ipcref__hip_fail(ipcref__hip_code(code), "allocating", g, code)
              : IPCREF_OK;
}

IPCREF__PRIVATE void ipcref__hip_seg_free(ipcref_backend *be, int32_t dev,
                                          uint64_t addr) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref__hip_export **pp;
  pthread_mutex_lock(&g->lock); /* its handle no longer names it */
  for (pp = &g->exports; *pp; pp = &(*pp)->next)
    if ((*pp)->base == addr) {
      ipcref__hip_export *x = *pp;
      *pp = x->next;
      IPCREF_FREE(x);
      break;
    }
  pthread_mutex_unlock(&g->lock);
  if (ipcref__hip_on(g, dev) == IPCREF_OK &&
      !ipcref__hip_vmm_free(g, dev, addr))
    (void)ipcref__hip_d_free(&g->drv, addr);
}

/* A wrapped allocation's segment went (its memory stays its owner's, who
 * may free it, and the driver may give its address to another): once no
 * segment is exported with it, its handle no longer names it here. */
IPCREF__PRIVATE void ipcref__hip_seg_forget(ipcref_backend *be, int32_t dev,
                                            uint64_t base) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref__hip_export **pp;
  (void)dev;
  pthread_mutex_lock(&g->lock);
  for (pp = &g->exports; *pp; pp = &(*pp)->next)
    if ((*pp)->base == base) {
      ipcref__hip_export *x = *pp;
      if (--x->refs == 0) {
        *pp = x->next;
        IPCREF_FREE(x);
      }
      break;
    }
  pthread_mutex_unlock(&g->lock);
}

IPCREF__PRIVATE ipcref_result ipcref__hip_seg_range(ipcref_backend *be,
                                                    int32_t dev, uint64_t addr,
                                                    uint64_t *base,
                                                    size_t *size) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref_result r = ipcref__hip_on(g, dev);
  int code;
  if (r != IPCREF_OK) return r;
  code = ipcref__hip_d_range(&g->drv, addr, base, size);
  return code ? ipcref__hip_fail(IPCREF_EINVAL,
                                 "finding the allocation (not device memory "
                                 "of this device?)",
                                 g, code)
              : IPCREF_OK;
}

/* The export record of the allocation at `base` (under g->lock), or NULL. */
IPCREF__PRIVATE ipcref__hip_export *ipcref__hip_export_of(ipcref_hip *g,
                                                          uint64_t base) {
  ipcref__hip_export *x = g->exports;
  while (x && x->base != base) x = x->next;
  return x;
}

/* An allocation exported already (another context wraps it too) gives
 * the handle it got then: one record per allocation, counted. */
IPCREF__PRIVATE ipcref_result ipcref__hip_seg_export(ipcref_backend *be,
                                                     int32_t dev, uint64_t base,
                                                     unsigned char *handle) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref__hip_export *x;
  ipcref_result r;
  int code;
  pthread_mutex_lock(&g->lock);
  if ((x = ipcref__hip_export_of(g, base)) != NULL) {
    memcpy(handle, x->handle, IPCREF_HANDLE_BYTES);
    x->refs++;
  }
  pthread_mutex_unlock(&g->lock);
  if (x) return IPCREF_OK;
  r = ipcref__hip_on(g, dev);
  if (r != IPCREF_OK) return r;
  /* VMM and stream-ordered pool memory cannot go through legacy IPC. */
  if (!ipcref__hip_d_ipc_capable(&g->drv, base))
    return ipcref__hip_say(IPCREF_EINVAL,
                           "memory not exportable by legacy IPC (virtual "
                           "memory management or a stream-ordered pool)");
  code = ipcref__hip_d_ipc_get(&g->drv, base, handle);
  if (code)
    return ipcref__hip_fail(ipcref__hip_code(code), "exporting the handle", g,
                            code);
  x = (ipcref__hip_export *)IPCREF_MALLOC(sizeof *x);
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

IPCREF__PRIVATE ipcref_result
ipcref__hip_seg_import(ipcref_backend *be, int32_t dev,
                       const unsigned char *handle, uint64_t *addr) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref__hip_export *x;
  ipcref__hip_open *o;
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
  o = (ipcref__hip_open *)IPCREF_MALLOC(sizeof *o);
  if (!o) return IPCREF_ENOMEM;
  r = ipcref__hip_on(g, dev);
  if (r != IPCREF_OK) {
    IPCREF_FREE(o);
    return r;
  }
  code = ipcref__hip_d_ipc_open(&g->drv, handle, &o->addr);
  if (code) {
    IPCREF_FREE(o);
    /* A handle that opens nothing (freed, forged, its exporter gone) is
     * bad input; running out of memory is not. */
    return ipcref__hip_fail(code == IPCREF__HIP_OOM ? IPCREF_ENOMEM
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

IPCREF__PRIVATE void ipcref__hip_seg_close(ipcref_backend *be, int32_t dev,
                                           uint64_t addr) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref__hip_open **pp, *o = NULL;
  if (ipcref__hip_vmm_close(g, dev, addr)) return; /* imported by fd */
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
  if (ipcref__hip_on(g, dev) == IPCREF_OK)
    (void)ipcref__hip_d_ipc_close(&g->drv, o->addr);
  IPCREF_FREE(o);
}

/* ---- gpu_events: ordering (src/gpu_events.h) ---------------------------- */

IPCREF__PRIVATE ipcref_result ipcref__hip_event_record(ipcref_backend *be,
                                                       int32_t dev,
                                                       void *stream,
                                                       unsigned char *handle,
                                                       void **event) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref__hip_ipc_event *e, **pp;
  ipcref_result r = ipcref__hip_on(g, dev);
  int code;
  *event = NULL;
  if (r != IPCREF_OK) return r;
  if (!IPCREF__HIP_IPC_EVENTS) { /* no interprocess events: wait here */
    code = ipcref__hip_d_stream_sync(&g->drv, stream);
    memset(handle, 0, IPCREF_HANDLE_BYTES);
    return code ? ipcref__hip_fail(ipcref__hip_code(code),
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
    e = (ipcref__hip_ipc_event *)IPCREF_MALLOC(sizeof *e);
    if (!e) return IPCREF_ENOMEM;
    code = ipcref__hip_d_event_new(&g->drv, 1, &e->ev);
    if (!code) {
      code = ipcref__hip_d_event_handle(&g->drv, e->ev, e->handle);
      if (code) (void)ipcref__hip_d_event_destroy(&g->drv, e->ev);
    }
    if (code) {
      IPCREF_FREE(e);
      return ipcref__hip_fail(ipcref__hip_code(code),
                              "making an interprocess event", g, code);
    }
    e->dev = dev;
  }
  code = ipcref__hip_d_event_record(&g->drv, e->ev, stream);
  if (code) {
    ipcref__hip_event_free(be, e);
    return ipcref__hip_fail(ipcref__hip_code(code), "recording the event", g,
                            code);
  }
  memcpy(handle, e->handle, IPCREF_HANDLE_BYTES);
  *event = e;
  return IPCREF_OK;
}

/* Back to the pool, never destroyed before ipcref_hip_close: a consumer
 * that opens the handle late finds the event recorded again later, which
 * only makes it wait longer. */
IPCREF__PRIVATE void ipcref__hip_event_free(ipcref_backend *be, void *event) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  ipcref__hip_ipc_event *e = (ipcref__hip_ipc_event *)event;
  pthread_mutex_lock(&g->lock);
  e->next = g->free_events;
  g->free_events = e;
  pthread_mutex_unlock(&g->lock);
}

IPCREF__PRIVATE ipcref_result
ipcref__hip_event_wait(ipcref_backend *be, int32_t dev, void *stream,
                       const unsigned char *handle) {
  static const unsigned char zero[IPCREF_HANDLE_BYTES] = {0};
  ipcref_hip *g = IPCREF__HIP_OF(be);
  void *ev = NULL;
  ipcref_result r;
  int code;
  if (memcmp(handle, zero, IPCREF_HANDLE_BYTES) == 0) return IPCREF_OK;
  r = ipcref__hip_on(g, dev);
  if (r != IPCREF_OK) return r;
  code = ipcref__hip_d_event_open(&g->drv, handle, &ev);
  if (code == IPCREF__HIP_INVALID_CONTEXT) { /* one of our own events */
    ipcref__hip_ipc_event *e;
    pthread_mutex_lock(&g->lock);
    for (e = g->free_events;
         e && memcmp(e->handle, handle, IPCREF_HANDLE_BYTES) != 0;
         e = e->next) {
    }
    pthread_mutex_unlock(&g->lock);
    /* One in use is not on the free list: it was recorded in this process
     * on the producer's stream, and the caller orders its own streams. */
    if (!e) return IPCREF_OK;
    code = ipcref__hip_d_stream_wait(&g->drv, stream, e->ev);
    return code ? ipcref__hip_fail(IPCREF_EPROTO, "waiting on the event", g,
                                   code)
                : IPCREF_OK;
  }
  if (code)
    return ipcref__hip_fail(IPCREF_EPROTO, "opening the event", g, code);
  code = ipcref__hip_d_stream_wait(&g->drv, stream, ev);
  (void)ipcref__hip_d_event_destroy(&g->drv, ev); /* the wait is queued */
  return code ? ipcref__hip_fail(ipcref__hip_code(code), "waiting on the event",
                                 g, code)
              : IPCREF_OK;
}

/* A fence: a plain event after the work queued on `stream`; NULL when
 * that work has completed already. */
IPCREF__PRIVATE ipcref_result ipcref__hip_fence(ipcref_backend *be, int32_t dev,
                                                void *stream, void **fence) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  void *ev = NULL;
  ipcref_result r = ipcref__hip_on(g, dev);
  int code;
  *fence = NULL;
  if (r != IPCREF_OK) return r;
  code = ipcref__hip_d_event_new(&g->drv, 0, &ev);
  if (code)
    return ipcref__hip_fail(ipcref__hip_code(code), "making an event", g, code);
  code = ipcref__hip_d_event_record(&g->drv, ev, stream);
  if (code || ipcref__hip_d_event_query(&g->drv, ev) == 0) {
    (void)ipcref__hip_d_event_destroy(&g->drv, ev);
    return code ? ipcref__hip_fail(ipcref__hip_code(code),
                                   "recording the event", g, code)
                : IPCREF_OK;
  }
  *fence = ev;
  return IPCREF_OK;
}

IPCREF__PRIVATE int ipcref__hip_fence_done(ipcref_backend *be, void *fence) {
  ipcref_hip *g = IPCREF__HIP_OF(be);
  if (ipcref__hip_d_event_query(&g->drv, fence) == IPCREF__HIP_NOT_READY)
    return 0;
  /* Done, or an error: either way nothing more to wait for. */
  (void)ipcref__hip_d_event_destroy(&g->drv, fence);
  return 1;
}

/* ---- the public part ----------------------------------------------------- */

/* One instance per process, shared by every open: a handle this process
 * exported must resolve here whichever context imports it (the driver
 * refuses to open it), and an allocation is opened once per process. */
static ipcref_hip *ipcref__hip_instance;
static pthread_mutex_t ipcref__hip_instance_lock = PTHREAD_MUTEX_INITIALIZER;

IPCREF_API ipcref_result ipcref_hip_open(const char *driver_path,
                                         ipcref_hip **out) {
  const char *path = driver_path ? driver_path : "";
  ipcref_hip *g;
  ipcref_result r;
  ipcref__hip_why[0] = 0;
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  if (strlen(path) >= sizeof g->path)
    return ipcref__invalid(__func__, "the library path is over 255 bytes");
  pthread_mutex_lock(&ipcref__hip_instance_lock);
  g = ipcref__hip_instance;
  if (g && g->pid != (int)getpid()) g = NULL; /* the parent's: not ours */
  if (g) {
    r = IPCREF_OK;
    if (strcmp(g->path, path) == 0)
      g->refs++;
    else
      r = ipcref__hip_say(IPCREF_EBUSY, "another driver is loaded already "
                                        "(one per process)");
    pthread_mutex_unlock(&ipcref__hip_instance_lock);
    if (r == IPCREF_OK) *out = g;
    return r;
  }
  g = (ipcref_hip *)IPCREF_MALLOC(sizeof *g);
  if (!g) {
    pthread_mutex_unlock(&ipcref__hip_instance_lock);
    return IPCREF_ENOMEM;
  }
  memset(g, 0, sizeof *g);
  if (pthread_mutex_init(&g->lock, NULL) != 0) {
    pthread_mutex_unlock(&ipcref__hip_instance_lock);
    IPCREF_FREE(g);
    return ipcref__hip_say(IPCREF_ESYS, "pthread_mutex_init failed");
  }
  r = ipcref__hip_d_load(&g->drv, driver_path);
  if (r != IPCREF_OK) { /* it said why */
    pthread_mutex_unlock(&ipcref__hip_instance_lock);
    pthread_mutex_destroy(&g->lock);
    IPCREF_FREE(g);
    return r;
  }
  memcpy(g->path, path, strlen(path) + 1);
  g->refs = 1;
  g->pid = (int)getpid();
  ipcref__hip_instance = g;
  pthread_mutex_unlock(&ipcref__hip_instance_lock);
  g->backend.device_type = IPCREF__HIP_DEVICE_TYPE;
  g->backend.name = IPCREF__HIP_NAME;
  g->backend.user = g;
  g->backend.seg_alloc = ipcref__hip_seg_alloc;
  g->backend.seg_free = ipcref__hip_seg_free;
  g->backend.seg_forget = ipcref__hip_seg_forget;
  g->backend.seg_range = ipcref__hip_seg_range;
  g->backend.seg_export = ipcref__hip_seg_export;
  g->backend.seg_import = ipcref__hip_seg_import;
  g->backend.seg_close = ipcref__hip_seg_close;
  g->backend.event_record = ipcref__hip_event_record;
  g->backend.event_free = ipcref__hip_event_free;
  g->backend.event_wait = ipcref__hip_event_wait;
  g->backend.fence = ipcref__hip_fence;
  g->backend.fence_done = ipcref__hip_fence_done;
  g->backend.seg_export_fd = ipcref__hip_seg_export_fd;
  g->backend.seg_import_fd = ipcref__hip_seg_import_fd;
  g->backend.seg_export_chunks = ipcref__hip_seg_export_chunks;
  g->backend.seg_import_chunks = ipcref__hip_seg_import_chunks;
  *out = g;
  return IPCREF_OK;
}

IPCREF_API ipcref_backend *ipcref_hip_backend(ipcref_hip *g) {
  return g ? &g->backend : NULL;
}

IPCREF_API void ipcref_hip_close(ipcref_hip *g) {
  int last;
  if (!g) return;
  pthread_mutex_lock(&ipcref__hip_instance_lock);
  last = --g->refs == 0;
  if (last) ipcref__hip_instance = NULL;
  pthread_mutex_unlock(&ipcref__hip_instance_lock);
  if (!last) return;
  while (g->free_events) {
    ipcref__hip_ipc_event *e = g->free_events;
    g->free_events = e->next;
    if (ipcref__hip_on(g, e->dev) == IPCREF_OK)
      (void)ipcref__hip_d_event_destroy(&g->drv, e->ev);
    IPCREF_FREE(e);
  }
  while (g->opens) {
    ipcref__hip_open *o = g->opens;
    g->opens = o->next;
    if (ipcref__hip_on(g, o->dev) == IPCREF_OK)
      (void)ipcref__hip_d_ipc_close(&g->drv, o->addr);
    IPCREF_FREE(o);
  }
  while (g->exports) {
    ipcref__hip_export *x = g->exports;
    g->exports = x->next;
    IPCREF_FREE(x);
  }
  ipcref__hip_vmm_close_all(g);
  ipcref__hip_d_unload(&g->drv);
  pthread_mutex_destroy(&g->lock);
  IPCREF_FREE(g);
}

IPCREF_API ipcref_result ipcref_hip_set_memory(ipcref_hip *g, int memory) {
  if (!g) return ipcref__invalid(__func__, "the backend is NULL");
  if (memory != IPCREF_HIP_MEMORY_AUTO && memory != IPCREF_HIP_MEMORY_LEGACY &&
      memory != IPCREF_HIP_MEMORY_VMM)
    return ipcref__invalid(__func__, "memory is not an IPCREF_*_MEMORY_ value");
  pthread_mutex_lock(&g->lock);
  g->memory = memory;
  pthread_mutex_unlock(&g->lock);
  return IPCREF_OK;
}

/* The arguments a device call checks itself, so that a refusal names it
 * (the rest are ipcref_device_new's and ipcref_device_wrap's checks). */
#define IPCREF__HIP_ARGS(ctx, device, out)                                     \
  do {                                                                         \
    if (!(ctx)) return ipcref__invalid(__func__, "ctx is NULL");               \
    if (!(out)) return ipcref__invalid(__func__, "out is NULL");               \
    if ((device) < 0) return ipcref__invalid(__func__, "device is negative");  \
  } while (0)

IPCREF_API ipcref_result ipcref_hip_alloc(ipcref_ctx *ctx, int device,
                                          size_t size, ipcref_buf **out) {
  ipcref_device dev;
  IPCREF__HIP_ARGS(ctx, device, out);
  dev.type = IPCREF__HIP_DEVICE_TYPE;
  dev.id = device;
  return ipcref_device_new(ctx, dev, size, out);
}

IPCREF_API ipcref_result ipcref_hip_wrap(ipcref_ctx *ctx, int device, void *ptr,
                                         size_t size,
                                         void (*release)(void *user, void *ptr),
                                         void *user, ipcref_buf **out) {
  ipcref_device dev;
  IPCREF__HIP_ARGS(ctx, device, out);
  if (!ptr) return ipcref__invalid(__func__, "ptr is NULL");
  dev.type = IPCREF__HIP_DEVICE_TYPE;
  dev.id = device;
  return ipcref_device_wrap(ctx, dev, ptr, size, release, user, out);
}

#endif /* IPCREF_HIP_IMPLEMENTATION */

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
