/* buf: an atomically reference-counted allocation, in the manner of Rust's
 * Arc. One allocation holds the header and the data; strong references keep
 * the data alive, weak references keep only the header. */

#ifdef __cplusplus
extern "C" {
#endif

/* Where a buffer's memory lives, in DLPack's terms: a device type and an
 * ordinal. Host memory is {IPCREF_DEVICE_CPU, 0}. The host never reads or
 * writes device memory: what would copy it on the host (make_mut,
 * contiguous, copy) refuses with IPCREF_EDEVICE. */
typedef struct ipcref_device {
  int32_t type; /* DLPack's DLDeviceType */
  int32_t id;
} ipcref_device;
#define IPCREF_DEVICE_CPU  1  /* kDLCPU */
#define IPCREF_DEVICE_CUDA 2  /* kDLCUDA */
#define IPCREF_DEVICE_ROCM 10 /* kDLROCM */

/* A buffer: opaque. Handles are plain pointers; each one you hold is one
 * strong reference. */
typedef struct ipcref_buf ipcref_buf;
/* A weak reference to a buffer: keeps its header, not its data. */
typedef struct ipcref_weak ipcref_weak;

/* Allocates a buffer of `size` bytes whose data is 64-byte aligned and not
 * initialized. The new buffer has one strong reference, returned in *out.
 * Errors: EINVAL (out is NULL), ERANGE (size too large to represent),
 * ENOMEM. On error *out is left unchanged. */
IPCREF_API ipcref_result ipcref_buf_new(size_t size, ipcref_buf **out);

/* As ipcref_buf_new, with the data aligned to `align`, a power of two.
 * Errors: EINVAL (out is NULL, align is 0 or not a power of two), ERANGE,
 * ENOMEM. */
IPCREF_API ipcref_result ipcref_buf_new_aligned(size_t size, size_t align,
                                                ipcref_buf **out);

/* As ipcref_buf_new_aligned, with the header and data taken from
 * `allocator` (copied; its `user` must outlive the buffer). The buffer is
 * returned to the same allocator. A NULL allocator means the default.
 * Errors: as ipcref_buf_new_aligned, and EINVAL for an allocator whose
 * alloc or free is NULL. */
IPCREF_API ipcref_result ipcref_buf_new_in(const ipcref_allocator *allocator,
                                           size_t size, size_t align,
                                           ipcref_buf **out);

/* Adopts memory the caller allocated. When the last strong reference goes,
 * `release(user, data)` is called exactly once (a NULL release means the
 * memory is borrowed and nothing is called). On error nothing is adopted,
 * `release` is never called, and the caller still owns `data`.
 * Errors: EINVAL (out is NULL, or data is NULL with a non-zero size),
 * ERANGE (size larger than PTRDIFF_MAX, or memory that would wrap past the
 * end of the address space), ENOMEM (for the header). */
IPCREF_API ipcref_result ipcref_buf_wrap(void *data, size_t size,
                                         void (*release)(void *user,
                                                         void *data),
                                         void *user, ipcref_buf **out);

/* As ipcref_buf_wrap, for memory on a device: `data` is the device
 * address (never dereferenced here). Errors: as ipcref_buf_wrap, and
 * EINVAL for a device type below 1 or a negative id. */
IPCREF_API ipcref_result ipcref_buf_wrap_device(
    void *data, size_t size, ipcref_device device,
    void (*release)(void *user, void *data), void *user, ipcref_buf **out);

/* The device the buffer's memory is on ({IPCREF_DEVICE_CPU, 0} for host
 * memory and for NULL). */
IPCREF_API ipcref_device ipcref_buf_device(const ipcref_buf *b);

/* Takes one more strong reference and returns `b` (NULL gives NULL). The
 * caller must already hold one. Cannot fail: past 2^31-1 references the
 * count saturates, the buffer is never freed (a leak, never a premature
 * free), and the error hook hears IPCREF_ESATURATED. */
IPCREF_API ipcref_buf *ipcref_buf_retain(ipcref_buf *b);

/* Drops one strong reference; the last one releases the data, and the
 * header too unless weak references remain. NULL is a no-op. A release on a
 * buffer whose count is already zero is refused and reported to the error
 * hook as IPCREF_EDEAD (every time); it never frees twice. */
IPCREF_API void ipcref_buf_release(ipcref_buf *b);

/* The data pointer (NULL for NULL). Reading through it is always allowed
 * while you hold a reference; writing needs ipcref_buf_get_mut. */
IPCREF_API void *ipcref_buf_data(const ipcref_buf *b);

/* The size in bytes (0 for NULL). */
IPCREF_API size_t ipcref_buf_size(const ipcref_buf *b);

/* The number of strong references, read without synchronization (another
 * thread may change it at once). SIZE_MAX once saturated; 0 for NULL. */
IPCREF_API size_t ipcref_buf_strong_count(const ipcref_buf *b);

/* The number of weak references (not counting the one all strong
 * references share), read without synchronization; 0 for NULL. */
IPCREF_API size_t ipcref_buf_weak_count(const ipcref_buf *b);

/* 1 when the caller's reference is the only one, strong or weak, else 0
 * (also for NULL). While it holds, nobody else can gain a reference. */
IPCREF_API int ipcref_buf_is_unique(ipcref_buf *b);

/* A writable pointer to the data when the caller's reference is the only
 * one, strong or weak, and no other process reads the memory; NULL when
 * the buffer is shared, when its memory is read-only (a consumer's mapping
 * of another process's buffer), while a consumer holds it (a shared
 * buffer sent and not yet released by every process it went to), or when
 * b is NULL. A sent buffer is writable again, without a copy, once its
 * consumers let it go: the returns are swept here. A producer that
 * synchronizes with its consumers itself (they acknowledge, say) opens the
 * buffer for shared writes instead (ipcref_buf_set_shared_mut) and writes
 * through its views. */
IPCREF_API void *ipcref_buf_get_mut(ipcref_buf *b);

/* Copy-on-write. When *b is unique, its memory writable here and held by
 * no consumer, this does nothing. Otherwise (shared, a read-only mapping
 * of another process's block, or a block a consumer holds) it copies the data
 * into a new buffer (same size and alignment), releases the caller's reference
 * to the old one and stores the new one in *b; weak references keep pointing at
 * the old buffer. Afterwards ipcref_buf_get_mut(*b) succeeds. Errors: EINVAL (b
 * or *b is NULL), ENOMEM (*b unchanged), EDEVICE (device memory, shared: the
 * host cannot copy it). */
IPCREF_API ipcref_result ipcref_buf_make_mut(ipcref_buf **b);

/* A new weak reference to `b` (the caller holds a strong one); NULL gives
 * NULL. Cannot fail (saturates like ipcref_buf_retain). */
IPCREF_API ipcref_weak *ipcref_buf_downgrade(ipcref_buf *b);

/* A new strong reference, or NULL once the data is gone (or w is NULL).
 * Never revives a buffer whose last strong reference is being released on
 * another thread at the same moment. */
IPCREF_API ipcref_buf *ipcref_weak_upgrade(ipcref_weak *w);

/* Drops a weak reference; the last reference of all frees the header.
 * NULL is a no-op. */
IPCREF_API void ipcref_weak_release(ipcref_weak *w);

/* Opens (on != 0) or closes a buffer for shared writes: its views are then
 * writable (ipcref_view_data_mut, ipcref_view_copy) although other
 * references exist, and the holders synchronize their writes themselves.
 * ipcref_buf_get_mut keeps the strict rule. The flag belongs to this
 * process's buffer: it does not travel to other processes, and it makes no
 * memory writable that is mapped read-only (a consumer maps a producer's
 * segments writable only when the producer's context has the option
 * writable_shares). Cannot fail; NULL is a no-op. */
IPCREF_API void ipcref_buf_set_shared_mut(ipcref_buf *b, int on);

/* 1 when `b` was opened for shared writes, else 0 (also for NULL). */
IPCREF_API int ipcref_buf_is_shared_mut(const ipcref_buf *b);

#ifdef IPCREF_TEST_HOOKS
/* Tests only: overwrite the raw counters (the weak one includes the
 * reference all strong ones share). */
IPCREF_API void ipcref_test_set_counts(ipcref_buf *b, int32_t strong,
                                       int32_t weak);
#endif

#ifdef __cplusplus
}
#endif

