/* share_send: messages sent to the peer (those exported for the user's own
 * transport are share_msg's): into its channel (share_channel), or over
 * its socket, a datagram on SOCK_SEQPACKET, a
 * length then the record on SOCK_STREAM, the fds with them; batches and
 * their metadata. Receiving is share_recv's. Not under ctx->lock: the
 * socket may block on the peer. */

#ifdef IPCREF__SHARING_IMPL

/* ---- room in the socket ---------------------------------------------------
 * Every write is MSG_DONTWAIT. When the socket is full: a non-blocking one
 * (O_NONBLOCK) says EAGAIN at once, wanting POLLOUT; a blocking one waits,
 * up to opt.send_timeout_ms (ETIMEDOUT): one deadline for the whole send,
 * set at its first wait (for room under max_bytes_held, for the channel's
 * setup, for what an earlier record left, for the socket), and every wait
 * after it has only what is left. A message the socket has not begun to
 * take is not sent at all (its leases go back); the rest of one a stream
 * took in part waits in the peer (p->out, made before the first byte went,
 * so that keeping it cannot fail) and goes before anything else, so the
 * stream stays whole: that message was sent (its leases stay). */

/* The send's deadline: now + opt.send_timeout_ms, set when it first has
 * to wait (a send that finds room reads no clock). */
IPCREF__PRIVATE void ipcref__send_deadline(const ipcref_peer *p,
                                           struct timespec *end) {
  ipcref__deadline_ms(end, p->opt.send_timeout_ms);
}

/* Waits for room in the socket until `end` (see above; all zero: not set
 * yet). */
IPCREF__PRIVATE ipcref_result ipcref__room(ipcref_peer *p,
                                           struct timespec *end) {
  struct pollfd pfd;
  int pr;
  if (ipcref__nonblocking(p->fd)) {
    ipcref__want(p, POLLOUT);
    return IPCREF_EAGAIN;
  }
  if (!end->tv_sec && !end->tv_nsec) ipcref__send_deadline(p, end);
  pfd.fd = p->fd;
  pfd.events = POLLOUT;
  pfd.revents = 0;
  pr = poll(&pfd, 1,
            ipcref__ms_left(
                p->opt.send_timeout_ms ? p->opt.send_timeout_ms : -1, end));
  if (pr == 0) return IPCREF_ETIMEDOUT;
  return pr < 0 && errno != EINTR ? IPCREF_ESYS : IPCREF_OK;
}

/* Sends the rest of a record a stream took in part (p->out), until `end`. */
IPCREF__PRIVATE ipcref_result ipcref__flush_out(ipcref_peer *p,
                                                struct timespec *end) {
  while (p->out_pos < p->out_len) {
    ssize_t k = send(p->fd, p->out + p->out_pos, p->out_len - p->out_pos,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p->out_pos += (size_t)k;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      ipcref_result r = ipcref__room(p, end);
      if (r != IPCREF_OK) return r;
    } else if (k < 0 && errno != EINTR) {
      return errno == EPIPE || errno == ECONNRESET ? IPCREF_EPEER : IPCREF_ESYS;
    }
  }
  p->out_len = p->out_pos = 0;
  ipcref__want(p, 0);
  return IPCREF_OK;
}

/* A stream took `sent` bytes of the record `iov` (two parts, `total` in
 * all): the rest waits in p->out (made by ipcref__send_raw before the
 * first byte went), and goes now as far as it can. The record is on its
 * way whatever happens to the rest (OK: its leases stay, since the rest
 * goes first on the next send or ipcref_peer_flush, which say what stops
 * it), unless the peer hung up (EPEER: nothing more of it can go). */
IPCREF__PRIVATE ipcref_result ipcref__keep_rest(ipcref_peer *p,
                                                const struct iovec *iov,
                                                size_t sent, size_t total,
                                                struct timespec *end) {
  size_t at = 0, i;
  ipcref_result r;
  for (i = 0; i < 2; i++) { /* the whole record, then skip what went */
    memcpy(p->out + at, iov[i].iov_base, iov[i].iov_len);
    at += iov[i].iov_len;
  }
  p->out_len = total;
  p->out_pos = sent;
  r = ipcref__flush_out(p, end);
  return r == IPCREF_EPEER ? r : IPCREF_OK;
}

/* Sends a record with fds: one datagram on SOCK_SEQPACKET; on SOCK_STREAM a
 * 4-byte length first (the fds travel with it). What an earlier record
 * left goes first. Waits until the send's deadline `end` (see above).
 * Any error but EPEER: nothing of this one was sent. */
