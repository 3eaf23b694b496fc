/* W4 peers iceoryx and iceoryx_waitset: Eclipse iceoryx's own zero-copy
 * publish/subscribe (C binding, iceoryx 2.0 as Debian 12 ships it) doing the
 * W4 hand-off of a buffer of SIZE bytes between two processes.
 *
 * Process A (this one) forks B; each has its own iceoryx runtime. One
 * hand-off: A loans a chunk of SIZE bytes from its publisher, writes the
 * hand-off number into the chunk's first and last byte and publishes it; B
 * takes the chunk, checks the two bytes, releases it and publishes an 8-byte
 * ack (a chunk of its own, echoing the two bytes); A takes the ack, checks it
 * and releases it. The time runs from A's loan to A's release of the ack: the
 * same span as the other W4 peers (the buffer one way, a small ack back). No
 * byte of the payload is copied.
 *   WAIT     peer             how A waits for the ack and B for the chunk
 *   poll     iceoryx          busy-polling: iox_sub_take_chunk() again and
 *                             again, sched_yield() after each empty take (so
 *                             that both sides also progress on one CPU)
 *   waitset  iceoryx_waitset  blocking: the subscriber is attached to a
 *                             WaitSet (SubscriberState_HAS_DATA); a side with
 *                             nothing to take sleeps in iox_ws_timed_wait()
 * Hand-offs are timed one by one for SECONDS after 3 warm-ups:
 * us_per_handoff = the median (n, mean, p99 as extra fields), GBps = SIZE /
 * median.
 * Environment: W4_ID = the workload id printed (default w4); W4_PIN=split = A
 * on the first and B on the second allowed CPU.
 * A RouDi (iox-roudi) must be running, with a mempool whose chunks hold SIZE
 * bytes: iceoryx 2.0 aborts the process (an assert) on a loan larger than
 * every mempool, so run.sh skips such sizes before calling this program.
 * Build: gcc -O2 -std=gnu11 -I/usr/include/iceoryx/v2.0.3 -I../.. \
 *            w4_iceoryx.c -o w4_iceoryx -liceoryx_binding_c
 * Run:   ./w4_iceoryx poll|waitset SIZE [SECONDS=1.0] */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "iceoryx_binding_c/enums.h"
#include "iceoryx_binding_c/log.h"
#include "iceoryx_binding_c/notification_info.h"
#include "iceoryx_binding_c/publisher.h"
#include "iceoryx_binding_c/runtime.h"
#include "iceoryx_binding_c/subscriber.h"
#include "iceoryx_binding_c/types.h"
#include "iceoryx_binding_c/wait_set.h"

#include "bench.h"

/* SILENT_S: nothing from the other side for this long means it is gone */
#define SERVICE  "ipcref_bench"
#define ACK_SIZE 8u
#define WARMUPS  3
#define MAX_N    50000000
#define SILENT_S 5.0

enum wait { POLL, WAITSET };

/* A page both processes share, made before the fork: start and stop only,
 * never touched on the timed path (B reads `stop` after each ack). */
struct control {
  _Atomic int b_ready;
  _Atomic int stop;
  _Atomic int b_failed;
  char why[128];
};

struct endpoint {
  iox_pub_storage_t pub_storage;
  iox_sub_storage_t sub_storage;
  iox_ws_storage_t ws_storage;
  iox_pub_t pub;
  iox_sub_t sub;
  iox_ws_t ws; /* NULL when polling */
  enum wait wait;
};

static const char *g_peer = "iceoryx", *g_wl = "w4";
/* SIGTERM, SIGINT or SIGHUP: both processes stop and leave RouDi cleanly (a
 * RouDi stopped while a killed client is still registered asserts). */
static volatile sig_atomic_t g_signalled;
static uint32_t S;
static int g_cpu[2];

static void pin_to(int which) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(g_cpu[which], &set);
  sched_setaffinity(0, sizeof set, &set); /* best effort */
}

static int first_two_cpus(void) {
  cpu_set_t set;
  int k = 0;
  if (sched_getaffinity(0, sizeof set, &set)) return 0;
  for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &set)) g_cpu[k++] = c;
  return k == 2;
}

static void open_endpoint(struct endpoint *e, const char *instance,
                          const char *send, const char *take, enum wait w) {
  iox_pub_options_t po;
  iox_sub_options_t so;
  iox_pub_options_init(&po);
  po.historyCapacity = 0;
  po.offerOnCreate = true;
  e->pub = iox_pub_init(&e->pub_storage, SERVICE, instance, send, &po);
  iox_sub_options_init(&so);
  so.queueCapacity = 4; /* one message in flight each way */
  so.historyRequest = 0;
  so.subscribeOnCreate = true;
  e->sub = iox_sub_init(&e->sub_storage, SERVICE, instance, take, &so);
  e->wait = w;
  e->ws = NULL;
  if (w == WAITSET) {
    e->ws = iox_ws_init(&e->ws_storage);
    if (iox_ws_attach_subscriber_state(e->ws, e->sub, SubscriberState_HAS_DATA,
                                       0, NULL) != WaitSetResult_SUCCESS) {
      fprintf(stderr, "%s: iox_ws_attach_subscriber_state failed\n", g_peer);
      exit(2);
    }
  }
}

