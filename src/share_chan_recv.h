/* share_chan_recv: the receiving side of the channel (see share_channel):
 * adopted from the setup record its sender announced over the socket, and
 * closed with the sending side when the peer is freed; the next record
 * copied out of the ring and checked, or the socket's turn, so that both
 * paths keep their order; the sleep flag, the poll fd's flag, the spin
 * and the sleep on the doorbell. The peer's user's thread only: no lock
 * but the context's where a refusal is reported. */

#ifdef IPCREF__SHARING_IMPL

/* ---- adopting the channel, and closing it ------------------------------- */

IPCREF__PRIVATE void ipcref__chan_rx_free(struct ipcref__chan_rx *x) {
  if (!x) return;
  if (x->map) munmap((void *)(uintptr_t)x->map, IPCREF__CHAN_HDR + x->bytes);
  if (x->ctl) munmap(x->ctl, IPCREF__CHAN_CTL);
  IPCREF_FREE(x->rec);
  IPCREF_FREE(x);
}

/* 1 when the receiver broke the channel to it (ipcref_peer_stats). */
IPCREF__PRIVATE int ipcref__chan_tx_broken(const ipcref_peer *p) {
  return p->tx && p->tx->broken;
}

/* The receiver frees its peer: its sender's next send says EPEER. Set
 * before the peer's last receives (ipcref_peer_free), so that a record
 * pushed before the sender saw it is read and given back; one pushed in
 * between is lost as a socket message sent just before the close is. */
IPCREF__PRIVATE void ipcref__chan_closing(ipcref_peer *p) {
  if (!p->rx) return;
  __atomic_store_n(&p->rx->ctl->closed, 1u, __ATOMIC_SEQ_CST);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* Closes both halves of peer `p`'s channels (ipcref_peer_free). */
IPCREF__PRIVATE void ipcref__chan_close(ipcref_peer *p) {
  ipcref__chan_tx_free(p->tx);
  ipcref__chan_rx_free(p->rx);
  if (p->bell_in >= 0) close(p->bell_in);
  p->tx = NULL;
  p->rx = NULL;
  p->bell_in = -1;
}

/* 1 when `fd` is a memfd of `size` bytes sealed against resizing, opened
 * read-write when `rw` (and then not sealed against writes). */
IPCREF__PRIVATE int ipcref__chan_fd_ok(int fd, size_t size, int rw) {
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS), fl = fcntl(fd, F_GETFL);
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (uint64_t)st.st_size != (uint64_t)size || seals < 0 || fl < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    return 0;
  if (rw)
    return (fl & O_ACCMODE) == O_RDWR &&
           !(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE));
  return (fl & O_ACCMODE) != O_WRONLY;
}

/* The spin's first budget. The adaptive one's: none where this process
 * and its sender may run on the same one CPU only (spinning there would
 * hold off the sender it waits for); else the longest. The sender's CPUs
 * are its word, a hint: a wrong one costs only this side's time. */
IPCREF__PRIVATE long ipcref__chan_spin_start(const ipcref_peer *p,
                                             const struct ipcref__chan_rx *x) {
  const ipcref__chan_hdr *h = (const ipcref__chan_hdr *)(const void *)x->map;
  uint64_t mine, theirs;
  int n;
  if (p->opt.spin_us > 0)
    return (long)(p->opt.spin_us > IPCREF__SPIN_CAP_US ? IPCREF__SPIN_CAP_US
                                                       : p->opt.spin_us) *
           1000L;
  if (p->opt.spin_us == 0) return 0;
  mine = ipcref__cpus(&n);
  theirs = __atomic_load_n(&h->cpus, __ATOMIC_RELAXED);
  if (n == 1 && (theirs == 0 || theirs == mine)) return 0;
  return n > 0 ? IPCREF__SPIN_MAX_NS : 0;
}

/* 1 when `fd` is a Unix stream socket, made blocking (a sleeper's recv
 * waits on it; every other read says MSG_DONTWAIT). */
IPCREF__PRIVATE int ipcref__chan_bell_ok(int fd) {
  struct stat st;
  int type = 0, dom = 0, fl = fcntl(fd, F_GETFL);
  socklen_t len = sizeof type, dlen = sizeof dom;
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) &&
         getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 &&
         type == SOCK_STREAM &&
         getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &dlen) == 0 &&
         dom == AF_UNIX && fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0;
}

/* What is wrong with a setup record (NULL: nothing); maps the ring and
 * the control words into x. */
