/* share_import: taking views from a peer. A message is decoded, its fds
 * checked against what they claim (memfd, seals, size, access, ledger
 * header, generation) before anything is mapped, mappings are cached per
 * context, and each view becomes a buffer whose release returns its lease
 * lock-free. Also ipcref_export, ipcref_import and the ipcref_msg calls.
 * Under ctx->lock, but for the release. */

#ifdef IPCREF__SHARING_IMPL

/* The release callback of an imported buffer: this process's last
 * reference went, so the lease goes back to its producer. One fetch_add
 * and stores into shared memory, a free: no system call, no lock. */
IPCREF_PRIVATE void ipcref__import_finish(ipcref__import *imp) {
  ipcref_ctx *ctx;
  uint64_t e = ipcref__ring_entry(IPCREF__RING_RELEASE, imp->slot, imp->gen);
  ipcref__ring_push(imp->ledger->base, imp->ledger->nslots, &e, 1, "release");
  __atomic_fetch_sub(&imp->seg->refs, 1, __ATOMIC_RELEASE);
  __atomic_fetch_sub(&imp->ledger->refs, 1, __ATOMIC_RELEASE);
  __atomic_fetch_sub(&imp->ctx->imported_bufs, 1, __ATOMIC_RELEASE);
  ctx = imp->ctx;
  IPCREF_FREE(imp);
  ipcref__ctx_unref(ctx); /* only the last one after ctx_free tears down */
}

/* Device memory is returned only once the work queued on its stream has
 * completed, and nobody waits for that: the release parks the import with
 * a fence, and the calls on the context return it when the fence is done
 * (ipcref__deferred_poll). After ipcref_ctx_free nothing would poll, so a
 * release then waits for its fence here. */
IPCREF_PRIVATE void ipcref__import_release(void *user, void *data) {
  ipcref__import *imp = (ipcref__import *)user;
  (void)data;
  if (imp->seg->kind == 3) {
    ipcref_backend *be = imp->seg->be;
    ipcref_ctx *ctx = imp->ctx;
    void *fence = NULL;
    if (be->fence(be, imp->seg->dev_id, imp->stream, &fence) == IPCREF_OK &&
        fence) {
      if (!__atomic_load_n(&ctx->owner_gone, __ATOMIC_ACQUIRE)) {
        imp->fence = fence;
        IPCREF__LOCK(ctx);
        imp->next = ctx->deferred;
        ctx->deferred = imp;
        ctx->st.deferred++;
        IPCREF__UNLOCK(ctx);
        return;
      }
      while (!be->fence_done(be, fence)) usleep(50);
    }
  }
  ipcref__import_finish(imp);
}

/* Checks a received fd against its record and maps it. The fd must be a
 * memfd sealed against shrinking and growing (so the mapping can never
 * SIGBUS), of exactly the announced size, opened with the access the
 * mapping needs. A ledger's header must agree with the record. */
