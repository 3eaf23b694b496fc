/* fake_cuda.c - a fake libcuda.so.1 for ipcref's tests: the CUDA 13 driver API
 * entry points ipcref_cuda.h uses, over fake_core.h (host shared memory).
 *
 * Built against the real <cuda.h> with __CUDA_API_VERSION_INTERNAL, as NVIDIA
 * builds the driver: the header then declares both the plain names with their
 * old ABI (cuMemAlloc(unsigned int *, unsigned int), ...) and the versioned
 * ones (cuMemAlloc_v2, ...), so every definition here is checked against the
 * real prototype. Like the real library it exports both. The old-ABI ones
 * (32-bit device pointers) are refused with CUDA_ERROR_NOT_SUPPORTED and
 * logged with abi=v1, which catches a dlsym(h, "cuMemAlloc") by mistake.
 *
 * CUDA-only knobs (besides those in fake_core.h):
 *   FAKE_CUDA_DRIVER_VERSION  what cuDriverGetVersion reports and the highest
 *                             cudaVersion cuGetProcAddress accepts (13000)
 *   FAKE_CUDA_HIDE            an entry point cuGetProcAddress does not find,
 *                             as from an older or a partial driver
 *   FAKE_CUDA_VMM, FAKE_CUDA_POSIX_FD, FAKE_CUDA_GRANULARITY
 *                             virtual memory management (cuMemCreate,
 *                             cuMemMap, fd export/import): see fake_vmm.h;
 *                             the entry points are in fake_cuda_vmm.c
 *   FAKE_CUDA_POOLS           stream-ordered memory pools (cuMemPoolCreate,
 *                             cuMemAllocFromPoolAsync, pool and pointer
 *                             export/import): see fake_pool.h; the entry
 *                             points are in fake_cuda_pool.c
 */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#define FK_PREFIX "FAKE_CUDA_"
#define FK_MAGIC  0x55434b46u /* "FKCU" */
#include "fake_core.h"
#include "fake_vmm.h"
#include "fake_pool.h"

_Static_assert(sizeof(CUipcMemHandle) == sizeof(struct fk_handle),
               "handle size");
_Static_assert(sizeof(CUipcEventHandle) == sizeof(struct fk_handle),
               "handle size");
_Static_assert(CU_EVENT_DISABLE_TIMING == FK_EV_DISABLE_TIMING &&
                   CU_EVENT_INTERPROCESS == FK_EV_INTERPROCESS,
               "");
_Static_assert(CU_STREAM_NON_BLOCKING == FK_STREAM_NON_BLOCKING, "");
_Static_assert((int)CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE ==
                       FK_PA_IS_LEGACY_IPC_CAPABLE &&
                   (int)CU_POINTER_ATTRIBUTE_MAPPED == FK_PA_MAPPED &&
                   (int)CU_POINTER_ATTRIBUTE_BUFFER_ID == FK_PA_BUFFER_ID,
               "");

static const struct {
  CUresult code;
  const char *name, *text;
} errs[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED",
     "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED",
     "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY",
     "CUDA driver is a stub library"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE",
     "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE",
     "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT",
     "invalid device context"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED",
     "mapping of buffer object failed"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED",
     "resource already mapped"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE",
     "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
     "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int fk_code(int e) {
  static const CUresult map[] = {
      [FK_OK] = CUDA_SUCCESS,
      [FK_EINVAL] = CUDA_ERROR_INVALID_VALUE,
      [FK_ENOMEM] = CUDA_ERROR_OUT_OF_MEMORY,
      [FK_ENOINIT] = CUDA_ERROR_NOT_INITIALIZED,
      [FK_ESTUB] = CUDA_ERROR_STUB_LIBRARY,
      [FK_ENODEV] = CUDA_ERROR_NO_DEVICE,
      [FK_EBADDEV] = CUDA_ERROR_INVALID_DEVICE,
      [FK_ECTX] = CUDA_ERROR_INVALID_CONTEXT,
      [FK_EMAPPED] = CUDA_ERROR_ALREADY_MAPPED,
      [FK_EHANDLE] = CUDA_ERROR_INVALID_HANDLE,
      [FK_ENOTFOUND] = CUDA_ERROR_NOT_FOUND,
      [FK_ENOTREADY] = CUDA_ERROR_NOT_READY,
      [FK_ENOTSUP] = CUDA_ERROR_NOT_SUPPORTED,
      [FK_ENOEXPORT] = CUDA_ERROR_INVALID_VALUE,
      [FK_ENOTOPEN] = CUDA_ERROR_INVALID_VALUE,
      [FK_EBADFREE] = CUDA_ERROR_INVALID_VALUE,
  };
  return (int)map[e];
}

