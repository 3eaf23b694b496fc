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
 *   - device segments from cuMemAlloc; blocks are cut from them as host
 *     blocks are from memfds, and an allocation that fails sweeps the limbo
 *     and retries first;
 *   - a pointer from any other allocator is found in its allocation with
 *     cuMemGetAddressRange; the base is exported once (cuIpcGetMemHandle)
 *     and the offset travels beside the handle. Memory legacy IPC cannot
 *     export (VMM, stream-ordered pools) is refused with IPCREF_EINVAL;
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
 * NULL), ENOMEM, ENODEV (no driver library, a driver older than CUDA 11.3,
 * the toolkit's stub library, no device): ipcref_cuda_error() says which. */
IPCREF_API ipcref_result ipcref_cuda_open(const char *driver_path,
                                          ipcref_cuda **out);

/* Why the last ipcref_cuda_open (or backend call) on this thread failed,
 * in English; "" when nothing failed. */
IPCREF_API const char *ipcref_cuda_error(void);

/* The backend to give ipcref_ctx_add_backend; NULL for NULL. */
IPCREF_API ipcref_backend *ipcref_cuda_backend(ipcref_cuda *cu);

/* Releases the driver's contexts, the event pool and the library. Every
 * context the backend was added to must be freed first. NULL: no-op. */
IPCREF_API void ipcref_cuda_close(ipcref_cuda *cu);

/* A shared device buffer of `size` bytes on device `device` (the backend
 * must be added to ctx): ipcref_device_new for CUDA. */
IPCREF_API ipcref_result ipcref_cuda_alloc(ipcref_ctx *ctx, int device,
                                           size_t size, ipcref_buf **out);

/* Adopts `size` bytes at device address `ptr` from another allocator:
 * ipcref_device_wrap for CUDA (see there). */
IPCREF_API ipcref_result ipcref_cuda_wrap(
    ipcref_ctx *ctx, int device, unsigned long long ptr, size_t size,
    void (*release)(void *user, void *ptr), void *user, ipcref_buf **out);

#ifdef __cplusplus
}
#endif

#endif /* IPCREF_CUDA_H_INCLUDED */

/* @implementation */

#if defined(IPCREF_CUDA_IMPLEMENTATION) &&                                     \
    !defined(IPCREF_CUDA_IMPLEMENTATION_INCLUDED)
#define IPCREF_CUDA_IMPLEMENTATION_INCLUDED

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* ---- the driver's types ---------------------------------------------------
 * With <cuda.h> included first, its own types, and the compiler checks each
 * entry point below against the header's prototype; without it, the same
 * layouts (a CUipcMemHandle is a 64-byte struct passed by value). */
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
#endif

/* The numbers used here (cuda.h). */
#define IPCREF__CU_SUCCESS                 0
#define IPCREF__CU_ERROR_OUT_OF_MEMORY     2
#define IPCREF__CU_ERROR_STUB_LIBRARY      34
#define IPCREF__CU_ERROR_NO_DEVICE         100
#define IPCREF__CU_ERROR_INVALID_CONTEXT   201
#define IPCREF__CU_ERROR_NOT_READY         600
#define IPCREF__CU_EVENT_DISABLE_TIMING    0x2
#define IPCREF__CU_EVENT_INTERPROCESS      0x4
#define IPCREF__CU_IPC_LAZY_PEER_ACCESS    0x1
#define IPCREF__CU_ATTR_LEGACY_IPC_CAPABLE 10
#define IPCREF__CU_PROC_VERSION            12000 /* every symbol we use */

typedef ipcref__cu_result (*ipcref__cu_get_proc_v2)(const char *, void **, int,
                                                    unsigned long long,
                                                    ipcref__cu_query *);
typedef ipcref__cu_result (*ipcref__cu_get_proc_v1)(const char *, void **, int,
                                                    unsigned long long);

/* The entry points, by the name cuGetProcAddress knows them. */
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
} ipcref__cu_api;

