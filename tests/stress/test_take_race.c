/* Taking back thread caches while their owners run (src/tcache_window.h): worker threads stay on
 * the fast paths (pairs and short bursts of malloc and free of a few small sizes, so that their
 * caches serve nearly every call) while another thread calls malloc_trim(0) in a loop, which takes
 * every other thread's cache that is not inside a slow path at that moment: the lists of a thread
 * that may be in the middle of a pop or a push, the case the protocol's stops, membarrier(2) calls
 * and chain walks exist for. unit-reclaim stops one pop and one push by hand at each point; this
 * runs the real interleavings, millions of operations against thousands of takes, on more threads
 * than cores so that owners are preempted anywhere in their pops and pushes, in three rounds of
 * threads, so that threads also end (handing their caches over) and start while takes run. The
 * first worker of each round forks now and then: the child checks its copy of that worker's
 * objects, allocates and frees on its own and trims, and must exit 0 (a fork that fell inside a
 * take must leave the child a cache it can use: a lock the taker held, never released there,
 * hangs it, and ctest's timeout reports that).
 *
 * A take that got it wrong hands one block to two owners (an object popped in flight also sent to
 * the central list), or loses the link of a chain: every object is filled with a pattern of its
 * owner and sequence number and checked before it is freed, and each worker keeps a few objects
 * for thousands of operations, checked now and then, so that a block handed out twice shows as a
 * byte of another owner (reported with the thread, size and offset); a damaged list stops the
 * process in qmalloc's own checks. The test also requires that takes happened (the statistics'
 * idle_reclaims), so that it cannot pass without exercising them.
 *
 * usage: stress_take_race [--smoke] [--threads N] [--ops N] */
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qmalloc.h"
#include "testutil.h"

#define KEEP 8    /* long-lived objects per worker */
#define BURST 24  /* at most this many objects live in a burst */
#define ROUNDS 3  /* of n_threads workers each, one after the other, each doing n_ops operations */
#define FORK_EVERY 10000 /* operations between the forks of a round's first worker */

static const size_t sizes[] = {16, 24, 48, 64, 100, 128, 256, 512, 1000, 2048, 4000, 8192};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static int n_threads = 8;
static long n_ops = 300000;
static atomic_int workers_left;
static atomic_long corrupt_objects, trims, forks, bad_children;

typedef struct {
  void *p;
  size_t size;
  uint64_t tag; /* owner << 48 | sequence: the seed of its fill pattern (testutil.h) */
} object_t;

static void verify(int thread, const object_t *o, const char *when) {
  long at = tu_verify(o->p, o->size, o->tag);
  if (at >= 0 && atomic_fetch_add(&corrupt_objects, 1) < 10)
    fprintf(stderr, "thread %d: object %p of %zu bytes (%s) lost its pattern at byte %ld\n", thread, (void *)o->p,
            o->size, when, at);
}

static int make(object_t *o, size_t size, uint64_t tag) {
  o->p = malloc(size);
  if (o->p == NULL) return 0;
  o->size = size;
  o->tag = tag;
  tu_fill(o->p, size, tag);
  return 1;
}

/* One step of a worker: a pair or a burst, and now and then a check of the kept objects and the
 * renewal of one. Returns the calls it made. */
static long step(int id, uint64_t *rng, uint64_t *seq, object_t keep[KEEP]) {
  uint64_t r = tu_rand(rng);
  size_t size = sizes[r % NSIZES];
  long calls;
  if ((r >> 8) % 4 != 0) { /* a pair: the list's head and count end where they began */
    object_t o;
    if (!make(&o, size, ((uint64_t)id << 48) | ++*seq)) abort();
    verify(id, &o, "pair");
    free(o.p);
    calls = 2;
  } else { /* a burst, freed in another order */
    object_t burst[BURST];
    int n = 1 + (int)((r >> 16) % BURST);
    for (int i = 0; i < n; i++)
      if (!make(&burst[i], sizes[(r >> (20 + i % 40)) % NSIZES], ((uint64_t)id << 48) | ++*seq)) abort();
    for (int i = n - 1; i >= 0; i--) /* the odd ones last first, then the even ones first first */
      if (i % 2 == 1) verify(id, &burst[i], "burst"), free(burst[i].p);
    for (int i = 0; i < n; i++)
      if (i % 2 == 0) verify(id, &burst[i], "burst"), free(burst[i].p);
    calls = 2 * n;
  }
  if ((r >> 40) % 512 == 0) { /* now and then: check the long-lived ones, and renew one */
    for (int k = 0; k < KEEP; k++) verify(id, &keep[k], "kept");
    int k = (int)((r >> 50) % KEEP);
    free(keep[k].p);
    if (!make(&keep[k], size, ((uint64_t)id << 48) | ++*seq)) abort();
  }
  return calls;
}

