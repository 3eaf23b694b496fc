/* fake_core.h - the one engine behind ipcref's fake GPU drivers (tests only).
 *
 * fake_cuda.c (-> libcuda.so.1) and fake_hip.c (-> libamdhip64.so.5) are thin
 * skins over this file: they check arguments, translate types and error codes
 * and log; device memory, IPC handles, streams and events live here. Every
 * definition is static, so nothing here is exported. There is no GPU: "device
 * memory" is host shared memory and "work" is a timestamp. See
 * the CUDA and HIP documentation for the real behaviour each rule mirrors.
 *
 * A skin defines, before including this file:
 *   FK_PREFIX  knob prefix, "FAKE_CUDA_" or "FAKE_HIP_"
 *   FK_MAGIC   first 4 bytes of every IPC handle it makes ("FKCU" / "FKHP")
 * and then defines fk_code() (FK_E* -> its API's error number) and
 * fk_code_name() (error number -> name, for the log).
 *
 * Device memory. Every allocation is its own memfd (named "fake_gpu:<nonce>",
 * MFD_CLOEXEC), kept open while the allocation lives and mapped MAP_SHARED; the
 * device pointer is the address of that mapping. A per-process table (mutex)
 * records base, size, memfd, inode, nonce, buffer id, device and kind
 * (allocation / not-IPC-capable allocation / import).
 *
 * IPC handle layout (struct fk_handle, 64 bytes = CU_IPC_HANDLE_SIZE, native
 * byte order):
 *   0  u32 magic  FK_MAGIC (a CUDA handle is not a HIP handle)
 *   4  u32 kind   1 = memory, 2 = event
 *   8  i32 pid    exporting process
 *  12  i32 fd     the memfd's number in the exporter
 *  16  u64 ino    the memfd's inode (identity)
 *  24  u64 nonce  random per allocation/event, also in the memfd's name, so a
 *                 new allocation at a reused address gets a new handle
 *  32  u64 size   allocation size
 *  40  i32 dev    device ordinal
 *  44  20 bytes of zeros
 * An importer opens /proc/<pid>/fd/<fd> (same user, exporter alive) and checks
 * inode, nonce and size; if the exporter has exited or freed the allocation
 * the open fails (invalid handle).
 *
 * Streams and events. Nothing runs: a stream only keeps the time its work
 * is done. Recording an event marks it done at max(now + WORK_US, the
 * stream's done time) and moves the stream's time there; waiting on an event
 * moves the stream's time to at least the event's. Queries answer NOT_READY
 * before that time; synchronize calls sleep until it. The NULL (legacy)
 * stream waits for every blocking stream of its device; synchronous copies
 * and memsets run after it and complete at once. Event state is a page of
 * shared memory (a memfd for INTERPROCESS events), so an importer sees the
 * exporter's records and the other way round.
 *
 * A process forked after its parent initialised the driver gets
 * NOT_INITIALIZED from every call (fork before init, as with real drivers).
 *
 * Knobs, read from the environment on every call (a test may change them
 * between calls); <P> is FK_PREFIX:
 *   <P>MODE       unset | stub (CUDA: every call -> CUDA_ERROR_STUB_LIBRARY) |
 *                 nodevice (CUDA: cuInit -> CUDA_ERROR_NO_DEVICE, then
 *                 CUDA_ERROR_NOT_INITIALIZED; HIP: hipGetDeviceCount ->
 *                 hipErrorNoDevice with count 0, other device calls ->
 *                 hipErrorInvalidDevice, as the real 5.2 library here)
 *   <P>DEVICES    number of devices, default 1, at most 8
 *   <P>MEM_LIMIT  bytes of live allocations per process; an allocation that
 *                 would pass it fails with out-of-memory
 *   <P>REOPEN     what a second open of a handle already open in this process
 *                 does: unset = same pointer, reference counted (CUDA 13 doc);
 *                 208 = fail with ALREADY_MAPPED (older drivers, UCX reports);
 *                 new = a separate mapping at another address (HIP >= 6 doc:
 *                 "no guarantee that the same device pointer will be returned")
 *   <P>WORK_US    microseconds that work recorded on a stream takes, default 0
 *   <P>HOSTPTR    rw (default): device pointers are readable/writable host
 *                 addresses; none: they are PROT_NONE, like real device memory
 *                 the host cannot touch (bytes reachable only through copies)
 *   <P>LOG        path of the call log (appended, created if missing)
 *   FAKE_CUDA_DRIVER_VERSION  (CUDA only) cuDriverGetVersion and the highest
 *                 cudaVersion cuGetProcAddress accepts, default 13000
 *   FAKE_HIP_IPC_EVENTS=1     (HIP only) accept hipEventInterprocess, as
 *                 ROCm >= 6 does; by default it fails, as HIP 5.2 says
 *   <P>VMM, <P>POSIX_FD, <P>GRANULARITY  the virtual memory management
 *                 calls (cuMemCreate & co., hipMemCreate & co.): see
 *                 fake_vmm.h
 *   <P>POOLS      the stream-ordered memory pool calls (cuMemPoolCreate &
 *                 co., hipMemPoolCreate & co.): see fake_pool.h (their
 *                 memory is kinds POOL / PIMPORT here)
 *
 * Call log. Each call appends exactly one line with a single write() on an
 * O_APPEND fd, so lines from many processes never interleave:
 *     <pid> <call> <key>=<value> ... -> <result>
 * <call> is the exported name that was called (cuMemAlloc_v2, hipMalloc, ...);
 * <result> the API's error name (CUDA_SUCCESS, hipErrorInvalidContext, ...).
 * Pointers, streams and events are 0x-hex; a memory handle shows as
 * h=<exporter pid>:<nonce, 16 hex digits>, the same in the exporter's get and
 * every importer's open and close ("h=-" when the call failed before there
 * was one). Outputs are logged as keys too (ptr=..).
 * Copies and memsets that touch pool memory (fake_pool.h) add
 * pending_us=<us until its allocation completes> alloc=<its nonce>.
 * Events: rec=<records so far>, done_in_us=<us until the recorded work
 * completes, 0 if complete>. cuStreamWaitEvent/hipStreamWaitEvent log
 * pending_us = how long the event still had to run when the stream began to
 * wait on it.
 */
