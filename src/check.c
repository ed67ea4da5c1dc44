/* Fatal errors on bad input: one line on stderr naming the call and the address, then abort().
 * Written from a stack buffer with write(2): the heap may be the thing that is broken.
 * Callers: api.c (invalid pointers), central.c and pageheap.c (double frees found on the way). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "os.h"

static size_t check_append(char *buf, size_t at, size_t cap, const char *s) {
  size_t n = strlen(s);
  if (at + n > cap) n = cap - at;
  memcpy(buf + at, s, n);
  return at + n;
}

static size_t check_append_hex(char *buf, size_t at, size_t cap, uintptr_t v) {
  char digits[2 + 2 * sizeof(v)];
  size_t n = 0;
  do {
    digits[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v != 0);
  at = check_append(buf, at, cap, "0x");
  while (n > 0 && at < cap) buf[at++] = digits[--n];
  return at;
}

__attribute__((noreturn)) static void check_die(const char *call, const char *what, const void *ptr) {
  char line[256];
  size_t at = check_append(line, 0, sizeof line - 1, "qmalloc: ");
  if (call) {
    at = check_append(line, at, sizeof line - 1, call);
    at = check_append(line, at, sizeof line - 1, ": ");
  }
  at = check_append(line, at, sizeof line - 1, what);
  at = check_append(line, at, sizeof line - 1, " ");
  at = check_append_hex(line, at, sizeof line - 1, (uintptr_t)ptr);
  line[at++] = '\n';
  os_write_all(2, line, at);
  abort();
}

void check_fail_invalid(const char *call, const void *ptr) { check_die(call, "invalid pointer", ptr); }

void check_fail_double_free(const char *call, const void *ptr) { check_die(call, "double free", ptr); }

void check_fail(const char *what, const void *ptr) { check_die(NULL, what, ptr); }
