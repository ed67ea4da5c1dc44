/* A large block never starts with a free tag. Pages go from small spans back to the page heap
 * with their free objects still tagged (word 1 = the object's key: freelist.h), and a large block
 * handed out at such an object's address would start with its own key in word 1. The program need
 * not write there; realloc copies a block's first words to the block it moves to; and once a small
 * object is handed out at that address again with those words, a live object carries its own tag
 * and its free stops the program as a double free that is not one (found with the heap profiler's
 * one-page blocks: t-test1 with 4 threads failed 1 run in 8). alloc_large wipes the word. */
#include <string.h>

#include "freelist.h"
#include "internal.h"
#include "qmalloc.h"
#include "testutil.h"

int main(void) {
  init_process();
  options_values[OPTION_DECAY_MS] = 3600000; /* the freed span stays backed, its bytes as they were */
  options_values[OPTION_RETAIN_MAX] = (long long)1 << 40;
  const size_t npages = (SMALL_MAX >> PAGE_SHIFT) + 8; /* a large block's size in pages */

  /* A small span's first object, free: tagged, as central_carve and every free leave it. */
  unsigned cls = sizeclass_of(4096);
  span_t *small = pageheap_alloc(npages, 1, cls, NULL);
  CHECK(small != NULL);
  if (small == NULL) return tu_summary("unit-stale_tag");
  uintptr_t start = small->start;
  freelist_mark((void *)start, NULL, freelist_key((void *)start));
  pageheap_free(small);

  /* The next large block of that many pages is carved from the front of that free run. */
  void *block = qm_malloc(npages * PAGE_SIZE);
  CHECK_MSG(block == (void *)start, "setup: the large block is at %p, not at the freed span %p", block, (void *)start);
  if (block == (void *)start)
    CHECK_MSG(!freelist_tagged(block, freelist_key(block)), "the large block %p starts with its own free tag", block);

  /* And through realloc: its first words moved into a small block keep no tag of any address. */
  void *moved = qm_realloc(block, 64);
  CHECK(moved != NULL && !freelist_tagged(moved, freelist_key(moved)));
  qm_free(moved);
  return tu_summary("unit-stale_tag");
}