#ifndef FAKE_CORE_H
#define FAKE_CORE_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FK_MAX_DEV 8
#define FK_EV_DISABLE_TIMING                                                   \
  0x2 /* CU_EVENT_DISABLE_TIMING == hipEventDisableTiming */
#define FK_EV_INTERPROCESS                                                     \
  0x4 /* CU_EVENT_INTERPROCESS == hipEventInterprocess */
#define FK_STREAM_NON_BLOCKING 0x1

/* What went wrong, independent of API; each skin maps these to its numbers. */
enum {
  FK_OK,
  FK_EINVAL,
  FK_ENOMEM,
  FK_ENOINIT,
  FK_ESTUB,
  FK_ENODEV,
  FK_EBADDEV,
  FK_ECTX,      /* no usable context; also an IPC open in the exporter      */
  FK_EMAPPED,   /* second open with REOPEN=208                              */
  FK_EHANDLE,   /* bad stream/event, or an IPC handle that no longer works  */
  FK_ENOTFOUND, /* address-range query on an unknown pointer                */
  FK_ENOTREADY,
  FK_ENOTSUP,
  FK_ENOEXPORT, /* IPC export of what is not the base of an IPC-able alloc  */
  FK_ENOTOPEN,  /* IPC close of what this process did not open              */
  FK_EBADFREE,  /* free of what is not an allocation base                   */
};

static int fk_code(int fk_err);            /* defined by the skin */
static const char *fk_code_name(int code); /* defined by the skin */

/* ---- knobs --------------------------------------------------------------- */

static const char *fk_knob(const char *name) {
  char key[64];
  snprintf(key, sizeof key, FK_PREFIX "%s", name);
  const char *v = getenv(key);
  return v && *v ? v : NULL;
}
static int fk_knob_is(const char *name, const char *value) {
  const char *v = fk_knob(name);
  return v && !strcmp(v, value);
}
static long long fk_knob_num(const char *name, long long dflt) {
  const char *v = fk_knob(name);
  return v ? strtoll(v, NULL, 0) : dflt;
}
static int fk_devices(void) {
  long long n = fk_knob_num("DEVICES", 1);
  return n < 0 ? 0 : n > FK_MAX_DEV ? FK_MAX_DEV : (int)n;
}

/* ---- state --------------------------------------------------------------- */

/* FK_MEM_VMM: fake_gpu_alloc_vmm's not-IPC-capable allocation; FK_MEM_VMAP:
 * a cuMemMap mapping (fake_vmm.h owns it: never freed or reset from here);
 * FK_MEM_POOL / FK_MEM_PIMPORT: a memory pool allocation / an imported pool
 * pointer (fake_pool.h owns them: freed only through it, not with a context) */
enum {
  FK_MEM_ALLOC = 1,
  FK_MEM_VMM,
  FK_MEM_IMPORT,
  FK_MEM_VMAP,
  FK_MEM_POOL,
  FK_MEM_PIMPORT
};

struct fk_mem {
  uintptr_t base; /* device pointer = address of the mapping */
  char *data; /* where the bytes are reached (== base unless HOSTPTR=none) */
  size_t size;
  int kind;
  int dev;   /* DEVICE_ORDINAL (for an import: the exporter's device) */
  int owner; /* device whose context made it (freed when that context dies) */
  int fd;    /* allocation: its memfd, open while it lives; import: -1 */
  int refs;  /* import: open count */
  pid_t src; /* exporting process */
  uint64_t ino, nonce;
  unsigned long long id; /* BUFFER_ID: unique in the process, never reused */
  uint64_t vh;           /* VMAP: the allocation handle mapped (fake_vmm.h) */
  unsigned char access[FK_MAX_DEV]; /* VMAP, POOL, PIMPORT: per device,
                                       1 = read, 3 = rw */
  /* POOL, PIMPORT (fake_pool.h): the pool's handle in this process, its
   * nonce, when the allocation completes (ns), the shared header page, the
   * offset of the pointer an import returned */
  uint64_t pool, pnonce, ready;
  void *aux;
  size_t off;
};

