/* share_ctx: the context. Creation (and IPCREF_CHECKED's fork handler),
 * the teardown when its last reference goes, the retirement of a dead
 * producer's mappings, reaping what the dead held (every ring first), the
 * pump every call runs, and the public calls on a context: collect, poll
 * and stats. Under ctx->lock, but for the waits in ipcref_ctx_free and
 * ipcref_ctx_poll. */

#ifdef IPCREF__SHARING_IMPL

/* IPCREF_CHECKED: a forked child starts with a copy of the quarantine,
 * whose objects are its parent's dead: it hands them back at once (else
 * they would linger until it exits). The lock is held across the fork, so
 * the child's copy is whole. */
#ifdef IPCREF_CHECKED
static pthread_once_t ipcref__fork_once = PTHREAD_ONCE_INIT;
/* pthread_atfork's three handlers, registered once. */
IPCREF__PRIVATE void ipcref__fork_prepare(void) {
  ipcref__quarantine_lock();
}
IPCREF__PRIVATE void ipcref__fork_parent(void) {
  ipcref__quarantine_unlock();
}
IPCREF__PRIVATE void ipcref__fork_child(void) {
  ipcref__quarantine_unlock();
  ipcref_quarantine_flush();
}
IPCREF__PRIVATE void ipcref__fork_handlers(void) {
  (void)pthread_atfork(ipcref__fork_prepare, ipcref__fork_parent,
                       ipcref__fork_child);
}
#endif

/* ---- the process's live contexts -----------------------------------------
 * A message exported for the user's own transport names its context by
 * nonce, never by pointer (share_msg): settling it finds the context
 * here, alive or gone. ipcref__live_lock guards the list alone and is
 * never held with ctx->lock; pthread_atfork handlers hold it across a
 * fork, so that a child's copy of the list is whole and unlocked. */
static pthread_mutex_t ipcref__live_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ipcref__live_once = PTHREAD_ONCE_INIT;
static ipcref_ctx *ipcref__live;
IPCREF__PRIVATE void ipcref__live_take(void) {
  pthread_mutex_lock(&ipcref__live_lock);
}
IPCREF__PRIVATE void ipcref__live_give(void) {
  pthread_mutex_unlock(&ipcref__live_lock);
}
IPCREF__PRIVATE void ipcref__live_fork_handlers(void) {
  (void)pthread_atfork(ipcref__live_take, ipcref__live_give, ipcref__live_give);
}

/* Joins (1) or leaves (0) the list. */
IPCREF__PRIVATE void ipcref__live_set(ipcref_ctx *ctx, int live) {
  ipcref_ctx **pp;
  (void)pthread_once(&ipcref__live_once, ipcref__live_fork_handlers);
  ipcref__live_take();
  for (pp = &ipcref__live; *pp && *pp != ctx; pp = &(*pp)->live_next) {
  }
  if (live && !*pp) {
    ctx->live_next = ipcref__live;
    ipcref__live = ctx;
  } else if (!live && *pp) {
    *pp = ctx->live_next;
  }
  ipcref__live_give();
}

/* The context of this process (not a parent's copy) with `nonce`, one
 * reference more, or NULL when it is gone or going. */
