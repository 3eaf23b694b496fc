/* selftest_hip_pool.c - the HIP stream-ordered memory pool scenarios of
 * fake_gpu_selftest (fake_pool.h through fake_hip_pool.c). Not compiled
 * alone: selftest.c #includes it in its HIP-only part, after
 * selftest_hip_vmm.c (it uses check(), run(), spawn(), knob(), the log
 * helpers, fd_named/log_key, send_fd/recv_fd, hvmm_legacy_memfd and the
 * hostptr helpers there).
 */

// clang-format off
#define HPOOL_FUNCS(X)                                                         \
  X(hipMemPoolCreate) X(hipMemPoolDestroy) X(hipMallocFromPoolAsync)           \
  X(hipFreeAsync) X(hipMemPoolSetAccess) X(hipMemPoolGetAccess)                \
  X(hipMemPoolExportToShareableHandle) X(hipMemPoolImportFromShareableHandle)  \
  X(hipMemPoolExportPointer) X(hipMemPoolImportPointer)
// clang-format on
HPOOL_FUNCS(DECL)

static void load_hip_pool(void) {
  HPOOL_FUNCS(HIP_LOAD)
}

#define HFD(fd) ((void *)(intptr_t)(fd)) /* a POSIX fd as a shared handle */
static int hpool_dummy;                  /* its address: no pool, no stream */

static hipMemPoolProps hpool_props(unsigned types) {
  hipMemPoolProps p;
  memset(&p, 0, sizeof p);
  p.allocType = hipMemAllocationTypePinned;
  p.handleTypes = (hipMemAllocationHandleType)types;
  p.location.type = hipMemLocationTypeDevice;
  p.location.id = 0;
  return p;
}
static int hpool_access(hipMemPool_t pool, int flags) {
  hipMemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = hipMemLocationTypeDevice;
  d.location.id = 0;
  d.flags = (hipMemAccessFlags)flags;
  return p_hipMemPoolSetAccess(pool, &d, 1);
}
static int hpool_get_access(hipMemPool_t pool) {
  hipMemLocation l = {hipMemLocationTypeDevice, 0};
  hipMemAccessFlags f = (hipMemAccessFlags)99;
  if (p_hipMemPoolGetAccess(&f, pool, &l)) return -1;
  return (int)f;
}
static hipMemPool_t hpool_of(void *p) {
  hipMemPool_t h = (hipMemPool_t)1;
  EQ(p_hipPointerGetAttribute(&h, HIP_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p), 0);
  return h;
}
static int hpool_legacy(void *p) {
  int v = -1;
  EQ(p_hipPointerGetAttribute(
         &v, HIP_POINTER_ATTRIBUTE_IS_LEGACY_HIP_IPC_CAPABLE, p),
     0);
  return v;
}

/* ---- one process --------------------------------------------------------- */

static void hpool_forked_child(void) {
  hipMemPool_t pool = NULL;
  hipMemPoolProps p = hpool_props(0);
  void *d;
  EQ(p_hipMemPoolCreate(&pool, &p), hipErrorNotInitialized);
  EQ(p_hipMallocFromPoolAsync(&d, 64, pool, NULL), hipErrorNotInitialized);
}

