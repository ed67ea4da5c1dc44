/* Thread cache: garbage collection moves half the low-water mark and gives the capacity back;
 * the budget bounds capacity; new threads get less budget as threads multiply; a thread's
 * cache goes back to the central lists when it exits. */
#include <pthread.h>
#include <string.h>

#include "internal.h"
#include "qmalloc.h"
#include "tcache_window.h"
#include "testutil.h"

#define CLASS_SIZE 64

static void *exit_with_cache(void *arg) {
  void *objs[200];
  for (int i = 0; i < 200; i++) objs[i] = qm_malloc(CLASS_SIZE);
  for (int i = 0; i < 200; i++) qm_free(objs[i]);
  *(size_t *)arg = list_length(&tcache_self.lists[sizeclass_of(CLASS_SIZE)]);
  return NULL;
}

/* The owner collects as its slow paths do: inside its window. */
static void collect(tcache_t *tc) {
  tcache_open();
  tcache_gc(tc);
  tcache_close(tc);
}

static pthread_barrier_t all_started, may_exit;

static size_t budgets[16];

/* A thread that fills its caches (lists that miss grow, as far as its budget lets them), then
 * sleeps holding them until may_exit. */
static pthread_barrier_t filled;
static void *hoard(void *unused) {
  (void)unused;
  void *objs[256];
  for (int round = 0; round < 8; round++) {
    for (size_t size = 16; size <= 4096; size *= 2) {
      for (int i = 0; i < 256; i++) objs[i] = qm_malloc(size);
      for (int i = 0; i < 256; i++) qm_free(objs[i]);
    }
  }
  pthread_barrier_wait(&filled);
  pthread_barrier_wait(&may_exit);
  return NULL;
}

static void *report_budget(void *arg) {
  qm_free(qm_malloc(32)); /* set the cache up */
  budgets[(size_t)arg] = tcache_self.max_size;
  pthread_barrier_wait(&all_started);
  pthread_barrier_wait(&may_exit);
  return NULL;
}

/* realloc growing a block out of a class of 16 KiB or more sends the old one to its span, not this
 * thread's cache (api.c, realloc_impl); moving it to a smaller class frees it as free does. */
static void *test_realloc_growth(void *unused) {
  (void)unused;
  unsigned cls = sizeclass_of(20000);
  size_t before[SIZECLASS_COUNT] = {0}, after[SIZECLASS_COUNT] = {0};
  tcache_totals_t t;
  char *p = qm_malloc(20000);
  memset(p, 'g', 20000);
  tcache_totals(&t, before, NULL, 0);
  char *q = qm_realloc(p, 40000);
  tcache_totals(&t, after, NULL, 0);
  CHECK(q != NULL && q != p && q[0] == 'g' && q[19999] == 'g');
  CHECK_MSG(after[cls] == before[cls], "the grown block's old place went to the thread cache (%zu -> %zu objects)",
            before[cls], after[cls]);
  char *r = qm_malloc(20000);
  tcache_totals(&t, before, NULL, 0);
  char *s = qm_realloc(r, 100); /* a shrink past half: moved, and cached as any free */
  tcache_totals(&t, after, NULL, 0);
  CHECK(s != NULL && s != r);
  CHECK_EQ(after[cls], before[cls] + 1);
  qm_free(q);
  qm_free(s);
  return NULL;
}

/* The timed collection (tcache.c, TCACHE_GC_MS): the slow path that finds it due collects once and
 * sets the next; one that does not find it due does not. */
static void *test_timed_collection(void *unused) {
  (void)unused;
  tcache_t *tc = &tcache_self;
  unsigned cls = sizeclass_of(3000);
  void *objs[64];
  for (int i = 0; i < 64; i++) objs[i] = qm_malloc(3000);
  for (int i = 0; i < 64; i++) qm_free(objs[i]);
  collect(tc); /* its low-water mark is now its length: the next collection moves half */
  uint64_t runs = tc->gc_runs;
  tc->next_gc_ms = UINT64_MAX;
  qm_free(qm_malloc(100000)); /* a refill of an empty list: a slow path */
  CHECK_EQ(tc->gc_runs, runs);
  uint32_t held = list_length(&tc->lists[cls]);
  CHECK(held > 0);
  tc->next_gc_ms = 0; /* due */
  qm_free(qm_malloc(150000)); /* another class's refill */
  CHECK_EQ(tc->gc_runs, runs + 1);
  CHECK(tc->next_gc_ms != 0 && tc->next_gc_ms != UINT64_MAX);
  CHECK(list_length(&tc->lists[cls]) < held); /* half its low-water mark moved */
  return NULL;
}