#ifdef CUDA_VERSION
/* Each pointer type against the real prototype: a mismatch is a
 * diagnostic (distinct pointer types), and sizeof keeps it from linking. */
#define IPCREF__CU_CHECK(field, fn)                                            \
  (void)sizeof(((ipcref__cu_api *)0)->field == &fn)
IPCREF_PRIVATE void ipcref__cu_check_prototypes(void) {
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
  (void)sizeof(ipcref__cu_mem_handle[sizeof(CUipcMemHandle) == 64 ? 1 : -1]);
}
#endif

/* ---- the backend's state ------------------------------------------------- */

#define IPCREF__CU_DEVICES 64

/* An interprocess event of the pool, with its handle made once. */
typedef struct ipcref__cu_ipc_event {
  ipcref__cu_event ev;
  int dev;
  unsigned char handle[64];
  struct ipcref__cu_ipc_event *next; /* the free list */
} ipcref__cu_ipc_event;

/* An allocation opened from another process, counted. */
typedef struct ipcref__cu_open {
  unsigned char handle[64];
  int dev;
  ipcref__cu_ptr addr;
  int refs;
  struct ipcref__cu_open *next;
} ipcref__cu_open;

/* An allocation this process exported, so that its handle resolves here. */
typedef struct ipcref__cu_export {
  unsigned char handle[64];
  ipcref__cu_ptr base;
  struct ipcref__cu_export *next;
} ipcref__cu_export;

struct ipcref_cuda {
  ipcref_backend backend; /* first: the backend's pointer is ours */
  void *lib;
  ipcref__cu_api api;
  pthread_mutex_t lock;
  ipcref__cu_context ctx[IPCREF__CU_DEVICES]; /* primary, once retained */
  ipcref__cu_device devs[IPCREF__CU_DEVICES];
  ipcref__cu_ipc_event *free_events; /* the pool: events not in use */
  ipcref__cu_open *opens;
  ipcref__cu_export *exports;
  size_t nevents;
};

static __thread char ipcref__cu_why[256];

/* Records why something failed, for ipcref_cuda_error(). */
IPCREF_PRIVATE ipcref_result ipcref__cu_fail(ipcref_result r, const char *what,
                                             const ipcref_cuda *cu, int cr) {
  const char *name = NULL;
  if (cu && cu->api.GetErrorName && cr != IPCREF__CU_SUCCESS)
    (void)cu->api.GetErrorName((ipcref__cu_result)cr, &name);
  if (cr != IPCREF__CU_SUCCESS)
    snprintf(ipcref__cu_why, sizeof ipcref__cu_why, "%s: %s (%d)", what,
             name ? name : "CUDA error", (int)cr);
  else
    snprintf(ipcref__cu_why, sizeof ipcref__cu_why, "%s", what);
  return r;
}

IPCREF_API const char *ipcref_cuda_error(void) {
  return ipcref__cu_why;
}

/* A driver error as an ipcref code. */
IPCREF_PRIVATE ipcref_result ipcref__cu_code(ipcref__cu_result cr) {
  switch ((int)cr) {
  case IPCREF__CU_SUCCESS: return IPCREF_OK;
  case IPCREF__CU_ERROR_OUT_OF_MEMORY: return IPCREF_ENOMEM;
  case IPCREF__CU_ERROR_STUB_LIBRARY:
  case IPCREF__CU_ERROR_NO_DEVICE: return IPCREF_ENODEV;
  default: return IPCREF_EINVAL;
  }
}

/* Makes device `dev`'s primary context current on this thread (retained
 * once). */
