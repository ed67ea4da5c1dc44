/* Many threads (16 in --smoke, 32 by default; far more than the 2 cores) allocating, handing over
 * and freeing objects of every size class and large sizes (0 .. 4 MiB), with realloc, calloc and
 * the aligned and sized calls in the mix. Objects move between threads through a shared array of
 * lock-protected slots: most objects are freed (or realloc'ed) by a thread other than the one that
 * allocated them. A third of the large blocks are written only in their first quarter, so that
 * their freed pages are of both kinds (written, and never touched: filed released), and the callocs
 * that reuse them check every byte. Every object carries a fill pattern derived from its own seed
 * and is verified before it is freed or realloc'ed, so two owners of one block, a stale free-list
 * link written into a live object, or a realloc that loses data all show up as a corrupt byte
 * (reported with thread, size, seed and offset). Seeds are fixed; thread interleaving is not, but
 * no check depends on it.
 *
 * With --trim, one more thread calls malloc_trim(0) every half millisecond while the workers run:
 * it takes every cache not in a slow path (src/tcache_window.h), drains the transfer caches and
 * gives every free page back, in the middle of the workers' remote frees and handovers.
 *
 * usage: stress_stress [--smoke] [--threads N] [--ops N] [--seed N] [--trim] */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "qmalloc.h"
#include "testutil.h"

void free_sized(void *ptr, size_t size);
void free_aligned_sized(void *ptr, size_t alignment, size_t size);

#define NSLOTS 4096
#define LOCAL_KEEP 64

/* How an object was allocated decides how it may be freed. */
enum how { HOW_MALLOC, HOW_CALLOC, HOW_ALIGNED };

typedef struct {
  void *p;
  size_t size;
  size_t filled; /* the bytes written with the pattern and verified: all, or a large block's first
                  * quarter, as a program that grows a buffer leaves it (its untouched pages are
                  * filed released at its free: pageheap_file_freed, and calloc trusts them) */
  size_t align; /* for HOW_ALIGNED */
  uint64_t seed;
  int how;
} object_t;

/* What of a block of `size` bytes the program writes: a large block (over 256 KiB) one time in
 * three only its first quarter. */
static size_t filled_part(size_t size, uint64_t r) { return size > (256u << 10) && r % 3 == 0 ? size / 4 : size; }

typedef struct {
  pthread_mutex_t lock;
  object_t obj;
} slot_t;

static slot_t slots[NSLOTS];
static atomic_long corrupt_objects, bad_results, trims;
static atomic_int workers_running;
static int trim_beside;
static int n_threads = 32;
static long n_ops = 50000;
static uint64_t base_seed = 20240501;

static void report_corrupt(int thread, const object_t *o, long offset, const char *when) {
  if (atomic_fetch_add(&corrupt_objects, 1) < 10)
    fprintf(stderr, "FAIL thread %d: %s: object %p of %zu bytes (seed %llu, how %d) corrupt at offset %ld\n", thread,
            when, o->p, o->size, (unsigned long long)o->seed, o->how, offset);
}

static void report_bad(int thread, const char *what, size_t size, size_t align, const void *p) {
  if (atomic_fetch_add(&bad_results, 1) < 10)
    fprintf(stderr, "FAIL thread %d: %s(size %zu, align %zu) = %p\n", thread, what, size, align, p);
}

/* Mostly small, a tail of medium, 1% large: every class gets traffic. */
static size_t pick_size(uint64_t *rng) {
  uint64_t r = tu_rand(rng), pct = r % 100, x = r >> 8;
  if (pct < 60) return x % 257;
  if (pct < 85) return 257 + x % (4096 - 257);
  if (pct < 95) return 4096 + x % (65536 - 4096);
  if (pct < 99) return 65536 + x % (262144 - 65536 + 1);
  return 262145 + x % ((4u << 20) - 262145);
}

static int verify(int thread, const object_t *o, const char *when) {
  long bad = tu_verify(o->p, o->filled, o->seed);
  if (bad >= 0) report_corrupt(thread, o, bad, when);
  return bad < 0;
}

