/* Page map: lookups of small and large blocks, rejection of foreign and out-of-range
 * addresses, entries cleared when spans go back. */
#include "internal.h"
#include "testutil.h"

int main(void) {
  init_process();
  CHECK(pagemap_leaf_of(0) == NULL);
  CHECK(pagemap_leaf_of((uintptr_t)1 << 48) == NULL);
  CHECK(pagemap_leaf_of(UINTPTR_MAX) == NULL);
  int on_stack;
  CHECK(pagemap_span((uintptr_t)&on_stack) == NULL);

  /* A small span's pages map to it at once; free()'s small entry comes page by page, as central.c
   * carves them. */
  span_t *small = pageheap_alloc(3, 1, 5, NULL);
  CHECK(small != NULL && small->state == SPAN_SMALL);
  for (uint32_t carved = 0; carved <= 3; carved++) {
    if (carved > 0) pagemap_set_carved(small, carved - 1, carved);
    for (uint32_t i = 0; i < 3; i++) {
      uintptr_t page = small->start + i * PAGE_SIZE;
      CHECK(pagemap_span(page + 100) == small);
      pagemap_leaf_t *leaf = pagemap_leaf_of(page);
      CHECK_EQ(leaf->small[(page >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1)], i < carved ? PAGEMAP_SMALL_ENTRY(small->start, 5) : 0);
    }
  }
  uintptr_t start = small->start;
  pageheap_free(small);
  pagemap_leaf_t *leaf = pagemap_leaf_of(start + PAGE_SIZE);
  CHECK_EQ(leaf->small[((start + PAGE_SIZE) >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1)], 0);

  span_t *large = pageheap_alloc(10, 1, 0, NULL);
  CHECK(large != NULL && large->state == SPAN_LARGE);
  CHECK(pagemap_span(large->start) == large);
  CHECK(pagemap_span(large->start + 9 * PAGE_SIZE) == large);
  pageheap_free(large);
  return tu_summary("pagemap");
}
