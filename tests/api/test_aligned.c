/* The aligned family, through both the standard and the qm_* names:
 *  - posix_memalign, aligned_alloc and memalign honour every power-of-two alignment from 1 (8 for
 *    posix_memalign) to 8 MiB, with small and large sizes (also sizes that are not a multiple of the
 *    alignment): the result is aligned to max(alignment, 16), usable >= size, and the whole size is
 *    writable without disturbing other live aligned objects;
 *  - posix_memalign rejects an alignment that is not a power-of-two multiple of sizeof(void *) with
 *    EINVAL and leaves *result alone; an impossible size gives ENOMEM, also leaving *result alone;
 *  - aligned_alloc rejects a non-power-of-two alignment (and 0) with NULL + EINVAL: C23 and glibc
 *    >= 2.38 (glibc 2.36, installed here, still rounds it up like memalign);
 *  - memalign mirrors glibc: a non-power-of-two alignment is rounded up to the next power of two,
 *    0 means malloc, an alignment above SIZE_MAX/2+1 is EINVAL, an impossible size ENOMEM;
 *  - valloc is page aligned; pvalloc is page aligned and rounds the size up to whole pages;
 *  - free_aligned_sized releases (RSS stays bounded over 512 MiB of churn). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "family.h"
#include "testutil.h"

#define MAX_ALIGN_SHIFT 23 /* 8 MiB */
#define RSS_BOUND (64u << 20)

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Sizes tried for one alignment: tiny, around the alignment, odd, a page, above the small limit. */
static size_t sizes_for(size_t align, size_t out[9]) {
  size_t n = 0;
  out[n++] = 1;
  out[n++] = 100;
  out[n++] = align > 1 ? align - 1 : 3;
  out[n++] = align;
  out[n++] = align + 1;
  out[n++] = 4096;
  out[n++] = 100000;
  out[n++] = 300001;
  out[n++] = 3u << 20;
  return n;
}

typedef void *(*aligned_fn)(const family_t *f, size_t align, size_t size);
static void *via_posix_memalign(const family_t *f, size_t align, size_t size) {
  void *p = NULL;
  return f->posix_memalign(&p, align, size) == 0 ? p : NULL;
}
static void *via_aligned_alloc(const family_t *f, size_t align, size_t size) { return f->aligned_alloc(align, size); }
static void *via_memalign(const family_t *f, size_t align, size_t size) { return f->memalign(align, size); }

/* All sizes of one alignment are live together, filled, then verified: no overlap, all writable. */
static void check_alignments(const family_t *f, const char *fn, aligned_fn alloc, size_t min_align) {
  for (size_t align = min_align; align <= ((size_t)1 << MAX_ALIGN_SHIFT); align *= 2) {
    size_t sizes[9], n = sizes_for(align, sizes);
    void *p[9];
    for (size_t i = 0; i < n; i++) {
      p[i] = alloc(f, align, sizes[i]);
      CHECK_MSG(p[i] != NULL, "%s: %s(align %zu, size %zu) failed", f->name, fn, align, sizes[i]);
      if (!p[i]) continue;
      CHECK_MSG(QM_IS_ALIGNED(p[i], max_sz(align, 16)), "%s: %s(align %zu, size %zu) = %p misaligned", f->name,
                fn, align, sizes[i], p[i]);
      CHECK_MSG(f->usable_size(p[i]) >= sizes[i], "%s: %s(align %zu, size %zu): usable %zu", f->name, fn, align,
                sizes[i], f->usable_size(p[i]));
      tu_fill(p[i], sizes[i], align * 16 + i);
    }
    for (size_t i = 0; i < n; i++) {
      if (!p[i]) continue;
      long bad = tu_verify(p[i], sizes[i], align * 16 + i);
      CHECK_MSG(bad < 0, "%s: %s(align %zu, size %zu) block overwritten at offset %ld", f->name, fn, align,
                sizes[i], bad);
    }
    for (size_t i = 0; i < n; i++) {
      if (!p[i]) continue;
      if (i & 1) f->free_aligned_sized(p[i], align, sizes[i]);
      else f->free(p[i]);
    }
  }
}

