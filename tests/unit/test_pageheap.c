/* Page heap: coalescing of free neighbours, aligned carving, decay releasing a span that is then
 * reused (and known zero), the retain cap and its growth with the heap in use, release of
 * everything (trim), in-place growth of a large block, and huge blocks as mappings of their own
 * that mremap moves without copying. */
#include <string.h>

#include "internal.h"
#include "testutil.h"

static span_t *free_span_at(uintptr_t addr) {
  span_t *s = pagemap_span(addr);
  return s && (s->state == SPAN_FREE_BACKED || s->state == SPAN_FREE_RELEASED) ? s : NULL;
}

/* ---- the program's free of a large block, checked under the lock ------------------------------
 * free() finds a large block's span through the page map without the lock; by the time it holds the
 * lock, another thread's free of the same block may have freed it, and a third thread may have been
 * given its header for a block elsewhere. pageheap_free_block must then stop as a double free, not
 * free that other block. The header's reuse is set up here by hand: a span whose start is not the
 * freed address, as a reused header would be. */
typedef struct {
  span_t *span;
  uintptr_t start;
} free_block_args_t;

static void free_block_body(void *arg) {
  free_block_args_t *a = arg;
  pageheap_free_block(a->span, a->start);
}

static void expect_double_free(span_t *span, uintptr_t start, const char *what) {
  free_block_args_t args = {span, start};
  char out[256], want[80];
  int status = 0;
  tu_stderr_of_child(free_block_body, &args, out, sizeof out, &status);
  snprintf(want, sizeof want, "qmalloc: free(): double free %p\n", (void *)start);
  CHECK_MSG(strcmp(out, want) == 0, "%s: printed \"%s\"", what, out);
  CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "%s: the child ended with status %#x", what, status);
}

static void test_free_block_checked(void) {
  span_t *mine = pageheap_alloc(3, 1, 0, NULL), *other = pageheap_alloc(2, 1, 0, NULL);
  CHECK(mine != NULL && other != NULL);
  if (mine == NULL || other == NULL) return;
  uintptr_t mine_start = mine->start;
  /* The header now describes another block (other's start): the free of mine_start stops, and
   * the block the header describes stays in use. */
  expect_double_free(other, mine_start, "a header reused for another block");
  CHECK(other->state == SPAN_LARGE && pagemap_span(other->start) == other);
  /* Its own start: freed. */
  pageheap_free_block(mine, mine_start);
  CHECK(free_span_at(mine_start) != NULL);
  /* Freed already (the other thread's free came first, the header not reused): stops. */
  span_t *freed = free_span_at(mine_start);
  expect_double_free(freed, mine_start, "a span freed already");
  /* A huge block (a mapping of its own) is checked the same way. */
  size_t huge_pages = (size_t)option(OPTION_RELEASE_LARGE) / PAGE_SIZE + 1;
  span_t *huge = pageheap_alloc(huge_pages, 1, 0, NULL);
  CHECK(huge != NULL && huge->direct);
  if (huge != NULL) {
    expect_double_free(huge, other->start, "a huge block's header naming another block");
    uintptr_t huge_start = huge->start;
    pageheap_free_block(huge, huge_start);
    CHECK(pagemap_span(huge_start) == NULL);
  }
  pageheap_free_block(other, other->start);
}

