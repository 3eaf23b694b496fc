/* share_channel: the channel, a ring of hand-off records in shared memory
 * from a peer's sender to its receiver, beside the socket: its layout; the
 * sender's half (made on its first send, announced over the socket,
 * records pushed without a system call while the receiver is awake). The
 * receiver's half, from its adoption of that announcement to closing
 * both, is share_chan_recv's. A peer is used by one thread at a time,
 * and its halves are its own: no lock here. */

#ifdef IPCREF__SHARING_IMPL

/* ---- the channel ----------------------------------------------------------
 * Two memfds and a doorbell, made by the sender and passed over the
 * socket in one setup record ("IPCC", version, ring bytes; three fds):
 *
 *   ring      the sender's: a 64-byte header (magic, version, ring bytes,
 *             `tail`, the bytes published, `sockets`, the messages sent
 *             on the socket since the setup, and `cpus`, the CPUs the
 *             sender may run on, a hint for the receiver's spin), then
 *             the ring. Sealed against resizing and against any new
 *             writable mapping (F_SEAL_FUTURE_WRITE): the receiver maps
 *             it read only.
 *   control   the receiver's words: `head`, the bytes it consumed (its
 *             own cache line: it moves with every record), then `asleep`,
 *             set while it sleeps (how: 1 on the doorbell, 2 on the
 *             futex), `closed`, set when it frees its peer (read by
 *             the sender on every record: a line that rarely changes),
 *             and `drains`, counted up each time it reads what the
 *             doorbell holds. The sender trusts nothing it reads there,
 *             and writes only `asleep`, from 2 to 0, to wake a dozing
 *             receiver.
 *   doorbell  a stream socket: the sender sends one byte on it after a
 *             record while `asleep` is 1 (or anything but 0 and 2).
 *             MSG_DONTWAIT is the call's own, so the receiver cannot make
 *             it block (an eventfd's O_NONBLOCK is the shared file's,
 *             which the receiver could clear, and its counter it could
 *             fill); it is an fd, so the peer's poll fd can wait on it;
 *             and a sleeper waits and drains it in one recv, which ends
 *             too when the sender is gone (end of file).
 *
 * Two ways to sleep, then. A receive that finds the ring empty, once it
 * has spun, first dozes: `asleep` 2 and a FUTEX_WAIT on that word, which
 * the sender ends by a compare-and-swap of it to 0 (a receiver that
 * changed it meanwhile gets the doorbell instead) and a FUTEX_WAKE:
 * nothing to allocate, queue and drain, a tenth off a sleeping hand-off
 * (bench/, chan_nospin). But a futex is no fd and does not end when its
 * sender dies: a receiver dozes the first IPCREF__DOZE_MS of an idle
 * stretch only, then sleeps on the doorbell, as the poll fd always does;
 * a sender's death is seen within that much.
 *
 * A record is 16 bytes (u32 length, u32 kind, u64 the socket messages
 * sent before it) and its body, padded to a multiple of 64 bytes
 * (IPCREF__CHAN_LINE); it may wrap. Records start on cache lines: a
 * spinning receiver loads the first line of the record due next with
 * every look at the tail, and the two lines then cross CPUs together (see
 * ipcref__chan_looks), where a record sharing its first line with the end
 * of the one before would make that line cross twice. Two kinds:
 *
 *   0 message  the body is a message in the wire format;
 *   1 patch    the body is u16 offset, u16 n, and n bytes (1..44): the
 *              message is the ring's last one with those bytes replaced.
 *
 * A producer that sends the same view again sends a message that differs
 * from the last in the lease's slot and generation only (another view of
 * the same shape in the same segment: in its block's offset too, and new
 * metadata of the same length in those bytes): a patch then takes one
 * line, and the receiver has all of it when the tail's line comes, where
 * a message would make it wait for two more lines (a spinning hand-off
 * 6-20% faster: bench/lines.c). Both sides keep the ring's last message,
 * the receiver in its copy of the record, the sender when it has at most
 * IPCREF__CHAN_LAST bytes; the receiver applies a patch to its own copy
 * and imports the result with every check a message gets. The setup says
 * so: layout 2 (0 had 8-byte records, 1 no patches; this receiver refuses
 * both).
 *
 * A message that needs fds (a new segment or ledger) still goes on the
 * socket, and so does one that finds the ring full (the sender never
 * waits for the receiver here); `sockets` and each record's count keep
 * the order of both paths: the receiver reads the socket's next message
 * whenever it has read fewer of them than the next record (or, with the
 * ring empty, the header) says were sent.
 *
 * Memory: ring_bytes (default 64 KiB, at most 16 MiB) plus 4 KiB, a
 * socketpair and the two copies of the last message per peer and
 * direction, made on the first send. */
