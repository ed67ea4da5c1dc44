/* Page map: page number -> span (and, for pages of small spans, the span's start and size class,
 * which is all free() needs). A two-level radix tree: readers take no lock and
 * see either NULL or a fully zeroed leaf (published with release order); all writers hold the
 * page heap's lock. Leaves are never freed, so a stale read is always safe memory. */
#include <string.h>

#include "internal.h"
#include "os.h"

pagemap_leaf_t *pagemap_root[PAGEMAP_ROOT_LEN];

bool pagemap_ensure(uintptr_t start, size_t npages) {
  uintptr_t first = start >> PAGEMAP_LEAF_SHIFT;
  uintptr_t last = (start + npages * PAGE_SIZE - 1) >> PAGEMAP_LEAF_SHIFT;
  if (last >= PAGEMAP_ROOT_LEN) return false;
  for (uintptr_t i = first; i <= last; i++) {
    if (pagemap_root[i] != NULL) continue;
    pagemap_leaf_t *leaf = os_map(sizeof(pagemap_leaf_t), PAGE_SIZE, OS_SPARSE, OS_GUARD_NONE);
    if (leaf == NULL) return false;
    stats_metadata_add(sizeof(pagemap_leaf_t));
    __atomic_store_n(&pagemap_root[i], leaf, __ATOMIC_RELEASE);
  }
  return true;
}

span_t *pagemap_span(uintptr_t addr) {
  pagemap_leaf_t *leaf = pagemap_leaf_of(addr);
  return leaf ? leaf->spans[(addr >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1)] : NULL;
}

/* free()'s entry for the page at addr (whose leaf exists): published with release order. */
static void pagemap_store_small(pagemap_leaf_t *leaf, uintptr_t addr, uintptr_t small) {
  __atomic_store_n(&leaf->small[(addr >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1)], small, __ATOMIC_RELEASE);
}

static void pagemap_set(uintptr_t addr, span_t *span, uintptr_t small) {
  pagemap_leaf_t *leaf = pagemap_root[addr >> PAGEMAP_LEAF_SHIFT];
  leaf->spans[(addr >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1)] = span;
  pagemap_store_small(leaf, addr, small);
}

void pagemap_set_page(uintptr_t addr, span_t *span) { pagemap_set(addr, span, 0); }

void pagemap_set_ends(span_t *span) {
  pagemap_set(span->start, span, 0);
  pagemap_set(span->start + (span->npages - 1) * PAGE_SIZE, span, 0);
}

void pagemap_set_small(span_t *span) {
  for (uint32_t i = 0; i < span->npages; i++) pagemap_set(span->start + i * PAGE_SIZE, span, 0);
}

/* Writes small[] only (pagemap_store_small), not through pagemap_set: spans[] belongs to the page heap's lock (its
 * coalescing reads a neighbour's entry), and this runs under the class lock (ThreadSanitizer, in
 * checked-tsan, reports a rewrite of spans[] here racing with pageheap_insert_coalesced). */
void pagemap_set_carved(span_t *span, uint32_t from, uint32_t to) {
  uintptr_t entry = PAGEMAP_SMALL_ENTRY(span->start, span->sizeclass);
  for (uint32_t i = from; i < to; i++) {
    uintptr_t addr = span->start + i * PAGE_SIZE;
    pagemap_store_small(pagemap_root[addr >> PAGEMAP_LEAF_SHIFT], addr, entry);
  }
}

void pagemap_clear_small(span_t *span) {
  for (uint32_t i = 0; i < span->npages; i++) pagemap_set(span->start + i * PAGE_SIZE, NULL, 0);
}

void pagemap_clear_ends(span_t *span) {
  pagemap_set(span->start, NULL, 0);
  pagemap_set(span->start + (span->npages - 1) * PAGE_SIZE, NULL, 0);
}