IPCREF__PRIVATE const char *ipcref__chan_adopt_why(struct ipcref__chan_rx *x,
                                                   const unsigned char *b,
                                                   size_t len, const int *fds,
                                                   int nfds) {
  const ipcref__chan_hdr *h;
  ipcref__wire w;
  uint64_t bytes;
  void *m;
  ipcref__wire_init(&w, (unsigned char *)(uintptr_t)b, len);
  (void)ipcref__wire_get(&w, 4); /* the magic, seen */
  if (ipcref__wire_get(&w, 2) != IPCREF__MSG_VERSION ||
      ipcref__wire_get(&w, 2) != IPCREF__CHAN_LAYOUT ||
      len != IPCREF__CHAN_SETUP_BYTES || nfds != 3)
    return "a channel setup of another version, layout, length or fd count";
  bytes = ipcref__wire_get(&w, 4);
  if (bytes < IPCREF__CHAN_MIN || bytes > IPCREF__CHAN_MAX ||
      (bytes & (bytes - 1)))
    return "a channel of a size out of range";
  if (!ipcref__chan_fd_ok(fds[0], IPCREF__CHAN_HDR + (size_t)bytes, 0) ||
      !ipcref__chan_fd_ok(fds[1], IPCREF__CHAN_CTL, 1) ||
      !ipcref__chan_bell_ok(fds[2]))
    return "a channel's fds: not sealed memfds of its size and access, or "
           "a doorbell that is not a stream socket";
  m = mmap(NULL, IPCREF__CHAN_HDR + (size_t)bytes, PROT_READ, MAP_SHARED,
           fds[0], 0);
  if (m == MAP_FAILED) return "a channel that cannot be mapped";
  x->map = (const unsigned char *)m;
  x->bytes = (size_t)bytes;
  m = mmap(NULL, IPCREF__CHAN_CTL, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1],
           0);
  if (m == MAP_FAILED) return "a channel that cannot be mapped";
  x->ctl = (ipcref__chan_ctl *)m;
  h = (const ipcref__chan_hdr *)(const void *)x->map;
  if (h->magic != IPCREF__CHAN_MAGIC || h->version != IPCREF__MSG_VERSION ||
      h->bytes != bytes)
    return "a channel whose header disagrees with its setup";
  return NULL;
}

/* Adopts the channel a setup record announces (its fds are taken). EPROTO
 * for a malformed one, or a second: the peer then refuses everything
 * (records already in a ring it cannot read would be lost otherwise). */
IPCREF__PRIVATE ipcref_result ipcref__chan_adopt(ipcref_peer *p,
                                                 const unsigned char *b,
                                                 size_t len, int *fds,
                                                 int nfds) {
  struct ipcref__chan_rx *x;
  const char *why = "a second channel setup";
  ipcref_result r = IPCREF_EPROTO;
  int i;
  x = p->rx ? NULL : (struct ipcref__chan_rx *)ipcref__zalloc(sizeof *x);
  if (x) {
    why = ipcref__chan_adopt_why(x, b, len, fds, nfds);
    x->rec = why ? NULL : (unsigned char *)IPCREF_MALLOC(IPCREF_MSG_MAX_BYTES);
    if (!why && !x->rec) why = "out of memory for the channel";
  } else if (!p->rx) {
    why = "out of memory for the channel";
  }
  if (!why) {
    p->bell_in = fds[2];
    fds[2] = -1;
    x->spin = ipcref__chan_spin_start(p, x);
    x->spin_opt = p->opt.spin_us;
    p->rx = x;
    ipcref__poll_doorbell(p);
    r = IPCREF_OK;
  } else {
    ipcref__chan_rx_free(x);
    p->rx_broken = 1;
    IPCREF__LOCK(p->ctx);
    ipcref__refused(p->ctx, why);
    IPCREF__UNLOCK(p->ctx);
  }
  for (i = 0; i < nfds; i++)
    if (fds[i] >= 0) close(fds[i]);
  return r;
}

/* ---- reading it ---------------------------------------------------------- */

/* What the receiver finds next. */
enum {
  IPCREF__CHAN_EMPTY, /* nothing yet */
  IPCREF__CHAN_GOT,   /* a record, copied to x->rec (x->rec_len bytes) */
  IPCREF__CHAN_SOCK,  /* the socket's next message comes first */
  IPCREF__CHAN_BAD    /* the sender broke the ring (reported) */
};

