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
  bool key_ready;
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

static size_t tcache_bytes(const tcache_t *tc) {
  size_t bytes = 0;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++)
    bytes += (size_t)tc->lists[cls].length * sizeclass_size[cls];
  return bytes;
}

static size_t tcache_max_size(const tcache_t *tc) { return __atomic_load_n(&tc->max_size, __ATOMIC_RELAXED); }

/* ---- life of a cache ------------------------------------------------------------------------- */

static void tcache_registry_setup(void) {
  if (!tcache_registry.key_ready) {
    tcache_registry.key_ready = true;
    pthread_key_create(&tcache_registry.exit_key, tcache_thread_exit);
  }
}

static void tcache_thread_init(tcache_t *tc) {
  init_process();
  if (tc->state == TCACHE_LIVE) return; /* init_process's own allocations made it already */
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) tc->lists[cls].max_length = 1;
  pthread_mutex_lock(&tcache_registry.lock);
  tcache_registry_setup();
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
  tc->gc_countdown = (intptr_t)claim;
  tc->state = TCACHE_LIVE;
  pthread_setspecific(key, tc); /* may allocate (keys past 32): the cache is live already */
}

static void tcache_thread_exit(void *unused) {
  tcache_t *tc = &tcache_self;
  if (tc->state != TCACHE_LIVE) return;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    tcache_release_all_of(&tc->lists[cls], cls);
    tc->lists[cls].max_length = 0; /* every later free of this thread takes the slow path */
  }
  pthread_mutex_lock(&tcache_registry.lock);
  if (tc->prev) tc->prev->next = tc->next;
  else tcache_registry.head = tc->next;
  if (tc->next) tc->next->prev = tc->prev;
  if (tcache_registry.steal_cursor == tc) tcache_registry.steal_cursor = NULL;
  tcache_registry.threads--;
  tcache_registry.unclaimed += (intptr_t)tcache_max_size(tc);
  pthread_mutex_unlock(&tcache_registry.lock);
  tc->state = TCACHE_DEAD;
  tc->gc_countdown = INTPTR_MAX;
}

void tcache_flush_self(void) {
  tcache_t *tc = &tcache_self;
  if (tc->state != TCACHE_LIVE) return;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) tcache_release_all_of(&tc->lists[cls], cls);
  tc->gc_countdown = (intptr_t)tcache_max_size(tc);
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
  if (list->head != NULL) { /* callers that bypass the fast path (aligned allocation) */
    void *obj = list->head;
    list->head = *(void **)obj;
    if (--list->length < list->low_water) list->low_water = list->length;
    return obj;
  }
  uint32_t batch = sizeclass_batch[cls];
  uint32_t want = list->max_length < batch ? list->max_length : batch;
  void *head;
  uint32_t got = central_remove(cls, &head, want ? want : 1);
  if (got == 0) return NULL;
  tc->refills++;
  /* Slow start: a list earns its length by missing, one object at a time up to a batch, then a
   * batch at a time. */
  if (list->max_length < batch) list->max_length++;
  else if (list->max_length + batch <= TCACHE_LIST_MAX_LENGTH) list->max_length += batch;
  void *obj = head;
  list->head = *(void **)head;
  list->length = got - 1;
  list->low_water = 0;
  pageheap_maybe_decay();
  return obj;
}

/* The list outgrew its maximum: hand a batch to the central list and adapt the maximum. */
static void tcache_list_too_long(tcache_t *tc, tcache_list_t *list, unsigned cls) {
  uint32_t batch = sizeclass_batch[cls];
  tcache_release(list, cls, list->length < batch ? list->length : batch);
  tc->flushes++;
  if (list->max_length < batch) {
    list->max_length++;
  } else if (++list->overages > TCACHE_MAX_OVERAGES) {
    /* A list that keeps overflowing belongs to a thread that frees more than it allocates (a
     * consumer): shrinking it keeps such threads from hoarding. */
    list->max_length = list->max_length > 2 * batch ? list->max_length - batch : batch;
    list->overages = 0;
  }
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
  if (list->length > list->max_length) tcache_list_too_long(tc, list, cls);
  if ((tc->gc_countdown -= (intptr_t)sizeclass_size[cls]) < 0) tcache_gc(tc);
}

