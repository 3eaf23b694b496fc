/* The allocator the tests give the library: it counts, so a test can prove
 * exactly when memory is freed (and that nothing leaks), and it can be told
 * to fail. Include it before ipcref.h: it defines IPCREF_MALLOC, _REALLOC
 * and _FREE. */
#ifndef IPCREF_TEST_COUNTING_ALLOC_H
#define IPCREF_TEST_COUNTING_ALLOC_H

#include <stdlib.h>

static long live_allocs_raw; /* allocations not yet freed */
static long total_allocs;    /* allocations ever made */
static int fail_next_alloc;  /* nonzero: the next allocation returns NULL */
static int fail_alloc_in;    /* > 0: the allocation that brings it to 0 fails */

static int counting_should_fail(void) {
  if (fail_next_alloc) {
    fail_next_alloc = 0;
    return 1;
  }
  return fail_alloc_in > 0 && --fail_alloc_in == 0;
}

static void *counting_malloc(size_t n) {
  void *p;
  if (counting_should_fail()) return NULL;
  p = malloc(n);
  if (p) live_allocs_raw++, total_allocs++;
  return p;
}

static __attribute__((unused)) void *counting_realloc(void *p, size_t n) {
  void *q;
  if (counting_should_fail()) return NULL;
  q = realloc(p, n);
  if (!p && q) live_allocs_raw++, total_allocs++; /* realloc(NULL) allocates */
  return q;
}

static void counting_free(void *p) {
  if (p) live_allocs_raw--;
  free(p);
}

/* What is still allocated, once the quarantine (IPCREF_CHECKED keeps freed
 * buffers there a while) has handed back what it holds. */
#define live_allocs (ipcref_quarantine_flush(), live_allocs_raw)

#define IPCREF_MALLOC(n)     counting_malloc(n)
#define IPCREF_REALLOC(p, n) counting_realloc(p, n)
#define IPCREF_FREE(p)       counting_free(p)

#endif