struct fk_stream {
  struct fk_stream *next;
  int dev;
  unsigned flags;
  uint64_t tail; /* CLOCK_MONOTONIC ns at which the stream's work is done */
};

/* An event's state lives in shared memory so that a process that opened its
 * IPC handle sees the recorder's records, whichever process recorded. */
struct fk_evshm {
  uint64_t done; /* ns at which the last recorded work completes; 0 = never */
  uint64_t records;
};

struct fk_event {
  struct fk_event *next;
  int dev, fd, imported;
  unsigned flags;
  uint64_t ino, nonce;
  struct fk_evshm *shm;
};

struct fk_handle {
  uint32_t magic, kind;
  int32_t pid, fd;
  uint64_t ino, nonce, size;
  int32_t dev;
  uint8_t zero[20];
};
_Static_assert(sizeof(struct fk_handle) == 64, "IPC handles are 64 bytes");
enum { FK_H_MEM = 1, FK_H_EVENT = 2 };

static struct {
  pthread_mutex_t mu, logmu;
  pid_t owner; /* process that initialised the driver */
  struct fk_mem *mem;
  size_t nmem, cap, live; /* live: bytes of allocations (not imports) */
  unsigned long long last_id;
  struct fk_stream null_stream[FK_MAX_DEV];
  struct fk_stream *streams;
  struct fk_event *events;
  int logfd;
  char logpath[1024];
} fk = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, .logfd = -1};

#define FK_LOCK()   pthread_mutex_lock(&fk.mu)
#define FK_UNLOCK() pthread_mutex_unlock(&fk.mu)

/* A child forked after the parent initialised the driver cannot use it
 * (CUDA is not fork-safe; hip-tests: "The fork must be performed before the
 * runtime is initialized"). */
static int fk_forked(void) {
  return fk.owner && fk.owner != getpid();
}
static void fk_mark_init(void) {
  if (!fk.owner) fk.owner = getpid();
}

/* ---- time: all processes share CLOCK_MONOTONIC --------------------------- */

static uint64_t fk_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
static void fk_sleep_until(uint64_t ns) {
  struct timespec t = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR) {
  }
}
static unsigned long long fk_us_left(uint64_t done) {
  uint64_t now = fk_now();
  return done > now ? (done - now + 999) / 1000 : 0;
}

/* ---- call log ------------------------------------------------------------ */

static void fk_vlog(const char *call, const char *result, const char *fmt,
                    va_list ap) {
  const char *path = fk_knob("LOG");
  if (!path) return;
  char line[768];
  size_t n = (size_t)snprintf(line, sizeof line, "%d %s", (int)getpid(), call);
  if (fmt && *fmt && n < sizeof line - 1) {
    line[n++] = ' ';
    int k = vsnprintf(line + n, sizeof line - n, fmt, ap);
    n += k > 0 ? (size_t)k : 0;
  }
  if (n < sizeof line)
    n += (size_t)snprintf(line + n, sizeof line - n, " -> %s\n", result);
  if (n >= sizeof line) {
    n = sizeof line;
    line[n - 1] = '\n';
  }
  pthread_mutex_lock(&fk.logmu);
  if (fk.logfd < 0 || strcmp(path, fk.logpath)) {
    if (fk.logfd >= 0) close(fk.logfd);
    fk.logfd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    snprintf(fk.logpath, sizeof fk.logpath, "%s", path);
  }
  if (fk.logfd >= 0) {
    ssize_t w =
        write(fk.logfd, line, n); /* one write: lines never interleave */
    (void)w;                      /* best effort */
  }
  pthread_mutex_unlock(&fk.logmu);
}

/* Log one call and return the API's error number for e. */
__attribute__((format(printf, 3, 4))) static int fk_ret(const char *call, int e,
                                                        const char *fmt, ...) {
  int code = fk_code(e);
  va_list ap;
  va_start(ap, fmt);
  fk_vlog(call, fk_code_name(code), fmt, ap);
  va_end(ap);
  return code;
}

#define FK_P(p) ((unsigned long long)(uintptr_t)(p)) /* for 0x%llx */

static const char *fk_hid(char buf[40], pid_t pid, uint64_t nonce) {
  if (pid)
    snprintf(buf, 40, "%d:%016" PRIx64, (int)pid, nonce);
  else
    snprintf(buf, 40, "-"); /* no handle (the call failed) */
  return buf;
}

/* ---- memfds -------------------------------------------------------------- */

static uint64_t fk_nonce(void) {
  uint64_t n;
  if (getrandom(&n, sizeof n, 0) != (ssize_t)sizeof n)
    n = fk_now() ^ ((uint64_t)getpid() << 40);
  return n | 1;
}

