/* Thread cache: per thread, one free list per size class. This file is its slow half: creating
 * the cache, refilling a list from the central list, flushing a list that grew too long, the
 * low-water-mark garbage collection of seed 002, the process-wide budget (a total split among
 * live threads, which may steal from each other), taking back the caches of idle threads, and
 * handing everything back at thread exit. The fast half (pop and push) is in api.c.
 * Lock: none for the cache itself: its thread touches it inside its window (tcache_window.h),
 * another thread only after stopping it there, holding its reclaim_lock; max_size may be lowered
 * by others under the registry lock. tcache_registry.lock for the list of live caches, the budget
 * and idle scans. Callers: api.c. */
#include <pthread.h>
#include <string.h>

#include "freelist.h"
#include "callers.h"
#include "internal.h"
#include "log.h"
#include "os.h"
#include "prof.h"
#include "tcache_window.h"

__thread tcache_t tcache_self __attribute__((tls_model("initial-exec"))) = {.leaf_key = UINTPTR_MAX};

/* The least budget a thread keeps; stealing stops there. */
#define TCACHE_MIN_SIZE TCACHE_STEAL_STEP

static struct {
  pthread_mutex_t lock;
  tcache_t *head;           /* live caches */
  size_t threads;
  intptr_t unclaimed;       /* total budget minus what live caches hold; may go negative */
  tcache_t *steal_cursor;   /* next victim, round robin */
  pthread_key_t exit_key;   /* its destructor hands the cache back at thread exit */
  bool exit_key_ok;         /* pthread_key_create succeeded: without it no thread keeps a cache */
  uint64_t retired_refills, retired_flushes, retired_gc_runs; /* counters of exited threads */
  bool can_stop_others;     /* membarrier(2) works: idle caches can be taken back */
  uint64_t next_scan_ms;    /* when the next idle scan is due (read without the lock) */
  uint64_t reclaims, reclaimed_bytes; /* idle caches taken back so far, and what they held */
} tcache_registry QM_EARLY_DATA = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void tcache_thread_exit(void *unused);
static void tcache_unregister(tcache_t *tc);
static void tcache_flush_all(tcache_t *tc);

/* ---- moving objects to the central lists --------------------------------------------------- */

/* Gives the first n (> 0) objects of a chain to the central list of cls; returns the rest. The
 * walk checks each link as central.c's does (freelist_next_checked): a damaged one would send the
 * cut's store to wherever it decodes. */
static void *tcache_hand_over(unsigned cls, void *head, uint32_t n) {
  void *last = head;
  for (uint32_t i = 1; i < n; i++) last = freelist_next_checked(last, "free()");
  void *rest = freelist_next_checked(last, "free()");
  freelist_set_next(last, NULL);
  central_insert(cls, head, n);
  return rest;
}

/* Moves n objects of a list to the central list of cls: the first n, or, when that would leave one
 * object, all but the head. Finding where n objects end takes a walk of dependent loads, one cache
 * miss each on objects another thread allocated (a consumer's frees: 94% of tcache_release's
 * samples in remote-stream); a list's chain already ends at its last object, so handing over the
 * whole list, or everything after its head, needs no walk. An overflowing list at its maximum is
 * the second case: its head, the object just freed, stays, the oldest go. */
static void tcache_release(tcache_list_t *list, unsigned cls, uint32_t n) {
  if (n == 0) return;
  uint32_t length = list_length(list);
  if (n == length) {
    central_insert(cls, list->head, n);
    list->head = NULL;
  } else if (n + 1 == length) {
    void *rest = freelist_next_checked(list->head, "free()");
    freelist_set_next(list->head, NULL);
    central_insert(cls, rest, n);
  } else {
    list->head = tcache_hand_over(cls, list->head, n);
  }
  list_set_length(list, length - n); /* lowers the floor with it */
}

/* Releases in batch-sized chains so the transfer cache can take them whole. */
static void tcache_release_all_of(tcache_list_t *list, unsigned cls) {
  uint32_t batch = sizeclass_batch[cls];
  for (uint32_t n; (n = list_length(list)) > 0;) tcache_release(list, cls, n < batch ? n : batch);
}

static size_t tcache_max_size(const tcache_t *tc) { return __atomic_load_n(&tc->max_size, __ATOMIC_RELAXED); }
/* A cache's capacity is written by its owner (or by a taker while the owner is stopped) and read by
 * other threads (tcache_grow_budget's steal, the idle scan, the statistics): every write is an
 * atomic store, relaxed (a plain store on x86-64 and aarch64). ThreadSanitizer reported the plain
 * `+=` of tcache_grow_list against the steal's read when threads take budget from each other
 * (checked-tsan's stress-stress-pressure: a 256 KiB total). */
static void tcache_set_capacity(tcache_t *tc, size_t capacity) {
  __atomic_store_n(&tc->capacity, capacity, __ATOMIC_RELAXED);
}
/* The same for the owner's counters, which the statistics read from any thread (tcache_totals):
 * one more, stored atomically (no read-modify-write: only the owner writes them). ThreadSanitizer
 * reported refills++ against qm_stats_print in another thread. */
static void tcache_count(uint64_t *counter) { __atomic_store_n(counter, *counter + 1, __ATOMIC_RELAXED); }

/* ---- invariants (QM_DEBUG builds run this on every slow path; unit tests call it) ---------------- */