IPCREF__PRIVATE int ipcref__chan_bad(ipcref_peer *p, const char *why) {
  p->rx_broken = 1;
  IPCREF__LOCK(p->ctx);
  ipcref__refused(p->ctx, why);
  IPCREF__UNLOCK(p->ctx);
  return IPCREF__CHAN_BAD;
}

/* Applies the patch record of `len` bytes (at most 4 +
 * IPCREF__CHAN_PATCH_MAX) at x->head to the ring's last message, x->rec
 * (see share_channel): NULL, or what is wrong with it. The patch is
 * copied out first, as a record is. */
IPCREF__PRIVATE const char *ipcref__chan_patch(struct ipcref__chan_rx *x,
                                               const unsigned char *ring,
                                               uint64_t len) {
  unsigned char b[IPCREF__CHAN_LINE - IPCREF__CHAN_REC];
  size_t at, n;
  /* The rest of the record's line, whatever its length: a copy of a
   * constant size, and a record never wraps within its line. */
  memcpy(b, ring + (size_t)(x->head & (x->bytes - 1)) + IPCREF__CHAN_REC,
         sizeof b);
  at = (size_t)ipcref__le_get(b, 2);
  n = (size_t)ipcref__le_get(b + 2, 2);
  if (len < 5 || n + 4 != len)
    return "a channel patch whose byte count disagrees with its length";
  if (at > x->rec_len || n > x->rec_len - at)
    return "a channel patch outside the message before it (or with none)";
  memcpy(x->rec + at, b + 4, n);
  return NULL;
}

/* Takes the next record off the ring, if it is next. Every word the
 * sender wrote is read once and checked before use; the record is copied
 * out before it is decoded, so that nothing the sender does later changes
 * what was checked. */
IPCREF__PRIVATE int ipcref__chan_next(ipcref_peer *p) {
  struct ipcref__chan_rx *x = p->rx;
  const ipcref__chan_hdr *h = (const ipcref__chan_hdr *)(const void *)x->map;
  const unsigned char *ring = x->map + IPCREF__CHAN_HDR;
  const char *why;
  uint64_t tail, avail, len, kind, before, need;
  if (p->rx_broken) return IPCREF__CHAN_BAD;
  /* Acquire: a record's bytes are there before the tail that says so. */
  tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
  avail = tail - x->head;
  if (avail > x->bytes || (avail & (IPCREF__CHAN_LINE - 1u)))
    return ipcref__chan_bad(p, "the channel's write index out of range");
  if (avail == 0) {
    uint64_t socks = __atomic_load_n(&h->sockets, __ATOMIC_ACQUIRE);
    if (socks - x->sockets > (uint64_t)1 << 62)
      return ipcref__chan_bad(p, "the channel's socket count went back");
    x->counted = socks != x->sockets;
    return x->counted || x->hung ? IPCREF__CHAN_SOCK : IPCREF__CHAN_EMPTY;
  }
  len = ipcref__chan_word(ring, x->bytes, x->head);
  before = ipcref__chan_word(ring, x->bytes, x->head + 8);
  kind = len >> 32;
  len &= 0xffffffffu;
  if (kind > IPCREF__CHAN_PATCH)
    return ipcref__chan_bad(p, "a channel record of an unknown kind");
  need = ipcref__chan_need((size_t)len);
  if (avail < IPCREF__CHAN_REC || len == 0 || len > IPCREF_MSG_MAX_BYTES ||
      need > avail ||
      (kind == IPCREF__CHAN_PATCH && len > 4 + IPCREF__CHAN_PATCH_MAX))
    return ipcref__chan_bad(p, "a channel record of a length out of range");
  if (before < x->sockets)
    return ipcref__chan_bad(p, "a channel record after fewer socket "
                               "messages than were read");
  if (before > x->sockets) {
    x->counted = 1;
    return IPCREF__CHAN_SOCK;
  }
  if (kind == IPCREF__CHAN_MSG) {
    ipcref__chan_copy((unsigned char *)(uintptr_t)ring, x->bytes,
                      x->head + IPCREF__CHAN_REC, x->rec, (size_t)len, 0);
    x->rec_len = (size_t)len;
  } else if ((why = ipcref__chan_patch(x, ring, len)) != NULL) {
    return ipcref__chan_bad(p, why);
  }
  IPCREF__STEP("channel take");
  x->head += need;
  /* Release: the copy is done before the sender may write there again. */
  __atomic_store_n(&x->ctl->head, x->head, __ATOMIC_RELEASE);
  return IPCREF__CHAN_GOT;
}

