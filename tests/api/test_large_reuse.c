/* Large blocks freed and asked for again, in both builds (api-large_reuse, hardened-api-large_reuse).
 * The hardened build moves a freed large block's pages to a shadow mapping and back when its
 * addresses are handed out again (src/harden_park.c); these checks hold for the default build too:
 *   - a block of the size just freed reuses its pages: touching them all takes few page faults
 *     (a move back that lost the pages would fault on every one);
 *   - calloc of a block whose pages held data, parked or released, reads as zero;
 *   - after a working set of large blocks turns over and everything is freed and trimmed, the
 *     resident set is back near where it started (pages left in a shadow would stay resident);
 *   - an aligned block (1 MiB at 1 MiB) freed and asked for again, after malloc_trim released the
 *     heap, reuses the pages just freed: a freed block that fits the next request only because its
 *     start is aligned is found, and no fresh pages are faulted in on each turn. */
#include <malloc.h>
#include <stdint.h>
#include <sys/resource.h>

#include "../testutil.h"

#define MIB ((size_t)1 << 20)

static long minor_faults(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

static void touch(char *p, size_t n, char value) {
  for (size_t at = 0; at < n; at += 4096) p[at] = value;
}

static size_t zero_failures(const char *p, size_t n) {
  size_t bad = 0;
  for (size_t at = 0; at < n; at++) bad += p[at] != 0;
  return bad;
}

int main(void) {
  /* Reuse without page faults. */
  size_t n = 16 * MIB;
  char *a = malloc(n);
  CHECK(a != NULL);
  touch(a, n, 1);
  free(a);
  long before = minor_faults();
  char *b = malloc(n);
  CHECK(b != NULL);
  touch(b, n, 2);
  long faults = minor_faults() - before;
  CHECK_MSG(faults < (long)(n / 4096 / 8), "a 16 MiB block allocated again after a free took %ld page faults to touch (%zu pages)",
            faults, n / 4096);

  /* calloc over dirty pages, parked (just freed) and released (trimmed). */
  memset(b, 0xff, n);
  free(b);
  char *c = calloc(1, n);
  CHECK(c != NULL);
  CHECK_MSG(zero_failures(c, n) == 0, "calloc(16 MiB) after a dirty free: %zu bytes not zero", zero_failures(c, n));
  memset(c, 0xee, n);
  free(c);
  malloc_trim(0);
  char *d = calloc(1, n);
  CHECK(d != NULL);
  CHECK_MSG(zero_failures(d, n) == 0, "calloc(16 MiB) after a dirty free and malloc_trim: %zu bytes not zero", zero_failures(d, n));
  free(d);
  malloc_trim(0);

  /* A working set of three blocks of 5 to 25 MiB turning over, then everything given back. */
  size_t start = tu_rss_bytes();
  uint64_t seed = 42;
  char *live[3] = {NULL, NULL, NULL};
  size_t sizes[3] = {0, 0, 0}, peak = 0;
  for (int i = 0; i < 120; i++) {
    int k = (int)(tu_rand(&seed) % 3);
    free(live[k]);
    sizes[k] = (5 + tu_rand(&seed) % 21) * MIB;
    live[k] = malloc(sizes[k]);
    CHECK(live[k] != NULL);
    touch(live[k], sizes[k], (char)i);
    size_t rss = tu_rss_bytes();
    if (rss > peak) peak = rss;
  }
  for (int k = 0; k < 3; k++) free(live[k]);
  malloc_trim(0);
  size_t end = tu_rss_bytes();
  CHECK_MSG(end < start + 8 * MIB, "resident after freeing and trimming: %zu MiB, at the start %zu MiB (peak %zu MiB)",
            end / MIB, start / MIB, peak / MIB);
  /* Three blocks of at most 25 MiB and the free ones kept for reuse: never more than twice that. */
  CHECK_MSG(peak < start + 150 * MIB, "peak resident %zu MiB with three blocks of at most 25 MiB live", peak / MIB);

  /* Aligned blocks in a loop after the heap was released: each turn may reuse the block just freed
   * (its start is aligned, though it is shorter than a worst case that needs room for any start).
   * Taking fresh pages each turn faults in all 256 pages of 1 MiB; reuse, almost none. */
  for (int i = 0; i < 4; i++) malloc_trim(0);
  long aligned_faults = 0;
  size_t aligned_start = tu_rss_bytes();
  for (int i = 0; i < 64; i++) {
    char *p = aligned_alloc(MIB, MIB);
    CHECK(p != NULL && (uintptr_t)p % MIB == 0);
    long f0 = minor_faults();
    touch(p, MIB, (char)i);
    if (i >= 2) aligned_faults += minor_faults() - f0; /* the first turns fault in their pages */
    free(p);
  }
  size_t aligned_end = tu_rss_bytes();
  CHECK_MSG(aligned_faults < 4 * 256, "62 turns of aligned_alloc(1 MiB, 1 MiB) + free after malloc_trim faulted in %ld pages (fresh pages each turn: %d)",
            aligned_faults, 62 * 256);
  CHECK_MSG(aligned_end < aligned_start + 8 * MIB, "resident grew from %zu to %zu MiB over 64 turns of an aligned 1 MiB block",
            aligned_start / MIB, aligned_end / MIB);
  return tu_summary("api-large_reuse");
}