static const char *fk_code_name(int code) {
  for (size_t i = 0; i < sizeof errs / sizeof *errs; i++)
    if ((int)errs[i].code == code) return errs[i].name;
  return "CUDA_ERROR_?";
}

/* ---- initialisation and contexts ----------------------------------------- */

/* The primary context of a device. */
struct CUctx_st {
  int dev, refs, alive;
};
static struct CUctx_st ctxs[FK_MAX_DEV];
static void *const ctx_ptrs[FK_MAX_DEV] = {&ctxs[0], &ctxs[1], &ctxs[2],
                                           &ctxs[3], &ctxs[4], &ctxs[5],
                                           &ctxs[6], &ctxs[7]};
static _Thread_local CUcontext current; /* cuCtxSetCurrent is per thread */
static int inited;                      /* cuInit succeeded in this process */

enum { NEED_NOTHING, NEED_INIT, NEED_CTX };

/* What every entry point checks first. *dev = the current context's device,
 * -1 if none. The real stub library answers every call with 34; other calls
 * need cuInit (else CUDA_ERROR_NOT_INITIALIZED) and many a current context
 * (else CUDA_ERROR_INVALID_CONTEXT, e.g. ucx PR #10618 for
 * cuIpcCloseMemHandle). */
static int gate(int need, int *dev) {
  *dev = -1;
  if (fk_knob_is("MODE", "stub")) return FK_ESTUB;
  if (need == NEED_NOTHING) return FK_OK;
  if (!inited || fk_forked()) return FK_ENOINIT;
  if (current && current->alive) *dev = current->dev;
  return need == NEED_CTX && *dev < 0 ? FK_ECTX : FK_OK;
}
#define GATE(need)                                                             \
  int dev, e = gate(need, &dev);                                               \
  (void)dev

static int driver_version(void) {
  return (int)fk_knob_num("DRIVER_VERSION", 13000);
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
  GATE(NEED_NOTHING);
  if (!e && fk_forked()) e = FK_ENOINIT;
  if (!e && Flags) e = FK_EINVAL; /* "Flags must be 0" */
  if (!e && (fk_knob_is("MODE", "nodevice") || fk_devices() == 0))
    e = FK_ENODEV;
  if (!e) {
    inited = 1;
    fk_mark_init();
  }
  return fk_ret("cuInit", e, "flags=%u", Flags);
}

CUresult CUDAAPI
cuDriverGetVersion(int *driverVersion) /* works before cuInit */
{
  GATE(NEED_NOTHING);
  if (!e && !driverVersion) e = FK_EINVAL;
  if (!e) *driverVersion = driver_version();
  return fk_ret("cuDriverGetVersion", e, "version=%d", e ? 0 : *driverVersion);
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
  GATE(NEED_INIT);
  if (!e && !count) e = FK_EINVAL;
  if (!e) *count = fk_devices();
  return fk_ret("cuDeviceGetCount", e, "count=%d", e ? 0 : *count);
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  GATE(NEED_INIT);
  if (!e && !device) e = FK_EINVAL;
  if (!e && (ordinal < 0 || ordinal >= fk_devices())) e = FK_EBADDEV;
  if (!e) *device = ordinal;
  return fk_ret("cuDeviceGet", e, "ordinal=%d", ordinal);
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
                                      CUdevice d) {
  GATE(NEED_INIT);
  if (!e && (!pi || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX))
    e = FK_EINVAL;
  if (!e && (d < 0 || d >= fk_devices())) e = FK_EBADDEV;
  if (!e) {
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *pi = 1;
      break; /* IPC needs UVA */
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *pi = fk_vmm_on(); /* fake_vmm.h; FAKE_CUDA_VMM=0: no */
      break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *pi = fk_vmm_posix_on(); /* FAKE_CUDA_POSIX_FD=0 or VMM=0: no */
      break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      *pi = fk_pools_on(); /* fake_pool.h; FAKE_CUDA_POOLS=0: no */
      break;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
      /* a bitmask: POSIX_FILE_DESCRIPTOR; POOLS=0 or POSIX_FD=0: none */
      *pi = (int)fk_pool_htypes_supported();
      break;
    default: *pi = 0; break;
    }
  }
  return fk_ret("cuDeviceGetAttribute", e, "attr=%d dev=%d value=%d",
                (int)attrib, d, e ? 0 : *pi);
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d) {
  GATE(NEED_INIT);
  if (!e && !pctx) e = FK_EINVAL;
  if (!e && (d < 0 || d >= fk_devices())) e = FK_EBADDEV;
  if (!e) {
    FK_LOCK();
    ctxs[d].dev = d;
    ctxs[d].refs++;
    ctxs[d].alive = 1; /* retained, but not made current */
    FK_UNLOCK();
    *pctx = &ctxs[d];
  }
  return fk_ret("cuDevicePrimaryCtxRetain", e, "dev=%d ctx=0x%llx", d,
                e ? 0 : FK_P(*pctx));
}

