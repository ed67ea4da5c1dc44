/* Fatal errors on bad input: one line on stderr naming the call and the address, then abort()
 * (log_fatal writes it from a stack buffer: the heap may be the thing that is broken).
 * Callers: api.c (invalid pointers), central.c and pageheap.c (double frees found on the way). */
#include "internal.h"
#include "log.h"

void check_fail_invalid(const char *call, const void *ptr) { log_fatal("%s: invalid pointer %p", call, ptr); }

void check_fail_double_free(const char *call, const void *ptr) { log_fatal("%s: double free %p", call, ptr); }

void check_fail(const char *what, const void *ptr) { log_fatal("%s %p", what, ptr); }
