/* share_export: handing views to a peer. A lease per view (in the peer's
 * ledger for an own block, in the producer's ledger for a forwarded
 * import), an event per device view (recorded before the lock is taken),
 * the fds the peer lacks, and the message built from them; a lease whose
 * message never leaves is cancelled. Under ctx->lock. */

#ifdef IPCREF__SHARING_IMPL

IPCREF_PRIVATE ipcref__map *ipcref__map_find(ipcref_ctx *ctx, int kind,
                                             uint64_t nonce, uint64_t id) {
  ipcref__map *m;
  for (m = ctx->maps; m; m = m->next)
    if ((m->kind == kind || (kind == 1 && m->kind == 3)) &&
        m->origin_nonce == nonce && m->id == id)
      return m;
  return NULL;
}

IPCREF_PRIVATE ipcref__ledger *ipcref__ledger_find(ipcref_ctx *ctx,
                                                   uint64_t id) {
  ipcref__ledger *l;
  for (l = ctx->ledgers; l; l = l->next)
    if (l->id == id) return l;
  return NULL;
}

/* Ends a lease that was exported but never imported (under the lock). */
IPCREF_PRIVATE void ipcref__lease_cancel(ipcref_ctx *ctx,
                                         const ipcref__view_rec *r) {
  if (r->origin_nonce == ctx->nonce) {
    ipcref__ledger *l = ipcref__ledger_find(ctx, r->ledger_id);
    size_t freed = 0;
    if (l) (void)ipcref__lease_free(ctx, l, r->slot, r->gen, &freed);
  } else { /* a forwarded lease: return it to its origin's ledger */
    ipcref__map *m = ipcref__map_find(ctx, 2, r->origin_nonce, r->ledger_id);
    uint64_t e = ipcref__ring_entry(IPCREF__RING_RELEASE, r->slot, r->gen);
    if (m && r->slot < m->nslots)
      ipcref__ring_push(m->base, m->nslots, &e, 1, NULL);
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

IPCREF_PRIVATE void ipcref__events_free(ipcref__view_event *ev, int n) {
  int i;
  for (i = 0; i < n; i++)
    if (ev[i].event) ev[i].be->event_free(ev[i].be, ev[i].event);
}

/* Records an event on `stream` for each device view made here (not under
 * the lock). */
IPCREF_PRIVATE ipcref_result ipcref__events_record(const ipcref_view *views,
                                                   int n, void *stream,
                                                   ipcref__view_event *ev) {
  int i;
  memset(ev, 0, (size_t)n * sizeof *ev);
  for (i = 0; i < n; i++) {
    ipcref__block *b;
    ipcref_result r;
    b = ipcref__local_block(views[i].buf);
    if (!b || !b->seg->pool->be) continue;
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

/* Takes a lease for `v` and fills its record (under the lock). */
IPCREF_PRIVATE ipcref_result
ipcref__lease_take(ipcref_peer *p, const ipcref_view *v, ipcref__view_event *ev,
                   ipcref__view_rec *r, ipcref__fd_rec *fdr, int *nrec,
                   int *fds, int *nfd, int dup_fds) {
  ipcref_ctx *ctx = p->ctx;
  ipcref_buf *buf = v->buf;
  int seg_fd, ledger_fd, fail = 0, seg_writable, device = 0;
  int32_t dev_type = 0, dev_id = 0;
  const unsigned char *handle = NULL;
  uint64_t nonce, seg_id, ledger_id, seg_size;
  uint32_t origin_pid, ledger_n;
  ipcref__block *local = ipcref__local_block(buf);
  memset(r, 0, sizeof *r);
  if (local) {
    ipcref__block *b = local;
    ipcref__ledger *l = p->ledger;
    uint64_t *slots;
    ipcref_result res;
    if (b->seg->ctx != ctx) return IPCREF_EINVAL;
    if (!l || l->nfree == 0) { /* an older one with room, or a new one */
      ipcref__sweep(ctx);      /* returned leases free their slots first */
      for (l = ctx->ledgers; l; l = l->next)
        if (l->peer == p && l->nfree) break;
      if (!l) {
        res = ipcref__ledger_new(ctx, p, &l);
        if (res != IPCREF_OK) return res;
      }
      p->ledger = l;
    }
    slots = ipcref__ledger_slots(l->base);
    r->slot = l->free_stack[--l->nfree];
    r->gen = (uint32_t)(__atomic_load_n(&slots[2 * (size_t)r->slot],
                                        __ATOMIC_RELAXED) >>
                        2) +
             1u;
    l->leases[r->slot].block = b;
    l->leases[r->slot].gen = r->gen;
    if (buf->release == ipcref__alias_release) { /* a hold of the alias */
      l->leases[r->slot].alias = (ipcref__alias *)buf->release_user;
      l->leases[r->slot].alias->holds++;
    }
    l->live++;
    b->leases++;
    ctx->st.live_slots++;
    r->origin_nonce = ctx->nonce; /* what a cancel needs, from here on */
    r->ledger_id = l->id;
    slots[2 * (size_t)r->slot + 1] = (uint64_t)(uint32_t)p->pid; /* holder */
    __atomic_store_n(&slots[2 * (size_t)r->slot],
                     ((uint64_t)r->gen << 2) | IPCREF__SLOT_LIVE,
                     __ATOMIC_RELEASE);
    IPCREF__STEP("export");
    if (b->seg->pool->be) { /* device memory: its handle, and an event */
      ipcref__pool *pool = b->seg->pool;
      if (!b->seg->exported) {
        res = pool->be->seg_export(pool->be, pool->dev, b->seg->daddr,
                                   b->seg->handle);
        if (res != IPCREF_OK) {
          ipcref__lease_cancel(ctx, r);
          return res;
        }
        b->seg->exported = 1;
      }
      l->leases[r->slot].be = pool->be; /* the lease keeps the event */
      l->leases[r->slot].event = ev->event;
      ev->event = NULL;
      memcpy(r->event, ev->handle, sizeof r->event);
      r->has_event = 1;
      device = 1;
      dev_type = pool->be->device_type;
      dev_id = pool->dev;
      handle = b->seg->handle;
      seg_fd = -1;
    } else if (ctx->opt.writable_shares) {
      seg_fd = b->seg->fd;
    } else {
      /* Read-only: with the segment's F_SEAL_FUTURE_WRITE, no consumer can
       * map it writable, whatever it does with the fd. */
      seg_fd = b->seg->ro_fd;
    }
    seg_writable = ctx->opt.writable_shares != 0;
    nonce = ctx->nonce;
    origin_pid = (uint32_t)ctx->pid;
    seg_id = b->seg->id;
    seg_size = b->seg->size;
    r->block_offset = b->offset;
    r->block_size = b->size;
    ledger_id = l->id;
    ledger_fd = l->fd;
    ledger_n = l->n;
  } else { /* forwarding an imported buffer */
    ipcref__import *imp = (ipcref__import *)buf->release_user;
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
      got = __atomic_compare_exchange_n(
          &slots[2 * (size_t)s], &w, (((w >> 2) + 1) << 2) | IPCREF__SLOT_LIVE,
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
    ipcref__ring_push(lm->base, lm->nslots, e, 2, "forward");
    if (imp->seg->kind == 3) { /* the producer's event goes on */
      device = 1;
      dev_type = imp->seg->dev_type;
      dev_id = imp->seg->dev_id;
      handle = imp->seg->handle;
      r->has_event = imp->has_event;
      memcpy(r->event, imp->event, sizeof r->event);
    }
    seg_fd = imp->seg->fd;
    seg_writable = imp->seg->writable;
    nonce = imp->seg->origin_nonce;
    origin_pid = (uint32_t)imp->seg->origin_pid;
    seg_id = imp->seg->id;
    seg_size = imp->seg->size;
    r->block_offset = imp->offset;
    r->block_size = imp->size;
    ledger_id = lm->id;
    ledger_fd = lm->fd;
    ledger_n = lm->nslots;
  }
  r->origin_pid = origin_pid;
  r->origin_nonce = nonce;
  r->seg_id = seg_id;
  r->seg_size = seg_size;
  r->ledger_id = ledger_id;
  r->writable = seg_writable;
  r->view = *v;
  r->view.buf = NULL;
  r->view.byte_offset = v->byte_offset; /* relative to the block's data */
  /* What the peer lacks: the segment (its fd, or a device's handle) and
   * the ledger's fd. */
  if (!device && seg_fd < 0) goto sys;
  if (!ipcref__seen(p, nonce, seg_id << 1, &fail) && !fail) {
    ipcref__fd_rec *f = &fdr[(*nrec)++];
    memset(f, 0, sizeof *f);
    f->kind = device ? 3 : 1;
    f->writable = seg_writable;
    f->origin_pid = origin_pid;
    f->origin_nonce = nonce;
    f->id = seg_id;
    f->size = seg_size;
    if (device) {
      f->dev_type = dev_type;
      f->dev_id = dev_id;
      memcpy(f->handle, handle, IPCREF_HANDLE_BYTES);
    } else {
      fds[(*nfd)++] = dup_fds ? fcntl(seg_fd, F_DUPFD_CLOEXEC, 0) : seg_fd;
    }
  }
  if (!fail && !ipcref__seen(p, nonce, (ledger_id << 1) | 1u, &fail) && !fail) {
    ipcref__fd_rec *f = &fdr[(*nrec)++];
    memset(f, 0, sizeof *f);
    f->kind = 2;
    f->writable = 1;
    f->origin_pid = origin_pid;
    f->origin_nonce = nonce;
    f->id = ledger_id;
    f->size = ipcref__ledger_bytes(ledger_n);
    fds[(*nfd)++] = dup_fds ? fcntl(ledger_fd, F_DUPFD_CLOEXEC, 0) : ledger_fd;
  }
  if (fail) {
    ipcref__lease_cancel(ctx, r);
    return IPCREF_ENOMEM;
  }
  return IPCREF_OK;
sys:
  ipcref__lease_cancel(ctx, r);
  return IPCREF_ESYS;
}

/* Forgets that the peer was sent the fds of these records (the message
 * carrying them never left). */
IPCREF_PRIVATE void ipcref__unsee(ipcref_peer *p, const ipcref__fd_rec *fdr,
                                  int n) {
  int i;
  size_t k;
  for (i = 0; i < n; i++)
    for (k = 0; k < p->nseen; k++)
      if (p->seen[k].nonce == fdr[i].origin_nonce &&
          p->seen[k].key == ((fdr[i].id << 1) | (uint64_t)(fdr[i].kind == 2))) {
        p->seen[k] = p->seen[--p->nseen];
        break;
      }
}

/* EDEAD, reported naming `fn`, when a view's buffer is a shared buffer
 * made here that was already released (its header is its context's, so
 * this check is safe in every build: see ipcref__hdr_get); else OK. */
IPCREF_PRIVATE ipcref_result ipcref__views_live(const ipcref_view *views, int n,
                                                const char *fn) {
  int i;
  for (i = 0; i < n; i++) {
    const ipcref_buf *b = views[i].buf;
    if (b && b->release == ipcref__block_release &&
        __atomic_load_n(&b->strong, __ATOMIC_ACQUIRE) == 0) {
      ipcref__report_in(IPCREF_EDEAD, fn,
                        "a view of a shared buffer already released");
      return IPCREF_EDEAD;
    }
  }
  return IPCREF_OK;
}

/* Builds a message for `n` views (under the lock). */
IPCREF_PRIVATE ipcref_result ipcref__export_msg(ipcref_peer *p,
                                                const ipcref_view *views, int n,
                                                ipcref__view_event *ev,
                                                ipcref_msg *msg, int dup_fds) {
  ipcref_ctx *ctx = p->ctx;
  ipcref__view_rec recs[IPCREF__MSG_VIEWS];
  ipcref__fd_rec fdr[IPCREF_MSG_MAX_FDS];
  ipcref__wire w;
  size_t nret;
  int i, nfd = 0, nrec = 0;
  ipcref_result r = IPCREF_OK;
  if (n < 1 || n > IPCREF__MSG_VIEWS) return IPCREF_EINVAL;
  for (i = 0; i < n; i++)
    if (!ipcref__view_valid(&views[i]) || !ipcref_buf_is_shared(views[i].buf))
      return IPCREF_EINVAL;
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
    ipcref__unsee(p, fdr, nrec);
    if (dup_fds)
      for (k = 0; k < nfd; k++)
        if (msg->fds[k] >= 0) close(msg->fds[k]);
    return r;
  }
  nret = p->nretired < IPCREF__MSG_RETIRED ? p->nretired : IPCREF__MSG_RETIRED;
  w.p = msg->bytes;
  w.len = sizeof msg->bytes;
  w.pos = 0;
  w.bad = 0;
  ipcref__put(&w, IPCREF__MSG_MAGIC, 4);
  ipcref__put(&w, IPCREF__MSG_VERSION, 2);
  ipcref__put(&w, (uint64_t)n, 2);
  ipcref__put(&w, (uint64_t)nrec, 2);
  ipcref__put(&w, nret, 2);
  ipcref__put(&w, (uint64_t)ctx->pid, 4);
  ipcref__put(&w, ctx->nonce, 8);
  for (i = 0; i < nrec; i++) ipcref__put_fd_rec(&w, &fdr[i]);
  for (i = 0; i < (int)nret; i++) ipcref__put(&w, p->retired[i], 8);
  for (i = 0; i < n; i++) ipcref__put_view(&w, &recs[i]);
  /* IPCREF_MSG_MAX_BYTES holds the largest record these limits allow. */
  IPCREF_ASSERT(!w.bad);
  if (nret) {
    memmove(p->retired, p->retired + nret, (p->nretired - nret) * 8);
    p->nretired -= nret;
  }
  msg->len = w.pos;
  msg->nfds = nfd;
  msg->origin = p;
  ctx->st.fds_sent += (uint64_t)nfd;
  return IPCREF_OK;
}

#endif /* IPCREF__SHARING_IMPL */
