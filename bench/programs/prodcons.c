/* prodcons.c - the producer/consumer test of Gorine & Knizhnik (seed 004): producer threads
 * allocate objects and consumer threads free them, so every free is a cross-thread free - the
 * case a thread-local allocator has to hand back to the owner (their "pending free list").
 * Runs in pairs (--pairs N: N producers, N consumers) or in unequal groups (--producers,
 * --consumers). Objects travel over one single-producer/single-consumer ring per (producer,
 * consumer) edge, so the transport itself takes no lock and allocates nothing: what contends is
 * the allocator. Each producer deals its objects round-robin over its rings; a full ring is
 * skipped, and a thread with nothing to do yields, then naps (so that with more threads than
 * CPUs the waiting ones hand their CPU to the ones that can work). Live objects are bounded by the rings'
 * capacity, so RSS measures the allocator's overhead, not the workload's growth. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PROG "prodcons"

static uint64_t opt_pairs = 0, opt_producers = 1, opt_consumers = 1, opt_iterations = 1000000;
static uint64_t opt_min_size = 16, opt_max_size = 256, opt_queue = 256, opt_seed = 1;

typedef struct {
  _Alignas(64) _Atomic uint64_t head; /* next slot the consumer reads */
  _Alignas(64) _Atomic uint64_t tail; /* next slot the producer writes */
  _Alignas(64) void **slots;
} ring_t;

typedef struct {
  uint64_t index;
  uint64_t count; /* objects allocated (producer) or freed (consumer) */
  uint64_t checksum;
  double start, end;
} worker_t;

static ring_t *rings; /* rings[p * consumers + c] */
static _Atomic uint64_t producers_running;
static pthread_barrier_t start_line;

static ring_t *ring_of(uint64_t p, uint64_t c) { return &rings[p * opt_consumers + c]; }

/* Called each time a thread finds nothing to do; `idle` counts such calls in a row. */
static void back_off(uint64_t idle) {
  if (idle < 64) sched_yield();
  else sleep_s(50e-6);
}

static void *producer_main(void *arg) {
  worker_t *w = arg;
  rng_t rng;
  rng_seed(&rng, opt_seed, w->index);
  uint64_t next = w->index % opt_consumers; /* producers start on different consumers */
  pthread_barrier_wait(&start_line);
  w->start = now_s();
  for (uint64_t k = 0; k < opt_iterations; k++) {
    size_t size = opt_min_size + rng_below(&rng, opt_max_size - opt_min_size + 1);
    unsigned char *obj = malloc(size);
    if (!obj) bench_die(PROG, "malloc(%zu) returned NULL", size);
    memset(obj, (int)(k & 0xff), size < 32 ? size : 32);
    for (uint64_t tries = 0;; tries++) {
      ring_t *r = ring_of(w->index, next);
      next = (next + 1) % opt_consumers;
      uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
      if (tail - atomic_load_explicit(&r->head, memory_order_acquire) < opt_queue) {
        r->slots[tail % opt_queue] = obj;
        atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
        break;
      }
      if (tries % opt_consumers == opt_consumers - 1) back_off(tries / opt_consumers); /* every ring full */
    }
  }
  w->count = opt_iterations;
  w->end = now_s();
  atomic_fetch_sub_explicit(&producers_running, 1, memory_order_release);
  return NULL;
}

