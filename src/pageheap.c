/* Page heap: runs of pages ("spans") for the central lists and for large objects.
 * Owns: free spans, kept by length in exact lists (1..PAGEHEAP_EXACT_LISTS pages) plus one list
 * for longer spans, in two sets: backed (may be resident) and released (returned to the OS);
 * coalescing of free neighbours of the same set; the decay that releases backed spans nobody
 * reused within decay_ms, and the retain_max cap; huge blocks as mappings of their own; giving
 * address space back (whole free spans unmapped on malloc_trim and when a mapping is refused).
 * Does not: know about size classes beyond writing the page map for small spans.
 * Lock: pageheap.lock protects everything here, span headers (span.c) and page-map writes, but for
 * the headers of spans a thread took out of the free sets to release (SPAN_RELEASING), which are
 * that thread's until it files them: their madvise runs without the lock ("release to the OS"). Every
 * change to a mapping that the page map describes (mremap, munmap of a range qmalloc registered)
 * happens with the lock held, or after the range left the page map: otherwise another thread could
 * map the same addresses, register them, and have its entries erased by ours.
 * Callers: central.c (small spans), api.c (large objects), stats.c, init.c (fork). */
#include <sched.h>
#include <string.h>

#include "internal.h"
#include "os.h"

#define PAGEHEAP_LISTS (PAGEHEAP_EXACT_LISTS + 1)
#define PAGEHEAP_BITMAP_WORDS ((PAGEHEAP_LISTS + 63) / 64)

typedef struct free_set_s {
  span_t *lists[PAGEHEAP_LISTS];                /* [n-1]: spans of n pages; last: longer ones */
  uint64_t nonempty[PAGEHEAP_BITMAP_WORDS];     /* bit i set iff lists[i] is not empty */
  size_t bytes;
} free_set_t;

static struct {
  /* Adaptive (glibc: spins a while before it sleeps): with 64 threads on 2 CPUs freeing and
   * refilling blocks of 100-256 KiB (a span each), a holder's critical section is a few hundred
   * instructions, and a plain mutex put every waiter to sleep and woke it again (futex calls: most
   * of the time): 0.35-0.62 s against 0.12-0.30 (mtbench busy-threads --blocks 4 --min-size 100000
   * --max-size 262144 --write-all 0, 4 runs each; docs/design.md, "the total bounds budgets"). A
   * forked child's is adaptive too (fork_unlock keeps a lock's kind). */
  pthread_mutex_t lock;
  free_set_t backed, released;
  span_t *oldest, *newest; /* backed free spans, by the time they became free */
  size_t small_span_bytes, large_bytes, direct_bytes, direct_blocks;
  size_t free_spans;
  span_t *releasing;     /* spans whose madvise is in flight, by a thread without the lock */
  size_t releasing_bytes; /* their bytes: free backed until they are filed as released */
  uint64_t release_calls, released_bytes_total;
  uint64_t growth_released_bytes; /* of released_bytes_total: by pageheap_release_for_growth */
  uint64_t release_failures, unmap_failures; /* calls the kernel refused (the memory was kept) */
  uint64_t unmapped_bytes_total;             /* address space of free spans given back */
  uint64_t joins; /* backed spans joined with a released neighbour for a larger request */
  size_t in_use_high; /* the most bytes the heap has had in use, requests included */
  uint64_t next_decay_ms;  /* no backed span is due for release before this time */
  uintptr_t region_low;    /* start of the last chunk mapped: the next one is tried right below */
} pageheap = {.lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP, .next_decay_ms = UINT64_MAX};

/* The page-map entry of every page of a chunk's guard (SPAN_GUARD): never free, so no span
 * coalesces across it, and pageheap_unmap_free knows to unmap it with the span before it. */
static span_t pageheap_guard = {.state = SPAN_GUARD};

/* Points the page-map entries of the guard at `at` to `guard` (NULL: clears them). Requires the
 * lock and the page-map leaves. */
static void pageheap_set_guard(uintptr_t at, span_t *guard) {
  for (size_t i = 0; i < os_guard_size() / PAGE_SIZE; i++) pagemap_set_page(at + i * PAGE_SIZE, guard);
}

/* ---- free sets --------------------------------------------------------------------------- */

static size_t pageheap_list_index(size_t npages) {
  return npages <= PAGEHEAP_EXACT_LISTS ? npages - 1 : PAGEHEAP_EXACT_LISTS;
}

static free_set_t *pageheap_set_of(span_t *span) {
  return span->state == SPAN_FREE_BACKED ? &pageheap.backed : &pageheap.released;
}

/* npages rounded up to whole kernel pages (os_page_size() may be larger than PAGE_SIZE). */
static size_t pageheap_round_to_os_pages(size_t npages) {
  size_t per = os_page_size() > PAGE_SIZE ? os_page_size() / PAGE_SIZE : 1;
  return (npages + per - 1) / per * per;
}

/* The part of [start, start + npages pages) made of whole kernel pages (os_page_size(), which may
 * be larger than PAGE_SIZE): [*lo, *hi); false if there is none. pageheap_releasable: a span's. */
static bool pageheap_whole_kernel_pages(uintptr_t start, size_t npages, uintptr_t *lo, uintptr_t *hi) {
  uintptr_t g = os_page_size(), end = start + (uintptr_t)npages * PAGE_SIZE;
  uintptr_t l = (start + g - 1) & ~(g - 1), h = end & ~(g - 1);
  if (lo) *lo = l;
  if (hi) *hi = h;
  return l < h;
}

static bool pageheap_releasable(const span_t *span, uintptr_t *lo, uintptr_t *hi) {
  return pageheap_whole_kernel_pages(span->start, span->npages, lo, hi);
}

/* The address past a span's last page. */
static uintptr_t pageheap_span_end(const span_t *span) { return span->start + (uintptr_t)span->npages * PAGE_SIZE; }

static void pageheap_insert(span_t *span) {
  free_set_t *set = pageheap_set_of(span);
  size_t i = pageheap_list_index(span->npages);
  span->prev = NULL;
  span->next = set->lists[i];
  if (span->next) span->next->prev = span;
  set->lists[i] = span;
  set->nonempty[i / 64] |= (uint64_t)1 << (i % 64);
  set->bytes += span->npages * PAGE_SIZE;
  pageheap.free_spans++;
  /* A backed span goes on the age list (appended as the newest) if it holds a whole kernel page:
   * a smaller one (kernel pages larger than qmalloc's) could never be released, and would stop the
   * decay at the head of the list. */
  span->aged = span->state == SPAN_FREE_BACKED && pageheap_releasable(span, NULL, NULL);
  if (span->aged) {
    span->u.age.newer = NULL;
    span->u.age.older = pageheap.newest;
    if (pageheap.newest) pageheap.newest->u.age.newer = span;
    else pageheap.oldest = span;
    pageheap.newest = span;
  }
  pagemap_set_ends(span);
}

static void pageheap_remove(span_t *span) {
  free_set_t *set = pageheap_set_of(span);
  size_t i = pageheap_list_index(span->npages);
  if (span->prev) span->prev->next = span->next;
  else set->lists[i] = span->next;
  if (span->next) span->next->prev = span->prev;
  if (set->lists[i] == NULL) set->nonempty[i / 64] &= ~((uint64_t)1 << (i % 64));
  set->bytes -= span->npages * PAGE_SIZE;
  pageheap.free_spans--;
  if (span->aged) {
    span->aged = 0;
    if (span->u.age.newer) span->u.age.newer->u.age.older = span->u.age.older;
    else pageheap.newest = span->u.age.older;
    if (span->u.age.older) span->u.age.older->u.age.newer = span->u.age.newer;
    else pageheap.oldest = span->u.age.newer;
  }
}

