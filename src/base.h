/* base: result codes, configuration, the error hook, allocation and atomics.
 *
 * Every other layer stands on this one. It has no state but the process-wide
 * error hook, and makes no system call. */

/* The sharing layer's implementation uses Linux APIs that glibc declares
 * only under _GNU_SOURCE, which must be set before the first system header
 * of the file: set it when this header comes first. */
#if defined(IPCREF_IMPLEMENTATION) && !defined(IPCREF_NO_SHARING) &&           \
    !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1
#endif

#include <stddef.h>
#include <stdint.h>

#define IPCREF_VERSION_MAJOR  0
#define IPCREF_VERSION_MINOR  1
#define IPCREF_VERSION_PATCH  0
#define IPCREF_VERSION_STRING "0.1.0"

/* IPCREF_API decorates every public function. IPCREF_STATIC makes them all
 * static (the implementation then has to be in the same translation unit). */
#ifndef IPCREF_API
#if defined(IPCREF_STATIC) && (defined(__GNUC__) || defined(__clang__))
#define IPCREF_API static __attribute__((unused))
#elif defined(IPCREF_STATIC)
#define IPCREF_API static
#else
#define IPCREF_API extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Every fallible function returns one of these: 0 is success, errors are
 * negative. The values are part of the ABI and are never renumbered. */
typedef enum ipcref_result {
  IPCREF_OK = 0,
  IPCREF_EINVAL = -1,      /* an argument is invalid (NULL, bad dim, ...) */
  IPCREF_ENOMEM = -2,      /* the allocator returned NULL */
  IPCREF_ERANGE = -3,      /* a size, index or offset is out of range */
  IPCREF_EBUSY = -4,       /* the object is shared where it must be unique */
  IPCREF_EPROTO = -5,      /* a message from another process is malformed */
  IPCREF_ESYS = -6,        /* a system call failed (errno says which) */
  IPCREF_ENODEV = -7,      /* the device or its driver is not available */
  IPCREF_EPEER = -8,       /* the peer is gone or not allowed */
  IPCREF_ETIMEDOUT = -9,   /* the wait ran out */
  IPCREF_ESATURATED = -10, /* a reference count saturated: the object leaks */
  IPCREF_EDEAD = -11,      /* the object was already released or freed (or
                              is its parent's, in a forked child) */
  IPCREF_ENEEDCOPY = -12,  /* not possible without copying the data */
  IPCREF_EDEVICE = -13,    /* device memory: the host cannot touch it */
  IPCREF_EAGAIN = -14,     /* not now: nothing was done; call again once the
                              peer can go on (see ipcref_peer_wants) */
  IPCREF_ENOTSUP = -15     /* the driver or the memory does not support it
                              (the backend's error says what is missing) */
} ipcref_result;

/* A short English description of `r`. Unknown values give "unknown error".
 * Cannot fail; the string is static. */
IPCREF_API const char *ipcref_strerror(ipcref_result r);

/* The error hook hears about misuse that cannot be reported through a return
 * value: a reference count that saturated (the object is leaked on purpose
 * instead of being freed early), or a release on an object that was already
 * dead (refused, so nothing is freed twice). It also hears why a call
 * refused where the code alone does not say what to do instead (a legacy
 * DLPack export of read-only memory: ENEEDCOPY, and the message names the
 * ways out), and why an argument was refused: every IPCREF_EINVAL (and a
 * DLPack IPCREF_EPROTO) is told as "function: reason", naming the public
 * function called, the argument and the check that failed ("ipcref_view_slice:
 * step is 0"). The hook runs only on such a failure, never on success. It
 * must be reentrant; it may run on any thread, and it may run with a
 * sharing context locked (what a peer did wrong): it must not call ipcref,
 * which could wait for that lock (note the message; act on it later). */
typedef struct ipcref_error_hook {
  void (*fn)(void *user, ipcref_result code, const char *message);
  void *user;
} ipcref_error_hook;

