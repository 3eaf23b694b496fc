/* selftest_hip_vmm.c - the HIP virtual memory management scenarios of
 * fake_gpu_selftest (fake_vmm.h through fake_hip_vmm.c). Not compiled alone:
 * selftest.c #includes it in its HIP-only part (it uses check(), run(),
 * spawn(), knob(), send_fd/recv_fd and the log helpers there).
 */
#include <fcntl.h>

// clang-format off
#define HVMM_FUNCS(X)                                                          \
  X(hipMemCreate) X(hipMemRelease) X(hipMemAddressReserve)                     \
  X(hipMemAddressFree) X(hipMemMap) X(hipMemUnmap) X(hipMemSetAccess)          \
  X(hipMemGetAccess) X(hipMemGetAllocationGranularity)                         \
  X(hipMemExportToShareableHandle) X(hipMemImportFromShareableHandle)          \
  X(hipMemRetainAllocationHandle) X(hipMemGetAllocationPropertiesFromHandle)
// clang-format on
HVMM_FUNCS(DECL)

static void load_hip_vmm(void) {
  HVMM_FUNCS(HIP_LOAD)
}

typedef hipMemGenericAllocationHandle_t hvh;
#define HV(p, off) ((void *)((char *)(p) + (off))) /* device address + off */
#define H2D        hipMemcpyHostToDevice
#define D2H        hipMemcpyDeviceToHost
#define D2D        hipMemcpyDeviceToDevice
#define EINV       hipErrorInvalidValue
#define POSIX      hipMemHandleTypePosixFileDescriptor

static hipMemAllocationProp hvmm_prop(unsigned type) {
  hipMemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = hipMemAllocationTypePinned;
  p.location.type = hipMemLocationTypeDevice;
  p.location.id = 0;
  p.requestedHandleType = (hipMemAllocationHandleType)type;
  return p;
}
static int hvmm_access(void *p, size_t n, int flags) {
  hipMemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = hipMemLocationTypeDevice;
  d.location.id = 0;
  d.flags = (hipMemAccessFlags)flags;
  return p_hipMemSetAccess(p, n, &d, 1);
}
static size_t hvmm_gran(hipMemAllocationGranularity_flags option) {
  size_t g = 0;
  hipMemAllocationProp p = hvmm_prop(0);
  EQ(p_hipMemGetAllocationGranularity(&g, &p, option), 0);
  return g;
}
static void hvmm_read_host(void) { /* in a child: it may fault */
  signal(SIGSEGV, segv_exit);
  signal(SIGBUS, segv_exit);
  volatile char c = *(volatile char *)hostptr_p;
  (void)c;
}

/* ---- one process --------------------------------------------------------- */

static void hvmm_forked_child(void) {
  hvh h;
  hipMemAllocationProp p = hvmm_prop(0);
  void *r;
  EQ(p_hipMemCreate(&h, 8192, &p, 0), hipErrorNotInitialized);
  EQ(p_hipMemAddressReserve(&r, 8192, 0, NULL, 0), hipErrorNotInitialized);
}

