/* realloc and reallocarray, through both the standard and the qm_* names, with glibc semantics:
 *  - realloc(NULL, n) is malloc(n) (also for n = 0: a unique freeable pointer);
 *  - realloc(p, 0) with p != NULL frees p and returns NULL (glibc; checked to really free by RSS);
 *  - the contents up to min(old, new) survive every move between any two edge sizes (small to
 *    small, small to large, large to small), byte-by-byte growth, and geometric grow/shrink chains;
 *  - a small block stays in place down to half its size, and the size asked names the result
 *    for free_sized; so does a large block resized to a small size (across 256 KiB);
 *  - a realloc that cannot be satisfied returns NULL with ENOMEM and leaves the block untouched;
 *  - reallocarray overflow gives NULL with ENOMEM and does not free or touch the block (a wrapped
 *    product of 0 must not turn into realloc(p, 0)). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>

#include "family.h"
#include "testutil.h"

#define RSS_BOUND (64u << 20)

static void check_result(const family_t *f, void *q, size_t from, size_t to) {
  CHECK_MSG(q != NULL, "%s: realloc(%zu -> %zu) returned NULL", f->name, from, to);
  if (!q) return;
  CHECK_MSG(QM_IS_ALIGNED(q, 16), "%s: realloc(%zu -> %zu) = %p not 16-byte aligned", f->name, from, to, q);
  CHECK_MSG(f->usable_size(q) >= to, "%s: realloc(%zu -> %zu): usable size %zu", f->name, from, to,
            f->usable_size(q));
}

static void test_null_and_zero(const family_t *f) {
  for (size_t i = 0; i < QM_NEDGE; i++) {
    size_t n = QM_EDGE_SIZES[i];
    void *p = f->realloc(NULL, n);
    check_result(f, p, 0, n);
    if (p) tu_fill(p, n, n);
    if (p) CHECK(tu_verify(p, n, n) < 0);
    f->free(p);
  }
  void *a = f->realloc(NULL, 0), *b = f->realloc(NULL, 0);
  CHECK_MSG(a && b && a != b, "%s: realloc(NULL, 0) must give unique non-NULL pointers", f->name);
  f->free(a);
  f->free(b);

  for (size_t i = 0; i < QM_NEDGE; i++) {
    void *p = f->malloc(QM_EDGE_SIZES[i]);
    void *q = f->realloc(p, 0);
    CHECK_MSG(q == NULL, "%s: realloc(malloc(%zu), 0) = %p, expected NULL (glibc frees)", f->name,
              QM_EDGE_SIZES[i], q);
    if (q) f->free(q);
  }
  /* realloc(p, 0) must release p: 512 MiB through it may not grow the RSS by the bound. */
  static const size_t sizes[] = {100000, 1 << 20};
  for (size_t k = 0; k < 2; k++) {
    size_t size = sizes[k], before = 0;
    for (size_t done = 0; done < tu_churn_bytes(RSS_BOUND); done += size) {
      void *p = f->malloc(size);
      if (!p) break;
      memset(p, 7, size);
      void *q = f->realloc(p, 0);
      if (q) f->free(q);
      if (done == 0) before = tu_rss_bytes();
    }
    size_t after = tu_rss_bytes();
    CHECK_MSG(after < before + RSS_BOUND, "%s: realloc(p, 0) of %zu-byte blocks does not free: RSS %zu -> %zu KiB",
              f->name, size, before >> 10, after >> 10);
  }
}

/* Every ordered pair of edge sizes (a new size of 0 is realloc(p, 0), tested above). Only the part that must survive is filled, so the 4 MiB sizes
 * do not dominate the run time. */
