/* malloc/free and the sized frees, through both the standard and the qm_* names:
 *  - malloc(0) returns a unique, freeable pointer; free(NULL) and the sized frees of NULL do nothing;
 *  - every result is 16-byte aligned and malloc_usable_size() >= the request; the whole usable size
 *    may be written without touching any other live object (no overlap, checked by pattern);
 *  - a random alloc/free mix keeps every live object's contents;
 *  - free, free_sized and free_aligned_sized really release: a loop that allocates, writes and frees
 *    far more than the RSS bound does not grow the RSS;
 *  - the two families share one heap: memory from one may be freed by the other. */
#include <stdint.h>
#include <stdlib.h>

#include "family.h"
#include "testutil.h"

/* How much the RSS may grow over a loop that allocates, writes and releases LEAK_LOOP_BYTES in
 * total. A correct allocator reuses the same few blocks (growth ~0); one whose release is a no-op
 * grows by LEAK_LOOP_BYTES, eight times the bound (at least twice under emulation). */
#define RSS_BOUND (64u << 20)
#define LEAK_LOOP_BYTES tu_churn_bytes(RSS_BOUND)

static int ptr_cmp(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

static void test_malloc_zero(const family_t *f) {
  enum { N = 1000 };
  static void *p[N];
  int all_nonnull = 1, all_aligned = 1, unique = 1;
  for (int i = 0; i < N; i++) {
    p[i] = f->malloc(0);
    all_nonnull &= p[i] != NULL;
    all_aligned &= QM_IS_ALIGNED(p[i], 16);
  }
  CHECK_MSG(all_nonnull, "%s: malloc(0) returned NULL", f->name);
  CHECK_MSG(all_aligned, "%s: malloc(0) result not 16-byte aligned", f->name);
  void *sorted[N];
  memcpy(sorted, p, sizeof sorted);
  qsort(sorted, N, sizeof(void *), ptr_cmp);
  for (int i = 1; i < N; i++) unique &= sorted[i] != sorted[i - 1];
  CHECK_MSG(unique, "%s: malloc(0) returned the same pointer twice while both were live", f->name);
  for (int i = 0; i < N; i++) f->free(p[i]);
}

static void test_free_null(const family_t *f) {
  f->free(NULL);
  f->free_sized(NULL, 0);
  f->free_sized(NULL, 100);
  f->free_aligned_sized(NULL, 64, 128);
  CHECK_MSG(f->usable_size(NULL) == 0, "%s: malloc_usable_size(NULL) != 0", f->name);
  CHECK(1); /* reached: the NULL frees above did not crash */
}

/* All edge sizes live at once, each written over its whole usable size: patterns survive and the
 * [p, p + usable) ranges are pairwise disjoint. */
static void test_edge_sizes_disjoint(const family_t *f) {
  enum { COPIES = 3 };
  static void *p[QM_NEDGE * COPIES];
  static size_t us[QM_NEDGE * COPIES];
  size_t n = QM_NEDGE * COPIES;
  for (size_t i = 0; i < n; i++) {
    size_t req = QM_EDGE_SIZES[i % QM_NEDGE];
    p[i] = f->malloc(req);
    CHECK_MSG(p[i] != NULL, "%s: malloc(%zu) returned NULL", f->name, req);
    if (!p[i]) return;
    CHECK_MSG(QM_IS_ALIGNED(p[i], 16), "%s: malloc(%zu) = %p not 16-byte aligned", f->name, req, p[i]);
    us[i] = f->usable_size(p[i]);
    CHECK_MSG(us[i] >= req, "%s: usable_size(malloc(%zu)) = %zu", f->name, req, us[i]);
    tu_fill(p[i], us[i], 1000 + i);
  }
  for (size_t i = 0; i < n; i++) {
    long bad = tu_verify(p[i], us[i], 1000 + i);
    CHECK_MSG(bad < 0, "%s: object %zu (malloc(%zu) = %p, usable %zu) overwritten at offset %ld",
              f->name, i, QM_EDGE_SIZES[i % QM_NEDGE], p[i], us[i], bad);
  }
  struct range { uintptr_t lo, hi; } r[QM_NEDGE * COPIES];
  for (size_t i = 0; i < n; i++) r[i] = (struct range){(uintptr_t)p[i], (uintptr_t)p[i] + us[i]};
  qsort(r, n, sizeof r[0], ptr_cmp); /* sorts by lo, the first field */
  int disjoint = 1;
  for (size_t i = 1; i < n; i++) disjoint &= r[i - 1].hi <= r[i].lo;
  CHECK_MSG(disjoint, "%s: two live objects' usable ranges overlap", f->name);
  for (size_t i = 0; i < n; i++) f->free(p[i]);
}

/* Random sizes, a live set replaced at random: every object keeps its contents until freed. */
static void test_random_mix(const family_t *f) {
  enum { LIVE = 2000, OPS = 40000 };
  static void *p[LIVE];
  static size_t sz[LIVE];
  static uint64_t seed[LIVE];
  uint64_t rng = 0x5eed0001;
  int failures = 0;
  for (int op = 0; op < OPS; op++) {
    int i = (int)(tu_rand(&rng) % LIVE);
    if (p[i]) {
      long bad = tu_verify(p[i], sz[i], seed[i]);
      if (bad >= 0 && failures++ < 5)
        CHECK_MSG(0, "%s: op %d: object of %zu bytes at %p corrupt at offset %ld", f->name, op, sz[i],
                  p[i], bad);
      f->free(p[i]);
    }
    uint64_t r = tu_rand(&rng);
    size_t size = (r & 7) == 0 ? r % 65536 : (r & 7) == 1 ? r % 300000 : r % 512;
    p[i] = f->malloc(size);
    if (!p[i]) {
      CHECK_MSG(0, "%s: malloc(%zu) returned NULL", f->name, size);
      return;
    }
    sz[i] = size;
    seed[i] = r;
    tu_fill(p[i], size, r);
  }
  CHECK_MSG(failures == 0, "%s: %d corrupt objects in the random mix", f->name, failures);
  for (int i = 0; i < LIVE; i++) {
    if (p[i]) CHECK(tu_verify(p[i], sz[i], seed[i]) < 0);
    f->free(p[i]);
    p[i] = NULL;
  }
}

/* free_sized with the exact requested size, for every edge size. */
static void test_free_sized(const family_t *f) {
  int ok = 1;
  for (int round = 0; round < 3; round++)
    for (size_t i = 0; i < QM_NEDGE; i++) {
      size_t req = QM_EDGE_SIZES[i];
      unsigned char *p = f->malloc(req);
      if (!p) { ok = 0; continue; }
      memset(p, 0x5a, req);
      f->free_sized(p, req);
    }
  CHECK_MSG(ok, "%s: malloc failed in the free_sized loop", f->name);
}

typedef void (*release_fn)(const family_t *f, void *p, size_t size);
static void release_free(const family_t *f, void *p, size_t size) { f->free(p); }
static void release_free_sized(const family_t *f, void *p, size_t size) { f->free_sized(p, size); }

/* Allocates, writes and releases LEAK_LOOP_BYTES in blocks of `size`; RSS must stay within bound. */
static void check_release_reclaims(const family_t *f, const char *how, release_fn release, size_t size) {
  void *warm = f->malloc(size); /* first use of a class may map its span: not a leak */
  if (warm) memset(warm, 1, size);
  release(f, warm, size);
  size_t before = tu_rss_bytes();
  int ok = 1;
  for (size_t done = 0; done < LEAK_LOOP_BYTES; done += size) {
    void *p = f->malloc(size);
    if (!p) { ok = 0; break; }
    memset(p, 0x33, size);
    release(f, p, size);
  }
  size_t after = tu_rss_bytes();
  CHECK_MSG(ok, "%s: malloc(%zu) failed in the %s loop", f->name, size, how);
  CHECK_MSG(after < before + RSS_BOUND,
            "%s: %s of %zu-byte blocks does not release: RSS %zu -> %zu KiB after %zu MiB churn",
            f->name, how, size, before >> 10, after >> 10, LEAK_LOOP_BYTES >> 20);
}

static void test_release_reclaims(const family_t *f) {
  static const size_t sizes[] = {4000, 100000, 200000, 1 << 20, 5 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    check_release_reclaims(f, "free", release_free, sizes[i]);
    check_release_reclaims(f, "free_sized", release_free_sized, sizes[i]);
  }
}

/* One heap behind both names: cross frees must work and be recognised as owned. */
static void test_cross_family(void) {
  for (size_t i = 0; i < QM_NEDGE; i++) {
    size_t n = QM_EDGE_SIZES[i];
    void *a = qm_malloc(n), *b = malloc(n);
    CHECK(a && b);
    CHECK_MSG(malloc_usable_size(a) >= n, "malloc_usable_size(qm_malloc(%zu)) too small", n);
    CHECK_MSG(qm_malloc_usable_size(b) >= n, "qm_malloc_usable_size(malloc(%zu)) too small", n);
    free(a);
    qm_free(b);
  }
}

int main(void) {
  for (size_t k = 0; k < QM_NFAMILIES; k++) {
    const family_t *f = &QM_FAMILIES[k];
    test_malloc_zero(f);
    test_free_null(f);
    test_edge_sizes_disjoint(f);
    test_random_mix(f);
    test_free_sized(f);
    test_release_reclaims(f);
  }
  test_cross_family();
  return tu_summary("api-malloc_free");
}
