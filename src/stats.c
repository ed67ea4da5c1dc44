/* Statistics: process-wide counters kept by the layer that owns them, merged on demand into one
 * accounting identity (every byte mapped from the OS is in exactly one line).
 * Lock: none of its own; it takes each layer's lock briefly while reading it. */
#include <string.h>

#include "internal.h"
#include "os.h"

static intptr_t stats_mapped_bytes;   /* atomic: os_linux.c */
static intptr_t stats_metadata_bytes; /* atomic: span headers and page-map leaves */

void stats_mapped_add(intptr_t bytes) { __atomic_fetch_add(&stats_mapped_bytes, bytes, __ATOMIC_RELAXED); }
void stats_metadata_add(intptr_t bytes) { __atomic_fetch_add(&stats_metadata_bytes, bytes, __ATOMIC_RELAXED); }

size_t stats_mapped(void) { return (size_t)__atomic_load_n(&stats_mapped_bytes, __ATOMIC_RELAXED); }

static size_t stats_fmt_u(char *buf, unsigned long long v, int width) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  size_t at = 0;
  for (int pad = width - n; pad > 0; pad--) buf[at++] = ' ';
  while (n > 0) buf[at++] = tmp[--n];
  return at;
}

static void stats_line(int fd, const char *prefix, unsigned long long v, const char *what) {
  char line[160];
  size_t at = 0, n = strlen(prefix);
  memcpy(line, prefix, n);
  at += n;
  at += stats_fmt_u(line + at, v, 14);
  line[at++] = ' ';
  n = strlen(what);
  if (n > sizeof line - at - 1) n = sizeof line - at - 1;
  memcpy(line + at, what, n);
  at += n;
  line[at++] = '\n';
  os_write_all(fd, line, at);
}

void stats_print(int fd, int format) {
  init_process();
  pageheap_stats_t ph;
  pageheap_stats(&ph);
  tcache_totals_t tc;
  tcache_totals(&tc, NULL);
  size_t transfer = 0, in_spans = 0, tail = 0;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    central_t *c = &central_lists[cls];
    pthread_mutex_lock(&c->lock);
    size_t size = sizeclass_size[cls], span_bytes = sizeclass_pages[cls] * PAGE_SIZE;
    transfer += (size_t)c->transfer_count * c->batch * size;
    in_spans += c->free_in_spans * size;
    tail += c->spans_in_use * (span_bytes - span_bytes / size * size);
    pthread_mutex_unlock(&c->lock);
  }
  size_t small_app = ph.small_span_bytes - tc.bytes - transfer - in_spans - tail;
  size_t mapped = (size_t)__atomic_load_n(&stats_mapped_bytes, __ATOMIC_RELAXED);
  size_t meta = (size_t)__atomic_load_n(&stats_metadata_bytes, __ATOMIC_RELAXED);
  const char *m = "MALLOC: ";
  os_write_all(fd, "------------------------------------------------ qmalloc\n", 57);
  stats_line(fd, m, small_app + ph.large_bytes + ph.direct_bytes, "bytes in use by the application");
  stats_line(fd, "MALLOC: +", tc.bytes, "bytes in thread caches");
  stats_line(fd, "MALLOC: +", transfer, "bytes in central transfer caches");
  stats_line(fd, "MALLOC: +", in_spans + tail, "bytes free in central spans (incl. span tails)");
  stats_line(fd, "MALLOC: +", ph.free_backed_bytes, "bytes free in the page heap");
  stats_line(fd, "MALLOC: +", ph.free_released_bytes, "bytes released to the OS (mapped, not resident)");
  stats_line(fd, "MALLOC: +", meta, "bytes of metadata");
  stats_line(fd, "MALLOC: =", mapped, "bytes mapped from the OS");
  stats_line(fd, "MALLOC: ", tc.threads, "thread caches live");
  (void)format;
}

void stats_at_exit(void) { stats_print(2, (int)option(OPTION_STATS) == 2); }
