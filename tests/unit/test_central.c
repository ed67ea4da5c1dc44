/* Central lists: a whole batch goes through the transfer cache untouched; partial chains go
 * back to their spans; a span whose objects are all back returns to the page heap; batches that
 * sit unused for an idle interval go back to their spans; threads exchanging batches through the
 * lock-free slots at once neither lose nor duplicate one, and a full cache sends batches to the
 * spans; a double return is caught (death test in a child); a span's slots are carved as they are
 * taken, small ones in lanes so that objects taken in a row never share a cache line, and a request
 * carves one page at most. */
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "freelist.h"
#include "internal.h"
#include "os.h"
#include "testutil.h"

/* Each thread takes batches of class 96 and puts them back, checking every batch whole: exactly
 * `batch` objects, each with its free tag, none held by another thread at the same time (a
 * batch handed to two threads would show as a stamp overwritten under the holder). */
enum { EXCHANGERS = 4, EXCHANGE_ROUNDS = 20000, HELD = 3 };
static int exchange_failures;

static void *exchanger(void *arg) {
  uintptr_t me = (uintptr_t)arg;
  unsigned cls = sizeclass_of(96);
  for (int round = 0; round < EXCHANGE_ROUNDS; round++) {
    void *held[HELD];
    for (int h = 0; h < HELD; h++) {
      held[h] = NULL;
      if (central_remove(cls, &held[h], sizeclass_batch[cls]) != sizeclass_batch[cls]) __atomic_add_fetch(&exchange_failures, 1, __ATOMIC_RELAXED);
      unsigned n = 0;
      for (void *p = held[h]; p != NULL; p = freelist_next(p), n++)
        if (!freelist_tagged(p, freelist_key(p))) __atomic_add_fetch(&exchange_failures, 1, __ATOMIC_RELAXED);
      if (n != sizeclass_batch[cls]) __atomic_add_fetch(&exchange_failures, 1, __ATOMIC_RELAXED);
      ((uintptr_t *)held[h])[2] = me; /* past the link and the tag: the object's own bytes */
    }
    for (int h = HELD; h-- > 0;) {
      if (((uintptr_t *)held[h])[2] != me) __atomic_add_fetch(&exchange_failures, 1, __ATOMIC_RELAXED);
      central_insert(cls, held[h], sizeclass_batch[cls]);
    }
  }
  return NULL;
}

/* pages free pages of the page heap, written with 0x5a so that a test sees which bytes a span laid
 * on them wrote (best fit hands them to the next span of that many pages); their start. */
static uintptr_t pattern_pages(uint32_t pages) {
  span_t *filled = pageheap_alloc(pages, 1, 0, NULL);
  CHECK(filled != NULL);
  uintptr_t at = filled->start;
  memset((void *)at, 0x5a, (size_t)pages * PAGE_SIZE);
  pageheap_free(filled);
  return at;
}

/* Slots are carved as they are taken, a page at a time and one page a request at most, however
 * many slots it wants (each slot carved costs its page: its free tag is written; a refill's batch
 * of fresh ones sat unused in a thread cache whenever the program held fewer at once). The pages
 * of a span no slot was taken from are not written (a program that takes one object of a
 * multi-page class keeps one page resident), and their page-map entries stay 0, so that free()'s
 * fast path sends a pointer there to the slow path. A class of 2 KiB asked for a batch (16) from a
 * fresh span gets the first page's slots; the next request, the second page's. */
static void test_carved_on_demand(void) {
  unsigned cls = sizeclass_of(2048);
  uint32_t pages = sizeclass_pages[cls], per_page = PAGE_SIZE / 2048;
  CHECK(sizeclass_size[cls] == 2048 && pages >= 2 && sizeclass_batch[cls] > per_page && 2048 < os_page_size());
  uintptr_t at = pattern_pages(pages);

  void *first = NULL;
  CHECK_EQ(central_remove(cls, &first, sizeclass_batch[cls]), per_page);
  CHECK_EQ((uintptr_t)first, at); /* best fit: the same pages */
  span_t *span = pagemap_span(at);
  CHECK_EQ(span->u.small.carved, per_page); /* the slots starting on the first page */
  for (uint32_t i = 1; i < pages; i++) {
    uintptr_t page = at + i * PAGE_SIZE;
    CHECK_EQ(*(unsigned char *)page, 0x5a);
    CHECK_EQ(pagemap_small_of(page), 0);
  }
  void *last = first;
  for (unsigned n = 1; n < per_page; n++) last = freelist_next(last);
  CHECK(freelist_next(last) == NULL);
  void *rest = NULL;
  CHECK_EQ(central_remove(cls, &rest, sizeclass_batch[cls]), per_page);
  CHECK_EQ(span->u.small.carved, 2 * per_page);
  unsigned n = 0;
  for (void *p = rest; p != NULL; p = freelist_next(p), n++) {
    uintptr_t addr = (uintptr_t)p;
    CHECK(addr >= at + PAGE_SIZE && addr < at + 2 * PAGE_SIZE && (addr - at) % 2048 == 0); /* the second page */
    CHECK_EQ(pagemap_small_of(addr), PAGEMAP_SMALL_ENTRY(at, cls));
  }
  CHECK_EQ(n, per_page);
  freelist_set_next(last, rest);
  central_insert(cls, first, 2 * per_page); /* fewer than a batch: to the span */
  central_drain_transfer();
  CHECK(pagemap_span(at) != span || span->state != SPAN_SMALL); /* every slot back: the span left */
}

