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
#define IPCREF_CHUNKS_MAX   16 /* VMM chunks one wrapped buffer may span */
typedef struct ipcref_backend ipcref_backend;
/* Its functions: src/share_backend.h (ipcref.h has it right after this). */

/* Options for ipcref_ctx_new; zero fields take the defaults. A byte cap
 * of IPCREF_KEEP_NONE keeps nothing. */
#define IPCREF_KEEP_NONE ((size_t)1)
typedef struct ipcref_ctx_options {
  size_t segment_size;   /* bytes per shared segment: a multiple of 4096,
                            at most 1 GiB (default 16 MiB); a block over
                            half of it gets a segment of its own */
  size_t segment_cache;  /* bytes of empty segments kept for reuse, pooled
                            or a block's own, host and device alike
                            (default 512 MiB; IPCREF_KEEP_NONE: none), 64
                            segments at most; see ipcref_ctx_trim */
  size_t max_bytes;      /* cap on all segment bytes, the cached ones too
                            (default: none); an allocation that would pass
                            it gives back cached segments first */
  size_t retired_maps;   /* consumer: bytes of idle mappings of segments
                            their producer gave back to the system that a
                            receive may leave mapped (default 64 MiB;
                            IPCREF_KEEP_NONE: unmapped at the next one) */
  uint32_t ledger_slots; /* slots per counter file (default 4096) */
  int writable_shares;   /* nonzero: consumers map segments writable */
  int isolate;           /* nonzero: every block in a segment of its own (see
                            ipcref_shared_new_isolated) */
  const uint32_t *allow_uids; /* uids besides our own whose peers are
                                 accepted (copied); others get EPEER */
  size_t allow_uids_count;
  size_t max_maps;         /* consumer: caps on what all peers' messages keep
                              mapped here at once, forwarded memory whose
                              peer is gone too (default: none); as the
                              peer options of the same names, which cap one
                              peer's */
  size_t max_mapped_bytes; /* and their bytes */
  ipcref_error_hook error_hook; /* hears what peers did wrong (a forged,
                                   replayed or double return, a refused
                                   peer); fn NULL: the process-wide hook.
                                   Runs with the context locked: it must
                                   not call into this context, nor on its
                                   buffers (a write's check of a buffer's
                                   leases takes the lock). */
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
  uint64_t refused;       /* imports refused (EPROTO, or ERANGE: past the
                             caps of a peer or of the context) and peers
                             refused (EPEER), ever */
  size_t device_bytes;    /* bytes of own device segments (in
                             segment_bytes too) */
  size_t deferred;        /* device releases waiting for their stream */
  size_t cached_bytes;    /* bytes of empty segments kept for reuse (in
                             segment_bytes too) */
  uint64_t cache_hits;    /* allocations served from a cached segment, ever */
  uint64_t cache_misses;  /* allocations that made a new segment, ever */
  size_t maps_in;         /* segments, ledgers and device segments peers'
                             messages keep mapped here (in mapped_segments
                             and counter_files too; see max_maps) */
  size_t maps_in_bytes;   /* their bytes */
} ipcref_stats;

/* What one peer holds: to find the consumer that pins memory. Exact at the
 * moment of the call (returned leases swept first). */
typedef struct ipcref_peer_info {
  int pid;                /* the process on the other side (its hello's; before
                             it, the socket's) */
  int alive;              /* as ipcref_peer_alive */
  size_t leases;          /* leases it holds on blocks made here */
  size_t bytes_held;      /* the bytes of those blocks */
  size_t forwarded;       /* leases others hold on blocks made here, taken
                             through what it forwarded to them */
  size_t forwarded_bytes; /* their bytes */
  size_t pending;         /* views received from it and not handed out
                             yet (the rest of a batch) */
  uint64_t sent_channel;  /* messages sent to it through the channel */
  uint64_t sent_socket;   /* and on its socket (those with fds, those that
                             found the ring full; all without a channel) */
  int channel_out;        /* 1: a channel to it is up; -1: it broke it (its
                             read index made no sense), so the socket
                             carries all; 0: none (not yet, or none asked) */
  int channel_in;         /* 1: its channel to us is up; -1: refused (a
                             malformed setup or record: EPROTO for good) */
  size_t maps;            /* what its messages keep mapped here (see
                             max_maps), and */
  size_t mapped_bytes;    /* their bytes */
} ipcref_peer_info;