/* @implementation */

/* The counters are signed 32-bit, as in Linux's refcount_t. A count that
 * would pass INT32_MAX, or that is found at zero or below when it must not
 * be, is pinned at IPCREF__SATURATED: far from both zero and the overflow
 * edge, so that racing increments and decrements cannot bring it back to a
 * value that frees. A saturated buffer leaks; it is never freed early. */
#define IPCREF__SATURATED ((int32_t)(INT32_MIN / 2))
/* The weak count is "locked" with this value while is_unique looks at the
 * strong count, so that no weak reference can be upgraded meanwhile. */
#define IPCREF__WEAK_LOCKED INT32_MIN

#define IPCREF__BUF_SHARED_MUT 1u /* flags: opened for shared writes */
#define IPCREF__BUF_READ_ONLY  2u /* flags: the memory cannot be written */

struct ipcref_buf {
  int32_t strong; /* atomic */
  int32_t weak;   /* atomic; strong references together hold one */
  uint32_t flags; /* atomic; IPCREF__BUF_* */
  void *data;
  size_t size;
  size_t align;
  void (*release)(void *user, void *data); /* NULL: data is inline */
  void *release_user;
  ipcref_allocator allocator; /* allocated the header (and inline data) */
  size_t alloc_size;
  ipcref_device device;
};

