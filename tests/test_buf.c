/* The buffer layer: lifecycle, weak references, unique-owner mutation,
 * copy-on-write, adopted memory, saturation, and every wrong argument.
 * Every allocation goes through a counting allocator, so each test can
 * prove exactly when memory is freed. */
#define _GNU_SOURCE /* the sharing layer needs GNU declarations */
#include <stdint.h>
#include <string.h>

#include "harness.h"

#include "counting_alloc.h"
#define IPCREF_TEST_HOOKS
#define IPCREF_IMPLEMENTATION
#include "../ipcref.h"

/* An error hook that records what it heard. */
static int hook_calls;
static ipcref_result hook_last;
static void record_error(void *user, ipcref_result code, const char *msg) {
  (void)user;
  (void)msg;
  hook_calls++;
  hook_last = code;
}
static const ipcref_error_hook recorder = {record_error, NULL};

static void test_lifecycle_counts(void) {
  /* A tensor, a view of it, a view of the view: each holds a reference. */
  ipcref_buf *tensor = NULL, *view, *view2;
  long before = live_allocs;
  CHECK_EQ(ipcref_buf_new(4096, &tensor), IPCREF_OK);
  CHECK_EQ(live_allocs, before + 1);
  CHECK_EQ(ipcref_buf_strong_count(tensor), 1);
  view = ipcref_buf_retain(tensor);
  CHECK(view == tensor);
  CHECK_EQ(ipcref_buf_strong_count(tensor), 2);
  view2 = ipcref_buf_retain(view);
  CHECK_EQ(ipcref_buf_strong_count(tensor), 3);
  ipcref_buf_release(tensor);
  CHECK_EQ(ipcref_buf_strong_count(view), 2);
  ipcref_buf_release(view);
  CHECK_EQ(ipcref_buf_strong_count(view2), 1);
  CHECK_EQ(live_allocs, before + 1); /* still alive */
  ipcref_buf_release(view2);
  CHECK_EQ(live_allocs, before); /* freed exactly with the last */
}

static void test_new_layout(void) {
  ipcref_buf *b = NULL;
  size_t aligns[] = {1, 2, 8, 64, 128, 4096, 65536};
  size_t i;
  CHECK_EQ(ipcref_buf_new(100, &b), IPCREF_OK);
  CHECK_EQ(ipcref_buf_size(b), 100);
  CHECK(((uintptr_t)ipcref_buf_data(b) & 63) == 0);
  memset(ipcref_buf_get_mut(b), 0xab, 100); /* the whole range is ours */
  ipcref_buf_release(b);
  for (i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
    b = NULL;
    CHECK_EQ(ipcref_buf_new_aligned(33, aligns[i], &b), IPCREF_OK);
    CHECK(((uintptr_t)ipcref_buf_data(b) & (aligns[i] - 1)) == 0);
    memset(ipcref_buf_get_mut(b), 1, 33);
    ipcref_buf_release(b);
  }
  /* Zero bytes is a valid buffer with a valid (unusable) pointer. */
  b = NULL;
  CHECK_EQ(ipcref_buf_new(0, &b), IPCREF_OK);
  CHECK(b != NULL && ipcref_buf_data(b) != NULL);
  CHECK_EQ(ipcref_buf_size(b), 0);
  ipcref_buf_release(b);
}

static void test_weak_upgrade(void) {
  ipcref_buf *b = NULL, *up;
  ipcref_weak *w, *w2;
  long before = live_allocs;
  CHECK_EQ(ipcref_buf_new(64, &b), IPCREF_OK);
  w = ipcref_buf_downgrade(b);
  CHECK(w != NULL);
  CHECK_EQ(ipcref_buf_weak_count(b), 1);
  w2 = ipcref_buf_downgrade(b);
  CHECK_EQ(ipcref_buf_weak_count(b), 2);
  ipcref_weak_release(w2);
  CHECK_EQ(ipcref_buf_weak_count(b), 1);
  /* Before the last release: upgrade gives a strong reference. */
  up = ipcref_weak_upgrade(w);
  CHECK(up == b);
  CHECK_EQ(ipcref_buf_strong_count(b), 2);
  ipcref_buf_release(up);
  ipcref_buf_release(b);
  /* After it: the data is gone, the header is not. */
  CHECK_EQ(live_allocs, before + 1);
  CHECK(ipcref_weak_upgrade(w) == NULL);
  CHECK(ipcref_weak_upgrade(w) == NULL);
  ipcref_weak_release(w);
  CHECK_EQ(live_allocs, before);
}

