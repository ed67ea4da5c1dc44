/* Idle threads' caches (tcache_window.h, tcache_reclaim_scan): a thread that stops allocating gets
 * its cache taken back by the second idle scan after it went quiet, every byte of it, with its
 * budget; a thread that operated between two scans keeps its cache; the owner carries on after a
 * take; malloc_trim takes every quiet cache at once; a push caught between reading the count and
 * writing loses no object; a pop caught between its subtract and its head's store keeps its list,
 * and one that ends while the taker settles the list does not mislead it; and the
 * protocol holds against busy owners (three threads churning objects with checked contents,
 * pausing only briefly now and then, while scans run non-stop). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "freelist.h"
#include "internal.h"
#include "qmalloc.h"
#include "tcache_window.h"
#include "testutil.h"

static const size_t SIZES[] = {16, 48, 256, 1024, 4096};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])
#define PER_SIZE 300

static pthread_barrier_t step;      /* main and the idle worker move through the phases together */
static size_t held_when_idle;       /* bytes in the worker's cache as it went quiet */
static const char *worker_check;    /* tcache_check in the worker after its cache was taken */
static int worker_bad_contents;

static size_t bytes_in(const tcache_t *tc) {
  size_t bytes = 0;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) bytes += (size_t)list_length(&tc->lists[cls]) * sizeclass_size[cls];
  return bytes;
}

/* Allocates PER_SIZE objects of every size, writes and checks them, frees them: the cache fills. */
static int churn_all_sizes(unsigned char tag) {
  static __thread void *objs[NSIZES][PER_SIZE];
  int bad = 0;
  for (size_t s = 0; s < NSIZES; s++)
    for (int i = 0; i < PER_SIZE; i++) {
      objs[s][i] = qm_malloc(SIZES[s]);
      memset(objs[s][i], tag, SIZES[s]);
    }
  for (size_t s = 0; s < NSIZES; s++)
    for (int i = 0; i < PER_SIZE; i++) {
      unsigned char *p = objs[s][i];
      if (p[0] != tag || p[SIZES[s] - 1] != tag) bad++;
      qm_free(p);
    }
  return bad;
}

static void *idle_worker(void *unused) {
  /* The churn's frees fill the cache. A timed collection (every TCACHE_GC_MS, on a slow path) that
   * runs in the middle of them caps its lists, which a sanitized run on a loaded machine hits (under
   * checked-tsan beside a stress test, one run in three): churn again until the cache holds what
   * main's first check asks, at most 20 rounds. */
  churn_all_sizes(1);
  for (int round = 1; round < 20 && bytes_in(&tcache_self) <= 64 * 1024; round++) churn_all_sizes(1);
  held_when_idle = bytes_in(&tcache_self);
  pthread_barrier_wait(&step); /* 1: quiet now */
  pthread_barrier_wait(&step); /* 2: main took the cache */
  worker_bad_contents = churn_all_sizes(2);
  tcache_t *tc = tcache_open();
  worker_check = tcache_check(tc);
  tcache_close(tc);
  held_when_idle = bytes_in(&tcache_self);
  pthread_barrier_wait(&step); /* 3: refilled and quiet again */
  pthread_barrier_wait(&step); /* 4: main saw it once */
  qm_free(qm_malloc(200));     /* one operation between two scans */
  pthread_barrier_wait(&step); /* 5 */
  pthread_barrier_wait(&step); /* 6: done */
  return NULL;
}