static void s_hvmm_knobs(void) {
  hvh h = NULL;
  hipMemAllocationProp p = hvmm_prop(POSIX);
  size_t g = 0;
  void *r = NULL;
  int pp[2];
  OK(dlvsym(hip_lib, "hipMemCreate", "hip_5.1") &&
     dlvsym(hip_lib, "hipMemImportFromShareableHandle", "hip_5.1") &&
     !dlvsym(hip_lib, "hipMemCreate", "hip_4.2"));

  /* granularity: minimum 4 KiB, recommended 2 MiB (the knob) */
  EQ(hvmm_gran(hipMemAllocationGranularityMinimum), 4096);
  EQ(hvmm_gran(hipMemAllocationGranularityRecommended), 2097152);
  knob("GRANULARITY", "65536");
  EQ(hvmm_gran(hipMemAllocationGranularityRecommended), 65536);
  EQ(hvmm_gran(hipMemAllocationGranularityMinimum), 4096);
  knob("GRANULARITY", "65537"); /* not a power of two: the default */
  EQ(hvmm_gran(hipMemAllocationGranularityRecommended), 2097152);
  knob("GRANULARITY", NULL);
  EQ(p_hipMemGetAllocationGranularity(&g, NULL, 0), EINV);
  EQ(p_hipMemGetAllocationGranularity(NULL, &p, 0), EINV);
  EQ(p_hipMemGetAllocationGranularity(&g, &p,
                                      (hipMemAllocationGranularity_flags)2),
     EINV);
  p.type = hipMemAllocationTypeInvalid;
  EQ(p_hipMemGetAllocationGranularity(&g, &p, 0), EINV);
  EQ(p_hipMemCreate(&h, 8192, &p, 0), EINV);
  p.type = hipMemAllocationTypePinned;
  p.location.type = hipMemLocationTypeInvalid;
  EQ(p_hipMemGetAllocationGranularity(&g, &p, 0), EINV);
  EQ(p_hipMemCreate(&h, 8192, &p, 0), EINV);
  p.location.type = hipMemLocationTypeDevice;
  p.location.id = 1; /* one device */
  EQ(p_hipMemGetAllocationGranularity(&g, &p, 0), hipErrorInvalidDevice);
  EQ(p_hipMemCreate(&h, 8192, &p, 0), hipErrorInvalidDevice);
  p.location.id = -1;
  EQ(p_hipMemCreate(&h, 8192, &p, 0), hipErrorInvalidDevice);
  p.location.id = 0;

  /* sizes: multiples of the minimum granularity */
  EQ(p_hipMemCreate(&h, 6912, &p, 0), EINV);
  EQ(p_hipMemCreate(&h, 0, &p, 0), EINV);
  EQ(p_hipMemCreate(&h, 8192, &p, 1), EINV); /* flags */
  EQ(p_hipMemCreate(&h, 8192, NULL, 0), EINV);
  EQ(p_hipMemCreate(NULL, 8192, &p, 0), EINV);
  EQ(p_hipMemCreate(&h, 8192, &p, 0), 0);
  OK(h != NULL);
  EQ(p_hipMemRelease(h), 0);

  /* FAKE_HIP_POSIX_FD=0: only the fd handle type is refused */
  knob("POSIX_FD", "0");
  EQ(p_hipMemCreate(&h, 8192, &p, 0), hipErrorNotSupported);
  p.requestedHandleType = hipMemHandleTypeNone;
  EQ(p_hipMemCreate(&h, 8192, &p, 0), 0);
  EQ(p_hipMemRelease(h), 0);
  p.requestedHandleType = POSIX;
  knob("POSIX_FD", NULL);

  /* FAKE_HIP_VMM=0: no VMM at all (HIP 5.2 has no attribute to ask) */
  knob("VMM", "0");
  EQ(p_hipMemCreate(&h, 8192, &p, 0), hipErrorNotSupported);
  EQ(p_hipMemAddressReserve(&r, 8192, 0, NULL, 0), hipErrorNotSupported);
  EQ(p_hipMemGetAllocationGranularity(&g, &p, 0), hipErrorNotSupported);
  OK(!pipe(pp));
  EQ(p_hipMemImportFromShareableHandle(&h, (void *)(uintptr_t)pp[0], POSIX),
     hipErrorNotSupported);
  close(pp[0]), close(pp[1]);
  knob("VMM", NULL);

  /* a child forked after init cannot use the runtime */
  OK(reaped_ok(spawn(hvmm_forked_child)));
}

