/* Misuses of free/realloc for tests/preload/test_death.sh (run under LD_PRELOAD=libqmalloc.so).
 * Each mode prints the exact address it is about to pass on stdout (flushed first), then makes the
 * bad call; the allocator is expected to stop the program with one line naming the call and the
 * address. "valid" is the control: correct use, exit 0, nothing on stderr.
 *
 * usage: bad_free MODE   (MODE: valid stack static mmap interior interior_large realloc_stack
 *                          realloc_interior double double_large double_later) */
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Hides where a pointer came from, so the compiler neither warns about nor folds the bad call. */
static void *launder(void *p) {
  void *volatile v = p;
  return v;
}

static void announce(const void *p) {
  printf("%p\n", p);
  fflush(stdout);
}

static alignas(64) char static_array[4096];

int main(int argc, char **argv) {
  const char *mode = argc == 2 ? argv[1] : "";
  alignas(64) char stack_buf[256];
  memset(stack_buf, 0, sizeof stack_buf);

  if (!strcmp(mode, "valid")) {
    char *p = malloc(100), *q = malloc(1u << 20);
    memset(p, 1, 100);
    memset(q, 1, 1u << 20);
    p = realloc(p, 5000);
    free(p);
    free(q);
    free(NULL);
    return 0;
  }
  if (!strcmp(mode, "stack")) {
    void *p = launder(stack_buf + 64);
    announce(p);
    free(p);
  } else if (!strcmp(mode, "static")) {
    void *p = launder(static_array + 128);
    announce(p);
    free(p);
  } else if (!strcmp(mode, "mmap")) {
    void *m = mmap(NULL, 1u << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 3;
    announce(m);
    free(m);
  } else if (!strcmp(mode, "interior")) {
    char *p = malloc(100);
    void *bad = launder(p + 16);
    announce(bad);
    free(bad);
  } else if (!strcmp(mode, "interior_large")) {
    char *p = malloc(1u << 20);
    void *bad = launder(p + 4096);
    announce(bad);
    free(bad);
  } else if (!strcmp(mode, "realloc_stack")) {
    void *p = launder(stack_buf + 64);
    announce(p);
    void *q = realloc(p, 100);
    printf("realloc returned %p\n", q);
  } else if (!strcmp(mode, "realloc_interior")) {
    char *p = malloc(100);
    void *bad = launder(p + 16);
    announce(bad);
    void *q = realloc(bad, 200);
    printf("realloc returned %p\n", q);
  } else if (!strcmp(mode, "double")) {
    void *p = malloc(100);
    announce(p);
    free(p);
    free(launder(p));
  } else if (!strcmp(mode, "double_large")) {
    void *p = malloc(1u << 20);
    announce(p);
    free(p);
    free(launder(p));
  } else if (!strcmp(mode, "double_later")) {
    void *p = malloc(100), *q = malloc(100);
    announce(p);
    free(p);
    free(q);
    free(launder(p));
  } else {
    fprintf(stderr, "bad_free: unknown mode '%s' (expected valid, stack, static, mmap, interior, interior_large, "
                    "realloc_stack, realloc_interior, double, double_large, double_later)\n", mode);
    return 2;
  }
  /* Still running: the misuse went unnoticed. */
  printf("survived\n");
  return 0;
}