static void test_idle_thread(void) {
  pthread_barrier_init(&step, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, idle_worker, NULL);
  pthread_barrier_wait(&step); /* 1 */
  CHECK(held_when_idle > 64 * 1024);

  tcache_totals_t before, after;
  tcache_thread_stats_t rows[8];
  stats_snapshot_t s_before, s_after;
  tcache_totals(&before, NULL, rows, 8);
  stats_snapshot(&s_before);
  CHECK_EQ(tcache_reclaim_idle(false), 0);              /* first sight: nothing is idle yet */
  CHECK_EQ(tcache_reclaim_idle(false), held_when_idle); /* unchanged since: all of it */
  CHECK_EQ(tcache_reclaim_idle(false), 0);              /* nothing left */
  tcache_totals(&after, NULL, rows, 8);
  stats_snapshot(&s_after);
  CHECK_EQ(after.reclaims, before.reclaims + 1);
  CHECK_EQ(after.reclaimed_bytes, before.reclaimed_bytes + held_when_idle);
  CHECK_EQ(after.bytes, before.bytes - held_when_idle);
  CHECK_EQ(s_before.thread_caches - s_after.thread_caches, held_when_idle);
  CHECK_EQ(s_after.idle_reclaimed_bytes - s_before.idle_reclaimed_bytes, held_when_idle);
  /* Its budget went back to the unclaimed total, down to the minimum. */
  size_t found_min_budget = 0;
  for (size_t i = 0; i < after.threads && i < 8; i++)
    if (rows[i].reclaims == 1 && rows[i].budget == TCACHE_STEAL_STEP && rows[i].bytes == 0) found_min_budget++;
  CHECK_EQ(found_min_budget, 1);
  CHECK(after.unclaimed > before.unclaimed);

  pthread_barrier_wait(&step); /* 2: the worker carries on with what was left */
  pthread_barrier_wait(&step); /* 3 */
  CHECK_EQ(worker_bad_contents, 0);
  CHECK_MSG(worker_check == NULL, "worker's cache after a take: %s", worker_check ? worker_check : "");
  CHECK(held_when_idle > 0);

  /* One operation between two scans keeps the cache; the next quiet interval loses it. */
  tcache_reclaim_idle(false);  /* sees it */
  pthread_barrier_wait(&step); /* 4 */
  pthread_barrier_wait(&step); /* 5: it operated once */
  CHECK_EQ(tcache_reclaim_idle(false), 0);
  CHECK(tcache_reclaim_idle(false) > 0);
  pthread_barrier_wait(&step); /* 6 */
  pthread_join(t, NULL);
}

/* malloc_trim: every other quiet cache at once, no earlier sighting needed. */
static pthread_barrier_t trim_step;
static void *trim_worker(void *unused) {
  churn_all_sizes(3);
  pthread_barrier_wait(&trim_step);
  pthread_barrier_wait(&trim_step);
  return NULL;
}

static void test_trim(void) {
  pthread_barrier_init(&trim_step, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, trim_worker, NULL);
  pthread_barrier_wait(&trim_step);
  tcache_totals_t before, after;
  tcache_totals(&before, NULL, NULL, 0);
  CHECK(before.bytes > 64 * 1024);
  qm_trim(0);
  tcache_totals(&after, NULL, NULL, 0);
  CHECK_EQ(after.bytes, 0); /* the worker's went back, and the trimming thread flushed its own */
  CHECK_EQ(after.reclaims, before.reclaims + 1);
  pthread_barrier_wait(&trim_step);
  pthread_join(t, NULL);
}

/* A push in flight: free's fast path read the count before the taker stopped the list, and does
 * the rest after (tcache_window.h). The worker runs free_push's steps by hand, stopping where a
 * preemption could: `when` = 0 reads the head before the take and links after it, 1 reads and
 * links after it, 2 links before it and adds to the count after. The object must end up free
 * (in no thread's hands, counted as free by the central lists) and the cache consistent. */
static pthread_barrier_t flight_step;
static int flight_would_push;
static const char *flight_check;

