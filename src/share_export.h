/* share_export: handing views to a peer. A lease per view (in the peer's
 * ledger for an own block, in the producer's ledger for a forwarded
 * import), an event per device view (recorded before the lock is taken),
 * the fds the peer lacks, and the message built from them; a lease whose
 * message never leaves is cancelled. Under ctx->lock. */

#ifdef IPCREF__SHARING_IMPL

/* A ledger of this context by its id, or NULL (under the lock). */
IPCREF__PRIVATE ipcref__ledger *ipcref__ledger_find(ipcref_ctx *ctx,
                                                    uint64_t id) {
  ipcref__ledger *l;
  for (l = ctx->ledgers; l; l = l->next)
    if (l->id == id) return l;
  return NULL;
}

/* Ends a lease that was exported but never imported (under the lock). */
IPCREF__PRIVATE void ipcref__lease_cancel(ipcref_ctx *ctx,
                                          const ipcref__view_rec *r) {
  if (r->origin_nonce == ctx->nonce) {
    ipcref__ledger *l = ipcref__ledger_find(ctx, r->ledger_id);
    size_t freed = 0;
    if (l) (void)ipcref__lease_end(ctx, l, r->slot, r->gen, &freed);
  } else { /* a forwarded lease: return it to its origin's ledger */
    ipcref__map *m = ipcref__map_find(ctx, IPCREF__KIND_LEDGER, r->origin_nonce,
                                      r->ledger_id);
    uint64_t e = ipcref__ring_entry(IPCREF__RING_RELEASE, r->slot, r->gen);
    if (m && r->slot < m->nslots)
      ipcref__ring_push(m->base, m->nslots, m->bell, &e, 1, NULL);
  }
}

/* The event recorded for a device view before the lock is taken: the
 * recording may wait (HIP 5 synchronizes the stream instead), and no other
 * thread of the context should wait with it. The lease takes the event;
 * what no lease took, the caller frees. */
typedef struct ipcref__view_event {
  ipcref_backend *be;
  void *event;
  unsigned char handle[IPCREF_HANDLE_BYTES];
} ipcref__view_event;

/* Frees the events no lease took (not under the lock). */
IPCREF__PRIVATE void ipcref__events_free(ipcref__view_event *ev, int n) {
  int i;
  for (i = 0; i < n; i++)
    if (ev[i].event) ev[i].be->event_free(ev[i].be, ev[i].event);
}

/* Records an event on `stream` for each device view made here (not under
 * the lock). */
IPCREF__PRIVATE ipcref_result ipcref__events_record(const ipcref_view *views,
                                                    int n, void *stream,
                                                    ipcref__view_event *ev) {
  int i;
  for (i = 0; i < n; i++) {
    ipcref__block *b;
    ipcref_result r;
    ev[i].be = NULL;
    ev[i].event = NULL;
    b = ipcref__local_block(views[i].buf);
    if (!b || !b->seg->pool->be) continue;
    memset(ev[i].handle, 0, sizeof ev[i].handle); /* what goes on the wire */
    ev[i].be = b->seg->pool->be;
    r = ev[i].be->event_record(ev[i].be, b->seg->pool->dev, stream,
                               ev[i].handle, &ev[i].event);
    if (r != IPCREF_OK) {
      ipcref__events_free(ev, i);
      return r;
    }
  }
  return IPCREF_OK;
}

/* Where a leased block lives, as its peer must be told: filled by the
 * lease's taking (own block or forwarded import), read by the record and
 * by ipcref__fd_recs_add. */
typedef struct ipcref__lease_src {
  int device; /* a device segment: sent as its handle, or by_fd */
  int by_fd;  /* a device segment shared by fd (seg_fd) */
  int pooled; /* by_fd: a pool's fd, `handle` the allocation's data */
  const ipcref__chunks *chunks; /* by_fd, in chunks: their fds, sizes */
  int seg_fd;   /* host, by_fd: the fd the peer gets (-1: none made) */
  int writable; /* the peer may map it writable */
  int32_t dev_type, dev_id;
  const unsigned char *handle;
  uint32_t origin_pid;
  uint64_t origin_nonce, seg_id, seg_size;
  uint64_t ledger_id;
  int ledger_fd;
  int bell_fd; /* the ledger's bell, sent after it */
  uint32_t ledger_n;
} ipcref__lease_src;