static void close_endpoint(struct endpoint *e) {
  if (e->ws) {
    iox_ws_detach_subscriber_state(e->ws, e->sub, SubscriberState_HAS_DATA);
    iox_ws_deinit(e->ws);
  }
  iox_sub_deinit(e->sub);
  iox_pub_deinit(e->pub);
}

static void on_signal(int sig) {
  (void)sig;
  g_signalled = 1;
}

static void catch_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

/* The next chunk, or NULL when the other side stayed silent for SILENT_S, a
 * signal came or *stop became set while waiting. */
static const void *next_chunk(struct endpoint *e, _Atomic int *stop) {
  const void *chunk = NULL;
  double since = 0;
  unsigned empty = 0;
  for (;;) {
    enum iox_ChunkReceiveResult r = iox_sub_take_chunk(e->sub, &chunk);
    if (r == ChunkReceiveResult_SUCCESS) return chunk;
    if (r != ChunkReceiveResult_NO_CHUNK_AVAILABLE) return NULL;
    if (e->wait == POLL) {
      sched_yield();
      if ((++empty & 1023) != 0) continue; /* look at the clock rarely */
    } else {
      iox_notification_info_t info[1];
      uint64_t missed = 0;
      struct timespec tick = {0, 100 * 1000 * 1000};
      if (iox_ws_timed_wait(e->ws, tick, info, 1, &missed) > 0) continue;
    }
    if (g_signalled || (stop && atomic_load(stop))) return NULL;
    if (since == 0)
      since = now_ns();
    else if (now_ns() - since > SILENT_S * 1e9)
      return NULL;
  }
}

static const char *loan_error(enum iox_AllocationResult r) {
  switch (r) {
  case AllocationResult_RUNNING_OUT_OF_CHUNKS: return "running-out-of-chunks";
  case AllocationResult_TOO_MANY_CHUNKS_ALLOCATED_IN_PARALLEL:
    return "too-many-chunks-in-parallel";
  case AllocationResult_NO_MEMPOOLS_AVAILABLE: return "no-mempools";
  default: return "loan-failed";
  }
}

/* ---- B: takes the buffer, acks ------------------------------------------ */

static int run_b(struct control *ctl, const char *instance, enum wait w) {
  char name[64];
  struct endpoint e;
  int rc = 0;
  snprintf(name, sizeof name, "ipcref-w4-%s-b", instance);
  iox_runtime_init(name);
  open_endpoint(&e, instance, "ack", "buffer", w);
  atomic_store(&ctl->b_ready, 1);
  for (;;) {
    const volatile unsigned char *in = next_chunk(&e, &ctl->stop);
    unsigned char first, last;
    uint64_t echo;
    void *ack = NULL;
    enum iox_AllocationResult ar;
    if (!in) {
      if (!atomic_load(&ctl->stop) && !g_signalled) {
        snprintf(ctl->why, sizeof ctl->why, "b-got-nothing-for-%gs", SILENT_S);
        atomic_store(&ctl->b_failed, 1);
        rc = 2;
      }
      break;
    }
    first = in[0];
    last = in[S - 1];
    iox_sub_release_chunk(e.sub, (const void *)in);
    if (atomic_load_explicit(&ctl->stop, memory_order_relaxed)) break;
    if ((ar = iox_pub_loan_chunk(e.pub, &ack, ACK_SIZE)) !=
        AllocationResult_SUCCESS) {
      snprintf(ctl->why, sizeof ctl->why, "b-%s", loan_error(ar));
      atomic_store(&ctl->b_failed, 1);
      rc = 2;
      break;
    }
    echo = (uint64_t)first | (uint64_t)last << 8;
    memcpy(ack, &echo, sizeof echo);
    iox_pub_publish_chunk(e.pub, ack);
  }
  close_endpoint(&e);
  iox_runtime_shutdown();
  return rc;
}

/* ---- A: hands the buffer over ------------------------------------------- */

/* One hand-off; NULL when it went through, else why not. */
static const char *hand_off(struct endpoint *e, uint64_t i) {
  unsigned char *b = NULL;
  const void *ack;
  uint64_t echo, want = (uint64_t)(unsigned char)i * 0x101u;
  enum iox_AllocationResult ar = iox_pub_loan_chunk(e->pub, (void **)&b, S);
  if (ar != AllocationResult_SUCCESS) return loan_error(ar);
  b[0] = b[S - 1] = (unsigned char)i;
  iox_pub_publish_chunk(e->pub, b);
  if (!(ack = next_chunk(e, NULL)))
    return g_signalled ? "interrupted" : "no-ack";
  memcpy(&echo, ack, sizeof echo);
  iox_sub_release_chunk(e->sub, ack);
  return echo == want ? NULL : "wrong-ack";
}