IPCREF__PRIVATE ipcref_ctx *ipcref__live_find(uint64_t nonce) {
  ipcref_ctx *c;
  int refs = 0;
  (void)pthread_once(&ipcref__live_once, ipcref__live_fork_handlers);
  ipcref__live_take();
  for (c = ipcref__live; c; c = c->live_next)
    if (c->nonce == nonce && !ipcref__forked(c)) break;
  if (c) refs = __atomic_load_n(&c->refs, __ATOMIC_RELAXED);
  /* Never from 0: that context's teardown has begun. */
  while (refs > 0 &&
         !__atomic_compare_exchange_n(&c->refs, &refs, refs + 1, 1,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  ipcref__live_give();
  return refs > 0 ? c : NULL;
}

IPCREF_API ipcref_result ipcref_ctx_new(const ipcref_ctx_options *opt,
                                        ipcref_ctx **out) {
  ipcref_ctx *ctx;
  struct timespec ts;
  if (!out) return ipcref__invalid(__func__, "out is NULL");
  ctx = (ipcref_ctx *)ipcref__zalloc(sizeof *ctx);
  if (!ctx) return IPCREF_ENOMEM;
  if (opt) ctx->opt = *opt;
  if (!ctx->opt.segment_size) ctx->opt.segment_size = (size_t)16 << 20;
  if (!ctx->opt.segment_cache) ctx->opt.segment_cache = (size_t)512 << 20;
  if (!ctx->opt.retired_maps) ctx->opt.retired_maps = (size_t)64 << 20;
  if (!ctx->opt.ledger_slots) ctx->opt.ledger_slots = 4096;
  if (ctx->opt.segment_size < 4096 || (ctx->opt.segment_size & 4095) ||
      ctx->opt.segment_size > IPCREF__SEGMENT_MAX) {
    IPCREF_FREE(ctx);
    return ipcref__invalid(__func__,
                           "segment_size not a multiple of 4096 up to 1 GiB");
  }
  if (ctx->opt.ledger_slots < 8 || ctx->opt.ledger_slots > (1u << 24) ||
      (ctx->opt.ledger_slots & 1)) {
    IPCREF_FREE(ctx);
    return ipcref__invalid(__func__, "ledger_slots odd, or not in 8..2^24");
  }
  if (ctx->opt.allow_uids_count) {
    if (!ctx->opt.allow_uids || ctx->opt.allow_uids_count > 65536) {
      IPCREF_FREE(ctx);
      return ipcref__invalid(__func__,
                             "allow_uids NULL, or allow_uids_count over 65536");
    }
    ctx->uids =
        (uint32_t *)IPCREF_MALLOC(ctx->opt.allow_uids_count * sizeof(uint32_t));
    if (!ctx->uids) {
      IPCREF_FREE(ctx);
      return IPCREF_ENOMEM;
    }
    memcpy(ctx->uids, ctx->opt.allow_uids,
           ctx->opt.allow_uids_count * sizeof(uint32_t));
  }
  ctx->opt.allow_uids = ctx->uids; /* ours, not the caller's */
  ctx->bell_rx = ctx->bell_tx = -1;
  ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
  ctx->lock.word = 0;
  if (ctx->epfd < 0 || !ipcref__bell_make(ctx)) {
    int e = errno;
    if (ctx->epfd >= 0) close(ctx->epfd);
    if (ctx->bell_rx >= 0) close(ctx->bell_rx), close(ctx->bell_tx);
    IPCREF_FREE(ctx->uids);
    IPCREF_FREE(ctx);
    return e == ENOMEM ? IPCREF_ENOMEM : IPCREF_ESYS;
  }
  if (pthread_mutex_init(&ctx->hdr_lock, NULL) != 0) {
    close(ctx->epfd);
    close(ctx->bell_rx);
    close(ctx->bell_tx);
    IPCREF_FREE(ctx->uids);
    IPCREF_FREE(ctx);
    return IPCREF_ESYS;
  }
#ifdef IPCREF_CHECKED
  (void)pthread_once(&ipcref__fork_once, ipcref__fork_handlers);
#endif
  ctx->magic = IPCREF__ALIVE;
  ctx->pid = (int)getpid();
  ctx->fork_gen = ipcref__fork_gen_now();
  ctx->uid = (int)getuid();
  ctx->host.dev = 0; /* host memory: no backend */
  ctx->refs = 1;
  /* Identifies this ctx across processes (pids get reused). */
  clock_gettime(CLOCK_REALTIME, &ts);
  ctx->nonce = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
               ((uint64_t)ctx->pid << 40) ^ (uint64_t)(uintptr_t)ctx;
  if (!ctx->nonce) ctx->nonce = 1; /* 0: a message exported nowhere */
  ipcref__live_set(ctx, 1);
  *out = ctx;
  return IPCREF_OK;
}

/* Lets go of a mapping (not in the cache, or just taken out of it). */
IPCREF__PRIVATE void ipcref__map_drop(ipcref__map *m) {
  if (m->kind == IPCREF__KIND_DEVICE) {
    if (m->be) m->be->seg_close(m->be, m->dev_id, m->daddr);
    if (m->fd >= 0) close(m->fd); /* shared by fd: kept for forwarding */
    if (m->vmm_chunks) {
      int i;
      for (i = 0; i < m->vmm_chunks->n; i++) close(m->vmm_chunks->fd[i]);
      IPCREF_FREE(m->vmm_chunks);
    }
  } else {
    munmap(m->base, m->size);
    close(m->fd);
    if (m->bell >= 0) close(m->bell);
  }
  IPCREF_FREE(m->imported);
  IPCREF_FREE(m);
}

/* Takes a mapping out of the cache and lets go of it (under the lock). */
IPCREF__PRIVATE void ipcref__map_evict(ipcref_ctx *ctx, ipcref__map *m) {
  ipcref__map_index_del(ctx, m);
  ipcref__map_uncharge(ctx, m);
  if (m->kind == IPCREF__KIND_LEDGER)
    ctx->st.counter_files--;
  else
    ctx->st.mapped_segments--;
  ipcref__map_drop(m);
}

/* Unmaps what its origin retired and nobody here uses (under the lock),
 * once that adds up to `min_bytes`. Unmapping the last mapping of a
 * segment frees its pages, which takes time in proportion to its size: a
 * receive does it past opt.retired_maps, ipcref_collect and ipcref_ctx_trim
 * always. */
IPCREF__PRIVATE void ipcref__maps_trim(ipcref_ctx *ctx, size_t min_bytes) {
  ipcref__map *m, *next;
  size_t idle = 0, count = 0;
  for (m = ctx->maps_retired; m; m = m->next)
    if (__atomic_load_n(&m->refs, __ATOMIC_ACQUIRE) == 0)
      idle += m->size, count++;
  /* Many small ones hold fds and address space: trim past 64 of them too. */
  if (count == 0 || (idle < min_bytes && count < 64)) return;
  for (m = ctx->maps_retired; m; m = next) {
    next = m->next;
    if (__atomic_load_n(&m->refs, __ATOMIC_ACQUIRE) == 0)
      ipcref__map_evict(ctx, m);
  }
}

/* The teardown, when the last reference to the context goes. */
IPCREF__PRIVATE void ipcref__ctx_destroy(ipcref_ctx *ctx) {
  ipcref__block *b;
  ipcref__pool *pool;
  ipcref__live_set(ctx, 0);
  IPCREF__LOCK(ctx);
  ipcref__sweep(ctx);
  /* Device memory a consumer may still have open is never freed (that is
   * undefined behaviour for the driver) nor handed back to a wrap's owner:
   * it goes back to the driver when the process exits. */
  for (b = ctx->limbo; b; b = b->limbo_next)
    if (b->seg->pool->be) {
      b->seg->leaked = 1;
      b->release = NULL;
    }
  while (ctx->limbo) {
    b = ctx->limbo;
    ipcref__limbo_remove(ctx, b);
    if (b->seg->cls == IPCREF__FOREIGN) ipcref__block_free(ctx, b);
  }
  while (ctx->ledgers) ipcref__ledger_destroy(ctx, ctx->ledgers);
  while (ctx->segments) ipcref__segment_destroy(ctx, ctx->segments);
  while (ctx->maps) ipcref__map_evict(ctx, ctx->maps);
  while (ctx->maps_retired) ipcref__map_evict(ctx, ctx->maps_retired);
  IPCREF_FREE(ctx->map_index);
  ctx->map_index = NULL;
  ctx->map_buckets = 0;
  IPCREF__UNLOCK(ctx);
  while ((pool = ctx->pools) != NULL) {
    ctx->pools = pool->next;
    IPCREF_FREE(pool);
  }
  while (ctx->hdr_chunks) {
    ipcref__hdr_chunk *c = ctx->hdr_chunks;
    ctx->hdr_chunks = c->next;
    IPCREF_FREE(c);
  }
  pthread_mutex_destroy(&ctx->hdr_lock);
  close(ctx->epfd);
  if (ctx->bell_rx >= 0) close(ctx->bell_rx);
  if (ctx->bell_tx >= 0) close(ctx->bell_tx);
  IPCREF_FREE(ctx->uids);
  while (ctx->dead_peers) {
    ipcref_peer *p = ctx->dead_peers;
    ctx->dead_peers = p->next;
    IPCREF_FREE(p);
  }
#ifdef IPCREF_CHECKED
  ctx->magic = IPCREF__DEAD; /* kept a while: see checked */
  ipcref__bury(ctx, sizeof *ctx, sizeof ctx->magic, ipcref__free_plain, NULL);
#else
  IPCREF_FREE(ctx);
#endif
}

/* Drops one reference to the context (release ordering, then acquire
 * before the teardown, as for buffers). */
IPCREF__PRIVATE void ipcref__ctx_unref(ipcref_ctx *ctx) {
  if (__atomic_fetch_sub(&ctx->refs, 1, __ATOMIC_RELEASE) != 1) return;
  IPCREF__ACQUIRE_FENCE(&ctx->refs);
  ipcref__ctx_destroy(ctx);
}

/* Device releases whose fence is done move to ctx->finished, returned
 * after the unlock (under the lock). */
IPCREF__PRIVATE void ipcref__deferred_poll(ipcref_ctx *ctx) {
  struct ipcref__import **pp = &ctx->deferred;
  while (*pp) {
    struct ipcref__import *imp = *pp;
    if (!imp->seg->be->fence_done(imp->seg->be, imp->fence)) {
      pp = &imp->next;
      continue;
    }
    *pp = imp->next;
    ctx->st.deferred--;
    imp->next = ctx->finished;
    ctx->finished = imp;
  }
}

IPCREF_API void ipcref_ctx_free(ipcref_ctx *ctx) {
  int pending;
  if (!ctx || !IPCREF__CTX_USABLE(ctx)) return;
  /* Device releases still waiting for their stream: wait for them now,
   * since nothing will poll this context any more. */
  __atomic_store_n(&ctx->owner_gone, 1, __ATOMIC_RELEASE);
  for (;;) {
    IPCREF__LOCK(ctx);
    if (ctx->deferred) ipcref__deferred_poll(ctx);
    pending = ctx->deferred != NULL;
    IPCREF__UNLOCK(ctx);
    if (!pending) break;
    usleep(100);
  }
  while (ctx->peers) ipcref_peer_free(ctx->peers);
  ipcref__ctx_unref(ctx);
}

/* 1 when the process has exited: its pidfd is readable or, without one,
 * its pid no longer exists. */
IPCREF__PRIVATE int ipcref__process_gone(int pidfd, int pid) {
  struct pollfd pfd;
  if (pidfd < 0) return pid > 0 && ipcref__pid_gone(pid);
  pfd.fd = pidfd;
  pfd.events = POLLIN;
  pfd.revents = 0;
  return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP)) != 0;
}

