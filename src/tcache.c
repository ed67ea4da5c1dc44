/* Thread cache: per thread, one free list per size class. This file is its slow half: creating
 * the cache, refilling a list from the central list, flushing a list that grew too long, the
 * low-water-mark garbage collection of seed 002, the process-wide budget (a total split among
 * live threads, which may steal from each other), and handing everything back at thread exit.
 * The fast half (pop and push) is in api.c.
 * Lock: none for the cache itself (only its thread touches it, except max_size, which other
 * threads may lower under the registry lock); tcache_registry.lock for the list of live caches
 * and the budget. Callers: api.c. */
#include <pthread.h>

#include "internal.h"
#include "log.h"

__thread tcache_t tcache_self __attribute__((tls_model("initial-exec")));

/* The least budget a thread keeps; stealing stops there. */
#define TCACHE_MIN_SIZE TCACHE_STEAL_STEP

static struct {
  pthread_mutex_t lock;
  tcache_t *head;           /* live caches */
  size_t threads;
  intptr_t unclaimed;       /* total budget minus what live caches hold; may go negative */
  tcache_t *steal_cursor;   /* next victim, round robin */
  pthread_key_t exit_key;   /* its destructor hands the cache back at thread exit */
  uint64_t retired_refills, retired_flushes, retired_gc_runs; /* counters of exited threads */
} tcache_registry = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void tcache_thread_exit(void *unused);

/* ---- moving objects to the central lists --------------------------------------------------- */

/* Moves the first n objects of a list to the central list of cls. */
static void tcache_release(tcache_list_t *list, unsigned cls, uint32_t n) {
  if (n == 0) return;
  void *head = list->head, *last = head;
  for (uint32_t i = 1; i < n; i++) last = *(void **)last;
  list->head = *(void **)last;
  *(void **)last = NULL;
  list->length -= n;
  if (list->length < list->low_water) list->low_water = list->length;
  central_insert(cls, head, n);
}

/* Releases in batch-sized chains so the transfer cache can take them whole. */
static void tcache_release_all_of(tcache_list_t *list, unsigned cls) {
  uint32_t batch = sizeclass_batch[cls];
  while (list->length > 0) tcache_release(list, cls, list->length < batch ? list->length : batch);
}

static size_t tcache_max_size(const tcache_t *tc) { return __atomic_load_n(&tc->max_size, __ATOMIC_RELAXED); }

/* ---- invariants (QM_DEBUG builds run this on every slow path; unit tests call it) ---------------- */

const char *tcache_check(const tcache_t *tc) {
  size_t capacity = 0;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    const tcache_list_t *list = &tc->lists[cls];
    uint32_t n = 0;
    for (void *p = list->head; p != NULL && n <= TCACHE_LIST_MAX_LENGTH + 1u; p = *(void **)p) {
      pagemap_leaf_t *leaf = pagemap_leaf_of((uintptr_t)p);
      uintptr_t entry = leaf ? leaf->small[((uintptr_t)p >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1)] : 0;
      if ((entry & 0xff) != cls) return "an object on a list of another class";
      n++;
    }
    if (n != list->length) return "list length differs from its chain";
    if (list->low_water > list->length) return "low-water mark above the length";
    if (list->length > list->max_length) return "list longer than its maximum";
    capacity += (size_t)list->max_length * sizeclass_size[cls];
  }
  if (tc->state == TCACHE_LIVE && capacity != tc->capacity) return "capacity differs from the lists' maxima";
  return NULL;
}

static void tcache_debug_check(const tcache_t *tc, const char *where) {
  if (!qm_debug) return;
  const char *broken = tcache_check(tc);
  if (broken) log_fatal("tcache_check after %s: %s", where, broken);
}

/* ---- life of a cache ------------------------------------------------------------------------- */

static void tcache_thread_init(tcache_t *tc) {
  init_process();
  if (tc->state == TCACHE_LIVE) return; /* init_process's own allocations made it already */
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
  tcache_registry.threads++;
  pthread_key_t key = tcache_registry.exit_key;
  pthread_mutex_unlock(&tcache_registry.lock);
  tc->state = TCACHE_LIVE;
  pthread_setspecific(key, tc); /* may allocate (keys past 32): the cache is live already */
}

void tcache_flush_self(void) {
  tcache_t *tc = &tcache_self;
  if (tc->state != TCACHE_LIVE) return;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) tcache_release_all_of(&tc->lists[cls], cls);
}