static void test_all_pairs(const family_t *f) {
  int failures = 0;
  for (size_t i = 0; i < QM_NEDGE; i++)
    for (size_t j = 0; j < QM_NEDGE; j++) {
      if (QM_EDGE_SIZES[j] == 0) continue;
      size_t from = QM_EDGE_SIZES[i], to = QM_EDGE_SIZES[j], keep = from < to ? from : to;
      uint64_t seed = i * 1000 + j;
      void *p = f->malloc(from);
      if (!p) { failures++; continue; }
      tu_fill(p, keep, seed);
      void *q = f->realloc(p, to);
      if (!q || !QM_IS_ALIGNED(q, 16) || f->usable_size(q) < to || tu_verify(q, keep, seed) >= 0) {
        if (failures++ < 10) {
          check_result(f, q, from, to);
          if (q) CHECK_MSG(tu_verify(q, keep, seed) < 0, "%s: realloc(%zu -> %zu) lost contents at offset %ld",
                           f->name, from, to, tu_verify(q, keep, seed));
        }
      }
      if (q) {
        memset(q, 0x11, to); /* the whole new size must be writable */
        f->free(q);
      } else {
        f->free(p);
      }
    }
  CHECK_MSG(failures == 0, "%s: %d of %zu realloc pairs failed", f->name, failures, QM_NEDGE * QM_NEDGE);
}

/* Grow one byte at a time (in-place growth within a class and moves between classes), checking the
 * whole prefix each step; then geometric chains up to 16 MiB and back down. */
static void test_chains(const family_t *f) {
  enum { BYTEWISE = 5000 };
  unsigned char *p = f->malloc(1);
  int ok = p != NULL;
  if (p) p[0] = tu_pattern_byte(42, 0);
  for (size_t n = 2; ok && n <= BYTEWISE; n++) {
    unsigned char *q = f->realloc(p, n);
    if (!q) { ok = 0; break; }
    p = q;
    p[n - 1] = tu_pattern_byte(42, n - 1);
    if (tu_verify(p, n, 42) >= 0) {
      CHECK_MSG(0, "%s: bytewise growth to %zu lost contents at offset %ld", f->name, n, tu_verify(p, n, 42));
      ok = 0;
    }
  }
  CHECK_MSG(ok, "%s: bytewise realloc growth failed", f->name);
  f->free(p);

  size_t n = 1;
  p = f->malloc(n);
  tu_fill(p, n, 7);
  ok = p != NULL;
  while (ok && n < (16u << 20)) { /* up: 1 -> 16 MiB by x1.5 */
    size_t m = n + n / 2 + 1;
    unsigned char *q = f->realloc(p, m);
    if (!q || tu_verify(q, n, 7) >= 0) {
      CHECK_MSG(0, "%s: geometric growth %zu -> %zu failed or lost contents", f->name, n, m);
      ok = 0;
      if (q) p = q;
      break;
    }
    p = q;
    tu_fill(p, m, 7);
    n = m;
  }
  while (ok && n > 1) { /* down again by x0.6 */
    size_t m = n * 3 / 5;
    unsigned char *q = f->realloc(p, m);
    if (!q || tu_verify(q, m, 7) >= 0) {
      CHECK_MSG(0, "%s: geometric shrink %zu -> %zu failed or lost contents", f->name, n, m);
      ok = 0;
      if (q) p = q;
      break;
    }
    p = q;
    n = m;
  }
  CHECK_MSG(ok, "%s: geometric realloc chain failed", f->name);
  f->free(p);

  /* small -> large -> small -> medium -> tiny, contents kept at each step */
  static const size_t steps[] = {100, 2 << 20, 100, 300000, 50, 8 << 20, 16, 1};
  p = f->malloc(steps[0]);
  tu_fill(p, steps[0], 9);
  for (size_t i = 1; p && i < sizeof steps / sizeof steps[0]; i++) {
    size_t keep = steps[i - 1] < steps[i] ? steps[i - 1] : steps[i];
    unsigned char *q = f->realloc(p, steps[i]);
    check_result(f, q, steps[i - 1], steps[i]);
    if (!q) break;
    CHECK_MSG(tu_verify(q, keep, 9) < 0, "%s: realloc %zu -> %zu lost contents", f->name, steps[i - 1], steps[i]);
    tu_fill(q, steps[i], 9);
    p = q;
  }
  f->free(p);

  /* a block from the aligned family may be realloc'ed like any other */
  p = f->aligned_alloc(4096, 100);
  CHECK(p != NULL);
  if (p) {
    tu_fill(p, 100, 3);
    unsigned char *q = f->realloc(p, 20000);
    check_result(f, q, 100, 20000);
    if (q) CHECK_MSG(tu_verify(q, 100, 3) < 0, "%s: realloc of an aligned_alloc block lost contents", f->name);
    f->free(q ? q : p);
  }
}