IPCREF_PRIVATE ipcref_result ipcref__cu_use(ipcref_cuda *cu, int dev) {
  ipcref__cu_result cr;
  ipcref__cu_context c;
  if (dev < 0 || dev >= IPCREF__CU_DEVICES)
    return ipcref__cu_fail(IPCREF_ENODEV, "device ordinal out of range", cu, 0);
  pthread_mutex_lock(&cu->lock);
  c = cu->ctx[dev];
  if (!c) {
    ipcref__cu_device d;
    cr = cu->api.DeviceGet(&d, dev);
    if (cr == IPCREF__CU_SUCCESS) cr = cu->api.DevicePrimaryCtxRetain(&c, d);
    if (cr != IPCREF__CU_SUCCESS) {
      pthread_mutex_unlock(&cu->lock);
      return ipcref__cu_fail(IPCREF_ENODEV, "cuDevicePrimaryCtxRetain", cu, cr);
    }
    cu->ctx[dev] = c;
    cu->devs[dev] = d;
  }
  pthread_mutex_unlock(&cu->lock);
  cr = cu->api.CtxSetCurrent(c);
  if (cr != IPCREF__CU_SUCCESS)
    return ipcref__cu_fail(IPCREF_ENODEV, "cuCtxSetCurrent", cu, cr);
  return IPCREF_OK;
}

#define IPCREF__CU(be) ((ipcref_cuda *)(void *)(be))

/* ---- segments ------------------------------------------------------------ */

IPCREF_PRIVATE ipcref_result ipcref__cu_seg_alloc(ipcref_backend *be,
                                                  int32_t dev, size_t size,
                                                  uint64_t *addr) {
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_ptr p = 0;
  ipcref__cu_result cr;
  ipcref_result r = ipcref__cu_use(cu, dev);
  if (r != IPCREF_OK) return r;
  cr = cu->api.MemAlloc(&p, size);
  if (cr != IPCREF__CU_SUCCESS)
    return ipcref__cu_fail(ipcref__cu_code(cr), "cuMemAlloc", cu, cr);
  *addr = (uint64_t)p;
  return IPCREF_OK;
}

IPCREF_PRIVATE void ipcref__cu_seg_free(ipcref_backend *be, int32_t dev,
                                        uint64_t addr) {
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_export **pp;
  if (ipcref__cu_use(cu, dev) == IPCREF_OK)
    (void)cu->api.MemFree((ipcref__cu_ptr)addr);
  pthread_mutex_lock(&cu->lock); /* its handle no longer names it */
  for (pp = &cu->exports; *pp; pp = &(*pp)->next)
    if ((*pp)->base == (ipcref__cu_ptr)addr) {
      ipcref__cu_export *x = *pp;
      *pp = x->next;
      IPCREF_FREE(x);
      break;
    }
  pthread_mutex_unlock(&cu->lock);
}

IPCREF_PRIVATE ipcref_result ipcref__cu_seg_range(ipcref_backend *be,
                                                  int32_t dev, uint64_t addr,
                                                  uint64_t *base,
                                                  size_t *size) {
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_ptr b = 0;
  size_t n = 0;
  ipcref__cu_result cr;
  ipcref_result r = ipcref__cu_use(cu, dev);
  if (r != IPCREF_OK) return r;
  cr = cu->api.MemGetAddressRange(&b, &n, (ipcref__cu_ptr)addr);
  if (cr != IPCREF__CU_SUCCESS)
    return ipcref__cu_fail(IPCREF_EINVAL, "cuMemGetAddressRange", cu, cr);
  *base = (uint64_t)b;
  *size = n;
  return IPCREF_OK;
}

IPCREF_PRIVATE ipcref_result ipcref__cu_seg_export(ipcref_backend *be,
                                                   int32_t dev, uint64_t base,
                                                   unsigned char *handle) {
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_mem_handle h;
  ipcref__cu_export *x;
  ipcref__cu_result cr;
  int capable = 1;
  ipcref_result r = ipcref__cu_use(cu, dev);
  if (r != IPCREF_OK) return r;
  /* VMM and stream-ordered pool memory cannot go through legacy IPC. */
  if (cu->api.PointerGetAttribute &&
      cu->api.PointerGetAttribute(
          &capable, (ipcref__cu_attr)IPCREF__CU_ATTR_LEGACY_IPC_CAPABLE,
          (ipcref__cu_ptr)base) == IPCREF__CU_SUCCESS &&
      !capable)
    return ipcref__cu_fail(IPCREF_EINVAL,
                           "memory not exportable by legacy CUDA IPC (VMM or "
                           "a stream-ordered pool)",
                           cu, 0);
  memset(&h, 0, sizeof h);
  cr = cu->api.IpcGetMemHandle(&h, (ipcref__cu_ptr)base);
  if (cr != IPCREF__CU_SUCCESS)
    return ipcref__cu_fail(ipcref__cu_code(cr), "cuIpcGetMemHandle", cu, cr);
  memcpy(handle, &h, 64);
  x = (ipcref__cu_export *)IPCREF_MALLOC(sizeof *x);
  if (!x) return IPCREF_ENOMEM;
  memcpy(x->handle, &h, 64);
  x->base = (ipcref__cu_ptr)base;
  pthread_mutex_lock(&cu->lock);
  x->next = cu->exports;
  cu->exports = x;
  pthread_mutex_unlock(&cu->lock);
  return IPCREF_OK;
}