static object_t make_object(int thread, uint64_t *rng) {
  object_t o = {0};
  uint64_t r = tu_rand(rng);
  o.size = pick_size(rng);
  o.seed = tu_rand(rng);
  switch (r % 10) {
  case 0: /* calloc: zero first */
    o.how = HOW_CALLOC;
    o.p = calloc(1, o.size);
    if (o.p) {
      const unsigned char *b = o.p;
      for (size_t i = 0; i < o.size; i++)
        if (b[i]) {
          report_bad(thread, "calloc (not zeroed)", o.size, 0, o.p);
          break;
        }
    }
    break;
  case 1: /* aligned */
    o.how = HOW_ALIGNED;
    o.align = (size_t)16 << (r / 10 % 9); /* 16 .. 4096 */
    o.p = aligned_alloc(o.align, o.size);
    if (o.p && ((uintptr_t)o.p & (o.align - 1))) report_bad(thread, "aligned_alloc (misaligned)", o.size, o.align, o.p);
    break;
  default:
    o.how = HOW_MALLOC;
    o.p = (r % 10 == 2) ? realloc(NULL, o.size) : malloc(o.size);
    break;
  }
  if (!o.p) {
    report_bad(thread, "allocation returned NULL", o.size, o.align, o.p);
    return o;
  }
  if ((uintptr_t)o.p & 15) report_bad(thread, "allocation not 16-byte aligned", o.size, o.align, o.p);
  if (malloc_usable_size(o.p) < o.size) report_bad(thread, "usable size too small", o.size, o.align, o.p);
  o.filled = filled_part(o.size, r >> 8);
  tu_fill(o.p, o.filled, o.seed);
  return o;
}

static void release(object_t *o, uint64_t r) {
  if (o->how == HOW_ALIGNED) {
    if (r & 1) free_aligned_sized(o->p, o->align, o->size);
    else free(o->p);
  } else if (r & 1) {
    free_sized(o->p, o->size);
  } else {
    free(o->p);
  }
  o->p = NULL;
}

/* realloc to a new size: the common prefix must survive; refill for the new size. */
static int resize(int thread, object_t *o, uint64_t *rng) {
  size_t new_size = pick_size(rng);
  if (new_size == 0) new_size = 1; /* realloc(p, 0) frees: not what this step is about */
  size_t keep = new_size < o->filled ? new_size : o->filled;
  void *q = realloc(o->p, new_size);
  if (!q) {
    report_bad(thread, "realloc returned NULL", new_size, 0, o->p);
    return 0;
  }
  o->p = q;
  long bad = tu_verify(q, keep, o->seed);
  if (bad >= 0) report_corrupt(thread, o, bad, "after realloc");
  if (((uintptr_t)q & 15) || malloc_usable_size(q) < new_size) report_bad(thread, "realloc result", new_size, 0, q);
  o->size = new_size;
  o->how = HOW_MALLOC; /* a realloc'ed aligned block is a plain block now */
  o->seed = tu_rand(rng);
  o->filled = filled_part(new_size, o->seed >> 8);
  tu_fill(q, o->filled, o->seed);
  return 1;
}

static object_t swap_into_slot(size_t i, object_t in) {
  pthread_mutex_lock(&slots[i].lock);
  object_t out = slots[i].obj;
  slots[i].obj = in;
  pthread_mutex_unlock(&slots[i].lock);
  return out;
}

