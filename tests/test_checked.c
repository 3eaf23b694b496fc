/* Misuse of the C API gives a clear error, never a silent use after free.
 *
 * Each test makes one mistake a user could make and checks what the error
 * hook hears (the function's name and IPCREF_EDEAD), what the call
 * returns, and that nothing changed: counts, bytes, what the other side
 * receives. Built twice by tests/run.sh:
 *
 *   plain            what every build guarantees while the context lives:
 *                    a shared buffer made here keeps its header in its
 *                    context, so a send or a release of one already
 *                    released is refused; a freed peer stays with its
 *                    context, marked dead, so a second free or a late call
 *                    is refused, never an abort inside libc; so is a call
 *                    on a context after ipcref_ctx_free.
 *   IPCREF_CHECKED   the same, and also after the context went (it waits in
 *                    the quarantine), and every buffer (heap, wrapped,
 *                    imported) is checked: a late call on a released one
 *                    is reported instead of reading freed memory.
 *   AddressSanitizer a late read of a released shared block's bytes is
 *                    caught at the read (in a child, which ASan ends).
 *
 * Producer and consumer are two contexts of this process joined by a
 * socketpair: the mistakes are local, and their effect on the other side
 * is what a receive there sees. */
#define _GNU_SOURCE
#define IPCREF_IMPLEMENTATION
#include "counting_alloc.h" /* what the quarantine holds, counted */
#include "ipcref.h"

#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* ------------------------------------------------------------ the hook */

static struct {
  int calls;
  ipcref_result code;
  char message[256];
} heard;

static void hook_fn(void *user, ipcref_result code, const char *message) {
  (void)user;
  heard.calls++;
  heard.code = code;
  snprintf(heard.message, sizeof heard.message, "%s", message);
}

static const ipcref_error_hook hook = {hook_fn, NULL};

static void hear_nothing_yet(void) {
  memset(&heard, 0, sizeof heard);
}

/* The hook heard exactly one EDEAD, from function `fn`. */
#define CHECK_HEARD(fn)                                                        \
  do {                                                                         \
    CHECK_EQ(heard.calls, 1);                                                  \
    CHECK_EQ(heard.code, IPCREF_EDEAD);                                        \
    CHECK(strncmp(heard.message, fn ": ", strlen(fn ": ")) == 0);              \
    if (strncmp(heard.message, fn ": ", strlen(fn ": ")) != 0)                 \
      printf("    heard: \"%s\"\n", heard.message);                            \
  } while (0)

/* ------------------------------------------------------------ a pair */

typedef struct pair {
  ipcref_ctx *prod, *cons;
  ipcref_peer *to_cons, *to_prod;
} pair;

static void pair_open(pair *p) {
  int sv[2];
  ipcref_ctx_options o;
  memset(p, 0, sizeof *p);
  memset(&o, 0, sizeof o);
  o.error_hook = hook; /* what peers do wrong, heard here too */
  CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  CHECK_EQ(ipcref_ctx_new(&o, &p->prod), IPCREF_OK);
  CHECK_EQ(ipcref_ctx_new(&o, &p->cons), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new(p->prod, sv[0], &p->to_cons), IPCREF_OK);
  CHECK_EQ(ipcref_peer_new(p->cons, sv[1], &p->to_prod), IPCREF_OK);
}

static void pair_close(pair *p) {
  if (p->to_cons) ipcref_peer_free(p->to_cons);
  if (p->to_prod) ipcref_peer_free(p->to_prod);
  ipcref_ctx_free(p->prod);
  ipcref_ctx_free(p->cons);
}

static ipcref_stats stats_of(ipcref_ctx *ctx) {
  ipcref_stats st;
  memset(&st, 0, sizeof st);
  CHECK_EQ(ipcref_ctx_stats(ctx, &st), IPCREF_OK);
  return st;
}

