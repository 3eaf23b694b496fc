#define _GNU_SOURCE
#define IPCREF_IMPLEMENTATION
#define IPCREF_CUDA_IMPLEMENTATION
#define IPCREF_HIP_IMPLEMENTATION
#include "ipcref.h"
#include "ipcref_cuda.h"
#include "ipcref_hip.h"

/* The device backends (ipcref_cuda.h, ipcref_hip.h) end to end, over the
 * fake drivers of tests/fake_gpu (there is no GPU here): real processes,
 * real sockets, SIGKILL; the fakes' call log proves what happened at the
 * driver level (which process opened which handle how often, whether a
 * stream waited on an event before the data was used, ...).
 *
 *   IPCREF_FAKE_GPU_DIR  (required) where tests/fake_gpu/build.sh put
 *                        libcuda.so.1 and libamdhip64.so.5, each where its
 *                        API's headers were found, and the file "apis"
 *                        that lists the halves it built ("cuda hip",
 *                        "cuda", "hip" or nothing): the cases of those
 *                        halves run, and their drivers must be there; for
 *                        a half not listed a note says it did not run
 *   IPCREF_CUDA_STUB     the CUDA toolkit's stub library, required with
 *                        the CUDA half (default
 *                        $CUDA_HOME/lib64/stubs/libcuda.so where that
 *                        exists, else /usr/local/cuda/lib64/stubs/libcuda.so)
 *   IPCREF_HIP_REAL      the real HIP runtime, opened where present to see
 *                        it refused without a GPU (default
 *                        /usr/lib/x86_64-linux-gnu/libamdhip64.so.5; empty:
 *                        skip)
 *   IPCREF_UNDER_VALGRIND=1  longer waits, and deaths seen by polling
 *                        (valgrind has no pidfd_open)
 *   IPCREF_GPU_KEEP_LOGS=1   keep the call logs (their directory is
 *                        printed)
 *   IPCREF_GPU_ONLY=text only the cases whose name holds `text`
 *
 * Rules kept as with a real driver: a process that needs the driver
 * opens it itself, and every fork happens before the forking process
 * opens it. Every wait has a timeout and every child is reaped. */

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_tmo; /* ms any single wait may take */
#define CTL_MS        g_tmo
#define REAP_MS       g_tmo
#define CHILD_ALARM_S 900 /* a child never outlives this */

#include "share_fixture.h"
#include "xfer.h"

/* ---- configuration ------------------------------------------------------ */

static char g_tmp[64];  /* the logs' directory (mkdtemp) */
static char g_log[256]; /* this case's call log */
static int g_seq;
static const char *g_stub;
static const char *g_hip_real; /* the real libamdhip64, if installed */
static int g_fd0;              /* fds open when the case began */
static long g_case_t0;

#define SEG ((size_t)1 << 20) /* segment_size for most cases */

/* One kind of GPU: what differs between the two fakes. */
typedef struct kind {
  int hip;
  int vmm;         /* CUDA segments made by cuMemCreate, shared by fd */
  int pool;        /* CUDA: every buffer wraps memory of a shareable pool */
  const char *key; /* what names one allocation in every process's log */
  const char *name, *pfx;
  int32_t type, other_type;
  const char *ok; /* the success marker in the log */
  const char *c_get, *c_open, *c_close, *c_alloc, *c_free, *c_wait, *c_sync,
      *c_evopen, *oom;
  char path[PATH_MAX];
} kind;

static kind K_CUDA = {0,
                      0,
                      0,
                      "h=",
                      "cuda",
                      "FAKE_CUDA_",
                      IPCREF_DEVICE_CUDA,
                      IPCREF_DEVICE_ROCM,
                      "-> CUDA_SUCCESS",
                      "cuIpcGetMemHandle",
                      "cuIpcOpenMemHandle_v2",
                      "cuIpcCloseMemHandle",
                      "cuMemAlloc_v2",
                      "cuMemFree_v2",
                      "cuStreamWaitEvent",
                      "cuStreamSynchronize",
                      "cuIpcOpenEventHandle",
                      "CUDA_ERROR_OUT_OF_MEMORY",
                      ""};
static kind K_HIP = {1,
                     0,
                     0,
                     "h=",
                     "hip",
                     "FAKE_HIP_",
                     IPCREF_DEVICE_ROCM,
                     IPCREF_DEVICE_CUDA,
                     "-> hipSuccess",
                     "hipIpcGetMemHandle",
                     "hipIpcOpenMemHandle",
                     "hipIpcCloseMemHandle",
                     "hipMalloc",
                     "hipFree",
                     "hipStreamWaitEvent",
                     "hipStreamSynchronize",
                     "hipIpcOpenEventHandle",
                     "hipErrorOutOfMemory",
                     ""};
/* CUDA again, its segments VMM memory (ipcref_cuda_set_memory): the
 * allocation is exported as an fd once, and each process that imports it
 * maps it once and unmaps it once. */
static kind K_VMM = {0,
                     1,
                     0,
                     "alloc=",
                     "cuda_vmm",
                     "FAKE_CUDA_",
                     IPCREF_DEVICE_CUDA,
                     IPCREF_DEVICE_ROCM,
                     "-> CUDA_SUCCESS",
                     "cuMemExportToShareableHandle",
                     "cuMemImportFromShareableHandle",
                     "cuMemRelease",
                     "cuMemCreate",
                     "cuMemRelease",
                     "cuStreamWaitEvent",
                     "cuStreamSynchronize",
                     "cuIpcOpenEventHandle",
                     "CUDA_ERROR_OUT_OF_MEMORY",
                     ""};
/* CUDA again, every buffer a pointer of a stream-ordered pool created
 * shareable (cuMemAllocFromPoolAsync), wrapped, its release callback the
 * free (g_alloc): the pool goes as its fd, each pointer as its data. */
static kind K_POOL = {0,
                      0,
                      1,
                      "alloc=",
                      "cuda_pool",
                      "FAKE_CUDA_",
                      IPCREF_DEVICE_CUDA,
                      IPCREF_DEVICE_ROCM,
                      "-> CUDA_SUCCESS",
                      "cuMemPoolExportPointer",
                      "cuMemPoolImportPointer",
                      "cuMemFree_v2",
                      "cuMemAllocFromPoolAsync",
                      "cuMemFree_v2",
                      "cuStreamWaitEvent",
                      "cuStreamSynchronize",
                      "cuIpcOpenEventHandle",
                      "CUDA_ERROR_OUT_OF_MEMORY",
                      ""};
/* HIP again, its segments VMM memory (ipcref_hip_set_memory: hipMemCreate,
 * shared by fd). */
static kind K_HIP_VMM = {1,
                         1,
                         0,
                         "alloc=",
                         "hip_vmm",
                         "FAKE_HIP_",
                         IPCREF_DEVICE_ROCM,
                         IPCREF_DEVICE_CUDA,
                         "-> hipSuccess",
                         "hipMemExportToShareableHandle",
                         "hipMemImportFromShareableHandle",
                         "hipMemRelease",
                         "hipMemCreate",
                         "hipMemRelease",
                         "hipStreamWaitEvent",
                         "hipStreamSynchronize",
                         "hipIpcOpenEventHandle",
                         "hipErrorOutOfMemory",
                         ""};
/* HIP again, every buffer a pointer of a pool created shareable
 * (hipMallocFromPoolAsync), wrapped, as K_POOL. */
static kind K_HIP_POOL = {1,
                          0,
                          1,
                          "alloc=",
                          "hip_pool",
                          "FAKE_HIP_",
                          IPCREF_DEVICE_ROCM,
                          IPCREF_DEVICE_CUDA,
                          "-> hipSuccess",
                          "hipMemPoolExportPointer",
                          "hipMemPoolImportPointer",
                          "hipFree",
                          "hipMallocFromPoolAsync",
                          "hipFree",
                          "hipStreamWaitEvent",
                          "hipStreamSynchronize",
                          "hipIpcOpenEventHandle",
                          "hipErrorOutOfMemory",
                          ""};

/* ---- the fakes' knobs and call log -------------------------------------- */

static void knob(const kind *k, const char *name, const char *value) {
  char key[64];
  snprintf(key, sizeof key, "%s%s", k->pfx, name);
  if (value)
    setenv(key, value, 1);
  else
    unsetenv(key);
}

static void knob_num(const kind *k, const char *name, long long v) {
  char s[32];
  snprintf(s, sizeof s, "%lld", v);
  knob(k, name, s);
}

static void knobs_reset(void) {
  static const char *const names[] = {
      "MODE",    "DEVICES",  "MEM_LIMIT",  "REOPEN",         "WORK_US",
      "HOSTPTR", "LOG",      "IPC_EVENTS", "DRIVER_VERSION", "HIDE",
      "VMM",     "POSIX_FD", "GRANULARITY"};
  size_t i;
  for (i = 0; i < sizeof names / sizeof *names; i++) {
    knob(&K_CUDA, names[i], NULL);
    knob(&K_HIP, names[i], NULL);
  }
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "re");
  char *s;
  long n;
  if (!f) {
    s = (char *)calloc(1, 1);
    return s;
  }
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  s = (char *)calloc(1, (size_t)(n > 0 ? n : 0) + 1);
  if (s && n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
  fclose(f);
  return s;
}

/* Does `line` (one log line, NUL-terminated) match? pid 0: any process;
 * call NULL: any call; has NULL: anything. */
static int log_match(const char *line, int pid, const char *call,
                     const char *has) {
  char *end;
  long lp = strtol(line, &end, 10);
  size_t n;
  if (end == line || *end != ' ') return 0;
  if (pid && lp != pid) return 0;
  end++;
  n = strcspn(end, " ");
  if (call && (strlen(call) != n || strncmp(end, call, n) != 0)) return 0;
  return !has || strstr(line, has) != NULL;
}

/* Visits the matching lines of the log: fn(line, index, user); returns the
 * number of matches. */
static int log_scan(int pid, const char *call, const char *has,
                    void (*fn)(const char *, int, void *), void *user) {
  char *s = slurp(g_log), *p, *nl;
  int idx = 0, count = 0;
  for (p = s; p && *p; p = nl ? nl + 1 : p + strlen(p), idx++) {
    nl = strchr(p, '\n');
    if (nl) *nl = 0;
    if (log_match(p, pid, call, has)) {
      if (fn) fn(p, idx, user);
      count++;
    }
    if (!nl) break;
  }
  free(s);
  return count;
}

/* What a log line holds for the allocation `value` of kind k's key (the
 * fake logs alloc= last on a line, h= before other keys). */
static void key_is(const kind *k, const char *value, char *out, size_t n) {
  snprintf(out, n, "%s%s%s", k->key, value, k->vmm ? "" : " ");
}

/* What the fakes' call log proves is checked against the fakes only: a
 * real driver keeps no log (make gpu-test). */
static int g_real;
#define LOG_EQ(a, b)                                                           \
  do {                                                                         \
    if (!g_real) CHECK_EQ(a, b);                                               \
  } while (0)
#define LOG_OK(c)                                                              \
  do {                                                                         \
    if (!g_real) CHECK(c);                                                     \
  } while (0)

static int log_count(int pid, const char *call, const char *has) {
  return log_scan(pid, call, has, NULL, NULL);
}

struct log_pos {
  int first, last;
};
static void log_pos_fn(const char *line, int idx, void *user) {
  struct log_pos *p = (struct log_pos *)user;
  (void)line;
  if (p->first < 0) p->first = idx;
  p->last = idx;
}
/* The index of the first (last: the last) matching line; -1 if none. */
static int log_index(int pid, const char *call, const char *has, int last) {
  struct log_pos p = {-1, -1};
  log_scan(pid, call, has, log_pos_fn, &p);
  return last ? p.last : p.first;
}

struct log_val {
  const char *key;
  long long value;
  int found;
  char text[64];
};
static void log_val_fn(const char *line, int idx, void *user) {
  struct log_val *v = (struct log_val *)user;
  const char *s = strstr(line, v->key);
  (void)idx;
  if (v->found || !s) return;
  s += strlen(v->key);
  v->found = 1;
  v->value = strtoll(s, NULL, 0);
  snprintf(v->text, sizeof v->text, "%.*s", (int)strcspn(s, " "), s);
}
/* The value after `key` (e.g. "h=", "pending_us=") in the first matching
 * line: *text gets it as text (for handles). 0 if no line matched. */
static int log_value(int pid, const char *call, const char *has,
                     const char *key, long long *value, char *text,
                     size_t textlen) {
  struct log_val v;
  memset(&v, 0, sizeof v);
  v.key = key;
  log_scan(pid, call, has, log_val_fn, &v);
  if (value) *value = v.value;
  if (text) snprintf(text, textlen, "%s", v.text);
  return v.found;
}

struct log_vals {
  const char *key;
  long long *out;
  int n, max;
};
static void log_vals_fn(const char *line, int idx, void *user) {
  struct log_vals *v = (struct log_vals *)user;
  const char *s = strstr(line, v->key);
  (void)idx;
  if (s && v->n < v->max) v->out[v->n++] = strtoll(s + strlen(v->key), NULL, 0);
}
/* The values after `key` in every matching line (at most max); their
 * number. */
static int log_values(int pid, const char *call, const char *has,
                      const char *key, long long *out, int max) {
  struct log_vals v;
  v.key = key;
  v.out = out;
  v.n = 0;
  v.max = max;
  log_scan(pid, call, has, log_vals_fn, &v);
  return v.n;
}

static void log_dump_fn(const char *line, int idx, void *user) {
  int *n = (int *)user;
  (void)idx;
  if (strstr(line, "GetProcAddress") || ++*n > 150) return;
  printf("      | %s\n", line);
}
static void log_dump(void) {
  int n = 0;
  printf("    call log %s:\n", g_log);
  log_scan(0, NULL, NULL, log_dump_fn, &n);
}

/* ---- processes, sockets, fds --------------------------------------------- */

/* ---- the driver, from the test's side ------------------------------------
 * ipcref's backend plus the fake library's own entry points (dlsym), to
 * write and read device memory, allocate outside ipcref, make streams and
 * queue "work" (an event recorded on a stream takes WORK_US). */

typedef struct gdrv {
  const kind *k;
  ipcref_cuda *cu;
  ipcref_hip *hp;
  ipcref_backend *be;
  void *lib;
  void *cuctx; /* CUDA: device 0's primary context, retained by the test */
  int (*htod)(unsigned long long, const void *, size_t);
  int (*dtoh)(void *, unsigned long long, size_t);
  int (*cmalloc)(unsigned long long *, size_t);
  int (*cfree)(unsigned long long);
  int (*crange)(unsigned long long *, size_t *, unsigned long long);
  int (*retain)(void **, int);
  int (*release)(int);
  int (*setcur)(void *);
  int (*cstream)(void **, unsigned);
  int (*cstream_free)(void *);
  int (*cevent)(void **, unsigned);
  int (*crecord)(void *, void *);
  int (*cevent_free)(void *);
  int (*hmemcpy)(void *, const void *, size_t, int);
  int (*hmalloc)(void **, size_t);
  int (*hfree)(void *);
  int (*hrange)(void **, size_t *, void *);
  int (*hstream)(void **, unsigned);
  int (*hstream_free)(void *);
  int (*hevent)(void **, unsigned);
  int (*hrecord)(void *, void *);
  int (*hevent_free)(void *);
  int (*vmm)(void **, size_t);
  /* CUDA's virtual memory management, for the test's own VMM memory */
  int (*vcreate)(unsigned long long *, size_t, const void *,
                 unsigned long long);
  int (*vrelease)(unsigned long long);
  int (*vreserve)(unsigned long long *, size_t, size_t, unsigned long long,
                  unsigned long long);
  int (*vaddrfree)(unsigned long long, size_t);
  int (*vmap)(unsigned long long, size_t, size_t, unsigned long long,
              unsigned long long);
  int (*vunmap)(unsigned long long, size_t);
  int (*vaccess)(unsigned long long, size_t, const void *, size_t);
  /* CUDA's stream-ordered pools, for the pool kind's buffers */
  int (*pcreate)(void **, const void *);
  int (*pdestroy)(void *);
  int (*palloc)(unsigned long long *, size_t, void *, void *);
  int (*hpcreate)(void **, const void *); /* HIP's */
  int (*hpdestroy)(void *);
  int (*hpalloc)(void **, size_t, void *, void *);
  void *pools[2];  /* the pool kind's: one per device, made at first use */
  int copy_dev;    /* CUDA: the device whose context makes the copies */
  void *devctx[2]; /* CUDA: device 1's primary context, once retained */
} gdrv;

static gdrv *g_drv; /* the one open now: the pool kind's g_alloc uses it */
static ipcref_result g_wrap(ipcref_ctx *ctx, const struct kind *k, int dev,
                            void *p, size_t n, void (*rel)(void *, void *),
                            void *user, ipcref_buf **out);
static int g_pool_alloc(gdrv *d, int dev, size_t n, void **out);

/* dlsym gives an object pointer; copied into a function pointer. */
#define LOAD(d, field, name)                                                   \
  do {                                                                         \
    void *sym_ = dlsym((d)->lib, name);                                        \
    CHECK(sym_ != NULL);                                                       \
    memcpy(&(d)->field, &sym_, sizeof sym_);                                   \
  } while (0)

static const char *g_err(const kind *k) {
  return k->hip ? ipcref_hip_error() : ipcref_cuda_error();
}

static ipcref_result g_open(const kind *k, gdrv *d) {
  ipcref_result r;
  memset(d, 0, sizeof *d);
  d->k = k;
  r = k->hip ? ipcref_hip_open(k->path, &d->hp)
             : ipcref_cuda_open(k->path, &d->cu);
  if (r != IPCREF_OK) {
    printf("    %s open failed: %d %s\n", k->name, (int)r, g_err(k));
    CHECK_EQ(r, IPCREF_OK);
    return r;
  }
  d->be = k->hip ? ipcref_hip_backend(d->hp) : ipcref_cuda_backend(d->cu);
  if (!k->hip) /* legacy unless the kind says VMM (the default is AUTO) */
    CHECK_EQ(ipcref_cuda_set_memory(d->cu, k->vmm ? IPCREF_CUDA_MEMORY_VMM
                                                  : IPCREF_CUDA_MEMORY_LEGACY),
             IPCREF_OK);
  else if (k->vmm)
    CHECK_EQ(ipcref_hip_set_memory(d->hp, IPCREF_HIP_MEMORY_VMM), IPCREF_OK);
  d->lib = dlopen(k->path, RTLD_NOW | RTLD_LOCAL);
  CHECK(d->lib != NULL);
  if (!d->lib) return IPCREF_ENODEV;
  if (!k->hip) {
    LOAD(d, htod, "cuMemcpyHtoD_v2");
    LOAD(d, dtoh, "cuMemcpyDtoH_v2");
    LOAD(d, cmalloc, "cuMemAlloc_v2");
    LOAD(d, cfree, "cuMemFree_v2");
    LOAD(d, crange, "cuMemGetAddressRange_v2");
    LOAD(d, retain, "cuDevicePrimaryCtxRetain");
    LOAD(d, release, "cuDevicePrimaryCtxRelease_v2");
    LOAD(d, setcur, "cuCtxSetCurrent");
    LOAD(d, cstream, "cuStreamCreate");
    LOAD(d, cstream_free, "cuStreamDestroy_v2");
    LOAD(d, cevent, "cuEventCreate");
    LOAD(d, crecord, "cuEventRecord");
    LOAD(d, cevent_free, "cuEventDestroy_v2");
    LOAD(d, vcreate, "cuMemCreate");
    LOAD(d, vrelease, "cuMemRelease");
    LOAD(d, vreserve, "cuMemAddressReserve");
    LOAD(d, vaddrfree, "cuMemAddressFree");
    LOAD(d, vmap, "cuMemMap");
    LOAD(d, vunmap, "cuMemUnmap");
    LOAD(d, vaccess, "cuMemSetAccess");
    LOAD(d, pcreate, "cuMemPoolCreate");
    LOAD(d, pdestroy, "cuMemPoolDestroy");
    LOAD(d, palloc, "cuMemAllocFromPoolAsync");
    /* The test's own hold on device 0's primary context (a framework
     * would have one): its copies and allocations run in it. */
    CHECK_EQ(d->retain(&d->cuctx, 0), 0);
    CHECK_EQ(d->setcur(d->cuctx), 0);
  } else {
    LOAD(d, hmemcpy, "hipMemcpy");
    LOAD(d, hmalloc, "hipMalloc");
    LOAD(d, hfree, "hipFree");
    LOAD(d, hrange, "hipMemGetAddressRange");
    LOAD(d, hstream, "hipStreamCreateWithFlags");
    LOAD(d, hstream_free, "hipStreamDestroy");
    LOAD(d, hevent, "hipEventCreateWithFlags");
    LOAD(d, hrecord, "hipEventRecord");
    LOAD(d, hevent_free, "hipEventDestroy");
    if (k->pool) { /* the HIP pool kind's (the runtime may lack them) */
      LOAD(d, hpcreate, "hipMemPoolCreate");
      LOAD(d, hpdestroy, "hipMemPoolDestroy");
      LOAD(d, hpalloc, "hipMallocFromPoolAsync");
    }
  }
  if (!g_real) LOAD(d, vmm, "fake_gpu_alloc_vmm"); /* the fakes' hook */
  g_drv = d;
  return IPCREF_OK;
}

static void g_close(gdrv *d) {
  int i;
  if (!d->k) return;
  for (i = 0; i < 2; i++)
    if (d->pools[i])
      CHECK_EQ(d->k->hip ? d->hpdestroy(d->pools[i]) : d->pdestroy(d->pools[i]),
               0);
  if (g_drv == d) g_drv = NULL;
  if (d->cuctx) CHECK_EQ(d->release(0), 0);
  if (d->devctx[1]) CHECK_EQ(d->release(1), 0);
  if (d->k->hip)
    ipcref_hip_close(d->hp);
  else
    ipcref_cuda_close(d->cu);
  if (d->lib) dlclose(d->lib);
  memset(d, 0, sizeof *d);
}

