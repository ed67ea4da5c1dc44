/* mixed_stress.c - a multi-threaded stress of mixed sizes: --threads workers, each replacing
 * random members of a table of live objects with new ones of log-uniform random size (8 bytes to
 * --max-size, so small, medium and page-sized objects mix in every cache and span), and writing
 * each new object (its first 256 bytes and its last byte). Work runs in --generations: each
 * generation's threads take over the tables the previous generation's threads left, and exit when
 * done, so objects of dead threads are freed by their successors and thread caches come and go.
 * In the middle of each generation a thread frees half its table at once, as a program does
 * between phases, and then grows it back.
 *
 * Every object is stamped (first and last byte, from its address) and checked before its free. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PROG "mixed-stress"

static uint64_t opt_threads = 4, opt_ops = 1000000, opt_slots = 2000, opt_max_size = 131072, opt_generations = 4, opt_seed = 1;

typedef struct {
  unsigned char *p;
  size_t size;
} slot_t;

typedef struct {
  uint64_t index, generation;
  slot_t *table; /* shared across generations: thread i of each generation takes table i */
  double start, end;
} worker_t;

static size_t random_size(rng_t *r) {
  unsigned top = 63 - __builtin_clzll(opt_max_size);
  unsigned b = 3 + (unsigned)rng_below(r, top - 3 + 1);
  uint64_t from = 1ULL << b, to = b < 63 && (2ULL << b) - 1 < opt_max_size ? (2ULL << b) - 1 : opt_max_size;
  return from + rng_below(r, to - from + 1);
}

static unsigned char tag(const void *p) { return (unsigned char)((uintptr_t)p >> 4 ^ (uintptr_t)p >> 12); }

static void fill(slot_t *s, rng_t *r) {
  s->size = random_size(r);
  s->p = malloc(s->size);
  if (!s->p) bench_die(PROG, "malloc(%zu) returned NULL", s->size);
  memset(s->p, tag(s->p), s->size < 256 ? s->size : 256);
  s->p[s->size - 1] = tag(s->p);
}

static void empty(slot_t *s) {
  if (!s->p) return;
  if (s->p[0] != tag(s->p) || s->p[s->size - 1] != tag(s->p))
    bench_die(PROG, "object %p of %zu bytes lost its stamp", (void *)s->p, s->size);
  free(s->p);
  s->p = NULL;
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  rng_t rng;
  rng_seed(&rng, opt_seed, w->generation * 65536 + w->index);
  uint64_t ops = opt_ops / opt_generations;
  w->start = now_s();
  for (uint64_t k = 0; k < ops; k++) {
    if (k == ops / 2)
      for (uint64_t i = 0; i < opt_slots; i += 2) empty(&w->table[i]); /* a phase ends */
    slot_t *s = &w->table[rng_below(&rng, opt_slots)];
    empty(s);
    fill(s, &rng);
  }
  w->end = now_s();
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 4096, "worker threads in each generation"},
    {"ops", OPT_U64, &opt_ops, 1, 1e12, "replacements per thread, over all generations"},
    {"slots", OPT_U64, &opt_slots, 2, 1 << 24, "live objects per thread at most"},
    {"max-size", OPT_U64, &opt_max_size, 16, 1ULL << 30, "largest object in bytes (sizes are log-uniform from 8)"},
    {"generations", OPT_U64, &opt_generations, 1, 1 << 20, "thread generations (each takes over the last one's objects)"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Multi-threaded stress of mixed sizes, in generations of threads that inherit each other's objects.",
              opts, argc, argv);
  if (opt_generations > opt_ops) bench_usage_error(PROG, "--generations exceeds --ops");

  worker_t *w = calloc(opt_threads, sizeof *w);
  pthread_t *tids = calloc(opt_threads, sizeof *tids);
  if (!w || !tids) bench_die(PROG, "out of memory");
  for (uint64_t i = 0; i < opt_threads; i++) {
    w[i].index = i;
    w[i].table = calloc(opt_slots, sizeof(slot_t));
    if (!w[i].table) bench_die(PROG, "out of memory for the tables");
  }
  double start = now_s();
  for (uint64_t g = 0; g < opt_generations; g++) {
    for (uint64_t i = 0; i < opt_threads; i++) {
      w[i].generation = g;
      if (pthread_create(&tids[i], NULL, worker_main, &w[i])) bench_die(PROG, "pthread_create failed");
    }
    for (uint64_t i = 0; i < opt_threads; i++) pthread_join(tids[i], NULL);
  }
  double elapsed = now_s() - start;
  for (uint64_t i = 0; i < opt_threads; i++) {
    for (uint64_t j = 0; j < opt_slots; j++) empty(&w[i].table[j]);
    free(w[i].table);
  }
  uint64_t total = (opt_ops / opt_generations) * opt_generations * opt_threads;

  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("ops", opt_ops);
  result_u64("slots", opt_slots);
  result_u64("max_size", opt_max_size);
  result_u64("generations", opt_generations);
  result_u64("replacements", total);
  result_f("elapsed_s", elapsed);
  result_f("ops_per_s", 2 * total / elapsed);
  result_end();
  free(w);
  free(tids);
  return 0;
}
