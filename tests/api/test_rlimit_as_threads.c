/* Running out of address space (RLIMIT_AS) with several threads allocating at once (issue 11):
 * four threads fill the heap through one entry point at a time (malloc, calloc, reallocarray,
 * posix_memalign, aligned_alloc, memalign, valloc, pvalloc, in both families) until it fails;
 * every failure must be NULL with errno ENOMEM (posix_memalign: the ENOMEM return code and ENOMEM
 * left in errno, as glibc does); a realloc that cannot grow fails the same way and keeps its block;
 * nothing crashes or hangs; once every thread freed its blocks, each one allocates again.
 * Runs in a forked child (the limit must not leak into the test runner) under a watchdog alarm:
 * a hang ends the child by SIGALRM and fails the test instead of blocking it. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "family.h"
#include "testutil.h"

#define THREADS 4
#define HEADROOM (64u << 20)
#define WATCHDOG_SECONDS 120

typedef enum { EP_MALLOC, EP_CALLOC, EP_REALLOCARRAY, EP_POSIX_MEMALIGN, EP_ALIGNED_ALLOC, EP_MEMALIGN, EP_VALLOC, EP_PVALLOC, EP_COUNT } entry_t;
static const char *const entry_names[EP_COUNT] = {"malloc",        "calloc",   "reallocarray", "posix_memalign",
                                                  "aligned_alloc", "memalign", "valloc",       "pvalloc"};

static pthread_barrier_t start, step;
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER; /* the CHECK counters are shared */

/* One call of entry point e for `size` bytes; *err gets errno after it (posix_memalign: the return
 * code must be ENOMEM too, else *err is -1). */
static void *call_entry(const family_t *f, entry_t e, size_t size, int *err) {
  void *p = NULL;
  errno = 0;
  switch (e) {
    case EP_MALLOC: p = f->malloc(size); break;
    case EP_CALLOC: p = f->calloc(size / 16, 16); break;
    case EP_REALLOCARRAY: p = f->reallocarray(NULL, size / 16, 16); break;
    case EP_POSIX_MEMALIGN: {
      int rc = f->posix_memalign(&p, 4096, size);
      *err = errno;
      if (rc != 0 && rc != ENOMEM) *err = -1;
      return rc == 0 ? p : NULL;
    }
    case EP_ALIGNED_ALLOC: p = f->aligned_alloc(65536, size); break;
    case EP_MEMALIGN: p = f->memalign(8192, size); break;
    case EP_VALLOC: p = f->valloc(size); break;
    default: p = f->pvalloc(size); break;
  }
  *err = errno;
  return p;
}

#define REPORT(ok, ...)                  \
  do {                                    \
    pthread_mutex_lock(&report_lock);     \
    CHECK_MSG(ok, __VA_ARGS__);           \
    pthread_mutex_unlock(&report_lock);   \
  } while (0)

/* Blocks of each thread, outside the heap (mapped before the limit is set). */
#define MAX_BLOCKS (1u << 15) /* 4000-byte blocks: twice the headroom; 1 MiB: 512 times it */
static void *blocks[THREADS][MAX_BLOCKS];

static void *worker(void *arg) {
  unsigned id = (unsigned)(uintptr_t)arg;
  void **mine = blocks[id];
  /* Large blocks on even threads, small ones on odd threads: both paths run out together. */
  size_t size = id % 2 == 0 ? (1u << 20) : 4000;
  pthread_barrier_wait(&start); /* the limit is in place */
  for (size_t k = 0; k < QM_NFAMILIES; k++) {
    const family_t *f = &QM_FAMILIES[k];
    for (entry_t e = 0; e < EP_COUNT; e++) {
      size_t n = 0;
      int err = 0;
      void *p;
      while (n < MAX_BLOCKS && (p = call_entry(f, e, size, &err)) != NULL) {
        ((volatile char *)p)[size - 1] = 1; /* the memory really is there */
        mine[n++] = p;
      }
      REPORT(n < MAX_BLOCKS && err == ENOMEM, "%s %s(%zu): failed after %zu blocks with errno %d, expected ENOMEM",
             f->name, entry_names[e], size, n, err);
      pthread_barrier_wait(&step); /* everyone has run out */
      if (id == 0) {
        /* A realloc that cannot grow: NULL, ENOMEM, and the old block intact. */
        unsigned char *old = f->malloc(100);
        if (old != NULL) {
          memset(old, 0x77, 100);
          errno = 0;
          unsigned char *grown = f->realloc(old, 64u << 20);
          int e2 = errno, intact = 1;
          /* It may also succeed: a refused mapping makes qmalloc unmap its free spans and try
           * again (issue 16), and the threads' free chunk tails can make room. Then the contents
           * must have moved with it. */
          for (int i = 0; i < 100; i++) intact &= (grown ? grown : old)[i] == 0x77;
          REPORT((grown == NULL && e2 == ENOMEM && intact) || (grown != NULL && intact),
                 "%s %s: realloc(100 bytes -> 64 MiB) while out of memory: moved %zu, errno %d (block intact?)",
                 f->name, entry_names[e], (size_t)(grown != NULL), e2);
          f->free(grown != NULL ? grown : old);
        }
      }
      for (size_t i = 0; i < n; i++) f->free(mine[i]);
      pthread_barrier_wait(&step); /* everything is free again */
      p = call_entry(f, e, size, &err);
      REPORT(p != NULL, "%s %s(%zu): still fails after every thread freed its blocks (after %zu, errno %d)",
             f->name, entry_names[e], size, (size_t)0, err);
      f->free(p);
      pthread_barrier_wait(&step); /* the next entry point starts together */
    }
  }
  return NULL;
}

static void child(void) {
  alarm(WATCHDOG_SECONDS); /* its default action ends the child: the parent reports a hang */
  pthread_barrier_init(&start, NULL, THREADS + 1);
  pthread_barrier_init(&step, NULL, THREADS);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256u << 10);
  pthread_t threads[THREADS];
  for (unsigned i = 0; i < THREADS; i++)
    if (pthread_create(&threads[i], &attr, worker, (void *)(uintptr_t)i) != 0) _exit(3);
  /* The threads and their stacks exist; now the limit, then they start. */
  struct rlimit rl;
  getrlimit(RLIMIT_AS, &rl);
  rl.rlim_cur = tu_statm_bytes(0) + HEADROOM;
  if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
  pthread_barrier_wait(&start);
  for (unsigned i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
}

int main(void) {
  if (!tu_address_limit_enforced()) { /* qemu-user ignores RLIMIT_AS (tests/cross) */
    printf("api-rlimit_as_threads: skipped: RLIMIT_AS is not enforced here (an emulator?)\n");
    return 77;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    tu_checks_run = tu_checks_failed = 0;
    child();
    fprintf(stderr, "child: %d checks, %d failed\n", tu_checks_run, tu_checks_failed);
    _exit(tu_checks_run == 0 ? 4 : tu_checks_failed ? 1 : 0);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK_MSG(!(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM),
            "the child under RLIMIT_AS hung: killed by its %d s watchdog", WATCHDOG_SECONDS);
  CHECK_MSG(!WIFSIGNALED(status), "the child under RLIMIT_AS died by signal %d", WTERMSIG(status));
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child under RLIMIT_AS failed checks (its FAIL lines are above), status %d", WEXITSTATUS(status));
  return tu_summary("api-rlimit_as_threads");
}
