/* share_loop: what an event loop waits on. The peer's poll fd (an epoll
 * set over its socket, the flag of a batch's views left, and while it
 * waits for room the context's bell) and what a call that said EAGAIN
 * wants; and backpressure: a producer capped by max_bytes, or a peer
 * capped by max_bytes_held, waits for its consumers to return leases
 * without polling, on the room fd, on the peer's poll fd, or blocked with
 * a timeout. Under ctx->lock where it touches the ledgers; the peer's
 * fields are its user's thread's. */

#if !defined(IPCREF_NO_SHARING)
#ifdef __cplusplus
extern "C" {
#endif

/* ---- waiting for room ---------------------------------------------------
 * Returns reach a producer through shared memory, not a message, so
 * nothing would wake it by itself. While it waits for room, its counter
 * files say so, and a consumer that returns a lease then also sends one
 * byte on the producer's bell (a datagram socket that travels with every
 * counter file): one system call per return while someone waits, none
 * otherwise. The bell's receiving end is the room fd. */

/* An fd for an event loop (epoll, poll, select) that never misses work:
 * readable whenever ipcref_recv(p, .., 0) would return a view or an error,
 * which the peer's socket alone is not once a batch was received (its
 * other views wait in the peer, and the socket has nothing more to say). A
 * wake-up with nothing to receive (the other side's hello, say) makes
 * ipcref_recv(p, .., 0) return IPCREF_EAGAIN: call it until it does, or
 * once per wake-up (level-triggered, the fd stays readable while views
 * wait). Made on the first call (an epoll fd over the socket and an
 * eventfd, both closed by ipcref_peer_free); the same fd every call. -1
 * for NULL or a freed peer (reported), or when it cannot be made (errno
 * says why). */
IPCREF_API int ipcref_peer_poll_fd(ipcref_peer *p);

/* What peer `p` waits for after a call on it said IPCREF_EAGAIN: POLLIN
 * (the other side's hello, on the peer's poll fd or socket), POLLOUT (room
 * in its socket: then call ipcref_peer_flush, or send again; while a
 * record a stream took in part is not all sent, POLLOUT stays, beside
 * whatever else a later call wants),
 * IPCREF_WANTS_ROOM (the other side to return leases, under
 * max_bytes_held: the peer's poll fd wakes then; send again), 0 for
 * nothing (or NULL). */
IPCREF_API int ipcref_peer_wants(ipcref_peer *p);

/* What ipcref_peer_wants says after a send refused for room under the
 * peer's max_bytes_held: wait for the peer's poll fd (which then watches
 * the room fd too) to be readable, then send again. A receive on the peer
 * with nothing to receive takes that wake-up (the fd sleeps again), so a
 * loop that receives on every wake-up should also retry a send waiting
 * for room. */
#define IPCREF_WANTS_ROOM 0x10000

/* An fd that becomes readable when a consumer returned a lease while this
 * context waits for room: after an allocation refused under max_bytes
 * (ENOMEM), or a send refused under a peer's max_bytes_held. It stays
 * readable until the next allocation or send on the context reads it, as
 * a socket stays writable until written: add it to your event loop, and
 * try again when it wakes. One wake-up for all that wait on the context:
 * of two threads whose allocations wait on it, the one that tries first
 * takes it (a peer's send waiting for room has it passed on; see
 * ipcref_peer_wants), so the other should not wait on it alone
 * (ipcref_shared_new_wait looks again every 100 ms). The context's (made
 * with it); do not close it. -1 for NULL or a freed context (reported). */
IPCREF_API int ipcref_ctx_room_fd(ipcref_ctx *ctx);

/* As ipcref_shared_new, but when the context is at its max_bytes, waits up
 * to timeout_ms (-1: as long as it takes; 0: not at all) for consumers to
 * return enough leases, on the room fd. Errors: as ipcref_shared_new;
 * ETIMEDOUT (no room came in time; nothing allocated), ENOMEM at once
 * (the segment the block needs is alone larger than max_bytes, a size
 * class or segment_size rounding it up; or the system is out of memory). */
IPCREF_API ipcref_result ipcref_shared_new_wait(ipcref_ctx *ctx, size_t size,
                                                int timeout_ms,
                                                ipcref_buf **out);

#ifdef __cplusplus
}
#endif
#endif /* !IPCREF_NO_SHARING */

/* @implementation */

#ifdef IPCREF__SHARING_IMPL

