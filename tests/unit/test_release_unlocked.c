/* A release's madvise runs without the page heap's lock (src/pageheap.c, "release to the OS"):
 *   - while one thread is inside it, another thread's span allocation and free complete, and are
 *     not given the pages on their way out;
 *   - the span in flight keeps its ends in the page map, also when it was cut out of a larger free
 *     span (kernel pages larger than qmalloc's: unit-release_unlocked-page64k);
 *   - the statistics count those pages as free backed (still resident) until they are filed;
 *   - a child forked meanwhile, where the releasing thread does not exist, gets them back as backed
 *     and can allocate them;
 *   - once the madvise returns, they are filed as released;
 *   - a child forked by a signal handler that interrupted the releasing thread in its madvise
 *     leaves that thread's spans to it: filed once, by the interrupted call, and the heap is sound.
 * This test defines madvise itself (the library's objects are linked in, so its calls come here):
 * a call on the span under test waits until the main thread lets it go. Every wait has a 60 s
 * bound, so a lock held across the madvise shows as a failed check, not a hang. */
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "os.h"
#include "testutil.h"
#include "unit/heap_util.h"

#define NPAGES 300 /* a length no other span of this test has */
#define WAIT_MS 60000

static uintptr_t held_lo, held_hi; /* a madvise overlapping [held_lo, held_hi) waits */
static int in_madvise, let_go;
static uintptr_t fork_lo, fork_hi; /* a madvise overlapping [fork_lo, fork_hi) raises SIGUSR1 */
static volatile pid_t forked = -1; /* by the handler: what fork returned */

static void fork_in_handler(int sig) {
  (void)sig;
  forked = fork();
}