IPCREF_PRIVATE ipcref_result ipcref__cu_seg_import(ipcref_backend *be,
                                                   int32_t dev,
                                                   const unsigned char *handle,
                                                   uint64_t *addr) {
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_export *x;
  ipcref__cu_open *o;
  ipcref__cu_mem_handle h;
  ipcref__cu_ptr p = 0;
  ipcref__cu_result cr;
  ipcref_result r;
  pthread_mutex_lock(&cu->lock);
  for (x = cu->exports; x; x = x->next) /* ours: the pointer itself */
    if (memcmp(x->handle, handle, 64) == 0) {
      *addr = (uint64_t)x->base;
      pthread_mutex_unlock(&cu->lock);
      return IPCREF_OK;
    }
  for (o = cu->opens; o; o = o->next) /* opened already: one more user */
    if (o->dev == dev && memcmp(o->handle, handle, 64) == 0) {
      o->refs++;
      *addr = (uint64_t)o->addr;
      pthread_mutex_unlock(&cu->lock);
      return IPCREF_OK;
    }
  pthread_mutex_unlock(&cu->lock);
  o = (ipcref__cu_open *)IPCREF_MALLOC(sizeof *o);
  if (!o) return IPCREF_ENOMEM;
  r = ipcref__cu_use(cu, dev);
  if (r != IPCREF_OK) {
    IPCREF_FREE(o);
    return r;
  }
  memcpy(&h, handle, 64);
  cr = cu->api.IpcOpenMemHandle(&p, h, IPCREF__CU_IPC_LAZY_PEER_ACCESS);
  if (cr != IPCREF__CU_SUCCESS) {
    IPCREF_FREE(o);
    /* A handle that opens nothing (freed, forged, its exporter gone) is
     * bad input; running out of memory is not. */
    return ipcref__cu_fail(cr == IPCREF__CU_ERROR_OUT_OF_MEMORY ? IPCREF_ENOMEM
                                                                : IPCREF_EPROTO,
                           "cuIpcOpenMemHandle", cu, cr);
  }
  memcpy(o->handle, handle, 64);
  o->dev = dev;
  o->addr = p;
  o->refs = 1;
  pthread_mutex_lock(&cu->lock);
  o->next = cu->opens;
  cu->opens = o;
  pthread_mutex_unlock(&cu->lock);
  *addr = (uint64_t)p;
  return IPCREF_OK;
}

IPCREF_PRIVATE void ipcref__cu_seg_close(ipcref_backend *be, int32_t dev,
                                         uint64_t addr) {
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_open **pp, *o = NULL;
  pthread_mutex_lock(&cu->lock);
  for (pp = &cu->opens; *pp; pp = &(*pp)->next)
    if ((*pp)->dev == dev && (*pp)->addr == (ipcref__cu_ptr)addr) {
      if (--(*pp)->refs == 0) {
        o = *pp;
        *pp = o->next;
      }
      break;
    }
  pthread_mutex_unlock(&cu->lock);
  if (!o) return; /* ours, or still used */
  if (ipcref__cu_use(cu, dev) == IPCREF_OK)
    (void)cu->api.IpcCloseMemHandle(o->addr);
  IPCREF_FREE(o);
}