/* CUDA: the copies run in device copy_dev's primary context (0 or 1).
 * VMM memory is reachable only from the devices given access to it, so
 * its copies run on its own device. */
static void g_cur(gdrv *d) {
  void *c = d->cuctx;
  if (d->k->hip) return;
  if (d->copy_dev == 1) {
    if (!d->devctx[1]) CHECK_EQ(d->retain(&d->devctx[1], 1), 0);
    c = d->devctx[1];
  }
  CHECK_EQ(d->setcur(c), 0);
}

static int g_h2d(gdrv *d, void *dst, const void *src, size_t n) {
  if (d->k->hip) return d->hmemcpy(dst, src, n, 1 /* HostToDevice */);
  g_cur(d);
  return d->htod((unsigned long long)(uintptr_t)dst, src, n);
}
static int g_d2h(gdrv *d, void *dst, const void *src, size_t n) {
  if (d->k->hip) return d->hmemcpy(dst, src, n, 2 /* DeviceToHost */);
  g_cur(d);
  return d->dtoh(dst, (unsigned long long)(uintptr_t)src, n);
}
/* CUmemAllocationProp's and CUmemAccessDesc's layouts (cuda.h). */
typedef struct {
  int type, handle_types, loc_type, loc_id;
  void *win32;
  unsigned char compression, rdma;
  unsigned short usage;
  unsigned char reserved[4];
} vmm_prop;
typedef struct {
  int loc_type, loc_id, flags;
} vmm_access;

/* VMM memory as another allocator makes it (PyTorch's expandable
 * segments): `chunks` allocations of `chunk` bytes each (whole granules),
 * mapped one after the other in one reserved range, read-write for device
 * 0; shareable by POSIX fd unless `fd_ok` is 0. *handles gets them. */
static int g_vmm_make(gdrv *d, size_t chunk, int chunks, int fd_ok,
                      unsigned long long *handles, void **out) {
  unsigned long long base = 0;
  vmm_prop pr;
  vmm_access ac;
  int i, e;
  memset(&pr, 0, sizeof pr);
  pr.type = 1;                  /* CU_MEM_ALLOCATION_TYPE_PINNED */
  pr.handle_types = fd_ok != 0; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
  pr.loc_type = 1;              /* CU_MEM_LOCATION_TYPE_DEVICE */
  ac.loc_type = 1;
  ac.loc_id = 0;
  ac.flags = 3; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
  e = d->vreserve(&base, chunk * (size_t)chunks, 0, 0, 0);
  for (i = 0; !e && i < chunks; i++) {
    unsigned long long at = base + chunk * (size_t)i;
    e = d->vcreate(&handles[i], chunk, &pr, 0);
    if (!e) e = d->vmap(at, chunk, 0, handles[i], 0);
    if (!e) e = d->vaccess(at, chunk, &ac, 1);
  }
  *out = (void *)(uintptr_t)base;
  return e;
}
static void g_vmm_free(gdrv *d, void *p, size_t chunk, int chunks,
                       const unsigned long long *handles) {
  unsigned long long base = (unsigned long long)(uintptr_t)p;
  int i;
  for (i = 0; i < chunks; i++) {
    CHECK_EQ(d->vunmap(base + chunk * (size_t)i, chunk), 0);
    CHECK_EQ(d->vrelease(handles[i]), 0);
  }
  CHECK_EQ(d->vaddrfree(base, chunk * (size_t)chunks), 0);
}

/* Device memory from "another allocator": cuMemAlloc / hipMalloc, or for
 * the VMM kind one VMM allocation of n bytes (the granularity, a knob,
 * must divide n). */
static unsigned long long g_vmm_handle; /* g_malloc's VMM allocation */
static int g_malloc(gdrv *d, size_t n, void **out) {
  unsigned long long p = 0;
  int e;
  if (d->k->pool) return g_pool_alloc(d, 0, n, out);
  if (d->k->hip) return d->hmalloc(out, n);
  if (d->k->vmm) return g_vmm_make(d, n, 1, 1, &g_vmm_handle, out);
  g_cur(d);
  e = d->cmalloc(&p, n);
  *out = (void *)(uintptr_t)p;
  return e;
}
static int g_free(gdrv *d, void *p, size_t n) {
  if (d->k->hip) return d->hfree(p);
  if (d->k->vmm) {
    g_vmm_free(d, p, n, 1, &g_vmm_handle);
    return 0;
  }
  g_cur(d);
  return d->cfree((unsigned long long)(uintptr_t)p);
}
static int g_range(gdrv *d, const void *p, void **base, size_t *size) {
  unsigned long long b = 0;
  int e;
  if (d->k->hip) return d->hrange(base, size, (void *)(uintptr_t)p);
  g_cur(d);
  e = d->crange(&b, size, (unsigned long long)(uintptr_t)p);
  *base = (void *)(uintptr_t)b;
  return e;
}
static int g_stream(gdrv *d, void **s) {
  if (d->k->hip) return d->hstream(s, 0);
  g_cur(d);
  return d->cstream(s, 0);
}
static void g_stream_free(gdrv *d, void *s) {
  if (d->k->hip)
    CHECK_EQ(d->hstream_free(s), 0);
  else
    CHECK_EQ(d->cstream_free(s), 0);
}
/* Queues "work" on the stream: in the fake, an event recorded there that
 * completes WORK_US later (a kernel writing the data). */
static void g_work(gdrv *d, void *stream) {
  void *ev = NULL;
  if (d->k->hip) {
    CHECK_EQ(d->hevent(&ev, 2 /* DisableTiming */), 0);
    CHECK_EQ(d->hrecord(ev, stream), 0);
    CHECK_EQ(d->hevent_free(ev), 0);
  } else {
    g_cur(d);
    CHECK_EQ(d->cevent(&ev, 2 /* CU_EVENT_DISABLE_TIMING */), 0);
    CHECK_EQ(d->crecord(ev, stream), 0);
    CHECK_EQ(d->cevent_free(ev), 0);
  }
}

/* CUmemPoolProps' layout (cuda.h); hipMemPoolProps' (HIP 5.2: no maxSize,
 * 64 bytes reserved) fits in it, its reserved bytes all zero. */
typedef struct {
  int alloc_type, handle_types, loc_type, loc_id;
  void *win32;
  size_t max_size;
  unsigned short usage;
  unsigned char reserved[54];
} pool_props;

/* A pointer of device dev's shareable pool (made at first use), on the
 * legacy stream: 0, or the driver's error. */
static int g_pool_alloc(gdrv *d, int dev, size_t n, void **out) {
  unsigned long long p = 0;
  int e = 0;
  if (dev < 0 || dev > 1) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  d->copy_dev = dev;
  g_cur(d);
  d->copy_dev = 0;
  if (!d->pools[dev]) {
    pool_props pr;
    memset(&pr, 0, sizeof pr);
    pr.alloc_type = 1;   /* CU_MEM_ALLOCATION_TYPE_PINNED */
    pr.handle_types = 1; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
    pr.loc_type = 1;     /* CU_MEM_LOCATION_TYPE_DEVICE */
    pr.loc_id = dev;
    e = d->k->hip ? d->hpcreate(&d->pools[dev], &pr)
                  : d->pcreate(&d->pools[dev], &pr);
  }
  if (!e && d->k->hip) return d->hpalloc(out, n, d->pools[dev], NULL);
  if (!e) e = d->palloc(&p, n, d->pools[dev], NULL);
  *out = (void *)(uintptr_t)p;
  return e;
}
/* The pool kind's release callback: the owner frees its pointer, once
 * every lease came back (and every importer freed its import). */
static void g_pool_free(void *user, void *ptr) {
  gdrv *d = (gdrv *)user;
  g_cur(d);
  if (d->k->hip)
    CHECK_EQ(d->hfree(ptr), 0);
  else
    CHECK_EQ(d->cfree((unsigned long long)(uintptr_t)ptr), 0);
}

static ipcref_result g_alloc(ipcref_ctx *ctx, const kind *k, int dev, size_t n,
                             ipcref_buf **out) {
  void *p = NULL;
  ipcref_result r;
  int e;
  if (!k->pool)
    return k->hip ? ipcref_hip_alloc(ctx, dev, n, out)
                  : ipcref_cuda_alloc(ctx, dev, n, out);
  /* The pool kind: a pointer of a shareable pool, wrapped. */
  *out = NULL;
  if (!g_drv) return IPCREF_ENODEV;
  e = g_pool_alloc(g_drv, dev, n, &p);
  if (e == 2) return IPCREF_ENOMEM; /* ..._OUT_OF_MEMORY, both APIs */
  if (e) return IPCREF_ENODEV;
  r = g_wrap(ctx, k, dev, p, n, g_pool_free, g_drv, out);
  if (r != IPCREF_OK) g_pool_free(g_drv, p);
  return r;
}
static ipcref_result g_wrap(ipcref_ctx *ctx, const kind *k, int dev, void *p,
                            size_t n, void (*rel)(void *, void *), void *user,
                            ipcref_buf **out) {
  return k->hip ? ipcref_hip_wrap(ctx, dev, p, n, rel, user, out)
                : ipcref_cuda_wrap(ctx, dev, p, n, rel, user, out);
}

/* A recognisable word for index i of a pattern. */
static uint32_t pat(uint32_t seed, size_t i) {
  return (uint32_t)(i * 2654435761u) ^ (seed * 0x01000193u) ^ seed;
}
/* Writes pattern `seed` (word 0 = pattern index `first`) to device
 * memory, through the driver. */
static void dev_fill(gdrv *d, void *dptr, size_t bytes, uint32_t seed,
                     size_t first) {
  uint32_t *h = (uint32_t *)malloc(bytes);
  size_t i;
  CHECK(h != NULL);
  if (!h) return;
  for (i = 0; i < bytes / 4; i++) h[i] = pat(seed, first + i);
  CHECK_EQ(g_h2d(d, dptr, h, bytes), 0);
  free(h);
}
/* 1 when device memory holds that pattern (read through the driver). */
static int dev_check(gdrv *d, const void *dptr, size_t bytes, uint32_t seed,
                     size_t first) {
  uint32_t *h = (uint32_t *)malloc(bytes);
  size_t i;
  int ok = h != NULL;
  if (!h) return 0;
  memset(h, 0, bytes);
  if (g_d2h(d, h, dptr, bytes) != 0) ok = 0;
  for (i = 0; ok && i < bytes / 4; i++)
    if (h[i] != pat(seed, first + i)) {
      printf("    word %zu: %08x, expected %08x\n", i, h[i],
             pat(seed, first + i));
      ok = 0;
    }
  free(h);
  return ok;
}

static void *view_ptr(const ipcref_view *v) {
  return (char *)ipcref_buf_data(v->buf) + v->byte_offset;
}

/* A context with the driver's backend (d NULL: none). */
static ipcref_ctx *mkctx(size_t segment_size, gdrv *d) {
  ipcref_ctx_options o;
  ipcref_ctx *c;
  memset(&o, 0, sizeof o);
  o.segment_size = segment_size;
  c = make_ctx(&o);
  if (c && d && d->be) CHECK_EQ(ipcref_ctx_add_backend(c, d->be), IPCREF_OK);
  return c;
}
static ipcref_view u32_view(ipcref_buf *b, size_t bytes) {
  ipcref_view v;
  int64_t n = (int64_t)(bytes / 4);
  memset(&v, 0, sizeof v);
  CHECK_EQ(ipcref_view_of(b, IPCREF_U32, 1, &n, &v), IPCREF_OK);
  return v;
}
static void check_dev(const ipcref_buf *b, int32_t type, int32_t id) {
  ipcref_device dv = ipcref_buf_device(b);
  CHECK_EQ(dv.type, type);
  CHECK_EQ(dv.id, id);
}

/* ---- the case frame -------------------------------------------------------
 */

static void case_begin(const char *name, const kind *k) {
  knobs_reset();
  snprintf(g_log, sizeof g_log, "%s/%02d_%s_%s.log", g_tmp, ++g_seq, name,
           k ? k->name : "none");
  knob(&K_CUDA, "LOG", g_log);
  knob(&K_HIP, "LOG", g_log);
  g_fd0 = count_fds();
  g_case_t0 = now_ms();
}

static void case_end(void) {
  int fds = count_fds();
  if (fds != g_fd0)
    printf("    fds: %d before the case, %d after\n", g_fd0, fds);
  CHECK_EQ(fds, g_fd0);
  if (harness_failures_in_test) log_dump();
  if (getenv("IPCREF_GPU_TIMES")) printf("    %ld ms\n", now_ms() - g_case_t0);
  knobs_reset();
}

#define GPU_TEST(fn, kname, karg)                                              \
  static void fn##_##kname(void) {                                             \
    case_begin(#fn, karg);                                                     \
    fn(karg);                                                                  \
    case_end();                                                                \
  }

/* ======================================================================== */
/* 1. The full flow: A allocates and writes, sends to B, B reads and
 * forwards to C, C reads; all release; A's limbo sweeps; the device memory
 * is freed when A's context goes. The device pointers are PROT_NONE on the
 * host (HOSTPTR=none): every byte goes through the driver's copies. */

struct flow_arg {
  const kind *k;
  int in, out, ctl;
};

static const size_t flow_size[2] = {8192, 8192}; /* one segment */
static const uint32_t flow_seed[2] = {0x11, 0x22};

static int flow_child(void *vp) {
  struct flow_arg *a = (struct flow_arg *)vp;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *pin, *pout = NULL;
  ipcref_view v[2];
  ipcref_stats st;
  int i;
  memset(v, 0, sizeof v);
  if (g_open(a->k, &d) != IPCREF_OK) return 1;
  ctx = mkctx(SEG, &d);
  pin = make_peer(ctx, a->in);
  if (a->out >= 0) pout = make_peer(ctx, a->out);
  for (i = 0; i < 2; i++) {
    CHECK_EQ(ipcref_recv_on(pin, &v[i], g_tmo, NULL), IPCREF_OK);
    if (!v[i].buf) continue;
    check_dev(v[i].buf, a->k->type, 0);
    CHECK_EQ(ipcref_buf_size(v[i].buf), flow_size[i]);
    CHECK(dev_check(&d, view_ptr(&v[i]), flow_size[i], flow_seed[i], 0));
    if (pout) CHECK_EQ(ipcref_send_on(pout, &v[i], NULL), IPCREF_OK);
  }
  ctl_put(a->ctl, 1); /* read (and forwarded) */
  CTL_EXPECT(a->ctl, 2);
  ipcref_view_release(&v[0]);
  ipcref_view_release(&v[1]);
  st = stats_of(ctx);
  CHECK_EQ(st.imported_bufs, 0);
  CHECK_EQ(st.deferred, 0);
  ctl_put(a->ctl, 3); /* released */
  CTL_EXPECT(a->ctl, 4);
  ipcref_peer_free(pin);
  ipcref_peer_free(pout);
  ipcref_ctx_free(ctx);
  g_close(&d);
  return 0;
}

static void test_full_flow(const kind *k) {
  int bc[2], i, pids[2];
  struct flow_arg b, c;
  kid kb, kc; /* B: a peer socket to A; C: its control socket only */
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *buf[2] = {NULL, NULL};
  ipcref_view v[2];
  ipcref_stats st;
  char h[64] = "";
  knob(k, "HOSTPTR", "none");
  xsocketpair(SOCK_SEQPACKET, bc);
  kid_open(&kb, 1, SOCK_SEQPACKET);
  kid_open(&kc, 0, SOCK_SEQPACKET);
  b.k = c.k = k;
  b.in = kb.their_sock[0];
  b.out = bc[0];
  b.ctl = kb.their_ctl;
  c.in = bc[1];
  c.out = -1;
  c.ctl = kc.their_ctl;
  pids[0] = (int)kid_fork(&kb, flow_child, &b, bc[0]); /* before the driver */
  pids[1] = (int)kid_fork(&kc, flow_child, &c, bc[1]); /* is opened */
  tclose(bc[0]);
  tclose(bc[1]);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  ctx = mkctx(SEG, &d);
  p = kid_peer(&kb, 0, ctx);
  for (i = 0; i < 2; i++) {
    CHECK_EQ(g_alloc(ctx, k, 0, flow_size[i], &buf[i]), IPCREF_OK);
    if (!buf[i]) goto done;
    check_dev(buf[i], k->type, 0);
    CHECK(ipcref_buf_is_shared(buf[i]));
    dev_fill(&d, ipcref_buf_data(buf[i]), flow_size[i], flow_seed[i], 0);
    v[i] = u32_view(buf[i], flow_size[i]);
    CHECK_EQ(ipcref_send_on(p, &v[i], NULL), IPCREF_OK);
    ipcref_view_release(&v[i]);
    ipcref_buf_release(buf[i]);
  }
  st = stats_of(ctx);
  CHECK_EQ(st.live_bufs, 0);
  CHECK_EQ(st.limbo_blocks, 2);
  CHECK(st.live_slots >= 2);
  /* (pool memory: the two pointers wrapped) */
  CHECK_EQ(st.device_bytes, k->pool ? flow_size[0] + flow_size[1] : SEG);
  CTL_EXPECT(kb.ctl, 1); /* B read them and forwarded them to C */
  CTL_EXPECT(kc.ctl, 1); /* C read them */
  st = stats_of(ctx);
  CHECK_EQ(st.live_slots, 4); /* B's two leases, and C's two forwarded */
  ctl_put(kb.ctl, 2);
  CTL_EXPECT(kb.ctl, 3); /* B released */
  ipcref_collect(ctx);
  st = stats_of(ctx);
  CHECK_EQ(st.live_slots, 2);
  CHECK_EQ(st.limbo_blocks, 2); /* C's forwarded holds keep them */
  ctl_put(kc.ctl, 2);
  CTL_EXPECT(kc.ctl, 3); /* C released */
  ipcref_collect(ctx);
  st = stats_of(ctx);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.live_bufs, 0);
  CHECK(st.sweeps > 0);
  /* the empty segment, cached (pool memory: back to its owner) */
  CHECK_EQ(st.device_bytes, k->pool ? 0 : SEG);
  ctl_put(kb.ctl, 4);
  ctl_put(kc.ctl, 4);
  KID_EXIT0(&kb, "B");
  KID_EXIT0(&kc, "C");
  /* The driver's view: one segment exported once by A, opened once and
   * closed once in each of B and C (the handle names A's allocation).
   * Pool memory: a pointer each, each freed once in B and in C, then by
   * its owner (A's release callback): never before an importer's. */
  LOG_EQ(log_count(getpid(), k->c_get, k->ok), k->pool ? 2 : 1);
  LOG_OK(log_value(getpid(), k->c_get, k->ok, k->key, NULL, h, sizeof h));
  {
    char hh[80];
    key_is(k, h, hh, sizeof hh);
    LOG_EQ(log_count(0, k->c_open, hh), 2);
    LOG_EQ(log_count(0, k->c_close, hh), k->pool ? 3 : 2);
  }
  LOG_EQ(log_count(0, NULL, "imported_elsewhere="),
         log_count(0, NULL, "imported_elsewhere=0 "));
  if (!k->hip) { /* each consumer's stream waited on each view's event */
    LOG_EQ(log_count(0, k->c_evopen, k->ok), 4);
    LOG_EQ(log_count(0, k->c_wait, k->ok), 4);
    LOG_EQ(log_count(getpid(), k->c_sync, NULL), 0);
  } else { /* HIP 5: no events; A synchronized before each hand-off */
    LOG_EQ(log_count(0, k->c_evopen, NULL), 0);
    LOG_EQ(log_count(0, k->c_wait, NULL), 0);
    LOG_EQ(log_count(getpid(), k->c_sync, k->ok), 2);
  }
  if (k->vmm) /* B and C mapped it read only; each release waited for
                 the context's work, then unmapped */
    for (i = 0; i < 2; i++) {
      int sync = log_index(pids[i],
                           k->hip ? "hipDeviceSynchronize" : "cuCtxSynchronize",
                           NULL, 0);
      LOG_EQ(log_count(pids[i], k->hip ? "hipMemSetAccess" : "cuMemSetAccess",
                       "flags=1 "),
             1);
      LOG_OK(sync >= 0 &&
             sync < log_index(pids[i], k->hip ? "hipMemUnmap" : "cuMemUnmap",
                              NULL, 0));
    }
  /* The empty segment stays until the context goes. */
  LOG_EQ(log_count(getpid(), k->c_free, NULL), k->pool ? 2 : 0);
done:
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
  /* Every segment A allocated was freed, once (pool memory: each
   * buffer's pointer, by its owner, after every importer freed it). */
  LOG_EQ(log_count(getpid(), k->c_alloc, k->ok), k->pool ? 2 : 1);
  LOG_EQ(log_count(getpid(), k->c_free, k->ok), k->pool ? 2 : 1);
  LOG_EQ(log_count(getpid(), k->c_free, NULL), k->pool ? 2 : 1);

out:
  kid_close(&kb);
  kid_close(&kc);
  KID_EXIT0(&kb, "B");
  KID_EXIT0(&kc, "C");
}
GPU_TEST(test_full_flow, cuda, &K_CUDA)
GPU_TEST(test_full_flow, hip, &K_HIP)
GPU_TEST(test_full_flow, cuda_vmm, &K_VMM)
GPU_TEST(test_full_flow, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_full_flow, cuda_pool, &K_POOL)
GPU_TEST(test_full_flow, hip_pool, &K_HIP_POOL)

/* ======================================================================== */
/* 2. Pointers from another allocator, in the middle of a larger
 * allocation: the consumer gets exactly that slice; the release callback
 * runs once, after both the consumer and the producer let go; two wraps in
 * one allocation export it once; ipcref never frees it. */

#define WRAP_ALLOC ((size_t)2 << 20) /* VMM: one granule, as GPUs have */
#define WRAP_SEED  0x5a
static const size_t wrap_off[2] = {65536 + 256, 524288};
static const size_t wrap_len[2] = {4096, 8192};

