/* selftest.c - checks that ipcref's fake GPU drivers do what fake_core.h says.
 *
 *   fake_gpu_selftest DIR      (DIR holds libcuda.so.1 and/or libamdhip64.so.5)
 *
 * Each library is dlopen'ed by path and resolved the way a backend would
 * (CUDA: cuGetProcAddress_v2 pinned to 12000; HIP: dlsym). The same scenarios
 * run against both through a small adapter (struct api); each scenario runs in
 * its own process, forked before the driver is initialised, and the
 * cross-process ones fork an exporter and an importer. Prints failures, then
 * "N passed, N failed"; exits non-zero on any failure.
 *
 * Each API's half needs its own headers and is compiled in by its macro
 * (tests/fake_gpu/build.sh sets those whose headers it finds):
 *   -DFAKE_GPU_CUDA  <cuda.h>, tests libcuda.so.1
 *   -DFAKE_GPU_HIP   <hip/hip_runtime_api.h> (with -D__HIP_PLATFORM_AMD__),
 *                    tests libamdhip64.so.5
 * The VMM and pool scenarios are in selftest_vmm.c, selftest_pool.c (CUDA),
 * selftest_hip_vmm.c and selftest_hip_pool.c (HIP), #included below.
 */
#if !defined(FAKE_GPU_CUDA) && !defined(FAKE_GPU_HIP)
#error "define FAKE_GPU_CUDA and/or FAKE_GPU_HIP (tests/fake_gpu/build.sh)"
#endif
#define _GNU_SOURCE
#ifdef FAKE_GPU_CUDA
#include <cuda.h>
#endif
#include <dlfcn.h>
#ifdef FAKE_GPU_HIP
#include <hip/hip_runtime_api.h>
#endif
#include <pthread.h>
#include <regex.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- checks, counted in shared memory so children count too -------------- */

static struct { int pass, fail; } * T;
static const char *scenario = "";
static const struct api *A; /* the library under test */

/* check(ok, __LINE__, ...): the file is added (selftest_vmm.c and
 * selftest_pool.c are included) */
#define check(ok, line, what, got, want)                                       \
  check_at(ok, __FILE__, line, what, got, want)
static void check_at(int ok, const char *file, int line, const char *what,
                     long long got, long long want) {
  const char *base = strrchr(file, '/');
  __atomic_add_fetch(ok ? &T->pass : &T->fail, 1, __ATOMIC_SEQ_CST);
  if (!ok)
    fprintf(stderr, "FAIL [%s] %s:%d: %s (got %lld, want %lld)\n", scenario,
            base ? base + 1 : file, line, what, got, want);
}

#define EQ(a, b)                                                               \
  do {                                                                         \
    long long a_ = (long long)(a), b_ = (long long)(b);                        \
    check(a_ == b_, __LINE__, #a " == " #b, a_, b_);                           \
  } while (0)
#define OK(cond) check(!!(cond), __LINE__, #cond, 0, 1)

static double ms_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) * 1e3 +
         (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}
static struct timespec now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t;
}

/* ---- the two libraries, resolved as a backend would ---------------------- */

/* p_cuMemAlloc has the type of cuMemAlloc_v2 (cuda.h's macro), "cuMemAlloc" is
 * its base name */
#define DECL(name) static __typeof__(&name) p_##name;

static void *open_lib(const char *dir, const char *name) {
  char path[4096];
  void *lib;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!(lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
    fprintf(stderr, "%s\n", dlerror()), exit(2);
  return lib;
}

#ifdef FAKE_GPU_CUDA
// clang-format off
#define CU_FUNCS(X)                                                            \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount)           \
  X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain)                          \
  X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent) X(cuCtxSetCurrent)           \
  X(cuMemAlloc) X(cuMemFree) X(cuMemGetAddressRange) X(cuMemcpyHtoD)           \
  X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemsetD8) X(cuPointerGetAttribute)       \
  X(cuPointerGetAttributes) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle)         \
  X(cuIpcCloseMemHandle) X(cuIpcGetEventHandle) X(cuIpcOpenEventHandle)        \
  X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize)      \
  X(cuEventDestroy) X(cuStreamCreate) X(cuStreamDestroy)                       \
  X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent)                 \
  X(cuGetErrorString) X(cuGetErrorName)
// clang-format on

CU_FUNCS(DECL)
static void *cu_lib;
static int (*cu_vmm)(void **, size_t);
static __typeof__(&cuGetProcAddress_v2) p_cuGetProcAddress_v2;

static void *cu_proc(const char *name) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult st;
  if (p_cuGetProcAddress_v2(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT,
                            &st) ||
      !fn)
    fprintf(stderr, "cannot resolve %s\n", name), exit(2);
  return fn;
}

static void load_cuda(const char *dir) {
  cu_lib = open_lib(dir, "libcuda.so.1");
  *(void **)&p_cuGetProcAddress_v2 = dlsym(cu_lib, "cuGetProcAddress_v2");
  if (!p_cuGetProcAddress_v2)
    fprintf(stderr, "no cuGetProcAddress_v2\n"), exit(2);
#define CU_LOAD(name) *(void **)&p_##name = cu_proc(#name);
  CU_FUNCS(CU_LOAD)
  *(void **)&cu_vmm = dlsym(cu_lib, "fake_gpu_alloc_vmm");
}
#endif /* FAKE_GPU_CUDA */

#ifdef FAKE_GPU_HIP
// clang-format off
#define HIP_FUNCS(X)                                                           \
  X(hipInit) X(hipDriverGetVersion) X(hipRuntimeGetVersion)                    \
  X(hipGetDeviceCount) X(hipSetDevice) X(hipGetDevice) X(hipDeviceSynchronize) \
  X(hipMalloc) X(hipFree) X(hipMemGetAddressRange) X(hipMemcpy) X(hipMemset)   \
  X(hipPointerGetAttribute) X(hipIpcGetMemHandle) X(hipIpcOpenMemHandle)       \
  X(hipIpcCloseMemHandle) X(hipIpcGetEventHandle) X(hipIpcOpenEventHandle)     \
  X(hipEventCreate) X(hipEventCreateWithFlags) X(hipEventRecord)               \
  X(hipEventQuery) X(hipEventSynchronize) X(hipEventDestroy)                   \
  X(hipStreamCreate) X(hipStreamCreateWithFlags) X(hipStreamDestroy)           \
  X(hipStreamSynchronize) X(hipStreamQuery) X(hipStreamWaitEvent)              \
  X(hipGetErrorString) X(hipGetErrorName)
// clang-format on

HIP_FUNCS(DECL)
static void *hip_lib;
static int (*hip_vmm)(void **, size_t);

