/* share: buffers that cross processes without copies (POSIX/Linux; absent
 * under IPCREF_NO_SHARING).
 *
 * A producer's shared buffers live in sealed memfd segments. Handing a view
 * to a peer (another process, over a connected AF_UNIX socket) takes a
 * lease: a slot in a counter file ("ledger") that the producer gives to
 * that peer. The consumer maps the segment (read-only unless shared
 * writable) and the ledger once; when its last reference to the imported
 * buffer dies it returns the lease without a system call. The producer
 * never waits: when its own last reference dies while leases are live, the
 * block goes to the limbo, and a sweep frees it once every lease is back.
 * The sweep runs on each release of a shared block, when an allocation
 * fails (then the allocation is retried once), and on ipcref_collect; its
 * cost follows the number of leases returned since the last sweep, not the
 * size of the limbo.
 *
 * A consumer may export what it imported to a third process (forwarding):
 * the new lease is taken in the original producer's ledger, so the
 * producer sees every holder on its own.
 *
 * Everything hangs off an ipcref_ctx; it is thread-safe (one mutex, never
 * held across a system call that can block on a peer). A peer is used by
 * one thread at a time (give each thread its own peer, or lock); buffers
 * and views from any peer may be released on any thread.
 *
 * What crosses the socket is a small versioned record in little endian plus
 * the fds the other side does not have yet; everything received is checked
 * against the real fds before it is mapped (see ipcref_import). Caches key
 * on (exporter, id), never on handle bytes. */

#if !defined(IPCREF_NO_SHARING)
#define IPCREF_HAVE_SHARING 1

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ipcref_ctx ipcref_ctx;
typedef struct ipcref_peer ipcref_peer;

/* A device backend: what the sharing layer needs from a GPU driver to
 * keep blocks in device memory and hand them to other processes. The
 * backend headers (ipcref_cuda.h, ipcref_hip.h) fill one in; the host path
 * is the built-in case of the same steps (a segment is a memfd, its export
 * the fd itself, its import an mmap). Device addresses are uint64_t; an
 * IPC handle is 64 opaque bytes. Every function returns IPCREF_OK or an
 * error code, and may be called from any thread. */
#define IPCREF_HANDLE_BYTES 64
typedef struct ipcref_backend ipcref_backend;
struct ipcref_backend {
  int32_t device_type; /* IPCREF_DEVICE_CUDA, IPCREF_DEVICE_ROCM */
  const char *name;
  void *user;
  /* A device allocation of `size` bytes (a segment) and its free. */
  ipcref_result (*seg_alloc)(ipcref_backend *be, int32_t dev, size_t size,
                             uint64_t *addr);
  void (*seg_free)(ipcref_backend *be, int32_t dev, uint64_t addr);
  /* The allocation that contains `addr`: its base and size. */
  ipcref_result (*seg_range)(ipcref_backend *be, int32_t dev, uint64_t addr,
                             uint64_t *base, size_t *size);
  /* The IPC handle of the allocation at `base` (called once per segment).
   * Memory the driver cannot export this way is refused (EINVAL). */
  ipcref_result (*seg_export)(ipcref_backend *be, int32_t dev, uint64_t base,
                              unsigned char *handle);
  /* Opens a segment another process exported (once per segment and
   * process: the caller caches it); a handle this process exported gives
   * back its own address. seg_close undoes it. */
  ipcref_result (*seg_import)(ipcref_backend *be, int32_t dev,
                              const unsigned char *handle, uint64_t *addr);
  void (*seg_close)(ipcref_backend *be, int32_t dev, uint64_t addr);
  /* Ordering. event_record: an event after the work queued on `stream`
   * so far, that another process can wait on; its handle goes with the
   * message, and *event is kept until the lease ends (event_free). A
   * backend without interprocess events synchronizes the stream instead
   * and gives an all-zero handle. event_wait: `stream` waits for the event
   * of `handle` (all zero: nothing to wait for). */
  ipcref_result (*event_record)(ipcref_backend *be, int32_t dev, void *stream,
                                unsigned char *handle, void **event);
  void (*event_free)(ipcref_backend *be, void *event);
  ipcref_result (*event_wait)(ipcref_backend *be, int32_t dev, void *stream,
                              const unsigned char *handle);
  /* Deferred release: *fence marks the work queued on `stream` so far
   * (NULL: nothing pending); fence_done is 1 once it completed, and frees
   * the fence then. */
  ipcref_result (*fence)(ipcref_backend *be, int32_t dev, void *stream,
                         void **fence);
  int (*fence_done)(ipcref_backend *be, void *fence);
};

/* Options for ipcref_ctx_new; zero fields take the defaults. */
typedef struct ipcref_ctx_options {
  size_t segment_size;   /* bytes per shared segment (default 16 MiB);
                            larger blocks get a segment of their own */
  size_t segment_cache;  /* bytes of empty segments kept for reuse
                            (default one segment) */
  size_t max_bytes;      /* cap on all segment bytes (default: none) */
  uint32_t ledger_slots; /* slots per counter file (default 4096) */
  int writable_shares;   /* nonzero: consumers map segments writable */
  int isolate;           /* nonzero: every block in a segment of its own (see
                            ipcref_shared_new_isolated) */
  const uint32_t *allow_uids; /* uids besides our own whose peers are
                                 accepted (copied); others get EPEER */
  size_t allow_uids_count;
  ipcref_error_hook error_hook; /* hears what peers did wrong (a forged,
                                   replayed or double return, a refused
                                   peer); fn NULL: the process-wide hook.
                                   Runs with the context locked: it must
                                   not call into this context. */
} ipcref_ctx_options;

/* Exact counts at the moment of the call. */
typedef struct ipcref_stats {
  size_t live_bufs;       /* shared buffers this process holds */
  size_t live_bytes;      /* their block bytes */
  size_t limbo_blocks;    /* blocks dropped here, still leased out */
  size_t limbo_bytes;     /* their bytes */
  size_t counter_files;   /* ledgers this ctx created or mapped */
  size_t live_slots;      /* leases given out and not yet returned */
  size_t peers;           /* live ipcref_peer objects */
  size_t mapped_segments; /* segments mapped (own and imported) */
  size_t segment_bytes;   /* bytes of own segments */
  size_t imported_bufs;   /* imported buffers alive in this process */
  uint64_t fds_sent;      /* file descriptors sent, ever */
  uint64_t fds_received;  /* file descriptors received, ever */
  uint64_t sweeps;        /* sweeps run, ever */
  uint64_t peer_deaths;   /* watched processes seen to die, ever */
  uint64_t reclaimed;     /* leases ended because their holder died, ever */
  uint64_t bad_returns;   /* ledger entries refused (forged, replayed, a
                             second return of one lease), ever: a
                             dishonest or corrupt peer */
  uint64_t late_returns;  /* honest returns of leases already reclaimed
                             because their holder died (a forwarder
                             cancelling a send to a process that died),
                             ever; ignored, not refused */
  uint64_t refused;       /* imports refused (EPROTO) and peers refused
                             (EPEER), ever */
  size_t device_bytes;    /* bytes of own device segments (in
                             segment_bytes too) */
  size_t deferred;        /* device releases waiting for their stream */
} ipcref_stats;

/* A message: a small byte record plus the fds the peer does not have yet.
 * Produced by ipcref_export, consumed by ipcref_import (which takes the
 * fds); ipcref_msg_free releases what an unused message holds (a message
 * that is never imported keeps its lease until it is freed). */
#define IPCREF_MSG_MAX_VIEWS 16 /* views in one message (a batch) */
#define IPCREF_MSG_MAX_FDS   (2 * IPCREF_MSG_MAX_VIEWS)
#define IPCREF_MSG_MAX_BYTES                                                   \
  (1024 + IPCREF_MSG_MAX_FDS * (40 + IPCREF_HANDLE_BYTES) +                    \
   IPCREF_MSG_MAX_VIEWS * (80 + IPCREF_HANDLE_BYTES + 16 * IPCREF_MAX_DIMS))
typedef struct ipcref_msg {
  size_t len;
  unsigned char bytes[IPCREF_MSG_MAX_BYTES];
  int nfds;
  int fds[IPCREF_MSG_MAX_FDS];
  ipcref_peer *origin; /* exporting peer; cancels the lease on free */
} ipcref_msg;

/* A new context. NULL options mean the defaults. Errors: EINVAL (out
 * NULL, a nonsensical option), ENOMEM. */
IPCREF_API ipcref_result ipcref_ctx_new(const ipcref_ctx_options *opt,
                                        ipcref_ctx **out);

/* Frees the context: its peers now (what they hold from us stays leased
 * until it comes back or the ledger goes), the rest once the last shared
 * or imported buffer of this context is released: until then those
 * buffers stay valid. Buffers alive in other processes keep their memory
 * whatever happens here (memfd mappings outlive the producer). NULL is a
 * no-op. */
IPCREF_API void ipcref_ctx_free(ipcref_ctx *ctx);

/* A buffer of `size` bytes in shared memory (64-byte aligned), exportable
 * to peers. Errors: EINVAL, ERANGE, ENOMEM (after a sweep and a retry),
 * ESYS. */
IPCREF_API ipcref_result ipcref_shared_new(ipcref_ctx *ctx, size_t size,
                                           ipcref_buf **out);

/* As ipcref_shared_new, but the block gets a memfd segment of its own
 * (its size rounded up to whole pages), so a consumer that maps it can
 * reach nothing else. A consumer of a pooled block maps the whole 16 MiB
 * segment and can read the other blocks in it (never write them, unless
 * writable_shares). The price of isolation: one memfd, one mmap on each
 * side and one fd hand-off per block, and at least a page per block. */
IPCREF_API ipcref_result ipcref_shared_new_isolated(ipcref_ctx *ctx,
                                                    size_t size,
                                                    ipcref_buf **out);

/* A C-contiguous view over a new shared buffer. */
IPCREF_API ipcref_result ipcref_view_new_shared(ipcref_ctx *ctx,
                                                ipcref_dtype dt, int ndim,
                                                const int64_t *shape,
                                                ipcref_view *out);

/* Adds a device backend to the context (at most one per device type; it
 * must outlive the context). Device blocks can then be made, exported and
 * imported like host ones. Errors: EINVAL (NULL, a missing function, a
 * device type already served, or IPCREF_DEVICE_CPU). */
IPCREF_API ipcref_result ipcref_ctx_add_backend(ipcref_ctx *ctx,
                                                ipcref_backend *be);

/* A shared buffer of `size` bytes in the memory of device `dev` (a
 * backend for dev.type must be added), sub-allocated from device segments
 * like host blocks: an allocation the device cannot satisfy sweeps the
 * limbo and retries before it fails. Its data pointer is a device address.
 * Errors: EINVAL, ENODEV (no backend for that device), ERANGE, ENOMEM, or
 * the backend's own. */
IPCREF_API ipcref_result ipcref_device_new(ipcref_ctx *ctx, ipcref_device dev,
                                           size_t size, ipcref_buf **out);

/* Adopts device memory from any other allocator (a framework's caching
 * allocator) for sharing: `ptr` and `size` lie inside one allocation,
 * whose base the backend finds (seg_range) and exports once, cached; the
 * offset travels beside the handle. `release(user, ptr)` runs exactly
 * once, when this buffer and every lease on it are gone (the limbo holds
 * it while consumers do). Errors: EINVAL (NULL, not inside one
 * allocation), ENODEV, ENOMEM, or the backend's own. On error nothing is
 * adopted. */
IPCREF_API ipcref_result ipcref_device_wrap(
    ipcref_ctx *ctx, ipcref_device dev, void *ptr, size_t size,
    void (*release)(void *user, void *ptr), void *user, ipcref_buf **out);

/* 1 when `b` is a shared buffer (made here or imported), else 0. */
IPCREF_API int ipcref_buf_is_shared(const ipcref_buf *b);

/* Adopts `sockfd`, a connected AF_UNIX socket (SOCK_STREAM or
 * SOCK_SEQPACKET; the peer is closed with it), and sends the other side a
 * hello carrying this process's credentials, checked by the kernel
 * (SCM_CREDENTIALS). The other side's pid and uid come from its hello
 * (SO_PEERCRED alone names whoever created a socketpair, not who holds the
 * other end). Does not wait for the other side; the first export, receive
 * or import on the peer reads its hello (waiting up to 5 s for it), and a
 * peer whose uid is neither ours nor in the allow_uids option is refused
 * then: those calls return EPEER. Errors: EINVAL (not a connected AF_UNIX
 * stream/seqpacket socket), EPEER (the other end is closed, or whoever
 * connected is of a uid not allowed), ESYS, ENOMEM; on error the socket is
 * not closed. */
IPCREF_API ipcref_result ipcref_peer_new(ipcref_ctx *ctx, int sockfd,
                                         ipcref_peer **out);

/* Closes the socket and frees the peer. Leases it holds from us stay until
 * they are returned or that process dies; buffers imported through it stay
 * valid. NULL is a no-op. */
IPCREF_API void ipcref_peer_free(ipcref_peer *p);

/* The pid of the process on the other side, from its hello: waits for it
 * up to 5 s if it has not arrived (then the SO_PEERCRED pid is returned);
 * 0 for NULL. */
IPCREF_API int ipcref_peer_pid(ipcref_peer *p);

/* Exports `v` to peer `p` as a message (for users with their own
 * transport): takes a lease and adds the fds the peer lacks. The view's
 * buffer must be shared (ipcref_shared_new, or imported: forwarding).
 * Deliver the message, then call ipcref_msg_sent (or, if it never left,
 * ipcref_msg_free). Waits for the peer's hello first (see
 * ipcref_peer_new): nothing is leased to a process not identified.
 * Errors: EINVAL (not a shared buffer, bad view), EPEER (refused, or hung
 * up before its hello), ETIMEDOUT (no hello within 5 s), ENOMEM, ESYS,
 * EBUSY (a forwarded view: every forwarding slot of its ledger is in
 * use). */
IPCREF_API ipcref_result ipcref_export(ipcref_peer *p, const ipcref_view *v,
                                       ipcref_msg *msg);

/* Imports a message from peer `p`: validates every field against the real
 * fds, maps what is new (or finds it in the cache), and returns a view
 * whose buffer returns the lease when it dies. Takes the message's fds
 * (also on error: they are closed). Errors: EPROTO (malformed, replayed,
 * or not matching the fds), EINVAL, ENOMEM, ESYS, ENODEV (device memory,
 * and no backend for its device in this context). */
IPCREF_API ipcref_result ipcref_import(ipcref_peer *p, ipcref_msg *msg,
                                       ipcref_view *out);

/* Releases what an unused message holds: its fds, and its leases when it
 * was exported here (the receiver never got them). */
IPCREF_API void ipcref_msg_free(ipcref_msg *msg);

/* After a message exported here was delivered by the caller's own
 * transport: closes its fds (the transport gave the receiver its own) and
 * forgets it, leaving its leases to the receiver. */
IPCREF_API void ipcref_msg_sent(ipcref_msg *msg);

/* Exports `n` views and sends them in one message over the peer's socket.
 * Blocks only while the socket is full. Errors: as ipcref_export, EPEER
 * (the peer hung up). */
IPCREF_API ipcref_result ipcref_send_batch(ipcref_peer *p,
                                           const ipcref_view *views, int n);
IPCREF_API ipcref_result ipcref_send(ipcref_peer *p, const ipcref_view *v);

/* As ipcref_send, for a view of device memory written by work queued on
 * `stream` (a CUstream / hipStream_t; NULL: the default stream): an event
 * recorded after that work travels with the message, and the receiver's
 * stream waits on it before using the data. The producer never blocks
 * (with HIP 5, which has no interprocess events, the stream is
 * synchronized first). For host views the stream is ignored. */
IPCREF_API ipcref_result ipcref_send_on(ipcref_peer *p, const ipcref_view *v,
                                        void *stream);

/* Receives one message (one view) from the peer's socket and imports it.
 * timeout_ms: -1 waits, 0 polls. Errors: ETIMEDOUT, EPEER (hung up),
 * EPROTO, ENOMEM, ESYS. A batch is received one view per call. */
IPCREF_API ipcref_result ipcref_recv(ipcref_peer *p, ipcref_view *out,
                                     int timeout_ms);

/* As ipcref_recv, for device views used by work on `stream` (NULL: the
 * default stream): the stream waits on the producer's event before it
 * runs anything queued after this call, and when the view's last
 * reference goes its lease is returned only once the work queued on that
 * stream by then has completed (checked by later calls on the context; no
 * thread waits for it). A segment already mapped is waited on the same
 * way. Errors: as ipcref_recv, ENODEV (no backend here for its device). */
IPCREF_API ipcref_result ipcref_recv_on(ipcref_peer *p, ipcref_view *out,
                                        int timeout_ms, void *stream);

/* Sweeps the limbo: frees every block whose leases all came back; reclaims
 * the leases of processes that died holding them (checking every watched
 * process now; a forwarded hold stays while its own holder lives, whatever
 * became of the middleman); and (on a consumer) unmaps segments their
 * producer destroyed that nothing here uses any more; a receive does the
 * latter only past 1 GiB of them, since freeing the last mapping of a
 * segment takes time in proportion to its size. Returns the bytes freed. */
IPCREF_API size_t ipcref_collect(ipcref_ctx *ctx);

/* Fills *out. Errors: EINVAL. */
IPCREF_API ipcref_result ipcref_ctx_stats(ipcref_ctx *ctx, ipcref_stats *out);

/* An fd that becomes readable when a process this context watches dies (a
 * peer, a consumer holding leases, a holder of a forwarded lease): add it
 * to your own event loop (poll, epoll, select) and call ipcref_ctx_poll
 * when it is readable. There are no hidden threads: deaths are also
 * noticed by the calls on the context (at most once per clock tick) and by
 * ipcref_collect. -1 for NULL. The fd belongs to the context: do not
 * close it. Without pidfd_open (Linux < 5.3) it never becomes readable and
 * deaths are seen by ipcref_collect alone. */
IPCREF_API int ipcref_ctx_poll_fd(ipcref_ctx *ctx);

/* Waits up to timeout_ms (-1: forever, 0: not at all) for a watched
 * process to die, then reclaims what every dead one held: the leases of a
 * consumer, the forwarded holds whose holder is gone, and the blocks that
 * only they kept. *freed (may be NULL) gets the bytes freed. Errors:
 * EINVAL, ETIMEDOUT (no death was left to handle: none within the wait,
 * or another call handled it first), ESYS. */
IPCREF_API ipcref_result ipcref_ctx_poll(ipcref_ctx *ctx, int timeout_ms,
                                         size_t *freed);

/* 1 while the process on the other side of `p` lives (as far as can be
 * seen without waiting), 0 once it is gone or hung up without a hello, or
 * for NULL. A consumer whose producer died keeps its imported views: they
 * stay mapped and readable, and releasing them still succeeds. */
IPCREF_API int ipcref_peer_alive(ipcref_peer *p);

#ifdef IPCREF_TEST_HOOKS
/* Tests only: `fn` is called at each labelled step of the protocol:
 * "allocate", "export", "send", "receive", "map", "import", "forward",
 * "release", "sweep" (NULL: none). Crash tests stop a process there and
 * kill it. */
IPCREF_API void ipcref_test_set_step_hook(void (*fn)(const char *step));
#endif

#ifdef __cplusplus
}
#endif

#endif /* !IPCREF_NO_SHARING */

/* @implementation */

#if !defined(IPCREF_NO_SHARING)

/* The sharing layer uses Linux APIs that glibc declares only with
 * _GNU_SOURCE (memfd_create, F_ADD_SEALS, SO_PEERCRED, struct ucred).
 * ipcref.h defines it when it is the first include of the implementation
 * file; otherwise the file has to define it before its first include. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#if defined(__GLIBC__) && !defined(__USE_GNU)
#error                                                                         \
    "ipcref: sharing needs _GNU_SOURCE: include ipcref.h first in the file that defines IPCREF_IMPLEMENTATION, or #define _GNU_SOURCE before its first #include (or define IPCREF_NO_SHARING)"
#else

/* ---- test hooks ---------------------------------------------------------
 * IPCREF__STEP marks the labelled steps of the protocol; crash tests stop
 * a process at one and kill it there. Nothing at all without
 * IPCREF_TEST_HOOKS. */
