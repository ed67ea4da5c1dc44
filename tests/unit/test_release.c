/* The retain cap's release, and who makes it (src/release.c, pageheap_decay in src/pageheap.c).
 * A free that leaves more free backed pages than the cap allows has them given back:
 *   - while the background releaser runs, by the releaser, woken for it: the freeing thread returns
 *     without the madvise. With decay_ms never and tcache_idle_ms 0, nothing else gives pages back
 *     (the decay never comes due, no idle cache is taken back, and the releaser's periodic wakeups
 *     run only those), so the pages reaching the OS with no further allocator call can only be the
 *     wake's work (without it, they stayed backed for the whole minute);
 *   - with retain_max 0 (mallopt's M_TRIM_THRESHOLD 0), by the free itself, releaser or not;
 *   - with no releaser (release_thread off, as under tests/cross), by the free itself.
 * The wait polls (10 ms steps) with a generous bound (60 s), never a timing assumption. */
#include <time.h>

#include "internal.h"
#include "testutil.h"
#include "unit/heap_util.h"

#define BLOCKS 6
#define BLOCK_SIZE ((size_t)4 << 20) /* large spans, below release_large */
#define CAP ((size_t)4 << 20)

/* The retain cap as pageheap_decay computes it: retain_max plus the pages in use, up to twice it. */
static size_t cap_now(void) {
  pageheap_stats_t s = heap();
  size_t in_use = s.small_span_bytes + s.large_bytes;
  return CAP + (in_use < CAP ? in_use : CAP);
}

/* Allocates, touches and frees BLOCKS large blocks; returns released_bytes_total before the frees. */
static uint64_t free_blocks(void) { return free_large_blocks(BLOCKS, BLOCK_SIZE); }

/* Polls until the free backed bytes are within the cap (10 ms steps, at most 60 s); no allocator
 * call. Returns whether they got there. */
static bool within_cap_after_waiting(void) {
  struct timespec tick = {0, 10 * 1000000L};
  for (int i = 0; i < 6000; i++) {
    if (heap().free_backed_bytes <= cap_now()) return true;
    nanosleep(&tick, NULL);
  }
  return heap().free_backed_bytes <= cap_now();
}

int main(void) {
  init_process();
  free(malloc(64)); /* a live thread cache: the releaser ends when no thread holds one */
  /* Set as mallopt sets them (atomically: the releaser reads them once started). */
  __atomic_store_n(&options_values[OPTION_DECAY_MS], -1, __ATOMIC_RELAXED); /* never: only the cap releases */
  /* Taking this idle thread's cache back frees spans, whose decay on the releaser would release too. */
  __atomic_store_n(&options_values[OPTION_TCACHE_IDLE_MS], 0, __ATOMIC_RELAXED);
  __atomic_store_n(&options_values[OPTION_RETAIN_MAX], (long long)CAP, __ATOMIC_RELAXED);
  bool releaser = option(OPTION_RELEASE_THREAD) != 0;

  if (releaser) {
    release_request();
    release_poll(); /* no lock held, outside any window: starts the thread */
    struct timespec tick = {0, 10 * 1000000L};
    for (int i = 0; i < 6000 && release_wakeups() == 0; i++) nanosleep(&tick, NULL);
    CHECK_MSG(release_wakeups() > 0, "the background releaser did not start in 60 s");

    /* Over the cap while it runs: its job, with no allocator call from here on. */
    uint64_t before = free_blocks();
    CHECK_MSG(within_cap_after_waiting(), "releaser: %zu free bytes still backed after 60 s (cap %zu)",
              heap().free_backed_bytes, cap_now());
    uint64_t released = heap().released_bytes_total - before;
    CHECK_MSG(released >= BLOCKS * BLOCK_SIZE - 2 * CAP, "releaser: only %llu bytes went back", (unsigned long long)released);

    /* retain_max 0: at once, in the free, even with the releaser running. */
    __atomic_store_n(&options_values[OPTION_RETAIN_MAX], 0, __ATOMIC_RELAXED);
    before = free_blocks();
    pageheap_stats_t s = heap();
    CHECK_MSG(s.released_bytes_total - before >= BLOCKS * BLOCK_SIZE,
              "retain_max 0: the frees released %llu bytes themselves", (unsigned long long)(s.released_bytes_total - before));
  } else {
    /* No releaser: nothing takes a wake, and the free gives back what is over the cap itself. */
    CHECK(!release_wake());
    uint64_t before = free_blocks();
    pageheap_stats_t s = heap();
    CHECK_MSG(s.free_backed_bytes <= cap_now(), "no releaser: %zu free bytes backed after the frees (cap %zu)",
              s.free_backed_bytes, cap_now());
    CHECK_MSG(s.released_bytes_total - before >= BLOCKS * BLOCK_SIZE - 2 * CAP, "no releaser: the frees released %llu bytes",
              (unsigned long long)(s.released_bytes_total - before));
    printf("unit-release: the releaser's part not checked: release_thread is off (QMALLOC_RELEASE_THREAD=0)\n");
  }
  return tu_summary("unit-release");
}