/* A message: a small byte record plus the fds the peer does not have yet.
 * Produced by ipcref_export, consumed by ipcref_import (which takes the
 * fds); ipcref_msg_free releases what an unused message holds (a message
 * that is never imported keeps its lease until it is freed). */
#define IPCREF_MSG_MAX_VIEWS 16 /* views in one message (a batch) */
#define IPCREF_MSG_MAX_FDS   (3 * IPCREF_MSG_MAX_VIEWS)
#define IPCREF_META_MAX      1024 /* bytes of metadata in one message */
#define IPCREF_MSG_MAX_BYTES                                                   \
  (1024 + IPCREF_META_MAX + IPCREF_MSG_MAX_FDS * (40 + IPCREF_HANDLE_BYTES) +  \
   IPCREF_MSG_MAX_VIEWS * (80 + IPCREF_HANDLE_BYTES + 16 * IPCREF_MAX_DIMS))
typedef struct ipcref_msg {
  size_t len;
  unsigned char bytes[IPCREF_MSG_MAX_BYTES];
  int nfds;
  int fds[IPCREF_MSG_MAX_FDS];
  /* Who exported it, until ipcref_msg_sent or ipcref_msg_free settles it:
   * the context (its nonce) and the peer (its serial there). Ids, not
   * pointers: a message that outlives its peer or its context, a copy of
   * it, or one from another process is settled safely. Zero in a message
   * received from elsewhere: set them so (memset) before filling one. */
  uint64_t origin_ctx, origin_peer;
} ipcref_msg;

/* A new context. NULL options mean the defaults. It is this process's:
 * in a child forked later, calls on it and its peers are refused (EDEAD)
 * and releases of its buffers there touch nothing shared; the child makes
 * its own. Errors: EINVAL (out NULL, a nonsensical option), ENOMEM. */
IPCREF_API ipcref_result ipcref_ctx_new(const ipcref_ctx_options *opt,
                                        ipcref_ctx **out);

/* Frees the context: its peers now (what they hold from us stays leased
 * until it comes back or the ledger goes), the rest once the last shared
 * or imported buffer of this context is released: until then those
 * buffers stay valid. Buffers alive in other processes keep their memory
 * whatever happens here (memfd mappings outlive the producer). NULL is a
 * no-op. A second free, or any call on the context after this one, is
 * refused and reported to the error hook (IPCREF_EDEAD): the context
 * waits, marked dead, in the quarantine (see checked). */
IPCREF_API void ipcref_ctx_free(ipcref_ctx *ctx);

/* A buffer of `size` bytes in shared memory (64-byte aligned; page
 * aligned over 64 KiB), exportable to peers; its bytes are uninitialized.
 * Blocks come in size classes: powers of two up to 64 KiB, eight per
 * doubling above (a block over 64 KiB is at most 12.5% larger than asked).
 * A block over half a segment gets a segment of its own. Freed blocks go
 * back to their segment, and empty segments are cached for the next
 * allocation of their class (see segment_cache): a consumer still maps
 * them, so a recycled block crosses with no fd, no mapping and no page
 * fault; and a consumer that was sent a segment can read what later
 * blocks in it hold (never write it, unless writable_shares): see
 * ipcref_shared_new_isolated. Errors: EINVAL, ERANGE, ENOMEM (after a
 * sweep and a retry, then after giving back the cache), ESYS. */
IPCREF_API ipcref_result ipcref_shared_new(ipcref_ctx *ctx, size_t size,
                                           ipcref_buf **out);