#ifdef IPCREF_TEST_HOOKS
static void (*ipcref__step_hook)(const char *step);
IPCREF_API void ipcref_test_set_step_hook(void (*fn)(const char *step)) {
  __atomic_store_n(&ipcref__step_hook, fn, __ATOMIC_RELEASE);
}
#define IPCREF__STEP(label)                                                    \
  do {                                                                         \
    void (*step_fn_)(const char *) =                                           \
        __atomic_load_n(&ipcref__step_hook, __ATOMIC_ACQUIRE);                 \
    if (step_fn_) step_fn_(label);                                             \
  } while (0)
#else
#define IPCREF__STEP(label) ((void)0)
#endif

/* ---- layout of a ledger (counter file), shared with every process that
 * maps it. All fields little endian (the host's: peers share a machine).
 *
 *   header   64 bytes: magic, version, nslots, origin pid, origin nonce,
 *            ledger id, and `head`, the ring's write position
 *   slots    nslots x { u64 (generation << 2) | state, u64 holder: its pid,
 *            and for a forwarded lease the parent slot + 1 << 32 }
 *   ring     2 * nslots x u64: returned and linked leases, in order
 *
 * The producer allocates slots [0, nslots/2); forwarders claim slots in
 * [nslots/2, nslots) with a compare-and-swap. A consumer returns a lease
 * by taking a ring position (one fetch_add) and storing the entry there:
 * no system call, no lock. The producer reads the ring from its private
 * tail, so a sweep costs what was returned since the last one. */
#define IPCREF__LEDGER_MAGIC   0x4c465249u /* "IRFL" */
#define IPCREF__LEDGER_VERSION 1u
#define IPCREF__LEDGER_HDR     64u
#define IPCREF__SLOT_FREE      0u
#define IPCREF__SLOT_LIVE      1u
#define IPCREF__RING_RELEASE   0u /* entry: a lease came back */
#define IPCREF__RING_LINK      1u /* entry pair: a forwarded lease */
#define IPCREF__RING_PARENT    2u /* second half of a link */

typedef struct ipcref__ledger_hdr {
  uint32_t magic, version, nslots, origin_pid;
  uint64_t origin_nonce, ledger_id;
  uint64_t head; /* atomic: next ring position */
  uint64_t reserved[3];
} ipcref__ledger_hdr;

/* A ring entry: slot + 1 in bits 0..29 (0 marks "not written yet"), the
 * kind in bits 30..31, the generation in bits 32..63. */
IPCREF_PRIVATE uint64_t ipcref__ring_entry(uint32_t kind, uint32_t slot,
                                           uint32_t gen) {
  return ((uint64_t)gen << 32) | ((uint64_t)kind << 30) | (slot + 1u);
}

IPCREF_PRIVATE uint64_t *ipcref__ledger_slots(unsigned char *base) {
  return (uint64_t *)(void *)(base + IPCREF__LEDGER_HDR);
}
IPCREF_PRIVATE uint64_t *ipcref__ledger_ring(unsigned char *base, uint32_t n) {
  return (uint64_t *)(void *)(base + IPCREF__LEDGER_HDR + (size_t)n * 16);
}
IPCREF_PRIVATE size_t ipcref__ledger_bytes(uint32_t n) {
  return IPCREF__LEDGER_HDR + (size_t)n * 16 + (size_t)n * 16;
}

/* Pushes entries to a ledger's ring: what a consumer does to return a
 * lease (and a forwarder to link one). Lock-free, no system call. A
 * process that dies between taking its positions and writing them leaves
 * a hole, which the producer's sweep steps over once it is stale (see
 * ipcref__hole_stale). `step` labels the moment for the test hook. */
IPCREF_PRIVATE void ipcref__ring_push(unsigned char *base, uint32_t n,
                                      const uint64_t *e, int count,
                                      const char *step) {
  ipcref__ledger_hdr *h = (ipcref__ledger_hdr *)(void *)base;
  uint64_t *ring = ipcref__ledger_ring(base, n);
  /* Release: a forwarder's slot, written before, is seen by the producer
   * that reads this head (see ipcref__adopt_forwards). */
  uint64_t pos =
      __atomic_fetch_add(&h->head, (uint64_t)count, __ATOMIC_RELEASE);
  int i;
  (void)step;
  if (step) IPCREF__STEP(step);
  /* Release: everything this process did with the data happens before the
   * producer sees the entry and frees the block. */
  for (i = 0; i < count; i++)
    __atomic_store_n(&ring[(pos + (uint64_t)i) % (2u * (uint64_t)n)], e[i],
                     __ATOMIC_RELEASE);
}

/* ---- producer-side records (private memory) ---------------------------- */

typedef struct ipcref__segment ipcref__segment;
typedef struct ipcref__ledger ipcref__ledger;

/* A process this context watches for its death: a peer, a consumer that
 * holds leases, the holder of a forwarded lease. One per live pid, shared
 * by whatever needs it (counted); its pidfd sits in the context's epoll
 * set, so the poll fd wakes when it dies. A pidfd names the process, not
 * the number: a reused pid is a new watch. */
typedef struct ipcref__watch {
  int pid;
  int pidfd; /* -1: dead, or no pidfd_open here (then kill(pid, 0)) */
  int dead;
  int refs;
  struct ipcref__watch *next, *prev;
} ipcref__watch;

typedef struct ipcref__block {
  ipcref__segment *seg;
  size_t offset;   /* in the segment */
  size_t size;     /* bytes: the class's block size, or a wrap's own */
  uint32_t leases; /* live leases on it, in any ledger */
  int local;       /* a local buffer still holds it */
  int in_limbo;
  struct ipcref__block *limbo_prev, *limbo_next; /* also: to release */
  void (*release)(void *user, void *ptr);        /* a wrap's owner */
  void *user;
  void *ptr; /* a wrap's address */
} ipcref__block;

/* An alias of a shared buffer made here: a buffer of its own over the same
 * block, exportable like it, whose holds (its own buffer, and every lease
 * taken through it) are counted apart; when the last goes, `fn(user)`
 * runs and the source buffer is released, after the context's lock is let
 * go. The object table's pulled views are such aliases. */
typedef struct ipcref__alias {
  ipcref__block *block;
  ipcref_buf *src;
  uint32_t holds;
  void (*fn)(void *user);
  void *user;
  struct ipcref__alias *next; /* on ctx->unpinned */
} ipcref__alias;

/* The segments of one kind of memory, by size class: host memory, or one
 * device of one backend. */
#define IPCREF__CLASSES        40
#define IPCREF__MIN_BLOCK      64u
#define IPCREF__OWN            UINT32_MAX       /* cls: a block of its own */
#define IPCREF__FOREIGN        (UINT32_MAX - 1) /* cls: wrapped allocation */
typedef struct ipcref__pool {
  ipcref_backend *be; /* NULL: host memory */
  int32_t dev;
  ipcref__segment *classes[IPCREF__CLASSES];
  struct ipcref__pool *next;
} ipcref__pool;

struct ipcref__segment {
  ipcref_ctx *ctx;
  ipcref__pool *pool;
  uint64_t id;         /* never reused in a ctx: the id is its generation too */
  int fd, ro_fd;       /* host: the memfd (and its read-only open) */
  unsigned char *base; /* host: the mapping */
  uint64_t daddr;      /* device: the allocation's address */
  unsigned char handle[IPCREF_HANDLE_BYTES]; /* device: its IPC handle */
  int exported;                              /* handle made */
  int leaked;      /* device memory still leased when the context went: never
                      freed (a consumer may have it open) */
  uint32_t nwraps; /* foreign: blocks in it */
  size_t size, block_size;
  uint32_t nblocks, nfree, cls; /* cls: size class, IPCREF__OWN, or
                                   IPCREF__FOREIGN */
  uint32_t *free_stack;
  ipcref__block *blocks;
  ipcref__segment *next, *prev;             /* all segments */
  ipcref__segment *class_next, *class_prev; /* with free blocks */
  int in_class;
  int cached; /* empty, and counted in ctx->empty_bytes */
};

#define IPCREF__LATE 16 /* holes stepped over that a ledger remembers */

typedef struct ipcref__lease {
  ipcref__block *block; /* NULL: free */
  uint32_t gen;
  int holder;           /* forwarded leases: the holder's pid */
  ipcref__watch *watch; /* and its watch (NULL: watched by pid alone) */
  ipcref_backend *be;   /* device: the event recorded for this hand-off, */
  void *event;          /* kept until the lease ends */
  struct ipcref__alias *alias; /* taken through an alias: one of its holds */
  uint32_t reclaimed; /* generation + 1 of the last lease here ended because
                         its holder died (see ipcref__lease_reclaim) */
} ipcref__lease;

struct ipcref__ledger {
  uint64_t id;
  int fd;
  unsigned char *base;
  uint32_t n;
  uint64_t tail; /* ring entries consumed */
  ipcref__lease *leases;
  uint32_t *free_stack, nfree; /* free slots of the producer half */
  uint32_t live;
  ipcref_peer *peer;    /* NULL once the peer is gone */
  ipcref__watch *watch; /* the process it was made for */
  int holder;           /* its pid (watched by pid alone if watch NULL) */
  int holder_dead;      /* its own leases were reclaimed */
  uint64_t hole_pos;    /* ring position + 1 of a hole seen at the tail */
  long hole_ms;         /* when it was first seen */
  uint64_t death_head;  /* the ring's head when a death was last reaped */
  uint64_t late[IPCREF__LATE]; /* holes stepped over, watched for late
                                  entries */
  uint32_t nlate;
  ipcref__ledger *next, *prev;
};

/* ---- consumer-side mappings (cached per ctx) --------------------------- */

typedef struct ipcref__map {
  int kind; /* 1: segment, 2: ledger, 3: device segment */
  uint64_t origin_nonce, id;
  int origin_pid;
  int fd; /* kept for forwarding */
  unsigned char *base;
  size_t size;
  int writable;
  uint32_t nslots;    /* ledgers */
  uint32_t *imported; /* ledgers: generation + 1 of the last import */
  ipcref_backend *be; /* device segments: opened by it, at daddr */
  int32_t dev_type, dev_id;
  uint64_t daddr;
  unsigned char handle[IPCREF_HANDLE_BYTES]; /* kept for forwarding */
  int refs;    /* atomic: imported buffers using it */
  int retired; /* the origin destroyed it: unmap at refs 0 */
  struct ipcref__map *next, *prev;
} ipcref__map;

typedef struct ipcref__import {
  ipcref_ctx *ctx;
  ipcref__map *seg, *ledger;
  uint32_t slot, gen;
  size_t offset, size;
  void *stream;  /* device: the stream that uses it */
  int has_event; /* device: the producer's event, kept for forwarding */
  unsigned char event[IPCREF_HANDLE_BYTES];
  struct ipcref__import *next; /* deferred: waiting for its fence */
  void *fence;
} ipcref__import;

typedef struct ipcref__seen {
  uint64_t nonce, key; /* key: id << 1 | (1 for a ledger) */
} ipcref__seen_key;

struct ipcref_peer {
  ipcref_ctx *ctx;
  int fd, pid, uid, sock_type;
  ipcref__watch *watch; /* the other process (from its hello) */
  uint64_t nonce;       /* its context (from its hello) */
  int origin_retired;   /* it died: its mappings here were retired */
  int hello; /* 0: the other side's hello not read yet; 1: read; -1: bad;
                -2: refused (a uid not allowed) */
  ipcref__ledger *ledger; /* the current one for exports to this peer */
  ipcref__seen_key *seen; /* what the other side has been sent */
  size_t nseen, capseen;
  uint64_t *retired; /* own segments destroyed since, to announce */
  size_t nretired, capretired;
  ipcref_view pending[64]; /* received views not handed out yet */
  int npending, pending_pos;
  ipcref_peer *next, *prev;
};

struct ipcref_ctx {
  pthread_mutex_t lock;
  ipcref_ctx_options opt;
  uint64_t nonce;
  int pid;
  uint64_t next_id;
  ipcref__segment *segments;
  ipcref__pool host;   /* host memory's size classes */
  ipcref__pool *pools; /* each device's */
  ipcref_backend *backends[8];
  ipcref__block *released;         /* wraps to hand back after the unlock */
  ipcref__alias *unpinned;         /* aliases to end after the unlock */
  struct ipcref__import *deferred; /* device releases waiting for a fence */
  struct ipcref__import *finished; /* and those to return after the unlock */
  int owner_gone;                  /* atomic: ipcref_ctx_free was called */
  ipcref__ledger *ledgers;
  ipcref__map *maps;
  ipcref_peer *peers;
  ipcref__block *limbo;
  size_t empty_bytes;
  ipcref_stats st;
  int imported_bufs; /* atomic */
  int no_pidfd;      /* pidfd_open is missing here: deaths seen by pid */
  int epfd;          /* the poll fd: the watches' pidfds */
  ipcref__watch *watches;
  uint64_t reaped;  /* peer_deaths when the last reap ran */
  long pump_tick;   /* the clock tick of the last death check */
  uint32_t *uids;   /* allowed besides our own (opt.allow_uids) */
  uint64_t refused; /* atomic: st.refused, counted outside the lock */
  int uid;
  int refs; /* atomic: the owner's, and one per live shared or imported
               buffer; the context is torn down when the last one goes */
};

/* Intrusive doubly linked lists: `head` is the first node, nodes link
 * through the fields named `next` and `prev`. */
#define IPCREF__LIST_PUSH(head, node, next, prev)                              \
  do {                                                                         \
    (node)->prev = NULL;                                                       \
    (node)->next = (head);                                                     \
    if (head) (head)->prev = (node);                                           \
    (head) = (node);                                                           \
  } while (0)
#define IPCREF__LIST_REMOVE(head, node, next, prev)                            \
  do {                                                                         \
    if ((node)->prev)                                                          \
      (node)->prev->next = (node)->next;                                       \
    else                                                                       \
      (head) = (node)->next;                                                   \
    if ((node)->next) (node)->next->prev = (node)->prev;                       \
  } while (0)

/* ---- small helpers ----------------------------------------------------- */

#define IPCREF__LOCK(c)   pthread_mutex_lock(&(c)->lock)
#define IPCREF__UNLOCK(c) ipcref__unlock(c)

/* Unlocks the context, then hands the wrapped allocations whose last hold
 * went back to their owners: their release runs outside the lock, since
 * it may call back into ipcref. */
IPCREF_PRIVATE void ipcref__import_finish(struct ipcref__import *imp);

IPCREF_PRIVATE void ipcref__unlock(ipcref_ctx *ctx) {
  ipcref__block *b = ctx->released;
  struct ipcref__import *imp = ctx->finished;
  ipcref__alias *a = ctx->unpinned;
  ctx->released = NULL;
  ctx->finished = NULL;
  ctx->unpinned = NULL;
  pthread_mutex_unlock(&ctx->lock);
  while (a) { /* aliases whose last hold went */
    ipcref__alias *next = a->next;
    a->fn(a->user);
    ipcref_buf_release(a->src);
    IPCREF_FREE(a);
    a = next;
  }
  while (b) {
    ipcref__block *next = b->limbo_next;
    if (b->release) b->release(b->user, b->ptr);
    IPCREF_FREE(b);
    b = next;
  }
  while (imp) { /* device releases whose work completed */
    struct ipcref__import *next = imp->next;
    ipcref__import_finish(imp);
    imp = next;
  }
}

IPCREF_PRIVATE void *ipcref__zalloc(size_t n) {
  void *p = IPCREF_MALLOC(n ? n : 1);
  if (p) memset(p, 0, n ? n : 1);
  return p;
}

/* Grows *arr (elements of `size` bytes) to hold `need`. 0 on ENOMEM. */
IPCREF_PRIVATE int ipcref__grow(void **arr, size_t *cap, size_t need,
                                size_t size) {
  size_t ncap;
  void *p;
  if (need <= *cap) return 1;
  ncap = *cap ? *cap * 2 : 8;
  while (ncap < need) ncap *= 2;
  p = IPCREF_REALLOC(*arr, ncap * size);
  if (!p) return 0;
  *arr = p;
  *cap = ncap;
  return 1;
}

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

/* A sealed memfd of `size` bytes, mapped read-write at *base. Sealed
 * against shrinking and growing (a mapping of it can never SIGBUS) and
 * against further seals; with `read_only_elsewhere`, also against any new
 * writable mapping or write(): the producer's mapping, made before, is the
 * only way to change it, whoever else gets hold of the file. */
IPCREF_PRIVATE int ipcref__memfd(const char *name, size_t size,
                                 int read_only_elsewhere,
                                 unsigned char **base) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  void *p;
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)size) != 0) goto fail;
  p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) goto fail;
  if (read_only_elsewhere) seals |= F_SEAL_FUTURE_WRITE;
  if (fcntl(fd, F_ADD_SEALS, seals) != 0) {
    munmap(p, size);
    goto fail;
  }
  *base = (unsigned char *)p;
  return fd;
fail:
  close(fd);
  return -1;
}

/* What a peer did wrong, to the context's hook (or the process-wide one). */
IPCREF_PRIVATE void ipcref__ctx_report(ipcref_ctx *ctx, ipcref_result code,
                                       const char *message) {
  if (ctx->opt.error_hook.fn)
    ctx->opt.error_hook.fn(ctx->opt.error_hook.user, code, message);
  else
    ipcref__report(code, message);
}

/* Milliseconds of the coarse monotonic clock (a vDSO read, no system
 * call; it moves once per clock tick). */
IPCREF_PRIVATE long ipcref__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- watching processes -------------------------------------------------
 * Under the lock. A death is noticed by the pidfd turning readable (the
 * epoll set: ipcref__watch_events), or, where there is no pidfd, by
 * kill(pid, 0) in ipcref_collect. Whatever notices one counts it in
 * st.peer_deaths; the reap that follows compares that with ctx->reaped. */

IPCREF_PRIVATE void ipcref__watch_dead(ipcref_ctx *ctx, ipcref__watch *w) {
  if (w->dead) return;
  w->dead = 1;
  ctx->st.peer_deaths++;
  if (w->pidfd >= 0) {
    (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, w->pidfd, NULL);
    close(w->pidfd);
    w->pidfd = -1;
  }
}

/* The watch on process `pid` (a new one, or one more use of the live
 * one); NULL for pid <= 0 or out of memory (then the caller falls back on
 * the pid). A process already gone is dead from the start. */
IPCREF_PRIVATE ipcref__watch *ipcref__watch_get(ipcref_ctx *ctx, int pid) {
  ipcref__watch *w;
  if (pid <= 0) return NULL;
  for (w = ctx->watches; w; w = w->next)
    if (w->pid == pid && !w->dead) {
      w->refs++;
      return w;
    }
  w = (ipcref__watch *)ipcref__zalloc(sizeof *w);
  if (!w) return NULL;
  w->pid = pid;
  w->pidfd = -1;
  w->refs = 1;
  IPCREF__LIST_PUSH(ctx->watches, w, next, prev);
#ifdef SYS_pidfd_open
  if (!ctx->no_pidfd) { /* Linux 5.3; the fd is close-on-exec */
    w->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (w->pidfd >= 0) {
      struct epoll_event ev;
      memset(&ev, 0, sizeof ev);
      ev.events = EPOLLIN;
      ev.data.ptr = w;
      /* Without the epoll entry the death is still seen by collect. */
      (void)epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, w->pidfd, &ev);
    } else if (errno == ESRCH) {
      ipcref__watch_dead(ctx, w);
    } else if (errno == ENOSYS) {
      ctx->no_pidfd = 1;
    }
  }
#endif
  return w;
}

IPCREF_PRIVATE void ipcref__watch_put(ipcref_ctx *ctx, ipcref__watch *w) {
  if (!w || --w->refs > 0) return;
  if (w->pidfd >= 0) {
    (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, w->pidfd, NULL);
    close(w->pidfd);
  }
  IPCREF__LIST_REMOVE(ctx->watches, w, next, prev);
  IPCREF_FREE(w);
}

