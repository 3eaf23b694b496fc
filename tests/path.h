/* The path the sharing tests run over (tests/test_share.c, test_crash.c,
 * test_hostile.c, test_share_threads.c, and everything that makes its
 * peers through tests/share_fixture.h or tests/proc.h): the same cases,
 * chosen by the environment.
 *
 *   IPCREF_TEST_PATH=channel   (the default) peers made with the
 *                              defaults: hand-offs go through the shared-
 *                              memory channel, fds on the socket
 *   IPCREF_TEST_PATH=socket    every peer the test makes with
 *                              ipcref_peer_new sends on its socket only
 *                              (ring_bytes IPCREF_KEEP_NONE)
 *
 * Include it after ipcref.h: it turns the test's ipcref_peer_new into
 * path_peer_new. */
#ifndef IPCREF_TEST_PATH_H
#define IPCREF_TEST_PATH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 when the tests run over the socket only; an unknown value exits 2. */
static int path_socket_only(void) {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("IPCREF_TEST_PATH");
    if (!e || !*e || !strcmp(e, "channel")) {
      v = 0;
    } else if (!strcmp(e, "socket")) {
      v = 1;
    } else {
      fprintf(stderr, "IPCREF_TEST_PATH=%s: say channel or socket\n", e);
      exit(2);
    }
  }
  return v;
}

/* ipcref_peer_new over the path the run chose. */
static __attribute__((unused)) ipcref_result
path_peer_new(ipcref_ctx *ctx, int fd, ipcref_peer **out) {
  ipcref_peer_options o;
  if (!path_socket_only()) return ipcref_peer_new(ctx, fd, out);
  memset(&o, 0, sizeof o);
  o.ring_bytes = IPCREF_KEEP_NONE;
  o.spin_us = IPCREF_SPIN_AUTO;
  return ipcref_peer_new_with(ctx, fd, &o, out);
}
#define ipcref_peer_new path_peer_new

/* The run's first line says which path it took. */
static __attribute__((unused)) void path_say(const char *test) {
  printf("%s: over the %s\n", test,
         path_socket_only() ? "socket only (IPCREF_TEST_PATH=socket)"
                            : "channel (IPCREF_TEST_PATH=channel)");
}

#endif