/* 1 when another peer here than `p` comes from the context `nonce`
 * names (its hello read). */
IPCREF__PRIVATE int ipcref__origin_here(const ipcref_ctx *ctx,
                                        const ipcref_peer *p, uint64_t nonce) {
  const ipcref_peer *q;
  for (q = ctx->peers; q; q = q->next)
    if (q != p && __atomic_load_n(&q->hello, __ATOMIC_ACQUIRE) > 0 &&
        q->nonce == nonce)
      return 1;
  return 0;
}

/* When the peer `p` is freed (under the lock), the mappings it leaves with
 * nobody to name them are retired, to go once nothing uses them: those of
 * its context's segments and ledgers, and those it brought of another's
 * (it forwarded them). A producer that lives on never tells a freed peer
 * what it destroys, so they would otherwise live as long as this context;
 * another connection from the same context sends its fds anew. A mapping
 * stays while a peer that may still name it lives: one from its origin,
 * or another peer that brought it (a forwarder, which will not send its
 * fds again). Not before the peer is freed (messages it sent may still be
 * queued). 1 if it retired any. */
IPCREF__PRIVATE int ipcref__retire_origin(ipcref_ctx *ctx, ipcref_peer *p) {
  ipcref__map *m, *next;
  int any = 0;
  if (p->origin_retired || p->hello <= 0) return 0;
  p->origin_retired = 1;
  for (m = ctx->maps; m; m = next) {
    next = m->next;
    if ((m->via ? m->via != p : m->origin_nonce != p->nonce) ||
        ipcref__origin_here(ctx, p, m->origin_nonce))
      continue;
    ipcref__map_retire(ctx, m);
    any = 1;
  }
  return any;
}