/* A ledger of peer `p` with a free slot (under the lock): its current one,
 * else an older one with room once returned leases are swept, else a new
 * one. */
IPCREF__PRIVATE ipcref_result ipcref__ledger_with_room(ipcref_peer *p,
                                                       ipcref__ledger **out) {
  ipcref_ctx *ctx = p->ctx;
  ipcref__ledger *l = p->ledger;
  if (!l || !ipcref__ledger_room(l)) {
    ipcref__sweep(ctx); /* returned leases free their slots first */
    for (l = ctx->ledgers; l; l = l->next)
      if (l->peer == p && ipcref__ledger_room(l)) break;
    if (!l) {
      ipcref_result r = ipcref__ledger_new(ctx, p, &l);
      if (r != IPCREF_OK) return r;
    }
    p->ledger = l;
  }
  *out = l;
  return IPCREF_OK;
}

/* A device segment's export, made once: a shareable fd (and its data)
 * where its backend shares the allocation so (seg_export_fd), else its
 * IPC handle. */
IPCREF__PRIVATE ipcref_result ipcref__device_export(ipcref__segment *s) {
  ipcref_backend *be = s->pool->be;
  ipcref_result r = IPCREF_ENOTSUP;
  if (s->vmm_chunks) { /* a wrap across VMM chunks: an fd each */
    ipcref__chunks *c = s->vmm_chunks;
    int i;
    r = be->seg_export_chunks(be, s->pool->dev, s->daddr, c->size, c->n, c->fd);
    for (i = 0; r == IPCREF_OK && i < c->n; i++)
      if (c->fd[i] < 0) r = IPCREF_ESYS;           /* a broken backend */
    for (i = 0; r != IPCREF_OK && i < c->n; i++) { /* all, or none */
      if (c->fd[i] >= 0) close(c->fd[i]);
      c->fd[i] = -1;
    }
    s->by_fd = r == IPCREF_OK;
  } else if (be->seg_export_fd) {
    int fd = -1, pooled = 0;
    memset(s->handle, 0, sizeof s->handle);
    r = be->seg_export_fd(be, s->pool->dev, s->daddr, &fd, s->handle, &pooled);
    if (r == IPCREF_OK && fd < 0) r = IPCREF_ESYS; /* a broken backend */
    if (r == IPCREF_OK) {
      s->fd = fd;
      s->by_fd = 1;
      s->pooled = pooled != 0;
    }
  }
  if (r == IPCREF_ENOTSUP)
    r = be->seg_export(be, s->pool->dev, s->daddr, s->handle);
  if (r == IPCREF_OK) s->exported = 1;
  return r;
}

/* The device half of leasing block `b` (lease `ls`): the segment's
 * export, made once, and the event recorded for this hand-off, which the
 * lease keeps until it ends. */
IPCREF__PRIVATE ipcref_result ipcref__lease_device(ipcref__block *b,
                                                   ipcref__lease *ls,
                                                   ipcref__view_event *ev,
                                                   ipcref__view_rec *r,
                                                   ipcref__lease_src *src) {
  ipcref__pool *pool = b->seg->pool;
  if (!b->seg->exported) {
    ipcref_result res = ipcref__device_export(b->seg);
    if (res != IPCREF_OK) return res;
  }
  ls->be = pool->be;
  ls->event = ev->event;
  ev->event = NULL;
  memcpy(r->event, ev->handle, sizeof r->event);
  r->has_event = 1;
  src->device = 1;
  src->dev_type = pool->be->device_type;
  src->dev_id = pool->dev;
  src->handle = b->seg->handle;
  src->by_fd = b->seg->by_fd;
  src->pooled = b->seg->pooled;
  src->chunks = b->seg->vmm_chunks;
  src->seg_fd = !b->seg->by_fd       ? -1
                : b->seg->vmm_chunks ? b->seg->vmm_chunks->fd[0]
                                     : b->seg->fd;
  return IPCREF_OK;
}

