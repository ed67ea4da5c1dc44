/* Statistics: one snapshot of the heap, built by asking each layer under its own lock, rendered as
 * text (lines that add up; docs/stats.md explains each) or JSON (same numbers, same names).
 * Counters live with the layer that owns them (per thread in tcache.c, per class in central.c, in
 * the page heap), so nothing is counted on the fast paths. Lock: none of its own.
 * Callers: qm_stats_print, introspect.c (glibc's API), exit (QMALLOC_STATS). */
#include <fcntl.h>
#include <string.h>

#include "internal.h"
#include "log.h"
#include "prof.h"
#include "qmalloc.h"

QM_EARLY_DATA static intptr_t stats_mapped_bytes;   /* atomic: os_linux.c */
QM_EARLY_DATA static intptr_t stats_metadata_bytes; /* atomic: span headers and page-map leaves */

void stats_mapped_add(intptr_t bytes) { __atomic_fetch_add(&stats_mapped_bytes, bytes, __ATOMIC_RELAXED); }
void stats_metadata_add(intptr_t bytes) { __atomic_fetch_add(&stats_metadata_bytes, bytes, __ATOMIC_RELAXED); }
size_t stats_mapped(void) { return (size_t)__atomic_load_n(&stats_mapped_bytes, __ATOMIC_RELAXED); }

/* The accounting identity, in order: every byte mapped from the OS is on exactly one line.
 * X(field, sign, what) */
#define STATS_IDENTITY(X)                                                                        \
  X(in_use, " ", "bytes in use by the application")                                             \
  X(thread_caches, "+", "bytes in thread caches")                                               \
  X(transfer_caches, "+", "bytes in central transfer caches")                                   \
  X(central_free, "+", "bytes free in central spans (including span tails)")                    \
  X(pageheap_free, "+", "bytes free in the page heap, not yet released")                        \
  X(released, "+", "bytes released to the OS (mapped, not resident)")                           \
  X(metadata, "+", "bytes of metadata (span headers, page map)")                                \
  X(mapped, "=", "bytes mapped from the OS")

/* Other figures. X(field, what) */
#define STATS_DETAILS(X)                                                                         \
  X(small_in_use, "bytes in use in small objects (class sizes)")                                \
  X(large_in_use, "bytes in use in large blocks (whole pages)")                                 \
  X(huge_in_use, "bytes in use in huge blocks (own mappings)")                                  \
  X(huge_blocks, "huge blocks")                                                                 \
  X(free_spans, "free spans in the page heap")                                                  \
  X(threads, "thread caches live")                                                              \
  X(unclaimed_budget, "bytes of thread-cache budget not claimed by any thread")                 \
  X(refills, "thread-cache refills from the central lists (fast-path misses)")                  \
  X(flushes, "thread-cache flushes of an overlong list to the central lists")                   \
  X(gc_runs, "thread-cache garbage collections")                                                \
  X(idle_reclaims, "thread caches taken back from idle threads")                                \
  X(idle_reclaimed_bytes, "bytes in the thread caches taken back from idle threads")            \
  X(release_calls, "free spans released to the OS")                                             \
  X(released_bytes_total, "bytes released to the OS since start")                               \
  X(growth_released_bytes, "of those, bytes released as the heap grew past them")              \
  X(release_failures, "releases the kernel refused (the pages stayed resident and dirty)")       \
  X(unmapped_bytes_total, "bytes of address space of free spans unmapped since start")           \
  X(unmap_failures, "unmaps the kernel refused (the range was kept for reuse)")                  \
  X(releaser_wakeups, "times the background releaser woke (0: not started)")                   \
  X(prof_sample_rate, "heap profiler: bytes allocated per sample, on average (0: off)")         \
  X(prof_samples, "heap profiler: samples taken since start")                                  \
  X(prof_samples_stretched, "heap profiler: samples drawn at an interval the sample budget stretched") \
  X(prof_live_samples, "heap profiler: sampled blocks live now")                               \
  X(prof_live_bytes, "heap profiler: bytes live now, estimated from the samples")

