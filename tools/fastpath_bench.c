/* Instruction-count probe for tools/fastpath.sh: malloc+free pairs of sizes 16..512 (steps of
 * 16) in a loop that callgrind collects alone (--toggle-collect=measured_loop). With argument
 * "null" the loop calls two empty functions instead, so the loop's own cost can be subtracted.
 * Knows nothing of qmalloc: the allocator is whatever LD_PRELOAD says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 2000

__attribute__((noinline)) void *null_alloc(size_t n) { __asm__ volatile("" ::"r"(n)); return (void *)16; }
__attribute__((noinline)) void null_free(void *p) { __asm__ volatile("" ::"r"(p)); }

static void *(*volatile alloc_fn)(size_t) = malloc;
static void (*volatile free_fn)(void *) = free;

__attribute__((noinline)) void measured_loop(void *(*a)(size_t), void (*f)(void *)) {
  for (int r = 0; r < ROUNDS; r++)
    for (size_t n = 16; n <= 512; n += 16) {
      void *p = a(n);
      __asm__ volatile("" ::"r"(p) : "memory");
      f(p);
    }
}

int main(int argc, char **argv) {
  void *(*a)(size_t) = alloc_fn;
  void (*f)(void *) = free_fn;
  if (argc > 1 && strcmp(argv[1], "null") == 0) { a = null_alloc; f = null_free; }
  /* Steady state before measuring: each size keeps live neighbours (so no allocator retires a
   * page whose last object was freed; mimalloc does that on every pair otherwise) and every
   * thread cache is warm. The ballast is never freed. */
  static void *ballast[32][64];
  for (int i = 0; i < 64; i++)
    for (size_t n = 16; n <= 512; n += 16) ballast[n / 16 - 1][i] = a(n);
  for (int r = 0; r < 4; r++)
    for (size_t n = 16; n <= 512; n += 16) f(a(n));
  measured_loop(a, f);
  printf("pairs %d\n", ROUNDS * 32);
  return 0;
}