static int wrap_calls;
static void *wrap_seen;
static void wrap_release(void *user, void *data) {
  wrap_calls++;
  wrap_seen = data;
  free(data);
  *(int *)user += 1;
}

static void test_weak_keeps_header_not_data(void) {
  /* With adopted memory the moment the data dies is visible: the release
   * callback runs at the last strong release, not at the last weak one. */
  int user_calls = 0;
  char *mem = (char *)malloc(32);
  ipcref_buf *b = NULL;
  ipcref_weak *w;
  wrap_calls = 0;
  CHECK_EQ(ipcref_buf_wrap(mem, 32, wrap_release, &user_calls, &b), IPCREF_OK);
  w = ipcref_buf_downgrade(b);
  ipcref_buf_release(b);
  CHECK_EQ(wrap_calls, 1);
  CHECK_EQ(user_calls, 1);
  CHECK(wrap_seen == mem);
  CHECK(ipcref_weak_upgrade(w) == NULL);
  ipcref_weak_release(w);
  CHECK_EQ(wrap_calls, 1);
}

static void test_get_mut(void) {
  ipcref_buf *b = NULL, *other;
  ipcref_weak *w;
  CHECK_EQ(ipcref_buf_new(16, &b), IPCREF_OK);
  CHECK(ipcref_buf_get_mut(b) == ipcref_buf_data(b));
  CHECK(ipcref_buf_is_unique(b));
  other = ipcref_buf_retain(b);
  CHECK(ipcref_buf_get_mut(b) == NULL); /* refused while shared */
  CHECK(!ipcref_buf_is_unique(b));
  ipcref_buf_release(other);
  CHECK(ipcref_buf_get_mut(b) != NULL); /* granted when unique again */
  w = ipcref_buf_downgrade(b);
  CHECK(ipcref_buf_get_mut(b) == NULL); /* a weak one could upgrade */
  ipcref_weak_release(w);
  CHECK(ipcref_buf_get_mut(b) != NULL);
  ipcref_buf_release(b);
}

static void test_make_mut(void) {
  ipcref_buf *b = NULL, *keep, *orig;
  ipcref_weak *w;
  long allocs;
  CHECK_EQ(ipcref_buf_new_aligned(8, 256, &b), IPCREF_OK);
  memcpy(ipcref_buf_get_mut(b), "abcdefg", 8);

  /* Unique: no copy, no allocation. */
  orig = b;
  allocs = total_allocs;
  CHECK_EQ(ipcref_buf_make_mut(&b), IPCREF_OK);
  CHECK(b == orig);
  CHECK_EQ(total_allocs, allocs);

  /* Shared: a copy, independent of the original. */
  keep = ipcref_buf_retain(b);
  CHECK_EQ(ipcref_buf_make_mut(&b), IPCREF_OK);
  CHECK(b != keep);
  CHECK_EQ(total_allocs, allocs + 1);
  CHECK_EQ(ipcref_buf_strong_count(keep), 1); /* ours was released */
  CHECK_EQ(ipcref_buf_size(b), 8);
  CHECK(((uintptr_t)ipcref_buf_data(b) & 255) == 0); /* alignment kept */
  CHECK(memcmp(ipcref_buf_data(b), "abcdefg", 8) == 0);
  ((char *)ipcref_buf_get_mut(b))[0] = 'X';
  CHECK(((char *)ipcref_buf_data(keep))[0] == 'a');
  CHECK(((char *)ipcref_buf_data(b))[0] == 'X');
  ipcref_buf_release(keep);

  /* Unique strong but a weak one: copies, and the weak one sees the old
   * buffer die (as Arc::make_mut dissociates weak pointers). */
  w = ipcref_buf_downgrade(b);
  orig = b;
  CHECK_EQ(ipcref_buf_make_mut(&b), IPCREF_OK);
  CHECK(b != orig);
  CHECK(ipcref_weak_upgrade(w) == NULL);
  ipcref_weak_release(w);

  /* Out of memory: nothing changes. */
  keep = ipcref_buf_retain(b);
  orig = b;
  fail_next_alloc = 1;
  CHECK_EQ(ipcref_buf_make_mut(&b), IPCREF_ENOMEM);
  CHECK(b == orig);
  CHECK_EQ(ipcref_buf_strong_count(b), 2);
  ipcref_buf_release(keep);
  ipcref_buf_release(b);
}