/* 1 when process `pid` is known to be gone: kill(pid, 0) finds none. */
IPCREF_PRIVATE int ipcref__pid_gone(int pid) {
  return pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
}

/* Marks the watches whose pidfd turned readable (the process exited, or
 * is a zombie). Returns how many. */
IPCREF_PRIVATE int ipcref__watch_events(ipcref_ctx *ctx) {
  struct epoll_event ev[16];
  int n, i, got = 0;
  do {
    n = epoll_wait(ctx->epfd, ev, 16, 0);
    for (i = 0; i < n; i++)
      ipcref__watch_dead(ctx, (ipcref__watch *)ev[i].data.ptr);
    if (n > 0) got += n;
  } while (n == 16);
  return got;
}

/* Every check there is: the epoll set, then kill(pid, 0) for the watches
 * without a pidfd. */
IPCREF_PRIVATE void ipcref__watch_refresh(ipcref_ctx *ctx) {
  ipcref__watch *w;
  (void)ipcref__watch_events(ctx);
  for (w = ctx->watches; w; w = w->next)
    if (!w->dead && w->pidfd < 0 && ipcref__pid_gone(w->pid))
      ipcref__watch_dead(ctx, w);
}

/* ---- segments and blocks ----------------------------------------------- */

IPCREF_PRIVATE uint32_t ipcref__class_of(size_t size, size_t *block) {
  size_t b = IPCREF__MIN_BLOCK;
  uint32_t c = 0;
  while (b < size) b <<= 1, c++;
  *block = b;
  return c;
}

IPCREF_PRIVATE void ipcref__class_add(ipcref__segment *s) {
  if (s->in_class || s->cls >= IPCREF__CLASSES) return;
  IPCREF__LIST_PUSH(s->pool->classes[s->cls], s, class_next, class_prev);
  s->in_class = 1;
}

IPCREF_PRIVATE void ipcref__class_remove(ipcref__segment *s) {
  if (!s->in_class) return;
  IPCREF__LIST_REMOVE(s->pool->classes[s->cls], s, class_next, class_prev);
  s->in_class = 0;
}

IPCREF_PRIVATE void ipcref__retire_announce(ipcref_ctx *ctx, uint64_t id) {
  ipcref_peer *p;
  size_t i;
  for (p = ctx->peers; p; p = p->next)
    for (i = 0; i < p->nseen; i++)
      if (p->seen[i].nonce == ctx->nonce && p->seen[i].key == (id << 1)) {
        p->seen[i] = p->seen[--p->nseen];
        if (ipcref__grow((void **)&p->retired, &p->capretired, p->nretired + 1,
                         sizeof(uint64_t)))
          p->retired[p->nretired++] = id;
        break;
      }
}

IPCREF_PRIVATE void ipcref__segment_destroy(ipcref_ctx *ctx,
                                            ipcref__segment *s) {
  ipcref__class_remove(s);
  if (s->cached) ctx->empty_bytes -= s->size;
  IPCREF__LIST_REMOVE(ctx->segments, s, next, prev);
  ipcref__retire_announce(ctx, s->id);
  if (s->pool->be) { /* a wrapped allocation stays its owner's */
    if (s->cls != IPCREF__FOREIGN && !s->leaked)
      s->pool->be->seg_free(s->pool->be, s->pool->dev, s->daddr);
    ctx->st.device_bytes -= s->size;
  } else {
    munmap(s->base, s->size);
    close(s->fd);
    if (s->ro_fd >= 0) close(s->ro_fd);
  }
  ctx->st.segment_bytes -= s->size;
  ctx->st.mapped_segments--;
  IPCREF_FREE(s->free_stack);
  IPCREF_FREE(s->blocks);
  IPCREF_FREE(s);
}

/* A new segment of `size` bytes in `pool`, cut into blocks of `block`
 * bytes (none for IPCREF__FOREIGN: the caller adds its wraps); device
 * memory comes from the pool's backend (daddr: given for a foreign one). */
IPCREF_PRIVATE ipcref_result ipcref__segment_new(ipcref_ctx *ctx,
                                                 ipcref__pool *pool,
                                                 size_t size, size_t block,
                                                 uint32_t cls, uint64_t daddr,
                                                 ipcref__segment **out) {
  ipcref__segment *s;
  ipcref_result r;
  uint32_t i;
  if (ctx->opt.max_bytes && cls != IPCREF__FOREIGN &&
      ctx->st.segment_bytes + size > ctx->opt.max_bytes)
    return IPCREF_ENOMEM;
  s = (ipcref__segment *)ipcref__zalloc(sizeof *s);
  if (!s) return IPCREF_ENOMEM;
  s->nblocks = cls == IPCREF__FOREIGN ? 0 : (uint32_t)(size / block);
  s->free_stack = (uint32_t *)ipcref__zalloc(s->nblocks * sizeof(uint32_t));
  s->blocks = (ipcref__block *)ipcref__zalloc(s->nblocks * sizeof *s->blocks);
  if (!s->free_stack || !s->blocks) goto nomem;
  s->pool = pool;
  s->fd = s->ro_fd = -1;
  s->daddr = daddr;
  if (pool->be) {
    if (cls != IPCREF__FOREIGN) {
      r = pool->be->seg_alloc(pool->be, pool->dev, size, &s->daddr);
      if (r != IPCREF_OK) goto fail;
    }
    ctx->st.device_bytes += size;
  } else {
    s->fd = ipcref__memfd("ipcref-segment", size, !ctx->opt.writable_shares,
                          &s->base);
    if (s->fd < 0) goto sys;
  }
  if (!pool->be && !ctx->opt.writable_shares) {
    /* A second open of the memfd, read-only, for consumers: made here, off
     * the hand-off path. */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", s->fd);
    s->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
  }
  s->ctx = ctx;
  s->id = ++ctx->next_id;
  s->size = size;
  s->block_size = block;
  s->cls = cls;
  for (i = 0; i < s->nblocks; i++) {
    s->free_stack[i] = s->nblocks - 1 - i; /* hand out low offsets first */
    s->blocks[i].seg = s;
    s->blocks[i].offset = (size_t)i * block;
    s->blocks[i].size = block;
  }
  s->nfree = s->nblocks;
  IPCREF__LIST_PUSH(ctx->segments, s, next, prev);
  ctx->st.segment_bytes += size;
  ctx->st.mapped_segments++;
  *out = s;
  return IPCREF_OK;
sys:
  r = errno == ENOMEM ? IPCREF_ENOMEM : IPCREF_ESYS;
fail:
  IPCREF_FREE(s->free_stack);
  IPCREF_FREE(s->blocks);
  IPCREF_FREE(s);
  return r;
nomem:
  IPCREF_FREE(s->free_stack);
  IPCREF_FREE(s->blocks);
  IPCREF_FREE(s);
  return IPCREF_ENOMEM;
}

/* A free block of at least `size` bytes in `pool` (under the lock); `own`:
 * in a segment of its own. */
IPCREF_PRIVATE ipcref_result ipcref__block_alloc(ipcref_ctx *ctx,
                                                 ipcref__pool *pool,
                                                 size_t size, int own,
                                                 ipcref__block **out) {
  ipcref__segment *s;
  ipcref__block *b;
  size_t block;
  uint32_t cls = ipcref__class_of(size, &block);
  ipcref_result r;
  if (own || block > ctx->opt.segment_size / 2 || cls >= IPCREF__CLASSES) {
    /* Isolated or large: a segment of its own, rounded to pages. */
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    size_t bytes = (size + page - 1) & ~(page - 1);
    if (bytes == 0) bytes = page;
    r = ipcref__segment_new(ctx, pool, bytes, bytes, IPCREF__OWN, 0, &s);
    if (r != IPCREF_OK) return r;
  } else if ((s = pool->classes[cls]) == NULL) {
    r = ipcref__segment_new(ctx, pool, ctx->opt.segment_size, block, cls, 0,
                            &s);
    if (r != IPCREF_OK) return r;
    ipcref__class_add(s);
  }
  if (s->cached) { /* an empty cached segment comes back into use */
    ctx->empty_bytes -= s->size;
    s->cached = 0;
  }
  b = &s->blocks[s->free_stack[--s->nfree]];
  if (s->nfree == 0) ipcref__class_remove(s);
  b->leases = 0;
  b->local = 1;
  b->in_limbo = 0;
  *out = b;
  return IPCREF_OK;
}

/* One hold of an alias less (under the lock); the last ends it after the
 * unlock. */
IPCREF_PRIVATE void ipcref__alias_drop(ipcref_ctx *ctx, ipcref__alias *a) {
  if (--a->holds) return;
  a->next = ctx->unpinned;
  ctx->unpinned = a;
}

IPCREF_PRIVATE void ipcref__block_free(ipcref_ctx *ctx, ipcref__block *b) {
  ipcref__segment *s = b->seg;
  if (s->cls == IPCREF__FOREIGN) { /* back to its owner, after the unlock */
    b->limbo_next = ctx->released;
    ctx->released = b;
    if (--s->nwraps == 0) ipcref__segment_destroy(ctx, s);
    return;
  }
  s->free_stack[s->nfree++] = (uint32_t)(b - s->blocks);
  if (s->nfree < s->nblocks) {
    ipcref__class_add(s);
    return;
  }
  /* Empty: keep it while the cache has room, else return it to the OS. */
  if (s->cls < IPCREF__CLASSES &&
      ctx->empty_bytes + s->size <= ctx->opt.segment_cache) {
    ctx->empty_bytes += s->size;
    s->cached = 1;
    ipcref__class_add(s);
    return;
  }
  ipcref__segment_destroy(ctx, s);
}

IPCREF_PRIVATE void ipcref__limbo_remove(ipcref_ctx *ctx, ipcref__block *b) {
  IPCREF__LIST_REMOVE(ctx->limbo, b, limbo_next, limbo_prev);
  b->in_limbo = 0;
  ctx->st.limbo_blocks--;
  ctx->st.limbo_bytes -= b->size;
}

/* A lease on `b` ended (under the lock): frees the block when nothing
 * holds it any more. Returns the bytes freed. */
IPCREF_PRIVATE size_t ipcref__lease_end(ipcref_ctx *ctx, ipcref__block *b) {
  size_t bytes;
  b->leases--;
  ctx->st.live_slots--;
  if (b->leases || b->local) return 0;
  bytes = b->size;
  if (b->in_limbo) ipcref__limbo_remove(ctx, b);
  ipcref__block_free(ctx, b);
  return bytes;
}

/* ---- ledgers (producer side) ------------------------------------------- */

IPCREF_PRIVATE void ipcref__ledger_destroy(ipcref_ctx *ctx, ipcref__ledger *l) {
  uint32_t s;
  IPCREF__LIST_REMOVE(ctx->ledgers, l, next, prev);
  for (s = l->n / 2; s < l->n; s++) ipcref__watch_put(ctx, l->leases[s].watch);
  ipcref__watch_put(ctx, l->watch);
  munmap(l->base, ipcref__ledger_bytes(l->n));
  close(l->fd);
  ctx->st.counter_files--;
  IPCREF_FREE(l->leases);
  IPCREF_FREE(l->free_stack);
  IPCREF_FREE(l);
}

/* A new ledger for peer p. Each one a peer gets is twice the size of its
 * last (up to 2^22 slots), so a peer holding n leases needs O(log n)
 * ledgers, and a sweep, which looks at every ledger, stays cheap. */
IPCREF_PRIVATE ipcref_result ipcref__ledger_new(ipcref_ctx *ctx, ipcref_peer *p,
                                                ipcref__ledger **out) {
  uint32_t n = ctx->opt.ledger_slots, i;
  size_t bytes;
  ipcref__ledger *l;
  if (p && p->ledger && p->ledger->n < (1u << 22)) n = p->ledger->n * 2;
  bytes = ipcref__ledger_bytes(n);
  l = (ipcref__ledger *)ipcref__zalloc(sizeof *l);
  ipcref__ledger_hdr *h;
  if (!l) return IPCREF_ENOMEM;
  l->leases = (ipcref__lease *)ipcref__zalloc(n * sizeof *l->leases);
  l->free_stack = (uint32_t *)ipcref__zalloc(n / 2 * sizeof(uint32_t));
  if (!l->leases || !l->free_stack) goto nomem;
  /* Consumers write their returns into it: no write seal. */
  l->fd = ipcref__memfd("ipcref-ledger", bytes, 0, &l->base);
  if (l->fd < 0) goto sys;
  l->n = n;
  l->id = ++ctx->next_id;
  l->peer = p;
  if (p) l->holder = p->hello > 0 ? p->pid : 0;
  if (p && p->watch) { /* the same process as the peer's */
    l->watch = p->watch;
    l->watch->refs++;
  }
  for (i = 0; i < n / 2; i++) l->free_stack[i] = n / 2 - 1 - i;
  l->nfree = n / 2;
  h = (ipcref__ledger_hdr *)(void *)l->base;
  h->magic = IPCREF__LEDGER_MAGIC;
  h->version = IPCREF__LEDGER_VERSION;
  h->nslots = n;
  h->origin_pid = (uint32_t)ctx->pid;
  h->origin_nonce = ctx->nonce;
  h->ledger_id = l->id;
  IPCREF__LIST_PUSH(ctx->ledgers, l, next, prev);
  ctx->st.counter_files++;
  *out = l;
  return IPCREF_OK;
sys:
  IPCREF_FREE(l->leases);
  IPCREF_FREE(l->free_stack);
  IPCREF_FREE(l);
  return IPCREF_ESYS;
nomem:
  IPCREF_FREE(l->leases);
  IPCREF_FREE(l->free_stack);
  IPCREF_FREE(l);
  return IPCREF_ENOMEM;
}

/* Ends lease (slot, gen) of ledger `l` (under the lock): the slot is free
 * again at the same generation (the next lease on it takes the next one,
 * so a replay of this one is refused), and the block goes when nothing
 * else holds it. 0 when there is no such live lease. */
IPCREF_PRIVATE int ipcref__lease_free(ipcref_ctx *ctx, ipcref__ledger *l,
                                      uint32_t slot, uint32_t gen,
                                      size_t *freed) {
  uint64_t *slots = ipcref__ledger_slots(l->base);
  ipcref__block *b;
  if (slot >= l->n || !l->leases[slot].block || l->leases[slot].gen != gen)
    return 0;
  b = l->leases[slot].block;
  l->leases[slot].block = NULL;
  ipcref__watch_put(ctx, l->leases[slot].watch);
  l->leases[slot].watch = NULL;
  if (l->leases[slot].event)
    l->leases[slot].be->event_free(l->leases[slot].be, l->leases[slot].event);
  l->leases[slot].event = NULL;
  if (l->leases[slot].alias) ipcref__alias_drop(ctx, l->leases[slot].alias);
  l->leases[slot].alias = NULL;
  l->live--;
  __atomic_store_n(&slots[2 * (size_t)slot],
                   ((uint64_t)gen << 2) | IPCREF__SLOT_FREE, __ATOMIC_RELEASE);
  if (slot < l->n / 2) l->free_stack[l->nfree++] = slot;
  *freed += ipcref__lease_end(ctx, b);
  return 1;
}

/* Ends lease `slot` of ledger `l` because its holder died (under the
 * lock). Its generation is remembered: a return of it that comes later
 * (a forwarder cancelling a send to the dead one) is late, not forged. */
IPCREF_PRIVATE void ipcref__lease_reclaim(ipcref_ctx *ctx, ipcref__ledger *l,
                                          uint32_t slot, size_t *freed) {
  uint32_t gen = l->leases[slot].gen;
  if (!l->leases[slot].block || !ipcref__lease_free(ctx, l, slot, gen, freed))
    return;
  l->leases[slot].reclaimed = gen + 1u;
  ctx->st.reclaimed++;
}

/* A ring entry refused (under the lock): counted, and reported to the
 * context's hook. Never a free: the private lease table decides. */
IPCREF_PRIVATE void ipcref__bad_return(ipcref_ctx *ctx, const char *what) {
  ctx->st.bad_returns++;
  ipcref__ctx_report(ctx, IPCREF_EPROTO, what);
}

/* Records a forwarded lease (slot, gen) on block `b`, held by `holder`
 * (under the lock). */
IPCREF_PRIVATE void ipcref__lease_link(ipcref_ctx *ctx, ipcref__ledger *l,
                                       uint32_t slot, uint32_t gen,
                                       ipcref__block *b, int holder) {
  l->leases[slot].block = b;
  l->leases[slot].gen = gen;
  l->leases[slot].holder = holder;
  l->leases[slot].watch = ipcref__watch_get(ctx, holder);
  b->leases++;
  l->live++;
  ctx->st.live_slots++;
}

/* Adopts the forwarded leases whose link the ring has not delivered
 * (under the lock): every forwarding slot that is live in the shared
 * table, unknown here, and names a live parent. A forwarder writes the
 * slot (holder pid, parent slot + 1) before it takes its ring positions,
 * so when a hole is stepped over its link is found here, before any later
 * entry (the parent's own return comes later) is read. A link that
 * arrives after all is then taken as already known. */
IPCREF_PRIVATE void ipcref__adopt_forwards(ipcref_ctx *ctx, ipcref__ledger *l) {
  uint64_t *slots = ipcref__ledger_slots(l->base);
  uint32_t s;
  for (s = l->n / 2; s < l->n; s++) {
    uint64_t w = __atomic_load_n(&slots[2 * (size_t)s], __ATOMIC_ACQUIRE), h;
    uint32_t parent;
    if ((w & 3u) != IPCREF__SLOT_LIVE || l->leases[s].block) continue;
    h = __atomic_load_n(&slots[2 * (size_t)s + 1], __ATOMIC_ACQUIRE);
    parent = (uint32_t)(h >> 32);
    if (parent == 0 || parent > l->n || !l->leases[parent - 1].block)
      continue; /* not written yet (its link will come), or never linked */
    ipcref__lease_link(ctx, l, s, (uint32_t)(w >> 2),
                       l->leases[parent - 1].block, (int)(uint32_t)h);
  }
}

/* A hole at the ring's tail: a position taken whose entry is not written.
 * Normally its writer is between two instructions and the next sweep
 * finds it; but a writer killed there never writes it, and every entry
 * behind it would wait forever. So a hole is stepped over at once when it
 * lies before the head the ring had when a death was reaped (its writer
 * may be the dead one), and otherwise once it is 100 ms old. Stepping over
 * a live writer's hole frees nothing early: the forwarded leases it may
 * have been linking are adopted from the shared slots at once, and its
 * position is remembered, so an entry written late is still read (unless
 * the ring has come round to that cell again by then, when a return is
 * lost and its block stays until its holder dies). */
IPCREF_PRIVATE int ipcref__hole_stale(ipcref__ledger *l) {
  long now = ipcref__now_ms();
  if (l->tail < l->death_head) return 1;
  if (l->hole_pos != l->tail + 1) {
    l->hole_pos = l->tail + 1;
    l->hole_ms = now;
    return 0;
  }
  return now - l->hole_ms >= 100;
}

/* Steps over the hole at ring position `pos` (under the lock). */
IPCREF_PRIVATE void ipcref__hole_skip(ipcref_ctx *ctx, ipcref__ledger *l,
                                      uint64_t pos) {
  if (l->nlate == IPCREF__LATE) { /* forget the oldest */
    memmove(l->late, l->late + 1, (IPCREF__LATE - 1) * sizeof l->late[0]);
    l->nlate--;
  }
  l->late[l->nlate++] = pos;
  ipcref__adopt_forwards(ctx, l);
}

