/* share_socket: the peer's socket at its lowest: deadlines that a signal
 * or an empty read does not start over, waits for readability, recvmsg
 * with its fds (none ever leaks), and records read in pieces from a stream
 * socket. Owns no lock: a peer's socket is read by one thread at a time
 * (the peer's), and these touch nothing of its context. */

#ifdef IPCREF__SHARING_IMPL

/* ---- deadlines -------------------------------------------------------------
 * A call that may wait more than once (a receive, a send, a hello) sets
 * its deadline at its first wait, and every wait after it has only what is
 * left: neither a signal (EINTR) nor a read that found nothing starts the
 * timeout over. */

/* *end = now + ms (CLOCK_MONOTONIC). */
IPCREF__PRIVATE void ipcref__deadline_ms(struct timespec *end, int ms) {
  clock_gettime(CLOCK_MONOTONIC, end);
  end->tv_sec += ms / 1000;
  end->tv_nsec += (long)(ms % 1000) * 1000000;
  if (end->tv_nsec >= 1000000000) end->tv_sec++, end->tv_nsec -= 1000000000;
}

/* Milliseconds left until `end` (CLOCK_MONOTONIC); -1 waits forever. */
IPCREF__PRIVATE int ipcref__ms_left(int timeout_ms,
                                    const struct timespec *end) {
  struct timespec now;
  long left;
  if (timeout_ms <= 0) return timeout_ms;
  clock_gettime(CLOCK_MONOTONIC, &now);
  /* Rounded up: a wait never ends before its deadline. */
  left = (long)(end->tv_sec - now.tv_sec) * 1000 +
         ((long)(end->tv_nsec - now.tv_nsec) + 999999) / 1000000;
  return left > 0 ? (int)left : 0;
}

/* Milliseconds left of a receive's timeout_ms (-1: forever), its deadline
 * *end set at the first call (*dated): a receive that finds a record
 * waiting reads no clock. */
IPCREF__PRIVATE int ipcref__ms_until(int timeout_ms, struct timespec *end,
                                     int *dated) {
  if (timeout_ms <= 0) return timeout_ms;
  if (*dated) return ipcref__ms_left(timeout_ms, end);
  ipcref__deadline_ms(end, timeout_ms);
  *dated = 1;
  return timeout_ms;
}

/* ---- waiting and reading ----------------------------------------------- */

/* Waits until fd is readable, within timeout_ms (-1: forever, 0: polls) of
 * a deadline *end that the first call sets (*dated 0; see
 * ipcref__ms_until). A caller whose read then finds nothing (EAGAIN: a
 * non-blocking socket, another reader was first) calls again with the same
 * *end: neither that nor a signal (EINTR) starts the timeout over, so a
 * steady stream of signals cannot hold a call past it. */
IPCREF__PRIVATE ipcref_result ipcref__wait_readable(int fd, int timeout_ms,
                                                    struct timespec *end,
                                                    int *dated) {
  struct pollfd pfd;
  pfd.fd = fd;
  pfd.events = POLLIN;
  for (;;) {
    int pr;
    pfd.revents = 0;
    pr = poll(&pfd, 1, ipcref__ms_until(timeout_ms, end, dated));
    if (pr > 0) return IPCREF_OK;
    if (pr == 0) return IPCREF_ETIMEDOUT;
    if (errno != EINTR) return IPCREF_ESYS;
  }
}

/* After a read that found nothing though fd polled readable (EAGAIN: a
 * non-blocking socket whose data another reader took): waits again for
 * what is left of the time; ETIMEDOUT when nothing is (a poll, timeout_ms
 * 0, looks once). */
IPCREF__PRIVATE ipcref_result ipcref__wait_again(int fd, int timeout_ms,
                                                 struct timespec *end,
                                                 int *dated) {
  if (ipcref__ms_until(timeout_ms, end, dated) == 0) return IPCREF_ETIMEDOUT;
  return ipcref__wait_readable(fd, timeout_ms, end, dated);
}

/* 1 when `fd` is non-blocking (O_NONBLOCK): a call that would wait says
 * EAGAIN instead. */
IPCREF__PRIVATE int ipcref__nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl >= 0 && (fl & O_NONBLOCK) != 0;
}

/* Appends the fds an SCM_RIGHTS header carries to fds[*n] (up to max);
 * closes the ones past max, so that no received fd ever leaks. */
IPCREF__PRIVATE void ipcref__take_fds(const struct cmsghdr *c, int *fds, int *n,
                                      int max) {
  int cnt = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int)), j, fd;
  for (j = 0; j < cnt; j++) {
    memcpy(&fd, CMSG_DATA(c) + (size_t)j * sizeof(int), sizeof fd);
    if (*n < max)
      fds[(*n)++] = fd;
    else
      close(fd);
  }
}

/* recvmsg, retried on EINTR and once on ECONNRESET: a peer that closed its
 * end with our data unread resets the connection, but what it sent before
 * is still queued here, and the retry reads it. */
IPCREF__PRIVATE ssize_t ipcref__recvmsg(int fd, struct msghdr *mh) {
  int resets = 0;
  ssize_t k;
  for (;;) {
    k = recvmsg(fd, mh, MSG_CMSG_CLOEXEC);
    if (k >= 0 || (errno != EINTR && (errno != ECONNRESET || resets++)))
      return k;
  }
}