#define IPCREF__CHAN_MAGIC       0x52435049u /* "IPCR" */
#define IPCREF__CHAN_SETUP_MAGIC 0x43435049u /* "IPCC" */
#define IPCREF__CHAN_HDR         64u
#define IPCREF__CHAN_CTL         4096u
#define IPCREF__CHAN_REC         16u
#define IPCREF__CHAN_LINE        64u /* records start on cache lines */
#define IPCREF__CHAN_LAYOUT      2u  /* the setup's word for that */
#define IPCREF__CHAN_MSG         0u  /* a record's kinds */
#define IPCREF__CHAN_PATCH       1u
/* The bytes a patch replaces: its u16 offset and count and these fill
 * the line after the record's header (44). */
#define IPCREF__CHAN_PATCH_MAX   (IPCREF__CHAN_LINE - IPCREF__CHAN_REC - 4u)
#define IPCREF__CHAN_LAST        512u /* the sender's copy of the last */
#define IPCREF__CHAN_SETUP_BYTES 12u
#define IPCREF__CHAN_DEFAULT     ((size_t)64 << 10)
#define IPCREF__CHAN_MIN         ((size_t)4 << 10)
#define IPCREF__CHAN_MAX         ((size_t)16 << 20)
#define IPCREF__SPIN_MAX_NS      50000L /* the adaptive spin's longest */
#define IPCREF__SPIN_CAP_US      10000  /* the longest spin an option asks */
#define IPCREF__DOZE_MS          50     /* an idle stretch's futex doze */
#define IPCREF__RECOUNT_MS       50     /* a counted message's wait at once */
#define IPCREF__ASLEEP_BELL      1u     /* `asleep`: ring the doorbell */
#define IPCREF__ASLEEP_FUTEX     2u     /* `asleep`: wake the futex */

typedef struct ipcref__chan_hdr {
  uint32_t magic, version, bytes, zero;
  uint64_t tail;    /* atomic: bytes published */
  uint64_t sockets; /* atomic: messages sent on the socket since setup */
  uint64_t cpus;    /* the sender's CPUs 0..63 (bit i: CPU i; 0: unknown) */
  uint64_t reserved[3];
} ipcref__chan_hdr;

typedef struct ipcref__chan_ctl {
  uint64_t head; /* atomic: bytes the receiver consumed */
  uint64_t pad[7];
  uint32_t asleep; /* atomic: nonzero while the receiver sleeps (how) */
  uint32_t closed; /* atomic: nonzero once the receiver freed its peer */
  uint32_t drains; /* atomic: the doorbell's reads that found bytes */
} ipcref__chan_ctl;

/* The sender's half. */
struct ipcref__chan_tx {
  unsigned char *map; /* the ring memfd, read-write */
  ipcref__chan_ctl *ctl;
  size_t bytes; /* of the ring (a power of two) */
  uint64_t tail, sockets;
  uint64_t head;        /* the receiver's, as last read: reread when full */
  int doorbell;         /* the sending end */
  int broken;           /* the receiver's words made no sense: socket only */
  int bell_full;        /* a ring found the doorbell full (see chan_knock) */
  uint32_t bell_drains; /* `drains` as it was before that ring */
  size_t last_len;      /* the ring's last message, when it fits (else 0) */
  unsigned char last[IPCREF__CHAN_LAST];
};

