/* two_phase.c - the memory blow-up TCMalloc's paper describes for ptmalloc2 (seed 002): a first
 * phase allocates ~300 MB of small objects and frees them all, then a second phase, in another
 * thread, allocates as much again. An allocator that cannot move memory between threads' arenas
 * needs twice the memory. Then: how much RSS is left after the second phase frees everything,
 * after a pause with no allocator call at all (--sleep; rss_idle_kb, and idle_pct of the peak:
 * what an allocator that releases memory in the background, on a timer, gives back), then after
 * one small malloc/free (for those that return memory only when called), and after
 * malloc_trim(0), looked up with dlsym so that allocators without it still run (trim_found=0).
 *
 * Thread A stays alive, idle, until B has finished, as a server's first-phase threads would:
 * an allocator that ties memory to a thread's arena cannot hand A's freed memory to B.
 * Objects hold the list that links them, so the bookkeeping adds no memory of its own. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>

#define PROG "two-phase"

static uint64_t opt_megabytes = 300, opt_min_size = 16, opt_max_size = 256, opt_seed = 1;
static double opt_sleep = 1.0;

typedef struct obj_s {
  struct obj_s *next;
} obj_t;

typedef struct {
  uint64_t stream;
  uint64_t rss_full_kb; /* RSS with this phase's objects all live */
  sem_t freed;          /* posted when the phase has freed everything */
  sem_t may_exit;       /* the phase's thread lingers until this is posted */
} phase_t;

/* Allocates opt_megabytes of objects, notes the RSS, then frees them all. */
static void *phase_main(void *arg) {
  phase_t *ph = arg;
  rng_t rng;
  rng_seed(&rng, opt_seed, ph->stream);
  obj_t *head = NULL;
  for (uint64_t bytes = 0; bytes < opt_megabytes << 20;) {
    size_t size = opt_min_size + rng_below(&rng, opt_max_size - opt_min_size + 1);
    obj_t *o = malloc(size);
    if (!o) bench_die(PROG, "malloc(%zu) returned NULL after %llu bytes", size, (unsigned long long)bytes);
    memset(o, 0x5a, size);
    o->next = head;
    head = o;
    bytes += size;
  }
  ph->rss_full_kb = rss_now_kb();
  while (head) {
    obj_t *next = head->next;
    free(head);
    head = next;
  }
  sem_post(&ph->freed);
  sem_wait(&ph->may_exit);
  return NULL;
}

/* Starts a phase's thread and returns once it has freed everything (the thread lingers). */
static pthread_t start_phase(phase_t *ph) {
  pthread_t t;
  sem_init(&ph->freed, 0, 0);
  sem_init(&ph->may_exit, 0, 0);
  if (pthread_create(&t, NULL, phase_main, ph)) bench_die(PROG, "pthread_create failed");
  sem_wait(&ph->freed);
  return t;
}

static void end_phase(phase_t *ph, pthread_t t) {
  sem_post(&ph->may_exit);
  pthread_join(t, NULL);
}

/* Which library's malloc_trim dlsym found: with a preloaded allocator that lacks one, it is
 * glibc's, which then trims a heap the program no longer uses. */
static const char *library_of(void *fn) {
  Dl_info info;
  if (!fn || !dladdr(fn, &info) || !info.dli_fname) return "none";
  const char *slash = strrchr(info.dli_fname, '/');
  return slash ? slash + 1 : info.dli_fname;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"megabytes", OPT_U64, &opt_megabytes, 1, 1 << 20, "MiB each phase allocates"},
    {"min-size", OPT_U64, &opt_min_size, 8, 1 << 20, "smallest object in bytes"},
    {"max-size", OPT_U64, &opt_max_size, 8, 1 << 20, "largest object in bytes"},
    {"sleep", OPT_DOUBLE, &opt_sleep, 0, 3600, "seconds to wait after the second phase frees"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Two phases in two threads, each allocating and freeing the same amount: does phase B reuse A's memory?",
              opts, argc, argv);
  if (opt_min_size > opt_max_size) bench_usage_error(PROG, "--min-size exceeds --max-size");

  uint64_t rss_start = rss_now_kb();
  phase_t a = {.stream = 0}, b = {.stream = 1};
  double start = now_s();
  pthread_t ta = start_phase(&a);
  uint64_t rss_after_a = rss_now_kb();
  pthread_t tb = start_phase(&b);
  uint64_t rss_after_b = rss_now_kb();
  end_phase(&b, tb);
  end_phase(&a, ta);
  double elapsed = now_s() - start;
  /* Nothing between the frees and this reading calls the allocator: thread exit and join,
   * nanosleep and reading /proc/self/statm (through open/read, not stdio) do not. */
  sleep_s(opt_sleep);
  uint64_t rss_idle = rss_now_kb();
  void *p = malloc(32);
  escape(p);
  free(p);
  uint64_t rss_after_sleep = rss_now_kb();
  int (*trim)(size_t) = (int (*)(size_t))dlsym(RTLD_DEFAULT, "malloc_trim");
  if (trim) trim(0);
  uint64_t rss_after_trim = rss_now_kb();

  result_begin(PROG);
  result_u64("megabytes", opt_megabytes);
  result_u64("min_size", opt_min_size);
  result_u64("max_size", opt_max_size);
  result_f("sleep_s", opt_sleep);
  result_u64("rss_start_kb", rss_start);
  result_u64("rss_a_full_kb", a.rss_full_kb);
  result_u64("rss_after_a_kb", rss_after_a);
  result_u64("rss_b_full_kb", b.rss_full_kb);
  result_u64("rss_after_b_kb", rss_after_b);
  result_u64("rss_idle_kb", rss_idle);
  /* The kernel updates VmHWM lazily (per-thread RSS counters), so the readings taken here may
   * top it by a few pages: the peak is the highest of all. */
  uint64_t peak = peak_rss_kb();
  uint64_t readings[] = {a.rss_full_kb, b.rss_full_kb, rss_after_a, rss_after_b, rss_idle};
  for (size_t i = 0; i < sizeof readings / sizeof readings[0]; i++)
    if (readings[i] > peak) peak = readings[i];
  result_f("idle_pct", peak ? 100.0 * rss_idle / peak : 0);
  result_u64("rss_after_sleep_kb", rss_after_sleep);
  result_u64("trim_found", trim != NULL);
  result_str("trim_from", library_of((void *)trim));
  result_u64("rss_after_trim_kb", rss_after_trim);
  result_f("elapsed_s", elapsed);
  result_end();
  return 0;
}