static void load_hip(const char *dir) {
  hip_lib = open_lib(dir, "libamdhip64.so.5");
#define HIP_LOAD(name)                                                         \
  if (!(*(void **)&p_##name = dlsym(hip_lib, #name)))                          \
    fprintf(stderr, "no %s\n", #name), exit(2);
  HIP_FUNCS(HIP_LOAD)
  *(void **)&hip_vmm = dlsym(hip_lib, "fake_gpu_alloc_vmm");
}
#endif /* FAKE_GPU_HIP */

/* ---- one adapter per API, so the scenarios are written once -------------- */

struct api {
  const char *name, *prefix, *ok_name, *open_call, *get_call, *wait_call,
      *alloc_call;
  int (*init)(void);
  int (*alloc)(void **p, size_t n), (*vmm)(void **p, size_t n),
      (*free)(void *p);
  int (*range)(void *p, void **base, size_t *size);
  int (*h2d)(void *d, const void *s, size_t n),
      (*d2h)(void *d, const void *s, size_t n);
  int (*memset)(void *d, int v, size_t n);
  int (*attr)(void *data, int attr, void *p);
  int (*get)(void *h, void *p),
      (*open)(void **p, const void *h, unsigned flags), (*close)(void *p);
  int (*ev_create)(void **ev, unsigned flags), (*ev_record)(void *ev, void *s),
      (*ev_query)(void *ev);
  int (*ev_sync)(void *ev), (*ev_destroy)(void *ev);
  int (*ev_get)(void *h, void *ev), (*ev_open)(void **ev, const void *h);
  int (*s_create)(void **s), (*s_destroy)(void *s), (*s_sync)(void *s),
      (*s_query)(void *s);
  int (*s_wait)(void *s, void *ev);
  unsigned
      ipc_flag; /* the flag cuIpcOpenMemHandle / hipIpcOpenMemHandle must get */
  int memtype_device; /* MEMORY_TYPE of device memory */
  /* expected error numbers */
  int e_inval, e_oom, e_noinit, e_ctx, e_mapped, e_notready, e_range, e_stale,
      e_noexport, e_notopen, e_badfree;
};

#ifdef FAKE_GPU_CUDA
#define D(p) ((CUdeviceptr)(uintptr_t)(p))
#define V(d) ((void *)(uintptr_t)(d))
static int cu_init(void) {
  CUcontext c;
  int e = p_cuInit(0);
  if (!e) e = p_cuDevicePrimaryCtxRetain(&c, 0);
  if (!e) e = p_cuCtxSetCurrent(c);
  return e;
}
static int cu_alloc(void **p, size_t n) {
  CUdeviceptr d = 0;
  int e = p_cuMemAlloc(&d, n);
  *p = V(d);
  return e;
}
static int cu_free(void *p) {
  return p_cuMemFree(D(p));
}
static int cu_range(void *p, void **b, size_t *s) {
  CUdeviceptr d = 0;
  int e = p_cuMemGetAddressRange(&d, s, D(p));
  *b = V(d);
  return e;
}
static int cu_h2d(void *d, const void *s, size_t n) {
  return p_cuMemcpyHtoD(D(d), s, n);
}
static int cu_d2h(void *d, const void *s, size_t n) {
  return p_cuMemcpyDtoH(d, D(s), n);
}
static int cu_memset(void *d, int v, size_t n) {
  return p_cuMemsetD8(D(d), (unsigned char)v, n);
}
static int cu_attr(void *data, int a, void *p) {
  return p_cuPointerGetAttribute(data, (CUpointer_attribute)a, D(p));
}
static int cu_get(void *h, void *p) {
  return p_cuIpcGetMemHandle(h, D(p));
}
static int cu_open(void **p, const void *h, unsigned f) {
  CUipcMemHandle hh;
  CUdeviceptr d = 0;
  memcpy(&hh, h, sizeof hh);
  int e = p_cuIpcOpenMemHandle(&d, hh, f);
  *p = V(d);
  return e;
}
static int cu_close(void *p) {
  return p_cuIpcCloseMemHandle(D(p));
}
static int cu_ev_create(void **ev, unsigned f) {
  CUevent e_ = NULL;
  int e = p_cuEventCreate(&e_, f);
  *ev = e_;
  return e;
}
static int cu_ev_record(void *ev, void *s) {
  return p_cuEventRecord(ev, s);
}
static int cu_ev_query(void *ev) {
  return p_cuEventQuery(ev);
}
static int cu_ev_sync(void *ev) {
  return p_cuEventSynchronize(ev);
}
static int cu_ev_destroy(void *ev) {
  return p_cuEventDestroy(ev);
}
static int cu_ev_get(void *h, void *ev) {
  return p_cuIpcGetEventHandle(h, ev);
}
static int cu_ev_open(void **ev, const void *h) {
  CUipcEventHandle hh;
  CUevent e_ = NULL;
  memcpy(&hh, h, sizeof hh);
  int e = p_cuIpcOpenEventHandle(&e_, hh);
  *ev = e_;
  return e;
}
static int cu_s_create(void **s) {
  CUstream s_ = NULL;
  int e = p_cuStreamCreate(&s_, CU_STREAM_DEFAULT);
  *s = s_;
  return e;
}
static int cu_s_destroy(void *s) {
  return p_cuStreamDestroy(s);
}
static int cu_s_sync(void *s) {
  return p_cuStreamSynchronize(s);
}
static int cu_s_query(void *s) {
  return p_cuStreamQuery(s);
}
static int cu_s_wait(void *s, void *ev) {
  return p_cuStreamWaitEvent(s, ev, 0);
}
static int cu_vmm_(void **p, size_t n) {
  return cu_vmm(p, n);
}

static const struct api cuda = {
    "cuda",
    "FAKE_CUDA_",
    "CUDA_SUCCESS",
    "cuIpcOpenMemHandle_v2",
    "cuIpcGetMemHandle",
    "cuStreamWaitEvent",
    "cuMemAlloc_v2",
    cu_init,
    cu_alloc,
    cu_vmm_,
    cu_free,
    cu_range,
    cu_h2d,
    cu_d2h,
    cu_memset,
    cu_attr,
    cu_get,
    cu_open,
    cu_close,
    cu_ev_create,
    cu_ev_record,
    cu_ev_query,
    cu_ev_sync,
    cu_ev_destroy,
    cu_ev_get,
    cu_ev_open,
    cu_s_create,
    cu_s_destroy,
    cu_s_sync,
    cu_s_query,
    cu_s_wait,
    CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
    CU_MEMORYTYPE_DEVICE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_ALREADY_MAPPED,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_INVALID_VALUE,
};
#endif /* FAKE_GPU_CUDA */

#ifdef FAKE_GPU_HIP
static int hip_init(void) {
  return p_hipInit(0);
}
static int hip_alloc(void **p, size_t n) {
  return p_hipMalloc(p, n);
}
static int hip_free(void *p) {
  return p_hipFree(p);
}
static int hip_range(void *p, void **b, size_t *s) {
  return p_hipMemGetAddressRange(b, s, p);
}
static int hip_h2d(void *d, const void *s, size_t n) {
  return p_hipMemcpy(d, s, n, hipMemcpyHostToDevice);
}
static int hip_d2h(void *d, const void *s, size_t n) {
  return p_hipMemcpy(d, s, n, hipMemcpyDeviceToHost);
}
static int hip_memset(void *d, int v, size_t n) {
  return p_hipMemset(d, v, n);
}
static int hip_attr(void *data, int a, void *p) {
  return p_hipPointerGetAttribute(data, (hipPointer_attribute)a, p);
}
static int hip_get(void *h, void *p) {
  return p_hipIpcGetMemHandle(h, p);
}
static int hip_open(void **p, const void *h, unsigned f) {
  hipIpcMemHandle_t hh;
  memcpy(&hh, h, sizeof hh);
  return p_hipIpcOpenMemHandle(p, hh, f);
}
static int hip_close(void *p) {
  return p_hipIpcCloseMemHandle(p);
}
static int hip_ev_create(void **ev, unsigned f) {
  hipEvent_t e_ = NULL;
  int e = p_hipEventCreateWithFlags(&e_, f);
  *ev = e_;
  return e;
}
static int hip_ev_record(void *ev, void *s) {
  return p_hipEventRecord(ev, s);
}
static int hip_ev_query(void *ev) {
  return p_hipEventQuery(ev);
}
static int hip_ev_sync(void *ev) {
  return p_hipEventSynchronize(ev);
}
static int hip_ev_destroy(void *ev) {
  return p_hipEventDestroy(ev);
}
static int hip_ev_get(void *h, void *ev) {
  return p_hipIpcGetEventHandle(h, ev);
}
static int hip_ev_open(void **ev, const void *h) {
  hipIpcEventHandle_t hh;
  hipEvent_t e_ = NULL;
  memcpy(&hh, h, sizeof hh);
  int e = p_hipIpcOpenEventHandle(&e_, hh);
  *ev = e_;
  return e;
}
static int hip_s_create(void **s) {
  hipStream_t s_ = NULL;
  int e = p_hipStreamCreate(&s_);
  *s = s_;
  return e;
}
static int hip_s_destroy(void *s) {
  return p_hipStreamDestroy(s);
}
static int hip_s_sync(void *s) {
  return p_hipStreamSynchronize(s);
}
static int hip_s_query(void *s) {
  return p_hipStreamQuery(s);
}
static int hip_s_wait(void *s, void *ev) {
  return p_hipStreamWaitEvent(s, ev, 0);
}
static int hip_vmm_(void **p, size_t n) {
  return hip_vmm(p, n);
}

static const struct api hip = {
    "hip",
    "FAKE_HIP_",
    "hipSuccess",
    "hipIpcOpenMemHandle",
    "hipIpcGetMemHandle",
    "hipStreamWaitEvent",
    "hipMalloc",
    hip_init,
    hip_alloc,
    hip_vmm_,
    hip_free,
    hip_range,
    hip_h2d,
    hip_d2h,
    hip_memset,
    hip_attr,
    hip_get,
    hip_open,
    hip_close,
    hip_ev_create,
    hip_ev_record,
    hip_ev_query,
    hip_ev_sync,
    hip_ev_destroy,
    hip_ev_get,
    hip_ev_open,
    hip_s_create,
    hip_s_destroy,
    hip_s_sync,
    hip_s_query,
    hip_s_wait,
    hipIpcMemLazyEnablePeerAccess,
    hipMemoryTypeDevice,
    hipErrorInvalidValue,
    hipErrorOutOfMemory,
    hipErrorNotInitialized,
    hipErrorInvalidContext,
    hipErrorAlreadyMapped,
    hipErrorNotReady,
    hipErrorInvalidDevicePointer,
    hipErrorInvalidHandle,
    hipErrorInvalidHandle,
    hipErrorInvalidHandle,
    hipErrorInvalidDevicePointer,
};
#endif /* FAKE_GPU_HIP */

/* ---- processes, pipes, knobs, log ---------------------------------------- */

static char logpath[256];

static void knob(const char *name, const char *value) {
  char key[64];
  snprintf(key, sizeof key, "%s%s", A->prefix, name);
  if (value)
    setenv(key, value, 1);
  else
    unsetenv(key);
}

/* Run fn in a fresh child (this process never initialises a driver). */
static void run(const struct api *api, const char *name, void (*fn)(void)) {
  static const char *knobs[] = {
      "MODE",     "DEVICES",     "MEM_LIMIT",      "REOPEN",     "WORK_US",
      "HOSTPTR",  "LOG",         "DRIVER_VERSION", "IPC_EVENTS", "VMM",
      "POSIX_FD", "GRANULARITY", "POOLS"};
  static char full[64]; /* "cuda memory": the API's name, then the scenario's */
  A = api;
  snprintf(full, sizeof full, "%s %s", api->name, name);
  scenario = full;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    for (size_t i = 0; i < sizeof knobs / sizeof *knobs; i++)
      knob(knobs[i], NULL);
    knob("LOG", logpath);
    fn();
    exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  check(WIFEXITED(st) && WEXITSTATUS(st) == 0, __LINE__,
        "scenario process exits 0", st, 0);
}

static pid_t spawn(void (*fn)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    fn();
    exit(0);
  }
  return pid;
}
static int reaped_ok(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int to_imp[2], to_exp[2]; /* pipes of the cross-process scenarios */
static void put(int fd, const void *b, size_t n) {
  if (write(fd, b, n) != (ssize_t)n) abort();
}
static int take(int fd, void *b, size_t n) {
  return read(fd, b, n) == (ssize_t)n;
}
static void pipes(void) {
  if (pipe(to_imp) || pipe(to_exp)) abort();
}
static void close_pipes(void) {
  close(to_imp[0]);
  close(to_imp[1]);
  close(to_exp[0]);
  close(to_exp[1]);
}

/* A VMM allocation's fd and its size over a socketpair (SCM_RIGHTS), as
 * the VMM cross-process scenarios of both APIs send it. */
static void send_fd(int sock, int fd, uint64_t size) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {&size, sizeof size};
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = cbuf,
                      .msg_controllen = sizeof cbuf};
  memset(cbuf, 0, sizeof cbuf);
  struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  if (sendmsg(sock, &mh, 0) != (ssize_t)sizeof size) abort();
}
static int recv_fd(int sock, uint64_t *size) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {size, sizeof *size};
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = cbuf,
                      .msg_controllen = sizeof cbuf};
  int fd = -1;
  if (recvmsg(sock, &mh, 0) != (ssize_t)sizeof *size) return -1;
  struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
  if (c && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

/* The log id of a handle: "<pid>:<nonce as 16 hex>" (layout in fake_core.h). */
static void handle_id(char *buf, size_t n, const unsigned char *h) {
  int32_t pid;
  uint64_t nonce;
  memcpy(&pid, h + 8, 4);
  memcpy(&nonce, h + 24, 8);
  snprintf(buf, n, "%d:%016llx", (int)pid, (unsigned long long)nonce);
}

static void clear_log(void) {
  FILE *f = fopen(logpath, "w");
  if (f) fclose(f);
}

/* Lines of the log that start with prefix (if any) and contain a and b (if
 * any). */
static int log_count(const char *prefix, const char *a, const char *b) {
  FILE *f = fopen(logpath, "r");
  char line[1024];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    if ((!prefix || !strncmp(line, prefix, strlen(prefix))) &&
        (!a || strstr(line, a)) && (!b || strstr(line, b)))
      n++;
  if (f) fclose(f);
  return n;
}
/* Every line is "<pid> <call> <key>=<value>... -> <result>". */
static int log_malformed(void) {
  regex_t re;
  regcomp(
      &re,
      "^[0-9]+ [A-Za-z_][A-Za-z0-9_]*( [A-Za-z_]+=[^ ]*)* -> [A-Za-z_?]+\n$",
      REG_EXTENDED | REG_NOSUB);
  FILE *f = fopen(logpath, "r");
  char line[1024];
  int bad = 0;
  while (f && fgets(line, sizeof line, f))
    if (regexec(&re, line, 0, NULL, 0))
      bad++, fprintf(stderr, "malformed log line: %s", line);
  if (f) fclose(f);
  regfree(&re);
  return bad;
}

/* Pool scenarios of both APIs: the first fd of this process whose link starts
 * with prefix. */
static int fd_named(const char *prefix) {
  char path[64], link[160];
  for (int fd = 3; fd < 1024; fd++) {
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n > 0 && (link[n] = 0, !strncmp(link, prefix, strlen(prefix))))
      return fd;
  }
  return -1;
}
/* The value of key (e.g. " pool=") on the last log line of pid holding call
 * and with; "" if none. */