/* The receiver's half. */
struct ipcref__chan_rx {
  const unsigned char *map; /* the ring memfd, read only */
  ipcref__chan_ctl *ctl;
  size_t bytes;
  uint64_t head, sockets; /* consumed; socket messages read since setup */
  int armed;              /* what `asleep` was set to (0: awake) */
  int hung;         /* the sender hung up: the socket is read to its end */
  int counted;      /* the socket message due next was counted by the sender */
  long spin;        /* ns the next wait spins first */
  int spin_opt;     /* the peer's spin_us it was set from */
  int sleeps;       /* waits that slept since the spin was cut to 0 */
  int64_t dozed_ns; /* this idle stretch's futex doze so far */
  unsigned char *rec; /* the record being imported (a private copy) */
  size_t rec_len;
  uintptr_t lease_at; /* the ledger word of the last lease imported (a
                         hint: see ipcref__chan_prefetch) */
};

/* The wire word at `at` (a multiple of 8) of a ring of `bytes`. */
IPCREF__PRIVATE uint64_t ipcref__chan_word(const unsigned char *ring,
                                           size_t bytes, uint64_t at) {
  uint64_t v;
  memcpy(&v, ring + (size_t)(at & (bytes - 1)), 8);
  return v;
}

/* Copies `n` bytes between a private buffer and the ring at `at`, which
 * may wrap: to the ring (`put`) or from it. */
IPCREF__PRIVATE void ipcref__chan_copy(unsigned char *ring, size_t bytes,
                                       uint64_t at, unsigned char *buf,
                                       size_t n, int put) {
  size_t off = (size_t)(at & (bytes - 1)), first = bytes - off;
  if (first > n) first = n;
  if (put) {
    memcpy(ring + off, buf, first);
    if (n > first) memcpy(ring, buf + first, n - first);
  } else {
    memcpy(buf, ring + off, first);
    if (n > first) memcpy(buf + first, ring, n - first);
  }
}

/* The ring bytes a message of `len` bytes takes: its record, padded to
 * the next cache line. */
IPCREF__PRIVATE uint64_t ipcref__chan_need(size_t len) {
  return ((uint64_t)IPCREF__CHAN_REC + len + IPCREF__CHAN_LINE - 1u) &
         ~(uint64_t)(IPCREF__CHAN_LINE - 1u);
}

/* ---- the sender -----------------------------------------------------------
 */

/* The ring's size for options `o`: 0 for none. */
IPCREF__PRIVATE size_t ipcref__chan_size(const ipcref_peer_options *o) {
  size_t want = o->ring_bytes, n = IPCREF__CHAN_MIN;
  if (want == IPCREF_KEEP_NONE) return 0;
  if (!want) return IPCREF__CHAN_DEFAULT;
  while (n < want) n *= 2;
  return n;
}

IPCREF__PRIVATE void ipcref__chan_tx_free(struct ipcref__chan_tx *t) {
  if (!t) return;
  if (t->map) munmap(t->map, IPCREF__CHAN_HDR + t->bytes);
  if (t->ctl) munmap(t->ctl, IPCREF__CHAN_CTL);
  if (t->doorbell >= 0) close(t->doorbell);
  IPCREF_FREE(t);
}

/* This process's CPUs 0..63 as a mask (0: unknown), and how many it may
 * run on (*n, when not NULL). */
IPCREF__PRIVATE uint64_t ipcref__cpus(int *n) {
  cpu_set_t set;
  uint64_t m = 0;
  int i;
  if (n) *n = 0;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  for (i = 0; i < 64; i++)
    if (CPU_ISSET(i, &set)) m |= (uint64_t)1 << i;
  if (n) *n = CPU_COUNT(&set);
  return m;
}

/* Makes the sender's half and its setup record (fds[3]: the ring, the
 * control words, the doorbell's receiving end, for the socket to carry;
 * the caller closes them once sent). */
