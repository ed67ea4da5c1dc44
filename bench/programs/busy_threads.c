/* busy_threads.c - more threads than CPUs, each churning blocks of its own: every thread runs
 * --rounds rounds of allocating --blocks blocks of random sizes in [--min-size, --max-size],
 * writing them, then freeing them all. With --threads well over the CPUs and a working set per
 * thread over its share of a per-thread-cache budget (qmalloc's tcache_total over the threads),
 * it shows what the caches keep while threads that lost budget wait for a CPU (the peak RSS), and
 * what going to the shared lists instead costs (the rate). --write-all 0 writes only the first
 * 4 KiB and the last byte of each block, so that the allocator's own time shows, not the writes.
 * Threads never share blocks.
 *
 * Each block is stamped at both ends and checked before it is freed. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PROG "busy-threads"

static uint64_t opt_threads = 64, opt_blocks = 64, opt_rounds = 2000, opt_min_size = 1024, opt_max_size = 16384;
static uint64_t opt_write_all = 1, opt_seed = 1;

static pthread_barrier_t start_line;

static void *worker_main(void *arg) {
  rng_t rng;
  rng_seed(&rng, opt_seed, (uint64_t)(uintptr_t)arg);
  unsigned char **live = malloc(opt_blocks * sizeof *live);
  size_t *sizes = malloc(opt_blocks * sizeof *sizes);
  if (!live || !sizes) bench_die(PROG, "out of memory for the block table");
  pthread_barrier_wait(&start_line);
  for (uint64_t r = 0; r < opt_rounds; r++) {
    for (uint64_t i = 0; i < opt_blocks; i++) {
      size_t size = opt_min_size + rng_below(&rng, opt_max_size - opt_min_size + 1);
      unsigned char *p = malloc(size);
      if (!p) bench_die(PROG, "malloc(%zu) returned NULL", size);
      memset(p, (int)(i & 0xff), opt_write_all || size < 4096 ? size : 4096);
      p[size - 1] = (unsigned char)(i + 1);
      live[i] = p;
      sizes[i] = size;
    }
    for (uint64_t i = 0; i < opt_blocks; i++) {
      if (live[i][0] != (unsigned char)(i & 0xff) && sizes[i] > 1) bench_die(PROG, "block %p lost its first byte", (void *)live[i]);
      if (live[i][sizes[i] - 1] != (unsigned char)(i + 1)) bench_die(PROG, "block %p lost its last byte", (void *)live[i]);
      free(live[i]);
    }
  }
  free(sizes);
  free(live);
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 4096, "worker threads (more than the CPUs is the point)"},
    {"blocks", OPT_U64, &opt_blocks, 1, 1 << 20, "blocks each thread allocates in a round, then frees"},
    {"rounds", OPT_U64, &opt_rounds, 1, 1e9, "rounds per thread"},
    {"min-size", OPT_U64, &opt_min_size, 1, 1ULL << 30, "smallest block in bytes"},
    {"max-size", OPT_U64, &opt_max_size, 1, 1ULL << 30, "largest block in bytes"},
    {"write-all", OPT_U64, &opt_write_all, 0, 1, "1: write every byte of a block; 0: its first 4 KiB and its last byte"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "More threads than CPUs, each allocating, writing and freeing blocks of its own.", opts, argc, argv);
  if (opt_min_size > opt_max_size) bench_usage_error(PROG, "--min-size exceeds --max-size");

  pthread_t *tids = calloc(opt_threads, sizeof *tids);
  if (!tids) bench_die(PROG, "out of memory");
  pthread_barrier_init(&start_line, NULL, (unsigned)opt_threads + 1);
  for (uint64_t i = 0; i < opt_threads; i++)
    if (pthread_create(&tids[i], NULL, worker_main, (void *)(uintptr_t)i)) bench_die(PROG, "pthread_create failed");
  double start = now_s();
  pthread_barrier_wait(&start_line);
  for (uint64_t i = 0; i < opt_threads; i++) pthread_join(tids[i], NULL);
  double elapsed = now_s() - start;
  free(tids);

  uint64_t pairs = opt_threads * opt_rounds * opt_blocks;
  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("blocks", opt_blocks);
  result_u64("rounds", opt_rounds);
  result_u64("min_size", opt_min_size);
  result_u64("max_size", opt_max_size);
  result_u64("write_all", opt_write_all);
  result_u64("pairs", pairs);
  result_f("elapsed_s", elapsed);
  result_f("ops_per_s", pairs / elapsed);
  result_end();
  return 0;
}
