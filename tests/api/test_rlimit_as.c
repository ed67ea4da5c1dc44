/* Running out of address space (RLIMIT_AS), in a forked child so the limit does not leak into the
 * test runner: every way of asking for more than the limit allows returns NULL / ENOMEM (or the
 * ENOMEM return code), nothing crashes, a failed realloc leaves its block intact, and once the
 * memory is freed the heap serves requests again. The limit is set to the child's current address
 * space plus 64 MiB, so whatever qmalloc already reserved counts as used. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "family.h"
#include "testutil.h"

#define HEADROOM (64u << 20)

static void fill_until_null(const family_t *f, size_t size, const char *what) {
  enum { MAX_BLOCKS = 1 << 20 };
  static void *blocks[MAX_BLOCKS];
  size_t n = 0;
  errno = 0;
  while (n < MAX_BLOCKS) {
    void *p = f->malloc(size);
    if (!p) break;
    ((volatile char *)p)[0] = 1; /* touch: the memory really is there */
    blocks[n++] = p;
  }
  int e = errno;
  CHECK_MSG(n < MAX_BLOCKS, "%s: %zu mallocs of %zu bytes all succeeded under a %u MiB headroom (%s)", f->name, n,
            size, HEADROOM >> 20, what);
  CHECK_MSG(e == ENOMEM, "%s: malloc(%zu) failed after %zu blocks with errno %d, expected ENOMEM (%s)", f->name,
            size, n, e, what);
  for (size_t i = 0; i < n; i++) f->free(blocks[i]);
  void *p = f->malloc(size);
  CHECK_MSG(p != NULL, "%s: malloc(%zu) still fails after everything was freed (%s)", f->name, size, what);
  f->free(p);
}

static void child_checks(const family_t *f) {
  struct rlimit rl;
  getrlimit(RLIMIT_AS, &rl);
  rl.rlim_cur = tu_statm_bytes(0) + HEADROOM;
  if (setrlimit(RLIMIT_AS, &rl) != 0) {
    perror("setrlimit");
    _exit(3);
  }
  static const size_t too_big[] = {128u << 20, 256u << 20, 1u << 30, (size_t)8 << 30};
  for (size_t i = 0; i < sizeof too_big / sizeof too_big[0]; i++) {
    size_t n = too_big[i];
    errno = 0;
    void *p = f->malloc(n);
    CHECK_MSG(p == NULL && errno == ENOMEM, "%s: malloc(%zu) over the limit = %p, errno %d", f->name, n, p, errno);
    errno = 0;
    p = f->calloc(1, n);
    CHECK_MSG(p == NULL && errno == ENOMEM, "%s: calloc(1, %zu) over the limit = %p, errno %d", f->name, n, p, errno);
    errno = 0;
    p = f->aligned_alloc(1u << 20, n);
    CHECK_MSG(p == NULL && errno == ENOMEM, "%s: aligned_alloc(1 MiB, %zu) over the limit = %p, errno %d", f->name,
              n, p, errno);
    void *r = NULL;
    int rc = f->posix_memalign(&r, 4096, n);
    CHECK_MSG(rc == ENOMEM && r == NULL, "%s: posix_memalign(4096, %zu) over the limit = %d", f->name, n, rc);

    void *old = f->malloc(5000);
    CHECK(old != NULL);
    if (!old) continue;
    tu_fill(old, 5000, n);
    errno = 0;
    p = f->realloc(old, n);
    CHECK_MSG(p == NULL && errno == ENOMEM, "%s: realloc(5000-byte block, %zu) over the limit = %p, errno %d",
              f->name, n, p, errno);
    CHECK_MSG(tu_verify(old, 5000, n) < 0, "%s: failed realloc damaged the block", f->name);
    f->free(p ? p : old);
  }
  fill_until_null(f, 1u << 20, "1 MiB blocks");
  fill_until_null(f, 1000, "1000-byte blocks");
  fill_until_null(f, 100000, "100000-byte blocks");
}

int main(void) {
  if (!tu_address_limit_enforced()) { /* exit 77: the test runners report it as skipped, with this line */
    printf("api-rlimit_as: skipped: RLIMIT_AS is not enforced here (a mapping past it succeeded; qemu-user"
           " ignores the limit), so running out of address space cannot be tested\n");
    return 77;
  }
  for (size_t k = 0; k < QM_NFAMILIES; k++) {
    const family_t *f = &QM_FAMILIES[k];
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) {
      tu_checks_run = tu_checks_failed = 0; /* count the child's own checks only */
      child_checks(f);
      fprintf(stderr, "%s child: %d checks, %d failed\n", f->name, tu_checks_run, tu_checks_failed);
      _exit(tu_checks_failed ? 1 : 0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status), "%s: the child under RLIMIT_AS died (signal %d) instead of getting NULL", f->name,
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "%s: the child under RLIMIT_AS failed checks (its FAIL lines are above)", f->name);
  }
  return tu_summary("api-rlimit_as");
}
