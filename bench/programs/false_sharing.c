/* false_sharing.c - benchmark 3 of Lever & Boreham (seed 000 section 4.3).
 *
 * The main thread allocates n objects of k bytes one after another with malloc and hands one to
 * each of n threads (n <= online CPUs, so every thread has a CPU to itself). Each thread writes the
 * first and the last byte of its object W times. If the allocator placed two threads' objects
 * in one cache line, the line ping-pongs between CPUs and the loop slows down. The same loop
 * then runs on a reference layout that cannot share lines (each object at the start of its own
 * 128-byte block of an mmap'd region: 128, not 64, so the adjacent-line prefetcher cannot pair
 * them up either), and the RESULT line carries both times and their ratio, the slowdown.
 * shared_objects counts objects whose first or last byte sits on a line another object touches:
 * the cause, next to the effect. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PROG "false-sharing"
#define REFERENCE_STRIDE_ALIGN 128

static uint64_t opt_threads = 2, opt_size = 8, opt_writes = 100000000;

typedef struct {
  char *object;
  double start, end;
} writer_t;

static pthread_barrier_t start_line;

static void *writer_main(void *arg) {
  writer_t *w = arg;
  volatile char *front = w->object;
  volatile char *back = w->object + opt_size - 1;
  pthread_barrier_wait(&start_line);
  w->start = now_s();
  for (uint64_t i = 0; i < opt_writes; i++) {
    *front = (char)i;
    *back = (char)i;
  }
  w->end = now_s();
  return NULL;
}

/* Runs one writer per object; returns wall time from the first start to the last end. */
static double run_writers(char **objects, uint64_t n) {
  writer_t *w = calloc(n, sizeof *w);
  pthread_t *tids = calloc(n, sizeof *tids);
  if (!w || !tids) bench_die(PROG, "out of memory");
  pthread_barrier_init(&start_line, NULL, (unsigned)n);
  for (uint64_t i = 0; i < n; i++) {
    w[i].object = objects[i];
    if (pthread_create(&tids[i], NULL, writer_main, &w[i])) bench_die(PROG, "pthread_create failed");
  }
  for (uint64_t i = 0; i < n; i++) pthread_join(tids[i], NULL);
  pthread_barrier_destroy(&start_line);
  double first = w[0].start, last = w[0].end;
  for (uint64_t i = 1; i < n; i++) {
    if (w[i].start < first) first = w[i].start;
    if (w[i].end > last) last = w[i].end;
  }
  free(w);
  free(tids);
  return last - first;
}

static uint64_t count_shared(char **objects, uint64_t n, uint64_t line) {
  uint64_t shared = 0;
  for (uint64_t i = 0; i < n; i++) {
    uintptr_t lines_i[2] = {(uintptr_t)objects[i] / line, ((uintptr_t)objects[i] + opt_size - 1) / line};
    bool hit = false;
    for (uint64_t j = 0; j < n && !hit; j++) {
      if (j == i) continue;
      uintptr_t first_j = (uintptr_t)objects[j] / line, last_j = ((uintptr_t)objects[j] + opt_size - 1) / line;
      for (int e = 0; e < 2; e++)
        if (lines_i[e] == first_j || lines_i[e] == last_j) hit = true;
    }
    shared += hit;
  }
  return shared;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 4096, "writer threads, at most the number of online CPUs"},
    {"size", OPT_U64, &opt_size, 1, 1 << 20, "object size in bytes"},
    {"writes", OPT_U64, &opt_writes, 1, 1e12, "front+back write pairs per thread"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Benchmark 3 (Lever & Boreham): false cache-line sharing between heap objects.",
              opts, argc, argv);
  long cpus = online_cpus();
  if (opt_threads > (uint64_t)cpus)
    bench_usage_error(PROG, "--threads %llu exceeds the %ld online CPUs (the benchmark needs a CPU per writer)",
                      (unsigned long long)opt_threads, cpus);
  long line = sysconf(_SC_LEVEL1_DCACHE_LINESIZE);
  if (line <= 0) line = 64;

  char **heap_objects = calloc(opt_threads, sizeof *heap_objects);
  char **ref_objects = calloc(opt_threads, sizeof *ref_objects);
  if (!heap_objects || !ref_objects) bench_die(PROG, "out of memory");
  /* Allocated back to back by this thread, as the paper's main thread did. */
  for (uint64_t i = 0; i < opt_threads; i++) {
    heap_objects[i] = malloc(opt_size);
    if (!heap_objects[i]) bench_die(PROG, "malloc(%llu) returned NULL", (unsigned long long)opt_size);
    memset(heap_objects[i], 0, opt_size);
  }
  uint64_t stride = (opt_size + REFERENCE_STRIDE_ALIGN - 1) / REFERENCE_STRIDE_ALIGN * REFERENCE_STRIDE_ALIGN;
  char *region = mmap(NULL, stride * opt_threads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) bench_die(PROG, "mmap of the reference region failed");
  for (uint64_t i = 0; i < opt_threads; i++) ref_objects[i] = region + i * stride;

  double heap_s = run_writers(heap_objects, opt_threads);
  double ref_s = run_writers(ref_objects, opt_threads);

  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("size", opt_size);
  result_u64("writes", opt_writes);
  result_u64("line", (uint64_t)line);
  result_u64("shared_objects", count_shared(heap_objects, opt_threads, (uint64_t)line));
  result_f("elapsed_s", heap_s);
  result_f("ref_elapsed_s", ref_s);
  result_f("slowdown", heap_s / ref_s);
  result_end();

  for (uint64_t i = 0; i < opt_threads; i++) free(heap_objects[i]);
  munmap(region, stride * opt_threads);
  free(heap_objects);
  free(ref_objects);
  return 0;
}