/* A shared u8 view of n bytes, each `fill`. */
static ipcref_view shared_view(ipcref_ctx *ctx, int64_t n, int fill) {
  ipcref_view v;
  memset(&v, 0, sizeof v);
  CHECK_EQ(ipcref_view_new_shared(ctx, IPCREF_U8, 1, &n, &v), IPCREF_OK);
  if (v.buf) memset(ipcref_buf_data(v.buf), fill, (size_t)n);
  return v;
}

static int all_bytes(const ipcref_view *v, int fill, size_t n) {
  const unsigned char *d = (const unsigned char *)ipcref_buf_data(v->buf);
  size_t i;
  if (!d) return 0;
  d += v->byte_offset;
  for (i = 0; i < n; i++)
    if (d[i] != (unsigned char)fill) return 0;
  return 1;
}

/* ------------------------------------------------------------ the tests */

/* A struct copy of a view outlives the view: sending it is refused, the
 * consumer receives nothing, and no lease is taken. */
static void test_send_released_view(void) {
  pair p;
  ipcref_view v, copy, got;
  ipcref_stats before;
  pair_open(&p);
  v = shared_view(p.prod, 4096, 7);
  copy = v;
  /* The block goes back: the next allocation may get its memory. */
  ipcref_view_release(&v);
  before = stats_of(p.prod);
  hear_nothing_yet();
  CHECK_EQ(ipcref_send(p.to_cons, &copy), IPCREF_EDEAD);
  CHECK_HEARD("ipcref_send");
  hear_nothing_yet();
  CHECK_EQ(ipcref_send_batch(p.to_cons, &copy, 1), IPCREF_EDEAD);
  CHECK_HEARD("ipcref_send_batch");
  {
    ipcref_msg *msg = (ipcref_msg *)malloc(sizeof *msg);
    hear_nothing_yet();
    CHECK_EQ(ipcref_export(p.to_cons, &copy, msg), IPCREF_EDEAD);
    CHECK_HEARD("ipcref_export");
    free(msg);
  }
  CHECK_EQ(stats_of(p.prod).live_slots, before.live_slots);
  CHECK_EQ(stats_of(p.prod).live_bufs, 0);
  CHECK_EQ(ipcref_recv(p.to_prod, &got, 0), IPCREF_EAGAIN);
  pair_close(&p);
}

/* A shared buffer released twice: the second is refused and heard, even
 * while the block is leased out (in the limbo) and after another buffer
 * took its memory; nothing is freed twice. */