/* One ring entry that is not a link (under the lock). */
IPCREF_PRIVATE void ipcref__ring_release(ipcref_ctx *ctx, ipcref__ledger *l,
                                         uint64_t e, size_t *freed) {
  uint32_t slot = (uint32_t)(e & 0x3fffffffu) - 1u, gen = (uint32_t)(e >> 32);
  if (((e >> 30) & 3u) != IPCREF__RING_RELEASE) {
    ipcref__bad_return(ctx, "invalid lease return in a ledger");
  } else if (ipcref__lease_free(ctx, l, slot, gen, freed)) {
    return;
  } else if (slot < l->n && l->leases[slot].reclaimed == gen + 1u) {
    l->leases[slot].reclaimed = 0; /* late, once: a second one is forged */
    ctx->st.late_returns++;
  } else {
    ipcref__bad_return(ctx, "invalid lease return in a ledger");
  }
}

/* Entries written late into holes stepped over (under the lock): a return
 * is taken as any other; half a link is known already (adopted). A cell
 * is watched until the ring's head reaches its next lap. */
IPCREF_PRIVATE void ipcref__late_entries(ipcref_ctx *ctx, ipcref__ledger *l,
                                         uint64_t head, size_t *freed) {
  uint64_t *ring = ipcref__ledger_ring(l->base, l->n);
  uint64_t cap = 2u * (uint64_t)l->n;
  uint32_t i = 0;
  while (i < l->nlate) {
    uint64_t pos = l->late[i], e = 0;
    if (head <= pos + cap) {
      e = __atomic_load_n(&ring[pos % cap], __ATOMIC_ACQUIRE);
      if (e == 0) {
        i++;
        continue;
      }
      __atomic_store_n(&ring[pos % cap], 0, __ATOMIC_RELAXED);
    }
    l->late[i] = l->late[--l->nlate];
    if (e && ((e >> 30) & 3u) == IPCREF__RING_RELEASE)
      ipcref__ring_release(ctx, l, e, freed);
  }
}

/* Reads what came back to ledger `l` since the last sweep (under the
 * lock). Every entry is checked against the private lease table: a
 * ledger can only end its own peer's leases, and a stale, replayed or
 * forged entry (a second return of one lease, a return from a process
 * that died and was reclaimed) is reported and ignored: a count can never
 * go below zero. Returns the bytes freed. */
IPCREF_PRIVATE size_t ipcref__ledger_drain(ipcref_ctx *ctx, ipcref__ledger *l) {
  ipcref__ledger_hdr *h = (ipcref__ledger_hdr *)(void *)l->base;
  uint64_t *ring = ipcref__ledger_ring(l->base, l->n);
  uint64_t *slots = ipcref__ledger_slots(l->base);
  uint64_t cap = 2u * (uint64_t)l->n;
  /* Acquire: pairs with the release of a writer's fetch_add, so what it
   * wrote before taking its positions (a forwarded slot) is seen. */
  uint64_t head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
  size_t freed = 0;
  if (l->nlate) ipcref__late_entries(ctx, l, head, &freed);
  if (head == l->tail) return freed;
  IPCREF__STEP("sweep");
  if (head - l->tail > cap) { /* a consumer wrote past the ring: distrust */
    ipcref__bad_return(ctx, "ledger ring overrun by a peer");
    l->tail = head - cap;
  }
  while (l->tail != head) {
    uint64_t *cell = &ring[l->tail % cap], *next = &ring[(l->tail + 1) % cap];
    uint64_t e = __atomic_load_n(cell, __ATOMIC_ACQUIRE), p;
    uint32_t slot, gen, ps;
    ipcref__lease *parent;
    if (e == 0) { /* taken but not written (yet) */
      if (!ipcref__hole_stale(l)) break;
      ipcref__hole_skip(ctx, l, l->tail++);
      continue;
    }
    if (((e >> 30) & 3u) != IPCREF__RING_LINK) {
      __atomic_store_n(cell, 0, __ATOMIC_RELAXED);
      l->tail++;
      ipcref__ring_release(ctx, l, e, &freed);
      continue;
    }
    /* A link: two entries, the forwarded lease and its parent. */
    if (l->tail + 1 == head) break; /* the pair is not complete yet */
    p = __atomic_load_n(next, __ATOMIC_ACQUIRE);
    if (p == 0) { /* its second half is a hole: wait, or step over both */
      int stale;
      l->tail++;
      stale = ipcref__hole_stale(l);
      l->tail--;
      if (!stale) break;
      __atomic_store_n(cell, 0, __ATOMIC_RELAXED);
      ipcref__hole_skip(ctx, l, l->tail + 1);
      l->tail += 2;
      continue;
    }
    __atomic_store_n(next, 0, __ATOMIC_RELAXED);
    __atomic_store_n(cell, 0, __ATOMIC_RELAXED);
    l->tail += 2;
    slot = (uint32_t)(e & 0x3fffffffu) - 1u;
    gen = (uint32_t)(e >> 32);
    ps = (uint32_t)(p & 0x3fffffffu) - 1u;
    parent = ps < l->n ? &l->leases[ps] : NULL;
    if (slot >= l->n / 2 && slot < l->n && l->leases[slot].block &&
        l->leases[slot].gen == gen && parent &&
        parent->block == l->leases[slot].block)
      continue; /* adopted already, while its link was a hole */
    if (((p >> 30) & 3u) != IPCREF__RING_PARENT || slot < l->n / 2 ||
        slot >= l->n || l->leases[slot].block || !parent || !parent->block ||
        parent->gen != (uint32_t)(p >> 32) ||
        __atomic_load_n(&slots[2 * (size_t)slot], __ATOMIC_ACQUIRE) !=
            (((uint64_t)gen << 2) | IPCREF__SLOT_LIVE)) {
      ipcref__bad_return(ctx, "invalid forwarded lease in a ledger");
      continue;
    }
    /* The holder, as the forwarder wrote it before the link. */
    ipcref__lease_link(ctx, l, slot, gen, parent->block,
                       (int)(uint32_t)__atomic_load_n(
                           &slots[2 * (size_t)slot + 1], __ATOMIC_RELAXED));
  }
  return freed;
}

/* The sweep (under the lock): every ledger's returns, then the ledgers
 * that nobody can use any more. */
IPCREF_PRIVATE size_t ipcref__sweep(ipcref_ctx *ctx) {
  ipcref__ledger *l, *next;
  size_t freed = 0;
  ctx->st.sweeps++;
  for (l = ctx->ledgers; l; l = next) {
    next = l->next;
    freed += ipcref__ledger_drain(ctx, l);
    if (!l->peer && l->live == 0) ipcref__ledger_destroy(ctx, l);
  }
  return freed;
}

/* ---- the context ------------------------------------------------------- */

IPCREF_API ipcref_result ipcref_ctx_new(const ipcref_ctx_options *opt,
                                        ipcref_ctx **out) {
  ipcref_ctx *ctx;
  struct timespec ts;
  if (!out) return IPCREF_EINVAL;
  ctx = (ipcref_ctx *)ipcref__zalloc(sizeof *ctx);
  if (!ctx) return IPCREF_ENOMEM;
  if (opt) ctx->opt = *opt;
  if (!ctx->opt.segment_size) ctx->opt.segment_size = (size_t)16 << 20;
  if (!ctx->opt.segment_cache) ctx->opt.segment_cache = ctx->opt.segment_size;
  if (!ctx->opt.ledger_slots) ctx->opt.ledger_slots = 4096;
  if (ctx->opt.segment_size < 4096 || (ctx->opt.segment_size & 4095) ||
      ctx->opt.ledger_slots < 8 || ctx->opt.ledger_slots > (1u << 24) ||
      (ctx->opt.ledger_slots & 1)) {
    IPCREF_FREE(ctx);
    return IPCREF_EINVAL;
  }
  if (ctx->opt.allow_uids_count) {
    if (!ctx->opt.allow_uids || ctx->opt.allow_uids_count > 65536) {
      IPCREF_FREE(ctx);
      return IPCREF_EINVAL;
    }
    ctx->uids =
        (uint32_t *)IPCREF_MALLOC(ctx->opt.allow_uids_count * sizeof(uint32_t));
    if (!ctx->uids) {
      IPCREF_FREE(ctx);
      return IPCREF_ENOMEM;
    }
    memcpy(ctx->uids, ctx->opt.allow_uids,
           ctx->opt.allow_uids_count * sizeof(uint32_t));
  }
  ctx->opt.allow_uids = ctx->uids; /* ours, not the caller's */
  ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (ctx->epfd < 0 || pthread_mutex_init(&ctx->lock, NULL) != 0) {
    if (ctx->epfd >= 0) close(ctx->epfd);
    IPCREF_FREE(ctx->uids);
    IPCREF_FREE(ctx);
    return errno == ENOMEM ? IPCREF_ENOMEM : IPCREF_ESYS;
  }
  ctx->pid = (int)getpid();
  ctx->uid = (int)getuid();
  ctx->host.dev = 0; /* host memory: no backend */
  ctx->refs = 1;
  /* Identifies this ctx across processes (pids get reused). */
  clock_gettime(CLOCK_REALTIME, &ts);
  ctx->nonce = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
               ((uint64_t)ctx->pid << 40) ^ (uint64_t)(uintptr_t)ctx;
  *out = ctx;
  return IPCREF_OK;
}

/* Lets go of a mapping (not in the cache, or just taken out of it). */
IPCREF_PRIVATE void ipcref__map_drop(ipcref__map *m) {
  if (m->kind == 3) {
    if (m->be) m->be->seg_close(m->be, m->dev_id, m->daddr);
  } else {
    munmap(m->base, m->size);
    close(m->fd);
  }
  IPCREF_FREE(m->imported);
  IPCREF_FREE(m);
}

IPCREF_PRIVATE void ipcref__map_unmap(ipcref_ctx *ctx, ipcref__map *m) {
  IPCREF__LIST_REMOVE(ctx->maps, m, next, prev);
  if (m->kind == 2)
    ctx->st.counter_files--;
  else
    ctx->st.mapped_segments--;
  ipcref__map_drop(m);
}

/* Unmaps what its origin retired and nobody here uses (under the lock),
 * once that adds up to `min_bytes`. Unmapping the last mapping of a
 * segment frees its pages, which takes time in proportion to its size: a
 * receive only does it past a large threshold, ipcref_collect always. */
IPCREF_PRIVATE void ipcref__maps_trim(ipcref_ctx *ctx, size_t min_bytes) {
  ipcref__map *m, *next;
  size_t idle = 0, count = 0;
  for (m = ctx->maps; m; m = m->next)
    if (m->retired && __atomic_load_n(&m->refs, __ATOMIC_ACQUIRE) == 0)
      idle += m->size, count++;
  /* Many small ones cost lookups: trim past 64 of them too. */
  if (count == 0 || (idle < min_bytes && count < 64)) return;
  for (m = ctx->maps; m; m = next) {
    next = m->next;
    if (m->retired && __atomic_load_n(&m->refs, __ATOMIC_ACQUIRE) == 0)
      ipcref__map_unmap(ctx, m);
  }
}

/* The teardown, when the last reference to the context goes. */
IPCREF_PRIVATE void ipcref__ctx_destroy(ipcref_ctx *ctx) {
  ipcref__block *b;
  ipcref__pool *pool;
  IPCREF__LOCK(ctx);
  ipcref__sweep(ctx);
  /* Device memory a consumer may still have open is never freed (that is
   * undefined behaviour for the driver) nor handed back to a wrap's owner:
   * it goes back to the driver when the process exits. */
  for (b = ctx->limbo; b; b = b->limbo_next)
    if (b->seg->pool->be) {
      b->seg->leaked = 1;
      b->release = NULL;
    }
  while (ctx->limbo) {
    b = ctx->limbo;
    ipcref__limbo_remove(ctx, b);
    if (b->seg->cls == IPCREF__FOREIGN) ipcref__block_free(ctx, b);
  }
  while (ctx->ledgers) ipcref__ledger_destroy(ctx, ctx->ledgers);
  while (ctx->segments) ipcref__segment_destroy(ctx, ctx->segments);
  while (ctx->maps) ipcref__map_unmap(ctx, ctx->maps);
  IPCREF__UNLOCK(ctx);
  while ((pool = ctx->pools) != NULL) {
    ctx->pools = pool->next;
    IPCREF_FREE(pool);
  }
  pthread_mutex_destroy(&ctx->lock);
  close(ctx->epfd);
  IPCREF_FREE(ctx->uids);
  IPCREF_FREE(ctx);
}

/* Drops one reference to the context (release ordering, then acquire
 * before the teardown, as for buffers). */
IPCREF_PRIVATE void ipcref__ctx_unref(ipcref_ctx *ctx) {
  if (__atomic_fetch_sub(&ctx->refs, 1, __ATOMIC_RELEASE) != 1) return;
  IPCREF__ACQUIRE_FENCE(&ctx->refs);
  ipcref__ctx_destroy(ctx);
}

IPCREF_PRIVATE void ipcref__deferred_poll(ipcref_ctx *ctx);

IPCREF_API void ipcref_ctx_free(ipcref_ctx *ctx) {
  int pending;
  if (!ctx) return;
  /* Device releases still waiting for their stream: wait for them now,
   * since nothing will poll this context any more. */
  __atomic_store_n(&ctx->owner_gone, 1, __ATOMIC_RELEASE);
  for (;;) {
    IPCREF__LOCK(ctx);
    if (ctx->deferred) ipcref__deferred_poll(ctx);
    pending = ctx->deferred != NULL;
    IPCREF__UNLOCK(ctx);
    if (!pending) break;
    usleep(100);
  }
  while (ctx->peers) ipcref_peer_free(ctx->peers);
  ipcref__ctx_unref(ctx);
}

/* 1 when the process has exited: its pidfd is readable or, without one,
 * its pid no longer exists. */
IPCREF_PRIVATE int ipcref__process_gone(int pidfd, int pid) {
  struct pollfd pfd;
  if (pidfd < 0) return pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
  pfd.fd = pidfd;
  pfd.events = POLLIN;
  pfd.revents = 0;
  return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP)) != 0;
}

/* When the peer `p` is freed and its process is dead (under the lock): a
 * dead producer never reuses nor destroys its segments, so their mappings
 * here are retired, to go once nothing uses them; else its memory would
 * live as long as this context. (Not before the peer is freed: messages
 * it sent may still be queued.) 1 if it did. */
IPCREF_PRIVATE int ipcref__retire_origin(ipcref_ctx *ctx, ipcref_peer *p) {
  ipcref__map *m;
  if (p->origin_retired || !p->watch) return 0;
  if (!p->watch->dead && ipcref__process_gone(p->watch->pidfd, p->pid))
    ipcref__watch_dead(ctx, p->watch);
  if (!p->watch->dead) return 0;
  p->origin_retired = 1;
  for (m = ctx->maps; m; m = m->next)
    if (m->origin_nonce == p->nonce) m->retired = 1;
  return 1;
}

/* Reclaims what dead processes held (under the lock): every lease a dead
 * consumer held itself, and each forwarded lease whose own holder is gone.
 * A forwarded hold whose holder lives stays, whatever became of the
 * middleman. Then the sweep frees the blocks only they kept, and the
 * ledgers nobody can use any more. Returns the bytes freed. */
IPCREF_PRIVATE size_t ipcref__reap(ipcref_ctx *ctx) {
  ipcref__ledger *l;
  size_t freed = 0;
  int deaths = ctx->reaped != ctx->st.peer_deaths;
  ctx->reaped = ctx->st.peer_deaths;
  /* Every ring first, before any lease of the dead goes. A dead forwarder
   * wrote its links into the ring of the ledger it received through, not
   * into its own: its holders' leases must be known before its own lease,
   * their parent, ends. A hole left before this death may be the dead
   * one's: it is not waited for (its forwards are adopted instead). */
  for (l = ctx->ledgers; l; l = l->next) {
    if (deaths)
      l->death_head = __atomic_load_n(
          &((ipcref__ledger_hdr *)(void *)l->base)->head, __ATOMIC_ACQUIRE);
    freed += ipcref__ledger_drain(ctx, l);
  }
  for (l = ctx->ledgers; l; l = l->next) {
    uint32_t s;
    if (l->live == 0) continue;
    if (!l->holder_dead && l->holder > 0 &&
        (l->watch ? l->watch->dead : ipcref__pid_gone(l->holder))) {
      for (s = 0; s < l->n / 2; s++) ipcref__lease_reclaim(ctx, l, s, &freed);
      l->holder_dead = 1;
    }
    for (s = l->n / 2; s < l->n && l->live; s++) {
      ipcref__lease *ls = &l->leases[s];
      if (ls->block &&
          (ls->watch ? ls->watch->dead : ipcref__pid_gone(ls->holder)))
        ipcref__lease_reclaim(ctx, l, s, &freed);
    }
  }
  return freed + ipcref__sweep(ctx);
}

/* Notices deaths and reclaims what the dead held (under the lock). Every
 * call on the context pumps this, at most once per clock tick (`force`:
 * now), so that a process that never polls still gets its memory back. */
/* Device releases whose fence is done move to ctx->finished, returned
 * after the unlock (under the lock). */
IPCREF_PRIVATE void ipcref__deferred_poll(ipcref_ctx *ctx) {
  struct ipcref__import **pp = &ctx->deferred;
  while (*pp) {
    struct ipcref__import *imp = *pp;
    if (!imp->seg->be->fence_done(imp->seg->be, imp->fence)) {
      pp = &imp->next;
      continue;
    }
    *pp = imp->next;
    ctx->st.deferred--;
    imp->next = ctx->finished;
    ctx->finished = imp;
  }
}

IPCREF_PRIVATE size_t ipcref__pump(ipcref_ctx *ctx, int force) {
  if (ctx->deferred) ipcref__deferred_poll(ctx);
  if (!ctx->watches) return 0;
  if (!force) {
    long tick = ipcref__now_ms();
    if (tick == ctx->pump_tick) return 0;
    ctx->pump_tick = tick;
  }
  (void)ipcref__watch_events(ctx);
  return ctx->st.peer_deaths != ctx->reaped ? ipcref__reap(ctx) : 0;
}

IPCREF_API size_t ipcref_collect(ipcref_ctx *ctx) {
  size_t freed;
  if (!ctx) return 0;
  IPCREF__LOCK(ctx);
  if (ctx->deferred) ipcref__deferred_poll(ctx); /* returned at the unlock */
  freed = ipcref__sweep(ctx);
  ipcref__watch_refresh(ctx);
  freed += ipcref__reap(ctx);
  ipcref__maps_trim(ctx, 0); /* a consumer's retired mappings */
  IPCREF__UNLOCK(ctx);
  return freed;
}

IPCREF_API int ipcref_ctx_poll_fd(ipcref_ctx *ctx) {
  return ctx ? ctx->epfd : -1;
}

IPCREF_API ipcref_result ipcref_ctx_poll(ipcref_ctx *ctx, int timeout_ms,
                                         size_t *freed) {
  struct pollfd pfd;
  int reaped;
  size_t bytes;
  if (freed) *freed = 0;
  if (!ctx) return IPCREF_EINVAL;
  pfd.fd = ctx->epfd;
  pfd.events = POLLIN;
  pfd.revents = 0;
  /* The wait is outside the lock; what woke it is read under it. */
  while (timeout_ms != 0 && poll(&pfd, 1, timeout_ms) < 0)
    if (errno != EINTR) return IPCREF_ESYS;
  IPCREF__LOCK(ctx);
  ipcref__watch_refresh(ctx);
  reaped = ctx->st.peer_deaths != ctx->reaped;
  bytes = reaped ? ipcref__reap(ctx) : 0;
  IPCREF__UNLOCK(ctx);
  if (freed) *freed = bytes;
  return reaped ? IPCREF_OK : IPCREF_ETIMEDOUT;
}

IPCREF_API ipcref_result ipcref_ctx_stats(ipcref_ctx *ctx, ipcref_stats *out) {
  if (!ctx || !out) return IPCREF_EINVAL;
  IPCREF__LOCK(ctx);
  ipcref__sweep(ctx);         /* count what came back as back */
  (void)ipcref__pump(ctx, 1); /* and what the dead held as free */
  *out = ctx->st;
  out->refused = __atomic_load_n(&ctx->refused, __ATOMIC_RELAXED);
  out->imported_bufs =
      (size_t)__atomic_load_n(&ctx->imported_bufs, __ATOMIC_ACQUIRE);
  IPCREF__UNLOCK(ctx);
  return IPCREF_OK;
}