void stats_snapshot(stats_snapshot_t *s) {
  init_process();
  memset(s, 0, sizeof *s);
  tcache_totals_t tc;
  size_t cached[SIZECLASS_COUNT] = {0};
  tcache_totals(&tc, cached, s->thread, STATS_THREADS_SHOWN);
  size_t span_tails = 0;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    central_t *c = &central_lists[cls];
    size_t size = sizeclass_size[cls], span_bytes = sizeclass_pages[cls] * PAGE_SIZE;
    size_t per_span = sizeclass_span_objects[cls];
    pthread_mutex_lock(&c->lock);
    size_t spans = c->spans_in_use, in_spans = c->free_in_spans, in_transfer = (size_t)c->transfer_count * sizeclass_batch[cls];
    pthread_mutex_unlock(&c->lock);
    size_t out = spans * per_span - in_spans;           /* handed out by the central list */
    size_t in_use = out > in_transfer + cached[cls] ? out - in_transfer - cached[cls] : 0;
    s->class_spans[cls] = spans;
    s->class_in_use[cls] = in_use;
    s->class_free[cls] = spans * per_span - in_use;
    s->transfer_caches += in_transfer * size;
    s->central_free += in_spans * size;
    s->small_in_use += in_use * size;
    span_tails += spans * (span_bytes - per_span * size);
  }
  s->central_free += span_tails;
  pageheap_stats_t ph;
  pageheap_stats(&ph);
  /* Small spans hold objects in use, cached, in transfer, free in spans and tails; whatever the
   * racy reads of thread caches made disagree by is folded into thread_caches. */
  size_t small_accounted = s->small_in_use + s->transfer_caches + s->central_free;
  s->thread_caches = ph.small_span_bytes > small_accounted ? ph.small_span_bytes - small_accounted : 0;
  s->large_in_use = ph.large_bytes;
  s->huge_in_use = ph.direct_bytes;
  s->huge_blocks = ph.direct_blocks;
  s->in_use = s->small_in_use + s->large_in_use + s->huge_in_use;
  s->pageheap_free = ph.free_backed_bytes;
  s->released = ph.free_released_bytes;
  s->metadata = (size_t)__atomic_load_n(&stats_metadata_bytes, __ATOMIC_RELAXED);
  s->mapped = stats_mapped();
  s->free_spans = ph.free_spans;
  s->threads = tc.threads;
  s->unclaimed_budget = tc.unclaimed;
  s->refills = tc.refills;
  s->flushes = tc.flushes;
  s->gc_runs = tc.gc_runs;
  s->idle_reclaims = tc.reclaims;
  s->idle_reclaimed_bytes = tc.reclaimed_bytes;
  s->release_calls = ph.release_calls;
  s->released_bytes_total = ph.released_bytes_total;
  s->growth_released_bytes = ph.growth_released_bytes;
  s->release_failures = ph.release_failures;
  s->unmapped_bytes_total = ph.unmapped_bytes_total;
  s->unmap_failures = ph.unmap_failures;
  s->releaser_wakeups = release_wakeups();
  prof_totals_t prof;
  prof_totals(&prof);
  s->prof_sample_rate = prof.rate;
  s->prof_samples = prof.samples_taken;
  s->prof_samples_stretched = prof.samples_stretched;
  s->prof_live_samples = prof.live_samples;
  s->prof_live_bytes = prof.live_est_bytes;
}