/* _v2 (CUDA 11): "The context is automatically reset once the last reference
 * to it is released": its memory and imports are gone. */
static CUresult primary_release(const char *call, CUdevice d) {
  GATE(NEED_INIT);
  int freed = 0, last = 0;
  if (!e && (d < 0 || d >= fk_devices())) e = FK_EBADDEV;
  if (!e) {
    FK_LOCK();
    if (ctxs[d].refs == 0)
      e = FK_ECTX;
    else if (--ctxs[d].refs == 0)
      ctxs[d].alive = 0, last = 1;
    FK_UNLOCK();
  }
  if (last) freed = fk_mem_drop_owner(d);
  return fk_ret(call, e, "dev=%d reset=%d freed=%d", d, last, freed);
}
CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  return primary_release("cuDevicePrimaryCtxRelease_v2", d);
}
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice d) {
  return primary_release("cuDevicePrimaryCtxRelease", d);
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
  GATE(NEED_INIT);
  if (!e && !pctx) e = FK_EINVAL;
  if (!e) *pctx = current;
  return fk_ret("cuCtxGetCurrent", e, "ctx=0x%llx", e ? 0 : FK_P(*pctx));
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  GATE(NEED_INIT);
  int known = 0;
  for (int i = 0; i < FK_MAX_DEV; i++) known |= ctx == &ctxs[i];
  if (!e && ctx && (!known || !ctx->alive))
    e = FK_ECTX; /* not a context, or reset */
  if (!e) current = ctx;
  return fk_ret("cuCtxSetCurrent", e, "ctx=0x%llx", FK_P(ctx));
}

/* ---- memory -------------------------------------------------------------- */

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  GATE(NEED_CTX);
  uintptr_t p = 0;
  if (!e && (!dptr || !bytesize))
    e = FK_EINVAL; /* "If bytesize is 0, cuMemAlloc() returns
                      CUDA_ERROR_INVALID_VALUE" */
  if (!e) e = fk_mem_alloc(&p, bytesize, FK_MEM_ALLOC, dev);
  if (!e) *dptr = p;
  return fk_ret("cuMemAlloc_v2", e, "size=%zu ptr=0x%llx", bytesize, FK_P(p));
}

/* Test-only: memory legacy IPC cannot export, like cuMemCreate (VMM) or
 * cudaMallocAsync pool memory (IS_LEGACY_CUDA_IPC_CAPABLE 0, cuIpcGetMemHandle
 * -> CUDA_ERROR_INVALID_VALUE). Freed with cuMemFree. */
int fake_gpu_alloc_vmm(void **ptr, size_t size) {
  GATE(NEED_CTX);
  uintptr_t p = 0;
  if (!e && (!ptr || !size)) e = FK_EINVAL;
  if (!e) e = fk_mem_alloc(&p, size, FK_MEM_VMM, dev);
  if (!e) *ptr = (void *)p;
  return fk_ret("fake_gpu_alloc_vmm", e, "size=%zu ptr=0x%llx", size, FK_P(p));
}

static CUresult free_pool(const char *call, CUdeviceptr dptr, int now_,
                          CUstream hStream); /* fake_cuda_pool.c */

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  GATE(NEED_CTX);
  uint64_t h, pn, n;
  /* pool memory (and imported pool pointers: "The pointer may be freed with
   * cuMemFree or cuMemFreeAsync"): fake_pool.h frees it, logged with its
   * pool= and alloc= keys */
  if (!e && fk_pool_of(dptr, &h, &pn, &n))
    return free_pool("cuMemFree_v2", dptr, 1, NULL);
  if (!e) e = fk_mem_free(dptr);
  return fk_ret("cuMemFree_v2", e, "ptr=0x%llx", FK_P(dptr));
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize,
                                         CUdeviceptr dptr) {
  GATE(NEED_CTX);
  uintptr_t base = 0;
  size_t size = 0;
  if (!e)
    e = fk_mem_range(dptr, &base, &size); /* unknown -> CUDA_ERROR_NOT_FOUND */
  if (!e && pbase) *pbase = base; /* "Both parameters ... are optional" */
  if (!e && psize) *psize = size;
  return fk_ret("cuMemGetAddressRange_v2", e, "ptr=0x%llx base=0x%llx size=%zu",
                FK_P(dptr), FK_P(base), size);
}