/* The free span of `set` that best fits npages, or NULL. */
static span_t *pageheap_find(free_set_t *set, size_t npages) {
  size_t i = pageheap_list_index(npages);
  if (i < PAGEHEAP_EXACT_LISTS) {
    for (size_t w = i / 64; w < PAGEHEAP_BITMAP_WORDS; w++) {
      uint64_t bits = set->nonempty[w];
      if (w == i / 64) bits &= ~(uint64_t)0 << (i % 64);
      if (bits == 0) continue;
      size_t found = w * 64 + (size_t)__builtin_ctzll(bits);
      if (found < PAGEHEAP_EXACT_LISTS) return set->lists[found];
      break;
    }
  }
  span_t *best = NULL;
  for (span_t *s = set->lists[PAGEHEAP_EXACT_LISTS]; s != NULL; s = s->next)
    if (s->npages >= npages && (best == NULL || s->npages < best->npages ||
                                (s->npages == best->npages && s->start < best->start)))
      best = s;
  return best;
}

/* How many free spans pageheap_find_fit looks at, at most: it runs under the lock, for aligned
 * requests only. */
#define PAGEHEAP_ALIGNED_SCAN 64

/* Whether span s has room for npages pages from its first align-aligned address. */
static bool pageheap_fits_aligned(const span_t *s, size_t npages, uintptr_t align) {
  uintptr_t start = (s->start + align - 1) & ~(align - 1);
  return start + npages * PAGE_SIZE <= pageheap_span_end(s);
}

/* The free span of `set` that best fits npages pages at an align_pages-aligned start, or NULL
 * (align_pages 1: pageheap_find). pageheap_find(set, npages + align_pages - 1) finds one that has
 * room wherever it starts; a shorter span whose start happens to suit fits too, and is the one the
 * program just freed when it frees and asks again for an aligned block: the hardened build's 1 MiB
 * blocks at 1 MiB alignment (129 pages with their guard) each came from fresh pages 2 MiB further
 * on, and 400 turns of one after malloc_trim left the process at 68 MB of RSS (the freed ones,
 * each between released neighbours, fit no worst case) where the default build, whose freed
 * blocks merged, stayed at 3.9 MB (2.9 MB now, both). The shorter spans are looked at first,
 * shortest first (PAGEHEAP_ALIGNED_SCAN of them at most). */
static span_t *pageheap_find_fit(free_set_t *set, size_t npages, size_t align_pages) {
  if (align_pages == 1) return pageheap_find(set, npages);
  size_t need = npages + align_pages - 1;
  uintptr_t align = (uintptr_t)align_pages * PAGE_SIZE;
  size_t looked = 0;
  for (size_t i = pageheap_list_index(npages); i <= pageheap_list_index(need - 1) && looked < PAGEHEAP_ALIGNED_SCAN; i++) {
    if (!(set->nonempty[i / 64] & ((uint64_t)1 << (i % 64)))) continue;
    span_t *best = NULL;
    for (span_t *s = set->lists[i]; s != NULL && looked < PAGEHEAP_ALIGNED_SCAN; s = s->next, looked++)
      if (s->npages < need && pageheap_fits_aligned(s, npages, align) && (best == NULL || s->npages < best->npages))
        best = s;
    if (best != NULL) return best;
  }
  return pageheap_find(set, need);
}

/* Puts a free span (state already BACKED or RELEASED) into its set, merged with free neighbours
 * of the same set. Backed and released neighbours are not merged: a merged span would have to
 * be either re-released (a system call on every free) or counted as resident when it is not. */
static void pageheap_insert_coalesced(span_t *span) {
  uintptr_t end = pageheap_span_end(span);
  span_t *left = span->start >= PAGE_SIZE ? pagemap_span(span->start - PAGE_SIZE) : NULL;
  if (left && left->state == span->state && pageheap_span_end(left) == span->start) {
    pageheap_remove(left);
    span->start = left->start;
    span->npages += left->npages;
    span->parked |= left->parked;
    if (left->freed_ms > span->freed_ms) span->freed_ms = left->freed_ms;
    span_delete(left);
  }
  span_t *right = pagemap_span(end);
  if (right && right->state == span->state && right->start == end) {
    pageheap_remove(right);
    span->npages += right->npages;
    span->parked |= right->parked;
    if (right->freed_ms > span->freed_ms) span->freed_ms = right->freed_ms;
    span_delete(right);
  }
  pageheap_insert(span);
}

/* Splits the first npages pages off a free span that is in no list; the rest goes back free. */
static bool pageheap_carve(span_t *span, size_t npages) {
  if (span->npages == npages) return true;
  span_t *rest = span_new(span->start + npages * PAGE_SIZE, span->npages - npages, span->state);
  if (rest == NULL) return false;
  rest->freed_ms = span->freed_ms;
  rest->parked = span->parked;
  span->npages = (uint32_t)npages;
  pageheap_insert(rest);
  return true;
}

/* ---- release to the OS --------------------------------------------------------------------- */

/* A release runs in three steps, and the kernel's part without the lock. Under the lock, a due span
 * leaves the free sets as SPAN_RELEASING (handed to no one, merged with no neighbour, its pages
 * still counted as free backed); then the lock is dropped for the madvise; then it is taken again to
 * file the span as released, or as backed if the kernel refused. madvise(MADV_DONTNEED) takes time
 * in proportion to the pages it drops, and this lock is the one every span refill and large block
 * takes: held across it, a release of a few GiB stops every thread that needs a span for as long
 * (the complaints filed against gperftools' ReleaseFreeMemory: 0.1-1 s). A batch belongs to the
 * thread that took its spans, which gives them back before its call returns (pageheap_unlock): a
 * malloc_trim has released what it took when it returns, and a release at a new high has dropped
 * the pages before the request's are faulted in. Every span in flight is also on
 * pageheap.releasing, for a forked child, where the thread releasing it does not exist: the child
 * files them as backed (pageheap_unlock_after_fork). */
typedef struct {
  struct {
    span_t *span;
    uintptr_t shadow; /* hardened build: where its parked pages wait (harden_park.c), or 0 */
    bool growth;      /* taken by pageheap_release_for_growth: counted as growth_released_bytes */
  } taken[PAGEHEAP_RELEASE_BATCH];
  size_t n;
  bool more; /* the decay stopped at a full batch: run it again once this one is filed */
} release_batch_t;

/* The batch this thread last took a span into. A forked child tells by it which spans in flight
 * are its own thread's: those of a release that a signal handler interrupted to fork, which the
 * interrupted call files itself once the handler returns. (Stale once the call returns, when none
 * of its spans is in flight any more: another batch at the same address is this thread's again.) */
static __thread const release_batch_t *pageheap_batch_mine __attribute__((tls_model("initial-exec")));

/* Empty. Not `= {0}`, which writes the whole array: 70 instructions on every large malloc and
 * free (callgrind). */
static void release_batch_init(release_batch_t *batch) {
  batch->n = 0;
  batch->more = false;
}

typedef enum { RELEASE_TAKEN, RELEASE_SKIPPED, RELEASE_BATCH_FULL, RELEASE_REFUSED } release_take_t;

/* Takes one backed span (on the age list) into batch for release. Only the whole kernel pages
 * inside it go (kernel pages larger than qmalloc's): the edges are split off and stay backed (off
 * the age list, since they hold no whole kernel page; they go back on it when they merge with a
 * neighbour). In the hardened build, the pages parked in the span's shadow go with it: where the
 * span lies in one chunk's shadow (the shadows' table is this lock's), found here and dropped with
 * the span's own; otherwise dropped here, under the lock, and if the kernel refused, the span stays
 * backed as the newest, so that the decay does not try it again at once. Requires the lock. */