static void *worker(void *arg) {
  int thread = (int)(intptr_t)arg;
  uint64_t rng = base_seed * 1000003 + (uint64_t)thread;
  object_t local[LOCAL_KEEP] = {{0}};
  for (long op = 0; op < n_ops; op++) {
    object_t o = make_object(thread, &rng);
    if (!o.p) continue;
    uint64_t r = tu_rand(&rng);
    object_t old = swap_into_slot(r % NSLOTS, o); /* most likely allocated by another thread */
    if (!old.p) continue;
    verify(thread, &old, "taken from a slot");
    switch ((r >> 32) % 10) {
    case 0: case 1: /* realloc it and pass it on */
      if (resize(thread, &old, &rng)) {
        object_t out = swap_into_slot((r >> 16) % NSLOTS, old);
        if (out.p) {
          verify(thread, &out, "taken from a slot after a realloc");
          release(&out, r >> 40);
        }
      }
      break;
    case 2: { /* keep it privately for a while */
      size_t k = (r >> 20) % LOCAL_KEEP;
      if (local[k].p) {
        verify(thread, &local[k], "kept locally");
        release(&local[k], r >> 41);
      }
      local[k] = old;
      break;
    }
    default:
      release(&old, r >> 42);
    }
  }
  for (int k = 0; k < LOCAL_KEEP; k++)
    if (local[k].p) {
      verify(thread, &local[k], "kept locally, at thread end");
      free(local[k].p);
    }
  return NULL;
}

static void *trimmer_main(void *arg) {
  (void)arg;
  while (atomic_load(&workers_running)) {
    malloc_trim(0);
    atomic_fetch_add(&trims, 1);
    usleep(500);
  }
  return NULL;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--smoke")) {
      n_threads = 16;
      n_ops = 12000;
    } else if (!strcmp(argv[i], "--threads")) {
      n_threads = (int)tu_parse_long("stress", "--threads", i + 1 < argc ? argv[++i] : NULL, 1, 1024);
    } else if (!strcmp(argv[i], "--ops")) {
      n_ops = tu_parse_long("stress", "--ops", i + 1 < argc ? argv[++i] : NULL, 1, 1000000000);
    } else if (!strcmp(argv[i], "--seed")) {
      base_seed = (uint64_t)tu_parse_long("stress", "--seed", i + 1 < argc ? argv[++i] : NULL, 0, 1L << 62);
    } else if (!strcmp(argv[i], "--trim")) {
      trim_beside = 1;
    } else {
      fprintf(stderr, "stress: unknown argument '%s' (expected --smoke, --threads N, --ops N, --seed N, --trim)\n", argv[i]);
      return 2;
    }
  }
  for (int i = 0; i < NSLOTS; i++) pthread_mutex_init(&slots[i].lock, NULL);
  pthread_t *t = malloc(sizeof(pthread_t) * (size_t)n_threads);
  int started = 0;
  pthread_t trimmer;
  atomic_store(&workers_running, 1);
  long long taken_before = tu_stats_field("idle_reclaims");
  if (trim_beside) CHECK(pthread_create(&trimmer, NULL, trimmer_main, NULL) == 0);
  for (int i = 0; i < n_threads; i++) started += pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) == 0;
  CHECK_EQ(started, n_threads);
  for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
  atomic_store(&workers_running, 0);
  if (trim_beside) {
    pthread_join(trimmer, NULL);
    long long taken = tu_stats_field("idle_reclaims") - taken_before;
    CHECK_MSG(taken >= 10, "only %lld caches were taken by %ld trims beside the workers", taken, atomic_load(&trims));
  }
  free(t);

  long left = 0;
  for (int i = 0; i < NSLOTS; i++)
    if (slots[i].obj.p) {
      left++;
      verify(-1, &slots[i].obj, "left in a slot at the end");
      free(slots[i].obj.p);
    }
  printf("stress: %d threads x %ld ops, %ld objects left in slots at the end, %ld trims beside\n", n_threads, n_ops, left,
         atomic_load(&trims));
  CHECK_MSG(atomic_load(&corrupt_objects) == 0, "%ld corrupt objects (first ones above)", atomic_load(&corrupt_objects));
  CHECK_MSG(atomic_load(&bad_results) == 0, "%ld bad allocation results (first ones above)", atomic_load(&bad_results));
  CHECK(left > 0); /* the slots really were used */
  /* after all that, the heap still works */
  void *p = malloc(100), *q = malloc(10u << 20);
  CHECK(p && q);
  free(p);
  free(q);
  return tu_summary("stress-stress");
}