/* Keys a copy or memset that touched pool memory adds to its line (see
 * fake_pool.h): " pending_us=<us until the allocation completes> alloc=<its
 * nonce>" (the most pending side); nothing for other memory. */
#define touched fk_pool_touched

/* Synchronous copies: done before returning (and after the legacy stream). */
CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  GATE(NEED_CTX);
  char t[64];
  fk_touch.pool = 0;
  if (!e) e = fk_copy(dst, 1, (uintptr_t)src, 0, n, dev);
  return fk_ret("cuMemcpyHtoD_v2", e, "dst=0x%llx src=0x%llx n=%zu%s",
                FK_P(dst), FK_P(src), n, touched(t));
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  GATE(NEED_CTX);
  char t[64];
  fk_touch.pool = 0;
  if (!e) e = fk_copy((uintptr_t)dst, 0, src, 1, n, dev);
  return fk_ret("cuMemcpyDtoH_v2", e, "dst=0x%llx src=0x%llx n=%zu%s",
                FK_P(dst), FK_P(src), n, touched(t));
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  GATE(NEED_CTX);
  char t[64];
  fk_touch.pool = 0;
  if (!e) e = fk_copy(dst, 1, src, 1, n, dev);
  return fk_ret("cuMemcpyDtoD_v2", e, "dst=0x%llx src=0x%llx n=%zu%s",
                FK_P(dst), FK_P(src), n, touched(t));
}
CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n) {
  GATE(NEED_CTX);
  char t[64];
  fk_touch.pool = 0;
  if (!e) e = fk_memset(dst, uc, n, dev);
  return fk_ret("cuMemsetD8_v2", e, "dst=0x%llx value=%u n=%zu%s", FK_P(dst),
                uc, n, touched(t));
}

/* The plain names keep the CUDA 2.x ABI (32-bit device pointers). */
#define OLD_ABI(call)                                                          \
  return (CUresult)fk_ret(                                                     \
      call, gate(NEED_NOTHING, &(int){0}) ? FK_ESTUB : FK_ENOTSUP, "abi=v1")
CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1 *p, unsigned int n) {
  (void)p, (void)n;
  OLD_ABI("cuMemAlloc");
}
CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 p) {
  (void)p;
  OLD_ABI("cuMemFree");
}
CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr_v1 *b, unsigned int *s,
                                      CUdeviceptr_v1 p) {
  (void)b, (void)s, (void)p;
  OLD_ABI("cuMemGetAddressRange");
}
CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr_v1 d, const void *s, unsigned int n) {
  (void)d, (void)s, (void)n;
  OLD_ABI("cuMemcpyHtoD");
}
CUresult CUDAAPI cuMemcpyDtoH(void *d, CUdeviceptr_v1 s, unsigned int n) {
  (void)d, (void)s, (void)n;
  OLD_ABI("cuMemcpyDtoH");
}
CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr_v1 d, CUdeviceptr_v1 s,
                              unsigned int n) {
  (void)d, (void)s, (void)n;
  OLD_ABI("cuMemcpyDtoD");
}
CUresult CUDAAPI cuMemsetD8(CUdeviceptr_v1 d, unsigned char c, unsigned int n) {
  (void)d, (void)c, (void)n;
  OLD_ABI("cuMemsetD8");
}

/* fk_ptr_attr, plus CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: "Returns the
 * mempool handle for the allocation if it was allocated from a mempool.
 * Otherwise returns NULL." (an imported pointer: the imported pool) */
static int ptr_attr(void *data, int attr, uintptr_t p) {
  uint64_t h = 0, pn, n;
  if (attr != CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE)
    return fk_ptr_attr(data, attr, p, CU_MEMORYTYPE_DEVICE, ctx_ptrs);
  if (!data || !fk_is_device_ptr(p)) return FK_EINVAL;
  if (!fk_pool_of(p, &h, &pn, &n)) h = 0;
  *(CUmemoryPool *)data = (CUmemoryPool)(uintptr_t)h;
  return FK_OK;
}