/* The slow path of every counter change that found `old` where it must not
 * be. A dead object (old == 0) stays dead: the count goes back to zero, so
 * that no later release can free it again and no upgrade can revive it.
 * An overflow pins the count at IPCREF__SATURATED for good. */
IPCREF__PRIVATE IPCREF__NOINLINE void
ipcref__saturate(int32_t *counter, int32_t old, const char *what) {
  if (old == 0) {
    __atomic_store_n(counter, 0, __ATOMIC_RELAXED);
    ipcref__report(IPCREF_EDEAD, what);
    return;
  }
  __atomic_store_n(counter, IPCREF__SATURATED, __ATOMIC_RELAXED);
  if (old > 0) ipcref__report(IPCREF_ESATURATED, what);
  /* old < 0: already saturated; keep it pinned and stay quiet. */
}

/* IPCREF_CHECKED: 1 (and a report naming `fn`) when `b` was released,
 * its data gone. Its header is still readable: it waits in the
 * quarantine, or in its context. */
IPCREF__PRIVATE IPCREF__NOINLINE int ipcref__buf_dead(const ipcref_buf *b,
                                                      const char *fn) {
  if (__atomic_load_n(&b->strong, __ATOMIC_ACQUIRE) != 0) return 0;
  ipcref__report_in(IPCREF_EDEAD, fn, "the buffer was already released");
  return 1;
}
#ifdef IPCREF_CHECKED
#define IPCREF__BUF_CHECK(b, ret)                                              \
  do {                                                                         \
    if ((b) && ipcref__buf_dead((b), __func__)) return ret;                    \
  } while (0)
#else
#define IPCREF__BUF_CHECK(b, ret) ((void)0)
#endif