/* ---- records on a stream socket -------------------------------------------
 * A record is its 4-byte length and that many bytes, and may come in
 * pieces (a sender that stops halfway, a large record). The pieces so far
 * wait in the peer with the fds and credentials that came with them, so a
 * receive waits no longer than its timeout for the rest (0: not at all),
 * and the next call goes on where it stopped. */

/* Room for the control data one message may bring: the sender's
 * credentials (SO_PASSCRED, see ipcref__peer_make, adds them to every
 * message) besides the most fds. */
typedef union ipcref__cmsg_room {
  char buf[CMSG_SPACE(sizeof(struct ucred)) +
           CMSG_SPACE(sizeof(int) * IPCREF_MSG_MAX_FDS)];
  struct cmsghdr align;
} ipcref__cmsg_room;

/* Sets up *mh for one buffer of `n` bytes at `b` (through *iov), read
 * into or sent from, with `ctl_len` bytes of control data (fds,
 * credentials) at `ctl`. */
IPCREF__PRIVATE void ipcref__msghdr_one(struct msghdr *mh, struct iovec *iov,
                                        void *b, size_t n, void *ctl,
                                        size_t ctl_len) {
  memset(mh, 0, sizeof *mh);
  iov->iov_base = b;
  iov->iov_len = n;
  mh->msg_iov = iov;
  mh->msg_iovlen = 1;
  mh->msg_control = ctl;
  mh->msg_controllen = ctl_len;
}

/* One piece (without waiting): up to `n` bytes into `to`, their fds
 * (p->in_fds) and credentials (p->in_pid, in_uid). >0: bytes read; 0: hung
 * up; -1: errno. */
IPCREF__PRIVATE ssize_t ipcref__stream_piece(ipcref_peer *p, unsigned char *to,
                                             size_t n) {
  ipcref__cmsg_room u;
  struct msghdr mh;
  struct iovec iov;
  struct cmsghdr *c;
  ssize_t k;
  ipcref__msghdr_one(&mh, &iov, to, n, u.buf, sizeof u.buf);
  k = recvmsg(p->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  for (c = k >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    if (c->cmsg_type == SCM_RIGHTS) {
      ipcref__take_fds(c, p->in_fds, &p->in_nfds, IPCREF_MSG_MAX_FDS);
    } else if (c->cmsg_type == SCM_CREDENTIALS &&
               c->cmsg_len == CMSG_LEN(sizeof(struct ucred))) {
      struct ucred cred;
      memcpy(&cred, CMSG_DATA(c), sizeof cred);
      p->in_pid = (int)cred.pid;
      p->in_uid = (int)cred.uid;
    }
  }
  return k;
}

/* Reads on until p->in holds a whole record of at most `max` bytes, within
 * timeout_ms (-1: forever). ETIMEDOUT keeps what came for the next call;
 * EPROTO (too long) and EPEER leave the stream unusable. */
IPCREF__PRIVATE ipcref_result ipcref__stream_fill(ipcref_peer *p, size_t max,
                                                  int timeout_ms) {
  struct timespec end;
  int resets = 0;
  ipcref__deadline_ms(&end, timeout_ms);
  if (!p->in && !(p->in = (unsigned char *)IPCREF_MALLOC(
                      4 + (size_t)IPCREF_MSG_MAX_BYTES)))
    return IPCREF_ENOMEM;
  for (;;) {
    size_t need = 4;
    ssize_t k;
    if (p->in_len >= 4) {
      ipcref__wire w;
      ipcref__wire_init(&w, p->in, 4);
      need = (size_t)ipcref__wire_get(&w, 4);
      if (need > max) {
        ipcref__ctx_report(p->ctx, IPCREF_EPROTO,
                           "a record longer than any message (stream cut)");
        return IPCREF_EPROTO;
      }
      need += 4;
      if (p->in_len == need) return IPCREF_OK;
    }
    k = ipcref__stream_piece(p, p->in + p->in_len, need - p->in_len);
    if (k > 0) {
      p->in_len += (size_t)k;
    } else if (k == 0) {
      return IPCREF_EPEER;
    } else if (errno == ECONNRESET) {
      /* Read on once: what it sent before it reset is still queued here. */
      if (resets++) return IPCREF_EPEER;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      struct pollfd pfd;
      int pr;
      pfd.fd = p->fd;
      pfd.events = POLLIN;
      pfd.revents = 0;
      pr = poll(&pfd, 1, ipcref__ms_left(timeout_ms, &end));
      if (pr == 0) return IPCREF_ETIMEDOUT;
      if (pr < 0 && errno != EINTR) return IPCREF_ESYS;
    } else if (errno != EINTR) {
      return IPCREF_ESYS;
    }
  }
}

/* The record p->in held is taken (its fds by the caller, or closed with
 * `close_fds`): the next one starts. */
IPCREF__PRIVATE void ipcref__stream_next(ipcref_peer *p, int close_fds) {
  int i;
  if (close_fds)
    for (i = 0; i < p->in_nfds; i++) close(p->in_fds[i]);
  p->in_nfds = 0;
  p->in_len = 0;
}

#endif /* IPCREF__SHARING_IMPL */