static int fk_memfd(size_t size, uint64_t nonce, uint64_t *ino) {
  char name[40];
  struct stat st;
  snprintf(name, sizeof name, "fake_gpu:%016" PRIx64, nonce);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd >= 0 && (ftruncate(fd, (off_t)size) || fstat(fd, &st))) {
    close(fd);
    fd = -1;
  }
  if (fd >= 0) *ino = (uint64_t)st.st_ino;
  return fd;
}

/* Reach an exporter's memfd the way the fake's "driver" reaches a peer:
 * /proc/<pid>/fd/<fd>, then check it is still the same file (inode, nonce in
 * its name, size). Fails once the exporter exited or closed (freed) it. */
static int fk_proc_open(const struct fk_handle *h) {
  char path[64], link[128], want[40];
  struct stat st;
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  link[n > 0 ? n : 0] = 0;
  snprintf(want, sizeof want, "/memfd:fake_gpu:%016" PRIx64, h->nonce);
  if (strncmp(link, want, strlen(want)) || fstat(fd, &st) ||
      (uint64_t)st.st_ino != h->ino || (uint64_t)st.st_size < h->size) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Map a memfd as device memory (see HOSTPTR). */
static int fk_map(int fd, size_t size, uintptr_t *base, char **data) {
  int hidden = fk_knob_is("HOSTPTR", "none");
  void *b = mmap(NULL, size, hidden ? PROT_NONE : PROT_READ | PROT_WRITE,
                 MAP_SHARED, fd, 0);
  if (b == MAP_FAILED) return -1;
  void *d = b;
  if (hidden && (d = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                          0)) == MAP_FAILED) {
    munmap(b, size);
    return -1;
  }
  *base = (uintptr_t)b;
  *data = d;
  return 0;
}

/* ---- allocation table (callers hold fk.mu) ------------------------------- */

static struct fk_mem *fk_find(uintptr_t p) {
  for (size_t i = 0; i < fk.nmem; i++)
    if (p >= fk.mem[i].base && p - fk.mem[i].base < fk.mem[i].size)
      return &fk.mem[i];
  return NULL;
}

static struct fk_mem *fk_add(void) {
  if (fk.nmem == fk.cap) {
    size_t cap = fk.cap ? 2 * fk.cap : 16;
    struct fk_mem *m = realloc(fk.mem, cap * sizeof *m);
    if (!m) return NULL;
    fk.mem = m;
    fk.cap = cap;
  }
  return &fk.mem[fk.nmem++];
}

static void fk_remove(struct fk_mem *m) {
  munmap((void *)m->base, m->size);
  if (m->data != (char *)m->base) munmap(m->data, m->size);
  if (m->fd >= 0) close(m->fd);
  if (m->kind != FK_MEM_IMPORT && m->kind != FK_MEM_PIMPORT) fk.live -= m->size;
  *m = fk.mem[--fk.nmem];
}

/* What the last copy or memset of this thread touched of pool memory
 * (fake_pool.h): the allocation nonce and how long before the allocation
 * completes (pending_us > 0: it was touched too early). Reset by fk_copy and
 * fk_memset, read by the skin to log it. */
static _Thread_local struct {
  int pool;
  uint64_t nonce;
  unsigned long long pending_us;
} fk_touch;

/* Bytes behind [p, p+n) of device memory, or NULL if that range is not inside
 * one allocation or import (real drivers reject such a copy), or is a VMM
 * mapping or pool memory that device dev may not read (need 1) or write
 * (need 2). */
static char *fk_bytes(uintptr_t p, size_t n, int need, int dev) {
  struct fk_mem *m = fk_find(p);
  int gated = m && (m->kind == FK_MEM_VMAP || m->kind == FK_MEM_POOL ||
                    m->kind == FK_MEM_PIMPORT);
  if (gated && (dev < 0 || dev >= FK_MAX_DEV || !(m->access[dev] & need)))
    return NULL;
  if (m && (m->kind == FK_MEM_POOL || m->kind == FK_MEM_PIMPORT)) {
    unsigned long long us = fk_us_left(m->ready);
    if (!fk_touch.pool || us > fk_touch.pending_us) {
      fk_touch.nonce = m->nonce;
      fk_touch.pending_us = us;
    }
    fk_touch.pool = 1;
  }
  return m && n <= m->size - (p - m->base) ? m->data + (p - m->base) : NULL;
}

/* ---- memory -------------------------------------------------------------- */

static int fk_mem_alloc(uintptr_t *out, size_t size, int kind, int dev) {
  long long limit = fk_knob_num("MEM_LIMIT", -1);
  int e = FK_OK;
  FK_LOCK();
  struct fk_mem m = {
      .size = size, .kind = kind, .dev = dev, .owner = dev, .src = getpid()};
  m.nonce = fk_nonce();
  if (limit >= 0 && (size > (unsigned long long)limit ||
                     fk.live > (unsigned long long)limit - size)) {
    e = FK_ENOMEM; /* cuMemAlloc -> CUDA_ERROR_OUT_OF_MEMORY, hipMalloc ->
                      hipErrorOutOfMemory */
  } else if (!fk_add()) {
    e = FK_ENOMEM;
  } else if ((m.fd = fk_memfd(size, m.nonce, &m.ino)) < 0 ||
             fk_map(m.fd, size, &m.base, &m.data)) {
    if (m.fd >= 0) close(m.fd);
    fk.nmem--; /* give the slot back */
    e = FK_ENOMEM;
  } else {
    m.id = ++fk.last_id;
    fk.mem[fk.nmem - 1] = m;
    fk.live += size;
    *out = m.base;
  }
  FK_UNLOCK();
  return e;
}