CUresult CUDAAPI cuPointerGetAttribute(void *data,
                                       CUpointer_attribute attribute,
                                       CUdeviceptr ptr) {
  GATE(NEED_INIT);
  if (!e) e = ptr_attr(data, attribute, ptr);
  return fk_ret("cuPointerGetAttribute", e, "attr=%d ptr=0x%llx",
                (int)attribute, FK_P(ptr));
}

/* "Unlike cuPointerGetAttribute, this function will not return an error when
 * the ptr encountered is not a valid CUDA pointer": such values are zeroed. */
CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes,
                                        CUpointer_attribute *attributes,
                                        void **data, CUdeviceptr ptr) {
  GATE(NEED_INIT);
  static const unsigned char size[] = {
      [FK_PA_CONTEXT] = 8,          [FK_PA_MEMORY_TYPE] = 4,
      [FK_PA_DEVICE_POINTER] = 8,   [FK_PA_HOST_POINTER] = 8,
      [FK_PA_BUFFER_ID] = 8,        [FK_PA_IS_MANAGED] = 4,
      [FK_PA_DEVICE_ORDINAL] = 4,   [FK_PA_IS_LEGACY_IPC_CAPABLE] = 4,
      [FK_PA_RANGE_START_ADDR] = 8, [FK_PA_RANGE_SIZE] = 8,
      [FK_PA_MAPPED] = 4,           [17] = 8}; /* MEMPOOL_HANDLE */
  if (!e && (!attributes || !data)) e = FK_EINVAL;
  for (unsigned i = 0; !e && i < numAttributes; i++) {
    unsigned a = (unsigned)attributes[i];
    if (a >= sizeof size || !size[a])
      e = FK_ENOTSUP;
    else if (data[i] && ptr_attr(data[i], (int)a, ptr))
      memset(data[i], 0, size[a]);
  }
  return fk_ret("cuPointerGetAttributes", e, "n=%u ptr=0x%llx", numAttributes,
                FK_P(ptr));
}

/* ---- IPC memory ---------------------------------------------------------- */

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
  GATE(NEED_CTX);
  struct fk_handle h = {0};
  char id[40];
  if (!e && !pHandle) e = FK_EINVAL;
  if (!e) e = fk_ipc_get_mem(&h, dptr);
  if (!e) memcpy(pHandle, &h, sizeof h);
  return fk_ret("cuIpcGetMemHandle", e, "ptr=0x%llx h=%s", FK_P(dptr),
                fk_hid(id, h.pid, h.nonce));
}

static CUresult ipc_open(const char *call, CUdeviceptr *pdptr,
                         CUipcMemHandle handle, unsigned int Flags) {
  GATE(NEED_CTX);
  struct fk_handle h;
  uintptr_t p = 0;
  char id[40];
  memcpy(&h, &handle, sizeof h);
  /* Flags "Must be specified as CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS" */
  if (!e && (!pdptr || Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
    e = FK_EINVAL;
  if (!e) e = fk_ipc_open_mem(&p, &h, dev);
  if (!e) *pdptr = p;
  return fk_ret(call, e, "h=%s flags=%u ptr=0x%llx", fk_hid(id, h.pid, h.nonce),
                Flags, FK_P(p));
}
CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr,
                                       CUipcMemHandle handle,
                                       unsigned int Flags) {
  return ipc_open("cuIpcOpenMemHandle_v2", pdptr, handle, Flags);
}
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                    unsigned int Flags) {
  return ipc_open("cuIpcOpenMemHandle", pdptr, handle, Flags);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  GATE(NEED_CTX);
  pid_t src = 0;
  uint64_t nonce = 0;
  char id[40];
  if (!e) e = fk_ipc_close_mem(dptr, &src, &nonce);
  return fk_ret("cuIpcCloseMemHandle", e, "ptr=0x%llx h=%s", FK_P(dptr),
                fk_hid(id, src, nonce));
}

/* ---- streams and events -------------------------------------------------- */

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  GATE(NEED_CTX);
  void *s = NULL;
  if (!e && (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING)))
    e = FK_EINVAL;
  if (!e) e = fk_stream_create(&s, Flags, dev);
  if (!e) *phStream = s;
  return fk_ret("cuStreamCreate", e, "flags=%u stream=0x%llx", Flags, FK_P(s));
}

