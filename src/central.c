/* Central free lists: per size class, a transfer cache of whole batches (so a batch freed by one
 * thread moves to another in O(1), without a lock) and the spans of that class with objects to hand
 * out. A new span is carved as objects are taken, a page at a time: the slots starting on a page are
 * linked into the span's free list with their free tags (freelist.h), so that a free() of one not
 * handed out finds it free, as a double free would, and only then does the page get its page-map
 * entry for free()'s fast path, so that a free() of a slot not yet carved fails in the slow path.
 * Pages no slot was taken from are never touched (a multi-page class's first object no longer makes
 * the whole span resident), and a request carves one page at most.
 * A span whose objects are all back goes to the page heap at once.
 * Does not: cache anything per thread (tcache.c), or know where spans come from (pageheap.c).
 * Lock: central_lists[cls].lock, one per class, for the spans; the transfer cache's slots are
 * exchanged with atomic instructions; the page heap lock is only taken with the class lock
 * released. Callers: tcache.c (refill, flush, garbage collection), api.c (trim). */
#include "freelist.h"
#include "internal.h"
#include "os.h"

/* Zero until a class is first used: no process writes a page of them at start (central_init). */
central_t central_lists[SIZECLASS_COUNT];
/* TRANSFER_BYTES_MAX of batches, within [TRANSFER_MIN, TRANSFER_SLOTS]: set at init. */
QM_EARLY_DATA uint8_t central_transfer_max[SIZECLASS_COUNT];

/* ---- transfer caches ------------------------------------------------------------------------
 * A remote free comes here as one batch of a consumer's flush, and leaves as one batch of an
 * owner's refill. With a lock per class around the slots, every stream of remote frees of one
 * class met every refill of that class on one mutex, and a holder preempted on a busy machine
 * stalled all of them (futex waits). Instead each slot holds a whole batch or NULL: a batch goes
 * in with a compare-and-swap of an empty slot and comes out with an exchange of a full one, one
 * atomic instruction per batch each way. There is no ABA problem: an exchange takes whatever the
 * slot holds, and a compare-and-swap only fills an empty slot. transfer_count counts the full
 * slots (statistics, the capacity, where to start looking); it runs one instruction ahead of a
 * put and behind a take, so a search that trusts it may miss a batch that is just arriving: that
 * costs a trip to the spans, never an object. The slots live apart from central_t, so that a class no
 * program uses touches no page of them (a small program's RSS). */
static void *central_transfer_slots[SIZECLASS_COUNT][TRANSFER_SLOTS] __attribute__((aligned(QM_CACHELINE)));

/* The classes whose central list has been locked (central_lock): the only ones that can hold
 * anything, and so the only ones central_drain_idle_transfer looks at, so that its periodic pass
 * reads no central_t of a class the process never used (it read all 98, each page of them first as
 * the zero page and then written: 8 page faults in every process). */
QM_EARLY_DATA static uint64_t central_used[(SIZECLASS_COUNT + 63) / 64];

static bool central_is_used(unsigned cls) {
  return (__atomic_load_n(&central_used[cls / 64], __ATOMIC_RELAXED) & ((uint64_t)1 << (cls % 64))) != 0;
}

/* Takes the class lock. The first time for a class, its central_t is first touched with a write
 * (os_read_to_write): pthread_mutex_lock reads the mutex before it writes it, which on a page of
 * central_lists not yet touched cost two page faults. */
static void central_lock(central_t *c, unsigned cls) {
  if (!central_is_used(cls)) {
    (void)os_read_to_write(&c->first_touch); /* a word of its own: racing threads both add 0 */
    __atomic_fetch_or(&central_used[cls / 64], (uint64_t)1 << (cls % 64), __ATOMIC_RELAXED);
  }
  pthread_mutex_lock(&c->lock);
}

/* Puts a whole batch into a free slot of cls; false when the transfer cache is full. The slot is
 * reserved in transfer_count first, so the count never drops below the full slots (a taker
 * decrements only what a putter added) and never passes the capacity. */
