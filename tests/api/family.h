/* The two entry-point families every conformance test runs through: the standard names (which
 * libqmalloc exports and this program's link resolves to it) and the qm_* names of
 * include/qmalloc.h. Both must behave identically, so each test loops over QM_FAMILIES.
 * free_sized/free_aligned_sized are C23; glibc 2.36 does not declare them, so they are declared here. */
#ifndef QM_TEST_FAMILY_H
#define QM_TEST_FAMILY_H

#include <malloc.h>
#include <stdlib.h>

#include "qmalloc.h"

void free_sized(void *ptr, size_t size);
void free_aligned_sized(void *ptr, size_t alignment, size_t size);

typedef struct {
  const char *name;
  void *(*malloc)(size_t);
  void (*free)(void *);
  void *(*calloc)(size_t, size_t);
  void *(*realloc)(void *, size_t);
  void *(*reallocarray)(void *, size_t, size_t);
  int (*posix_memalign)(void **, size_t, size_t);
  void *(*aligned_alloc)(size_t, size_t);
  void *(*memalign)(size_t, size_t);
  void *(*valloc)(size_t);
  void *(*pvalloc)(size_t);
  size_t (*usable_size)(void *);
  void (*free_sized)(void *, size_t);
  void (*free_aligned_sized)(void *, size_t, size_t);
} family_t;

static const family_t QM_FAMILIES[] = {
  {"std", malloc, free, calloc, realloc, reallocarray, posix_memalign, aligned_alloc, memalign,
   valloc, pvalloc, malloc_usable_size, free_sized, free_aligned_sized},
  {"qm", qm_malloc, qm_free, qm_calloc, qm_realloc, qm_reallocarray, qm_posix_memalign,
   qm_aligned_alloc, qm_memalign, qm_valloc, qm_pvalloc, qm_malloc_usable_size, qm_free_sized,
   qm_free_aligned_sized},
};
#define QM_NFAMILIES (sizeof QM_FAMILIES / sizeof QM_FAMILIES[0])

/* Request sizes that straddle every kind of boundary a size-class table has: the 8-byte steps at
 * the bottom, powers of two and their neighbours, page multiples, the small/large limit (256 KiB)
 * and a few large sizes. */
static const size_t QM_EDGE_SIZES[] = {
  0, 1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 40, 48, 63, 64, 65, 80, 96, 100, 112,
  127, 128, 129, 160, 192, 255, 256, 257, 384, 511, 512, 513, 640, 768, 1000, 1023, 1024, 1025,
  1536, 2047, 2048, 2049, 3000, 4095, 4096, 4097, 5000, 8191, 8192, 8193, 12288, 16383, 16384,
  16385, 30000, 32767, 32768, 32769, 65535, 65536, 65537, 100000, 131071, 131072, 131073, 200000,
  262143, 262144, 262145, 300000, 524288, 1048575, 1048576, 1048577, 3 << 20, (4 << 20) + 1,
};
#define QM_NEDGE (sizeof QM_EDGE_SIZES / sizeof QM_EDGE_SIZES[0])

#define QM_IS_ALIGNED(p, a) (((uintptr_t)(p) & ((uintptr_t)(a)-1)) == 0)

#endif