/* Reclaims what dead processes held (under the lock): every lease a dead
 * consumer held itself, and each forwarded lease whose own holder is gone.
 * A forwarded hold whose holder lives stays, whatever became of the
 * middleman; and the forwarding slots they claimed but never linked
 * (ipcref__forwards_lost). Then the sweep frees the blocks only they
 * kept, and the ledgers nobody can use any more. Returns the bytes freed. */
IPCREF__PRIVATE size_t ipcref__reap(ipcref_ctx *ctx) {
  ipcref__ledger *l;
  size_t freed = 0;
  int deaths = ctx->reaped != ctx->st.peer_deaths;
  ctx->reaped = ctx->st.peer_deaths;
  /* Every ring first, before any lease of the dead goes. A dead forwarder
   * wrote its links into the ring of the ledger it received through, not
   * into its own: its holders' leases must be known before its own lease,
   * their parent, ends. A hole left before this death may be the dead
   * one's: it is not waited for (its forwards are adopted instead). */
  for (l = ctx->ledgers; l; l = l->next) {
    if (deaths)
      l->death_head = __atomic_load_n(
          &((ipcref__ledger_hdr *)(void *)l->base)->head, __ATOMIC_ACQUIRE);
    freed += ipcref__ledger_drain(ctx, l);
  }
  for (l = ctx->ledgers; l; l = l->next) {
    uint32_t s;
    if (l->live == 0) continue;
    if (!l->holder_dead && l->holder > 0 &&
        (l->watch ? l->watch->dead : ipcref__pid_gone(l->holder))) {
      for (s = 0; s < l->n / 2; s++) ipcref__lease_reclaim(ctx, l, s, &freed);
      l->holder_dead = 1;
    }
    for (s = l->n / 2; s < l->n && l->live; s++) {
      ipcref__lease *ls = &l->leases[s];
      if (ls->block &&
          (ls->watch ? ls->watch->dead : ipcref__pid_gone(ls->holder)))
        ipcref__lease_reclaim(ctx, l, s, &freed);
    }
  }
  /* Then the forwarding slots that claimers now dead left unlinked. */
  for (l = ctx->ledgers; l; l = l->next)
    if (l->peer || l->live) ipcref__forwards_lost(l);
  return freed + ipcref__sweep(ctx);
}

