/* A small test harness: CHECK records a failure and goes on, RUN runs one
 * test function, and finish() prints "N passed, N failed" (the line
 * tests/run.sh adds up) and gives the exit status. */
#ifndef IPCREF_TEST_HARNESS_H
#define IPCREF_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>

/* UNDER_ASAN: 1 in a build with AddressSanitizer (gcc or clang). */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static int harness_failures_in_test;
static int harness_passed, harness_failed;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      harness_failures_in_test++;                                              \
      printf("    %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);      \
    }                                                                          \
  } while (0)

/* CHECK that two integer expressions are equal, printing both. */
#define CHECK_EQ(a, b)                                                         \
  do {                                                                         \
    long long harness_a = (long long)(a), harness_b = (long long)(b);          \
    if (harness_a != harness_b) {                                              \
      harness_failures_in_test++;                                              \
      printf("    %s:%d: CHECK_EQ(%s, %s) failed: %lld != %lld\n", __FILE__,   \
             __LINE__, #a, #b, harness_a, harness_b);                          \
    }                                                                          \
  } while (0)

#define RUN(test)                                                              \
  do {                                                                         \
    harness_failures_in_test = 0;                                              \
    test();                                                                    \
    if (harness_failures_in_test) {                                            \
      harness_failed++;                                                        \
      printf("FAIL %s\n", #test);                                              \
    } else {                                                                   \
      harness_passed++;                                                        \
      printf("ok   %s\n", #test);                                              \
    }                                                                          \
    fflush(stdout);                                                            \
  } while (0)

static __attribute__((unused)) int harness_finish(void) {
  printf("%d passed, %d failed\n", harness_passed, harness_failed);
  return harness_failed ? 1 : 0;
}

/* An integer from the environment, or `fallback`. */
static __attribute__((unused)) long harness_env_long(const char *name,
                                                     long fallback) {
  const char *s = getenv(name);
  return s && *s ? strtol(s, NULL, 10) : fallback;
}

#endif
