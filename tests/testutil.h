/* Tiny test harness shared by every C/C++ test: named checks that report file:line on failure and
 * keep going, a summary line, and the exit code (0 only if every check passed). */
#ifndef QM_TESTUTIL_H
#define QM_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tu_checks_run;
static int tu_checks_failed;

#define CHECK(cond) tu_check((cond) != 0, #cond, __FILE__, __LINE__)
#define CHECK_MSG(cond, ...)                                                                       \
  do {                                                                                             \
    if (!tu_check((cond) != 0, #cond, __FILE__, __LINE__)) {                                       \
      fprintf(stderr, "    ");                                                                     \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
    }                                                                                              \
  } while (0)
#define CHECK_EQ(a, b)                                                                             \
  do {                                                                                             \
    long long tu_a = (long long)(a), tu_b = (long long)(b);                                        \
    if (!tu_check(tu_a == tu_b, #a " == " #b, __FILE__, __LINE__))                                \
      fprintf(stderr, "    got %lld, expected %lld\n", tu_a, tu_b);                                \
  } while (0)

static inline int tu_check(int ok, const char *expr, const char *file, int line) {
  tu_checks_run++;
  if (!ok) {
    tu_checks_failed++;
    fprintf(stderr, "FAIL %s:%d: %s\n", file, line, expr);
  }
  return ok;
}

/* Call at the end of main: prints "N passed, N failed" and returns the exit code. */
static inline int tu_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, tu_checks_run - tu_checks_failed, tu_checks_failed);
  return tu_checks_failed == 0 && tu_checks_run > 0 ? 0 : 1;
}

#endif