IPCREF__PRIVATE ipcref_result ipcref__chan_make(size_t bytes,
                                                struct ipcref__chan_tx **out,
                                                ipcref_msg *setup) {
  struct ipcref__chan_tx *t;
  ipcref__chan_hdr *h;
  unsigned char *ctl = NULL;
  ipcref__wire w;
  int sv[2];
  t = (struct ipcref__chan_tx *)ipcref__zalloc(sizeof *t);
  if (!t) return IPCREF_ENOMEM;
  t->doorbell = -1;
  t->bytes = bytes;
  setup->nfds = 0;
  setup->fds[0] =
      ipcref__memfd("ipcref-ring", IPCREF__CHAN_HDR + bytes, 1, &t->map);
  if (setup->fds[0] < 0) goto fail;
  setup->nfds = 1;
  setup->fds[1] = ipcref__memfd("ipcref-ring-ctl", IPCREF__CHAN_CTL, 0, &ctl);
  if (setup->fds[1] < 0) goto fail;
  setup->nfds = 2;
  t->ctl = (ipcref__chan_ctl *)(void *)ctl;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv))
    goto fail;
  setup->fds[2] = sv[0];
  setup->nfds = 3;
  t->doorbell = sv[1];
  h = (ipcref__chan_hdr *)(void *)t->map;
  h->magic = IPCREF__CHAN_MAGIC;
  h->version = IPCREF__MSG_VERSION;
  h->bytes = (uint32_t)bytes;
  h->cpus = ipcref__cpus(NULL);
  ipcref__wire_init(&w, setup->bytes, sizeof setup->bytes);
  ipcref__wire_put(&w, IPCREF__CHAN_SETUP_MAGIC, 4);
  ipcref__wire_put(&w, IPCREF__MSG_VERSION, 2);
  ipcref__wire_put(&w, IPCREF__CHAN_LAYOUT, 2);
  ipcref__wire_put(&w, bytes, 4);
  setup->len = w.pos;
  setup->origin_ctx = setup->origin_peer = 0;
  *out = t;
  return IPCREF_OK;
fail:
  while (setup->nfds > 0) close(setup->fds[--setup->nfds]);
  ipcref__chan_tx_free(t);
  return IPCREF_ESYS;
}

/* After a record or a socket message: a dozing receiver's futex woken,
 * or a sleeping one's doorbell rung. Seq-cst, paired with the receiver's
 * in ipcref__chan_arm: either this load sees `asleep`, or its look after
 * setting it sees the record. A dozer's word goes to 0 before the wake,
 * so that a FUTEX_WAIT not yet begun returns at once. Neither call can
 * block, whatever the receiver wrote. A doorbell found full holds rings
 * nobody read: no more are sent until the receiver says it is awake, or
 * that it read the doorbell since (`drains` moved: a receiver may read it
 * and sleep again between two records, never seen awake; a receiver that
 * says it sleeps and never reads its doorbell would cost a system call a
 * record). The acquire pairs with the receiver's arming: a sender that
 * sees it asleep again sees the reads it made before. */
