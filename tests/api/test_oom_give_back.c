/* Out of address space, free memory in other threads' caches (api.c, give_back_before_enomem).
 * Under an address-space limit (RLIMIT_AS), two threads allocate 4,000-byte blocks until malloc
 * fails, free them all and wait; the main thread then asks for one 16 MiB block, and one of 32 MiB.
 * With thread-cache budgets large enough to keep what a thread frees (QMALLOC_TCACHE_MAX and
 * QMALLOC_TCACHE_TOTAL 1 GiB: the test sets them and runs itself again), the blocks stay in the
 * waiting threads' caches, whose spans keep the heap's address space: without the give-back the
 * request fails with ENOMEM though the program holds nothing (glibc succeeds). With it, the request
 * takes back the idle caches and succeeds. A request larger than everything mapped still fails
 * with ENOMEM. In a child (the limit must not leak into the test runner). */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define MIB ((size_t)1 << 20)
#define FILLERS 2
#define MAX_BLOCKS 40000
#define SMALL 4000

static void *blocks[FILLERS][MAX_BLOCKS];
static size_t filled[FILLERS];
static pthread_barrier_t step;

static void *filler(void *arg) {
  size_t id = (size_t)(uintptr_t)arg, n = 0;
  pthread_barrier_wait(&step); /* 1: the limit is in place */
  while (n < MAX_BLOCKS && (blocks[id][n] = malloc(SMALL)) != NULL) memset(blocks[id][n++], 1, SMALL);
  filled[id] = n;
  for (size_t i = 0; i < n; i++) free(blocks[id][i]);
  pthread_barrier_wait(&step); /* 2: everything freed */
  pthread_barrier_wait(&step); /* 3: the main thread has asked */
  return NULL;
}

static int child(void) {
  pthread_barrier_init(&step, NULL, FILLERS + 1);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256u << 10);
  pthread_t threads[FILLERS];
  for (size_t i = 0; i < FILLERS; i++)
    if (pthread_create(&threads[i], &attr, filler, (void *)(uintptr_t)i) != 0) return 3;
  free(malloc(16));
  struct rlimit rl;
  getrlimit(RLIMIT_AS, &rl);
  rl.rlim_cur = tu_statm_bytes(0) + 64 * MIB;
  if (setrlimit(RLIMIT_AS, &rl) != 0) return 3;
  pthread_barrier_wait(&step); /* 1 */
  pthread_barrier_wait(&step); /* 2 */
  size_t total = 0;
  for (size_t i = 0; i < FILLERS; i++) total += filled[i];
  CHECK_MSG(total * SMALL > 32 * MIB && filled[0] < MAX_BLOCKS && filled[1] < MAX_BLOCKS,
            "the fillers ran out after %zu and %zu blocks", filled[0], filled[1]);
  static const size_t sizes[] = {16 * MIB, 32 * MIB};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    errno = 0;
    char *big = malloc(sizes[k]);
    CHECK_MSG(big != NULL, "malloc(%zu MiB) after the threads freed %zu MiB fails (errno %d)", sizes[k] / MIB,
              total * SMALL / MIB, errno);
    if (big) memset(big, 7, sizes[k]);
    free(big);
  }
  errno = 0;
  void *impossible = malloc((size_t)1 << 40); /* more than everything mapped: no giving back helps */
  CHECK_MSG(impossible == NULL && errno == ENOMEM, "malloc(1 TiB) under the limit: %p, errno %d", impossible, errno);
  pthread_barrier_wait(&step); /* 3 */
  for (size_t i = 0; i < FILLERS; i++) pthread_join(threads[i], NULL);
  return tu_summary("api-oom_give_back (child)");
}

int main(int argc, char **argv) {
  (void)argc;
  /* First: under qemu-user (tests/cross) the exec below could not start the guest binary either. */
  if (!tu_address_limit_enforced()) { /* qemu-user ignores RLIMIT_AS */
    printf("api-oom_give_back: skipped: RLIMIT_AS is not enforced here (an emulator?)\n");
    return 77;
  }
  if (getenv("QMALLOC_TCACHE_TOTAL") == NULL) { /* budgets that keep what a thread frees */
    setenv("QMALLOC_TCACHE_MAX", "1G", 1);
    setenv("QMALLOC_TCACHE_TOTAL", "1G", 1);
    execv("/proc/self/exe", argv);
    perror("execv /proc/self/exe");
    return 1;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) _exit(child());
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child under RLIMIT_AS failed (status %d%s)",
            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), WIFEXITED(status) ? "" : ", a signal");
  return tu_summary("api-oom_give_back");
}