static void *flight_worker(void *arg) {
  int when = (int)(size_t)arg;
  churn_all_sizes(4);
  void *obj = qm_malloc(256);
  tcache_list_t *list = &tcache_self.lists[sizeclass_of(256)];
  uint16_t count = __atomic_load_n(&list->count, __ATOMIC_RELAXED);
  void *head = list->head;
  flight_would_push = count < list->max_count && head != obj;
  if (when == 2) {
    freelist_mark(obj, head, freelist_key(obj));
    list->head = obj;
  }
  pthread_barrier_wait(&flight_step); /* 1: main takes the cache */
  pthread_barrier_wait(&flight_step); /* 2: taken */
  if (when == 1) head = list->head;
  if (when != 2) {
    freelist_mark(obj, head, freelist_key(obj));
    list->head = obj;
  }
  list_end_push(list_as_fast(list));
  qm_free(qm_malloc(256)); /* the next slow path repairs the list */
  tcache_t *tc = tcache_open();
  flight_check = tcache_check(tc);
  tcache_close(tc);
  return NULL;
}

static void test_push_in_flight(int when) {
  unsigned cls = sizeclass_of(256);
  stats_snapshot_t s_before, s_after;
  stats_snapshot(&s_before);
  tcache_totals_t before, after;
  tcache_totals(&before, NULL, NULL, 0);
  pthread_barrier_init(&flight_step, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, flight_worker, (void *)(size_t)when);
  pthread_barrier_wait(&flight_step); /* 1 */
  CHECK(tcache_reclaim_idle(true) > 0);
  pthread_barrier_wait(&flight_step); /* 2 */
  pthread_join(t, NULL);
  tcache_totals(&after, NULL, NULL, 0);
  stats_snapshot(&s_after);
  CHECK(flight_would_push);
  CHECK_EQ(after.reclaims, before.reclaims + 1);
  CHECK_MSG(flight_check == NULL, "push in flight (%d): %s", when, flight_check ? flight_check : "");
  /* The worker exited having freed all it allocated: nothing of the class is in use any more. */
  CHECK_MSG(s_after.class_in_use[cls] == s_before.class_in_use[cls], "push in flight (%d): %zu in use, %zu before",
            when, s_after.class_in_use[cls], s_before.class_in_use[cls]);
}

/* A pop in flight: malloc's fast path counted its object out (list_begin_pop) before the taker
 * came, and stores the next head after it (tcache_window.h). `ends_between` = 0: the pop is still
 * in flight when the taker walks the list, whose chain is then one object longer than its count:
 * the taker takes the owner's other lists and leaves that one, stopped, to the owner. 1: the pop
 * ends between the taker's first read of the list (head and link) and its last barrier, and the
 * program writes over the object at once, as a caller of malloc may: the taker must walk from the
 * new head, not from the link it read before, and takes the list. Either way the pop hands its
 * object out once, the cache is consistent after the owner's repair, and every object is
 * accounted for. */
static pthread_barrier_t pop_step;
/* What the worker saw, checked by the main thread: the list's length before the pop and once the
 * owner repaired it, its head then, and the object after the popped one. */
static struct {
  bool began;
  uint32_t length_before, length_after;
  void *obj, *next, *head_after;
  const char *check; /* tcache_check at the end */
} pop;
static tcache_list_t *pop_list;

static void pop_end(void) {
  pop_list->head = freelist_take(pop.obj);
  memset(pop.obj, 0x5a, 256); /* the program's first write: the link read before is gone */
}

/* The settle hook (main thread, inside the scan): the worker's pop ends here. */
static void pop_end_in_scan(void) {
  pthread_barrier_wait(&pop_step); /* 2: the worker ends its pop */
  pthread_barrier_wait(&pop_step); /* 3: ended */
}

static void *pop_worker(void *arg) {
  int ends_between = (int)(size_t)arg;
  churn_all_sizes(5);
  pop_list = &tcache_self.lists[sizeclass_of(256)];
  pop.length_before = list_length(pop_list);
  pop.obj = pop_list->head;
  pop.next = pop.length_before > 1 ? freelist_next(pop.obj) : NULL;
  pop.began = pop.length_before > 1 && list_begin_pop(list_as_fast(pop_list));
  pthread_barrier_wait(&pop_step); /* 1: main takes the cache */
  if (ends_between) {
    pthread_barrier_wait(&pop_step); /* 2: main read the heads and waits in its scan */
    if (pop.began) pop_end();
    pthread_barrier_wait(&pop_step); /* 3 */
  }
  pthread_barrier_wait(&pop_step); /* 4: the scan is over */
  if (!pop.began) return NULL;
  if (!ends_between) pop_end();
  tcache_t *tc = tcache_open(); /* stopped: waits for the taker, repairs the lists */
  tcache_close(tc);
  pop.length_after = list_length(pop_list);
  pop.head_after = pop_list->head;
  qm_free(pop.obj);
  qm_free(qm_malloc(48));
  tc = tcache_open();
  pop.check = tcache_check(tc);
  tcache_close(tc);
  return NULL;
}

