/* calloc, through both the standard and the qm_* names:
 *  - the first count*size bytes are zero, for fresh memory and, above all, for memory that was
 *    just filled with garbage and freed (the allocator may not assume recycled memory is clean),
 *    in every size class and for large blocks, including a large block carved from a bigger freed one;
 *  - calloc(0, n) and calloc(n, 0) give unique freeable pointers;
 *  - a count*size product that overflows size_t gives NULL and ENOMEM, even when the wrapped
 *    product is small or zero. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "family.h"
#include "testutil.h"

static long first_nonzero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return (long)i;
  return -1;
}

static void check_zeroed(const family_t *f, void *p, size_t count, size_t size, const char *when) {
  CHECK_MSG(p != NULL, "%s: calloc(%zu, %zu) returned NULL (%s)", f->name, count, size, when);
  if (!p) return;
  CHECK_MSG(QM_IS_ALIGNED(p, 16), "%s: calloc(%zu, %zu) = %p not 16-byte aligned", f->name, count, size, p);
  long bad = first_nonzero(p, count * size);
  CHECK_MSG(bad < 0, "%s: calloc(%zu, %zu) (%s): byte %ld is not zero", f->name, count, size, when, bad);
}

static void test_fresh(const family_t *f) {
  for (size_t i = 0; i < QM_NEDGE; i++) {
    size_t n = QM_EDGE_SIZES[i];
    void *p = f->calloc(1, n), *q = f->calloc(n, 1);
    check_zeroed(f, p, 1, n, "fresh");
    check_zeroed(f, q, n, 1, "fresh");
    f->free(p);
    f->free(q);
  }
  /* a product that is not one of the factors */
  void *p = f->calloc(3, 1000);
  check_zeroed(f, p, 3, 1000, "3x1000");
  f->free(p);
  p = f->calloc(1000, 300);
  check_zeroed(f, p, 1000, 300, "1000x300");
  f->free(p);
}

/* Dirty a block of the same size, free it, calloc again: the allocator likely hands back the very
 * same block from its cache, so this is the case where skipping the memset would show. */
static void test_reused(const family_t *f) {
  for (size_t i = 0; i < QM_NEDGE; i++) {
    size_t n = QM_EDGE_SIZES[i];
    for (int round = 0; round < 4; round++) {
      unsigned char *d = f->malloc(n);
      if (!d) { CHECK_MSG(0, "%s: malloc(%zu) failed", f->name, n); break; }
      memset(d, 0xA5, f->usable_size(d));
      f->free(d);
      void *p = f->calloc(1, n);
      check_zeroed(f, p, 1, n, "after free of a dirty block of the same size");
      if (p) memset(p, 0x5A, n); /* leave it dirty for the next round */
      f->free(p);
    }
  }
}

/* Many dirty objects freed at once, then as many callocs of the same sizes. */
static void test_reused_bulk(const family_t *f) {
  enum { N = 3000 };
  static void *p[N];
  static size_t sz[N];
  uint64_t rng = 0xca11;
  for (int i = 0; i < N; i++) {
    uint64_t r = tu_rand(&rng);
    sz[i] = (r & 15) == 0 ? r % 100000 : r % 1024;
    p[i] = f->malloc(sz[i]);
    if (p[i]) memset(p[i], 0xEE, f->usable_size(p[i]));
  }
  for (int i = 0; i < N; i++) f->free(p[i]);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    p[i] = f->calloc(sz[i], 1);
    if (!p[i] || first_nonzero(p[i], sz[i]) >= 0) bad++;
  }
  CHECK_MSG(bad == 0, "%s: %d of %d callocs after a bulk free of dirty objects not zeroed", f->name, bad, N);
  for (int i = 0; i < N; i++) f->free(p[i]);
}

/* Large blocks: a freed dirty 8 MiB block may be split to serve smaller large requests. */
static void test_large_carved(const family_t *f) {
  unsigned char *big = f->malloc(8 << 20);
  CHECK(big != NULL);
  if (big) memset(big, 0xC3, 8 << 20);
  f->free(big);
  void *a = f->calloc(1, 3 << 20), *b = f->calloc(1, (2 << 20) + 4096), *c = f->calloc(300000, 1);
  check_zeroed(f, a, 1, 3 << 20, "carved from a dirty 8 MiB block");
  check_zeroed(f, b, 1, (2 << 20) + 4096, "carved from a dirty 8 MiB block");
  check_zeroed(f, c, 300000, 1, "carved from a dirty 8 MiB block");
  f->free(a);
  f->free(b);
  f->free(c);
}

static void test_zero_counts(const family_t *f) {
  void *a = f->calloc(0, 0), *b = f->calloc(0, 100), *c = f->calloc(100, 0);
  CHECK_MSG(a && b && c, "%s: calloc with a zero factor returned NULL", f->name);
  CHECK_MSG(a != b && b != c && a != c, "%s: calloc with a zero factor returned a shared pointer", f->name);
  f->free(a);
  f->free(b);
  f->free(c);
}

static void test_overflow(const family_t *f) {
  static const struct { size_t count, size; } cases[] = {
    {SIZE_MAX, SIZE_MAX},
    {SIZE_MAX / 2 + 1, 2},               /* wraps to exactly 0 */
    {2, SIZE_MAX / 2 + 1},
    {(size_t)1 << 33, (size_t)1 << 31},  /* wraps to exactly 0 */
    {((size_t)1 << 32) + 1, (size_t)1 << 32}, /* wraps to 2^32: a plausible size */
    {((size_t)1 << 32) + 1, ((size_t)1 << 32) - 1}, /* exactly SIZE_MAX: no wrap, too big */
    {SIZE_MAX / 3 + 1, 3},
    {65537, SIZE_MAX / 65536},          /* wraps to about 2^48 */
    {1, SIZE_MAX},
    {SIZE_MAX, 1},
    {1, (size_t)PTRDIFF_MAX + 1},        /* no overflow, but more than an object may span */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    errno = 0;
    void *p = f->calloc(cases[i].count, cases[i].size);
    int e = errno;
    CHECK_MSG(p == NULL, "%s: calloc(%zu, %zu) = %p, expected NULL", f->name, cases[i].count,
              cases[i].size, p);
    CHECK_MSG(e == ENOMEM, "%s: calloc(%zu, %zu): errno %d, expected ENOMEM", f->name, cases[i].count,
              cases[i].size, e);
    if (p) f->free(p);
  }
}

int main(void) {
  for (size_t k = 0; k < QM_NFAMILIES; k++) {
    const family_t *f = &QM_FAMILIES[k];
    test_fresh(f);
    test_reused(f);
    test_reused_bulk(f);
    test_large_carved(f);
    test_zero_counts(f);
    test_overflow(f);
  }
  return tu_summary("api-calloc");
}