IPCREF__PRIVATE void ipcref__chan_knock(struct ipcref__chan_tx *t) {
  uint32_t a, drains;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  a = __atomic_load_n(&t->ctl->asleep, __ATOMIC_ACQUIRE);
  if (a == 0) {
    t->bell_full = 0;
    return;
  }
  if (a == IPCREF__ASLEEP_FUTEX) {
    if (__atomic_compare_exchange_n(&t->ctl->asleep, &a, 0u, 0,
                                    __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
      (void)syscall(SYS_futex, &t->ctl->asleep, FUTEX_WAKE, 1, NULL, NULL, 0);
      return;
    }
    if (a == 0) return; /* it woke meanwhile */
  }
  drains = __atomic_load_n(&t->ctl->drains, __ATOMIC_RELAXED);
  if (t->bell_full && drains == t->bell_drains) return;
  t->bell_full = send(t->doorbell, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
                 (errno == EAGAIN || errno == EWOULDBLOCK);
  /* Loaded before the send: the receiver's next read moves it past. */
  t->bell_drains = drains;
}

/* The place (0..7) of the first and of the last byte in which two words
 * loaded from memory differ, given `x`, their exclusive or (not 0). */
IPCREF__PRIVATE IPCREF__INLINE size_t ipcref__byte_first(uint64_t x) {
  return (size_t)(IPCREF__WIRE_LE ? __builtin_ctzll(x) : __builtin_clzll(x)) /
         8u;
}

IPCREF__PRIVATE IPCREF__INLINE size_t ipcref__byte_last(uint64_t x) {
  return 7u -
         (size_t)(IPCREF__WIRE_LE ? __builtin_clzll(x) : __builtin_ctzll(x)) /
             8u;
}

/* Where `msg` (`len` bytes) differs from the ring's last message: the
 * span's length, its start in *at, when a patch can say it (the same
 * length, and 1..IPCREF__CHAN_PATCH_MAX bytes apart), else 0. Word by
 * word from each end (two words a step from the front), the differing
 * byte found in its word by counting zero bits: a view's message differs
 * in a few bytes inside. (Finding them byte by byte took 176 of a
 * hand-off's 2520 instructions under callgrind, bench/maps.c; so, 133.) */
IPCREF__PRIVATE size_t ipcref__chan_diff(const struct ipcref__chan_tx *t,
                                         const unsigned char *msg, size_t len,
                                         size_t *at) {
  size_t lo = 0, hi = len;
  uint64_t a, b;
  if (len != t->last_len || len == 0) return 0;
  for (; lo + 16 <= len; lo += 16) { /* two words a step */
    uint64_t a1, b1;
    memcpy(&a, msg + lo, 8);
    memcpy(&b, t->last + lo, 8);
    memcpy(&a1, msg + lo + 8, 8);
    memcpy(&b1, t->last + lo + 8, 8);
    if ((a ^ b) | (a1 ^ b1)) break;
  }
  for (;; lo += 8) {
    if (lo + 8 > len) { /* the last few bytes */
      while (lo < len && msg[lo] == t->last[lo]) lo++;
      if (lo == len) return 0; /* the same message: never a patch of nothing */
      break;
    }
    memcpy(&a, msg + lo, 8);
    memcpy(&b, t->last + lo, 8);
    if (a != b) {
      lo += ipcref__byte_first(a ^ b);
      break;
    }
  }
  /* The bytes below lo are the same, and msg[lo] differs: a word that
   * reaches down past lo still finds the last byte that differs, and hi
   * stops above lo. */
  for (;; hi -= 8) {
    if (hi < 8) {
      while (msg[hi - 1] == t->last[hi - 1]) hi--;
      break;
    }
    memcpy(&a, msg + hi - 8, 8);
    memcpy(&b, t->last + hi - 8, 8);
    if (a != b) {
      hi = hi - 8 + ipcref__byte_last(a ^ b) + 1;
      break;
    }
  }
  if (hi - lo > IPCREF__CHAN_PATCH_MAX) return 0;
  *at = lo;
  return hi - lo;
}

/* Writes the record of `msg` at the tail, a patch of `n` bytes at `at`
 * when n is not 0 (see ipcref__chan_diff), and keeps what the ring's last
 * message now is. */
IPCREF__PRIVATE void ipcref__chan_write(struct ipcref__chan_tx *t,
                                        const unsigned char *msg, size_t len,
                                        size_t at, size_t n) {
  unsigned char rec[IPCREF__CHAN_REC], *ring = t->map + IPCREF__CHAN_HDR;
  if (n) { /* one line, written in place: records start on lines */
    unsigned char *line = ring + (size_t)(t->tail & (t->bytes - 1));
    ipcref__le_put(line, 4 + n, 4);
    ipcref__le_put(line + 4, IPCREF__CHAN_PATCH, 4);
    ipcref__le_put(line + 8, t->sockets, 8);
    ipcref__le_put(line + IPCREF__CHAN_REC, at, 2);
    ipcref__le_put(line + IPCREF__CHAN_REC + 2, n, 2);
    memcpy(line + IPCREF__CHAN_REC + 4, msg + at, n);
    memcpy(t->last + at, msg + at, n);
    return;
  }
  ipcref__le_put(rec, len, 4);
  ipcref__le_put(rec + 4, IPCREF__CHAN_MSG, 4);
  ipcref__le_put(rec + 8, t->sockets, 8);
  ipcref__chan_copy(ring, t->bytes, t->tail, rec, IPCREF__CHAN_REC, 1);
  ipcref__chan_copy(ring, t->bytes, t->tail + IPCREF__CHAN_REC,
                    (unsigned char *)(uintptr_t)msg, len, 1);
  t->last_len = len <= sizeof t->last ? len : 0;
  if (t->last_len) memcpy(t->last, msg, len);
}

/* Pushes a message of `len` bytes: 1 when it is in the ring, 0 when it
 * must go on the socket (the ring is full, or its receiver broke it). */
IPCREF__PRIVATE int ipcref__chan_push(ipcref_peer *p, const unsigned char *msg,
                                      size_t len) {
  struct ipcref__chan_tx *t = p->tx;
  ipcref__chan_hdr *h = (ipcref__chan_hdr *)(void *)t->map;
  size_t at = 0, n;
  uint64_t head, used, need;
  if (t->broken) return 0;
  n = ipcref__chan_diff(t, msg, len, &at);
  need = ipcref__chan_need(n ? 4 + n : len);
  if (need <= t->bytes - (t->tail - t->head)) goto room; /* as last seen */
  /* Acquire: the receiver copied what it consumed before it said so. Read
   * only when the ring looks full: the line moves with every record. */
  head = __atomic_load_n(&t->ctl->head, __ATOMIC_ACQUIRE);
  used = t->tail - head;
  /* It cannot have read that, or stopped within a record. */
  if (used > t->bytes || (head & (IPCREF__CHAN_LINE - 1u))) {
    t->broken = 1;
    IPCREF__LOCK(p->ctx);
    ipcref__ctx_report(p->ctx, IPCREF_EPROTO,
                       "channel closed: the receiver's read index is out of "
                       "range (its messages go on the socket)");
    IPCREF__UNLOCK(p->ctx);
    return 0;
  }
  t->head = head;
  if (need > t->bytes - used) return 0; /* full: the socket takes it */
room:
  ipcref__chan_write(t, msg, len, at, n);
  IPCREF__STEP("channel push");
  t->tail += need;
  /* Release: the record's bytes before the tail that publishes them. */
  __atomic_store_n(&h->tail, t->tail, __ATOMIC_RELEASE);
  ipcref__chan_knock(t);
  return 1;
}

/* 1 when the receiver is gone: it freed its peer (`closed`), or its
 * process died (seen by the death check every call makes once per clock
 * tick). A send then says EPEER, as the socket would, instead of leaving
 * a lease in a ring nobody reads. Without a system call. */
IPCREF__PRIVATE int ipcref__chan_gone(const ipcref_peer *p) {
  return __atomic_load_n(&p->tx->ctl->closed, __ATOMIC_RELAXED) ||
         (p->watch && __atomic_load_n(&p->watch->dead, __ATOMIC_RELAXED));
}

/* A message goes on the socket while the channel is up: counted before
 * it is sent (`on` 1), so that the receiver reads it before the records
 * pushed after it, and never finds the socket's message before the count
 * that says it is due; then (`on` 0) the doorbell once it went (`sent`),
 * or the count taken back if nothing of it went (no record was pushed in
 * between: a peer is one thread's at a time; a receiver that read the
 * count waits for its message IPCREF__RECOUNT_MS at a time, and looks at
 * the count again in between). */
IPCREF__PRIVATE void ipcref__chan_count(ipcref_peer *p, int on, int sent) {
  struct ipcref__chan_tx *t = p->tx;
  if (on || !sent) {
    t->sockets += on ? 1u : (uint64_t)-1;
    __atomic_store_n(&((ipcref__chan_hdr *)(void *)t->map)->sockets, t->sockets,
                     __ATOMIC_RELEASE);
  }
  if (!on && sent) ipcref__chan_knock(t);
}

#endif /* IPCREF__SHARING_IMPL */
