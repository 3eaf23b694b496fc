/* share_state: the sharing layer's data, and the helpers every file after
 * it uses. The producer's private records (watches, blocks, aliases,
 * pools, segments, leases, ledgers); the consumer's cached mappings and
 * imports; the peer and the context; the lock, allocation, memfds,
 * reports and the clock (the shared layouts are their rooms': a ledger's
 * in share_ledger, a channel's in share_channel). A context's fields are
 * guarded by ctx->lock unless their comment says otherwise (atomics; the header
 * queue's hdr_lock). */

#ifdef IPCREF__SHARING_IMPL

/* ---- words ---------------------------------------------------------------
 * block     a piece of a segment that backs one shared buffer made here
 * segment   a sealed memfd (or a device allocation) cut into blocks
 * lease     a peer's hold on a block: a slot of a ledger, live at one
 *           generation; a forwarded lease is a forwarder's peer's hold
 * ledger    the counter file of the leases of one peer (producer side)
 * ring      a ledger's queue of returned and linked leases
 * limbo     the blocks the producer released that leases still hold
 * cache     the empty segments the producer keeps for reuse, under one
 *           byte cap (opt.segment_cache), oldest given back first
 * map       a consumer's mapping of a segment or a ledger, cached
 * import    a consumer's buffer over a leased block
 * watch     a process whose death the context waits for
 * The private code lets go of things in these words, each one meaning:
 *   release   a buffer's release callback ran: its last reference went
 *   end       a lease is over: returned (lease_end, import_end), given
 *             back unused (lease_cancel, leases_give_back), or its
 *             holder died (lease_reclaim)
 *   unlease   a block has one lease less (block_unlease)
 *   put, unref, drop   one hold less on something counted (watch_put,
 *             ctx_unref, alias_drop, hdr_put; map_drop lets go of a
 *             mapping that no cache holds, map_evict takes it out first)
 *   free, destroy   the memory goes: a block back to its segment
 *             (block_free), a segment, ledger or context (_destroy)
 *   retire    a segment its origin destroyed: its consumers unmap it once
 *             unused (retire_announce, import_retire, maps_trim)
 *   trim      give back memory kept for reuse: the oldest cached segments
 *             (cache_trim), a consumer's idle retired mappings (maps_trim)
 *   bury      a freed context or peer, kept marked dead a while
 *   forget    a peer was not sent what it was counted as sent */

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
  int pidfd; /* -1: dead, no pidfd_open here, or one more than a consumer
                may make us open (then kill(pid, 0): see share_watch) */
  int named; /* its pidfd counts in ctx->named_pidfds */
  int dead;
  int refs;
  struct ipcref__watch *next, *prev;
} ipcref__watch;

