/* The pages of sampled blocks, kept per thread: a sampled block of up to one page is served as a
 * one-page span of its own (api.c's malloc_sample_slow), and freeing it used to hand the span back
 * to the page heap, to take another at the next sample: two page-heap locks and four page-map
 * writes per sample. With two threads sampling at 2 MiB, malloc-test at 8 KiB ran 7.8 times slower
 * than with sampling off, most of it in free's page-map load: the writes shared cache lines with
 * the entries of the pages the other thread was using. Here a freed one-page sampled span stays
 * allocated and waits in its freeing thread's stash for that thread's next sample, so that a
 * steady stream of samples touches neither the page heap nor the page map.
 * A stashed span is SPAN_LARGE with sampled = PROF_PAGE_STASHED: a free of its address is a
 * double free (api.c's block_of). At most PROF_PAGES_KEPT per thread (prof.h), handed back at
 * thread exit (tcache_thread_exit: only a thread with a live cache keeps any) and by malloc_trim
 * on its calling thread.
 * Lock: none; the page heap's for what goes back to it. */
#include "internal.h"
#include "prof.h"

typedef struct prof_pages_s {
  span_t *spans[PROF_PAGES_KEPT];
  unsigned count;
  bool closed; /* the thread is exiting: nothing more is kept */
} prof_pages_t;
static __thread prof_pages_t prof_pages_self __attribute__((tls_model("initial-exec")));

span_t *prof_pages_take(void) {
  prof_pages_t *self = &prof_pages_self;
  if (self->count == 0) return NULL;
  span_t *span = self->spans[--self->count];
  span->sampled = 0;
  return span;
}

bool prof_pages_claim(span_t *span, uintptr_t start) {
  uint8_t live = PROF_PAGE_SAMPLED;
  if (!__atomic_compare_exchange_n(&span->sampled, &live, PROF_PAGE_STASHED, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
    return false;
  return span_is_large_block(span, start);
}

bool prof_pages_keep(span_t *span) {
  prof_pages_t *self = &prof_pages_self;
  /* Only in a thread whose cache is live: its exit (tcache_thread_exit) hands the pages back. */
  if (span->npages != 1 || span->direct || self->closed || self->count == PROF_PAGES_KEPT ||
      tcache_self.state != TCACHE_LIVE) {
    __atomic_store_n(&span->sampled, 0, __ATOMIC_RELEASE);
    return false;
  }
  self->spans[self->count++] = span; /* flagged kept by its claim */
  return true;
}

void prof_pages_release(bool closing) {
  prof_pages_t *self = &prof_pages_self;
  if (closing) self->closed = true;
  while (self->count > 0) {
    span_t *span = self->spans[--self->count];
    span->sampled = 0;
    pageheap_free(span);
  }
}