/* ---- events ---------------------------------------------------------------
 */

IPCREF_PRIVATE ipcref_result ipcref__cu_event_record(ipcref_backend *be,
                                                     int32_t dev, void *stream,
                                                     unsigned char *handle,
                                                     void **event) {
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_ipc_event *e, **pp;
  ipcref__cu_result cr;
  ipcref_result r = ipcref__cu_use(cu, dev);
  if (r != IPCREF_OK) return r;
  pthread_mutex_lock(&cu->lock); /* a free event of this device */
  for (pp = &cu->free_events; *pp && (*pp)->dev != dev; pp = &(*pp)->next) {
  }
  e = *pp;
  if (e) *pp = e->next;
  pthread_mutex_unlock(&cu->lock);
  if (!e) { /* the pool grows: no limit on events outstanding */
    ipcref__cu_event_handle h;
    e = (ipcref__cu_ipc_event *)IPCREF_MALLOC(sizeof *e);
    if (!e) return IPCREF_ENOMEM;
    cr = cu->api.EventCreate(&e->ev, IPCREF__CU_EVENT_INTERPROCESS |
                                         IPCREF__CU_EVENT_DISABLE_TIMING);
    if (cr == IPCREF__CU_SUCCESS) {
      memset(&h, 0, sizeof h);
      cr = cu->api.IpcGetEventHandle(&h, e->ev);
      if (cr != IPCREF__CU_SUCCESS) (void)cu->api.EventDestroy(e->ev);
    }
    if (cr != IPCREF__CU_SUCCESS) {
      IPCREF_FREE(e);
      return ipcref__cu_fail(ipcref__cu_code(cr), "interprocess event", cu, cr);
    }
    memcpy(e->handle, &h, 64);
    e->dev = dev;
    pthread_mutex_lock(&cu->lock);
    cu->nevents++;
    pthread_mutex_unlock(&cu->lock);
  }
  cr = cu->api.EventRecord(e->ev, (ipcref__cu_stream)stream);
  if (cr != IPCREF__CU_SUCCESS) {
    pthread_mutex_lock(&cu->lock);
    e->next = cu->free_events;
    cu->free_events = e;
    pthread_mutex_unlock(&cu->lock);
    return ipcref__cu_fail(ipcref__cu_code(cr), "cuEventRecord", cu, cr);
  }
  memcpy(handle, e->handle, 64);
  *event = e;
  return IPCREF_OK;
}

/* Back to the pool, never destroyed before ipcref_cuda_close: a consumer
 * that opens the handle late finds an event recorded again later, which
 * only makes it wait longer. */
IPCREF_PRIVATE void ipcref__cu_event_free(ipcref_backend *be, void *event) {
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_ipc_event *e = (ipcref__cu_ipc_event *)event;
  pthread_mutex_lock(&cu->lock);
  e->next = cu->free_events;
  cu->free_events = e;
  pthread_mutex_unlock(&cu->lock);
}

IPCREF_PRIVATE ipcref_result
ipcref__cu_event_wait(ipcref_backend *be, int32_t dev, void *stream,
                      const unsigned char *handle) {
  static const unsigned char zero[64] = {0};
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_event_handle h;
  ipcref__cu_event ev;
  ipcref__cu_result cr;
  ipcref_result r;
  if (memcmp(handle, zero, 64) == 0) return IPCREF_OK;
  r = ipcref__cu_use(cu, dev);
  if (r != IPCREF_OK) return r;
  memcpy(&h, handle, 64);
  cr = cu->api.IpcOpenEventHandle(&ev, h);
  if (cr == IPCREF__CU_ERROR_INVALID_CONTEXT) { /* one of our own events */
    ipcref__cu_ipc_event *e;
    pthread_mutex_lock(&cu->lock);
    for (e = cu->free_events; e && memcmp(e->handle, handle, 64); e = e->next) {
    }
    pthread_mutex_unlock(&cu->lock);
    /* An event in use is not on the free list; the producer here recorded
     * it on its stream, which the legacy default stream orders anyway. */
    if (!e) return IPCREF_OK;
    cr = cu->api.StreamWaitEvent((ipcref__cu_stream)stream, e->ev, 0);
    return cr == IPCREF__CU_SUCCESS
               ? IPCREF_OK
               : ipcref__cu_fail(IPCREF_EPROTO, "cuStreamWaitEvent", cu, cr);
  }
  if (cr != IPCREF__CU_SUCCESS)
    return ipcref__cu_fail(IPCREF_EPROTO, "cuIpcOpenEventHandle", cu, cr);
  cr = cu->api.StreamWaitEvent((ipcref__cu_stream)stream, ev, 0);
  (void)cu->api.EventDestroy(ev); /* the wait is queued: the driver keeps it */
  if (cr != IPCREF__CU_SUCCESS)
    return ipcref__cu_fail(ipcref__cu_code(cr), "cuStreamWaitEvent", cu, cr);
  return IPCREF_OK;
}