/* 1 when the ring has something for the receiver (a record, or a socket
 * message counted): what a spin and a sleeper look at. */
IPCREF__PRIVATE int ipcref__chan_ready(const struct ipcref__chan_rx *x) {
  const ipcref__chan_hdr *h = (const ipcref__chan_hdr *)(const void *)x->map;
  return __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE) != x->head ||
         __atomic_load_n(&h->sockets, __ATOMIC_ACQUIRE) != x->sockets;
}

/* 1 when records wait in the ring. */
IPCREF__PRIVATE int ipcref__chan_records(const struct ipcref__chan_rx *x) {
  const ipcref__chan_hdr *h = (const ipcref__chan_hdr *)(const void *)x->map;
  return __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE) != x->head;
}

/* The doorbell's end of file: the sender is gone (its socket closes too).
 * The socket is read to its end from then on, and the poll fd no longer
 * watches the doorbell (it would stay readable). */
IPCREF__PRIVATE void ipcref__chan_hang(ipcref_peer *p) {
  if (p->rx->hung) return;
  p->rx->hung = 1;
  if (p->poll_fd >= 0 && p->bell_in >= 0)
    (void)epoll_ctl(p->poll_fd, EPOLL_CTL_DEL, p->bell_in, NULL);
}

/* What the doorbell holds, read without waiting: >0 bytes, 0 at its end
 * of file (then the sender hung up), -1 nothing. At most 4 reads: a sender
 * that keeps it full must not keep the receiver here. Bytes read are
 * counted in `drains`, for a sender that found the doorbell full (see
 * ipcref__chan_knock); seq-cst, paired with its fence, as the arming is:
 * the caller looks at the ring after this, or is armed again before it
 * sleeps. */
IPCREF__PRIVATE ssize_t ipcref__chan_ring_read(ipcref_peer *p) {
  char b[256];
  ssize_t k, got = -1;
  int reads = 0;
  do k = recv(p->bell_in, b, sizeof b, MSG_DONTWAIT);
  while (k == (ssize_t)sizeof b && (got = k) > 0 && ++reads < 4);
  if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                 errno != EINTR)) /* its end, or broken: look no more */
    ipcref__chan_hang(p);
  if (k > 0 || got > 0)
    (void)__atomic_fetch_add(&p->rx->ctl->drains, 1u, __ATOMIC_SEQ_CST);
  return k == 0 ? 0 : k > 0 ? k : got;
}

/* The receiver says how it sleeps (`how`: IPCREF__ASLEEP_BELL or _FUTEX)
 * or that it is awake (0). Seq-cst, paired with ipcref__chan_knock: after
 * arming, the caller looks at the ring once more, and either sees a
 * record or the sender sees `asleep`. Leaving the doorbell, it reads what
 * the doorbell holds, so the fd sleeps again. */
IPCREF__PRIVATE void ipcref__chan_arm(ipcref_peer *p, int how) {
  struct ipcref__chan_rx *x = p->rx;
  int was = x->armed;
  if (was == how) return;
  x->armed = how;
  __atomic_store_n(&x->ctl->asleep, (uint32_t)how, __ATOMIC_SEQ_CST);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (was == (int)IPCREF__ASLEEP_BELL) (void)ipcref__chan_ring_read(p);
}

/* With a poll fd, the receiver sleeps whenever it leaves a receive with
 * the ring empty (so that the fd wakes for the next record: the sender
 * then rings for each record sent to an idle receiver), and the fd's flag
 * stays set while records wait (see ipcref__batch_signal). Without one,
 * only a receive about to sleep says so. */
IPCREF__PRIVATE void ipcref__chan_poll(ipcref_peer *p) {
  struct ipcref__chan_rx *x = p->rx;
  if (x && p->poll_fd >= 0 && !p->rx_broken) {
    /* Records only: a socket message due wakes the fd by the socket. */
    p->ring_left = ipcref__chan_records(x);
    if (!p->ring_left) {
      ipcref__chan_arm(p, (int)IPCREF__ASLEEP_BELL);
      p->ring_left = ipcref__chan_records(x);
      if (p->ring_left) ipcref__chan_arm(p, 0);
    }
  }
  ipcref__batch_signal(p);
}

