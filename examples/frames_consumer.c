/* frames_consumer: the other program (see frames_producer.c). It connects
 * to the producer's socket path and takes frames from an epoll loop: the
 * peer's poll fd is readable whenever a receive would return something,
 * so one ipcref_recv per wake-up never misses a frame, and IPCREF_EAGAIN
 * just means "nothing now". Each frame is checked (every element holds
 * its number, its metadata names it, and the numbers only grow), kept
 * for a while as a real
 * consumer would, and released: its memory goes back to the producer with
 * no system call. It ends when the producer hangs up. A consumer that
 * keeps more frames than the producer lets it hold (KEEP over HELD) gets
 * none past that many: the producer skips it, and serves the others.
 *
 *   cc -O2 -I. examples/frames_consumer.c -o frames_consumer -pthread
 *   ./frames_consumer PATH [KEEP]       (frames held at once, 4) */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#define MAX_KEEP 64

/* 1 when every element of frame v holds `n`, and the metadata that came
 * with it (peer p's last) is its name. */
static int frame_ok(ipcref_peer *p, const ipcref_view *v, float n) {
  const float *px = (const float *)ipcref_view_data(v);
  int64_t i, count = ipcref_view_numel(v);
  char name[32];
  size_t len;
  const char *meta = (const char *)ipcref_recv_meta(p, &len);
  snprintf(name, sizeof name, "frame %.0f", (double)n);
  if (!meta || len != strlen(name) + 1 || memcmp(meta, name, len) != 0)
    return 0;
  for (i = 0; i < count; i++)
    if (px[i] != n) return 0;
  return count > 0;
}

/* Connects, retrying while the producer is not listening yet. */
static ipcref_peer *connect_to(ipcref_ctx *ctx, const char *path) {
  ipcref_peer *p = NULL;
  int tries;
  for (tries = 0; tries < 500; tries++) {
    if (ipcref_connect(ctx, path, &p) == IPCREF_OK) return p;
    usleep(10000);
  }
  return NULL;
}

int main(int argc, char **argv) {
  ipcref_ctx *ctx = NULL;
  ipcref_peer *p;
  ipcref_view held[MAX_KEEP];
  struct epoll_event ev;
  int ep, nheld = 0, got = 0, bad = 0, i;
  float last = -1;
  ipcref_result r = IPCREF_OK;
  int keep = argc > 2 ? atoi(argv[2]) : 4;
  if (argc < 2 || keep < 1 || keep > MAX_KEEP) {
    fprintf(stderr, "usage: %s PATH [KEEP: 1 to %d]\n", argv[0], MAX_KEEP);
    return 2;
  }
  if (ipcref_ctx_new(NULL, &ctx) != IPCREF_OK) return 1;
  if (!(p = connect_to(ctx, argv[1]))) {
    fprintf(stderr, "consumer: nobody listens at %s\n", argv[1]);
    return 1;
  }
  ep = epoll_create1(EPOLL_CLOEXEC);
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  (void)epoll_ctl(ep, EPOLL_CTL_ADD, ipcref_peer_poll_fd(p), &ev);
  while (epoll_wait(ep, &ev, 1, 10000) == 1) {
    ipcref_view v;
    r = ipcref_recv(p, &v, 0); /* one per wake-up: the fd says if more */
    if (r == IPCREF_EAGAIN) continue;
    if (r != IPCREF_OK) break; /* EPEER: the producer is done */
    {
      float n = *(const float *)ipcref_view_data(&v);
      bad += !frame_ok(p, &v, n) || n <= last;
      last = n;
    }
    got++;
    if (nheld == keep) { /* the oldest goes */
      ipcref_view_release(&held[0]);
      memmove(held, held + 1, sizeof held[0] * (size_t)(keep - 1));
      nheld--;
    }
    held[nheld++] = v;
  }
  for (i = 0; i < nheld; i++) ipcref_view_release(&held[i]);
  printf("consumer (keeps %d): %d frames (the last %.0f), %d wrong; it ended "
         "with: %s\n",
         keep, got, (double)last, bad, ipcref_strerror(r));
  close(ep);
  ipcref_peer_free(p);
  ipcref_ctx_free(ctx);
  return got > 0 && bad == 0 && r == IPCREF_EPEER ? 0 : 1;
}