/* ---- the peer's poll fd ------------------------------------------------- */

/* The poll fd's flag (an eventfd): set while views of a received batch
 * wait in the peer, or records in the channel from it (p->ring_left, see
 * ipcref__chan_poll), clear when neither does, so that an event loop is
 * woken for each of them (the socket and the doorbell have nothing more to
 * say). A system call only when it changes; none before
 * ipcref_peer_poll_fd made it. */
IPCREF__PRIVATE void ipcref__batch_signal(ipcref_peer *p) {
  uint64_t v = 1;
  ssize_t n;
  int on = p->pending_pos < p->npending || p->ring_left;
  if (p->batch_fd < 0 || on == p->flag_on) return;
  p->flag_on = on;
  if (on)
    n = write(p->batch_fd, &v, sizeof v);
  else
    n = read(p->batch_fd, &v, sizeof v);
  (void)n;
}

/* The poll fd also wakes for room in the socket while the peer wants it.
 * The rest of a record a stream took in part (p->out) always wants it,
 * whatever a later call asks (a receive that found nothing, say): else
 * nothing would wake the loop to send it, and the receiver would wait
 * for it forever. */
IPCREF__PRIVATE void ipcref__want(ipcref_peer *p, int events) {
  struct epoll_event ev;
  if (p->out_pos < p->out_len) events |= POLLOUT;
  if (p->poll_fd >= 0 && (p->wants & POLLOUT) != (events & POLLOUT)) {
    memset(&ev, 0, sizeof ev);
    ev.events =
        (uint32_t)EPOLLIN | ((events & POLLOUT) ? (uint32_t)EPOLLOUT : 0u);
    ev.data.fd = p->fd;
    (void)epoll_ctl(p->poll_fd, EPOLL_CTL_MOD, p->fd, &ev);
  }
  p->wants = events;
}

/* Adds `fd` to the epoll set `ep`, readable-level (and writable, when
 * `wants` says POLLOUT). 0 on success. */
IPCREF__PRIVATE int ipcref__epoll_add(int ep, int fd, int wants) {
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = (uint32_t)EPOLLIN | ((wants & POLLOUT) ? (uint32_t)EPOLLOUT : 0u);
  ev.data.fd = fd;
  return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

/* The poll fd also wakes when the other side's channel rings its doorbell
 * (see share_channel): added once both are there. */
IPCREF__PRIVATE void ipcref__poll_doorbell(ipcref_peer *p) {
  if (p->poll_fd >= 0 && p->bell_in >= 0)
    (void)ipcref__epoll_add(p->poll_fd, p->bell_in, 0);
}

IPCREF_API int ipcref_peer_poll_fd(ipcref_peer *p) {
  int ep, bf;
  if (!p || !IPCREF__PEER_USABLE(p, "ipcref_peer_poll_fd")) return -1;
  if (p->poll_fd >= 0) return p->poll_fd;
  ep = epoll_create1(EPOLL_CLOEXEC);
  bf = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ep < 0 || bf < 0 || ipcref__epoll_add(ep, p->fd, p->wants) != 0 ||
      ipcref__epoll_add(ep, bf, 0) != 0) {
    int e = errno;
    if (ep >= 0) close(ep);
    if (bf >= 0) close(bf);
    errno = e;
    return -1;
  }
  IPCREF__LOCK(p->ctx); /* a sweep elsewhere may set its flag for room */
  p->poll_fd = ep;
  p->batch_fd = bf;
  IPCREF__UNLOCK(p->ctx);
  ipcref__poll_doorbell(p); /* records in the channel from it */
  if (p->room_wait)         /* a send waits for room: returns wake it too */
    (void)ipcref__epoll_add(ep, p->ctx->bell_rx, 0);
  /* A batch received before the first call has views left too, and the
   * channel from it records. */
  ipcref__chan_poll(p);
  return ep;
}

IPCREF_API int ipcref_peer_wants(ipcref_peer *p) {
  if (!p || !IPCREF__PEER_USABLE(p, "ipcref_peer_wants")) return 0;
  return p->wants;
}

/* ---- room under a cap ---------------------------------------------------- */

/* Waits for the bell until `end` (set from `ms` on first use; -1 ms:
 * forever), at most IPCREF__ROOM_MS at a time: another thread may read a
 * ring meant for this one. ETIMEDOUT once `end` has passed. */