/* Reads what came back and notices deaths, reclaiming what the dead held
 * (under the lock). Every call on the context pumps this, at most once per
 * clock tick (`force`: now), so that a process that never polls or lets
 * go of a buffer still gets its memory back, and hears of the leases its
 * consumers refused (ipcref__lease_refused) before its next sends: the
 * ledgers and the pidfds each time, the watches without one every
 * IPCREF__POLL_MS. */
IPCREF__PRIVATE size_t ipcref__pump(ipcref_ctx *ctx, int force) {
  long tick;
  size_t freed;
  if (ctx->deferred) ipcref__deferred_poll(ctx);
  if (!ctx->watches) return 0;
  tick = ipcref__now_ms();
  if (!force && tick == ctx->pump_tick) return 0;
  ctx->pump_tick = tick;
  freed = ipcref__sweep(ctx);
  (void)ipcref__watch_events(ctx);
  if (force || tick - ctx->poll_tick >= IPCREF__POLL_MS) {
    ctx->poll_tick = tick;
    ipcref__watch_poll(ctx);
  }
  return freed + (ctx->st.peer_deaths != ctx->reaped ? ipcref__reap(ctx) : 0);
}

IPCREF_API size_t ipcref_collect(ipcref_ctx *ctx) {
  size_t freed;
  if (!ctx || !IPCREF__CTX_USABLE(ctx)) return 0;
  IPCREF__LOCK(ctx);
  if (ctx->deferred) ipcref__deferred_poll(ctx); /* returned at the unlock */
  /* The rings first: a link read off one may name a holder not watched
   * yet, whose death the refresh must then see (without pidfds, it is
   * seen only there, by kill(pid, 0)); then the reap. */
  freed = ipcref__sweep(ctx);
  ipcref__watch_refresh(ctx);
  freed += ipcref__reap(ctx);
  ipcref__maps_trim(ctx, 0); /* a consumer's retired mappings */
  IPCREF__UNLOCK(ctx);
  return freed;
}

IPCREF_API size_t ipcref_ctx_trim(ipcref_ctx *ctx, size_t keep_bytes) {
  size_t freed;
  if (!ctx || !IPCREF__CTX_USABLE(ctx)) return 0;
  IPCREF__LOCK(ctx);
  ipcref__sweep(ctx); /* what came back empties more segments */
  freed = ipcref__cache_trim(ctx, keep_bytes);
  ipcref__maps_trim(ctx, 0);
  IPCREF__UNLOCK(ctx);
  return freed;
}

/* Milliseconds from `now` to `due` (0 when past), as the nearer of it
 * and *best (-1: none yet). */
IPCREF__PRIVATE void ipcref__sooner(int *best, long now, long due) {
  long ms = due > now ? due - now : 0;
  if (ms > INT_MAX) ms = INT_MAX;
  if (*best < 0 || ms < *best) *best = (int)ms;
}

