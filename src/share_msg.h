/* share_msg: messages for the user's own transport. Exporting one
 * (ipcref_export, ipcref_export_meta), importing one (ipcref_import: the
 * checks are share_import's), reading its metadata, and settling it:
 * ipcref_msg_sent (delivered: its leases are the receiver's now) or
 * ipcref_msg_free (never delivered: its leases end here). A message names
 * who exported it by ids, the context's nonce and the peer's serial, so
 * that one which outlives its peer or its context, a copy, or one from
 * another process is settled without a stale pointer: the context is
 * looked up among the live ones (ipcref__live_find), the peer among its
 * peers. Before either, the other side's hello. Under ctx->lock but for
 * the exports' checks and events, and the hello. */

#ifdef IPCREF__SHARING_IMPL

/* Before anything goes to a peer or is taken from it (not under the
 * lock): its hello (the other side sends it from ipcref_peer_new), within
 * opt.hello_timeout_ms of the first call that needed it. Nothing is leased
 * to a process we have not identified: its uid decides whether it may
 * connect, and its pid is what is watched for its death (and what a
 * forwarded hold names). Reading it also leaves nothing unread on a
 * producer that only sends (see ipcref__recvmsg). A blocking socket waits
 * for it; a non-blocking one says EAGAIN (wanting POLLIN) until then, so a
 * silent client never holds up an event loop. */
IPCREF__PRIVATE ipcref_result ipcref__hello_need(ipcref_peer *p) {
  long now, left;
  int nonblocking;
  ipcref_result r;
  if (p->hello) return ipcref__hello_result(p);
  now = ipcref__now_ms();
  if (!p->hello_since) /* atomic: ipcref_ctx_timeout reads it */
    __atomic_store_n(&p->hello_since, now, __ATOMIC_RELAXED);
  left = p->hello_since + p->opt.hello_timeout_ms - now;
  nonblocking = ipcref__nonblocking(p->fd);
  r = ipcref__hello_read(p, left > 0 && !nonblocking ? (int)left : 0);
  if (r != IPCREF_ETIMEDOUT)
    return r == IPCREF_OK ? ipcref__hello_result(p) : r;
  if (left > 0 && nonblocking) {
    ipcref__want(p, POLLIN);
    return IPCREF_EAGAIN;
  }
  ipcref__hello_set(p, -2); /* too late: refused for good */
  ipcref__ctx_report(p->ctx, IPCREF_EPEER,
                     "peer refused: its hello did not come in time "
                     "(hello_timeout_ms)");
  return IPCREF_EPEER;
}

/* ipcref_export and ipcref_export_meta; `fn` names the call. */
IPCREF__PRIVATE ipcref_result ipcref__export_one(ipcref_peer *p,
                                                 const ipcref_view *v,
                                                 const ipcref__meta *meta,
                                                 ipcref_msg *msg,
                                                 const char *fn) {
  ipcref__view_event ev[1];
  ipcref_result r;
  if (!p || !v || !msg) return ipcref__invalid(fn, "p, v or msg is NULL");
  if (!IPCREF__PEER_USABLE(p, fn)) return IPCREF_EDEAD;
  r = ipcref__views_check(p, v, 1, fn);
  if (r != IPCREF_OK) return r;
  msg->len = 0;
  msg->nfds = 0;
  msg->origin_ctx = msg->origin_peer = 0;
  r = ipcref__hello_need(p);
  if (r == IPCREF_OK) r = ipcref__events_record(v, 1, NULL, ev);
  if (r != IPCREF_OK) return r;
  IPCREF__LOCK(p->ctx);
  r = ipcref__export_msg(p, v, 1, ev, meta, msg, 1);
  if (r == IPCREF_OK) {
    msg->origin_ctx = p->ctx->nonce;
    msg->origin_peer = p->serial;
  }
  IPCREF__UNLOCK(p->ctx);
  ipcref__events_free(ev, 1); /* what no lease took */
  return r;
}

IPCREF_API ipcref_result ipcref_export(ipcref_peer *p, const ipcref_view *v,
                                       ipcref_msg *msg) {
  static const ipcref__meta none = {NULL, 0};
  return ipcref__export_one(p, v, &none, msg, "ipcref_export");
}

IPCREF_API ipcref_result ipcref_export_meta(ipcref_peer *p,
                                            const ipcref_view *v,
                                            const void *meta, size_t meta_len,
                                            ipcref_msg *msg) {
  ipcref__meta m;
  ipcref_result r = ipcref__meta_arg(meta, meta_len, "ipcref_export_meta", &m);
  return r != IPCREF_OK
             ? r
             : ipcref__export_one(p, v, &m, msg, "ipcref_export_meta");
}

IPCREF_API const void *ipcref_msg_meta(const ipcref_msg *msg, size_t *len) {
  const unsigned char *m;
  size_t n = 0;
  if (len) *len = 0;
  if (!msg || !len || msg->len > sizeof msg->bytes) return NULL;
  m = ipcref__msg_meta_at(msg->bytes, msg->len, &n);
  *len = n;
  return n ? m : NULL;
}

