/* A hand-off as the consumer maps more segments (workload `maps`): one
 * process, a producer and a consumer context over a socketpair, each of
 * COUNT 4 KiB buffers in a segment of its own, sent once (its fd crosses,
 * the consumer maps it and keeps the mapping); then the timed loop hands
 * off one of them: ipcref_send, ipcref_recv, ipcref_view_release, REPS
 * times after 1000 warm-ups. Both sides look up a segment and a ledger
 * per hand-off (the consumer its mapping, the producer what its peer was
 * sent), so the time must not grow with COUNT. Prints, for COUNT 1, 100
 * and 1000: peer=ipcref workload=maps size=COUNT metric=ns_per_op (send +
 * receive + release, the median of 5 runs). Needs 2 fds per segment: the
 * soft RLIMIT_NOFILE is raised to the hard one, and a COUNT that does not
 * fit is skipped.
 * Build: gcc -O2 -std=c11 -I.. maps.c -o maps -pthread
 * Run:   ./maps [REPS=200000] */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"
#include "bench.h"

#define WARMUPS 1000
#define RUNS    5

typedef struct pair {
  ipcref_ctx *prod, *cons;
  ipcref_peer *pp, *cp;
  ipcref_view *views;
  int count;
} pair;

static int fail(const char *what, ipcref_result r, int count) {
  printf("peer=ipcref workload=maps size=%d status=failed reason=%s-%d\n",
         count, what, (int)r);
  return 1;
}

/* One send, receive and release of view `v`. */
static ipcref_result handoff(pair *p, const ipcref_view *v) {
  ipcref_view got;
  ipcref_result r = ipcref_send(p->pp, v);
  if (r == IPCREF_OK) r = ipcref_recv(p->cp, &got, 5000);
  if (r == IPCREF_OK) ipcref_view_release(&got);
  return r;
}

/* The two contexts, and `count` segments sent once each. */
static ipcref_result pair_open(pair *p, int count) {
  ipcref_ctx_options o;
  const int64_t n = 4096;
  ipcref_result r;
  int sv[2], i;
  memset(p, 0, sizeof *p);
  memset(&o, 0, sizeof o);
  o.segment_size = 4096; /* a segment per 4 KiB buffer */
  p->views = (ipcref_view *)calloc((size_t)count, sizeof *p->views);
  if (!p->views || socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv))
    return IPCREF_ESYS;
  if ((r = ipcref_ctx_new(&o, &p->prod)) ||
      (r = ipcref_ctx_new(NULL, &p->cons)) ||
      (r = ipcref_peer_new(p->prod, sv[0], &p->pp)) ||
      (r = ipcref_peer_new(p->cons, sv[1], &p->cp)))
    return r;
  for (i = 0; i < count; i++) {
    r = ipcref_view_new_shared(p->prod, IPCREF_U8, 1, &n, &p->views[i]);
    if (r == IPCREF_OK) r = handoff(p, &p->views[i]);
    if (r != IPCREF_OK) return r;
    p->count = i + 1;
  }
  return IPCREF_OK;
}

static void pair_close(pair *p) {
  int i;
  for (i = 0; i < p->count; i++) ipcref_view_release(&p->views[i]);
  if (p->pp) ipcref_peer_free(p->pp);
  if (p->cp) ipcref_peer_free(p->cp);
  if (p->prod) ipcref_ctx_free(p->prod);
  if (p->cons) ipcref_ctx_free(p->cons);
  free(p->views);
}

static int row(int count, long reps) {
  double runs[RUNS];
  ipcref_result r;
  pair p;
  int k;
  long i;
  if ((r = pair_open(&p, count)) != IPCREF_OK) {
    pair_close(&p);
    return fail("setup", r, count);
  }
  for (i = 0; i < WARMUPS; i++)
    if ((r = handoff(&p, &p.views[i % count])) != IPCREF_OK) break;
  for (k = 0; k < RUNS && r == IPCREF_OK; k++) {
    double t0 = now_ns();
    for (i = 0; i < reps && r == IPCREF_OK; i++)
      r = handoff(&p, &p.views[count / 2]);
    runs[k] = (now_ns() - t0) / (double)reps;
  }
  pair_close(&p);
  if (r != IPCREF_OK) return fail("handoff", r, count);
  printf("peer=ipcref workload=maps size=%d metric=ns_per_op value=%.1f "
         "runs=%d reps=%ld\n",
         count, median(runs, RUNS), RUNS, reps);
  return 0;
}

int main(int argc, char **argv) {
  static const int counts[] = {1, 100, 1000};
  long reps = argc > 1 ? atol(argv[1]) : 200000;
  struct rlimit rl;
  int bad = 0;
  size_t i;
  if (reps < 1) return 2;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
  }
  for (i = 0; i < sizeof counts / sizeof *counts; i++) {
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 &&
        rl.rlim_cur < (rlim_t)(2 * counts[i] + 64)) {
      printf("peer=ipcref workload=maps size=%d status=skipped "
             "reason=needs-%d-fds\n",
             counts[i], 2 * counts[i] + 64);
      continue;
    }
    bad |= row(counts[i], reps);
  }
  return bad;
}