/* A lease on block `b`, made here, in a ledger of `p` (under the lock).
 * Its slot was published live before (ipcref__slot_take); a failure after
 * it is taken cancels it. None for a peer whose process is known dead
 * (EPEER): the reap took back what it held once, and looks no more (its
 * socket may still take the message, held open by another process). */
IPCREF__PRIVATE ipcref_result ipcref__lease_take_own(
    ipcref_peer *p, ipcref__block *b, ipcref_buf *buf, ipcref__view_event *ev,
    ipcref__view_rec *r, ipcref__lease_src *src) {
  ipcref_ctx *ctx = p->ctx;
  ipcref__ledger *l;
  ipcref__lease *ls;
  ipcref_result res;
  if (p->watch && __atomic_load_n(&p->watch->dead, __ATOMIC_RELAXED))
    return IPCREF_EPEER;
  res = ipcref__ledger_with_room(p, &l); /* b is ctx's: views_check */
  if (res != IPCREF_OK) return res;
  if (l->holder_dead) return IPCREF_EPEER;
  r->slot = ipcref__slot_take(l, p->pid, &r->gen);
  ls = &l->leases[r->slot];
  ls->block = b;
  ls->gen = r->gen;
  if (buf->release == ipcref__alias_release) { /* a hold of the alias */
    ls->alias = (ipcref__alias *)buf->release_user;
    ls->alias->holds++;
  }
  l->live++;
  __atomic_store_n(&b->leases, b->leases + 1u, __ATOMIC_RELAXED);
  ctx->st.live_slots++;
  p->held_bytes += b->size;
  r->origin_nonce = ctx->nonce; /* what a cancel needs, from here on */
  r->ledger_id = l->id;
  IPCREF__STEP("export");
  /* Read-only: with the segment's F_SEAL_FUTURE_WRITE, no consumer can
   * map it writable, whatever it does with the fd. */
  src->seg_fd = ctx->opt.writable_shares ? b->seg->fd : b->seg->ro_fd;
  if (b->seg->pool->be) {
    res = ipcref__lease_device(b, ls, ev, r, src);
    if (res != IPCREF_OK) {
      ipcref__lease_cancel(ctx, r);
      return res;
    }
  }
  src->writable = ctx->opt.writable_shares != 0;
  src->origin_pid = (uint32_t)ctx->pid;
  src->origin_nonce = ctx->nonce;
  src->seg_id = b->seg->id;
  src->seg_size = b->seg->size;
  r->block_offset = b->offset;
  r->block_size = b->size;
  src->ledger_id = l->id;
  src->ledger_fd = l->fd;
  src->bell_fd = ctx->bell_tx;
  src->ledger_n = l->n;
  return IPCREF_OK;
}

/* A lease for a peer on a buffer imported here (view `v`): a slot claimed
 * in the producer's ledger, linked to ours through its ring, so that the
 * producer counts the peer's hold and ours apart. */