static void tcache_thread_exit(void *unused) {
  tcache_t *tc = &tcache_self;
  if (tc->state != TCACHE_LIVE) return;
  tcache_flush_self();
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++)
    tc->lists[cls].max_length = 0; /* every later free of this thread takes the slow path */
  pthread_mutex_lock(&tcache_registry.lock);
  if (tc->prev) tc->prev->next = tc->next;
  else tcache_registry.head = tc->next;
  if (tc->next) tc->next->prev = tc->prev;
  if (tcache_registry.steal_cursor == tc) tcache_registry.steal_cursor = NULL;
  tcache_registry.threads--;
  tcache_registry.unclaimed += (intptr_t)tcache_max_size(tc);
  tcache_registry.retired_refills += tc->refills;
  tcache_registry.retired_flushes += tc->flushes;
  tcache_registry.retired_gc_runs += tc->gc_runs;
  pthread_mutex_unlock(&tcache_registry.lock);
  tc->capacity = 0;
  tc->state = TCACHE_DEAD;
}

/* ---- budget ------------------------------------------------------------------------------------ */

/* Grows this cache's budget by one step: from the unclaimed total if any is left, otherwise (if
 * `steal`) from another thread's budget, round robin, so busy threads gain what idle ones do not
 * use. Returns whether it grew. */
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
      for (size_t tries = 0; tries < 8 && tries < tcache_registry.threads; tries++) {
        tcache_t *v = tcache_registry.steal_cursor ? tcache_registry.steal_cursor : tcache_registry.head;
        tcache_registry.steal_cursor = v->next;
        size_t theirs = tcache_max_size(v);
        if (v != tc && theirs >= TCACHE_MIN_SIZE + TCACHE_STEAL_STEP) {
          __atomic_store_n(&v->max_size, theirs - TCACHE_STEAL_STEP, __ATOMIC_RELAXED);
          grew = true;
          break;
        }
      }
    }
    if (grew) __atomic_store_n(&tc->max_size, mine + TCACHE_STEAL_STEP, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&tcache_registry.lock);
  return grew;
}

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
    uint32_t low = list->low_water;
    if (low > 0) {
      uint32_t drop = low > 1 ? low / 2 : 1;
      tcache_release(list, cls, drop);
    }
    uint32_t keep = list->length > sizeclass_batch[cls] ? list->length : sizeclass_batch[cls];
    if (list->max_length > keep) {
      reclaimed += (size_t)(list->max_length - keep) * sizeclass_size[cls];
      list->max_length = (uint16_t)keep;
    }
    list->low_water = list->length;
  }
  tc->capacity -= reclaimed;
  tc->gc_runs++;
  /* Nothing to take back: don't rescan on each of the next growth attempts. */
  tc->gc_idle = reclaimed ? 0 : 32;
  pageheap_maybe_decay();
}

/* Raises a list's maximum by delta if the budget has room. When it has not: take budget nobody
 * claimed; failing that, collect garbage (seed 002's rule) and, if that frees too little, take a
 * step of another thread's budget. False when there is still no room. */
static bool tcache_grow_list(tcache_t *tc, tcache_list_t *list, unsigned cls, uint32_t delta) {
  size_t need = (size_t)delta * sizeclass_size[cls];
  if (list->max_length + delta > TCACHE_LIST_MAX_LENGTH) return false;
  while (tc->capacity + need > tcache_max_size(tc)) {
    if (tcache_grow_budget(tc, false)) continue;
    if (tc->gc_idle > 0) tc->gc_idle--;
    else tcache_gc(tc);
    if (tc->capacity + need <= tcache_max_size(tc)) break;
    if (!tcache_grow_budget(tc, true)) return false;
  }
  list->max_length = (uint16_t)(list->max_length + delta);
  tc->capacity += need;
  return true;
}

/* ---- slow halves of malloc and free ------------------------------------------------------------ */

void *tcache_alloc_slow(tcache_t *tc, unsigned cls) {
  if (QM_UNLIKELY(tc->state != TCACHE_LIVE)) {
    if (tc->state == TCACHE_UNINIT) {
      tcache_thread_init(tc);
    } else { /* the thread is exiting: serve it without caching */
      void *obj;
      return central_remove(cls, &obj, 1) ? obj : NULL;
    }
  }
  tcache_list_t *list = &tc->lists[cls];
  if (list->head != NULL) { /* aligned requests come here without trying the fast path */
    void *obj = list->head;
    list->head = *(void **)obj;
    if (--list->length < list->low_water) list->low_water = list->length;
    return obj;
  }
  /* Slow start: a list earns its length by missing, one object at a time up to a batch, then a
   * batch at a time, as long as the budget has room. */
  uint32_t batch = sizeclass_batch[cls];
  tcache_grow_list(tc, list, cls, list->max_length < batch ? 1 : batch);
  uint32_t want = list->max_length < batch ? list->max_length : batch;
  void *head;
  uint32_t got = central_remove(cls, &head, want ? want : 1);
  if (got == 0) return NULL;
  tc->refills++;
  void *obj = head;
  list->head = *(void **)head;
  list->length = (uint16_t)(got - 1);
  list->low_water = 0;
  pageheap_maybe_decay();
  tcache_debug_check(tc, "refill");
  return obj;
}

