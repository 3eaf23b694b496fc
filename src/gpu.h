/* gpu: the logic both device backends share (tools/amalgamate.py writes it
 * into ipcref_cuda.h and ipcref_hip.h, with ipcref_gpu / ipcref__gpu /
 * IPCREF_GPU / IPCREF__GPU renamed to each backend's prefix). What differs
 * between the drivers lives in src/cuda.h and src/hip.h: the types, the
 * loader, and one small function per driver call (ipcref__gpu_alloc,
 * ipcref__gpu_ipc_open, ...), each returning the driver's own error number
 * (0 is success).
 *
 * The part before the marker below comes first (the driver's part uses
 * it: the failure message, and the loader's steps that are the same for
 * both drivers); the rest comes after the driver's part, with
 * src/gpu_pool.h and src/gpu_vmm.h at its "@vmm" line and
 * src/gpu_events.h (ordering: interprocess events and fences) at its
 * "@events" line. */

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The longest failure message kept, with its terminating NUL. */
#define IPCREF__GPU_WHY_BYTES 256

/* Why the last failure on this thread happened, for ipcref_gpu_error(). */
static __thread char ipcref__gpu_why[IPCREF__GPU_WHY_BYTES];

IPCREF__PRIVATE ipcref_result ipcref__gpu_say(ipcref_result r,
                                              const char *what) {
  snprintf(ipcref__gpu_why, sizeof ipcref__gpu_why, "%s", what);
  return r;
}

/* ---- loading the driver (the driver's loader uses these) ----------------- */

/* One entry point of the driver's table of them (its api struct): the name
 * it is looked up by, where its pointer goes (offsetof the field), and
 * whether a driver may lack it (its pointer then stays NULL). */
typedef struct ipcref__gpu_entry {
  const char *name;
  size_t offset;
  int optional;
} ipcref__gpu_entry;

/* Looks up entry point `name`: 0 with *fn set (NULL when the driver has no
 * such symbol), or the driver's error number. */
typedef int (*ipcref__gpu_lookup)(void *user, const char *name, void **fn);

/* Symbol `name` of `lib` into the function pointer at `slot` (NULL when
 * absent). dlsym gives objects; POSIX makes them functions (memcpy: ISO C
 * has no cast between the two). */
IPCREF__PRIVATE void ipcref__gpu_load_symbol(void *lib, const char *name,
                                             void *slot) {
  void *sym = dlsym(lib, name);
  memcpy(slot, &sym, sizeof sym);
}

/* Opens the driver's library: `path`, or else the first of the `n` `names`
 * that loads; *opened is the name tried last (the one loaded, on success).
 * On failure says why, naming the library as `what` ("CUDA driver") and,
 * without a path, what was looked for as `wanted`, and returns NULL. */
IPCREF__PRIVATE void *ipcref__gpu_load_library(const char *path,
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
  snprintf(ipcref__gpu_why, sizeof ipcref__gpu_why,
           "the %s library could not be loaded (%s): %s", what,
           path ? path : wanted, e ? e : "not found");
  return NULL;
}

/* Fills the api struct at `api` from the `n` `entries`, in order, with
 * `lookup`. Returns the first entry that failed, *code saying how (the
 * lookup's error, or 0 for a required entry point missing), or NULL when
 * every one is in. Pointers are stored as ipcref__gpu_load_symbol does. */
