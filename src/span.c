/* Span headers: allocation and recycling of span_t. Headers are carved from metadata pages taken
 * from the OS and are never returned (the page map may hold stale pointers to them, which must
 * stay readable). Caller holds the page heap's lock; this file has no lock of its own. */
#include <string.h>

#include "internal.h"
#include "os.h"

#define SPAN_META_CHUNK ((size_t)256 << 10)

QM_EARLY_DATA static span_t *span_free_headers;   /* recycled headers, linked through next */
QM_EARLY_DATA static char *span_meta_bump, *span_meta_end;

span_t *span_new(uintptr_t start, size_t npages, span_state_t state) {
  span_t *span = span_free_headers;
  if (span != NULL) {
    span_free_headers = span->next;
  } else {
    if (span_meta_bump == NULL || span_meta_bump + sizeof(span_t) > span_meta_end) {
      char *chunk = os_map(SPAN_META_CHUNK, PAGE_SIZE, OS_COMMIT, OS_GUARD_NONE);
      if (chunk == NULL) return NULL;
      stats_metadata_add(SPAN_META_CHUNK);
      span_meta_bump = chunk;
      span_meta_end = chunk + SPAN_META_CHUNK;
    }
    span = (span_t *)span_meta_bump;
    span_meta_bump += sizeof(span_t);
  }
  memset(span, 0, sizeof(*span));
  span->start = start;
  span->npages = (uint32_t)npages;
  span->state = (uint8_t)state;
  return span;
}

void span_delete(span_t *span) {
  span->state = SPAN_DEAD;
  span->npages = 0;
  span->next = span_free_headers;
  span_free_headers = span;
}
