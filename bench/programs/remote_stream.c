/* remote_stream.c - a stream of remote frees: producer threads allocate objects in batches and
 * hand each full batch to whichever consumer thread is free; consumers free every object of
 * the batch. So every free is of an object another thread allocated, many frees arrive in a row
 * for one owner, and thousands of objects are in flight (up to --depth batches waiting plus one
 * being filled or emptied per thread): an allocator that takes a lock per remote object, or whose
 * remote frees all meet on one lock, serializes here.
 *
 * How it differs from prodcons: prodcons moves objects one at a time over per-pair rings with
 * at most --queue in flight per pair; here the unit of transport is a batch (--batch objects)
 * through one shared queue, as in a server whose workers pass finished requests to a cleanup
 * pool. The queue takes one mutex per batch (not per object), and a batch's pointers live in the
 * batch itself (its first object is the batch header), so the transport adds nothing per object.
 * Each object carries a stamp written by its producer and checked by the consumer. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PROG "remote-stream"

static uint64_t opt_producers = 2, opt_consumers = 2, opt_batches = 2000, opt_batch = 1000, opt_depth = 16;
static uint64_t opt_min_size = 16, opt_max_size = 512, opt_seed = 1;

typedef struct batch_s {
  struct batch_s *next;
  uint64_t n;
  void *objs[];
} batch_t;

/* The shared queue: a FIFO of full batches, bounded by --depth. */
static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_not_empty = PTHREAD_COND_INITIALIZER, q_not_full = PTHREAD_COND_INITIALIZER;
static batch_t *q_head, *q_tail;
static uint64_t q_len, producers_left;

typedef struct {
  uint64_t index;
  uint64_t objects;
  double start, end;
} worker_t;

static pthread_barrier_t start_line;

static void put(batch_t *b) {
  pthread_mutex_lock(&q_lock);
  while (q_len >= opt_depth) pthread_cond_wait(&q_not_full, &q_lock);
  b->next = NULL;
  if (q_tail) q_tail->next = b;
  else q_head = b;
  q_tail = b;
  q_len++;
  pthread_cond_signal(&q_not_empty);
  pthread_mutex_unlock(&q_lock);
}

/* The next batch, or NULL once every producer is done and the queue is empty. */
static batch_t *take(void) {
  pthread_mutex_lock(&q_lock);
  while (!q_head && producers_left) pthread_cond_wait(&q_not_empty, &q_lock);
  batch_t *b = q_head;
  if (b) {
    q_head = b->next;
    if (!q_head) q_tail = NULL;
    q_len--;
    pthread_cond_signal(&q_not_full);
  }
  pthread_mutex_unlock(&q_lock);
  return b;
}

static void *producer_main(void *arg) {
  worker_t *w = arg;
  rng_t rng;
  rng_seed(&rng, opt_seed, w->index);
  pthread_barrier_wait(&start_line);
  w->start = now_s();
  for (uint64_t k = 0; k < opt_batches; k++) {
    batch_t *b = malloc(sizeof *b + opt_batch * sizeof(void *));
    if (!b) bench_die(PROG, "malloc of a batch header returned NULL");
    b->n = opt_batch;
    for (uint64_t i = 0; i < opt_batch; i++) {
      size_t size = opt_min_size + rng_below(&rng, opt_max_size - opt_min_size + 1);
      uint64_t *obj = malloc(size);
      if (!obj) bench_die(PROG, "malloc(%zu) returned NULL", size);
      obj[0] = (uint64_t)(uintptr_t)obj ^ size; /* the consumer checks it: no overlap, no corruption */
      obj[1] = size;
      b->objs[i] = obj;
    }
    put(b);
    w->objects += opt_batch + 1; /* its objects and the batch itself */
  }
  pthread_mutex_lock(&q_lock);
  producers_left--;
  pthread_cond_broadcast(&q_not_empty);
  pthread_mutex_unlock(&q_lock);
  w->end = now_s();
  return NULL;
}

static void *consumer_main(void *arg) {
  worker_t *w = arg;
  pthread_barrier_wait(&start_line);
  w->start = now_s();
  for (batch_t *b; (b = take());) {
    for (uint64_t i = 0; i < b->n; i++) {
      uint64_t *obj = b->objs[i];
      if (obj[0] != ((uint64_t)(uintptr_t)obj ^ obj[1]))
        bench_die(PROG, "object %p lost its stamp between producer and consumer", (void *)obj);
      free(obj);
    }
    w->objects += b->n + 1; /* its objects and the batch itself */
    free(b);
  }
  w->end = now_s();
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"producers", OPT_U64, &opt_producers, 1, 4096, "allocating threads"},
    {"consumers", OPT_U64, &opt_consumers, 1, 4096, "freeing threads"},
    {"batches", OPT_U64, &opt_batches, 1, 1e9, "batches each producer fills"},
    {"batch", OPT_U64, &opt_batch, 1, 1 << 20, "objects per batch"},
    {"depth", OPT_U64, &opt_depth, 1, 1 << 20, "full batches the queue holds before producers wait"},
    {"min-size", OPT_U64, &opt_min_size, 16, 1ULL << 30, "smallest object in bytes"},
    {"max-size", OPT_U64, &opt_max_size, 16, 1ULL << 30, "largest object in bytes"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "A stream of remote frees: producers allocate batches of objects, consumers free whole batches.",
              opts, argc, argv);
  if (opt_min_size > opt_max_size) bench_usage_error(PROG, "--min-size exceeds --max-size");

  uint64_t n_threads = opt_producers + opt_consumers;
  worker_t *w = calloc(n_threads, sizeof *w);
  pthread_t *tids = calloc(n_threads, sizeof *tids);
  if (!w || !tids) bench_die(PROG, "out of memory");
  producers_left = opt_producers;
  pthread_barrier_init(&start_line, NULL, (unsigned)n_threads);
  for (uint64_t i = 0; i < n_threads; i++) {
    bool producer = i < opt_producers;
    w[i].index = i;
    if (pthread_create(&tids[i], NULL, producer ? producer_main : consumer_main, &w[i]))
      bench_die(PROG, "pthread_create failed");
  }
  for (uint64_t i = 0; i < n_threads; i++) pthread_join(tids[i], NULL);

  double first = w[0].start, last = w[0].end;
  uint64_t allocated = 0, freed = 0;
  for (uint64_t i = 0; i < n_threads; i++) {
    if (w[i].start < first) first = w[i].start;
    if (w[i].end > last) last = w[i].end;
    if (i < opt_producers) allocated += w[i].objects;
    else freed += w[i].objects;
  }
  if (allocated != freed)
    bench_die(PROG, "%llu objects allocated but %llu freed", (unsigned long long)allocated, (unsigned long long)freed);
  double elapsed = last - first;

  result_begin(PROG);
  result_u64("producers", opt_producers);
  result_u64("consumers", opt_consumers);
  result_u64("batches", opt_batches);
  result_u64("batch", opt_batch);
  result_u64("depth", opt_depth);
  result_u64("min_size", opt_min_size);
  result_u64("max_size", opt_max_size);
  result_u64("objects", allocated);
  result_f("elapsed_s", elapsed);
  result_f("ops_per_s", (allocated + freed) / elapsed);
  result_end();
  free(w);
  free(tids);
  return 0;
}