static void test_make_mut_wrapped(void) {
  int user_calls = 0;
  char *mem = (char *)malloc(4);
  ipcref_buf *b = NULL, *keep;
  wrap_calls = 0;
  memcpy(mem, "xyz", 4);
  CHECK_EQ(ipcref_buf_wrap(mem, 4, wrap_release, &user_calls, &b), IPCREF_OK);
  keep = ipcref_buf_retain(b);
  CHECK_EQ(ipcref_buf_make_mut(&b), IPCREF_OK);
  CHECK(memcmp(ipcref_buf_data(b), "xyz", 4) == 0);
  CHECK_EQ(wrap_calls, 0); /* the original is still held */
  ipcref_buf_release(keep);
  CHECK_EQ(wrap_calls, 1);
  ipcref_buf_release(b);
  CHECK_EQ(wrap_calls, 1);
}

/* Device memory: the buffer says where it lives; bad devices are refused
 * with nothing adopted; host buffers and NULL say CPU 0. */
static void test_wrap_device(void) {
  static char mem[64];
  ipcref_device dev = {IPCREF_DEVICE_ROCM, 3}, bad = {0, 0}, neg = {2, -1};
  ipcref_buf *b = NULL, *h = NULL;
  CHECK_EQ(ipcref_buf_wrap_device(mem, sizeof mem, bad, NULL, NULL, &b),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_wrap_device(mem, sizeof mem, neg, NULL, NULL, &b),
           IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_wrap_device(mem, sizeof mem, dev, NULL, NULL, NULL),
           IPCREF_EINVAL);
  CHECK(b == NULL);
  CHECK_EQ(ipcref_buf_wrap_device(mem, sizeof mem, dev, NULL, NULL, &b),
           IPCREF_OK);
  CHECK_EQ(ipcref_buf_device(b).type, IPCREF_DEVICE_ROCM);
  CHECK_EQ(ipcref_buf_device(b).id, 3);
  CHECK(ipcref_buf_data(b) == mem);
  h = ipcref_buf_retain(b);
  CHECK_EQ(ipcref_buf_make_mut(&h), IPCREF_EDEVICE); /* no host copy */
  CHECK(h == b);
  ipcref_buf_release(h);
  ipcref_buf_release(b);
  CHECK_EQ(ipcref_buf_new(8, &h), IPCREF_OK);
  CHECK_EQ(ipcref_buf_device(h).type, IPCREF_DEVICE_CPU);
  CHECK_EQ(ipcref_buf_device(h).id, 0);
  ipcref_buf_release(h);
  CHECK_EQ(ipcref_buf_device(NULL).type, IPCREF_DEVICE_CPU);
  CHECK(strcmp(ipcref_strerror(IPCREF_EDEVICE), "unknown error") != 0);
}

/* A release that only counts (the memory below is no allocation). */
static void count_release(void *user, void *data) {
  (void)data;
  *(int *)user += 1;
}

/* Memory must end inside the address space (its last byte, and the
 * address past it), or a view's address arithmetic would wrap: ERANGE,
 * nothing adopted, for host and device memory alike. Nothing here is
 * dereferenced. */