IPCREF__PRIVATE ipcref_result ipcref__bell_wait(ipcref_ctx *ctx, int ms,
                                                struct timespec *end) {
  struct pollfd pfd;
  int left;
  if (!end->tv_sec && !end->tv_nsec) {
    clock_gettime(CLOCK_MONOTONIC, end);
    end->tv_sec += ms / 1000;
    end->tv_nsec += (long)(ms % 1000) * 1000000;
    if (end->tv_nsec >= 1000000000) end->tv_sec++, end->tv_nsec -= 1000000000;
  }
  left = ipcref__ms_left(ms, end);
  if (left == 0) return IPCREF_ETIMEDOUT;
  pfd.fd = ctx->bell_rx;
  pfd.events = POLLIN;
  pfd.revents = 0;
  if (poll(&pfd, 1,
           left < 0 || left > IPCREF__ROOM_MS ? IPCREF__ROOM_MS : left) < 0 &&
      errno != EINTR)
    return IPCREF_ESYS;
  return IPCREF_OK; /* the caller's next try reads the bell */
}

IPCREF_API int ipcref_ctx_room_fd(ipcref_ctx *ctx) {
  return ctx && IPCREF__CTX_USABLE(ctx) ? ctx->bell_rx : -1;
}

IPCREF_API ipcref_result ipcref_shared_new_wait(ipcref_ctx *ctx, size_t size,
                                                int timeout_ms,
                                                ipcref_buf **out) {
  struct timespec end = {0, 0};
  ipcref_result r;
  if (!ctx || !out) return ipcref__invalid(__func__, "ctx or out is NULL");
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  if (timeout_ms < -1) return ipcref__invalid(__func__, "timeout_ms below -1");
  for (;;) {
    int can;
    r = ipcref_shared_new(ctx, size, out);
    if (r != IPCREF_ENOMEM) return r;
    IPCREF__LOCK(ctx);
    can = ipcref__room_can_come(ctx, size, ctx->opt.isolate);
    IPCREF__UNLOCK(ctx);
    if (!can) return r; /* no return will make room */
    r = ipcref__bell_wait(ctx, timeout_ms, &end);
    if (r != IPCREF_OK) return r;
  }
}

/* The bytes a message of these views adds to what its peer holds: the
 * blocks made here (a forwarded view is held in its origin's ledger). */
IPCREF__PRIVATE size_t ipcref__views_bytes(const ipcref_view *views, int n) {
  size_t sum = 0;
  int i;
  for (i = 0; i < n; i++) {
    ipcref__block *b = ipcref__local_block(views[i].buf);
    if (b) sum += b->size;
  }
  return sum;
}

/* 1 when `add` more bytes fit under the peer's max_bytes_held (a message
 * larger than the cap goes when the peer holds nothing). */
IPCREF__PRIVATE int ipcref__room_fits(const ipcref_peer *p, size_t add) {
  size_t cap = p->opt.max_bytes_held;
  return !cap || p->held_bytes == 0 ||
         (p->held_bytes <= cap && add <= cap - p->held_bytes);
}

/* A peer whose send waits for room, and now has it, though another read
 * of the bell took the ring (an allocation, another peer's send, a
 * blocking wait): its poll fd's flag is set, once, until its own next try
 * clears it (ipcref__room_unring). Not the bell rung again: a blocking
 * wait on it would wake to that over and over. Under the lock. */
IPCREF__PRIVATE void ipcref__room_ring(ipcref_peer *p) {
  uint64_t one = 1;
  ssize_t n;
  if (p->room_rung || p->batch_fd < 0) return;
  p->room_rung = 1;
  n = write(p->batch_fd, &one, sizeof one);
  (void)n;
}

/* The peer's own try takes that wake-up (under the lock, in its thread):
 * the flag is read clear, and set again if a batch still needs it. */
IPCREF__PRIVATE void ipcref__room_unring(ipcref_peer *p) {
  uint64_t v = 1;
  ssize_t n;
  if (!p->room_rung) return;
  p->room_rung = 0;
  n = read(p->batch_fd, &v, sizeof v);
  v = 1;
  if (p->flag_on) n = write(p->batch_fd, &v, sizeof v);
  (void)n;
}

/* After a read of the bell for `self` (a peer waiting for room, or NULL:
 * the context), not under the lock: the bell is every waiter's, and a
 * read for somebody else must not take a waiting peer's wake-up. Each
 * other peer whose send waits and now fits is told (ipcref__room_ring). */
