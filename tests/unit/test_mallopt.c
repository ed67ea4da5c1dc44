/* mallopt (src/introspect.c) against glibc's contract (issue 11; the return values are glibc
 * 2.36's, measured): every parameter glibc accepts is accepted; M_TRIM_THRESHOLD sets retain_max,
 * and -1 (or any negative value: glibc reads it as a huge size_t) stops returning memory to the OS
 * on free, decay included; M_MMAP_THRESHOLD sets release_large (negative: never); M_MXFAST is
 * refused outside 0..160 as glibc refuses it; the parameters qmalloc has no concept for return 1
 * and change no option. Effects are checked in the page heap: what a large free releases, and
 * whether a block gets a mapping of its own. After M_TRIM_THRESHOLD -1 the decay never releases
 * (decay_ms never): 16 MiB freed stay backed through the page heap's decay called with a clock
 * two hours on (past the longest decay an option can set) and through ten of the background
 * releaser's wakeups, while the same free with the shortest decay (1 ms) is given back;
 * malloc_trim(0) still returns it. The one wait polls with a generous bound (60 s), never a timing
 * assumption. */
#include <limits.h>
#include <malloc.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "os.h"
#include "testutil.h"
#include "unit/heap_util.h"

/* Frees an 8 MiB block (a large span, below release_large) and returns the bytes released. */
static uint64_t released_by_large_free(void) {
  void *p = malloc(8u << 20);
  CHECK(p != NULL);
  memset(p, 1, 8u << 20);
  uint64_t before = heap().released_bytes_total;
  free(p);
  return heap().released_bytes_total - before;
}

#define TRIM_BLOCKS 16
#define TRIM_BLOCK_SIZE ((size_t)1 << 20) /* large spans, below release_large and retain_max */

/* Allocates, touches and frees 16 MiB of large blocks; returns released_bytes_total before the free. */
static uint64_t free_16_mib(void) { return free_large_blocks(TRIM_BLOCKS, TRIM_BLOCK_SIZE); }

/* Polls (10 ms steps, at most 60 s) until no free page is left backed, or until the background
 * releaser has woken `wakeups` more times (each wakeup runs the decay). Returns the bytes
 * released since `before`. */
static uint64_t released_after_waiting(uint64_t before, uint64_t wakeups) {
  uint64_t woken = release_wakeups();
  struct timespec tick = {0, 10 * 1000000L};
  for (int i = 0; i < 6000; i++) {
    pageheap_stats_t s = heap();
    if (s.free_backed_bytes == 0 || release_wakeups() - woken >= wakeups) return s.released_bytes_total - before;
    nanosleep(&tick, NULL);
  }
  return heap().released_bytes_total - before;
}

/* Runs the page heap's decay as if two hours had passed (past the longest decay an option can set):
 * waiting made deterministic. Returns the bytes it released. */
static uint64_t released_by_decay_two_hours_on(void) {
  uint64_t before = heap().released_bytes_total;
  pageheap_maybe_decay(os_now_ms() + 2 * 3600 * 1000);
  return heap().released_bytes_total - before;
}