struct wrap_arg {
  const kind *k;
  int peer, ctl;
};

static int wrap_child(void *vp) {
  struct wrap_arg *a = (struct wrap_arg *)vp;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v[2];
  void *base[2] = {NULL, NULL};
  int i;
  memset(v, 0, sizeof v);
  if (g_open(a->k, &d) != IPCREF_OK) return 1;
  ctx = mkctx(SEG, &d);
  p = make_peer(ctx, a->peer);
  for (i = 0; i < 2; i++) {
    size_t size = 0;
    CHECK_EQ(ipcref_recv_on(p, &v[i], g_tmo, NULL), IPCREF_OK);
    if (!v[i].buf) return 1;
    CHECK_EQ(ipcref_buf_size(v[i].buf), wrap_len[i]);
    check_dev(v[i].buf, a->k->type, 0);
    /* Where it lies in the opened allocation: at the same offset. */
    CHECK_EQ(g_range(&d, ipcref_buf_data(v[i].buf), &base[i], &size), 0);
    CHECK_EQ(size, WRAP_ALLOC);
    CHECK_EQ((char *)ipcref_buf_data(v[i].buf) - (char *)base[i], wrap_off[i]);
    CHECK(dev_check(&d, view_ptr(&v[i]), wrap_len[i], WRAP_SEED,
                    wrap_off[i] / 4));
  }
  CHECK(base[0] == base[1]); /* one opening of the allocation */
  for (i = 0; i < 2; i++) {
    CTL_EXPECT(a->ctl, 10 + i);
    ipcref_view_release(&v[i]);
    ipcref_collect(ctx);
    (void)stats_of(ctx); /* returns a deferred release, if any */
    ctl_put(a->ctl, 20 + i);
  }
  CTL_EXPECT(a->ctl, 99);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
  return 0;
}

struct relcount {
  int n;
  void *ptr;
};
static void count_release(void *user, void *ptr) {
  struct relcount *c = (struct relcount *)user;
  c->n++;
  c->ptr = ptr;
}