const char *tcache_check(const tcache_t *tc) {
  size_t capacity = 0;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    const tcache_list_t *list = &tc->lists[cls];
    uint32_t n = 0;
    for (void *p = list->head; p != NULL && n <= TCACHE_LIST_MAX_LENGTH + 1u; p = freelist_next(p)) {
      if (pagemap_entry_class(pagemap_small_of((uintptr_t)p)) != cls) return "an object on a list of another class";
      if (!freelist_tagged(p, freelist_key(p))) return "an object on a list without its free tag";
      n++;
    }
    if (((list->count | list->max_count) & 1u) || LIST_STOPPED(list->count) || LIST_STOPPED(list->max_count))
      return "a count odd, stopped or below the floor outside any operation";
    if (n != list_length(list)) return "list length differs from its chain";
    if (list->count > list->max_count) return "list longer than its maximum";
    capacity += (size_t)list_max(list) * sizeclass_size[cls];
  }
  if (tc->state == TCACHE_LIVE && capacity != tc->capacity) return "capacity differs from the lists' maxima";
  return NULL;
}

/* QM_DEBUG builds and check=2 (QMALLOC_CHECK=2: extra, slower checks) walk every list of the cache,
 * tags and classes included, after each slow path. */
static void tcache_debug_check(const tcache_t *tc, const char *where) {
  if (!qm_debug && option(OPTION_CHECK) < 2) return;
  const char *broken = tcache_check(tc);
  if (broken) log_fatal("tcache_check after %s: %s", where, broken);
}

/* ---- life of a cache ------------------------------------------------------------------------- */

static void tcache_thread_init(tcache_t *tc) {
  init_process();
  if (tc->state == TCACHE_LIVE) return; /* init_process's own allocations made it already */
  if (!tcache_registry.exit_key_ok || callers_thread_exiting()) {
    /* Nothing would hand the cache back at thread exit, and a dead thread's memory is reused for
     * the next one's: the thread works uncached, as an exiting one does (slower, never wrong).
     * So does a thread whose first call comes from a destructor glibc runs as it tears the thread
     * down: a pthread key's destructor in the last of PTHREAD_DESTRUCTOR_ITERATIONS rounds is
     * followed by none, so qmalloc's own key's destructor would not run, and the cache would
     * stay registered in memory glibc reuses for the next thread's TLS (the registry's list
     * then looped on itself: every scan, malloc_stats and exiting thread hung, and a process
     * whose main thread called pthread_exit never ended; api-key_last_round). */
    tc->state = TCACHE_DEAD;
    return;
  }
  pthread_mutex_lock(&tcache_registry.lock);
  size_t claim = TCACHE_START_SIZE;
  if (tcache_registry.unclaimed < (intptr_t)claim)
    claim = tcache_registry.unclaimed > (intptr_t)TCACHE_MIN_SIZE ? (size_t)tcache_registry.unclaimed : TCACHE_MIN_SIZE;
  if (claim > (size_t)option(OPTION_TCACHE_MAX)) claim = (size_t)option(OPTION_TCACHE_MAX);
  tcache_registry.unclaimed -= (intptr_t)claim;
  tc->max_size = claim;
  tc->prev = NULL;
  tc->next = tcache_registry.head;
  if (tc->next) tc->next->prev = tc;
  tcache_registry.head = tc;
  __atomic_store_n(&tcache_registry.threads, tcache_registry.threads + 1, __ATOMIC_RELAXED); /* read unlocked: tcache_live_caches */
  if (tcache_registry.threads >= 2) release_request(); /* an idle thread's cache may need taking */
  tc->idle_seen = UINT64_MAX; /* not idle until a scan has seen it */
  memcpy(tc->magic, sizeclass_magic, sizeof tc->magic);
  pthread_key_t key = tcache_registry.exit_key;
  pthread_mutex_unlock(&tcache_registry.lock);
  tc->state = TCACHE_LIVE;
  /* May allocate (keys past 32): the cache is live already. If it fails (ENOMEM), the cache is
   * handed back now and the thread goes on uncached. */
  if (pthread_setspecific(key, tc) != 0) {
    tcache_flush_all(tc); /* what a nested malloc inside it may have cached */
    for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) list_set_max(&tc->lists[cls], 0);
    tcache_unregister(tc);
    return;
  }
  tcache_housekeeping();
}

/* The owner found op_seq negative: a taker stopped this cache (or, after 2^30 slow paths, the
 * count ran into bit 31). Waits until the taker is done, then repairs what it left stopped: a
 * list it took starts again empty, except for the one object a push in flight may have put at its
 * head (tcache_window.h), which goes to the central list; a list it let be keeps its count. */
static QM_NOINLINE void tcache_wake(tcache_t *tc) {
  pthread_mutex_lock(&tc->reclaim_lock);
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    tcache_list_t *list = &tc->lists[cls];
    if (tc->stopped_lists[cls / 64] & ((uint64_t)1 << (cls % 64))) {
      void *late = list->head;
      list->head = NULL;
      list->count = 0;
      if (late != NULL) {
        freelist_set_next(late, NULL);
        central_insert(cls, late, 1);
      }
    } else if (LIST_STOPPED(list->count)) {
      list->count = (uint16_t)(list->count - LIST_STOP);
    }
  }
  tc->stopped_lists[0] = tc->stopped_lists[1] = 0;
  __atomic_store_n(&tc->op_seq, tc->op_seq & INT32_MAX, __ATOMIC_RELAXED); /* odd: still inside */
  pthread_mutex_unlock(&tc->reclaim_lock);
  tcache_debug_check(tc, "repair after a reclaim");
}