static int fk_mem_free(uintptr_t p) {
  if (!p) return FK_OK; /* freeing NULL is a no-op, as cudaFree/hipFree */
  FK_LOCK();
  struct fk_mem *m = fk_find(p);
  int e =
      !m || m->base != p || (m->kind != FK_MEM_ALLOC && m->kind != FK_MEM_VMM)
          ? FK_EBADFREE /* pool memory: fake_pool.h frees it */
          : FK_OK;
  if (!e) fk_remove(m);
  FK_UNLOCK();
  return e;
}

/* cuMemGetAddressRange: the allocation (or import) containing p. */
static int fk_mem_range(uintptr_t p, uintptr_t *base, size_t *size) {
  FK_LOCK();
  struct fk_mem *m = fk_find(p);
  if (m) {
    *base = m->base;
    *size = m->size;
  }
  FK_UNLOCK();
  return m ? FK_OK : FK_ENOTFOUND;
}

/* A copy of the table entry containing p; 0 if none. */
static int fk_mem_info(uintptr_t p, struct fk_mem *out) {
  FK_LOCK();
  struct fk_mem *m = fk_find(p);
  if (m) *out = *m;
  FK_UNLOCK();
  return m != NULL;
}

/* A context (device) went away: its allocations and imports go with it. Not
 * VMM mappings or pool memory: "::cuCtxDestroy() will not destroy memory
 * allocations by ::cuMemCreate(), ::cuMemAllocAsync() and
 * ::cuMemAllocFromPoolAsync()." */
static inline int fk_mem_drop_owner(int dev) {
  int n = 0;
  FK_LOCK();
  for (size_t i = fk.nmem; i-- > 0;)
    if (fk.mem[i].owner == dev &&
        (fk.mem[i].kind == FK_MEM_ALLOC || fk.mem[i].kind == FK_MEM_VMM ||
         fk.mem[i].kind == FK_MEM_IMPORT)) {
      fk_remove(&fk.mem[i]);
      n++;
    }
  FK_UNLOCK();
  return n;
}

/* cuPointerGetAttribute / hipPointerGetAttribute (same numbering). Booleans
 * are written as int (NCCL passes an int for IS_LEGACY_CUDA_IPC_CAPABLE). */
enum {
  FK_PA_CONTEXT = 1,
  FK_PA_MEMORY_TYPE = 2,
  FK_PA_DEVICE_POINTER = 3,
  FK_PA_HOST_POINTER = 4,
  FK_PA_BUFFER_ID = 7,
  FK_PA_IS_MANAGED = 8,
  FK_PA_DEVICE_ORDINAL = 9,
  FK_PA_IS_LEGACY_IPC_CAPABLE = 10,
  FK_PA_RANGE_START_ADDR = 11,
  FK_PA_RANGE_SIZE = 12,
  FK_PA_MAPPED = 13,
};
static int fk_ptr_attr(void *data, int attr, uintptr_t p,
                       unsigned memtype_device, void *const *ctx_of_dev) {
  struct fk_mem m;
  if (!data || !fk_mem_info(p, &m))
    return FK_EINVAL; /* not device memory: invalid value */
  switch (attr) {
  case FK_PA_CONTEXT: *(void **)data = ctx_of_dev[m.owner]; break;
  case FK_PA_MEMORY_TYPE: *(unsigned *)data = memtype_device; break;
  case FK_PA_DEVICE_POINTER: *(uint64_t *)data = p; break;
  case FK_PA_BUFFER_ID: *(unsigned long long *)data = m.id; break;
  case FK_PA_IS_MANAGED: *(int *)data = 0; break;
  case FK_PA_DEVICE_ORDINAL: *(int *)data = m.dev; break;
  case FK_PA_IS_LEGACY_IPC_CAPABLE:
    *(int *)data = m.kind == FK_MEM_ALLOC;
    break;
  case FK_PA_RANGE_START_ADDR: *(uint64_t *)data = m.base; break;
  case FK_PA_RANGE_SIZE: *(size_t *)data = m.size; break;
  case FK_PA_MAPPED: *(int *)data = 1; break;
  case FK_PA_HOST_POINTER:
    return FK_EINVAL;         /* device memory has no host pointer */
  default: return FK_ENOTSUP; /* real drivers answer; the fake does not */
  }
  return FK_OK;
}

/* ---- streams (callers hold fk.mu) ---------------------------------------- */

/* The NULL stream (and CU_STREAM_LEGACY 0x1 / per-thread 0x2) is dev's
 * default stream; anything else must be a live stream. */