/* The child of a fork made while the others run and caches are taken: its copy of the forking
 * worker's objects must be intact, and its heap usable (its lists may have been stopped by a take
 * in flight when the parent forked). Exits 0 if every check passed. */
static void forked_child(int id, uint64_t rng, uint64_t seq, object_t keep[KEEP]) {
  long bad = atomic_load(&corrupt_objects);
  for (int k = 0; k < KEEP; k++) verify(id, &keep[k], "kept, in a forked child");
  for (long calls = 0; calls < 20000;) calls += step(id, &rng, &seq, keep);
  malloc_trim(0);
  for (int k = 0; k < KEEP; k++) verify(id, &keep[k], "kept, in a forked child"), free(keep[k].p);
  _exit(atomic_load(&corrupt_objects) == bad ? 0 : 1);
}

static void *worker_main(void *arg) {
  int id = (int)(intptr_t)arg;
  uint64_t rng = 0x2545f4914f6cdd1dull * (uint64_t)(id + 1), seq = 0;
  object_t keep[KEEP];
  for (int k = 0; k < KEEP; k++)
    if (!make(&keep[k], sizes[k % NSIZES], ((uint64_t)id << 48) | ++seq)) abort();
  long next_fork = id % n_threads == 0 ? FORK_EVERY : LONG_MAX; /* the first worker of a round forks */
  for (long op = 0; op < n_ops;) {
    op += step(id, &rng, &seq, keep);
    if (op >= next_fork) {
      next_fork += FORK_EVERY;
      pid_t child = fork();
      if (child == 0) forked_child(id, rng, seq, keep);
      int status = 0;
      if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "thread %d: a forked child failed (fork %d, status %#x)\n", id, (int)child, status);
        atomic_fetch_add(&bad_children, 1);
      }
      atomic_fetch_add(&forks, 1);
    }
  }
  for (int k = 0; k < KEEP; k++) verify(id, &keep[k], "kept, at the end"), free(keep[k].p);
  atomic_fetch_sub(&workers_left, 1);
  return NULL;
}

static void *trimmer_main(void *arg) {
  (void)arg;
  while (atomic_load(&workers_left) > 0) {
    malloc_trim(0);
    atomic_fetch_add(&trims, 1);
  }
  return NULL;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *value = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(argv[i], "--smoke") == 0) {
      n_threads = 6, n_ops = 100000;
    } else if (strcmp(argv[i], "--threads") == 0) {
      n_threads = (int)tu_parse_long("take_race", "--threads", value, 1, 256), i++;
    } else if (strcmp(argv[i], "--ops") == 0) {
      n_ops = tu_parse_long("take_race", "--ops", value, 1, 1000000000), i++;
    } else {
      fprintf(stderr, "take_race: unknown argument '%s' (expected --smoke, --threads N, --ops N)\n", argv[i]);
      return 2;
    }
  }
  long long reclaims_before = tu_stats_field("idle_reclaims");
  pthread_t workers[256], trimmer;
  atomic_store(&workers_left, n_threads * ROUNDS);
  CHECK(pthread_create(&trimmer, NULL, trimmer_main, NULL) == 0);
  for (int round = 0; round < ROUNDS; round++) { /* threads end and start while caches are taken */
    for (int t = 0; t < n_threads; t++)
      CHECK(pthread_create(&workers[t], NULL, worker_main, (void *)(intptr_t)(round * n_threads + t)) == 0);
    for (int t = 0; t < n_threads; t++) pthread_join(workers[t], NULL);
  }
  pthread_join(trimmer, NULL);
  long long reclaims = tu_stats_field("idle_reclaims") - reclaims_before;
  printf("take_race: %d rounds of %d threads, %ld operations each thread, %ld trims, %lld caches taken, %ld forks\n",
         ROUNDS, n_threads, n_ops,
         atomic_load(&trims), reclaims, atomic_load(&forks));
  CHECK_EQ(atomic_load(&corrupt_objects), 0);
  CHECK_EQ(atomic_load(&bad_children), 0);
  CHECK_MSG(atomic_load(&forks) >= ROUNDS * (n_ops / FORK_EVERY), "only %ld forks", atomic_load(&forks));
  /* Takes need membarrier(2) (tcache_reclaim_available); on a kernel without it there are none. */
  CHECK_MSG(reclaims >= 10, "only %lld caches were taken while their owners ran", reclaims);
  return tu_summary("take_race");
}
