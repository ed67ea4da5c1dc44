/* The hardened build's parking of free pages. A freed large block must stay inaccessible until the
 * page heap hands its pages out again (docs/hardening.md), and mprotect does that by rewriting
 * every page-table entry of the block, twice: to PROT_NONE at free and back at reuse, 0.3 ms each
 * for a 17 MiB block here (mtbench large-blocks took 2.4 times the default build's time). Instead,
 * every page-heap chunk gets a shadow mapping of its size, somewhere the program is never told of,
 * and a freed block's pages move there (os_move_pages: the kernel moves whole page tables, about
 * 10 us for 16 MiB), leaving the block's addresses mapped but empty, which mprotect then makes
 * PROT_NONE with no entry to rewrite. When the page heap hands any of those addresses out again,
 * the pages move back: reused without a page fault, as in the default build.
 * A free span whose range may hold parked or protected pages carries span->parked. What a move
 * cannot do is done the old way, and is always safe because a free span's contents do not matter:
 * a park that fails leaves the pages in place, protected; an unpark that fails makes the range
 * accessible again (its pages, if any, stay where they are) and drops the shadow's.
 * The shadows are found through a table of the chunks' ranges; a range that leaves the page heap
 * (pageheap_unmap_free) leaves the table with its shadow, so a move never reaches memory that is
 * not qmalloc's. Lock: the page heap's (every caller holds it). Callers: pageheap.c. */
#include "internal.h"
#include "os.h"

/* A run of page-heap address space and its shadow (the shadow of x is shadow + (x - start)). The
 * default build keeps one unused entry. */
typedef struct park_range_s {
  uintptr_t start, end, shadow;
} park_range_t;

#define PARK_RANGES_MAX (QM_HARDENED_BUILD ? 4096 : 1)
static park_range_t park_ranges[PARK_RANGES_MAX]; /* sorted by start, disjoint */
static size_t park_range_count;

/* The index of the first range that ends after addr (park_range_count if none). */
static size_t park_find(uintptr_t addr) {
  size_t lo = 0, hi = park_range_count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (park_ranges[mid].end <= addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static bool park_insert(size_t at, park_range_t range) {
  /* (qm_hardened: the default build compiles nothing of it) */
  if (!qm_hardened || park_range_count == PARK_RANGES_MAX) return false;
  for (size_t i = park_range_count; i > at; i--) park_ranges[i] = park_ranges[i - 1];
  park_ranges[at] = range;
  park_range_count++;
  return true;
}

static void park_remove(size_t at) {
  if (!qm_hardened) return;
  park_range_count--;
  for (size_t i = at; i < park_range_count; i++) park_ranges[i] = park_ranges[i + 1];
}

void harden_park_add_chunk(uintptr_t start, size_t bytes) {
  if (park_range_count == PARK_RANGES_MAX) return; /* its freed blocks are protected in place */
  void *shadow = os_map_shadow(bytes, start); /* alike modulo 2 MiB: moves shift whole tables */
  if (shadow == NULL) return;
  /* (room: tested above) */
  (void)park_insert(park_find(start), (park_range_t){start, start + bytes, (uintptr_t)shadow});
}

void harden_park_forget(uintptr_t start, size_t bytes) {
  uintptr_t end = start + bytes;
  size_t i = park_find(start);
  while (i < park_range_count && park_ranges[i].start < end) {
    park_range_t r = park_ranges[i];
    uintptr_t lo = r.start > start ? r.start : start, hi = r.end < end ? r.end : end;
    (void)os_unmap_shadow((void *)(r.shadow + (lo - r.start)), hi - lo);
    park_remove(i);
    /* The part before the cut takes the slot just freed; the part after, if any, needs one more. */
    if (r.start < lo) (void)park_insert(i++, (park_range_t){r.start, lo, r.shadow});
    if (hi < r.end) { /* the last range it cuts: the loop ends here */
      park_range_t right = {hi, r.end, r.shadow + (hi - r.start)};
      /* No room to keep it: its shadow goes too (its free spans' pages are then protected in
       * place: park_each finds no shadow for them). */
      if (!park_insert(i, right)) (void)os_unmap_shadow((void *)right.shadow, r.end - hi);
      break;
    }
  }
}

/* Calls fn(piece, shadow of piece or 0, size) for each piece of [start, start + bytes) that lies
 * inside one range of the table, or in none (shadow 0); false if any call was. */
static bool park_each(uintptr_t start, size_t bytes, bool (*fn)(uintptr_t, uintptr_t, size_t)) {
  uintptr_t end = start + bytes;
  bool all = true;
  for (uintptr_t at = start; at < end;) {
    size_t i = park_find(at);
    uintptr_t next, shadow = 0;
    if (i < park_range_count && park_ranges[i].start <= at) {
      next = park_ranges[i].end < end ? park_ranges[i].end : end;
      shadow = park_ranges[i].shadow + (at - park_ranges[i].start);
    } else {
      next = i < park_range_count && park_ranges[i].start < end ? park_ranges[i].start : end;
    }
    all &= fn(at, shadow, next - at);
    at = next;
  }
  return all;
}

static bool park_piece(uintptr_t piece, uintptr_t shadow, size_t size) {
  return shadow != 0 && os_move_pages((void *)piece, size, (void *)shadow);
}

static bool unpark_piece(uintptr_t piece, uintptr_t shadow, size_t size) {
  /* Moved back, the range is accessible, as the shadow is. */
  if (shadow != 0 && os_move_pages((void *)shadow, size, (void *)piece)) return true;
  bool ok = os_protect((void *)piece, size, true);
  if (shadow != 0) (void)os_release((void *)shadow, size); /* stale pages must not come back later */
  return ok;
}

static bool release_piece(uintptr_t piece, uintptr_t shadow, size_t size) {
  (void)piece;
  return shadow == 0 || os_release((void *)shadow, size);
}

void harden_park(uintptr_t start, size_t bytes) {
  (void)park_each(start, bytes, park_piece); /* a piece not moved is protected in place, below */
  (void)os_protect((void *)start, bytes, false); /* empty where the pages moved: no entry to rewrite */
}

void harden_unpark(uintptr_t start, size_t bytes) { (void)park_each(start, bytes, unpark_piece); }

bool harden_park_release(uintptr_t start, size_t bytes) { return park_each(start, bytes, release_piece); }

uintptr_t harden_park_shadow_of(uintptr_t start, size_t bytes) {
  size_t i = park_find(start);
  if (i >= park_range_count || park_ranges[i].start > start || park_ranges[i].end < start + bytes) return 0;
  return park_ranges[i].shadow + (start - park_ranges[i].start);
}