/* As ipcref_shared_new, but the block gets a new memfd segment of its own
 * (its size rounded up to whole pages, then to its class), so a consumer
 * that maps it can reach nothing else, now or later: the segment is given
 * back to the system when the block is freed, never recycled. A consumer
 * of a pooled block maps the whole 16 MiB segment and can read the other
 * blocks in it. The price of isolation: one memfd, one mmap on each side
 * and one fd hand-off per block, and at least a page per block. */
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
 * not closed. The socket may be non-blocking (O_NONBLOCK): then a send
 * whose peer's hello has not come, or whose socket is full, says
 * IPCREF_EAGAIN and takes nothing (see ipcref_peer_options). */
IPCREF_API ipcref_result ipcref_peer_new(ipcref_ctx *ctx, int sockfd,
                                         ipcref_peer **out);

/* Options for ipcref_peer_new_with; zero fields take the defaults. */
typedef struct ipcref_peer_options {
  int send_timeout_ms;     /* a send on a blocking socket waits at most this
                              long in all (for room under max_bytes_held,
                              then in the socket), then fails with ETIMEDOUT
                              and takes nothing (default: as long as it
                              takes). On a non-blocking socket (O_NONBLOCK) a
                              send never waits: EAGAIN */
  int hello_timeout_ms;    /* the other side's hello must come within this
                              long of the first call that needs it (a send,
                              an export), or the peer is refused: EPEER, for
                              good (default 5000) */
  size_t max_bytes_held;   /* a send that would leave the other side holding
                              more bytes of blocks made here than this (by
                              its leases: forwarded views not counted) waits
                              for it to return some, as for a full socket:
                              EAGAIN (IPCREF_WANTS_ROOM) or, blocking, up to
                              send_timeout_ms, then ETIMEDOUT; nothing taken.
                              One message larger than the cap goes when the
                              peer holds nothing. Default: no cap */
  size_t ring_bytes;       /* the channel: a ring in shared memory that
                              carries this side's hand-offs without a system
                              call (the socket still carries fds, and what
                              finds the ring full). Rounded up to a power of
                              two, 4 KiB to 16 MiB (default 64 KiB; made on
                              the first send; IPCREF_KEEP_NONE: no ring, the
                              socket carries everything). A hand-off of one
                              view of up to 4 dimensions, without metadata,
                              takes 192 bytes of it (the default ring holds
                              341), or 64 when it differs from the one
                              before in a few bytes (the same view again:
                              1024) */
  int spin_us;             /* a receive that finds nothing spins this long
                              before it sleeps (at most 10 ms; 0: never
                              spins). IPCREF_SPIN_AUTO, the default when no
                              options are given: up to 50 us, only where this
                              process may run on more than one CPU, halved
                              after each spin that found nothing */
  size_t max_maps;         /* caps on what the other side's messages keep
                              mapped here at once (default: none): the
                              segments, ledgers and device segments, each
                              an fd (a ledger two) and an address range,
                              and */
  size_t max_mapped_bytes; /* their bytes. A message that would pass a cap,
                              once idle mappings of destroyed segments are
                              let go, is refused: ERANGE, its leases given
                              back, nothing it brought kept (it is mapped
                              while it is checked). See ipcref_peer_info */
} ipcref_peer_options;

/* ipcref_peer_options.spin_us: spin where it pays (see there). */
#define IPCREF_SPIN_AUTO (-1)

/* As ipcref_peer_new, with options (NULL: the defaults). Errors: as
 * ipcref_peer_new; EINVAL for a negative option. */
IPCREF_API ipcref_result ipcref_peer_new_with(ipcref_ctx *ctx, int sockfd,
                                              const ipcref_peer_options *opt,
                                              ipcref_peer **out);

/* Replaces the options of peer `p` (NULL: the defaults), for one made
 * without them (ipcref_accept, ipcref_connect): from its next call on.
 * Errors: EINVAL (NULL, a negative option), EDEAD. */
