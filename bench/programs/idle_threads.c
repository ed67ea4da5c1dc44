/* idle_threads.c - does memory held in the caches of threads that stop allocating come back?
 * W workers each churn small objects of mixed sizes (rounds of "allocate up to the live target,
 * free everything"), so whatever per-thread cache the allocator keeps is full, then park on a
 * condition variable: idle, but alive. The main thread then samples RSS for --duration seconds,
 * doing a little allocation of its own between samples unless --quiet-main, since some allocators
 * return memory only when called. Reported: RSS before the workers, when all went idle, at the
 * last sample, the least seen, how long RSS took to shed 90% of the idle excess, and the series.
 *
 * The process ends with exit() while the workers still sit in their caches' memory, never
 * joined: an allocator's statistics at exit (qmalloc's QMALLOC_STATS) then describe the idle
 * threads' caches rather than caches already returned by thread exit. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "idle-threads"

/* The series goes on the one RESULT line (4 KiB in all), so long runs are thinned to at most
 * this many points; reclaim time and minimum still use every sample. */
#define SERIES_MAX 120
/* Main thread's work between samples: enough calls to drive an allocator that purges from its
 * malloc/free paths, too few (and freed at once) to add to RSS on their own. */
#define MAIN_OPS_PER_SAMPLE 4096
#define MAIN_SLOTS 64

static uint64_t opt_threads = 8, opt_kilobytes = 4096, opt_rounds = 20, opt_min_size = 16, opt_max_size = 2048,
                opt_interval_ms = 250, opt_seed = 1;
static double opt_duration = 15.0;
static bool opt_quiet_main = false;

typedef struct obj_s {
  struct obj_s *next;
} obj_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t all_idle_cv = PTHREAD_COND_INITIALIZER; /* main waits here for idle == threads */
static pthread_cond_t park_cv = PTHREAD_COND_INITIALIZER;     /* never signalled: workers park on it */
static uint64_t idle_workers;

/* Sizes spread evenly over the octaves [min, 2min), [2min, 4min), ... up to max (the last octave
 * runs to max itself), then uniformly within one: every size class in the range sees traffic, and
 * small objects are as common as in real heaps rather than outnumbered by the large end as a
 * uniform size would make them. */
static uint64_t octaves; /* set in main: index of the last octave, the one that runs to max */

static size_t pick_size(rng_t *rng) {
  uint64_t i = rng_below(rng, octaves + 1);
  uint64_t lo = opt_min_size << i;
  uint64_t hi = i == octaves ? opt_max_size : 2 * lo - 1;
  return (size_t)(lo + rng_below(rng, hi - lo + 1));
}

static void *worker_main(void *arg) {
  rng_t rng;
  rng_seed(&rng, opt_seed, (uint64_t)(uintptr_t)arg);
  for (uint64_t round = 0; round < opt_rounds; round++) {
    obj_t *head = NULL;
    for (uint64_t live = 0; live < opt_kilobytes << 10;) {
      size_t size = pick_size(&rng);
      obj_t *o = malloc(size);
      if (!o) bench_die(PROG, "malloc(%zu) returned NULL with %llu bytes live", size, (unsigned long long)live);
      memset(o, 0x6b, size); /* resident, so RSS sees it */
      o->next = head;
      head = o;
      live += size;
    }
    while (head) {
      obj_t *next = head->next;
      free(head);
      head = next;
    }
  }
  pthread_mutex_lock(&lock);
  if (++idle_workers == opt_threads) pthread_cond_signal(&all_idle_cv);
  /* Parked until the process exits; the loop only absorbs spurious wakeups. */
  for (;;) pthread_cond_wait(&park_cv, &lock);
  return NULL;
}

/* A burst of malloc/free in random slots, all freed before returning, so the main thread keeps
 * nothing live between samples. */