IPCREF__PRIVATE ipcref_result ipcref__send_raw(ipcref_peer *p,
                                               const ipcref_msg *msg,
                                               struct timespec *end) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * IPCREF_MSG_MAX_FDS)];
    struct cmsghdr align;
  } u;
  unsigned char lenbuf[4];
  ipcref__wire w;
  struct iovec iov[2];
  struct msghdr mh;
  int stream = p->sock_type == SOCK_STREAM;
  ipcref_result r;
  /* Room for a rest, before any byte goes: a record cut in the middle
   * could not be taken back, and the receiver would read what follows as
   * its rest. Made once, kept until the peer is freed. */
  if (stream && !p->out &&
      !(p->out =
            (unsigned char *)IPCREF_MALLOC(4 + (size_t)IPCREF_MSG_MAX_BYTES)))
    return IPCREF_ENOMEM;
  r = ipcref__flush_out(p, end);
  if (r != IPCREF_OK) return r;
  memset(&mh, 0, sizeof mh);
  ipcref__wire_init(&w, lenbuf, 4);
  ipcref__wire_put(&w, msg->len, 4);
  iov[0].iov_base = lenbuf;
  iov[0].iov_len = 4;
  iov[1].iov_base = (void *)(uintptr_t)msg->bytes;
  iov[1].iov_len = msg->len;
  mh.msg_iov = stream ? iov : iov + 1;
  mh.msg_iovlen = stream ? 2 : 1;
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
  for (;;) {
    ssize_t k = sendmsg(p->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k >= 0) {
      size_t total = msg->len + (stream ? 4 : 0);
      r = (size_t)k == total ? IPCREF_OK
                             : ipcref__keep_rest(p, iov, (size_t)k, total, end);
      ipcref__want(p, 0); /* POLLOUT while a rest waits (see ipcref__want) */
      return r;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      r = ipcref__room(p, end); /* nothing of it sent yet */
      if (r != IPCREF_OK) return r;
    } else if (errno != EINTR) {
      return errno == EPIPE || errno == ECONNRESET ? IPCREF_EPEER : IPCREF_ESYS;
    }
  }
}

/* ---- the channel ---------------------------------------------------------
 * (see share_channel) Opened on the first send once the other side's hello
 * came: its setup record goes on the socket, before anything the ring
 * carries. A ring that cannot be made (out of memfds, say) leaves the
 * socket carrying everything; so does ring_bytes IPCREF_KEEP_NONE. */

IPCREF__PRIVATE ipcref_result ipcref__channel_open(ipcref_peer *p,
                                                   struct timespec *end) {
  struct ipcref__chan_tx *t;
  ipcref_msg setup;
  size_t bytes = ipcref__chan_size(&p->opt);
  ipcref_result r;
  int i;
  if (p->tx || p->tx_off || !bytes) return IPCREF_OK;
  if (ipcref__chan_make(bytes, &t, &setup) != IPCREF_OK) {
    p->tx_off = 1;
    return IPCREF_OK;
  }
  r = ipcref__send_raw(p, &setup, end);
  for (i = 0; i < setup.nfds; i++) close(setup.fds[i]);
  if (r == IPCREF_OK)
    p->tx = t;
  else
    ipcref__chan_tx_free(t); /* EAGAIN: nothing went; made again next time */
  return r;
}

/* Sends a message built for the peer: into the ring when it needs no fds
 * and fits, else on the socket (counted, so that the other side keeps the
 * order). The channel's setup, on the first, and what a stream left
 * unsent go first, all within the send's deadline `end`. */
IPCREF__PRIVATE ipcref_result ipcref__chan_send(ipcref_peer *p,
                                                const ipcref_msg *msg,
                                                struct timespec *end) {
  ipcref_result r = ipcref__channel_open(p, end);
  if (r != IPCREF_OK) return r;
  if (p->tx && ipcref__chan_gone(p)) return IPCREF_EPEER;
  if (p->tx && msg->nfds == 0) {
    r = p->out_len ? ipcref__flush_out(p, end) : IPCREF_OK;
    if (r != IPCREF_OK) return r;
    if (ipcref__chan_push(p, msg->bytes, msg->len)) {
      p->sent_channel++;
      if (p->wants) ipcref__want(p, 0);
      return IPCREF_OK;
    }
  }
  /* Not under the lock: the socket may block on the peer. */
  if (p->tx) ipcref__chan_count(p, 1, 0);
  r = ipcref__send_raw(p, msg, end);
  if (p->tx) ipcref__chan_count(p, 0, r == IPCREF_OK);
  if (r == IPCREF_OK) p->sent_socket++;
  return r;
}