/* decay_ms never (mallopt(M_TRIM_THRESHOLD, -1)): nothing goes back by decay; malloc_trim does it. */
static void test_trim_never(const long long *defaults) {
  memcpy(options_values, defaults, sizeof options_values[0] * OPTION_COUNT);
  /* The control: with the shortest decay the 16 MiB go back. */
  options_values[OPTION_DECAY_MS] = 1;
  options_values[OPTION_TCACHE_IDLE_MS] = 20; /* the releaser wakes every 10 ms (release.c) */
  uint64_t before = free_16_mib();
  released_by_decay_two_hours_on();
  /* (What the frees themselves released counts too: under emulation 1 ms passes between two of them.)
   * (Bits of free spans short of a whole kernel page stay backed under 64 KiB pages: less than a block.) */
  uint64_t released = heap().released_bytes_total - before;
  CHECK_MSG(heap().free_backed_bytes < TRIM_BLOCK_SIZE && released >= TRIM_BLOCKS * TRIM_BLOCK_SIZE,
            "decay 1 ms: %zu free bytes still backed two hours on (%llu released)", heap().free_backed_bytes,
            (unsigned long long)released);

  CHECK_EQ(mallopt(M_TRIM_THRESHOLD, -1), 1);
  CHECK_EQ(option(OPTION_DECAY_MS), -1);
  before = free_16_mib();
  released = released_by_decay_two_hours_on();
  pageheap_stats_t s = heap();
  CHECK_MSG(s.released_bytes_total == before, "decay never: %llu bytes released by the decay two hours on",
            (unsigned long long)(s.released_bytes_total - before));
  CHECK_MSG(s.free_backed_bytes >= TRIM_BLOCKS * TRIM_BLOCK_SIZE, "decay never: only %zu free bytes backed",
            s.free_backed_bytes);
  /* The background releaser (started by now: more than 4 MiB were free) wakes every 10 ms here:
   * ten wakeups later nothing more has gone back. tests/cross turns it off where the emulator
   * cannot start threads; the decay itself is checked above either way. */
  if (option(OPTION_RELEASE_THREAD)) {
    uint64_t woken = release_wakeups();
    released = released_after_waiting(before, 10);
    CHECK_MSG(release_wakeups() - woken >= 10, "the releaser woke %llu times in 60 s: it proves nothing",
              (unsigned long long)(release_wakeups() - woken));
    CHECK_MSG(released == 0, "decay never: %llu bytes released over ten releaser wakeups", (unsigned long long)released);
  }

  /* malloc_trim still returns it, as glibc's does after M_TRIM_THRESHOLD -1. */
  before = heap().released_bytes_total;
  CHECK_EQ(malloc_trim(0), 1);
  s = heap();
  CHECK_MSG(s.released_bytes_total - before >= TRIM_BLOCKS * TRIM_BLOCK_SIZE, "malloc_trim released %llu bytes",
            (unsigned long long)(s.released_bytes_total - before));
  CHECK_MSG(s.free_backed_bytes < TRIM_BLOCK_SIZE, "after malloc_trim %zu free bytes backed", s.free_backed_bytes);
  if (!option(OPTION_RELEASE_THREAD)) /* printed last: stdio's buffer would come from the 16 MiB */
    printf("unit-mallopt: the releaser's wakeups not checked: release_thread is off (QMALLOC_RELEASE_THREAD=0)\n");
}