static void test_wrap_offset(const kind *k) {
  int i;
  struct wrap_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *b[2] = {NULL, NULL};
  ipcref_view v[2];
  void *alloc = NULL;
  struct relcount rc[2];
  char h[64] = "", hh[80];
  memset(rc, 0, sizeof rc);
  knob(k, "HOSTPTR", "none");
  kid_open(&ch, 1, SOCK_SEQPACKET);
  a.k = k;
  a.peer = ch.their_sock[0];
  a.ctl = ch.their_ctl;
  kid_fork(&ch, wrap_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  CHECK_EQ(g_malloc(&d, WRAP_ALLOC, &alloc), 0);
  dev_fill(&d, alloc, WRAP_ALLOC, WRAP_SEED, 0);
  ctx = mkctx(SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  for (i = 0; i < 2; i++) {
    void *ptr = (char *)alloc + wrap_off[i];
    CHECK_EQ(g_wrap(ctx, k, 0, ptr, wrap_len[i], count_release, &rc[i], &b[i]),
             IPCREF_OK);
    if (!b[i]) goto done;
    CHECK(ipcref_buf_data(b[i]) == ptr);
    CHECK(ipcref_buf_is_shared(b[i]));
    check_dev(b[i], k->type, 0);
    v[i] = u32_view(b[i], wrap_len[i]);
    CHECK_EQ(ipcref_send_on(p, &v[i], NULL), IPCREF_OK);
    ipcref_view_release(&v[i]);
  }
  /* Wrap 0: the producer lets go first, then the consumer. */
  ipcref_buf_release(b[0]);
  ipcref_collect(ctx);
  CHECK_EQ(rc[0].n, 0);
  ctl_put(ch.ctl, 10);
  CTL_EXPECT(ch.ctl, 20);
  ipcref_collect(ctx);
  CHECK_EQ(rc[0].n, 1);
  CHECK(rc[0].ptr == (char *)alloc + wrap_off[0]);
  /* Wrap 1: the consumer first, then the producer. */
  ctl_put(ch.ctl, 11);
  CTL_EXPECT(ch.ctl, 21);
  ipcref_collect(ctx);
  CHECK_EQ(rc[1].n, 0);
  ipcref_buf_release(b[1]);
  CHECK_EQ(rc[1].n, 1);
  CHECK(rc[1].ptr == (char *)alloc + wrap_off[1]);
  ipcref_collect(ctx);
  {
    ipcref_stats st = stats_of(ctx);
    CHECK_EQ(st.live_slots, 0);
    CHECK_EQ(st.limbo_blocks, 0);
    CHECK_EQ(st.live_bufs, 0);
  }
  ctl_put(ch.ctl, 99);
  KID_EXIT0(&ch, "consumer");
  /* One export of the allocation's base, one opening in the consumer. */
  LOG_EQ(log_count(getpid(), k->c_get, NULL), 1);
  LOG_OK(log_value(getpid(), k->c_get, k->ok, k->key, NULL, h, sizeof h));
  if (!k->vmm) {
    char base[40];
    snprintf(base, sizeof base, "ptr=%#llx ",
             (unsigned long long)(uintptr_t)alloc);
    LOG_EQ(log_count(getpid(), k->c_get, base), 1);
  } else { /* the allocation g_malloc made, found by its address */
    char made[64] = "";
    LOG_OK(log_value(getpid(), "cuMemCreate", k->ok, k->key, NULL, made,
                     sizeof made));
    LOG_OK(strcmp(made, h) == 0);
  }
  key_is(k, h, hh, sizeof hh);
  LOG_EQ(log_count(0, k->c_open, hh), 1);
  /* (VMM: the export retained the allocation's handle, and released it) */
  LOG_EQ(log_count(0, k->c_close, hh) - log_count(getpid(), k->c_close, hh), 1);
done:
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  CHECK_EQ(rc[0].n, 1);
  CHECK_EQ(rc[1].n, 1);
  /* ipcref never freed the allocation (nor unmapped it): its owner does. */
  LOG_EQ(log_count(getpid(), k->vmm ? "cuMemUnmap" : k->c_free, NULL), 0);
  CHECK_EQ(g_free(&d, alloc, WRAP_ALLOC), 0);
  g_close(&d);
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_wrap_offset, cuda, &K_CUDA)
GPU_TEST(test_wrap_offset, hip, &K_HIP)
GPU_TEST(test_wrap_offset, cuda_vmm, &K_VMM)
GPU_TEST(test_wrap_offset, cuda_pool, &K_POOL)
GPU_TEST(test_wrap_offset, hip_pool, &K_HIP_POOL)

/* ======================================================================== */
/* 3. One allocation reaching a consumer several times (two views on one
 * peer, a third through a second context of the same process and backend)
 * is opened once and closed once, when its last user goes; whatever the
 * driver does on a second open (REOPEN: counted, 208 ALREADY_MAPPED, a new
 * mapping), since ipcref never asks for one. */

struct twice_arg {
  const kind *k;
  int peer1, peer2, ctl;
};

static int twice_child(void *vp) {
  struct twice_arg *a = (struct twice_arg *)vp;
  gdrv d;
  ipcref_ctx *c1, *c2;
  ipcref_peer *p1, *p2;
  ipcref_view v[3];
  void *base[3] = {NULL, NULL, NULL};
  size_t size;
  int i, me = (int)getpid();
  memset(v, 0, sizeof v);
  if (g_open(a->k, &d) != IPCREF_OK) return 1;
  c1 = mkctx(SEG, &d);
  c2 = mkctx(SEG, &d); /* the same backend in a second context */
  p1 = make_peer(c1, a->peer1);
  p2 = make_peer(c2, a->peer2);
  CHECK_EQ(ipcref_recv_on(p1, &v[0], g_tmo, NULL), IPCREF_OK);
  CHECK_EQ(ipcref_recv_on(p1, &v[1], g_tmo, NULL), IPCREF_OK);
  CHECK_EQ(ipcref_recv_on(p2, &v[2], g_tmo, NULL), IPCREF_OK);
  for (i = 0; i < 3; i++) {
    if (!v[i].buf) return 1;
    CHECK_EQ(g_range(&d, ipcref_buf_data(v[i].buf), &base[i], &size), 0);
  }
  CHECK(base[0] == base[1] && base[1] == base[2]);
  CHECK(dev_check(&d, view_ptr(&v[0]), 8192, 0x33, 0));
  CHECK(dev_check(&d, view_ptr(&v[1]), 4096, 0x33, 1024));
  CHECK(dev_check(&d, view_ptr(&v[2]), 8192, 0x44, 0));
  LOG_EQ(log_count(me, a->k->c_open, NULL), 1);
  LOG_EQ(log_count(me, a->k->c_open, a->k->ok), 1);
  /* Still used by c2: not closed when c1 goes. */
  ipcref_view_release(&v[0]);
  ipcref_view_release(&v[1]);
  ipcref_peer_free(p1);
  ipcref_ctx_free(c1);
  LOG_EQ(log_count(me, a->k->c_close, NULL), 0);
  ipcref_view_release(&v[2]);
  ipcref_peer_free(p2);
  ipcref_ctx_free(c2);
  LOG_EQ(log_count(me, a->k->c_close, NULL), 1);
  LOG_EQ(log_count(me, a->k->c_close, a->k->ok), 1);
  ctl_put(a->ctl, 1);
  CTL_EXPECT(a->ctl, 2);
  g_close(&d);
  return 0;
}

static void test_import_twice(const kind *k) {
  static const char *const reopen[] = {NULL, "208", "new"};
  int r;
  for (r = 0; r < 3; r++) {
    struct twice_arg a;
    kid ch;
    pid_t pid;
    gdrv d;
    ipcref_ctx *ctx;
    ipcref_peer *pa, *pb;
    ipcref_buf *b0 = NULL, *b1 = NULL;
    ipcref_view v0, v0s, v1;
    char h[64] = "", hh[80];
    knob(k, "REOPEN", reopen[r]);
    kid_open(&ch, 2, SOCK_SEQPACKET);
    a.k = k;
    a.peer1 = ch.their_sock[0];
    a.peer2 = ch.their_sock[1];
    a.ctl = ch.their_ctl;
    pid = kid_fork(&ch, twice_child, &a, -1);
    if (g_open(k, &d) != IPCREF_OK) {
      KID_END(&ch, "consumer");
      return;
    }
    ctx = mkctx(SEG, &d);
    pa = kid_peer(&ch, 0, ctx);
    pb = kid_peer(&ch, 1, ctx);
    CHECK_EQ(g_alloc(ctx, k, 0, 8192, &b0), IPCREF_OK);
    CHECK_EQ(g_alloc(ctx, k, 0, 8192, &b1), IPCREF_OK); /* same segment */
    if (b0 && b1) {
      dev_fill(&d, ipcref_buf_data(b0), 8192, 0x33, 0);
      dev_fill(&d, ipcref_buf_data(b1), 8192, 0x44, 0);
      v0 = u32_view(b0, 8192);
      v1 = u32_view(b1, 8192);
      CHECK_EQ(ipcref_view_slice(&v0, 0, 1024, 2048, 1, &v0s), IPCREF_OK);
      CHECK_EQ(ipcref_send_on(pa, &v0, NULL), IPCREF_OK);
      CHECK_EQ(ipcref_send_on(pa, &v0s, NULL), IPCREF_OK);
      CHECK_EQ(ipcref_send_on(pb, &v1, NULL), IPCREF_OK);
      ipcref_view_release(&v0);
      ipcref_view_release(&v0s);
      ipcref_view_release(&v1);
    }
    ipcref_buf_release(b0);
    ipcref_buf_release(b1);
    CTL_EXPECT(ch.ctl, 1);
    ctl_put(ch.ctl, 2);
    KID_EXIT0(&ch, "consumer");
    ipcref_collect(ctx);
    {
      ipcref_stats st = stats_of(ctx);
      CHECK_EQ(st.live_slots, 0);
      CHECK_EQ(st.limbo_blocks, 0);
    }
    LOG_EQ(log_count(getpid(), k->c_get, NULL), 1);
    LOG_OK(log_value(getpid(), k->c_get, k->ok, k->key, NULL, h, sizeof h));
    key_is(k, h, hh, sizeof hh);
    LOG_EQ(log_count(pid, k->c_open, hh), 1);
    LOG_EQ(log_count(pid, k->c_close, hh), 1);
    LOG_EQ(log_count(0, NULL, "AlreadyMapped"), 0);
    LOG_EQ(log_count(0, NULL, "ALREADY_MAPPED"), 0);
    ipcref_peer_free(pa);
    ipcref_peer_free(pb);
    ipcref_ctx_free(ctx);
    g_close(&d);
    kid_close(&ch);
    /* The next round's log: a fresh file. */
    snprintf(g_log, sizeof g_log, "%s/%02d_import_twice_%s_%d.log", g_tmp,
             ++g_seq, k->name, r + 1);
    knob(&K_CUDA, "LOG", g_log);
    knob(&K_HIP, "LOG", g_log);
  }
}
GPU_TEST(test_import_twice, cuda, &K_CUDA)
GPU_TEST(test_import_twice, hip, &K_HIP)

/* ======================================================================== */
/* 4. Ordering without blocking. The producer's writes take WORK_US on its
 * stream; the consumer's stream waits on the producer's event before the
 * data is used (CUDA), or the producer synchronized its stream before the
 * hand-off (HIP 5). The consumer's release is fenced: it returns at once,
 * the lease stays out until the consumer's work completed, and a later
 * call on the context hands it back. */

static int g_work_us, g_fence_us;

struct order_arg {
  const kind *k;
  int peer, ctl;
};

static int order_child(void *vp) {
  struct order_arg *a = (struct order_arg *)vp;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v;
  ipcref_stats st;
  void *stream = NULL;
  long t0, t1;
  int me = (int)getpid(), iw, iu;
  long long pending = -1;
  memset(&v, 0, sizeof v);
  if (g_open(a->k, &d) != IPCREF_OK) return 1;
  CHECK_EQ(g_stream(&d, &stream), 0);
  ctx = mkctx(SEG, &d);
  p = make_peer(ctx, a->peer);
  CHECK_EQ(ipcref_recv_on(p, &v, g_tmo, stream), IPCREF_OK);
  if (!v.buf) return 1;
  if (!a->k->hip) {
    /* The stream waits for the producer's work, which is still running. */
    LOG_EQ(log_count(me, a->k->c_wait, a->k->ok), 1);
    LOG_OK(log_value(me, a->k->c_wait, a->k->ok, "pending_us=", &pending, NULL,
                     0));
    CHECK(pending > 0);
  } else {
    LOG_EQ(log_count(0, a->k->c_wait, NULL), 0);
  }
  /* Use: a copy ordered after the stream (the fake's legacy stream waits
   * for the blocking streams, as CUDA's does). */
  CHECK(dev_check(&d, view_ptr(&v), 4096, 0x77, 0));
  if (!a->k->hip) {
    iw = log_index(me, a->k->c_wait, NULL, 0);
    iu = log_index(me, "cuMemcpyDtoH_v2", NULL, 0);
    LOG_OK(iw >= 0 && iu > iw);
  }
  /* The release: the consumer's work on the stream takes FENCE_US; the
   * release does not wait for it. */
  knob_num(a->k, "WORK_US", g_fence_us);
  g_work(&d, stream);
  t0 = now_ms();
  ipcref_view_release(&v);
  t1 = now_ms();
  CHECK(t1 - t0 < g_fence_us / 2000.0);
  st = stats_of(ctx);
  CHECK_EQ(st.deferred, 1);
  CHECK_EQ(st.imported_bufs, 1);
  ctl_put(a->ctl, 1); /* released, deferred */
  CTL_EXPECT(a->ctl, 2);
  /* Past the work: ipcref_collect alone hands the lease back. */
  while (now_ms() < t0 + g_fence_us / 1000 + 20) sleep_us(5 * 1000L);
  ipcref_collect(ctx);
  ctl_put(a->ctl, 3);
  CTL_EXPECT(a->ctl, 4);
  st = stats_of(ctx);
  CHECK_EQ(st.deferred, 0);
  st = stats_of(ctx); /* (the first one returned it: counted by the next) */
  CHECK_EQ(st.imported_bufs, 0);
  ctl_put(a->ctl, 5);
  CTL_EXPECT(a->ctl, 6);
  /* No thread of the consumer ever waited on the driver. */
  LOG_EQ(log_count(me, a->k->c_sync, NULL), 0);
  LOG_EQ(log_count(me, a->k->hip ? "hipEventSynchronize" : "cuEventSynchronize",
                   NULL),
         0);
  LOG_EQ(log_count(me, a->k->hip ? "hipDeviceSynchronize" : "cuCtxSynchronize",
                   NULL),
         0);
  LOG_OK(log_count(me, a->k->hip ? "hipEventQuery" : "cuEventQuery",
                   a->k->hip ? "hipErrorNotReady" : "CUDA_ERROR_NOT_READY") >=
         1);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_stream_free(&d, stream);
  g_close(&d);
  return 0;
}

static void test_stream_order(const kind *k) {
  struct order_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *b = NULL;
  ipcref_view v;
  ipcref_stats st;
  void *stream = NULL;
  long t0, t1;
  knob(k, "HOSTPTR", "none");
  knob_num(k, "WORK_US", g_work_us);
  kid_open(&ch, 1, SOCK_SEQPACKET);
  a.k = k;
  a.peer = ch.their_sock[0];
  a.ctl = ch.their_ctl;
  kid_fork(&ch, order_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  CHECK_EQ(g_stream(&d, &stream), 0);
  ctx = mkctx(SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  CHECK_EQ(g_alloc(ctx, k, 0, 4096, &b), IPCREF_OK);
  if (!b) goto done;
  dev_fill(&d, ipcref_buf_data(b), 4096, 0x77, 0);
  g_work(&d, stream); /* the kernel that wrote it, still running */
  v = u32_view(b, 4096);
  ipcref_buf_release(b);
  CHECK(ipcref_peer_pid(p) > 0); /* its hello is in: no wait in the send */
  t0 = now_ms();
  CHECK_EQ(ipcref_send_on(p, &v, stream), IPCREF_OK);
  t1 = now_ms();
  if (!k->hip) { /* the producer never waits */
    CHECK(t1 - t0 < g_work_us / 2000.0);
    LOG_EQ(log_count(getpid(), k->c_sync, NULL), 0);
  } else { /* HIP 5: it waits for its own stream, before the hand-off */
    long long waited = 0;
    CHECK(t1 - t0 >= g_work_us / 2000.0);
    LOG_EQ(log_count(getpid(), k->c_sync, k->ok), 1);
    LOG_OK(
        log_value(getpid(), k->c_sync, NULL, "waited_us=", &waited, NULL, 0));
    CHECK(waited > 0);
  }
  ipcref_view_release(&v);
  CTL_EXPECT(ch.ctl, 1); /* the consumer released: deferred */
  ipcref_collect(ctx);
  st = stats_of(ctx);
  CHECK_EQ(st.live_slots, 1);
  CHECK_EQ(st.limbo_blocks, 1);
  ctl_put(ch.ctl, 2);
  CTL_EXPECT(ch.ctl, 3); /* its work completed, and it called ipcref_collect */
  ipcref_collect(ctx);
  st = stats_of(ctx);
  if (st.live_slots != 0)
    printf("    ipcref_collect did not hand back the consumer's deferred "
           "release (live_slots %zu)\n",
           st.live_slots);
  CHECK_EQ(st.live_slots, 0);
  ctl_put(ch.ctl, 4);
  CTL_EXPECT(ch.ctl, 5); /* and ipcref_ctx_stats */
  ipcref_collect(ctx);
  st = stats_of(ctx);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  ctl_put(ch.ctl, 6);
  KID_EXIT0(&ch, "consumer");
  if (k->hip) /* the producer's wait came before the consumer's open */
    LOG_OK(log_index(getpid(), k->c_sync, NULL, 0) <
           log_index(0, k->c_open, NULL, 0));
done:
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_stream_free(&d, stream);
  g_close(&d);
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_stream_order, cuda, &K_CUDA)
GPU_TEST(test_stream_order, hip, &K_HIP)
GPU_TEST(test_stream_order, cuda_vmm, &K_VMM)
GPU_TEST(test_stream_order, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_stream_order, cuda_pool, &K_POOL)
GPU_TEST(test_stream_order, hip_pool, &K_HIP_POOL)

/* A segment already mapped is waited on the same way: each view's event,
 * each time (CUDA); the producer synchronizes before each hand-off (HIP). */

static int cached_child(void *vp) {
  struct order_arg *a = (struct order_arg *)vp;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v[2];
  void *stream = NULL;
  long long pending[4] = {0, 0, 0, 0};
  int me = (int)getpid(), i;
  long end;
  memset(v, 0, sizeof v);
  if (g_open(a->k, &d) != IPCREF_OK) return 1;
  CHECK_EQ(g_stream(&d, &stream), 0);
  ctx = mkctx(SEG, &d);
  p = make_peer(ctx, a->peer);
  for (i = 0; i < 2; i++) {
    CHECK_EQ(ipcref_recv_on(p, &v[i], g_tmo, stream), IPCREF_OK);
    if (!v[i].buf) return 1;
    CHECK(dev_check(&d, view_ptr(&v[i]), 4096, 0x50 + (uint32_t)i, 0));
    ctl_put(a->ctl, 1 + i);
  }
  /* the second: cached (pool memory: imported again, the first import
   * was freed with its buffer) */
  LOG_EQ(log_count(me, a->k->c_open, NULL), a->k->pool ? 2 : 1);
  if (!a->k->hip) {
    LOG_EQ(log_values(me, a->k->c_wait, a->k->ok, "pending_us=", pending, 4),
           2);
    CHECK(pending[0] > 0);
    CHECK(pending[1] > 0);
  } else {
    LOG_EQ(log_count(0, a->k->c_wait, NULL), 0);
  }
  ipcref_view_release(&v[0]);
  ipcref_view_release(&v[1]);
  end = now_ms() + g_tmo;
  while (stats_of(ctx).deferred != 0 && now_ms() < end) sleep_us(2 * 1000L);
  CHECK_EQ(stats_of(ctx).deferred, 0);
  ctl_put(a->ctl, 3);
  CTL_EXPECT(a->ctl, 4);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_stream_free(&d, stream);
  g_close(&d);
  return 0;
}

static void test_wait_cached(const kind *k) {
  int i;
  struct order_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *b[2] = {NULL, NULL};
  void *stream = NULL;
  knob_num(k, "WORK_US", g_work_us);
  kid_open(&ch, 1, SOCK_SEQPACKET);
  a.k = k;
  a.peer = ch.their_sock[0];
  a.ctl = ch.their_ctl;
  kid_fork(&ch, cached_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  CHECK_EQ(g_stream(&d, &stream), 0);
  ctx = mkctx(SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  for (i = 0; i < 2; i++) { /* two blocks of one segment */
    CHECK_EQ(g_alloc(ctx, k, 0, 4096, &b[i]), IPCREF_OK);
    if (!b[i]) goto done;
    dev_fill(&d, ipcref_buf_data(b[i]), 4096, 0x50 + (uint32_t)i, 0);
  }
  for (i = 0; i < 2; i++) {
    ipcref_view v = u32_view(b[i], 4096);
    g_work(&d, stream);
    CHECK_EQ(ipcref_send_on(p, &v, stream), IPCREF_OK);
    ipcref_view_release(&v);
    ipcref_buf_release(b[i]);
    CTL_EXPECT(ch.ctl, 1 + i);
  }
  CTL_EXPECT(ch.ctl, 3);
  ipcref_collect(ctx);
  CHECK_EQ(stats_of(ctx).live_slots, 0);
  CHECK_EQ(stats_of(ctx).limbo_blocks, 0);
  ctl_put(ch.ctl, 4);
  KID_EXIT0(&ch, "consumer");
  LOG_EQ(log_count(getpid(), k->c_get, NULL), k->pool ? 2 : 1);
  if (k->hip) LOG_EQ(log_count(getpid(), k->c_sync, k->ok), 2);
done:
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_stream_free(&d, stream);
  g_close(&d);
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_wait_cached, cuda, &K_CUDA)
GPU_TEST(test_wait_cached, hip, &K_HIP)
GPU_TEST(test_wait_cached, cuda_vmm, &K_VMM)
GPU_TEST(test_wait_cached, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_wait_cached, cuda_pool, &K_POOL)
GPU_TEST(test_wait_cached, hip_pool, &K_HIP_POOL)

/* CUDA's interprocess events come from a pool: as many as were ever
 * outstanding at once, each with its handle made once, reused when their
 * leases end, destroyed by ipcref_cuda_close. */

#define POOL_N 12

struct rounds_arg {
  const kind *k;
  int peer, ctl;
};

static int rounds_child(void *vp) {
  struct rounds_arg *a = (struct rounds_arg *)vp;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v[POOL_N];
  int r, i;
  memset(v, 0, sizeof v);
  if (g_open(a->k, &d) != IPCREF_OK) return 1;
  ctx = mkctx(SEG, &d);
  p = make_peer(ctx, a->peer);
  for (r = 0; r < 2; r++) {
    for (i = 0; i < POOL_N; i++)
      CHECK_EQ(ipcref_recv_on(p, &v[i], g_tmo, NULL), IPCREF_OK);
    ctl_put(a->ctl, 1);
    CTL_EXPECT(a->ctl, 2);
    for (i = 0; i < POOL_N; i++) ipcref_view_release(&v[i]);
    CHECK_EQ(stats_of(ctx).deferred, 0);
    ctl_put(a->ctl, 3);
  }
  CTL_EXPECT(a->ctl, 4);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
  return 0;
}

static void test_event_pool(const kind *k) {
  int r, i, me = (int)getpid();
  struct rounds_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  kid_open(&ch, 1, SOCK_SEQPACKET);
  a.k = k;
  a.peer = ch.their_sock[0];
  a.ctl = ch.their_ctl;
  kid_fork(&ch, rounds_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  ctx = mkctx(SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  for (r = 0; r < 2; r++) {
    for (i = 0; i < POOL_N; i++) {
      ipcref_buf *b = NULL;
      ipcref_view v;
      CHECK_EQ(g_alloc(ctx, k, 0, 4096, &b), IPCREF_OK);
      if (!b) break;
      v = u32_view(b, 4096);
      CHECK_EQ(ipcref_send_on(p, &v, NULL), IPCREF_OK);
      ipcref_view_release(&v);
      ipcref_buf_release(b);
    }
    CTL_EXPECT(ch.ctl, 1); /* all POOL_N outstanding at once */
    ctl_put(ch.ctl, 2);
    CTL_EXPECT(ch.ctl, 3);
    ipcref_collect(ctx);
    CHECK_EQ(stats_of(ctx).live_slots, 0);
    /* Round 2 reused round 1's events. */
    LOG_EQ(log_count(me, "cuEventCreate", "flags=6 "), POOL_N);
    LOG_EQ(log_count(me, "cuIpcGetEventHandle", k->ok), POOL_N);
    LOG_EQ(log_count(me, "cuEventRecord", k->ok), POOL_N * (r + 1));
  }
  ctl_put(ch.ctl, 4);
  KID_EXIT0(&ch, "consumer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  LOG_EQ(log_count(me, "cuEventDestroy_v2", NULL), 0);
  g_close(&d);
  LOG_EQ(log_count(me, "cuEventDestroy_v2", k->ok), POOL_N);
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_event_pool, cuda, &K_CUDA)

/* ======================================================================== */
/* 5. Out of device memory with a full limbo: the allocation sweeps the
 * limbo and retries, and succeeds once the consumer let go; what can never
 * fit gives IPCREF_ENOMEM with the driver's out-of-memory named. */

#define OOM_SEG ((size_t)65536)

struct hold_arg {
  const kind *k;
  int peer, ctl, n;
};

/* Receives n views, says so (1), releases them when told (2 -> 3), and
 * waits to be told to go (4). Killed in case 6 instead. */
static int hold_child(void *vp) {
  struct hold_arg *a = (struct hold_arg *)vp;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v[16];
  int i;
  memset(v, 0, sizeof v);
  if (g_open(a->k, &d) != IPCREF_OK) return 1;
  ctx = mkctx(SEG, &d);
  p = make_peer(ctx, a->peer);
  for (i = 0; i < a->n; i++)
    CHECK_EQ(ipcref_recv_on(p, &v[i], g_tmo, NULL), IPCREF_OK);
  ctl_put(a->ctl, 1);
  CTL_EXPECT(a->ctl, 2);
  for (i = 0; i < a->n; i++) ipcref_view_release(&v[i]);
  CHECK_EQ(stats_of(ctx).imported_bufs, 0);
  ctl_put(a->ctl, 3);
  CTL_EXPECT(a->ctl, 4);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
  return 0;
}

static void test_oom_sweep(const kind *k) {
  int i;
  struct hold_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *b[2] = {NULL, NULL}, *c = NULL, *other = NULL, *big = NULL,
             *e = NULL;
  ipcref_stats st;
  uint64_t sweeps;
  ipcref_result r;
  knob_num(k, "MEM_LIMIT", (long long)(2 * OOM_SEG));
  knob_num(k, "GRANULARITY", (long long)OOM_SEG); /* VMM: no rounding up */
  kid_open(&ch, 1, SOCK_SEQPACKET);
  a.k = k;
  a.peer = ch.their_sock[0];
  a.ctl = ch.their_ctl;
  a.n = 2;
  kid_fork(&ch, hold_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  ctx = mkctx(OOM_SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  /* Two blocks of a segment each: the device is full. */
  for (i = 0; i < 2; i++) {
    ipcref_view v;
    CHECK_EQ(g_alloc(ctx, k, 0, OOM_SEG, &b[i]), IPCREF_OK);
    if (!b[i]) goto done;
    v = u32_view(b[i], OOM_SEG);
    CHECK_EQ(ipcref_send_on(p, &v, NULL), IPCREF_OK);
    ipcref_view_release(&v);
    ipcref_buf_release(b[i]);
  }
  CTL_EXPECT(ch.ctl, 1);
  st = stats_of(ctx);
  CHECK_EQ(st.limbo_blocks, 2);
  CHECK_EQ(st.device_bytes, 2 * OOM_SEG);
  /* The consumer holds both: nothing to sweep, no memory. */
  r = g_alloc(ctx, k, 0, OOM_SEG, &c);
  st = stats_of(ctx);
  CHECK_EQ(r, IPCREF_ENOMEM);
  CHECK(c == NULL);
  CHECK(strstr(g_err(k), k->oom) != NULL);
  if (r != IPCREF_ENOMEM || !strstr(g_err(k), k->oom))
    printf("    ipcref_%s_error(): \"%s\"\n", k->name, g_err(k));
  if (c) ipcref_buf_release(c);
  c = NULL;
  /* It lets go; nobody sweeps; the next allocation does, and succeeds. */
  sweeps = st.sweeps;
  ctl_put(ch.ctl, 2);
  CTL_EXPECT(ch.ctl, 3);
  {
    int fails = log_count(getpid(), k->c_alloc, k->oom);
    int made = log_count(getpid(), k->c_alloc, k->ok);
    uint64_t hits = st.cache_hits;
    CHECK_EQ(g_alloc(ctx, k, 0, OOM_SEG, &c), IPCREF_OK);
    /* With no free block, it swept before asking the driver for more: a
     * segment the consumer let go of is reused, the driver is not asked. */
    LOG_EQ(log_count(getpid(), k->c_alloc, k->oom), fails);
    LOG_EQ(log_count(getpid(), k->c_alloc, k->ok), made);
    CHECK_EQ(stats_of(ctx).cache_hits, hits + 1);
  }
  st = stats_of(ctx);
  CHECK(st.sweeps > sweeps);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.live_slots, 0);
  /* The device is full: c, and the other segment, cached. A block of
   * another class fits only once the cache is given back, which the
   * allocation does before it says ENOMEM. */
  CHECK_EQ(st.cached_bytes, OOM_SEG);
  {
    int fails = log_count(getpid(), k->c_alloc, k->oom);
    CHECK_EQ(g_alloc(ctx, k, 0, 16384, &other), IPCREF_OK);
    LOG_OK(log_count(getpid(), k->c_alloc, k->oom) > fails);
    CHECK_EQ(stats_of(ctx).cached_bytes, 0);
  }
  ipcref_buf_release(other); /* its pooled segment is cached */
  /* What can never fit. */
  r = g_alloc(ctx, k, 0, 3 * OOM_SEG, &big);
  CHECK_EQ(r, IPCREF_ENOMEM);
  CHECK(big == NULL);
  CHECK(strstr(g_err(k), k->oom) != NULL);
  /* One more segment's worth still fits beside c. */
  CHECK_EQ(g_alloc(ctx, k, 0, OOM_SEG, &e), IPCREF_OK);
  ipcref_buf_release(c);
  ipcref_buf_release(e);
  ipcref_buf_release(big);
  ctl_put(ch.ctl, 4);
  KID_EXIT0(&ch, "consumer");
done:
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
  /* Every allocation that succeeded was freed. */
  LOG_EQ(log_count(getpid(), k->c_free, k->ok),
         log_count(getpid(), k->c_alloc, k->ok));
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_oom_sweep, cuda, &K_CUDA)
GPU_TEST(test_oom_sweep, hip, &K_HIP)
GPU_TEST(test_oom_sweep, cuda_vmm, &K_VMM)
GPU_TEST(test_oom_sweep, hip_vmm, &K_HIP_VMM)

/* ======================================================================== */
/* 6. A consumer SIGKILLed while it holds device blocks: the producer
 * learns of it through ipcref_ctx_poll_fd (or, under valgrind, which has
 * no pidfd_open, by polling ipcref_collect) and reclaims everything. */

static void test_consumer_killed(const kind *k) {
  int i;
  struct hold_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_stats st;
  const int n = 6; /* 16 KiB blocks in 64 KiB segments: two segments */
  kid_open(&ch, 1, SOCK_SEQPACKET);
  a.k = k;
  a.peer = ch.their_sock[0];
  a.ctl = ch.their_ctl;
  a.n = n;
  kid_fork(&ch, hold_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  ctx = mkctx(OOM_SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  for (i = 0; i < n; i++) {
    ipcref_buf *b = NULL;
    ipcref_view v;
    CHECK_EQ(g_alloc(ctx, k, 0, 16384, &b), IPCREF_OK);
    if (!b) break;
    v = u32_view(b, 16384);
    CHECK_EQ(ipcref_send_on(p, &v, NULL), IPCREF_OK);
    ipcref_view_release(&v);
    ipcref_buf_release(b);
  }
  CTL_EXPECT(ch.ctl, 1); /* it holds them all */
  st = stats_of(ctx);
  CHECK_EQ(st.limbo_blocks, n);
  CHECK_EQ(st.live_slots, n);
  if (!k->pool) CHECK_EQ(st.device_bytes, 2 * OOM_SEG);
  KID_KILL(&ch, "consumer");
  if (!under_valgrind) {
    struct pollfd pf;
    size_t freed = 0;
    pf.fd = ipcref_ctx_poll_fd(ctx);
    pf.events = POLLIN;
    pf.revents = 0;
    CHECK(pf.fd >= 0);
    CHECK_EQ(poll(&pf, 1, g_tmo), 1);
    CHECK_EQ(ipcref_ctx_poll(ctx, 0, &freed), IPCREF_OK);
    CHECK(freed >= (size_t)n * 16384);
  } else {
    long end = now_ms() + g_tmo;
    do {
      ipcref_collect(ctx);
      st = stats_of(ctx);
      if (st.limbo_blocks == 0) break;
      sleep_us(10 * 1000L);
    } while (now_ms() < end);
  }
  st = stats_of(ctx);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.live_bufs, 0);
  CHECK(st.reclaimed >= (uint64_t)n);
  CHECK(st.peer_deaths >= 1);
  /* Both emptied segments are kept for reuse; a trim gives back the
   * oldest to the driver, then the other. (Pool memory went back to its
   * owner, each pointer once its lease was reclaimed.) */
  if (k->pool) {
    LOG_EQ(log_count(getpid(), k->c_free, k->ok), n);
    goto freed;
  }
  CHECK_EQ(st.cached_bytes, 2 * OOM_SEG);
  CHECK_EQ(st.device_bytes, 2 * OOM_SEG);
  CHECK_EQ(ipcref_ctx_trim(ctx, OOM_SEG), OOM_SEG);
  LOG_EQ(log_count(getpid(), k->c_free, k->ok), 1);
  CHECK_EQ(ipcref_ctx_trim(ctx, 0), OOM_SEG);
freed:
  st = stats_of(ctx);
  CHECK_EQ(st.device_bytes, 0);
  CHECK_EQ(st.cached_bytes, 0);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
  LOG_EQ(log_count(getpid(), k->c_alloc, k->ok), k->pool ? n : 2);
  LOG_EQ(log_count(getpid(), k->c_free, k->ok), k->pool ? n : 2);
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_consumer_killed, cuda, &K_CUDA)
GPU_TEST(test_consumer_killed, hip, &K_HIP)
GPU_TEST(test_consumer_killed, cuda_vmm, &K_VMM)
GPU_TEST(test_consumer_killed, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_consumer_killed, cuda_pool, &K_POOL)
GPU_TEST(test_consumer_killed, hip_pool, &K_HIP_POOL)

/* ======================================================================== */
/* 7. Errors. */

/* No driver, a stub, no device: ENODEV, with a message that says which. */
static void expect_open_fails(const kind *k, const char *path,
                              const char *says) {
  ipcref_result r;
  void *out = (void *)&r; /* must stay untouched */
  if (k->hip)
    r = ipcref_hip_open(path, (ipcref_hip **)&out);
  else
    r = ipcref_cuda_open(path, (ipcref_cuda **)&out);
  CHECK_EQ(r, IPCREF_ENODEV);
  CHECK(out == (void *)&r);
  if (!strstr(g_err(k), says)) {
    printf("    %s open of %s: \"%s\", expected it to mention \"%s\"\n",
           k->name, path ? path : "(default)", g_err(k), says);
    CHECK(!"message");
  }
}

static void test_open_errors(const kind *k) {
  char missing[128];
  snprintf(missing, sizeof missing, "%s/no-such-driver.so", g_tmp);
  expect_open_fails(k, missing, "could not be loaded");
  if (!k->hip) {
    struct stat sb;
    CHECK(stat(g_stub, &sb) == 0);
    expect_open_fails(k, g_stub, "stub");
    knob(k, "MODE", "stub");
    expect_open_fails(k, k->path, "stub");
    knob(k, "MODE", "nodevice");
    expect_open_fails(k, k->path, "no CUDA-capable device");
    knob(k, "MODE", NULL);
    knob(k, "DEVICES", "0");
    expect_open_fails(k, k->path, "no CUDA-capable device");
    knob(k, "DEVICES", NULL);
    /* A driver without an entry point the backend needs (the last looked
     * up, and one in the middle of the table). */
    knob(k, "HIDE", "cuDriverGetVersion");
    expect_open_fails(k, k->path, "lacks cuDriverGetVersion");
    knob(k, "HIDE", "cuIpcGetEventHandle");
    expect_open_fails(k, k->path, "lacks cuIpcGetEventHandle");
    knob(k, "HIDE", NULL);
  } else {
    knob(k, "MODE", "nodevice");
    expect_open_fails(k, k->path, "no ROCm-capable device");
    knob(k, "MODE", NULL);
    knob(k, "DEVICES", "0");
    expect_open_fails(k, k->path, "no ROCm-capable device");
    knob(k, "DEVICES", NULL);
    /* The real HIP 5 runtime, where installed (no GPU here; not under
     * valgrind: ROCm's libraries keep what they allocate at load). */
    if (g_hip_real && !under_valgrind)
      expect_open_fails(k, g_hip_real, "no ROCm-capable device");
  }
  /* And then it opens, with nothing left of the failures. */
  {
    gdrv d;
    if (g_open(k, &d) == IPCREF_OK) {
      CHECK_EQ(strcmp(g_err(k), ""), 0);
      g_close(&d);
    }
  }
}
GPU_TEST(test_open_errors, cuda, &K_CUDA)
GPU_TEST(test_open_errors, hip, &K_HIP)

/* The consumer in the exporting process (both ends of a socketpair here,
 * in two contexts on one backend): the handle resolves to the producer's
 * own pointer, with no IPC open (which the driver refuses there). */
static void test_self_import(const kind *k) {
  int sv[2];
  gdrv d;
  ipcref_ctx *ca, *cb;
  ipcref_peer *pa, *pb;
  ipcref_buf *b = NULL;
  ipcref_view v, w;
  memset(&w, 0, sizeof w);
  knob(k, "HOSTPTR", "none");
  xsocketpair(SOCK_SEQPACKET, sv);
  if (g_open(k, &d) != IPCREF_OK) {
    tclose(sv[0]);
    tclose(sv[1]);
    return;
  }
  ca = mkctx(SEG, &d);
  cb = mkctx(SEG, &d);
  pa = make_peer(ca, sv[0]);
  pb = make_peer(cb, sv[1]);
  CHECK_EQ(g_alloc(ca, k, 0, 4096, &b), IPCREF_OK);
  if (b) {
    dev_fill(&d, ipcref_buf_data(b), 4096, 0x99, 0);
    v = u32_view(b, 4096);
    CHECK_EQ(ipcref_send_on(pa, &v, NULL), IPCREF_OK);
    CHECK_EQ(ipcref_recv_on(pb, &w, g_tmo, NULL), IPCREF_OK);
    if (w.buf) {
      CHECK(ipcref_buf_data(w.buf) == ipcref_buf_data(b));
      check_dev(w.buf, k->type, 0);
      CHECK(dev_check(&d, view_ptr(&w), 4096, 0x99, 0));
    }
    ipcref_view_release(&v);
    ipcref_buf_release(b);
    ipcref_view_release(&w);
  }
  LOG_EQ(log_count(0, k->c_open, NULL), 0);
  LOG_EQ(log_count(0, k->c_close, NULL), 0);
  ipcref_collect(ca);
  {
    ipcref_stats st = stats_of(ca);
    CHECK_EQ(st.live_slots, 0);
    CHECK_EQ(st.limbo_blocks, 0);
  }
  CHECK_EQ(stats_of(cb).imported_bufs, 0);
  ipcref_peer_free(pa);
  ipcref_peer_free(pb);
  ipcref_ctx_free(cb);
  ipcref_ctx_free(ca);
  g_close(&d);
  LOG_EQ(log_count(getpid(), k->c_free, k->ok), 1);
}
GPU_TEST(test_self_import, cuda, &K_CUDA)
GPU_TEST(test_self_import, hip, &K_HIP)
GPU_TEST(test_self_import, cuda_vmm, &K_VMM)
GPU_TEST(test_self_import, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_self_import, cuda_pool, &K_POOL)
GPU_TEST(test_self_import, hip_pool, &K_HIP_POOL)

/* Wrapped memory shared by handle: the backend notes the allocation's
 * handle once (the handle of ours gives its own address back), counted
 * by the segments exported with it, two contexts wrapping it here; when
 * the last of them goes, so does the note. Else the notes grew by one
 * each time the allocation was wrapped again, and its old handle still
 * named whatever the driver put at its address after the owner freed it. */
static void wrap_round(const kind *k, ipcref_ctx *ctx, ipcref_peer *to,
                       ipcref_peer *from, void *alloc, ipcref_buf **b) {
  ipcref_view v, w;
  CHECK_EQ(g_wrap(ctx, k, 0, alloc, 4096, NULL, NULL, b), IPCREF_OK);
  if (!*b) return;
  v = u32_view(*b, 4096);
  CHECK_EQ(ipcref_send_on(to, &v, NULL), IPCREF_OK);
  ipcref_view_release(&v);
  CHECK_EQ(ipcref_recv_on(from, &w, g_tmo, NULL), IPCREF_OK);
  if (w.buf) CHECK(ipcref_buf_data(w.buf) == alloc);
  ipcref_view_release(&w);
}
static int names_ours(gdrv *d, const unsigned char *h, void *alloc) {
  uint64_t addr = 0;
  ipcref_result r = d->be->seg_import(d->be, 0, h, &addr);
  if (r == IPCREF_OK && addr != (uint64_t)(uintptr_t)alloc)
    d->be->seg_close(d->be, 0, addr); /* opened: not ours */
  return r == IPCREF_OK && addr == (uint64_t)(uintptr_t)alloc;
}
static void test_wrap_export_forgotten(const kind *k) {
  int sv[2], sw[2], round;
  gdrv d;
  ipcref_ctx *ca, *cb, *cc;
  ipcref_peer *pa, *pb, *pc, *pd;
  ipcref_buf *b = NULL, *b2 = NULL;
  void *alloc = NULL;
  unsigned char h[IPCREF_HANDLE_BYTES];
  xsocketpair(SOCK_SEQPACKET, sv);
  xsocketpair(SOCK_SEQPACKET, sw);
  if (g_open(k, &d) != IPCREF_OK) {
    tclose(sv[0]), tclose(sv[1]), tclose(sw[0]), tclose(sw[1]);
    return;
  }
  ca = mkctx(SEG, &d);
  cb = mkctx(SEG, &d);
  cc = mkctx(SEG, &d);
  pa = make_peer(ca, sv[0]);
  pb = make_peer(cb, sv[1]);
  pc = make_peer(cc, sw[0]);
  pd = make_peer(cb, sw[1]);
  CHECK_EQ(g_malloc(&d, 65536, &alloc), 0);
  for (round = 0; round < 20 && alloc; round++) { /* wrapped again, anew */
    wrap_round(k, ca, pa, pb, alloc, &b);
    if (round == 0) { /* its handle, as the backend gives it */
      CHECK_EQ(d.be->seg_export(d.be, 0, (uint64_t)(uintptr_t)alloc, h),
               IPCREF_OK);
      d.be->seg_forget(d.be, 0, (uint64_t)(uintptr_t)alloc);
      CHECK(names_ours(&d, h, alloc));
    }
    ipcref_buf_release(b);
    ipcref_collect(ca);
    CHECK(!names_ours(&d, h, alloc)); /* the wrap went: forgotten */
  }
  /* Two contexts wrap it: one going leaves it named. */
  wrap_round(k, ca, pa, pb, alloc, &b);
  wrap_round(k, cc, pc, pd, alloc, &b2);
  ipcref_buf_release(b);
  ipcref_collect(ca);
  CHECK(names_ours(&d, h, alloc));
  ipcref_buf_release(b2);
  ipcref_collect(cc);
  CHECK(!names_ours(&d, h, alloc));
  CHECK_EQ(stats_of(ca).live_bufs, 0);
  CHECK_EQ(stats_of(cc).live_bufs, 0);
  ipcref_peer_free(pa);
  ipcref_peer_free(pb);
  ipcref_peer_free(pc);
  ipcref_peer_free(pd);
  ipcref_ctx_free(cc);
  ipcref_ctx_free(cb);
  ipcref_ctx_free(ca);
  if (alloc) CHECK_EQ(g_free(&d, alloc, 65536), 0);
  g_close(&d);
}
GPU_TEST(test_wrap_export_forgotten, cuda, &K_CUDA)
GPU_TEST(test_wrap_export_forgotten, hip, &K_HIP)

/* One context in this process with both peers of a socketpair in it. */
typedef struct one_ctx {
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *pa, *pb;
} one_ctx;

/* 0 when the driver cannot be opened (g_open said why). */
static int one_ctx_open(const kind *k, one_ctx *o) {
  int sv[2];
  xsocketpair(SOCK_SEQPACKET, sv);
  if (g_open(k, &o->d) != IPCREF_OK) {
    tclose(sv[0]);
    tclose(sv[1]);
    return 0;
  }
  o->ctx = mkctx(SEG, &o->d);
  o->pa = make_peer(o->ctx, sv[0]);
  o->pb = make_peer(o->ctx, sv[1]);
  return 1;
}

/* Everything came back; then all goes. */
static void one_ctx_close(one_ctx *o) {
  ipcref_stats st;
  ipcref_collect(o->ctx);
  st = stats_of(o->ctx);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(st.imported_bufs, 0);
  ipcref_peer_free(o->pa);
  ipcref_peer_free(o->pb);
  ipcref_ctx_free(o->ctx);
  g_close(&o->d);
}

/* The same within one context: both peers of the socketpair in it. */
static void test_self_import_one_ctx(const kind *k) {
  one_ctx o;
  ipcref_buf *b = NULL;
  ipcref_view v, w;
  memset(&w, 0, sizeof w);
  if (!one_ctx_open(k, &o)) return;
  CHECK_EQ(g_alloc(o.ctx, k, 0, 4096, &b), IPCREF_OK);
  if (b) {
    dev_fill(&o.d, ipcref_buf_data(b), 4096, 0x98, 0);
    v = u32_view(b, 4096);
    CHECK_EQ(ipcref_send_on(o.pa, &v, NULL), IPCREF_OK);
    CHECK_EQ(ipcref_recv_on(o.pb, &w, g_tmo, NULL), IPCREF_OK);
    if (w.buf) {
      CHECK(ipcref_buf_data(w.buf) == ipcref_buf_data(b));
      CHECK(dev_check(&o.d, view_ptr(&w), 4096, 0x98, 0));
    }
    ipcref_view_release(&v);
    ipcref_buf_release(b);
    ipcref_view_release(&w);
  }
  LOG_EQ(log_count(0, k->c_open, NULL), 0);
  one_ctx_close(&o);
}
GPU_TEST(test_self_import_one_ctx, cuda, &K_CUDA)
GPU_TEST(test_self_import_one_ctx, hip, &K_HIP)
GPU_TEST(test_self_import_one_ctx, cuda_vmm, &K_VMM)
GPU_TEST(test_self_import_one_ctx, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_self_import_one_ctx, cuda_pool, &K_POOL)
GPU_TEST(test_self_import_one_ctx, hip_pool, &K_HIP_POOL)

/* The bytes of the segment or ledger record at `rec` (src/share_wire.h):
 * kinds 3 and 5 carry 64 bytes more, kind 4 a device, kind 6 a device and
 * its chunks' sizes. */
static size_t rec_bytes(const unsigned char *rec) {
  switch (rec[0]) {
  case 3:
  case 5: return 30 + 72;
  case 4: return 30 + 8;
  case 6: return 30 + 12 + 8 * (size_t)(rec[38] | rec[39] << 8);
  default: return 30;
  }
}

/* Where message m's first view record is: past its header (26 bytes), its
 * segment and ledger records and the ids of the segments it retired. */
static size_t view_at(const ipcref_msg *m) {
  size_t pos = 26;
  int i;
  for (i = 0; i < (int)(m->bytes[8] | m->bytes[9] << 8); i++)
    pos += rec_bytes(m->bytes + pos);
  return pos + 8 * (size_t)(m->bytes[10] | m->bytes[11] << 8);
}

/* Adds `by` to the little-endian u64 at p. */
static void bump_le64(unsigned char *p, uint64_t by) {
  uint64_t v = 0;
  int j;
  for (j = 7; j >= 0; j--) v = v << 8 | p[j];
  v += by;
  for (j = 0; j < 8; j++) p[j] = (unsigned char)(v >> (8 * j));
}

/* A producer that claims a device segment larger than the allocation the
 * driver opens is refused (EPROTO, nothing kept), for that reason; the
 * genuine message still imports. The sizes are patched in a copy: the
 * segment record's (at 22) and the view's (at 20), so that only the
 * driver's own answer can tell. */
static void test_lying_size(const kind *k) {
  one_ctx o;
  size_t pos = 26; /* the records follow the message's header */
  /* VMM: past the whole granule the allocation was rounded up to */
  uint64_t more = k->vmm ? (uint64_t)4 << 20 : 4096;
  const char *why = k->pool  ? "pool memory that its pool's fd and data do "
                               "not give, at its announced size"
                    : k->vmm ? "a device fd that is no shareable allocation "
                               "of its announced size"
                             : "a device handle whose allocation is not the "
                               "one announced";
  int i;
  ipcref_buf *b = NULL;
  ipcref_msg msg, lie;
  ipcref_view v, w;
  memset(&w, 0, sizeof w);
  if (!one_ctx_open(k, &o)) return;
  CHECK_EQ(g_alloc(o.ctx, k, 0, 4096, &b), IPCREF_OK);
  if (b) {
    dev_fill(&o.d, ipcref_buf_data(b), 4096, 0x5a, 0);
    v = u32_view(b, 4096);
    CHECK_EQ(ipcref_export(o.pa, &v, &msg), IPCREF_OK);
    lie = msg;
    for (i = 0; i < lie.nfds; i++)
      lie.fds[i] = fcntl(msg.fds[i], F_DUPFD_CLOEXEC, 0);
    lie.origin_ctx = lie.origin_peer = 0;
    for (i = 0; i < (int)(lie.bytes[8] | lie.bytes[9] << 8); i++) {
      if (lie.bytes[pos] >= 3) bump_le64(lie.bytes + pos + 22, more);
      pos += rec_bytes(lie.bytes + pos); /* a device's, or the ledger's */
    }
    bump_le64(lie.bytes + view_at(&lie) + 20, more);
    ipcref_set_error_hook(&error_hook);
    errors_reset();
    CHECK_EQ(ipcref_import(o.pb, &lie, &w), IPCREF_EPROTO);
    CHECK(w.buf == NULL);
    if (!strstr(err_last, why)) printf("    refused: %s\n", err_last);
    CHECK(strstr(err_last, why) != NULL);
    ipcref_set_error_hook(NULL);
    CHECK_EQ(ipcref_import(o.pb, &msg, &w), IPCREF_OK);
    if (w.buf) CHECK(dev_check(&o.d, view_ptr(&w), 4096, 0x5a, 0));
    ipcref_view_release(&v);
    ipcref_buf_release(b);
    ipcref_view_release(&w);
  }
  one_ctx_close(&o);
}
GPU_TEST(test_lying_size, cuda, &K_CUDA)
GPU_TEST(test_lying_size, hip, &K_HIP)
GPU_TEST(test_lying_size, cuda_vmm, &K_VMM)
GPU_TEST(test_lying_size, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_lying_size, cuda_pool, &K_POOL)
GPU_TEST(test_lying_size, hip_pool, &K_HIP_POOL)

/* ======================================================================== */
/* VMM memory from a hostile producer, in another process: the fd of a
 * segment record replaced by a pipe, or by a memfd that is no allocation,
 * and a record claiming more than the allocation holds. Each is refused
 * (EPROTO) where the driver refuses it (the import, the mapping), and
 * nothing is left mapped. A genuine message goes first (the ledger's
 * record comes with it); each block is over half a segment, so each
 * message brings its own segment record and fd. */

#define VH_BLOCK (SEG / 2 + 4096)
/* The lies: VH_DATA (pool memory only) changes the pointer's data. */
enum { VH_GENUINE, VH_PIPE, VH_MEMFD, VH_SIZE, VH_DATA, VH_N };
static const kind *vh_kind; /* the kind of the case running */

static int vmm_hostile_child(void *vp) {
  kid *ch = (kid *)vp;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_msg m;
  if (g_open(vh_kind, &d) != IPCREF_OK) return 1;
  ctx = mkctx(SEG, &d);
  p = make_peer(ctx, ch->their_sock[0]);
  while (xfer_recv(ch->their_sock[1], &m, g_tmo) == 0) { /* to its end */
    ipcref_view w;
    ipcref_result r;
    memset(&w, 0, sizeof w);
    r = ipcref_import(p, &m, &w);
    if (r == IPCREF_OK) CHECK(dev_check(&d, view_ptr(&w), 4096, 0x3c, 0));
    ipcref_view_release(&w);
    ctl_put(ch->their_ctl, 100 - (int)r);
  }
  /* The genuine one only (pool memory: freed with its buffer) */
  CHECK_EQ(stats_of(ctx).mapped_segments, vh_kind->pool ? 0 : 1);
  CTL_EXPECT(ch->their_ctl, 1);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
  return 0;
}

/* Where message m's first segment record by fd is (kind 4 or 5), and the
 * index of its fd among m's. */
static size_t vh_record(const ipcref_msg *m, int *fd_at) {
  size_t pos = 26;
  int i, fds = 0;
  for (i = 0; i < (int)(m->bytes[8] | m->bytes[9] << 8); i++) {
    int kd = m->bytes[pos];
    if (kd == 4 || kd == 5) { /* by fd: VMM, pool */
      *fd_at = fds;
      return pos;
    }
    fds += kd == 2 ? 2 : kd == 3 ? 0 : 1;
    pos += rec_bytes(m->bytes + pos);
  }
  *fd_at = -1;
  return 0;
}

/* Makes message m (an export of a block whose segment is new to the
 * peer) into lie number `how`. */
static void vh_lie(ipcref_msg *m, int how) {
  int at = -1, pfd[2];
  size_t rec = vh_record(m, &at);
  CHECK(rec > 0 && at >= 0);
  if (!rec || at < 0) return;
  if (how == VH_PIPE) {
    CHECK_EQ(pipe2(pfd, O_CLOEXEC), 0);
    tclose(pfd[1]);
    tclose(m->fds[at]);
    m->fds[at] = pfd[0];
  } else if (how == VH_MEMFD) {
    int fd = memfd_create("not_an_allocation", MFD_CLOEXEC);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)(4 << 20)) == 0);
    tclose(m->fds[at]);
    m->fds[at] = fd;
  } else if (how == VH_SIZE) { /* the record and the view: 4 MiB more */
    bump_le64(m->bytes + rec + 22, (uint64_t)4 << 20);
    bump_le64(m->bytes + view_at(m) + 20, (uint64_t)4 << 20);
  } else if (how == VH_DATA) { /* the pointer's data, after the device */
    int j;
    for (j = 0; j < 8; j++) m->bytes[rec + 38 + j] ^= 0x5a;
  }
}

static void test_vmm_hostile(const kind *k) {
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *b[VH_N] = {NULL, NULL, NULL, NULL, NULL};
  int i, j, child, n = k->pool ? VH_N : VH_DATA; /* VMM: no data */
  vh_kind = k;
  kid_open(&ch, 2, SOCK_SEQPACKET);
  kid_fork(&ch, vmm_hostile_child, &ch, -1);
  child = (int)ch.pid;
  if (g_open(k, &d) != IPCREF_OK) goto out;
  ctx = mkctx(SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  for (i = 0; i < n; i++) { /* all held: no segment is used twice */
    ipcref_view v;
    ipcref_msg m;
    CHECK_EQ(g_alloc(ctx, k, 0, VH_BLOCK, &b[i]), IPCREF_OK);
    if (!b[i]) break;
    dev_fill(&d, ipcref_buf_data(b[i]), 4096, 0x3c, 0);
    v = u32_view(b[i], 4096);
    CHECK_EQ(ipcref_export(p, &v, &m), IPCREF_OK);
    vh_lie(&m, i);
    CHECK_EQ(xfer_send(ch.sock[1], &m), 0);
    for (j = 0; j < m.nfds; j++) tclose(m.fds[j]);
    CTL_EXPECT(ch.ctl, i == VH_GENUINE ? 100 : 100 - (int)IPCREF_EPROTO);
    ipcref_view_release(&v);
  }
  for (i = 0; i < VH_N; i++) ipcref_buf_release(b[i]);
  tclose(ch.sock[1]); /* the child's loop ends */
  ctl_put(ch.ctl, 1);
  KID_EXIT0(&ch, "consumer");
  /* The leases of the refused messages: reclaimed, the consumer died. */
  ipcref_collect(ctx);
  CHECK_EQ(stats_of(ctx).live_slots, 0);
  /* Where the driver refused: the pipe and the memfd at the import, the
   * size at the mapping; every handle imported was released. Pool
   * memory: the pipe and the memfd at the pool's import, the data at the
   * pointer's; the size is checked against the allocation imported,
   * which is freed; the pool was imported once. */
  if (k->vmm) {
    LOG_EQ(log_count(child, "cuMemImportFromShareableHandle",
                     "CUDA_ERROR_INVALID_VALUE"),
           2);
    LOG_EQ(log_count(child, "cuMemMap", "CUDA_ERROR_INVALID_VALUE"), 1);
    LOG_EQ(log_count(child, "cuMemImportFromShareableHandle", k->ok), 2);
    LOG_EQ(log_count(child, "cuMemRelease", k->ok), 2);
    LOG_EQ(log_count(child, "cuMemAddressFree", k->ok), 2);
  } else {
    LOG_EQ(log_count(child, "cuMemPoolImportFromShareableHandle",
                     "CUDA_ERROR_INVALID_VALUE"),
           2);
    LOG_EQ(log_count(child, "cuMemPoolImportFromShareableHandle", k->ok), 1);
    LOG_EQ(
        log_count(child, "cuMemPoolImportPointer", "CUDA_ERROR_INVALID_VALUE"),
        1);
    LOG_EQ(log_count(child, "cuMemPoolImportPointer", k->ok), 2);
    LOG_EQ(log_count(child, "cuMemFree_v2", k->ok), 2);
  }
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_vmm_hostile, cuda_vmm, &K_VMM)
GPU_TEST(test_vmm_hostile, cuda_pool, &K_POOL)

/* ======================================================================== */
/* What ipcref_cuda_alloc makes: by default (AUTO) VMM memory where the
 * device reports both VMM and POSIX fd handles, legacy elsewhere; VMM
 * asked of a device that cannot share so says ENOTSUP, naming why; a VMM
 * segment is whole granules (8 KiB asked, 64 KiB made); the choice takes
 * only valid values, and HIP makes legacy memory only. */

/* The allocation calls of one g_open with the fake's knobs as they are:
 * allocates one 8 KiB segment under `memory` and says which call made it
 * (1 cuMemCreate, 0 cuMemAlloc) and what the allocation returned. */
static int vc_alloc(int memory, ipcref_result *r) {
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_buf *b = NULL;
  int before = log_count(getpid(), "cuMemCreate", K_CUDA.ok), vmm;
  *r = IPCREF_ENODEV;
  if (g_open(&K_CUDA, &d) != IPCREF_OK) return -1;
  CHECK_EQ(ipcref_cuda_set_memory(d.cu, memory), IPCREF_OK);
  ctx = mkctx(8192, &d);
  *r = g_alloc(ctx, &K_CUDA, 0, 8192, &b);
  vmm = log_count(getpid(), "cuMemCreate", K_CUDA.ok) > before;
  ipcref_buf_release(b);
  ipcref_ctx_free(ctx);
  g_close(&d);
  return vmm;
}

static void test_vmm_choice(const kind *k) {
  gdrv d;
  ipcref_result r;
  (void)k;
  knob(&K_CUDA, "GRANULARITY", "65536");
  CHECK_EQ(vc_alloc(IPCREF_CUDA_MEMORY_AUTO, &r), 1);
  CHECK_EQ(r, IPCREF_OK);
  LOG_EQ(log_count(getpid(), "cuMemCreate", "size=65536 "), 1);
  CHECK_EQ(vc_alloc(IPCREF_CUDA_MEMORY_LEGACY, &r), 0);
  CHECK_EQ(r, IPCREF_OK);
  knob(&K_CUDA, "POSIX_FD", "0"); /* VMM, but no fd handles: legacy */
  CHECK_EQ(vc_alloc(IPCREF_CUDA_MEMORY_AUTO, &r), 0);
  CHECK_EQ(r, IPCREF_OK);
  CHECK_EQ(vc_alloc(IPCREF_CUDA_MEMORY_VMM, &r), 0);
  CHECK_EQ(r, IPCREF_ENOTSUP);
  CHECK(strstr(ipcref_cuda_error(), "cannot share memory by fd") != NULL);
  knob(&K_CUDA, "POSIX_FD", NULL);
  knob(&K_CUDA, "VMM", "0"); /* no VMM at all */
  CHECK_EQ(vc_alloc(IPCREF_CUDA_MEMORY_AUTO, &r), 0);
  CHECK_EQ(r, IPCREF_OK);
  CHECK_EQ(vc_alloc(IPCREF_CUDA_MEMORY_VMM, &r), 0);
  CHECK_EQ(r, IPCREF_ENOTSUP);
  knob(&K_CUDA, "VMM", NULL);
  /* The device was asked once per instance (its two attributes). */
  LOG_EQ(log_count(getpid(), "cuDeviceGetAttribute", "attr=102 "), 5);
  /* A choice holds for the segments made after it: a VMM one, then a
   * legacy one, each freed its own way. */
  if (g_open(&K_CUDA, &d) == IPCREF_OK) {
    ipcref_ctx *ctx = mkctx(8192, &d);
    ipcref_buf *b[2] = {NULL, NULL};
    int made = log_count(getpid(), "cuMemCreate", K_CUDA.ok);
    int unmaps = log_count(getpid(), "cuMemUnmap", K_CUDA.ok);
    int frees = log_count(getpid(), "cuMemFree_v2", K_CUDA.ok);
    CHECK_EQ(ipcref_cuda_set_memory(d.cu, IPCREF_CUDA_MEMORY_VMM), IPCREF_OK);
    CHECK_EQ(g_alloc(ctx, &K_CUDA, 0, 8192, &b[0]), IPCREF_OK);
    CHECK_EQ(ipcref_cuda_set_memory(d.cu, IPCREF_CUDA_MEMORY_LEGACY),
             IPCREF_OK);
    CHECK_EQ(g_alloc(ctx, &K_CUDA, 0, 8192, &b[1]), IPCREF_OK);
    ipcref_buf_release(b[0]);
    ipcref_buf_release(b[1]);
    ipcref_ctx_free(ctx);
    g_close(&d);
    LOG_EQ(log_count(getpid(), "cuMemCreate", K_CUDA.ok) - made, 1);
    LOG_EQ(log_count(getpid(), "cuMemUnmap", K_CUDA.ok) - unmaps, 1);
    LOG_EQ(log_count(getpid(), "cuMemFree_v2", K_CUDA.ok) - frees, 1);
  }
  /* Its arguments. */
  CHECK_EQ(ipcref_cuda_set_memory(NULL, IPCREF_CUDA_MEMORY_VMM), IPCREF_EINVAL);
  if (g_open(&K_CUDA, &d) == IPCREF_OK) {
    CHECK_EQ(ipcref_cuda_set_memory(d.cu, 3), IPCREF_EINVAL);
    CHECK_EQ(ipcref_cuda_set_memory(d.cu, -1), IPCREF_EINVAL);
    g_close(&d);
  }
}
GPU_TEST(test_vmm_choice, cuda, &K_CUDA)

static void test_hip_memory(const kind *k) {
  gdrv d;
  if (g_open(k, &d) != IPCREF_OK) return;
  CHECK_EQ(ipcref_hip_set_memory(NULL, IPCREF_HIP_MEMORY_AUTO), IPCREF_EINVAL);
  CHECK_EQ(ipcref_hip_set_memory(d.hp, 3), IPCREF_EINVAL);
  CHECK_EQ(ipcref_hip_set_memory(d.hp, IPCREF_HIP_MEMORY_VMM), IPCREF_OK);
  CHECK_EQ(ipcref_hip_set_memory(d.hp, IPCREF_HIP_MEMORY_LEGACY), IPCREF_OK);
  CHECK_EQ(ipcref_hip_set_memory(d.hp, IPCREF_HIP_MEMORY_AUTO), IPCREF_OK);
  g_close(&d);
}
GPU_TEST(test_hip_memory, hip, &K_HIP)

/* ======================================================================== */
/* VMM memory of another allocator in chunks, as PyTorch's expandable
 * segments map it (64 KiB chunks, one after the other in one range): a
 * pointer in one chunk exports that chunk alone, at its offset; a buffer
 * across three chunks exports the three (an fd each) and the peer maps
 * them one after the other; one across more than IPCREF_CHUNKS_MAX is
 * refused when it is wrapped; a chunk made without the POSIX fd handle
 * type is refused when it is sent, saying so, and the peer goes on. */
#define VC_CHUNK ((size_t)65536)
#define VC_N     (IPCREF_CHUNKS_MAX + 1)

/* Fills (or checks) bytes [from, from + n) of a chunked range, a chunk's
 * part at a time (a copy stays in one mapping), with the pattern's words
 * numbered from the range's start. */
static int vc_pattern(gdrv *d, char *range, size_t from, size_t n, int fill) {
  int ok = 1;
  while (n > 0) {
    size_t part = VC_CHUNK - from % VC_CHUNK;
    if (part > n) part = n;
    if (fill)
      dev_fill(d, range + from, part, 0x77, (uint32_t)(from / 4));
    else
      ok &= dev_check(d, range + from, part, 0x77, (uint32_t)(from / 4));
    from += part;
    n -= part;
  }
  return ok;
}

/* Sends [from, from + n) of `range`, wrapped; the peer (in this process)
 * checks it, through its own mapping of the chunks. */
static void vc_send(one_ctx *o, const kind *k, char *range, size_t from,
                    size_t n) {
  ipcref_buf *b = NULL;
  ipcref_view v, w;
  memset(&w, 0, sizeof w);
  vc_pattern(&o->d, range, from, n, 1);
  CHECK_EQ(g_wrap(o->ctx, k, 0, range + from, n, NULL, NULL, &b), IPCREF_OK);
  if (!b) return;
  v = u32_view(b, n);
  CHECK_EQ(ipcref_send(o->pa, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(o->pb, &w, g_tmo), IPCREF_OK);
  if (w.buf) /* the peer's chunks lie as the owner's do: a part at a time */
    CHECK(vc_pattern(&o->d, (char *)(uintptr_t)((uintptr_t)view_ptr(&w) - from),
                     from, n, 0));
  ipcref_view_release(&w);
  ipcref_view_release(&v);
  ipcref_buf_release(b);
}

/* A batch whose chunks' fds would pass a message's 48 (16 + 16 + 15, and
 * a ledger's 2 each) is refused whole (EINVAL, nothing leased); its first
 * two views go in a batch of their own. */
static void vc_batch(one_ctx *o, const kind *k, char *range) {
  static const int first[3] = {0, 1, 0}, chunks[3] = {16, 16, 15};
  ipcref_buf *b[3] = {NULL, NULL, NULL};
  ipcref_view v[3], w;
  size_t slots;
  int i;
  memset(&w, 0, sizeof w);
  for (i = 0; i < 3; i++) { /* three segments: each its own base or size */
    CHECK_EQ(g_wrap(o->ctx, k, 0, range + first[i] * VC_CHUNK,
                    (size_t)chunks[i] * VC_CHUNK, NULL, NULL, &b[i]),
             IPCREF_OK);
    if (!b[i]) return;
    v[i] = u32_view(b[i], (size_t)chunks[i] * VC_CHUNK);
  }
  slots = stats_of(o->ctx).live_slots;
  CHECK_EQ(ipcref_send_batch(o->pa, v, 3), IPCREF_EINVAL);
  CHECK_EQ(stats_of(o->ctx).live_slots, slots);
  CHECK_EQ(ipcref_send_batch(o->pa, v, 2), IPCREF_OK);
  for (i = 0; i < 2; i++) {
    CHECK_EQ(ipcref_recv(o->pb, &w, g_tmo), IPCREF_OK);
    CHECK_EQ(w.buf ? ipcref_buf_size(w.buf) : 0, (size_t)16 * VC_CHUNK);
    ipcref_view_release(&w);
  }
  for (i = 0; i < 3; i++) {
    ipcref_view_release(&v[i]);
    ipcref_buf_release(b[i]);
  }
}

static void test_vmm_chunks(const kind *k) {
  one_ctx o;
  unsigned long long hs[VC_N], hbad;
  void *range = NULL, *bad = NULL;
  ipcref_buf *b = NULL, *x = NULL;
  ipcref_view v, w;
  int before;
  memset(&w, 0, sizeof w);
  knob_num(k, "GRANULARITY", (long long)VC_CHUNK);
  if (!one_ctx_open(k, &o)) return;
  CHECK_EQ(g_vmm_make(&o.d, VC_CHUNK, VC_N, 1, hs, &range), 0);
  CHECK_EQ(g_vmm_make(&o.d, VC_CHUNK, 1, 0, &hbad, &bad), 0);
  /* In the second chunk: that chunk's allocation, exported once. */
  vc_send(&o, k, (char *)range, VC_CHUNK + 256, 4096);
  LOG_EQ(log_count(getpid(), k->c_get, k->ok), 1);
  /* Across three chunks: an fd each, mapped one after the other. */
  before = log_count(getpid(), "cuMemMap", k->ok);
  vc_send(&o, k, (char *)range, VC_CHUNK - 64, VC_CHUNK + 128);
  LOG_EQ(log_count(getpid(), k->c_get, k->ok), 4);
  LOG_EQ(log_count(getpid(), "cuMemMap", k->ok) - before, 3);
  /* Across more chunks than a buffer may span. */
  CHECK_EQ(g_wrap(o.ctx, k, 0, range, VC_N * VC_CHUNK, NULL, NULL, &x),
           IPCREF_EINVAL);
  CHECK(x == NULL);
  vc_batch(&o, k, (char *)range);
  /* Made without the POSIX fd handle type: never shareable by fd. */
  CHECK_EQ(g_wrap(o.ctx, k, 0, bad, 4096, NULL, NULL, &x), IPCREF_OK);
  if (x) {
    v = u32_view(x, 4096);
    CHECK_EQ(ipcref_send(o.pa, &v), IPCREF_EINVAL);
    CHECK(strstr(ipcref_cuda_error(), "POSIX fd handle type") != NULL);
    ipcref_view_release(&v);
    ipcref_buf_release(x);
  }
  /* The peer goes on. */
  CHECK_EQ(g_alloc(o.ctx, k, 0, 4096, &b), IPCREF_OK);
  if (b) {
    v = u32_view(b, 4096);
    CHECK_EQ(ipcref_send(o.pa, &v), IPCREF_OK);
    CHECK_EQ(ipcref_recv(o.pb, &w, g_tmo), IPCREF_OK);
    ipcref_view_release(&w);
    ipcref_view_release(&v);
    ipcref_buf_release(b);
  }
  /* The owner frees its memory; the imports here hold their mappings. */
  g_vmm_free(&o.d, range, VC_CHUNK, VC_N, hs);
  g_vmm_free(&o.d, bad, VC_CHUNK, 1, &hbad);
  one_ctx_close(&o);
}
GPU_TEST(test_vmm_chunks, cuda_vmm, &K_VMM)

/* The same across processes: A wraps a buffer across three chunks and
 * sends it to B, which checks it and forwards it to C, which checks it;
 * each maps the three chunks once and unmaps them once. */
#define VF_FROM (VC_CHUNK - 64)
#define VF_LEN  (VC_CHUNK + 128)

static int vf_child(void *vp) {
  struct flow_arg *a = (struct flow_arg *)vp;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *pin, *pout = NULL;
  ipcref_view v;
  memset(&v, 0, sizeof v);
  if (g_open(a->k, &d) != IPCREF_OK) return 1;
  ctx = mkctx(SEG, &d);
  pin = make_peer(ctx, a->in);
  if (a->out >= 0) pout = make_peer(ctx, a->out);
  CHECK_EQ(ipcref_recv_on(pin, &v, g_tmo, NULL), IPCREF_OK);
  if (v.buf) {
    CHECK_EQ(ipcref_buf_size(v.buf), VF_LEN);
    CHECK(vc_pattern(&d, (char *)(uintptr_t)((uintptr_t)view_ptr(&v) - VF_FROM),
                     VF_FROM, VF_LEN, 0));
    if (pout) CHECK_EQ(ipcref_send_on(pout, &v, NULL), IPCREF_OK);
  }
  ctl_put(a->ctl, 1);
  CTL_EXPECT(a->ctl, 2);
  ipcref_view_release(&v);
  ctl_put(a->ctl, 3);
  CTL_EXPECT(a->ctl, 4);
  ipcref_peer_free(pin);
  ipcref_peer_free(pout);
  ipcref_ctx_free(ctx);
  g_close(&d);
  return 0;
}

static void test_vmm_chunks_forward(const kind *k) {
  int bc[2], i;
  struct flow_arg b, c;
  kid kb, kc;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *buf = NULL;
  ipcref_view v;
  unsigned long long hs[3];
  void *range = NULL;
  knob_num(k, "GRANULARITY", (long long)VC_CHUNK);
  knob(k, "HOSTPTR", "none");
  xsocketpair(SOCK_SEQPACKET, bc);
  kid_open(&kb, 1, SOCK_SEQPACKET);
  kid_open(&kc, 0, SOCK_SEQPACKET);
  b.k = c.k = k;
  b.in = kb.their_sock[0];
  b.out = bc[0];
  b.ctl = kb.their_ctl;
  c.in = bc[1];
  c.out = -1;
  c.ctl = kc.their_ctl;
  kid_fork(&kb, vf_child, &b, bc[0]);
  kid_fork(&kc, vf_child, &c, bc[1]);
  tclose(bc[0]);
  tclose(bc[1]);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  CHECK_EQ(g_vmm_make(&d, VC_CHUNK, 3, 1, hs, &range), 0);
  vc_pattern(&d, (char *)range, VF_FROM, VF_LEN, 1);
  ctx = mkctx(SEG, &d);
  p = kid_peer(&kb, 0, ctx);
  CHECK_EQ(g_wrap(ctx, k, 0, (char *)range + VF_FROM, VF_LEN, NULL, NULL, &buf),
           IPCREF_OK);
  if (buf) {
    v = u32_view(buf, VF_LEN);
    CHECK_EQ(ipcref_send_on(p, &v, NULL), IPCREF_OK);
    ipcref_view_release(&v);
    ipcref_buf_release(buf);
  }
  CTL_EXPECT(kb.ctl, 1); /* B checked it and forwarded it */
  CTL_EXPECT(kc.ctl, 1); /* C checked it */
  for (i = 0; i < 2; i++) {
    kid *kk = i ? &kc : &kb;
    ctl_put(kk->ctl, 2);
    CTL_EXPECT(kk->ctl, 3);
  }
  ipcref_collect(ctx);
  CHECK_EQ(stats_of(ctx).live_slots, 0);
  CHECK_EQ(stats_of(ctx).limbo_blocks, 0);
  ctl_put(kb.ctl, 4);
  ctl_put(kc.ctl, 4);
  KID_EXIT0(&kb, "B");
  KID_EXIT0(&kc, "C");
  /* Three chunks exported once by A; mapped and unmapped three times in
   * each of B and C. */
  LOG_EQ(log_count(getpid(), k->c_get, k->ok), 3);
  LOG_EQ(log_count(0, k->c_open, k->ok), 6);
  LOG_EQ(log_count(0, "cuMemUnmap", k->ok), 6);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_vmm_free(&d, range, VC_CHUNK, 3, hs);
  g_close(&d);
out:
  kid_close(&kb);
  kid_close(&kc);
  KID_EXIT0(&kb, "B");
  KID_EXIT0(&kc, "C");
}
GPU_TEST(test_vmm_chunks_forward, cuda_vmm, &K_VMM)

/* ======================================================================== */
/* Pool memory of a pool not created shareable: wrapped, and refused when
 * it is sent (EINVAL), saying how to make one; the peer goes on. */
static void test_pool_unshareable(const kind *k) {
  one_ctx o;
  pool_props pr;
  void *pool = NULL;
  unsigned long long ptr = 0;
  ipcref_buf *b = NULL;
  ipcref_view v, w;
  memset(&w, 0, sizeof w);
  if (!one_ctx_open(k, &o)) return;
  memset(&pr, 0, sizeof pr);
  pr.alloc_type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED, no handle type */
  pr.loc_type = 1;   /* CU_MEM_LOCATION_TYPE_DEVICE */
  g_cur(&o.d);
  CHECK_EQ(o.d.pcreate(&pool, &pr), 0);
  CHECK_EQ(o.d.palloc(&ptr, 4096, pool, NULL), 0);
  CHECK_EQ(g_wrap(o.ctx, k, 0, (void *)(uintptr_t)ptr, 4096, NULL, NULL, &b),
           IPCREF_OK);
  if (b) {
    v = u32_view(b, 4096);
    CHECK_EQ(ipcref_send(o.pa, &v), IPCREF_EINVAL);
    CHECK(strstr(ipcref_cuda_error(), "handleTypes") != NULL);
    ipcref_view_release(&v);
    ipcref_buf_release(b);
  }
  CHECK_EQ(g_alloc(o.ctx, k, 0, 4096, &b), IPCREF_OK); /* a shareable one */
  if (b) {
    v = u32_view(b, 4096);
    CHECK_EQ(ipcref_send(o.pa, &v), IPCREF_OK);
    CHECK_EQ(ipcref_recv(o.pb, &w, g_tmo), IPCREF_OK);
    ipcref_view_release(&w);
    ipcref_view_release(&v);
    ipcref_buf_release(b);
  }
  g_cur(&o.d);
  CHECK_EQ(o.d.cfree(ptr), 0);
  CHECK_EQ(o.d.pdestroy(pool), 0);
  one_ctx_close(&o);
}
GPU_TEST(test_pool_unshareable, cuda_pool, &K_POOL)

/* Memory legacy IPC cannot export (VMM, pools): wrapping works, sending
 * is refused with EINVAL and a message naming legacy IPC, nothing leaks,
 * and the peer still works afterwards. */
static void test_not_ipc_capable(const kind *k) {
  int sv[2];
  gdrv d;
  ipcref_ctx *ca, *cb;
  ipcref_peer *pa, *pb;
  ipcref_buf *b = NULL, *ok = NULL;
  ipcref_view v, w;
  void *vmm = NULL;
  struct relcount rc;
  ipcref_stats st;
  memset(&rc, 0, sizeof rc);
  memset(&w, 0, sizeof w);
  xsocketpair(SOCK_SEQPACKET, sv);
  if (g_open(k, &d) != IPCREF_OK) {
    tclose(sv[0]);
    tclose(sv[1]);
    return;
  }
  ca = mkctx(SEG, &d);
  cb = mkctx(SEG, &d);
  pa = make_peer(ca, sv[0]);
  pb = make_peer(cb, sv[1]);
  g_cur(&d);
  CHECK_EQ(d.vmm(&vmm, 65536), 0);
  CHECK_EQ(g_wrap(ca, k, 0, (char *)vmm + 4096, 4096, count_release, &rc, &b),
           IPCREF_OK);
  if (b) {
    v = u32_view(b, 4096);
    CHECK_EQ(ipcref_send_on(pa, &v, NULL), IPCREF_EINVAL);
    if (!strstr(g_err(k), "legacy IPC")) {
      printf("    ipcref_%s_error(): \"%s\"\n", k->name, g_err(k));
      CHECK(!"mentions legacy IPC");
    }
    st = stats_of(ca);
    CHECK_EQ(st.live_slots, 0);
    CHECK_EQ(st.live_bufs, 1);
    /* Nothing went out. */
    CHECK_EQ(ipcref_recv_on(pb, &w, 50, NULL), IPCREF_ETIMEDOUT);
    ipcref_view_release(&v);
    ipcref_buf_release(b);
    CHECK_EQ(rc.n, 1);
    CHECK(rc.ptr == (char *)vmm + 4096);
    st = stats_of(ca);
    CHECK_EQ(st.live_bufs, 0);
    CHECK_EQ(st.limbo_blocks, 0);
  }
  LOG_EQ(log_count(0, k->c_get, k->ok), 0);
  /* The peer is fine: a block ipcref allocated goes through. */
  CHECK_EQ(g_alloc(ca, k, 0, 4096, &ok), IPCREF_OK);
  if (ok) {
    v = u32_view(ok, 4096);
    CHECK_EQ(ipcref_send_on(pa, &v, NULL), IPCREF_OK);
    CHECK_EQ(ipcref_recv_on(pb, &w, g_tmo, NULL), IPCREF_OK);
    ipcref_view_release(&w);
    ipcref_view_release(&v);
    ipcref_buf_release(ok);
  }
  ipcref_collect(ca);
  st = stats_of(ca);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  ipcref_peer_free(pa);
  ipcref_peer_free(pb);
  ipcref_ctx_free(cb);
  ipcref_ctx_free(ca);
  CHECK_EQ(rc.n, 1);
  CHECK_EQ(g_free(&d, vmm, 0), 0);
  g_close(&d);
}
GPU_TEST(test_not_ipc_capable, cuda, &K_CUDA)
GPU_TEST(test_not_ipc_capable, hip, &K_HIP)

/* A handle whose allocation is gone by the time the consumer opens it
 * (its owner freed memory it had wrapped for sharing: a misuse): the
 * consumer's receive fails with EPROTO, saying the open failed, and
 * nothing crashes; what it never took is reclaimed when it exits. */

static int freed_child(void *vp) {
  struct wrap_arg *a = (struct wrap_arg *)vp;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v;
  memset(&v, 0, sizeof v);
  if (g_open(a->k, &d) != IPCREF_OK) return 1;
  ctx = mkctx(SEG, &d);
  p = make_peer(ctx, a->peer);
  CTL_EXPECT(a->ctl, 1); /* sent, and freed */
  CHECK_EQ(ipcref_recv_on(p, &v, g_tmo, NULL), IPCREF_EPROTO);
  CHECK(v.buf == NULL);
  if (!strstr(g_err(a->k), "opening the handle")) {
    printf("    ipcref_%s_error(): \"%s\"\n", a->k->name, g_err(a->k));
    CHECK(!"says the open failed");
  }
  CHECK_EQ(stats_of(ctx).imported_bufs, 0);
  ctl_put(a->ctl, 2);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
  return 0;
}

static void test_freed_handle(const kind *k) {
  struct wrap_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *b = NULL;
  ipcref_view v;
  ipcref_stats st;
  void *alloc = NULL;
  struct relcount rc;
  long end;
  memset(&rc, 0, sizeof rc);
  kid_open(&ch, 1, SOCK_SEQPACKET);
  a.k = k;
  a.peer = ch.their_sock[0];
  a.ctl = ch.their_ctl;
  kid_fork(&ch, freed_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  ctx = mkctx(SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  CHECK_EQ(g_malloc(&d, 65536, &alloc), 0);
  CHECK_EQ(g_wrap(ctx, k, 0, alloc, 4096, count_release, &rc, &b), IPCREF_OK);
  if (b) {
    v = u32_view(b, 4096);
    CHECK_EQ(ipcref_send_on(p, &v, NULL), IPCREF_OK);
    ipcref_view_release(&v);
    ipcref_buf_release(b);
  }
  CHECK_EQ(g_free(&d, alloc, 65536), 0); /* under the lease: the misuse */
  ctl_put(ch.ctl, 1);
  CTL_EXPECT(ch.ctl, 2);
  KID_EXIT0(&ch, "consumer");
  LOG_EQ(log_count(0, k->c_open, k->ok), 0);
  LOG_EQ(log_count(0, k->c_open, NULL), 1);
  end = now_ms() + g_tmo;
  do { /* the consumer is gone: its lease with it */
    ipcref_collect(ctx);
    st = stats_of(ctx);
    if (st.live_slots == 0) break;
    sleep_us(5 * 1000L);
  } while (now_ms() < end);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  CHECK_EQ(rc.n, 1);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_freed_handle, cuda, &K_CUDA)
GPU_TEST(test_freed_handle, hip, &K_HIP)

/* ======================================================================== */
/* 8. What the host cannot do with device memory, and devices without a
 * backend. */

struct devop_arg {
  const kind *k;
  int peer, ctl;
};

/* Host operations refuse on a device view (ours or imported). */
static void host_ops_refuse(ipcref_view *v) {
  ipcref_view s, out, host;
  ipcref_buf *b;
  int64_t n = v->shape[0];
  memset(&out, 0, sizeof out);
  /* A contiguous one needs no copy: the same buffer. */
  CHECK_EQ(ipcref_view_contiguous(v, &out), IPCREF_OK);
  CHECK(out.buf == v->buf);
  ipcref_view_release(&out);
  /* A strided one would need a copy on the host. */
  CHECK_EQ(ipcref_view_slice(v, 0, 0, IPCREF_SLICE_MAX, 2, &s), IPCREF_OK);
  CHECK_EQ(ipcref_view_contiguous(&s, &out), IPCREF_EDEVICE);
  CHECK(out.buf == NULL);
  CHECK_EQ(ipcref_view_new(IPCREF_U32, 1, &n, &host), IPCREF_OK);
  CHECK_EQ(ipcref_view_copy(&host, v), IPCREF_EDEVICE);
  CHECK_EQ(ipcref_view_copy(v, &host), IPCREF_EDEVICE);
  CHECK_EQ(ipcref_view_make_mut(&s), IPCREF_EDEVICE);
  b = ipcref_buf_retain(v->buf); /* shared: make_mut would copy */
  CHECK_EQ(ipcref_buf_make_mut(&b), IPCREF_EDEVICE);
  CHECK(b == v->buf);
  ipcref_buf_release(b);
  ipcref_view_release(&host);
  ipcref_view_release(&s);
}

static int devop_child(void *vp) {
  struct devop_arg *a = (struct devop_arg *)vp;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v;
  memset(&v, 0, sizeof v);
  if (g_open(a->k, &d) != IPCREF_OK) return 1;
  ctx = mkctx(SEG, &d);
  p = make_peer(ctx, a->peer);
  CHECK_EQ(ipcref_recv_on(p, &v, g_tmo, NULL), IPCREF_OK);
  if (v.buf) {
    check_dev(v.buf, a->k->type, 1); /* device 1 travelled */
    d.copy_dev = 1;
    CHECK(dev_check(&d, view_ptr(&v), 4096, 0x1d, 0));
    d.copy_dev = 0;
    host_ops_refuse(&v);
    ipcref_view_release(&v);
  }
  ctl_put(a->ctl, 1);
  CTL_EXPECT(a->ctl, 2);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
  return 0;
}

static void test_device_ops(const kind *k) {
  struct devop_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *b0 = NULL, *b1 = NULL, *x = NULL;
  ipcref_view v;
  ipcref_device other;
  knob(k, "DEVICES", "2");
  kid_open(&ch, 1, SOCK_SEQPACKET);
  a.k = k;
  a.peer = ch.their_sock[0];
  a.ctl = ch.their_ctl;
  kid_fork(&ch, devop_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  ctx = mkctx(SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  CHECK_EQ(g_alloc(ctx, k, 0, 4096, &b0), IPCREF_OK);
  CHECK_EQ(g_alloc(ctx, k, 1, 4096, &b1), IPCREF_OK);
  if (b0 && b1) {
    check_dev(b0, k->type, 0);
    check_dev(b1, k->type, 1);
    CHECK(ipcref_buf_data(b0) != ipcref_buf_data(b1));
    d.copy_dev = 1;
    dev_fill(&d, ipcref_buf_data(b1), 4096, 0x1d, 0);
    d.copy_dev = 0;
    v = u32_view(b1, 4096);
    host_ops_refuse(&v);
    CHECK_EQ(ipcref_send_on(p, &v, NULL), IPCREF_OK);
    ipcref_view_release(&v);
  }
  ipcref_buf_release(b0);
  ipcref_buf_release(b1);
  /* The device's ordinal reached the driver: device 1's allocation. */
  LOG_OK(log_count(getpid(), k->hip ? "hipSetDevice" : "cuDeviceGet",
                   k->hip ? "dev=1 " : "ordinal=1 ") >= 1);
  /* A device type without a backend here. */
  other.type = k->other_type;
  other.id = 0;
  CHECK_EQ(ipcref_device_new(ctx, other, 4096, &x), IPCREF_ENODEV);
  CHECK_EQ(ipcref_device_wrap(ctx, other, (void *)(uintptr_t)0x10000, 4096,
                              NULL, NULL, &x),
           IPCREF_ENODEV);
  CHECK(x == NULL);
  /* An ordinal the driver does not have. */
  CHECK_EQ(g_alloc(ctx, k, 5, 4096, &x), IPCREF_ENODEV);
  CHECK(x == NULL);
  CHECK_EQ(g_alloc(ctx, k, 1000, 4096, &x), IPCREF_ENODEV);
  CHECK(x == NULL);
  CTL_EXPECT(ch.ctl, 1);
  ipcref_collect(ctx);
  CHECK_EQ(stats_of(ctx).live_slots, 0);
  CHECK_EQ(stats_of(ctx).limbo_blocks, 0);
  ctl_put(ch.ctl, 2);
  KID_EXIT0(&ch, "consumer");
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
  LOG_EQ(log_count(getpid(), k->c_free, k->ok),
         log_count(getpid(), k->c_alloc, k->ok));
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_device_ops, cuda, &K_CUDA)
GPU_TEST(test_device_ops, hip, &K_HIP)
GPU_TEST(test_device_ops, cuda_vmm, &K_VMM)
GPU_TEST(test_device_ops, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_device_ops, cuda_pool, &K_POOL)
GPU_TEST(test_device_ops, hip_pool, &K_HIP_POOL)

/* A consumer with no backend for the device: ENODEV for the device view,
 * and it goes on receiving host views. */
static int nobackend_child(void *vp) {
  struct devop_arg *a = (struct devop_arg *)vp;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v;
  ipcref_stats st;
  int fds;
  memset(&v, 0, sizeof v);
  fds = count_fds();      /* with the peer's socket */
  ctx = mkctx(SEG, NULL); /* no driver here at all */
  p = make_peer(ctx, a->peer);
  CHECK_EQ(ipcref_recv_on(p, &v, g_tmo, NULL), IPCREF_ENODEV);
  CHECK(v.buf == NULL);
  CHECK_EQ(ipcref_recv(p, &v, g_tmo), IPCREF_OK);
  if (v.buf) {
    const uint32_t *w = (const uint32_t *)view_ptr(&v);
    size_t i;
    int good = 1;
    check_dev(v.buf, IPCREF_DEVICE_CPU, 0);
    for (i = 0; i < 1024; i++) good &= w[i] == pat(0xcc, i);
    CHECK(good);
    ipcref_view_release(&v);
  }
  st = stats_of(ctx);
  CHECK_EQ(st.imported_bufs, 0);
  ctl_put(a->ctl, 1);
  CTL_EXPECT(a->ctl, 2);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  CHECK_EQ(count_fds(), fds - 1); /* nothing of the messages stayed */
  return 0;
}

static void test_no_backend_consumer(const kind *k) {
  struct devop_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *b = NULL, *h = NULL;
  ipcref_view v;
  ipcref_stats st;
  kid_open(&ch, 1, SOCK_SEQPACKET);
  a.k = k;
  a.peer = ch.their_sock[0];
  a.ctl = ch.their_ctl;
  kid_fork(&ch, nobackend_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  ctx = mkctx(SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  CHECK_EQ(g_alloc(ctx, k, 0, 4096, &b), IPCREF_OK);
  CHECK_EQ(ipcref_shared_new(ctx, 4096, &h), IPCREF_OK);
  if (b && h) {
    uint32_t *w = (uint32_t *)ipcref_buf_data(h);
    size_t i;
    for (i = 0; i < 1024; i++) w[i] = pat(0xcc, i);
    v = u32_view(b, 4096);
    CHECK_EQ(ipcref_send_on(p, &v, NULL), IPCREF_OK);
    ipcref_view_release(&v);
    v = u32_view(h, 4096);
    CHECK_EQ(ipcref_send(p, &v), IPCREF_OK);
    ipcref_view_release(&v);
  }
  ipcref_buf_release(b);
  ipcref_buf_release(h);
  CTL_EXPECT(ch.ctl, 1);
  ipcref_collect(ctx);
  st = stats_of(ctx);
  /* The host view came back. The device view's lease: the consumer never
   * took it, and lives on. */
  if (st.live_slots != 0)
    printf("    the refused device view's lease stays out while the "
           "consumer lives (live_slots %zu, limbo %zu)\n",
           st.live_slots, st.limbo_blocks);
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  ctl_put(ch.ctl, 2);
  KID_EXIT0(&ch, "consumer");
  {
    long end = now_ms() + g_tmo;
    do { /* once it exited, whatever it held is reclaimed */
      ipcref_collect(ctx);
      st = stats_of(ctx);
      if (st.live_slots == 0) break;
      sleep_us(5 * 1000L);
    } while (now_ms() < end);
  }
  CHECK_EQ(st.live_slots, 0);
  CHECK_EQ(st.limbo_blocks, 0);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_no_backend_consumer, cuda, &K_CUDA)
GPU_TEST(test_no_backend_consumer, hip, &K_HIP)
GPU_TEST(test_no_backend_consumer, cuda_vmm, &K_VMM)
GPU_TEST(test_no_backend_consumer, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_no_backend_consumer, cuda_pool, &K_POOL)
GPU_TEST(test_no_backend_consumer, hip_pool, &K_HIP_POOL)

/* ======================================================================== */
/* 8b. Device memory under a consumer's caps (ipcref_peer_options.max_maps):
 * a device segment counts as a mapping like a host one. A message that
 * would pass the cap is refused (ERANGE) after its handle was opened: the
 * driver's mapping is closed again, nothing stays counted and the lease
 * goes back. With the cap lifted, the producer sends the same view again,
 * handle and all (ipcref remembers the refusal), and it imports. */

struct caps_arg {
  const kind *k;
  int peer, ctl;
};

static void caps_set(ipcref_peer *p, size_t max_maps) {
  ipcref_peer_options o;
  memset(&o, 0, sizeof o);
  o.max_maps = max_maps;
  CHECK_EQ(ipcref_peer_set_options(p, &o), IPCREF_OK);
}

static int caps_child(void *vp) {
  struct caps_arg *a = (struct caps_arg *)vp;
  const kind *k = a->k;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v[2];
  int me = (int)getpid(), i;
  memset(v, 0, sizeof v);
  if (g_open(k, &d) != IPCREF_OK) return 1;
  ctx = mkctx(SEG, &d);
  p = make_peer(ctx, a->peer);
  caps_set(p, 2); /* the producer's ledger and one device segment */
  CHECK_EQ(ipcref_recv_on(p, &v[0], g_tmo, NULL), IPCREF_OK);
  if (v[0].buf) CHECK(dev_check(&d, view_ptr(&v[0]), SEG, 0x61, 0));
  CHECK_EQ(peer_info_of(p).maps, 2);
  CHECK_EQ(ipcref_recv_on(p, &v[1], g_tmo, NULL), IPCREF_ERANGE);
  CHECK(v[1].buf == NULL);
  CHECK_EQ(peer_info_of(p).maps, 2);
  CHECK_EQ(stats_of(ctx).mapped_segments, 1);
  CHECK_EQ(stats_of(ctx).refused, 1);
  /* The refused handle was opened, then closed: one open stays. */
  LOG_EQ(log_count(me, k->c_open, k->ok), 2);
  LOG_EQ(log_count(me, k->c_open, k->ok) - log_count(me, k->c_close, k->ok), 1);
  ctl_put(a->ctl, 1); /* refused */
  caps_set(p, 0);
  CTL_EXPECT(a->ctl, 2); /* sent again */
  CHECK_EQ(ipcref_recv_on(p, &v[1], g_tmo, NULL), IPCREF_OK);
  if (v[1].buf) CHECK(dev_check(&d, view_ptr(&v[1]), SEG, 0x62, 0));
  CHECK_EQ(peer_info_of(p).maps, 3);
  LOG_EQ(log_count(me, k->c_open, k->ok), 3);
  for (i = 0; i < 2; i++) ipcref_view_release(&v[i]);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  /* Every handle opened here was closed once. */
  LOG_EQ(log_count(me, k->c_close, k->ok), 3);
  ctl_put(a->ctl, 3);
  g_close(&d);
  return 0;
}

static void test_device_caps(const kind *k) {
  struct caps_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_buf *b[2] = {NULL, NULL};
  ipcref_view v[2];
  int i;
  knob(k, "HOSTPTR", "none");
  kid_open(&ch, 1, SOCK_SEQPACKET);
  a.k = k;
  a.peer = ch.their_sock[0];
  a.ctl = ch.their_ctl;
  kid_fork(&ch, caps_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  ctx = mkctx(SEG, &d);
  p = kid_peer(&ch, 0, ctx);
  for (i = 0; i < 2; i++) { /* a segment each */
    CHECK_EQ(g_alloc(ctx, k, 0, SEG, &b[i]), IPCREF_OK);
    if (!b[i]) goto done;
    dev_fill(&d, ipcref_buf_data(b[i]), SEG, 0x61u + (uint32_t)i, 0);
    v[i] = u32_view(b[i], SEG);
    CHECK_EQ(ipcref_send_on(p, &v[i], NULL), IPCREF_OK);
  }
  CTL_EXPECT(ch.ctl, 1);
  ipcref_collect(ctx); /* the refused lease is back */
  CHECK_EQ(stats_of(ctx).live_slots, 1);
  CHECK_EQ(ipcref_send_on(p, &v[1], NULL), IPCREF_OK);
  ctl_put(ch.ctl, 2);
  CTL_EXPECT(ch.ctl, 3);
  ipcref_collect(ctx);
  CHECK_EQ(stats_of(ctx).live_slots, 0);
  for (i = 0; i < 2; i++) ipcref_view_release(&v[i]);
  /* Each handle was got from the driver once: the refused one went again
   * from what the producer had kept of it. */
  LOG_EQ(log_count(getpid(), k->c_get, k->ok), 2);
done:
  for (i = 0; i < 2; i++) ipcref_buf_release(b[i]);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  g_close(&d);
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_device_caps, cuda, &K_CUDA)
GPU_TEST(test_device_caps, hip, &K_HIP)
GPU_TEST(test_device_caps, cuda_vmm, &K_VMM)
GPU_TEST(test_device_caps, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_device_caps, cuda_pool, &K_POOL)
GPU_TEST(test_device_caps, hip_pool, &K_HIP_POOL)

/* ======================================================================== */
/* 8c. A producer that connects again. The consumer frees its peer while it
 * still holds a view of device memory from it (the segment's mapping
 * retired, in use), and the producer connects again and sends the same
 * view: the consumer opens it anew (the backend counts a legacy handle
 * opened twice as one open) and imports it with the right data; every
 * handle it opened is closed once, when its last view goes. */

struct again_arg {
  const kind *k;
  int peer1, peer2, ctl;
};

static int again_child(void *vp) {
  struct again_arg *a = (struct again_arg *)vp;
  const kind *k = a->k;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p;
  ipcref_view v[2];
  int me = (int)getpid(), i;
  memset(v, 0, sizeof v);
  if (g_open(k, &d) != IPCREF_OK) return 1;
  ctx = mkctx(SEG, &d);
  p = make_peer(ctx, a->peer1);
  CHECK_EQ(ipcref_recv_on(p, &v[0], g_tmo, NULL), IPCREF_OK);
  ipcref_peer_free(p); /* v[0] held */
  ctl_put(a->ctl, 1);
  p = make_peer(ctx, a->peer2);
  CHECK_EQ(ipcref_recv_on(p, &v[1], g_tmo, NULL), IPCREF_OK);
  for (i = 0; i < 2; i++)
    if (v[i].buf) CHECK(dev_check(&d, view_ptr(&v[i]), SEG, 0x71, 0));
  CHECK_EQ(stats_of(ctx).refused, 0);
  for (i = 0; i < 2; i++) ipcref_view_release(&v[i]);
  ipcref_peer_free(p);
  ipcref_collect(ctx);
  CHECK_EQ(stats_of(ctx).mapped_segments, 0);
  ipcref_ctx_free(ctx);
  LOG_EQ(log_count(me, k->c_open, k->ok) - log_count(me, k->c_close, k->ok), 0);
  ctl_put(a->ctl, 2);
  g_close(&d);
  return 0;
}

static void test_device_reconnect(const kind *k) {
  struct again_arg a;
  kid ch;
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_peer *p[2] = {NULL, NULL};
  ipcref_buf *b = NULL;
  ipcref_view v;
  int i;
  knob(k, "HOSTPTR", "none");
  kid_open(&ch, 2, SOCK_SEQPACKET);
  a.k = k;
  a.peer1 = ch.their_sock[0];
  a.peer2 = ch.their_sock[1];
  a.ctl = ch.their_ctl;
  kid_fork(&ch, again_child, &a, -1);
  if (g_open(k, &d) != IPCREF_OK) goto out;
  ctx = mkctx(SEG, &d);
  CHECK_EQ(g_alloc(ctx, k, 0, SEG, &b), IPCREF_OK);
  if (b) {
    dev_fill(&d, ipcref_buf_data(b), SEG, 0x71, 0);
    v = u32_view(b, SEG);
    for (i = 0; i < 2; i++) {
      p[i] = kid_peer(&ch, i, ctx);
      CHECK_EQ(ipcref_send_on(p[i], &v, NULL), IPCREF_OK);
      CTL_EXPECT(ch.ctl, i + 1);
    }
    ipcref_view_release(&v);
  }
  ipcref_collect(ctx);
  CHECK_EQ(stats_of(ctx).live_slots, 0);
  ipcref_buf_release(b);
  for (i = 0; i < 2; i++)
    if (p[i]) ipcref_peer_free(p[i]);
  ipcref_ctx_free(ctx);
  g_close(&d);
out:
  KID_END(&ch, "consumer");
}
GPU_TEST(test_device_reconnect, cuda, &K_CUDA)
GPU_TEST(test_device_reconnect, hip, &K_HIP)
GPU_TEST(test_device_reconnect, cuda_vmm, &K_VMM)
GPU_TEST(test_device_reconnect, hip_vmm, &K_HIP_VMM)
GPU_TEST(test_device_reconnect, cuda_pool, &K_POOL)
GPU_TEST(test_device_reconnect, hip_pool, &K_HIP_POOL)

/* ======================================================================== */
/* 9. Wrong arguments to every new function. */

static void test_bad_args(const kind *k) {
  gdrv d;
  ipcref_ctx *ctx;
  ipcref_backend be, *bp;
  ipcref_buf *b = NULL;
  ipcref_device dev, cpu;
  struct relcount rc;
  void *alloc = NULL;
  size_t i;
  /* The backend headers. */
  if (k->hip) {
    CHECK_EQ(ipcref_hip_open(k->path, NULL), IPCREF_EINVAL);
    CHECK(ipcref_hip_backend(NULL) == NULL);
    ipcref_hip_close(NULL);
    CHECK_EQ(ipcref_hip_alloc(NULL, 0, 4096, &b), IPCREF_EINVAL);
    CHECK_EQ(ipcref_hip_wrap(NULL, 0, (void *)&b, 4, NULL, NULL, &b),
             IPCREF_EINVAL);
  } else {
    CHECK_EQ(ipcref_cuda_open(k->path, NULL), IPCREF_EINVAL);
    CHECK(ipcref_cuda_backend(NULL) == NULL);
    ipcref_cuda_close(NULL);
    CHECK_EQ(ipcref_cuda_alloc(NULL, 0, 4096, &b), IPCREF_EINVAL);
    CHECK_EQ(ipcref_cuda_wrap(NULL, 0, (void *)&b, 4, NULL, NULL, &b),
             IPCREF_EINVAL);
  }
  CHECK(b == NULL);
  if (g_open(k, &d) != IPCREF_OK) return;
  memset(&rc, 0, sizeof rc);
  ctx = mkctx(SEG, NULL);
  bp = d.be;
  CHECK(bp != NULL);
  CHECK_EQ(bp->device_type, k->type);
  CHECK(bp->name != NULL);
  /* ipcref_ctx_add_backend: NULLs, each missing function, CPU, none,
   * a type already served, more than 8. */
  CHECK_EQ(ipcref_ctx_add_backend(NULL, bp), IPCREF_EINVAL);
  CHECK_EQ(ipcref_ctx_add_backend(ctx, NULL), IPCREF_EINVAL);
  {
    void **fns[11];
    fns[0] = (void **)(void *)&be.seg_alloc;
    fns[1] = (void **)(void *)&be.seg_free;
    fns[2] = (void **)(void *)&be.seg_range;
    fns[3] = (void **)(void *)&be.seg_export;
    fns[4] = (void **)(void *)&be.seg_import;
    fns[5] = (void **)(void *)&be.seg_close;
    fns[6] = (void **)(void *)&be.event_record;
    fns[7] = (void **)(void *)&be.event_free;
    fns[8] = (void **)(void *)&be.event_wait;
    fns[9] = (void **)(void *)&be.fence;
    fns[10] = (void **)(void *)&be.fence_done;
    for (i = 0; i < 11; i++) {
      be = *bp;
      memset(fns[i], 0, sizeof(void (*)(void)));
      CHECK_EQ(ipcref_ctx_add_backend(ctx, &be), IPCREF_EINVAL);
    }
  }
  be = *bp;
  be.device_type = IPCREF_DEVICE_CPU;
  CHECK_EQ(ipcref_ctx_add_backend(ctx, &be), IPCREF_EINVAL);
  be.device_type = 0;
  CHECK_EQ(ipcref_ctx_add_backend(ctx, &be), IPCREF_EINVAL);
  be.device_type = -5;
  CHECK_EQ(ipcref_ctx_add_backend(ctx, &be), IPCREF_EINVAL);
  CHECK_EQ(ipcref_ctx_add_backend(ctx, bp), IPCREF_OK);
  CHECK_EQ(ipcref_ctx_add_backend(ctx, bp), IPCREF_EINVAL); /* again */
  be = *bp; /* another backend of the same type */
  CHECK_EQ(ipcref_ctx_add_backend(ctx, &be), IPCREF_EINVAL);
  {
    /* Room for 8 device types; never called (no pool uses them). */
    static ipcref_backend more[8];
    int added = 1;
    for (i = 0; i < 8; i++) {
      more[i] = *bp;
      more[i].device_type = 100 + (int32_t)i;
      if (ipcref_ctx_add_backend(ctx, &more[i]) == IPCREF_OK) added++;
    }
    CHECK_EQ(added, 8);
  }
  /* ipcref_device_new */
  dev.type = k->type;
  dev.id = 0;
  cpu.type = IPCREF_DEVICE_CPU;
  cpu.id = 0;
  CHECK_EQ(ipcref_device_new(NULL, dev, 4096, &b), IPCREF_EINVAL);
  CHECK_EQ(ipcref_device_new(ctx, dev, 4096, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_device_new(ctx, cpu, 4096, &b), IPCREF_EINVAL);
  dev.type = 0;
  CHECK_EQ(ipcref_device_new(ctx, dev, 4096, &b), IPCREF_EINVAL);
  dev.type = k->type;
  dev.id = -1;
  CHECK_EQ(ipcref_device_new(ctx, dev, 4096, &b), IPCREF_EINVAL);
  dev.id = 0;
  CHECK_EQ(ipcref_device_new(ctx, dev, SIZE_MAX, &b), IPCREF_ERANGE);
  CHECK(b == NULL);
  CHECK_EQ(g_alloc(ctx, k, -1, 4096, &b), IPCREF_EINVAL);
  CHECK_EQ(g_alloc(ctx, k, 0, 4096, NULL), IPCREF_EINVAL);
  /* ipcref_device_wrap */
  CHECK_EQ(g_malloc(&d, 65536, &alloc), 0);
  CHECK_EQ(ipcref_device_wrap(NULL, dev, alloc, 64, count_release, &rc, &b),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_device_wrap(ctx, dev, alloc, 64, count_release, &rc, NULL),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_device_wrap(ctx, dev, NULL, 64, count_release, &rc, &b),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_device_wrap(ctx, cpu, alloc, 64, count_release, &rc, &b),
           IPCREF_EINVAL);
  dev.id = -1;
  CHECK_EQ(ipcref_device_wrap(ctx, dev, alloc, 64, count_release, &rc, &b),
           IPCREF_EINVAL);
  dev.id = 0;
  /* Not inside one allocation: past its end, wrapping around, or host
   * memory the driver does not know. */
  CHECK_EQ(ipcref_device_wrap(ctx, dev, (char *)alloc + 65536 - 64, 65,
                              count_release, &rc, &b),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_device_wrap(ctx, dev, (char *)alloc + 64, SIZE_MAX,
                              count_release, &rc, &b),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_device_wrap(ctx, dev, (void *)&rc, sizeof rc, count_release,
                              &rc, &b),
           IPCREF_EINVAL);
  CHECK(b == NULL);
  CHECK_EQ(rc.n, 0); /* on error nothing is adopted */
  /* The whole allocation, exactly, is fine; and a borrowed wrap (NULL
   * release). */
  CHECK_EQ(ipcref_device_wrap(ctx, dev, alloc, 65536, count_release, &rc, &b),
           IPCREF_OK);
  ipcref_buf_release(b);
  CHECK_EQ(rc.n, 1);
  b = NULL;
  CHECK_EQ(ipcref_device_wrap(ctx, dev, alloc, 16, NULL, NULL, &b), IPCREF_OK);
  ipcref_buf_release(b);
  /* The sharing calls around them. */
  CHECK_EQ(ipcref_send_on(NULL, NULL, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_recv_on(NULL, NULL, 0, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_ctx_poll_fd(NULL), -1);
  CHECK_EQ(ipcref_ctx_poll(NULL, 0, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_ctx_poll(ctx, 0, NULL), IPCREF_ETIMEDOUT);
  CHECK_EQ(ipcref_buf_device(NULL).type, IPCREF_DEVICE_CPU);
  CHECK_EQ(ipcref_buf_device(NULL).id, 0);
  {
    int sv[2];
    ipcref_peer *p, *q;
    ipcref_view v;
    xsocketpair(SOCK_SEQPACKET, sv);
    p = make_peer(ctx, sv[0]);
    q = make_peer(ctx, sv[1]);
    CHECK_EQ(ipcref_recv_on(p, NULL, 0, NULL), IPCREF_EINVAL);
    CHECK_EQ(ipcref_send_on(p, NULL, NULL), IPCREF_EINVAL);
    /* Not a shared buffer: a plain device wrap cannot be sent. */
    CHECK_EQ(ipcref_buf_wrap_device(alloc, 64, dev, NULL, NULL, &b), IPCREF_OK);
    v = u32_view(b, 64);
    CHECK_EQ(ipcref_send_on(p, &v, NULL), IPCREF_EINVAL);
    ipcref_view_release(&v);
    ipcref_buf_release(b);
    ipcref_peer_free(p);
    ipcref_peer_free(q);
  }
  CHECK_EQ(ipcref_strerror(IPCREF_EDEVICE) != NULL, 1);
  ipcref_ctx_free(ctx);
  CHECK_EQ(g_free(&d, alloc, 65536), 0);
  g_close(&d);
}
GPU_TEST(test_bad_args, cuda, &K_CUDA)
GPU_TEST(test_bad_args, hip, &K_HIP)

/* ======================================================================== */

static void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  if (!d) return;
  while ((e = readdir(d)) != NULL) {
    char path[400];
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

/* The halves that build.sh built: "apis" in the fakes' directory lists
 * them. 0 when it is missing or names something else. */
static int read_apis(const char *dir, int *cuda, int *hip) {
  char path[PATH_MAX], word[16];
  FILE *f;
  int ok = 1;
  snprintf(path, sizeof path, "%s/apis", dir);
  if (!(f = fopen(path, "re"))) return 0;
  while (fscanf(f, "%15s", word) == 1) {
    if (!strcmp(word, "cuda"))
      *cuda = 1;
    else if (!strcmp(word, "hip"))
      *hip = 1;
    else
      ok = 0;
  }
  fclose(f);
  return ok;
}

/* make gpu-test (IPCREF_GPU_REAL=1): the real drivers instead of the
 * fakes. Each half whose driver opens and finds a device runs, and VMM
 * memory where device 0 can share it by fd; 0 when none does (said so). */
/* 1 when device 0 has shareable pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_
 * SUPPORTED, and POSIX fds among MEMPOOL_SUPPORTED_HANDLE_TYPES). */
static int real_pools(void) {
  void *lib = dlopen(K_CUDA.path, RTLD_NOW | RTLD_LOCAL), *sym;
  int (*get)(int *, int) = NULL, (*attr)(int *, int, int) = NULL;
  int dev = 0, pools = 0, types = 0;
  if (!lib) return 0;
  sym = dlsym(lib, "cuDeviceGet");
  memcpy(&get, &sym, sizeof sym);
  sym = dlsym(lib, "cuDeviceGetAttribute");
  memcpy(&attr, &sym, sizeof sym);
  if (get && attr && !get(&dev, 0) && !attr(&pools, 115, dev))
    (void)attr(&types, 119, dev);
  dlclose(lib);
  return pools && (types & 1);
}

/* 1 when HIP's runtime `path` makes VMM memory for ipcref_hip_alloc
 * (*vmm), and shareable pools on device 0 (*pool). */
static void real_hip_kinds(ipcref_hip *hp, int *vmm, int *pool) {
  ipcref_ctx *ctx = mkctx(SEG, NULL);
  ipcref_buf *b = NULL;
  void *lib = dlopen(K_HIP.path, RTLD_NOW | RTLD_LOCAL), *sym, *pl = NULL;
  int (*create)(void **, const void *) = NULL, (*destroy)(void *) = NULL;
  pool_props pr;
  CHECK_EQ(ipcref_ctx_add_backend(ctx, ipcref_hip_backend(hp)), IPCREF_OK);
  CHECK_EQ(ipcref_hip_set_memory(hp, IPCREF_HIP_MEMORY_VMM), IPCREF_OK);
  *vmm = ipcref_hip_alloc(ctx, 0, 4096, &b) == IPCREF_OK;
  ipcref_buf_release(b);
  ipcref_ctx_free(ctx);
  CHECK_EQ(ipcref_hip_set_memory(hp, IPCREF_HIP_MEMORY_AUTO), IPCREF_OK);
  sym = lib ? dlsym(lib, "hipMemPoolCreate") : NULL;
  memcpy(&create, &sym, sizeof sym);
  sym = lib ? dlsym(lib, "hipMemPoolDestroy") : NULL;
  memcpy(&destroy, &sym, sizeof sym);
  memset(&pr, 0, sizeof pr);
  pr.alloc_type = pr.handle_types = pr.loc_type = 1; /* pinned, fd, device */
  *pool = create && destroy && create(&pl, &pr) == 0;
  if (*pool) (void)destroy(pl);
  if (lib) dlclose(lib);
  if (!*vmm) printf("gpu-test: no HIP VMM runs: %s\n", ipcref_hip_error());
  if (!*pool) printf("gpu-test: no HIP pool runs: no shareable pool\n");
}

static int real_drivers(int *cuda, int *hip, int *vmm, int *pool, int *hip_vmm,
                        int *hip_pool) {
  static const char *const hips[] = {"libamdhip64.so", "libamdhip64.so.6",
                                     "libamdhip64.so.5"};
  char why_cuda[300], why_hip[300] = "no libamdhip64 found";
  ipcref_cuda *cu = NULL;
  ipcref_hip *hp = NULL;
  size_t i;
  snprintf(K_CUDA.path, sizeof K_CUDA.path, "libcuda.so.1");
  memcpy(K_VMM.path, K_CUDA.path, sizeof K_VMM.path);
  memcpy(K_POOL.path, K_CUDA.path, sizeof K_POOL.path);
  *cuda = ipcref_cuda_open(K_CUDA.path, &cu) == IPCREF_OK;
  snprintf(why_cuda, sizeof why_cuda, "%s", ipcref_cuda_error());
  if (*cuda) { /* VMM where device 0 makes memory shareable by fd */
    ipcref_ctx *ctx = mkctx(SEG, NULL);
    ipcref_buf *b = NULL;
    CHECK_EQ(ipcref_ctx_add_backend(ctx, ipcref_cuda_backend(cu)), IPCREF_OK);
    CHECK_EQ(ipcref_cuda_set_memory(cu, IPCREF_CUDA_MEMORY_VMM), IPCREF_OK);
    *vmm = ipcref_cuda_alloc(ctx, 0, 4096, &b) == IPCREF_OK;
    if (!*vmm) printf("gpu-test: no VMM runs: %s\n", ipcref_cuda_error());
    ipcref_buf_release(b);
    ipcref_ctx_free(ctx);
    *pool = real_pools();
    if (!*pool)
      printf("gpu-test: no pool runs: device 0 has no pools "
             "shareable by fd\n");
    ipcref_cuda_close(cu);
  }
  for (i = 0; i < sizeof hips / sizeof *hips && !*hip; i++) {
    void *lib = dlopen(hips[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) continue;
    dlclose(lib);
    snprintf(K_HIP.path, sizeof K_HIP.path, "%s", hips[i]);
    *hip = ipcref_hip_open(K_HIP.path, &hp) == IPCREF_OK;
    snprintf(why_hip, sizeof why_hip, "%s", ipcref_hip_error());
    memcpy(K_HIP_VMM.path, K_HIP.path, sizeof K_HIP_VMM.path);
    memcpy(K_HIP_POOL.path, K_HIP.path, sizeof K_HIP_POOL.path);
    if (*hip) real_hip_kinds(hp, hip_vmm, hip_pool);
    ipcref_hip_close(hp);
    break;
  }
  if (!*cuda) printf("gpu-test: CUDA does not run: %s\n", why_cuda);
  if (!*hip) printf("gpu-test: HIP does not run: %s\n", why_hip);
  if (*cuda || *hip) return 1;
  printf("gpu-test: no GPU here, nothing ran (the fakes run in make "
         "test)\n0 passed, 0 failed\n");
  return 0;
}

int main(void) {
  const char *dir = getenv("IPCREF_FAKE_GPU_DIR");
  const char *cuda_home = getenv("CUDA_HOME");
  const char *only = getenv("IPCREF_GPU_ONLY"); /* cases whose name has it */
  static char stub[PATH_MAX];
  struct stat sb;
  int rc, i, cuda = 0, hip = 0, vmm = 0, pool = 0, hip_vmm = 0, hip_pool = 0;
  int missing = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  g_real = getenv("IPCREF_GPU_REAL") && !strcmp(getenv("IPCREF_GPU_REAL"), "1");
  if (g_real) {
    if (!real_drivers(&cuda, &hip, &vmm, &pool, &hip_vmm, &hip_pool))
      return 0; /* no GPU: said so */
    goto run;
  }
  if (!dir || !*dir) {
    printf("test_gpu: IPCREF_FAKE_GPU_DIR is not set (build the fakes with "
           "tests/fake_gpu/build.sh DIR)\n0 passed, 1 failed\n");
    return 1;
  }
  if (!read_apis(dir, &cuda, &hip)) {
    printf("test_gpu: %s/apis, the list of fake drivers that "
           "tests/fake_gpu/build.sh writes, is missing or names something "
           "other than cuda and hip\n0 passed, 1 failed\n",
           dir);
    return 1;
  }
  snprintf(K_CUDA.path, sizeof K_CUDA.path, "%s/libcuda.so.1", dir);
  memcpy(K_VMM.path, K_CUDA.path, sizeof K_VMM.path);
  memcpy(K_POOL.path, K_CUDA.path, sizeof K_POOL.path);
  snprintf(K_HIP.path, sizeof K_HIP.path, "%s/libamdhip64.so.5", dir);
  memcpy(K_HIP_VMM.path, K_HIP.path, sizeof K_HIP_VMM.path);
  memcpy(K_HIP_POOL.path, K_HIP.path, sizeof K_HIP_POOL.path);
  /* A half that was built must be there: its absence is a failure. */
  for (i = 0; i < 2; i++) {
    const kind *k = i ? &K_HIP : &K_CUDA;
    if ((i ? hip : cuda) && stat(k->path, &sb) != 0) {
      printf("test_gpu: no %s, though %s/apis lists it\n", k->path, dir);
      missing = 1;
    }
  }
  if (missing) {
    printf("0 passed, 1 failed\n");
    return 1;
  }
  if (cuda) {
    /* The stub comes with the toolkit whose cuda.h built the fake. */
    g_stub = getenv("IPCREF_CUDA_STUB");
    if ((!g_stub || !*g_stub) && cuda_home && *cuda_home) {
      snprintf(stub, sizeof stub, "%s/lib64/stubs/libcuda.so", cuda_home);
      if (stat(stub, &sb) == 0) g_stub = stub;
    }
    if (!g_stub || !*g_stub) g_stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    if (stat(g_stub, &sb) != 0) {
      printf("test_gpu: no CUDA stub library at %s (IPCREF_CUDA_STUB)\n"
             "0 passed, 1 failed\n",
             g_stub);
      return 1;
    }
  } else {
    printf("test_gpu: note: the CUDA half does not run (not in %s/apis: "
           "tests/fake_gpu/build.sh builds the fake libcuda.so.1 only where "
           "<cuda.h> is found)\n",
           dir);
  }
  if (!hip)
    printf("test_gpu: note: the HIP half does not run (not in %s/apis: "
           "tests/fake_gpu/build.sh builds the fake libamdhip64.so.5 only "
           "where <hip/hip_runtime_api.h> is found)\n",
           dir);
  g_hip_real = getenv("IPCREF_HIP_REAL");
  if (!g_hip_real) g_hip_real = "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5";
  if (!*g_hip_real || stat(g_hip_real, &sb) != 0) g_hip_real = NULL;
  vmm = pool = cuda;
  hip_vmm = hip_pool = hip;
run:
  fixture_start(); /* under_valgrind: IPCREF_UNDER_VALGRIND=1 */
  g_tmo = under_valgrind ? 60000 : 10000;
  g_work_us = under_valgrind ? 400000 : 50000;
  g_fence_us = under_valgrind ? 2000000 : 300000;
  snprintf(g_tmp, sizeof g_tmp, "/tmp/ipcref_gpu_XXXXXX");
  if (!mkdtemp(g_tmp)) {
    perror("mkdtemp");
    return 1;
  }
  fds_ignore = g_tmp; /* the fakes' logs, whose fds outlive dlclose */
  knobs_reset();

/* A case of each half that runs, CUDA's first; RUN_ALL: CUDA's with
 * legacy and VMM memory. */
#define RUN_ONE(test)                                                          \
  do {                                                                         \
    if (!only || strstr(#test, only)) RUN(test);                               \
  } while (0)
#define RUN_BOTH(test)                                                         \
  do {                                                                         \
    if (cuda) RUN_ONE(test##_cuda);                                            \
    if (hip) RUN_ONE(test##_hip);                                              \
  } while (0)
#define RUN_ALL(test)                                                          \
  do {                                                                         \
    if (vmm) RUN_ONE(test##_cuda_vmm);                                         \
    if (pool) RUN_ONE(test##_cuda_pool);                                       \
    RUN_BOTH(test);                                                            \
  } while (0)
/* ... and HIP's with VMM memory (the flows that need no foreign VMM
 * memory made by the test itself: that is CUDA's, above) */
#define RUN_HIP_VMM(test)                                                      \
  do {                                                                         \
    if (hip_vmm) RUN_ONE(test##_hip_vmm);                                      \
  } while (0)
#define RUN_HIP_POOL(test)                                                     \
  do {                                                                         \
    if (hip_pool) RUN_ONE(test##_hip_pool);                                    \
  } while (0)
/* The cases that need the fakes' knobs (timed work, a memory limit, a
 * driver's failures, a second device, granularities) run on them only. */
#define FAKE_ONLY(run)                                                         \
  do {                                                                         \
    if (!g_real) run;                                                          \
  } while (0)
  RUN_ALL(test_full_flow);
  RUN_ALL(test_wrap_offset);
  FAKE_ONLY(RUN_BOTH(test_import_twice));
  FAKE_ONLY(RUN_ALL(test_stream_order));
  FAKE_ONLY(RUN_ALL(test_wait_cached));
  FAKE_ONLY(if (cuda) RUN_ONE(test_event_pool_cuda));
  FAKE_ONLY(if (vmm) RUN_ONE(test_oom_sweep_cuda_vmm));
  FAKE_ONLY(RUN_BOTH(test_oom_sweep)); /* pool memory: the owner's to get */
  RUN_ALL(test_consumer_killed);
  FAKE_ONLY(RUN_BOTH(test_open_errors));
  RUN_ALL(test_self_import);
  RUN_ALL(test_self_import_one_ctx);
  FAKE_ONLY(RUN_BOTH(test_wrap_export_forgotten));
  RUN_ALL(test_lying_size);
  FAKE_ONLY(RUN_BOTH(test_not_ipc_capable));
  RUN_BOTH(test_freed_handle);
  FAKE_ONLY(RUN_ALL(test_device_ops));
  RUN_ALL(test_no_backend_consumer);
  RUN_ALL(test_device_caps);
  RUN_ALL(test_device_reconnect);
  RUN_BOTH(test_bad_args);
  if (vmm) RUN_ONE(test_vmm_hostile_cuda_vmm);
  if (pool) RUN_ONE(test_vmm_hostile_cuda_pool);
  if (pool) RUN_ONE(test_pool_unshareable_cuda_pool);
  FAKE_ONLY(if (cuda) RUN_ONE(test_vmm_choice_cuda));
  FAKE_ONLY(if (cuda) RUN_ONE(test_vmm_chunks_cuda_vmm));
  FAKE_ONLY(if (cuda) RUN_ONE(test_vmm_chunks_forward_cuda_vmm));
  if (hip) RUN_ONE(test_hip_memory_hip);
  RUN_HIP_VMM(test_full_flow);
  FAKE_ONLY(RUN_HIP_VMM(test_stream_order));
  FAKE_ONLY(RUN_HIP_VMM(test_wait_cached));
  FAKE_ONLY(RUN_HIP_VMM(test_oom_sweep));
  RUN_HIP_VMM(test_consumer_killed);
  RUN_HIP_VMM(test_self_import);
  RUN_HIP_VMM(test_self_import_one_ctx);
  RUN_HIP_VMM(test_lying_size);
  FAKE_ONLY(RUN_HIP_VMM(test_device_ops));
  RUN_HIP_VMM(test_no_backend_consumer);
  RUN_HIP_VMM(test_device_caps);
  RUN_HIP_VMM(test_device_reconnect);
  RUN_HIP_POOL(test_full_flow);
  RUN_HIP_POOL(test_wrap_offset);
  FAKE_ONLY(RUN_HIP_POOL(test_stream_order));
  FAKE_ONLY(RUN_HIP_POOL(test_wait_cached));
  RUN_HIP_POOL(test_consumer_killed);
  RUN_HIP_POOL(test_self_import);
  RUN_HIP_POOL(test_self_import_one_ctx);
  RUN_HIP_POOL(test_lying_size);
  FAKE_ONLY(RUN_HIP_POOL(test_device_ops));
  RUN_HIP_POOL(test_no_backend_consumer);
  RUN_HIP_POOL(test_device_caps);
  RUN_HIP_POOL(test_device_reconnect);

  if (getenv("IPCREF_GPU_KEEP_LOGS"))
    printf("call logs kept in %s\n", g_tmp);
  else
    rm_tree(g_tmp);
  rc = harness_finish();
  return rc;
}