IPCREF_PRIVATE ipcref_result ipcref__map_fd(int fd, const ipcref__fd_rec *r,
                                            ipcref__map **out) {
  struct stat st;
  int seals, fl, prot;
  ipcref__map *m;
  unsigned char *base;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (uint64_t)st.st_size != r->size || r->size == 0 ||
      r->size > (uint64_t)PTRDIFF_MAX)
    return IPCREF_EPROTO;
  seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    return IPCREF_EPROTO;
  fl = fcntl(fd, F_GETFL);
  if (fl < 0) return IPCREF_EPROTO;
  if (r->kind == 2 && r->size < IPCREF__LEDGER_HDR) return IPCREF_EPROTO;
  if (r->kind == 2 || r->writable) { /* mapped writable */
    if ((fl & O_ACCMODE) != O_RDWR ||
        (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0)
      return IPCREF_EPROTO;
    prot = PROT_READ | PROT_WRITE;
  } else { /* mapped read-only: the fd must be readable */
    if ((fl & O_ACCMODE) == O_WRONLY) return IPCREF_EPROTO;
    prot = PROT_READ;
  }
  base = (unsigned char *)mmap(NULL, (size_t)r->size, prot, MAP_SHARED, fd, 0);
  if (base == (unsigned char *)MAP_FAILED) return IPCREF_ESYS;
  m = (ipcref__map *)ipcref__zalloc(sizeof *m);
  if (!m) {
    munmap(base, (size_t)r->size);
    return IPCREF_ENOMEM;
  }
  m->kind = r->kind;
  m->origin_nonce = r->origin_nonce;
  m->origin_pid = (int)r->origin_pid;
  m->id = r->id;
  m->fd = fd;
  m->base = base;
  m->size = (size_t)r->size;
  m->writable = r->kind == 1 && r->writable;
  if (r->kind == 2) {
    ipcref__ledger_hdr *h = (ipcref__ledger_hdr *)(void *)base;
    uint32_t n = h->nslots;
    if (h->magic != IPCREF__LEDGER_MAGIC ||
        h->version != IPCREF__LEDGER_VERSION || n < 2 || n > (1u << 24) ||
        (n & 1) || ipcref__ledger_bytes(n) != r->size ||
        h->origin_nonce != r->origin_nonce || h->ledger_id != r->id) {
      munmap(base, (size_t)r->size);
      IPCREF_FREE(m);
      return IPCREF_EPROTO;
    }
    m->nslots = n;
    m->imported = (uint32_t *)ipcref__zalloc(n * sizeof(uint32_t));
    if (!m->imported) {
      munmap(base, (size_t)r->size);
      IPCREF_FREE(m);
      return IPCREF_ENOMEM;
    }
  }
  *out = m;
  return IPCREF_OK;
}

/* Opens a device segment another process exported (under the lock): the
 * allocation the driver opens must be at least as large as announced.
 * Without a backend for its device here, the map is a placeholder (be
 * NULL): the views in it are refused with ENODEV and their leases given
 * back, and the peer, which counts the segment as sent, stays usable. */
IPCREF_PRIVATE ipcref_result ipcref__map_device(ipcref_ctx *ctx,
                                                const ipcref__fd_rec *r,
                                                ipcref__map **out) {
  ipcref_backend *be = ipcref__backend(ctx, r->dev_type);
  ipcref__map *m;
  uint64_t addr, base;
  size_t size;
  ipcref_result res;
  if (r->size == 0 || r->size > (uint64_t)PTRDIFF_MAX) return IPCREF_EPROTO;
  m = (ipcref__map *)ipcref__zalloc(sizeof *m);
  if (!m) return IPCREF_ENOMEM;
  if (!be) {
    addr = 0;
    goto fill;
  }
  res = be->seg_import(be, r->dev_id, r->handle, &addr);
  if (res != IPCREF_OK) {
    IPCREF_FREE(m);
    return res;
  }
  if (be->seg_range(be, r->dev_id, addr, &base, &size) != IPCREF_OK ||
      base != addr || (uint64_t)size < r->size) {
    be->seg_close(be, r->dev_id, addr);
    IPCREF_FREE(m);
    return IPCREF_EPROTO;
  }
fill:
  m->kind = 3;
  m->origin_nonce = r->origin_nonce;
  m->origin_pid = (int)r->origin_pid;
  m->id = r->id;
  m->fd = -1;
  m->size = (size_t)r->size;
  m->writable = r->writable != 0;
  m->be = be;
  m->dev_type = r->dev_type;
  m->dev_id = r->dev_id;
  m->daddr = addr;
  memcpy(m->handle, r->handle, sizeof m->handle);
  *out = m;
  return IPCREF_OK;
}

/* The address of `offset` in a mapped segment, host or device. */
IPCREF_PRIVATE void *ipcref__map_addr(const ipcref__map *m, uint64_t offset) {
  return m->kind == 3 ? (void *)(uintptr_t)(m->daddr + offset)
                      : (void *)(m->base + offset);
}

