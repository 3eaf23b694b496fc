/* Reference counting under contention: 8 threads hammer retain, release,
 * downgrade and upgrade on shared buffers; then two threads race an upgrade
 * against the last release, round after round. Run under TSan by make test.
 * IPCREF_TEST_OPS sets the operations per thread (default 10^6). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "harness.h"

#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"

#define THREADS 8
#define BUFS    4
#define HELD    16 /* references each thread keeps for a while */

static ipcref_buf *shared_bufs[BUFS];
static int frees[BUFS]; /* atomic: release callbacks run per buffer */
static long ops_per_thread;

static void count_free(void *user, void *data) {
  __atomic_fetch_add((int *)user, 1, __ATOMIC_RELAXED);
  free(data);
}

static unsigned next_rand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return *s >> 8;
}

static void *hammer(void *arg) {
  unsigned seed = (unsigned)(size_t)arg * 7919u + 1u;
  ipcref_buf *held[HELD];
  ipcref_weak *weak[HELD];
  long i;
  int k;
  memset(held, 0, sizeof held);
  memset(weak, 0, sizeof weak);
  for (i = 0; i < ops_per_thread; i++) {
    unsigned r = next_rand(&seed);
    ipcref_buf *b = shared_bufs[r % BUFS];
    int slot = (int)((r >> 4) % HELD);
    switch ((r >> 9) % 4) {
    case 0: /* retain + release at once */
      ipcref_buf_release(ipcref_buf_retain(b));
      break;
    case 1: /* keep a reference for a while */
      ipcref_buf_release(held[slot]);
      held[slot] = ipcref_buf_retain(b);
      break;
    case 2: /* keep a weak reference for a while */
      ipcref_weak_release(weak[slot]);
      weak[slot] = ipcref_buf_downgrade(b);
      break;
    default: { /* upgrade a weak one: the main thread's reference lives */
      ipcref_buf *up;
      if (!weak[slot]) break;
      up = ipcref_weak_upgrade(weak[slot]);
      if (!up) abort();
      ((volatile char *)ipcref_buf_data(up))[0]; /* read the data */
      ipcref_buf_release(up);
    }
    }
  }
  for (k = 0; k < HELD; k++) {
    ipcref_buf_release(held[k]);
    ipcref_weak_release(weak[k]);
  }
  return NULL;
}

static void test_hammer(void) {
  pthread_t th[THREADS];
  int i;
  for (i = 0; i < BUFS; i++) {
    void *mem = calloc(1, 64);
    shared_bufs[i] = NULL;
    CHECK_EQ(ipcref_buf_wrap(mem, 64, count_free, &frees[i], &shared_bufs[i]),
             IPCREF_OK);
  }
  for (i = 0; i < THREADS; i++)
    CHECK_EQ(pthread_create(&th[i], NULL, hammer, (void *)(size_t)i), 0);
  for (i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  for (i = 0; i < BUFS; i++) {
    CHECK_EQ(ipcref_buf_strong_count(shared_bufs[i]), 1); /* exact */
    CHECK_EQ(ipcref_buf_weak_count(shared_bufs[i]), 0);
    CHECK_EQ(__atomic_load_n(&frees[i], __ATOMIC_RELAXED), 0);
    ipcref_buf_release(shared_bufs[i]);
    CHECK_EQ(__atomic_load_n(&frees[i], __ATOMIC_RELAXED), 1); /* once */
  }
}

/* The race of an upgrade against the last release. Each round the main
 * thread makes a buffer and a weak reference; the racer upgrades while the
 * main thread drops the last strong reference. Either the upgrade fails, or
 * it wins a reference whose data must still be alive until it lets go. */
static ipcref_weak *race_weak;
static int race_round; /* atomic: the round the racer should run */
static int race_done;  /* atomic: the round the racer finished */
static int race_freed; /* atomic: release callbacks this round */
static int race_wins, race_bad;

static void *racer(void *arg) {
  int round;
  (void)arg;
  for (round = 1;; round++) {
    ipcref_buf *up;
    int now;
    while ((now = __atomic_load_n(&race_round, __ATOMIC_ACQUIRE)) >= 0 &&
           now < round)
      sched_yield(); /* spin politely: valgrind runs one thread at a time */
    if (now < 0) break;
    up = ipcref_weak_upgrade(race_weak);
    if (up) {
      race_wins++;
      if (__atomic_load_n(&race_freed, __ATOMIC_ACQUIRE) != 0) race_bad++;
      if (((volatile unsigned char *)ipcref_buf_data(up))[0] != 0x5a)
        race_bad++;
      ipcref_buf_release(up);
    }
    __atomic_store_n(&race_done, round, __ATOMIC_RELEASE);
  }
  return NULL;
}

static void test_upgrade_races_last_release(void) {
  pthread_t th;
  long rounds = ops_per_thread / 20, r;
  int lost = 0;
  if (rounds < 100) rounds = 100;
  race_round = 0;
  race_done = 0;
  CHECK_EQ(pthread_create(&th, NULL, racer, NULL), 0);
  for (r = 1; r <= rounds; r++) {
    ipcref_buf *b = NULL;
    unsigned char *mem = (unsigned char *)malloc(8);
    mem[0] = 0x5a;
    __atomic_store_n(&race_freed, 0, __ATOMIC_RELAXED);
    if (ipcref_buf_wrap(mem, 8, count_free, &race_freed, &b) != IPCREF_OK)
      abort();
    race_weak = ipcref_buf_downgrade(b);
    __atomic_store_n(&race_round, (int)r, __ATOMIC_RELEASE);
    ipcref_buf_release(b); /* races the upgrade */
    while (__atomic_load_n(&race_done, __ATOMIC_ACQUIRE) < r) sched_yield();
    if (__atomic_load_n(&race_freed, __ATOMIC_ACQUIRE) != 1) lost++;
    ipcref_weak_release(race_weak);
  }
  __atomic_store_n(&race_round, -1, __ATOMIC_RELEASE);
  pthread_join(th, NULL);
  CHECK_EQ(race_bad, 0);
  CHECK_EQ(lost, 0); /* freed exactly once every round */
  printf("    %ld rounds, the upgrade won %d\n", rounds, race_wins);
}

int main(void) {
  ops_per_thread = harness_env_long("IPCREF_TEST_OPS", 1000000);
  RUN(test_hammer);
  RUN(test_upgrade_races_last_release);
  return harness_finish();
}