static void test_release_shared_twice(void) {
  pair p;
  ipcref_view v, got, again;
  ipcref_buf *dup;
  pair_open(&p);
  v = shared_view(p.prod, 1000, 3);
  CHECK_EQ(ipcref_send(p.to_cons, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(p.to_prod, &got, 1000), IPCREF_OK);
  dup = v.buf;
  ipcref_view_release(&v); /* to the limbo: the consumer holds it */
  CHECK_EQ(stats_of(p.prod).limbo_blocks, 1);
  hear_nothing_yet();
  ipcref_buf_release(dup);
  CHECK_HEARD("ipcref_buf_release");
  CHECK_EQ(stats_of(p.prod).limbo_blocks, 1);
  CHECK_EQ(stats_of(p.prod).live_slots, 1);
  CHECK(all_bytes(&got, 3, 1000));
  ipcref_view_release(&got);
  CHECK_EQ(ipcref_collect(p.prod) > 0, 1);
  CHECK_EQ(stats_of(p.prod).limbo_blocks, 0);
  /* Now the block is free and handed out again: a third release must not
   * touch the new buffer. */
  again = shared_view(p.prod, 1000, 9);
  hear_nothing_yet();
  ipcref_buf_release(dup);
  CHECK_HEARD("ipcref_buf_release");
  CHECK_EQ(stats_of(p.prod).live_bufs, 1);
  CHECK_EQ(ipcref_buf_strong_count(again.buf), 1);
  CHECK(all_bytes(&again, 9, 1000));
  ipcref_view_release(&again);
  CHECK_EQ(stats_of(p.prod).live_bufs, 0);
  pair_close(&p);
}

/* A freed peer: alive says 0, pid 0, a send and a receive are refused, a
 * second free is refused; none of them reads freed memory or aborts. */
static void test_freed_peer(void) {
  pair p;
  ipcref_peer *gone;
  ipcref_view v, got;
  pair_open(&p);
  v = shared_view(p.prod, 64, 1);
  gone = p.to_cons;
  ipcref_peer_free(gone);
  p.to_cons = NULL;
  CHECK_EQ(stats_of(p.prod).peers, 0);
  hear_nothing_yet();
  CHECK_EQ(ipcref_peer_alive(gone), 0);
  CHECK_HEARD("ipcref_peer_alive");
  hear_nothing_yet();
  CHECK_EQ(ipcref_peer_pid(gone), 0);
  CHECK_HEARD("ipcref_peer_pid");
  hear_nothing_yet();
  CHECK_EQ(ipcref_peer_poll_fd(gone), -1);
  CHECK_HEARD("ipcref_peer_poll_fd");
  hear_nothing_yet();
  {
    ipcref_peer_info in;
    CHECK_EQ(ipcref_peer_stats(gone, &in), IPCREF_EDEAD);
    CHECK_HEARD("ipcref_peer_stats");
  }
  hear_nothing_yet();
  CHECK_EQ(ipcref_peer_flush(gone), IPCREF_EDEAD);
  CHECK_HEARD("ipcref_peer_flush");
  hear_nothing_yet();
  CHECK_EQ(ipcref_peer_wants(gone), 0);
  CHECK_HEARD("ipcref_peer_wants");
  hear_nothing_yet();
  CHECK_EQ(ipcref_send(gone, &v), IPCREF_EDEAD);
  CHECK_HEARD("ipcref_send");
  hear_nothing_yet();
  CHECK_EQ(ipcref_recv(gone, &got, 0), IPCREF_EDEAD);
  CHECK_HEARD("ipcref_recv");
  hear_nothing_yet();
  ipcref_peer_free(gone);
  CHECK_HEARD("ipcref_peer_free");
  CHECK_EQ(stats_of(p.prod).peers, 0);
  CHECK_EQ(stats_of(p.prod).live_slots, 0);
  ipcref_view_release(&v);
  pair_close(&p);
}

/* A context freed twice, and used after its free: refused and heard while
 * its buffers keep it (they stay valid), and with IPCREF_CHECKED after it
 * went too (it waits in the quarantine). */
static void test_freed_ctx(void) {
  ipcref_ctx *ctx;
  ipcref_buf *b = NULL, *late = NULL;
  ipcref_stats st;
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  CHECK_EQ(ipcref_shared_new(ctx, 128, &b), IPCREF_OK);
  memset(ipcref_buf_data(b), 5, 128);
  ipcref_ctx_free(ctx); /* b keeps it */
  hear_nothing_yet();
  ipcref_ctx_free(ctx);
  CHECK_HEARD("ipcref_ctx_free");
  hear_nothing_yet();
  CHECK_EQ(ipcref_shared_new(ctx, 128, &late), IPCREF_EDEAD);
  CHECK_HEARD("ipcref_shared_new");
  CHECK(late == NULL);
  hear_nothing_yet();
  CHECK_EQ(ipcref_ctx_stats(ctx, &st), IPCREF_EDEAD);
  CHECK_HEARD("ipcref_ctx_stats");
  hear_nothing_yet();
  CHECK_EQ(ipcref_collect(ctx), 0);
  CHECK_HEARD("ipcref_collect");
  hear_nothing_yet();
  CHECK_EQ(ipcref_ctx_trim(ctx, 0), 0);
  CHECK_HEARD("ipcref_ctx_trim");
  CHECK_EQ(((unsigned char *)ipcref_buf_data(b))[127], 5);
  ipcref_buf_release(b); /* the context goes now */
#ifdef IPCREF_CHECKED
  /* Gone, it waits in the quarantine: still refused, still heard. */
  hear_nothing_yet();
  ipcref_ctx_free(ctx);
  CHECK_HEARD("ipcref_ctx_free");
  hear_nothing_yet();
  CHECK_EQ(ipcref_ctx_poll_fd(ctx), -1);
  CHECK_HEARD("ipcref_ctx_poll_fd");
#endif
}

/* A received buffer released twice, and a view used after its buffer was
 * released: IPCREF_CHECKED keeps the headers, so both are heard; the
 * producer's lease comes back once. */
static void test_checked_buffers(void) {
#ifdef IPCREF_CHECKED
  pair p;
  ipcref_view v, got, sl, copy;
  ipcref_buf *heap = NULL, *dup;
  pair_open(&p);
  v = shared_view(p.prod, 256, 4);
  CHECK_EQ(ipcref_send(p.to_cons, &v), IPCREF_OK);
  CHECK_EQ(ipcref_recv(p.to_prod, &got, 1000), IPCREF_OK);
  copy = got;
  dup = got.buf;
  ipcref_view_release(&got);
  hear_nothing_yet();
  ipcref_buf_release(dup);
  CHECK_HEARD("ipcref_buf_release");
  hear_nothing_yet();
  CHECK_EQ(ipcref_view_slice(&copy, 0, 0, 10, 1, &sl), IPCREF_EINVAL);
  CHECK_HEARD("ipcref_view_slice");
  CHECK_EQ(ipcref_collect(p.prod), 0); /* the producer still holds it */
  CHECK_EQ(stats_of(p.prod).live_slots, 0);
  CHECK_EQ(stats_of(p.prod).bad_returns, 0);
  ipcref_view_release(&v);
  /* A heap buffer: data, size and a view op after its release. */
  CHECK_EQ(ipcref_buf_new(64, &heap), IPCREF_OK);
  ipcref_buf_release(heap);
  hear_nothing_yet();
  CHECK(ipcref_buf_data(heap) == NULL);
  CHECK_HEARD("ipcref_buf_data");
  hear_nothing_yet();
  CHECK_EQ(ipcref_buf_size(heap), 0);
  CHECK_HEARD("ipcref_buf_size");
  hear_nothing_yet();
  ipcref_buf_release(heap);
  CHECK_HEARD("ipcref_buf_release");
  hear_nothing_yet();
  CHECK(ipcref_buf_downgrade(heap) == NULL);
  CHECK_HEARD("ipcref_buf_downgrade");
  pair_close(&p);
#else
  printf("    (IPCREF_CHECKED not defined: the plain build's guarantees "
         "only)\n");
#endif
}

/* A released shared buffer's header is not handed out again before 255
 * others were (IPCREF__HDR_DELAY: 256; 4096 with IPCREF_CHECKED), so a
 * late call on it finds it dead; and it is handed out again after that, so
 * the headers a context keeps are bounded. */
static void test_header_reuse_delayed(void) {
  ipcref_ctx *ctx;
  ipcref_buf *old = NULL, *b = NULL;
  int i, first_reuse = -1;
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  CHECK_EQ(ipcref_shared_new(ctx, 64, &old), IPCREF_OK);
  ipcref_buf_release(old);
  for (i = 0; i < 1000; i++) {
    CHECK_EQ(ipcref_shared_new(ctx, 64, &b), IPCREF_OK);
    if (b == old && first_reuse < 0) first_reuse = i;
    ipcref_buf_release(b);
  }
#ifdef IPCREF_CHECKED
  CHECK_EQ(first_reuse, -1);
#else
  CHECK(first_reuse >= 255 && first_reuse < 1000);
#endif
  ipcref_ctx_free(ctx);
}

/* IPCREF_CHECKED: a child made by fork() starts with a copy of its
 * parent's quarantine and hands it back at once (pthread_atfork): what it
 * has allocated is what the parent had before it used ipcref. */
static void test_fork_empties_quarantine(void) {
#ifdef IPCREF_CHECKED
  long base = live_allocs; /* flushed: nothing of ours is allocated */
  ipcref_ctx *ctx;
  ipcref_buf *heap = NULL;
  ipcref_view v;
  pid_t pid;
  int status = -1;
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  v = shared_view(ctx, 1000, 1);
  ipcref_view_release(&v);
  CHECK_EQ(ipcref_buf_new(64, &heap), IPCREF_OK);
  ipcref_buf_release(heap); /* buried in the quarantine */
  ipcref_ctx_free(ctx);     /* the context too */
  CHECK(live_allocs_raw > base);
  fflush(stdout);
  pid = fork();
  if (pid == 0) _exit(live_allocs_raw == base ? 0 : 1);
  CHECK(pid > 0);
  CHECK_EQ(waitpid(pid, &status, 0), pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_EQ(live_allocs, base);
#else
  printf("    (IPCREF_CHECKED not defined: no quarantine)\n");
#endif
}

#if UNDER_ASAN
/* 1 when a child that reads *p is stopped (by ASan, at that read). */
static int child_read_stopped(volatile unsigned char *p) {
  pid_t pid;
  int status = 0;
  fflush(stdout);
  pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 2); /* ASan's report: expected */
    alarm(30);
    if (*p == 1) _exit(0); /* ASan must stop this read */
    _exit(0);
  }
  CHECK(pid > 0);
  CHECK_EQ(waitpid(pid, &status, 0), pid);
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
#endif

/* Under AddressSanitizer a released shared block is poisoned until it is
 * handed out again: a child that reads it through a stale pointer is
 * stopped by ASan at that read. A fresh buffer on the same block reads
 * fine. With IPCREF_CHECKED, a heap buffer's bytes, buried in the
 * quarantine, are poisoned too. */
static void test_asan_poisons_released_block(void) {
#if UNDER_ASAN
  ipcref_ctx *ctx;
  ipcref_buf *b = NULL, *again = NULL;
  volatile unsigned char *stale;
  CHECK_EQ(ipcref_ctx_new(NULL, &ctx), IPCREF_OK);
  CHECK_EQ(ipcref_shared_new(ctx, 4096, &b), IPCREF_OK);
  stale = (volatile unsigned char *)ipcref_buf_data(b);
  stale[0] = 1;
  ipcref_buf_release(b);
  CHECK(child_read_stopped(stale));
  CHECK_EQ(ipcref_shared_new(ctx, 4096, &again), IPCREF_OK);
  CHECK(ipcref_buf_data(again) == (void *)stale);
  memset(ipcref_buf_data(again), 2, 4096);
  CHECK_EQ(stale[4095], 2);
  ipcref_buf_release(again);
  ipcref_ctx_free(ctx);
#ifdef IPCREF_CHECKED
  CHECK_EQ(ipcref_buf_new(4096, &b), IPCREF_OK);
  stale = (volatile unsigned char *)ipcref_buf_data(b);
  stale[0] = 1;
  ipcref_buf_release(b);
  CHECK(child_read_stopped(stale));
#endif
#else
  printf("    (not built with AddressSanitizer: nothing to poison)\n");
#endif
}

int main(void) {
  ipcref_set_error_hook(&hook);
  RUN(test_send_released_view);
  RUN(test_release_shared_twice);
  RUN(test_freed_peer);
  RUN(test_freed_ctx);
  RUN(test_checked_buffers);
  RUN(test_header_reuse_delayed);
  RUN(test_fork_empties_quarantine);
  RUN(test_asan_poisons_released_block);
  ipcref_set_error_hook(NULL);
  return harness_finish();
}
