/* share_recv: receiving. The next record, in the order it was sent,
 * from the channel or the socket (the peer's hello first), decoded and
 * imported; the views of a received batch handed out one per receive,
 * with their metadata. Not under ctx->lock: the socket may block on the
 * peer. */

#ifdef IPCREF__SHARING_IMPL

IPCREF_API ipcref_result ipcref_recv(ipcref_peer *p, ipcref_view *out,
                                     int timeout_ms) {
  return ipcref_recv_on(p, out, timeout_ms, NULL);
}

/* The other side's hello, when it has not come yet, read within
 * *timeout_ms, which is left with what remains of the caller's wait. */
IPCREF__PRIVATE ipcref_result ipcref__hello_within(ipcref_peer *p,
                                                   int *timeout_ms) {
  struct timespec t0, t1;
  ipcref_result r;
  long spent;
  if (p->hello) return IPCREF_OK;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  r = ipcref__hello_read(p, *timeout_ms);
  if (r != IPCREF_OK || *timeout_ms <= 0) return r;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  spent = (long)(t1.tv_sec - t0.tv_sec) * 1000 +
          (long)(t1.tv_nsec - t0.tv_nsec) / 1000000;
  *timeout_ms = spent >= *timeout_ms ? 0 : *timeout_ms - (int)spent;
  return IPCREF_OK;
}

/* Receives one seqpacket record and its fds into `bytes`
 * (IPCREF_MSG_MAX_BYTES) and `fds` (IPCREF_MSG_MAX_FDS): the mirror of
 * ipcref__send_raw. EAGAIN: nothing there (a non-blocking socket). On
 * error the fds that came are closed. (A stream's records come through
 * ipcref__stream_fill.) */