static void log_key(char *out, size_t n, pid_t pid, const char *call,
                    const char *with, const char *key) {
  char pfx[16], line[1024];
  snprintf(pfx, sizeof pfx, "%d ", (int)pid);
  out[0] = 0;
  FILE *f = fopen(logpath, "r");
  while (f && fgets(line, sizeof line, f)) {
    char *k = strstr(line, key);
    if (!strncmp(line, pfx, strlen(pfx)) && strstr(line, call) &&
        (!with || strstr(line, with)) && k) {
      snprintf(out, n, "%s", k + strlen(key));
      out[strcspn(out, " \n")] = 0;
    }
  }
  if (f) fclose(f);
}

/* ---- scenarios common to both APIs --------------------------------------- */

static void s_memory(void) {
  unsigned char in[4096], out[4096];
  void *p, *q, *base;
  size_t size = 0;
  unsigned long long id1 = 0, id2 = 0;
  int ord = -1, legacy = -1;
  unsigned memtype = 0;
  for (int i = 0; i < 4096; i++) in[i] = (unsigned char)(i * 7);

  EQ(A->init(), 0);
  EQ(A->alloc(&p, 4096), 0);
  EQ(A->range((char *)p + 100, &base, &size),
     0); /* interior pointer -> its allocation */
  OK(base == p && size == 4096);
  EQ(A->range(in, &base, &size), A->e_range); /* not device memory */
  EQ(A->h2d(p, in, sizeof in), 0);
  EQ(A->d2h(out, p, sizeof out), 0);
  OK(!memcmp(in, out, sizeof in));
  EQ(A->memset((char *)p + 10, 0xab, 5), 0);
  EQ(A->d2h(out, (char *)p + 8, 8), 0);
  OK(out[1] == in[9] && out[2] == 0xab && out[6] == 0xab && out[7] == in[15]);
  EQ(A->h2d((char *)p + 4000, in, 200),
     A->e_inval);                      /* runs past the allocation */
  EQ(A->d2h(out, in, 16), A->e_inval); /* source is not device memory */

  EQ(A->attr(&id1, 7 /* BUFFER_ID */, p), 0);
  EQ(A->attr(&ord, 9 /* DEVICE_ORDINAL */, (char *)p + 1), 0);
  EQ(ord, 0);
  EQ(A->attr(&legacy, 10 /* IS_LEGACY_..._IPC_CAPABLE */, p), 0);
  EQ(legacy, 1);
  EQ(A->attr(&memtype, 2 /* MEMORY_TYPE */, p), 0);
  EQ(memtype, A->memtype_device);
  EQ(A->attr(&base, 11 /* RANGE_START_ADDR */, (char *)p + 5), 0);
  OK(base == p);
  EQ(A->attr(&id2, 7, in), A->e_inval); /* host memory */

  EQ(A->free((char *)p + 1), A->e_badfree);
  EQ(A->free(p), 0);
  EQ(A->free(p), A->e_badfree);
  EQ(A->free(NULL), 0);
  EQ(A->range(p, &base, &size), A->e_range);
  EQ(A->alloc(&q, 4096), 0); /* may reuse the address, never the id */
  EQ(A->attr(&id2, 7, q), 0);
  OK(id2 != id1);
  EQ(A->free(q), 0);

  /* memory legacy IPC cannot export (VMM, pools) */
  EQ(A->vmm(&q, 8192), 0);
  EQ(A->attr(&legacy, 10, q), 0);
  EQ(legacy, 0);
  unsigned char h[64];
  EQ(A->get(h, q), A->e_noexport);
  EQ(A->free(q), 0);

  /* out of memory */
  knob("MEM_LIMIT", "8192");
  EQ(A->alloc(&p, 4096), 0);
  EQ(A->alloc(&q, 8192), A->e_oom);
  EQ(A->free(p), 0);
  EQ(A->alloc(&q, 8192), 0);
  EQ(A->free(q), 0);
  knob("MEM_LIMIT", NULL);
}

