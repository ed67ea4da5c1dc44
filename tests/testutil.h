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

/* ---- helpers shared by the api and stress tests (added for issue 2) ---------------------------
 * A deterministic PRNG (fixed seeds, never time), a position- and seed-dependent fill pattern so a
 * byte that moved or was overwritten by another object is caught, and the resident set size. */
#include <stdint.h>
#include <unistd.h>

/* splitmix64: one 64-bit word of state, good enough to pick sizes and slots. */
static inline uint64_t tu_rand(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Byte i of an object filled with seed s; every position and every seed gives a different stream. */
static inline unsigned char tu_pattern_byte(uint64_t seed, size_t i) {
  uint64_t w = (seed ^ ((uint64_t)(i >> 3) * 0x9E3779B97F4A7C15ull)) * 0xD6E8FEB86659FD93ull;
  return (unsigned char)(w >> ((i & 7) * 8));
}

static inline void tu_fill(void *p, size_t n, uint64_t seed) {
  unsigned char *b = (unsigned char *)p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) { /* whole words at a time: stress tests fill megabytes */
    uint64_t w = (seed ^ ((uint64_t)(i >> 3) * 0x9E3779B97F4A7C15ull)) * 0xD6E8FEB86659FD93ull;
    memcpy(b + i, &w, 8);
  }
  for (; i < n; i++) b[i] = tu_pattern_byte(seed, i);
}

/* Returns the first offset that does not hold the pattern, or -1 if all n bytes do. */
static inline long tu_verify(const void *p, size_t n, uint64_t seed) {
  const unsigned char *b = (const unsigned char *)p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = (seed ^ ((uint64_t)(i >> 3) * 0x9E3779B97F4A7C15ull)) * 0xD6E8FEB86659FD93ull, got;
    memcpy(&got, b + i, 8);
    if (got != w) break;
  }
  for (; i < n; i++)
    if (b[i] != tu_pattern_byte(seed, i)) return (long)i;
  return -1;
}

/* Resident set size of this process in bytes, from /proc/self/statm (0 if unreadable). */
static inline size_t tu_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long vm = 0, rss = 0;
  if (!f) return 0;
  if (fscanf(f, "%lu %lu", &vm, &rss) != 2) rss = 0;
  fclose(f);
  return (size_t)rss * (size_t)sysconf(_SC_PAGESIZE);
}

#endif