static void s_hpool_knobs(void) {
  hipMemPool_t pool = NULL;
  hipMemPoolProps p = hpool_props(POSIX);
  int v = 0, pp[2];
  /* the version node of the real 5.2 library */
  static const char *names[] = {"hipMemPoolCreate",
                                "hipMemPoolDestroy",
                                "hipMallocFromPoolAsync",
                                "hipFreeAsync",
                                "hipMemPoolSetAccess",
                                "hipMemPoolGetAccess",
                                "hipMemPoolExportToShareableHandle",
                                "hipMemPoolImportFromShareableHandle",
                                "hipMemPoolExportPointer",
                                "hipMemPoolImportPointer"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (!dlvsym(hip_lib, names[i], "hip_5.1") ||
        dlvsym(hip_lib, names[i], "hip_4.2"))
      check(0, __LINE__, names[i], 0, 1);
  OK(dlvsym(hip_lib, "hipFree", "hip_4.2") &&
     dlvsym(hip_lib, "hipPointerGetAttribute", "hip_5.0"));

  EQ(p_hipMemPoolCreate(&pool, &p), 0); /* initialises implicitly */
  EQ(p_hipMemPoolDestroy(pool), 0);
  EQ(p_hipMemPoolDestroy(pool), EINV);
  EQ(p_hipMemPoolDestroy((hipMemPool_t)&hpool_dummy), EINV);

  /* FAKE_HIP_POOLS=0: no pools */
  knob("POOLS", "0");
  EQ(p_hipMemPoolCreate(&pool, &p), hipErrorNotSupported);
  p.handleTypes = hipMemHandleTypeNone;
  EQ(p_hipMemPoolCreate(&pool, &p), hipErrorNotSupported);
  OK(!pipe(pp));
  EQ(p_hipMemPoolImportFromShareableHandle(&pool, HFD(pp[0]), POSIX, 0),
     hipErrorNotSupported);
  close(pp[0]), close(pp[1]);
  knob("POOLS", NULL);

  /* FAKE_HIP_POSIX_FD=0: no shareable pools */
  knob("POSIX_FD", "0");
  p.handleTypes = POSIX;
  EQ(p_hipMemPoolCreate(&pool, &p), hipErrorNotSupported);
  p.handleTypes = hipMemHandleTypeNone;
  EQ(p_hipMemPoolCreate(&pool, &p), 0);
  EQ(p_hipMemPoolDestroy(pool), 0);
  knob("POSIX_FD", NULL);

  /* the props */
  p = hpool_props(POSIX);
  EQ(p_hipMemPoolCreate(NULL, &p), EINV);
  EQ(p_hipMemPoolCreate(&pool, NULL), EINV);
  p.handleTypes = hipMemHandleTypeWin32;
  EQ(p_hipMemPoolCreate(&pool, &p), hipErrorNotSupported);
  p.handleTypes = hipMemHandleTypeWin32Kmt;
  EQ(p_hipMemPoolCreate(&pool, &p), hipErrorNotSupported);
  p.handleTypes = (hipMemAllocationHandleType)0x100;
  EQ(p_hipMemPoolCreate(&pool, &p), EINV);
  p = hpool_props(0);
  p.allocType = hipMemAllocationTypeInvalid;
  EQ(p_hipMemPoolCreate(&pool, &p), EINV);
  p = hpool_props(0);
  p.location.type = hipMemLocationTypeInvalid;
  EQ(p_hipMemPoolCreate(&pool, &p), EINV);
  p = hpool_props(0);
  p.location.id = 1; /* one device */
  EQ(p_hipMemPoolCreate(&pool, &p), EINV);
  p.location.id = -1;
  EQ(p_hipMemPoolCreate(&pool, &p), EINV);
  p = hpool_props(0);
  p.reserved[63] = 1;
  EQ(p_hipMemPoolCreate(&pool, &p), EINV);
  p = hpool_props(0);
  p.win32SecurityAttributes = &v;
  EQ(p_hipMemPoolCreate(&pool, &p), EINV);

  /* a second device */
  knob("DEVICES", "2");
  p = hpool_props(POSIX);
  p.location.id = 1;
  void *d = NULL;
  int ord = -1;
  EQ(p_hipMemPoolCreate(&pool, &p), 0);
  EQ(p_hipMallocFromPoolAsync(&d, 64, pool, NULL), 0);
  EQ(p_hipPointerGetAttribute(&ord, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d),
     0);
  EQ(ord, 1);
  EQ(hpool_get_access(pool), hipMemAccessFlagsProtNone); /* device 0 */
  hipMemLocation l1 = {hipMemLocationTypeDevice, 1};
  hipMemAccessFlags f = hipMemAccessFlagsProtNone;
  EQ(p_hipMemPoolGetAccess(&f, pool, &l1), 0);
  EQ(f, hipMemAccessFlagsProtReadWrite); /* its own device */
  EQ(p_hipFree(d), 0);
  EQ(p_hipMemPoolDestroy(pool), 0);
  knob("DEVICES", NULL);

  /* a child forked after init cannot use the runtime */
  OK(reaped_ok(spawn(hpool_forked_child)));
  EQ(log_malformed(), 0);
}

static void s_hpool_local(void) {
  hipMemPool_t pool = NULL, pool0 = NULL, h;
  hipMemPoolProps pp = hpool_props(POSIX), pp0 = hpool_props(0);
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL, *base = NULL;
  hipStream_t s;
  size_t size = 0;
  unsigned char in[10000], out[10000];
  char want[128], got[40];
  for (size_t i = 0; i < sizeof in; i++) in[i] = (unsigned char)(i * 13 + 5);
  clear_log();
  EQ(p_hipInit(0), 0);
  EQ(p_hipMemPoolCreate(&pool, &pp), 0);
  EQ(p_hipMemPoolCreate(&pool0, &pp0), 0);
  OK(pool && pool0 && pool != pool0);
  EQ(p_hipStreamCreateWithFlags(&s, hipStreamNonBlocking), 0);

  /* hipMallocFromPoolAsync */
  EQ(p_hipMallocFromPoolAsync(&a, 0, pool, s), EINV);
  EQ(p_hipMallocFromPoolAsync(NULL, 64, pool, s), EINV);
  EQ(p_hipMallocFromPoolAsync(&a, 64, (hipMemPool_t)&hpool_dummy, s), EINV);
  EQ(p_hipMallocFromPoolAsync(&a, 64, NULL, s), EINV);
  EQ(p_hipMallocFromPoolAsync(&a, 64, pool, (hipStream_t)&hpool_dummy), EINV);
  EQ(p_hipMallocFromPoolAsync(&a, sizeof in, pool, s), 0);
  EQ(p_hipMallocFromPoolAsync(&b, 4096, pool0, NULL), 0); /* null stream */
  OK(a && b && a != b);
  /* its own memfd, named with the pool's and the pointer's nonces */
  log_key(got, sizeof got, getpid(), " hipMemPoolCreate ", " types=1 ",
          " pool=");
  OK(strlen(got) == 16);
  snprintf(want, sizeof want, "/memfd:fake_gpu_pool:%s:", got);
  OK(fd_named(want) >= 0);
  log_key(got, sizeof got, getpid(), " hipMallocFromPoolAsync ", " size=10000 ",
          " alloc=");
  OK(strlen(got) == 16 && strlen(want) + 16 < sizeof want);
  strcat(want, got);
  OK(fd_named(want) >= 0);

  /* what other calls answer for pool memory */
  EQ(p_hipMemGetAddressRange(&base, &size, HV(a, 100)), 0);
  OK(base == a && size == sizeof in);
  EQ(hpool_legacy(a), 0);
  OK(hpool_of(HV(a, 5)) == pool);
  OK(hpool_of(b) == pool0);
  EQ(p_hipMalloc(&d, 4096), 0);
  OK(hpool_of(d) == NULL); /* not from a pool */
  EQ(hpool_legacy(d), 1);
  h = (hipMemPool_t)1;
  EQ(p_hipPointerGetAttribute(&h, HIP_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, in),
     EINV); /* not device memory */
  EQ(p_hipPointerGetAttribute(NULL, HIP_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a),
     EINV);
  /* the other attributes answer as before */
  void *start = NULL;
  size_t rs = 0;
  int ord = -1, mapped = -1, managed = -1;
  unsigned memtype = 0;
  unsigned long long id = 0;
  EQ(p_hipPointerGetAttribute(&start, HIP_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                              HV(a, 7)),
     0);
  OK(start == a);
  EQ(p_hipPointerGetAttribute(&rs, HIP_POINTER_ATTRIBUTE_RANGE_SIZE, a), 0);
  EQ(rs, sizeof in);
  EQ(p_hipPointerGetAttribute(&ord, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a),
     0);
  EQ(ord, 0);
  EQ(p_hipPointerGetAttribute(&mapped, HIP_POINTER_ATTRIBUTE_MAPPED, a), 0);
  EQ(mapped, 1);
  EQ(p_hipPointerGetAttribute(&managed, HIP_POINTER_ATTRIBUTE_IS_MANAGED, a),
     0);
  EQ(managed, 0);
  EQ(p_hipPointerGetAttribute(&memtype, HIP_POINTER_ATTRIBUTE_MEMORY_TYPE, a),
     0);
  EQ(memtype, hipMemoryTypeDevice);
  EQ(p_hipPointerGetAttribute(&id, HIP_POINTER_ATTRIBUTE_BUFFER_ID, a), 0);
  OK(id != 0);
  EQ(p_hipPointerGetAttribute(&start, HIP_POINTER_ATTRIBUTE_HOST_POINTER, a),
     EINV);
  EQ(p_hipPointerGetAttribute(&rs, HIP_POINTER_ATTRIBUTE_ACCESS_FLAGS, a),
     hipErrorNotSupported);
  hipIpcMemHandle_t ih;
  EQ(p_hipIpcGetMemHandle(&ih, a), EINV);
  EQ(p_hipIpcGetMemHandle(&ih, HV(a, 64)), EINV);
  EQ(p_hipIpcGetMemHandle(&ih, d), 0); /* hipMalloc's still works */
  EQ(p_hipIpcGetMemHandle(&ih, HV(d, 64)), hipErrorInvalidHandle);
  EQ(p_hipMemRetainAllocationHandle(&(hvh){0}, a), EINV);

  /* copies and memset */
  EQ(p_hipStreamSynchronize(s), 0);
  EQ(p_hipMemcpy(a, in, sizeof in, H2D), 0);
  EQ(p_hipMemset(HV(a, 10), 0xee, 3), 0);
  EQ(p_hipMemcpy(b, HV(a, 8), 8, D2D), 0);
  EQ(p_hipMemcpy(out, b, 8, D2H), 0);
  OK(out[0] == in[8] && out[2] == 0xee && out[4] == 0xee && out[5] == in[13]);
  EQ(p_hipMemcpy(out, a, sizeof in, hipMemcpyDefault), 0);
  OK(out[9] == in[9] && !memcmp(out + 13, in + 13, sizeof in - 13));
  EQ(p_hipMemcpy(HV(a, sizeof in - 4), in, 8, H2D), EINV);
  snprintf(want, sizeof want, " alloc=%s", got);
  EQ(log_count(NULL, " hipMemcpy ", " pending_us=0 alloc="), 5);
  EQ(log_count(NULL, " hipMemset ", want), 1);

  /* touched before the allocation completes: logged, still done */
  knob("WORK_US", "200000");
  EQ(p_hipMallocFromPoolAsync(&c, 64, pool, s), 0);
  knob("WORK_US", NULL);
  EQ(log_count(NULL, " ready_in_us=0 ", "hipSuccess"), 2);
  EQ(log_count(NULL, " hipMallocFromPoolAsync ", "hipSuccess"), 3);
  EQ(p_hipMemset(c, 1, 64), 0); /* the null stream does not wait for s */
  EQ(log_count(NULL, " hipMemset ", " pending_us=0 "), 1);
  EQ(log_count(NULL, " hipMemset ", " pending_us="), 2);
  EQ(p_hipStreamSynchronize(s), 0);
  EQ(p_hipMemcpy(out, c, 64, D2H), 0);
  OK(out[0] == 1 && out[63] == 1);
  EQ(log_count(NULL, " hipMemcpy ", " pending_us=0 "), 6);

  /* access: the pool's device by default */
  EQ(hpool_get_access(pool), hipMemAccessFlagsProtReadWrite);
  EQ(hpool_access(pool, hipMemAccessFlagsProtRead), 0);
  EQ(hpool_get_access(pool), hipMemAccessFlagsProtRead);
  EQ(p_hipMemset(a, 0, 4), EINV);
  EQ(p_hipMemcpy(out, a, 4, D2H), 0);
  EQ(hpool_access(pool, hipMemAccessFlagsProtReadWrite), 0);
  EQ(hpool_access(pool, 2), EINV);
  hipMemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location.type = hipMemLocationTypeDevice;
  ad.location.id = 3;
  ad.flags = hipMemAccessFlagsProtReadWrite;
  EQ(p_hipMemPoolSetAccess(pool, &ad, 1), EINV);
  EQ(p_hipMemPoolSetAccess(pool, NULL, 1), EINV);
  ad.location.id = 0;
  EQ(p_hipMemPoolSetAccess(pool, &ad, 0), EINV);
  EQ(p_hipMemPoolSetAccess((hipMemPool_t)&hpool_dummy, &ad, 1), EINV);
  hipMemLocation loc = {hipMemLocationTypeInvalid, 0};
  hipMemAccessFlags af;
  EQ(p_hipMemPoolGetAccess(&af, pool, &loc), EINV);
  loc.type = hipMemLocationTypeDevice;
  EQ(p_hipMemPoolGetAccess(NULL, pool, &loc), EINV);

  /* pool export: shareable pools only */
  int fd = -1, fd0 = -1, fd2 = -1;
  EQ(p_hipMemPoolExportToShareableHandle(&fd0, pool0, POSIX, 0), EINV);
  EQ(fd0, -1);
  EQ(p_hipMemPoolExportToShareableHandle(&fd, pool, POSIX, 1), EINV);
  EQ(p_hipMemPoolExportToShareableHandle(&fd, pool, hipMemHandleTypeWin32, 0),
     EINV);
  EQ(p_hipMemPoolExportToShareableHandle(NULL, pool, POSIX, 0), EINV);
  EQ(p_hipMemPoolExportToShareableHandle(&fd, pool, POSIX, 0), 0);
  OK(fd >= 0 && fcntl(fd, F_GETFD) == FD_CLOEXEC);
  EQ(p_hipMemPoolExportToShareableHandle(&fd2, pool, POSIX, 0), 0);
  OK(fd2 >= 0 && fd2 != fd); /* a new fd each time */
  close(fd2);

  /* pointer export */
  hipMemPoolPtrExportData x, x0;
  EQ(p_hipMemPoolExportPointer(&x0, b), EINV);  /* pool0: not shareable */
  EQ(p_hipMemPoolExportPointer(&x0, d), EINV);  /* hipMalloc's */
  EQ(p_hipMemPoolExportPointer(&x0, in), EINV); /* host memory */
  EQ(p_hipMemPoolExportPointer(NULL, a), EINV);
  EQ(p_hipMemPoolExportPointer(&x, a), 0);

  /* what is not a pool's fd */
  int pp_[2], sv[2];
  OK(!pipe(pp_) && !socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  int plain = memfd_create("fake_gpu_poolfd:0000000000000001:0", 0);
  OK(plain >= 0 && !ftruncate(plain, 24));
  hvh vmh;
  hipMemAllocationProp vp = hvmm_prop(POSIX);
  int vfd = -1;
  EQ(p_hipMemCreate(&vmh, 8192, &vp, 0), 0);
  EQ(p_hipMemExportToShareableHandle(&vfd, vmh, POSIX, 0), 0);
  int lfd = hvmm_legacy_memfd(), afd = fd_named("/memfd:fake_gpu_pool:");
  OK(lfd >= 0 && afd >= 0);
  int bad[] = {pp_[0], pp_[1], sv[0], plain, vfd, lfd, afd, 999, -1};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    EQ(p_hipMemPoolImportFromShareableHandle(&h, HFD(bad[i]), POSIX, 0), EINV);
  EQ(p_hipMemPoolImportFromShareableHandle(&h, HFD(fd), hipMemHandleTypeWin32,
                                           0),
     EINV);
  EQ(p_hipMemPoolImportFromShareableHandle(&h, HFD(fd), POSIX, 1), EINV);
  EQ(p_hipMemPoolImportFromShareableHandle(NULL, HFD(fd), POSIX, 0), EINV);
  close(pp_[0]), close(pp_[1]), close(sv[0]), close(sv[1]), close(plain);
  close(vfd);
  EQ(p_hipMemRelease(vmh), 0);

  /* an import in the exporting process: a pool that cannot allocate, whose
   * pointers cannot come from this process */
  hipMemPool_t imp = NULL;
  EQ(p_hipMemPoolImportFromShareableHandle(&imp, HFD(fd), POSIX, 0), 0);
  close(fd);
  OK(imp && imp != pool);
  EQ(hpool_get_access(imp), hipMemAccessFlagsProtNone);
  EQ(p_hipMallocFromPoolAsync(&c, 64, imp, s), hipErrorNotSupported);
  EQ(p_hipMemPoolExportToShareableHandle(&fd2, imp, POSIX, 0), EINV);
  void *ip = NULL;
  EQ(p_hipMemPoolImportPointer(&ip, imp, &x), EINV);
  EQ(p_hipMemPoolImportPointer(&ip, pool, &x), EINV);
  EQ(p_hipMemPoolImportPointer(NULL, imp, &x), EINV);
  EQ(p_hipMemPoolImportPointer(&ip, imp, NULL), EINV);
  EQ(p_hipMemPoolDestroy(imp), 0);
  log_key(got, sizeof got, getpid(), " hipMemPoolCreate ", " types=1 ",
          " pool=");
  snprintf(want, sizeof want, " pool=%s", got);
  EQ(log_count(NULL, " hipMemPoolImportFromShareableHandle ", want), 1);

  /* MEM_LIMIT */
  knob("MEM_LIMIT", "20000"); /* 10000 + 4096 + 64 + 4096 live */
  EQ(p_hipMallocFromPoolAsync(&c, 4096, pool, s), hipErrorOutOfMemory);
  knob("MEM_LIMIT", NULL);

  /* frees: hipFreeAsync and hipFree, base pointers of pool memory */
  void *e1 = NULL, *e2 = NULL;
  EQ(p_hipMallocFromPoolAsync(&e1, 6000, pool0, s), 0);
  EQ(p_hipMallocFromPoolAsync(&e2, 6000, pool0, s), 0);
  EQ(p_hipFreeAsync(d, s), EINV); /* hipMalloc's */
  EQ(p_hipFreeAsync(HV(a, 1), s), EINV);
  EQ(p_hipFreeAsync(NULL, s), EINV);
  EQ(p_hipFreeAsync(a, (hipStream_t)&hpool_dummy), EINV);
  EQ(p_hipFreeAsync(a, s), 0);
  EQ(p_hipFreeAsync(a, s), EINV);
  EQ(p_hipMemGetAddressRange(&base, &size, a), hipErrorInvalidDevicePointer);
  EQ(p_hipFree(HV(e1, 8)), hipErrorInvalidDevicePointer); /* interior */
  EQ(p_hipFree(e1), 0); /* "The pointer may be freed with hipFree" */
  EQ(p_hipFree(e1), hipErrorInvalidDevicePointer);
  EQ(p_hipFreeAsync(e2, NULL), 0);
  EQ(p_hipFree(d), 0);
  /* the refused interior pointer and e1 (then unknown: no pool keys) */
  EQ(log_count(NULL, " hipFree ", " imported_elsewhere=0 pool="), 2);
  EQ(log_count(NULL, " hipFree ", "hipErrorInvalidDevicePointer"), 2);
  EQ(log_count(NULL, " hipFreeAsync ", "hipSuccess"), 2);

  /* destroyed with an allocation outstanding: the pointer stays */
  EQ(p_hipMemPoolDestroy(pool0), 0);
  EQ(log_count(NULL, " hipMemPoolDestroy ", " outstanding=1 "), 1);
  EQ(p_hipMallocFromPoolAsync(&c, 64, pool0, s), EINV);
  EQ(hpool_get_access(pool0), -1);
  OK(hpool_of(b) == pool0);
  EQ(p_hipMemcpy(out, b, 8, D2H), 0);
  EQ(p_hipFreeAsync(b, NULL), 0);
  EQ(p_hipMemPoolDestroy(pool0), EINV);

  EQ(p_hipFreeAsync(c, s), 0);
  EQ(p_hipMemPoolDestroy(pool), 0);
  EQ(p_hipStreamDestroy(s), 0);
  EQ(log_malformed(), 0);
}

static void s_hpool_hostptr_none(void) {
  hipMemPool_t pool;
  hipMemPoolProps pp = hpool_props(0);
  void *a;
  unsigned char in[64] = {4, 5, 6}, out[64];
  knob("HOSTPTR", "none");
  EQ(p_hipInit(0), 0);
  EQ(p_hipMemPoolCreate(&pool, &pp), 0);
  EQ(p_hipMallocFromPoolAsync(&a, 4096, pool, NULL), 0);
  EQ(p_hipMemcpy(a, in, sizeof in, H2D), 0);
  EQ(p_hipMemcpy(out, a, sizeof out, D2H), 0);
  OK(!memcmp(in, out, sizeof in));
  hostptr_p = a;
  OK(!reaped_ok(spawn(hvmm_read_host)));
  EQ(p_hipFreeAsync(a, NULL), 0);
  EQ(p_hipMemPoolDestroy(pool), 0);
}

/* ---- across processes: the pool fd over a socketpair (SCM_RIGHTS) -------- */

static int hpool_sock[2];
static unsigned char hpool_pat[12288];
/* p[0]: read, freed with hipFree in the importer, then with hipFreeAsync in
 * the exporter (in order); p[1]: pending when imported (touched early),
 * freed with hipFreeAsync and synchronized in the importer, then with
 * hipFree in the exporter; p[2]: the importer's hipFreeAsync has not
 * completed when the exporter frees it (the violation) */
enum { HNPTR = 3 };

/* The child: forked before the parent initialised the runtime, it
 * initialises its own, imports the pool, sets access, imports the pointers,
 * reads, frees. */
static void hpool_importer(void) {
  hipMemPool_t pool = NULL, mine = NULL;
  hipMemPoolProps pp = hpool_props(POSIX);
  hipMemPoolPtrExportData x[HNPTR], y;
  void *p[HNPTR], *q = NULL, *base = NULL;
  hipStream_t s;
  uint64_t unused;
  unsigned char out[sizeof hpool_pat];
  size_t size = 0;
  char c;
  int pipefd[2];
  close(hpool_sock[0]);
  EQ(p_hipInit(0), 0);
  int fd = recv_fd(hpool_sock[1], &unused);
  OK(fd >= 0);
  OK(take(hpool_sock[1], x, sizeof x));
  OK(!pipe(pipefd)); /* a pipe's fd is not a pool */
  EQ(p_hipMemPoolImportFromShareableHandle(&pool, HFD(pipefd[0]), POSIX, 0),
     EINV);
  close(pipefd[0]), close(pipefd[1]);
  EQ(p_hipMemPoolImportFromShareableHandle(&pool, HFD(fd), POSIX, 0), 0);
  close(fd);
  EQ(p_hipStreamCreateWithFlags(&s, hipStreamNonBlocking), 0);
  EQ(p_hipMallocFromPoolAsync(&q, 64, pool, s), hipErrorNotSupported);
  EQ(p_hipMemPoolCreate(&mine, &pp), 0); /* not the import of x's pool */
  EQ(p_hipMemPoolImportPointer(&q, mine, &x[0]), EINV);
  y = x[0];
  y.reserved[32] ^= 1; /* another allocation nonce: not found */
  EQ(p_hipMemPoolImportPointer(&q, pool, &y), EINV);
  for (int i = 0; i < HNPTR; i++)
    EQ(p_hipMemPoolImportPointer(&p[i], pool, &x[i]), 0);
  char pid[16];
  snprintf(pid, sizeof pid, "%d ", (int)getpid());
  /* the two failures, then p[0]; p[1] and p[2] had not completed */
  EQ(log_count(pid, " hipMemPoolImportPointer ", " pending_us=0 "), 3);

  /* no access until hipMemPoolSetAccess */
  EQ(hpool_get_access(pool), hipMemAccessFlagsProtNone);
  EQ(p_hipMemcpy(out, p[0], 16, D2H), EINV);
  EQ(hpool_access(pool, hipMemAccessFlagsProtReadWrite), 0);
  EQ(p_hipMemcpy(out, p[0], sizeof out, D2H), 0);
  OK(!memcmp(out, hpool_pat, sizeof out));
  EQ(p_hipMemcpy(out, p[1], 16, D2H), 0); /* before it completed: logged */
  EQ(log_count(pid, " hipMemcpy ", " pending_us=0 "), 1);
  EQ(log_count(pid, " hipMemcpy ", " pending_us="), 2);

  /* what other calls answer for an imported pointer */
  OK(hpool_of(HV(p[0], 7)) == pool);
  EQ(p_hipMemGetAddressRange(&base, &size, HV(p[0], 100)), 0);
  OK(base == p[0] && size == sizeof hpool_pat);
  EQ(hpool_legacy(p[0]), 0);
  hipIpcMemHandle_t ih;
  EQ(p_hipIpcGetMemHandle(&ih, p[0]), EINV);
  EQ(p_hipMemPoolExportPointer(&y, p[0]), EINV);
  /* imported twice: the same pointer, freed twice */
  EQ(p_hipMemPoolImportPointer(&q, pool, &x[0]), 0);
  OK(q == p[0]);
  EQ(p_hipFreeAsync(q, s), 0);

  /* freed here first, then in the exporter */
  EQ(p_hipFree(p[0]), 0);
  EQ(p_hipFreeAsync(p[1], s), 0);
  EQ(p_hipStreamSynchronize(s), 0);
  knob("WORK_US", "10000000"); /* completes in 10 s: after the exporter's */
  EQ(p_hipFreeAsync(p[2], s), 0);
  knob("WORK_US", NULL);
  put(hpool_sock[1], "R", 1);
  OK(take(hpool_sock[1], &c, 1) && c == 'F'); /* the exporter freed all */
  EQ(p_hipMemPoolImportPointer(&q, pool, &x[0]), EINV); /* freed there */
  EQ(p_hipMemPoolDestroy(pool), 0);
  EQ(p_hipMemPoolDestroy(mine), 0);
  EQ(p_hipStreamDestroy(s), 0);
  put(hpool_sock[1], "X", 1);
}

static void s_hpool_cross_process(void) {
  hipMemPool_t pool;
  hipMemPoolProps pp = hpool_props(POSIX);
  void *p[HNPTR];
  hipMemPoolPtrExportData x[HNPTR];
  hipStream_t s;
  int fd = -1;
  char c;
  for (size_t i = 0; i < sizeof hpool_pat; i++)
    hpool_pat[i] = (unsigned char)(i * 37 + 11);
  clear_log();
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, hpool_sock)) abort();
  pid_t imp = spawn(hpool_importer); /* before this process initialises */
  close(hpool_sock[1]);
  EQ(p_hipInit(0), 0);
  EQ(p_hipStreamCreateWithFlags(&s, hipStreamNonBlocking), 0);
  EQ(p_hipMemPoolCreate(&pool, &pp), 0);
  EQ(p_hipMallocFromPoolAsync(&p[0], sizeof hpool_pat, pool, s), 0);
  EQ(p_hipStreamSynchronize(s), 0);
  EQ(p_hipMemcpy(p[0], hpool_pat, sizeof hpool_pat, H2D), 0);
  knob("WORK_US", "300000"); /* p[1] completes 300 ms from now */
  EQ(p_hipMallocFromPoolAsync(&p[1], 4096, pool, s), 0);
  knob("WORK_US", NULL);
  EQ(p_hipMallocFromPoolAsync(&p[2], 4096, pool, s), 0);
  EQ(p_hipMemPoolExportToShareableHandle(&fd, pool, POSIX, 0), 0);
  for (int i = 0; i < HNPTR; i++) EQ(p_hipMemPoolExportPointer(&x[i], p[i]), 0);
  send_fd(hpool_sock[0], fd, 0);
  close(fd);
  put(hpool_sock[0], x, sizeof x);
  OK(take(hpool_sock[0], &c, 1) && c == 'R'); /* the importer freed */
  EQ(p_hipStreamSynchronize(s), 0);
  EQ(p_hipFreeAsync(p[0], s), 0); /* in order: imported_elsewhere=0 */
  EQ(p_hipFree(p[1]), 0);         /* in order too */
  EQ(p_hipFreeAsync(p[2], s), 0); /* the importer's free still pending */
  put(hpool_sock[0], "F", 1);
  OK(take(hpool_sock[0], &c, 1) && c == 'X');
  EQ(p_hipMemPoolDestroy(pool), 0);
  EQ(p_hipStreamDestroy(s), 0);
  close(hpool_sock[0]);
  OK(reaped_ok(imp));

  /* the same pool= and alloc= keys in both processes */
  EQ(log_malformed(), 0);
  char epid[16], ipid[16], key[128], pl[40], al[40];
  pid_t me = getpid();
  snprintf(epid, sizeof epid, "%d ", (int)me);
  snprintf(ipid, sizeof ipid, "%d ", (int)imp);
  log_key(pl, sizeof pl, me, " hipMemPoolCreate ", NULL, " pool=");
  OK(strlen(pl) == 16);
  snprintf(key, sizeof key, " pool=%s", pl);
  EQ(log_count(ipid, " hipMemPoolImportFromShareableHandle ", key), 1);
  /* two refused, three imported, p[0] again, p[0] after the exporter freed
   * it: the data's pool either way */
  EQ(log_count(ipid, " hipMemPoolImportPointer ", key), 7);
  log_key(al, sizeof al, me, " hipMallocFromPoolAsync ", " size=12288 ",
          " alloc=");
  OK(strlen(al) == 16);
  snprintf(key, sizeof key, " pool=%s alloc=%s", pl, al);
  EQ(log_count(epid, " hipMemPoolExportPointer ", key), 1);
  EQ(log_count(ipid, " hipMemPoolImportPointer ", key), 4);
  EQ(log_count(ipid, " hipFreeAsync ", key), 1);
  EQ(log_count(ipid, " hipFree ", key), 1);
  snprintf(key, sizeof key, " imported_elsewhere=0 pool=%s alloc=%s", pl, al);
  EQ(log_count(epid, " hipFreeAsync ", key), 1); /* after the importer */
  EQ(log_count(epid, " hipFree ", " imported_elsewhere=0 "), 1); /* p[1] */
  EQ(log_count(epid, " hipFreeAsync ", " imported_elsewhere=1 "), 1);
  EQ(log_count(NULL, NULL, " imported_elsewhere=1 "), 1);
}

static void run_hip_pool(void) {
  run(&hip, "pool knobs/props/fork", s_hpool_knobs);
  run(&hip, "pool local", s_hpool_local);
  run(&hip, "pool hostptr none", s_hpool_hostptr_none);
  run(&hip, "pool cross-process", s_hpool_cross_process);
}