/* Fresh mappings join the cache (under the lock). */
IPCREF_PRIVATE void ipcref__maps_commit(ipcref_ctx *ctx, ipcref__map **fresh,
                                        int n) {
  int k;
  for (k = 0; k < n; k++) {
    IPCREF__LIST_PUSH(ctx->maps, fresh[k], next, prev);
    if (fresh[k]->kind == 2)
      ctx->st.counter_files++;
    else
      ctx->st.mapped_segments++;
  }
}

/* Gives back the leases of records [from, n) that will not be used: each
 * is marked imported (a replay is refused) and returned to its ledger. */
IPCREF_PRIVATE void ipcref__leases_give_back(const ipcref__view_rec *recs,
                                             ipcref__map **ledm, int from,
                                             int n) {
  int k;
  for (k = from; k < n; k++) {
    uint64_t e =
        ipcref__ring_entry(IPCREF__RING_RELEASE, recs[k].slot, recs[k].gen);
    ledm[k]->imported[recs[k].slot] = recs[k].gen + 1u;
    ipcref__ring_push(ledm[k]->base, ledm[k]->nslots, &e, 1, NULL);
  }
}

/* Imports a received record with its fds (takes the fds). `views` gets
 * one view per record. */
IPCREF_PRIVATE ipcref_result ipcref__import_bytes(
    ipcref_peer *p, const unsigned char *bytes, size_t len, int *fds, int nfds,
    void *stream, ipcref_view *views, int *nviews) {
  ipcref_ctx *ctx = p->ctx;
  ipcref__wire w;
  ipcref__fd_rec fdr[IPCREF_MSG_MAX_FDS];
  ipcref__map *fresh[IPCREF_MSG_MAX_FDS];
  ipcref__view_rec recs[IPCREF__MSG_VIEWS];
  ipcref__map *segm[IPCREF__MSG_VIEWS], *ledm[IPCREF__MSG_VIEWS];
  uint64_t sender_nonce;
  int i, k, n, nrec, nfd = 0, nret, nfresh = 0, made = 0;
  int fdi[IPCREF_MSG_MAX_FDS]; /* each record's fd, or -1 */
  ipcref_result r = IPCREF_EPROTO;
  w.p = (unsigned char *)(uintptr_t)bytes;
  w.len = len;
  w.pos = 0;
  w.bad = 0;
  memset(fresh, 0, sizeof fresh);
  if (ipcref__get(&w, 4) != IPCREF__MSG_MAGIC ||
      ipcref__get(&w, 2) != IPCREF__MSG_VERSION)
    goto close_fds;
  n = (int)ipcref__get(&w, 2);
  nrec = (int)ipcref__get(&w, 2);
  nret = (int)ipcref__get(&w, 2);
  (void)ipcref__get(&w, 4);
  sender_nonce = ipcref__get(&w, 8);
  if (w.bad || n < 1 || n > IPCREF__MSG_VIEWS || nrec > IPCREF_MSG_MAX_FDS ||
      nret > IPCREF__MSG_RETIRED)
    goto close_fds;
  for (i = 0; i < nrec; i++) { /* kinds 1 and 2 take the fds in order */
    if (!ipcref__get_fd_rec(&w, &fdr[i])) goto close_fds;
    fdi[i] = fdr[i].kind == 3 ? -1 : nfd++;
  }
  if (nfd != nfds) goto close_fds;
  IPCREF__LOCK(ctx);
  (void)ipcref__pump(ctx, 0);
  for (i = 0; i < nret; i++) { /* the sender destroyed these segments */
    ipcref__map *m = ipcref__map_find(ctx, 1, sender_nonce, ipcref__get(&w, 8));
    if (m) m->retired = 1;
  }
  ipcref__maps_trim(ctx, (size_t)1 << 30);
  for (i = 0; i < n; i++)
    if (!ipcref__get_view(&w, &recs[i])) goto unlock;
  if (w.pos != w.len) goto unlock;
  /* Map what is new; an fd for something already mapped is redundant. */
  for (i = 0; i < nrec; i++) {
    int kind = fdr[i].kind == 2 ? 2 : 1; /* segments: host or device */
    if (ipcref__map_find(ctx, kind, fdr[i].origin_nonce, fdr[i].id)) continue;
    for (k = 0; k < nfresh; k++)
      if ((fresh[k]->kind == 2) == (kind == 2) &&
          fresh[k]->origin_nonce == fdr[i].origin_nonce &&
          fresh[k]->id == fdr[i].id)
        break;
    if (k < nfresh) continue;
    if (fdr[i].kind == 3) {
      r = ipcref__map_device(ctx, &fdr[i], &fresh[nfresh]);
    } else {
      r = ipcref__map_fd(fds[fdi[i]], &fdr[i], &fresh[nfresh]);
      if (r == IPCREF_OK) fds[fdi[i]] = -1; /* the map owns it now */
    }
    if (r != IPCREF_OK) goto unlock;
    nfresh++;
    IPCREF__STEP("map");
  }
  /* Check every record before anything is taken. */
  r = IPCREF_EPROTO;
  for (i = 0; i < n; i++) {
    ipcref__view_rec *v = &recs[i];
    struct ipcref_buf fake;
    ipcref_view geo;
    uint64_t *slots, word, end;
    segm[i] = ipcref__map_find(ctx, 1, v->origin_nonce, v->seg_id);
    ledm[i] = ipcref__map_find(ctx, 2, v->origin_nonce, v->ledger_id);
    for (k = 0; k < nfresh; k++) {
      if (fresh[k]->origin_nonce != v->origin_nonce) continue;
      if (fresh[k]->kind != 2 && fresh[k]->id == v->seg_id) segm[i] = fresh[k];
      if (fresh[k]->kind == 2 && fresh[k]->id == v->ledger_id)
        ledm[i] = fresh[k];
    }
    if (!segm[i] || !ledm[i] || segm[i]->retired ||
        segm[i]->size != v->seg_size || v->block_size == 0 ||
        __builtin_add_overflow(v->block_offset, v->block_size, &end) ||
        end > segm[i]->size || v->slot >= ledm[i]->nslots ||
        (v->writable && !segm[i]->writable) ||
        (v->has_event && segm[i]->kind != 3))
      goto unlock;
    /* The lease must be live at exactly this generation (a replay of an
     * older message finds the slot freed or reused), and not imported
     * already (one export, one import). */
    slots = ipcref__ledger_slots(ledm[i]->base);
    word = __atomic_load_n(&slots[2 * (size_t)v->slot], __ATOMIC_ACQUIRE);
    if (word != (((uint64_t)v->gen << 2) | IPCREF__SLOT_LIVE) ||
        ledm[i]->imported[v->slot] == v->gen + 1u)
      goto unlock;
    for (k = 0; k < i; k++)
      if (ledm[k] == ledm[i] && recs[k].slot == v->slot) goto unlock;
    if (segm[i]->kind == 3 && !segm[i]->be) continue; /* refused below */
    /* Every element the view reaches lies inside the block. */
    memset(&fake, 0, sizeof fake);
    fake.data = ipcref__map_addr(segm[i], v->block_offset);
    fake.size = (size_t)v->block_size;
    geo = v->view;
    geo.buf = &fake;
    if (ipcref__view_check_new(&geo) != IPCREF_OK ||
        geo.byte_offset % (int64_t)ipcref__dtype_sizes[geo.dtype] != 0)
      goto unlock;
  }
  /* Device memory without its backend here: refused, and the leases, which
   * are genuine, go back at once (nothing else of the message is used). */
  for (i = 0; i < n; i++)
    if (segm[i]->kind == 3 && !segm[i]->be) {
      r = IPCREF_ENODEV;
      ipcref__maps_commit(ctx, fresh, nfresh); /* the peer counts them sent */
      nfresh = 0;
      ipcref__leases_give_back(recs, ledm, 0, n);
      goto unlock;
    }
  /* Device data: the stream waits for the producer's writes (also when
   * the segment was mapped before). Nothing is taken yet if it fails. */
  for (i = 0; i < n; i++)
    if (recs[i].has_event) {
      r = segm[i]->be->event_wait(segm[i]->be, segm[i]->dev_id, stream,
                                  recs[i].event);
      if (r != IPCREF_OK) goto unlock;
    }
  /* Commit: the new mappings join the cache, and each view gets a buffer
   * whose death returns its lease. */
  ipcref__maps_commit(ctx, fresh, nfresh);
  nfresh = 0;
  ctx->st.fds_received += (uint64_t)nfd;
  r = IPCREF_OK;
  for (i = 0; i < n; i++) {
    ipcref__view_rec *v = &recs[i];
    ipcref__import *imp = (ipcref__import *)ipcref__zalloc(sizeof *imp);
    ipcref_buf *b = NULL;
    ipcref_device dev;
    dev.type = segm[i]->kind == 3 ? segm[i]->dev_type : IPCREF_DEVICE_CPU;
    dev.id = segm[i]->kind == 3 ? segm[i]->dev_id : 0;
    if (!imp ||
        ipcref_buf_wrap_device(ipcref__map_addr(segm[i], v->block_offset),
                               (size_t)v->block_size, dev,
                               ipcref__import_release, imp, &b) != IPCREF_OK) {
      /* Out of memory: give back the leases we cannot use. */
      IPCREF_FREE(imp);
      ipcref__leases_give_back(recs, ledm, i, n);
      r = IPCREF_ENOMEM;
      break;
    }
    /* A read-only mapping is never writable, however unique. */
    if (!segm[i]->writable) ipcref__buf_set_read_only(b);
    imp->ctx = ctx;
    imp->seg = segm[i];
    imp->ledger = ledm[i];
    imp->slot = v->slot;
    imp->gen = v->gen;
    imp->offset = (size_t)v->block_offset;
    imp->size = (size_t)v->block_size;
    imp->stream = stream;
    imp->has_event = v->has_event;
    memcpy(imp->event, v->event, sizeof imp->event);
    ledm[i]->imported[v->slot] = v->gen + 1u;
    __atomic_fetch_add(&segm[i]->refs, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&ledm[i]->refs, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&ctx->imported_bufs, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&ctx->refs, 1, __ATOMIC_RELAXED);
    views[i] = v->view;
    views[i].buf = b;
    made++;
  }
  *nviews = made;
  if (made) IPCREF__STEP("import");
unlock:
  for (k = 0; k < nfresh; k++) ipcref__map_drop(fresh[k]); /* undo */
  IPCREF__UNLOCK(ctx);
  if (r != IPCREF_OK && made) { /* ENOMEM partway */
    for (i = 0; i < made; i++) ipcref_view_release(&views[i]);
    *nviews = 0;
  }
close_fds:
  for (i = 0; i < nfds; i++)
    if (fds[i] >= 0) close(fds[i]);
  if (r == IPCREF_EPROTO)
    __atomic_fetch_add(&ctx->refused, 1, __ATOMIC_RELAXED);
  return r;
}

