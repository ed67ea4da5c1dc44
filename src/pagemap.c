/* Page map: page number -> span (and, for pages of small spans, the span's start and size class,
 * which is all free() needs). A two-level radix tree: readers take no lock and
 * see either NULL or a fully zeroed leaf (published with release order); all writers hold the
 * page heap's lock. Leaves are never freed, so a stale read is always safe memory. */
#include <string.h>

#include "internal.h"
#include "log.h"
#include "os.h"

pagemap_leaf_t *pagemap_root[PAGEMAP_ROOT_LEN];

bool pagemap_ensure(uintptr_t start, size_t npages) {
  uintptr_t first = start >> PAGEMAP_LEAF_SHIFT;
  uintptr_t last = (start + npages * PAGE_SIZE - 1) >> PAGEMAP_LEAF_SHIFT;
  if (last >= PAGEMAP_ROOT_LEN) return false;
  for (uintptr_t i = first; i <= last; i++) {
    if (os_read_to_write(&pagemap_root[i]) != NULL) continue; /* the root's page: 1 fault, not 2 */
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

/* Sets spans[] only. A small entry is nonzero only from a small span's carving (pagemap_set_carved)
 * to its return to the page heap (pagemap_clear_small), so the pages set here have 0 there already:
 * storing it again wrote pages of small[] that nothing else touches (at both ends of every new
 * chunk: 2 page faults in every process, mtbench heap-leak). QM_DEBUG builds check that. */
static void pagemap_set(uintptr_t addr, span_t *span) {
  pagemap_leaf_t *leaf = pagemap_root[addr >> PAGEMAP_LEAF_SHIFT];
  size_t i = (addr >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1);
  leaf->spans[i] = span;
  if (qm_debug && __atomic_load_n(&leaf->small[i], __ATOMIC_RELAXED) != 0)
    log_fatal("pagemap_set: the page at %p keeps a small entry", (void *)addr);
}

void pagemap_set_page(uintptr_t addr, span_t *span) { pagemap_set(addr, span); }

void pagemap_set_ends(span_t *span) {
  pagemap_set(span->start, span);
  pagemap_set(span->start + (span->npages - 1) * PAGE_SIZE, span);
}

void pagemap_set_small(span_t *span) {
  for (uint32_t i = 0; i < span->npages; i++) pagemap_set(span->start + i * PAGE_SIZE, span);
}

/* Writes small[] only (pagemap_store_small), not through pagemap_set: spans[] belongs to the page heap's lock (its
 * coalescing reads a neighbour's entry), and this runs under the class lock (ThreadSanitizer, in
 * checked-tsan, reports a rewrite of spans[] here racing with pageheap_insert_coalesced). */
void pagemap_set_carved(span_t *span, uint32_t from, uint32_t to) {
  uintptr_t entry = PAGEMAP_SMALL_ENTRY(span->start, span->sizeclass);
  for (uint32_t i = from; i < to; i++) {
    uintptr_t addr = span->start + i * PAGE_SIZE;
    pagemap_store_small(pagemap_leaf_of(addr), addr, entry); /* an atomic load: the class lock is not the page heap's */
  }
}

/* Its carved pages' small entries go back to 0 (free()'s fast path no longer accepts pointers
 * there), and every page leaves spans[]. */
void pagemap_clear_small(span_t *span) {
  for (uint32_t i = 0; i < span->npages; i++) {
    uintptr_t addr = span->start + i * PAGE_SIZE;
    pagemap_store_small(pagemap_root[addr >> PAGEMAP_LEAF_SHIFT], addr, 0);
    pagemap_set(addr, NULL);
  }
}

void pagemap_clear_ends(span_t *span) {
  pagemap_set(span->start, NULL);
  pagemap_set(span->start + (span->npages - 1) * PAGE_SIZE, NULL);
}
