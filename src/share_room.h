/* share_room: backpressure. A producer capped by max_bytes, or a peer
 * capped by max_bytes_held, waits for its consumers to return leases
 * without polling: on the context's room fd, on the peer's poll fd, or
 * blocked with a timeout. Under ctx->lock, but for the waits. */

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

/* What ipcref_peer_wants says after a send refused for room under the
 * peer's max_bytes_held: wait for the peer's poll fd (which then watches
 * the room fd too) to be readable, then send again. */
#define IPCREF_WANTS_ROOM 0x10000

/* An fd that becomes readable when a consumer returned a lease while this
 * context waits for room: after an allocation refused under max_bytes
 * (ENOMEM), or a send refused under a peer's max_bytes_held. It stays
 * readable until the next allocation or send on the context reads it, as
 * a socket stays writable until written: add it to your event loop, and
 * try again when it wakes. The context's (made with it); do not close
 * it. -1 for NULL or a freed context (reported). */
IPCREF_API int ipcref_ctx_room_fd(ipcref_ctx *ctx);

/* As ipcref_shared_new, but when the context is at its max_bytes, waits up
 * to timeout_ms (-1: as long as it takes; 0: not at all) for consumers to
 * return enough leases, on the room fd. Errors: as ipcref_shared_new;
 * ETIMEDOUT (no room came in time; nothing allocated), ENOMEM (the block
 * alone is larger than max_bytes, or the system is out of memory). */
IPCREF_API ipcref_result ipcref_shared_new_wait(ipcref_ctx *ctx, size_t size,
                                                int timeout_ms,
                                                ipcref_buf **out);

#ifdef __cplusplus
}
#endif
#endif /* !IPCREF_NO_SHARING */

/* @implementation */

#ifdef IPCREF__SHARING_IMPL

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
  ipcref__bell_drain(ctx);
  return IPCREF_OK;
}

IPCREF_API int ipcref_ctx_room_fd(ipcref_ctx *ctx) {
  return ctx && IPCREF__CTX_USABLE(ctx) ? ctx->bell_rx : -1;
}

IPCREF_API ipcref_result ipcref_shared_new_wait(ipcref_ctx *ctx, size_t size,
                                                int timeout_ms,
                                                ipcref_buf **out) {
  struct timespec end = {0, 0};
  ipcref_result r;
  if (!ctx || !out) return IPCREF_EINVAL;
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  if (timeout_ms < -1) {
    ipcref__report_in(IPCREF_EINVAL, "ipcref_shared_new_wait",
                      "timeout_ms below -1");
    return IPCREF_EINVAL;
  }
  for (;;) {
    r = ipcref_shared_new(ctx, size, out);
    if (r != IPCREF_ENOMEM || !ctx->opt.max_bytes || size > ctx->opt.max_bytes)
      return r;
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

/* Sets or clears the peer's wait for room (under the lock), and with it
 * the room fd in its poll fd and the ledgers' arming. */
IPCREF__PRIVATE void ipcref__room_wait(ipcref_peer *p, int on) {
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

/* Before a send of `views` takes leases: room under the peer's
 * max_bytes_held, after a sweep; else, armed, one more sweep (a return
 * before the arming rang no bell). Non-blocking sockets say EAGAIN
 * (IPCREF_WANTS_ROOM); blocking ones wait on the bell, up to
 * opt.send_timeout_ms (ETIMEDOUT). */
IPCREF__PRIVATE ipcref_result ipcref__room_take(ipcref_peer *p,
                                                const ipcref_view *views,
                                                int n) {
  ipcref_ctx *ctx = p->ctx;
  struct timespec end = {0, 0};
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
    if (p->room_wait) ipcref__bell_drain(ctx);
    IPCREF__LOCK(ctx);
    if (!(fits = ipcref__room_fits(p, add))) ipcref__sweep(ctx);
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
                          &end) != IPCREF_OK) {
      IPCREF__LOCK(ctx);
      ipcref__room_wait(p, 0); /* nobody waits now */
      IPCREF__UNLOCK(ctx);
      return IPCREF_ETIMEDOUT;
    }
  }
}

#endif /* IPCREF__SHARING_IMPL */
