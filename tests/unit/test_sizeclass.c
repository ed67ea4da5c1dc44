/* Size classes: the generated table's invariants (monotonic, 16-byte multiples, smallest fit),
 * the waste bound above 128 bytes, cache-line starts for multiples of 64, the 8-byte class
 * being used only when min_align is 8, and the lookup table's pages filled on first use. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "internal.h"
#include "qmalloc.h"
#include "testutil.h"

/* A sized free of a 32-byte block with a size whose page of the table is still unfilled. */
static void free_sized_unfilled_body(void *block) { qm_free_sized(block, SMALL_MAX - 20000); }

int main(void) {
  init_process();
  /* The table's pages above the first are filled when a size first falls in one: 0 before (the
   * fast path's way to the slow one), the class after. A sized free whose size falls in an
   * unfilled page is judged on the real class, not on the 0: accepted for its block (slot 32768,
   * the last page, while malloc filled the page before it), stopped for another. */
  const size_t late = SMALL_MAX - 1000;
  CHECK_EQ(sizeclass_of_if_filled(late), 0);
  CHECK_EQ(sizeclass_of_if_filled(SMALL_MAX), 0);
  CHECK_EQ(sizeclass_of_if_filled(SMALL_MAX - 20000), 0);
  void *big = qm_malloc(late);
  CHECK(big != NULL);
  CHECK(sizeclass_of_if_filled(late) != 0 && sizeclass_size[sizeclass_of_if_filled(late)] >= late);
  CHECK_EQ(sizeclass_of_if_filled(SMALL_MAX), 0);
  qm_free_sized(big, SMALL_MAX);
  CHECK_EQ(sizeclass_size[sizeclass_of_if_filled(SMALL_MAX)], SMALL_MAX);
  void *small = qm_malloc(32);
  char out[512];
  int status;
  tu_stderr_of_child(free_sized_unfilled_body, small, out, sizeof out, &status);
  CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strstr(out, "does not match the block") != NULL,
            "free_sized with a size in an unfilled page of the table: status %d, stderr \"%s\"", status, out);
  qm_free(small);

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
    CHECK_MSG(span_bytes % size <= span_bytes / 8, "class %u tail waste", cls);
    /* The tail is resident and holds nothing: under 1/16 of the span in every class since spans
     * may take up to twice the fewest pages to shrink it (tools/gen_sizeclasses.py,
     * least_waste_pages); sqlite's 4,368-byte page-cache entries wasted 10% in 5-page spans of the
     * 4,608-byte class, which 9 pages hold exactly. */
    CHECK_MSG(span_bytes % size < span_bytes / 16, "class %u (%zu B): %u pages waste %.1f%% at the tail", cls,
              size, sizeclass_pages[cls], 100.0 * (double)(span_bytes % size) / (double)span_bytes);
    CHECK(sizeclass_batch[cls] >= 2);
    CHECK_EQ(sizeclass_span_objects[cls], span_bytes / size); /* the slow paths' count of a span's slots */
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