/* Installs `hook` process-wide and returns the previous one (NULL for the
 * default). `hook` must stay valid until it is replaced; NULL restores the
 * default, which prints to stderr in debug builds (IPCREF_DEBUG) and is
 * silent otherwise. Cannot fail. */
IPCREF_API const ipcref_error_hook *
ipcref_set_error_hook(const ipcref_error_hook *hook);

/* A run-time allocator, for callers that keep their own heaps (arenas, a
 * game engine's allocator). `alloc` returns memory aligned for any object
 * (as malloc does) or NULL; `free` gets back the pointer and the size that
 * `alloc` was asked for. `user` is passed to both. */
typedef struct ipcref_allocator {
  void *(*alloc)(void *user, size_t size);
  void (*free)(void *user, void *ptr, size_t size);
  void *user;
} ipcref_allocator;

#ifdef __cplusplus
}
#endif

/* @implementation */

#include <string.h>

#ifndef IPCREF_ASSERT
#include <assert.h>
#define IPCREF_ASSERT(c) assert(c)
#endif

#if !defined(IPCREF_DEBUG) && !defined(NDEBUG)
#define IPCREF_DEBUG 1
#endif

#if defined(IPCREF_MALLOC) && defined(IPCREF_FREE) && defined(IPCREF_REALLOC)
/* all three given */
#elif !defined(IPCREF_MALLOC) && !defined(IPCREF_FREE) &&                      \
    !defined(IPCREF_REALLOC)
#include <stdlib.h>
#define IPCREF_MALLOC(size)       malloc(size)
#define IPCREF_REALLOC(ptr, size) realloc(ptr, size)
#define IPCREF_FREE(ptr)          free(ptr)
#else
#error                                                                         \
    "ipcref: define all of IPCREF_MALLOC, IPCREF_REALLOC and IPCREF_FREE, or none"
#endif

#if defined(IPCREF_DEBUG) && !defined(IPCREF_NO_STDIO)
#include <stdio.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define IPCREF__PRIVATE     static __attribute__((unused))
#define IPCREF__LIKELY(x)   __builtin_expect(!!(x), 1)
#define IPCREF__UNLIKELY(x) __builtin_expect(!!(x), 0)
#define IPCREF__NOINLINE    __attribute__((noinline))
#define IPCREF__INLINE      inline __attribute__((always_inline))
#define IPCREF__COLD        __attribute__((cold))
#else
#error "ipcref needs GCC or Clang (it uses their __atomic builtins)"
#endif

/* ThreadSanitizer does not model stand-alone fences, so under TSan the
 * acquire fence that precedes a destruction becomes an acquire load of the
 * counter that just reached zero (the same trick as Rust's Arc). */
#if defined(__SANITIZE_THREAD__)
#define IPCREF__TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define IPCREF__TSAN 1
#endif
#endif
#ifdef IPCREF__TSAN
#define IPCREF__ACQUIRE_FENCE(counter)                                         \
  ((void)__atomic_load_n((counter), __ATOMIC_ACQUIRE))
#else
#define IPCREF__ACQUIRE_FENCE(counter)                                         \
  ((void)(counter), __atomic_thread_fence(__ATOMIC_ACQUIRE))
#endif

IPCREF_API const char *ipcref_strerror(ipcref_result r) {
  switch (r) {
  case IPCREF_OK: return "success";
  case IPCREF_EINVAL: return "invalid argument";
  case IPCREF_ENOMEM: return "out of memory";
  case IPCREF_ERANGE: return "size, index or offset out of range";
  case IPCREF_EBUSY: return "object is shared where it must be unique";
  case IPCREF_EPROTO: return "malformed or untrusted message";
  case IPCREF_ESYS: return "system call failed";
  case IPCREF_ENODEV: return "device or driver not available";
  case IPCREF_EPEER: return "peer is gone or not allowed";
  case IPCREF_ETIMEDOUT: return "timed out";
  case IPCREF_ESATURATED: return "reference count saturated; the object leaks";
  case IPCREF_EDEAD: return "the object was already released or freed";
  case IPCREF_ENEEDCOPY:
    return "not possible without a copy (the strides, or memory mapped "
           "read-only, do not allow it)";
  case IPCREF_EDEVICE:
    return "the memory is on a device, where the host cannot touch it";
  case IPCREF_EAGAIN:
    return "not now: nothing to receive, or the peer's socket is full, its "
           "hello has not come, or it holds its max_bytes_held";
  case IPCREF_ENOTSUP:
    return "not supported by the driver or by this kind of memory";
  }
  return "unknown error";
}