/* The same rule for a class of a page: one fresh slot a request. Slots already carved and back in
 * the span are still taken together. */
static void test_carved_one_a_request(void) {
  unsigned cls = sizeclass_of(8192);
  uint32_t pages = sizeclass_pages[cls], per_span = (uint32_t)(pages * PAGE_SIZE / 8192);
  CHECK(per_span >= 4 && sizeclass_batch[cls] >= 4 && 8192 >= os_page_size());
  uintptr_t at = pattern_pages(pages);

  void *first = NULL, *second = NULL;
  CHECK_EQ(central_remove(cls, &first, 4), 1);
  CHECK_EQ((uintptr_t)first, at); /* best fit: the same pages */
  span_t *span = pagemap_span(at);
  CHECK_EQ(span->u.small.carved, 1);
  for (uintptr_t slot = at + 8192; slot < at + (uintptr_t)pages * PAGE_SIZE; slot += 8192) {
    CHECK_EQ(*(unsigned char *)slot, 0x5a); /* not written: not carved */
    CHECK_EQ(pagemap_small_of(slot), 0);
  }
  CHECK_EQ(central_remove(cls, &second, 4), 1);
  CHECK_EQ((uintptr_t)second, at + 8192);
  CHECK_EQ(span->u.small.carved, 2);
  CHECK_EQ(*(unsigned char *)(at + 2 * 8192), 0x5a);

  /* Two back to the span (fewer than a batch: not the transfer cache), one kept out so that the
   * span stays: the two carved slots then come out in one request, with one page more carved. */
  void *kept = NULL, *three = NULL;
  CHECK_EQ(central_remove(cls, &kept, 1), 1);
  CHECK_EQ(span->u.small.carved, 3);
  freelist_set_next(first, second);
  freelist_set_next(second, NULL);
  central_insert(cls, first, 2);
  CHECK_EQ(span->u.small.allocated, 1);
  CHECK_EQ(central_remove(cls, &three, 4), 3);
  void *last = freelist_next(freelist_next(three));
  CHECK(last != NULL && freelist_next(last) == NULL);
  CHECK_EQ((uintptr_t)last, at + 3 * 8192);
  CHECK_EQ(span->u.small.carved, 4);
  freelist_set_next(last, kept);
  freelist_set_next(kept, NULL);
  central_insert(cls, three, 4);
  central_drain_transfer();
}

/* A new span's slots smaller than CARVE_LANE_MIN_BYTES come out in lanes: any four taken in a
 * row (benchmark 3 of seed 000 hands one to each of up to four threads) sit at least
 * CARVE_LANE_MIN_BYTES apart (no cache line, no adjacent-line pair shared), and the span, taken
 * whole, still gives every slot exactly once. Slots of CARVE_LANE_MIN_BYTES come out in address
 * order. Objects are taken one at a time, as a thread's refills of one take them (a page carved at
 * a time), after whatever spans of the class were in use ran out. The arrays are static: a
 * malloc here would take objects of these classes into the thread cache. */
enum { LANES_MAX_SLOTS = PAGE_SIZE / 8 };
static uintptr_t lanes_at[LANES_MAX_SLOTS];
static void *lanes_before[2 * LANES_MAX_SLOTS];
static unsigned char lanes_seen[LANES_MAX_SLOTS];

