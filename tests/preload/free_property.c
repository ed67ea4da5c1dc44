/* The property test of the free checks (issue 12): random malloc/free/realloc sequences from
 * several threads, with one double or invalid free injected at a random moment, must always be
 * stopped, and no block may ever be handed to two owners.
 *
 * usage: free_property SEED
 * Four threads run random operations on blocks of every kind (small, medium >= 16 KiB, large
 * >= 1 MiB; malloc, calloc, realloc, free, frees of another thread's blocks). Every live block
 * carries its owner's stamp (a serial number at both ends), checked before each free and realloc:
 * a stamp that changed means the block had two owners ("two owners" on stdout, exit 3).
 * At a random operation of the random phase, thread 0 parks the other threads at a barrier (so
 * that nothing can reuse a block between its choice and the bug) and makes one mistake, chosen by
 * the seed:
 *   double_delayed      free of a block freed at any earlier time, by any thread (a remote free
 *                       included), that no thread owns now;
 *   double_interleaved  free(p); free(q); free(p) of its own blocks;
 *   interior            free(p + 8) of a live block;
 *   realloc_freed       realloc of a block freed earlier, no longer owned;
 * and prints "inject KIND 0x<address> SIZE" first. If the call returns, the program prints
 * "survived" and exits 0: the test script (test_free_property.sh) requires a death by SIGABRT with
 * the one line "qmalloc: free(): double free 0x<address>" (or "invalid pointer", or realloc()'s).
 * The choice of a block that no thread owns is exact, since every thread is parked: all of them
 * register a block before its first use and unregister it before freeing it. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { THREADS = 4, SLOTS = 256, OPS = 6000, FREED_LOG = 4096 };

typedef struct {
  char *p;
  size_t size;
  uint64_t stamp;
} block_t;

static block_t slots[THREADS][SLOTS];     /* each thread's live blocks (shared: remote frees) */
static pthread_mutex_t slot_lock[THREADS]; /* a thread's slots, taken by anyone freeing one */
static struct {
  char *p;
  size_t size;
} freed_log[FREED_LOG];                    /* blocks freed, any thread, ring */
static unsigned freed_next;
static pthread_mutex_t freed_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t park;
static volatile int injecting;
static uint64_t seed;

