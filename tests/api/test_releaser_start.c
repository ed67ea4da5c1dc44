/* The background releaser is never started by a free the dynamic loader makes (src/release.c):
 * glibc frees a joined thread's TLS (its DTV, the blocks of a dlopen'd module's TLS) from ld.so
 * while it holds its stack cache's lock, and pthread_create takes that lock: a releaser started
 * from such a free hung the process. Each case runs in a child of its own, watched (a hang is a failure, after a
 * generous 60 s: not a timing assumption):
 *  - fork: a parent with a releaser forks from a thread that never allocated; the child (which asks
 *    for a releaser of its own) joins a thread, and glibc, its stack cache over 40 MiB with the
 *    parent's inherited stacks, frees their DTVs: the child's first allocator calls. It must end,
 *    and an allocation must then start its releaser;
 *  - frees: one thread allocates 64 MiB of large blocks and frees them, its last allocator calls;
 *    the program's own frees start the releaser, and RSS must come back to within 12 MiB of the
 *    start with no further call (bounded by 20 s; the decay is 250 ms). Had only allocating calls
 *    started it, the retain cap would keep all 64 MiB.
 * The third case, a dlopen'd module's TLS, runs preloaded: preload-releaser_tls. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define PARKED 6
#define STACK_BYTES ((size_t)8 << 20) /* 6 of them: over glibc's 40 MiB stack cache in the child */

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Whether the releaser thread is in this process, waiting up to 5 s for it. */
static int releaser_seen(void) {
  for (int tries = 0; tries < 500; tries++) {
    if (tu_thread_named("qmalloc-release")) return 1;
    sleep_ms(10);
  }
  return 0;
}

/* ---- fork ---- */
static pthread_barrier_t parked_barrier;

static void *parked(void *arg) {
  void *volatile p = malloc(100); /* a thread cache each: the parent asks for its releaser */
  free(p);
  pthread_barrier_wait(&parked_barrier); /* alive at the fork: its stack is the child's to cache */
  pthread_barrier_wait(&parked_barrier);
  return arg;
}

static void *nothing(void *arg) { return arg; }

static void *forker(void *arg) {
  (void)arg; /* no allocator call on this thread before the fork: no thread cache */
  pid_t pid = fork();
  if (pid == 0) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, STACK_BYTES);
    if (pthread_create(&t, &attr, nothing, NULL) != 0) _exit(2);
    pthread_join(t, NULL); /* glibc trims its stack cache here, freeing the DTVs it held */
    void *volatile big = malloc(1 << 20); /* an allocating call: the child's releaser starts */
    free(big);
    _exit(releaser_seen() ? 0 : 3);
  }
  int status = 0;
  for (int waited = 0; waitpid(pid, &status, WNOHANG) == 0; waited++) {
    if (waited == 6000) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return (void *)"the forked child hung (60 s)";
    }
    sleep_ms(10);
  }
  if (!WIFEXITED(status)) return (void *)"the forked child was killed by a signal";
  if (WEXITSTATUS(status) == 3) return (void *)"the forked child's allocation did not start its releaser";
  return WEXITSTATUS(status) == 0 ? NULL : (void *)"the forked child failed";
}

static int case_fork(void) {
  pthread_barrier_init(&parked_barrier, NULL, PARKED + 1);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, STACK_BYTES);
  pthread_t threads[PARKED], f;
  for (int i = 0; i < PARKED; i++) pthread_create(&threads[i], &attr, parked, NULL);
  pthread_barrier_wait(&parked_barrier);
  void *volatile big = malloc(1 << 20); /* an allocating call after the request: the start */
  free(big);
  CHECK_MSG(releaser_seen(), "the parent has no releaser: the case would prove nothing");
  pthread_create(&f, NULL, forker, NULL);
  void *failure = NULL;
  pthread_join(f, &failure);
  CHECK_MSG(failure == NULL, "%s", failure ? (const char *)failure : "");
  pthread_barrier_wait(&parked_barrier);
  for (int i = 0; i < PARKED; i++) pthread_join(threads[i], NULL);
  return tu_summary("api-releaser_start (fork)");
}

/* ---- frees ---- */
static int case_frees(void) {
  enum { BLOCKS = 64 };
  static void *blocks[BLOCKS];
  size_t base = tu_statm_bytes(1);
  for (int i = 0; i < BLOCKS; i++) {
    blocks[i] = malloc(1 << 20);
    if (blocks[i] != NULL) memset(blocks[i], 0x5a, 1 << 20);
  }
  size_t peak = tu_statm_bytes(1);
  CHECK_MSG(peak > base + (48u << 20), "the blocks did not grow RSS (%zu -> %zu)", base, peak);
  for (int i = 0; i < BLOCKS; i++) free(blocks[i]); /* the last allocator calls */
  size_t now = peak;
  for (int waited = 0; waited < 2000 && now >= base + (12u << 20); waited++) {
    sleep_ms(10);
    now = tu_statm_bytes(1);
  }
  CHECK_MSG(now < base + (12u << 20), "RSS %zu MiB above the start 20 s after the frees (peak %zu MiB above)",
            (now - base) >> 20, (peak - base) >> 20);
  return tu_summary("api-releaser_start (frees)");
}

int main(void) {
  const char *thread = getenv("QMALLOC_RELEASE_THREAD");
  if (thread != NULL && strcmp(thread, "0") == 0) { /* tests/cross, where the emulator cannot fork threads */
    printf("api-releaser_start: skipped: QMALLOC_RELEASE_THREAD=0 turns off the background releaser this tests\n");
    return 77;
  }
  int (*cases[])(void) = {case_fork, case_frees};
  const char *names[] = {"fork", "frees"};
  int failed = 0;
  for (int i = 0; i < 2; i++) {
    fflush(stdout);
    pid_t pid = fork(); /* each case in a fresh single-threaded process, no releaser yet */
    if (pid == 0) {
      int rc = cases[i]();
      fflush(stdout);
      _exit(rc);
    }
    int status = 0, waited = 0;
    while (waitpid(pid, &status, WNOHANG) == 0 && waited++ < 6000) sleep_ms(10);
    if (waited > 6000) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      printf("FAIL: case %s hung (60 s)\n", names[i]);
      failed++;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      printf("FAIL: case %s: %s %d\n", names[i], WIFEXITED(status) ? "exit" : "signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      failed++;
    }
  }
  printf("api-releaser_start: %d of 2 cases failed\n", failed);
  return failed != 0;
}