typedef struct ipcref__block {
  ipcref__segment *seg;
  size_t offset;   /* in the segment */
  size_t size;     /* bytes: the class's block size, or a wrap's own */
  uint32_t leases; /* live leases on it, in any ledger: changed under the
                      lock by atomic stores, so that ipcref__buf_leases
                      may read it without */
  int local;       /* a local buffer still holds it */
  int in_limbo;
  uint32_t index;                                /* in its segment */
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
 * device of one backend. Classes 0..10 are the powers of two from 64 bytes
 * to 64 KiB; above, eight classes per doubling (see ipcref__class_of), up
 * to the largest size a block may have (PTRDIFF_MAX / 2). */
#define IPCREF__CLASSES     379
#define IPCREF__BLOCK_CHUNK 256 /* block descriptors made at once */
#define IPCREF__MIN_BLOCK   64u
#define IPCREF__FINE_FROM   65536u /* classes are fine above this size */
/* opt.segment_size at most: 2^24 blocks of 64 bytes. */
#define IPCREF__SEGMENT_MAX ((size_t)1 << 30)
/* The views ipcref_peer_free reads at most: a 16 MiB ring's records, twice
 * over (a sender that keeps sending is not waited for). */
#define IPCREF__FREE_DRAIN (1L << 19)
#define IPCREF__FOREIGN    UINT32_MAX /* cls: a wrapped allocation */
#define IPCREF__CACHE_MAX  64 /* cached segments at most (fds: 2 each) */
typedef struct ipcref__pool {
  ipcref_backend *be; /* NULL: host memory */
  int32_t dev;
  ipcref__segment *classes[IPCREF__CLASSES]; /* segments with free blocks */
  struct ipcref__pool *next;
} ipcref__pool;

/* A device segment of several VMM allocations (chunks) mapped one after
 * the other: their sizes, and each one's fd once exported (-1 before). */
typedef struct ipcref__chunks {
  int n;
  uint64_t size[IPCREF_CHUNKS_MAX];
  int fd[IPCREF_CHUNKS_MAX];
} ipcref__chunks;

struct ipcref__segment {
  ipcref_ctx *ctx;
  ipcref__pool *pool;
  uint64_t id;         /* never reused in a ctx: the id is its generation too */
  int fd, ro_fd;       /* host: the memfd (and its read-only open) */
  unsigned char *base; /* host: the mapping */
  uint64_t daddr;      /* device: the allocation's address */
  unsigned char handle[IPCREF_HANDLE_BYTES]; /* device: its IPC handle */
  int exported;                              /* handle (or fd) made */
  int by_fd;  /* device: shared by the fd in `fd` (seg_export_fd) */
  int pooled; /* by_fd: a pool's fd, `handle` its data */
  ipcref__chunks *vmm_chunks; /* foreign, in several chunks (else NULL) */
  int leaked;      /* device memory still leased when the context went: never
                      freed (a consumer may have it open) */
  uint32_t nwraps; /* foreign: blocks in it */
  size_t size, block_size;
  uint32_t nblocks, nfree, cls; /* nfree: blocks not in use, made or not;
                                   cls: size class, or IPCREF__FOREIGN */
  int isolated; /* made for one isolated block: never recycled */
  /* Block descriptors are made a chunk at a time, as blocks are first
   * handed out: a segment costs private memory in proportion to what it
   * handed out, not to its size (see ipcref__segment_take). */
  ipcref__block **chunks; /* [nblocks / IPCREF__BLOCK_CHUNK], made lazily */
  uint32_t nmade;         /* blocks [0, nmade) have descriptors */
  uint32_t *free_stack;   /* made blocks that are free; room for nmade */
  uint32_t nstack;
  size_t capstack;
  ipcref__segment *next, *prev;             /* all segments */
  ipcref__segment *class_next, *class_prev; /* with free blocks */
  int in_class;
  int cached; /* empty and kept for reuse: on the context's cache list */
  ipcref__segment *cache_next, *cache_prev; /* newest first */
};

#define IPCREF__LATE 16 /* holes stepped over that a ledger remembers */
/* Holes one drain steps over at most: each scans the ledger's forwarding
 * slots (ipcref__adopt_forwards), so a consumer that makes holes on
 * purpose buys a bounded cost per sweep; the rest wait for the next. */
#define IPCREF__HOLES 4
#define IPCREF__AHEAD 8 /* slots a ledger publishes ahead of their leases */
#define IPCREF__HOLE_MS                                                        \
  100 /* a hole at a ring's tail is waited on this long                        \
       */

typedef struct ipcref__lease {
  ipcref__block *block; /* NULL: free */
  uint32_t gen; /* free: its last lease's, or the one it is published at */
  int holder;   /* forwarded leases: the holder's pid */
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
  uint32_t *free_stack, nfree;   /* free slots of the producer half */
  uint32_t ahead[IPCREF__AHEAD]; /* free slots published live, oldest at
                                    ahead_at (see ipcref__slot_take) */
  uint32_t ahead_at, nahead;
  uint32_t live;        /* leases taken and not ended (not those published) */
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

/* What a mapping holds, and what a message's fd record announces (the
 * values go on the wire): a memfd segment, a ledger, a device segment. */
enum {
  IPCREF__KIND_SEGMENT = 1,
  IPCREF__KIND_LEDGER = 2,
  IPCREF__KIND_DEVICE = 3,
  IPCREF__KIND_DEVICE_FD = 4,    /* on the wire only: a device segment by fd
                                  (its map is a KIND_DEVICE one, by_fd) */
  IPCREF__KIND_DEVICE_POOL = 5,  /* on the wire only: pool memory, by its
                                    pool's fd and its data (by_fd, pooled) */
  IPCREF__KIND_DEVICE_CHUNKS = 6 /* on the wire only: VMM chunks, by an fd
                                    each (by_fd, chunks) */
};

typedef struct ipcref__map {
  int kind; /* IPCREF__KIND_*: segment, ledger or device segment */
  uint64_t origin_nonce, id;
  int origin_pid; /* as its record says */
  int by_pid;     /* who brought it, as the kernel says: the origin itself
                     (by_pid == origin_pid), or a forwarder vouching */
  int fd;         /* kept for forwarding */
  int bell;       /* ledgers: the producer's bell (a datagram socket), rung on
                     a return while it waits for room; kept for forwarding */
  unsigned char *base;
  size_t size;
  int writable;
  uint32_t nslots;    /* ledgers */
  uint32_t *imported; /* ledgers: generation + 1 of the last import */
  ipcref_backend *be; /* device segments: opened by it, at daddr */
  int32_t dev_type, dev_id;
  uint64_t daddr;
  unsigned char handle[IPCREF_HANDLE_BYTES]; /* kept for forwarding */
  int by_fd;  /* device segments: shared by fd (kept in fd), not handle */
  int pooled; /* by_fd: the fd is a pool's, `handle` the allocation's
                 data; unmapped at its last buffer's release */
  ipcref__chunks *vmm_chunks; /* by_fd, in chunks: their fds (kept for
                             forwarding) and sizes; `fd` is -1 */
  int refs;                   /* atomic: imported buffers using it */
  int retired;                /* the origin destroyed it: unmap at refs 0 */
  ipcref_peer *via;           /* whose message brought it, charged for it
                                 (share_index); NULL once that peer is freed */
  struct ipcref__map *next, *prev; /* ctx->maps, or ctx->maps_retired */
  struct ipcref__map *hnext;       /* its chain in ctx->map_index */
} ipcref__map;

typedef struct ipcref__import {
  ipcref_buf buf; /* host memory: the view's buffer, in the same allocation
                     (freed with its header: see ipcref__import_view) */
  int own_buf;    /* 1: `buf` is the view's (host); 0: a buffer of its own */
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

/* A segment or ledger a peer has been sent, by its origin's nonce and a
 * key: its id, shifted to make room for a bit that is 1 for a ledger. */
typedef struct ipcref__sent {
  uint64_t nonce, key;
  int used;   /* a slot of the peer's set (see share_index) */
  int resend; /* sent, but not kept: its fds go again (ipcref__sent_resend) */
} ipcref__sent;
IPCREF__PRIVATE uint64_t ipcref__sent_key(uint64_t id, int is_ledger) {
  return (id << 1) | (uint64_t)(is_ledger ? 1 : 0);
}
#define IPCREF__REFUSED 1024 /* refused segments and ledgers a peer recalls */
#define IPCREF__KEPT    4    /* and refused ledgers it keeps mapped */

struct ipcref_peer {
  uint32_t magic; /* IPCREF__ALIVE; IPCREF__DEAD once freed (kept a while:
                     see ipcref__peer_bury) */
  ipcref_ctx *ctx;
  int fd, pid, uid, sock_type;
  ipcref__watch *watch; /* the other process (from its hello) */
  uint64_t nonce;       /* its context (from its hello) */
  uint64_t serial;      /* this peer's in ctx (from 1): what a message
                           exported through it names (share_msg) */
  int origin_retired;   /* freed: its mappings here were retired */
  int hello; /* 0: the other side's hello not read yet; 1: read; -1: bad;
                -2: refused (a uid not allowed, or no hello in time) */
  ipcref_peer_options opt;
  long hello_since;   /* when a call first needed the hello (0: none yet) */
  int wants;          /* POLLIN / POLLOUT: what the last EAGAIN waits for */
  unsigned char *out; /* a stream's record the socket took only in part: */
  size_t out_len, out_pos; /* the rest, sent before anything else */
  ipcref__ledger *ledger;  /* the current one for exports to this peer */
  ipcref__sent *sent;      /* what the other side has been sent: a set of
                              capsent slots, nsent used (share_index) */
  size_t nsent, capsent;
  ipcref__sent sent_last[2]; /* the segment [0] and ledger [1] last found
                                or added there (used 0: none) */
  uint64_t *retired;         /* own segments destroyed since, to announce */
  size_t nretired, capretired;
  ipcref_view pending[64]; /* received views not handed out yet */
  int npending, pending_pos;
  size_t held_bytes;          /* of the blocks its leases (made here) hold */
  size_t nmaps, mapped_bytes; /* what its messages keep mapped here */
  ipcref__sent *refused;      /* what the last messages refused for the caps
                                 brought (a ring of IPCREF__REFUSED, made on the
                                 first refusal) */
  unsigned refused_at, kept_at;
  ipcref__map *kept[IPCREF__KEPT]; /* ledgers they brought, kept for the
                                      returns (a ring) */
  int room_wait;    /* a send was refused for opt.max_bytes_held */
  size_t room_need; /* what that send adds (under ctx->lock) */
  int room_rung;    /* its poll fd's flag set for room (ipcref__room_ring;
                       under ctx->lock) */
  unsigned char meta[IPCREF_META_MAX]; /* the last message's metadata */
  size_t meta_len;
  unsigned char *in; /* a stream's record so far, its length first (see
                        ipcref__stream_fill; made on first use) */
  size_t in_len;
  int in_fds[IPCREF_MSG_MAX_FDS], in_nfds; /* the fds that came with it */
  int in_pid, in_uid;                      /* and its sender's credentials */
  struct ipcref__chan_tx *tx;     /* the channels (share_channel): to it, */
  struct ipcref__chan_rx *rx;     /* from it (its doorbell: bell_in, or -1) */
  int bell_in, tx_off, rx_broken; /* none made: socket only; it broke its */
  uint64_t sent_channel, sent_socket; /* messages sent by each path */
  int ring_left, flag_on; /* the poll fd's flag: see ipcref__batch_signal */
  int poll_fd;  /* ipcref_peer_poll_fd: an epoll fd over the socket and */
  int batch_fd; /* an eventfd, set while a batch has views left; both made
                   on its first call (-1 before) */
  ipcref_peer *next, *prev;
};

/* Headers of the shared buffers made here (see ipcref__hdr_get). */
typedef struct ipcref__hdr {
  ipcref_buf buf; /* first: the buffer handle is the header's address */
  struct ipcref__hdr *next;
} ipcref__hdr;
#define IPCREF__HDR_CHUNK 64
typedef struct ipcref__hdr_chunk {
  struct ipcref__hdr_chunk *next;
  ipcref__hdr h[IPCREF__HDR_CHUNK];
} ipcref__hdr_chunk;

/* The context's lock: a futex word, 0 free, 1 held, 2 held and maybe
 * waited for (U. Drepper, "Futexes Are Tricky", its third mutex). Taking
 * a free lock is one compare-and-swap and giving it back one exchange,
 * with no call: each side of a hand-off takes it once, and
 * pthread_mutex_lock with _unlock cost 55 instructions a pair (callgrind,
 * bench/maps.c; so, 10). Acquire when taken, release when given back, as
 * a mutex; a waiter sleeps in FUTEX_WAIT, private to the process. */
typedef struct ipcref__mutex {
  uint32_t word;
} ipcref__mutex;

IPCREF__PRIVATE IPCREF__NOINLINE void ipcref__mutex_wait(ipcref__mutex *m,
                                                         uint32_t c) {
  /* 2 from here on: whoever gives it back must wake a waiter. */
  if (c != 2u) c = __atomic_exchange_n(&m->word, 2u, __ATOMIC_ACQUIRE);
  while (c != 0u) {
    (void)syscall(SYS_futex, &m->word, FUTEX_WAIT_PRIVATE, 2u, NULL, NULL, 0);
    c = __atomic_exchange_n(&m->word, 2u, __ATOMIC_ACQUIRE);
  }
}

IPCREF__PRIVATE IPCREF__INLINE void ipcref__mutex_lock(ipcref__mutex *m) {
  uint32_t c = 0u;
  if (!__atomic_compare_exchange_n(&m->word, &c, 1u, 0, __ATOMIC_ACQUIRE,
                                   __ATOMIC_RELAXED))
    ipcref__mutex_wait(m, c);
}

IPCREF__PRIVATE IPCREF__INLINE void ipcref__mutex_unlock(ipcref__mutex *m) {
  if (__atomic_exchange_n(&m->word, 0u, __ATOMIC_RELEASE) == 2u)
    (void)syscall(SYS_futex, &m->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

#define IPCREF__MAX_BACKENDS 8 /* per context: one per device type */

struct ipcref_ctx {
  uint32_t magic; /* IPCREF__ALIVE; IPCREF__DEAD once freed (IPCREF_CHECKED:
                     kept a while in the quarantine) */
  ipcref__mutex lock;
  ipcref_ctx_options opt;
  uint64_t nonce;
  int pid;
  unsigned fork_gen; /* the fork generation it was made in (see fork) */
  uint64_t next_id;
  ipcref__segment *segments;
  ipcref__pool host;   /* host memory's size classes */
  ipcref__pool *pools; /* each device's */
  ipcref_backend *backends[IPCREF__MAX_BACKENDS];
  ipcref__block *released;         /* wraps to hand back after the unlock */
  ipcref__alias *unpinned;         /* aliases to end after the unlock */
  struct ipcref__import *deferred; /* device releases waiting for a fence */
  struct ipcref__import *finished; /* and those to return after the unlock */
  int owner_gone;                  /* atomic: ipcref_ctx_free was called */
  ipcref__ledger *ledgers;
  ipcref__map *maps, *maps_retired; /* the cache (see share_index) */
  ipcref__map **map_index;          /* by (ledger?, nonce, id), chained */
  size_t map_buckets, nmaps_indexed;
  int map_index_off; /* out of memory once: lookups walk the lists */
  struct ipcref__map *map_last[2]; /* the segment and the ledger found
                                      last (a hand-off asks for the same
                                      ones as the one before, mostly) */
  ipcref_peer *peers;
  ipcref__block *limbo;
  ipcref__segment *cache, *cache_oldest; /* empty segments kept, newest
                                            first (bytes: st.cached_bytes) */
  int ncached;
  ipcref_stats st;
  int no_pidfd;     /* pidfd_open is missing here: deaths seen by pid */
  int named_pidfds; /* open pidfds of holders a consumer named */
  int epfd;         /* the poll fd: the watches' pidfds */
  ipcref__watch *watches;
  uint64_t reaped;  /* peer_deaths when the last reap ran */
  long pump_tick;   /* the clock tick of the last death check */
  long poll_tick;   /* and of the last kill(pid, 0) round */
  uint32_t *uids;   /* allowed besides our own (opt.allow_uids) */
  uint64_t refused; /* atomic: st.refused, counted outside the lock */
  int uid;
  int refs; /* atomic: the owner's, and one per live shared or imported
               buffer; the context is torn down when the last one goes */
  pthread_mutex_t hdr_lock;          /* guards the header queue below; never
                                        held with ctx->lock taken after it */
  ipcref__hdr_chunk *hdr_chunks;     /* every header, freed with the context */
  ipcref__hdr *hdr_first, *hdr_last; /* released ones, oldest first */
  size_t hdr_free;
  ipcref_peer *dead_peers; /* freed, marked dead (see ipcref__peer_bury) */
  int bell_rx, bell_tx;    /* the ledgers' bell: a datagram socketpair; the
                              consumers get bell_tx (-1 until a ledger) */
  int room_armed;          /* the ledgers' `waiting` is set (see room) */
  int room_alloc;          /* an allocation was refused under max_bytes */
  int ndead_peers;
  uint64_t peer_serials; /* the last peer's serial */
  ipcref_ctx *live_next; /* the process's live contexts (ipcref__live) */
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

#define IPCREF__LOCK(c)   ipcref__mutex_lock(&(c)->lock)
#define IPCREF__UNLOCK(c) ipcref__unlock(c)

/* ---- forward declarations ----------------------------------------------
 * The files follow a hand-off from the producer's allocation to the
 * consumer's release; these steps of the consumer's side are called from
 * earlier rooms: the unlock returns the device imports whose fence is
 * done, ipcref_buf_is_shared knows an imported buffer by its release
 * callback (share_import), and the peer's calls (share_peer, share_loop)
 * reach its channels (share_channel). */
IPCREF__PRIVATE void ipcref__import_end(struct ipcref__import *imp);
IPCREF__PRIVATE void ipcref__import_release(void *user, void *data);
IPCREF__PRIVATE void ipcref__chan_closing(ipcref_peer *p);
IPCREF__PRIVATE void ipcref__chan_poll(ipcref_peer *p);
IPCREF__PRIVATE void ipcref__chan_close(ipcref_peer *p);
IPCREF__PRIVATE int ipcref__chan_tx_broken(const ipcref_peer *p);

/* Unlocks the context, then does what must not run under it, since each
 * may call back into ipcref: the aliases whose last hold went end (their
 * callback runs, their source is released), the wrapped allocations whose
 * last hold went go back to their owners, and the device imports whose
 * fence is done return their leases. */
IPCREF__PRIVATE IPCREF__NOINLINE void ipcref__unlock_and_run(ipcref_ctx *ctx) {
  ipcref__block *b = ctx->released;
  struct ipcref__import *imp = ctx->finished;
  ipcref__alias *a = ctx->unpinned;
  ctx->released = NULL;
  ctx->finished = NULL;
  ctx->unpinned = NULL;
  ipcref__mutex_unlock(&ctx->lock);
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
    ipcref__import_end(imp);
    imp = next;
  }
}

/* IPCREF__UNLOCK: most unlocks have nothing to run after (the lists are
 * the lock's, read before it goes). */
IPCREF__PRIVATE void ipcref__unlock(ipcref_ctx *ctx) {
  if (ctx->released || ctx->finished || ctx->unpinned)
    ipcref__unlock_and_run(ctx);
  else
    ipcref__mutex_unlock(&ctx->lock);
}

IPCREF__PRIVATE void *ipcref__zalloc(size_t n) {
  void *p = IPCREF_MALLOC(n ? n : 1);
  if (p) memset(p, 0, n ? n : 1);
  return p;
}

/* Grows *arr (elements of `size` bytes) to hold `need`. 0 on ENOMEM. */
IPCREF__PRIVATE int ipcref__grow(void **arr, size_t *cap, size_t need,
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
IPCREF__PRIVATE int ipcref__memfd(const char *name, size_t size,
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
IPCREF__PRIVATE void ipcref__ctx_report(ipcref_ctx *ctx, ipcref_result code,
                                        const char *message) {
  if (ctx->opt.error_hook.fn)
    ctx->opt.error_hook.fn(ctx->opt.error_hook.user, code, message);
  else
    ipcref__report(code, message);
}

/* 1 when the context or peer whose mark is `magic` is still usable: not
 * freed (it then waits, marked dead and poisoned but for the mark, in the
 * quarantine) and, for a context, not given up by its owner (*owner_gone;
 * read only past the mark). Else the call is reported, naming the public
 * function `fn`. */
IPCREF__PRIVATE int ipcref__usable(const uint32_t *magic, const int *owner_gone,
                                   const char *fn, const char *what) {
  if (__atomic_load_n(magic, __ATOMIC_RELAXED) == IPCREF__ALIVE &&
      !(owner_gone && __atomic_load_n(owner_gone, __ATOMIC_RELAXED)))
    return 1;
  ipcref__report_in(IPCREF_EDEAD, fn, what);
  return 0;
}

/* The context and peer checks of every public call: alive, and (see
 * share_watch) this process's own, not a forked child's copy. */
#define IPCREF__CTX_USABLE(c)                                                  \
  (ipcref__usable(&(c)->magic, &(c)->owner_gone, __func__,                     \
                  "the context was already freed") &&                          \
   ipcref__own((c), __func__))
#define IPCREF__PEER_USABLE(p, fn)                                             \
  (ipcref__usable(&(p)->magic, NULL, (fn), "the peer was already freed") &&    \
   ipcref__own((p)->ctx, (fn)))

/* Milliseconds of the coarse monotonic clock (a vDSO read, no system
 * call; it moves once per clock tick). */
IPCREF__PRIVATE long ipcref__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif /* IPCREF__SHARING_IMPL */