static void test_pop_in_flight(int ends_between) {
  unsigned cls = sizeclass_of(256);
  stats_snapshot_t s_before, s_after;
  stats_snapshot(&s_before);
  memset(&pop, 0, sizeof pop);
  pthread_barrier_init(&pop_step, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, pop_worker, (void *)(size_t)ends_between);
  pthread_barrier_wait(&pop_step); /* 1 */
  if (ends_between) tcache_test_settle_hook = pop_end_in_scan;
  size_t taken = tcache_reclaim_idle(true);
  tcache_test_settle_hook = NULL;
  pthread_barrier_wait(&pop_step); /* 4 */
  pthread_join(t, NULL);
  stats_snapshot(&s_after);
  CHECK_MSG(pop.began, "pop in flight (%d): the list held %u objects", ends_between, pop.length_before);
  CHECK_MSG(taken > 0, "pop in flight (%d): nothing taken", ends_between); /* the worker's other lists */
  if (ends_between) { /* the pop had ended: the list was taken, and the repair left it empty */
    CHECK_MSG(pop.length_after == 0 && pop.head_after == NULL, "pop ended in the scan: the list was left (%u objects)",
              pop.length_after);
  } else { /* left to the owner: one object fewer, the popped one's next at its head */
    CHECK_MSG(pop.length_after == pop.length_before - 1 && pop.head_after == pop.next,
              "pop in flight: the list was taken or changed under it (%u objects, %u before)", pop.length_after,
              pop.length_before);
  }
  CHECK_MSG(pop.check == NULL, "pop in flight (%d): %s", ends_between, pop.check ? pop.check : "");
  CHECK_MSG(s_after.class_in_use[cls] == s_before.class_in_use[cls], "pop in flight (%d): %zu in use, %zu before",
            ends_between, s_after.class_in_use[cls], s_before.class_in_use[cls]);
}

/* The race: owners that churn with only brief pauses, a taker that never stops. Each live object carries its owner,
 * slot and serial in its first and last words; one object handed out twice, or a list corrupted by
 * a take that overlapped an operation, shows as a mismatch or a crash. */
#define RACERS 3
#define SLOTS 64
/* Operations per racer: 3,000,000, or at least QM_TEST_RACE_OPS (tools/checked_build.sh's
 * ThreadSanitizer build, where each costs ten times as much, passes fewer) and then on, up to
 * 3,000,000, until the taker has taken more than 10 caches. */
#define RACE_OPS_MAX 3000000
#define RACE_TAKES_WANTED 10
/* Every RACE_PAUSE_EVERY operations a racer sleeps RACE_PAUSE_NS between two of them. A take needs
 * its owner out of every slow path from the stop to the membarrier's return, and three racers that
 * never pause gave the taker that window too rarely under load: 9 takes in 3,000,000 operations a
 * racer (the checked-debug build, in CI), where the test asks for more than 10. A sleeping racer's
 * cache is taken at the taker's next scan, while the other two keep racing it. */
#define RACE_PAUSE_EVERY 16384
#define RACE_PAUSE_NS 200000
static uint64_t race_ops = RACE_OPS_MAX;
static int race_enough_takes;
static volatile int racers_running;
static int race_bad[RACERS];
static const char *race_check[RACERS];