/* A pause between looks at the ring while spinning. */
IPCREF__PRIVATE void ipcref__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ __volatile__("pause");
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Notes where the lease of the view just imported lies (see below). */
IPCREF__PRIVATE void ipcref__chan_lease_seen(struct ipcref__chan_rx *x,
                                             const ipcref_view *v) {
  const ipcref__import *imp;
  if (v->buf->release != ipcref__import_release) return;
  imp = (const ipcref__import *)v->buf->release_user;
  x->lease_at = (uintptr_t)&ipcref__ledger_slots(
      imp->ledger->base)[2 * (size_t)imp->slot];
}

/* One look of a spin: 1 when the ring has something (as
 * ipcref__chan_ready says). With the tail it loads the first word of the
 * record due next, whose line the sender writes just before the tail:
 * both lines are asked for on every look and cross CPUs together, where
 * a look at the tail alone would fetch the record's line only after it
 * (with records on cache lines, a spinning hand-off 8% faster: bench/,
 * chan_spin). Only a load, whatever it finds: the record is read and
 * checked by ipcref__chan_next, after the tail. */
IPCREF__PRIVATE int ipcref__chan_looks(const struct ipcref__chan_rx *x) {
  int ready = ipcref__chan_ready(x);
  uint64_t first =
      ipcref__chan_word(x->map + IPCREF__CHAN_HDR, x->bytes, x->head);
  __asm__ __volatile__("" : : "r"(first)); /* loaded, whatever it says */
  return ready;
}

/* While spinning: the ledger lines around the last lease imported, where
 * the producer most likely writes the next one just before its record.
 * Fetched now, in parallel with the ring's, the import's liveness check
 * of that lease does not wait for them (about a tenth of a spinning
 * hand-off). Only a hint: a prefetch never faults, even once the ledger
 * is unmapped. */
IPCREF__PRIVATE void ipcref__chan_prefetch(const struct ipcref__chan_rx *x) {
  if (!x->lease_at) return;
  __builtin_prefetch((const void *)(x->lease_at - 64));
  __builtin_prefetch((const void *)x->lease_at);
  __builtin_prefetch((const void *)(x->lease_at + 64));
}

/* Spins up to x->spin ns for the ring to have something: 1 when it did.
 * The adaptive budget (spin_us IPCREF_SPIN_AUTO) comes back whole after a
 * spin that found something and halves after one that did not; once it
 * is 0, a short spin (2 us) is tried every 64th sleep. */