static struct fk_stream *fk_stream_find(void *h, int dev) {
  if ((uintptr_t)h <= 2) return dev >= 0 ? &fk.null_stream[dev] : NULL;
  for (struct fk_stream *s = fk.streams; s; s = s->next)
    if (s == h) return s;
  return NULL;
}
static int fk_is_null_stream(const struct fk_stream *s) {
  return s >= fk.null_stream && s < fk.null_stream + FK_MAX_DEV;
}
/* When the legacy default stream of dev is done: it waits for every blocking
 * (not NON_BLOCKING) stream of the device. */
static uint64_t fk_legacy_tail(int dev) {
  uint64_t t = fk.null_stream[dev].tail;
  for (struct fk_stream *s = fk.streams; s; s = s->next)
    if (s->dev == dev && !(s->flags & FK_STREAM_NON_BLOCKING) && s->tail > t)
      t = s->tail;
  return t;
}
static uint64_t fk_stream_tail(struct fk_stream *s) {
  return fk_is_null_stream(s) ? fk_legacy_tail((int)(s - fk.null_stream))
                              : s->tail;
}
/* When everything on dev is done (hipDeviceSynchronize). */
static uint64_t fk_device_tail(int dev) {
  uint64_t t = fk.null_stream[dev].tail;
  for (struct fk_stream *s = fk.streams; s; s = s->next)
    if (s->dev == dev && s->tail > t) t = s->tail;
  return t;
}

static int fk_stream_create(void **out, unsigned flags, int dev) {
  struct fk_stream *s = calloc(1, sizeof *s);
  if (!s) return FK_ENOMEM;
  s->dev = dev;
  s->flags = flags;
  FK_LOCK();
  s->next = fk.streams;
  fk.streams = s;
  FK_UNLOCK();
  *out = s;
  return FK_OK;
}

static int fk_stream_destroy(void *h) {
  int e = FK_EHANDLE;
  FK_LOCK();
  for (struct fk_stream **p = &fk.streams; *p; p = &(*p)->next)
    if (*p == h) {
      *p = (*p)->next;
      free(h);
      e = FK_OK;
      break;
    }
  FK_UNLOCK();
  return e;
}

/* Synchronize (wait=1) or query (wait=0) a stream; dev: current device, or
 * -1 if there is no current context (then the NULL stream is unusable). */
static int fk_stream_sync(void *h, int dev, int wait,
                          unsigned long long *waited_us) {
  FK_LOCK();
  struct fk_stream *s = fk_stream_find(h, dev);
  uint64_t t = s ? fk_stream_tail(s) : 0;
  FK_UNLOCK();
  if (!s) return (uintptr_t)h <= 2 ? FK_ECTX : FK_EHANDLE;
  *waited_us = fk_us_left(t);
  if (wait) fk_sleep_until(t);
  return wait || fk_now() >= t ? FK_OK : FK_ENOTREADY;
}

static inline int fk_device_sync(int dev, unsigned long long *waited_us) {
  FK_LOCK();
  uint64_t t = fk_device_tail(dev);
  FK_UNLOCK();
  *waited_us = fk_us_left(t);
  fk_sleep_until(t);
  return FK_OK;
}

/* ---- synchronous copies: they run on the legacy default stream ----------- */

/* dst_dev/src_dev: whether that side is device memory. */
static int fk_copy(uintptr_t dst, int dst_dev, uintptr_t src, int src_dev,
                   size_t n, int dev) {
  fk_touch.pool = 0;
  if (!n) return FK_OK;
  FK_LOCK();
  uint64_t t = fk_legacy_tail(dev);
  FK_UNLOCK();
  fk_sleep_until(t);
  FK_LOCK();
  char *d = dst_dev ? fk_bytes(dst, n, 2, dev) : (char *)dst;
  const char *s = src_dev ? fk_bytes(src, n, 1, dev) : (const char *)src;
  if (d && s) memmove(d, s, n);
  FK_UNLOCK();
  return d && s ? FK_OK : FK_EINVAL;
}

static int fk_memset(uintptr_t dst, int value, size_t n, int dev) {
  fk_touch.pool = 0;
  if (!n) return FK_OK;
  FK_LOCK();
  uint64_t t = fk_legacy_tail(dev);
  FK_UNLOCK();
  fk_sleep_until(t);
  FK_LOCK();
  char *d = fk_bytes(dst, n, 2, dev);
  if (d) memset(d, value, n);
  FK_UNLOCK();
  return d ? FK_OK : FK_EINVAL;
}

static inline int fk_is_device_ptr(uintptr_t p) {
  FK_LOCK();
  int yes = fk_find(p) != NULL;
  FK_UNLOCK();
  return yes;
}

/* ---- IPC memory ---------------------------------------------------------- */