static void s_ipc_local(void) {
  unsigned char h[64], h2[64];
  void *p, *q = NULL;
  EQ(A->init(), 0);
  EQ(A->alloc(&p, 1 << 16), 0);
  EQ(A->get(h, (char *)p + 64), A->e_noexport); /* "a pointer to the base" */
  EQ(A->get(h, p), 0);
  EQ(A->get(h2, p), 0);
  OK(!memcmp(h, h2, 64)); /* same allocation, same handle */
  char id[64], key[128];
  int32_t pid;
  memcpy(&pid, h + 8, 4);
  EQ(pid, getpid());
  handle_id(id, sizeof id, h);
  snprintf(key, sizeof key, " h=%s -> ", id);
  EQ(log_count(NULL, A->get_call, key), 2);
  EQ(A->open(&q, h, A->ipc_flag), A->e_ctx); /* in the exporting process */
  EQ(A->open(&q, h, A->ipc_flag ^ 1), A->e_inval); /* wrong flags */
  EQ(A->close(p), A->e_notopen);
  EQ(A->free(p), 0);
  EQ(A->alloc(&p, 1 << 16), 0);
  EQ(A->get(h2, p), 0);
  OK(memcmp(h, h2,
            64)); /* a new allocation: a new handle, even at the same address */
  EQ(A->free(p), 0);
}