/* Before anything goes to a peer or is taken from it (not under the
 * lock): its hello, waited for up to 5 s (the other side sends it from
 * ipcref_peer_new). Nothing is leased to a process we have not identified:
 * its uid decides whether it may connect, and its pid is what is watched
 * for its death (and what a forwarded hold names). Reading it also leaves
 * nothing unread on a producer that only sends (see ipcref__recvmsg). */
IPCREF_PRIVATE ipcref_result ipcref__hello_need(ipcref_peer *p) {
  if (!p->hello) {
    ipcref_result r = ipcref__hello_read(p, 5000);
    if (r != IPCREF_OK) return r;
  }
  return ipcref__hello_result(p);
}

IPCREF_API ipcref_result ipcref_export(ipcref_peer *p, const ipcref_view *v,
                                       ipcref_msg *msg) {
  ipcref__view_event ev[1];
  ipcref_result r;
  if (!p || !v || !msg) return IPCREF_EINVAL;
  if (!IPCREF__PEER_USABLE(p, "ipcref_export")) return IPCREF_EDEAD;
  r = ipcref__views_live(v, 1, "ipcref_export");
  if (r != IPCREF_OK) return r;
  msg->len = 0;
  msg->nfds = 0;
  msg->origin = NULL;
  r = ipcref__hello_need(p);
  if (r == IPCREF_OK) r = ipcref__events_record(v, 1, NULL, ev);
  if (r != IPCREF_OK) return r;
  IPCREF__LOCK(p->ctx);
  r = ipcref__export_msg(p, v, 1, ev, msg, 1);
  IPCREF__UNLOCK(p->ctx);
  ipcref__events_free(ev, 1); /* what no lease took */
  return r;
}