/* ---- shared buffers ---------------------------------------------------- */

/* The release callback of a local shared buffer: the producer's own last
 * reference went. The block goes back, or to the limbo while leased; and
 * since leases may have come back meanwhile, the ledgers are swept. */
IPCREF_PRIVATE void ipcref__block_release(void *user, void *data) {
  ipcref__block *b = (ipcref__block *)user;
  ipcref_ctx *ctx = b->seg->ctx;
  (void)data;
  IPCREF__LOCK(ctx);
  ctx->st.live_bufs--;
  ctx->st.live_bytes -= b->size;
  ipcref__sweep(ctx);
  (void)ipcref__pump(ctx, 0);
  b->local = 0;
  if (b->leases == 0) {
    ipcref__block_free(ctx, b);
  } else {
    b->in_limbo = 1;
    IPCREF__LIST_PUSH(ctx->limbo, b, limbo_next, limbo_prev);
    ctx->st.limbo_blocks++;
    ctx->st.limbo_bytes += b->size;
  }
  IPCREF__UNLOCK(ctx);
  ipcref__ctx_unref(ctx); /* the buffer's reference */
}

IPCREF_PRIVATE void ipcref__import_release(void *user, void *data);
IPCREF_PRIVATE void ipcref__alias_release(void *user, void *data);

IPCREF_API int ipcref_buf_is_shared(const ipcref_buf *b) {
  return b && (b->release == ipcref__block_release ||
               b->release == ipcref__import_release ||
               b->release == ipcref__alias_release);
}

/* The release callback of an alias's own buffer. */
IPCREF_PRIVATE void ipcref__alias_release(void *user, void *data) {
  ipcref__alias *a = (ipcref__alias *)user;
  ipcref_ctx *ctx = a->block->seg->ctx;
  (void)data;
  IPCREF__LOCK(ctx);
  ipcref__alias_drop(ctx, a);
  IPCREF__UNLOCK(ctx);
}

/* The block behind a shared buffer made here (itself or an alias), or
 * NULL. */
IPCREF_PRIVATE ipcref__block *ipcref__local_block(const ipcref_buf *b) {
  if (!b) return NULL;
  if (b->release == ipcref__block_release)
    return (ipcref__block *)b->release_user;
  if (b->release == ipcref__alias_release)
    return ((ipcref__alias *)b->release_user)->block;
  return NULL;
}

/* An alias of `src` (see ipcref__alias) into *out, read-only when `src`
 * is: 1 when made, 0 when `src` is not a shared buffer made here, -1 when
 * out of memory. */
IPCREF_PRIVATE int ipcref__shared_alias(ipcref_buf *src, void (*fn)(void *),
                                        void *user, ipcref_buf **out) {
  ipcref__block *blk = ipcref__local_block(src);
  ipcref__alias *a;
  if (!blk) return 0;
  a = (ipcref__alias *)IPCREF_MALLOC(sizeof *a);
  if (!a) return -1;
  a->block = blk;
  a->src = src;
  a->holds = 1; /* its own buffer */
  a->fn = fn;
  a->user = user;
  a->next = NULL;
  if (ipcref_buf_wrap_device(src->data, src->size, ipcref_buf_device(src),
                             ipcref__alias_release, a, out) != IPCREF_OK) {
    IPCREF_FREE(a);
    return -1;
  }
  ipcref_buf_retain(src);
  return 1;
}

IPCREF_PRIVATE void ipcref__block_release(void *user, void *data);

/* The buffer of a new block (its first local reference); on error the
 * block goes back (a wrap without calling its owner's release). */
IPCREF_PRIVATE ipcref_result ipcref__block_buf(ipcref__block *b, size_t size,
                                               ipcref_buf **out) {
  ipcref__pool *pool = b->seg->pool;
  ipcref_result r;
  if (pool->be) {
    ipcref_device dev;
    dev.type = pool->be->device_type;
    dev.id = pool->dev;
    r = ipcref_buf_wrap_device((void *)(uintptr_t)(b->seg->daddr + b->offset),
                               size, dev, ipcref__block_release, b, out);
  } else {
    r = ipcref_buf_wrap(b->seg->base + b->offset, size, ipcref__block_release,
                        b, out);
  }
  if (r != IPCREF_OK) {
    b->release = NULL;
    ipcref__block_release(b, NULL);
  }
  return r;
}

/* Counts a new block as live (under the lock). */
IPCREF_PRIVATE void ipcref__block_live(ipcref_ctx *ctx, ipcref__block *b) {
  ctx->st.live_bufs++;
  ctx->st.live_bytes += b->size;
  __atomic_fetch_add(&ctx->refs, 1, __ATOMIC_RELAXED);
}

IPCREF_PRIVATE ipcref_result ipcref__shared_new(ipcref_ctx *ctx,
                                                ipcref__pool *pool, size_t size,
                                                int own, ipcref_buf **out) {
  ipcref__block *b;
  ipcref_result r;
  if (size > (size_t)PTRDIFF_MAX / 2) return IPCREF_ERANGE;
  IPCREF__LOCK(ctx);
  (void)ipcref__pump(ctx, 0);
  r = ipcref__block_alloc(ctx, pool, size, own, &b);
  if (r == IPCREF_ENOMEM) { /* the limbo, or the dead, may hold it */
    ipcref__sweep(ctx);
    (void)ipcref__pump(ctx, 1);
    r = ipcref__block_alloc(ctx, pool, size, own, &b);
  }
  if (r == IPCREF_OK) {
    IPCREF__STEP("allocate");
    ipcref__block_live(ctx, b);
  }
  IPCREF__UNLOCK(ctx);
  if (r != IPCREF_OK) return r;
  return ipcref__block_buf(b, size, out);
}

IPCREF_API ipcref_result ipcref_shared_new(ipcref_ctx *ctx, size_t size,
                                           ipcref_buf **out) {
  if (!ctx || !out) return IPCREF_EINVAL;
  return ipcref__shared_new(ctx, &ctx->host, size, ctx->opt.isolate, out);
}

IPCREF_API ipcref_result ipcref_shared_new_isolated(ipcref_ctx *ctx,
                                                    size_t size,
                                                    ipcref_buf **out) {
  if (!ctx || !out) return IPCREF_EINVAL;
  return ipcref__shared_new(ctx, &ctx->host, size, 1, out);
}

/* ---- device memory ----------------------------------------------------- */

IPCREF_PRIVATE ipcref_backend *ipcref__backend(ipcref_ctx *ctx, int32_t type) {
  int i;
  for (i = 0; i < 8; i++)
    if (ctx->backends[i] && ctx->backends[i]->device_type == type)
      return ctx->backends[i];
  return NULL;
}

IPCREF_API ipcref_result ipcref_ctx_add_backend(ipcref_ctx *ctx,
                                                ipcref_backend *be) {
  int i;
  ipcref_result r = IPCREF_EINVAL;
  if (!ctx || !be || be->device_type <= IPCREF_DEVICE_CPU || !be->seg_alloc ||
      !be->seg_free || !be->seg_range || !be->seg_export || !be->seg_import ||
      !be->seg_close || !be->event_record || !be->event_free ||
      !be->event_wait || !be->fence || !be->fence_done)
    return IPCREF_EINVAL;
  IPCREF__LOCK(ctx);
  if (!ipcref__backend(ctx, be->device_type))
    for (i = 0; i < 8; i++)
      if (!ctx->backends[i]) {
        ctx->backends[i] = be;
        r = IPCREF_OK;
        break;
      }
  IPCREF__UNLOCK(ctx);
  return r;
}

/* The pool of device `dev` (under the lock); NULL with *r set. */
IPCREF_PRIVATE ipcref__pool *ipcref__pool_of(ipcref_ctx *ctx, ipcref_device dev,
                                             ipcref_result *r) {
  ipcref_backend *be = ipcref__backend(ctx, dev.type);
  ipcref__pool *pool;
  if (!be) {
    *r = IPCREF_ENODEV;
    return NULL;
  }
  for (pool = ctx->pools; pool; pool = pool->next)
    if (pool->be == be && pool->dev == dev.id) return pool;
  pool = (ipcref__pool *)ipcref__zalloc(sizeof *pool);
  if (!pool) {
    *r = IPCREF_ENOMEM;
    return NULL;
  }
  pool->be = be;
  pool->dev = dev.id;
  pool->next = ctx->pools;
  ctx->pools = pool;
  return pool;
}

IPCREF_API ipcref_result ipcref_device_new(ipcref_ctx *ctx, ipcref_device dev,
                                           size_t size, ipcref_buf **out) {
  ipcref__pool *pool;
  ipcref_result r = IPCREF_OK;
  if (!ctx || !out || dev.type <= IPCREF_DEVICE_CPU || dev.id < 0)
    return IPCREF_EINVAL;
  IPCREF__LOCK(ctx);
  pool = ipcref__pool_of(ctx, dev, &r);
  IPCREF__UNLOCK(ctx);
  if (!pool) return r;
  return ipcref__shared_new(ctx, pool, size, ctx->opt.isolate, out);
}

IPCREF_API ipcref_result ipcref_device_wrap(
    ipcref_ctx *ctx, ipcref_device dev, void *ptr, size_t size,
    void (*release)(void *user, void *ptr), void *user, ipcref_buf **out) {
  ipcref__pool *pool;
  ipcref__segment *s;
  ipcref__block *b;
  ipcref_result r = IPCREF_OK;
  uint64_t addr = (uint64_t)(uintptr_t)ptr, base, end;
  size_t alloc_size;
  if (!ctx || !out || !ptr || dev.type <= IPCREF_DEVICE_CPU || dev.id < 0)
    return IPCREF_EINVAL;
  IPCREF__LOCK(ctx);
  pool = ipcref__pool_of(ctx, dev, &r);
  IPCREF__UNLOCK(ctx);
  if (!pool) return r;
  /* The allocation that holds it (a driver call: not under the lock). */
  r = pool->be->seg_range(pool->be, dev.id, addr, &base, &alloc_size);
  if (r != IPCREF_OK) return r;
  if (addr < base || __builtin_add_overflow(addr, (uint64_t)size, &end) ||
      end > base + alloc_size)
    return IPCREF_EINVAL;
  b = (ipcref__block *)ipcref__zalloc(sizeof *b);
  if (!b) return IPCREF_ENOMEM;
  IPCREF__LOCK(ctx);
  for (s = ctx->segments; s; s = s->next) /* the allocation's segment */
    if (s->pool == pool && s->cls == IPCREF__FOREIGN && s->daddr == base &&
        s->size == alloc_size)
      break;
  if (!s)
    r = ipcref__segment_new(ctx, pool, alloc_size, 0, IPCREF__FOREIGN, base,
                            &s);
  if (r == IPCREF_OK) {
    s->nwraps++;
    b->seg = s;
    b->offset = (size_t)(addr - base);
    b->size = size;
    b->local = 1;
    b->release = release;
    b->user = user;
    b->ptr = ptr;
    ipcref__block_live(ctx, b);
  }
  IPCREF__UNLOCK(ctx);
  if (r != IPCREF_OK) {
    IPCREF_FREE(b);
    return r;
  }
  return ipcref__block_buf(b, size, out);
}

IPCREF_API ipcref_result ipcref_view_new_shared(ipcref_ctx *ctx,
                                                ipcref_dtype dt, int ndim,
                                                const int64_t *shape,
                                                ipcref_view *out) {
  ipcref_buf *b;
  ipcref_result r;
  int64_t n;
  if (!ctx || !out || (unsigned)dt >= IPCREF_DTYPE_COUNT) return IPCREF_EINVAL;
  r = ipcref__shape_numel(ndim, shape, ipcref__dtype_sizes[dt], &n);
  if (r != IPCREF_OK) return r;
  r = ipcref_shared_new(ctx, (size_t)n * ipcref__dtype_sizes[dt], &b);
  if (r != IPCREF_OK) return r;
  r = ipcref_view_of(b, dt, ndim, shape, out);
  ipcref_buf_release(b); /* the view holds it now (or nothing does) */
  return r;
}

/* ---- the wire format ----------------------------------------------------
 * Little endian, field by field (no struct copies, no padding):
 *
 *   u32 magic "IPCM"  u16 version  u16 nviews  u16 nrecs  u16 nretired
 *   u32 sender pid    u64 sender nonce
 *   nrecs x     { u8 kind (1 segment, 2 ledger, 3 device segment)
 *                 u8 writable  u32 origin pid  u64 origin nonce  u64 id
 *                 u64 size
 *                 kind 3: u32 device type  u32 device id  64 B handle }
 *               (kinds 1 and 2 each come with one fd, in this order)
 *   nretired x  { u64 id }          (sender's segments it has destroyed)
 *   nviews x    { u32 origin pid  u64 origin nonce  u64 segment id
 *                 u64 segment size  u64 block offset  u64 block size
 *                 u64 ledger id  u32 slot  u32 generation
 *                 u8 dtype  u8 ndim  u8 writable  u8 flags  i64 byte offset
 *                 ndim x i64 shape  ndim x i64 strides
 *                 flags bit 0: 64 B event handle }
 *
 * Caches key on (origin nonce, id), never on bytes of a handle. */
#define IPCREF__MSG_MAGIC   0x4d435049u /* "IPCM" */
#define IPCREF__MSG_VERSION 1u
#define IPCREF__MSG_VIEWS   IPCREF_MSG_MAX_VIEWS
#define IPCREF__MSG_RETIRED 64          /* announced per message at most */

typedef struct ipcref__wire {
  unsigned char *p;
  size_t len, pos;
  int bad; /* overflowed or short */
} ipcref__wire;

IPCREF_PRIVATE void ipcref__put(ipcref__wire *w, uint64_t v, int bytes) {
  int i;
  if (w->pos + (size_t)bytes > w->len) {
    w->bad = 1;
    return;
  }
  for (i = 0; i < bytes; i++) w->p[w->pos++] = (unsigned char)(v >> (8 * i));
}

IPCREF_PRIVATE uint64_t ipcref__get(ipcref__wire *w, int bytes) {
  uint64_t v = 0;
  int i;
  if (w->pos + (size_t)bytes > w->len) {
    w->bad = 1;
    return 0;
  }
  for (i = 0; i < bytes; i++) v |= (uint64_t)w->p[w->pos++] << (8 * i);
  return v;
}

typedef struct ipcref__view_rec {
  uint32_t origin_pid;
  uint64_t origin_nonce, seg_id, seg_size, block_offset, block_size;
  uint64_t ledger_id;
  uint32_t slot, gen;
  ipcref_view view; /* buf NULL; the geometry relative to the block */
  int writable;
  int has_event; /* device views: the producer's event follows */
  unsigned char event[IPCREF_HANDLE_BYTES];
} ipcref__view_rec;

/* What a message carries for a segment or a ledger: kind 1 (a memfd
 * segment) and 2 (a ledger) come with an fd, in order; kind 3 (a device
 * segment) with its device and IPC handle instead. */
typedef struct ipcref__fd_rec {
  int kind, writable;
  uint32_t origin_pid;
  uint64_t origin_nonce, id, size;
  int32_t dev_type, dev_id; /* kind 3 */
  unsigned char handle[IPCREF_HANDLE_BYTES];
} ipcref__fd_rec;

/* Writes / reads a segment or ledger record. */
IPCREF_PRIVATE void ipcref__put_bytes(ipcref__wire *w, const unsigned char *b,
                                      size_t n) {
  if (w->pos + n > w->len) {
    w->bad = 1;
    return;
  }
  memcpy(w->p + w->pos, b, n);
  w->pos += n;
}

IPCREF_PRIVATE void ipcref__get_bytes(ipcref__wire *w, unsigned char *b,
                                      size_t n) {
  if (w->pos + n > w->len) {
    w->bad = 1;
    memset(b, 0, n);
    return;
  }
  memcpy(b, w->p + w->pos, n);
  w->pos += n;
}

IPCREF_PRIVATE void ipcref__put_fd_rec(ipcref__wire *w,
                                       const ipcref__fd_rec *f) {
  ipcref__put(w, (uint64_t)f->kind, 1);
  ipcref__put(w, (uint64_t)f->writable, 1);
  ipcref__put(w, f->origin_pid, 4);
  ipcref__put(w, f->origin_nonce, 8);
  ipcref__put(w, f->id, 8);
  ipcref__put(w, f->size, 8);
  if (f->kind != 3) return;
  ipcref__put(w, (uint64_t)(uint32_t)f->dev_type, 4);
  ipcref__put(w, (uint64_t)(uint32_t)f->dev_id, 4);
  ipcref__put_bytes(w, f->handle, IPCREF_HANDLE_BYTES);
}

/* 0 when malformed. */
IPCREF_PRIVATE int ipcref__get_fd_rec(ipcref__wire *w, ipcref__fd_rec *f) {
  memset(f, 0, sizeof *f);
  f->kind = (int)ipcref__get(w, 1);
  f->writable = (int)ipcref__get(w, 1);
  f->origin_pid = (uint32_t)ipcref__get(w, 4);
  f->origin_nonce = ipcref__get(w, 8);
  f->id = ipcref__get(w, 8);
  f->size = ipcref__get(w, 8);
  if (f->kind == 3) {
    f->dev_type = (int32_t)(uint32_t)ipcref__get(w, 4);
    f->dev_id = (int32_t)(uint32_t)ipcref__get(w, 4);
    ipcref__get_bytes(w, f->handle, IPCREF_HANDLE_BYTES);
    if (f->dev_type <= IPCREF_DEVICE_CPU || f->dev_id < 0) return 0;
  }
  return !w->bad && f->kind >= 1 && f->kind <= 3;
}

IPCREF_PRIVATE void ipcref__put_view(ipcref__wire *w,
                                     const ipcref__view_rec *r) {
  int d;
  ipcref__put(w, r->origin_pid, 4);
  ipcref__put(w, r->origin_nonce, 8);
  ipcref__put(w, r->seg_id, 8);
  ipcref__put(w, r->seg_size, 8);
  ipcref__put(w, r->block_offset, 8);
  ipcref__put(w, r->block_size, 8);
  ipcref__put(w, r->ledger_id, 8);
  ipcref__put(w, r->slot, 4);
  ipcref__put(w, r->gen, 4);
  ipcref__put(w, (uint64_t)r->view.dtype, 1);
  ipcref__put(w, (uint64_t)r->view.ndim, 1);
  ipcref__put(w, (uint64_t)r->writable, 1);
  ipcref__put(w, (uint64_t)(r->has_event ? 1 : 0), 1); /* flags */
  ipcref__put(w, (uint64_t)r->view.byte_offset, 8);
  for (d = 0; d < r->view.ndim; d++)
    ipcref__put(w, (uint64_t)r->view.shape[d], 8);
  for (d = 0; d < r->view.ndim; d++)
    ipcref__put(w, (uint64_t)r->view.strides[d], 8);
  if (r->has_event) ipcref__put_bytes(w, r->event, IPCREF_HANDLE_BYTES);
}

/* Reads a view record; 0 when it is malformed. */
IPCREF_PRIVATE int ipcref__get_view(ipcref__wire *w, ipcref__view_rec *r) {
  uint64_t dt, nd, flags;
  int d;
  memset(r, 0, sizeof *r);
  r->origin_pid = (uint32_t)ipcref__get(w, 4);
  r->origin_nonce = ipcref__get(w, 8);
  r->seg_id = ipcref__get(w, 8);
  r->seg_size = ipcref__get(w, 8);
  r->block_offset = ipcref__get(w, 8);
  r->block_size = ipcref__get(w, 8);
  r->ledger_id = ipcref__get(w, 8);
  r->slot = (uint32_t)ipcref__get(w, 4);
  r->gen = (uint32_t)ipcref__get(w, 4);
  dt = ipcref__get(w, 1);
  nd = ipcref__get(w, 1);
  r->writable = (int)ipcref__get(w, 1);
  flags = ipcref__get(w, 1);
  if (w->bad || dt >= IPCREF_DTYPE_COUNT || nd > IPCREF_MAX_DIMS || flags > 1)
    return 0;
  r->view.dtype = (ipcref_dtype)dt;
  r->view.ndim = (int)nd;
  r->view.byte_offset = (int64_t)ipcref__get(w, 8);
  for (d = 0; d < (int)nd; d++) r->view.shape[d] = (int64_t)ipcref__get(w, 8);
  for (d = 0; d < (int)nd; d++) r->view.strides[d] = (int64_t)ipcref__get(w, 8);
  r->has_event = (int)flags;
  if (flags) ipcref__get_bytes(w, r->event, IPCREF_HANDLE_BYTES);
  return !w->bad;
}

