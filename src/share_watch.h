/* share_watch: the processes a context deals with. Knowing when one dies:
 * one watch per live pid, its pidfd in the context's epoll set
 * (ipcref_ctx_poll_fd), or kill(pid, 0) where there is no pidfd_open;
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
 * epoll set: ipcref__watch_events), or, where there is no pidfd, by
 * kill(pid, 0) in ipcref_collect. Whatever notices one counts it in
 * st.peer_deaths; the reap that follows compares that with ctx->reaped. */

/* Marks a watched process dead (once), counted in st.peer_deaths; its
 * pidfd leaves the epoll set. */
IPCREF__PRIVATE void ipcref__watch_dead(ipcref_ctx *ctx, ipcref__watch *w) {
  if (w->dead) return;
  /* Atomic: a sender checks it without the lock (ipcref__chan_gone). */
  __atomic_store_n(&w->dead, 1, __ATOMIC_RELAXED);
  ctx->st.peer_deaths++;
  if (w->pidfd >= 0) {
    (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, w->pidfd, NULL);
    close(w->pidfd);
    w->pidfd = -1;
  }
}

/* The watch on process `pid` (a new one, or one more use of the live
 * one); NULL for pid <= 0 or out of memory (then the caller falls back on
 * the pid). A process already gone is dead from the start. */
IPCREF__PRIVATE ipcref__watch *ipcref__watch_get(ipcref_ctx *ctx, int pid) {
  ipcref__watch *w;
  if (pid <= 0) return NULL;
  for (w = ctx->watches; w; w = w->next)
    if (w->pid == pid && !w->dead) {
      w->refs++;
      return w;
    }
  w = (ipcref__watch *)ipcref__zalloc(sizeof *w);
  if (!w) return NULL;
  w->pid = pid;
  w->pidfd = -1;
  w->refs = 1;
  IPCREF__LIST_PUSH(ctx->watches, w, next, prev);
#ifdef SYS_pidfd_open
  if (!ctx->no_pidfd) { /* Linux 5.3; the fd is close-on-exec */
    w->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (w->pidfd >= 0) {
      struct epoll_event ev;
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
  }
#endif
  return w;
}

/* One use of a watch less; the last one removes it. */
IPCREF__PRIVATE void ipcref__watch_put(ipcref_ctx *ctx, ipcref__watch *w) {
  if (!w || --w->refs > 0) return;
  if (w->pidfd >= 0) {
    (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, w->pidfd, NULL);
    close(w->pidfd);
  }
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

/* Every check there is: the epoll set, then kill(pid, 0) for the watches
 * without a pidfd. */
IPCREF__PRIVATE void ipcref__watch_refresh(ipcref_ctx *ctx) {
  ipcref__watch *w;
  (void)ipcref__watch_events(ctx);
  for (w = ctx->watches; w; w = w->next)
    if (!w->dead && w->pidfd < 0 && ipcref__pid_gone(w->pid))
      ipcref__watch_dead(ctx, w);
}

#endif /* IPCREF__SHARING_IMPL */