static release_take_t pageheap_take_for_release(span_t *span, uint64_t now, bool growth, release_batch_t *batch) {
  if (batch->n == PAGEHEAP_RELEASE_BATCH) return RELEASE_BATCH_FULL;
  uintptr_t lo, hi;
  bool releasable = pageheap_releasable(span, &lo, &hi);
  pageheap_remove(span);
  if (!releasable) { /* nothing whole to give back: stays backed, off the age list */
    pageheap_insert(span);
    return RELEASE_SKIPPED;
  }
  uintptr_t shadow = 0;
  if (qm_hardened && span->parked) {
    shadow = harden_park_shadow_of(lo, hi - lo);
    if (shadow == 0 && !harden_park_release(lo, hi - lo)) {
      pageheap.release_failures++;
      span->freed_ms = now;
      pageheap_insert(span); /* as it was: its neighbours did not change */
      return RELEASE_REFUSED;
    }
  }
  uintptr_t end = pageheap_span_end(span);
  if (lo > span->start) { /* the backed head stays, the rest is split off */
    span_t *rest = span_new(lo, (end - lo) / PAGE_SIZE, SPAN_FREE_BACKED);
    if (rest == NULL) { /* no header for the split: keep it whole and backed (still correct) */
      span->freed_ms = now;
      pageheap_insert(span);
      return RELEASE_SKIPPED;
    }
    rest->parked = span->parked;
    rest->freed_ms = span->freed_ms;
    span->npages = (uint32_t)((lo - span->start) / PAGE_SIZE);
    pageheap_insert(span);
    span = rest;
  }
  if (hi < end) {
    span_t *tail = span_new(hi, (end - hi) / PAGE_SIZE, SPAN_FREE_BACKED);
    if (tail == NULL) { /* no header for the split: the span stays backed (still correct) */
      span->freed_ms = now;
      pageheap_insert(span);
      return RELEASE_SKIPPED;
    }
    tail->freed_ms = span->freed_ms;
    tail->parked = span->parked;
    span->npages = (uint32_t)((hi - span->start) / PAGE_SIZE);
    pageheap_insert(tail);
  }
  span->state = SPAN_RELEASING;
  span->u.releaser = pageheap_batch_mine = batch;
  /* Named before it is listed: a child forked by a signal handler here files the listed spans
   * another batch owns, and must not take this one for such (a call kept the order until now; the
   * fence keeps it under inlining). */
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  /* Its ends in the page map: a piece split off here is in no set, which would have written them,
   * and free_fail finds a freed block's span by them (a double free, not an invalid pointer). */
  pagemap_set_ends(span);
  span->prev = NULL;
  span->next = pageheap.releasing;
  if (span->next) span->next->prev = span;
  pageheap.releasing = span;
  pageheap.releasing_bytes += span->npages * PAGE_SIZE;
  batch->taken[batch->n].span = span;
  batch->taken[batch->n].shadow = shadow;
  batch->taken[batch->n].growth = growth;
  batch->n++;
  return RELEASE_TAKEN;
}

/* Files a span that was on its way to the OS: released (and so known to read as zero, which calloc
 * trusts) only if the kernel dropped its pages; if it refused (mlock'ed memory), backed again as
 * the newest. Requires the lock. */
static void pageheap_file_releasing(span_t *span, bool released, uint64_t now) {
  if (span->prev) span->prev->next = span->next;
  else pageheap.releasing = span->next;
  if (span->next) span->next->prev = span->prev;
  pageheap.releasing_bytes -= span->npages * PAGE_SIZE;
  if (released) {
    span->state = SPAN_FREE_RELEASED;
  } else {
    span->state = SPAN_FREE_BACKED;
    span->freed_ms = now;
  }
  pageheap_insert_coalesced(span); /* its neighbours may have changed meanwhile */
}

/* When a span freed at `freed_ms` is due: decay_ms -1 ("never", mallopt(M_TRIM_THRESHOLD, -1))
 * reads as UINT64_MAX and saturates to never; only retain_max and malloc_trim release then. */
static uint64_t pageheap_due_ms(uint64_t freed_ms, uint64_t decay) {
  return decay > UINT64_MAX - freed_ms ? UINT64_MAX : freed_ms + decay;
}

/* The decay is next due when the oldest backed span is (never, with none). Stored atomically:
 * pageheap_maybe_decay reads it without the lock (ThreadSanitizer found the plain store). */
static uint64_t pageheap_oldest_due_ms(uint64_t decay) {
  return pageheap.oldest ? pageheap_due_ms(pageheap.oldest->freed_ms, decay) : UINT64_MAX;
}

static void pageheap_next_decay_from_oldest(uint64_t decay) {
  __atomic_store_n(&pageheap.next_decay_ms, pageheap_oldest_due_ms(decay), __ATOMIC_RELAXED);
}

/* After a refusal (mlockall): the decay tries again one decay interval (at least 1 s) later rather
 * than on every entry, and the memory is kept (it stays backed and correct). */
static void pageheap_decay_after_refusal(uint64_t now) {
  uint64_t decay = (uint64_t)option(OPTION_DECAY_MS);
  __atomic_store_n(&pageheap.next_decay_ms, pageheap_due_ms(now, decay > 1000 ? decay : 1000), __ATOMIC_RELAXED);
}

/* Takes for release the backed spans free for longer than decay_ms, then the oldest until the
 * backed free bytes are at most retain_max plus the pages in use, up to twice retain_max: that part
 * by the background releaser, woken for it, while one runs on another thread (release.c;
 * retain_max 0 keeps "at once" on the freeing thread). Requires the lock; the caller gives the
 * batch back (pageheap_unlock). The cap
 * grows with the heap in use so that a working set of big blocks that turns over (free one,
 * allocate another of another size) keeps its free spans backed: with a fixed 64 MiB, three or
 * four live blocks of 5-25 MiB (mtbench large-blocks --live 3, --live 4) released and faulted back
 * 40-60% more pages than with it, and took 1.2-1.8 times as long (peak RSS +2.5% now). A program
 * that really shrinks lowers the cap with its heap, and the decay still releases what stays
 * unused; retain_max 0 (mallopt's M_TRIM_THRESHOLD 0) still releases every free span at once. */
static QM_NOINLINE void pageheap_decay_run(uint64_t now, release_batch_t *batch) {
  uint64_t decay = (uint64_t)option(OPTION_DECAY_MS);
  size_t retain_max = (size_t)option(OPTION_RETAIN_MAX), in_use = pageheap.small_span_bytes + pageheap.large_bytes;
  size_t retain = retain_max + (in_use < retain_max ? in_use : retain_max);
  bool cap_here = pageheap.backed.bytes <= retain || retain_max == 0 || !release_wake();
  span_t *s;
  while ((s = pageheap.oldest) != NULL &&
         (pageheap_due_ms(s->freed_ms, decay) <= now || (cap_here && pageheap.backed.bytes > retain))) {
    release_take_t took = pageheap_take_for_release(s, now, false, batch);
    if (took == RELEASE_BATCH_FULL) {
      batch->more = true;
      break;
    }
    if (took == RELEASE_REFUSED) {
      pageheap_decay_after_refusal(now);
      return;
    }
  }
  pageheap_next_decay_from_oldest(decay);
}

/* pageheap_decay_run, when it has something to do. Every large malloc and free calls this twice
 * or more; most find nothing due and the backed free bytes within retain_max (at most the cap,
 * which is retain_max and more): then only the next due time is stored, as the run would, without
 * the run's six saved registers (about 30 instructions a call, callgrind). */
static inline void pageheap_decay(uint64_t now, release_batch_t *batch) {
  uint64_t due = pageheap_oldest_due_ms((uint64_t)option(OPTION_DECAY_MS));
  if (due > now && pageheap.backed.bytes <= (size_t)option(OPTION_RETAIN_MAX)) {
    __atomic_store_n(&pageheap.next_decay_ms, due, __ATOMIC_RELAXED);
    return;
  }
  pageheap_decay_run(now, batch);
}

/* Gives the batch's spans back to the OS with the lock released, and files them under it again;
 * then, if the decay stopped at a full batch, runs it again, until nothing more is due. Called and
 * returns with the lock held. */