/* ---- peers ------------------------------------------------------------- */

/* Waits until fd is readable: timeout_ms -1 means no wait at all here (the
 * blocking read that follows waits), 0 polls. */
IPCREF_PRIVATE ipcref_result ipcref__wait_readable(int fd, int timeout_ms) {
  struct pollfd pfd;
  pfd.fd = fd;
  pfd.events = POLLIN;
  pfd.revents = 0;
  for (; timeout_ms >= 0;) {
    int pr = poll(&pfd, 1, timeout_ms);
    if (pr > 0) break;
    if (pr == 0) return IPCREF_ETIMEDOUT;
    if (errno != EINTR) return IPCREF_ESYS;
  }
  return IPCREF_OK;
}

/* Appends the fds an SCM_RIGHTS header carries to fds[*n] (up to max);
 * closes the ones past max, so that no received fd ever leaks. */
IPCREF_PRIVATE void ipcref__take_fds(const struct cmsghdr *c, int *fds, int *n,
                                     int max) {
  int cnt = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int)), j, fd;
  for (j = 0; j < cnt; j++) {
    memcpy(&fd, CMSG_DATA(c) + (size_t)j * sizeof(int), sizeof fd);
    if (*n < max)
      fds[(*n)++] = fd;
    else
      close(fd);
  }
}

/* recvmsg, retried on EINTR and once on ECONNRESET: a peer that closed its
 * end with our data unread resets the connection, but what it sent before
 * is still queued here, and the retry reads it. */
IPCREF_PRIVATE ssize_t ipcref__recvmsg(int fd, struct msghdr *mh, int stream) {
  int resets = 0;
  ssize_t k;
  for (;;) {
    k = recvmsg(fd, mh, MSG_CMSG_CLOEXEC | (stream ? MSG_WAITALL : 0));
    if (k >= 0 || (errno != EINTR && (errno != ECONNRESET || resets++)))
      return k;
  }
}

/* ---- the hello ----------------------------------------------------------
 * The first message each side sends: "IPCH", version, pid, ctx nonce,
 * with SCM_CREDENTIALS (the kernel refuses a pid or uid that is not the
 * sender's). On a stream it is framed like every message (a 4-byte length
 * first). */
#define IPCREF__HELLO_MAGIC 0x48435049u /* "IPCH" */
#define IPCREF__HELLO_BYTES 20

IPCREF_PRIVATE ipcref_result ipcref__hello_send(ipcref_peer *p) {
  union {
    char buf[CMSG_SPACE(sizeof(struct ucred))];
    struct cmsghdr align;
  } u;
  unsigned char b[4 + IPCREF__HELLO_BYTES];
  struct ucred cred;
  struct msghdr mh;
  struct iovec iov;
  struct cmsghdr *c;
  ipcref__wire w;
  int stream = p->sock_type == SOCK_STREAM;
  ssize_t k;
  w.p = b;
  w.len = sizeof b;
  w.pos = 0;
  w.bad = 0;
  if (stream) ipcref__put(&w, IPCREF__HELLO_BYTES, 4);
  ipcref__put(&w, IPCREF__HELLO_MAGIC, 4);
  ipcref__put(&w, IPCREF__MSG_VERSION, 4);
  ipcref__put(&w, (uint64_t)p->ctx->pid, 4);
  ipcref__put(&w, p->ctx->nonce, 8);
  cred.pid = getpid();
  cred.uid = getuid();
  cred.gid = getgid();
  memset(&u, 0, sizeof u);
  memset(&mh, 0, sizeof mh);
  iov.iov_base = b;
  iov.iov_len = w.pos;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = u.buf;
  mh.msg_controllen = sizeof u.buf;
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_CREDENTIALS;
  c->cmsg_len = CMSG_LEN(sizeof cred);
  memcpy(CMSG_DATA(c), &cred, sizeof cred);
  do k = sendmsg(p->fd, &mh, MSG_NOSIGNAL);
  while (k < 0 && errno == EINTR);
  if (k < 0)
    return errno == EPIPE || errno == ECONNRESET ? IPCREF_EPEER : IPCREF_ESYS;
  return k == (ssize_t)w.pos ? IPCREF_OK : IPCREF_ESYS;
}

/* 1 when a peer of `uid` may connect: our own uid, or one allowed. */
IPCREF_PRIVATE int ipcref__uid_allowed(const ipcref_ctx *ctx, uint32_t uid) {
  size_t i;
  if (uid == (uint32_t)ctx->uid) return 1;
  for (i = 0; i < ctx->opt.allow_uids_count; i++)
    if (ctx->uids[i] == uid) return 1;
  return 0;
}

/* A peer refused (its uid): counted and reported, and nothing goes to it
 * or comes from it. */
IPCREF_PRIVATE ipcref_result ipcref__peer_refuse(ipcref_peer *p) {
  ipcref_ctx *ctx = p->ctx;
  p->hello = -2;
  __atomic_fetch_add(&ctx->refused, 1, __ATOMIC_RELAXED);
  IPCREF__LOCK(ctx);
  ipcref__ctx_report(ctx, IPCREF_EPEER, "peer of a uid not allowed refused");
  IPCREF__UNLOCK(ctx);
  return IPCREF_EPEER;
}

IPCREF_PRIVATE ipcref_result ipcref__hello_result(const ipcref_peer *p) {
  if (p->hello > 0) return IPCREF_OK;
  return p->hello == -2 ? IPCREF_EPEER : IPCREF_EPROTO;
}

/* Reads the other side's hello (the first thing it sends), waiting up to
 * timeout_ms (-1: forever). */
