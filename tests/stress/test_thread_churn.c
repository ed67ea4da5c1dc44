/* Short-lived threads (10,000 by default, 5,000 with --smoke), run in waves of 16: each allocates
 * 200 small and medium objects, writes them, frees most itself, and leaves 16 in a shared handoff
 * ring for later threads to free (so memory of exited threads is freed by threads that never saw
 * its owner). Every object is pattern-checked before it is freed.
 *
 * The resident set size after the last wave must stay within 64 MiB of the RSS measured after the
 * first 64 threads (warm-up: first spans of each class, page-map nodes, glibc's thread-stack cache).
 * Why that bound separates a correct allocator from a leaking one: at any moment the live data is
 * the ring (1024 objects, ~2 MiB) plus 16 running threads' objects (~7 MiB); a thread allocates
 * ~440 KiB in all and frees ~420 KiB of it, so an allocator that strands an exited thread's cache,
 * or never reuses memory a dead thread freed, leaks on the order of that per thread: even 64 KiB
 * per thread is over 300 MiB across the 5,000 threads of --smoke. A per-thread metadata leak of 16 KiB
 * (a thread cache that is never recycled) costs 78 MiB over 5,000 threads and shows too.
 *
 * usage: stress_thread_churn [--smoke] [--threads N] */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "testutil.h"

#define WAVE 16
#define PER_THREAD 200
#define HANDOFF_PER_THREAD 16
#define RING 1024
#define WARMUP_THREADS 64
#define RSS_BOUND (64u << 20)

typedef struct {
  void *p;
  size_t size;
  uint64_t seed;
} object_t;

static object_t ring[RING];
static size_t ring_next;
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_long corrupt, failed_allocs;

static void check_and_free(object_t *o) {
  long bad = tu_verify(o->p, o->size, o->seed);
  if (bad >= 0 && atomic_fetch_add(&corrupt, 1) < 10)
    fprintf(stderr, "FAIL object %p of %zu bytes corrupt at offset %ld\n", o->p, o->size, bad);
  free(o->p);
  o->p = NULL;
}

static void *short_lived(void *arg) {
  uint64_t rng = 0xc0ffee00ull + (uint64_t)(uintptr_t)arg;
  object_t mine[PER_THREAD];
  for (int i = 0; i < PER_THREAD; i++) {
    uint64_t r = tu_rand(&rng);
    mine[i].size = (r % 10 == 0) ? 1024 + (r >> 8) % 31744 : 16 + (r >> 8) % 1009;
    mine[i].seed = r;
    mine[i].p = malloc(mine[i].size);
    if (!mine[i].p) {
      atomic_fetch_add(&failed_allocs, 1);
      continue;
    }
    tu_fill(mine[i].p, mine[i].size, r);
  }
  /* hand the first few over, taking out (and freeing) whatever an earlier thread left there */
  pthread_mutex_lock(&ring_lock);
  for (int i = 0; i < HANDOFF_PER_THREAD; i++) {
    object_t *slot = &ring[ring_next++ % RING];
    if (slot->p) check_and_free(slot);
    *slot = mine[i];
    mine[i].p = NULL;
  }
  pthread_mutex_unlock(&ring_lock);
  for (int i = PER_THREAD - 1; i >= 0; i--)
    if (mine[i].p) check_and_free(&mine[i]);
  return NULL;
}

int main(int argc, char **argv) {
  long n_threads = 10000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--smoke")) {
      n_threads = 5000;
    } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      char *end;
      errno = 0;
      n_threads = strtol(argv[++i], &end, 10);
      if (errno || *end || n_threads < WARMUP_THREADS + WAVE || n_threads > 10000000) {
        fprintf(stderr, "thread_churn: --threads needs an integer in [%d, 10000000], got '%s'\n",
                WARMUP_THREADS + WAVE, argv[i]);
        return 2;
      }
    } else {
      fprintf(stderr, "thread_churn: unknown argument '%s' (expected --smoke or --threads N)\n", argv[i]);
      return 2;
    }
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256u << 10);
  size_t rss_start = tu_rss_bytes(), rss_warm = 0;
  long created = 0;
  for (long base = 0; base < n_threads; base += WAVE) {
    pthread_t t[WAVE];
    int n = 0;
    for (int i = 0; i < WAVE && base + i < n_threads; i++)
      if (pthread_create(&t[n], &attr, short_lived, (void *)(intptr_t)(base + i)) == 0) n++;
    created += n;
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    if (base + WAVE == WARMUP_THREADS) rss_warm = tu_rss_bytes();
  }
  size_t rss_end = tu_rss_bytes();
  printf("thread_churn: %ld threads; RSS start %zu KiB, after %d threads %zu KiB, end %zu KiB (bound +%u KiB)\n",
         created, rss_start >> 10, WARMUP_THREADS, rss_warm >> 10, rss_end >> 10, RSS_BOUND >> 10);
  CHECK_EQ(created, n_threads);
  CHECK_MSG(rss_warm > 0 && rss_end > 0, "could not read /proc/self/statm");
  /* Under qemu-user (tests/cross sets QM_TEST_EMULATOR) the RSS is the emulator's, which itself
   * keeps about 300 KiB per thread ever created, with the C library's malloc too: no bound on it
   * says anything about ours. */
  if (getenv("QM_TEST_EMULATOR") != NULL)
    printf("thread_churn: note: RSS bound not checked: the emulator's own memory grows with every thread\n");
  else
    CHECK_MSG(rss_end < rss_warm + RSS_BOUND, "RSS grew by %zu KiB over %ld short-lived threads (bound %u KiB)",
              (rss_end - rss_warm) >> 10, created - WARMUP_THREADS, RSS_BOUND >> 10);
  CHECK_MSG(atomic_load(&corrupt) == 0, "%ld corrupt objects", atomic_load(&corrupt));
  CHECK_MSG(atomic_load(&failed_allocs) == 0, "%ld allocations returned NULL", atomic_load(&failed_allocs));
  for (int i = 0; i < RING; i++)
    if (ring[i].p) check_and_free(&ring[i]);
  return tu_summary("stress-thread_churn");
}