static void pageheap_give_back(release_batch_t *batch) {
  while (batch->n > 0) {
    size_t n = batch->n;
    bool released[PAGEHEAP_RELEASE_BATCH];
    pthread_mutex_unlock(&pageheap.lock);
    /* The spans are this thread's until filed: no one else reads or writes their headers. */
    for (size_t i = 0; i < n; i++) {
      span_t *span = batch->taken[i].span;
      size_t bytes = span->npages * PAGE_SIZE;
      uintptr_t shadow = batch->taken[i].shadow;
      released[i] = (shadow == 0 || os_release((void *)shadow, bytes)) && os_release((void *)span->start, bytes);
    }
    pthread_mutex_lock(&pageheap.lock);
    uint64_t now = os_now_ms();
    bool refused = false;
    for (size_t i = 0; i < n; i++) {
      span_t *span = batch->taken[i].span;
      size_t bytes = span->npages * PAGE_SIZE;
      if (released[i]) {
        pageheap.release_calls++;
        pageheap.released_bytes_total += bytes;
        if (batch->taken[i].growth) pageheap.growth_released_bytes += bytes;
      } else {
        pageheap.release_failures++;
        refused = true;
      }
      pageheap_file_releasing(span, released[i], now);
    }
    batch->n = 0;
    if (refused) {
      pageheap_decay_after_refusal(now);
      batch->more = false;
    }
    if (batch->more) {
      batch->more = false;
      pageheap_decay(now, batch);
    }
  }
}

/* Releases the lock, first giving back what the call took for release (most calls took none). */
static inline void pageheap_unlock(release_batch_t *batch) {
  if (batch->n > 0) pageheap_give_back(batch);
  pthread_mutex_unlock(&pageheap.lock);
}

void pageheap_decay_now(void) {
  release_batch_t batch;
  release_batch_init(&batch);
  pthread_mutex_lock(&pageheap.lock);
  pageheap_decay(os_now_ms(), &batch);
  pageheap_unlock(&batch);
}

void pageheap_maybe_decay(uint64_t now) {
  if (now < __atomic_load_n(&pageheap.next_decay_ms, __ATOMIC_RELAXED)) return;
  release_batch_t batch;
  release_batch_init(&batch);
  pthread_mutex_lock(&pageheap.lock);
  pageheap_decay(now, &batch);
  pageheap_unlock(&batch);
}

/* Unmaps free spans, giving their address space back: released ones of at least min_pages pages,
 * and backed ones too if `backed_too` (address space is short). A span the kernel refuses to unmap
 * stays free and in place. Requires the lock. Returns the bytes unmapped. */
static size_t pageheap_unmap_free(size_t min_pages, bool backed_too) {
  size_t unmapped = 0;
  for (int pass = 0; pass < (backed_too ? 2 : 1); pass++) {
    free_set_t *set = pass == 0 ? &pageheap.released : &pageheap.backed;
    for (size_t i = pageheap_list_index(min_pages); i < PAGEHEAP_LISTS; i++) {
      span_t *next;
      for (span_t *s = set->lists[i]; s != NULL; s = next) {
        next = s->next;
        if (s->npages < min_pages) continue;
        size_t bytes = s->npages * PAGE_SIZE;
        pageheap_remove(s);
        pagemap_clear_ends(s);
        uintptr_t end = s->start + bytes;
        if (os_unmap((void *)s->start, bytes)) {
          if (qm_hardened) harden_park_forget(s->start, bytes); /* and its shadow */
          /* The chunk's guard goes with the last of its pages: the hole left behind faults too. */
          if (pagemap_span(end) == &pageheap_guard && os_unmap_guard((void *)end)) pageheap_set_guard(end, NULL);
          span_delete(s);
          unmapped += bytes;
        } else {
          pageheap_insert(s); /* the map-count limit: keep it for reuse */
        }
      }
    }
  }
  pageheap.unmapped_bytes_total += unmapped;
  if (unmapped) pageheap.region_low = 0; /* the region may have holes now: the next chunk starts a new one */
  return unmapped;
}

#define PAGEHEAP_TRIM_WAIT_MS 1000

size_t pageheap_release_all(void) {
  release_batch_t batch;
  release_batch_init(&batch);
  pthread_mutex_lock(&pageheap.lock);
  size_t before = pageheap.released_bytes_total;
  uint64_t now = os_now_ms();
  /* Each backed span once: one the kernel refuses moves to the newest end and is not retried. */
  for (size_t n = pageheap.free_spans; n > 0 && pageheap.oldest != NULL; n--) {
    if (batch.n == PAGEHEAP_RELEASE_BATCH) {
      pageheap_give_back(&batch); /* drops the lock: other threads may have taken every span since */
      if (pageheap.oldest == NULL) break;
    }
    (void)pageheap_take_for_release(pageheap.oldest, now, false, &batch);
  }
  pageheap_give_back(&batch);
  /* Spans another thread took for release (the background releaser's decay, another trim) are that
   * thread's to file: wait for their madvise, so that what was free has gone back when malloc_trim
   * returns. Without the wait, api-large_reuse found 26 MiB still resident after it, once in
   * ctest's repeated runs and once in 400 runs four at a time (0 in 400 with it). At most
   * PAGEHEAP_TRIM_WAIT_MS: a thread stopped between its madvise and the filing (in a signal
   * handler that blocks) keeps its spans to itself. sched_yield, not a sleep: no cancellation
   * point. */
  for (uint64_t from = os_now_ms(); pageheap.releasing != NULL && os_now_ms() - from < PAGEHEAP_TRIM_WAIT_MS;) {
    pthread_mutex_unlock(&pageheap.lock);
    sched_yield();
    pthread_mutex_lock(&pageheap.lock);
  }
  pageheap_next_decay_from_oldest((uint64_t)option(OPTION_DECAY_MS));
  size_t released = pageheap.released_bytes_total - before;
  /* And the address space of whole free regions: a program that peaked under RLIMIT_AS and shrank
   * can map again (glibc's trim gives back its top chunk the same way). Free runs shorter than
   * a chunk stay mapped, so trimming does not cut the heap into many small mappings. */
  released += pageheap_unmap_free(OS_CHUNK_SIZE / PAGE_SIZE, false);
  pthread_mutex_unlock(&pageheap.lock);
  return released;
}

/* ---- allocation ------------------------------------------------------------------------------ */

/* Maps fresh memory; when the kernel refuses (RLIMIT_AS, overcommit), first gives back the address
 * space of every free span, then tries once more. Requires the lock. */
static void *pageheap_map(size_t bytes, size_t alignment, os_guard_t guard) {
  void *p = os_map(bytes, alignment, OS_COMMIT, guard);
  if (p == NULL && pageheap_unmap_free(1, true) > 0) p = os_map(bytes, alignment, OS_COMMIT, guard);
  return p;
}

/* Gives back a range that never reached the page map (a failed mapping); if even that is refused,
 * the range stays mapped and is counted as mapped: lost to the process, but not to the statistics. */
static void pageheap_unmap_unused(void *p, size_t bytes, os_guard_t guard) { (void)os_unmap_guarded(p, bytes, guard); }

/* Takes address space from the OS: a new released span (fresh pages are zero and not resident).
 * The heap grows downward as one region where it can: a chunk mapped right below the previous one
 * needs no guard of its own (the region's guard is at its top end, where overflows run) and its
 * free runs coalesce with the chunk above, so a 25 MiB block fits where two chunks' free ends meet
 * (mtbench large-blocks: without it, twice the page faults). Elsewhere, a chunk with its own
 * guard after it. Requires the lock. */