/* A fence: a plain event after the work queued on `stream`. */
IPCREF_PRIVATE ipcref_result ipcref__cu_fence(ipcref_backend *be, int32_t dev,
                                              void *stream, void **fence) {
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_event ev;
  ipcref__cu_result cr;
  ipcref_result r = ipcref__cu_use(cu, dev);
  *fence = NULL;
  if (r != IPCREF_OK) return r;
  cr = cu->api.EventCreate(&ev, IPCREF__CU_EVENT_DISABLE_TIMING);
  if (cr != IPCREF__CU_SUCCESS)
    return ipcref__cu_fail(ipcref__cu_code(cr), "cuEventCreate", cu, cr);
  cr = cu->api.EventRecord(ev, (ipcref__cu_stream)stream);
  if (cr != IPCREF__CU_SUCCESS) {
    (void)cu->api.EventDestroy(ev);
    return ipcref__cu_fail(ipcref__cu_code(cr), "cuEventRecord", cu, cr);
  }
  if (cu->api.EventQuery(ev) == IPCREF__CU_SUCCESS) { /* nothing pending */
    (void)cu->api.EventDestroy(ev);
    return IPCREF_OK;
  }
  *fence = (void *)ev;
  return IPCREF_OK;
}

IPCREF_PRIVATE int ipcref__cu_fence_done(ipcref_backend *be, void *fence) {
  ipcref_cuda *cu = IPCREF__CU(be);
  ipcref__cu_event ev = (ipcref__cu_event)fence;
  ipcref__cu_result cr = cu->api.EventQuery(ev);
  if (cr == IPCREF__CU_ERROR_NOT_READY) return 0;
  (void)cu->api.EventDestroy(ev); /* done, or an error: nothing to wait on */
  return 1;
}

/* ---- loading ----------------------------------------------------------------
 */