static void s_hvmm_local(void) {
  hvh h = NULL, h2 = NULL, h3 = NULL;
  hipMemAllocationProp p = hvmm_prop(POSIX);
  void *r = NULL, *r2 = NULL, *base = NULL, *d = NULL;
  size_t size = 0;
  unsigned long long fl = 99;
  unsigned char in[4096], out[4096];
  for (int i = 0; i < 4096; i++) in[i] = (unsigned char)(i * 13 + 1);
  clear_log();
  EQ(p_hipInit(0), 0);
  const size_t g = 65536; /* a multiple of the 4 KiB minimum */

  EQ(p_hipMemCreate(&h, g, &p, 0), 0);
  EQ(p_hipMemCreate(&h2, g, &p, 0), 0);
  OK(h && h2 && h2 != h);
  hipMemAllocationProp q;
  memset(&q, 0xff, sizeof q);
  EQ(p_hipMemGetAllocationPropertiesFromHandle(&q, h), 0);
  OK(q.type == hipMemAllocationTypePinned &&
     q.location.type == hipMemLocationTypeDevice && q.location.id == 0 &&
     q.requestedHandleType == POSIX);
  EQ(p_hipMemGetAllocationPropertiesFromHandle(NULL, h), EINV);

  /* hipMemAddressReserve / hipMemAddressFree */
  EQ(p_hipMemAddressReserve(&r, g + 100, 0, NULL, 0), EINV);
  EQ(p_hipMemAddressReserve(&r, 2 * g, 3, NULL, 0), EINV);
  EQ(p_hipMemAddressReserve(&r, 2 * g, 0, NULL, 1), EINV);
  EQ(p_hipMemAddressReserve(NULL, 2 * g, 0, NULL, 0), EINV);
  EQ(p_hipMemAddressReserve(&r, 2 * g, 8 * 2097152, NULL, 0), 0);
  EQ((uintptr_t)r % (8 * 2097152), 0);
  EQ(p_hipMemAddressReserve(&r2, 4096, 0, (void *)0x10000, 0), 0); /* hint */
  EQ((uintptr_t)r2 % 2097152, 0); /* the recommended granularity */
  EQ(p_hipMemAddressFree(r2, 8192), EINV);
  EQ(p_hipMemAddressFree(HV(r2, 4096), 4096), EINV);
  EQ(p_hipMemAddressFree(r2, 4096), 0);
  EQ(p_hipMemAddressFree(r2, 4096), EINV);

  /* hipMemMap: offset 0 only, no further than the allocation */
  EQ(p_hipMemMap(r, g, 4096, h, 0), EINV);     /* offset */
  EQ(p_hipMemMap(r, g, 0, h, 1), EINV);        /* flags */
  EQ(p_hipMemMap(r, 2 * g, 0, h, 0), EINV);    /* past the allocation */
  EQ(p_hipMemMap(r, g + 4096, 0, h, 0), EINV); /* by one page */
  EQ(p_hipMemMap(HV(r, 100), 4096, 0, h, 0), EINV);
  EQ(p_hipMemMap(HV(r, g + 4096), g, 0, h, 0), EINV); /* out of the range */
  EQ(p_hipMemMap((void *)((uintptr_t)in & ~(uintptr_t)4095), 4096, 0, h, 0),
     EINV); /* not a reservation */
  EQ(p_hipMemMap(r, g, 0, (hvh)(uintptr_t)12345, 0), EINV);
  EQ(p_hipMemMap(r, g / 2, 0, h, 0), 0); /* a part of it */
  EQ(p_hipMemUnmap(r, g / 2), 0);
  EQ(p_hipMemMap(r, g, 0, h, 0), 0);
  EQ(p_hipMemMap(r, g, 0, h2, 0), EINV); /* already mapped */

  /* no access yet: copies fail, the host faults */
  EQ(p_hipMemGetAccess(&fl, &q.location, HV(r, 5)), 0);
  EQ(fl, hipMemAccessFlagsProtNone);
  EQ(p_hipMemcpy(r, in, 64, H2D), EINV);
  EQ(p_hipMemcpy(out, r, 64, D2H), EINV);
  EQ(p_hipMemset(r, 0, 64), EINV);
  hostptr_p = r;
  OK(!reaped_ok(spawn(hvmm_read_host)));

  /* what other calls answer for VMM memory */
  EQ(p_hipMemGetAddressRange(&base, &size, HV(r, 100)), 0);
  OK(base == r && size == g);
  int legacy = -1;
  EQ(p_hipPointerGetAttribute(
         &legacy, HIP_POINTER_ATTRIBUTE_IS_LEGACY_HIP_IPC_CAPABLE, r),
     0);
  EQ(legacy, 0);
  hipIpcMemHandle_t ih;
  EQ(p_hipIpcGetMemHandle(&ih, r), hipErrorInvalidHandle);
  EQ(p_hipFree(r), EINV);
  EQ(p_hipFree(HV(r, 4096)), EINV);
  EQ(p_hipFree(HV(r, g)), EINV); /* reserved, not mapped */
  EQ(p_hipMalloc(&d, 4096), 0);

  /* hipMemSetAccess */
  hipMemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location.type = hipMemLocationTypeInvalid;
  ad.flags = hipMemAccessFlagsProtReadWrite;
  EQ(p_hipMemSetAccess(r, g, &ad, 1), EINV);
  ad.location.type = hipMemLocationTypeDevice;
  ad.location.id = 3;
  EQ(p_hipMemSetAccess(r, g, &ad, 1), EINV); /* no device 3 */
  EQ(p_hipMemSetAccess(r, g, NULL, 1), EINV);
  EQ(p_hipMemSetAccess(r, g, &ad, 0), EINV);
  EQ(hvmm_access(r, g, 2), EINV);
  EQ(hvmm_access(r, g / 2, 3), EINV); /* part of a mapping */
  EQ(hvmm_access(r, 2 * g, 3), EINV); /* not all mapped */
  EQ(hvmm_access(r, g, hipMemAccessFlagsProtReadWrite), 0);
  EQ(p_hipMemGetAccess(&fl, &q.location, HV(r, g - 1)), 0);
  EQ(fl, hipMemAccessFlagsProtReadWrite);
  EQ(p_hipMemGetAccess(&fl, &q.location, HV(r, g)), EINV);
  EQ(p_hipMemcpy(HV(r, 8192), in, sizeof in, H2D), 0);
  EQ(p_hipMemset(HV(r, 8192), 0xcd, 4), 0);
  EQ(p_hipMemcpy(HV(r, g - 4096), HV(r, 8192), 4096, D2D), 0);
  EQ(p_hipMemcpy(out, HV(r, g - 4096), sizeof out, D2H), 0);
  OK(out[3] == 0xcd && !memcmp(out + 4, in + 4, 4092));
  EQ(p_hipMemcpy(out, HV(r, 8192 + 4), 16, hipMemcpyDefault), 0);
  OK(!memcmp(out, in + 4, 16));
  EQ(p_hipMemcpy(HV(r, g - 64), in, 128, H2D), EINV); /* past the end */
  OK(((unsigned char *)r)[8192 + 5] == in[5]);        /* HOSTPTR=rw: readable */
  EQ(hvmm_access(r, g, hipMemAccessFlagsProtRead), 0);
  EQ(p_hipMemcpy(r, in, 64, H2D), EINV);
  EQ(p_hipMemset(r, 0, 64), EINV);
  EQ(p_hipMemcpy(r, HV(r, 8192), 64, D2D), EINV);
  EQ(p_hipMemcpy(d, HV(r, 8192), 64, D2D), 0); /* reading is allowed */
  EQ(p_hipMemcpy(out, HV(r, 8192 + 4), 16, D2H), 0);
  OK(!memcmp(out, in + 4, 16));
  OK(reaped_ok(spawn(hvmm_read_host))); /* the host may read */
  EQ(hvmm_access(r, g, hipMemAccessFlagsProtNone), 0);
  EQ(p_hipMemcpy(out, r, 16, D2H), EINV);
  OK(!reaped_ok(spawn(hvmm_read_host)));
  EQ(hvmm_access(r, g, hipMemAccessFlagsProtReadWrite), 0);

  /* hipMemRetainAllocationHandle: any address inside a mapping */
  EQ(p_hipMemRetainAllocationHandle(&h3, HV(r, 12345)), 0);
  OK(h3 == h);
  EQ(p_hipMemRelease(h3), 0);
  EQ(p_hipMemRetainAllocationHandle(&h3, HV(r, g)), EINV);
  EQ(p_hipMemRetainAllocationHandle(&h3, in), EINV);
  EQ(p_hipMemRetainAllocationHandle(NULL, r), EINV);

  /* released while mapped: the memory stays until unmapped */
  EQ(p_hipMemRelease(h), 0);
  EQ(p_hipMemRelease(h), EINV);
  EQ(p_hipMemGetAllocationPropertiesFromHandle(&q, h), EINV);
  EQ(p_hipMemcpy(out, HV(r, 8192 + 4), 16, D2H), 0);
  OK(!memcmp(out, in + 4, 16));
  EQ(p_hipMemRetainAllocationHandle(&h3, r), 0); /* the same value again */
  OK(h3 == h);
  EQ(p_hipMemRelease(h3), 0);

  /* two mappings in one reservation, unmapped by one call */
  EQ(p_hipMemMap(HV(r, g), g, 0, h2, 0), 0);
  EQ(hvmm_access(r, 2 * g, hipMemAccessFlagsProtReadWrite), 0);
  EQ(p_hipMemcpy(HV(r, g), in, 64, H2D), 0);
  EQ(p_hipMemAddressFree(r, 2 * g), EINV); /* still mapped */
  EQ(p_hipMemUnmap(r, g / 2), EINV);       /* a sub-range */
  EQ(p_hipMemUnmap(HV(r, 4096), g), EINV);
  EQ(p_hipMemUnmap(r, 2 * g), 0);
  EQ(p_hipMemUnmap(r, g), EINV);
  EQ(p_hipMemcpy(out, r, 16, D2H), EINV);
  EQ(p_hipFree(r), EINV); /* still a reservation */
  hostptr_p = r;
  OK(!reaped_ok(spawn(hvmm_read_host))); /* a PROT_NONE reservation again */
  EQ(p_hipMemMap(r, g, 0, h2, 0), 0);    /* h2 is still held: map it again */
  EQ(hvmm_access(r, g, hipMemAccessFlagsProtRead), 0);
  EQ(p_hipMemcpy(out, r, 64, D2H), 0);
  OK(!memcmp(out, in, 64));
  EQ(p_hipMemUnmap(r, g), 0);
  EQ(p_hipMemRelease(h2), 0);
  EQ(p_hipMemAddressFree(r, 2 * g), 0);
  EQ(p_hipFree(d), 0);

  /* everything above was freed: MEM_LIMIT counts hipMemCreate */
  knob("MEM_LIMIT", "131072");
  EQ(p_hipMemCreate(&h, g, &p, 0), 0);
  EQ(p_hipMemCreate(&h2, g, &p, 0), 0);
  EQ(p_hipMemCreate(&h3, 4096, &p, 0), hipErrorOutOfMemory);
  EQ(p_hipMalloc(&d, 4096), hipErrorOutOfMemory);
  EQ(p_hipMemRelease(h2), 0);
  EQ(p_hipMemCreate(&h3, g, &p, 0), 0);
  EQ(p_hipMemRelease(h3), 0);
  EQ(p_hipMemRelease(h), 0);
  knob("MEM_LIMIT", NULL);

  /* every call logged once, well formed; handles as h=0x..., alloc= last */
  EQ(log_malformed(), 0);
  EQ(log_count(NULL, " hipMemCreate size=", " h=0x"), 6);
  EQ(log_count(NULL, " hipMemMap ", "hipSuccess"), 4);
  EQ(log_count(NULL, " hipMemUnmap ", "hipSuccess"), 3);
  EQ(log_count(NULL, " hipMemSetAccess ", "hipSuccess"), 6);
  EQ(log_count(NULL, " hipMemRetainAllocationHandle ", "hipSuccess"), 2);
  char line[1024];
  int tail_ok = 0, tails = 0;
  FILE *f = fopen(logpath, "r");
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, " hipMemCreate ") || strstr(line, " hipMemRelease ") ||
        strstr(line, " hipMemMap ")) {
      char *a = strstr(line, " alloc="), *arrow = strstr(line, " -> ");
      tails++;
      tail_ok += a && arrow && arrow - a == 7 + 16;
    }
  if (f) fclose(f);
  OK(tails > 20);
  EQ(tail_ok, tails);
}

