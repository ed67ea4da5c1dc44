/* A plain glibc program (not linked with qmalloc) that calls glibc's other names for its allocator,
 * __libc_malloc and friends, and cfree (the compatibility symbol old binaries still call), mixed
 * with the standard names; run by test_libc_names.sh under LD_PRELOAD.
 *   mix:   blocks cross between the two sets of names both ways, 1,000 times each, with their
 *          contents checked; prints "mix OK" and, from mallinfo2 (the preloaded allocator's),
 *          "counted N" for 1,000 blocks of 1,000 bytes held from __libc_malloc and __libc_calloc;
 *   twice: __libc_free(p) twice on one block (the second must stop the program). */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void *__libc_valloc(size_t size);
extern void *__libc_pvalloc(size_t size);
/* cfree left glibc's headers in 2.26 and stays in its ABI at the architecture's first version. */
extern void cfree_compat(void *ptr);
#if defined(__x86_64__)
__asm__(".symver cfree_compat, cfree@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver cfree_compat, cfree@GLIBC_2.17");
#else
#error "cfree's glibc version is known for x86-64 and aarch64 only"
#endif

static int bad;
#define EXPECT(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      bad++;                                                                                       \
      fprintf(stderr, "libc_names: " __VA_ARGS__);                                                 \
      fputc('\n', stderr);                                                                         \
    }                                                                                              \
  } while (0)

static int all_bytes(const unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return 0;
  return 1;
}

static void mix(void) {
  for (int i = 0; i < 1000; i++) {
    size_t n = 16 + (size_t)i * 37 % 5000;
    unsigned char *a = malloc(n), *b = __libc_malloc(n);
    EXPECT(a && b, "malloc/__libc_malloc(%zu) returned NULL", n);
    if (!a || !b) return;
    memset(a, 0xa1, n);
    memset(b, 0xb2, n);
    __libc_free(a); /* malloc's block, glibc's name for free */
    b = __libc_realloc(b, 2 * n);
    EXPECT(b && all_bytes(b, n, 0xb2), "__libc_realloc lost the contents of a %zu-byte block", n);
    b = realloc(b, 3 * n);
    EXPECT(b && all_bytes(b, n, 0xb2), "realloc lost the contents of __libc_realloc's block");
    free(b);
    unsigned char *c = __libc_calloc(n, 1);
    EXPECT(c && all_bytes(c, n, 0), "__libc_calloc(%zu, 1) is not zeroed", n);
    cfree_compat(c);
    void *m = __libc_memalign(256, n), *v = __libc_valloc(n), *pv = __libc_pvalloc(n);
    EXPECT(m && (uintptr_t)m % 256 == 0, "__libc_memalign(256, %zu) = %p", n, m);
    EXPECT(v && (uintptr_t)v % 4096 == 0, "__libc_valloc(%zu) = %p", n, v);
    EXPECT(pv && (uintptr_t)pv % 4096 == 0, "__libc_pvalloc(%zu) = %p", n, pv);
    free(m);
    __libc_free(v);
    cfree_compat(pv);
  }
  printf(bad ? "mix FAILED\n" : "mix OK\n");

  /* Held blocks from glibc's names count in the allocator's own statistics only if it served them. */
  static void *held[1000];
  for (int i = 0; i < 1000; i++) held[i] = i % 2 ? __libc_malloc(1000) : __libc_calloc(1000, 1);
  struct mallinfo2 mi = mallinfo2();
  printf("counted %zu\n", mi.uordblks);
  for (int i = 0; i < 1000; i++) __libc_free(held[i]);
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "mix") == 0) {
    mix();
    return bad != 0;
  }
  if (argc == 2 && strcmp(argv[1], "twice") == 0) {
    void *p = __libc_malloc(48);
    printf("block %p\n", p);
    fflush(stdout);
    __libc_free(p);
    __libc_free(p);
    printf("survived\n");
    return 0;
  }
  fprintf(stderr, "usage: libc_names mix|twice\n");
  return 2;
}
