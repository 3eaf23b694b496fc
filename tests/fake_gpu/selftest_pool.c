/* selftest_pool.c - the CUDA stream-ordered memory pool scenarios of
 * fake_gpu_selftest (fake_pool.h, fake_cuda_pool.c). Not compiled alone:
 * selftest.c #includes it in its CUDA-only part, after selftest_vmm.c (it
 * uses check(), run(), spawn(), knob(), the log helpers, send_fd/recv_fd and
 * legacy_memfd there).
 */

// clang-format off
#define POOL_FUNCS(X)                                                          \
  X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemAllocFromPoolAsync)            \
  X(cuMemFreeAsync) X(cuMemPoolSetAccess) X(cuMemPoolGetAccess)                \
  X(cuMemPoolExportToShareableHandle) X(cuMemPoolImportFromShareableHandle)    \
  X(cuMemPoolExportPointer) X(cuMemPoolImportPointer)
// clang-format on
POOL_FUNCS(DECL)

static int v_dummy; /* its address is no pool and no stream */

static void load_pool(void) {
  POOL_FUNCS(CU_LOAD)
}

static CUmemPoolProps pool_props(unsigned types) {
  CUmemPoolProps p;
  memset(&p, 0, sizeof p);
  p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.handleTypes = (CUmemAllocationHandleType)types;
  p.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0};
  return p;
}
static int pool_access(CUmemoryPool pool, int flags) {
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0},
                       (CUmemAccess_flags)flags};
  return p_cuMemPoolSetAccess(pool, &d, 1);
}
static int pool_get_access(CUmemoryPool pool) {
  CUmemLocation l = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemAccess_flags f = (CUmemAccess_flags)99;
  if (p_cuMemPoolGetAccess(&f, pool, &l)) return -1;
  return (int)f;
}
static CUmemoryPool mempool_of(CUdeviceptr p) {
  CUmemoryPool h = (CUmemoryPool)1;
  EQ(p_cuPointerGetAttribute(&h, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p), 0);
  return h;
}
/* ---- one process --------------------------------------------------------- */

static void pool_forked_child(void) {
  CUmemoryPool pool;
  CUmemPoolProps p = pool_props(0);
  CUdeviceptr d;
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_NOT_INITIALIZED);
  EQ(p_cuMemAllocFromPoolAsync(&d, 64, pool, NULL), CUDA_ERROR_NOT_INITIALIZED);
}

static void s_pool_knobs(void) {
  CUmemoryPool pool = NULL;
  CUmemPoolProps p = pool_props(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int v = -1;
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_NOT_INITIALIZED);
  EQ(cu_init(), 0);
  EQ(p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0),
     0);
  EQ(v, 1);
  EQ(p_cuDeviceGetAttribute(
         &v, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0),
     0);
  EQ(v, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  knob("POOLS", "0");
  EQ(p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0),
     0);
  EQ(v, 0);
  EQ(p_cuDeviceGetAttribute(
         &v, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0),
     0);
  EQ(v, 0);
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_NOT_SUPPORTED);
  knob("POOLS", NULL);
  knob("POSIX_FD", "0");
  EQ(p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0),
     0);
  EQ(v, 1);
  EQ(p_cuDeviceGetAttribute(
         &v, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0),
     0);
  EQ(v, 0);
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_NOT_SUPPORTED);
  p.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  EQ(p_cuMemPoolCreate(&pool, &p), 0);
  EQ(p_cuMemPoolDestroy(pool), 0);
  EQ(p_cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
  knob("POSIX_FD", NULL);

  /* the props */
  EQ(p_cuMemPoolCreate(NULL, &p), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolCreate(&pool, NULL), CUDA_ERROR_INVALID_VALUE);
  p.handleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_NOT_SUPPORTED);
  p.handleTypes = CU_MEM_HANDLE_TYPE_WIN32;
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_NOT_SUPPORTED);
  p.handleTypes = (CUmemAllocationHandleType)0x100;
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_INVALID_VALUE);
  p = pool_props(0);
  p.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_INVALID_VALUE);
  p = pool_props(0);
  p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_INVALID_VALUE);
  p.location.type = CU_MEM_LOCATION_TYPE_HOST;
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_NOT_SUPPORTED);
  p = pool_props(0);
  p.location.id = 1; /* one device */
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_INVALID_VALUE);
  p = pool_props(0);
  p.reserved[3] = 1;
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_INVALID_VALUE);
  p = pool_props(0);
  p.win32SecurityAttributes = &v;
  EQ(p_cuMemPoolCreate(&pool, &p), CUDA_ERROR_INVALID_VALUE);

  /* the fork rule */
  OK(reaped_ok(spawn(pool_forked_child)));
  EQ(log_malformed(), 0);
}