static bool pageheap_grow(size_t npages) {
  size_t bytes = npages * PAGE_SIZE;
  if (bytes < OS_CHUNK_SIZE) bytes = OS_CHUNK_SIZE;
  os_guard_t guard = OS_GUARD_NONE;
  void *p = pageheap.region_low ? os_map_below(pageheap.region_low, bytes) : NULL;
  if (p == NULL) {
    guard = OS_GUARD_AFTER;
    p = pageheap_map(bytes, PAGE_SIZE, guard);
    /* Refused even after the free spans were unmapped (RLIMIT_AS): as much as the request needs,
     * not a whole chunk, so that a 1 MiB block does not need 32 MiB of address space to spare
     * (api-rlimit_as_threads: an aligned 1 MiB block refused once the heap was in islands). */
    size_t just_enough = pageheap_round_to_os_pages(npages) * PAGE_SIZE;
    if (p == NULL && just_enough < bytes) {
      bytes = just_enough;
      p = os_map(bytes, PAGE_SIZE, OS_COMMIT, guard);
    }
  }
  if (p == NULL) return false;
  size_t guard_pages = guard == OS_GUARD_AFTER ? os_guard_size() / PAGE_SIZE : 0;
  span_t *span = pagemap_ensure((uintptr_t)p, bytes / PAGE_SIZE + guard_pages)
                     ? span_new((uintptr_t)p, bytes / PAGE_SIZE, SPAN_FREE_RELEASED) : NULL;
  if (span == NULL) {
    pageheap_unmap_unused(p, bytes, guard);
    return false;
  }
  if (guard_pages) pageheap_set_guard((uintptr_t)p + bytes, &pageheap_guard);
  if (qm_hardened) harden_park_add_chunk((uintptr_t)p, bytes);
  pageheap.region_low = (uintptr_t)p;
  /* The first page's entry before the merge reads the one below it, on the same page of the leaf,
   * which is often new: written first, it faults once, where read first it faulted twice. */
  pagemap_set_page(span->start, span);
  pageheap_insert_coalesced(span);
  return true;
}

/* A huge block as a mapping of its own, registered under the lock (the mapping is made before: no
 * other thread can be given these addresses while they are mapped). Requires the lock. */
static span_t *pageheap_alloc_direct(size_t npages, size_t align_pages) {
  npages = pageheap_round_to_os_pages(npages); /* its guards must sit on kernel pages of their own */
  size_t bytes = npages * PAGE_SIZE;
  void *p = pageheap_map(bytes, align_pages * PAGE_SIZE, OS_GUARD_AROUND);
  if (p == NULL) return NULL;
  span_t *span = pagemap_ensure((uintptr_t)p, npages) ? span_new((uintptr_t)p, npages, SPAN_LARGE) : NULL;
  if (span == NULL) {
    pageheap_unmap_unused(p, bytes, OS_GUARD_AROUND);
    return NULL;
  }
  span->direct = 1;
  pagemap_set_ends(span);
  pageheap.direct_bytes += bytes;
  pageheap.direct_blocks++;
  return span;
}

/* How many backed spans pageheap_join looks at, longest first: it runs only when no backed span
 * fits, just before page faults that cost far more than the scan. */
#define PAGEHEAP_JOIN_SCAN 32

/* The released neighbour of backed span s on one side (right if `after`), or NULL. */
static span_t *pageheap_released_neighbour(const span_t *s, bool after) {
  uintptr_t end = pageheap_span_end(s);
  span_t *n = after ? pagemap_span(end) : s->start >= PAGE_SIZE ? pagemap_span(s->start - PAGE_SIZE) : NULL;
  if (n == NULL || n->state != SPAN_FREE_RELEASED) return NULL;
  if (after ? n->start != end : pageheap_span_end(n) != s->start) return NULL;
  return n;
}

/* No backed span has room for `need` pages: finds the backed span that, with the released span
 * next to it, has room and brings the most backed pages, and joins the two into a backed span of
 * exactly `need` pages (the released neighbour gives only what is missing and keeps the rest). So a
 * program that frees a 20 MiB block and asks for 25 MiB faults in 5 MiB, not 25: backed and
 * released neighbours are kept apart when freed (the released count stays exact), and without this
 * the backed part of such a pair is never reused by a larger request (mtbench large-blocks: twice
 * tcmalloc's page faults). The joined span holds dirty pages, so it is backed; *zero is set to its
 * released part, which reads as zero (calloc clears the rest).
 * Unaligned requests only. Requires the lock; returns the span in the backed set, or NULL. */
static span_t *pageheap_join(size_t need, zero_range_t *zero) {
  span_t *best = NULL, *best_n = NULL;
  size_t looked = 0;
  for (size_t i = PAGEHEAP_LISTS; i-- > 0 && looked < PAGEHEAP_JOIN_SCAN;) {
    if (!(pageheap.backed.nonempty[i / 64] & ((uint64_t)1 << (i % 64)))) continue;
    for (span_t *s = pageheap.backed.lists[i]; s != NULL && looked < PAGEHEAP_JOIN_SCAN; s = s->next, looked++) {
      if (best != NULL && s->npages <= best->npages) continue;
      for (int side = 0; side < 2; side++) {
        span_t *n = pageheap_released_neighbour(s, side == 1);
        if (n != NULL && (size_t)s->npages + n->npages >= need) {
          best = s;
          best_n = n;
          break;
        }
      }
    }
  }
  if (best == NULL) return NULL;
  size_t take = need - best->npages;
  bool after = best_n->start > best->start;
  pageheap_remove(best);
  pageheap_remove(best_n);
  if (after) { /* the neighbour keeps its far end */
    zero->lo = best_n->start;
    best_n->start += take * PAGE_SIZE;
    zero->hi = best_n->start;
  } else {
    zero->hi = best->start;
    best->start -= take * PAGE_SIZE;
    zero->lo = best->start;
  }
  if (qm_hardened) zero->lo = zero->hi = 0; /* parked pages (harden_park.c) come back as they were */
  best_n->npages -= (uint32_t)take;
  if (best_n->npages > 0) pageheap_insert(best_n); /* still released, next to a span in use */
  else span_delete(best_n);
  best->npages = (uint32_t)need;
  best->parked |= best_n->parked;
  pageheap_insert(best); /* its ends in the page map; no backed neighbour (they would have merged) */
  pageheap.joins++;
  return best;
}

/* No backed span has room for `need` pages, and with them the heap in use reaches a new high: they
 * are about to be faulted in. A program that grows a block by doubling it (realloc's growth, a
 * vector's, python3's dict tables) frees each step after the next one is made, too small for any
 * step that follows, and kept every step resident until the decay: python3 -m test test_dict peaked
 * at 29.9 MB where glibc's malloc, which maps such blocks on their own and unmaps them at free, took
 * 24.5 MB. So the free backed spans of at most half the request go first, the ones free longest
 * first, as many pages as the request faults in (PAGEHEAP_GROWTH_SCAN spans looked at, at most):
 * 29.0 MB. Larger ones stay: a working set of large blocks that turns over reuses them (mtbench
 * large-blocks --live 3: releasing every span, whatever its size, cost 19% more page faults, 4,000
 * on a run of 21,500, and took its peak RSS from 86.9 to 77.7 MB; python3 27.8 MB). Only at a new
 * high, where the peak is set; below it the decay suffices. Requires the lock. */
static void pageheap_release_for_growth(size_t need, release_batch_t *batch) {
  if ((uint64_t)option(OPTION_DECAY_MS) == UINT64_MAX) return; /* "never": malloc_trim only */
  uint64_t now = os_now_ms();
  span_t *s = pageheap.oldest, *newer;
  for (size_t left = need, looked = 0; left > 0 && s != NULL && looked < PAGEHEAP_GROWTH_SCAN; s = newer, looked++) {
    newer = s->u.age.newer; /* a release may split s and put its edges last on the age list */
    size_t npages = s->npages;
    if (2 * npages > need) continue;
    release_take_t took = pageheap_take_for_release(s, now, true, batch);
    if (took == RELEASE_BATCH_FULL || took == RELEASE_REFUSED) return; /* the decay covers the rest */
    left = npages >= left ? 0 : left - npages;
  }
}