static void test_posix_memalign(const family_t *f) {
  check_alignments(f, "posix_memalign", via_posix_memalign, sizeof(void *));

  void *p = NULL;
  int rc = f->posix_memalign(&p, 64, 0);
  CHECK_MSG(rc == 0 && p != NULL, "%s: posix_memalign(64, 0) = %d, %p (glibc gives a unique pointer)", f->name, rc, p);
  f->free(p);

  static const size_t bad[] = {0, 1, 2, 4, 12, 24, 40, 48, 100, 3 * sizeof(void *), 4097, 4096 + 8,
                               (1u << 20) + 8, SIZE_MAX, SIZE_MAX / 2 + 2, SIZE_MAX - 7};
  void *const sentinel = (void *)(uintptr_t)0xdeadbeef0;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    p = sentinel;
    rc = f->posix_memalign(&p, bad[i], 64);
    CHECK_MSG(rc == EINVAL, "%s: posix_memalign(align %zu) = %d, expected EINVAL", f->name, bad[i], rc);
    CHECK_MSG(p == sentinel, "%s: posix_memalign(align %zu) failed but changed *result to %p", f->name, bad[i], p);
    if (rc == 0 && p != sentinel) f->free(p);
  }

  static const struct { size_t align, size; } nomem[] = {
    {16, SIZE_MAX}, {4096, SIZE_MAX - 100}, {1u << 20, SIZE_MAX - (1u << 19)}, {64, (size_t)PTRDIFF_MAX + 1},
    {SIZE_MAX / 2 + 1, 10} /* a power of two, so a valid alignment, but no such address range exists */,
  };
  for (size_t i = 0; i < sizeof nomem / sizeof nomem[0]; i++) {
    p = sentinel;
    rc = f->posix_memalign(&p, nomem[i].align, nomem[i].size);
    CHECK_MSG(rc == ENOMEM, "%s: posix_memalign(align %zu, size %zu) = %d, expected ENOMEM", f->name,
              nomem[i].align, nomem[i].size, rc);
    CHECK_MSG(p == sentinel, "%s: posix_memalign(align %zu, size %zu) failed but changed *result", f->name,
              nomem[i].align, nomem[i].size);
    if (rc == 0 && p != sentinel) f->free(p);
  }
}

static void test_aligned_alloc(const family_t *f) {
  check_alignments(f, "aligned_alloc", via_aligned_alloc, 1);

  static const size_t bad[] = {0, 3, 12, 24, 48, 100, 4097, (1u << 20) + 1, SIZE_MAX, SIZE_MAX / 2 + 2};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    errno = 0;
    void *p = f->aligned_alloc(bad[i], 64);
    int e = errno;
    CHECK_MSG(p == NULL && e == EINVAL, "%s: aligned_alloc(align %zu, 64) = %p, errno %d; expected NULL + EINVAL",
              f->name, bad[i], p, e);
    if (p) f->free(p);
  }
  errno = 0;
  void *p = f->aligned_alloc(SIZE_MAX / 2 + 1, 10);
  int e = errno;
  CHECK_MSG(p == NULL && e == ENOMEM, "%s: aligned_alloc(2^63, 10) = %p, errno %d; expected NULL + ENOMEM", f->name,
            p, e);
  errno = 0;
  p = f->aligned_alloc(64, SIZE_MAX - 32);
  e = errno;
  CHECK_MSG(p == NULL && e == ENOMEM, "%s: aligned_alloc(64, SIZE_MAX-32) = %p, errno %d; expected NULL + ENOMEM",
            f->name, p, e);
}

static void test_memalign(const family_t *f) {
  check_alignments(f, "memalign", via_memalign, 1);

  static const struct { size_t asked, rounded; } round_up[] = {
    {0, 16}, {3, 16}, {24, 32}, {48, 64}, {100, 128}, {4097, 8192}, {(1u << 20) + 1, 2u << 20},
  };
  for (size_t i = 0; i < sizeof round_up / sizeof round_up[0]; i++) {
    void *p = f->memalign(round_up[i].asked, 1000);
    CHECK_MSG(p != NULL, "%s: memalign(%zu, 1000) failed (glibc rounds the alignment up)", f->name, round_up[i].asked);
    if (!p) continue;
    CHECK_MSG(QM_IS_ALIGNED(p, round_up[i].rounded), "%s: memalign(%zu, 1000) = %p not aligned to %zu", f->name,
              round_up[i].asked, p, round_up[i].rounded);
    CHECK(f->usable_size(p) >= 1000);
    memset(p, 0x42, 1000);
    f->free(p);
  }
  static const size_t einval[] = {SIZE_MAX, SIZE_MAX / 2 + 2, SIZE_MAX - 4095};
  for (size_t i = 0; i < sizeof einval / sizeof einval[0]; i++) {
    errno = 0;
    void *p = f->memalign(einval[i], 10);
    int e = errno;
    CHECK_MSG(p == NULL && e == EINVAL, "%s: memalign(%zu, 10) = %p, errno %d; expected NULL + EINVAL", f->name,
              einval[i], p, e);
  }
  errno = 0;
  void *p = f->memalign(SIZE_MAX / 2 + 1, 10);
  int e = errno;
  CHECK_MSG(p == NULL && e == ENOMEM, "%s: memalign(2^63, 10) = %p, errno %d; expected NULL + ENOMEM", f->name, p, e);
  errno = 0;
  p = f->memalign(4096, SIZE_MAX - 100);
  e = errno;
  CHECK_MSG(p == NULL && e == ENOMEM, "%s: memalign(4096, SIZE_MAX-100) = %p, errno %d; expected NULL + ENOMEM",
            f->name, p, e);
}