static void s_pool_local(void) {
  CUmemoryPool pool = NULL, pool0 = NULL, h;
  CUmemPoolProps pp = pool_props(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUmemPoolProps pp0 = pool_props(0);
  CUdeviceptr a = 0, b = 0, c = 0, d = 0, base = 0;
  CUstream s;
  size_t size = 0;
  unsigned char in[10000], out[10000];
  char want[128], got[40];
  for (size_t i = 0; i < sizeof in; i++) in[i] = (unsigned char)(i * 11 + 5);
  clear_log();
  EQ(cu_init(), 0);
  EQ(p_cuMemPoolCreate(&pool, &pp), 0);
  EQ(p_cuMemPoolCreate(&pool0, &pp0), 0);
  OK(pool && pool0 && pool != pool0);
  EQ(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 0);

  /* cuMemAllocFromPoolAsync */
  EQ(p_cuMemAllocFromPoolAsync(&a, 0, pool, s), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAllocFromPoolAsync(NULL, 64, pool, s), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAllocFromPoolAsync(&a, 64, (CUmemoryPool)&v_dummy, s),
     CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAllocFromPoolAsync(&a, 64, pool, (CUstream)&v_dummy),
     CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAllocFromPoolAsync(&a, sizeof in, pool, s), 0);
  EQ(p_cuMemAllocFromPoolAsync(&b, 4096, pool0, NULL), 0); /* legacy stream */
  OK(a && b && a != b);
  /* its own memfd, named with the pool's and the pointer's nonces */
  log_key(got, sizeof got, getpid(), " cuMemPoolCreate ", " types=1 ",
          " pool=");
  snprintf(want, sizeof want, "/memfd:fake_gpu_pool:%s:", got);
  OK(got[0] && fd_named(want) >= 0);
  log_key(got, sizeof got, getpid(), " cuMemAllocFromPoolAsync ",
          " size=10000 ", " alloc=");
  OK(strlen(got) == 16 && strlen(want) + 16 < sizeof want);
  strcat(want, got);
  OK(fd_named(want) >= 0);

  /* what other calls answer for pool memory */
  EQ(p_cuMemGetAddressRange(&base, &size, a + 100), 0);
  OK(base == a && size == sizeof in);
  int legacy = -1;
  EQ(p_cuPointerGetAttribute(
         &legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, a),
     0);
  EQ(legacy, 0);
  OK(mempool_of(a + 5) == pool);
  OK(mempool_of(b) == pool0);
  EQ(p_cuMemAlloc(&d, 4096), 0);
  OK(mempool_of(d) == NULL); /* "Otherwise returns NULL." */
  h = (CUmemoryPool)1;
  EQ(p_cuPointerGetAttribute(&h, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, D(in)),
     CUDA_ERROR_INVALID_VALUE); /* not device memory */
  CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  size_t rs = 0;
  void *data[2] = {&h, &rs};
  EQ(p_cuPointerGetAttributes(2, attrs, data, a), 0);
  OK(h == pool && rs == sizeof in);
  CUipcMemHandle ih;
  EQ(p_cuIpcGetMemHandle(&ih, a), CUDA_ERROR_INVALID_VALUE);
  CUmemGenericAllocationHandle vh;
  EQ(p_cuMemRetainAllocationHandle(&vh, V(a)), CUDA_ERROR_INVALID_VALUE);

  /* copies and memset */
  EQ(p_cuStreamSynchronize(s), 0);
  EQ(p_cuMemcpyHtoD(a, in, sizeof in), 0);
  EQ(p_cuMemsetD8(a + 10, 0xee, 3), 0);
  EQ(p_cuMemcpyDtoD(b, a + 8, 8), 0);
  EQ(p_cuMemcpyDtoH(out, b, 8), 0);
  OK(out[0] == in[8] && out[2] == 0xee && out[4] == 0xee && out[5] == in[13]);
  EQ(p_cuMemcpyDtoH(out, a, sizeof in), 0);
  OK(out[9] == in[9] && !memcmp(out + 13, in + 13, sizeof in - 13));
  EQ(p_cuMemcpyHtoD(a + sizeof in - 4, in, 8), CUDA_ERROR_INVALID_VALUE);
  snprintf(want, sizeof want, " alloc=%s", got);
  EQ(log_count(NULL, " cuMemcpyDtoH_v2 ", " pending_us=0 alloc="), 2);
  EQ(log_count(NULL, " cuMemsetD8_v2 ", want), 1);

  /* touched before the allocation completes: logged, still done */
  knob("WORK_US", "200000");
  EQ(p_cuMemAllocFromPoolAsync(&c, 64, pool, s), 0);
  knob("WORK_US", NULL);
  EQ(log_count(NULL, " ready_in_us=0 ", "CUDA_SUCCESS"), 2);
  EQ(log_count(NULL, " cuMemAllocFromPoolAsync ", "CUDA_SUCCESS"), 3);
  EQ(p_cuMemsetD8(c, 1, 64), 0); /* the legacy stream does not wait for s */
  EQ(log_count(NULL, " cuMemsetD8_v2 ", " pending_us=0 "), 1);
  EQ(log_count(NULL, " cuMemsetD8_v2 ", " pending_us="), 2);
  EQ(p_cuStreamSynchronize(s), 0);
  EQ(p_cuMemcpyDtoH(out, c, 64), 0);
  OK(out[0] == 1 && out[63] == 1);
  EQ(log_count(NULL, " cuMemcpyDtoH_v2 ", " pending_us=0 "), 3);

  /* access: the pool's device by default */
  EQ(pool_get_access(pool), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EQ(pool_access(pool, CU_MEM_ACCESS_FLAGS_PROT_READ), 0);
  EQ(pool_get_access(pool), CU_MEM_ACCESS_FLAGS_PROT_READ);
  EQ(p_cuMemsetD8(a, 0, 4), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemcpyDtoH(out, a, 4), 0);
  EQ(pool_access(pool, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), 0);
  EQ(pool_access(pool, 2), CUDA_ERROR_INVALID_VALUE);
  CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 3},
                        CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  EQ(p_cuMemPoolSetAccess(pool, &ad, 1), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolSetAccess(pool, NULL, 1), CUDA_ERROR_INVALID_VALUE);
  CUmemLocation loc = {CU_MEM_LOCATION_TYPE_HOST, 0};
  CUmemAccess_flags af;
  EQ(p_cuMemPoolGetAccess(&af, pool, &loc), CUDA_ERROR_INVALID_VALUE);

  /* pool export: shareable pools only */
  int fd = -1, fd0 = -1;
  EQ(p_cuMemPoolExportToShareableHandle(
         &fd0, pool0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolExportToShareableHandle(
         &fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
     CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_FABRIC,
                                        0),
     CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolExportToShareableHandle(
         &fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     0);
  OK(fd >= 0 && fcntl(fd, F_GETFD) == FD_CLOEXEC);
  int fd2 = -1;
  EQ(p_cuMemPoolExportToShareableHandle(
         &fd2, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     0);
  OK(fd2 >= 0 && fd2 != fd); /* a new fd each time */
  close(fd2);

  /* pointer export */
  CUmemPoolPtrExportData x, x0;
  EQ(p_cuMemPoolExportPointer(&x0, b), CUDA_ERROR_INVALID_VALUE); /* pool0 */
  EQ(p_cuMemPoolExportPointer(&x0, d), CUDA_ERROR_INVALID_VALUE); /* legacy */
  EQ(p_cuMemPoolExportPointer(&x0, D(in)), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolExportPointer(NULL, a), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolExportPointer(&x, a), 0);

  /* what is not a pool's fd */
  int pp_[2], sv[2];
  OK(!pipe(pp_) && !socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  int plain = memfd_create("fake_gpu_poolfd:0000000000000001:0", 0);
  OK(plain >= 0 && !ftruncate(plain, 24));
  CUmemGenericAllocationHandle vmh;
  CUmemAllocationProp vp = vmm_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int vfd = -1;
  EQ(p_cuMemCreate(&vmh, vmm_gran(), &vp, 0), 0);
  EQ(p_cuMemExportToShareableHandle(
         &vfd, vmh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     0);
  int lfd = legacy_memfd(), afd = fd_named("/memfd:fake_gpu_pool:");
  OK(lfd >= 0 && afd >= 0);
  int bad[] = {pp_[0], pp_[1], sv[0], plain, vfd, lfd, afd, 999, -1};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    EQ(p_cuMemPoolImportFromShareableHandle(
           &h, V(bad[i]), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
       CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolImportFromShareableHandle(&h, V(fd), CU_MEM_HANDLE_TYPE_FABRIC,
                                          0),
     CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolImportFromShareableHandle(
         &h, V(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
     CUDA_ERROR_INVALID_VALUE);
  close(pp_[0]), close(pp_[1]), close(sv[0]), close(sv[1]), close(plain);
  close(vfd);
  EQ(p_cuMemRelease(vmh), 0);

  /* an import in the exporting process: a pool that cannot allocate, whose
   * pointers cannot come from this process */
  CUmemoryPool imp = NULL;
  EQ(p_cuMemPoolImportFromShareableHandle(
         &imp, V(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     0);
  close(fd);
  OK(imp && imp != pool);
  EQ(pool_get_access(imp), CU_MEM_ACCESS_FLAGS_PROT_NONE);
  EQ(p_cuMemAllocFromPoolAsync(&c, 64, imp, s), CUDA_ERROR_NOT_SUPPORTED);
  EQ(p_cuMemPoolExportToShareableHandle(
         &fd2, imp, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr ip = 0;
  EQ(p_cuMemPoolImportPointer(&ip, imp, &x), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolImportPointer(&ip, pool, &x), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolDestroy(imp), 0);
  log_key(got, sizeof got, getpid(), " cuMemPoolCreate ", " types=1 ",
          " pool=");
  snprintf(want, sizeof want, " pool=%s", got);
  EQ(log_count(NULL, " cuMemPoolImportFromShareableHandle ", want), 1);

  /* MEM_LIMIT and maxSize */
  knob("MEM_LIMIT", "20000"); /* 10000 + 4096 + 64 + 4096 live */
  EQ(p_cuMemAllocFromPoolAsync(&c, 4096, pool, s), CUDA_ERROR_OUT_OF_MEMORY);
  knob("MEM_LIMIT", NULL);
  CUmemoryPool small;
  pp0.maxSize = 8192;
  EQ(p_cuMemPoolCreate(&small, &pp0), 0);
  CUdeviceptr s1, s2;
  EQ(p_cuMemAllocFromPoolAsync(&s1, 6000, small, s), 0);
  EQ(p_cuMemAllocFromPoolAsync(&s2, 6000, small, s), CUDA_ERROR_OUT_OF_MEMORY);
  EQ(p_cuMemFreeAsync(s1, s), 0);
  EQ(p_cuMemAllocFromPoolAsync(&s2, 6000, small, s), 0);

  /* frees: cuMemFreeAsync and cuMemFree, base pointers of pool memory */
  EQ(p_cuMemFreeAsync(d, s), CUDA_ERROR_INVALID_VALUE); /* cuMemAlloc's */
  EQ(p_cuMemFreeAsync(a + 1, s), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemFreeAsync(a, (CUstream)&v_dummy), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemFreeAsync(a, s), 0);
  EQ(p_cuMemFreeAsync(a, s), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemGetAddressRange(&base, &size, a), CUDA_ERROR_NOT_FOUND);
  EQ(p_cuMemFree(s2), 0); /* "The pointer may be freed with cuMemFree" */
  EQ(p_cuMemFree(d), 0);
  EQ(log_count(NULL, " cuMemFree_v2 ", " imported_elsewhere=0 pool="), 1);
  EQ(log_count(NULL, " cuMemFreeAsync ", "CUDA_SUCCESS"), 2);

  /* destroyed with an allocation outstanding: the pointer stays */
  EQ(p_cuMemPoolDestroy(pool0), 0);
  EQ(log_count(NULL, " cuMemPoolDestroy ", " outstanding=1 "), 1);
  EQ(p_cuMemAllocFromPoolAsync(&c, 64, pool0, s), CUDA_ERROR_INVALID_VALUE);
  EQ(pool_get_access(pool0), -1);
  OK(mempool_of(b) == pool0);
  EQ(p_cuMemcpyDtoH(out, b, 8), 0);
  EQ(p_cuMemFreeAsync(b, NULL), 0);
  EQ(p_cuMemPoolDestroy(pool0), CUDA_ERROR_INVALID_VALUE);

  /* the default stream with no current context */
  EQ(p_cuCtxSetCurrent(NULL), 0);
  EQ(p_cuMemAllocFromPoolAsync(&c, 64, pool, NULL), CUDA_ERROR_INVALID_CONTEXT);
  EQ(p_cuMemAllocFromPoolAsync(&c, 64, pool, s), 0); /* needs none */
  EQ(p_cuMemFreeAsync(c, s), 0);
  EQ(p_cuMemPoolDestroy(small), 0);
  EQ(p_cuMemPoolDestroy(pool), 0);
  EQ(p_cuStreamDestroy(s), 0);
  EQ(log_malformed(), 0);
}

/* ---- across processes ---------------------------------------------------- */

static int pool_sock[2];
static unsigned char pool_pat[12288];
enum {
  NPTR = 3
}; /* p[0]: read then freed in order; p[1]: pending when
      imported, freed with cuMemFree; p[2]: freed by the
      exporter first (the violation) */

static void pool_exporter(void) {
  CUmemoryPool pool;
  CUmemPoolProps pp = pool_props(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUdeviceptr p[NPTR];
  CUmemPoolPtrExportData x[NPTR];
  CUstream s;
  int fd = -1;
  char c;
  close(pool_sock[1]);
  EQ(cu_init(), 0);
  EQ(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 0);
  EQ(p_cuMemPoolCreate(&pool, &pp), 0);
  EQ(p_cuMemAllocFromPoolAsync(&p[0], sizeof pool_pat, pool, s), 0);
  EQ(p_cuStreamSynchronize(s), 0);
  EQ(p_cuMemcpyHtoD(p[0], pool_pat, sizeof pool_pat), 0);
  knob("WORK_US", "300000"); /* p[1] completes 300 ms from now */
  EQ(p_cuMemAllocFromPoolAsync(&p[1], 4096, pool, s), 0);
  knob("WORK_US", NULL);
  EQ(p_cuMemAllocFromPoolAsync(&p[2], 4096, pool, s), 0);
  EQ(p_cuMemPoolExportToShareableHandle(
         &fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     0);
  for (int i = 0; i < NPTR; i++) EQ(p_cuMemPoolExportPointer(&x[i], p[i]), 0);
  send_fd(pool_sock[0], fd, 0);
  close(fd);
  put(pool_sock[0], x, sizeof x);
  OK(take(pool_sock[0], &c, 1) && c == 'R'); /* the importer freed p0, p1 */
  EQ(p_cuStreamSynchronize(s), 0);
  EQ(p_cuMemFreeAsync(p[0], s), 0); /* in order: imported_elsewhere=0 */
  EQ(p_cuMemFree(p[1]), 0);
  EQ(p_cuMemsetD8(p[2], 0x5a, 16), 0); /* seen by the importer */
  EQ(p_cuMemFreeAsync(p[2], s), 0);    /* still imported there */
  put(pool_sock[0], "F", 1);
  OK(take(pool_sock[0], &c, 1) && c == 'X');
  EQ(p_cuMemPoolDestroy(pool), 0);
  EQ(p_cuStreamDestroy(s), 0);
}

static void pool_importer(void) {
  CUmemoryPool pool = NULL, mine;
  CUmemPoolProps pp = pool_props(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUmemPoolPtrExportData x[NPTR], y;
  CUdeviceptr p[NPTR], q = 0, base = 0;
  CUstream s;
  uint64_t unused;
  unsigned char out[sizeof pool_pat];
  size_t size = 0;
  char c;
  close(pool_sock[0]);
  EQ(cu_init(), 0); /* forked before init, as every cross-process case */
  int fd = recv_fd(pool_sock[1], &unused);
  OK(fd >= 0);
  OK(take(pool_sock[1], x, sizeof x));
  EQ(p_cuMemPoolImportFromShareableHandle(
         &pool, V(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     0);
  close(fd);
  EQ(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 0);
  EQ(p_cuMemAllocFromPoolAsync(&q, 64, pool, s), CUDA_ERROR_NOT_SUPPORTED);
  EQ(p_cuMemPoolCreate(&mine, &pp), 0); /* not the import of x's pool */
  EQ(p_cuMemPoolImportPointer(&q, mine, &x[0]), CUDA_ERROR_INVALID_VALUE);
  y = x[0];
  y.reserved[32] ^= 1; /* another allocation nonce: not found */
  EQ(p_cuMemPoolImportPointer(&q, pool, &y), CUDA_ERROR_INVALID_VALUE);
  for (int i = 0; i < NPTR; i++)
    EQ(p_cuMemPoolImportPointer(&p[i], pool, &x[i]), 0);
  char pid[16];
  snprintf(pid, sizeof pid, "%d ", (int)getpid());
  /* the two failures, then p[0]; p[1] and p[2] (after it on the exporter's
   * stream) had not completed */
  EQ(log_count(pid, " cuMemPoolImportPointer ", " pending_us=0 "), 3);

  /* no access until cuMemPoolSetAccess */
  EQ(p_cuMemcpyDtoH(out, p[0], 16), CUDA_ERROR_INVALID_VALUE);
  EQ(pool_access(pool, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), 0);
  EQ(p_cuMemcpyDtoH(out, p[0], sizeof out), 0);
  OK(!memcmp(out, pool_pat, sizeof out));
  EQ(p_cuMemcpyDtoH(out, p[1], 16), 0); /* before it completed: logged */
  EQ(log_count(pid, " cuMemcpyDtoH_v2 ", " pending_us=0 "), 1);
  EQ(log_count(pid, " cuMemcpyDtoH_v2 ", " pending_us="), 2);

  /* what other calls answer for an imported pointer */
  OK(mempool_of(p[0] + 7) == pool);
  EQ(p_cuMemGetAddressRange(&base, &size, p[0] + 100), 0);
  OK(base == p[0] && size == sizeof pool_pat);
  int legacy = -1;
  EQ(p_cuPointerGetAttribute(
         &legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p[0]),
     0);
  EQ(legacy, 0);
  CUipcMemHandle ih;
  EQ(p_cuIpcGetMemHandle(&ih, p[0]), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemPoolExportPointer(&y, p[0]), CUDA_ERROR_INVALID_VALUE);
  /* imported twice: the same pointer, freed twice */
  EQ(p_cuMemPoolImportPointer(&q, pool, &x[0]), 0);
  OK(q == p[0]);
  EQ(p_cuMemFreeAsync(q, s), 0);

  /* freed here first, then in the exporter */
  EQ(p_cuMemFreeAsync(p[0], s), 0);
  EQ(p_cuMemFree(p[1]), 0);
  EQ(p_cuStreamSynchronize(s), 0);
  put(pool_sock[1], "R", 1);
  OK(take(pool_sock[1], &c, 1) && c == 'F'); /* the exporter freed all */
  EQ(p_cuMemPoolImportPointer(&q, pool, &x[0]),
     CUDA_ERROR_INVALID_VALUE);         /* freed there */
  EQ(p_cuMemcpyDtoH(out, p[2], 16), 0); /* the mapping keeps behaving */
  OK(out[0] == 0x5a && out[15] == 0x5a);
  EQ(p_cuMemFreeAsync(p[2], s), 0);
  EQ(p_cuMemPoolDestroy(pool), 0);
  EQ(p_cuMemPoolDestroy(mine), 0);
  EQ(p_cuStreamDestroy(s), 0);
  put(pool_sock[1], "X", 1);
}

static void s_pool_cross_process(void) {
  for (size_t i = 0; i < sizeof pool_pat; i++)
    pool_pat[i] = (unsigned char)(i * 31 + 7);
  clear_log();
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, pool_sock)) abort();
  pid_t exp = spawn(pool_exporter), imp = spawn(pool_importer);
  close(pool_sock[0]);
  close(pool_sock[1]);
  OK(reaped_ok(exp));
  OK(reaped_ok(imp));
  EQ(log_malformed(), 0);
  /* the same pool= and alloc= keys in both processes */
  char epid[16], ipid[16], pool[40], alloc[40], key[64];
  snprintf(epid, sizeof epid, "%d ", (int)exp);
  snprintf(ipid, sizeof ipid, "%d ", (int)imp);
  log_key(pool, sizeof pool, exp, " cuMemPoolCreate ", NULL, " pool=");
  OK(strlen(pool) == 16);
  snprintf(key, sizeof key, " pool=%s", pool);
  EQ(log_count(ipid, " cuMemPoolImportFromShareableHandle ", key), 1);
  EQ(log_count(ipid, " cuMemPoolImportPointer ", key), 7);
  log_key(alloc, sizeof alloc, exp, " cuMemAllocFromPoolAsync ", " size=12288 ",
          " alloc=");
  snprintf(key, sizeof key, " alloc=%s", alloc);
  OK(strlen(alloc) == 16);
  EQ(log_count(ipid, " cuMemPoolImportPointer ", key), 4);
  EQ(log_count(ipid, " cuMemFreeAsync ", key), 2);
  EQ(log_count(epid, " cuMemFreeAsync ", key), 1);
  /* in order: no violation; p[2]: one importer still held it */
  EQ(log_count(epid, " cuMemFreeAsync ", " imported_elsewhere=0 "), 1);
  EQ(log_count(epid, " cuMemFree_v2 ", " imported_elsewhere=0 "), 1);
  EQ(log_count(epid, " cuMemFreeAsync ", " imported_elsewhere=1 "), 1);
  EQ(log_count(NULL, NULL, " imported_elsewhere=1 "), 1);
}

/* An importer's cuMemFreeAsync completes in its stream's time: the
 * exporter's free before then is a violation, after then is not. */
static void pool_late_importer(void) {
  CUmemoryPool pool = NULL;
  CUmemPoolPtrExportData x[2];
  CUdeviceptr p[2];
  CUstream s;
  uint64_t unused;
  char c;
  close(pool_sock[0]);
  EQ(cu_init(), 0);
  int fd = recv_fd(pool_sock[1], &unused);
  OK(take(pool_sock[1], x, sizeof x));
  EQ(p_cuMemPoolImportFromShareableHandle(
         &pool, V(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     0);
  close(fd);
  EQ(p_cuMemPoolImportPointer(&p[0], pool, &x[0]), 0);
  EQ(p_cuMemPoolImportPointer(&p[1], pool, &x[1]), 0);
  EQ(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 0);
  knob("WORK_US", "10000000"); /* completes in 10 s */
  EQ(p_cuMemFreeAsync(p[0], s), 0);
  knob("WORK_US", NULL);
  EQ(p_cuMemFree(p[1]), 0);
  put(pool_sock[1], "R", 1);
  OK(take(pool_sock[1], &c, 1) && c == 'X');
}
static void pool_late_exporter(void) {
  CUmemoryPool pool;
  CUmemPoolProps pp = pool_props(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUmemPoolPtrExportData x[2];
  CUdeviceptr p[2];
  int fd = -1;
  char c;
  close(pool_sock[1]);
  EQ(cu_init(), 0);
  EQ(p_cuMemPoolCreate(&pool, &pp), 0);
  EQ(p_cuMemAllocFromPoolAsync(&p[0], 4096, pool, NULL), 0);
  EQ(p_cuMemAllocFromPoolAsync(&p[1], 4096, pool, NULL), 0);
  EQ(p_cuMemPoolExportToShareableHandle(
         &fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
     0);
  EQ(p_cuMemPoolExportPointer(&x[0], p[0]), 0);
  EQ(p_cuMemPoolExportPointer(&x[1], p[1]), 0);
  send_fd(pool_sock[0], fd, 0);
  close(fd);
  put(pool_sock[0], x, sizeof x);
  OK(take(pool_sock[0], &c, 1) && c == 'R');
  EQ(p_cuMemFreeAsync(p[0], NULL), 0); /* before the importer's completes */
  EQ(p_cuMemFreeAsync(p[1], NULL), 0);
  put(pool_sock[0], "X", 1);
  EQ(p_cuMemPoolDestroy(pool), 0);
}
static void s_pool_free_order(void) {
  clear_log();
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, pool_sock)) abort();
  pid_t exp = spawn(pool_late_exporter), imp = spawn(pool_late_importer);
  close(pool_sock[0]);
  close(pool_sock[1]);
  OK(reaped_ok(exp));
  OK(reaped_ok(imp));
  char epid[16];
  snprintf(epid, sizeof epid, "%d ", (int)exp);
  EQ(log_count(epid, " cuMemFreeAsync ", " imported_elsewhere=1 "), 1);
  EQ(log_count(epid, " cuMemFreeAsync ", " imported_elsewhere=0 "), 1);
  EQ(log_malformed(), 0);
}

static void s_pool_hostptr_none(void) {
  CUmemoryPool pool;
  CUmemPoolProps pp = pool_props(0);
  CUdeviceptr a;
  unsigned char in[64] = {4, 5, 6}, out[64];
  knob("HOSTPTR", "none");
  EQ(cu_init(), 0);
  EQ(p_cuMemPoolCreate(&pool, &pp), 0);
  EQ(p_cuMemAllocFromPoolAsync(&a, 4096, pool, NULL), 0);
  EQ(p_cuMemcpyHtoD(a, in, sizeof in), 0);
  EQ(p_cuMemcpyDtoH(out, a, sizeof out), 0);
  OK(!memcmp(in, out, sizeof in));
  hostptr_p = V(a);
  OK(!reaped_ok(spawn(vmm_read_host)));
  EQ(p_cuMemFreeAsync(a, NULL), 0);
  EQ(p_cuMemPoolDestroy(pool), 0);
}

static void s_pool_proc_address(void) {
  static const char *names[] = {"cuMemPoolCreate",
                                "cuMemPoolDestroy",
                                "cuMemAllocFromPoolAsync",
                                "cuMemFreeAsync",
                                "cuMemPoolSetAccess",
                                "cuMemPoolGetAccess",
                                "cuMemPoolExportToShareableHandle",
                                "cuMemPoolImportFromShareableHandle",
                                "cuMemPoolExportPointer",
                                "cuMemPoolImportPointer"};
  CUdriverProcAddressQueryResult st;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    void *fn = NULL;
    EQ(p_cuGetProcAddress_v2(names[i], &fn, 12000, 0, &st), 0);
    if (!fn || fn != dlsym(cu_lib, names[i]))
      check(0, __LINE__, names[i], 0, 1);
  }
  void *fn = NULL;
  EQ(p_cuGetProcAddress_v2("cuMemFreeAsync", &fn, 12000,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
     0);
  OK(fn && fn == dlsym(cu_lib, "cuMemFreeAsync_ptsz"));
  EQ(p_cuGetProcAddress_v2("cuMemAllocFromPoolAsync", &fn, 12000,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
     0);
  OK(fn && fn == dlsym(cu_lib, "cuMemAllocFromPoolAsync_ptsz"));
  EQ(p_cuGetProcAddress_v2("cuMemPoolCreate", &fn, 12000,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
     0);
  OK(fn == dlsym(cu_lib, "cuMemPoolCreate")); /* no _ptsz variant */
  EQ(p_cuGetProcAddress_v2("cuMemPoolCreate", &fn, 11000, 0, &st), 0);
  OK(fn == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

static void run_pool(void) {
  run(&cuda, "pool knobs/props/fork", s_pool_knobs);
  run(&cuda, "pool local", s_pool_local);
  run(&cuda, "pool cross-process", s_pool_cross_process);
  run(&cuda, "pool free order across processes", s_pool_free_order);
  run(&cuda, "pool hostptr none", s_pool_hostptr_none);
  run(&cuda, "pool cuGetProcAddress", s_pool_proc_address);
}
