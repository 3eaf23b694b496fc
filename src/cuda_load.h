/* cuda_load: loading the CUDA driver, for src/gpu.h (as
 * ipcref__gpu_d_load / _unload): the entry points looked up with
 * cuGetProcAddress at a pinned version, each one checked, then cuInit.
 * tools/amalgamate.py puts it after src/cuda_vmm.h in ipcref_cuda.h. */

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
