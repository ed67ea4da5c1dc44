/* heap_leak.c - benchmark 2 of Lever & Boreham (seed 000 section 4.2), after Larson & Krishnan.
 *
 * The main thread allocates, for each of t chains, an array of n fixed-size objects. Each chain
 * then runs r rounds; a round is one freshly created thread that replaces a random subset of the
 * array one object at a time (free, then malloc), creates the next round's thread, hands it the
 * array and exits. So objects are always freed by a thread other than the one that allocated
 * them, while t chains contend for the heap: the conditions under which per-thread or per-arena
 * heaps strand memory. The live heap stays between t*(n-1) and t*n objects, so a perfect
 * allocator's page-fault count would not depend on r beyond the cost of creating threads.
 * The figures that matter (minflt, peak_rss_kb) are the process-wide ones on the RESULT line;
 * the driver fits the paper's lower-bound predictor from the single-chain runs. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>

#define PROG "heap-leak"

static uint64_t opt_threads = 1, opt_objects = 10000, opt_size = 40, opt_rounds = 1, opt_replace = 0, opt_seed = 1;

typedef struct {
  void **objects;
  uint64_t rounds_left;
  rng_t rng;
  pthread_t parent;      /* the previous round's thread, joined by this round's */
  bool has_parent;
  pthread_t last;        /* the final round's thread, for main to join */
} chain_t;

static sem_t chains_done;

static void *round_main(void *arg) {
  chain_t *c = arg;
  if (c->has_parent) pthread_join(c->parent, NULL);
  for (uint64_t k = 0; k < opt_replace; k++) {
    uint64_t i = rng_below(&c->rng, opt_objects);
    free(c->objects[i]);
    c->objects[i] = malloc(opt_size);
    if (!c->objects[i]) bench_die(PROG, "malloc(%llu) returned NULL", (unsigned long long)opt_size);
    memset(c->objects[i], (int)k, opt_size); /* touched, as a server's request state would be */
  }
  if (--c->rounds_left == 0) {
    c->last = pthread_self();
    sem_post(&chains_done);
    return NULL;
  }
  c->parent = pthread_self();
  c->has_parent = true;
  pthread_t next;
  if (pthread_create(&next, NULL, round_main, c)) bench_die(PROG, "pthread_create failed");
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 4096, "concurrent chains of threads (t)"},
    {"objects", OPT_U64, &opt_objects, 1, 1e9, "objects per chain (n)"},
    {"size", OPT_U64, &opt_size, 1, 1ULL << 30, "bytes per object"},
    {"rounds", OPT_U64, &opt_rounds, 1, 1e6, "threads created one after another in each chain (r)"},
    {"replace", OPT_U64, &opt_replace, 0, 1e12, "objects replaced per round (0: as many as --objects)"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Benchmark 2 (Lever & Boreham, after Larson): cross-thread replacement, heap leakage.",
              opts, argc, argv);
  if (opt_replace == 0) opt_replace = opt_objects;

  chain_t *chains = calloc(opt_threads, sizeof *chains);
  if (!chains) bench_die(PROG, "out of memory");
  for (uint64_t t = 0; t < opt_threads; t++) {
    chain_t *c = &chains[t];
    c->objects = malloc(opt_objects * sizeof *c->objects);
    if (!c->objects) bench_die(PROG, "out of memory for the object array");
    for (uint64_t i = 0; i < opt_objects; i++) {
      c->objects[i] = malloc(opt_size);
      if (!c->objects[i]) bench_die(PROG, "out of memory for the objects");
      memset(c->objects[i], 0, opt_size);
    }
    c->rounds_left = opt_rounds;
    rng_seed(&c->rng, opt_seed, t);
  }

  sem_init(&chains_done, 0, 0);
  double start = now_s();
  for (uint64_t t = 0; t < opt_threads; t++) {
    pthread_t first;
    if (pthread_create(&first, NULL, round_main, &chains[t])) bench_die(PROG, "pthread_create failed");
  }
  for (uint64_t t = 0; t < opt_threads; t++) sem_wait(&chains_done);
  for (uint64_t t = 0; t < opt_threads; t++) pthread_join(chains[t].last, NULL);
  double elapsed = now_s() - start;

  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("objects", opt_objects);
  result_u64("size", opt_size);
  result_u64("rounds", opt_rounds);
  result_u64("replace", opt_replace);
  result_u64("live_bytes", opt_threads * opt_objects * opt_size);
  result_f("elapsed_s", elapsed);
  result_end(); /* minflt and peak_rss_kb before the cleanup below can disturb them */

  for (uint64_t t = 0; t < opt_threads; t++) {
    for (uint64_t i = 0; i < opt_objects; i++) free(chains[t].objects[i]);
    free(chains[t].objects);
  }
  free(chains);
  return 0;
}