tcache_t *tcache_open(void) {
  tcache_t *tc = &tcache_self;
  if (QM_UNLIKELY(!window_enter(tc))) tcache_wake(tc);
  return tc;
}

void tcache_close(tcache_t *tc) { window_leave(tc); }

static void tcache_flush_all(tcache_t *tc) {
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) tcache_release_all_of(&tc->lists[cls], cls);
}

void tcache_flush_self(void) {
  tcache_t *tc = tcache_open();
  if (tc->state == TCACHE_LIVE) tcache_flush_all(tc);
  tcache_close(tc);
}

/* The classes of TCACHE_GROWTH_FLUSH_MIN bytes or more are the last ones (sizes ascend with the
 * class), from this one. A constant, so that the test below is unrolled. */
#define TCACHE_GROWTH_ROW(cls, size, pages) +((size) >= TCACHE_GROWTH_FLUSH_MIN)
enum { TCACHE_GROWTH_FIRST = SIZECLASS_COUNT - (0 SIZECLASS_ROWS(TCACHE_GROWTH_ROW)) };

void tcache_flush_for_growth(size_t npages) {
  const unsigned first = TCACHE_GROWTH_FIRST;
  tcache_t *tc = tcache_open();
  /* An owner's list outside a push or pop holds an object exactly when its head is not NULL: the
   * heads OR-ed together, one or two instructions a class where the lengths took twelve (17
   * classes: about 170 instructions fewer on every large malloc of 1 MiB or more; callgrind). */
  uintptr_t heads = 0;
#pragma GCC unroll 32
  for (unsigned cls = first; cls < SIZECLASS_COUNT; cls++) heads |= (uintptr_t)tc->lists[cls].head;
  /* The page heap's lock only when there is something to send back: none for a program whose
   * thread caches hold no object of these classes (mtbench large-blocks). */
  if (heads != 0 && tc->state == TCACHE_LIVE && pageheap_would_fault_at_high(npages)) {
    for (unsigned cls = first; cls < SIZECLASS_COUNT; cls++) {
      tcache_list_t *list = &tc->lists[cls];
      if (list_length(list) == 0) continue;
      central_insert_to_spans(cls, list->head); /* not kept in the transfer cache: to the spans */
      list->head = NULL;
      list_set_length(list, 0); /* lowers the floor with it */
    }
  }
  tcache_close(tc);
}

static void tcache_thread_exit(void *unused) {
  if (qm_hardened) harden_thread_exit(); /* its quarantine first: those blocks are not in the lists */
  prof_pages_release(true); /* the sampled blocks' pages it kept */
  tcache_t *tc = tcache_open();
  if (tc->state != TCACHE_LIVE) {
    tcache_close(tc);
    return;
  }
  tcache_flush_all(tc);
  /* Out of the registry first: its scans and tcache_totals read a listed cache's maxima (ThreadSanitizer
   * saw this store race tcache_totals' read when it came before). */
  tcache_unregister(tc);
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++)
    list_set_max(&tc->lists[cls], 0); /* every later free of this thread takes the slow path */
  tcache_close(tc);
}

/* Takes a cache with empty lists out of the registry, its budget back, and marks it dead. */
static void tcache_unregister(tcache_t *tc) {
  pthread_mutex_lock(&tcache_registry.lock);
  if (tc->prev) tc->prev->next = tc->next;
  else tcache_registry.head = tc->next;
  if (tc->next) tc->next->prev = tc->prev;
  if (tcache_registry.steal_cursor == tc) tcache_registry.steal_cursor = NULL;
  __atomic_store_n(&tcache_registry.threads, tcache_registry.threads - 1, __ATOMIC_RELAXED);
  tcache_registry.unclaimed += (intptr_t)tcache_max_size(tc);
  tcache_registry.retired_refills += tc->refills;
  tcache_registry.retired_flushes += tc->flushes;
  tcache_registry.retired_gc_runs += tc->gc_runs;
  pthread_mutex_unlock(&tcache_registry.lock);
  tcache_set_capacity(tc, 0);
  tc->state = TCACHE_DEAD;
}

/* ---- budget ------------------------------------------------------------------------------------ */

/* Grows this cache's budget by one step: from the unclaimed total if any is left, otherwise (if
 * `steal`) from another thread's budget, round robin, so busy threads gain what idle ones do not
 * use. Returns whether it grew.
 * A step another thread's lists do not use is taken from any of them. A step they use is taken
 * only by a thread below its fair share (the total over the live threads) from one above it: its
 * lists then hold more than its budget until its next slow path (tcache_fit_budget), and a thread
 * that sleeps meanwhile keeps it. Taking used steps freely let 64 threads on 2 CPUs hold 249 MiB
 * against a total of 32 MiB (docs/design.md, "the total bounds budgets"); so bounded, the caches
 * hold at most twice the total: a thread is brought down to its fair share at most, from a budget
 * it held within the total. */
