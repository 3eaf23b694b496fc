/* frames_producer: one program of two (with frames_consumer.c), started on
 * its own, that serves frames to every consumer that connects to its
 * socket path, from one epoll loop, and never waits for any of them.
 *
 * Each frame is a new tensor in shared memory (a 64x64 float32 image whose
 * every element is the frame number), filled and handed to each consumer
 * that can take it with its name as metadata ("frame 17"), then dropped:
 * the consumers keep it alive as long as they hold it, and the library
 * recycles its memory after. Each consumer may hold at most HELD frames
 * (max_bytes_held), so one that keeps everything cannot pin the
 * producer's memory. The loop:
 *   - the listening socket: ipcref_accept, the peer's cap set, and its
 *     poll fd goes into the epoll set;
 *   - a peer's poll fd: a consumer said something (its hello) or hung up,
 *     its socket has room again (ipcref_peer_flush), or it returned frames
 *     while at its cap;
 *   - a timer: the next frame. A send that says IPCREF_EAGAIN (the
 *     consumer is behind: its socket full, or it holds HELD frames; or its
 *     hello has not come yet) skips that consumer for this frame: nothing
 *     was taken, and the others are not held up. That is the backpressure
 *     policy here: a slow consumer gets fewer frames.
 * It sends FRAMES frames, then lets each consumer know by closing. With
 * --stats it says every 50 frames who holds what (ipcref_peer_stats): the
 * consumer that pins memory is the one to drop.
 *
 *   cc -O2 -I. examples/frames_producer.c -o frames_producer -pthread
 *   ./frames_producer PATH [FRAMES] [--stats]   (then ./frames_consumer PATH)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#define MAX_PEERS 16
#define SIDE      64
#define HELD      8 /* frames a consumer may hold */

static ipcref_peer *g_peers[MAX_PEERS];

/* A new frame: every element is its number. */
static int make_frame(ipcref_ctx *ctx, int n, ipcref_view *v) {
  const int64_t shape[2] = {SIDE, SIDE};
  float *px;
  int i;
  if (ipcref_view_new_shared(ctx, IPCREF_F32, 2, shape, v) != IPCREF_OK)
    return 0;
  px = (float *)ipcref_view_data_mut(v);
  for (i = 0; i < SIDE * SIDE; i++) px[i] = (float)n;
  return 1;
}

/* Hands frame `v`, number n, to every consumer that can take it now. */
static void broadcast(const ipcref_view *v, int n, int *sent, int *skipped) {
  char name[32];
  int i, len = snprintf(name, sizeof name, "frame %d", n) + 1;
  for (i = 0; i < MAX_PEERS; i++) {
    ipcref_result r;
    if (!g_peers[i]) continue;
    r = ipcref_send_meta(g_peers[i], v, 1, name, (size_t)len);
    if (r == IPCREF_OK) {
      (*sent)++;
    } else if (r == IPCREF_EAGAIN) {
      (*skipped)++; /* behind, or not ready: it gets the next one */
    } else {
      printf("producer: consumer %d: %s, dropped\n",
             ipcref_peer_pid(g_peers[i]), ipcref_strerror(r));
      ipcref_peer_free(g_peers[i]);
      g_peers[i] = NULL;
    }
  }
}

/* Who holds what: a line per consumer. */
static void print_holders(int frame) {
  int i;
  for (i = 0; i < MAX_PEERS; i++) {
    ipcref_peer_info in;
    if (!g_peers[i] || ipcref_peer_stats(g_peers[i], &in) != IPCREF_OK)
      continue;
    printf("producer: frame %d: consumer %d %s, holds %zu frames (%zu bytes)\n",
           frame, in.pid, in.alive ? "alive" : "gone", in.leases,
           in.bytes_held);
  }
}

