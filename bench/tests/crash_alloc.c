/* crash_alloc.c - a deliberately broken "allocator" for mtbench's own tests: preloaded, it
 * passes every request to glibc except a request of exactly $MTBENCH_TEST_CRASH_SIZE bytes,
 * which kills the process with SIGSEGV. It lets the tests prove that the driver records a crash,
 * keeps going with the other runs, and marks the crash in the report. Not an allocator to measure. */
#define _GNU_SOURCE
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>

extern void *__libc_malloc(size_t size);

static size_t crash_size; /* 0: never crash */

__attribute__((constructor)) static void crash_alloc_init(void) {
  const char *s = getenv("MTBENCH_TEST_CRASH_SIZE");
  crash_size = s ? strtoul(s, NULL, 10) : 0;
}

void *malloc(size_t size) {
  if (crash_size && size == crash_size) raise(SIGSEGV);
  return __libc_malloc(size);
}