IPCREF__PRIVATE const ipcref__gpu_entry *
ipcref__gpu_load_entries(void *api, const ipcref__gpu_entry *entries, size_t n,
                         ipcref__gpu_lookup lookup, void *user, int *code) {
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
IPCREF__PRIVATE ipcref_result ipcref__gpu_load_failed(void **lib) {
  dlclose(*lib);
  *lib = NULL;
  return IPCREF_ENODEV;
}

/* @driver */

/* ---- the backend's state ------------------------------------------------- */

/* An interprocess event of the pool, with its handle made once. */
typedef struct ipcref__gpu_ipc_event {
  void *ev;
  int dev;
  unsigned char handle[IPCREF_HANDLE_BYTES];
  struct ipcref__gpu_ipc_event *next; /* the free list */
} ipcref__gpu_ipc_event;

/* An allocation opened from another process, counted. */
typedef struct ipcref__gpu_open {
  unsigned char handle[IPCREF_HANDLE_BYTES];
  int dev;
  uint64_t addr;
  int refs;
  struct ipcref__gpu_open *next;
} ipcref__gpu_open;

/* An allocation this process exported, so that its handle resolves here. */
typedef struct ipcref__gpu_export {
  unsigned char handle[IPCREF_HANDLE_BYTES];
  uint64_t base;
  int refs; /* segments exported with it (contexts that wrap it: several) */
  struct ipcref__gpu_export *next;
} ipcref__gpu_export;

struct ipcref_gpu {
  ipcref_backend backend; /* first: the backend's pointer is ours */
  int refs;               /* opens of this one instance */
  int pid;                /* the process it belongs to (not a fork's) */
  char path[256];         /* the driver it loaded ("" for the default) */
  ipcref__gpu_state drv;
  pthread_mutex_t lock;
  ipcref__gpu_ipc_event *free_events; /* the pool: events not in use */
  ipcref__gpu_open *opens;
  ipcref__gpu_export *exports;
  int memory; /* IPCREF_GPU_MEMORY_*: what ipcref_gpu_alloc makes */
  signed char vmm_able[IPCREF__GPU_DEVICES];     /* shares by fd: 1, not: -1 */
  struct ipcref__gpu_vmm *vmm_made, *vmm_opened; /* see src/gpu_vmm.h */
  struct ipcref__gpu_pool *pools_out, *pools_in; /* see src/gpu_pool.h */
  struct ipcref__gpu_pool_ptr *pool_ptrs, *pool_sent;
};

#define IPCREF__GPU_OF(be) ((ipcref_gpu *)(void *)(be))

IPCREF__PRIVATE void ipcref__gpu_event_free(ipcref_backend *be, void *event);

/* Records a failed driver call for ipcref_gpu_error(); returns `r`. */
IPCREF__PRIVATE ipcref_result ipcref__gpu_fail(ipcref_result r,
                                               const char *what, ipcref_gpu *g,
                                               int code) {
  snprintf(ipcref__gpu_why, sizeof ipcref__gpu_why, "%s: %s (%d)", what,
           ipcref__gpu_d_errname(&g->drv, code), code);
  return r;
}

IPCREF_API const char *ipcref_gpu_error(void) {
  return ipcref__gpu_why;
}

/* A driver error as an ipcref code. */
IPCREF__PRIVATE ipcref_result ipcref__gpu_code(int code) {
  if (code == 0) return IPCREF_OK;
  if (code == IPCREF__GPU_OOM) return IPCREF_ENOMEM;
  if (code == IPCREF__GPU_NO_DEVICE) return IPCREF_ENODEV;
  return IPCREF_EINVAL;
}

/* Makes device `dev` current on this thread. */
IPCREF__PRIVATE ipcref_result ipcref__gpu_on(ipcref_gpu *g, int dev) {
  int code;
  if (dev < 0 || dev >= IPCREF__GPU_DEVICES)
    return ipcref__gpu_say(IPCREF_ENODEV, "device ordinal out of range");
  code = ipcref__gpu_d_use(&g->drv, dev);
  return code ? ipcref__gpu_fail(IPCREF_ENODEV, "selecting the device", g, code)
              : IPCREF_OK;
}

/* @vmm */

/* ---- segments ------------------------------------------------------------ */

IPCREF__PRIVATE ipcref_result ipcref__gpu_seg_alloc(ipcref_backend *be,
                                                    int32_t dev, size_t size,
                                                    uint64_t *addr) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref_result r = ipcref__gpu_on(g, dev);
  int code;
  if (r != IPCREF_OK) return r;
  if (ipcref__gpu_vmm_wanted(g, dev))
    return ipcref__gpu_vmm_alloc(g, dev, size, addr);
  code = ipcref__gpu_d_alloc(&g->drv, size, addr);
  return code ? ipcref__gpu_fail(ipcref__gpu_code(code), "allocating", g, code)
              : IPCREF_OK;
}

