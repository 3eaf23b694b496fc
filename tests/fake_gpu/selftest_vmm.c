/* selftest_vmm.c - the CUDA virtual memory management scenarios of
 * fake_gpu_selftest (fake_vmm.h, fake_cuda_vmm.c). Not compiled alone:
 * selftest.c #includes it in its CUDA-only part (it uses check(), run(),
 * spawn(), knob() and the log helpers there).
 */
#include <fcntl.h>

// clang-format off
#define VMM_FUNCS(X)                                                           \
  X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree)    \
  X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAllocationGranularity) \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)            \
  X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle)     \
  X(cuCtxSynchronize)
// clang-format on
VMM_FUNCS(DECL)

static void load_vmm(void) {
  VMM_FUNCS(CU_LOAD)
}

static const CUmemAllocationProp vmm_prop0 = {
    .type = CU_MEM_ALLOCATION_TYPE_PINNED,
    .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};

static CUmemAllocationProp vmm_prop(unsigned types) {
  CUmemAllocationProp p = vmm_prop0;
  p.requestedHandleTypes = (CUmemAllocationHandleType)types;
  return p;
}
static int vmm_access(CUdeviceptr p, size_t n, int flags) {
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0},
                       (CUmemAccess_flags)flags};
  return p_cuMemSetAccess(p, n, &d, 1);
}
static size_t vmm_gran(void) {
  size_t g = 0;
  CUmemAllocationProp p = vmm_prop0;
  EQ(p_cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
     0);
  return g;
}

/* The host touching a device address (in a child: it may fault). */
static void vmm_read_host(void) {
  signal(SIGSEGV, segv_exit);
  signal(SIGBUS, segv_exit);
  volatile char c = *(volatile char *)hostptr_p;
  (void)c;
}

/* ---- one process --------------------------------------------------------- */