static CUresult stream_destroy(const char *call, CUstream s) {
  GATE(NEED_INIT);
  if (!e) e = fk_stream_destroy(s);
  return fk_ret(call, e, "stream=0x%llx", FK_P(s));
}
CUresult CUDAAPI cuStreamDestroy_v2(CUstream s) {
  return stream_destroy("cuStreamDestroy_v2", s);
}
CUresult CUDAAPI cuStreamDestroy(CUstream s) {
  return stream_destroy("cuStreamDestroy", s);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
  GATE(NEED_INIT);
  unsigned long long us = 0;
  if (!e) e = fk_stream_sync(s, dev, 1, &us);
  return fk_ret("cuStreamSynchronize", e, "stream=0x%llx waited_us=%llu",
                FK_P(s), us);
}

CUresult CUDAAPI cuStreamQuery(CUstream s) {
  GATE(NEED_INIT);
  unsigned long long us = 0;
  if (!e) e = fk_stream_sync(s, dev, 0, &us);
  return fk_ret("cuStreamQuery", e, "stream=0x%llx left_us=%llu", FK_P(s), us);
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream s, CUevent ev, unsigned int Flags) {
  GATE(NEED_INIT);
  unsigned long long us = 0;
  if (!e && (Flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)) e = FK_EINVAL;
  if (!e) e = fk_stream_wait_event(s, ev, dev, &us);
  return fk_ret("cuStreamWaitEvent", e,
                "stream=0x%llx event=0x%llx flags=%u pending_us=%llu", FK_P(s),
                FK_P(ev), Flags, us);
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  GATE(NEED_CTX);
  void *ev = NULL;
  if (!e && (!phEvent || (Flags & ~7u))) e = FK_EINVAL;
  /* "CU_EVENT_INTERPROCESS must be specified along with
   * CU_EVENT_DISABLE_TIMING" */
  if (!e && (Flags & CU_EVENT_INTERPROCESS) &&
      !(Flags & CU_EVENT_DISABLE_TIMING))
    e = FK_EINVAL;
  if (!e) e = fk_event_create(&ev, Flags, dev);
  if (!e) *phEvent = ev;
  return fk_ret("cuEventCreate", e, "flags=%u event=0x%llx", Flags, FK_P(ev));
}

CUresult CUDAAPI cuEventRecord(CUevent ev, CUstream s) {
  GATE(NEED_INIT);
  unsigned long long rec = 0, us = 0;
  if (!e) e = fk_event_record(ev, s, dev, &rec, &us);
  return fk_ret("cuEventRecord", e,
                "event=0x%llx stream=0x%llx rec=%llu done_in_us=%llu", FK_P(ev),
                FK_P(s), rec, us);
}

CUresult CUDAAPI cuEventQuery(CUevent ev) {
  GATE(NEED_INIT);
  unsigned long long us = 0;
  if (!e) e = fk_event_sync(ev, 0, &us); /* CUDA_ERROR_NOT_READY until done */
  return fk_ret("cuEventQuery", e, "event=0x%llx left_us=%llu", FK_P(ev), us);
}

CUresult CUDAAPI cuEventSynchronize(CUevent ev) {
  GATE(NEED_INIT);
  unsigned long long us = 0;
  if (!e) e = fk_event_sync(ev, 1, &us);
  return fk_ret("cuEventSynchronize", e, "event=0x%llx waited_us=%llu",
                FK_P(ev), us);
}

static CUresult event_destroy(const char *call, CUevent ev) {
  GATE(NEED_INIT);
  if (!e) e = fk_event_destroy(ev);
  return fk_ret(call, e, "event=0x%llx", FK_P(ev));
}
CUresult CUDAAPI cuEventDestroy_v2(CUevent ev) {
  return event_destroy("cuEventDestroy_v2", ev);
}
CUresult CUDAAPI cuEventDestroy(CUevent ev) {
  return event_destroy("cuEventDestroy", ev);
}

CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent ev) {
  GATE(NEED_CTX);
  struct fk_handle h = {0};
  char id[40];
  if (!e && !pHandle) e = FK_EINVAL;
  if (!e) e = fk_ipc_get_event(&h, ev);
  if (!e) memcpy(pHandle, &h, sizeof h);
  return fk_ret("cuIpcGetEventHandle", e, "event=0x%llx h=%s", FK_P(ev),
                fk_hid(id, h.pid, h.nonce));
}

CUresult CUDAAPI cuIpcOpenEventHandle(CUevent *phEvent,
                                      CUipcEventHandle handle) {
  GATE(NEED_CTX);
  struct fk_handle h;
  void *ev = NULL;
  char id[40];
  memcpy(&h, &handle, sizeof h);
  if (!e && !phEvent) e = FK_EINVAL;
  if (!e) e = fk_ipc_open_event(&ev, &h, dev);
  if (!e) *phEvent = ev;
  return fk_ret("cuIpcOpenEventHandle", e, "h=%s event=0x%llx",
                fk_hid(id, h.pid, h.nonce), FK_P(ev));
}