static void *racer(void *arg) {
  size_t id = (size_t)arg;
  struct slot { uint64_t *p; size_t words; uint64_t stamp; } live[SLOTS] = {{0}};
  uint64_t rng = 0x9e3779b97f4a7c15ull * (id + 1);
  for (uint64_t op = 0; op < race_ops || (op < RACE_OPS_MAX && !__atomic_load_n(&race_enough_takes, __ATOMIC_RELAXED));
       op++) {
    if (op % RACE_PAUSE_EVERY == RACE_PAUSE_EVERY - 1) nanosleep(&(struct timespec){0, RACE_PAUSE_NS}, NULL);
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    struct slot *s = &live[rng % SLOTS];
    if (s->p) {
      if (s->p[0] != s->stamp || s->p[s->words - 1] != s->stamp) race_bad[id]++;
      qm_free(s->p);
      s->p = NULL;
    } else {
      size_t bytes = 16 << ((rng >> 8) % 8); /* 16 .. 2048 */
      s->words = bytes / 8;
      s->p = qm_malloc(bytes);
      s->stamp = (id << 56) | ((uint64_t)(s - live) << 48) | op;
      s->p[0] = s->p[s->words - 1] = s->stamp;
    }
  }
  for (int i = 0; i < SLOTS; i++) qm_free(live[i].p);
  tcache_t *tc = tcache_open();
  race_check[id] = tcache_check(tc);
  tcache_close(tc);
  __atomic_fetch_sub(&racers_running, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void test_race(void) {
  const char *ops = getenv("QM_TEST_RACE_OPS");
  if (ops != NULL) {
    char *end;
    unsigned long long v = strtoull(ops, &end, 10);
    if (*ops < '0' || *ops > '9' || *end != '\0' || v < 1000 || v > RACE_OPS_MAX) {
      fprintf(stderr, "unit-reclaim: QM_TEST_RACE_OPS must be an integer in [1000, %d], got '%s'\n", RACE_OPS_MAX, ops);
      exit(2);
    }
    race_ops = v;
  }
  tcache_totals_t before, after;
  tcache_totals(&before, NULL, NULL, 0);
  pthread_t ts[RACERS];
  racers_running = RACERS;
  for (size_t i = 0; i < RACERS; i++) pthread_create(&ts[i], NULL, racer, (void *)i);
  uint64_t scans = 0;
  while (__atomic_load_n(&racers_running, __ATOMIC_ACQUIRE) > 0) {
    tcache_reclaim_idle(scans % 2 == 0); /* alternately everyone and the idle ones only */
    if (++scans % 64 == 0) {
      tcache_totals(&after, NULL, NULL, 0);
      if (after.reclaims - before.reclaims > RACE_TAKES_WANTED) __atomic_store_n(&race_enough_takes, 1, __ATOMIC_RELAXED);
    }
  }
  for (size_t i = 0; i < RACERS; i++) pthread_join(ts[i], NULL);
  tcache_totals(&after, NULL, NULL, 0);
  for (size_t i = 0; i < RACERS; i++) {
    CHECK_EQ(race_bad[i], 0);
    CHECK_MSG(race_check[i] == NULL, "racer %zu: %s", i, race_check[i] ? race_check[i] : "");
  }
  /* The stress did take caches in the middle of the churn (else it proved nothing). */
  CHECK_MSG(after.reclaims - before.reclaims > RACE_TAKES_WANTED, "%llu takes in %llu scans",
            (unsigned long long)(after.reclaims - before.reclaims), (unsigned long long)scans);
  printf("race: %llu takes in %llu scans, at least %llu operations per racer\n",
         (unsigned long long)(after.reclaims - before.reclaims), (unsigned long long)scans,
         (unsigned long long)race_ops);
}

int main(void) {
  qm_free(qm_malloc(16));
  if (!tcache_reclaim_available()) {
    fprintf(stderr, "membarrier(2) is not available here: nothing to test\n");
    return 1;
  }
  test_idle_thread();
  test_trim();
  for (int when = 0; when < 3; when++) test_push_in_flight(when);
  test_pop_in_flight(0);
  test_pop_in_flight(1);
  test_race();
  return tu_summary("reclaim");
}