IPCREF__PRIVATE void ipcref__gpu_seg_free(ipcref_backend *be, int32_t dev,
                                          uint64_t addr) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref__gpu_export **pp;
  pthread_mutex_lock(&g->lock); /* its handle no longer names it */
  for (pp = &g->exports; *pp; pp = &(*pp)->next)
    if ((*pp)->base == addr) {
      ipcref__gpu_export *x = *pp;
      *pp = x->next;
      IPCREF_FREE(x);
      break;
    }
  pthread_mutex_unlock(&g->lock);
  if (ipcref__gpu_on(g, dev) == IPCREF_OK &&
      !ipcref__gpu_vmm_free(g, dev, addr))
    (void)ipcref__gpu_d_free(&g->drv, addr);
}

/* A wrapped allocation's segment went (its memory stays its owner's, who
 * may free it, and the driver may give its address to another): once no
 * segment is exported with it, its handle no longer names it here. */
IPCREF__PRIVATE void ipcref__gpu_seg_forget(ipcref_backend *be, int32_t dev,
                                            uint64_t base) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref__gpu_export **pp;
  (void)dev;
  pthread_mutex_lock(&g->lock);
  for (pp = &g->exports; *pp; pp = &(*pp)->next)
    if ((*pp)->base == base) {
      ipcref__gpu_export *x = *pp;
      if (--x->refs == 0) {
        *pp = x->next;
        IPCREF_FREE(x);
      }
      break;
    }
  pthread_mutex_unlock(&g->lock);
}

IPCREF__PRIVATE ipcref_result ipcref__gpu_seg_range(ipcref_backend *be,
                                                    int32_t dev, uint64_t addr,
                                                    uint64_t *base,
                                                    size_t *size) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref_result r = ipcref__gpu_on(g, dev);
  int code;
  if (r != IPCREF_OK) return r;
  code = ipcref__gpu_d_range(&g->drv, addr, base, size);
  return code ? ipcref__gpu_fail(IPCREF_EINVAL,
                                 "finding the allocation (not device memory "
                                 "of this device?)",
                                 g, code)
              : IPCREF_OK;
}

/* The export record of the allocation at `base` (under g->lock), or NULL. */
IPCREF__PRIVATE ipcref__gpu_export *ipcref__gpu_export_of(ipcref_gpu *g,
                                                          uint64_t base) {
  ipcref__gpu_export *x = g->exports;
  while (x && x->base != base) x = x->next;
  return x;
}

/* An allocation exported already (another context wraps it too) gives
 * the handle it got then: one record per allocation, counted. */
