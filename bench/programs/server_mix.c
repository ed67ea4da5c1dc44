/* server_mix.c - a server-like mix across threads: each request allocates a few short-lived
 * objects of random sizes and frees them itself (parsing, buffers), and leaves one longer-lived
 * object in a shared table (a cache entry, a session), where it replaces the entry a random
 * earlier request left, which this thread frees: usually an object another thread allocated.
 * Sizes follow a server's skew: most small, some of a few KiB, a few up to 64 KiB.
 *
 * --sized 1 runs the same requests with C++'s operator new and the sized operator delete
 * (operator delete(void*, size_t), called by its mangled name so the program stays C), so the
 * allocator is told each object's size at free; --sized 0 uses malloc and plain free. The
 * difference between the two is what finding a size from the pointer costs (page map lookup,
 * remote path). Every object carries its size and a stamp, checked before it is freed. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define PROG "server-mix"

/* The C++ runtime's operator new(size_t) and operator delete(void*, size_t) (C++14 sized
 * deallocation), resolved like any other symbol, so a preloaded allocator's versions win. */
void *_Znwm(size_t size);
void _ZdlPvm(void *p, size_t size);

static uint64_t opt_threads = 2, opt_requests = 1000000, opt_slots = 10000, opt_temps = 3, opt_sized = 0, opt_seed = 1;

typedef struct {
  uint64_t size;
  uint64_t stamp;
} header_t;

static _Atomic(header_t *) *table;

typedef struct {
  uint64_t index;
  uint64_t allocs;
  double start, end;
} worker_t;

static pthread_barrier_t start_line;

static size_t server_size(rng_t *r) {
  uint64_t pick = rng_below(r, 100);
  if (pick < 70) return 16 + rng_below(r, 241);        /* 16..256 */
  if (pick < 95) return 257 + rng_below(r, 3840);      /* ..4 KiB */
  return 4097 + rng_below(r, 61440);                   /* ..64 KiB */
}

static header_t *obj_new(size_t size, uint64_t stamp) {
  header_t *h = opt_sized ? _Znwm(size) : malloc(size);
  if (!h) bench_die(PROG, "allocation of %zu bytes returned NULL", size);
  h->size = size;
  h->stamp = stamp;
  ((unsigned char *)h)[size - 1] = (unsigned char)stamp;
  return h;
}

static void obj_delete(header_t *h) {
  if (((unsigned char *)h)[h->size - 1] != (unsigned char)h->stamp)
    bench_die(PROG, "object %p of %llu bytes lost its last byte", (void *)h, (unsigned long long)h->size);
  if (opt_sized) _ZdlPvm(h, h->size);
  else free(h);
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  rng_t rng;
  rng_seed(&rng, opt_seed, w->index);
  header_t *temps[16];
  pthread_barrier_wait(&start_line);
  w->start = now_s();
  for (uint64_t k = 0; k < opt_requests; k++) {
    uint64_t n = 1 + rng_below(&rng, opt_temps);
    for (uint64_t i = 0; i < n; i++) temps[i] = obj_new(server_size(&rng), rng_next(&rng));
    header_t *keep = obj_new(server_size(&rng), temps[0]->stamp ^ k);
    for (uint64_t i = n; i-- > 0;) obj_delete(temps[i]);
    header_t *old = atomic_exchange_explicit(&table[rng_below(&rng, opt_slots)], keep, memory_order_acq_rel);
    if (old) obj_delete(old);
    w->allocs += n + 1;
  }
  w->end = now_s();
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 4096, "worker threads"},
    {"requests", OPT_U64, &opt_requests, 1, 1e12, "requests each thread serves"},
    {"slots", OPT_U64, &opt_slots, 1, 1 << 26, "entries of the shared table (the long-lived objects)"},
    {"temps", OPT_U64, &opt_temps, 1, 16, "most short-lived objects per request (1 to this many)"},
    {"sized", OPT_U64, &opt_sized, 0, 1, "1: operator new + sized operator delete; 0: malloc + free"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Server-like mix: short-lived objects per request, long-lived ones freed by other threads.",
              opts, argc, argv);

  table = calloc(opt_slots, sizeof *table);
  worker_t *w = calloc(opt_threads, sizeof *w);
  pthread_t *tids = calloc(opt_threads, sizeof *tids);
  if (!table || !w || !tids) bench_die(PROG, "out of memory");
  pthread_barrier_init(&start_line, NULL, (unsigned)opt_threads);
  for (uint64_t i = 0; i < opt_threads; i++) {
    w[i].index = i;
    if (pthread_create(&tids[i], NULL, worker_main, &w[i])) bench_die(PROG, "pthread_create failed");
  }
  for (uint64_t i = 0; i < opt_threads; i++) pthread_join(tids[i], NULL);
  double first = w[0].start, last = w[0].end;
  uint64_t allocs = 0;
  for (uint64_t i = 0; i < opt_threads; i++) {
    if (w[i].start < first) first = w[i].start;
    if (w[i].end > last) last = w[i].end;
    allocs += w[i].allocs;
  }
  double elapsed = last - first;
  for (uint64_t i = 0; i < opt_slots; i++) {
    header_t *h = atomic_load_explicit(&table[i], memory_order_relaxed);
    if (h) obj_delete(h);
  }

  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("requests", opt_requests);
  result_u64("slots", opt_slots);
  result_u64("temps", opt_temps);
  result_u64("sized", opt_sized);
  result_u64("allocs", allocs);
  result_f("elapsed_s", elapsed);
  result_f("requests_per_s", opt_threads * opt_requests / elapsed);
  result_f("ops_per_s", 2 * allocs / elapsed);
  result_end();
  free(table);
  free(w);
  free(tids);
  return 0;
}