static bool tcache_grow_budget(tcache_t *tc, bool steal) {
  size_t cap = (size_t)option(OPTION_TCACHE_MAX);
  bool grew = false;
  pthread_mutex_lock(&tcache_registry.lock);
  size_t mine = tcache_max_size(tc);
  if (mine + TCACHE_STEAL_STEP <= cap) {
    if (tcache_registry.unclaimed >= (intptr_t)TCACHE_STEAL_STEP) {
      tcache_registry.unclaimed -= (intptr_t)TCACHE_STEAL_STEP;
      grew = true;
    } else if (steal) {
      size_t fair = (size_t)option(OPTION_TCACHE_TOTAL) / (tcache_registry.threads ? tcache_registry.threads : 1);
      tcache_t *above_fair = NULL;
      for (size_t tries = 0; tries < 8 && tries < tcache_registry.threads; tries++) {
        tcache_t *v = tcache_registry.steal_cursor ? tcache_registry.steal_cursor : tcache_registry.head;
        tcache_registry.steal_cursor = v->next;
        if (v == tc) continue;
        size_t theirs = tcache_max_size(v), used = __atomic_load_n(&v->capacity, __ATOMIC_RELAXED);
        if (used < TCACHE_MIN_SIZE) used = TCACHE_MIN_SIZE;
        if (theirs >= used + TCACHE_STEAL_STEP) {
          __atomic_store_n(&v->max_size, theirs - TCACHE_STEAL_STEP, __ATOMIC_RELAXED);
          grew = true;
          break;
        }
        if (above_fair == NULL && theirs >= fair + TCACHE_STEAL_STEP && theirs >= TCACHE_MIN_SIZE + TCACHE_STEAL_STEP)
          above_fair = v;
      }
      if (!grew && above_fair != NULL && mine + TCACHE_STEAL_STEP <= fair) {
        __atomic_store_n(&above_fair->max_size, tcache_max_size(above_fair) - TCACHE_STEAL_STEP, __ATOMIC_RELAXED);
        grew = true;
      }
    }
    if (grew) __atomic_store_n(&tc->max_size, mine + TCACHE_STEAL_STEP, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&tcache_registry.lock);
  return grew;
}

/* ---- taking back the caches of idle threads -------------------------------------------------- */

/* What a cache looks like from outside: its slow-path count and every list's count and head. Two
 * scans that see the same value saw a thread that did nothing in between (or that pushed and
 * popped the same objects back and forth: taking its cache then costs it one refill per list). */
static uint64_t tcache_fingerprint(const tcache_t *tc) {
  uint64_t h = (uint32_t)__atomic_load_n(&tc->op_seq, __ATOMIC_RELAXED);
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    h = (h ^ __atomic_load_n(&tc->lists[cls].count, __ATOMIC_RELAXED)) * 0x100000001b3ull;
    h = (h ^ (uintptr_t)__atomic_load_n(&tc->lists[cls].head, __ATOMIC_RELAXED)) * 0x100000001b3ull;
  }
  return h;
}

void (*tcache_test_settle_hook)(void);

/* Takes a stopped list whole if no pop is in flight on it (tcache_window.h): its objects go to the
 * central lists, its maximum to 0. `seen` and `seen_link` are its head and that object's first word
 * as read before the last membarrier(2). Walks the chain from the head as it is now: from the
 * object after `seen` (by the link read then) if the head is still `seen`, else all of it; takes it
 * if it is exactly as long as the count says, and clears the head with a compare-and-swap from the
 * value walked from, so that the object of a push in flight that stores its head later stays
 * there for the repair (tcache_wake). Any other length leaves the list to its owner, still stopped.
 * The count is left alone: the owner may still add to it (the end of a push in flight) and
 * tcache_wake repairs it. Returns whether the list was taken; *bytes: what it held. */