static bool transfer_put(central_t *c, unsigned cls, void *batch) {
  uint32_t cap = __atomic_load_n(&c->transfer_capacity, __ATOMIC_RELAXED), max = central_transfer_max[cls];
  if (cap < TRANSFER_MIN) cap = TRANSFER_MIN; /* 0: not set yet */
  if (__atomic_load_n(&c->transfer_count, __ATOMIC_RELAXED) >= cap) return false;
  uint32_t count = __atomic_add_fetch(&c->transfer_count, 1, __ATOMIC_RELAXED);
  if (count <= cap) {
    void **slots = central_transfer_slots[cls];
    for (uint32_t k = 0, i = count - 1; k < max; k++, i = i + 1 < max ? i + 1 : 0) {
      void *expected = NULL;
      if (__atomic_load_n(&slots[i], __ATOMIC_RELAXED) == NULL &&
          __atomic_compare_exchange_n(&slots[i], &expected, batch, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        return true;
    }
  }
  __atomic_sub_fetch(&c->transfer_count, 1, __ATOMIC_RELAXED); /* full, or others filled the free slots first */
  return false;
}

/* Takes a whole batch of cls out of a slot, or NULL when none is there. */
static void *transfer_take(central_t *c, unsigned cls) {
  uint32_t max = central_transfer_max[cls], count = __atomic_load_n(&c->transfer_count, __ATOMIC_RELAXED);
  if (count == 0) return NULL;
  void **slots = central_transfer_slots[cls];
  for (uint32_t k = 0, i = count <= max ? count - 1 : max - 1; k < max; k++, i = i > 0 ? i - 1 : max - 1) {
    if (__atomic_load_n(&slots[i], __ATOMIC_RELAXED) == NULL) continue;
    void *batch = __atomic_exchange_n(&slots[i], NULL, __ATOMIC_ACQUIRE);
    if (batch == NULL) continue; /* another thread took it first */
    uint32_t left = __atomic_sub_fetch(&c->transfer_count, 1, __ATOMIC_RELAXED);
    if (left < __atomic_load_n(&c->transfer_low, __ATOMIC_RELAXED))
      __atomic_store_n(&c->transfer_low, left, __ATOMIC_RELAXED);
    return batch;
  }
  return NULL;
}

/* Whether a mutex of all zero bytes is an unlocked one, as PTHREAD_MUTEX_INITIALIZER is in glibc
 * and musl: then central_lists, in .bss, needs no initialization. */
static bool central_zero_mutex_is_initialized(void) {
  static const pthread_mutex_t initialized = PTHREAD_MUTEX_INITIALIZER;
  const unsigned char *bytes = (const unsigned char *)&initialized;
  for (size_t i = 0; i < sizeof initialized; i++)
    if (bytes[i] != 0) return false;
  return true;
}

/* Writes no central_t: a class's central list is first written by the class's first use, so a
 * process touches the pages of the classes it uses (with the locks initialized here, all 98
 * classes' 12 KiB were written at start: 3 page faults in every process, mtbench heap-leak). */
void central_init(void) {
  bool zero_ok = central_zero_mutex_is_initialized();
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    if (!zero_ok) pthread_mutex_init(&central_lists[cls].lock, NULL);
    size_t batch_bytes = (size_t)sizeclass_batch[cls] * sizeclass_size[cls];
    size_t slots = TRANSFER_BYTES_MAX / batch_bytes;
    central_transfer_max[cls] = (uint8_t)(slots < TRANSFER_MIN ? TRANSFER_MIN : slots > TRANSFER_SLOTS ? TRANSFER_SLOTS : slots);
  }
}

/* The transfer cache's capacity follows the class's use: at most half as many batches as the
 * program and the thread caches hold objects of the class (out of the spans, not in the cache), at
 * least TRANSFER_MIN. Batches there are free memory that no span gets back; where a consumer hands
 * them to a producer at the rate it takes them (prodcons), the count wanders between empty and
 * full, each time empty has the producer carve new objects, so the cache ends up full whatever
 * its size: 0.9 MB of 3.2 MB peak RSS at prodcons --pairs 1, whose program holds 35 KB, when the
 * cache had no bound but transfer_max. A bound of as many batches as there are objects out left
 * prodcons' peak RSS at 1.14-1.18 of glibc's; half as many, 1.02-1.17 (3.2% less over its five
 * points, 0.954-0.990), at the same speed there and on remote-stream, server-mix, mixed-stress,
 * t-test1 and realloc-mix (mtbench's quick preset, 5 repetitions side by side: 1.005 of the time
 * over their 35 points, 0.948-1.067). Where thousands of objects are in flight (remote-stream), the
 * capacity grows with them, up to transfer_max. Set whenever the class lock is taken (a refill or
 * return through the spans, which is when the capacity was too small or the cache empty). Requires
 * c->lock. */
static void central_fit_capacity(central_t *c, unsigned cls) {
  int64_t out = (int64_t)c->spans_in_use * sizeclass_span_objects[cls] - (int64_t)c->free_in_spans -
                (int64_t)__atomic_load_n(&c->transfer_count, __ATOMIC_RELAXED) * sizeclass_batch[cls];
  int64_t cap = out / (2 * (int64_t)sizeclass_batch[cls]);
  if (cap < TRANSFER_MIN) cap = TRANSFER_MIN;
  if (cap > (int64_t)central_transfer_max[cls]) cap = central_transfer_max[cls];
  __atomic_store_n(&c->transfer_capacity, (uint32_t)cap, __ATOMIC_RELAXED);
}

static void central_nonempty_push(central_t *c, span_t *span) {
  span->prev = NULL;
  span->next = c->nonempty;
  if (c->nonempty) c->nonempty->prev = span;
  c->nonempty = span;
}

static void central_nonempty_remove(central_t *c, span_t *span) {
  if (span->prev) span->prev->next = span->next;
  else c->nonempty = span->next;
  if (span->next) span->next->prev = span->prev;
}

/* Objects of fewer than 16 bytes have no room for a free tag (freelist.h): plain links. */
static bool central_tagged(unsigned cls) { return sizeclass_size[cls] >= 16; }

/* The next object of a chain, its tag and link checked (freelist.h); call: who finds a damaged one. */
static void *central_next(unsigned cls, const void *obj, const char *call) {
  return central_tagged(cls) ? freelist_next_checked(obj, call) : *(void *const *)obj;
}

static void central_link(unsigned cls, void *obj, void *next) {
  if (central_tagged(cls)) freelist_mark(obj, next, freelist_key(obj));
  else *(void **)obj = next;
}

/* Pages [0, n) of a span of `size`-byte slots hold the starts of its first `carved` slots. */
static uint32_t central_pages_of(uint32_t carved, uint32_t size) {
  return carved ? (uint32_t)(((uintptr_t)(carved - 1) * size >> PAGE_SHIFT) + 1) : 0;
}

/* A new span starts with no slot carved. In the hardened build it is carved whole at once, in
 * random order (harden.c). */
static void central_carve_start(span_t *span, unsigned cls) {
  span->u.small.freelist = NULL;
  span->u.small.carved = 0;
  if (qm_hardened) { /* random order, freed memory's pattern in every slot */
    harden_carve(span, cls);
    span->u.small.carved = sizeclass_span_objects[cls];
    pagemap_set_carved(span, 0, central_pages_of(span->u.small.carved, sizeclass_size[cls]));
  }
}

static bool central_carved_whole(const span_t *span, unsigned cls) {
  return span->u.small.carved == sizeclass_span_objects[cls];
}

/* Carves the next page of the span into its empty free list, first slot first out: every slot
 * whose start is on that page (at least one: a slot of a page or more starts on a page of its own),
 * so that the page's small entry (free()'s fast path) is set exactly when a slot there can be live.
 * A slot beyond is in no list and its page's entry is 0, so a free() of it goes to the slow path,
 * which finds no object there (invalid pointer): carving whole, each slot's free tag did that and
 * touched every page of the span, up to 16 pages for one object of a multi-page class. */
static void central_carve_more(span_t *span, unsigned cls) {
  uint32_t size = sizeclass_size[cls], n = sizeclass_span_objects[cls];
  uint32_t first = span->u.small.carved;
  uint32_t pages = central_pages_of(first + 1, size); /* to the page slot `first` starts on */
  uint32_t end = (uint32_t)(((uintptr_t)pages << PAGE_SHIFT) + size - 1) / size; /* slots starting before */
  if (end > n) end = n;
  /* Hand-out order: slots of less than CARVE_LANE_MIN_BYTES come from CARVE_LANES lanes, each a
   * run of consecutive slots, a quarter of the carved range long (the first count % LANES lanes
   * one slot longer), taken in turn: so any LANES objects one thread allocates in a row sit at
   * least a lane less one slot apart, never on one cache line nor on one pair the adjacent-line
   * prefetcher fetches together, when it hands them to different threads (seed 000's benchmark
   * 3). Larger slots are that far apart already: one run, in address order. */
  uint32_t count = end - first, lanes = CARVE_LANES, lane = count / CARVE_LANES, longer = count % CARVE_LANES;
  if (size >= CARVE_LANE_MIN_BYTES || lane == 0 || (uintptr_t)(lane - 1) * size < CARVE_LANE_MIN_BYTES)
    lanes = 1, lane = count, longer = 0;
  /* Slot l's lane starts at base[l]; the k-th out is round k / lanes of lane k % lanes, after the
   * full rounds the longer lanes' last slots. Linked from the last out to the first, by loops
   * rather than a division and a remainder per slot (a variable divisor: two `div`s a slot, most
   * of a refill's time when a thread's first megabyte of 64-byte objects was carved). */
  uint32_t base[CARVE_LANES];
  for (uint32_t l = 0; l < lanes; l++) base[l] = first + l * lane + (l < longer ? l : longer);
  uintptr_t start = span->start;
  void *next = NULL;
  for (uint32_t l = longer; l-- > 0;) {
    void *obj = (void *)(start + (uintptr_t)(base[l] + lane) * size);
    central_link(cls, obj, next);
    next = obj;
  }
  for (uint32_t round = lane; round-- > 0;)
    for (uint32_t l = lanes; l-- > 0;) {
      void *obj = (void *)(start + (uintptr_t)(base[l] + round) * size);
      central_link(cls, obj, next);
      next = obj;
    }
  pagemap_set_carved(span, central_pages_of(first, size), pages);
  span->u.small.carved = (uint16_t)end;
  span->u.small.freelist = next;
}

/* ---- handing objects out ------------------------------------------------------------------ */

unsigned central_remove(unsigned cls, void **head, unsigned want) {
  central_t *c = &central_lists[cls];
  void *first = NULL, *last = NULL;
  unsigned got = 0;
  if (want == sizeclass_batch[cls]) {
    void *batch = transfer_take(c, cls);
    if (batch != NULL) {
      *head = batch;
      return want;
    }
  }
  /* A request carves one page at most: every slot carved costs its page (its free tag is written),
   * and a refill's batch of fresh slots sat unused in the thread cache whenever the program held
   * fewer than a batch of them at once (python3's resized dict tables and lists, a slot a page or
   * more each: 3 MB of its 29 MB peak, docs/design.md). Free slots already carved still come a
   * batch at a time; fewer fresh ones cost passes through this lock, against the page faults the
   * program's first writes to them cost anyway. */
  bool carved = false;
  central_lock(c, cls);
  while (got < want) {
    span_t *span = c->nonempty;
    if (carved && (span == NULL || span->u.small.freelist == NULL)) break;
    if (span == NULL) {
      pthread_mutex_unlock(&c->lock);
      span = pageheap_alloc(sizeclass_pages[cls], 1, cls, NULL);
      if (span != NULL) central_carve_start(span, cls);
      pthread_mutex_lock(&c->lock);
      if (span == NULL) break;
      span->u.small.allocated = 0;
      c->spans_in_use++;
      c->free_in_spans += sizeclass_span_objects[cls];
      central_nonempty_push(c, span);
    }
    /* Take the span's list from its head: the objects keep their tags and links (the chain handed
     * out is a free list too); only the last one taken is cut from the rest. */
    if (span->u.small.freelist == NULL) {
      central_carve_more(span, cls);
      carved = true;
    }
    void *obj = span->u.small.freelist, *prev = NULL;
    if (first == NULL) first = obj;
    else central_link(cls, last, obj);
    while (got < want && obj != NULL) {
      span->u.small.allocated++;
      got++;
      prev = obj;
      obj = central_next(cls, obj, "malloc()");
    }
    last = prev;
    span->u.small.freelist = obj;
    if (obj == NULL && central_carved_whole(span, cls)) central_nonempty_remove(c, span);
  }
  if (last != NULL) central_link(cls, last, NULL);
  c->free_in_spans -= got;
  central_fit_capacity(c, cls);
  pthread_mutex_unlock(&c->lock);
  *head = first;
  return got;
}

/* ---- taking objects back ------------------------------------------------------------------ */

/* Returns a chain of objects to their spans; spans left with nothing out are chained (through
 * next) into *emptied for the caller to give to the page heap after unlocking. Requires c->lock. */
static void central_insert_spans(central_t *c, unsigned cls, void *chain, span_t **emptied) {
  /* The span of the object before, and its carved slots [lo, hi): a chain's objects mostly come
   * in runs from one span, which then need no page-map walk (12 instructions an object, most of a
   * thread's exit when it freed a megabyte of small objects). Its checks held then and hold on:
   * under this lock a span of the class stays one, its carved range only grows. */
  span_t *span = NULL;
  uintptr_t lo = 0, hi = 0;
  while (chain != NULL) {
    void *obj = chain;
    chain = central_next(cls, obj, "free()");
    if ((uintptr_t)obj - lo >= hi - lo) {
      span = pagemap_span((uintptr_t)obj);
      if (span == NULL || span->state != SPAN_SMALL || span->sizeclass != cls)
        check_fail("free(): heap corruption (object in the wrong list)", obj);
      lo = span->start;
      hi = lo + (uintptr_t)span->u.small.carved * sizeclass_size[cls];
    }
    if (span->u.small.allocated == 0) check_fail_double_free("free()", obj);
    if (span->u.small.freelist == NULL && central_carved_whole(span, cls)) central_nonempty_push(c, span);
    central_link(cls, obj, span->u.small.freelist);
    span->u.small.freelist = obj;
    span->u.small.allocated--;
    c->free_in_spans++;
    if (span->u.small.allocated == 0) {
      central_nonempty_remove(c, span);
      c->spans_in_use--;
      c->free_in_spans -= sizeclass_span_objects[cls];
      span->next = *emptied;
      *emptied = span;
    }
  }
}

/* Outside the class lock: an emptied span is on no list of it any more. */
static void central_free_spans(span_t *emptied) {
  while (emptied != NULL) {
    span_t *next = emptied->next;
    if (qm_hardened) harden_check_emptied_span(emptied);
    pageheap_free(emptied);
    emptied = next;
  }
}

void central_insert(unsigned cls, void *head, unsigned count) {
  if (count == sizeclass_batch[cls] && transfer_put(&central_lists[cls], cls, head)) return;
  central_insert_to_spans(cls, head);
}

void central_insert_to_spans(unsigned cls, void *head) {
  central_t *c = &central_lists[cls];
  span_t *emptied = NULL;
  central_lock(c, cls);
  central_insert_spans(c, cls, head, &emptied);
  central_fit_capacity(c, cls);
  pthread_mutex_unlock(&c->lock);
  central_free_spans(emptied);
}

void central_drain_transfer(void) {
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    central_t *c = &central_lists[cls];
    /* A slot is reserved in the count before it is filled: no count, no full slot. Skipping
     * those classes, and reading a slot before exchanging it, made a malloc_trim(0) with nothing
     * to give back cost under 0.5 us instead of 17 (an exchange on every slot of every class):
     * a program that trims after each request. */
    if (__atomic_load_n(&c->transfer_count, __ATOMIC_RELAXED) == 0) continue;
    span_t *emptied = NULL;
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = 0; i < central_transfer_max[cls]; i++) {
      if (__atomic_load_n(&central_transfer_slots[cls][i], __ATOMIC_RELAXED) == NULL) continue;
      void *batch = __atomic_exchange_n(&central_transfer_slots[cls][i], NULL, __ATOMIC_ACQUIRE);
      if (batch == NULL) continue;
      __atomic_sub_fetch(&c->transfer_count, 1, __ATOMIC_RELAXED);
      central_insert_spans(c, cls, batch, &emptied);
    }
    pthread_mutex_unlock(&c->lock);
    central_free_spans(emptied);
  }
}