IPCREF_API ipcref_result
ipcref_peer_set_options(ipcref_peer *p, const ipcref_peer_options *opt);

/* Sends what is left of a record that a non-blocking SOCK_STREAM socket
 * took only in part (the rest of a message always goes before anything
 * else, so the stream stays whole; a send does this first itself).
 * IPCREF_OK: nothing is left. Errors: EAGAIN (the socket is full: wait for
 * it to be writable), ETIMEDOUT (a blocking socket, past send_timeout_ms),
 * EPEER, ESYS, EINVAL, EDEAD. */
IPCREF_API ipcref_result ipcref_peer_flush(ipcref_peer *p);

/* Closes the socket and frees the peer. Leases it holds from us stay until
 * they are returned or that process dies; buffers imported through it stay
 * valid. NULL is a no-op. A second free, or any call on the peer after
 * this one, is refused and reported to the error hook (IPCREF_EDEAD): the
 * peer waits, marked dead, in the quarantine (see checked). */
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
 * up before its hello, or no hello within its hello_timeout_ms), EAGAIN
 * (a non-blocking socket: no hello yet; nothing leased), ENOMEM, ESYS,
 * EBUSY (a forwarded view: every forwarding slot of its ledger is in
 * use), EDEAD (the view's buffer was already released, or the peer freed:
 * also reported to the error hook; nothing is leased). */
IPCREF_API ipcref_result ipcref_export(ipcref_peer *p, const ipcref_view *v,
                                       ipcref_msg *msg);

/* As ipcref_export, with `meta_len` bytes of metadata at `meta` (at most
 * IPCREF_META_MAX; a frame number, a name, a shape as the user sees it),
 * which travel in the message as they are: see ipcref_msg_meta. Errors:
 * as ipcref_export; EINVAL (meta NULL with a length, a length over
 * IPCREF_META_MAX), and then nothing is leased. */
IPCREF_API ipcref_result ipcref_export_meta(ipcref_peer *p,
                                            const ipcref_view *v,
                                            const void *meta, size_t meta_len,
                                            ipcref_msg *msg);

/* The metadata message `msg` carries (exported here, or imported: the
 * import checked its length against the message) into *len; NULL with
 * *len 0 when it carries none, or is not a message. It lies in
 * msg->bytes. */
IPCREF_API const void *ipcref_msg_meta(const ipcref_msg *msg, size_t *len);

/* Imports a message from peer `p`: validates every field against the real
 * fds, maps what is new (or finds it in the cache), and returns a view
 * whose buffer returns the lease when it dies. Takes the message's fds
 * (also on error: they are closed). Errors: EPROTO (malformed, replayed,
 * sent by another process than p's, or not matching the fds), EINVAL
 * (NULL arguments, nfds or len out of range, or a message exported
 * through p itself, or by p's context for another process: then nothing
 * is taken, and ipcref_msg_free settles it), ERANGE (past p's max_maps or
 * max_mapped_bytes), ENOMEM, ESYS, ENODEV (device memory, and no backend
 * for its device in this context). */
IPCREF_API ipcref_result ipcref_import(ipcref_peer *p, ipcref_msg *msg,
                                       ipcref_view *out);

/* Releases what an unused message holds: its fds, and its leases when it
 * was exported here (the receiver never got them), even once its peer was
 * freed, as long as its context is alive; the peer, if still there, will
 * send its fds again. NULL is a no-op. */
IPCREF_API void ipcref_msg_free(ipcref_msg *msg);

/* After a message exported here was delivered by the caller's own
 * transport: closes its fds (the transport gave the receiver its own) and
 * forgets it, leaving its leases to the receiver. */
IPCREF_API void ipcref_msg_sent(ipcref_msg *msg);

