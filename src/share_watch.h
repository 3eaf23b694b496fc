/* share_watch: the processes a context deals with. Knowing when one dies:
 * one watch per live pid, its pidfd in the context's epoll set
 * (ipcref_ctx_poll_fd), or kill(pid, 0) where it has none (no pidfd_open
 * here, or a holder named beyond IPCREF__NAMED_PIDFDS);
 * whatever notices a death counts it in st.peer_deaths, and share_ctx's
 * reap acts on it (under ctx->lock). And knowing a forked child from the
 * process that made a context (the fork generation: atomic, no lock). */

#ifdef IPCREF__SHARING_IMPL
/* ---- fork ----------------------------------------------------------------
 * A child made by fork() gets a copy of its parent's contexts, peers and
 * buffers, but their shared parts (ledgers, segments, sockets) are still
 * the parent's: a child that used them would take the ledger slots the
 * parent takes, return leases the parent holds and write into the
 * parent's sockets. So a context remembers the fork generation it was made
 * in, a pthread_atfork handler moves the generation on in each child, and
 * there calls on the parent's contexts and peers are refused, and the
 * release of a buffer made or received through them touches nothing
 * shared (the child's copy is simply left). */
static unsigned ipcref__fork_gen; /* atomic */
static pthread_once_t ipcref__fork_once_gen = PTHREAD_ONCE_INIT;
IPCREF__PRIVATE void ipcref__fork_gen_next(void) {
  __atomic_add_fetch(&ipcref__fork_gen, 1u, __ATOMIC_RELAXED);
}
IPCREF__PRIVATE void ipcref__fork_gen_watch(void) {
  (void)pthread_atfork(NULL, NULL, ipcref__fork_gen_next);
}
/* The generation a new context is made in (the handler set up first). */
IPCREF__PRIVATE unsigned ipcref__fork_gen_now(void) {
  (void)pthread_once(&ipcref__fork_once_gen, ipcref__fork_gen_watch);
  return __atomic_load_n(&ipcref__fork_gen, __ATOMIC_RELAXED);
}
/* 1 in a child forked after `ctx` was made. */
IPCREF__PRIVATE int ipcref__forked(const ipcref_ctx *ctx) {
  return ctx->fork_gen != __atomic_load_n(&ipcref__fork_gen, __ATOMIC_RELAXED);
}
/* 1 when `ctx` is this process's own; else the call is reported. */
IPCREF__PRIVATE int ipcref__own(const ipcref_ctx *ctx, const char *fn) {
  if (!ipcref__forked(ctx)) return 1;
  ipcref__report_in(IPCREF_EDEAD, fn,
                    "the context is the parent's: a child made by fork() "
                    "makes a context of its own");
  return 0;
}

/* ---- watching processes -------------------------------------------------
 * Under the lock. A death is noticed by the pidfd turning readable (the
 * epoll set: ipcref__watch_events), or, for a watch without a pidfd, by
 * kill(pid, 0) (ipcref__watch_poll: in ipcref_collect and ipcref_ctx_poll,
 * and every IPCREF__POLL_MS in the pump that the calls make). Whatever
 * notices one counts it in st.peer_deaths; the reap that follows compares
 * that with ctx->reaped.
 *
 * A peer's pid comes from the kernel (its credentials), but the holder of
 * a forwarded lease is only named, by the forwarder, in shared memory: a
 * hostile consumer could name every process on the machine, one per
 * forwarding slot. So at most IPCREF__NAMED_PIDFDS named holders have a
 * pidfd at a time, and the rest are watched by pid: a consumer cannot use
 * up the producer's file descriptors. */
#define IPCREF__NAMED_PIDFDS 64
#define IPCREF__POLL_MS      100 /* between the pump's kill(pid, 0) rounds */

/* Closes w's pidfd, if any, taking it out of the epoll set. */
IPCREF__PRIVATE void ipcref__watch_close(ipcref_ctx *ctx, ipcref__watch *w) {
  if (w->pidfd < 0) return;
  (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, w->pidfd, NULL);
  close(w->pidfd);
  w->pidfd = -1;
  ctx->named_pidfds -= w->named;
  w->named = 0;
}

/* Marks a watched process dead (once), counted in st.peer_deaths; its
 * pidfd leaves the epoll set. */
IPCREF__PRIVATE void ipcref__watch_dead(ipcref_ctx *ctx, ipcref__watch *w) {
  if (w->dead) return;
  /* Atomic: a sender checks it without the lock (ipcref__chan_gone). */
  __atomic_store_n(&w->dead, 1, __ATOMIC_RELAXED);
  ctx->st.peer_deaths++;
  ipcref__watch_close(ctx, w);
}