static void stats_print_text(int fd, const stats_snapshot_t *s) {
  log_printf(fd, "------------------------------------------------ qmalloc %s\n", QM_VERSION);
#define STATS_TEXT_IDENTITY(field, sign, what) \
  log_printf(fd, "MALLOC: %s %14zu (%8zu MiB) %s\n", sign, (size_t)s->field, (size_t)s->field >> 20, what);
  STATS_IDENTITY(STATS_TEXT_IDENTITY)
  log_printf(fd, "------------------------------------------------\n");
#define STATS_TEXT_DETAIL(field, what) log_printf(fd, "MALLOC:   %14lld %s\n", (long long)s->field, what);
  STATS_DETAILS(STATS_TEXT_DETAIL)
  log_printf(fd, "------------------------------------------------ by size class\n");
  log_printf(fd, "class %8s %12s %12s %8s %14s\n", "size", "in use", "free", "spans", "bytes in use");
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++)
    if (s->class_spans[cls] != 0)
      log_printf(fd, "%5u %8u %12zu %12zu %8zu %14zu\n", cls, sizeclass_size[cls], s->class_in_use[cls],
                 s->class_free[cls], s->class_spans[cls], s->class_in_use[cls] * sizeclass_size[cls]);
  size_t shown = s->threads < STATS_THREADS_SHOWN ? s->threads : STATS_THREADS_SHOWN;
  log_printf(fd, "------------------------------------------------ by thread cache (%zu of %zu)\n", shown, s->threads);
  log_printf(fd, "%12s %12s %12s %10s %10s %10s %10s\n", "bytes", "capacity", "budget", "refills", "flushes", "gc runs",
             "reclaims");
  for (size_t i = 0; i < shown; i++) {
    const tcache_thread_stats_t *t = &s->thread[i];
    log_printf(fd, "%12zu %12zu %12zu %10llu %10llu %10llu %10llu\n", t->bytes, t->capacity, t->budget,
               (unsigned long long)t->refills, (unsigned long long)t->flushes, (unsigned long long)t->gc_runs,
               (unsigned long long)t->reclaims);
  }
  log_printf(fd, "(every line is explained in docs/stats.md)\n");
}

static void stats_print_json(int fd, const stats_snapshot_t *s) {
  log_printf(fd, "{\"qmalloc\": \"%s\"", QM_VERSION);
#define STATS_JSON_IDENTITY(field, sign, what) log_printf(fd, ", \"%s\": %zu", #field, (size_t)s->field);
  STATS_IDENTITY(STATS_JSON_IDENTITY)
#define STATS_JSON_DETAIL(field, what) log_printf(fd, ", \"%s\": %lld", #field, (long long)s->field);
  STATS_DETAILS(STATS_JSON_DETAIL)
  log_printf(fd, ", \"classes\": [");
  const char *sep = "";
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    if (s->class_spans[cls] == 0) continue;
    log_printf(fd, "%s{\"class\": %u, \"size\": %u, \"in_use\": %zu, \"free\": %zu, \"spans\": %zu}", sep, cls,
               sizeclass_size[cls], s->class_in_use[cls], s->class_free[cls], s->class_spans[cls]);
    sep = ", ";
  }
  log_printf(fd, "], \"thread_caches_shown\": [");
  size_t shown = s->threads < STATS_THREADS_SHOWN ? s->threads : STATS_THREADS_SHOWN;
  for (size_t i = 0; i < shown; i++) {
    const tcache_thread_stats_t *t = &s->thread[i];
    log_printf(fd,
               "%s{\"bytes\": %zu, \"capacity\": %zu, \"budget\": %zu, \"refills\": %llu, \"flushes\": %llu, "
               "\"gc_runs\": %llu, \"reclaims\": %llu}",
               i ? ", " : "", t->bytes, t->capacity, t->budget, (unsigned long long)t->refills,
               (unsigned long long)t->flushes, (unsigned long long)t->gc_runs, (unsigned long long)t->reclaims);
  }
  log_printf(fd, "]}\n");
}

void stats_print(int fd, int format) {
  stats_snapshot_t s;
  stats_snapshot(&s);
  if (format == 1) stats_print_json(fd, &s);
  else stats_print_text(fd, &s);
}

/* The report at exit goes to a copy of stderr taken at start: some programs (sort, for one)
 * close their stderr before exit handlers run. Close-on-exec and a high number, so the copy is
 * neither inherited nor in the way of a program counting on low descriptors. */
static int stats_exit_fd = 2;

void stats_at_exit_prepare(void) {
  int fd = fcntl(2, F_DUPFD_CLOEXEC, 200);
  if (fd >= 0) stats_exit_fd = fd;
}

void stats_at_exit(void) { stats_print(stats_exit_fd, (int)option(OPTION_STATS) == 2); }
