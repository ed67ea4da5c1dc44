/* realloc_mix.c - random sizes allocated, freed and resized by realloc, with objects moving
 * between threads: each thread works on a private table of slots (malloc into an empty slot,
 * free, realloc to a new random size), and now and then swaps one of its objects with a slot
 * of a shared table, so later frees and reallocs of that object happen in another thread than
 * the one that allocated it. Sizes are log-uniform in [--min-size, --max-size], so every size
 * class and the boundaries between an allocator's size ranges are crossed by realloc.
 *
 * Every object is stamped at both ends of the prefix realloc must preserve; the stamps are
 * checked after each realloc and before each free (exit 1 if one is lost). */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define PROG "realloc-mix"

static uint64_t opt_threads = 2, opt_ops = 1000000, opt_slots = 1000, opt_shared = 1000;
static uint64_t opt_min_size = 16, opt_max_size = 65536, opt_share_pct = 20, opt_seed = 1;

/* The object starts with its size and stamp, so whichever thread holds it can check it. */
typedef struct {
  uint64_t size;
  uint64_t stamp;
} header_t;

static _Atomic(header_t *) *shared;

typedef struct {
  uint64_t index;
  uint64_t ops, reallocs, shares;
  double start, end;
} worker_t;

static pthread_barrier_t start_line;

static size_t random_size(rng_t *r) {
  /* log-uniform: a power of two range first, then uniform within it */
  uint64_t lo = opt_min_size, hi = opt_max_size;
  unsigned bits_lo = 63 - __builtin_clzll(lo), bits_hi = 63 - __builtin_clzll(hi);
  unsigned b = bits_lo + (unsigned)rng_below(r, bits_hi - bits_lo + 1);
  uint64_t from = (1ULL << b) > lo ? (1ULL << b) : lo, to = b < 63 && (2ULL << b) - 1 < hi ? (2ULL << b) - 1 : hi;
  return from + rng_below(r, to - from + 1);
}

static void stamp(header_t *h, size_t size, uint64_t v) {
  h->size = size;
  h->stamp = v;
  ((unsigned char *)h)[size - 1] = (unsigned char)v;
}

static void check(const header_t *h, const char *when) {
  if (((const unsigned char *)h)[h->size - 1] != (unsigned char)h->stamp)
    bench_die(PROG, "object %p of %llu bytes lost its last byte (%s)", (const void *)h, (unsigned long long)h->size, when);
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  rng_t rng;
  rng_seed(&rng, opt_seed, w->index);
  header_t **slots = calloc(opt_slots, sizeof *slots);
  if (!slots) bench_die(PROG, "out of memory for the slot table");
  pthread_barrier_wait(&start_line);
  w->start = now_s();
  for (uint64_t op = 0; op < opt_ops; op++) {
    header_t **s = &slots[rng_below(&rng, opt_slots)];
    uint64_t pick = rng_below(&rng, 100);
    if (!*s) {
      size_t size = random_size(&rng);
      *s = malloc(size);
      if (!*s) bench_die(PROG, "malloc(%zu) returned NULL", size);
      stamp(*s, size, rng_next(&rng));
    } else if (pick < opt_share_pct) {
      *s = atomic_exchange_explicit(&shared[rng_below(&rng, opt_shared)], *s, memory_order_acq_rel);
      w->shares++;
    } else if (pick < opt_share_pct + (100 - opt_share_pct) / 2) {
      check(*s, "before realloc");
      size_t size = random_size(&rng);
      uint64_t keep = (*s)->size < size ? (*s)->size : size;
      unsigned char last = ((unsigned char *)*s)[keep - 1];
      uint64_t old_stamp = (*s)->stamp;
      header_t *n = realloc(*s, size);
      if (!n) bench_die(PROG, "realloc to %zu returned NULL", size);
      if (n->stamp != old_stamp || ((unsigned char *)n)[keep - 1] != last)
        bench_die(PROG, "realloc to %zu bytes did not keep the first %llu", size, (unsigned long long)keep);
      stamp(n, size, rng_next(&rng));
      *s = n;
      w->reallocs++;
    } else {
      check(*s, "before free");
      free(*s);
      *s = NULL;
    }
  }
  w->end = now_s();
  w->ops = opt_ops;
  for (uint64_t i = 0; i < opt_slots; i++)
    if (slots[i]) check(slots[i], "at the end"), free(slots[i]);
  free(slots);
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 4096, "worker threads"},
    {"ops", OPT_U64, &opt_ops, 1, 1e12, "operations per thread (malloc, free, realloc or share)"},
    {"slots", OPT_U64, &opt_slots, 1, 1 << 24, "private slots per thread"},
    {"shared", OPT_U64, &opt_shared, 1, 1 << 24, "slots of the shared table objects move through"},
    {"min-size", OPT_U64, &opt_min_size, 16, 1ULL << 30, "smallest object in bytes"},
    {"max-size", OPT_U64, &opt_max_size, 16, 1ULL << 30, "largest object in bytes"},
    {"share-pct", OPT_U64, &opt_share_pct, 0, 100, "percent of operations on a full slot that swap it into the shared table"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Random malloc/free/realloc, objects moving between threads through a shared table.", opts, argc, argv);
  if (opt_min_size > opt_max_size) bench_usage_error(PROG, "--min-size exceeds --max-size");

  shared = calloc(opt_shared, sizeof *shared);
  worker_t *w = calloc(opt_threads, sizeof *w);
  pthread_t *tids = calloc(opt_threads, sizeof *tids);
  if (!shared || !w || !tids) bench_die(PROG, "out of memory");
  pthread_barrier_init(&start_line, NULL, (unsigned)opt_threads);
  for (uint64_t i = 0; i < opt_threads; i++) {
    w[i].index = i;
    if (pthread_create(&tids[i], NULL, worker_main, &w[i])) bench_die(PROG, "pthread_create failed");
  }
  for (uint64_t i = 0; i < opt_threads; i++) pthread_join(tids[i], NULL);
  double first = w[0].start, last = w[0].end;
  uint64_t ops = 0, reallocs = 0, shares = 0;
  for (uint64_t i = 0; i < opt_threads; i++) {
    if (w[i].start < first) first = w[i].start;
    if (w[i].end > last) last = w[i].end;
    ops += w[i].ops;
    reallocs += w[i].reallocs;
    shares += w[i].shares;
  }
  for (uint64_t i = 0; i < opt_shared; i++) {
    header_t *h = atomic_load_explicit(&shared[i], memory_order_relaxed);
    if (h) check(h, "at the end"), free(h);
  }
  double elapsed = last - first;

  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("ops", opt_ops);
  result_u64("total_ops", ops);
  result_u64("slots", opt_slots);
  result_u64("shared", opt_shared);
  result_u64("min_size", opt_min_size);
  result_u64("max_size", opt_max_size);
  result_u64("share_pct", opt_share_pct);
  result_u64("reallocs", reallocs);
  result_u64("shares", shares);
  result_f("elapsed_s", elapsed);
  result_f("ops_per_s", ops / elapsed);
  result_end();
  free(shared);
  free(w);
  free(tids);
  return 0;
}
