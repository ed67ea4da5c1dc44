/* A large block whose pages would be faulted in at a new high of the heap in use first sends the
 * thread's cached objects of the classes from TCACHE_GROWTH_FLUSH_MIN up back to their spans (their
 * spans go back to the page heap), and leaves the smaller classes' lists alone; a large block that
 * a free span of the page heap serves leaves the thread cache as it is. */
#include <malloc.h>

#include "internal.h"
#include "qmalloc.h"
#include "tcache_window.h"
#include "testutil.h"

#define MIB ((size_t)1 << 20)

static size_t cached(unsigned cls) { return list_length(&tcache_self.lists[cls]); }

static size_t spans_of(unsigned cls) {
  static stats_snapshot_t s; /* large: not on the stack */
  stats_snapshot(&s);
  return s.class_spans[cls];
}

int main(void) {
  CHECK_EQ(mallopt(M_TRIM_THRESHOLD, -1), 1); /* free pages stay backed: no decay in the way */
  size_t big_size = 2 * TCACHE_GROWTH_FLUSH_MIN, small_size = 1024;
  unsigned big = sizeclass_of(big_size), small = sizeclass_of(small_size);
  CHECK(big != 0 && sizeclass_size[big] >= TCACHE_GROWTH_FLUSH_MIN);
  CHECK(sizeclass_size[small] < TCACHE_GROWTH_FLUSH_MIN);

  /* A free backed span of 8 MiB in the page heap, and the heap's high at least that. */
  qm_free(qm_malloc(8 * MIB));
  /* One object of each class in this thread's cache, the big one alone in its span. */
  qm_free(qm_malloc(big_size));
  qm_free(qm_malloc(small_size));
  CHECK_EQ(cached(big), 1);
  CHECK(cached(small) >= 1);
  CHECK_EQ(spans_of(big), 1);

  /* Served by the free 8 MiB span: no new high, nothing sent back. */
  void *reused = qm_malloc(4 * MIB);
  CHECK(reused != NULL);
  CHECK_EQ(cached(big), 1);
  qm_free(reused);

  /* 16 MiB: no free span has room, and the heap reaches a new high. */
  size_t small_before = cached(small);
  void *grown = qm_malloc(16 * MIB);
  CHECK(grown != NULL);
  CHECK_EQ(cached(big), 0);
  CHECK_EQ(spans_of(big), 0); /* its span went back to the page heap */
  CHECK_EQ(cached(small), small_before);
  qm_free(grown);

  /* The class is used again as before. */
  void *again = qm_malloc(big_size);
  CHECK(again != NULL);
  qm_free(again);
  CHECK_EQ(cached(big), 1);
  return tu_summary("growth_flush");
}
