/* share_watch: knowing when a process dies. One watch per live pid, its
 * pidfd in the context's epoll set (ipcref_ctx_poll_fd), or kill(pid, 0)
 * where there is no pidfd_open. Whatever notices a death counts it in
 * st.peer_deaths; share_ctx's reap acts on it. Under ctx->lock. */

#ifdef IPCREF__SHARING_IMPL

/* ---- watching processes -------------------------------------------------
 * Under the lock. A death is noticed by the pidfd turning readable (the
 * epoll set: ipcref__watch_events), or, where there is no pidfd, by
 * kill(pid, 0) in ipcref_collect. Whatever notices one counts it in
 * st.peer_deaths; the reap that follows compares that with ctx->reaped. */

/* Marks a watched process dead (once), counted in st.peer_deaths; its
 * pidfd leaves the epoll set. */
IPCREF__PRIVATE void ipcref__watch_dead(ipcref_ctx *ctx, ipcref__watch *w) {
  if (w->dead) return;
  w->dead = 1;
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
