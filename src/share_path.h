/* share_path: peers by socket path. A producer listens on an AF_UNIX
 * SOCK_SEQPACKET socket at a filesystem path (whose directory's
 * permissions say who may connect) or in the abstract namespace ("@name"),
 * and accepts peers; a consumer connects by the same path. What a peer
 * checks (the uid policy, the hello) is ipcref_peer_new's. No lock: the
 * sockets are the caller's until a peer owns one. */

#if !defined(IPCREF_NO_SHARING)
#ifdef __cplusplus
extern "C" {
#endif

/* Peers by path. ipcref_listen makes a listening AF_UNIX SOCK_SEQPACKET
 * socket at `path` into *listen_fd (the caller's: poll it for readable,
 * close it, and unlink a filesystem path when done): a filesystem path,
 * whose directory's permissions say who may connect, or "@name" in the
 * abstract namespace. A socket file left by a listener that died is
 * replaced: to tell, ipcref_listen connects to it once (a listener that
 * lives there sees a connection that hangs up at once); anything else at
 * the path (a regular file, a directory, a symlink) is left alone (ESYS,
 * EADDRINUSE; the error hook says why). ipcref_accept takes one connection
 * on it within timeout_ms (-1: waits, 0: polls; a non-blocking listening
 * socket waits the same) as a new peer, non-blocking when the listening
 * socket is (EPEER: it hung up already, or its uid is not allowed; accept
 * the next); ipcref_connect connects to `path` and makes the peer. Each
 * checks the other side as ipcref_peer_new does (its uid against
 * allow_uids, its hello on first use). Errors: EINVAL (NULL, an empty path
 * or one too long for an AF_UNIX address, not a listening socket, a
 * timeout below -1), EPEER (nobody listens at `path`; a uid not allowed),
 * ETIMEDOUT (accept: nobody connected), ESYS (errno says why: EADDRINUSE
 * when a listener lives at `path`, or something not a socket is there),
 * ENOMEM, EDEAD. */
IPCREF_API ipcref_result ipcref_listen(ipcref_ctx *ctx, const char *path,
                                       int *listen_fd);
IPCREF_API ipcref_result ipcref_accept(ipcref_ctx *ctx, int listen_fd,
                                       int timeout_ms, ipcref_peer **out);
IPCREF_API ipcref_result ipcref_connect(ipcref_ctx *ctx, const char *path,
                                        ipcref_peer **out);

#ifdef __cplusplus
}
#endif
#endif /* !IPCREF_NO_SHARING */

/* @implementation */

#ifdef IPCREF__SHARING_IMPL

/* The address of `path`: "@name" is name in the abstract namespace (a
 * leading NUL), anything else a filesystem path. 0 when it does not fit
 * (or is empty). */
IPCREF__PRIVATE int ipcref__unix_addr(const char *path, struct sockaddr_un *a,
                                      socklen_t *len) {
  size_t n = path ? strlen(path) : 0;
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  if (n == 0 || (path[0] == '@' && n == 1) || n >= sizeof a->sun_path) return 0;
  memcpy(a->sun_path, path, n);
  if (path[0] == '@') a->sun_path[0] = '\0';
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  return 1;
}

/* Why ipcref__unix_addr refused `path`. */
IPCREF__PRIVATE const char *ipcref__path_why(const char *path) {
  return !path ? "path is NULL"
         : !path[0] || (path[0] == '@' && !path[1])
             ? "path is empty"
             : "path too long for an AF_UNIX address (107 bytes at most)";
}

/* A filesystem socket nobody listens on any more (its listener died): 1
 * when `path` is a socket file (lstat: not what a symlink names) and
 * connecting to it is refused, so it may be replaced. Anything else
 * stays: a live listener, and a regular file, a directory or a symlink,
 * which refuse connections too but are nobody's leftover. */
