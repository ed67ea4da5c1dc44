/* thread_churn.c - many short-lived threads, one after another: each allocates --kilobytes of
 * small objects, frees them and exits. A thread cache or arena that is not returned when its
 * thread exits shows up as RSS that grows with the number of threads, though at most one
 * thread's data is ever live. Reports RSS at the start, after the first thread, and at the end. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PROG "thread-churn"

static uint64_t opt_threads = 10000, opt_kilobytes = 1024, opt_size = 64;

typedef struct obj_s {
  struct obj_s *next;
} obj_t;

static void *churn_main(void *arg) {
  obj_t *head = NULL;
  for (uint64_t bytes = 0; bytes < opt_kilobytes << 10; bytes += opt_size) {
    obj_t *o = malloc(opt_size);
    if (!o) bench_die(PROG, "malloc(%llu) returned NULL", (unsigned long long)opt_size);
    memset(o, 0x3c, opt_size);
    o->next = head;
    head = o;
  }
  while (head) {
    obj_t *next = head->next;
    free(head);
    head = next;
  }
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 1e7, "threads created and joined one after another"},
    {"kilobytes", OPT_U64, &opt_kilobytes, 1, 1 << 30, "KiB each thread allocates (then frees)"},
    {"size", OPT_U64, &opt_size, 8, 1 << 20, "object size in bytes"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Thread churn: sequential short-lived threads that allocate and free; does RSS grow?", opts, argc, argv);

  uint64_t rss_start = rss_now_kb(), rss_first = 0;
  double start = now_s();
  for (uint64_t i = 0; i < opt_threads; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, churn_main, NULL)) bench_die(PROG, "pthread_create failed at thread %llu", (unsigned long long)i);
    pthread_join(t, NULL);
    if (i == 0) rss_first = rss_now_kb();
  }
  double elapsed = now_s() - start;
  uint64_t rss_end = rss_now_kb();

  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("kilobytes", opt_kilobytes);
  result_u64("size", opt_size);
  result_u64("rss_start_kb", rss_start);
  result_u64("rss_first_kb", rss_first);
  result_f("rss_growth_kb", (double)rss_end - (double)rss_first);
  result_f("elapsed_s", elapsed);
  result_f("threads_per_s", opt_threads / elapsed);
  result_end();
  return 0;
}
