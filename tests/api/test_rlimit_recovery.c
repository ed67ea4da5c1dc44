/* Address space comes back after a peak (issue 16, defect 5). Under an address-space limit
 * (RLIMIT_AS, `ulimit -v`), a program allocates 1 MiB blocks until malloc fails, frees them all,
 * and then asks for one 64 MiB block. Before the fix the page heap's 32 MiB regions were only
 * released (madvise), never unmapped, and 64 MiB blocks always asked for a mapping of their own:
 * the request failed although the heap was empty (glibc succeeds). Two ways, each in a child of
 * its own: with malloc_trim(0) between (free regions are unmapped), and without (the refused
 * mapping makes qmalloc unmap free regions and try again, or the block is served from free heap
 * spans). Then a second peak must reach about as far as the first. */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define MIB ((size_t)1 << 20)
#define MAX_BLOCKS 4096

static size_t peak(void **blocks) {
  size_t n = 0;
  while (n < MAX_BLOCKS && (blocks[n] = malloc(MIB)) != NULL) ((char *)blocks[n++])[0] = 1;
  return n;
}

static int child(int trim) {
  static void *blocks[MAX_BLOCKS];
  struct rlimit rl;
  getrlimit(RLIMIT_AS, &rl);
  rl.rlim_cur = tu_statm_bytes(0) + 400 * MIB;
  if (setrlimit(RLIMIT_AS, &rl) != 0) return 3;
  size_t first = peak(blocks);
  CHECK_MSG(first > 64 && first < MAX_BLOCKS, "first peak: %zu blocks of 1 MiB", first);
  for (size_t i = 0; i < first; i++) free(blocks[i]);
  if (trim) malloc_trim(0);
  errno = 0;
  char *big = malloc(64 * MIB);
  CHECK_MSG(big != NULL, "%s: malloc(64 MiB) after freeing %zu MiB fails (errno %d)", trim ? "malloc_trim" : "no trim",
            first, errno);
  if (big) memset(big, 7, 64 * MIB);
  free(big);
  if (trim) malloc_trim(0);
  size_t second = peak(blocks);
  CHECK_MSG(second + 40 >= first, "%s: the second peak reached %zu blocks, the first %zu", trim ? "malloc_trim" : "no trim",
            second, first);
  for (size_t i = 0; i < second; i++) free(blocks[i]);
  return tu_summary(trim ? "api-rlimit_recovery (child, malloc_trim)" : "api-rlimit_recovery (child, no trim)");
}

int main(void) {
  if (!tu_address_limit_enforced()) { /* qemu-user ignores RLIMIT_AS (tests/cross) */
    printf("api-rlimit_recovery: skipped: RLIMIT_AS is not enforced here (an emulator?)\n");
    return 77;
  }
  for (int trim = 1; trim >= 0; trim--) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(child(trim));
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child (%s) failed: status %d", trim ? "trim" : "no trim",
              status);
  }
  return tu_summary("api-rlimit_recovery");
}