IPCREF__PRIVATE int ipcref__socket_stale(const char *path,
                                         const struct sockaddr_un *a,
                                         socklen_t len) {
  struct stat st;
  int fd, stale;
  if (lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  stale = connect(fd, (const struct sockaddr *)a, len) != 0 &&
          errno == ECONNREFUSED;
  close(fd);
  return stale;
}

/* Binds fd to `path`, replacing a dead listener's socket file once (see
 * ipcref__socket_stale). 0, or -1 with errno: EADDRINUSE when something
 * else is there (named to the hook when it is no socket at all). */
IPCREF__PRIVATE int ipcref__bind_path(ipcref_ctx *ctx, int fd, const char *path,
                                      const struct sockaddr_un *a,
                                      socklen_t len) {
  struct stat st;
  if (bind(fd, (const struct sockaddr *)a, len) == 0) return 0;
  if (errno != EADDRINUSE || path[0] == '@') return -1;
  if (ipcref__socket_stale(path, a, len))
    return unlink(path) != 0 ? -1 : bind(fd, (const struct sockaddr *)a, len);
  if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
    ipcref__ctx_report(ctx, IPCREF_ESYS,
                       "ipcref_listen: path is taken by a file that is not "
                       "a socket (left alone: EADDRINUSE)");
  errno = EADDRINUSE;
  return -1;
}

IPCREF_API ipcref_result ipcref_listen(ipcref_ctx *ctx, const char *path,
                                       int *listen_fd) {
  struct sockaddr_un a;
  socklen_t len = 0;
  int fd;
  if (!ctx || !listen_fd || !ipcref__unix_addr(path, &a, &len))
    return ipcref__invalid(__func__, !ctx || !listen_fd
                                         ? "ctx or listen_fd is NULL"
                                         : ipcref__path_why(path));
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno == ENOMEM ? IPCREF_ENOMEM : IPCREF_ESYS;
  if (ipcref__bind_path(ctx, fd, path, &a, len) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return IPCREF_ESYS;
  }
  if (listen(fd, 64) != 0) {
    int e = errno;
    close(fd);
    if (path[0] != '@') (void)unlink(path);
    errno = e;
    return IPCREF_ESYS;
  }
  *listen_fd = fd;
  return IPCREF_OK;
}

/* 1 when fd is a listening socket: an accept on anything else would wait
 * for nothing (-1) before it failed. */
IPCREF__PRIVATE int ipcref__listening(int fd) {
  int on = 0;
  socklen_t len = sizeof on;
  return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on;
}

/* accept4, retried on EINTR; a non-blocking listener's peers are
 * non-blocking too: an event loop's sends then never wait (see
 * ipcref_peer_options). */
IPCREF__PRIVATE int ipcref__accept_one(int listen_fd) {
  int fl = ipcref__nonblocking(listen_fd) ? SOCK_NONBLOCK : 0, fd;
  do fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | fl);
  while (fd < 0 && errno == EINTR);
  return fd;
}

IPCREF_API ipcref_result ipcref_accept(ipcref_ctx *ctx, int listen_fd,
                                       int timeout_ms, ipcref_peer **out) {
  struct timespec end;
  ipcref_result r;
  int fd = -1, dated = 0;
  if (!ctx || !out || listen_fd < 0)
    return ipcref__invalid(__func__, !ctx || !out ? "ctx or out is NULL"
                                                  : "listen_fd is negative");
  if (timeout_ms < -1) return ipcref__invalid(__func__, "timeout_ms below -1");
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  if (!ipcref__listening(listen_fd))
    return ipcref__invalid(__func__, "listen_fd is not a listening socket");
  /* Nobody after all though it polled readable (a non-blocking listener
   * another process accepted on first): wait again for what is left. */
  r = ipcref__wait_readable(listen_fd, timeout_ms, &end, &dated);
  while (r == IPCREF_OK && (fd = ipcref__accept_one(listen_fd)) < 0 &&
         (errno == EAGAIN || errno == EWOULDBLOCK))
    r = ipcref__wait_again(listen_fd, timeout_ms, &end, &dated);
  if (r != IPCREF_OK) return r;
  if (fd < 0 && (errno == EBADF || errno == ENOTSOCK || errno == EINVAL))
    return ipcref__invalid(__func__, "listen_fd is not a listening socket");
  if (fd < 0) return IPCREF_ESYS;
  r = ipcref_peer_new(ctx, fd, out);
  if (r != IPCREF_OK) close(fd); /* refused (a uid not allowed), say */
  return r;
}

IPCREF_API ipcref_result ipcref_connect(ipcref_ctx *ctx, const char *path,
                                        ipcref_peer **out) {
  struct sockaddr_un a;
  socklen_t len = 0;
  ipcref_result r;
  int fd, rc;
  if (!ctx || !out || !ipcref__unix_addr(path, &a, &len))
    return ipcref__invalid(__func__, !ctx || !out ? "ctx or out is NULL"
                                                  : ipcref__path_why(path));
  if (!IPCREF__CTX_USABLE(ctx)) return IPCREF_EDEAD;
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno == ENOMEM ? IPCREF_ENOMEM : IPCREF_ESYS;
  rc = connect(fd, (const struct sockaddr *)&a, len);
  if (rc != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return e == ENOENT || e == ECONNREFUSED ? IPCREF_EPEER : IPCREF_ESYS;
  }
  r = ipcref_peer_new(ctx, fd, out);
  if (r != IPCREF_OK) close(fd);
  return r;
}

#endif /* IPCREF__SHARING_IMPL */
