/* checked: the quarantine, where freed objects wait, marked dead, before
 * their memory goes back; and what IPCREF_CHECKED adds.
 *
 * A call on an object that was already freed reads freed memory: at best a
 * crash far from the mistake, at worst a quiet use of somebody else's
 * object. A mark written into freed memory cannot help (reading it would
 * itself be a use after free, and AddressSanitizer would stop before any
 * hook ran), so the library does not free at once: freed objects are kept
 * a while, marked dead, and a call that finds the mark is refused and
 * reported to the error hook with the function's name (IPCREF_EDEAD).
 *
 *   every build       a shared buffer made here keeps its header in its
 *                     context's memory, and a freed peer stays with its
 *                     context (the last 8), both until the context goes
 *                     (see share): a send or a release of a buffer already
 *                     released, a second ipcref_peer_free, a call on a
 *                     freed peer or on a context after ipcref_ctx_free are
 *                     refused while the context lives.
 *   IPCREF_CHECKED    freed peers and contexts, and every buffer header
 *                     (but those of a caller's ipcref_allocator), wait in
 *                     this process-wide quarantine instead
 *                     (IPCREF_QUARANTINE_OBJECTS: 1024, and
 *                     IPCREF_QUARANTINE_BYTES: 64 MiB, by default), and
 *                     every call that takes a buffer or a view checks it.
 *                     Off by default: it costs a compare per call and keeps
 *                     freed memory a while. For debug and test builds;
 *                     define it alike in every translation unit.
 *   AddressSanitizer  what waits here is poisoned but for its mark, and so
 *                     is the memory of a shared block released here, until
 *                     it is handed out again: a late read is caught at the
 *                     read itself.
 *
 * Detection is bounded: an object that left the quarantine is freed
 * memory again. What the quarantine holds goes back at exit (a
 * destructor) and in a forked child (the sharing layer's fork handler), so
 * leak checkers see nothing. It has a spinlock of its own (portable C: the
 * sharing layer may be absent); free callbacks run outside it. */

#ifdef __cplusplus
extern "C" {
#endif

/* Hands back everything the quarantine holds now (each object through the
 * allocator it came from): for a leak check, or a test that counts
 * allocations. Objects freed after it wait as before. Cannot fail. */
IPCREF_API void ipcref_quarantine_flush(void);

#ifdef __cplusplus
}
#endif

/* @implementation */

#ifndef IPCREF_QUARANTINE_OBJECTS
#ifdef IPCREF_CHECKED
#define IPCREF_QUARANTINE_OBJECTS 1024
#else
#define IPCREF_QUARANTINE_OBJECTS 1 /* unused: nothing is buried */
#endif
#endif
#ifndef IPCREF_QUARANTINE_BYTES
#define IPCREF_QUARANTINE_BYTES ((size_t)64 << 20)
#endif

/* AddressSanitizer's manual poisoning, or nothing. */
#if defined(__SANITIZE_ADDRESS__)
#define IPCREF__ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IPCREF__ASAN 1
#endif
#endif
#ifdef IPCREF__ASAN
#ifdef __cplusplus
extern "C" {
#endif
void __asan_poison_memory_region(void const volatile *addr, size_t size);
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#ifdef __cplusplus
}
#endif
#define IPCREF__POISON(p, n)   __asan_poison_memory_region((p), (n))
#define IPCREF__UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define IPCREF__POISON(p, n)   ((void)(p), (void)(n))
#define IPCREF__UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* The mark at the start of a peer or a context. */
#define IPCREF__ALIVE 0x4556494cu /* "LIVE" */
#define IPCREF__DEAD  0x44414544u /* "DEAD" */

typedef struct ipcref__grave {
  void *ptr;
  size_t size; /* bytes */
  size_t keep; /* the first `keep` bytes (the mark) stay readable */
  void (*free_fn)(void *user, void *ptr, size_t size);
  void *user;
} ipcref__grave;