IPCREF_PRIVATE ipcref_result ipcref__hello_read(ipcref_peer *p,
                                                int timeout_ms) {
  union {
    char buf[CMSG_SPACE(sizeof(struct ucred)) +
             CMSG_SPACE(sizeof(int) * IPCREF_MSG_MAX_FDS)];
    struct cmsghdr align;
  } u;
  unsigned char b[4 + IPCREF__HELLO_BYTES];
  struct msghdr mh;
  struct iovec iov;
  struct cmsghdr *c;
  ipcref__wire w;
  int stream = p->sock_type == SOCK_STREAM, got_cred = 0;
  size_t want = IPCREF__HELLO_BYTES + (stream ? 4u : 0u);
  ssize_t k;
  ipcref_result r;
  if (p->hello) return ipcref__hello_result(p);
  r = ipcref__wait_readable(p->fd, timeout_ms);
  if (r != IPCREF_OK) return r;
  memset(&mh, 0, sizeof mh);
  iov.iov_base = b;
  iov.iov_len = want;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = u.buf;
  mh.msg_controllen = sizeof u.buf;
  k = ipcref__recvmsg(p->fd, &mh, stream);
  if (k == 0 || (k < 0 && errno == ECONNRESET)) return IPCREF_EPEER;
  if (k < 0) return IPCREF_ESYS;
  for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    if (c->cmsg_type == SCM_CREDENTIALS &&
        c->cmsg_len == CMSG_LEN(sizeof(struct ucred))) {
      struct ucred cred;
      memcpy(&cred, CMSG_DATA(c), sizeof cred);
      p->pid = (int)cred.pid;
      p->uid = (int)cred.uid;
      got_cred = 1;
    } else if (c->cmsg_type == SCM_RIGHTS) { /* not in a hello: drop */
      int none = 0;
      ipcref__take_fds(c, NULL, &none, 0);
    }
  }
  w.p = b;
  w.len = (size_t)k;
  w.pos = 0;
  w.bad = 0;
  if ((stream && ipcref__get(&w, 4) != IPCREF__HELLO_BYTES) ||
      ipcref__get(&w, 4) != IPCREF__HELLO_MAGIC ||
      ipcref__get(&w, 4) != IPCREF__MSG_VERSION || w.bad || (size_t)k != want ||
      !got_cred) {
    p->hello = -1;
    return IPCREF_EPROTO;
  }
  (void)ipcref__get(&w, 4); /* its pid: the credentials' is the one */
  p->nonce = ipcref__get(&w, 8);
  if (!ipcref__uid_allowed(p->ctx, (uint32_t)p->uid))
    return ipcref__peer_refuse(p);
  p->hello = 1;
  /* Watch the process itself (a pidfd: pids get reused). */
  IPCREF__LOCK(p->ctx);
  p->watch = ipcref__watch_get(p->ctx, p->pid);
  IPCREF__UNLOCK(p->ctx);
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_peer_new(ipcref_ctx *ctx, int sockfd,
                                         ipcref_peer **out) {
  ipcref_peer *p;
  struct ucred cred;
  socklen_t len = sizeof cred;
  int type = 0;
  socklen_t tlen = sizeof type;
  if (!ctx || !out || sockfd < 0) return IPCREF_EINVAL;
  if (getsockopt(sockfd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0)
    return errno == ENOTSOCK || errno == EBADF ? IPCREF_EINVAL : IPCREF_ESYS;
  if (type != SOCK_STREAM && type != SOCK_SEQPACKET) return IPCREF_EINVAL;
  if (getsockopt(sockfd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      cred.pid <= 0)
    return IPCREF_EINVAL; /* not a connected AF_UNIX socket */
  if (!ipcref__uid_allowed(ctx, (uint32_t)cred.uid)) {
    /* Who connected (or made the pair) is not allowed: say nothing. */
    __atomic_fetch_add(&ctx->refused, 1, __ATOMIC_RELAXED);
    return IPCREF_EPEER;
  }
  p = (ipcref_peer *)ipcref__zalloc(sizeof *p);
  if (!p) return IPCREF_ENOMEM;
  p->ctx = ctx;
  p->fd = sockfd;
  p->pid = (int)cred.pid;
  p->uid = (int)cred.uid;
  p->sock_type = type;
  {
    int on = 1;
    ipcref_result r = IPCREF_ESYS;
    if (setsockopt(sockfd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0 ||
        (r = ipcref__hello_send(p)) != IPCREF_OK) {
      IPCREF_FREE(p);
      return r;
    }
  }
  IPCREF__LOCK(ctx);
  IPCREF__LIST_PUSH(ctx->peers, p, next, prev);
  ctx->st.peers++;
  IPCREF__UNLOCK(ctx);
  *out = p;
  return IPCREF_OK;
}

IPCREF_API int ipcref_peer_pid(ipcref_peer *p) {
  if (!p) return 0;
  if (!p->hello) (void)ipcref__hello_read(p, 5000);
  return p->pid;
}

IPCREF_API int ipcref_peer_alive(ipcref_peer *p) {
  struct pollfd pfd;
  int alive;
  if (!p) return 0;
  if (!p->hello) (void)ipcref__hello_read(p, 0);
  if (p->hello > 0) {
    ipcref_ctx *ctx = p->ctx;
    ipcref__watch *w = p->watch;
    IPCREF__LOCK(ctx);
    if (!w)
      alive = !ipcref__pid_gone(p->pid);
    else if (!w->dead && ipcref__process_gone(w->pidfd, w->pid))
      ipcref__watch_dead(ctx, w);
    alive = w ? !w->dead : alive;
    IPCREF__UNLOCK(ctx);
    return alive;
  }
  /* Not identified (yet): alive while its end of the socket is open. */
  pfd.fd = p->fd;
  pfd.events = POLLRDHUP;
  pfd.revents = 0;
  return !(poll(&pfd, 1, 0) > 0 &&
           (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0);
}

IPCREF_API void ipcref_peer_free(ipcref_peer *p) {
  ipcref_ctx *ctx;
  ipcref__ledger *l;
  if (!p) return;
  ctx = p->ctx;
  /* Read what the other side sent and nobody will: the leases in it go
   * back at once, and closing a socket with unread data would reset the
   * connection, so the other side would lose what we sent it. */
  for (;;) {
    ipcref_view v;
    if (ipcref_recv(p, &v, 0) != IPCREF_OK) break;
    ipcref_view_release(&v);
  }
  IPCREF__LOCK(ctx);
  IPCREF__LIST_REMOVE(ctx->peers, p, next, prev);
  /* Its ledgers stay until every lease in them comes back, or their
   * holder dies (they watch it on their own). */
  for (l = ctx->ledgers; l; l = l->next)
    if (l->peer == p) l->peer = NULL;
  ctx->st.peers--;
  if (ipcref__retire_origin(ctx, p)) ipcref__maps_trim(ctx, 0);
  ipcref__watch_put(ctx, p->watch);
  ipcref__sweep(ctx);
  (void)ipcref__pump(ctx, 0);
  IPCREF__UNLOCK(ctx);
  close(p->fd);
  IPCREF_FREE(p->seen);
  IPCREF_FREE(p->retired);
  IPCREF_FREE(p);
}

/* 1 when the other side was sent (nonce, key) already; else records it. */
IPCREF_PRIVATE int ipcref__seen(ipcref_peer *p, uint64_t nonce, uint64_t key,
                                int *fail) {
  size_t i;
  for (i = 0; i < p->nseen; i++)
    if (p->seen[i].nonce == nonce && p->seen[i].key == key) return 1;
  if (!ipcref__grow((void **)&p->seen, &p->capseen, p->nseen + 1,
                    sizeof *p->seen)) {
    *fail = 1;
    return 0;
  }
  p->seen[p->nseen].nonce = nonce;
  p->seen[p->nseen].key = key;
  p->nseen++;
  return 0;
}

/* ---- export ------------------------------------------------------------ */

IPCREF_PRIVATE ipcref__map *ipcref__map_find(ipcref_ctx *ctx, int kind,
                                             uint64_t nonce, uint64_t id) {
  ipcref__map *m;
  for (m = ctx->maps; m; m = m->next)
    if ((m->kind == kind || (kind == 1 && m->kind == 3)) &&
        m->origin_nonce == nonce && m->id == id)
      return m;
  return NULL;
}

IPCREF_PRIVATE ipcref__ledger *ipcref__ledger_find(ipcref_ctx *ctx,
                                                   uint64_t id) {
  ipcref__ledger *l;
  for (l = ctx->ledgers; l; l = l->next)
    if (l->id == id) return l;
  return NULL;
}

/* Ends a lease that was exported but never imported (under the lock). */
IPCREF_PRIVATE void ipcref__lease_cancel(ipcref_ctx *ctx,
                                         const ipcref__view_rec *r) {
  if (r->origin_nonce == ctx->nonce) {
    ipcref__ledger *l = ipcref__ledger_find(ctx, r->ledger_id);
    size_t freed = 0;
    if (l) (void)ipcref__lease_free(ctx, l, r->slot, r->gen, &freed);
  } else { /* a forwarded lease: return it to its origin's ledger */
    ipcref__map *m = ipcref__map_find(ctx, 2, r->origin_nonce, r->ledger_id);
    uint64_t e = ipcref__ring_entry(IPCREF__RING_RELEASE, r->slot, r->gen);
    if (m && r->slot < m->nslots)
      ipcref__ring_push(m->base, m->nslots, &e, 1, NULL);
  }
}

/* The event recorded for a device view before the lock is taken: the
 * recording may wait (HIP 5 synchronizes the stream instead), and no other
 * thread of the context should wait with it. The lease takes the event;
 * what no lease took, the caller frees. */
typedef struct ipcref__view_event {
  ipcref_backend *be;
  void *event;
  unsigned char handle[IPCREF_HANDLE_BYTES];
} ipcref__view_event;

IPCREF_PRIVATE void ipcref__events_free(ipcref__view_event *ev, int n) {
  int i;
  for (i = 0; i < n; i++)
    if (ev[i].event) ev[i].be->event_free(ev[i].be, ev[i].event);
}

/* Records an event on `stream` for each device view made here (not under
 * the lock). */
IPCREF_PRIVATE ipcref_result ipcref__events_record(const ipcref_view *views,
                                                   int n, void *stream,
                                                   ipcref__view_event *ev) {
  int i;
  memset(ev, 0, (size_t)n * sizeof *ev);
  for (i = 0; i < n; i++) {
    ipcref__block *b;
    ipcref_result r;
    b = ipcref__local_block(views[i].buf);
    if (!b || !b->seg->pool->be) continue;
    ev[i].be = b->seg->pool->be;
    r = ev[i].be->event_record(ev[i].be, b->seg->pool->dev, stream,
                               ev[i].handle, &ev[i].event);
    if (r != IPCREF_OK) {
      ipcref__events_free(ev, i);
      return r;
    }
  }
  return IPCREF_OK;
}

/* Takes a lease for `v` and fills its record (under the lock). */
IPCREF_PRIVATE ipcref_result
ipcref__lease_take(ipcref_peer *p, const ipcref_view *v, ipcref__view_event *ev,
                   ipcref__view_rec *r, ipcref__fd_rec *fdr, int *nrec,
                   int *fds, int *nfd, int dup_fds) {
  ipcref_ctx *ctx = p->ctx;
  ipcref_buf *buf = v->buf;
  int seg_fd, ledger_fd, fail = 0, seg_writable, device = 0;
  int32_t dev_type = 0, dev_id = 0;
  const unsigned char *handle = NULL;
  uint64_t nonce, seg_id, ledger_id, seg_size;
  uint32_t origin_pid, ledger_n;
  ipcref__block *local = ipcref__local_block(buf);
  memset(r, 0, sizeof *r);
  if (local) {
    ipcref__block *b = local;
    ipcref__ledger *l = p->ledger;
    uint64_t *slots;
    ipcref_result res;
    if (b->seg->ctx != ctx) return IPCREF_EINVAL;
    if (!l || l->nfree == 0) { /* an older one with room, or a new one */
      ipcref__sweep(ctx);      /* returned leases free their slots first */
      for (l = ctx->ledgers; l; l = l->next)
        if (l->peer == p && l->nfree) break;
      if (!l) {
        res = ipcref__ledger_new(ctx, p, &l);
        if (res != IPCREF_OK) return res;
      }
      p->ledger = l;
    }
    slots = ipcref__ledger_slots(l->base);
    r->slot = l->free_stack[--l->nfree];
    r->gen = (uint32_t)(__atomic_load_n(&slots[2 * (size_t)r->slot],
                                        __ATOMIC_RELAXED) >>
                        2) +
             1u;
    l->leases[r->slot].block = b;
    l->leases[r->slot].gen = r->gen;
    if (buf->release == ipcref__alias_release) { /* a hold of the alias */
      l->leases[r->slot].alias = (ipcref__alias *)buf->release_user;
      l->leases[r->slot].alias->holds++;
    }
    l->live++;
    b->leases++;
    ctx->st.live_slots++;
    r->origin_nonce = ctx->nonce; /* what a cancel needs, from here on */
    r->ledger_id = l->id;
    slots[2 * (size_t)r->slot + 1] = (uint64_t)(uint32_t)p->pid; /* holder */
    __atomic_store_n(&slots[2 * (size_t)r->slot],
                     ((uint64_t)r->gen << 2) | IPCREF__SLOT_LIVE,
                     __ATOMIC_RELEASE);
    IPCREF__STEP("export");
    if (b->seg->pool->be) { /* device memory: its handle, and an event */
      ipcref__pool *pool = b->seg->pool;
      if (!b->seg->exported) {
        res = pool->be->seg_export(pool->be, pool->dev, b->seg->daddr,
                                   b->seg->handle);
        if (res != IPCREF_OK) {
          ipcref__lease_cancel(ctx, r);
          return res;
        }
        b->seg->exported = 1;
      }
      l->leases[r->slot].be = pool->be; /* the lease keeps the event */
      l->leases[r->slot].event = ev->event;
      ev->event = NULL;
      memcpy(r->event, ev->handle, sizeof r->event);
      r->has_event = 1;
      device = 1;
      dev_type = pool->be->device_type;
      dev_id = pool->dev;
      handle = b->seg->handle;
      seg_fd = -1;
    } else if (ctx->opt.writable_shares) {
      seg_fd = b->seg->fd;
    } else {
      /* Read-only: with the segment's F_SEAL_FUTURE_WRITE, no consumer can
       * map it writable, whatever it does with the fd. */
      seg_fd = b->seg->ro_fd;
    }
    seg_writable = ctx->opt.writable_shares != 0;
    nonce = ctx->nonce;
    origin_pid = (uint32_t)ctx->pid;
    seg_id = b->seg->id;
    seg_size = b->seg->size;
    r->block_offset = b->offset;
    r->block_size = b->size;
    ledger_id = l->id;
    ledger_fd = l->fd;
    ledger_n = l->n;
  } else { /* forwarding an imported buffer */
    ipcref__import *imp = (ipcref__import *)buf->release_user;
    ipcref__map *lm = imp->ledger;
    uint64_t *slots = ipcref__ledger_slots(lm->base), e[2];
    uint32_t half = lm->nslots / 2, i, start, s = 0;
    int got = 0;
    start = (uint32_t)((uintptr_t)v >> 6) % half;
    for (i = 0; i < half && !got; i++) {
      uint64_t w;
      s = half + (start + i) % half;
      w = __atomic_load_n(&slots[2 * (size_t)s], __ATOMIC_ACQUIRE);
      if ((w & 3u) != IPCREF__SLOT_FREE) continue;
      /* Claim it: forwarders of one ledger may race here. */
      got = __atomic_compare_exchange_n(
          &slots[2 * (size_t)s], &w, (((w >> 2) + 1) << 2) | IPCREF__SLOT_LIVE,
          0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
      if (got) r->gen = (uint32_t)((w >> 2) + 1);
    }
    if (!got) return IPCREF_EBUSY; /* every forwarding slot is in use */
    r->slot = s;
    /* The holder, and the parent, for the producer to adopt this lease
     * should its link never be written (see ipcref__adopt_forwards). */
    __atomic_store_n(&slots[2 * (size_t)s + 1],
                     ((uint64_t)(imp->slot + 1u) << 32) | (uint32_t)p->pid,
                     __ATOMIC_RELEASE);
    e[0] = ipcref__ring_entry(IPCREF__RING_LINK, s, r->gen);
    e[1] = ipcref__ring_entry(IPCREF__RING_PARENT, imp->slot, imp->gen);
    ipcref__ring_push(lm->base, lm->nslots, e, 2, "forward");
    if (imp->seg->kind == 3) { /* the producer's event goes on */
      device = 1;
      dev_type = imp->seg->dev_type;
      dev_id = imp->seg->dev_id;
      handle = imp->seg->handle;
      r->has_event = imp->has_event;
      memcpy(r->event, imp->event, sizeof r->event);
    }
    seg_fd = imp->seg->fd;
    seg_writable = imp->seg->writable;
    nonce = imp->seg->origin_nonce;
    origin_pid = (uint32_t)imp->seg->origin_pid;
    seg_id = imp->seg->id;
    seg_size = imp->seg->size;
    r->block_offset = imp->offset;
    r->block_size = imp->size;
    ledger_id = lm->id;
    ledger_fd = lm->fd;
    ledger_n = lm->nslots;
  }
  r->origin_pid = origin_pid;
  r->origin_nonce = nonce;
  r->seg_id = seg_id;
  r->seg_size = seg_size;
  r->ledger_id = ledger_id;
  r->writable = seg_writable;
  r->view = *v;
  r->view.buf = NULL;
  r->view.byte_offset = v->byte_offset; /* relative to the block's data */
  /* What the peer lacks: the segment (its fd, or a device's handle) and
   * the ledger's fd. */
  if (!device && seg_fd < 0) goto sys;
  if (!ipcref__seen(p, nonce, seg_id << 1, &fail) && !fail) {
    ipcref__fd_rec *f = &fdr[(*nrec)++];
    memset(f, 0, sizeof *f);
    f->kind = device ? 3 : 1;
    f->writable = seg_writable;
    f->origin_pid = origin_pid;
    f->origin_nonce = nonce;
    f->id = seg_id;
    f->size = seg_size;
    if (device) {
      f->dev_type = dev_type;
      f->dev_id = dev_id;
      memcpy(f->handle, handle, IPCREF_HANDLE_BYTES);
    } else {
      fds[(*nfd)++] = dup_fds ? fcntl(seg_fd, F_DUPFD_CLOEXEC, 0) : seg_fd;
    }
  }
  if (!fail && !ipcref__seen(p, nonce, (ledger_id << 1) | 1u, &fail) && !fail) {
    ipcref__fd_rec *f = &fdr[(*nrec)++];
    memset(f, 0, sizeof *f);
    f->kind = 2;
    f->writable = 1;
    f->origin_pid = origin_pid;
    f->origin_nonce = nonce;
    f->id = ledger_id;
    f->size = ipcref__ledger_bytes(ledger_n);
    fds[(*nfd)++] = dup_fds ? fcntl(ledger_fd, F_DUPFD_CLOEXEC, 0) : ledger_fd;
  }
  if (fail) {
    ipcref__lease_cancel(ctx, r);
    return IPCREF_ENOMEM;
  }
  return IPCREF_OK;
sys:
  ipcref__lease_cancel(ctx, r);
  return IPCREF_ESYS;
}

/* Forgets that the peer was sent the fds of these records (the message
 * carrying them never left). */
IPCREF_PRIVATE void ipcref__unsee(ipcref_peer *p, const ipcref__fd_rec *fdr,
                                  int n) {
  int i;
  size_t k;
  for (i = 0; i < n; i++)
    for (k = 0; k < p->nseen; k++)
      if (p->seen[k].nonce == fdr[i].origin_nonce &&
          p->seen[k].key == ((fdr[i].id << 1) | (uint64_t)(fdr[i].kind == 2))) {
        p->seen[k] = p->seen[--p->nseen];
        break;
      }
}

/* Builds a message for `n` views (under the lock). */
IPCREF_PRIVATE ipcref_result ipcref__export_msg(ipcref_peer *p,
                                                const ipcref_view *views, int n,
                                                ipcref__view_event *ev,
                                                ipcref_msg *msg, int dup_fds) {
  ipcref_ctx *ctx = p->ctx;
  ipcref__view_rec recs[IPCREF__MSG_VIEWS];
  ipcref__fd_rec fdr[IPCREF_MSG_MAX_FDS];
  ipcref__wire w;
  size_t nret;
  int i, nfd = 0, nrec = 0;
  ipcref_result r = IPCREF_OK;
  if (n < 1 || n > IPCREF__MSG_VIEWS) return IPCREF_EINVAL;
  for (i = 0; i < n; i++)
    if (!ipcref__view_valid(&views[i]) || !ipcref_buf_is_shared(views[i].buf))
      return IPCREF_EINVAL;
  (void)ipcref__pump(ctx, 0);
  for (i = 0; i < n && r == IPCREF_OK; i++) {
    int k, first = nfd;
    r = ipcref__lease_take(p, &views[i], &ev[i], &recs[i], fdr, &nrec, msg->fds,
                           &nfd, dup_fds);
    if (r != IPCREF_OK) break; /* it ended its own lease */
    for (k = first; k < nfd; k++)
      if (msg->fds[k] < 0) r = IPCREF_ESYS; /* a dup failed */
    if (r != IPCREF_OK) {
      ipcref__lease_cancel(ctx, &recs[i]);
      break;
    }
  }
  if (r != IPCREF_OK) {
    int k;
    for (k = 0; k < i; k++) ipcref__lease_cancel(ctx, &recs[k]);
    ipcref__unsee(p, fdr, nrec);
    if (dup_fds)
      for (k = 0; k < nfd; k++)
        if (msg->fds[k] >= 0) close(msg->fds[k]);
    return r;
  }
  nret = p->nretired < IPCREF__MSG_RETIRED ? p->nretired : IPCREF__MSG_RETIRED;
  w.p = msg->bytes;
  w.len = sizeof msg->bytes;
  w.pos = 0;
  w.bad = 0;
  ipcref__put(&w, IPCREF__MSG_MAGIC, 4);
  ipcref__put(&w, IPCREF__MSG_VERSION, 2);
  ipcref__put(&w, (uint64_t)n, 2);
  ipcref__put(&w, (uint64_t)nrec, 2);
  ipcref__put(&w, nret, 2);
  ipcref__put(&w, (uint64_t)ctx->pid, 4);
  ipcref__put(&w, ctx->nonce, 8);
  for (i = 0; i < nrec; i++) ipcref__put_fd_rec(&w, &fdr[i]);
  for (i = 0; i < (int)nret; i++) ipcref__put(&w, p->retired[i], 8);
  for (i = 0; i < n; i++) ipcref__put_view(&w, &recs[i]);
  /* IPCREF_MSG_MAX_BYTES holds the largest record these limits allow. */
  IPCREF_ASSERT(!w.bad);
  if (nret) {
    memmove(p->retired, p->retired + nret, (p->nretired - nret) * 8);
    p->nretired -= nret;
  }
  msg->len = w.pos;
  msg->nfds = nfd;
  msg->origin = p;
  ctx->st.fds_sent += (uint64_t)nfd;
  return IPCREF_OK;
}

/* ---- import ------------------------------------------------------------ */

/* The release callback of an imported buffer: this process's last
 * reference went, so the lease goes back to its producer. One fetch_add
 * and stores into shared memory, a free: no system call, no lock. */
IPCREF_PRIVATE void ipcref__import_finish(ipcref__import *imp) {
  ipcref_ctx *ctx;
  uint64_t e = ipcref__ring_entry(IPCREF__RING_RELEASE, imp->slot, imp->gen);
  ipcref__ring_push(imp->ledger->base, imp->ledger->nslots, &e, 1, "release");
  __atomic_fetch_sub(&imp->seg->refs, 1, __ATOMIC_RELEASE);
  __atomic_fetch_sub(&imp->ledger->refs, 1, __ATOMIC_RELEASE);
  __atomic_fetch_sub(&imp->ctx->imported_bufs, 1, __ATOMIC_RELEASE);
  ctx = imp->ctx;
  IPCREF_FREE(imp);
  ipcref__ctx_unref(ctx); /* only the last one after ctx_free tears down */
}

/* Device memory is returned only once the work queued on its stream has
 * completed, and nobody waits for that: the release parks the import with
 * a fence, and the calls on the context return it when the fence is done
 * (ipcref__deferred_poll). After ipcref_ctx_free nothing would poll, so a
 * release then waits for its fence here. */
IPCREF_PRIVATE void ipcref__import_release(void *user, void *data) {
  ipcref__import *imp = (ipcref__import *)user;
  (void)data;
  if (imp->seg->kind == 3) {
    ipcref_backend *be = imp->seg->be;
    ipcref_ctx *ctx = imp->ctx;
    void *fence = NULL;
    if (be->fence(be, imp->seg->dev_id, imp->stream, &fence) == IPCREF_OK &&
        fence) {
      if (!__atomic_load_n(&ctx->owner_gone, __ATOMIC_ACQUIRE)) {
        imp->fence = fence;
        IPCREF__LOCK(ctx);
        imp->next = ctx->deferred;
        ctx->deferred = imp;
        ctx->st.deferred++;
        IPCREF__UNLOCK(ctx);
        return;
      }
      while (!be->fence_done(be, fence)) usleep(50);
    }
  }
  ipcref__import_finish(imp);
}

/* Checks a received fd against its record and maps it. The fd must be a
 * memfd sealed against shrinking and growing (so the mapping can never
 * SIGBUS), of exactly the announced size, opened with the access the
 * mapping needs. A ledger's header must agree with the record. */
IPCREF_PRIVATE ipcref_result ipcref__map_fd(int fd, const ipcref__fd_rec *r,
                                            ipcref__map **out) {
  struct stat st;
  int seals, fl, prot;
  ipcref__map *m;
  unsigned char *base;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (uint64_t)st.st_size != r->size || r->size == 0 ||
      r->size > (uint64_t)PTRDIFF_MAX)
    return IPCREF_EPROTO;
  seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    return IPCREF_EPROTO;
  fl = fcntl(fd, F_GETFL);
  if (fl < 0) return IPCREF_EPROTO;
  if (r->kind == 2 && r->size < IPCREF__LEDGER_HDR) return IPCREF_EPROTO;
  if (r->kind == 2 || r->writable) { /* mapped writable */
    if ((fl & O_ACCMODE) != O_RDWR ||
        (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0)
      return IPCREF_EPROTO;
    prot = PROT_READ | PROT_WRITE;
  } else { /* mapped read-only: the fd must be readable */
    if ((fl & O_ACCMODE) == O_WRONLY) return IPCREF_EPROTO;
    prot = PROT_READ;
  }
  base = (unsigned char *)mmap(NULL, (size_t)r->size, prot, MAP_SHARED, fd, 0);
  if (base == (unsigned char *)MAP_FAILED) return IPCREF_ESYS;
  m = (ipcref__map *)ipcref__zalloc(sizeof *m);
  if (!m) {
    munmap(base, (size_t)r->size);
    return IPCREF_ENOMEM;
  }
  m->kind = r->kind;
  m->origin_nonce = r->origin_nonce;
  m->origin_pid = (int)r->origin_pid;
  m->id = r->id;
  m->fd = fd;
  m->base = base;
  m->size = (size_t)r->size;
  m->writable = r->kind == 1 && r->writable;
  if (r->kind == 2) {
    ipcref__ledger_hdr *h = (ipcref__ledger_hdr *)(void *)base;
    uint32_t n = h->nslots;
    if (h->magic != IPCREF__LEDGER_MAGIC ||
        h->version != IPCREF__LEDGER_VERSION || n < 2 || n > (1u << 24) ||
        (n & 1) || ipcref__ledger_bytes(n) != r->size ||
        h->origin_nonce != r->origin_nonce || h->ledger_id != r->id) {
      munmap(base, (size_t)r->size);
      IPCREF_FREE(m);
      return IPCREF_EPROTO;
    }
    m->nslots = n;
    m->imported = (uint32_t *)ipcref__zalloc(n * sizeof(uint32_t));
    if (!m->imported) {
      munmap(base, (size_t)r->size);
      IPCREF_FREE(m);
      return IPCREF_ENOMEM;
    }
  }
  *out = m;
  return IPCREF_OK;
}

/* Opens a device segment another process exported (under the lock): the
 * allocation the driver opens must be at least as large as announced.
 * Without a backend for its device here, the map is a placeholder (be
 * NULL): the views in it are refused with ENODEV and their leases given
 * back, and the peer, which counts the segment as sent, stays usable. */
IPCREF_PRIVATE ipcref_result ipcref__map_device(ipcref_ctx *ctx,
                                                const ipcref__fd_rec *r,
                                                ipcref__map **out) {
  ipcref_backend *be = ipcref__backend(ctx, r->dev_type);
  ipcref__map *m;
  uint64_t addr, base;
  size_t size;
  ipcref_result res;
  if (r->size == 0 || r->size > (uint64_t)PTRDIFF_MAX) return IPCREF_EPROTO;
  m = (ipcref__map *)ipcref__zalloc(sizeof *m);
  if (!m) return IPCREF_ENOMEM;
  if (!be) {
    addr = 0;
    goto fill;
  }
  res = be->seg_import(be, r->dev_id, r->handle, &addr);
  if (res != IPCREF_OK) {
    IPCREF_FREE(m);
    return res;
  }
  if (be->seg_range(be, r->dev_id, addr, &base, &size) != IPCREF_OK ||
      base != addr || (uint64_t)size < r->size) {
    be->seg_close(be, r->dev_id, addr);
    IPCREF_FREE(m);
    return IPCREF_EPROTO;
  }
fill:
  m->kind = 3;
  m->origin_nonce = r->origin_nonce;
  m->origin_pid = (int)r->origin_pid;
  m->id = r->id;
  m->fd = -1;
  m->size = (size_t)r->size;
  m->writable = r->writable != 0;
  m->be = be;
  m->dev_type = r->dev_type;
  m->dev_id = r->dev_id;
  m->daddr = addr;
  memcpy(m->handle, r->handle, sizeof m->handle);
  *out = m;
  return IPCREF_OK;
}

/* The address of `offset` in a mapped segment, host or device. */
IPCREF_PRIVATE void *ipcref__map_addr(const ipcref__map *m, uint64_t offset) {
  return m->kind == 3 ? (void *)(uintptr_t)(m->daddr + offset)
                      : (void *)(m->base + offset);
}

/* Fresh mappings join the cache (under the lock). */
IPCREF_PRIVATE void ipcref__maps_commit(ipcref_ctx *ctx, ipcref__map **fresh,
                                        int n) {
  int k;
  for (k = 0; k < n; k++) {
    IPCREF__LIST_PUSH(ctx->maps, fresh[k], next, prev);
    if (fresh[k]->kind == 2)
      ctx->st.counter_files++;
    else
      ctx->st.mapped_segments++;
  }
}

/* Gives back the leases of records [from, n) that will not be used: each
 * is marked imported (a replay is refused) and returned to its ledger. */
IPCREF_PRIVATE void ipcref__leases_give_back(const ipcref__view_rec *recs,
                                             ipcref__map **ledm, int from,
                                             int n) {
  int k;
  for (k = from; k < n; k++) {
    uint64_t e =
        ipcref__ring_entry(IPCREF__RING_RELEASE, recs[k].slot, recs[k].gen);
    ledm[k]->imported[recs[k].slot] = recs[k].gen + 1u;
    ipcref__ring_push(ledm[k]->base, ledm[k]->nslots, &e, 1, NULL);
  }
}

/* Imports a received record with its fds (takes the fds). `views` gets
 * one view per record. */
IPCREF_PRIVATE ipcref_result ipcref__import_bytes(
    ipcref_peer *p, const unsigned char *bytes, size_t len, int *fds, int nfds,
    void *stream, ipcref_view *views, int *nviews) {
  ipcref_ctx *ctx = p->ctx;
  ipcref__wire w;
  ipcref__fd_rec fdr[IPCREF_MSG_MAX_FDS];
  ipcref__map *fresh[IPCREF_MSG_MAX_FDS];
  ipcref__view_rec recs[IPCREF__MSG_VIEWS];
  ipcref__map *segm[IPCREF__MSG_VIEWS], *ledm[IPCREF__MSG_VIEWS];
  uint64_t sender_nonce;
  int i, k, n, nrec, nfd = 0, nret, nfresh = 0, made = 0;
  int fdi[IPCREF_MSG_MAX_FDS]; /* each record's fd, or -1 */
  ipcref_result r = IPCREF_EPROTO;
  w.p = (unsigned char *)(uintptr_t)bytes;
  w.len = len;
  w.pos = 0;
  w.bad = 0;
  memset(fresh, 0, sizeof fresh);
  if (ipcref__get(&w, 4) != IPCREF__MSG_MAGIC ||
      ipcref__get(&w, 2) != IPCREF__MSG_VERSION)
    goto close_fds;
  n = (int)ipcref__get(&w, 2);
  nrec = (int)ipcref__get(&w, 2);
  nret = (int)ipcref__get(&w, 2);
  (void)ipcref__get(&w, 4);
  sender_nonce = ipcref__get(&w, 8);
  if (w.bad || n < 1 || n > IPCREF__MSG_VIEWS || nrec > IPCREF_MSG_MAX_FDS ||
      nret > IPCREF__MSG_RETIRED)
    goto close_fds;
  for (i = 0; i < nrec; i++) { /* kinds 1 and 2 take the fds in order */
    if (!ipcref__get_fd_rec(&w, &fdr[i])) goto close_fds;
    fdi[i] = fdr[i].kind == 3 ? -1 : nfd++;
  }
  if (nfd != nfds) goto close_fds;
  IPCREF__LOCK(ctx);
  (void)ipcref__pump(ctx, 0);
  for (i = 0; i < nret; i++) { /* the sender destroyed these segments */
    ipcref__map *m = ipcref__map_find(ctx, 1, sender_nonce, ipcref__get(&w, 8));
    if (m) m->retired = 1;
  }
  ipcref__maps_trim(ctx, (size_t)1 << 30);
  for (i = 0; i < n; i++)
    if (!ipcref__get_view(&w, &recs[i])) goto unlock;
  if (w.pos != w.len) goto unlock;
  /* Map what is new; an fd for something already mapped is redundant. */
  for (i = 0; i < nrec; i++) {
    int kind = fdr[i].kind == 2 ? 2 : 1; /* segments: host or device */
    if (ipcref__map_find(ctx, kind, fdr[i].origin_nonce, fdr[i].id)) continue;
    for (k = 0; k < nfresh; k++)
      if ((fresh[k]->kind == 2) == (kind == 2) &&
          fresh[k]->origin_nonce == fdr[i].origin_nonce &&
          fresh[k]->id == fdr[i].id)
        break;
    if (k < nfresh) continue;
    if (fdr[i].kind == 3) {
      r = ipcref__map_device(ctx, &fdr[i], &fresh[nfresh]);
    } else {
      r = ipcref__map_fd(fds[fdi[i]], &fdr[i], &fresh[nfresh]);
      if (r == IPCREF_OK) fds[fdi[i]] = -1; /* the map owns it now */
    }
    if (r != IPCREF_OK) goto unlock;
    nfresh++;
    IPCREF__STEP("map");
  }
  /* Check every record before anything is taken. */
  r = IPCREF_EPROTO;
  for (i = 0; i < n; i++) {
    ipcref__view_rec *v = &recs[i];
    struct ipcref_buf fake;
    ipcref_view geo;
    uint64_t *slots, word, end;
    segm[i] = ipcref__map_find(ctx, 1, v->origin_nonce, v->seg_id);
    ledm[i] = ipcref__map_find(ctx, 2, v->origin_nonce, v->ledger_id);
    for (k = 0; k < nfresh; k++) {
      if (fresh[k]->origin_nonce != v->origin_nonce) continue;
      if (fresh[k]->kind != 2 && fresh[k]->id == v->seg_id) segm[i] = fresh[k];
      if (fresh[k]->kind == 2 && fresh[k]->id == v->ledger_id)
        ledm[i] = fresh[k];
    }
    if (!segm[i] || !ledm[i] || segm[i]->retired ||
        segm[i]->size != v->seg_size || v->block_size == 0 ||
        __builtin_add_overflow(v->block_offset, v->block_size, &end) ||
        end > segm[i]->size || v->slot >= ledm[i]->nslots ||
        (v->writable && !segm[i]->writable) ||
        (v->has_event && segm[i]->kind != 3))
      goto unlock;
    /* The lease must be live at exactly this generation (a replay of an
     * older message finds the slot freed or reused), and not imported
     * already (one export, one import). */
    slots = ipcref__ledger_slots(ledm[i]->base);
    word = __atomic_load_n(&slots[2 * (size_t)v->slot], __ATOMIC_ACQUIRE);
    if (word != (((uint64_t)v->gen << 2) | IPCREF__SLOT_LIVE) ||
        ledm[i]->imported[v->slot] == v->gen + 1u)
      goto unlock;
    for (k = 0; k < i; k++)
      if (ledm[k] == ledm[i] && recs[k].slot == v->slot) goto unlock;
    if (segm[i]->kind == 3 && !segm[i]->be) continue; /* refused below */
    /* Every element the view reaches lies inside the block. */
    memset(&fake, 0, sizeof fake);
    fake.data = ipcref__map_addr(segm[i], v->block_offset);
    fake.size = (size_t)v->block_size;
    geo = v->view;
    geo.buf = &fake;
    if (ipcref__view_check_new(&geo) != IPCREF_OK ||
        geo.byte_offset % (int64_t)ipcref__dtype_sizes[geo.dtype] != 0)
      goto unlock;
  }
  /* Device memory without its backend here: refused, and the leases, which
   * are genuine, go back at once (nothing else of the message is used). */
  for (i = 0; i < n; i++)
    if (segm[i]->kind == 3 && !segm[i]->be) {
      r = IPCREF_ENODEV;
      ipcref__maps_commit(ctx, fresh, nfresh); /* the peer counts them sent */
      nfresh = 0;
      ipcref__leases_give_back(recs, ledm, 0, n);
      goto unlock;
    }
  /* Device data: the stream waits for the producer's writes (also when
   * the segment was mapped before). Nothing is taken yet if it fails. */
  for (i = 0; i < n; i++)
    if (recs[i].has_event) {
      r = segm[i]->be->event_wait(segm[i]->be, segm[i]->dev_id, stream,
                                  recs[i].event);
      if (r != IPCREF_OK) goto unlock;
    }
  /* Commit: the new mappings join the cache, and each view gets a buffer
   * whose death returns its lease. */
  ipcref__maps_commit(ctx, fresh, nfresh);
  nfresh = 0;
  ctx->st.fds_received += (uint64_t)nfd;
  r = IPCREF_OK;
  for (i = 0; i < n; i++) {
    ipcref__view_rec *v = &recs[i];
    ipcref__import *imp = (ipcref__import *)ipcref__zalloc(sizeof *imp);
    ipcref_buf *b = NULL;
    ipcref_device dev;
    dev.type = segm[i]->kind == 3 ? segm[i]->dev_type : IPCREF_DEVICE_CPU;
    dev.id = segm[i]->kind == 3 ? segm[i]->dev_id : 0;
    if (!imp ||
        ipcref_buf_wrap_device(ipcref__map_addr(segm[i], v->block_offset),
                               (size_t)v->block_size, dev,
                               ipcref__import_release, imp, &b) != IPCREF_OK) {
      /* Out of memory: give back the leases we cannot use. */
      IPCREF_FREE(imp);
      ipcref__leases_give_back(recs, ledm, i, n);
      r = IPCREF_ENOMEM;
      break;
    }
    /* A read-only mapping is never writable, however unique. */
    if (!segm[i]->writable) ipcref__buf_set_read_only(b);
    imp->ctx = ctx;
    imp->seg = segm[i];
    imp->ledger = ledm[i];
    imp->slot = v->slot;
    imp->gen = v->gen;
    imp->offset = (size_t)v->block_offset;
    imp->size = (size_t)v->block_size;
    imp->stream = stream;
    imp->has_event = v->has_event;
    memcpy(imp->event, v->event, sizeof imp->event);
    ledm[i]->imported[v->slot] = v->gen + 1u;
    __atomic_fetch_add(&segm[i]->refs, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&ledm[i]->refs, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&ctx->imported_bufs, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&ctx->refs, 1, __ATOMIC_RELAXED);
    views[i] = v->view;
    views[i].buf = b;
    made++;
  }
  *nviews = made;
  if (made) IPCREF__STEP("import");
unlock:
  for (k = 0; k < nfresh; k++) ipcref__map_drop(fresh[k]); /* undo */
  IPCREF__UNLOCK(ctx);
  if (r != IPCREF_OK && made) { /* ENOMEM partway */
    for (i = 0; i < made; i++) ipcref_view_release(&views[i]);
    *nviews = 0;
  }
close_fds:
  for (i = 0; i < nfds; i++)
    if (fds[i] >= 0) close(fds[i]);
  if (r == IPCREF_EPROTO)
    __atomic_fetch_add(&ctx->refused, 1, __ATOMIC_RELAXED);
  return r;
}

/* Before anything goes to a peer or is taken from it (not under the
 * lock): its hello, waited for up to 5 s (the other side sends it from
 * ipcref_peer_new). Nothing is leased to a process we have not identified:
 * its uid decides whether it may connect, and its pid is what is watched
 * for its death (and what a forwarded hold names). Reading it also leaves
 * nothing unread on a producer that only sends (see ipcref__recvmsg). */
IPCREF_PRIVATE ipcref_result ipcref__hello_need(ipcref_peer *p) {
  if (!p->hello) {
    ipcref_result r = ipcref__hello_read(p, 5000);
    if (r != IPCREF_OK) return r;
  }
  return ipcref__hello_result(p);
}

IPCREF_API ipcref_result ipcref_export(ipcref_peer *p, const ipcref_view *v,
                                       ipcref_msg *msg) {
  ipcref_result r;
  if (!p || !v || !msg) return IPCREF_EINVAL;
  msg->len = 0;
  msg->nfds = 0;
  msg->origin = NULL;
  ipcref__view_event ev[1];
  r = ipcref__hello_need(p);
  if (r == IPCREF_OK) r = ipcref__events_record(v, 1, NULL, ev);
  if (r != IPCREF_OK) return r;
  IPCREF__LOCK(p->ctx);
  r = ipcref__export_msg(p, v, 1, ev, msg, 1);
  IPCREF__UNLOCK(p->ctx);
  ipcref__events_free(ev, 1); /* what no lease took */
  return r;
}

IPCREF_API ipcref_result ipcref_import(ipcref_peer *p, ipcref_msg *msg,
                                       ipcref_view *out) {
  ipcref_view views[IPCREF__MSG_VIEWS];
  ipcref_result r;
  int n = 0, i;
  if (!p || !msg || !out || msg->nfds < 0 || msg->nfds > IPCREF_MSG_MAX_FDS ||
      msg->len > sizeof msg->bytes)
    return IPCREF_EINVAL;
  r = ipcref__hello_need(p);
  if (r == IPCREF_OK)
    r = ipcref__import_bytes(p, msg->bytes, msg->len, msg->fds, msg->nfds, NULL,
                             views, &n);
  else
    for (i = 0; i < msg->nfds; i++) /* its fds, as on any error */
      if (msg->fds[i] >= 0) close(msg->fds[i]);
  msg->nfds = 0; /* taken (and closed on error) */
  msg->origin = NULL;
  if (r != IPCREF_OK) return r;
  for (i = 1; i < n; i++) ipcref_view_release(&views[i]); /* one per msg */
  *out = views[0];
  return IPCREF_OK;
}

IPCREF_API void ipcref_msg_sent(ipcref_msg *msg) {
  int i;
  if (!msg) return;
  for (i = 0; i < msg->nfds && i < IPCREF_MSG_MAX_FDS; i++)
    if (msg->fds[i] >= 0) close(msg->fds[i]);
  msg->nfds = 0;
  msg->origin = NULL;
}

IPCREF_API void ipcref_msg_free(ipcref_msg *msg) {
  int i;
  if (!msg) return;
  for (i = 0; i < msg->nfds && i < IPCREF_MSG_MAX_FDS; i++)
    if (msg->fds[i] >= 0) close(msg->fds[i]);
  msg->nfds = 0;
  if (msg->origin && msg->len <= sizeof msg->bytes) {
    /* Never imported: end the leases it carries. */
    ipcref_ctx *ctx = msg->origin->ctx;
    ipcref__wire w;
    ipcref__view_rec rec;
    int n, nfd, nret;
    w.p = msg->bytes;
    w.len = msg->len;
    w.pos = 0;
    w.bad = 0;
    (void)ipcref__get(&w, 6);
    n = (int)ipcref__get(&w, 2);
    nfd = (int)ipcref__get(&w, 2);
    nret = (int)ipcref__get(&w, 2);
    (void)ipcref__get(&w, 8); /* sender pid and nonce */
    (void)ipcref__get(&w, 4);
    IPCREF__LOCK(ctx);
    /* The peer never got these segments: send them again next time. */
    for (; nfd > 0 && !w.bad; nfd--) {
      ipcref__fd_rec f;
      if (ipcref__get_fd_rec(&w, &f)) ipcref__unsee(msg->origin, &f, 1);
    }
    w.pos += (size_t)nret * 8;
    while (n-- > 0 && ipcref__get_view(&w, &rec))
      ipcref__lease_cancel(ctx, &rec);
    IPCREF__UNLOCK(ctx);
  }
  msg->origin = NULL;
  msg->len = 0;
}

/* ---- send and receive -------------------------------------------------- */

/* Sends a record with fds: one datagram on SOCK_SEQPACKET; on SOCK_STREAM a
 * 4-byte length first (the fds travel with it). */
IPCREF_PRIVATE ipcref_result ipcref__send_raw(ipcref_peer *p,
                                              const ipcref_msg *msg) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * IPCREF_MSG_MAX_FDS)];
    struct cmsghdr align;
  } u;
  unsigned char lenbuf[4];
  struct iovec iov[2];
  struct msghdr mh;
  size_t total, sent = 0;
  int stream = p->sock_type == SOCK_STREAM, i;
  memset(&mh, 0, sizeof mh);
  lenbuf[0] = (unsigned char)msg->len;
  lenbuf[1] = (unsigned char)(msg->len >> 8);
  lenbuf[2] = (unsigned char)(msg->len >> 16);
  lenbuf[3] = 0;
  iov[0].iov_base = lenbuf;
  iov[0].iov_len = 4;
  iov[1].iov_base = (void *)(uintptr_t)msg->bytes;
  iov[1].iov_len = msg->len;
  mh.msg_iov = stream ? iov : iov + 1;
  mh.msg_iovlen = stream ? 2 : 1;
  total = msg->len + (stream ? 4 : 0);
  if (msg->nfds > 0) {
    struct cmsghdr *c;
    memset(&u, 0, sizeof u);
    mh.msg_control = u.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)msg->nfds);
    c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)msg->nfds);
    memcpy(CMSG_DATA(c), msg->fds, sizeof(int) * (size_t)msg->nfds);
  }
  while (sent < total) {
    ssize_t k = sendmsg(p->fd, &mh, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return errno == EPIPE || errno == ECONNRESET ? IPCREF_EPEER : IPCREF_ESYS;
    }
    sent += (size_t)k;
    if (sent >= total) break;
    /* A stream took part of it: send the rest, without the fds. */
    mh.msg_control = NULL;
    mh.msg_controllen = 0;
    for (i = 0; i < (int)mh.msg_iovlen && k > 0; i++) {
      size_t take =
          (size_t)k < mh.msg_iov[i].iov_len ? (size_t)k : mh.msg_iov[i].iov_len;
      mh.msg_iov[i].iov_base = (char *)mh.msg_iov[i].iov_base + take;
      mh.msg_iov[i].iov_len -= take;
      k -= (ssize_t)take;
    }
  }
  return IPCREF_OK;
}