IPCREF__PRIVATE ipcref_result ipcref__recv_raw(ipcref_peer *p,
                                               unsigned char *bytes,
                                               size_t *len, int *fds,
                                               int *nfds) {
  ipcref__cmsg_room u;
  struct msghdr mh;
  struct iovec iov;
  struct cmsghdr *c;
  ssize_t k;
  int i;
  ipcref_result r;
  ipcref__msghdr_one(&mh, &iov, bytes, IPCREF_MSG_MAX_BYTES, u.buf,
                     sizeof u.buf);
  *nfds = 0;
  k = ipcref__recvmsg(p->fd, &mh);
  for (c = k >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      ipcref__take_fds(c, fds, nfds, IPCREF_MSG_MAX_FDS);
  }
  if (k > 0 && !(mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
    *len = (size_t)k;
    return IPCREF_OK;
  }
  if (k == 0 || (k < 0 && errno == ECONNRESET)) {
    r = IPCREF_EPEER;
  } else if (k < 0) {
    r = errno == EAGAIN || errno == EWOULDBLOCK ? IPCREF_EAGAIN : IPCREF_ESYS;
  } else {
    r = IPCREF_EPROTO;
    ipcref__ctx_report(p->ctx, r,
                       "message refused: longer than any message, or with "
                       "more fds (cut: MSG_TRUNC)");
  }
  for (i = 0; i < *nfds; i++) close(fds[i]);
  *nfds = 0;
  return r;
}

IPCREF_API int ipcref_recv_pending(ipcref_peer *p) {
  if (!p || !IPCREF__PEER_USABLE(p, "ipcref_recv_pending")) return 0;
  return p->npending - p->pending_pos;
}

IPCREF_API const void *ipcref_recv_meta(ipcref_peer *p, size_t *len) {
  if (len) *len = 0;
  if (!p || !len || !IPCREF__PEER_USABLE(p, "ipcref_recv_meta")) return NULL;
  *len = p->meta_len;
  return p->meta_len ? p->meta : NULL;
}

/* A record the socket brought: a channel setup (adopted; *n 0) or a
 * message, imported into p->pending (*n views). The fds are taken. */
IPCREF__PRIVATE ipcref_result ipcref__socket_record(ipcref_peer *p,
                                                    const unsigned char *b,
                                                    size_t len, int *fds,
                                                    int nfds, void *stream,
                                                    int *n) {
  ipcref__wire w;
  *n = 0;
  ipcref__wire_init(&w, (unsigned char *)(uintptr_t)b, len);
  if (ipcref__wire_get(&w, 4) == IPCREF__CHAN_SETUP_MAGIC && !w.bad)
    return ipcref__chan_adopt(p, b, len, fds, nfds);
  IPCREF__STEP("receive");
  return ipcref__import_bytes(p, b, len, fds, nfds, stream, p->pending, n,
                              IPCREF__IMPORT_PUMP | IPCREF__IMPORT_META);
}

/* The socket's next record, within timeout_ms (see socket_record); *took
 * says a record was read off it (not on ETIMEDOUT, nor on an error before
 * one came). A stream's pieces gather in the peer (ipcref__stream_fill). */
IPCREF__PRIVATE ipcref_result ipcref__recv_socket(ipcref_peer *p,
                                                  int timeout_ms, void *stream,
                                                  int *n, int *took) {
  unsigned char *bytes;
  struct timespec end;
  int fds[IPCREF_MSG_MAX_FDS], nfds = 0, dated = 0;
  size_t len = 0;
  ipcref_result r;
  *n = 0;
  *took = 0;
  if (p->sock_type == SOCK_STREAM) {
    r = ipcref__stream_fill(p, IPCREF_MSG_MAX_BYTES, timeout_ms);
    if (r == IPCREF_ETIMEDOUT) return r; /* what came waits for the next call */
    *took = 1;
    if (r != IPCREF_OK) {
      ipcref__stream_next(p, 1);
      return r;
    }
    r = ipcref__socket_record(p, p->in + 4, p->in_len - 4, p->in_fds,
                              p->in_nfds, stream, n);
    ipcref__stream_next(p, 0); /* the record's fds were taken */
    return r;
  }
  /* No time limit: a blocking socket's read waits by itself (no poll on
   * the hand-off's way); a non-blocking one's says EAGAIN, and waits
   * then. */
  r = timeout_ms < 0 ? IPCREF_OK
                     : ipcref__wait_readable(p->fd, timeout_ms, &end, &dated);
  if (r != IPCREF_OK) return r;
  bytes = (unsigned char *)IPCREF_MALLOC(IPCREF_MSG_MAX_BYTES);
  if (!bytes) return IPCREF_ENOMEM;
  for (;;) {
    r = ipcref__recv_raw(p, bytes, &len, fds, &nfds);
    if (r != IPCREF_EAGAIN) break;
    r = ipcref__wait_again(p->fd, timeout_ms, &end, &dated);
    if (r != IPCREF_OK) break;
  }
  *took = r == IPCREF_OK || r == IPCREF_EPROTO;
  if (r == IPCREF_OK)
    r = ipcref__socket_record(p, bytes, len, fds, nfds, stream, n);
  IPCREF_FREE(bytes);
  return r;
}

/* What the channel has next, imported into p->pending (*n views), within
 * timeout_ms: a record off the ring, or the socket's next message when the
 * sender counted one before it; waiting (spinning, then asleep) while
 * there is nothing. While records wait, this makes no system call: the
 * death check (ipcref__pump), for a context with leases out or device
 * releases pending, runs when the ring is found empty. */
IPCREF__PRIVATE ipcref_result ipcref__recv_chan(ipcref_peer *p, int timeout_ms,
                                                struct timespec *end,
                                                int *dated, void *stream,
                                                int *n) {
  struct ipcref__chan_rx *x = p->rx;
  for (;;) {
    int k = ipcref__chan_next(p), took, counted = x->counted;
    ipcref_result r;
    if (k != IPCREF__CHAN_EMPTY) {
      x->dozed_ns = 0; /* the idle stretch is over */
      if (x->armed) ipcref__chan_arm(p, 0);
    }
    if (k == IPCREF__CHAN_BAD) return IPCREF_EPROTO;
    if (k == IPCREF__CHAN_GOT) {
      r = ipcref__import_bytes(p, x->rec, x->rec_len, NULL, 0, stream,
                               p->pending, n, IPCREF__IMPORT_META);
      if (r == IPCREF_OK) ipcref__chan_lease_seen(x, &p->pending[0]);
      return r;
    }
    if (k == IPCREF__CHAN_SOCK) {
      /* A counted message is waited for a while at a time: its count may
       * be taken back (its send failed with nothing sent), and records
       * pushed after that would wait behind a message that never comes. */
      int ms = ipcref__ms_until(timeout_ms, end, dated);
      int slice = counted && !x->hung && (ms < 0 || ms > IPCREF__RECOUNT_MS)
                      ? IPCREF__RECOUNT_MS
                      : ms;
      r = ipcref__recv_socket(p, slice, stream, n, &took);
      if (took && counted) x->sockets++;
      if (r == IPCREF_ETIMEDOUT && slice != ms) continue; /* look again */
      return r;
    }
    IPCREF__LOCK(p->ctx); /* where it has leases out to reclaim */
    if (p->ctx->ledgers || p->ctx->deferred) (void)ipcref__pump(p->ctx, 0);
    IPCREF__UNLOCK(p->ctx);
    r = ipcref__chan_wait(p, ipcref__ms_until(timeout_ms, end, dated));
    /* A wait that ended before the receive's time was up: look again. */
    if (r == IPCREF_ETIMEDOUT &&
        (timeout_ms < 0 ||
         (timeout_ms > 0 && ipcref__ms_left(timeout_ms, end) > 0)))
      continue;
    if (r != IPCREF_OK) return r;
  }
}

/* One message for the receiver, imported into p->pending (*n views):
 * off the socket until the other side's channel is set up, then through
 * the channel. */
IPCREF__PRIVATE ipcref_result ipcref__recv_one(ipcref_peer *p, int timeout_ms,
                                               void *stream, int *n) {
  struct timespec end;
  int took, dated = 0;
  ipcref_result r = ipcref__hello_within(p, &timeout_ms);
  if (r != IPCREF_OK) return r;
  if (p->hello < 0) return ipcref__hello_result(p);
  for (;;) {
    if (p->rx_broken) return IPCREF_EPROTO;
    if (p->rx) return ipcref__recv_chan(p, timeout_ms, &end, &dated, stream, n);
    r = ipcref__recv_socket(p, ipcref__ms_until(timeout_ms, &end, &dated),
                            stream, n, &took);
    if (r != IPCREF_OK || *n || !p->rx) return r; /* else a channel came */
  }
}

IPCREF_API ipcref_result ipcref_recv_on(ipcref_peer *p, ipcref_view *out,
                                        int timeout_ms, void *stream) {
  int n = 0;
  ipcref_result r;
  if (!p || !out) return ipcref__invalid("ipcref_recv", "p or out is NULL");
  if (timeout_ms < -1)
    return ipcref__invalid("ipcref_recv", "timeout_ms below -1");
  if (!IPCREF__PEER_USABLE(p, "ipcref_recv")) return IPCREF_EDEAD;
  if (p->pending_pos < p->npending) { /* the rest of a batch */
    *out = p->pending[p->pending_pos++];
    ipcref__chan_poll(p);
    return IPCREF_OK;
  }
  r = ipcref__recv_one(p, timeout_ms, stream, &n);
  if (r == IPCREF_OK) {
    *out = p->pending[0];
    p->npending = n;
    p->pending_pos = 1;
  }
  ipcref__chan_poll(p);                           /* the poll fd's flag */
  if (r == IPCREF_ETIMEDOUT && timeout_ms == 0) { /* a poll: not now */
    if (p->room_wait) ipcref__room_poll(p);
    ipcref__want(p, POLLIN);
    return IPCREF_EAGAIN;
  }
  return r;
}

#endif /* IPCREF__SHARING_IMPL */