int main(int argc, char **argv) {
  enum wait w;
  int split;
  struct control *ctl;
  char instance[32], name[64];
  struct endpoint e;
  const char *why = NULL;
  double secs, start, sum = 0, *t = NULL;
  size_t n = 0, cap = 1 << 16;
  uint64_t i = 0;
  pid_t b;
  int st = 0;

  if (argc < 3 || (strcmp(argv[1], "poll") && strcmp(argv[1], "waitset"))) {
    fprintf(stderr, "usage: %s poll|waitset SIZE [SECONDS]\n", argv[0]);
    return 2;
  }
  w = strcmp(argv[1], "poll") ? WAITSET : POLL;
  g_peer = w == POLL ? "iceoryx" : "iceoryx_waitset";
  if (getenv("W4_ID") && *getenv("W4_ID")) g_wl = getenv("W4_ID");
  {
    unsigned long long s = strtoull(argv[2], NULL, 0);
    if (s < ACK_SIZE || s > UINT32_MAX) { /* a loan takes a uint32_t size */
      printf("peer=%s workload=%s size=%llu status=skipped "
             "reason=size-outside-8..4294967295\n",
             g_peer, g_wl, s);
      return 0;
    }
    S = (uint32_t)s;
  }
  secs = argc > 3 ? atof(argv[3]) : 1.0;
  split = getenv("W4_PIN") && !strcmp(getenv("W4_PIN"), "split");
  if (split && !first_two_cpus()) {
    printf("peer=%s workload=%s size=%u status=skipped "
           "reason=needs-2-allowed-cpus\n",
           g_peer, g_wl, S);
    return 0;
  }
  catch_signals(); /* B inherits the handlers */
  iox_set_loglevel(Iceoryx_LogLevel_Warn);
  ctl = mmap(NULL, sizeof *ctl, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (ctl == MAP_FAILED) return 2;
  snprintf(instance, sizeof instance, "%ld", (long)getpid());

  fflush(stdout);
  b = fork(); /* before either runtime exists: iceoryx is not fork-safe */
  if (b < 0) return 2;
  if (b == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (split) pin_to(1);
    exit(run_b(ctl, instance, w)); /* exit(): removes the runtime's socket */
  }
  if (split) pin_to(0);
  snprintf(name, sizeof name, "ipcref-w4-%s-a", instance);
  iox_runtime_init(name);
  open_endpoint(&e, instance, "buffer", "ack", w);

  /* RouDi connects publishers and subscribers in its discovery loop */
  start = now_ns();
  while (
      !(atomic_load(&ctl->b_ready) && iox_pub_has_subscribers(e.pub) &&
        iox_sub_get_subscription_state(e.sub) == SubscribeState_SUBSCRIBED)) {
    if (atomic_load(&ctl->b_failed) || waitpid(b, &st, WNOHANG) == b) {
      why = "b-died-before-connecting";
      b = -1;
      break;
    }
    if (g_signalled || now_ns() - start > 15e9) {
      why = g_signalled ? "interrupted" : "no-connection-in-15s";
      break;
    }
    usleep(1000);
  }
  if (!why && !(t = malloc(cap * sizeof *t))) why = "malloc";
  for (int k = 0; !why && k < WARMUPS; k++) why = hand_off(&e, i++);
  start = now_ns();
  while (!why && (n < 5 || now_ns() - start < secs * 1e9) && n < MAX_N) {
    if (g_signalled) {
      why = "interrupted";
      break;
    }
    double t0 = now_ns();
    if ((why = hand_off(&e, i++))) break;
    if (n == cap && !(t = realloc(t, (cap *= 2) * sizeof *t))) {
      why = "realloc";
      break;
    }
    t[n] = now_ns() - t0;
    sum += t[n++];
  }

  /* stop B: the flag, then one more buffer to wake it if it sleeps */
  atomic_store(&ctl->stop, 1);
  if (b > 0) {
    void *last = NULL;
    pid_t got;
    if (iox_pub_loan_chunk(e.pub, &last, S) == AllocationResult_SUCCESS)
      iox_pub_publish_chunk(e.pub, last);
    start = now_ns();
    while ((got = waitpid(b, &st, WNOHANG)) == 0 && now_ns() - start < 10e9)
      usleep(1000);
    if (got == 0) {
      kill(b, SIGKILL);
      waitpid(b, &st, 0);
      if (!why) why = "b-hung";
    } else if (!why && (!WIFEXITED(st) || WEXITSTATUS(st)))
      why = "b-failed";
  }
  close_endpoint(&e);
  iox_runtime_shutdown();

  if (why) {
    printf("peer=%s workload=%s size=%u status=failed reason=%s%s%s\n", g_peer,
           g_wl, S, why, atomic_load(&ctl->b_failed) ? "," : "",
           atomic_load(&ctl->b_failed) ? ctl->why : "");
    return 1;
  }
  {
    double med = median(t, (int)n); /* sorts t */
    printf("peer=%s workload=%s size=%u metric=us_per_handoff value=%.3f "
           "n=%zu mean=%.3f p99=%.3f\n",
           g_peer, g_wl, S, med / 1e3, n, sum / (double)n / 1e3,
           t[(size_t)(0.99 * (double)(n - 1))] / 1e3);
    printf("peer=%s workload=%s size=%u metric=GBps value=%.3f\n", g_peer, g_wl,
           S, (double)S / med);
  }
  free(t);
  return 0;
}
