/* Where a call into qmalloc comes from, for the few decisions that depend on it: whether a call
 * may create the background releaser's thread (release.c), and whether a thread's first call is
 * made while glibc tears the thread down (tcache.c). From the loader's, libc's and qmalloc's own
 * address ranges and, on x86-64, a walk of the caller's stack with the heap profiler's unwinder.
 * Lock: none of qmalloc's; the walk may take the loader's list lock (dl_iterate_phdr). */
#ifndef QM_CALLERS_H
#define QM_CALLERS_H

#include <stdbool.h>

/* The loader's and qmalloc's ranges: at init, and again in a forked child. */
void callers_init(void);

/* A free whose return address is `ret` (the program's call, as free's slow paths are jumped to)
 * may start the releaser: not the loader's (its frees of joined threads' TLS run under its stack
 * cache's lock, which pthread_create takes), not qmalloc's own, and none in a program without a
 * dynamic loader. */
bool callers_free_may_start_thread(const void *ret);

/* Whether this call may create a thread: yes if no frame of its stack is the loader's and no libc
 * frame has program code both inside and outside it (no callback: a dl_iterate_phdr callback holds
 * the loader's list lock, against pthread_create's TLS lock); unknown if the walk could not see
 * the whole stack. Yes where nothing is walked (other architectures). */
typedef enum { CALLERS_NO, CALLERS_YES, CALLERS_UNKNOWN } callers_verdict_t;
callers_verdict_t callers_may_create_thread(void);

/* This thread (not the main one) is being torn down by glibc: the code that called qmalloc was
 * called by libc between the thread's entry and its function (a pthread key's destructor, a C++
 * thread_local's). False if not known. */
bool callers_thread_exiting(void);

#endif