static void test_valloc_pvalloc(const family_t *f) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < QM_NEDGE; i++) {
    size_t n = QM_EDGE_SIZES[i];
    void *v = f->valloc(n);
    CHECK_MSG(v != NULL && QM_IS_ALIGNED(v, page), "%s: valloc(%zu) = %p not page aligned", f->name, n, v);
    if (v) {
      CHECK_MSG(f->usable_size(v) >= n, "%s: valloc(%zu): usable %zu", f->name, n, f->usable_size(v));
      memset(v, 0x77, n);
    }
    f->free(v);

    void *pv = f->pvalloc(n);
    size_t rounded = (n + page - 1) / page * page;
    CHECK_MSG(pv != NULL && QM_IS_ALIGNED(pv, page), "%s: pvalloc(%zu) = %p not page aligned", f->name, n, pv);
    if (pv) {
      CHECK_MSG(f->usable_size(pv) >= rounded, "%s: pvalloc(%zu): usable %zu < %zu (whole pages)", f->name, n,
                f->usable_size(pv), rounded);
      memset(pv, 0x78, rounded);
    }
    f->free(pv);
  }
  errno = 0;
  void *p = f->valloc(SIZE_MAX - 100);
  CHECK_MSG(p == NULL && errno == ENOMEM, "%s: valloc(SIZE_MAX-100) must be NULL + ENOMEM", f->name);
  errno = 0;
  p = f->pvalloc(SIZE_MAX - 100); /* rounding up to a page would wrap */
  CHECK_MSG(p == NULL && errno == ENOMEM, "%s: pvalloc(SIZE_MAX-100) must be NULL + ENOMEM", f->name);
}

/* Many small aligned blocks mixed with plain ones: no overlap, nothing lost. */
static void test_mixed_live(const family_t *f) {
  enum { N = 2000 };
  static void *p[N];
  static size_t sz[N];
  uint64_t rng = 0xa119;
  for (int i = 0; i < N; i++) {
    uint64_t r = tu_rand(&rng);
    size_t align = (size_t)1 << (r % 13); /* 1 .. 4096 */
    sz[i] = (r >> 8) % 3000;
    p[i] = (i & 1) ? f->malloc(sz[i]) : f->aligned_alloc(align, sz[i]);
    if (!p[i]) { CHECK(0); return; }
    if (!(i & 1)) CHECK_MSG(QM_IS_ALIGNED(p[i], align), "%s: aligned_alloc(%zu, %zu) misaligned", f->name, align, sz[i]);
    tu_fill(p[i], sz[i], r);
  }
  rng = 0xa119;
  int bad = 0;
  for (int i = 0; i < N; i++) {
    uint64_t r = tu_rand(&rng);
    bad += tu_verify(p[i], sz[i], r) >= 0;
    f->free(p[i]);
  }
  CHECK_MSG(bad == 0, "%s: %d of %d mixed aligned/plain blocks corrupted", f->name, bad, N);
}

static void test_free_aligned_sized_releases(const family_t *f) {
  static const struct { size_t align, size; } cases[] = {{64, 100000}, {4096, 200000}, {1u << 20, 1u << 20}};
  for (size_t k = 0; k < 3; k++) {
    size_t before = 0;
    for (size_t done = 0; done < tu_churn_bytes(RSS_BOUND); done += cases[k].size) {
      void *p = f->aligned_alloc(cases[k].align, cases[k].size);
      if (!p) { CHECK(0); break; }
      memset(p, 9, cases[k].size);
      f->free_aligned_sized(p, cases[k].align, cases[k].size);
      if (done == 0) before = tu_rss_bytes();
    }
    size_t after = tu_rss_bytes();
    CHECK_MSG(after < before + RSS_BOUND, "%s: free_aligned_sized(align %zu, size %zu) does not release: RSS %zu -> %zu KiB",
              f->name, cases[k].align, cases[k].size, before >> 10, after >> 10);
  }
}

int main(void) {
  for (size_t k = 0; k < QM_NFAMILIES; k++) {
    const family_t *f = &QM_FAMILIES[k];
    test_posix_memalign(f);
    test_aligned_alloc(f);
    test_memalign(f);
    test_valloc_pvalloc(f);
    test_mixed_live(f);
    test_free_aligned_sized_releases(f);
  }
  return tu_summary("api-aligned");
}