int main(void) {
  init_process();
  long long defaults[OPTION_COUNT];
  memcpy(defaults, options_values, sizeof defaults);

  /* Parameters without a qmalloc concept: 1 for every value, nothing changes. */
  static const int ignored[] = {M_TOP_PAD, M_MMAP_MAX, M_CHECK_ACTION, M_PERTURB, M_ARENA_TEST, M_ARENA_MAX,
                                M_NLBLKS,  M_GRAIN,    M_KEEP,         42,        -9};
  static const int values[] = {INT_MIN, -1, 0, 1, 160, 1 << 20, INT_MAX};
  for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
    for (size_t j = 0; j < sizeof values / sizeof values[0]; j++)
      CHECK_MSG(mallopt(ignored[i], values[j]) == 1, "mallopt(%d, %d) != 1", ignored[i], values[j]);
  CHECK_MSG(memcmp(defaults, options_values, sizeof defaults) == 0, "an ignored parameter changed an option");

  /* M_MXFAST: glibc's range 0..80 * sizeof(size_t) / 4. */
  CHECK_EQ(mallopt(M_MXFAST, -1), 0);
  CHECK_EQ(mallopt(M_MXFAST, INT_MIN), 0);
  CHECK_EQ(mallopt(M_MXFAST, 0), 1);
  CHECK_EQ(mallopt(M_MXFAST, 160), 1);
  CHECK_EQ(mallopt(M_MXFAST, 161), 0);
  CHECK_MSG(memcmp(defaults, options_values, sizeof defaults) == 0, "M_MXFAST changed an option");

  /* M_TRIM_THRESHOLD 0, with decay at its default: every free gives memory back at once. */
  CHECK_EQ(mallopt(M_TRIM_THRESHOLD, 0), 1);
  CHECK_EQ(option(OPTION_RETAIN_MAX), 0);
  CHECK_EQ(option(OPTION_DECAY_MS), defaults[OPTION_DECAY_MS]);
  CHECK_MSG(released_by_large_free() >= (8u << 20), "trim threshold 0: a freed 8 MiB block was not released");

  /* -1 disables trimming on free, even with a decay of 0 set before. */
  options_values[OPTION_DECAY_MS] = 0;
  CHECK_EQ(mallopt(M_TRIM_THRESHOLD, -1), 1);
  CHECK_EQ(option(OPTION_RETAIN_MAX), options_table[OPTION_RETAIN_MAX].max);
  CHECK_EQ(option(OPTION_DECAY_MS), -1);
  uint64_t released = released_by_large_free();
  CHECK_MSG(released == 0, "trim threshold -1: a free released %llu bytes", (unsigned long long)released);
  CHECK_EQ(mallopt(M_TRIM_THRESHOLD, INT_MIN), 1);
  CHECK_EQ(option(OPTION_RETAIN_MAX), options_table[OPTION_RETAIN_MAX].max);

  /* A positive threshold is retain_max in bytes. */
  CHECK_EQ(mallopt(M_TRIM_THRESHOLD, 1 << 20), 1);
  CHECK_EQ(option(OPTION_RETAIN_MAX), 1 << 20);
  CHECK_EQ(mallopt(M_TRIM_THRESHOLD, INT_MAX), 1);
  CHECK_EQ(option(OPTION_RETAIN_MAX), INT_MAX);

  /* M_MMAP_THRESHOLD: blocks at least this big get a mapping of their own, unless a free span
   * already has room for them (then they come from it): either way they go back to the OS as soon
   * as they are freed. */
  CHECK_EQ(mallopt(M_MMAP_THRESHOLD, 1 << 20), 1);
  CHECK_EQ(option(OPTION_RELEASE_LARGE), 1 << 20);
  size_t direct = heap().direct_blocks;
  uint64_t released_before = heap().released_bytes_total;
  void *p = malloc(2u << 20);
  CHECK(p != NULL);
  memset(p, 1, 2u << 20);
  int own = heap().direct_blocks == direct + 1;
  free(p);
  CHECK_EQ(heap().direct_blocks, direct);
  CHECK_MSG(own || heap().released_bytes_total - released_before >= (2u << 20),
            "mmap threshold 1 MiB: a 2 MiB block was neither a mapping of its own nor released when freed");
  CHECK_EQ(mallopt(M_MMAP_THRESHOLD, 40 << 20), 1); /* glibc 2.36 takes values above 32 MiB too */
  CHECK_EQ(option(OPTION_RELEASE_LARGE), 40 << 20);
  CHECK_EQ(mallopt(M_MMAP_THRESHOLD, 0), 1);
  CHECK_EQ(option(OPTION_RELEASE_LARGE), 0);
  CHECK_EQ(mallopt(M_MMAP_THRESHOLD, -1), 1); /* a huge size_t: never */
  CHECK_EQ(option(OPTION_RELEASE_LARGE), options_table[OPTION_RELEASE_LARGE].max);
  direct = heap().direct_blocks;
  p = malloc(64u << 20);
  CHECK(p != NULL);
  CHECK_MSG(heap().direct_blocks == direct, "mmap threshold -1: a 64 MiB block still got its own mapping");
  free(p);
  test_trim_never(defaults);
  return tu_summary("unit-mallopt");
}