/* ---- virtual memory management, cuCtxSynchronize ------------------------- */

#include "fake_cuda_vmm.c"

/* ---- stream-ordered memory pools ----------------------------------------- */

#include "fake_cuda_pool.c"

/* ---- errors -------------------------------------------------------------- */

/* "If the error code is not recognized, CUDA_ERROR_INVALID_VALUE will be
 * returned and *pStr will be set to the NULL address" (the stub leaves *pStr).
 */
static CUresult error_text(const char *call, CUresult error, const char **pStr,
                           int want_name) {
  GATE(NEED_NOTHING);
  if (!e && !pStr) e = FK_EINVAL;
  if (!e) {
    *pStr = NULL;
    e = FK_EINVAL;
    for (size_t i = 0; i < sizeof errs / sizeof *errs; i++)
      if (errs[i].code == error) {
        *pStr = want_name ? errs[i].name : errs[i].text;
        e = FK_OK;
      }
  }
  return fk_ret(call, e, "error=%d", (int)error);
}
CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
  return error_text("cuGetErrorString", error, pStr, 0);
}
CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
  return error_text("cuGetErrorName", error, pStr, 1);
}

/* ---- cuGetProcAddress ---------------------------------------------------- */

/* Base name, the CUDA version that introduced that ABI (cudaTypedefs.h
 * PFN_<name>_v<version>), implementation. */
