/* A thread whose first allocator call is made by a pthread key's destructor in the last of the
 * PTHREAD_DESTRUCTOR_ITERATIONS rounds glibc runs as the thread ends (a destructor that sets its
 * value again is called again, POSIX; this one does so until the last round). No round follows,
 * so qmalloc's own key's destructor never ran for that thread: its cache stayed registered, in TLS
 * memory glibc then reused for the next thread, and the registry's list looped on itself. Every
 * statistics call and idle scan then hung, and a process whose main thread ended with
 * pthread_exit never ended. Such a thread now runs uncached (src/callers.c). Cases, each in a
 * child of its own, watched (a hang is a failure after 30 s, not a timing assumption):
 *  - next: the next thread (the same stack and TLS) allocates; malloc_stats and qm_stats_print
 *    must return, counting the live caches right (this thread's and the main one's);
 *  - busy: four threads allocate for a while after it, then the process exits;
 *  - main_exit: the main thread allocates, then ends with pthread_exit: the process must end. */
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qmalloc.h"
#include "testutil.h"

static pthread_key_t rearmed_key;
static __thread int rounds;
static volatile int busy_stop;

static void rearming_destructor(void *value) {
  if (++rounds < PTHREAD_DESTRUCTOR_ITERATIONS) {
    pthread_setspecific(rearmed_key, value);
    return;
  }
  void *volatile p = malloc(40); /* the last round: this thread's first allocator call */
  free(p);
}

static void *exiting_worker(void *arg) {
  (void)arg;
  pthread_setspecific(rearmed_key, (void *)1); /* no allocation in the thread's body */
  return NULL;
}

static void run_exiting_worker(void) {
  pthread_t t;
  pthread_create(&t, NULL, exiting_worker, NULL);
  pthread_join(t, NULL);
}

static void *busy(void *arg) {
  (void)arg;
  while (!busy_stop) {
    void *volatile p = malloc(100);
    free(p);
  }
  return NULL;
}


static int case_next(void) {
  run_exiting_worker();
  pthread_t t;
  pthread_create(&t, NULL, busy, NULL); /* glibc gives it the worker's stack and TLS */
  tu_sleep_ms(100);
  int saved = dup(2), null = open("/dev/null", O_WRONLY);
  dup2(null, 2); /* the reports themselves are not the point */
  malloc_stats();
  dup2(saved, 2);
  long long live = tu_stats_field("threads");
  CHECK_MSG(live == 2, "%lld thread caches live, expected 2 (the main thread's and the busy one's)", live);
  busy_stop = 1;
  pthread_join(t, NULL);
  return tu_summary("api-key_last_round (next)");
}

static int case_busy(void) {
  run_exiting_worker();
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, busy, NULL);
  tu_sleep_ms(1500); /* long enough for the releaser's idle scans (twice a second) */
  long long live = tu_stats_field("threads");
  CHECK_MSG(live == 5, "%lld thread caches live, expected 5 (the main thread's and the busy ones')", live);
  busy_stop = 1;
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  return tu_summary("api-key_last_round (busy)");
}

static int case_main_exit(void) {
  run_exiting_worker();
  for (int i = 0; i < 100000; i++) { /* slow paths: the releaser starts */
    void *volatile p = malloc(5000);
    free(p);
  }
  fflush(stdout);
  pthread_exit(NULL); /* the process ends with its last thread: exit status 0 */
}

int main(void) {
#if !defined(__x86_64__)
  /* The check walks the stack with the heap profiler's x86-64 unwinder (src/callers.c). */
  printf("api-key_last_round: skipped: a thread's first call in its last destructor round is found on x86-64 only\n");
  return 77;
#endif
  pthread_key_create(&rearmed_key, rearming_destructor);
  int (*const cases[])(void) = {case_next, case_busy, case_main_exit};
  const char *const names[] = {"next", "busy", "main_exit"};
  return tu_run_cases("api-key_last_round", cases, names, sizeof cases / sizeof cases[0], 30);
}
