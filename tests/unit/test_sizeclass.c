/* Size classes: the generated table's invariants (monotonic, 16-byte multiples, smallest fit),
 * the waste bound above 128 bytes, cache-line starts for multiples of 64, and the 8-byte class
 * being used only when min_align is 8. */
#include "internal.h"
#include "qmalloc.h"
#include "testutil.h"

int main(void) {
  init_process();
  CHECK(sizeclass_check());
  CHECK(SIZECLASS_COUNT - 1 <= 255); /* classes fit the page map's 8 bits */
  CHECK_EQ(sizeclass_size[sizeclass_of(SMALL_MAX)], SMALL_MAX);
  CHECK_EQ(sizeclass_size[sizeclass_of(0)], 16);
  CHECK_EQ(sizeclass_size[sizeclass_of(8)], 16);
  CHECK_EQ(sizeclass_size[sizeclass_of(9)], 16);
  CHECK_EQ(sizeclass_size[sizeclass_of(17)], 32);
  /* 8 bytes apart at the bottom */
  CHECK_EQ(sizeclass_size[SIZECLASS_EIGHT], 8);
  CHECK_EQ(sizeclass_size[SIZECLASS_EIGHT + 1], 16);

  double worst = 0;
  for (size_t n = 129; n <= SMALL_MAX; n++) {
    double waste = (double)(sizeclass_size[sizeclass_of(n)] - n) / sizeclass_size[sizeclass_of(n)];
    if (waste > worst) worst = waste;
  }
  CHECK_MSG(worst <= 0.125, "worst internal waste above 128 bytes is %.3f", worst);

  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    size_t span_bytes = (size_t)sizeclass_pages[cls] * PAGE_SIZE, size = sizeclass_size[cls];
    CHECK_MSG(span_bytes - span_bytes / size * size <= span_bytes / 8, "class %u tail waste", cls);
    CHECK(sizeclass_batch[cls] >= 2);
    if (size % 64 == 0) { /* objects start at span start + k*size: on a cache line */
      void *p = qm_malloc(size);
      CHECK_MSG(((uintptr_t)p & 63) == 0, "class %u object %p not on a cache line", cls, p);
      qm_free(p);
    }
    /* the divisibility test agrees with % for every offset in a span */
    for (uint32_t off = 0; off < span_bytes; off += 8)
      if (((uint64_t)off * sizeclass_magic[cls] < sizeclass_magic[cls]) != (off % size == 0)) {
        CHECK_MSG(0, "magic of class %u wrong at offset %u", cls, off);
        break;
      }
  }
  CHECK_EQ(sizeclass_magic[0], 0);

  /* aligned requests find a class whose size is a multiple of the alignment */
  for (size_t align = 32; align <= PAGE_SIZE; align *= 2)
    for (size_t n = 1; n <= 4 * align && n <= SMALL_MAX; n += 7) {
      unsigned cls = sizeclass_for_aligned(n, align);
      if (cls == 0) continue; /* too large: page heap */
      CHECK(sizeclass_size[cls] % align == 0 && sizeclass_size[cls] >= n);
    }

  sizeclass_init(8, 32);
  CHECK_EQ(sizeclass_of(1), SIZECLASS_EIGHT);
  CHECK_EQ(sizeclass_of(8), SIZECLASS_EIGHT);
  CHECK_EQ(sizeclass_size[sizeclass_of(9)], 16);
  sizeclass_init(16, 32);
  CHECK_EQ(sizeclass_size[sizeclass_of(1)], 16);
  return tu_summary("sizeclass");
}