IPCREF_API int ipcref_ctx_timeout(ipcref_ctx *ctx) {
  ipcref__ledger *l;
  ipcref_peer *p;
  long now = ipcref__now_ms();
  int best = -1;
  if (!ctx || !IPCREF__CTX_USABLE(ctx)) return -1;
  IPCREF__LOCK(ctx);
  ipcref__sweep(ctx); /* what is due is seen from the rings' tails */
  for (l = ctx->ledgers; l; l = l->next) { /* a hole, stepped over later */
    long due;
    if (ipcref__hole_due(l, now, &due)) ipcref__sooner(&best, now, due);
  }
  if (ctx->deferred) /* device work to check on */
    ipcref__sooner(&best, now, now + 1);
  if (ctx->room_armed) /* waits for room: a look now and then */
    ipcref__sooner(&best, now, now + IPCREF__ROOM_MS);
  if (ipcref__watch_polled(ctx)) /* deaths that no pidfd will tell */
    ipcref__sooner(&best, now, ctx->poll_tick + IPCREF__POLL_MS);
  for (p = ctx->peers; p; p = p->next) { /* a hello awaited (atomic: the
                                            peer's thread sets them) */
    long since = __atomic_load_n(&p->hello_since, __ATOMIC_RELAXED);
    if (since && !__atomic_load_n(&p->hello, __ATOMIC_RELAXED))
      ipcref__sooner(&best, now, since + p->opt.hello_timeout_ms);
  }
  IPCREF__UNLOCK(ctx);
  return best;
}

IPCREF_API int ipcref_ctx_poll_fd(ipcref_ctx *ctx) {
  return ctx && IPCREF__CTX_USABLE(ctx) ? ctx->epfd : -1;
}

/* share_socket's: waits for fd within a deadline that signals do not
 * start over. */
IPCREF__PRIVATE ipcref_result ipcref__wait_readable(int fd, int timeout_ms,
                                                    struct timespec *end,
                                                    int *dated);

IPCREF_API ipcref_result ipcref_ctx_poll(ipcref_ctx *ctx, int timeout_ms,
                                         size_t *freed) {
  struct timespec end;
  int reaped, dated = 0;
  size_t bytes;
  if (freed) *freed = 0;
  if (!ctx) return ipcref__invalid(__func__, "ctx is NULL");
  if (timeout_ms < -1) return ipcref__invalid(__func__, "timeout_ms below -1");
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  /* The wait is outside the lock; what woke it is read under it. */
  if (timeout_ms != 0 &&
      ipcref__wait_readable(ctx->epfd, timeout_ms, &end, &dated) == IPCREF_ESYS)
    return IPCREF_ESYS;
  IPCREF__LOCK(ctx);
  ipcref__watch_refresh(ctx);
  reaped = ctx->st.peer_deaths != ctx->reaped;
  bytes = reaped ? ipcref__reap(ctx) : 0;
  IPCREF__UNLOCK(ctx);
  if (freed) *freed = bytes;
  return reaped ? IPCREF_OK : IPCREF_ETIMEDOUT;
}

/* Imported buffers alive here (under the lock): each holds its segment's
 * mapping (refs), so they are the sum of those, counted when asked rather
 * than on every import and release. */
IPCREF__PRIVATE size_t ipcref__imports_alive(const ipcref_ctx *ctx) {
  const ipcref__map *lists[2], *m;
  size_t n = 0;
  int i;
  lists[0] = ctx->maps;
  lists[1] = ctx->maps_retired;
  for (i = 0; i < 2; i++)
    for (m = lists[i]; m; m = m->next)
      if (m->kind != IPCREF__KIND_LEDGER)
        n += (size_t)__atomic_load_n(&m->refs, __ATOMIC_ACQUIRE);
  return n;
}

IPCREF_API ipcref_result ipcref_ctx_stats(ipcref_ctx *ctx, ipcref_stats *out) {
  if (!ctx || !out) return ipcref__invalid(__func__, "ctx or out is NULL");
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  IPCREF__LOCK(ctx);
  ipcref__sweep(ctx);         /* count what came back as back */
  (void)ipcref__pump(ctx, 1); /* and what the dead held as free */
  *out = ctx->st;
  out->refused = __atomic_load_n(&ctx->refused, __ATOMIC_RELAXED);
  out->imported_bufs = ipcref__imports_alive(ctx);
  IPCREF__UNLOCK(ctx);
  return IPCREF_OK;
}

#endif /* IPCREF__SHARING_IMPL */
