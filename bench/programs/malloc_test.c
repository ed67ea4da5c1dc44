/* malloc_test.c - benchmark 1 of Lever & Boreham (seed 000 section 4.1, seed 001 appendix B).
 *
 * Each worker times a null loop (two calls of an empty function per iteration) and a loop of
 * malloc(size) + free(); the per-worker figure is the second time minus the first, as in the
 * paper. The two loops take turns, in WORKER_ROUNDS rounds of a share of the iterations each
 * (run_worker). Workers are threads sharing one heap, or with --processes N, N forked processes with a
 * heap each: the paper's "two threads should do as well as two processes" comparison. Thread
 * counts past the CPU count are allowed on purpose (the paper went to 48). All workers start
 * together from a barrier so they really contend. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROG "malloc-test"

static uint64_t opt_size = 512, opt_iterations = 1000000, opt_threads = 1, opt_processes = 0;

typedef struct {
  double null_s;      /* the empty loop */
  double adjusted_s;  /* malloc loop minus the empty loop */
  double start, end;  /* CLOCK_MONOTONIC, system-wide, so comparable across processes */
} worker_times_t;

/* The null loop's body: noinline and opaque, so the loop costs what the paper's dummy() did. */
__attribute__((noinline)) static void *dummy(uint64_t i) {
  __asm__ volatile("" : : "r"(i) : "memory");
  return NULL;
}

/* The null loop and the malloc loop take turns, each round timed: with more workers than CPUs a
 * worker is preempted at moments that have nothing to do with what it runs, and where the null
 * loop ran whole before the malloc loop, a worker preempted during one and not the other came out
 * with a time far off, often below zero (mtbench's quick preset: medians from 0.45 to 1.63 of
 * another allocator's at 6 to 24 threads on 2 CPUs, some negative). Taking turns, the
 * preemptions fall on both loops in proportion to their lengths, which is what the subtraction
 * assumes. A round is a few milliseconds at the presets' sizes, about a scheduler slice. */
#define WORKER_ROUNDS 64

static worker_times_t run_worker(void) {
  const size_t size = opt_size;
  const uint64_t n = opt_iterations;
  worker_times_t t = {0};
  double malloc_s = 0;

  t.start = now_s();
  for (uint64_t round = 0; round < WORKER_ROUNDS; round++) {
    uint64_t from = n * round / WORKER_ROUNDS, to = n * (round + 1) / WORKER_ROUNDS;
    double null_start = now_s();
    for (uint64_t i = from; i < to; i++) {
      escape(dummy(i));
      escape(dummy(i));
    }
    double malloc_start = now_s();
    for (uint64_t i = from; i < to; i++) {
      void *p = malloc(size);
      if (!p) bench_die(PROG, "malloc(%zu) returned NULL", size);
      escape(p);
      free(p);
    }
    double round_end = now_s();
    t.null_s += malloc_start - null_start;
    malloc_s += round_end - malloc_start;
  }
  t.end = now_s();
  t.adjusted_s = malloc_s - t.null_s;
  return t;
}

/* ---- threads mode ------------------------------------------------------------------------- */

static pthread_barrier_t start_line;

static void *thread_main(void *arg) {
  pthread_barrier_wait(&start_line);
  *(worker_times_t *)arg = run_worker();
  return NULL;
}

static void run_threads(worker_times_t *times, uint64_t n) {
  pthread_t *tids = calloc(n, sizeof *tids);
  if (!tids) bench_die(PROG, "out of memory for %llu thread ids", (unsigned long long)n);
  pthread_barrier_init(&start_line, NULL, (unsigned)n + 1);
  for (uint64_t i = 0; i < n; i++)
    if (pthread_create(&tids[i], NULL, thread_main, &times[i]))
      bench_die(PROG, "pthread_create failed for thread %llu", (unsigned long long)i);
  pthread_barrier_wait(&start_line);
  for (uint64_t i = 0; i < n; i++) pthread_join(tids[i], NULL);
  pthread_barrier_destroy(&start_line);
  free(tids);
}