static int fk_ipc_get_mem(struct fk_handle *h, uintptr_t p) {
  FK_LOCK();
  struct fk_mem *m = fk_find(p);
  /* "Takes a pointer to the base of an existing device memory allocation
   * created with cuMemAlloc": not an interior pointer, not an import, not
   * VMM or pool memory (cudarc#521: CUDA_ERROR_INVALID_VALUE). */
  int e = !m || m->base != p || m->kind != FK_MEM_ALLOC ? FK_ENOEXPORT : FK_OK;
  if (!e)
    *h = (struct fk_handle){FK_MAGIC, FK_H_MEM, (int32_t)getpid(),
                            m->fd,    m->ino,   m->nonce,
                            m->size,  m->dev,   {0}};
  FK_UNLOCK();
  return e;
}

static int fk_ipc_open_mem(uintptr_t *out, const struct fk_handle *h, int dev) {
  if (h->magic != FK_MAGIC || h->kind != FK_H_MEM) return FK_EHANDLE;
  /* Opening in the exporting process: UCX "cuIpcOpenMemHandle() failed:
   * invalid device context"; hip-tests expect hipErrorInvalidContext. */
  if (h->pid == getpid()) return FK_ECTX;
  int e = FK_OK, fresh = fk_knob_is("REOPEN", "new");
  FK_LOCK();
  for (size_t i = 0; i < fk.nmem && !fresh; i++) {
    struct fk_mem *m = &fk.mem[i];
    if (m->kind == FK_MEM_IMPORT && m->src == h->pid && m->nonce == h->nonce) {
      /* CUDA 13: "If the memory handle has already been opened by the
       * current context, the reference count on the handle is incremented
       * by 1 and the existing device pointer is returned." */
      if (fk_knob_is("REOPEN", "208"))
        e = FK_EMAPPED;
      else {
        m->refs++;
        *out = m->base;
      }
      FK_UNLOCK();
      return e;
    }
  }
  struct fk_mem m = {.size = h->size,
                     .kind = FK_MEM_IMPORT,
                     .dev = h->dev,
                     .owner = dev,
                     .fd = -1,
                     .refs = 1,
                     .src = h->pid,
                     .ino = h->ino,
                     .nonce = h->nonce};
  int fd = fk_proc_open(h);
  if (fd < 0) {
    e = FK_EHANDLE; /* exporter gone, or the allocation freed */
  } else if (!fk_add()) {
    e = FK_ENOMEM;
  } else if (fk_map(fd, h->size, &m.base, &m.data)) {
    fk.nmem--;
    e = FK_ENOMEM;
  } else {
    m.id = ++fk.last_id;
    fk.mem[fk.nmem - 1] = m;
    *out = m.base;
  }
  if (fd >= 0) close(fd); /* the mapping keeps the memory */
  FK_UNLOCK();
  return e;
}

/* cuIpcCloseMemHandle: "Decrements the reference count ... When the reference
 * count reaches 0, this API unmaps the memory." */
static int fk_ipc_close_mem(uintptr_t p, pid_t *src, uint64_t *nonce) {
  FK_LOCK();
  struct fk_mem *m = fk_find(p);
  int e = !m || m->base != p || m->kind != FK_MEM_IMPORT ? FK_ENOTOPEN : FK_OK;
  if (!e) {
    *src = m->src;
    *nonce = m->nonce;
    if (--m->refs == 0) fk_remove(m);
  }
  FK_UNLOCK();
  return e;
}

/* ---- events -------------------------------------------------------------- */