/* A free span with room for npages pages at an align_pages-aligned start: backed first (no page
 * faults), then a backed span joined with its released neighbour (faults for the difference only;
 * unaligned requests), then released, then fresh address space if `grow`; before those two, at a
 * new high of the heap in use, as many backed pages are released as are about to be faulted in.
 * *zero: the part of the span known to read as zero (all of a released one, the released part of
 * a joined one). Requires the lock. */
static span_t *pageheap_find_any(size_t npages, size_t align_pages, bool grow, zero_range_t *zero,
                                 release_batch_t *batch) {
  size_t need = npages + align_pages - 1; /* with room for any start */
  /* The high counts the pages the request takes, not its alignment's slack, and only once it is
   * served: a refused malloc(16 TiB) or memalign(1 TiB) left a high no later growth reached, and
   * the release before a growth stopped running (a 60-step growth then peaked at 135-145 MiB, not
   * 120). */
  size_t in_use = pageheap.small_span_bytes + pageheap.large_bytes + pageheap.direct_bytes + npages * PAGE_SIZE;
  bool new_high = in_use > pageheap.in_use_high;
  zero->lo = zero->hi = 0;
  span_t *span = pageheap_find_fit(&pageheap.backed, npages, align_pages);
  if (span == NULL && align_pages == 1) span = pageheap_join(need, zero);
  if (span == NULL && new_high && need >= PAGEHEAP_GROWTH_RELEASE_PAGES) pageheap_release_for_growth(need, batch);
  if (span == NULL) span = pageheap_find_fit(&pageheap.released, npages, align_pages);
  if (span == NULL && grow && pageheap_grow(need)) span = pageheap_find_fit(&pageheap.released, npages, align_pages);
  if (span != NULL && span->state == SPAN_FREE_RELEASED) zero->lo = span->start, zero->hi = pageheap_span_end(span);
  if (span != NULL && new_high) pageheap.in_use_high = in_use;
  return span;
}

bool pageheap_would_fault_at_high(size_t npages) {
  pthread_mutex_lock(&pageheap.lock);
  size_t in_use = pageheap.small_span_bytes + pageheap.large_bytes + pageheap.direct_bytes + npages * PAGE_SIZE;
  bool faults = in_use > pageheap.in_use_high && pageheap_find(&pageheap.backed, npages) == NULL;
  pthread_mutex_unlock(&pageheap.lock);
  return faults;
}

span_t *pageheap_alloc(size_t npages, size_t align_pages, unsigned sizeclass, zero_range_t *zero) {
  if (npages == 0 || npages > UINT32_MAX || align_pages > UINT32_MAX) return NULL;
  /* Huge blocks, and blocks whose alignment is larger than a chunk (memalign(1 TiB, 100)), get a
   * mapping of their own unless a free span already has room: the page heap never grows by more
   * than the block itself, so an impossible request fails before anything lasting is reserved. */
  bool own_mapping = sizeclass == 0 && (npages * PAGE_SIZE >= (size_t)option(OPTION_RELEASE_LARGE) ||
                                        align_pages * PAGE_SIZE > OS_CHUNK_SIZE);
  release_batch_t batch;
  release_batch_init(&batch);
  pthread_mutex_lock(&pageheap.lock);
  uint64_t now = os_now_ms();
  zero_range_t found_zero;
  span_t *span = pageheap_find_any(npages, align_pages, !own_mapping, &found_zero, &batch);
  if (span == NULL) {
    span = own_mapping ? pageheap_alloc_direct(npages, align_pages) : NULL;
    pageheap_decay(now, &batch);
    pageheap_unlock(&batch);
    if (span != NULL && zero) zero->lo = span->start, zero->hi = pageheap_span_end(span);
    return span;
  }
  pageheap_remove(span);
  uint8_t free_state = span->state;
  uintptr_t align = align_pages * PAGE_SIZE;
  size_t lead = align_pages == 1 ? 0 : ((align - span->start % align) % align) / PAGE_SIZE; /* no divisions */
  if (lead > 0) { /* give back the pages before the aligned start */
    span_t *front = span;
    if (!pageheap_carve(front, lead)) goto fail;
    span = pagemap_span(front->start + lead * PAGE_SIZE); /* the rest, just inserted */
    pageheap_remove(span);
    span->state = SPAN_LARGE; /* taken: the front must not coalesce with it */
    pageheap_insert_coalesced(front);
    span->state = free_state;
  }
  if (!pageheap_carve(span, npages)) goto fail;
  /* In the hardened build it may hold pages of a freed large block, parked or protected in place:
   * then it is marked so. (An mprotect of every span taken here, in case, cost mixed-stress a fifth
   * of its time: its spans go back and forth between the central lists and the page heap.) */
  if (qm_hardened && span->parked) harden_unpark(span->start, span->npages * PAGE_SIZE);
  span->parked = 0;
  if (zero) { /* what of the span found is this span's */
    uintptr_t lo = span->start, hi = pageheap_span_end(span);
    zero->lo = found_zero.lo > lo ? found_zero.lo : lo;
    zero->hi = found_zero.hi < hi ? found_zero.hi : hi;
    if (zero->lo >= zero->hi) zero->lo = zero->hi = 0;
  }
  if (sizeclass != 0) {
    span->state = SPAN_SMALL;
    span->sizeclass = (uint8_t)sizeclass;
    pagemap_set_small(span);
    pageheap.small_span_bytes += npages * PAGE_SIZE;
  } else {
    span->state = SPAN_LARGE;
    span->sizeclass = 0;
    span->freed_ms = now; /* handed out now: its age at its free (pageheap_unresident_runs) */
    pagemap_set_ends(span);
    pageheap.large_bytes += npages * PAGE_SIZE;
  }
  /* The decay after the search, not before: a span due for release that the request can use is
   * taken as it is, not dropped and faulted in again (and spans on their way to the OS are in no
   * set the search sees). */
  pageheap_decay(now, &batch);
  pageheap_unlock(&batch);
  return span;
fail:
  pageheap_insert_coalesced(span);
  pageheap_unlock(&batch);
  return NULL;
}

/* ---- freeing --------------------------------------------------------------------------------- */

/* A huge block's mapping goes back to the OS. It leaves the page map first, under the lock, and is
 * unmapped after (while it is still mapped, no other thread can be given its addresses). If the
 * kernel refuses the munmap (the map-count limit), the range becomes a free backed span of the page
 * heap instead: reused by the next allocations, unmapped on malloc_trim or address-space pressure. */
static void pageheap_free_direct(span_t *span, uintptr_t start) {
  pthread_mutex_lock(&pageheap.lock);
  if (!span_is_large_block(span, start)) check_fail_double_free("free()", (void *)start);
  size_t bytes = span->npages * PAGE_SIZE;
  pagemap_clear_ends(span);
  span->state = SPAN_DEAD; /* a concurrent second free of it now finds it gone */
  pageheap.direct_bytes -= bytes;
  pageheap.direct_blocks--;
  pthread_mutex_unlock(&pageheap.lock);
  bool unmapped;
  if (span->guard_lost) { /* the page past it is someone else's */
    unmapped = os_unmap((void *)span->start, bytes);
    if (unmapped) (void)os_unmap_guard((void *)(span->start - os_guard_size()));
  } else {
    unmapped = os_unmap_guarded((void *)span->start, bytes, OS_GUARD_AROUND);
  }
  pthread_mutex_lock(&pageheap.lock);
  if (unmapped) {
    span_delete(span);
  } else {
    pageheap.unmap_failures++;
    span->direct = 0;
    span->parked = qm_hardened; /* its last page is the hardened build's guard: protected in place */
    span->state = SPAN_FREE_BACKED;
    span->freed_ms = os_now_ms();
    pageheap_insert_coalesced(span);
  }
  pthread_mutex_unlock(&pageheap.lock);
}

/* Adds [from, to) to runs[] if it is a run long enough to count (PAGEHEAP_RESIDENCY_RUN_PAGES);
 * returns the count. */
