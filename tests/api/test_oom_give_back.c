/* Out of address space (RLIMIT_AS): what a refused request does before it fails with ENOMEM.
 * 1. Free memory in other threads' caches (api.c, give_back_before_enomem). Two threads allocate
 *    4,000-byte blocks until malloc fails, free them all and wait; the main thread then asks for
 *    1 TiB (more than everything mapped: it fails with ENOMEM at once, and the waiting threads'
 *    caches stay where they are, mallinfo2's fsmblks unchanged), then for 16 MiB and 32 MiB, which
 *    must succeed. With thread-cache budgets large enough to keep what a thread frees
 *    (QMALLOC_TCACHE_MAX and QMALLOC_TCACHE_TOTAL 1 GiB: the test sets them and runs itself
 *    again), the blocks stay in the caches and keep the heap's address space: without the
 *    give-back the requests fail though the program holds nothing (glibc succeeds).
 * 2. Headroom under a chunk (pageheap.c, pageheap_grow). The heap's first chunk is nearly full
 *    when a 24 MiB limit is set above what is mapped: 1 MiB blocks must still use most of it,
 *    from mappings of their own size, where a 32 MiB chunk can never be mapped.
 * Each in a child (the limit must not leak into the test runner). */
#include <errno.h>
#include <malloc.h>
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

static int limit_address_space(size_t headroom) {
  struct rlimit rl;
  getrlimit(RLIMIT_AS, &rl);
  rl.rlim_cur = tu_statm_bytes(0) + headroom;
  return setrlimit(RLIMIT_AS, &rl);
}

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

static int child_caches(void) {
  pthread_barrier_init(&step, NULL, FILLERS + 1);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256u << 10);
  pthread_t threads[FILLERS];
  for (size_t i = 0; i < FILLERS; i++)
    if (pthread_create(&threads[i], &attr, filler, (void *)(uintptr_t)i) != 0) return 3;
  free(malloc(16));
  if (limit_address_space(64 * MIB) != 0) return 3;
  pthread_barrier_wait(&step); /* 1 */
  pthread_barrier_wait(&step); /* 2 */
  size_t total = 0;
  for (size_t i = 0; i < FILLERS; i++) total += filled[i];
  CHECK_MSG(total * SMALL > 32 * MIB && filled[0] < MAX_BLOCKS && filled[1] < MAX_BLOCKS,
            "the fillers ran out after %zu and %zu blocks", filled[0], filled[1]);
  size_t cached = mallinfo2().fsmblks;
  errno = 0;
  void *impossible = malloc((size_t)1 << 40);
  size_t cached_after = mallinfo2().fsmblks;
  CHECK_MSG(impossible == NULL && errno == ENOMEM, "malloc(1 TiB) under the limit: %p, errno %d", impossible, errno);
  CHECK_MSG(cached_after + MIB >= cached, "malloc(1 TiB) emptied the caches: %zu bytes of free small blocks, %zu before",
            cached_after, cached);
  static const size_t sizes[] = {16 * MIB, 32 * MIB};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    errno = 0;
    char *big = malloc(sizes[k]);
    CHECK_MSG(big != NULL, "malloc(%zu MiB) after the threads freed %zu MiB fails (errno %d)", sizes[k] / MIB,
              total * SMALL / MIB, errno);
    if (big) memset(big, 7, sizes[k]);
    free(big);
  }
  pthread_barrier_wait(&step); /* 3 */
  for (size_t i = 0; i < FILLERS; i++) pthread_join(threads[i], NULL);
  return tu_summary("api-oom_give_back (child, caches)");
}

static int child_small_chunks(void) {
  static void *mine[64];
  for (size_t i = 0; i < 28; i++) mine[i] = malloc(MIB); /* most of the first 32 MiB chunk */
  if (limit_address_space(24 * MIB) != 0) return 3;
  size_t n = 28;
  while (n < 64 && (mine[n] = malloc(MIB)) != NULL) memset(mine[n++], 1, MIB);
  /* 24 MiB of headroom: 26-27 blocks here, 17 in the hardened build (the shadows of its parked
   * blocks take their share of the limit); without chunks of the request's size, the 3 or 4 that
   * fit in what was left of the first chunk. */
  CHECK_MSG(n - 28 >= 8, "1 MiB blocks under 24 MiB of headroom: %zu", n - 28);
  for (size_t i = 0; i < n; i++) free(mine[i]);
  return tu_summary("api-oom_give_back (child, small chunks)");
}

static void run_child(int (*child)(void), const char *what) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(1);
  }
  if (pid == 0) _exit(child());
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the child under RLIMIT_AS failed (status %d%s)", what,
            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), WIFEXITED(status) ? "" : ", a signal");
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
  run_child(child_caches, "caches");
  run_child(child_small_chunks, "small chunks");
  return tu_summary("api-oom_give_back");
}