static void test_carve_lanes(void) {
  unsigned checked = 0;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT && sizeclass_size[cls] <= CARVE_LANE_MIN_BYTES; cls++) {
    uint32_t size = sizeclass_size[cls];
    unsigned per_span = (unsigned)(sizeclass_pages[cls] * PAGE_SIZE / size), older = 0, n = 0;
    uintptr_t *at = lanes_at; /* the fresh span's objects in the order they came out */
    CHECK(per_span <= LANES_MAX_SLOTS);
    memset(lanes_seen, 0, per_span);
    span_t *fresh = NULL;
    while (fresh == NULL && older < 2 * per_span) { /* until an object is a new span's first */
      void *one = NULL;
      CHECK_EQ(central_remove(cls, &one, 1), 1);
      span_t *span = pagemap_span((uintptr_t)one);
      if (span->u.small.allocated == 1 && (uintptr_t)one == span->start) fresh = span, at[n++] = (uintptr_t)one;
      else lanes_before[older++] = one;
    }
    CHECK(fresh != NULL);
    while (n < per_span) {
      void *one = NULL;
      CHECK_EQ(central_remove(cls, &one, 1), 1);
      at[n++] = (uintptr_t)one;
    }
    for (unsigned i = 0; i < n; i++) { /* every slot of the span, once */
      uintptr_t off = at[i] - fresh->start;
      bool slot = at[i] >= fresh->start && off % size == 0 && off / size < per_span;
      CHECK(slot && !lanes_seen[off / size]);
      if (slot) lanes_seen[off / size] = 1;
    }
    if (size < CARVE_LANE_MIN_BYTES) {
      for (unsigned i = 0; i + 1 < n; i++)
        for (unsigned j = i + 1; j < n && j < i + 4; j++)
          CHECK((at[i] > at[j] ? at[i] - at[j] : at[j] - at[i]) >= CARVE_LANE_MIN_BYTES);
    } else {
      for (unsigned i = 0; i + 1 < n; i++) CHECK_EQ(at[i + 1], at[i] + size);
    }
    for (unsigned i = 0; i < n + older; i++) { /* everything back, one object at a time */
      void *obj = i < n ? (void *)at[i] : lanes_before[i - n];
      if (size >= 16) freelist_set_next(obj, NULL);
      else *(void **)obj = NULL;
      central_insert(cls, obj, 1);
    }
    checked++;
  }
  CHECK(checked >= 8); /* 8 to 128 bytes */
}

/* A chain going back to its spans is checked object by object, also within a run from one span
 * (whose span the insert does not look up again): an object of that run returned twice, the
 * second time once its span has nothing out, is a double free; an object of another class's span
 * in the middle of a run is a corrupted list. Each in a child of its own, fresh classes there. */
/* n objects of class cls, one request each (a request carves a page at most), chained in the
 * order they came: the objects keep their free tags, the links are set here. */
static void *take_chain(unsigned cls, uint32_t n) {
  void *first = NULL, *last = NULL;
  for (uint32_t i = 0; i < n; i++) {
    void *one = NULL;
    if (central_remove(cls, &one, 1) != 1) _exit(3);
    freelist_set_next(one, NULL);
    if (last != NULL) freelist_set_next(last, one);
    else first = one;
    last = one;
  }
  return first;
}

static void return_one_span_twice(void *unused) {
  (void)unused;
  unsigned cls = sizeclass_of(100000);
  uint32_t per_span = sizeclass_span_objects[cls];
  void *head = take_chain(cls, per_span);
  void *last = head;
  for (uint32_t i = 1; i < per_span; i++) last = freelist_next(last);
  if (pagemap_span((uintptr_t)last) != pagemap_span((uintptr_t)head)) _exit(4); /* one span */
  freelist_set_next(last, head); /* the run, then its first object again */
  central_insert_to_spans(cls, head);
  _exit(0);
}

static void return_other_class_in_run(void *unused) {
  (void)unused;
  unsigned cls = sizeclass_of(100000), other = sizeclass_of(50000);
  void *mine = take_chain(cls, 2), *theirs = take_chain(other, 1);
  void *second = freelist_next(mine);
  if (pagemap_span((uintptr_t)second) != pagemap_span((uintptr_t)mine)) _exit(4); /* one span */
  freelist_set_next(mine, theirs); /* mine, theirs, second */
  freelist_set_next(theirs, second);
  central_insert_to_spans(cls, mine);
  _exit(0);
}