IPCREF_API ipcref_result ipcref_cuda_open(const char *driver_path,
                                          ipcref_cuda **out) {
  ipcref__cu_get_proc_v2 get2;
  ipcref__cu_get_proc_v1 get1;
  ipcref_cuda *cu;
  ipcref__cu_result cr;
  const char *path = driver_path ? driver_path : "libcuda.so.1";
  int version = 0, i;
  /* Name and slot of every entry point; all are required. */
  struct {
    const char *name;
    void *slot; /* a function pointer's address */
  } syms[21];
  void *sym;
  ipcref__cu_why[0] = 0;
  if (!out) return IPCREF_EINVAL;
  cu = (ipcref_cuda *)IPCREF_MALLOC(sizeof *cu);
  if (!cu) return IPCREF_ENOMEM;
  memset(cu, 0, sizeof *cu);
  cu->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!cu->lib) {
    const char *e = dlerror();
    snprintf(ipcref__cu_why, sizeof ipcref__cu_why,
             "the CUDA driver library could not be loaded (%s): %s", path,
             e ? e : "not found");
    IPCREF_FREE(cu);
    return IPCREF_ENODEV;
  }
  /* The symbols by their base names, at a pinned version (cuda.h's macros
   * do not apply to strings: dlsym("cuMemAlloc") is the 32-bit v1 ABI). */
  /* dlsym gives objects; POSIX makes them functions (memcpy: ISO C has no
   * cast between the two). */
  sym = dlsym(cu->lib, "cuGetProcAddress_v2");
  memcpy(&get2, &sym, sizeof sym);
  sym = dlsym(cu->lib, "cuGetProcAddress");
  memcpy(&get1, &sym, sizeof sym);
  sym = dlsym(cu->lib, "cuDriverGetVersion");
  memcpy(&cu->api.DriverGetVersion, &sym, sizeof sym);
  if ((!get2 && !get1) || !cu->api.DriverGetVersion) {
    ipcref__cu_fail(IPCREF_ENODEV,
                    "the CUDA driver has no cuGetProcAddress (older than "
                    "CUDA 11.3)",
                    NULL, 0);
    goto fail;
  }
  cr = cu->api.DriverGetVersion(&version);
  if (cr != IPCREF__CU_SUCCESS) {
    ipcref__cu_fail(IPCREF_ENODEV, "cuDriverGetVersion", NULL, cr);
    if (cr == IPCREF__CU_ERROR_STUB_LIBRARY)
      snprintf(ipcref__cu_why, sizeof ipcref__cu_why,
               "%s is the CUDA toolkit's stub library, not a driver "
               "(CUDA_ERROR_STUB_LIBRARY, 34)",
               path);
    goto fail;
  }
  if (version > IPCREF__CU_PROC_VERSION) version = IPCREF__CU_PROC_VERSION;
#define IPCREF__CU_SYM(k, field)                                               \
  syms[k].name = "cu" #field;                                                  \
  syms[k].slot = (void *)&cu->api.field
  IPCREF__CU_SYM(0, Init);
  IPCREF__CU_SYM(1, GetErrorName);
  IPCREF__CU_SYM(2, DeviceGet);
  IPCREF__CU_SYM(3, DevicePrimaryCtxRetain);
  IPCREF__CU_SYM(4, DevicePrimaryCtxRelease);
  IPCREF__CU_SYM(5, CtxSetCurrent);
  IPCREF__CU_SYM(6, MemAlloc);
  IPCREF__CU_SYM(7, MemFree);
  IPCREF__CU_SYM(8, MemGetAddressRange);
  IPCREF__CU_SYM(9, PointerGetAttribute);
  IPCREF__CU_SYM(10, IpcGetMemHandle);
  IPCREF__CU_SYM(11, IpcOpenMemHandle);
  IPCREF__CU_SYM(12, IpcCloseMemHandle);
  IPCREF__CU_SYM(13, EventCreate);
  IPCREF__CU_SYM(14, EventRecord);
  IPCREF__CU_SYM(15, EventQuery);
  IPCREF__CU_SYM(16, EventDestroy);
  IPCREF__CU_SYM(17, IpcGetEventHandle);
  IPCREF__CU_SYM(18, IpcOpenEventHandle);
  IPCREF__CU_SYM(19, StreamWaitEvent);
  IPCREF__CU_SYM(20, DriverGetVersion);