static void test_wrap_address_space(void) {
  static const size_t sizes[3] = {100, 16, SIZE_MAX / 2};
  ipcref_device dev = {IPCREF_DEVICE_CUDA, 0};
  void *top = (void *)(UINTPTR_MAX - 15); /* the last 16 addresses */
  ipcref_buf *b;
  long before = live_allocs;
  int calls = 0, i;
  for (i = 0; i < 6; i++) {
    size_t size = sizes[i % 3];
    b = NULL;
    CHECK_EQ(i < 3 ? ipcref_buf_wrap(top, size, count_release, &calls, &b)
                   : ipcref_buf_wrap_device(top, size, dev, count_release,
                                            &calls, &b),
             IPCREF_ERANGE);
    CHECK(b == NULL);
    ipcref_buf_release(b); /* one made by mistake */
  }
  CHECK_EQ(calls, 0);
  CHECK_EQ(live_allocs, before);
  /* Up to the last address: fine. */
  CHECK_EQ(ipcref_buf_wrap(top, 15, count_release, &calls, &b), IPCREF_OK);
  CHECK_EQ(ipcref_buf_size(b), 15);
  ipcref_buf_release(b);
  CHECK_EQ(calls, 1);
  CHECK_EQ(ipcref_buf_wrap_device((void *)UINTPTR_MAX, 0, dev, NULL, NULL, &b),
           IPCREF_OK);
  ipcref_buf_release(b);
  CHECK_EQ(live_allocs, before);
}

static void test_wrap_exactly_once(void) {
  int user_calls = 0, i;
  char *mem = (char *)malloc(8);
  ipcref_buf *b = NULL, *refs[10];
  wrap_calls = 0;
  CHECK_EQ(ipcref_buf_wrap(mem, 8, wrap_release, &user_calls, &b), IPCREF_OK);
  CHECK(ipcref_buf_data(b) == mem);
  CHECK_EQ(ipcref_buf_size(b), 8);
  for (i = 0; i < 10; i++) refs[i] = ipcref_buf_retain(b);
  for (i = 0; i < 10; i++) ipcref_buf_release(refs[i]);
  CHECK_EQ(wrap_calls, 0);
  ipcref_buf_release(b);
  CHECK_EQ(wrap_calls, 1);
  CHECK_EQ(user_calls, 1);

  /* A NULL release: borrowed memory, nothing is called. */
  {
    static char borrowed[4];
    b = NULL;
    CHECK_EQ(ipcref_buf_wrap(borrowed, 4, NULL, NULL, &b), IPCREF_OK);
    ipcref_buf_release(b);
  }
  /* Header allocation fails: nothing adopted, no call. */
  mem = (char *)malloc(8);
  b = NULL;
  fail_next_alloc = 1;
  CHECK_EQ(ipcref_buf_wrap(mem, 8, wrap_release, &user_calls, &b),
           IPCREF_ENOMEM);
  CHECK(b == NULL);
  CHECK_EQ(wrap_calls, 1);
  free(mem);
}

static void test_saturation(void) {
  ipcref_buf *b = NULL;
  int i;
  long before = live_allocs;
  const ipcref_error_hook *prev = ipcref_set_error_hook(&recorder);
  hook_calls = 0;
  CHECK_EQ(ipcref_buf_new(8, &b), IPCREF_OK);
  ipcref_test_set_counts(b, INT32_MAX - 1, 1);
  ipcref_buf_retain(b); /* reaches INT32_MAX */
  CHECK_EQ(hook_calls, 0);
  CHECK_EQ(ipcref_buf_strong_count(b), INT32_MAX);
  ipcref_buf_retain(b); /* would wrap: saturates */
  CHECK_EQ(hook_calls, 1);
  CHECK_EQ(hook_last, IPCREF_ESATURATED);
  CHECK(ipcref_buf_strong_count(b) == SIZE_MAX);
  /* A saturated count never comes back down to a free. */
  for (i = 0; i < 1000; i++) ipcref_buf_release(b);
  CHECK(ipcref_buf_strong_count(b) == SIZE_MAX);
  CHECK_EQ(live_allocs, before + 1);
  CHECK(!ipcref_buf_is_unique(b));
  CHECK(ipcref_buf_get_mut(b) == NULL);
  CHECK(ipcref_weak_upgrade(ipcref_buf_downgrade(b)) == b); /* pinned */
  CHECK_EQ(hook_calls, 1); /* reported once, then quiet */

  /* The weak count saturates the same way. */
  ipcref_test_set_counts(b, 1, INT32_MAX);
  ipcref_buf_downgrade(b);
  CHECK_EQ(hook_calls, 2);
  CHECK_EQ(hook_last, IPCREF_ESATURATED);
  CHECK(ipcref_buf_weak_count(b) == SIZE_MAX);

  /* The test reclaims the leak itself, so leak checkers stay clean. */
  ipcref_test_set_counts(b, 1, 1);
  ipcref_buf_release(b);
  CHECK_EQ(live_allocs, before);
  ipcref_set_error_hook(prev);
}