/* Exports `n` views and sends them in one message over the peer's socket.
 * A blocking socket waits while it is full, or while the peer holds its
 * max_bytes_held (up to the peer's send_timeout_ms for the two waits
 * together: ETIMEDOUT); a non-blocking one says EAGAIN (wanting POLLOUT
 * or IPCREF_WANTS_ROOM, see ipcref_peer_wants). Either way a send that
 * fails took nothing: no lease is left behind. A message a SOCK_STREAM
 * socket took in part was sent (OK): its rest goes before anything else,
 * on the next send or ipcref_peer_flush (meanwhile the peer wants
 * POLLOUT). Errors: as ipcref_export, EPEER (the peer hung up), EAGAIN,
 * ETIMEDOUT. */
IPCREF_API ipcref_result ipcref_send_batch(ipcref_peer *p,
                                           const ipcref_view *views, int n);
IPCREF_API ipcref_result ipcref_send(ipcref_peer *p, const ipcref_view *v);

/* As ipcref_send_batch, with `meta_len` bytes of metadata at `meta` (at
 * most IPCREF_META_MAX) in the same message: the receiver reads them with
 * ipcref_recv_meta beside each view of it. Errors: as ipcref_send_batch;
 * EINVAL (meta NULL with a length, a length over IPCREF_META_MAX), and
 * then nothing is taken. */
IPCREF_API ipcref_result ipcref_send_meta(ipcref_peer *p,
                                          const ipcref_view *views, int n,
                                          const void *meta, size_t meta_len);

/* As ipcref_send, for a view of device memory written by work queued on
 * `stream` (a CUstream / hipStream_t; NULL: the default stream): an event
 * recorded after that work travels with the message, and the receiver's
 * stream waits on it before using the data. The producer never blocks
 * (with HIP 5, which has no interprocess events, the stream is
 * synchronized first). For host views the stream is ignored. */
IPCREF_API ipcref_result ipcref_send_on(ipcref_peer *p, const ipcref_view *v,
                                        void *stream);

/* Receives one message (one view) from the peer's socket and imports it.
 * timeout_ms: -1 waits (a non-blocking socket too); 0 polls, never waits,
 * and says EAGAIN when nothing is there (wanting POLLIN); past a longer
 * wait, ETIMEDOUT (signals that interrupt it do not start it over); below
 * -1, EINVAL. On a SOCK_STREAM socket a record may come in pieces: what
 * came waits in the peer, with its fds, and a later call completes it, so
 * a sender that stops halfway never holds a receive past its timeout. Errors:
 * ETIMEDOUT, EPEER (hung up), EPROTO, ERANGE (a message past the peer's
 * max_maps or max_mapped_bytes: refused, the next one may go), ENOMEM,
 * ESYS, EAGAIN. A batch is received one view per call (see
 * ipcref_peer_poll_fd for event loops). */
IPCREF_API ipcref_result ipcref_recv(ipcref_peer *p, ipcref_view *out,
                                     int timeout_ms);

/* The metadata of the message the view last received from `p` came in
 * (the same for every view of a batch; ipcref_peer_stats says how many of
 * its views wait still), its length into *len: valid until the next
 * receive on `p` or its free. NULL with *len 0 when it had none, nothing
 * was received yet, or `p` is NULL or freed (reported). */
IPCREF_API const void *ipcref_recv_meta(ipcref_peer *p, size_t *len);

/* How many views of the message the last receive from `p` came in wait
 * still in the peer (receive them to have the whole batch; none then
 * waits on the socket). 0 for NULL or a freed peer (reported). */
IPCREF_API int ipcref_recv_pending(ipcref_peer *p);

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
 * producer destroyed that nothing here uses any more (a receive does the
 * latter past opt.retired_maps of them, since freeing the last mapping of
 * a segment takes time in proportion to its size). Empty segments stay
 * cached (see ipcref_ctx_trim). Returns the bytes freed. */
IPCREF_API size_t ipcref_collect(ipcref_ctx *ctx);