void tcache_free_slow(tcache_t *tc, void *obj, unsigned cls) {
  if (QM_UNLIKELY(tc->state != TCACHE_LIVE)) {
    if (tc->state == TCACHE_DEAD) {
      *(void **)obj = NULL;
      central_insert(cls, obj, 1);
      return;
    }
    tcache_thread_init(tc);
  }
  tcache_list_t *list = &tc->lists[cls];
  *(void **)obj = list->head;
  list->head = obj;
  list->length++;
  if (list->length <= list->max_length) return;
  uint32_t batch = sizeclass_batch[cls];
  if (list->max_length < batch && tcache_grow_list(tc, list, cls, 1)) {
    tcache_debug_check(tc, "growth on free");
    return;
  }
  /* Too long: hand a batch to the central list. A list that keeps overflowing belongs to a
   * thread that frees more than it allocates (a consumer): shrinking it keeps it from hoarding. */
  tcache_release(list, cls, list->length < batch ? list->length : batch);
  tc->flushes++;
  if (list->max_length >= batch && ++list->overages > TCACHE_MAX_OVERAGES) {
    uint32_t shrink = list->max_length > 2 * batch ? batch : list->max_length - batch;
    list->max_length = (uint16_t)(list->max_length - shrink);
    tc->capacity -= (size_t)shrink * sizeclass_size[cls];
    list->overages = 0;
    if (list->length > list->max_length) tcache_release(list, cls, list->length - list->max_length);
  }
  tcache_debug_check(tc, "flush");
}

/* ---- process life, statistics ------------------------------------------------------------------ */

void tcache_lock_for_fork(void) { pthread_mutex_lock(&tcache_registry.lock); }

void tcache_unlock_after_fork(bool child) {
  if (!child) {
    pthread_mutex_unlock(&tcache_registry.lock);
    return;
  }
  /* Only the forking thread exists in the child: the other caches' objects are lost to it (as
   * their threads are), and their budgets come back. */
  pthread_mutex_init(&tcache_registry.lock, NULL);
  tcache_t *self = &tcache_self;
  bool live = self->state == TCACHE_LIVE;
  tcache_registry.head = live ? self : NULL;
  if (live) self->next = self->prev = NULL;
  tcache_registry.threads = live ? 1 : 0;
  tcache_registry.unclaimed = (intptr_t)option(OPTION_TCACHE_TOTAL) - (live ? (intptr_t)self->max_size : 0);
  tcache_registry.steal_cursor = NULL;
}

void tcache_init(void) {
  pthread_key_create(&tcache_registry.exit_key, tcache_thread_exit); /* does not allocate */
  tcache_budget_init();
}

void tcache_budget_init(void) {
  pthread_mutex_lock(&tcache_registry.lock);
  intptr_t claimed = 0;
  for (tcache_t *tc = tcache_registry.head; tc != NULL; tc = tc->next) claimed += (intptr_t)tcache_max_size(tc);
  tcache_registry.unclaimed = (intptr_t)option(OPTION_TCACHE_TOTAL) - claimed;
  pthread_mutex_unlock(&tcache_registry.lock);
}

void tcache_totals(tcache_totals_t *out, size_t *objects_per_class, tcache_thread_stats_t *threads, size_t max_threads) {
  *out = (tcache_totals_t){0};
  pthread_mutex_lock(&tcache_registry.lock);
  out->refills = tcache_registry.retired_refills;
  out->flushes = tcache_registry.retired_flushes;
  out->gc_runs = tcache_registry.retired_gc_runs;
  out->unclaimed = tcache_registry.unclaimed;
  for (tcache_t *tc = tcache_registry.head; tc != NULL; tc = tc->next) {
    /* Other threads' fields are read without their owner's cooperation: each value is one that
     * was true at some moment, and the sum is a snapshot good to within a batch per list. */
    tcache_thread_stats_t one = {0};
    one.refills = __atomic_load_n(&tc->refills, __ATOMIC_RELAXED);
    one.flushes = __atomic_load_n(&tc->flushes, __ATOMIC_RELAXED);
    one.gc_runs = __atomic_load_n(&tc->gc_runs, __ATOMIC_RELAXED);
    one.budget = tcache_max_size(tc);
    one.capacity = __atomic_load_n(&tc->capacity, __ATOMIC_RELAXED);
    for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
      size_t n = __atomic_load_n(&tc->lists[cls].length, __ATOMIC_RELAXED);
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