int madvise(void *addr, size_t len, int advice) {
  uintptr_t a = (uintptr_t)addr, lo = __atomic_load_n(&held_lo, __ATOMIC_ACQUIRE);
  if (fork_lo != 0 && a < fork_hi && a + len > fork_lo) {
    fork_lo = 0; /* once */
    raise(SIGUSR1);
  }
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
  span_t *in_flight = pagemap_span(held_lo);
  other.state = in_flight != NULL && in_flight->start == held_lo ? in_flight->state : SPAN_DEAD; /* by its first page */
  __atomic_store_n(&other.done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* The statistics' identity (docs/stats.md): what they split the mapped bytes into adds up. */
static bool identity_holds(void) {
  stats_snapshot_t s;
  stats_snapshot(&s);
  size_t sum = s.in_use + s.thread_caches + s.transfer_caches + s.central_free + s.pageheap_free + s.released + s.metadata;
  return sum == s.mapped;
}

/* In a child forked while the release is in flight: the span is backed again (merged with its
 * free neighbours, perhaps), its contents as they were, the statistics sound, and it can be had. */
static int child_gets_span_back(uintptr_t rlo, uintptr_t rhi) {
  __atomic_store_n(&held_lo, 0, __ATOMIC_RELEASE); /* the child's own releases do not wait */
  span_t *free_span = pagemap_span(rlo); /* the header it was taken with: it survives a merge */
  if (free_span == NULL || free_span->state != SPAN_FREE_BACKED || free_span->start > rlo ||
      free_span->start + (uintptr_t)free_span->npages * PAGE_SIZE < rhi)
    return 1;
  for (uintptr_t at = rlo; at < rhi; at += 4096)
    if (*(volatile unsigned char *)at != 1) return 2; /* the parent's madvise had not run */
  if (!identity_holds()) return 3;
  zero_range_t zero;
  span_t *s = pageheap_alloc(free_span->npages, 1, 0, &zero);
  if (s == NULL || !identity_holds()) return 4;
  return 0;
}

/* [*rlo, *rhi): the whole kernel pages inside [lo, hi), which a release gives back. */
static void kernel_pages_inside(uintptr_t lo, uintptr_t hi, uintptr_t *rlo, uintptr_t *rhi) {
  uintptr_t g = os_page_size();
  *rlo = (lo + g - 1) & ~(g - 1);
  *rhi = hi & ~(g - 1);
}

/* A span of NPAGES2 pages, freed and released by this thread, whose madvise raises SIGUSR1, whose
 * handler forks: in the child, the release goes on when the handler returns and files the span
 * itself. Returns what the child found (0: sound), or -1 if it was not forked. */
#define NPAGES2 310
static int fork_from_handler_in_madvise(void) {
  span_t *target = pageheap_alloc(NPAGES2, 1, 0, NULL);
  if (target == NULL) return -1;
  uintptr_t lo = target->start, hi = lo + (uintptr_t)NPAGES2 * PAGE_SIZE, rlo, rhi;
  memset((void *)lo, 3, hi - lo);
  pageheap_free(target);
  kernel_pages_inside(lo, hi, &rlo, &rhi);
  struct sigaction sa = {.sa_handler = fork_in_handler};
  sigaction(SIGUSR1, &sa, NULL);
  fork_hi = rhi;
  fork_lo = rlo;
  uint64_t released_before = heap().released_bytes_total;
  (void)pageheap_release_all();
  if (forked == 0) { /* the child, after the handler returned and the release went on */
    /* (Not by its header: merged into a free run of a chunk or more, the trim unmapped it.) */
    int bad = 0;
    if (heap().released_bytes_total - released_before < rhi - rlo) bad |= 1; /* filed released */
    pageheap_stats_t h = heap();
    if (h.free_backed_bytes > ((size_t)1 << 40) || h.free_spans > ((size_t)1 << 30)) bad |= 2; /* wrapped */
    if (!identity_holds()) bad |= 16; /* a span counted twice */
    span_t *again = pageheap_alloc(NPAGES2, 1, 0, NULL), *other = pageheap_alloc(NPAGES2, 1, 0, NULL);
    if (again == NULL || other == NULL || again == other ||
        (again->start < other->start + (uintptr_t)NPAGES2 * PAGE_SIZE && other->start < again->start + (uintptr_t)NPAGES2 * PAGE_SIZE))
      bad |= 4; /* a span handed out twice */
    (void)pageheap_release_all();
    if (heap().free_backed_bytes > ((size_t)1 << 40)) bad |= 8;
    _exit(bad);
  }
  if (forked < 0) return -1;
  int status = 0;
  if (tu_wait_child(forked, 60, &status) != 1) return 100;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200;
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
  uintptr_t lo = target->start, hi = lo + (uintptr_t)NPAGES * PAGE_SIZE, rlo, rhi;
  memset((void *)lo, 1, hi - lo);
  pageheap_free(target);
  CHECK(pagemap_span(lo)->state == SPAN_FREE_BACKED && pagemap_span(lo)->start == lo);
  uint64_t released_before = heap().released_bytes_total;
  kernel_pages_inside(lo, hi, &rlo, &rhi); /* what goes back: all of it, but with larger kernel pages */

  held_hi = rhi;
  __atomic_store_n(&held_lo, rlo, __ATOMIC_RELEASE);
  __atomic_store_n(&go_release, 1, __ATOMIC_RELEASE);
  CHECK_MSG(wait_for(&in_madvise), "the release of the freed span never reached madvise");
  __atomic_store_n(&go_beside, 1, __ATOMIC_RELEASE);
  bool went_on = wait_for(&other.done);
  CHECK_MSG(went_on, "a span allocation waited for another thread's madvise: the page heap's lock is held across it");
  if (went_on) {
    CHECK_MSG(!other.overlapped, "a span allocation was given pages on their way back to the OS");
    CHECK_MSG(other.state == SPAN_RELEASING, "the span in madvise is in state %u, not SPAN_RELEASING", other.state);
    CHECK_MSG(other.free_backed >= rhi - rlo, "free backed bytes %zu in flight: the span's %zu are not counted",
              other.free_backed, (size_t)(rhi - rlo));
    /* A child forked now files the span in flight as backed, and can have it. */
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(child_gets_span_back(rlo, rhi));
    int status = 0;
    CHECK_MSG(pid > 0 && tu_wait_child(pid, 60, &status) == 1, "the child forked during a release did not end");
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child forked during a release did not get the span back as backed (status %d)", status);
  }
  __atomic_store_n(&let_go, 1, __ATOMIC_RELEASE);
  pthread_join(releaser, NULL);
  pthread_join(beside, NULL);

  /* Filed as released: counted so (its header may be gone: the trim unmaps free runs of a chunk). */
  CHECK_MSG(heap().released_bytes_total - released_before >= rhi - rlo, "the span in flight was not filed as released");
  CHECK_MSG(identity_holds(), "the statistics do not add up to the bytes mapped after the release");

  int child = fork_from_handler_in_madvise();
  CHECK_MSG(child == 0, "a child forked by a signal handler in a release's madvise: %s (%d)",
            child == -1 ? "not forked" : child == 100 ? "hung" : child >= 200 ? "killed" : "its heap is unsound", child);
  return tu_summary("unit-release_unlocked");
}