/* A legacy hipMalloc allocation's memfd, found by its name. */
static int hvmm_legacy_memfd(void) {
  char path[64], link[128];
  for (int fd = 3; fd < 1024; fd++) {
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n > 0 && (link[n] = 0, !strncmp(link, "/memfd:fake_gpu:", 16)))
      return fd;
  }
  return -1;
}

static void s_hvmm_share_local(void) {
  hvh h = NULL, h0 = NULL, hi = NULL;
  hipMemAllocationProp p = hvmm_prop(POSIX), p0 = hvmm_prop(0);
  void *r, *d;
  unsigned char out[64];
  int fd = -1, sv[2], pp[2];
  void *vfd = NULL; /* hip-tests export into a void * and import from it */
  const size_t g = 8192;
  EQ(p_hipInit(0), 0);
  EQ(p_hipMemCreate(&h, g, &p, 0), 0);
  EQ(p_hipMemCreate(&h0, g, &p0, 0), 0);
  EQ(p_hipMemExportToShareableHandle(&fd, h0, POSIX, 0),
     EINV); /* not requested at hipMemCreate */
  EQ(p_hipMemExportToShareableHandle(&fd, h, POSIX, 1), EINV);
  EQ(p_hipMemExportToShareableHandle(NULL, h, POSIX, 0), EINV);
  EQ(p_hipMemExportToShareableHandle(&fd, h, hipMemHandleTypeWin32, 0),
     hipErrorNotSupported);
  EQ(p_hipMemExportToShareableHandle(&fd, h, hipMemHandleTypeNone, 0), EINV);
  EQ(p_hipMemExportToShareableHandle(&fd, h, POSIX, 0), 0);
  OK(fd >= 0 && fcntl(fd, F_GETFD) == FD_CLOEXEC);
  EQ(p_hipMemExportToShareableHandle(&vfd, h, POSIX, 0), 0);
  OK((uintptr_t)vfd > 2 && (uintptr_t)vfd < 1024);

  /* what is not a fake VMM allocation's fd */
  OK(!pipe(pp) && !socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  int plain = memfd_create("fake_gpu_vmm_not", 0);
  OK(plain >= 0 && !ftruncate(plain, (off_t)g));
  EQ(p_hipMalloc(&d, 4096), 0);
  int lfd = hvmm_legacy_memfd();
  OK(lfd >= 0);
  int bad[] = {pp[0], pp[1], sv[0], plain, lfd, 999, -1};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    EQ(p_hipMemImportFromShareableHandle(&hi, (void *)(intptr_t)bad[i], POSIX),
       EINV);
  EQ(p_hipMemImportFromShareableHandle(&hi, (void *)(intptr_t)fd,
                                       hipMemHandleTypeWin32Kmt),
     hipErrorNotSupported);
  EQ(p_hipMemImportFromShareableHandle(NULL, (void *)(intptr_t)fd, POSIX),
     EINV);
  close(pp[0]), close(pp[1]), close(sv[0]), close(sv[1]), close(plain);

  /* import in the exporting process: a second handle to the same memory */
  EQ(p_hipMemImportFromShareableHandle(&hi, (void *)(intptr_t)fd, POSIX), 0);
  OK(hi && hi != h);
  close(fd); /* the caller's; the import keeps its own */
  hipMemAllocationProp q;
  EQ(p_hipMemGetAllocationPropertiesFromHandle(&q, hi), 0);
  OK(q.location.id == 0 && q.requestedHandleType == POSIX);
  EQ(p_hipMemAddressReserve(&r, 2 * g, 0, NULL, 0), 0);
  EQ(p_hipMemMap(r, g, 0, h, 0), 0);
  EQ(p_hipMemMap(HV(r, g), g, 0, hi, 0), 0);
  EQ(hvmm_access(r, 2 * g, hipMemAccessFlagsProtReadWrite), 0);
  EQ(p_hipMemset(HV(r, 100), 0x3c, 8), 0);
  EQ(p_hipMemcpy(out, HV(r, g + 96), 16, D2H), 0);
  OK(out[3] == 0 && out[4] == 0x3c && out[11] == 0x3c && out[12] == 0);
  EQ(p_hipMemUnmap(r, 2 * g), 0);
  EQ(p_hipMemAddressFree(r, 2 * g), 0);
  EQ(p_hipMemRelease(hi), 0);
  /* the void * one as hip-tests pass it */
  EQ(p_hipMemImportFromShareableHandle(&hi, vfd, POSIX), 0);
  EQ(p_hipMemRelease(hi), 0);
  close((int)(uintptr_t)vfd);
  EQ(p_hipMemRelease(h), 0);
  EQ(p_hipMemRelease(h0), 0);
  EQ(p_hipFree(d), 0);
}

/* HOSTPTR=none: mapped VMM memory stays PROT_NONE; copies honour access. */
static void s_hvmm_hostptr_none(void) {
  hvh h;
  hipMemAllocationProp p = hvmm_prop(0);
  void *r;
  unsigned char in[64] = {9, 8, 7}, out[64];
  knob("HOSTPTR", "none");
  EQ(p_hipInit(0), 0);
  EQ(p_hipMemCreate(&h, 8192, &p, 0), 0);
  EQ(p_hipMemAddressReserve(&r, 8192, 0, NULL, 0), 0);
  EQ(p_hipMemMap(r, 8192, 0, h, 0), 0);
  EQ(p_hipMemcpy(r, in, sizeof in, H2D), EINV);
  EQ(hvmm_access(r, 8192, hipMemAccessFlagsProtReadWrite), 0);
  EQ(p_hipMemcpy(r, in, sizeof in, H2D), 0);
  EQ(p_hipMemset(HV(r, 4096), 0x5a, 16), 0);
  EQ(p_hipMemcpy(out, r, sizeof out, D2H), 0);
  OK(!memcmp(in, out, sizeof in));
  EQ(p_hipMemcpy(out, HV(r, 4096), 16, D2H), 0);
  OK(out[0] == 0x5a && out[15] == 0x5a);
  hostptr_p = r;
  OK(!reaped_ok(spawn(hvmm_read_host))); /* even with read-write access */
  EQ(hvmm_access(r, 8192, hipMemAccessFlagsProtRead), 0);
  EQ(p_hipMemset(r, 1, 8), EINV);
  EQ(p_hipMemcpy(out, r, sizeof out, D2H), 0);
  EQ(p_hipMemUnmap(r, 8192), 0);
  EQ(p_hipMemRelease(h), 0);
  EQ(p_hipMemAddressFree(r, 8192), 0);
}

/* ---- across processes: the fd over a socketpair (SCM_RIGHTS) ------------- */

static int hvmm_sock[2];
static unsigned char hvmm_pat[8192];
#define HVMM_SIZE 65536

/* The child: forked before the parent initialised the runtime, it
 * initialises its own, imports, reserves, maps, sets read access, reads. */
static void hvmm_importer(void) {
  hvh h = NULL;
  void *r, *r2;
  uint64_t size = 0;
  unsigned char out[sizeof hvmm_pat];
  char c;
  int pp[2];
  close(hvmm_sock[0]);
  EQ(p_hipInit(0), 0);
  int fd = recv_fd(hvmm_sock[1], &size);
  OK(fd >= 0);
  EQ(size, HVMM_SIZE);
  OK(!pipe(pp)); /* a pipe's fd is not an allocation */
  EQ(p_hipMemImportFromShareableHandle(&h, (void *)(intptr_t)pp[0], POSIX),
     EINV);
  close(pp[0]), close(pp[1]);
  EQ(p_hipMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, POSIX), 0);
  close(fd);
  hipMemAllocationProp q;
  EQ(p_hipMemGetAllocationPropertiesFromHandle(&q, h), 0);
  OK(q.requestedHandleType == POSIX);
  /* a size past the allocation: hipMemMap says no */
  EQ(p_hipMemAddressReserve(&r2, 2 * size, 0, NULL, 0), 0);
  EQ(p_hipMemMap(r2, 2 * size, 0, h, 0), EINV);
  EQ(p_hipMemMap(r2, size + 4096, 0, h, 0), EINV);
  EQ(p_hipMemAddressFree(r2, 2 * size), 0);
  EQ(p_hipMemAddressReserve(&r, size, 0, NULL, 0), 0);
  EQ(p_hipMemMap(r, size, 0, h, 0), 0);
  EQ(p_hipMemcpy(out, r, 16, D2H), EINV); /* no access yet */
  EQ(hvmm_access(r, size, hipMemAccessFlagsProtRead), 0);
  EQ(p_hipMemcpy(out, HV(r, size - sizeof out), sizeof out, D2H), 0);
  OK(!memcmp(out, hvmm_pat, sizeof out));
  EQ(p_hipMemcpy(r, out, 16, H2D), EINV); /* read-only */
  put(hvmm_sock[1], "R", 1);
  OK(take(hvmm_sock[1], &c, 1) && c == 'F'); /* the exporter released all */
  EQ(p_hipMemcpy(out, r, 64, D2H), 0);
  OK(out[0] == 0x77 && out[63] == 0x77);
  EQ(p_hipMemUnmap(r, size), 0);
  EQ(p_hipMemRelease(h), 0);
  EQ(p_hipMemAddressFree(r, size), 0);
  put(hvmm_sock[1], "X", 1);
}