static void test_insert_checks_each(void) {
  CHECK(sizeclass_span_objects[sizeclass_of(100000)] >= 2);
  char out[512];
  int status;
  tu_stderr_of_child(return_one_span_twice, NULL, out, sizeof out, &status);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  CHECK(strstr(out, "qmalloc: free(): double free 0x") != NULL);
  tu_stderr_of_child(return_other_class_in_run, NULL, out, sizeof out, &status);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  CHECK(strstr(out, "qmalloc: free(): heap corruption (object in the wrong list) 0x") != NULL);
}

int main(void) {
  init_process();
  test_insert_checks_each();
  test_carved_on_demand();
  test_carved_one_a_request();
  test_carve_lanes();
  unsigned cls = sizeclass_of(96);
  central_t *c = &central_lists[cls];
  central_drain_transfer();

  void *head = NULL;
  unsigned got = central_remove(cls, &head, sizeclass_batch[cls]);
  CHECK_EQ(got, sizeclass_batch[cls]);
  unsigned n = 0;
  for (void *p = head; p; p = freelist_next(p)) n++;
  CHECK_EQ(n, sizeclass_batch[cls]);
  uint32_t before = c->transfer_count;
  central_insert(cls, head, sizeclass_batch[cls]);
  CHECK_EQ(c->transfer_count, before + 1);
  void *again = NULL;
  CHECK_EQ(central_remove(cls, &again, sizeclass_batch[cls]), sizeclass_batch[cls]);
  CHECK(again == head); /* the same chain, handed over whole */
  CHECK_EQ(c->transfer_count, before);

  /* Return the chain one object at a time (not a batch): objects go back to their spans and a
   * span with nothing out leaves the class. */
  uint64_t spans_before = c->spans_in_use;
  while (again) {
    void *next = freelist_next(again);
    freelist_set_next(again, NULL);
    central_insert(cls, again, 1);
    again = next;
  }
  CHECK(c->spans_in_use <= spans_before);

  /* A whole span's worth out and back: the span goes to the page heap. */
  unsigned per_span = (unsigned)(sizeclass_pages[cls] * PAGE_SIZE / sizeclass_size[cls]);
  central_drain_transfer();
  uint64_t spans0 = c->spans_in_use;
  void *all = NULL;
  CHECK_EQ(central_remove(cls, &all, per_span), per_span);
  CHECK(c->spans_in_use >= spans0);
  central_insert(cls, all, per_span);
  central_drain_transfer();
  CHECK_EQ(c->spans_in_use, spans0);

  /* Idle drain (seed 002's rule on transfer caches): batches nobody took since the previous call
   * go back to their spans; batches taken in between lower the mark. */
  central_drain_transfer();
  central_drain_idle_transfer(); /* mark: 0 batches */
  /* 8 batches out make room for 4 (half as many); the program keeps the other 4 meanwhile. */
  void *batches[8];
  for (int i = 0; i < 8; i++) CHECK_EQ(central_remove(cls, &batches[i], sizeclass_batch[cls]), sizeclass_batch[cls]);
  for (int i = 0; i < 4; i++) central_insert(cls, batches[i], sizeclass_batch[cls]);
  CHECK_EQ(c->transfer_count, 4);
  central_drain_idle_transfer(); /* the mark was 0: nothing goes; mark now 4 */
  CHECK_EQ(c->transfer_count, 4);
  void *taken = NULL;
  CHECK_EQ(central_remove(cls, &taken, sizeclass_batch[cls]), sizeclass_batch[cls]); /* 3 left: mark 3 */
  central_insert(cls, taken, sizeclass_batch[cls]);                     /* 4 again */
  central_drain_idle_transfer(); /* the 3 that sat unused go back */
  CHECK_EQ(c->transfer_count, 1);
  central_drain_idle_transfer(); /* and the last one next time */
  CHECK_EQ(c->transfer_count, 0);
  for (int i = 4; i < 8; i++) central_insert(cls, batches[i], sizeclass_batch[cls]);
  central_drain_transfer();
  CHECK_EQ(c->spans_in_use, spans0); /* every span emptied went back to the page heap */

  uint64_t spans_alone = c->spans_in_use;

  /* A full cache: the next batches go back to their spans. With 2 * cap + 1 batches out, the
   * capacity is at its largest. */
  void *fill[2 * TRANSFER_SLOTS + 1];
  uint32_t cap = central_transfer_max[cls];
  for (uint32_t i = 0; i <= 2 * cap; i++) CHECK_EQ(central_remove(cls, &fill[i], sizeclass_batch[cls]), sizeclass_batch[cls]);
  CHECK_EQ(c->transfer_capacity, cap);
  for (uint32_t i = 0; i <= 2 * cap; i++) central_insert(cls, fill[i], sizeclass_batch[cls]);
  CHECK_EQ(c->transfer_count, cap);
  /* Out of the spans now: the cached batches only, the others went back to their spans. */
  CHECK_EQ(c->spans_in_use * per_span - c->free_in_spans, (uint64_t)cap * sizeclass_batch[cls]);
  central_drain_transfer();
  CHECK_EQ(c->spans_in_use, spans_alone);

  /* The capacity follows the class's use: 16 batches out make room for 8, and 4 for 2 (not 4);
   * once the program holds none (the next return through the spans sees that), a batch beyond
   * TRANSFER_MIN goes back to its spans instead of waiting in the cache. */
  CHECK(central_transfer_max[cls] >= 8);
  for (int i = 0; i < 4; i++) CHECK_EQ(central_remove(cls, &fill[i], sizeclass_batch[cls]), sizeclass_batch[cls]);
  CHECK_EQ(c->transfer_capacity, 2);
  for (int i = 4; i < 16; i++) CHECK_EQ(central_remove(cls, &fill[i], sizeclass_batch[cls]), sizeclass_batch[cls]);
  CHECK_EQ(c->transfer_capacity, 8);
  for (int i = 0; i < 16; i++) central_insert(cls, fill[i], sizeclass_batch[cls]);
  CHECK_EQ(c->transfer_count, 8);
  void *single = NULL;
  CHECK_EQ(central_remove(cls, &single, 1), 1); /* not a batch: through the spans, both ways */
  central_insert(cls, single, 1);
  CHECK_EQ(c->transfer_capacity, TRANSFER_MIN);
  CHECK_EQ(central_remove(cls, &fill[0], sizeclass_batch[cls]), sizeclass_batch[cls]); /* from the cache: 7 left */
  central_insert(cls, fill[0], sizeclass_batch[cls]);                     /* over capacity: to its spans */
  CHECK_EQ(c->transfer_count, 7);
  central_drain_transfer();
  CHECK_EQ(c->spans_in_use, spans_alone);

  /* Fork: a thread of the parent caught between a slot's exchange and the count's update leaves
   * the count one too high; the child counts its full slots again. */
  void *kept = NULL;
  CHECK_EQ(central_remove(cls, &kept, sizeclass_batch[cls]), sizeclass_batch[cls]);
  central_insert(cls, kept, sizeclass_batch[cls]);
  CHECK_EQ(c->transfer_count, 1);
  __atomic_add_fetch(&c->transfer_count, 1, __ATOMIC_RELAXED); /* the take in flight */
  pid_t counted = fork();
  if (counted == 0) _exit(c->transfer_count == 1 ? 0 : 1);
  int counted_status = -1;
  waitpid(counted, &counted_status, 0);
  CHECK(WIFEXITED(counted_status) && WEXITSTATUS(counted_status) == 0);
  __atomic_sub_fetch(&c->transfer_count, 1, __ATOMIC_RELAXED);
  central_drain_transfer();

  /* Returning an object twice is fatal once its span has nothing out: a class with one object per
   * span makes that immediate. */
  unsigned big = sizeclass_of(200000);
  pid_t pid = fork();
  if (pid == 0) {
    close(2);
    void *one;
    central_remove(big, &one, 1);
    freelist_set_next(one, NULL);
    central_insert(big, one, 1);
    central_insert(big, one, 1);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);

  /* Threads at once: every batch comes back whole, and once the cache is drained every span of
   * the class is back in the page heap (nothing lost, nothing handed out twice). With 4 threads
   * holding 3 batches each, takes and puts run into a full cache and into empty slots. Last: from
   * here on the process is multi-threaded, and a fork would take every lock (more than
   * ThreadSanitizer's deadlock detector follows: checked-tsan runs this test). */
  central_drain_transfer();
  pthread_t threads[EXCHANGERS];
  for (uintptr_t t = 0; t < EXCHANGERS; t++) CHECK(pthread_create(&threads[t], NULL, exchanger, (void *)(t + 1)) == 0);
  for (int t = 0; t < EXCHANGERS; t++) pthread_join(threads[t], NULL);
  CHECK_EQ(exchange_failures, 0);
  CHECK(c->transfer_count <= central_transfer_max[cls]);
  central_drain_transfer();
  CHECK_EQ(c->transfer_count, 0);
  CHECK_EQ(c->spans_in_use, spans_alone);

  return tu_summary("central");
}