/* Gives w a pidfd in the epoll set, unless there is no pidfd_open here or
 * (`named`) the named holders have all the pidfds they may: then w is
 * watched by pid. A process already gone is dead from the start. */
IPCREF__PRIVATE void ipcref__watch_open(ipcref_ctx *ctx, ipcref__watch *w,
                                        int named) {
#ifdef SYS_pidfd_open
  if (ctx->no_pidfd || (named && ctx->named_pidfds >= IPCREF__NAMED_PIDFDS))
    return;
  w->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)w->pid, 0); /* 5.3, CLOEXEC */
  if (w->pidfd >= 0) {
    struct epoll_event ev;
    w->named = named;
    ctx->named_pidfds += named;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.ptr = w;
    /* Without the epoll entry the death is still seen by collect. */
    (void)epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, w->pidfd, &ev);
  } else if (errno == ESRCH) {
    ipcref__watch_dead(ctx, w);
  } else if (errno == ENOSYS) {
    ctx->no_pidfd = 1;
  }
#else
  (void)ctx;
  (void)w;
  (void)named;
#endif
}

/* The watch on process `pid` (a new one, or one more use of the live
 * one); NULL for pid <= 0 or out of memory (then the caller falls back on
 * the pid). `named`: the pid was named by another process (a forwarded
 * lease's holder), not told by the kernel. A peer's watch that was made
 * for a named holder without a pidfd gets one now. */
IPCREF__PRIVATE ipcref__watch *ipcref__watch_get(ipcref_ctx *ctx, int pid,
                                                 int named) {
  ipcref__watch *w;
  if (pid <= 0) return NULL;
  for (w = ctx->watches; w; w = w->next)
    if (w->pid == pid && !w->dead) {
      w->refs++;
      if (!named && w->pidfd < 0) ipcref__watch_open(ctx, w, 0);
      return w;
    }
  w = (ipcref__watch *)ipcref__zalloc(sizeof *w);
  if (!w) return NULL;
  w->pid = pid;
  w->pidfd = -1;
  w->refs = 1;
  IPCREF__LIST_PUSH(ctx->watches, w, next, prev);
  ipcref__watch_open(ctx, w, named);
  return w;
}

/* One use of a watch less; the last one removes it. */
IPCREF__PRIVATE void ipcref__watch_put(ipcref_ctx *ctx, ipcref__watch *w) {
  if (!w || --w->refs > 0) return;
  ipcref__watch_close(ctx, w);
  IPCREF__LIST_REMOVE(ctx->watches, w, next, prev);
  IPCREF_FREE(w);
}

/* 1 when process `pid` is known to be gone: kill(pid, 0) finds none. */
IPCREF__PRIVATE int ipcref__pid_gone(int pid) {
  return pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
}

/* Marks the watches whose pidfd turned readable (the process exited, or
 * is a zombie). Returns how many. */
IPCREF__PRIVATE int ipcref__watch_events(ipcref_ctx *ctx) {
  struct epoll_event ev[16];
  int n, i, got = 0;
  do {
    n = epoll_wait(ctx->epfd, ev, 16, 0);
    for (i = 0; i < n; i++)
      ipcref__watch_dead(ctx, (ipcref__watch *)ev[i].data.ptr);
    if (n > 0) got += n;
  } while (n == 16);
  return got;
}

/* kill(pid, 0) for every live watch without a pidfd. */
IPCREF__PRIVATE void ipcref__watch_poll(ipcref_ctx *ctx) {
  ipcref__watch *w;
  for (w = ctx->watches; w; w = w->next)
    if (!w->dead && w->pidfd < 0 && ipcref__pid_gone(w->pid))
      ipcref__watch_dead(ctx, w);
}

/* 1 when a live watch has no pidfd: only kill(pid, 0) sees its death. */
IPCREF__PRIVATE int ipcref__watch_polled(const ipcref_ctx *ctx) {
  const ipcref__watch *w;
  for (w = ctx->watches; w; w = w->next)
    if (!w->dead && w->pidfd < 0) return 1;
  return 0;
}

/* Every check there is: the epoll set, then kill(pid, 0) for the watches
 * without a pidfd. */
IPCREF__PRIVATE void ipcref__watch_refresh(ipcref_ctx *ctx) {
  (void)ipcref__watch_events(ctx);
  ipcref__watch_poll(ctx);
}

#endif /* IPCREF__SHARING_IMPL */
