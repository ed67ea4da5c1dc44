/* qmalloc public API.
 *
 * The standard names (malloc, free, ...) are exported by libqmalloc as well; the qm_* names are
 * the same functions under a name that cannot be interposed, plus qmalloc's own introspection.
 * Nothing internal is declared here. */
#ifndef QMALLOC_H
#define QMALLOC_H

#include <stddef.h>

#include "qmalloc_version.h" /* QMALLOC_VERSION_MAJOR, _MINOR, _PATCH and QM_VERSION */

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library the program runs with, "MAJOR.MINOR.PATCH"; QM_VERSION is the one
 * it was compiled against. */
const char *qm_version(void);

/* The allocation family: glibc semantics wherever the C standard leaves room. */
void *qm_malloc(size_t size);
void qm_free(void *ptr);
void *qm_calloc(size_t count, size_t size);
void *qm_realloc(void *ptr, size_t size);
void *qm_reallocarray(void *ptr, size_t count, size_t size);
int qm_posix_memalign(void **result, size_t alignment, size_t size);
void *qm_aligned_alloc(size_t alignment, size_t size);
void *qm_memalign(size_t alignment, size_t size);
void *qm_valloc(size_t size);
void *qm_pvalloc(size_t size);
size_t qm_malloc_usable_size(void *ptr);
void qm_free_sized(void *ptr, size_t size);
void qm_free_aligned_sized(void *ptr, size_t alignment, size_t size);

/* Releases every free page qmalloc can back to the OS (returns 1 if any was released). */
int qm_trim(size_t pad);

/* Writes the statistics to fd: QM_STATS_TEXT (lines explained in docs/stats.md) or QM_STATS_JSON. */
enum { QM_STATS_TEXT = 0, QM_STATS_JSON = 1 };
void qm_stats_print(int fd, int format);

/* Heap profiler (docs/profiling.md): writes the sampled heap profile of `kind` to `path` in the
 * gperftools heap-profile format (google-pprof, jeprof). QM_PROF_LIVE: blocks live now;
 * QM_PROF_PEAK: the live heap when it was largest; QM_PROF_ALLOCATED: every sampled block since
 * start or qm_prof_reset(). Returns 0, or -1 with errno set (EINVAL for a bad kind). Not a
 * cancellation point (nor is any qmalloc call): a pending cancel acts after it. */
enum { QM_PROF_LIVE = 0, QM_PROF_PEAK = 1, QM_PROF_ALLOCATED = 2 };
int qm_prof_dump(const char *path, int kind);
/* Starts the QM_PROF_ALLOCATED profile afresh. */
void qm_prof_reset(void);

#ifdef __cplusplus
}
#endif

#endif