int main(void) {
  init_process();
  options_values[OPTION_DECAY_MS] = 3600000; /* nothing decays unless a test says so */
  options_values[OPTION_RETAIN_MAX] = (long long)1 << 40;

  /* Three neighbours carved in order from one free span, freed out of order: one free span. */
  span_t *a = pageheap_alloc(2, 1, 0, NULL), *b = pageheap_alloc(3, 1, 0, NULL), *c = pageheap_alloc(4, 1, 0, NULL);
  CHECK(a && b && c);
  CHECK_EQ(b->start, a->start + 2 * PAGE_SIZE);
  CHECK_EQ(c->start, b->start + 3 * PAGE_SIZE);
  uintptr_t base = a->start;
  pageheap_free(a);
  pageheap_free(c);
  CHECK(free_span_at(base) != NULL && free_span_at(base)->npages == 2);
  pageheap_free(b);
  span_t *merged = free_span_at(base);
  CHECK(merged != NULL && merged->start == base && merged->npages >= 9);
  CHECK(merged != NULL && merged->state == SPAN_FREE_BACKED);

  /* Aligned carving: the start is aligned and the pages before it stay free. */
  span_t *al = pageheap_alloc(3, 16, 0, NULL);
  CHECK(al != NULL && al->start % (16 * PAGE_SIZE) == 0);
  pageheap_free(al);

  /* Decay 0: a freed span is released at once; the next request of that size reuses it, zeroed. */
  pageheap_stats_t before, after;
  span_t *d = pageheap_alloc(64, 1, 0, NULL);
  memset((void *)d->start, 0xab, 64 * PAGE_SIZE);
  uintptr_t dstart = d->start;
  pageheap_stats(&before);
  options_values[OPTION_DECAY_MS] = 0;
  pageheap_free(d);
  pageheap_stats(&after);
  CHECK(after.released_bytes_total >= before.released_bytes_total + 64 * PAGE_SIZE);
  CHECK(free_span_at(dstart) && free_span_at(dstart)->state == SPAN_FREE_RELEASED);
  options_values[OPTION_DECAY_MS] = 3600000;
  CHECK(((unsigned char *)dstart)[100] == 0); /* MADV_DONTNEED: the pages are zero again */
  /* Nothing backed left: the next span must come from released pages. (A pinned page keeps every
   * free run shorter than a chunk, so release_all does not unmap the region: see below.) */
  span_t *pin = pageheap_alloc(1, 1, 0, NULL);
  pageheap_release_all();
  size_t mapped_before = stats_mapped();
  zero_range_t zero = {0, 0};
  span_t *again = pageheap_alloc(64, 1, 0, &zero);
  CHECK(again != NULL && zero.lo == again->start && zero.hi == again->start + 64 * PAGE_SIZE);
  CHECK_EQ(stats_mapped(), mapped_before); /* reused, no new address space */
  pageheap_free(again);
  pageheap_free(pin);
  /* Without the pin, a whole free chunk is unmapped by release_all (address space goes back). */
  size_t mapped_full = stats_mapped();
  pageheap_stats(&before);
  pageheap_release_all();
  pageheap_stats(&after);
  CHECK(after.unmapped_bytes_total - before.unmapped_bytes_total >= OS_CHUNK_SIZE);
  CHECK(stats_mapped() <= mapped_full - OS_CHUNK_SIZE);

  /* Retain cap 0: the backed bytes never stay. */
  options_values[OPTION_RETAIN_MAX] = 0;
  span_t *r = pageheap_alloc(8, 1, 0, NULL);
  memset((void *)r->start, 1, 8 * PAGE_SIZE);
  pageheap_free(r);
  pageheap_stats(&after);
  CHECK_EQ(after.free_backed_bytes, 0);

  /* The retain cap grows with the pages in use, up to twice retain_max: a block freed while as
   * much is in use stays backed (reused without faults), and goes back once the heap shrinks.
   * With the cap at retain_max alone, the first check fails. */
  const size_t cap = 32 * PAGE_SIZE;
  options_values[OPTION_RETAIN_MAX] = (long long)cap;
  pageheap_release_all();
  span_t *kept = pageheap_alloc(32, 1, 0, NULL), *turned = pageheap_alloc(48, 1, 0, NULL);
  CHECK(kept != NULL && turned != NULL);
  memset((void *)turned->start, 1, 48 * PAGE_SIZE);
  pageheap_free(turned);
  pageheap_stats(&after);
  CHECK_MSG(after.free_backed_bytes >= 48 * PAGE_SIZE, "%zu KiB backed of a 384 KiB block freed under a 512 KiB cap",
            after.free_backed_bytes >> 10);
  pageheap_free(kept);
  pageheap_stats(&after);
  size_t in_use = after.small_span_bytes + after.large_bytes;
  CHECK_MSG(after.free_backed_bytes <= cap + (in_use < cap ? in_use : cap), "%zu KiB backed, %zu KiB in use",
            after.free_backed_bytes >> 10, in_use >> 10);
  options_values[OPTION_RETAIN_MAX] = (long long)1 << 40;

  /* Trim releases every backed page at once. */
  span_t *t = pageheap_alloc(16, 1, 0, NULL);
  memset((void *)t->start, 1, 16 * PAGE_SIZE);
  pageheap_free(t);
  pageheap_stats(&before);
  CHECK(before.free_backed_bytes >= 16 * PAGE_SIZE);
  CHECK(pageheap_release_all() >= 16 * PAGE_SIZE);
  pageheap_stats(&after);
  CHECK_EQ(after.free_backed_bytes, 0);

  /* In place: shrink gives the tail back; grow takes a free right neighbour. */
  span_t *g = pageheap_alloc(10, 1, 0, NULL);
  uintptr_t gstart = g->start;
  CHECK(pageheap_resize_in_place(g, 4));
  CHECK(g->npages == 4 && free_span_at(gstart + 4 * PAGE_SIZE) != NULL);
  CHECK(pageheap_resize_in_place(g, 10));
  CHECK(g->start == gstart && g->npages == 10);
  CHECK(pagemap_span(gstart + 9 * PAGE_SIZE) == g);
  pageheap_free(g);

  /* Huge: a mapping of its own; mremap keeps contents; freeing unmaps it. */
  size_t huge_pages = ((size_t)option(OPTION_RELEASE_LARGE) >> PAGE_SHIFT) + 1;
  span_t *h = pageheap_alloc(huge_pages, 1, 0, &zero);
  CHECK(h != NULL && h->direct && zero.lo == h->start && zero.hi == h->start + h->npages * PAGE_SIZE);
  memset((void *)h->start, 0x5a, huge_pages * PAGE_SIZE);
  span_t *h2 = pageheap_remap(h, huge_pages * 2);
  CHECK(h2 != NULL);
  if (h2) {
    unsigned char *bytes = (unsigned char *)h2->start;
    CHECK(bytes[0] == 0x5a && bytes[huge_pages * PAGE_SIZE - 1] == 0x5a && bytes[huge_pages * PAGE_SIZE] == 0);
    CHECK(pagemap_span(h2->start) == h2);
    pageheap_stats(&before);
    pageheap_free(h2);
    pageheap_stats(&after);
    CHECK_EQ(before.direct_bytes - after.direct_bytes, 2 * huge_pages * PAGE_SIZE);
  }
  /* Kernel pages larger than qmalloc's (os_page 64K: a 64 KiB-page system): a release gives back
   * only whole 64 KiB pages; the edges of a span that are not whole kernel pages stay backed and
   * read as what was written (calloc must clear them), and every page of a released span reads
   * zero (it may merge with never-touched released pages, which need no alignment). */
  options_values[OPTION_OS_PAGE] = 64 << 10;
  options_values[OPTION_DECAY_MS] = 0;
  options_values[OPTION_RETAIN_MAX] = 64 << 20;
  span_t *shift = pageheap_alloc(3, 1, 0, NULL); /* moves the next span off a 64 KiB boundary */
  span_t *x = pageheap_alloc(40, 1, 0, NULL);
  CHECK(shift != NULL && x != NULL);
  uintptr_t xs = x->start, xe = x->start + 40 * PAGE_SIZE;
  memset((void *)xs, 0x5a, 40 * PAGE_SIZE);
  pageheap_free(x); /* decay 0: released at once, as far as whole 64 KiB pages go */
  size_t released_inside = 0, backed_inside = 0;
  for (uintptr_t a = xs; a < xe; a += PAGE_SIZE) {
    span_t *s = NULL;
    for (uintptr_t b = a; b >= xs - (64 << 10) && !s; b -= PAGE_SIZE) {
      span_t *c = pagemap_span(b);
      if (c && c->start <= a && a < c->start + (uintptr_t)c->npages * PAGE_SIZE && pagemap_span(c->start) == c) s = c;
    }
    CHECK_MSG(s != NULL, "no free span covers %#lx", (unsigned long)a);
    if (!s) break;
    if (s->state == SPAN_FREE_RELEASED) {
      CHECK_MSG(((unsigned char *)a)[0] == 0 && ((unsigned char *)a)[PAGE_SIZE - 1] == 0,
                "page %#lx of a released span is not zero", (unsigned long)a);
      released_inside += PAGE_SIZE;
    } else {
      CHECK(s->state == SPAN_FREE_BACKED && ((unsigned char *)a)[0] == 0x5a);
      backed_inside += PAGE_SIZE;
    }
  }
  CHECK_MSG(released_inside >= 3 * (64 << 10), "only %zu bytes of a 320 KiB span released", released_inside);
  printf("os_page 64K: of a 320 KiB span, %zu KiB released, %zu KiB kept backed\n", released_inside >> 10, backed_inside >> 10);
  pageheap_free(shift);
  options_values[OPTION_OS_PAGE] = 0;

  /* A backed span too short for a request, next to a released one: joined, so its pages are
   * reused (they keep what was written: no fault, no zero) and only the difference comes from the
   * released neighbour, which keeps the rest. Before, the request took released pages elsewhere. */
  options_values[OPTION_DECAY_MS] = 3600000;
  options_values[OPTION_RETAIN_MAX] = (long long)1 << 40;
  pageheap_release_all(); /* no other backed span can serve the request */
  span_t *old = pageheap_alloc(200, 1, 0, NULL);
  CHECK(old != NULL);
  uintptr_t old_start = old->start;
  memset((void *)old_start, 0x77, 200 * PAGE_SIZE);
  pageheap_free(old);
  span_t *right = free_span_at(old_start + 200 * PAGE_SIZE);
  CHECK(right != NULL && right->state == SPAN_FREE_RELEASED && right->npages >= 100);
  size_t right_pages = right ? right->npages : 0;
  /* Its first 200 pages hold data; the 100 taken from the released neighbour read as zero. */
  span_t *grown = pageheap_alloc(300, 1, 0, &zero);
  CHECK(grown != NULL && grown->start == old_start && grown->npages == 300);
  CHECK(zero.lo == old_start + 200 * PAGE_SIZE && zero.hi == old_start + 300 * PAGE_SIZE);
  CHECK(((unsigned char *)old_start)[0] == 0x77 && ((unsigned char *)old_start)[200 * PAGE_SIZE - 1] == 0x77);
  span_t *rest = free_span_at(old_start + 300 * PAGE_SIZE);
  CHECK(rest != NULL && rest->state == SPAN_FREE_RELEASED && rest->npages == right_pages - 100);
  if (grown) pageheap_free(grown);

  /* An aligned request, and a backed span between released neighbours that has room for it from
   * its own start (aligned) but not from any start (npages + align - 1 pages): taken, its pages
   * reused, where fresh pages were taken before (the hardened build's 1 MiB blocks at 1 MiB, freed
   * and asked for again after malloc_trim, each came from new pages). */
  pageheap_release_all(); /* no other backed span can serve the request */
  span_t *aligned = pageheap_alloc(128, 128, 0, NULL);
  CHECK(aligned != NULL && aligned->start % (128 * PAGE_SIZE) == 0);
  uintptr_t aligned_start = aligned ? aligned->start : 0;
  if (aligned) memset((void *)aligned_start, 0x55, 128 * PAGE_SIZE);
  if (aligned) pageheap_free(aligned);
  span_t *freed = free_span_at(aligned_start);
  CHECK(freed != NULL && freed->state == SPAN_FREE_BACKED && freed->npages < 128 + 127);
  span_t *again_aligned = pageheap_alloc(128, 128, 0, &zero);
  CHECK(again_aligned != NULL && again_aligned->start == aligned_start);
  CHECK(zero.lo == zero.hi); /* backed: nothing known to read as zero */
  CHECK(((unsigned char *)aligned_start)[0] == 0x55);
  if (again_aligned) pageheap_free(again_aligned);

  test_free_block_checked();
  return tu_summary("pageheap");
}