/* ipcref_send, ipcref_send_batch, ipcref_send_meta and ipcref_send_on:
 * the events recorded, the leases taken and the message built under the
 * lock, then sent outside it; a message that could not be sent gives its
 * leases back. Then, under the lock again, the next leases' slots are
 * published (ipcref__slots_top_up). Every wait in it (room under the
 * cap, then in the socket) ends at one deadline, send_timeout_ms after the
 * first began. `fn` names the public call in reports. */
IPCREF__PRIVATE ipcref_result ipcref__send_views(ipcref_peer *p,
                                                 const ipcref_view *views,
                                                 int n,
                                                 const ipcref__meta *meta,
                                                 void *stream, const char *fn) {
  ipcref__view_event ev[IPCREF_MSG_MAX_VIEWS];
  ipcref_msg msg;
  struct timespec end = {0, 0}; /* the send's deadline: set at its first wait */
  ipcref_result r;
  if (!p || !views) return ipcref__invalid(fn, "p or views is NULL");
  if (n < 1 || n > IPCREF_MSG_MAX_VIEWS)
    return ipcref__invalid(fn, "n not in 1..IPCREF_MSG_MAX_VIEWS");
  if (!IPCREF__PEER_USABLE(p, fn)) return IPCREF_EDEAD;
  r = ipcref__views_check(p, views, n, fn);
  if (r == IPCREF_OK) r = ipcref__hello_need(p);
  if (r == IPCREF_OK) r = ipcref__room_take(p, views, n, &end);
  if (r == IPCREF_OK) r = ipcref__events_record(views, n, stream, ev);
  if (r != IPCREF_OK) return r;
  msg.len = 0;
  msg.nfds = 0;
  IPCREF__LOCK(p->ctx);
  r = ipcref__export_msg(p, views, n, ev, meta, &msg, 0); /* fds borrowed */
  IPCREF__UNLOCK(p->ctx);
  ipcref__events_free(ev, n); /* what no lease took */
  if (r != IPCREF_OK) return r;
  IPCREF__STEP("send");
  r = ipcref__chan_send(p, &msg, &end);
  IPCREF__LOCK(p->ctx);
  if (r != IPCREF_OK) /* its fds are borrowed: not ours to close */
    ipcref__msg_cancel(p->ctx, p, msg.bytes, msg.len);
  if (p->ledger) ipcref__slots_top_up(p->ledger, p->pid);
  IPCREF__UNLOCK(p->ctx);
  return r;
}

IPCREF_API ipcref_result ipcref_peer_flush(ipcref_peer *p) {
  struct timespec end = {0, 0};
  if (!p) return ipcref__invalid(__func__, "p is NULL");
  if (!IPCREF__PEER_USABLE(p, "ipcref_peer_flush")) return IPCREF_EDEAD;
  return ipcref__flush_out(p, &end);
}

static const ipcref__meta ipcref__no_meta = {NULL, 0};

IPCREF_API ipcref_result ipcref_send_batch(ipcref_peer *p,
                                           const ipcref_view *views, int n) {
  return ipcref__send_views(p, views, n, &ipcref__no_meta, NULL,
                            "ipcref_send_batch");
}

IPCREF_API ipcref_result ipcref_send(ipcref_peer *p, const ipcref_view *v) {
  return ipcref__send_views(p, v, 1, &ipcref__no_meta, NULL, "ipcref_send");
}

IPCREF_API ipcref_result ipcref_send_meta(ipcref_peer *p,
                                          const ipcref_view *views, int n,
                                          const void *meta, size_t meta_len) {
  ipcref__meta m;
  ipcref_result r = ipcref__meta_arg(meta, meta_len, "ipcref_send_meta", &m);
  return r != IPCREF_OK
             ? r
             : ipcref__send_views(p, views, n, &m, NULL, "ipcref_send_meta");
}

IPCREF_API ipcref_result ipcref_send_on(ipcref_peer *p, const ipcref_view *v,
                                        void *stream) {
  return ipcref__send_views(p, v, 1, &ipcref__no_meta, stream,
                            "ipcref_send_on");
}

#endif /* IPCREF__SHARING_IMPL */