/* Gives back to the system the cached segments (see segment_cache),
 * oldest first, until at most `keep_bytes` of them remain, after a sweep;
 * and (on a consumer) unmaps every segment its producer gave back that
 * nothing here uses. ipcref_ctx_trim(ctx, 0) leaves only the memory in
 * use. Returns the bytes given back; 0 for NULL or a freed context. */
IPCREF_API size_t ipcref_ctx_trim(ipcref_ctx *ctx, size_t keep_bytes);

/* Fills *out. Errors: EINVAL. */
IPCREF_API ipcref_result ipcref_ctx_stats(ipcref_ctx *ctx, ipcref_stats *out);

/* An fd that becomes readable when a process this context watches dies (a
 * peer, a consumer holding leases, a holder of a forwarded lease): add it
 * to your own event loop (poll, epoll, select) and call ipcref_ctx_poll
 * when it is readable. There are no hidden threads: deaths are also
 * noticed by the calls on the context (at most once per clock tick) and by
 * ipcref_collect. -1 for NULL. The fd belongs to the context: do not
 * close it. It does not wake for a process watched without a pidfd: every
 * one where there is no pidfd_open (Linux < 5.3, valgrind), and the
 * holders of forwarded leases that consumers name beyond 64 at a time (so
 * that a consumer cannot use up this process's fds). Those deaths are
 * looked for by the calls every 100 ms, by ipcref_collect and by
 * ipcref_ctx_poll, and ipcref_ctx_timeout asks for a call in time. */
IPCREF_API int ipcref_ctx_poll_fd(ipcref_ctx *ctx);

/* How long an event loop may sleep on its fds before it must call into
 * this context again (any call on it, ipcref_collect say), in ms: -1 when
 * nothing waits on time, 0 when something is due now. What waits on time
 * rather than on an fd: a hole in a ring of returned leases (a consumer
 * that died halfway through a return), stepped over 100 ms after it was
 * seen; device releases whose stream work must be checked; a peer's hello
 * awaited until its hello_timeout_ms; processes watched without a pidfd
 * (see ipcref_ctx_poll_fd), looked at every 100 ms. Sweeps first. -1 for
 * NULL or a freed context. */
IPCREF_API int ipcref_ctx_timeout(ipcref_ctx *ctx);

/* Waits up to timeout_ms (-1: forever, 0: not at all) for a watched
 * process to die, then reclaims what every dead one held: the leases of a
 * consumer, the forwarded holds whose holder is gone, and the blocks that
 * only they kept. *freed (may be NULL) gets the bytes freed. Errors:
 * EINVAL (NULL, timeout_ms below -1), ETIMEDOUT (no death was left to handle:
 * none within the wait, or another call handled it first), ESYS. */
IPCREF_API ipcref_result ipcref_ctx_poll(ipcref_ctx *ctx, int timeout_ms,
                                         size_t *freed);

/* 1 while the process on the other side of `p` lives (as far as can be
 * seen without waiting), 0 once it is gone or hung up without a hello, or
 * for NULL. A consumer whose producer died keeps its imported views: they
 * stay mapped and readable, and releasing them still succeeds. */
IPCREF_API int ipcref_peer_alive(ipcref_peer *p);

/* Fills *out with what peer `p` holds from this context (see
 * ipcref_peer_info). Errors: EINVAL (NULL), EDEAD (a freed peer). */
IPCREF_API ipcref_result ipcref_peer_stats(ipcref_peer *p,
                                           ipcref_peer_info *out);

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
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#if defined(__GLIBC__) && !defined(__USE_GNU)
#error                                                                         \
    "ipcref: sharing needs _GNU_SOURCE: include ipcref.h first in the file that defines IPCREF_IMPLEMENTATION, or #define _GNU_SOURCE before its first #include (or define IPCREF_NO_SHARING)"
#else
/* The implementation files of the sharing layer (src/share_*.h) are in. */
#define IPCREF__SHARING_IMPL 1
#endif
#endif /* !IPCREF_NO_SHARING */

#ifdef IPCREF__SHARING_IMPL

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

#endif /* IPCREF__SHARING_IMPL */