/* ---- processes mode ----------------------------------------------------------------------- */

/* Children block on a "go" pipe until all exist, then send their times back on a result pipe
 * (one fixed-size record each, well under PIPE_BUF, so writes never interleave). */
static void run_processes(worker_times_t *times, uint64_t n) {
  int go[2], back[2];
  if (pipe(go) || pipe(back)) bench_die(PROG, "pipe failed");
  for (uint64_t i = 0; i < n; i++) {
    pid_t pid = fork();
    if (pid < 0) bench_die(PROG, "fork failed for process %llu", (unsigned long long)i);
    if (pid == 0) {
      close(go[1]);
      close(back[0]);
      char c;
      if (read(go[0], &c, 1) < 0) _exit(1);
      worker_times_t t = run_worker();
      _exit(write(back[1], &t, sizeof t) == (ssize_t)sizeof t ? 0 : 1);
    }
  }
  close(go[0]);
  close(back[1]);
  close(go[1]); /* EOF on the go pipe releases every child at once */
  for (uint64_t i = 0; i < n; i++) {
    if (read(back[0], &times[i], sizeof times[i]) != (ssize_t)sizeof times[i])
      bench_die(PROG, "a worker process died before reporting");
  }
  int failed = 0;
  for (uint64_t i = 0; i < n; i++) {
    int status;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
  }
  close(back[0]);
  if (failed) bench_die(PROG, "%d worker processes failed", failed);
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"size", OPT_U64, &opt_size, 1, 1ULL << 30, "bytes per request"},
    {"iterations", OPT_U64, &opt_iterations, 1, 1e12, "malloc+free pairs per worker"},
    {"threads", OPT_U64, &opt_threads, 1, 4096, "worker threads sharing one heap"},
    {"processes", OPT_U64, &opt_processes, 0, 4096, "fork N single-threaded worker processes instead (0: threads mode)"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Benchmark 1 (Lever & Boreham): malloc/free loop timed per worker, null loop subtracted.",
              opts, argc, argv);
  if (opt_processes && opt_threads != 1)
    bench_usage_error(PROG, "--processes and --threads are exclusive (each process runs one worker)");

  uint64_t workers = opt_processes ? opt_processes : opt_threads;
  /* Shared with the children through fork's copy: only the parent's copy is filled in. */
  worker_times_t *times = calloc(workers, sizeof *times);
  if (!times) bench_die(PROG, "out of memory");
  if (opt_processes) run_processes(times, workers);
  else run_threads(times, workers);

  /* Wall time from the first worker's start to the last one's end: the main thread may sit
   * preempted behind its workers, so its own clock would be wrong past the CPU count. */
  double sum = 0, null_sum = 0, lo = times[0].adjusted_s, hi = times[0].adjusted_s;
  double first = times[0].start, last = times[0].end;
  for (uint64_t i = 0; i < workers; i++) {
    if (times[i].start < first) first = times[i].start;
    if (times[i].end > last) last = times[i].end;
    sum += times[i].adjusted_s;
    null_sum += times[i].null_s;
    if (times[i].adjusted_s < lo) lo = times[i].adjusted_s;
    if (times[i].adjusted_s > hi) hi = times[i].adjusted_s;
  }
  result_begin(PROG);
  result_str("mode", opt_processes ? "processes" : "threads");
  result_u64("workers", workers);
  result_u64("size", opt_size);
  result_u64("iterations", opt_iterations);
  result_u64("cpus", (uint64_t)online_cpus());
  double elapsed = last - first;
  result_f("elapsed_s", elapsed);
  result_f("worker_mean_s", sum / workers);
  result_f("worker_min_s", lo);
  result_f("worker_max_s", hi);
  result_f("null_mean_s", null_sum / workers);
  result_f("pairs_per_s", (double)workers * opt_iterations / elapsed);
  result_end();
  free(times);
  return 0;
}