static void test_failure_keeps_block(const family_t *f) {
  static const size_t impossible[] = {SIZE_MAX, SIZE_MAX - 4095, SIZE_MAX - (1u << 20),
                                      (size_t)PTRDIFF_MAX + 1, (size_t)1 << 62};
  static const size_t held[] = {24, 1000, 100000, 3 << 20};
  for (size_t h = 0; h < 4; h++)
    for (size_t i = 0; i < sizeof impossible / sizeof impossible[0]; i++) {
      void *p = f->malloc(held[h]);
      if (!p) { CHECK(0); continue; }
      tu_fill(p, held[h], h + i);
      errno = 0;
      void *q = f->realloc(p, impossible[i]);
      int e = errno;
      CHECK_MSG(q == NULL, "%s: realloc(%zu-byte block, %zu) = %p, expected NULL", f->name, held[h], impossible[i], q);
      CHECK_MSG(e == ENOMEM, "%s: realloc(%zu-byte block, %zu): errno %d, expected ENOMEM", f->name, held[h],
                impossible[i], e);
      CHECK_MSG(tu_verify(p, held[h], h + i) < 0, "%s: failed realloc(.., %zu) damaged the block", f->name,
                impossible[i]);
      f->free(q ? q : p);
    }
}

static void test_reallocarray(const family_t *f) {
  int *a = f->reallocarray(NULL, 10, sizeof(int));
  CHECK(a != NULL);
  if (!a) return;
  for (int i = 0; i < 10; i++) a[i] = i * i;
  int *b = f->reallocarray(a, 100000, sizeof(int));
  CHECK(b != NULL);
  if (!b) { f->free(a); return; }
  int kept = 1;
  for (int i = 0; i < 10; i++) kept &= b[i] == i * i;
  CHECK_MSG(kept, "%s: reallocarray lost contents", f->name);
  CHECK(f->usable_size(b) >= 100000 * sizeof(int));

  static const struct { size_t n, size; } overflow[] = {
    {SIZE_MAX / 2, 3}, {SIZE_MAX, SIZE_MAX}, {(size_t)1 << 33, (size_t)1 << 31} /* wraps to 0 */,
    {SIZE_MAX / 2 + 1, 2} /* wraps to 0 */, {((size_t)1 << 32) + 1, (size_t)1 << 32} /* wraps to 2^32 */,
  };
  for (size_t i = 0; i < sizeof overflow / sizeof overflow[0]; i++) {
    errno = 0;
    void *q = f->reallocarray(b, overflow[i].n, overflow[i].size);
    int e = errno;
    CHECK_MSG(q == NULL, "%s: reallocarray(p, %zu, %zu) = %p, expected NULL", f->name, overflow[i].n,
              overflow[i].size, q);
    CHECK_MSG(e == ENOMEM, "%s: reallocarray(p, %zu, %zu): errno %d, expected ENOMEM", f->name, overflow[i].n,
              overflow[i].size, e);
    if (q) { b = q; continue; }
    kept = 1; /* still ours and intact: the overflow must not have freed or moved it */
    for (int k = 0; k < 10; k++) kept &= b[k] == k * k;
    CHECK_MSG(kept, "%s: overflowing reallocarray(p, %zu, %zu) damaged the block", f->name, overflow[i].n,
              overflow[i].size);
  }
  errno = 0;
  void *z = f->reallocarray(NULL, SIZE_MAX / 2, 3);
  CHECK_MSG(z == NULL && errno == ENOMEM, "%s: reallocarray(NULL, overflow) must be NULL + ENOMEM", f->name);
  /* glibc: reallocarray(p, 0, n) is realloc(p, 0), which frees p and returns NULL */
  void *q = f->reallocarray(b, 0, sizeof(int));
  CHECK_MSG(q == NULL, "%s: reallocarray(p, 0, 4) = %p, expected NULL like realloc(p, 0)", f->name, q);
  if (q) f->free(q);
}

