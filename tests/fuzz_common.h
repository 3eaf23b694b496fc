/* What the libFuzzer targets (tests/fuzz_*.c, run by tests/fuzz.sh)
 * share: a trace for replaying one input, a reader of its bytes, the
 * abort that reports a finding, the count of open fds, the reclaim that
 * stands for a consumer's death (sharing targets), and the seed corpus's
 * files.
 *
 * Include after ipcref.h (with its implementation), having defined
 * FUZZ_NAME, the target's program name ("fuzz_view"), and FUZZ_TRACE_ENV,
 * the variable that turns the trace on ("FUZZ_VIEW_TRACE"). */
#ifndef IPCREF_TEST_FUZZ_COMMON_H
#define IPCREF_TEST_FUZZ_COMMON_H

#include <dirent.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_FN static __attribute__((unused))

/* FUZZ_TRACE_ENV=1 in the environment: tr() prints to stderr (replaying
 * one input: ./fuzz_view crash-...). */
static int tracing = -1;

FUZZ_FN void tr(const char *fmt, ...) {
  va_list ap;
  if (tracing < 0) {
    const char *e = getenv(FUZZ_TRACE_ENV);
    tracing = e && *e && *e != '0';
  }
  if (!tracing) return;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
}

/* The input, read a byte at a time: zeros once it is used up. */
typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

FUZZ_FN uint8_t u8(reader *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}

/* A finding: says what, and aborts (libFuzzer keeps the input). */
FUZZ_FN void fail(const char *what) {
  fprintf(stderr, "%s: %s\n", FUZZ_NAME, what);
  abort();
}

/* Open fds, not the directory's own that counts them. */
FUZZ_FN int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int n = 0;
  if (!d) fail("cannot list /proc/self/fd");
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1;
}

#ifdef IPCREF__SHARING_IMPL
/* As if every consumer had died: every lease of the producer ends. */
FUZZ_FN void reclaim_all(ipcref_ctx *prod) {
  ipcref__ledger *l;
  size_t freed = 0;
  uint32_t s;
  IPCREF__LOCK(prod);
  for (l = prod->ledgers; l; l = l->next)
    for (s = 0; s < l->n; s++)
      if (l->leases[s].block) ipcref__lease_reclaim(prod, l, s, &freed);
  IPCREF__UNLOCK(prod);
  (void)ipcref_collect(prod);
}
#endif

/* Writes seed `name` (n bytes) into directory `dir`. */
FUZZ_FN void write_seed(const char *dir, const char *name,
                        const unsigned char *b, size_t n) {
  char path[512];
  FILE *f;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  f = fopen(path, "wb");
  if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0)
    fail("cannot write a seed");
}

#endif /* IPCREF_TEST_FUZZ_COMMON_H */