IPCREF_API ipcref_result ipcref_import(ipcref_peer *p, ipcref_msg *msg,
                                       ipcref_view *out) {
  ipcref_view views[IPCREF__MSG_VIEWS];
  ipcref_result r;
  int n = 0, i;
  if (!p || !msg || !out || msg->nfds < 0 || msg->nfds > IPCREF_MSG_MAX_FDS ||
      msg->len > sizeof msg->bytes)
    return IPCREF_EINVAL;
  r = IPCREF__PEER_USABLE(p, "ipcref_import") ? ipcref__hello_need(p)
                                              : IPCREF_EDEAD;
  if (r == IPCREF_OK)
    r = ipcref__import_bytes(p, msg->bytes, msg->len, msg->fds, msg->nfds, NULL,
                             views, &n);
  else
    for (i = 0; i < msg->nfds; i++) /* its fds, as on any error */
      if (msg->fds[i] >= 0) close(msg->fds[i]);
  msg->nfds = 0; /* taken (and closed on error) */
  msg->origin = NULL;
  if (r != IPCREF_OK) return r;
  for (i = 1; i < n; i++) ipcref_view_release(&views[i]); /* one per msg */
  *out = views[0];
  return IPCREF_OK;
}

IPCREF_API void ipcref_msg_sent(ipcref_msg *msg) {
  int i;
  if (!msg) return;
  for (i = 0; i < msg->nfds && i < IPCREF_MSG_MAX_FDS; i++)
    if (msg->fds[i] >= 0) close(msg->fds[i]);
  msg->nfds = 0;
  msg->origin = NULL;
}