static void s_events_local(void) {
  void *s, *ev, *ev2;
  unsigned char h[64];
  struct timespec t0;
  EQ(A->init(), 0);
  EQ(A->s_create(&s), 0);
  EQ(A->ev_create(&ev, 0), 0);
  EQ(A->ev_query(ev), 0); /* never recorded: complete */
  knob("WORK_US", "100000");
  t0 = now();
  EQ(A->ev_record(ev, s), 0);
  EQ(A->ev_query(ev), A->e_notready);
  EQ(A->s_query(s), A->e_notready);
  EQ(A->s_query(NULL),
     A->e_notready); /* the legacy stream waits for blocking streams */
  EQ(A->ev_sync(ev), 0);
  OK(ms_since(&t0) >= 90);
  EQ(A->ev_query(ev), 0);
  EQ(A->s_query(s), 0);
  EQ(A->ev_record(ev, NULL), 0); /* on the default stream */
  EQ(A->s_sync(NULL), 0);
  EQ(A->ev_query(ev), 0);
  knob("WORK_US", NULL);
  EQ(A->ev_get(h, ev), A->e_inval); /* not an interprocess event */
  EQ(A->ev_create(&ev2, 0x4),
     A->e_inval);          /* INTERPROCESS without DISABLE_TIMING */
  knob("IPC_EVENTS", "1"); /* (HIP only: allow them) */
  EQ(A->ev_create(&ev2, 0x6), 0);
  EQ(A->ev_get(h, ev2), 0);
  void *ev3 = NULL;
  EQ(A->ev_open(&ev3, h), A->e_ctx); /* in the exporting process */
  EQ(A->ev_destroy(ev2), 0);
  EQ(A->ev_destroy(ev), 0);
  EQ(A->ev_destroy(ev), A->e_stale); /* invalid handle */
  EQ(A->s_destroy(s), 0);
}

/* Cross-process: an exporter and an importer, both forked before init. */
static unsigned char pattern[1 << 20];
static void exporter(void) {
  void *p1, *p2, *ev, *s;
  unsigned char h[3][64], buf[64], c;
  close(to_imp[0]);
  close(to_exp[1]);
  EQ(A->init(), 0);
  EQ(A->alloc(&p1, sizeof pattern), 0);
  EQ(A->alloc(&p2, 1 << 16), 0);
  EQ(A->h2d(p1, pattern, sizeof pattern), 0);
  EQ(A->get(h[0], p1), 0);
  EQ(A->get(h[1], p2), 0);
  knob("IPC_EVENTS", "1");
  EQ(A->ev_create(&ev, 0x6), 0);
  EQ(A->s_create(&s), 0);
  knob("WORK_US", "500000");
  EQ(A->ev_record(ev, s), 0); /* the "writes" finish 0.5 s from now */
  EQ(A->ev_get(h[2], ev), 0);
  put(to_imp[1], h, sizeof h);
  OK(take(to_exp[0], &c, 1) && c == 'F');
  EQ(A->free(p1), 0);
  put(to_imp[1], "f", 1);
  OK(take(to_exp[0], &c, 1) && c == 'X');
  EQ(A->d2h(buf, p2, sizeof buf),
     0); /* the importer's writes are visible here */
  OK(buf[0] == 0x5a && buf[63] == 0x5a);
  /* exits holding p2: its handle must stop working */
}

static void importer(void) {
  unsigned char h[3][64], out[4096], c;
  void *q1, *q2, *base, *ev, *s;
  size_t size = 0;
  int ord = -1, legacy = -1;
  close(to_imp[1]);
  close(to_exp[0]);
  EQ(A->init(), 0);
  OK(take(to_imp[0], h, sizeof h));

  EQ(A->open(&q1, h[0], A->ipc_flag), 0);
  EQ(A->open(&q2, h[0], A->ipc_flag),
     0); /* CUDA 13: same pointer, reference counted */
  OK(q1 == q2);
  EQ(A->d2h(out, (char *)q1 + 8192, sizeof out), 0);
  OK(!memcmp(out, pattern + 8192, sizeof out));
  EQ(A->range((char *)q1 + 8192, &base, &size), 0);
  OK(base == q1 && size == sizeof pattern);
  EQ(A->attr(&ord, 9, q1), 0);
  EQ(ord, 0);
  EQ(A->attr(&legacy, 10, q1), 0);
  EQ(legacy, 0);
  EQ(A->get(out, q1), A->e_noexport); /* an import is not re-exported */
  EQ(A->close((char *)q1 + 1), A->e_notopen);
  EQ(A->close(q1), 0);
  EQ(A->d2h(out, q1, 16), 0); /* still open once */
  EQ(A->close(q1), 0);
  EQ(A->close(q1), A->e_notopen);
  EQ(A->range(q1, &base, &size), A->e_range); /* unmapped */

  knob("REOPEN", "208"); /* older drivers */
  EQ(A->open(&q1, h[0], A->ipc_flag), 0);
  EQ(A->open(&q2, h[0], A->ipc_flag), A->e_mapped);
  EQ(A->close(q1), 0);
  knob("REOPEN", "new"); /* HIP >= 6: maybe another address */
  EQ(A->open(&q1, h[0], A->ipc_flag), 0);
  EQ(A->open(&q2, h[0], A->ipc_flag), 0);
  OK(q1 != q2);
  EQ(A->close(q1), 0);
  EQ(A->close(q2), 0);
  knob("REOPEN", NULL);

  /* the exporter's event: our stream waits for its work */
  EQ(A->ev_open(&ev, h[2]), 0);
  EQ(A->s_create(&s), 0);
  EQ(A->s_wait(s, ev), 0);
  EQ(A->s_query(s), A->e_notready);
  EQ(A->ev_query(ev), A->e_notready);
  EQ(A->s_sync(s), 0);
  EQ(A->ev_query(ev), 0);
  EQ(A->ev_destroy(ev), 0);
  EQ(A->s_destroy(s), 0);

  EQ(A->open(&q2, h[1], A->ipc_flag), 0);
  EQ(A->memset(q2, 0x5a, 64), 0);
  EQ(A->close(q2), 0);
  put(to_exp[1], "F", 1);
  OK(take(to_imp[0], &c, 1) && c == 'f');
  EQ(A->open(&q1, h[0], A->ipc_flag), A->e_stale); /* freed by the exporter */
  put(to_exp[1], "X", 1);
  OK(!take(to_imp[0], &c, 1)); /* EOF: the exporter has exited */
  EQ(A->open(&q2, h[1], A->ipc_flag), A->e_stale); /* exporter gone */
}