IPCREF__PRIVATE ipcref_result ipcref__gpu_seg_export(ipcref_backend *be,
                                                     int32_t dev, uint64_t base,
                                                     unsigned char *handle) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref__gpu_export *x;
  ipcref_result r;
  int code;
  pthread_mutex_lock(&g->lock);
  if ((x = ipcref__gpu_export_of(g, base)) != NULL) {
    memcpy(handle, x->handle, IPCREF_HANDLE_BYTES);
    x->refs++;
  }
  pthread_mutex_unlock(&g->lock);
  if (x) return IPCREF_OK;
  r = ipcref__gpu_on(g, dev);
  if (r != IPCREF_OK) return r;
  /* VMM and stream-ordered pool memory cannot go through legacy IPC. */
  if (!ipcref__gpu_d_ipc_capable(&g->drv, base))
    return ipcref__gpu_say(IPCREF_EINVAL,
                           "memory not exportable by legacy IPC (virtual "
                           "memory management or a stream-ordered pool)");
  code = ipcref__gpu_d_ipc_get(&g->drv, base, handle);
  if (code)
    return ipcref__gpu_fail(ipcref__gpu_code(code), "exporting the handle", g,
                            code);
  x = (ipcref__gpu_export *)IPCREF_MALLOC(sizeof *x);
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
ipcref__gpu_seg_import(ipcref_backend *be, int32_t dev,
                       const unsigned char *handle, uint64_t *addr) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref__gpu_export *x;
  ipcref__gpu_open *o;
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
  o = (ipcref__gpu_open *)IPCREF_MALLOC(sizeof *o);
  if (!o) return IPCREF_ENOMEM;
  r = ipcref__gpu_on(g, dev);
  if (r != IPCREF_OK) {
    IPCREF_FREE(o);
    return r;
  }
  code = ipcref__gpu_d_ipc_open(&g->drv, handle, &o->addr);
  if (code) {
    IPCREF_FREE(o);
    /* A handle that opens nothing (freed, forged, its exporter gone) is
     * bad input; running out of memory is not. */
    return ipcref__gpu_fail(code == IPCREF__GPU_OOM ? IPCREF_ENOMEM
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

IPCREF__PRIVATE void ipcref__gpu_seg_close(ipcref_backend *be, int32_t dev,
                                           uint64_t addr) {
  ipcref_gpu *g = IPCREF__GPU_OF(be);
  ipcref__gpu_open **pp, *o = NULL;
  if (ipcref__gpu_vmm_close(g, dev, addr)) return; /* imported by fd */
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
  if (ipcref__gpu_on(g, dev) == IPCREF_OK)
    (void)ipcref__gpu_d_ipc_close(&g->drv, o->addr);
  IPCREF_FREE(o);
}

/* @events */

/* ---- the public part ----------------------------------------------------- */

/* One instance per process, shared by every open: a handle this process
 * exported must resolve here whichever context imports it (the driver
 * refuses to open it), and an allocation is opened once per process. */
static ipcref_gpu *ipcref__gpu_instance;
static pthread_mutex_t ipcref__gpu_instance_lock = PTHREAD_MUTEX_INITIALIZER;

IPCREF_API ipcref_result ipcref_gpu_open(const char *driver_path,
                                         ipcref_gpu **out) {
  const char *path = driver_path ? driver_path : "";
  ipcref_gpu *g;
  ipcref_result r;
  ipcref__gpu_why[0] = 0;
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  if (strlen(path) >= sizeof g->path)
    return ipcref__invalid(__func__, "the library path is over 255 bytes");
  pthread_mutex_lock(&ipcref__gpu_instance_lock);
  g = ipcref__gpu_instance;
  if (g && g->pid != (int)getpid()) g = NULL; /* the parent's: not ours */
  if (g) {
    r = IPCREF_OK;
    if (strcmp(g->path, path) == 0)
      g->refs++;
    else
      r = ipcref__gpu_say(IPCREF_EBUSY, "another driver is loaded already "
                                        "(one per process)");
    pthread_mutex_unlock(&ipcref__gpu_instance_lock);
    if (r == IPCREF_OK) *out = g;
    return r;
  }
  g = (ipcref_gpu *)IPCREF_MALLOC(sizeof *g);
  if (!g) {
    pthread_mutex_unlock(&ipcref__gpu_instance_lock);
    return IPCREF_ENOMEM;
  }
  memset(g, 0, sizeof *g);
  if (pthread_mutex_init(&g->lock, NULL) != 0) {
    pthread_mutex_unlock(&ipcref__gpu_instance_lock);
    IPCREF_FREE(g);
    return ipcref__gpu_say(IPCREF_ESYS, "pthread_mutex_init failed");
  }
  r = ipcref__gpu_d_load(&g->drv, driver_path);
  if (r != IPCREF_OK) { /* it said why */
    pthread_mutex_unlock(&ipcref__gpu_instance_lock);
    pthread_mutex_destroy(&g->lock);
    IPCREF_FREE(g);
    return r;
  }
  memcpy(g->path, path, strlen(path) + 1);
  g->refs = 1;
  g->pid = (int)getpid();
  ipcref__gpu_instance = g;
  pthread_mutex_unlock(&ipcref__gpu_instance_lock);
  g->backend.device_type = IPCREF__GPU_DEVICE_TYPE;
  g->backend.name = IPCREF__GPU_NAME;
  g->backend.user = g;
  g->backend.seg_alloc = ipcref__gpu_seg_alloc;
  g->backend.seg_free = ipcref__gpu_seg_free;
  g->backend.seg_forget = ipcref__gpu_seg_forget;
  g->backend.seg_range = ipcref__gpu_seg_range;
  g->backend.seg_export = ipcref__gpu_seg_export;
  g->backend.seg_import = ipcref__gpu_seg_import;
  g->backend.seg_close = ipcref__gpu_seg_close;
  g->backend.event_record = ipcref__gpu_event_record;
  g->backend.event_free = ipcref__gpu_event_free;
  g->backend.event_wait = ipcref__gpu_event_wait;
  g->backend.fence = ipcref__gpu_fence;
  g->backend.fence_done = ipcref__gpu_fence_done;
  g->backend.seg_export_fd = ipcref__gpu_seg_export_fd;
  g->backend.seg_import_fd = ipcref__gpu_seg_import_fd;
  g->backend.seg_export_chunks = ipcref__gpu_seg_export_chunks;
  g->backend.seg_import_chunks = ipcref__gpu_seg_import_chunks;
  *out = g;
  return IPCREF_OK;
}

IPCREF_API ipcref_backend *ipcref_gpu_backend(ipcref_gpu *g) {
  return g ? &g->backend : NULL;
}

IPCREF_API void ipcref_gpu_close(ipcref_gpu *g) {
  int last;
  if (!g) return;
  pthread_mutex_lock(&ipcref__gpu_instance_lock);
  last = --g->refs == 0;
  if (last) ipcref__gpu_instance = NULL;
  pthread_mutex_unlock(&ipcref__gpu_instance_lock);
  if (!last) return;
  while (g->free_events) {
    ipcref__gpu_ipc_event *e = g->free_events;
    g->free_events = e->next;
    if (ipcref__gpu_on(g, e->dev) == IPCREF_OK)
      (void)ipcref__gpu_d_event_destroy(&g->drv, e->ev);
    IPCREF_FREE(e);
  }
  while (g->opens) {
    ipcref__gpu_open *o = g->opens;
    g->opens = o->next;
    if (ipcref__gpu_on(g, o->dev) == IPCREF_OK)
      (void)ipcref__gpu_d_ipc_close(&g->drv, o->addr);
    IPCREF_FREE(o);
  }
  while (g->exports) {
    ipcref__gpu_export *x = g->exports;
    g->exports = x->next;
    IPCREF_FREE(x);
  }
  ipcref__gpu_vmm_close_all(g);
  ipcref__gpu_d_unload(&g->drv);
  pthread_mutex_destroy(&g->lock);
  IPCREF_FREE(g);
}

IPCREF_API ipcref_result ipcref_gpu_set_memory(ipcref_gpu *g, int memory) {
  if (!g) return ipcref__invalid(__func__, "the backend is NULL");
  if (memory != IPCREF_GPU_MEMORY_AUTO && memory != IPCREF_GPU_MEMORY_LEGACY &&
      memory != IPCREF_GPU_MEMORY_VMM)
    return ipcref__invalid(__func__, "memory is not an IPCREF_*_MEMORY_ value");
  pthread_mutex_lock(&g->lock);
  g->memory = memory;
  pthread_mutex_unlock(&g->lock);
  return IPCREF_OK;
}

/* The arguments a device call checks itself, so that a refusal names it
 * (the rest are ipcref_device_new's and ipcref_device_wrap's checks). */
#define IPCREF__GPU_ARGS(ctx, device, out)                                     \
  do {                                                                         \
    if (!(ctx)) return ipcref__invalid(__func__, "ctx is NULL");               \
    if (!(out)) return ipcref__invalid(__func__, "out is NULL");               \
    if ((device) < 0) return ipcref__invalid(__func__, "device is negative");  \
  } while (0)

IPCREF_API ipcref_result ipcref_gpu_alloc(ipcref_ctx *ctx, int device,
                                          size_t size, ipcref_buf **out) {
  ipcref_device dev;
  IPCREF__GPU_ARGS(ctx, device, out);
  dev.type = IPCREF__GPU_DEVICE_TYPE;
  dev.id = device;
  return ipcref_device_new(ctx, dev, size, out);
}

IPCREF_API ipcref_result ipcref_gpu_wrap(ipcref_ctx *ctx, int device, void *ptr,
                                         size_t size,
                                         void (*release)(void *user, void *ptr),
                                         void *user, ipcref_buf **out) {
  ipcref_device dev;
  IPCREF__GPU_ARGS(ctx, device, out);
  if (!ptr) return ipcref__invalid(__func__, "ptr is NULL");
  dev.type = IPCREF__GPU_DEVICE_TYPE;
  dev.id = device;
  return ipcref_device_wrap(ctx, dev, ptr, size, release, user, out);
}
