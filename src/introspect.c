/* glibc's introspection and tuning API over qmalloc's own: mallinfo2, mallinfo, malloc_stats,
 * malloc_info, mallopt (malloc_trim is qm_trim, in api.c). Each is a thin adapter over the
 * statistics snapshot or the options table; docs/stats.md documents the field mapping.
 * Callers: programs written for glibc. */
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>

#include "internal.h"
#include "log.h"

/* Only with the standard names (config.h): the sanitizer build's runtime defines these too, and
 * an #if is the only way to leave a definition out. */
#if QM_STD_NAMES
QM_EXPORT struct mallinfo2 mallinfo2(void) {
  stats_snapshot_t s;
  stats_snapshot(&s);
  size_t free_small = s.thread_caches + s.transfer_caches + s.central_free;
  size_t free_objects = 0;
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) free_objects += s.class_free[cls];
  struct mallinfo2 mi = {
      .arena = s.mapped - s.huge_in_use - s.metadata, /* the heap, without own mappings */
      .ordblks = s.free_spans,                        /* free runs of pages */
      .smblks = free_objects,                         /* free small objects (caches, lists) */
      .hblks = s.huge_blocks,
      .hblkhd = s.huge_in_use,
      .usmblks = 0, /* unused since glibc 2.x, always 0 */
      .fsmblks = free_small,
      .uordblks = s.small_in_use + s.large_in_use,
      .fordblks = free_small + s.pageheap_free + s.released,
      .keepcost = s.pageheap_free, /* what malloc_trim(0) would give back now */
  };
  return mi;
}

static int introspect_clamp(size_t v) { return v > INT_MAX ? INT_MAX : (int)v; }

QM_EXPORT struct mallinfo mallinfo(void) {
  struct mallinfo2 m = mallinfo2();
  struct mallinfo mi = {introspect_clamp(m.arena),   introspect_clamp(m.ordblks),  introspect_clamp(m.smblks),
                        introspect_clamp(m.hblks),   introspect_clamp(m.hblkhd),   introspect_clamp(m.usmblks),
                        introspect_clamp(m.fsmblks), introspect_clamp(m.uordblks), introspect_clamp(m.fordblks),
                        introspect_clamp(m.keepcost)};
  return mi;
}

/* glibc's shape on stderr, then qmalloc's own dump for the detail. Not a cancellation point, as
 * glibc's is not: qmalloc's writes are raw system calls (os_file.h), so a thread with a cancel
 * pending gets the whole report and is cancelled at its next cancellation point. */
QM_EXPORT void malloc_stats(void) {
  stats_snapshot_t s;
  stats_snapshot(&s);
  log_printf(2, "Arena 0:\nsystem bytes     = %10zu\nin use bytes     = %10zu\n", s.mapped - s.huge_in_use,
             s.small_in_use + s.large_in_use);
  log_printf(2, "Total (incl. mmap):\nsystem bytes     = %10zu\nin use bytes     = %10zu\n", s.mapped, s.in_use);
  log_printf(2, "max mmap regions = %10zu\nmax mmap bytes   = %10zu\n", s.huge_blocks, s.huge_in_use);
  stats_print(2, 0);
}