IPCREF__PRIVATE int ipcref__chan_spin(ipcref_peer *p) {
  struct ipcref__chan_rx *x = p->rx;
  struct timespec t0, t;
  int64_t spent = 0; /* ns: a long of 32 bits holds 2 s of them */
  int i, aut = p->opt.spin_us == IPCREF_SPIN_AUTO;
  if (x->spin_opt != p->opt.spin_us) { /* ipcref_peer_set_options */
    x->spin_opt = p->opt.spin_us;
    x->spin = ipcref__chan_spin_start(p, x);
  }
  if (x->spin <= 0) {
    if (!aut || ++x->sleeps < 64) return 0;
    x->sleeps = 0;
    if (ipcref__chan_spin_start(p, x) <= 0) return 0;
    x->spin = 2000;
  }
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (spent < x->spin) {
    for (i = 0; i < 64; i++) {
      ipcref__chan_prefetch(x);
      if (ipcref__chan_looks(x)) {
        if (aut) x->spin = IPCREF__SPIN_MAX_NS;
        return 1;
      }
      ipcref__cpu_relax();
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
    spent =
        (int64_t)(t.tv_sec - t0.tv_sec) * 1000000000 + (t.tv_nsec - t0.tv_nsec);
  }
  if (aut) x->spin = x->spin / 2 < 1000 ? 0 : x->spin / 2;
  return 0;
}

/* 1 when the peer's socket says the other side hung up (`revents` of a
 * poll of it, or a look now: -1). The doorbell's end of file says so
 * too, but a child the sender forked may hold the doorbell open long
 * after: then only the socket tells (the poll fd wakes for it). */
IPCREF__PRIVATE int ipcref__chan_sock_hup(const ipcref_peer *p, int revents) {
  if (revents < 0) {
    struct pollfd q;
    q.fd = p->fd;
    q.events = POLLRDHUP;
    q.revents = 0;
    revents = poll(&q, 1, 0) == 1 ? q.revents : 0;
  }
  return (revents & (POLLHUP | POLLRDHUP)) != 0;
}

/* Sleeps on the doorbell for up to ms (-1: forever), and on the socket's
 * hang-up: a poll, then what the doorbell holds read without waiting.
 * Never a blocking recv: the doorbell is the sender's socket, and a
 * sender that kept the receiving end could change its options
 * (SO_RCVTIMEO is the socket's, not the call's). */
IPCREF__PRIVATE ipcref_result ipcref__chan_sleep(ipcref_peer *p, int ms) {
  struct ipcref__chan_rx *x = p->rx;
  struct pollfd pfd[2];
  ssize_t k;
  pfd[0].fd = p->bell_in;
  pfd[0].events = POLLIN;
  pfd[1].fd = p->fd;
  pfd[1].events = POLLRDHUP;
  pfd[0].revents = pfd[1].revents = 0;
  if (poll(pfd, 2, ms) == 0) return IPCREF_ETIMEDOUT;
  if (ipcref__chan_sock_hup(p, pfd[1].revents)) {
    ipcref__chan_hang(p); /* the socket is read to its end */
    return IPCREF_OK;
  }
  k = ipcref__chan_ring_read(p);
  if (k > 0) { /* rung, and read: awake */
    x->armed = 0;
    __atomic_store_n(&x->ctl->asleep, 0u, __ATOMIC_RELAXED);
  }
  return IPCREF_OK;
}

/* Dozes on the futex for up to ms (-1: as long as it takes), at most
 * what is left of this idle stretch's IPCREF__DOZE_MS (see share_channel):
 * OK, look again (woken, or the doze is over); ETIMEDOUT, ms passed. A
 * system without the futex call never dozes again. */
IPCREF__PRIVATE ipcref_result ipcref__chan_doze(ipcref_peer *p, int ms) {
  struct ipcref__chan_rx *x = p->rx;
  int64_t left = (int64_t)IPCREF__DOZE_MS * 1000000 - x->dozed_ns, spent;
  struct timespec t0, t1, tmo;
  int e = 0, by_ms = ms >= 0 && (int64_t)ms * 1000000 <= left;
  if (by_ms) left = (int64_t)ms * 1000000;
  ipcref__chan_arm(p, (int)IPCREF__ASLEEP_FUTEX);
  if (ipcref__chan_ready(x)) return IPCREF_OK;
  tmo.tv_sec = (time_t)(left / 1000000000);
  tmo.tv_nsec = (long)(left % 1000000000);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (syscall(SYS_futex, &x->ctl->asleep, FUTEX_WAIT, IPCREF__ASLEEP_FUTEX,
              &tmo, NULL, 0) != 0)
    e = errno;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  spent =
      (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);
  x->dozed_ns += spent > 0 ? spent : 1;
  ipcref__chan_arm(p, 0); /* the sender may have set 0: say it again */
  if (e == ENOSYS || e == EPERM || e == EFAULT || e == EINVAL)
    x->dozed_ns = (int64_t)IPCREF__DOZE_MS * 1000000; /* no futex here */
  return e == ETIMEDOUT && by_ms ? IPCREF_ETIMEDOUT : IPCREF_OK;
}

/* Waits up to ms (-1: as long as it takes; 0: not at all) for the ring to
 * have something, or for the sender to hang up (then the socket is read
 * to its end): spinning first (not for 0), then dozing on the futex for
 * the first IPCREF__DOZE_MS of an idle stretch, then asleep on the
 * doorbell. OK: look again; ETIMEDOUT. The receiver stays armed when this
 * says ETIMEDOUT after the doorbell, so that its poll fd wakes. */
IPCREF__PRIVATE ipcref_result ipcref__chan_wait(ipcref_peer *p, int ms) {
  struct ipcref__chan_rx *x = p->rx;
  if (ms != 0 && ipcref__chan_spin(p)) return IPCREF_OK;
  if (ms != 0 && x->dozed_ns < (int64_t)IPCREF__DOZE_MS * 1000000)
    return ipcref__chan_doze(p, ms);
  ipcref__chan_arm(p, (int)IPCREF__ASLEEP_BELL);
  if (ipcref__chan_ready(x)) return IPCREF_OK;
  if (ms == 0) { /* its end (or the socket's): hung, look again; rung:
                     look again only if something came (a sender that
                     keeps ringing must not keep a receive that may not
                     wait) */
    ssize_t k = ipcref__chan_ring_read(p);
    if (k != 0 && ipcref__chan_sock_hup(p, -1)) ipcref__chan_hang(p), k = 0;
    return k == 0 || (k > 0 && ipcref__chan_ready(x)) ? IPCREF_OK
                                                      : IPCREF_ETIMEDOUT;
  }
  return ipcref__chan_sleep(p, ms);
}

#endif /* IPCREF__SHARING_IMPL */