static bool tcache_take_list(tcache_t *tc, unsigned cls, void *seen, uintptr_t seen_link, size_t *bytes) {
  tcache_list_t *list = &tc->lists[cls];
  uint16_t count = __atomic_load_n(&list->count, __ATOMIC_ACQUIRE);
  if (!LIST_STOPPED(count)) return false; /* an add or subtract erased the stop: in use */
  void *head = __atomic_load_n(&list->head, __ATOMIC_ACQUIRE), *p = NULL;
  uint32_t n = 0;
  if (head != NULL) {
    n = 1;
    if (head != seen) {
      p = freelist_next_checked(head, "free()");
    } else if ((intptr_t)(p = freelist_link_target(head, seen_link)) < 0) {
      /* Not the head's tag here: a pop in flight may be clearing it. Its link decodes to a
       * user-space address or NULL, as every link does (freelist_next_checked). */
      check_fail_corrupted("free()", head);
    }
  }
  for (; p != NULL; p = freelist_next_checked(p, "free()"))
    if (++n > TCACHE_LIST_MAX_LENGTH + 1u) /* the longest list, and one push in flight */
      log_fatal("a thread cache list is corrupted (a loop or a foreign object: a double free?)");
  if (n != (uint32_t)((uint16_t)(count - LIST_STOP) >> 1) + list->floor) return false; /* an operation in flight */
  /* No pop in flight: the head's tag and link are the list's, and hand-over checks them. */
  uint32_t batch = sizeclass_batch[cls];
  void *rest = head;
  for (uint32_t left = n, k; left > 0; left -= k) rest = tcache_hand_over(cls, rest, k = left < batch ? left : batch);
  __atomic_compare_exchange_n(&list->head, &head, NULL, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
  size_t capacity = (size_t)list_max(list) * sizeclass_size[cls];
  list->max_count = 0;
  list->floor = 0;
  tc->overages[cls] = 0;
  tcache_set_capacity(tc, tc->capacity - capacity);
  *bytes += (size_t)n * sizeclass_size[cls];
  return true;
}

/* The taking side of the window protocol (tcache_window.h) for every other live cache at once:
 * two membarrier calls serve them all to stop the slow paths, then the lists; one more for each
 * cache stopped settles the one operation its owner may have in flight, and the lists with no pop
 * in flight are taken. The owner starts again as a new thread would, earning list lengths by
 * missing, with the least budget. Under the registry lock.
 * ThreadSanitizer reports races here that are not races: the owner's fast paths touch its lists
 * (and the objects on them) with plain accesses, ordered against this side only by the full
 * barrier membarrier(2) runs on the owner's CPU, which ThreadSanitizer does not model. The fast
 * paths must stay plain, so tests/tsan.supp names this side's functions (and unit-reclaim's
 * racers, whose objects cross through it); the sanitizer's stress runs turn the scan off. */
static size_t tcache_reclaim_scan(bool everyone) {
  if (!tcache_registry.can_stop_others) return 0;
  tcache_t *self = &tcache_self, *stopped = NULL;
  /* 1. Stop the slow paths of the caches that were idle since the previous scan. */
  for (tcache_t *tc = tcache_registry.head; tc != NULL; tc = tc->next) {
    if (tc == self) continue;
    uint64_t seen = tcache_fingerprint(tc), before = tc->idle_seen;
    tc->idle_seen = seen;
    if (!everyone && seen != before) continue;  /* it operated since the previous scan */
    int32_t seq = __atomic_load_n(&tc->op_seq, __ATOMIC_RELAXED);
    if (seq < 0 || (seq & 1) != 0) continue;    /* in a slow path, or stopped already */
    if (__atomic_load_n(&tc->capacity, __ATOMIC_RELAXED) == 0 && tcache_max_size(tc) <= TCACHE_MIN_SIZE)
      continue;                                 /* holds nothing */
    if (pthread_mutex_trylock(&tc->reclaim_lock) != 0) continue;
    if (!__atomic_compare_exchange_n(&tc->op_seq, &seq, seq | WINDOW_STOP, false, __ATOMIC_SEQ_CST,
                                     __ATOMIC_RELAXED)) {
      pthread_mutex_unlock(&tc->reclaim_lock);
      continue;
    }
    tc->stopped_seq = seq | WINDOW_STOP;
    tc->reclaim_next = stopped;
    stopped = tc;
  }
  if (stopped == NULL) return 0;
  bool fenced = os_membarrier();
  /* 2. Where that held (no slow path started), stop every list with objects. */
  for (tcache_t *tc = stopped; tc != NULL; tc = tc->reclaim_next) {
    tc->stopped_lists[0] = tc->stopped_lists[1] = 0;
    if (!fenced || __atomic_load_n(&tc->op_seq, __ATOMIC_ACQUIRE) != tc->stopped_seq) continue;
    for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
      tcache_list_t *list = &tc->lists[cls];
      uint16_t count = __atomic_load_n(&list->count, __ATOMIC_RELAXED);
      if (LIST_STOPPED(count)) continue;
      if (count == 0 && list->floor == 0) continue; /* empty (the floor is the owner's, stopped) */
      if (__atomic_compare_exchange_n(&list->count, &count, (uint16_t)(count + LIST_STOP), false,
                                      __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
        tc->stopped_lists[cls / 64] |= (uint64_t)1 << (cls % 64);
    }
  }
  fenced = fenced && os_membarrier();
  /* 3. Take the lists that stayed stopped and have no pop in flight; the owner's next slow path
   *    (tcache_wake) repairs the counts. Per cache: each list's head and that object's first word,
   *    a barrier, then the walks (tcache_take_list). */
  size_t bytes = 0;
  for (tcache_t *tc = stopped, *next; tc != NULL; tc = next) {
    next = tc->reclaim_next;
    void *seen[SIZECLASS_COUNT];
    uintptr_t seen_link[SIZECLASS_COUNT];
    for (unsigned cls = 1; cls < SIZECLASS_COUNT && fenced; cls++) {
      if (!(tc->stopped_lists[cls / 64] & ((uint64_t)1 << (cls % 64)))) continue;
      seen[cls] = __atomic_load_n(&tc->lists[cls].head, __ATOMIC_ACQUIRE);
      seen_link[cls] = seen[cls] ? __atomic_load_n((uintptr_t *)seen[cls], __ATOMIC_ACQUIRE) : 0;
    }
    if (QM_UNLIKELY(tcache_test_settle_hook != NULL)) tcache_test_settle_hook();
    bool settled = fenced && (tc->stopped_lists[0] | tc->stopped_lists[1]) != 0 && os_membarrier();
    size_t taken = 0;
    for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
      uint64_t bit = (uint64_t)1 << (cls % 64);
      if (!(tc->stopped_lists[cls / 64] & bit)) continue;
      if (!settled || !tcache_take_list(tc, cls, seen[cls], seen_link[cls], &taken))
        tc->stopped_lists[cls / 64] &= ~bit; /* from here on: the lists taken, for tcache_wake */
    }
    if (tc->stopped_lists[0] | tc->stopped_lists[1]) {
      size_t budget = tcache_max_size(tc), keep = tc->capacity > TCACHE_MIN_SIZE ? tc->capacity : TCACHE_MIN_SIZE;
      if (budget > keep) {
        tcache_registry.unclaimed += (intptr_t)(budget - keep);
        __atomic_store_n(&tc->max_size, keep, __ATOMIC_RELAXED);
      }
      tc->reclaims++;
      tcache_registry.reclaims++;
      tcache_registry.reclaimed_bytes += taken;
      bytes += taken;
    }
    tc->idle_seen = tcache_fingerprint(tc);
    pthread_mutex_unlock(&tc->reclaim_lock);
  }
  return bytes;
}

size_t tcache_reclaim_idle(bool everyone) {
  pthread_mutex_lock(&tcache_registry.lock);
  size_t bytes = tcache_reclaim_scan(everyone);
  pthread_mutex_unlock(&tcache_registry.lock);
  return bytes;
}

bool tcache_reclaim_available(void) { return tcache_registry.can_stop_others; }

/* Whoever finds the registry busy leaves the scan to the next caller. */
static void tcache_maybe_reclaim_idle(uint64_t now) {
  uint64_t interval = (uint64_t)option(OPTION_TCACHE_IDLE_MS);
  if (interval == 0) return;
  if (now < __atomic_load_n(&tcache_registry.next_scan_ms, __ATOMIC_RELAXED)) return;
  if (pthread_mutex_trylock(&tcache_registry.lock) != 0) return;
  bool due = now >= tcache_registry.next_scan_ms;
  if (due) {
    __atomic_store_n(&tcache_registry.next_scan_ms, now + interval, __ATOMIC_RELAXED);
    tcache_reclaim_scan(false);
  }
  pthread_mutex_unlock(&tcache_registry.lock);
  if (due) central_drain_idle_transfer();
}

static void tcache_housekeeping_at(uint64_t now) {
  if (!init_done) return;
  pageheap_maybe_decay(now);
  tcache_maybe_reclaim_idle(now);
}

void tcache_housekeeping(void) { tcache_housekeeping_at(os_now_ms()); }

void tcache_gc(tcache_t *tc) {
  /* Seed 002: move half of each list's low-water mark L. Those L objects sat unused since the
   * last collection; keeping half bets on the recent past without starving the next burst.
   * The budget bounds capacity, so a collection also takes back capacity no list is using: a
   * list keeps as its maximum its length or one batch, whichever is more, and earns more again
   * by missing. Without that, a thread that only allocates (a producer) grows maxima it never
   * fills until its budget is spent and its other lists cannot grow. */
  size_t reclaimed = 0;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    tcache_list_t *list = &tc->lists[cls];
    uint32_t low = list_low_water(list);
    if (low > 0) {
      uint32_t drop = low > 1 ? low / 2 : 1;
      tcache_release(list, cls, drop);
    }
    uint32_t keep = list_length(list) > sizeclass_batch[cls] ? list_length(list) : sizeclass_batch[cls];
    if (list_max(list) > keep) {
      reclaimed += (size_t)(list_max(list) - keep) * sizeclass_size[cls];
      list_set_max(list, keep);
    }
    list_set_floor(list, list_length(list)); /* the next pop below it takes the slow path */
  }
  tcache_set_capacity(tc, tc->capacity - reclaimed);
  tcache_count(&tc->gc_runs);
  /* Nothing to take back: don't rescan on each of the next growth attempts. */
  tc->gc_idle = reclaimed ? 0 : 32;
}