IPCREF_PRIVATE ipcref_result ipcref__send(ipcref_peer *p,
                                          const ipcref_view *views, int n,
                                          void *stream) {
  ipcref__view_event ev[IPCREF__MSG_VIEWS];
  ipcref_msg msg;
  ipcref_result r;
  if (!p || !views || n < 1 || n > IPCREF__MSG_VIEWS) return IPCREF_EINVAL;
  r = ipcref__hello_need(p);
  if (r == IPCREF_OK) r = ipcref__events_record(views, n, stream, ev);
  if (r != IPCREF_OK) return r;
  msg.len = 0;
  msg.nfds = 0;
  msg.origin = NULL;
  IPCREF__LOCK(p->ctx);
  r = ipcref__export_msg(p, views, n, ev, &msg, 0); /* fds borrowed */
  IPCREF__UNLOCK(p->ctx);
  ipcref__events_free(ev, n); /* what no lease took */
  if (r != IPCREF_OK) return r;
  IPCREF__STEP("send");
  /* Not under the lock: the socket may block on the peer. */
  r = ipcref__send_raw(p, &msg);
  if (r != IPCREF_OK) {
    msg.nfds = 0; /* borrowed: not ours to close */
    ipcref_msg_free(&msg);
  }
  return r;
}

IPCREF_API ipcref_result ipcref_send_batch(ipcref_peer *p,
                                           const ipcref_view *views, int n) {
  return ipcref__send(p, views, n, NULL);
}

IPCREF_API ipcref_result ipcref_send(ipcref_peer *p, const ipcref_view *v) {
  return ipcref__send(p, v, 1, NULL);
}

IPCREF_API ipcref_result ipcref_send_on(ipcref_peer *p, const ipcref_view *v,
                                        void *stream) {
  return ipcref__send(p, v, 1, stream);
}

/* Reads exactly n bytes from a stream socket. */
IPCREF_PRIVATE ipcref_result ipcref__read_all(int fd, unsigned char *b,
                                              size_t n) {
  while (n) {
    ssize_t k = read(fd, b, n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return errno == ECONNRESET ? IPCREF_EPEER : IPCREF_ESYS;
    if (k == 0) return IPCREF_EPEER;
    b += k;
    n -= (size_t)k;
  }
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_recv(ipcref_peer *p, ipcref_view *out,
                                     int timeout_ms) {
  return ipcref_recv_on(p, out, timeout_ms, NULL);
}

IPCREF_API ipcref_result ipcref_recv_on(ipcref_peer *p, ipcref_view *out,
                                        int timeout_ms, void *stream) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * IPCREF_MSG_MAX_FDS)];
    struct cmsghdr align;
  } u;
  unsigned char *bytes;
  unsigned char head[4];
  struct msghdr mh;
  struct iovec iov;
  struct cmsghdr *c;
  int fds[IPCREF_MSG_MAX_FDS], nfds = 0, is_stream, i, n = 0;
  size_t len;
  ssize_t k;
  ipcref_result r;
  if (!p || !out) return IPCREF_EINVAL;
  if (p->pending_pos < p->npending) {
    *out = p->pending[p->pending_pos++];
    return IPCREF_OK;
  }
  if (!p->hello) { /* the other side's first message */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    r = ipcref__hello_read(p, timeout_ms);
    if (r != IPCREF_OK) return r;
    if (timeout_ms > 0) { /* what is left of the caller's wait */
      long spent;
      clock_gettime(CLOCK_MONOTONIC, &t1);
      spent = (long)(t1.tv_sec - t0.tv_sec) * 1000 +
              (long)(t1.tv_nsec - t0.tv_nsec) / 1000000;
      timeout_ms = spent >= timeout_ms ? 0 : timeout_ms - (int)spent;
    }
  }
  if (p->hello < 0) return ipcref__hello_result(p);
  r = ipcref__wait_readable(p->fd, timeout_ms);
  if (r != IPCREF_OK) return r;
  bytes = (unsigned char *)IPCREF_MALLOC(IPCREF_MSG_MAX_BYTES);
  if (!bytes) return IPCREF_ENOMEM;
  is_stream = p->sock_type == SOCK_STREAM;
  memset(&mh, 0, sizeof mh);
  iov.iov_base = is_stream ? (void *)head : (void *)bytes;
  iov.iov_len = is_stream ? 4 : IPCREF_MSG_MAX_BYTES;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = u.buf;
  mh.msg_controllen = sizeof u.buf;
  k = ipcref__recvmsg(p->fd, &mh, is_stream);
  for (c = k >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      ipcref__take_fds(c, fds, &nfds, IPCREF_MSG_MAX_FDS);
  }
  if (k <= 0) {
    r = k == 0 || errno == ECONNRESET ? IPCREF_EPEER : IPCREF_ESYS;
    goto fail;
  }
  r = IPCREF_EPROTO;
  if (mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) goto fail;
  if (is_stream) {
    if (k != 4) goto fail;
    len = (size_t)head[0] | (size_t)head[1] << 8 | (size_t)head[2] << 16 |
          (size_t)head[3] << 24;
    if (len > IPCREF_MSG_MAX_BYTES) goto fail;
    r = ipcref__read_all(p->fd, bytes, len);
    if (r != IPCREF_OK) goto fail;
  } else {
    len = (size_t)k;
  }
  IPCREF__STEP("receive");
  r = ipcref__import_bytes(p, bytes, len, fds, nfds, stream, p->pending, &n);
  IPCREF_FREE(bytes);
  if (r != IPCREF_OK) return r;
  *out = p->pending[0];
  p->npending = n;
  p->pending_pos = 1;
  return IPCREF_OK;
fail:
  for (i = 0; i < nfds; i++) close(fds[i]);
  IPCREF_FREE(bytes);
  return r;
}

#endif /* __USE_GNU */
#endif /* !IPCREF_NO_SHARING */