static void s_cross_process(void) {
  for (size_t i = 0; i < sizeof pattern; i++)
    pattern[i] = (unsigned char)(i * 31 + (i >> 12));
  clear_log();
  pipes();
  pid_t exp = spawn(exporter), imp = spawn(importer);
  close_pipes();
  OK(reaped_ok(exp));
  OK(reaped_ok(imp));

  /* the log: well-formed lines from both, handle ids that match across
   * processes */
  char pid[16], hid[64], key[96];
  EQ(log_malformed(), 0);
  snprintf(pid, sizeof pid, "%d ", (int)imp);
  EQ(log_count(pid, A->open_call, A->ok_name), 6);
  snprintf(pid, sizeof pid, "%d ", (int)exp);
  EQ(log_count(pid, A->get_call, A->ok_name), 2);
  FILE *f = fopen(logpath, "r");
  char line[1024];
  hid[0] = 0;
  while (f && fgets(line, sizeof line, f)) { /* the exporter's first handle */
    char *h = strstr(line, " h=");
    if (!strncmp(line, pid, strlen(pid)) && strstr(line, A->get_call) && h) {
      sscanf(h + 3, "%63s", hid);
      break;
    }
  }
  if (f) fclose(f);
  snprintf(key, sizeof key, "%s h=%s ", A->open_call, hid);
  OK(hid[0] && log_count(NULL, key, A->ok_name) ==
                   5); /* 2 refcounted + 1 (REOPEN=208) + 2 (REOPEN=new) */
  snprintf(pid, sizeof pid, "%d ", (int)imp);
  EQ(log_count(pid, A->wait_call, " pending_us=0 "),
     0); /* the wait began before the work was done */
  EQ(log_count(pid, A->wait_call, A->ok_name), 1);
}

/* After init, device pointers can be made unreadable by the host. */
static void segv_exit(int sig) {
  (void)sig;
  _exit(42);
}
static void *hostptr_p;
static void read_device_pointer(void) {
  signal(SIGSEGV, segv_exit);
  signal(SIGBUS, segv_exit);
  printf("%d", *(volatile char *)hostptr_p); /* must fault */
}
static void s_hostptr_none(void) {
  unsigned char in[64] = {1, 2, 3}, out[64];
  knob("HOSTPTR", "none");
  EQ(A->init(), 0);
  EQ(A->alloc(&hostptr_p, 4096), 0);
  EQ(A->h2d(hostptr_p, in, sizeof in), 0);
  EQ(A->d2h(out, hostptr_p, sizeof out), 0);
  OK(!memcmp(in, out, sizeof in));
  OK(!reaped_ok(spawn(read_device_pointer)));
  EQ(A->free(hostptr_p), 0);
}

/* A process forked after its parent initialised the driver cannot use it. */
static void forked_child(void) {
  void *p;
  EQ(A->alloc(&p, 64), A->e_noinit);
}
static void s_fork_after_init(void) {
  EQ(A->init(), 0);
  OK(reaped_ok(spawn(forked_child)));
}

#ifdef FAKE_GPU_CUDA
/* ---- CUDA only ----------------------------------------------------------- */

static void *no_ctx_thread(void *arg) {
  CUcontext c = (CUcontext)1;
  CUdeviceptr d;
  (void)arg;
  EQ(p_cuCtxGetCurrent(&c), 0);
  OK(c == NULL); /* the current context is per thread */
  EQ(p_cuMemAlloc(&d, 64), CUDA_ERROR_INVALID_CONTEXT);
  return NULL;
}

static void s_cuda_init_ctx(void) {
  CUdeviceptr d;
  CUcontext c = NULL, c2;
  CUdevice dev;
  int v = 0;
  size_t size;
  EQ(p_cuDriverGetVersion(&v), 0); /* before cuInit */
  EQ(v, 13000);
  EQ(p_cuMemAlloc(&d, 64), CUDA_ERROR_NOT_INITIALIZED);
  EQ(p_cuInit(1), CUDA_ERROR_INVALID_VALUE);
  knob("DEVICES", "2");
  EQ(p_cuInit(0), 0);
  EQ(p_cuDeviceGetCount(&v), 0);
  EQ(v, 2);
  EQ(p_cuDeviceGet(&dev, 1), 0);
  EQ(p_cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
  EQ(p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0), 0);
  EQ(v, 1);
  EQ(p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 0), 0);
  EQ(v, 1);
  EQ(p_cuDeviceGetAttribute(
         &v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
     0);
  EQ(v, 1); /* selftest_vmm.c */
  EQ(p_cuCtxGetCurrent(&c), 0);
  OK(c == NULL);
  EQ(p_cuMemAlloc(&d, 64), CUDA_ERROR_INVALID_CONTEXT); /* no current context */
  EQ(p_cuDevicePrimaryCtxRetain(&c, 1), 0);
  EQ(p_cuMemAlloc(&d, 64),
     CUDA_ERROR_INVALID_CONTEXT); /* retained is not current */
  EQ(p_cuCtxSetCurrent(c), 0);
  EQ(p_cuCtxGetCurrent(&c2), 0);
  OK(c2 == c);
  EQ(p_cuMemAlloc(&d, 0), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuMemAlloc(&d, 64), 0);
  int ord = -1;
  CUcontext owner = NULL;
  EQ(p_cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d), 0);
  EQ(ord, 1);
  EQ(p_cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d), 0);
  OK(owner == c);
  CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  unsigned long long id = 99;
  void *data[2] = {&id, &ord};
  EQ(p_cuPointerGetAttributes(2, attrs, data, (CUdeviceptr)(uintptr_t)&v),
     0); /* no error for host memory */
  OK(id == 0 && ord == 0);
  EQ(p_cuMemGetAddressRange(NULL, &size, d + 3),
     0); /* either output may be NULL */
  EQ(size, 64);
  CUdeviceptr d2;
  char buf[8] = "abcdefg", got[8] = {0};
  EQ(p_cuMemAlloc(&d2, 64), 0);
  EQ(p_cuMemcpyHtoD(d + 8, buf, 8), 0);
  EQ(p_cuMemcpyDtoD(d2, d + 8, 8), 0);
  EQ(p_cuMemcpyDtoD(d2 + 60, d, 8),
     CUDA_ERROR_INVALID_VALUE); /* past the end */
  EQ(p_cuMemcpyDtoH(got, d2, 8), 0);
  OK(!memcmp(got, buf, 8));
  EQ(p_cuMemFree(d2), 0);
  /* the legacy stream does not wait for a NON_BLOCKING stream's work */
  CUstream nb, bl;
  CUevent ev;
  EQ(p_cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), 0);
  EQ(p_cuStreamCreate(&bl, 4), CUDA_ERROR_INVALID_VALUE);
  EQ(p_cuStreamCreate(&bl, CU_STREAM_DEFAULT), 0);
  EQ(p_cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), 0);
  knob("WORK_US", "200000");
  EQ(p_cuEventRecord(ev, nb), 0);
  EQ(p_cuStreamQuery(nb), CUDA_ERROR_NOT_READY);
  EQ(p_cuStreamQuery(NULL), 0);
  EQ(p_cuStreamQuery(bl), 0);
  EQ(p_cuStreamWaitEvent(bl, ev, 0),
     0); /* now the blocking stream (and so the legacy one) waits */
  EQ(p_cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
  EQ(p_cuMemcpyDtoH(got, d, 8),
     0); /* a synchronous copy runs after the legacy stream */
  EQ(p_cuEventQuery(ev), 0);
  knob("WORK_US", NULL);
  EQ(p_cuStreamDestroy(nb), 0);
  EQ(p_cuStreamDestroy(bl), 0);
  EQ(p_cuStreamDestroy(bl), CUDA_ERROR_INVALID_HANDLE);
  EQ(p_cuEventDestroy(ev), 0);
  pthread_t t;
  pthread_create(&t, NULL, no_ctx_thread, NULL);
  pthread_join(t, NULL);
  /* the last release resets the primary context: its memory goes */
  EQ(p_cuDevicePrimaryCtxRelease(1), 0);
  EQ(p_cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT);
  EQ(p_cuMemAlloc(&d, 64), CUDA_ERROR_INVALID_CONTEXT);
  EQ(p_cuDevicePrimaryCtxRetain(&c2, 1), 0);
  OK(c2 == c);
  EQ(p_cuCtxSetCurrent(c2), 0);
  EQ(p_cuMemGetAddressRange(NULL, &size, d), CUDA_ERROR_NOT_FOUND);
  EQ(p_cuCtxSetCurrent(NULL), 0);
  EQ(p_cuCtxSetCurrent((CUcontext)&v), CUDA_ERROR_INVALID_CONTEXT);
}

