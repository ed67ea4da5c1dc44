/* calloc after a release the kernel refused (issue 16, defect 2). A 1 MiB block is filled with 0xAA,
 * locked in memory (mlock: madvise(MADV_DONTNEED) then fails with EINVAL), freed, and its span
 * released by malloc_trim(0) (first run) or at once by the decay (second run, QMALLOC_DECAY_MS=0,
 * no trim). Before the fix the page heap marked the span released anyway and calloc, trusting
 * released pages to read as zero, skipped its memset: calloc(1, 1 MiB) returned the old 0xAA bytes.
 * The program runs itself twice, once per way, in a child of its own (the decay option must be in
 * the environment before the first malloc). */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define SIZE ((size_t)1 << 20)

static int run_case(int trim) {
  unsigned char *p = malloc(SIZE);
  CHECK(p != NULL);
  memset(p, 0xAA, SIZE);
  if (mlock(p, SIZE) != 0) {
    fprintf(stderr, "mlock(1 MiB) failed (errno %d): RLIMIT_MEMLOCK below 1 MiB?\n", errno);
    CHECK(0);
    return tu_summary("api-calloc_refused_release");
  }
  free(p);
  if (trim) malloc_trim(0);
  unsigned char *q = calloc(1, SIZE);
  CHECK(q != NULL);
  size_t nonzero = 0;
  for (size_t i = 0; q && i < SIZE; i++) nonzero += q[i] != 0;
  CHECK_MSG(nonzero == 0, "calloc(1, 1 MiB) after a refused release (%s) returned %zu non-zero bytes (q %s p)",
            trim ? "malloc_trim" : "decay_ms=0", nonzero, q == p ? "==" : "!=");
  munlock(p, SIZE);
  free(q);
  return tu_summary(trim ? "api-calloc_refused_release (malloc_trim)" : "api-calloc_refused_release (decay_ms=0)");
}

int main(int argc, char **argv) {
  if (argc == 2) return run_case(argv[1][0] == 't');
  int failed = 0;
  for (int trim = 1; trim >= 0; trim--) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      if (!trim) setenv("QMALLOC_DECAY_MS", "0", 1);
      char *args[] = {argv[0], trim ? "trim" : "decay", NULL};
      tu_exec_self(args, NULL); /* through the emulator under tests/cross */
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    failed |= !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  CHECK_MSG(!failed, "a case failed (its lines are above)");
  return tu_summary("api-calloc_refused_release");
}
