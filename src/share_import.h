/* share_import: taking views from a peer. A message is decoded, its fds
 * checked against what they claim (memfd, seals, size, access, ledger
 * header, generation) before anything is mapped, mappings are cached per
 * context, and each view becomes a buffer whose release returns its lease
 * lock-free; ipcref_import for a message from the user's own transport.
 * Under ctx->lock, but for the release. */

#ifdef IPCREF__SHARING_IMPL

/* Pool memory's last buffer here lets go of its mapping before its lease
 * returns: the exporter may free the memory once every lease is back, and
 * its importers must have freed it first (see seg_export_fd). Under the
 * lock, where an import may be taking the mapping. */
IPCREF__PRIVATE void ipcref__pooled_done(ipcref_ctx *ctx, ipcref__map *m) {
  IPCREF__LOCK(ctx);
  if (__atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) == 0)
    ipcref__map_evict(ctx, m);
  IPCREF__UNLOCK(ctx);
}

/* The release callback of an imported buffer: this process's last
 * reference went, so the lease goes back to its producer. One fetch_add
 * and stores into shared memory, a free: no system call, no lock (but
 * for pool memory, above). */
IPCREF__PRIVATE void ipcref__import_end(ipcref__import *imp) {
  ipcref_ctx *ctx;
  uint64_t e = ipcref__ring_entry(IPCREF__RING_RELEASE, imp->slot, imp->gen);
  int pooled = imp->seg->pooled;
  if (pooled) ipcref__pooled_done(imp->ctx, imp->seg); /* first */
  ipcref__ring_push(imp->ledger->base, imp->ledger->nslots, imp->ledger->bell,
                    &e, 1, "release");
  if (!pooled) __atomic_fetch_sub(&imp->seg->refs, 1, __ATOMIC_RELEASE);
  __atomic_fetch_sub(&imp->ledger->refs, 1, __ATOMIC_RELEASE);
  ctx = imp->ctx;
  if (!imp->own_buf) IPCREF_FREE(imp); /* else its buffer's header frees it */
  ipcref__ctx_unref(ctx); /* only the last one after ctx_free tears down */
}

IPCREF__PRIVATE void ipcref__import_free_now(void *user, void *ptr,
                                             size_t size) {
  (void)user;
  (void)size;
  IPCREF_FREE(ptr);
}

/* The allocator of a host import's buffer header, which is the import's
 * first member: its last (weak) reference frees the import. Checked, it
 * waits in the quarantine as a default header does (a release after the
 * last is heard), the import behind it poisoned. */
IPCREF__PRIVATE void ipcref__import_free(void *user, void *ptr, size_t size) {
#ifdef IPCREF_CHECKED
  (void)size;
  ipcref__bury(ptr, sizeof(ipcref__import), sizeof(ipcref_buf),
               ipcref__import_free_now, user);
#else
  ipcref__import_free_now(user, ptr, size);
#endif
}

/* Device memory is returned only once the work queued on its stream has
 * completed, and nobody waits for that: the release parks the import with
 * a fence, and the calls on the context return it when the fence is done
 * (ipcref__deferred_poll). After ipcref_ctx_free nothing would poll, so a
 * release then waits for its fence here. */