static void s_cuda_proc_address(void) {
  void *fn = (void *)1;
  CUdriverProcAddressQueryResult st = 99;
  EQ(p_cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &st), 0);
  OK(fn == dlsym(cu_lib, "cuMemAlloc_v2") && st == CU_GET_PROC_ADDRESS_SUCCESS);
  EQ(p_cuGetProcAddress_v2("cuMemAlloc", &fn, 3000, 0, &st),
     0); /* before 3.2: the old ABI */
  OK(fn == dlsym(cu_lib, "cuMemAlloc"));
  EQ(p_cuGetProcAddress_v2("cuIpcOpenMemHandle", &fn, 12000, 0, &st), 0);
  OK(fn == dlsym(cu_lib, "cuIpcOpenMemHandle_v2"));
  EQ(p_cuGetProcAddress_v2("cuIpcOpenMemHandle", &fn, 4000, 0, &st), 0);
  OK(fn == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EQ(p_cuGetProcAddress_v2("cuNoSuchCall", &fn, 12000, 0, &st), 0);
  OK(fn == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EQ(p_cuGetProcAddress_v2("cuMemAlloc", &fn, 13010, 0, &st),
     CUDA_ERROR_INVALID_VALUE); /* newer than the driver */
  EQ(p_cuGetProcAddress_v2("cuGetProcAddress", &fn, 12000, 0, &st), 0);
  OK(fn == dlsym(cu_lib, "cuGetProcAddress_v2"));
  knob("DRIVER_VERSION", "11080");
  EQ(p_cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &st),
     CUDA_ERROR_INVALID_VALUE);
  knob("DRIVER_VERSION", NULL);
  CUresult (*gpa4)(const char *, void **, int, cuuint64_t);
  *(void **)&gpa4 =
      dlsym(cu_lib, "cuGetProcAddress"); /* the 4-argument CUDA 11.3 one */
  EQ(gpa4("cuEventDestroy", &fn, 12000, 0), 0);
  OK(fn == dlsym(cu_lib, "cuEventDestroy_v2"));
  /* every versioned and plain name is exported */
  static const char *names[] = {"cuMemAlloc_v2",
                                "cuMemFree_v2",
                                "cuMemGetAddressRange_v2",
                                "cuIpcOpenMemHandle_v2",
                                "cuEventDestroy_v2",
                                "cuDevicePrimaryCtxRelease_v2",
                                "cuMemcpyHtoD_v2",
                                "cuMemcpyDtoH_v2",
                                "cuMemcpyDtoD_v2",
                                "cuMemsetD8_v2",
                                "cuStreamDestroy_v2",
                                "cuGetProcAddress_v2",
                                "cuMemAlloc",
                                "cuMemFree",
                                "cuIpcOpenMemHandle",
                                "cuEventDestroy",
                                "cuDevicePrimaryCtxRelease",
                                "cuStreamDestroy",
                                "cuGetProcAddress",
                                "cuInit",
                                "cuIpcGetMemHandle",
                                "cuIpcCloseMemHandle",
                                "cuPointerGetAttribute",
                                "fake_gpu_alloc_vmm"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (!dlsym(cu_lib, names[i])) check(0, __LINE__, names[i], 0, 1);
  /* the plain cuMemAlloc keeps the 32-bit ABI: refused */
  CUresult (*old)(unsigned *, unsigned);
  unsigned d32;
  *(void **)&old = dlsym(cu_lib, "cuMemAlloc");
  EQ(old(&d32, 64), CUDA_ERROR_NOT_SUPPORTED);
  EQ(log_count(NULL, " cuMemAlloc abi=v1 ", NULL), 1);
  const char *s = NULL;
  EQ(p_cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s), 0);
  OK(s && !strcmp(s, "invalid argument"));
  EQ(p_cuGetErrorName(CUDA_ERROR_INVALID_CONTEXT, &s), 0);
  OK(s && !strcmp(s, "CUDA_ERROR_INVALID_CONTEXT"));
  EQ(p_cuGetErrorString((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
  OK(s == NULL);
}

static void s_cuda_stub(void) {
  const char *s = "untouched";
  void *fn = (void *)1;
  int v = -1;
  knob("MODE", "stub"); /* as /usr/local/cuda/lib64/stubs/libcuda.so */
  EQ(p_cuInit(0), CUDA_ERROR_STUB_LIBRARY);
  EQ(p_cuDriverGetVersion(&v), CUDA_ERROR_STUB_LIBRARY);
  EQ(p_cuGetErrorString(CUDA_ERROR_STUB_LIBRARY, &s), CUDA_ERROR_STUB_LIBRARY);
  OK(s && !strcmp(s, "untouched")); /* *pStr not set */
  EQ(p_cuGetProcAddress_v2("cuInit", &fn, 12000, 0, NULL),
     CUDA_ERROR_STUB_LIBRARY);
  OK(fn == NULL);
}

static void s_cuda_nodevice(void) {
  CUdeviceptr d;
  int v = 0;
  knob("MODE", "nodevice");
  EQ(p_cuInit(0), CUDA_ERROR_NO_DEVICE);
  EQ(p_cuMemAlloc(&d, 64), CUDA_ERROR_NOT_INITIALIZED);
  EQ(p_cuDriverGetVersion(&v), 0);
}

/* virtual memory management (cuMemCreate, cuMemMap, fd sharing) */
#include "selftest_vmm.c"
/* stream-ordered memory pools (cuMemPoolCreate, pool and pointer sharing) */
#include "selftest_pool.c"
#endif /* FAKE_GPU_CUDA */

#ifdef FAKE_GPU_HIP
/* ---- HIP only ------------------------------------------------------------ */

static void s_hip_runtime(void) {
  int v = 0;
  void *p = (void *)1, *base;
  hipEvent_t ev;
  EQ(p_hipRuntimeGetVersion(&v), 0);
  EQ(v, 50221153);
  EQ(p_hipGetDeviceCount(&v), 0);
  EQ(v, 1);
  EQ(p_hipMalloc(&p, 0), 0); /* size 0: success, NULL */
  OK(p == NULL);
  EQ(p_hipMemGetAddressRange(&base, NULL, p), hipErrorInvalidValue);
  EQ(p_hipSetDevice(1), hipErrorInvalidDevice);
  EQ(p_hipEventCreateWithFlags(&ev,
                               hipEventInterprocess | hipEventDisableTiming),
     hipErrorInvalidValue);
  OK(!strcmp(p_hipGetErrorString(hipErrorInvalidValue),
             "hipErrorInvalidValue"));
  OK(!strcmp(p_hipGetErrorName((hipError_t)12345), "hipErrorUnknown"));
  OK(dlvsym(hip_lib, "hipMalloc", "hip_4.2") &&
     dlvsym(hip_lib, "hipPointerGetAttribute", "hip_5.0"));
  knob("DEVICES", "2");
  EQ(p_hipSetDevice(1), 0);
  EQ(p_hipGetDevice(&v), 0);
  EQ(v, 1);
  EQ(p_hipMalloc(&p, 64), 0);
  EQ(p_hipPointerGetAttribute(&v, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), 0);
  EQ(v, 1);
  EQ(p_hipMemcpy(&v, p, 4, hipMemcpyDefault),
     0); /* direction from the pointers */
  EQ(p_hipMemcpy(&v, &v, 4, hipMemcpyDeviceToHost), hipErrorInvalidValue);
  hipStream_t s;
  EQ(p_hipStreamCreateWithFlags(&s, hipStreamNonBlocking), 0);
  EQ(p_hipEventCreate(&ev), 0);
  knob("WORK_US", "100000");
  EQ(p_hipEventRecord(ev, s), 0);
  EQ(p_hipStreamQuery(NULL),
     0); /* the null stream does not wait for a non-blocking one */
  EQ(p_hipDeviceSynchronize(), 0); /* but the device does */
  EQ(p_hipEventQuery(ev), 0);
  knob("WORK_US", NULL);
  EQ(p_hipEventDestroy(ev), 0);
  EQ(p_hipStreamDestroy(s), 0);
  EQ(p_hipFree(p), 0);
}

static void s_hip_nodevice(void) {
  int v = -1;
  void *p;
  knob("MODE", "nodevice"); /* as the real 5.2 library on this GPU-less host */
  EQ(p_hipInit(0), hipErrorInvalidDevice);
  EQ(p_hipGetDeviceCount(&v), hipErrorNoDevice);
  EQ(v, 0);
  EQ(p_hipMalloc(&p, 64), hipErrorInvalidDevice);
  EQ(p_hipRuntimeGetVersion(&v), 0);
}

#include "selftest_hip_vmm.c"
/* stream-ordered memory pools (hipMemPoolCreate, pool and pointer sharing) */
#include "selftest_hip_pool.c"
#endif /* FAKE_GPU_HIP */

static void s_log_lines(void) {
  void *p;
  char key[64];
  clear_log();
  EQ(A->init(), 0);
  EQ(A->alloc(&p, 4096), 0);
  EQ(A->free(p), 0);
  snprintf(key, sizeof key, "%d %s size=4096 ptr=0x", (int)getpid(),
           A->alloc_call);
  EQ(log_count(key, A->ok_name, NULL), 1);
  EQ(log_malformed(), 0);
}

/* The libraries this build tests. */
#if defined(FAKE_GPU_CUDA) && defined(FAKE_GPU_HIP)
#define LIBS "libcuda.so.1 and libamdhip64.so.5"
#elif defined(FAKE_GPU_CUDA)
#define LIBS "libcuda.so.1"
#else
#define LIBS "libamdhip64.so.5"
#endif

int main(int argc, char **argv) {
  static const struct api *apis[] = {
#ifdef FAKE_GPU_CUDA
      &cuda,
#endif
#ifdef FAKE_GPU_HIP
      &hip,
#endif
  };
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR   (DIR holds %s)\n", argv[0], LIBS);
    return 2;
  }
  T = mmap(NULL, sizeof *T, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
           -1, 0);
  snprintf(logpath, sizeof logpath, "/tmp/fake_gpu_selftest.%d.log",
           (int)getpid());
#ifdef FAKE_GPU_CUDA
  load_cuda(argv[1]);
  load_vmm();
  load_pool();
#endif
#ifdef FAKE_GPU_HIP
  load_hip(argv[1]);
  load_hip_vmm();
  load_hip_pool();
#endif
  for (size_t i = 0; i < sizeof apis / sizeof *apis; i++) {
    const struct api *api = apis[i];
    run(api, "memory", s_memory);
    run(api, "ipc local", s_ipc_local);
    run(api, "events local", s_events_local);
    run(api, "cross-process", s_cross_process);
    run(api, "hostptr none", s_hostptr_none);
    run(api, "fork after init", s_fork_after_init);
    run(api, "log", s_log_lines);
  }
#ifdef FAKE_GPU_CUDA
  run(&cuda, "init/contexts", s_cuda_init_ctx);
  run(&cuda, "cuGetProcAddress", s_cuda_proc_address);
  run(&cuda, "stub", s_cuda_stub);
  run(&cuda, "nodevice", s_cuda_nodevice);
  run_vmm();
  run_pool();
#endif
#ifdef FAKE_GPU_HIP
  run(&hip, "runtime", s_hip_runtime);
  run(&hip, "nodevice", s_hip_nodevice);
  run_hip_vmm();
  run_hip_pool();
#endif
  unlink(logpath);
  printf("%d passed, %d failed\n", T->pass, T->fail);
  return T->fail != 0;
}