static void *consumer_main(void *arg) {
  worker_t *w = arg;
  pthread_barrier_wait(&start_line);
  w->start = now_s();
  for (uint64_t idle = 0;;) {
    bool got = false;
    /* Read "producers done" before draining: if it was 0 and the rings are then empty, nothing
     * can arrive any more. */
    bool all_done = atomic_load_explicit(&producers_running, memory_order_acquire) == 0;
    for (uint64_t p = 0; p < opt_producers; p++) {
      ring_t *r = ring_of(p, w->index);
      uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
      uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
      for (; head != tail; head++) {
        unsigned char *obj = r->slots[head % opt_queue];
        w->checksum += obj[0];
        free(obj);
        w->count++;
        got = true;
      }
      atomic_store_explicit(&r->head, head, memory_order_release);
    }
    if (got) {
      idle = 0;
    } else {
      if (all_done) break;
      back_off(idle++);
    }
  }
  w->end = now_s();
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"pairs", OPT_U64, &opt_pairs, 0, 2048, "N producers and N consumers (overrides the two below)"},
    {"producers", OPT_U64, &opt_producers, 1, 4096, "allocating threads"},
    {"consumers", OPT_U64, &opt_consumers, 1, 4096, "freeing threads"},
    {"iterations", OPT_U64, &opt_iterations, 1, 1e12, "objects each producer allocates"},
    {"min-size", OPT_U64, &opt_min_size, 1, 1ULL << 30, "smallest object in bytes"},
    {"max-size", OPT_U64, &opt_max_size, 1, 1ULL << 30, "largest object in bytes"},
    {"queue", OPT_U64, &opt_queue, 1, 1 << 24, "capacity of each producer->consumer ring"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Gorine & Knizhnik's producer/consumer test: producers allocate, consumers free.", opts, argc, argv);
  if (opt_min_size > opt_max_size) bench_usage_error(PROG, "--min-size exceeds --max-size");
  if (opt_pairs) opt_producers = opt_consumers = opt_pairs;
  if (opt_producers * opt_consumers > (1 << 20)) bench_usage_error(PROG, "too many producer x consumer rings");

  uint64_t n_rings = opt_producers * opt_consumers;
  rings = aligned_alloc(64, n_rings * sizeof *rings);
  if (!rings) bench_die(PROG, "out of memory for the rings");
  for (uint64_t i = 0; i < n_rings; i++) {
    atomic_init(&rings[i].head, 0);
    atomic_init(&rings[i].tail, 0);
    rings[i].slots = calloc(opt_queue, sizeof(void *));
    if (!rings[i].slots) bench_die(PROG, "out of memory for the rings");
  }
  uint64_t n_threads = opt_producers + opt_consumers;
  worker_t *w = calloc(n_threads, sizeof *w);
  pthread_t *tids = calloc(n_threads, sizeof *tids);
  if (!w || !tids) bench_die(PROG, "out of memory");
  atomic_init(&producers_running, opt_producers);
  pthread_barrier_init(&start_line, NULL, (unsigned)n_threads);
  for (uint64_t i = 0; i < n_threads; i++) {
    bool producer = i < opt_producers;
    w[i].index = producer ? i : i - opt_producers;
    if (pthread_create(&tids[i], NULL, producer ? producer_main : consumer_main, &w[i]))
      bench_die(PROG, "pthread_create failed");
  }
  for (uint64_t i = 0; i < n_threads; i++) pthread_join(tids[i], NULL);

  double first = w[0].start, last = w[0].end;
  uint64_t allocated = 0, freed = 0;
  for (uint64_t i = 0; i < n_threads; i++) {
    if (w[i].start < first) first = w[i].start;
    if (w[i].end > last) last = w[i].end;
    if (i < opt_producers) allocated += w[i].count;
    else freed += w[i].count;
  }
  if (allocated != freed)
    bench_die(PROG, "%llu objects allocated but %llu freed", (unsigned long long)allocated, (unsigned long long)freed);
  double elapsed = last - first;

  result_begin(PROG);
  result_u64("producers", opt_producers);
  result_u64("consumers", opt_consumers);
  result_u64("iterations", opt_iterations);
  result_u64("min_size", opt_min_size);
  result_u64("max_size", opt_max_size);
  result_u64("queue", opt_queue);
  result_u64("objects", allocated);
  result_f("elapsed_s", elapsed);
  result_f("objects_per_s", allocated / elapsed);
  result_f("ops_per_s", (allocated + freed) / elapsed);
  result_end();

  for (uint64_t i = 0; i < n_rings; i++) free(rings[i].slots);
  free(rings);
  free(w);
  free(tids);
  return 0;
}