IPCREF_API ipcref_result ipcref_import(ipcref_peer *p, ipcref_msg *msg,
                                       ipcref_view *out) {
  ipcref_view views[IPCREF_MSG_MAX_VIEWS];
  ipcref_result r;
  int n = 0, i;
  if (!p || !msg || !out)
    return ipcref__invalid(__func__, "p, msg or out is NULL");
  if (msg->nfds < 0 || msg->nfds > IPCREF_MSG_MAX_FDS ||
      msg->len > sizeof msg->bytes)
    return ipcref__invalid(__func__, "msg->nfds or msg->len out of range");
  if (!IPCREF__PEER_USABLE(p, "ipcref_import")) {
    r = IPCREF_EDEAD;
  } else if (msg->origin_ctx && msg->origin_ctx == p->ctx->nonce &&
             msg->origin_peer == p->serial) {
    return ipcref__invalid(__func__, "msg was exported through this peer (to "
                                     "settle it: ipcref_msg_free)");
  } else {
    r = ipcref__hello_need(p);
    /* Exported here for another process: no import here can take it, and
     * one refused would leave its leases to nobody (msg_free ends them). */
    if (r == IPCREF_OK && msg->origin_ctx == p->ctx->nonce &&
        p->nonce != p->ctx->nonce)
      return ipcref__invalid(__func__,
                             "msg was exported by this context, for another "
                             "process (to settle it: ipcref_msg_free)");
  }
  if (r == IPCREF_OK)
    r = ipcref__import_bytes(p, msg->bytes, msg->len, msg->fds, msg->nfds, NULL,
                             views, &n, IPCREF__IMPORT_PUMP);
  else
    for (i = 0; i < msg->nfds; i++) /* its fds, as on any error */
      if (msg->fds[i] >= 0) close(msg->fds[i]);
  msg->nfds = 0; /* taken (and closed on error) */
  msg->origin_ctx = msg->origin_peer = 0;
  if (r != IPCREF_OK) return r;
  for (i = 1; i < n; i++) ipcref_view_release(&views[i]); /* one per msg */
  *out = views[0];
  return IPCREF_OK;
}

/* Ends the leases of a message exported through `p` (NULL once the peer
 * is gone) that never reached it, and forgets that the peer was sent its
 * segments and ledgers, so that the next message carries them again
 * (under the lock). */
IPCREF__PRIVATE void ipcref__msg_cancel(ipcref_ctx *ctx, ipcref_peer *p,
                                        unsigned char *bytes, size_t len) {
  ipcref__wire w;
  ipcref__msg_head head;
  ipcref__view_rec rec;
  int i;
  ipcref__wire_init(&w, bytes, len);
  if (!ipcref__get_msg_head(&w, &head))
    head.nviews = head.nrecs = head.nretired = 0;
  for (i = 0; i < head.nrecs && !w.bad; i++) {
    ipcref__fd_rec f;
    if (ipcref__get_fd_rec(&w, &f) && p) ipcref__sent_unsend_recs(p, &f, 1);
  }
  w.pos += (size_t)head.nretired * 8;
  for (i = 0; i < head.nviews && ipcref__get_view(&w, &rec); i++)
    ipcref__lease_cancel(ctx, &rec);
}

/* The live peer of `ctx` with `serial`, or NULL (under the lock). */
IPCREF__PRIVATE ipcref_peer *ipcref__peer_by_serial(ipcref_ctx *ctx,
                                                    uint64_t serial) {
  ipcref_peer *p;
  for (p = ctx->peers; p && p->serial != serial; p = p->next) {
  }
  return p;
}

/* Closes the fds a message holds. */
IPCREF__PRIVATE void ipcref__msg_close(ipcref_msg *msg) {
  int i;
  for (i = 0; i < msg->nfds && i < IPCREF_MSG_MAX_FDS; i++)
    if (msg->fds[i] >= 0) close(msg->fds[i]);
  msg->nfds = 0;
}

IPCREF_API void ipcref_msg_sent(ipcref_msg *msg) {
  if (!msg) return;
  ipcref__msg_close(msg);
  msg->origin_ctx = msg->origin_peer = 0;
}

IPCREF_API void ipcref_msg_free(ipcref_msg *msg) {
  ipcref_ctx *ctx;
  if (!msg) return;
  ipcref__msg_close(msg);
  /* Exported here and never imported: end the leases it carries. */
  ctx = msg->origin_ctx && msg->len <= sizeof msg->bytes
            ? ipcref__live_find(msg->origin_ctx)
            : NULL;
  if (ctx) {
    IPCREF__LOCK(ctx);
    ipcref__msg_cancel(ctx, ipcref__peer_by_serial(ctx, msg->origin_peer),
                       msg->bytes, msg->len);
    IPCREF__UNLOCK(ctx);
    ipcref__ctx_unref(ctx); /* ipcref__live_find's */
  }
  msg->origin_ctx = msg->origin_peer = 0;
  msg->len = 0;
}

#endif /* IPCREF__SHARING_IMPL */