static struct {
  int lock;
  uint32_t first, count;
  size_t bytes;
  ipcref__grave g[IPCREF_QUARANTINE_OBJECTS];
} ipcref__quarantine;

IPCREF__PRIVATE void ipcref__quarantine_lock(void) {
  while (__atomic_exchange_n(&ipcref__quarantine.lock, 1, __ATOMIC_ACQUIRE))
    while (__atomic_load_n(&ipcref__quarantine.lock, __ATOMIC_RELAXED)) {
    }
}

IPCREF__PRIVATE void ipcref__quarantine_unlock(void) {
  __atomic_store_n(&ipcref__quarantine.lock, 0, __ATOMIC_RELEASE);
}

/* Takes the oldest grave out (under the lock) into *out: 1 if there was
 * one. */
IPCREF__PRIVATE int ipcref__grave_pop(ipcref__grave *out) {
  if (ipcref__quarantine.count == 0) return 0;
  *out = ipcref__quarantine.g[ipcref__quarantine.first];
  ipcref__quarantine.first =
      (ipcref__quarantine.first + 1) % IPCREF_QUARANTINE_OBJECTS;
  ipcref__quarantine.count--;
  ipcref__quarantine.bytes -= out->size;
  return 1;
}

/* As ipcref__grave_pop, when `size` more bytes, or one more object, would
 * not fit. */
IPCREF__PRIVATE int ipcref__grave_evict(size_t size, ipcref__grave *out) {
  if (ipcref__quarantine.count < IPCREF_QUARANTINE_OBJECTS &&
      ipcref__quarantine.bytes + size <= IPCREF_QUARANTINE_BYTES)
    return 0;
  return ipcref__grave_pop(out);
}

IPCREF__PRIVATE void ipcref__grave_free(const ipcref__grave *g) {
  IPCREF__UNPOISON(g->ptr, g->size);
  g->free_fn(g->user, g->ptr, g->size);
}

/* Keeps the freed object `ptr` (`size` bytes, whose first `keep` hold its
 * dead mark) in the quarantine; the oldest ones leave it through their
 * free_fn. An object larger than the whole quarantine goes back at once. */
IPCREF__PRIVATE void ipcref__bury(void *ptr, size_t size, size_t keep,
                                  void (*free_fn)(void *, void *, size_t),
                                  void *user) {
  ipcref__grave g, old;
  if (size > IPCREF_QUARANTINE_BYTES) {
    free_fn(user, ptr, size);
    return;
  }
  g.ptr = ptr;
  g.size = size;
  g.keep = keep;
  g.free_fn = free_fn;
  g.user = user;
  IPCREF__POISON((unsigned char *)ptr + keep, size - keep);
  for (;;) {
    int full;
    ipcref__quarantine_lock();
    full = ipcref__grave_evict(size, &old);
    if (!full) {
      uint32_t at = (ipcref__quarantine.first + ipcref__quarantine.count) %
                    IPCREF_QUARANTINE_OBJECTS;
      ipcref__quarantine.g[at] = g;
      ipcref__quarantine.count++;
      ipcref__quarantine.bytes += size;
      ipcref__quarantine_unlock();
      return;
    }
    ipcref__quarantine_unlock();
    ipcref__grave_free(&old);
  }
}

/* A library's free for objects taken with IPCREF_MALLOC. */
IPCREF__PRIVATE void ipcref__free_plain(void *user, void *ptr, size_t size) {
  (void)user;
  (void)size;
  IPCREF_FREE(ptr);
}

IPCREF_API void ipcref_quarantine_flush(void) {
  ipcref__grave old;
  for (;;) {
    int got;
    ipcref__quarantine_lock();
    got = ipcref__grave_pop(&old);
    ipcref__quarantine_unlock();
    if (!got) return;
    ipcref__grave_free(&old);
  }
}

/* At exit everything goes back, so that leak checkers see nothing. */
__attribute__((destructor)) static void ipcref__quarantine_empty(void) {
  ipcref_quarantine_flush();
}
