/* What the unit tests that free large blocks and watch their pages go back to the OS share
 * (test_mallopt.c, test_release.c): the page heap's statistics, and a batch of large blocks
 * allocated, touched and freed. Include after internal.h and testutil.h. */
#ifndef QM_TEST_HEAP_UTIL_H
#define QM_TEST_HEAP_UTIL_H

#include <string.h>

static inline pageheap_stats_t heap(void) {
  pageheap_stats_t s;
  pageheap_stats(&s);
  return s;
}

/* Allocates and touches `count` blocks of `size` bytes (large spans, when size is below
 * release_large and over SMALL_MAX), then frees them all; returns released_bytes_total from just
 * before the frees. */
#define HEAP_UTIL_MAX_BLOCKS 64
static inline uint64_t free_large_blocks(int count, size_t size) {
  void *blocks[HEAP_UTIL_MAX_BLOCKS];
  CHECK(count <= HEAP_UTIL_MAX_BLOCKS);
  if (count > HEAP_UTIL_MAX_BLOCKS) count = HEAP_UTIL_MAX_BLOCKS;
  for (int i = 0; i < count; i++) {
    blocks[i] = malloc(size);
    CHECK(blocks[i] != NULL);
    if (blocks[i] != NULL) memset(blocks[i], 1, size);
  }
  uint64_t before = heap().released_bytes_total;
  for (int i = 0; i < count; i++) free(blocks[i]);
  return before;
}

#endif