IPCREF__PRIVATE void ipcref__import_release(void *user, void *data) {
  ipcref__import *imp = (ipcref__import *)user;
  (void)data;
  /* A forked child's copy: the lease is the parent's to return. */
  if (ipcref__forked(imp->ctx)) return;
  if (imp->seg->kind == IPCREF__KIND_DEVICE) {
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
  ipcref__import_end(imp);
}

/* Fresh mappings join the cache, charged to `via`, each in the place of
 * the one it displaces (see ipcref__map_displaced), which goes once unused
 * (under the lock). */
IPCREF__PRIVATE void ipcref__maps_commit(ipcref_ctx *ctx, ipcref_peer *via,
                                         ipcref__map **fresh, ipcref__map **old,
                                         int n) {
  int k;
  for (k = 0; k < n; k++) {
    if (old[k]) ipcref__map_displace(ctx, old[k]);
    ipcref__map_index_add(ctx, fresh[k]);
    ipcref__map_charge(ctx, via, fresh[k]);
    if (fresh[k]->kind == IPCREF__KIND_LEDGER)
      ctx->st.counter_files++;
    else
      ctx->st.mapped_segments++;
  }
}

/* 1 when the lease record `v` names is live at its generation in ledger
 * mapping `led` (its slot in range). */
IPCREF__PRIVATE int ipcref__lease_live(const ipcref__map *led,
                                       const ipcref__view_rec *v) {
  return v->slot < led->nslots &&
         __atomic_load_n(&ipcref__ledger_slots(led->base)[2 * (size_t)v->slot],
                         __ATOMIC_ACQUIRE) ==
             (((uint64_t)v->gen << 2) | IPCREF__SLOT_LIVE);
}

/* Gives the lease record `v` names back through ledger mapping `led`, as
 * an entry of `kind`, marked imported (a replay is refused). */
IPCREF__PRIVATE void
ipcref__lease_give(ipcref__map *led, const ipcref__view_rec *v, uint32_t kind) {
  uint64_t e = ipcref__ring_entry(kind, v->slot, v->gen);
  led->imported[v->slot] = v->gen + 1u;
  ipcref__ring_push(led->base, led->nslots, led->bell, &e, 1, NULL);
}

/* Gives back the leases of records [from, n) that will not be used. */
IPCREF__PRIVATE void ipcref__leases_give_back(const ipcref__view_rec *recs,
                                              ipcref__map **ledm, int from,
                                              int n) {
  int k;
  for (k = from; k < n; k++)
    ipcref__lease_give(ledm[k], &recs[k], IPCREF__RING_RELEASE);
}

/* The mappings one message needs: those it brings (fresh: out of the
 * cache until the commit, dropped if the message is refused) and, per
 * view, its segment and ledger. */
typedef struct ipcref__msg_maps {
  ipcref__map *fresh[IPCREF_MSG_MAX_FDS];
  ipcref__map *old[IPCREF_MSG_MAX_FDS]; /* what each displaces, or NULL */
  int nfresh;
  ipcref__map *seg[IPCREF_MSG_MAX_VIEWS], *ledger[IPCREF_MSG_MAX_VIEWS];
  ipcref_peer *via; /* the peer it came on, charged for what it brings */
  int over;         /* a view of what a message refused for the caps brought */
  const char *why;  /* what a refusal (EPROTO, ERANGE) found wrong */
} ipcref__msg_maps;

/* A mapping this message brings, or NULL; as ipcref__map_find, a segment
 * is host or device memory. */
IPCREF__PRIVATE ipcref__map *ipcref__fresh_find(const ipcref__msg_maps *mm,
                                                int kind, uint64_t nonce,
                                                uint64_t id) {
  int k;
  for (k = 0; k < mm->nfresh; k++)
    if ((mm->fresh[k]->kind == IPCREF__KIND_LEDGER) ==
            (kind == IPCREF__KIND_LEDGER) &&
        mm->fresh[k]->origin_nonce == nonce && mm->fresh[k]->id == id)
      return mm->fresh[k];
  return NULL;
}

/* Import, step 1 (under the lock): the segments the sender destroyed are
 * unmapped here once nothing uses them. */
IPCREF__PRIVATE void ipcref__import_retire(ipcref_ctx *ctx,
                                           const ipcref__msg_in *m) {
  int i;
  for (i = 0; i < m->head.nretired; i++) {
    ipcref__map *s = ipcref__map_find(ctx, IPCREF__KIND_SEGMENT,
                                      m->head.sender_nonce, m->retired[i]);
    if (s) ipcref__map_retire(ctx, s);
  }
  ipcref__maps_trim(ctx, ctx->opt.retired_maps);
}

/* 1 when record `f`, which process `by` brings, displaces mapping `old`
 * of the same (origin nonce, id). `by` must be the origin itself (the
 * kernel vouches for its pid). Then:
 *   - `old` was retired, and `by` sent it first: a producer that connects
 *     again after its last peer here was freed (its mappings retired,
 *     some still in use) sends its fds anew, and they are mapped anew
 *     (a device handle too: the backend counts a second open as a use of
 *     the first);
 *   - or `old` came from somebody else, who vouched for it: so a process
 *     that forwards a segment (or a ledger) under another producer's name
 *     before that producer sends it cannot plant it in that producer's
 *     own messages: the origin's word wins. Host memory only. */
IPCREF__PRIVATE int ipcref__map_displaced(const ipcref__map *old,
                                          const ipcref__fd_rec *f, int by) {
  int host = f->kind == IPCREF__KIND_SEGMENT || f->kind == IPCREF__KIND_LEDGER;
  if ((int)f->origin_pid != by) return 0;
  if (old->retired)
    return old->origin_pid == by &&
           old->kind == (host ? f->kind : IPCREF__KIND_DEVICE);
  return host && old->kind == f->kind && old->by_pid != old->origin_pid;
}

/* Import, step 2: maps what is new, each fd checked against its record
 * first; an fd for something already mapped is redundant, unless it
 * displaces it. A mapped fd is the map's (set to -1 in `fds`). `by`: the
 * sender's pid. */
IPCREF__PRIVATE ipcref_result ipcref__import_map(ipcref_ctx *ctx,
                                                 const ipcref__msg_in *m,
                                                 int *fds, int by,
                                                 ipcref__msg_maps *mm) {
  int i;
  for (i = 0; i < m->head.nrecs; i++) {
    const ipcref__fd_rec *f = &m->recs[i];
    int kind = f->kind == IPCREF__KIND_LEDGER ? IPCREF__KIND_LEDGER
                                              : IPCREF__KIND_SEGMENT;
    ipcref__map *old;
    ipcref_result r;
    if (ipcref__fresh_find(mm, kind, f->origin_nonce, f->id)) continue;
    old = ipcref__map_find(ctx, kind, f->origin_nonce, f->id);
    if (old && !ipcref__map_displaced(old, f, by)) continue;
    mm->old[mm->nfresh] = old;
    if (f->kind == IPCREF__KIND_DEVICE) {
      r = ipcref__map_device(ctx, f, -1, &mm->fresh[mm->nfresh], &mm->why);
    } else if (f->kind == IPCREF__KIND_DEVICE_CHUNKS) {
      int at = m->fd_index[i], k;
      mm->why = "a device segment in chunks that came without their fds";
      r = IPCREF_OK;
      for (k = 0; k < f->nchunks; k++)
        if (fds[at + k] < 0) r = IPCREF_EPROTO;
      if (r == IPCREF_OK)
        r = ipcref__map_chunks(ctx, f, fds + at, &mm->fresh[mm->nfresh],
                               &mm->why);
      for (k = 0; r == IPCREF_OK && k < f->nchunks; k++) fds[at + k] = -1;
    } else if (f->kind == IPCREF__KIND_DEVICE_FD ||
               f->kind == IPCREF__KIND_DEVICE_POOL) {
      int at = m->fd_index[i];
      mm->why = "a device segment by fd that came without one";
      r = fds[at] < 0 ? IPCREF_EPROTO
                      : ipcref__map_device(ctx, f, fds[at],
                                           &mm->fresh[mm->nfresh], &mm->why);
      if (r == IPCREF_OK) fds[at] = -1;
    } else {
      int at = m->fd_index[i], led = f->kind == IPCREF__KIND_LEDGER;
      r = ipcref__map_fd(fds[at], led ? fds[at + 1] : -1, f,
                         &mm->fresh[mm->nfresh], &mm->why);
      if (r == IPCREF_OK) fds[at] = -1;
      if (r == IPCREF_OK && led) fds[at + 1] = -1; /* the bell: the map's */
    }
    if (r != IPCREF_OK) return r;
    mm->fresh[mm->nfresh++]->by_pid = by;
    IPCREF__STEP("map");
  }
  return IPCREF_OK;
}

/* Import, step 3: what forbids taking view record `i` (NULL: nothing).
 * Its segment and ledger are mapped and agree with it; its lease is live
 * at exactly its generation (a replay of an older message finds the slot
 * freed or reused; a slot the producer published ahead of its lease is
 * live too, and a record naming one before its lease is the producer's
 * own lie: see share_ledger) and was not imported already, by an earlier
 * message or an earlier record of this one (one export, one import);
 * every element it reaches lies inside its block. */
IPCREF__PRIVATE const char *ipcref__import_rec_why(ipcref_ctx *ctx,
                                                   const ipcref__msg_in *m,
                                                   ipcref__msg_maps *mm,
                                                   int i) {
  const ipcref__view_rec *v = &m->views[i];
  ipcref__map *seg, *led;
  uint64_t end;
  int k;
  /* What this message brings first: it may displace a mapping. */
  seg =
      ipcref__fresh_find(mm, IPCREF__KIND_SEGMENT, v->origin_nonce, v->seg_id);
  if (!seg)
    seg =
        ipcref__map_find(ctx, IPCREF__KIND_SEGMENT, v->origin_nonce, v->seg_id);
  led = ipcref__fresh_find(mm, IPCREF__KIND_LEDGER, v->origin_nonce,
                           v->ledger_id);
  if (!led)
    led = ipcref__map_find(ctx, IPCREF__KIND_LEDGER, v->origin_nonce,
                           v->ledger_id);
  mm->seg[i] = seg;
  mm->ledger[i] = led;
  if (!seg || !led) {
    mm->over = (!seg && ipcref__refused_was(mm->via, v->origin_nonce,
                                            ipcref__sent_key(v->seg_id, 0))) ||
               (!led && ipcref__refused_was(mm->via, v->origin_nonce,
                                            ipcref__sent_key(v->ledger_id, 1)));
    return mm->over ? "a view of what a message refused for the caps "
                      "(max_maps, max_mapped_bytes) brought"
                    : "a view of a segment or ledger never sent";
  }
  if (seg->origin_pid != (int)v->origin_pid ||
      led->origin_pid != (int)v->origin_pid)
    return "a view whose origin is not its segment's or its ledger's";
  if (seg->retired) return "a view of a segment its producer retired";
  if (seg->size != v->seg_size || v->block_size == 0 ||
      __builtin_add_overflow(v->block_offset, v->block_size, &end) ||
      end > seg->size)
    return "a block outside its segment";
  if (v->slot >= led->nslots) return "a lease slot outside its ledger";
  if (v->writable && !seg->writable)
    return "a writable view of a read-only segment";
  if (v->has_event && seg->kind != IPCREF__KIND_DEVICE)
    return "an event with a view of host memory";
  if (!ipcref__lease_live(led, v))
    return "a lease not live at its generation (never given, or replayed)";
  if (led->imported[v->slot] == v->gen + 1u) return "a lease imported twice";
  for (k = 0; k < i; k++)
    if (mm->ledger[k] == led && m->views[k].slot == v->slot)
      return "the same lease twice in one message";
  if (seg->kind == IPCREF__KIND_DEVICE && !seg->be) return NULL; /* ENODEV */
  if (!ipcref__view_fits(&v->view, v->block_size))
    return "a view reaching outside its block";
  if (v->view.byte_offset % (int64_t)ipcref__dtype_sizes[v->view.dtype] != 0)
    return "a byte offset not a multiple of its element size";
  return NULL;
}

/* A message refused for the caps (ERANGE: its peer's or the context's),
 * or naming what one brought: what it brings is noted (see
 * ipcref__refused_note), and each of its leases that is live at its
 * generation in a ledger mapped here or kept (ipcref__refused_keep;
 * checked as step 3 checks it; the others cannot be returned) goes back,
 * marked imported. A lease of the sender's own goes back as refused: its
 * producer then sends the fds of its segment and ledger again. */
IPCREF__PRIVATE void ipcref__leases_refuse(ipcref_ctx *ctx,
                                           const ipcref__msg_in *m,
                                           ipcref__msg_maps *mm) {
  int k;
  for (k = 0; k < mm->nfresh; k++) ipcref__refused_note(mm->via, mm->fresh[k]);
  for (k = 0; k < m->head.nviews; k++) {
    const ipcref__view_rec *v = &m->views[k];
    ipcref__map *led = ipcref__fresh_find(mm, IPCREF__KIND_LEDGER,
                                          v->origin_nonce, v->ledger_id);
    if (!led)
      led = ipcref__map_find(ctx, IPCREF__KIND_LEDGER, v->origin_nonce,
                             v->ledger_id);
    if (!led) led = ipcref__kept_find(mm->via, v->origin_nonce, v->ledger_id);
    if (led && ipcref__lease_live(led, v) &&
        led->imported[v->slot] != v->gen + 1u)
      ipcref__lease_give(led, v,
                         v->origin_nonce == m->head.sender_nonce
                             ? IPCREF__RING_REFUSED
                             : IPCREF__RING_RELEASE);
  }
}

/* The ledgers a refused message brought stay mapped a while, uncharged
 * (the peer's last IPCREF__KEPT): a message already on its way that names
 * one gives its leases back through it (ipcref__leases_refuse). They leave
 * `mm`; the rest of what it brought goes. */
IPCREF__PRIVATE void ipcref__refused_keep(ipcref__msg_maps *mm) {
  ipcref_peer *p = mm->via;
  int k, n = 0;
  for (k = 0; k < mm->nfresh; k++) {
    ipcref__map **slot = &p->kept[p->kept_at % IPCREF__KEPT];
    if (mm->fresh[k]->kind != IPCREF__KIND_LEDGER) {
      mm->fresh[n++] = mm->fresh[k];
      continue;
    }
    if (*slot) ipcref__map_drop(*slot);
    *slot = mm->fresh[k];
    p->kept_at++;
  }
  mm->nfresh = n;
}

/* 1 when mapping `x` is one message `m` names, or one a mapping it brings
 * displaces (ipcref__maps_commit still touches those). */
IPCREF__PRIVATE int ipcref__msg_uses(const ipcref__msg_in *m,
                                     const ipcref__msg_maps *mm,
                                     const ipcref__map *x) {
  int k;
  for (k = 0; k < m->head.nviews; k++)
    if (mm->seg[k] == x || mm->ledger[k] == x) return 1;
  for (k = 0; k < mm->nfresh; k++)
    if (mm->old[k] == x) return 1;
  return 0;
}

/* Import, step 4: room under the caps of the peer it came on, and of the
 * context, for what it brings (see ipcref__map_room). Short of it, the
 * idle mappings of what was retired go first (not those the message
 * uses); still short, the message is refused (ERANGE). */
IPCREF__PRIVATE ipcref_result ipcref__import_room(ipcref_ctx *ctx,
                                                  const ipcref__msg_in *m,
                                                  ipcref__msg_maps *mm) {
  ipcref__map *x, *next;
  size_t bytes = 0;
  int k;
  if (mm->nfresh == 0) return IPCREF_OK; /* nothing new: always fits */
  for (k = 0; k < mm->nfresh; k++)
    if (__builtin_add_overflow(bytes, mm->fresh[k]->size, &bytes))
      bytes = SIZE_MAX;
  if (ipcref__map_room(mm->via, (size_t)mm->nfresh, bytes)) return IPCREF_OK;
  for (x = ctx->maps_retired; x; x = next) {
    next = x->next;
    if (!__atomic_load_n(&x->refs, __ATOMIC_ACQUIRE) &&
        !ipcref__msg_uses(m, mm, x))
      ipcref__map_evict(ctx, x);
  }
  if (ipcref__map_room(mm->via, (size_t)mm->nfresh, bytes)) return IPCREF_OK;
  mm->why = "past the caps (max_maps, max_mapped_bytes) of the peer it "
            "came on or of the context";
  return IPCREF_ERANGE;
}

/* Import, step 5: what is needed before anything is taken. Device memory
 * without its backend here is refused (ENODEV), its leases, which are
 * genuine, given back at once and its mappings kept (the peer counts them
 * sent); device data makes `stream` wait for the producer's writes (also
 * when the segment was mapped before). */
IPCREF__PRIVATE ipcref_result ipcref__import_ready(ipcref_ctx *ctx,
                                                   const ipcref__msg_in *m,
                                                   ipcref__msg_maps *mm,
                                                   void *stream) {
  int i, n = m->head.nviews;
  for (i = 0; i < n; i++)
    if (mm->seg[i]->kind == IPCREF__KIND_DEVICE && !mm->seg[i]->be) {
      ipcref__maps_commit(ctx, mm->via, mm->fresh, mm->old, mm->nfresh);
      mm->nfresh = 0;
      ipcref__leases_give_back(m->views, mm->ledger, 0, n);
      return IPCREF_ENODEV;
    }
  for (i = 0; i < n; i++)
    if (m->views[i].has_event) {
      ipcref_backend *be = mm->seg[i]->be;
      ipcref_result r =
          be->event_wait(be, mm->seg[i]->dev_id, stream, m->views[i].event);
      if (r != IPCREF_OK) return r;
    }
  return IPCREF_OK;
}

/* Import, step 6, for one view: a buffer over its block whose death
 * returns its lease (see ipcref__import_release). 0 when out of memory. */
IPCREF__PRIVATE int ipcref__import_view(ipcref_ctx *ctx,
                                        const ipcref__view_rec *v,
                                        ipcref__map *seg, ipcref__map *led,
                                        void *stream, ipcref_view *out) {
  ipcref__import *imp = (ipcref__import *)IPCREF_MALLOC(sizeof *imp);
  ipcref_buf *b = NULL;
  ipcref_device dev;
  void *addr = ipcref__map_addr(seg, v->block_offset);
  int device = seg->kind == IPCREF__KIND_DEVICE;
  dev.type = device ? seg->dev_type : IPCREF_DEVICE_CPU;
  dev.id = device ? seg->dev_id : 0;
  if (!imp) return 0;
  /* Host memory: one allocation for the import and its buffer, whose
   * header may outlive the lease (weak references): the header's free
   * frees both. A device import's release may park it (ipcref__
   * import_release), past its header: a buffer of its own. */
  imp->own_buf = !device;
  if (imp->own_buf) {
    ipcref_allocator a;
    a.alloc = ipcref__default_alloc; /* unused: the header is never resized */
    a.free = ipcref__import_free;
    a.user = NULL;
    ipcref__buf_adopt(&imp->buf, addr, (size_t)v->block_size, dev,
                      ipcref__import_release, imp, &a);
    b = &imp->buf;
  } else if (ipcref_buf_wrap_device(addr, (size_t)v->block_size, dev,
                                    ipcref__import_release, imp,
                                    &b) != IPCREF_OK) {
    IPCREF_FREE(imp);
    return 0;
  }
  /* A read-only mapping is never writable, however unique. */
  if (!seg->writable) ipcref__buf_new_read_only(b);
  imp->ctx = ctx;
  imp->seg = seg;
  imp->ledger = led;
  imp->slot = v->slot;
  imp->gen = v->gen;
  imp->offset = (size_t)v->block_offset;
  imp->size = (size_t)v->block_size;
  imp->stream = stream;
  imp->has_event = v->has_event;
  memcpy(imp->event, v->event, sizeof imp->event);
  imp->next = NULL;
  imp->fence = NULL;
  led->imported[v->slot] = v->gen + 1u;
  __atomic_fetch_add(&seg->refs, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&led->refs, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&ctx->refs, 1, __ATOMIC_RELAXED);
  *out = v->view;
  out->buf = b;
  return 1;
}

/* Import, step 6: the fresh mappings join the cache and each view gets
 * its buffer. Out of memory partway, the leases not used are given back
 * (the views made are released by the caller, after the unlock). */
IPCREF__PRIVATE ipcref_result ipcref__import_commit(
    ipcref_ctx *ctx, const ipcref__msg_in *m, ipcref__msg_maps *mm,
    void *stream, ipcref_view *views, int *nviews) {
  int i, n = m->head.nviews;
  ipcref__maps_commit(ctx, mm->via, mm->fresh, mm->old, mm->nfresh);
  mm->nfresh = 0;
  ctx->st.fds_received += (uint64_t)m->nfds;
  for (i = 0; i < n; i++) {
    if (!ipcref__import_view(ctx, &m->views[i], mm->seg[i], mm->ledger[i],
                             stream, &views[i])) {
      ipcref__leases_give_back(m->views, mm->ledger, i, n);
      return IPCREF_ENOMEM;
    }
    (*nviews)++;
  }
  IPCREF__STEP("import");
  return IPCREF_OK;
}

/* A message refused (EPROTO): counted, and named to the context's hook as
 * "message refused: why" (with `code`, ipcref__refused_as). */
IPCREF__PRIVATE void ipcref__refused_as(ipcref_ctx *ctx, ipcref_result code,
                                        const char *why) {
  static const char head[] = "message refused: ";
  char m[192];
  size_t n;
  if (!why) why = "malformed";
  n = strlen(why);
  __atomic_fetch_add(&ctx->refused, 1, __ATOMIC_RELAXED);
  if (n > sizeof m - sizeof head) n = sizeof m - sizeof head;
  memcpy(m, head, sizeof head - 1);
  memcpy(m + sizeof head - 1, why, n);
  m[sizeof head - 1 + n] = '\0';
  ipcref__ctx_report(ctx, code, m);
}

IPCREF__PRIVATE void ipcref__refused(ipcref_ctx *ctx, const char *why) {
  ipcref__refused_as(ctx, IPCREF_EPROTO, why);
}

/* import_bytes' `how`: the death check runs there (not for a record off
 * the channel: see recv_chan); the message's metadata is kept in the peer
 * for ipcref_recv_meta (a receive's, not ipcref_import's). */
#define IPCREF__IMPORT_PUMP 1
#define IPCREF__IMPORT_META 2

/* Imports a received message with its fds (takes the fds: each is closed
 * or kept by a mapping). `views` gets one view per record. Decoded first
 * (no side effect), then under the lock: retire, map, check every record,
 * make room, get ready, commit. A refused message changes nothing but the
 * cache of what was retired, and the refusal count. */
IPCREF__PRIVATE ipcref_result ipcref__import_bytes(
    ipcref_peer *p, const unsigned char *bytes, size_t len, int *fds, int nfds,
    void *stream, ipcref_view *views, int *nviews, int how) {
  ipcref_ctx *ctx = p->ctx;
  ipcref__msg_in m;
  ipcref__msg_maps mm;
  ipcref_result r = IPCREF_EPROTO;
  int i, k;
  *nviews = 0;
  mm.nfresh = 0;
  mm.over = 0;
  mm.via = p;
  mm.why = "the fds that came are not those its records call for";
  if (!ipcref__msg_decode(bytes, len, &m)) {
    mm.why = m.why;
    goto done;
  }
  if (m.nfds != nfds) goto done;
  if (m.head.sender_nonce != p->nonce) {
    /* It names what it retires by its sender: only p may speak for p. */
    mm.why = "a message whose sender is not the peer it came from";
    goto done;
  }
  IPCREF__LOCK(ctx);
  if (how & IPCREF__IMPORT_PUMP) (void)ipcref__pump(ctx, 0);
  ipcref__import_retire(ctx, &m);
  r = ipcref__import_map(ctx, &m, fds, p->pid, &mm);
  for (i = 0; r == IPCREF_OK && i < m.head.nviews; i++)
    if ((mm.why = ipcref__import_rec_why(ctx, &m, &mm, i)) != NULL)
      r = IPCREF_EPROTO;
  if (r == IPCREF_EPROTO && mm.over) r = IPCREF_ERANGE;
  if (r == IPCREF_OK) r = ipcref__import_room(ctx, &m, &mm);
  if (r == IPCREF_ERANGE) {
    ipcref__leases_refuse(ctx, &m, &mm);
    ipcref__refused_keep(&mm);
  }
  if (r == IPCREF_OK) r = ipcref__import_ready(ctx, &m, &mm, stream);
  if (r == IPCREF_OK)
    r = ipcref__import_commit(ctx, &m, &mm, stream, views, nviews);
  for (k = 0; k < mm.nfresh; k++) ipcref__map_drop(mm.fresh[k]); /* undo */
  IPCREF__UNLOCK(ctx);
  if (r != IPCREF_OK) { /* ENOMEM partway */
    for (i = 0; i < *nviews; i++) ipcref_view_release(&views[i]);
    *nviews = 0;
  } else if (how & IPCREF__IMPORT_META) { /* its last bytes (msg_decode) */
    p->meta_len = m.head.meta_len;
    if (p->meta_len) memcpy(p->meta, bytes + len - p->meta_len, p->meta_len);
  }
done:
  for (i = 0; i < nfds; i++)
    if (fds[i] >= 0) close(fds[i]);
  if (r == IPCREF_EPROTO) ipcref__refused(ctx, mm.why);
  if (r == IPCREF_ERANGE) ipcref__refused_as(ctx, r, mm.why);
  return r;
}

#endif /* IPCREF__SHARING_IMPL */