/* Seed 002's low-water rule applied to the transfer caches, once per idle interval: the batches
 * no thread took since the last call go back to their spans, so that spans can empty and their
 * pages decay. Without it, up to TRANSFER_BYTES_MAX per class stays parked after the threads
 * that freed those objects went idle (4.7 MB in mtbench's idle-threads scenario). */
void central_drain_idle_transfer(void) {
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    if (!central_is_used(cls)) continue;
    central_t *c = &central_lists[cls];
    span_t *emptied = NULL;
    if (__atomic_load_n(&c->transfer_count, __ATOMIC_RELAXED) == 0) {
      __atomic_store_n(&c->transfer_low, 0, __ATOMIC_RELAXED);
      continue;
    }
    pthread_mutex_lock(&c->lock);
    void *batch;
    for (uint32_t idle = __atomic_load_n(&c->transfer_low, __ATOMIC_RELAXED); idle > 0 && (batch = transfer_take(c, cls)); idle--)
      central_insert_spans(c, cls, batch, &emptied);
    __atomic_store_n(&c->transfer_low, __atomic_load_n(&c->transfer_count, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->lock);
    central_free_spans(emptied);
  }
}

/* ---- process life ------------------------------------------------------------------------- */

void central_lock_for_fork(void) {
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) fork_lock(&central_lists[cls].lock, FORK_SLOT_CENTRAL(cls));
}

void central_unlock_after_fork(bool child) {
  for (unsigned cls = SIZECLASS_COUNT - 1; cls >= 1; cls--) {
    central_t *c = &central_lists[cls];
    if (child) {
      /* A thread of the parent may have been between a slot's exchange and the count's update:
       * the child's only thread counts the full slots again (the batch such a thread held is lost
       * to the child, as that thread's cache is). */
      uint32_t full = 0;
      for (uint32_t i = 0; i < central_transfer_max[cls]; i++) full += central_transfer_slots[cls][i] != NULL;
      c->transfer_count = full;
    }
    fork_unlock(&c->lock, FORK_SLOT_CENTRAL(cls), child);
  }
}