IPCREF__PRIVATE void ipcref__bell_pass(ipcref_ctx *ctx,
                                       const ipcref_peer *self) {
  ipcref_peer *p;
  IPCREF__LOCK(ctx);
  for (p = ctx->peers; p && (p == self || !p->room_wait); p = p->next) continue;
  if (p) ipcref__sweep(ctx);
  for (; p; p = p->next)
    if (p != self && p->room_wait && ipcref__room_fits(p, p->room_need))
      ipcref__room_ring(p);
  IPCREF__UNLOCK(ctx);
}

/* Sets or clears the peer's wait for room (under the lock), and with it
 * the room fd in its poll fd and the ledgers' arming. */
IPCREF__PRIVATE void ipcref__room_wait(ipcref_peer *p, int on) {
  if (!on) ipcref__room_unring(p);
  if (p->room_wait == on) return;
  p->room_wait = on;
  if (p->poll_fd >= 0 && p->ctx->bell_rx >= 0) {
    if (on)
      (void)ipcref__epoll_add(p->poll_fd, p->ctx->bell_rx, 0);
    else
      (void)epoll_ctl(p->poll_fd, EPOLL_CTL_DEL, p->ctx->bell_rx, NULL);
  }
  ipcref__room_update(p->ctx);
}

/* A receive found nothing while a send on the peer waits for room: the
 * wake-up may have been the bell. It is read, so that the poll fd sleeps
 * again instead of waking the loop over and over, and the wait ends once
 * the other side holds less than its cap: the loop's next send goes (or,
 * still too large, waits again for the next return). */
IPCREF__PRIVATE void ipcref__room_poll(ipcref_peer *p) {
  ipcref_ctx *ctx = p->ctx;
  ipcref__bell_drain_for(ctx, p);
  IPCREF__LOCK(ctx);
  ipcref__room_unring(p);
  ipcref__sweep(ctx);
  if (p->held_bytes < p->opt.max_bytes_held) ipcref__room_wait(p, 0);
  IPCREF__UNLOCK(ctx);
}

/* Before a send of `views` takes leases: room under the peer's
 * max_bytes_held, after a sweep; else, armed, one more sweep (a return
 * before the arming rang no bell). Non-blocking sockets say EAGAIN
 * (IPCREF_WANTS_ROOM); blocking ones wait on the bell until the send's
 * deadline `end` (set here if this is its first wait; ETIMEDOUT): the
 * wait for room in the socket that follows has only what is left of it. */
IPCREF__PRIVATE ipcref_result ipcref__room_take(ipcref_peer *p,
                                                const ipcref_view *views, int n,
                                                struct timespec *end) {
  ipcref_ctx *ctx = p->ctx;
  size_t add;
  int fits;
  if (!p->opt.max_bytes_held) {
    if (p->room_wait) { /* the cap was lifted (ipcref_peer_set_options) */
      IPCREF__LOCK(ctx);
      ipcref__room_wait(p, 0);
      IPCREF__UNLOCK(ctx);
    }
    return IPCREF_OK;
  }
  add = ipcref__views_bytes(views, n);
  for (;;) {
    if (p->room_wait) ipcref__bell_drain_for(ctx, p);
    IPCREF__LOCK(ctx);
    ipcref__room_unring(p); /* this try takes its wake-up */
    if (!(fits = ipcref__room_fits(p, add))) ipcref__sweep(ctx);
    p->room_need = add;
    if (!(fits = fits || ipcref__room_fits(p, add)) && !p->room_wait) {
      ipcref__room_wait(p, 1);
      ipcref__sweep(ctx);
      fits = ipcref__room_fits(p, add);
    }
    if (fits) ipcref__room_wait(p, 0);
    IPCREF__UNLOCK(ctx);
    if (fits) return IPCREF_OK;
    if (ipcref__nonblocking(p->fd)) {
      ipcref__want(p, IPCREF_WANTS_ROOM);
      return IPCREF_EAGAIN;
    }
    if (ipcref__bell_wait(ctx,
                          p->opt.send_timeout_ms ? p->opt.send_timeout_ms : -1,
                          end) != IPCREF_OK) {
      IPCREF__LOCK(ctx);
      ipcref__room_wait(p, 0); /* nobody waits now */
      IPCREF__UNLOCK(ctx);
      return IPCREF_ETIMEDOUT;
    }
  }
}

#endif /* IPCREF__SHARING_IMPL */
