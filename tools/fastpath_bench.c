/* Instruction-count probe for tools/fastpath.sh: malloc+free pairs in four patterns, one
 * noinline function per (pattern, size) so that callgrind attributes every call to the function
 * that made it. fastpath.sh reads, for each measure_* function, the inclusive cost of its calls
 * to malloc and to free (so the two are counted apart), and subtracts what the same loop costs
 * when it calls two empty functions (the null_* twin of each measure_* function).
 *   hot     malloc then free of one size, repeatedly (the object goes back to where it came from)
 *   batch   64 mallocs of one size, then the 64 frees
 *   empties malloc then free of one size while no other object of that size is live, so every
 *           free empties the allocator's page or span (run first, before any ballast exists)
 *   mixed   one malloc+free of every size from 16 to 512 in steps of 16, round after round
 * and realloc of one block back and forth between two sizes, each call counted apart (the calls
 * to realloc, read the same way):
 *   realloc in place   40 <-> 48 bytes (one class in most allocators: nothing moves)
 *   realloc moving     24 <-> 100 bytes (two classes: a new block, a copy, a free each time)
 * and posix_memalign(64, 64) + free pairs (a cache line's alignment: C++'s aligned new, SIMD
 * buffers), the two calls counted together.
 * Knows nothing of qmalloc: the allocator is whatever LD_PRELOAD says. Prints nothing until all
 * measurements are done (stdio's buffer is itself a malloc'd object of 1 or 4 KiB). */
#include <stdio.h>
#include <stdlib.h>

#define ROUNDS 16384 /* pairs per (pattern, size), long enough to spread any periodic slow path; a
                     * multiple of BATCH and of 32 */
#define BATCH 64

typedef void *(*alloc_fn_t)(size_t);
typedef void (*free_fn_t)(void *);
typedef void *(*realloc_fn_t)(void *, size_t);
typedef int (*memalign_fn_t)(void **, size_t, size_t);

__attribute__((noinline)) void *null_malloc(size_t n) { __asm__ volatile("" ::"r"(n)); return (void *)16; }
__attribute__((noinline)) void null_free(void *p) { __asm__ volatile("" ::"r"(p)); }
__attribute__((noinline)) void *null_realloc(void *p, size_t n) { __asm__ volatile("" ::"r"(p), "r"(n)); return p; }
__attribute__((noinline)) int null_posix_memalign(void **p, size_t a, size_t n) {
  __asm__ volatile("" ::"r"(p), "r"(a), "r"(n));
  *p = (void *)64;
  return 0;
}

/* Read through volatile pointers so that the compiler cannot inline or pair malloc with free. */
static alloc_fn_t volatile real_malloc = malloc;
static free_fn_t volatile real_free = free;
static realloc_fn_t volatile real_realloc = realloc;
static memalign_fn_t volatile real_posix_memalign = posix_memalign;

static inline void keep(void *p) { __asm__ volatile("" ::"r"(p) : "memory"); }

static inline __attribute__((always_inline)) void hot_loop(alloc_fn_t a, free_fn_t f, size_t n) {
  for (int r = 0; r < ROUNDS; r++) {
    void *p = a(n);
    keep(p);
    f(p);
  }
}

static inline __attribute__((always_inline)) void batch_loop(alloc_fn_t a, free_fn_t f, size_t n) {
  void *objs[BATCH];
  for (int r = 0; r < ROUNDS / BATCH; r++) {
    for (int i = 0; i < BATCH; i++) objs[i] = a(n);
    keep(objs);
    for (int i = 0; i < BATCH; i++) f(objs[i]);
  }
}

static inline __attribute__((always_inline)) void mixed_loop(alloc_fn_t a, free_fn_t f, size_t unused) {
  (void)unused;
  for (int r = 0; r < ROUNDS / 32; r++)
    for (size_t n = 16; n <= 512; n += 16) {
      void *p = a(n);
      keep(p);
      f(p);
    }
}

/* measure_PATTERN_SIZE / null_PATTERN_SIZE: the functions fastpath.sh looks for by name. The
 * loops are inlined into them (static, one call site per size after constant propagation). */
#define PROBE(pattern, loop, size)                                                                      \
  __attribute__((noinline)) void measure_##pattern##_##size(void) { loop(real_malloc, real_free, size); } \
  __attribute__((noinline)) void null_##pattern##_##size(void) { loop(null_malloc, null_free, size); }