/* ---- garbage collection and budget ------------------------------------------------------------ */

/* Grows this cache's budget: from the unclaimed total if any is left, otherwise by taking a step
 * from another thread's budget (round robin), so busy threads gain what idle ones do not use. */
static void tcache_grow_budget(tcache_t *tc) {
  size_t cap = (size_t)option(OPTION_TCACHE_MAX);
  pthread_mutex_lock(&tcache_registry.lock);
  size_t mine = tcache_max_size(tc);
  if (mine + TCACHE_STEAL_STEP <= cap) {
    if (tcache_registry.unclaimed >= (intptr_t)TCACHE_STEAL_STEP) {
      tcache_registry.unclaimed -= (intptr_t)TCACHE_STEAL_STEP;
      __atomic_store_n(&tc->max_size, mine + TCACHE_STEAL_STEP, __ATOMIC_RELAXED);
    } else {
      for (size_t tries = 0; tries < 8 && tries < tcache_registry.threads; tries++) {
        tcache_t *v = tcache_registry.steal_cursor ? tcache_registry.steal_cursor : tcache_registry.head;
        tcache_registry.steal_cursor = v->next;
        size_t theirs = tcache_max_size(v);
        if (v != tc && theirs >= TCACHE_MIN_SIZE + TCACHE_STEAL_STEP) {
          __atomic_store_n(&v->max_size, theirs - TCACHE_STEAL_STEP, __ATOMIC_RELAXED);
          __atomic_store_n(&tc->max_size, mine + TCACHE_STEAL_STEP, __ATOMIC_RELAXED);
          break;
        }
      }
    }
  }
  pthread_mutex_unlock(&tcache_registry.lock);
}

void tcache_gc(tcache_t *tc) {
  if (tc->state != TCACHE_LIVE) {
    tc->gc_countdown = INTPTR_MAX;
    return;
  }
  size_t bytes = tcache_bytes(tc);
  if (bytes > tcache_max_size(tc)) {
    /* Seed 002: move half of each list's low-water mark L. Those L objects sat unused since the
     * last collection; keeping half bets on the recent past without starving the next burst. */
    for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
      tcache_list_t *list = &tc->lists[cls];
      uint32_t low = list->low_water;
      if (low > 0) {
        uint32_t drop = low > 1 ? low / 2 : 1;
        tc->bytes_flushed_gc += (uint64_t)drop * sizeclass_size[cls];
        tcache_release(list, cls, drop);
        uint32_t batch = sizeclass_batch[cls];
        if (list->max_length > batch) list->max_length = list->max_length - batch > batch ? list->max_length - batch : batch;
      }
      list->low_water = list->length;
    }
    tc->gc_runs++;
    tcache_grow_budget(tc);
    bytes = tcache_bytes(tc);
  }
  size_t max = tcache_max_size(tc);
  /* Still over (every list in use): check again after an eighth of the budget, not every free. */
  tc->gc_countdown = bytes < max ? (intptr_t)(max - bytes) : (intptr_t)(max / 8 + 1);
  pageheap_maybe_decay();
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

void tcache_budget_init(void) { tcache_registry.unclaimed = (intptr_t)option(OPTION_TCACHE_TOTAL); }

void tcache_totals(tcache_totals_t *out, size_t *bytes_per_class) {
  *out = (tcache_totals_t){0};
  pthread_mutex_lock(&tcache_registry.lock);
  for (tcache_t *tc = tcache_registry.head; tc != NULL; tc = tc->next) {
    out->threads++;
    out->refills += __atomic_load_n(&tc->refills, __ATOMIC_RELAXED);
    out->flushes += __atomic_load_n(&tc->flushes, __ATOMIC_RELAXED);
    out->gc_runs += __atomic_load_n(&tc->gc_runs, __ATOMIC_RELAXED);
    for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
      size_t b = (size_t)__atomic_load_n(&tc->lists[cls].length, __ATOMIC_RELAXED) * sizeclass_size[cls];
      out->bytes += b;
      if (bytes_per_class) bytes_per_class[cls] += b;
    }
  }
  pthread_mutex_unlock(&tcache_registry.lock);
}