IPCREF_API void ipcref_msg_free(ipcref_msg *msg) {
  int i;
  if (!msg) return;
  for (i = 0; i < msg->nfds && i < IPCREF_MSG_MAX_FDS; i++)
    if (msg->fds[i] >= 0) close(msg->fds[i]);
  msg->nfds = 0;
  if (msg->origin && msg->len <= sizeof msg->bytes) {
    /* Never imported: end the leases it carries. */
    ipcref_ctx *ctx = msg->origin->ctx;
    ipcref__wire w;
    ipcref__view_rec rec;
    int n, nfd, nret;
    w.p = msg->bytes;
    w.len = msg->len;
    w.pos = 0;
    w.bad = 0;
    (void)ipcref__get(&w, 6);
    n = (int)ipcref__get(&w, 2);
    nfd = (int)ipcref__get(&w, 2);
    nret = (int)ipcref__get(&w, 2);
    (void)ipcref__get(&w, 8); /* sender pid and nonce */
    (void)ipcref__get(&w, 4);
    IPCREF__LOCK(ctx);
    /* The peer never got these segments: send them again next time. */
    for (; nfd > 0 && !w.bad; nfd--) {
      ipcref__fd_rec f;
      if (ipcref__get_fd_rec(&w, &f)) ipcref__unsee(msg->origin, &f, 1);
    }
    w.pos += (size_t)nret * 8;
    while (n-- > 0 && ipcref__get_view(&w, &rec))
      ipcref__lease_cancel(ctx, &rec);
    IPCREF__UNLOCK(ctx);
  }
  msg->origin = NULL;
  msg->len = 0;
}

#endif /* IPCREF__SHARING_IMPL */
