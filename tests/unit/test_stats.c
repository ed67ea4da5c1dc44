/* Statistics agree with a program's known allocations: N objects of size S move the class's
 * objects in use by N and the bytes in use by N * class size; freeing them moves both back; the
 * identity lines add up to the bytes mapped; large and huge blocks are counted where they
 * belong; mallinfo2 reports the same numbers. */
#include <malloc.h>

#include "internal.h"
#include "qmalloc.h"
#include "testutil.h"

#define N 1000
#define S 200

static size_t identity_sum(const stats_snapshot_t *s) {
  return s->in_use + s->thread_caches + s->transfer_caches + s->central_free + s->pageheap_free + s->released + s->metadata;
}

int main(void) {
  static void *objs[N];
  stats_snapshot_t before, during, after;
  unsigned cls = sizeclass_of(S);
  qm_free(qm_malloc(S)); /* the thread's cache exists before the first snapshot */

  stats_snapshot(&before);
  CHECK_EQ(identity_sum(&before), before.mapped);
  for (int i = 0; i < N; i++) objs[i] = qm_malloc(S);
  stats_snapshot(&during);
  CHECK_EQ(during.class_in_use[cls] - before.class_in_use[cls], N);
  CHECK_EQ(during.small_in_use - before.small_in_use, (size_t)N * sizeclass_size[cls]);
  CHECK_EQ(during.in_use - before.in_use, (size_t)N * sizeclass_size[cls]);
  CHECK_EQ(identity_sum(&during), during.mapped);
  CHECK(during.refills > before.refills);

  struct mallinfo2 mi = mallinfo2();
  CHECK_EQ(mi.uordblks, during.small_in_use + during.large_in_use);
  CHECK_EQ(mi.hblkhd, during.huge_in_use);

  for (int i = 0; i < N; i++) qm_free(objs[i]);
  stats_snapshot(&after);
  /* one thread: its row is the whole thread-cache line, and within its budget */
  CHECK_EQ(after.threads, 1);
  CHECK_EQ(after.thread[0].bytes, after.thread_caches);
  CHECK(after.thread[0].bytes <= after.thread[0].capacity && after.thread[0].capacity <= after.thread[0].budget);
  CHECK_EQ(after.class_in_use[cls], before.class_in_use[cls]);
  CHECK_EQ(after.in_use, before.in_use);
  CHECK_EQ(identity_sum(&after), after.mapped);

  /* a large block: whole pages, counted as large; a huge one: its own mapping */
  void *large = qm_malloc(1 << 20);
  void *huge = qm_malloc((size_t)option(OPTION_RELEASE_LARGE));
  stats_snapshot(&during);
  CHECK_EQ(during.large_in_use - after.large_in_use, 1 << 20);
  CHECK_EQ(during.huge_blocks - after.huge_blocks, 1);
  CHECK_EQ(during.huge_in_use - after.huge_in_use, (size_t)option(OPTION_RELEASE_LARGE));
  CHECK_EQ(identity_sum(&during), during.mapped);
  qm_free(large);
  qm_free(huge);
  stats_snapshot(&after);
  CHECK_EQ(after.huge_blocks, 0);
  CHECK_EQ(after.large_in_use, 0);

  /* trim leaves nothing free and backed */
  qm_trim(0);
  stats_snapshot(&after);
  CHECK_EQ(after.pageheap_free, 0);
  CHECK_EQ(after.thread_caches, 0);
  CHECK_EQ(after.transfer_caches, 0);
  return tu_summary("stats");
}
