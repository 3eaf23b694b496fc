/* share_peer: the other process. The hello that identifies it (pid and
 * uid by SCM_CREDENTIALS, the uid policy; its socket's reads are
 * share_socket's), what it has been sent, and the peer's own calls: new,
 * pid, alive, free. A peer is used by one thread at a time; what it shares
 * with its context is under ctx->lock. */

#ifdef IPCREF__SHARING_IMPL

/* ---- the hello ----------------------------------------------------------
 * The first message each side sends: "IPCH", version, pid, ctx nonce,
 * with SCM_CREDENTIALS (the kernel refuses a pid or uid that is not the
 * sender's). On a stream it is framed like every message (a 4-byte length
 * first). */
#define IPCREF__HELLO_MAGIC 0x48435049u /* "IPCH" */
#define IPCREF__HELLO_BYTES 20

/* Sends this side's hello, with its credentials (SCM_CREDENTIALS). */
IPCREF__PRIVATE ipcref_result ipcref__hello_send(ipcref_peer *p) {
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
  ipcref__wire_init(&w, b, sizeof b);
  if (stream) ipcref__wire_put(&w, IPCREF__HELLO_BYTES, 4);
  ipcref__wire_put(&w, IPCREF__HELLO_MAGIC, 4);
  ipcref__wire_put(&w, IPCREF__MSG_VERSION, 4);
  ipcref__wire_put(&w, (uint64_t)p->ctx->pid, 4);
  ipcref__wire_put(&w, p->ctx->nonce, 8);
  cred.pid = getpid();
  cred.uid = getuid();
  cred.gid = getgid();
  memset(&u, 0, sizeof u);
  ipcref__msghdr_one(&mh, &iov, b, w.pos, u.buf, sizeof u.buf);
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
IPCREF__PRIVATE int ipcref__uid_allowed(const ipcref_ctx *ctx, uint32_t uid) {
  size_t i;
  if (uid == (uint32_t)ctx->uid) return 1;
  for (i = 0; i < ctx->opt.allow_uids_count; i++)
    if (ctx->uids[i] == uid) return 1;
  return 0;
}

/* The peer's hello state (1 read, 0 awaited, -1 bad, -2 refused), set by
 * its own thread. Other threads read it under the context's lock
 * (ipcref_ctx_timeout, a peer freed there: ipcref__origin_here), which its
 * thread does not take: atomic, and release, so that one that sees 1 sees
 * the nonce and pid written before. */
IPCREF__PRIVATE void ipcref__hello_set(ipcref_peer *p, int v) {
  __atomic_store_n(&p->hello, v, __ATOMIC_RELEASE);
}

/* A peer refused (its uid): counted and reported, and nothing goes to it
 * or comes from it. */
IPCREF__PRIVATE ipcref_result ipcref__peer_refuse(ipcref_peer *p) {
  ipcref_ctx *ctx = p->ctx;
  ipcref__hello_set(p, -2);
  __atomic_fetch_add(&ctx->refused, 1, __ATOMIC_RELAXED);
  IPCREF__LOCK(ctx);
  ipcref__ctx_report(ctx, IPCREF_EPEER, "peer of a uid not allowed refused");
  IPCREF__UNLOCK(ctx);
  return IPCREF_EPEER;
}

/* What the hello read says: OK, EPEER for a uid not allowed, EPROTO for
 * a malformed one. */
IPCREF__PRIVATE ipcref_result ipcref__hello_result(const ipcref_peer *p) {
  if (p->hello > 0) return IPCREF_OK;
  return p->hello == -2 ? IPCREF_EPEER : IPCREF_EPROTO;
}

/* The other side's hello as it came: into b (4 + IPCREF__HELLO_BYTES; its
 * length first on a stream), *k bytes, with the sender's credentials into
 * p->in_pid / in_uid (0: none came), waiting up to timeout_ms (-1:
 * forever). A stream's hello may come in pieces (see stream_fill). */
IPCREF__PRIVATE ipcref_result ipcref__hello_bytes(ipcref_peer *p,
                                                  int timeout_ms,
                                                  unsigned char *b,
                                                  ssize_t *k) {
  struct timespec end;
  int resets = 0, dated = 0;
  ipcref_result r;
  if (p->sock_type == SOCK_STREAM) {
    r = ipcref__stream_fill(p, IPCREF__HELLO_BYTES, timeout_ms);
    if (r != IPCREF_OK) return r;
    memcpy(b, p->in, p->in_len);
    *k = (ssize_t)p->in_len;
    ipcref__stream_next(p, 1); /* fds have no place in a hello */
    return IPCREF_OK;
  }
  /* A seqpacket record comes whole: one piece, read into b (with no time
   * limit, a blocking socket's read waits by itself). */
  r = timeout_ms < 0 ? IPCREF_OK
                     : ipcref__wait_readable(p->fd, timeout_ms, &end, &dated);
  if (r != IPCREF_OK) return r;
  for (;;) {
    *k = ipcref__stream_piece(p, b, IPCREF__HELLO_BYTES);
    ipcref__stream_next(p, 1); /* fds have no place in a hello */
    if (*k < 0 && (errno == EINTR || (errno == ECONNRESET && !resets++)))
      continue; /* a reset: what it sent before is still queued here */
    if (*k >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) break;
    r = ipcref__wait_again(p->fd, timeout_ms, &end, &dated);
    if (r != IPCREF_OK) return r;
  }
  if (*k == 0 || (*k < 0 && errno == ECONNRESET)) return IPCREF_EPEER;
  return *k < 0 ? IPCREF_ESYS : IPCREF_OK;
}

/* A hello refused for good (EPROTO), named to the context's hook. */
IPCREF__PRIVATE ipcref_result ipcref__hello_bad(ipcref_peer *p,
                                                const char *why) {
  ipcref__hello_set(p, -1);
  ipcref__ctx_report(p->ctx, IPCREF_EPROTO, why);
  return IPCREF_EPROTO;
}

/* Reads the other side's hello (the first thing it sends), waiting up to
 * timeout_ms (-1: forever), and checks it: magic, version, credentials. */
IPCREF__PRIVATE ipcref_result ipcref__hello_read(ipcref_peer *p,
                                                 int timeout_ms) {
  unsigned char b[4 + IPCREF__HELLO_BYTES];
  ipcref__wire w;
  int stream = p->sock_type == SOCK_STREAM;
  size_t want = IPCREF__HELLO_BYTES + (stream ? 4u : 0u);
  ssize_t k = 0;
  uint32_t version;
  ipcref_result r;
  if (p->hello) return ipcref__hello_result(p);
  p->in_pid = p->in_uid = 0;
  r = ipcref__hello_bytes(p, timeout_ms, b, &k);
  if (r == IPCREF_EPROTO)
    return ipcref__hello_bad(p, "peer refused: its hello came cut short");
  if (r != IPCREF_OK) return r;
  ipcref__wire_init(&w, b, (size_t)k);
  if ((stream && ipcref__wire_get(&w, 4) != IPCREF__HELLO_BYTES) ||
      ipcref__wire_get(&w, 4) != IPCREF__HELLO_MAGIC || w.bad)
    return ipcref__hello_bad(p, "peer refused: its hello is not ipcref's");
  version = (uint32_t)ipcref__wire_get(&w, 4);
  if (version != IPCREF__MSG_VERSION && !w.bad) { /* another build */
    char why[128];
    snprintf(why, sizeof why,
             "peer refused: it speaks wire version %u, this process %u "
             "(two builds of ipcref.h that cannot talk)",
             (unsigned)version, (unsigned)IPCREF__MSG_VERSION);
    return ipcref__hello_bad(p, why);
  }
  if (w.bad || (size_t)k != want || p->in_pid <= 0)
    return ipcref__hello_bad(p, "peer refused: its hello is of the wrong "
                                "length, or came without credentials");
  p->pid = p->in_pid; /* the kernel's word, not the record's */
  p->uid = p->in_uid;
  (void)ipcref__wire_get(&w, 4); /* its pid */
  p->nonce = ipcref__wire_get(&w, 8);
  if (!ipcref__uid_allowed(p->ctx, (uint32_t)p->uid))
    return ipcref__peer_refuse(p);
  ipcref__hello_set(p, 1); /* after its nonce and pid: see hello_set */
  /* Watch the process itself (a pidfd: pids get reused). */
  IPCREF__LOCK(p->ctx);
  p->watch = ipcref__watch_get(p->ctx, p->pid, 0);
  IPCREF__UNLOCK(p->ctx);
  return IPCREF_OK;
}

/* A freed peer is kept, marked dead, so that a later call on it is
 * refused, not a use of freed memory (under the lock): in its context's
 * last IPCREF__DEAD_PEERS (freed with the context), or with
 * IPCREF_CHECKED in the process-wide quarantine (see checked). */
#define IPCREF__DEAD_PEERS 8
IPCREF__PRIVATE void ipcref__peer_bury(ipcref_ctx *ctx, ipcref_peer *p) {
  p->magic = IPCREF__DEAD;
#ifdef IPCREF_CHECKED
  (void)ctx;
  ipcref__bury(p, sizeof *p, sizeof p->magic, ipcref__free_plain, NULL);
#else
  p->next = ctx->dead_peers;
  ctx->dead_peers = p;
  if (++ctx->ndead_peers > IPCREF__DEAD_PEERS) { /* the oldest goes */
    ipcref_peer *q = ctx->dead_peers;
    while (q->next->next) q = q->next;
    IPCREF_FREE(q->next);
    q->next = NULL;
    ctx->ndead_peers--;
  }
#endif
}

/* 1 when options `o` (may be NULL) make sense; else reported, naming the
 * public call `fn`. */
IPCREF__PRIVATE int ipcref__options_ok(const ipcref_peer_options *o,
                                       const char *fn) {
  if (o && (o->send_timeout_ms < 0 || o->hello_timeout_ms < 0)) {
    (void)ipcref__invalid(fn, "a negative timeout in the options");
    return 0;
  }
  if (o && o->spin_us < IPCREF_SPIN_AUTO) {
    (void)ipcref__invalid(fn, "spin_us below IPCREF_SPIN_AUTO");
    return 0;
  }
  if (o && o->ring_bytes > ((size_t)16 << 20)) {
    (void)ipcref__invalid(fn, "ring_bytes over 16 MiB");
    return 0;
  }
  return 1;
}

IPCREF__PRIVATE void ipcref__options_set(ipcref_peer *p,
                                         const ipcref_peer_options *o) {
  memset(&p->opt, 0, sizeof p->opt);
  p->opt.spin_us = IPCREF_SPIN_AUTO; /* the default; 0 in options: none */
  if (o) p->opt = *o;
  if (!p->opt.hello_timeout_ms) p->opt.hello_timeout_ms = 5000;
}

IPCREF_API ipcref_result ipcref_peer_set_options(ipcref_peer *p,
                                                 const ipcref_peer_options *o) {
  if (!p) return ipcref__invalid(__func__, "p is NULL");
  if (!ipcref__options_ok(o, __func__)) return IPCREF_EINVAL;
  if (!IPCREF__PEER_USABLE(p, "ipcref_peer_set_options")) return IPCREF_EDEAD;
  IPCREF__LOCK(p->ctx); /* other threads read them under it (a sweep's
                           look at who waits for room, the hello's time) */
  ipcref__options_set(p, o);
  IPCREF__UNLOCK(p->ctx);
  return IPCREF_OK;
}

/* What is wrong with `sockfd` for a peer (NULL: nothing), its type and
 * the credentials of who made the other end into *cred; *r the code. */
IPCREF__PRIVATE const char *
ipcref__sock_why(int sockfd, int *type, struct ucred *cred, ipcref_result *r) {
  int listening = 0;
  socklen_t len = sizeof *cred, tlen = sizeof *type, llen = sizeof listening;
  *r = IPCREF_EINVAL;
  if (sockfd < 0) return "sockfd is negative";
  if (getsockopt(sockfd, SOL_SOCKET, SO_TYPE, type, &tlen) != 0) {
    if (errno == ENOTSOCK || errno == EBADF) return "sockfd is not a socket";
    *r = IPCREF_ESYS;
    return "getsockopt";
  }
  if (*type != SOCK_STREAM && *type != SOCK_SEQPACKET)
    return "sockfd is neither SOCK_STREAM nor SOCK_SEQPACKET";
  /* A listening socket has credentials too: its own. */
  if (getsockopt(sockfd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &llen) != 0 ||
      listening ||
      getsockopt(sockfd, SOL_SOCKET, SO_PEERCRED, cred, &len) != 0 ||
      cred->pid <= 0)
    return "sockfd is not a connected AF_UNIX socket";
  return NULL;
}

/* ipcref_peer_new and ipcref_peer_new_with; `fn` names the call. */
IPCREF__PRIVATE ipcref_result ipcref__peer_make(ipcref_ctx *ctx, int sockfd,
                                                const ipcref_peer_options *opt,
                                                ipcref_peer **out,
                                                const char *fn) {
  ipcref_peer *p;
  struct ucred cred;
  int type = 0;
  ipcref_result r;
  const char *why;
  if (!ctx || !out) return ipcref__invalid(fn, "ctx or out is NULL");
  if (!ipcref__options_ok(opt, fn)) return IPCREF_EINVAL;
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  if ((why = ipcref__sock_why(sockfd, &type, &cred, &r)) != NULL)
    return r == IPCREF_EINVAL ? ipcref__invalid(fn, why) : r;
  if (!ipcref__uid_allowed(ctx, (uint32_t)cred.uid)) {
    /* Who connected (or made the pair) is not allowed: say nothing. */
    __atomic_fetch_add(&ctx->refused, 1, __ATOMIC_RELAXED);
    return IPCREF_EPEER;
  }
  p = (ipcref_peer *)ipcref__zalloc(sizeof *p);
  if (!p) return IPCREF_ENOMEM;
  p->magic = IPCREF__ALIVE;
  p->ctx = ctx;
  p->fd = sockfd;
  p->pid = (int)cred.pid;
  p->uid = (int)cred.uid;
  p->sock_type = type;
  p->poll_fd = p->batch_fd = p->bell_in = -1;
  ipcref__options_set(p, opt);
  {
    int on = 1;
    r = IPCREF_ESYS;
    if (setsockopt(sockfd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0 ||
        (r = ipcref__hello_send(p)) != IPCREF_OK) {
      IPCREF_FREE(p);
      return r;
    }
  }
  IPCREF__LOCK(ctx);
  IPCREF__LIST_PUSH(ctx->peers, p, next, prev);
  p->serial = ++ctx->peer_serials;
  ctx->st.peers++;
  IPCREF__UNLOCK(ctx);
  *out = p;
  return IPCREF_OK;
}

IPCREF_API ipcref_result ipcref_peer_new(ipcref_ctx *ctx, int sockfd,
                                         ipcref_peer **out) {
  return ipcref__peer_make(ctx, sockfd, NULL, out, "ipcref_peer_new");
}

IPCREF_API ipcref_result ipcref_peer_new_with(ipcref_ctx *ctx, int sockfd,
                                              const ipcref_peer_options *opt,
                                              ipcref_peer **out) {
  return ipcref__peer_make(ctx, sockfd, opt, out, "ipcref_peer_new_with");
}

IPCREF_API int ipcref_peer_pid(ipcref_peer *p) {
  if (!p || !IPCREF__PEER_USABLE(p, "ipcref_peer_pid")) return 0;
  if (!p->hello) (void)ipcref__hello_read(p, 5000);
  return p->pid;
}

IPCREF_API int ipcref_peer_alive(ipcref_peer *p) {
  struct pollfd pfd;
  int alive;
  if (!p || !IPCREF__PEER_USABLE(p, "ipcref_peer_alive")) return 0;
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

IPCREF_API ipcref_result ipcref_peer_stats(ipcref_peer *p,
                                           ipcref_peer_info *out) {
  ipcref_ctx *ctx;
  ipcref__ledger *l;
  uint32_t s;
  if (!p || !out) return ipcref__invalid(__func__, "p or out is NULL");
  if (!IPCREF__PEER_USABLE(p, "ipcref_peer_stats")) return IPCREF_EDEAD;
  memset(out, 0, sizeof *out);
  out->alive = ipcref_peer_alive(p);
  out->pid = p->pid;
  out->pending = (size_t)(p->npending - p->pending_pos);
  out->sent_channel = p->sent_channel;
  out->sent_socket = p->sent_socket;
  out->channel_out = p->tx ? (ipcref__chan_tx_broken(p) ? -1 : 1) : 0;
  out->channel_in = p->rx_broken ? -1 : p->rx ? 1 : 0;
  ctx = p->ctx;
  IPCREF__LOCK(ctx);
  ipcref__sweep(ctx); /* what came back is not held */
  out->maps = p->nmaps;
  out->mapped_bytes = p->mapped_bytes;
  for (l = ctx->ledgers; l; l = l->next) {
    if (l->peer != p || l->live == 0) continue;
    for (s = 0; s < l->n; s++) {
      const ipcref__block *b = l->leases[s].block;
      if (!b) continue;
      if (s < l->n / 2) {
        out->leases++;
        out->bytes_held += b->size;
      } else {
        out->forwarded++;
        out->forwarded_bytes += b->size;
      }
    }
  }
  IPCREF__UNLOCK(ctx);
  return IPCREF_OK;
}

IPCREF_API void ipcref_peer_free(ipcref_peer *p) {
  ipcref_ctx *ctx;
  ipcref__ledger *l;
  long drained;
  int i;
  if (!p || !IPCREF__PEER_USABLE(p, "ipcref_peer_free")) return;
  ctx = p->ctx;
  /* Read what the other side sent and nobody will: the leases in it go
   * back at once, and closing a socket with unread data would reset the
   * connection, so the other side would lose what we sent it. Shut for
   * reading first: what it sends from now on fails there (EPEER, its
   * leases back) instead of going down with the socket, unread. */
  (void)shutdown(p->fd, SHUT_RD);
  ipcref__chan_closing(p);
  for (drained = 0; drained < IPCREF__FREE_DRAIN; drained++) {
    ipcref_view v;
    ipcref_result r = ipcref_recv(p, &v, 0);
    if (r == IPCREF_OK) ipcref_view_release(&v);
    if (r != IPCREF_OK && r != IPCREF_ERANGE) break; /* ERANGE: gave back */
  }
  IPCREF__STEP("peer free"); /* drained; the socket not closed yet */
  IPCREF__LOCK(ctx);
  IPCREF__LIST_REMOVE(ctx->peers, p, next, prev);
  /* Its ledgers stay until every lease in them comes back, or their
   * holder dies (they watch it on their own). */
  for (l = ctx->ledgers; l; l = l->next)
    if (l->peer == p) l->peer = NULL;
  ctx->st.peers--;
  if (p->room_wait) ipcref__room_update(ctx); /* it waits no more */
  if (ipcref__retire_origin(ctx, p)) ipcref__maps_trim(ctx, 0);
  ipcref__maps_unvia(ctx, p);
  for (i = 0; i < IPCREF__KEPT; i++)
    if (p->kept[i]) ipcref__map_drop(p->kept[i]);
  ipcref__watch_put(ctx, p->watch);
  ipcref__sweep(ctx);
  (void)ipcref__pump(ctx, 0);
  close(p->fd);
  ipcref__chan_close(p);
  ipcref__stream_next(p, 1); /* a record cut short: its fds */
  IPCREF_FREE(p->in);
  IPCREF_FREE(p->out);
  if (p->poll_fd >= 0) close(p->poll_fd);
  if (p->batch_fd >= 0) close(p->batch_fd);
  IPCREF_FREE(p->sent);
  IPCREF_FREE(p->retired);
  IPCREF_FREE(p->refused);
  ipcref__peer_bury(ctx, p);
  IPCREF__UNLOCK(ctx);
}

#endif /* IPCREF__SHARING_IMPL */
