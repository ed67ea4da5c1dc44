/* steady_state.c - producer/consumer at a fixed number of live objects for a fixed time, with
 * RSS sampled as it goes. The workload's memory is constant (each producer's ring holds exactly
 * --live/pairs objects once full), so RSS should level off; a positive trend means the allocator
 * strands memory freed by the consumers (seed 004's pending-free problem, seed 000's leakage).
 * Reports the live bytes, the peak and the trend: a least-squares slope of RSS over time,
 * taken over the second half of the samples so that the warm-up does not count. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PROG "steady-state"

static uint64_t opt_pairs = 2, opt_live = 100000, opt_min_size = 16, opt_max_size = 512, opt_seed = 1;
static double opt_duration = 5.0, opt_sample = 0.05;

typedef struct {
  _Alignas(64) _Atomic uint64_t head;
  _Alignas(64) _Atomic uint64_t tail;
  _Alignas(64) void **slots;
  uint64_t capacity;
  rng_t rng;
} ring_t;

static ring_t *rings;
static _Atomic bool stop;
static _Atomic uint64_t transferred;

/* The producer keeps its ring full: objects in the ring are the live set. */
static void *producer_main(void *arg) {
  ring_t *r = arg;
  uint64_t idle = 0;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (tail - atomic_load_explicit(&r->head, memory_order_acquire) >= r->capacity) {
      if (idle++ < 64) sched_yield();
      else sleep_s(50e-6);
      continue;
    }
    idle = 0;
    size_t size = opt_min_size + rng_below(&r->rng, opt_max_size - opt_min_size + 1);
    unsigned char *obj = malloc(size);
    if (!obj) bench_die(PROG, "malloc(%zu) returned NULL", size);
    memset(obj, 0x7e, size < 64 ? size : 64);
    r->slots[tail % r->capacity] = obj;
    atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
  }
  return NULL;
}

/* The consumer frees the oldest object only while the ring is full, so the live count stays at
 * the capacity (minus at most one) and every free is of another thread's object. */
static void *consumer_main(void *arg) {
  ring_t *r = arg;
  uint64_t idle = 0, freed = 0;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    if (atomic_load_explicit(&r->tail, memory_order_acquire) - head < r->capacity) {
      if (idle++ < 64) sched_yield();
      else sleep_s(50e-6);
      continue;
    }
    idle = 0;
    free(r->slots[head % r->capacity]);
    atomic_store_explicit(&r->head, head + 1, memory_order_release);
    freed++;
  }
  atomic_fetch_add(&transferred, freed);
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"pairs", OPT_U64, &opt_pairs, 1, 1024, "producer/consumer pairs"},
    {"live", OPT_U64, &opt_live, 1, 1e9, "live objects in total (split over the pairs)"},
    {"min-size", OPT_U64, &opt_min_size, 1, 1 << 20, "smallest object in bytes"},
    {"max-size", OPT_U64, &opt_max_size, 1, 1 << 20, "largest object in bytes"},
    {"duration", OPT_DOUBLE, &opt_duration, 0.01, 86400, "seconds to run"},
    {"sample", OPT_DOUBLE, &opt_sample, 0.001, 60, "seconds between RSS samples"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Producer/consumer at a fixed live set for a fixed time; RSS sampled for its trend.", opts, argc, argv);
  if (opt_min_size > opt_max_size) bench_usage_error(PROG, "--min-size exceeds --max-size");
  if (opt_live < opt_pairs) bench_usage_error(PROG, "--live must be at least --pairs");

  rings = aligned_alloc(64, opt_pairs * sizeof *rings);
  pthread_t *tids = calloc(2 * opt_pairs, sizeof *tids);
  uint64_t max_samples = (uint64_t)(opt_duration / opt_sample) + 2;
  double *t_samples = calloc(max_samples, sizeof(double));
  double *rss_samples = calloc(max_samples, sizeof(double));
  if (!rings || !tids || !t_samples || !rss_samples) bench_die(PROG, "out of memory");
  for (uint64_t i = 0; i < opt_pairs; i++) {
    ring_t *r = &rings[i];
    atomic_init(&r->head, 0);
    atomic_init(&r->tail, 0);
    r->capacity = opt_live / opt_pairs + (i < opt_live % opt_pairs);
    r->slots = calloc(r->capacity, sizeof(void *));
    if (!r->slots) bench_die(PROG, "out of memory for the rings");
    rng_seed(&r->rng, opt_seed, i);
  }
  atomic_init(&stop, false);
  for (uint64_t i = 0; i < opt_pairs; i++) {
    if (pthread_create(&tids[2 * i], NULL, producer_main, &rings[i]) ||
        pthread_create(&tids[2 * i + 1], NULL, consumer_main, &rings[i]))
      bench_die(PROG, "pthread_create failed");
  }
  double start = now_s();
  uint64_t n = 0;
  for (double t = 0; t < opt_duration && n < max_samples; t = now_s() - start) {
    t_samples[n] = t;
    rss_samples[n] = (double)rss_now_kb();
    n++;
    sleep_s(opt_sample);
  }
  atomic_store(&stop, true);
  for (uint64_t i = 0; i < 2 * opt_pairs; i++) pthread_join(tids[i], NULL);
  double elapsed = now_s() - start;

  /* Least-squares slope over the second half of the samples. */
  uint64_t from = n / 2;
  double mt = 0, mr = 0, sxx = 0, sxy = 0;
  for (uint64_t i = from; i < n; i++) mt += t_samples[i], mr += rss_samples[i];
  mt /= (double)(n - from);
  mr /= (double)(n - from);
  for (uint64_t i = from; i < n; i++) {
    sxx += (t_samples[i] - mt) * (t_samples[i] - mt);
    sxy += (t_samples[i] - mt) * (rss_samples[i] - mr);
  }
  double slope = sxx > 0 ? sxy / sxx : 0;

  result_begin(PROG);
  result_u64("pairs", opt_pairs);
  result_u64("live", opt_live);
  result_u64("min_size", opt_min_size);
  result_u64("max_size", opt_max_size);
  result_u64("live_bytes_approx", opt_live * (opt_min_size + opt_max_size) / 2);
  result_u64("samples", n);
  result_u64("rss_first_kb", (uint64_t)rss_samples[0]);
  double rss_max = 0;
  for (uint64_t i = 0; i < n; i++)
    if (rss_samples[i] > rss_max) rss_max = rss_samples[i];
  result_u64("rss_max_sample_kb", (uint64_t)rss_max);
  result_f("rss_slope_kb_per_s", slope);
  result_f("elapsed_s", elapsed);
  result_f("objects_per_s", atomic_load(&transferred) / elapsed);
  result_end();

  for (uint64_t i = 0; i < opt_pairs; i++) {
    for (uint64_t k = atomic_load(&rings[i].head); k < atomic_load(&rings[i].tail); k++)
      free(rings[i].slots[k % rings[i].capacity]);
    free(rings[i].slots);
  }
  free(rings);
  free(tids);
  free(t_samples);
  free(rss_samples);
  return 0;
}