static uint64_t next_random(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static size_t random_size(uint64_t *rng) {
  uint64_t r = next_random(rng) % 1000;
  if (r < 850) return 1 + next_random(rng) % 2048;                    /* small */
  if (r < 990) return (16u << 10) + next_random(rng) % (240u << 10);  /* medium */
  return (1u << 20) + next_random(rng) % (2u << 20);                  /* large */
}

static size_t stamp_bytes(const block_t *b) { return b->size < sizeof b->stamp ? b->size : sizeof b->stamp; }

static void stamp(block_t *b) {
  memcpy(b->p, &b->stamp, stamp_bytes(b));
  if (b->size > sizeof b->stamp) b->p[b->size - 1] = (char)(b->stamp >> 3);
}

static void check_stamp(const block_t *b) {
  if (memcmp(b->p, &b->stamp, stamp_bytes(b)) != 0 ||
      (b->size > sizeof b->stamp && b->p[b->size - 1] != (char)(b->stamp >> 3))) {
    printf("two owners: block %p of %zu bytes lost its stamp\n", (void *)b->p, b->size);
    fflush(stdout);
    _exit(3);
  }
}

static void log_freed(char *p, size_t size) {
  pthread_mutex_lock(&freed_lock);
  freed_log[freed_next % FREED_LOG].p = p;
  freed_log[freed_next % FREED_LOG].size = size;
  freed_next++;
  pthread_mutex_unlock(&freed_lock);
}

/* Whether p is the start of a block some thread owns (every other thread is parked). */
static int owned(const char *p) {
  for (int t = 0; t < THREADS; t++)
    for (int i = 0; i < SLOTS; i++)
      if (slots[t][i].p == p) return 1;
  return 0;
}

static void announce(const char *kind, const void *p, size_t size) {
  printf("inject %s %p %zu\n", kind, p, size);
  fflush(stdout);
}

/* Thread 0, with the others parked: one mistake, chosen by the seed. */
static void inject(uint64_t *rng) {
  static const char *const kinds[] = {"double_delayed", "double_interleaved", "interior", "realloc_freed"};
  int kind = (int)(seed % 4);
  if (kind == 0 || kind == 3) {
    for (unsigned tries = 0; tries < 4 * FREED_LOG; tries++) {
      unsigned n = freed_next < FREED_LOG ? freed_next : FREED_LOG;
      if (n == 0) break;
      unsigned i = (unsigned)(next_random(rng) % n);
      char *p = freed_log[i].p;
      if (p == NULL || owned(p)) continue;
      announce(kinds[kind], p, freed_log[i].size);
      if (kind == 0) free(p);
      else free(realloc(p, 100));
      return;
    }
    kind = 1; /* nothing freed yet that nobody owns: unlikely; inject another mistake */
  }
  block_t *mine = slots[0];
  int a = -1, b = -1;
  for (int i = 0; i < SLOTS; i++)
    if (mine[i].p) {
      if (a < 0) a = i;
      else if (b < 0) b = i;
    }
  if (a < 0 || b < 0) {
    mine[0].size = 64;
    mine[0].p = malloc(64);
    mine[1].size = 64;
    mine[1].p = malloc(64);
    a = 0, b = 1;
  }
  char *p = mine[a].p, *q = mine[b].p;
  if (kind == 1) {
    announce(kinds[1], p, mine[a].size);
    free(p);
    free(q);
    free(p);
  } else {
    announce(kinds[2], p + 8, mine[a].size);
    free(p + 8);
  }
}

static void *worker(void *arg) {
  int self = (int)(intptr_t)arg;
  uint64_t rng = seed * 0x9E3779B97F4A7C15ull + (uint64_t)self * 0xBF58476D1CE4E5B9ull + 1;
  uint64_t serial = (uint64_t)self << 56;
  int inject_at = self == 0 ? (int)(OPS / 4 + next_random(&rng) % (OPS / 2)) : -1;
  for (int op = 0;; op++) {
    if (self == 0 && op == inject_at) {
      injecting = 1;
      pthread_barrier_wait(&park);
      inject(&rng);
      printf("survived\n");
      fflush(stdout);
      _exit(0);
    }
    if (injecting) {
      pthread_barrier_wait(&park);
      for (;;) pause(); /* thread 0 ends the process */
    }
    uint64_t r = next_random(&rng);
    int t = (r % 8 == 0) ? (int)(next_random(&rng) % THREADS) : self; /* sometimes another's block */
    int i = (int)(next_random(&rng) % SLOTS);
    pthread_mutex_lock(&slot_lock[t]);
    block_t *b = &slots[t][i];
    if (b->p != NULL) {
      check_stamp(b);
      if (t == self && r % 3 == 0) { /* realloc keeps it ours */
        size_t size = random_size(&rng);
        char *old = b->p;
        char *p = realloc(old, size);
        if (p != NULL) {
          if (p != old) log_freed(old, b->size);
          b->p = p;
          b->size = size;
          b->stamp = ++serial;
          stamp(b);
        }
      } else {
        char *p = b->p;
        size_t size = b->size;
        b->p = NULL;
        free(p); /* unregistered first: a parked check never sees it owned and freed */
        log_freed(p, size);
      }
    } else if (t == self) {
      size_t size = random_size(&rng);
      char *p = r % 5 == 0 ? calloc(1, size) : malloc(size);
      if (p != NULL) {
        b->size = size;
        b->stamp = ++serial;
        b->p = p;
        stamp(b);
      }
    }
    pthread_mutex_unlock(&slot_lock[t]);
  }
  return NULL;
}

static void *touch(void *unused) {
  free(malloc(64));
  return unused;
}

/* qmalloc starts its background releaser lazily, on a slow path once a second thread has a cache or
 * the page heap holds 4 MiB of free pages (src/release.c), and pthread_create then allocates the new
 * thread's TLS vector with calloc (about 288 bytes): a block no worker owns. Started mid-run, it
 * could land on a freed block that the injection then picks as owned by nobody, and the "mistake"
 * would be a valid realloc of glibc's vector (seen with every block sampled, QMALLOC_PROF_SAMPLE=1,
 * where no thread needs a cache: seed 39, 1 run in 45 under load). So it starts here, before the
 * workers: a second thread's cache, then the free of an 8 MiB block, whose slow path starts it. */
static void start_background_thread(void) {
  pthread_t t;
  pthread_create(&t, NULL, touch, NULL);
  pthread_join(t, NULL);
  free(malloc(8 << 20));
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: free_property SEED\n");
    return 2;
  }
  seed = strtoull(argv[1], NULL, 10);
  /* stdout's buffer of our own: stdio would malloc one at the first printf, the injection's own
   * line, and could get the very block about to be freed again (then a valid free of stdio's
   * buffer, which no allocator can tell from the mistake). */
  static char out_buffer[4096];
  setvbuf(stdout, out_buffer, _IOFBF, sizeof out_buffer);
  start_background_thread();
  for (int t = 0; t < THREADS; t++) pthread_mutex_init(&slot_lock[t], NULL);
  pthread_barrier_init(&park, NULL, THREADS);
  pthread_t threads[THREADS];
  for (int t = 0; t < THREADS; t++) pthread_create(&threads[t], NULL, worker, (void *)(intptr_t)t);
  for (int t = 0; t < THREADS; t++) pthread_join(threads[t], NULL);
  return 1; /* not reached: thread 0 ends the process */
}