static void test_release_on_dead(void) {
  ipcref_buf *b = NULL;
  ipcref_weak *w;
  long before = live_allocs;
  const ipcref_error_hook *prev = ipcref_set_error_hook(&recorder);
  hook_calls = 0;
  CHECK_EQ(ipcref_buf_new(8, &b), IPCREF_OK);
  w = ipcref_buf_downgrade(b); /* keeps the header readable */
  ipcref_buf_release(b);
  CHECK_EQ(ipcref_buf_strong_count(b), 0);
  ipcref_buf_release(b); /* a double release */
  CHECK_EQ(hook_calls, 1);
  CHECK_EQ(hook_last, IPCREF_EDEAD);
  ipcref_buf_release(b); /* and a third: reported, still nothing freed */
  CHECK_EQ(hook_calls, 2);
  CHECK_EQ(live_allocs, before + 1);
  CHECK_EQ(ipcref_buf_strong_count(b), 0); /* stays dead */
  CHECK(ipcref_weak_upgrade(w) == NULL);   /* and cannot be revived */
  ipcref_buf_retain(b);                    /* a retain on it: reported */
  CHECK_EQ(hook_calls, 3);
  CHECK_EQ(hook_last, IPCREF_EDEAD);
  CHECK_EQ(ipcref_buf_strong_count(b), 0);
  ipcref_weak_release(w);
  CHECK_EQ(live_allocs, before);
  ipcref_set_error_hook(prev);
}

static void test_error_hook_install(void) {
  static const ipcref_error_hook other = {record_error, NULL};
  const ipcref_error_hook *prev = ipcref_set_error_hook(&recorder);
  CHECK(ipcref_set_error_hook(&other) == &recorder);
  CHECK(ipcref_set_error_hook(prev) == &other);
}

static void *arena_alloc(void *user, size_t n) {
  long *calls = (long *)user;
  calls[0]++;
  calls[2] += (long)n;
  return malloc(n);
}
static void arena_free(void *user, void *p, size_t n) {
  long *calls = (long *)user;
  calls[1]++;
  calls[2] -= (long)n;
  free(p);
}
static void *null_alloc(void *user, size_t n) {
  (void)user;
  (void)n;
  return NULL;
}

static void test_allocator_in(void) {
  long calls[3] = {0, 0, 0}; /* allocs, frees, live bytes */
  ipcref_allocator a = {arena_alloc, arena_free, NULL};
  ipcref_allocator broken = {NULL, arena_free, NULL};
  ipcref_allocator empty = {null_alloc, arena_free, NULL};
  ipcref_buf *b = NULL, *keep;
  a.user = calls;
  CHECK_EQ(ipcref_buf_new_in(&a, 1000, 128, &b), IPCREF_OK);
  CHECK(((uintptr_t)ipcref_buf_data(b) & 127) == 0);
  CHECK_EQ(calls[0], 1);
  keep = ipcref_buf_retain(b);
  CHECK_EQ(ipcref_buf_make_mut(&b), IPCREF_OK); /* copy: same allocator */
  CHECK_EQ(calls[0], 2);
  ipcref_buf_release(keep);
  ipcref_buf_release(b);
  CHECK_EQ(calls[1], 2);
  CHECK_EQ(calls[2], 0); /* sizes handed back match */
  b = NULL;
  CHECK_EQ(ipcref_buf_new_in(&broken, 10, 64, &b), IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_new_in(&empty, 10, 64, &b), IPCREF_ENOMEM);
  CHECK(b == NULL);
  CHECK_EQ(ipcref_buf_new_in(NULL, 10, 64, &b), IPCREF_OK); /* default */
  ipcref_buf_release(b);
}

