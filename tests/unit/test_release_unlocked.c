/* A release's madvise runs without the page heap's lock (src/pageheap.c, "release to the OS"):
 *   - while one thread is inside it, another thread's span allocation and free complete, and are
 *     not given the pages on their way out;
 *   - the statistics count those pages as free backed (still resident) until they are filed;
 *   - a child forked meanwhile, where the releasing thread does not exist, gets them back as backed
 *     and can allocate them;
 *   - once the madvise returns, they are filed as released.
 * This test defines madvise itself (the library's objects are linked in, so its calls come here):
 * a call on the span under test waits until the main thread lets it go. Every wait has a 60 s
 * bound, so a lock held across the madvise shows as a failed check, not a hang. */
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"
#include "unit/heap_util.h"

#define NPAGES 300 /* a length no other span of this test has */
#define WAIT_MS 60000

static uintptr_t held_lo, held_hi; /* a madvise overlapping [held_lo, held_hi) waits */
static int in_madvise, let_go;

int madvise(void *addr, size_t len, int advice) {
  uintptr_t a = (uintptr_t)addr, lo = __atomic_load_n(&held_lo, __ATOMIC_ACQUIRE);
  if (lo != 0 && a < held_hi && a + len > lo) {
    __atomic_store_n(&in_madvise, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < WAIT_MS && !__atomic_load_n(&let_go, __ATOMIC_ACQUIRE); i++) tu_sleep_ms(1);
  }
  return (int)syscall(SYS_madvise, addr, len, advice);
}

/* Under ThreadSanitizer (checked-tsan): its lock-order checker holds at most 64 locks a thread, and
 * the fork handlers take every qmalloc lock (one per size class) at once. The race checks stay on.
 * Read only by a ThreadSanitizer runtime; TSAN_OPTIONS from the environment still wins. */
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "detect_deadlocks=0"; }

/* Polls *flag for up to WAIT_MS; whether it was set. */
static bool wait_for(int *flag) {
  for (int i = 0; i < WAIT_MS && !__atomic_load_n(flag, __ATOMIC_ACQUIRE); i++) tu_sleep_ms(1);
  return __atomic_load_n(flag, __ATOMIC_ACQUIRE) != 0;
}

/* The two threads are created before the span under test exists (creating one allocates, and
 * could take its pages), and wait for their turn. */
static int go_release, go_beside;

static void *release_everything(void *arg) {
  (void)arg;
  if (wait_for(&go_release)) (void)pageheap_release_all();
  return NULL;
}

/* What the other thread saw while the release was in madvise. */
static struct {
  int done;
  bool overlapped;     /* it was given pages of the span in flight */
  size_t free_backed;  /* the statistics' free backed bytes, then */
  uint8_t state;       /* the span's state, then */
} other;

static void *allocate_beside(void *arg) {
  (void)arg;
  if (!wait_for(&go_beside)) return NULL;
  span_t *s = pageheap_alloc(NPAGES, 1, 0, NULL);
  if (s != NULL) {
    uintptr_t end = s->start + (uintptr_t)NPAGES * PAGE_SIZE;
    other.overlapped = s->start < held_hi && end > held_lo;
    memset((void *)s->start, 2, (size_t)NPAGES * PAGE_SIZE);
    pageheap_free(s);
  }
  other.free_backed = heap().free_backed_bytes;
  other.state = pagemap_span(held_lo)->state;
  __atomic_store_n(&other.done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* In a child forked while the release is in flight: the span is backed again and allocatable. */
static int child_gets_span_back(uintptr_t lo) {
  __atomic_store_n(&held_lo, 0, __ATOMIC_RELEASE); /* the child's own releases do not wait */
  span_t *free_span = pagemap_span(lo);
  if (free_span->state != SPAN_FREE_BACKED) return 1;
  if (heap().free_backed_bytes < (size_t)NPAGES * PAGE_SIZE) return 2;
  zero_range_t zero;
  span_t *s = pageheap_alloc(NPAGES, 1, 0, &zero);
  if (s == NULL || s->start != lo) return 3;
  if (zero.lo != zero.hi) return 4; /* backed: nothing known to read as zero */
  for (size_t i = 0; i < (size_t)NPAGES * PAGE_SIZE; i += 4096)
    if (((volatile unsigned char *)s->start)[i] != 1 && ((volatile unsigned char *)s->start)[i] != 0) return 5;
  return 0;
}

int main(void) {
  init_process();
  /* Nothing but this test's own call releases: no decay, no cap, no releaser woken for them. */
  __atomic_store_n(&options_values[OPTION_DECAY_MS], -1, __ATOMIC_RELAXED);
  __atomic_store_n(&options_values[OPTION_RETAIN_MAX], (long long)1 << 40, __ATOMIC_RELAXED);

  pthread_t releaser, beside;
  CHECK(pthread_create(&releaser, NULL, release_everything, NULL) == 0);
  CHECK(pthread_create(&beside, NULL, allocate_beside, NULL) == 0);
  /* Everything free released first, so that the span under test merges with no backed neighbour:
   * its free span is exactly its own pages. */
  (void)pageheap_release_all();
  span_t *target = pageheap_alloc(NPAGES, 1, 0, NULL);
  CHECK(target != NULL);
  if (target == NULL) {
    __atomic_store_n(&let_go, 1, __ATOMIC_RELEASE);
    return tu_summary("unit-release_unlocked");
  }
  uintptr_t lo = target->start, hi = lo + (uintptr_t)NPAGES * PAGE_SIZE;
  memset((void *)lo, 1, hi - lo);
  pageheap_free(target);
  CHECK(pagemap_span(lo)->state == SPAN_FREE_BACKED && pagemap_span(lo)->start == lo);
  uint64_t released_before = heap().released_bytes_total;

  held_hi = hi;
  __atomic_store_n(&held_lo, lo, __ATOMIC_RELEASE);
  __atomic_store_n(&go_release, 1, __ATOMIC_RELEASE);
  CHECK_MSG(wait_for(&in_madvise), "the release of the freed span never reached madvise");
  __atomic_store_n(&go_beside, 1, __ATOMIC_RELEASE);
  bool went_on = wait_for(&other.done);
  CHECK_MSG(went_on, "a span allocation waited for another thread's madvise: the page heap's lock is held across it");
  if (went_on) {
    CHECK_MSG(!other.overlapped, "a span allocation was given pages on their way back to the OS");
    CHECK_MSG(other.state == SPAN_RELEASING, "the span in madvise is in state %u, not SPAN_RELEASING", other.state);
    CHECK_MSG(other.free_backed >= hi - lo, "free backed bytes %zu in flight: the span's %zu are not counted",
              other.free_backed, (size_t)(hi - lo));
    /* A child forked now files the span in flight as backed, and can have it. */
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(child_gets_span_back(lo));
    int status = 0;
    CHECK_MSG(pid > 0 && tu_wait_child(pid, 60, &status) == 1, "the child forked during a release did not end");
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child forked during a release did not get the span back as backed (status %d)", status);
  }
  __atomic_store_n(&let_go, 1, __ATOMIC_RELEASE);
  pthread_join(releaser, NULL);
  pthread_join(beside, NULL);

  span_t *filed = pagemap_span(lo);
  CHECK_MSG(filed->state == SPAN_FREE_RELEASED && filed->start <= lo,
            "after the madvise the span is in state %u, not released", filed->state);
  CHECK(heap().released_bytes_total - released_before >= hi - lo);
  return tu_summary("unit-release_unlocked");
}
