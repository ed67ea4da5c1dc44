/* mallbench.c - the case-study program of Honess, "Configuring malloc for faster and smaller
 * applications" (seed 003): 10 threads each repeatedly make a malloc with 50% probability, do
 * some work, and free a random live block with 50% probability; every allocation takes one of
 * 17 predefined sizes at random, and each thread's live blocks are capped so memory stays within
 * bounds. The seed reports malloc operations per second and the data segment's RSS; so does this
 * (malloc_per_s, and peak_rss_kb / rss_end_kb on the RESULT line), with all operations per second too. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PROG "mallbench"

/* The seed does not list its 17 sizes; these span small objects to a couple of pages, denser
 * at the small end where servers allocate most. */
static const size_t mallbench_sizes[17] = {8,   16,  24,  32,  48,   64,   96,   128, 192,
                                           256, 384, 512, 768, 1024, 2048, 4096, 8192};

static uint64_t opt_threads = 10, opt_iterations = 1000000, opt_max_live = 1000, opt_work = 10, opt_seed = 1;

typedef struct {
  uint64_t index, mallocs, frees, peak_live_bytes;
  double start, end;
  uint64_t work_sink; /* the busy loop's result, so it cannot be optimized away */
} worker_t;

typedef struct {
  void *p;
  size_t size;
} block_t;

static pthread_barrier_t start_line;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  rng_t rng;
  rng_seed(&rng, opt_seed, w->index);
  block_t *live = calloc(opt_max_live, sizeof *live);
  if (!live) bench_die(PROG, "out of memory for the live-block table");
  uint64_t n_live = 0, live_bytes = 0, sink = 0;
  pthread_barrier_wait(&start_line);
  w->start = now_s();
  for (uint64_t it = 0; it < opt_iterations; it++) {
    uint64_t r = rng_next(&rng);
    if ((r & 1) && n_live < opt_max_live) {
      size_t size = mallbench_sizes[rng_below(&rng, 17)];
      void *p = malloc(size);
      if (!p) bench_die(PROG, "malloc(%zu) returned NULL", size);
      memset(p, (int)it, size < 64 ? size : 64);
      live[n_live++] = (block_t){p, size};
      live_bytes += size;
      if (live_bytes > w->peak_live_bytes) w->peak_live_bytes = live_bytes;
      w->mallocs++;
    }
    for (uint64_t k = 0; k < opt_work; k++) sink += rng_next(&rng) >> 60; /* "do some work" */
    if ((r & 2) && n_live > 0) {
      uint64_t i = rng_below(&rng, n_live);
      free(live[i].p);
      live_bytes -= live[i].size;
      live[i] = live[--n_live];
      w->frees++;
    }
  }
  w->end = now_s();
  w->work_sink = sink;
  for (uint64_t i = 0; i < n_live; i++) free(live[i].p);
  free(live);
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 4096, "worker threads"},
    {"iterations", OPT_U64, &opt_iterations, 1, 1e12, "loop iterations per thread (each: maybe malloc, work, maybe free)"},
    {"max-live", OPT_U64, &opt_max_live, 1, 1e8, "live blocks per thread at most (keeps memory within bounds)"},
    {"work", OPT_U64, &opt_work, 0, 1e9, "busy-loop steps between malloc and free"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Honess's mallbench (HP): 50% malloc / work / 50% free over 17 sizes, bounded memory.",
              opts, argc, argv);

  worker_t *w = calloc(opt_threads, sizeof *w);
  pthread_t *tids = calloc(opt_threads, sizeof *tids);
  if (!w || !tids) bench_die(PROG, "out of memory");
  pthread_barrier_init(&start_line, NULL, (unsigned)opt_threads);
  for (uint64_t i = 0; i < opt_threads; i++) {
    w[i].index = i;
    if (pthread_create(&tids[i], NULL, worker_main, &w[i])) bench_die(PROG, "pthread_create failed");
  }
  for (uint64_t i = 0; i < opt_threads; i++) pthread_join(tids[i], NULL);
  double first = w[0].start, last = w[0].end;
  uint64_t mallocs = 0, frees = 0, peak_live = 0;
  for (uint64_t i = 0; i < opt_threads; i++) {
    if (w[i].start < first) first = w[i].start;
    if (w[i].end > last) last = w[i].end;
    mallocs += w[i].mallocs;
    frees += w[i].frees;
    peak_live += w[i].peak_live_bytes;
  }
  double elapsed = last - first;

  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("iterations", opt_iterations);
  result_u64("max_live", opt_max_live);
  result_u64("work", opt_work);
  result_u64("mallocs", mallocs);
  result_u64("frees", frees);
  result_u64("live_bytes_peak_sum", peak_live); /* sum of per-thread peaks: an upper bound on live data */
  result_f("elapsed_s", elapsed);
  result_f("malloc_per_s", mallocs / elapsed);
  result_f("ops_per_s", (mallocs + frees) / elapsed);
  result_end();
  free(w);
  free(tids);
  return 0;
}