static void test_bad_arguments(void) {
  ipcref_buf *b = NULL, *sentinel = (ipcref_buf *)&b;
  ipcref_buf *out = sentinel;
  long before = live_allocs;
  CHECK_EQ(ipcref_buf_new(16, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_new(SIZE_MAX, &out), IPCREF_ERANGE);
  CHECK_EQ(ipcref_buf_new(SIZE_MAX - 100, &out), IPCREF_ERANGE);
  CHECK_EQ(ipcref_buf_new((size_t)PTRDIFF_MAX + 1, &out), IPCREF_ERANGE);
  CHECK_EQ(ipcref_buf_new_aligned(16, 0, &out), IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_new_aligned(16, 3, &out), IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_new_aligned(16, 96, &out), IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_new_aligned(16, (size_t)1 << 63, &out), IPCREF_ERANGE);
  CHECK_EQ(ipcref_buf_new_aligned(16, (size_t)1 << 62, &out), IPCREF_ENOMEM);
  CHECK_EQ(ipcref_buf_new_aligned(16, 64, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_new_in(NULL, SIZE_MAX, 64, &out), IPCREF_ERANGE);
  CHECK_EQ(ipcref_buf_wrap(NULL, 10, NULL, NULL, &out), IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_wrap(&b, 8, NULL, NULL, NULL), IPCREF_EINVAL);
  CHECK_EQ(ipcref_buf_wrap(&b, SIZE_MAX, NULL, NULL, &out), IPCREF_ERANGE);
  fail_next_alloc = 1;
  CHECK_EQ(ipcref_buf_new(16, &out), IPCREF_ENOMEM);
  CHECK(out == sentinel); /* untouched on every error */
  CHECK_EQ(live_allocs, before);

  CHECK_EQ(ipcref_buf_make_mut(NULL), IPCREF_EINVAL);
  b = NULL;
  CHECK_EQ(ipcref_buf_make_mut(&b), IPCREF_EINVAL);
  CHECK(ipcref_buf_retain(NULL) == NULL);
  ipcref_buf_release(NULL);
  CHECK(ipcref_buf_data(NULL) == NULL);
  CHECK_EQ(ipcref_buf_size(NULL), 0);
  CHECK_EQ(ipcref_buf_strong_count(NULL), 0);
  CHECK_EQ(ipcref_buf_weak_count(NULL), 0);
  CHECK(!ipcref_buf_is_unique(NULL));
  CHECK(ipcref_buf_get_mut(NULL) == NULL);
  CHECK(ipcref_buf_downgrade(NULL) == NULL);
  CHECK(ipcref_weak_upgrade(NULL) == NULL);
  ipcref_weak_release(NULL);
  CHECK_EQ(live_allocs, before);
}

static void test_strerror(void) {
  int code;
  for (code = 0; code >= IPCREF_ENOTSUP; code--) { /* the last code */
    const char *s = ipcref_strerror((ipcref_result)code);
    CHECK(s != NULL && strcmp(s, "unknown error") != 0);
  }
  CHECK(strcmp(ipcref_strerror((ipcref_result)-1000), "unknown error") == 0);
  CHECK(strcmp(ipcref_strerror((ipcref_result)5), "unknown error") == 0);
}

int main(void) {
  RUN(test_lifecycle_counts);
  RUN(test_new_layout);
  RUN(test_weak_upgrade);
  RUN(test_weak_keeps_header_not_data);
  RUN(test_get_mut);
  RUN(test_make_mut);
  RUN(test_make_mut_wrapped);
  RUN(test_wrap_exactly_once);
  RUN(test_wrap_device);
  RUN(test_wrap_address_space);
  RUN(test_saturation);
  RUN(test_release_on_dead);
  RUN(test_error_hook_install);
  RUN(test_allocator_in);
  RUN(test_bad_arguments);
  RUN(test_strerror);
  CHECK_EQ(live_allocs, 0);
  return harness_finish() || live_allocs != 0;
}
