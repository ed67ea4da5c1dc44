/* Size classes: request size -> class, and per-class constants derived from the generated table
 * (sizeclass_table.h, made by tools/gen_sizeclasses.py). Written once at process init, read-only
 * afterwards, so no lock. Does not decide anything about caching: see tcache.c and central.c. */
#include "internal.h"

/* One entry per 8-byte step of request size up to SMALL_MAX (64 KiB of table): one load, no branch
 * on the size range. Each entry is class << SIZECLASS_LOOKUP_SHIFT, the offset of the class's list
 * in a thread cache, so that malloc finds its list without a shift (one instruction, measured with
 * make fastpath). Filled a page at a time (internal.h): filled whole at init, all 64 KiB were
 * resident in every process; now a program keeps the pages of the sizes it asks for (one, for
 * most). 0 until filled: a malloc before init goes to the slow path, which initializes. */
uint16_t sizeclass_lookup[SIZECLASS_LOOKUP_SLOTS] __attribute__((aligned(SIZECLASS_LOOKUP_CHUNK * sizeof(uint16_t)))); /* a chunk, a page */

/* What follows from the table alone is computed by the compiler: read-only data, which no
 * process writes at start (a .bss array written at init cost a page fault in every process). */
#define SIZECLASS_SIZE_ROW(cls, size, pages) [cls] = size,
#define SIZECLASS_PAGES_ROW(cls, size, pages) [cls] = pages,
/* Divisibility test by multiplication (Lemire, Kaser & Kurz 2019): for 32-bit n and
 * M = floor((2^64 - 1) / d) + 1, n is a multiple of d iff n * M (mod 2^64) < M. One multiply
 * instead of a division on free()'s path. Class 0 keeps M = 0, which no offset passes: the
 * same test rejects pages that are not small-object pages. */
#define SIZECLASS_MAGIC_ROW(cls, size, pages) [cls] = UINT64_MAX / (size) + 1,
#define SIZECLASS_SPAN_OBJECTS_ROW(cls, size, pages) [cls] = (pages) * PAGE_SIZE / (size),
const uint32_t sizeclass_size[SIZECLASS_COUNT] = {SIZECLASS_ROWS(SIZECLASS_SIZE_ROW)};
const uint8_t sizeclass_pages[SIZECLASS_COUNT] = {SIZECLASS_ROWS(SIZECLASS_PAGES_ROW)};
const uint64_t sizeclass_magic[SIZECLASS_COUNT] = {SIZECLASS_ROWS(SIZECLASS_MAGIC_ROW)};
const uint16_t sizeclass_span_objects[SIZECLASS_COUNT] = {SIZECLASS_ROWS(SIZECLASS_SPAN_OBJECTS_ROW)};
QM_EARLY_DATA uint16_t sizeclass_batch[SIZECLASS_COUNT]; /* the transfer batch: from an option */

/* The page of the table from slot `first` (a multiple of SIZECLASS_LOOKUP_CHUNK): each slot gets
 * the smallest class from `cls` up that holds its size. Concurrent fills store the same values. */
static void sizeclass_fill_slots(size_t first, unsigned cls) {
  size_t end = first + SIZECLASS_LOOKUP_CHUNK < SIZECLASS_LOOKUP_SLOTS ? first + SIZECLASS_LOOKUP_CHUNK : SIZECLASS_LOOKUP_SLOTS;
  for (size_t slot = first; slot < end; slot++) {
    while (sizeclass_size[cls] < slot * 8) cls++;
    __atomic_store_n(&sizeclass_lookup[slot], (uint16_t)(cls << SIZECLASS_LOOKUP_SHIFT), __ATOMIC_RELAXED);
  }
}

void sizeclass_init(unsigned min_align, unsigned batch_max) {
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    uint32_t size = sizeclass_size[cls];
    uint32_t batch = (uint32_t)((64u << 10) / size);
    if (batch < 2) batch = 2;
    if (batch > batch_max) batch = batch_max;
    sizeclass_batch[cls] = (uint16_t)batch;
  }
  /* Requests of 0..8 bytes (slots 0 and 1) use the 8-byte class only when asked. */
  sizeclass_fill_slots(0, min_align == 8 ? SIZECLASS_EIGHT : SIZECLASS_EIGHT + 1);
}

unsigned sizeclass_fill(size_t n) {
  size_t first = sizeclass_slot(n) / SIZECLASS_LOOKUP_CHUNK * SIZECLASS_LOOKUP_CHUNK;
  /* Above the first page no slot reaches the 8-byte class, whatever min_align says. */
  if (first != 0) sizeclass_fill_slots(first, SIZECLASS_EIGHT + 1);
  return sizeclass_of_if_filled(n);
}

unsigned sizeclass_for_aligned(size_t size, size_t alignment) {
  if (size > SMALL_MAX || alignment > PAGE_SIZE || (alignment & (alignment - 1)) != 0) return 0;
  return sizeclass_aligned_from(sizeclass_of(size < alignment ? alignment : size), alignment);
}

bool sizeclass_check(void) {
  for (unsigned cls = 2; cls < SIZECLASS_COUNT; cls++) {
    if (sizeclass_size[cls] <= sizeclass_size[cls - 1]) return false;
    if (sizeclass_size[cls] % 16 != 0) return false;
    if ((size_t)sizeclass_pages[cls] * PAGE_SIZE < sizeclass_size[cls]) return false;
  }
  for (size_t n = 0; n <= SMALL_MAX; n++) {
    unsigned cls = sizeclass_of(n);
    if (cls == 0 || sizeclass_size[cls] < n) return false;
    if (cls > 2 && sizeclass_size[cls - 1] >= n) return false; /* not the smallest fit */
  }
  return true;
}