/* The installed hook; NULL means the default. Published with release and
 * read with acquire so that a hook's fields are visible before its use. */
static const ipcref_error_hook *ipcref__error_hook;

IPCREF_API const ipcref_error_hook *
ipcref_set_error_hook(const ipcref_error_hook *hook) {
  return __atomic_exchange_n(&ipcref__error_hook, hook, __ATOMIC_ACQ_REL);
}

IPCREF__PRIVATE IPCREF__NOINLINE void ipcref__report(ipcref_result code,
                                                     const char *message) {
  const ipcref_error_hook *h =
      __atomic_load_n(&ipcref__error_hook, __ATOMIC_ACQUIRE);
  if (h && h->fn) {
    h->fn(h->user, code, message);
    return;
  }
#if defined(IPCREF_DEBUG) && !defined(IPCREF_NO_STDIO)
  fprintf(stderr, "ipcref: %s (%s)\n", message, ipcref_strerror(code));
#endif
}

/* A message for the hook, put together without stdio (IPCREF_NO_STDIO
 * builds have no snprintf): strings and integers appended, cut at the end
 * of the buffer. Start with n = 0. */
typedef struct ipcref__msg {
  char s[192];
  size_t n;
} ipcref__msg;

IPCREF__PRIVATE void ipcref__msg_str(ipcref__msg *m, const char *s) {
  while (*s && m->n + 1 < sizeof m->s) m->s[m->n++] = *s++;
  m->s[m->n] = '\0';
}

IPCREF__PRIVATE void ipcref__msg_int(ipcref__msg *m, int64_t v) {
  char d[24];
  int i = (int)sizeof d - 1;
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  d[i] = '\0';
  do {
    d[--i] = (char)('0' + (int)(u % 10));
    u /= 10;
  } while (u);
  if (v < 0) d[--i] = '-';
  ipcref__msg_str(m, d + i);
}

/* A misuse met by public function `fn`, to the hook as "fn: what". */
IPCREF__PRIVATE IPCREF__NOINLINE void
ipcref__report_in(ipcref_result code, const char *fn, const char *what) {
  ipcref__msg m;
  m.n = 0;
  ipcref__msg_str(&m, fn);
  ipcref__msg_str(&m, ": ");
  ipcref__msg_str(&m, what);
  ipcref__report(code, m.s);
}

/* Public function `fn` refuses an argument: the hook hears "fn: why" with
 * IPCREF_EINVAL, which is returned. A site reads
 *     if (step == 0) return ipcref__invalid(__func__, "step is 0");
 * Out of line and cold: the success path pays nothing more. */
IPCREF__PRIVATE IPCREF__NOINLINE IPCREF__COLD ipcref_result
ipcref__invalid(const char *fn, const char *why) {
  ipcref__report_in(IPCREF_EINVAL, fn, why);
  return IPCREF_EINVAL;
}

IPCREF__PRIVATE void *ipcref__default_alloc(void *user, size_t size) {
  (void)user;
  return IPCREF_MALLOC(size);
}

IPCREF__PRIVATE void ipcref__default_free(void *user, void *ptr, size_t size) {
  (void)user;
  (void)size;
  IPCREF_FREE(ptr);
}

static const ipcref_allocator ipcref__default_allocator = {
    ipcref__default_alloc, ipcref__default_free, NULL};

/* a + b into *out; 0 on overflow. */
IPCREF__PRIVATE int ipcref__add_size(size_t a, size_t b, size_t *out) {
  if (a > SIZE_MAX - b) return 0;
  *out = a + b;
  return 1;
}