int main(void) {
  tcache_t *tc = &tcache_self;
  qm_free(qm_malloc(CLASS_SIZE));
  CHECK(tc->state == TCACHE_LIVE);
  tc->next_gc_ms = UINT64_MAX; /* no timed collection (tcache_gc_if_due) in the middle of these checks */
  pthread_t grower; /* a thread of its own: its budget goes back when it exits, for the checks below */
  int created = pthread_create(&grower, NULL, test_realloc_growth, NULL);
  if (created == 0) pthread_join(grower, NULL);
  CHECK(created == 0); /* after the join: the counters are the thread's until then */
  pthread_t collector;
  created = pthread_create(&collector, NULL, test_timed_collection, NULL);
  if (created == 0) pthread_join(collector, NULL);
  CHECK(created == 0);
  unsigned cls = sizeclass_of(CLASS_SIZE);
  tcache_list_t *list = &tc->lists[cls];

  /* Capacity accounting: the sum over lists of max_length * size. */
  size_t sum = 0;
  for (unsigned k = 1; k < SIZECLASS_COUNT; k++) sum += (size_t)list_max(&tc->lists[k]) * sizeclass_size[k];
  CHECK_EQ(tc->capacity, sum);
  CHECK(tc->capacity <= tc->max_size);

  /* Grow the list: many objects out and back. */
  void *objs[256];
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < 256; i++) objs[i] = qm_malloc(CLASS_SIZE);
    for (int i = 0; i < 256; i++) qm_free(objs[i]);
  }
  CHECK(list_length(list) >= 40);
  collect(tc); /* start a collection period: low water = length */
  uint16_t start_len = list_length(list);
  CHECK_EQ(list_low_water(list), start_len);
  /* The low-water mark is kept as a floor the fast path stops at (types.h): after 10 pops it is
   * at most the true mark and within a quarter of it. */
  uint32_t true_low = start_len - 10u;
  for (int i = 0; i < 10; i++) objs[i] = qm_malloc(CLASS_SIZE);
  uint32_t low = list_low_water(list);
  CHECK(low <= true_low);
  CHECK(low >= true_low - true_low / 4);
  for (int i = 0; i < 10; i++) qm_free(objs[i]); /* back to start_len; L stays */
  CHECK_EQ(list_low_water(list), low);
  uint16_t max_before = list_max(list);
  size_t cap_before = tc->capacity;
  collect(tc);
  CHECK_EQ(list_length(list), start_len - low / 2);
  CHECK_EQ(list_max(list), max_before - low / 2);
  CHECK(tc->capacity <= cap_before - (size_t)(low / 2) * CLASS_SIZE);
  CHECK_EQ(list_low_water(list), list_length(list));
  /* Draining the list to 0: after every pop the floor is at most the length (the running
   * minimum) and within a quarter of it, and it moves (one slow pop each) only a few times. */
  uint16_t len1 = list_length(list);
  void **drained = qm_malloc(len1 * sizeof(void *));
  uint32_t floor_wrong = 0, floor_moves = 0;
  for (uint16_t i = 0; i < len1; i++) {
    uint32_t floor_before = list_low_water(list);
    drained[i] = qm_malloc(CLASS_SIZE);
    uint32_t m = list_length(list), f = list_low_water(list);
    if (f > m || f < m - m / 4) floor_wrong++;
    if (f != floor_before) floor_moves++;
  }
  CHECK_EQ(floor_wrong, 0);
  CHECK_MSG(floor_moves >= 2 && floor_moves <= 16, "floor moved %u times draining %u objects", floor_moves, len1);
  CHECK_EQ(list_length(list), 0);
  CHECK_EQ(list_low_water(list), 0);
  for (uint16_t i = 0; i < len1; i++) qm_free(drained[len1 - 1 - i]);
  qm_free(drained);
  CHECK_EQ(list_length(list), len1);
  collect(tc); /* L = 0: nothing moves */
  CHECK_EQ(list_length(list), len1);
  /* A second collection with no use in between takes half of what is left. */
  uint16_t len2 = list_length(list);
  collect(tc);
  CHECK_EQ(list_length(list), len2 - len2 / 2);

  /* A producer's list: grown by misses, never filled. Collection takes back the capacity it does
   * not use: its maximum falls to one batch (its length is 0). */
  unsigned pcls = sizeclass_of(128);
  tcache_list_t *plist = &tc->lists[pcls];
  static void *kept[2000];
  for (int i = 0; i < 2000; i++) kept[i] = qm_malloc(128);
  while (list_length(plist) > 0) kept[0] = qm_malloc(128); /* leak a few: the list must be empty */
  CHECK(list_max(plist) > sizeclass_batch[pcls]);
  size_t cap_producer = tc->capacity;
  uint16_t pmax = list_max(plist);
  collect(tc);
  CHECK_EQ(list_max(plist), sizeclass_batch[pcls]);
  CHECK(tc->capacity <= cap_producer - (size_t)(pmax - sizeclass_batch[pcls]) * 128);
  CHECK(tcache_check(tc) == NULL);
  for (int i = 1; i < 2000; i++) qm_free(kept[i]);

  /* Budget bounds the bytes held: fill every list hard, then compare. */
  for (size_t size = 16; size <= 4096; size *= 2) {
    for (int i = 0; i < 256; i++) objs[i] = qm_malloc(size);
    for (int i = 0; i < 256; i++) qm_free(objs[i]);
  }
  size_t held = 0;
  for (unsigned k = 1; k < SIZECLASS_COUNT; k++) held += (size_t)list_length(&tc->lists[k]) * sizeclass_size[k];
  CHECK(held <= tc->capacity);
  CHECK(tc->capacity <= tc->max_size);

  /* Exit hands the cache back: the thread held objects, none stay with it. */
  tcache_totals_t totals_before, totals_after;
  tcache_totals(&totals_before, NULL, NULL, 0);
  size_t held_at_exit = 0;
  pthread_t t;
  pthread_create(&t, NULL, exit_with_cache, &held_at_exit);
  pthread_join(t, NULL);
  CHECK(held_at_exit > 0);
  tcache_totals(&totals_after, NULL, NULL, 0);
  CHECK_EQ(totals_after.threads, totals_before.threads);
  CHECK_EQ(totals_after.bytes, totals_before.bytes);

  /* Budget shrinks as threads multiply: with 1 MiB left to claim, the first threads get the
   * starting size and later ones only the minimum. (This thread keeps what it claimed above,
   * which depends on the batch sizes: the total is set 1 MiB above it.) */
  options_values[OPTION_TCACHE_TOTAL] = (long long)(tcache_self.max_size + (1 << 20));
  tcache_budget_init();
  pthread_barrier_init(&all_started, NULL, 17);
  pthread_barrier_init(&may_exit, NULL, 17);
  pthread_t ts[16];
  for (size_t i = 0; i < 16; i++) {
    pthread_create(&ts[i], NULL, report_budget, (void *)i);
  }
  pthread_barrier_wait(&all_started);
  size_t total = 0, smallest = SIZE_MAX, largest = 0;
  for (int i = 0; i < 16; i++) {
    total += budgets[i];
    if (budgets[i] < smallest) smallest = budgets[i];
    if (budgets[i] > largest) largest = budgets[i];
  }
  CHECK(largest == TCACHE_START_SIZE);
  CHECK(smallest == TCACHE_STEAL_STEP);
  CHECK(total <= (1 << 20) + 16 * TCACHE_STEAL_STEP);
  pthread_barrier_wait(&may_exit);
  for (int i = 0; i < 16; i++) pthread_join(ts[i], NULL);

  /* The total bounds what the caches hold, even when the threads that lose budget sleep: threads
   * fill their caches one after another, each then sleeping with its lists full while the next
   * takes budget. Steps a thread's lists use go only down to a fair share, so the caches hold at
   * most twice the total (tcache_grow_budget): 7.0 MB here. Taken freely, every thread took what it
   * wanted from the sleepers: 17.1 MB against a total of 4 MiB. */
  size_t limit = (size_t)4 << 20;
  options_values[OPTION_TCACHE_TOTAL] = (long long)limit;
  tcache_budget_init();
  pthread_barrier_init(&filled, NULL, 2);
  pthread_barrier_init(&may_exit, NULL, 9);
  pthread_t hoarders[8];
  for (size_t i = 0; i < 8; i++) {
    pthread_create(&hoarders[i], NULL, hoard, NULL);
    pthread_barrier_wait(&filled);
  }
  tcache_totals_t sleeping;
  tcache_totals(&sleeping, NULL, NULL, 0);
  CHECK_MSG(sleeping.bytes <= 2 * limit, "8 sleeping threads hold %zu bytes in their caches, over twice the %zu total",
            sleeping.bytes, limit);
  pthread_barrier_wait(&may_exit);
  for (int i = 0; i < 8; i++) pthread_join(hoarders[i], NULL);
  return tu_summary("tcache");
}