static size_t pageheap_add_run(uintptr_t runs[][2], size_t nruns, uintptr_t from, uintptr_t to) {
  if (to - from < PAGEHEAP_RESIDENCY_RUN_PAGES * PAGE_SIZE) return nruns;
  runs[nruns][0] = from, runs[nruns][1] = to;
  return nruns + 1;
}

/* The runs of a freed large block [start, start + npages pages), handed out age_ms ago, that hold
 * no page in memory, for pageheap_file_freed: into runs[], how many (none asked of a block
 * younger than PAGEHEAP_RESIDENCY_MIN_AGE_MS). A block is often not written to its end (a
 * buffer that realloc grew to 4 MiB and that was filled to 2.5). Its last page is asked first: a
 * block written to its end (most are) is asked no more, where all of it took about 6 ns a kernel
 * page, 14% of mtbench large-blocks' time (blocks of 5-25 MiB reused without a page fault). Runs
 * start and end where kernel pages (or qmalloc's, if larger) do; only runs of at least
 * PAGEHEAP_RESIDENCY_RUN_PAGES count, the first PAGEHEAP_RESIDENCY_RUNS of them. None in the
 * hardened build, whose freed large blocks are parked (harden_park.c). Takes no lock: the block is
 * its freeing thread's until it is filed (a second free of it is found then). */
static size_t pageheap_unresident_runs(uintptr_t start, size_t npages, uint64_t age_ms, uintptr_t runs[][2]) {
  if (qm_hardened || npages < PAGEHEAP_RESIDENCY_MIN_PAGES || age_ms < PAGEHEAP_RESIDENCY_MIN_AGE_MS) return 0;
  uintptr_t unit = os_page_size() > PAGE_SIZE ? os_page_size() : PAGE_SIZE, lo, hi;
  uint8_t resident[256];
  size_t nruns = 0;
  if (!pageheap_whole_kernel_pages(start, npages, &lo, &hi) ||
      !os_resident_units((void *)(hi - unit), unit, 1, resident) || resident[0])
    return 0;
  uintptr_t from = 0; /* where the current run of units holding no page started, or 0 */
  for (uintptr_t at = lo; hi - at >= unit && nruns < PAGEHEAP_RESIDENCY_RUNS;) { /* sizeof resident units a question */
    size_t left = (size_t)((hi - at) / unit), n = left < sizeof resident ? left : sizeof resident;
    if (!os_resident_units((void *)at, unit, n, resident)) return nruns; /* a run not asked to its end is not one */
    for (size_t i = 0; i < n && nruns < PAGEHEAP_RESIDENCY_RUNS; i++, at += unit) {
      if (!resident[i] && from == 0) from = at;
      if (resident[i] && from != 0) nruns = pageheap_add_run(runs, nruns, from, at), from = 0;
    }
  }
  if (from != 0 && nruns < PAGEHEAP_RESIDENCY_RUNS) nruns = pageheap_add_run(runs, nruns, from, hi); /* to the block's end */
  return nruns;
}

/* Files a free piece of a span cut by pageheap_file_freed, in `state`. */
static void pageheap_file_piece(span_t *piece, uint8_t state, uint64_t now) {
  piece->state = state;
  piece->freed_ms = now;
  pageheap_insert_coalesced(piece);
}

/* Files a freed span in the free sets: the runs of it that held no page in memory
 * (pageheap_unresident_runs; none: the span in one piece, backed) go to the released set, the rest
 * to the backed set. A large block is often not written to its end, and as one backed span its
 * untouched pages were counted as resident and reused as if they were: sqlite3 building an index
 * (mtbench's real family) frees its sorter's buffer and then grows its page cache into spans
 * carved from it, faulting each page in, while free pages it had written stayed resident (peak RSS
 * 21.2 MB, 20.2-20.5 MB filed apart; glibc's malloc 18.0 MB). A run is released
 * (madvise, which costs nothing there, and after which even a page that was swapped out reads as
 * zero, as calloc expects of a released span); what cannot be cut (no span header) or released
 * stays backed. A piece not filed yet is SPAN_LARGE, so that none merges with the one being cut.
 * Requires the lock; span is in no set. With no runs, span is filed whole and stays the span that
 * holds its pages (its free neighbours merged into it). */
static void pageheap_file_freed(span_t *span, uintptr_t runs[][2], size_t nruns, uint64_t now) {
  uintptr_t end = pageheap_span_end(span);
  span->state = SPAN_LARGE;
  span_t *rest = span; /* [rest->start, end): not filed yet */
  for (size_t r = 0; r < nruns; r++) {
    uintptr_t a = runs[r][0], b = runs[r][1];
    if (a > rest->start) { /* the part before the run: backed */
      span_t *from_run = span_new(a, (uint32_t)((end - a) / PAGE_SIZE), SPAN_LARGE);
      if (from_run == NULL) break;
      rest->npages = (uint32_t)((a - rest->start) / PAGE_SIZE);
      pageheap_file_piece(rest, SPAN_FREE_BACKED, now);
      rest = from_run;
    }
    span_t *after_run = NULL;
    if (b < end && (after_run = span_new(b, (uint32_t)((end - b) / PAGE_SIZE), SPAN_LARGE)) == NULL) break;
    rest->npages = (uint32_t)((b - a) / PAGE_SIZE);
    pageheap_file_piece(rest, os_release((void *)a, b - a) ? SPAN_FREE_RELEASED : SPAN_FREE_BACKED, now);
    rest = after_run;
    if (rest == NULL) return;
  }
  pageheap_file_piece(rest, SPAN_FREE_BACKED, now);
}

/* pageheap_free, and pageheap_free_block with the block's start (0: the caller owns the span). What
 * is read before the lock decides only what to ask the kernel (the runs); a header that changed
 * owner meanwhile is found under the lock, before anything is written. */
static void pageheap_free_span(span_t *span, uintptr_t start) {
  if (span->direct) {
    pageheap_free_direct(span, start ? start : span->start);
    return;
  }
  uint64_t now = os_now_ms();
  /* A huge block served from free spans keeps release_large's promise: back to the OS at once. */
  bool large = span->state == SPAN_LARGE;
  bool release_now = large && span->npages * PAGE_SIZE >= (size_t)option(OPTION_RELEASE_LARGE);
  uintptr_t runs[PAGEHEAP_RESIDENCY_RUNS][2];
  size_t nruns = large && !release_now ? pageheap_unresident_runs(span->start, span->npages, now - span->freed_ms, runs)
                                       : 0;
  pthread_mutex_lock(&pageheap.lock);
  if (start != 0 && !span_is_large_block(span, start)) check_fail_double_free("free()", (void *)start);
  if (span->state == SPAN_SMALL) {
    pagemap_clear_small(span);
    pageheap.small_span_bytes -= span->npages * PAGE_SIZE;
  } else if (span->state == SPAN_LARGE) {
    if (qm_hardened) { /* a read or write after free faults */
      /* Its guard (its last page) goes with it: parked apart, the two became two mappings that no
       * longer merged with their neighbours (hundreds of one-page mappings, measured). */
      harden_unguard_large(span);
      harden_park(span->start, span->npages * PAGE_SIZE);
      span->parked = 1;
    }
    pageheap.large_bytes -= span->npages * PAGE_SIZE;
  } else {
    check_fail_double_free("free()", (void *)span->start);
  }
  span->sizeclass = 0;
  pageheap_file_freed(span, runs, nruns, now);
  release_batch_t batch;
  release_batch_init(&batch);
  /* No runs asked: span is the merged span now. */
  if (release_now) (void)pageheap_take_for_release(span, now, false, &batch);
  pageheap_decay(now, &batch);
  if (pageheap.backed.bytes >= RELEASE_START_BYTES) release_request();
  pageheap_unlock(&batch);
}

void pageheap_free(span_t *span) { pageheap_free_span(span, 0); }

void pageheap_free_block(span_t *span, uintptr_t start) { pageheap_free_span(span, start); }