/* glibc's XML document (version 1): one heap; sizes are qmalloc's classes with free objects. */
QM_EXPORT int malloc_info(int options, FILE *out) {
  if (options != 0) {
    errno = EINVAL;
    return -1;
  }
  stats_snapshot_t s;
  stats_snapshot(&s);
  size_t free_small = s.thread_caches + s.transfer_caches + s.central_free, free_objects = 0;
  fprintf(out, "<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n");
  for (unsigned cls = 1; cls < SIZECLASS_COUNT; cls++) {
    if (s.class_free[cls] == 0) continue;
    free_objects += s.class_free[cls];
    fprintf(out, "  <size from=\"%u\" to=\"%u\" total=\"%zu\" count=\"%zu\"/>\n", sizeclass_size[cls - 1] + 1,
            sizeclass_size[cls], s.class_free[cls] * sizeclass_size[cls], s.class_free[cls]);
  }
  fprintf(out, "</sizes>\n<total type=\"fast\" count=\"%zu\" size=\"%zu\"/>\n", free_objects, free_small);
  fprintf(out, "<total type=\"rest\" count=\"%zu\" size=\"%zu\"/>\n", s.free_spans, s.pageheap_free + s.released);
  fprintf(out, "<system type=\"current\" size=\"%zu\"/>\n<system type=\"max\" size=\"%zu\"/>\n", s.mapped, s.mapped);
  fprintf(out, "<aspace type=\"total\" size=\"%zu\"/>\n<aspace type=\"mprotect\" size=\"%zu\"/>\n</heap>\n", s.mapped, s.mapped);
  fprintf(out, "<total type=\"fast\" count=\"%zu\" size=\"%zu\"/>\n", free_objects, free_small);
  fprintf(out, "<total type=\"rest\" count=\"%zu\" size=\"%zu\"/>\n", s.free_spans, s.pageheap_free + s.released);
  fprintf(out, "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n", s.huge_blocks, s.huge_in_use);
  fprintf(out, "<system type=\"current\" size=\"%zu\"/>\n<system type=\"max\" size=\"%zu\"/>\n", s.mapped, s.mapped);
  fprintf(out, "<aspace type=\"total\" size=\"%zu\"/>\n<aspace type=\"mprotect\" size=\"%zu\"/>\n</malloc>\n", s.mapped, s.mapped);
  return 0;
}

/* ---- mallopt --------------------------------------------------------------------------------- */

/* Sets option id to v (clamped to its range) as if from the environment; false if refused. */
static bool introspect_set_option(option_id_t id, long long v) {
  if (v > options_table[id].max) v = options_table[id].max;
  char digits[24];
  size_t n = log_format(digits, sizeof digits, "%lld", v);
  const char *name = options_name(id);
  size_t name_len = 0;
  while (name[name_len]) name_len++;
  return options_set(name, name_len, digits, n, "mallopt");
}

/* glibc's parameters and return values (measured against glibc 2.36; docs/options.md lists
 * each): those with a qmalloc meaning set the matching options, the others are accepted and
 * change nothing, as glibc accepts parameters it does not implement. glibc reads a negative
 * threshold as a huge size_t, larger than any heap: "never"; so does qmalloc. Returns 1, or 0
 * for a value glibc rejects. */
QM_EXPORT int mallopt(int param, int value) {
  init_process();
  switch (param) {
    case M_TRIM_THRESHOLD:
      /* Free memory beyond the threshold goes back to the OS on free: qmalloc's retain_max.
       * Negative (glibc's -1): never; the decay, which glibc does not have, is never too (-1), so
       * only malloc_trim gives memory back, as in glibc. */
      if (value >= 0) return introspect_set_option(OPTION_RETAIN_MAX, value) ? 1 : 0;
      return introspect_set_option(OPTION_RETAIN_MAX, options_table[OPTION_RETAIN_MAX].max) &&
                     introspect_set_option(OPTION_DECAY_MS, -1)
                 ? 1
                 : 0;
    case M_MMAP_THRESHOLD:
      /* Blocks this big get mappings of their own, unmapped when freed: release_large. */
      return introspect_set_option(OPTION_RELEASE_LARGE,
                                   value >= 0 ? value : options_table[OPTION_RELEASE_LARGE].max)
                 ? 1
                 : 0;
    case M_MXFAST:
      /* No fast bins here; glibc refuses sizes above its largest fast bin (80 * sizeof(size_t) / 4). */
      return value >= 0 && value <= (int)(80 * sizeof(size_t) / 4) ? 1 : 0;
    default:
      /* M_TOP_PAD, M_MMAP_MAX, M_CHECK_ACTION, M_PERTURB, M_ARENA_TEST, M_ARENA_MAX, the unused
       * M_NLBLKS, M_GRAIN, M_KEEP and any other number: glibc returns 1 for all of them. */
      return 1;
  }
}
#endif