/* Brings a cache back within its budget after other threads took steps of it (tcache_grow_budget):
 * capacity bounds what the cache holds only while capacity <= max_size. Maxima no object fills go
 * first; then whole objects, from the largest class down, since a large object is the most bytes
 * for the least refill work, and a small class's list is what the common loop pops. */
static void tcache_fit_budget(tcache_t *tc) {
  size_t budget = tcache_max_size(tc);
  for (unsigned cls = 1; cls < SIZECLASS_COUNT && tc->capacity > budget; cls++) {
    tcache_list_t *list = &tc->lists[cls];
    uint32_t unused = list_max(list) - list_length(list);
    if (unused == 0) continue;
    list_set_max(list, list_length(list));
    tcache_set_capacity(tc, tc->capacity - (size_t)unused * sizeclass_size[cls]);
  }
  for (unsigned cls = SIZECLASS_COUNT - 1; cls >= 1 && tc->capacity > budget; cls--) {
    tcache_list_t *list = &tc->lists[cls];
    uint32_t length = list_length(list);
    if (length == 0) continue;
    size_t size = sizeclass_size[cls], over = tc->capacity - budget;
    uint32_t drop = (uint32_t)(over / size + (over % size != 0));
    if (drop > length) drop = length;
    tcache_release(list, cls, drop);
    list_set_max(list, length - drop);
    tcache_set_capacity(tc, tc->capacity - (size_t)drop * size);
  }
}

/* The end of an owner's refill or flush, on one clock read: a collection every TCACHE_GC_MS, not
 * only when a list needs budget (with a large budget a busy thread's lists would otherwise keep
 * everything they ever held: a server's main thread, redis under redis-benchmark, 9.5 MB more peak
 * RSS at tcache_max 16M than at 4M, objects the central lists could hand to other classes' spans
 * once their spans empty; a collection moves half of each list's low-water mark, the objects no
 * pop reached since the last one, so the lists in use keep what they use. Measured: config.h),
 * then the process's housekeeping. */
static void tcache_slow_path_end(tcache_t *tc) {
  uint64_t now = os_now_ms();
  if (now >= tc->next_gc_ms) {
    tc->next_gc_ms = now + TCACHE_GC_MS;
    tcache_gc(tc);
    tc->budget_denied = false;
  }
  if (tc->capacity > tcache_max_size(tc)) tcache_fit_budget(tc);
  tcache_housekeeping_at(now);
}

/* Raises a list's maximum by delta if the budget has room. When it has not: take budget nobody
 * claimed; failing that, collect garbage (seed 002's rule) and, if that frees too little, take a
 * step of another thread's budget. False when there is still no room. */