IPCREF__PRIVATE ipcref_result
ipcref__lease_take_forward(ipcref_peer *p, const ipcref_view *v,
                           ipcref__view_rec *r, ipcref__lease_src *src) {
  ipcref__import *imp = (ipcref__import *)v->buf->release_user;
  ipcref__map *lm = imp->ledger;
  uint64_t *slots = ipcref__ledger_slots(lm->base), e[2];
  uint32_t half = lm->nslots / 2, i, start, s = 0;
  int got = 0;
  start = (uint32_t)((uintptr_t)v >> 6) % half;
  for (i = 0; i < half && !got; i++) {
    uint64_t w;
    s = half + (start + i) % half;
    w = __atomic_load_n(&slots[2 * (size_t)s], __ATOMIC_ACQUIRE);
    if ((w & 3u) != IPCREF__SLOT_FREE) continue;
    /* Claim it: forwarders of one ledger may race here. */
    got = __atomic_compare_exchange_n(&slots[2 * (size_t)s], &w,
                                      (((w >> 2) + 1) << 2) | IPCREF__SLOT_LIVE,
                                      0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    if (got) r->gen = (uint32_t)((w >> 2) + 1);
  }
  if (!got) return IPCREF_EBUSY; /* every forwarding slot is in use */
  r->slot = s;
  /* The holder, and the parent, for the producer to adopt this lease
   * should its link never be written (see ipcref__adopt_forwards). */
  __atomic_store_n(&slots[2 * (size_t)s + 1],
                   ((uint64_t)(imp->slot + 1u) << 32) | (uint32_t)p->pid,
                   __ATOMIC_RELEASE);
  e[0] = ipcref__ring_entry(IPCREF__RING_LINK, s, r->gen);
  e[1] = ipcref__ring_entry(IPCREF__RING_PARENT, imp->slot, imp->gen);
  ipcref__ring_push(lm->base, lm->nslots, lm->bell, e, 2, "forward");
  if (imp->seg->kind == IPCREF__KIND_DEVICE) { /* the producer's event */
    src->device = 1;
    src->dev_type = imp->seg->dev_type;
    src->dev_id = imp->seg->dev_id;
    src->handle = imp->seg->handle;
    src->by_fd = imp->seg->by_fd;
    src->pooled = imp->seg->pooled;
    src->chunks = imp->seg->vmm_chunks;
    r->has_event = imp->has_event;
    memcpy(r->event, imp->event, sizeof r->event);
  }
  src->seg_fd =
      imp->seg->vmm_chunks ? imp->seg->vmm_chunks->fd[0] : imp->seg->fd;
  src->writable = imp->seg->writable;
  src->origin_pid = (uint32_t)imp->seg->origin_pid;
  src->origin_nonce = imp->seg->origin_nonce;
  src->seg_id = imp->seg->id;
  src->seg_size = imp->seg->size;
  r->block_offset = imp->offset;
  r->block_size = imp->size;
  src->ledger_id = lm->id;
  src->ledger_fd = lm->fd;
  src->bell_fd = lm->bell;
  src->ledger_n = lm->nslots;
  return IPCREF_OK;
}

/* The records (and fds) of what peer `p` lacks to map a lease from
 * `src`: its segment (an fd, or a device's handle; pool memory always,
 * since its peers unmap it when their last buffer in it goes) and its
 * ledger's fd with its bell's. 0 when out of memory. */
IPCREF__PRIVATE ipcref_result ipcref__fd_recs_add(ipcref_peer *p,
                                                  const ipcref__lease_src *src,
                                                  ipcref__fd_rec *fdr,
                                                  int *nrec, int *fds, int *nfd,
                                                  int dup_fds) {
  int fail = 0, i,
      nseg = !src->device  ? 1
             : !src->by_fd ? 0
             : src->chunks ? src->chunks->n
                           : 1;
  /* Room for the segment's fds and the ledger's two, before anything is
   * marked sent: a batch of views in many VMM chunks may not fit. */
  if (*nfd + nseg + 2 > IPCREF_MSG_MAX_FDS)
    return ipcref__invalid("ipcref_send_batch",
                           "more fds than one message carries (views in "
                           "many VMM chunks): send fewer views at once");
  if ((src->pooled ||
       !ipcref__sent_mark(p, src->origin_nonce,
                          ipcref__sent_key(src->seg_id, 0), &fail)) &&
      !fail) {
    ipcref__fd_rec *f = &fdr[(*nrec)++];
    memset(f, 0, sizeof *f);
    f->kind = !src->device  ? IPCREF__KIND_SEGMENT
              : src->pooled ? IPCREF__KIND_DEVICE_POOL
              : src->chunks ? IPCREF__KIND_DEVICE_CHUNKS
              : src->by_fd  ? IPCREF__KIND_DEVICE_FD
                            : IPCREF__KIND_DEVICE;
    f->writable = src->writable;
    f->origin_pid = src->origin_pid;
    f->origin_nonce = src->origin_nonce;
    f->id = src->seg_id;
    f->size = src->seg_size;
    if (src->device) {
      f->dev_type = src->dev_type;
      f->dev_id = src->dev_id;
      if (!src->by_fd || src->pooled)
        memcpy(f->handle, src->handle, IPCREF_HANDLE_BYTES);
    }
    if (src->chunks) { /* an fd per chunk */
      f->nchunks = src->chunks->n;
      for (i = 0; i < f->nchunks; i++) {
        int cfd = src->chunks->fd[i];
        f->chunk[i] = src->chunks->size[i];
        fds[(*nfd)++] = dup_fds ? fcntl(cfd, F_DUPFD_CLOEXEC, 0) : cfd;
      }
    } else if (!src->device || src->by_fd) {
      fds[(*nfd)++] =
          dup_fds ? fcntl(src->seg_fd, F_DUPFD_CLOEXEC, 0) : src->seg_fd;
    }
  }
  if (!fail &&
      !ipcref__sent_mark(p, src->origin_nonce,
                         ipcref__sent_key(src->ledger_id, 1), &fail) &&
      !fail) {
    ipcref__fd_rec *f = &fdr[(*nrec)++];
    memset(f, 0, sizeof *f);
    f->kind = IPCREF__KIND_LEDGER;
    f->writable = 1;
    f->origin_pid = src->origin_pid;
    f->origin_nonce = src->origin_nonce;
    f->id = src->ledger_id;
    f->size = ipcref__ledger_bytes(src->ledger_n);
    fds[(*nfd)++] =
        dup_fds ? fcntl(src->ledger_fd, F_DUPFD_CLOEXEC, 0) : src->ledger_fd;
    fds[(*nfd)++] =
        dup_fds ? fcntl(src->bell_fd, F_DUPFD_CLOEXEC, 0) : src->bell_fd;
  }
  return fail ? IPCREF_ENOMEM : IPCREF_OK;
}

/* Takes a lease for view `v` for peer `p` and fills its record `r`, and
 * the records and fds of what the peer lacks to map it (under the lock).
 * On error nothing stays taken. */
IPCREF__PRIVATE ipcref_result
ipcref__lease_take(ipcref_peer *p, const ipcref_view *v, ipcref__view_event *ev,
                   ipcref__view_rec *r, ipcref__fd_rec *fdr, int *nrec,
                   int *fds, int *nfd, int dup_fds) {
  ipcref__block *local = ipcref__local_block(v->buf);
  ipcref__lease_src src;
  ipcref_result res;
  r->has_event = 0; /* every other field of r is written below */
  memset(&src, 0, sizeof src);
  res = local ? ipcref__lease_take_own(p, local, v->buf, ev, r, &src)
              : ipcref__lease_take_forward(p, v, r, &src);
  if (res != IPCREF_OK) return res;
  r->origin_pid = src.origin_pid;
  r->origin_nonce = src.origin_nonce;
  r->seg_id = src.seg_id;
  r->seg_size = src.seg_size;
  r->ledger_id = src.ledger_id;
  r->writable = src.writable;
  r->view = *v;
  r->view.buf = NULL; /* byte_offset: relative to the block's data */
  if ((!src.device || src.by_fd) && src.seg_fd < 0)
    res = IPCREF_ESYS;
  else
    res = ipcref__fd_recs_add(p, &src, fdr, nrec, fds, nfd, dup_fds);
  if (res != IPCREF_OK) ipcref__lease_cancel(p->ctx, r);
  return res;
}

/* The message carrying the fds of these records never left: they go with
 * the next view of each. Each stays in the peer's sent set, which may be
 * right (the fds went again after a refusal, and the peer kept an earlier
 * copy): the peer is still told when the segment goes, and ignores it if
 * it never had it. */
IPCREF__PRIVATE void
ipcref__sent_unsend_recs(ipcref_peer *p, const ipcref__fd_rec *fdr, int n) {
  int i;
  for (i = 0; i < n; i++)
    if (fdr[i].kind != IPCREF__KIND_DEVICE_POOL) /* never marked sent */
      ipcref__sent_resend(
          p, fdr[i].origin_nonce,
          ipcref__sent_key(fdr[i].id, fdr[i].kind == IPCREF__KIND_LEDGER));
}

/* Checks the views a public call `fn` was given for peer `p`: EINVAL,
 * named, for one that is not valid, not of a shared buffer, or of a
 * buffer made by another context; EDEAD, reported, for a shared buffer
 * made here that was already released (its header is its context's, so
 * this check is safe in every build: see ipcref__hdr_get). */
IPCREF__PRIVATE ipcref_result ipcref__views_check(const ipcref_peer *p,
                                                  const ipcref_view *views,
                                                  int n, const char *fn) {
  int i;
  for (i = 0; i < n; i++) {
    const ipcref_buf *b = views[i].buf;
    const ipcref__block *local;
    if (b && b->release == ipcref__block_release &&
        __atomic_load_n(&b->strong, __ATOMIC_ACQUIRE) == 0) {
      ipcref__report_in(IPCREF_EDEAD, fn,
                        "a view of a shared buffer already released");
      return IPCREF_EDEAD;
    }
    if (!ipcref__view_valid(&views[i]))
      return ipcref__invalid(fn, "a view that is not valid");
    if (!ipcref_buf_is_shared(b))
      return ipcref__invalid(fn, "a view of a buffer not shared (make it "
                                 "with ipcref_shared_new)");
    local = ipcref__local_block(b);
    if (local && local->seg->ctx != p->ctx)
      return ipcref__invalid(fn, "a view of a buffer of another context");
  }
  return IPCREF_OK;
}

/* Builds a message for `n` views and the user's metadata `meta` (under
 * the lock; the caller checked both: ipcref__views_check,
 * ipcref__meta_arg). */
IPCREF__PRIVATE ipcref_result ipcref__export_msg(ipcref_peer *p,
                                                 const ipcref_view *views,
                                                 int n, ipcref__view_event *ev,
                                                 const ipcref__meta *meta,
                                                 ipcref_msg *msg, int dup_fds) {
  ipcref_ctx *ctx = p->ctx;
  ipcref__view_rec recs[IPCREF_MSG_MAX_VIEWS];
  ipcref__fd_rec fdr[IPCREF_MSG_MAX_FDS];
  ipcref__msg_head head;
  ipcref__wire w;
  size_t nret;
  int i, nfd = 0, nrec = 0;
  ipcref_result r = IPCREF_OK;
  /* n and every view were checked by the caller (ipcref__views_check). */
  (void)ipcref__pump(ctx, 0);
  for (i = 0; i < n && r == IPCREF_OK; i++) {
    int k, first = nfd;
    r = ipcref__lease_take(p, &views[i], &ev[i], &recs[i], fdr, &nrec, msg->fds,
                           &nfd, dup_fds);
    if (r != IPCREF_OK) break; /* it ended its own lease */
    for (k = first; k < nfd; k++)
      if (msg->fds[k] < 0) r = IPCREF_ESYS; /* a dup failed */
    if (r != IPCREF_OK) {
      ipcref__lease_cancel(ctx, &recs[i]);
      break;
    }
  }
  if (r != IPCREF_OK) {
    int k;
    for (k = 0; k < i; k++) ipcref__lease_cancel(ctx, &recs[k]);
    ipcref__sent_unsend_recs(p, fdr, nrec);
    if (dup_fds)
      for (k = 0; k < nfd; k++)
        if (msg->fds[k] >= 0) close(msg->fds[k]);
    return r;
  }
  nret = p->nretired < IPCREF__MSG_RETIRED ? p->nretired : IPCREF__MSG_RETIRED;
  ipcref__wire_init(&w, msg->bytes, sizeof msg->bytes);
  head.nviews = n;
  head.nrecs = nrec;
  head.nretired = (int)nret;
  head.sender_pid = (uint32_t)ctx->pid;
  head.sender_nonce = ctx->nonce;
  head.meta_len = meta->len;
  ipcref__put_msg_head(&w, &head);
  for (i = 0; i < nrec; i++) ipcref__put_fd_rec(&w, &fdr[i]);
  for (i = 0; i < (int)nret; i++) ipcref__wire_put(&w, p->retired[i], 8);
  for (i = 0; i < n; i++) ipcref__put_view(&w, &recs[i]);
  if (meta->len) ipcref__put_bytes(&w, meta->bytes, meta->len);
  /* IPCREF_MSG_MAX_BYTES holds the largest record these limits allow. */
  IPCREF_ASSERT(!w.bad);
  if (nret) {
    memmove(p->retired, p->retired + nret, (p->nretired - nret) * 8);
    p->nretired -= nret;
  }
  msg->len = w.pos;
  msg->nfds = nfd;
  ctx->st.fds_sent += (uint64_t)nfd;
  return IPCREF_OK;
}

#endif /* IPCREF__SHARING_IMPL */
