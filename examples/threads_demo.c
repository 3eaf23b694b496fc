/* threads_demo: one buffer, four worker threads, no copies.
 *
 * The main thread fills a buffer and hands each worker its own strong
 * reference, then drops its own at once: the data lives exactly as long as
 * the slowest worker. A weak reference watches it die, and copy-on-write
 * shows when a write forces a copy. The counts are printed as they change.
 *
 *   cc -O2 -I. examples/threads_demo.c -o threads_demo -pthread */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define IPCREF_IMPLEMENTATION
#include "ipcref.h"

#define WORKERS 4
#define COUNT   (1u << 20) /* uint32 elements: 4 MiB */

typedef struct worker {
  pthread_t thread;
  int id;
  ipcref_buf *buf; /* this worker's own reference */
  uint64_t sum;
} worker;

static void on_free(void *user, void *data) {
  (void)user;
  printf("  data freed (by whichever thread let go last)\n");
  free(data);
}

static void *work(void *arg) {
  worker *w = (worker *)arg;
  const uint32_t *v = (const uint32_t *)ipcref_buf_data(w->buf);
  struct timespec nap = {0, 0};
  size_t i, per = COUNT / WORKERS;
  nap.tv_nsec = 2000000L * (w->id + 1); /* finish in a staggered order */
  for (i = (size_t)w->id * per; i < (size_t)(w->id + 1) * per; i++)
    w->sum += v[i];
  nanosleep(&nap, NULL);
  printf("  worker %d done (sum %llu), releasing; strong count was %zu\n",
         w->id, (unsigned long long)w->sum, ipcref_buf_strong_count(w->buf));
  ipcref_buf_release(w->buf);
  return NULL;
}

static ipcref_result demo(void) {
  worker workers[WORKERS];
  uint32_t *data = (uint32_t *)malloc(COUNT * sizeof(uint32_t));
  ipcref_buf *buf = NULL, *alive;
  ipcref_weak *watch;
  ipcref_result r;
  uint64_t total = 0;
  size_t i;
  int k;

  if (!data) return IPCREF_ENOMEM;
  for (i = 0; i < COUNT; i++) data[i] = (uint32_t)i;
  r = ipcref_buf_wrap(data, COUNT * sizeof(uint32_t), on_free, NULL, &buf);
  if (r != IPCREF_OK) {
    free(data);
    return r;
  }
  printf("made a %zu-byte buffer: strong %zu\n", ipcref_buf_size(buf),
         ipcref_buf_strong_count(buf));

  /* Copy-on-write while unique: no copy. */
  r = ipcref_buf_make_mut(&buf);
  printf("make_mut while unique: %s, same data: %s\n", ipcref_strerror(r),
         ipcref_buf_data(buf) == data ? "yes" : "no");

  watch = ipcref_buf_downgrade(buf);
  for (k = 0; k < WORKERS; k++) {
    workers[k].id = k;
    workers[k].sum = 0;
    workers[k].buf = ipcref_buf_retain(buf);
  }
  printf("handed out %d references: strong %zu, weak %zu\n", WORKERS,
         ipcref_buf_strong_count(buf), ipcref_buf_weak_count(buf));
  printf("get_mut while shared: %s\n",
         ipcref_buf_get_mut(buf) ? "granted (wrong!)" : "refused");
  for (k = 0; k < WORKERS; k++)
    if (pthread_create(&workers[k].thread, NULL, work, &workers[k]) != 0)
      abort();

  ipcref_buf_release(buf); /* the producer lets go at once */
  printf("producer released its reference; the workers keep the data\n");

  for (k = 0; k < WORKERS; k++) {
    pthread_join(workers[k].thread, NULL);
    total += workers[k].sum;
  }
  alive = ipcref_weak_upgrade(watch);
  printf("after all workers: weak upgrade %s\n",
         alive ? "succeeded (wrong!)" : "fails: the data is gone");
  ipcref_weak_release(watch);
  printf("sum of 0..%u = %llu (expected %llu)\n", COUNT - 1,
         (unsigned long long)total,
         (unsigned long long)COUNT * (COUNT - 1) / 2);
  return total == (uint64_t)COUNT * (COUNT - 1) / 2 && !alive ? IPCREF_OK
                                                              : IPCREF_ERANGE;
}

int main(void) {
  ipcref_result r = demo();
  if (r != IPCREF_OK) {
    fprintf(stderr, "threads_demo: %s\n", ipcref_strerror(r));
    return 1;
  }
  return 0;
}