/* A new buffer, for public function `fn` (named in a refusal). */
IPCREF__PRIVATE ipcref_result ipcref__buf_alloc(const ipcref_allocator *a,
                                                size_t size, size_t align,
                                                ipcref_buf **out,
                                                const char *fn) {
  size_t total, addr;
  unsigned char *raw;
  ipcref_buf *b;
  if (!out) return ipcref__invalid(fn, "out is NULL");
  if (align == 0) return ipcref__invalid(fn, "align is 0");
  if ((align & (align - 1)) != 0)
    return ipcref__invalid(fn, "align is not a power of two");
  if (!a) a = &ipcref__default_allocator;
  if (!a->alloc) return ipcref__invalid(fn, "allocator->alloc is NULL");
  if (!a->free) return ipcref__invalid(fn, "allocator->free is NULL");
  if (size > (size_t)PTRDIFF_MAX) return IPCREF_ERANGE;
  if (!ipcref__add_size(sizeof(ipcref_buf), align - 1, &total) ||
      !ipcref__add_size(total, size, &total) || total > (size_t)PTRDIFF_MAX)
    return IPCREF_ERANGE;
  raw = (unsigned char *)a->alloc(a->user, total);
  if (!raw) return IPCREF_ENOMEM;
  b = (ipcref_buf *)(void *)raw;
  addr = (size_t)(uintptr_t)(raw + sizeof(ipcref_buf));
  addr = (addr + align - 1) & ~(align - 1);
  b->strong = 1;
  b->weak = 1;
  b->flags = 0;
  b->data = raw + (addr - (size_t)(uintptr_t)raw);
  b->size = size;
  b->align = align;
  b->release = NULL;
  b->release_user = NULL;
  b->allocator = *a;
  b->alloc_size = total;
  b->device.type = IPCREF_DEVICE_CPU;
  b->device.id = 0;
  *out = b;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_buf_new(size_t size, ipcref_buf **out) {
  return ipcref__buf_alloc(NULL, size, 64, out, __func__);
}

IPCREF_API ipcref_result ipcref_buf_new_aligned(size_t size, size_t align,
                                                ipcref_buf **out) {
  return ipcref__buf_alloc(NULL, size, align, out, __func__);
}

IPCREF_API ipcref_result ipcref_buf_new_in(const ipcref_allocator *allocator,
                                           size_t size, size_t align,
                                           ipcref_buf **out) {
  return ipcref__buf_alloc(allocator, size, align, out, __func__);
}

/* ipcref_buf_wrap, for public function `fn`. */
IPCREF__PRIVATE ipcref_result ipcref__buf_wrap(void *data, size_t size,
                                               void (*release)(void *, void *),
                                               void *user, ipcref_buf **out,
                                               const char *fn) {
  ipcref_buf *b;
  ipcref_result r;
  if (!out) return ipcref__invalid(fn, "out is NULL");
  if (!data && size != 0)
    return ipcref__invalid(fn, "data is NULL with a non-zero size");
  if (size > (size_t)PTRDIFF_MAX) return IPCREF_ERANGE;
  /* data + size must not wrap: views compute addresses up to it. */
  if ((uintptr_t)data > UINTPTR_MAX - size) return IPCREF_ERANGE;
  r = ipcref__buf_alloc(NULL, 0, 1, &b, fn);
  if (r != IPCREF_OK) return r;
  b->data = data;
  b->size = size;
  b->align = 1;
  b->release = release;
  b->release_user = user;
  *out = b;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_buf_wrap(void *data, size_t size,
                                         void (*release)(void *user,
                                                         void *data),
                                         void *user, ipcref_buf **out) {
  return ipcref__buf_wrap(data, size, release, user, out, __func__);
}

IPCREF_API ipcref_result ipcref_buf_wrap_device(
    void *data, size_t size, ipcref_device device,
    void (*release)(void *user, void *data), void *user, ipcref_buf **out) {
  ipcref_result r;
  if (device.type < 1)
    return ipcref__invalid(__func__, "device.type is below 1");
  if (device.id < 0) return ipcref__invalid(__func__, "device.id is negative");
  r = ipcref__buf_wrap(data, size, release, user, out, __func__);
  if (r == IPCREF_OK) (*out)->device = device;
  return r;
}

/* Makes `b`, a header its caller keeps (a context's), a buffer over
 * `data` as ipcref_buf_wrap_device would, returned through `a` (which
 * owns the header) when its last reference goes. */
IPCREF__PRIVATE void ipcref__buf_adopt(ipcref_buf *b, void *data, size_t size,
                                       ipcref_device device,
                                       void (*release)(void *, void *),
                                       void *user, const ipcref_allocator *a) {
  b->strong = 1;
  b->weak = 1;
  b->flags = 0;
  b->data = data;
  b->size = size;
  b->align = 1;
  b->release = release;
  b->release_user = user;
  b->allocator = *a;
  b->alloc_size = sizeof *b;
  b->device = device;
}

IPCREF_API ipcref_device ipcref_buf_device(const ipcref_buf *b) {
  ipcref_device cpu;
  cpu.type = IPCREF_DEVICE_CPU;
  cpu.id = 0;
  return b ? b->device : cpu;
}

/* 1 when the host can read and write the buffer's memory. */
IPCREF__PRIVATE int ipcref__buf_on_host(const ipcref_buf *b) {
  return b->device.type == IPCREF_DEVICE_CPU;
}

IPCREF_API ipcref_buf *ipcref_buf_retain(ipcref_buf *b) {
  int32_t old;
  if (!b) return NULL;
  /* Relaxed is enough: the caller's own reference keeps the buffer alive,
   * and handing the new reference to another thread synchronizes by
   * itself (Arc, Boost). The check after the add catches overflow and a
   * retain on a dead buffer; both pin the count instead of wrapping. */
  old = __atomic_fetch_add(&b->strong, 1, __ATOMIC_RELAXED);
  if (IPCREF__UNLIKELY(old <= 0 || old == INT32_MAX))
    ipcref__saturate(
        &b->strong, old,
        "ipcref_buf_retain: retain on a released or saturated buffer");
  return b;
}

IPCREF__PRIVATE void ipcref__weak_drop(ipcref_buf *b) {
  int32_t old = __atomic_fetch_sub(&b->weak, 1, __ATOMIC_RELEASE);
  if (IPCREF__LIKELY(old != 1)) {
    if (IPCREF__UNLIKELY(old <= 0))
      ipcref__saturate(&b->weak, old,
                       "ipcref_weak_release: weak reference released twice");
    return;
  }
  IPCREF__ACQUIRE_FENCE(&b->weak);
#ifdef IPCREF_CHECKED
  /* The header stays readable (strong and weak at 0: dead), inline data
   * poisoned, until it leaves the quarantine. Not a caller's allocator's
   * memory: its `user` need only outlive the buffer. */
  if (b->allocator.free == ipcref__default_free) {
    ipcref__bury(b, b->alloc_size, sizeof *b, b->allocator.free,
                 b->allocator.user);
    return;
  }
#endif
  b->allocator.free(b->allocator.user, b, b->alloc_size);
}

IPCREF__PRIVATE IPCREF__NOINLINE void ipcref__buf_drop_slow(ipcref_buf *b) {
  if (b->release) b->release(b->release_user, b->data);
  /* The implicit weak reference the strong ones shared goes last. */
  ipcref__weak_drop(b);
}

/* The rare ends of a release, kept out of line so that the fast path is
 * one atomic and one compare, small enough for compilers to inline. */
IPCREF__PRIVATE IPCREF__NOINLINE void ipcref__buf_release_slow(ipcref_buf *b,
                                                               int32_t old) {
  if (old <= 0) {
    ipcref__saturate(&b->strong, old,
                     "ipcref_buf_release: the buffer was already released");
    return;
  }
  /* old == 1: the last reference. Acquire pairs with every other thread's
   * release decrement, so all their uses happen before the free. */
  IPCREF__ACQUIRE_FENCE(&b->strong);
  ipcref__buf_drop_slow(b);
}

IPCREF_API void ipcref_buf_release(ipcref_buf *b) {
  int32_t old;
  if (!b) return;
  /* Release ordering: every use of the data by this thread happens before
   * the decrement. */
  old = __atomic_fetch_sub(&b->strong, 1, __ATOMIC_RELEASE);
  if (IPCREF__LIKELY(old > 1)) return;
  ipcref__buf_release_slow(b, old);
}

IPCREF_API void *ipcref_buf_data(const ipcref_buf *b) {
  IPCREF__BUF_CHECK(b, NULL);
  return b ? b->data : NULL;
}

IPCREF_API size_t ipcref_buf_size(const ipcref_buf *b) {
  IPCREF__BUF_CHECK(b, 0);
  return b ? b->size : 0;
}

IPCREF_API size_t ipcref_buf_strong_count(const ipcref_buf *b) {
  int32_t n;
  if (!b) return 0;
  n = __atomic_load_n(&b->strong, __ATOMIC_RELAXED);
  return n < 0 ? SIZE_MAX : (size_t)n;
}

IPCREF_API size_t ipcref_buf_weak_count(const ipcref_buf *b) {
  int32_t w, s;
  if (!b) return 0;
  w = __atomic_load_n(&b->weak, __ATOMIC_RELAXED);
  s = __atomic_load_n(&b->strong, __ATOMIC_RELAXED);
  if (w == IPCREF__WEAK_LOCKED) return 0; /* locked only when it was 1 */
  if (w < 0) return SIZE_MAX;
  /* While strong references exist they share one weak reference. */
  return (size_t)w - (s != 0 && w > 0 ? 1u : 0u);
}

IPCREF_API int ipcref_buf_is_unique(ipcref_buf *b) {
  int unique;
  int32_t one = 1;
  if (!b) return 0;
  /* Lock the weak count at 1 (no weak references) so that no upgrade can
   * race with the look at the strong count; acquire pairs with the release
   * in weak_release so that a weak holder's last use came before. */
  if (!__atomic_compare_exchange_n(&b->weak, &one, IPCREF__WEAK_LOCKED, 0,
                                   __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
    return 0;
  unique = __atomic_load_n(&b->strong, __ATOMIC_ACQUIRE) == 1;
  __atomic_store_n(&b->weak, 1, __ATOMIC_RELEASE);
  return unique;
}

/* Marks memory that must never be written (a read-only mapping). */
IPCREF__PRIVATE void ipcref__buf_set_read_only(ipcref_buf *b) {
  __atomic_fetch_or(&b->flags, IPCREF__BUF_READ_ONLY, __ATOMIC_RELEASE);
}

/* As ipcref__buf_set_read_only, for a buffer just made, which no other
 * thread can see yet: no read-modify-write. */
IPCREF__PRIVATE void ipcref__buf_new_read_only(ipcref_buf *b) {
  __atomic_store_n(&b->flags,
                   __atomic_load_n(&b->flags, __ATOMIC_RELAXED) |
                       IPCREF__BUF_READ_ONLY,
                   __ATOMIC_RELAXED);
}

IPCREF__PRIVATE int ipcref__buf_read_only(const ipcref_buf *b) {
  return (__atomic_load_n(&b->flags, __ATOMIC_ACQUIRE) &
          IPCREF__BUF_READ_ONLY) != 0;
}

#ifndef IPCREF_NO_SHARING
/* share_buf's: the leases out on the block of b, a shared buffer made here
 * (0 for any other), after the returns are swept when some are out. */
IPCREF__PRIVATE uint32_t ipcref__buf_leases(const ipcref_buf *b);
#else
#define ipcref__buf_leases(b) 0u
#endif

/* 1 when this process may write b's memory in place, as the one user of
 * it: the memory is writable here, the caller's reference is the only one,
 * and no consumer holds a lease on it. Only a shared buffer made here has
 * leases, and looking at them takes its context's lock only while some
 * are out. The leases are looked at after the references: a lease is
 * taken only by a send of a reference to b (or of an alias, which holds
 * one), so once the caller's is the only one (is_unique's acquire) every
 * lease ever taken came before and none can come, and a count of 0 is
 * final. When others hold b, the returns are swept first: an alias that
 * holds b (an object table's pull, sent on) lets go of it with its last
 * lease. */
IPCREF__PRIVATE int ipcref__buf_sole(ipcref_buf *b) {
  if (!b || ipcref__buf_read_only(b)) return 0;
  if (!ipcref_buf_is_unique(b) &&
      (ipcref__buf_leases(b) != 0 || !ipcref_buf_is_unique(b)))
    return 0;
  return ipcref__buf_leases(b) == 0;
}

IPCREF_API void *ipcref_buf_get_mut(ipcref_buf *b) {
  IPCREF__BUF_CHECK(b, NULL);
  return ipcref__buf_sole(b) ? b->data : NULL;
}

IPCREF_API ipcref_result ipcref_buf_make_mut(ipcref_buf **pb) {
  ipcref_buf *old, *copy;
  ipcref_result r;
  if (!pb) return ipcref__invalid(__func__, "b is NULL");
  if (!*pb) return ipcref__invalid(__func__, "*b is NULL");
  IPCREF__BUF_CHECK(*pb, IPCREF_EDEAD);
  old = *pb;
  /* Unique is not enough: memory this process may not write (a read-only
   * mapping of another process's block), or that a consumer still reads,
   * is copied too. */
  if (ipcref__buf_sole(old)) return IPCREF_OK;
  if (!ipcref__buf_on_host(old)) return IPCREF_EDEVICE;
  /* Inline buffers copy into their own allocator; adopted memory (whose
   * owner we do not know) into the default one. */
  r = ipcref__buf_alloc(old->release ? NULL : &old->allocator, old->size,
                        old->align, &copy, __func__);
  if (r != IPCREF_OK) return r;
  if (old->size) memcpy(copy->data, old->data, old->size);
  *pb = copy;
  ipcref_buf_release(old);
  return IPCREF_OK;
}

IPCREF_API ipcref_weak *ipcref_buf_downgrade(ipcref_buf *b) {
  int32_t cur;
  if (!b) return NULL;
  IPCREF__BUF_CHECK(b, NULL);
  cur = __atomic_load_n(&b->weak, __ATOMIC_RELAXED);
  for (;;) {
    if (cur == IPCREF__WEAK_LOCKED) { /* is_unique is looking: brief */
      cur = __atomic_load_n(&b->weak, __ATOMIC_RELAXED);
      continue;
    }
    if (cur < 0) break; /* saturated: stays pinned */
    if (cur == INT32_MAX) {
      ipcref__saturate(&b->weak, cur,
                       "ipcref_buf_downgrade: weak count saturated");
      break;
    }
    /* Acquire pairs with the release store that unlocks is_unique. */
    if (__atomic_compare_exchange_n(&b->weak, &cur, cur + 1, 1,
                                    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
      break;
  }
  return (ipcref_weak *)(void *)b;
}

IPCREF_API ipcref_buf *ipcref_weak_upgrade(ipcref_weak *w) {
  ipcref_buf *b = (ipcref_buf *)(void *)w;
  int32_t cur;
  if (!b) return NULL;
  cur = __atomic_load_n(&b->strong, __ATOMIC_RELAXED);
  for (;;) {
    /* Never from zero: a buffer whose last strong reference went (or is
     * going on another thread) stays dead. */
    if (cur == 0) return NULL;
    if (cur < 0) return b; /* saturated: the data never dies */
    if (cur == INT32_MAX) {
      ipcref__saturate(&b->strong, cur,
                       "ipcref_weak_upgrade: strong count saturated");
      return b;
    }
    if (__atomic_compare_exchange_n(&b->strong, &cur, cur + 1, 1,
                                    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
      return b;
  }
}

IPCREF_API void ipcref_weak_release(ipcref_weak *w) {
  if (w) ipcref__weak_drop((ipcref_buf *)(void *)w);
}

IPCREF_API void ipcref_buf_set_shared_mut(ipcref_buf *b, int on) {
  if (!b) return;
  IPCREF__BUF_CHECK(b, );
  if (on)
    __atomic_fetch_or(&b->flags, IPCREF__BUF_SHARED_MUT, __ATOMIC_RELEASE);
  else
    __atomic_fetch_and(&b->flags, ~IPCREF__BUF_SHARED_MUT, __ATOMIC_RELEASE);
}

IPCREF_API int ipcref_buf_is_shared_mut(const ipcref_buf *b) {
  return b && (__atomic_load_n(&b->flags, __ATOMIC_ACQUIRE) &
               IPCREF__BUF_SHARED_MUT) != 0;
}

#ifdef IPCREF_TEST_HOOKS
IPCREF_API void ipcref_test_set_counts(ipcref_buf *b, int32_t strong,
                                       int32_t weak) {
  __atomic_store_n(&b->strong, strong, __ATOMIC_SEQ_CST);
  __atomic_store_n(&b->weak, weak, __ATOMIC_SEQ_CST);
}
#endif
