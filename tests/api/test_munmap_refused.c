/* free() when the kernel refuses to unmap (issue 11 item 3). When the munmap behind a free fails
 * (the map-count limit, e.g.: unmapping part of a merged mapping splits it), free() once set errno
 * to ENOMEM and lost the range. POSIX.1-2024 requires free() to leave errno unchanged, and nothing
 * freed may leak: the range must be kept and reused. This program defines munmap itself, which
 * interposes it for libqmalloc too (an executable's definitions come first), and makes it fail on
 * demand with ENOMEM, as the kernel does at the limit. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "family.h"
#include "testutil.h"

static volatile int refuse_munmap;
static volatile int refused;

int munmap(void *addr, size_t len) {
  if (refuse_munmap) {
    refused++;
    errno = ENOMEM;
    return -1;
  }
  return (int)syscall(SYS_munmap, addr, len);
}

int main(void) {
  const size_t size = (size_t)64 << 20; /* above release_large: a mapping of its own */
  char *p = malloc(size);
  CHECK(p != NULL);
  memset(p, 1, size);
  refuse_munmap = 1;
  errno = 77;
  free(p);
  int e = errno;
  refuse_munmap = 0;
  CHECK_MSG(refused > 0, "free of a 64 MiB block did not call munmap (the test would prove nothing)");
  CHECK_MSG(e == 77, "free() changed errno to %d when munmap failed", e);
  /* the range was kept as free heap space: the next block of that size is served from free spans
   * that include it (possibly merged with a free neighbour), with no new mapping; asked at once,
   * before small spans (which prefer resident free pages) take pages of it */
  size_t vm_before = tu_statm_bytes(0);
  char *q = malloc(size);
  CHECK_MSG(q != NULL && q < p + size && p < q + size, "the refused range %p was not reused (got %p)", (void *)p, (void *)q);
  CHECK_MSG(tu_statm_bytes(0) <= vm_before, "malloc(64 MiB) mapped new memory (%zu -> %zu bytes) instead of the kept range",
            vm_before, tu_statm_bytes(0));
  if (q) memset(q, 2, size);
  free(q);
  errno = 78;
  free_sized(malloc(100), 100);
  CHECK_EQ(errno, 78);
  /* and it can still be given back: malloc_trim unmaps free runs of at least a chunk */
  CHECK(malloc_trim(0) == 1);
  return tu_summary("api-munmap_refused");
}