static void s_vmm_knobs(void) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = vmm_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  size_t g = 0;
  int v = -1;
  EQ(p_cuMemCreate(&h, 2097152, &p, 0), CUDA_ERROR_NOT_INITIALIZED);
  EQ(cu_init(), 0);
  EQ(p_cuDeviceGetAttribute(
         &v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
     0);
  EQ(v, 1);
  EQ(p_cuDeviceGetAttribute(
         &v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
         0),
     0);
  EQ(v, 1);
  knob("POSIX_FD", "0");
  EQ(p_cuDeviceGetAttribute(
         &v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
     0);
  EQ(v, 1);
  EQ(p_cuDeviceGetAttribute(
         &v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
         0),
     0);
  EQ(v, 0);
  EQ(p_cuMemCreate(&h, 2097152, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  EQ(p_cuMemCreate(&h, 2097152, &p, 0), 0);
  EQ(p_cuMemRelease(h), 0);
  knob("POSIX_FD", NULL);
  knob("VMM", "0");
  EQ(p_cuDeviceGetAttribute(
         &v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
     0);
  EQ(v, 0);
  EQ(p_cuDeviceGetAttribute(
         &v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
         0),
     0);
  EQ(v, 0);
  EQ(p_cuMemCreate(&h, 2097152, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
  knob("VMM", NULL);

  /* granularity: the knob, the checks on prop */
  EQ(vmm_gran(), 2097152);
  EQ(p_cuMemGetAllocationGranularity(&g, &p,
                                     CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
     0);
  EQ(g, 2097152);
  knob("GRANULARITY", "65536");
  EQ(vmm_gran(), 65536);
  knob("GRANULARITY", "65537"); /* not a power of two: the default */
  EQ(vmm_gran(), 2097152);
  knob("GRANULARITY", NULL);
  EQ(p_cuMemGetAllocationGranularity(&g, NULL, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemGetAllocationGranularity(NULL, &p, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemGetAllocationGranularity(&g, &p, 2), CUDA_ERROR_INVALID_VALUE);
  p.type = CU_MEM_ALLOCATION_TYPE_MANAGED;
  EQ(p_cuMemGetAllocationGranularity(&g, &p, 0), CUDA_ERROR_INVALID_VALUE);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_HOST;
  EQ(p_cuMemGetAllocationGranularity(&g, &p, 0), CUDA_ERROR_INVALID_VALUE);
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 1; /* one device */
  EQ(p_cuMemGetAllocationGranularity(&g, &p, 0), CUDA_ERROR_INVALID_DEVICE);
  EQ(p_cuMemCreate(&h, 2097152, &p, 0), CUDA_ERROR_INVALID_DEVICE);

  /* cuCtxSynchronize waits for the context's streams */
  CUstream s;
  CUevent ev;
  EQ(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 0);
  EQ(p_cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), 0);
  knob("WORK_US", "100000");
  struct timespec t0 = now();
  EQ(p_cuEventRecord(ev, s), 0);
  EQ(p_cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  EQ(p_cuCtxSynchronize(), 0);
  OK(ms_since(&t0) >= 90);
  EQ(p_cuStreamQuery(s), 0);
  knob("WORK_US", NULL);
  CUresult (*sync2)(CUcontext);
  CUdriverProcAddressQueryResult st;
  EQ(p_cuGetProcAddress_v2("cuCtxSynchronize", (void **)&sync2, 13000, 0, &st),
     0);
  OK(sync2 && (void *)sync2 == dlsym(cu_lib, "cuCtxSynchronize_v2"));
  EQ(sync2(NULL), 0);
  EQ(sync2((CUcontext)&v), CUDA_ERROR_INVALID_CONTEXT);
  EQ(p_cuEventDestroy(ev), 0);
  EQ(p_cuStreamDestroy(s), 0);
  EQ(p_cuCtxSetCurrent(NULL), 0);
  EQ(p_cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
  EQ(sync2(NULL), CUDA_ERROR_INVALID_CONTEXT);
}

static void s_vmm_local(void) {
  CUmemGenericAllocationHandle h = 0, h2 = 0, h3 = 0;
  CUmemAllocationProp p = vmm_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUdeviceptr r = 0, r2 = 0, base = 0, d = 0;
  size_t size = 0;
  unsigned char in[4096], out[4096];
  for (int i = 0; i < 4096; i++) in[i] = (unsigned char)(i * 13 + 1);
  clear_log();
  EQ(cu_init(), 0);
  size_t g = vmm_gran();

  /* cuMemCreate */
  EQ(p_cuMemCreate(&h, 0, &p, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemCreate(&h, g + 4096, &p, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemCreate(&h, g, &p, 1), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemCreate(&h, g, NULL, 0), CUDA_ERROR_INVALID_VALUE);
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  EQ(p_cuMemCreate(&h, g, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_WIN32;
  EQ(p_cuMemCreate(&h, g, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  EQ(p_cuMemCreate(&h, g, &p, 0), 0);
  OK(h != 0);
  EQ(p_cuMemCreate(&h2, g, &p, 0), 0);
  OK(h2 != h);
  CUmemAllocationProp q;
  memset(&q, 0xff, sizeof q);
  EQ(p_cuMemGetAllocationPropertiesFromHandle(&q, h), 0);
  OK(q.type == CU_MEM_ALLOCATION_TYPE_PINNED &&
     q.location.type == CU_MEM_LOCATION_TYPE_DEVICE && q.location.id == 0 &&
     q.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

  /* cuMemAddressReserve / cuMemAddressFree */
  EQ(p_cuMemAddressReserve(&r, g + 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAddressReserve(&r, 2 * g, 3, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAddressReserve(&r, 2 * g, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAddressReserve(&r, 2 * g, 8 * g, 0, 0), 0);
  EQ(r % (8 * g), 0);
  EQ(p_cuMemAddressReserve(&r2, g, 0, 0x10000, 0), 0); /* a hint only */
  EQ(r2 % g, 0);
  EQ(p_cuMemAddressFree(r2, 2 * g), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAddressFree(r2 + g, g), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAddressFree(r2, g), 0);
  EQ(p_cuMemAddressFree(r2, g), CUDA_ERROR_INVALID_VALUE);

  /* cuMemMap */
  EQ(p_cuMemMap(r, g, g, h, 0), CUDA_ERROR_INVALID_VALUE);     /* offset */
  EQ(p_cuMemMap(r, g, 0, h, 1), CUDA_ERROR_INVALID_VALUE);     /* flags */
  EQ(p_cuMemMap(r, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* too big */
  EQ(p_cuMemMap(r + 4096, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemMap(r + g, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemMap(D(in) & ~(CUdeviceptr)(g - 1), g, 0, h, 0),
     CUDA_ERROR_INVALID_VALUE); /* not a reservation */
  EQ(p_cuMemMap(r, g, 0, 12345, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemMap(r, g, 0, h, 0), 0);
  EQ(p_cuMemMap(r, g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE); /* mapped */

  /* no access yet: copies fail, the host faults */
  EQ(p_cuMemcpyHtoD(r, in, 64), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemcpyDtoH(out, r, 64), CUDA_ERROR_INVALID_VALUE);
  hostptr_p = V(r);
  OK(!reaped_ok(spawn(vmm_read_host)));

  /* what other calls answer for VMM memory */
  EQ(p_cuMemGetAddressRange(&base, &size, r + 100), 0);
  OK(base == r && size == g);
  EQ(p_cuMemGetAddressRange(&base, &size, r + g), CUDA_ERROR_NOT_FOUND);
  int legacy = -1;
  EQ(p_cuPointerGetAttribute(
         &legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, r),
     0);
  EQ(legacy, 0);
  EQ(p_cuMemAlloc(&d, 4096), 0);
  EQ(p_cuPointerGetAttribute(
         &legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, d),
     0);
  EQ(legacy, 1);
  CUipcMemHandle ih;
  EQ(p_cuIpcGetMemHandle(&ih, r), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemFree(r), CUDA_ERROR_INVALID_VALUE);

  /* cuMemSetAccess */
  CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_HOST, 0},
                        CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  EQ(p_cuMemSetAccess(r, g, &ad, 1), CUDA_ERROR_INVALID_VALUE);
  ad.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 3};
  EQ(p_cuMemSetAccess(r, g, &ad, 1), CUDA_ERROR_INVALID_DEVICE);
  EQ(p_cuMemSetAccess(r, g, NULL, 1), CUDA_ERROR_INVALID_VALUE);
  EQ(vmm_access(r, g, 2), CUDA_ERROR_INVALID_VALUE);
  EQ(vmm_access(r, g / 2, 3), CUDA_ERROR_INVALID_VALUE); /* part */
  EQ(vmm_access(r, 2 * g, 3), CUDA_ERROR_INVALID_VALUE); /* not all mapped */
  EQ(vmm_access(r, g, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), 0);
  EQ(p_cuMemcpyHtoD(r + 8192, in, sizeof in), 0);
  EQ(p_cuMemsetD8(r + 8192, 0xcd, 4), 0);
  EQ(p_cuMemcpyDtoD(r + g - 4096, r + 8192, 4096), 0);
  EQ(p_cuMemcpyDtoH(out, r + g - 4096, sizeof out), 0);
  OK(out[3] == 0xcd && out[4] == in[4] && !memcmp(out + 4, in + 4, 4092));
  EQ(p_cuMemcpyHtoD(r + g - 64, in, 128), CUDA_ERROR_INVALID_VALUE); /* end */
  OK(((unsigned char *)V(r))[8192 + 5] == in[5]); /* HOSTPTR=rw: readable */
  EQ(vmm_access(r, g, CU_MEM_ACCESS_FLAGS_PROT_READ), 0);
  EQ(p_cuMemcpyHtoD(r, in, 64), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemsetD8(r, 0, 64), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemcpyDtoD(r, r + 8192, 64), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemcpyDtoD(d, r + 8192, 64), 0); /* reading is allowed */
  EQ(p_cuMemcpyDtoH(out, r + 8192 + 4, 16), 0);
  OK(!memcmp(out, in + 4, 16));
  OK(reaped_ok(spawn(vmm_read_host))); /* the host may read */
  EQ(vmm_access(r, g, CU_MEM_ACCESS_FLAGS_PROT_NONE), 0);
  EQ(p_cuMemcpyDtoH(out, r, 16), CUDA_ERROR_INVALID_VALUE);
  OK(!reaped_ok(spawn(vmm_read_host)));
  EQ(vmm_access(r, g, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), 0);

  /* cuMemRetainAllocationHandle */
  EQ(p_cuMemRetainAllocationHandle(&h3, V(r + 12345)), 0);
  OK(h3 == h);
  EQ(p_cuMemRelease(h3), 0);
  EQ(p_cuMemRetainAllocationHandle(&h3, V(r + g)), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemRetainAllocationHandle(&h3, in), CUDA_ERROR_INVALID_VALUE);

  /* released while mapped: the memory stays until unmapped */
  EQ(p_cuMemRelease(h), 0);
  EQ(p_cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemGetAllocationPropertiesFromHandle(&q, h), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemcpyDtoH(out, r + 8192 + 4, 16), 0);
  OK(!memcmp(out, in + 4, 16));
  EQ(p_cuMemRetainAllocationHandle(&h3, V(r)), 0); /* the same value again */
  OK(h3 == h);
  EQ(p_cuMemRelease(h3), 0);

  /* two mappings in one reservation, unmapped by one call */
  EQ(p_cuMemMap(r + g, g, 0, h2, 0), 0);
  EQ(vmm_access(r, 2 * g, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), 0);
  EQ(p_cuMemcpyHtoD(r + g, in, 64), 0);
  EQ(p_cuMemAddressFree(r, 2 * g), CUDA_ERROR_INVALID_VALUE); /* mapped */
  EQ(p_cuMemUnmap(r, g / 2), CUDA_ERROR_INVALID_VALUE);       /* a sub-range */
  EQ(p_cuMemUnmap(r + 4096, g), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemUnmap(r, 2 * g), 0);
  EQ(p_cuMemUnmap(r, g), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemcpyDtoH(out, r, 16), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemGetAddressRange(&base, &size, r), CUDA_ERROR_NOT_FOUND);
  hostptr_p = V(r);
  OK(!reaped_ok(spawn(vmm_read_host))); /* a PROT_NONE reservation again */
  EQ(p_cuMemMap(r, g, 0, h2, 0), 0);    /* h2 is still held: map it again */
  EQ(vmm_access(r, g, CU_MEM_ACCESS_FLAGS_PROT_READ), 0);
  EQ(p_cuMemcpyDtoH(out, r, 64), 0);
  OK(!memcmp(out, in, 64));
  EQ(p_cuMemUnmap(r, g), 0);
  EQ(p_cuMemRelease(h2), 0);
  EQ(p_cuMemAddressFree(r, 2 * g), 0);
  EQ(p_cuMemFree(d), 0);

  /* everything above was freed: MEM_LIMIT counts cuMemCreate */
  knob("MEM_LIMIT", "4194304");
  EQ(p_cuMemCreate(&h, g, &p, 0), 0);
  EQ(p_cuMemCreate(&h2, g, &p, 0), 0);
  EQ(p_cuMemCreate(&h3, g, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
  EQ(p_cuMemAlloc(&d, 4096), CUDA_ERROR_OUT_OF_MEMORY);
  EQ(p_cuMemRelease(h2), 0);
  EQ(p_cuMemCreate(&h3, g, &p, 0), 0);
  EQ(p_cuMemRelease(h3), 0);
  EQ(p_cuMemRelease(h), 0);
  knob("MEM_LIMIT", NULL);

  /* every call logged once, well formed; handles as h=0x... */
  EQ(log_malformed(), 0);
  EQ(log_count(NULL, " cuMemCreate size=", " h=0x"), 12);
  EQ(log_count(NULL, " cuMemMap ", "CUDA_SUCCESS"), 3);
  EQ(log_count(NULL, " cuMemUnmap ", "CUDA_SUCCESS"), 2);
  EQ(log_count(NULL, " cuMemSetAccess ", "CUDA_SUCCESS"), 6);
  EQ(log_count(NULL, " cuMemRetainAllocationHandle ", "CUDA_SUCCESS"), 2);
}

/* A legacy cuMemAlloc allocation's memfd, found by its name. */
static int legacy_memfd(void) {
  char path[64], link[128];
  for (int fd = 3; fd < 1024; fd++) {
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n > 0 && (link[n] = 0, !strncmp(link, "/memfd:fake_gpu:", 16)))
      return fd;
  }
  return -1;
}

static void s_vmm_share_local(void) {
  CUmemGenericAllocationHandle h = 0, h0 = 0, hi = 0;
  CUmemAllocationProp p = vmm_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUmemAllocationProp p0 = vmm_prop(CU_MEM_HANDLE_TYPE_NONE);
  CUdeviceptr r, d;
  unsigned char out[64];
  int fd = -1, sv[2], pp[2];
  EQ(cu_init(), 0);
  size_t g = vmm_gran();
  EQ(p_cuMemCreate(&h, g, &p, 0), 0);
  EQ(p_cuMemCreate(&h0, g, &p0, 0), 0);
  EQ(p_cuMemExportToShareableHandle(
         &fd, h0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     CUDA_ERROR_INVALID_VALUE); /* not requested at cuMemCreate */
  EQ(p_cuMemExportToShareableHandle(
         &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
     CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_FABRIC, 0),
     CUDA_ERROR_NOT_SUPPORTED);
  EQ(p_cuMemExportToShareableHandle(
         &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     0);
  OK(fd >= 0);
  OK(fcntl(fd, F_GETFD) >= 0);

  /* what is not a fake VMM allocation's fd */
  OK(!pipe(pp) && !socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  int plain = memfd_create("fake_gpu_vmm_not", 0);
  OK(plain >= 0 && !ftruncate(plain, (off_t)g));
  EQ(p_cuMemAlloc(&d, 4096), 0);
  int lfd = legacy_memfd();
  OK(lfd >= 0);
  int bad[] = {pp[0], pp[1], sv[0], plain, lfd, 999, -1};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    EQ(p_cuMemImportFromShareableHandle(
           &hi, V(bad[i]), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
       CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemImportFromShareableHandle(&hi, V(fd), CU_MEM_HANDLE_TYPE_FABRIC),
     CUDA_ERROR_NOT_SUPPORTED);
  knob("VMM", "0");
  EQ(p_cuMemImportFromShareableHandle(&hi, V(fd),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
     CUDA_ERROR_NOT_SUPPORTED);
  knob("VMM", NULL);
  close(pp[0]), close(pp[1]), close(sv[0]), close(sv[1]), close(plain);

  /* import in the exporting process: a second handle to the same memory */
  EQ(p_cuMemImportFromShareableHandle(&hi, V(fd),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
     0);
  OK(hi && hi != h);
  close(fd); /* the caller's; the import keeps its own */
  CUmemAllocationProp q;
  EQ(p_cuMemGetAllocationPropertiesFromHandle(&q, hi), 0);
  OK(q.location.id == 0 &&
     q.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EQ(p_cuMemAddressReserve(&r, 2 * g, 0, 0, 0), 0);
  EQ(p_cuMemMap(r, g, 0, h, 0), 0);
  EQ(p_cuMemMap(r + g, g, 0, hi, 0), 0);
  EQ(vmm_access(r, 2 * g, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), 0);
  EQ(p_cuMemsetD8(r + 100, 0x3c, 8), 0);
  EQ(p_cuMemcpyDtoH(out, r + g + 96, 16), 0);
  OK(out[3] == 0 && out[4] == 0x3c && out[11] == 0x3c && out[12] == 0);
  EQ(p_cuMemUnmap(r, 2 * g), 0);
  EQ(p_cuMemAddressFree(r, 2 * g), 0);
  EQ(p_cuMemRelease(hi), 0);
  EQ(p_cuMemRelease(h), 0);
  EQ(p_cuMemRelease(h0), 0);
  EQ(p_cuMemFree(d), 0);
}

/* HOSTPTR=none: mapped VMM memory stays PROT_NONE; copies honour access. */
static void s_vmm_hostptr_none(void) {
  CUmemGenericAllocationHandle h;
  CUmemAllocationProp p = vmm_prop(0);
  CUdeviceptr r;
  unsigned char in[64] = {9, 8, 7}, out[64];
  knob("HOSTPTR", "none");
  knob("GRANULARITY", "65536");
  EQ(cu_init(), 0);
  EQ(p_cuMemCreate(&h, 65536, &p, 0), 0);
  EQ(p_cuMemAddressReserve(&r, 65536, 0, 0, 0), 0);
  EQ(p_cuMemMap(r, 65536, 0, h, 0), 0);
  EQ(p_cuMemcpyHtoD(r, in, sizeof in), CUDA_ERROR_INVALID_VALUE);
  EQ(vmm_access(r, 65536, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), 0);
  EQ(p_cuMemcpyHtoD(r, in, sizeof in), 0);
  EQ(p_cuMemcpyDtoH(out, r, sizeof out), 0);
  OK(!memcmp(in, out, sizeof in));
  hostptr_p = V(r);
  OK(!reaped_ok(spawn(vmm_read_host)));
  EQ(vmm_access(r, 65536, CU_MEM_ACCESS_FLAGS_PROT_READ), 0);
  EQ(p_cuMemsetD8(r, 1, 8), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemcpyDtoH(out, r, sizeof out), 0);
  EQ(p_cuMemUnmap(r, 65536), 0);
  EQ(p_cuMemRelease(h), 0);
  EQ(p_cuMemAddressFree(r, 65536), 0);
}

static void vmm_forked_child(void) {
  CUmemGenericAllocationHandle h;
  CUmemAllocationProp p = vmm_prop(0);
  CUdeviceptr r;
  EQ(p_cuMemCreate(&h, 2097152, &p, 0), CUDA_ERROR_NOT_INITIALIZED);
  EQ(p_cuMemAddressReserve(&r, 2097152, 0, 0, 0), CUDA_ERROR_NOT_INITIALIZED);
}
static void s_vmm_fork_after_init(void) {
  EQ(cu_init(), 0);
  OK(reaped_ok(spawn(vmm_forked_child)));
}

/* ---- across processes: the fd over a socketpair (SCM_RIGHTS) ------------- */

static int vmm_sock[2];
static unsigned char vmm_pat[8192];

static void vmm_exporter(void) {
  CUmemGenericAllocationHandle h, h0;
  CUmemAllocationProp p = vmm_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUmemAllocationProp p0 = vmm_prop(CU_MEM_HANDLE_TYPE_NONE);
  CUdeviceptr r;
  int fd = -1, fd0 = -1;
  char c;
  close(vmm_sock[1]);
  EQ(cu_init(), 0);
  size_t g = vmm_gran();
  EQ(p_cuMemCreate(&h, g, &p, 0), 0);
  EQ(p_cuMemAddressReserve(&r, g, 0, 0, 0), 0);
  EQ(p_cuMemMap(r, g, 0, h, 0), 0);
  EQ(vmm_access(r, g, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), 0);
  EQ(p_cuMemcpyHtoD(r + g - sizeof vmm_pat, vmm_pat, sizeof vmm_pat), 0);
  EQ(p_cuMemExportToShareableHandle(
         &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     0);
  EQ(p_cuMemCreate(&h0, g, &p0, 0), 0); /* made without POSIX_FD */
  EQ(p_cuMemExportToShareableHandle(
         &fd0, h0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemRelease(h0), 0);
  send_fd(vmm_sock[0], fd, g);
  close(fd);
  OK(take(vmm_sock[0], &c, 1) && c == 'R'); /* the importer has read */
  EQ(p_cuMemsetD8(r, 0x77, 64), 0);         /* seen by the importer */
  EQ(p_cuMemUnmap(r, g), 0);
  EQ(p_cuMemRelease(h), 0); /* the importer still holds the memory */
  EQ(p_cuMemAddressFree(r, g), 0);
  put(vmm_sock[0], "F", 1);
  OK(take(vmm_sock[0], &c, 1) && c == 'X');
}

static void vmm_importer(void) {
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr r, r2;
  uint64_t size = 0;
  unsigned char out[sizeof vmm_pat];
  char c;
  int pp[2];
  close(vmm_sock[0]);
  EQ(cu_init(), 0); /* forked before init, as every cross-process case */
  size_t g = vmm_gran();
  int fd = recv_fd(vmm_sock[1], &size);
  OK(fd >= 0);
  EQ(size, g);
  OK(!pipe(pp));
  EQ(p_cuMemImportFromShareableHandle(&h, V(pp[0]),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
     CUDA_ERROR_INVALID_VALUE);
  close(pp[0]), close(pp[1]);
  EQ(p_cuMemImportFromShareableHandle(&h, V(fd),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
     0);
  close(fd);
  CUmemAllocationProp q;
  EQ(p_cuMemGetAllocationPropertiesFromHandle(&q, h), 0);
  OK(q.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  /* a record claiming twice the size: cuMemMap says no */
  EQ(p_cuMemAddressReserve(&r2, 2 * g, 0, 0, 0), 0);
  EQ(p_cuMemMap(r2, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAddressFree(r2, 2 * g), 0);
  EQ(p_cuMemAddressReserve(&r, g, 0, 0, 0), 0);
  EQ(p_cuMemMap(r, g, 0, h, 0), 0);
  EQ(p_cuMemcpyDtoH(out, r, 16), CUDA_ERROR_INVALID_VALUE); /* no access */
  EQ(vmm_access(r, g, CU_MEM_ACCESS_FLAGS_PROT_READ), 0);
  EQ(p_cuMemcpyDtoH(out, r + g - sizeof out, sizeof out), 0);
  OK(!memcmp(out, vmm_pat, sizeof out));
  EQ(p_cuMemcpyHtoD(r, out, 16), CUDA_ERROR_INVALID_VALUE); /* read-only */
  put(vmm_sock[1], "R", 1);
  OK(take(vmm_sock[1], &c, 1) && c == 'F'); /* the exporter released all */
  EQ(p_cuMemcpyDtoH(out, r, 64), 0);
  OK(out[0] == 0x77 && out[63] == 0x77);
  EQ(p_cuMemUnmap(r, g), 0);
  EQ(p_cuMemRelease(h), 0);
  EQ(p_cuMemAddressFree(r, g), 0);
  put(vmm_sock[1], "X", 1);
}

static void s_vmm_cross_process(void) {
  for (size_t i = 0; i < sizeof vmm_pat; i++)
    vmm_pat[i] = (unsigned char)(i * 29 + 3);
  clear_log();
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, vmm_sock)) abort();
  pid_t exp = spawn(vmm_exporter), imp = spawn(vmm_importer);
  close(vmm_sock[0]);
  close(vmm_sock[1]);
  OK(reaped_ok(exp));
  OK(reaped_ok(imp));
  /* the log ties the import to the creation: the same alloc=<nonce> */
  char pid[16], alloc[40] = "", line[1024];
  EQ(log_malformed(), 0);
  snprintf(pid, sizeof pid, "%d ", (int)exp);
  FILE *f = fopen(logpath, "r");
  while (f && fgets(line, sizeof line, f)) {
    char *a = strstr(line, " alloc=");
    if (!strncmp(line, pid, strlen(pid)) && strstr(line, " cuMemCreate ") &&
        strstr(line, " types=1 ") && a) {
      sscanf(a + 1, "%39s", alloc);
      break;
    }
  }
  if (f) fclose(f);
  snprintf(pid, sizeof pid, "%d ", (int)imp);
  OK(alloc[0] &&
     log_count(pid, alloc, "CUDA_SUCCESS") == 3); /* import, map, release */
  EQ(log_count(pid, " cuMemImportFromShareableHandle ", "CUDA_SUCCESS"), 1);
}

static void s_vmm_proc_address(void) {
  static const char *names[] = {"cuMemCreate",
                                "cuMemRelease",
                                "cuMemAddressReserve",
                                "cuMemAddressFree",
                                "cuMemMap",
                                "cuMemUnmap",
                                "cuMemSetAccess",
                                "cuMemGetAllocationGranularity",
                                "cuMemExportToShareableHandle",
                                "cuMemImportFromShareableHandle",
                                "cuMemRetainAllocationHandle",
                                "cuMemGetAllocationPropertiesFromHandle",
                                "cuCtxSynchronize",
                                "cuCtxSynchronize_v2"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    void *fn = NULL;
    if (!dlsym(cu_lib, names[i])) check(0, __LINE__, names[i], 0, 1);
    if (strchr(names[i], '_')) continue;
    CUdriverProcAddressQueryResult st;
    EQ(p_cuGetProcAddress_v2(names[i], &fn, 12000, 0, &st), 0);
    if (fn != dlsym(cu_lib, names[i])) check(0, __LINE__, names[i], 0, 1);
  }
  void *fn = NULL;
  CUdriverProcAddressQueryResult st;
  EQ(p_cuGetProcAddress_v2("cuMemRetainAllocationHandle", &fn, 10020, 0, &st),
     0);
  OK(fn == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

static void run_vmm(void) {
  run(&cuda, "vmm knobs/granularity/cuCtxSynchronize", s_vmm_knobs);
  run(&cuda, "vmm local", s_vmm_local);
  run(&cuda, "vmm share local", s_vmm_share_local);
  run(&cuda, "vmm hostptr none", s_vmm_hostptr_none);
  run(&cuda, "vmm fork after init", s_vmm_fork_after_init);
  run(&cuda, "vmm cross-process", s_vmm_cross_process);
  run(&cuda, "vmm cuGetProcAddress", s_vmm_proc_address);
}