bool pageheap_resize_in_place(span_t *span, size_t new_npages) {
  if (span->direct || new_npages == 0 || new_npages > UINT32_MAX) return false;
  bool done = false;
  /* A shrunk block's tail is filed as a freed block is (pageheap_file_freed): a buffer read
   * into and then cut to what it holds leaves a tail it never wrote. Asked before the lock, as a
   * free's: the block is its caller's. */
  uintptr_t runs[PAGEHEAP_RESIDENCY_RUNS][2], tail_start = span->start + new_npages * PAGE_SIZE;
  uint64_t now = os_now_ms();
  bool shrinks = new_npages < span->npages;
  size_t nruns = shrinks ? pageheap_unresident_runs(tail_start, span->npages - new_npages, now - span->freed_ms, runs) : 0;
  pthread_mutex_lock(&pageheap.lock);
  if (shrinks) {
    span_t *tail = span_new(tail_start, span->npages - new_npages, SPAN_LARGE);
    if (tail != NULL) {
      if (qm_hardened) { /* the pages given up become inaccessible, as a freed large block's */
        harden_park(tail->start, tail->npages * PAGE_SIZE);
        tail->parked = 1;
      }
      pageheap.large_bytes -= tail->npages * PAGE_SIZE;
      span->npages = (uint32_t)new_npages;
      pagemap_set_ends(span);
      pageheap_file_freed(tail, runs, nruns, now);
      done = true;
    }
  } else {
    size_t extra = new_npages - span->npages;
    uintptr_t end = pageheap_span_end(span);
    span_t *right = pagemap_span(end);
    if (right && right->start == end && right->npages >= extra &&
        (right->state == SPAN_FREE_BACKED || right->state == SPAN_FREE_RELEASED)) {
      pageheap_remove(right);
      if (pageheap_carve(right, extra)) {
        /* The hardened build's freed large blocks there: their pages back (as pageheap_alloc). */
        if (qm_hardened && right->parked) harden_unpark(end, extra * PAGE_SIZE);
        span_delete(right);
        span->npages = (uint32_t)new_npages;
        pagemap_set_ends(span);
        pageheap.large_bytes += extra * PAGE_SIZE;
        done = true;
      } else {
        pageheap_insert(right);
      }
    }
  }
  pthread_mutex_unlock(&pageheap.lock);
  return done;
}

/* The whole remap runs under the lock: the kernel frees the old range (a move) or the tail (a
 * shrink) the moment mremap returns, and another thread's new mapping may land there at once; it
 * registers its pages only under this lock, so our page-map updates for the old range must be done
 * before the lock is released. A move goes onto a target mapped (and given page-map leaves) first,
 * so there is nothing to undo if a leaf cannot be had, and no MREMAP_FIXED over addresses that may
 * belong to someone else by then. */
span_t *pageheap_remap(span_t *span, size_t new_npages) {
  if (!span->direct || new_npages == 0 || new_npages > UINT32_MAX) return NULL;
  new_npages = pageheap_round_to_os_pages(new_npages);
  if (new_npages == span->npages) return span; /* the same whole kernel pages */
  size_t new_bytes = new_npages * PAGE_SIZE, guard = os_guard_size();
  os_grow_t grown = OS_NOT_GROWN;
  pthread_mutex_lock(&pageheap.lock);
  size_t old_bytes = span->npages * PAGE_SIZE;
  uintptr_t start = span->start;
  if (new_bytes <= old_bytes) {
    /* Shrink in place: the first page past the new end becomes the guard, and the rest of the old
     * tail goes with the old guard. (A shrink by less than a guard is left to copying.) */
    if (old_bytes - new_bytes < guard || !os_protect((void *)(start + new_bytes), guard, false)) goto fail;
    size_t tail = old_bytes - new_bytes - (span->guard_lost ? guard : 0); /* a lost guard is not ours */
    if (tail > 0 && !os_unmap((void *)(start + new_bytes + guard), tail)) {
      (void)os_protect((void *)(start + new_bytes), guard, true); /* the block as it was */
      goto fail;
    }
    span->guard_lost = 0;
  } else if (!span->guard_lost && pagemap_ensure(start, new_npages) &&
             (grown = os_grow_guarded((void *)start, old_bytes, new_bytes)) == OS_GROWN) {
    /* Grown where it is: the address space past its guard was free. A block that realloc grows a
     * little at a time (perl's Storable: 8 KiB steps) mostly grows so, into the room a move leaves
     * past its new place (below). Moving each time cost a quadratic time: 16 s to grow one block
     * to 256 MiB in 8 KiB steps, glibc 0.2 s. */
  } else {
    /* Grow by a move, onto a guarded target alike modulo 2 MiB, so that the kernel shifts whole
     * page tables (a move of 128 MiB took about 300 us, entry by entry, before). The target's
     * reservation leaves an eighth of its size of free address space past its guard, where the
     * next growths can take place without a move. */
    if (grown == OS_NOT_GROWN_GUARD_LOST) span->guard_lost = 1; /* until it moves, below */
    void *target = os_map_guarded_like(new_bytes, start);
    if (target == NULL) goto fail;
    if (!pagemap_ensure((uintptr_t)target, new_npages) || !os_move((void *)start, old_bytes, new_bytes, target)) {
      pageheap_unmap_unused(target, new_bytes, OS_GUARD_AROUND);
      goto fail;
    }
    (void)os_unmap_guard((void *)(start - guard));
    if (!span->guard_lost) (void)os_unmap_guard((void *)(start + old_bytes));
    span->guard_lost = 0; /* guarded on both sides again */
    start = (uintptr_t)target;
  }
  pagemap_clear_ends(span);
  span->start = start;
  span->npages = (uint32_t)new_npages;
  pagemap_set_ends(span);
  pageheap.direct_bytes += new_bytes - old_bytes;
  pthread_mutex_unlock(&pageheap.lock);
  return span;
fail:
  pthread_mutex_unlock(&pageheap.lock);
  return NULL;
}

/* ---- process life, statistics ---------------------------------------------------------------- */

void pageheap_lock_for_fork(void) { fork_lock(&pageheap.lock, FORK_SLOT_PAGEHEAP); }

/* In a child, the spans another thread of the parent was releasing have no one to file them: they
 * go back as backed (whether the madvise ran before the fork or not, backed claims nothing about
 * their contents). The forking thread's own, if a signal handler forked in the middle of its
 * release, stay in flight: the interrupted call files them when the handler returns (filed here
 * too, they were filed twice: a span in two sets, the heap corrupted). */
void pageheap_unlock_after_fork(bool child) {
  if (child) {
    uint64_t now = os_now_ms();
    for (span_t *s = pageheap.releasing, *next; s != NULL; s = next) {
      next = s->next;
      if (s->u.releaser != pageheap_batch_mine) pageheap_file_releasing(s, false, now);
    }
  }
  fork_unlock(&pageheap.lock, FORK_SLOT_PAGEHEAP, child);
}

void pageheap_stats(pageheap_stats_t *out) {
  pthread_mutex_lock(&pageheap.lock);
  out->free_backed_bytes = pageheap.backed.bytes + pageheap.releasing_bytes;
  out->free_released_bytes = pageheap.released.bytes;
  out->small_span_bytes = pageheap.small_span_bytes;
  out->large_bytes = pageheap.large_bytes;
  out->direct_bytes = pageheap.direct_bytes;
  out->direct_blocks = pageheap.direct_blocks;
  out->free_spans = pageheap.free_spans;
  out->release_calls = pageheap.release_calls;
  out->growth_released_bytes = pageheap.growth_released_bytes;
  out->released_bytes_total = pageheap.released_bytes_total;
  out->release_failures = pageheap.release_failures;
  out->unmap_failures = pageheap.unmap_failures;
  out->unmapped_bytes_total = pageheap.unmapped_bytes_total;
  pthread_mutex_unlock(&pageheap.lock);
}