#undef IPCREF__CU_SYM
  for (i = 0; i < 21; i++) {
    void *fn = NULL;
    ipcref__cu_query q = (ipcref__cu_query)0;
    cr = get2 ? get2(syms[i].name, &fn, version, 0, &q)
              : get1(syms[i].name, &fn, version, 0);
    if (cr == IPCREF__CU_ERROR_STUB_LIBRARY) {
      snprintf(ipcref__cu_why, sizeof ipcref__cu_why,
               "%s is the CUDA toolkit's stub library, not a driver "
               "(CUDA_ERROR_STUB_LIBRARY, 34)",
               path);
      goto fail;
    }
    if (cr != IPCREF__CU_SUCCESS || !fn) {
      snprintf(ipcref__cu_why, sizeof ipcref__cu_why,
               "the CUDA driver lacks %s (cuGetProcAddress: %d)", syms[i].name,
               (int)cr);
      goto fail;
    }
    memcpy(syms[i].slot, &fn, sizeof fn);
  }
  cr = cu->api.Init(0);
  if (cr != IPCREF__CU_SUCCESS) {
    ipcref__cu_fail(IPCREF_ENODEV,
                    cr == IPCREF__CU_ERROR_NO_DEVICE
                        ? "cuInit: no CUDA-capable device"
                        : "cuInit",
                    cu, cr);
    goto fail;
  }
  if (pthread_mutex_init(&cu->lock, NULL) != 0) {
    ipcref__cu_fail(IPCREF_ESYS, "pthread_mutex_init", NULL, 0);
    dlclose(cu->lib);
    IPCREF_FREE(cu);
    return IPCREF_ESYS;
  }
  cu->backend.device_type = IPCREF_DEVICE_CUDA;
  cu->backend.name = "cuda";
  cu->backend.user = cu;
  cu->backend.seg_alloc = ipcref__cu_seg_alloc;
  cu->backend.seg_free = ipcref__cu_seg_free;
  cu->backend.seg_range = ipcref__cu_seg_range;
  cu->backend.seg_export = ipcref__cu_seg_export;
  cu->backend.seg_import = ipcref__cu_seg_import;
  cu->backend.seg_close = ipcref__cu_seg_close;
  cu->backend.event_record = ipcref__cu_event_record;
  cu->backend.event_free = ipcref__cu_event_free;
  cu->backend.event_wait = ipcref__cu_event_wait;
  cu->backend.fence = ipcref__cu_fence;
  cu->backend.fence_done = ipcref__cu_fence_done;
  *out = cu;
  return IPCREF_OK;
fail:
  dlclose(cu->lib);
  IPCREF_FREE(cu);
  return IPCREF_ENODEV;
}

IPCREF_API ipcref_backend *ipcref_cuda_backend(ipcref_cuda *cu) {
  return cu ? &cu->backend : NULL;
}

IPCREF_API void ipcref_cuda_close(ipcref_cuda *cu) {
  int d;
  if (!cu) return;
  while (cu->free_events) {
    ipcref__cu_ipc_event *e = cu->free_events;
    cu->free_events = e->next;
    if (ipcref__cu_use(cu, e->dev) == IPCREF_OK)
      (void)cu->api.EventDestroy(e->ev);
    IPCREF_FREE(e);
  }
  while (cu->opens) {
    ipcref__cu_open *o = cu->opens;
    cu->opens = o->next;
    if (ipcref__cu_use(cu, o->dev) == IPCREF_OK)
      (void)cu->api.IpcCloseMemHandle(o->addr);
    IPCREF_FREE(o);
  }
  while (cu->exports) {
    ipcref__cu_export *x = cu->exports;
    cu->exports = x->next;
    IPCREF_FREE(x);
  }
  for (d = 0; d < IPCREF__CU_DEVICES; d++)
    if (cu->ctx[d]) (void)cu->api.DevicePrimaryCtxRelease(cu->devs[d]);
  pthread_mutex_destroy(&cu->lock);
  dlclose(cu->lib);
  IPCREF_FREE(cu);
}

IPCREF_API ipcref_result ipcref_cuda_alloc(ipcref_ctx *ctx, int device,
                                           size_t size, ipcref_buf **out) {
  ipcref_device dev;
  dev.type = IPCREF_DEVICE_CUDA;
  dev.id = device;
  return ipcref_device_new(ctx, dev, size, out);
}

IPCREF_API ipcref_result ipcref_cuda_wrap(
    ipcref_ctx *ctx, int device, unsigned long long ptr, size_t size,
    void (*release)(void *user, void *ptr), void *user, ipcref_buf **out) {
  ipcref_device dev;
  dev.type = IPCREF_DEVICE_CUDA;
  dev.id = device;
  return ipcref_device_wrap(ctx, dev, (void *)(uintptr_t)ptr, size, release,
                            user, out);
}

#endif /* IPCREF_CUDA_IMPLEMENTATION */