#define P(name, ver, fn)                                                       \
  { #name, ver, (void (*)(void))fn }
static const struct {
  const char *name;
  int ver;
  void (*fn)(void); /* cast back by the caller, like dlsym's result */
} procs[] = {
    P(cuInit, 2000, cuInit),
    P(cuDriverGetVersion, 2020, cuDriverGetVersion),
    P(cuDeviceGet, 2000, cuDeviceGet),
    P(cuDeviceGetCount, 2000, cuDeviceGetCount),
    P(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute),
    P(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain),
    P(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease),
    P(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2),
    P(cuCtxGetCurrent, 4000, cuCtxGetCurrent),
    P(cuCtxSetCurrent, 4000, cuCtxSetCurrent),
    P(cuCtxSynchronize, 2000, cuCtxSynchronize),
    P(cuCtxSynchronize, 13000, cuCtxSynchronize_v2),
    P(cuMemAlloc, 2000, cuMemAlloc),
    P(cuMemAlloc, 3020, cuMemAlloc_v2),
    P(cuMemFree, 2000, cuMemFree),
    P(cuMemFree, 3020, cuMemFree_v2),
    P(cuMemGetAddressRange, 2000, cuMemGetAddressRange),
    P(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2),
    P(cuMemcpyHtoD, 2000, cuMemcpyHtoD),
    P(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2),
    P(cuMemcpyDtoH, 2000, cuMemcpyDtoH),
    P(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2),
    P(cuMemcpyDtoD, 2000, cuMemcpyDtoD),
    P(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2),
    P(cuMemsetD8, 2000, cuMemsetD8),
    P(cuMemsetD8, 3020, cuMemsetD8_v2),
    P(cuPointerGetAttribute, 4000, cuPointerGetAttribute),
    P(cuPointerGetAttributes, 7000, cuPointerGetAttributes),
    P(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle),
    P(cuIpcOpenMemHandle, 4010, cuIpcOpenMemHandle),
    P(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2),
    P(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle),
    P(cuIpcGetEventHandle, 4010, cuIpcGetEventHandle),
    P(cuIpcOpenEventHandle, 4010, cuIpcOpenEventHandle),
    P(cuMemAddressReserve, 10020, cuMemAddressReserve),
    P(cuMemAddressFree, 10020, cuMemAddressFree),
    P(cuMemCreate, 10020, cuMemCreate),
    P(cuMemRelease, 10020, cuMemRelease),
    P(cuMemMap, 10020, cuMemMap),
    P(cuMemUnmap, 10020, cuMemUnmap),
    P(cuMemSetAccess, 10020, cuMemSetAccess),
    P(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle),
    P(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle),
    P(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity),
    P(cuMemGetAllocationPropertiesFromHandle, 10020,
      cuMemGetAllocationPropertiesFromHandle),
    P(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle),
    P(cuMemPoolCreate, 11020, cuMemPoolCreate),
    P(cuMemPoolDestroy, 11020, cuMemPoolDestroy),
    P(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync),
    P(cuMemFreeAsync, 11020, cuMemFreeAsync),
    P(cuMemPoolSetAccess, 11020, cuMemPoolSetAccess),
    P(cuMemPoolGetAccess, 11020, cuMemPoolGetAccess),
    P(cuMemPoolExportToShareableHandle, 11020,
      cuMemPoolExportToShareableHandle),
    P(cuMemPoolImportFromShareableHandle, 11020,
      cuMemPoolImportFromShareableHandle),
    P(cuMemPoolExportPointer, 11020, cuMemPoolExportPointer),
    P(cuMemPoolImportPointer, 11020, cuMemPoolImportPointer),
    P(cuStreamCreate, 2000, cuStreamCreate),
    P(cuStreamDestroy, 2000, cuStreamDestroy),
    P(cuStreamDestroy, 4000, cuStreamDestroy_v2),
    P(cuStreamSynchronize, 2000, cuStreamSynchronize),
    P(cuStreamQuery, 2000, cuStreamQuery),
    P(cuStreamWaitEvent, 3020, cuStreamWaitEvent),
    P(cuEventCreate, 2000, cuEventCreate),
    P(cuEventRecord, 2000, cuEventRecord),
    P(cuEventQuery, 2000, cuEventQuery),
    P(cuEventSynchronize, 2000, cuEventSynchronize),
    P(cuEventDestroy, 2000, cuEventDestroy),
    P(cuEventDestroy, 4000, cuEventDestroy_v2),
    P(cuGetErrorString, 6000, cuGetErrorString),
    P(cuGetErrorName, 6000, cuGetErrorName),
    P(cuGetProcAddress, 11030, cuGetProcAddress),
    P(cuGetProcAddress, 12000, cuGetProcAddress_v2),
};

/* The per-thread default stream variants (cudaTypedefs.h PFN_<name>_ptsz)
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM asks for. */
static const struct {
  const char *name;
  void (*fn)(void);
} ptsz[] = {
    {"cuMemAllocFromPoolAsync", (void (*)(void))cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", (void (*)(void))cuMemFreeAsync_ptsz},
};

/* "returns the newest ABI introduced at or before cudaVersion"; unknown or too
 * new -> CUDA_SUCCESS with *pfn NULL and the reason in symbolStatus; a
 * cudaVersion above the driver's -> CUDA_ERROR_INVALID_VALUE. Works before
 * cuInit. The per-thread-stream flag picks a _ptsz variant where there is one
 * (no _ptds variants: none of the calls here has one).
 */
static CUresult proc_address(const char *call, const char *symbol, void **pfn,
                             int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
  GATE(NEED_NOTHING);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (pfn) *pfn = NULL;
  if (!e && (!symbol || !pfn ||
             flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ||
             cudaVersion > driver_version()))
    e = FK_EINVAL;
  for (size_t i = 0; !e && i < sizeof procs / sizeof *procs; i++) {
    if (strcmp(procs[i].name, symbol)) continue;
    if (procs[i].ver > cudaVersion) {
      if (!*pfn) status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
      continue;
    }
    /* entries are oldest first: the last match wins */
    memcpy(pfn, &procs[i].fn, sizeof *pfn);
    status = CU_GET_PROC_ADDRESS_SUCCESS;
  }
  for (size_t i = 0; !e && *pfn && i < sizeof ptsz / sizeof *ptsz; i++)
    if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) &&
        !strcmp(ptsz[i].name, symbol))
      memcpy(pfn, &ptsz[i].fn, sizeof *pfn);
  if (!e && fk_knob("HIDE") && !strcmp(fk_knob("HIDE"), symbol)) {
    *pfn = NULL;
    status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  if (!e && symbolStatus) *symbolStatus = status;
  return fk_ret(call, e, "symbol=%s version=%d flags=%llu status=%d pfn=0x%llx",
                symbol ? symbol : "(null)", cudaVersion,
                (unsigned long long)flags, e ? -1 : (int)status,
                FK_P(pfn ? *pfn : NULL));
}
CUresult CUDAAPI cuGetProcAddress_v2(
    const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
    CUdriverProcAddressQueryResult *symbolStatus) {
  return proc_address("cuGetProcAddress_v2", symbol, pfn, cudaVersion, flags,
                      symbolStatus);
}
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn,
                                  int cudaVersion, cuuint64_t flags) {
  return proc_address("cuGetProcAddress", symbol, pfn, cudaVersion, flags,
                      NULL);
}