#define SIZES(pattern, loop)                                                                            \
  PROBE(pattern, loop, 16) PROBE(pattern, loop, 32) PROBE(pattern, loop, 64) PROBE(pattern, loop, 128) \
  PROBE(pattern, loop, 256) PROBE(pattern, loop, 512) PROBE(pattern, loop, 1024)                      \
  PROBE(pattern, loop, 4096) PROBE(pattern, loop, 16384) PROBE(pattern, loop, 32768)
SIZES(hot, hot_loop)
SIZES(batch, batch_loop)
SIZES(empties, hot_loop)
PROBE(mixed, mixed_loop, 512)

/* ROUNDS reallocs of one block between sizes a and b (its malloc and free are not counted). */
static inline __attribute__((always_inline)) void realloc_loop(alloc_fn_t a, realloc_fn_t re, free_fn_t f, size_t from, size_t to) {
  void *p = a(from);
  for (int r = 0; r < ROUNDS; r++) {
    p = re(p, (r & 1) ? from : to);
    keep(p);
  }
  f(p);
}
#define REALLOC_PROBE(name, from, to)                                                                         \
  __attribute__((noinline)) void measure_realloc_##name(void) { realloc_loop(real_malloc, real_realloc, real_free, from, to); } \
  __attribute__((noinline)) void null_realloc_##name(void) { realloc_loop(null_malloc, null_realloc, null_free, from, to); }
REALLOC_PROBE(inplace, 40, 48)
REALLOC_PROBE(moving, 24, 100)

static inline __attribute__((always_inline)) void aligned_loop(memalign_fn_t pm, free_fn_t f) {
  for (int r = 0; r < ROUNDS; r++) {
    void *p;
    if (pm(&p, 64, 64) != 0) abort();
    keep(p);
    f(p);
  }
}
__attribute__((noinline)) void measure_aligned_64(void) { aligned_loop(real_posix_memalign, real_free); }
__attribute__((noinline)) void null_aligned_64(void) { aligned_loop(null_posix_memalign, null_free); }

#define RUN_SIZES(pattern)                                                                        \
  do {                                                                                            \
    measure_##pattern##_16(); measure_##pattern##_32(); measure_##pattern##_64();                 \
    measure_##pattern##_128(); measure_##pattern##_256(); measure_##pattern##_512();              \
    measure_##pattern##_1024(); measure_##pattern##_4096(); measure_##pattern##_16384();          \
    measure_##pattern##_32768();                                                                  \
    null_##pattern##_16(); null_##pattern##_32(); null_##pattern##_64(); null_##pattern##_128();  \
    null_##pattern##_256(); null_##pattern##_512(); null_##pattern##_1024();                      \
    null_##pattern##_4096(); null_##pattern##_16384(); null_##pattern##_32768();                  \
  } while (0)

static const size_t probe_sizes[] = {16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 32768};
#define NSIZES (sizeof probe_sizes / sizeof probe_sizes[0])

int main(void) {
  alloc_fn_t a = real_malloc;
  free_fn_t f = real_free;
  /* Page empties first, while nothing of these sizes is live. A few unmeasured pairs of each
   * size first, so that thread caches and size-class metadata exist (the first call's setup is
   * not the fast path); they leave nothing live either. */
  for (size_t s = 0; s < NSIZES; s++)
    for (int r = 0; r < 4; r++) f(a(probe_sizes[s]));
  RUN_SIZES(empties);

  /* Steady state for the other patterns: each size keeps live neighbours (so no allocator
   * retires a page whose last object was freed) and every thread cache is warm. The ballast is
   * never freed. */
  static void *ballast[NSIZES + 32][BATCH];
  for (int i = 0; i < BATCH; i++) {
    for (size_t s = 0; s < NSIZES; s++) ballast[s][i] = a(probe_sizes[s]);
    for (size_t n = 16; n <= 512; n += 16) ballast[NSIZES + n / 16 - 1][i] = a(n);
  }
  for (int r = 0; r < 4; r++) {
    for (size_t s = 0; s < NSIZES; s++) f(a(probe_sizes[s]));
    for (size_t n = 16; n <= 512; n += 16) f(a(n));
  }
  RUN_SIZES(hot);
  RUN_SIZES(batch);
  measure_mixed_512();
  null_mixed_512();
  measure_realloc_inplace();
  null_realloc_inplace();
  measure_realloc_moving();
  null_realloc_moving();
  for (int i = 0; i < BATCH; i++) { /* live neighbours for the aligned class, as for the others */
    void *p;
    if (real_posix_memalign(&p, 64, 64) != 0) abort();
    keep(p);
  }
  measure_aligned_64();
  null_aligned_64();
  printf("pairs %d\n", ROUNDS);
  return 0;
}
