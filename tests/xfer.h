/* An own transport for ipcref_export / ipcref_import, for the tests that
 * carry messages themselves (tests/share_fixture.h, test_share_threads.c):
 * a message's bytes and fds in one SOCK_SEQPACKET packet. Include after
 * ipcref.h. */
#ifndef IPCREF_TEST_XFER_H
#define IPCREF_TEST_XFER_H

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

/* Sends a message: 0, or -1 when the packet did not go whole. */
static __attribute__((unused)) int xfer_send(int fd, const ipcref_msg *m) {
  struct msghdr mh;
  struct iovec iov;
  union {
    char buf[CMSG_SPACE(sizeof(int) * IPCREF_MSG_MAX_FDS)];
    struct cmsghdr align;
  } u;
  ssize_t k;
  memset(&mh, 0, sizeof mh);
  memset(&u, 0, sizeof u);
  iov.iov_base = (void *)(uintptr_t)m->bytes;
  iov.iov_len = m->len;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (m->nfds > 0) {
    struct cmsghdr *c;
    mh.msg_control = u.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)m->nfds);
    c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)m->nfds);
    memcpy(CMSG_DATA(c), m->fds, sizeof(int) * (size_t)m->nfds);
  }
  do k = sendmsg(fd, &mh, MSG_NOSIGNAL);
  while (k < 0 && errno == EINTR);
  return k == (ssize_t)m->len ? 0 : -1;
}

/* The next message into m (its fds are the caller's); -1 on EOF, after
 * timeout_ms, or for more fds than a message holds. */
static __attribute__((unused)) int xfer_recv(int fd, ipcref_msg *m,
                                             int timeout_ms) {
  struct msghdr mh;
  struct iovec iov;
  struct cmsghdr *c;
  struct pollfd pf;
  ssize_t r;
  union {
    char buf[CMSG_SPACE(sizeof(int) * IPCREF_MSG_MAX_FDS)];
    struct cmsghdr align;
  } u;
  memset(m, 0, sizeof *m);
  memset(&mh, 0, sizeof mh);
  pf.fd = fd;
  pf.events = POLLIN;
  pf.revents = 0;
  do r = poll(&pf, 1, timeout_ms);
  while (r < 0 && errno == EINTR);
  if (r != 1) return -1;
  iov.iov_base = m->bytes;
  iov.iov_len = sizeof m->bytes;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = u.buf;
  mh.msg_controllen = sizeof u.buf;
  do r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  if (r <= 0) return -1;
  m->len = (size_t)r;
  for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      if (m->nfds + n > IPCREF_MSG_MAX_FDS) return -1;
      memcpy(m->fds + m->nfds, CMSG_DATA(c), sizeof(int) * (size_t)n);
      m->nfds += n;
    }
  return 0;
}

#endif