/* A new consumer: non-blocking, capped, its poll fd in the loop's set. */
static void adopt(ipcref_ctx *ctx, int lfd, int ep) {
  ipcref_peer *p = NULL;
  ipcref_peer_options o;
  struct epoll_event ev;
  int i;
  if (ipcref_accept(ctx, lfd, 0, &p) != IPCREF_OK) return;
  memset(&o, 0, sizeof o);
  o.max_bytes_held = HELD * SIDE * SIDE * sizeof(float);
  (void)ipcref_peer_set_options(p, &o);
  for (i = 0; i < MAX_PEERS && g_peers[i]; i++) continue;
  if (i == MAX_PEERS) {
    ipcref_peer_free(p);
    return;
  }
  g_peers[i] = p;
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  ev.data.u32 = (uint32_t)(i + 2); /* 0: listener, 1: timer */
  (void)epoll_ctl(ep, EPOLL_CTL_ADD, ipcref_peer_poll_fd(p), &ev);
}

/* Something on consumer i's poll fd: what it sent (only its hello ever,
 * here), a hang-up, or room for a record left half sent. */
static void service(int i) {
  ipcref_peer *p = g_peers[i];
  ipcref_view v;
  ipcref_result r;
  if (!p) return;
  (void)ipcref_peer_flush(p);
  while ((r = ipcref_recv(p, &v, 0)) == IPCREF_OK) ipcref_view_release(&v);
  if (r != IPCREF_EAGAIN) {
    printf("producer: consumer %d left\n", ipcref_peer_pid(p));
    ipcref_peer_free(p);
    g_peers[i] = NULL;
  }
}

int main(int argc, char **argv) {
  ipcref_ctx *ctx = NULL;
  int frames = argc > 2 ? atoi(argv[2]) : 200, n = 0, lfd = -1, ep, tfd, i;
  int stats = argc > 3 && strcmp(argv[3], "--stats") == 0;
  int sent = 0, skipped = 0;
  struct itimerspec every = {{0, 2000000}, {0, 2000000}}; /* 2 ms */
  struct epoll_event ev;
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH [FRAMES] [--stats]\n", argv[0]);
    return 2;
  }
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK ||
      ipcref_listen(ctx, argv[1], &lfd) != IPCREF_OK) {
    perror("producer: listen");
    return 1;
  }
  ep = epoll_create1(EPOLL_CLOEXEC);
  tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  (void)fcntl(lfd, F_SETFL, O_NONBLOCK);
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  ev.data.u32 = 0;
  (void)epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  ev.data.u32 = 1;
  (void)epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
  (void)timerfd_settime(tfd, 0, &every, NULL);
  printf("producer: listening at %s, %d frames\n", argv[1], frames);
  fflush(stdout);
  while (n < frames) {
    if (epoll_wait(ep, &ev, 1, -1) != 1) continue;
    if (ev.data.u32 == 0) {
      adopt(ctx, lfd, ep);
    } else if (ev.data.u32 == 1) { /* the next frame */
      uint64_t ticks;
      ipcref_view v;
      if (read(tfd, &ticks, sizeof ticks) < 0) continue;
      for (i = 0; i < MAX_PEERS && !g_peers[i]; i++) continue;
      if (i == MAX_PEERS) continue; /* nobody yet: no frame */
      if (!make_frame(ctx, n, &v)) break;
      broadcast(&v, n, &sent, &skipped);
      ipcref_view_release(&v); /* the consumers keep what they hold */
      n++;
      if (stats && n % 50 == 0) print_holders(n);
    } else {
      service((int)ev.data.u32 - 2);
    }
  }
  printf("producer: %d frames, %d hand-offs, %d skipped (a consumer behind)\n",
         n, sent, skipped);
  for (i = 0; i < MAX_PEERS; i++) ipcref_peer_free(g_peers[i]);
  close(tfd);
  close(ep);
  close(lfd);
  if (argv[1][0] != '@') unlink(argv[1]);
  ipcref_ctx_free(ctx);
  return n == frames ? 0 : 1;
}
