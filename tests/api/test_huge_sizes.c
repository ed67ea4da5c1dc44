/* Sizes at and beyond the limits, through both the standard and the qm_* names:
 *  - malloc of a size no address space can hold (SIZE_MAX and its neighbours, where rounding up to
 *    a class, a page or an alignment would wrap around; PTRDIFF_MAX + 1, which glibc refuses
 *    outright; 2^57 and up, beyond any x86-64 or aarch64 address space) returns NULL with ENOMEM,
 *    and the heap works normally afterwards;
 *  - large blocks (1 MB, 100 MB, and fifty of 1..8 MiB live together) are writable over their whole
 *    size and keep their contents. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "family.h"
#include "testutil.h"

static const size_t IMPOSSIBLE[] = {
  SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 15, SIZE_MAX - 16, SIZE_MAX - 4095, SIZE_MAX - 4096,
  SIZE_MAX - (1u << 20), SIZE_MAX - (2u << 20) + 1, SIZE_MAX - (256u << 10), SIZE_MAX / 2 + 1,
  SIZE_MAX / 2, (size_t)PTRDIFF_MAX + 1, (size_t)PTRDIFF_MAX, (size_t)1 << 62, (size_t)1 << 60,
  (size_t)1 << 57, ((size_t)1 << 57) + 1,
};
#define N_IMPOSSIBLE (sizeof IMPOSSIBLE / sizeof IMPOSSIBLE[0])

static void test_impossible_malloc(const family_t *f) {
  for (size_t i = 0; i < N_IMPOSSIBLE; i++) {
    errno = 0;
    void *p = f->malloc(IMPOSSIBLE[i]);
    int e = errno;
    CHECK_MSG(p == NULL, "%s: malloc(%zu) = %p, expected NULL", f->name, IMPOSSIBLE[i], p);
    CHECK_MSG(e == ENOMEM, "%s: malloc(%zu): errno %d, expected ENOMEM", f->name, IMPOSSIBLE[i], e);
    if (p) f->free(p);
    errno = 0;
    p = f->realloc(NULL, IMPOSSIBLE[i]);
    e = errno;
    CHECK_MSG(p == NULL && e == ENOMEM, "%s: realloc(NULL, %zu) = %p errno %d, expected NULL + ENOMEM", f->name,
              IMPOSSIBLE[i], p, e);
    if (p) f->free(p);
    errno = 0;
    p = f->aligned_alloc(64, IMPOSSIBLE[i]);
    e = errno;
    CHECK_MSG(p == NULL && e == ENOMEM, "%s: aligned_alloc(64, %zu) = %p errno %d, expected NULL + ENOMEM", f->name,
              IMPOSSIBLE[i], p, e);
    if (p) f->free(p);
    errno = 0;
    p = f->valloc(IMPOSSIBLE[i]);
    e = errno;
    CHECK_MSG(p == NULL && e == ENOMEM, "%s: valloc(%zu) = %p errno %d, expected NULL + ENOMEM", f->name,
              IMPOSSIBLE[i], p, e);
    if (p) f->free(p);
  }
  /* the failures left nothing broken */
  void *p = f->malloc(100), *q = f->malloc(5u << 20);
  CHECK_MSG(p && q, "%s: malloc fails after the impossible requests", f->name);
  if (p) memset(p, 1, 100);
  if (q) memset(q, 1, 5u << 20);
  f->free(p);
  f->free(q);
}

static void check_large(const family_t *f, size_t size, uint64_t seed) {
  void *p = f->malloc(size);
  CHECK_MSG(p != NULL, "%s: malloc(%zu) failed", f->name, size);
  if (!p) return;
  CHECK_MSG(QM_IS_ALIGNED(p, 16), "%s: malloc(%zu) = %p misaligned", f->name, size, p);
  CHECK_MSG(f->usable_size(p) >= size, "%s: malloc(%zu): usable %zu", f->name, size, f->usable_size(p));
  tu_fill(p, size, seed);
  long bad = tu_verify(p, size, seed);
  CHECK_MSG(bad < 0, "%s: malloc(%zu) block does not keep its contents (offset %ld)", f->name, size, bad);
  f->free(p);
}

static void test_large(const family_t *f) {
  check_large(f, 1000000, 1);
  check_large(f, 1u << 20, 2);
  check_large(f, 100000000, 3);
  check_large(f, 100u << 20, 4);

  enum { N = 50 };
  void *p[N];
  size_t sz[N];
  uint64_t rng = 0x1a59e;
  for (int i = 0; i < N; i++) {
    sz[i] = (1u << 20) + tu_rand(&rng) % (7u << 20);
    p[i] = f->malloc(sz[i]);
    CHECK_MSG(p[i] != NULL, "%s: malloc(%zu) failed", f->name, sz[i]);
    if (p[i]) tu_fill(p[i], sz[i], 500 + i);
  }
  int bad = 0;
  for (int i = 0; i < N; i++) {
    if (p[i]) bad += tu_verify(p[i], sz[i], 500 + i) >= 0;
    f->free(p[i]);
  }
  CHECK_MSG(bad == 0, "%s: %d of %d live large blocks were overwritten", f->name, bad, N);
}

int main(void) {
  for (size_t k = 0; k < QM_NFAMILIES; k++) {
    test_impossible_malloc(&QM_FAMILIES[k]);
    test_large(&QM_FAMILIES[k]);
  }
  return tu_summary("api-huge_sizes");
}
