/* release_stall.c - how long other threads' allocations wait while the allocator gives a large
 * free region back to the system. Worker threads loop on malloc of a --block-kb KiB block (over
 * 256 KiB: a page-heap block in TCMalloc-like allocators, which take one lock for them), a write
 * to its first and middle page, and free, timing each pair. The main thread allocates --free-mb
 * MiB in 1 MiB blocks and writes them, lets the workers run for 100 ms, frees every block (and with
 * --trim 1 calls malloc_trim(0)), then lets the workers run for --after-ms more while the allocator
 * gives the pages back when it will: at the frees, in malloc_trim, or from a background thread
 * after its decay. An allocator that holds the lock its large blocks need across the kernel's
 * madvise or munmap (a few tens of ms a GiB) stops the workers for that long.
 *
 * worst_ms is the slowest worker pair from the frees on; base_worst_ms the slowest in the 100 ms
 * before them (this machine's own scheduling noise: with more threads than CPUs, a few ms);
 * elapsed_s the whole run. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "release-stall"

static uint64_t opt_threads = 1, opt_free_mb = 1024, opt_block_kb = 300, opt_trim = 0, opt_after_ms = 1500;

static int phase; /* 0: before the frees; 1: from the frees on; 2: stop */

typedef struct {
  pthread_t thread;
  double worst[2]; /* slowest pair in phase 0, in phase 1 */
  uint64_t pairs;
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  size_t size = (size_t)opt_block_kb << 10;
  int p;
  while ((p = __atomic_load_n(&phase, __ATOMIC_ACQUIRE)) < 2) {
    double t0 = now_s();
    unsigned char *b = malloc(size);
    if (!b) bench_die(PROG, "malloc(%zu) returned NULL in a worker", size);
    b[0] = 1;
    b[size / 2] = 1;
    __asm__ volatile("" : : "r"(b) : "memory");
    free(b);
    double dt = now_s() - t0;
    if (dt > w->worst[p]) w->worst[p] = dt;
    w->pairs++;
  }
  return NULL;
}

static void sleep_ms(uint64_t ms) {
  struct timespec t = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0) {
  }
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 256, "worker threads timing their malloc+free pairs"},
    {"free-mb", OPT_U64, &opt_free_mb, 1, 1 << 20, "MiB allocated in 1 MiB blocks, written, then freed"},
    {"block-kb", OPT_U64, &opt_block_kb, 1, 1 << 20, "KiB of each worker block"},
    {"trim", OPT_U64, &opt_trim, 0, 1, "1: malloc_trim(0) after the frees"},
    {"after-ms", OPT_U64, &opt_after_ms, 0, 600000, "ms the workers run after the frees"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Workers' worst malloc+free while a large free region goes back to the system.", opts, argc, argv);

  double start = now_s();
  size_t nblocks = (size_t)opt_free_mb;
  unsigned char **blocks = calloc(nblocks, sizeof *blocks);
  worker_t *workers = calloc(opt_threads, sizeof *workers);
  if (!blocks || !workers) bench_die(PROG, "out of memory for the tables");
  for (size_t i = 0; i < nblocks; i++) {
    blocks[i] = malloc(1 << 20);
    if (!blocks[i]) bench_die(PROG, "malloc(1 MiB) returned NULL (block %zu)", i);
    memset(blocks[i], (int)(i & 0xff), 1 << 20);
  }
  for (uint64_t i = 0; i < opt_threads; i++)
    if (pthread_create(&workers[i].thread, NULL, worker, &workers[i]) != 0) bench_die(PROG, "pthread_create failed");
  sleep_ms(100);
  __atomic_store_n(&phase, 1, __ATOMIC_RELEASE);
  double t0 = now_s();
  for (size_t i = 0; i < nblocks; i++) free(blocks[i]);
  double free_s = now_s() - t0, trim_s = 0;
  if (opt_trim) {
    t0 = now_s();
    malloc_trim(0);
    trim_s = now_s() - t0;
  }
  sleep_ms(opt_after_ms);
  __atomic_store_n(&phase, 2, __ATOMIC_RELEASE);
  double worst = 0, base = 0;
  uint64_t pairs = 0;
  for (uint64_t i = 0; i < opt_threads; i++) {
    pthread_join(workers[i].thread, NULL);
    if (workers[i].worst[0] > base) base = workers[i].worst[0];
    if (workers[i].worst[1] > worst) worst = workers[i].worst[1];
    pairs += workers[i].pairs;
  }
  free(workers);
  free(blocks);

  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("free_mb", opt_free_mb);
  result_u64("block_kb", opt_block_kb);
  result_u64("trim", opt_trim);
  result_u64("after_ms", opt_after_ms);
  result_f("elapsed_s", now_s() - start);
  result_f("worst_ms", worst * 1e3);
  result_f("base_worst_ms", base * 1e3);
  result_f("free_ms", free_s * 1e3);
  result_f("trim_ms", trim_s * 1e3);
  result_u64("pairs", pairs);
  result_end();
  return 0;
}