static bool tcache_grow_list(tcache_t *tc, tcache_list_t *list, unsigned cls, uint32_t delta) {
  size_t need = (size_t)delta * sizeclass_size[cls];
  if (list_max(list) + delta > TCACHE_LIST_MAX_LENGTH) return false;
  while (tc->capacity + need > tcache_max_size(tc)) {
    if (!tc->budget_denied && tcache_grow_budget(tc, false)) continue;
    if (tc->gc_idle > 0) {
      tc->gc_idle--;
    } else {
      tcache_gc(tc);
      if (tc->budget_denied) tc->gc_idle = TCACHE_GC_IDLE_DENIED;
    }
    if (tc->capacity + need <= tcache_max_size(tc)) break;
    if (tc->budget_denied || !tcache_grow_budget(tc, true)) {
      tc->budget_denied = true;
      return false;
    }
  }
  list_set_max(list, list_max(list) + delta);
  tcache_set_capacity(tc, tc->capacity + need);
  return true;
}

/* ---- slow halves of malloc and free ------------------------------------------------------------ */

/* A pop off the fast path: an aligned request, or a pop that reached the list's floor. Then the
 * floor drops by a quarter of the length: the low-water mark the collection reads is exact to
 * within that quarter (rounded down, so a collection never moves more than half of the true
 * mark), and a list that drains from n to 0 pays about 3.5 ln n slow pops (22 for n = 1000)
 * instead of a compare on every pop. */
static void *list_pop_slow(tcache_list_t *list) {
  void *obj = list->head;
  list->head = freelist_take(obj);
  uint32_t length = list_length(list) - 1;
  if (length < list->floor) list_set_floor(list, length - length / 4);
  list_set_length(list, length);
  return obj;
}

/* One object straight from the central list, not cached: for an exiting thread, and for the class
 * too small for a free tag (freelist.h). */
static void *tcache_alloc_uncached(unsigned cls) {
  void *obj;
  if (!central_remove(cls, &obj, 1)) return NULL;
  if (sizeclass_size[cls] >= 16) freelist_take(obj);
  return obj;
}

static bool tcache_class_cached(unsigned cls) { return sizeclass_size[cls] >= 16; }

void *tcache_alloc_slow(tcache_t *tc, unsigned cls) {
  if (QM_UNLIKELY(tc->state != TCACHE_LIVE)) {
    if (tc->state == TCACHE_UNINIT) tcache_thread_init(tc);
    else return tcache_alloc_uncached(cls); /* the thread is exiting */
  }
  if (QM_UNLIKELY(!tcache_class_cached(cls))) return tcache_alloc_uncached(cls);
  tcache_list_t *list = &tc->lists[cls];
  if (list->head != NULL) return list_pop_slow(list);
  /* Slow start: a list earns its length by missing, one object at a time up to a batch, then a
   * batch at a time, as long as the budget has room. */
  uint32_t batch = sizeclass_batch[cls], step = list_max(list) < batch ? 1 : batch;
  if (!tcache_grow_list(tc, list, cls, step)) step = 0;
  uint32_t want = list_max(list) < batch ? list_max(list) : batch;
  void *head;
  uint32_t got = central_remove(cls, &head, want ? want : 1);
  /* Fewer than its step came (a request carves one page of fresh slots at most, central.c;
   * or no memory): the list earns only what came, so that its capacity, which the budget counts,
   * grows with what it holds, not by a batch a miss. */
  uint32_t unearned = step > got ? step - got : 0;
  if (unearned > 0) {
    list_set_max(list, list_max(list) - unearned);
    tcache_set_capacity(tc, tc->capacity - (size_t)unearned * sizeclass_size[cls]);
  }
  if (got == 0) return NULL;
  tcache_count(&tc->refills);
  void *obj = head;
  list->head = freelist_take(head);
  list_set_length(list, got - 1); /* the floor is 0: the list was empty */
  tcache_slow_path_end(tc);
  tcache_debug_check(tc, "refill");
  return obj;
}

void tcache_free_slow(tcache_t *tc, void *obj, unsigned cls) {
  bool cached = tcache_class_cached(cls);
  if (cached && freelist_tagged(obj, freelist_key(obj))) check_fail_double_free("free()", obj);
  if (QM_UNLIKELY(tc->state != TCACHE_LIVE || !cached)) {
    if (tc->state == TCACHE_DEAD || !cached) {
      tcache_free_uncached(obj, cls);
      return;
    }
    tcache_thread_init(tc);
  }
  tcache_list_t *list = &tc->lists[cls];
  freelist_mark(obj, list->head, freelist_key(obj));
  list->head = obj;
  list_set_length(list, list_length(list) + 1);
  if (list->count <= list->max_count) return;
  uint32_t batch = sizeclass_batch[cls];
  if (list_max(list) < batch && tcache_grow_list(tc, list, cls, 1)) {
    tcache_debug_check(tc, "growth on free");
    return;
  }
  /* Too long: hand a batch to the central list. A list that keeps overflowing belongs to a
   * thread that frees more than it allocates (a consumer): shrinking it keeps it from hoarding. */
  tcache_release(list, cls, list_length(list) < batch ? list_length(list) : batch);
  tcache_count(&tc->flushes);
  if (list_max(list) >= batch && ++tc->overages[cls] > TCACHE_MAX_OVERAGES) {
    uint32_t shrink = list_max(list) > 2 * batch ? batch : list_max(list) - batch;
    list_set_max(list, list_max(list) - shrink);
    tcache_set_capacity(tc, tc->capacity - (size_t)shrink * sizeclass_size[cls]);
    tc->overages[cls] = 0;
    if (list->count > list->max_count) tcache_release(list, cls, list_length(list) - list_max(list));
  }
  tcache_slow_path_end(tc);
  tcache_debug_check(tc, "flush");
}