static int fk_event_create(void **out, unsigned flags, int dev) {
  struct fk_event *ev = calloc(1, sizeof *ev);
  if (!ev) return FK_ENOMEM;
  ev->dev = dev;
  ev->flags = flags;
  ev->fd = -1;
  void *p = MAP_FAILED;
  if (flags &
      FK_EV_INTERPROCESS) { /* shareable: a memfd another process can open */
    ev->nonce = fk_nonce();
    ev->fd = fk_memfd(sizeof *ev->shm, ev->nonce, &ev->ino);
    if (ev->fd >= 0)
      p = mmap(NULL, sizeof *ev->shm, PROT_READ | PROT_WRITE, MAP_SHARED,
               ev->fd, 0);
  } else {
    p = mmap(NULL, sizeof *ev->shm, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  }
  if (p == MAP_FAILED) {
    if (ev->fd >= 0) close(ev->fd);
    free(ev);
    return FK_ENOMEM;
  }
  ev->shm = p;
  FK_LOCK();
  ev->next = fk.events;
  fk.events = ev;
  FK_UNLOCK();
  *out = ev;
  return FK_OK;
}

static struct fk_event *fk_event_find(void *h) /* fk.mu held */
{
  for (struct fk_event *ev = fk.events; ev; ev = ev->next)
    if (ev == h) return ev;
  return NULL;
}

static int fk_event_destroy(void *h) {
  FK_LOCK();
  struct fk_event *ev = NULL;
  for (struct fk_event **p = &fk.events; *p; p = &(*p)->next)
    if (*p == h) {
      ev = *p;
      *p = ev->next;
      break;
    }
  FK_UNLOCK();
  if (!ev) return FK_EHANDLE;
  munmap(ev->shm, sizeof *ev->shm);
  if (ev->fd >= 0) close(ev->fd);
  free(ev);
  return FK_OK;
}

/* Record: the event completes when the work on the stream so far does, and
 * that work takes WORK_US from now. */
static int fk_event_record(void *h, void *stream, int dev,
                           unsigned long long *rec,
                           unsigned long long *done_in_us) {
  uint64_t work = (uint64_t)fk_knob_num("WORK_US", 0) * 1000u;
  FK_LOCK();
  struct fk_event *ev = fk_event_find(h);
  struct fk_stream *s = fk_stream_find(stream, dev);
  if (ev && s) {
    uint64_t done = fk_now() + work;
    if (s->tail > done) done = s->tail;
    s->tail = done;
    __atomic_store_n(&ev->shm->done, done, __ATOMIC_RELEASE);
    *rec = __atomic_add_fetch(&ev->shm->records, 1, __ATOMIC_ACQ_REL);
    *done_in_us = fk_us_left(done);
  }
  FK_UNLOCK();
  if (!ev || (!s && (uintptr_t)stream > 2)) return FK_EHANDLE;
  return s ? FK_OK : FK_ECTX;
}

/* Query (wait=0) or synchronize (wait=1). A never-recorded event is complete.
 */
static int fk_event_sync(void *h, int wait, unsigned long long *left_us) {
  FK_LOCK();
  struct fk_event *ev = fk_event_find(h);
  uint64_t done = ev ? __atomic_load_n(&ev->shm->done, __ATOMIC_ACQUIRE) : 0;
  FK_UNLOCK();
  if (!ev) return FK_EHANDLE;
  *left_us = fk_us_left(done);
  if (wait) fk_sleep_until(done);
  return wait || fk_now() >= done ? FK_OK : FK_ENOTREADY;
}

/* cuStreamWaitEvent: later work on the stream cannot finish before the
 * event's last record (read now, from shared memory, wherever recorded). */
static int fk_stream_wait_event(void *stream, void *h, int dev,
                                unsigned long long *pending_us) {
  FK_LOCK();
  struct fk_event *ev = fk_event_find(h);
  struct fk_stream *s = fk_stream_find(stream, dev);
  if (ev && s) {
    uint64_t done = __atomic_load_n(&ev->shm->done, __ATOMIC_ACQUIRE);
    if (done > s->tail) s->tail = done;
    *pending_us = fk_us_left(done);
  }
  FK_UNLOCK();
  if (!ev || (!s && (uintptr_t)stream > 2)) return FK_EHANDLE;
  return s ? FK_OK : FK_ECTX;
}

static int fk_ipc_get_event(struct fk_handle *h, void *event) {
  FK_LOCK();
  struct fk_event *ev = fk_event_find(event);
  /* "This event must have been created with the CU_EVENT_INTERPROCESS and
   * CU_EVENT_DISABLE_TIMING flags set"; an opened event is not re-exported. */
  int e = !ev                                                 ? FK_EHANDLE
          : !(ev->flags & FK_EV_INTERPROCESS) || ev->imported ? FK_EINVAL
                                                              : FK_OK;
  if (!e)
    *h = (struct fk_handle){FK_MAGIC,        FK_H_EVENT, (int32_t)getpid(),
                            ev->fd,          ev->ino,    ev->nonce,
                            sizeof *ev->shm, ev->dev,    {0}};
  FK_UNLOCK();
  return e;
}

static int fk_ipc_open_event(void **out, const struct fk_handle *h, int dev) {
  if (h->magic != FK_MAGIC || h->kind != FK_H_EVENT) return FK_EINVAL;
  /* HIP 5.2 header: "If the handle is returned by hipIpcGetEventHandle [in
   * this process], it will return hipErrorInvalidContext". */
  if (h->pid == getpid()) return FK_ECTX;
  int fd = fk_proc_open(h);
  if (fd < 0) return FK_EHANDLE;
  void *p = mmap(NULL, sizeof(struct fk_evshm), PROT_READ | PROT_WRITE,
                 MAP_SHARED, fd, 0);
  close(fd);
  struct fk_event *ev = p == MAP_FAILED ? NULL : calloc(1, sizeof *ev);
  if (!ev) {
    if (p != MAP_FAILED) munmap(p, sizeof(struct fk_evshm));
    return FK_ENOMEM;
  }
  /* "behaves like a locally created event with CU_EVENT_DISABLE_TIMING" */
  *ev = (struct fk_event){.dev = dev,
                          .fd = -1,
                          .imported = 1,
                          .flags = FK_EV_DISABLE_TIMING,
                          .ino = h->ino,
                          .nonce = h->nonce,
                          .shm = p};
  FK_LOCK();
  ev->next = fk.events;
  fk.events = ev;
  FK_UNLOCK();
  *out = ev;
  return FK_OK;
}

/* What dlclose must release: the log's fd and the tables (a real driver
 * unloaded leaks nothing that a test could count). */
__attribute__((destructor)) static void fk_fini(void) {
  if (fk.logfd >= 0) close(fk.logfd);
  free(fk.mem);
}

#endif /* FAKE_CORE_H */