static void main_activity(rng_t *rng) {
  void *slots[MAIN_SLOTS] = {0};
  for (int i = 0; i < MAIN_OPS_PER_SAMPLE; i++) {
    uint64_t k = rng_below(rng, MAIN_SLOTS);
    if (slots[k]) {
      free(slots[k]);
      slots[k] = NULL;
    } else {
      size_t size = pick_size(rng);
      slots[k] = malloc(size);
      if (!slots[k]) bench_die(PROG, "malloc(%zu) returned NULL in the main thread", size);
      memset(slots[k], 0x2d, size < 64 ? size : 64);
    }
  }
  for (int k = 0; k < MAIN_SLOTS; k++) free(slots[k]);
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 4096, "worker threads, left idle (not exited) after their churn"},
    {"kilobytes", OPT_U64, &opt_kilobytes, 1, 1 << 24, "KiB each worker holds live at the top of a round"},
    {"rounds", OPT_U64, &opt_rounds, 1, 1e6, "rounds of 'allocate up to the live target, free all' per worker"},
    {"min-size", OPT_U64, &opt_min_size, 8, 1 << 20, "smallest object in bytes"},
    {"max-size", OPT_U64, &opt_max_size, 8, 1 << 20, "largest object in bytes"},
    {"duration", OPT_DOUBLE, &opt_duration, 0.001, 86400, "seconds to watch RSS once all workers are idle"},
    {"interval-ms", OPT_U64, &opt_interval_ms, 1, 3600000, "milliseconds between RSS samples"},
    {"quiet-main", OPT_FLAG, &opt_quiet_main, 0, 0, "main thread only sleeps between samples (no malloc/free)"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Workers churn, then sit idle: does the memory in their thread caches return?", opts, argc, argv);
  if (opt_min_size > opt_max_size) bench_usage_error(PROG, "--min-size exceeds --max-size");
  if (opt_duration * 1000.0 < (double)opt_interval_ms)
    bench_usage_error(PROG, "--duration (%g s) is shorter than one --interval-ms (%llu ms)", opt_duration,
                      (unsigned long long)opt_interval_ms);

  while ((opt_min_size << (octaves + 1)) < opt_max_size) octaves++;
  uint64_t intervals = (uint64_t)(opt_duration * 1000.0 / (double)opt_interval_ms);
  uint64_t stride = intervals / SERIES_MAX + 1; /* every stride-th sample goes into the series */
  static uint64_t series[SERIES_MAX];
  uint64_t series_len = 0;
  rng_t main_rng;
  rng_seed(&main_rng, opt_seed, opt_threads);

  uint64_t rss_start = rss_now_kb();
  double start = now_s();
  for (uint64_t i = 0; i < opt_threads; i++) {
    pthread_t t; /* never joined (see the end of main) */
    if (pthread_create(&t, NULL, worker_main, (void *)(uintptr_t)i))
      bench_die(PROG, "pthread_create failed at worker %llu", (unsigned long long)i);
  }
  pthread_mutex_lock(&lock);
  while (idle_workers < opt_threads) pthread_cond_wait(&all_idle_cv, &lock);
  pthread_mutex_unlock(&lock);
  double idle_at = now_s();
  uint64_t rss_idle = rss_now_kb();

  /* Below this, 90% of what the workers added is back: start + 10% of the idle excess. */
  double threshold = (double)rss_start + 0.1 * ((double)rss_idle - (double)rss_start);
  double reclaim_ms = -1;
  uint64_t rss_min = rss_idle, rss_last = rss_idle;
  for (uint64_t k = 0; k <= intervals; k++) {
    if (k > 0) {
      if (!opt_quiet_main) main_activity(&main_rng);
      /* Absolute deadlines, so the activity's own time does not stretch the schedule. */
      double wait = idle_at + (double)k * (double)opt_interval_ms / 1000.0 - now_s();
      if (wait > 0) sleep_s(wait);
      rss_last = rss_now_kb();
    }
    double at_ms = (now_s() - idle_at) * 1000.0;
    if (rss_last < rss_min) rss_min = rss_last;
    if (reclaim_ms < 0 && (double)rss_last < threshold) reclaim_ms = at_ms;
    if (k % stride == 0) series[series_len++] = rss_last;
  }
  double watch_s = now_s() - idle_at;

  /* Comma-separated: one word on the RESULT line. */
  char series_text[SERIES_MAX * 21 + 1];
  size_t len = 0;
  for (uint64_t i = 0; i < series_len; i++)
    len += (size_t)snprintf(series_text + len, sizeof series_text - len, "%s%llu", i ? "," : "",
                            (unsigned long long)series[i]);

  int64_t excess = (int64_t)rss_idle - (int64_t)rss_start;
  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("kilobytes", opt_kilobytes);
  result_u64("rounds", opt_rounds);
  result_u64("min_size", opt_min_size);
  result_u64("max_size", opt_max_size);
  result_f("duration", opt_duration);
  result_u64("interval_ms", opt_interval_ms);
  result_u64("quiet_main", opt_quiet_main);
  result_u64("main_ops_per_sample", opt_quiet_main ? 0 : MAIN_OPS_PER_SAMPLE);
  result_u64("samples", intervals + 1);
  result_u64("rss_start_kb", rss_start);
  result_u64("rss_idle_kb", rss_idle);
  result_u64("rss_last_kb", rss_last);
  result_u64("rss_min_kb", rss_min);
  result_f("reclaim_ms", reclaim_ms < 0 ? -1 : reclaim_ms);
  /* Share of the idle excess still resident at the last sample; 0 when the workers left none. */
  result_f("kept_pct", excess > 0 ? 100.0 * ((double)rss_last - (double)rss_start) / (double)excess : 0);
  result_f("churn_s", idle_at - start);
  result_f("watch_s", watch_s);
  result_f("elapsed_s", now_s() - start);
  result_u64("series_step_ms", stride * opt_interval_ms);
  result_str("rss_series_kb", series_text);
  result_end();
  /* Not joined: the workers' caches must still be there when the allocator's exit hooks run. */
  exit(0);
}