void tcache_free_uncached(void *obj, unsigned cls) {
  if (tcache_class_cached(cls)) freelist_mark(obj, NULL, freelist_key(obj));
  else *(void **)obj = NULL; /* too small for a free tag (freelist.h) */
  central_insert(cls, obj, 1);
}

/* ---- process life, statistics ------------------------------------------------------------------ */

void tcache_lock_for_fork(void) { fork_lock(&tcache_registry.lock, FORK_SLOT_REGISTRY); }

void tcache_unlock_after_fork(bool child) {
  fork_unlock(&tcache_registry.lock, FORK_SLOT_REGISTRY, child);
  if (!child) return;
  /* Only the forking thread exists in the child: the other caches' objects are lost to it (as
   * their threads are), and their budgets come back. */
  tcache_t *self = &tcache_self;
  pthread_mutex_init(&self->reclaim_lock, NULL);
  bool live = self->state == TCACHE_LIVE;
  tcache_registry.head = live ? self : NULL;
  if (live) self->next = self->prev = NULL;
  __atomic_store_n(&tcache_registry.threads, live ? 1 : 0, __ATOMIC_RELAXED);
  tcache_registry.unclaimed = (intptr_t)option(OPTION_TCACHE_TOTAL) - (live ? (intptr_t)self->max_size : 0);
  tcache_registry.steal_cursor = NULL;
}

void tcache_init(void) {
  /* Does not allocate. Fails only when the process has used every key (PTHREAD_KEYS_MAX): then
   * threads run uncached (tcache_thread_init) rather than set a key that is not ours. */
  int err = pthread_key_create(&tcache_registry.exit_key, tcache_thread_exit);
  tcache_registry.exit_key_ok = err == 0;
  if (err != 0) log_printf(2, "qmalloc: note: pthread_key_create failed (error %d): threads run without caches\n", err);
  tcache_registry.can_stop_others = os_membarrier_init();
  if (!tcache_registry.can_stop_others && option(OPTION_TCACHE_IDLE_MS) != 0 && option(OPTION_VERBOSE))
    log_printf(2, "qmalloc: note: membarrier(2) is not available; caches of idle threads stay with them\n");
  tcache_budget_init();
}

void tcache_budget_init(void) {
  pthread_mutex_lock(&tcache_registry.lock);
  intptr_t claimed = 0;
  for (tcache_t *tc = tcache_registry.head; tc != NULL; tc = tc->next) claimed += (intptr_t)tcache_max_size(tc);
  tcache_registry.unclaimed = (intptr_t)option(OPTION_TCACHE_TOTAL) - claimed;
  pthread_mutex_unlock(&tcache_registry.lock);
}

size_t tcache_live_caches(void) { return __atomic_load_n(&tcache_registry.threads, __ATOMIC_RELAXED); }

void tcache_totals(tcache_totals_t *out, size_t *objects_per_class, tcache_thread_stats_t *threads, size_t max_threads) {
  *out = (tcache_totals_t){0};
  pthread_mutex_lock(&tcache_registry.lock);
  out->refills = tcache_registry.retired_refills;
  out->flushes = tcache_registry.retired_flushes;
  out->gc_runs = tcache_registry.retired_gc_runs;
  out->unclaimed = tcache_registry.unclaimed;
  out->reclaims = tcache_registry.reclaims;
  out->reclaimed_bytes = tcache_registry.reclaimed_bytes;
  for (tcache_t *tc = tcache_registry.head; tc != NULL; tc = tc->next) {
    /* Other threads' fields are read without their owner's cooperation: each value is one that
     * was true at some moment, and the sum is a snapshot good to within a batch per list. */
    tcache_thread_stats_t one = {0};
    one.refills = __atomic_load_n(&tc->refills, __ATOMIC_RELAXED);
    one.flushes = __atomic_load_n(&tc->flushes, __ATOMIC_RELAXED);
    one.gc_runs = __atomic_load_n(&tc->gc_runs, __ATOMIC_RELAXED);
    one.reclaims = tc->reclaims;
    one.budget = tcache_max_size(tc);
    one.capacity = __atomic_load_n(&tc->capacity, __ATOMIC_RELAXED);
    for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
      /* A stopped list with neither maximum nor floor was taken; its count waits for its owner. */
      const tcache_list_t *list = &tc->lists[cls];
      uint16_t count = __atomic_load_n(&list->count, __ATOMIC_RELAXED);
      uint16_t floor = __atomic_load_n(&list->floor, __ATOMIC_RELAXED);
      if (LIST_STOPPED(count))
        count = (__atomic_load_n(&list->max_count, __ATOMIC_RELAXED) | floor) ? (uint16_t)(count - LIST_STOP) : 0;
      size_t n = (size_t)(count >> 1) + floor;
      one.bytes += n * sizeclass_size[cls];
      if (objects_per_class) objects_per_class[cls] += n;
    }
    if (out->threads < max_threads) threads[out->threads] = one;
    out->threads++;
    out->bytes += one.bytes;
    out->refills += one.refills;
    out->flushes += one.flushes;
    out->gc_runs += one.gc_runs;
  }
  pthread_mutex_unlock(&tcache_registry.lock);
}