/* realloc keeps a block in place down to half its size (src/api.c, realloc_impl), and the size
 * asked names the result for free_sized either way (a sized free of any of them must not stop the
 * program). */
static void test_in_place_and_sized(const family_t *f) {
  /* The hardened build keeps its own realloc (each block's request size is recorded and checked
   * exactly): only the sized frees below apply to it. CMake runs this test under it with QMALLOC_SO
   * naming libqmalloc-hardened. */
  bool hardened = tu_hardened();
  char *p = f->malloc(1000);
  size_t block = f->usable_size(p);
  char *q = f->realloc(p, block / 2 + 1);
  CHECK_MSG(hardened || q == p, "%s: realloc(%zu-byte block -> %zu) moved (%p -> %p): it should stay in place", f->name, block,
            block / 2 + 1, (void *)p, (void *)q);
  f->free_sized(q, block / 2 + 1);
  /* every small size to every other, freed with the size asked */
  static const size_t sizes[] = {1, 16, 17, 100, 500, 1000, 4000, 5000, 20000, 40000, 100000, 200000, 262144};
  size_t n = sizeof sizes / sizeof sizes[0];
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++) {
      void *a = f->malloc(sizes[i]);
      void *b = f->realloc(a, sizes[j]);
      CHECK_MSG(b != NULL, "%s: realloc(%zu -> %zu) failed", f->name, sizes[i], sizes[j]);
      f->free_sized(b, sizes[j]);
    }
}

/* A large block resized back and forth across 256 KiB (the largest class) keeps its place while
 * the small size is at least half of it, and a sized free of the size asked last names it. */
static void test_large_to_small_in_place(const family_t *f) {
  bool hardened = tu_hardened();
  static const size_t pairs[][2] = {{262145, 262144}, {300000, 200000}, {400000, 262144}};
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    size_t large = pairs[i][0], small = pairs[i][1];
    char *p = f->malloc(large);
    CHECK_MSG(p != NULL, "%s: malloc(%zu) failed", f->name, large);
    if (p == NULL) continue;
    memset(p, 0x5a, large);
    char *q = p;
    for (int round = 0; round < 4 && q != NULL; round++) {
      char *r = f->realloc(q, small);
      CHECK_MSG(r != NULL && (hardened || r == q), "%s: realloc(%zu -> %zu) moved (%p -> %p)", f->name, large, small,
                (void *)q, (void *)r);
      if (r == NULL) break;
      CHECK_MSG(r[0] == 0x5a && r[small - 1] == 0x5a, "%s: realloc(%zu -> %zu) lost the contents", f->name, large, small);
      q = f->realloc(r, large);
      CHECK_MSG(q != NULL && (hardened || q == r), "%s: realloc(%zu -> %zu) moved (%p -> %p)", f->name, small, large,
                (void *)r, (void *)q);
      if (q != NULL) memset(q + small, 0x5a, large - small);
    }
    if (q == NULL) continue;
    q = f->realloc(q, small);
    if (q != NULL) f->free_sized(q, small); /* stops the program if the size does not name the block */
  }
  /* Under half: a copy into the small class, as before. */
  char *p = f->malloc(600000);
  char *q = p ? f->realloc(p, 1000) : NULL;
  CHECK_MSG(q != NULL && q != p, "%s: realloc(600000 -> 1000) kept a 600000-byte block", f->name);
  if (q != NULL) f->free_sized(q, 1000);
}

int main(void) {
  for (size_t k = 0; k < QM_NFAMILIES; k++) {
    const family_t *f = &QM_FAMILIES[k];
    test_null_and_zero(f);
    test_all_pairs(f);
    test_chains(f);
    test_failure_keeps_block(f);
    test_reallocarray(f);
    test_in_place_and_sized(f);
    test_large_to_small_in_place(f);
  }
  return tu_summary("api-realloc");
}