static void s_hvmm_cross_process(void) {
  hvh h, h0;
  hipMemAllocationProp p = hvmm_prop(POSIX), p0 = hvmm_prop(0);
  void *r;
  int fd = -1, fd0 = -1;
  char c;
  const size_t g = HVMM_SIZE;
  for (size_t i = 0; i < sizeof hvmm_pat; i++)
    hvmm_pat[i] = (unsigned char)(i * 29 + 3);
  clear_log();
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, hvmm_sock)) abort();
  pid_t imp = spawn(hvmm_importer); /* before this process initialises */
  close(hvmm_sock[1]);
  EQ(p_hipInit(0), 0);
  EQ(p_hipMemCreate(&h, g, &p, 0), 0);
  EQ(p_hipMemAddressReserve(&r, g, 0, NULL, 0), 0);
  EQ(p_hipMemMap(r, g, 0, h, 0), 0);
  EQ(hvmm_access(r, g, hipMemAccessFlagsProtReadWrite), 0);
  EQ(p_hipMemcpy(HV(r, g - sizeof hvmm_pat), hvmm_pat, sizeof hvmm_pat, H2D),
     0);
  EQ(p_hipMemExportToShareableHandle(&fd, h, POSIX, 0), 0);
  EQ(p_hipMemCreate(&h0, g, &p0, 0), 0); /* made without the fd type */
  EQ(p_hipMemExportToShareableHandle(&fd0, h0, POSIX, 0), EINV);
  EQ(fd0, -1);
  EQ(p_hipMemRelease(h0), 0);
  send_fd(hvmm_sock[0], fd, g);
  close(fd);
  OK(take(hvmm_sock[0], &c, 1) && c == 'R'); /* the importer has read */
  EQ(p_hipMemset(r, 0x77, 64), 0);           /* seen by the importer */
  EQ(p_hipMemUnmap(r, g), 0);
  EQ(p_hipMemRelease(h), 0); /* the importer still holds the memory */
  EQ(p_hipMemAddressFree(r, g), 0);
  put(hvmm_sock[0], "F", 1);
  OK(take(hvmm_sock[0], &c, 1) && c == 'X');
  close(hvmm_sock[0]);
  OK(reaped_ok(imp));

  /* the log ties the import to the creation: the same alloc=<nonce> */
  char pid[16], alloc[40] = "", line[1024];
  EQ(log_malformed(), 0);
  snprintf(pid, sizeof pid, "%d ", (int)getpid());
  FILE *f = fopen(logpath, "r");
  while (f && fgets(line, sizeof line, f)) {
    char *a = strstr(line, " alloc=");
    if (!strncmp(line, pid, strlen(pid)) && strstr(line, " hipMemCreate ") &&
        strstr(line, " types=1 ") && a) {
      sscanf(a + 1, "%39s", alloc);
      break;
    }
  }
  if (f) fclose(f);
  OK(alloc[0] != 0);
  /* exporter: create, map, export, release */
  EQ(log_count(pid, alloc, "hipSuccess"), 4);
  snprintf(pid, sizeof pid, "%d ", (int)imp);
  EQ(log_count(pid, alloc, "hipSuccess"), 3); /* import, map, release */
  EQ(log_count(pid, " hipMemImportFromShareableHandle ", "hipSuccess"), 1);
  EQ(log_count(pid, " hipMemImportFromShareableHandle ",
               "hipErrorInvalidValue"),
     1);
}

static void run_hip_vmm(void) {
  run(&hip, "vmm knobs/granularity", s_hvmm_knobs);
  run(&hip, "vmm local", s_hvmm_local);
  run(&hip, "vmm share local", s_hvmm_share_local);
  run(&hip, "vmm hostptr none", s_hvmm_hostptr_none);
  run(&hip, "vmm cross-process", s_hvmm_cross_process);
}
